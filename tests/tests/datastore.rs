//! The runtime datastore against a real simdev: a runtime in another process (the
//! `datastore-writer` helper) publishes its counters, this process reads them with
//! `runtime::datastore::scan`; a SIGKILLed writer leaves a stale file that does not break the
//! reader and that the next init in the directory removes; a closed runtime leaves its final
//! counts for readers until the linger ends.
//! Every test points `NEURON_RT_DATASTORE_DIR` at a temp dir of its own.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use runtime::Runtime;
use runtime::config::RuntimeConfig;
use runtime::datastore::snapshot::{Liveness, MemKind};
use runtime::datastore::{scan, scan_detailed};
use runtime::metrics::exec_stat_ordinal;
use shared::NrtStatus;
use tests::bench::IdentityIo;
use tests::{connect, start_simdev};

/// Executions the child runs.
const N: u64 = 25;

/// A datastore-writer child on NC `nc` of `sim`, writing its datastore into `dir`, after it
/// reported `executed N BYTES`; returns it, its stdout and BYTES.
fn spawn_writer(
    sim: &runtime::backend::sim::PrivateSimdev,
    dir: &Path,
    nc: u32,
) -> (Child, BufReader<ChildStdout>, u64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_datastore-writer"))
        .arg(N.to_string())
        .env("NEURON_SIMDEV_SOCKET", sim.socket())
        .env("NEURON_RT_DATASTORE_DIR", dir)
        .env("NEURON_RT_VISIBLE_CORES", nc.to_string())
        .env_remove("NEURON_RT_DATASTORE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(..2), Some(&["executed", "25"][..]), "{line:?}");
    let bytes = words[2].parse().unwrap();
    (child, out, bytes)
}

fn datastore_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The datastore files in `dir` not closed (a closed runtime's lingers for readers).
fn unclosed_files(dir: &Path) -> Vec<String> {
    scan_detailed(dir)
        .unwrap()
        .into_iter()
        .filter(|(_, r)| !matches!(r, Ok(s) if s.liveness == Liveness::Closed))
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_child_runtimes_counts_are_read_and_a_sigkilled_writer_turns_stale() {
    let sim = start_simdev(&["--ncs", "2", "--hbm", "64M"]);
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _out, bytes_used) = spawn_writer(&sim, dir.path(), 1);
    let pid = child.id();

    let found = scan(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    let s = &found[0];
    assert_eq!((s.pid, s.liveness, s.lnc), (pid, Liveness::Live, 1));
    assert!(s.command.contains("datastore-writer"), "{}", s.command);
    assert_eq!(s.cores.len(), 1);
    let core = &s.cores[0];
    assert_eq!(
        (core.vnc, core.logical_id, core.ncs.clone()),
        (0, 1, vec![1])
    );
    assert_eq!(core.executions.get(NrtStatus::Success), N);
    assert_eq!(core.executions.total(), N);
    assert_eq!(core.total_latency.count, N);
    assert!(
        core.total_latency.min_ns > 0 && core.total_latency.max_ns >= core.total_latency.min_ns
    );
    assert_eq!(core.device_latency.count, N);
    // The device's part of an execution lies inside its end-to-end time (simdev times the
    // execution after the doorbell; the runtime stops the clock after the notification): a
    // duration, never the notification's timestamp (simdev's age).
    assert!(
        core.device_latency.max_ns <= core.total_latency.max_ns
            && core.device_latency.sum_ns <= core.total_latency.sum_ns,
        "device (max, sum) {:?} vs total {:?}",
        (core.device_latency.max_ns, core.device_latency.sum_ns),
        (core.total_latency.max_ns, core.total_latency.sum_ns)
    );
    assert_eq!(core.tpbs[0].nc, 1);
    assert_eq!(
        core.tpbs[0].exec_stats[exec_stat_ordinal(NrtStatus::Success)],
        N
    );
    // Memory by kind adds up to what nrt_get_vnc_memory_stats reports, plus the runtime's
    // own queues (runtime_memory), which that call does not count.
    assert!(core.memory.get(MemKind::RuntimeMemory) > 0);
    assert_eq!(
        core.memory.total() - core.memory.get(MemKind::RuntimeMemory),
        bytes_used
    );
    assert!(
        core.memory.get(MemKind::Tensors) >= 128,
        "{:?}",
        core.memory
    );
    assert!(core.memory.get(MemKind::ModelCode) > 0, "{:?}", core.memory);
    assert_eq!(s.models.len(), 1);
    let m = &s.models[0];
    assert!(m.loaded && !m.name.is_empty(), "{m:?}");
    assert_eq!(m.vnc, 0);
    assert_eq!(m.executions.get(NrtStatus::Success), N);
    assert_eq!(
        m.memory_bytes,
        core.memory.total()
            - core.memory.get(MemKind::Tensors)
            - core.memory.get(MemKind::RuntimeMemory)
    );

    // SIGKILL: the file stays, the reader still reads it, as stale, with its last counts.
    child.kill().unwrap();
    child.wait().unwrap();
    let found = scan(dir.path());
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].pid, found[0].liveness), (pid, Liveness::Stale));
    assert_eq!(found[0].cores[0].executions.total(), N);

    // The next runtime initialised in that directory removes the stale file.
    let rt = Runtime::init(
        Arc::new(connect(&sim)),
        RuntimeConfig {
            datastore_dir: Some(dir.path().to_path_buf()),
            visible_cores: Some((0, 1)),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let found = scan(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].pid, found[0].liveness),
        (std::process::id(), Liveness::Live)
    );
    rt.close();
    assert!(unclosed_files(dir.path()).is_empty());
}

#[test]
fn a_closed_runtime_leaves_its_final_counts_for_readers_until_the_linger_ends() {
    let sim = start_simdev(&["--ncs", "2", "--hbm", "64M"]);
    let dir = tempfile::tempdir().unwrap();
    let (mut child, mut out, _) = spawn_writer(&sim, dir.path(), 0);
    let pid = child.id();
    let name = format!("nrt-datastore-{pid}");
    assert_eq!(datastore_files(dir.path()), vec![name.clone()]);
    let live = scan(dir.path());
    assert_eq!(live[0].liveness, Liveness::Live);
    let executed = live[0].cores[0].executions.total();
    child.stdin.take().unwrap().write_all(b"close\n").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "closed");
    assert!(child.wait().unwrap().success());
    // The file stays, closed, with the final counts (what a monitor's last period needs).
    let closed = scan(dir.path());
    assert_eq!(closed.len(), 1);
    assert_eq!((closed[0].pid, closed[0].liveness), (pid, Liveness::Closed));
    assert_eq!(closed[0].cores[0].executions.total(), executed);
    // A runtime initialised in the directory leaves it while it lingers...
    let init = || {
        Runtime::init(
            Arc::new(connect(&sim)),
            RuntimeConfig {
                datastore_dir: Some(dir.path().to_path_buf()),
                visible_cores: Some((1, 1)),
                ..RuntimeConfig::default()
            },
        )
        .unwrap()
    };
    let rt = init();
    assert!(datastore_files(dir.path()).contains(&name));
    rt.close();
    // ... and removes it once closed longer than CLOSED_LINGER ago.
    let path = dir.path().join(&name);
    let long_ago =
        std::time::SystemTime::now() - runtime::datastore::CLOSED_LINGER - Duration::from_secs(1);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    let rt = init();
    assert!(!path.exists(), "{:?}", datastore_files(dir.path()));
    rt.close();
}

#[test]
fn in_process_counts_match_with_the_file_and_without_it() {
    let sim = start_simdev(&["--ncs", "2", "--hbm", "64M"]);
    let dev = Arc::new(connect(&sim));
    for on in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::init(
            dev.clone(),
            RuntimeConfig {
                datastore: on,
                datastore_dir: Some(dir.path().to_path_buf()),
                exec_timeout: Duration::from_secs(10),
                ..RuntimeConfig::default()
            },
        )
        .unwrap();
        assert_eq!(rt.datastore().path().is_some(), on);
        assert_eq!(datastore_files(dir.path()).len(), usize::from(on));
        let io = IdentityIo::load(&rt, 64);
        for _ in 0..7 {
            rt.execute(io.model, &io.inputs, &io.outputs).unwrap();
        }
        let s = rt.datastore().snapshot();
        assert_eq!(s.cores[0].executions.get(NrtStatus::Success), 7);
        assert_eq!(s.models[0].executions.total(), 7);
        let nc = rt.vnc_ncs(0).unwrap()[0] as usize;
        assert_eq!(rt.metrics().snapshot(nc).unwrap().executions(), 7);
        let memory = &s.cores[0].memory;
        assert_eq!(
            memory.total() - memory.get(MemKind::RuntimeMemory),
            rt.vnc_memory_stats(0).unwrap().bytes_used
        );
        if on {
            assert_eq!(scan(dir.path())[0].cores[0].executions.total(), 7);
        }
        // Unload: the slot stays, marked unloaded, its memory released.
        let model = io.model;
        drop(io);
        rt.unload(model).unwrap();
        let s = rt.datastore().snapshot();
        assert!(!s.models[0].loaded);
        assert_eq!(s.models[0].executions.total(), 7);
        let memory = &s.cores[0].memory;
        assert_eq!(
            memory.total(),
            memory.get(MemKind::RuntimeMemory),
            "only the runtime's own queues are left: {memory:?}"
        );
        assert_eq!(rt.vnc_memory_stats(0).unwrap().bytes_used, 0);
        rt.close();
        assert!(unclosed_files(dir.path()).is_empty());
    }
}
