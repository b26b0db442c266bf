//! The two documents: the system trace fetch (schema in the parent module's docs) and the
//! profile's Chrome trace-event file.

use serde_json::{Value, json};

use super::{DeviceProgram, Event, ExecuteEvent, Profile, TensorOpEvent};

/// One logical core's part of a fetch.
#[derive(Debug)]
pub(super) struct NcSection<'a> {
    pub(super) nc_idx: usize,
    pub(super) physical_ncs: &'a [u32],
    pub(super) capture_enabled: bool,
    pub(super) capacity: usize,
    pub(super) recorded: u64,
    pub(super) dropped: u64,
    pub(super) held: usize,
    pub(super) first_event_idx: u64,
    pub(super) events: Vec<Event>,
}

/// A model id's name and what the device runs for it, while it is loaded.
pub(super) type ModelLookup<'a> = dyn Fn(u64) -> Option<(String, DeviceProgram)> + 'a;

fn execute_event(e: &ExecuteEvent, event_idx: u64, model: &ModelLookup<'_>) -> Value {
    let (name, program) = model(e.model_id).unzip();
    json!({
        "type": "execute",
        "event_idx": event_idx,
        "nc_idx": e.vnc,
        "physical_ncs": &e.ncs[..e.num_ncs],
        "model_id": e.model_id,
        "model": name,
        "device_program": program.as_ref().map(DeviceProgram::tag),
        "shape_only": program.as_ref().map(DeviceProgram::shape_only),
        "seq_id": e.seq_id,
        "seq_num": shared::ids::SeqId::from_raw(e.seq_id).seq_num(),
        "compute_idx": e.compute_idx,
        "submit_ns": e.submit_ns,
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
        "device_ts_ns": e.device_ts_ns,
        "device_busy_ns": e.device_busy_ns,
        "status": e.status.name(),
        "status_code": e.status.as_u32(),
    })
}

fn tensor_op_event(e: &TensorOpEvent, event_idx: u64) -> Value {
    json!({
        "type": "tensor_op",
        "event_idx": event_idx,
        "nc_idx": e.vnc,
        "op": e.op.name(),
        "seq_id": e.seq_id,
        "seq_num": shared::ids::SeqId::from_raw(e.seq_id).seq_num(),
        "queue": e.queue,
        "bytes": e.bytes,
        "submit_ns": e.submit_ns,
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
        "status": e.status.name(),
        "status_code": e.status.as_u32(),
    })
}

/// The fetch document.
pub(super) fn fetch_document(
    origin_unix_ns: u64,
    capturing: bool,
    event_types: &[&str],
    ncs: &[NcSection<'_>],
    model: &ModelLookup<'_>,
) -> String {
    let ncs: Vec<Value> = ncs
        .iter()
        .map(|s| {
            let events: Vec<Value> = s
                .events
                .iter()
                .zip(s.first_event_idx..)
                .map(|(e, idx)| match e {
                    Event::Execute(x) => execute_event(x, idx, model),
                    Event::TensorOp(t) => tensor_op_event(t, idx),
                })
                .collect();
            json!({
                "nc_idx": s.nc_idx,
                "physical_ncs": s.physical_ncs,
                "capture_enabled": s.capture_enabled,
                "capacity": s.capacity,
                "recorded": s.recorded,
                "dropped": s.dropped,
                "held": s.held,
                "events": events,
            })
        })
        .collect();
    json!({
        "schema": "nrt_sys_trace/1",
        "clock": "host monotonic ns since nrt_init",
        "epoch_unix_ns": origin_unix_ns,
        "capturing": capturing,
        "event_types": event_types,
        "ncs": ncs,
    })
    .to_string()
}

/// Microseconds (Chrome trace `ts`/`dur` unit) from nanoseconds.
fn us(ns: u64) -> f64 {
    // Exact below 2^53 ns (104 days of uptime).
    ns as f64 / 1000.0
}

/// Lanes for spans `[start, end)` in the order given (sorted by start): each goes to the first
/// lane whose last span has ended, so the spans of one lane never overlap (a track's complete
/// events must nest, and overlapping executions do not).
pub(super) fn lanes(spans: impl IntoIterator<Item = (u64, u64)>) -> Vec<usize> {
    let mut ends: Vec<u64> = Vec::new();
    spans
        .into_iter()
        .map(|(start, end)| match ends.iter().position(|&e| e <= start) {
            Some(lane) => {
                ends[lane] = end;
                lane
            }
            None => {
                ends.push(end);
                ends.len() - 1
            }
        })
        .collect()
}

/// The profile file: Chrome trace-event JSON (object form) of `p`'s executions, for process
/// `pid` on a device whose backend is `backend`, the model's logical core being physical NCs
/// `ncs`. Two kinds of track: `tid = 2·vnc + 1` the host (bind to doorbell), `tid = 2·vnc + 2`
/// the logical core (doorbell to completion); executions that overlap (several in flight, or
/// several threads) take further lanes of their kind, `tid + 512·lane`, so that every track's
/// spans nest.
pub fn chrome_trace(p: &Profile, pid: u32, backend: &str, ncs: &[u32]) -> String {
    // Track kind 1: the host (bind to doorbell); kind 2: the logical core.
    let tid =
        |kind: u32, lane: usize| 2 * p.vnc + kind + 512 * u32::try_from(lane).unwrap_or(u32::MAX);
    let nc_list = ncs
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(" + ");
    let mut executions = p.ring.snapshot();
    executions.sort_by_key(|e| e.submit_ns);
    let host_lanes = lanes(executions.iter().map(|e| (e.submit_ns, e.start_ns)));
    let mut by_start: Vec<usize> = (0..executions.len()).collect();
    by_start.sort_by_key(|&i| executions[i].start_ns);
    let mut core_lanes = vec![0; executions.len()];
    for (i, lane) in by_start.iter().zip(lanes(
        by_start
            .iter()
            .map(|&i| (executions[i].start_ns, executions[i].end_ns)),
    )) {
        core_lanes[*i] = lane;
    }
    let mut events = vec![json!({"ph": "M", "name": "process_name", "pid": pid,
               "args": {"name": format!("nrt runtime (pid {pid}, {backend})")}})];
    let lane_name = |what: String, lane: usize| {
        if lane == 0 {
            what
        } else {
            format!("{what} (overlapping, lane {})", lane + 1)
        }
    };
    let tracks = [
        (
            1,
            format!("logical core {} host: bind → doorbell", p.vnc),
            &host_lanes,
        ),
        (
            2,
            format!(
                "logical core {} (NC {nc_list}): doorbell → completion",
                p.vnc
            ),
            &core_lanes,
        ),
    ];
    for (kind, name, lanes) in tracks {
        for lane in 0..=lanes.iter().copied().max().unwrap_or(0) {
            let tid = tid(kind, lane);
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                   "args": {"name": lane_name(name.clone(), lane)}}),
            );
            events.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                   "args": {"sort_index": tid}}),
            );
        }
    }
    for (i, e) in executions.iter().enumerate() {
        let seq_num = shared::ids::SeqId::from_raw(e.seq_id).seq_num();
        events.push(json!({
            "ph": "X", "cat": "host", "name": format!("bind + stage {}", p.model_name),
            "pid": pid, "tid": tid(1, host_lanes[i]),
            "ts": us(e.submit_ns), "dur": us(e.start_ns - e.submit_ns),
            "args": {"seq_id": e.seq_id, "seq_num": seq_num},
        }));
        events.push(json!({
            "ph": "X", "cat": "execute", "name": p.model_name,
            "pid": pid, "tid": tid(2, core_lanes[i]),
            "ts": us(e.start_ns), "dur": us(e.end_ns - e.start_ns),
            "args": {
                "model_id": e.model_id,
                "seq_id": e.seq_id,
                "seq_num": seq_num,
                "compute_idx": e.compute_idx,
                "status": e.status.name(),
                "status_code": e.status.as_u32(),
                "device_busy_ns": e.device_busy_ns,
                "device_ts_ns": e.device_ts_ns,
                "shape_only": p.device_program.shape_only(),
            },
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "format": "Chrome trace-event JSON (open it in Perfetto or chrome://tracing). This is NOT an NTFF file: neuron-profile cannot read it.",
            "content": "Host-side spans of each execution of one model as this runtime observed them (bind to doorbell, doorbell to completion), with the device's reported execution time (device_busy_ns). No instruction-level timeline: this runtime reads no device profiler, and simdev does not decode a NEFF's instruction streams.",
            "device_program": p.device_program.describe(),
            "shape_only": p.device_program.shape_only(),
            "backend": backend,
            "model": p.model_name,
            "model_id": p.model_id,
            "logical_core": p.vnc,
            "executions": executions.len(),
            "dropped_executions": p.ring.dropped(),
            "clock": "host monotonic us since nrt_init",
        },
    })
    .to_string()
}
