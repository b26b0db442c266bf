//! Notifications: building an entry, posting it to an NC's notification queue and signalling
//! the NC's eventfd (a full or absent queue counts a drop), and DeviceLost to every claimed NC.
//!
//! # Signals deferred over a batch of messages
//! A connection thread that received several messages in one system call serves them inside a
//! [`DeferredSignals`] scope: the notification eventfd writes of the executions it runs inline
//! are collected, one per NC claim, and written when the scope ends or before the thread sends
//! a reply ([`DeferredSignals::flush`]). The NQ entries themselves are written at once; only
//! the "look again" write waits, and it is written before the thread answers anything or sleeps
//! for its next message. With 16 executions queued back to back the client is woken once per
//! batch instead of once per execution. Other threads (the sequencer thread) signal at once.
//! A connection thread ends its batch's scope with [`DeferredSignals::end_unwritten`] and
//! submits the writes with its wait for the next message ([`crate::uring`]), or writes them
//! just before it ([`PendingSignals`]).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shared::notification::{NotificationEntry, NotificationKind, error_flags};

use crate::dma::error_chain;
use crate::notify::PostError;
use crate::trace::{Detail, Event};

use super::{Claim, Core, Nc, NcState, lock};

/// Distinct NC claims one batch defers signals for; a further one is signalled at once.
const DEFERRED_CLAIMS: usize = 8;

/// This thread's deferred signals: `None` outside a [`DeferredSignals`] scope.
struct Pending {
    claims: [Option<Arc<Claim>>; DEFERRED_CLAIMS],
}

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
}

/// A scope in which this thread's notification eventfd writes are deferred (one per NC claim)
/// until [`DeferredSignals::flush`] or the scope's end. Allocates nothing.
#[derive(Debug)]
pub struct DeferredSignals {
    /// Not `Send`: the deferral is this thread's.
    _thread: std::marker::PhantomData<*const ()>,
}

impl DeferredSignals {
    /// Starts deferring this thread's signals (nested scopes: the outermost one flushes).
    pub fn begin() -> Self {
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            if p.is_none() {
                *p = Some(Pending {
                    claims: [const { None }; DEFERRED_CLAIMS],
                });
            }
        });
        Self {
            _thread: std::marker::PhantomData,
        }
    }

    /// Writes every signal deferred so far (the scope goes on deferring).
    pub fn flush(&self) {
        flush_pending();
    }
}

/// Notification eventfd writes taken out of a [`DeferredSignals`] scope unwritten
/// ([`DeferredSignals::end_unwritten`]), for the connection thread to submit with its wait for
/// the next message ([`crate::uring`]). Holds the claims, so the eventfds stay open until then.
/// None is lost: what is still held when it drops is written then.
#[derive(Debug, Default)]
pub struct PendingSignals {
    claims: [Option<Arc<Claim>>; DEFERRED_CLAIMS],
}

impl PendingSignals {
    /// The eventfds to write, one per NC claim.
    pub fn fds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> + '_ {
        self.claims.iter().flatten().map(|c| c.registers.eventfd())
    }

    /// Writes every eventfd now; none is pending after.
    pub fn write(&mut self) {
        for claim in self.claims.iter_mut().filter_map(Option::take) {
            claim.registers.signal();
        }
    }

    /// Forgets them: the caller has had every eventfd of [`PendingSignals::fds`] written (an
    /// io_uring write submitted).
    pub fn written_elsewhere(&mut self) {
        self.claims = [const { None }; DEFERRED_CLAIMS];
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.claims.iter().all(Option::is_none)
    }
}

impl Drop for PendingSignals {
    fn drop(&mut self) {
        self.write();
    }
}

impl DeferredSignals {
    /// Ends this thread's deferral (the outermost scope: a connection thread's batch) without
    /// writing: the signals deferred so far are returned for the caller to write.
    pub fn end_unwritten(self) -> PendingSignals {
        let mut out = PendingSignals::default();
        PENDING.with(|p| {
            if let Some(p) = p.borrow_mut().as_mut() {
                std::mem::swap(&mut out.claims, &mut p.claims);
            }
            *p.borrow_mut() = None;
        });
        // Its drop would flush and end the deferral: both done.
        std::mem::forget(self);
        out
    }
}

impl Drop for DeferredSignals {
    fn drop(&mut self) {
        flush_pending();
        PENDING.with(|p| *p.borrow_mut() = None);
    }
}

fn flush_pending() {
    let mut taken: [Option<Arc<Claim>>; DEFERRED_CLAIMS] = [const { None }; DEFERRED_CLAIMS];
    PENDING.with(|p| {
        if let Some(p) = p.borrow_mut().as_mut() {
            std::mem::swap(&mut taken, &mut p.claims);
        }
    });
    for claim in taken.into_iter().flatten() {
        claim.registers.signal();
    }
}

/// Signals `claim`'s notification eventfd now, or once at the end of this thread's
/// [`DeferredSignals`] scope.
fn signal(claim: Arc<Claim>) {
    let claim = PENDING.with(|p| {
        let mut p = p.borrow_mut();
        let Some(p) = p.as_mut() else {
            return Some(claim);
        };
        if p.claims.iter().flatten().any(|c| Arc::ptr_eq(c, &claim)) {
            return None;
        }
        match p.claims.iter_mut().find(|c| c.is_none()) {
            Some(free) => {
                *free = Some(claim);
                None
            }
            None => Some(claim),
        }
    });
    if let Some(claim) = claim {
        claim.registers.signal();
    }
}

impl Core {
    pub(super) fn device_lost(&self) {
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        // A reference in progress ends now, not at its timeout (minutes, for a slow one).
        self.references.stop_worker();
        for nc in &self.ncs {
            // Wakes a parked execution, which sees `lost` and ends without a notification.
            nc.seq.changed();
        }
        for nc in &self.ncs {
            if self.owner(nc).is_none() {
                continue;
            }
            let mut state = lock(&nc.state);
            let entry = self.entry(
                nc,
                NotificationKind::DeviceLost,
                0,
                error_flags::DEVICE_LOST,
            );
            self.post(nc, &mut state, &entry);
        }
    }

    pub(super) fn entry(
        &self,
        nc: &Nc,
        kind: NotificationKind,
        source: u16,
        flags: u32,
    ) -> NotificationEntry {
        NotificationEntry {
            compute_idx: 0,
            kind: kind as u16,
            source,
            error_flags: flags,
            phase: 0,
            device_ts_ns: self.device_time_ns(nc),
            nc_ts_ns: 0,
        }
    }

    /// Posts `entry` to `nc`'s notification queue and signals the NC's eventfd; counts a drop
    /// when the queue is full or absent.
    pub(super) fn post(&self, nc: &Nc, state: &mut NcState, entry: &NotificationEntry) {
        self.post_to(nc, state, entry, None);
    }

    /// [`Core::post`], signalling `owner` — the NC's owner, which the caller knows (under
    /// `state`'s lock) — or, when `None`, the owner it looks up under the claim's lock.
    pub(super) fn post_to(
        &self,
        nc: &Nc,
        state: &mut NcState,
        entry: &NotificationEntry,
        owner: Option<&Arc<Claim>>,
    ) {
        let posted = self.post_entry(nc, state, entry, owner);
        if self.tracer.enabled() {
            self.tracer.record(Event {
                nc: nc.index,
                ts_ns: entry.device_ts_ns,
                dur_ns: None,
                detail: Detail::Notification {
                    kind: entry.kind,
                    compute_idx: entry.compute_idx,
                    flags: entry.error_flags,
                    source: entry.source,
                    dropped: !posted,
                },
            });
        }
    }

    /// [`Core::post`] without the trace; whether the entry was written.
    fn post_entry(
        &self,
        nc: &Nc,
        state: &mut NcState,
        entry: &NotificationEntry,
        owner: Option<&Arc<Claim>>,
    ) -> bool {
        let Some(nq) = state.nq.as_mut() else {
            state.posted.nq_overflows += 1;
            tracing::info!(
                "NC {} has no notification queue; kind {} notification dropped",
                nc.index,
                entry.kind
            );
            return false;
        };
        match nq.post(entry) {
            Ok(()) => {
                state.posted.notifications += 1;
                if let Some(claim) = owner.cloned().or_else(|| self.owner(nc)) {
                    signal(claim);
                }
                true
            }
            Err(PostError::Full { entries }) => {
                state.posted.nq_overflows += 1;
                tracing::warn!(
                    "NC {} notification queue full ({entries} entries unconsumed); notification dropped",
                    nc.index
                );
                false
            }
            Err(e @ PostError::Memory(_)) => {
                state.posted.nq_overflows += 1;
                tracing::error!("NC {}: {}", nc.index, error_chain(&e));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
