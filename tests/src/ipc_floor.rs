//! The composite IPC floor of a sync execute (issue 17, target 1): the same chain of hand-offs
//! as a doorbell to simdev, its notification in shared memory and the runtime's worker waking
//! the caller, with nothing else in it.
//!
//! ```text
//!  this process                                    peer process (`<exe> floor-peer`)
//!  submitter ── SOCK_SEQPACKET message ──────────▶ receiving thread
//!     (message of a doorbell's encoded size)          writes the reply body, then
//!                                                     release-stores the sequence word
//!                                                     of a memfd both map, FUTEX_WAKE
//!  waiter ◀─────────── (non-private) futex ─────────┘
//!     acquire-loads the word, reads the body,
//!     writes an eventfd
//!  submitter ◀── eventfd read
//! ```
//!
//! The peer is the calling binary re-executed: its `main` must call
//! [`run_as_floor_peer_if_asked`] first. The peer's end of the socket is its stdin; the memfd
//! arrives with the first message (`SCM_RIGHTS`), and the peer answers `ready` on the socket
//! once it has mapped it. Closing the socket stops the peer.
//!
//! The futex calls are the only `unsafe` here ([`futex`]).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{self, MsgFlags};
use shared::SharedChunk;
use shared::notification::NotificationEntry;
use zerocopy::IntoBytes;

/// The peer's command-line mode.
pub const PEER_ARG: &str = "floor-peer";

/// Bytes of the shared memfd.
const SHARED_LEN: usize = 4096;
/// Where the reply's sequence word lives (the futex word).
const SEQ_PA: u64 = 0;
/// Where the reply body (one notification entry) lives.
const BODY_PA: u64 = 64;
/// The peer's answer once it has mapped the memfd.
const READY: &[u8] = b"ready";

/// The futex calls: `FUTEX_WAIT` and `FUTEX_WAKE` on a word of a [`SharedChunk`], without
/// `FUTEX_PRIVATE_FLAG` (the word is shared between processes).
mod futex {
    use shared::SharedChunk;

    /// The word's host address, checked to be inside `chunk` and 4-byte aligned.
    fn word(chunk: &SharedChunk, pa: u64) -> *mut u32 {
        assert!(
            chunk.contains(pa, 4),
            "futex word {pa:#x} outside the chunk"
        );
        let p = chunk.host_address(pa).expect("inside the chunk");
        assert!(
            p.cast::<u32>().is_aligned(),
            "futex word {pa:#x} misaligned"
        );
        p.cast()
    }

    /// Sleeps while the word at `pa` holds `expected` (returns at once when it does not, or on
    /// a wake-up or a signal: callers re-check the word).
    pub fn wait(chunk: &SharedChunk, pa: u64, expected: u32) {
        let w = word(chunk, pa);
        // SAFETY: `w` is a 4-byte-aligned word inside `chunk`'s live MAP_SHARED mapping, which
        // the borrow keeps mapped for the call; FUTEX_WAIT only reads it atomically. A null
        // timeout waits without limit; the remaining arguments are ignored by FUTEX_WAIT.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w,
                libc::FUTEX_WAIT,
                expected,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    /// Wakes up to `n` waiters on the word at `pa` (in any process mapping it).
    pub fn wake(chunk: &SharedChunk, pa: u64, n: i32) {
        let w = word(chunk, pa);
        // SAFETY: as in `wait`; FUTEX_WAKE does not access the word at all, it only names it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w,
                libc::FUTEX_WAKE,
                n,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// When this binary was started as `<exe> floor-peer`, runs the floor's peer and exits;
/// otherwise returns. Call it first in `main`.
pub fn run_as_floor_peer_if_asked() {
    if std::env::args_os().nth(1).is_some_and(|a| a == PEER_ARG) {
        let code = match peer() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("floor-peer: {e}");
                1
            }
        };
        std::process::exit(code);
    }
}

/// The peer: maps the memfd of the first message, then answers every message through shared
/// memory and the futex until the socket closes.
fn peer() -> Result<(), String> {
    let stdin = std::io::stdin();
    let sock = stdin.as_fd();
    let mut buf = [0u8; shared::protocol::MAX_MSG_SIZE];
    let first = shared::fd_passing::recv_with_fds(sock, &mut buf, MsgFlags::empty())
        .map_err(|e| format!("receiving the memfd: {e}"))?;
    let memfd = first
        .fds
        .first()
        .ok_or("the first message carried no memfd")?;
    let chunk = SharedChunk::map_fd(memfd, 0, SHARED_LEN, true).map_err(|e| e.to_string())?;
    socket::send(
        std::os::fd::AsRawFd::as_raw_fd(&sock),
        READY,
        MsgFlags::MSG_NOSIGNAL,
    )
    .map_err(|e| format!("answering ready: {e}"))?;
    let mut seq = chunk
        .load_u32(SEQ_PA, Ordering::Relaxed)
        .map_err(|e| e.to_string())?;
    loop {
        let n = socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            &mut buf,
            MsgFlags::empty(),
        )
        .map_err(|e| format!("receiving: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        seq = seq.wrapping_add(1);
        let entry = NotificationEntry {
            compute_idx: seq,
            ..NotificationEntry::default()
        };
        chunk
            .write(BODY_PA, entry.as_bytes())
            .map_err(|e| e.to_string())?;
        chunk
            .store_u32(SEQ_PA, seq, Ordering::Release)
            .map_err(|e| e.to_string())?;
        futex::wake(&chunk, SEQ_PA, 1);
    }
}

/// The floor: a running peer process and this process's waiter thread.
#[derive(Debug)]
pub struct CompositeFloor {
    sock: OwnedFd,
    message: Vec<u8>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    waiter: Option<std::thread::JoinHandle<()>>,
    peer: Child,
}

impl CompositeFloor {
    /// Starts the peer (`program floor-peer`) and the waiter thread; each round trip sends a
    /// message of `message_len` bytes.
    ///
    /// # Errors
    /// A message naming the step that failed.
    pub fn start(program: &Path, message_len: usize) -> Result<Self, String> {
        let (mine, theirs) =
            shared::fd_passing::seqpacket_pair().map_err(|e| format!("socketpair: {e}"))?;
        let memfd =
            nix::sys::memfd::memfd_create(c"ipc-floor", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .map_err(|e| format!("memfd_create: {e}"))?;
        nix::unistd::ftruncate(&memfd, SHARED_LEN as i64).map_err(|e| format!("ftruncate: {e}"))?;
        let chunk =
            Arc::new(SharedChunk::map_fd(&memfd, 0, SHARED_LEN, true).map_err(|e| e.to_string())?);
        let mut cmd = Command::new(program);
        cmd.arg(PEER_ARG)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null());
        shared::child::kill_with_parent(&mut cmd);
        let peer = cmd
            .spawn()
            .map_err(|e| format!("starting {} {PEER_ARG}: {e}", program.display()))?;
        shared::fd_passing::send_with_fds(mine.as_fd(), b"memfd", &[memfd.as_fd()])
            .map_err(|e| format!("sending the memfd: {e}"))?;
        let mut buf = [0u8; 16];
        let n = socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&mine),
            &mut buf,
            MsgFlags::empty(),
        )
        .map_err(|e| format!("waiting for the peer: {e}"))?;
        if buf.get(..n) != Some(READY) {
            return Err(format!(
                "the peer did not start (answered {:?})",
                &buf[..n.min(buf.len())]
            ));
        }
        let wake = Arc::new(
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
                .map_err(|e| format!("eventfd: {e}"))?,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (chunk, wake, stop) = (chunk.clone(), wake.clone(), stop.clone());
            std::thread::Builder::new()
                .name("floor-waiter".into())
                .spawn(move || waiter(&chunk, &wake, &stop))
                .map_err(|e| format!("spawning the waiter: {e}"))?
        };
        Ok(Self {
            sock: mine,
            message: vec![0x5A; message_len],
            wake,
            stop,
            waiter: Some(waiter),
            peer,
        })
    }

    /// One round trip: message to the peer, until the waiter's eventfd wakes this thread.
    ///
    /// # Panics
    /// If the peer is gone.
    pub fn round_trip(&self) -> Duration {
        let t = Instant::now();
        socket::send(
            std::os::fd::AsRawFd::as_raw_fd(&self.sock),
            &self.message,
            MsgFlags::MSG_NOSIGNAL,
        )
        .expect("floor peer alive");
        self.wake.read().expect("eventfd read");
        t.elapsed()
    }
}

/// The waiter thread: sleeps on the futex word until the peer publishes a new sequence, reads
/// the reply body, wakes the submitter; stops after waking the round trip that follows
/// `stop`.
fn waiter(chunk: &SharedChunk, wake: &EventFd, stop: &AtomicBool) {
    let mut seen = chunk.load_u32(SEQ_PA, Ordering::Acquire).unwrap_or(0);
    let mut body = NotificationEntry::default();
    loop {
        let Ok(now) = chunk.load_u32(SEQ_PA, Ordering::Acquire) else {
            return;
        };
        if now == seen {
            futex::wait(chunk, SEQ_PA, seen);
            continue;
        }
        seen = now;
        // The stop is read before the wake: the submitter sets it only after this round trip's
        // wake, right before the last one, so a stop read after the wake could belong to the
        // last round trip — which would then never be woken.
        let last = stop.load(Ordering::SeqCst);
        if chunk.read(BODY_PA, body.as_mut_bytes()).is_err() || wake.write(1).is_err() || last {
            return;
        }
    }
}

impl Drop for CompositeFloor {
    fn drop(&mut self) {
        // One last round trip carries the stop to the waiter.
        self.stop.store(true, Ordering::SeqCst);
        if !self.peer.try_wait().is_ok_and(|s| s.is_none()) {
            // The peer is gone: nothing will wake the waiter; leave it (the process ends).
            let _ = self.waiter.take();
            return;
        }
        self.round_trip();
        if let Some(w) = self.waiter.take() {
            let _ = w.join();
        }
        let _ = socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(&self.sock),
            socket::Shutdown::Both,
        );
        let _ = self.peer.wait();
    }
}
