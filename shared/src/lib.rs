//! The device ABI that the runtime and simdev agree on, byte-exact.
//!
//! This crate is the contract at the device boundary and nothing else: it holds no runtime
//! policy and no device behaviour. Its parts:
//!
//! - [`status`]: `NRT_STATUS` values and names (`nrt_status.h`).
//! - [`exec_request`]: the 52-byte `device_exec_request` and its `cc_dma_increment` trailer.
//! - [`udma`]: 16-byte UDMA descriptors, the M2M copy builder and a decoder for hostile rings.
//! - [`ids`]: `xu_id` and `seq_id`.
//! - [`ioctl`]: the aws-neuronx-dkms request values and argument structs the `Device` trait uses.
//! - [`address_map`]: simdev's PA space (HBM, host-visible memory, register window).
//! - [`notification`]: the simulator-defined notification queue entry and ring layout.
//! - [`protocol`]: the simdev control protocol (serde + bincode 2 over `SOCK_SEQPACKET`).
//! - [`child`]: child processes that die with their parent (`PR_SET_PDEATHSIG`).
//! - [`fd_passing`]: one message with its fds (`SCM_RIGHTS`) sent and received on that socket.
//! - [`sequencer`]: the exec-queue batch contract between the runtime and simdev's sequencer.
//! - [`isa`]: the simulator ISA (64-byte instructions of the five engines' programs).
//! - [`model`]: the model container v2 (header, metadata, per-TPB programs and ring templates).
//! - [`neff_program`]: how a request names a NEFF program, its header and DGE table, and the
//!   shape-only output function (simulator-defined).
//! - [`datastore`]: the runtime datastore's shared-memory file layout (per-core, per-TPB and
//!   per-model counters other processes map read-only).
//! - [`nocancel`]: the hot path's system calls (eventfds, the worker's wait, a doorbell's
//!   send) without glibc's cancellation bookkeeping.
//! - [`memory`]: bounds-checked, PA-addressed access to shared mappings (all shared-memory
//!   `unsafe` lives there).
//!
//! Every `#[repr(C)]` type has a compile-time size assert, per-field offset tests and a
//! golden-bytes test. Sources are `../shared/reference/driver-abi.md` (driver 2.24.7.0),
//! `../shared/reference/nrt-api.md` and the two seeds.

pub mod address_map;
pub mod child;
pub mod datastore;
pub mod device_trace;
pub mod exec_request;
pub mod fd_passing;
pub mod ids;
pub mod ioctl;
pub mod isa;
pub mod memory;
pub mod model;
pub mod neff_program;
pub mod nocancel;
pub mod notification;
pub mod protocol;
pub mod sequencer;
pub mod status;
pub mod udma;

pub use address_map::{AddressMap, Arch, Register};
pub use exec_request::{DeviceExecRequest, Engine};
pub use ids::{SeqId, XuId, XuType};
pub use memory::{MemError, SharedChunk};
pub use notification::NotificationEntry;
pub use status::NrtStatus;
pub use udma::{RingId, UdmaDesc};
