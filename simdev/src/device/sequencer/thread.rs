//! Who runs an NC's executions: the thread that delivered the doorbell, or the NC's sequencer
//! thread, and their wake-ups.
//!
//! # The sequencer role
//! At most one thread at a time takes an NC's INFERENCE_START counts and runs their executions,
//! one after another, in order: the thread holding the NC's *sequencer role*
//! ([`SeqState::running`]). Normally that is the connection thread that received the doorbell
//! (a posted SemaphoreIncrement of INFERENCE_START): it takes the role, runs the execution to
//! its notification and goes back to its connection — no thread hand-off between the
//! doorbell's arrival and the notification ([`Core::doorbell`], counted in
//! `inline_executions`). The NC's sequencer thread (started by the first write of
//! INFERENCE_START, stopped when the device is dropped) runs the rest — one thread hand-off,
//! counted in `sequencer_handoffs`:
//! - an execution that must wait for the outside world (every engine blocked, one on an
//!   event): the doorbell's thread may not sleep — the change it waits for may be its own
//!   connection's next message — so the execution is *suspended* ([`Park::Suspend`]) and
//!   handed, with the role, to the sequencer thread, which resumes it and may sleep;
//! - executions while a latency model is set, while faults are armed, or with references
//!   bound (they sleep or call out: [`Core::inline_allowed`]);
//! - counts made by anything but a doorbell message (a SemaphoreWrite, a DMA register
//!   write), and doorbells that arrive while another thread holds the role (the holder
//!   sees the change and takes the count itself).
//!
//! # Wake-ups
//! Every change of an NC's semaphores or events (a message, or a DMA register write) bumps
//! the NC's change counter under [`SeqSync`]'s lock; so do reset, release, reclaim,
//! [`Core::device_lost`] and the device's drop. The role holder, before releasing the role,
//! looks at the counter: if it moved since it last took counts, it looks again, so no count
//! is left behind. Sleepers are woken only when they exist: a parked execution or a sleep on
//! `change_cv` (counted in `change_waiters`), the idle sequencer thread on `work_cv` when the
//! role is free. Nothing busy-waits.
//!
//! # The role's read cache
//! Only the role holder runs executions, so the NC's read cache (the chunks its executions'
//! instruction fetches, request trailers and NEFF streams resolved to: [`Core::resolve_in`])
//! travels with the role ([`Role`]): taken out of [`SeqState`] with the role and put back
//! when it is released or handed over, under the lock those already take. No lock of its own
//! is taken per execution.
//!
//! [`Park::Suspend`]: crate::engines::Park::Suspend

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shared::sequencer::SEM_INFERENCE_START;

use crate::device::{Claim, Core, Nc, lock};
use crate::memory::ChunkCache;

use super::execution::{Execution, Ran};

/// An NC's sequencer wake-up state: the change counter, the role, the shutdown flag and the
/// thread.
#[derive(Debug, Default)]
pub(in crate::device) struct SeqSync {
    state: Mutex<SeqState>,
    /// [`SeqState::shutdown`], set under the lock with it, read without it
    /// ([`SeqSync::is_shutdown`]: an execution asks at every step whether it is abandoned).
    shutdown: AtomicBool,
    /// [`SeqState::changes`], stored under the lock after every bump, read without it
    /// ([`SeqSync::token`], once per scheduling round). A token read here may lag the counter
    /// (a bump not yet seen), never lead it: the wait that compares it under the lock
    /// ([`SeqSync::wait_change`]) then finds the counter moved and returns at once (one more
    /// round, no lost wake-up). And a token that shows a bump shows what it announced: the
    /// change (a semaphore or event written) comes before its bump, which is stored with
    /// Release and loaded with Acquire.
    changes: AtomicU64,
    /// The idle sequencer thread waits here for work.
    work_cv: Condvar,
    /// Parked executions and sleeps wait here for a change.
    change_cv: Condvar,
}

#[derive(Debug, Default)]
struct SeqState {
    /// Bumped by every change the sequencer may be waiting for.
    changes: u64,
    /// The device is being dropped: the thread exits.
    shutdown: bool,
    /// A thread holds the NC's sequencer role (see the module doc).
    running: bool,
    /// The change counter when the sequencer thread last took the role.
    seen: u64,
    /// An execution a doorbell's thread suspended, handed with the role to the sequencer
    /// thread.
    suspended: Option<Box<Execution>>,
    /// Threads waiting on `change_cv`.
    change_waiters: u32,
    /// The sequencer thread waits on `work_cv`.
    idle: bool,
    /// The thread, once started.
    thread: Option<JoinHandle<()>>,
    /// The role's read cache while no thread holds the role (made on first use).
    reads: Option<Box<ChunkCache>>,
}

/// The sequencer role, held by one thread: the change token it takes counts at and the NC's
/// read cache (see the module doc).
pub(super) struct Role {
    token: u64,
    reads: Box<ChunkCache>,
}

impl SeqState {
    /// Takes the role at the current change token (the caller checked that it is free).
    fn take_role(&mut self) -> Role {
        self.running = true;
        Role {
            token: self.changes,
            reads: self.reads.take().unwrap_or_default(),
        }
    }

    /// Puts the role's read cache back (the role is released or handed over).
    fn put_back(&mut self, role: Role) {
        self.reads = Some(role.reads);
    }
}

impl Role {
    /// Adds one to `counter`, which only the role's holder writes (`inline_executions`,
    /// `sequencer_handoffs`): a load and a store, not a locked add. The role goes from thread
    /// to thread under the [`SeqSync`] lock, which orders each holder's store before the next
    /// holder's load; readers in other threads load the whole word.
    fn count(&self, counter: &AtomicU64) {
        let n = counter.load(Ordering::Relaxed);
        counter.store(n.wrapping_add(1), Ordering::Relaxed);
    }
}

impl SeqSync {
    /// A semaphore or event of the NC changed, or the NC was reset, released or reclaimed, or
    /// the device is going away: wakes whoever waits for it.
    pub(in crate::device) fn changed(&self) {
        let mut state = lock(&self.state);
        state.changes = state.changes.wrapping_add(1);
        self.changes.store(state.changes, Ordering::Release);
        self.announce(state);
    }

    /// After a change: wakes the parked or sleeping executions, if any, and the idle sequencer
    /// thread when the role is free.
    fn announce(&self, state: MutexGuard<'_, SeqState>) {
        let (change, work) = (state.change_waiters > 0, state.idle && !state.running);
        drop(state);
        if change {
            self.change_cv.notify_all();
        }
        if work {
            self.work_cv.notify_one();
        }
    }

    /// The current change token (without the lock: see [`SeqSync::changes`]); `None` once the
    /// device is shutting down.
    pub(super) fn token(&self) -> Option<u64> {
        let token = self.changes.load(Ordering::Acquire);
        (!self.is_shutdown()).then_some(token)
    }

    /// Whether the device is shutting down (no lock: the flag is only ever set, under the lock
    /// with [`SeqState::shutdown`], which is what every wait looks at).
    pub(super) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Marks the device shutting down and wakes everyone waiting.
    fn shut_down(&self) {
        let mut state = lock(&self.state);
        state.shutdown = true;
        self.shutdown.store(true, Ordering::Release);
        drop(state);
        self.change_cv.notify_all();
        self.work_cv.notify_all();
    }

    /// Sleeps until the change counter moves past `token` or the device shuts down.
    pub(super) fn wait_change(&self, token: u64) {
        let mut state = lock(&self.state);
        state.change_waiters += 1;
        while state.changes == token && !state.shutdown {
            state = self
                .change_cv
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.change_waiters -= 1;
    }

    /// Sleeps for `duration`, or less when the device shuts down or `cut` (checked at every
    /// wake-up; it must take no lock of this `SeqSync`) becomes true.
    pub(super) fn sleep(&self, duration: Duration, cut: impl Fn() -> bool) {
        let start = Instant::now();
        let mut state = lock(&self.state);
        state.change_waiters += 1;
        loop {
            let left = duration.saturating_sub(start.elapsed());
            if state.shutdown || cut() || left.is_zero() {
                break;
            }
            state = match self.change_cv.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        state.change_waiters -= 1;
    }

    /// Takes the role for a doorbell's thread: the change token, or `None` when another thread
    /// holds it (or holds a suspended execution for it) or the device is shutting down —
    /// then the change is announced as any other.
    fn try_take_role(&self) -> Option<Role> {
        let mut state = lock(&self.state);
        state.changes = state.changes.wrapping_add(1);
        self.changes.store(state.changes, Ordering::Release);
        if state.running || state.shutdown || state.suspended.is_some() {
            self.announce(state);
            return None;
        }
        Some(state.take_role())
    }

    /// Releases the role unless the change counter moved past its token (then the role back
    /// with the new token: look for counts again).
    fn release_role(&self, mut role: Role) -> Option<Role> {
        let mut state = lock(&self.state);
        if state.changes != role.token && !state.shutdown {
            role.token = state.changes;
            return Some(role);
        }
        state.running = false;
        state.put_back(role);
        None
    }

    /// Hands `execution` with the role to the sequencer thread.
    fn hand_over(&self, execution: Box<Execution>, role: Role) {
        let mut state = lock(&self.state);
        state.suspended = Some(execution);
        state.put_back(role);
        let work = state.idle;
        drop(state);
        if work {
            self.work_cv.notify_one();
        }
    }

    /// The sequencer thread's next work: a suspended execution with the role (handed over by
    /// a doorbell's thread, which set `running`), or the role with the change token to take
    /// counts from; `None` at shutdown.
    fn next_work(&self) -> Option<(Option<Box<Execution>>, Role)> {
        let mut state = lock(&self.state);
        loop {
            if state.shutdown {
                return None;
            }
            if let Some(execution) = state.suspended.take() {
                return Some((Some(execution), state.take_role()));
            }
            if !state.running && state.changes != state.seen {
                state.seen = state.changes;
                return Some((None, state.take_role()));
            }
            state.idle = true;
            state = self
                .work_cv
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.idle = false;
        }
    }
}

/// One INFERENCE_START count taken: the NC's owner when it was taken and the NC's epoch.
pub(super) struct Work {
    pub(super) claim: Arc<Claim>,
    pub(super) epoch: u64,
}

impl Core {
    /// A semaphore or event of `nc` changed: wakes its sequencer, starting its thread first
    /// when `starts` (a write of [`SEM_INFERENCE_START`]).
    pub(in crate::device) fn registers_changed(&self, nc: &Nc, starts: bool) {
        if starts {
            self.start_sequencer(nc);
        }
        nc.seq.changed();
    }

    /// Starts `nc`'s sequencer thread unless it runs or the device is shutting down.
    fn start_sequencer(&self, nc: &Nc) {
        let mut state = lock(&nc.seq.state);
        if state.thread.is_some() || state.shutdown {
            return;
        }
        let Some(core) = self.me.upgrade() else {
            return;
        };
        let index = nc.index;
        let spawned = std::thread::Builder::new()
            .name(format!("simdev-seq-nc{index}"))
            .spawn(move || core.sequencer_main(index));
        match spawned {
            Ok(thread) => state.thread = Some(thread),
            Err(e) => tracing::error!(
                "starting NC {index}'s sequencer thread: {e}; the next doorbell retries"
            ),
        }
    }

    /// Stops and joins every sequencer thread (the device is being dropped). An execution in
    /// progress, parked or suspended is abandoned without a notification.
    pub(in crate::device) fn stop_sequencers(&self) {
        for nc in &self.ncs {
            nc.seq.shut_down();
        }
        for nc in &self.ncs {
            let thread = lock(&nc.seq.state).thread.take();
            if let Some(thread) = thread
                && thread.join().is_err()
            {
                tracing::error!("NC {}'s sequencer thread panicked", nc.index);
            }
        }
    }

    /// Whether an execution of `nc` that started in `epoch` must end without a notification.
    pub(super) fn abandoned(&self, nc: &Nc, epoch: u64) -> bool {
        self.epoch_moved(nc, epoch) || nc.seq.is_shutdown()
    }

    /// Whether the device was lost or `nc` was reset, released or reclaimed since `epoch`
    /// (atomics only: safe under any lock, the leaf `compute` lock included).
    pub(super) fn epoch_moved(&self, nc: &Nc, epoch: u64) -> bool {
        self.lost.load(Ordering::SeqCst) || nc.epoch.load(Ordering::Acquire) != epoch
    }

    /// The sequencer thread of NC `index`: resumes the executions doorbells' threads suspend
    /// and takes the counts nobody else takes, and sleeps in between.
    fn sequencer_main(&self, index: u32) {
        let Some(nc) = self.nc_ref(index) else {
            return;
        };
        tracing::debug!("NC {index}: sequencer started");
        while let Some((suspended, mut role)) = nc.seq.next_work() {
            if let Some(execution) = suspended {
                role.count(&nc.counters.sequencer_handoffs);
                self.resume(nc, execution, &mut role.reads);
            }
            self.take_counts(nc, role, true);
        }
        tracing::debug!("NC {index}: sequencer stopped");
    }

    /// A doorbell (a posted SemaphoreIncrement of INFERENCE_START) reached `nc`: runs its
    /// executions on this thread when it may take the role (see the module doc), else wakes
    /// the sequencer thread.
    pub(in crate::device) fn doorbell(&self, nc: &Nc) {
        if !self.inline_allowed() {
            self.registers_changed(nc, true);
            return;
        }
        match nc.seq.try_take_role() {
            Some(role) => self.take_counts(nc, role, false),
            // The holder takes the count; the thread must exist for a suspended execution.
            None => self.start_sequencer(nc),
        }
    }

    /// Whether executions may run on a doorbell's thread: no latency model (pacing sleeps),
    /// no armed fault (delays, late completions) and no reference bound (it calls out to
    /// another process) — each would hold the connection's thread.
    fn inline_allowed(&self) -> bool {
        !self.simulated() && self.references.is_empty() && !self.faults_armed()
    }

    /// Holding `role`: takes `nc`'s counts and runs their executions until none is left and
    /// nothing changed, then releases the role. On a doorbell's thread (`on_sequencer` false)
    /// an execution that must wait is handed, with the role, to the sequencer thread instead.
    fn take_counts(&self, nc: &Nc, mut role: Role, on_sequencer: bool) {
        loop {
            // The claim the last execution ran for, for the next look.
            let mut held = None;
            while let Some(work) = self.take_start(nc, held.take()) {
                if on_sequencer {
                    role.count(&nc.counters.sequencer_handoffs);
                    if let Ran::Ended(claim) = self.execute(nc, work, true, &mut role.reads) {
                        held = Some(claim);
                    }
                    continue;
                }
                match self.execute(nc, work, false, &mut role.reads) {
                    Ran::Ended(claim) => {
                        role.count(&nc.counters.inline_executions);
                        held = Some(claim);
                    }
                    Ran::Suspended(execution) => {
                        self.start_sequencer(nc);
                        nc.seq.hand_over(execution, role);
                        return;
                    }
                }
            }
            match nc.seq.release_role(role) {
                Some(same) => role = same,
                None => return,
            }
        }
    }

    /// Takes one INFERENCE_START count of `nc`, if its semaphore is positive (read as an i32).
    /// The check and the subtraction are two atomic steps; the sequencer is the semaphore's
    /// only consumer, so only a client decrementing it at the same time could race (and then
    /// only with itself).
    ///
    /// `held`: the claim the role's last execution ran for. While it still owns the NC, a
    /// semaphore at zero is seen without the claim's lock (the last look of every run of
    /// counts): the lock would not keep a count from being added right after the look either —
    /// a count comes with its doorbell or register write, which moves the change token
    /// `release_role` compares, and the role looks again. A count taken reuses `held`
    /// instead of cloning the owner's reference.
    fn take_start(&self, nc: &Nc, held: Option<Arc<Claim>>) -> Option<Work> {
        if self.lost.load(Ordering::SeqCst) {
            return None;
        }
        if let Some(claim) = &held
            && self.owned_by(nc, claim.client)
            && claim
                .registers
                .semaphore(SEM_INFERENCE_START)
                .is_ok_and(|v| i32::from_ne_bytes(v.to_ne_bytes()) <= 0)
        {
            return None;
        }
        // Looked at under the claim's lock, cloned only for a count taken.
        let owner = lock(&nc.claim);
        let claim = owner.as_ref()?;
        let epoch = nc.epoch.load(Ordering::Acquire);
        let value = claim.registers.semaphore(SEM_INFERENCE_START).ok()?;
        if i32::from_ne_bytes(value.to_ne_bytes()) <= 0 {
            return None;
        }
        claim.registers.semaphore_sub(SEM_INFERENCE_START, 1).ok()?;
        let claim = match held {
            Some(held) if Arc::ptr_eq(&held, claim) => held,
            _ => claim.clone(),
        };
        drop(owner);
        Some(Work { claim, epoch })
    }
}
