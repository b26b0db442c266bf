//! The sync execute hot path allocates nothing (seed 000 GOTCHA: trackers, request slots and
//! rings are made at load or init, never per execution; the work items the worker frees are
//! kept by the XU for the next submits). A counting global
//! allocator sees every thread of this process: the caller, the XU worker and the completion
//! harvest; simdev is another process. Its own test binary, so the allocator counts nothing
//! else. The same holds with the system trace capturing.

use std::time::Duration;

use runtime::Runtime;
use runtime::config::RuntimeConfig;
use tests::bench::{CountingAlloc, IdentityIo};
use tests::{connect, start_simdev};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

#[test]
fn a_steady_state_execute_allocates_nothing() {
    // The counter counts (so the bound below cannot hold vacuously).
    let before = GLOBAL.allocations();
    let v = std::hint::black_box(vec![0u8; 64]);
    assert!(GLOBAL.allocations() > before);
    drop(v);

    let sim = start_simdev(&["--hbm", "64M"]);
    let dev = std::sync::Arc::new(connect(&sim));
    // The datastore on, in a directory of this test's own.
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::init(
        dev,
        RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            datastore: true,
            datastore_dir: Some(dir.path().to_path_buf()),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    assert!(rt.datastore().path().is_some(), "the datastore file exists");
    let IdentityIo {
        model: m,
        input: i,
        output: o,
        inputs: ins,
        outputs: outs,
    } = IdentityIo::load(&rt, 64);
    i.write(&[0x5A; 64], 0).unwrap();
    // Warm-up: pools, caches and the first model-switch path fill here.
    for _ in 0..500 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let k = 3_000u64;
    let before = GLOBAL.allocations();
    for _ in 0..k {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let allocations = GLOBAL.allocations() - before;
    let mut out = [0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, [0x5A; 64]);
    // Nothing per execute; a 1% margin for anything a thread does once in a while.
    assert!(
        allocations <= k / 100,
        "{allocations} allocations in {k} executes ({:.3} each): the hot path allocates",
        allocations as f64 / k as f64
    );
    // The same with the system trace capturing: its rings were allocated at start, so an
    // execution still allocates nothing.
    rt.sys_trace_start(&runtime::sys_trace::SysTraceConfig::new())
        .unwrap();
    for _ in 0..500 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let before = GLOBAL.allocations();
    for _ in 0..k {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let allocations = GLOBAL.allocations() - before;
    assert!(
        allocations <= k / 100,
        "{allocations} allocations in {k} traced executes ({:.3} each): tracing allocates on the hot path",
        allocations as f64 / k as f64
    );
    let fetched = rt
        .sys_trace_fetch_events(&runtime::sys_trace::SysTraceFetchOptions::default())
        .unwrap();
    assert!(
        fetched.matches("\"type\":\"execute\"").count() >= 1000,
        "the traced executions were recorded"
    );
    drop((i, o, ins, outs));
    rt.close();
}
