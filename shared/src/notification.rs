//! The notification queue (NQ) as simdev writes it. **Simulator-defined**: the driver programs
//! only a ring's placement and size, and the bytes hardware writes into it are not public
//! (`reference/driver-abi.md` §3). What is taken from the driver is the shape: a ring in
//! host-visible memory written by the device, polled by the runtime (no interrupt on silicon),
//! with a phase/valid marker that changes on every wrap and a consumer-owned head.
//!
//! Layout of an NQ chunk: a [`NQ_HEADER_SIZE`]-byte header — `head` (u32 at +0x00, written by the
//! consumer: entries consumed, monotone, wrapping at 2^32) and `tail` (u32 at +0x40, written by
//! simdev after each entry: entries produced) on separate cache lines — then `entries`
//! 32-byte [`NotificationEntry`] slots. Entry `n` (0-based, monotone) lives in slot
//! `n % entries` and carries phase [`phase_of`]`(n / entries)`: 1 on pass 0, 2 on pass 1, then
//! alternating, so a zeroed ring holds no valid entry. simdev writes the body, then the phase word
//! with release ordering; the reader loads the phase with acquire ordering before the body.
//! When `tail - head == entries` the ring is full and simdev drops the entry and counts an
//! overflow (reported as NRT_EXEC_SW_NQ_OVERFLOW by the runtime).

use std::sync::atomic::Ordering;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::memory::{MemError, SharedChunk};

/// Bytes of the NQ header before the first entry.
pub const NQ_HEADER_SIZE: usize = 128;
/// Offset of the consumer-written `head` (u32) in the NQ chunk.
pub const NQ_HEAD_OFFSET: usize = 0x00;
/// Offset of the device-written `tail` (u32) in the NQ chunk.
pub const NQ_TAIL_OFFSET: usize = 0x40;
/// Bytes per notification entry.
pub const NOTIFICATION_ENTRY_SIZE: usize = 32;
/// Offset of the phase word in an entry.
pub const NOTIFICATION_PHASE_OFFSET: usize = 12;
/// Largest ring simdev accepts, in entries.
pub const NQ_MAX_ENTRIES: u32 = 1 << 16;

/// The phase marker of ring pass `pass`: 1, 2, 1, 2, … (never 0, the value of a zeroed slot).
pub const fn phase_of(pass: u64) -> u32 {
    1 + (pass & 1) as u32
}

/// Bytes of an NQ chunk holding `entries` entries (before 4 KiB rounding).
pub const fn nq_bytes(entries: u32) -> usize {
    NQ_HEADER_SIZE + entries as usize * NOTIFICATION_ENTRY_SIZE
}

/// What a notification reports (`kind` field).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotificationKind {
    /// An execution ended (successfully or not); `compute_idx` names it.
    Execution = 1,
    /// A DMA queue stopped on a bad descriptor; `source` names the queue.
    DmaQueueError = 2,
    /// The device is going away (simdev shutting down): all in-flight work is lost.
    DeviceLost = 3,
}

impl NotificationKind {
    /// Decodes the `kind` field.
    pub const fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::Execution),
            2 => Some(Self::DmaQueueError),
            3 => Some(Self::DeviceLost),
            _ => None,
        }
    }
}

/// Error flags of a notification (`error_flags` bits). Zero means success.
pub mod error_flags {
    /// NaN/Inf produced (NRT_EXEC_COMPLETED_WITH_NUM_ERR, 1003).
    pub const NUMERICAL: u32 = 1 << 0;
    /// Other execution error (NRT_EXEC_COMPLETED_WITH_ERR, 1004).
    pub const GENERIC: u32 = 1 << 1;
    /// Out-of-bounds access (NRT_EXEC_OOB, 1006).
    pub const OOB: u32 = 1 << 2;
    /// Unrepairable uncorrectable HBM error (1201).
    pub const HBM_UE: u32 = 1 << 3;
    /// NC on-chip memory parity error (1202).
    pub const NC_UE: u32 = 1 << 4;
    /// DMA engine abort (1203).
    pub const DMA_ABORT: u32 = 1 << 5;
    /// Repairable uncorrectable HBM error (1205).
    pub const HBM_UE_REPAIRABLE: u32 = 1 << 6;
    /// The device was lost.
    pub const DEVICE_LOST: u32 = 1 << 7;
}

/// One 32-byte notification entry (simulator-defined, see the module doc).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct NotificationEntry {
    /// The execution's compute index (from the staged request); 0 for non-execution entries.
    pub compute_idx: u32,
    /// A [`NotificationKind`] value.
    pub kind: u16,
    /// For DMA queue errors: `engine << 8 | queue`; otherwise 0.
    pub source: u16,
    /// [`error_flags`] bits; 0 = success.
    pub error_flags: u32,
    /// Phase/valid marker ([`phase_of`] the pass), written last.
    pub phase: u32,
    /// Device timestamp in simulated ns when the entry was written.
    pub device_ts_ns: u64,
    /// NC busy time in simulated ns attributed to this entry (execution duration).
    pub nc_ts_ns: u64,
}

const _: () = assert!(std::mem::size_of::<NotificationEntry>() == NOTIFICATION_ENTRY_SIZE);

/// The consumer's cursor over one notification queue: the runtime's completion engine and the
/// tests read every NQ through it.
///
/// Entry `head` is in slot `head % entries`; it has been written when its phase word equals
/// [`phase_of`]`(head / entries)` (loaded with acquire ordering, before the body). After
/// reading it the cursor publishes the new `head` (its low 32 bits, with release ordering) so
/// the device may reuse the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NqCursor {
    /// PA of the NQ chunk (its header).
    pa: u64,
    /// Slots in the ring.
    entries: u32,
    /// Entries consumed so far (monotone).
    head: u64,
}

impl NqCursor {
    /// A cursor at entry 0 of the queue whose chunk starts at `pa` and holds `entries` slots.
    /// A queue of 0 entries never yields one.
    pub const fn new(pa: u64, entries: u32) -> Self {
        Self {
            pa,
            entries,
            head: 0,
        }
    }

    /// Entries consumed so far.
    pub const fn head(&self) -> u64 {
        self.head
    }

    /// The next entry, if the device has written it (`Ok(None)` otherwise), read from
    /// `memory` (the queue's mapping); the new head is published before it is returned.
    ///
    /// # Errors
    /// The accessor's error when the queue is not inside `memory`; the cursor does not move.
    pub fn try_next(
        &mut self,
        memory: &SharedChunk,
    ) -> Result<Option<NotificationEntry>, MemError> {
        if self.entries == 0 {
            return Ok(None);
        }
        let entries = u64::from(self.entries);
        let base = self.pa
            + NQ_HEADER_SIZE as u64
            + (self.head % entries) * NOTIFICATION_ENTRY_SIZE as u64;
        let phase = memory.load_u32(base + NOTIFICATION_PHASE_OFFSET as u64, Ordering::Acquire)?;
        if phase != phase_of(self.head / entries) {
            return Ok(None);
        }
        let entry = memory.read_obj(base)?;
        let next = self.head + 1;
        let published = u32::try_from(next & 0xFFFF_FFFF).unwrap_or(u32::MAX);
        memory.store_u32(
            self.pa + NQ_HEAD_OFFSET as u64,
            published,
            Ordering::Release,
        )?;
        self.head = next;
        Ok(Some(entry))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// A ring of `entries` slots at PA 0x1000 in a fresh file mapping.
    fn ring(entries: u32) -> (std::fs::File, SharedChunk) {
        let file = tempfile::tempfile().unwrap();
        let len = nq_bytes(entries);
        file.set_len(len as u64).unwrap();
        let memory = SharedChunk::map_fd(&file, 0x1000, len, true).unwrap();
        (file, memory)
    }

    /// Writes entry `n` as the device does: body, then its phase (release).
    fn post(memory: &SharedChunk, entries: u32, n: u64) {
        let slot = n % u64::from(entries);
        let base = 0x1000 + NQ_HEADER_SIZE as u64 + slot * NOTIFICATION_ENTRY_SIZE as u64;
        let entry = NotificationEntry {
            compute_idx: u32::try_from(n).unwrap(),
            ..NotificationEntry::default()
        };
        memory.write_obj(base, &entry).unwrap();
        let phase = phase_of(n / u64::from(entries));
        memory
            .store_u32(
                base + NOTIFICATION_PHASE_OFFSET as u64,
                phase,
                Ordering::Release,
            )
            .unwrap();
    }

    #[test]
    fn the_cursor_wraps_and_publishes_its_head() {
        let entries = 4;
        let (_file, memory) = ring(entries);
        let mut cursor = NqCursor::new(0x1000, entries);
        assert_eq!(
            cursor.try_next(&memory).unwrap(),
            None,
            "a zeroed ring holds nothing"
        );
        for n in 0..3 * u64::from(entries) {
            post(&memory, entries, n);
            let entry = cursor.try_next(&memory).unwrap().expect("posted");
            assert_eq!(u64::from(entry.compute_idx), n, "in order across passes");
            assert_eq!(cursor.head(), n + 1);
            let head = memory
                .load_u32(0x1000 + NQ_HEAD_OFFSET as u64, Ordering::Acquire)
                .unwrap();
            assert_eq!(u64::from(head), n + 1, "the head is published");
            assert_eq!(
                cursor.try_next(&memory).unwrap(),
                None,
                "the last pass's slot is stale"
            );
        }
    }

    #[test]
    fn a_cursor_outside_its_memory_errs_without_moving() {
        let (_file, memory) = ring(4);
        let mut cursor = NqCursor::new(0x9000, 4);
        assert!(cursor.try_next(&memory).is_err());
        assert_eq!(cursor.head(), 0);
        let mut empty = NqCursor::new(0x1000, 0);
        assert_eq!(empty.try_next(&memory).unwrap(), None);
    }

    #[test]
    fn layout() {
        assert_eq!(offset_of!(NotificationEntry, compute_idx), 0);
        assert_eq!(offset_of!(NotificationEntry, kind), 4);
        assert_eq!(offset_of!(NotificationEntry, source), 6);
        assert_eq!(offset_of!(NotificationEntry, error_flags), 8);
        assert_eq!(
            offset_of!(NotificationEntry, phase),
            NOTIFICATION_PHASE_OFFSET
        );
        assert_eq!(offset_of!(NotificationEntry, device_ts_ns), 16);
        assert_eq!(offset_of!(NotificationEntry, nc_ts_ns), 24);
        assert_eq!(
            NQ_TAIL_OFFSET - NQ_HEAD_OFFSET,
            64,
            "head and tail on separate lines"
        );
    }

    #[test]
    fn golden_bytes() {
        let e = NotificationEntry {
            compute_idx: 7,
            kind: NotificationKind::DmaQueueError as u16,
            source: 0x0203,
            error_flags: error_flags::DMA_ABORT,
            phase: phase_of(0),
            device_ts_ns: 0x100,
            nc_ts_ns: 0x20,
        };
        #[rustfmt::skip]
        assert_eq!(e.as_bytes(), [
            7, 0, 0, 0,  2, 0,  0x03, 0x02,  0x20, 0, 0, 0,  1, 0, 0, 0,
            0x00, 0x01, 0, 0, 0, 0, 0, 0,
            0x20, 0, 0, 0, 0, 0, 0, 0,
        ]);
    }

    #[test]
    fn phase_alternates_and_is_never_zero() {
        assert_eq!([0, 1, 2, 3].map(phase_of), [1, 2, 1, 2]);
        assert_eq!(nq_bytes(4), 128 + 4 * 32);
    }
}
