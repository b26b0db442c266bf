//! Reference-backed NEFF runs (issue 15): the real simdev binary started with `--reference`,
//! running matmul_small's outputs with a Python reference in its worker process, through the
//! unchanged runtime (sync and the explicit async pipeline, device and host tensors, trn2
//! LNC=2); misbehaving references each end one execution with 1004 and the reference's message
//! and simdev keeps serving; matmul_large's 4 GiB input is mapped by the worker, not read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use half::f16;
use runtime::config::RuntimeConfig;
use runtime::{Placement, ReadBuffer, Runtime};
use shared::NrtStatus;
use shared::neff_program::shape_only::splitmix64;
use shared::protocol::{NcCounters, Reply, Request};
use tests::matmul_neff::{SMALL, io};
use tests::{RawClient, connect, start_simdev};

fn neff_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../scenarios/data/neff/{name}.neff"))
}

fn example_reference() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../simdev/python/ref_matmul.py")
}

/// A runtime at LNC=2 on a private trn2 simdev started with `args`.
fn runtime(args: &[&str], hbm: Option<&str>) -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    runtime_timing_out(args, hbm, Duration::from_secs(60))
}

/// [`runtime`] with an execution timeout of `exec_timeout`.
fn runtime_timing_out(
    args: &[&str],
    hbm: Option<&str>,
    exec_timeout: Duration,
) -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    let mut all = vec!["--arch", "trn2"];
    if let Some(h) = hbm {
        all.extend(["--hbm", h]);
    }
    all.extend(args);
    let sim = start_simdev(&all);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        lnc: Some(2),
        exec_timeout,
        ..RuntimeConfig::default()
    };
    (Runtime::init(dev, cfg).unwrap(), sim)
}

fn binding(neff: &str, module: &Path, function: &str) -> String {
    format!(
        "{}={}:{function}",
        neff_path(neff).display(),
        module.display()
    )
}

/// Deterministic float16 values in [-2, 2) for input `salt` of execution `e`.
fn values(n: usize, salt: u64, e: u64) -> Vec<f16> {
    let seed = splitmix64(salt.wrapping_mul(0x1_0000).wrapping_add(e));
    (0..n)
        .map(|i| {
            let r = splitmix64(seed.wrapping_add(i as u64)) >> 40; // 24 bits
            f16::from_f32((r as f32 / (1u64 << 24) as f32) * 4.0 - 2.0)
        })
        .collect()
}

fn bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}

fn halves(b: &[u8]) -> Vec<f16> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// x[128,256] @ y[256,128] in f32 from the f16 inputs (`matrixmultiply`, optimised even in
/// test builds, so 300 products stay cheap).
fn matmul_f32(x: &[f16], y: &[f16]) -> Vec<f32> {
    let (m, k, n) = (128usize, 256usize, 128usize);
    let xf: Vec<f32> = x.iter().map(|h| h.to_f32()).collect();
    let yf: Vec<f32> = y.iter().map(|h| h.to_f32()).collect();
    let mut out = vec![0f32; m * n];
    let (rs_a, rs_b, rs_c) = (k as isize, n as isize, n as isize);
    // SAFETY: the three buffers hold m*k, k*n and m*n f32s laid out row-major with the
    // strides given, and `out` is not aliased.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            xf.as_ptr(),
            rs_a,
            1,
            yf.as_ptr(),
            rs_b,
            1,
            0.0,
            out.as_mut_ptr(),
            rs_c,
            1,
        );
    }
    out
}

/// Every element of `got` within relative tolerance 1e-3 of `want` (plus float16's absolute
/// resolution near zero).
fn assert_close(got: &[f16], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32();
        // float16 keeps 11 significant bits: a rounding error of 2^-11 relative, plus the
        // absolute step of subnormals near zero.
        let tol = 1e-3 * w.abs() + 2f32.powi(-11) * w.abs().max(1.0);
        assert!(
            (g - w).abs() <= tol,
            "{what}: output0[{i}] = {g}, x @ y = {w}"
        );
    }
}

/// Writes execution `e`'s x and y, executes synchronously, and checks output0 against x @ y.
fn execute_and_check(
    rt: &Runtime,
    h: runtime::ModelHandle,
    t: &tests::matmul_neff::MatmulIo,
    e: u64,
    what: &str,
) {
    let (x, y) = (values(128 * 256, 1, e), values(256 * 128, 2, e));
    t.x.write(&bytes(&x), 0).unwrap();
    t.y.write(&bytes(&y), 0).unwrap();
    rt.execute(h, &t.ins, &t.outs).unwrap();
    let mut out = vec![0u8; 32768];
    t.out.read(&mut out, 0).unwrap();
    assert_close(&halves(&out), &matmul_f32(&x, &y), what);
}

#[test]
fn matmul_small_with_the_example_reference_computes_x_at_y_sync_and_async() {
    let spec = binding("matmul_small", &example_reference(), "matmul");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let trace_arg = trace.to_str().unwrap();
    let (rt, mut sim) = runtime(&["--reference", &spec, "--trace", trace_arg], Some("1G"));
    let h = rt
        .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
        .unwrap();
    for placement in [Placement::Device { vnc: 0 }, Placement::Host] {
        let t = io(&rt, placement, SMALL);
        for e in 0..100 {
            execute_and_check(&rt, h, &t, e, &format!("sync {placement:?} execution {e}"));
        }
    }
    // The explicit async pipeline: writes on the tensor-op XU, the execution scheduled on the
    // compute XU, the read on the tensor-op XU, each waited for before the next is scheduled.
    let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
    let dest = ReadBuffer::new(32768).unwrap();
    for e in 100..200 {
        let (x, y) = (values(128 * 256, 1, e), values(256 * 128, 2, e));
        let wx = rt.tensor_write_schedule(&t.x, &bytes(&x), 0, 0, 0).unwrap();
        let wy = rt.tensor_write_schedule(&t.y, &bytes(&y), 0, 0, 0).unwrap();
        assert_eq!(rt.wait(&wx).unwrap(), NrtStatus::Success);
        assert_eq!(rt.wait(&wy).unwrap(), NrtStatus::Success);
        let ex = rt.execute_schedule(h, &t.ins, &t.outs).unwrap();
        assert_eq!(rt.wait(&ex).unwrap(), NrtStatus::Success, "execution {e}");
        let r = rt
            .tensor_read_schedule(&dest, &t.out, 0, 32768, 0, 0)
            .unwrap();
        assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
        assert_close(
            &halves(&dest.to_vec().unwrap()),
            &matmul_f32(&x, &y),
            &format!("async execution {e}"),
        );
    }
    // `ps` shows the worker by name, not its whole embedded script.
    let workers = children(sim.pid());
    assert_eq!(workers.len(), 1, "one reference worker: {workers:?}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", workers[0])).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.trim_end().ends_with("simdev-reference-worker") && cmdline.len() < 300,
        "{cmdline}"
    );
    drop(t);
    rt.unload(h).unwrap();
    rt.close();
    // 300 executions on each NC of the vNC (subgraph 0 ran the reference, subgraph 1 wrote
    // nothing), none shape-only.
    for nc in [0, 1] {
        let c = counters(&sim, nc);
        assert_eq!(
            (
                c.neff_reference_executions,
                c.neff_shape_only_executions,
                c.exec_errors
            ),
            (300, 0, 0),
            "NC {nc}"
        );
    }
    // The trace names the reference where shape-only runs say "shape-only".
    sim.stop();
    let text = std::fs::read_to_string(&trace).unwrap();
    let spans = text
        .matches("records (NEFF, reference: ref_matmul.py:matmul)")
        .count();
    assert!(
        spans >= 5,
        "the trace names the reference on the streams' spans ({spans} found, {} bytes of trace)",
        text.len()
    );
    assert!(!text.contains("shape-only"), "no span says shape-only");
}

fn counters(sim: &runtime::backend::sim::PrivateSimdev, nc: u32) -> NcCounters {
    let c = RawClient::connect_hello(sim.socket());
    let Some(Reply::Counters(counters)) = c.call(&Request::Counters { nc }) else {
        panic!("counters of NC {nc}")
    };
    counters
}

/// The pids of `parent`'s children (from /proc/*/stat).
fn children(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            pids.push(pid);
        }
    }
    pids
}

/// `field` (kB) of /proc/`pid`/status, in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

const CHEAP: &str = r#"
import numpy as np

def cheap(x, y):
    v = np.float16(float(x[0, 0]) + float(y[-1, -1]))
    out = np.empty((x.shape[0], y.shape[1]), dtype=np.float16)
    out.fill(v)
    return {"output0": out}
"#;

#[test]
fn matmul_large_maps_its_4_gib_input_instead_of_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = module(dir.path(), "cheap.py", CHEAP);
    let spec = binding("matmul_large", &m, "cheap");
    let (rt, sim) = runtime(&["--reference", &spec], None);
    let h = rt
        .load(&std::fs::read(neff_path("matmul_large")).unwrap(), 0)
        .unwrap();
    let (xs, ys, os) = (8u64 << 20, 4u64 << 30, 16u64 << 20);
    let t = io(&rt, Placement::Device { vnc: 0 }, (xs, ys, os));
    for (e, (x00, y_last)) in [(1.5f32, 0.25f32), (-2.0, 0.5)].into_iter().enumerate() {
        t.x.write(&f16::from_f32(x00).to_le_bytes(), 0).unwrap();
        t.y.write(&f16::from_f32(y_last).to_le_bytes(), ys - 2)
            .unwrap();
        rt.execute(h, &t.ins, &t.outs).unwrap();
        let mut out = vec![0u8; usize::try_from(os).unwrap()];
        t.out.read(&mut out, 0).unwrap();
        let want = f16::from_f32(x00 + y_last);
        assert!(
            halves(&out).iter().all(|&v| v == want),
            "execution {e}: output0 is not filled with x[0,0] + y[-1,-1] = {want}"
        );
    }
    let workers = children(sim.pid());
    assert_eq!(
        workers.len(),
        1,
        "one reference worker under simdev: {workers:?}"
    );
    let peak = status_bytes(workers[0], "VmHWM:");
    assert!(
        peak < 1 << 30,
        "the worker's peak resident memory is {peak} bytes: y (4 GiB) was read, not mapped"
    );
    eprintln!("reference worker peak RSS {} MiB", peak >> 20);
    drop(t);
    rt.unload(h).unwrap();
    rt.close();
}

/// A reference module in a temporary directory.
fn module(dir: &Path, name: &str, source: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, source).unwrap();
    p
}

/// Each function misbehaves when `x[0, 0]` is 7 (the test's sentinel) and is `x @ y`
/// otherwise, so one binding shows both the failure and the next execution working.
const MISBEHAVING: &str = r#"
import os, sys, time
import numpy as np

def good(x, y):
    return {"output0": (x @ y).astype(x.dtype)}

def raises(x, y):
    if x[0, 0] == 7:
        raise RuntimeError("the reference refuses: kaboom-7")
    return good(x, y)

def wrong_shape(x, y):
    if x[0, 0] == 7:
        return {"output0": np.zeros((64, 128), dtype=np.float16)}
    return good(x, y)

def wrong_dtype(x, y):
    if x[0, 0] == 7:
        return {"output0": np.zeros((128, 128), dtype=np.float32)}
    return good(x, y)

def missing(x, y):
    if x[0, 0] == 7:
        return {"out": np.zeros((128, 128), dtype=np.float16)}
    return good(x, y)

def sleeps(x, y):
    if x[0, 0] == 7:
        time.sleep(30)
    return good(x, y)

def exits(x, y):
    if x[0, 0] == 7:
        os._exit(3)
    return good(x, y)

def sleeps_long(x, y):
    if x[0, 0] == 7:
        time.sleep(600)
    return good(x, y)

def calls_exit(x, y):
    if x[0, 0] == 7:
        sys.exit(5)
    return good(x, y)
"#;

/// Binds matmul_small to `function` of [`MISBEHAVING`]: an execution with the sentinel ends
/// with 1004 and `messages` in simdev's log (once per failure, on the failure's line naming
/// the NEFF and the reference), then simdev keeps serving: the next executions (a fresh
/// worker where the old one was killed) compute `x @ y`.
/// Execution `e` (x with the test's sentinel, 7 at `x[0, 0]`, when `sentinel`): its result,
/// output0 read back, and x @ y.
fn run_with_sentinel(
    rt: &Runtime,
    h: runtime::ModelHandle,
    t: &tests::matmul_neff::MatmulIo,
    e: u64,
    sentinel: bool,
) -> (runtime::NrtResult<()>, Vec<f16>, Vec<f32>) {
    let (mut x, y) = (values(128 * 256, 1, e), values(256 * 128, 2, e));
    if sentinel {
        x[0] = f16::from_f32(7.0);
    }
    t.x.write(&bytes(&x), 0).unwrap();
    t.y.write(&bytes(&y), 0).unwrap();
    let r = rt.execute(h, &t.ins, &t.outs);
    let mut out = vec![0u8; 32768];
    t.out.read(&mut out, 0).unwrap();
    (r, halves(&out), matmul_f32(&x, &y))
}

fn misbehaving(function: &str, messages: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let m = module(dir.path(), "bad.py", MISBEHAVING);
    let spec = binding("matmul_small", &m, function);
    let (rt, sim) = runtime(
        &["--reference", &spec, "--reference-timeout", "5s"],
        Some("1G"),
    );
    let h = rt
        .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
        .unwrap();
    let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
    let run = |e: u64, sentinel: bool| run_with_sentinel(&rt, h, &t, e, sentinel);
    let (r, _, _) = run(0, false);
    r.unwrap();
    for e in 1..3 {
        let (r, _, _) = run(e, true);
        let err = r.unwrap_err();
        assert_eq!(
            err.status,
            NrtStatus::ExecCompletedWithErr,
            "{function} execution {e}: {err}"
        );
        let (r, out, want) = run(e + 10, false);
        r.unwrap_or_else(|err| panic!("{function}: the execution after a failure: {err}"));
        assert_close(&out, &want, &format!("{function}: after failure {e}"));
    }
    let log = std::fs::read_to_string(sim.dir().join("simdev.log")).unwrap();
    for m in messages {
        // Once per failed execution (two), on the failure's line naming the NEFF: not a
        // second line that says the same.
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(m)).collect();
        assert_eq!(
            lines.len(),
            2,
            "{function}: {m:?} once per failure in simdev's log:\n{log}"
        );
        assert!(
            lines
                .iter()
                .all(|l| l.contains("failed (error flags 0x2): NEFF \"file.neff\"")),
            "{function}: {m:?} on the failure's line naming the NEFF:\n{log}"
        );
    }
    assert!(
        log.contains(&format!("reference bad.py:{function}")),
        "{function}: the reference named:\n{log}"
    );
    drop(t);
    rt.unload(h).unwrap();
    rt.close();
}
#[test]
fn a_reference_that_raises_gives_1004_with_its_message() {
    misbehaving("raises", &["RuntimeError: the reference refuses: kaboom-7"]);
}

#[test]
fn a_reference_returning_a_wrong_shape_gives_1004_naming_both_shapes() {
    misbehaving(
        "wrong_shape",
        &["'output0' is float16[64, 128]", "float16[128, 128]"],
    );
}

#[test]
fn a_reference_returning_a_wrong_dtype_gives_1004_naming_both_dtypes() {
    misbehaving(
        "wrong_dtype",
        &[
            "'output0' is float32[128, 128]",
            "declares float16[128, 128]",
        ],
    );
}

#[test]
fn a_reference_missing_an_output_gives_1004_naming_it() {
    misbehaving("missing", &["did not return output 'output0'"]);
}

#[test]
fn a_runtime_timeout_while_a_reference_runs_names_the_reference_and_both_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let m = module(dir.path(), "bad.py", MISBEHAVING);
    let spec = binding("matmul_small", &m, "sleeps");
    // simdev gives its reference 60 s (as a shared simdev started by hand may), the runtime
    // its execution 2 s.
    let (rt, _sim) = runtime_timing_out(
        &["--reference", &spec, "--reference-timeout", "60s"],
        Some("1G"),
        Duration::from_secs(2),
    );
    let h = rt
        .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
        .unwrap();
    let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
    let (r, _, _) = run_with_sentinel(&rt, h, &t, 1, true);
    let e = r.unwrap_err();
    assert_eq!(e.status, NrtStatus::Timeout, "{e}");
    assert!(
        e.message.contains("the CPU reference bad.py:sleeps")
            && e.message.contains("(2s, NEURON_RT_EXEC_TIMEOUT)")
            && e.message.contains("--reference-timeout"),
        "{e}"
    );
}

#[test]
fn a_reference_past_the_timeout_gives_1004_and_a_fresh_worker() {
    misbehaving("sleeps", &["no reply within the reference timeout of 5s"]);
}

#[test]
fn a_worker_that_exits_gives_1004_and_a_fresh_worker() {
    misbehaving("exits", &["the reference worker died during the execution"]);
}

#[test]
fn a_reference_that_calls_sys_exit_gives_1004_saying_so_and_the_worker_stays() {
    misbehaving("calls_exit", &["bad.py:calls_exit called sys.exit(5)"]);
}

/// Whether process `pid` has exited (gone, or a zombie its parent has not reaped).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z" || state == "X")
    })
}

#[test]
fn a_stopping_simdev_ends_a_reference_in_progress_instead_of_waiting_out_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let m = module(dir.path(), "bad.py", MISBEHAVING);
    let spec = binding("matmul_small", &m, "sleeps_long");
    let (rt, sim) = runtime(
        &["--reference", &spec, "--reference-timeout", "600s"],
        Some("1G"),
    );
    let h = rt
        .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
        .unwrap();
    let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
    let simdev = sim.pid();
    std::thread::scope(|s| {
        let running = s.spawn(|| run_with_sentinel(&rt, h, &t, 1, true).0);
        // The worker is up (then the request is on its way, or the stop comes first: either
        // way simdev must not wait out the 600 s).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while children(simdev).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no reference worker started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(500));
        let worker = children(simdev);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(simdev).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        // Far inside the reference's 600 s; a simdev that waited it out fails here.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !exited(simdev) {
            assert!(
                std::time::Instant::now() < deadline,
                "simdev still runs 60 s after SIGTERM, waiting for its reference"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(worker.iter().all(|&w| exited(w)), "the worker is gone too");
        let r = running.join().unwrap();
        assert!(r.is_err(), "the execution in progress failed");
    });
    drop(t);
    rt.close();
}

#[test]
fn an_edited_reference_takes_effect_on_the_next_execution() {
    let dir = tempfile::tempdir().unwrap();
    let m = module(
        dir.path(),
        "edited.py",
        "def f(x, y):\n    return {\"output0\": (x @ y).astype(x.dtype)}\n",
    );
    let spec = binding("matmul_small", &m, "f");
    let (rt, sim) = runtime(&["--reference", &spec], Some("1G"));
    let h = rt
        .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
        .unwrap();
    let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
    let (r, out, want) = run_with_sentinel(&rt, h, &t, 1, false);
    r.unwrap();
    assert_close(&out, &want, "before the edit");
    module(
        dir.path(),
        "edited.py",
        "import numpy as np\n\ndef f(x, y):\n    # edited: zeros now\n    return {\"output0\": np.zeros((128, 128), dtype=np.float16)}\n",
    );
    let (r, out, _) = run_with_sentinel(&rt, h, &t, 2, false);
    r.unwrap();
    assert!(
        out.iter().all(|v| v.to_f32() == 0.0),
        "the edited module's zeros, not the old x @ y"
    );
    let log = std::fs::read_to_string(sim.dir().join("simdev.log")).unwrap();
    assert!(
        log.contains("edited.py changed; imported it again"),
        "{log}"
    );
    drop(t);
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn simdev_refuses_to_start_with_a_binding_it_cannot_load_naming_the_file() {
    let program = tests::simdev_command(&[]).program;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("s.sock");
    let missing_module = binding(
        "matmul_small",
        Path::new("/nonexistent/ref_missing.py"),
        "f",
    );
    for (spec, named) in [
        (missing_module.as_str(), "/nonexistent/ref_missing.py"),
        ("/nonexistent/m.neff=ref.py:f", "/nonexistent/m.neff"),
    ] {
        let out = std::process::Command::new(&program)
            .args(["--socket", socket.to_str().unwrap(), "--reference", spec])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{spec}: {stderr}");
        assert!(stderr.contains(named), "{spec}: {stderr}");
    }
}

/// Kills and reaps a simdev started by hand when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A simdev started by hand in a directory (its socket there, its stderr in `simdev.log`),
/// with `--arch trn2 --hbm 1G`, `args` and `env`, and a runtime on it with matmul_small loaded.
struct ByHand {
    rt: Runtime,
    h: runtime::ModelHandle,
    t: tests::matmul_neff::MatmulIo,
    child: Child,
    log: PathBuf,
}

impl ByHand {
    fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        use std::io::BufRead;
        let program = tests::simdev_command(&[]).program;
        let socket = dir.join("s.sock");
        let log = dir.join("simdev.log");
        let mut child = Child(
            std::process::Command::new(&program)
                .args(["--socket", socket.to_str().unwrap()])
                .args(["--arch", "trn2", "--hbm", "1G"])
                .args(args)
                .envs(env.iter().copied())
                .stdout(std::process::Stdio::piped())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        std::io::BufReader::new(child.0.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("simdev listening on"), "{line}");
        let dev = Arc::new(runtime::backend::sim::SimDevice::connect(&socket).unwrap());
        let cfg = RuntimeConfig {
            lnc: Some(2),
            exec_timeout: Duration::from_secs(60),
            ..RuntimeConfig::default()
        };
        let rt = Runtime::init(dev, cfg).unwrap();
        let h = rt
            .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
            .unwrap();
        let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
        Self {
            rt,
            h,
            t,
            child,
            log,
        }
    }

    /// Unloads, closes the runtime, stops simdev: its log.
    fn stop(self) -> String {
        let Self {
            rt,
            h,
            t,
            child,
            log,
        } = self;
        drop(t);
        rt.unload(h).unwrap();
        rt.close();
        drop(child);
        std::fs::read_to_string(log).unwrap()
    }
}

/// One execution of matmul_small bound by `--reference spec` on a simdev started with `env`:
/// its result (its outputs checked when it succeeded) and simdev's log.
fn one_reference_execution(
    dir: &Path,
    spec: &str,
    env: &[(&str, &str)],
) -> (runtime::NrtResult<()>, String) {
    let s = ByHand::start(dir, &["--reference", spec], env);
    let (r, out, want) = run_with_sentinel(&s.rt, s.h, &s.t, 0, false);
    if r.is_ok() {
        assert_close(&out, &want, spec);
    }
    (r, s.stop())
}

#[test]
fn a_worker_that_cannot_start_names_its_interpreter_and_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let spec = binding("matmul_small", &example_reference(), "matmul");
    // An interpreter that exits at once, as python3 without numpy does.
    let (r, log) =
        one_reference_execution(dir.path(), &spec, &[("NEURON_SIMDEV_PYTHON", "/bin/false")]);
    assert_eq!(r.unwrap_err().status, NrtStatus::ExecCompletedWithErr);
    assert!(
        log.contains("the reference worker (\"/bin/false\", from NEURON_SIMDEV_PYTHON")
            && log.contains("/bin/false -m pip install numpy")
            && log.contains("did not start"),
        "{log}"
    );
    // Empty is unset: python3, which computes x @ y.
    let dir = tempfile::tempdir().unwrap();
    let (r, log) = one_reference_execution(dir.path(), &spec, &[("NEURON_SIMDEV_PYTHON", "")]);
    r.unwrap_or_else(|e| panic!("{e}\n{log}"));
}

#[test]
fn the_environment_binds_a_reference_as_the_command_line_does() {
    let dir = tempfile::tempdir().unwrap();
    // Two bindings, `;`-separated; the first names a NEFF this test does not run.
    let env = format!(
        "{} ; {}",
        binding("matmul_large", &example_reference(), "matmul"),
        binding("matmul_small", &example_reference(), "matmul")
    );
    let s = ByHand::start(dir.path(), &[], &[("NEURON_SIMDEV_REFERENCE", &env)]);
    for e in 0..3 {
        execute_and_check(&s.rt, s.h, &s.t, e, &format!("execution {e}"));
    }
    s.stop();
}

#[test]
fn a_nan_in_a_references_output_is_a_numerical_error_when_they_are_reported() {
    // As an engine's NaN: the notification carries NUMERICAL, which the runtime reports as
    // NRT_EXEC_COMPLETED_WITH_NUM_ERR (1003) when asked to (NEURON_FAIL_ON_NAN /
    // NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical) and as a success otherwise; the outputs
    // are delivered either way.
    let dir = tempfile::tempdir().unwrap();
    let m = module(
        dir.path(),
        "nan.py",
        "import numpy as np\n\
         def matmul(x, y):\n    \
             r = (x @ y).astype(x.dtype)\n    \
             if x[0, 0] == 7:\n        \
                 r[1, 2] = np.nan\n    \
             return {\"output0\": r}\n",
    );
    let spec = binding("matmul_small", &m, "matmul");
    for report in [true, false] {
        let sim = start_simdev(&["--arch", "trn2", "--hbm", "1G", "--reference", &spec]);
        let cfg = RuntimeConfig {
            lnc: Some(2),
            exec_timeout: Duration::from_secs(60),
            report_numerical_errors: report,
            ..RuntimeConfig::default()
        };
        let rt = Runtime::init(Arc::new(connect(&sim)), cfg).unwrap();
        let h = rt
            .load(&std::fs::read(neff_path("matmul_small")).unwrap(), 0)
            .unwrap();
        let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
        for sentinel in [false, true, false] {
            let (r, out, _) = run_with_sentinel(&rt, h, &t, 0, sentinel);
            if sentinel && report {
                let err = r.unwrap_err();
                assert_eq!(err.status, NrtStatus::ExecCompletedWithNumErr, "{err}");
            } else {
                r.unwrap_or_else(|e| panic!("report {report} sentinel {sentinel}: {e}"));
            }
            assert_eq!(
                out[128 + 2].is_nan(),
                sentinel,
                "report {report} sentinel {sentinel}: the output is delivered"
            );
        }
        rt.unload(h).unwrap();
        rt.close();
    }
}
