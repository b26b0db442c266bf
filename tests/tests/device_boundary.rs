//! The device boundary against the real simdev binary: shared chunks, DMA rings, registers,
//! notification queues, isolation between clients, reclaim, hostile input, shutdown.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use runtime::backend::{Device, DeviceError, DmaQueueId};
use runtime::dma::DmaQueue;
use shared::address_map::{Register, SEM_WINDOW_SEMAPHORES};
use shared::notification::{NotificationKind, error_flags};
use shared::protocol::{ErrorKind, MemLocation, PROTOCOL_VERSION, Reply, Request};
use shared::udma::{RingId, m2m_copy_descriptors};
use tests::{NqReader, RawClient, connect, start_simdev, wait_for};

const HBM: &str = "16M";

fn queue(nc: u32, engine: u32, q: u32) -> DmaQueueId {
    DmaQueueId {
        nc,
        engine,
        queue: q,
    }
}

fn remote_kind(e: &DeviceError) -> Option<ErrorKind> {
    match e {
        DeviceError::Remote { source, .. } => Some(source.kind),
        _ => None,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i.to_le_bytes()[0] ^ i.to_le_bytes()[1])
                .wrapping_mul(31)
                .wrapping_add(seed)
        })
        .collect()
}

#[test]
fn runtime_and_simdev_see_each_others_writes_through_a_chunk() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let a = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 8192, 0).unwrap();
    let b = dev.mem_alloc(MemLocation::Host, 8192, 0).unwrap();
    let (ma, mb) = (dev.mem_map(&a).unwrap(), dev.mem_map(&b).unwrap());
    let data = pattern(5000, 7);
    // Runtime writes, simdev's DMA engine reads them and writes the other chunk, runtime reads.
    ma.write(a.pa + 100, &data).unwrap();
    let mut q = DmaQueue::create(&dev, queue(0, 0, 0), 64, MemLocation::Hbm { nc: 0 }).unwrap();
    q.push_copy(a.pa + 100, b.pa + 3, data.len() as u64)
        .unwrap();
    q.kick(&dev).unwrap();
    let mut out = vec![0u8; data.len()];
    mb.read(b.pa + 3, &mut out).unwrap();
    assert_eq!(out, data);
    // A second mapping of the same chunk (the driver's mmap again) sees the same bytes.
    let mb2 = dev.mem_map(&b).unwrap();
    mb2.read(b.pa + 3, &mut out).unwrap();
    assert_eq!(out, data);
    let counters = dev.nc_counters(0).unwrap();
    assert_eq!(counters.dma_bytes, data.len() as u64);
    assert_eq!(counters.dma_descriptors, 1);
}

#[test]
fn a_second_client_can_neither_map_nor_dma_into_the_first_clients_chunk() {
    let sim = start_simdev(&["--hbm", HBM]);
    let first = connect(&sim);
    let _nc0 = first.claim_nc(0).unwrap();
    let secret = first
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 0)
        .unwrap();
    let secret_map = first.mem_map(&secret).unwrap();
    secret_map
        .write(secret.pa, b"first client's bytes")
        .unwrap();

    let second = connect(&sim);
    let _nc1 = second.claim_nc(1).unwrap();
    let err = second.mem_map(&secret).unwrap_err();
    assert_eq!(remote_kind(&err), Some(ErrorKind::BadHandle), "{err}");
    assert_eq!(
        remote_kind(&second.mem_free_confirmed(secret.handle).unwrap_err()),
        Some(ErrorKind::BadHandle)
    );

    let mut nq = NqReader::new(second.notification_queue_init(1, 16).unwrap());
    let mine = second
        .mem_alloc(MemLocation::Hbm { nc: 1 }, 4096, 0)
        .unwrap();
    let mut q = DmaQueue::create(&second, queue(1, 0, 0), 32, MemLocation::Hbm { nc: 1 }).unwrap();
    q.push_copy(mine.pa, secret.pa, 8).unwrap();
    q.kick(&second).unwrap();
    let entry = nq
        .next_within(Duration::from_secs(5))
        .expect("a DMA abort notification");
    assert_eq!(
        NotificationKind::from_u16(entry.kind),
        Some(NotificationKind::DmaQueueError)
    );
    assert_ne!(entry.error_flags & error_flags::DMA_ABORT, 0);
    assert_ne!(entry.error_flags & error_flags::OOB, 0);
    let mut out = [0u8; 20];
    secret_map.read(secret.pa, &mut out).unwrap();
    assert_eq!(&out, b"first client's bytes", "untouched");
    // Reading the first client's chunk is refused too.
    let mut q2 = DmaQueue::create(&second, queue(1, 0, 1), 32, MemLocation::Hbm { nc: 1 }).unwrap();
    q2.push_copy(secret.pa, mine.pa, 8).unwrap();
    q2.kick(&second).unwrap();
    let entry = nq
        .next_within(Duration::from_secs(5))
        .expect("a second DMA abort");
    assert_ne!(entry.error_flags & error_flags::OOB, 0);
}

#[test]
fn a_raw_offset_used_as_a_pa_is_out_of_bounds() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let mut nq = NqReader::new(dev.notification_queue_init(0, 16).unwrap());
    let dst = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 0).unwrap();
    let mut q = DmaQueue::create(&dev, queue(0, 1, 0), 32, MemLocation::Hbm { nc: 0 }).unwrap();
    let raw_offset = dst.pa - dev.info().hbm_bases[0];
    q.push_copy(raw_offset, dst.pa, 64).unwrap();
    q.kick(&dev).unwrap();
    let entry = nq
        .next_within(Duration::from_secs(5))
        .expect("abort notification");
    assert_eq!(entry.source, 1 << 8, "engine 1, queue 0");
    assert_ne!(entry.error_flags & error_flags::OOB, 0);
    assert_eq!(dev.nc_counters(0).unwrap().dma_aborts, 1);
    // The stopped queue refuses further doorbells until re-initialised.
    q.push_copy(dst.pa, dst.pa + 128, 4).unwrap();
    let err = q.kick(&dev).unwrap_err();
    assert!(err.to_string().contains("DMA queue"), "{err}");
}

#[test]
fn a_one_mib_copy_through_sixteen_64k_descriptor_pairs() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let src = dev
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 1 << 20, 0)
        .unwrap();
    let dst = dev
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 1 << 20, 0)
        .unwrap();
    let (ms, md) = (dev.mem_map(&src).unwrap(), dev.mem_map(&dst).unwrap());
    let data = pattern(1 << 20, 3);
    ms.write(src.pa, &data).unwrap();
    let mut q = DmaQueue::create(&dev, queue(0, 2, 3), 32, MemLocation::Hbm { nc: 0 }).unwrap();
    assert_eq!(q.push_copy(src.pa, dst.pa, 1 << 20).unwrap(), 16);
    q.kick(&dev).unwrap();
    let mut out = vec![0u8; 1 << 20];
    md.read(dst.pa, &mut out).unwrap();
    assert!(out == data, "1 MiB copied intact");
    let c = dev.nc_counters(0).unwrap();
    assert_eq!((c.dma_descriptors, c.dma_bytes), (16, 1 << 20));
}

#[test]
fn a_ring_wraps_with_its_ring_id_advancing() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let mut nq = NqReader::new(dev.notification_queue_init(0, 16).unwrap());
    let buf = dev.mem_alloc(MemLocation::Host, 4096, 0).unwrap();
    let m = dev.mem_map(&buf).unwrap();
    let mut q = DmaQueue::create(&dev, queue(0, 0, 0), 32, MemLocation::Host).unwrap();
    // Three and a half passes over a 32-descriptor ring, kicked 8 pairs at a time.
    for round in 0u32..14 {
        for i in 0..8u32 {
            let n = round * 8 + i;
            m.write(buf.pa, &n.to_le_bytes()).unwrap();
            q.push_copy(buf.pa, buf.pa + 8 + 4 * u64::from(n % 64), 4)
                .unwrap();
            q.kick(&dev).unwrap();
            let got: u32 = m.read_obj(buf.pa + 8 + 4 * u64::from(n % 64)).unwrap();
            assert_eq!(got, n, "copy {n} (pass {})", n / 32);
        }
    }
    assert_eq!(
        q.tx().ring_id().value(),
        0,
        "passes 1, 2, 3 done; the ring is on pass id 0"
    );
    assert!(nq.try_next().is_none(), "no abort on a correct wrap");
    // A descriptor carrying the previous pass's ring id is stale: the queue stops.
    let stale = q.tx().ring_id().value().wrapping_sub(1) & 3;
    let (tx, rx) =
        m2m_copy_descriptors(buf.pa, buf.pa + 512, 4, RingId::new(stale).unwrap(), false).unwrap();
    q.push_descriptors(&tx, &rx).unwrap();
    q.kick(&dev).unwrap();
    let entry = nq
        .next_within(Duration::from_secs(5))
        .expect("stale ring id aborts the queue");
    assert_ne!(entry.error_flags & error_flags::DMA_ABORT, 0);
}

#[test]
fn a_copy_into_a_semaphore_increment_register_adds_to_the_semaphore() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let nc = dev.claim_nc(1).unwrap();
    let window = nc.semaphore_window.as_ref().unwrap();
    let src = dev.mem_alloc(MemLocation::Host, 4096, 0).unwrap();
    let m = dev.mem_map(&src).unwrap();
    m.write(src.pa, &5u32.to_le_bytes()).unwrap();
    dev.semaphore_write(1, 9, 100).unwrap();
    let reg = shared::AddressMap {
        arch: dev.info().arch,
        nc_count: dev.info().nc_count,
        hbm_bytes_per_nc: dev.info().hbm_bytes_per_nc,
    }
    .register_address(Register::SemaphoreIncrement { nc: 1, index: 9 });
    let mut q = DmaQueue::create(&dev, queue(1, 0, 0), 32, MemLocation::Host).unwrap();
    q.push_copy(src.pa, reg, 4).unwrap();
    q.push_copy(src.pa, reg, 4).unwrap();
    q.kick(&dev).unwrap();
    assert_eq!(dev.semaphore_read(1, 9).unwrap(), 110);
    let sem_pa = window.pa() + SEM_WINDOW_SEMAPHORES as u64 + 9 * 4;
    assert_eq!(
        window.load_u32(sem_pa, Ordering::Acquire).unwrap(),
        110,
        "visible in the mapped window"
    );
    assert!(
        window.write(window.pa(), &[1]).is_err(),
        "the window is mapped read-only"
    );
}

#[test]
fn a_dma_write_into_a_tail_increment_register_starts_another_queue() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let info = dev.info().clone();
    let map = shared::AddressMap {
        arch: info.arch,
        nc_count: info.nc_count,
        hbm_bytes_per_nc: info.hbm_bytes_per_nc,
    };
    let buf = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 0).unwrap();
    let m = dev.mem_map(&buf).unwrap();
    m.write(buf.pa, b"moved by the second queue").unwrap();
    m.write(buf.pa + 1024, &1u32.to_le_bytes()).unwrap();
    // Queue B holds one posted-but-not-started copy.
    let mut b = DmaQueue::create(&dev, queue(0, 3, 2), 32, MemLocation::Hbm { nc: 0 }).unwrap();
    b.push_copy(buf.pa, buf.pa + 2048, 25).unwrap();
    // Queue A's two descriptor pairs write 1 to B's RX then TX tail-increment registers.
    let mut a = DmaQueue::create(&dev, queue(0, 0, 0), 32, MemLocation::Hbm { nc: 0 }).unwrap();
    let rx_inc = map.register_address(Register::RxTailIncrement {
        nc: 0,
        engine: 3,
        queue: 2,
    });
    let tx_inc = map.register_address(Register::TxTailIncrement {
        nc: 0,
        engine: 3,
        queue: 2,
    });
    a.push_copy(buf.pa + 1024, rx_inc, 4).unwrap();
    a.push_copy(buf.pa + 1024, tx_inc, 4).unwrap();
    a.kick(&dev).unwrap();
    let mut out = [0u8; 25];
    m.read(buf.pa + 2048, &mut out).unwrap();
    assert_eq!(&out, b"moved by the second queue");
    assert_eq!(dev.nc_counters(0).unwrap().register_writes, 2);
}

#[test]
fn bad_requests_get_typed_errors_and_the_next_good_request_succeeds() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let ok = |dev: &runtime::backend::sim::SimDevice| {
        dev.semaphore_write(0, 1, 7).unwrap();
        assert_eq!(dev.semaphore_read(0, 1).unwrap(), 7);
    };
    let kind = |r: Result<(), DeviceError>| r.map_err(|e| remote_kind(&e));
    // Backend-side range checks stay synchronous, even for the posted doorbell.
    assert!(matches!(
        dev.semaphore_increment(0, 256, 1),
        Err(DeviceError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.event_set(2, 0, 1),
        Err(DeviceError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.dma_queue_copy_start(queue(0, 16, 0), 1, 1),
        Err(DeviceError::OutOfRange { .. })
    ));
    assert!(matches!(
        dev.dma_queue_copy_start(queue(0, 0, 0), 1, 0),
        Err(DeviceError::OutOfRange { .. })
    ));
    ok(&dev);
    // simdev-side refusals.
    let too_big = dev
        .mem_alloc(MemLocation::Hbm { nc: 0 }, 17 << 20, 0)
        .map(|_| ());
    assert_eq!(kind(too_big), Err(Some(ErrorKind::OutOfMemory)));
    assert_eq!(
        kind(dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 0, 0).map(|_| ())),
        Err(Some(ErrorKind::InvalidArgument))
    );
    assert_eq!(
        kind(
            dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 3)
                .map(|_| ())
        ),
        Err(Some(ErrorKind::InvalidArgument))
    );
    assert_eq!(
        kind(
            dev.mem_alloc(MemLocation::Hbm { nc: 1 }, 4096, 0)
                .map(|_| ())
        ),
        Err(Some(ErrorKind::NotOwner))
    );
    assert_eq!(
        kind(dev.mem_free_confirmed(runtime::backend::MemHandle(999_999))),
        Err(Some(ErrorKind::BadHandle))
    );
    ok(&dev);
    // The free a runtime does not wait for: its refusal is read (and logged) by the next
    // request, which still gets its own answer.
    dev.mem_free(runtime::backend::MemHandle(999_999)).unwrap();
    ok(&dev);
    let ring = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, 4096, 0).unwrap();
    let rings = |n: u32| runtime::backend::DmaRings {
        tx_ring: ring.handle,
        tx_desc_count: n,
        rx_ring: ring.handle,
        rx_desc_count: n,
    };
    for bad in [16, 31, 33, 40] {
        assert_eq!(
            kind(dev.dma_queue_init(queue(0, 0, 0), &rings(bad))),
            Err(Some(ErrorKind::BadRing)),
            "{bad}"
        );
    }
    assert_eq!(
        kind(dev.dma_queue_init(queue(0, 0, 0), &rings(512))),
        Err(Some(ErrorKind::BadRing)),
        "chunk too small"
    );
    assert_eq!(
        kind(dev.dma_queue_copy_start(queue(0, 0, 5), 1, 1)),
        Err(Some(ErrorKind::QueueStopped)),
        "not initialised"
    );
    dev.dma_queue_init(queue(0, 0, 0), &rings(32)).unwrap();
    assert_eq!(
        kind(dev.dma_queue_copy_start(queue(0, 0, 0), 33, 33)),
        Err(Some(ErrorKind::OutOfRange)),
        "overrun"
    );
    assert_eq!(
        kind(dev.notification_queue_init(0, 3).map(|_| ())),
        Err(Some(ErrorKind::InvalidArgument))
    );
    ok(&dev);
    // Another client claiming an owned NC.
    let other = connect(&sim);
    let err = other.claim_nc(0).unwrap_err();
    assert_eq!(remote_kind(&err), Some(ErrorKind::NcBusy));
    assert!(
        format!("{err}: {}", std::error::Error::source(&err).unwrap()).contains("NC 0"),
        "{err:?}"
    );
    assert_eq!(
        kind(other.semaphore_write(0, 1, 1)),
        Err(Some(ErrorKind::NotOwner))
    );
    other.claim_nc(1).unwrap();
    ok(&dev);
}

#[test]
fn hostile_bytes_and_bad_handshakes_are_refused_without_harm() {
    let sim = start_simdev(&["--hbm", HBM]);
    // A request before the handshake.
    let c = RawClient::connect(sim.socket());
    let reply = c.call(&Request::DeviceInfo);
    assert!(
        matches!(reply, Some(Reply::Error(ref e)) if e.kind == ErrorKind::Handshake),
        "{reply:?}"
    );
    // A wrong protocol version.
    let c = RawClient::connect(sim.socket());
    let reply = c.call(&Request::Hello {
        version: PROTOCOL_VERSION + 1,
    });
    assert!(
        matches!(reply, Some(Reply::Error(ref e)) if e.kind == ErrorKind::Handshake),
        "{reply:?}"
    );
    // Garbage after a good handshake: an error reply, and the connection still works.
    let c = RawClient::connect_hello(sim.socket());
    // (An empty SOCK_SEQPACKET message reads as end-of-file, so it is not a message at all.)
    for garbage in [&[0xFFu8; 64][..], &[200, 1, 2, 3][..], &[3u8; 5000][..]] {
        c.send_bytes(garbage);
        let reply = c.recv();
        assert!(
            matches!(reply, Some(Reply::Error(ref e)) if e.kind == ErrorKind::BadMessage),
            "{reply:?}"
        );
    }
    // Out-of-range ids sent past the backend's checks.
    for req in [
        Request::ClaimNc { nc: 99 },
        Request::SemaphoreRead { nc: 7, index: 0 },
        Request::Counters { nc: u32::MAX },
    ] {
        let reply = c.call(&req);
        assert!(
            matches!(reply, Some(Reply::Error(ref e)) if e.kind == ErrorKind::OutOfRange),
            "{req:?}: {reply:?}"
        );
    }
    assert!(matches!(
        c.call(&Request::ClaimNc { nc: 0 }),
        Some(Reply::NcClaimed { nc: 0 })
    ));
    let reply = c.call(&Request::SemaphoreRead { nc: 0, index: 256 });
    assert!(
        matches!(reply, Some(Reply::Error(ref e)) if e.kind == ErrorKind::OutOfRange),
        "{reply:?}"
    );
    // A bad posted doorbell gets no reply but is counted; the next request is answered.
    let mut buf = [0u8; 64];
    let n = shared::protocol::encode(
        &Request::SemaphoreIncrement {
            nc: 0,
            index: 9999,
            value: 1,
        },
        &mut buf,
    )
    .unwrap();
    c.send_bytes(&buf[..n]);
    let Some(Reply::Counters(counters)) = c.call(&Request::Counters { nc: 0 }) else {
        panic!("counters")
    };
    assert_eq!(counters.posted_errors, 1);
    assert!(matches!(
        c.call(&Request::DeviceInfo),
        Some(Reply::DeviceInfo(_))
    ));
}

#[test]
fn a_killed_client_is_reclaimed_and_its_ncs_and_hbm_are_free_again() {
    let sim = start_simdev(&["--hbm", HBM]);
    let mut client = Command::new(env!("CARGO_BIN_EXE_sim-client"))
        .args(["0", "1", "--alloc", "8388608"])
        .env("NEURON_SIMDEV_SOCKET", sim.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(client.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let dev = connect(&sim);
    assert_eq!(
        remote_kind(&dev.claim_nc(0).unwrap_err()),
        Some(ErrorKind::NcBusy),
        "owned while the client lives"
    );
    client.kill().unwrap(); // SIGKILL: no chance to clean up.
    client.wait().unwrap();
    let claimed =
        wait_for(Duration::from_secs(5), || dev.claim_nc(0).ok()).expect("NC 0 reclaimed");
    let _nc1 = dev.claim_nc(1).unwrap();
    let hbm = dev.info().hbm_bytes_per_nc;
    for nc in 0..2 {
        let all = dev.mem_alloc(MemLocation::Hbm { nc }, hbm, 0).unwrap();
        assert_eq!(all.size, hbm);
        let m = dev.mem_map(&all).unwrap();
        let mut b = [0u8; 4];
        m.read(all.pa, &mut b).unwrap();
        assert_eq!(b, [0; 4], "fresh memory, not the dead client's bytes");
    }
    drop(claimed);
}

/// A sim-client process owning NC 0, ready.
fn spawn_owner(sim: &runtime::backend::sim::PrivateSimdev) -> std::process::Child {
    let mut client = Command::new(env!("CARGO_BIN_EXE_sim-client"))
        .arg("0")
        .env("NEURON_SIMDEV_SOCKET", sim.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(client.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    client
}

/// On silicon the driver releases a dead process's NCs before its parent's `waitpid` returns;
/// simdev's reclaim on EOF is asynchronous, so a claim conflict checks the owner instead.
#[test]
fn a_killed_and_reaped_owners_nc_is_claimable_at_once() {
    let sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    for i in 0..50 {
        let mut owner = spawn_owner(&sim);
        owner.kill().unwrap(); // SIGKILL
        owner.wait().unwrap();
        if let Err(e) = dev.claim_nc(0) {
            panic!(
                "iteration {i}: the dead owner still holds NC 0: {e}: {:?}",
                std::error::Error::source(&e).map(ToString::to_string)
            );
        }
        dev.release_nc(0).unwrap();
    }
    let mut live = spawn_owner(&sim);
    let busy = dev.claim_nc(0).unwrap_err();
    assert_eq!(
        remote_kind(&busy),
        Some(ErrorKind::NcBusy),
        "a live owner keeps NC 0"
    );
    assert!(
        std::error::Error::source(&busy)
            .is_some_and(|s| s.to_string().contains(&format!("pid {}", live.id()))),
        "{busy}: {:?}",
        std::error::Error::source(&busy).map(ToString::to_string)
    );
    live.kill().unwrap();
    live.wait().unwrap();
}

#[test]
fn two_clients_on_different_ncs_run_at_once() {
    let sim = start_simdev(&["--hbm", HBM]);
    let socket = sim.socket().to_owned();
    let threads: Vec<_> = (0..2u32)
        .map(|nc| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let dev = runtime::backend::sim::SimDevice::connect(&socket).unwrap();
                let _c = dev.claim_nc(nc).unwrap();
                let src = dev.mem_alloc(MemLocation::Hbm { nc }, 65536, 0).unwrap();
                let dst = dev.mem_alloc(MemLocation::Hbm { nc }, 65536, 0).unwrap();
                let (ms, md) = (dev.mem_map(&src).unwrap(), dev.mem_map(&dst).unwrap());
                let mut q =
                    DmaQueue::create(&dev, queue(nc, 0, 0), 64, MemLocation::Hbm { nc }).unwrap();
                for i in 0..200u32 {
                    let data = pattern(4096, (i + nc * 1000).to_le_bytes()[0]);
                    ms.write(src.pa, &data).unwrap();
                    q.push_copy(src.pa, dst.pa, 4096).unwrap();
                    q.kick(&dev).unwrap();
                    let mut out = vec![0u8; 4096];
                    md.read(dst.pa, &mut out).unwrap();
                    assert_eq!(out, data, "NC {nc} copy {i}");
                }
                dev.nc_counters(nc).unwrap().dma_descriptors
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 200);
    }
}

#[test]
fn sigterm_fails_in_flight_work_and_removes_the_socket() {
    let mut sim = start_simdev(&["--hbm", HBM]);
    let dev = connect(&sim);
    let _nc = dev.claim_nc(0).unwrap();
    let mut nq = NqReader::new(dev.notification_queue_init(0, 16).unwrap());
    let socket = sim.socket().to_owned();
    assert!(socket.exists());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(sim.pid()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let entry = nq
        .next_within(Duration::from_secs(5))
        .expect("a device-lost notification");
    assert_eq!(
        NotificationKind::from_u16(entry.kind),
        Some(NotificationKind::DeviceLost)
    );
    assert_ne!(entry.error_flags & error_flags::DEVICE_LOST, 0);
    let gone = wait_for(Duration::from_secs(5), || dev.semaphore_read(0, 0).err());
    assert!(
        matches!(gone, Some(DeviceError::Disconnected { .. })),
        "{gone:?}"
    );
    assert!(
        wait_for(Duration::from_secs(5), || (!socket.exists()).then_some(())).is_some(),
        "socket removed"
    );
    sim.stop();
}

#[test]
fn a_client_of_another_uid_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED a_client_of_another_uid_is_refused: needs root to run a client as another uid"
        );
        return;
    }
    // Everything the other uid touches must be reachable by it: a 0755 directory holding a copy
    // of the client binary and the socket (made connectable so SO_PEERCRED is what refuses).
    let dir = tempfile::Builder::new()
        .prefix("uid-test-")
        .tempdir()
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let client = dir.path().join("sim-client");
    std::fs::copy(env!("CARGO_BIN_EXE_sim-client"), &client).unwrap();
    std::fs::set_permissions(&client, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_as_nobody = |socket: &std::path::Path, open_socket: bool| {
        std::fs::set_permissions(
            socket.parent().unwrap(),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        if open_socket {
            std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let out = Command::new(&client)
            .arg("0")
            .env("NEURON_SIMDEV_SOCKET", socket)
            .stdin(Stdio::null())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    use std::os::unix::process::CommandExt;
    let sim = start_simdev(&["--hbm", HBM]);
    let mode = std::fs::metadata(sim.socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "the socket is created 0600");
    // The 0600 socket keeps the other user out before simdev sees it, and the client says why.
    let (status, stderr, _) = run_as_nobody(sim.socket(), false);
    assert!(!status.success());
    assert!(
        stderr.contains("permission denied connecting to") && stderr.contains("--allow-uid"),
        "{stderr}"
    );
    // Made connectable, simdev's uid check refuses it.
    let (status, stderr, _) = run_as_nobody(sim.socket(), true);
    assert!(!status.success());
    assert!(stderr.contains("not allowed"), "{stderr}");
    // With --allow-uid the same client is served, on the socket as simdev made it (0666:
    // the uid check admits it).
    let allowed = start_simdev(&["--hbm", HBM, "--allow-uid", "65534"]);
    let mode = std::fs::metadata(allowed.socket())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o666, "with --allow-uid the socket is created 0666");
    let (status, stderr, stdout) = run_as_nobody(allowed.socket(), false);
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "ready");
}

/// `(thread name, Linux scheduling policy, time slice in ns)` of every thread of process
/// `pid`, from `/proc/<pid>/task/<tid>/stat` (the policy is field 41; the name, in
/// parentheses, may hold spaces, so fields are counted after its closing parenthesis) and
/// `/proc/<pid>/task/<tid>/sched` (`se.slice`; `None` on a kernel that does not show it).
fn thread_policies(pid: u32) -> Vec<(String, u32, Option<u64>)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let Ok(stat) = std::fs::read_to_string(task.join("stat")) else {
            continue; // the thread exited meanwhile
        };
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_owned();
        // After ")": field 3 (state) is the first, so field 41 is the 39th.
        let policy = stat[close + 1..].split_whitespace().nth(38).unwrap();
        out.push((name, policy.parse().unwrap(), slice_ns(&task.join("sched"))));
    }
    out
}

/// The `se.slice` line of a `/proc/.../sched` file.
fn slice_ns(sched: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(sched).ok()?;
    let line = text.lines().find(|l| l.starts_with("se.slice"))?;
    line.rsplit(':').next()?.trim().parse().ok()
}

#[test]
fn simdev_threads_never_preempt_the_host_by_default_and_keep_the_default_policy_on_request() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_BATCH: u32 = 3;
    // The kernel's default slice: this test thread's.
    let default_slice = slice_ns(std::path::Path::new("/proc/thread-self/sched"));
    let device_slice = simdev::sched::kernel_grants_custom_slices()
        .then(|| u64::try_from(simdev::sched::DEVICE_SLICE.as_nanos()).unwrap());
    for (args, policy, slice) in [
        (&[][..], SCHED_BATCH, device_slice),
        (&["--sched", "normal"][..], SCHED_OTHER, default_slice),
    ] {
        let sim = start_simdev(&[&["--hbm", HBM][..], args].concat());
        let dev = connect(&sim);
        // Round trips on the connection: its thread serves them.
        dev.claim_nc(0).unwrap();
        dev.semaphore_increment(0, 0, 1).unwrap();
        assert_eq!(dev.semaphore_read(0, 0).unwrap(), 1);
        let threads = thread_policies(sim.pid());
        assert!(
            threads
                .iter()
                .any(|(name, _, _)| name.starts_with("simdev-conn")),
            "{threads:?}"
        );
        assert!(
            threads.iter().all(|&(_, p, _)| p == policy),
            "{args:?}: every simdev thread has policy {policy}: {threads:?}"
        );
        // Where the kernel shows slices (and, for the device's, grants custom ones).
        if let Some(slice) = slice {
            assert!(
                threads
                    .iter()
                    .all(|&(_, _, s)| s.is_none_or(|s| s == slice)),
                "{args:?}: every simdev thread has a slice of {slice} ns: {threads:?}"
            );
        }
    }
}
