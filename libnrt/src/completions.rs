//! How a scheduled request's completion reaches C: its `ret` (`NRT_STATUS*`) written before
//! the request is reported complete by any channel, and the caller's eventfds signalled.
//!
//! # `ret` before completion
//! The runtime publishes each request's status in its own cell ([`ScheduledExecution::status`],
//! [`ScheduledTensorOp::status`]) before the request shows as completed. This library keeps
//! every scheduled request with the caller's `ret` in [`PENDING`] and *settles* them — writes
//! `*ret` once, from the cell, and forgets the request — at these moments, each before the
//! completion becomes visible to C through this library:
//! - in `nrta_is_completed` (when it answers true) and `nrta_get_sequence`, before returning;
//! - in the completion relay (below), after every completion of an XU this library scheduled
//!   on, before it signals any caller eventfd.
//!
//! So `ret` is written within one thread hop of the completion even if the caller only spins
//! on it, and always before `nrta_is_completed`, `nrta_get_sequence` or a caller eventfd can
//! report the request. A request is added to [`PENDING`] under its lock held across the
//! schedule call, so the relay cannot settle (or forward) a completion before the request is
//! known.
//!
//! # The completion relay
//! Caller eventfds are never handed to the runtime: the runtime would signal them from its
//! worker before this library wrote `ret`. Instead, for every XU this library schedules on (or
//! the caller registers for), the relay registers its own non-blocking eventfd with
//! [`Runtime::event_register_xu_completion`] and one thread of this library epolls them all.
//! On a wake it reads the XU's count, settles, then writes that count to the caller's XU
//! completion eventfd (if registered: exactly the completions since its registration) and 1 to
//! each caller eventfd registered for a sequence id of that XU that has now completed (each
//! signalled once). The caller keeps ownership of its eventfds: the relay holds duplicates,
//! closed after the signal or the deregistration; a descriptor that is not an eventfd is
//! refused. `nrt_close` drops every registration, stops the relay's thread and joins it
//! ([`reset`]): no thread of this library outlives `nrt_close`, so a caller may `dlclose` it.
//!
//! The relay belongs to the process that started it. A child forked after its parent used the
//! async API inherits the parent's epoll instance and eventfds (the same open files: a change
//! to the epoll set would change the parent's) but not its thread; when that child, after its
//! own `nrt_init`, schedules or registers, it leaves the inherited relay and the parent's
//! pending requests untouched (leaked, as the runtime leaks its inherited state) and starts a
//! relay of its own.
//!
//! The only `unsafe` is the write through `ret` ([`RetPtr`]) and the duplication of a caller's
//! descriptor number ([`dup_eventfd`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::{NrtError, Runtime, ScheduledExecution, ScheduledTensorOp};
use shared::NrtStatus;
use shared::ids::{SeqId, XuId, XuType};

fn invalid(message: impl Into<String>) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A caller's `NRT_STATUS *ret`.
///
/// # Invariants
/// Non-NULL. By the API's contract (`nrt_async.h`) the caller keeps the 4 bytes at it valid
/// and writable until the request is reported complete, and does not write them meanwhile.
#[derive(Debug)]
pub struct RetPtr(usize);

impl RetPtr {
    /// The caller's `ret`.
    ///
    /// # Errors
    /// NRT_INVALID for NULL.
    pub fn new(ret: *mut u32) -> Result<Self, NrtError> {
        if ret.is_null() {
            return Err(invalid("ret is NULL"));
        }
        Ok(Self(ret as usize))
    }

    fn write(&self, status: NrtStatus) {
        // SAFETY: non-NULL (constructor); the caller keeps `ret` valid until the request is
        // reported complete, which happens only after this write (the module's ordering); the
        // write is unaligned-tolerant and happens once (the entry is removed under PENDING's
        // lock as it is written).
        unsafe { (self.0 as *mut u32).write_unaligned(status as u32) };
    }
}

/// A scheduled request's status cell.
#[derive(Debug)]
pub enum Scheduled {
    /// `nrta_execute_schedule`.
    Execution(ScheduledExecution),
    /// `nrta_tensor_{read,write,copy}`.
    TensorOp(ScheduledTensorOp),
}

impl Scheduled {
    fn status(&self) -> Option<NrtStatus> {
        match self {
            Self::Execution(e) => e.status(),
            Self::TensorOp(t) => t.status(),
        }
    }

    /// Its sequence id.
    pub fn seq_id(&self) -> SeqId {
        match self {
            Self::Execution(e) => e.seq_id(),
            Self::TensorOp(t) => t.seq_id(),
        }
    }
}

/// Requests scheduled through this library whose `ret` is not written yet.
#[derive(Debug, Default)]
pub struct Pending(Vec<(Scheduled, RetPtr)>);

/// The requests whose `ret` is pending. Held across a schedule call and its insertion.
pub static PENDING: Mutex<Pending> = Mutex::new(Pending(Vec::new()));

impl Pending {
    /// Records `req`, whose status goes to `ret`.
    pub fn push(&mut self, req: Scheduled, ret: RetPtr) {
        self.0.push((req, ret));
    }

    /// Writes the `ret` of every request whose status is published, and forgets them.
    fn settle(&mut self) {
        self.0.retain(|(req, ret)| match req.status() {
            Some(s) => {
                ret.write(s);
                false
            }
            None => true,
        });
    }
}

/// Writes the `ret` of every request whose status is published.
pub fn settle() {
    lock(&PENDING).settle();
}

/// The relay's state for one XU: its eventfd registered with the runtime, and the caller's
/// XU completion eventfd (a duplicate).
#[derive(Debug)]
struct Watch {
    efd: EventFd,
    caller: Option<OwnedFd>,
}

#[derive(Debug, Default)]
struct State {
    /// By raw xu_id.
    xus: HashMap<u16, Watch>,
    /// Caller eventfds (duplicates) waiting for a sequence id.
    seq_regs: Vec<(SeqId, OwnedFd)>,
}

struct Relay {
    epoll: Epoll,
    /// Written once by [`reset`]: the thread returns.
    stop: EventFd,
    state: Mutex<State>,
}

/// The epoll token of [`Relay::stop`] (an XU's token is its 16-bit id).
const STOP: u64 = u64::MAX;

/// The relay's thread, with the process that started it.
struct Running {
    relay: Arc<Relay>,
    thread: JoinHandle<()>,
    pid: u32,
}

/// The relay: started by the first request or registration of a process, stopped and joined
/// by its `nrt_close`.
static RELAY: Mutex<Option<Running>> = Mutex::new(None);

fn failure(what: &str, e: Errno) -> NrtError {
    NrtError::new(NrtStatus::Failure, format!("{what}: {e}"))
}

/// This process's relay, started if need be (see the module docs for a forked child's).
fn relay() -> Result<Arc<Relay>, NrtError> {
    let mut slot = lock(&RELAY);
    let me = runtime::process::id();
    match slot.take() {
        Some(r) if r.pid == me => {
            let relay = r.relay.clone();
            *slot = Some(r);
            return Ok(relay);
        }
        Some(inherited) => {
            // The parent's: its epoll set and eventfds are the parent's open files and its
            // thread is not in this process. Nothing of it may be dropped or changed here.
            std::mem::forget(inherited);
            std::mem::forget(std::mem::take(&mut lock(&PENDING).0));
        }
        None => {}
    }
    let epoll =
        Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| failure("epoll_create1", e))?;
    let stop = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
        .map_err(|e| failure("eventfd", e))?;
    epoll
        .add(&stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))
        .map_err(|e| failure("epoll_ctl", e))?;
    let relay = Arc::new(Relay {
        epoll,
        stop,
        state: Mutex::new(State::default()),
    });
    let runs = relay.clone();
    let thread = std::thread::Builder::new()
        .name("nrt-completion-relay".into())
        .spawn(move || runs.run())
        .map_err(|e| {
            NrtError::new(
                NrtStatus::Failure,
                format!("spawning the completion relay: {e}"),
            )
        })?;
    *slot = Some(Running {
        relay: relay.clone(),
        thread,
        pid: me,
    });
    Ok(relay)
}

/// Writes `count` to eventfd `fd` (a caller's, duplicated).
fn signal(fd: &OwnedFd, count: u64) {
    if let Err(e) = nix::unistd::write(fd, &count.to_ne_bytes()) {
        tracing::warn!(target: "nrt", errno = %e, fd = fd.as_raw_fd(), "writing a caller's completion eventfd");
    }
}

impl Relay {
    fn run(&self) {
        let mut events = [EpollEvent::empty(); 16];
        loop {
            let n = match self.epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!(target: "nrt", errno = %e, "the completion relay's epoll_wait failed");
                    continue;
                }
            };
            for e in &events[..n] {
                if e.data() == STOP {
                    return;
                }
                let Ok(xu) = u16::try_from(e.data()) else {
                    continue;
                };
                self.on_completion(xu);
            }
        }
    }

    /// XU `xu` completed one or more requests.
    fn on_completion(&self, xu: u16) {
        let mut st = lock(&self.state);
        let Some(w) = st.xus.get(&xu) else {
            return; // deregistered at nrt_close; the fd left the epoll set with it
        };
        // The count is read before settling: every completion it counts has its status
        // published (before the request showed as completed, before the XU eventfd's write).
        let count = w.efd.read().unwrap_or(0); // EAGAIN: drained by a registration
        settle();
        if count > 0
            && let Some(fd) = &w.caller
        {
            signal(fd, count);
        }
        if st.seq_regs.iter().any(|(s, _)| s.xu_id().raw() == xu) {
            fire_completed(&mut st.seq_regs, |s| s.xu_id().raw() == xu);
        }
    }

    /// Watches XU `(lnc, xu_type, queue)`: registers an eventfd of ours as its completion fd.
    fn ensure(
        &self,
        st: &mut State,
        rt: &Runtime,
        lnc: u32,
        xu_type: XuType,
        queue: u8,
    ) -> Result<u16, NrtError> {
        // The runtime names a logical core or queue it does not have (NRT_INVALID) before
        // the id is packed.
        rt.get_sequence(lnc, xu_type, u32::from(queue))?;
        let vnc = u8::try_from(lnc).map_err(|_| invalid(format!("logical core {lnc}")))?;
        if queue >= 16 {
            return Err(invalid(format!("queue {queue} does not exist")));
        }
        let id = XuId::new(xu_type, queue, vnc).raw();
        if st.xus.contains_key(&id) {
            return Ok(id);
        }
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| NrtError::new(NrtStatus::Failure, format!("eventfd: {e}")))?;
        rt.event_register_xu_completion(lnc, xu_type, u32::from(queue), Some(efd.as_fd()))?;
        self.epoll
            .add(&efd, EpollEvent::new(EpollFlags::EPOLLIN, u64::from(id)))
            .map_err(|e| NrtError::new(NrtStatus::Failure, format!("epoll_ctl: {e}")))?;
        st.xus.insert(id, Watch { efd, caller: None });
        Ok(id)
    }
}

/// Signals (and drops) every registration matching `which` whose sequence id has completed,
/// after settling: the completions are read first, so every request signalled has its status
/// published (it is published before the request shows as completed) and its `ret` written.
/// With no runtime to ask (`nrt_close` is draining it) the registrations stay, for [`reset`];
/// one whose id the runtime does not know is dropped unsignalled.
fn fire_completed(regs: &mut Vec<(SeqId, OwnedFd)>, which: impl Fn(SeqId) -> bool) {
    let Ok(rt) = crate::rt() else {
        return;
    };
    let mut due = Vec::new();
    let mut i = 0;
    while i < regs.len() {
        let seq = regs[i].0;
        match (which(seq), rt.is_completed(seq)) {
            (false, _) | (true, Ok(false)) => i += 1,
            (true, Ok(true)) => due.push(regs.swap_remove(i).1),
            (true, Err(_)) => drop(regs.swap_remove(i)),
        }
    }
    if !due.is_empty() {
        settle();
    }
    for fd in due {
        signal(&fd, 1);
    }
}

/// Makes sure the relay watches XU `(lnc, xu_type, queue)` before a request is scheduled on
/// it, so its completion writes the request's `ret` even if the caller never asks.
///
/// # Errors
/// The runtime's NRT_INVALID for a logical core or queue it does not have; NRT_FAILURE when
/// an eventfd or the relay cannot be set up.
pub fn watch(rt: &Runtime, lnc: u32, xu_type: XuType, queue: u8) -> Result<(), NrtError> {
    let r = relay()?;
    let mut st = lock(&r.state);
    r.ensure(&mut st, rt, lnc, xu_type, queue).map(|_| ())
}

/// A duplicate of the caller's eventfd `fd` (close-on-exec), which stays the caller's.
///
/// # Errors
/// NRT_INVALID when `fd` is not an open eventfd of this process.
fn dup_eventfd(fd: RawFd) -> Result<OwnedFd, NrtError> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .map_err(|_| invalid(format!("fd {fd} is not an open descriptor of this process")))?;
    if !info.lines().any(|l| l.starts_with("eventfd-count:")) {
        return Err(invalid(format!(
            "fd {fd} is not an eventfd (completion events are eventfd counts)"
        )));
    }
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) only reads the descriptor number; an fd closed meanwhile
    // fails with EBADF (checked), never touching memory.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(invalid(format!(
            "fd {fd} cannot be duplicated: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `dup` is a descriptor fcntl just created for us: nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// `nrta_event_register_seq_id_completion`: `fd` (≥ 0) is signalled with 1 when `seq_id`
/// completes — at once if it has — after its `ret` is written; -1 drops every registration of
/// `seq_id`, none of which is signalled after this returns.
///
/// # Errors
/// NRT_INVALID for a sequence id of no request of this runtime, an fd below -1 or one that is
/// not an eventfd.
pub fn register_seq(rt: &Runtime, seq_id: SeqId, fd: i32) -> Result<(), NrtError> {
    rt.is_completed(seq_id)?; // names the id when it is of no XU of ours
    if fd < -1 {
        return Err(invalid(format!(
            "fd {fd} is not a descriptor (-1 deregisters)"
        )));
    }
    let r = relay()?;
    let id = seq_id.xu_id();
    let xu_type = id
        .xu_type()
        .ok_or_else(|| invalid("sequence id of no XU type"))?;
    let mut st = lock(&r.state);
    if fd == -1 {
        st.seq_regs.retain(|(s, _)| *s != seq_id);
        return Ok(());
    }
    let dup = dup_eventfd(fd)?;
    r.ensure(&mut st, rt, u32::from(id.vnc_id()), xu_type, id.queue())?;
    // Under the state lock: a completion after this check wakes the relay, which waits for it.
    // Completed first, then settled: its status was published before it showed as completed.
    if rt.is_completed(seq_id)? {
        settle();
        signal(&dup, 1);
    } else {
        st.seq_regs.push((seq_id, dup));
    }
    Ok(())
}

/// `nrta_event_register_xu_completion`: `fd` (≥ 0) gets each completion of XU `(lnc, xu_type,
/// queue)` from now on, after the request's `ret` is written (replacing an earlier
/// registration); -1 deregisters.
///
/// # Errors
/// As [`watch`]; NRT_INVALID for an fd below -1 or one that is not an eventfd.
pub fn register_xu(
    rt: &Runtime,
    lnc: u32,
    xu_type: XuType,
    queue: u8,
    fd: i32,
) -> Result<(), NrtError> {
    if fd < -1 {
        return Err(invalid(format!(
            "fd {fd} is not a descriptor (-1 deregisters)"
        )));
    }
    let dup = (fd >= 0).then(|| dup_eventfd(fd)).transpose()?;
    let r = relay()?;
    let mut st = lock(&r.state);
    let id = r.ensure(&mut st, rt, lnc, xu_type, queue)?;
    let Some(w) = st.xus.get_mut(&id) else {
        return Err(NrtError::new(NrtStatus::Failure, "XU watch vanished"));
    };
    // Completions before this registration are not the new fd's: consume them here (their
    // `ret` written, their sequence registrations fired), then install.
    if w.efd.read().is_ok() {
        settle();
        fire_completed(&mut st.seq_regs, |s| s.xu_id().raw() == id);
    }
    if let Some(w) = st.xus.get_mut(&id) {
        w.caller = dup;
    }
    Ok(())
}

/// At `nrt_close`, after the runtime closed: writes every published `ret`, passes on what the
/// relay has not yet (each XU's completions since its last wake, to the caller's XU eventfd),
/// then drops every watch and registration, their duplicates closing.
///
/// `drained`: the runtime completed every accepted request before it closed
/// ([`runtime::nrt::Closed::Drained`]), so every request registered for by sequence id has
/// completed and its eventfd is signalled now. Otherwise (calls still ran at close's deadline)
/// the registrations are dropped unsignalled and requests whose status is not published keep
/// their `ret` unwritten (close said so in its error).
///
/// Then the relay's thread is stopped and joined, and its epoll instance and eventfds closed.
/// (Only this process's relay: `nrt_close` of a forked child that did not call `nrt_init` does
/// not come here.)
pub fn reset(drained: bool) {
    settle();
    let running = {
        let mut slot = lock(&RELAY);
        match slot.take() {
            Some(r) if r.pid == runtime::process::id() => Some(r),
            other => {
                *slot = other;
                None
            }
        }
    };
    if let Some(Running { relay, thread, .. }) = running {
        {
            let mut st = lock(&relay.state);
            for (_, w) in st.xus.drain() {
                let _ = relay.epoll.delete(&w.efd);
                if let (Ok(count), Some(fd)) = (w.efd.read(), &w.caller) {
                    signal(fd, count);
                }
            }
            for (_, fd) in st.seq_regs.drain(..) {
                if drained {
                    signal(&fd, 1);
                }
            }
        }
        // Outside the state lock, which the thread may be waiting for.
        if let Err(e) = relay.stop.write(1) {
            tracing::error!(target: "nrt", errno = %e, "stopping the completion relay");
        } else if thread.join().is_err() {
            tracing::error!(target: "nrt", "the completion relay panicked");
        }
    }
    lock(&PENDING).0 = Vec::new();
}
