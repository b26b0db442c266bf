//! The XU (`tpb_execution_unit_t`): one per (vNC, XU type, queue), holding the work queue, the
//! counted wake-up eventfd, the three locks, and the worker-side step (seed 004 §3, §5, §6;
//! seed 000 §4). The type only picks the completion engine and goes into the xu_id; every type
//! shares this ring, funnel, step and completion hand-off.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::eventfd::{EfdFlags, EventFd};
use shared::NrtStatus;
use shared::ids::{SeqId, XuId, XuType};

use super::execution_unit::{ExecutionUnit, StepOutcome, Wake, WorkerKey, sealed};
use super::handoff::CompEfd;
use super::queue::{Consumer, ExecStatus, Install, Producer, Registration, XuQueue};
use super::sync::{AtomicBool, AtomicU8, AtomicU64, Mutex, Ordering, lock};
use crate::error::{NrtError, os_error};
use crate::metrics::{Metrics, TpbResponse};

/// Queue indexes an xu_id can name (its queue field has 4 bits).
pub const XU_QUEUE_LIMIT: u8 = 16;

/// Most physical NCs (TPBs) one vNC binds (`MAX_VIRTUAL_TPB_CORE_SIZE`: LNC=2).
pub const MAX_TPBS_PER_VNC: usize = 2;

/// What a work item asks the worker to do (`tpb_execution_info_t.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecKind {
    /// Run a model (type 0).
    Execute,
    /// Stop request scheduled at shutdown (type 1): no execution, no metrics.
    Stop,
}

/// The work item of one slot (`tpb_execution_info_t`): allocated per request, owned by the ring
/// from submit until the worker frees it. `R` is the completion engine's per-request state.
#[derive(Debug)]
pub struct ExecInfo<R> {
    /// Execute or stop.
    pub kind: ExecKind,
    /// Id of the model this execution runs (drives the model-switch decision).
    pub model_id: u64,
    /// When the request was submitted (host monotonic clock), for the end-to-end latency.
    pub submission_ts: Instant,
    /// Whether a thread blocks on the result (sync) or not (explicit async).
    pub sync_exec: bool,
    /// The model's datastore slot (set at submit; `None`: not counted per model).
    pub model_slot: Option<crate::datastore::ModelSlot>,
    /// Per-TPB results, filled by the completion engine (`infer_resp_t`).
    pub resp: [TpbResponse; MAX_TPBS_PER_VNC],
    /// The completion engine's state for this request.
    pub request: R,
}

impl<R> ExecInfo<R> {
    /// An EXECUTE item for `model_id`, stamped now.
    pub fn execute(model_id: u64, request: R) -> Self {
        Self {
            kind: ExecKind::Execute,
            model_id,
            submission_ts: Instant::now(),
            sync_exec: true,
            model_slot: None,
            resp: [TpbResponse::default(); MAX_TPBS_PER_VNC],
            request,
        }
    }

    /// A STOP item.
    pub fn stop(request: R) -> Self {
        Self {
            kind: ExecKind::Stop,
            ..Self::execute(0, request)
        }
    }
}

/// One non-blocking step's outcome (`exec_request_progress_one_step`: 0 done, 1 in flight,
/// 2 error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The execution ended with this status (success or an execution error such as 1004).
    Done(NrtStatus),
    /// Still running: the worker returns and is woken again (the wake-up count is not consumed).
    InFlight,
    /// The unit can no longer be trusted: the XU is poisoned (FATAL_SHUTDOWN) and the request
    /// completes with this status.
    Error(NrtStatus),
}

/// The completion engine the worker drives: harvests one request's completion without
/// blocking. Each XU type has its own (the notification-queue engine for COMPUTE, the DMA engine
/// for TENSOR_OP, [`CollectivesEngine`] for COLLECTIVES); tests use doubles.
///
/// The worker owns all waiting: one worker thread steps every XU of its vNC, so a step must not
/// sleep waiting for the device (it would stall the vNC's other XUs). To wait, a step returns
/// [`Progress::InFlight`] and [`CompletionEngine::wake_on`] names the fd the worker epolls
/// before stepping the request again.
pub trait CompletionEngine: Send + Sync + std::fmt::Debug + 'static {
    /// Per-request state carried in [`ExecInfo::request`] (the default value is the STOP
    /// item's request).
    type Request: Default + Send + std::fmt::Debug + 'static;

    /// One non-blocking step of request `info` on vNC `vnc` (first call: init state; later
    /// calls: poll).
    fn progress_one_step(&self, vnc: u32, info: &mut ExecInfo<Self::Request>) -> Progress;

    /// After [`Progress::InFlight`]: what the worker waits on before stepping `info` again.
    /// `None` (the default): step again as soon as the worker has looked at its other XUs.
    fn wake_on(&self, _vnc: u32, _info: &ExecInfo<Self::Request>) -> Option<Wake<'_>> {
        None
    }

    /// After EXECUTE request `info` completed and left no released request behind (called
    /// before its pop; a request released meanwhile is covered by the watch only if
    /// [`CompletionEngine::progress_shows_on`] says so): where the progress of the next request
    /// of this vNC will show (the notification eventfd the request completed through, on
    /// simdev), with `within` bounding how long the worker watches it instead of
    /// `has_work_efd` ([`StepOutcome::Idle`]). `within` also bounds how late a request that
    /// makes no progress there (a STOP, a step past on a degraded XU, a request whose
    /// notification never comes) is first stepped. `None` (the default): the worker watches
    /// `has_work_efd` at once.
    fn idle_wake(&self, _vnc: u32, _info: &ExecInfo<Self::Request>) -> Option<Wake<'_>> {
        None
    }

    /// Whether the progress of EXECUTE request `info` — released while the step that chose
    /// the idle watch `wake` ([`CompletionEngine::idle_wake`]) was ending, never stepped —
    /// will still write `wake`'s fd: nothing of it is posted yet where the fd reports (the
    /// device posts before it writes the fd), so its write comes after this and wakes the
    /// watch. Judged without a system call. Then the worker
    /// enters the watch instead of stepping `info` at once on its `has_work_efd` count (a step
    /// that would find it in flight: on a shared CPU, the submitter woken by the completion
    /// often runs before the worker has left its step). A wrong `true` loses the wake-up for
    /// the watch's `within`; `false` (the default) steps `info` on its count.
    fn progress_shows_on(
        &self,
        _vnc: u32,
        _info: &ExecInfo<Self::Request>,
        _wake: &Wake<'_>,
    ) -> bool {
        false
    }

    /// Whether a step of in-flight EXECUTE request `info` would find progress to harvest now
    /// (its notification already posted, on simdev), judged without a system call and without
    /// consuming anything. The worker uses it to step the next released request at once after a
    /// completion instead of going back to `epoll_wait` ([`StepOutcome::Ready`] bursts). A
    /// wrong `true` costs one step that finds the request in flight; `false` (the default)
    /// leaves the request to the worker's epoll.
    fn progress_posted(&self, _vnc: u32, _info: &ExecInfo<Self::Request>) -> bool {
        false
    }

    /// The funnel's first gate for an EXECUTE item: an engine that cannot run this kind of work
    /// refuses it here, before anything is staged or a sequence is consumed.
    ///
    /// # Errors
    /// The refusal's status (NRT_INVALID for work this XU type does not take).
    fn admit(&self, _info: &ExecInfo<Self::Request>) -> Result<(), NrtStatus> {
        Ok(())
    }

    /// EXECUTE request `seq_id` ended with `status` (done, failed, or stepped past on a
    /// degraded XU): the engine's last look at it, by the worker, before its status is published
    /// and its work item freed (the TENSOR_OP engine records it in the system trace). Must not
    /// block.
    fn completed(
        &self,
        _vnc: u32,
        _seq_id: SeqId,
        _info: &ExecInfo<Self::Request>,
        _status: NrtStatus,
    ) {
    }

    /// The STOP request path (`dlr_wait_model_stop_request`); an error poisons the XU.
    ///
    /// # Errors
    /// The status to complete the STOP with.
    fn wait_model_stop(&self, _vnc: u32) -> Result<(), NrtStatus> {
        Ok(())
    }

    /// Releases a model's staging whose unstage was deferred until its last execution on this
    /// XU finished (`kmgr_unstage_kelf_model`).
    fn unstage_model(&self, _model_id: u64) {}
}

/// The COLLECTIVES XUs' engine: collectives are not simulated yet, so it admits no work (the
/// funnel answers NRT_INVALID, nothing consumed). Its XUs exist and are reachable by id; STOP
/// items at shutdown pass.
#[derive(Debug, Default)]
pub struct CollectivesEngine;

impl CompletionEngine for CollectivesEngine {
    type Request = ();

    fn progress_one_step(&self, _vnc: u32, _info: &mut ExecInfo<()>) -> Progress {
        // Unreachable: `admit` refuses every EXECUTE item.
        Progress::Done(NrtStatus::Invalid)
    }

    fn admit(&self, _info: &ExecInfo<()>) -> Result<(), NrtStatus> {
        Err(NrtStatus::Invalid)
    }
}

/// `health_status` of an XU.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XuHealth {
    /// Accepting work.
    Healthy = 0,
    /// Shutting down: new executions get NRT_CLOSED; STOP requests still pass.
    Shutdown = 1,
    /// Poisoned: every submit gets NRT_EXEC_UNIT_UNRECOVERABLE (101), queued work steps past
    /// with 101 without running.
    FatalShutdown = 2,
}

impl XuHealth {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Healthy,
            1 => Self::Shutdown,
            _ => Self::FatalShutdown,
        }
    }
}

/// State the submit funnel owns, under `submit_work_lock`: the ring's only producer lives
/// here, so only the lock's holder can submit or trigger.
#[derive(Debug)]
struct SubmitState<T> {
    producer: Producer<T>,
    last_posted_model: Option<u64>,
}

/// State under `unstage_lock`.
#[derive(Debug, Default)]
struct UnstageState {
    last_exec_model: [Option<u64>; MAX_TPBS_PER_VNC],
    deferred_unstage_ref: [Option<u64>; MAX_TPBS_PER_VNC],
}

/// A pool of blocking completion eventfds for synchronous waiters (`efd_from_pool`). A waiter
/// takes one out, installs a reference to it in its slot ([`CompEfd::Pool`]) and gives it back
/// once woken; an eventfd whose waiter gave up stays out of the pool (the slot's reference
/// closes it after the signal), so a late signal can never wake the next waiter.
#[derive(Debug)]
pub(crate) struct EfdPool {
    free: Mutex<Vec<Arc<EventFd>>>,
}

impl EfdPool {
    /// A pool of `size` eventfds (`eventfd(0, EFD_CLOEXEC)`, blocking).
    ///
    /// # Errors
    /// The eventfd creation error.
    pub(crate) fn new(size: usize) -> Result<Self, Errno> {
        Self::with_flags(size, EfdFlags::EFD_CLOEXEC)
    }

    fn with_flags(size: usize, flags: EfdFlags) -> Result<Self, Errno> {
        let free = (0..size)
            .map(|_| EventFd::from_value_and_flags(0, flags).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            free: Mutex::new(free),
        })
    }

    fn take(&self) -> Option<Arc<EventFd>> {
        lock(&self.free).pop()
    }

    fn give_back(&self, efd: Arc<EventFd>) {
        lock(&self.free).push(efd);
    }

    /// Eventfds currently free.
    #[cfg(all(test, not(loom)))]
    fn available(&self) -> usize {
        lock(&self.free).len()
    }

    /// Writes 1 to every free eventfd: a spurious wake-up, for testing the runtime-bug check.
    #[cfg(all(test, not(loom)))]
    fn poke_all(&self) {
        for efd in lock(&self.free).iter() {
            let _ = efd.write(1);
        }
    }
}

/// Configuration of one XU.
#[derive(Clone, Debug, Default)]
pub struct XuConfig {
    /// The vNC (index into the XU table).
    pub vnc: u32,
    /// The queue index within the XU type (the xu_id's queue field).
    pub queue: u8,
    /// Physical NCs bound to the vNC (1, or 2 at LNC=2), for per-TPB metrics.
    pub tpbs: Vec<u32>,
    /// Ring capacity in slots (> 0).
    pub capacity: usize,
    /// Completion eventfds in the pool for synchronous waiters.
    pub efd_pool_size: usize,
    /// The process runs the implicit-async pool: this XU must never run a request (seed 004
    /// §7: `tpb_xu_step` asserts `!implicit_async_mode`).
    pub implicit_async_mode: bool,
}

/// One XU. Producer side: [`Xu::schedule_request`] (any thread; the ring's producer lives
/// inside `submit_work_lock`). Consumer side: `step` (crate-private, the vNC's worker only; the
/// ring's consumer lives inside the worker's lock). What is public besides submitting and
/// waiting is a read-only view: depth, last completed, completion of a seq_id, health, xu_id.
///
/// ```compile_fail,E0624
/// // The worker side is not reachable from outside the crate.
/// fn step_from_outside<E: runtime::xu::CompletionEngine>(xu: &runtime::xu::Xu<E>) {
///     xu.step();
/// }
/// ```
///
/// ```
/// fn read_only_view<E: runtime::xu::CompletionEngine>(xu: &runtime::xu::Xu<E>) {
///     let _ = (xu.depth(), xu.last_completed(), xu.health(), xu.xu_id());
///     let _ = xu.is_completed(xu.last_completed());
/// }
/// ```
#[derive(Debug)]
pub struct Xu<E: CompletionEngine> {
    vnc: u32,
    tpbs: Vec<u32>,
    work_queue: Arc<XuQueue<ExecInfo<E::Request>>>,
    has_work_efd: EventFd,
    submit_work_lock: Mutex<SubmitState<ExecInfo<E::Request>>>,
    /// The ring's consumer: locked only by the worker's step (uncontended).
    worker: Mutex<Consumer<ExecInfo<E::Request>>>,
    unstage_lock: Mutex<UnstageState>,
    health: AtomicU8,
    efd_pool: EfdPool,
    engine: Arc<E>,
    metrics: Arc<Metrics>,
    steps: std::sync::atomic::AtomicU64,
    /// `write(has_work_efd, 1)`s that returned (bumped after each, release): with
    /// [`Xu::has_work_taken`] a lower bound of the eventfd's count that costs no system call.
    has_work_posted: AtomicU64,
    /// `read(has_work_efd)`s that returned (the worker's [`Xu::report_complete`] only).
    has_work_taken: AtomicU64,
    completion_fd: Mutex<Option<OwnedFd>>,
    /// Whether `completion_fd` holds an fd: set under its lock, read at every pop without it
    /// (a registration that races a pop is seen by it or not, as with the lock; one made before
    /// a submit is seen by that request's pop, which acquires what the submit released).
    completion_fd_set: AtomicBool,
    implicit_async_mode: bool,
    /// Work items the worker freed, kept for the next submits: a steady execution loop
    /// allocates none, and no block goes from the worker's allocator cache to the submitter's
    /// (at most the ring's capacity of them; the vector never grows past it).
    spare_items: Mutex<Vec<Box<ExecInfo<E::Request>>>>,
    #[cfg(all(test, not(loom)))]
    at_pop: std::sync::Mutex<Option<PopHook>>,
}

/// What a test observes at the moment of the pop (inside `mark_comp_lock`, before the signal).
#[cfg(all(test, not(loom)))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PopMoment {
    /// The popped request.
    pub(crate) seq_id: SeqId,
    /// What its status cell reads.
    pub(crate) status: Option<NrtStatus>,
    /// `has_work_efd`'s count.
    pub(crate) has_work_count: u64,
}

#[cfg(all(test, not(loom)))]
struct PopHook(Box<dyn Fn(PopMoment) + Send>);

#[cfg(all(test, not(loom)))]
impl std::fmt::Debug for PopHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PopHook")
    }
}

impl<E: CompletionEngine> Xu<E> {
    /// `tpb_xu_base_init`: the queue (cursors at 1), `has_work_efd = eventfd(0, EFD_NONBLOCK |
    /// EFD_SEMAPHORE)`, the locks, the eventfd pool.
    ///
    /// # Errors
    /// `NRT_INVALID` for capacity 0, a tpb count outside 1..=2, a queue index of
    /// [`XU_QUEUE_LIMIT`] or more, or a vNC above 255 (the xu_id's fields); when an eventfd
    /// cannot be created, `NRT_RESOURCE` for the process's or the system's descriptor limit or
    /// memory, else `NRT_FAILURE`, naming the error ([`os_error`]).
    pub fn new(config: XuConfig, engine: Arc<E>, metrics: Arc<Metrics>) -> Result<Self, NrtError> {
        Self::new_typed(XuType::Compute, config, engine, metrics)
    }

    /// [`Xu::new`] for an XU of type `xu_type` (`tpb_xu_base_init`'s `xu_type`): the same ring
    /// and worker serve every XU type; the type only goes into the xu_id.
    ///
    /// # Errors
    /// As [`Xu::new`].
    pub fn new_typed(
        xu_type: XuType,
        config: XuConfig,
        engine: Arc<E>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, NrtError> {
        let invalid = |why: String| NrtError::new(NrtStatus::Invalid, why);
        if config.tpbs.is_empty() || config.tpbs.len() > MAX_TPBS_PER_VNC {
            return Err(invalid(format!(
                "{} TPBs per logical core (1 to {MAX_TPBS_PER_VNC})",
                config.tpbs.len()
            )));
        }
        // The xu_id's fields: queue 4 bits, vNC 8 bits (`XuId::new` asserts the queue's).
        let vnc = u8::try_from(config.vnc)
            .map_err(|_| invalid(format!("logical core {} (at most 255)", config.vnc)))?;
        if config.queue >= XU_QUEUE_LIMIT {
            return Err(invalid(format!(
                "queue {} (below {XU_QUEUE_LIMIT})",
                config.queue
            )));
        }
        let xu_id = XuId::new(xu_type, config.queue, vnc);
        let (producer, consumer) = XuQueue::with_capacity(xu_id, config.capacity)
            .map_err(|s| NrtError::new(s, format!("a queue of {} slots", config.capacity)))?;
        let has_work_efd = EventFd::from_value_and_flags(
            0,
            EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_SEMAPHORE | EfdFlags::EFD_CLOEXEC,
        )
        .map_err(|e| os_error(e, "its has_work eventfd"))?;
        let efd_pool = EfdPool::new(config.efd_pool_size).map_err(|e| {
            os_error(
                e,
                &format!("its completion eventfds ({})", config.efd_pool_size),
            )
        })?;
        Ok(Self {
            vnc: config.vnc,
            tpbs: config.tpbs,
            work_queue: producer.queue().clone(),
            has_work_efd,
            submit_work_lock: Mutex::new(SubmitState {
                producer,
                last_posted_model: None,
            }),
            worker: Mutex::new(consumer),
            unstage_lock: Mutex::new(UnstageState::default()),
            health: AtomicU8::new(XuHealth::Healthy as u8),
            efd_pool,
            engine,
            metrics,
            steps: std::sync::atomic::AtomicU64::new(0),
            has_work_posted: AtomicU64::new(0),
            has_work_taken: AtomicU64::new(0),
            completion_fd: Mutex::new(None),
            completion_fd_set: AtomicBool::new(false),
            implicit_async_mode: config.implicit_async_mode,
            spare_items: Mutex::new(Vec::with_capacity(config.capacity)),
            #[cfg(all(test, not(loom)))]
            at_pop: std::sync::Mutex::new(None),
        })
    }

    /// `info` in a work item for [`Xu::schedule_request`]: a box the worker freed earlier when
    /// there is one, else a new one.
    pub fn work_item(&self, info: ExecInfo<E::Request>) -> Box<ExecInfo<E::Request>> {
        let spare = lock(&self.spare_items).pop();
        match spare {
            Some(mut item) => {
                *item = info;
                item
            }
            None => Box::new(info),
        }
    }

    /// Frees work item `info` (`tpb_xu_step`'s free): what it holds — the bound resources, the
    /// in-flight count, the tensors' hold — is released now; the box is kept for
    /// [`Xu::work_item`] while fewer than the ring's capacity are.
    fn free_work_item(&self, mut info: Box<ExecInfo<E::Request>>) {
        drop(std::mem::take(&mut info.request));
        let mut spare = lock(&self.spare_items);
        if spare.len() < spare.capacity() {
            spare.push(info);
        }
    }

    /// Freed work items kept for the next submits.
    #[cfg(test)]
    pub(crate) fn spare_work_items(&self) -> usize {
        lock(&self.spare_items).len()
    }

    /// The vNC this XU serves.
    pub fn vnc(&self) -> u32 {
        self.vnc
    }

    /// The XU id (`{type, queue, vnc}`).
    pub fn xu_id(&self) -> XuId {
        self.work_queue.xu_id()
    }

    /// The work queue's shared view (cursors, install).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn queue(&self) -> &XuQueue<ExecInfo<E::Request>> {
        &self.work_queue
    }

    /// Requests submitted and not yet completed (`scheduled_tail − exec_head`).
    pub fn depth(&self) -> u64 {
        self.work_queue.depth()
    }

    /// `tpb_xu_get_last_completed`: the seq_id of the last completed request (seq_num 0 before
    /// the first).
    pub fn last_completed(&self) -> SeqId {
        self.work_queue.last_completed()
    }

    /// Whether request `seq_id` of this XU completed.
    pub fn is_completed(&self, seq_id: SeqId) -> bool {
        self.work_queue.is_completed(seq_id)
    }

    /// The counted wake-up eventfd the worker epolls.
    pub(crate) fn has_work_fd(&self) -> BorrowedFd<'_> {
        self.has_work_efd.as_fd()
    }

    /// Current health.
    pub fn health(&self) -> XuHealth {
        XuHealth::from_u8(self.health.load(Ordering::Acquire))
    }

    fn set_health(&self, h: XuHealth) {
        self.health.store(h as u8, Ordering::Release);
    }

    /// `nrta_event_register_xu_completion`: registers (or with `None` clears) an eventfd
    /// written with 1 after every completion of this XU, after the slot is popped. The XU holds
    /// a duplicate of `fd`; the caller keeps its own.
    ///
    /// # Errors
    /// NRT_FAILURE when `fd` cannot be duplicated.
    pub fn register_xu_completion(&self, fd: Option<BorrowedFd<'_>>) -> Result<(), NrtStatus> {
        let dup = fd
            .map(|fd| fd.try_clone_to_owned())
            .transpose()
            .map_err(|e| {
                tracing::error!(error = %e, "duplicating an XU completion eventfd");
                NrtStatus::Failure
            })?;
        let mut registered = lock(&self.completion_fd);
        self.completion_fd_set
            .store(dup.is_some(), Ordering::Release);
        *registered = dup;
        Ok(())
    }

    /// `nrta_event_register_seq_id_completion`: see
    /// [`ExecutionUnit::register_seq_completion`].
    ///
    /// # Errors
    /// NRT_INVALID when `seq_id` names no submitted request of this XU; NRT_FAILURE when `fd`
    /// cannot be duplicated.
    pub fn register_seq_completion(
        &self,
        seq_id: SeqId,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), NrtStatus> {
        let dup = fd
            .map(|fd| fd.try_clone_to_owned())
            .transpose()
            .map_err(|e| {
                tracing::error!(error = %e, "duplicating a seq-id completion eventfd");
                NrtStatus::Failure
            })?;
        match self.work_queue.register_seq_efd(seq_id, dup) {
            Registration::Unknown => Err(NrtStatus::Invalid),
            Registration::Registered
            | Registration::AlreadyComplete
            | Registration::Deregistered => Ok(()),
        }
    }

    /// Whether `seq_id` names a request of this XU submitted so far (or seq_num 0).
    pub fn knows(&self, seq_id: SeqId) -> bool {
        seq_id.xu_id() == self.xu_id() && seq_id.seq_num() < self.work_queue.scheduled_tail()
    }

    /// Writes every pooled completion eventfd without a completion (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn efd_pool_poke_for_test(&self) {
        self.efd_pool.poke_all();
    }

    /// Replaces the eventfd pool with `size` non-blocking eventfds, whose read fails with
    /// EAGAIN before a completion (tests of the waiter's read errors).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn use_nonblocking_efd_pool_for_test(&mut self, size: usize) {
        self.efd_pool = EfdPool::with_flags(size, EfdFlags::EFD_NONBLOCK).unwrap();
    }

    /// Pooled completion eventfds currently free.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn efd_pool_available(&self) -> usize {
        self.efd_pool.available()
    }

    /// Calls `hook` at every pop, inside `mark_comp_lock`, before the signal (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn on_pop_for_test(&self, hook: impl Fn(PopMoment) + Send + 'static) {
        *self.at_pop.lock().unwrap() = Some(PopHook(Box::new(hook)));
    }

    #[cfg(all(test, not(loom)))]
    fn run_pop_hook(&self, seq_id: SeqId, status_cell: Option<&ExecStatus>) {
        if let Some(hook) = self.at_pop.lock().unwrap().as_ref() {
            (hook.0)(PopMoment {
                seq_id,
                status: status_cell.and_then(ExecStatus::get),
                has_work_count: self.has_work_count_for_test(),
            });
        }
    }

    /// `has_work_efd`'s count, read from `/proc/self/fdinfo` without consuming it (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn has_work_count_for_test(&self) -> u64 {
        use std::os::fd::AsRawFd;
        let info = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            self.has_work_efd.as_raw_fd()
        ))
        .unwrap();
        let count = info
            .lines()
            .find_map(|l| l.strip_prefix("eventfd-count:"))
            .unwrap()
            .trim();
        u64::from_str_radix(count, 16).unwrap()
    }

    /// Runs [`Xu::report_complete`] as the worker would (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn report_complete_for_test(
        &self,
        status_cell: Option<Arc<ExecStatus>>,
        exec_status: NrtStatus,
    ) {
        let mut consumer = lock(&self.worker);
        self.report_complete(&mut consumer, status_cell, exec_status);
    }

    /// Submits `info` without triggering it or waking the worker, as a submitter between
    /// `xuq_client_submit` and the trigger leaves it (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn submit_untriggered_for_test(&self, info: Box<ExecInfo<E::Request>>) {
        let mut st = lock(&self.submit_work_lock);
        st.producer.client_submit(info, None).unwrap();
    }

    /// Submits and triggers `info` as the funnel does, but stops before `write(has_work_efd,
    /// 1)`: the moment a preempted submitter leaves behind (tests only). [`Xu::wake_for_test`]
    /// writes it.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn submit_before_wake_for_test(&self, info: Box<ExecInfo<E::Request>>) -> SeqId {
        let mut st = lock(&self.submit_work_lock);
        let seq = st.producer.client_submit(info, None).unwrap();
        st.producer.client_trigger_next().unwrap();
        seq
    }

    /// The funnel's `write(has_work_efd, 1)` (tests only).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn wake_for_test(&self) {
        let st = lock(&self.submit_work_lock);
        self.has_work_efd.write(1).unwrap();
        self.has_work_posted.store(
            self.has_work_posted.load(Ordering::Relaxed) + 1,
            Ordering::Release,
        );
        drop(st);
    }

    /// Poisons the XU (FATAL_SHUTDOWN): every later submit gets 101.
    pub(crate) fn poison(&self) {
        self.set_health(XuHealth::FatalShutdown);
    }

    /// `tpb_xu_step` calls so far (all outcomes, spurious wakes included).
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// `tpb_xu_schedule_request`, the submit funnel. First, for an EXECUTE item, the engine's
    /// [`CompletionEngine::admit`] (COLLECTIVES refuses with NRT_INVALID, nothing consumed).
    /// Then under `submit_work_lock`: the gates in the seed's order — FATAL_SHUTDOWN → 101, queue full → NRT_QUEUE_FULL (7), STOP requests skip
    /// staging, SHUTDOWN → NRT_CLOSED (14) — then the model-switch decision from
    /// `last_posted_model`, `stage` (given the switch flag), `doorbell`; a stage or doorbell
    /// failure poisons the XU (FATAL_SHUTDOWN) and is returned. Then publish, trigger and
    /// `write(has_work_efd, 1)`.
    ///
    /// # Errors
    /// The gate's status, or the stage/doorbell error.
    pub fn schedule_request(
        &self,
        mut info: Box<ExecInfo<E::Request>>,
        exec_status: Option<Arc<ExecStatus>>,
        stage: impl FnOnce(&mut ExecInfo<E::Request>, bool) -> Result<(), NrtStatus>,
        doorbell: impl FnOnce(&ExecInfo<E::Request>) -> Result<(), NrtStatus>,
    ) -> Result<SeqId, NrtStatus> {
        if info.kind == ExecKind::Execute {
            self.engine.admit(&info)?;
        }
        let mut st = lock(&self.submit_work_lock);
        if self.health() == XuHealth::FatalShutdown {
            return Err(NrtStatus::ExecUnitUnrecoverable);
        }
        if self.work_queue.depth() >= self.work_queue.capacity() {
            return Err(NrtStatus::QueueFull);
        }
        if info.kind == ExecKind::Execute {
            if self.health() == XuHealth::Shutdown {
                return Err(NrtStatus::Closed);
            }
            let model_switch = st.last_posted_model != Some(info.model_id);
            if let Err(rc) = stage(&mut info, model_switch) {
                tracing::error!(vnc = self.vnc, %rc, "stage failed; the execution unit is degraded");
                self.poison();
                return Err(rc);
            }
            if let Err(rc) = doorbell(&info) {
                tracing::error!(vnc = self.vnc, %rc, "doorbell failed; the execution unit is degraded");
                self.poison();
                return Err(rc);
            }
            st.last_posted_model = Some(info.model_id);
        }
        let seq = st
            .producer
            .client_submit(info, exec_status)
            .map_err(|(rc, _)| rc)?;
        st.producer.client_trigger_next()?;
        if let Err(e) = shared::nocancel::eventfd_write(self.has_work_efd.as_fd(), 1) {
            tracing::error!(vnc = self.vnc, errno = %e, "Failed to wake the XU worker");
            panic!("write(has_work_efd) failed on vNC {}: {e}", self.vnc);
        }
        // Bumped under `submit_work_lock`, by one submitter at a time: no locked add.
        self.has_work_posted.store(
            self.has_work_posted.load(Ordering::Relaxed) + 1,
            Ordering::Release,
        );
        drop(st);
        Ok(seq)
    }

    /// Schedules a STOP request (`tpb_xu_schedule_stop`).
    ///
    /// # Errors
    /// The funnel's gates (101, 7).
    pub fn schedule_stop(&self, request: E::Request) -> Result<SeqId, NrtStatus> {
        self.schedule_request(
            self.work_item(ExecInfo::stop(request)),
            None,
            |_, _| Ok(()),
            |_| Ok(()),
        )
    }

    /// `tpb_xu_step`, run by the worker on each wake-up: peek (empty: a spurious wake, success)
    /// → FATAL_SHUTDOWN steps past with 101 without running → STOP path → EXECUTE drives
    /// `progress_one_step` (in flight: return, the wake-up stays counted; error: poison) → on
    /// done, per-TPB metrics (EXECUTE only) → deferred unstage under `unstage_lock` → free the
    /// work item → [`Xu::report_complete`]. Holds the ring's consumer for the whole step.
    pub(crate) fn step(&self) -> StepOutcome<'_> {
        let mut consumer = lock(&self.worker);
        // Bumped under the consumer lock, by one thread at a time: no locked add.
        self.steps
            .store(self.steps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let Some(seq) = consumer.worker_peek_current_exec() else {
            tracing::debug!(vnc = self.vnc, "Execution Unit nothing to step");
            return StepOutcome::Ready;
        };
        let kind = consumer
            .worker_with_item(|i| i.kind)
            .unwrap_or(ExecKind::Stop);
        let exec_status = if self.health() == XuHealth::FatalShutdown {
            tracing::debug!(
                vnc = self.vnc,
                seq = seq.raw(),
                "in fatal shutdown, stepping past"
            );
            NrtStatus::ExecUnitUnrecoverable
        } else if kind == ExecKind::Stop {
            match self.engine.wait_model_stop(self.vnc) {
                Ok(()) => NrtStatus::Success,
                Err(rc) => {
                    self.poison();
                    rc
                }
            }
        } else {
            // Seed 004 §7 GOTCHA: the XU ring and the implicit-async pool never serve one
            // process together; a request reaching the step in pool mode is a runtime bug.
            if self.implicit_async_mode {
                tracing::error!(
                    vnc = self.vnc,
                    "an execution reached tpb_xu_step in implicit async mode"
                );
                panic!(
                    "tpb_xu_step: implicit_async_mode is set (the XU ring and the async pool are exclusive)"
                );
            }
            let engine = &*self.engine;
            let vnc = self.vnc;
            let progressed = consumer.worker_with_item(|info| {
                let p = engine.progress_one_step(vnc, info);
                (
                    p,
                    (p == Progress::InFlight)
                        .then(|| engine.wake_on(vnc, info))
                        .flatten(),
                )
            });
            match progressed {
                Some((Progress::InFlight, wake)) => {
                    return wake.map_or(StepOutcome::Ready, StepOutcome::Wait);
                }
                Some((Progress::Done(s), _)) => s,
                Some((Progress::Error(s), _)) => {
                    tracing::warn!(vnc = self.vnc, status = %s, "execution failed; degrading the execution unit");
                    self.poison();
                    s
                }
                None => NrtStatus::Failure,
            }
        };
        let status_cell = consumer.worker_take_exec_status();
        let Some(info) = consumer.worker_take_item() else {
            tracing::error!(vnc = self.vnc, "xu_queue slot without a work item");
            self.poison();
            return StepOutcome::Ready;
        };
        if info.kind == ExecKind::Execute {
            self.engine.completed(self.vnc, seq, &info, exec_status);
            // Once per execution (never for a STOP: seed 004's GOTCHA): per TPB, per core, per
            // model.
            self.metrics.record_completion(
                self.vnc,
                &self.tpbs,
                info.model_slot,
                exec_status,
                info.submission_ts.elapsed(),
                &info.resp,
            );
        }
        let deferred = {
            let mut guard = lock(&self.unstage_lock);
            let u = &mut *guard;
            let n = self.tpbs.len();
            let mut defer = [None; MAX_TPBS_PER_VNC];
            let slots = u
                .last_exec_model
                .iter_mut()
                .zip(u.deferred_unstage_ref.iter_mut());
            for (d, (last, deferred)) in defer.iter_mut().zip(slots).take(n) {
                *d = deferred.take();
                *last = (info.kind == ExecKind::Execute).then_some(info.model_id);
            }
            defer
        };
        for model in deferred.into_iter().flatten() {
            self.engine.unstage_model(model);
        }
        // The idle watch is for a request that leaves nothing released behind it (with more
        // released, the worker steps them on their has_work_efd counts).
        let last_released = self.work_queue.scheduled_head() - self.work_queue.exec_head() == 1;
        let idle = (info.kind == ExecKind::Execute && last_released)
            .then(|| self.engine.idle_wake(self.vnc, &info))
            .flatten();
        self.free_work_item(info); // before reporting, as the seed does
        self.report_complete(&mut consumer, status_cell, exec_status);
        // A request released since the snapshot (its submitter, woken by this completion, ran
        // before this step ended) is left to the watch when its progress will still show there
        // — stepped now it would be found in flight, then waited for on the same fd.
        let Some(wake) = idle else {
            return StepOutcome::Ready;
        };
        let engine = &*self.engine;
        let vnc = self.vnc;
        let covered = consumer
            .worker_with_item(|next| {
                next.kind == ExecKind::Execute && engine.progress_shows_on(vnc, next, &wake)
            })
            .unwrap_or_else(|| consumer.worker_peek_current_exec().is_none());
        if covered {
            StepOutcome::Idle(wake)
        } else {
            StepOutcome::Ready
        }
    }

    /// Whether `has_work_efd` is readable (its count is not zero): then the request at the head
    /// has had its `write(has_work_efd, 1)`, and stepping it to completion finds the count its
    /// `report_complete` reads. Submits write the eventfd in order, after their trigger, and
    /// completions read it in order, so a count above zero always covers the head. A request
    /// merely *released* (`exec_head != scheduled_head`) may not have had its write yet: the
    /// submitter bumps `scheduled_head` first.
    ///
    /// Judged from the counters, not with a `poll`: `has_work_posted` is bumped only after its
    /// write returned and `has_work_taken` right after each read, so `posted > taken` means the
    /// count is at least 1. (The converse may lag — a write whose bump is not yet seen — which
    /// only leaves the request to the worker's epoll, as a `poll` racing the write would.)
    pub(crate) fn has_work(&self) -> bool {
        let posted = self.has_work_posted.load(Ordering::Acquire);
        posted > self.has_work_taken.load(Ordering::Relaxed)
    }

    /// Whether the worker may step this XU again at once after a step that left it
    /// [`StepOutcome::Ready`], without going back to `epoll_wait`: the head request has had its
    /// `has_work_efd` write ([`Xu::has_work`]: its completion finds the count to read) and is
    /// an EXECUTE whose engine says its progress is posted
    /// ([`CompletionEngine::progress_posted`]). No system call.
    pub(crate) fn ready_to_harvest(&self) -> bool {
        if !self.has_work() || self.health() != XuHealth::Healthy {
            return false;
        }
        let mut consumer = lock(&self.worker);
        if consumer.worker_peek_current_exec().is_none() {
            return false;
        }
        let engine = &*self.engine;
        let vnc = self.vnc;
        consumer
            .worker_with_item(|info| {
                info.kind == ExecKind::Execute && engine.progress_posted(vnc, info)
            })
            .unwrap_or(false)
    }

    /// Defers `model_id`'s unstage until the execution in flight on this XU finishes, if it is
    /// the last model executed here; returns whether it was deferred (else the caller unstages
    /// now).
    pub fn defer_unstage(&self, model_id: u64) -> bool {
        let mut u = lock(&self.unstage_lock);
        let mut deferred = false;
        for i in 0..self.tpbs.len() {
            if u.last_exec_model[i] == Some(model_id) && self.work_queue.depth() > 0 {
                u.deferred_unstage_ref[i] = Some(model_id);
                deferred = true;
            }
        }
        deferred
    }

    /// `tpb_xu_base_report_complete`: consumes exactly one `has_work_efd` count (an underflow
    /// is the seed's runtime-bug abort, logged first), publishes the status, then pops the slot
    /// under `mark_comp_lock` and writes the waiter's eventfd (closing it unless pooled). A
    /// failed write fails the pop: the XU is degraded (FATAL_SHUTDOWN).
    ///
    /// # Panics
    /// When `read(has_work_efd)` fails: the submit/complete pairing is broken.
    pub(crate) fn report_complete(
        &self,
        consumer: &mut Consumer<ExecInfo<E::Request>>,
        status_cell: Option<Arc<ExecStatus>>,
        exec_status: NrtStatus,
    ) {
        if let Err(e) = shared::nocancel::eventfd_read(self.has_work_efd.as_fd()) {
            tracing::error!(vnc = self.vnc, errno = %e, "Failed to pop work from has work efd on Execution Unit");
            panic!(
                "read(has_work_efd) failed on vNC {}: {e} (submit/complete pairing broken)",
                self.vnc
            );
        }
        // Bumped under the consumer lock (the caller's `consumer`), by one thread at a time.
        self.has_work_taken.store(
            self.has_work_taken.load(Ordering::Relaxed) + 1,
            Ordering::Relaxed,
        );
        if let Some(cell) = &status_cell {
            cell.publish(exec_status);
        }
        // At the end of the pop (exec_head already moved, mark_comp_lock released): the XU
        // completion eventfd first, then the waiter's, so a woken waiter finds every event
        // written.
        let signal = |_seq: SeqId, efd: &CompEfd| {
            #[cfg(all(test, not(loom)))]
            self.run_pop_hook(_seq, status_cell.as_deref());
            if self.completion_fd_set.load(Ordering::Acquire)
                && let Some(fd) = lock(&self.completion_fd).as_ref()
                && let Err(e) = nix::unistd::write(fd, &1u64.to_ne_bytes())
            {
                tracing::warn!(vnc = self.vnc, errno = %e, "writing the registered XU completion eventfd");
            }
            efd.signal()
        };
        match consumer.worker_pop_current_exec(signal) {
            Ok(seq) => {
                tracing::debug!(vnc = self.vnc, seq = seq.raw(), status = %exec_status, "completed");
            }
            Err(rc) => {
                tracing::error!(vnc = self.vnc, %rc, "Failed to complete request");
                self.poison();
            }
        }
    }

    /// Blocks until request `seq_id` completes (the sync path's `read(mark_comp_efd)`): takes a
    /// pooled eventfd, installs it under `mark_comp_lock`, reads it (EINTR retried). With the
    /// pool exhausted, or another waiter's eventfd installed for the request, it polls
    /// `last_completed` every microsecond instead. `budget` bounds the polling fallback only
    /// (the completion engine bounds executions).
    ///
    /// # Errors
    /// `NRT_TIMEOUT` when polling exceeds `budget`; `NRT_FAILURE` when reading the eventfd fails
    /// (other than EINTR; the eventfd then leaves the pool); `NRT_INVALID` when `seq_id` names
    /// no submitted request of this XU.
    ///
    /// # Panics
    /// When woken while `last_completed < seq_id`: the seed's "runtime bug" abort, logged first.
    pub fn wait_for_completion(
        &self,
        seq_id: SeqId,
        budget: Option<Duration>,
    ) -> Result<(), NrtStatus> {
        if seq_id.xu_id() != self.xu_id() || seq_id.seq_num() >= self.work_queue.scheduled_tail() {
            return Err(NrtStatus::Invalid);
        }
        // Already completed (the common case with many in flight): no eventfd, no lock — taking
        // `mark_comp_lock` here would contend with the worker's pops for nothing.
        if self.work_queue.is_completed(seq_id) {
            return Ok(());
        }
        let mut poll = true;
        if let Some(efd) = self.efd_pool.take() {
            match self
                .work_queue
                .install_comp_efd(seq_id, CompEfd::Pool(efd.clone()))
            {
                Install::Installed => {
                    loop {
                        match shared::nocancel::eventfd_read(efd.as_fd()) {
                            Ok(_) => break,
                            // A signal interrupted the wait: wait again (seed 000 §6).
                            Err(Errno::EINTR) => continue,
                            Err(e) => {
                                // The slot still holds a reference and will write it: keep the
                                // eventfd out of the pool so that write wakes nobody else.
                                tracing::error!(seq = seq_id.raw(), errno = %e, "read(mark_comp_efd) failed");
                                return Err(NrtStatus::Failure);
                            }
                        }
                    }
                    poll = false;
                }
                Install::AlreadyComplete(_) => poll = false,
                Install::Unknown(_) => {
                    self.efd_pool.give_back(efd);
                    return Err(NrtStatus::Invalid);
                }
                Install::Occupied(_) => {}
            }
            self.efd_pool.give_back(efd);
        }
        if poll {
            let start = Instant::now();
            while !self.work_queue.is_completed(seq_id) {
                if budget.is_some_and(|b| start.elapsed() > b) {
                    return Err(NrtStatus::Timeout);
                }
                std::thread::sleep(Duration::from_micros(1));
            }
        }
        if !self.work_queue.is_completed(seq_id) {
            tracing::error!(
                seq = seq_id.raw(),
                last = self.work_queue.last_completed().raw(),
                "woken before completion: runtime bug"
            );
            panic!(
                "runtime bug: woken for request {:#x} but last completed is {:#x}",
                seq_id.raw(),
                self.work_queue.last_completed().raw()
            );
        }
        Ok(())
    }

    /// Installs a fresh eventfd for `seq_id` (the explicit-async completion fd): returns the
    /// caller's end, readable once the request completes, or `None` if it already completed.
    /// The slot owns the other end and the worker closes it after signalling.
    ///
    /// This is the seq-id event registration: the eventfd is written exactly once if it was
    /// installed; a registration after the completion returns `None` and nothing is ever
    /// written (the caller sees the request completed).
    ///
    /// # Errors
    /// `NRT_FAILURE` when the eventfd cannot be created or duplicated; `NRT_INVALID` when
    /// `seq_id` names no submitted request of this XU or another eventfd is installed for it.
    pub fn install_fresh_comp_efd(&self, seq_id: SeqId) -> Result<Option<OwnedFd>, NrtStatus> {
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
            .map_err(|_| NrtStatus::Failure)?;
        let mine = efd
            .as_fd()
            .try_clone_to_owned()
            .map_err(|_| NrtStatus::Failure)?;
        match self
            .work_queue
            .install_comp_efd(seq_id, CompEfd::Fresh(efd.into()))
        {
            Install::Installed => Ok(Some(mine)),
            // The slot's end comes back unsignalled and is closed here.
            Install::AlreadyComplete(_) => Ok(None),
            Install::Unknown(_) | Install::Occupied(_) => Err(NrtStatus::Invalid),
        }
    }

    /// Schedules an execution and waits for it (the sync path): returns the execution's status.
    /// The status cell is the calling thread's own, reused across calls (the seed passes a
    /// pointer to the caller's stack), so the only allocation per execution is the work item.
    ///
    /// # Errors
    /// The funnel's refusal (101, 7, 14, stage/doorbell errors).
    pub fn execute_sync(
        &self,
        info: Box<ExecInfo<E::Request>>,
        stage: impl FnOnce(&mut ExecInfo<E::Request>, bool) -> Result<(), NrtStatus>,
        doorbell: impl FnOnce(&ExecInfo<E::Request>) -> Result<(), NrtStatus>,
    ) -> Result<NrtStatus, NrtStatus> {
        thread_local! {
            static STATUS: Arc<ExecStatus> = Arc::new(ExecStatus::new());
        }
        let status = STATUS.with(Arc::clone);
        status.reset();
        let seq = self.schedule_request(info, Some(status.clone()), stage, doorbell)?;
        self.wait_for_completion(seq, None)?;
        Ok(status.get().unwrap_or(NrtStatus::Failure))
    }

    /// Marks the XU as shutting down (under `submit_work_lock`, as `tpb_xu_shutdown` does).
    pub(crate) fn begin_shutdown(&self) {
        let _st = lock(&self.submit_work_lock);
        if self.health() == XuHealth::Healthy {
            self.set_health(XuHealth::Shutdown);
        }
    }

    /// `wait_exec_queue_empty`: polls until `scheduled_head == exec_head`, warning every 120 s;
    /// never times out (a wedged execution wedges shutdown rather than tearing down a ring the
    /// device still writes). The seed polls every 100 ms; this polls at most that far apart,
    /// backing off from 1 ms ([`drain_poll_interval`]): the STOP a shutdown schedules drains in
    /// microseconds, and `nrt_close` then no longer waits a tenth of a second for nothing.
    pub(crate) fn wait_exec_queue_empty(&self, start: Instant) {
        let mut warned = 1u32;
        let mut polls = 0u32;
        while !self.work_queue.is_drained() {
            if start.elapsed() > Duration::from_secs(120) * warned {
                warned += 1;
                tracing::warn!(vnc = self.vnc, "Waiting for queue to empty");
            }
            std::thread::sleep(drain_poll_interval(polls));
            polls = polls.saturating_add(1);
        }
    }
}

/// The pause before re-check `n` (from 0) of [`Xu::wait_exec_queue_empty`]: 1 ms, doubling, at
/// most the seed's 100 ms.
pub(crate) fn drain_poll_interval(n: u32) -> Duration {
    Duration::from_millis((1u64 << n.min(7)).min(100))
}

impl<E: CompletionEngine> sealed::Sealed for Xu<E> {}

impl<E: CompletionEngine> ExecutionUnit for Xu<E> {
    fn xu_id(&self) -> XuId {
        Xu::xu_id(self)
    }

    fn vnc(&self) -> u32 {
        Xu::vnc(self)
    }

    fn depth(&self) -> u64 {
        Xu::depth(self)
    }

    fn last_completed(&self) -> SeqId {
        Xu::last_completed(self)
    }

    fn knows(&self, seq_id: SeqId) -> bool {
        Xu::knows(self, seq_id)
    }

    fn is_completed(&self, seq_id: SeqId) -> bool {
        Xu::is_completed(self, seq_id)
    }

    fn health(&self) -> XuHealth {
        Xu::health(self)
    }

    fn steps(&self) -> u64 {
        Xu::steps(self)
    }

    fn wait_for_completion(
        &self,
        seq_id: SeqId,
        budget: Option<Duration>,
    ) -> Result<(), NrtStatus> {
        Xu::wait_for_completion(self, seq_id, budget)
    }

    fn register_seq_completion(
        &self,
        seq_id: SeqId,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), NrtStatus> {
        Xu::register_seq_completion(self, seq_id, fd)
    }

    fn register_xu_completion(&self, fd: Option<BorrowedFd<'_>>) -> Result<(), NrtStatus> {
        Xu::register_xu_completion(self, fd)
    }

    fn step(&self, _key: WorkerKey) -> StepOutcome<'_> {
        Xu::step(self)
    }

    fn has_work_fd(&self, _key: WorkerKey) -> BorrowedFd<'_> {
        Xu::has_work_fd(self)
    }

    fn has_work(&self, _key: WorkerKey) -> bool {
        Xu::has_work(self)
    }

    fn ready_to_harvest(&self, _key: WorkerKey) -> bool {
        Xu::ready_to_harvest(self)
    }

    fn begin_shutdown(&self, _key: WorkerKey) {
        Xu::begin_shutdown(self);
    }

    fn wait_exec_queue_empty(&self, _key: WorkerKey, start: Instant) {
        Xu::wait_exec_queue_empty(self, start);
    }

    fn schedule_stop(&self, _key: WorkerKey) -> Result<SeqId, NrtStatus> {
        Xu::schedule_stop(self, E::Request::default())
    }
}

/// `tpb_xu_shutdown` over XUs of one engine type (see [`super::execution_unit::shutdown`]).
pub fn shutdown<E: CompletionEngine>(xus: &[Arc<Xu<E>>]) {
    let xus: Vec<Arc<dyn ExecutionUnit>> = xus
        .iter()
        .map(|xu| xu.clone() as Arc<dyn ExecutionUnit>)
        .collect();
    super::execution_unit::shutdown(&xus);
}
