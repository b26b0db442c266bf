//! The Neuron runtime's execution engine, built once against the [`backend::Device`] trait.
//!
//! The same runtime code drives real Trainium/Inferentia silicon through `/dev/neuronN` and
//! simdev, an out-of-process emulated device. What lives here:
//!
//! - [`backend`]: the `Device` trait (the control plane, at the level of the kernel driver), its
//!   `sim` and `neuron` implementations and the selection logic (`NEURON_RT_BACKEND`).

pub mod backend;

pub use backend::{open, Device, DeviceError};
