//! The simdev backend: one `SOCK_SEQPACKET` connection to a simdev process.
//!
//! Requests and replies are `shared::protocol` messages (bincode 2); memory chunks, the
//! semaphore window and the NC's notification eventfd arrive as fds by `SCM_RIGHTS`, and each
//! chunk is mapped whole, as the driver's mmap requires. The doorbell
//! ([`Device::semaphore_increment`]) is a *posted* message: one `sendmsg`, no reply, no lock —
//! its arguments are range-checked here against the device info so errors stay synchronous.
//! Every other request holds the connection's lock from send to reply, so replies cannot be
//! crossed between threads.
//!
//! **A request with a deadline** ([`Device::dma_queue_copy_start_by`], the tensor-op DMA
//! doorbell the XU worker rings; [`Device::mem_alloc_by`] and [`Device::mem_map_by`], the
//! staging a tensor write schedules; every request once [`Device::closing_by`] set
//! `nrt_close`'s deadline) waits for the lock and its reply only until then: the worker steps
//! every XU of its vNC, and schedule calls and close must not sit out a stopped simdev for the
//! control timeout. Past the deadline it answers [`DeviceError::Late`] and the reply is *owed*
//! ([`Owed`]): simdev answers in order, so every later request takes the owed replies off the
//! socket (within its own bound) before its own, and settles them: a late allocation nobody
//! holds is freed. Nothing is given up: once simdev runs again the connection works.
//!
//! **MEM_FREE does not wait.** The ioctl frees at once; on simdev the free is sent and its
//! reply owed, read by the next request (an error in it is logged): `nrt_tensor_free` costs a
//! `sendmsg`, and a stopped simdev does not hold it. simdev frees in order, before any later
//! request of the connection.
//!
//! **Fork.** A connection belongs to the process that opened it. A child forked after
//! `connect` inherits the socket, but a request from it would interleave with the parent's on
//! the same connection (and a reply could be read by the wrong process): every request and
//! posted message checks the pid first and answers [`DeviceError::Forked`] without sending. A
//! private simdev likewise is stopped (and its directory removed) only by the process that
//! started it, so dropping inherited state in a child leaves the parent's device running.
//!
//! [`PrivateSimdev`] starts a simdev child on a private socket and stops it when dropped; the
//! selection logic ([`super::select`]) uses it when no device is present.
//!
//! # Links
//! The messages travel over a [`Link`]: the socket above, or (feature `test-support`, and the
//! runtime's own unit tests) an in-process [`Handler`](shared::protocol::Handler) such as
//! `simdev::Device`, called directly with the same encoded messages and the same session rules
//! (Hello first, same version), so runtime code can be tested against the emulated device
//! without starting a process. Posted requests go through the handler with no reply, as they
//! go through the socket.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use shared::address_map::SEM_WINDOW_SIZE;
use shared::fd_passing;
use shared::memory::SharedChunk;
use shared::protocol::{
    self, ClientSummary, DeviceInfo, DeviceStats, FaultSpec, LatencyModel, MAX_MSG_SIZE,
    MemLocation, NcCounters, PROTOCOL_VERSION, Reply, Request,
};

use super::{
    Allocation, ClaimedNc, Device, DeviceError, DmaQueueId, DmaRings, MemHandle, NotificationQueue,
    check_queue, check_range,
};
use crate::process::Leftover;

/// How long [`PrivateSimdev::spawn`] waits for the child to listen.
pub const SIMDEV_START_TIMEOUT: Duration = Duration::from_secs(20);

/// A private simdev's log (its stderr), in the directory made for it.
pub(crate) const PRIVATE_LOG: &str = "simdev.log";

/// The longest path a unix socket's address holds (`sun_path`, with its terminating NUL).
const SOCKET_PATH_MAX: usize = 107;

/// Where a private simdev's directory goes: the temp directory `tmp`, unless its socket's path
/// there (`<tmp>/simdev-XXXXXX/simdev.sock`) would be longer than a unix socket's address
/// holds — build systems' temp directories often are — then `/tmp` (said at INFO).
fn private_parent(tmp: &Path) -> PathBuf {
    let socket_len = tmp.as_os_str().len() + "/simdev-XXXXXX/simdev.sock".len();
    if socket_len <= SOCKET_PATH_MAX {
        return tmp.to_path_buf();
    }
    let fallback = PathBuf::from("/tmp");
    tracing::info!(
        "the temp directory {} is too long for a unix socket's path ({socket_len} bytes of \
         {SOCKET_PATH_MAX}): the private simdev's socket goes in {}",
        tmp.display(),
        fallback.display()
    );
    fallback
}

/// The receive side of the connection: the buffer lives with the lock that serialises
/// request/reply pairs.
/// Room for an encoded posted request (a `SemaphoreIncrement`: three u32s, at most 16 bytes).
const POSTED_MSG_SIZE: usize = 64;

#[derive(Debug)]
struct Exchange {
    buf: Box<[u8; MAX_MSG_SIZE]>,
    /// A reply did not come within the control timeout: a late one would answer the wrong
    /// request, so the connection is given up.
    gave_up: Option<std::time::Duration>,
    /// Replies still to come to requests that did not wait for them (a free) or stopped
    /// waiting at their deadline ([`DeviceError::Late`]), oldest first: the next ones simdev
    /// sends, settled before any later request reads its own.
    owed: std::collections::VecDeque<Owed>,
}

/// What to do with a reply that comes after its request stopped waiting for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owed {
    /// Nothing: the request's effect was all it was for (a doorbell, a query). Fds that came
    /// with it are closed.
    Discard(&'static str),
    /// An error in it is logged: a free, whose caller did not wait.
    Confirm(&'static str),
    /// A late MEM_ALLOC: the chunk nobody holds is freed.
    Free,
}

/// How long a request waits for the connection's lock and its reply.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// The control timeout; past it the connection is given up.
    Control,
    /// Until the caller's deadline; past it the reply is owed ([`DeviceError::Late`]).
    Deadline(Instant),
}

/// How long a control request (allocation, claim, query: not a doorbell) waits for simdev's
/// reply before the connection is given up ([`DeviceError::NotResponding`]). simdev runs a
/// connection's executions on its thread, so a reply may wait behind one: this outlasts any
/// execution the default execution timeout allows.
pub const CONTROL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How messages reach simdev.
enum Link {
    /// A `SOCK_SEQPACKET` connection; `exchange` is held from a request's send to its reply
    /// (posted requests do not take it).
    Socket {
        fd: OwnedFd,
        exchange: parking_lot::Mutex<Exchange>,
    },
    /// A device in this process, called directly; the lock is held for each message, posted
    /// ones included (the handler's answer is immediate: a doorbell only wakes a sequencer).
    #[cfg(any(test, feature = "test-support"))]
    InProcess(Mutex<Box<dyn shared::protocol::Connection>>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Socket { fd, .. } => f.debug_struct("Socket").field("fd", fd).finish(),
            #[cfg(any(test, feature = "test-support"))]
            Self::InProcess(_) => f.write_str("InProcess"),
        }
    }
}

/// A connected simdev.
#[derive(Debug)]
pub struct SimDevice {
    link: Link,
    info: DeviceInfo,
    socket: PathBuf,
    /// The process that opened the connection (the only one that may use it).
    owner: u32,
    /// How long a control request waits for its reply ([`CONTROL_TIMEOUT`] by default).
    control_timeout: std::time::Duration,
    /// A control request went unanswered ([`DeviceError::NotResponding`]): the device counts
    /// as hung up.
    unresponsive: std::sync::atomic::AtomicBool,
    /// The private simdev this device started, stopped by [`Device::release`] or when the
    /// device is dropped. Declared last so the connection closes first.
    child: Mutex<Option<PrivateSimdev>>,
    /// Whether it started one (stays true after the release).
    private: bool,
    /// `nrt_close`'s deadline ([`Device::closing_by`]): no request waits past it.
    closing: std::sync::OnceLock<Instant>,
}

fn io_err(op: &'static str) -> impl FnOnce(nix::Error) -> DeviceError {
    move |e| match e {
        nix::Error::EPIPE | nix::Error::ECONNRESET | nix::Error::ENOTCONN => {
            DeviceError::Disconnected { op }
        }
        e => DeviceError::Io {
            op,
            source: e.into(),
        },
    }
}

impl SimDevice {
    /// Connects to the simdev listening on `socket` and performs the handshake.
    ///
    /// # Errors
    /// `Io` when nothing listens there (the message names the socket), `Remote` when simdev
    /// refuses (wrong protocol version, uid not allowed).
    pub fn connect(socket: &Path) -> Result<Self, DeviceError> {
        Self::connect_with_timeout(socket, CONTROL_TIMEOUT)
    }

    /// [`SimDevice::connect`] with control requests (the handshake included) waiting at most
    /// `control_timeout` for their replies: operator tools, which run no executions on their
    /// connection, wait less than a runtime.
    ///
    /// # Errors
    /// As [`SimDevice::connect`]; [`DeviceError::NotResponding`] when the handshake is not
    /// answered in time.
    pub fn connect_with_timeout(
        socket: &Path,
        control_timeout: std::time::Duration,
    ) -> Result<Self, DeviceError> {
        let op = "connect to simdev";
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(io_err(op))?;
        let addr = UnixAddr::new(socket).map_err(io_err(op))?;
        socket::connect(fd.as_raw_fd(), &addr).map_err(|e| DeviceError::Io {
            op,
            source: std::io::Error::new(
                std::io::Error::from(e).kind(),
                if e == nix::errno::Errno::EACCES {
                    format!(
                        "permission denied connecting to {} ({e}): a simdev serves only its own user unless started with --allow-uid (its socket is then mode 0666), and this user must be able to search the socket's directory",
                        socket.display()
                    )
                } else {
                    format!(
                        "no simdev listening on {} ({e}); start one there with `simdev --socket {}` (or `nrt simdev --socket {}`), or unset NEURON_SIMDEV_SOCKET to let the runtime start its own",
                        socket.display(),
                        socket.display(),
                        socket.display()
                    )
                },
            ),
        })?;
        let mut dev = SimDevice {
            link: Link::Socket {
                fd,
                exchange: parking_lot::Mutex::new(Exchange {
                    buf: Box::new([0; MAX_MSG_SIZE]),
                    gave_up: None,
                    owed: std::collections::VecDeque::new(),
                }),
            },
            info: placeholder_info(),
            socket: socket.to_owned(),
            owner: crate::process::id(),
            control_timeout,
            unresponsive: std::sync::atomic::AtomicBool::new(false),
            child: Mutex::new(None),
            private: false,
            closing: std::sync::OnceLock::new(),
        };
        dev.hello(PROTOCOL_VERSION)?;
        Ok(dev)
    }

    /// Connects to `handler` in this process (e.g. an `Arc<simdev::Device>`) and performs the
    /// handshake: the runtime's unit tests and the test crate drive the emulated device this
    /// way without starting a process. [`SimDevice::socket`] is `in-process`.
    ///
    /// # Errors
    /// `Remote` when the handler refuses the handshake.
    #[cfg(any(test, feature = "test-support"))]
    pub fn in_process(
        handler: std::sync::Arc<dyn shared::protocol::Handler>,
    ) -> Result<Self, DeviceError> {
        Self::in_process_with_version(handler, PROTOCOL_VERSION)
    }

    /// [`SimDevice::in_process`] saying Hello with `version` (to test the handshake).
    #[cfg(any(test, feature = "test-support"))]
    fn in_process_with_version(
        handler: std::sync::Arc<dyn shared::protocol::Handler>,
        version: u32,
    ) -> Result<Self, DeviceError> {
        let connection = handler.open(crate::process::id());
        let mut dev = SimDevice {
            link: Link::InProcess(Mutex::new(connection)),
            info: placeholder_info(),
            socket: PathBuf::from("in-process"),
            owner: crate::process::id(),
            control_timeout: CONTROL_TIMEOUT,
            unresponsive: std::sync::atomic::AtomicBool::new(false),
            child: Mutex::new(None),
            private: false,
            closing: std::sync::OnceLock::new(),
        };
        dev.hello(version)?;
        Ok(dev)
    }

    /// The handshake: Hello with `version`; the answer's device info becomes this device's.
    fn hello(&mut self, version: u32) -> Result<(), DeviceError> {
        let (reply, _) = self.request("Hello", &Request::Hello { version })?;
        match reply {
            Reply::Hello { version, device } if version == PROTOCOL_VERSION => {
                self.info = device;
            }
            other => return Err(unexpected("Hello", &other)),
        }
        // Who we are, for `nrt ls`'s process list. Optional: a simdev that does not know the
        // request still serves us.
        let identify = Request::Identify {
            runtime_version: crate::RUNTIME_VERSION.to_owned(),
        };
        if let Err(e) = self.request_ok("Identify", &identify) {
            tracing::debug!("simdev did not take our identity: {e}");
        }
        Ok(())
    }

    /// Starts a private simdev with `command` and connects to it; the child is stopped at
    /// [`Device::release`] or when the device is dropped.
    ///
    /// # Errors
    /// As [`PrivateSimdev::spawn`] and [`SimDevice::connect`].
    pub fn spawn_private(command: &SimdevCommand) -> Result<Self, DeviceError> {
        let child = PrivateSimdev::spawn(command)?;
        let mut dev = Self::connect(child.socket())?;
        dev.child = Mutex::new(Some(child));
        dev.private = true;
        Ok(dev)
    }

    /// The socket this device is connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Arms a fault in simdev (scenario control; not a driver operation).
    ///
    /// # Errors
    /// simdev's refusal (e.g. an NC out of range).
    pub fn inject_fault(&self, fault: FaultSpec) -> Result<(), DeviceError> {
        self.request_ok("InjectFault", &Request::InjectFault(fault))
    }

    /// Disarms every pending fault.
    ///
    /// # Errors
    /// A dead simdev.
    pub fn clear_faults(&self) -> Result<(), DeviceError> {
        self.request_ok("ClearFaults", &Request::ClearFaults)
    }

    /// Sets simdev's latency model.
    ///
    /// # Errors
    /// A dead simdev.
    pub fn set_latency(&self, model: LatencyModel) -> Result<(), DeviceError> {
        self.request_ok("SetLatency", &Request::SetLatency(model))
    }

    /// Device-wide usage (memory in use, clients, claimed NCs, ...).
    ///
    /// # Errors
    /// A dead simdev.
    pub fn device_stats(&self) -> Result<DeviceStats, DeviceError> {
        match self.request("DeviceStats", &Request::DeviceStats)?.0 {
            Reply::DeviceStats(s) => Ok(s),
            other => Err(unexpected("DeviceStats", &other)),
        }
    }

    /// The clients holding NCs or memory (what [`Device::processes`] returns).
    ///
    /// # Errors
    /// A dead simdev.
    pub fn clients(&self) -> Result<Vec<ClientSummary>, DeviceError> {
        match self.request("Clients", &Request::Clients)?.0 {
            Reply::Clients(list) => Ok(list),
            other => Err(unexpected("Clients", &other)),
        }
    }

    /// MEM_FREE waiting for simdev's answer, so a refusal (a handle that is not this
    /// client's) is this call's error, as the driver's ioctl answers: for the Neuron shim and
    /// tests of simdev's checks. [`Device::mem_free`] does not wait.
    ///
    /// # Errors
    /// simdev's refusal ([`DeviceError::Remote`]); the connection's errors.
    pub fn mem_free_confirmed(&self, handle: MemHandle) -> Result<(), DeviceError> {
        self.request_ok("MemFree", &Request::MemFree { handle: handle.0 })
    }

    /// Whether this device started its own simdev (stopped at release or drop).
    pub fn is_private(&self) -> bool {
        self.private
    }

    /// Refuses use from a process forked after the connection was opened.
    fn check_owner(&self, op: &'static str) -> Result<(), DeviceError> {
        let current = crate::process::id();
        if current == self.owner {
            Ok(())
        } else {
            Err(DeviceError::Forked {
                op,
                owner: self.owner,
                current,
            })
        }
    }

    /// Sends `req` with no reply expected: a posted request (or the socket half of
    /// [`SimDevice::request`]).
    fn send(&self, op: &'static str, req: &Request) -> Result<(), DeviceError> {
        self.check_owner(op)?;
        // A doorbell (the only posted request) is a few bytes: zeroing a whole MAX_MSG_SIZE
        // buffer for it cost more than encoding it.
        let mut small = [0u8; POSTED_MSG_SIZE];
        let mut large;
        let buf: &mut [u8] = if req.is_posted() {
            &mut small
        } else {
            large = [0u8; MAX_MSG_SIZE];
            &mut large
        };
        let n = protocol::encode(req, buf).map_err(|e| DeviceError::Protocol {
            op,
            detail: e.to_string(),
        })?;
        match &self.link {
            Link::Socket { fd, .. } => loop {
                // No fds: a plain send, without glibc's cancellation bookkeeping (the doorbell
                // is the submit path's one system call to simdev).
                match shared::nocancel::send(fd.as_fd(), &buf[..n]) {
                    Err(nix::errno::Errno::EINTR) => {}
                    sent => {
                        sent.map_err(io_err(op))?;
                        return Ok(());
                    }
                }
            },
            #[cfg(any(test, feature = "test-support"))]
            Link::InProcess(connection) => {
                debug_assert!(req.is_posted());
                let mut connection = connection
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                match connection.respond(&buf[..n]) {
                    shared::protocol::Answer::Closed => Err(DeviceError::Disconnected { op }),
                    // A posted request is answered with nothing; whatever else came back the
                    // socket path would not read either.
                    _ => Ok(()),
                }
            }
        }
    }

    /// One request/reply exchange. Returns the reply and the fds that came with it (exactly
    /// `reply.fd_count()` of them, else a protocol error). An error reply becomes
    /// [`DeviceError::Remote`].
    fn request(
        &self,
        op: &'static str,
        req: &Request,
    ) -> Result<(Reply, Vec<OwnedFd>), DeviceError> {
        self.request_bounded(op, req, Bound::Control)
    }

    /// [`SimDevice::request`] waiting at most as `bound` says.
    fn request_bounded(
        &self,
        op: &'static str,
        req: &Request,
        bound: Bound,
    ) -> Result<(Reply, Vec<OwnedFd>), DeviceError> {
        debug_assert!(!req.is_posted());
        // Before any lock: a parent thread may have held it at the fork.
        self.check_owner(op)?;
        match &self.link {
            Link::Socket { fd, exchange } => self.request_socket(op, req, fd, exchange, bound),
            #[cfg(any(test, feature = "test-support"))]
            Link::InProcess(connection) => {
                use shared::protocol::Answer;
                let mut buf = [0u8; MAX_MSG_SIZE];
                let n = protocol::encode(req, &mut buf).map_err(|e| DeviceError::Protocol {
                    op,
                    detail: e.to_string(),
                })?;
                let answer = connection
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .respond(&buf[..n]);
                match answer {
                    Answer::Reply(bytes, fds) => parse_reply(op, &bytes, fds),
                    Answer::Close(bytes) => parse_reply(op, &bytes, Vec::new()),
                    Answer::Silent => Err(DeviceError::Protocol {
                        op,
                        detail: "no reply to a request that is not posted".into(),
                    }),
                    Answer::Closed => Err(DeviceError::Disconnected { op }),
                }
            }
        }
    }

    fn request_socket(
        &self,
        op: &'static str,
        req: &Request,
        fd: &OwnedFd,
        exchange: &parking_lot::Mutex<Exchange>,
        bound: Bound,
    ) -> Result<(Reply, Vec<OwnedFd>), DeviceError> {
        let started = Instant::now();
        let late = |started: Instant| DeviceError::Late {
            op,
            waited: started.elapsed(),
        };
        let bound = self.closing_bound(bound);
        let mut ex = match bound {
            Bound::Control => exchange.lock(),
            Bound::Deadline(d) => exchange.try_lock_until(d).ok_or_else(|| late(started))?,
        };
        if let Some(waited) = ex.gave_up {
            return Err(DeviceError::NotResponding { op, waited });
        }
        // A send can fail because simdev already answered and closed (a refused uid): the
        // answer may still be queued, so look for it before reporting the disconnect.
        let mut recv_flags = MsgFlags::MSG_CMSG_CLOEXEC;
        // The replies owed to requests that did not wait come first, then this one's; replies
        // owed to what settling them sends (a free) come after it. Those already here are
        // taken before sending, so replies never pile up unread while this one is sent.
        self.settle_arrived(fd, &mut ex);
        let mut ahead = ex.owed.len();
        let sent = match self.send(op, req) {
            Ok(()) => {
                // This request's entry: taken off when its reply is read, or left owed.
                ex.owed.push_back(owed_for(req, op));
                true
            }
            Err(DeviceError::Disconnected { .. }) => {
                recv_flags |= MsgFlags::MSG_DONTWAIT;
                false
            }
            Err(e) => return Err(e),
        };
        loop {
            if !recv_flags.contains(MsgFlags::MSG_DONTWAIT) && !self.reply_within(fd, bound) {
                return Err(match bound {
                    Bound::Deadline(_) => late(started),
                    Bound::Control => self.give_up(op, &mut ex),
                });
            }
            let received = fd_passing::recv_with_fds(fd.as_fd(), &mut ex.buf[..], recv_flags)
                .map_err(|e| match e {
                    nix::Error::EAGAIN => DeviceError::Disconnected { op },
                    e => io_err(op)(e),
                })?;
            if received.len == 0 {
                return Err(DeviceError::Disconnected { op });
            }
            if ahead > 0
                && let Some(owed) = ex.owed.pop_front()
            {
                // A reply to an earlier request (its fds, if any, are closed here).
                ahead -= 1;
                let reply = parse_reply(owed.op(), &ex.buf[..received.len], received.fds);
                self.settle(owed, reply, &mut ex);
                continue;
            }
            if sent {
                ex.owed.pop_front();
            }
            if received.control_truncated {
                // The kernel installs what fits and closes the rest: a process at its
                // RLIMIT_NOFILE (the only way a buffer with room for SCM_MAX_FD overflows).
                return Err(DeviceError::FdsDropped {
                    op,
                    limit: nix::sys::resource::getrlimit(
                        nix::sys::resource::Resource::RLIMIT_NOFILE,
                    )
                    .map_or_else(|_| "?".to_owned(), |(soft, _)| soft.to_string()),
                });
            }
            if received.truncated {
                return Err(DeviceError::Protocol {
                    op,
                    detail: "truncated reply".into(),
                });
            }
            return parse_reply(op, &ex.buf[..received.len], received.fds);
        }
    }

    /// Acts on the reply to an earlier request that did not wait for it, with the exchange
    /// held: logs a failed free, frees a late allocation (its reply owed in turn).
    fn settle(
        &self,
        owed: Owed,
        reply: Result<(Reply, Vec<OwnedFd>), DeviceError>,
        ex: &mut Exchange,
    ) {
        match (owed, reply) {
            (Owed::Free, Ok((Reply::MemAllocated { handle, size, .. }, _))) => {
                tracing::info!(
                    handle,
                    size,
                    "freeing a chunk simdev allocated after its request stopped waiting"
                );
                if self.send("MemFree", &Request::MemFree { handle }).is_ok() {
                    ex.owed.push_back(Owed::Confirm("MemFree"));
                }
            }
            (Owed::Confirm(op), Err(e)) => {
                tracing::warn!(op, error = %e, "simdev refused a request the runtime did not wait for");
            }
            (Owed::Discard(_) | Owed::Confirm(_) | Owed::Free, _) => {}
        }
    }

    /// Takes the owed replies that have arrived off the socket and settles them, without
    /// waiting for the others.
    fn settle_arrived(&self, fd: &OwnedFd, ex: &mut Exchange) {
        while let Some(&owed) = ex.owed.front() {
            let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
            match fd_passing::recv_with_fds(fd.as_fd(), &mut ex.buf[..], flags) {
                Ok(received) if received.len > 0 => {
                    ex.owed.pop_front();
                    let reply = parse_reply(owed.op(), &ex.buf[..received.len], received.fds);
                    self.settle(owed, reply, ex);
                }
                // Nothing yet, or the peer is gone (the next request says so).
                Ok(_) | Err(_) => return,
            }
        }
    }

    /// `bound`, made no later than `nrt_close`'s deadline once it is set.
    fn closing_bound(&self, bound: Bound) -> Bound {
        match (self.closing.get(), bound) {
            (None, bound) => bound,
            (Some(&close), Bound::Control) => {
                Bound::Deadline(close.min(Instant::now() + self.control_timeout))
            }
            (Some(&close), Bound::Deadline(d)) => Bound::Deadline(close.min(d)),
        }
    }

    /// Sends `req` (not posted) without waiting for its reply, which is owed: read and settled
    /// by a later request. With the exchange held, so the reply is counted before any other
    /// request could read it.
    fn request_unwaited(&self, op: &'static str, req: &Request) -> Result<(), DeviceError> {
        self.check_owner(op)?;
        match &self.link {
            Link::Socket { fd, exchange } => {
                let started = Instant::now();
                let mut ex = match self.closing_bound(Bound::Control) {
                    Bound::Control => exchange.lock(),
                    Bound::Deadline(d) => {
                        exchange
                            .try_lock_until(d)
                            .ok_or_else(|| DeviceError::Late {
                                op,
                                waited: started.elapsed(),
                            })?
                    }
                };
                if let Some(waited) = ex.gave_up {
                    return Err(DeviceError::NotResponding { op, waited });
                }
                // The replies already here first: at most one per unwaited request stays
                // unread, so simdev never blocks sending a reply to a runtime that sends on.
                self.settle_arrived(fd, &mut ex);
                self.send(op, req)?;
                ex.owed.push_back(Owed::Confirm(op));
                Ok(())
            }
            #[cfg(any(test, feature = "test-support"))]
            Link::InProcess(_) => match self.request(op, req)?.0 {
                Reply::Ok => Ok(()),
                other => Err(unexpected(op, &other)),
            },
        }
    }

    /// The control timeout passed with no reply: a late one would answer the wrong request, so
    /// the connection is given up (every later request answers [`DeviceError::NotResponding`]).
    fn give_up(&self, op: &'static str, ex: &mut Exchange) -> DeviceError {
        ex.gave_up = Some(self.control_timeout);
        self.unresponsive
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(
            op,
            socket = %self.socket.display(),
            "simdev did not answer within {:?}; the connection is given up",
            self.control_timeout
        );
        DeviceError::NotResponding {
            op,
            waited: self.control_timeout,
        }
    }

    /// Whether `fd` becomes readable (a reply, or the peer hanging up) within `bound`.
    fn reply_within(&self, fd: &OwnedFd, bound: Bound) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let deadline = match bound {
            Bound::Control => Instant::now() + self.control_timeout,
            Bound::Deadline(d) => d,
        };
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let ms = PollTimeout::try_from(i32::try_from(left.as_millis()).unwrap_or(i32::MAX))
                .unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(0) if left.is_zero() => return false,
                Ok(0) | Err(nix::Error::EINTR) => {}
                // Readable, hung up or failed: the receive says which.
                Ok(_) | Err(_) => return true,
            }
        }
    }

    /// DMA_QUEUE_COPY_START within `bound`.
    fn copy_start(
        &self,
        queue: DmaQueueId,
        tx_desc_count: u32,
        rx_desc_count: u32,
        bound: Bound,
    ) -> Result<(), DeviceError> {
        let op = "DmaQueueCopyStart";
        check_queue(op, &self.info, queue)?;
        if rx_desc_count == 0 {
            return Err(DeviceError::OutOfRange {
                op,
                what: "rx_desc_count (must be >= 1)",
                value: 0,
                limit: 0,
            });
        }
        let req = Request::DmaQueueCopyStart {
            nc: queue.nc,
            engine: queue.engine,
            queue: queue.queue,
            tx_desc_count,
            rx_desc_count,
        };
        match self.request_bounded(op, &req, bound)?.0 {
            Reply::Ok => Ok(()),
            other => Err(unexpected(op, &other)),
        }
    }

    /// MEM_ALLOC within `bound`.
    fn alloc(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
        bound: Bound,
    ) -> Result<Allocation, DeviceError> {
        let op = "MemAlloc";
        if let MemLocation::Hbm { nc } = location {
            self.check_nc(op, nc)?;
        }
        let req = Request::MemAlloc {
            location,
            size,
            align,
        };
        match self.request_bounded(op, &req, bound)?.0 {
            Reply::MemAllocated { handle, pa, size } => Ok(Allocation {
                handle: MemHandle(handle),
                pa,
                size,
                location,
            }),
            other => Err(unexpected(op, &other)),
        }
    }

    /// MEM_MAP within `bound`, and the mapping of the chunk's memfd.
    fn map(&self, allocation: &Allocation, bound: Bound) -> Result<SharedChunk, DeviceError> {
        let op = "MemMap";
        let (fd, pa, size) = self.chunk_memfd(allocation, bound)?;
        let len = usize::try_from(size).map_err(|_| DeviceError::Protocol {
            op,
            detail: format!("chunk size {size}"),
        })?;
        SharedChunk::map_fd(&File::from(fd), pa, len, true)
            .map_err(|source| DeviceError::Map { op, source })
    }

    fn request_ok(&self, op: &'static str, req: &Request) -> Result<(), DeviceError> {
        match self.request(op, req)?.0 {
            Reply::Ok => Ok(()),
            other => Err(unexpected(op, &other)),
        }
    }

    /// `MemMap`: simdev answers with the chunk's own memfd (mapping the chunk from offset 0),
    /// its PA and its size.
    fn chunk_memfd(
        &self,
        allocation: &Allocation,
        bound: Bound,
    ) -> Result<(std::os::fd::OwnedFd, u64, u64), DeviceError> {
        let op = "MemMap";
        let (reply, mut fds) = self.request_bounded(
            op,
            &Request::MemMap {
                handle: allocation.handle.0,
            },
            bound,
        )?;
        let Reply::MemMapped { pa, size, .. } = reply else {
            return Err(unexpected(op, &reply));
        };
        let fd = fds.pop().ok_or_else(|| unexpected(op, &reply))?;
        Ok((fd, pa, size))
    }

    fn request_value(&self, op: &'static str, req: &Request) -> Result<u32, DeviceError> {
        match self.request(op, req)?.0 {
            Reply::Value(v) => Ok(v),
            other => Err(unexpected(op, &other)),
        }
    }

    fn check_nc(&self, op: &'static str, nc: u32) -> Result<(), DeviceError> {
        check_range(op, "nc", nc, self.info.nc_count)
    }

    fn check_semaphore(&self, op: &'static str, nc: u32, index: u32) -> Result<(), DeviceError> {
        self.check_nc(op, nc)?;
        check_range(op, "semaphore", index, self.info.semaphores_per_nc)
    }

    fn check_event(&self, op: &'static str, nc: u32, index: u32) -> Result<(), DeviceError> {
        self.check_nc(op, nc)?;
        check_range(op, "event", index, self.info.events_per_nc)
    }
}

/// Decodes a received reply and checks its fds: exactly `reply.fd_count()` of them, else a
/// protocol error. An error reply becomes [`DeviceError::Remote`].
fn parse_reply(
    op: &'static str,
    bytes: &[u8],
    fds: Vec<OwnedFd>,
) -> Result<(Reply, Vec<OwnedFd>), DeviceError> {
    let reply: Reply = protocol::decode(bytes).map_err(|e| DeviceError::Protocol {
        op,
        detail: e.to_string(),
    })?;
    if let Reply::Error(source) = reply {
        return Err(DeviceError::Remote { op, source });
    }
    if fds.len() != reply.fd_count() {
        return Err(DeviceError::Protocol {
            op,
            detail: format!(
                "{} fds with a reply that carries {}",
                fds.len(),
                reply.fd_count()
            ),
        });
    }
    Ok((reply, fds))
}

/// What becomes of the reply to `req` (named `op`) should it come after its request stopped
/// waiting.
fn owed_for(req: &Request, op: &'static str) -> Owed {
    match req {
        Request::MemAlloc { .. } => Owed::Free,
        Request::MemFree { .. } => Owed::Confirm(op),
        _ => Owed::Discard(op),
    }
}

impl Owed {
    /// The operation whose reply it is.
    const fn op(self) -> &'static str {
        match self {
            Self::Discard(op) | Self::Confirm(op) => op,
            Self::Free => "MemAlloc",
        }
    }
}

fn unexpected(op: &'static str, reply: &Reply) -> DeviceError {
    DeviceError::Protocol {
        op,
        detail: format!("unexpected reply {reply:?}"),
    }
}

fn placeholder_info() -> DeviceInfo {
    DeviceInfo {
        arch: shared::Arch::Trn1,
        nc_count: 0,
        hbm_bytes_per_nc: 0,
        hbm_bases: Vec::new(),
        host_base: 0,
        reg_base: 0,
        semaphores_per_nc: 0,
        events_per_nc: 0,
        dma_engines_per_nc: 0,
        dma_queues_per_engine: 0,
        description: String::new(),
    }
}

impl Device for SimDevice {
    fn backend_name(&self) -> &'static str {
        "sim"
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn claim_nc(&self, nc: u32) -> Result<ClaimedNc, DeviceError> {
        let op = "ClaimNc";
        self.check_nc(op, nc)?;
        let (reply, mut fds) = self.request(op, &Request::ClaimNc { nc })?;
        if !matches!(reply, Reply::NcClaimed { nc: n } if n == nc) {
            return Err(unexpected(op, &reply));
        }
        let notification_fd = fds.pop();
        let window_fd = fds.pop().ok_or_else(|| unexpected(op, &reply))?;
        let window = SharedChunk::map_fd(&window_fd, 0, SEM_WINDOW_SIZE, false)
            .map_err(|source| DeviceError::Map { op, source })?;
        Ok(ClaimedNc {
            nc,
            semaphore_window: Some(window),
            notification_fd,
        })
    }

    fn release_nc(&self, nc: u32) -> Result<(), DeviceError> {
        self.check_nc("ReleaseNc", nc)?;
        self.request_ok("ReleaseNc", &Request::ReleaseNc { nc })
    }

    fn mem_alloc(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
    ) -> Result<Allocation, DeviceError> {
        self.alloc(location, size, align, Bound::Control)
    }

    fn mem_alloc_by(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
        deadline: Instant,
    ) -> Result<Allocation, DeviceError> {
        self.alloc(location, size, align, Bound::Deadline(deadline))
    }

    fn mem_free(&self, handle: MemHandle) -> Result<(), DeviceError> {
        self.request_unwaited("MemFree", &Request::MemFree { handle: handle.0 })
    }

    fn mem_map(&self, allocation: &Allocation) -> Result<SharedChunk, DeviceError> {
        self.map(allocation, Bound::Control)
    }

    fn mem_map_by(
        &self,
        allocation: &Allocation,
        deadline: Instant,
    ) -> Result<SharedChunk, DeviceError> {
        self.map(allocation, Bound::Deadline(deadline))
    }

    fn mem_export_fd(&self, allocation: &Allocation) -> Result<std::os::fd::OwnedFd, DeviceError> {
        // The chunk's own memfd: it maps the region from offset 0.
        Ok(self.chunk_memfd(allocation, Bound::Control)?.0)
    }

    fn dma_queue_init(&self, queue: DmaQueueId, rings: &DmaRings) -> Result<(), DeviceError> {
        let op = "DmaQueueInit";
        check_queue(op, &self.info, queue)?;
        self.request_ok(
            op,
            &Request::DmaQueueInit {
                nc: queue.nc,
                engine: queue.engine,
                queue: queue.queue,
                tx_ring: rings.tx_ring.0,
                tx_desc_count: rings.tx_desc_count,
                rx_ring: rings.rx_ring.0,
                rx_desc_count: rings.rx_desc_count,
            },
        )
    }

    fn dma_queue_release(&self, queue: DmaQueueId) -> Result<(), DeviceError> {
        let op = "DmaQueueRelease";
        check_queue(op, &self.info, queue)?;
        self.request_ok(
            op,
            &Request::DmaQueueRelease {
                nc: queue.nc,
                engine: queue.engine,
                queue: queue.queue,
            },
        )
    }

    fn dma_queue_copy_start(
        &self,
        queue: DmaQueueId,
        tx_desc_count: u32,
        rx_desc_count: u32,
    ) -> Result<(), DeviceError> {
        self.copy_start(queue, tx_desc_count, rx_desc_count, Bound::Control)
    }

    fn dma_queue_copy_start_by(
        &self,
        queue: DmaQueueId,
        tx_desc_count: u32,
        rx_desc_count: u32,
        deadline: Instant,
    ) -> Result<(), DeviceError> {
        self.copy_start(
            queue,
            tx_desc_count,
            rx_desc_count,
            Bound::Deadline(deadline),
        )
    }

    fn semaphore_increment(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        let op = "SemaphoreIncrement";
        self.check_semaphore(op, nc, index)?;
        self.send(op, &Request::SemaphoreIncrement { nc, index, value })
    }

    fn semaphore_decrement(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        let op = "SemaphoreDecrement";
        self.check_semaphore(op, nc, index)?;
        self.request_ok(op, &Request::SemaphoreDecrement { nc, index, value })
    }

    fn semaphore_read(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        let op = "SemaphoreRead";
        self.check_semaphore(op, nc, index)?;
        self.request_value(op, &Request::SemaphoreRead { nc, index })
    }

    fn semaphore_write(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        let op = "SemaphoreWrite";
        self.check_semaphore(op, nc, index)?;
        self.request_ok(op, &Request::SemaphoreWrite { nc, index, value })
    }

    fn event_set(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError> {
        let op = "EventSet";
        self.check_event(op, nc, index)?;
        self.request_ok(op, &Request::EventSet { nc, index, value })
    }

    fn event_get(&self, nc: u32, index: u32) -> Result<u32, DeviceError> {
        let op = "EventGet";
        self.check_event(op, nc, index)?;
        self.request_value(op, &Request::EventGet { nc, index })
    }

    fn notification_queue_init(
        &self,
        nc: u32,
        entries: u32,
    ) -> Result<NotificationQueue, DeviceError> {
        let op = "NotificationInit";
        self.check_nc(op, nc)?;
        let req = Request::NotificationInit {
            nc,
            nq_type: shared::ioctl::NQ_TYPE_NOTIFY,
            entries,
        };
        let (handle, pa, size, entries) = match self.request(op, &req)?.0 {
            Reply::NotificationQueue {
                handle,
                pa,
                size,
                entries,
            } => (handle, pa, size, entries),
            other => return Err(unexpected(op, &other)),
        };
        let allocation = Allocation {
            handle: MemHandle(handle),
            pa,
            size,
            location: MemLocation::Host,
        };
        let memory = self.mem_map(&allocation)?;
        Ok(NotificationQueue {
            allocation,
            entries,
            memory,
        })
    }

    fn nc_reset(&self, nc: u32) -> Result<(), DeviceError> {
        self.check_nc("NcReset", nc)?;
        self.request_ok("NcReset", &Request::NcReset { nc })
    }

    fn nc_counters(&self, nc: u32) -> Result<NcCounters, DeviceError> {
        let op = "Counters";
        self.check_nc(op, nc)?;
        match self.request(op, &Request::Counters { nc })?.0 {
            Reply::Counters(c) => Ok(c),
            other => Err(unexpected(op, &other)),
        }
    }

    fn neff_references(&self) -> Result<Vec<shared::protocol::ReferenceBinding>, DeviceError> {
        let op = "References";
        match self.request(op, &Request::References)?.0 {
            Reply::References(r) => Ok(r),
            other => Err(unexpected(op, &other)),
        }
    }

    fn processes(&self) -> Result<Vec<ClientSummary>, DeviceError> {
        self.clients()
    }

    fn trace_subscribe(
        &self,
        max_events: u32,
    ) -> Result<(Vec<u32>, shared::protocol::TraceClock), DeviceError> {
        let op = "TraceSubscribe";
        match self.request(op, &Request::TraceSubscribe { max_events })?.0 {
            Reply::TraceSubscribed { ncs, clock } => Ok((ncs, clock)),
            other => Err(unexpected(op, &other)),
        }
    }

    fn trace_drain(&self) -> Result<super::DrainedTrace, DeviceError> {
        let op = "TraceDrain";
        match self.request(op, &Request::TraceDrain)?.0 {
            Reply::TraceEvents {
                events,
                dropped,
                more,
                clock,
            } => Ok(super::DrainedTrace {
                events,
                dropped,
                more,
                clock,
            }),
            other => Err(unexpected(op, &other)),
        }
    }

    /// A private simdev's new warn and error lines; nothing for a shared simdev (its log is
    /// its own stderr, where its operator reads it).
    /// The connection hung up (`POLLHUP`/`POLLERR` on its socket, polled without waiting: a
    /// `SOCK_SEQPACKET` socket whose peer closed is shut down both ways): simdev exited or was
    /// killed.
    fn hung_up(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        if self.unresponsive.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        match &self.link {
            Link::Socket { fd, .. } => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::empty())];
                matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
                    && fds[0]
                        .revents()
                        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
            }
            #[cfg(any(test, feature = "test-support"))]
            Link::InProcess(_) => false,
        }
    }

    fn take_device_log(&self) -> Vec<String> {
        self.child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or_else(Vec::new, PrivateSimdev::take_log)
    }

    fn flush(&self) -> Result<(), DeviceError> {
        // A waited request: simdev answers a connection's requests in order, so its reply
        // comes after every earlier one (an unwaited MEM_FREE's included) was handled.
        self.device_stats().map(|_| ())
    }

    fn closing_by(&self, deadline: Instant) {
        let _ = self.closing.set(deadline);
    }

    fn release(&self) {
        // The connection first, as at drop: later requests (of tensors not freed before
        // nrt_close) fail at once (Disconnected) instead of reaching a simdev that is stopping,
        // and a shared simdev lets the connection go — its claims, queues and memory — as the
        // driver does when the device file is closed.
        match &self.link {
            Link::Socket { fd, .. } => {
                let _ =
                    nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
            }
            #[cfg(any(test, feature = "test-support"))]
            Link::InProcess(_) => {}
        }
        let child = self
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(mut child) = child {
            child.stop();
        }
    }
}

/// How to start a simdev process: a program and the arguments that precede simdev's own
/// (empty for the `simdev` binary; `["simdev"]` for `nrt`, which re-executes itself as simdev).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimdevCommand {
    /// The executable.
    pub program: PathBuf,
    /// Arguments before simdev's options.
    pub args_prefix: Vec<OsString>,
    /// Extra simdev options (e.g. `--arch trn2`, `--ncs 4`).
    pub extra_args: Vec<OsString>,
}

/// A simdev child process on a private socket in its own temporary directory and its own
/// process group. Dropping it sends SIGTERM, waits up to 2 s, then SIGKILLs. The child also
/// gets SIGUSR1 if this process dies (`PR_SET_PDEATHSIG`), so no simdev outlives its parent:
/// simdev's `--private` makes it stop on that signal and remove its directory. A process that
/// exits without dropping it (a C program returning from `main` before `nrt_close`) has the
/// child killed and the directory removed by an exit hook ([`crate::process::undo_at_exit`]).
///
/// The child is spawned by a thread of its own ([`ParentThread`]), which lives until the child
/// is reaped: Linux sends the parent-death signal when the spawning *thread* exits, and the
/// thread that opens the device (a C caller's `nrt_init`) may be gone long before the device.
#[derive(Debug)]
pub struct PrivateSimdev {
    child: Child,
    /// The thread that spawned `child`; `None` only in a forked child (see
    /// [`PrivateSimdev::stop`]).
    parent: Option<ParentThread>,
    socket: PathBuf,
    /// `None` only while a forked child leaks it (see [`PrivateSimdev::stop`]).
    dir: Option<tempfile::TempDir>,
    /// The process that started simdev: the only one that stops it.
    spawner: u32,
    /// What of `simdev.log` was passed on ([`PrivateSimdev::take_log`]).
    log: Mutex<log_tail::LogTail>,
    /// The child and its directory, as the exit hook knows them.
    leftover: Leftover,
    /// The thread reading simdev's stdout, joined by [`PrivateSimdev::stop`].
    drain: Option<StdoutDrain>,
}

/// The thread that reads simdev's stdout: it passes on the first line (the ready line) and
/// discards the rest, so simdev never writes into a full or closed pipe. It ends at the pipe's
/// end or when told to stop, so `stop` can join it: no thread of the runtime outlives its
/// device (a C caller may `dlclose` the library after `nrt_close`).
struct StdoutDrain {
    stop: nix::sys::eventfd::EventFd,
    thread: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for StdoutDrain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdoutDrain")
            .field("thread", &self.thread.thread().name())
            .finish_non_exhaustive()
    }
}

impl StdoutDrain {
    fn start(
        out: std::process::ChildStdout,
        first_line: mpsc::Sender<Option<String>>,
    ) -> Result<Self, DeviceError> {
        let stop = nix::sys::eventfd::EventFd::from_value_and_flags(
            0,
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC,
        )
        .map_err(|e| DeviceError::Io {
            op: "eventfd for simdev's stdout",
            source: e.into(),
        })?;
        let told = stop
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| DeviceError::Io {
                op: "eventfd for simdev's stdout",
                source,
            })?;
        let thread = std::thread::Builder::new()
            .name("simdev-stdout".into())
            .spawn(move || Self::run(&OwnedFd::from(out), &told, &first_line))
            .map_err(|source| DeviceError::Io {
                op: "spawn simdev's stdout reader",
                source,
            })?;
        Ok(Self { stop, thread })
    }

    fn run(out: &OwnedFd, stop: &OwnedFd, first_line: &mpsc::Sender<Option<String>>) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut line: Option<Vec<u8>> = Some(Vec::new());
        let mut buf = [0u8; 4096];
        loop {
            let mut fds = [
                PollFd::new(out.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
            if fds[1].any().unwrap_or(true) {
                break;
            }
            // Readable or hung up: one read does not block.
            let n = match nix::unistd::read(out, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(l) = &mut line {
                l.extend_from_slice(&buf[..n]);
                // A line, or as much as a ready line could be (then it is not one).
                let end = l.iter().position(|&b| b == b'\n');
                if end.is_some() || l.len() > buf.len() {
                    let first = String::from_utf8_lossy(&l[..end.unwrap_or(l.len())]).into_owned();
                    let _ = first_line.send(Some(first));
                    line = None;
                }
            }
        }
        if line.is_some() {
            let _ = first_line.send(None);
        }
    }

    /// Tells the thread to stop and joins it.
    fn join(self) {
        let _ = self.stop.write(1);
        let _ = self.thread.join();
    }
}

/// The thread a private simdev is spawned from, parked until the child is reaped: its exit is
/// what sends the child its parent-death signal ([`shared::child`]).
struct ParentThread {
    /// Dropping it (or sending on it) ends the thread.
    release: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for ParentThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentThread")
            .field("thread", &self.thread.thread().name())
            .finish_non_exhaustive()
    }
}

impl ParentThread {
    /// Spawns `cmd` from a new thread, which then waits for [`ParentThread::release`].
    fn spawn(mut cmd: Command) -> Result<(Child, Self), DeviceError> {
        let (spawned_tx, spawned) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("simdev-parent".into())
            .spawn(move || {
                let _ = spawned_tx.send(cmd.spawn());
                // Sent or dropped: the child is reaped (or was never started).
                let _ = released.recv();
            })
            .map_err(|source| DeviceError::Io {
                op: "spawn the thread that starts simdev",
                source,
            })?;
        let this = Self { release, thread };
        match spawned.recv() {
            Ok(Ok(child)) => Ok((child, this)),
            Ok(Err(source)) => {
                this.release();
                Err(DeviceError::Io {
                    op: "start simdev",
                    source,
                })
            }
            Err(_) => {
                this.release();
                Err(DeviceError::Io {
                    op: "start simdev",
                    source: std::io::Error::other("the thread starting it ended"),
                })
            }
        }
    }

    /// Ends the thread (call it once the child is reaped) and joins it.
    fn release(self) {
        let _ = self.release.send(());
        let _ = self.thread.join();
    }
}

impl PrivateSimdev {
    /// Spawns `command --socket <tmp>/simdev.sock` and waits (up to [`SIMDEV_START_TIMEOUT`])
    /// for its "simdev listening on" line. simdev's stderr goes to `<tmp>/simdev.log`.
    ///
    /// # Errors
    /// [`DeviceError::NoDevice`] naming the program and quoting its log when it cannot start.
    pub fn spawn(command: &SimdevCommand) -> Result<Self, DeviceError> {
        let tmp = private_parent(&std::env::temp_dir());
        for dir in abandoned::sweep(&tmp) {
            tracing::debug!(
                "removed {}: a private simdev that never started",
                dir.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("simdev-")
            .tempdir_in(&tmp)
            .map_err(|source| DeviceError::Io {
                op: "create simdev socket directory",
                source,
            })?;
        let socket = dir.path().join("simdev.sock");
        let log_path = dir.path().join(PRIVATE_LOG);
        let log = File::create(&log_path).map_err(|source| DeviceError::Io {
            op: "create simdev log",
            source,
        })?;
        let mut cmd = Command::new(&command.program);
        cmd.args(&command.args_prefix)
            .arg("--socket")
            .arg(&socket)
            .args(&command.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        cmd.arg("--private");
        shared::child::signal_with_parent(
            &mut cmd,
            shared::child::PRIVATE_SIMDEV_PARENT_DEATH_SIGNAL,
        );
        // Its own process group: a terminal's Ctrl-C (SIGINT to the foreground group) reaches
        // the program, which stops its device in order, and not the device under it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let (mut child, parent) = ParentThread::spawn(cmd).map_err(|e| match e {
            DeviceError::Io {
                op: "start simdev",
                source,
            } => DeviceError::NoDevice {
                hint: format!(
                    "could not start simdev ({}): {source}",
                    command.program.display()
                ),
            },
            other => other,
        })?;
        let (tx, rx) = mpsc::channel();
        let drain = match child
            .stdout
            .take()
            .map(|out| StdoutDrain::start(out, tx))
            .transpose()
        {
            Ok(drain) => drain,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                parent.release();
                return Err(e);
            }
        };
        let spawner = crate::process::id();
        let leftover = Leftover::Child {
            pid: child.id(),
            dir: dir.path().to_path_buf(),
        };
        crate::process::undo_at_exit(leftover.clone());
        let ready = rx.recv_timeout(SIMDEV_START_TIMEOUT);
        let mut this = PrivateSimdev {
            child,
            parent: Some(parent),
            socket,
            dir: Some(dir),
            spawner,
            log: Mutex::new(log_tail::LogTail::new(log_path.clone())),
            leftover,
            drain,
        };
        match ready {
            Ok(Some(line)) if line.starts_with("simdev listening on") => Ok(this),
            other => {
                this.stop();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                Err(DeviceError::NoDevice {
                    hint: format!(
                        "simdev ({}) did not start ({}); its log:\n{}",
                        command.program.display(),
                        match other {
                            Ok(Some(line)) => format!("first line {line:?}"),
                            Ok(None) => "it exited".to_string(),
                            Err(_) => format!("no ready line within {SIMDEV_START_TIMEOUT:?}"),
                        },
                        log.trim_end()
                    ),
                })
            }
        }
    }

    /// The socket the child listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What simdev logged at warn or error level since the last call (see [`log_tail`]): the
    /// reason of a failed execution, which would otherwise stay in `simdev.log`.
    pub fn take_log(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The directory holding the socket and `simdev.log`.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map_or_else(
            || self.socket.parent().unwrap_or(&self.socket),
            |d| d.path(),
        )
    }

    /// Stops the child: SIGTERM, up to 2 s of grace, then SIGKILL; reaps it. In a process
    /// forked from the one that started it, does nothing but leak the directory handle (the
    /// simdev and its socket belong to the parent).
    pub fn stop(&mut self) {
        if crate::process::id() != self.spawner {
            std::mem::forget(self.dir.take());
            // The reader and parent threads are the spawner's, not in this process.
            std::mem::forget(self.drain.take());
            std::mem::forget(self.parent.take());
            return;
        }
        crate::process::forget_at_exit(&self.leftover);
        self.stop_child();
        if let Some(parent) = self.parent.take() {
            parent.release();
        }
        if let Some(drain) = self.drain.take() {
            drain.join();
        }
    }

    fn stop_child(&mut self) {
        if self.exited() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if self.exited() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if !self.exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Whether the child has exited: reaped now, or no longer a child at all (ECHILD: a
    /// program that ignores SIGCHLD has the kernel reap its children as they exit, and their
    /// pids may already name other processes, which must not be signalled).
    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for PrivateSimdev {
    fn drop(&mut self) {
        self.stop();
    }
}

mod abandoned;
mod log_tail;

#[cfg(test)]
mod tests;
