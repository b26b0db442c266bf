//! A runtime under the process limits CI containers set: the library's own files never end
//! the process. A datastore file larger than `ulimit -f` allows is refused before it is sized
//! (the kernel's SIGXFSZ ended the program), and the counters stay private.

mod common;

use std::process::Command;

use common::*;

/// `nrt ARGS` on the simdev at `socket`, run by `sh` under `ulimit LIMIT` (this process
/// only: the simdev runs apart), with `env` on top.
fn nrt_under_ulimit(
    limit: &str,
    socket: &std::path::Path,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Output {
    let nrt = nrt_command(socket);
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("ulimit {limit} && exec \"$0\" \"$@\""))
        .arg(nrt.get_program())
        .args(args);
    for (k, v) in nrt.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.envs(env.iter().copied());
    c.output().expect("sh runs")
}

#[test]
fn a_datastore_above_the_file_size_limit_is_refused_and_the_bench_runs() {
    let sim = start_simdev(&[]);
    let store = tempfile::tempdir().unwrap();
    // `sh` counts `ulimit -f` in blocks of 512 or 1024 bytes: 100 blocks is at most 100 KiB,
    // under the datastore's size; only this process is limited (simdev runs apart).
    let out = nrt_under_ulimit(
        "-f 100",
        sim.socket(),
        &[
            "bench",
            "--model",
            "identity",
            "--iterations",
            "20",
            "--json",
        ],
        &[("NEURON_RT_DATASTORE_DIR", store.path().as_os_str())],
    );
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
    let out = nrt_under_ulimit(
        "-n 64",
        sim.socket(),
        &["bench", "--model", "identity", "--iterations", "5"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in ["NRT_RESOURCE", "EMFILE", "ulimit -n", "64"] {
        assert!(stderr.contains(part), "{part}: {stderr}");
    }
}

/// A shared simdev under a file-size limit too small for its memfds refuses the allocation
/// (EFBIG, named to the client) and keeps running for the next client; the kernel's SIGXFSZ
/// ended it, and every client with it.
#[test]
fn a_simdev_under_a_tiny_file_size_limit_refuses_and_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("simdev.sock");
    // Killed and reaped on drop: a failed assertion below must not leave simdev running.
    let mut sim = Reaped::new(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -f 10 && exec \"$0\" simdev --socket \"$1\"")
            .arg(nrt_bin())
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let t = std::time::Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "simdev listens"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for _ in 0..2 {
        let out = nrt_command(&socket)
            .args(["bench", "--model", "identity", "--iterations", "5"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("NRT_RESOURCE")
                && stderr.contains("EFBIG")
                && stderr.contains("simdev's file-size limit (RLIMIT_FSIZE, ulimit -f) is"),
            "the refusal is NRT_RESOURCE naming EFBIG and simdev's limit: {stderr}"
        );
        assert!(
            sim.0.try_wait().unwrap().is_none(),
            "simdev still runs after: {stderr}"
        );
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(sim.pid()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let mut log = String::new();
    std::io::Read::read_to_string(&mut sim.0.stderr.take().unwrap(), &mut log).unwrap();
    assert!(log.contains("ulimit -f"), "simdev says its limit: {log}");
}

/// A temp directory too long for a unix socket's path (build systems' often are) still gets a
/// private simdev: its socket goes in `/tmp` (it was NRT_HW_ERROR, "ENAMETOOLONG").
#[test]
fn a_temp_directory_too_long_for_a_socket_path_still_starts_a_private_simdev() {
    let base = tempfile::tempdir().unwrap();
    let long = base.path().join("t".repeat(100));
    std::fs::create_dir(&long).unwrap();
    let out = Command::new(nrt_bin())
        .args([
            "bench",
            "--model",
            "identity",
            "--iterations",
            "5",
            "--json",
        ])
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_BACKEND")
        .env("TMPDIR", &long)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["failures"], 0, "{report}");
}
