//! XU round trip: submit -> worker -> complete -> waiter, in process, beside a floor measured in
//! the same run (a raw two-thread eventfd ping-pong), and heap allocations per execution in
//! steady state, counted by a counting global allocator.
//!
//! All threads run on one CPU (see `tests::bench::pin_to_one_cpu`), and the floor and the XU
//! are measured in interleaved chunks.
//!
//! Run: `cargo bench -p tests --bench xu_round_trip`. Figures are printed, not asserted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::metrics::Metrics;
use runtime::xu::{CompletionEngine, ExecInfo, ExecutionUnit, Progress, Xu, XuConfig, XuWorkers};
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

/// A two-thread eventfd ping-pong that lives for the whole run, so it can be measured in
/// chunks interleaved with the XU (both then see the same machine conditions).
struct PingPong {
    ping: Arc<EventFd>,
    pong: Arc<EventFd>,
    echo: Option<std::thread::JoinHandle<()>>,
}

impl PingPong {
    fn start() -> Self {
        let ping = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap());
        let pong = Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap());
        let echo = {
            let (ping, pong) = (ping.clone(), pong.clone());
            std::thread::spawn(move || {
                // A value of 2 means "stop".
                while ping.read().unwrap() == 1 {
                    pong.write(1).unwrap();
                }
            })
        };
        Self {
            ping,
            pong,
            echo: Some(echo),
        }
    }

    fn round_trip(&self) -> Duration {
        let t = Instant::now();
        self.ping.write(1).unwrap();
        self.pong.read().unwrap();
        t.elapsed()
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        self.ping.write(2).unwrap();
        if let Some(t) = self.echo.take() {
            t.join().unwrap();
        }
    }
}

fn main() {
    tests::bench::pin_to_one_cpu();
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
    let workers = XuWorkers::start(&[vec![xu.clone() as Arc<dyn ExecutionUnit>]]).unwrap();
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
    // Interleave chunks of the floor and of the XU so a change in the machine's scheduling
    // affects both alike.
    let pp = PingPong::start();
    let (mut floor, mut samples) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n / 1000 {
        for _ in 0..1000 {
            floor.push(pp.round_trip());
        }
        for _ in 0..1000 {
            let t = Instant::now();
            execute();
            samples.push(t.elapsed());
        }
    }
    drop(pp);
    let (floor50, floor99) = report("floor: eventfd ping-pong, two threads", floor);
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
