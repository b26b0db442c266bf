//! The operator tools over real runtime processes: two `datastore-writer` processes execute on a
//! shared simdev, each publishing its counters in its datastore; `nrt monitor` reads them.
//! Their counts in the monitor's last document match what each process reports; a SIGKILLed
//! writer leaves a stale file that breaks no reader and the next runtime removes; a closed
//! runtime's counts are counted once more by a running monitor, then it is gone.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use serde_json::Value;
use tests::start_simdev;

/// The `nrt` binary of this build (`target/<profile>/nrt`, built by `cargo test --workspace`).
fn nrt_program() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let program = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("nrt");
    assert!(
        program.is_file(),
        "nrt not found at {} (run `cargo test --workspace`)",
        program.display()
    );
    program
}

/// A runtime process that executed and is holding its runtime open until `close`.
struct RuntimeClient {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
    /// Executions it reported.
    executions: u64,
}

impl RuntimeClient {
    fn spawn(socket: &Path, datastore: &Path, cores: &str, executions: u64) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_datastore-writer"))
            .arg(executions.to_string())
            .env("NEURON_SIMDEV_SOCKET", socket)
            .env("NEURON_RT_DATASTORE_DIR", datastore)
            .env("NEURON_RT_VISIBLE_CORES", cores)
            .env_remove("NEURON_RT_BACKEND")
            .env_remove("NEURON_LOGICAL_NC_CONFIG")
            .env_remove("NEURON_RT_DATASTORE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("datastore-writer starts");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("its report");
        let reported: u64 = line
            .strip_prefix("executed ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("datastore-writer's report: {line:?}"));
        assert_eq!(reported, executions);
        Self {
            child,
            stdin,
            stdout,
            executions: reported,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes the runtime (EOF on stdin) and waits for the process.
    fn close(mut self) {
        drop(self.stdin.take());
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "closed");
        assert!(self.child.wait().unwrap().success());
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for RuntimeClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nrt monitor --period P --count N` on `datastore` (and simdev at `socket`): its documents.
fn monitor(socket: &Path, datastore: &Path, period: &str, count: u32) -> Vec<Value> {
    let out = Command::new(nrt_program())
        .args(["monitor", "--period", period, "--count", &count.to_string()])
        .env("NEURON_SIMDEV_SOCKET", socket)
        .env("NEURON_RT_DATASTORE_DIR", datastore)
        .stdin(Stdio::null())
        .output()
        .expect("nrt monitor runs");
    assert!(
        out.status.success(),
        "nrt monitor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| {
            panic!(
                "not a stream of JSON documents ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
    assert_eq!(docs.len(), count as usize, "one document per period");
    docs
}

/// The `neuron_runtime_data` entry of `pid` in `doc`.
fn runtime_entry(doc: &Value, pid: u32) -> Option<&Value> {
    doc["neuron_runtime_data"]
        .as_array()?
        .iter()
        .find(|r| r["pid"].as_u64() == Some(u64::from(pid)))
}

/// `execution_summary.completed` of `pid` summed over `docs`.
fn completed_over(docs: &[Value], pid: u32) -> u64 {
    docs.iter()
        .filter_map(|d| runtime_entry(d, pid))
        .map(|e| {
            e["report"]["execution_stats"]["execution_summary"]["completed"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

fn datastore_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn monitor_sees_two_runtime_processes_and_their_counts_match_their_reports() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dir = tempfile::tempdir().unwrap();
    let a = RuntimeClient::spawn(sim.socket(), dir.path(), "0", 200);
    let b = RuntimeClient::spawn(sim.socket(), dir.path(), "1", 300);
    assert_eq!(datastore_files(dir.path()).len(), 2, "one datastore each");
    let docs = monitor(sim.socket(), dir.path(), "100ms", 10);
    for doc in &docs {
        assert!(runtime_entry(doc, a.pid()).is_some(), "a in every document");
        assert!(runtime_entry(doc, b.pid()).is_some(), "b in every document");
    }
    let last = docs.last().unwrap();
    for (client, core) in [(&a, "0"), (&b, "1")] {
        // neuron-monitor's counts are the period's; the first period of a process starts at
        // its nrt_init, so the documents' sum is everything it did.
        assert_eq!(
            completed_over(&docs, client.pid()),
            client.executions,
            "the monitor's count of {} matches its own report",
            client.pid()
        );
        let first = &runtime_entry(&docs[0], client.pid()).unwrap()["report"];
        let stats = &first["execution_stats"];
        assert_eq!(
            stats["execution_summary"]["completed"].as_u64(),
            Some(client.executions),
            "all of it before the first document: {stats}"
        );
        let entry = runtime_entry(last, client.pid()).unwrap();
        assert_eq!(entry["error"], "", "{entry}");
        let report = &entry["report"];
        for class in [
            "generic",
            "numerical",
            "transient",
            "model",
            "runtime",
            "hardware",
        ] {
            assert_eq!(stats["error_summary"][class].as_u64(), Some(0), "{class}");
        }
        let p50 = stats["latency_stats"]["total_latency"]["p50"].as_f64();
        assert_eq!(
            report["execution_stats"]["latency_stats"]["total_latency"],
            Value::Null,
            "no executions in the last period: no latency"
        );
        assert!(p50.is_some_and(|s| s > 0.0 && s < 1.0), "{stats}");
        let cores = &report["neuroncore_counters"]["neuroncores_in_use"];
        assert!(cores.get(core).is_some(), "core {core} in use: {cores}");
        assert_eq!(
            cores.as_object().map(serde_json::Map::len),
            Some(1),
            "only its own core: {cores}"
        );
        let used = &report["memory_used"]["neuron_runtime_used_bytes"]["neuron_device"];
        assert!(
            used.as_u64().is_some_and(|b| b > 0),
            "{}",
            report["memory_used"]
        );
    }
    a.close();
    b.close();
    let docs = monitor(sim.socket(), dir.path(), "50ms", 1);
    assert!(
        docs[0]["neuron_runtime_data"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "runtimes closed before the monitor started are not shown: {}",
        docs[0]
    );
}

/// A monitor that is running while runtimes come and go counts every execution once: one that
/// lived and closed between two samples, and one whose last executions came after the sample
/// before its close (the closed datastore lingers with its final counts).
#[test]
fn the_monitor_counts_the_executions_of_runtimes_that_closed_between_its_samples() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(nrt_program())
        .args(["monitor", "--period", "200ms"])
        .env("NEURON_SIMDEV_SOCKET", sim.socket())
        .env("NEURON_RT_DATASTORE_DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("nrt monitor runs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut docs = Vec::new();
    let mut next_doc = |docs: &mut Vec<Value>| {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        docs.push(serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
    };
    // The monitor has sampled (its baseline) before either runtime starts.
    next_doc(&mut docs);
    let short = RuntimeClient::spawn(sim.socket(), dir.path(), "0", 25);
    let short_pid = short.pid();
    short.close();
    let long = RuntimeClient::spawn(sim.socket(), dir.path(), "1", 40);
    let long_pid = long.pid();
    next_doc(&mut docs);
    long.close();
    // Two more samples, both taken after the closes.
    next_doc(&mut docs);
    next_doc(&mut docs);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(completed_over(&docs, short_pid), 25, "{docs:#?}");
    assert_eq!(completed_over(&docs, long_pid), 40, "{docs:#?}");
    // Reported closed once, then gone.
    assert!(runtime_entry(docs.last().unwrap(), short_pid).is_none());
    assert!(runtime_entry(docs.last().unwrap(), long_pid).is_none());
}

#[test]
fn a_sigkilled_writer_is_stale_breaks_no_reader_and_the_next_runtime_clears_it() {
    let sim = start_simdev(&["--hbm", "64M"]);
    let dir = tempfile::tempdir().unwrap();
    let killed = RuntimeClient::spawn(sim.socket(), dir.path(), "0", 50);
    let killed_pid = killed.pid();
    killed.kill();
    assert_eq!(
        datastore_files(dir.path()).len(),
        1,
        "SIGKILL left its file"
    );
    let docs = monitor(sim.socket(), dir.path(), "50ms", 2);
    for doc in &docs {
        if let Some(entry) = runtime_entry(doc, killed_pid) {
            assert_ne!(
                entry["error"], "",
                "a dead writer is not reported live: {entry}"
            );
        }
    }
    let live = RuntimeClient::spawn(sim.socket(), dir.path(), "1", 20);
    assert_eq!(
        datastore_files(dir.path()).len(),
        1,
        "the next runtime removed the dead writer's file"
    );
    let docs = monitor(sim.socket(), dir.path(), "50ms", 2);
    assert_eq!(completed_over(&docs, live.pid()), 20);
    assert!(runtime_entry(docs.last().unwrap(), killed_pid).is_none());
    live.close();
    let _ = std::io::stdout().flush();
}
