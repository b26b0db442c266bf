//! Device-level tests: requests in, replies and shared-memory effects out, all in-process (no
//! sockets, no child processes). Descriptors are built with
//! [`shared::udma::m2m_copy_descriptors`], as the runtime builds them.

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;

use shared::address_map::{Arch, REG_WINDOW_BASE, SEM_WINDOW_SEMAPHORES, SEM_WINDOW_SIZE};
use shared::memory::SharedChunk;
use shared::notification::{
    NOTIFICATION_ENTRY_SIZE, NQ_HEAD_OFFSET, NQ_HEADER_SIZE, NQ_TAIL_OFFSET,
};
use shared::protocol::MAX_MSG_SIZE;
use shared::udma::{RingId, UDMA_DESC_SIZE, UdmaDesc, m2m_copy_descriptors};

use super::*;
use crate::server::{Response, Session, check_peer};

mod exec;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn config() -> Config {
    Config {
        socket: "/nonexistent/simdev.sock".into(),
        arch: Arch::Trn1,
        ncs: 2,
        hbm_bytes_per_nc: 16 * MIB,
        allow_uids: Vec::new(),
        trace: None,
    }
}

fn device() -> Device {
    Device::new(&config()).unwrap()
}

/// An allocation as the client sees it: handle, PA and its own mapping of the chunk.
struct Buf {
    handle: u64,
    pa: u64,
    size: u64,
    view: SharedChunk,
}

impl Buf {
    fn write(&self, offset: u64, bytes: &[u8]) {
        self.view.write(self.pa + offset, bytes).unwrap();
    }

    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.view.read(self.pa + offset, &mut out).unwrap();
        out
    }
}

/// One client of the device, driving it the way the runtime's sim backend would.
struct Client<'a> {
    dev: &'a Device,
    id: ClientId,
}

impl<'a> Client<'a> {
    fn new(dev: &'a Device, pid: u32) -> Self {
        Self {
            dev,
            id: dev.connect(pid),
        }
    }

    fn call(&self, request: Request) -> Reply {
        self.dev.handle(self.id, request).0
    }

    fn ok(&self, request: Request) {
        let name = request.name();
        assert_eq!(self.call(request), Reply::Ok, "{name}");
    }

    fn refused(&self, request: Request) -> RemoteError {
        match self.call(request.clone()) {
            Reply::Error(err) => err,
            other => panic!("{request:?} was answered {other:?}"),
        }
    }

    fn claim(&self, nc: u32) -> Vec<OwnedFd> {
        let (reply, fds) = self.dev.handle(self.id, Request::ClaimNc { nc });
        assert_eq!(reply, Reply::NcClaimed { nc });
        assert_eq!(fds.len(), 2);
        fds
    }

    fn map(&self, handle: u64) -> SharedChunk {
        let (reply, fds) = self.dev.handle(self.id, Request::MemMap { handle });
        let Reply::MemMapped { pa, size, .. } = reply else {
            panic!("MemMap answered {reply:?}");
        };
        let len = usize::try_from(size).unwrap();
        SharedChunk::map_fd(&fds[0], pa, len, true).unwrap()
    }

    fn alloc(&self, location: MemLocation, size: u64) -> Buf {
        let reply = self.call(Request::MemAlloc {
            location,
            size,
            align: 0,
        });
        let Reply::MemAllocated { handle, pa, size } = reply else {
            panic!("MemAlloc answered {reply:?}");
        };
        Buf {
            handle,
            pa,
            size,
            view: self.map(handle),
        }
    }

    fn nq(&self, nc: u32, entries: u32) -> Buf {
        let reply = self.call(Request::NotificationInit {
            nc,
            nq_type: NQ_TYPE_NOTIFY,
            entries,
        });
        let Reply::NotificationQueue {
            handle, pa, size, ..
        } = reply
        else {
            panic!("NotificationInit answered {reply:?}");
        };
        Buf {
            handle,
            pa,
            size,
            view: self.map(handle),
        }
    }

    fn semaphore(&self, nc: u32, index: u32) -> u32 {
        match self.call(Request::SemaphoreRead { nc, index }) {
            Reply::Value(v) => v,
            other => panic!("SemaphoreRead answered {other:?}"),
        }
    }

    fn counters(&self, nc: u32) -> NcCounters {
        match self.call(Request::Counters { nc }) {
            Reply::Counters(c) => c,
            other => panic!("Counters answered {other:?}"),
        }
    }
}

/// The notification entries posted so far (the consumer does not advance `head`).
fn entries(nq: &Buf, ring: u32) -> Vec<NotificationEntry> {
    let tail = nq
        .view
        .load_u32(nq.pa + NQ_TAIL_OFFSET as u64, Ordering::Acquire)
        .unwrap();
    (0..u64::from(tail))
        .map(|n| {
            let slot = n % u64::from(ring);
            let pa = nq.pa + NQ_HEADER_SIZE as u64 + slot * NOTIFICATION_ENTRY_SIZE as u64;
            nq.view.read_obj(pa).unwrap()
        })
        .collect()
}

fn register(dev: &Device, reg: Register) -> u64 {
    dev.address_map().register_address(reg)
}

/// A DMA queue and its two rings, with the producer state the runtime keeps (next slot, ring
/// id of the pass being written).
struct Queue {
    nc: u32,
    engine: u32,
    queue: u32,
    tx: Buf,
    rx: Buf,
    descs: u32,
    next: u32,
    ring_id: RingId,
}

impl Queue {
    fn new(client: &Client<'_>, nc: u32, engine: u32, queue: u32, descs: u32) -> Self {
        let bytes = u64::from(descs) * UDMA_DESC_SIZE as u64;
        let tx = client.alloc(MemLocation::Host, bytes);
        let rx = client.alloc(MemLocation::Host, bytes);
        client.ok(Request::DmaQueueInit {
            nc,
            engine,
            queue,
            tx_ring: tx.handle,
            tx_desc_count: descs,
            rx_ring: rx.handle,
            rx_desc_count: descs,
        });
        Self {
            nc,
            engine,
            queue,
            tx,
            rx,
            descs,
            next: 0,
            ring_id: RingId::INITIAL,
        }
    }

    fn push_raw(&mut self, tx: UdmaDesc, rx: UdmaDesc) {
        let offset = u64::from(self.next) * UDMA_DESC_SIZE as u64;
        self.tx.write(offset, &tx.to_le_bytes());
        self.rx.write(offset, &rx.to_le_bytes());
        self.next += 1;
        if self.next == self.descs {
            self.next = 0;
            self.ring_id = self.ring_id.next();
        }
    }

    fn push(&mut self, src: u64, dst: u64, len: u64) {
        let (tx, rx) = m2m_copy_descriptors(src, dst, len, self.ring_id, false).unwrap();
        self.push_raw(tx, rx);
    }

    fn start_request(&self, tx: u32, rx: u32) -> Request {
        Request::DmaQueueCopyStart {
            nc: self.nc,
            engine: self.engine,
            queue: self.queue,
            tx_desc_count: tx,
            rx_desc_count: rx,
        }
    }

    fn start(&self, client: &Client<'_>, count: u32) {
        client.ok(self.start_request(count, count));
    }

    fn tail_registers(&self) -> (Register, Register) {
        let (nc, engine, queue) = (self.nc, self.engine, self.queue);
        (
            Register::TxTailIncrement { nc, engine, queue },
            Register::RxTailIncrement { nc, engine, queue },
        )
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from((i * 7 + i / 251) % 256).unwrap())
        .collect()
}

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
fn a_1_mib_copy_in_sixteen_64k_pairs() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let src = a.alloc(MemLocation::Hbm { nc: 0 }, MIB);
    let dst = a.alloc(MemLocation::Hbm { nc: 0 }, MIB);
    let data = pattern(1 << 20);
    src.write(0, &data);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    for i in 0..16 {
        q.push(src.pa + i * 64 * KIB, dst.pa + i * 64 * KIB, 64 * KIB);
    }
    q.start(&a, 16);
    assert_eq!(dst.read(0, 1 << 20), data);
    let counters = a.counters(0);
    assert_eq!(counters.dma_descriptors, 16);
    assert_eq!(counters.dma_bytes, MIB);
    assert_eq!(counters.dma_aborts, 0);
}

#[test]
fn the_ring_wraps_and_its_ring_id_advances_over_four_passes() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let src = a.alloc(MemLocation::Host, 4 * KIB);
    let dst = a.alloc(MemLocation::Host, 4 * KIB);
    let mut q = Queue::new(&a, 0, 3, 7, 32);
    let pairs = 4 * 32;
    for n in 0..pairs {
        src.write(4 * n, &u32::try_from(n).unwrap().to_le_bytes());
    }
    for batch in 0..pairs / 16 {
        for n in batch * 16..(batch + 1) * 16 {
            q.push(src.pa + 4 * n, dst.pa + 4 * n, 4);
        }
        q.start(&a, 16);
    }
    assert_eq!(q.ring_id, RingId::INITIAL, "1, 2, 3, 0 and back to 1");
    assert_eq!(dst.read(0, 512), src.read(0, 512));
    assert_eq!(a.counters(0).dma_descriptors, pairs);
    let state = lock(&dev.core.ncs[0].state);
    assert_eq!(state.queues.heads(3, 7), Some((0, 0)));
    assert_eq!(state.queues.status(3, 7), Some(&dma::QueueStatus::Running));
}

#[test]
fn a_stale_ring_id_stops_the_queue_with_a_dma_abort_notification() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let fds = a.claim(0);
    let nq = a.nq(0, 8);
    let src = a.alloc(MemLocation::Host, 4 * KIB);
    let dst = a.alloc(MemLocation::Host, 4 * KIB);
    src.write(0, b"fresh data");
    let mut bad = Queue::new(&a, 0, 2, 5, 32);
    bad.ring_id = RingId::INITIAL.next();
    bad.push(src.pa, dst.pa, 10);
    bad.start(&a, 1);

    let posted = entries(&nq, 8);
    assert_eq!(posted.len(), 1);
    let entry = posted[0];
    assert_eq!(entry.kind, NotificationKind::DmaQueueError as u16);
    assert_eq!(entry.source, (2 << 8) | 5);
    assert_eq!(entry.error_flags, error_flags::DMA_ABORT);
    assert_eq!(entry.phase, 1);
    let mut count = [0u8; 8];
    nix::unistd::read(&fds[1], &mut count).unwrap();
    assert_eq!(
        u64::from_ne_bytes(count),
        1,
        "the NC's eventfd was signalled"
    );
    assert_eq!(dst.read(0, 10), [0; 10], "nothing was copied");
    assert_eq!(a.counters(0).dma_aborts, 1);

    let stopped = a.refused(bad.start_request(1, 1));
    assert_eq!(stopped.kind, ErrorKind::QueueStopped);
    assert!(
        stopped.message.contains("ring id 2, the ring is on pass 1"),
        "{}",
        stopped.message
    );
    assert!(
        stopped.message.contains("TX descriptor 0"),
        "{}",
        stopped.message
    );

    let mut good = Queue::new(&a, 0, 2, 6, 32);
    good.push(src.pa, dst.pa, 10);
    good.start(&a, 1);
    assert_eq!(dst.read(0, 10), b"fresh data");
}

#[test]
fn a_tx_rx_length_mismatch_stops_the_queue() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let nq = a.nq(0, 4);
    let buf = a.alloc(MemLocation::Host, 4 * KIB);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    let (tx, _) = m2m_copy_descriptors(buf.pa, buf.pa + 64, 8, RingId::INITIAL, false).unwrap();
    let (_, rx) = m2m_copy_descriptors(buf.pa, buf.pa + 64, 4, RingId::INITIAL, false).unwrap();
    q.push_raw(tx, rx);
    q.start(&a, 1);
    let posted = entries(&nq, 4);
    assert_eq!(posted[0].error_flags, error_flags::DMA_ABORT, "not an OOB");
    let status = lock(&dev.core.ncs[0].state).queues.status(0, 0).cloned();
    let Some(dma::QueueStatus::Stopped(reason)) = status else {
        panic!("queue not stopped: {status:?}");
    };
    assert!(
        reason.contains("TX length 8 bytes != RX length 4 bytes"),
        "{reason}"
    );
}

#[test]
fn out_of_bounds_sources_and_destinations_abort_with_oob() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    b.claim(1);
    let nq = a.nq(0, 16);
    let mine = a.alloc(MemLocation::Host, 4 * KIB);
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    theirs.write(0, b"secret");
    mine.write(0, b"public");
    let semaphore = register(&dev, Register::SemaphoreSet { nc: 0, index: 0 });
    let cases = [
        ("raw small PA as source", 0x1000, mine.pa),
        ("raw small PA as destination", mine.pa, 0x1000),
        ("another client's chunk as source", theirs.pa, mine.pa + 64),
        ("another client's chunk as destination", mine.pa, theirs.pa),
        ("a register as source", semaphore, mine.pa),
        ("a hole in the register window", mine.pa, REG_WINDOW_BASE),
        ("past the end of a chunk", mine.pa + 4094, mine.pa + 64),
    ];
    for (queue, (what, src, dst)) in (0u32..).zip(cases) {
        let mut q = Queue::new(&a, 0, 1, queue, 32);
        q.push(src, dst, 6);
        q.start(&a, 1);
        let status = lock(&dev.core.ncs[0].state)
            .queues
            .status(1, queue)
            .cloned();
        assert!(
            matches!(status, Some(dma::QueueStatus::Stopped(_))),
            "{what}: {status:?}"
        );
    }
    let posted = entries(&nq, 16);
    assert_eq!(posted.len(), cases.len());
    for (entry, (what, ..)) in posted.iter().zip(cases) {
        assert_eq!(
            entry.error_flags,
            error_flags::DMA_ABORT | error_flags::OOB,
            "{what}"
        );
    }
    assert_eq!(theirs.read(0, 6), b"secret");
    assert_eq!(mine.read(64, 6), [0; 6]);
    assert_eq!(
        b.counters(1).dma_aborts,
        0,
        "the other client is unaffected"
    );
}

#[test]
fn a_dma_write_to_a_semaphore_increment_register_adds_to_it() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let fds = a.claim(0);
    let window = SharedChunk::map_fd(&fds[0], 0, SEM_WINDOW_SIZE, false).unwrap();
    let words = a.alloc(MemLocation::Host, 4 * KIB);
    words.write(0, &5u32.to_le_bytes());
    words.write(4, &2u32.to_le_bytes());
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: 3,
        value: 10,
    });
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    q.push(
        words.pa,
        register(&dev, Register::SemaphoreIncrement { nc: 0, index: 3 }),
        4,
    );
    q.push(
        words.pa + 4,
        register(&dev, Register::SemaphoreDecrement { nc: 0, index: 3 }),
        4,
    );
    q.push(
        words.pa,
        register(&dev, Register::Event { nc: 0, index: 9 }),
        4,
    );
    q.start(&a, 3);
    assert_eq!(a.semaphore(0, 3), 13);
    let in_window = window
        .load_u32(SEM_WINDOW_SEMAPHORES as u64 + 12, Ordering::Acquire)
        .unwrap();
    assert_eq!(in_window, 13, "the client's read-only window sees it");
    assert_eq!(
        a.call(Request::EventGet { nc: 0, index: 9 }),
        Reply::Value(5)
    );
    let counters = a.counters(0);
    assert_eq!(counters.register_writes, 3);
    assert_eq!(counters.dma_descriptors, 3);
}

#[test]
fn register_writes_that_break_rules_abort() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    b.claim(1);
    let nq = a.nq(0, 8);
    let words = a.alloc(MemLocation::Host, 4 * KIB);
    words.write(0, &1u32.to_le_bytes());
    let cases = [
        (
            Register::SemaphoreRead { nc: 0, index: 0 },
            4,
            error_flags::DMA_ABORT,
        ),
        (
            Register::SemaphoreIncrement { nc: 0, index: 0 },
            8,
            error_flags::DMA_ABORT,
        ),
        (
            Register::SemaphoreIncrement { nc: 1, index: 0 },
            4,
            error_flags::DMA_ABORT | error_flags::OOB,
        ),
        (
            Register::TxTailIncrement {
                nc: 1,
                engine: 0,
                queue: 0,
            },
            4,
            error_flags::DMA_ABORT | error_flags::OOB,
        ),
        (
            Register::RxTailIncrement {
                nc: 0,
                engine: 9,
                queue: 9,
            },
            4,
            error_flags::DMA_ABORT,
        ),
    ];
    for (queue, (reg, len, _)) in (0u32..).zip(cases) {
        let mut q = Queue::new(&a, 0, 0, queue, 32);
        q.push(words.pa, register(&dev, reg), len);
        q.start(&a, 1);
    }
    let flags: Vec<u32> = entries(&nq, 8).iter().map(|e| e.error_flags).collect();
    let expected: Vec<u32> = cases.iter().map(|c| c.2).collect();
    assert_eq!(flags, expected);
    assert_eq!(
        b.semaphore(1, 0),
        0,
        "another client's semaphore is untouched"
    );
    assert_eq!(a.semaphore(0, 0), 0);
}

#[test]
fn a_dma_write_into_tail_increment_registers_starts_another_queue() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    a.claim(1);
    let data = a.alloc(MemLocation::Host, 4 * KIB);
    let out = a.alloc(MemLocation::Host, 4 * KIB);
    data.write(0, &2u32.to_le_bytes());
    data.write(64, b"started by a register write");
    // Queues B (same NC) and C (NC 1) each hold two copies that nobody posts by message.
    let mut b = Queue::new(&a, 0, 4, 1, 32);
    b.push(data.pa + 64, out.pa, 16);
    b.push(data.pa + 80, out.pa + 16, 11);
    let mut c = Queue::new(&a, 1, 0, 0, 32);
    c.push(data.pa + 64, out.pa + 256, 27);
    c.push(data.pa + 64, out.pa + 512, 1);
    // Queue A posts both of B's rings, RX first as the driver does, then both of C's.
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    let (b_tx, b_rx) = b.tail_registers();
    let (c_tx, c_rx) = c.tail_registers();
    for reg in [b_rx, b_tx, c_rx, c_tx] {
        q.push(data.pa, register(&dev, reg), 4);
    }
    q.start(&a, 4);
    assert_eq!(out.read(0, 27), b"started by a register write");
    assert_eq!(out.read(256, 27), b"started by a register write");
    assert_eq!(out.read(512, 1), b"s");
    assert_eq!(a.counters(0).dma_descriptors, 4 + 2);
    assert_eq!(a.counters(0).register_writes, 4);
    assert_eq!(a.counters(1).dma_descriptors, 2);
}

/// One 4-pair unit of a queue that keeps itself running forever: two copies rewrite the unit
/// before it (already consumed) with its descriptors for their next pass, then two register
/// writes post 4 more descriptors on each ring. `tmpl` holds every unit's descriptors for every
/// ring id (TX at +0, RX at +0x800); the word 4 sits at +0x1000.
fn self_rearming_unit(
    dev: &Device,
    q: &Queue,
    tmpl: u64,
    ring_id: u8,
    slot: u32,
) -> [(UdmaDesc, UdmaDesc); 4] {
    let prev = (slot + 28) % 32;
    let next_use = if slot >= 4 {
        (ring_id + 1) % 4
    } else {
        ring_id
    };
    let at = |rid: u8, slot: u32| (u64::from(rid) * 32 + u64::from(slot)) * 16;
    let rid = RingId::new(ring_id).unwrap();
    let pair = |src, dst, len| m2m_copy_descriptors(src, dst, len, rid, false).unwrap();
    let (tx_tail, rx_tail) = q.tail_registers();
    [
        pair(
            tmpl + at(next_use, prev),
            q.tx.pa + u64::from(prev) * 16,
            64,
        ),
        pair(
            tmpl + 0x800 + at(next_use, prev),
            q.rx.pa + u64::from(prev) * 16,
            64,
        ),
        pair(tmpl + 0x1000, register(dev, tx_tail), 4),
        pair(tmpl + 0x1000, register(dev, rx_tail), 4),
    ]
}

#[test]
fn a_self_re_arming_queue_is_stopped_by_the_doorbell_budget() {
    let dev = device().with_dma_budget(10_000, u64::MAX);
    let a = Client::new(&dev, 10);
    a.claim(0);
    let nq = a.nq(0, 4);
    let tmpl = a.alloc(MemLocation::Host, 8 * KIB);
    let q = Queue::new(&a, 0, 0, 0, 32);
    tmpl.write(0x1000, &4u32.to_le_bytes());
    for ring_id in 0..4u8 {
        for slot in (0..32).step_by(4) {
            for (i, (tx, rx)) in (0u64..).zip(self_rearming_unit(&dev, &q, tmpl.pa, ring_id, slot))
            {
                let at = (u64::from(ring_id) * 32 + u64::from(slot) + i) * 16;
                tmpl.write(at, &tx.to_le_bytes());
                tmpl.write(0x800 + at, &rx.to_le_bytes());
                if ring_id == RingId::INITIAL.value() {
                    let ring_at = (u64::from(slot) + i) * 16;
                    q.tx.write(ring_at, &tx.to_le_bytes());
                    q.rx.write(ring_at, &rx.to_le_bytes());
                }
            }
        }
    }
    q.start(&a, 4);
    let counters = a.counters(0);
    assert_eq!(counters.dma_descriptors, 10_000, "exactly the budget ran");
    assert_eq!(counters.dma_aborts, 1);
    let posted = entries(&nq, 4);
    assert_eq!(posted.len(), 1);
    assert_eq!(posted[0].error_flags, error_flags::DMA_ABORT);
    let status = lock(&dev.core.ncs[0].state).queues.status(0, 0).cloned();
    let Some(dma::QueueStatus::Stopped(reason)) = status else {
        panic!("queue not stopped: {status:?}");
    };
    assert!(
        reason.contains("budget of 10000 descriptor pairs"),
        "{reason}"
    );
}

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
fn a_gone_client_loses_its_ncs_memory_and_queues() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let fds = a.claim(0);
    a.nq(0, 4);
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: 1,
        value: 9,
    });
    let hbm = a.alloc(MemLocation::Hbm { nc: 0 }, 16 * MIB);
    let q = Queue::new(&a, 0, 0, 0, 32);
    drop(q);
    dev.disconnect(a.id);
    assert_eq!(read(&dev.core.memory).chunk_count(), 0);
    let old_window = SharedChunk::map_fd(&fds[0], 0, SEM_WINDOW_SIZE, false).unwrap();
    assert_eq!(
        old_window
            .load_u32(SEM_WINDOW_SEMAPHORES as u64 + 4, Ordering::Acquire)
            .unwrap(),
        0,
        "the old window was zeroed"
    );

    let b = Client::new(&dev, 11);
    b.claim(0);
    assert_eq!(b.semaphore(0, 1), 0);
    let again = b.alloc(MemLocation::Hbm { nc: 0 }, 16 * MIB);
    assert_eq!(again.pa, hbm.pa, "the whole HBM is free again");
    assert_eq!(
        b.refused(Request::DmaQueueCopyStart {
            nc: 0,
            engine: 0,
            queue: 0,
            tx_desc_count: 1,
            rx_desc_count: 1
        })
        .kind,
        ErrorKind::QueueStopped,
        "the queue was forgotten"
    );
}

#[test]
fn nc_reset_zeroes_registers_and_forgets_queues() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(1);
    a.nq(1, 4);
    a.ok(Request::SemaphoreWrite {
        nc: 1,
        index: 3,
        value: 7,
    });
    a.ok(Request::EventSet {
        nc: 1,
        index: 1,
        value: 1,
    });
    let q = Queue::new(&a, 1, 2, 2, 32);
    a.ok(Request::NcReset { nc: 1 });
    assert_eq!(a.semaphore(1, 3), 0);
    assert_eq!(
        a.call(Request::EventGet { nc: 1, index: 1 }),
        Reply::Value(0)
    );
    assert_eq!(
        a.refused(q.start_request(1, 1)).kind,
        ErrorKind::QueueStopped
    );
    assert_eq!(a.counters(1).resets, 1);
    // Still the owner after a reset.
    a.ok(Request::SemaphoreWrite {
        nc: 1,
        index: 3,
        value: 1,
    });
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
fn claims_are_exclusive_and_repeatable_by_the_owner() {
    let dev = device();
    let a = Client::new(&dev, 4242);
    let b = Client::new(&dev, 11);
    a.claim(0);
    a.claim(0);
    let busy = b.refused(Request::ClaimNc { nc: 0 });
    assert_eq!(busy.kind, ErrorKind::NcBusy);
    assert!(busy.message.contains("NC 0"), "{}", busy.message);
    assert!(busy.message.contains("pid 4242"), "{}", busy.message);
    assert_eq!(
        b.refused(Request::ReleaseNc { nc: 0 }).kind,
        ErrorKind::NotOwner
    );
    a.ok(Request::ReleaseNc { nc: 0 });
    b.claim(0);
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
