//! The emulated device: NC ownership, per-NC state, and request dispatch.
//!
//! [`Device::handle`] answers one [`Request`] of one client with one [`Reply`] (plus the fds
//! it carries), exactly as the control socket would, so every behaviour can be exercised
//! in-process. The server gives each connection a [`ClientId`] ([`Device::connect`]) and
//! reclaims everything the client owned when the connection ends ([`Device::disconnect`]).
//!
//! Ownership follows the driver (`reference/driver-abi.md` §1.2, DESIGN §5): an NC belongs to
//! at most one client (a second claim is refused); memory chunks belong to the client that
//! allocated them; DMA on a client's queues may touch only that client's chunks and the
//! registers of its own NCs.
//!
//! Executions run on one sequencer thread per NC ([`crate::sequencer`]); the device's state
//! lives in an `Arc` shared with those threads, and dropping the [`Device`] stops and joins
//! them.
//!
//! Scenario control: any client may arm faults ([`crate::faults`]), set the latency model
//! ([`crate::timing`]) or read [`DeviceStats`]; faults apply to an NC whatever its owner.
//! A configured trace ([`crate::trace`]) records instructions, DMA runs, doorbells and
//! notifications; with no trace every recording site costs one branch.
//!
//! # Locking
//! Each NC has two locks: `state` (its DMA queues, notification queue and exec-batch count)
//! and `claim` (its owner and register file), plus three leaf locks: `dmem` (its sequencer
//! DMEM), `compute` (its SBUF, PSUM and activation-tables flag) and the sequencer's wake-up
//! state. `memory` guards the address space and `clients` the pids of connected clients. The
//! order is `state` → `claim` and `state` → `memory`; `claim`, `memory`, `clients`, `dmem`,
//! `compute`, the sequencer lock, `faults`, `latency`, the lost hook and the trace buffer are
//! leaves, held only for a lookup, an update or one
//! compute instruction (the sequencer thread sleeps on its lock's condition variable holding
//! nothing else). A DMA of one NC's queue into another NC's SBUF takes that NC's `compute`
//! lock under its own `state` lock, which the leaf rule allows.
//! No thread holds two NCs' `state` locks at once: a DMA write into another NC's
//! tail-increment register is applied after the first NC's lock is released
//! ([`crate::dma::Outcome::Deferred`]). Locks are taken through poison-ignoring helpers, so a
//! request handler that panicked (caught and answered as an error) does not wedge the device.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::os::fd::OwnedFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};
use std::time::Instant;

use shared::address_map::{AddressMap, REG_WINDOW_BASE, Register};
use shared::notification::{
    NQ_MAX_ENTRIES, NotificationEntry, NotificationKind, error_flags, nq_bytes,
};
use shared::protocol::{
    DeviceInfo, DeviceStats, ErrorKind, FaultSpec, LatencyModel, MemLocation, NcCounters,
    PROTOCOL_VERSION, RemoteError, Reply, Request,
};
use shared::sequencer::{EXEC_QUEUE, EXEC_QUEUE_ENGINE, SEM_INFERENCE_START, SEQ_DMEM_SIZE};
use shared::udma::Direction;

use crate::compute::ComputeState;
use crate::config::{Config, ConfigError};
use crate::counters::{Counters, bump};
use crate::dma::{
    self, Abort, Budget, Bus, Deferred, DmaQueues, Fault, Outcome, QueueError, QueueId,
    RegisterWrite, error_chain,
};
use crate::faults::FaultTable;
use crate::memory::{AddressSpace, AllocError, Chunk, Region};
use crate::notify::{NotificationQueue, PostError};
use crate::registers::Registers;
use crate::timing::{self, SimClock};
use crate::trace::{self, DEFAULT_MAX_EVENTS, Detail, Event, Tracer};

/// `NQ_TYPE` NOTIFY, the only notification queue type simdev emulates.
pub const NQ_TYPE_NOTIFY: u32 = 1;

/// One client of the device: one control connection. Unique for the simdev run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// The owner of an NC and the NC's register file for that owner.
#[derive(Debug)]
struct Claim {
    client: ClientId,
    pid: u32,
    registers: Registers,
}

/// An NC's DMA queues and notification queue.
#[derive(Debug)]
struct NcState {
    queues: DmaQueues,
    nq: Option<NotificationQueue>,
    /// Batches the exec queue ran since its DMA_QUEUE_INIT, or the NC's reset, release or
    /// reclaim: the next execution's `compute_idx`.
    exec_batches: u32,
}

/// One NC.
#[derive(Debug)]
struct Nc {
    index: u32,
    counters: Counters,
    claim: Mutex<Option<Arc<Claim>>>,
    state: Mutex<NcState>,
    /// The sequencer DMEM ([`SEQ_DMEM_SIZE`] bytes), written by DMA.
    dmem: Mutex<Vec<u8>>,
    /// SBUF, PSUM and the activation-tables flag: zeroed at claim, reset, release and
    /// reclaim (not between executions).
    compute: Mutex<ComputeState>,
    /// Bumped (under `state`) by every reset, release and reclaim: an execution that started
    /// in an older epoch is abandoned.
    epoch: AtomicU64,
    /// The sequencer thread's wake-up state.
    seq: exec::SeqSync,
    /// The simulated clock (used while a latency model is set).
    clock: SimClock,
}

/// What the device knows of a connected client.
#[derive(Clone, Copy, Debug)]
struct ClientInfo {
    pid: u32,
}

/// What the device does when an injected DeviceLost fault fires, after posting DeviceLost to
/// every claimed NC ([`Device::on_device_lost`]).
#[derive(Clone)]
struct LostHook(Arc<dyn Fn() + Send + Sync>);

impl fmt::Debug for LostHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LostHook")
    }
}

/// The emulated device (see the module doc). `Send + Sync`: share it in an `Arc` between
/// connection threads. Dropping it stops and joins the NCs' sequencer threads.
#[derive(Debug)]
pub struct Device {
    core: Arc<Core>,
}

/// The device's state, shared by the connection threads (through [`Device`]) and the
/// sequencer threads.
#[derive(Debug)]
struct Core {
    /// This core, for starting sequencer threads.
    me: Weak<Core>,
    map: AddressMap,
    info: DeviceInfo,
    ncs: Vec<Nc>,
    memory: RwLock<AddressSpace>,
    clients: Mutex<HashMap<ClientId, ClientInfo>>,
    next_client: AtomicU64,
    start: Instant,
    budget_pairs: AtomicU64,
    budget_bytes: AtomicU64,
    /// [`Device::device_lost`] ran: no execution starts or posts any more.
    lost: AtomicBool,
    /// Armed faults.
    faults: Mutex<FaultTable>,
    /// The latency model of every NC.
    latency: Mutex<LatencyModel>,
    /// Whether `latency` is not the default (device time is simulated), readable without the
    /// lock.
    simulated: AtomicBool,
    /// Called when an injected DeviceLost fault fires.
    lost_hook: Mutex<Option<LostHook>>,
    /// The trace (disabled unless configured).
    tracer: Tracer,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

fn refuse(kind: ErrorKind, message: impl Into<String>) -> RemoteError {
    RemoteError {
        kind,
        message: message.into(),
    }
}

fn alloc_refusal(err: &AllocError) -> RemoteError {
    let kind = match err {
        AllocError::BadSize { .. } | AllocError::BadAlign { .. } => ErrorKind::InvalidArgument,
        AllocError::NoSuchNc { .. } => ErrorKind::OutOfRange,
        AllocError::OutOfMemory { .. } | AllocError::MapChunk { .. } => ErrorKind::OutOfMemory,
        AllocError::CreateMemfd { source, .. } | AllocError::SizeMemfd { source, .. } => {
            if matches!(
                source,
                nix::Error::ENOMEM | nix::Error::ENOSPC | nix::Error::EFBIG
            ) {
                ErrorKind::OutOfMemory
            } else {
                ErrorKind::Internal
            }
        }
    };
    refuse(kind, error_chain(err))
}

fn queue_refusal(err: &QueueError) -> RemoteError {
    let kind = match err {
        QueueError::OutOfRange { .. } | QueueError::Overrun { .. } => ErrorKind::OutOfRange,
        QueueError::RingSize { .. } | QueueError::RingTooSmall { .. } => ErrorKind::BadRing,
        QueueError::NotInitialized { .. } | QueueError::Stopped { .. } => ErrorKind::QueueStopped,
        QueueError::ZeroRx | QueueError::ZeroIncrement => ErrorKind::InvalidArgument,
    };
    refuse(kind, err.to_string())
}

fn os_refusal(what: &str, err: &dyn std::error::Error) -> RemoteError {
    refuse(ErrorKind::Internal, format!("{what}: {}", error_chain(err)))
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic")
}

/// The NC a request addresses, if any.
const fn request_nc(request: &Request) -> Option<u32> {
    match *request {
        Request::ClaimNc { nc }
        | Request::ReleaseNc { nc }
        | Request::DmaQueueInit { nc, .. }
        | Request::DmaQueueRelease { nc, .. }
        | Request::DmaQueueCopyStart { nc, .. }
        | Request::SemaphoreIncrement { nc, .. }
        | Request::SemaphoreDecrement { nc, .. }
        | Request::SemaphoreRead { nc, .. }
        | Request::SemaphoreWrite { nc, .. }
        | Request::EventSet { nc, .. }
        | Request::EventGet { nc, .. }
        | Request::NotificationInit { nc, .. }
        | Request::NcReset { nc }
        | Request::Counters { nc }
        | Request::InjectFault(FaultSpec { nc: Some(nc), .. }) => Some(nc),
        Request::MemAlloc {
            location: MemLocation::Hbm { nc },
            ..
        } => Some(nc),
        Request::Hello { .. }
        | Request::DeviceInfo
        | Request::MemAlloc { .. }
        | Request::MemFree { .. }
        | Request::MemMap { .. }
        | Request::InjectFault(_)
        | Request::ClearFaults
        | Request::SetLatency(_)
        | Request::DeviceStats => None,
    }
}

type Handled = Result<(Reply, Vec<OwnedFd>), RemoteError>;

fn ok() -> Handled {
    Ok((Reply::Ok, Vec::new()))
}

fn reply(reply: Reply) -> Handled {
    Ok((reply, Vec::new()))
}

impl Device {
    /// A device as `config` describes it (the socket and uid fields are the server's), with
    /// nothing claimed or allocated.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is out of range.
    pub fn new(config: &Config) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            core: Arc::new_cyclic(|me| Core::new(config, me.clone())),
        })
    }

    /// Bounds the DMA work of one doorbell (or one execution) to `pairs` descriptor pairs and
    /// `bytes` bytes (defaults: [`dma::DEFAULT_BUDGET_PAIRS`], [`dma::DEFAULT_BUDGET_BYTES`]).
    /// A queue that exceeds it is stopped with a DMA abort.
    #[must_use]
    pub fn with_dma_budget(self, pairs: u64, bytes: u64) -> Self {
        self.core.budget_pairs.store(pairs, Ordering::Relaxed);
        self.core.budget_bytes.store(bytes, Ordering::Relaxed);
        self
    }

    /// The device's static facts (the handshake's answer).
    pub fn info(&self) -> &DeviceInfo {
        &self.core.info
    }

    /// The device's address map.
    pub fn address_map(&self) -> &AddressMap {
        &self.core.map
    }

    /// Registers a new client (a connection from process `pid`).
    pub fn connect(&self, pid: u32) -> ClientId {
        self.core.connect(pid)
    }

    /// The client went away (EOF, reset, kill -9): stops and forgets the queues and
    /// notification queues of its NCs, abandons their executions, zeroes their registers and
    /// DMEM, clears their ownership, and frees all its memory chunks.
    pub fn disconnect(&self, client: ClientId) {
        self.core.disconnect(client);
    }

    /// The counters of NC `nc`, `None` when it does not exist.
    pub fn counters(&self, nc: u32) -> Option<NcCounters> {
        self.core.counters(nc)
    }

    /// The device is going away: posts a DeviceLost notification (error flag
    /// [`error_flags::DEVICE_LOST`]) to every claimed NC's notification queue and signals its
    /// eventfd. Executions in progress or parked are abandoned without a notification of their
    /// own, and no execution starts afterwards. Only the first call posts.
    pub fn device_lost(&self) {
        self.core.device_lost();
    }

    /// Whether the device is lost ([`Device::device_lost`] ran, or a DeviceLost fault fired).
    pub fn is_lost(&self) -> bool {
        self.core.lost.load(Ordering::SeqCst)
    }

    /// Sets what happens when an injected DeviceLost fault fires, after the device posted
    /// DeviceLost to every claimed NC: the server removes its socket and stops, so that the
    /// `simdev` process exits with status 3. Without a hook the device just stays lost. The
    /// hook runs on the sequencer thread of the NC whose execution fired the fault.
    pub fn on_device_lost(&self, hook: impl Fn() + Send + Sync + 'static) {
        *lock(&self.core.lost_hook) = Some(LostHook(Arc::new(hook)));
    }

    /// Device-wide usage (what [`Request::DeviceStats`] answers).
    pub fn stats(&self) -> DeviceStats {
        self.core.stats()
    }

    /// How many injected faults fired on NC `nc`'s executions, `None` when it does not exist.
    pub fn faults_fired(&self, nc: u32) -> Option<u64> {
        self.core
            .nc_ref(nc)
            .map(|n| n.counters.faults_fired.load(Ordering::Relaxed))
    }

    /// Writes the trace file (every event so far) when a trace is configured; `None` when not.
    /// simdev calls it once at start (to fail early on an unwritable path) and when it stops.
    ///
    /// # Errors
    /// Creating or writing the file.
    pub fn write_trace(&self) -> std::io::Result<Option<trace::Summary>> {
        let clock = if self.core.simulated() {
            "simulated"
        } else {
            "wall"
        };
        self.core.tracer.write(clock)
    }

    /// What the trace holds (its file, events kept and dropped); `None` without a trace.
    pub fn trace_summary(&self) -> Option<trace::Summary> {
        self.core.tracer.summary()
    }

    /// Answers `request` of `client`: the reply and the fds it carries (see
    /// [`Reply::fd_count`]). Never panics on client input; a panic inside a handler (a simdev
    /// bug) is caught and answered as an error. Posted requests ([`Request::is_posted`]) are
    /// handled the same way, but the caller sends no reply: a failure is logged and counted in
    /// the NC's `posted_errors`. A doorbell (SemaphoreIncrement of
    /// [`SEM_INFERENCE_START`]) only wakes the NC's sequencer thread; it never waits for the
    /// execution.
    pub fn handle(&self, client: ClientId, request: Request) -> (Reply, Vec<OwnedFd>) {
        self.core.handle(client, request)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.core.stop_sequencers();
    }
}

impl Core {
    fn new(config: &Config, me: Weak<Core>) -> Self {
        let map = config.address_map();
        let arch = map.arch;
        let info = DeviceInfo {
            arch,
            nc_count: map.nc_count,
            hbm_bytes_per_nc: map.hbm_bytes_per_nc,
            hbm_bases: (0..map.nc_count)
                .map(|nc| map.hbm_range(nc).start)
                .collect(),
            host_base: arch.host_base(),
            reg_base: REG_WINDOW_BASE,
            semaphores_per_nc: arch.semaphores_per_nc(),
            events_per_nc: arch.events_per_nc(),
            dma_engines_per_nc: arch.dma_engines_per_nc(),
            dma_queues_per_engine: arch.dma_queues_per_engine(),
            description: format!(
                "simdev {} pid {}",
                env!("CARGO_PKG_VERSION"),
                std::process::id()
            ),
        };
        let dmem_bytes = usize::try_from(SEQ_DMEM_SIZE).unwrap_or(4096);
        let ncs = (0..map.nc_count)
            .map(|index| Nc {
                index,
                counters: Counters::default(),
                claim: Mutex::new(None),
                state: Mutex::new(NcState {
                    queues: DmaQueues::new(map, index),
                    nq: None,
                    exec_batches: 0,
                }),
                dmem: Mutex::new(vec![0; dmem_bytes]),
                compute: Mutex::new(ComputeState::new()),
                epoch: AtomicU64::new(0),
                clock: SimClock::default(),
                seq: exec::SeqSync::default(),
            })
            .collect();
        Self {
            me,
            map,
            info,
            ncs,
            memory: RwLock::new(AddressSpace::new(map)),
            clients: Mutex::new(HashMap::new()),
            next_client: AtomicU64::new(1),
            start: Instant::now(),
            budget_pairs: AtomicU64::new(dma::DEFAULT_BUDGET_PAIRS),
            budget_bytes: AtomicU64::new(dma::DEFAULT_BUDGET_BYTES),
            lost: AtomicBool::new(false),
            faults: Mutex::new(FaultTable::default()),
            latency: Mutex::new(LatencyModel::default()),
            simulated: AtomicBool::new(false),
            lost_hook: Mutex::new(None),
            tracer: config.trace.clone().map_or_else(Tracer::disabled, |path| {
                Tracer::to_file(path, map.nc_count, DEFAULT_MAX_EVENTS)
            }),
        }
    }

    /// A fresh budget for one doorbell or one execution.
    fn budget(&self) -> Budget {
        Budget::new(
            self.budget_pairs.load(Ordering::Relaxed),
            self.budget_bytes.load(Ordering::Relaxed),
        )
    }

    fn connect(&self, pid: u32) -> ClientId {
        let client = ClientId(self.next_client.fetch_add(1, Ordering::Relaxed));
        lock(&self.clients).insert(client, ClientInfo { pid });
        client
    }

    fn disconnect(&self, client: ClientId) {
        let mut ncs = 0;
        for nc in &self.ncs {
            if self.owned_by(nc, client) {
                self.reset_nc(nc, client, true);
                ncs += 1;
            }
        }
        let chunks = write(&self.memory).free_all(client);
        let pid = lock(&self.clients).remove(&client).map_or(0, |c| c.pid);
        tracing::info!(
            "client {} (pid {pid}) gone: reclaimed {ncs} NCs and {chunks} chunks",
            client.0
        );
    }

    fn counters(&self, nc: u32) -> Option<NcCounters> {
        self.nc_ref(nc).map(|n| n.counters.snapshot())
    }

    fn device_lost(&self) {
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        for nc in &self.ncs {
            // Wakes a parked execution, which sees `lost` and ends without a notification.
            nc.seq.changed();
        }
        for nc in &self.ncs {
            if self.owner(nc).is_none() {
                continue;
            }
            let mut state = lock(&nc.state);
            let entry = self.entry(
                nc,
                NotificationKind::DeviceLost,
                0,
                error_flags::DEVICE_LOST,
            );
            self.post(nc, &mut state, &entry);
        }
    }

    fn handle(&self, client: ClientId, request: Request) -> (Reply, Vec<OwnedFd>) {
        let name = request.name();
        let posted = request.is_posted();
        let nc = request_nc(&request);
        let outcome = catch_unwind(AssertUnwindSafe(|| self.dispatch(client, request)));
        let (reply, fds) = match outcome {
            Ok(Ok(answer)) => answer,
            Ok(Err(err)) => (Reply::Error(err), Vec::new()),
            Err(payload) => {
                let what = panic_text(payload.as_ref());
                tracing::error!("handling {name} panicked: {what}");
                let err = refuse(
                    ErrorKind::Internal,
                    format!("simdev failed internally handling {name} (a simdev bug): {what}"),
                );
                (Reply::Error(err), Vec::new())
            }
        };
        if let Reply::Error(err) = &reply {
            if posted {
                tracing::warn!("posted {name} of client {} failed: {err}", client.0);
                if let Some(n) = nc.and_then(|nc| self.nc_ref(nc)) {
                    bump(&n.counters.posted_errors, 1);
                }
            } else {
                tracing::debug!("{name} of client {} refused: {err}", client.0);
            }
        }
        (reply, fds)
    }

    fn dispatch(&self, client: ClientId, request: Request) -> Handled {
        match request {
            Request::Hello { version } => self.hello(version),
            Request::DeviceInfo => reply(Reply::DeviceInfo(self.info.clone())),
            Request::ClaimNc { nc } => self.claim_nc(client, nc),
            Request::ReleaseNc { nc } => {
                let (n, _) = self.owned(client, nc)?;
                self.reset_nc(n, client, true);
                ok()
            }
            Request::MemAlloc {
                location,
                size,
                align,
            } => self.mem_alloc(client, location, size, align),
            Request::MemFree { handle } => {
                write(&self.memory)
                    .free(client, handle)
                    .map_err(|e| refuse(ErrorKind::BadHandle, e.to_string()))?;
                ok()
            }
            Request::MemMap { handle } => self.mem_map(client, handle),
            Request::DmaQueueInit {
                nc,
                engine,
                queue,
                tx_ring,
                tx_desc_count,
                rx_ring,
                rx_desc_count,
            } => self.dma_queue_init(
                client,
                QueueId { nc, engine, queue },
                (tx_ring, tx_desc_count),
                (rx_ring, rx_desc_count),
            ),
            Request::DmaQueueRelease { nc, engine, queue } => {
                let (n, _) = self.owned(client, nc)?;
                lock(&n.state)
                    .queues
                    .release(engine, queue)
                    .map_err(|e| queue_refusal(&e))?;
                ok()
            }
            Request::DmaQueueCopyStart {
                nc,
                engine,
                queue,
                tx_desc_count,
                rx_desc_count,
            } => {
                let (n, _) = self.owned(client, nc)?;
                lock(&n.state)
                    .queues
                    .post(engine, queue, tx_desc_count, rx_desc_count)
                    .map_err(|e| queue_refusal(&e))?;
                self.run_dma(client, QueueId { nc, engine, queue });
                ok()
            }
            Request::SemaphoreIncrement { nc, index, value } => {
                if let Some(n) = self.nc_ref(nc) {
                    bump(&n.counters.doorbells, 1);
                }
                let (n, c) = self.owned(client, nc)?;
                c.registers.semaphore_add(index, value).map_err(range)?;
                if self.tracer.enabled() {
                    self.trace_doorbell(n, index, value);
                }
                self.registers_changed(n, index == SEM_INFERENCE_START);
                ok()
            }
            Request::SemaphoreDecrement { nc, index, value } => {
                let (n, c) = self.owned(client, nc)?;
                c.registers.semaphore_sub(index, value).map_err(range)?;
                self.registers_changed(n, false);
                ok()
            }
            Request::SemaphoreRead { nc, index } => {
                let (_, c) = self.owned(client, nc)?;
                reply(Reply::Value(c.registers.semaphore(index).map_err(range)?))
            }
            Request::SemaphoreWrite { nc, index, value } => {
                let (n, c) = self.owned(client, nc)?;
                c.registers.semaphore_set(index, value).map_err(range)?;
                self.registers_changed(n, index == SEM_INFERENCE_START);
                ok()
            }
            Request::EventSet { nc, index, value } => {
                let (n, c) = self.owned(client, nc)?;
                c.registers.event_set(index, value).map_err(range)?;
                self.registers_changed(n, false);
                ok()
            }
            Request::EventGet { nc, index } => {
                let (_, c) = self.owned(client, nc)?;
                reply(Reply::Value(c.registers.event(index).map_err(range)?))
            }
            Request::NotificationInit {
                nc,
                nq_type,
                entries,
            } => self.notification_init(client, nc, nq_type, entries),
            Request::NcReset { nc } => {
                let (n, _) = self.owned(client, nc)?;
                self.reset_nc(n, client, false);
                bump(&n.counters.resets, 1);
                ok()
            }
            Request::Counters { nc } => reply(Reply::Counters(self.nc(nc)?.counters.snapshot())),
            Request::InjectFault(spec) => self.inject_fault(spec),
            Request::ClearFaults => {
                let disarmed = lock(&self.faults).clear();
                tracing::info!("{disarmed} armed faults cleared");
                ok()
            }
            Request::SetLatency(model) => {
                self.set_latency(model);
                ok()
            }
            Request::DeviceStats => reply(Reply::DeviceStats(self.stats())),
        }
    }

    fn inject_fault(&self, spec: FaultSpec) -> Handled {
        if let Some(nc) = spec.nc {
            self.nc(nc)?;
        }
        lock(&self.faults)
            .arm(spec)
            .map_err(|e| refuse(ErrorKind::InvalidArgument, e.to_string()))?;
        tracing::info!("fault armed: {spec:?}");
        ok()
    }

    /// Sets the latency model; every NC's simulated clock restarts at 0.
    fn set_latency(&self, model: LatencyModel) {
        let mut current = lock(&self.latency);
        *current = model;
        for nc in &self.ncs {
            nc.clock.reset();
        }
        self.simulated
            .store(!timing::is_wall_clock(&model), Ordering::SeqCst);
        drop(current);
        tracing::info!("latency model set: {model:?}");
    }

    /// The latency model, `None` when device time follows the wall clock.
    fn latency_model(&self) -> Option<LatencyModel> {
        let model = *lock(&self.latency);
        (!timing::is_wall_clock(&model)).then_some(model)
    }

    /// Whether device time is simulated (a latency model is set).
    fn simulated(&self) -> bool {
        self.simulated.load(Ordering::Relaxed)
    }

    fn stats(&self) -> DeviceStats {
        let (memory_in_use, chunks) = {
            let memory = read(&self.memory);
            (memory.bytes_in_use(), memory.chunk_count())
        };
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let claimed = self.ncs.iter().filter(|n| self.owner(n).is_some()).count();
        let queues: usize = self
            .ncs
            .iter()
            .map(|n| lock(&n.state).queues.initialised())
            .sum();
        DeviceStats {
            memory_in_use,
            chunks: u64::try_from(chunks).unwrap_or(u64::MAX),
            clients: count(lock(&self.clients).len()),
            claimed_ncs: count(claimed),
            dma_queues: count(queues),
            armed_faults: count(lock(&self.faults).len()),
        }
    }

    fn hello(&self, version: u32) -> Handled {
        if version != PROTOCOL_VERSION {
            return Err(refuse(
                ErrorKind::Handshake,
                format!("protocol version {version} is not simdev's version {PROTOCOL_VERSION}"),
            ));
        }
        reply(Reply::Hello {
            version: PROTOCOL_VERSION,
            device: self.info.clone(),
        })
    }

    fn nc_ref(&self, nc: u32) -> Option<&Nc> {
        usize::try_from(nc).ok().and_then(|i| self.ncs.get(i))
    }

    fn nc(&self, nc: u32) -> Result<&Nc, RemoteError> {
        self.nc_ref(nc).ok_or_else(|| {
            refuse(
                ErrorKind::OutOfRange,
                format!(
                    "NC {nc} does not exist (the device has {} NCs)",
                    self.ncs.len()
                ),
            )
        })
    }

    fn owner(&self, nc: &Nc) -> Option<Arc<Claim>> {
        lock(&nc.claim).clone()
    }

    fn owned_by(&self, nc: &Nc, client: ClientId) -> bool {
        self.owner(nc).is_some_and(|c| c.client == client)
    }

    /// NC `nc` and its claim, if `client` owns it.
    fn owned(&self, client: ClientId, nc: u32) -> Result<(&Nc, Arc<Claim>), RemoteError> {
        let n = self.nc(nc)?;
        match self.owner(n) {
            Some(claim) if claim.client == client => Ok((n, claim)),
            Some(claim) => Err(refuse(
                ErrorKind::NotOwner,
                format!("NC {nc} is owned by pid {}, not by this client", claim.pid),
            )),
            None => Err(refuse(
                ErrorKind::NotOwner,
                format!("NC {nc} is not claimed by this client (ClaimNc first)"),
            )),
        }
    }

    fn pid_of(&self, client: ClientId) -> u32 {
        lock(&self.clients).get(&client).map_or(0, |c| c.pid)
    }

    fn claim_nc(&self, client: ClientId, nc: u32) -> Handled {
        let n = self.nc(nc)?;
        let pid = self.pid_of(client);
        let mut slot = lock(&n.claim);
        if let Some(claim) = slot.as_ref() {
            if claim.client != client {
                return Err(refuse(
                    ErrorKind::NcBusy,
                    format!("NC {nc} is owned by another client (pid {})", claim.pid),
                ));
            }
            let fds = claim
                .registers
                .client_fds()
                .map_err(|e| os_refusal("claiming the NC", &e))?;
            return Ok((Reply::NcClaimed { nc }, fds));
        }
        let registers =
            Registers::new(&self.map, nc).map_err(|e| os_refusal("claiming the NC", &e))?;
        lock(&n.compute).clear();
        let fds = registers
            .client_fds()
            .map_err(|e| os_refusal("claiming the NC", &e))?;
        *slot = Some(Arc::new(Claim {
            client,
            pid,
            registers,
        }));
        tracing::info!("NC {nc} claimed by client {} (pid {pid})", client.0);
        Ok((Reply::NcClaimed { nc }, fds))
    }

    /// Stops and forgets `nc`'s queues, drops its notification queue (freeing its chunk),
    /// abandons its execution (parked or running) and restarts its `compute_idx` count, zeroes
    /// its registers, DMEM, SBUF and PSUM, forgets its activation tables and, when `release`,
    /// clears its owner.
    fn reset_nc(&self, nc: &Nc, owner: ClientId, release: bool) {
        let nq = {
            let mut state = lock(&nc.state);
            // The epoch moves before the compute state is cleared: an engine checks it under
            // the `compute` lock, so nothing an abandoned execution computes survives.
            nc.epoch.fetch_add(1, Ordering::AcqRel);
            state.queues.clear();
            state.exec_batches = 0;
            lock(&nc.dmem).fill(0);
            lock(&nc.compute).clear();
            state.nq.take()
        };
        nc.seq.changed();
        if let Some(nq) = nq {
            // The client may have freed the chunk itself; then there is nothing left to free.
            let _ = write(&self.memory).free(owner, nq.chunk().handle());
        }
        let mut slot = lock(&nc.claim);
        if let Some(claim) = slot.as_ref() {
            claim.registers.zero();
        }
        if release {
            *slot = None;
            tracing::info!("NC {} released", nc.index);
        }
    }

    fn mem_alloc(&self, client: ClientId, location: MemLocation, size: u64, align: u64) -> Handled {
        if let MemLocation::Hbm { nc } = location {
            self.owned(client, nc)?;
        }
        let chunk = write(&self.memory)
            .allocate(client, Region::from(location), size, align)
            .map_err(|e| alloc_refusal(&e))?;
        reply(Reply::MemAllocated {
            handle: chunk.handle(),
            pa: chunk.pa(),
            size: chunk.size(),
        })
    }

    fn mem_map(&self, client: ClientId, handle: u64) -> Handled {
        let chunk = read(&self.memory)
            .get(client, handle)
            .map_err(|e| refuse(ErrorKind::BadHandle, e.to_string()))?;
        let fd = chunk
            .memfd()
            .try_clone_to_owned()
            .map_err(|e| os_refusal("duplicating the chunk's memfd", &e))?;
        Ok((
            Reply::MemMapped {
                handle,
                pa: chunk.pa(),
                size: chunk.size(),
            },
            vec![fd],
        ))
    }

    fn chunk(&self, client: ClientId, handle: u64) -> Result<Arc<Chunk>, RemoteError> {
        read(&self.memory)
            .get(client, handle)
            .map_err(|e| refuse(ErrorKind::BadHandle, format!("ring {e}")))
    }

    fn dma_queue_init(
        &self,
        client: ClientId,
        id: QueueId,
        tx: (u64, u32),
        rx: (u64, u32),
    ) -> Handled {
        let (n, _) = self.owned(client, id.nc)?;
        let mut state = lock(&n.state);
        let queues = &mut state.queues;
        queues
            .check_id(id.engine, id.queue)
            .map_err(|e| queue_refusal(&e))?;
        dma::check_ring_size(Direction::Tx, tx.1).map_err(|e| queue_refusal(&e))?;
        dma::check_ring_size(Direction::Rx, rx.1).map_err(|e| queue_refusal(&e))?;
        let tx_chunk = self.chunk(client, tx.0)?;
        let rx_chunk = self.chunk(client, rx.0)?;
        queues
            .init(id.engine, id.queue, (tx_chunk, tx.1), (rx_chunk, rx.1))
            .map_err(|e| queue_refusal(&e))?;
        if (id.engine, id.queue) == (EXEC_QUEUE_ENGINE, EXEC_QUEUE) {
            state.exec_batches = 0;
            lock(&n.compute).set_tables_loaded(false);
        }
        ok()
    }

    fn notification_init(&self, client: ClientId, nc: u32, nq_type: u32, entries: u32) -> Handled {
        let (n, _) = self.owned(client, nc)?;
        if nq_type != NQ_TYPE_NOTIFY {
            return Err(refuse(
                ErrorKind::Unsupported,
                format!(
                    "NQ type {nq_type} is not emulated; simdev posts every notification of an NC \
                     to its NOTIFY ({NQ_TYPE_NOTIFY}) queue"
                ),
            ));
        }
        if !entries.is_power_of_two() || !(2..=NQ_MAX_ENTRIES).contains(&entries) {
            return Err(refuse(
                ErrorKind::InvalidArgument,
                format!("{entries} NQ entries: must be a power of two from 2 to {NQ_MAX_ENTRIES}"),
            ));
        }
        let bytes = u64::try_from(nq_bytes(entries)).unwrap_or(u64::MAX);
        let chunk = write(&self.memory)
            .allocate(client, Region::Host, bytes, 0)
            .map_err(|e| alloc_refusal(&e))?;
        let answer = Reply::NotificationQueue {
            handle: chunk.handle(),
            pa: chunk.pa(),
            size: chunk.size(),
            entries,
        };
        let old = lock(&n.state)
            .nq
            .replace(NotificationQueue::new(chunk, entries));
        if let Some(old) = old {
            let _ = write(&self.memory).free(client, old.chunk().handle());
        }
        reply(answer)
    }

    /// Processes queue `first` and every queue its descriptors start, one at a time, within one
    /// [`Budget`]; aborts post DmaQueueError notifications.
    fn run_dma(&self, client: ClientId, first: QueueId) {
        let mut budget = self.budget();
        self.run_dma_with(
            client,
            first,
            &mut budget,
            &mut Aborts::Notify,
            TraceAt::Now,
        );
    }

    /// Processes queue `first` and every queue its descriptors start, one at a time, within
    /// `budget`; each abort goes to `aborts`. Each run of a queue is traced at `at`.
    fn run_dma_with(
        &self,
        client: ClientId,
        first: QueueId,
        budget: &mut Budget,
        aborts: &mut Aborts<'_>,
        at: TraceAt,
    ) {
        let mut worklist = VecDeque::from([first]);
        while let Some(id) = worklist.pop_front() {
            let Some(nc) = self.nc_ref(id.nc) else {
                continue;
            };
            if !self.owned_by(nc, client) {
                continue;
            }
            let mut state = lock(&nc.state);
            loop {
                let mark = self.tracer.enabled().then(|| DmaMark::take(self, nc));
                let mut bus = ClientBus {
                    device: self,
                    client,
                    worklist: &mut worklist,
                };
                let outcome =
                    state
                        .queues
                        .process(id.engine, id.queue, &mut bus, budget, &nc.counters);
                let done = match outcome {
                    Outcome::Idle => true,
                    Outcome::Aborted(abort) => {
                        self.on_abort(nc, &mut state, abort, aborts);
                        true
                    }
                    Outcome::Deferred(deferred) => {
                        drop(state);
                        let result = self.remote_tail_increment(client, &deferred, &mut worklist);
                        state = lock(&nc.state);
                        let abort = state
                            .queues
                            .finish_deferred(&deferred, result, &nc.counters);
                        abort.is_some_and(|abort| {
                            self.on_abort(nc, &mut state, abort, aborts);
                            true
                        })
                    }
                };
                if let Some(mark) = mark {
                    let pairs = (nc.counters.dma_descriptors.load(Ordering::Relaxed))
                        .saturating_sub(mark.pairs);
                    let bytes =
                        (nc.counters.dma_bytes.load(Ordering::Relaxed)).saturating_sub(mark.bytes);
                    self.trace_dma(nc, id, pairs, bytes, false, at, mark.wall_ns);
                }
                if done {
                    break;
                }
            }
        }
    }

    /// Applies a tail increment that a queue of another NC wrote (its NC's lock is not held).
    fn remote_tail_increment(
        &self,
        client: ClientId,
        deferred: &Deferred,
        worklist: &mut VecDeque<QueueId>,
    ) -> Result<(), Fault> {
        let reg = deferred.reg;
        let value = deferred.value;
        let (nc, engine, queue, dir) = match reg {
            Register::TxTailIncrement { nc, engine, queue } => (nc, engine, queue, Direction::Tx),
            Register::RxTailIncrement { nc, engine, queue } => (nc, engine, queue, Direction::Rx),
            _ => {
                return Err(Fault::UnknownRegister {
                    pa: self.map.register_address(reg),
                });
            }
        };
        let foreign = Fault::ForeignRegister { reg, nc };
        let Some(n) = self.nc_ref(nc) else {
            return Err(foreign);
        };
        if !self.owned_by(n, client) {
            return Err(foreign);
        }
        lock(&n.state)
            .queues
            .tail_increment(engine, queue, dir, value)
            .map_err(|source| Fault::TailIncrement { reg, value, source })?;
        schedule(worklist, QueueId { nc, engine, queue });
        Ok(())
    }

    fn on_abort(&self, nc: &Nc, state: &mut NcState, abort: Abort, aborts: &mut Aborts<'_>) {
        match aborts {
            Aborts::Notify => self.report_abort(nc, state, &abort),
            Aborts::Capture(list) => {
                tracing::warn!("{} (during an execution)", abort.reason);
                list.push(abort);
            }
        }
    }

    fn report_abort(&self, nc: &Nc, state: &mut NcState, abort: &Abort) {
        tracing::warn!("{}", abort.reason);
        let source = (abort.queue.engine << 8) | abort.queue.queue;
        let mut flags = error_flags::DMA_ABORT;
        if abort.oob {
            flags |= error_flags::OOB;
        }
        let entry = self.entry(
            nc,
            NotificationKind::DmaQueueError,
            u16::try_from(source).unwrap_or(u16::MAX),
            flags,
        );
        self.post(nc, state, &entry);
    }

    /// Nanoseconds since simdev started (the wall-clock device timestamp of notifications).
    fn now_ns(&self) -> u64 {
        self.since_start_ns(Instant::now())
    }

    /// Nanoseconds from simdev's start to `t`.
    fn since_start_ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX)
    }

    /// `nc`'s device time: its simulated clock while a latency model is set, else the wall
    /// clock.
    fn device_time_ns(&self, nc: &Nc) -> u64 {
        if self.simulated() {
            nc.clock.now()
        } else {
            self.now_ns()
        }
    }

    fn entry(&self, nc: &Nc, kind: NotificationKind, source: u16, flags: u32) -> NotificationEntry {
        NotificationEntry {
            compute_idx: 0,
            kind: kind as u16,
            source,
            error_flags: flags,
            phase: 0,
            device_ts_ns: self.device_time_ns(nc),
            nc_ts_ns: 0,
        }
    }

    fn trace_doorbell(&self, nc: &Nc, semaphore: u32, value: u32) {
        self.tracer.record(Event {
            nc: nc.index,
            ts_ns: self.device_time_ns(nc),
            dur_ns: None,
            detail: Detail::Doorbell { semaphore, value },
        });
    }

    /// Records a run of queue `id` that completed `pairs` pairs of `bytes` bytes (nothing when
    /// it completed none); `wall_ns` is when it began on the wall clock.
    #[expect(clippy::too_many_arguments, reason = "one event's fields")]
    fn trace_dma(
        &self,
        nc: &Nc,
        id: QueueId,
        pairs: u64,
        bytes: u64,
        batch: bool,
        at: TraceAt,
        wall_ns: u64,
    ) {
        if pairs == 0 {
            return;
        }
        let (ts_ns, dur_ns) = match at {
            TraceAt::Sim(ts) => (ts, 0),
            TraceAt::Now if self.simulated() => (nc.clock.now(), 0),
            TraceAt::Now => (wall_ns, self.now_ns().saturating_sub(wall_ns)),
        };
        self.tracer.record(Event {
            nc: nc.index,
            ts_ns,
            dur_ns: Some(dur_ns),
            detail: Detail::Dma {
                engine: id.engine,
                queue: id.queue,
                pairs,
                bytes,
                batch,
            },
        });
    }

    /// Posts `entry` to `nc`'s notification queue and signals the NC's eventfd; counts a drop
    /// when the queue is full or absent.
    fn post(&self, nc: &Nc, state: &mut NcState, entry: &NotificationEntry) {
        let posted = self.post_entry(nc, state, entry);
        if self.tracer.enabled() {
            self.tracer.record(Event {
                nc: nc.index,
                ts_ns: entry.device_ts_ns,
                dur_ns: None,
                detail: Detail::Notification {
                    kind: entry.kind,
                    compute_idx: entry.compute_idx,
                    flags: entry.error_flags,
                    source: entry.source,
                    dropped: !posted,
                },
            });
        }
    }

    /// [`Core::post`] without the trace; whether the entry was written.
    fn post_entry(&self, nc: &Nc, state: &mut NcState, entry: &NotificationEntry) -> bool {
        let Some(nq) = state.nq.as_mut() else {
            bump(&nc.counters.nq_overflows, 1);
            tracing::info!(
                "NC {} has no notification queue; kind {} notification dropped",
                nc.index,
                entry.kind
            );
            return false;
        };
        match nq.post(entry) {
            Ok(()) => {
                bump(&nc.counters.notifications, 1);
                if let Some(claim) = self.owner(nc) {
                    claim.registers.signal();
                }
                true
            }
            Err(PostError::Full { entries }) => {
                bump(&nc.counters.nq_overflows, 1);
                tracing::warn!(
                    "NC {} notification queue full ({entries} entries unconsumed); notification dropped",
                    nc.index
                );
                false
            }
            Err(e @ PostError::Memory(_)) => {
                bump(&nc.counters.nq_overflows, 1);
                tracing::error!("NC {}: {}", nc.index, error_chain(&e));
                false
            }
        }
    }
}

/// The trace time of a DMA run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TraceAt {
    /// The NC's device time when it runs (measured on the wall clock without a latency model).
    Now,
    /// This simulated time (inside an execution, under a latency model).
    Sim(u64),
}

/// Counters and time at the start of a traced DMA run.
struct DmaMark {
    wall_ns: u64,
    pairs: u64,
    bytes: u64,
}

impl DmaMark {
    fn take(core: &Core, nc: &Nc) -> Self {
        Self {
            wall_ns: core.now_ns(),
            pairs: nc.counters.dma_descriptors.load(Ordering::Relaxed),
            bytes: nc.counters.dma_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Where the aborts of a DMA run go.
enum Aborts<'a> {
    /// A DmaQueueError notification each (a doorbell's DMA).
    Notify,
    /// Collected for the execution that started the DMA, which reports them itself.
    Capture(&'a mut Vec<Abort>),
}

fn range(err: crate::registers::BadIndex) -> RemoteError {
    refuse(ErrorKind::OutOfRange, err.to_string())
}

fn schedule(worklist: &mut VecDeque<QueueId>, queue: QueueId) {
    if !worklist.contains(&queue) {
        worklist.push_back(queue);
    }
}

/// One client's view of the device for its DMA.
struct ClientBus<'a> {
    device: &'a Core,
    client: ClientId,
    worklist: &'a mut VecDeque<QueueId>,
}

impl Bus for ClientBus<'_> {
    fn resolve(&self, pa: u64, len: usize) -> Option<Arc<Chunk>> {
        read(&self.device.memory).resolve(self.client, pa, len).ok()
    }

    fn write_register(&mut self, reg: Register, value: u32) -> Result<RegisterWrite, Fault> {
        let nc = match reg {
            Register::Event { nc, .. }
            | Register::SemaphoreRead { nc, .. }
            | Register::SemaphoreSet { nc, .. }
            | Register::SemaphoreIncrement { nc, .. }
            | Register::SemaphoreDecrement { nc, .. }
            | Register::TxTailIncrement { nc, .. }
            | Register::RxTailIncrement { nc, .. } => nc,
        };
        let claim = self
            .device
            .nc_ref(nc)
            .and_then(|n| self.device.owner(n))
            .filter(|c| c.client == self.client)
            .ok_or(Fault::ForeignRegister { reg, nc })?;
        match reg {
            Register::TxTailIncrement { .. } | Register::RxTailIncrement { .. } => {
                Ok(RegisterWrite::Deferred)
            }
            _ => {
                claim
                    .registers
                    .write(reg, value)
                    .map_err(|source| Fault::Register { reg, source })?;
                let starts = matches!(
                    reg,
                    Register::SemaphoreIncrement { index, .. } | Register::SemaphoreSet { index, .. }
                        if index == SEM_INFERENCE_START
                );
                if let Some(n) = self.device.nc_ref(nc) {
                    self.device.registers_changed(n, starts);
                }
                Ok(RegisterWrite::Done)
            }
        }
    }

    fn write_dmem(&mut self, nc: u32, offset: u64, data: &[u8]) -> Result<(), Fault> {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let pa = self.device.map.dmem_address(nc, offset);
        let foreign = || Fault::ForeignDmem { pa, len, nc };
        let n = self.device.nc_ref(nc).ok_or_else(foreign)?;
        if !self.device.owned_by(n, self.client) {
            return Err(foreign());
        }
        let start = usize::try_from(offset).map_err(|_| foreign())?;
        let mut dmem = lock(&n.dmem);
        let slot = start
            .checked_add(data.len())
            .and_then(|end| dmem.get_mut(start..end))
            .ok_or_else(foreign)?;
        slot.copy_from_slice(data);
        Ok(())
    }

    fn owns_nc(&self, nc: u32) -> bool {
        self.device
            .nc_ref(nc)
            .is_some_and(|n| self.device.owned_by(n, self.client))
    }

    fn read_sbuf(&self, nc: u32, partition: u32, offset: u64, out: &mut [u8]) -> Result<(), Fault> {
        let n = self.sbuf_nc(nc, partition, offset, out.len())?;
        if lock(&n.compute).read_sbuf(partition, offset, out) {
            Ok(())
        } else {
            Err(self.sbuf_fault(nc, partition, offset, out.len()))
        }
    }

    fn write_sbuf(
        &mut self,
        nc: u32,
        partition: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), Fault> {
        let n = self.sbuf_nc(nc, partition, offset, data.len())?;
        if lock(&n.compute).write_sbuf(partition, offset, data) {
            Ok(())
        } else {
            Err(self.sbuf_fault(nc, partition, offset, data.len()))
        }
    }

    fn schedule(&mut self, queue: QueueId) {
        schedule(self.worklist, queue);
    }
}

impl ClientBus<'_> {
    fn sbuf_fault(&self, nc: u32, partition: u32, offset: u64, len: usize) -> Fault {
        Fault::ForeignSbuf {
            pa: self.device.map.sbuf_address(nc, partition, offset),
            len: u32::try_from(len).unwrap_or(u32::MAX),
            nc,
        }
    }

    /// NC `nc`, when the client owns it.
    fn sbuf_nc(&self, nc: u32, partition: u32, offset: u64, len: usize) -> Result<&Nc, Fault> {
        self.device
            .nc_ref(nc)
            .filter(|n| self.device.owned_by(n, self.client))
            .ok_or_else(|| self.sbuf_fault(nc, partition, offset, len))
    }
}

mod exec;

#[cfg(test)]
mod tests;
