//! Per-NC execution counters, mirroring libnrt's `kmetric_update_nds_*` updaters (seed 004 §5
//! NOTE): exec stats by status ordinal, error stats by infer-error flag, and latencies.
//!
//! Ordinals (read from libnrt's code; their NDS counter names are not public): SUCCESS 1,
//! COMPLETED_WITH_ERR 2, TIMEOUT 4, QUEUE_FULL 6, HW_ERROR 11, FAILURE 16, INVALID 19, OOB 30,
//! HBM_UE 32, NC_UE 33. Statuses without an ordinal of their own are counted under
//! [`OTHER_ORDINAL`]. Error stats count infer-error flag indices 5..=8 at ordinal flag + 31.

use std::sync::Mutex;

use shared::NrtStatus;

/// Number of exec-stat ordinals kept (0..=40).
pub const EXEC_STAT_ORDINALS: usize = 41;
/// Ordinal used for statuses libnrt has no ordinal for.
pub const OTHER_ORDINAL: usize = 0;

/// The exec-stat ordinal of `status` (`kmetric_update_nds_exec_stats`).
pub fn exec_stat_ordinal(status: NrtStatus) -> usize {
    match status {
        NrtStatus::Success => 1,
        NrtStatus::ExecCompletedWithErr => 2,
        NrtStatus::Timeout => 4,
        NrtStatus::QueueFull => 6,
        NrtStatus::HwError => 11,
        NrtStatus::Failure => 16,
        NrtStatus::Invalid => 19,
        NrtStatus::ExecOob => 30,
        NrtStatus::ExecHwErrHbmUe => 32,
        NrtStatus::ExecHwErrNcUe => 33,
        _ => OTHER_ORDINAL,
    }
}

/// Latency statistics of one kind, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStats {
    /// Samples recorded.
    pub count: u64,
    /// Sum of samples, µs.
    pub total_us: u64,
    /// Largest sample, µs.
    pub max_us: u64,
    /// Last sample, µs.
    pub last_us: u64,
}

impl LatencyStats {
    fn record(&mut self, us: u64) {
        self.count += 1;
        self.total_us = self.total_us.saturating_add(us);
        self.max_us = self.max_us.max(us);
        self.last_us = us;
    }
}

/// Counters of one physical NC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcMetrics {
    /// Executions by exec-stat ordinal ([`exec_stat_ordinal`]).
    pub exec_stats: [u64; EXEC_STAT_ORDINALS],
    /// Errors by infer-error flag index 5..=8 (stored at `index - 5`).
    pub error_stats: [u64; 4],
    /// End-to-end latency (submit to completion, host clock).
    pub e2e: LatencyStats,
    /// Device latency (device timestamps).
    pub device: LatencyStats,
    /// NC busy latency (NC timestamps).
    pub nc: LatencyStats,
}

impl Default for NcMetrics {
    fn default() -> Self {
        Self {
            exec_stats: [0; EXEC_STAT_ORDINALS],
            error_stats: [0; 4],
            e2e: LatencyStats::default(),
            device: LatencyStats::default(),
            nc: LatencyStats::default(),
        }
    }
}

impl NcMetrics {
    /// Executions that ended with `status`.
    pub fn executions_with(&self, status: NrtStatus) -> u64 {
        self.exec_stats[exec_stat_ordinal(status)]
    }

    /// All executions counted.
    pub fn executions(&self) -> u64 {
        self.exec_stats.iter().sum()
    }
}

/// One execution's result on one TPB, as the completion engine fills it (`infer_resp_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpbResponse {
    /// Device time of the execution, ns.
    pub device_ns: u64,
    /// NC busy time of the execution, ns.
    pub nc_ns: u64,
    /// Infer-error flag bits (bit i = flag index i).
    pub error_flags: u32,
}

/// The runtime's metrics: one [`NcMetrics`] per physical NC.
#[derive(Debug)]
pub struct Metrics {
    ncs: Vec<Mutex<NcMetrics>>,
}

impl Metrics {
    /// Counters for `nc_count` NCs, all zero.
    pub fn new(nc_count: usize) -> Self {
        Self {
            ncs: (0..nc_count)
                .map(|_| Mutex::new(NcMetrics::default()))
                .collect(),
        }
    }

    /// Records one execution on `nc` (the three `kmetric_update_nds_*` updaters). An NC
    /// outside the table is ignored.
    pub fn record_execution(&self, nc: usize, status: NrtStatus, e2e_us: u64, resp: &TpbResponse) {
        let Some(m) = self.ncs.get(nc) else { return };
        let mut m = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        m.e2e.record(e2e_us);
        m.device.record(resp.device_ns / 1000);
        m.nc.record(resp.nc_ns / 1000);
        for flag in 5..=8u32 {
            if resp.error_flags & (1 << flag) != 0 {
                m.error_stats[(flag - 5) as usize] += 1;
            }
        }
        m.exec_stats[exec_stat_ordinal(status)] += 1;
    }

    /// A copy of NC `nc`'s counters (`None` for an NC outside the table).
    pub fn snapshot(&self, nc: usize) -> Option<NcMetrics> {
        self.ncs.get(nc).map(|m| {
            m.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_follow_libnrt() {
        assert_eq!(exec_stat_ordinal(NrtStatus::Success), 1);
        assert_eq!(exec_stat_ordinal(NrtStatus::ExecHwErrNcUe), 33);
        assert_eq!(
            exec_stat_ordinal(NrtStatus::ExecUnitUnrecoverable),
            OTHER_ORDINAL
        );
    }

    #[test]
    fn record_updates_all_three_groups() {
        let m = Metrics::new(2);
        let resp = TpbResponse {
            device_ns: 5_000,
            nc_ns: 3_000,
            error_flags: 1 << 6,
        };
        m.record_execution(1, NrtStatus::ExecOob, 42, &resp);
        let s = m.snapshot(1).unwrap();
        assert_eq!(s.executions_with(NrtStatus::ExecOob), 1);
        assert_eq!(s.error_stats, [0, 1, 0, 0]);
        assert_eq!((s.e2e.last_us, s.device.last_us, s.nc.last_us), (42, 5, 3));
        assert_eq!(m.snapshot(0).unwrap().executions(), 0);
        assert!(m.snapshot(2).is_none());
    }
}
