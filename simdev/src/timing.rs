//! The latency model (DESIGN §5 "Timing", [`LatencyModel`]).
//!
//! With the default model (every field 0) simdev is functional and as fast as it can be: an
//! execution's `nc_ts_ns` is its wall-clock duration and `device_ts_ns` the wall-clock time
//! since simdev started. Any other model switches every NC to a simulated clock that starts
//! at 0 when the model is set and advances only by executions: an execution lasts
//! [`duration_ns`], its notification's `nc_ts_ns` is that duration and its `device_ts_ns` the
//! NC's clock after adding it. Other notifications (DMA aborts, DeviceLost) carry the NC's
//! clock as it stands. With `wall_clock_pacing` the sequencer also sleeps until the execution
//! has taken at least its simulated duration in wall-clock time before posting.
//!
//! An ExtraLatency fault adds to the simulated duration under a model (slept only when
//! pacing); with the default model, where device time is the wall clock, the sequencer sleeps
//! it, so it shows in `nc_ts_ns` and delays the NC's next execution either way.

use std::sync::atomic::{AtomicU64, Ordering};

use shared::protocol::LatencyModel;

/// What one execution did, as the model charges it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Charge {
    /// Instructions executed by all five engines.
    pub instructions: u64,
    /// The request had `reload_seq_config` = 1.
    pub config_reload: bool,
    /// The request had `load_act_dve_tables` = 1.
    pub table_load: bool,
    /// Simulated nanoseconds added by ExtraLatency faults.
    pub extra_ns: u64,
}

/// Whether `model` is the default: device timestamps follow the wall clock.
pub fn is_wall_clock(model: &LatencyModel) -> bool {
    *model == LatencyModel::default()
}

/// The simulated duration of an execution: `per_execution_ns + instructions ·
/// per_instruction_ns + per_config_reload_ns (if reloaded) + per_table_load_ns (if loaded) +
/// extra_ns`, saturating at `u64::MAX`.
pub fn duration_ns(model: &LatencyModel, charge: &Charge) -> u64 {
    let reload = if charge.config_reload {
        model.per_config_reload_ns
    } else {
        0
    };
    let tables = if charge.table_load {
        model.per_table_load_ns
    } else {
        0
    };
    model
        .per_execution_ns
        .saturating_add(charge.instructions.saturating_mul(model.per_instruction_ns))
        .saturating_add(reload)
        .saturating_add(tables)
        .saturating_add(charge.extra_ns)
}

/// One NC's simulated clock, in nanoseconds.
#[derive(Debug, Default)]
pub struct SimClock(AtomicU64);

impl SimClock {
    /// The clock's time.
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Back to 0 (a new model was set).
    pub fn reset(&self) {
        self.0.store(0, Ordering::Release);
    }

    /// Advances the clock by `ns` (saturating); returns the new time.
    pub fn advance(&self, ns: u64) -> u64 {
        let mut old = self.now();
        loop {
            let new = old.saturating_add(ns);
            match self
                .0
                .compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return new,
                Err(seen) => old = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_add_up_exactly() {
        let model = LatencyModel {
            per_execution_ns: 1_000,
            per_instruction_ns: 10,
            per_config_reload_ns: 500_000,
            per_table_load_ns: 70_000,
            per_nc_reset_ns: 0,
            wall_clock_pacing: false,
        };
        let plain = Charge {
            instructions: 7,
            ..Charge::default()
        };
        assert_eq!(duration_ns(&model, &plain), 1_070);
        let reloaded = Charge {
            config_reload: true,
            table_load: true,
            extra_ns: 3,
            ..plain
        };
        assert_eq!(
            duration_ns(&model, &reloaded) - duration_ns(&model, &plain),
            500_000 + 70_000 + 3
        );
        let huge = Charge {
            instructions: u64::MAX,
            ..plain
        };
        assert_eq!(duration_ns(&model, &huge), u64::MAX);
        assert!(is_wall_clock(&LatencyModel::default()));
        assert!(!is_wall_clock(&model));
    }

    #[test]
    fn the_clock_advances_and_resets() {
        let clock = SimClock::default();
        assert_eq!(clock.advance(5), 5);
        assert_eq!(clock.advance(7), 12);
        assert_eq!(clock.advance(u64::MAX), u64::MAX);
        clock.reset();
        assert_eq!(clock.now(), 0);
    }
}
