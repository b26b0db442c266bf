//! The system trace and the per-model profile against the real simdev: execute spans with
//! increasing sequence ids and consistent timestamps while capturing (sync, explicit async,
//! the implicit async pool, several logical cores at once), none while not, and a profile file
//! that is Chrome trace JSON of one model's executions only.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use runtime::builder::identity_with;
use runtime::config::RuntimeConfig;
use runtime::sys_trace::{SysTraceConfig, SysTraceFetchOptions};
use runtime::{ModelHandle, Placement, Runtime, TensorSet};
use serde_json::Value;
use shared::NrtStatus;
use shared::model::Target;
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

fn runtime() -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    runtime_with(RuntimeConfig::default())
}

fn load(rt: &Runtime, name: &str, vnc: i32) -> ModelHandle {
    let m = identity_with(256, name, [0; 13], [0; 32]);
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

fn fetch(rt: &Runtime, nc_idx: Option<u32>) -> Value {
    let text = rt
        .sys_trace_fetch_events(&SysTraceFetchOptions {
            nc_idx,
            max_events_per_nc: None,
        })
        .unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The events of logical core `nc` in a fetch of every core.
fn events(doc: &Value, nc: usize) -> Vec<Value> {
    doc["ncs"][nc]["events"].as_array().unwrap().clone()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Each span's timestamps are ordered, and span i ends before span i+1 is submitted
/// (sequential calls on one thread).
fn assert_sequential_spans(spans: &[Value]) {
    for s in spans {
        assert!(u(&s["submit_ns"]) <= u(&s["start_ns"]), "{s}");
        assert!(u(&s["start_ns"]) <= u(&s["end_ns"]), "{s}");
    }
    for w in spans.windows(2) {
        assert!(
            u(&w[0]["end_ns"]) <= u(&w[1]["submit_ns"]),
            "{} then {}",
            w[0],
            w[1]
        );
        assert_eq!(
            u(&w[1]["seq_num"]),
            u(&w[0]["seq_num"]) + 1,
            "{} then {}",
            w[0],
            w[1]
        );
    }
}

#[test]
fn sync_executions_make_one_span_each_while_capturing_and_none_otherwise() {
    let (rt, _sim) = runtime();
    let m = load(&rt, "alpha", 0);
    let (ins, outs) = io(&rt, 0);
    for _ in 0..3 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    rt.sys_trace_start(&SysTraceConfig::new()).unwrap();
    let doc = fetch(&rt, None);
    assert_eq!(doc["capturing"], true);
    assert!(events(&doc, 0).is_empty(), "executions before start: {doc}");

    const N: usize = 12;
    for _ in 0..N {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let doc = fetch(&rt, None);
    let spans = events(&doc, 0);
    assert_eq!(spans.len(), N, "{doc}");
    assert!(events(&doc, 1).is_empty(), "nothing ran on core 1: {doc}");
    assert_sequential_spans(&spans);
    for s in &spans {
        assert_eq!(s["type"], "execute");
        assert_eq!(s["model"], "alpha");
        assert_eq!(s["device_program"], "container");
        assert_eq!(s["shape_only"], false);
        assert_eq!(s["model_id"], m.id);
        assert_eq!(s["nc_idx"], 0);
        assert_eq!(s["physical_ncs"], serde_json::json!([0]));
        assert_eq!(s["status"], "NRT_SUCCESS");
        assert_eq!(s["status_code"], 0);
    }
    // Three executions before start (sequence numbers 1 to 3), then N: the XU's numbers.
    assert_eq!(u(&spans[0]["seq_num"]), 4);
    assert_eq!(doc["ncs"][0]["recorded"], N);
    assert_eq!(doc["ncs"][0]["dropped"], 0);

    rt.sys_trace_stop().unwrap();
    for _ in 0..3 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let doc = fetch(&rt, None);
    assert_eq!(doc["capturing"], false);
    assert!(events(&doc, 0).is_empty(), "executions after stop: {doc}");
    rt.close();
}

#[test]
fn explicit_async_spans_carry_the_scheduled_sequence_ids() {
    let (rt, _sim) = runtime();
    let m = load(&rt, "alpha", 0);
    let (ins, outs) = io(&rt, 0);
    rt.execute(m, &ins, &outs).unwrap();
    let mut c = SysTraceConfig::new();
    c.set_max_events_per_nc(4);
    rt.sys_trace_start(&c).unwrap();
    let mut seqs = Vec::new();
    for _ in 0..6 {
        let r = rt.execute_schedule(m, &ins, &outs).unwrap();
        assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
        seqs.push(r.seq_id().raw());
    }
    let doc = fetch(&rt, Some(0));
    assert_eq!(doc["ncs"].as_array().unwrap().len(), 1);
    let spans = events(&doc, 0);
    let got: Vec<u64> = spans.iter().map(|s| u(&s["seq_id"])).collect();
    assert_eq!(got, seqs[2..], "the ring of 4 keeps the newest: {doc}");
    assert_eq!(doc["ncs"][0]["dropped"], 2);
    assert_sequential_spans(&spans);
    rt.close();
}

#[test]
fn implicit_async_spans_carry_the_callbacks_job_ids() {
    let (rt, _sim) = runtime_with(RuntimeConfig {
        async_max_inflight: 3,
        ..RuntimeConfig::default()
    });
    let m = load(&rt, "alpha", 0);
    let (ins, outs) = io(&rt, 0);
    let jobs = Arc::new(Mutex::new(Vec::new()));
    let j2 = jobs.clone();
    rt.register_async_exec_callback(Arc::new(move |_, _, job, status| {
        assert_eq!(status, NrtStatus::Success);
        j2.lock().unwrap().push(job);
    }))
    .unwrap();
    rt.sys_trace_start(&SysTraceConfig::new()).unwrap();
    for _ in 0..8 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    rt.async_drain(0);
    let doc = fetch(&rt, None);
    let got: Vec<u64> = events(&doc, 0).iter().map(|s| u(&s["seq_id"])).collect();
    assert_eq!(got, *jobs.lock().unwrap(), "{doc}");
    assert_eq!(got.len(), 8);
    rt.close();
}

#[test]
fn concurrent_executions_on_two_cores_each_land_in_their_cores_ring() {
    let (rt, _sim) = runtime();
    let models = [load(&rt, "alpha", 0), load(&rt, "beta", 1)];
    rt.sys_trace_start(&SysTraceConfig::new()).unwrap();
    const PER_THREAD: usize = 25;
    std::thread::scope(|s| {
        for (vnc, m) in models.iter().enumerate() {
            for _ in 0..2 {
                let rt = &rt;
                s.spawn(move || {
                    let (ins, outs) = io(rt, u32::try_from(vnc).unwrap());
                    for _ in 0..PER_THREAD {
                        rt.execute(*m, &ins, &outs).unwrap();
                    }
                });
            }
        }
    });
    let doc = fetch(&rt, None);
    for (vnc, name) in [(0usize, "alpha"), (1, "beta")] {
        let spans = events(&doc, vnc);
        assert_eq!(spans.len(), 2 * PER_THREAD, "core {vnc}: {doc}");
        assert!(
            spans
                .iter()
                .all(|s| s["model"] == name && s["nc_idx"] == vnc)
        );
        let mut seqs: Vec<u64> = spans.iter().map(|s| u(&s["seq_num"])).collect();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(
            seqs.len(),
            2 * PER_THREAD,
            "distinct sequence ids on core {vnc}"
        );
    }
    rt.close();
}

#[test]
fn a_profile_file_is_chrome_trace_json_of_that_models_executions_only() {
    let (rt, _sim) = runtime();
    let alpha = load(&rt, "alpha", 0);
    let beta = load(&rt, "beta", 0);
    let (ins, outs) = io(&rt, 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alpha.json");
    rt.execute(alpha, &ins, &outs).unwrap();
    rt.profile_start(alpha, &path).unwrap();
    for _ in 0..4 {
        rt.execute(alpha, &ins, &outs).unwrap();
        rt.execute(beta, &ins, &outs).unwrap();
    }
    rt.profile_stop(&path).unwrap();
    rt.execute(alpha, &ins, &outs).unwrap();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let trace = doc["traceEvents"].as_array().unwrap();
    let spans: Vec<&Value> = trace
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "execute")
        .collect();
    assert_eq!(spans.len(), 4, "{doc}");
    for s in &spans {
        assert_eq!(s["name"], "alpha");
        assert_eq!(s["args"]["model_id"], alpha.id);
        assert_eq!(s["args"]["status"], "NRT_SUCCESS");
        assert!(s["dur"].as_f64().unwrap() >= 0.0);
    }
    let seqs: Vec<u64> = spans.iter().map(|s| u(&s["args"]["seq_num"])).collect();
    // Sequence number 1 ran before the start; alpha's are the even ones, between beta's.
    assert_eq!(seqs, vec![2, 4, 6, 8]);
    assert!(
        trace
            .iter()
            .any(|e| e["ph"] == "M" && e["name"] == "thread_name"),
        "named tracks"
    );
    let other = &doc["otherData"];
    assert!(
        other["format"].as_str().unwrap().contains("NOT an NTFF"),
        "{other}"
    );
    assert!(
        other["content"]
            .as_str()
            .unwrap()
            .contains("simdev does not decode a NEFF's instruction streams"),
        "{other}"
    );
    assert!(
        other["device_program"]
            .as_str()
            .unwrap()
            .contains("the model container's program"),
        "{other}"
    );
    assert_eq!(other["shape_only"], false);
    assert_eq!(other["model"], "alpha");

    // The errors: stop without start, an unknown model, an unwritable path.
    let e = rt.profile_stop(&path).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(e.message.contains("alpha.json"), "{e}");
    rt.unload(beta).unwrap();
    let e = rt
        .profile_start(beta, dir.path().join("b.json"))
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(
        e.message.contains(&format!("model handle {}", beta.id)),
        "{e}"
    );
    let bad = dir.path().join("no-such-dir/alpha.json");
    let e = rt.profile_start(alpha, &bad).unwrap_err();
    assert_eq!(e.status, NrtStatus::Failure);
    assert!(e.message.contains("no-such-dir/alpha.json"), "{e}");

    // A profile still being captured at close is written, not left empty.
    let open = dir.path().join("open.json");
    rt.profile_start(alpha, &open).unwrap();
    for _ in 0..3 {
        rt.execute(alpha, &ins, &outs).unwrap();
    }
    rt.close();
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&open).unwrap()).unwrap();
    let executions = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "execute")
        .count();
    assert_eq!(executions, 3, "{doc}");
}

/// Tensor operations are recorded when they complete, with their sequence ids, queue, bytes,
/// ordered timestamps and status; none before capture starts, none of a disabled type.
#[test]
fn tensor_operations_appear_with_their_sequence_ids_when_they_complete() {
    let (rt, _sim) = runtime();
    let a = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "a")
        .unwrap();
    let b = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 4096, "b")
        .unwrap();
    let before = rt.tensor_write_schedule(&a, &[1; 64], 0, 0, 0).unwrap();
    assert_eq!(rt.wait(&before).unwrap(), NrtStatus::Success);
    rt.sys_trace_start(&SysTraceConfig::new()).unwrap();
    let dest = runtime::ReadBuffer::new(100).unwrap();
    let ops = [
        (
            "write",
            rt.tensor_write_schedule(&a, &[2; 300], 8, 0, 0).unwrap(),
            300,
        ),
        (
            "copy",
            rt.tensor_copy_schedule(&a, 0, &b, 1000, 200, 1).unwrap(),
            200,
        ),
        (
            "read",
            rt.tensor_read_schedule(&dest, &b, 1000, 100, 0, 1).unwrap(),
            100,
        ),
        (
            "write",
            rt.tensor_write_schedule(&b, &[3; 4096], 0, 0, 0).unwrap(),
            4096,
        ),
    ];
    for (_, op, _) in &ops {
        assert_eq!(rt.wait(op).unwrap(), NrtStatus::Success);
    }
    let doc = fetch(&rt, None);
    let got: Vec<Value> = events(&doc, 0)
        .into_iter()
        .filter(|e| e["type"] == "tensor_op")
        .collect();
    assert_eq!(
        got.len(),
        ops.len(),
        "one event per operation after start: {doc}"
    );
    for (kind, op, bytes) in &ops {
        let e = got
            .iter()
            .find(|e| u(&e["seq_id"]) == op.seq_id().raw())
            .unwrap_or_else(|| panic!("{kind} {:#x} not recorded: {doc}", op.seq_id().raw()));
        assert_eq!(e["op"], *kind, "{e}");
        assert_eq!(u(&e["seq_num"]), op.seq_id().seq_num(), "{e}");
        assert_eq!(u(&e["queue"]), u64::from(op.queue()), "{e}");
        assert_eq!(u(&e["bytes"]), *bytes, "{e}");
        assert_eq!(e["status"], "NRT_SUCCESS", "{e}");
        assert_eq!(e["status_code"], 0, "{e}");
        assert!(u(&e["submit_ns"]) <= u(&e["start_ns"]), "{e}");
        assert!(u(&e["start_ns"]) <= u(&e["end_ns"]), "{e}");
        assert_eq!(e["nc_idx"], 0, "{e}");
    }
    assert!(
        !got.iter().any(|e| u(&e["seq_id"]) == before.seq_id().raw()),
        "completed before start: {doc}"
    );
    assert!(events(&doc, 1).is_empty(), "nothing ran on core 1: {doc}");
    rt.sys_trace_stop().unwrap();
    // With the type disabled, tensor operations are not recorded (executions still are).
    let mut c = SysTraceConfig::new();
    c.set_capture_enabled_for_event_type("tensor_op", false)
        .unwrap();
    rt.sys_trace_start(&c).unwrap();
    let op = rt.tensor_write_schedule(&a, &[4; 64], 0, 0, 1).unwrap();
    assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    let doc = fetch(&rt, None);
    assert!(events(&doc, 0).is_empty(), "tensor_op disabled: {doc}");
    drop((a, b));
    rt.close();
}
