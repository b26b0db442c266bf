//! The notification queue writer: how simdev posts entries into an NC's NQ.
//!
//! The ring layout is simulator-defined in [`shared::notification`]: a header with the
//! consumer's `head` and simdev's `tail`, then `entries` 32-byte slots. Entry `n` goes to slot
//! `n % entries` with phase [`phase_of`]`(n / entries)`. The body is written first, then the
//! phase word with release ordering (the consumer acquires the phase before reading the body),
//! then `tail`. A ring whose consumer lags a whole ring behind is full: the entry is dropped
//! and counted as an overflow, never written over an unconsumed one.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use shared::memory::MemError;
use shared::notification::{
    NOTIFICATION_ENTRY_SIZE, NOTIFICATION_PHASE_OFFSET, NQ_HEAD_OFFSET, NQ_HEADER_SIZE,
    NQ_TAIL_OFFSET, NotificationEntry, phase_of,
};
use thiserror::Error;
use zerocopy::IntoBytes;

use crate::memory::Chunk;

/// A notification that was not written.
#[derive(Debug, Error)]
pub enum PostError {
    /// The consumer has not freed a slot: `tail - head == entries`.
    #[error("notification queue full ({entries} entries unconsumed)")]
    Full {
        /// Ring size in entries.
        entries: u32,
    },
    /// The NQ chunk refused an access (a simdev bug: the chunk was sized for the ring).
    #[error("writing the notification queue")]
    Memory(#[source] MemError),
}

/// One NC's notification queue, as the device writes it.
#[derive(Debug)]
pub struct NotificationQueue {
    chunk: Arc<Chunk>,
    entries: u32,
    produced: u64,
}

/// The low 32 bits of `v`: the ring's `tail` and `head` are u32 counters that wrap at 2^32.
#[expect(
    clippy::cast_possible_truncation,
    reason = "wrapping to 32 bits is the NQ counter rule"
)]
const fn wrap_u32(v: u64) -> u32 {
    v as u32
}

impl NotificationQueue {
    /// A queue of `entries` slots in `chunk` (zeroed, at least
    /// [`shared::notification::nq_bytes`]`(entries)` bytes; `entries` a power of two).
    pub const fn new(chunk: Arc<Chunk>, entries: u32) -> Self {
        Self {
            chunk,
            entries,
            produced: 0,
        }
    }

    /// The chunk holding the ring.
    pub const fn chunk(&self) -> &Arc<Chunk> {
        &self.chunk
    }

    /// Ring size in entries.
    pub const fn entries(&self) -> u32 {
        self.entries
    }

    /// Entries written so far.
    pub const fn produced(&self) -> u64 {
        self.produced
    }

    /// Writes `entry` as the next notification (its `phase` field is replaced by the pass's
    /// phase).
    ///
    /// # Errors
    /// [`PostError::Full`] when the consumer's head is a whole ring behind; nothing is written.
    pub fn post(&mut self, entry: &NotificationEntry) -> Result<(), PostError> {
        let memory = self.chunk.memory();
        let base = self.chunk.pa();
        let head = memory
            .load_u32(base + NQ_HEAD_OFFSET as u64, Ordering::Acquire)
            .map_err(PostError::Memory)?;
        let n = self.produced;
        if wrap_u32(n).wrapping_sub(head) >= self.entries {
            return Err(PostError::Full {
                entries: self.entries,
            });
        }
        let slot = n % u64::from(self.entries);
        let slot_pa = base + NQ_HEADER_SIZE as u64 + slot * NOTIFICATION_ENTRY_SIZE as u64;
        let bytes = entry.as_bytes();
        let phase_at = NOTIFICATION_PHASE_OFFSET;
        let phase_end = phase_at + 4;
        memory
            .write(slot_pa, &bytes[..phase_at])
            .and_then(|()| memory.write(slot_pa + phase_end as u64, &bytes[phase_end..]))
            .and_then(|()| {
                let phase = phase_of(n / u64::from(self.entries));
                memory.store_u32(slot_pa + phase_at as u64, phase, Ordering::Release)
            })
            .and_then(|()| {
                memory.store_u32(
                    base + NQ_TAIL_OFFSET as u64,
                    wrap_u32(n + 1),
                    Ordering::Release,
                )
            })
            .map_err(PostError::Memory)?;
        self.produced = n + 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientId;
    use crate::memory::{AddressSpace, Region};
    use shared::address_map::{AddressMap, Arch};
    use shared::notification::{NotificationKind, NqCursor, nq_bytes};

    fn queue(entries: u32) -> NotificationQueue {
        let mut space = AddressSpace::new(AddressMap {
            arch: Arch::Trn1,
            nc_count: 1,
            hbm_bytes_per_nc: 1 << 20,
        });
        let size = u64::try_from(nq_bytes(entries)).unwrap();
        let chunk = space.allocate(ClientId(1), Region::Host, size, 0).unwrap();
        NotificationQueue::new(chunk, entries)
    }

    fn entry(compute_idx: u32) -> NotificationEntry {
        NotificationEntry {
            compute_idx,
            kind: NotificationKind::Execution as u16,
            ..NotificationEntry::default()
        }
    }

    fn slot(q: &NotificationQueue, slot: u64) -> NotificationEntry {
        let pa = q.chunk.pa() + NQ_HEADER_SIZE as u64 + slot * NOTIFICATION_ENTRY_SIZE as u64;
        q.chunk.memory().read_obj(pa).unwrap()
    }

    #[test]
    fn the_phase_alternates_per_pass_and_the_tail_counts_entries() {
        let mut q = queue(2);
        let head = q.chunk.pa() + NQ_HEAD_OFFSET as u64;
        let tail = q.chunk.pa() + NQ_TAIL_OFFSET as u64;
        for n in 0..6u32 {
            q.post(&entry(n)).unwrap();
            // The consumer keeps up.
            q.chunk
                .memory()
                .store_u32(head, n + 1, Ordering::Release)
                .unwrap();
        }
        let memory = q.chunk.memory();
        assert_eq!(memory.load_u32(tail, Ordering::Acquire).unwrap(), 6);
        // Entries 4 and 5 are pass 2: phase 1 again.
        assert_eq!(slot(&q, 0).compute_idx, 4);
        assert_eq!(slot(&q, 0).phase, 1);
        assert_eq!(slot(&q, 1).compute_idx, 5);
        assert_eq!(slot(&q, 1).phase, 1);
    }

    #[test]
    fn a_full_ring_drops_entries_until_the_head_moves() {
        let mut q = queue(4);
        for n in 0..4 {
            q.post(&entry(n)).unwrap();
        }
        assert!(matches!(
            q.post(&entry(4)),
            Err(PostError::Full { entries: 4 })
        ));
        assert_eq!(slot(&q, 0).compute_idx, 0, "slot 0 was not overwritten");
        assert_eq!(slot(&q, 0).phase, 1);
        let head = q.chunk.pa() + NQ_HEAD_OFFSET as u64;
        q.chunk
            .memory()
            .store_u32(head, 1, Ordering::Release)
            .unwrap();
        q.post(&entry(5)).unwrap();
        assert_eq!(slot(&q, 0).compute_idx, 5);
        assert_eq!(slot(&q, 0).phase, 2, "pass 1 carries phase 2");
    }

    #[test]
    fn the_shared_cursor_reads_what_simdev_writes_across_wraps() {
        let mut q = queue(4);
        let mut cursor = NqCursor::new(q.chunk.pa(), 4);
        for n in 0..10 {
            // Without the cursor publishing its head, the fifth post would find the ring full.
            q.post(&entry(n)).unwrap();
            let got = cursor.try_next(q.chunk.memory()).unwrap();
            assert_eq!(got.map(|e| e.compute_idx), Some(n));
            assert_eq!(cursor.try_next(q.chunk.memory()).unwrap(), None);
        }
    }
}
