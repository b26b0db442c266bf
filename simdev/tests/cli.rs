//! The `simdev` binary: its command line and the life cycle of its socket.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::process::Command;

use common::Simdev;
use nix::sys::signal::Signal;

#[test]
fn help_lists_the_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_simdev"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--socket",
        "--arch",
        "--ncs",
        "--hbm",
        "--allow-uid",
        "--trace",
    ] {
        assert!(help.contains(option), "{option} missing from:\n{help}");
    }
}

#[test]
fn bad_arguments_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_simdev"))
        .args(["--ncs", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_stale_socket_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("simdev.sock");
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists(), "the stale socket file stays behind");
    let simdev = Simdev::spawn(&path, &["--arch", "trn2", "--hbm", "64M"]);
    let line = simdev.first_line().expect("no ready line");
    assert_eq!(
        line,
        format!(
            "simdev listening on {} (arch trn2, 8 NCs, 64 MiB HBM per NC)",
            path.display()
        )
    );
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}

#[test]
fn a_second_simdev_on_a_live_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("simdev.sock");
    let _first = Simdev::start(&path, &[]);
    let mut second = Simdev::spawn(&path, &[]);
    let (status, stderr) = second.wait();
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("already listening"), "{stderr}");
    assert!(path.exists(), "the first simdev's socket is left alone");
}

#[test]
fn sigterm_exits_0_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("simdev.sock");
    let mut simdev = Simdev::start(&path, &["--ncs", "1"]);
    simdev.signal(Signal::SIGTERM);
    let (status, stderr) = simdev.wait();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!path.exists());
    assert!(stderr.contains("NC 0: dma_descriptors 0"), "{stderr}");
}

#[test]
fn a_path_that_is_not_a_socket_is_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("precious.txt");
    std::fs::write(&path, "keep me").unwrap();
    let mut simdev = Simdev::spawn(&path, &[]);
    let (status, stderr) = simdev.wait();
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
}

#[test]
fn sigterm_writes_a_valid_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("simdev.sock");
    let trace = dir.path().join("trace.json");
    let trace_arg = trace.to_str().unwrap();
    let mut simdev = Simdev::start(&path, &["--ncs", "2", "--trace", trace_arg]);
    simdev.signal(Signal::SIGTERM);
    let (status, stderr) = simdev.wait();
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.contains("trace: 0 events written to"), "{stderr}");
    let text = std::fs::read_to_string(&trace).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    for nc in 0..2 {
        assert!(
            events.iter().any(|e| e["ph"] == "M"
                && e["pid"] == nc
                && e["args"]["name"] == format!("NC {nc}")),
            "NC {nc} is named: {text}"
        );
    }
    assert!(events.iter().all(|e| e["ph"] == "M"), "nothing ran: {text}");
    assert_eq!(json["otherData"]["dropped_events"], 0);
}

#[test]
fn an_unwritable_trace_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("simdev.sock");
    let mut simdev = Simdev::spawn(&path, &["--trace", "/nonexistent/dir/trace.json"]);
    let (status, stderr) = simdev.wait();
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("writing the trace file"), "{stderr}");
    assert!(!path.exists());
}
