//! [`ExecutionUnit`]: an XU of any type seen through one object-safe trait, so the XU table and
//! the per-vNC worker hold XUs whose completion engines differ (COMPUTE runs executions,
//! TENSOR_OP moves bytes, COLLECTIVES accepts no work yet).
//!
//! What anyone may do with an XU: read it (xu_id, depth, last completed, completion of a seq_id,
//! health), wait for one of its requests, and register completion eventfds. What only this
//! crate's worker may do — step it, epoll its `has_work_efd`, drain and stop it at shutdown —
//! takes a [`WorkerKey`], which only this crate can make:
//!
//! ```compile_fail,E0624
//! // The worker side is not reachable from outside the crate.
//! fn step_from_outside(xu: &dyn runtime::xu::ExecutionUnit) {
//!     let _ = xu.step(runtime::xu::WorkerKey::new());
//! }
//! ```
//!
//! ```
//! fn read_only_view(xu: &dyn runtime::xu::ExecutionUnit) {
//!     let _ = (xu.depth(), xu.last_completed(), xu.health(), xu.xu_id(), xu.vnc());
//!     let _ = xu.is_completed(xu.last_completed());
//! }
//! ```

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use shared::NrtStatus;
use shared::ids::{SeqId, XuId};

use super::unit::XuHealth;

/// Proof that the caller is this crate's XU worker or shutdown: the key to an XU's consumer
/// side. Only this crate can make one.
#[derive(Clone, Copy, Debug)]
pub struct WorkerKey(());

impl WorkerKey {
    /// A key (crate-private).
    pub(crate) const fn new() -> Self {
        Self(())
    }
}

/// What the worker waits on while an XU's request is in flight, instead of the step blocking:
/// the engine's event fd (the NC's notification eventfd on simdev) and at most how long to wait
/// before stepping again regardless.
#[derive(Clone, Copy, Debug)]
pub struct Wake<'a> {
    /// Written when the request may have progressed (an eventfd: every write is a wake-up).
    /// The worker watches it edge-triggered: a write after the step that named it wakes the
    /// worker, and one before that step is the step's to have seen (the step harvests after
    /// it). Nobody has to read it for the worker; an engine whose other pollers watch it
    /// level-triggered drains it before its last harvest. It must stay open as long as the
    /// engine lives (the worker keeps a dup of it registered).
    pub fd: BorrowedFd<'a>,
    /// Step again after this long even without an event (`None`: only on the event).
    pub within: Option<Duration>,
}

/// What one step left behind.
#[derive(Clone, Copy, Debug)]
pub enum StepOutcome<'a> {
    /// Nothing to wait for: the worker steps the XU again as long as `has_work_efd` is readable
    /// (more requests, or an in-flight request whose engine gave no [`Wake`]).
    Ready,
    /// The request at the head is in flight: the worker stops watching `has_work_efd` and steps
    /// the XU again when the wake fd is readable or `within` elapsed.
    Wait(Wake<'a>),
    /// The step completed the last released request and the engine named where the next one's
    /// progress will show ([`CompletionEngine::idle_wake`](super::CompletionEngine::idle_wake)):
    /// the worker watches that fd instead of `has_work_efd` until it is readable or `within`
    /// elapsed (the *idle watch*), then watches `has_work_efd` again and steps the XU if a
    /// request is released. A request submitted meanwhile keeps its `has_work_efd` count; it is
    /// stepped first when its completion can be harvested, not before (io_uring's SQPOLL idle
    /// period, applied to the completion side).
    Idle(Wake<'a>),
}

/// An XU of any type (`tpb_execution_unit_t` through its base): the read-only view, waiting,
/// event registration, and — behind a [`WorkerKey`] — the worker side. Implemented by
/// [`Xu<E>`](super::Xu) for every completion engine `E`; sealed.
pub trait ExecutionUnit: sealed::Sealed + Send + Sync + std::fmt::Debug {
    /// `{type, queue, vnc}`: the high 16 bits of every seq_id of this XU.
    fn xu_id(&self) -> XuId;

    /// The vNC (logical core) this XU serves.
    fn vnc(&self) -> u32;

    /// Requests submitted and not yet completed.
    fn depth(&self) -> u64;

    /// The seq_id of the last completed request (`nrta_get_sequence`; seq_num 0 before the
    /// first).
    fn last_completed(&self) -> SeqId;

    /// Whether `seq_id` names a request of this XU submitted so far (or seq_num 0, the "none
    /// yet" that [`ExecutionUnit::last_completed`] returns on a fresh XU).
    fn knows(&self, seq_id: SeqId) -> bool;

    /// Whether request `seq_id` of this XU completed (its status is published before).
    fn is_completed(&self, seq_id: SeqId) -> bool;

    /// Current health.
    fn health(&self) -> XuHealth;

    /// `tpb_xu_step` calls so far.
    fn steps(&self) -> u64;

    /// Blocks until request `seq_id` completes (see [`Xu::wait_for_completion`](super::Xu::wait_for_completion)).
    ///
    /// # Errors
    /// NRT_INVALID for a seq_id of no submitted request of this XU; NRT_TIMEOUT when polling
    /// exceeded `budget`; NRT_FAILURE when the wait's eventfd failed.
    fn wait_for_completion(&self, seq_id: SeqId, budget: Option<Duration>)
    -> Result<(), NrtStatus>;

    /// `nrta_event_register_seq_id_completion`: `Some(fd)` writes 1 to `fd` when request
    /// `seq_id` completes (at once if it already did); every registration is signalled, once.
    /// `None` removes every eventfd registered for `seq_id`: none of them is written after this
    /// returns. The caller keeps its fd: the XU registers a duplicate (closed after the signal
    /// or the deregistration).
    ///
    /// # Errors
    /// NRT_INVALID when `seq_id` names no submitted request of this XU; NRT_FAILURE when `fd`
    /// cannot be duplicated.
    fn register_seq_completion(
        &self,
        seq_id: SeqId,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), NrtStatus>;

    /// `nrta_event_register_xu_completion`: `Some(fd)` writes 1 to `fd` after every completion
    /// of this XU from now on (replacing an earlier registration), `None` deregisters. The
    /// caller keeps its fd: the XU holds a duplicate.
    ///
    /// # Errors
    /// NRT_FAILURE when `fd` cannot be duplicated.
    fn register_xu_completion(&self, fd: Option<BorrowedFd<'_>>) -> Result<(), NrtStatus>;

    /// `tpb_xu_step` (the worker only).
    fn step(&self, key: WorkerKey) -> StepOutcome<'_>;

    /// The counted wake-up eventfd the worker epolls (the worker only).
    fn has_work_fd(&self, key: WorkerKey) -> BorrowedFd<'_>;

    /// Whether `has_work_efd` is readable: what ends an idle watch with a step (the worker
    /// only). Not "a request is released": the submitter bumps `scheduled_head` before it
    /// writes `has_work_efd`, and a request stepped to completion in between would find no
    /// count to consume.
    fn has_work(&self, key: WorkerKey) -> bool;

    /// Whether the worker may step the XU again at once, without `epoll_wait`: the head
    /// request's `has_work_efd` write has come and its engine says its progress is posted
    /// (the worker only; no system call).
    fn ready_to_harvest(&self, key: WorkerKey) -> bool;

    /// Shutdown, phase 1: later executions get NRT_CLOSED.
    fn begin_shutdown(&self, key: WorkerKey);

    /// Shutdown: `wait_exec_queue_empty`.
    fn wait_exec_queue_empty(&self, key: WorkerKey, start: Instant);

    /// Shutdown: `tpb_xu_schedule_stop`.
    ///
    /// # Errors
    /// The funnel's gates (101, 7).
    fn schedule_stop(&self, key: WorkerKey) -> Result<SeqId, NrtStatus>;
}

pub(crate) mod sealed {
    /// Only this crate's XUs are execution units.
    pub trait Sealed {}
}

/// `tpb_xu_shutdown` over XUs of every type: flags every XU, drains in-flight work, schedules a
/// STOP on each, drains again. Later submits get NRT_CLOSED; a poisoned XU keeps answering 101.
/// Needs the workers running. A registered XU completion eventfd counts the caller's requests
/// drained here but not the STOP (the runtime's own): it is dropped before the STOP.
pub fn shutdown(xus: &[std::sync::Arc<dyn ExecutionUnit>]) {
    let key = WorkerKey::new();
    for xu in xus {
        xu.begin_shutdown(key);
    }
    let t0 = Instant::now();
    for xu in xus {
        xu.wait_exec_queue_empty(key, t0);
    }
    for xu in xus {
        if let Err(rc) = xu.register_xu_completion(None) {
            tracing::warn!(xu = xu.xu_id().raw(), %rc, "dropping the XU completion eventfd");
        }
    }
    for xu in xus {
        if let Err(rc) = xu.schedule_stop(key) {
            tracing::warn!(xu = xu.xu_id().raw(), %rc, "Failed to schedule model stop request");
        }
    }
    let t1 = Instant::now();
    for xu in xus {
        xu.wait_exec_queue_empty(key, t1);
    }
}
