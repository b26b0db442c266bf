//! LNC=2 lockstep (seed 000 §4–5), the collectives model-switch chain (seed 000 §3 GOTCHA) and
//! many clients at once, against the real simdev binary.

use std::sync::Arc;
use std::time::Duration;

use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::builder::{identity, identity_split, identity_with_collectives};
use runtime::config::RuntimeConfig;
use runtime::{Device, ModelHandle, Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::{Model, Target};
use tests::{InterposedDevice, connect, start_simdev};

fn runtime(
    arch: &str,
    lnc: u32,
) -> (
    Runtime,
    Arc<runtime::backend::sim::SimDevice>,
    runtime::backend::sim::PrivateSimdev,
) {
    let sim = start_simdev(&["--arch", arch, "--hbm", "64M"]);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        lnc: Some(lnc),
        exec_timeout: Duration::from_secs(20),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
    (rt, dev, sim)
}

fn load(rt: &Runtime, m: &Model, vnc: i32) -> ModelHandle {
    rt.load(&m.to_container(Target::Simdev).unwrap(), vnc)
        .unwrap()
}

fn digits_logits(rt: &Runtime, lnc: u32, batch: usize) -> Vec<f32> {
    let data = Digits::load(&digits::default_path()).unwrap();
    let model = data
        .mlp()
        .build_split(u32::try_from(batch).unwrap(), lnc)
        .unwrap();
    tests::run_rows(
        rt,
        shared::model::Target::Simdev,
        &model,
        batch,
        &data.inputs,
        FEATURES,
        CLASSES,
    )
}

#[test]
fn the_digits_mlp_at_lnc2_gives_the_lnc1_results() {
    let (rt1, _d1, _s1) = runtime("trn2", 1);
    let lnc1 = digits_logits(&rt1, 1, 360);
    rt1.close();
    let (rt2, _d2, _s2) = runtime("trn2", 2);
    assert_eq!(
        rt2.visible_vnc_count(),
        4,
        "8 physical NCs, 2 per logical core"
    );
    assert_eq!(rt2.vnc_ncs(1), Some(&[2u32, 3][..]));
    for batch in [360, 90] {
        let lnc2 = digits_logits(&rt2, 2, batch);
        assert_eq!(lnc2, lnc1, "LNC=2 at batch {batch} equals LNC=1");
    }
    let data = Digits::load(&digits::default_path()).unwrap();
    let correct = digits::argmax_rows(&lnc1)
        .iter()
        .zip(&data.labels)
        .filter(|(p, l)| i32::try_from(**p).ok() == Some(**l))
        .count();
    assert_eq!(correct, 355);
    // One work item per logical core, metrics per TPB: both NCs counted every execution.
    let (m0, m1) = (
        rt2.metrics().snapshot(0).unwrap(),
        rt2.metrics().snapshot(1).unwrap(),
    );
    assert_eq!(m0.executions_with(NrtStatus::Success), 1 + 4);
    assert_eq!(m1.executions_with(NrtStatus::Success), 1 + 4);
    assert_eq!(
        rt2.xu(0).unwrap().last_completed().seq_num(),
        5,
        "one XU slot per execution, not per NC"
    );
    rt2.close();
}

#[test]
fn lnc2_is_refused_off_trn2() {
    let sim = start_simdev(&["--hbm", "16M"]);
    let e = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            lnc: Some(2),
            ..RuntimeConfig::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(
        e.message.contains("trn2") && e.message.contains("trn1"),
        "{e}"
    );
}

#[test]
fn lnc2_arms_every_nc_before_firing_any_doorbell() {
    // The order is recorded by the backend: at each INFERENCE_START doorbell, how many
    // descriptors each NC's hardware exec queue holds. Staging NC 3 after ringing NC 2 would
    // show NC 3 empty at the first doorbell.
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "64M"]);
    let dev = Arc::new(InterposedDevice::new(Box::new(connect(&sim))));
    let cfg = RuntimeConfig {
        lnc: Some(2),
        exec_timeout: Duration::from_secs(20),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
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
    let data: Vec<u8> = (0..4096u32).map(|k| k.to_le_bytes()[0] ^ 0x33).collect();
    i.write(&data, 0).unwrap();
    rt.execute(m, &ins, &outs).unwrap();
    let doorbells = dev.doorbells();
    assert_eq!(
        doorbells.iter().map(|d| d.nc).collect::<Vec<_>>(),
        [2, 3],
        "one doorbell per TPB of logical core 1, in order"
    );
    for d in &doorbells {
        let armed: Vec<(u32, u32)> = d
            .armed
            .iter()
            .filter(|&(_, &n)| n > 0)
            .map(|(&nc, &n)| (nc, n))
            .collect();
        assert_eq!(
            armed,
            [(2, 4), (3, 4)],
            "at the doorbell of NC {}: both NCs hold their four trigger pairs, no other NC any",
            d.nc
        );
    }
    for _ in 0..4 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    assert_eq!(
        (rt.compute_idx_tail(1), rt.compute_idx_tail(0)),
        (Some(5), Some(0)),
        "one compute_idx per fan-out, on the main TPB"
    );
    let mut out = vec![0u8; 4096];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, data, "both halves moved, each by its own NC");
    assert_eq!(
        (
            dev.nc_counters(2).unwrap().executions,
            dev.nc_counters(3).unwrap().executions
        ),
        (5, 5)
    );
    rt.close();
}

#[test]
fn the_collectives_chain_is_built_once_and_runs_only_on_a_switch_on_the_first_nc() {
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "64M"]);
    let dev = Arc::new(InterposedDevice::new(Box::new(connect(&sim))));
    let cfg = RuntimeConfig {
        lnc: Some(2),
        exec_timeout: Duration::from_secs(20),
        ..RuntimeConfig::default()
    };
    let rt = Runtime::init(dev.clone(), cfg).unwrap();
    let mut cc = identity_split(256);
    let with_ctx = identity_with_collectives(128, 200_000);
    cc.has_collectives = true;
    cc.tpbs[0].buffers = with_ctx.tpbs[0].buffers.clone();
    cc.exec_req_flags = [7; 13];
    let a = load(&rt, &cc, 0);
    let b = load(&rt, &identity_split(256), 0);
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 256, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 256, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    for m in [a, a, a] {
        rt.execute(m, &ins, &outs).unwrap();
    }
    assert_eq!(
        dev.nc_counters(0).unwrap().cc_chains,
        1,
        "A, A, A: one switch, one chain"
    );
    for m in [b, a, b, a, b, a] {
        rt.execute(m, &ins, &outs).unwrap();
    }
    assert_eq!(
        dev.nc_counters(0).unwrap().cc_chains,
        4,
        "three more switches to A"
    );
    assert_eq!(
        dev.nc_counters(1).unwrap().cc_chains,
        0,
        "never on the second NC"
    );
    assert_eq!(
        rt.model(a).unwrap().cc_chain_builds(),
        1,
        "built once, cached on the model"
    );
    assert_eq!(
        rt.model(b).unwrap().cc_chain_builds(),
        0,
        "no collectives context, no chain"
    );
    let chain = rt.model(a).unwrap().cc_chain().unwrap().pairs.clone();
    assert_eq!(
        chain.len(),
        4 + 1,
        "200000 bytes in 64 KiB pieces, then the event poke"
    );
    assert!(chain.iter().all(|&(_, _, len)| len <= 65536));
    // Pairs each NC's exec queue received per execution (A A A B A B A B A): the chain (5
    // pairs) only on NC 0, only on the switches to A; NC 1 always the 4 trigger pairs.
    let at_first_doorbell: Vec<(u32, u32)> = dev
        .doorbells()
        .iter()
        .filter(|d| d.nc == 0)
        .map(|d| (d.armed[&0], d.armed[&1]))
        .collect();
    let per_execution: Vec<(u32, u32)> = at_first_doorbell
        .iter()
        .scan((0, 0), |prev, &(n0, n1)| {
            let d = (n0 - prev.0, n1 - prev.1);
            *prev = (n0, n1);
            Some(d)
        })
        .collect();
    assert_eq!(
        per_execution,
        [
            (9, 4),
            (4, 4),
            (4, 4),
            (4, 4),
            (9, 4),
            (4, 4),
            (9, 4),
            (4, 4),
            (9, 4)
        ]
    );
    rt.close();
}

#[test]
fn many_threads_on_several_cores_and_models_get_exactly_their_own_results() {
    let (rt, _dev, _sim) = runtime("trn1", 1);
    let models: Vec<(ModelHandle, u32)> = (0..2u32)
        .flat_map(|vnc| {
            [identity(512), identity(2048)]
                .into_iter()
                .map(move |m| (m, vnc))
        })
        .map(|(m, vnc)| {
            (
                load(&rt, &m, i32::try_from(vnc).unwrap()),
                u32::try_from(m.inputs[0].size).unwrap(),
            )
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let (rt, models) = (&rt, &models);
            s.spawn(move || {
                let (m, bytes) = models[t as usize % models.len()];
                let i = rt
                    .tensor_allocate(Placement::Device { vnc: m.vnc }, u64::from(bytes), "i")
                    .unwrap();
                let o = rt
                    .tensor_allocate(Placement::Device { vnc: m.vnc }, u64::from(bytes), "o")
                    .unwrap();
                let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
                ins.add("input", &i);
                outs.add("output", &o);
                for k in 0..150u32 {
                    let data: Vec<u8> = (0..bytes)
                        .map(|j| (j ^ (t << 4) ^ k).to_le_bytes()[0])
                        .collect();
                    i.write(&data, 0).unwrap();
                    rt.execute(m, &ins, &outs).unwrap();
                    let mut out = vec![0u8; bytes as usize];
                    o.read(&mut out, 0).unwrap();
                    assert!(
                        out == data,
                        "thread {t} execution {k}: another request's output"
                    );
                }
            });
        }
    });
    let total: u64 = (0..2)
        .map(|nc| rt.metrics().snapshot(nc).unwrap().executions())
        .sum();
    assert_eq!(total, 8 * 150, "no lost or duplicated completions");
    rt.close();
}

#[test]
fn a_logical_core_of_two_ncs_holds_tensors_in_the_hbm_of_both_up_to_its_reported_limit() {
    // 64 MiB of HBM per NC: logical core 0 (NCs 0 and 1) reports 128 MiB. Tensors once came
    // from NC 0's HBM only, refused at under 64 MiB while the stats said 128.
    const PIECE: u64 = 8 << 20;
    let (rt, _dev, _sim) = runtime("trn2", 2);
    let m = load(&rt, &identity_split(64), 0);
    let stats = rt.vnc_memory_stats(0).unwrap();
    assert_eq!(stats.bytes_limit, 128 << 20);
    let mut held = Vec::new();
    let refusal = loop {
        match rt.tensor_allocate(Placement::Device { vnc: 0 }, PIECE, "piece") {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
    };
    assert_eq!(refusal.status, NrtStatus::Resource, "{refusal}");
    let bytes = PIECE * held.len() as u64;
    assert!(
        bytes > 64 << 20,
        "{bytes} bytes of tensors: no more than NC 0's HBM"
    );
    let used = rt.vnc_memory_stats(0).unwrap().bytes_used;
    assert!(used <= stats.bytes_limit, "{used} used");
    // NC 0's HBM is full: these land in NC 1's, and both NCs move their halves of them.
    held.pop();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    i.write(&[0xC3; 64], 0).unwrap();
    rt.execute(m, &ins, &outs).unwrap();
    let mut out = [0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, [0xC3; 64]);
    // Both NCs of the core are on one HBM stack, as on trn2 silicon (two NCs per stack).
    assert_eq!(i.device_allocation().unwrap().hbm_index, 0);
    assert_eq!(held[0].device_allocation().unwrap().hbm_index, 0);
    let on_core_3 = rt
        .tensor_allocate(Placement::Device { vnc: 3 }, 64, "c3")
        .unwrap();
    assert_eq!(
        on_core_3.device_allocation().unwrap().hbm_index,
        3,
        "logical core 3 is NCs 6 and 7: stack 3"
    );
    drop((held, ins, outs, i, o, on_core_3));
    rt.close();
}
