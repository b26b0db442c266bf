//! The emulated device: NC ownership, per-NC state, and request dispatch.
//!
//! [`Device::handle`] answers one [`Request`] of one client with one [`Reply`] (plus the fds
//! it carries), exactly as the control socket would, so every behaviour can be exercised
//! in-process. The server gives each connection a [`ClientId`] ([`Device::connect_peer`]) and
//! reclaims everything the client owned when the connection ends ([`Device::disconnect`]).
//!
//! Ownership follows the driver (`reference/driver-abi.md` §1.2, DESIGN §5): an NC belongs to
//! at most one client (a second claim is refused, unless the owner's process is gone: then it
//! is reclaimed on the spot, see [`crate::client`]); memory chunks belong to the client that
//! allocated them; DMA on a client's queues may touch only that client's chunks and the
//! registers of its own NCs.
//!
//! Executions run on the thread that delivered their doorbell, or on the NC's sequencer thread
//! when they must wait for the outside world ([`sequencer`]); the device's state lives in an
//! `Arc` shared with the sequencer threads, and dropping the [`Device`] stops and joins them.
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
//! state. `memory` guards the address space and `clients` the processes of connected clients. The
//! order is `state` → `claim` (a reset moves the epoch, zeroes the registers and clears the
//! owner in one hold of `claim` under `state`) and `state` → `memory`; an NC's read cache has
//! no lock (it travels with the sequencer role, [`sequencer`]); `claim`, `memory`, `clients`, `dmem`,
//! `compute`, the sequencer lock, `faults`, `latency`, the lost hook and the trace buffer are
//! leaves, held only for a lookup, an update or one
//! compute instruction (the sequencer thread sleeps on its lock's condition variable holding
//! nothing else). A DMA of one NC's queue into another NC's SBUF takes that NC's `compute`
//! lock under its own `state` lock, which the leaf rule allows.
//! No thread holds two NCs' `state` locks at once: a DMA write into another NC's
//! tail-increment register is applied after the first NC's lock is released
//! ([`crate::dma::Outcome::Deferred`]). Locks are taken through poison-ignoring helpers, so a
//! request handler that panicked (caught and answered as an error) does not wedge the device.
//!
//! # Modules
//! This module holds the [`Device`] facade and the per-NC state whose locks are described
//! above; the rest is split by what it does:
//! - `ownership`: clients coming and going, NC claims, and an NC's reset, release and reclaim.
//! - `dispatch`: one request in, one reply out ([`Device::handle`]), and the refusal kinds.
//! - `dma_run`: DMA runs of a client's queues over its [`Bus`](crate::dma::Bus) view of the
//!   device, and where their aborts go.
//! - `notifications`: building notification entries and posting them; DeviceLost.
//! - `trace_events`: the doorbell and DMA-run events recorded in the trace.
//! - [`sequencer`]: each NC's sequencer thread and its executions.

use std::collections::HashMap;
use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};
use std::time::Instant;

use shared::address_map::{AddressMap, REG_WINDOW_BASE};
use shared::protocol::{DeviceInfo, DeviceStats, LatencyModel, NcCounters, Reply, Request};
use shared::sequencer::SEQ_DMEM_SIZE;

use crate::client::{ClientId, Peer};
use crate::compute::ComputeState;
use crate::config::{Config, ConfigError};
use crate::counters::{Counters, PostCounts};
use crate::dma::{self, Budget, DmaQueues};
use crate::faults::FaultTable;
use crate::memory::{AddressSpace, Chunk, ChunkCache, Generation};
use crate::notify::NotificationQueue;
use crate::reference::References;
use crate::registers::Registers;
use crate::timing::{self, SimClock};
use crate::trace::{self, DEFAULT_MAX_EVENTS, Tracer};

mod dispatch;
mod dma_run;
mod notifications;
pub use notifications::{DeferredSignals, PendingSignals};
mod ownership;
pub mod sequencer;
#[cfg(test)]
mod test_utils;
mod trace_events;

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
    /// The head pairs of the batch being fetched, reused by every execution (its capacity
    /// stays: no allocation per execution).
    batch_pairs: Vec<crate::dma::PeekedPair>,
    /// Notifications and executions posted (counted here, under this lock: see
    /// [`crate::counters`]).
    posted: PostCounts,
}

/// One NC.
#[derive(Debug)]
struct Nc {
    index: u32,
    counters: Counters,
    /// Serialises changes of owner: a claim, and a reset (NcReset, release, reclaim), each hold
    /// it for their whole run, taken before any other lock of the NC. A reset of a client that
    /// no longer owns the NC (a reclaim at a claim conflict racing the dead client's own release
    /// or its disconnect) finds another owner, or none, and does nothing.
    ownership: Mutex<()>,
    claim: Mutex<Option<Arc<Claim>>>,
    /// The id of the client in `claim` (0 when unclaimed), stored under the `claim` lock with
    /// every change of it, so that the ownership check of each DMA access is one atomic load
    /// ([`Core::owned_by`]). Client ids are never reused.
    owner_id: AtomicU64,
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
    seq: sequencer::SeqSync,
    /// The simulated clock (used while a latency model is set).
    clock: SimClock,
}

impl Nc {
    /// The NC's counters: the atomic ones and those counted under its state lock, copied
    /// under it.
    fn counters(&self) -> NcCounters {
        let state = lock(&self.state);
        self.counters.snapshot(state.queues.counts(), state.posted)
    }
}

/// What the device knows of a connected client: its process, to tell whether it still lives
/// when another client claims one of its NCs ([`crate::client`]).
#[derive(Debug)]
struct ClientInfo {
    peer: Peer,
    /// The runtime version it announced ([`Request::Identify`]), if any.
    runtime_version: Option<String>,
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
    /// `memory`'s generation, read without its lock (DMA's chunk caches, [`crate::dma`]).
    memory_generation: Arc<Generation>,
    clients: Mutex<HashMap<ClientId, ClientInfo>>,
    /// Held for a whole reclaim and for a whole claim: a claim sees a gone client either with
    /// everything it held or with nothing (its NCs released *and* its memory freed), as on
    /// silicon, where the driver has released a dead process's resources before `waitpid`
    /// returns. Taken before any NC lock.
    reclaim_lock: Mutex<()>,
    next_client: AtomicU64,
    start: Instant,
    /// `start` on the host's `CLOCK_MONOTONIC` (ns): the origin of trace timestamps that
    /// subscribed clients place on their own clock.
    start_monotonic_ns: u64,
    budget_pairs: AtomicU64,
    budget_bytes: AtomicU64,
    /// [`Device::device_lost`] ran: no execution starts or posts any more.
    lost: AtomicBool,
    /// Armed faults (changed only through [`Core::with_faults`]).
    faults: Mutex<FaultTable>,
    /// Whether `faults` holds any, readable without the lock: the hot paths (every execution,
    /// every DMA doorbell) take the lock only when one is armed. Written under the lock.
    faults_armed: AtomicBool,
    /// The latency model of every NC.
    latency: Mutex<LatencyModel>,
    /// Whether `latency` is not the default (device time is simulated), readable without the
    /// lock.
    simulated: AtomicBool,
    /// Called when an injected DeviceLost fault fires.
    lost_hook: Mutex<Option<LostHook>>,
    /// The trace (disabled unless configured).
    tracer: Tracer,
    /// NEFFs bound to a reference, and the Python worker.
    references: References,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Now as an [`Instant`] and as nanoseconds of the host's `CLOCK_MONOTONIC`: the origin of
/// device timestamps and where a trace client places it. Both clocks are `CLOCK_MONOTONIC`,
/// but one moment cannot be read as both; reading them one after the other put the origin
/// 4–8 µs late (the first call of a cold path), more than a notification takes to be harvested,
/// so a merged trace showed notifications after their harvest. The `Instant` is read between
/// two monotonic readings, warmed and retried until they are under a microsecond apart, and
/// placed at their midpoint.
fn clock_origin() -> (Instant, u64) {
    const CLOSE_NS: u64 = 1_000;
    let mut best: Option<(Instant, u64, u64)> = None;
    for _ in 0..16 {
        let before = shared::device_trace::monotonic_ns();
        let now = Instant::now();
        let spread = shared::device_trace::monotonic_ns().saturating_sub(before);
        if best.is_none_or(|(_, _, s)| spread < s) {
            best = Some((now, before.saturating_add(spread / 2), spread));
        }
        if spread < CLOSE_NS {
            break;
        }
    }
    best.map_or_else(
        || (Instant::now(), shared::device_trace::monotonic_ns()),
        |(now, at, _)| (now, at),
    )
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl Device {
    /// A device as `config` describes it (the socket and uid fields are the server's), with
    /// nothing claimed or allocated.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is out of range or a reference binding cannot
    /// be loaded ([`crate::reference`]).
    pub fn new(config: &Config) -> Result<Self, ConfigError> {
        config.validate()?;
        let references = References::load(&config.references, config.reference_timeout)
            .map_err(ConfigError::Reference)?;
        Ok(Self {
            core: Arc::new_cyclic(|me| Core::new(config, references, me.clone())),
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

    /// Registers a new client (a connection from process `pid`) that is never judged gone
    /// before [`Device::disconnect`] (in-process clients).
    pub fn connect(&self, pid: u32) -> ClientId {
        self.core.connect(Peer::pid_only(pid))
    }

    /// Registers a new client whose process can be checked ([`Peer`]): a claim that
    /// conflicts with one of its NCs after its process died reclaims it at once instead of
    /// waiting for [`Device::disconnect`].
    pub fn connect_peer(&self, peer: Peer) -> ClientId {
        self.core.connect(peer)
    }

    /// The client went away (EOF, reset, kill -9): stops and forgets the queues and
    /// notification queues of its NCs, abandons their executions, zeroes their registers and
    /// DMEM, clears their ownership (each NC counts a reset), and frees all its memory chunks.
    /// Harmless after a claim already reclaimed the client.
    pub fn disconnect(&self, client: ClientId) {
        self.core.disconnect(client);
    }

    /// The counters of NC `nc`, `None` when it does not exist.
    pub fn counters(&self, nc: u32) -> Option<NcCounters> {
        self.core.counters(nc)
    }

    /// The device is going away: posts a DeviceLost notification (error flag
    /// [`error_flags::DEVICE_LOST`](shared::notification::error_flags::DEVICE_LOST)) to every claimed NC's notification queue and signals its
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

    /// The pid of the Python reference worker, while one runs ([`crate::reference::python`]).
    pub fn reference_worker_pid(&self) -> Option<u32> {
        self.core.references.worker_pid()
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
    /// [`SEM_INFERENCE_START`](shared::sequencer::SEM_INFERENCE_START)) runs its execution on
    /// the calling thread to its notification when it can (no thread hand-off), and never
    /// waits for the outside world: an execution that would is suspended and resumed on the
    /// NC's sequencer thread ([`sequencer`]).
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
    fn new(config: &Config, references: References, me: Weak<Core>) -> Self {
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
                ownership: Mutex::new(()),
                claim: Mutex::new(None),
                owner_id: AtomicU64::new(0),
                state: Mutex::new(NcState {
                    queues: DmaQueues::new(map, index),
                    nq: None,
                    exec_batches: 0,
                    batch_pairs: Vec::with_capacity(4),
                    posted: PostCounts::default(),
                }),
                dmem: Mutex::new(vec![0; dmem_bytes]),
                compute: Mutex::new(ComputeState::new()),
                epoch: AtomicU64::new(0),
                clock: SimClock::default(),
                seq: sequencer::SeqSync::default(),
            })
            .collect();
        let memory = AddressSpace::new(map);
        let (start, start_monotonic_ns) = clock_origin();
        Self {
            me,
            map,
            info,
            ncs,
            memory_generation: memory.generation(),
            memory: RwLock::new(memory),
            clients: Mutex::new(HashMap::new()),
            reclaim_lock: Mutex::new(()),
            next_client: AtomicU64::new(1),
            start,
            start_monotonic_ns,
            budget_pairs: AtomicU64::new(dma::DEFAULT_BUDGET_PAIRS),
            budget_bytes: AtomicU64::new(dma::DEFAULT_BUDGET_BYTES),
            lost: AtomicBool::new(false),
            faults: Mutex::new(FaultTable::default()),
            latency: Mutex::new(LatencyModel::default()),
            simulated: AtomicBool::new(false),
            faults_armed: AtomicBool::new(false),
            lost_hook: Mutex::new(None),
            references,
            tracer: config.trace.clone().map_or_else(Tracer::disabled, |path| {
                Tracer::to_file(path, map.nc_count, DEFAULT_MAX_EVENTS)
            }),
        }
    }

    /// The chunk of `client` holding all of `pa..pa+len`, through `reads` (the NC's read cache,
    /// which the sequencer role holds while it runs executions: no lock per instruction
    /// fetch), lent, not cloned: what [`AddressSpace::resolve`] answers, in O(1) while no
    /// memory was allocated or freed ([`ChunkCache`]'s invariants). Takes `memory` on a miss.
    fn resolve_in<'r>(
        &self,
        reads: &'r mut ChunkCache,
        client: ClientId,
        pa: u64,
        len: usize,
    ) -> Option<&'r Arc<Chunk>> {
        let generation = self.memory_generation.get();
        reads.resolve_ref(generation, client, pa, len, || {
            read(&self.memory).resolve(client, pa, len).ok()
        })
    }

    /// A fresh budget for one doorbell or one execution.
    fn budget(&self) -> Budget {
        Budget::new(
            self.budget_pairs.load(Ordering::Relaxed),
            self.budget_bytes.load(Ordering::Relaxed),
        )
    }

    fn counters(&self, nc: u32) -> Option<NcCounters> {
        self.nc_ref(nc).map(Nc::counters)
    }

    /// Runs `f` on the armed faults, under their lock, keeping [`Core::faults_armed`] right.
    fn with_faults<R>(&self, f: impl FnOnce(&mut FaultTable) -> R) -> R {
        let mut faults = lock(&self.faults);
        let r = f(&mut faults);
        self.faults_armed
            .store(!faults.is_empty(), Ordering::Release);
        r
    }

    /// Whether any fault is armed (without the lock; an arm racing the caller may be seen or
    /// not, as with the lock).
    fn faults_armed(&self) -> bool {
        self.faults_armed.load(Ordering::Acquire)
    }

    /// The latency model, `None` when device time follows the wall clock.
    fn latency_model(&self) -> Option<LatencyModel> {
        // The default, the wall clock, without the lock (an execution racing a change of the
        // model may run under either, locked or not).
        if !self.simulated() {
            return None;
        }
        let model = *lock(&self.latency);
        (!timing::is_wall_clock(&model)).then_some(model)
    }

    /// The time base of trace events, as a subscribed client sees it.
    fn trace_clock(&self) -> shared::protocol::TraceClock {
        shared::protocol::TraceClock {
            origin_monotonic_ns: self.start_monotonic_ns,
            simulated: self.simulated(),
        }
    }

    /// Whether device time is simulated (a latency model is set).
    fn simulated(&self) -> bool {
        self.simulated.load(Ordering::Relaxed)
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
}
