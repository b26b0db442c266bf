//! The completion hand-off between the worker and a waiting submitter, and the lock that closes
//! its race (seed 004 §5, "The completion signal").
//!
//! Two parties touch a request's completion eventfd (`mark_comp_efd`) after submit: a waiter that
//! installs one ([`XuQueue::install_comp_efd`], `tpb_xu_base_get_comp_efd`), and the worker that
//! pops the slot and writes whatever eventfd it took ([`Consumer::worker_pop_current_exec`], the
//! pop inside `tpb_xu_base_report_complete`). Both run under the queue's `mark_comp_lock`, which
//! here *owns* the eventfds: [`MarkCompLock`] is a mutex over one [`CompEfd`] per slot, so the
//! type system enforces the seed's locking rule. Without the lock spanning "check, then act" a
//! waiter could see "not complete", the worker take nothing and advance `exec_head`, and the
//! waiter then install its fd into a slot nobody will signal: a lost wake-up. The lock is not a
//! ring lock — the cursors stay lock-free — it only serialises install against pop.
//!
//! A completion eventfd is an owned value, never a raw fd number: [`CompEfd::Pool`] shares a
//! pooled eventfd with the pool (dropping the slot's reference keeps the fd open), and
//! [`CompEfd::Fresh`] owns a fresh one (dropping it after the signal closes it, also when the
//! write failed). No safe call can install an fd it does not own or have an arbitrary fd closed.
//!
//! [`XuQueue::install_comp_efd`]: super::queue::XuQueue::install_comp_efd
//! [`Consumer::worker_pop_current_exec`]: super::queue::Consumer::worker_pop_current_exec

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::eventfd::EventFd;

use super::sync::{Mutex, MutexGuard, lock};

/// A request's completion eventfd as a slot holds it (the seed's `mark_comp_efd` with its
/// `efd_from_pool` flag folded into the variant).
///
/// ```compile_fail,E0308
/// // A raw fd number cannot become a completion eventfd: the slot only takes fds it owns.
/// let _ = runtime::xu::CompEfd::Fresh(1);
/// ```
///
/// ```
/// // What safe code can do: hand over an eventfd it owns.
/// let efd = nix::sys::eventfd::EventFd::new().unwrap();
/// let _ = runtime::xu::CompEfd::Fresh(efd.into());
/// ```
#[derive(Debug, Default)]
pub enum CompEfd {
    /// No waiter (the seed's `-1`): the pop writes nothing.
    #[default]
    None,
    /// A pooled eventfd (`efd_from_pool`): written, then the slot's reference is dropped and the
    /// pool keeps the fd.
    Pool(Arc<EventFd>),
    /// A fresh eventfd the slot owns: written, then closed (also when the write failed).
    Fresh(OwnedFd),
}

impl CompEfd {
    /// Whether a waiter installed an eventfd.
    pub fn is_some(&self) -> bool {
        !matches!(self, Self::None)
    }

    /// `write(mark_comp_efd, 1)`; nothing for [`CompEfd::None`].
    ///
    /// # Errors
    /// The write's errno.
    pub fn signal(&self) -> Result<(), Errno> {
        match self {
            Self::None => Ok(()),
            Self::Pool(efd) => shared::nocancel::eventfd_write(efd.as_fd(), 1),
            Self::Fresh(fd) => shared::nocancel::eventfd_write(fd.as_fd(), 1),
        }
    }
}

/// What one slot holds under `mark_comp_lock`: the waiter's completion eventfd
/// (`mark_comp_efd`) and the eventfds registered for the request through
/// `nrta_event_register_seq_id_completion` (each a dup the runtime owns; empty — no allocation —
/// unless someone registered).
#[derive(Debug, Default)]
pub(crate) struct SlotEfds {
    /// The waiter's eventfd (at most one).
    pub(crate) mark_comp_efd: CompEfd,
    /// Registered seq-id completion eventfds, written 1 each at the pop, then closed.
    pub(crate) registered: Vec<OwnedFd>,
}

impl SlotEfds {
    /// Writes 1 to every registered eventfd (a failure is logged: the caller's eventfd, not the
    /// request, is at fault) and closes them.
    pub(crate) fn signal_registered(registered: Vec<OwnedFd>) {
        for fd in &registered {
            if let Err(e) = nix::unistd::write(fd, &1u64.to_ne_bytes()) {
                tracing::warn!(errno = %e, "writing a registered seq-id completion eventfd");
            }
        }
    }
}

/// The queue's `mark_comp_lock`, owning each slot's completion eventfds (indexed like the ring's
/// buffer). Tests can build one whose critical sections cover only the eventfd cells and not the
/// cursor check or bump next to them, to show (under loom) that the race returns.
#[derive(Debug)]
pub(crate) struct MarkCompLock {
    efds: Mutex<Box<[SlotEfds]>>,
    /// Whether the lock spans the check-then-install and take-then-bump sequences (always, but
    /// in the loom model that demonstrates the race).
    spans_check_and_act: bool,
}

impl MarkCompLock {
    /// The lock for a ring of `capacity` slots, all without an eventfd.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            efds: Mutex::new((0..capacity).map(|_| SlotEfds::default()).collect()),
            spans_check_and_act: true,
        }
    }

    /// A lock that guards only the eventfd cells: only for demonstrating the race it closes.
    #[cfg(all(test, loom))]
    pub(crate) fn narrowed_for_test(capacity: usize) -> Self {
        Self {
            spans_check_and_act: false,
            ..Self::new(capacity)
        }
    }

    /// Takes the lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Box<[SlotEfds]>> {
        lock(&self.efds)
    }

    /// Whether nobody holds the lock right now (tests).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_free(&self) -> bool {
        self.efds.try_lock().is_ok()
    }

    /// Whether the lock must be held across the cursor check/bump (false only in the race demo).
    pub(crate) fn spans_check_and_act(&self) -> bool {
        self.spans_check_and_act
    }
}
