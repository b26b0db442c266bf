//! Figures over one period from two successive samples of the runtime datastores: per logical
//! core utilisation (Δbusy / Δwall), executions per second, latency percentiles and errors, per
//! process; the counts since start beside them.
//!
//! A runtime's baseline is its snapshot in the previous sample (same pid, same `nrt_init`
//! instant). Without one (first sample, or a runtime that started since) the baseline is zero
//! and the wall time is the runtime's uptime, so the first figures are averages since its
//! `nrt_init`. A stale runtime (its process died without closing it) has its last executions
//! counted in the period it is found gone, then is listed with its totals and no period
//! figures: it is never merged into a live one.

use std::time::{Duration, Instant};

use runtime::datastore::snapshot::{
    CoreSnapshot, HIST_BUCKETS, Histogram, Liveness, MemoryUsage, ModelSnapshot, ProcessSnapshot,
    StatusCounts,
};

use super::classes::{ErrorSummary, ExecutionSummary, delta_counts, summarize};

/// The runtime processes' datastores as read at one instant.
#[derive(Clone, Debug)]
pub struct Sample {
    /// When the sample was taken (monotonic clock).
    pub at: Instant,
    /// Every process's snapshot, live and stale.
    pub processes: Vec<ProcessSnapshot>,
}

/// One logical core's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct CoreFigures {
    /// The process's logical core index.
    pub vnc: u32,
    /// The device's logical core index (neuron-monitor's key).
    pub logical_id: u32,
    /// Its physical NCs.
    pub ncs: Vec<u32>,
    /// Busy time over wall time in the period, percent (0..=100).
    pub utilization_pct: f64,
    /// Executions that ended in the period.
    pub executions: u64,
    /// `executions` per second of the period.
    pub executions_per_s: f64,
    /// Failed executions in the period.
    pub errors: u64,
    /// Executions since start.
    pub executions_total: u64,
    /// Failed executions since start.
    pub errors_total: u64,
    /// End-to-end latency of the period's executions.
    pub total_latency: Histogram,
    /// Device latency of the period's executions.
    pub device_latency: Histogram,
    /// Device memory held on the core now.
    pub memory: MemoryUsage,
}

/// One runtime process's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessFigures {
    /// The writer's pid.
    pub pid: u32,
    /// Its command line.
    pub command: String,
    /// Its runtime version.
    pub runtime_version: String,
    /// NCs per logical core.
    pub lnc: u32,
    /// Time since its `nrt_init`.
    pub uptime: Duration,
    /// When its runtime was initialised (ns since the Unix epoch; see
    /// [`ProcessSnapshot::created_unix_ns`]).
    pub created_unix_ns: u64,
    /// The writer is gone: only the `*_total` figures and models are meaningful.
    pub stale: bool,
    /// The runtime closed during the period: its figures are its last (it is not shown again).
    pub closed: bool,
    /// The wall time the period figures cover.
    pub period: Duration,
    /// Its logical cores (empty when stale).
    pub cores: Vec<CoreFigures>,
    /// Its models (loaded ones first).
    pub models: Vec<ModelSnapshot>,
    /// Outcomes in the period.
    pub execution_summary: ExecutionSummary,
    /// Errors in the period.
    pub error_summary: ErrorSummary,
    /// Outcomes since start.
    pub execution_total: ExecutionSummary,
    /// Errors since start.
    pub error_total: ErrorSummary,
    /// End-to-end latency of the period's executions, all cores.
    pub total_latency: Histogram,
    /// Device latency of the period's executions, all cores.
    pub device_latency: Histogram,
    /// End-to-end latency since start, all cores.
    pub total_latency_all: Histogram,
    /// Device latency since start, all cores.
    pub device_latency_all: Histogram,
}

impl ProcessFigures {
    /// Device bytes the process holds, all cores and kinds.
    pub fn device_bytes(&self) -> u64 {
        self.cores.iter().map(|c| c.memory.total()).sum()
    }
}

/// Every process's figures for one period.
#[derive(Clone, Debug, PartialEq)]
pub struct Figures {
    /// The wall time between the two samples (zero for a first sample).
    pub period: Duration,
    /// Live processes first (by pid), then stale ones.
    pub processes: Vec<ProcessFigures>,
}

impl Figures {
    /// The live processes (and those that closed in the period: their last figures).
    pub fn live(&self) -> impl Iterator<Item = &ProcessFigures> {
        self.processes.iter().filter(|p| !p.stale)
    }

    /// How many processes are stale.
    pub fn stale_count(&self) -> usize {
        self.processes.iter().filter(|p| p.stale).count()
    }
}

/// Adds `h`'s samples to `into`.
pub fn merge(into: &mut Histogram, h: &Histogram) {
    if into.buckets.len() < HIST_BUCKETS {
        into.buckets.resize(HIST_BUCKETS, 0);
    }
    for (a, b) in into.buckets.iter_mut().zip(&h.buckets) {
        *a = a.saturating_add(*b);
    }
    into.count = into.count.saturating_add(h.count);
    into.sum_ns = into.sum_ns.saturating_add(h.sum_ns);
    if h.count > 0 {
        into.min_ns = into.min_ns.min(h.min_ns);
        into.max_ns = into.max_ns.max(h.max_ns);
    }
}

fn failures(counts: &StatusCounts) -> u64 {
    counts.total() - counts.get(shared::NrtStatus::Success)
}

#[allow(clippy::cast_precision_loss)]
fn per_second(n: u64, wall: Duration) -> f64 {
    if wall.is_zero() {
        0.0
    } else {
        n as f64 / wall.as_secs_f64()
    }
}

#[allow(clippy::cast_precision_loss)]
fn utilization(busy_ns: u64, wall: Duration) -> f64 {
    if wall.is_zero() {
        return 0.0;
    }
    (busy_ns as f64 / wall.as_nanos() as f64 * 100.0).clamp(0.0, 100.0)
}

fn core_figures(now: &CoreSnapshot, then: Option<&CoreSnapshot>, wall: Duration) -> CoreFigures {
    let (executions, total_latency, device_latency, busy) = match then {
        Some(t) => (
            delta_counts(&now.executions, &t.executions),
            now.total_latency.delta(&t.total_latency),
            now.device_latency.delta(&t.device_latency),
            now.busy_ns().saturating_sub(t.busy_ns()),
        ),
        None => (
            now.executions.clone(),
            now.total_latency.clone(),
            now.device_latency.clone(),
            now.busy_ns(),
        ),
    };
    CoreFigures {
        vnc: now.vnc,
        logical_id: now.logical_id,
        ncs: now.ncs.clone(),
        utilization_pct: utilization(busy, wall),
        executions: executions.total(),
        executions_per_s: per_second(executions.total(), wall),
        errors: failures(&executions),
        executions_total: now.executions.total(),
        errors_total: failures(&now.executions),
        total_latency,
        device_latency,
        memory: now.memory,
    }
}

/// `now`'s figures; the period's from `then` (its live snapshot in the previous sample; none:
/// since its `nrt_init`) unless `counted` (a stale runtime whose last executions an earlier
/// period counted, or that this monitor never saw live: only its totals are listed).
fn process_figures(
    now: &ProcessSnapshot,
    then: Option<&ProcessSnapshot>,
    counted: bool,
    elapsed: Duration,
) -> ProcessFigures {
    let stale = now.liveness == Liveness::Stale;
    let mut all_counts = StatusCounts::default();
    let mut total_latency_all = Histogram::default();
    let mut device_latency_all = Histogram::default();
    for c in &now.cores {
        all_counts = add_counts(&all_counts, &c.executions);
        merge(&mut total_latency_all, &c.total_latency);
        merge(&mut device_latency_all, &c.device_latency);
    }
    let (execution_total, error_total) = summarize(&all_counts);
    let wall = if then.is_some() { elapsed } else { now.uptime };
    let mut fig = ProcessFigures {
        pid: now.pid,
        command: now.command.clone(),
        runtime_version: now.runtime_version.clone(),
        lnc: now.lnc,
        uptime: now.uptime,
        created_unix_ns: now.created_unix_ns,
        stale,
        closed: now.liveness == Liveness::Closed,
        period: if counted { Duration::ZERO } else { wall },
        cores: Vec::new(),
        models: now.models.clone(),
        execution_summary: ExecutionSummary::default(),
        error_summary: ErrorSummary::default(),
        execution_total,
        error_total,
        total_latency: Histogram::default(),
        device_latency: Histogram::default(),
        total_latency_all,
        device_latency_all,
    };
    if counted {
        return fig;
    }
    let mut period_counts = StatusCounts::default();
    for c in &now.cores {
        let before = then.and_then(|t| t.cores.iter().find(|b| b.vnc == c.vnc));
        period_counts = add_counts(
            &period_counts,
            &match before {
                Some(b) => delta_counts(&c.executions, &b.executions),
                None => c.executions.clone(),
            },
        );
        let cf = core_figures(c, before, wall);
        merge(&mut fig.total_latency, &cf.total_latency);
        merge(&mut fig.device_latency, &cf.device_latency);
        fig.cores.push(cf);
    }
    (fig.execution_summary, fig.error_summary) = summarize(&period_counts);
    fig
}

/// `a + b`, status by status.
fn add_counts(a: &StatusCounts, b: &StatusCounts) -> StatusCounts {
    let mut by_status = a.by_status.clone();
    for &(s, n) in &b.by_status {
        match by_status.iter_mut().find(|(t, _)| *t == s) {
            Some((_, m)) => *m = m.saturating_add(n),
            None => by_status.push((s, n)),
        }
    }
    by_status.sort_by_key(|(s, _)| s.as_u32());
    StatusCounts {
        by_status,
        other: a.other.saturating_add(b.other),
    }
}

/// `now`'s runtime in `prev`: the same pid and the same `nrt_init` instant. A process that
/// closed a runtime and started another has both files, and a reused pid is another process:
/// neither is `now`'s baseline. (Uptimes cannot tell: they are read at different instants, so
/// the closed runtime's uptime in `prev` can be below the new one's now.)
fn earlier<'a>(prev: &'a Sample, now: &ProcessSnapshot) -> Option<&'a ProcessSnapshot> {
    prev.processes
        .iter()
        .find(|t| t.pid == now.pid && t.created_unix_ns == now.created_unix_ns)
}

/// The figures of the period from `prev` (none for the first sample) to `cur`.
///
/// Every execution counts in exactly one period: a live runtime's since `prev` (since its
/// `nrt_init` when `prev` lacks it); a runtime that closed since `prev` once more, with its last
/// executions (a closed datastore lingers for readers, [`runtime::datastore::CLOSED_LINGER`]),
/// and then no more; one that started and closed between the samples, all of its executions;
/// a runtime whose process died without closing (stale) the same way, in the period it is found
/// gone, and afterwards its totals only.
pub fn collect(prev: Option<&Sample>, cur: &Sample) -> Figures {
    let elapsed = prev.map_or(Duration::ZERO, |p| cur.at.saturating_duration_since(p.at));
    let mut processes: Vec<ProcessFigures> = cur
        .processes
        .iter()
        .filter_map(|now| {
            let before = prev.and_then(|p| earlier(p, now));
            // Closed and already reported (or already closed at the first sample): gone.
            if now.liveness == Liveness::Closed
                && before.is_some_and(|t| t.liveness != Liveness::Live)
            {
                return None;
            }
            // A stale runtime's last executions (since the sample that saw it live, or all of
            // them when it started after that sample) count once, in the period it is found
            // gone; one already stale at the previous sample, or with no previous sample, is
            // listed with its totals only.
            let counted = now.liveness == Liveness::Stale
                && (prev.is_none() || before.is_some_and(|t| t.liveness != Liveness::Live));
            let then = before.filter(|t| t.liveness == Liveness::Live);
            Some(process_figures(now, then, counted, elapsed))
        })
        .collect();
    processes.sort_by_key(|p| (p.stale, p.pid));
    Figures {
        period: elapsed,
        processes,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use runtime::datastore::snapshot::TpbSnapshot;
    use shared::NrtStatus;

    /// A core that ran `ok` successful and `failed` timed-out executions of `lat_us` each and
    /// was busy `busy_ms`.
    pub(crate) fn core(vnc: u32, ok: u64, failed: u64, lat_us: u64, busy_ms: u64) -> CoreSnapshot {
        let mut total = Histogram::default();
        let mut device = Histogram::default();
        for _ in 0..ok + failed {
            total.record(lat_us * 1000);
            device.record(lat_us * 1000 / 2);
        }
        let mut by_status = Vec::new();
        if ok > 0 {
            by_status.push((NrtStatus::Success, ok));
        }
        if failed > 0 {
            by_status.push((NrtStatus::Timeout, failed));
        }
        CoreSnapshot {
            vnc,
            logical_id: vnc + 4,
            ncs: vec![vnc + 4],
            executions: StatusCounts {
                by_status,
                other: 0,
            },
            total_latency: total,
            device_latency: device,
            memory: MemoryUsage {
                bytes: [100, 200, 300, 400, 500],
            },
            tpbs: vec![TpbSnapshot {
                nc: vnc + 4,
                exec_stats: Vec::new(),
                error_stats: [0; 4],
                busy_ns: busy_ms * 1_000_000,
                nc_latency: Histogram::default(),
            }],
        }
    }

    pub(crate) fn process(pid: u32, uptime_s: u64, cores: Vec<CoreSnapshot>) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            command: format!("app-{pid} --serve"),
            runtime_version: "2.0.0".into(),
            lnc: 1,
            uptime: Duration::from_secs(uptime_s),
            created_unix_ns: u64::from(pid) << 32,
            liveness: Liveness::Live,
            cores,
            models: vec![ModelSnapshot {
                id: 1,
                name: "digits".into(),
                uuid: [0; 16],
                vnc: 0,
                loaded: true,
                memory_bytes: 1500,
                executions: StatusCounts::default(),
                total_latency: Histogram::default(),
            }],
            read_retries: 0,
        }
    }

    #[test]
    fn utilisation_and_rates_are_deltas_over_the_elapsed_period() {
        let t0 = Instant::now();
        let prev = Sample {
            at: t0,
            processes: vec![process(10, 5, vec![core(0, 100, 0, 1000, 1000)])],
        };
        let cur = Sample {
            at: t0 + Duration::from_secs(2),
            processes: vec![process(10, 7, vec![core(0, 300, 4, 1000, 1500)])],
        };
        let f = collect(Some(&prev), &cur);
        assert_eq!(f.period, Duration::from_secs(2));
        let p = &f.processes[0];
        assert_eq!(p.period, Duration::from_secs(2));
        let c = &p.cores[0];
        // 500 ms busy in 2 s.
        assert!(
            (c.utilization_pct - 25.0).abs() < 1e-9,
            "{}",
            c.utilization_pct
        );
        assert_eq!((c.executions, c.errors), (204, 4));
        assert!((c.executions_per_s - 102.0).abs() < 1e-9);
        assert_eq!((c.executions_total, c.errors_total), (304, 4));
        assert_eq!(p.execution_summary.completed, 200);
        assert_eq!(p.execution_summary.timed_out, 4);
        assert_eq!(p.error_summary.transient, 4);
        assert_eq!(p.execution_total.completed, 300);
        assert_eq!(p.total_latency.count, 204);
        assert_eq!(p.total_latency_all.count, 304);
        assert_eq!(c.logical_id, 4);
    }

    #[test]
    fn a_closed_runtime_counts_its_last_executions_once_then_is_gone() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let closed = |p: ProcessSnapshot| ProcessSnapshot {
            liveness: Liveness::Closed,
            ..p
        };
        let s0 = Sample {
            at: at(0),
            processes: vec![process(7, 10, vec![core(0, 100, 0, 10, 0)])],
        };
        // Closed after 20 more executions; and pid 8 lived and closed within the period.
        let s1 = Sample {
            at: at(1),
            processes: vec![
                closed(process(7, 11, vec![core(0, 120, 0, 10, 0)])),
                closed(process(8, 1, vec![core(0, 5, 1, 10, 0)])),
            ],
        };
        let f1 = collect(Some(&s0), &s1);
        let by_pid = |f: &Figures, pid| f.processes.iter().find(|p| p.pid == pid).cloned();
        let p7 = by_pid(&f1, 7).unwrap();
        assert!(p7.closed && !p7.stale);
        assert_eq!(p7.execution_summary.completed, 20);
        let p8 = by_pid(&f1, 8).unwrap();
        assert_eq!(p8.execution_summary.completed, 5);
        assert_eq!(p8.error_summary.total(), 1);
        assert_eq!(f1.live().count(), 2, "their last figures count");
        // The next period: both are gone.
        let s2 = Sample {
            at: at(2),
            processes: vec![
                closed(process(7, 12, vec![core(0, 120, 0, 10, 0)])),
                closed(process(8, 2, vec![core(0, 5, 1, 10, 0)])),
            ],
        };
        assert!(collect(Some(&s1), &s2).processes.is_empty());
        // The same pid's next runtime (started after the closed one) is diffed against its own
        // earlier sample, not the closed one's.
        let next = |uptime_s, ok| ProcessSnapshot {
            created_unix_ns: (7 << 32) + 12_000_000_000,
            ..process(7, uptime_s, vec![core(0, ok, 0, 10, 0)])
        };
        let s3 = Sample {
            at: at(3),
            processes: vec![
                closed(process(7, 13, vec![core(0, 120, 0, 10, 0)])),
                next(1, 3),
            ],
        };
        let s4 = Sample {
            at: at(4),
            processes: vec![
                closed(process(7, 14, vec![core(0, 120, 0, 10, 0)])),
                next(2, 10),
            ],
        };
        let f3 = collect(Some(&s2), &s3);
        assert_eq!(f3.processes.len(), 1);
        assert_eq!(f3.processes[0].execution_summary.completed, 3);
        let f4 = collect(Some(&s3), &s4);
        assert_eq!(f4.processes.len(), 1);
        assert_eq!(f4.processes[0].execution_summary.completed, 7);
    }

    /// A process that closed its runtime and initialised another within one period: each
    /// runtime's executions count once, though the closed one's uptime at the earlier sample
    /// is below the new one's now (they are read a period apart).
    #[test]
    fn a_second_runtime_of_a_process_is_not_counted_again_every_period() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // Runtime 1 initialised at 0 ms, closed at 400 ms after 50 executions; runtime 2
        // initialised at 500 ms. Samples at 900 ms and 1900 ms.
        let snap = |created_ms: u64, now_ms: u64, ok, liveness| ProcessSnapshot {
            created_unix_ns: created_ms * 1_000_000,
            uptime: Duration::from_millis(now_ms - created_ms),
            liveness,
            ..process(21, 0, vec![core(0, ok, 0, 10, 0)])
        };
        let s0 = Sample {
            at: at(900),
            processes: vec![
                snap(0, 900, 50, Liveness::Closed),
                snap(500, 900, 70, Liveness::Live),
            ],
        };
        let s1 = Sample {
            at: at(1900),
            processes: vec![
                snap(0, 1900, 50, Liveness::Closed),
                snap(500, 1900, 70, Liveness::Live),
            ],
        };
        let s2 = Sample {
            at: at(2900),
            processes: vec![
                snap(0, 2900, 50, Liveness::Closed),
                snap(500, 2900, 75, Liveness::Live),
            ],
        };
        let f0 = collect(None, &s0);
        let sum = |f: &Figures| -> u64 { f.live().map(|p| p.execution_summary.completed).sum() };
        assert_eq!(sum(&f0), 120);
        let f1 = collect(Some(&s0), &s1);
        assert_eq!(sum(&f1), 0, "{f1:#?}");
        assert_eq!(f1.processes.len(), 1, "the closed runtime was reported");
        assert_eq!(f1.processes[0].period, Duration::from_secs(1));
        assert_eq!(sum(&collect(Some(&s1), &s2)), 5);
    }

    /// A process killed mid-run: its executions since the last sample are reported once, in
    /// the period it is found gone; then only its totals are listed.
    #[test]
    fn a_killed_runtime_counts_its_last_executions_once() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let stale = |p: ProcessSnapshot| ProcessSnapshot {
            liveness: Liveness::Stale,
            ..p
        };
        let s0 = Sample {
            at: at(0),
            processes: vec![process(31, 10, vec![core(0, 100, 0, 10, 0)])],
        };
        let s1 = Sample {
            at: at(1),
            processes: vec![
                stale(process(31, 11, vec![core(0, 130, 2, 10, 500)])),
                // Started and killed between the samples: all of its executions.
                stale(process(32, 1, vec![core(0, 4, 0, 10, 0)])),
            ],
        };
        let f1 = collect(Some(&s0), &s1);
        let by_pid = |f: &Figures, pid| f.processes.iter().find(|p| p.pid == pid).cloned();
        let p31 = by_pid(&f1, 31).unwrap();
        assert!(p31.stale);
        assert_eq!(p31.execution_summary.completed, 30);
        assert_eq!(p31.execution_summary.timed_out, 2);
        assert_eq!(p31.period, Duration::from_secs(1));
        assert_eq!(p31.cores[0].executions, 32);
        assert!((p31.cores[0].utilization_pct - 50.0).abs() < 1e-9);
        assert_eq!(by_pid(&f1, 32).unwrap().execution_summary.completed, 4);
        // The next period: listed, totals only.
        let s2 = Sample {
            at: at(2),
            processes: s1.processes.clone(),
        };
        let f2 = collect(Some(&s1), &s2);
        for pid in [31, 32] {
            let p = by_pid(&f2, pid).unwrap();
            assert!(p.stale && p.cores.is_empty(), "{p:#?}");
            assert_eq!(p.execution_summary, ExecutionSummary::default());
            assert_eq!(p.period, Duration::ZERO);
        }
        assert_eq!(by_pid(&f2, 31).unwrap().execution_total.completed, 130);
    }

    #[test]
    fn a_process_without_baseline_is_averaged_over_its_uptime() {
        let cur = Sample {
            at: Instant::now(),
            processes: vec![process(11, 4, vec![core(0, 40, 0, 250, 1000)])],
        };
        let f = collect(None, &cur);
        let c = &f.processes[0].cores[0];
        assert!((c.utilization_pct - 25.0).abs() < 1e-9);
        assert!((c.executions_per_s - 10.0).abs() < 1e-9);
        let p50 = f.processes[0].total_latency.percentile(50.0).unwrap();
        assert!(p50.abs_diff(250_000) <= 250_000 / 8, "{p50}");
    }

    #[test]
    fn a_restarted_pid_is_not_diffed_against_its_predecessor() {
        let t0 = Instant::now();
        let prev = Sample {
            at: t0,
            processes: vec![process(12, 100, vec![core(0, 1000, 0, 10, 1000)])],
        };
        // Same pid, another nrt_init (a new process): not the old one's successor.
        let cur = Sample {
            at: t0 + Duration::from_secs(1),
            processes: vec![ProcessSnapshot {
                created_unix_ns: 99,
                ..process(12, 1, vec![core(0, 10, 0, 10, 100)])
            }],
        };
        let c = &collect(Some(&prev), &cur).processes[0].cores[0];
        assert_eq!(c.executions, 10);
        assert!((c.utilization_pct - 10.0).abs() < 1e-9);
    }

    #[test]
    fn utilisation_is_clamped_and_stale_processes_have_no_live_figures() {
        let t0 = Instant::now();
        let mut stale = process(9, 50, vec![core(0, 77, 1, 10, 10)]);
        stale.liveness = Liveness::Stale;
        let prev = Sample {
            at: t0,
            processes: vec![process(13, 5, vec![core(0, 0, 0, 1, 0)]), stale.clone()],
        };
        let cur = Sample {
            at: t0 + Duration::from_millis(100),
            // A busy sum that overshoots the wall time (clock skew) is shown as 100 %.
            processes: vec![stale, process(13, 5, vec![core(0, 0, 0, 1, 500)])],
        };
        let f = collect(Some(&prev), &cur);
        assert_eq!(f.processes[0].pid, 13, "live ones first");
        assert_eq!(f.processes[0].cores[0].utilization_pct, 100.0);
        let s = &f.processes[1];
        assert!(s.stale);
        assert!(s.cores.is_empty());
        assert_eq!(s.execution_summary, ExecutionSummary::default());
        assert_eq!(s.execution_total.completed, 77);
        assert_eq!((f.live().count(), f.stale_count()), (1, 1));
    }

    #[test]
    fn merge_adds_histograms() {
        let mut a = Histogram::default();
        a.record(10);
        let mut b = Histogram::default();
        b.record(1000);
        b.record(3);
        merge(&mut a, &b);
        assert_eq!((a.count, a.sum_ns, a.min_ns, a.max_ns), (3, 1013, 3, 1000));
        merge(&mut a, &Histogram::default());
        assert_eq!((a.min_ns, a.max_ns), (3, 1000));
    }
}
