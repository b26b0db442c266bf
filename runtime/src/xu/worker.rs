//! The per-vNC worker threads (`kmgr_xu_worker_do_work`, seed 004 §4).
//!
//! One joinable thread per vNC, owning every XU of that vNC (COMPUTE, TENSOR_OP, COLLECTIVES).
//! Each has its own epoll instance over its stop eventfd (`eventfd(0, 0)`, a latch, registered
//! `EPOLLIN | EPOLLEXCLUSIVE`) and the `has_work_efd` of each XU it owns (`EPOLLIN`,
//! level-triggered). Events carry a typed [`Token`]: `Stop` exits the thread, `Step(i)` steps
//! owned XU `i`. Because `has_work_efd` is an `EFD_SEMAPHORE` eventfd whose count is consumed one
//! per completed request, epoll wakes the worker exactly once per queued request.
//!
//! # Waiting for an in-flight request
//! A step never sleeps (one sleeping step would stall every other XU of the vNC). When a
//! request is in flight and its engine names a [`Wake`] fd, the worker stops watching that XU's
//! `has_work_efd` (its count stays: the request is not done) and watches the wake fd instead
//! (`Wake(r)`, edge-triggered: each write to it is one event; see `WakeReg`), with the wake's
//! `within` as a deadline; when the fd is written or the deadline passed it watches
//! `has_work_efd` again and steps the XU. Meanwhile the other XUs' events are
//! served as they come. An engine that names no wake fd is stepped again as soon as the worker
//! has looked at its other XUs (the level-triggered `has_work_efd` stays readable).
//!
//! # The idle watch
//! When a step completes an XU's last released request and the engine names where the next
//! request's progress will show ([`StepOutcome::Idle`]), the worker keeps watching that fd, not
//! `has_work_efd`, for the engine's `within`. A request submitted meanwhile is stepped first
//! when its notification arrives instead of once at its `has_work_efd` write and again at its
//! notification: on a shared CPU the early step is a context switch into the worker and back
//! before the device has even seen the doorbell. The `has_work_efd` count is untouched (one
//! write per submit, one read per completion, seed 004); a request that makes no progress on the
//! fd (a STOP, a step past on a degraded XU, a lost notification) is stepped when the watch
//! ends, at most `within` later. A request released while the completing step was still
//! ending (its submitter, woken by that completion, ran first) is left to the watch too when
//! nothing of it is posted yet where the watch looks (the engine's `progress_shows_on`); one
//! already posted there is stepped at once (its write may have come before the watch began).
//!
//! # Harvest bursts
//! A step that completed a request and left more released ([`StepOutcome::Ready`]) is followed
//! at once by a step of the next one — without going back to `epoll_wait` — while that request's
//! `has_work_efd` write has come and its engine says its progress is already posted
//! ([`ExecutionUnit::ready_to_harvest`], no system call), at most [`MAX_BURST`] steps per
//! event. With executions pipelined, simdev posts a batch of notifications at once and the
//! worker harvests them in one wake-up. The `has_work_efd` rules stay: each completion still
//! reads one count, and a request whose write has not come is never stepped. Fairness across
//! the vNC's XUs: a burst ends after [`MAX_BURST`] steps; the XU's `has_work_efd` is then still
//! readable (level-triggered), and epoll reports the other XUs' ready fds before it again.
//!
//! [`XuWorkers::destroy`] writes every stop fd first, then joins each thread and closes its fd.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use shared::NrtStatus;

use super::execution_unit::{ExecutionUnit, StepOutcome, Wake, WorkerKey};
use crate::error::NrtError;

/// What an epoll event means to a worker (the seed's 16-byte `{tag, xu}` record, typed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// The worker's stop eventfd (tag 0): exit the thread.
    Stop,
    /// Owned XU `i` has work (tag 1): step it.
    Step(usize),
    /// Wake fd `r` (an engine's event fd some in-flight XUs wait on) is readable: step them.
    Wake(usize),
}

/// Token values at or above this are `Wake`.
const WAKE_BASE: u64 = 1 << 32;

impl From<Token> for u64 {
    fn from(t: Token) -> u64 {
        match t {
            Token::Stop => 0,
            Token::Step(i) => i as u64 + 1,
            Token::Wake(r) => WAKE_BASE + r as u64,
        }
    }
}

impl From<u64> for Token {
    fn from(v: u64) -> Token {
        match v {
            0 => Token::Stop,
            n if n >= WAKE_BASE => {
                Token::Wake(usize::try_from(n - WAKE_BASE).unwrap_or(usize::MAX))
            }
            n => Token::Step(usize::try_from(n - 1).unwrap_or(usize::MAX)),
        }
    }
}

/// Events one `epoll_wait` returns at most (the seed waits for 9).
const MAX_EVENTS: usize = 9;

/// Most steps of one XU per epoll event (the first included) in a harvest burst.
pub const MAX_BURST: u32 = 16;

/// Most XUs one worker owns (the waiter sets are `u64` masks).
pub const MAX_OWNED_XUS: usize = 64;

static WORKER_SET_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Debug)]
struct Worker {
    stop_efd: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
    /// `epoll_wait` calls that returned (events or timeout).
    epoll_returns: Arc<AtomicU64>,
}

/// The running workers, one per vNC.
#[derive(Debug)]
pub struct XuWorkers {
    workers: Vec<Worker>,
    name_prefix: String,
}

/// An owned XU's waiting state: which wake fd it waits on, until when, and whether it is an
/// idle watch (no request was in flight when it began).
#[derive(Clone, Copy, Debug)]
struct Waiting {
    reg: usize,
    until: Option<Instant>,
    idle: bool,
}

/// A wake fd registered in the worker's epoll: the worker's own duplicate of an engine's fd
/// (so the registration never depends on the engine's fd number staying put), the engine fd
/// number it was made from (the lookup key), and which owned XUs wait on it.
///
/// It is registered once, edge-triggered (`EPOLLIN | EPOLLET`), and stays so: every write to
/// it (an eventfd wakes its pollers on each write) is one event, and an event that finds
/// nobody waiting is dropped — whoever waits on it later began waiting after a step that
/// harvested everything that write announced. So nobody has to read the fd for the worker
/// (the engine still drains it before its last harvest of a step, for its other pollers), and
/// back-to-back executions cost no `epoll_ctl` and no read.
#[derive(Debug)]
struct WakeReg {
    key: RawFd,
    /// The registered duplicate, kept open as long as the registration.
    _dup: OwnedFd,
    waiters: u64,
}

/// One worker's loop state.
struct Loop {
    epoll: Epoll,
    owned: Vec<Arc<dyn ExecutionUnit>>,
    waiting: Vec<Option<Waiting>>,
    /// Whether each owned XU's `has_work_efd` is watched (armed in the epoll set).
    has_work_watched: Vec<bool>,
    regs: Vec<WakeReg>,
    epoll_returns: Arc<AtomicU64>,
    /// The clock, read at most once between two sleeps in `epoll_wait` ([`Loop::now`]).
    now: Option<Instant>,
}

fn ev(armed: bool, token: Token) -> EpollEvent {
    let flags = if armed {
        EpollFlags::EPOLLIN
    } else {
        EpollFlags::empty()
    };
    EpollEvent::new(flags, token.into())
}

/// An epoll timeout covering `d` (whole milliseconds, rounded up).
fn timeout_for(d: Duration) -> EpollTimeout {
    let ms = d.as_nanos().div_ceil(1_000_000);
    EpollTimeout::try_from(i32::try_from(ms).unwrap_or(i32::MAX)).unwrap_or(EpollTimeout::NONE)
}

impl Loop {
    /// Now, as read once since the last sleep: the deadlines of the waits armed after a wake-up,
    /// the check of those that passed, and the next sleep's timeout share one clock read. The
    /// microseconds of work between them only make a deadline fire that much later (the
    /// timeout is in whole milliseconds, rounded up).
    fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(Instant::now)
    }

    fn run(mut self) {
        let mut events = [EpollEvent::empty(); MAX_EVENTS];
        loop {
            let until = self.waiting.iter().flatten().filter_map(|w| w.until).min();
            let timeout = until.map_or(EpollTimeout::NONE, |t| {
                timeout_for(t.saturating_duration_since(self.now()))
            });
            self.now = None;
            let n = match shared::nocancel::epoll_wait(
                self.epoll.0.as_fd(),
                &mut events,
                timeout.into(),
            ) {
                Ok(n) => {
                    // This worker is the counter's only writer: no locked add.
                    let returns = self.epoll_returns.load(Ordering::Relaxed);
                    self.epoll_returns.store(returns + 1, Ordering::Relaxed);
                    n
                }
                // EINTR (a signal) and other transient failures: wait again, as the seed does.
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(errno = %e, "Epoll returned invalid status");
                    continue;
                }
            };
            for e in &events[..n] {
                match Token::from(e.data()) {
                    Token::Stop => return,
                    Token::Step(i) => {
                        // An XU that started waiting after this batch was collected is stepped
                        // on its wake fd, not here.
                        if self.waiting.get(i).is_some_and(Option::is_none) {
                            self.step(i);
                        } else if i >= self.owned.len() {
                            tracing::error!(
                                index = i,
                                "epoll event for an XU this worker does not own"
                            );
                        }
                    }
                    Token::Wake(r) => {
                        let waiters = self.regs.get(r).map_or(0, |reg| reg.waiters);
                        for i in 0..self.owned.len() {
                            if waiters & (1 << i) != 0 {
                                self.resume(i);
                            }
                        }
                    }
                }
            }
            // No clock read when nothing waits with a deadline (the common case with
            // executions pipelined).
            if !self.waiting.iter().flatten().any(|w| w.until.is_some()) {
                continue;
            }
            let now = self.now();
            for i in 0..self.owned.len() {
                if self.waiting[i].is_some_and(|w| w.until.is_some_and(|t| t <= now)) {
                    self.resume(i);
                }
            }
        }
    }

    /// Steps owned XU `i` — again at once while it is [`ExecutionUnit::ready_to_harvest`], at
    /// most [`MAX_BURST`] times (a harvest burst) — then watches what the last outcome names:
    /// `has_work_efd` when it is ready for more, the wake fd when it waits.
    fn step(&mut self, i: usize) {
        // The XU list is moved out for the burst and back after it: `wait` takes the loop
        // mutably while the wake it is given borrows the XU. Moving the list is a pointer;
        // cloning the XU's `Arc` was a locked increment and decrement per step. Nothing in
        // the burst looks at `self.owned` (a panic in a step ends the worker thread).
        let owned = std::mem::take(&mut self.owned);
        let Some(xu) = owned.get(i) else {
            self.owned = owned;
            return;
        };
        let key = WorkerKey::new();
        let mut steps = 0;
        let waiting = loop {
            steps += 1;
            match xu.step(key) {
                StepOutcome::Ready if steps < MAX_BURST && xu.ready_to_harvest(key) => {}
                StepOutcome::Ready => break false,
                StepOutcome::Wait(wake) => break self.wait(i, &**xu, wake, false),
                StepOutcome::Idle(wake) => break self.wait(i, &**xu, wake, true),
            }
        };
        self.owned = owned;
        self.watch_has_work(i, !waiting);
    }

    /// Whether the worker's epoll watches owned XU `i`'s `has_work_efd`: changed with one
    /// `epoll_ctl` only when it changes, so back-to-back executions that each go from a wait
    /// on the wake fd to an idle watch on it cost none.
    fn watch_has_work(&mut self, i: usize, on: bool) {
        if self.has_work_watched[i] == on {
            return;
        }
        let xu = &self.owned[i];
        match self.epoll.modify(
            xu.has_work_fd(WorkerKey::new()),
            &mut ev(on, Token::Step(i)),
        ) {
            Ok(()) => self.has_work_watched[i] = on,
            Err(e) if on => tracing::error!(errno = %e, "re-arming has_work_efd"),
            Err(e) => tracing::warn!(errno = %e, "pausing has_work_efd"),
        }
    }

    /// Owned XU `i` waits on `wake` (for its in-flight request, or in an idle watch): watch the
    /// wake fd; returns whether it waits (the caller stops watching its `has_work_efd`).
    fn wait(&mut self, i: usize, xu: &dyn ExecutionUnit, wake: Wake<'_>, idle: bool) -> bool {
        let reg = match self.reg_of(wake) {
            Ok(r) => r,
            Err(e) => {
                // Without a registered wake fd the XU is stepped again at once, as an engine
                // without one is.
                tracing::warn!(xu = xu.xu_id().raw(), errno = %e, "registering an XU wake fd");
                return false;
            }
        };
        self.regs[reg].waiters |= 1 << i;
        let until = wake.within.map(|d| self.now() + d);
        self.waiting[i] = Some(Waiting { reg, until, idle });
        true
    }

    /// Owned XU `i` stops waiting: step it — after an idle watch only if its `has_work_efd` is
    /// readable (a request released but not yet counted must not be stepped: its completion
    /// would find no count to consume); else the worker watches its `has_work_efd` again, which
    /// wakes it when the count comes.
    fn resume(&mut self, i: usize) {
        let Some(w) = self.waiting[i].take() else {
            return;
        };
        self.regs[w.reg].waiters &= !(1 << i);
        if !w.idle || self.owned[i].has_work(WorkerKey::new()) {
            self.step(i);
        } else {
            self.watch_has_work(i, true);
        }
    }

    /// The registration of `wake.fd` (made on first use; see [`WakeReg`]). A fd readable when
    /// it is registered is one event at once.
    fn reg_of(&mut self, wake: Wake<'_>) -> Result<usize, Errno> {
        let key = wake.fd.as_raw_fd();
        if let Some(r) = self.regs.iter().position(|r| r.key == key) {
            return Ok(r);
        }
        let fd = wake
            .fd
            .try_clone_to_owned()
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EBADF)))?;
        let r = self.regs.len();
        self.epoll.add(
            &fd,
            EpollEvent::new(
                EpollFlags::EPOLLIN | EpollFlags::EPOLLET,
                Token::Wake(r).into(),
            ),
        )?;
        self.regs.push(WakeReg {
            key,
            _dup: fd,
            waiters: 0,
        });
        Ok(r)
    }
}

impl XuWorkers {
    /// `kmgr_xu_workers_init`: one joinable worker per group in `groups` (a vNC's XUs, e.g.
    /// [`super::XuTable::groups`]), epolling every XU of its group. Threads are named
    /// `<prefix><vnc of the group's first XU>`.
    ///
    /// # Errors
    /// `NRT_INVALID` for an empty group or one of more than [`MAX_OWNED_XUS`] XUs; when an
    /// eventfd, epoll instance or thread cannot be created, [`crate::error::io_os_error`]'s
    /// (`NRT_RESOURCE` for a limit, naming it), and the workers already started are stopped.
    pub fn start(groups: &[Vec<Arc<dyn ExecutionUnit>>]) -> Result<Self, NrtError> {
        if groups
            .iter()
            .any(|g| g.is_empty() || g.len() > MAX_OWNED_XUS)
        {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!("a worker owns 1 to {MAX_OWNED_XUS} execution units"),
            ));
        }
        let set = WORKER_SET_ID.fetch_add(1, Ordering::Relaxed);
        let mut this = Self {
            workers: Vec::new(),
            name_prefix: format!("xuw{set}-"),
        };
        for group in groups {
            match this.spawn_one(group.clone()) {
                Ok(w) => this.workers.push(w),
                Err(e) => {
                    this.destroy();
                    return Err(crate::error::io_os_error(
                        &e,
                        &format!("the XU worker of logical core {}", group[0].vnc()),
                    ));
                }
            }
        }
        Ok(this)
    }

    fn spawn_one(&self, owned: Vec<Arc<dyn ExecutionUnit>>) -> std::io::Result<Worker> {
        let stop_efd = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)?);
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            stop_efd.as_fd(),
            EpollEvent::new(
                EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE,
                Token::Stop.into(),
            ),
        )?;
        for (i, xu) in owned.iter().enumerate() {
            epoll.add(xu.has_work_fd(WorkerKey::new()), ev(true, Token::Step(i)))?;
        }
        let name = format!("{}{}", self.name_prefix, owned[0].vnc());
        let epoll_returns = Arc::new(AtomicU64::new(0));
        let state = Loop {
            epoll_returns: epoll_returns.clone(),
            epoll,
            waiting: vec![None; owned.len()],
            has_work_watched: vec![true; owned.len()],
            regs: Vec::with_capacity(owned.len()),
            owned,
            now: None,
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || state.run())?;
        Ok(Worker {
            stop_efd,
            thread: Some(thread),
            epoll_returns,
        })
    }

    /// `epoll_wait` calls that returned, summed over the workers (a deterministic measure of
    /// the worker's wake-ups: harvest bursts make it less than one per execution).
    pub fn epoll_returns(&self) -> u64 {
        self.workers
            .iter()
            .map(|w| w.epoll_returns.load(Ordering::Relaxed))
            .sum()
    }

    /// The thread-name prefix of this set's workers (`<prefix><vnc>`), unique per set.
    pub fn thread_name_prefix(&self) -> &str {
        &self.name_prefix
    }

    /// Number of workers.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether there are no workers.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// `kmgr_xu_workers_destroy`: writes every stop fd, then joins every thread and closes its
    /// stop fd.
    ///
    /// # Panics
    /// If a stop fd cannot be written (the seed aborts: the worker could never be joined).
    pub fn destroy(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for (i, w) in self.workers.iter().enumerate() {
            if let Err(e) = w.stop_efd.write(1) {
                tracing::error!(worker = i, errno = %e, "Failed to post stop to XU worker");
                panic!("failed to post stop to XU worker {i}: {e}");
            }
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take()
                && t.join().is_err()
            {
                tracing::error!("an XU worker panicked");
            }
        }
        self.workers.clear();
    }
}

impl Drop for XuWorkers {
    fn drop(&mut self) {
        if !self.workers.is_empty() {
            self.stop_all();
        }
    }
}
