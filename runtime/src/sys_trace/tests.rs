use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

use super::*;

/// A completed execution of `model_id` on logical core `vnc` with sequence id `seq`, stamped
/// at stage.
fn exec(model_id: u64, vnc: u32, seq: u64) -> ExecInfo<ExecRequest> {
    let mut info = ExecInfo::execute(
        model_id,
        ExecRequest {
            num_tpbs: 1,
            compute_idx: u32::try_from(seq % 1000).unwrap(),
            ..ExecRequest::default()
        },
    );
    info.request.ncs[0] = vnc + 10;
    info.request.trace = ExecStamp {
        staged: Some(Instant::now()),
        seq_id: seq,
    };
    info
}

fn tensor_op(seq: u64) -> TensorOp {
    let now = Instant::now();
    TensorOp {
        op: TensorOpKind::Write,
        seq_id: seq,
        queue: 1,
        bytes: 4096,
        submit: now,
        start: now,
        end: now,
        status: NrtStatus::Success,
    }
}

fn trace(vncs: u32) -> SysTrace {
    SysTrace::new((0..vncs).map(|v| vec![v + 10]).collect())
}

fn fetch(t: &SysTrace, options: SysTraceFetchOptions) -> Value {
    // Model 7 is a NEFF run shape-only, model 8 is unloaded, the others are containers.
    let text = t
        .fetch(&options, |id| match id {
            7 => Some((format!("model{id}"), DeviceProgram::NeffShapeOnly)),
            8 => None,
            _ => Some((format!("model{id}"), DeviceProgram::Container)),
        })
        .unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn all(t: &SysTrace) -> Value {
    fetch(t, SysTraceFetchOptions::default())
}

/// The `field` of every event of core section `nc`.
fn field(doc: &Value, nc: usize, field: &str) -> Vec<Value> {
    doc["ncs"][nc]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[field].clone())
        .collect()
}

fn started(vncs: u32, config: &SysTraceConfig) -> SysTrace {
    let t = trace(vncs);
    t.start(config).unwrap();
    t
}

#[test]
fn execute_events_say_what_the_device_ran() {
    let t = started(1, &SysTraceConfig::new());
    for model in [1, 7, 8] {
        t.record_execution(0, &exec(model, 0, 1), NrtStatus::Success);
    }
    let doc = all(&t);
    assert_eq!(
        field(&doc, 0, "device_program"),
        [json!("container"), json!("neff_shape_only"), Value::Null]
    );
    assert_eq!(
        field(&doc, 0, "shape_only"),
        [json!(false), json!(true), Value::Null]
    );
    assert_eq!(
        field(&doc, 0, "model"),
        [json!("model1"), json!("model7"), Value::Null]
    );
}

#[test]
fn nothing_is_recorded_before_start_or_after_stop() {
    let t = trace(1);
    assert!(!t.armed());
    t.record_execution(0, &exec(1, 0, 1), NrtStatus::Success);
    t.record_tensor_op(0, &tensor_op(2));
    let doc = all(&t);
    assert_eq!(doc["capturing"], false);
    assert_eq!(doc["ncs"][0]["events"].as_array().unwrap().len(), 0);
    assert_eq!(doc["ncs"][0]["recorded"], 0);

    t.start(&SysTraceConfig::new()).unwrap();
    assert!(t.armed());
    t.record_execution(0, &exec(1, 0, 3), NrtStatus::Success);
    t.stop().unwrap();
    assert!(!t.armed());
    t.record_execution(0, &exec(1, 0, 4), NrtStatus::Success);
    let doc = all(&t);
    assert_eq!(doc["capturing"], false);
    assert_eq!(
        field(&doc, 0, "seq_id"),
        vec![Value::from(3)],
        "held events stay fetchable after stop; none recorded after it: {doc}"
    );
}

#[test]
fn an_execution_staged_before_capture_started_is_not_recorded() {
    let t = started(1, &SysTraceConfig::new());
    let mut info = exec(1, 0, 1);
    info.request.trace = ExecStamp::default();
    t.record_execution(0, &info, NrtStatus::Success);
    assert_eq!(all(&t)["ncs"][0]["recorded"], 0);
}

#[test]
fn a_full_ring_keeps_the_newest_events_and_reports_the_drops() {
    let mut c = SysTraceConfig::new();
    c.set_max_events_per_nc(4);
    let t = started(1, &c);
    for seq in 0..10 {
        t.record_execution(0, &exec(7, 0, seq), NrtStatus::Success);
    }
    let doc = all(&t);
    let nc = &doc["ncs"][0];
    assert_eq!(
        (
            &nc["capacity"],
            &nc["recorded"],
            &nc["dropped"],
            &nc["held"]
        ),
        (
            &Value::from(4),
            &Value::from(10),
            &Value::from(6),
            &Value::from(0)
        ),
        "{doc}"
    );
    assert_eq!(
        field(&doc, 0, "seq_id"),
        (6..10).map(Value::from).collect::<Vec<_>>()
    );
    assert_eq!(
        field(&doc, 0, "event_idx"),
        (6..10).map(Value::from).collect::<Vec<_>>()
    );
    let e = &nc["events"][0];
    assert_eq!(e["type"], "execute");
    assert_eq!(e["model"], "model7");
    assert_eq!(e["physical_ncs"], serde_json::json!([10]));
    assert_eq!(e["status"], "NRT_SUCCESS");
    assert!(e["submit_ns"].as_u64() <= e["start_ns"].as_u64());
    assert!(e["start_ns"].as_u64() <= e["end_ns"].as_u64());
    // The fetch consumed them; the drop count stays.
    let doc = all(&t);
    assert_eq!(doc["ncs"][0]["events"].as_array().unwrap().len(), 0);
    assert_eq!(doc["ncs"][0]["dropped"], 6);
}

#[test]
fn capture_follows_the_per_core_and_per_type_switches() {
    let mut c = SysTraceConfig::new();
    c.set_capture_enabled_for_nc(1, false);
    c.set_capture_enabled_for_event_type("tensor_op", false)
        .unwrap();
    assert_eq!(c.enabled_event_types(), vec!["execute"]);
    let t = started(3, &c);
    for vnc in 0..3 {
        t.record_execution(vnc, &exec(1, vnc, 1), NrtStatus::Success);
        t.record_tensor_op(vnc, &tensor_op(2));
    }
    let doc = all(&t);
    assert_eq!(doc["event_types"], serde_json::json!(["execute"]));
    for (nc, want) in [(0, 1), (1, 0), (2, 1)] {
        assert_eq!(field(&doc, nc, "type").len(), want, "nc {nc}: {doc}");
        assert_eq!(doc["ncs"][nc]["capture_enabled"], nc != 1);
    }
    assert_eq!(field(&doc, 0, "type"), vec![Value::from("execute")]);

    // Re-enabled (the last call for a core wins), and tensor ops only.
    t.stop().unwrap();
    let mut c = SysTraceConfig::new();
    c.set_capture_enabled_for_nc(1, false);
    c.set_capture_enabled_for_nc(1, true);
    c.set_capture_enabled_for_event_type("execute", false)
        .unwrap();
    t.start(&c).unwrap();
    t.record_execution(1, &exec(1, 1, 3), NrtStatus::Success);
    t.record_tensor_op(1, &tensor_op(4));
    let doc = all(&t);
    assert_eq!(field(&doc, 1, "type"), vec![Value::from("tensor_op")]);
    let e = &doc["ncs"][1]["events"][0];
    assert_eq!(
        (&e["op"], &e["seq_id"], &e["queue"], &e["bytes"]),
        (
            &Value::from("write"),
            &Value::from(4),
            &Value::from(1),
            &Value::from(4096)
        )
    );
}

#[test]
fn a_fetch_of_one_core_takes_only_that_cores_events() {
    let t = started(2, &SysTraceConfig::new());
    for seq in 0..5 {
        t.record_execution(0, &exec(1, 0, seq), NrtStatus::Success);
        t.record_execution(1, &exec(2, 1, 100 + seq), NrtStatus::ExecOob);
    }
    let doc = fetch(
        &t,
        SysTraceFetchOptions {
            nc_idx: Some(1),
            max_events_per_nc: Some(2),
        },
    );
    let ncs = doc["ncs"].as_array().unwrap();
    assert_eq!(ncs.len(), 1, "{doc}");
    assert_eq!(ncs[0]["nc_idx"], 1);
    assert_eq!(
        field(&doc, 0, "seq_id"),
        vec![Value::from(100), Value::from(101)]
    );
    assert_eq!(ncs[0]["events"][0]["status"], "NRT_EXEC_OOB");
    assert_eq!(ncs[0]["events"][0]["status_code"], 1006);
    assert_eq!(ncs[0]["held"], 3);
    // Core 0 was not touched; core 1 keeps the rest, oldest first.
    let doc = all(&t);
    assert_eq!(field(&doc, 0, "seq_id").len(), 5);
    assert_eq!(
        field(&doc, 1, "seq_id"),
        (102..105).map(Value::from).collect::<Vec<_>>()
    );
    assert_eq!(field(&doc, 1, "event_idx")[0], 2);
}

#[test]
fn bad_configs_and_options_are_refused_naming_what_is_wrong() {
    let mut c = SysTraceConfig::new();
    let e = c
        .set_capture_enabled_for_event_type("dma", true)
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("\"dma\""), "{e}");
    let t = trace(2);
    let e = t.stop().unwrap_err();
    assert!(e.message.contains("not started"), "{e}");
    c.set_max_events_per_nc(0);
    let e = t.start(&c).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("max_events_per_nc"), "{e}");
    let mut c = SysTraceConfig::new();
    c.set_capture_enabled_for_nc(2, true);
    let e = t.start(&c).unwrap_err();
    assert!(e.message.contains("nc_idx 2"), "{e}");
    c.set_defaults();
    assert_eq!(c, SysTraceConfig::new());
    t.start(&c).unwrap();
    let e = t.start(&c).unwrap_err();
    assert!(e.message.contains("already started"), "{e}");
    let e = t
        .fetch(
            &SysTraceFetchOptions {
                nc_idx: Some(2),
                max_events_per_nc: None,
            },
            |_| None,
        )
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("nc_idx 2"), "{e}");
    let e = t.profile_stop(Path::new("/nowhere/p.json")).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("/nowhere/p.json"), "{e}");
    assert_eq!(EVENT_TYPES, ["execute", "tensor_op"]);
}

#[test]
fn a_profile_holds_its_models_executions_only() {
    let t = trace(2);
    t.profile_start(
        5,
        "five",
        1,
        DeviceProgram::NeffShapeOnly,
        "/tmp/p5.json".into(),
    )
    .unwrap();
    assert!(
        t.armed(),
        "a profile arms the recorder without the system trace"
    );
    for seq in 0..3 {
        t.record_execution(1, &exec(5, 1, seq), NrtStatus::Success);
        t.record_execution(1, &exec(6, 1, 10 + seq), NrtStatus::Success);
    }
    let e = t
        .profile_start(6, "six", 1, DeviceProgram::Container, "/tmp/p5.json".into())
        .unwrap_err();
    assert!(e.message.contains("already"), "{e}");
    let p = t.profile_stop(Path::new("/tmp/p5.json")).unwrap();
    assert!(!t.armed());
    let seqs: Vec<u64> = p.ring.snapshot().iter().map(|e| e.seq_id).collect();
    assert_eq!(seqs, vec![0, 1, 2]);
    assert_eq!(all(&t)["ncs"][1]["recorded"], 0, "the system trace was off");
    let doc: Value = serde_json::from_str(&chrome_trace(&p, 42, "sim", &[11])).unwrap();
    let spans: Vec<&Value> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "execute")
        .collect();
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(|s| s["name"] == "five" && s["tid"] == 4));
    assert!(
        doc["otherData"]["format"]
            .as_str()
            .unwrap()
            .contains("NOT an NTFF")
    );
    // A NEFF run shape-only says so, in the file and on each execution.
    assert_eq!(doc["otherData"]["shape_only"], true);
    assert!(
        doc["otherData"]["device_program"]
            .as_str()
            .unwrap()
            .contains("shape-only")
    );
    assert!(spans.iter().all(|s| s["args"]["shape_only"] == true));
}

#[test]
fn lanes_keep_the_spans_of_one_track_apart() {
    // Sorted by start; a lane is free again from its last span's end.
    let spans = [(0, 10), (2, 5), (3, 4), (5, 12), (10, 11), (11, 20)];
    assert_eq!(super::json::lanes(spans), [0, 1, 2, 1, 0, 0]);
    assert_eq!(super::json::lanes([(0, 5), (5, 9), (9, 9)]), [0, 0, 0]);
}

#[test]
fn a_profile_of_overlapping_executions_nests_on_every_track() {
    let t = trace(1);
    t.profile_start(
        1,
        "m",
        0,
        DeviceProgram::Container,
        "/tmp/p-overlap.json".into(),
    )
    .unwrap();
    // Sixteen in flight: each staged before the previous one ended.
    let infos: Vec<_> = (0..16).map(|seq| exec(1, 0, seq)).collect();
    for info in &infos {
        t.record_execution(0, info, NrtStatus::Success);
    }
    let p = t.profile_stop(Path::new("/tmp/p-overlap.json")).unwrap();
    let doc: Value = serde_json::from_str(&chrome_trace(&p, 42, "sim", &[10])).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let slices: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(slices.len(), 32);
    for a in &slices {
        for b in &slices {
            if std::ptr::eq(*a, *b) || a["tid"] != b["tid"] {
                continue;
            }
            let (a0, a1) = (
                a["ts"].as_f64().unwrap(),
                a["ts"].as_f64().unwrap() + a["dur"].as_f64().unwrap(),
            );
            let (b0, b1) = (
                b["ts"].as_f64().unwrap(),
                b["ts"].as_f64().unwrap() + b["dur"].as_f64().unwrap(),
            );
            let apart = a1 <= b0 || b1 <= a0;
            let nested = (a0 <= b0 && b1 <= a1) || (b0 <= a0 && a1 <= b1);
            assert!(apart || nested, "overlap on tid {}: {a} and {b}", a["tid"]);
        }
    }
    // Every track used is named.
    for s in &slices {
        assert!(
            events
                .iter()
                .any(|m| m["ph"] == "M" && m["name"] == "thread_name" && m["tid"] == s["tid"]),
            "unnamed track {}",
            s["tid"]
        );
    }
}

/// Several cores record at once while another thread fetches: every event lands in its own
/// core's ring exactly once, in order.
#[test]
fn concurrent_recorders_on_several_cores_lose_and_mix_nothing() {
    const CORES: u32 = 4;
    const PER_CORE: u64 = 2000;
    let t = started(CORES, &SysTraceConfig::new());
    let fetched: Vec<Value> = std::thread::scope(|s| {
        for vnc in 0..CORES {
            let t = &t;
            s.spawn(move || {
                for i in 0..PER_CORE {
                    let seq = u64::from(vnc) << 32 | i;
                    if i % 2 == 0 {
                        t.record_execution(
                            vnc,
                            &exec(u64::from(vnc), vnc, seq),
                            NrtStatus::Success,
                        );
                    } else {
                        t.record_tensor_op(vnc, &tensor_op(seq));
                    }
                }
            });
        }
        let fetcher = s.spawn(|| (0..50).map(|_| all(&t)).collect::<Vec<_>>());
        fetcher.join().unwrap()
    });
    let mut docs = fetched;
    docs.push(all(&t));
    for vnc in 0..CORES as usize {
        let mut seqs = Vec::new();
        let mut idxs = Vec::new();
        for d in &docs {
            for e in d["ncs"][vnc]["events"].as_array().unwrap() {
                assert_eq!(e["nc_idx"], vnc, "{e}");
                seqs.push(e["seq_id"].as_u64().unwrap());
                idxs.push(e["event_idx"].as_u64().unwrap());
            }
        }
        let want: Vec<u64> = (0..PER_CORE).map(|i| (vnc as u64) << 32 | i).collect();
        assert_eq!(seqs, want, "core {vnc}");
        assert_eq!(idxs, (0..PER_CORE).collect::<Vec<_>>());
        assert_eq!(docs.last().unwrap()["ncs"][vnc]["dropped"], 0);
    }
}
