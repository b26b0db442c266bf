//! The runtime datastore's file layout: an ABI between a runtime process (the writer) and the
//! processes that map its file read-only (`nrt monitor`, `nrt top`), possibly of other versions.
//!
//! One file per runtime instance, `nrt-datastore-<pid>` in the datastore directory:
//!
//! ```text
//! 0                       DatastoreHeader (392 bytes)
//! core_offset             core_count  × CoreRecord      (one per logical core)
//! tpb_offset              tpb_count   × TpbRecord       (one per physical NC, lnc per core)
//! model_offset            model_slot_count × ModelSlotRecord
//! file_size
//! ```
//!
//! Every offset and size is in the header, so a reader of this version checks them before it
//! touches a table, and a later version may grow a record at its end (the reader uses the
//! record size the header names). Every counter is a u64 at an 8-aligned offset, updated by the
//! writer with atomic read-modify-writes and read with atomic loads; the header's fields other
//! than `state` are written once before the file is published (`state` = [`STATE_LIVE`] with a
//! release store, then the file is renamed to its final name).
//!
//! Model slots change identity at load and unload, so their identity fields (`id`, `vnc`,
//! `state`, `name`, `uuid`, `memory_bytes`) are guarded by a single-writer seqlock: `seq` is odd
//! while the writer changes them, and a reader that sees `seq` odd or changed across its copy
//! retries.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The first 8 bytes of every datastore file.
pub const DATASTORE_MAGIC: [u8; 8] = *b"NRTDSTOR";
/// The layout version this module describes.
pub const DATASTORE_VERSION: u32 = 2;
/// The file name's prefix: `nrt-datastore-<pid>` (a second runtime in one process adds
/// `.<n>`).
pub const DATASTORE_FILE_PREFIX: &str = "nrt-datastore-";

/// `state`: the writer is still filling the file.
pub const STATE_INITIALISING: u64 = 0;
/// `state`: the writer runs and updates the counters.
pub const STATE_LIVE: u64 = 1;
/// `state`: the writer closed its runtime (the file is about to be removed).
pub const STATE_CLOSED: u64 = 2;

/// Sub-buckets per power of two of a latency histogram.
pub const HIST_SUB_BUCKETS: u64 = 8;
/// Buckets of a latency histogram (8 exact buckets for 0..8 ns, then 8 per power of two from
/// 2^3 to 2^40 ns).
pub const HIST_BUCKETS: usize = 312;
/// Execution-status slots: the position of the status in `NrtStatus::ALL`, then one "other"
/// slot for codes outside it.
pub const STATUS_SLOTS: usize = crate::NrtStatus::ALL.len() + 1;
/// The "other" status slot.
pub const OTHER_STATUS_SLOT: usize = STATUS_SLOTS - 1;
/// Exec-stat ordinals per TPB (libnrt's `kmetric_update_nds_exec_stats`, 0..=40).
pub const EXEC_STAT_ORDINALS: usize = 41;
/// Infer-error flags counted per TPB (flag indices 5..=8).
pub const ERROR_STATS: usize = 4;
/// Memory kinds (neuron-monitor's `usage_breakdown`: constants, model_code,
/// model_shared_scratchpad, runtime_memory, tensors — in that order).
pub const MEM_KINDS: usize = 5;
/// Physical NCs per logical core at most.
pub const MAX_LNC: usize = 2;
/// Model slots of a datastore.
pub const MODEL_SLOTS: usize = 64;
/// Bytes of a model slot's name (NUL-padded; at most 63 bytes of name).
pub const MODEL_NAME_BYTES: usize = 64;
/// Bytes of the header's runtime version (NUL-padded).
pub const VERSION_BYTES: usize = 32;
/// Bytes of the header's command line (NUL-padded).
pub const COMMAND_BYTES: usize = 256;

/// A model slot never used.
pub const SLOT_FREE: u32 = 0;
/// A model slot holding a loaded model.
pub const SLOT_LOADED: u32 = 1;
/// A model slot keeping an unloaded model's counts until it is reused.
pub const SLOT_UNLOADED: u32 = 2;

/// The status slot of a raw `NRT_STATUS` code: its position in `NrtStatus::ALL`, or
/// [`OTHER_STATUS_SLOT`].
pub fn status_slot(code: u32) -> usize {
    crate::NrtStatus::ALL
        .iter()
        .position(|s| *s as u32 == code)
        .unwrap_or(OTHER_STATUS_SLOT)
}

/// The file's header (offset 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct DatastoreHeader {
    /// [`DATASTORE_MAGIC`].
    pub magic: [u8; 8],
    /// [`DATASTORE_VERSION`].
    pub version: u32,
    /// `size_of::<DatastoreHeader>()` of the writer.
    pub header_size: u32,
    /// The writer's pid.
    pub pid: u32,
    /// NCs per logical core.
    pub lnc: u32,
    /// The writer's start time (`/proc/PID/stat` field 22, clock ticks since boot): a reused
    /// pid has another.
    pub start_time: u64,
    /// When the file was created, ns since the Unix epoch.
    pub created_unix_ns: u64,
    /// [`STATE_INITIALISING`], [`STATE_LIVE`] or [`STATE_CLOSED`] (atomic).
    pub state: u64,
    /// Bytes of the whole file.
    pub file_size: u64,
    /// Logical cores.
    pub core_count: u32,
    /// Bytes of one [`CoreRecord`].
    pub core_record_size: u32,
    /// Offset of the first [`CoreRecord`].
    pub core_offset: u64,
    /// Physical NCs.
    pub tpb_count: u32,
    /// Bytes of one [`TpbRecord`].
    pub tpb_record_size: u32,
    /// Offset of the first [`TpbRecord`].
    pub tpb_offset: u64,
    /// Model slots.
    pub model_slot_count: u32,
    /// Bytes of one [`ModelSlotRecord`].
    pub model_slot_size: u32,
    /// Offset of the first [`ModelSlotRecord`].
    pub model_offset: u64,
    /// The runtime's version string, NUL-padded.
    pub runtime_version: [u8; VERSION_BYTES],
    /// The writer's command line (arguments joined by spaces), NUL-padded.
    pub command: [u8; COMMAND_BYTES],
}

/// A latency histogram: [`HIST_BUCKETS`] log-linear buckets of nanoseconds plus exact count,
/// sum, minimum (`u64::MAX` while empty) and maximum.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct HistogramRecord {
    /// Samples.
    pub count: u64,
    /// Sum of the samples, ns.
    pub sum_ns: u64,
    /// Smallest sample, ns.
    pub min_ns: u64,
    /// Largest sample, ns.
    pub max_ns: u64,
    /// Samples per bucket.
    pub buckets: [u64; HIST_BUCKETS],
}

/// libnrt's per-NC latency counters in µs (count, total, max, last).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct LatencyRecord {
    /// Samples.
    pub count: u64,
    /// Sum, µs.
    pub total_us: u64,
    /// Largest, µs.
    pub max_us: u64,
    /// Last, µs.
    pub last_us: u64,
}

/// One logical core.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct CoreRecord {
    /// The process's logical core index.
    pub vnc: u32,
    /// The device's logical core index (first physical NC / lnc).
    pub logical_id: u32,
    /// Physical NCs of the core (1..=[`MAX_LNC`]).
    pub nc_count: u32,
    /// Index of its first [`TpbRecord`].
    pub first_tpb: u32,
    /// Its physical NCs (the first `nc_count`).
    pub ncs: [u32; MAX_LNC],
    /// Executions by status slot ([`status_slot`]), once per execution.
    pub executions: [u64; STATUS_SLOTS],
    /// End-to-end latency (submit to completion, host clock).
    pub total_latency: HistogramRecord,
    /// Device latency (the slower TPB).
    pub device_latency: HistogramRecord,
    /// Device bytes by memory kind.
    pub memory: [u64; MEM_KINDS],
}

/// One physical NC (TPB): the seed's per-TPB counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct TpbRecord {
    /// Global physical NC index.
    pub nc: u32,
    /// The logical core it belongs to.
    pub vnc: u32,
    /// Executions by exec-stat ordinal.
    pub exec_stats: [u64; EXEC_STAT_ORDINALS],
    /// Errors by infer-error flag index 5..=8 (at `index - 5`).
    pub error_stats: [u64; ERROR_STATS],
    /// Sum of NC busy time, ns.
    pub busy_ns: u64,
    /// End-to-end latency, µs (libnrt's counters).
    pub e2e: LatencyRecord,
    /// Device latency, µs.
    pub device: LatencyRecord,
    /// NC busy latency, µs.
    pub nc_busy: LatencyRecord,
    /// NC busy time per execution, ns.
    pub nc_latency: HistogramRecord,
}

/// One model slot. `seq`, `id`, `vnc`, `state`, `memory_bytes`, `generation`, `name` and `uuid`
/// change under the seqlock; the counters are reset (inside it) when the slot is reassigned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ModelSlotRecord {
    /// Seqlock word: odd while the writer changes the slot's identity.
    pub seq: u64,
    /// The model handle's id.
    pub id: u64,
    /// The logical core it is loaded on.
    pub vnc: u32,
    /// [`SLOT_FREE`], [`SLOT_LOADED`] or [`SLOT_UNLOADED`].
    pub state: u32,
    /// Device bytes it holds (0 once unloaded).
    pub memory_bytes: u64,
    /// The writer's order of the slot's last change (a reused slot is the unloaded one with the
    /// smallest).
    pub generation: u64,
    /// The model's name, NUL-padded.
    pub name: [u8; MODEL_NAME_BYTES],
    /// The NEFF header's uuid (zero for a model that has none: a simdev model container).
    pub uuid: [u8; 16],
    /// Executions by status slot.
    pub executions: [u64; STATUS_SLOTS],
    /// End-to-end latency.
    pub total_latency: HistogramRecord,
}

const _: () = assert!(size_of::<DatastoreHeader>() == 392);
const _: () = assert!(size_of::<HistogramRecord>() == 2528);
const _: () = assert!(size_of::<LatencyRecord>() == 32);
const _: () = assert!(size_of::<CoreRecord>() == 5352);
const _: () = assert!(size_of::<TpbRecord>() == 3000);
const _: () = assert!(size_of::<ModelSlotRecord>() == 2880);
const _: () = assert!(STATUS_SLOTS == 29);

/// The offsets of a file of `cores` logical cores, `tpbs` physical NCs and [`MODEL_SLOTS`] model
/// slots: (core_offset, tpb_offset, model_offset, file_size).
pub const fn layout_of(cores: usize, tpbs: usize) -> (usize, usize, usize, usize) {
    let core_offset = size_of::<DatastoreHeader>();
    let tpb_offset = core_offset + cores * size_of::<CoreRecord>();
    let model_offset = tpb_offset + tpbs * size_of::<TpbRecord>();
    let file_size = model_offset + MODEL_SLOTS * size_of::<ModelSlotRecord>();
    (core_offset, tpb_offset, model_offset, file_size)
}

/// Offsets of [`ModelSlotRecord`]'s fields, and of the other records' counters, for the
/// writer's atomics.
pub mod offsets {
    use super::DatastoreHeader;
    use super::{CoreRecord, HistogramRecord, LatencyRecord, ModelSlotRecord, TpbRecord};
    use std::mem::offset_of;

    /// [`DatastoreHeader::state`].
    pub const HEADER_STATE: usize = offset_of!(DatastoreHeader, state);
    /// [`CoreRecord::executions`].
    pub const CORE_EXECUTIONS: usize = offset_of!(CoreRecord, executions);
    /// [`CoreRecord::total_latency`].
    pub const CORE_TOTAL_LATENCY: usize = offset_of!(CoreRecord, total_latency);
    /// [`CoreRecord::device_latency`].
    pub const CORE_DEVICE_LATENCY: usize = offset_of!(CoreRecord, device_latency);
    /// [`CoreRecord::memory`].
    pub const CORE_MEMORY: usize = offset_of!(CoreRecord, memory);
    /// [`TpbRecord::exec_stats`].
    pub const TPB_EXEC_STATS: usize = offset_of!(TpbRecord, exec_stats);
    /// [`TpbRecord::error_stats`].
    pub const TPB_ERROR_STATS: usize = offset_of!(TpbRecord, error_stats);
    /// [`TpbRecord::busy_ns`].
    pub const TPB_BUSY_NS: usize = offset_of!(TpbRecord, busy_ns);
    /// [`TpbRecord::e2e`].
    pub const TPB_E2E: usize = offset_of!(TpbRecord, e2e);
    /// [`TpbRecord::device`].
    pub const TPB_DEVICE: usize = offset_of!(TpbRecord, device);
    /// [`TpbRecord::nc_busy`].
    pub const TPB_NC_BUSY: usize = offset_of!(TpbRecord, nc_busy);
    /// [`TpbRecord::nc_latency`].
    pub const TPB_NC_LATENCY: usize = offset_of!(TpbRecord, nc_latency);
    /// [`ModelSlotRecord::seq`].
    pub const SLOT_SEQ: usize = offset_of!(ModelSlotRecord, seq);
    /// [`ModelSlotRecord::executions`].
    pub const SLOT_EXECUTIONS: usize = offset_of!(ModelSlotRecord, executions);
    /// [`ModelSlotRecord::total_latency`].
    pub const SLOT_TOTAL_LATENCY: usize = offset_of!(ModelSlotRecord, total_latency);
    /// [`HistogramRecord::count`].
    pub const HIST_COUNT: usize = offset_of!(HistogramRecord, count);
    /// [`HistogramRecord::sum_ns`].
    pub const HIST_SUM: usize = offset_of!(HistogramRecord, sum_ns);
    /// [`HistogramRecord::min_ns`].
    pub const HIST_MIN: usize = offset_of!(HistogramRecord, min_ns);
    /// [`HistogramRecord::max_ns`].
    pub const HIST_MAX: usize = offset_of!(HistogramRecord, max_ns);
    /// [`HistogramRecord::buckets`].
    pub const HIST_BUCKETS: usize = offset_of!(HistogramRecord, buckets);
    /// [`LatencyRecord::count`].
    pub const LAT_COUNT: usize = offset_of!(LatencyRecord, count);
    /// [`LatencyRecord::total_us`].
    pub const LAT_TOTAL: usize = offset_of!(LatencyRecord, total_us);
    /// [`LatencyRecord::max_us`].
    pub const LAT_MAX: usize = offset_of!(LatencyRecord, max_us);
    /// [`LatencyRecord::last_us`].
    pub const LAT_LAST: usize = offset_of!(LatencyRecord, last_us);
}

/// Copies `s` into a NUL-padded array, truncated to leave at least one NUL (at a UTF-8
/// character boundary).
pub fn padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut end = s.len().min(N.saturating_sub(1));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

/// The string of a NUL-padded array (up to its first NUL; invalid UTF-8 replaced).
pub fn unpadded(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;
    use zerocopy::FromZeros;

    #[test]
    fn header_layout() {
        assert_eq!(offset_of!(DatastoreHeader, magic), 0);
        assert_eq!(offset_of!(DatastoreHeader, version), 8);
        assert_eq!(offset_of!(DatastoreHeader, header_size), 12);
        assert_eq!(offset_of!(DatastoreHeader, pid), 16);
        assert_eq!(offset_of!(DatastoreHeader, lnc), 20);
        assert_eq!(offset_of!(DatastoreHeader, start_time), 24);
        assert_eq!(offset_of!(DatastoreHeader, created_unix_ns), 32);
        assert_eq!(offset_of!(DatastoreHeader, state), 40);
        assert_eq!(offset_of!(DatastoreHeader, file_size), 48);
        assert_eq!(offset_of!(DatastoreHeader, core_count), 56);
        assert_eq!(offset_of!(DatastoreHeader, core_record_size), 60);
        assert_eq!(offset_of!(DatastoreHeader, core_offset), 64);
        assert_eq!(offset_of!(DatastoreHeader, tpb_count), 72);
        assert_eq!(offset_of!(DatastoreHeader, tpb_record_size), 76);
        assert_eq!(offset_of!(DatastoreHeader, tpb_offset), 80);
        assert_eq!(offset_of!(DatastoreHeader, model_slot_count), 88);
        assert_eq!(offset_of!(DatastoreHeader, model_slot_size), 92);
        assert_eq!(offset_of!(DatastoreHeader, model_offset), 96);
        assert_eq!(offset_of!(DatastoreHeader, runtime_version), 104);
        assert_eq!(offset_of!(DatastoreHeader, command), 136);
    }

    #[test]
    fn record_layouts() {
        assert_eq!(offset_of!(HistogramRecord, count), 0);
        assert_eq!(offset_of!(HistogramRecord, sum_ns), 8);
        assert_eq!(offset_of!(HistogramRecord, min_ns), 16);
        assert_eq!(offset_of!(HistogramRecord, max_ns), 24);
        assert_eq!(offset_of!(HistogramRecord, buckets), 32);
        assert_eq!(offset_of!(LatencyRecord, count), 0);
        assert_eq!(offset_of!(LatencyRecord, total_us), 8);
        assert_eq!(offset_of!(LatencyRecord, max_us), 16);
        assert_eq!(offset_of!(LatencyRecord, last_us), 24);
        assert_eq!(offset_of!(CoreRecord, vnc), 0);
        assert_eq!(offset_of!(CoreRecord, logical_id), 4);
        assert_eq!(offset_of!(CoreRecord, nc_count), 8);
        assert_eq!(offset_of!(CoreRecord, first_tpb), 12);
        assert_eq!(offset_of!(CoreRecord, ncs), 16);
        assert_eq!(offset_of!(CoreRecord, executions), 24);
        assert_eq!(offset_of!(CoreRecord, total_latency), 256);
        assert_eq!(offset_of!(CoreRecord, device_latency), 2784);
        assert_eq!(offset_of!(CoreRecord, memory), 5312);
        assert_eq!(offset_of!(TpbRecord, nc), 0);
        assert_eq!(offset_of!(TpbRecord, vnc), 4);
        assert_eq!(offset_of!(TpbRecord, exec_stats), 8);
        assert_eq!(offset_of!(TpbRecord, error_stats), 336);
        assert_eq!(offset_of!(TpbRecord, busy_ns), 368);
        assert_eq!(offset_of!(TpbRecord, e2e), 376);
        assert_eq!(offset_of!(TpbRecord, device), 408);
        assert_eq!(offset_of!(TpbRecord, nc_busy), 440);
        assert_eq!(offset_of!(TpbRecord, nc_latency), 472);
        assert_eq!(offset_of!(ModelSlotRecord, seq), 0);
        assert_eq!(offset_of!(ModelSlotRecord, id), 8);
        assert_eq!(offset_of!(ModelSlotRecord, vnc), 16);
        assert_eq!(offset_of!(ModelSlotRecord, state), 20);
        assert_eq!(offset_of!(ModelSlotRecord, memory_bytes), 24);
        assert_eq!(offset_of!(ModelSlotRecord, generation), 32);
        assert_eq!(offset_of!(ModelSlotRecord, name), 40);
        assert_eq!(offset_of!(ModelSlotRecord, uuid), 104);
        assert_eq!(offset_of!(ModelSlotRecord, executions), 120);
        assert_eq!(offset_of!(ModelSlotRecord, total_latency), 352);
        // Every counter is 8-aligned.
        for off in [
            offsets::CORE_EXECUTIONS,
            offsets::CORE_TOTAL_LATENCY,
            offsets::CORE_MEMORY,
            offsets::TPB_EXEC_STATS,
            offsets::TPB_ERROR_STATS,
            offsets::TPB_NC_LATENCY,
            offsets::SLOT_EXECUTIONS,
            offsets::SLOT_TOTAL_LATENCY,
        ] {
            assert_eq!(off % 8, 0);
        }
        let (c, t, m, end) = layout_of(2, 4);
        assert_eq!((c, t, m), (392, 392 + 2 * 5352, 392 + 2 * 5352 + 4 * 3000));
        assert_eq!(end, m + MODEL_SLOTS * 2880);
        assert_eq!(end % 8, 0);
    }

    #[test]
    fn header_golden_bytes() {
        let h = DatastoreHeader {
            magic: DATASTORE_MAGIC,
            version: DATASTORE_VERSION,
            header_size: 392,
            pid: 0x1234,
            lnc: 2,
            start_time: 0x0102_0304_0506_0708,
            created_unix_ns: 9,
            state: STATE_LIVE,
            file_size: 0x10_0000,
            core_count: 3,
            core_record_size: 5352,
            core_offset: 392,
            tpb_count: 6,
            tpb_record_size: 3000,
            tpb_offset: 0x4000,
            model_slot_count: 64,
            model_slot_size: 2880,
            model_offset: 0x8000,
            runtime_version: padded("0.1.0"),
            command: padded("nrt bench"),
        };
        let b = h.as_bytes();
        assert_eq!(&b[0..8], b"NRTDSTOR");
        assert_eq!(
            &b[8..24],
            &[2, 0, 0, 0, 0x88, 1, 0, 0, 0x34, 0x12, 0, 0, 2, 0, 0, 0]
        );
        assert_eq!(&b[24..32], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(
            &b[32..48],
            &[9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&b[48..56], &[0, 0, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(&b[56..64], &[3, 0, 0, 0, 0xE8, 0x14, 0, 0]);
        assert_eq!(&b[64..72], &[0x88, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[72..80], &[6, 0, 0, 0, 0xB8, 0x0B, 0, 0]);
        assert_eq!(&b[80..88], &[0, 0x40, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[88..96], &[64, 0, 0, 0, 0x40, 0x0B, 0, 0]);
        assert_eq!(&b[96..104], &[0, 0x80, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[104..110], b"0.1.0\0");
        assert!(b[110..136].iter().all(|&x| x == 0));
        assert_eq!(&b[136..146], b"nrt bench\0");
        assert!(b[146..392].iter().all(|&x| x == 0));
    }

    #[test]
    fn record_golden_bytes() {
        let mut slot = ModelSlotRecord::new_zeroed();
        slot.seq = 2;
        slot.id = 7;
        slot.vnc = 1;
        slot.state = SLOT_LOADED;
        slot.memory_bytes = 0x100;
        slot.generation = 3;
        slot.name = padded("mlp");
        slot.uuid = [
            0x25, 0xE0, 0x9F, 0xD2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
        ];
        slot.executions[status_slot(0)] = 5;
        slot.executions[OTHER_STATUS_SLOT] = 1;
        slot.total_latency.count = 6;
        slot.total_latency.buckets[HIST_BUCKETS - 1] = 0xAA;
        let b = slot.as_bytes();
        assert_eq!(&b[0..16], &[2, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..24], &[1, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(
            &b[24..40],
            &[0, 1, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&b[40..44], b"mlp\0");
        assert_eq!(&b[104..108], &[0x25, 0xE0, 0x9F, 0xD2]);
        assert_eq!(b[119], 0x01);
        assert_eq!(&b[120..128], &[5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[120 + 28 * 8..120 + 29 * 8], &[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[352..360], &[6, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[2872..2880], &[0xAA, 0, 0, 0, 0, 0, 0, 0]);

        let mut core = CoreRecord::new_zeroed();
        core.vnc = 1;
        core.logical_id = 4;
        core.nc_count = 2;
        core.first_tpb = 2;
        core.ncs = [8, 9];
        core.memory[4] = 0x1000;
        let b = core.as_bytes();
        assert_eq!(
            &b[0..24],
            &[
                1, 0, 0, 0, 4, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 0
            ]
        );
        assert_eq!(&b[5344..5352], &[0, 0x10, 0, 0, 0, 0, 0, 0]);

        let mut tpb = TpbRecord::new_zeroed();
        tpb.nc = 3;
        tpb.vnc = 1;
        tpb.exec_stats[1] = 2;
        tpb.error_stats[3] = 4;
        tpb.busy_ns = 5;
        tpb.nc_busy.last_us = 6;
        let b = tpb.as_bytes();
        assert_eq!(&b[0..8], &[3, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[16..24], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            &b[360..376],
            &[4, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(&b[464..472], &[6, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn status_slots_follow_the_status_list() {
        assert_eq!(status_slot(0), 0);
        assert_eq!(status_slot(crate::NrtStatus::ALL[27] as u32), 27);
        assert_eq!(status_slot(0xDEAD), OTHER_STATUS_SLOT);
    }

    #[test]
    fn padding_truncates_at_a_char_boundary_and_keeps_a_nul() {
        let p: [u8; 4] = padded("abcdef");
        assert_eq!(&p, b"abc\0");
        let p: [u8; 4] = padded("aé"); // 'é' is 2 bytes: fits in 3
        assert_eq!(unpadded(&p), "aé");
        let p: [u8; 3] = padded("aé");
        assert_eq!(unpadded(&p), "a");
    }
}
