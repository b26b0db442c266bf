//! How an execution's final [`NrtStatus`] is counted in neuron-monitor's `execution_stats`:
//! one outcome class of `execution_summary` and at most one error class of `error_summary`.
//!
//! The whole mapping is the one table in [`classify`]; every status libnrt defines is in it (the
//! match is exhaustive), and a code outside [`NrtStatus::ALL`] counts as
//! [`ExecClass::CompletedWithErr`] / [`ErrorClass::Generic`] ([`OTHER`]).

use serde::Serialize;
use shared::NrtStatus;

use runtime::datastore::snapshot::StatusCounts;

/// An outcome class of neuron-monitor's `execution_summary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecClass {
    /// `completed`: the execution succeeded.
    Completed,
    /// `completed_with_err`: it ran and ended with an error other than a numerical one.
    CompletedWithErr,
    /// `completed_with_num_err`: it ran and produced NaN/Inf (results written).
    CompletedWithNumErr,
    /// `timed_out`: it took longer than the runtime's timeout.
    TimedOut,
    /// `incorrect_input`: it did not start because its input was wrong.
    IncorrectInput,
    /// `failed_to_queue`: the runtime could not queue it (nothing ran).
    FailedToQueue,
}

/// An error class of neuron-monitor's `error_summary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// `generic`: a failure with no more specific class.
    Generic,
    /// `numerical`: NaN/Inf in the results.
    Numerical,
    /// `transient`: retrying may succeed (queue full, NC busy, timeout, collective pending).
    Transient,
    /// `model`: the model or its inputs are at fault (bad input, out-of-bounds access, NEFF).
    Model,
    /// `runtime`: the runtime's own state or resources (allocation, closed, unrecoverable XU).
    Runtime,
    /// `hardware`: the device reported a hardware error (HBM/SRAM UE, DMA abort, ...).
    Hardware,
}

/// The class of an execution that ended with a code outside [`NrtStatus::ALL`].
pub const OTHER: (ExecClass, Option<ErrorClass>) =
    (ExecClass::CompletedWithErr, Some(ErrorClass::Generic));

/// The table: `status` → (`execution_summary` class, `error_summary` class or none).
///
/// | status (code)                                   | execution_summary        | error_summary |
/// |-------------------------------------------------|--------------------------|---------------|
/// | SUCCESS (0)                                     | completed                | —             |
/// | FAILURE (1)                                     | completed_with_err       | generic       |
/// | EXEC_COMPLETED_WITH_ERR (1004)                  | completed_with_err       | generic       |
/// | EXEC_COMPLETED_WITH_NUM_ERR (1003)              | completed_with_num_err   | numerical     |
/// | EXEC_OOB (1006)                                 | completed_with_err       | model         |
/// | UNSUPPORTED_NEFF_VERSION (10), LOAD_NOT_ENOUGH_NC (9) | completed_with_err | model         |
/// | INVALID (2), EXEC_BAD_INPUT (1002)              | incorrect_input          | model         |
/// | INVALID_HANDLE (3)                              | incorrect_input          | runtime       |
/// | TIMEOUT (5)                                     | timed_out                | transient     |
/// | QUEUE_FULL (7), EXEC_NC_BUSY (1005)             | failed_to_queue          | transient     |
/// | COLL_PENDING (1100)                             | completed_with_err       | transient     |
/// | RESOURCE (4), FAIL_HOST_MEM_ALLOC (11)          | failed_to_queue          | runtime       |
/// | UNINITIALIZED (13), CLOSED (14), QUEUE_EMPTY (15) | failed_to_queue        | runtime       |
/// | EXEC_UNIT_UNRECOVERABLE (101)                   | completed_with_err       | runtime       |
/// | EXEC_SW_NQ_OVERFLOW (1204)                      | completed_with_err       | runtime       |
/// | HW_ERROR (6), EXEC_HW_ERR_* (1200..=1203, 1205) | completed_with_err       | hardware      |
/// | NETWORK_PROXY_FAILURE (1206)                    | completed_with_err       | hardware      |
///
/// EXEC_NC_BUSY is a 10xx code but nothing ran (the NC was taken), so it is a queueing failure,
/// not a completion with error.
pub const fn classify(status: NrtStatus) -> (ExecClass, Option<ErrorClass>) {
    use ErrorClass as E;
    use ExecClass as X;
    use NrtStatus as S;
    match status {
        S::Success => (X::Completed, None),
        S::Failure | S::ExecCompletedWithErr => (X::CompletedWithErr, Some(E::Generic)),
        S::ExecCompletedWithNumErr => (X::CompletedWithNumErr, Some(E::Numerical)),
        S::ExecOob | S::UnsupportedNeffVersion | S::LoadNotEnoughNc => {
            (X::CompletedWithErr, Some(E::Model))
        }
        S::Invalid | S::ExecBadInput => (X::IncorrectInput, Some(E::Model)),
        S::InvalidHandle => (X::IncorrectInput, Some(E::Runtime)),
        S::Timeout => (X::TimedOut, Some(E::Transient)),
        S::QueueFull | S::ExecNcBusy => (X::FailedToQueue, Some(E::Transient)),
        S::CollPending => (X::CompletedWithErr, Some(E::Transient)),
        S::Resource | S::FailHostMemAlloc | S::Uninitialized | S::Closed | S::QueueEmpty => {
            (X::FailedToQueue, Some(E::Runtime))
        }
        S::ExecUnitUnrecoverable | S::ExecSwNqOverflow => (X::CompletedWithErr, Some(E::Runtime)),
        S::HwError
        | S::ExecHwErrCollectives
        | S::ExecHwErrHbmUe
        | S::ExecHwErrNcUe
        | S::ExecHwErrDmaAbort
        | S::ExecHwErrRepairableHbmUe
        | S::NetworkProxyFailure => (X::CompletedWithErr, Some(E::Hardware)),
    }
}

/// neuron-monitor's `execution_summary`: executions by outcome class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExecutionSummary {
    /// Succeeded.
    pub completed: u64,
    /// Ran and ended with a non-numerical error.
    pub completed_with_err: u64,
    /// Ran and ended with a numerical error.
    pub completed_with_num_err: u64,
    /// Timed out.
    pub timed_out: u64,
    /// Refused for bad input.
    pub incorrect_input: u64,
    /// Could not be queued.
    pub failed_to_queue: u64,
}

/// neuron-monitor's `error_summary`: failed executions by error class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ErrorSummary {
    /// No more specific class.
    pub generic: u64,
    /// NaN/Inf.
    pub numerical: u64,
    /// Retrying may succeed.
    pub transient: u64,
    /// The model or its inputs.
    pub model: u64,
    /// The runtime.
    pub runtime: u64,
    /// The hardware.
    pub hardware: u64,
}

impl ExecutionSummary {
    /// `(name, count)` per class, in neuron-monitor's order (for the Prometheus labels).
    pub fn iter(&self) -> [(&'static str, u64); 6] {
        [
            ("completed", self.completed),
            ("completed_with_err", self.completed_with_err),
            ("completed_with_num_err", self.completed_with_num_err),
            ("timed_out", self.timed_out),
            ("incorrect_input", self.incorrect_input),
            ("failed_to_queue", self.failed_to_queue),
        ]
    }

    fn add(&mut self, class: ExecClass, n: u64) {
        let slot = match class {
            ExecClass::Completed => &mut self.completed,
            ExecClass::CompletedWithErr => &mut self.completed_with_err,
            ExecClass::CompletedWithNumErr => &mut self.completed_with_num_err,
            ExecClass::TimedOut => &mut self.timed_out,
            ExecClass::IncorrectInput => &mut self.incorrect_input,
            ExecClass::FailedToQueue => &mut self.failed_to_queue,
        };
        *slot = slot.saturating_add(n);
    }
}

impl ErrorSummary {
    /// `(name, count)` per class, in neuron-monitor's order.
    pub fn iter(&self) -> [(&'static str, u64); 6] {
        [
            ("generic", self.generic),
            ("numerical", self.numerical),
            ("transient", self.transient),
            ("model", self.model),
            ("runtime", self.runtime),
            ("hardware", self.hardware),
        ]
    }

    /// All errors counted.
    pub fn total(&self) -> u64 {
        self.iter().iter().map(|(_, n)| n).sum()
    }

    fn add(&mut self, class: ErrorClass, n: u64) {
        let slot = match class {
            ErrorClass::Generic => &mut self.generic,
            ErrorClass::Numerical => &mut self.numerical,
            ErrorClass::Transient => &mut self.transient,
            ErrorClass::Model => &mut self.model,
            ErrorClass::Runtime => &mut self.runtime,
            ErrorClass::Hardware => &mut self.hardware,
        };
        *slot = slot.saturating_add(n);
    }
}

/// Both summaries of `counts` (executions by final status).
pub fn summarize(counts: &StatusCounts) -> (ExecutionSummary, ErrorSummary) {
    let mut exec = ExecutionSummary::default();
    let mut errors = ErrorSummary::default();
    let all = counts
        .by_status
        .iter()
        .map(|&(s, n)| (classify(s), n))
        .chain(std::iter::once((OTHER, counts.other)));
    for ((x, e), n) in all {
        exec.add(x, n);
        if let Some(e) = e {
            errors.add(e, n);
        }
    }
    (exec, errors)
}

/// The executions counted in `now` and not in `then` (two readings of the same counters),
/// status by status.
pub fn delta_counts(now: &StatusCounts, then: &StatusCounts) -> StatusCounts {
    StatusCounts {
        by_status: now
            .by_status
            .iter()
            .map(|&(s, n)| (s, n.saturating_sub(then.get(s))))
            .filter(|&(_, n)| n > 0)
            .collect(),
        other: now.other.saturating_sub(then.other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(status: NrtStatus, n: u64) -> (ExecutionSummary, ErrorSummary) {
        summarize(&StatusCounts {
            by_status: vec![(status, n)],
            other: 0,
        })
    }

    #[test]
    fn success_is_completed_and_no_error() {
        let (x, e) = one(NrtStatus::Success, 7);
        assert_eq!(
            x,
            ExecutionSummary {
                completed: 7,
                ..Default::default()
            }
        );
        assert_eq!(e, ErrorSummary::default());
    }

    #[test]
    fn completed_with_err_is_1004_and_the_other_non_numerical_completions() {
        for (s, class) in [
            (NrtStatus::ExecCompletedWithErr, "generic"),
            (NrtStatus::Failure, "generic"),
            (NrtStatus::ExecOob, "model"),
            (NrtStatus::ExecHwErrHbmUe, "hardware"),
            (NrtStatus::ExecHwErrDmaAbort, "hardware"),
            (NrtStatus::ExecSwNqOverflow, "runtime"),
        ] {
            let (x, e) = one(s, 3);
            assert_eq!(
                x,
                ExecutionSummary {
                    completed_with_err: 3,
                    ..Default::default()
                },
                "{s:?}"
            );
            assert_eq!(
                e.iter().iter().find(|(n, _)| *n == class).map(|p| p.1),
                Some(3),
                "{s:?}"
            );
            assert_eq!(e.total(), 3, "{s:?}");
        }
    }

    #[test]
    fn numerical_error_is_completed_with_num_err_and_numerical() {
        let (x, e) = one(NrtStatus::ExecCompletedWithNumErr, 2);
        assert_eq!(
            x,
            ExecutionSummary {
                completed_with_num_err: 2,
                ..Default::default()
            }
        );
        assert_eq!(
            e,
            ErrorSummary {
                numerical: 2,
                ..Default::default()
            }
        );
    }

    #[test]
    fn timeout_is_timed_out_and_transient() {
        let (x, e) = one(NrtStatus::Timeout, 1);
        assert_eq!(
            x,
            ExecutionSummary {
                timed_out: 1,
                ..Default::default()
            }
        );
        assert_eq!(
            e,
            ErrorSummary {
                transient: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn invalid_and_bad_input_are_incorrect_input_and_model() {
        for s in [NrtStatus::Invalid, NrtStatus::ExecBadInput] {
            let (x, e) = one(s, 4);
            assert_eq!(
                x,
                ExecutionSummary {
                    incorrect_input: 4,
                    ..Default::default()
                },
                "{s:?}"
            );
            assert_eq!(
                e,
                ErrorSummary {
                    model: 4,
                    ..Default::default()
                },
                "{s:?}"
            );
        }
    }

    #[test]
    fn queue_full_and_nc_busy_failed_to_queue_and_are_transient() {
        for s in [NrtStatus::QueueFull, NrtStatus::ExecNcBusy] {
            let (x, e) = one(s, 5);
            assert_eq!(
                x,
                ExecutionSummary {
                    failed_to_queue: 5,
                    ..Default::default()
                },
                "{s:?}"
            );
            assert_eq!(
                e,
                ErrorSummary {
                    transient: 5,
                    ..Default::default()
                },
                "{s:?}"
            );
        }
        let (x, e) = one(NrtStatus::Resource, 1);
        assert_eq!((x.failed_to_queue, e.runtime), (1, 1));
    }

    #[test]
    fn every_status_is_counted_once_and_every_failure_has_an_error_class() {
        let counts = StatusCounts {
            by_status: NrtStatus::ALL.iter().map(|&s| (s, 1)).collect(),
            other: 2,
        };
        let (x, e) = summarize(&counts);
        let outcomes: u64 = x.iter().iter().map(|p| p.1).sum();
        assert_eq!(outcomes, counts.total());
        assert_eq!(x.completed, 1, "only NRT_SUCCESS completes cleanly");
        assert_eq!(
            e.total(),
            counts.total() - 1,
            "every failure has exactly one error class"
        );
        // FAILURE and EXEC_COMPLETED_WITH_ERR, plus the 2 codes outside ALL.
        assert_eq!(e.generic, 4, "codes outside ALL are generic");
    }

    #[test]
    fn delta_counts_diffs_status_by_status() {
        let then = StatusCounts {
            by_status: vec![(NrtStatus::Success, 10), (NrtStatus::Timeout, 1)],
            other: 1,
        };
        let now = StatusCounts {
            by_status: vec![
                (NrtStatus::Success, 15),
                (NrtStatus::Timeout, 1),
                (NrtStatus::ExecOob, 2),
            ],
            other: 3,
        };
        let d = delta_counts(&now, &then);
        assert_eq!(d.get(NrtStatus::Success), 5);
        assert_eq!(d.get(NrtStatus::Timeout), 0);
        assert_eq!(d.get(NrtStatus::ExecOob), 2);
        assert_eq!(d.other, 2);
        assert_eq!(d.total(), 9);
    }
}
