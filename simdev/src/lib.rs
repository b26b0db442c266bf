//! simdev: an emulated AWS Neuron device in its own process (DESIGN §5).
//!
//! simdev plays the role of the kernel driver plus the device for a runtime that has no
//! Trainium or Inferentia at hand. Clients connect over a Unix `SOCK_SEQPACKET` socket and
//! speak [`shared::protocol`]; every request mirrors a driver ioctl. Device memory is shared,
//! chunk by chunk, through memfds; DMA descriptor rings, notification queues and the semaphore
//! window are shared memory that simdev reads and writes through [`shared::memory`]. simdev is
//! built to be hostile-input proof: bad requests become error replies and bad descriptors
//! become DMA-abort notifications, never a crash.
//!
//! It is not the runtime: it holds no model, ring-management or harvesting logic, only what
//! the device and driver do.
//!
//! Modules, from the outside in:
//!
//! - [`cli`]: the command line, [`cli::main_with_args`] (also used by `nrt simdev`).
//! - [`config`]: [`Config`] and its defaults.
//! - [`server`]: the socket, connections, handshake and fd passing; [`run`].
//! - [`client`]: [`ClientId`], one per control connection.
//! - [`device`]: [`Device`], request dispatch, NC ownership and reclaim, DMA runs,
//!   notifications.
//! - [`memory`]: memfd-backed chunks and the per-region first-fit allocator.
//! - [`dma`]: DMA queues, their rings, and descriptor processing.
//! - [`device::sequencer`]: the per-NC sequencer: exec-queue batches, executions, their errors.
//! - [`engines`]: the five engines interpreting the simulator ISA, and their scheduler.
//! - [`shape_only`]: a NEFF program run shape-only (streams charged, DGE table read, outputs a
//!   documented function of the inputs).
//! - [`reference`](mod@reference): NEFFs bound to a CPU reference (a Python function in a worker process),
//!   which computes their outputs instead of the shape-only function.
//! - [`compute`]: each NC's SBUF and PSUM, and the compute instructions (matmul, activation,
//!   tensor ops, reduce, copy, transpose, iota) the engines run on them.
//! - [`registers`]: an NC's semaphore/event window and notification eventfd.
//! - [`notify`]: the notification queue writer.
//! - [`counters`]: per-NC counters.
//! - [`sched`]: the scheduling policy of simdev's threads (by default they never preempt the
//!   host thread that rang a doorbell).
//! - [`faults`]: fault injection: armed faults, their triggers and effects.
//! - [`timing`]: the latency model and the NCs' simulated clocks.
//! - [`trace`]: the Chrome trace-event JSON trace.
//!
//! Everything below [`server`] works in-process: `Device::new(&config)` then
//! [`Device::handle`] answers requests exactly as the socket would, which is how the unit
//! tests drive DMA, memory, registers, notifications and executions.

#[cfg(test)]
mod alloc_count;
pub mod cli;
pub mod client;
pub mod compute;
pub mod config;
pub mod counters;
pub mod device;
pub mod dma;
pub mod engines;
pub mod faults;
pub mod memory;
pub mod notify;
pub mod private;
pub mod reference;
pub mod registers;
pub mod sched;
pub mod server;
pub mod shape_only;
pub mod signals;
pub mod timing;
pub mod trace;
pub mod uring;

pub use client::ClientId;
pub use config::Config;
pub use device::Device;
pub use server::{Server, SimdevError, StopHandle, run};
