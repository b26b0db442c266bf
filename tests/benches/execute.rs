//! Sync execute round trip of the identity model (64 bytes, one NC) against a real simdev
//! process, beside a floor measured in the same run: a doorbell message to the simdev process
//! with its reply seen in shared memory (a semaphore of the NC's mapped window), plus an
//! in-process eventfd wake (a two-thread ping-pong) — the two hand-offs every execution needs.
//! Also: heap allocations per execute in steady state (a counting global allocator, all
//! threads) and control-socket messages per execute (simdev's doorbell counter).
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
use tests::bench::{CountingAlloc, percentile, private_simdev, run_as_simdev_if_asked, us};

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
            while window.load_u32(pa, Ordering::Acquire).unwrap() == before {
                std::hint::spin_loop();
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
    let m = rt
        .load(
            &runtime::builder::identity(64)
                .to_container(Target::Simdev)
                .unwrap(),
            0,
        )
        .unwrap();
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "in")
        .unwrap();
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "out")
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
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
    rt.close();
}
