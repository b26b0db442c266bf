//! Ownership, in-process: claims, a gone client's reclaim, and NC reset.

use std::sync::atomic::Ordering;

use shared::address_map::{SEM_WINDOW_SEMAPHORES, SEM_WINDOW_SIZE};
use shared::memory::SharedChunk;
use shared::protocol::{ErrorKind, MemLocation, Reply, Request};

use crate::device::test_utils::*;
use crate::device::*;
use crate::trace::Detail;

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
    // A doorbell (SemaphoreIncrement) of another client's NC, or of an NC nobody claimed, is
    // refused naming why, and changes nothing.
    let foreign = b.refused(Request::SemaphoreIncrement {
        nc: 0,
        index: 2,
        value: 5,
    });
    assert_eq!(foreign.kind, ErrorKind::NotOwner);
    assert!(foreign.message.contains("pid 4242"), "{}", foreign.message);
    let unclaimed = b.refused(Request::SemaphoreIncrement {
        nc: 1,
        index: 2,
        value: 5,
    });
    assert_eq!(unclaimed.kind, ErrorKind::NotOwner);
    assert!(
        unclaimed.message.contains("ClaimNc"),
        "{}",
        unclaimed.message
    );
    assert_eq!(a.semaphore(0, 2), 0);
    a.ok(Request::SemaphoreIncrement {
        nc: 0,
        index: 2,
        value: 5,
    });
    assert_eq!(a.semaphore(0, 2), 5, "the owner's increment lands");
    assert_ne!(
        a.refused(Request::SemaphoreIncrement {
            nc: 0,
            index: u32::MAX,
            value: 1,
        })
        .kind,
        ErrorKind::NotOwner,
        "an index outside the window is the owner's range error"
    );
    a.ok(Request::ReleaseNc { nc: 0 });
    b.claim(0);
}

/// A client connected with a checkable [`Peer`] on one end of a socket pair; dropping the
/// returned end is the process dying (the kernel closes its sockets before it can be reaped).
fn peer_client(dev: &Device) -> (Client<'_>, std::os::fd::OwnedFd) {
    let (ours, theirs) = shared::fd_passing::seqpacket_pair().unwrap();
    let id = dev.connect_peer(crate::client::Peer::new(std::process::id(), ours));
    (Client { dev, id }, theirs)
}

#[test]
fn a_claim_reclaims_a_gone_owner_at_once_and_a_live_owner_still_refuses() {
    let dev = device();
    let (a, a_end) = peer_client(&dev);
    a.claim(0);
    a.ok(Request::SemaphoreWrite {
        nc: 0,
        index: 2,
        value: 5,
    });
    a.alloc(MemLocation::Hbm { nc: 0 }, MIB);
    let b = Client::new(&dev, 11);
    let busy = b.refused(Request::ClaimNc { nc: 0 });
    assert_eq!(busy.kind, ErrorKind::NcBusy, "a live owner keeps its NC");

    // The owner dies; its connection thread has not reclaimed it yet. (A process another test
    // forks holds a copy of `a_end` until it execs: retry for that moment.)
    drop(a_end);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while matches!(b.call(Request::ClaimNc { nc: 0 }), Reply::Error(_)) {
        assert!(
            std::time::Instant::now() < deadline,
            "the gone owner was not reclaimed"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(
        dev.counters(0).unwrap().resets >= 1,
        "the reclaim reset NC 0"
    );
    assert_eq!(b.semaphore(0, 2), 0, "the dead owner's state is gone");
    assert_eq!(read(&dev.core.memory).chunk_count(), 0, "and its memory");
    assert_eq!(dev.stats().clients, 1, "and the client itself");
    // The connection thread's own disconnect, later, finds nothing left to take.
    dev.disconnect(a.id);
    assert_eq!(b.semaphore(0, 2), 0);
    b.ok(Request::SemaphoreWrite {
        nc: 0,
        index: 2,
        value: 1,
    });
    assert_eq!(b.semaphore(0, 2), 1, "the new owner keeps NC 0");
}

#[test]
fn every_reset_counts_release_and_reclaim_included() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    a.claim(1);
    a.ok(Request::NcReset { nc: 0 });
    assert_eq!(a.counters(0).resets, 1);
    a.ok(Request::ReleaseNc { nc: 0 });
    assert_eq!(a.counters(0).resets, 2, "a release resets the NC");
    assert_eq!(a.counters(1).resets, 0);
    dev.disconnect(a.id);
    assert_eq!(
        dev.counters(1).unwrap().resets,
        1,
        "a gone client's NC is reset"
    );
}

#[test]
fn a_reset_takes_its_modelled_device_time() {
    let dev = device();
    let a = Client::new(&dev, 10);
    a.claim(0);
    a.ok(Request::SetLatency(shared::protocol::LatencyModel {
        per_execution_ns: 1_000,
        per_nc_reset_ns: 250_000,
        ..Default::default()
    }));
    a.ok(Request::NcReset { nc: 0 });
    a.ok(Request::NcReset { nc: 0 });
    assert_eq!(dev.core.ncs[0].clock.now(), 500_000);
    assert_eq!(dev.core.ncs[1].clock.now(), 0);
}

#[test]
fn clients_lists_the_processes_holding_ncs_or_memory_with_what_they_said_of_themselves() {
    let dev = device();
    let me = std::process::id();
    let a = Client::new(&dev, me);
    let b = Client::new(&dev, 4_000_000);
    let idle = Client::new(&dev, 4_000_001);
    a.ok(Request::Identify {
        runtime_version: "2.0.0 test".into(),
    });
    a.claim(1);
    a.claim(0);
    let _mem = b.alloc(MemLocation::Host, 16 * MIB);
    let _nq = a.alloc(MemLocation::Hbm { nc: 1 }, MIB);
    let Reply::Clients(list) = idle.call(Request::Clients) else {
        panic!("Clients answers Reply::Clients")
    };
    assert_eq!(list.len(), 2, "the idle client holds nothing: {list:?}");
    let first = &list[0];
    assert_eq!(first.pid, me);
    assert_eq!(first.ncs, vec![0, 1]);
    assert_eq!(first.runtime_version, "2.0.0 test");
    let own = std::fs::read(format!("/proc/{me}/cmdline")).unwrap();
    let program = String::from_utf8_lossy(own.split(|&c| c == 0).next().unwrap()).into_owned();
    assert!(first.command.starts_with(&program), "{}", first.command);
    assert_eq!(first.memory_bytes, MIB);
    let second = &list[1];
    assert_eq!((second.pid, second.ncs.clone()), (4_000_000, vec![]));
    assert_eq!(second.memory_bytes, 16 * MIB);
    assert_eq!(second.runtime_version, "", "b never identified itself");
    dev.disconnect(a.id);
    let Reply::Clients(list) = idle.call(Request::Clients) else {
        panic!("Clients answers Reply::Clients")
    };
    assert_eq!(
        list.iter().map(|c| c.pid).collect::<Vec<_>>(),
        vec![4_000_000]
    );
}
fn doorbell(client: &Client<'_>, nc: u32, value: u32) {
    // Semaphore 5 is not the inference-start semaphore: a doorbell the trace records and
    // nothing executes.
    client.dev.handle(
        client.id,
        Request::SemaphoreIncrement {
            nc,
            index: 5,
            value,
        },
    );
}

fn drain(client: &Client<'_>) -> (Vec<shared::device_trace::Event>, u64) {
    let mut all = Vec::new();
    let mut dropped_total = 0;
    loop {
        match client.call(Request::TraceDrain) {
            Reply::TraceEvents {
                events,
                dropped,
                more,
                ..
            } => {
                all.extend(events);
                dropped_total += dropped;
                if !more {
                    return (all, dropped_total);
                }
            }
            other => panic!("TraceDrain was answered {other:?}"),
        }
    }
}

#[test]
fn a_trace_drain_returns_only_the_clients_own_ncs_events() {
    let dev = device();
    assert!(!dev.core.tracer.enabled(), "no --trace: nothing recorded");
    let (a, b) = (Client::new(&dev, 100), Client::new(&dev, 200));
    a.claim(0);
    b.claim(1);
    doorbell(&a, 0, 1); // before any subscription: not held
    let Reply::TraceSubscribed { ncs, clock } =
        a.call(Request::TraceSubscribe { max_events: 1000 })
    else {
        panic!("TraceSubscribe refused");
    };
    assert_eq!(ncs, [0]);
    assert!(!clock.simulated && clock.origin_monotonic_ns > 0);
    assert!(dev.core.tracer.enabled());
    b.call(Request::TraceSubscribe { max_events: 1000 });
    doorbell(&a, 0, 2);
    doorbell(&b, 1, 3);
    doorbell(&b, 1, 4);
    let (ea, _) = drain(&a);
    let (eb, _) = drain(&b);
    let values = |events: &[shared::device_trace::Event], nc: u32| -> Vec<u32> {
        events
            .iter()
            .map(|e| match e.detail {
                Detail::Doorbell { value, .. } if e.nc == nc => value,
                _ => panic!("an event of another NC or kind leaked: {e:?}"),
            })
            .collect()
    };
    assert_eq!(values(&ea, 0), [2]);
    assert_eq!(values(&eb, 1), [3, 4]);
    assert!(drain(&a).0.is_empty(), "a drain takes the events");
    // A release ends the subscription: the NC's next owner's events never reach `a`.
    a.ok(Request::ReleaseNc { nc: 0 });
    let c = Client::new(&dev, 300);
    c.claim(0);
    doorbell(&c, 0, 9);
    assert!(drain(&a).0.is_empty());
    assert!(drain(&c).0.is_empty(), "c did not subscribe");
}

#[test]
fn a_subscription_is_bounded_and_drains_in_messages_that_fit() {
    let dev = device();
    let a = Client::new(&dev, 100);
    a.claim(0);
    a.call(Request::TraceSubscribe { max_events: 500 });
    for v in 0..600 {
        doorbell(&a, 0, v);
    }
    let mut messages = 0;
    let mut events = Vec::new();
    let mut dropped = 0;
    loop {
        let request = Request::TraceDrain;
        let (reply, _) = dev.handle(a.id, request);
        let mut buf = [0u8; shared::protocol::MAX_MSG_SIZE];
        let n = shared::protocol::encode(&reply, &mut buf).expect("the reply fits one message");
        let decoded: Reply = shared::protocol::decode(&buf[..n]).expect("the client decodes it");
        assert_eq!(decoded, reply);
        messages += 1;
        let Reply::TraceEvents {
            events: e,
            dropped: d,
            more,
            ..
        } = reply
        else {
            panic!("refused");
        };
        events.extend(e);
        dropped += d;
        if !more {
            break;
        }
    }
    assert_eq!((events.len(), dropped), (500, 100));
    assert!(messages > 1, "500 events do not fit one message");
    let first: Vec<u32> = events
        .iter()
        .take(3)
        .map(|e| match e.detail {
            Detail::Doorbell { value, .. } => value,
            _ => u32::MAX,
        })
        .collect();
    assert_eq!(first, [0, 1, 2], "oldest first");
}
