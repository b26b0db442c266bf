//! The device backend: the one trait through which the runtime reaches a device, at the level
//! of the kernel driver (DESIGN §4).
//!
//! [`Device`] is the *control plane*: device info, memory chunks, DMA queue setup and the DMA
//! doorbell, semaphores and events, notification queues, NC reset — each method mirrors one
//! aws-neuronx-dkms ioctl (or the driver's mmap). The *data plane* is not here: descriptor
//! rings, the staged request and notification queues are shared memory ([`SharedChunk`]) that
//! runtime code writes and polls the same way on both backends. Descriptor building, ring
//! management, request staging and notification decoding therefore live in runtime modules,
//! never in a backend.
//!
//! Backends:
//! - [`sim::SimDevice`]: a `SOCK_SEQPACKET` connection to simdev (bincode 2 messages from
//!   `shared::protocol`, fds by `SCM_RIGHTS`). Doorbells are posted. With the test-only
//!   feature `test-support` (and in this crate's unit tests) the same messages can go to a
//!   device in this process instead (`SimDevice::in_process`), so tests need no simdev process.
//! - [`neuron::NeuronDevice`]: `/dev/neuronN` through the driver's ioctls. **Not yet run on
//!   silicon.**
//!
//! [`open`] picks one from `NEURON_RT_BACKEND` (see [`select`]).

use std::io;
use std::os::fd::OwnedFd;

use shared::NrtStatus;
use shared::memory::{MemError, SharedChunk};
use shared::protocol::{DeviceInfo, MemLocation, NcCounters, RemoteError};
use thiserror::Error;

pub mod neuron;
pub mod select;
pub mod sim;

pub use select::{BackendKind, OpenOptions, open};

/// A memory chunk handle as the driver returns it (small non-zero integer; 0 is invalid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemHandle(pub u64);

/// One allocated chunk: where it is and how big. Map it with [`Device::mem_map`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The driver handle.
    pub handle: MemHandle,
    /// First device PA.
    pub pa: u64,
    /// Size in bytes (a multiple of 4 KiB).
    pub size: u64,
    /// Where the chunk lives.
    pub location: MemLocation,
}

pub use shared::udma::DmaQueueId;

/// The two descriptor rings bound to a DMA queue (DMA_QUEUE_INIT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaRings {
    /// Chunk holding the TX (M2S) ring.
    pub tx_ring: MemHandle,
    /// TX ring size in descriptors (32 ≤ n ≤ 2^24−16, a multiple of 16).
    pub tx_desc_count: u32,
    /// Chunk holding the RX (S2M) ring.
    pub rx_ring: MemHandle,
    /// RX ring size in descriptors (same rules).
    pub rx_desc_count: u32,
}

/// An NC taken for this process.
#[derive(Debug)]
pub struct ClaimedNc {
    /// NC index.
    pub nc: u32,
    /// The NC's events + semaphores window, mapped read-only (events at +0, semaphore values at
    /// +0x1000), for syscall-free polling. `None` where the backend cannot map it.
    pub semaphore_window: Option<SharedChunk>,
    /// An eventfd the device writes after each notification it posts (simdev only: silicon has
    /// no completion interrupt, so the hardware backend returns `None` and the runtime polls).
    pub notification_fd: Option<OwnedFd>,
}

/// An NC's notification queue, mapped (layout in `shared::notification`).
#[derive(Debug)]
pub struct NotificationQueue {
    /// The ring's chunk.
    pub allocation: Allocation,
    /// Ring size in entries.
    pub entries: u32,
    /// The mapping of the whole chunk.
    pub memory: SharedChunk,
}

/// A failed backend operation. Each variant names the step (`op`: the driver call or protocol
/// request) that failed.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// An argument outside the device's ranges, caught before anything was sent.
    #[error("{op}: {what} {value} is out of range (limit {limit})")]
    OutOfRange {
        /// Operation.
        op: &'static str,
        /// Which argument.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The exclusive upper bound.
        limit: u64,
    },
    /// simdev refused the request.
    #[error("{op} refused by simdev")]
    Remote {
        /// Operation.
        op: &'static str,
        /// simdev's reason.
        #[source]
        source: RemoteError,
    },
    /// A driver ioctl failed.
    #[error("{op}: ioctl {request:#010x} failed")]
    Ioctl {
        /// Operation.
        op: &'static str,
        /// The request value.
        request: u32,
        /// errno.
        #[source]
        source: nix::Error,
    },
    /// A system call or socket operation failed.
    #[error("{op}")]
    Io {
        /// Operation.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The device went away (simdev exited or closed the connection).
    #[error("{op}: the device is gone (connection closed)")]
    Disconnected {
        /// Operation.
        op: &'static str,
    },
    /// The device did not answer a control request in time (simdev stopped, e.g. SIGSTOP, or
    /// stuck): the connection is given up, every later request fails the same way.
    #[error(
        "{op}: the device did not answer within {waited:?} (is simdev stopped or stuck?); the connection is given up"
    )]
    NotResponding {
        /// Operation.
        op: &'static str,
        /// How long it was waited for.
        waited: std::time::Duration,
    },
    /// The device did not answer by the caller's deadline (a `Device::*_by` call, or `nrt_close`):
    /// the request may still run; the connection is kept, and its reply, when it comes, is
    /// taken as owed, not as the answer to a later request.
    #[error(
        "{op}: the device did not answer within {waited:?}, by the request's deadline (is simdev stopped or stuck?)"
    )]
    Late {
        /// Operation.
        op: &'static str,
        /// How long it was waited for.
        waited: std::time::Duration,
    },
    /// The peer answered something the protocol does not allow here.
    #[error("{op}: protocol violation: {detail}")]
    Protocol {
        /// Operation.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The kernel dropped the file descriptors a reply carried (`MSG_CTRUNC`): this process
    /// has no descriptor left to receive them in.
    #[error(
        "{op}: the file descriptors simdev sent with its reply were dropped: this process is at its open-file limit (RLIMIT_NOFILE, ulimit -n {limit}); close descriptors or raise the limit"
    )]
    FdsDropped {
        /// Operation.
        op: &'static str,
        /// This process's soft limit, as text (`?` when it cannot be read).
        limit: String,
    },
    /// Mapping a chunk failed.
    #[error("{op}: mapping device memory")]
    Map {
        /// Operation.
        op: &'static str,
        /// The accessor's error.
        #[source]
        source: MemError,
    },
    /// A backend setting that cannot work (a bad `NEURON_RT_BACKEND`, an option that needs a
    /// private simdev while a running one is configured, ...).
    #[error("{message}")]
    Config {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// No device could be found or started.
    #[error("no Neuron device: {hint}")]
    NoDevice {
        /// What was tried and how to fix it.
        hint: String,
    },
    /// The connection was opened by another process: this one is a child forked after it was
    /// opened. Nothing is sent; the parent's connection, memory and NCs stay untouched.
    #[error(
        "{op}: the runtime was initialised in process {owner}; this is process {current}, forked from it, which may not use that runtime's device connection: call nrt_init in this process"
    )]
    Forked {
        /// Operation.
        op: &'static str,
        /// The process that opened the connection.
        owner: u32,
        /// This process.
        current: u32,
    },
    /// The backend does not implement this operation.
    #[error("{op} is not supported by the {backend} backend")]
    Unsupported {
        /// Operation.
        op: &'static str,
        /// Backend name.
        backend: &'static str,
    },
}

impl DeviceError {
    /// The `NRT_STATUS` a libnrt call reports for this failure.
    pub fn status(&self) -> NrtStatus {
        use shared::protocol::ErrorKind as K;
        match self {
            Self::OutOfRange { .. } => NrtStatus::Invalid,
            Self::Forked { .. } => NrtStatus::Uninitialized,
            Self::Remote { source, .. } => match source.kind {
                K::OutOfMemory => NrtStatus::Resource,
                K::NcBusy => NrtStatus::ExecNcBusy,
                K::BadHandle => NrtStatus::InvalidHandle,
                K::OutOfRange | K::BadRing | K::InvalidArgument | K::BadMessage => {
                    NrtStatus::Invalid
                }
                K::QueueStopped => NrtStatus::ExecHwErrDmaAbort,
                K::Handshake | K::PermissionDenied | K::NotOwner | K::Unsupported | K::Internal => {
                    NrtStatus::Failure
                }
            },
            Self::Ioctl { source, .. } => match source {
                nix::Error::ENOMEM => NrtStatus::Resource,
                nix::Error::EBUSY => NrtStatus::ExecNcBusy,
                nix::Error::EINVAL => NrtStatus::Invalid,
                _ => NrtStatus::HwError,
            },
            Self::FdsDropped { .. } => NrtStatus::Resource,
            Self::Disconnected { .. } | Self::NoDevice { .. } => NrtStatus::HwError,
            Self::NotResponding { .. } | Self::Late { .. } => NrtStatus::Timeout,
            Self::Config { .. } => NrtStatus::Invalid,
            Self::Io { .. }
            | Self::Protocol { .. }
            | Self::Map { .. }
            | Self::Unsupported { .. } => NrtStatus::Failure,
        }
    }
}

/// Control plane of one Neuron device, at the level of the kernel driver.
///
/// Methods mirror driver calls; each documents the ioctl it stands for. All take `&self` and
/// are safe to call from several threads. Ids are validated against [`Device::info`] before
/// anything reaches the device, so range errors are synchronous ([`DeviceError::OutOfRange`]).
pub trait Device: Send + Sync + std::fmt::Debug {
    /// The backend's name: `"sim"` or `"neuron"`.
    fn backend_name(&self) -> &'static str;

    /// Static facts about the device (DEVICE_INFO / DEVICE_BASIC_INFO and the arch tables).
    fn info(&self) -> &DeviceInfo;

    /// Takes NC `nc` for this process, exclusively (the driver's NC lock, CRWL_WRITER_ENTER).
    ///
    /// # Errors
    /// `OutOfRange`; a busy NC (`Remote` NcBusy / `Ioctl` EBUSY).
    fn claim_nc(&self, nc: u32) -> Result<ClaimedNc, DeviceError>;

    /// Gives NC `nc` back.
    ///
    /// # Errors
    /// `OutOfRange`; not owned.
    fn release_nc(&self, nc: u32) -> Result<(), DeviceError>;

    /// Allocates a chunk of `size` bytes (rounded up to 4 KiB) aligned to `align` bytes (0 for the
    /// default) in `location` (MEM_ALLOC_V2).
    ///
    /// # Errors
    /// Out of memory (`status()` = NRT_RESOURCE), bad NC, bad alignment.
    fn mem_alloc(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
    ) -> Result<Allocation, DeviceError>;

    /// [`Device::mem_alloc`] for a caller that must not wait on the device past `deadline`: a
    /// schedule call allocating a tensor operation's staging (schedule calls never block;
    /// nrt-api.md §2.10). The ioctl never waits on the device; simdev answers the request, so
    /// a stopped simdev would hold the caller for the control timeout. Default: the plain
    /// call.
    ///
    /// # Errors
    /// As [`Device::mem_alloc`]; [`DeviceError::Late`] when the device has not answered by
    /// `deadline` (a chunk it allocates later is freed).
    fn mem_alloc_by(
        &self,
        location: MemLocation,
        size: u64,
        align: u64,
        deadline: std::time::Instant,
    ) -> Result<Allocation, DeviceError> {
        let _ = deadline;
        self.mem_alloc(location, size, align)
    }

    /// Frees a chunk (MEM_FREE). Mappings of it must be dropped first. The ioctl does not
    /// wait on the device, and neither does simdev's: the free is sent and its reply read by a
    /// later request (an error in it is logged), and simdev frees before it runs any later
    /// request of this opener.
    ///
    /// # Errors
    /// Unknown handle (the driver; simdev's refusal is logged, later); a dead device.
    fn mem_free(&self, handle: MemHandle) -> Result<(), DeviceError>;

    /// Maps a whole chunk into this process (the driver's mmap at the chunk's offset; partial
    /// maps do not exist).
    ///
    /// # Errors
    /// Unknown or foreign handle; mmap failure.
    fn mem_map(&self, allocation: &Allocation) -> Result<SharedChunk, DeviceError>;

    /// [`Device::mem_map`] waiting on the device no later than `deadline` (see
    /// [`Device::mem_alloc_by`]). Default: the plain call.
    ///
    /// # Errors
    /// As [`Device::mem_map`]; [`DeviceError::Late`] past `deadline`.
    fn mem_map_by(
        &self,
        allocation: &Allocation,
        deadline: std::time::Instant,
    ) -> Result<SharedChunk, DeviceError> {
        let _ = deadline;
        self.mem_map(allocation)
    }

    /// A descriptor that maps a whole chunk from offset 0, for a caller to hand to another
    /// driver (`nrt_get_dmabuf_fd`; simdev: the chunk's memfd). The default: unsupported.
    ///
    /// # Errors
    /// [`DeviceError::Config`] when the backend cannot export memory; the backend's errors.
    fn mem_export_fd(&self, allocation: &Allocation) -> Result<std::os::fd::OwnedFd, DeviceError> {
        Err(DeviceError::Config {
            message: format!(
                "the {} backend cannot export device memory {:#x} as a descriptor",
                self.backend_name(),
                allocation.pa
            ),
        })
    }

    /// Binds a TX and an RX ring to a DMA queue and restarts it at index 0, ring id 1
    /// (DMA_QUEUE_INIT).
    ///
    /// # Errors
    /// Out-of-range ids, ring sizes outside 32..=2^24−16 or not a multiple of 16, a chunk
    /// smaller than its ring, an NC not owned.
    fn dma_queue_init(&self, queue: DmaQueueId, rings: &DmaRings) -> Result<(), DeviceError>;

    /// Releases a DMA queue (DMA_QUEUE_RELEASE).
    ///
    /// # Errors
    /// Out-of-range ids.
    fn dma_queue_release(&self, queue: DmaQueueId) -> Result<(), DeviceError>;

    /// The DMA doorbell (DMA_QUEUE_COPY_START): adds `rx_desc_count` to the RX tail, then
    /// `tx_desc_count` to the TX tail. `rx_desc_count` must be ≥ 1 (0 is a kernel `BUG_ON`).
    ///
    /// # Errors
    /// Out-of-range ids or counts; a queue not initialised or stopped by a DMA abort.
    fn dma_queue_copy_start(
        &self,
        queue: DmaQueueId,
        tx_desc_count: u32,
        rx_desc_count: u32,
    ) -> Result<(), DeviceError>;

    /// [`Device::dma_queue_copy_start`] for a caller that must not wait on the device past
    /// `deadline`: the XU worker, which steps every XU of its vNC (seed 004), ringing a
    /// tensor operation's DMA doorbell. The ioctl never waits on the device; simdev answers
    /// this request (it runs the DMA first), so a stopped simdev would hold the worker for
    /// the control timeout. Default: the plain call.
    ///
    /// # Errors
    /// As [`Device::dma_queue_copy_start`]; [`DeviceError::Late`] when the device has not
    /// answered by `deadline` (the doorbell may still take effect).
    fn dma_queue_copy_start_by(
        &self,
        queue: DmaQueueId,
        tx_desc_count: u32,
        rx_desc_count: u32,
        deadline: std::time::Instant,
    ) -> Result<(), DeviceError> {
        let _ = deadline;
        self.dma_queue_copy_start(queue, tx_desc_count, rx_desc_count)
    }

    /// Adds `value` to semaphore `index` of NC `nc` (SEMAPHORE_INCREMENT, ioctl 0x80084E29 with
    /// the 12-byte `{nc_id, semaphore_index, value}`). This is the execution doorbell and the
    /// only device call on the submit hot path; on simdev it is a posted message.
    ///
    /// # Errors
    /// Out-of-range ids; a dead device.
    fn semaphore_increment(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError>;

    /// Subtracts `value` from a semaphore (SEMAPHORE_DECREMENT).
    ///
    /// # Errors
    /// Out-of-range ids.
    fn semaphore_decrement(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError>;

    /// Reads a semaphore (SEMAPHORE_READ).
    ///
    /// # Errors
    /// Out-of-range ids.
    fn semaphore_read(&self, nc: u32, index: u32) -> Result<u32, DeviceError>;

    /// Sets a semaphore (SEMAPHORE_WRITE).
    ///
    /// # Errors
    /// Out-of-range ids.
    fn semaphore_write(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError>;

    /// Sets an event (EVENT_SET).
    ///
    /// # Errors
    /// Out-of-range ids.
    fn event_set(&self, nc: u32, index: u32, value: u32) -> Result<(), DeviceError>;

    /// Reads an event (EVENT_GET).
    ///
    /// # Errors
    /// Out-of-range ids.
    fn event_get(&self, nc: u32, index: u32) -> Result<u32, DeviceError>;

    /// Creates NC `nc`'s notification queue with `entries` entries (a power of two) in
    /// host-visible memory and maps it (NOTIFICATIONS_INIT_V2, NQ type NOTIFY).
    ///
    /// # Errors
    /// Out-of-range NC, bad size, NC not owned.
    fn notification_queue_init(
        &self,
        nc: u32,
        entries: u32,
    ) -> Result<NotificationQueue, DeviceError>;

    /// Resets NC `nc` (NC_RESET + NC_RESET_READY): its DMA queues and notification queue are
    /// stopped, its semaphores and events zeroed. `nrt_init` resets every NC it reserves
    /// ([`crate::reserve`]).
    ///
    /// # Errors
    /// Out-of-range NC, NC not owned, reset failed.
    fn nc_reset(&self, nc: u32) -> Result<(), DeviceError>;

    /// The device's counters for NC `nc` (executions, DMA bytes, aborts, ...).
    ///
    /// # Errors
    /// `Unsupported` on hardware.
    fn nc_counters(&self, nc: u32) -> Result<NcCounters, DeviceError>;

    /// The NEFF reference bindings of a simulated device (which NEFFs compute real numbers,
    /// and with what).
    ///
    /// # Errors
    /// `Unsupported` where the device has none to tell (hardware runs the NEFF's own
    /// instructions).
    fn neff_references(&self) -> Result<Vec<shared::protocol::ReferenceBinding>, DeviceError> {
        Err(DeviceError::Unsupported {
            op: "neff_references",
            backend: self.backend_name(),
        })
    }

    /// The processes holding the device's NCs or memory, with their command lines and runtime
    /// versions (neuron-ls's `neuron_processes`).
    ///
    /// # Errors
    /// `Unsupported` where the backend cannot tell (the neuron backend: the driver's process
    /// list is not read yet).
    fn processes(&self) -> Result<Vec<shared::protocol::ClientSummary>, DeviceError> {
        Err(DeviceError::Unsupported {
            op: "processes",
            backend: self.backend_name(),
        })
    }

    /// Starts recording the device's trace events of the NCs this process owns, at most
    /// `max_events` per NC until [`Device::trace_drain`] takes them; returns the NCs and the
    /// events' clock.
    ///
    /// # Errors
    /// `Unsupported` where the device records no trace (hardware: the timeline then holds
    /// the runtime's spans only).
    fn trace_subscribe(
        &self,
        max_events: u32,
    ) -> Result<(Vec<u32>, shared::protocol::TraceClock), DeviceError> {
        let _ = max_events;
        Err(DeviceError::Unsupported {
            op: "trace_subscribe",
            backend: self.backend_name(),
        })
    }

    /// Takes one batch of this process's held device trace events: the events, the drops
    /// since the last drain, whether more are held, and the events' clock.
    ///
    /// # Errors
    /// `Unsupported` where the device records no trace.
    fn trace_drain(&self) -> Result<DrainedTrace, DeviceError> {
        Err(DeviceError::Unsupported {
            op: "trace_drain",
            backend: self.backend_name(),
        })
    }

    /// What the device logged at warn or error level since the last call, where only this
    /// process would show it: a private simdev's log is a file in a directory removed with
    /// it, so the runtime passes its lines on to its own log when an execution fails. Empty
    /// for a shared simdev and the Neuron driver, whose logs are their own (simdev's stderr,
    /// the kernel log).
    fn take_device_log(&self) -> Vec<String> {
        Vec::new()
    }

    /// Whether the device is gone without having said so (simdev killed: its connection hung
    /// up, so no DeviceLost notification will ever come). One non-blocking system call at
    /// most; false for a device that reports its loss itself (the Neuron driver).
    fn hung_up(&self) -> bool {
        false
    }

    /// Returns once the device has handled every request this connection sent before the
    /// call, those whose replies nobody waits for included (a tool reading the device's own
    /// view over another connection then sees their effect). simdev: one waited round trip,
    /// answered in order after them. Default: nothing (the driver's ioctls are synchronous).
    ///
    /// # Errors
    /// The device's, for a device that is gone or not answering.
    fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// `nrt_close` is tearing the runtime down (its executions drained): no request waits on
    /// the device past `deadline`, so a stopped simdev cannot hold close for the control
    /// timeout per request. A late request still takes effect in order should the device run
    /// again, and [`Device::release`] gives back whatever it held anyway. Default: nothing
    /// (the driver's ioctls do not wait on the device).
    fn closing_by(&self, deadline: std::time::Instant) {
        let _ = deadline;
    }

    /// The opener is done with the device (`nrt_close`): what it started for itself stops and
    /// what it holds is given back now, even while objects that hold the device (tensors not
    /// yet freed) live on — their later requests fail as on a device that is gone. A private
    /// simdev is stopped; a shared one sees the connection close and frees what it held (as
    /// the driver does at the device file's last close); a Neuron device is left as it is.
    fn release(&self) {}
}

/// One batch of device trace events ([`Device::trace_drain`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainedTrace {
    /// The events, oldest first per NC.
    pub events: Vec<shared::device_trace::Event>,
    /// Events the device dropped (its buffer was full) since the last drain.
    pub dropped: u64,
    /// More events are held: drain again.
    pub more: bool,
    /// The events' clock.
    pub clock: shared::protocol::TraceClock,
}

/// Checks `value < limit` for argument `what` of `op`.
///
/// # Errors
/// [`DeviceError::OutOfRange`].
pub(crate) fn check_range(
    op: &'static str,
    what: &'static str,
    value: u32,
    limit: u32,
) -> Result<(), DeviceError> {
    if value < limit {
        Ok(())
    } else {
        Err(DeviceError::OutOfRange {
            op,
            what,
            value: value.into(),
            limit: limit.into(),
        })
    }
}

/// Checks an NC index and a DMA queue id against `info`.
///
/// # Errors
/// [`DeviceError::OutOfRange`].
pub(crate) fn check_queue(
    op: &'static str,
    info: &DeviceInfo,
    q: DmaQueueId,
) -> Result<(), DeviceError> {
    check_range(op, "nc", q.nc, info.nc_count)?;
    check_range(op, "dma engine", q.engine, info.dma_engines_per_nc)?;
    check_range(op, "dma queue", q.queue, info.dma_queues_per_engine)
}
