//! Checks (`[[expect]]` and `check` steps) and the snapshots they compare with.
//!
//! A check reads simdev (counters, device stats, whether it runs) over the control connection
//! or the runtime (XU health, stale notifications, simulated time); with `within_s` it polls
//! until it holds or the time is up, then records what it saw last. Numbers are compared with a
//! [`Bound`]: exact, a range, or the value a named snapshot recorded for the same quantity.
//!
//! simdev's NC counters are read by name in one place, [`counter`]; the device stats in
//! [`stat`].

use std::time::{Duration, Instant};

use runtime::Device;
use runtime::xu::XuHealth;
use shared::protocol::{DeviceStats, NcCounters};

use super::Runner;
use super::simdev::process_running;
use crate::scenario::spec::{Bound, Check};

/// What a `snapshot` step (and the automatic `baseline`) records.
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot {
    stats: Option<DeviceStats>,
    counters: Vec<Option<NcCounters>>,
}

/// The NC counter named `key` (a `counters` check's key), or `None` for an unknown name.
///
/// The one place the runner maps counter names to simdev's counters.
fn counter(c: &NcCounters, key: &str) -> Option<u64> {
    c.get(key)
}

/// The device stat named `key` (a `device_stats` check's key), or `None` for an unknown name.
fn stat(s: &DeviceStats, key: &str) -> Option<u64> {
    Some(match key {
        "memory_in_use" => s.memory_in_use,
        "chunks" => s.chunks,
        "clients" => u64::from(s.clients),
        "claimed_ncs" => u64::from(s.claimed_ncs),
        "dma_queues" => u64::from(s.dma_queues),
        "armed_faults" => u64::from(s.armed_faults),
        _ => return None,
    })
}

/// Whether `v` satisfies `b`; the expected text. `same` resolves a snapshot name.
fn bound_ok(
    b: &Bound,
    v: i128,
    same: impl Fn(&str) -> Result<u64, String>,
) -> Result<(bool, String), String> {
    Ok(match b {
        Bound::Exact(x) => (v == i128::from(*x), format!("{x}")),
        Bound::Range { min, max } => {
            let lo = min.is_none_or(|m| v >= i128::from(m));
            let hi = max.is_none_or(|m| v <= i128::from(m));
            let text = match (min, max) {
                (Some(a), Some(b)) => format!("{a}..={b}"),
                (Some(a), None) => format!(">= {a}"),
                (None, Some(b)) => format!("<= {b}"),
                (None, None) => "anything".into(),
            };
            (lo && hi, text)
        }
        Bound::Same(name) => {
            let x = same(name)?;
            (v == i128::from(x), format!("{x} (as at {name})"))
        }
    })
}

impl Runner<'_> {
    /// Waits until simdev has handled every request the scenario's runtimes sent, those whose
    /// replies nobody waits for (a tensor's or model's MEM_FREE) included: the control
    /// connection's view of simdev is then the runtimes' own. A runtime whose device is gone
    /// is left to the check to notice.
    fn flush_runtimes(&self) {
        for rt in self.rt.iter().chain(self.others.values()) {
            let _ = rt.device().flush();
        }
    }

    /// Device stats and every NC's counters, now (empty without a control connection), once
    /// the runtimes' requests were handled ([`Runner::flush_runtimes`]).
    pub(super) fn snapshot(&self) -> Snapshot {
        let Some(c) = &self.control else {
            return Snapshot::default();
        };
        self.flush_runtimes();
        Snapshot {
            stats: c.device_stats().ok(),
            counters: (0..c.info().nc_count)
                .map(|nc| c.nc_counters(nc).ok())
                .collect(),
        }
    }

    /// The value snapshot `name` recorded for `key`: NC `nc`'s counter, or a device stat.
    fn same(&self, name: &str, key: &str, nc: Option<u32>) -> Result<u64, String> {
        let s = self
            .snapshots
            .get(name)
            .ok_or_else(|| format!("no snapshot named {name:?}"))?;
        match nc {
            Some(nc) => s
                .counters
                .get(usize::try_from(nc).unwrap_or(usize::MAX))
                .and_then(|c| c.as_ref())
                .ok_or_else(|| format!("snapshot {name:?} has no counters of NC {nc}"))
                .and_then(|c| counter(c, key).ok_or_else(|| format!("no counter {key:?}"))),
            None => s
                .stats
                .as_ref()
                .ok_or_else(|| format!("snapshot {name:?} has no device stats"))
                .and_then(|st| stat(st, key).ok_or_else(|| format!("no device stat {key:?}"))),
        }
    }

    /// One attempt at a check: `(pass, expected, seen)` per line.
    fn eval(&self, c: &Check) -> Result<Vec<(bool, String, String)>, String> {
        let mut out = Vec::new();
        match c {
            Check::Counters(c) => {
                let nc = c.nc.ok_or("a counters check needs nc")?;
                let ctl = self.control.as_ref().ok_or("simdev is not running")?;
                let v = ctl.nc_counters(nc).map_err(|e| {
                    format!("reading NC {nc}'s counters: {}", crate::error_chain(&e))
                })?;
                let (mut ok, mut want, mut seen) = (true, Vec::new(), Vec::new());
                for (key, b) in c.bounds() {
                    if let Some(b) = b {
                        let x = counter(&v, key).ok_or_else(|| format!("no counter {key:?}"))?;
                        let (pass, text) =
                            bound_ok(b, i128::from(x), |n| self.same(n, key, Some(nc)))?;
                        ok &= pass;
                        want.push(format!("{key} {text}"));
                        seen.push(format!("{key} {x}"));
                    }
                }
                out.push((ok, format!("NC {nc}: {}", want.join(", ")), seen.join(", ")));
            }
            Check::DeviceStats(c) => {
                let ctl = self.control.as_ref().ok_or("simdev is not running")?;
                self.flush_runtimes();
                let v = ctl
                    .device_stats()
                    .map_err(|e| format!("reading device stats: {}", crate::error_chain(&e)))?;
                let (mut ok, mut want, mut seen) = (true, Vec::new(), Vec::new());
                for (key, b) in c.bounds() {
                    if let Some(b) = b {
                        let x = stat(&v, key).ok_or_else(|| format!("no device stat {key:?}"))?;
                        let (pass, text) = bound_ok(b, i128::from(x), |n| self.same(n, key, None))?;
                        ok &= pass;
                        want.push(format!("{key} {text}"));
                        seen.push(format!("{key} {x}"));
                    }
                }
                out.push((ok, want.join(", "), seen.join(", ")));
            }
            Check::NoLeaks(_) => {
                let ctl = self.control.as_ref().ok_or("simdev is not running")?;
                self.flush_runtimes();
                let v = ctl
                    .device_stats()
                    .map_err(|e| format!("reading device stats: {}", crate::error_chain(&e)))?;
                let base = self
                    .snapshots
                    .get("baseline")
                    .and_then(|s| s.stats)
                    .ok_or("no baseline device stats")?;
                let show = |s: &DeviceStats| {
                    format!(
                        "{} B in {} chunks, {} clients, {} NCs claimed, {} DMA queues",
                        s.memory_in_use, s.chunks, s.clients, s.claimed_ncs, s.dma_queues
                    )
                };
                let ok = v.memory_in_use == base.memory_in_use
                    && v.chunks == base.chunks
                    && v.clients == base.clients
                    && v.claimed_ncs == base.claimed_ncs
                    && v.dma_queues == base.dma_queues;
                out.push((
                    ok,
                    format!("nothing held beyond the baseline: {}", show(&base)),
                    show(&v),
                ));
            }
            Check::XuHealth(c) => {
                let vnc = c.vnc.unwrap_or(0);
                let want = c.health.name();
                let rt = self.rt.as_ref().ok_or("no runtime is open")?;
                let seen = match rt.xu(vnc).map(|x| x.health()) {
                    Some(XuHealth::Healthy) => "healthy",
                    Some(XuHealth::Shutdown) => "shutdown",
                    Some(XuHealth::FatalShutdown) => "fatal_shutdown",
                    None => "no such logical core",
                };
                out.push((
                    seen == want,
                    format!("logical core {vnc}'s XU is {want}"),
                    seen.to_string(),
                ));
            }
            Check::StaleNotifications(c) => {
                let rt = self.rt.as_ref().ok_or("no runtime is open")?;
                let x = rt.stale_notifications();
                let b = c.count.as_ref().ok_or("needs count")?;
                let (pass, text) = bound_ok(b, i128::from(x), |_| {
                    Err("stale_notifications takes no snapshot names".into())
                })?;
                out.push((
                    pass,
                    format!("late notifications discarded: {text}"),
                    x.to_string(),
                ));
            }
            Check::SimTime(c) => {
                let rt = self.rt.as_ref().ok_or("no runtime is open")?;
                let nc = c.nc.ok_or("a sim_time check needs nc")?;
                // Since the last set_latency of this runtime (which resets simdev's clocks).
                let base = |nc: u32| {
                    self.sim_time_base
                        .as_ref()
                        .filter(|(of, _)| std::sync::Arc::ptr_eq(of, rt))
                        .and_then(|(_, b)| b.get(&nc).copied())
                        .unwrap_or(0)
                };
                let t = |nc: u32| -> Result<i128, String> {
                    rt.metrics()
                        .snapshot(usize::try_from(nc).unwrap_or(usize::MAX))
                        .map(|m| i128::from(m.nc.total_us) * 1000 - base(nc))
                        .ok_or_else(|| format!("no metrics for NC {nc}"))
                };
                let mut x = t(nc)?;
                let mut what = format!("simulated time of NC {nc}");
                if let Some(other) = c.minus_nc {
                    x -= t(other)?;
                    what = format!("{what} minus NC {other}'s");
                }
                let b = c.ns.as_ref().ok_or("a sim_time check needs ns")?;
                let (pass, text) =
                    bound_ok(b, x, |_| Err("sim_time takes no snapshot names".into()))?;
                out.push((pass, format!("{what}: {text} ns"), format!("{x} ns")));
            }
            Check::Simdev(c) => {
                let running = self
                    .simdev
                    .as_ref()
                    .is_some_and(|s| process_running(s.pid()));
                let want = c.running.unwrap_or(true);
                out.push((
                    running == want,
                    if want {
                        "simdev is running"
                    } else {
                        "simdev has exited"
                    }
                    .into(),
                    if running { "running" } else { "exited" }.into(),
                ));
            }
        }
        Ok(out)
    }

    /// Makes a check (polling up to its `within_s`) and records its outcome.
    pub(super) fn check(&mut self, at: &str, c: &Check) {
        let wait = Duration::from_secs_f64(c.within_s().max(0.0));
        let deadline = Instant::now() + wait;
        loop {
            let r = self.eval(c);
            let done = match &r {
                Ok(v) => v.iter().all(|(p, _, _)| *p),
                Err(_) => false,
            };
            if done || Instant::now() >= deadline {
                match r {
                    Ok(v) => {
                        for (pass, want, seen) in v {
                            self.rec.record(pass, at, want, seen);
                        }
                    }
                    Err(e) => self.rec.fail(at, "the check can be made", e),
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
