//! Sync execute round trip of the identity model (64 bytes, one NC) against a real simdev
//! process, beside a floor measured in the same run: a doorbell message to the simdev process
//! with its reply seen in shared memory (a semaphore of the NC's mapped window), plus an
//! in-process eventfd wake (a two-thread ping-pong) — the two hand-offs every execution needs.
//! Also: heap allocations per execute in steady state (a counting global allocator, all
//! threads) and control-socket messages per execute (simdev's doorbell counter); the round trip
//! of the 4 MiB identity model (64 I/O descriptor pairs per execution); and 40 threads calling
//! sync execute on one logical core (16 XU slots: the surplus is refused with NRT_QUEUE_FULL and
//! retried inside the runtime) — every call must succeed — against one thread, in executions
//! per second.
//!
//! The runtime, its workers and the simdev process all run on one CPU (see
//! `tests::bench::pin_to_one_cpu`).
//!
//! Run: `cargo bench -p tests --bench execute`. Figures are printed, not asserted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::backend::sim::SimDevice;
use runtime::config::RuntimeConfig;
use runtime::{Device, Placement, Runtime, TensorSet};
use shared::address_map::SEM_WINDOW_SEMAPHORES;
use shared::model::Target;
use tests::bench::{
    CountingAlloc, IdentityIo, percentile, private_simdev, run_as_simdev_if_asked, us,
};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

/// Floor part 1: posted doorbell -> the new semaphore value visible in the mapped window.
fn doorbell_floor(dev: &SimDevice, nc: u32, n: usize) -> Vec<Duration> {
    let claimed = dev.claim_nc(nc).unwrap();
    let window = claimed.semaphore_window.expect("window");
    let pa = window.pa() + SEM_WINDOW_SEMAPHORES as u64 + 4 * 5;
    (0..n)
        .map(|_| {
            let before = window.load_u32(pa, Ordering::Acquire).unwrap();
            let t = Instant::now();
            dev.semaphore_increment(nc, 5, 1).unwrap();
            // Yield, not spin: everything here shares one CPU, and simdev's threads are
            // SCHED_BATCH by default, which never preempt a running thread on wake-up — a spinning
            // waiter would keep simdev off the CPU until the next scheduler tick (4 ms at HZ=250).
            while window.load_u32(pa, Ordering::Acquire).unwrap() == before {
                std::thread::yield_now();
            }
            t.elapsed()
        })
        .collect()
}

/// Floor part 2: an in-process eventfd wake and its answer (two threads).
fn eventfd_floor(n: usize) -> Vec<Duration> {
    let ping = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap());
    let pong = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap());
    let echo = {
        let (ping, pong) = (ping.clone(), pong.clone());
        std::thread::spawn(move || {
            for _ in 0..n {
                ping.read().unwrap();
                pong.write(1).unwrap();
            }
        })
    };
    let samples = (0..n)
        .map(|_| {
            let t = Instant::now();
            ping.write(1).unwrap();
            pong.read().unwrap();
            t.elapsed()
        })
        .collect();
    echo.join().unwrap();
    samples
}

fn main() {
    run_as_simdev_if_asked();
    tests::bench::pin_to_one_cpu();
    let n = 20_000;
    let dev = Arc::new(private_simdev(&["--hbm", "64M"]));
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            num_cores: 1,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let IdentityIo {
        model: m,
        input: i,
        output: o,
        inputs: ins,
        outputs: outs,
    } = IdentityIo::load(&rt, 64);
    i.write(&[0x5A; 64], 0).unwrap();
    for _ in 0..2_000 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let mut exec: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            rt.execute(m, &ins, &outs).unwrap();
            t.elapsed()
        })
        .collect();
    let mut out = [0u8; 64];
    o.read(&mut out, 0).unwrap();
    assert_eq!(out, [0x5A; 64]);
    // The floor on the other NC of the same simdev, so it shares nothing with the runtime's NC.
    let mut bell = doorbell_floor(&dev, 1, n);
    let mut wake = eventfd_floor(n);
    for v in [&mut exec, &mut bell, &mut wake] {
        v.sort();
    }
    let floor = |p| percentile(&bell, p) + percentile(&wake, p);
    println!("sync execute round trip, identity 64 B, 1 NC, simdev (n = {n})");
    for (name, p) in [("median", 500), ("p99", 990)] {
        println!(
            "  {name:<6} execute {:>7.1} us | floor {:>7.1} us (doorbell->shared memory {:>6.1} + eventfd wake {:>6.1}) | ratio {:.2}x",
            us(percentile(&exec, p)),
            us(floor(p)),
            us(percentile(&bell, p)),
            us(percentile(&wake, p)),
            percentile(&exec, p).as_secs_f64() / floor(p).as_secs_f64()
        );
    }
    let doorbells_before = dev.nc_counters(0).unwrap().doorbells;
    let allocs_before = GLOBAL.allocations();
    let k = 20_000u64;
    for _ in 0..k {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let allocs = GLOBAL.allocations() - allocs_before;
    let doorbells = dev.nc_counters(0).unwrap().doorbells - doorbells_before;
    println!(
        "  heap allocations per execute (steady state, all threads): {:.2}",
        allocs as f64 / k as f64
    );
    println!(
        "  control-socket messages per execute: {:.2} (doorbells; one bound TPB)",
        doorbells as f64 / k as f64
    );
    drop((i, o, ins, outs));
    large_round_trip(&rt);
    many_threads_on_one_core(&rt, m);
    rt.close();
}

/// The round trip of the identity model at 4 MiB.
fn large_round_trip(rt: &Runtime) {
    const BYTES: u32 = 4 << 20;
    let n = 300;
    let m = rt
        .load(
            &runtime::builder::identity(BYTES)
                .to_container(Target::Simdev)
                .unwrap(),
            0,
        )
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, BYTES.into(), "in")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, BYTES.into(), "out")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let data: Vec<u8> = (0..BYTES).map(|k| (k % 251) as u8).collect();
    i.write(&data, 0).unwrap();
    for _ in 0..20 {
        rt.execute(m, &ins, &outs).unwrap();
    }
    let mut exec: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            rt.execute(m, &ins, &outs).unwrap();
            t.elapsed()
        })
        .collect();
    let mut out = vec![0u8; data.len()];
    o.read(&mut out, 0).unwrap();
    assert!(out == data);
    exec.sort();
    println!("sync execute round trip, identity 4 MiB (64 descriptor pairs), 1 NC (n = {n})");
    println!(
        "  median {:>8.1} us | p99 {:>8.1} us",
        us(percentile(&exec, 500)),
        us(percentile(&exec, 990))
    );
    drop((i, o, ins, outs));
    rt.unload(m).unwrap();
}

/// 40 threads of sync executes of `m` (identity 64 B) on its logical core against one thread
/// doing as many: every call must succeed.
fn many_threads_on_one_core(rt: &Runtime, m: runtime::ModelHandle) {
    const THREADS: u32 = 40;
    const PER_THREAD: u32 = 500;
    let run = |threads: u32, per_thread: u32| -> (Duration, u32) {
        let failures = std::sync::atomic::AtomicU32::new(0);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                let failures = &failures;
                s.spawn(move || {
                    let i = rt
                        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "in")
                        .unwrap();
                    let o = rt
                        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "out")
                        .unwrap();
                    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
                    ins.add("input", &i);
                    outs.add("output", &o);
                    for _ in 0..per_thread {
                        if rt.execute(m, &ins, &outs).is_err() {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        (t.elapsed(), failures.load(Ordering::Relaxed))
    };
    let total = THREADS * PER_THREAD;
    let (one, one_failed) = run(1, total);
    let (many, many_failed) = run(THREADS, PER_THREAD);
    let rate = |d: Duration| f64::from(total) / d.as_secs_f64();
    println!("sync execute, identity 64 B, {total} executions on one logical core");
    println!(
        "  1 thread:    {:>9.0} exec/s, {one_failed} failed",
        rate(one)
    );
    println!(
        "  {THREADS} threads:  {:>9.0} exec/s, {many_failed} failed | throughput {:.2}x one thread",
        rate(many),
        rate(many) / rate(one)
    );
}
