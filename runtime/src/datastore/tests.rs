//! The writer and the reader together, in process: round trip, model slots, the seqlock under
//! a racing reader, stale and corrupt files.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shared::NrtStatus;
use shared::datastore::{DATASTORE_FILE_PREFIX, MODEL_SLOTS};
use zerocopy::IntoBytes;

use super::snapshot::{Liveness, MemKind, ProcessSnapshot, bucket_of};
use super::*;
use crate::metrics::{Metrics, TpbResponse, exec_stat_ordinal};

/// The single datastore file of `dir`.
fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// A pid that is certainly not running: a child that exited and was reaped.
fn dead_pid() -> u32 {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn counts_latencies_memory_and_models_round_trip_through_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // LNC=2: two logical cores of two NCs each.
    let cores = vec![vec![4, 5], vec![6, 7]];
    let ds = Arc::new(Datastore::create(dir.path(), &cores, 2).unwrap());
    let path = ds.path().unwrap().to_path_buf();
    assert_eq!(
        path,
        dir.path()
            .join(format!("{DATASTORE_FILE_PREFIX}{}", std::process::id()))
    );
    assert_eq!(only_file(dir.path()), path, "no temporary file is left");
    let metrics = Metrics::with_datastore(ds.clone(), 8);

    let slot = ds.model_loaded(11, 1, "mlp", [7; 16], 4096).unwrap();
    let resp = [
        TpbResponse {
            device_ts_ns: 20_000,
            nc_ns: 15_000,
            error_flags: 1 << 7,
        },
        TpbResponse {
            device_ts_ns: 30_000,
            nc_ns: 25_000,
            error_flags: 0,
        },
    ];
    for _ in 0..3 {
        metrics.record_completion(
            1,
            &[6, 7],
            Some(slot),
            NrtStatus::Success,
            Duration::from_micros(100),
            &resp,
        );
    }
    metrics.record_completion(
        1,
        &[6, 7],
        Some(slot),
        NrtStatus::Timeout,
        Duration::from_millis(2),
        &resp,
    );
    ds.charge_memory(1, MemKind::Tensors, 1000);
    ds.charge_memory(1, MemKind::ModelCode, 300);
    ds.release_memory(1, MemKind::Tensors, 200);

    let s = read_file(&path).unwrap();
    assert_eq!(s.pid, std::process::id());
    assert_eq!(s.liveness, Liveness::Live);
    assert_eq!((s.lnc, s.cores.len()), (2, 2));
    assert_eq!(
        s.runtime_version,
        crate::RUNTIME_VERSION,
        "the version `nrt ls` shows too"
    );
    assert!(s.command.contains("runtime"), "{}", s.command);
    let c0 = &s.cores[0];
    assert_eq!((c0.vnc, c0.logical_id, c0.ncs.clone()), (0, 2, vec![4, 5]));
    assert_eq!(c0.executions.total(), 0);
    assert_eq!(c0.total_latency.min_ns, u64::MAX, "an empty histogram");
    let c1 = &s.cores[1];
    assert_eq!((c1.vnc, c1.logical_id, c1.ncs.clone()), (1, 3, vec![6, 7]));
    // Once per execution, not once per TPB.
    assert_eq!(c1.executions.get(NrtStatus::Success), 3);
    assert_eq!(c1.executions.get(NrtStatus::Timeout), 1);
    assert_eq!(c1.executions.total(), 4);
    let h = &c1.total_latency;
    assert_eq!((h.count, h.sum_ns), (4, 3 * 100_000 + 2_000_000));
    assert_eq!((h.min_ns, h.max_ns), (100_000, 2_000_000));
    assert_eq!(h.buckets[bucket_of(100_000)], 3);
    assert_eq!(h.buckets[bucket_of(2_000_000)], 1);
    // The slower TPB's device latency: its busy time (not its notification's timestamp).
    assert_eq!(c1.device_latency.min_ns, 25_000);
    assert_eq!(c1.device_latency.count, 4);
    assert_eq!(c1.memory.get(MemKind::Tensors), 800);
    assert_eq!(c1.memory.get(MemKind::ModelCode), 300);
    assert_eq!(c1.memory.total(), 1100);
    // Per TPB: the seed's counters.
    let t6 = &c1.tpbs[0];
    assert_eq!(t6.nc, 6);
    assert_eq!(t6.exec_stats[exec_stat_ordinal(NrtStatus::Success)], 3);
    assert_eq!(t6.exec_stats[exec_stat_ordinal(NrtStatus::Timeout)], 1);
    assert_eq!(t6.error_stats, [0, 0, 4, 0]);
    assert_eq!(t6.busy_ns, 4 * 15_000);
    assert_eq!(t6.nc_latency.count, 4);
    assert_eq!(c1.busy_ns(), 4 * 25_000);
    let m = metrics.snapshot(7).unwrap();
    assert_eq!(m.executions(), 4);
    assert_eq!((m.e2e.count, m.e2e.max_us, m.device.last_us), (4, 2000, 25));
    assert_eq!(
        metrics.snapshot(0).unwrap().executions(),
        0,
        "an NC not ours reads zero"
    );
    assert!(metrics.snapshot(8).is_none());
    // The model.
    assert_eq!(s.models.len(), 1);
    let model = &s.models[0];
    assert_eq!((model.id, model.name.as_str(), model.vnc), (11, "mlp", 1));
    assert_eq!(model.uuid, [7; 16]);
    assert_eq!(model.uuid_hex(), "07".repeat(16));
    assert!(model.loaded);
    assert_eq!(model.memory_bytes, 4096);
    assert_eq!(model.executions.get(NrtStatus::Success), 3);
    assert_eq!(model.total_latency.count, 4);
    let own = ds.snapshot();
    assert!(own.uptime >= s.uptime);
    assert_eq!(
        ProcessSnapshot {
            uptime: s.uptime,
            ..own
        },
        s,
        "the writer's own view is the reader's"
    );

    // Close marks the file closed and leaves it, with the final counts, for readers; it is
    // removed once closed longer than CLOSED_LINGER ago.
    drop(metrics);
    ds.close();
    let closed = scan(dir.path());
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].liveness, Liveness::Closed);
    assert_eq!(closed[0].cores, s.cores);
    assert!(remove_stale(dir.path()).unwrap().is_empty());
    let long_ago = SystemTime::now() - CLOSED_LINGER - Duration::from_secs(1);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    assert_eq!(remove_stale(dir.path()).unwrap(), vec![path.clone()]);
    assert!(!path.exists());
}

/// The implicit-async pool's workers record executions of one core and model at once, beside
/// submitters counting refusals: the counter words are plain loads and stores under the
/// writers' lock, and none of their updates is lost.
#[test]
fn concurrent_writers_of_one_core_and_model_lose_no_update() {
    let ds = Arc::new(Datastore::private(&[vec![0]], 1).unwrap());
    let slot = ds.model_loaded(1, 0, "m", [0; 16], 0).unwrap();
    let metrics = Arc::new(Metrics::with_datastore(ds.clone(), 1));
    const THREADS: u64 = 4;
    const EACH: u64 = 20_000;
    let resp = [TpbResponse {
        device_ts_ns: 0,
        nc_ns: 1_000,
        error_flags: 0,
    }];
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let metrics = metrics.clone();
            s.spawn(move || {
                for i in 0..EACH {
                    if t % 2 == 0 || i % 4 != 0 {
                        metrics.record_completion(
                            0,
                            &[0],
                            Some(slot),
                            NrtStatus::Success,
                            Duration::from_nanos(1_000 + i),
                            &resp,
                        );
                    } else {
                        metrics.record_refusal(0, Some(slot), NrtStatus::Invalid);
                    }
                }
            });
        }
    });
    let refused = (THREADS / 2) * EACH / 4;
    let ran = THREADS * EACH - refused;
    let s = ds.snapshot();
    let core = &s.cores[0];
    assert_eq!(core.executions.get(NrtStatus::Success), ran);
    assert_eq!(core.executions.get(NrtStatus::Invalid), refused);
    assert_eq!(core.total_latency.count, ran);
    assert_eq!(
        core.total_latency.sum_ns,
        THREADS * (0..EACH).map(|i| 1_000 + i).sum::<u64>()
            - (THREADS / 2)
                * (0..EACH)
                    .filter(|i| i % 4 == 0)
                    .map(|i| 1_000 + i)
                    .sum::<u64>()
    );
    assert_eq!(
        (core.total_latency.min_ns, core.total_latency.max_ns),
        (1_000, 1_000 + EACH - 1)
    );
    assert_eq!(core.tpbs[0].busy_ns, ran * 1_000);
    assert_eq!(core.tpbs[0].nc_latency.count, ran);
    let model = &s.models[0];
    assert_eq!(model.executions.get(NrtStatus::Success), ran);
    assert_eq!(model.executions.get(NrtStatus::Invalid), refused);
    assert_eq!(model.total_latency.count, ran);
}

#[test]
fn model_slots_are_reused_least_recently_unloaded_first_and_start_over() {
    let ds = Datastore::private(&[vec![0]], 1).unwrap();
    let slots: Vec<ModelSlot> = (0..MODEL_SLOTS as u64)
        .map(|id| {
            ds.model_loaded(id, 0, &format!("m{id}"), [0; 16], 10)
                .unwrap()
        })
        .collect();
    assert_eq!(
        ds.model_loaded(999, 0, "one too many", [0; 16], 1),
        None,
        "all slots loaded"
    );
    ds.record_model(slots[5], NrtStatus::Success, Duration::from_micros(5));
    ds.record_model(slots[5], NrtStatus::Success, Duration::from_micros(5));
    ds.model_unloaded(slots[9]);
    ds.model_unloaded(slots[5]);
    let s = ds.snapshot();
    let m5 = s.models.iter().find(|m| m.id == 5).unwrap();
    assert!(!m5.loaded);
    assert_eq!(m5.memory_bytes, 0);
    assert_eq!(
        m5.executions.get(NrtStatus::Success),
        2,
        "counts survive unload"
    );
    assert_eq!(
        s.models.iter().filter(|m| m.loaded).count(),
        MODEL_SLOTS - 2
    );
    assert!(
        !s.models.last().unwrap().loaded,
        "loaded models are listed first"
    );
    // The slot unloaded first (9) is reused first; then 5.
    let a = ds.model_loaded(100, 0, "new-a", [0; 16], 7).unwrap();
    assert_eq!(a, slots[9]);
    let b = ds.model_loaded(101, 0, "new-b", [0; 16], 7).unwrap();
    assert_eq!(b, slots[5]);
    let s = ds.snapshot();
    assert!(s.models.iter().all(|m| m.id != 5 && m.id != 9));
    let nb = s.models.iter().find(|m| m.id == 101).unwrap();
    assert_eq!((nb.name.as_str(), nb.loaded), ("new-b", true));
    assert_eq!(nb.executions.total(), 0, "a reused slot starts over");
    assert_eq!(nb.total_latency.count, 0);
    assert_eq!(nb.total_latency.min_ns, u64::MAX);
    // A name longer than the slot is cut to 63 bytes.
    ds.model_unloaded(a);
    let long = "x".repeat(100);
    ds.model_loaded(102, 0, &long, [0; 16], 1).unwrap();
    let s = ds.snapshot();
    assert_eq!(
        s.models.iter().find(|m| m.id == 102).unwrap().name,
        "x".repeat(63)
    );
}

/// The name of model `id` in the race test: 63 copies of one letter that `id` determines.
fn racing_name(id: u64) -> String {
    let letter = char::from(b'a' + u8::try_from(id % 26).unwrap());
    std::iter::repeat_n(letter, 63).collect()
}

#[test]
fn a_reader_racing_slot_reassignment_never_sees_a_torn_slot() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Arc::new(Datastore::create(dir.path(), &[vec![0]], 1).unwrap());
    let path = ds.path().unwrap().to_path_buf();
    // Every slot but one stays loaded, so load/unload keeps reassigning that one.
    for id in 0..(MODEL_SLOTS as u64 - 1) {
        ds.model_loaded(1_000_000 + id, 0, "steady", [0; 16], 1)
            .unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ds, stop) = (ds.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut id = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let slot = ds
                    .model_loaded(id, 0, &racing_name(id), [0; 16], id)
                    .unwrap();
                ds.model_unloaded(slot);
                id += 1;
            }
            id
        })
    };
    let deadline = Instant::now() + Duration::from_millis(300);
    let (mut reads, mut retries) = (0u64, 0u64);
    while Instant::now() < deadline {
        let s = read_file(&path).unwrap();
        retries += u64::from(s.read_retries);
        for m in s.models.iter().filter(|m| m.id < 1_000_000) {
            assert_eq!(m.name, racing_name(m.id), "torn slot: {m:?}");
            if m.loaded {
                assert_eq!(m.memory_bytes, m.id, "torn slot: {m:?}");
            }
        }
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let reassigned = writer.join().unwrap();
    assert!(
        reads > 10 && reassigned > 10,
        "{reads} reads, {reassigned} reassignments"
    );
    eprintln!("{reads} reads, {reassigned} reassignments, {retries} seqlock retries");
}

/// Copies `src` to `dir/name` with the u32 at `offset` replaced by `value`.
fn patched(src: &Path, dir: &Path, name: &str, offset: usize, value: &[u8]) -> PathBuf {
    let mut bytes = std::fs::read(src).unwrap();
    bytes[offset..offset + value.len()].copy_from_slice(value);
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn a_dead_or_reused_pid_is_stale_and_removed_by_remove_stale() {
    let src_dir = tempfile::tempdir().unwrap();
    let ds = Datastore::create(src_dir.path(), &[vec![0]], 1).unwrap();
    let src = ds.path().unwrap().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_pid();
    let dead_file = patched(
        &src,
        dir.path(),
        &format!("{DATASTORE_FILE_PREFIX}{dead}"),
        16,
        dead.as_bytes(),
    );
    // Our pid, another start time: the pid was reused.
    let start = proc_stat::start_time(std::process::id()).unwrap();
    let reused_file = patched(
        &src,
        dir.path(),
        &format!("{DATASTORE_FILE_PREFIX}{}.7", std::process::id()),
        24,
        (start + 1).as_bytes(),
    );
    let live_file = patched(
        &src,
        dir.path(),
        &format!("{DATASTORE_FILE_PREFIX}{}.8", std::process::id()),
        0,
        b"N",
    );
    assert_eq!(read_file(&dead_file).unwrap().liveness, Liveness::Stale);
    assert_eq!(read_file(&dead_file).unwrap().pid, dead);
    assert_eq!(read_file(&reused_file).unwrap().liveness, Liveness::Stale);
    assert_eq!(read_file(&live_file).unwrap().liveness, Liveness::Live);
    assert_eq!(scan(dir.path()).len(), 3, "stale files are still shown");
    let mut removed = remove_stale(dir.path()).unwrap();
    removed.sort();
    let mut expected = vec![dead_file.clone(), reused_file.clone()];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(live_file.exists());
    // The next datastore created in a directory clears its stale files too.
    let dead_again = patched(
        &src,
        dir.path(),
        &format!("{DATASTORE_FILE_PREFIX}{dead}"),
        16,
        dead.as_bytes(),
    );
    let mine = Datastore::create(dir.path(), &[vec![0]], 1).unwrap();
    assert!(!dead_again.exists());
    assert!(mine.path().unwrap().exists());
    // A closed file is closed even while its writer lives, and lingers (freshly stamped).
    let closed = patched(
        &src,
        dir.path(),
        &format!("{DATASTORE_FILE_PREFIX}{}.9", std::process::id()),
        40,
        2u64.as_bytes(),
    );
    assert_eq!(read_file(&closed).unwrap().liveness, Liveness::Closed);
    assert!(remove_stale(dir.path()).unwrap().is_empty());
    assert!(closed.exists());
}

#[test]
fn short_foreign_and_corrupt_files_are_typed_errors_and_scan_skips_them() {
    let src_dir = tempfile::tempdir().unwrap();
    let ds = Datastore::create(src_dir.path(), &[vec![0], vec![1]], 1).unwrap();
    let src = ds.path().unwrap().to_path_buf();
    let good = std::fs::read(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(format!("{DATASTORE_FILE_PREFIX}{name}"));
        std::fs::write(&p, bytes).unwrap();
        p
    };
    type Case = (PathBuf, fn(&ReadError) -> bool);
    let cases: Vec<Case> = vec![
        (put("empty", &[]), |e| {
            matches!(e, ReadError::TooShort { .. })
        }),
        (put("short", &good[..100]), |e| {
            matches!(e, ReadError::TooShort { .. })
        }),
        (put("truncated", &good[..good.len() - 8]), |e| {
            matches!(e, ReadError::TooShort { .. })
        }),
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}magic"),
                0,
                b"ELF\x7f",
            ),
            |e| matches!(e, ReadError::BadMagic { .. }),
        ),
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}version"),
                8,
                99u32.as_bytes(),
            ),
            |e| matches!(e, ReadError::Version { found: 99 }),
        ),
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}init"),
                40,
                0u64.as_bytes(),
            ),
            |e| matches!(e, ReadError::Initialising),
        ),
        // core_count far beyond the file.
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}cores"),
                56,
                4000u32.as_bytes(),
            ),
            |e| matches!(e, ReadError::TooShort { .. }),
        ),
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}huge"),
                56,
                u32::MAX.as_bytes(),
            ),
            |e| matches!(e, ReadError::Layout(_)),
        ),
        // A record size smaller than this reader's record.
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}recsize"),
                60,
                8u32.as_bytes(),
            ),
            |e| matches!(e, ReadError::Layout(_)),
        ),
        // A misaligned table offset.
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}offset"),
                80,
                0x1001u64.as_bytes(),
            ),
            |e| matches!(e, ReadError::Layout(_)),
        ),
        // A core whose TPB range runs past the TPB table (core 1's first_tpb at 392 + 5352 + 12).
        (
            patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}tpbrange"),
                392 + 5352 + 12,
                5u32.as_bytes(),
            ),
            |e| matches!(e, ReadError::Layout(_)),
        ),
    ];
    for (path, expected) in &cases {
        let e = read_file(path).expect_err(&path.display().to_string());
        assert!(expected(&e), "{}: {e}", path.display());
    }
    let ok = put("good", &good);
    let found = scan(dir.path());
    assert_eq!(found.len(), 1, "only the good file is read");
    assert_eq!(found[0].cores.len(), 2);
    let detailed = scan_detailed(dir.path()).unwrap();
    assert_eq!(detailed.len(), cases.len() + 1);
    assert!(detailed.iter().any(|(p, r)| *p == ok && r.is_ok()));
    // A missing directory is no datastores, not a panic.
    assert!(scan(&dir.path().join("absent")).is_empty());
}

#[test]
fn a_slot_left_locked_by_a_dead_writer_is_skipped_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Datastore::create(dir.path(), &[vec![0]], 1).unwrap();
    ds.model_loaded(1, 0, "a", [0; 16], 1).unwrap();
    ds.model_loaded(2, 0, "b", [0; 16], 1).unwrap();
    let src = ds.path().unwrap().to_path_buf();
    let other = tempfile::tempdir().unwrap();
    // Slot 0's seq word odd: a writer killed inside the seqlock.
    let (_, _, model_offset, _) = shared::datastore::layout_of(1, 1);
    let p = patched(
        &src,
        other.path(),
        "nrt-datastore-x",
        model_offset,
        1u64.as_bytes(),
    );
    let s = read_file(&p).unwrap();
    assert_eq!(s.models.iter().map(|m| m.id).collect::<Vec<_>>(), vec![2]);
    assert!(s.read_retries > 0);
}

/// The datastore's file is reserved, not sparse: every block is allocated before it is mapped,
/// so a full filesystem is an error at creation rather than a SIGBUS at the first store.
#[test]
fn the_file_is_reserved_block_for_block_before_it_is_mapped() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let file = File::create(dir.path().join("f")).unwrap();
    let size = 1 << 20;
    super::reserve(&file, size).unwrap();
    let meta = file.metadata().unwrap();
    assert_eq!(meta.len(), size as u64);
    assert!(
        meta.blocks() * 512 >= size as u64,
        "{} bytes allocated of {size}",
        meta.blocks() * 512
    );
}

/// A writer in another PID namespace (a container sharing `/dev/shm` with the host): its pid
/// is not this namespace's, so `/proc` calls it dead, but it holds its file's lock, and the
/// file is live — not removed by the next init here, as it was.
#[test]
fn a_live_file_whose_pid_proc_cannot_show_is_live_while_its_lock_is_held() {
    let src_dir = tempfile::tempdir().unwrap();
    let ds = Datastore::create(src_dir.path(), &[vec![0]], 1).unwrap();
    let src = ds.path().unwrap().to_path_buf();
    assert!(
        reader::writer_holds_lock(&File::open(&src).unwrap()),
        "the writer holds its file's lock"
    );
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_pid();
    let other = patched(
        &src,
        dir.path(),
        &format!("{DATASTORE_FILE_PREFIX}{dead}"),
        16,
        dead.as_bytes(),
    );
    // The other namespace's writer, holding the lock.
    let held = nix::fcntl::Flock::lock(
        File::open(&other).unwrap(),
        nix::fcntl::FlockArg::LockExclusive,
    )
    .unwrap();
    assert_eq!(read_file(&other).unwrap().liveness, Liveness::Live);
    assert!(remove_stale(dir.path()).unwrap().is_empty());
    assert!(other.exists());
    // Its writer gone (the lock goes with it): stale, and removed.
    drop(held);
    assert_eq!(read_file(&other).unwrap().liveness, Liveness::Stale);
    assert_eq!(remove_stale(dir.path()).unwrap(), vec![other.clone()]);
    drop(ds);
    assert!(!reader::writer_holds_lock(&File::open(&src).unwrap()));
}

/// Closed files linger within a byte budget: beyond it the oldest go, at once (a loop of
/// init/close filled a small `/dev/shm` with a minute of closed files).
#[test]
fn closed_files_beyond_the_budget_go_oldest_first() {
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let src_dir = tempfile::tempdir().unwrap();
    let ds = Datastore::create(src_dir.path(), &[vec![0]], 1).unwrap();
    let src = ds.path().unwrap().to_path_buf();
    let size = std::fs::metadata(&src).unwrap().len();
    let fit = usize::try_from(CLOSED_BUDGET / size).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    // `fit + 5` closed files of this process, file `i` closed `i` seconds ago (all within the
    // linger).
    let files: Vec<PathBuf> = (0..fit + 5)
        .map(|i| {
            let p = patched(
                &src,
                dir.path(),
                &format!("{DATASTORE_FILE_PREFIX}{}.{}", std::process::id(), i + 1),
                40,
                2u64.as_bytes(),
            );
            let at = now - Duration::from_secs(u64::try_from(i).unwrap());
            let ts = TimeSpec::from_duration(at.duration_since(UNIX_EPOCH).unwrap());
            utimensat(
                nix::fcntl::AT_FDCWD,
                &p,
                &ts,
                &ts,
                UtimensatFlags::FollowSymlink,
            )
            .unwrap();
            p
        })
        .collect();
    assert_eq!(read_file(&files[0]).unwrap().liveness, Liveness::Closed);
    let mut removed = remove_stale(dir.path()).unwrap();
    removed.sort();
    let mut oldest = files[fit..].to_vec();
    oldest.sort();
    assert_eq!(
        removed, oldest,
        "the 5 oldest beyond {fit} files of {size} bytes"
    );
    assert!(files[..fit].iter().all(|p| p.exists()));
    assert!(
        remove_stale(dir.path()).unwrap().is_empty(),
        "within the budget now"
    );
}
