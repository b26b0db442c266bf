//! Fault injection (DESIGN §5 "Fault injection", [`shared::protocol::FaultSpec`]).
//!
//! Faults are armed by any client ([`Request::InjectFault`](shared::protocol::Request)) and
//! apply to the NC whatever its owner; [`FaultTable`] keeps them. Each execution that starts
//! on an NC (it took its INFERENCE_START count and its `compute_idx`, whether it then runs or
//! fails fast) asks the table once, in start order, which faults fire on it:
//!
//! - [`FaultWhen::NthExecution`]`(n)` counts the executions that start on a matching NC after
//!   it was armed (1 = the next one) and fires on the `n`th, once; it is then disarmed. With
//!   `nc: None` every NC matches, so it counts the device's executions.
//! - [`FaultWhen::Probability`] draws one number per execution on a matching NC from its own
//!   [`SplitMix64`] seeded with `seed` and fires when the draw falls below `per_million` in a
//!   million; it stays armed. For a given order of executions the same seed hits the same
//!   executions.
//! - [`FaultWhen::NthCopyStart`]`{ engine, queue, n }` counts something else: the DMA doorbells
//!   (DMA_QUEUE_COPY_START) on that queue of a matching NC ([`FaultTable::on_copy_start`]), and
//!   fires on the `n`th, once. It is how a DMA fault reaches work that is not an execution (the
//!   runtime's tensor operations, which move data on a DMA queue of their own): the device stops
//!   the queue before processing the doorbell's descriptors and posts a DmaQueueError
//!   notification naming it (`source = engine << 8 | queue`) with DMA_ABORT (`DmaAbort`) or
//!   DMA_ABORT | OOB (`OutOfBounds`); no other kind can fire there (refused at arming).
//!
//! What fired is reduced to one [`Effects`] value ([`Effects::of`], a pure function), which
//! the sequencer applies to the execution: error flags added to its notification (the
//! program still runs and writes its results), the exec queue stopped (DMA abort), the
//! notification withheld (missing completion) or posted later (late completion), extra
//! simulated time, or the whole device lost.

use std::time::Duration;

use shared::notification::error_flags;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen};

/// The largest `per_million` (certainty).
pub const PER_MILLION: u32 = 1_000_000;

/// SplitMix64 (Steele, Lea and Flood 2014): a tiny, fast, well-mixed deterministic generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64-bit number.
    pub const fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// One draw: whether an event of probability `per_million` / 10^6 happens (the draw scaled
    /// to `0..10^6` without modulo bias worth speaking of).
    pub fn chance(&mut self, per_million: u32) -> bool {
        let scaled = (u128::from(self.next_u64()) * u128::from(PER_MILLION)) >> 64;
        scaled < u128::from(per_million)
    }
}

/// Why a fault was not armed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArmError {
    /// `NthExecution(0)`.
    #[error(
        "NthExecution(0) / NthCopyStart with n = 0: executions and doorbells are counted from 1 (1 = the next)"
    )]
    ZerothExecution,
    /// A doorbell fault of a kind a DMA doorbell cannot have.
    #[error(
        "NthCopyStart fires only dma_abort or out_of_bounds (a DMA doorbell has no {kind} fault)"
    )]
    NotADmaFault {
        /// The kind given.
        kind: &'static str,
    },
    /// A probability above certainty.
    #[error(
        "a probability of {per_million} per million is more than certain (at most {PER_MILLION})"
    )]
    Probability {
        /// The value given.
        per_million: u32,
    },
}

/// Whether `spec` can be armed: what [`FaultTable::arm`] refuses, checked alone (a scenario
/// file's faults are checked so when the file is read, before any simdev runs).
///
/// # Errors
/// [`ArmError`] naming the rule.
pub fn check(spec: &FaultSpec) -> Result<(), ArmError> {
    match spec.when {
        FaultWhen::NthExecution(0) | FaultWhen::NthCopyStart { n: 0, .. } => {
            Err(ArmError::ZerothExecution)
        }
        FaultWhen::NthCopyStart { .. }
            if !matches!(spec.kind, FaultKind::DmaAbort | FaultKind::OutOfBounds) =>
        {
            Err(ArmError::NotADmaFault {
                kind: kind_name(spec.kind),
            })
        }
        FaultWhen::Probability { per_million, .. } if per_million > PER_MILLION => {
            Err(ArmError::Probability { per_million })
        }
        FaultWhen::NthExecution(_)
        | FaultWhen::NthCopyStart { .. }
        | FaultWhen::Probability { .. } => Ok(()),
    }
}

/// One armed fault and its trigger state.
#[derive(Clone, Debug)]
struct Armed {
    spec: FaultSpec,
    /// Matching executions seen since arming (`NthExecution`).
    seen: u64,
    /// The fault's own generator (`Probability`).
    rng: SplitMix64,
}

/// The armed faults of the device, in arming order.
#[derive(Clone, Debug, Default)]
pub struct FaultTable {
    armed: Vec<Armed>,
}

impl FaultTable {
    /// Arms `spec` (its NC was checked by the caller).
    ///
    /// # Errors
    /// [`ArmError`] when `when` cannot fire as asked.
    pub fn arm(&mut self, spec: FaultSpec) -> Result<(), ArmError> {
        check(&spec)?;
        let seed = match spec.when {
            FaultWhen::NthExecution(_) | FaultWhen::NthCopyStart { .. } => 0,
            FaultWhen::Probability { seed, .. } => seed,
        };
        self.armed.push(Armed {
            spec,
            seen: 0,
            rng: SplitMix64::new(seed),
        });
        Ok(())
    }

    /// Disarms every fault; returns how many were armed.
    pub fn clear(&mut self) -> usize {
        std::mem::take(&mut self.armed).len()
    }

    /// Faults armed and not yet fired.
    pub fn len(&self) -> usize {
        self.armed.len()
    }

    /// Whether no fault is armed.
    pub fn is_empty(&self) -> bool {
        self.armed.is_empty()
    }

    /// An execution starts on NC `nc`: counts it for every matching fault and returns the kinds
    /// that fire on it, in arming order (fired `NthExecution` faults are disarmed).
    pub fn on_execution(&mut self, nc: u32) -> Vec<FaultKind> {
        let mut fired = Vec::new();
        self.armed.retain_mut(|armed| {
            if armed.spec.nc.is_some_and(|n| n != nc) {
                return true;
            }
            match armed.spec.when {
                FaultWhen::NthExecution(n) => {
                    armed.seen += 1;
                    if armed.seen == n {
                        fired.push(armed.spec.kind);
                        return false;
                    }
                    true
                }
                FaultWhen::Probability { per_million, .. } => {
                    if armed.rng.chance(per_million) {
                        fired.push(armed.spec.kind);
                    }
                    true
                }
                // Doorbells count these, not executions.
                FaultWhen::NthCopyStart { .. } => true,
            }
        });
        fired
    }

    /// A DMA doorbell (DMA_QUEUE_COPY_START) on queue (`engine`, `queue`) of NC `nc`: counts it
    /// for every matching [`FaultWhen::NthCopyStart`] fault and returns the kinds that fire on
    /// it, in arming order (they are then disarmed).
    pub fn on_copy_start(&mut self, nc: u32, engine: u32, queue: u32) -> Vec<FaultKind> {
        let mut fired = Vec::new();
        self.armed.retain_mut(|armed| {
            if armed.spec.nc.is_some_and(|n| n != nc) {
                return true;
            }
            match armed.spec.when {
                FaultWhen::NthCopyStart {
                    engine: e,
                    queue: q,
                    n,
                } if (e, q) == (engine, queue) => {
                    armed.seen += 1;
                    if armed.seen == n {
                        fired.push(armed.spec.kind);
                        return false;
                    }
                    true
                }
                _ => true,
            }
        });
        fired
    }
}

/// When an execution's notification is posted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// As soon as the execution ends.
    #[default]
    OnTime,
    /// This much wall-clock time after the execution ends, from another thread (the NC goes
    /// on with its next execution meanwhile).
    Late(Duration),
    /// Never (the runtime sees a hang). `compute_idx` still advances.
    Missing,
}

/// What the faults that fired on one execution do to it, combined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The kinds that fired, in arming order.
    pub kinds: Vec<FaultKind>,
    /// [`error_flags`] added to the execution's notification.
    pub flags: u32,
    /// A DMA abort: the NC's exec queue is stopped before the notification is posted.
    pub stop_exec_queue: bool,
    /// When the notification is posted: a missing completion wins over late ones, and the
    /// longest delay over shorter ones.
    pub delivery: Delivery,
    /// Extra simulated nanoseconds (the sum of the ExtraLatency faults).
    pub extra_ns: u64,
    /// The device is lost: nothing else matters.
    pub device_lost: bool,
}

impl Effects {
    /// The combined effect of `kinds` firing on one execution.
    pub fn of(kinds: Vec<FaultKind>) -> Self {
        let mut effects = Self::default();
        for kind in &kinds {
            match *kind {
                FaultKind::NcUncorrectable => effects.flags |= error_flags::NC_UE,
                FaultKind::HbmUncorrectable => effects.flags |= error_flags::HBM_UE,
                FaultKind::HbmRepairable => effects.flags |= error_flags::HBM_UE_REPAIRABLE,
                FaultKind::OutOfBounds => effects.flags |= error_flags::OOB,
                FaultKind::Numerical => effects.flags |= error_flags::NUMERICAL,
                FaultKind::GenericError => effects.flags |= error_flags::GENERIC,
                FaultKind::DmaAbort => {
                    effects.flags |= error_flags::DMA_ABORT;
                    effects.stop_exec_queue = true;
                }
                FaultKind::MissingCompletion => effects.delivery = Delivery::Missing,
                FaultKind::LateCompletion { delay_ms } => {
                    let delay = Duration::from_millis(u64::from(delay_ms));
                    effects.delivery = match effects.delivery {
                        Delivery::Missing => Delivery::Missing,
                        Delivery::Late(other) => Delivery::Late(other.max(delay)),
                        Delivery::OnTime => Delivery::Late(delay),
                    };
                }
                FaultKind::ExtraLatency { ns } => {
                    effects.extra_ns = effects.extra_ns.saturating_add(ns);
                }
                FaultKind::DeviceLost => effects.device_lost = true,
            }
        }
        effects.kinds = kinds;
        effects
    }

    /// How many faults fired.
    pub fn count(&self) -> u64 {
        u64::try_from(self.kinds.len()).unwrap_or(u64::MAX)
    }

    /// Whether no fault fired.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }
}

/// A short name of a fault kind, for logs and traces.
pub const fn kind_name(kind: FaultKind) -> &'static str {
    kind.name()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nth(kind: FaultKind, nc: Option<u32>, n: u64) -> FaultSpec {
        FaultSpec {
            kind,
            nc,
            when: FaultWhen::NthExecution(n),
        }
    }

    fn chance(nc: Option<u32>, per_million: u32, seed: u64) -> FaultSpec {
        FaultSpec {
            kind: FaultKind::GenericError,
            nc,
            when: FaultWhen::Probability { per_million, seed },
        }
    }

    /// The executions (1-based) among `runs` on NC 0 that a fresh table with `spec` hits.
    fn hits(spec: FaultSpec, runs: u64) -> Vec<u64> {
        let mut table = FaultTable::default();
        table.arm(spec).unwrap();
        (1..=runs)
            .filter(|_| !table.on_execution(0).is_empty())
            .collect()
    }

    #[test]
    fn the_nth_execution_after_arming_fires_once_then_disarms() {
        let mut table = FaultTable::default();
        table.on_execution(0);
        table
            .arm(nth(FaultKind::NcUncorrectable, Some(0), 3))
            .unwrap();
        assert_eq!(table.len(), 1);
        assert!(table.on_execution(0).is_empty(), "1st");
        assert!(
            table.on_execution(1).is_empty(),
            "another NC does not count"
        );
        assert!(table.on_execution(0).is_empty(), "2nd");
        assert_eq!(table.on_execution(0), [FaultKind::NcUncorrectable], "3rd");
        assert!(table.is_empty(), "fired once, disarmed");
        assert!(table.on_execution(0).is_empty());
        assert_eq!(hits(nth(FaultKind::DmaAbort, Some(0), 1), 5), [1]);
    }

    #[test]
    fn a_fault_for_every_nc_counts_the_devices_executions() {
        let mut table = FaultTable::default();
        table.arm(nth(FaultKind::Numerical, None, 2)).unwrap();
        assert!(table.on_execution(1).is_empty());
        assert_eq!(table.on_execution(0), [FaultKind::Numerical]);
    }

    #[test]
    fn probabilities_are_deterministic_per_seed_and_stay_armed() {
        let a = hits(chance(Some(0), 250_000, 42), 400);
        assert_eq!(a, hits(chance(Some(0), 250_000, 42), 400), "same seed");
        assert_ne!(a, hits(chance(Some(0), 250_000, 43), 400), "other seed");
        assert!((60..140).contains(&a.len()), "about a quarter: {}", a.len());
        assert_eq!(hits(chance(None, 0, 1), 100), Vec::<u64>::new(), "never");
        assert_eq!(hits(chance(None, PER_MILLION, 1), 5), [1, 2, 3, 4, 5]);
        // Executions on other NCs draw nothing: the hits on NC 0 do not move.
        let mut table = FaultTable::default();
        table.arm(chance(Some(0), 250_000, 42)).unwrap();
        let mut seen = Vec::new();
        for n in 1..=400 {
            table.on_execution(1);
            if !table.on_execution(0).is_empty() {
                seen.push(n);
            }
        }
        assert_eq!(seen, a);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn bad_triggers_are_refused_and_clear_disarms_all() {
        let mut table = FaultTable::default();
        assert_eq!(
            table.arm(nth(FaultKind::DeviceLost, None, 0)),
            Err(ArmError::ZerothExecution)
        );
        assert_eq!(
            table.arm(chance(None, PER_MILLION + 1, 0)),
            Err(ArmError::Probability {
                per_million: PER_MILLION + 1
            })
        );
        table.arm(nth(FaultKind::DeviceLost, None, 1)).unwrap();
        table.arm(chance(None, 1, 0)).unwrap();
        assert_eq!(table.clear(), 2);
        assert!(table.on_execution(0).is_empty());
    }

    #[test]
    fn a_copy_start_fault_counts_only_doorbells_on_its_queue_and_fires_once() {
        let spec = |kind, n| FaultSpec {
            kind,
            nc: Some(1),
            when: FaultWhen::NthCopyStart {
                engine: 15,
                queue: 12,
                n,
            },
        };
        let mut table = FaultTable::default();
        table.arm(spec(FaultKind::DmaAbort, 2)).unwrap();
        assert!(table.on_execution(1).is_empty(), "executions do not count");
        assert!(table.on_copy_start(1, 15, 13).is_empty(), "another queue");
        assert!(table.on_copy_start(0, 15, 12).is_empty(), "another NC");
        assert!(table.on_copy_start(1, 15, 12).is_empty(), "1st");
        assert_eq!(table.on_copy_start(1, 15, 12), [FaultKind::DmaAbort], "2nd");
        assert!(table.is_empty());
        assert!(table.on_copy_start(1, 15, 12).is_empty());
        table.arm(spec(FaultKind::OutOfBounds, 1)).unwrap();
        assert_eq!(table.on_copy_start(1, 15, 12), [FaultKind::OutOfBounds]);
        assert_eq!(
            table.arm(spec(FaultKind::GenericError, 1)),
            Err(ArmError::NotADmaFault {
                kind: "GenericError"
            })
        );
        assert_eq!(
            table.arm(spec(FaultKind::DmaAbort, 0)),
            Err(ArmError::ZerothExecution)
        );
        assert!(table.is_empty());
    }

    #[test]
    fn effects_combine() {
        let flags = [
            (FaultKind::NcUncorrectable, error_flags::NC_UE),
            (FaultKind::HbmUncorrectable, error_flags::HBM_UE),
            (FaultKind::HbmRepairable, error_flags::HBM_UE_REPAIRABLE),
            (FaultKind::OutOfBounds, error_flags::OOB),
            (FaultKind::Numerical, error_flags::NUMERICAL),
            (FaultKind::GenericError, error_flags::GENERIC),
            (FaultKind::DmaAbort, error_flags::DMA_ABORT),
        ];
        for (kind, flag) in flags {
            let e = Effects::of(vec![kind]);
            assert_eq!(e.flags, flag, "{kind:?}");
            assert_eq!(e.stop_exec_queue, kind == FaultKind::DmaAbort);
            assert_eq!(e.delivery, Delivery::OnTime);
            assert!(!e.device_lost);
        }
        let late = |delay_ms| FaultKind::LateCompletion { delay_ms };
        let e = Effects::of(vec![late(5), late(20), late(10)]);
        assert_eq!(e.delivery, Delivery::Late(Duration::from_millis(20)));
        let e = Effects::of(vec![late(5), FaultKind::MissingCompletion, late(9)]);
        assert_eq!(e.delivery, Delivery::Missing);
        let e = Effects::of(vec![
            FaultKind::ExtraLatency { ns: 7 },
            FaultKind::ExtraLatency { ns: u64::MAX },
        ]);
        assert_eq!(e.extra_ns, u64::MAX, "saturates");
        let e = Effects::of(vec![FaultKind::Numerical, FaultKind::DeviceLost]);
        assert!(e.device_lost);
        assert_eq!(e.count(), 2);
        assert!(Effects::of(Vec::new()).is_empty());
        assert_eq!(kind_name(late(1)), "LateCompletion");
    }
}
