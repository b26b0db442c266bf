//! The implicit-async pool (seed 000 §6, seed 004 §7): immediate return, completion callback,
//! drain, in-flight backpressure, host tensors refused, and exclusivity with the XU ring.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runtime::builder::{identity, never_ending};
use runtime::config::RuntimeConfig;
use runtime::{Device, Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::Target;
use tests::{connect, start_simdev};

fn pool(
    max_inflight: u32,
) -> (
    Runtime,
    Arc<runtime::backend::sim::SimDevice>,
    runtime::backend::sim::PrivateSimdev,
) {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        async_max_inflight: max_inflight,
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
    (rt, dev, sim)
}

#[test]
fn executions_return_at_once_and_complete_through_the_callback() {
    let (rt, _dev, _sim) = pool(4);
    assert!(rt.implicit_async());
    let m = rt
        .load(&identity(1024).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    rt.register_async_exec_callback(Arc::new(move |model, vnc, job, status| {
        s2.lock().unwrap().push((model, vnc, job, status))
    }))
    .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 1024, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 1024, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    i.write(&[0xC3; 1024], 0).unwrap();
    for _ in 0..20 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    // Streaming: the output's completion count reaches 20 without a drain.
    o.wait_output_completion(20, Some(Duration::from_secs(20)))
        .unwrap();
    rt.async_drain(0);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 20);
    assert!(
        seen.iter()
            .enumerate()
            .all(|(k, &(model, vnc, job, st))| model == m.id
                && vnc == 0
                && job == k as u64
                && st == NrtStatus::Success)
    );
    let mut out = [0u8; 1024];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, [0xC3; 1024]);
    rt.close();
}

#[test]
fn host_tensors_are_refused_and_the_xu_ring_is_off() {
    let (rt, _dev, _sim) = pool(2);
    let m = rt
        .load(&identity(64).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let h = rt.tensor_allocate(Placement::Host, 64, "h").unwrap();
    let d = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "d")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &h);
    outs.add("output", &d);
    let e = rt.execute(m, &ins, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert_eq!(
        e.message,
        "Async exec mode only supports device allocated tensors"
    );
    let mut dev_in = TensorSet::new();
    dev_in.add("input", &d);
    assert_eq!(
        rt.execute_schedule(m, &dev_in, &outs).unwrap_err().status,
        NrtStatus::Invalid,
        "explicit async needs the XU ring"
    );
    rt.close();
}

#[test]
fn the_inflight_limit_holds_back_a_third_request() {
    let (rt, dev, _sim) = pool(2);
    let m = rt
        .load(&never_ending(11).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 1, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 1, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let doorbells = || dev.nc_counters(0).unwrap().doorbells;
    let before = doorbells();
    rt.execute(m, &ins, &outs).unwrap();
    // Staged and rung inline under work_queue_lock (seed 000 §6), not later by a worker: the
    // doorbell has reached simdev before execute returns (the counters query is ordered after
    // it on the same socket), although the execution never ends.
    assert_eq!(
        doorbells(),
        before + 1,
        "the first doorbell rang inside execute"
    );
    rt.execute(m, &ins, &outs).unwrap();
    assert_eq!(
        doorbells(),
        before + 2,
        "the second doorbell rang inside execute"
    );
    let third_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            rt.execute(m, &ins, &outs).unwrap();
            third_done.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !third_done.load(Ordering::SeqCst),
            "two in flight: the third post waits"
        );
        dev.event_set(0, 11, 1).unwrap();
    });
    assert!(third_done.load(Ordering::SeqCst));
    rt.async_drain(0);
    assert_eq!(
        rt.metrics()
            .snapshot(0)
            .unwrap()
            .executions_with(NrtStatus::Success),
        3,
        "per-TPB metrics come from the pool too"
    );
    assert_eq!(dev.nc_counters(0).unwrap().executions, 3);
    rt.close();
}

#[test]
fn tensor_reads_wait_for_the_queued_executions_that_use_them() {
    let (rt, _dev, _sim) = pool(8);
    let m = rt
        .load(&identity(4096).to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    for k in 0..50u8 {
        i.write(&[k; 4096], 0).unwrap(); // waits until the previous execution read it
        rt.execute(m, &ins, &outs).unwrap(); // returns at once
        let mut out = [0u8; 4096];
        o.read(&mut out, 0).unwrap(); // waits for this execution
        assert_eq!(
            out, [k; 4096],
            "execution {k}: read before the execution finished"
        );
    }
    rt.close();
}

/// Loads `model` on core 0 and returns it with device I/O tensors of `bytes` bytes.
fn load_with_io(
    rt: &Runtime,
    model: &shared::model::Model,
    bytes: u64,
) -> (runtime::ModelHandle, TensorSet, TensorSet) {
    let m = rt
        .load(&model.to_container(Target::Simdev).unwrap(), 0)
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, bytes, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    (m, ins, outs)
}

#[test]
fn the_pool_decides_model_switches_and_counts_consecutive_executions() {
    // A, A, B, A: do_model_switch 1, 0, 1, 1 (simdev fails a request that claims no switch but
    // runs another model's programs), consecutive_model_counter 1, 2, 1, 1.
    let (rt, dev, _sim) = pool(4);
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let s2 = statuses.clone();
    rt.register_async_exec_callback(Arc::new(move |_, _, _, status| {
        s2.lock().unwrap().push(status)
    }))
    .unwrap();
    let (a, a_in, a_out) = load_with_io(&rt, &identity(64), 64);
    let (b, b_in, b_out) = load_with_io(&rt, &identity(64), 64);
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
    assert_eq!(*statuses.lock().unwrap(), [NrtStatus::Success; 4]);
    assert_eq!(dev.nc_counters(0).unwrap().executions, 4);
    assert_eq!(
        rt.async_consecutive_model_counter(1),
        Some(0),
        "core 1 posted nothing"
    );
    rt.close();
}

#[test]
fn a_doorbell_failure_in_the_pool_poisons_its_core() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(tests::InterposedDevice::new(Box::new(connect(&sim))));
    let cfg = RuntimeConfig {
        async_max_inflight: 4,
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
    let (m, ins, outs) = load_with_io(&rt, &identity(64), 64);
    rt.execute(m, &ins, &outs).unwrap();
    dev.fail_next_doorbells(1);
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
    rt.close();
}

/// An execution's timeout counts from its stage, not from before the pool's wait for an
/// in-flight slot: with one slot, 800 ms executions and a 1.2 s timeout, the second waits
/// 800 ms for its slot and still has its whole timeout to run (counted from before the wait,
/// it timed out at 1.2 s, 400 ms into its run, and degraded the core).
#[test]
fn the_timeout_does_not_count_the_wait_for_an_inflight_slot() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        async_max_inflight: 1,
        exec_timeout: Duration::from_millis(1200),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
    let io = tests::bench::IdentityIo::load(&rt, 64);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    rt.register_async_exec_callback(Arc::new(move |_, _, job, status| {
        s2.lock().unwrap().push((job, status))
    }))
    .unwrap();
    dev.set_latency(shared::protocol::LatencyModel {
        per_execution_ns: 800_000_000,
        wall_clock_pacing: true,
        ..Default::default()
    })
    .unwrap();
    for _ in 0..2 {
        rt.execute(io.model, &io.inputs, &io.outputs).unwrap();
    }
    rt.async_drain(0);
    assert_eq!(
        *seen.lock().unwrap(),
        [(0, NrtStatus::Success), (1, NrtStatus::Success)]
    );
    rt.close();
}
