//! Messages with file descriptors attached (`SCM_RIGHTS`) on the control socket
//! (`SOCK_SEQPACKET`, [`crate::protocol`]): how a memory chunk's memfd, a semaphore window or
//! a notification eventfd reaches the client. This is the one send and the one receive that
//! the runtime's sim backend, simdev's server and the tests use.
//!
//! A received fd is returned as an [`OwnedFd`] (close-on-exec, closed on drop), so a message
//! whose fds nobody wants cannot leak them.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// The most fds one message can carry (the kernel's `SCM_MAX_FD`). A receive reserves room
/// for this many, so a peer that sends more fds than the protocol allows has them received
/// (and closed on drop) instead of left in flight.
pub const SCM_MAX_FD: usize = 253;

/// One received message.
#[derive(Debug)]
pub struct Received {
    /// Bytes of data received into the buffer.
    pub len: usize,
    /// The message was longer than the buffer; the rest is lost (`MSG_TRUNC`).
    pub truncated: bool,
    /// The control data did not fit (`MSG_CTRUNC`): some fds were closed by the kernel.
    pub control_truncated: bool,
    /// The fds that came with the message, in the sender's order, close-on-exec.
    pub fds: Vec<OwnedFd>,
}

impl Received {
    /// Whether this is the end of the connection: no data, no fds and nothing truncated.
    pub fn is_eof(&self) -> bool {
        self.len == 0 && !self.truncated && self.fds.is_empty()
    }
}

/// A connected pair of close-on-exec `SOCK_SEQPACKET` Unix sockets, the control socket's kind:
/// for a process talking to a child it starts, or a test standing in for both ends.
///
/// # Errors
/// `socketpair(2)`'s error (out of fds).
pub fn seqpacket_pair() -> nix::Result<(OwnedFd, OwnedFd)> {
    nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
}

/// Sends `data` as one message on `socket`, with `fds` attached as `SCM_RIGHTS` (no control
/// data when `fds` is empty). Never raises `SIGPIPE` (`MSG_NOSIGNAL`); a send interrupted by a
/// signal (`EINTR`, nothing sent) is retried. Returns the bytes sent.
///
/// # Errors
/// `sendmsg(2)`'s error (`EPIPE` when the peer closed, `EMSGSIZE` for an oversized message,
/// `EAGAIN` on a non-blocking socket that is full, ...).
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> nix::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
    loop {
        match sendmsg::<()>(
            socket.as_raw_fd(),
            &[IoSlice::new(data)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Err(Errno::EINTR) => {}
            other => return other,
        }
    }
}

/// Receives one message from `socket` into `buf`, with the fds it carries
/// (`MSG_CMSG_CLOEXEC` plus `flags`, e.g. `MSG_DONTWAIT`).
///
/// # Errors
/// `recvmsg(2)`'s error, `EINTR` included (the caller decides whether to retry).
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: MsgFlags,
) -> nix::Result<Received> {
    recv_with_fds_into(socket, buf, &mut control_buffer(), flags)
}

/// A control-data buffer for [`recv_with_fds_into`], with room for [`SCM_MAX_FD`] fds.
pub fn control_buffer() -> Vec<u8> {
    nix::cmsg_space!([RawFd; SCM_MAX_FD])
}

/// [`recv_with_fds`] with the caller's control-data buffer (from [`control_buffer`]), so a
/// receive loop allocates nothing for a message without fds.
///
/// # Errors
/// `recvmsg(2)`'s error, `EINTR` included (the caller decides whether to retry).
pub fn recv_with_fds_into(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    control: &mut [u8],
    flags: MsgFlags,
) -> nix::Result<Received> {
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(control),
        flags | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    // `cmsgs()` fails only on MSG_CTRUNC, which is reported below; the fds that did arrive are
    // still in the buffer, but the kernel has already closed the ones that did not fit.
    if let Ok(cmsgs) = msg.cmsgs() {
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these descriptors in this process's table
                // for this message (SCM_RIGHTS); nothing else owns them, so each is wrapped
                // exactly once and closed on drop.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
    }
    Ok(Received {
        len: msg.bytes,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
        control_truncated: msg.flags.contains(MsgFlags::MSG_CTRUNC),
        fds,
    })
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        seqpacket_pair().unwrap()
    }

    #[test]
    fn fds_round_trip_over_a_socketpair() {
        let (a, b) = pair();
        let mut one = tempfile::tempfile().unwrap();
        let mut two = tempfile::tempfile().unwrap();
        one.write_all(b"one").unwrap();
        two.write_all(b"two").unwrap();
        let sent = send_with_fds(a.as_fd(), b"hello", &[one.as_fd(), two.as_fd()]).unwrap();
        assert_eq!(sent, 5);
        let mut buf = [0u8; 16];
        let got = recv_with_fds(b.as_fd(), &mut buf, MsgFlags::empty()).unwrap();
        assert_eq!(&buf[..got.len], b"hello");
        assert!(!got.truncated && !got.control_truncated && !got.is_eof());
        assert_eq!(got.fds.len(), 2);
        for (fd, want) in got.fds.into_iter().zip(["one", "two"]) {
            assert_ne!(
                nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD).unwrap() & 1,
                0,
                "close-on-exec"
            );
            let mut file = File::from(fd);
            file.rewind().unwrap();
            let mut text = String::new();
            file.read_to_string(&mut text).unwrap();
            assert_eq!(text, want, "same file, same order");
        }
    }

    #[test]
    fn no_fds_no_control_data_and_eof_and_truncation_are_reported() {
        let (a, b) = pair();
        send_with_fds(a.as_fd(), b"0123456789", &[]).unwrap();
        let mut small = [0u8; 4];
        let got = recv_with_fds(b.as_fd(), &mut small, MsgFlags::empty()).unwrap();
        assert!(got.truncated, "MSG_TRUNC");
        assert!(got.fds.is_empty() && !got.is_eof());
        assert_eq!(
            recv_with_fds(b.as_fd(), &mut small, MsgFlags::MSG_DONTWAIT).unwrap_err(),
            Errno::EAGAIN,
            "the flags are passed on"
        );
        drop(a);
        let got = recv_with_fds(b.as_fd(), &mut small, MsgFlags::empty()).unwrap();
        assert!(got.is_eof());
        assert_eq!(
            send_with_fds(b.as_fd(), b"x", &[]).unwrap_err(),
            Errno::EPIPE,
            "EPIPE (MSG_NOSIGNAL: no SIGPIPE)"
        );
    }
}
