//! The implicit-async pool against the emulated device in-process: completions in posting
//! order, the model-switch decision as the device sees it, and poisoning on a failed doorbell.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::NrtStatus;

use crate::builder::{identity, identity_with_collectives};
use crate::config::RuntimeConfig;
use crate::test_support::{Rig, io, load, pattern};

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
