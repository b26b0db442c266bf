//! `NRT_STATUS`: the status codes every libnrt call returns (`nrt_status.h`).
//!
//! Source: `reference/nrt-api.md` §1. The values are ABI: they are never renumbered, only
//! appended. Gaps (8, 12, 16–100, …) are unused by libnrt and are rejected by
//! [`NrtStatus::from_u32`].

use serde::{Deserialize, Serialize};

/// One `NRT_STATUS` value, `#[repr(u32)]` as bindgen maps the C enum (4 bytes, little-endian on
/// the wire).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NrtStatus {
    /// 0: the call succeeded.
    Success = 0,
    /// 1: generic failure (a more specific code is used when one exists).
    Failure = 1,
    /// 2: invalid input (bad model, bad descriptor, tensor name/size mismatch, NULL argument).
    Invalid = 2,
    /// 3: invalid handle (legacy).
    InvalidHandle = 3,
    /// 4: a resource (device memory, queues, buffer space) could not be allocated.
    Resource = 4,
    /// 5: the operation timed out (generic execution hang).
    Timeout = 5,
    /// 6: hardware failure.
    HwError = 6,
    /// 7: the execution input queue is full; nothing changed, retry later.
    QueueFull = 7,
    /// 9: not enough NeuronCores to load the model.
    LoadNotEnoughNc = 9,
    /// 10: model (NEFF) version not supported.
    UnsupportedNeffVersion = 10,
    /// 11: host memory allocation failed (kept for backward compatibility).
    FailHostMemAlloc = 11,
    /// 13: API called before `nrt_init`.
    Uninitialized = 13,
    /// 14: API called after `nrt_close`.
    Closed = 14,
    /// 15: accessed a queue with no data.
    QueueEmpty = 15,
    /// 101: the execution unit hit a fatal error and is permanently unusable.
    ExecUnitUnrecoverable = 101,
    /// 1002: invalid input submitted to execute.
    ExecBadInput = 1002,
    /// 1003: the execution finished with numerical errors (NaN/Inf).
    ExecCompletedWithNumErr = 1003,
    /// 1004: the execution finished with other errors.
    ExecCompletedWithErr = 1004,
    /// 1005: the NeuronCore is locked by another model, process or thread.
    ExecNcBusy = 1005,
    /// 1006: an out-of-bounds memory access during execution.
    ExecOob = 1006,
    /// 1100: a collective operation is still pending.
    CollPending = 1100,
    /// 1200: stuck in a collective (missing notifications).
    ExecHwErrCollectives = 1200,
    /// 1201: unrepairable uncorrectable HBM error.
    ExecHwErrHbmUe = 1201,
    /// 1202: NeuronCore on-chip memory parity error.
    ExecHwErrNcUe = 1202,
    /// 1203: DMA engine unrecoverable error.
    ExecHwErrDmaAbort = 1203,
    /// 1204: software notification-queue overflow.
    ExecSwNqOverflow = 1204,
    /// 1205: repairable uncorrectable HBM error.
    ExecHwErrRepairableHbmUe = 1205,
    /// 1206: EFA network proxy operation failed.
    NetworkProxyFailure = 1206,
}

impl NrtStatus {
    /// Every public value, in numeric order.
    pub const ALL: [NrtStatus; 28] = [
        Self::Success,
        Self::Failure,
        Self::Invalid,
        Self::InvalidHandle,
        Self::Resource,
        Self::Timeout,
        Self::HwError,
        Self::QueueFull,
        Self::LoadNotEnoughNc,
        Self::UnsupportedNeffVersion,
        Self::FailHostMemAlloc,
        Self::Uninitialized,
        Self::Closed,
        Self::QueueEmpty,
        Self::ExecUnitUnrecoverable,
        Self::ExecBadInput,
        Self::ExecCompletedWithNumErr,
        Self::ExecCompletedWithErr,
        Self::ExecNcBusy,
        Self::ExecOob,
        Self::CollPending,
        Self::ExecHwErrCollectives,
        Self::ExecHwErrHbmUe,
        Self::ExecHwErrNcUe,
        Self::ExecHwErrDmaAbort,
        Self::ExecSwNqOverflow,
        Self::ExecHwErrRepairableHbmUe,
        Self::NetworkProxyFailure,
    ];

    /// The numeric value, as the C API returns it.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// Decodes a numeric value; `None` for a value libnrt does not define.
    pub fn from_u32(value: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|s| s.as_u32() == value)
    }

    /// The name string, as `nrt_get_status_as_str` returns it (e.g. `"NRT_EXEC_OOB"`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Success => "NRT_SUCCESS",
            Self::Failure => "NRT_FAILURE",
            Self::Invalid => "NRT_INVALID",
            Self::InvalidHandle => "NRT_INVALID_HANDLE",
            Self::Resource => "NRT_RESOURCE",
            Self::Timeout => "NRT_TIMEOUT",
            Self::HwError => "NRT_HW_ERROR",
            Self::QueueFull => "NRT_QUEUE_FULL",
            Self::LoadNotEnoughNc => "NRT_LOAD_NOT_ENOUGH_NC",
            Self::UnsupportedNeffVersion => "NRT_UNSUPPORTED_NEFF_VERSION",
            Self::FailHostMemAlloc => "NRT_FAIL_HOST_MEM_ALLOC",
            Self::Uninitialized => "NRT_UNINITIALIZED",
            Self::Closed => "NRT_CLOSED",
            Self::QueueEmpty => "NRT_QUEUE_EMPTY",
            Self::ExecUnitUnrecoverable => "NRT_EXEC_UNIT_UNRECOVERABLE",
            Self::ExecBadInput => "NRT_EXEC_BAD_INPUT",
            Self::ExecCompletedWithNumErr => "NRT_EXEC_COMPLETED_WITH_NUM_ERR",
            Self::ExecCompletedWithErr => "NRT_EXEC_COMPLETED_WITH_ERR",
            Self::ExecNcBusy => "NRT_EXEC_NC_BUSY",
            Self::ExecOob => "NRT_EXEC_OOB",
            Self::CollPending => "NRT_COLL_PENDING",
            Self::ExecHwErrCollectives => "NRT_EXEC_HW_ERR_COLLECTIVES",
            Self::ExecHwErrHbmUe => "NRT_EXEC_HW_ERR_HBM_UE",
            Self::ExecHwErrNcUe => "NRT_EXEC_HW_ERR_NC_UE",
            Self::ExecHwErrDmaAbort => "NRT_EXEC_HW_ERR_DMA_ABORT",
            Self::ExecSwNqOverflow => "NRT_EXEC_SW_NQ_OVERFLOW",
            Self::ExecHwErrRepairableHbmUe => "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE",
            Self::NetworkProxyFailure => "NRT_NETWORK_PROXY_FAILURE",
        }
    }

    /// The 4 little-endian bytes of the value, as they cross an ABI boundary.
    pub const fn to_le_bytes(self) -> [u8; 4] {
        self.as_u32().to_le_bytes()
    }
}

impl std::fmt::Display for NrtStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.as_u32())
    }
}

const _: () = assert!(std::mem::size_of::<NrtStatus>() == 4);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_matches_nrt_status_h() {
        let expected: [(u32, &str); 28] = [
            (0, "NRT_SUCCESS"),
            (1, "NRT_FAILURE"),
            (2, "NRT_INVALID"),
            (3, "NRT_INVALID_HANDLE"),
            (4, "NRT_RESOURCE"),
            (5, "NRT_TIMEOUT"),
            (6, "NRT_HW_ERROR"),
            (7, "NRT_QUEUE_FULL"),
            (9, "NRT_LOAD_NOT_ENOUGH_NC"),
            (10, "NRT_UNSUPPORTED_NEFF_VERSION"),
            (11, "NRT_FAIL_HOST_MEM_ALLOC"),
            (13, "NRT_UNINITIALIZED"),
            (14, "NRT_CLOSED"),
            (15, "NRT_QUEUE_EMPTY"),
            (101, "NRT_EXEC_UNIT_UNRECOVERABLE"),
            (1002, "NRT_EXEC_BAD_INPUT"),
            (1003, "NRT_EXEC_COMPLETED_WITH_NUM_ERR"),
            (1004, "NRT_EXEC_COMPLETED_WITH_ERR"),
            (1005, "NRT_EXEC_NC_BUSY"),
            (1006, "NRT_EXEC_OOB"),
            (1100, "NRT_COLL_PENDING"),
            (1200, "NRT_EXEC_HW_ERR_COLLECTIVES"),
            (1201, "NRT_EXEC_HW_ERR_HBM_UE"),
            (1202, "NRT_EXEC_HW_ERR_NC_UE"),
            (1203, "NRT_EXEC_HW_ERR_DMA_ABORT"),
            (1204, "NRT_EXEC_SW_NQ_OVERFLOW"),
            (1205, "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE"),
            (1206, "NRT_NETWORK_PROXY_FAILURE"),
        ];
        for (status, (value, name)) in NrtStatus::ALL.iter().zip(expected) {
            assert_eq!(status.as_u32(), value);
            assert_eq!(status.name(), name);
            assert_eq!(NrtStatus::from_u32(value), Some(*status));
        }
    }

    #[test]
    fn gaps_are_not_statuses() {
        for gap in [8, 12, 16, 100, 1000, 1001, 1007, 1207, u32::MAX] {
            assert_eq!(NrtStatus::from_u32(gap), None, "{gap}");
        }
    }

    #[test]
    fn golden_bytes() {
        assert_eq!(
            NrtStatus::ExecHwErrDmaAbort.to_le_bytes(),
            [0xB3, 0x04, 0, 0]
        );
        assert_eq!(
            NrtStatus::ExecUnitUnrecoverable.to_le_bytes(),
            [101, 0, 0, 0]
        );
        assert_eq!(
            NrtStatus::Timeout.to_string(),
            "NRT_TIMEOUT (5)",
            "Display names the status and its value"
        );
    }
}
