//! `nrt bench --trace FILE`: the runtime's timeline of a benchmark, with a private simdev and
//! with a shared one (`NEURON_SIMDEV_SOCKET`), nests each execution's runtime spans and device
//! events in time order on one clock.

use std::process::Command;

use tests::timeline::check_execution;

/// `nrt bench --model identity --iterations 20 --json --trace FILE` with a private simdev of
/// the defaults (the device variables removed).
fn bench_trace_command(path: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nrt"));
    c.args([
        "bench",
        "--model",
        "identity",
        "--iterations",
        "20",
        "--json",
        "--trace",
    ])
    .arg(path)
    .env_remove("NEURON_SIMDEV_SOCKET")
    .env_remove("NEURON_RT_BACKEND")
    .env_remove("NEURON_LOGICAL_NC_CONFIG")
    .env_remove("NEURON_SIMDEV_ARCH")
    .env_remove("NEURON_RT_TRACE");
    c
}

/// Runs [`bench_trace_command`] with extra environment `env`; returns the file's bytes.
fn bench_trace(env: &[(&str, &str)]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.json");
    let out = bench_trace_command(&path)
        .envs(env.iter().copied())
        .output()
        .expect("nrt runs");
    assert!(
        out.status.success(),
        "nrt bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&path).expect("the trace is written")
}

#[test]
fn bench_trace_nests_runtime_spans_and_device_events_with_a_private_simdev() {
    let bytes = bench_trace(&[]);
    // The first timed executions and the last one.
    for n in [1, 10, 20] {
        check_execution(&bytes, n);
    }
    let t: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let process = events
        .iter()
        .find(|e| {
            e["ph"] == "M" && e["name"] == "process_name" && e["pid"].as_u64() < Some(1 << 22)
        })
        .unwrap();
    assert!(
        process["args"]["name"]
            .as_str()
            .unwrap()
            .starts_with("nrt (pid "),
        "{process}"
    );
}

#[test]
fn bench_trace_works_with_a_shared_simdev() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("simdev.sock");
    let mut simdev = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["simdev", "--socket"])
        .arg(&socket)
        .spawn()
        .expect("simdev starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "simdev did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let bytes = bench_trace(&[("NEURON_SIMDEV_SOCKET", socket.to_str().unwrap())]);
    let _ = simdev.kill();
    let _ = simdev.wait();
    for n in [1, 20] {
        check_execution(&bytes, n);
    }
}

#[test]
fn bench_trace_to_a_path_that_cannot_be_written_fails_first_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().join("missing/bench.json"), dir.path().to_owned()] {
        let out = bench_trace_command(&path).output().expect("nrt runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "--trace {} (as NEURON_RT_TRACE): ",
                path.display()
            )) && stderr.contains(&format!(
                "NEURON_RT_TRACE={}: cannot create the timeline file",
                path.display()
            )),
            "{stderr}"
        );
        assert!(!stderr.contains("trace written"), "{stderr}");
        // Refused before the benchmark ran: no figures, only the error (`--json`).
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let keys: Vec<_> = doc.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["error"], "{doc}");
        assert!(
            stderr.contains(doc["error"].as_str().unwrap()),
            "{doc} / {stderr}"
        );
    }
}
