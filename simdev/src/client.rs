//! Clients of the device: one [`ClientId`] per control connection. NCs, memory chunks and
//! notification queues belong to a client, and are reclaimed when its connection ends.
//!
//! A connection's end reaches simdev asynchronously (its thread reads EOF, then reclaims), but
//! on silicon the kernel releases a dead process's NCs before its parent's `waitpid` returns.
//! So a claim that conflicts with another client asks the owner's [`Peer`] whether it still
//! lives, and a gone owner is reclaimed on the spot. A peer is gone when its connection hung
//! up (the kernel closes a dying process's sockets before it becomes a zombie), or when its
//! process no longer exists, is a zombie, or is another process under the same pid (its start
//! time differs from the one read at connect): `kill(pid, 0)` alone would take a reused pid
//! for the owner. The process checks are made only when `/proc` is of simdev's own pid
//! namespace; the hang-up check always is.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// One client of the device: one control connection. Unique for the simdev run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// The process at the other end of a control connection, as simdev can check it later.
#[derive(Debug)]
pub struct Peer {
    pid: u32,
    /// A duplicate of the connection's socket, polled for a hang-up.
    connection: Option<OwnedFd>,
    /// The process's start time (`/proc/PID/stat` field 22) when it connected, if readable.
    start_time: Option<u64>,
}

/// What `/proc/PID/stat` says of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ProcState {
    /// No such process.
    Absent,
    /// Exited, not yet reaped (state `Z` or `X`).
    Zombie,
    /// Running (any other state), started at this time (clock ticks since boot).
    Alive(u64),
}

/// Reads `/proc/PID/stat`; `None` when it cannot be read or parsed (no judgement possible).
fn proc_state(pid: u32) -> Option<ProcState> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(ProcState::Absent),
        // ESRCH: the process went away while the file was read.
        Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => return Some(ProcState::Absent),
        Err(_) => return None,
    };
    // The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X" | "x") {
        return Some(ProcState::Zombie);
    }
    // Fields 3 (state) to 22 (starttime): starttime is the 19th after the state.
    let start = fields.nth(18)?.parse().ok()?;
    Some(ProcState::Alive(start))
}

/// Whether `/proc` shows simdev's own pid namespace, the one `SO_PEERCRED` pids are given in
/// (`/proc/self/stat` names this process by its pid). If not, a pid read there could name
/// another process, so no process check is made.
fn proc_is_ours() -> bool {
    static OURS: OnceLock<bool> = OnceLock::new();
    *OURS.get_or_init(|| {
        std::fs::read_to_string("/proc/self/stat").is_ok_and(|text| {
            text.split_whitespace().next() == Some(std::process::id().to_string().as_str())
        })
    })
}

impl Peer {
    /// Process `pid` (from `SO_PEERCRED`) on `connection` (a duplicate of the connection's
    /// socket); reads the process's start time now (when `/proc` is of simdev's own pid
    /// namespace).
    pub fn new(pid: u32, connection: OwnedFd) -> Self {
        let start_time = match proc_state(pid) {
            Some(ProcState::Alive(start)) if proc_is_ours() => Some(start),
            _ => None,
        };
        Self {
            pid,
            connection: Some(connection),
            start_time,
        }
    }

    /// A peer known only by its pid, never judged gone (in-process clients and tests).
    pub const fn pid_only(pid: u32) -> Self {
        Self {
            pid,
            connection: None,
            start_time: None,
        }
    }

    /// The process id.
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// The process's command line (`/proc/PID/cmdline`, arguments joined by spaces, at most
    /// [`shared::protocol::MAX_IDENTITY_LEN`] bytes), read now; empty when `/proc` is not of
    /// simdev's pid namespace, the pid is unknown, or the file cannot be read.
    pub fn command(&self) -> String {
        if self.pid == 0 || !proc_is_ours() {
            return String::new();
        }
        let Ok(raw) = std::fs::read(format!("/proc/{}/cmdline", self.pid)) else {
            return String::new();
        };
        let joined = raw
            .split(|&b| b == 0)
            .filter(|arg| !arg.is_empty())
            .map(String::from_utf8_lossy)
            .collect::<Vec<_>>()
            .join(" ");
        truncate_identity(joined)
    }

    /// Why the peer is gone, or `None` while it may still live.
    pub fn gone(&self) -> Option<String> {
        if let Some(connection) = &self.connection {
            // POLLHUP and POLLERR are reported whatever is asked for; a stream or seqpacket
            // socket whose peer closed its end has both directions shut: POLLHUP. (nix cannot
            // decode POLLRDHUP in `revents`, so it is not asked for.)
            let mut fds = [PollFd::new(connection.as_fd(), PollFlags::empty())];
            if poll(&mut fds, PollTimeout::ZERO).is_ok()
                && let Some(revents) = fds[0].revents()
                && revents.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)
            {
                return Some("its connection is closed".into());
            }
        }
        let start = self.start_time?;
        match proc_state(self.pid)? {
            ProcState::Absent => Some(format!("process {} has exited", self.pid)),
            ProcState::Zombie => Some(format!("process {} has exited (a zombie)", self.pid)),
            ProcState::Alive(now) if now != start => Some(format!(
                "process {} has exited (the pid now names another process)",
                self.pid
            )),
            ProcState::Alive(_) => None,
        }
    }
}

/// `s` cut to at most [`shared::protocol::MAX_IDENTITY_LEN`] bytes, at a char boundary.
pub fn truncate_identity(mut s: String) -> String {
    let mut end = s.len().min(shared::protocol::MAX_IDENTITY_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_peer_names_its_command_line_and_identities_are_bounded() {
        let (ours, _theirs) = pair();
        let peer = Peer::new(std::process::id(), ours);
        let own = std::env::args().collect::<Vec<_>>().join(" ");
        assert_eq!(peer.command(), truncate_identity(own));
        assert_eq!(Peer::pid_only(0).command(), "");
        let long = "é".repeat(200);
        let cut = truncate_identity(long);
        assert!(cut.len() <= shared::protocol::MAX_IDENTITY_LEN && cut.len() >= 254);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    fn pair() -> (OwnedFd, OwnedFd) {
        shared::fd_passing::seqpacket_pair().unwrap()
    }

    #[test]
    fn a_peer_lives_while_its_connection_is_open_and_its_process_runs() {
        let (ours, _theirs) = pair();
        let peer = Peer::new(std::process::id(), ours);
        assert!(
            peer.start_time.is_some(),
            "our own /proc/self/stat is readable"
        );
        assert_eq!(peer.gone(), None);
    }

    /// `peer.gone()` once it answers, within 5 s. A process another test forks (to exec) holds
    /// a copy of every fd until its exec, so a dropped end may close a moment later.
    fn gone_within(peer: &Peer) -> Option<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let gone = peer.gone();
            if gone.is_some() || std::time::Instant::now() >= deadline {
                return gone;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn a_hung_up_connection_is_gone() {
        let (ours, theirs) = pair();
        let peer = Peer::new(std::process::id(), ours);
        assert_eq!(peer.gone(), None);
        drop(theirs);
        assert_eq!(
            gone_within(&peer).as_deref(),
            Some("its connection is closed")
        );
    }

    #[test]
    fn a_reaped_or_reused_pid_is_gone_even_with_an_open_connection() {
        let (ours, _theirs) = pair();
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        let mut peer = Peer::new(pid, ours);
        child.wait().unwrap();
        // The start time may not have been read if `true` already exited; force a judgement.
        peer.start_time.get_or_insert(0);
        let why = peer.gone().expect("a reaped process is gone");
        assert!(why.contains(&format!("process {pid}")), "{why}");
        // Our own pid with another start time: a reused pid.
        let (ours, _theirs) = pair();
        let mut reused = Peer::new(std::process::id(), ours);
        reused.start_time = reused.start_time.map(|t| t + 1);
        assert!(reused.gone().unwrap().contains("another process"));
    }

    #[test]
    fn a_pid_only_peer_is_never_gone() {
        assert_eq!(Peer::pid_only(u32::MAX).gone(), None);
    }
}
