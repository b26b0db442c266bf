//! Request dispatch, in-process: allocation, registers, the handshake and every refusal kind.

use shared::address_map::REG_WINDOW_BASE;
use shared::protocol::{
    ErrorKind, MAX_MSG_SIZE, MemLocation, NcCounters, PROTOCOL_VERSION, Reply, Request,
};

use crate::device::test_utils::*;
use crate::server::{Response, Session, check_peer};

#[test]
fn allocation_rounds_aligns_and_runs_out_per_region() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let small = a.call(Request::MemAlloc {
        location: MemLocation::Host,
        size: 1,
        align: 0,
    });
    assert!(matches!(small, Reply::MemAllocated { size: 4096, .. }));
    let Reply::MemAllocated { pa, .. } = a.call(Request::MemAlloc {
        location: MemLocation::Hbm { nc: 0 },
        size: 4 * KIB,
        align: 64 * KIB,
    }) else {
        panic!("aligned allocation failed");
    };
    assert_eq!(pa % (64 * KIB), 0);
    assert!(dev.info().hbm_bases[0] <= pa);
    let whole = a.alloc(MemLocation::Hbm { nc: 0 }, 15 * MIB);
    let oom = a.refused(Request::MemAlloc {
        location: MemLocation::Hbm { nc: 0 },
        size: MIB,
        align: 0,
    });
    assert_eq!(oom.kind, ErrorKind::OutOfMemory);
    assert!(oom.message.contains("1048576 bytes"), "{}", oom.message);
    assert!(oom.message.contains("HBM of NC 0"), "{}", oom.message);
    a.ok(Request::MemFree {
        handle: whole.handle,
    });
    let again = a.alloc(MemLocation::Hbm { nc: 0 }, MIB);
    assert_eq!(again.pa, whole.pa, "first fit reuses the freed range");
}

#[test]
fn handles_belong_to_the_client_that_allocated_them() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    let buf = a.alloc(MemLocation::Host, 4 * KIB);
    assert_ne!(buf.handle, 0);
    for request in [
        Request::MemMap { handle: buf.handle },
        Request::MemFree { handle: buf.handle },
        Request::MemMap { handle: 0 },
        Request::MemFree { handle: 999 },
    ] {
        assert_eq!(b.refused(request).kind, ErrorKind::BadHandle);
    }
    let (reply, fds) = dev.handle(a.id, Request::MemMap { handle: buf.handle });
    assert_eq!(
        reply,
        Reply::MemMapped {
            handle: buf.handle,
            pa: buf.pa,
            size: buf.size
        }
    );
    assert_eq!(fds.len(), 1);
    a.ok(Request::MemFree { handle: buf.handle });
    assert_eq!(
        a.refused(Request::MemFree { handle: buf.handle }).kind,
        ErrorKind::BadHandle
    );
}

#[test]
fn semaphore_messages_and_posted_doorbells() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let (reply, fds) = dev.handle(
        a.id,
        Request::SemaphoreIncrement {
            nc: 0,
            index: 255,
            value: 3,
        },
    );
    assert_eq!((reply, fds.len()), (Reply::Ok, 0));
    a.ok(Request::SemaphoreDecrement {
        nc: 0,
        index: 255,
        value: 5,
    });
    assert_eq!(a.semaphore(0, 255), u32::MAX - 1, "3 - 5 = -2 as i32");
    let posted_error = a.call(Request::SemaphoreIncrement {
        nc: 1,
        index: 0,
        value: 1,
    });
    assert!(matches!(posted_error, Reply::Error(_)));
    assert_eq!(a.counters(1).posted_errors, 1);
    assert_eq!(a.counters(1).doorbells, 1);
    assert_eq!(a.counters(0).doorbells, 1);
    assert_eq!(a.counters(0).posted_errors, 0);
}

#[test]
fn the_handshake_gives_device_info() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let Reply::Hello { version, device } = a.call(Request::Hello {
        version: PROTOCOL_VERSION,
    }) else {
        panic!("no hello");
    };
    assert_eq!(version, PROTOCOL_VERSION);
    assert_eq!(device.nc_count, 2);
    assert_eq!(device.hbm_bases, [0x10_0000_0000, 0x10_4000_0000]);
    assert_eq!(device.host_base, 0x1000_0000_0000);
    assert_eq!(device.reg_base, REG_WINDOW_BASE);
    assert_eq!(
        (device.semaphores_per_nc, device.dma_engines_per_nc),
        (256, 16)
    );
    assert!(
        device.description.starts_with("simdev "),
        "{}",
        device.description
    );
    assert_eq!(a.call(Request::DeviceInfo), Reply::DeviceInfo(device));
}

/// Every refusal kind, with the request that earns it.
#[test]
fn bad_requests_get_the_documented_error_kinds() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    b.claim(1);
    let ring = a.alloc(MemLocation::Host, 4 * KIB);
    let big_ring = a.alloc(MemLocation::Host, 16 * KIB);
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    let q = Queue::new(&a, 0, 0, 0, 32);
    let init = |tx_ring, tx_desc_count, rx_ring, rx_desc_count| Request::DmaQueueInit {
        nc: 0,
        engine: 1,
        queue: 1,
        tx_ring,
        tx_desc_count,
        rx_ring,
        rx_desc_count,
    };
    let cases: Vec<(Request, ErrorKind, &str)> = vec![
        (
            Request::ClaimNc { nc: 2 },
            ErrorKind::OutOfRange,
            "NC 2 does not exist",
        ),
        (Request::Counters { nc: 9 }, ErrorKind::OutOfRange, "NC 9"),
        (
            Request::SemaphoreRead { nc: 0, index: 256 },
            ErrorKind::OutOfRange,
            "semaphore index 256",
        ),
        (
            Request::EventGet { nc: 0, index: 256 },
            ErrorKind::OutOfRange,
            "event index 256",
        ),
        (
            Request::DmaQueueRelease {
                nc: 0,
                engine: 16,
                queue: 0,
            },
            ErrorKind::OutOfRange,
            "engine 16",
        ),
        (
            q.start_request(33, 1),
            ErrorKind::OutOfRange,
            "ring overrun",
        ),
        (Request::ClaimNc { nc: 1 }, ErrorKind::NcBusy, "NC 1"),
        (
            Request::SemaphoreWrite {
                nc: 1,
                index: 0,
                value: 1,
            },
            ErrorKind::NotOwner,
            "NC 1",
        ),
        (
            Request::MemAlloc {
                location: MemLocation::Hbm { nc: 1 },
                size: 4096,
                align: 0,
            },
            ErrorKind::NotOwner,
            "NC 1",
        ),
        (
            Request::NotificationInit {
                nc: 1,
                nq_type: 1,
                entries: 4,
            },
            ErrorKind::NotOwner,
            "NC 1",
        ),
        (Request::NcReset { nc: 1 }, ErrorKind::NotOwner, "NC 1"),
        (
            Request::MemAlloc {
                location: MemLocation::Host,
                size: 1 << 40,
                align: 0,
            },
            ErrorKind::OutOfMemory,
            "host-visible memory",
        ),
        (
            Request::MemMap { handle: 12345 },
            ErrorKind::BadHandle,
            "12345",
        ),
        (
            Request::MemFree {
                handle: theirs.handle,
            },
            ErrorKind::BadHandle,
            "not a chunk of this client",
        ),
        (init(77, 32, ring.handle, 32), ErrorKind::BadHandle, "77"),
        (
            init(ring.handle, 32, theirs.handle, 32),
            ErrorKind::BadHandle,
            "",
        ),
        (
            init(ring.handle, 31, ring.handle, 32),
            ErrorKind::BadRing,
            "32 <= n <= 2^24-16 and n % 16 == 0",
        ),
        (
            init(ring.handle, 32, ring.handle, 40),
            ErrorKind::BadRing,
            "40",
        ),
        (
            init(big_ring.handle, 1 << 24, ring.handle, 32),
            ErrorKind::BadRing,
            "",
        ),
        (
            init(big_ring.handle, 512, ring.handle, 512),
            ErrorKind::BadRing,
            "needs 8192 bytes, its chunk has 4096",
        ),
        (
            Request::DmaQueueCopyStart {
                nc: 0,
                engine: 9,
                queue: 9,
                tx_desc_count: 1,
                rx_desc_count: 1,
            },
            ErrorKind::QueueStopped,
            "not initialised",
        ),
        (
            Request::NotificationInit {
                nc: 0,
                nq_type: 0,
                entries: 4,
            },
            ErrorKind::Unsupported,
            "NQ type 0",
        ),
        (
            Request::MemAlloc {
                location: MemLocation::Host,
                size: 0,
                align: 0,
            },
            ErrorKind::InvalidArgument,
            "size 0",
        ),
        (
            Request::MemAlloc {
                location: MemLocation::Host,
                size: 4096,
                align: 3,
            },
            ErrorKind::InvalidArgument,
            "power of two",
        ),
        (q.start_request(1, 0), ErrorKind::InvalidArgument, "BUG_ON"),
        (
            Request::NotificationInit {
                nc: 0,
                nq_type: 1,
                entries: 3,
            },
            ErrorKind::InvalidArgument,
            "power of two",
        ),
        (
            Request::NotificationInit {
                nc: 0,
                nq_type: 1,
                entries: 1,
            },
            ErrorKind::InvalidArgument,
            "",
        ),
        (
            Request::NotificationInit {
                nc: 0,
                nq_type: 1,
                entries: 1 << 17,
            },
            ErrorKind::InvalidArgument,
            "",
        ),
        (
            Request::Hello { version: 99 },
            ErrorKind::Handshake,
            "version 99",
        ),
    ];
    for (request, kind, words) in cases {
        let err = a.refused(request.clone());
        assert_eq!(err.kind, kind, "{request:?}: {}", err.message);
        assert!(
            err.message.contains(words),
            "{request:?}: {:?} lacks {words:?}",
            err.message
        );
    }
    // Posting 16 twice fills the 32-descriptor ring's pending count exactly; one more overruns.
    a.ok(q.start_request(0, 16));
    a.ok(q.start_request(0, 16));
    assert_eq!(a.refused(q.start_request(0, 1)).kind, ErrorKind::OutOfRange);
    // The handle of a ring chunk that is too small is refused before anything changes.
    assert_eq!(dev.counters(0).map(|c| c.dma_aborts), Some(0));
}

#[test]
fn the_session_enforces_the_handshake_and_survives_garbage() {
    let dev = device();
    let client = dev.connect(10);
    let encoded = |request: &Request| {
        let mut buf = [0u8; MAX_MSG_SIZE];
        let len = shared::protocol::encode(request, &mut buf).unwrap();
        buf[..len].to_vec()
    };
    let mut late = Session::new(client);
    let Response::Close(Reply::Error(err)) =
        late.respond(&dev, &encoded(&Request::DeviceInfo), false)
    else {
        panic!("a non-Hello first request was accepted");
    };
    assert_eq!(err.kind, ErrorKind::Handshake);
    let mut wrong = Session::new(client);
    let Response::Close(Reply::Error(err)) =
        wrong.respond(&dev, &encoded(&Request::Hello { version: 7 }), false)
    else {
        panic!("a wrong version was accepted");
    };
    assert_eq!(err.kind, ErrorKind::Handshake);

    let mut session = Session::new(client);
    let hello = encoded(&Request::Hello {
        version: PROTOCOL_VERSION,
    });
    assert!(matches!(
        session.respond(&dev, &hello, false),
        Response::Reply(Reply::Hello { .. }, _)
    ));
    for (bytes, truncated) in [(&[0xFF; 9][..], false), (&[][..], false), (&[1][..], true)] {
        let Response::Reply(Reply::Error(err), _) = session.respond(&dev, bytes, truncated) else {
            panic!("garbage was not refused");
        };
        assert_eq!(err.kind, ErrorKind::BadMessage);
    }
    let doorbell = encoded(&Request::SemaphoreIncrement {
        nc: 0,
        index: 0,
        value: 1,
    });
    assert!(
        matches!(session.respond(&dev, &doorbell, false), Response::Silent),
        "posted requests get no reply, even when they fail"
    );
    assert!(matches!(
        session.respond(&dev, &encoded(&Request::Counters { nc: 0 }), false),
        Response::Reply(
            Reply::Counters(NcCounters {
                posted_errors: 1,
                ..
            }),
            _
        )
    ));
}

#[test]
fn only_allowed_uids_may_connect() {
    assert!(check_peer(1000, 1000, &[]).is_ok());
    assert!(check_peer(7, 1000, &[5, 7]).is_ok());
    let Err(err) = check_peer(7, 1000, &[]) else {
        panic!("uid 7 was allowed");
    };
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert_eq!(
        err.message,
        "uid 7 is not allowed to use this simdev (start it with --allow-uid 7)"
    );
}

#[test]
fn the_default_device_has_the_silicons_hbm_and_an_untouched_4_gib_chunk_costs_nothing() {
    use std::os::fd::AsFd;
    let dev = crate::Device::new(&crate::Config {
        socket: "/nonexistent/simdev.sock".into(),
        ..crate::Config::default()
    })
    .unwrap();
    assert_eq!(dev.info().hbm_bytes_per_nc, 16 << 30, "trn1: 16 GiB per NC");
    let a = Client::new(&dev, 10);
    a.claim(0);
    let (reply, _) = dev.handle(
        a.id,
        Request::MemAlloc {
            location: MemLocation::Hbm { nc: 0 },
            size: 4 << 30,
            align: 0,
        },
    );
    let Reply::MemAllocated { handle, size, .. } = reply else {
        panic!("a 4 GiB chunk on default HBM: {reply:?}");
    };
    assert_eq!(size, 4 << 30);
    let (reply, fds) = dev.handle(a.id, Request::MemMap { handle });
    assert!(matches!(reply, Reply::MemMapped { .. }), "{reply:?}");
    let stat = nix::sys::stat::fstat(fds[0].as_fd()).unwrap();
    assert_eq!(stat.st_size, 4 << 30);
    assert!(
        stat.st_blocks <= 8,
        "allocating touched {} blocks of the memfd: it must stay sparse",
        stat.st_blocks
    );
    // The rest of the NC's 16 GiB is there too, and no more.
    let rest = a.alloc(MemLocation::Hbm { nc: 0 }, 12 << 30);
    assert_eq!(rest.size, 12 << 30);
    let oom = a.refused(Request::MemAlloc {
        location: MemLocation::Hbm { nc: 0 },
        size: 4096,
        align: 0,
    });
    assert_eq!(oom.kind, ErrorKind::OutOfMemory);
}
