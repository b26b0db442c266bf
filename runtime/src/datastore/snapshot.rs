//! What a reader sees of one runtime process's datastore: plain values copied out of the
//! shared mapping, with the bucket scheme of the latency histograms.
//!
//! `nrt monitor` and `nrt top` are built on these types only; how they are laid out in shared
//! memory is the writer's business (the parent module). Counts are totals since the process's
//! `nrt_init`: a reader that wants rates diffs two snapshots ([`ProcessSnapshot::delta`]).

use std::time::Duration;

use shared::NrtStatus;

/// Sub-buckets per power of two in a latency histogram (relative error at most 1/8).
pub const HIST_SUB_BUCKETS: u64 = 8;
/// The largest power of two a histogram tells apart: samples of 2^40 ns (about 18 minutes)
/// and more share the last bucket.
pub const HIST_MAX_EXPONENT: u32 = 40;
/// Buckets in a latency histogram: 8 exact buckets for 0..8 ns, then 8 per power of two from
/// 2^3 to 2^40.
pub const HIST_BUCKETS: usize = 312;

/// The bucket of a sample of `ns` nanoseconds: `ns` itself below 8; else, with `e` the index
/// of the highest set bit (at most [`HIST_MAX_EXPONENT`]) and `sub` the 3 bits below it,
/// `(e - 2) * 8 + sub`.
// The casts are of values below 312 (a bucket index) or 64 (a bit index).
#[allow(clippy::cast_possible_truncation)]
pub const fn bucket_of(ns: u64) -> usize {
    if ns < HIST_SUB_BUCKETS {
        return ns as usize;
    }
    let e = 63 - ns.leading_zeros();
    if e > HIST_MAX_EXPONENT {
        return HIST_BUCKETS - 1;
    }
    let sub = (ns >> (e - 3)) & (HIST_SUB_BUCKETS - 1);
    ((e - 2) as usize) * (HIST_SUB_BUCKETS as usize) + sub as usize
}

/// The smallest sample of bucket `index` (the inverse of [`bucket_of`] on bucket starts).
// The casts are of the constant 8 and of `index / 8 + 2` (an exponent for any bucket index).
#[allow(clippy::cast_possible_truncation)]
pub const fn bucket_start(index: usize) -> u64 {
    let sub_buckets = HIST_SUB_BUCKETS as usize;
    if index < sub_buckets {
        return index as u64;
    }
    let e = (index / sub_buckets + 2) as u32;
    let sub = (index % sub_buckets) as u64;
    (1u64 << e) | (sub << (e - 3))
}

/// A latency histogram: counts per [`bucket_of`] bucket plus the exact count, sum, minimum and
/// maximum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    /// Samples per bucket ([`HIST_BUCKETS`] entries).
    pub buckets: Vec<u64>,
    /// Samples recorded.
    pub count: u64,
    /// Sum of the samples, ns.
    pub sum_ns: u64,
    /// Smallest sample, ns (`u64::MAX` while empty).
    pub min_ns: u64,
    /// Largest sample, ns (0 while empty).
    pub max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: vec![0; HIST_BUCKETS],
            count: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }
}

impl Histogram {
    /// Records one sample (for readers that build histograms, and tests).
    pub fn record(&mut self, ns: u64) {
        if let Some(b) = self.buckets.get_mut(bucket_of(ns)) {
            *b += 1;
        }
        self.count += 1;
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// The sample at percentile `p` (0..=100), in ns: the exact minimum at 0 and maximum at
    /// 100; otherwise the middle of the bucket holding the rank, clamped to [min, max].
    /// `None` while empty.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        if p <= 0.0 {
            return Some(self.min_ns);
        }
        if p >= 100.0 {
            return Some(self.max_ns);
        }
        // The rank (1-based) of the sample at p: ceil(p% of count), at least 1.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let start = bucket_start(i);
                let end = if i + 1 < self.buckets.len() {
                    bucket_start(i + 1)
                } else {
                    self.max_ns.max(start)
                };
                let mid = start + (end - start) / 2;
                return Some(mid.clamp(self.min_ns, self.max_ns));
            }
        }
        Some(self.max_ns)
    }

    /// The samples recorded since `earlier` (a snapshot of the same histogram); the minimum and
    /// maximum of the interval are not known exactly and are taken from its buckets.
    pub fn delta(&self, earlier: &Self) -> Self {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .zip(earlier.buckets.iter().chain(std::iter::repeat(&0)))
            .map(|(now, then)| now.saturating_sub(*then))
            .collect();
        let first = buckets.iter().position(|&n| n > 0);
        let last = buckets.iter().rposition(|&n| n > 0);
        let count = self.count.saturating_sub(earlier.count);
        Self {
            min_ns: first.map_or(u64::MAX, |i| bucket_start(i).max(self.min_ns)),
            max_ns: last.map_or(0, |i| {
                let end = if i + 1 < HIST_BUCKETS {
                    bucket_start(i + 1) - 1
                } else {
                    u64::MAX
                };
                end.min(self.max_ns)
            }),
            buckets,
            count,
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }
}

/// Executions by the status they ended with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts {
    /// `(status, executions)` for every status with a non-zero count, in [`NrtStatus::ALL`]
    /// order.
    pub by_status: Vec<(NrtStatus, u64)>,
    /// Executions that ended with a code outside [`NrtStatus::ALL`].
    pub other: u64,
}

impl StatusCounts {
    /// Executions that ended with `status`.
    pub fn get(&self, status: NrtStatus) -> u64 {
        self.by_status
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }

    /// All executions counted.
    pub fn total(&self) -> u64 {
        self.by_status.iter().map(|(_, n)| n).sum::<u64>() + self.other
    }
}

/// Device memory by what holds it, with neuron-monitor's kinds (`usage_breakdown`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemKind {
    /// Weights and other constants written at load.
    Constants,
    /// Instruction streams and their tables.
    ModelCode,
    /// Scratchpads and intermediate buffers of loaded models.
    ModelSharedScratchpad,
    /// The runtime's own structures: rings, requests, notification queues.
    RuntimeMemory,
    /// Tensors the application allocated.
    Tensors,
}

impl MemKind {
    /// Every kind, in the order of the datastore's table.
    pub const ALL: [Self; 5] = [
        Self::Constants,
        Self::ModelCode,
        Self::ModelSharedScratchpad,
        Self::RuntimeMemory,
        Self::Tensors,
    ];

    /// neuron-monitor's name of the kind.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Constants => "constants",
            Self::ModelCode => "model_code",
            Self::ModelSharedScratchpad => "model_shared_scratchpad",
            Self::RuntimeMemory => "runtime_memory",
            Self::Tensors => "tensors",
        }
    }
}

/// Device bytes in use by kind ([`MemKind::ALL`] order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes per kind, indexed by position in [`MemKind::ALL`].
    pub bytes: [u64; 5],
}

impl MemoryUsage {
    /// Bytes of `kind`.
    pub fn get(&self, kind: MemKind) -> u64 {
        self.bytes[kind as usize]
    }

    /// All bytes.
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// One physical NC (TPB) of a logical core: the seed's per-TPB counters
/// (`kmetric_update_nds_*`, [`crate::metrics`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpbSnapshot {
    /// Global physical NC index.
    pub nc: u32,
    /// Executions by exec-stat ordinal ([`crate::metrics::exec_stat_ordinal`]).
    pub exec_stats: Vec<u64>,
    /// Errors by infer-error flag index 5..=8 (stored at `index - 5`).
    pub error_stats: [u64; 4],
    /// Sum of the NC's busy time (the notifications' NC timestamps), ns.
    pub busy_ns: u64,
    /// NC busy time per execution.
    pub nc_latency: Histogram,
}

/// One logical core (vNC) of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreSnapshot {
    /// The process's logical core index (0-based, as `nrt_execute` names it).
    pub vnc: u32,
    /// The device's logical core index (`first physical NC / LNC`), what neuron-monitor keys
    /// `neuroncores_in_use` by.
    pub logical_id: u32,
    /// Its physical NCs (1, or 2 at LNC=2).
    pub ncs: Vec<u32>,
    /// Executions, counted once per execution, by final status.
    pub executions: StatusCounts,
    /// End-to-end latency (submit to completion, host clock).
    pub total_latency: Histogram,
    /// Device latency (the notification's device timestamps; the slower TPB at LNC=2).
    pub device_latency: Histogram,
    /// Device memory held on the core by kind.
    pub memory: MemoryUsage,
    /// The core's TPBs.
    pub tpbs: Vec<TpbSnapshot>,
}

impl CoreSnapshot {
    /// The busiest TPB's busy time, ns (the core is busy while any of its TPBs is).
    pub fn busy_ns(&self) -> u64 {
        self.tpbs.iter().map(|t| t.busy_ns).max().unwrap_or(0)
    }
}

/// One model, loaded now or unloaded since (its slot keeps the counts until reused).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSnapshot {
    /// The model handle's id within the process.
    pub id: u64,
    /// The model's name (the container's or NEFF's name, at most 63 bytes).
    pub name: String,
    /// The NEFF header's uuid; zeros for a simdev model container.
    pub uuid: [u8; 16],
    /// The logical core it is loaded on.
    pub vnc: u32,
    /// Whether it is loaded now.
    pub loaded: bool,
    /// Device bytes it holds (0 once unloaded).
    pub memory_bytes: u64,
    /// Its executions by final status.
    pub executions: StatusCounts,
    /// Its end-to-end latency.
    pub total_latency: Histogram,
}

impl ModelSnapshot {
    /// The uuid in lowercase hex, as `nrt neff info` prints it; "" when the model has none.
    pub fn uuid_hex(&self) -> String {
        if self.uuid == [0; 16] {
            return String::new();
        }
        self.uuid.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Whether the writer still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The process lives and has not closed the runtime.
    Live,
    /// The process is gone without closing the runtime (killed): the file is stale; its last
    /// counts are shown for what they are worth, never merged into live figures.
    Stale,
    /// The runtime was closed (`nrt_close`, or the process's exit): the counters are final.
    Closed,
}

/// One runtime process's datastore, as read at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSnapshot {
    /// The writer's pid.
    pub pid: u32,
    /// Its command line (`/proc/PID/cmdline`, arguments joined by spaces; at most 255 bytes).
    pub command: String,
    /// The runtime's version string.
    pub runtime_version: String,
    /// NCs per logical core (1 or 2).
    pub lnc: u32,
    /// Time since the writer's `nrt_init`.
    pub uptime: Duration,
    /// When the writer's runtime was initialised (ns since the Unix epoch): with the pid, the
    /// identity of one runtime across samples (a process that closes and re-initialises has
    /// two datastores of one pid; a reused pid is another process).
    pub created_unix_ns: u64,
    /// Live or stale.
    pub liveness: Liveness,
    /// The process's logical cores.
    pub cores: Vec<CoreSnapshot>,
    /// Its models (loaded ones first).
    pub models: Vec<ModelSnapshot>,
    /// Seqlock retries the reader needed (a live writer raced it); diagnostics only.
    pub read_retries: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_range_in_order_and_start_where_bucket_of_says() {
        assert_eq!(bucket_of(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(bucket_of(1 << HIST_MAX_EXPONENT), HIST_BUCKETS - 8);
        for i in 0..HIST_BUCKETS {
            assert_eq!(bucket_of(bucket_start(i)), i, "bucket {i}");
            if i + 1 < HIST_BUCKETS {
                assert!(bucket_start(i + 1) > bucket_start(i));
                assert_eq!(bucket_of(bucket_start(i + 1) - 1), i, "end of bucket {i}");
            }
        }
    }

    #[test]
    fn percentiles_are_within_an_eighth_and_exact_at_the_ends() {
        let mut h = Histogram::default();
        assert_eq!(h.percentile(50.0), None);
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        assert_eq!(h.percentile(0.0), Some(1000));
        assert_eq!(h.percentile(100.0), Some(1_000_000));
        for (p, exact) in [(50.0, 500_000u64), (99.0, 990_000), (25.0, 250_000)] {
            let got = h.percentile(p).unwrap();
            let err = got.abs_diff(exact) as f64 / exact as f64;
            assert!(err <= 0.125, "p{p}: {got} vs {exact}");
        }
        let earlier = h.clone();
        h.record(5_000_000);
        let d = h.delta(&earlier);
        assert_eq!((d.count, d.sum_ns), (1, 5_000_000));
        assert!(d.min_ns <= 5_000_000 && d.max_ns >= 5_000_000 - 5_000_000 / 8);
        assert_eq!(
            d.percentile(50.0).map(|v| v.abs_diff(5_000_000) <= 625_000),
            Some(true)
        );
    }
}
