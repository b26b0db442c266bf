//! Notifications: building an entry, posting it to an NC's notification queue and signalling
//! the NC's eventfd (a full or absent queue counts a drop), and DeviceLost to every claimed NC.

use std::sync::atomic::Ordering;

use shared::notification::{NotificationEntry, NotificationKind, error_flags};

use crate::counters::bump;
use crate::dma::error_chain;
use crate::notify::PostError;
use crate::trace::{Detail, Event};

use super::{Core, Nc, NcState, lock};

impl Core {
    pub(super) fn device_lost(&self) {
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
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
        let posted = self.post_entry(nc, state, entry);
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
    fn post_entry(&self, nc: &Nc, state: &mut NcState, entry: &NotificationEntry) -> bool {
        let Some(nq) = state.nq.as_mut() else {
            bump(&nc.counters.nq_overflows, 1);
            tracing::info!(
                "NC {} has no notification queue; kind {} notification dropped",
                nc.index,
                entry.kind
            );
            return false;
        };
        match nq.post(entry) {
            Ok(()) => {
                bump(&nc.counters.notifications, 1);
                if let Some(claim) = self.owner(nc) {
                    claim.registers.signal();
                }
                true
            }
            Err(PostError::Full { entries }) => {
                bump(&nc.counters.nq_overflows, 1);
                tracing::warn!(
                    "NC {} notification queue full ({entries} entries unconsumed); notification dropped",
                    nc.index
                );
                false
            }
            Err(e @ PostError::Memory(_)) => {
                bump(&nc.counters.nq_overflows, 1);
                tracing::error!("NC {}: {}", nc.index, error_chain(&e));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
