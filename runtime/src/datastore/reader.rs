//! The reader: maps datastore files read-only, checks their header and copies the counters
//! out into [`ProcessSnapshot`]s.
//!
//! Everything in a file is untrusted: a short, foreign or corrupt file is a typed
//! [`ReadError`] (what [`scan`] skips), never a panic. Counters are read with atomic loads
//! (the writer updates them atomically); a model slot's identity is read under its seqlock,
//! with a bounded number of retries (a writer killed inside the seqlock leaves it odd: the slot
//! is then skipped). A file whose writer is gone is [`Liveness::Stale`].

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, SystemTime};

use shared::datastore::{
    CoreRecord, DATASTORE_FILE_PREFIX, DATASTORE_MAGIC, DATASTORE_VERSION, DatastoreHeader,
    HistogramRecord, MAX_LNC, ModelSlotRecord, OTHER_STATUS_SLOT, SLOT_FREE, SLOT_LOADED,
    STATE_CLOSED, STATE_INITIALISING, STATE_LIVE, STATUS_SLOTS, TpbRecord, offsets, unpadded,
};
use shared::{MemError, NrtStatus, SharedChunk};

use super::proc_stat;
use super::snapshot::{
    CoreSnapshot, Histogram, Liveness, MemoryUsage, ModelSnapshot, ProcessSnapshot, StatusCounts,
    TpbSnapshot,
};

/// Seqlock attempts per model slot before the reader gives the slot up.
const SEQLOCK_ATTEMPTS: u32 = 1000;
/// Table sizes a reader accepts (a corrupt header cannot make it allocate without bound).
const MAX_TABLE: u32 = 4096;

/// Why a datastore file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening, sizing or mapping the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header or than the tables the header names.
    #[error("the file has {len} bytes; {need} needed")]
    TooShort {
        /// Bytes in the file.
        len: u64,
        /// Bytes needed.
        need: u64,
    },
    /// Not a datastore file.
    #[error("bad magic {found:02x?}")]
    BadMagic {
        /// The first 8 bytes.
        found: [u8; 8],
    },
    /// A layout version this reader does not know.
    #[error("layout version {found} (this reader knows {DATASTORE_VERSION})")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// The header's sizes or offsets are impossible.
    #[error("corrupt layout: {0}")]
    Layout(String),
    /// The writer has not published the file yet.
    #[error("the writer is still initialising the file")]
    Initialising,
    /// An access outside the mapping (a header check missed something).
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// Reads one datastore file.
///
/// # Errors
/// [`ReadError`] naming what is wrong with the file.
pub fn read_file(path: &Path) -> Result<ProcessSnapshot, ReadError> {
    let io_err = |source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let len = file.metadata().map_err(io_err)?.len();
    let need = size_of::<DatastoreHeader>() as u64;
    if len < need {
        return Err(ReadError::TooShort { len, need });
    }
    let len = usize::try_from(len).map_err(|_| ReadError::Layout("file too large".into()))?;
    let chunk = SharedChunk::map_fd(&file, 0, len, false).map_err(|e| match e {
        MemError::Map { source, .. } => io_err(source),
        e => ReadError::Mem(e),
    })?;
    let mut snapshot = read_chunk(&chunk, false)?;
    // A live file whose pid `/proc` does not show (its writer is in another PID namespace) is
    // live while its writer holds the file's lock.
    if snapshot.liveness == Liveness::Stale
        && chunk
            .load_u64(offsets::HEADER_STATE as u64, Ordering::Acquire)
            .is_ok_and(|state| state == STATE_LIVE)
        && writer_holds_lock(&file)
    {
        snapshot.liveness = Liveness::Live;
    }
    Ok(snapshot)
}

/// Whether a process holds `file`'s `flock` (a datastore's writer holds it exclusively for
/// its life): a shared lock cannot be taken without waiting. Any other failure of the probe
/// says nothing, and counts as not held.
pub(crate) fn writer_holds_lock(file: &File) -> bool {
    let Ok(probe) = file.try_clone() else {
        return false;
    };
    match nix::fcntl::Flock::lock(probe, nix::fcntl::FlockArg::LockSharedNonblock) {
        Ok(_taken) => false,
        Err((_, e)) => e == nix::errno::Errno::EWOULDBLOCK,
    }
}

/// Every datastore file in `dir` with what reading it gave, by file name.
///
/// # Errors
/// The directory cannot be listed.
pub fn scan_detailed(dir: &Path) -> io::Result<Vec<(PathBuf, Result<ProcessSnapshot, ReadError>)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(DATASTORE_FILE_PREFIX) {
            continue;
        }
        let path = entry.path();
        let r = read_file(&path);
        out.push((path, r));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The datastores in `dir` that could be read (live and stale), by pid; unreadable files are
/// skipped (logged at debug level; [`scan_detailed`] gives their errors). A directory that
/// cannot be listed gives none.
pub fn scan(dir: &Path) -> Vec<ProcessSnapshot> {
    let mut out: Vec<ProcessSnapshot> = scan_detailed(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(path, r)| match r {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "datastore skipped");
                None
            }
        })
        .collect();
    out.sort_by_key(|s| s.pid);
    out
}

/// The pid in a datastore file name (`nrt-datastore-<pid>[.<n>]`, or the writer's temporary
/// `.nrt-datastore-<pid>.<ns>.tmp`).
fn pid_of_name(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix('.')
        .unwrap_or(name)
        .strip_prefix(DATASTORE_FILE_PREFIX)?;
    rest.split('.').next()?.parse().ok()
}

/// Removes the stale datastore files in `dir`: those whose writer is gone (pid dead, or reused
/// with another start time, and its lock not held), the oldest closed ones beyond
/// [`super::CLOSED_BUDGET`] bytes, those closed more than [`super::CLOSED_LINGER`] ago (by their
/// modification time, stamped at close), unreadable ones whose file-name pid is dead, and the
/// temporary files of dead writers. Returns the files removed. `Runtime::init` calls it for
/// its directory; readers may.
///
/// # Errors
/// The directory cannot be listed.
pub fn remove_stale(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    // The closed files left to linger: (closed at, bytes, path).
    let mut lingering = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = pid_of_name(&name) else {
            continue;
        };
        let path = entry.path();
        let stale = if name.starts_with('.') {
            proc_stat::start_time(pid).is_none()
                && !File::open(&path).is_ok_and(|f| writer_holds_lock(&f))
        } else {
            match read_file(&path) {
                Ok(s) => match s.liveness {
                    Liveness::Stale => true,
                    Liveness::Closed => {
                        let expired = closed_long_ago(&path);
                        if !expired && let Ok(m) = std::fs::metadata(&path) {
                            let at = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                            lingering.push((at, m.len(), path.clone()));
                        }
                        expired
                    }
                    Liveness::Live => false,
                },
                Err(_) => proc_stat::start_time(pid).is_none(),
            }
        };
        if stale && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    // The newest closed files within the budget linger; the older ones go.
    lingering.sort_by_key(|l| std::cmp::Reverse(l.0));
    let mut kept = 0u64;
    for (_, len, path) in lingering {
        kept = kept.saturating_add(len);
        if kept > super::CLOSED_BUDGET && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Whether the closed file at `path` was closed (its modification time) more than
/// [`super::CLOSED_LINGER`] ago; a time that cannot be read counts as long ago.
fn closed_long_ago(path: &Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_none_or(|age| age > super::CLOSED_LINGER)
}

fn histogram(r: &HistogramRecord) -> Histogram {
    Histogram {
        buckets: r.buckets.to_vec(),
        count: r.count,
        sum_ns: r.sum_ns,
        min_ns: r.min_ns,
        max_ns: r.max_ns,
    }
}

fn status_counts(slots: &[u64; STATUS_SLOTS]) -> StatusCounts {
    StatusCounts {
        by_status: NrtStatus::ALL
            .iter()
            .zip(slots.iter())
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| (*s, *n))
            .collect(),
        other: slots[OTHER_STATUS_SLOT],
    }
}

/// Checks that `count` records of `size` bytes (at least `min_size`) at `offset` lie inside
/// `len` bytes; returns the table's end.
fn table(
    what: &str,
    offset: u64,
    count: u32,
    size: u32,
    min_size: usize,
    len: u64,
) -> Result<u64, ReadError> {
    if count > MAX_TABLE {
        return Err(ReadError::Layout(format!("{count} {what} records")));
    }
    if (size as usize) < min_size || !size.is_multiple_of(8) || !offset.is_multiple_of(8) {
        return Err(ReadError::Layout(format!(
            "{what} records of {size} bytes at {offset:#x} (at least {min_size}, 8-aligned)"
        )));
    }
    let end = u64::from(count)
        .checked_mul(u64::from(size))
        .and_then(|n| n.checked_add(offset))
        .ok_or_else(|| ReadError::Layout(format!("{what} table overflows")))?;
    if end > len {
        return Err(ReadError::TooShort { len, need: end });
    }
    Ok(end)
}

/// Whether the writer of `h` still runs.
fn liveness_of(h: &DatastoreHeader, state: u64) -> Liveness {
    if state == STATE_CLOSED {
        return Liveness::Closed;
    }
    if state != STATE_LIVE {
        return Liveness::Stale;
    }
    match proc_stat::start_time(h.pid) {
        Some(t) if h.start_time == 0 || t == h.start_time => Liveness::Live,
        _ => Liveness::Stale,
    }
}

/// Reads the datastore in `chunk` (a whole file mapped at PA 0). `own`: the caller is the
/// writer (always live).
pub(crate) fn read_chunk(chunk: &SharedChunk, own: bool) -> Result<ProcessSnapshot, ReadError> {
    let len = chunk.len() as u64;
    let need = size_of::<DatastoreHeader>() as u64;
    if len < need {
        return Err(ReadError::TooShort { len, need });
    }
    let state = chunk.load_u64(offsets::HEADER_STATE as u64, Ordering::Acquire)?;
    let h: DatastoreHeader = chunk.load_words(0, Ordering::Relaxed)?;
    if h.magic != DATASTORE_MAGIC {
        return Err(ReadError::BadMagic { found: h.magic });
    }
    if h.version != DATASTORE_VERSION {
        return Err(ReadError::Version { found: h.version });
    }
    if state == STATE_INITIALISING {
        return Err(ReadError::Initialising);
    }
    if (h.header_size as usize) < size_of::<DatastoreHeader>() {
        return Err(ReadError::Layout(format!(
            "header of {} bytes",
            h.header_size
        )));
    }
    if h.file_size > len {
        return Err(ReadError::TooShort {
            len,
            need: h.file_size,
        });
    }
    table(
        "core",
        h.core_offset,
        h.core_count,
        h.core_record_size,
        size_of::<CoreRecord>(),
        len,
    )?;
    table(
        "TPB",
        h.tpb_offset,
        h.tpb_count,
        h.tpb_record_size,
        size_of::<TpbRecord>(),
        len,
    )?;
    table(
        "model slot",
        h.model_offset,
        h.model_slot_count,
        h.model_slot_size,
        size_of::<ModelSlotRecord>(),
        len,
    )?;
    let liveness = if own {
        Liveness::Live
    } else {
        liveness_of(&h, state)
    };
    let mut cores = Vec::with_capacity(h.core_count as usize);
    for i in 0..u64::from(h.core_count) {
        let c: CoreRecord = chunk.load_words(
            h.core_offset + i * u64::from(h.core_record_size),
            Ordering::Relaxed,
        )?;
        let n = c.nc_count as usize;
        if n == 0 || n > MAX_LNC || c.first_tpb.saturating_add(c.nc_count) > h.tpb_count {
            return Err(ReadError::Layout(format!(
                "core {i}: {n} NCs from TPB record {} of {}",
                c.first_tpb, h.tpb_count
            )));
        }
        let mut tpbs = Vec::with_capacity(n);
        for t in 0..c.nc_count {
            let r: TpbRecord = chunk.load_words(
                h.tpb_offset + u64::from(c.first_tpb + t) * u64::from(h.tpb_record_size),
                Ordering::Relaxed,
            )?;
            tpbs.push(TpbSnapshot {
                nc: r.nc,
                exec_stats: r.exec_stats.to_vec(),
                error_stats: r.error_stats,
                busy_ns: r.busy_ns,
                nc_latency: histogram(&r.nc_latency),
            });
        }
        cores.push(CoreSnapshot {
            vnc: c.vnc,
            logical_id: c.logical_id,
            ncs: c.ncs[..n].to_vec(),
            executions: status_counts(&c.executions),
            total_latency: histogram(&c.total_latency),
            device_latency: histogram(&c.device_latency),
            memory: MemoryUsage { bytes: c.memory },
            tpbs,
        });
    }
    let mut models = Vec::new();
    let mut read_retries = 0u32;
    for i in 0..u64::from(h.model_slot_count) {
        let base = h.model_offset + i * u64::from(h.model_slot_size);
        if let Some(m) = read_slot(chunk, base, &mut read_retries)? {
            models.push(m);
        }
    }
    // Loaded models first, each group by id.
    models.sort_by_key(|m| (!m.loaded, m.id));
    let created = SystemTime::UNIX_EPOCH + Duration::from_nanos(h.created_unix_ns);
    Ok(ProcessSnapshot {
        pid: h.pid,
        command: unpadded(&h.command),
        runtime_version: unpadded(&h.runtime_version),
        lnc: h.lnc,
        uptime: SystemTime::now()
            .duration_since(created)
            .unwrap_or_default(),
        created_unix_ns: h.created_unix_ns,
        liveness,
        cores,
        models,
        read_retries,
    })
}

/// One model slot under its seqlock; `None` for a free slot or one that stayed locked for
/// [`SEQLOCK_ATTEMPTS`] (a writer that died inside it).
fn read_slot(
    chunk: &SharedChunk,
    base: u64,
    retries: &mut u32,
) -> Result<Option<ModelSnapshot>, ReadError> {
    let seq_pa = base + offsets::SLOT_SEQ as u64;
    for _ in 0..SEQLOCK_ATTEMPTS {
        let s1 = chunk.load_u64(seq_pa, Ordering::Acquire)?;
        if s1 % 2 == 0 {
            let r: ModelSlotRecord = chunk.load_words(base, Ordering::Relaxed)?;
            fence(Ordering::Acquire);
            let s2 = chunk.load_u64(seq_pa, Ordering::Relaxed)?;
            if s1 == s2 {
                if r.state == SLOT_FREE {
                    return Ok(None);
                }
                return Ok(Some(ModelSnapshot {
                    id: r.id,
                    name: unpadded(&r.name),
                    uuid: r.uuid,
                    vnc: r.vnc,
                    loaded: r.state == SLOT_LOADED,
                    memory_bytes: r.memory_bytes,
                    executions: status_counts(&r.executions),
                    total_latency: histogram(&r.total_latency),
                }));
            }
        }
        *retries = retries.saturating_add(1);
        std::hint::spin_loop();
    }
    Ok(None)
}
