//! The timeline (`NEURON_RT_TRACE`): a runtime in this process, against a real simdev, writes
//! at close one Perfetto file whose runtime spans and device events of each execution nest in
//! time order on one clock (`nrt bench --trace` is checked in `runtime/nrt/tests/trace.rs`).

use std::sync::Arc;
use std::time::Duration;

use runtime::builder::identity_with;
use runtime::config::RuntimeConfig;
use runtime::{ModelHandle, Placement, Runtime, TensorSet};
use serde_json::Value;
use shared::model::Target;
use tests::timeline::check_execution;
use tests::{connect, start_simdev};

fn runtime_with(config: RuntimeConfig) -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    let sim = start_simdev(&["--hbm", "64M", "--ncs", "2"]);
    let rt = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..config
        },
    )
    .expect("nrt_init");
    (rt, sim)
}

fn load(rt: &Runtime, vnc: i32) -> ModelHandle {
    let m = identity_with(256, "ident", [0; 13], [0; 32]);
    rt.load(&m.to_container(Target::Simdev).unwrap(), vnc)
        .expect("load")
}

fn io(rt: &Runtime, vnc: u32) -> (TensorSet, TensorSet) {
    let i = rt
        .tensor_allocate(Placement::Device { vnc }, 256, "in")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc }, 256, "out")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    (ins, outs)
}

#[test]
fn neuron_rt_trace_writes_one_timeline_whose_spans_and_device_events_nest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.json");
    let (rt, _sim) = runtime_with(RuntimeConfig {
        trace_file: Some(path.clone()),
        ..RuntimeConfig::default()
    });
    let m = load(&rt, 0);
    let (ins, outs) = io(&rt, 0);
    for _ in 0..20 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    assert_eq!(
        std::fs::metadata(&path).map(|m| m.len()).ok(),
        Some(0),
        "created empty at init (the path is checked then), written at close"
    );
    rt.close();
    let bytes = std::fs::read(&path).expect("the timeline is written at close");
    let mut seen = Vec::new();
    for n in [0, 9, 19] {
        let e = check_execution(&bytes, n);
        seen.push((e.seq_id, e.compute_idx));
    }
    seen.dedup();
    assert_eq!(seen.len(), 3, "three distinct executions: {seen:?}");
    let trace: Value = serde_json::from_slice(&bytes).unwrap();
    let other = &trace["otherData"];
    assert_eq!(other["device_clock"], "host CLOCK_MONOTONIC", "{other}");
    // Device events of the engines, DMA and doorbells are there too, in logical core 0's process.
    let events = trace["traceEvents"].as_array().unwrap();
    for cat in [
        "instruction",
        "dma",
        "doorbell",
        "notification",
        "execution",
    ] {
        assert!(
            events
                .iter()
                .any(|e| e["cat"] == cat && e["pid"].as_u64() == Some(1 << 22)),
            "no device {cat} event"
        );
    }
    assert!(
        events.iter().any(|e| e["ph"] == "s") && events.iter().any(|e| e["ph"] == "f"),
        "flow arrows"
    );
    // Perfetto keeps a flow only where a slice open on its track at its time encloses its
    // start: both kinds of arrow, every execution's.
    for name in ["doorbell", "harvest"] {
        let starts: Vec<_> = events
            .iter()
            .filter(|e| e["ph"] == "s" && e["name"] == name)
            .collect();
        assert!(starts.len() >= 20, "{} {name} flows", starts.len());
        for s in starts {
            let ts = s["ts"].as_f64().unwrap();
            assert!(
                events.iter().any(|x| {
                    x["ph"] == "X"
                        && x["pid"] == s["pid"]
                        && x["tid"] == s["tid"]
                        && x["ts"].as_f64().unwrap() <= ts
                        && ts <= x["ts"].as_f64().unwrap() + x["dur"].as_f64().unwrap()
                }),
                "no slice encloses the start of {s}"
            );
        }
    }
}

#[test]
fn the_explicit_async_path_gets_its_spans_and_the_worker_its_harvest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.json");
    let (rt, _sim) = runtime_with(RuntimeConfig {
        trace_file: Some(path.clone()),
        ..RuntimeConfig::default()
    });
    let m = load(&rt, 0);
    let (ins, outs) = io(&rt, 0);
    let mut seqs = Vec::new();
    for _ in 0..4 {
        let r = rt.execute_schedule(m, &ins, &outs).unwrap();
        rt.wait(&r).unwrap();
        seqs.push(format!("{:#x}", r.seq_id().raw()));
    }
    rt.close();
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    for seq in &seqs {
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["cat"] == "runtime" && e["args"]["seq_id"] == seq.as_str())
            .filter_map(|e| e["name"].as_str())
            .collect();
        for name in ["execute", "bind", "stage", "doorbell", "harvest"] {
            assert!(names.contains(&name), "{seq}: no {name} span in {names:?}");
        }
        assert!(
            !names.contains(&"wait"),
            "{seq}: the async call does not wait"
        );
    }
}

#[test]
fn the_implicit_async_pool_gets_its_spans_with_the_job_id_and_the_pool_worker_its_harvest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.json");
    let (rt, _sim) = runtime_with(RuntimeConfig {
        trace_file: Some(path.clone()),
        async_max_inflight: 2,
        ..RuntimeConfig::default()
    });
    let m = load(&rt, 0);
    let (ins, outs) = io(&rt, 0);
    for _ in 0..6 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    rt.async_drain(0);
    rt.close();
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let spans = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["cat"] == "runtime" && e["name"] == name)
            .collect()
    };
    let harvests = spans("harvest");
    assert_eq!(harvests.len(), 6, "one harvest per execution");
    let key = |e: &Value| {
        (
            e["args"]["seq_id"].clone(),
            e["args"]["compute_idx"].clone(),
        )
    };
    let mut jobs: Vec<_> = harvests.iter().map(|h| key(h)).collect();
    jobs.sort_by_key(|k| k.0.as_str().map(str::to_owned));
    jobs.dedup();
    assert_eq!(jobs.len(), 6, "distinct job ids: {jobs:?}");
    for h in &harvests {
        for name in ["execute", "bind", "stage", "doorbell"] {
            let caller = spans(name)
                .into_iter()
                .find(|s| key(s) == key(h))
                .unwrap_or_else(|| panic!("no {name} span of {:?}", key(h)));
            assert_ne!(caller["tid"], h["tid"], "the pool's worker harvests");
        }
        assert!(
            !spans("wait").iter().any(|s| key(s) == key(h)),
            "nothing waits in the call"
        );
    }
}

#[test]
fn with_lnc_2_one_logical_core_process_holds_both_ncs_tracks_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.json");
    let sim = start_simdev(&["--arch", "trn2", "--hbm", "64M"]);
    let rt = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            lnc: Some(2),
            exec_timeout: Duration::from_secs(20),
            trace_file: Some(path.clone()),
            ..RuntimeConfig::default()
        },
    )
    .expect("nrt_init");
    let m = rt
        .load(
            &runtime::builder::identity_split(4096)
                .to_container(Target::Simdev)
                .unwrap(),
            1,
        )
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 4096, "i")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 1 }, 4096, "o")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    for _ in 0..3 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    rt.close();
    let bytes = std::fs::read(&path).unwrap();
    let e = check_execution(&bytes, 1);
    let trace: Value = serde_json::from_slice(&bytes).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let core1 = (1u64 << 22) + 1;
    let name = |tid: u64| {
        events
            .iter()
            .find(|m| {
                m["ph"] == "M" && m["pid"].as_u64() == Some(core1) && m["tid"].as_u64() == Some(tid)
            })
            .map(|m| m["args"]["name"].clone())
    };
    assert_eq!(name(0), Some("logical core 1 (NC 2, NC 3)".into()));
    assert_eq!(name(2 * 8 + 2), Some("NC 2 PE".into()));
    assert_eq!(name(3 * 8 + 7), Some("NC 3 DMA".into()));
    // Both NCs of the logical core ran the execution, on their own sequencer tracks.
    for nc in [2u64, 3] {
        assert!(
            events.iter().any(|d| d["cat"] == "execution"
                && d["pid"].as_u64() == Some(core1)
                && d["tid"].as_u64() == Some(nc * 8 + 1)
                && d["args"]["compute_idx"].as_u64() == Some(e.compute_idx)),
            "NC {nc} executed compute_idx {}",
            e.compute_idx
        );
    }
}
