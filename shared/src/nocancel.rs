//! The hot path's system calls without glibc's cancellation bookkeeping.
//!
//! In a multi-threaded process glibc's `read`, `write`, `sendto` and `epoll_wait` are
//! cancellation points: each call switches the thread to asynchronous cancellation before the
//! system call and back after it, two locked compare-and-swaps on the thread's cancel word
//! (`__pthread_enable_asynccancel` / `__pthread_disable_asynccancel`). A sync execution makes
//! six such calls (the doorbell, `has_work_efd` and `mark_comp_efd` on both sides, the worker's
//! wait), and a locked instruction costs several times a plain store. Nothing here uses
//! `pthread_cancel`, so the same system calls are made through `syscall(2)`, which is not a
//! cancellation point. Each function is the system call and its errno, nothing more (no
//! retry on `EINTR`: callers keep their own policy).

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use nix::libc;
use nix::sys::epoll::EpollEvent;

/// The kernel's signal set, in bytes (64 signals), for `epoll_pwait`'s `sigsetsize`.
const KERNEL_SIGSET_BYTES: libc::size_t = 8;

/// The result of a `syscall(2)` returning a count or -1 with errno.
fn count(ret: libc::c_long) -> nix::Result<usize> {
    usize::try_from(ret).map_err(|_| Errno::last())
}

/// `write(fd, &value, 8)` on an eventfd: adds `value` to its counter.
///
/// # Errors
/// `write(2)`'s errno (`EAGAIN` on a full non-blocking eventfd).
pub fn eventfd_write(fd: BorrowedFd<'_>, value: u64) -> nix::Result<()> {
    let bytes = value.to_ne_bytes();
    // SAFETY: `fd` is a live descriptor for the call (borrowed); the buffer is 8 readable
    // bytes that outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_write,
            libc::c_long::from(fd.as_raw_fd()),
            bytes.as_ptr(),
            bytes.len(),
        )
    };
    match count(ret)? {
        8 => Ok(()),
        _ => Err(Errno::EIO),
    }
}

/// `read(fd, &value, 8)` on an eventfd: its counter (or 1, for an `EFD_SEMAPHORE` one), reset
/// (or decremented).
///
/// # Errors
/// `read(2)`'s errno (`EAGAIN` on a non-blocking eventfd at zero).
pub fn eventfd_read(fd: BorrowedFd<'_>) -> nix::Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: `fd` is a live descriptor for the call (borrowed); the buffer is 8 writable
    // bytes that outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_read,
            libc::c_long::from(fd.as_raw_fd()),
            bytes.as_mut_ptr(),
            bytes.len(),
        )
    };
    match count(ret)? {
        8 => Ok(u64::from_ne_bytes(bytes)),
        _ => Err(Errno::EIO),
    }
}

/// `epoll_wait(epfd, events, events.len(), timeout_ms)`: the number of events filled in at
/// the front of `events`. Made as `epoll_pwait` with no signal mask, as glibc makes it: some
/// architectures (aarch64, riscv64) have no `epoll_wait` system call.
///
/// # Errors
/// `epoll_wait(2)`'s errno (`EINTR` when a signal interrupted the wait).
pub fn epoll_wait(
    epfd: BorrowedFd<'_>,
    events: &mut [EpollEvent],
    timeout_ms: i32,
) -> nix::Result<usize> {
    let max = libc::c_int::try_from(events.len()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `epfd` is a live descriptor for the call (borrowed). `EpollEvent` is
    // `#[repr(transparent)]` over `libc::epoll_event` (nix's own `Epoll::wait` passes its
    // slice the same way), and the kernel writes at most `max` of them, all inside `events`.
    // No signal mask (null): the kernel does not look at its size, passed as the kernel's
    // sigset size all the same.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_epoll_pwait,
            libc::c_long::from(epfd.as_raw_fd()),
            events.as_mut_ptr().cast::<libc::epoll_event>(),
            libc::c_long::from(max),
            libc::c_long::from(timeout_ms),
            std::ptr::null::<libc::sigset_t>(),
            KERNEL_SIGSET_BYTES,
        )
    };
    count(ret).map(|n| n.min(events.len()))
}

/// `send(socket, data, MSG_NOSIGNAL)`: one message, no fds (a doorbell).
///
/// # Errors
/// `sendto(2)`'s errno (`EPIPE` when the peer is gone, `EINTR`).
pub fn send(socket: BorrowedFd<'_>, data: &[u8]) -> nix::Result<usize> {
    // SAFETY: `socket` is a live descriptor for the call (borrowed); `data` is readable for
    // its length for the call; no address is passed (a connected socket).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_sendto,
            libc::c_long::from(socket.as_raw_fd()),
            data.as_ptr(),
            data.len(),
            libc::c_long::from(libc::MSG_NOSIGNAL),
            std::ptr::null::<libc::sockaddr>(),
            0 as libc::socklen_t,
        )
    };
    count(ret)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixDatagram;

    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollFlags};
    use nix::sys::eventfd::{EfdFlags, EventFd};

    use super::*;

    #[test]
    fn eventfd_counts_and_errors_round_trip() {
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        assert_eq!(eventfd_read(efd.as_fd()), Err(Errno::EAGAIN), "empty");
        eventfd_write(efd.as_fd(), 3).unwrap();
        eventfd_write(efd.as_fd(), 4).unwrap();
        assert_eq!(eventfd_read(efd.as_fd()), Ok(7), "a counter: drained whole");
        let sem =
            EventFd::from_value_and_flags(2, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_SEMAPHORE)
                .unwrap();
        assert_eq!(
            eventfd_read(sem.as_fd()),
            Ok(1),
            "a semaphore: one at a time"
        );
        assert_eq!(eventfd_read(sem.as_fd()), Ok(1));
        assert_eq!(eventfd_read(sem.as_fd()), Err(Errno::EAGAIN));
        eventfd_write(efd.as_fd(), u64::MAX - 1).unwrap();
        assert_eq!(eventfd_write(efd.as_fd(), 1), Err(Errno::EAGAIN), "full");
        assert_eq!(eventfd_write(efd.as_fd(), u64::MAX), Err(Errno::EINVAL));
    }

    #[test]
    fn epoll_wait_fills_the_ready_events_and_times_out_empty() {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).unwrap();
        let a = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        let b = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap();
        epoll
            .add(&a, EpollEvent::new(EpollFlags::EPOLLIN, 1))
            .unwrap();
        epoll
            .add(&b, EpollEvent::new(EpollFlags::EPOLLIN, 2))
            .unwrap();
        let mut events = [EpollEvent::empty(); 4];
        assert_eq!(epoll_wait(epoll.0.as_fd(), &mut events, 0), Ok(0));
        eventfd_write(b.as_fd(), 1).unwrap();
        assert_eq!(epoll_wait(epoll.0.as_fd(), &mut events, 1000), Ok(1));
        assert_eq!(events[0].data(), 2);
        assert!(events[0].events().contains(EpollFlags::EPOLLIN));
        eventfd_write(a.as_fd(), 1).unwrap();
        let mut one = [EpollEvent::empty(); 1];
        assert_eq!(
            epoll_wait(epoll.0.as_fd(), &mut one, 1000),
            Ok(1),
            "no more than asked"
        );
        let bad = EventFd::new().unwrap();
        assert_eq!(
            epoll_wait(bad.as_fd(), &mut events, 0),
            Err(Errno::EINVAL),
            "not an epoll fd"
        );
    }

    #[test]
    fn send_delivers_one_message_and_reports_a_gone_peer() {
        let (a, b) = UnixDatagram::pair().unwrap();
        assert_eq!(send(a.as_fd(), b"\x0a\x00\xfa\x01"), Ok(4));
        let mut buf = [0u8; 16];
        assert_eq!(b.recv(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"\x0a\x00\xfa\x01");
        drop(b);
        assert!(send(a.as_fd(), b"x").is_err(), "the peer is gone");
    }
}
