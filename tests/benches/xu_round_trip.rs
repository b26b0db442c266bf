//! XU round trip: submit -> worker -> complete -> waiter, in process, beside a floor measured in
//! the same run (a raw two-thread eventfd ping-pong), and heap allocations per execution in
//! steady state, counted by a counting global allocator.
//!
//! Run: `cargo bench -p tests --bench xu_round_trip`. Figures are printed, not asserted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::metrics::Metrics;
use runtime::xu::{CompletionEngine, ExecInfo, Progress, Xu, XuConfig, XuWorkers};
use shared::NrtStatus;
use tests::bench::{CountingAlloc, percentile};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

/// Completes every execution at its first step.
#[derive(Debug)]
struct Immediate;

impl CompletionEngine for Immediate {
    type Request = ();
    fn progress_one_step(&self, _vnc: u32, _info: &mut ExecInfo<()>) -> Progress {
        Progress::Done(NrtStatus::Success)
    }
}

fn report(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 500), percentile(&samples, 990));
    println!(
        "{name:<44} median {:>7.2} us   p99 {:>7.2} us",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6
    );
    (p50, p99)
}

fn eventfd_ping_pong(n: usize) -> Vec<Duration> {
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
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        ping.write(1).unwrap();
        pong.read().unwrap();
        samples.push(t.elapsed());
    }
    echo.join().unwrap();
    samples
}

fn main() {
    let n = 50_000;
    let metrics = Arc::new(Metrics::new(1));
    let cfg = XuConfig {
        vnc: 0,
        tpbs: vec![0],
        capacity: 64,
        efd_pool_size: 4,
        ..XuConfig::default()
    };
    let xu = Arc::new(Xu::new(cfg, Arc::new(Immediate), metrics).unwrap());
    let workers = XuWorkers::start(std::slice::from_ref(&xu)).unwrap();
    let execute = || {
        let st = xu
            .execute_sync(
                Box::new(ExecInfo::execute(1, ())),
                |_, _| Ok(()),
                |_| Ok(()),
            )
            .unwrap();
        assert_eq!(st, NrtStatus::Success);
    };

    for _ in 0..5_000 {
        execute();
    }
    let (floor50, floor99) = report(
        "floor: eventfd ping-pong, two threads",
        eventfd_ping_pong(n),
    );
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        execute();
        samples.push(t.elapsed());
    }
    let (xu50, xu99) = report("XU submit -> worker -> complete -> waiter", samples);
    println!(
        "{:<44} median {:>7.2}x   p99 {:>7.2}x",
        "XU / floor",
        xu50.as_secs_f64() / floor50.as_secs_f64(),
        xu99.as_secs_f64() / floor99.as_secs_f64()
    );

    let before = GLOBAL.allocations();
    let m = 100_000u64;
    for _ in 0..m {
        execute();
    }
    let allocs = GLOBAL.allocations() - before;
    println!(
        "heap allocations per execution (steady state, {m} executions): {:.3}",
        allocs as f64 / m as f64
    );
    workers.destroy();
}
