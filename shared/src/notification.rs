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

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

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
