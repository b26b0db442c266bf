//! The control protocol over a real socket: handshake, fd passing, sealing, posted doorbells,
//! malformed messages, reclaim of a vanished client, and the DeviceLost notification on stop.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Conn, PATIENCE, Simdev};
use nix::sys::signal::Signal;
use shared::address_map::{SEM_WINDOW_SEMAPHORES, SEM_WINDOW_SIZE};
use shared::memory::SharedChunk;
use shared::notification::{NQ_HEADER_SIZE, NQ_TAIL_OFFSET, NotificationEntry, NotificationKind};
use shared::protocol::{ErrorKind, MAX_MSG_SIZE, MemLocation, Reply, Request};
use shared::udma::{RingId, m2m_copy_descriptors};

fn simdev() -> (tempfile::TempDir, Simdev) {
    let dir = tempfile::tempdir().unwrap();
    let simdev = Simdev::start(&dir.path().join("simdev.sock"), &["--hbm", "16M"]);
    (dir, simdev)
}

fn map(conn: &Conn, handle: u64) -> SharedChunk {
    let (reply, fds) = conn.call(&Request::MemMap { handle });
    let Reply::MemMapped { pa, size, .. } = reply else {
        panic!("MemMap answered {reply:?}");
    };
    assert_eq!(fds.len(), 1);
    SharedChunk::map_fd(&fds[0], pa, usize::try_from(size).unwrap(), true).unwrap()
}

fn alloc(conn: &Conn, location: MemLocation, size: u64) -> (u64, SharedChunk) {
    let reply = conn
        .call(&Request::MemAlloc {
            location,
            size,
            align: 0,
        })
        .0;
    let Reply::MemAllocated { handle, .. } = reply else {
        panic!("MemAlloc answered {reply:?}");
    };
    (handle, map(conn, handle))
}

fn claim(conn: &Conn, nc: u32) -> Vec<OwnedFd> {
    let (reply, fds) = conn.call(&Request::ClaimNc { nc });
    assert_eq!(reply, Reply::NcClaimed { nc });
    assert_eq!(fds.len(), 2);
    fds
}

#[test]
fn a_client_claims_maps_copies_and_rings_doorbells_over_the_socket() {
    let (_dir, simdev) = simdev();
    let conn = Conn::hello(&simdev.socket);
    let fds = claim(&conn, 0);
    let window = SharedChunk::map_fd(&fds[0], 0, SEM_WINDOW_SIZE, false).unwrap();
    assert!(
        SharedChunk::map_fd(&fds[0], 0, SEM_WINDOW_SIZE, true).is_err(),
        "the semaphore window is sealed against writable mappings"
    );

    // Posted doorbells get no reply; the next request's reply sees them.
    for _ in 0..3 {
        conn.send(&Request::SemaphoreIncrement {
            nc: 0,
            index: 2,
            value: 1,
        });
    }
    let (value, _) = conn.call(&Request::SemaphoreRead { nc: 0, index: 2 });
    assert_eq!(value, Reply::Value(3));
    let in_window = window
        .load_u32(SEM_WINDOW_SEMAPHORES as u64 + 8, Ordering::Acquire)
        .unwrap();
    assert_eq!(in_window, 3);

    // A copy through a DMA queue, with memory shared by memfd.
    let (_, src) = alloc(&conn, MemLocation::Hbm { nc: 0 }, 8192);
    let (_, dst) = alloc(&conn, MemLocation::Host, 8192);
    let (tx_ring, tx) = alloc(&conn, MemLocation::Host, 512);
    let (rx_ring, rx) = alloc(&conn, MemLocation::Host, 512);
    src.write(src.pa() + 100, b"through simdev").unwrap();
    let (t, r) =
        m2m_copy_descriptors(src.pa() + 100, dst.pa() + 7, 14, RingId::INITIAL, false).unwrap();
    tx.write_obj(tx.pa(), &t).unwrap();
    rx.write_obj(rx.pa(), &r).unwrap();
    let init = Request::DmaQueueInit {
        nc: 0,
        engine: 0,
        queue: 0,
        tx_ring,
        tx_desc_count: 32,
        rx_ring,
        rx_desc_count: 32,
    };
    assert_eq!(conn.call(&init).0, Reply::Ok);
    let start = Request::DmaQueueCopyStart {
        nc: 0,
        engine: 0,
        queue: 0,
        tx_desc_count: 1,
        rx_desc_count: 1,
    };
    assert_eq!(conn.call(&start).0, Reply::Ok);
    let mut out = [0u8; 14];
    dst.read(dst.pa() + 7, &mut out).unwrap();
    assert_eq!(&out, b"through simdev");

    let (counters, _) = conn.call(&Request::Counters { nc: 0 });
    let Reply::Counters(counters) = counters else {
        panic!("{counters:?}");
    };
    assert_eq!((counters.doorbells, counters.dma_descriptors), (3, 1));
}

#[test]
fn malformed_messages_are_refused_and_the_connection_goes_on() {
    let (_dir, simdev) = simdev();
    let conn = Conn::hello(&simdev.socket);
    conn.send_raw(&[0xFF; 9], &[]);
    let (reply, _) = conn.recv().unwrap();
    assert!(
        matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::BadMessage),
        "{reply:?}"
    );
    conn.send_raw(&vec![1u8; MAX_MSG_SIZE + 100], &[]);
    let (reply, _) = conn.recv().unwrap();
    assert!(
        matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::BadMessage && e.message.contains("longer")),
        "{reply:?}"
    );
    // An fd sent to simdev is closed there; the request itself is still answered.
    let stray = tempfile::tempfile().unwrap();
    let mut buf = vec![0u8; MAX_MSG_SIZE];
    let len = shared::protocol::encode(&Request::DeviceInfo, &mut buf).unwrap();
    conn.send_raw(&buf[..len], &[stray.as_fd()]);
    let (reply, fds) = conn.recv().unwrap();
    assert!(matches!(reply, Reply::DeviceInfo(_)), "{reply:?}");
    assert!(fds.is_empty());
}

#[test]
fn the_first_request_must_be_hello() {
    let (_dir, simdev) = simdev();
    let conn = Conn::connect(&simdev.socket);
    let (reply, _) = conn.call(&Request::ClaimNc { nc: 0 });
    assert!(
        matches!(&reply, Reply::Error(e) if e.kind == ErrorKind::Handshake),
        "{reply:?}"
    );
    assert!(conn.recv().is_none(), "simdev closed the connection");
}

#[test]
fn a_vanished_client_is_reclaimed_and_simdev_serves_on() {
    let (_dir, simdev) = simdev();
    let first = Conn::hello(&simdev.socket);
    claim(&first, 1);
    alloc(&first, MemLocation::Hbm { nc: 1 }, 16 << 20);
    let second = Conn::hello(&simdev.socket);
    let (busy, _) = second.call(&Request::ClaimNc { nc: 1 });
    assert!(
        matches!(&busy, Reply::Error(e) if e.kind == ErrorKind::NcBusy),
        "{busy:?}"
    );
    drop(first);
    // The reclaim runs on the first connection's thread once it sees EOF.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (reply, _) = second.call(&Request::ClaimNc { nc: 1 });
        if reply == (Reply::NcClaimed { nc: 1 }) {
            break;
        }
        assert!(Instant::now() < deadline, "NC 1 never came back: {reply:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (whole, _) = second.call(&Request::MemAlloc {
        location: MemLocation::Hbm { nc: 1 },
        size: 16 << 20,
        align: 0,
    });
    assert!(matches!(whole, Reply::MemAllocated { .. }), "{whole:?}");
}

#[test]
fn sigterm_posts_device_lost_and_closes_connections() {
    let (_dir, mut simdev) = simdev();
    let conn = Conn::hello(&simdev.socket);
    let fds = claim(&conn, 0);
    let (reply, _) = conn.call(&Request::NotificationInit {
        nc: 0,
        nq_type: 1,
        entries: 4,
    });
    let Reply::NotificationQueue { handle, .. } = reply else {
        panic!("{reply:?}");
    };
    let nq = map(&conn, handle);
    simdev.signal(Signal::SIGTERM);
    assert!(conn.recv().is_none(), "the connection was shut down");
    let (status, stderr) = simdev.wait();
    assert!(status.success(), "{stderr}");
    let tail = nq
        .load_u32(nq.pa() + NQ_TAIL_OFFSET as u64, Ordering::Acquire)
        .unwrap();
    assert_eq!(tail, 1);
    let entry: NotificationEntry = nq.read_obj(nq.pa() + NQ_HEADER_SIZE as u64).unwrap();
    assert_eq!(entry.kind, NotificationKind::DeviceLost as u16);
    assert_eq!(entry.phase, 1);
    let mut count = [0u8; 8];
    nix::unistd::read(&fds[1], &mut count).unwrap();
    assert_eq!(u64::from_ne_bytes(count), 1);
    assert!(stderr.contains("notifications 1"), "{stderr}");
}
