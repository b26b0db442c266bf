//! Each NC's sequencer thread: started by the first write of INFERENCE_START, stopped when the
//! device is dropped; it takes one count at a time and runs one execution per count.
//!
//! Wake-ups: every change of an NC's semaphores or events (a message, or a DMA register write)
//! bumps the NC's change counter under [`SeqSync`]'s lock and notifies its condition variable;
//! so do reset, release, reclaim, [`Core::device_lost`] and the device's drop. The sequencer
//! thread takes a token (the counter) before looking for work or running a scheduling round,
//! and sleeps only while the counter still equals it, so no change is missed and nothing
//! busy-waits.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shared::sequencer::SEM_INFERENCE_START;

use crate::device::{Claim, Core, Nc, lock};

/// An NC's sequencer wake-up state: the change counter, the shutdown flag and the thread.
#[derive(Debug, Default)]
pub(in crate::device) struct SeqSync {
    state: Mutex<SeqState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct SeqState {
    /// Bumped by every change the sequencer may be waiting for.
    changes: u64,
    /// The device is being dropped: the thread exits.
    shutdown: bool,
    /// The thread, once started.
    thread: Option<JoinHandle<()>>,
}

impl SeqSync {
    /// A semaphore or event of the NC changed, or the NC was reset, released or reclaimed, or
    /// the device is going away: wakes the sequencer.
    pub(in crate::device) fn changed(&self) {
        let mut state = lock(&self.state);
        state.changes = state.changes.wrapping_add(1);
        drop(state);
        self.cv.notify_all();
    }

    /// The current change token; `None` once the device is shutting down.
    pub(super) fn token(&self) -> Option<u64> {
        let state = lock(&self.state);
        (!state.shutdown).then_some(state.changes)
    }

    pub(super) fn is_shutdown(&self) -> bool {
        lock(&self.state).shutdown
    }

    /// Sleeps until the change counter moves past `token` or the device shuts down.
    pub(super) fn wait_change(&self, token: u64) {
        let mut state = lock(&self.state);
        while state.changes == token && !state.shutdown {
            state = self.cv.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Sleeps for `duration`, or less when the device shuts down or `cut` (checked at every
    /// wake-up; it must take no lock of this `SeqSync`) becomes true.
    pub(super) fn sleep(&self, duration: Duration, cut: impl Fn() -> bool) {
        let start = Instant::now();
        let mut state = lock(&self.state);
        loop {
            let left = duration.saturating_sub(start.elapsed());
            if state.shutdown || cut() || left.is_zero() {
                return;
            }
            state = match self.cv.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
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
    /// progress or parked is abandoned without a notification.
    pub(in crate::device) fn stop_sequencers(&self) {
        for nc in &self.ncs {
            lock(&nc.seq.state).shutdown = true;
            nc.seq.cv.notify_all();
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

    /// The sequencer thread of NC `index`: runs one execution per INFERENCE_START count, in
    /// order, and sleeps in between.
    fn sequencer_main(&self, index: u32) {
        let Some(nc) = self.nc_ref(index) else {
            return;
        };
        tracing::debug!("NC {index}: sequencer started");
        while let Some(token) = nc.seq.token() {
            match self.take_start(nc) {
                Some(work) => self.execute(nc, work),
                None => nc.seq.wait_change(token),
            }
        }
        tracing::debug!("NC {index}: sequencer stopped");
    }

    /// Takes one INFERENCE_START count of `nc`, if its semaphore is positive (read as an i32).
    /// The check and the subtraction are two atomic steps; the sequencer is the semaphore's
    /// only consumer, so only a client decrementing it at the same time could race (and then
    /// only with itself).
    fn take_start(&self, nc: &Nc) -> Option<Work> {
        if self.lost.load(Ordering::SeqCst) {
            return None;
        }
        let claim = self.owner(nc)?;
        let epoch = nc.epoch.load(Ordering::Acquire);
        let value = claim.registers.semaphore(SEM_INFERENCE_START).ok()?;
        if i32::from_ne_bytes(value.to_ne_bytes()) <= 0 {
            return None;
        }
        claim.registers.semaphore_sub(SEM_INFERENCE_START, 1).ok()?;
        Some(Work { claim, epoch })
    }
}
