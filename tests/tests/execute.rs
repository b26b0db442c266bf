//! nrt_execute end to end on the real simdev binary (seed 000, sync path): identity models of
//! many sizes, host and device tensors, the skip-config optimisation as simdev counts it, the
//! gates, bad I/O sets, injected stage/doorbell failures, a program that never ends, and the
//! one-doorbell-per-TPB hot path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use runtime::builder::{identity, identity_with, never_ending};
use runtime::config::RuntimeConfig;
use runtime::{Device, ModelHandle, Placement, Runtime, Tensor, TensorSet};
use shared::NrtStatus;
use shared::model::Target;
use tests::{InterposedDevice, connect, start_simdev};

struct Rig {
    rt: Runtime,
    dev: Arc<InterposedDevice>,
    /// The simdev child (stopped when the rig drops).
    sim: runtime::backend::sim::PrivateSimdev,
}

fn rig_with(config: RuntimeConfig) -> Rig {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = Arc::new(InterposedDevice::new(Box::new(connect(&sim))));
    let rt = Runtime::init(dev.clone(), config).expect("nrt_init");
    Rig { rt, dev, sim }
}

fn rig() -> Rig {
    rig_with(RuntimeConfig {
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    })
}

fn load(rt: &Runtime, model: &shared::model::Model, vnc: i32) -> ModelHandle {
    rt.load(&model.to_container(Target::Simdev).unwrap(), vnc)
        .expect("load")
}

fn io(rt: &Runtime, bytes: u64, placement: Placement) -> (Tensor, Tensor, TensorSet, TensorSet) {
    let i = rt.tensor_allocate(placement, bytes, "in").unwrap();
    let o = rt.tensor_allocate(placement, bytes, "out").unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    (i, o, ins, outs)
}

fn pattern(len: u64, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let word = u32::from_le_bytes([
                i.to_le_bytes()[0],
                i.to_le_bytes()[1],
                i.to_le_bytes()[2],
                0,
            ]);
            word.wrapping_mul(2_654_435_761)
                .wrapping_add(seed)
                .to_le_bytes()[3]
        })
        .collect()
}

fn run_checked(rt: &Runtime, m: ModelHandle, bytes: u64, placement: Placement, runs: u32) {
    let (i, o, ins, outs) = io(rt, bytes, placement);
    for k in 0..runs {
        let data = pattern(bytes, k);
        i.write(&data, 0).unwrap();
        rt.execute(m, &ins, &outs)
            .unwrap_or_else(|e| panic!("{bytes} bytes, run {k}: {e}"));
        let mut out = vec![0u8; usize::try_from(bytes).unwrap()];
        o.read(&mut out, 0).unwrap();
        assert!(
            out == data,
            "{bytes} bytes ({placement:?}), run {k}: output differs"
        );
    }
}

fn counters(rig: &Rig, nc: u32) -> shared::protocol::NcCounters {
    rig.dev.nc_counters(nc).unwrap()
}

#[test]
fn identity_moves_every_size_through_device_and_host_tensors() {
    let rig = rig();
    for bytes in [1u32, 65536, 4 << 20, 100_003, 65537] {
        let m = load(&rig.rt, &identity(bytes), 0);
        run_checked(
            &rig.rt,
            m,
            u64::from(bytes),
            Placement::Device { vnc: 0 },
            3,
        );
        run_checked(&rig.rt, m, u64::from(bytes), Placement::Host, 3);
        rig.rt.unload(m).unwrap();
    }
    rig.rt.close();
}

#[test]
fn ten_thousand_sequential_executes_each_checked() {
    let rig = rig();
    let m = load(&rig.rt, &identity(64), 0);
    run_checked(&rig.rt, m, 64, Placement::Device { vnc: 0 }, 10_000);
    let c = counters(&rig, 0);
    assert_eq!(c.executions, 10_000);
    assert_eq!(c.doorbells, 10_000, "one doorbell per execution");
    rig.rt.close();
}

#[test]
fn the_skip_config_optimisation_reloads_only_on_a_change() {
    let rig = rig();
    let a = load(&rig.rt, &identity_with(64, "A", [1; 13], [1; 32]), 0);
    let b = load(&rig.rt, &identity_with(64, "B", [2; 13], [1; 32]), 0);
    let (_, _, ins, outs) = io(&rig.rt, 64, Placement::Device { vnc: 0 });
    rig.rt.execute(a, &ins, &outs).unwrap();
    rig.rt.execute(a, &ins, &outs).unwrap();
    assert_eq!(
        counters(&rig, 0).config_reloads,
        1,
        "the same model twice: the second request skips the reload"
    );
    rig.rt.execute(b, &ins, &outs).unwrap();
    rig.rt.execute(a, &ins, &outs).unwrap();
    assert_eq!(
        counters(&rig, 0).config_reloads,
        3,
        "A, A, B, A: three reloads"
    );
    assert_eq!(
        counters(&rig, 0).table_loads,
        1,
        "same table hashes: tables loaded once"
    );
    let c = load(&rig.rt, &identity_with(64, "C", [1; 13], [9; 32]), 0);
    rig.rt.execute(c, &ins, &outs).unwrap();
    let after = counters(&rig, 0);
    assert_eq!(
        (after.config_reloads, after.table_loads),
        (3, 2),
        "a table-hash change drives load_act_dve_tables only"
    );
    rig.rt.close();
}

#[test]
fn with_the_optimisation_disabled_every_request_reloads() {
    let rig = rig_with(RuntimeConfig {
        skip_config_optimization: false,
        ..RuntimeConfig::default()
    });
    let a = load(&rig.rt, &identity(64), 0);
    let (_, _, ins, outs) = io(&rig.rt, 64, Placement::Device { vnc: 0 });
    for _ in 0..4 {
        rig.rt.execute(a, &ins, &outs).unwrap();
    }
    assert_eq!(counters(&rig, 0).config_reloads, 4);
    rig.rt.close();
}

#[test]
fn bad_io_sets_are_rejected_before_anything_is_staged_naming_the_tensor() {
    let rig = rig();
    let m = load(&rig.rt, &identity(64), 0);
    let (i, o, ins, outs) = io(&rig.rt, 64, Placement::Device { vnc: 0 });
    let before = counters(&rig, 0);
    let check = |ins: &TensorSet, outs: &TensorSet, status: NrtStatus, name: &str| {
        let e = rig.rt.execute(m, ins, outs).unwrap_err();
        assert_eq!(e.status, status, "{e}");
        assert!(e.message.contains(name), "{e}");
    };
    let mut missing = TensorSet::new();
    missing.add("input", &i);
    check(&ins, &missing, NrtStatus::Invalid, "\"output\"");
    let mut extra = outs.clone();
    extra.add("bogus", &o);
    check(&ins, &extra, NrtStatus::Invalid, "\"bogus\"");
    let small = rig
        .rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 32, "small")
        .unwrap();
    let mut wrong_size = TensorSet::new();
    wrong_size.add("input", &small);
    check(
        &wrong_size,
        &outs,
        NrtStatus::Invalid,
        "\"input\" is 32 bytes",
    );
    let other_core = rig
        .rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 64, "far")
        .unwrap();
    let mut far = TensorSet::new();
    far.add("input", &other_core);
    check(&far, &outs, NrtStatus::ExecBadInput, "logical core 1");
    let e = rig.rt.execute(m, &TensorSet::new(), &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert_eq!(
        e.message,
        "Incorrect number of inputs, expected: 1, received: 0"
    );
    assert_eq!(
        rig.rt
            .execute_repeat(m, &ins, &outs, 2)
            .unwrap_err()
            .message,
        "Supports for loops on the host is deprecated"
    );
    let after = counters(&rig, 0);
    assert_eq!(
        (after.doorbells, after.executions),
        (before.doorbells, before.executions),
        "nothing staged"
    );
    assert_eq!(rig.rt.xu(0).unwrap().depth(), 0);
    rig.rt.execute(m, &ins, &outs).unwrap();
    rig.rt.close();
}

#[test]
fn the_hot_path_makes_exactly_one_device_call_per_bound_tpb() {
    let rig = rig();
    let m = load(&rig.rt, &identity(64), 0);
    let (_, _, ins, outs) = io(&rig.rt, 64, Placement::Device { vnc: 0 });
    rig.rt.execute(m, &ins, &outs).unwrap();
    rig.dev.reset_calls();
    for _ in 0..500 {
        rig.rt.execute(m, &ins, &outs).unwrap();
    }
    let calls = rig.dev.calls();
    assert_eq!(
        calls.into_iter().collect::<Vec<_>>(),
        [("semaphore_increment", 500)]
    );
    rig.rt.close();
}

#[test]
fn funtime_returns_success_without_touching_the_device() {
    let rig = rig_with(RuntimeConfig {
        funtime: true,
        ..RuntimeConfig::default()
    });
    let m = load(&rig.rt, &identity(64), 0);
    rig.dev.reset_calls();
    rig.rt
        .execute(m, &TensorSet::new(), &TensorSet::new())
        .unwrap();
    assert!(rig.dev.calls().is_empty());
    rig.rt.close();
}

#[test]
fn a_doorbell_failure_poisons_that_xu_and_leaves_the_others_working() {
    let rig = rig();
    let m0 = load(&rig.rt, &identity(64), 0);
    let m1 = load(&rig.rt, &identity(64), 1);
    let (_, _, ins0, outs0) = io(&rig.rt, 64, Placement::Device { vnc: 0 });
    let (_, _, ins1, outs1) = io(&rig.rt, 64, Placement::Device { vnc: 1 });
    rig.dev.fail_next_doorbells(1);
    let e = rig.rt.execute(m0, &ins0, &outs0).unwrap_err();
    assert_ne!(e.status, NrtStatus::Success);
    for _ in 0..3 {
        assert_eq!(
            rig.rt.execute(m0, &ins0, &outs0).unwrap_err().status,
            NrtStatus::ExecUnitUnrecoverable
        );
    }
    rig.rt.execute(m1, &ins1, &outs1).unwrap();
    rig.rt.close();
}

#[test]
fn a_program_that_never_ends_times_out_then_fails_fast_and_close_returns() {
    let timeout = Duration::from_millis(500);
    let rig = rig_with(RuntimeConfig {
        exec_timeout: timeout,
        ..RuntimeConfig::default()
    });
    let m = load(&rig.rt, &never_ending(7), 0);
    let (_, _, ins, outs) = io(&rig.rt, 1, Placement::Device { vnc: 0 });
    let t = Instant::now();
    let e = rig.rt.execute(m, &ins, &outs).unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.status, NrtStatus::Timeout, "{e}");
    assert!(
        took >= timeout && took < timeout + Duration::from_millis(500),
        "took {took:?}"
    );
    let t = Instant::now();
    assert_eq!(
        rig.rt.execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::ExecUnitUnrecoverable
    );
    assert!(t.elapsed() < Duration::from_millis(50), "fails fast");
    let t = Instant::now();
    rig.rt.close();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "close returns promptly: {:?}",
        t.elapsed()
    );
}

#[test]
fn neffs_and_containers_for_another_target_are_refused() {
    let rig = rig();
    let neff = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/matmul_small.neff"
    ))
    .unwrap();
    let e = rig.rt.load(&neff, 0).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("NEFF"), "{e}");
    let silicon = identity(8).to_container(Target::Silicon).unwrap();
    let e = rig.rt.load(&silicon, 0).unwrap_err();
    assert_eq!(
        e.message,
        "model was built for silicon, this device is simdev"
    );
    assert_eq!(
        rig.rt.load(b"garbage", 0).unwrap_err().status,
        NrtStatus::Invalid
    );
    rig.rt.close();
}

#[test]
fn unload_waits_and_a_stale_handle_is_invalid() {
    let rig = rig();
    let m = load(&rig.rt, &identity(64), 0);
    let (_, _, ins, outs) = io(&rig.rt, 64, Placement::Device { vnc: 0 });
    rig.rt.execute(m, &ins, &outs).unwrap();
    rig.rt.unload(m).unwrap();
    assert_eq!(
        rig.rt.execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::InvalidHandle
    );
    assert_eq!(
        rig.rt.unload(m).unwrap_err().status,
        NrtStatus::InvalidHandle
    );
    rig.rt.close();
}

#[test]
fn sigterm_to_simdev_ends_an_execution_in_flight_with_an_error() {
    let rig = rig_with(RuntimeConfig {
        exec_timeout: Duration::from_secs(20),
        ..RuntimeConfig::default()
    });
    let m = load(&rig.rt, &never_ending(7), 0);
    let (_, _, ins, outs) = io(&rig.rt, 1, Placement::Device { vnc: 0 });
    let pid = nix::unistd::Pid::from_raw(i32::try_from(rig.sim.pid()).unwrap());
    let (e, took) = std::thread::scope(|s| {
        let exec = s.spawn(|| {
            let t = Instant::now();
            (rig.rt.execute(m, &ins, &outs).unwrap_err(), t.elapsed())
        });
        // The execution is parked on its event inside simdev.
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        exec.join().unwrap()
    });
    // simdev posts device-lost before it exits: the waiter hears it, far inside the timeout.
    assert!(took < Duration::from_secs(5), "took {took:?}: {e}");
    assert_eq!(e.status, NrtStatus::HwError, "device lost: {e}");
    let t = Instant::now();
    rig.rt.close();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "close took {:?}",
        t.elapsed()
    );
}

#[test]
fn unload_waits_for_an_execution_in_flight() {
    let rig = rig();
    let m = load(&rig.rt, &never_ending(7), 0);
    let (_, _, ins, outs) = io(&rig.rt, 1, Placement::Device { vnc: 0 });
    let scheduled = rig.rt.execute_schedule(m, &ins, &outs).unwrap();
    let unloaded = AtomicBool::new(false);
    std::thread::scope(|s| {
        let unload = s.spawn(|| {
            let r = rig.rt.unload(m);
            unloaded.store(true, Ordering::SeqCst);
            r
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !unloaded.load(Ordering::SeqCst),
            "unload returned while an execution of the model was in flight"
        );
        assert!(!rig.rt.is_completed(scheduled.seq_id()).unwrap());
        // Let the execution end: unload then frees the model.
        rig.dev.event_set(0, 7, 1).unwrap();
        unload.join().unwrap().unwrap();
    });
    assert_eq!(rig.rt.wait(&scheduled).unwrap(), NrtStatus::Success);
    assert_eq!(
        rig.rt.execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::InvalidHandle
    );
    rig.rt.close();
}

#[test]
fn threads_share_a_model_and_every_output_is_right() {
    let rig = rig();
    let m = load(&rig.rt, &identity(4096), 0);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let rt = &rig.rt;
            s.spawn(move || {
                let (i, o, ins, outs) = io(rt, 4096, Placement::Device { vnc: 0 });
                for k in 0..200 {
                    let data = pattern(4096, t * 1000 + k);
                    i.write(&data, 0).unwrap();
                    rt.execute(m, &ins, &outs).unwrap();
                    let mut out = vec![0u8; 4096];
                    o.read(&mut out, 0).unwrap();
                    assert!(out == data, "thread {t} run {k}");
                }
            });
        }
    });
    assert_eq!(counters(&rig, 0).executions, 800);
    rig.rt.close();
}
