//! Per-NC execution counters, mirroring libnrt's `kmetric_update_nds_*` updaters (seed 004 §5
//! NOTE): exec stats by status ordinal, error stats by infer-error flag, and latencies.
//!
//! Ordinals (read from libnrt's code; their NDS counter names are not public): SUCCESS 1,
//! COMPLETED_WITH_ERR 2, TIMEOUT 4, QUEUE_FULL 6, HW_ERROR 11, FAILURE 16, INVALID 19, OOB 30,
//! HBM_UE 32, NC_UE 33. Statuses without an ordinal of their own are counted under
//! [`OTHER_ORDINAL`]. Error stats count infer-error flag indices 5..=8 at ordinal flag + 31.

use std::sync::Arc;
use std::time::Duration;

use shared::NrtStatus;
use shared::datastore::LatencyRecord;

use crate::datastore::{Datastore, ModelSlot};

/// Number of exec-stat ordinals kept (0..=40).
pub const EXEC_STAT_ORDINALS: usize = shared::datastore::EXEC_STAT_ORDINALS;
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
    /// The notification's device timestamp (`device_ts_ns`), ns: when the device wrote it, on
    /// simdev's clock (since simdev started). The system trace places device events with it;
    /// it is a point in time, not a latency.
    pub device_ts_ns: u64,
    /// NC busy time of the execution (the notification's `nc_ts_ns`), ns.
    pub nc_ns: u64,
    /// Infer-error flag bits (bit i = flag index i).
    pub error_flags: u32,
}

impl TpbResponse {
    /// The execution's device latency, ns (seed 004's `dev_lat`, neuron-monitor's
    /// `device_latency`). The notification carries one duration, the NC's busy time for the
    /// execution; the device latency is that duration (on simdev they are the same figure).
    pub const fn device_latency_ns(&self) -> u64 {
        self.nc_ns
    }
}

/// The runtime's metrics: the seed's per-TPB counters plus the datastore's per-core and
/// per-model ones, stored in a [`Datastore`] (the shared file, or the same records in private
/// memory: one code path either way).
#[derive(Debug)]
pub struct Metrics {
    store: Option<Arc<Datastore>>,
    /// Physical NCs of the device ([`Metrics::snapshot`] answers for each).
    nc_count: usize,
}

impl Metrics {
    /// Counters for `nc_count` NCs, all zero, in private memory: one logical core per NC
    /// (core `i` is NC `i`). When even a private mapping cannot be made the counters are off
    /// (logged) and every snapshot reads zero.
    pub fn new(nc_count: usize) -> Self {
        let cores: Vec<Vec<u32>> = (0..nc_count)
            .map(|nc| vec![u32::try_from(nc).unwrap_or(u32::MAX)])
            .collect();
        let store = match Datastore::private(&cores, 1) {
            Ok(d) => Some(Arc::new(d)),
            Err(e) => {
                tracing::error!(error = %e, "metrics: no memory for the counters; they are off");
                None
            }
        };
        Self { store, nc_count }
    }

    /// The metrics of a runtime whose counters live in `store`, on a device of `nc_count` NCs.
    pub fn with_datastore(store: Arc<Datastore>, nc_count: usize) -> Self {
        Self {
            store: Some(store),
            nc_count,
        }
    }

    /// The datastore holding the counters.
    pub fn datastore(&self) -> Option<&Arc<Datastore>> {
        self.store.as_ref()
    }

    /// Records one execution on `nc` (the three `kmetric_update_nds_*` updaters). An NC
    /// outside the table is ignored.
    pub fn record_execution(&self, nc: usize, status: NrtStatus, e2e_us: u64, resp: &TpbResponse) {
        if let (Some(s), Ok(nc)) = (&self.store, u32::try_from(nc)) {
            s.record_tpb(nc, status, e2e_us, resp);
        }
    }

    /// Records one finished execution of logical core `vnc` (physical NCs `tpbs`, results
    /// `resp` in the same order) of the model in `model_slot`: the per-TPB counters, then the
    /// core's and the model's, once. Allocation-free.
    pub fn record_completion(
        &self,
        vnc: u32,
        tpbs: &[u32],
        model_slot: Option<ModelSlot>,
        status: NrtStatus,
        e2e: Duration,
        resp: &[TpbResponse],
    ) {
        let Some(s) = &self.store else { return };
        let e2e_us = u64::try_from(e2e.as_micros()).unwrap_or(u64::MAX);
        let mut device_ns = 0;
        let records = s.records();
        for (nc, r) in tpbs.iter().zip(resp) {
            records.tpb(*nc, status, e2e_us, r);
            device_ns = device_ns.max(r.device_latency_ns());
        }
        records.core(vnc, status, e2e, device_ns);
        if let Some(slot) = model_slot {
            records.model(slot, status, e2e);
        }
    }

    /// Counts one execution of logical core `vnc` (of the model in `model_slot`) that the
    /// runtime refused with `status` before it was scheduled: a wrong input or tensor set,
    /// a full queue, a degraded core. neuron-monitor counts these (`incorrect_input`,
    /// `failed_to_queue`); the per-TPB counters do not (the seed updates them only when the
    /// worker completes an execution).
    pub fn record_refusal(&self, vnc: u32, model_slot: Option<ModelSlot>, status: NrtStatus) {
        let Some(s) = &self.store else { return };
        let records = s.records();
        records.core_refusal(vnc, status);
        if let Some(slot) = model_slot {
            records.model_refusal(slot, status);
        }
    }

    /// A copy of NC `nc`'s counters (`None` for an NC outside the device).
    pub fn snapshot(&self, nc: usize) -> Option<NcMetrics> {
        if nc >= self.nc_count {
            return None;
        }
        let rec = self
            .store
            .as_ref()
            .and_then(|s| s.tpb_record(u32::try_from(nc).ok()?));
        Some(rec.map_or_else(NcMetrics::default, |r| NcMetrics {
            exec_stats: r.exec_stats,
            error_stats: r.error_stats,
            e2e: LatencyStats::from(r.e2e),
            device: LatencyStats::from(r.device),
            nc: LatencyStats::from(r.nc_busy),
        }))
    }
}

impl From<LatencyRecord> for LatencyStats {
    fn from(r: LatencyRecord) -> Self {
        Self {
            count: r.count,
            total_us: r.total_us,
            max_us: r.max_us,
            last_us: r.last_us,
        }
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
            device_ts_ns: 5_000,
            nc_ns: 3_000,
            error_flags: 1 << 6,
        };
        m.record_execution(1, NrtStatus::ExecOob, 42, &resp);
        let s = m.snapshot(1).unwrap();
        assert_eq!(s.executions_with(NrtStatus::ExecOob), 1);
        assert_eq!(s.error_stats, [0, 1, 0, 0]);
        // The device latency is the busy time; the timestamp is no latency.
        assert_eq!((s.e2e.last_us, s.device.last_us, s.nc.last_us), (42, 3, 3));
        assert_eq!(m.snapshot(0).unwrap().executions(), 0);
        assert!(m.snapshot(2).is_none());
    }
}
