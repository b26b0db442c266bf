//! A runtime under the process limits CI containers set: the library's own files never end
//! the process. A datastore file larger than `ulimit -f` allows is refused before it is sized
//! (the kernel's SIGXFSZ ended the program), and the counters stay private.

mod common;

use std::process::Command;

use common::*;

#[test]
fn a_datastore_above_the_file_size_limit_is_refused_and_the_bench_runs() {
    let sim = start_simdev(&[]);
    let store = tempfile::tempdir().unwrap();
    // `sh` counts `ulimit -f` in blocks of 512 or 1024 bytes: 100 blocks is at most 100 KiB,
    // under the datastore's size; only this process is limited (simdev runs apart).
    let bench = nrt_command(sim.socket());
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("ulimit -f 100 && exec \"$0\" \"$@\"")
        .arg(bench.get_program())
        .args([
            "bench",
            "--model",
            "identity",
            "--iterations",
            "20",
            "--json",
        ])
        .envs(bench.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env("NEURON_RT_DATASTORE_DIR", store.path());
    for (k, v) in bench.get_envs() {
        if v.is_none() {
            c.env_remove(k);
        }
    }
    let out = c.output().expect("sh runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "nrt bench under ulimit -f 100: {:?}: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("ulimit -f"),
        "the refusal names the limit: {stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["executions"], 20, "{report}");
    assert_eq!(report["failures"], 0, "{report}");
    assert_eq!(
        std::fs::read_dir(store.path()).unwrap().count(),
        0,
        "no datastore file (nor its temporary) is left"
    );
}

/// Too few descriptors for the runtime's eventfds is NRT_RESOURCE naming the limit (it was
/// NRT_FAILURE "creating an execution unit", the EMFILE dropped).
#[test]
fn too_low_an_open_file_limit_is_a_resource_error_naming_the_limit() {
    let sim = start_simdev(&[]);
    let bench = nrt_command(sim.socket());
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("ulimit -n 64 && exec \"$0\" \"$@\"")
        .arg(bench.get_program())
        .args(["bench", "--model", "identity", "--iterations", "5"]);
    for (k, v) in bench.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = c.output().expect("sh runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in ["NRT_RESOURCE", "EMFILE", "ulimit -n", "64"] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }
}
