//! The Neuron runtime's execution engine, built once against the [`backend::Device`] trait.
//!
//! The same runtime code drives real Trainium/Inferentia silicon through `/dev/neuronN` and
//! simdev, an out-of-process emulated device. What lives here:
//!
//! - [`backend`]: the `Device` trait (the control plane, at the level of the kernel driver), its
//!   `sim` and `neuron` implementations and the selection logic (`NEURON_RT_BACKEND`).
//! - [`dma`]: UDMA descriptor rings and DMA queues as the runtime writes them.
//! - [`xu`]: the per-vNC work queue, worker threads and completion hand-off (seed 004).
//! - [`metrics`]: per-NC execution counters (`kmetric_update_nds_*`).
//! - [`api`]: `Runtime` (init, load, tensors, execute, close) and the process-global [`nrt`]
//!   facade with libnrt's lifecycle gates.
//! - [`kmgr`] (model database, load/unload), [`bind`] (I/O validation, I/O descriptors built),
//!   [`stage`] (`device_exec_request`, trigger pairs), [`doorbell`] (INFERENCE_START),
//!   [`completion`] (notification-queue harvest): the submit path of seed 000.
//! - [`sys_trace`]: the system trace (bounded per-core event rings) and per-model profiles.
//! - [`tensor_op`]: the TENSOR_OP XUs' engine: tensor writes, reads and copies moved by the
//!   device's DMA on queues reserved for them (async 3.x `nrta_tensor_*`).
//! - [`reserve`]: which cores `nrt_init` reserves, claiming and resetting them.
//! - [`tensor`], [`config`], [`error`], [`builder`] (model containers for simdev).

pub mod api;
pub mod async_pool;
pub mod backend;
pub mod bind;
pub mod builder;
pub mod completion;
pub mod config;
pub mod datastore;
pub mod dma;
pub mod doorbell;
pub mod error;
pub mod kmgr;
pub mod metrics;
pub mod output_completion;
pub mod process;
pub mod reserve;
pub mod stage;
pub mod sys_trace;
pub mod tensor;
pub mod tensor_op;
#[cfg(test)]
mod test_support;
pub mod trace;
pub mod xu;

/// The libnrt release whose API this runtime and its C library implement: the 2.34.10 headers
/// (the batch calls without `unsafe`, pinned host buffers, async 3.x with eventfd
/// registration). `nrt_get_version` reports it, so that a framework gating a feature on
/// `rt_major`/`rt_minor` finds it; its `rt_detail` says which library this is.
pub const RUNTIME_API_VERSION: [u64; 4] = [2, 34, 10, 0];

/// The runtime version this runtime reports to other processes (neuron-ls's
/// `neuron_runtime_version`): [`RUNTIME_API_VERSION`], as `nrt_get_version` reports it.
pub const RUNTIME_VERSION: &str = "2.34.10.0";

#[cfg(test)]
#[test]
fn the_version_string_is_the_api_version() {
    let parts: Vec<String> = RUNTIME_API_VERSION.iter().map(u64::to_string).collect();
    assert_eq!(RUNTIME_VERSION, parts.join("."));
}

/// The hash map of the execute path's lookups (tensor names, model handles, queue ids):
/// `foldhash`'s fast hasher with a per-map random seed, not std's SipHash, which costs about
/// as many instructions per lookup as the rest of the lookup.
pub(crate) type FastHashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use api::{
    ModelHandle, Runtime, ScheduledExecution, ScheduledRequest, ScheduledTensorOp,
    StagedTensorWrite, nrt,
};
pub use backend::{Device, DeviceError, open};
pub use error::{NrtError, NrtResult};
pub use tensor::{Placement, Tensor, TensorSet};
pub use tensor_op::ReadBuffer;
