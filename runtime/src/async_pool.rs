//! The implicit-async pool (`kmgr_async_exec_*`, `kaew_post_request`; seed 000 §6 "The async
//! submit boundary", seed 004 §7): selected by `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0`.
//!
//! One worker per logical core with a deque and an in-flight semaphore. Posting a request takes
//! an in-flight count (blocking when `max_inflight` are outstanding: the backpressure), then —
//! under `work_queue_lock` — decides the model switch, stages, rings the doorbells, pushes the
//! request on the deque and wakes the worker, and returns a handle at once. The worker drives the
//! same completion engine over the front request, pops it, calls the completion callback and
//! releases the in-flight count. The pool never uses the XU ring: in this mode the XUs refuse to
//! step (`tpb_xu_step` asserts `!implicit_async_mode`), and the explicit async API is refused.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use shared::NrtStatus;

use crate::completion::{ExecRequest, NqEngine};
use crate::error::NrtError;
use crate::metrics::Metrics;
use crate::xu::{CompletionEngine, ExecInfo, Progress};

/// The completion callback (`nrt_register_async_exec_callback`): (model id, logical core, job
/// id, status), run on the pool's worker thread.
pub type AsyncCallback = Arc<dyn Fn(u64, u32, u64, NrtStatus) + Send + Sync>;

/// One posted request (`kmgr_async_exec_req`).
#[derive(Debug)]
struct AsyncReq {
    req_id: u64,
    info: Box<ExecInfo<ExecRequest>>,
}

#[derive(Debug, Default)]
struct WorkQueue {
    deque: VecDeque<AsyncReq>,
    last_posted_model: Option<u64>,
    /// Executions of `last_posted_model` posted in a row: 1 on a switch, +1 otherwise.
    consecutive_model_counter: u64,
    stopping: bool,
    /// The worker holds a request taken off the deque.
    busy: bool,
}

/// The worker of one logical core.
struct Worker {
    vnc: u32,
    work_queue_lock: Mutex<WorkQueue>,
    has_work: Condvar,
    inflight: Mutex<u32>,
    inflight_freed: Condvar,
    max_inflight: u32,
    degraded: AtomicBool,
    drained: Condvar,
    /// The logical core's physical NCs (for per-TPB metrics).
    tpbs: Vec<u32>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("vnc", &self.vnc)
            .field("max_inflight", &self.max_inflight)
            .finish_non_exhaustive()
    }
}

/// The implicit-async pool: one worker thread per logical core.
pub struct AsyncPool {
    workers: Vec<Arc<Worker>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    callback: Arc<Mutex<Option<AsyncCallback>>>,
    id_tracker: AtomicU64,
}

impl std::fmt::Debug for AsyncPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncPool")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl AsyncPool {
    /// Starts one worker per logical core (`tpbs[vnc]` are its physical NCs), each allowing `max_inflight` requests
    /// in flight, harvesting through `engine`.
    ///
    /// # Errors
    /// NRT_FAILURE when a thread cannot be started.
    pub fn start(
        tpbs: &[Vec<u32>],
        max_inflight: u32,
        engine: Arc<NqEngine>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, NrtError> {
        let callback: Arc<Mutex<Option<AsyncCallback>>> = Arc::new(Mutex::new(None));
        let mut workers = Vec::new();
        let mut threads = Vec::new();
        for (vnc, ncs) in tpbs.iter().enumerate() {
            let vnc = u32::try_from(vnc).unwrap_or(u32::MAX);
            let w = Arc::new(Worker {
                vnc,
                work_queue_lock: Mutex::new(WorkQueue::default()),
                has_work: Condvar::new(),
                inflight: Mutex::new(0),
                inflight_freed: Condvar::new(),
                max_inflight: max_inflight.max(1),
                degraded: AtomicBool::new(false),
                drained: Condvar::new(),
                tpbs: ncs.clone(),
            });
            let (w2, e2, cb, m2) = (w.clone(), engine.clone(), callback.clone(), metrics.clone());
            let t = std::thread::Builder::new()
                .name(format!("kaew-{vnc}"))
                .spawn(move || worker_loop(&w2, &e2, &cb, &m2))
                .map_err(|e| {
                    NrtError::new(
                        NrtStatus::Failure,
                        format!("starting the async worker of logical core {vnc}: {e}"),
                    )
                })?;
            workers.push(w);
            threads.push(t);
        }
        Ok(Self {
            workers,
            threads: Mutex::new(threads),
            callback,
            id_tracker: AtomicU64::new(0),
        })
    }

    /// Replaces the completion callback.
    pub fn register_callback(&self, cb: AsyncCallback) {
        *lock(&self.callback) = Some(cb);
    }

    /// `kaew_post_request`: backpressure on the in-flight count, then under `work_queue_lock`
    /// the switch decision, `stage(info, model_switch)`, `doorbell(info)`, the push; returns the
    /// job id at once.
    ///
    /// # Errors
    /// 101 on a degraded core; NRT_QUEUE_FULL when every in-flight slot is taken and the caller
    /// is a completion callback (which would wait for itself); the stage/doorbell error (which
    /// degrades the core).
    pub fn post(
        &self,
        vnc: u32,
        mut info: Box<ExecInfo<ExecRequest>>,
        stage: impl FnOnce(&mut ExecInfo<ExecRequest>, bool) -> Result<(), NrtStatus>,
        doorbell: impl FnOnce(&ExecInfo<ExecRequest>) -> Result<(), NrtStatus>,
    ) -> Result<u64, NrtStatus> {
        let w = self.workers.get(vnc as usize).ok_or(NrtStatus::Invalid)?;
        if w.degraded.load(Ordering::Acquire) {
            return Err(NrtStatus::ExecUnitUnrecoverable);
        }
        {
            let mut n = lock(&w.inflight);
            while *n >= w.max_inflight {
                // Inside a completion callback, on a pool worker: the slot it would wait for may
                // be the callback's own (freed only when it returns) or one that only its own
                // worker can free, so waiting could wait for itself; it is refused instead.
                if in_exec_callback() {
                    return Err(NrtStatus::QueueFull);
                }
                n = w
                    .inflight_freed
                    .wait(n)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            *n += 1;
        }
        let release = || {
            *lock(&w.inflight) -= 1;
            w.inflight_freed.notify_one();
        };
        // Checked again: the executions it waited for may have degraded the core meanwhile
        // (timed out), and one posted now would only time out in turn.
        if w.degraded.load(Ordering::Acquire) {
            release();
            return Err(NrtStatus::ExecUnitUnrecoverable);
        }
        let mut q = lock(&w.work_queue_lock);
        let is_switch = q.last_posted_model != Some(info.model_id);
        if let Err(rc) = stage(&mut info, is_switch).and_then(|()| doorbell(&info)) {
            w.degraded.store(true, Ordering::Release);
            drop(q);
            release();
            return Err(rc);
        }
        q.last_posted_model = Some(info.model_id);
        q.consecutive_model_counter = if is_switch {
            1
        } else {
            q.consecutive_model_counter + 1
        };
        let req_id = self.id_tracker.fetch_add(1, Ordering::Relaxed);
        info.request.trace.seq_id = req_id;
        info.request.timeline_seq_id = req_id;
        q.deque.push_back(AsyncReq { req_id, info });
        drop(q);
        w.has_work.notify_one();
        Ok(req_id)
    }

    /// `consecutive_model_counter` of logical core `vnc`'s worker: how many executions of the
    /// last posted model were posted in a row (seed 000 §6, `kaew_post_request`).
    pub fn consecutive_model_counter(&self, vnc: u32) -> Option<u64> {
        let w = self.workers.get(vnc as usize)?;
        Some(lock(&w.work_queue_lock).consecutive_model_counter)
    }

    /// `nrt_async_drain_queued_execs`: blocks until logical core `vnc` has nothing queued.
    pub fn drain(&self, vnc: u32) {
        if let Some(w) = self.workers.get(vnc as usize) {
            let mut q = lock(&w.work_queue_lock);
            while !q.deque.is_empty() || q.busy {
                q = w
                    .drained
                    .wait(q)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }

    /// Drains every core, stops the workers and joins them.
    pub fn shutdown(&self) {
        for w in &self.workers {
            self.drain(w.vnc);
            lock(&w.work_queue_lock).stopping = true;
            w.has_work.notify_all();
        }
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
    }
}

fn worker_loop(
    w: &Worker,
    engine: &NqEngine,
    callback: &Mutex<Option<AsyncCallback>>,
    metrics: &Metrics,
) {
    loop {
        // The front request, in submission order; `busy` keeps drains waiting until it is done.
        let mut req = {
            let mut q = lock(&w.work_queue_lock);
            loop {
                if let Some(r) = q.deque.pop_front() {
                    q.busy = true;
                    break r;
                }
                if q.stopping {
                    return;
                }
                q = w
                    .has_work
                    .wait(q)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        let status = loop {
            match engine.progress_one_step(w.vnc, &mut req.info) {
                Progress::InFlight => {
                    crate::completion::block_on_wake(engine.wake_on(w.vnc, &req.info));
                }
                Progress::Done(s) => break s,
                Progress::Error(s) => {
                    w.degraded.store(true, Ordering::Release);
                    break s;
                }
            }
        };
        metrics.record_completion(
            w.vnc,
            &w.tpbs,
            req.info.model_slot,
            status,
            req.info.submission_ts.elapsed(),
            &req.info.resp,
        );
        let (model_id, req_id) = (req.info.model_id, req.req_id);
        drop(req);
        let cb = lock(callback).clone();
        if let Some(cb) = cb {
            IN_CALLBACK.with(|c| c.set(Some(w.vnc)));
            cb(model_id, w.vnc, req_id, status);
            IN_CALLBACK.with(|c| c.set(None));
        }
        *lock(&w.inflight) -= 1;
        w.inflight_freed.notify_one();
        let mut q = lock(&w.work_queue_lock);
        q.busy = false;
        if q.deque.is_empty() {
            w.drained.notify_all();
        }
    }
}

thread_local! {
    /// The logical core whose worker this thread is, while it runs the completion callback.
    static IN_CALLBACK: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

/// Whether the calling thread is inside the completion callback, on the pool's own worker: a
/// call that waits for the pool (a drain, `nrt_close`) would wait for itself there.
pub fn in_exec_callback() -> bool {
    exec_callback_vnc().is_some()
}

/// The logical core whose completion callback the calling thread is running, if it is: a call
/// that waits for an execution of that core (a tensor read behind a queued execution, an
/// unload) would wait for itself there, as that thread delivers the core's completions.
pub fn exec_callback_vnc() -> Option<u32> {
    IN_CALLBACK.with(std::cell::Cell::get)
}

#[cfg(test)]
mod in_process_tests;
