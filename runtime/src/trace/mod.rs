//! The Perfetto timeline (`NEURON_RT_TRACE=FILE`, `nrt bench --trace FILE`): the runtime's own
//! execution spans merged with the device's events on one clock, written once at close as
//! Chrome trace-event JSON that Perfetto (and `chrome://tracing`) opens.
//!
//! This is not the system trace ([`crate::sys_trace`]): that one is libnrt's
//! `nrt_sys_trace_*` API (per-logical-core event rings an application fetches as JSON while it
//! runs). The timeline is a profiler's file: where each thread of this process spent an
//! execution, and what the device did meanwhile.
//!
//! # Spans
//! [`SpanKind`] names them: `execute` (the whole `nrt_execute` or scheduling call), `bind`,
//! `stage`, `doorbell`, `wait` (the submitter blocked on the completion), on the calling
//! thread; `harvest` (the completion step that finished the request) on the worker that ran
//! it. Each carries the execution's `seq_id`, `compute_idx`, logical core (`vnc`) and model id.
//! The async paths (`execute_schedule`, the implicit-async pool) get the spans they have: no
//! `wait`, and their `execute` span covers the scheduling call only.
//!
//! The calling thread's spans are *pended* ([`Timeline::pend`]) in a small thread-local array
//! while its execution's ids are not yet known (bind runs before the sequence id exists) and
//! *committed* with the ids at the end of the call ([`Timeline::commit`]).
//!
//! # Cost
//! A disabled timeline ([`Timeline::disabled`]) is one branch per site ([`Timeline::now`]
//! returns `None`; every other call is a no-op on `None`) and allocates nothing. An enabled one
//! reads `CLOCK_MONOTONIC` at each span edge and pushes committed spans into a buffer
//! preallocated at [`Timeline::new`] ([`DEFAULT_MAX_SPANS`]); spans beyond it are dropped and
//! counted (the file's `otherData.dropped_spans`). A thread's name is copied once, at its first
//! committed span.
//!
//! # Clock
//! Every timestamp is the host's `CLOCK_MONOTONIC` ([`shared::device_trace::monotonic_ns`]);
//! simdev stamps its events relative to its own start on the same clock and says where that
//! is ([`shared::protocol::TraceClock`]), so both land on one axis ([`mod@file`] documents the
//! file).

pub mod file;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

pub use shared::device_trace::monotonic_ns;

/// Spans an enabled timeline holds (preallocated) before it drops.
pub const DEFAULT_MAX_SPANS: usize = 1 << 18;

/// Most [`crate::backend::Device::trace_drain`] round trips one file takes (each brings one
/// message's worth of events: this bounds the drain of simdev's largest buffers).
pub const MAX_DRAINS: usize = 1 << 20;

/// Spans one thread can pend before a commit (more are dropped and counted).
const MAX_PENDING: usize = 16;

/// What a span covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// The whole execute (or scheduling) call.
    Execute,
    /// Binding the I/O tensors into the work item's resources.
    Bind,
    /// Staging the request on the exec queue (under `compute_req_lock`).
    Stage,
    /// Ringing the doorbell of each TPB.
    Doorbell,
    /// The submitter blocked on the completion.
    Wait,
    /// The completion step that finished the request (on the worker).
    Harvest,
}

impl SpanKind {
    /// The span's name in the file.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Execute => "execute",
            Self::Bind => "bind",
            Self::Stage => "stage",
            Self::Doorbell => "doorbell",
            Self::Wait => "wait",
            Self::Harvest => "harvest",
        }
    }
}

/// The ids of one execution, the arguments of its spans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecIds {
    /// Its `nrta_seq_t` (`xu_id << 48 | seq_num`), the implicit-async pool's job id there.
    pub seq_id: u64,
    /// Its compute index (one for all the logical core's NCs).
    pub compute_idx: u32,
    /// The logical core.
    pub vnc: u32,
    /// The model's handle id.
    pub model_id: u64,
}

/// One recorded span (host `CLOCK_MONOTONIC` ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// What it covers.
    pub kind: SpanKind,
    /// The thread (Linux tid).
    pub tid: u32,
    /// Start.
    pub start_ns: u64,
    /// Duration.
    pub dur_ns: u64,
    /// The execution.
    pub ids: ExecIds,
}

/// A span pended on the calling thread, waiting for its execution's ids.
#[derive(Clone, Copy, Debug)]
struct Pended {
    kind: SpanKind,
    start_ns: u64,
    dur_ns: u64,
}

/// The calling thread's pended spans.
struct Pending {
    spans: [Option<Pended>; MAX_PENDING],
    len: usize,
    overflow: u64,
}

thread_local! {
    static PENDING: RefCell<Pending> = const {
        RefCell::new(Pending { spans: [None; MAX_PENDING], len: 0, overflow: 0 })
    };
    /// The (seq_id, compute_idx) of the execution this thread is submitting, noted at stage.
    static NOTED: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
    /// This thread's Linux tid (0: not read yet).
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// The calling thread's Linux tid.
fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            t.set(u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0));
        }
        t.get()
    })
}

/// An enabled timeline's buffer.
#[derive(Debug)]
struct Recorder {
    max_spans: usize,
    spans: Mutex<Vec<Span>>,
    dropped: AtomicU64,
    /// (tid, name) of every thread with a committed span.
    threads: Mutex<Vec<(u32, String)>>,
}

/// The process's execution spans: disabled (records nothing), or a bounded buffer.
#[derive(Debug, Default)]
pub struct Timeline {
    inner: Option<Box<Recorder>>,
}

impl Timeline {
    /// A timeline that records nothing.
    pub const fn disabled() -> Self {
        Self { inner: None }
    }

    /// A timeline holding at most `max_spans` spans (allocated now).
    pub fn new(max_spans: usize) -> Self {
        Self {
            inner: Some(Box::new(Recorder {
                max_spans,
                spans: Mutex::new(Vec::with_capacity(max_spans)),
                dropped: AtomicU64::new(0),
                threads: Mutex::new(Vec::new()),
            })),
        }
    }

    /// Whether spans are recorded.
    #[inline]
    pub const fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// A span's start: the clock now, `None` when disabled (the one branch of a site).
    #[inline]
    pub fn now(&self) -> Option<u64> {
        if self.inner.is_some() {
            Some(monotonic_ns())
        } else {
            None
        }
    }

    /// Pends a `kind` span on the calling thread from `start` (from [`Timeline::now`]) to now;
    /// [`Timeline::commit`] records it with its execution's ids.
    #[inline]
    pub fn pend(&self, kind: SpanKind, start: Option<u64>) {
        let Some(start_ns) = start else { return };
        let dur_ns = monotonic_ns().saturating_sub(start_ns);
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            if p.len < MAX_PENDING {
                let i = p.len;
                p.spans[i] = Some(Pended {
                    kind,
                    start_ns,
                    dur_ns,
                });
                p.len += 1;
            } else {
                p.overflow += 1;
            }
        });
    }

    /// The start of a call's `execute` span: like [`Timeline::now`], and it forgets what an
    /// earlier call that failed before its commit left pended on this thread.
    #[inline]
    pub fn begin(&self) -> Option<u64> {
        self.inner.as_ref()?;
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            p.len = 0;
        });
        NOTED.with(|n| n.set((0, 0)));
        Some(monotonic_ns())
    }

    /// Notes the ids of the execution the calling thread is submitting (at stage, where they
    /// are known) for [`Timeline::commit_noted`].
    #[inline]
    pub fn note(&self, seq_id: u64, compute_idx: u32) {
        if self.inner.is_some() {
            NOTED.with(|n| n.set((seq_id, compute_idx)));
        }
    }

    /// Replaces the noted sequence id (the implicit-async pool assigns its job id after stage).
    #[inline]
    pub fn note_seq_id(&self, seq_id: u64) {
        if self.inner.is_some() {
            NOTED.with(|n| n.set((seq_id, n.get().1)));
        }
    }

    /// [`Timeline::commit`] with the noted ids, on logical core `vnc` for model `model_id`.
    pub fn commit_noted(&self, vnc: u32, model_id: u64) {
        if self.inner.is_none() {
            return;
        }
        let (seq_id, compute_idx) = NOTED.with(Cell::get);
        self.commit(ExecIds {
            seq_id,
            compute_idx,
            vnc,
            model_id,
        });
    }

    /// Records the calling thread's pended spans with `ids`.
    pub fn commit(&self, ids: ExecIds) {
        let Some(inner) = self.inner.as_deref() else {
            return;
        };
        let tid = tid();
        let (spans, n, overflow) = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let n = p.len;
            p.len = 0;
            (p.spans, n, std::mem::take(&mut p.overflow))
        });
        inner.register_thread(tid);
        let mut held = inner.spans.lock().unwrap_or_else(PoisonError::into_inner);
        let mut lost = overflow;
        for pended in spans[..n].iter().flatten() {
            if held.len() < inner.max_spans {
                held.push(Span {
                    kind: pended.kind,
                    tid,
                    start_ns: pended.start_ns,
                    dur_ns: pended.dur_ns,
                    ids,
                });
            } else {
                lost += 1;
            }
        }
        drop(held);
        if lost > 0 {
            inner.dropped.fetch_add(lost, Ordering::Relaxed);
        }
    }

    /// Records a `kind` span of the calling thread from `start` to now with `ids` at once (the
    /// worker's harvest, whose ids are known).
    pub fn record(&self, kind: SpanKind, start: Option<u64>, ids: ExecIds) {
        let (Some(start_ns), Some(inner)) = (start, self.inner.as_deref()) else {
            return;
        };
        let dur_ns = monotonic_ns().saturating_sub(start_ns);
        let tid = tid();
        inner.register_thread(tid);
        let mut held = inner.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if held.len() < inner.max_spans {
            held.push(Span {
                kind,
                tid,
                start_ns,
                dur_ns,
                ids,
            });
        } else {
            drop(held);
            inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The spans recorded so far (a copy) and the threads that recorded them.
    pub fn snapshot(&self) -> (Vec<Span>, Vec<(u32, String)>) {
        self.inner
            .as_deref()
            .map_or_else(Default::default, |inner| {
                (
                    inner
                        .spans
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone(),
                    inner
                        .threads
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone(),
                )
            })
    }

    /// Spans dropped so far (the buffer was full, or a thread pended too many).
    pub fn dropped(&self) -> u64 {
        self.inner
            .as_deref()
            .map_or(0, |i| i.dropped.load(Ordering::Relaxed))
    }

    /// The buffer's bound (0 when disabled).
    pub fn max_spans(&self) -> usize {
        self.inner.as_deref().map_or(0, |i| i.max_spans)
    }
}

impl Recorder {
    /// Names thread `tid` once (the first span it commits).
    fn register_thread(&self, tid: u32) {
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        if threads.iter().any(|(t, _)| *t == tid) {
            return;
        }
        let current = std::thread::current();
        let name = current
            .name()
            .map_or_else(|| format!("thread {tid}"), str::to_owned);
        threads.push((tid, name));
    }
}

#[cfg(test)]
mod tests;
