//! The timeline file: Chrome trace-event JSON (object form) in the grouping of
//! neuron-profile's Perfetto output.
//!
//! ```json
//! {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}
//! ```
//!
//! - **The runtime process** is one Perfetto process: `pid` is its real pid, named
//!   `"<command> (pid N)"`, sort index 0; each thread that recorded a span is a track (`tid` =
//!   its Linux tid, named by its thread name). Spans are complete events (`ph: "X"`, `cat:
//!   "runtime"`, the [`super::SpanKind`] name) with `args` `seq_id` (hex), `compute_idx`,
//!   `vnc`, `model_id`.
//! - **Each logical core** is one Perfetto process named `"logical core L"` (with LNC=2 it holds
//!   both NCs), sort index `1 + L`. Its `pid` is [`DEVICE_PID_BASE`]` + L`: Linux pids are below
//!   `PID_MAX_LIMIT` = 2^22, so a device pid never collides with a real one. Its tracks are
//!   `tid = nc * 8 + track` ([`shared::device_trace::Track::tid`], 1..=7), named `"NC 2 PE"`,
//!   `"NC 2 sequencer"`, `"NC 2 DMA"`, sorted by tid. The device's events keep simdev's
//!   `cat`, `name` and `args` (simdev's `trace` module lists them).
//! - **Time**: `ts`/`dur` are microseconds since `otherData.origin_monotonic_ns` (the
//!   runtime's start on the host's `CLOCK_MONOTONIC`). A device event's host time is simdev's
//!   origin plus its timestamp ([`shared::protocol::TraceClock`]). Under a latency model simdev
//!   stamps events with the NC's simulated clock: they are then placed at simdev's origin plus
//!   the simulated time, so they do not line up with the host's spans (`otherData.device_clock`
//!   says `"simulated"`, and each such event carries `args.simulated_ts_ns`).
//! - **Flows** (`ph: "s"`/`"f"`, `bp: "e"`, `cat: "flow"`): from an execution's `doorbell` span
//!   to the device's `execution` slice of the same logical core and `compute_idx`, and from that
//!   slice's last nanosecond (the execution that posted the `Execution` notification the harvest
//!   read: Perfetto binds a flow's start to a slice open at its time, and drops one that starts
//!   at an instant such as the notification) to the `harvest` span; Perfetto draws them as
//!   arrows.
//! - `otherData`: `clock`, `origin_monotonic_ns`, `sources` (`"runtime"`, and `"simdev"` when
//!   the device's events are in), `device_events` (a sentence: where they came from, or why
//!   there are none), `device_clock`, `spans`, `dropped_spans`, `device_event_count`,
//!   `dropped_device_events`.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};

use serde_json::{Value, json};
use shared::device_trace::{Detail, Event, Track};
use shared::notification::NotificationKind;
use shared::protocol::TraceClock;

use super::{Span, SpanKind};

/// The first device pid: above every Linux pid (`PID_MAX_LIMIT` is 2^22).
pub const DEVICE_PID_BASE: u32 = 1 << 22;

/// Where the device's events came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSource {
    /// simdev's events of this process's NCs, on `clock`.
    Simdev {
        /// Their clock.
        clock: TraceClock,
        /// Events simdev dropped (its per-NC buffer was full).
        dropped: u64,
    },
    /// None: the reason (the backend records no device trace, or the subscription failed).
    None(String),
}

/// Everything one timeline file holds.
#[derive(Debug)]
pub struct Contents<'a> {
    /// This process's pid.
    pub pid: u32,
    /// Its command (the executable's name).
    pub command: &'a str,
    /// The time origin (host `CLOCK_MONOTONIC` ns).
    pub origin_ns: u64,
    /// The runtime's spans.
    pub spans: &'a [Span],
    /// (tid, name) of the threads.
    pub threads: &'a [(u32, String)],
    /// Spans the runtime dropped.
    pub dropped_spans: u64,
    /// The physical NCs of each logical core.
    pub vncs: &'a [Vec<u32>],
    /// The device's events.
    pub device: &'a [Event],
    /// Where they came from.
    pub source: &'a DeviceSource,
}

fn micros(ns: i128) -> f64 {
    ns as f64 / 1000.0
}

impl Contents<'_> {
    fn rel(&self, host_ns: u64) -> f64 {
        micros(i128::from(host_ns) - i128::from(self.origin_ns))
    }

    /// A device event's host time (ns).
    fn device_host_ns(&self, event: &Event) -> u64 {
        match self.source {
            DeviceSource::Simdev { clock, .. } => {
                clock.origin_monotonic_ns.saturating_add(event.ts_ns)
            }
            DeviceSource::None(_) => event.ts_ns,
        }
    }

    /// (vnc, its NCs) of physical NC `nc`.
    fn vnc_of(&self, nc: u32) -> Option<u32> {
        self.vncs
            .iter()
            .position(|v| v.contains(&nc))
            .and_then(|i| u32::try_from(i).ok())
    }

    /// Writes the file's JSON to `out`; returns the number of (non-metadata) events written.
    ///
    /// # Errors
    /// The writer's.
    pub fn write_json(&self, out: impl Write) -> io::Result<usize> {
        let mut out = BufWriter::new(out);
        let mut first = true;
        let mut written = 0usize;
        out.write_all(b"{\"traceEvents\":[\n")?;
        let mut item = |out: &mut BufWriter<_>, value: &Value| -> io::Result<()> {
            if !first {
                out.write_all(b",\n")?;
            }
            first = false;
            serde_json::to_writer(&mut *out, value).map_err(io::Error::other)
        };
        let meta = |pid: u32, tid: u32, name: &str, args: Value| json!({ "ph": "M", "name": name, "pid": pid, "tid": tid, "args": args });
        // The runtime process and its threads.
        item(
            &mut out,
            &meta(
                self.pid,
                0,
                "process_name",
                json!({ "name": format!("{} (pid {})", self.command, self.pid) }),
            ),
        )?;
        item(
            &mut out,
            &meta(
                self.pid,
                0,
                "process_sort_index",
                json!({ "sort_index": 0 }),
            ),
        )?;
        for (i, (tid, name)) in self.threads.iter().enumerate() {
            item(
                &mut out,
                &meta(self.pid, *tid, "thread_name", json!({ "name": name })),
            )?;
            item(
                &mut out,
                &meta(
                    self.pid,
                    *tid,
                    "thread_sort_index",
                    json!({ "sort_index": i }),
                ),
            )?;
        }
        // One process per logical core, a track per NC and engine.
        let with_device = matches!(self.source, DeviceSource::Simdev { .. });
        if with_device {
            for (vnc, ncs) in self.vncs.iter().enumerate() {
                let vnc = u32::try_from(vnc).unwrap_or(u32::MAX);
                let pid = DEVICE_PID_BASE.saturating_add(vnc);
                let list: Vec<String> = ncs.iter().map(|n| format!("NC {n}")).collect();
                item(
                    &mut out,
                    &meta(
                        pid,
                        0,
                        "process_name",
                        json!({ "name": format!("logical core {vnc} ({})", list.join(", ")) }),
                    ),
                )?;
                item(
                    &mut out,
                    &meta(
                        pid,
                        0,
                        "process_sort_index",
                        json!({ "sort_index": 1 + vnc }),
                    ),
                )?;
                for &nc in ncs {
                    for track in Track::ALL {
                        let tid = device_tid(nc, track);
                        item(
                            &mut out,
                            &meta(
                                pid,
                                tid,
                                "thread_name",
                                json!({ "name": format!("NC {nc} {}", track.name()) }),
                            ),
                        )?;
                        item(
                            &mut out,
                            &meta(pid, tid, "thread_sort_index", json!({ "sort_index": tid })),
                        )?;
                    }
                }
            }
        }
        for span in self.spans {
            item(&mut out, &self.span_json(span))?;
            written += 1;
        }
        let simulated = matches!(
            self.source,
            DeviceSource::Simdev { clock, .. } if clock.simulated
        );
        for event in self.device {
            let Some(vnc) = self.vnc_of(event.nc) else {
                continue;
            };
            let mut value = event.to_json();
            if let Some(map) = value.as_object_mut() {
                map.insert("pid".into(), json!(DEVICE_PID_BASE.saturating_add(vnc)));
                map.insert(
                    "tid".into(),
                    json!(device_tid(event.nc, event.detail.track())),
                );
                map.insert("ts".into(), json!(self.rel(self.device_host_ns(event))));
                if simulated && let Some(args) = map.get_mut("args").and_then(Value::as_object_mut)
                {
                    args.insert("simulated_ts_ns".into(), json!(event.ts_ns));
                }
            }
            item(&mut out, &value)?;
            written += 1;
        }
        for flow in self.flows() {
            item(&mut out, &flow)?;
        }
        let (device_events, device_clock, dropped_device) = match self.source {
            DeviceSource::Simdev { clock, dropped } => (
                "simdev (simulated device; NEFF programs are shape-only unless simdev binds a reference)".to_owned(),
                if clock.simulated {
                    "simulated: the NC's simulated clock placed from simdev's start (not aligned with the host's spans)"
                } else {
                    "host CLOCK_MONOTONIC"
                },
                *dropped,
            ),
            DeviceSource::None(why) => (format!("none: {why}"), "none", 0),
        };
        let mut sources = vec!["runtime"];
        if with_device {
            sources.push("simdev");
        }
        let other = json!({
            "clock": "host CLOCK_MONOTONIC; ts in microseconds since origin_monotonic_ns",
            "origin_monotonic_ns": self.origin_ns,
            "sources": sources,
            "device_events": device_events,
            "device_clock": device_clock,
            "device_pid_rule": format!("logical core L is pid {DEVICE_PID_BASE} + L (above every Linux pid)"),
            "spans": self.spans.len(),
            "dropped_spans": self.dropped_spans,
            "device_event_count": self.device.len(),
            "dropped_device_events": dropped_device,
            "runtime": env!("CARGO_PKG_VERSION"),
        });
        out.write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
        serde_json::to_writer(&mut out, &other).map_err(io::Error::other)?;
        out.write_all(b"}\n")?;
        out.flush()?;
        Ok(written)
    }

    fn span_json(&self, span: &Span) -> Value {
        json!({
            "name": span.kind.name(),
            "cat": "runtime",
            "ph": "X",
            "pid": self.pid,
            "tid": span.tid,
            "ts": self.rel(span.start_ns),
            "dur": micros(i128::from(span.dur_ns)),
            "args": {
                "seq_id": format!("{:#x}", span.ids.seq_id),
                "compute_idx": span.ids.compute_idx,
                "vnc": span.ids.vnc,
                "model_id": span.ids.model_id,
            },
        })
    }

    /// The flow events: doorbell → device execution, execution (that posted the notification)
    /// → harvest, matched by (main NC, compute_idx), each to the first device execution at or
    /// after the span start (doorbell) or the last one before the span end whose notification
    /// came before it (harvest).
    fn flows(&self) -> Vec<Value> {
        if !matches!(self.source, DeviceSource::Simdev { .. }) {
            return Vec::new();
        }
        let mut executions: HashMap<(u32, u32), Vec<&Event>> = HashMap::new();
        let mut notifications: HashMap<(u32, u32), Vec<&Event>> = HashMap::new();
        for event in self.device {
            match event.detail {
                Detail::Execution { compute_idx, .. } => executions
                    .entry((event.nc, compute_idx))
                    .or_default()
                    .push(event),
                Detail::Notification {
                    kind, compute_idx, ..
                } if kind == NotificationKind::Execution as u16 => notifications
                    .entry((event.nc, compute_idx))
                    .or_default()
                    .push(event),
                _ => {}
            }
        }
        let mut flows = Vec::new();
        let mut id = 0u64;
        for span in self.spans {
            let Some(&main) = self.vncs.get(span.ids.vnc as usize).and_then(|v| v.first()) else {
                continue;
            };
            let key = (main, span.ids.compute_idx);
            let device_pid = DEVICE_PID_BASE.saturating_add(span.ids.vnc);
            let seq = Track::Sequencer;
            let (from, to) = match span.kind {
                SpanKind::Doorbell => {
                    let Some(exec) = executions.get(&key).and_then(|v| {
                        v.iter()
                            .filter(|e| self.device_host_ns(e) >= span.start_ns)
                            .min_by_key(|e| self.device_host_ns(e))
                    }) else {
                        continue;
                    };
                    (
                        (self.pid, span.tid, self.rel(span.start_ns)),
                        (
                            device_pid,
                            device_tid(main, seq),
                            self.rel(self.device_host_ns(exec)),
                        ),
                    )
                }
                SpanKind::Harvest => {
                    // From the execution that posted the notification the harvest read: a flow
                    // starts inside a slice open on its track at its time (Perfetto drops one
                    // that starts at an instant, and the notification is one), so at the
                    // execution slice's last nanosecond, just before the notification.
                    let end = span.start_ns.saturating_add(span.dur_ns);
                    let posted = |e: &&&Event| {
                        notifications.get(&key).is_some_and(|n| {
                            n.iter().any(|n| {
                                let at = self.device_host_ns(n);
                                at >= self.device_host_ns(e) && at <= end
                            })
                        })
                    };
                    let Some(last_ns) = executions.get(&key).and_then(|v| {
                        let exec = v
                            .iter()
                            .filter(|e| self.device_host_ns(e) <= end)
                            .filter(posted)
                            .max_by_key(|e| self.device_host_ns(e))?;
                        let dur = exec.dur_ns.filter(|&d| d > 0)?;
                        Some(self.device_host_ns(exec).saturating_add(dur - 1))
                    }) else {
                        continue;
                    };
                    (
                        (device_pid, device_tid(main, seq), self.rel(last_ns)),
                        (self.pid, span.tid, self.rel(span.start_ns)),
                    )
                }
                _ => continue,
            };
            id += 1;
            flows.push(
                json!({ "ph": "s", "cat": "flow", "name": span.kind.name(), "id": id,
                               "pid": from.0, "tid": from.1, "ts": from.2 }),
            );
            flows.push(
                json!({ "ph": "f", "bp": "e", "cat": "flow", "name": span.kind.name(),
                               "id": id, "pid": to.0, "tid": to.1, "ts": to.2 }),
            );
        }
        flows
    }
}

/// The track id of NC `nc`'s `track` in its logical core's process.
pub fn device_tid(nc: u32, track: Track) -> u32 {
    nc.saturating_mul(8).saturating_add(track.tid())
}
