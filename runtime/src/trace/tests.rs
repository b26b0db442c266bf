//! The timeline's recording and its file.

use serde_json::Value;
use shared::device_trace::{Detail, Event};
use shared::notification::NotificationKind;
use shared::protocol::TraceClock;

use super::file::{Contents, DEVICE_PID_BASE, DeviceSource};
use super::*;

fn ids(seq_id: u64) -> ExecIds {
    ExecIds {
        seq_id,
        compute_idx: 7,
        vnc: 0,
        model_id: 3,
    }
}

#[test]
fn a_disabled_timeline_records_nothing() {
    let t = Timeline::disabled();
    assert!(!t.enabled());
    assert_eq!(t.now(), None);
    assert_eq!(t.begin(), None);
    t.pend(SpanKind::Bind, t.now());
    t.commit(ids(1));
    t.record(SpanKind::Harvest, t.now(), ids(1));
    assert_eq!(t.snapshot(), (Vec::new(), Vec::new()));
    assert_eq!((t.dropped(), t.max_spans()), (0, 0));
}

#[test]
fn pended_spans_are_committed_with_the_executions_ids_on_the_calling_thread() {
    let t = Timeline::new(16);
    let exec = t.begin();
    let bind = t.now();
    t.pend(SpanKind::Bind, bind);
    t.pend(SpanKind::Execute, exec);
    t.commit(ids(0x1_0000_0000_0005));
    let (spans, threads) = t.snapshot();
    assert_eq!(spans.len(), 2);
    assert!(spans.iter().all(|s| s.ids == ids(0x1_0000_0000_0005)));
    assert_eq!(spans[0].kind, SpanKind::Bind);
    let e = spans[1];
    assert!(e.start_ns <= spans[0].start_ns);
    assert!(e.start_ns + e.dur_ns >= spans[0].start_ns + spans[0].dur_ns);
    assert_eq!(threads.len(), 1);
    assert_eq!(threads[0].0, e.tid);
    assert!(threads[0].1.contains("pended_spans"), "{threads:?}");
}

#[test]
fn a_failed_call_leaves_nothing_pended_for_the_next_one() {
    let t = Timeline::new(16);
    let _ = t.begin();
    t.pend(SpanKind::Bind, t.now()); // the call fails: no commit
    let start = t.begin();
    t.pend(SpanKind::Execute, start);
    t.commit(ids(2));
    let (spans, _) = t.snapshot();
    assert_eq!(
        spans.iter().map(|s| s.kind).collect::<Vec<_>>(),
        [SpanKind::Execute]
    );
}

#[test]
fn spans_beyond_the_bound_are_dropped_and_counted() {
    let t = Timeline::new(3);
    for i in 0..5 {
        t.record(SpanKind::Harvest, t.now(), ids(i));
    }
    for _ in 0..MAX_PENDING + 2 {
        t.pend(SpanKind::Bind, t.now());
    }
    t.commit(ids(9));
    assert_eq!(t.snapshot().0.len(), 3);
    // 2 harvests over the bound, 16 pended over it, 2 more than a thread can pend.
    assert_eq!(t.dropped(), 2 + MAX_PENDING as u64 + 2);
}

fn span(kind: SpanKind, start_ns: u64, dur_ns: u64) -> Span {
    Span {
        kind,
        tid: 42,
        start_ns,
        dur_ns,
        ids: ids(5),
    }
}

#[test]
fn the_file_groups_processes_and_tracks_places_device_events_on_the_host_clock_and_links_flows() {
    let spans = [
        span(SpanKind::Execute, 10_000, 9_000),
        span(SpanKind::Doorbell, 11_000, 500),
        span(SpanKind::Harvest, 17_000, 1_000),
    ];
    let clock = TraceClock {
        origin_monotonic_ns: 2_000,
        simulated: false,
    };
    let device = [
        Event {
            nc: 3,
            ts_ns: 10_000, // host 12_000
            dur_ns: Some(4_000),
            detail: Detail::Execution {
                compute_idx: 7,
                flags: 0,
                instructions: 1,
            },
        },
        Event {
            nc: 3,
            ts_ns: 14_500, // host 16_500
            dur_ns: None,
            detail: Detail::Notification {
                kind: NotificationKind::Execution as u16,
                compute_idx: 7,
                flags: 0,
                source: 0,
                dropped: false,
            },
        },
    ];
    let source = DeviceSource::Simdev { clock, dropped: 4 };
    let contents = Contents {
        pid: 1234,
        command: "bench",
        origin_ns: 10_000,
        spans: &spans,
        threads: &[(42, "main".into())],
        dropped_spans: 1,
        vncs: &[vec![3, 4]],
        device: &device,
        source: &source,
    };
    let mut bytes = Vec::new();
    assert_eq!(contents.write_json(&mut bytes).unwrap(), 5);
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let meta = |pid: u32, tid: u32, what: &str| {
        events
            .iter()
            .find(|e| e["ph"] == "M" && e["pid"] == pid && e["tid"] == tid && e["name"] == what)
            .map(|e| e["args"].clone())
    };
    assert_eq!(
        meta(1234, 0, "process_name").unwrap()["name"],
        "bench (pid 1234)"
    );
    assert_eq!(meta(1234, 42, "thread_name").unwrap()["name"], "main");
    let dev = DEVICE_PID_BASE;
    assert_eq!(
        meta(dev, 0, "process_name").unwrap()["name"],
        "logical core 0 (NC 3, NC 4)"
    );
    assert_eq!(meta(dev, 0, "process_sort_index").unwrap()["sort_index"], 1);
    assert_eq!(
        meta(dev, 4 * 8 + 2, "thread_name").unwrap()["name"],
        "NC 4 PE"
    );
    assert_eq!(
        meta(dev, 3 * 8 + 1, "thread_name").unwrap()["name"],
        "NC 3 sequencer"
    );
    let exec = events.iter().find(|e| e["cat"] == "execution").unwrap();
    assert_eq!(
        (exec["pid"].as_u64(), exec["ts"].as_f64()),
        (Some(u64::from(dev)), Some(2.0))
    );
    let doorbell = events
        .iter()
        .find(|e| e["name"] == "doorbell" && e["ph"] == "X")
        .unwrap();
    assert_eq!(doorbell["ts"].as_f64(), Some(1.0));
    assert_eq!(doorbell["args"]["seq_id"], "0x5");
    assert_eq!(doorbell["args"]["compute_idx"], 7);
    let flows: Vec<_> = events.iter().filter(|e| e["cat"] == "flow").collect();
    assert_eq!(
        flows.len(),
        4,
        "doorbell → execution, notification → harvest"
    );
    assert_eq!(
        (&flows[1]["ph"], flows[1]["pid"].as_u64()),
        (&"f".into(), Some(u64::from(dev)))
    );
    // The arrow into the harvest starts inside the execution slice on its own track (Perfetto
    // drops a flow whose start no open slice encloses, as at the notification's instant, 6.5).
    assert_eq!(
        (flows[2]["ph"].as_str(), flows[2]["tid"].as_u64()),
        (Some("s"), exec["tid"].as_u64())
    );
    let (start, end) = (
        exec["ts"].as_f64().unwrap(),
        exec["ts"].as_f64().unwrap() + exec["dur"].as_f64().unwrap(),
    );
    let ts = flows[2]["ts"].as_f64().unwrap();
    assert!(start <= ts && ts < end, "{ts} outside [{start}, {end})");
    assert_eq!(flows[3]["ts"].as_f64(), Some(7.0), "to the harvest's start");
    assert_eq!(json["displayTimeUnit"], "ns");
    let other = &json["otherData"];
    assert_eq!(other["sources"], serde_json::json!(["runtime", "simdev"]));
    assert_eq!(
        (
            other["dropped_spans"].as_u64(),
            other["dropped_device_events"].as_u64()
        ),
        (Some(1), Some(4))
    );
    assert!(
        other["device_events"]
            .as_str()
            .unwrap()
            .starts_with("simdev")
    );
}

#[test]
fn without_device_events_the_file_says_why() {
    let source = DeviceSource::None("the neuron backend records no device trace".into());
    let contents = Contents {
        pid: 1,
        command: "x",
        origin_ns: 0,
        spans: &[],
        threads: &[],
        dropped_spans: 0,
        vncs: &[vec![0]],
        device: &[],
        source: &source,
    };
    let mut bytes = Vec::new();
    contents.write_json(&mut bytes).unwrap();
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(json["otherData"]["sources"], serde_json::json!(["runtime"]));
    assert!(
        json["otherData"]["device_events"]
            .as_str()
            .unwrap()
            .contains("neuron backend")
    );
    assert!(
        !json["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["pid"] == DEVICE_PID_BASE)
    );
}

#[test]
fn under_a_latency_model_device_events_say_so_and_keep_their_simulated_time() {
    let clock = TraceClock {
        origin_monotonic_ns: 1_000,
        simulated: true,
    };
    let source = DeviceSource::Simdev { clock, dropped: 0 };
    let device = [Event {
        nc: 0,
        ts_ns: 5_000,
        dur_ns: Some(2_000),
        detail: Detail::Execution {
            compute_idx: 1,
            flags: 0,
            instructions: 3,
        },
    }];
    let contents = Contents {
        pid: 1,
        command: "x",
        origin_ns: 0,
        spans: &[],
        threads: &[],
        dropped_spans: 0,
        vncs: &[vec![0]],
        device: &device,
        source: &source,
    };
    let mut bytes = Vec::new();
    contents.write_json(&mut bytes).unwrap();
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        json["otherData"]["device_clock"]
            .as_str()
            .unwrap()
            .starts_with("simulated")
    );
    let exec = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cat"] == "execution")
        .unwrap();
    assert_eq!(exec["args"]["simulated_ts_ns"], 5_000);
    assert_eq!(
        exec["ts"].as_f64(),
        Some(6.0),
        "placed from simdev's origin"
    );
}
