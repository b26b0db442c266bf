//! The simdev control protocol: requests and replies over one Unix `SOCK_SEQPACKET` connection
//! per client process, encoded with bincode 2 (serde, standard config) and at most
//! [`MAX_MSG_SIZE`] bytes each. File descriptors (memfds of memory chunks and of the semaphore
//! window, the NC's notification eventfd) travel beside a reply as `SCM_RIGHTS` ancillary data;
//! each reply variant documents how many it carries.
//!
//! Rules:
//! - The first request on a connection must be [`Request::Hello`] with [`PROTOCOL_VERSION`];
//!   anything else, or another version, gets [`ErrorKind::Handshake`] and the connection is
//!   closed.
//! - Every request gets exactly one reply, in order, except the *posted* ones
//!   ([`Request::is_posted`]): doorbells, like a PCIe posted write, get none. Because the socket
//!   keeps order, a later request observes every earlier posted write.
//! - Requests mirror driver ioctls (`reference/driver-abi.md` §1); ids are range-checked by
//!   simdev and by the client backend before sending.
//! - Bulk data never crosses the socket: it moves through shared chunks and DMA.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::address_map::Arch;

/// Version both sides must agree on in the handshake.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest encoded message in bytes. Every message is a few dozen bytes of ids and addresses
/// (bulk data goes through shared memory), so 4 KiB leaves room for error strings while keeping
/// receive buffers on the stack.
pub const MAX_MSG_SIZE: usize = 4096;
/// Most file descriptors one message carries.
pub const MAX_FDS_PER_MSG: usize = 2;

/// Where an allocation lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemLocation {
    /// HBM of NC `nc` (the client must own the NC).
    Hbm {
        /// NC index.
        nc: u32,
    },
    /// Host-visible memory (DMA-able host memory at the PCIe host base).
    Host,
}

/// Static facts about a device (simdev's answer to DEVICE_INFO and the arch tables).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Device generation.
    pub arch: Arch,
    /// Physical NCs.
    pub nc_count: u32,
    /// HBM bytes per NC.
    pub hbm_bytes_per_nc: u64,
    /// First PA of each NC's HBM, indexed by NC.
    pub hbm_bases: Vec<u64>,
    /// First PA of host-visible memory.
    pub host_base: u64,
    /// First PA of the register window.
    pub reg_base: u64,
    /// Semaphores per NC.
    pub semaphores_per_nc: u32,
    /// Events per NC.
    pub events_per_nc: u32,
    /// DMA engines per NC.
    pub dma_engines_per_nc: u32,
    /// Queues per DMA engine.
    pub dma_queues_per_engine: u32,
    /// Free-form identification of the device (e.g. "simdev 0.1.0 pid 1234").
    pub description: String,
}

/// Declares [`NcCounters`] and its by-name view from one list of fields, so a counter added to
/// the struct is in [`NcCounters::NAMES`], [`NcCounters::get`] and [`NcCounters::to_map`] too.
macro_rules! nc_counters {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident: u64, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: u64, )*
        }

        impl $name {
            /// Every counter's name (its field name), in declaration order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// The counter named `name`; `None` when no counter has that name.
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($field) => Some(self.$field),)*
                    _ => None,
                }
            }

            /// Every counter by name (serialises as a map of name to value).
            pub fn to_map(&self) -> std::collections::BTreeMap<&'static str, u64> {
                std::collections::BTreeMap::from([$((stringify!($field), self.$field)),*])
            }

            /// `(name, value)` of every counter, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($field), self.$field)),*].into_iter()
            }
        }
    };
}

nc_counters! {
    /// Counters of one NC, as simdev keeps them. The scenario runner and the exit report read them
    /// by name ([`NcCounters::get`], [`NcCounters::iter`]).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct NcCounters {
        /// Descriptor pairs the NC's DMA engines completed.
        pub dma_descriptors: u64,
        /// Bytes the NC's DMA engines moved.
        pub dma_bytes: u64,
        /// Queues stopped on a bad descriptor (DMA aborts).
        pub dma_aborts: u64,
        /// Register writes performed by DMA (semaphores, events, tail increments).
        pub register_writes: u64,
        /// Posted semaphore increments received (doorbells).
        pub doorbells: u64,
        /// Notifications written.
        pub notifications: u64,
        /// Notifications dropped because the NQ was full.
        pub nq_overflows: u64,
        /// Posted messages that failed (they get no reply; the error is logged and counted).
        pub posted_errors: u64,
        /// NC resets.
        pub resets: u64,
        /// Executions the sequencer finished (a notification of kind `Execution` posted).
        pub executions: u64,
        /// Executions that ended with error flags.
        pub exec_errors: u64,
        /// Sequencer config reloads (requests with `reload_seq_config` = 1).
        pub config_reloads: u64,
        /// Activation/DVE table loads (requests with `load_act_dve_tables` = 1).
        pub table_loads: u64,
        /// Collectives model-switch chains run (their last pair poked the collectives event).
        pub cc_chains: u64,
        /// Injected faults that fired on this NC.
        pub faults_fired: u64,
        /// NEFF programs run **shape-only** to their end: no instruction semantics, outputs a
        /// documented function of the inputs ([`crate::neff_program::shape_only`]), not the
        /// model's numbers.
        pub neff_shape_only_executions: u64,
        /// NEFF programs whose outputs a bound reference computed (simdev `--reference`),
        /// run to their end.
        pub neff_reference_executions: u64,
        /// Executions run to their notification on the thread that delivered their doorbell
        /// (the connection's thread): no thread hand-off between the doorbell's arrival and
        /// the notification.
        pub inline_executions: u64,
        /// Executions handed to the NC's sequencer thread (one thread hand-off): those that
        /// park waiting for the outside world, run under a latency model or a fault that
        /// delays them, call a reference, or arrive while another execution of the NC runs.
        pub sequencer_handoffs: u64,
    }
}

/// A client's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Handshake; must come first. Reply: [`Reply::Hello`].
    Hello {
        /// Must equal [`PROTOCOL_VERSION`].
        version: u32,
    },
    /// Reply: [`Reply::DeviceInfo`].
    DeviceInfo,
    /// Take NC `nc` for this client, exclusively. Reply: [`Reply::NcClaimed`].
    ClaimNc {
        /// NC index.
        nc: u32,
    },
    /// Give NC `nc` back (its queues, notification queue and semaphores are reset; memory stays
    /// with the client). Reply: [`Reply::Ok`].
    ReleaseNc {
        /// NC index.
        nc: u32,
    },
    /// MEM_ALLOC: a new chunk. Reply: [`Reply::MemAllocated`].
    MemAlloc {
        /// Where.
        location: MemLocation,
        /// Bytes; rounded up to 4 KiB.
        size: u64,
        /// Alignment in bytes (a power of two, or 0 for the 4 KiB default).
        align: u64,
    },
    /// MEM_FREE. Reply: [`Reply::Ok`].
    MemFree {
        /// Handle from [`Reply::MemAllocated`].
        handle: u64,
    },
    /// The driver's mmap of a whole chunk: returns the chunk's memfd. Reply: [`Reply::MemMapped`].
    MemMap {
        /// Handle of a chunk this client owns.
        handle: u64,
    },
    /// DMA_QUEUE_INIT: bind a TX and an RX ring (chunks owned by the client) to a queue of an
    /// owned NC. Ring sizes: 32 ≤ n ≤ 2^24−16, a multiple of 16; the chunk must hold n·16
    /// bytes. The queue restarts at index 0, ring id 1. Reply: [`Reply::Ok`].
    DmaQueueInit {
        /// NC index.
        nc: u32,
        /// Engine on the NC.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
        /// Handle of the TX ring chunk.
        tx_ring: u64,
        /// TX ring size in descriptors.
        tx_desc_count: u32,
        /// Handle of the RX ring chunk.
        rx_ring: u64,
        /// RX ring size in descriptors.
        rx_desc_count: u32,
    },
    /// DMA_QUEUE_RELEASE. Reply: [`Reply::Ok`].
    DmaQueueRelease {
        /// NC index.
        nc: u32,
        /// Engine on the NC.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
    },
    /// DMA_QUEUE_COPY_START: add `rx_desc_count` to the RX tail, then `tx_desc_count` to the TX
    /// tail, and process the posted pairs. Reply: [`Reply::Ok`] once the engine has consumed
    /// what it can (a bad descriptor stops the queue and posts a DMA-abort notification; the
    /// reply is still `Ok`, as the ioctl's is).
    DmaQueueCopyStart {
        /// NC index.
        nc: u32,
        /// Engine on the NC.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
        /// TX descriptors to post.
        tx_desc_count: u32,
        /// RX descriptors to post (≥ 1).
        rx_desc_count: u32,
    },
    /// SEMAPHORE_INCREMENT. **Posted: no reply.**
    SemaphoreIncrement {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
        /// Amount to add.
        value: u32,
    },
    /// SEMAPHORE_DECREMENT. Reply: [`Reply::Ok`].
    SemaphoreDecrement {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
        /// Amount to subtract.
        value: u32,
    },
    /// SEMAPHORE_READ. Reply: [`Reply::Value`].
    SemaphoreRead {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
    },
    /// SEMAPHORE_WRITE. Reply: [`Reply::Ok`].
    SemaphoreWrite {
        /// NC index.
        nc: u32,
        /// Semaphore index.
        index: u32,
        /// New value.
        value: u32,
    },
    /// EVENT_SET. Reply: [`Reply::Ok`].
    EventSet {
        /// NC index.
        nc: u32,
        /// Event index.
        index: u32,
        /// New value.
        value: u32,
    },
    /// EVENT_GET. Reply: [`Reply::Value`].
    EventGet {
        /// NC index.
        nc: u32,
        /// Event index.
        index: u32,
    },
    /// NOTIFICATIONS_INIT: (re)create the NC's notification queue in host-visible memory owned
    /// by the client. Only `nq_type` NOTIFY (1) is emulated: every notification of the NC goes
    /// there. Reply: [`Reply::NotificationQueue`].
    NotificationInit {
        /// NC index.
        nc: u32,
        /// `NQ_TYPE`; must be 1 (NOTIFY).
        nq_type: u32,
        /// Ring size in entries: a power of two, 2..=65536.
        entries: u32,
    },
    /// NC_RESET of an owned NC: stops and forgets its DMA queues and notification queue, zeroes
    /// its semaphores and events. Reply: [`Reply::Ok`].
    NcReset {
        /// NC index.
        nc: u32,
    },
    /// Read an NC's counters (any NC, owned or not). Reply: [`Reply::Counters`].
    Counters {
        /// NC index.
        nc: u32,
    },
    /// Arm a fault (scenario control; any client may send it). Reply: [`Reply::Ok`].
    InjectFault(FaultSpec),
    /// Disarm every fault not yet fired. Reply: [`Reply::Ok`].
    ClearFaults,
    /// Set the latency model of every NC. Reply: [`Reply::Ok`].
    SetLatency(LatencyModel),
    /// Device-wide usage. Reply: [`Reply::DeviceStats`].
    DeviceStats,
    /// The NEFF reference bindings simdev was started with (issue 15), so reports can name
    /// what computed a NEFF's outputs. Reply: [`Reply::References`].
    References,
    /// Who this client is, beyond what the socket's credentials say (its pid): the runtime
    /// version it runs, for `nrt ls`'s process list. Sent once after the handshake by
    /// runtimes; optional. Reply: [`Reply::Ok`].
    Identify {
        /// The runtime's version string (at most [`MAX_IDENTITY_LEN`] bytes are kept).
        runtime_version: String,
    },
    /// The connected clients that hold NCs or device memory (neuron-ls's process list).
    /// Reply: [`Reply::Clients`].
    Clients,
    /// Start recording the device trace events of the NCs this client owns now, even without
    /// simdev's `--trace`: at most `max_events` per NC (capped by simdev) are held until
    /// [`Request::TraceDrain`] takes them; more are dropped and counted. Claiming an NC again
    /// (by anyone) or releasing it ends its subscription. Reply: [`Reply::TraceSubscribed`].
    TraceSubscribe {
        /// Events held per NC before dropping.
        max_events: u32,
    },
    /// Take the held trace events of this client's subscribed NCs, oldest first, as many as
    /// fit one message. Reply: [`Reply::TraceEvents`] (`more` set: send it again).
    TraceDrain,
}

/// Longest identity string simdev keeps of a client (longer ones are cut at a char boundary).
pub const MAX_IDENTITY_LEN: usize = 256;

/// A connected client as simdev knows it: its process (from the socket's credentials and
/// `/proc`), what it said of itself ([`Request::Identify`]) and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientSummary {
    /// The process id (`SO_PEERCRED`; 0 when not known).
    pub pid: u32,
    /// Its command line (`/proc/PID/cmdline`, arguments joined by spaces; empty when simdev
    /// cannot read it, e.g. from another pid namespace).
    pub command: String,
    /// The runtime version it announced (empty when it did not).
    pub runtime_version: String,
    /// The NCs it holds, ascending.
    pub ncs: Vec<u32>,
    /// Bytes of device memory chunks it holds (HBM and host).
    pub memory_bytes: u64,
}

/// A fault simdev injects into an execution (scenario control).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultKind {
    /// NeuronCore uncorrectable (parity) error: the notification carries `NC_UE` (→ 1202).
    NcUncorrectable,
    /// Unrepairable HBM uncorrectable error: `HBM_UE` (→ 1201).
    HbmUncorrectable,
    /// Repairable HBM uncorrectable error: `HBM_UE_REPAIRABLE` (→ 1205).
    HbmRepairable,
    /// DMA engine abort: the NC's exec queue stops and the execution carries `DMA_ABORT` (→ 1203).
    DmaAbort,
    /// An out-of-bounds access: `OOB` (→ 1006).
    OutOfBounds,
    /// A numerical error (NaN/Inf): `NUMERICAL` (→ 1003), results still written.
    Numerical,
    /// An execution that completes with a generic error: `GENERIC` (→ 1004).
    GenericError,
    /// The execution runs but its notification is never posted (a hang as the runtime sees it).
    MissingCompletion,
    /// The notification is posted `delay_ms` of wall-clock time late.
    LateCompletion {
        /// Wall-clock delay in milliseconds.
        delay_ms: u32,
    },
    /// The execution takes `ns` more simulated time (and wall time when pacing).
    ExtraLatency {
        /// Simulated nanoseconds.
        ns: u64,
    },
    /// The device is lost: simdev posts DeviceLost to every claimed NC and exits.
    DeviceLost,
}

impl FaultKind {
    /// The kind's name (its variant, without parameters).
    pub const fn name(self) -> &'static str {
        match self {
            Self::NcUncorrectable => "NcUncorrectable",
            Self::HbmUncorrectable => "HbmUncorrectable",
            Self::HbmRepairable => "HbmRepairable",
            Self::DmaAbort => "DmaAbort",
            Self::OutOfBounds => "OutOfBounds",
            Self::Numerical => "Numerical",
            Self::GenericError => "GenericError",
            Self::MissingCompletion => "MissingCompletion",
            Self::LateCompletion { .. } => "LateCompletion",
            Self::ExtraLatency { .. } => "ExtraLatency",
            Self::DeviceLost => "DeviceLost",
        }
    }
}

/// When an armed fault fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultWhen {
    /// At the Nth execution on the NC counted from when the fault was armed (1 = the next).
    NthExecution(u64),
    /// At the Nth DMA doorbell (DMA_QUEUE_COPY_START) on queue (`engine`, `queue`) of the NC,
    /// counted from when the fault was armed (1 = the next); fires once. Only `DmaAbort` (the
    /// queue stops, a DmaQueueError notification with DMA_ABORT) and `OutOfBounds` (the same
    /// with OOB) apply: the doorbell's descriptors are not processed. Executions do not count.
    NthCopyStart {
        /// DMA engine on the NC.
        engine: u32,
        /// Queue on the engine.
        queue: u32,
        /// Which doorbell (1 = the next).
        n: u64,
    },
    /// On each execution with probability `per_million` / 1e6, from a generator seeded with
    /// `seed` (deterministic for a given execution order).
    Probability {
        /// Chance per execution, in millionths.
        per_million: u32,
        /// Generator seed.
        seed: u64,
    },
}

/// An armed fault: what, on which NC (any NC when `None`), when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSpec {
    /// The fault.
    pub kind: FaultKind,
    /// The NC; `None` = every NC.
    pub nc: Option<u32>,
    /// When it fires. An `NthExecution` or `NthCopyStart` fault fires once; a `Probability`
    /// fault stays armed.
    pub when: FaultWhen,
}

/// simdev's timing model, in simulated nanoseconds. With every field 0 (the default) an
/// execution's device timestamps follow the wall clock; otherwise they follow the model
/// exactly: an execution lasts `per_execution_ns + instructions · per_instruction_ns +
/// reloads · per_config_reload_ns + table loads · per_table_load_ns` (plus any ExtraLatency),
/// and an NC reset (NcReset, release, reclaim) adds `per_nc_reset_ns` to the NC's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyModel {
    /// Fixed cost of every execution.
    pub per_execution_ns: u64,
    /// Cost of each instruction an engine executes.
    pub per_instruction_ns: u64,
    /// Cost of a sequencer config reload (`reload_seq_config` = 1).
    pub per_config_reload_ns: u64,
    /// Cost of an activation/DVE table load (`load_act_dve_tables` = 1).
    pub per_table_load_ns: u64,
    /// Cost of an NC reset (libnrt resets every core it reserves at `nrt_init`).
    pub per_nc_reset_ns: u64,
    /// Also sleep the simulated duration in wall-clock time.
    pub wall_clock_pacing: bool,
}

/// Device-wide usage (for leak checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Bytes of client memory chunks allocated (HBM and host), NQ rings included.
    pub memory_in_use: u64,
    /// Chunks allocated.
    pub chunks: u64,
    /// Connected clients.
    pub clients: u32,
    /// NCs claimed.
    pub claimed_ncs: u32,
    /// DMA queues initialised.
    pub dma_queues: u32,
    /// Faults armed and not yet fired.
    pub armed_faults: u32,
}

impl Request {
    /// Whether the request is posted (gets no reply).
    pub const fn is_posted(&self) -> bool {
        matches!(self, Self::SemaphoreIncrement { .. })
    }

    /// A short name of the request, for logs and error messages.
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "Hello",
            Self::DeviceInfo => "DeviceInfo",
            Self::ClaimNc { .. } => "ClaimNc",
            Self::ReleaseNc { .. } => "ReleaseNc",
            Self::MemAlloc { .. } => "MemAlloc",
            Self::MemFree { .. } => "MemFree",
            Self::MemMap { .. } => "MemMap",
            Self::DmaQueueInit { .. } => "DmaQueueInit",
            Self::DmaQueueRelease { .. } => "DmaQueueRelease",
            Self::DmaQueueCopyStart { .. } => "DmaQueueCopyStart",
            Self::SemaphoreIncrement { .. } => "SemaphoreIncrement",
            Self::SemaphoreDecrement { .. } => "SemaphoreDecrement",
            Self::SemaphoreRead { .. } => "SemaphoreRead",
            Self::SemaphoreWrite { .. } => "SemaphoreWrite",
            Self::EventSet { .. } => "EventSet",
            Self::EventGet { .. } => "EventGet",
            Self::NotificationInit { .. } => "NotificationInit",
            Self::NcReset { .. } => "NcReset",
            Self::Counters { .. } => "Counters",
            Self::InjectFault(_) => "InjectFault",
            Self::ClearFaults => "ClearFaults",
            Self::SetLatency(_) => "SetLatency",
            Self::DeviceStats => "DeviceStats",
            Self::References => "References",
            Self::Identify { .. } => "Identify",
            Self::Clients => "Clients",
            Self::TraceSubscribe { .. } => "TraceSubscribe",
            Self::TraceDrain => "TraceDrain",
        }
    }
}

/// A NEFF bound to a reference in simdev: the NEFF's identity (as the program header carries
/// it, `shared::neff_program`) and how reports name the reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReferenceBinding {
    /// The NEFF header's uuid.
    pub neff_uuid: [u8; 16],
    /// The first 16 bytes of the NEFF header's hash field.
    pub neff_hash: [u8; 16],
    /// The reference: `"ref_matmul.py:matmul"`, or a golden file's name.
    pub label: String,
}

/// Why simdev refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The bytes did not decode as a [`Request`] (or exceeded [`MAX_MSG_SIZE`]).
    BadMessage,
    /// No or wrong handshake.
    Handshake,
    /// The peer's uid is not allowed.
    PermissionDenied,
    /// An id (NC, semaphore, event, engine, queue) or value is out of range.
    OutOfRange,
    /// The NC is owned by another client.
    NcBusy,
    /// The NC is not owned by this client.
    NotOwner,
    /// No memory left in the requested location.
    OutOfMemory,
    /// Unknown handle, or a handle another client owns.
    BadHandle,
    /// A ring that breaks the driver's rules (size, alignment, chunk too small).
    BadRing,
    /// The DMA queue is not initialised, or was stopped by a DMA abort.
    QueueStopped,
    /// A valid request simdev does not emulate.
    Unsupported,
    /// Bad arguments not covered above (e.g. an invalid size or alignment).
    InvalidArgument,
    /// simdev failed internally (a simdev bug), or could not get an OS resource.
    Internal,
}

/// An error reply: what failed and why, in words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{kind:?}: {message}")]
pub struct RemoteError {
    /// The class of failure.
    pub kind: ErrorKind,
    /// A sentence naming the bad value and the rule it broke.
    pub message: String,
}

/// simdev's reply to one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Handshake accepted.
    Hello {
        /// simdev's protocol version.
        version: u32,
        /// The device.
        device: DeviceInfo,
    },
    /// Device facts.
    DeviceInfo(DeviceInfo),
    /// The NC is now the client's. **Carries 2 fds**: the semaphore window memfd (sealed
    /// against writable mappings: map it read-only, [`crate::address_map::SEM_WINDOW_SIZE`]
    /// bytes) and the NC's notification eventfd (simdev writes 1 after each notification).
    NcClaimed {
        /// NC index.
        nc: u32,
    },
    /// Success without data.
    Ok,
    /// A new chunk.
    MemAllocated {
        /// Handle (non-zero, unique per simdev run).
        handle: u64,
        /// First device PA.
        pa: u64,
        /// Size in bytes (rounded up to 4 KiB).
        size: u64,
    },
    /// **Carries 1 fd**: the chunk's memfd, exactly `size` bytes, to map whole.
    MemMapped {
        /// Handle.
        handle: u64,
        /// First device PA.
        pa: u64,
        /// Size in bytes.
        size: u64,
    },
    /// A register value (semaphore read, event get).
    Value(u32),
    /// The NC's notification queue: a chunk owned by the client (map it with
    /// [`Request::MemMap`]; layout in [`crate::notification`]).
    NotificationQueue {
        /// Chunk handle.
        handle: u64,
        /// First device PA.
        pa: u64,
        /// Chunk size in bytes.
        size: u64,
        /// Ring size in entries.
        entries: u32,
    },
    /// An NC's counters.
    Counters(NcCounters),
    /// Device-wide usage.
    DeviceStats(DeviceStats),
    /// The NEFF reference bindings, in the order simdev was given them.
    References(Vec<ReferenceBinding>),
    /// The request failed.
    Error(RemoteError),
    /// The clients holding NCs or memory, by pid.
    Clients(Vec<ClientSummary>),
    /// The client's NCs whose trace events simdev now records, and the trace clock.
    TraceSubscribed {
        /// The NCs subscribed (those the client owned).
        ncs: Vec<u32>,
        /// The clock of the events' timestamps.
        clock: TraceClock,
    },
    /// Held trace events of the client's subscribed NCs ([`Request::TraceDrain`]).
    TraceEvents {
        /// Events, oldest first per NC.
        events: Vec<crate::device_trace::Event>,
        /// Events dropped (the NC's buffer was full) since the last drain.
        dropped: u64,
        /// More events are held: drain again.
        more: bool,
        /// The clock of the events' timestamps.
        clock: TraceClock,
    },
}

/// The time base of simdev's trace events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceClock {
    /// simdev's start on the host's `CLOCK_MONOTONIC`, in ns: an event's host time is
    /// `origin_monotonic_ns + ts_ns` (both processes run on one host).
    pub origin_monotonic_ns: u64,
    /// A latency model is set: events carry the NC's simulated clock (ns since the NC's
    /// simulated start), not wall time since `origin_monotonic_ns`.
    pub simulated: bool,
}

impl Reply {
    /// Number of fds that travel with this reply.
    pub const fn fd_count(&self) -> usize {
        match self {
            Self::NcClaimed { .. } => 2,
            Self::MemMapped { .. } => 1,
            _ => 0,
        }
    }

    /// A refusal of `kind` with a message.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self::Error(RemoteError {
            kind,
            message: message.into(),
        })
    }
}

/// A message that could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum CodecError {
    /// Encoding failed (a message larger than [`MAX_MSG_SIZE`]).
    #[error("encoding a message")]
    Encode(#[source] bincode::error::EncodeError),
    /// The bytes are not a valid message.
    #[error("decoding a {len}-byte message")]
    Decode {
        /// Bytes received.
        len: usize,
        /// What bincode found.
        #[source]
        source: bincode::error::DecodeError,
    },
    /// Bytes left over after the message.
    #[error("{extra} trailing bytes after a message")]
    TrailingBytes {
        /// Extra bytes.
        extra: usize,
    },
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_MSG_SIZE>()
}

/// Encodes `msg` into `buf` (at least [`MAX_MSG_SIZE`] bytes); returns the bytes used.
///
/// # Errors
/// [`CodecError::Encode`] if the message does not fit.
pub fn encode<T: Serialize>(msg: &T, buf: &mut [u8]) -> Result<usize, CodecError> {
    let limit = buf.len().min(MAX_MSG_SIZE);
    bincode::serde::encode_into_slice(msg, &mut buf[..limit], config()).map_err(CodecError::Encode)
}

/// Decodes one whole message from `bytes`.
///
/// # Errors
/// [`CodecError::Decode`] or [`CodecError::TrailingBytes`].
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (msg, used) = bincode::serde::decode_from_slice(bytes, config()).map_err(|source| {
        CodecError::Decode {
            len: bytes.len(),
            source,
        }
    })?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes {
            extra: bytes.len() - used,
        });
    }
    Ok(msg)
}

/// What a [`Connection`] answers to one message, as the socket server would send it.
#[derive(Debug)]
pub enum Answer {
    /// An encoded reply and the fds that travel with it.
    Reply(Vec<u8>, Vec<std::os::fd::OwnedFd>),
    /// Nothing: the message was a posted request ([`Request::is_posted`]).
    Silent,
    /// An encoded reply, after which the connection is closed (a refused handshake): every
    /// later message is answered with [`Answer::Closed`].
    Close(Vec<u8>),
    /// The connection is closed; nothing was handled.
    Closed,
}

/// The device end of this protocol called in-process, without a socket (a test backend): the
/// same messages, encoded the same way, answered by the same per-connection session as the
/// socket server's, so the handshake and the codec are exercised as over the socket. Only the
/// transport differs: fds are handed over as owned values instead of by `SCM_RIGHTS`.
pub trait Handler: Send + Sync {
    /// A new connection from process `pid` (what the socket's peer credentials would say).
    /// Dropping the returned connection ends it: the device reclaims everything the client
    /// owned, as at a socket's EOF.
    fn open(self: std::sync::Arc<Self>, pid: u32) -> Box<dyn Connection>;
}

/// One client's connection to a [`Handler`].
pub trait Connection: Send {
    /// Answers one encoded message (at most [`MAX_MSG_SIZE`] bytes).
    fn respond(&mut self, message: &[u8]) -> Answer;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_listed_once_by_name() {
        let c = NcCounters {
            dma_bytes: 7,
            cc_chains: 3,
            faults_fired: 2,
            ..NcCounters::default()
        };
        assert_eq!(NcCounters::NAMES.len(), 19);
        assert_eq!(NcCounters::NAMES[0], "dma_descriptors");
        assert_eq!(NcCounters::NAMES[14], "faults_fired");
        assert_eq!(NcCounters::NAMES[15], "neff_shape_only_executions");
        assert_eq!(NcCounters::NAMES[16], "neff_reference_executions");
        assert_eq!(NcCounters::NAMES[17], "inline_executions");
        assert_eq!(NcCounters::NAMES[18], "sequencer_handoffs");
        assert_eq!(c.get("dma_bytes"), Some(7));
        assert_eq!(c.get("faults_fired"), Some(2));
        assert_eq!(c.get("cc_chain"), None, "a misspelt name is not a counter");
        let map = c.to_map();
        assert_eq!(map.len(), NcCounters::NAMES.len());
        assert_eq!((map["cc_chains"], map["resets"]), (3, 0));
        let names: Vec<_> = c.iter().map(|(name, _)| name).collect();
        assert_eq!(names, NcCounters::NAMES);
        assert_eq!(c.iter().map(|(_, v)| v).sum::<u64>(), 12);
    }

    #[test]
    fn requests_round_trip() {
        let reqs = [
            Request::Hello {
                version: PROTOCOL_VERSION,
            },
            Request::MemAlloc {
                location: MemLocation::Hbm { nc: 1 },
                size: 4096,
                align: 0,
            },
            Request::DmaQueueCopyStart {
                nc: 0,
                engine: 1,
                queue: 2,
                tx_desc_count: 3,
                rx_desc_count: 3,
            },
            Request::SemaphoreIncrement {
                nc: 1,
                index: 5,
                value: 1,
            },
        ];
        let mut buf = [0u8; MAX_MSG_SIZE];
        for req in reqs {
            let n = encode(&req, &mut buf).unwrap();
            assert_eq!(decode::<Request>(&buf[..n]).unwrap(), req);
        }
    }

    #[test]
    fn the_references_reply_round_trips_and_appends_to_the_enums() {
        let reply = Reply::References(vec![ReferenceBinding {
            neff_uuid: [7; 16],
            neff_hash: [9; 16],
            label: "ref_matmul.py:matmul".into(),
        }]);
        let mut buf = [0u8; MAX_MSG_SIZE];
        let n = encode(&reply, &mut buf).unwrap();
        assert_eq!(decode::<Reply>(&buf[..n]).unwrap(), reply);
        // Appended: the variants before it keep their wire indices.
        let n = encode(&Request::References, &mut buf).unwrap();
        assert_eq!(&buf[..n], [23]);
        assert_eq!(Request::References.name(), "References");
    }

    #[test]
    fn identify_and_clients_round_trip_and_append_to_the_enums() {
        let mut buf = [0u8; MAX_MSG_SIZE];
        let identify = Request::Identify {
            runtime_version: "2.0.0.0".into(),
        };
        let n = encode(&identify, &mut buf).unwrap();
        assert_eq!(&buf[..2], [24, 7], "variant 24, then the string's length");
        assert_eq!(decode::<Request>(&buf[..n]).unwrap(), identify);
        let n = encode(&Request::Clients, &mut buf).unwrap();
        assert_eq!(&buf[..n], [25]);
        let reply = Reply::Clients(vec![ClientSummary {
            pid: 42,
            command: "python3 train.py".into(),
            runtime_version: "2.0.0.0".into(),
            ncs: vec![0, 1],
            memory_bytes: 1 << 20,
        }]);
        let n = encode(&reply, &mut buf).unwrap();
        assert_eq!(
            buf[0], 12,
            "after Error (11): the replies before keep their indices"
        );
        assert_eq!(decode::<Reply>(&buf[..n]).unwrap(), reply);
        assert_eq!(
            (identify.name(), Request::Clients.name()),
            ("Identify", "Clients")
        );
    }

    #[test]
    fn the_trace_requests_and_replies_round_trip_and_append_to_the_enums() {
        use crate::device_trace::{Detail, Event};
        let mut buf = [0u8; MAX_MSG_SIZE];
        // Appended after Clients (25): the earlier variants keep their wire indices.
        let n = encode(&Request::TraceSubscribe { max_events: 200 }, &mut buf).unwrap();
        assert_eq!(&buf[..n], [26, 200]);
        let n = encode(&Request::TraceDrain, &mut buf).unwrap();
        assert_eq!(&buf[..n], [27]);
        assert_eq!(Request::TraceDrain.name(), "TraceDrain");
        assert_eq!(
            Request::TraceSubscribe { max_events: 1 }.name(),
            "TraceSubscribe"
        );
        let clock = TraceClock {
            origin_monotonic_ns: 123_456_789,
            simulated: false,
        };
        let replies = [
            Reply::TraceSubscribed {
                ncs: vec![0, 1],
                clock,
            },
            Reply::TraceEvents {
                events: vec![
                    Event {
                        nc: 1,
                        ts_ns: 5,
                        dur_ns: Some(7),
                        detail: Detail::Stream {
                            engine: crate::exec_request::Engine::Pe,
                            records: 3,
                            reference: Some("ref.py:f".into()),
                            pa: 0x1000,
                            compute_idx: 4,
                        },
                    },
                    Event {
                        nc: 1,
                        ts_ns: 9,
                        dur_ns: None,
                        detail: Detail::Fault {
                            kind: FaultKind::ExtraLatency { ns: 5 },
                            compute_idx: 4,
                        },
                    },
                ],
                dropped: 2,
                more: true,
                clock,
            },
        ];
        for reply in replies {
            let n = encode(&reply, &mut buf).unwrap();
            assert_eq!(decode::<Reply>(&buf[..n]).unwrap(), reply);
            assert_eq!(reply.fd_count(), 0);
        }
    }

    #[test]
    fn golden_bytes_of_the_doorbell() {
        // bincode 2 standard config: varint enum tag (10 = SemaphoreIncrement), varint u32s.
        let mut buf = [0u8; MAX_MSG_SIZE];
        let n = encode(
            &Request::SemaphoreIncrement {
                nc: 1,
                index: 5,
                value: 1,
            },
            &mut buf,
        )
        .unwrap();
        assert_eq!(&buf[..n], [10, 1, 5, 1]);
        assert!(
            Request::SemaphoreIncrement {
                nc: 0,
                index: 0,
                value: 0
            }
            .is_posted()
        );
        assert!(!Request::SemaphoreRead { nc: 0, index: 0 }.is_posted());
    }

    #[test]
    fn garbage_is_a_decode_error() {
        assert!(matches!(
            decode::<Request>(&[0xFF; 9]),
            Err(CodecError::Decode { .. })
        ));
        assert!(matches!(
            decode::<Request>(&[]),
            Err(CodecError::Decode { .. })
        ));
        let mut buf = [0u8; MAX_MSG_SIZE];
        let n = encode(&Request::DeviceInfo, &mut buf).unwrap();
        assert!(matches!(
            decode::<Request>(&buf[..n + 1]),
            Err(CodecError::TrailingBytes { extra: 1 })
        ));
    }

    #[test]
    fn oversized_messages_are_refused() {
        let mut buf = vec![0u8; 2 * MAX_MSG_SIZE];
        let huge = Reply::error(ErrorKind::BadMessage, "x".repeat(MAX_MSG_SIZE));
        assert!(encode(&huge, &mut buf).is_err());
    }

    #[test]
    fn fd_counts() {
        assert_eq!(Reply::NcClaimed { nc: 0 }.fd_count(), 2);
        assert_eq!(
            Reply::MemMapped {
                handle: 1,
                pa: 0,
                size: 4096
            }
            .fd_count(),
            1
        );
        assert_eq!(Reply::Ok.fd_count(), 0);
    }
}
