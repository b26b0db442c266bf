//! The control socket: listener, accept loop, one thread per connection, the peer-uid check,
//! the handshake, message framing and fd passing (DESIGN §4–§5, `shared::protocol`).
//!
//! A connection is one client. Its thread receives the waiting requests with one `recvmmsg`
//! (at most 16, each into a [`MAX_MSG_SIZE`] buffer: a longer message is truncated and refused
//! as [`ErrorKind::BadMessage`]; fds a client sends are closed), answers each in order through
//! [`Device::handle`] with one `sendmsg` carrying the reply's fds as `SCM_RIGHTS`, and sends
//! nothing for posted requests. The notification eventfd is written once per NC per batch
//! (before any reply, and before the thread sleeps again), not once per execution. Where the
//! kernel gives one (`--receive io-uring`, the default), the thread receives through an
//! io_uring instead ([`crate::uring`]): the same batches, with the batch's eventfd writes
//! submitted in the same system call as the wait for the next message, so that the client's
//! woken worker does not preempt the thread between the two. When the connection ends for any
//! reason (EOF, reset, the process killed) the device reclaims everything the client owned.
//!
//! Stopping ([`StopHandle::stop`], SIGINT/SIGTERM in [`run`]) removes the socket, posts a
//! DeviceLost notification on every claimed NC, shuts every connection down (clients see EOF),
//! waits for the connection threads to reclaim their clients and writes the trace file, if
//! one is configured. An injected DeviceLost fault does the same (the device has already
//! posted DeviceLost and the socket is removed at once), and [`Server::serve`] then returns
//! [`SimdevError::DeviceLost`], which the `simdev` command turns into exit status 3.

use std::collections::HashMap;
use std::io::{self, IoSliceMut, Write};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{
    AddressFamily, Backlog, MsgFlags, MultiHeaders, Shutdown, SockFlag, SockType, UnixAddr,
    accept4, bind, connect, getsockopt, listen, recvmmsg, shutdown, socket, sockopt,
};
use nix::sys::stat::{Mode, fchmod};
use shared::fd_passing;
use shared::protocol::{
    self, Answer, ErrorKind, Handler, MAX_MSG_SIZE, RemoteError, Reply, Request, decode, encode,
};
use thiserror::Error;

use crate::client::{ClientId, Peer};
use crate::config::{Config, ConfigError, format_bytes};
use crate::counters::CountersLine;
use crate::device::{DeferredSignals, Device, PendingSignals};
use crate::dma::error_chain;
use crate::uring::{ReceivePath, ReceiveRing};

/// Pending connections the listener queues.
const BACKLOG: i32 = 128;

/// A failure to start or run simdev, named by the failing step.
#[derive(Debug, Error)]
pub enum SimdevError {
    /// The configuration is out of range.
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// Another simdev answers on the socket path.
    #[error("a simdev is already listening on {}{}", path.display(), owner_note(*owner))]
    AlreadyListening {
        /// The socket path.
        path: PathBuf,
        /// The socket's owner, when it is not this user.
        owner: Option<u32>,
    },
    /// The socket path exists and is not a socket (simdev never removes such a file).
    #[error("{} exists and is not a socket", path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// Inspecting an existing socket path failed.
    #[error("inspecting the existing {}", path.display())]
    InspectExisting {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Something other than a simdev answers on the socket path (or it cannot be probed).
    #[error("probing the existing socket {}", path.display())]
    ProbeExisting {
        /// The socket path.
        path: PathBuf,
        /// What `connect` reported.
        #[source]
        source: nix::Error,
    },
    /// Removing a stale socket failed.
    #[error("removing the stale socket {}", path.display())]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `socket(2)` failed.
    #[error("creating the control socket")]
    CreateSocket(#[source] nix::Error),
    /// `bind(2)` failed (or the path does not fit a Unix socket address).
    #[error("binding the control socket to {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// Setting mode 0600 on the socket failed.
    #[error("restricting {} to mode 0600", path.display())]
    Chmod {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `listen(2)` failed.
    #[error("listening on {}", path.display())]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// Creating the stop eventfd failed.
    #[error("creating the stop eventfd")]
    CreateStopEvent(#[source] nix::Error),
    /// Creating or arming the accept loop's epoll failed.
    #[error("setting up the accept loop's epoll")]
    Epoll(#[source] nix::Error),
    /// Waiting in the accept loop failed.
    #[error("waiting for connections")]
    Wait(#[source] nix::Error),
    /// Installing the SIGINT/SIGTERM handler failed.
    #[error("installing the SIGINT/SIGTERM handler")]
    SignalHandler(#[source] ctrlc::Error),
    /// The trace file cannot be written.
    #[error("writing the trace file {}", path.display())]
    Trace {
        /// The trace path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An injected DeviceLost fault fired: the device posted DeviceLost to every claimed NC
    /// and the server stopped (the `simdev` process exits with status 3).
    #[error("the device was lost (an injected DeviceLost fault)")]
    DeviceLost,
}

/// Asks a running [`Server::serve`] to stop. Cheap to clone; safe to call from any thread and
/// more than once.
#[derive(Clone, Debug)]
pub struct StopHandle(Arc<EventFd>);

impl StopHandle {
    /// A new, unrequested stop.
    ///
    /// # Errors
    /// [`SimdevError::CreateStopEvent`].
    pub fn new() -> Result<Self, SimdevError> {
        EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map(|efd| Self(Arc::new(efd)))
            .map_err(SimdevError::CreateStopEvent)
    }

    /// Requests the stop.
    pub fn stop(&self) {
        // EAGAIN means the counter is saturated: a stop is already pending.
        let _ = self.0.write(1);
    }
}

/// The socket file simdev created; removed on drop if it is still the same file.
#[derive(Debug)]
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if meta.dev() == self.dev && meta.ino() == self.ino => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!("removing {}: {e}", self.path.display());
                }
            }
            _ => tracing::info!("{} was replaced; leaving it", self.path.display()),
        }
    }
}

/// One live connection, as the accept loop tracks it for shutdown.
#[derive(Debug)]
struct Connection {
    /// A dup of the connection's socket, to `shutdown(2)` it.
    socket: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

type Connections = Arc<Mutex<HashMap<u64, Connection>>>;

/// The socket file, shared with the device-lost hook, which removes it at once.
type SharedSocketFile = Arc<Mutex<Option<SocketFile>>>;

/// A listening simdev: the device, its control socket and its connections.
#[derive(Debug)]
pub struct Server {
    device: Arc<Device>,
    listener: OwnedFd,
    socket_file: SharedSocketFile,
    allow_uids: Arc<[u32]>,
    /// How connection threads receive ([`Config::receive`]).
    receive: ReceivePath,
    stop: StopHandle,
    connections: Connections,
    /// An injected DeviceLost fault fired.
    lost: Arc<AtomicBool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
enum Token {
    Listener = 1,
    Stop = 2,
}

impl Server {
    /// Builds the device of `config` and listens on `config.socket` (mode 0600). A stale socket
    /// file with no listener is replaced; a live simdev there is refused. `stop` ends
    /// [`Server::serve`]; so does an injected DeviceLost fault. A configured trace file is
    /// created at once (an empty trace), so an unwritable path fails here.
    ///
    /// # Errors
    /// [`SimdevError`] naming the failing step ([`SimdevError::AlreadyListening`] when another
    /// simdev answers on the path).
    pub fn bind(config: &Config, stop: StopHandle) -> Result<Self, SimdevError> {
        let device = Device::new(config)?;
        device.write_trace().map_err(|source| SimdevError::Trace {
            path: config.trace.clone().unwrap_or_default(),
            source,
        })?;
        let path = config.socket.clone();
        replace_stale(&path)?;
        let listener = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(SimdevError::CreateSocket)?;
        let addr = UnixAddr::new(&path).map_err(|source| SimdevError::Bind {
            path: path.clone(),
            source,
        })?;
        // Only the owner may connect; with --allow-uid anyone may, and the peer's uid
        // (SO_PEERCRED) is what admits or refuses it. Linux creates the socket file with the
        // socket inode's mode (minus the umask), so this closes the window between bind and
        // chmod; the chmod below is the guarantee.
        let mode = if config.allow_uids.is_empty() {
            0o600
        } else {
            0o666
        };
        let _ = fchmod(&listener, Mode::from_bits_truncate(mode));
        bind(listener.as_raw_fd(), &addr).map_err(|source| SimdevError::Bind {
            path: path.clone(),
            source,
        })?;
        let meta = std::fs::symlink_metadata(&path).map_err(|source| SimdevError::Chmod {
            path: path.clone(),
            source,
        })?;
        let socket_file = SocketFile {
            path: path.clone(),
            dev: meta.dev(),
            ino: meta.ino(),
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(
            |source| SimdevError::Chmod {
                path: path.clone(),
                source,
            },
        )?;
        let backlog = Backlog::new(BACKLOG).unwrap_or(Backlog::MAXCONN);
        listen(&listener, backlog).map_err(|source| SimdevError::Listen {
            path: path.clone(),
            source,
        })?;
        let socket_file: SharedSocketFile = Arc::new(Mutex::new(Some(socket_file)));
        let lost = Arc::new(AtomicBool::new(false));
        {
            let socket_file = Arc::clone(&socket_file);
            let lost = Arc::clone(&lost);
            let stop = stop.clone();
            device.on_device_lost(move || {
                lost.store(true, Ordering::SeqCst);
                drop(
                    socket_file
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take(),
                );
                stop.stop();
            });
        }
        Ok(Self {
            device: Arc::new(device),
            listener,
            socket_file,
            allow_uids: config.allow_uids.clone().into(),
            receive: config.receive,
            stop,
            connections: Arc::default(),
            lost,
        })
    }

    /// The device this server serves.
    pub const fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Accepts and serves connections until the [`StopHandle`] fires or an injected DeviceLost
    /// fault fires, then shuts down: removes the socket, posts DeviceLost notifications, shuts
    /// every connection down, waits for the connection threads to reclaim their clients, and
    /// writes the trace file (if configured).
    ///
    /// # Errors
    /// [`SimdevError::Epoll`] or [`SimdevError::Wait`]; [`SimdevError::DeviceLost`] after a
    /// DeviceLost fault. The shutdown steps run either way.
    pub fn serve(self) -> Result<(), SimdevError> {
        let result = self.accept_loop();
        drop(
            self.socket_file
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        self.device.device_lost();
        let connections = std::mem::take(
            &mut *self
                .connections
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for connection in connections.values() {
            let _ = shutdown(connection.socket.as_raw_fd(), Shutdown::Both);
        }
        for (_, mut connection) in connections {
            if let Some(thread) = connection.thread.take()
                && thread.join().is_err()
            {
                tracing::error!("a connection thread panicked");
            }
        }
        match self.device.write_trace() {
            Ok(Some(summary)) => tracing::info!(
                "trace: {} events written to {} ({} dropped)",
                summary.events,
                summary.path.display(),
                summary.dropped
            ),
            Ok(None) => {}
            Err(e) => tracing::error!("writing the trace file: {e}"),
        }
        if result.is_ok() && self.lost.load(Ordering::SeqCst) {
            return Err(SimdevError::DeviceLost);
        }
        result
    }

    fn accept_loop(&self) -> Result<(), SimdevError> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(SimdevError::Epoll)?;
        let readable = |token: Token| EpollEvent::new(EpollFlags::EPOLLIN, token as u64);
        epoll
            .add(&self.listener, readable(Token::Listener))
            .map_err(SimdevError::Epoll)?;
        epoll
            .add(self.stop.0.as_fd(), readable(Token::Stop))
            .map_err(SimdevError::Epoll)?;
        let mut events = [EpollEvent::empty(); 2];
        let mut next_connection = 0u64;
        loop {
            let ready = match epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(n) => n,
                // A signal handler ran on this thread; its effect arrives through the eventfd.
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(SimdevError::Wait(e)),
            };
            for event in events.iter().take(ready) {
                if event.data() == Token::Stop as u64 {
                    tracing::info!("stopping");
                    return Ok(());
                }
                match accept4(&self.listener, SockFlag::SOCK_CLOEXEC) {
                    Ok(socket) => {
                        next_connection += 1;
                        self.spawn_connection(next_connection, socket);
                    }
                    Err(Errno::EAGAIN | Errno::EINTR | Errno::ECONNABORTED) => {}
                    Err(e) => {
                        tracing::warn!("accepting a connection: {e}");
                        // Out of fds or memory: back off instead of spinning on a ready listener.
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
        }
    }

    fn spawn_connection(&self, id: u64, socket: OwnedFd) {
        let dup = match socket.try_clone() {
            Ok(dup) => dup,
            Err(e) => {
                tracing::warn!("duplicating a connection socket: {e}; dropping the connection");
                return;
            }
        };
        let device = Arc::clone(&self.device);
        let allow = Arc::clone(&self.allow_uids);
        let receive = self.receive;
        let connections = Arc::clone(&self.connections);
        let mut table = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let thread = std::thread::Builder::new()
            .name(format!("simdev-conn-{id}"))
            .spawn(move || {
                let served = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    serve_connection(&device, &socket, &allow, receive);
                }));
                if served.is_err() {
                    // The client was disconnected as the panic unwound; closing both ends here
                    // (this one and the table's duplicate) shows it the device gone at once,
                    // rather than an execution that never completes.
                    tracing::error!(
                        "connection {id}: serving it panicked (a simdev bug); its client is \
                         disconnected and its NCs released"
                    );
                    let _ = nix::sys::socket::shutdown(
                        socket.as_raw_fd(),
                        nix::sys::socket::Shutdown::Both,
                    );
                }
                drop(socket);
                connections
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
            });
        match thread {
            Ok(thread) => {
                table.insert(
                    id,
                    Connection {
                        socket: dup,
                        thread: Some(thread),
                    },
                );
            }
            Err(e) => tracing::warn!("starting a connection thread: {e}; dropping the connection"),
        }
    }
}

/// Whether a peer with `uid` may use a simdev running as `own_euid` with extra `allow_uids`.
///
/// # Errors
/// The [`ErrorKind::PermissionDenied`] refusal to send (as [`Reply::Error`]) before closing.
pub fn check_peer(uid: u32, own_euid: u32, allow_uids: &[u32]) -> Result<(), RemoteError> {
    if uid == own_euid || allow_uids.contains(&uid) {
        Ok(())
    } else {
        Err(RemoteError {
            kind: ErrorKind::PermissionDenied,
            message: format!(
                "uid {uid} is not allowed to use this simdev (start it with --allow-uid {uid})"
            ),
        })
    }
}

/// What to do after one received message.
#[derive(Debug)]
pub enum Response {
    /// Send this reply and its fds.
    Reply(Reply, Vec<OwnedFd>),
    /// Send nothing (a posted request).
    Silent,
    /// Send this reply, then close the connection (a failed handshake).
    Close(Reply),
}

/// One connection's protocol state: the client and whether it has said Hello.
#[derive(Debug)]
pub struct Session {
    client: ClientId,
    greeted: bool,
}

impl Session {
    /// A session for `client`, before the handshake.
    pub const fn new(client: ClientId) -> Self {
        Self {
            client,
            greeted: false,
        }
    }

    /// The session's client.
    pub const fn client(&self) -> ClientId {
        self.client
    }

    /// Answers one received message: `bytes` as received, `truncated` when it was longer than
    /// [`MAX_MSG_SIZE`]. The first message must be a Hello of the right version; after it,
    /// undecodable messages get [`ErrorKind::BadMessage`] and the session goes on.
    pub fn respond(&mut self, device: &Device, bytes: &[u8], truncated: bool) -> Response {
        let request = if truncated {
            Err(format!("message longer than {MAX_MSG_SIZE} bytes"))
        } else {
            decode::<Request>(bytes).map_err(|e| error_chain(&e))
        };
        if !self.greeted {
            return self.handshake(device, request);
        }
        let request = match request {
            Ok(request) => request,
            Err(why) => {
                let reply = Reply::error(ErrorKind::BadMessage, format!("bad message: {why}"));
                return Response::Reply(reply, Vec::new());
            }
        };
        let posted = request.is_posted();
        let (reply, fds) = device.handle(self.client, request);
        if posted {
            Response::Silent
        } else {
            Response::Reply(reply, fds)
        }
    }

    fn handshake(&mut self, device: &Device, request: Result<Request, String>) -> Response {
        let refusal = |why: String| {
            Response::Close(Reply::error(
                ErrorKind::Handshake,
                format!("the first request must be Hello: {why}"),
            ))
        };
        match request {
            Ok(hello @ Request::Hello { .. }) => match device.handle(self.client, hello) {
                (reply @ Reply::Hello { .. }, _) => {
                    self.greeted = true;
                    Response::Reply(reply, Vec::new())
                }
                (reply, _) => Response::Close(reply),
            },
            Ok(other) => refusal(format!("got {}", other.name())),
            Err(why) => refusal(why),
        }
    }
}

/// Serves one connection until it ends, then reclaims its client.
fn serve_connection(device: &Device, socket: &OwnedFd, allow_uids: &[u32], receive: ReceivePath) {
    let peer = match getsockopt(socket, sockopt::PeerCredentials) {
        Ok(creds) => creds,
        Err(e) => {
            tracing::warn!("reading a connection's peer credentials: {e}; closing it");
            return;
        }
    };
    let uid = peer.uid();
    let own = nix::unistd::geteuid().as_raw();
    if let Err(refusal) = check_peer(uid, own, allow_uids) {
        let reply = Reply::Error(refusal);
        tracing::warn!("refused a connection from uid {uid} (pid {})", peer.pid());
        // Answer the client's first message (its Hello) with the refusal, so the client reads it
        // as the reply instead of finding the connection closed under its send. A client that
        // says nothing within the timeout is just closed.
        let timeout = nix::sys::time::TimeVal::new(2, 0);
        let _ = nix::sys::socket::setsockopt(socket, sockopt::ReceiveTimeout, &timeout);
        let mut buffers = Buffers::new();
        let _ = receive_batch(socket, &mut buffers);
        let _ = send(socket, &reply, &[], &mut buffers.send);
        return;
    }
    let pid = u32::try_from(peer.pid()).unwrap_or(0);
    let client = match socket.try_clone() {
        Ok(dup) => device.connect_peer(Peer::new(pid, dup)),
        Err(e) => {
            tracing::warn!("duplicating a connection socket: {e}; its death shows at EOF only");
            device.connect(pid)
        }
    };
    tracing::info!("client {} connected (pid {pid}, uid {uid})", client.0);
    let _connected = Connected { device, client };
    let mut session = Session::new(client);
    let mut buffers = Buffers::for_connection(socket, receive);
    while serve_batch(device, socket, &mut session, &mut buffers).is_continue() {}
}

/// A connected client, disconnected (its NCs, memory and queues released) when this is
/// dropped: at the end of its connection, or while serving it unwinds from a panic, so that
/// one connection's bug never leaves an NC claimed for every later client.
struct Connected<'a> {
    device: &'a Device,
    client: ClientId,
}

impl Drop for Connected<'_> {
    fn drop(&mut self) {
        self.device.disconnect(self.client);
    }
}

/// Receives the messages of `session`'s connection that are waiting (at least one, at most
/// [`BATCH`], one `recvmmsg` or one wait on the connection's ring) and answers each in order;
/// `Break` when the connection ends (EOF, an error, a refused handshake). The notification
/// eventfd writes of the executions the batch runs inline are deferred ([`DeferredSignals`]):
/// written once per NC before any reply is sent, and the rest by the next receive, before it
/// sleeps (with its wait, through the ring), so a client with many executions queued is woken
/// once per batch rather than once per execution. Allocates nothing of its own: the messages
/// and their replies go through `buffers`.
fn serve_batch(
    device: &Device,
    socket: &OwnedFd,
    session: &mut Session,
    buffers: &mut Buffers,
) -> ControlFlow<()> {
    let client = session.client();
    let count = match receive_batch(socket, buffers) {
        Ok(count) => count,
        Err(Errno::ECONNRESET) => return ControlFlow::Break(()),
        Err(Errno::EINTR) => return ControlFlow::Continue(()),
        Err(e) => {
            tracing::warn!("client {}: receiving: {e}", client.0);
            return ControlFlow::Break(());
        }
    };
    let signals = DeferredSignals::begin();
    for (received, message) in buffers
        .received
        .iter()
        .zip(buffers.batch.iter())
        .take(count)
    {
        if received.is_eof() {
            return ControlFlow::Break(());
        }
        if received.fds_dropped {
            tracing::info!("closed fds a client sent (simdev takes none)");
        }
        let bytes = message.get(..received.len).unwrap_or(&[]);
        match session.respond(device, bytes, received.truncated) {
            Response::Reply(reply, fds) => {
                signals.flush();
                if let Err(e) = send(socket, &reply, &fds, &mut buffers.send) {
                    tracing::info!("client {}: sending a reply: {e}", client.0);
                    return ControlFlow::Break(());
                }
            }
            Response::Silent => {}
            Response::Close(reply) => {
                tracing::warn!("client {}: handshake refused: {reply:?}", client.0);
                signals.flush();
                let _ = send(socket, &reply, &[], &mut buffers.send);
                return ControlFlow::Break(());
            }
        }
    }
    buffers.pending = signals.end_unwritten();
    ControlFlow::Continue(())
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit: every chunk of device memory
/// is a memfd simdev keeps open, so the common soft limit of 1024 (which a private simdev
/// inherits from the program that starts it) would cap a runtime at about a thousand tensors.
/// A failure is logged and the limit kept.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!("RLIMIT_NOFILE raised from {soft} to {hard}"),
            Err(e) => tracing::warn!("raising RLIMIT_NOFILE from {soft} to {hard}: {e}"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!("reading RLIMIT_NOFILE: {e}"),
    }
}

/// Messages one `recvmmsg` takes at most.
const BATCH: usize = 16;

/// A connection's message buffers, allocated once per connection and reused for every
/// message: receiving and answering requests allocates nothing for them.
struct Buffers {
    /// The received messages ([`MAX_MSG_SIZE`] bytes each).
    batch: Box<[[u8; MAX_MSG_SIZE]; BATCH]>,
    /// `recvmmsg`'s headers. They carry no control buffer: simdev takes no fds, and the kernel
    /// closes the fds of a message received without room for them (flagging `MSG_CTRUNC`).
    headers: MultiHeaders<()>,
    /// What each of the batch's messages was.
    received: [Received; BATCH],
    /// The encoded reply ([`MAX_MSG_SIZE`] bytes).
    send: Box<[u8; MAX_MSG_SIZE]>,
    /// The last batch's deferred notification eventfd writes, written by the next receive:
    /// with the wait, through `ring`, or before `recvmmsg`.
    pending: PendingSignals,
    /// The connection's io_uring ([`crate::uring`]); `None`: `recvmmsg`.
    ring: Option<ReceiveRing>,
}

impl Buffers {
    fn new() -> Self {
        Self {
            batch: Box::new([[0; MAX_MSG_SIZE]; BATCH]),
            headers: MultiHeaders::preallocate(BATCH, None),
            received: [Received::default(); BATCH],
            send: Box::new([0; MAX_MSG_SIZE]),
            pending: PendingSignals::default(),
            ring: None,
        }
    }

    /// Buffers for a connection's thread: with a [`ReceiveRing`] on `socket` when `path` asks
    /// for one and the kernel allows it.
    fn for_connection(socket: &OwnedFd, path: ReceivePath) -> Self {
        let mut buffers = Self::new();
        if path == ReceivePath::IoUring {
            match ReceiveRing::new(socket.as_fd()) {
                Ok(ring) => buffers.ring = Some(ring),
                Err(e) => {
                    // Said once per process at INFO (a container's seccomp profile blocks
                    // io_uring for every connection alike), then per connection at DEBUG.
                    static SAID: std::sync::Once = std::sync::Once::new();
                    let mut said = false;
                    SAID.call_once(|| {
                        said = true;
                        tracing::info!(
                            "no io_uring ({e}): connections write their notification eventfds, \
                             then wait in recvmmsg (two system calls where io_uring takes one)"
                        );
                    });
                    if !said {
                        tracing::debug!("no io_uring for a connection ({e}): recvmmsg");
                    }
                }
            }
        }
        buffers
    }
}

/// One received message.
#[derive(Clone, Copy, Debug, Default)]
struct Received {
    len: usize,
    truncated: bool,
    /// The message carried fds, which the kernel closed.
    fds_dropped: bool,
}

impl Received {
    /// The peer closed the connection: an empty message without fds.
    const fn is_eof(&self) -> bool {
        self.len == 0 && !self.truncated && !self.fds_dropped
    }
}

/// Receives the waiting messages into `buffers.batch` (blocking for the first): how many.
fn receive_batch(socket: &OwnedFd, buffers: &mut Buffers) -> nix::Result<usize> {
    if let Some(ring) = buffers.ring.as_mut() {
        let Buffers {
            batch,
            received,
            pending,
            ..
        } = buffers;
        let mut submitted = false;
        let mut count = 0;
        let mut fds = pending.fds().inspect(|_| submitted = true);
        let result = ring.receive(&mut fds, BATCH, &mut |message| {
            let len = message.payload.len();
            if let (Some(slot), Some(info)) = (batch.get_mut(count), received.get_mut(count)) {
                slot[..len].copy_from_slice(message.payload);
                *info = Received {
                    len,
                    truncated: message.truncated,
                    fds_dropped: message.fds_dropped,
                };
                count += 1;
            }
        });
        drop(fds);
        // Submitted with the wait: done. Not (messages were waiting): written now, before
        // the batch runs, as `recvmmsg`'s path does.
        if submitted {
            pending.written_elsewhere();
        } else {
            pending.write();
        }
        return result.map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)));
    }
    buffers.pending.write();
    let mut slices = buffers.batch.each_mut().map(|b| [IoSliceMut::new(b)]);
    let results = recvmmsg(
        socket.as_raw_fd(),
        &mut buffers.headers,
        slices.iter_mut(),
        MsgFlags::MSG_WAITFORONE | MsgFlags::MSG_CMSG_CLOEXEC,
        None,
    )?;
    let mut count = 0;
    for (slot, msg) in buffers.received.iter_mut().zip(results) {
        *slot = Received {
            len: msg.bytes,
            truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
            fds_dropped: msg.flags.contains(MsgFlags::MSG_CTRUNC),
        };
        count += 1;
    }
    Ok(count)
}

/// Encodes `reply` into `buf`; a reply that does not encode is replaced by an
/// [`ErrorKind::Internal`] refusal. Returns the bytes used.
fn encode_reply(reply: &Reply, buf: &mut [u8]) -> nix::Result<usize> {
    match encode(reply, buf) {
        Ok(len) => Ok(len),
        Err(e) => {
            tracing::error!("encoding a reply: {}", error_chain(&e));
            let fallback = Reply::error(ErrorKind::Internal, "simdev could not encode its reply");
            encode(&fallback, buf).map_err(|_| Errno::EMSGSIZE)
        }
    }
}

/// Sends `reply` with `fds` as `SCM_RIGHTS` in one message, encoded in `buf`.
fn send(
    socket: &OwnedFd,
    reply: &Reply,
    fds: &[OwnedFd],
    buf: &mut [u8; MAX_MSG_SIZE],
) -> nix::Result<()> {
    let len = encode_reply(reply, &mut buf[..])?;
    let fds: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
    let data = buf.get(..len).unwrap_or(&[]);
    fd_passing::send_with_fds(socket.as_fd(), data, &fds).map(|_| ())
}

/// The device served in-process ([`Handler`]): each connection is a [`Session`], as on the
/// socket (the first message must be a Hello of [`PROTOCOL_VERSION`](shared::protocol::PROTOCOL_VERSION)), with messages
/// encoded as on the socket; only the peer-uid check has nothing to check.
impl Handler for Device {
    fn open(self: Arc<Self>, pid: u32) -> Box<dyn protocol::Connection> {
        let client = Device::connect(&self, pid);
        tracing::info!("client {} connected in-process (pid {pid})", client.0);
        Box::new(InProcessConnection {
            device: self,
            session: Session::new(client),
            closed: false,
        })
    }
}

/// One in-process connection: its session, until dropped (then the client is reclaimed, as at
/// a socket's EOF).
struct InProcessConnection {
    device: Arc<Device>,
    session: Session,
    /// The handshake was refused: the socket server would have closed the connection.
    closed: bool,
}

impl protocol::Connection for InProcessConnection {
    fn respond(&mut self, message: &[u8]) -> Answer {
        if self.closed {
            return Answer::Closed;
        }
        // The socket's receive buffer holds MAX_MSG_SIZE bytes; a longer message is truncated.
        let truncated = message.len() > MAX_MSG_SIZE;
        let bytes = message.get(..MAX_MSG_SIZE).unwrap_or(message);
        let encoded = |reply: &Reply| {
            let mut buf = vec![0u8; MAX_MSG_SIZE];
            let len = encode_reply(reply, &mut buf).unwrap_or(0);
            buf.truncate(len);
            buf
        };
        match self.session.respond(&self.device, bytes, truncated) {
            Response::Reply(reply, fds) => Answer::Reply(encoded(&reply), fds),
            Response::Silent => Answer::Silent,
            Response::Close(reply) => {
                self.closed = true;
                Answer::Close(encoded(&reply))
            }
        }
    }
}

impl Drop for InProcessConnection {
    fn drop(&mut self) {
        self.device.disconnect(self.session.client());
    }
}

/// The words [`SimdevError::AlreadyListening`] adds for a socket of another user: a default
/// path in `/tmp` may have been taken by anyone.
fn owner_note(owner: Option<u32>) -> String {
    owner.map_or_else(String::new, |uid| {
        format!(
            ", a socket of uid {uid}, not of this user: start yours on a path of your own \
             (--socket)"
        )
    })
}

/// Handles an existing file at the socket path: refuses a non-socket or a live listener,
/// removes a stale socket.
fn replace_stale(path: &Path) -> Result<(), SimdevError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(SimdevError::InspectExisting {
                path: path.to_owned(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(SimdevError::NotASocket {
            path: path.to_owned(),
        });
    }
    let probe = |source| SimdevError::ProbeExisting {
        path: path.to_owned(),
        source,
    };
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(SimdevError::CreateSocket)?;
    let addr = UnixAddr::new(path).map_err(probe)?;
    match connect(fd.as_raw_fd(), &addr) {
        Ok(()) => Err(SimdevError::AlreadyListening {
            path: path.to_owned(),
            owner: Some(meta.uid()).filter(|&uid| uid != nix::unistd::geteuid().as_raw()),
        }),
        Err(Errno::ECONNREFUSED) => {
            tracing::info!("replacing the stale socket {}", path.display());
            std::fs::remove_file(path).map_err(|source| SimdevError::RemoveStale {
                path: path.to_owned(),
                source,
            })
        }
        Err(e) => Err(probe(e)),
    }
}

/// Runs a simdev until SIGINT or SIGTERM (or an injected DeviceLost fault): listens on
/// `config.socket`, prints the ready line `simdev listening on <path> (arch <arch>, <n> NCs,
/// <hbm> HBM per NC)` to stdout, serves, then shuts down (see [`Server::serve`]) and prints
/// each NC's counters (with the faults that fired on it) and the trace's summary to stderr.
///
/// Installs a process-wide signal handler, so call it at most once per process. First gives the
/// calling thread `config.thread_policy`, which every thread simdev then starts inherits
/// ([`crate::sched`]; a failure is logged and the default policy kept).
///
/// # Errors
/// [`SimdevError`] naming the failing step.
pub fn run(config: Config) -> Result<(), SimdevError> {
    raise_fd_limit();
    // Before any thread exists, so that every device thread inherits the policy.
    if let Err(e) = config.thread_policy.apply_to_current_thread() {
        tracing::warn!(
            "setting simdev's scheduling policy to {:?}: {e}; keeping the default",
            config.thread_policy
        );
    }
    let stop = StopHandle::new()?;
    let on_signal = stop.clone();
    let private = config
        .private
        .then(|| Arc::new(crate::private::Private::new(&config.socket)));
    let watched = private.clone();
    ctrlc::set_handler(move || {
        on_signal.stop();
        if let Some(p) = &watched {
            p.on_stop();
        }
    })
    .map_err(SimdevError::SignalHandler)?;
    let parent_death = match &private {
        Some(p) => Some(
            crate::private::watch(p, stop.clone())
                .map_err(|e| SimdevError::SignalHandler(ctrlc::Error::System(e)))?,
        ),
        None => None,
    };
    // The handler is in place (or there is none to wait for): a runtime's death that came
    // before it, held pending by its spawner's mask, is delivered now.
    if let Err(e) = crate::signals::unblock_parent_death() {
        tracing::warn!("unblocking the parent-death signal: {e}");
    }
    let server = Server::bind(&config, stop)?;
    let device = Arc::clone(server.device());
    {
        let mut out = io::stdout().lock();
        // stdout may be closed by a parent that does not care; simdev runs on regardless.
        let _ = writeln!(
            out,
            "simdev listening on {} (arch {}, {} NCs, {} HBM per NC)",
            config.socket.display(),
            config.arch.name(),
            config.ncs,
            format_bytes(config.hbm_bytes_per_nc)
        );
        let _ = out.flush();
    }
    let result = server.serve();
    let mut err = io::stderr().lock();
    for nc in 0..config.ncs {
        if let Some(counters) = device.counters(nc) {
            let _ = writeln!(err, "simdev: NC {nc}: {}", CountersLine(counters));
        }
    }
    if let Some(trace) = device.trace_summary() {
        let _ = writeln!(
            err,
            "simdev: trace: {} events written to {} ({} dropped)",
            trace.events,
            trace.path.display(),
            trace.dropped
        );
    }
    if let Some(h) = parent_death {
        h.close();
    }
    if let Some(p) = private
        && p.clean_up_if_orphaned()
    {
        tracing::info!("the runtime that started this private simdev is gone: directory removed");
    }
    result
}

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;
    use std::sync::Arc;

    use shared::protocol::{
        self, Answer, ErrorKind, Handler, MAX_MSG_SIZE, PROTOCOL_VERSION, Reply, Request,
    };

    use crate::client::ClientId;
    use crate::config::Config;
    use crate::device::Device;
    use crate::uring::ReceivePath;

    fn encoded(request: &Request) -> Vec<u8> {
        let mut buf = vec![0u8; MAX_MSG_SIZE];
        let n = protocol::encode(request, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn decoded(answer: Answer) -> (Reply, usize) {
        match answer {
            Answer::Reply(bytes, fds) => (protocol::decode(&bytes).unwrap(), fds.len()),
            Answer::Close(bytes) => (protocol::decode(&bytes).unwrap(), 0),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn device() -> Arc<Device> {
        Arc::new(Device::new(&Config::default()).unwrap())
    }

    /// A live socket of another user is named as such (a default path in `/tmp` may have been
    /// taken by anyone); one of this user's is not.
    #[test]
    fn already_listening_names_another_users_socket() {
        let theirs = super::SimdevError::AlreadyListening {
            path: "/tmp/simdev-1000.sock".into(),
            owner: Some(1234),
        }
        .to_string();
        assert!(
            theirs.contains("uid 1234") && theirs.contains("--socket"),
            "{theirs}"
        );
        let ours = super::SimdevError::AlreadyListening {
            path: "/tmp/simdev-1000.sock".into(),
            owner: None,
        }
        .to_string();
        assert_eq!(
            ours,
            "a simdev is already listening on /tmp/simdev-1000.sock"
        );
    }

    /// Claims NC 0 for `client` through `device`'s request handler: whether it was granted.
    fn claims_nc0(device: &Device, client: ClientId) -> bool {
        matches!(
            device.handle(client, Request::ClaimNc { nc: 0 }).0,
            Reply::NcClaimed { nc: 0 }
        )
    }

    /// A connection whose serving panics still disconnects its client: the NC it claimed is
    /// free for the next client (it stayed claimed when the disconnect followed the serving
    /// loop instead of being a guard's drop).
    #[test]
    fn a_panic_while_serving_a_client_still_releases_its_nc() {
        let dev = device();
        let first = dev.connect(7);
        assert!(claims_nc0(&dev, first));
        let second = dev.connect(8);
        assert!(!claims_nc0(&dev, second), "NC 0 is the first client's");
        let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let _connected = super::Connected {
                device: &dev,
                client: first,
            };
            panic!("a bug while serving");
        }));
        assert!(unwound.is_err());
        assert!(
            claims_nc0(&dev, second),
            "NC 0 was released by the unwinding"
        );
    }

    /// Both receive paths: each test below runs on each (io_uring falls back to `recvmmsg`
    /// where the kernel gives none, as a connection does).
    const PATHS: [ReceivePath; 2] = [ReceivePath::Recvmmsg, ReceivePath::IoUring];

    /// A device, a connected socketpair (client end, server end) and the server end's session
    /// and buffers for `path`, as a connection thread holds them.
    fn connection(
        path: ReceivePath,
    ) -> (
        Arc<Device>,
        std::os::fd::OwnedFd,
        std::os::fd::OwnedFd,
        super::Session,
        super::Buffers,
    ) {
        let dev = device();
        let (client_end, server_end) = shared::fd_passing::seqpacket_pair().unwrap();
        let session = super::Session::new(dev.connect(7));
        let buffers = super::Buffers::for_connection(&server_end, path);
        (dev, client_end, server_end, session, buffers)
    }

    /// A request sent on one end of a socketpair, received and answered by [`super::serve_batch`]
    /// on the other, allocates nothing on the serving thread once the connection runs: the
    /// receive buffer, its control data and the reply's encoding are the connection's.
    #[test]
    fn serving_a_doorbell_or_a_register_request_allocates_nothing() {
        for path in PATHS {
            serving_allocates_nothing(path);
        }
    }

    fn serving_allocates_nothing(path: ReceivePath) {
        use std::os::fd::AsFd;

        let (dev, client_end, server_end, mut session, mut buffers) = connection(path);
        let mut answer = vec![0u8; MAX_MSG_SIZE];
        let mut exchange = |request: &Request, counted: bool| {
            let bytes = encoded(request);
            shared::fd_passing::send_with_fds(client_end.as_fd(), &bytes, &[]).unwrap();
            let mut serve = || super::serve_batch(&dev, &server_end, &mut session, &mut buffers);
            let (flow, allocations) = if counted {
                crate::alloc_count::counting(serve)
            } else {
                (serve(), 0)
            };
            assert!(flow.is_continue());
            let received = shared::fd_passing::recv_with_fds(
                client_end.as_fd(),
                &mut answer,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            );
            let reply = received
                .ok()
                .map(|r| protocol::decode::<Reply>(&answer[..r.len]).unwrap());
            (reply, allocations)
        };
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
        };
        assert!(matches!(
            exchange(&hello, false).0,
            Some(Reply::Hello { .. })
        ));
        let claim = Request::ClaimNc { nc: 0 };
        assert_eq!(exchange(&claim, false).0, Some(Reply::NcClaimed { nc: 0 }));
        let requests = [
            Request::SemaphoreWrite {
                nc: 0,
                index: 3,
                value: 1,
            },
            Request::SemaphoreIncrement {
                nc: 0,
                index: 3,
                value: 1,
            },
            Request::EventSet {
                nc: 0,
                index: 2,
                value: 1,
            },
        ];
        for request in &requests {
            exchange(request, false);
        }
        let mut total = 0;
        for _ in 0..50 {
            for request in &requests {
                let (reply, allocations) = exchange(request, true);
                if !request.is_posted() {
                    assert_eq!(reply, Some(Reply::Ok), "{request:?}");
                }
                total += allocations;
            }
        }
        assert_eq!(
            exchange(&Request::SemaphoreRead { nc: 0, index: 3 }, false).0,
            Some(Reply::Value(2)),
            "the requests took effect"
        );
        assert_eq!(total, 0, "150 requests served ({path:?})");
    }

    /// The requests waiting on a connection are received with one `recvmmsg` and answered in
    /// order by one `serve_batch` call: three posted increments, then a read that sees them.
    #[test]
    fn the_waiting_requests_are_served_as_one_batch_in_order() {
        for path in PATHS {
            waiting_requests_are_one_batch(path);
        }
    }

    fn waiting_requests_are_one_batch(path: ReceivePath) {
        use std::os::fd::AsFd;

        let (dev, client_end, server_end, mut session, mut buffers) = connection(path);
        let mut answer = vec![0u8; MAX_MSG_SIZE];
        let mut replies = |expected: usize| {
            let mut got = Vec::new();
            while let Ok(r) = shared::fd_passing::recv_with_fds(
                client_end.as_fd(),
                &mut answer,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            ) {
                got.push(protocol::decode::<Reply>(&answer[..r.len]).unwrap());
            }
            assert_eq!(got.len(), expected, "{got:?}");
            got
        };
        let send = |request: &Request| {
            shared::fd_passing::send_with_fds(client_end.as_fd(), &encoded(request), &[]).unwrap();
        };
        send(&Request::Hello {
            version: PROTOCOL_VERSION,
        });
        send(&Request::ClaimNc { nc: 0 });
        for _ in 0..3 {
            send(&Request::SemaphoreIncrement {
                nc: 0,
                index: 3,
                value: 1,
            });
        }
        send(&Request::SemaphoreRead { nc: 0, index: 3 });
        assert!(super::serve_batch(&dev, &server_end, &mut session, &mut buffers).is_continue());
        let got = replies(3);
        assert!(matches!(got[0], Reply::Hello { .. }), "{got:?}");
        assert_eq!(got[1..], [Reply::NcClaimed { nc: 0 }, Reply::Value(3)]);
        // The peer's close ends the connection.
        drop(client_end);
        assert!(super::serve_batch(&dev, &server_end, &mut session, &mut buffers).is_break());
    }

    #[test]
    fn an_in_process_connection_keeps_the_sockets_session_rules() {
        let dev = device();
        let mut c = Arc::clone(&dev).open(42);
        assert_eq!(dev.stats().clients, 1);
        // Not a Hello first: refused and closed, as the socket server closes.
        let refused = c.respond(&encoded(&Request::DeviceInfo));
        assert!(matches!(refused, Answer::Close(_)), "{refused:?}");
        let (reply, _) = decoded(refused);
        assert!(
            matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::Handshake),
            "{reply:?}"
        );
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
        };
        assert!(matches!(c.respond(&encoded(&hello)), Answer::Closed));
        drop(c);
        assert_eq!(
            dev.stats().clients,
            0,
            "dropping the connection reclaims it"
        );
    }

    #[test]
    fn after_hello_replies_carry_their_fds_posted_requests_get_none_and_garbage_is_refused() {
        let dev = device();
        let mut c = Arc::clone(&dev).open(42);
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
        };
        let (reply, _) = decoded(c.respond(&encoded(&hello)));
        assert!(matches!(reply, Reply::Hello { .. }), "{reply:?}");
        let (reply, fds) = decoded(c.respond(&encoded(&Request::ClaimNc { nc: 1 })));
        assert_eq!(fds, reply.fd_count(), "{reply:?}");
        assert_eq!(fds, 2);
        let doorbell = Request::SemaphoreIncrement {
            nc: 1,
            index: 3,
            value: 2,
        };
        assert!(matches!(c.respond(&encoded(&doorbell)), Answer::Silent));
        let (reply, _) = decoded(c.respond(&encoded(&Request::SemaphoreRead { nc: 1, index: 3 })));
        assert_eq!(reply, Reply::Value(2), "the posted increment landed first");
        for garbage in [vec![0xFF; 7], vec![0; MAX_MSG_SIZE + 1]] {
            let (reply, _) = decoded(c.respond(&garbage));
            assert!(
                matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::BadMessage),
                "{} bytes: {reply:?}",
                garbage.len()
            );
        }
        assert_eq!(dev.stats().claimed_ncs, 1);
        drop(c);
        assert_eq!(dev.stats().claimed_ncs, 0);
    }
}
