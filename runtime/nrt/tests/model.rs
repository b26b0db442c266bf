//! `nrt model` through the real binary: the container it writes, and its refusal of a model
//! the runtime's default configuration could not load.

use std::process::Command;

#[test]
fn a_model_too_large_for_the_runtimes_io_rings_is_refused_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = |bytes: &str, out: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_nrt"))
            .args(["model", "identity", "--bytes", bytes, "--out"])
            .arg(out)
            .output()
            .expect("nrt runs")
    };
    // 64 MiB in 64 KiB descriptors: 1024 per execution, where the ring holds 963 per execution
    // with the default 16 in flight. nrt_load would refuse it (NRT_RESOURCE).
    let refused = dir.path().join("64m.model");
    let o = run("67108864", &refused);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("the runtime would refuse to load this model")
            && stderr.contains("at most 63111168 bytes per execution"),
        "{stderr}"
    );
    assert!(!refused.exists(), "nothing written");
    let written = dir.path().join("32m.model");
    let o = run("33554432", &written);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::metadata(&written).unwrap().len() > 0);
}
