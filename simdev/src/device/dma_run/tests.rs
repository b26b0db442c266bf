//! DMA runs, in-process: copies, ring wraps, aborts, register writes and the budget.

use std::sync::atomic::Ordering;

use shared::address_map::{REG_WINDOW_BASE, Register, SEM_WINDOW_SEMAPHORES, SEM_WINDOW_SIZE};
use shared::memory::SharedChunk;
use shared::notification::{NotificationKind, error_flags};
use shared::protocol::{ErrorKind, MemLocation, Reply, Request};
use shared::udma::{RingId, UdmaDesc, m2m_copy_descriptors};

use super::*;
use crate::device::test_utils::*;
use crate::device::*;
use crate::dma;

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

/// A run's bus keeps one NC's SBUF locked from pair to pair and lets it go before any other
/// lock (a chunk's resolution, a register or DMEM write, another NC's SBUF) and when dropped;
/// a per-access bus never keeps it.
#[test]
fn a_run_bus_holds_one_sbuf_lock_and_lets_it_go_before_any_other_lock() {
    use crate::dma::Bus;
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    a.claim(1);
    let host = a.alloc(MemLocation::Host, 4 * KIB);
    let core = &dev.core;
    let held = |nc: usize| core.ncs[nc].compute.try_lock().is_err();
    let write = |bus: &mut ClientBus<'_>, nc: u32| {
        bus.with_sbuf_mut((nc, 3, 16), 8, |slot| slot.copy_from_slice(&[7; 8]))
            .unwrap();
    };
    let read =
        |bus: &ClientBus<'_>, nc: u32| bus.with_sbuf((nc, 3, 16), 8, <[u8]>::to_vec).unwrap();
    let mut worklist = VecDeque::new();
    let mut bus = ClientBus::for_run(core, a.id, &mut worklist);
    write(&mut bus, 0);
    assert!(held(0), "kept for the next pair");
    assert_eq!(read(&bus, 0), [7; 8], "the held lock serves the next pair");
    assert!(held(0));
    assert!(bus.resolve(host.pa, 16).is_some());
    assert!(!held(0), "let go before the address space's lock");
    write(&mut bus, 0);
    read(&bus, 1);
    assert!(!held(0) && held(1), "one NC's at a time");
    let reg = Register::SemaphoreIncrement { nc: 1, index: 9 };
    bus.write_register(reg, 1).unwrap();
    assert!(!held(1), "let go before a register write");
    write(&mut bus, 1);
    bus.write_dmem(1, 0, &[1, 2, 3, 4]).unwrap();
    assert!(!held(1), "let go before the DMEM's lock");
    write(&mut bus, 1);
    drop(bus);
    assert!(!held(1), "let go when the run ends");

    let mut bus = ClientBus::new(core, a.id, &mut worklist);
    write(&mut bus, 0);
    assert!(!held(0), "a per-access bus keeps nothing");
    assert_eq!(read(&bus, 0), [7; 8]);
    assert!(!held(0));
}
