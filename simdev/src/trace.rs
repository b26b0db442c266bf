//! The execution trace (DESIGN §5 "Trace"): Chrome trace-event JSON that opens in Perfetto or
//! `chrome://tracing`.
//!
//! Events are kept in memory, at most [`DEFAULT_MAX_EVENTS`] (later ones are dropped and
//! counted), and written once, when simdev stops ([`Tracer::write`]). A disabled tracer holds
//! nothing; every recording site checks [`Tracer::enabled`] first, one branch.
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

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use serde_json::{Value, json};
use shared::exec_request::Engine;
use shared::isa::Opcode;
use shared::notification::NotificationKind;
use shared::protocol::FaultKind;

use crate::faults::kind_name;

/// Most events a trace keeps in memory by default.
pub const DEFAULT_MAX_EVENTS: usize = 1_000_000;

/// A track of an NC: the sequencer, one engine, or its DMA engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    /// Doorbells, notifications, executions, faults.
    Sequencer,
    /// An engine's instructions.
    Engine(Engine),
    /// DMA transfers.
    Dma,
}

impl Track {
    /// Every track, in display order.
    pub const ALL: [Self; 7] = [
        Self::Sequencer,
        Self::Engine(Engine::Pe),
        Self::Engine(Engine::Act),
        Self::Engine(Engine::Pool),
        Self::Engine(Engine::Dve),
        Self::Engine(Engine::Sp),
        Self::Dma,
    ];

    /// The thread id of the track.
    pub const fn tid(self) -> u32 {
        match self {
            Self::Sequencer => 1,
            Self::Engine(Engine::Pe) => 2,
            Self::Engine(Engine::Act) => 3,
            Self::Engine(Engine::Pool) => 4,
            Self::Engine(Engine::Dve) => 5,
            Self::Engine(Engine::Sp) => 6,
            Self::Dma => 7,
        }
    }

    /// The thread name of the track.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sequencer => "sequencer",
            Self::Engine(engine) => engine.name(),
            Self::Dma => "DMA",
        }
    }
}

/// What an event records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detail {
    /// An engine executed an instruction.
    Instruction {
        /// The engine.
        engine: Engine,
        /// The opcode.
        op: Opcode,
        /// Its address.
        pc: u64,
        /// The execution.
        compute_idx: u32,
    },
    /// An engine's whole NEFF stream, charged shape-only (no instruction ran: see
    /// [`crate::shape_only`]).
    Stream {
        /// The engine.
        engine: Engine,
        /// 64-byte records in the stream.
        records: u32,
        /// The reference that computes the outputs ([`crate::reference`]); `None`: shape-only.
        reference: Option<std::sync::Arc<str>>,
        /// The stream's address.
        pa: u64,
        /// The execution.
        compute_idx: u32,
    },
    /// A whole execution, doorbell count taken to notification.
    Execution {
        /// The execution.
        compute_idx: u32,
        /// The notification's error flags.
        flags: u32,
        /// Instructions executed by all engines.
        instructions: u64,
    },
    /// A sequencer config reload (`reload == true`) or an activation-table load.
    Reload {
        /// Config reload or table load.
        config: bool,
        /// The execution.
        compute_idx: u32,
    },
    /// Descriptor pairs a DMA queue processed.
    Dma {
        /// DMA engine.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
        /// Pairs completed.
        pairs: u64,
        /// Bytes moved.
        bytes: u64,
        /// The sequencer's fetch of an exec batch's head pairs.
        batch: bool,
    },
    /// A posted semaphore increment (doorbell) arrived.
    Doorbell {
        /// Semaphore index.
        semaphore: u32,
        /// Amount added.
        value: u32,
    },
    /// A notification was written (or dropped: the NQ was full or absent).
    Notification {
        /// Its `kind` field.
        kind: u16,
        /// Its `compute_idx`.
        compute_idx: u32,
        /// Its error flags.
        flags: u32,
        /// Its `source` field.
        source: u16,
        /// Dropped instead of written.
        dropped: bool,
    },
    /// An injected fault fired on an execution.
    Fault {
        /// The fault.
        kind: FaultKind,
        /// The execution.
        compute_idx: u32,
    },
}

impl Detail {
    /// The track the event belongs to.
    pub const fn track(&self) -> Track {
        match self {
            Self::Instruction { engine, .. } | Self::Stream { engine, .. } => {
                Track::Engine(*engine)
            }
            Self::Dma { .. } => Track::Dma,
            _ => Track::Sequencer,
        }
    }
}

/// One trace event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The NC (the process).
    pub nc: u32,
    /// Start, in nanoseconds of the trace clock.
    pub ts_ns: u64,
    /// Duration in nanoseconds for a complete event; `None` for an instant event.
    pub dur_ns: Option<u64>,
    /// What happened.
    pub detail: Detail,
}

/// Nanoseconds as the fractional microseconds of the trace format (exact up to 2^53 ns, about
/// 104 days).
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl Event {
    /// The event in the Chrome trace-event format.
    pub fn to_json(&self) -> Value {
        let (cat, name, args) = match &self.detail {
            Detail::Instruction {
                op,
                pc,
                compute_idx,
                ..
            } => (
                "instruction",
                format!("{op:?}"),
                json!({ "pc": format!("{pc:#x}"), "compute_idx": compute_idx }),
            ),
            Detail::Stream {
                engine,
                records,
                reference,
                pa,
                compute_idx,
            } => match reference {
                None => (
                    "instruction",
                    format!(
                        "{} stream: {records} records (NEFF, shape-only)",
                        engine.name()
                    ),
                    json!({
                        "pa": format!("{pa:#x}"),
                        "records": records,
                        "compute_idx": compute_idx,
                        "shape_only": true,
                    }),
                ),
                Some(r) => (
                    "instruction",
                    format!(
                        "{} stream: {records} records (NEFF, reference: {r})",
                        engine.name()
                    ),
                    json!({
                        "pa": format!("{pa:#x}"),
                        "records": records,
                        "compute_idx": compute_idx,
                        "shape_only": false,
                        "reference": r.as_ref(),
                    }),
                ),
            },
            Detail::Execution {
                compute_idx,
                flags,
                instructions,
            } => (
                "execution",
                "execution".to_owned(),
                json!({ "compute_idx": compute_idx, "flags": flags, "instructions": instructions }),
            ),
            Detail::Reload {
                config,
                compute_idx,
            } => (
                "sequencer",
                if *config {
                    "config reload"
                } else {
                    "table load"
                }
                .to_owned(),
                json!({ "compute_idx": compute_idx }),
            ),
            Detail::Dma {
                engine,
                queue,
                pairs,
                bytes,
                batch,
            } => (
                "dma",
                if *batch {
                    "exec batch".to_owned()
                } else {
                    format!("DMA {engine}.{queue}")
                },
                json!({ "engine": engine, "queue": queue, "pairs": pairs, "bytes": bytes }),
            ),
            Detail::Doorbell { semaphore, value } => (
                "doorbell",
                "doorbell".to_owned(),
                json!({ "semaphore": semaphore, "value": value }),
            ),
            Detail::Notification {
                kind,
                compute_idx,
                flags,
                source,
                dropped,
            } => (
                "notification",
                NotificationKind::from_u16(*kind)
                    .map_or_else(|| format!("kind {kind}"), |k| format!("{k:?}")),
                json!({
                    "compute_idx": compute_idx,
                    "flags": flags,
                    "source": source,
                    "dropped": dropped,
                }),
            ),
            Detail::Fault { kind, compute_idx } => (
                "fault",
                format!("fault {}", kind_name(*kind)),
                json!({ "compute_idx": compute_idx }),
            ),
        };
        let mut event = json!({
            "name": name,
            "cat": cat,
            "pid": self.nc,
            "tid": self.detail.track().tid(),
            "ts": micros(self.ts_ns),
            "args": args,
        });
        if let Some(map) = event.as_object_mut() {
            match self.dur_ns {
                Some(dur) => {
                    map.insert("ph".to_owned(), json!("X"));
                    map.insert("dur".to_owned(), json!(micros(dur)));
                }
                None => {
                    map.insert("ph".to_owned(), json!("i"));
                    map.insert("s".to_owned(), json!("t"));
                }
            }
        }
        event
    }
}

/// An enabled trace's state.
#[derive(Debug)]
struct Inner {
    path: PathBuf,
    ncs: u32,
    max_events: usize,
    events: Mutex<Vec<Event>>,
    dropped: AtomicU64,
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

/// The device's trace: disabled, or buffering events for one file.
#[derive(Debug, Default)]
pub struct Tracer {
    inner: Option<Box<Inner>>,
}

impl Tracer {
    /// A tracer that records nothing.
    pub const fn disabled() -> Self {
        Self { inner: None }
    }

    /// A tracer for a device of `ncs` NCs that keeps at most `max_events` events and writes
    /// them to `path`.
    pub fn to_file(path: PathBuf, ncs: u32, max_events: usize) -> Self {
        Self {
            inner: Some(Box::new(Inner {
                path,
                ncs,
                max_events,
                events: Mutex::new(Vec::new()),
                dropped: AtomicU64::new(0),
            })),
        }
    }

    /// Whether events are recorded.
    #[inline]
    pub const fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The trace file, when enabled.
    pub fn path(&self) -> Option<&Path> {
        self.inner.as_deref().map(|i| i.path.as_path())
    }

    /// Events the buffer can still take before it drops (0 when disabled).
    pub fn room(&self) -> usize {
        self.inner.as_deref().map_or(0, |inner| {
            let held = inner
                .events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len();
            inner.max_events.saturating_sub(held)
        })
    }

    /// Records `event` (dropped and counted when the buffer is full).
    pub fn record(&self, event: Event) {
        self.record_all(vec![event], 0);
    }

    /// Records `events` and counts `dropped` more that the caller could not keep.
    pub fn record_all(&self, events: Vec<Event>, dropped: u64) {
        let Some(inner) = self.inner.as_deref() else {
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
        let inner = self.inner.as_deref()?;
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

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_deref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }

    /// Writes the trace's JSON to `out`; `clock` names the time base (`"wall"` or
    /// `"simulated"`). Returns the number of events written.
    ///
    /// # Errors
    /// The writer's.
    pub fn write_json(&self, out: impl Write, clock: &str) -> io::Result<usize> {
        let Some(inner) = self.inner.as_deref() else {
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
