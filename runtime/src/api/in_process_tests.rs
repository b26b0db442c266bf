//! `Runtime` against the emulated device in-process (no simdev process): load and execute,
//! the LNC=2 doorbell fan-out, and what close gives back to the device.

use std::time::Duration;

use shared::NrtStatus;

use crate::builder::{identity, identity_split};
use crate::config::RuntimeConfig;
use crate::test_support::{Rig, io, load, pattern};
use crate::{Placement, TensorSet};

#[test]
fn execute_copies_each_input_to_its_output_and_close_returns_everything() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    // 200,000 bytes: four descriptor pairs of the I/O ring, the last one short.
    let bytes = 200_000;
    let m = load(&rt, &identity(bytes), 0);
    let (i, o, ins, outs) = io(&rt, u64::from(bytes));
    for seed in 0..3 {
        let data = pattern(bytes as usize, seed);
        i.write(&data, 0).unwrap();
        rt.execute(m, &ins, &outs).unwrap();
        let mut out = vec![0u8; data.len()];
        o.read(&mut out, 0).unwrap();
        assert!(out == data, "run {seed}: the output is not the input");
    }
    assert_eq!(rig.counters(0).executions, 3);
    assert_eq!(rig.counters(1).executions, 0, "core 1 ran nothing");
    assert_eq!(rig.backend.doorbells(), [0, 0, 0]);
    assert_eq!(rt.compute_idx_tail(0), Some(3));
    drop((i, o, ins, outs));
    rt.close();
    let stats = rig.device.stats();
    assert_eq!(
        (stats.claimed_ncs, stats.dma_queues, stats.chunks),
        (0, 0, 0),
        "close released every NC, DMA queue and chunk: {stats:?}"
    );
}

#[test]
fn lnc2_rings_each_tpb_of_the_logical_core_once_in_order() {
    let rig = Rig::with(shared::Arch::Trn2, 4);
    let rt = rig.runtime(RuntimeConfig {
        lnc: Some(2),
        exec_timeout: Duration::from_secs(10),
        ..RuntimeConfig::default()
    });
    let m = load(&rt, &identity_split(4096), 1);
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 4096, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 4096, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let data = pattern(4096, 7);
    i.write(&data, 0).unwrap();
    rt.execute(m, &ins, &outs).unwrap();
    rt.execute(m, &ins, &outs).unwrap();
    let mut out = vec![0u8; 4096];
    o.read(&mut out, 0).unwrap();
    assert!(out == data, "both halves copied");
    assert_eq!(rig.backend.doorbells(), [2, 3, 2, 3]);
    let executions: Vec<u64> = (0..4).map(|nc| rig.counters(nc).executions).collect();
    assert_eq!(executions, [0, 0, 2, 2]);
    assert_eq!(
        (rt.compute_idx_tail(1), rt.compute_idx_tail(0)),
        (Some(2), Some(0))
    );
    rt.close();
}

#[test]
fn a_failed_doorbell_is_nrt_failure_and_poisons_the_logical_core() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &identity(64), 0);
    let (_i, _o, ins, outs) = io(&rt, 64);
    rt.execute(m, &ins, &outs).unwrap();
    rig.backend.fail_next_doorbells(1);
    assert_eq!(
        rt.execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::Failure
    );
    assert_eq!(
        rt.execute(m, &ins, &outs).unwrap_err().status,
        NrtStatus::ExecUnitUnrecoverable,
        "the XU is poisoned"
    );
    assert_eq!(rig.counters(0).executions, 1);
    rt.close();
}

#[test]
fn the_runtimes_own_queues_are_its_runtime_memory_and_not_the_vnc_memory_stats() {
    use crate::datastore::snapshot::MemKind;
    let runtime_memory = |arch, ncs, lnc| {
        let rig = Rig::with(arch, ncs);
        let rt = rig.runtime(RuntimeConfig {
            lnc: Some(lnc),
            ..RuntimeConfig::default()
        });
        let snap = rt.datastore().snapshot();
        let bytes = snap.cores[0].memory.get(MemKind::RuntimeMemory);
        let in_use = rig.device.stats().memory_in_use;
        assert!(bytes > 0, "notification and exec queues are device memory");
        assert!(
            bytes <= in_use,
            "{bytes} of {in_use} bytes the device holds"
        );
        assert_eq!(
            rt.vnc_memory_stats(0).unwrap().bytes_used,
            0,
            "nrt_get_vnc_memory_stats counts tensors and models only"
        );
        rt.close();
        bytes
    };
    let one = runtime_memory(shared::Arch::Trn2, 2, 1);
    let two = runtime_memory(shared::Arch::Trn2, 2, 2);
    assert_eq!(
        two,
        2 * one,
        "a logical core of two NCs holds both NCs' queues"
    );
}

#[test]
fn an_unbound_tensor_is_named_with_the_names_the_set_holds_instead() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &identity(64), 0);
    let (i, _o, _, outs) = io(&rt, 64);
    let mut misspelt = TensorSet::new();
    misspelt.add("inptu", &i);
    let e = rt.execute(m, &misspelt, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(
        e.message.ends_with(
            "input tensor \"input\" of model \"identity\" is not bound; the set holds \
             [\"inptu\"], which the model has no input of"
        ),
        "{}",
        e.message
    );
    drop((i, misspelt, outs));
    rt.close();
}

#[test]
fn a_queue_an_execution_unit_lacks_is_refused_naming_the_queues_it_has() {
    use shared::ids::XuType;
    let rig = Rig::new();
    let rt = rig.runtime(RuntimeConfig::default());
    for (xu_type, queue, has) in [
        (XuType::TensorOp, 2, "queues 0 and 1"),
        (XuType::Compute, 1, "queue 0 only"),
        (XuType::Collectives, 3, "queues 0 to 2"),
    ] {
        let e = rt.get_sequence(0, xu_type, queue).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        assert!(
            e.message.ends_with(&format!(
                "does not exist: {xu_type:?} execution units have {has}"
            )),
            "{e}"
        );
    }
    rt.close();
}

#[test]
fn refused_executions_count_in_the_monitors_figures_with_their_status_and_no_latency() {
    let rig = Rig::new();
    let rt = rig.sync_runtime();
    let m = load(&rt, &identity(64), 0);
    let (_i, _o, ins, outs) = io(&rt, 64);
    rt.execute(m, &ins, &outs).unwrap();
    // A tensor of the wrong size: NRT_INVALID, sync and async; a host tensor to the async
    // API: NRT_INVALID too. Nothing of these ran.
    let small = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 32, "small")
        .unwrap();
    let mut wrong = TensorSet::new();
    wrong.add("input", &small);
    let host = rt.tensor_allocate(Placement::Host, 64, "host").unwrap();
    let mut on_host = TensorSet::new();
    on_host.add("input", &host);
    let refusals = [
        rt.execute(m, &wrong, &outs).unwrap_err().status,
        rt.execute_schedule(m, &wrong, &outs).unwrap_err().status,
        rt.execute_schedule(m, &on_host, &outs).unwrap_err().status,
    ];
    assert_eq!(refusals, [NrtStatus::Invalid; 3]);
    // A doorbell that fails (NRT_FAILURE), then the degraded core's refusals (101).
    rig.backend.fail_next_doorbells(1);
    let after = [
        rt.execute(m, &ins, &outs).unwrap_err().status,
        rt.execute(m, &ins, &outs).unwrap_err().status,
    ];
    assert_eq!(
        after,
        [NrtStatus::Failure, NrtStatus::ExecUnitUnrecoverable]
    );
    let snap = rt.datastore().snapshot();
    let core = &snap.cores[0];
    let model = &snap.models[0];
    for (what, counts) in [("core", &core.executions), ("model", &model.executions)] {
        assert_eq!(
            [
                counts.get(NrtStatus::Success),
                counts.get(NrtStatus::Invalid),
                counts.get(NrtStatus::Failure),
                counts.get(NrtStatus::ExecUnitUnrecoverable),
                counts.total(),
            ],
            [1, 3, 1, 1, 6],
            "{what}: {counts:?}"
        );
    }
    assert_eq!(
        (core.total_latency.count, model.total_latency.count),
        (1, 1),
        "only the execution that ran has a latency"
    );
    rt.close();
}
