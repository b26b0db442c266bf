//! The C programs of `tests/c/`, compiled with the system compiler against our headers and the
//! built `libnrt.so` (as `libnrt.so.1` in a private prefix), each run against its own private
//! simdev: the library starts it through `NEURON_SIMDEV_BIN`, as any C program on a laptop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The crate's directory.
fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// target/<profile>: where cargo put libnrt.so and simdev.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// A prefix laid out like /opt/aws/neuron: lib/libnrt.so.1 (the built library) with the
/// libnrt.so link, include/ = our headers.
struct Prefix {
    dir: tempfile::TempDir,
}

impl Prefix {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        let built = profile_dir().join("libnrt.so");
        assert!(built.is_file(), "{} not built", built.display());
        std::fs::copy(&built, lib.join("libnrt.so.1")).unwrap();
        std::os::unix::fs::symlink("libnrt.so.1", lib.join("libnrt.so")).unwrap();
        Self { dir }
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("lib")
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Compiles `sources` (in tests/c) into `exe` with `compiler` and `std`, warnings as errors,
/// linking libnrt unless `link_nrt` is false.
fn compile(
    prefix: &Prefix,
    compiler: &str,
    std: &str,
    sources: &[&str],
    exe: &str,
    link_nrt: bool,
) -> PathBuf {
    let out = prefix.out(exe);
    let c = crate_dir().join("tests/c");
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-g"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg("-I")
        .arg(&c);
    for s in sources {
        cmd.arg(c.join(s));
    }
    cmd.arg("-o").arg(&out).arg("-pthread");
    if link_nrt {
        cmd.arg("-L")
            .arg(prefix.lib())
            .arg("-lnrt")
            .arg(format!("-Wl,-rpath,{}", prefix.lib().display()));
    } else {
        cmd.arg("-ldl");
    }
    let o = cmd.output().expect("run the compiler");
    assert!(
        o.status.success(),
        "{compiler} {sources:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs `cmd` with the environment of a laptop without a device: a private simdev from
/// `NEURON_SIMDEV_BIN`.
fn run(mut cmd: Command) -> Output {
    let simdev = tests::simdev_command(&[]).program;
    cmd.env("NEURON_SIMDEV_BIN", simdev)
        .env("NEURON_RT_BACKEND", "sim")
        .env_remove("NEURON_SIMDEV_SOCKET")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .env("NEURON_RT_LOG_LEVEL", "error");
    cmd.output().expect("run the program")
}

fn assert_ran(o: &Output, what: &str, marker: &str) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success() && stdout.contains(marker),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn identity_model() -> PathBuf {
    crate_dir().join("../scenarios/data/identity_512.nrtm")
}

#[test]
fn the_developer_guide_flow_runs_clean_under_valgrind() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["flow.c"], "flow", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "flow", "FLOW OK");
    let valgrind = Command::new("valgrind").arg("--version").output();
    assert!(
        valgrind.is_ok_and(|o| o.status.success()),
        "valgrind is missing: install it (`apt-get install valgrind`; .ci/run does)"
    );
    let o = run({
        let mut c = Command::new("valgrind");
        c.args([
            "--leak-check=full",
            "--errors-for-leak-kinds=definite",
            "--error-exitcode=1",
            "--quiet",
        ])
        .arg(&exe)
        .arg(identity_model());
        c
    });
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_ran(&o, "flow under valgrind", "FLOW OK");
    assert!(!stderr.contains("definitely lost"), "{stderr}");
}

#[test]
fn every_status_gate_answers_from_c() {
    let prefix = Prefix::new();
    let exe = compile(&prefix, "cc", "c11", &["gates.c"], "gates", true);
    let o = run({
        let mut c = Command::new(&exe);
        c.arg(identity_model());
        c
    });
    assert_ran(&o, "gates", "GATES OK");
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Refusals are logged, naming what was wrong.
    assert!(
        stderr.contains("not handed out by this library"),
        "{stderr}"
    );
    assert!(stderr.contains("already freed"), "{stderr}");
    assert!(
        stderr.contains("is a tensor set handle, not a tensor"),
        "{stderr}"
    );
}
