//! Checks of a runtime timeline file (`NEURON_RT_TRACE`, `nrt bench --trace`): that one
//! execution's runtime spans and device events nest in time order. Shared by the in-process
//! test (`tests/tests/trace.rs`) and `nrt bench`'s (`runtime/nrt/tests/trace.rs`).

use serde_json::Value;

/// The first device pid of the file (`runtime::trace::file::DEVICE_PID_BASE`).
pub const DEVICE_PID_BASE: u64 = 1 << 22;

/// One span or event: start and end in microseconds, and the event.
#[derive(Clone, Debug)]
pub struct Slice {
    /// Start (µs).
    pub ts: f64,
    /// End (µs; `ts` for an instant event).
    pub end: f64,
    /// The event.
    pub event: Value,
}

fn slice(e: &Value) -> Slice {
    let ts = e["ts"].as_f64().expect("ts");
    Slice {
        ts,
        end: ts + e["dur"].as_f64().unwrap_or(0.0),
        event: e.clone(),
    }
}

/// Runtime spans named `name` of execution `seq_id` (the file's hex string) on `vnc`.
fn spans(events: &[Value], name: &str, seq_id: &str, vnc: u64) -> Vec<Slice> {
    events
        .iter()
        .filter(|e| {
            e["cat"] == "runtime"
                && e["name"] == name
                && e["args"]["seq_id"] == seq_id
                && e["args"]["vnc"].as_u64() == Some(vnc)
        })
        .map(slice)
        .collect::<Vec<_>>()
}

/// What [`check_execution`] found of one execution.
#[derive(Clone, Debug)]
pub struct Execution {
    /// Its seq_id (hex, as the file has it).
    pub seq_id: String,
    /// Its compute_idx.
    pub compute_idx: u64,
    /// The runtime's spans.
    pub execute: Slice,
    /// The worker's harvest.
    pub harvest: Slice,
    /// The device's execution.
    pub device_execution: Slice,
    /// The device's notification.
    pub notification: Slice,
}

/// Parses a timeline file, checks its shape (object form, `displayTimeUnit`, the runtime
/// process and logical-core processes named, `otherData` naming simdev as the device source)
/// and that the `n`-th sync execution (in start order) nests: its execute span contains bind,
/// stage, doorbell and wait on its thread; the doorbell starts before the device's execution
/// of its `compute_idx` starts; the device's notification comes before the harvest ends; the
/// harvest ends before the execute span ends.
///
/// # Panics
/// On any violation, naming it.
pub fn check_execution(bytes: &[u8], n: usize) -> Execution {
    let trace: Value = serde_json::from_slice(bytes).expect("the timeline is JSON");
    assert_eq!(trace["displayTimeUnit"], "ns");
    let other = &trace["otherData"];
    assert_eq!(
        other["sources"],
        serde_json::json!(["runtime", "simdev"]),
        "{other}"
    );
    assert!(
        other["device_events"]
            .as_str()
            .is_some_and(|s| s.starts_with("simdev (simulated device")),
        "{other}"
    );
    assert_eq!(other["dropped_spans"].as_u64(), Some(0), "{other}");
    assert_eq!(other["dropped_device_events"].as_u64(), Some(0), "{other}");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let named = |pid: u64, tid: u64, what: &str| -> Option<String> {
        events
            .iter()
            .find(|e| {
                e["ph"] == "M"
                    && e["pid"].as_u64() == Some(pid)
                    && e["tid"].as_u64() == Some(tid)
                    && e["name"] == what
            })
            .and_then(|e| e["args"]["name"].as_str().map(str::to_owned))
    };
    let mut executes: Vec<Slice> = events
        .iter()
        .filter(|e| e["cat"] == "runtime" && e["name"] == "execute")
        .map(slice)
        .collect();
    executes.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let execute = executes
        .get(n)
        .cloned()
        .unwrap_or_else(|| panic!("no execute span #{n} ({} in the file)", executes.len()));
    let e = &execute.event;
    let pid = e["pid"].as_u64().expect("pid");
    let tid = e["tid"].as_u64().expect("tid");
    assert!(pid < DEVICE_PID_BASE);
    let process = named(pid, 0, "process_name").expect("the runtime process is named");
    assert!(process.ends_with(&format!("(pid {pid})")), "{process}");
    assert!(
        named(pid, tid, "thread_name").is_some(),
        "the thread is named"
    );
    let seq_id = e["args"]["seq_id"].as_str().expect("seq_id").to_owned();
    let compute_idx = e["args"]["compute_idx"].as_u64().expect("compute_idx");
    let vnc = e["args"]["vnc"].as_u64().expect("vnc");
    assert_ne!(
        seq_id, "0x0",
        "the execute span carries the execution's seq_id"
    );
    let one = |name: &str| -> Slice {
        let found = spans(events, name, &seq_id, vnc);
        assert_eq!(found.len(), 1, "{name} spans of {seq_id}: {found:?}");
        let s = found[0].clone();
        assert_eq!(
            s.event["args"]["compute_idx"].as_u64(),
            Some(compute_idx),
            "{name}"
        );
        s
    };
    let inside = |s: &Slice, what: &str| {
        assert!(
            execute.ts <= s.ts && s.end <= execute.end,
            "{what} [{}, {}] is not inside execute [{}, {}]",
            s.ts,
            s.end,
            execute.ts,
            execute.end
        );
        assert_eq!(
            s.event["tid"].as_u64(),
            Some(tid),
            "{what} is on the caller's thread"
        );
    };
    let binds = spans(events, "bind", &seq_id, vnc);
    assert!(!binds.is_empty(), "no bind span of {seq_id}");
    let (stage, doorbell, wait, harvest) =
        (one("stage"), one("doorbell"), one("wait"), one("harvest"));
    for b in &binds {
        inside(b, "bind");
        assert!(b.end <= stage.ts, "bind ends before stage");
    }
    inside(&stage, "stage");
    inside(&doorbell, "doorbell");
    inside(&wait, "wait");
    assert!(
        stage.end <= doorbell.ts && doorbell.end <= wait.ts,
        "stage, doorbell, wait in order"
    );
    let worker = harvest.event["tid"].as_u64().expect("tid");
    assert_ne!(worker, tid, "the harvest runs on the worker");
    assert!(
        named(pid, worker, "thread_name").is_some(),
        "the worker is named"
    );
    // The device's events of the execution, in its logical core's process.
    let device_pid = DEVICE_PID_BASE + vnc;
    assert!(
        named(device_pid, 0, "process_name")
            .is_some_and(|n| n.starts_with(&format!("logical core {vnc}"))),
        "the logical core's process is named"
    );
    let device = |cat: &str| -> Vec<Slice> {
        events
            .iter()
            .filter(|d| {
                d["cat"] == cat
                    && d["pid"].as_u64() == Some(device_pid)
                    && d["args"]["compute_idx"].as_u64() == Some(compute_idx)
            })
            .map(slice)
            .collect()
    };
    // One execution and one notification per NC of the logical core (its track: tid / 8).
    let by_nc = |slices: Vec<Slice>| -> std::collections::BTreeMap<u64, Vec<Slice>> {
        let mut map = std::collections::BTreeMap::<u64, Vec<Slice>>::new();
        for s in slices {
            let nc = s.event["tid"].as_u64().expect("tid") / 8;
            map.entry(nc).or_default().push(s);
        }
        map
    };
    let executions = by_nc(device("execution"));
    let notes = by_nc(
        device("notification")
            .into_iter()
            .filter(|s| s.event["name"] == "Execution")
            .collect(),
    );
    assert!(
        !executions.is_empty(),
        "no device execution of compute_idx {compute_idx}"
    );
    assert_eq!(
        executions.keys().collect::<Vec<_>>(),
        notes.keys().collect::<Vec<_>>(),
        "each NC that executed notified"
    );
    for (nc, slices) in executions.iter().chain(notes.iter()) {
        assert_eq!(
            slices.len(),
            1,
            "NC {nc}, compute_idx {compute_idx}: {slices:?}"
        );
    }
    for (nc, exec) in &executions {
        let exec = &exec[0];
        let track = exec.event["tid"].as_u64().expect("tid");
        assert!(
            named(device_pid, track, "thread_name")
                .is_some_and(|n| n == format!("NC {nc} sequencer")),
            "the device execution is on NC {nc}'s sequencer track"
        );
        assert!(
            doorbell.ts < exec.ts,
            "the doorbell ({}) starts before NC {nc}'s execution ({})",
            doorbell.ts,
            exec.ts
        );
        let note = &notes[nc][0];
        assert!(
            note.ts <= harvest.end,
            "NC {nc}'s notification ({}) comes before the harvest ends ({})",
            note.ts,
            harvest.end
        );
    }
    let main = executions.keys().next().copied().unwrap_or_default();
    let device_execution = executions[&main][0].clone();
    let notification = notes[&main][0].clone();
    assert!(
        harvest.end <= execute.end,
        "the harvest ends ({}) before the execute span ({})",
        harvest.end,
        execute.end
    );
    assert!(harvest.end <= wait.end, "the wait ends after the harvest");
    Execution {
        seq_id,
        compute_idx,
        execute,
        harvest,
        device_execution,
        notification,
    }
}
