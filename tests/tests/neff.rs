//! The two real NEFFs (nkipy's matmul_small and matmul_large, LNC=2, float16) through the
//! runtime and the real simdev binary: load with libnrt's placement, 100 shape-only executions
//! with device and host tensors whose outputs equal the documented function of the inputs
//! (`shared::neff_program::shape_only`), unload back to the memory baseline, and the refusals.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runtime::config::RuntimeConfig;
use runtime::sys_trace::{SysTraceConfig, SysTraceFetchOptions};
use runtime::{Placement, Runtime};
use shared::NrtStatus;
use shared::neff_program::shape_only::{EDGE_BYTES, Seed, expected_output, splitmix64};
use tests::matmul_neff::{SMALL, io};
use tests::{connect, start_simdev};

fn neff_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../scenarios/data/neff/{name}.neff"))
}

fn neff_bytes(name: &str) -> Vec<u8> {
    std::fs::read(neff_path(name)).unwrap()
}

/// A runtime on a private simdev of `arch` (default HBM unless `hbm`), `lnc` NCs per logical
/// core.
fn runtime(
    arch: &str,
    lnc: u32,
    hbm: Option<&str>,
) -> (Runtime, runtime::backend::sim::PrivateSimdev) {
    let mut args = vec!["--arch", arch];
    if let Some(h) = hbm {
        args.extend(["--hbm", h]);
    }
    let sim = start_simdev(&args);
    let dev = Arc::new(connect(&sim));
    let cfg = RuntimeConfig {
        lnc: Some(lnc),
        exec_timeout: Duration::from_secs(30),
        ..RuntimeConfig::default()
    };
    (Runtime::init(dev, cfg).unwrap(), sim)
}

/// Deterministic bytes for input `salt` of execution `e`.
fn pattern(len: usize, salt: u64, e: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let seed = splitmix64(salt.wrapping_mul(0x1000).wrapping_add(e));
    for (i, b) in v.iter_mut().enumerate() {
        *b = splitmix64(seed.wrapping_add(i as u64 / 8)).to_le_bytes()[i % 8];
    }
    v
}

/// The shape-only output0 of inputs whose edges are `x` and `y` (DGE order x, y; one output).
fn expected(x: (u64, &[u8], &[u8]), y: (u64, &[u8], &[u8]), len: usize) -> Vec<u8> {
    let mut s = Seed::default();
    s.input(x.0, x.1, x.2);
    s.input(y.0, y.1, y.2);
    expected_output(s, 0, len)
}

fn run_small(rt: &Runtime, placement: Placement, executions: u64) {
    let h = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    let t = io(rt, placement, SMALL);
    let mut last: Option<Vec<u8>> = None;
    for e in 0..executions {
        let (x, y) = (pattern(65536, 1, e), pattern(65536, 2, e));
        t.x.write(&x, 0).unwrap();
        t.y.write(&y, 0).unwrap();
        rt.execute(h, &t.ins, &t.outs).unwrap();
        let mut out = vec![0u8; 32768];
        t.out.read(&mut out, 0).unwrap();
        let n = EDGE_BYTES;
        let want = expected(
            (65536, &x[..n], &x[65536 - n..]),
            (65536, &y[..n], &y[65536 - n..]),
            32768,
        );
        assert!(
            out == want,
            "execution {e}: output0 is not the shape-only function of x, y"
        );
        if let Some(prev) = &last {
            assert_ne!(
                prev, &out,
                "execution {e}: a different input gave the same output"
            );
        }
        last = Some(out);
    }
    rt.unload(h).unwrap();
}

#[test]
fn matmul_small_runs_shape_only_with_device_and_host_tensors_on_trn2_lnc2() {
    let (rt, _sim) = runtime("trn2", 2, Some("1G"));
    let baseline = rt.vnc_memory_stats(0).unwrap().bytes_used;
    run_small(&rt, Placement::Device { vnc: 0 }, 100);
    run_small(&rt, Placement::Host, 100);
    assert_eq!(
        rt.vnc_memory_stats(0).unwrap().bytes_used,
        baseline,
        "unload frees every byte the NEFF took"
    );
    rt.close();
}

/// The system trace says a NEFF's executions were shape-only (what simdev ran is not what
/// silicon would), on every execute event.
#[test]
fn the_system_trace_marks_a_neffs_executions_shape_only() {
    let (rt, _sim) = runtime("trn2", 2, Some("1G"));
    let h = rt.load(&neff_bytes("matmul_small"), 0).unwrap();
    let t = io(&rt, Placement::Device { vnc: 0 }, SMALL);
    rt.sys_trace_start(&SysTraceConfig::new()).unwrap();
    for _ in 0..3 {
        rt.execute(h, &t.ins, &t.outs).unwrap();
    }
    let doc: serde_json::Value = serde_json::from_str(
        &rt.sys_trace_fetch_events(&SysTraceFetchOptions::default())
            .unwrap(),
    )
    .unwrap();
    let events = doc["ncs"][0]["events"].as_array().unwrap();
    assert_eq!(events.len(), 3, "{doc}");
    for e in events {
        assert_eq!(e["device_program"], "neff_shape_only", "{e}");
        assert_eq!(e["shape_only"], true, "{e}");
    }
    rt.sys_trace_stop().unwrap();
    rt.unload(h).unwrap();
    rt.close();
}

#[test]
fn matmul_large_loads_on_the_default_hbm_and_leaves_y_untouched() {
    // Default HBM (12 GiB per NC on trn2): y's 4 GiB fits, and stays sparse because only x
    // is written and the shape-only function reads only the edges of each input.
    let (rt, _sim) = runtime("trn2", 2, None);
    let baseline = rt.vnc_memory_stats(0).unwrap().bytes_used;
    let started = std::time::Instant::now();
    let h = rt.load(&neff_bytes("matmul_large"), 0).unwrap();
    let load = started.elapsed();
    let (xs, ys, os) = (8u64 << 20, 4u64 << 30, 16u64 << 20);
    let t = io(&rt, Placement::Device { vnc: 0 }, (xs, ys, os));
    let zero = vec![0u8; EDGE_BYTES];
    let mut outs = Vec::new();
    for e in 0..3 {
        let x = pattern(usize::try_from(xs).unwrap(), 1, e);
        t.x.write(&x, 0).unwrap();
        rt.execute(h, &t.ins, &t.outs).unwrap();
        let mut out = vec![0u8; usize::try_from(os).unwrap()];
        t.out.read(&mut out, 0).unwrap();
        let n = EDGE_BYTES;
        let want = expected(
            (xs, &x[..n], &x[x.len() - n..]),
            (ys, &zero, &zero),
            out.len(),
        );
        assert!(
            out == want,
            "execution {e}: output0 is not the shape-only function"
        );
        outs.push(out);
    }
    assert_ne!(outs[0], outs[1], "a different x gives a different output");
    drop(t);
    rt.unload(h).unwrap();
    assert_eq!(rt.vnc_memory_stats(0).unwrap().bytes_used, baseline);
    eprintln!("matmul_large load took {load:?}");
    rt.close();
}

fn load_error(rt: &Runtime, bytes: &[u8]) -> runtime::NrtError {
    match rt.load(bytes, 0) {
        Ok(h) => {
            rt.unload(h).unwrap();
            panic!("the NEFF loaded");
        }
        Err(e) => e,
    }
}

#[test]
fn an_lnc2_neff_is_refused_on_trn1_and_at_lnc1_naming_the_mismatch() {
    for (arch, lnc) in [("trn1", 1), ("trn2", 1)] {
        let (rt, _sim) = runtime(arch, lnc, Some("256M"));
        let before = rt.vnc_memory_stats(0).unwrap().bytes_used;
        let e = load_error(&rt, &neff_bytes("matmul_small"));
        assert_eq!(e.status, NrtStatus::LoadNotEnoughNc, "{arch}: {e}");
        assert!(
            e.message.contains("LNC=2") || e.message.contains("lnc"),
            "{arch}: {e}"
        );
        assert_eq!(
            rt.vnc_memory_stats(0).unwrap().bytes_used,
            before,
            "{arch}: nothing kept"
        );
        rt.close();
    }
}

#[test]
fn malformed_neffs_are_refused_with_nothing_left_allocated() {
    let (rt, _sim) = runtime("trn2", 2, Some("256M"));
    let before = rt.vnc_memory_stats(0).unwrap().bytes_used;
    let good = neff_bytes("matmul_small");
    // Truncated in the payload, data_size wrong, corrupted gzip, unsupported major version.
    let mut data_size = good.clone();
    data_size[0x10] ^= 1;
    let mut gzip = good.clone();
    let mid = gzip.len() / 2;
    gzip[mid] ^= 0xFF;
    let mut major = good.clone();
    major[0x18] = 3;
    for (what, bytes, status) in [
        (
            "truncated",
            good[..good.len() - 100].to_vec(),
            NrtStatus::Invalid,
        ),
        ("data_size", data_size, NrtStatus::Invalid),
        ("gzip", gzip, NrtStatus::Invalid),
        ("major version", major, NrtStatus::UnsupportedNeffVersion),
    ] {
        let e = load_error(&rt, &bytes);
        assert_eq!(e.status, status, "{what}: {e}");
        assert!(!e.message.is_empty(), "{what}");
        assert_eq!(rt.vnc_memory_stats(0).unwrap().bytes_used, before, "{what}");
    }
    rt.close();
}

#[test]
fn random_single_byte_mutations_through_load_never_panic_hang_or_leak() {
    let (rt, _sim) = runtime("trn2", 2, Some("256M"));
    let before = rt.vnc_memory_stats(0).unwrap().bytes_used;
    let good = neff_bytes("matmul_small");
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let (mut loaded, mut refused) = (0, 0);
    for _ in 0..10_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut m = good.clone();
        let at = usize::try_from(state % m.len() as u64).unwrap();
        m[at] = m[at].wrapping_add(u8::try_from((state >> 32) % 255 + 1).unwrap());
        match rt.load(&m, 0) {
            Ok(h) => {
                loaded += 1;
                rt.unload(h).unwrap();
            }
            Err(e) => {
                refused += 1;
                assert!(!e.message.is_empty());
            }
        }
    }
    assert_eq!(loaded + refused, 10_000);
    assert!(
        refused > 9_000,
        "most mutations hit the gzip stream: {refused} refused"
    );
    assert_eq!(
        rt.vnc_memory_stats(0).unwrap().bytes_used,
        before,
        "no mutation left memory behind"
    );
    // The runtime still loads and runs the real file.
    run_small(&rt, Placement::Device { vnc: 0 }, 2);
    rt.close();
}
