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

pub mod backend;
pub mod dma;
pub mod metrics;
pub mod xu;

pub use backend::{Device, DeviceError, open};
