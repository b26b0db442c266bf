//! The chunk cache and the O(1) ownership check of DMA runs (issue 17, target 3): steady-state
//! DMA makes no address-space search, and nothing a cache could remember outlives a free, a
//! re-allocation at the same PA by another client, or a change of an NC's owner. Also the
//! allocation counts of the doorbell, DMA-run and notification paths (target 2).

use shared::address_map::Register;
use shared::notification::{NotificationKind, error_flags};
use shared::protocol::{MemLocation, Request};

use super::*;
use crate::alloc_count::counting;
use crate::device::test_utils::*;
use crate::device::*;

/// B-tree searches of the device's address space so far.
fn searches(dev: &Device) -> u64 {
    read(&dev.core.memory).searches()
}

/// Copies `len` bytes `src` → `dst` through `q` (one pair, one doorbell).
fn copy(a: &Client<'_>, q: &mut Queue, src: u64, dst: u64, len: u64) {
    q.push(src, dst, len);
    q.start(a, 1);
}

#[test]
fn steady_state_dma_searches_the_address_space_zero_times() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let src = a.alloc(MemLocation::Hbm { nc: 0 }, 64 * KIB);
    let dst = a.alloc(MemLocation::Host, 64 * KIB);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    copy(&a, &mut q, src.pa, dst.pa, 64);
    let warm = searches(&dev);
    assert!(warm > 0, "the first run resolved through the address space");
    for n in 0..200u64 {
        let offset = (n % 16) * 4 * KIB;
        src.write(offset, &n.to_le_bytes());
        copy(&a, &mut q, src.pa + offset, dst.pa + offset, 8);
        assert_eq!(dst.read(offset, 8), n.to_le_bytes());
    }
    assert_eq!(
        searches(&dev) - warm,
        0,
        "200 DMA runs (6 ring passes) after warm-up resolved every pair from the cache"
    );
    assert_eq!(a.counters(0).dma_descriptors, 201);
    assert_eq!(a.counters(0).dma_aborts, 0);
}

/// Sixteen executions in flight copy from sixteen input tensors to sixteen output tensors,
/// each its own chunk: more chunks than a run's last two lookups, all cached at once.
#[test]
fn steady_state_dma_cycling_over_32_tensors_searches_the_address_space_zero_times() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let inputs: Vec<_> = (0..16)
        .map(|_| a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB))
        .collect();
    let outputs: Vec<_> = (0..16)
        .map(|_| a.alloc(MemLocation::Hbm { nc: 0 }, 4 * KIB))
        .collect();
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    for (i, o) in inputs.iter().zip(&outputs) {
        copy(&a, &mut q, i.pa, o.pa, 64);
    }
    let warm = searches(&dev);
    for n in 0..64u64 {
        let k = (n % 16) as usize;
        inputs[k].write(0, &n.to_le_bytes());
        copy(&a, &mut q, inputs[k].pa, outputs[k].pa, 8);
        assert_eq!(outputs[k].read(0, 8), n.to_le_bytes());
    }
    assert_eq!(
        searches(&dev) - warm,
        0,
        "64 DMA runs over 16 tensor pairs after warm-up resolved every pair from the cache"
    );
    assert_eq!(a.counters(0).dma_aborts, 0);
}

#[test]
fn a_chunk_freed_after_the_cache_saw_it_is_refused() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let nq = a.nq(0, 8);
    let src = a.alloc(MemLocation::Host, 4 * KIB);
    let dst = a.alloc(MemLocation::Host, 4 * KIB);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    for _ in 0..3 {
        copy(&a, &mut q, src.pa, dst.pa, 16);
    }
    a.ok(Request::MemFree { handle: dst.handle });
    copy(&a, &mut q, src.pa, dst.pa, 16);
    let posted = entries(&nq, 8);
    assert_eq!(posted.len(), 1, "a use after free stopped the queue");
    assert_eq!(
        posted[0].error_flags,
        error_flags::DMA_ABORT | error_flags::OOB
    );
    let state = lock(&dev.core.ncs[0].state);
    let Some(dma::QueueStatus::Stopped(reason)) = state.queues.status(0, 0) else {
        panic!("the queue runs on");
    };
    assert!(reason.contains("RX destination"), "{reason}");

    // The same through the source side.
    drop(state);
    let mut q2 = Queue::new(&a, 0, 0, 1, 32);
    let out = a.alloc(MemLocation::Host, 4 * KIB);
    copy(&a, &mut q2, src.pa, out.pa, 16);
    a.ok(Request::MemFree { handle: src.handle });
    copy(&a, &mut q2, src.pa, out.pa + 2048, 16);
    assert_eq!(entries(&nq, 8).len(), 2);
    assert_eq!(a.counters(0).dma_aborts, 2);
}

#[test]
fn a_chunk_re_allocated_at_the_same_pa_by_another_client_is_refused() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    let nq = a.nq(0, 8);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    let src = a.alloc(MemLocation::Host, 4 * KIB);
    let dst = a.alloc(MemLocation::Host, 4 * KIB);
    src.write(0, b"client A's data!");
    for _ in 0..3 {
        copy(&a, &mut q, src.pa, dst.pa, 16);
    }
    assert_eq!(dst.read(0, 16), b"client A's data!");
    a.ok(Request::MemFree { handle: dst.handle });
    let theirs = b.alloc(MemLocation::Host, 4 * KIB);
    assert_eq!(
        theirs.pa, dst.pa,
        "first fit placed B's chunk at the freed PA"
    );
    copy(&a, &mut q, src.pa, dst.pa, 16);
    assert_eq!(theirs.read(0, 16), [0; 16], "nothing reached B's chunk");
    assert_eq!(entries(&nq, 8).len(), 1, "A's queue stopped");

    // A source at the PA A used before: B's chunk is not readable by A.
    theirs.write(0, b"client B secret!");
    let mut q2 = Queue::new(&a, 0, 0, 1, 32);
    let out = a.alloc(MemLocation::Host, 4 * KIB);
    copy(&a, &mut q2, src.pa, out.pa, 16);
    copy(&a, &mut q2, theirs.pa, out.pa, 16);
    assert_eq!(
        out.read(0, 16),
        b"client A's data!",
        "B's bytes did not leak"
    );
    assert_eq!(entries(&nq, 8).len(), 2);
}

#[test]
fn an_nc_released_or_claimed_by_another_client_between_runs_is_refused() {
    let dev = device();
    let a = Client::new(&dev, 10);
    let b = Client::new(&dev, 11);
    a.claim(0);
    a.claim(1);
    let nq = a.nq(0, 8);
    let words = a.alloc(MemLocation::Host, 4 * KIB);
    words.write(0, &1u32.to_le_bytes());
    let increment = register(&dev, Register::SemaphoreIncrement { nc: 1, index: 2 });
    let dmem = dev.address_map().dmem_address(1, 0);
    let sbuf = dev.address_map().sbuf_address(1, 0, 0);
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    for _ in 0..3 {
        copy(&a, &mut q, words.pa, increment, 4);
        copy(&a, &mut q, words.pa, dmem, 4);
        copy(&a, &mut q, words.pa, sbuf, 4);
    }
    assert_eq!(a.semaphore(1, 2), 3);

    // Released: each kind of access to NC 1 is refused (each stops a fresh queue).
    a.ok(Request::ReleaseNc { nc: 1 });
    let mut refused = 0;
    for (queue, dst) in [(1, increment), (2, dmem), (3, sbuf)] {
        let mut q = Queue::new(&a, 0, 0, queue, 32);
        copy(&a, &mut q, words.pa, dst, 4);
        refused += 1;
        assert_eq!(entries(&nq, 8).len(), refused, "dst {dst:#x} after release");
    }
    let mut q = Queue::new(&a, 0, 0, 4, 32);
    copy(&a, &mut q, sbuf, words.pa + 64, 4);
    refused += 1;
    assert_eq!(entries(&nq, 8).len(), refused, "SBUF source after release");

    // Claimed by B: still refused, and B's NC is untouched.
    b.claim(1);
    for (queue, dst) in [(5, increment), (6, dmem), (7, sbuf)] {
        let mut q = Queue::new(&a, 0, 0, queue, 32);
        copy(&a, &mut q, words.pa, dst, 4);
        refused += 1;
        assert_eq!(
            entries(&nq, 8).len(),
            refused,
            "dst {dst:#x} after B's claim"
        );
    }
    assert_eq!(b.semaphore(1, 2), 0);
    assert_eq!(lock(&dev.core.ncs[1].dmem)[..4], [0; 4]);

    // B gone (reclaimed), A claims NC 1 again: A's DMA works again.
    dev.disconnect(b.id);
    a.claim(1);
    let mut q = Queue::new(&a, 0, 0, 8, 32);
    copy(&a, &mut q, words.pa, increment, 4);
    assert_eq!(a.semaphore(1, 2), 1);
    assert_eq!(entries(&nq, 8).len(), refused);
}

#[test]
fn steady_state_doorbells_dma_runs_and_notifications_allocate_nothing() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    let nq = a.nq(0, 16);
    let words = a.alloc(MemLocation::Host, 64 * KIB);
    words.write(0, &1u32.to_le_bytes());
    let dst = a.alloc(MemLocation::Hbm { nc: 0 }, 64 * KIB);
    let other = Queue::new(&a, 0, 1, 0, 32);
    let (_, other_rx_tail) = other.tail_registers();
    let mut q = Queue::new(&a, 0, 0, 0, 32);
    // One doorbell: a copy, a DMEM write, an SBUF write, a semaphore increment, an event
    // write, and a tail increment that schedules another queue (the worklist).
    let dmem = dev.address_map().dmem_address(0, 0);
    let sbuf = dev.address_map().sbuf_address(0, 3, 0);
    let semaphore = register(&dev, Register::SemaphoreIncrement { nc: 0, index: 2 });
    let event = register(&dev, Register::Event { nc: 0, index: 4 });
    let tail = register(&dev, other_rx_tail);
    let doorbell = |q: &mut Queue| {
        q.push(words.pa, dst.pa, 4 * KIB);
        q.push(words.pa, dmem, 52);
        q.push(words.pa, sbuf, 512);
        q.push(words.pa, semaphore, 4);
        q.push(words.pa, event, 4);
        q.push(words.pa, tail, 4);
        q.start_request(6, 6)
    };
    let nc = &dev.core.ncs[0];
    let notify = || {
        let mut state = lock(&nc.state);
        let entry = dev.core.entry(nc, NotificationKind::Execution, 0, 0);
        dev.core.post(nc, &mut state, &entry);
    };
    let run = |q: &mut Queue| {
        let copy_start = doorbell(q);
        a.ok(copy_start);
        a.ok(Request::SemaphoreIncrement {
            nc: 0,
            index: 5,
            value: 1,
        });
        a.ok(Request::SemaphoreWrite {
            nc: 0,
            index: 6,
            value: 7,
        });
        a.ok(Request::EventSet {
            nc: 0,
            index: 1,
            value: 1,
        });
        notify();
    };
    for _ in 0..3 {
        run(&mut q);
        // The other queue got its RX descriptors; drain them so the ring never overruns.
        lock(&nc.state).queues.release(1, 0).unwrap();
        lock(&nc.state)
            .queues
            .init(
                1,
                0,
                (
                    read(&dev.core.memory).get(a.id, other.tx.handle).unwrap(),
                    32,
                ),
                (
                    read(&dev.core.memory).get(a.id, other.rx.handle).unwrap(),
                    32,
                ),
            )
            .unwrap();
    }
    let mut total = 0;
    for _ in 0..20 {
        let ((), n) = counting(|| run(&mut q));
        total += n;
        assert_eq!(lock(&nc.state).queues.pending(1, 0), Some((0, 1, false)));
        lock(&nc.state).queues.release(1, 0).unwrap();
        lock(&nc.state)
            .queues
            .init(
                1,
                0,
                (
                    read(&dev.core.memory).get(a.id, other.tx.handle).unwrap(),
                    32,
                ),
                (
                    read(&dev.core.memory).get(a.id, other.rx.handle).unwrap(),
                    32,
                ),
            )
            .unwrap();
        // Consume the notification so the queue never fills.
        nq.view
            .store_u32(
                nq.pa + shared::notification::NQ_HEAD_OFFSET as u64,
                u32::try_from(entries(&nq, 16).len()).unwrap(),
                std::sync::atomic::Ordering::Release,
            )
            .unwrap();
    }
    let counters = a.counters(0);
    assert_eq!(counters.dma_aborts, 0, "every pair was valid");
    assert_eq!(counters.dma_descriptors, 23 * 6);
    assert_eq!(counters.nq_overflows, 0);
    assert_eq!(a.semaphore(0, 2), 23);
    assert_eq!(
        total, 0,
        "20 doorbells (a DMA run of 6 pairs, 3 register requests and a notification each) \
         allocated"
    );
}
