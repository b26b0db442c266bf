//! Notifications, in-process: phases, overflows, drops, re-initialisation and DeviceLost.

use std::sync::atomic::Ordering;

use shared::notification::{NQ_HEAD_OFFSET, NotificationKind, error_flags};
use shared::protocol::{ErrorKind, Request};

use crate::device::test_utils::*;

#[test]
fn notifications_alternate_phase_per_pass_and_overflow_when_the_head_stays() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let nq = a.nq(0, 2);
    let abort_one = |queue: u32| {
        let mut q = Queue::new(&a, 0, 0, queue, 32);
        q.push(0x1000, 0x2000, 4);
        q.start(&a, 1);
    };
    abort_one(0);
    abort_one(1);
    abort_one(2);
    let counters = a.counters(0);
    assert_eq!((counters.notifications, counters.nq_overflows), (2, 1));
    let posted = entries(&nq, 2);
    assert_eq!(
        posted
            .iter()
            .map(|e| (e.source, e.phase))
            .collect::<Vec<_>>(),
        [(0, 1), (1, 1)],
        "the third abort was dropped, not written over the first"
    );
    assert!(posted[0].device_ts_ns <= posted[1].device_ts_ns);
    nq.view
        .store_u32(nq.pa + NQ_HEAD_OFFSET as u64, 2, Ordering::Release)
        .unwrap();
    abort_one(3);
    abort_one(4);
    let posted = entries(&nq, 2);
    assert_eq!(posted.len(), 4);
    assert_eq!(
        posted[2..]
            .iter()
            .map(|e| (e.source, e.phase))
            .collect::<Vec<_>>(),
        [(3, 2), (4, 2)],
        "entries 2 and 3 (pass 1) carry phase 2"
    );
}

#[test]
fn an_nc_without_a_notification_queue_counts_dropped_notifications() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    q.push(0x1000, 0x2000, 4);
    q.start(&a, 1);
    let counters = a.counters(0);
    assert_eq!((counters.dma_aborts, counters.nq_overflows), (1, 1));
}

#[test]
fn reinitialising_the_notification_queue_frees_the_old_one() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let first = a.nq(0, 4);
    let second = a.nq(0, 8);
    assert_ne!(first.handle, second.handle);
    assert_eq!(
        a.refused(Request::MemMap {
            handle: first.handle
        })
        .kind,
        ErrorKind::BadHandle
    );
    assert_eq!(
        second.size,
        4 * KIB,
        "128 + 8 * 32 bytes rounded up to 4 KiB"
    );
}

#[test]
fn device_lost_is_posted_to_every_claimed_nc() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let fds = a.claim(1);
    let nq = a.nq(1, 4);
    dev.device_lost();
    let posted = entries(&nq, 4);
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].kind, NotificationKind::DeviceLost as u16);
    assert_eq!(posted[0].error_flags, error_flags::DEVICE_LOST);
    let mut count = [0u8; 8];
    nix::unistd::read(&fds[1], &mut count).unwrap();
    assert_eq!(u64::from_ne_bytes(count), 1);
}

/// Inside a [`DeferredSignals`](crate::device::DeferredSignals) scope (a connection thread
/// serving a batch of messages) the notification eventfd is written once per NC, at a flush or
/// the scope's end, however many notifications were posted; the entries themselves are in the
/// NQ at once. Outside a scope every notification writes it.
#[test]
fn deferred_signals_write_each_ncs_eventfd_once_per_batch() {
    use std::os::fd::AsFd;

    let count = |fd: &std::os::fd::OwnedFd| -> u64 {
        let mut buf = [0u8; 8];
        match nix::unistd::read(fd.as_fd(), &mut buf) {
            Ok(_) => u64::from_ne_bytes(buf),
            Err(nix::errno::Errno::EAGAIN) => 0,
            Err(e) => panic!("reading the notification eventfd: {e}"),
        }
    };
    let dev = device();
    let a = Client::new(&dev, 10);
    let fds = [a.claim(0), a.claim(1)];
    let nqs = [a.nq(0, 16), a.nq(1, 16)];
    let abort_one = |nc: u32, queue: u32| {
        let mut q = Queue::new(&a, nc, 0, queue, 32);
        q.push(0x1000, 0x2000, 4);
        q.start(&a, 1);
    };
    let efd = |nc: usize| &fds[nc][1];
    {
        let scope = crate::device::DeferredSignals::begin();
        for queue in 0..3 {
            abort_one(0, queue);
        }
        abort_one(1, 0);
        abort_one(1, 1);
        assert_eq!(
            entries(&nqs[0], 16).len(),
            3,
            "the entries are posted at once"
        );
        assert_eq!(entries(&nqs[1], 16).len(), 2);
        assert_eq!((count(efd(0)), count(efd(1))), (0, 0), "no write yet");
        scope.flush();
        assert_eq!((count(efd(0)), count(efd(1))), (1, 1), "one write per NC");
        abort_one(0, 3);
        assert_eq!(count(efd(0)), 0);
    }
    assert_eq!(count(efd(0)), 1, "the scope's end wrote the last one");
    abort_one(0, 4);
    abort_one(0, 5);
    assert_eq!(
        count(efd(0)),
        2,
        "outside a scope every notification writes"
    );
}
