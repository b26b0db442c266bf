//! The execution trace (DESIGN §5 "Trace"): Chrome trace-event JSON that opens in Perfetto or
//! `chrome://tracing`.
//!
//! Events are kept in memory, at most [`DEFAULT_MAX_EVENTS`] (later ones are dropped and
//! counted), and written once, when simdev stops ([`Tracer::write`]). A disabled tracer holds
//! nothing; every recording site checks [`Tracer::enabled`] first, one branch (a relaxed
//! load: recording also turns on at run time when a client subscribes).
//!
//! **Subscriptions.** A client may ask for its own NCs' events without `--trace`
//! ([`shared::protocol::Request::TraceSubscribe`], then `TraceDrain`): [`Tracer::subscribe`]
//! keeps a bounded buffer per subscribed NC ([`MAX_SUBSCRIBED_EVENTS`] at most; drops
//! counted), [`Tracer::drain`] hands them over, and a claim or release of the NC ends the
//! subscription ([`Tracer::forget_nc`]), so one client never sees another's events. The
//! runtime merges them into its timeline (`runtime::trace`). The event types ([`Event`],
//! [`Detail`], [`Track`]) live in [`shared::device_trace`], which both sides use.
//!
//! # Schema
//! The file is the object form `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData":
//! {...}}`. Each NC is a process (`pid` = NC index, named `"NC n"` by `process_name`
//! metadata); its tracks are threads named by `thread_name` metadata: `tid` 1 `"sequencer"`,
//! 2–6 the engines `"PE"`, `"ACT"`, `"POOL"`, `"DVE"`, `"SP"`, 7 `"DMA"`. `ts` and `dur` are
//! microseconds (fractional): wall-clock time since simdev started with the default latency
//! model, the NC's simulated clock once a model is set (`otherData.clock` says which was in
//! force at the end). Events (`cat` names the kind):
//!
//! | cat | ph | track | name | args |
//! |---|---|---|---|---|
//! | `instruction` | X | the engine | the opcode (`"Matmul"`, `"DmaStart"`, ...) | `pc`, `compute_idx` |
//! | `execution` | X | sequencer | `"execution"` | `compute_idx`, `flags`, `instructions` |
//! | `sequencer` | X | sequencer | `"config reload"` / `"table load"` | `compute_idx` |
//! | `dma` | X | DMA | `"DMA e.q"` / `"exec batch"` | `engine`, `queue`, `pairs`, `bytes` |
//! | `doorbell` | i | sequencer | `"doorbell"` | `semaphore`, `value` |
//! | `notification` | i | sequencer | the kind (`"Execution"`, `"DmaQueueError"`, `"DeviceLost"`) | `compute_idx`, `flags`, `source`, `dropped` |
//! | `fault` | i | sequencer | `"fault <Kind>"` | `compute_idx` |
//!
//! A `dma` event covers one run of a queue (the pairs one CopyStart, tail increment or SP
//! `DmaStart` made it process), or the four head pairs of an exec batch that the sequencer
//! fetched. Instant events have `"s": "t"` (thread scope).

use std::collections::VecDeque;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde_json::{Value, json};
pub use shared::device_trace::{Detail, Event, Track};

/// Most events a trace keeps in memory by default.
pub const DEFAULT_MAX_EVENTS: usize = 1_000_000;

/// Most events a client's subscription holds per NC ([`Tracer::subscribe`] caps the client's
/// ask at this).
pub const MAX_SUBSCRIBED_EVENTS: usize = 1 << 20;

/// The `--trace` file's state.
#[derive(Debug)]
struct Inner {
    path: PathBuf,
    ncs: u32,
    max_events: usize,
    events: Mutex<Vec<Event>>,
    dropped: AtomicU64,
}

/// One NC's subscription: the client that asked and the events held for it.
#[derive(Debug)]
struct Subscription {
    client: u64,
    max_events: usize,
    events: VecDeque<Event>,
    dropped: u64,
}

impl Subscription {
    fn push(&mut self, event: Event) {
        if self.events.len() < self.max_events {
            self.events.push_back(event);
        } else {
            self.dropped = self.dropped.saturating_add(1);
        }
    }
}

/// What a written trace holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// The file.
    pub path: PathBuf,
    /// Events written (metadata not counted).
    pub events: usize,
    /// Events dropped beyond the bound.
    pub dropped: u64,
}

/// The device's trace: the `--trace` file's buffer (fixed at start) and the clients'
/// subscriptions (made at run time, [`Tracer::subscribe`]). Recording is on while either
/// exists: [`Tracer::enabled`] is one relaxed load, the one branch of every recording site.
///
/// Invariant: a subscription holds only events of its NC, recorded while its client was
/// subscribed; [`Tracer::forget_nc`] (called when the NC is claimed or released) drops it, so
/// a later owner never sees an earlier one's events and vice versa.
#[derive(Debug, Default)]
pub struct Tracer {
    on: AtomicBool,
    file: Option<Box<Inner>>,
    /// Per NC index.
    subs: Mutex<Vec<Option<Subscription>>>,
}

impl Tracer {
    /// A tracer that records nothing (until a client subscribes).
    pub const fn disabled() -> Self {
        Self {
            on: AtomicBool::new(false),
            file: None,
            subs: Mutex::new(Vec::new()),
        }
    }

    /// A tracer for a device of `ncs` NCs that keeps at most `max_events` events and writes
    /// them to `path`.
    pub fn to_file(path: PathBuf, ncs: u32, max_events: usize) -> Self {
        Self {
            on: AtomicBool::new(true),
            file: Some(Box::new(Inner {
                path,
                ncs,
                max_events,
                events: Mutex::new(Vec::new()),
                dropped: AtomicU64::new(0),
            })),
            subs: Mutex::new(Vec::new()),
        }
    }

    /// Whether events are recorded (a `--trace` file or a subscription).
    #[inline]
    pub fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The trace file, when `--trace` is set.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_deref().map(|i| i.path.as_path())
    }

    /// Starts holding events of each NC of `ncs` for `client` (at most `max_events` each,
    /// capped at [`MAX_SUBSCRIBED_EVENTS`]), replacing an earlier subscription of the NC.
    pub fn subscribe(&self, client: u64, ncs: &[u32], max_events: usize) {
        let mut subs = self.subs.lock().unwrap_or_else(PoisonError::into_inner);
        for &nc in ncs {
            let i = nc as usize;
            if subs.len() <= i {
                subs.resize_with(i + 1, || None);
            }
            subs[i] = Some(Subscription {
                client,
                max_events: max_events.min(MAX_SUBSCRIBED_EVENTS),
                events: VecDeque::new(),
                dropped: 0,
            });
        }
        if !ncs.is_empty() {
            self.on.store(true, Ordering::Relaxed);
        }
    }

    /// Ends NC `nc`'s subscription, discarding what it holds (the NC changes hands). Recording
    /// stays on while another subscription or the file remains.
    pub fn forget_nc(&self, nc: u32) {
        let mut subs = self.subs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = subs.get_mut(nc as usize) {
            *slot = None;
        }
        let any = subs.iter().any(Option::is_some);
        self.on.store(any || self.file.is_some(), Ordering::Relaxed);
    }

    /// Takes `client`'s held events, oldest first per NC, while `fits(event)` says the next one
    /// still fits (the reply's size budget). Returns the events, the drops counted since the
    /// last drain, and whether more are held.
    pub fn drain(
        &self,
        client: u64,
        mut fits: impl FnMut(&Event) -> bool,
    ) -> (Vec<Event>, u64, bool) {
        let mut subs = self.subs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        let mut dropped = 0u64;
        let mut more = false;
        for sub in subs.iter_mut().flatten().filter(|s| s.client == client) {
            dropped = dropped.saturating_add(std::mem::take(&mut sub.dropped));
            while let Some(event) = sub.events.front() {
                if more || !fits(event) {
                    more = true;
                    break;
                }
                if let Some(event) = sub.events.pop_front() {
                    out.push(event);
                }
            }
        }
        (out, dropped, more)
    }

    /// Events the buffer can still take before it drops (0 when disabled): the most any
    /// buffer (the file's, a subscription's) has room for.
    pub fn room(&self) -> usize {
        if !self.enabled() {
            return 0;
        }
        let file = self.file.as_deref().map_or(0, |inner| {
            let held = inner
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len();
            inner.max_events.saturating_sub(held)
        });
        let subs = self.subs.lock().unwrap_or_else(PoisonError::into_inner);
        subs.iter()
            .flatten()
            .map(|s| s.max_events.saturating_sub(s.events.len()))
            .fold(file, usize::max)
    }

    /// Records `event` (dropped and counted when the buffer is full).
    pub fn record(&self, event: Event) {
        self.record_all(vec![event], 0);
    }

    /// Records `events` and counts `dropped` more that the caller could not keep (counted for
    /// the file and for the subscription of the NC of the first event).
    pub fn record_all(&self, events: Vec<Event>, dropped: u64) {
        if !self.enabled() {
            return;
        }
        {
            let mut subs = self.subs.lock().unwrap_or_else(PoisonError::into_inner);
            if !subs.is_empty() {
                if dropped > 0
                    && let Some(Some(sub)) =
                        events.first().and_then(|e| subs.get_mut(e.nc as usize))
                {
                    sub.dropped = sub.dropped.saturating_add(dropped);
                }
                for event in &events {
                    if let Some(Some(sub)) = subs.get_mut(event.nc as usize) {
                        sub.push(event.clone());
                    }
                }
            }
        }
        let Some(inner) = self.file.as_deref() else {
            return;
        };
        let mut held = inner.events.lock().unwrap_or_else(PoisonError::into_inner);
        let room = inner.max_events.saturating_sub(held.len());
        let over = events.len().saturating_sub(room);
        held.extend(events.into_iter().take(room));
        drop(held);
        let lost = dropped.saturating_add(u64::try_from(over).unwrap_or(u64::MAX));
        if lost > 0 {
            inner.dropped.fetch_add(lost, Ordering::Relaxed);
        }
    }

    /// What the trace holds now (what [`Tracer::write`] would write); `None` when disabled.
    pub fn summary(&self) -> Option<Summary> {
        let inner = self.file.as_deref()?;
        let events = inner
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        Some(Summary {
            path: inner.path.clone(),
            events,
            dropped: self.dropped(),
        })
    }

    /// Events dropped from the file's buffer so far.
    pub fn dropped(&self) -> u64 {
        self.file
            .as_deref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }

    /// Writes the trace's JSON to `out`; `clock` names the time base (`"wall"` or
    /// `"simulated"`). Returns the number of events written.
    ///
    /// # Errors
    /// The writer's.
    pub fn write_json(&self, out: impl Write, clock: &str) -> io::Result<usize> {
        let Some(inner) = self.file.as_deref() else {
            return Ok(0);
        };
        let events = inner
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut out = BufWriter::new(out);
        out.write_all(b"{\"traceEvents\":[\n")?;
        let mut first = true;
        let mut item = |out: &mut BufWriter<_>, value: &Value| -> io::Result<()> {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut *out, value).map_err(io::Error::other)
        };
        for nc in 0..inner.ncs {
            item(
                &mut out,
                &json!({ "ph": "M", "name": "process_name", "pid": nc, "tid": 0,
                         "args": { "name": format!("NC {nc}") } }),
            )?;
            item(
                &mut out,
                &json!({ "ph": "M", "name": "process_sort_index", "pid": nc, "tid": 0,
                         "args": { "sort_index": nc } }),
            )?;
            for track in Track::ALL {
                item(
                    &mut out,
                    &json!({ "ph": "M", "name": "thread_name", "pid": nc, "tid": track.tid(),
                             "args": { "name": track.name() } }),
                )?;
                item(
                    &mut out,
                    &json!({ "ph": "M", "name": "thread_sort_index", "pid": nc,
                             "tid": track.tid(), "args": { "sort_index": track.tid() } }),
                )?;
            }
        }
        for event in &events {
            item(&mut out, &event.to_json())?;
        }
        let other = json!({
            "simdev": env!("CARGO_PKG_VERSION"),
            "clock": clock,
            "events": events.len(),
            "dropped_events": self.dropped(),
            "max_events": inner.max_events,
        });
        out.write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
        serde_json::to_writer(&mut out, &other).map_err(io::Error::other)?;
        out.write_all(b"}\n")?;
        out.flush()?;
        Ok(events.len())
    }

    /// Writes the trace to its file (replacing it); `None` when disabled.
    ///
    /// # Errors
    /// Creating or writing the file.
    pub fn write(&self, clock: &str) -> io::Result<Option<Summary>> {
        let Some(path) = self.path() else {
            return Ok(None);
        };
        let file = std::fs::File::create(path)?;
        let events = self.write_json(file, clock)?;
        Ok(Some(Summary {
            path: path.to_owned(),
            events,
            dropped: self.dropped(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::exec_request::Engine;
    use shared::isa::Opcode;
    use shared::notification::NotificationKind;

    fn doorbell(nc: u32, ts_ns: u64) -> Event {
        Event {
            nc,
            ts_ns,
            dur_ns: None,
            detail: Detail::Doorbell {
                semaphore: 250,
                value: 1,
            },
        }
    }

    fn parse(tracer: &Tracer) -> Value {
        let mut bytes = Vec::new();
        tracer.write_json(&mut bytes, "wall").unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn a_disabled_tracer_records_nothing() {
        let tracer = Tracer::disabled();
        assert!(!tracer.enabled());
        tracer.record(doorbell(0, 1));
        assert_eq!(tracer.room(), 0);
        assert_eq!(tracer.write("wall").unwrap(), None);
    }

    #[test]
    fn recording_is_on_while_a_subscription_lasts_and_off_after() {
        let tracer = Tracer::disabled();
        tracer.subscribe(7, &[], 10);
        assert!(
            !tracer.enabled(),
            "a client without NCs subscribes to nothing"
        );
        tracer.subscribe(7, &[1], 10);
        assert!(tracer.enabled());
        tracer.record(doorbell(0, 1)); // NC 0: nobody's
        tracer.record(doorbell(1, 2));
        assert_eq!(tracer.drain(7, |_| true).0, [doorbell(1, 2)]);
        assert!(tracer.drain(8, |_| true).0.is_empty(), "another client's");
        tracer.forget_nc(1);
        assert!(!tracer.enabled());
        tracer.record(doorbell(1, 3));
        assert_eq!(tracer.drain(7, |_| true), (Vec::new(), 0, false));
    }

    #[test]
    fn events_beyond_the_bound_are_dropped_and_counted() {
        let tracer = Tracer::to_file("/nonexistent/t.json".into(), 1, 3);
        assert_eq!(tracer.room(), 3);
        tracer.record(doorbell(0, 1));
        tracer.record_all(vec![doorbell(0, 2), doorbell(0, 3), doorbell(0, 4)], 5);
        assert_eq!(tracer.room(), 0);
        assert_eq!(tracer.dropped(), 6);
        let json = parse(&tracer);
        let events = json["traceEvents"].as_array().unwrap();
        let doorbells: Vec<f64> = events
            .iter()
            .filter(|e| e["cat"] == "doorbell")
            .map(|e| e["ts"].as_f64().unwrap())
            .collect();
        assert_eq!(doorbells, [0.001, 0.002, 0.003]);
        assert_eq!(json["otherData"]["dropped_events"], 6);
    }

    #[test]
    fn the_json_names_processes_and_threads_and_marks_phases() {
        let tracer = Tracer::to_file("/nonexistent/t.json".into(), 2, 100);
        tracer.record(Event {
            nc: 1,
            ts_ns: 1500,
            dur_ns: Some(250),
            detail: Detail::Instruction {
                engine: Engine::Dve,
                op: Opcode::TensorTensor,
                pc: 0x40,
                compute_idx: 3,
            },
        });
        tracer.record(Event {
            nc: 1,
            ts_ns: 2000,
            dur_ns: None,
            detail: Detail::Notification {
                kind: NotificationKind::Execution as u16,
                compute_idx: 3,
                flags: 0,
                source: 0,
                dropped: false,
            },
        });
        let json = parse(&tracer);
        let events = json["traceEvents"].as_array().unwrap();
        let named = |name: &str, pid: u32, tid: u32| {
            events.iter().any(|e| {
                e["ph"] == "M" && e["pid"] == pid && e["tid"] == tid && e["args"]["name"] == name
            })
        };
        assert!(named("NC 0", 0, 0) && named("NC 1", 1, 0));
        for track in Track::ALL {
            assert!(named(track.name(), 1, track.tid()), "{track:?}");
        }
        let inst = events.iter().find(|e| e["cat"] == "instruction").unwrap();
        assert_eq!(inst["name"], "TensorTensor");
        assert_eq!(inst["ph"], "X");
        assert_eq!(inst["tid"], Track::Engine(Engine::Dve).tid());
        assert_eq!(inst["ts"].as_f64(), Some(1.5));
        assert_eq!(inst["dur"].as_f64(), Some(0.25));
        assert_eq!(inst["args"]["pc"], "0x40");
        let note = events.iter().find(|e| e["cat"] == "notification").unwrap();
        assert_eq!((&note["ph"], &note["s"]), (&json!("i"), &json!("t")));
        assert_eq!(note["name"], "Execution");
        assert_eq!(note["tid"], Track::Sequencer.tid());
        assert_eq!(json["displayTimeUnit"], "ns");
    }
}
