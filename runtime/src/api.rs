//! The public API: a [`Runtime`] (one `nrt_init` … `nrt_close` lifetime) and the libnrt-shaped,
//! process-global facade in [`nrt`] with the seed's state gates (seed 000 §1).
//!
//! `execute` is the synchronous path: entry checks (funtime short-circuit, handle, input count),
//! the fork (sync clones host tensors to device and copies results back), bind, then the XU
//! funnel — stage under the first TPB's `compute_req_lock`, doorbell every TPB — and the wait
//! for the worker's completion.
//!
//! **Fork.** A runtime belongs to the process that initialised it: its device connection, XU
//! worker threads, eventfds and rings are the parent's. A child forked after `init` inherits a
//! copy of the object but none of the threads, and anything it did through the copy would act on
//! the parent's device state. So every entry point of [`Runtime`] (and so of the [`nrt`] facade)
//! compares the pid recorded at init with `getpid()` and refuses with NRT_UNINITIALIZED naming
//! both processes; dropping or closing the inherited runtime in the child leaks it (dropping it
//! would stop the parent's workers through the shared eventfds and free its memory over the
//! shared socket); and `nrt::init` in the child replaces (leaks) the inherited state and starts a
//! runtime of its own, on NCs the parent does not hold. The sim backend refuses the inherited
//! connection on its own as well ([`crate::backend::DeviceError::Forked`]), which covers
//! tensors the child inherited and drops.

use std::collections::HashMap;

use crate::FastHashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared::NrtStatus;
use shared::model::Target;
use shared::protocol::MemLocation;

use crate::async_pool::{AsyncCallback, AsyncPool};
use crate::backend::{ClaimedNc, Device, DeviceError};
use crate::bind::{ExecMode, ExecResources, build_compute_resources};
use crate::completion::{ExecRequest, NqEngine, NqReader};
use crate::config::{Platform, RuntimeConfig};
use crate::datastore::Datastore;
use crate::datastore::snapshot::MemKind;
use crate::doorbell::kickoff_exec;
use crate::error::{NrtError, NrtResult};
use crate::kmgr::{LoadContext, LoadedModel, ModelDb};
use crate::metrics::Metrics;
use crate::reserve;
use crate::stage::{DgeWrite, HwExecQueue, StagedProgram};
use crate::sys_trace::SysTrace;
use crate::tensor::{MemCharge, Placement, RuntimeId, Tensor, TensorSet, UseHold};
use crate::trace::{SpanKind, Timeline};
use crate::xu::{
    CollectivesEngine, CompletionEngine, ExecInfo, ExecStatus, ExecutionUnit, MAX_TPBS_PER_VNC, Xu,
    XuConfig, XuTable, XuWorkers,
};
use shared::ids::{SeqId, XuId, XuType};
use shared::neff_program::ProgramEncoding;

mod tensor_op;
pub use tensor_op::StagedTensorWrite;

use tensor_op::TensorOps;

/// Entries of each NC's notification queue.
pub const NQ_ENTRIES: u32 = 1024;

/// Device trace events simdev holds per NC for the timeline between drains (drained at close;
/// more are dropped and counted in the file's `otherData.dropped_device_events`).
pub const DEVICE_TRACE_EVENTS_PER_NC: u32 = 1 << 20;

/// The back-off between two attempts of a sync execute the funnel refused with NRT_QUEUE_FULL
/// (the seed's `usleep(100)`).
pub const QUEUE_FULL_BACKOFF: Duration = Duration::from_micros(100);

/// The sync path's schedule loop (seed 000 §6 NOTE): `attempt` until it is not refused with
/// NRT_QUEUE_FULL, sleeping [`QUEUE_FULL_BACKOFF`] between attempts; NRT_TIMEOUT once `budget`
/// has passed. A sync execute never returns NRT_QUEUE_FULL.
///
/// # Errors
/// NRT_TIMEOUT after `budget`; `attempt`'s other errors at once.
fn schedule_retrying_queue_full<T>(
    budget: Duration,
    mut attempt: impl FnMut() -> NrtResult<T>,
) -> NrtResult<T> {
    // From the first refusal: a submit that is taken at once reads no clock.
    let mut start = None;
    loop {
        match attempt() {
            Err(e) if e.status == NrtStatus::QueueFull => {
                if start.get_or_insert_with(Instant::now).elapsed() >= budget {
                    return Err(status_err(
                        NrtStatus::Timeout,
                        format!(
                            "the execution queue stayed full for the whole wait budget ({budget:?}): {}",
                            e.message
                        ),
                    ));
                }
                std::thread::sleep(QUEUE_FULL_BACKOFF);
            }
            r => return r,
        }
    }
}

/// The sync path's submit boundary: blocks on a pooled completion eventfd, or — no pooled
/// eventfd free — polls `last_completed` for at most `budget` (the wait budget).
///
/// # Errors
/// NRT_TIMEOUT when the poll fallback exceeds `budget`.
fn wait_sync<E: CompletionEngine>(xu: &Xu<E>, seq: SeqId, budget: Duration) -> NrtResult<()> {
    xu.wait_for_completion(seq, Some(budget)).map_err(|s| {
        status_err(
            s,
            format!(
                "waiting for request {:#x} on logical core {} (budget {budget:?})",
                seq.raw(),
                xu.vnc()
            ),
        )
    })
}

/// When an execution staged through the XU funnel times out: `timeout` after its work item
/// was stamped (right before the funnel, which waits for nothing but its submit lock; no clock
/// read of its own), or never when that is past what an `Instant` holds. (The implicit-async
/// pool stages after waiting for an in-flight slot: it reads the clock at its stage.)
fn exec_deadline(info: &ExecInfo<ExecRequest>, timeout: Duration) -> Option<Instant> {
    info.submission_ts.checked_add(timeout)
}

/// A loaded model's handle (`nrt_model_t*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelHandle {
    /// The handle id (`h_nn`).
    pub id: u64,
    /// The logical core it was loaded on.
    pub vnc: u32,
}

/// A request scheduled on an execution unit of any type — an execution
/// ([`Runtime::execute_schedule`], COMPUTE) or a tensor operation
/// ([`Runtime::tensor_write_schedule`], [`Runtime::tensor_read_schedule`],
/// [`Runtime::tensor_copy_schedule`], TENSOR_OP): its sequence id, its status cell (`ret`) and
/// where it runs. Waited on with [`Runtime::wait`]; its id goes to [`Runtime::is_completed`] and
/// [`Runtime::event_register_seq_id_completion`] like any other.
///
/// # Invariants
/// `seq_id.xu_id()` is `{xu_type, queue, lnc}`; the status cell is published before the request
/// shows as completed.
#[derive(Debug, Clone)]
pub struct ScheduledRequest {
    seq_id: SeqId,
    status: Arc<ExecStatus>,
    lnc: u32,
    xu_type: XuType,
    queue: u8,
}

/// A request scheduled with [`Runtime::execute_schedule`] (on the COMPUTE XU).
pub type ScheduledExecution = ScheduledRequest;

/// A request scheduled on a TENSOR_OP XU.
pub type ScheduledTensorOp = ScheduledRequest;

impl ScheduledRequest {
    /// A handle of request `seq_id`, whose status `status` receives.
    fn new(seq_id: SeqId, status: Arc<ExecStatus>) -> Self {
        let id = seq_id.xu_id();
        Self {
            seq_id,
            status,
            lnc: u32::from(id.vnc_id()),
            // Every XU this runtime schedules on has a known type.
            xu_type: id.xu_type().unwrap_or(XuType::Compute),
            queue: id.queue(),
        }
    }

    /// Its sequence id (`xu_id << 48 | seq_num`).
    pub fn seq_id(&self) -> SeqId {
        self.seq_id
    }

    /// Its status (`ret`) once completed (`None` while in flight).
    pub fn status(&self) -> Option<NrtStatus> {
        self.status.get()
    }

    /// The logical core it runs on.
    pub fn lnc(&self) -> u32 {
        self.lnc
    }

    /// The logical core it runs on (as [`ScheduledRequest::lnc`]).
    pub fn vnc(&self) -> u32 {
        self.lnc
    }

    /// The type of the XU it runs on.
    pub fn xu_type(&self) -> XuType {
        self.xu_type
    }

    /// The queue of that XU type (0 or 1 for TENSOR_OP, 0 for COMPUTE).
    pub fn queue(&self) -> u8 {
        self.queue
    }
}

/// A logical core of this process.
#[derive(Clone, Debug)]
struct Vnc {
    /// Its NCs, the first the one that runs its programs. Never empty (`reserve` gives each
    /// logical core LNC >= 1 NCs).
    ncs: Vec<u32>,
}

/// One initialised runtime: the device, the claimed NCs, their exec queues and notification
/// queues, one XU and worker per logical core, and the model database.
#[derive(Debug)]
pub struct Runtime {
    device: Arc<dyn Device>,
    config: RuntimeConfig,
    vncs: Vec<Vnc>,
    hw_queues: FastHashMap<u32, Arc<HwExecQueue>>,
    /// Every XU of every type (`tpb_xus`), by xu_id.
    xus: XuTable,
    /// The COMPUTE XU of each logical core, typed (the execute path schedules on it).
    compute: Vec<Arc<Xu<NqEngine>>>,
    workers: Option<XuWorkers>,
    engine: Arc<NqEngine>,
    models: ModelDb,
    metrics: Arc<Metrics>,
    claimed: Vec<ClaimedNc>,
    target: Target,
    wait_budget: Duration,
    pool: Option<AsyncPool>,
    /// The process that initialised this runtime: the only one that may use it.
    pid: u32,
    /// This runtime instance (recorded in its device tensors and models; bind refuses a tensor
    /// of another instance).
    id: RuntimeId,
    /// The system trace and profiles ([`crate::sys_trace`]; the calls are in [`profiling`]).
    trace: Arc<SysTrace>,
    /// Device bytes held per logical core by tensors and models (`nrt_get_vnc_memory_stats`).
    mem_used: Vec<Arc<AtomicU64>>,
    /// The charge of each loaded model, by handle id, released at unload.
    model_charges: Mutex<HashMap<u64, MemCharge>>,
    /// The TENSOR_OP XUs (two per logical core), their engine and workers; `None` once closed.
    tensor_ops: Option<TensorOps>,
    /// The Perfetto timeline (`NEURON_RT_TRACE`, [`crate::trace`]); disabled without it.
    timeline: Arc<Timeline>,
    /// The timeline's origin (host `CLOCK_MONOTONIC` ns at init).
    timeline_origin_ns: u64,
    /// The device's trace subscription while the timeline records: its clock, or why the
    /// device's events are missing.
    device_trace: Option<Result<shared::protocol::TraceClock, String>>,
    /// The counters other processes read ([`crate::datastore`]): the shared file, or the same
    /// records in private memory (`NEURON_RT_DATASTORE=off`).
    datastore: Arc<Datastore>,
}

/// What `nrt_get_instance_info` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceInfo {
    /// `NRT_INSTANCE_*` family (TRN1 2, INF2 4, TRN2 5).
    pub family: u32,
    /// `NRT_INSTANCE_SIZE_*` (UNKNOWN 9: a simulated device has no instance size).
    pub size: u32,
    /// The device generation's name (`trn1`, `inf2`, `trn2`).
    pub arch_name: String,
    /// The device revision (`v2`, `v3`).
    pub device_revision: String,
}

/// Device memory of one logical core (`nrt_get_vnc_memory_stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VncMemoryStats {
    /// Bytes held by this process's tensors and models on the core.
    pub bytes_used: u64,
    /// HBM bytes of the core's NCs.
    pub bytes_limit: u64,
}

/// `NRT_INSTANCE_SIZE_UNKNOWN`.
pub const INSTANCE_SIZE_UNKNOWN: u32 = 9;

/// The instance description of a device of `arch`.
pub fn instance_info_of(arch: shared::Arch) -> InstanceInfo {
    let family = match arch {
        shared::Arch::Trn1 => 2,
        shared::Arch::Inf2 => 4,
        shared::Arch::Trn2 => 5,
    };
    InstanceInfo {
        family,
        size: INSTANCE_SIZE_UNKNOWN,
        arch_name: arch.name().to_string(),
        device_revision: format!("v{}", arch.version()),
    }
}

/// The runtime's datastore: the shared file in the configured directory, or — when it is off
/// or the file cannot be created (logged) — the same records in private memory.
///
/// # Errors
/// NRT_RESOURCE when not even the private mapping can be made.
fn open_datastore(config: &RuntimeConfig, cores: &[Vec<u32>], lnc: u32) -> NrtResult<Datastore> {
    if config.datastore {
        let dir = config
            .datastore_dir
            .clone()
            .unwrap_or_else(crate::datastore::default_dir);
        match Datastore::create(&dir, cores, lnc) {
            Ok(d) => return Ok(d),
            // A directory the user named (NEURON_RT_DATASTORE_DIR) that cannot hold it is
            // their mistake to hear about at the default level: `nrt monitor` will not see
            // this process. The default directory failing (a small /dev/shm) is a warning.
            Err(e) if config.datastore_dir.is_some() => tracing::error!(
                dir = %dir.display(),
                error = %e,
                "NEURON_RT_DATASTORE_DIR: the datastore file cannot be created there; counters stay private (nrt monitor and nrt top will not see this process)"
            ),
            Err(e) => tracing::warn!(
                dir = %dir.display(),
                error = %e,
                "the datastore file cannot be created; counters stay private"
            ),
        }
    }
    Datastore::private(cores, lnc).map_err(|e| {
        status_err(
            NrtStatus::Resource,
            format!("mapping the runtime's counters: {e}"),
        )
    })
}

/// The refusal of a call made in a process forked from the one that initialised the runtime.
fn forked_error(owner: u32, current: u32) -> NrtError {
    status_err(
        NrtStatus::Uninitialized,
        format!(
            "the runtime was initialised in process {owner}; this is process {current}, forked from it after nrt_init: call nrt_init in this process"
        ),
    )
}

impl Drop for Runtime {
    /// In the initialising process, nothing beyond the fields' own drops. In a forked child,
    /// leaks everything that acts on shared kernel objects (workers and pool signal eventfds the
    /// parent's threads wait on; models, queues and the device free memory and rings over the
    /// parent's connection), so dropping an inherited runtime changes nothing the parent sees.
    fn drop(&mut self) {
        if crate::process::id() == self.pid {
            return;
        }
        std::mem::forget(self.workers.take());
        std::mem::forget(self.tensor_ops.take());
        std::mem::forget(self.pool.take());
        std::mem::forget(std::mem::take(&mut self.compute));
        std::mem::forget(std::mem::take(&mut self.xus));
        std::mem::forget(std::mem::take(&mut self.models));
        std::mem::forget(std::mem::take(&mut self.hw_queues));
        std::mem::forget(std::mem::take(&mut self.claimed));
        std::mem::forget(self.engine.clone());
        std::mem::forget(self.device.clone());
    }
}

/// Puts `xu` in the table (its xu_id always names a slot: a type and queue of the table).
fn insert_xu(xus: &mut XuTable, xu: Arc<dyn ExecutionUnit>) -> NrtResult<()> {
    xus.insert(xu).map_err(|xu| {
        status_err(
            NrtStatus::Failure,
            format!(
                "execution unit {:#06x} has no slot in the XU table",
                xu.xu_id().raw()
            ),
        )
    })
}

/// What an xu_id says, for error messages.
fn describe_xu_id(xu_id: XuId) -> String {
    match xu_id.xu_type() {
        Some(t) => format!(
            "{t:?} queue {} of logical core {}",
            xu_id.queue(),
            xu_id.vnc_id()
        ),
        None => format!("unknown XU type {}", xu_id.type_bits()),
    }
}

fn status_err(status: NrtStatus, message: impl Into<String>) -> NrtError {
    NrtError::new(status, message)
}

/// Checks that a collective call names rank 0 of a group of one: collectives across ranks are
/// not simulated (simdev is one device). (The C ABI's boundary names the call.)
///
/// # Errors
/// NRT_INVALID naming what is wrong: no ranks, a rank outside its group, or a larger group.
fn rank_of_one(device_id: u32, device_count: u32) -> NrtResult<()> {
    let why = if device_count == 0 {
        "a group of 0 ranks has no rank".to_string()
    } else if device_id >= device_count {
        format!(
            "rank {device_id} is not in a group of {device_count} (its ranks are 0 to {})",
            device_count - 1
        )
    } else if device_count > 1 {
        format!(
            "rank {device_id} of a group of {device_count}: collectives across ranks are not simulated yet (only a group of one rank, rank 0)"
        )
    } else {
        return Ok(());
    };
    Err(status_err(NrtStatus::Invalid, why))
}

/// `nrt_execute_repeat`'s host check: the number of inputs the model declares.
fn check_input_count(m: &LoadedModel, inputs: &TensorSet) -> NrtResult<()> {
    let declared = &m.model().inputs;
    let expected = declared.len();
    if inputs.len() == expected {
        return Ok(());
    }
    // libnrt's message (seed 000), then which names are extra or missing.
    let extra: Vec<&str> = inputs
        .iter()
        .map(|(name, _)| name)
        .filter(|name| !declared.iter().any(|d| d.name == *name))
        .collect();
    let missing: Vec<&str> = declared
        .iter()
        .map(|d| d.name.as_str())
        .filter(|name| inputs.find(name).is_none())
        .collect();
    let mut why = format!(
        "Incorrect number of inputs, expected: {expected}, received: {}",
        inputs.len()
    );
    if !extra.is_empty() {
        why.push_str(&format!("; not inputs of the model: {extra:?}"));
    }
    if !missing.is_empty() {
        why.push_str(&format!("; missing: {missing:?}"));
    }
    why.push_str(&format!(
        " (the model's inputs: {:?})",
        declared.iter().map(|d| d.name.as_str()).collect::<Vec<_>>()
    ));
    Err(status_err(NrtStatus::Invalid, why))
}

impl Runtime {
    /// `nrt_init` on `device` with `config`: reserves the selected logical cores (claiming and
    /// resetting their NCs, [`crate::reserve`]), creates their notification queues and exec
    /// queues, one XU per logical core and its worker thread, and per logical core the two
    /// TENSOR_OP XUs with their DMA queues and workers ([`crate::tensor_op`]).
    ///
    /// # Errors
    /// NRT_LOAD_NOT_ENOUGH_NC / NRT_INVALID for an impossible core selection or too few free
    /// cores; the device's errors (an NC of a fixed selection owned by another process is
    /// NRT_EXEC_NC_BUSY, naming it).
    pub fn init(device: Arc<dyn Device>, config: RuntimeConfig) -> NrtResult<Self> {
        let info = device.info();
        let nc_count = info.nc_count;
        let lnc = config
            .lnc_on(info.arch)
            .map_err(|m| status_err(NrtStatus::Invalid, m))?;
        // The runtime's config holds what it runs with: `None` (libnrt's default) resolved.
        let config = RuntimeConfig {
            lnc: Some(lnc),
            ..config
        };
        let logical = nc_count / lnc;
        let selection = config
            .select_vncs(logical)
            .map_err(|m| status_err(NrtStatus::LoadNotEnoughNc, m))?;
        let platform = Platform::of_backend(device.backend_name());
        let target = match platform {
            Platform::Simulator => Target::Simdev,
            Platform::Hardware => Target::Silicon,
        };
        let wait_budget = config.wait_budget(platform);
        // The timeline is written at close: a path it cannot be written to is said now, before
        // anything is claimed, not after the whole run.
        if let Some(path) = &config.trace_file {
            std::fs::File::create(path).map_err(|e| {
                status_err(
                    NrtStatus::Invalid,
                    format!(
                        "NEURON_RT_TRACE={}: cannot create the timeline file: {e}",
                        path.display()
                    ),
                )
            })?;
        }
        let reservation = reserve::reserve(&*device, selection, logical, lnc, config.reset_cores)?;
        let vncs: Vec<Vnc> = reservation
            .vncs
            .into_iter()
            .map(|ncs| Vnc { ncs })
            .collect();
        let mut claimed = reservation.claimed;
        let mut readers = Vec::new();
        let mut nq_bytes: HashMap<u32, u64> = HashMap::new();
        let mut hw_queues = FastHashMap::default();
        let slots = config.max_inflight().saturating_add(1);
        let setup = (|| -> NrtResult<()> {
            for c in &mut claimed {
                let nq = device.notification_queue_init(c.nc, NQ_ENTRIES)?;
                nq_bytes.insert(c.nc, nq.allocation.size);
                readers.push((c.nc, NqReader::new(nq, c.notification_fd.take())));
            }
            // One set of exec queues per logical core, behind its main TPB's compute_req_lock.
            for v in &vncs {
                let q = Arc::new(HwExecQueue::new(device.clone(), &v.ncs, slots)?);
                for &nc in &v.ncs {
                    hw_queues.insert(nc, q.clone());
                }
            }
            Ok(())
        })();
        if let Err(e) = setup {
            reserve::release_all(&*device, &claimed);
            return Err(e);
        }
        let cores: Vec<Vec<u32>> = vncs.iter().map(|v| v.ncs.clone()).collect();
        let datastore = match open_datastore(&config, &cores, lnc) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                reserve::release_all(&*device, &claimed);
                return Err(e);
            }
        };
        // The runtime's own device memory per logical core: its NCs' notification queues, exec
        // queues and request slots, held until close.
        for (vnc, v) in vncs.iter().enumerate() {
            let queues = v
                .ncs
                .first()
                .and_then(|nc| hw_queues.get(nc))
                .map_or(0, |q: &Arc<HwExecQueue>| q.runtime_device_bytes());
            let nqs: u64 = v.ncs.iter().filter_map(|nc| nq_bytes.get(nc)).sum();
            datastore.charge_memory(
                u32::try_from(vnc).unwrap_or(u32::MAX),
                MemKind::RuntimeMemory,
                queues + nqs,
            );
        }
        let metrics = Arc::new(Metrics::with_datastore(
            datastore.clone(),
            nc_count as usize,
        ));
        let trace = Arc::new(SysTrace::new(vncs.iter().map(|v| v.ncs.clone()).collect()));
        let timeline_origin_ns = crate::trace::monotonic_ns();
        let (timeline, device_trace) = if config.trace_file.is_some() {
            let subscribed = device
                .trace_subscribe(DEVICE_TRACE_EVENTS_PER_NC)
                .map(|(_, clock)| clock)
                .map_err(|e| e.to_string());
            (
                Arc::new(Timeline::new(crate::trace::DEFAULT_MAX_SPANS)),
                Some(subscribed),
            )
        } else {
            (Arc::new(Timeline::disabled()), None)
        };
        let engine = Arc::new(
            NqEngine::new(readers)
                .with_device(device.clone())
                .with_numerical_errors(config.report_numerical_errors)
                .with_sys_trace(trace.clone())
                .with_timeline(timeline.clone()),
        );
        let vnc_ncs: Vec<Vec<u32>> = vncs.iter().map(|v| v.ncs.clone()).collect();
        let tensor_ops = match TensorOps::new(&device, &engine, &vnc_ncs, &config, &trace) {
            Ok(t) => t,
            Err(e) => {
                reserve::release_all(&*device, &claimed);
                return Err(e);
            }
        };
        let mut xus = XuTable::new();
        let mut compute = Vec::new();
        let collectives = Arc::new(CollectivesEngine);
        for (i, v) in vncs.iter().enumerate() {
            let vnc = u32::try_from(i).unwrap_or(u32::MAX);
            let cfg = |queue: u8| XuConfig {
                vnc,
                queue,
                tpbs: v.ncs.clone(),
                capacity: config.xu_capacity,
                // One pooled completion eventfd per XU slot: every sync waiter whose request
                // is in the ring blocks on an eventfd; the poll fallback is for exhaustion only.
                efd_pool_size: config.xu_capacity,
                implicit_async_mode: config.async_max_inflight > 0,
            };
            let made = |e: NrtError| {
                status_err(
                    e.status,
                    format!(
                        "creating an execution unit of logical core {vnc}: {}",
                        e.message
                    ),
                )
            };
            // The logical core's XUs (seed 004 `tpb_xus`, async 3.x): one worker epolls them
            // all. COMPUTE queue 0 runs executions; COLLECTIVES queues 0..2 exist, reachable by
            // id, and accept no work yet.
            // TENSOR_OP queues 0 and 1 move tensor bytes by the device's DMA
            // ([`TensorOps`]).
            let xu = Arc::new(Xu::new(cfg(0), engine.clone(), metrics.clone()).map_err(made)?);
            insert_xu(&mut xus, xu.clone())?;
            compute.push(xu);
            for xu in tensor_ops.xus_of(vnc) {
                insert_xu(&mut xus, xu)?;
            }
            for q in 0..crate::xu::table::queue_count(XuType::Collectives) {
                let cc = Xu::new_typed(
                    XuType::Collectives,
                    XuConfig {
                        efd_pool_size: 1,
                        ..cfg(q)
                    },
                    collectives.clone(),
                    metrics.clone(),
                )
                .map_err(made)?;
                insert_xu(&mut xus, Arc::new(cc))?;
            }
        }
        let workers = XuWorkers::start(&xus.groups())
            .map_err(|e| status_err(e.status, format!("starting the XU workers: {}", e.message)))?;
        let pool = if config.async_max_inflight > 0 {
            Some(AsyncPool::start(
                &vncs.iter().map(|v| v.ncs.clone()).collect::<Vec<_>>(),
                config.async_max_inflight,
                engine.clone(),
                metrics.clone(),
            )?)
        } else {
            None
        };
        Ok(Self {
            device,
            config,
            hw_queues,
            xus,
            compute,
            workers: Some(workers),
            engine,
            models: ModelDb::default(),
            metrics,
            claimed,
            target,
            wait_budget,
            mem_used: (0..vncs.len())
                .map(|_| Arc::new(AtomicU64::new(0)))
                .collect(),
            vncs,
            pool,
            pid: crate::process::id(),
            id: RuntimeId::next(),
            trace,
            model_charges: Mutex::new(HashMap::new()),
            tensor_ops: Some(tensor_ops),
            timeline,
            timeline_origin_ns,
            device_trace,
            datastore,
        })
    }

    /// The process that initialised this runtime.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Refuses a call from a process forked after init (see the module docs).
    ///
    /// # Errors
    /// NRT_UNINITIALIZED naming the initialising process and this one.
    pub fn check_process(&self) -> NrtResult<()> {
        let current = crate::process::id();
        if current == self.pid {
            Ok(())
        } else {
            Err(forked_error(self.pid, current))
        }
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// This runtime instance (what its device tensors carry, [`Tensor::runtime`]).
    pub fn id(&self) -> RuntimeId {
        self.id
    }

    /// The longest time an execution may take before it times out: `NEURON_RT_EXEC_TIMEOUT` as
    /// `nrt_init` read it, or as a loaded model's load read it when that is longer (`nrt_close`
    /// waits for executions up to this).
    pub fn longest_exec_timeout(&self) -> Duration {
        self.models
            .longest_exec_timeout()
            .map_or(self.config.exec_timeout, |t| {
                t.max(self.config.exec_timeout)
            })
    }

    /// The configuration read at init.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Physical NCs per logical core: `NEURON_LOGICAL_NC_CONFIG`, or the device's default
    /// (2 on trn2, 1 elsewhere) when it was unset.
    #[must_use]
    pub fn lnc(&self) -> u32 {
        self.config.lnc.unwrap_or(1).max(1)
    }

    /// The sync path's wait budget (seed 000 §6 NOTE; [`RuntimeConfig::wait_budget`] for the
    /// platform of this runtime's backend).
    pub fn wait_budget(&self) -> Duration {
        self.wait_budget
    }

    /// The next compute index of logical core `vnc`: its main TPB's `compute_idx_tail`, the one
    /// counter of the whole fan-out (seed 000 §4).
    pub fn compute_idx_tail(&self, vnc: u32) -> Option<u32> {
        let main = self.vncs.get(vnc as usize)?.ncs.first()?;
        let q = self.hw_queues.get(main)?;
        Some(
            q.compute_req_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .compute_idx_tail(),
        )
    }

    /// Logical cores available to this process (`nrt_get_visible_vnc_count`).
    pub fn visible_vnc_count(&self) -> u32 {
        u32::try_from(self.vncs.len()).unwrap_or(u32::MAX)
    }

    /// `lnc` as the index of a logical core this process sees.
    ///
    /// # Errors
    /// NRT_INVALID naming it and how many there are.
    pub fn visible_core(&self, lnc: i64) -> NrtResult<u32> {
        u32::try_from(lnc)
            .ok()
            .filter(|&v| (v as usize) < self.vncs.len())
            .ok_or_else(|| {
                status_err(
                    NrtStatus::Invalid,
                    format!(
                        "logical core {lnc} is not visible to this process ({} visible)",
                        self.vncs.len()
                    ),
                )
            })
    }

    /// The physical NCs of logical core `vnc`.
    pub fn vnc_ncs(&self, vnc: u32) -> Option<&[u32]> {
        self.vncs.get(vnc as usize).map(|v| v.ncs.as_slice())
    }

    /// The runtime's datastore (its file, if any, is [`Datastore::path`]).
    pub fn datastore(&self) -> &Arc<Datastore> {
        &self.datastore
    }

    /// Execution metrics per physical NC.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The COMPUTE XU of logical core `vnc`.
    pub fn xu(&self, vnc: u32) -> Option<&Arc<Xu<NqEngine>>> {
        self.compute.get(usize::try_from(vnc).ok()?)
    }

    /// `epoll_wait` calls of the logical cores' XU workers that returned so far (0 once
    /// closed): with executions pipelined, harvest bursts keep it below one per execution.
    pub fn xu_worker_epoll_returns(&self) -> u64 {
        self.workers.as_ref().map_or(0, XuWorkers::epoll_returns)
    }

    /// `tpb_xu_get`: the XU `xu_id` names (any type, queue, logical core), if any.
    pub fn xu_by_id(&self, xu_id: XuId) -> Option<&Arc<dyn ExecutionUnit>> {
        self.xus.get(xu_id)
    }

    /// Late notifications the completion engine discarded.
    pub fn stale_notifications(&self) -> u64 {
        self.engine.stale_notifications()
    }

    fn vnc_of(&self, vnc: i32) -> NrtResult<u32> {
        if vnc < -1 {
            return Err(status_err(
                NrtStatus::Invalid,
                format!("logical core {vnc} does not exist (-1 lets the runtime choose)"),
            ));
        }
        let v = if vnc == -1 {
            0
        } else {
            u32::try_from(vnc).unwrap_or(u32::MAX)
        };
        if (v as usize) < self.vncs.len() {
            Ok(v)
        } else {
            Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "logical core {vnc} is not visible to this process ({} visible)",
                    self.vncs.len()
                ),
            ))
        }
    }

    /// `nrt_load`: loads a model container or a NEFF (recognised by its header, parsed with
    /// `NEURON_RT_VALIDATE_HASH`'s hash check) on logical core `vnc` (-1: the first).
    ///
    /// # Errors
    /// NRT_INVALID (bad container or NEFF, a container for another target, a NEFF whose LNC
    /// is not the core's, bad core), NRT_UNSUPPORTED_NEFF_VERSION, NRT_LOAD_NOT_ENOUGH_NC,
    /// NRT_RESOURCE.
    pub fn load(&self, bytes: &[u8], vnc: i32) -> NrtResult<ModelHandle> {
        self.check_process()?;
        let vnc = self.vnc_of(vnc)?;
        let ncs = &self.vncs[vnc as usize].ncs;
        let m = self
            .models
            .load(&self.load_context(vnc)?, bytes, vnc, ncs)?;
        Ok(self.charge_model(&m, vnc))
    }

    /// Loads a NEFF already parsed (by the `neff` crate) on logical core `vnc` (-1: the first):
    /// what [`Runtime::load`] does after parsing a NEFF's bytes.
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_neff(&self, neff: &neff::Neff, vnc: i32) -> NrtResult<ModelHandle> {
        self.check_process()?;
        let vnc = self.vnc_of(vnc)?;
        let ncs = &self.vncs[vnc as usize].ncs;
        let m = self
            .models
            .load_neff(&self.load_context(vnc)?, neff, vnc, ncs)?;
        Ok(self.charge_model(&m, vnc))
    }

    /// The exec queues of the logical core holding NC `nc` (tests read staged requests).
    #[cfg(test)]
    pub(crate) fn hw_exec_queue(&self, nc: u32) -> Option<Arc<HwExecQueue>> {
        self.hw_queues.get(&nc).cloned()
    }

    /// What a load on `vnc` needs, with the variables libnrt reads at load
    /// ([`RuntimeConfig::at_load`]) read now.
    ///
    /// # Errors
    /// NRT_INVALID for a malformed load-time variable, naming it.
    fn load_context(&self, vnc: u32) -> NrtResult<LoadContext<'_>> {
        let at_load = self
            .config
            .at_load(|k| std::env::var(k).ok())
            .map_err(|e| NrtError::new(e.status(), e.to_string()))?;
        Ok(LoadContext {
            device: &self.device,
            hw_queues: &self.hw_queues,
            target: self.target,
            max_inflight: self.config.max_inflight(),
            runtime: self.id,
            validate_hash: at_load.validate_hash,
            exec_timeout: at_load.exec_timeout,
            hbm_in_use: self
                .mem_used
                .get(vnc as usize)
                .map_or(0, |u| u.load(Ordering::Relaxed)),
        })
    }

    fn charge_model(&self, m: &LoadedModel, vnc: u32) -> ModelHandle {
        let charge = MemCharge::by_kind(
            &self.mem_used[vnc as usize],
            Some(&self.datastore),
            vnc,
            m.device_bytes_by_kind(),
        );
        m.set_datastore_slot(self.datastore.model_loaded(
            m.id(),
            vnc,
            m.name(),
            m.uuid(),
            m.device_bytes(),
        ));
        self.model_charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(m.id(), charge);
        ModelHandle { id: m.id(), vnc }
    }

    /// `nrt_load_collectives`: rank `device_id` of a group of `device_count`. A group of one
    /// loads like [`Runtime::load`].
    ///
    /// # Errors
    /// NRT_INVALID for a larger group (collectives are not simulated yet) or a rank outside the
    /// group; otherwise as [`Runtime::load`].
    pub fn load_collectives(
        &self,
        bytes: &[u8],
        vnc: i32,
        device_id: u32,
        device_count: u32,
    ) -> NrtResult<ModelHandle> {
        self.check_process()?;
        rank_of_one(device_id, device_count)?;
        self.load(bytes, vnc)
    }

    /// The collectives of a group of one rank (`nrt_build_global_comm`,
    /// `nrt_cc_global_comm_init`, `nrt_barrier`, the check of `nrt_all_gather`): checks that
    /// the call asks for what one simdev process can be — rank 0 of a group of one, on a visible
    /// logical core `vnc` — which needs no communicator built, and whose barrier every rank has
    /// reached.
    ///
    /// # Errors
    /// NRT_INVALID naming the rank and group, or the core.
    pub fn group_of_one(&self, vnc: i64, device_id: u32, device_count: u32) -> NrtResult<()> {
        self.check_process()?;
        rank_of_one(device_id, device_count)?;
        self.visible_core(vnc).map(|_| ())
    }

    /// `nrt_all_gather`: every rank's `input` into `output` in rank order; for a group of one,
    /// `output` (one rank's worth) is `input`.
    ///
    /// # Errors
    /// NRT_INVALID as [`Runtime::group_of_one`], or when `output` is not as long as `input`.
    pub fn all_gather(
        &self,
        vnc: i32,
        (device_id, device_count): (u32, u32),
        input: &[u8],
        output: &mut [u8],
    ) -> NrtResult<()> {
        self.group_of_one(i64::from(vnc), device_id, device_count)?;
        if output.len() != input.len() {
            return Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "nrt_all_gather: output of {} bytes for one rank's {} bytes",
                    output.len(),
                    input.len()
                ),
            ));
        }
        output.copy_from_slice(input);
        Ok(())
    }

    /// `nrt_get_vnc_memory_stats`: device bytes held on logical core `vnc` and its HBM size.
    ///
    /// # Errors
    /// NRT_INVALID for a core not visible to this process.
    pub fn vnc_memory_stats(&self, vnc: u32) -> NrtResult<VncMemoryStats> {
        self.check_process()?;
        let (Some(used), Some(v)) = (self.mem_used.get(vnc as usize), self.vncs.get(vnc as usize))
        else {
            return Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "logical core {vnc} is not visible to this process ({} visible)",
                    self.vncs.len()
                ),
            ));
        };
        Ok(VncMemoryStats {
            bytes_used: used.load(Ordering::Relaxed),
            bytes_limit: self.device.info().hbm_bytes_per_nc * v.ncs.len() as u64,
        })
    }

    /// `nrt_get_instance_info`: the device's family, size, arch name and revision.
    pub fn instance_info(&self) -> InstanceInfo {
        instance_info_of(self.device.info().arch)
    }

    /// `nrt_unload`: waits for the model's in-flight executions — sync ones and scheduled
    /// explicit-async ones alike (each work item holds the model's in-flight count until it
    /// is freed) — then frees it. The handle is gone at once: a schedule on it meanwhile is
    /// NRT_INVALID_HANDLE.
    ///
    /// # Errors
    /// NRT_INVALID_HANDLE for an unknown or already unloaded model.
    pub fn unload(&self, model: ModelHandle) -> NrtResult<()> {
        self.check_process()?;
        let slot = self.models.get(model.id).and_then(|m| m.datastore_slot());
        self.models.unload(model.id)?;
        if let Some(slot) = slot {
            self.datastore.model_unloaded(slot);
        }
        self.model_charges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&model.id);
        Ok(())
    }

    /// The loaded model behind `model`.
    ///
    /// # Errors
    /// NRT_INVALID_HANDLE.
    pub fn model(&self, model: ModelHandle) -> NrtResult<Arc<LoadedModel>> {
        self.check_process()?;
        self.models.get(model.id).ok_or_else(|| {
            status_err(
                NrtStatus::InvalidHandle,
                format!("model handle {} is not loaded", model.id),
            )
        })
    }

    /// `nrt_tensor_allocate`: `size` bytes on the device (HBM of the logical core's first NC)
    /// or in host memory.
    ///
    /// # Errors
    /// NRT_INVALID for a bad core or size 0; NRT_RESOURCE when the device is out of memory.
    pub fn tensor_allocate(
        &self,
        placement: Placement,
        size: u64,
        name: &str,
    ) -> NrtResult<Tensor> {
        self.check_process()?;
        if size == 0 {
            return Err(status_err(
                NrtStatus::Invalid,
                format!("tensor {name:?}: size 0"),
            ));
        }
        match placement {
            Placement::Host => Tensor::host(name, size),
            Placement::Device { vnc } => {
                let v = self.vnc_of(i32::try_from(vnc).unwrap_or(i32::MAX))?;
                let a = self.tensor_hbm(v, size).map_err(|e| {
                    let mut err = NrtError::from(e);
                    err.message = format!("tensor {name:?} ({size} bytes): {}", err.message);
                    err
                })?;
                let charge = MemCharge::of_kind(
                    &self.mem_used[v as usize],
                    Some(&self.datastore),
                    v,
                    MemKind::Tensors,
                    a.size,
                );
                match self.device.mem_map(&a) {
                    Ok(m) => {
                        Ok(
                            Tensor::device(name, (self.id, v), a, m, self.device.clone(), size)
                                .with_charge(charge),
                        )
                    }
                    Err(e) => {
                        let _ = self.device.mem_free(a.handle);
                        Err(e.into())
                    }
                }
            }
        }
    }

    /// HBM for a device tensor of logical core `v`: from its first NC's HBM, and when that is
    /// full from the next NC's (`nrt_get_vnc_memory_stats` counts the HBM of all the core's
    /// NCs as its limit, and every NC of the device reaches every HBM). Only a refusal for want
    /// of room moves on; the last NC's refusal is the answer.
    fn tensor_hbm(&self, v: u32, size: u64) -> Result<crate::backend::Allocation, DeviceError> {
        let (&last, first) = self.vncs[v as usize]
            .ncs
            .split_last()
            .expect("a logical core has at least one NC (Vnc's invariant)");
        for &nc in first {
            match self.device.mem_alloc(MemLocation::Hbm { nc }, size, 0) {
                Err(e) if e.status() == NrtStatus::Resource => {}
                done => return done,
            }
        }
        self.device
            .mem_alloc(MemLocation::Hbm { nc: last }, size, 0)
    }

    /// `nrt_execute_repeat`: only `repeat <= 1` is accepted.
    ///
    /// # Errors
    /// NRT_INVALID for `repeat > 1` ("Supports for loops on the host is deprecated"); otherwise
    /// as [`Runtime::execute`].
    pub fn execute_repeat(
        &self,
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
        repeat: i32,
    ) -> NrtResult<()> {
        self.check_process()?;
        if repeat > 1 {
            return Err(status_err(
                NrtStatus::Invalid,
                "Supports for loops on the host is deprecated",
            ));
        }
        self.execute(model, inputs, outputs)
    }

    /// `nrt_execute`, synchronous: runs the model once on its logical core.
    ///
    /// # Errors
    /// The execution's status when it is not NRT_SUCCESS (1003 still delivers the outputs), or
    /// the entry/bind/funnel refusal: NRT_INVALID_HANDLE, NRT_INVALID ("Incorrect number of
    /// inputs…", tensor names/sizes), NRT_EXEC_BAD_INPUT (placement), 101 (degraded XU),
    /// NRT_QUEUE_FULL, NRT_CLOSED.
    pub fn execute(
        &self,
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<()> {
        let start = self.timeline.begin();
        let r = self.execute_spanned(model, inputs, outputs);
        if start.is_some() {
            self.timeline.pend(SpanKind::Execute, start);
            self.timeline.commit_noted(model.vnc, model.id);
        }
        r
    }

    /// [`Runtime::execute`] inside its timeline span.
    fn execute_spanned(
        &self,
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<()> {
        self.check_process()?;
        if self.config.funtime {
            // No device: the execution "succeeds", and its outputs count as written, so an
            // output-completion wait sees what the caller's success says.
            for (_, t) in outputs.iter() {
                t.output_completed();
            }
            return Ok(());
        }
        let m = self.resolve(model)?;
        self.refused(&m, check_input_count(&m, inputs))?;
        // The fork: sync clones host tensors to device memory and copies results back.
        let clone = |set: &TensorSet,
                     copy_in: bool|
         -> NrtResult<(TensorSet, Vec<(Tensor, Tensor)>)> {
            let mut dev = TensorSet::new();
            let mut clones = Vec::new();
            for (name, t) in set.iter() {
                if t.placement() == Placement::Host {
                    let d =
                        self.tensor_allocate(Placement::Device { vnc: m.vnc() }, t.size(), name)?;
                    if copy_in {
                        d.copy_from(t)?;
                    }
                    clones.push((t.clone(), d.clone()));
                    dev.add(name, &d);
                } else {
                    dev.add(name, t);
                }
            }
            Ok((dev, clones))
        };
        if self.pool.is_some() {
            return self
                .refused(&m, self.execute_implicit_async(&m, inputs, outputs))
                .map(|_| ());
        }
        let has_host = |set: &TensorSet| set.iter().any(|(_, t)| t.placement() == Placement::Host);
        let mode = ExecMode::from_async_workers_present(false);
        let (in_dev, out_dev, out_clones) = if has_host(inputs) || has_host(outputs) {
            let (in_dev, _) = self.refused(&m, clone(inputs, true))?;
            let (out_dev, out_clones) = self.refused(&m, clone(outputs, false))?;
            (Some(in_dev), Some(out_dev), out_clones)
        } else {
            (None, None, Vec::new())
        };
        let (ins, outs) = (
            in_dev.as_ref().unwrap_or(inputs),
            out_dev.as_ref().unwrap_or(outputs),
        );
        let status = self.submit_sync(&m, || build_compute_resources(&m, ins, outs, mode))?;
        if matches!(
            status,
            NrtStatus::Success | NrtStatus::ExecCompletedWithNumErr
        ) {
            for (host, dev) in &out_clones {
                host.copy_from(dev)?;
                // The device clone was counted at completion; the caller's handle is this one.
                host.output_completed();
            }
        }
        match status {
            NrtStatus::Success => Ok(()),
            s => {
                let detail = match s {
                    NrtStatus::Timeout => self.engine.timeout_detail(m.vnc()).map(|d| {
                        match m.reference() {
                            Some(r) => format!(
                                "{d}; simdev computes this NEFF's outputs with the CPU reference \
                                 {r}: one that runs longer than the execution timeout \
                                 ({:?}, NEURON_RT_EXEC_TIMEOUT), or waits that long behind \
                                 other executions' references (simdev's one reference worker \
                                 runs them one at a time, for every core and client), times \
                                 the execution out — give it more time, and a shared simdev's \
                                 --reference-timeout too; its log says what the reference did",
                                m.exec_timeout()
                            ),
                            None => d,
                        }
                    }),
                    NrtStatus::HwError
                        if self.vncs[m.vnc() as usize]
                            .ncs
                            .iter()
                            .any(|&nc| self.engine.device_lost_reported(nc)) =>
                    {
                        Some(
                            "the device was lost: it reported DeviceLost (a device_lost fault, \
                             or the device failed) and takes no more executions"
                                .to_string(),
                        )
                    }
                    NrtStatus::HwError if self.device.hung_up() => Some(
                        "the device is gone: its connection hung up (simdev exited or was killed)"
                            .to_string(),
                    ),
                    _ => None,
                }
                .map_or_else(String::new, |d| format!(": {d}"));
                Err(status_err(
                    s,
                    format!(
                        "execution of model {:?} on logical core {} ended with {s}{detail}",
                        m.name(),
                        m.vnc()
                    ),
                ))
            }
        }
    }

    /// The work item of one bound execution on `m`'s logical core (counted in flight on `m`
    /// by its `resources`, since bind): in a box `xu`'s worker freed when there is one
    /// (`None`: the implicit-async pool's item).
    fn work_item(
        &self,
        m: &Arc<LoadedModel>,
        resources: ExecResources,
        xu: Option<&Xu<NqEngine>>,
    ) -> Box<ExecInfo<ExecRequest>> {
        let ncs = &self.vncs[m.vnc() as usize].ncs;
        let mut req = ExecRequest {
            num_tpbs: ncs.len().min(MAX_TPBS_PER_VNC),
            ..Default::default()
        };
        for (slot, nc) in req.ncs.iter_mut().zip(ncs) {
            *slot = *nc;
        }
        req.resources = Some(resources);
        let mut info = ExecInfo::execute(m.id(), req);
        info.model_slot = m.datastore_slot();
        match xu {
            Some(xu) => xu.work_item(info),
            None => Box::new(info),
        }
    }

    /// The funnel's refusal `s`; `why`: what the stage or the doorbell said when one failed.
    fn refusal(m: &LoadedModel, s: NrtStatus, why: Option<String>) -> NrtError {
        let msg = match s {
            NrtStatus::ExecUnitUnrecoverable => format!(
                "logical core {} is degraded by an earlier fatal error",
                m.vnc()
            ),
            NrtStatus::Closed => "the runtime is closing".to_string(),
            NrtStatus::QueueFull => format!(
                "the execution queue of logical core {} is full; nothing was scheduled",
                m.vnc()
            ),
            s => match why {
                Some(why) => format!("submitting to logical core {}: {s}: {why}", m.vnc()),
                None => format!("submitting to logical core {}: {s}", m.vnc()),
            },
        };
        status_err(s, msg)
    }

    /// Runs the XU funnel (`tpb_xu_schedule_request`) with this runtime's stage and doorbell:
    /// `f` gets the XU, the work item and the two closures.
    fn funnel<T>(
        &self,
        m: &Arc<LoadedModel>,
        resources: ExecResources,
        f: impl FnOnce(
            &Xu<NqEngine>,
            Box<ExecInfo<ExecRequest>>,
            &dyn Fn(&mut ExecInfo<ExecRequest>, bool) -> Result<(), NrtStatus>,
            &dyn Fn(&ExecInfo<ExecRequest>) -> Result<(), NrtStatus>,
        ) -> Result<T, NrtStatus>,
    ) -> NrtResult<T> {
        let xu = self
            .xu(m.vnc())
            .ok_or_else(|| status_err(NrtStatus::Invalid, "unknown logical core"))?;
        let ncs = &self.vncs[m.vnc() as usize].ncs;
        let info = self.work_item(m, resources, Some(xu));
        let timeout = m.exec_timeout();
        let skip = self.config.skip_config_optimization;
        // What a failing stage or doorbell said, for the refusal's message.
        let why = std::cell::RefCell::new(None);
        let stage =
            |info: &mut ExecInfo<ExecRequest>, model_switch: bool| -> Result<(), NrtStatus> {
                let span = self.timeline.now();
                self.stage(m, info, model_switch, skip).map_err(|e| {
                    tracing::error!(error = %e, "stage failed");
                    *why.borrow_mut() = Some(e.message);
                    e.status
                })?;
                info.request.deadline = exec_deadline(info, timeout);
                self.trace
                    .stamp(&mut info.request.trace, || profiling::staged_seq_id(xu));
                if span.is_some() {
                    let seq_id = profiling::staged_seq_id(xu);
                    info.request.timeline_seq_id = seq_id;
                    self.timeline.note(seq_id, info.request.compute_idx);
                    self.timeline.pend(SpanKind::Stage, span);
                }
                Ok(())
            };
        let doorbell = |_: &ExecInfo<ExecRequest>| {
            let span = self.timeline.now();
            let r = kickoff_exec(self.device.as_ref(), ncs).map_err(|e| {
                *why.borrow_mut() = Some(e.message);
                e.status
            });
            self.timeline.pend(SpanKind::Doorbell, span);
            r
        };
        let r = f(xu, info, &stage, &doorbell);
        r.map_err(|s| Self::refusal(m, s, why.take()))
    }

    /// `kmgr_sync_exec`: schedules through the funnel — retrying NRT_QUEUE_FULL every 100 µs
    /// within the wait budget, binding again for each attempt (a refused work item is dropped
    /// with its resources) — then blocks until the worker completes it; returns the
    /// execution's status.
    fn submit_sync(
        &self,
        m: &Arc<LoadedModel>,
        bind: impl FnMut() -> NrtResult<ExecResources>,
    ) -> NrtResult<NrtStatus> {
        thread_local! {
            // The caller's own status cell, reused across calls (the seed passes a pointer to
            // the caller's stack), so the only allocation per execution is the work item.
            static STATUS: Arc<ExecStatus> = Arc::new(ExecStatus::new());
        }
        // Borrowed for the call, not cloned: only the work item's cell takes a reference.
        STATUS.with(|status| self.submit_sync_with(m, status, bind))
    }

    /// [`Runtime::submit_sync`] with the calling thread's status cell.
    fn submit_sync_with(
        &self,
        m: &Arc<LoadedModel>,
        status: &Arc<ExecStatus>,
        mut bind: impl FnMut() -> NrtResult<ExecResources>,
    ) -> NrtResult<NrtStatus> {
        status.reset();
        let xu = self
            .xu(m.vnc())
            .ok_or_else(|| status_err(NrtStatus::Invalid, "unknown logical core"))?;
        let scheduled = schedule_retrying_queue_full(self.wait_budget, || {
            let cell = status.clone();
            let span = self.timeline.now();
            let resources = bind();
            self.timeline.pend(SpanKind::Bind, span);
            self.funnel(m, resources?, move |xu, info, stage, doorbell| {
                xu.schedule_request(info, Some(cell), stage, doorbell)
            })
        });
        let seq = self.refused(m, scheduled)?;
        let span = self.timeline.now();
        let waited = wait_sync(xu, seq, self.wait_budget);
        self.timeline.pend(SpanKind::Wait, span);
        waited?;
        Ok(status.get().unwrap_or(NrtStatus::Failure))
    }

    /// `r`; when it is an error (the execution of `m` was refused: nothing was scheduled), the
    /// refusal counted in the monitor's figures ([`Metrics::record_refusal`]).
    fn refused<T>(&self, m: &LoadedModel, r: NrtResult<T>) -> NrtResult<T> {
        if let Err(e) = &r {
            self.metrics
                .record_refusal(m.vnc(), m.datastore_slot(), e.status);
        }
        r
    }

    /// `vtpb_get_virtual_core` then `db_get_nn_ref_count`: the handle's logical core must be
    /// one of this process's (NRT_INVALID, "unknown logical core", before anything is allocated
    /// or bound — seed 000 §1), then the handle must name a loaded model on that core
    /// (NRT_INVALID_HANDLE).
    fn resolve(&self, model: ModelHandle) -> NrtResult<Arc<LoadedModel>> {
        if model.vnc as usize >= self.vncs.len() {
            return Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "unknown logical core {} (model handle {}; {} visible)",
                    model.vnc,
                    model.id,
                    self.vncs.len()
                ),
            ));
        }
        let m = self.model(model)?;
        if m.vnc() != model.vnc {
            return Err(status_err(
                NrtStatus::InvalidHandle,
                format!(
                    "model handle {} names logical core {}, the model is loaded on {}",
                    model.id,
                    model.vnc,
                    m.vnc()
                ),
            ));
        }
        Ok(m)
    }

    /// The implicit-async fork of `kmgr_exec`: host tensors are refused (the seed's GOTCHA:
    /// async is device-tensor-only), bind runs with exec mode 0, and `kaew_post_request` stages,
    /// rings and queues the request, returning its job id without waiting.
    fn execute_implicit_async(
        &self,
        m: &Arc<LoadedModel>,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<u64> {
        let pool = self
            .pool
            .as_ref()
            .ok_or_else(|| status_err(NrtStatus::Failure, "no async pool"))?;
        if inputs
            .iter()
            .chain(outputs.iter())
            .any(|(_, t)| t.placement() == Placement::Host)
        {
            return Err(status_err(
                NrtStatus::Invalid,
                "Async exec mode only supports device allocated tensors",
            ));
        }
        let span = self.timeline.now();
        let resources = build_compute_resources(
            m,
            inputs,
            outputs,
            ExecMode::from_async_workers_present(true),
        );
        self.timeline.pend(SpanKind::Bind, span);
        let resources = resources?;
        let ncs = &self.vncs[m.vnc() as usize].ncs;
        // The implicit-async pool's own work item: its workers free it, not an XU's.
        let mut info = self.work_item(m, resources, None);
        info.sync_exec = false;
        let timeout = m.exec_timeout();
        let skip = self.config.skip_config_optimization;
        let stage =
            |info: &mut ExecInfo<ExecRequest>, model_switch: bool| -> Result<(), NrtStatus> {
                let span = self.timeline.now();
                self.stage(m, info, model_switch, skip)
                    .map_err(|e| e.status)?;
                // Staged after the pool's wait for an in-flight slot, which may be long: the
                // timeout counts from here, not from the work item's stamp before that wait.
                info.request.deadline = Instant::now().checked_add(timeout);
                // The pool sets the job id as the sequence id once it assigns it.
                self.trace.stamp(&mut info.request.trace, || 0);
                self.timeline.note(0, info.request.compute_idx);
                self.timeline.pend(SpanKind::Stage, span);
                Ok(())
            };
        let doorbell = |_: &ExecInfo<ExecRequest>| {
            let span = self.timeline.now();
            let r = kickoff_exec(self.device.as_ref(), ncs).map_err(|e| e.status);
            self.timeline.pend(SpanKind::Doorbell, span);
            r
        };
        let job = pool
            .post(m.vnc(), info, stage, doorbell)
            .map_err(|s| match s {
                NrtStatus::QueueFull => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    let msg = format!(
                        "every in-flight slot of logical core {} is taken \
                         (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS={}) and this nrt_execute \
                         runs in the completion callback, whose own slot is freed only when it \
                         returns: waiting would wait for itself; nothing was scheduled",
                        m.vnc(),
                        self.config.async_max_inflight
                    );
                    SAID.call_once(|| tracing::warn!("{msg} (said once)"));
                    status_err(s, msg)
                }
                s => Self::refusal(m, s, None),
            })?;
        self.timeline.note_seq_id(job);
        Ok(job)
    }

    /// `nrt_execute` under the implicit async pool, returning the job id that the completion
    /// callback ([`Runtime::register_async_exec_callback`]) reports the execution's status
    /// with: for a caller that matches statuses to executions (libnrt's callers count jobs).
    ///
    /// # Errors
    /// NRT_INVALID when the pool is off; otherwise as [`Runtime::execute`]'s refusals.
    pub fn execute_implicit(
        &self,
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<u64> {
        self.check_process()?;
        let m = self.resolve(model)?;
        if self.pool.is_none() {
            return Err(status_err(
                NrtStatus::Invalid,
                "the implicit async pool is off (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS)",
            ));
        }
        self.refused(&m, check_input_count(&m, inputs))?;
        self.refused(&m, self.execute_implicit_async(&m, inputs, outputs))
    }

    /// `nrt_register_async_exec_callback`: `cb(model_id, vnc, job_id, status)` runs on the pool's
    /// worker after each implicit-async execution.
    ///
    /// # Errors
    /// NRT_INVALID when the implicit async pool is off.
    pub fn register_async_exec_callback(&self, cb: AsyncCallback) -> NrtResult<()> {
        self.check_process()?;
        let pool = self
            .pool
            .as_ref()
            .ok_or_else(|| {
                status_err(
                    NrtStatus::Invalid,
                    "the implicit async pool is off: it is on when NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS is above 0 at nrt_init",
                )
            })?;
        pool.register_callback(cb);
        Ok(())
    }

    /// `nrt_async_drain_queued_execs`: blocks until logical core `vnc` has no queued
    /// implicit-async execution.
    pub fn async_drain(&self, vnc: u32) {
        if self.check_process().is_err() {
            return;
        }
        if crate::async_pool::in_exec_callback() {
            tracing::error!(
                "draining logical core {vnc} from the completion callback, which runs on the core's own exec thread: it would wait for itself; not drained"
            );
            return;
        }
        if let Some(pool) = &self.pool {
            pool.drain(vnc);
        }
    }

    /// The implicit-async pool's `consecutive_model_counter` on logical core `vnc` (`None`
    /// when the pool is off or the core is not visible).
    pub fn async_consecutive_model_counter(&self, vnc: u32) -> Option<u64> {
        self.pool.as_ref()?.consecutive_model_counter(vnc)
    }

    /// Whether the implicit async pool serves executions.
    pub fn implicit_async(&self) -> bool {
        self.pool.is_some()
    }

    /// `nrta_execute_schedule` (async 3.x, through the XU ring): binds and schedules one
    /// execution without blocking and returns its handle (`seq_id = xu_id << 48 | seq`). The
    /// status is written before the request shows as completed. Device tensors only.
    ///
    /// # Errors
    /// NRT_QUEUE_FULL when the XU queue is full (nothing changed; retry later), 101 after a fatal
    /// error on the logical core, NRT_INVALID for host tensors or bad I/O sets.
    pub fn execute_schedule(
        &self,
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<ScheduledExecution> {
        let start = self.timeline.begin();
        let r = self.execute_schedule_spanned(model, inputs, outputs);
        if start.is_some() {
            self.timeline.pend(SpanKind::Execute, start);
            self.timeline.commit_noted(model.vnc, model.id);
        }
        r
    }

    /// [`Runtime::execute_schedule`] inside its timeline span.
    fn execute_schedule_spanned(
        &self,
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<ScheduledExecution> {
        self.check_process()?;
        let m = self.resolve(model)?;
        let scheduled = self.schedule_resolved(&m, inputs, outputs);
        self.refused(&m, scheduled)
    }

    /// [`Runtime::execute_schedule`] of the resolved model `m`.
    fn schedule_resolved(
        &self,
        m: &Arc<LoadedModel>,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> NrtResult<ScheduledExecution> {
        if self.pool.is_some() {
            return Err(status_err(
                NrtStatus::Invalid,
                "the explicit async API uses the XU ring, which is off while the implicit async pool is on (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS)",
            ));
        }
        if let Some((name, _)) = inputs
            .iter()
            .chain(outputs.iter())
            .find(|(_, t)| t.placement() == Placement::Host)
        {
            return Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "tensor {name:?} is in host memory: asynchronous execution takes device tensors only"
                ),
            ));
        }
        check_input_count(m, inputs)?;
        let span = self.timeline.now();
        let resources = build_compute_resources(
            m,
            inputs,
            outputs,
            ExecMode::from_async_workers_present(false),
        );
        self.timeline.pend(SpanKind::Bind, span);
        let resources = resources?;
        let status = Arc::new(ExecStatus::new());
        let cell = status.clone();
        // Marks every bound tensor as used by this request until its work item is freed.
        let hold = UseHold::on(inputs.iter().chain(outputs.iter()).map(|(_, t)| t));
        let namer = hold.namer();
        let seq_id = self.funnel(m, resources, move |xu, mut info, stage, doorbell| {
            info.sync_exec = false;
            info.request.hold = Some(hold);
            xu.schedule_request(info, Some(cell), stage, doorbell)
        })?;
        namer.name(seq_id);
        Ok(ScheduledRequest::new(seq_id, status))
    }

    /// The XU `seq_id` names, if `seq_id` is one of its submitted requests (or seq_num 0).
    fn xu_of(&self, seq_id: SeqId) -> NrtResult<&Arc<dyn ExecutionUnit>> {
        self.check_process()?;
        let xu_id = seq_id.xu_id();
        let Some(xu) = self.xus.get(xu_id) else {
            return Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "sequence id {:#x} names no execution unit of this runtime (xu_id {:#06x}: {})",
                    seq_id.raw(),
                    xu_id.raw(),
                    describe_xu_id(xu_id),
                ),
            ));
        };
        if !xu.knows(seq_id) {
            return Err(status_err(
                NrtStatus::Invalid,
                format!(
                    "sequence id {:#x} names request {} of execution unit {:#06x}, which has submitted only {} (an id of another runtime or process?)",
                    seq_id.raw(),
                    seq_id.seq_num(),
                    xu_id.raw(),
                    xu.last_completed().seq_num() + xu.depth(),
                ),
            ));
        }
        Ok(xu)
    }

    /// The XU `(lnc, xu_type, queue)` names.
    fn xu_at(&self, lnc: u32, xu_type: XuType, queue: u32) -> NrtResult<&Arc<dyn ExecutionUnit>> {
        self.check_process()?;
        let count = crate::xu::table::queue_count(xu_type);
        let q = u8::try_from(queue)
            .ok()
            .filter(|q| *q < count)
            .ok_or_else(|| {
                status_err(
                    NrtStatus::Invalid,
                    format!(
                        "queue {queue} does not exist: {xu_type:?} execution units have {}",
                        match count {
                            1 => "queue 0 only".to_string(),
                            2 => "queues 0 and 1".to_string(),
                            n => format!("queues 0 to {}", n - 1),
                        }
                    ),
                )
            })?;
        self.xus.get_by(lnc, xu_type, q).ok_or_else(|| {
            let why = if self.xu(lnc).is_none() {
                format!("logical core {lnc} is not visible to this runtime")
            } else {
                format!("logical core {lnc} has no {xu_type:?} execution unit queue {q}")
            };
            status_err(NrtStatus::Invalid, why)
        })
    }

    /// `nrta_is_completed`: whether request `seq_id` completed (its XU's last completed ≥ it),
    /// for an XU of any type. Its `ret` is written before this turns true.
    ///
    /// # Errors
    /// NRT_INVALID, naming the id, for a sequence id that names no XU of this runtime (another
    /// type, queue or logical core, another process's or runtime's XU) or a request beyond the
    /// XU's last submitted.
    pub fn is_completed(&self, seq_id: SeqId) -> NrtResult<bool> {
        Ok(self.xu_of(seq_id)?.is_completed(seq_id))
    }

    /// `nrta_get_sequence`: the last completed sequence of XU `(lnc, xu_type, queue)` (seq_num 0
    /// before its first completion).
    ///
    /// # Errors
    /// NRT_INVALID for a logical core not visible or a queue index the type does not have.
    pub fn get_sequence(&self, lnc: u32, xu_type: XuType, queue: u32) -> NrtResult<SeqId> {
        Ok(self.xu_at(lnc, xu_type, queue)?.last_completed())
    }

    /// Blocks until `req` — an execution or a tensor operation — completes; returns its
    /// status (`ret`).
    ///
    /// # Errors
    /// NRT_INVALID for a foreign sequence id (as [`Runtime::is_completed`]).
    pub fn wait(&self, req: &ScheduledRequest) -> NrtResult<NrtStatus> {
        self.xu_of(req.seq_id)?
            .wait_for_completion(req.seq_id, None)
            .map_err(|s| {
                status_err(
                    s,
                    format!(
                        "waiting for scheduled request {}",
                        tensor_op::describe(req.seq_id)
                    ),
                )
            })?;
        Ok(req.status().unwrap_or(NrtStatus::Failure))
    }

    /// `nrta_event_register_seq_id_completion`: `Some(fd)` has the runtime write 1 to the
    /// eventfd `fd` when request `seq_id` completes — at once if it already did; every
    /// registration on a request is signalled once. `None` (libnrt's fd −1) removes every
    /// eventfd registered for `seq_id`; none of them is written after this returns. The caller
    /// keeps ownership of its fd: the runtime registers a duplicate, closed after the signal or
    /// the deregistration, so the caller may close its own at any time.
    ///
    /// # Errors
    /// NRT_INVALID, naming the id, as for [`Runtime::is_completed`]; NRT_FAILURE when the fd
    /// cannot be duplicated.
    pub fn event_register_seq_id_completion(
        &self,
        seq_id: SeqId,
        fd: Option<BorrowedFd<'_>>,
    ) -> NrtResult<()> {
        self.xu_of(seq_id)?
            .register_seq_completion(seq_id, fd)
            .map_err(|s| {
                status_err(
                    s,
                    format!(
                        "registering a completion eventfd for sequence id {:#x}",
                        seq_id.raw()
                    ),
                )
            })
    }

    /// `nrta_event_register_xu_completion`: `Some(fd)` has the runtime write 1 to the eventfd
    /// `fd` after every completion of XU `(lnc, xu_type, queue)` from now on (replacing an
    /// earlier registration); `None` (fd −1) deregisters. The caller keeps ownership of its fd
    /// (the runtime holds a duplicate).
    ///
    /// # Errors
    /// NRT_INVALID for a logical core not visible or a queue index the type does not have;
    /// NRT_FAILURE when the fd cannot be duplicated.
    pub fn event_register_xu_completion(
        &self,
        lnc: u32,
        xu_type: XuType,
        queue: u32,
        fd: Option<BorrowedFd<'_>>,
    ) -> NrtResult<()> {
        self.xu_at(lnc, xu_type, queue)?
            .register_xu_completion(fd)
            .map_err(|s| status_err(s, "registering an XU completion eventfd"))
    }

    /// `nrta_cc_schedule`: collectives are not simulated yet, so the COLLECTIVES XUs accept no
    /// work. Checks the queue and logical core, then refuses; nothing is scheduled and no
    /// sequence is consumed.
    ///
    /// # Errors
    /// NRT_INVALID always: for a bad logical core or queue (naming it), else saying that
    /// collectives are not simulated.
    pub fn cc_schedule(&self, lnc: u32, queue: u32) -> NrtResult<SeqId> {
        let xu = self.xu_at(lnc, XuType::Collectives, queue)?;
        Err(status_err(
            NrtStatus::Invalid,
            format!(
                "collectives are not simulated yet: COLLECTIVES execution unit {:#06x} (logical core {lnc}, queue {queue}) accepts no work",
                xu.xu_id().raw()
            ),
        ))
    }

    /// `kbl_compute_setup`: takes the main TPB's `compute_req_lock` once, stages every TPB of
    /// the vNC in order under it (no per-TPB lock), then assigns the fan-out's single
    /// `compute_idx = compute_idx_tail++` of the main TPB.
    fn stage(
        &self,
        m: &LoadedModel,
        info: &mut ExecInfo<ExecRequest>,
        model_switch: bool,
        skip: bool,
    ) -> NrtResult<()> {
        let tpbs = m.tpbs();
        let main = self
            .hw_queues
            .get(&tpbs[0].nc)
            .ok_or_else(|| status_err(NrtStatus::Failure, "no exec queue"))?;
        let mut req = main
            .compute_req_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let resources = info
            .request
            .resources
            .as_ref()
            .ok_or_else(|| status_err(NrtStatus::Failure, "no resources"))?;
        let model = m.model();
        // The collectives chain rides only on the first NC of the vcore, only on a switch.
        let chain = if model_switch && model.has_collectives {
            Some(m.cc_chain()?)
        } else {
            None
        };
        let compute_idx = req.compute_idx_tail();
        for (i, tpb) in tpbs.iter().enumerate() {
            // A NEFF's program chunk stays mapped while the model is loaded (unload waits for
            // this execution first).
            let neff_map = tpb.neff.as_ref().map(|n| {
                (
                    n,
                    n.program
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                )
            });
            let dge = match &neff_map {
                Some((n, map)) => Some(DgeWrite {
                    chunk: map.as_ref().ok_or_else(|| {
                        status_err(NrtStatus::Failure, "NEFF program chunk unmapped")
                    })?,
                    header: &n.header,
                    entries: resources.tdrv.dge.get(i).map_or(&[][..], Vec::as_slice),
                }),
                None => None,
            };
            let program = StagedProgram {
                engine_addresses: tpb.engine_addresses,
                exec_req_flags: &model.exec_req_flags,
                table_hashes: (&model.act_table_hash, &model.dve_table_hash),
                io: resources.tdrv.ioqs.get(i).map_or(&[][..], Vec::as_slice),
                cc_chain: if i == 0 { chain } else { None },
                encoding: if tpb.neff.is_some() {
                    ProgramEncoding::Neff
                } else {
                    ProgramEncoding::SimdevIsa
                },
                dge,
            };
            let staged =
                req.tpb_mut(tpb.nc)?
                    .add_exec_request(compute_idx, &program, model_switch, skip)?;
            tracing::trace!(
                target: "nrt::submit",
                nc = tpb.nc,
                compute_idx,
                exec_pairs = staged.exec_pairs,
                "staged"
            );
        }
        info.request.compute_idx = req.next_compute_idx();
        Ok(())
    }

    /// Writes the timeline file (`NEURON_RT_TRACE`): this runtime's spans and, drained now,
    /// the device's events of its NCs. `Ok(None)` when the timeline is off. [`Runtime::close`]
    /// calls it once the workers stopped; a drain takes the device's events, so a second call
    /// holds none.
    ///
    /// # Errors
    /// Creating or writing the file.
    fn write_timeline(&self) -> std::io::Result<Option<std::path::PathBuf>> {
        let (Some(path), Some(subscribed)) = (&self.config.trace_file, &self.device_trace) else {
            return Ok(None);
        };
        let mut device = Vec::new();
        let source = match subscribed {
            Ok(clock) => {
                let mut clock = *clock;
                let mut dropped = 0u64;
                let mut drained = Ok(());
                // Each reply holds one message's worth; bounded by what simdev can hold.
                for _ in 0..=crate::trace::MAX_DRAINS {
                    match self.device.trace_drain() {
                        Ok(batch) => {
                            device.extend(batch.events);
                            dropped = dropped.saturating_add(batch.dropped);
                            clock = batch.clock;
                            if !batch.more {
                                break;
                            }
                        }
                        Err(e) => {
                            drained = Err(e);
                            break;
                        }
                    }
                }
                match drained {
                    Ok(()) => crate::trace::file::DeviceSource::Simdev { clock, dropped },
                    Err(e) => crate::trace::file::DeviceSource::None(format!(
                        "draining the device's events failed: {e}"
                    )),
                }
            }
            Err(why) => crate::trace::file::DeviceSource::None(why.clone()),
        };
        let (spans, threads) = self.timeline.snapshot();
        let vncs: Vec<Vec<u32>> = self.vncs.iter().map(|v| v.ncs.clone()).collect();
        let command = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "runtime".to_owned());
        let contents = crate::trace::file::Contents {
            pid: self.pid,
            command: &command,
            origin_ns: self.timeline_origin_ns,
            spans: &spans,
            threads: &threads,
            dropped_spans: self.timeline.dropped(),
            vncs: &vncs,
            device: &device,
            source: &source,
        };
        let file = std::fs::File::create(path)?;
        contents.write_json(file)?;
        let dropped_device = match source {
            crate::trace::file::DeviceSource::Simdev { dropped, .. } => dropped,
            crate::trace::file::DeviceSource::None(_) => 0,
        };
        if contents.dropped_spans > 0 || dropped_device > 0 {
            tracing::warn!(
                "NEURON_RT_TRACE: {} holds the first {} runtime spans and the device's first {} events per NC; {} later spans and {} device events were dropped (otherData says so too)",
                path.display(),
                crate::trace::DEFAULT_MAX_SPANS,
                DEVICE_TRACE_EVENTS_PER_NC,
                contents.dropped_spans,
                dropped_device
            );
        }
        Ok(Some(path.clone()))
    }

    /// `nrt_close`: drains and stops every XU, joins the workers, unloads the models, releases
    /// the exec queues and the NCs; no request of the teardown waits on the device longer than
    /// the execution timeout in all ([`crate::backend::Device::closing_by`]). A private simdev
    /// stops when the device is dropped. In a process forked after init it does nothing to the
    /// device: the runtime is leaked.
    pub fn close(mut self) {
        if self.check_process().is_err() {
            tracing::warn!(
                pid = self.pid,
                "nrt_close of a runtime initialised in another process (this one was forked from it): leaked"
            );
            return; // Drop leaks what acts on the parent's state.
        }
        if let Some(pool) = self.pool.take() {
            pool.shutdown();
        }
        crate::xu::execution_unit::shutdown(&self.xus.iter().cloned().collect::<Vec<_>>());
        if let Some(w) = self.workers.take() {
            w.destroy();
        }
        // Nothing runs any more: what is left are requests that give back what the runtime
        // holds. A device that has not answered them by then is stopped or stuck, and the
        // release below gives everything back anyway.
        if let Some(deadline) = std::time::Instant::now().checked_add(self.longest_exec_timeout()) {
            self.device.closing_by(deadline);
        }
        if let Some(t) = self.tensor_ops.take() {
            t.release();
        }
        // Every span is recorded (the workers are joined); the device's events go before the
        // NCs are released (a release ends their subscription).
        if let Err(e) = self.write_timeline() {
            let path = self
                .config
                .trace_file
                .as_deref()
                .unwrap_or(std::path::Path::new(""));
            tracing::error!(error = %e, "writing the timeline to {} (NEURON_RT_TRACE)", path.display());
        }
        // A profile still being captured is written as `nrt_profile_stop` would: its file was
        // created at start and would stay empty, its executions lost with the runtime.
        for path in self.trace.active_profiles() {
            match self.profile_stop(&path) {
                Ok(()) => tracing::info!(
                    "nrt_close: wrote the profile still being captured to {}",
                    path.display()
                ),
                Err(e) => {
                    tracing::error!(error = %e, "nrt_close: the profile still being captured")
                }
            }
        }
        self.models.unload_all();
        // Each logical core's queues are listed under each of its NCs: the last reference
        // releases them.
        for (_, q) in self.hw_queues.drain() {
            if let Ok(q) = Arc::try_unwrap(q) {
                q.release();
            }
        }
        for c in self.claimed.drain(..) {
            let _ = self.device.release_nc(c.nc);
        }
        self.datastore.close();
    }
}

/// The libnrt-shaped, process-global API with the seed's lifecycle gates: before `init` every
/// call answers NRT_UNINITIALIZED (13), after `close` NRT_CLOSED (14). In a process forked after
/// `init` every call answers NRT_UNINITIALIZED naming the initialising process until `init` is
/// called in this process; `close` there leaves the inherited runtime alone.
pub mod nrt {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use shared::NrtStatus;

    use super::{ModelHandle, Runtime};
    use crate::backend::{OpenOptions, open};
    use crate::config::RuntimeConfig;
    use crate::error::{NrtError, NrtResult};
    use crate::tensor::{Placement, Tensor, TensorSet};

    #[derive(Debug)]
    enum State {
        Uninitialized,
        Initialized(Arc<Runtime>),
        /// Being closed by process `pid`: calls answer NRT_CLOSED; another `close` or an `init`
        /// waits on [`CLOSED`] until it is closed. (A pid, not a lock held across the drain: a
        /// child forked meanwhile sees its parent's close and is not stuck behind it.)
        Closing(u32),
        /// Closed by process `pid`.
        Closed(u32),
    }

    static STATE: Mutex<State> = Mutex::new(State::Uninitialized);
    /// Notified when a `Closing` state becomes `Closed`.
    static CLOSED: std::sync::Condvar = std::sync::Condvar::new();

    fn state() -> std::sync::MutexGuard<'static, State> {
        STATE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The exit hook of a traced runtime (`NEURON_RT_TRACE`): a program that returns from
    /// `main` (or calls `exit`) without `nrt_close` still gets its timeline, written as close
    /// would. Never unwinds into `exit`; does nothing while another thread holds the state (it
    /// is initialising or closing a runtime) or for a runtime of another process.
    extern "C" fn write_timeline_at_exit() {
        let _ = std::panic::catch_unwind(|| {
            let st = match STATE.try_lock() {
                Ok(st) => st,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            if let State::Initialized(rt) = &*st
                && rt.check_process().is_ok()
                && let Err(e) = rt.write_timeline()
            {
                eprintln!("nrt: writing the NEURON_RT_TRACE timeline at exit: {e}");
            }
        });
    }

    /// `st`, once no close of this process is in progress (one on another thread is waited
    /// for: its drain ends within the execution timeout).
    fn after_closing(
        mut st: std::sync::MutexGuard<'static, State>,
    ) -> std::sync::MutexGuard<'static, State> {
        let me = crate::process::id();
        while matches!(*st, State::Closing(pid) if pid == me) {
            st = CLOSED
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        st
    }

    fn runtime() -> NrtResult<Arc<Runtime>> {
        match &*state() {
            State::Initialized(rt) => {
                rt.check_process()?;
                Ok(rt.clone())
            }
            State::Uninitialized => Err(NrtError::new(
                NrtStatus::Uninitialized,
                "nrt_init has not been called",
            )),
            State::Closed(pid) | State::Closing(pid) if *pid != crate::process::id() => {
                Err(NrtError::new(
                    NrtStatus::Uninitialized,
                    format!(
                        "nrt_init has not been called in this process (nrt_close was called in process {pid}, which this one was forked from)"
                    ),
                ))
            }
            State::Closed(_) | State::Closing(_) => Err(NrtError::new(
                NrtStatus::Closed,
                "nrt_close has been called",
            )),
        }
    }

    /// `nrt_init`: opens the device chosen by `NEURON_RT_BACKEND` and `opts`, reads the
    /// configuration from the environment.
    ///
    /// In a process forked after the parent's `init`, the inherited state is leaked (never
    /// dropped: that would act on the parent's device state) and this process initialises its
    /// own runtime. After `close` a new runtime may be initialised; the closed one's handles
    /// stay refused (NRT_INVALID: another runtime's).
    ///
    /// # Errors
    /// NRT_FAILURE when already initialised; the device's and configuration's errors (a
    /// runtime abandoned by `close` still holding its cores: NRT_LOAD_NOT_ENOUGH_NC).
    pub fn init_with(opts: &OpenOptions) -> NrtResult<()> {
        // An init while this process closes the runtime on another thread waits for the close.
        let mut st = after_closing(state());
        let me = crate::process::id();
        let inherited = match &*st {
            State::Initialized(rt) => rt.pid() != me,
            State::Closed(pid) | State::Closing(pid) => *pid != me,
            State::Uninitialized => false,
        };
        if inherited {
            std::mem::forget(std::mem::replace(&mut *st, State::Uninitialized));
        }
        // After this process's nrt_close a new runtime may start (a test suite creating and
        // closing one per test does): the closed one released its cores and its device.
        if matches!(*st, State::Closed(_)) {
            *st = State::Uninitialized;
        }
        if !matches!(*st, State::Uninitialized) {
            return Err(NrtError::new(
                NrtStatus::Failure,
                "nrt_init has already been called in this process (nrt_close it first)",
            ));
        }
        let config =
            RuntimeConfig::from_env().map_err(|e| NrtError::new(e.status(), e.to_string()))?;
        config.log_notes();
        let device = open(opts)?;
        let traced = config.trace_file.is_some();
        *st = State::Initialized(Arc::new(Runtime::init(Arc::from(device), config)?));
        if traced {
            static HOOK: std::sync::Once = std::sync::Once::new();
            // Registered after the private simdev's exit hook (at its start, above), so it
            // runs first: the device is still there to hand over its events.
            HOOK.call_once(|| {
                if !crate::process::on_exit(write_timeline_at_exit) {
                    tracing::warn!(
                        "atexit failed: a program that exits without nrt_close leaves the NEURON_RT_TRACE file empty"
                    );
                }
            });
        }
        Ok(())
    }

    /// `nrt_init` with options from the environment.
    ///
    /// # Errors
    /// As [`init_with`].
    pub fn init() -> NrtResult<()> {
        init_with(&OpenOptions::from_env()?)
    }

    /// `nrt_close`: closes the runtime; a second call is harmless. In a process forked after
    /// the parent's `init` (and before its own), it changes nothing.
    ///
    /// Calls in progress on other threads when it is called (each holds the runtime for its
    /// duration; calls made after it answer NRT_CLOSED) are waited for — a request one of them
    /// schedules is accepted and drained like any other — for at most the execution timeout
    /// (at most an hour) and [`CLOSE_GRACE`] more (a sync execution ends within its timeout).
    ///
    /// Says how it ended ([`Closed`]). A `close` while another thread of this process closes
    /// waits for that close and then says [`Closed::Drained`]: when any `close` returns, the
    /// runtime is closed.
    pub fn close() -> Closed {
        close_then(|_| {})
    }

    /// [`close`], with `after` run once the runtime is closed and before any other `close` or
    /// `init` of this process returns: the C library writes the drained requests' statuses
    /// there. It runs only in the call that closed a runtime (how: its argument), not in one
    /// that found it closed.
    pub fn close_then(after: impl FnOnce(Closed)) -> Closed {
        if crate::async_pool::in_exec_callback() {
            tracing::error!(
                "nrt_close called from the async exec callback, which runs on the runtime's own exec thread: closing waits for that thread, so it would wait for itself; not closed (close after the callback returns)"
            );
            return Closed::Refused;
        }
        let me = crate::process::id();
        let mut st = after_closing(state());
        if let State::Initialized(rt) = &*st
            && rt.check_process().is_err()
        {
            return Closed::Inherited;
        }
        let State::Initialized(rt) = std::mem::replace(&mut *st, State::Closing(me)) else {
            *st = State::Closed(me);
            return Closed::Drained;
        };
        drop(st);
        // Published (and waiters woken) however the drain ends, a panic included.
        struct Publish;
        impl Drop for Publish {
            fn drop(&mut self) {
                *state() = State::Closed(crate::process::id());
                CLOSED.notify_all();
            }
        }
        let _publish = Publish;
        // An execution timeout of hours is not waited for in full.
        let budget = rt.longest_exec_timeout().min(Duration::from_secs(3600)) + CLOSE_GRACE;
        let deadline = Instant::now() + budget;
        let closed = match wait_for_calls(rt, deadline) {
            Ok(rt) => {
                let device = rt.device().clone();
                rt.close();
                // The device init opened (a private simdev) stops now, even while tensors
                // the caller has not freed hold it.
                device.release();
                Closed::Drained
            }
            Err(calls) => {
                tracing::error!(
                    calls,
                    "nrt_close: {calls} call(s) on other threads still in progress after the execution timeout; the runtime is released when they return, and requests they scheduled may never complete"
                );
                Closed::Abandoned
            }
        };
        after(closed);
        closed
    }

    /// How [`close`] ended.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Closed {
        /// Closed (now or before; or never initialised): every accepted request completed and
        /// its status is published, every resource released.
        Drained,
        /// Calls on other threads still ran at the deadline: the runtime is released when they
        /// return; requests not completed by then may never be.
        Abandoned,
        /// In a process forked after the parent's `init`: nothing changed (the runtime, its
        /// threads and its eventfds are the parent's).
        Inherited,
        /// Called from the implicit-async completion callback, on the runtime's own exec
        /// thread, which closing waits for: nothing changed (logged).
        Refused,
    }

    /// What [`close`] waits beyond the execution timeout for calls in progress.
    pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

    /// `rt` alone (every call in progress returned), or, at `deadline`, how many calls still
    /// hold it.
    fn wait_for_calls(mut rt: Arc<Runtime>, deadline: Instant) -> Result<Runtime, usize> {
        let mut said = false;
        loop {
            rt = match Arc::try_unwrap(rt) {
                Ok(rt) => return Ok(rt),
                Err(rt) => rt,
            };
            let calls = Arc::strong_count(&rt) - 1;
            if Instant::now() >= deadline {
                return Err(calls);
            }
            if !said {
                tracing::info!(
                    calls,
                    "nrt_close waits for the calls in progress on other threads"
                );
                said = true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// `nrt_load`.
    ///
    /// # Errors
    /// The gates (13, 14), then [`Runtime::load`]'s.
    pub fn load(bytes: &[u8], vnc: i32) -> NrtResult<ModelHandle> {
        runtime()?.load(bytes, vnc)
    }

    /// `nrt_unload`.
    ///
    /// # Errors
    /// The gates, then [`Runtime::unload`]'s.
    pub fn unload(model: ModelHandle) -> NrtResult<()> {
        runtime()?.unload(model)
    }

    /// `nrt_tensor_allocate`.
    ///
    /// # Errors
    /// The gates, then [`Runtime::tensor_allocate`]'s.
    pub fn tensor_allocate(placement: Placement, size: u64, name: &str) -> NrtResult<Tensor> {
        runtime()?.tensor_allocate(placement, size, name)
    }

    /// `nrt_execute`.
    ///
    /// # Errors
    /// The gates (13 before init, 14 after close), then [`Runtime::execute`]'s.
    pub fn execute(model: ModelHandle, inputs: &TensorSet, outputs: &TensorSet) -> NrtResult<()> {
        runtime()?.execute(model, inputs, outputs)
    }

    /// `nrt_execute_repeat`.
    ///
    /// # Errors
    /// The gates, then [`Runtime::execute_repeat`]'s.
    pub fn execute_repeat(
        model: ModelHandle,
        inputs: &TensorSet,
        outputs: &TensorSet,
        repeat: i32,
    ) -> NrtResult<()> {
        runtime()?.execute_repeat(model, inputs, outputs, repeat)
    }

    /// The device's physical NC count and generation, probed once without initialising: opens
    /// the device the environment selects (a private simdev starts and stops), reads its info.
    fn probe_device(opts: &OpenOptions) -> NrtResult<(u32, shared::Arch)> {
        static PROBED: std::sync::OnceLock<(u32, shared::Arch)> = std::sync::OnceLock::new();
        if let Some(p) = PROBED.get() {
            return Ok(*p);
        }
        let device = open(opts)?;
        let info = device.info();
        Ok(*PROBED.get_or_init(|| (info.nc_count, info.arch)))
    }

    /// The initialised runtime of this process, if any (no gate error).
    fn initialized() -> Option<Arc<Runtime>> {
        match &*STATE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            State::Initialized(rt) if rt.check_process().is_ok() => Some(rt.clone()),
            _ => None,
        }
    }

    /// `nrt_get_total_vnc_count`: logical cores of the device, whatever NEURON_RT_VISIBLE_CORES
    /// and NEURON_RT_NUM_CORES say. Callable before `init` (it then opens the device once to
    /// count its cores, as `opts` selects it).
    ///
    /// # Errors
    /// A malformed NEURON_LOGICAL_NC_CONFIG or one the device cannot have; no device.
    pub fn total_vnc_count(opts: &OpenOptions) -> NrtResult<u32> {
        if let Some(rt) = initialized() {
            return Ok(rt.device().info().nc_count / rt.lnc());
        }
        // Only the logical core size counts here: a malformed NEURON_RT_VISIBLE_CORES or
        // NEURON_RT_NUM_CORES is refused by `init` and the visible count, not by this one.
        let config = RuntimeConfig {
            lnc: RuntimeConfig::lnc_from_lookup(|k| std::env::var(k).ok())
                .map_err(|e| NrtError::new(e.status(), e.to_string()))?,
            ..RuntimeConfig::default()
        };
        let (ncs, arch) = probe_device(opts)?;
        let lnc = config
            .lnc_on(arch)
            .map_err(|m| NrtError::new(NrtStatus::Invalid, m))?;
        Ok(ncs / lnc)
    }

    /// `nrt_get_visible_vnc_count`: logical cores this process has (after `init`) or would
    /// have (before it: the environment's selection applied to the device's cores).
    ///
    /// # Errors
    /// A bad configuration or an impossible selection; no device.
    pub fn visible_vnc_count(opts: &OpenOptions) -> NrtResult<u32> {
        if let Some(rt) = initialized() {
            return Ok(rt.visible_vnc_count());
        }
        let config =
            RuntimeConfig::from_env().map_err(|e| NrtError::new(e.status(), e.to_string()))?;
        let total = total_vnc_count(opts)?;
        match config
            .select_vncs(total)
            .map_err(|m| NrtError::new(NrtStatus::LoadNotEnoughNc, m))?
        {
            crate::config::CoreSelection::Fixed { count, .. }
            | crate::config::CoreSelection::Free { count } => Ok(count),
        }
    }

    /// The initialised runtime, for calls beyond this facade.
    ///
    /// # Errors
    /// The gates.
    pub fn current() -> NrtResult<Arc<Runtime>> {
        runtime()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::xu::Progress;

    /// A completion engine whose executions never end.
    #[derive(Debug)]
    struct NeverDone;

    impl CompletionEngine for NeverDone {
        type Request = ();

        fn progress_one_step(&self, _vnc: u32, _info: &mut ExecInfo<()>) -> Progress {
            Progress::InFlight
        }
    }

    #[test]
    fn queue_full_is_retried_every_100us_until_it_clears() {
        let attempts = Cell::new(0u32);
        let started = Instant::now();
        let r = schedule_retrying_queue_full(Duration::from_secs(5), || {
            attempts.set(attempts.get() + 1);
            if attempts.get() < 4 {
                Err(status_err(NrtStatus::QueueFull, "full"))
            } else {
                Ok(7)
            }
        });
        assert_eq!(r.unwrap(), 7);
        assert_eq!(attempts.get(), 4);
        assert!(
            started.elapsed() >= QUEUE_FULL_BACKOFF * 3,
            "backs off between attempts"
        );
    }

    #[test]
    fn queue_full_past_the_budget_is_nrt_timeout_and_other_refusals_return_at_once() {
        let attempts = Cell::new(0u32);
        let e = schedule_retrying_queue_full(Duration::from_millis(20), || -> NrtResult<()> {
            attempts.set(attempts.get() + 1);
            Err(status_err(NrtStatus::QueueFull, "full"))
        })
        .unwrap_err();
        assert_eq!(e.status, NrtStatus::Timeout);
        assert!(attempts.get() > 1);
        let attempts = Cell::new(0u32);
        let e = schedule_retrying_queue_full(Duration::from_secs(5), || -> NrtResult<()> {
            attempts.set(attempts.get() + 1);
            Err(status_err(NrtStatus::ExecUnitUnrecoverable, "poisoned"))
        })
        .unwrap_err();
        assert_eq!(
            (e.status, attempts.get()),
            (NrtStatus::ExecUnitUnrecoverable, 1)
        );
    }

    #[test]
    fn the_poll_fallback_waits_the_wait_budget_then_times_out() {
        // No pooled eventfd: the sync wait polls, bounded by the budget it is given (a `None`
        // budget would poll forever and this test would hang).
        let xu = Xu::new(
            XuConfig {
                vnc: 0,
                queue: 0,
                tpbs: vec![0],
                capacity: 4,
                efd_pool_size: 0,
                implicit_async_mode: false,
            },
            Arc::new(NeverDone),
            Arc::new(Metrics::new(1)),
        )
        .unwrap();
        let seq = xu
            .schedule_request(
                Box::new(ExecInfo::execute(1, ())),
                None,
                |_, _| Ok(()),
                |_| Ok(()),
            )
            .unwrap();
        let budget = Duration::from_millis(30);
        let started = Instant::now();
        let e = wait_sync(&xu, seq, budget).unwrap_err();
        assert_eq!(e.status, NrtStatus::Timeout);
        assert!(started.elapsed() >= budget);
        assert!(e.message.contains("budget"), "{e}");
    }
}

#[cfg(test)]
mod in_process_tests;
mod profiling;
