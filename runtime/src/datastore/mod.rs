//! The runtime datastore: each runtime process's counters in a small shared-memory file that
//! other processes (`nrt monitor`, `nrt top`) map read-only — the counterpart of libnrt's
//! Neuron DataStore (`nrt/nds/neuron_ds.h`).
//!
//! [`snapshot`] holds what a reader sees (plain values); the file's layout is
//! [`shared::datastore`]; [`Datastore`] is the writer and [`reader`] the reader.
//!
//! **Writer.** `Runtime::init` creates `<dir>/nrt-datastore-<pid>` (dir =
//! `NEURON_RT_DATASTORE_DIR`, else `/dev/shm`, else the temp dir; a second runtime of the same
//! process adds `.<n>`): the file is filled and published (`state` = live, release store) under
//! a hidden temporary name, then linked to its final name, so a reader never sees a half-written
//! file. With `NEURON_RT_DATASTORE=off` the same records live in a private anonymous mapping:
//! the execute path is the same either way. Counters are u64 words that readers load with
//! Relaxed atomics. Their writers are this process's threads, serialised by one lock
//! ([`Datastore::records`]): an execution's updates (a dozen or two words of its TPB, core and
//! model records) are plain loads and stores under one lock round trip, not an atomic
//! read-modify-write each (each costs a locked instruction, several times a plain store). The
//! execute path never allocates here and holds the lock only for those stores.
//! A model slot's identity (assigned at load, marked unloaded at unload, reused
//! least-recently-unloaded first when all are taken) changes under a single-writer seqlock;
//! load and unload are serialised by the writer's slot lock.
//!
//! **Closing and removal.** `Runtime::close` (or dropping the runtime in the process that
//! created it, or the process's exit without either) marks the file closed and stamps its
//! modification time: the file keeps the final counters for [`CLOSED_LINGER`], so that a reader
//! sampling every period up to that long (`nrt monitor`) still counts the executions since its
//! last sample — a process's last ones, its failures included — and even a process that lived
//! and ended between two samples. Readers report it [`snapshot::Liveness::Closed`]. A forked
//! child never touches the file. A process that dies without closing (SIGKILL) leaves its file
//! live: readers report it [`snapshot::Liveness::Stale`] (its pid is gone, or the pid was reused
//! by a process with another start time, and no process holds the file's `flock`: the
//! writer holds it for its life, so a writer in another PID namespace, whose pid `/proc`
//! cannot show, is still live). The next `Runtime::init` in that directory removes
//! stale files and files closed more than [`CLOSED_LINGER`] ago, and the oldest closed ones
//! beyond [`CLOSED_BUDGET`] bytes ([`remove_stale`]), so the directory does not fill. A reader may call [`remove_stale`] as well.

pub mod reader;
pub mod snapshot;

mod proc_stat;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shared::NrtStatus;
use shared::datastore::{
    CoreRecord, DATASTORE_FILE_PREFIX, DATASTORE_MAGIC, DATASTORE_VERSION, DatastoreHeader,
    HistogramRecord, MAX_LNC, MODEL_NAME_BYTES, MODEL_SLOTS, ModelSlotRecord, SLOT_FREE,
    SLOT_LOADED, SLOT_UNLOADED, STATE_CLOSED, STATE_LIVE, TpbRecord, layout_of, offsets, padded,
    status_slot,
};
use shared::{MemError, SharedChunk};
use zerocopy::{FromZeros, IntoBytes};

use crate::metrics::{TpbResponse, exec_stat_ordinal};
use crate::process::Leftover;
pub use reader::{ReadError, read_file, remove_stale, scan, scan_detailed};
use snapshot::{HIST_BUCKETS, MemKind, bucket_of};

const _: () = assert!(HIST_BUCKETS == shared::datastore::HIST_BUCKETS);
const _: () = assert!(MemKind::ALL.len() == shared::datastore::MEM_KINDS);

/// How long a closed runtime's datastore file stays for readers before [`remove_stale`] takes
/// it (readers sampling more rarely may miss a closed process's last period).
pub const CLOSED_LINGER: Duration = Duration::from_secs(60);

/// The most bytes closed datastore files may linger in one directory ([`CLOSED_LINGER`]):
/// beyond, the oldest closed go first ([`remove_stale`]). Without a bound, a test suite opening
/// and closing runtimes at a few per second kept megabytes a second of closed files, and
/// filled a container's 64 MiB `/dev/shm` within a minute.
pub const CLOSED_BUDGET: u64 = 8 << 20;

/// Marks the datastore file at `path` closed and stamps its modification time now (the start
/// of its [`CLOSED_LINGER`]); best effort (the exit hook's way to close a file whose runtime
/// was never closed).
pub(crate) fn close_file(path: &Path) {
    let Ok(file) = OpenOptions::new().write(true).open(path) else {
        return;
    };
    let _ = std::os::unix::fs::FileExt::write_all_at(
        &file,
        &STATE_CLOSED.to_le_bytes(),
        offsets::HEADER_STATE as u64,
    );
    let _ = file.set_modified(SystemTime::now());
}

/// The directory of the datastore files when `NEURON_RT_DATASTORE_DIR` is not set: `/dev/shm`
/// if it exists, else the temp dir.
pub fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A model's slot in the datastore (carried by its work items; no lookup on the execute path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelSlot(u32);

impl ModelSlot {
    /// The slot's index.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// Why a datastore could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// A file operation failed.
    #[error("datastore file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Mapping or writing the records failed.
    #[error("datastore mapping: {0}")]
    Map(#[from] MemError),
    /// A logical core with no NC or more than [`MAX_LNC`].
    #[error("logical core {vnc} has {ncs} NCs (1..={MAX_LNC} allowed)")]
    BadCore {
        /// The core.
        vnc: usize,
        /// Its NC count.
        ncs: usize,
    },
}

/// Writer-side bookkeeping of the model slots (under the slot lock; load/unload only).
#[derive(Debug, Default)]
struct SlotTable {
    /// The last generation handed out.
    generation: u64,
}

/// One runtime's datastore: the writer of the records (in a shared file or a private mapping).
///
/// # Invariants
/// `chunk` holds a valid layout (header, `cores` core records, `tpbs` TPB records, the model
/// slots) at PA 0; every offset computed from the fields below is inside it, so the accessor's
/// bounds checks never fail (their errors are ignored on the execute path).
#[derive(Debug)]
pub struct Datastore {
    chunk: SharedChunk,
    /// The published file (`None`: private).
    path: Option<PathBuf>,
    /// The process that created the file: the only one that writes or removes it.
    owner: u32,
    core_offset: u64,
    tpb_offset: u64,
    model_offset: u64,
    cores: u32,
    /// Physical NC → TPB record index (`u32::MAX`: not ours).
    tpb_of_nc: Vec<u32>,
    slots: Mutex<SlotTable>,
    /// Serialises every writer of the counter words ([`Records`]); memory charges, updated by
    /// atomic read-modify-writes of words nobody else writes, do not take it.
    writer: Mutex<()>,
    /// The published file, exclusively `flock`ed while this runtime lives (the lock goes with
    /// the process, however it ends): readers in any PID namespace see the writer live by it
    /// ([`reader::writer_holds_lock`]) where `/proc` shows them another namespace's pids. Not
    /// inherited by forked children ([`crate::process::ForkPrivate`]), which would hold it
    /// after this process is gone.
    _lock: Option<crate::process::ForkPrivate<nix::fcntl::Flock<File>>>,
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Datastore {
    /// The records of `cores` (each logical core's physical NCs, vNC order) at `lnc` NCs per
    /// core in a private anonymous mapping (`NEURON_RT_DATASTORE=off`, and tests).
    ///
    /// # Errors
    /// [`CreateError::BadCore`]; [`CreateError::Map`] when the mapping cannot be made.
    pub fn private(cores: &[Vec<u32>], lnc: u32) -> Result<Self, CreateError> {
        let (_, _, _, size) = Self::check(cores)?;
        let chunk = SharedChunk::anonymous(0, size)?;
        let ds = Self::fill(chunk, None, cores, lnc)?;
        ds.publish()?;
        Ok(ds)
    }

    /// Creates and publishes `dir/nrt-datastore-<pid>` (`.<n>` added when this process already
    /// has one) for `cores` at `lnc`. Removes the stale files of dead processes in `dir` first.
    ///
    /// # Errors
    /// [`CreateError::Io`] when the directory or file cannot be written; as
    /// [`Datastore::private`].
    pub fn create(dir: &Path, cores: &[Vec<u32>], lnc: u32) -> Result<Self, CreateError> {
        let (_, _, _, size) = Self::check(cores)?;
        if let Err(e) = remove_stale(dir) {
            tracing::debug!(dir = %dir.display(), error = %e, "datastore: removing stale files");
        }
        let pid = crate::process::id();
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CreateError::Io { path, source }
        };
        let tmp = dir.join(format!(
            ".{DATASTORE_FILE_PREFIX}{pid}.{}.tmp",
            unix_ns(SystemTime::now())
        ));
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        let made = (|| {
            // Locked before anything is in it, through an open file of its own: a lock belongs
            // to an open file, and the mapping's (below) is shared with forked children for as
            // long as they run, this one with no one ([`crate::process::ForkPrivate`]).
            let lock = File::open(&tmp).map_err(io_err(&tmp))?;
            let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
                .map_err(|(_, e)| io_err(&tmp)(io::Error::from(e)))?;
            reserve(&file, size).map_err(io_err(&tmp))?;
            let chunk = SharedChunk::map_fd(&file, 0, size, true)?;
            let mut ds = Self::fill(chunk, None, cores, lnc)?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&*lock);
            // With no slot left (16 runtimes alive in one process) the lock goes: readers
            // judge this file by `/proc` alone, as they do an older runtime's.
            ds._lock = crate::process::ForkPrivate::new(lock, fd).ok();
            ds.publish()?;
            // Link the finished file to the first free final name.
            for n in 0..1024u32 {
                let name = if n == 0 {
                    format!("{DATASTORE_FILE_PREFIX}{pid}")
                } else {
                    format!("{DATASTORE_FILE_PREFIX}{pid}.{n}")
                };
                let path = dir.join(name);
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => {
                        crate::process::undo_at_exit(Leftover::Datastore(path.clone()));
                        ds.path = Some(path);
                        return Ok(ds);
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io_err(&path)(e)),
                }
            }
            Err(io_err(dir)(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "1024 datastore files of this process",
            )))
        })();
        let _ = std::fs::remove_file(&tmp);
        made
    }

    /// (core_offset, tpb_offset, model_offset, file_size) of `cores`, checked.
    fn check(cores: &[Vec<u32>]) -> Result<(usize, usize, usize, usize), CreateError> {
        for (vnc, ncs) in cores.iter().enumerate() {
            if ncs.is_empty() || ncs.len() > MAX_LNC {
                return Err(CreateError::BadCore {
                    vnc,
                    ncs: ncs.len(),
                });
            }
        }
        let tpbs = cores.iter().map(Vec::len).sum();
        Ok(layout_of(cores.len(), tpbs))
    }

    /// Writes the header (state initialising) and the records' fixed fields into a zeroed
    /// `chunk`.
    fn fill(
        chunk: SharedChunk,
        path: Option<PathBuf>,
        cores: &[Vec<u32>],
        lnc: u32,
    ) -> Result<Self, CreateError> {
        let (core_offset, tpb_offset, model_offset, size) = Self::check(cores)?;
        let tpbs: usize = cores.iter().map(Vec::len).sum();
        let to_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let header = DatastoreHeader {
            magic: DATASTORE_MAGIC,
            version: DATASTORE_VERSION,
            header_size: to_u32(size_of::<DatastoreHeader>()),
            pid: crate::process::id(),
            lnc,
            start_time: proc_stat::start_time(crate::process::id()).unwrap_or(0),
            created_unix_ns: unix_ns(SystemTime::now()),
            state: 0,
            file_size: size as u64,
            core_count: to_u32(cores.len()),
            core_record_size: to_u32(size_of::<CoreRecord>()),
            core_offset: core_offset as u64,
            tpb_count: to_u32(tpbs),
            tpb_record_size: to_u32(size_of::<TpbRecord>()),
            tpb_offset: tpb_offset as u64,
            model_slot_count: to_u32(MODEL_SLOTS),
            model_slot_size: to_u32(size_of::<ModelSlotRecord>()),
            model_offset: model_offset as u64,
            runtime_version: padded(crate::RUNTIME_VERSION),
            command: padded(&proc_stat::command_line()),
        };
        chunk.write_obj(0, &header)?;
        let max_nc = cores
            .iter()
            .flatten()
            .copied()
            .max()
            .map_or(0, |n| n as usize + 1);
        let mut tpb_of_nc = vec![u32::MAX; max_nc];
        let mut empty_hist = HistogramRecord::new_zeroed();
        empty_hist.min_ns = u64::MAX;
        let mut first_tpb = 0usize;
        for (vnc, ncs) in cores.iter().enumerate() {
            let mut core = CoreRecord::new_zeroed();
            core.vnc = to_u32(vnc);
            core.logical_id = ncs[0] / lnc.max(1);
            core.nc_count = to_u32(ncs.len());
            core.first_tpb = to_u32(first_tpb);
            for (slot, nc) in core.ncs.iter_mut().zip(ncs) {
                *slot = *nc;
            }
            core.total_latency = empty_hist;
            core.device_latency = empty_hist;
            chunk.write_obj((core_offset + vnc * size_of::<CoreRecord>()) as u64, &core)?;
            for nc in ncs {
                let mut tpb = TpbRecord::new_zeroed();
                tpb.nc = *nc;
                tpb.vnc = core.vnc;
                tpb.nc_latency = empty_hist;
                chunk.write_obj(
                    (tpb_offset + first_tpb * size_of::<TpbRecord>()) as u64,
                    &tpb,
                )?;
                tpb_of_nc[*nc as usize] = to_u32(first_tpb);
                first_tpb += 1;
            }
        }
        for s in 0..MODEL_SLOTS {
            let mut slot = ModelSlotRecord::new_zeroed();
            slot.total_latency = empty_hist;
            chunk.write_obj(
                (model_offset + s * size_of::<ModelSlotRecord>()) as u64,
                &slot,
            )?;
        }
        Ok(Self {
            chunk,
            path,
            owner: crate::process::id(),
            core_offset: core_offset as u64,
            tpb_offset: tpb_offset as u64,
            model_offset: model_offset as u64,
            cores: to_u32(cores.len()),
            tpb_of_nc,
            slots: Mutex::new(SlotTable::default()),
            writer: Mutex::new(()),
            _lock: None,
        })
    }

    fn publish(&self) -> Result<(), MemError> {
        self.chunk
            .store_u64(offsets::HEADER_STATE as u64, STATE_LIVE, Ordering::Release)
    }

    /// The published file (`None` for a private datastore).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// What a reader sees of this datastore now.
    pub fn snapshot(&self) -> snapshot::ProcessSnapshot {
        // The records were written by us and are valid by construction (type invariant).
        reader::read_chunk(&self.chunk, true).unwrap_or_else(|e| {
            tracing::error!(error = %e, "datastore: reading our own records");
            snapshot::ProcessSnapshot {
                pid: self.owner,
                command: String::new(),
                runtime_version: String::new(),
                lnc: 0,
                uptime: Duration::ZERO,
                created_unix_ns: 0,
                liveness: snapshot::Liveness::Live,
                cores: Vec::new(),
                models: Vec::new(),
                read_retries: 0,
            }
        })
    }

    /// A copy of physical NC `nc`'s TPB record (`None`: not one of ours).
    pub fn tpb_record(&self, nc: u32) -> Option<TpbRecord> {
        self.chunk
            .load_words(self.tpb_base(nc)?, Ordering::Relaxed)
            .ok()
    }

    /// The TPB record of physical NC `nc` (`None`: not one of ours).
    fn tpb_base(&self, nc: u32) -> Option<u64> {
        let i = *self.tpb_of_nc.get(nc as usize)?;
        (i != u32::MAX).then(|| self.tpb_offset + u64::from(i) * size_of::<TpbRecord>() as u64)
    }

    fn core_base(&self, vnc: u32) -> Option<u64> {
        (vnc < self.cores)
            .then(|| self.core_offset + u64::from(vnc) * size_of::<CoreRecord>() as u64)
    }

    fn slot_base(&self, slot: ModelSlot) -> Option<u64> {
        ((slot.0 as usize) < MODEL_SLOTS)
            .then(|| self.model_offset + u64::from(slot.0) * size_of::<ModelSlotRecord>() as u64)
    }

    fn add(&self, pa: u64, v: u64) {
        let _ = self.chunk.fetch_add_u64(pa, v, Ordering::Relaxed);
    }

    /// The counter records, for one or more updates under one round trip of the writers' lock
    /// (an execution's TPB, core and model records together).
    pub fn records(&self) -> Records<'_> {
        Records {
            ds: self,
            writer: self
                .writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        }
    }

    /// [`Records::tpb`] under a lock round trip of its own.
    pub fn record_tpb(&self, nc: u32, status: NrtStatus, e2e_us: u64, resp: &TpbResponse) {
        self.records().tpb(nc, status, e2e_us, resp);
    }

    /// [`Records::core`] under a lock round trip of its own.
    pub fn record_core(&self, vnc: u32, status: NrtStatus, e2e: Duration, device_ns: u64) {
        self.records().core(vnc, status, e2e, device_ns);
    }

    /// [`Records::model`] under a lock round trip of its own.
    pub fn record_model(&self, slot: ModelSlot, status: NrtStatus, e2e: Duration) {
        self.records().model(slot, status, e2e);
    }

    /// Adds `bytes` of `kind` to logical core `vnc`'s memory.
    pub fn charge_memory(&self, vnc: u32, kind: MemKind, bytes: u64) {
        if let Some(base) = self.core_base(vnc) {
            self.add(base + offsets::CORE_MEMORY as u64 + 8 * kind as u64, bytes);
        }
    }

    /// Takes `bytes` of `kind` off logical core `vnc`'s memory.
    pub fn release_memory(&self, vnc: u32, kind: MemKind, bytes: u64) {
        if let Some(base) = self.core_base(vnc) {
            let _ = self.chunk.fetch_sub_u64(
                base + offsets::CORE_MEMORY as u64 + 8 * kind as u64,
                bytes,
                Ordering::Relaxed,
            );
        }
    }

    /// Rewrites slot `base`'s identity under its seqlock (single writer: the slot lock is
    /// held): `seq` odd, the fields, then `seq` even again with a release store.
    fn seqlock_write(&self, base: u64, write: impl FnOnce()) {
        let seq_pa = base + offsets::SLOT_SEQ as u64;
        let seq = self.chunk.load_u64(seq_pa, Ordering::Relaxed).unwrap_or(0);
        let _ = self
            .chunk
            .store_u64(seq_pa, seq.wrapping_add(1) | 1, Ordering::Relaxed);
        fence(Ordering::Release);
        write();
        let _ = self.chunk.store_u64(
            seq_pa,
            (seq.wrapping_add(1) | 1).wrapping_add(1),
            Ordering::Release,
        );
    }

    fn slot_record(&self, base: u64) -> Option<ModelSlotRecord> {
        self.chunk.load_words(base, Ordering::Relaxed).ok()
    }

    /// Assigns a slot to model `id` (loaded on `vnc`, named `name`, with the NEFF's `uuid` or
    /// zeros, holding `memory_bytes`):
    /// a free slot, else the one unloaded longest ago (its counts start over). `None` when
    /// every slot holds a loaded model: the model is then not counted per model.
    pub fn model_loaded(
        &self,
        id: u64,
        vnc: u32,
        name: &str,
        uuid: [u8; 16],
        memory_bytes: u64,
    ) -> Option<ModelSlot> {
        let mut table = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut best: Option<(u32, u64)> = None;
        for s in 0..MODEL_SLOTS {
            let slot = ModelSlot(u32::try_from(s).ok()?);
            let rec = self.slot_record(self.slot_base(slot)?)?;
            match rec.state {
                SLOT_FREE => {
                    best = Some((slot.0, 0));
                    break;
                }
                SLOT_UNLOADED if best.is_none_or(|(_, g)| rec.generation < g) => {
                    best = Some((slot.0, rec.generation));
                }
                _ => {}
            }
        }
        let slot = ModelSlot(best?.0);
        let base = self.slot_base(slot)?;
        table.generation += 1;
        let mut rec = ModelSlotRecord::new_zeroed();
        rec.id = id;
        rec.vnc = vnc;
        rec.state = SLOT_LOADED;
        rec.memory_bytes = memory_bytes;
        rec.generation = table.generation;
        rec.name = padded::<MODEL_NAME_BYTES>(name);
        rec.uuid = uuid;
        rec.total_latency.min_ns = u64::MAX;
        // The slot's counters start over: written with the counter writers held off (a late
        // record of the slot's previous model would otherwise overwrite the zeros).
        let records = self.records();
        self.seqlock_write(base, || self.store_slot_fields(base, &rec));
        drop(records);
        Some(slot)
    }

    /// Writes every word of `rec` but `seq` (inside the seqlock).
    fn store_slot_fields(&self, base: u64, rec: &ModelSlotRecord) {
        let bytes = rec.as_bytes();
        let words: Vec<u64> = bytes[offsets::SLOT_SEQ + 8..]
            .chunks_exact(8)
            .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
            .collect();
        let _ = self.chunk.store_words(
            base + offsets::SLOT_SEQ as u64 + 8,
            &words,
            Ordering::Relaxed,
        );
    }

    /// Marks `slot` unloaded (its counts stay until the slot is reused).
    pub fn model_unloaded(&self, slot: ModelSlot) {
        let mut table = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(base) = self.slot_base(slot) else {
            return;
        };
        let Some(mut rec) = self.slot_record(base) else {
            return;
        };
        table.generation += 1;
        rec.state = SLOT_UNLOADED;
        rec.memory_bytes = 0;
        rec.generation = table.generation;
        self.seqlock_write(base, || {
            // The identity words only: the counters keep counting (nothing runs any more).
            let head = &rec.as_bytes()[8..offsets::SLOT_EXECUTIONS];
            let words: Vec<u64> = head
                .chunks_exact(8)
                .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or([0; 8])))
                .collect();
            let _ = self.chunk.store_words(base + 8, &words, Ordering::Relaxed);
        });
    }

    /// Marks the file closed and stamps its close time: it lingers [`CLOSED_LINGER`] with the
    /// final counters for readers (in the creating process only; a forked child leaves it to
    /// its parent).
    pub fn close(&self) {
        if crate::process::id() != self.owner {
            return;
        }
        let _ = self.chunk.store_u64(
            offsets::HEADER_STATE as u64,
            STATE_CLOSED,
            Ordering::Release,
        );
        if let Some(p) = &self.path {
            let stamped = File::options()
                .write(true)
                .open(p)
                .and_then(|f| f.set_modified(SystemTime::now()));
            if let Err(e) = stamped
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(path = %p.display(), error = %e, "stamping the closed datastore file");
            }
            crate::process::forget_at_exit(&Leftover::Datastore(p.clone()));
        }
    }
}

impl Drop for Datastore {
    /// Removes the file in the creating process (a forked child inherits the object, never the
    /// file).
    fn drop(&mut self) {
        self.close();
    }
}

/// The counter records of a [`Datastore`], its writers' lock held ([`Datastore::records`]).
pub struct Records<'a> {
    ds: &'a Datastore,
    writer: std::sync::MutexGuard<'a, ()>,
}

impl Records<'_> {
    /// The counters of the `T` record at `base` (bounds-checked once for the whole record).
    fn record<T>(&self, base: u64) -> Option<Counters<'_>> {
        self.ds
            .chunk
            .atomic_words(base, size_of::<T>() / 8)
            .map(|words| Counters {
                words,
                _writer: &self.writer,
            })
            .ok()
    }

    /// Records one execution on physical NC `nc` (the seed's per-TPB `kmetric_update_nds_*`
    /// updaters). An NC that is not ours is ignored.
    pub fn tpb(&self, nc: u32, status: NrtStatus, e2e_us: u64, resp: &TpbResponse) {
        let Some(r) = self
            .ds
            .tpb_base(nc)
            .and_then(|b| self.record::<TpbRecord>(b))
        else {
            return;
        };
        r.add(offsets::TPB_EXEC_STATS + 8 * exec_stat_ordinal(status), 1);
        for flag in 5..=8u32 {
            if resp.error_flags & (1 << flag) != 0 {
                r.add(offsets::TPB_ERROR_STATS + 8 * (flag - 5) as usize, 1);
            }
        }
        r.add(offsets::TPB_BUSY_NS, resp.nc_ns);
        r.latency(offsets::TPB_E2E, e2e_us);
        r.latency(offsets::TPB_DEVICE, resp.device_latency_ns() / 1000);
        r.latency(offsets::TPB_NC_BUSY, resp.nc_ns / 1000);
        r.hist(offsets::TPB_NC_LATENCY, resp.nc_ns);
    }

    /// Records one execution on logical core `vnc` (once per execution, whatever its TPB
    /// count): its status, end-to-end latency and device latency (the slower TPB).
    pub fn core(&self, vnc: u32, status: NrtStatus, e2e: Duration, device_ns: u64) {
        let Some(r) = self
            .ds
            .core_base(vnc)
            .and_then(|b| self.record::<CoreRecord>(b))
        else {
            return;
        };
        r.add(offsets::CORE_EXECUTIONS + 8 * status_slot(status as u32), 1);
        r.hist(offsets::CORE_TOTAL_LATENCY, duration_ns(e2e));
        r.hist(offsets::CORE_DEVICE_LATENCY, device_ns);
    }

    /// Counts one execution of logical core `vnc` that the runtime refused before it ran (a
    /// wrong input, a full queue): its status only; nothing ran, so no latency is recorded.
    pub fn core_refusal(&self, vnc: u32, status: NrtStatus) {
        if let Some(r) = self
            .ds
            .core_base(vnc)
            .and_then(|b| self.record::<CoreRecord>(b))
        {
            r.add(offsets::CORE_EXECUTIONS + 8 * status_slot(status as u32), 1);
        }
    }

    /// Counts one refused execution of the model in `slot` ([`Records::core_refusal`]).
    pub fn model_refusal(&self, slot: ModelSlot, status: NrtStatus) {
        if let Some(r) = self
            .ds
            .slot_base(slot)
            .and_then(|b| self.record::<ModelSlotRecord>(b))
        {
            r.add(offsets::SLOT_EXECUTIONS + 8 * status_slot(status as u32), 1);
        }
    }

    /// Records one execution of the model in `slot`.
    pub fn model(&self, slot: ModelSlot, status: NrtStatus, e2e: Duration) {
        let Some(r) = self
            .ds
            .slot_base(slot)
            .and_then(|b| self.record::<ModelSlotRecord>(b))
        else {
            return;
        };
        r.add(offsets::SLOT_EXECUTIONS + 8 * status_slot(status as u32), 1);
        r.hist(offsets::SLOT_TOTAL_LATENCY, duration_ns(e2e));
    }
}

/// The counters of one datastore record, in the writer's shared mapping
/// ([`SharedChunk::atomic_words`]), the writers' lock held (`_writer`: only [`Records`] makes
/// one): every update is a Relaxed load and a Relaxed store of one u64 word at a byte offset
/// into the record (an offset past the record is ignored, as a failed accessor is). Readers in
/// other processes load each word whole; no writer is lost, all of them holding the lock. A
/// minimum or maximum that would not change is only loaded.
struct Counters<'a> {
    words: &'a [std::sync::atomic::AtomicU64],
    _writer: &'a std::sync::MutexGuard<'a, ()>,
}

impl Counters<'_> {
    fn word(&self, off: usize) -> Option<&std::sync::atomic::AtomicU64> {
        self.words.get(off / 8)
    }

    fn add(&self, off: usize, v: u64) {
        if let Some(w) = self.word(off) {
            w.store(w.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed);
        }
    }

    fn min(&self, off: usize, v: u64) {
        if let Some(w) = self.word(off)
            && v < w.load(Ordering::Relaxed)
        {
            w.store(v, Ordering::Relaxed);
        }
    }

    fn max(&self, off: usize, v: u64) {
        if let Some(w) = self.word(off)
            && v > w.load(Ordering::Relaxed)
        {
            w.store(v, Ordering::Relaxed);
        }
    }

    fn store(&self, off: usize, v: u64) {
        if let Some(w) = self.word(off) {
            w.store(v, Ordering::Relaxed);
        }
    }

    /// One sample of `ns` into the histogram at `base`.
    fn hist(&self, base: usize, ns: u64) {
        self.add(base + offsets::HIST_COUNT, 1);
        self.add(base + offsets::HIST_SUM, ns);
        self.min(base + offsets::HIST_MIN, ns);
        self.max(base + offsets::HIST_MAX, ns);
        self.add(base + offsets::HIST_BUCKETS + 8 * bucket_of(ns), 1);
    }

    /// One sample of `us` into the latency record at `base`.
    fn latency(&self, base: usize, us: u64) {
        self.add(base + offsets::LAT_COUNT, 1);
        self.add(base + offsets::LAT_TOTAL, us);
        self.max(base + offsets::LAT_MAX, us);
        self.store(base + offsets::LAT_LAST, us);
    }
}

#[cfg(test)]
mod tests;

/// Sizes `file` to `size` bytes with every block reserved, so that no store into its mapping
/// can fault: a sparse file (`set_len`) on a full filesystem (a small `/dev/shm`) took a SIGBUS
/// at the first store. A size above the process's file-size limit (`ulimit -f`) is refused
/// before the kernel would send SIGXFSZ, whose default action ends the process.
fn reserve(file: &File, size: usize) -> io::Result<()> {
    let len = i64::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE)
        && soft != nix::sys::resource::RLIM_INFINITY
        && soft < size as u64
    {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "the datastore's {size} bytes exceed this process's file-size limit of {soft} bytes (ulimit -f)"
            ),
        ));
    }
    nix::fcntl::posix_fallocate(file, 0, len).map_err(io::Error::from)
}
