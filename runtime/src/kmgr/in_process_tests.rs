//! Loading and unloading against the emulated device in-process: device memory taken and
//! given back, and an unload that waits for the execution in flight.

use std::time::Duration;

use shared::NrtStatus;

use crate::backend::Device;
use crate::builder::identity;
use crate::test_support::{Rig, gated_identity, io, load, pattern};

#[test]
fn load_places_the_model_in_device_memory_and_unload_frees_it() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let before = rig.device.stats();
    let m = load(&rt, &identity(4096), 0);
    let loaded = rig.device.stats();
    assert!(
        loaded.chunks > before.chunks && loaded.memory_in_use > before.memory_in_use,
        "{before:?} -> {loaded:?}"
    );
    assert_eq!(rt.model(m).unwrap().vnc(), 0);
    rt.unload(m).unwrap();
    let after = rig.device.stats();
    assert!(after.chunks < loaded.chunks, "{loaded:?} -> {after:?}");
    // The I/O ring the load created belongs to the NC's exec queue (released at close) and is
    // reused: load/unload cycles take and give back the same chunks, nothing leaks.
    for _ in 0..3 {
        let again = load(&rt, &identity(4096), 0);
        assert_eq!(rig.device.stats().chunks, loaded.chunks);
        rt.unload(again).unwrap();
        let cycled = rig.device.stats();
        assert_eq!(
            (cycled.chunks, cycled.memory_in_use),
            (after.chunks, after.memory_in_use),
            "unload gave back every chunk the load took"
        );
    }
    assert_eq!(rt.unload(m).unwrap_err().status, NrtStatus::InvalidHandle);
    rt.close();
}

/// An execution that resolved its model before `unload` took it (a thread racing the unload)
/// cannot begin once the unload is waiting: it would stage into memory about to be freed.
#[test]
fn no_execution_begins_on_a_model_being_unloaded() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &gated_identity(64, "gated", 9), 0);
    let (_, _, ins, outs) = io(&rt, 64);
    let s = rt.execute_schedule(m, &ins, &outs).unwrap();
    // What the racing thread resolved.
    let model = rt.model(m).unwrap();
    std::thread::scope(|scope| {
        let unload = scope.spawn(|| rt.unload(m));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let refused = loop {
            match model.begin_execution() {
                Err(e) => break e,
                Ok(guard) => drop(guard),
            }
            assert!(
                std::time::Instant::now() < deadline,
                "executions still begin while the unload waits"
            );
            std::thread::yield_now();
        };
        assert_eq!(refused.status, NrtStatus::InvalidHandle, "{refused}");
        assert!(refused.message.contains("being unloaded"), "{refused}");
        rig.backend.event_set(0, 9, 1).unwrap();
        unload.join().unwrap().unwrap();
    });
    assert_eq!(rt.wait(&s).unwrap(), NrtStatus::Success);
    rt.close();
}

#[test]
fn unload_waits_for_the_execution_in_flight_then_frees() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &gated_identity(64, "gated", 9), 0);
    let (i, o, ins, outs) = io(&rt, 64);
    i.write(&pattern(64, 5), 0).unwrap();
    let s = rt.execute_schedule(m, &ins, &outs).unwrap();
    let loaded = rig.device.stats().chunks;
    let model = rt.model(m).unwrap();
    std::thread::scope(|scope| {
        let unload = scope.spawn(|| rt.unload(m));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !unload.is_finished(),
            "unload returned with an execution in flight"
        );
        assert_eq!(rig.device.stats().chunks, loaded, "nothing freed yet");
        assert_eq!(s.status(), None);
        rig.backend.event_set(0, 9, 1).unwrap();
        unload.join().unwrap().unwrap();
        // The model stayed in flight until the runtime harvested its completion (the
        // submitter's status is published just after the work item is freed).
        assert_eq!(
            rig.counters(0).executions,
            1,
            "the execution finished first"
        );
    });
    assert_eq!(
        model.idle_wakes(),
        1,
        "the ending execution woke the unload"
    );
    assert_eq!(rt.wait(&s).unwrap(), NrtStatus::Success);
    let mut out = vec![0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert!(out == pattern(64, 5));
    assert!(
        rig.device.stats().chunks < loaded,
        "the model's chunks were freed"
    );
    rt.close();
}

#[test]
fn executions_ending_while_nobody_unloads_wake_nobody() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &identity(64), 0);
    let (i, _o, ins, outs) = io(&rt, 64);
    i.write(&pattern(64, 3), 0).unwrap();
    let model = rt.model(m).unwrap();
    for _ in 0..5 {
        rt.execute(m, &ins, &outs).unwrap();
        let s = rt.execute_schedule(m, &ins, &outs).unwrap();
        assert_eq!(rt.wait(&s).unwrap(), NrtStatus::Success);
    }
    // Each sync execution takes the in-flight count from 1 to 0: notifying the idle condvar
    // there (a futex system call on the worker) would count 10 here.
    assert_eq!(model.idle_wakes(), 0);
    drop(model);
    rt.unload(m).unwrap();
    rt.close();
}
