//! A connection thread's io_uring: the batch's deferred notification eventfd writes and the wait
//! for the client's next message in one system call.
//!
//! # Why
//! A connection thread that ran an execution writes the NC's notification eventfd (waking the
//! client's XU worker) and then sleeps in `recvmmsg` for the next doorbell: two system calls.
//! On a CPU it shares with the client, the woken worker preempts it at the return from the
//! first, runs, wakes the submitter and sleeps — and the CPU comes back to this thread only for
//! it to go to sleep: a context switch there and back on every synchronous execution (a
//! `sched_switch` trace of `nrt bench --model identity` shows it in 93 % of them). Inside one
//! `io_uring_enter` the write's wake-up takes effect when the thread sleeps, as it would have
//! anyway (the kernel preempts at the return to user space, which now comes only with the next
//! message).
//!
//! # How
//! One multishot `RECVMSG` stays armed on the connection's socket. Each message lands in a
//! buffer of a provided-buffer ring ([`RING_BUFFERS`] buffers of the `io_uring_recvmsg_out`
//! header plus [`MAX_MSG_SIZE`] bytes), is copied out to the caller and its buffer handed back
//! at once. The ring is `SINGLE_ISSUER | DEFER_TASKRUN` (Linux 6.1+): receives run when the
//! thread enters the kernel to wait, so a wake-up delivers every message that is waiting, as
//! `recvmmsg` does. [`ReceiveRing::receive`] first hands out the completions already posted;
//! only when there are none does it submit the eventfd writes (`CQE_SKIP_SUCCESS`: a write
//! that succeeded posts nothing) and wait for one completion.
//!
//! Messages keep `recvmmsg`'s rules: a message longer than [`MAX_MSG_SIZE`] is flagged
//! truncated (`MSG_TRUNC`), fds a client sends are closed by the kernel (no control buffer:
//! `MSG_CTRUNC`), and the end of the connection is an empty message.
//!
//! # Where the kernel refuses
//! [`ReceiveRing::new`] fails where io_uring is unavailable (older kernels, `io_uring_disabled`,
//! a seccomp filter as in Docker's default profile); the connection then receives with
//! `recvmmsg` and writes its eventfds itself, as before. `--receive recvmmsg` asks for that
//! path everywhere.
//!
//! # Safety
//! While a receive is armed the kernel writes into memory this module owns — the buffers — and
//! reads the buffer ring's entries and the `msghdr`. The entries and buffers are one anonymous
//! mapping, touched from Rust only through a raw base pointer (never a reference spanning
//! buffers the kernel holds), the `msghdr` a heap allocation; both belong to the
//! [`ReceiveRing`], whose `ring` field is declared first, so the io_uring is closed (cancelling
//! the receive) before they are freed.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::{BufRingEntry, Fd, RecvMsgOut};
use io_uring::{IoUring, cqueue, opcode, squeue};
use memmap2::MmapMut;
use shared::protocol::MAX_MSG_SIZE;

/// How a connection thread receives its client's messages (`--receive`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ReceivePath {
    /// Through an io_uring (`ReceiveRing`) where the kernel allows it, else `recvmmsg`.
    #[default]
    #[value(name = "io-uring")]
    IoUring,
    /// `recvmmsg`, with the batch's eventfd writes before it.
    Recvmmsg,
}

/// Buffers in the provided-buffer ring: messages received and not yet handed out at most
/// (a power of two). More waiting end the multishot receive (`ENOBUFS`); it is armed again.
pub const RING_BUFFERS: u16 = 16;

/// The buffer group of the ring's buffers.
const BUFFER_GROUP: u16 = 0;

/// Submission entries: the receive plus one eventfd write per deferred signal.
const SQ_ENTRIES: u32 = 16;

/// `user_data` of the multishot receive's completions.
const RECEIVE: u64 = 1;
/// `user_data` of an eventfd write's completion (posted only when it failed).
const SIGNAL: u64 = 2;

/// `io_uring_recvmsg_out`: the header the kernel writes before each message's payload.
const RECVMSG_OUT: usize = 16;

/// Each buffer's size: the header and the largest message simdev accepts.
const BUFFER_SIZE: usize = RECVMSG_OUT + MAX_MSG_SIZE;
/// [`BUFFER_SIZE`] as a buffer ring entry's length.
const BUFFER_LEN: u32 = 16 + 4096;
const _: () = assert!(BUFFER_LEN as usize == BUFFER_SIZE);

/// The eventfd increment every signal writes (the kernel reads it during the submit).
static ONE: u64 = 1;

/// One received message, as [`ReceiveRing::receive`] hands it out.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    /// The payload (at most [`MAX_MSG_SIZE`] bytes).
    pub payload: &'a [u8],
    /// The message was longer than [`MAX_MSG_SIZE`].
    pub truncated: bool,
    /// The message carried fds, which the kernel closed.
    pub fds_dropped: bool,
}

/// Where the buffers start in [`ReceiveRing`]'s mapping: the page after the ring's entries.
const BUFFERS_AT: usize = 4096;
const _: () = assert!(RING_BUFFERS as usize * size_of::<BufRingEntry>() <= BUFFERS_AT);

/// A connection's io_uring with its armed receive (see the module doc). Not `Send`: the ring is
/// single-issuer, used by the thread that made it.
pub struct ReceiveRing {
    /// Declared first: dropped before the memory the kernel may still write.
    ring: IoUring,
    /// The provided-buffer ring's entries (page-aligned, [`RING_BUFFERS`] entries) at 0, then
    /// the buffers at [`BUFFERS_AT`], [`BUFFER_SIZE`] bytes each, buffer id `i` at
    /// `BUFFERS_AT + i * BUFFER_SIZE`. Touched only through `base`: the kernel writes buffers
    /// it holds while this thread reads the ones it gave back, so no reference to the whole
    /// mapping is ever made after setup.
    _memory: MmapMut,
    /// The mapping's first byte (it does not move when `_memory` does).
    base: std::ptr::NonNull<u8>,
    /// The receive's `msghdr`: no name, no control buffer (the kernel reads it per message).
    msghdr: Box<libc::msghdr>,
    /// Buffers handed back so far (the ring's tail).
    tail: u16,
    /// The connection's socket (a dup: the receive armed on it cannot outlive it).
    socket: OwnedFd,
    /// The multishot receive is armed (its last completion had `IORING_CQE_F_MORE`).
    armed: bool,
    /// A receive failure taken while messages were handed out, returned by the next call.
    failed: Option<io::Error>,
}

impl std::fmt::Debug for ReceiveRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiveRing")
            .field("socket", &self.socket)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

impl ReceiveRing {
    /// An io_uring for `socket` (which it dups) with its buffer ring registered.
    ///
    /// # Errors
    /// The kernel's refusal to set up the ring or register its buffers.
    pub fn new(socket: BorrowedFd<'_>) -> io::Result<Self> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_submit_all()
            .build(SQ_ENTRIES)?;
        let mut memory = MmapMut::map_anon(BUFFERS_AT + usize::from(RING_BUFFERS) * BUFFER_SIZE)?;
        let base = std::ptr::NonNull::new(memory.as_mut_ptr()).ok_or(io::ErrorKind::InvalidData)?;
        // SAFETY: `libc::msghdr` is plain data; all zeroes is a valid value (no name, no iovec,
        // no control buffer).
        let msghdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        let mut this = Self {
            ring,
            _memory: memory,
            base,
            msghdr,
            tail: 0,
            socket: socket.try_clone_to_owned()?,
            armed: false,
            failed: None,
        };
        // SAFETY: the ring's entries are the first page of `memory` (page-aligned, room for
        // RING_BUFFERS entries), owned by `this` and unmapped only after `this.ring` is dropped
        // (field order).
        unsafe {
            this.ring.submitter().register_buf_ring_with_flags(
                this.base.as_ptr() as u64,
                RING_BUFFERS,
                BUFFER_GROUP,
                0,
            )?;
        }
        for bid in 0..RING_BUFFERS {
            this.provide(bid);
        }
        Ok(this)
    }

    /// Hands buffer `bid` (`< RING_BUFFERS`) to the kernel at the ring's tail.
    fn provide(&mut self, bid: u16) {
        debug_assert!(bid < RING_BUFFERS);
        let index = usize::from(self.tail & (RING_BUFFERS - 1));
        let entries = self.base.as_ptr().cast::<BufRingEntry>();
        // SAFETY: buffer `bid` lies inside `memory` (bid < RING_BUFFERS).
        let addr = unsafe {
            self.base
                .as_ptr()
                .add(BUFFERS_AT + usize::from(bid) * BUFFER_SIZE)
        };
        // SAFETY: `index < RING_BUFFERS`: the entry lies in the mapping's first page, which is
        // page-aligned (so aligned for `BufRingEntry`). The kernel reads an entry only between
        // the ring's head and tail, and this one is past the tail until the store below.
        // `set_addr`/`set_len`/`set_bid` leave `resv`, entry 0's of which is the tail, alone.
        let entry = unsafe { &mut *entries.add(index) };
        entry.set_addr(addr as u64);
        entry.set_len(BUFFER_LEN);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: `entries` is the first entry of the registered ring, so its `resv` field is
        // the ring's tail: a u16 inside the mapping, aligned, which the kernel only reads and
        // this thread alone writes.
        let tail = unsafe { &*BufRingEntry::tail(entries).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// Hands out the messages waiting (at least one, at most `max`) through `take`, blocking for
    /// the first. Before it blocks, the eventfds of `signals` are each written (1) in the same
    /// system call as the wait; `signals` is drained only then, so the caller writes whatever is
    /// left in it when this returns with messages already posted. Returns how many messages.
    ///
    /// # Errors
    /// The receive's failure (`ECONNRESET` when the peer reset the connection) or the wait's
    /// (`EINTR`: a signal interrupted the wait, after the writes were submitted; call again).
    /// After any other error the ring may hold writes it could not submit: drop it (the
    /// connection ends).
    pub fn receive(
        &mut self,
        signals: &mut dyn Iterator<Item = BorrowedFd<'_>>,
        max: usize,
        take: &mut dyn FnMut(Message<'_>),
    ) -> io::Result<usize> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        loop {
            let count = self.take_completions(max, take)?;
            if count > 0 {
                return Ok(count);
            }
            if !self.armed {
                self.arm()?;
            }
            for fd in &mut *signals {
                let write = opcode::Write::new(Fd(fd.as_raw_fd()), (&raw const ONE).cast(), 8)
                    .offset(u64::MAX)
                    .build()
                    .flags(squeue::Flags::SKIP_SUCCESS)
                    .user_data(SIGNAL);
                self.push(&write)?;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // The completion queue is full: take what is there first.
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Arms the multishot receive.
    fn arm(&mut self) -> io::Result<()> {
        let receive = opcode::RecvMsgMulti::new(
            Fd(self.socket.as_raw_fd()),
            &raw const *self.msghdr,
            BUFFER_GROUP,
        )
        .flags(libc::MSG_CMSG_CLOEXEC as u32)
        .build()
        .user_data(RECEIVE);
        self.push(&receive)?;
        self.armed = true;
        Ok(())
    }

    /// Queues `entry`, submitting what is queued first if the submission queue is full.
    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: what the entry points at outlives the operation: the receive's `msghdr`
            // and buffers are owned by `self` (dropped after the ring, which cancels it) and
            // the writes read the `static` ONE. Its fds are `self`'s socket and the caller's
            // borrowed eventfds, submitted within the call that borrows them; once submitted the
            // kernel holds its own file references.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Hands out up to `max` posted receive completions; handles the rest of what is posted
    /// (failed writes are logged, an ended receive is re-armed at the next wait).
    fn take_completions(
        &mut self,
        max: usize,
        take: &mut dyn FnMut(Message<'_>),
    ) -> io::Result<usize> {
        let mut count = 0;
        let mut failure = None;
        while count < max {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            let (result, flags) = (cqe.result(), cqe.flags());
            if cqe.user_data() == SIGNAL {
                tracing::warn!(
                    "writing a notification eventfd: {}",
                    io::Error::from_raw_os_error(-result)
                );
                continue;
            }
            if !cqueue::more(flags) {
                self.armed = false;
            }
            let Some(bid) = cqueue::buffer_select(flags) else {
                match result {
                    // More messages waited than the ring has buffers: armed again at the wait.
                    r if r == -libc::ENOBUFS => continue,
                    // The peer closed the connection (no buffer used): an empty message.
                    0 => {
                        take(Message {
                            payload: &[],
                            truncated: false,
                            fds_dropped: false,
                        });
                        count += 1;
                        continue;
                    }
                    r if r < 0 => {
                        failure = Some(io::Error::from_raw_os_error(-r));
                        break;
                    }
                    r => {
                        tracing::error!("a receive completed ({r} bytes) without a buffer");
                        continue;
                    }
                }
            };
            if bid >= RING_BUFFERS {
                tracing::error!("the kernel named buffer {bid} of {RING_BUFFERS}");
                continue;
            }
            let len = usize::try_from(result).unwrap_or(0).min(BUFFER_SIZE);
            {
                // SAFETY: buffer `bid` (< RING_BUFFERS) lies inside `memory`, and `len` is at
                // most its size. The completion gave it back: the kernel does not write it
                // again until `provide` below hands it over, after this slice's last use.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        self.base
                            .as_ptr()
                            .add(BUFFERS_AT + usize::from(bid) * BUFFER_SIZE),
                        len,
                    )
                };
                match RecvMsgOut::parse(bytes, &self.msghdr) {
                    Ok(out) => take(Message {
                        payload: out.payload_data(),
                        truncated: out.is_payload_truncated(),
                        fds_dropped: out.is_control_data_truncated(),
                    }),
                    Err(()) => {
                        tracing::error!("a received message of {len} bytes without its header");
                    }
                }
            }
            count += 1;
            self.provide(bid);
        }
        match failure {
            Some(e) if count == 0 => Err(e),
            // The messages first; the failure is returned by the next call.
            failure => {
                self.failed = failure;
                Ok(count)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::time::Duration;

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use shared::fd_passing::send_with_fds;
    use shared::protocol::MAX_MSG_SIZE;

    use super::{RING_BUFFERS, ReceiveRing};

    /// A connected SOCK_SEQPACKET pair (client end, server end), as simdev's connections are.
    fn pair() -> (OwnedFd, OwnedFd) {
        shared::fd_passing::seqpacket_pair().unwrap()
    }

    /// A ring on `socket`; `None` (and a note) where the kernel offers no io_uring, where
    /// simdev receives with `recvmmsg` instead (the server's tests cover that path).
    fn ring(socket: &OwnedFd) -> Option<ReceiveRing> {
        match ReceiveRing::new(socket.as_fd()) {
            Ok(ring) => Some(ring),
            Err(e) => {
                eprintln!("skipped: this kernel gives no io_uring ({e})");
                None
            }
        }
    }

    /// What one `receive` handed out: payloads with their (truncated, fds_dropped) flags.
    type Got = Vec<(Vec<u8>, bool, bool)>;

    fn receive(ring: &mut ReceiveRing, signals: &[BorrowedFd<'_>], max: usize) -> Got {
        let mut got = Vec::new();
        let mut signals = signals.iter().copied();
        let n = ring
            .receive(&mut signals, max, &mut |m| {
                got.push((m.payload.to_vec(), m.truncated, m.fds_dropped));
            })
            .unwrap();
        assert_eq!(n, got.len());
        got
    }

    /// Messages keep `recvmmsg`'s rules: in order, each whole; one longer than
    /// MAX_MSG_SIZE flagged truncated; one carrying fds flagged, its fds closed by the kernel.
    #[test]
    fn waiting_messages_are_handed_out_in_order_with_recvmmsgs_flags() {
        let (client, server) = pair();
        let Some(mut ring) = ring(&server) else {
            return;
        };
        let passed = EventFd::from_flags(EfdFlags::EFD_CLOEXEC).unwrap();
        send_with_fds(client.as_fd(), b"first", &[]).unwrap();
        send_with_fds(client.as_fd(), &vec![7u8; MAX_MSG_SIZE + 100], &[]).unwrap();
        send_with_fds(client.as_fd(), b"with an fd", &[passed.as_fd()]).unwrap();
        send_with_fds(client.as_fd(), &vec![9u8; MAX_MSG_SIZE], &[]).unwrap();
        let mut got = Got::new();
        while got.len() < 4 {
            got.extend(receive(&mut ring, &[], 16));
        }
        assert_eq!(got[0], (b"first".to_vec(), false, false));
        assert_eq!(got[1], (vec![7u8; MAX_MSG_SIZE], true, false), "truncated");
        assert_eq!(got[2], (b"with an fd".to_vec(), false, true), "fds dropped");
        assert_eq!(
            got[3],
            (vec![9u8; MAX_MSG_SIZE], false, false),
            "exactly the largest"
        );
    }

    /// More messages waiting than the ring has buffers (the multishot receive ends with
    /// ENOBUFS and is armed again), taken at most `max` per call: every one arrives, in order.
    #[test]
    fn more_messages_than_buffers_all_arrive_in_order() {
        let (client, server) = pair();
        let Some(mut ring) = ring(&server) else {
            return;
        };
        let total = 3 * usize::from(RING_BUFFERS) + 5;
        for i in 0..total {
            send_with_fds(client.as_fd(), &i.to_le_bytes(), &[]).unwrap();
        }
        let mut got = Got::new();
        while got.len() < total {
            let batch = receive(&mut ring, &[], 7);
            assert!((1..=7).contains(&batch.len()), "{}", batch.len());
            got.extend(batch);
        }
        let order: Vec<usize> = got
            .iter()
            .map(|(p, ..)| usize::from_le_bytes(p.as_slice().try_into().unwrap()))
            .collect();
        assert_eq!(order, (0..total).collect::<Vec<_>>());
    }

    /// With nothing waiting, the signals are written by the call that sleeps, before it
    /// sleeps: a client that answers only once its eventfd is readable wakes it. (Written
    /// after the wait, the eventfd would stay quiet and the client would send "timeout".)
    #[test]
    fn the_signals_are_written_before_the_receive_sleeps() {
        let (client, server) = pair();
        let Some(mut ring) = ring(&server) else {
            return;
        };
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).unwrap();
        // The same eventfd, for this thread to signal while the client thread watches it.
        let signal = efd.as_fd().try_clone_to_owned().unwrap();
        let client_thread = std::thread::spawn(move || {
            let mut fds = [PollFd::new(efd.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(Duration::from_secs(10)).unwrap();
            let answer: &[u8] = match poll(&mut fds, timeout) {
                Ok(1) => b"signalled",
                _ => b"timeout",
            };
            send_with_fds(client.as_fd(), answer, &[]).unwrap();
            // The client end stays open (its close would be a second message).
            (client, efd.read().unwrap())
        });
        let got = receive(&mut ring, &[signal.as_fd(), signal.as_fd()], 16);
        assert_eq!(got, [(b"signalled".to_vec(), false, false)]);
        let (_client, count) = client_thread.join().unwrap();
        assert_eq!(count, 2, "each signal wrote 1");
    }

    /// The peer closing the connection is an empty message, as `recvmmsg` reports it.
    #[test]
    fn the_peer_closing_is_an_empty_message() {
        let (client, server) = pair();
        let Some(mut ring) = ring(&server) else {
            return;
        };
        send_with_fds(client.as_fd(), b"last", &[]).unwrap();
        drop(client);
        let mut got = Got::new();
        while got.len() < 2 {
            got.extend(receive(&mut ring, &[], 16));
        }
        assert_eq!(
            got,
            [(b"last".to_vec(), false, false), (vec![], false, false)]
        );
    }
}
