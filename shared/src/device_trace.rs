//! The device's trace events (simdev's engines, DMA, doorbells and notifications), shared by
//! simdev, which records them (its `--trace` file, and [`crate::protocol::Request::TraceDrain`]
//! for a subscribed client), and the runtime, which merges a client's events into its own
//! timeline (`runtime::trace`).
//!
//! An [`Event`] names its NC (`nc`), its start and duration in nanoseconds of the trace clock,
//! and a typed [`Detail`]; [`Event::to_json`] renders it as one Chrome trace-event object (its
//! `pid` is the NC index and its `tid` the [`Track`]: callers that merge traces rewrite both).
//! simdev's `trace` module documents the table of events (`cat`, `ph`, track, name, args).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::exec_request::Engine;
use crate::isa::Opcode;
use crate::notification::NotificationKind;
use crate::protocol::FaultKind;

/// A track of an NC: the sequencer, one engine, or its DMA engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// simdev's `shape_only`).
    Stream {
        /// The engine.
        engine: Engine,
        /// 64-byte records in the stream.
        records: u32,
        /// The reference that computes the outputs (simdev's `reference`); `None`: shape-only.
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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
                format!("fault {}", kind.name()),
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

/// The host's `CLOCK_MONOTONIC` now, in nanoseconds: the one clock of a merged trace (simdev
/// and the runtime run on one host, so both read the same clock). 0 if the clock cannot be
/// read (it always can on Linux).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    })
}
