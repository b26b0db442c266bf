//! Shared helpers of the integration tests: a simdev child that is killed on drop, and a
//! minimal protocol client.

#![allow(dead_code, reason = "each test crate uses a different subset")]

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, socket};
use nix::unistd::Pid;
use shared::fd_passing;
use shared::protocol::{MAX_MSG_SIZE, PROTOCOL_VERSION, Reply, Request, decode, encode};

/// How long a simdev gets to start or stop.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A simdev child process, killed (SIGKILL) and reaped on drop unless it already exited.
pub struct Simdev {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub socket: PathBuf,
}

impl Simdev {
    /// Starts `simdev --socket <socket> <args>` with stdout and stderr piped.
    pub fn spawn(socket: &Path, args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_simdev"))
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning simdev");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            socket: socket.to_owned(),
        }
    }

    /// Starts a simdev and waits for its ready line.
    pub fn start(socket: &Path, args: &[&str]) -> Self {
        let simdev = Self::spawn(socket, args);
        let line = simdev.first_line().expect("simdev printed no ready line");
        assert!(line.starts_with("simdev listening on"), "{line:?}");
        simdev
    }

    /// The first stdout line, or `None` if simdev exited (or hung) without one.
    pub fn first_line(&self) -> Option<String> {
        self.lines.recv_timeout(PATIENCE).ok()
    }

    /// Sends `signal` to simdev.
    pub fn signal(&self, signal: Signal) {
        let pid = i32::try_from(self.child.id()).expect("pid fits i32");
        kill(Pid::from_raw(pid), signal).expect("signalling simdev");
    }

    /// Waits for simdev to exit (up to [`PATIENCE`]) and returns its status and stderr.
    pub fn wait(&mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for simdev") {
                break status;
            }
            assert!(Instant::now() < deadline, "simdev did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = ChildStderr::read_to_string(&mut pipe, &mut stderr);
        }
        (status, stderr)
    }
}

impl Drop for Simdev {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One client connection over `SOCK_SEQPACKET`.
pub struct Conn {
    fd: OwnedFd,
}

impl Conn {
    /// Connects without a handshake.
    pub fn connect(path: &Path) -> Self {
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        let addr = UnixAddr::new(path).expect("socket path");
        connect(fd.as_raw_fd(), &addr).expect("connecting to simdev");
        Self { fd }
    }

    /// Connects and says Hello.
    pub fn hello(path: &Path) -> Self {
        let conn = Self::connect(path);
        let (reply, _) = conn.call(&Request::Hello {
            version: PROTOCOL_VERSION,
        });
        assert!(matches!(reply, Reply::Hello { .. }), "{reply:?}");
        conn
    }

    /// Sends raw bytes with `fds` attached.
    pub fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        fd_passing::send_with_fds(self.fd.as_fd(), bytes, fds).expect("sendmsg");
    }

    /// Sends a request.
    pub fn send(&self, request: &Request) {
        let mut buf = vec![0u8; MAX_MSG_SIZE];
        let len = encode(request, &mut buf).expect("encoding");
        self.send_raw(&buf[..len], &[]);
    }

    /// Receives one reply and its fds; `None` at EOF.
    pub fn recv(&self) -> Option<(Reply, Vec<OwnedFd>)> {
        let mut buf = vec![0u8; MAX_MSG_SIZE];
        let received = fd_passing::recv_with_fds(self.fd.as_fd(), &mut buf, MsgFlags::empty())
            .expect("recvmsg");
        assert!(!received.control_truncated, "control data truncated");
        let (len, fds) = (received.len, received.fds);
        if len == 0 {
            return None;
        }
        Some((decode(&buf[..len]).expect("decoding a reply"), fds))
    }

    /// Sends a request and receives its reply.
    pub fn call(&self, request: &Request) -> (Reply, Vec<OwnedFd>) {
        self.send(request);
        self.recv().expect("simdev closed the connection")
    }
}
