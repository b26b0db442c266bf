//! One tensor operation as the TENSOR_OP XU's work item carries it ([`TensorOpRequest`]).

use std::time::Instant;

use crate::tensor::{Tensor, UseHold};

use super::read_dest::ReadBuffer;
use super::staging::StagingLease;

/// What a tensor operation is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TensorOpKind {
    /// Host to device (`nrta_tensor_write`): staging to the tensor.
    Write,
    /// Device to host (`nrta_tensor_read`): the tensor to staging, then to the caller's buffer.
    Read,
    /// Device to device (`nrta_tensor_copy`).
    Copy,
    /// The STOP item scheduled at shutdown (moves nothing).
    #[default]
    Stop,
}

/// The engine's per-request state (the XU work item's `request`): where the bytes go, what the
/// request holds until it completes, and how far the DMA got.
///
/// # Invariants
/// `done <= len`; `in_flight` names the one segment posted and not yet seen complete, whose
/// bytes start at `done`.
#[derive(Debug, Default)]
pub struct TensorOpRequest {
    /// Read, write or copy.
    pub kind: TensorOpKind,
    /// The tensor-op queue (0 or 1) of the logical core.
    pub queue: u8,
    /// Device PA of the first source byte (staging for a write).
    pub src_pa: u64,
    /// Device PA of the first destination byte (staging for a read).
    pub dst_pa: u64,
    /// Bytes to move.
    pub len: u64,
    /// Bytes moved so far (segments seen complete).
    pub done: u64,
    /// The segment in flight: (its completion token, its bytes).
    pub in_flight: Option<(u64, u64)>,
    /// When its transfer started (its first step).
    pub started: Option<Instant>,
    /// When the request times out (set at its first step).
    pub deadline: Option<Instant>,
    /// The staging chunk (writes and reads), back to the pool when the item is freed.
    pub(crate) staging: Option<StagingLease>,
    /// A read's destination.
    pub(crate) read_dest: Option<ReadBuffer>,
    /// The tensors the request uses: their storage lives at least as long as the request.
    pub(crate) tensors: Vec<Tensor>,
    /// Their mark: an explicit free is refused while the request is scheduled.
    pub(crate) hold: Option<UseHold>,
}
