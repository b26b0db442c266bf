//! The in-process link: the handshake, fds handed over, posted requests, reclaim at drop.

use std::sync::Arc;

use shared::protocol::{ErrorKind, MemLocation, PROTOCOL_VERSION};

use super::SimDevice;
use crate::backend::{Device, DeviceError};
use crate::test_support::emulated_device;

#[test]
fn the_in_process_link_says_hello_hands_over_fds_and_the_device_reclaims_at_drop() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let sim = SimDevice::in_process(device.clone()).unwrap();
    assert_eq!(sim.info(), device.info(), "the Hello reply's device info");
    assert_eq!(sim.socket().to_str(), Some("in-process"));
    assert!(!sim.is_private());
    assert_eq!(device.stats().clients, 1);
    let claimed = sim.claim_nc(0).unwrap();
    assert!(claimed.semaphore_window.is_some(), "the window's memfd");
    assert!(claimed.notification_fd.is_some(), "the NC's eventfd");
    let a = sim.mem_alloc(MemLocation::Host, 4096, 0).unwrap();
    let chunk = sim.mem_map(&a).unwrap();
    chunk.write(a.pa, b"abcd").unwrap();
    let again = sim.mem_map(&a).unwrap();
    let mut back = [0u8; 4];
    again.read(a.pa, &mut back).unwrap();
    assert_eq!(&back, b"abcd", "both mappings are the device's chunk");
    let stats = device.stats();
    assert_eq!((stats.claimed_ncs, stats.chunks), (1, 1));
    drop(sim);
    let stats = device.stats();
    assert_eq!(
        (stats.clients, stats.claimed_ncs, stats.chunks),
        (0, 0, 0),
        "dropping the link ends the connection: the device reclaims the client"
    );
}

#[test]
fn the_in_process_link_refuses_another_protocol_version() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let e = SimDevice::in_process_with_version(device.clone(), PROTOCOL_VERSION + 1).unwrap_err();
    match e {
        DeviceError::Remote { op, source } => {
            assert_eq!(op, "Hello");
            assert_eq!(source.kind, ErrorKind::Handshake, "{source}");
        }
        other => panic!("expected a handshake refusal, got {other:?}"),
    }
    assert_eq!(device.stats().clients, 0, "the refused connection is gone");
}

#[test]
fn a_posted_semaphore_increment_reaches_the_device_before_the_next_request() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let sim = SimDevice::in_process(device.clone()).unwrap();
    sim.claim_nc(1).unwrap();
    sim.semaphore_increment(1, 5, 3).unwrap();
    sim.semaphore_increment(1, 5, 4).unwrap();
    assert_eq!(sim.semaphore_read(1, 5).unwrap(), 7);
    let counters = device.counters(1).unwrap();
    assert_eq!((counters.doorbells, counters.posted_errors), (2, 0));
    // A posted request the device refuses (NC 0 is not this client's) gets no reply: it is
    // counted, and the next request is answered normally.
    sim.semaphore_increment(0, 5, 1).unwrap();
    assert_eq!(device.counters(0).unwrap().posted_errors, 1);
    assert_eq!(sim.semaphore_read(1, 5).unwrap(), 7);
}

#[test]
fn two_in_process_clients_are_separate_connections() {
    let device = emulated_device(shared::Arch::Trn1, 2);
    let a = SimDevice::in_process(device.clone()).unwrap();
    let b =
        SimDevice::in_process(Arc::clone(&device) as Arc<dyn shared::protocol::Handler>).unwrap();
    a.claim_nc(0).unwrap();
    let e = b.claim_nc(0).unwrap_err();
    assert!(
        matches!(e, DeviceError::Remote { .. }),
        "an NC owned by another client: {e:?}"
    );
    drop(a);
    b.claim_nc(0).unwrap();
}

/// Posted requests are encoded into a `POSTED_MSG_SIZE` buffer: the largest doorbell fits.
#[test]
fn the_largest_posted_request_fits_the_posted_message_buffer() {
    let doorbell = shared::protocol::Request::SemaphoreIncrement {
        nc: u32::MAX,
        index: u32::MAX,
        value: u32::MAX,
    };
    assert!(doorbell.is_posted());
    let mut buf = [0u8; super::POSTED_MSG_SIZE];
    let n = shared::protocol::encode(&doorbell, &mut buf).unwrap();
    assert!(n <= super::POSTED_MSG_SIZE);
}

/// A peer playing simdev on a socket of its own: it answers Hello with `info` (and Identify),
/// then hands the
/// test every request it receives and sends the replies the test gives it, so the test decides
/// when a reply comes (after its request stopped waiting, say).
struct ScriptedPeer {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    requests: std::sync::mpsc::Receiver<shared::protocol::Request>,
    replies: std::sync::mpsc::Sender<shared::protocol::Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ScriptedPeer {
    fn start(info: shared::protocol::DeviceInfo) -> Self {
        use nix::sys::socket::{
            AddressFamily, Backlog, MsgFlags, SockFlag, SockType, UnixAddr, accept, bind, listen,
            socket,
        };
        use shared::protocol::{MAX_MSG_SIZE, Reply, Request, decode, encode};
        use std::os::fd::{AsFd, AsRawFd};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("simdev.sock");
        let listener = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        listen(&listener, Backlog::new(1).unwrap()).unwrap();
        let (to_test, requests) = std::sync::mpsc::channel();
        let (replies, from_test) = std::sync::mpsc::channel::<Reply>();
        let thread = std::thread::spawn(move || {
            let conn = accept(&listener).unwrap();
            let mut buf = vec![0u8; MAX_MSG_SIZE];
            let mut out = vec![0u8; MAX_MSG_SIZE];
            let send = |out: &mut [u8], reply: &Reply| {
                let n = encode(reply, out).unwrap();
                shared::fd_passing::send_with_fds(conn.as_fd(), &out[..n], &[]).unwrap();
            };
            loop {
                let received = shared::fd_passing::recv_with_fds(
                    conn.as_fd(),
                    &mut buf,
                    MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .unwrap();
                if received.len == 0 {
                    return;
                }
                let request: Request = decode(&buf[..received.len]).unwrap();
                match request {
                    Request::Hello { version } => {
                        let device = info.clone();
                        send(&mut out, &Reply::Hello { version, device });
                        continue;
                    }
                    Request::Identify { .. } => {
                        send(&mut out, &Reply::Ok);
                        continue;
                    }
                    _ => {}
                }
                if to_test.send(request).is_err() {
                    return;
                }
                // The replies the test has given so far, in order.
                while let Ok(reply) = from_test.try_recv() {
                    send(&mut out, &reply);
                }
            }
        });
        Self {
            _dir: dir,
            socket: path,
            requests,
            replies,
            thread: Some(thread),
        }
    }

    /// The next request the peer received.
    fn next(&self) -> shared::protocol::Request {
        self.requests
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the peer receives a request")
    }
}

impl Drop for ScriptedPeer {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take()
            && !std::thread::panicking()
        {
            t.join().unwrap();
        }
    }
}

/// The replies simdev owes to requests that did not wait are read, in order, before a later
/// request's own, and settled: a chunk allocated after its MEM_ALLOC stopped waiting is freed
/// (its free's reply owed in turn, *after* the request that read the allocation), a MEM_FREE
/// never waits. A request reading one reply too few or too many would take another's answer:
/// the semaphore values below would be off.
#[test]
fn late_and_unwaited_replies_are_settled_in_order_before_each_requests_own() {
    use shared::protocol::{Reply, Request};
    use std::time::{Duration, Instant};
    let info = emulated_device(shared::Arch::Trn1, 1).info().clone();
    let peer = ScriptedPeer::start(info);
    let dev = SimDevice::connect_with_timeout(&peer.socket, Duration::from_secs(60)).unwrap();
    // The peer holds its replies until it has the test's: this allocation waits in vain.
    let late = dev.mem_alloc_by(
        MemLocation::Host,
        4096,
        0,
        Instant::now() + Duration::from_millis(50),
    );
    assert!(
        matches!(late, Err(DeviceError::Late { op: "MemAlloc", .. })),
        "{late:?}"
    );
    assert_eq!(late.unwrap_err().status(), shared::NrtStatus::Timeout);
    assert!(matches!(peer.next(), Request::MemAlloc { size: 4096, .. }));
    // A free returns without its reply.
    dev.mem_free(crate::backend::MemHandle(3)).unwrap();
    assert_eq!(peer.next(), Request::MemFree { handle: 3 });
    // Now simdev answers: the allocation, the free, then the read sent next.
    peer.replies
        .send(Reply::MemAllocated {
            handle: 7,
            pa: 0x1000,
            size: 4096,
        })
        .unwrap();
    peer.replies.send(Reply::Ok).unwrap();
    peer.replies.send(Reply::Value(42)).unwrap();
    assert_eq!(dev.semaphore_read(0, 1).unwrap(), 42);
    assert_eq!(peer.next(), Request::SemaphoreRead { nc: 0, index: 1 });
    // Settling the late allocation freed the chunk nobody holds.
    assert_eq!(peer.next(), Request::MemFree { handle: 7 });
    // That free's Ok comes before the next read's value.
    peer.replies.send(Reply::Ok).unwrap();
    peer.replies.send(Reply::Value(43)).unwrap();
    assert_eq!(dev.semaphore_read(0, 2).unwrap(), 43);
    assert_eq!(peer.next(), Request::SemaphoreRead { nc: 0, index: 2 });
    drop(dev);
}

/// `flush` returns only after a waited round trip that simdev answers after every request
/// the connection sent before it, an unwaited MEM_FREE's included.
#[test]
fn a_flush_is_a_round_trip_behind_the_unwaited_frees() {
    use shared::protocol::{DeviceStats, Reply, Request};
    use std::time::Duration;
    let info = emulated_device(shared::Arch::Trn1, 1).info().clone();
    let peer = ScriptedPeer::start(info);
    let dev = SimDevice::connect_with_timeout(&peer.socket, Duration::from_secs(60)).unwrap();
    dev.mem_free(crate::backend::MemHandle(3)).unwrap();
    assert_eq!(peer.next(), Request::MemFree { handle: 3 });
    // The peer answers the free and the round trip when it receives the next request.
    peer.replies.send(Reply::Ok).unwrap();
    peer.replies
        .send(Reply::DeviceStats(DeviceStats::default()))
        .unwrap();
    Device::flush(&dev).unwrap();
    assert_eq!(
        peer.next(),
        Request::DeviceStats,
        "the round trip, after the free"
    );
    drop(dev);
}
