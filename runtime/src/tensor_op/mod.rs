//! Tensor operations as scheduled work: the TENSOR_OP execution units' completion engine
//! (async 3.x `nrta_tensor_write`, `nrta_tensor_read`, `nrta_tensor_copy`; issue 12 item 2).
//!
//! Each logical core has two TENSOR_OP XUs (queues 0 and 1), seed-004 rings like the compute
//! XU's, driven by [`TensorOpEngine`]. The data moves by the device's DMA, as on silicon:
//!
//! - **A DMA queue per (logical core, tensor-op queue)** ([`channel`]), on the logical core's
//!   first physical NC: engine [`TENSOR_OP_DMA_ENGINE`] (15), queues [`TENSOR_OP_DMA_QUEUES`]
//!   (12 for tensor-op queue 0, 13 for queue 1). The runtime uses (0, 0) for the exec queue and
//!   the models' own (engine, queue) pairs for I/O rings, which may not name these two (load
//!   refuses it, [`crate::stage::HwExecQueue::ensure_io_queue`]); queues 14 and 15 stay free for
//!   what the driver reserves them for (NX cores, collectives).
//! - **DMA-able host staging** ([`staging`]): host bytes never go to the device directly. A
//!   write copies the caller's bytes into a staging chunk (host memory the device can reach,
//!   `mem_alloc(Host)` + `mem_map`) when it is scheduled, so the caller's buffer is free as
//!   soon as the call returns; a read lands in staging and the worker copies it into the
//!   caller's [`ReadBuffer`] at completion. A copy moves device to device with no staging.
//! - **A request is an M2M descriptor chain** (≤ 64 KiB per pair, [`crate::dma::DmaQueue`])
//!   ending with a *completion pair*: an 8-byte copy of a fresh token from the channel's record
//!   word to its completion word, both in host memory, so the DMA itself writes "done" after the
//!   data (the driver's own completion model, `reference/driver-abi.md` §2.7). The step
//!   acquires the completion word; nothing else says a request is done. A request larger than
//!   the ring holds is posted in segments, the next one after the previous one's token arrived.
//! - **One request at a time per queue, in submit order** (the XU ring's order); the two
//!   queues have their own ring, channel, staging and worker, so they are independent.
//! - **Faults arrive as on silicon**: a DMA abort stops the queue and the device posts a
//!   `DmaQueueError` notification naming it in the NC's notification queue. Whichever reader
//!   drains it routes it to the queue's record ([`crate::completion::DmaQueueErrors`]); a step
//!   whose token has not arrived drains the NQ itself (never taking Execution entries from the
//!   compute harvest) and completes the request with 1203, or 1006 when the abort was an
//!   out-of-bounds access, as [`crate::xu::Progress::Error`]: that XU is degraded (101), the
//!   compute XU and the other queue keep working. A request whose token does not arrive within
//!   `NEURON_RT_EXEC_TIMEOUT` is NRT_TIMEOUT, also fatal to its XU.
//!
//! On simdev the DMA runs inside `dma_queue_copy_start`, so the token is usually there at the
//! first look; the step is nonetheless written for asynchronous completion (poll, then
//! return "in flight" after a short sleep). Because simdev answers that doorbell, the step
//! rings it with the request's deadline ([`crate::backend::Device::dma_queue_copy_start_by`]):
//! a stopped simdev ends the request NRT_TIMEOUT at `NEURON_RT_EXEC_TIMEOUT` and leaves the
//! worker free to step the vNC's other XUs, instead of holding it for the control timeout.

pub mod channel;
pub mod engine;
pub mod read_dest;
pub mod request;
pub mod staging;

#[cfg(test)]
mod in_process_tests;

pub use engine::{TensorOpConfig, TensorOpEngine};
pub use read_dest::ReadBuffer;
pub use request::TensorOpRequest;

/// The DMA engine (of the logical core's first NC) that moves tensor operations.
pub const TENSOR_OP_DMA_ENGINE: u32 = 15;

/// The DMA queue of [`TENSOR_OP_DMA_ENGINE`] for tensor-op queue 0 and 1.
pub const TENSOR_OP_DMA_QUEUES: [u32; 2] = [12, 13];

/// TENSOR_OP XUs (queues) per logical core.
pub const TENSOR_OP_QUEUES: u8 = 2;

/// Descriptors in each tensor-op ring: 255 pairs of 64 KiB (about 16 MiB) per segment plus the
/// completion pair.
pub const TENSOR_OP_RING_DESCS: u32 = 256;
