//! The implicit-async pool against the emulated device in-process: completions in posting
//! order, the model-switch decision as the device sees it, and poisoning on a failed doorbell.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::NrtStatus;

use crate::backend::Device;
use crate::builder::{identity, identity_with_collectives};
use crate::config::RuntimeConfig;
use crate::test_support::{Rig, gated_identity, io, load, pattern};

fn pool_config(max_inflight: u32) -> RuntimeConfig {
    RuntimeConfig {
        async_max_inflight: max_inflight,
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    }
}

#[test]
fn completions_arrive_in_posting_order_and_switches_reach_the_device() {
    // A, A, B, A of two collectives models: do_model_switch 1, 0, 1, 1, so the device runs
    // the collectives chain three times; consecutive_model_counter 1, 2, 1, 1.
    let rig = Rig::new();
    let rt = rig.runtime(pool_config(4));
    let done = Arc::new(Mutex::new(Vec::new()));
    let log = done.clone();
    rt.register_async_exec_callback(Arc::new(move |model, vnc, job, status| {
        log.lock().unwrap().push((model, vnc, job, status));
    }))
    .unwrap();
    let a = load(&rt, &identity_with_collectives(64, 256), 0);
    let b = load(&rt, &identity_with_collectives(64, 256), 0);
    let (ai, ao, a_in, a_out) = io(&rt, 64);
    let (bi, bo, b_in, b_out) = io(&rt, 64);
    ai.write(&pattern(64, 1), 0).unwrap();
    bi.write(&pattern(64, 2), 0).unwrap();
    let mut counters = Vec::new();
    for m in [a, a, b, a] {
        let (ins, outs) = if m == a {
            (&a_in, &a_out)
        } else {
            (&b_in, &b_out)
        };
        rt.execute(m, ins, outs).unwrap();
        counters.push(rt.async_consecutive_model_counter(0).unwrap());
    }
    rt.async_drain(0);
    assert_eq!(counters, [1, 2, 1, 1]);
    let done = done.lock().unwrap().clone();
    let models: Vec<u64> = done.iter().map(|d| d.0).collect();
    assert_eq!(
        models,
        [a.id, a.id, b.id, a.id],
        "completed in posting order"
    );
    let jobs: Vec<u64> = done.iter().map(|d| d.2).collect();
    assert!(jobs.windows(2).all(|w| w[0] < w[1]), "job ids {jobs:?}");
    assert!(
        done.iter().all(|d| d.1 == 0 && d.3 == NrtStatus::Success),
        "{done:?}"
    );
    let c = rig.counters(0);
    assert_eq!((c.executions, c.exec_errors), (4, 0));
    assert_eq!(c.cc_chains, 3, "one collectives chain per switch");
    let mut out = vec![0u8; 64];
    ao.read(&mut out, 0).unwrap();
    assert!(out == pattern(64, 1));
    bo.read(&mut out, 0).unwrap();
    assert!(out == pattern(64, 2));
    assert_eq!(
        rt.async_consecutive_model_counter(1),
        Some(0),
        "core 1 posted nothing"
    );
    rt.close();
}

#[test]
fn a_failed_doorbell_poisons_the_core_and_nothing_more_reaches_the_device() {
    let rig = Rig::new();
    let rt = rig.runtime(pool_config(4));
    let m = load(&rt, &identity(64), 0);
    let (_i, _o, ins, outs) = io(&rt, 64);
    rt.execute(m, &ins, &outs).unwrap();
    rig.backend.fail_next_doorbells(1);
    assert_eq!(
        rt.execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::Failure,
        "seed 000 §5: a failed doorbell is NRT_FAILURE"
    );
    for _ in 0..3 {
        assert_eq!(
            rt.execute(m, &ins, &outs).unwrap_err().status,
            NrtStatus::ExecUnitUnrecoverable
        );
    }
    rt.async_drain(0);
    assert_eq!(
        rig.backend.doorbells(),
        [0, 0],
        "nothing rung after the failure"
    );
    assert_eq!(rig.counters(0).executions, 1);
    rt.close();
}

/// The completion callback runs on its core's exec thread, which also completes the executions
/// queued behind it: a tensor read or an unload there that waits for one of them would wait for
/// itself (it hung). Both are refused, NRT_INVALID; with nothing queued behind, the read works.
#[test]
fn a_read_or_unload_in_the_callback_behind_a_queued_execution_is_refused_not_hung() {
    use std::sync::mpsc;
    let rig = Rig::new();
    let rt = Arc::new(rig.runtime(pool_config(4)));
    let m = load(&rt, &gated_identity(64, "gated", 9), 0);
    let (i, o, ins, outs) = io(&rt, 64);
    i.write(&pattern(64, 3), 0).unwrap();
    let (posted_tx, posted_rx) = mpsc::channel::<()>();
    let posted_rx = Mutex::new(posted_rx);
    let (said_tx, said_rx) = mpsc::channel();
    let said_tx = Mutex::new(said_tx);
    {
        let (rt2, o) = (Arc::downgrade(&rt), o.clone());
        rt.register_async_exec_callback(Arc::new(move |_, _, job, _| {
            let Some(rt) = rt2.upgrade() else { return };
            let mut buf = [0u8; 64];
            if job == 0 {
                // The second execution is posted (and in flight) before this reads.
                let _ = posted_rx.lock().unwrap().recv();
                let read = o.read(&mut buf, 0).map_err(|e| e.status);
                let unload = rt.unload(m).map_err(|e| e.status);
                let _ = said_tx.lock().unwrap().send((read, unload));
            } else {
                let read = o.read(&mut buf, 0).map_err(|e| e.status);
                let _ = said_tx.lock().unwrap().send((read, Ok(())));
            }
        }))
        .unwrap();
    }
    rt.execute(m, &ins, &outs).unwrap();
    rt.execute(m, &ins, &outs).unwrap();
    posted_tx.send(()).unwrap();
    rig.backend.event_set(0, 9, 1).unwrap();
    let Ok(first) = said_rx.recv_timeout(Duration::from_secs(60)) else {
        // The callback is stuck: leave its thread be rather than hang closing the runtime.
        std::mem::forget(rt);
        panic!("the first callback's read did not return within 60 s");
    };
    assert_eq!(
        first,
        (Err(NrtStatus::Invalid), Err(NrtStatus::Invalid)),
        "read and unload behind a queued execution"
    );
    rig.backend.event_set(0, 9, 1).unwrap();
    let second = said_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(second.0, Ok(()), "nothing queued behind the last one");
    rt.async_drain(0);
    let mut out = vec![0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert!(out == pattern(64, 3));
    rt.unload(m).unwrap();
    drop((i, o, ins, outs));
    Arc::into_inner(rt).unwrap().close();
}

/// An execution that waited for an in-flight slot is refused (101) when the executions it
/// waited for degraded the core: posted, it would only time out in turn.
#[test]
fn a_post_that_waited_for_a_slot_on_a_core_degraded_meanwhile_is_101() {
    let rig = Rig::new();
    let rt = rig.runtime(RuntimeConfig {
        async_max_inflight: 1,
        exec_timeout: Duration::from_millis(300),
        ..RuntimeConfig::default()
    });
    let m = load(&rt, &gated_identity(64, "gated", 9), 0);
    let (_i, _o, ins, outs) = io(&rt, 64);
    // In flight until it times out (the event is never set): that degrades the core.
    rt.execute(m, &ins, &outs).unwrap();
    let second = rt.execute(m, &ins, &outs);
    assert_eq!(
        second.map_err(|e| e.status),
        Err(NrtStatus::ExecUnitUnrecoverable)
    );
    rt.async_drain(0);
    rig.backend.event_set(0, 9, 1).unwrap();
    rt.close();
}

/// `nrt_execute` from the completion callback with every in-flight slot taken (the callback's
/// own among them) is NRT_QUEUE_FULL at once, not a wait for itself: the pool deadlocked, the
/// callback waiting for the slot it frees when it returns. With a slot free it is posted.
#[test]
fn an_execute_in_the_callback_with_every_slot_taken_is_queue_full_not_a_deadlock() {
    use std::sync::mpsc;
    let rig = Rig::new();
    let rt = Arc::new(rig.runtime(pool_config(2)));
    let m = load(&rt, &identity(64), 0);
    let (i, o, ins, outs) = io(&rt, 64);
    i.write(&pattern(64, 5), 0).unwrap();
    let (said_tx, said_rx) = mpsc::channel();
    let said_tx = Mutex::new(said_tx);
    {
        let (rt2, ins, outs) = (Arc::downgrade(&rt), ins.clone(), outs.clone());
        rt.register_async_exec_callback(Arc::new(move |_, _, job, _| {
            let Some(rt) = rt2.upgrade() else { return };
            // Each of jobs 0, 1 and 2's callbacks runs with its own slot still taken and the
            // other free: its first execute takes the free one (the next job), its second
            // finds none. Job 3's callback posts nothing.
            if job < 3 {
                let first = rt.execute(m, &ins, &outs).map_err(|e| e.status);
                let second = rt.execute(m, &ins, &outs).map_err(|e| e.status);
                let _ = said_tx.lock().unwrap().send((job, first, second));
            }
        }))
        .unwrap();
    }
    rt.execute(m, &ins, &outs).unwrap();
    let Ok((job, first, second)) = said_rx.recv_timeout(Duration::from_secs(60)) else {
        // The callback is stuck: leave its thread be rather than hang closing the runtime.
        std::mem::forget(rt);
        panic!("the callback's nrt_execute did not return within 60 s");
    };
    assert_eq!(job, 0);
    assert_eq!(
        (first, second),
        (Ok(()), Err(NrtStatus::QueueFull)),
        "the callback's first execute takes the free slot, its second finds none"
    );
    // The chain goes on (each callback gets one slot and is refused a second), then stops.
    for _ in 1..3 {
        let (_, first, second) = said_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        assert_eq!((first, second), (Ok(()), Err(NrtStatus::QueueFull)));
    }
    rt.async_drain(0);
    let mut out = vec![0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert!(out == pattern(64, 5));
    rt.unload(m).unwrap();
    drop((i, o, ins, outs));
    Arc::into_inner(rt).unwrap().close();
}
