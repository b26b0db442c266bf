//! The completion hand-off between the worker and a waiting submitter, and the lock that closes
//! its race (seed 004 §5, "The completion signal").
//!
//! Two parties touch a slot's `mark_comp_efd` after submit: a waiter that installs its eventfd
//! ([`install_comp_efd`], `tpb_xu_base_get_comp_efd`), and the worker that pops the slot and
//! writes whatever eventfd it captured ([`pop_and_signal`], the pop inside
//! `tpb_xu_base_report_complete`). Both run under the XU's `mark_comp_lock`. Without it a waiter
//! could check "not complete", the worker capture −1 and advance `exec_head`, and the waiter then
//! install its fd into a slot nobody will ever signal: a lost wake-up. The lock is not a ring
//! lock — the cursors stay lock-free — it only serialises install against pop.
//!
//! The signal itself is a callback so the same code runs with real eventfds and under loom.

use shared::NrtStatus;
use shared::ids::SeqId;

use super::queue::{Install, Popped, XuQueue};
use super::sync::{Mutex, MutexGuard, lock};

/// The XU's `mark_comp_lock`. Tests can build one that does not lock, to show (under loom) that
/// the install-vs-signal race loses wake-ups without it.
#[derive(Debug)]
pub struct MarkCompLock {
    mutex: Mutex<()>,
    enabled: bool,
}

impl MarkCompLock {
    /// The lock, as the runtime uses it.
    pub fn new() -> Self {
        Self {
            mutex: Mutex::new(()),
            enabled: true,
        }
    }

    /// A lock that does nothing: only for demonstrating the race it closes.
    #[cfg(test)]
    pub fn disabled_for_test() -> Self {
        Self {
            mutex: Mutex::new(()),
            enabled: false,
        }
    }

    fn lock(&self) -> Option<MutexGuard<'_, ()>> {
        self.enabled.then(|| lock(&self.mutex))
    }
}

impl Default for MarkCompLock {
    fn default() -> Self {
        Self::new()
    }
}

/// Installs `efd` as request `seq_id`'s completion eventfd under the lock.
pub fn install_comp_efd<T>(
    queue: &XuQueue<T>,
    mark_comp_lock: &MarkCompLock,
    seq_id: SeqId,
    efd: i32,
    from_pool: bool,
) -> Install {
    let _guard = mark_comp_lock.lock();
    queue.install_comp_efd(seq_id, efd, from_pool)
}

/// Pops the slot at `exec_head` and calls `signal` with what was captured, all under the lock
/// (the seed writes `mark_comp_efd` inside the locked pop).
///
/// # Errors
/// `NRT_QUEUE_EMPTY` when nothing triggered is outstanding.
pub fn pop_and_signal<T>(
    queue: &XuQueue<T>,
    mark_comp_lock: &MarkCompLock,
    signal: impl FnOnce(&Popped),
) -> Result<Popped, NrtStatus> {
    let _guard = mark_comp_lock.lock();
    let popped = queue.worker_pop_current_exec()?;
    signal(&popped);
    Ok(popped)
}
