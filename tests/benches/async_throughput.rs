//! Asynchronous throughput through the explicit async API (the XU ring) against a real simdev
//! process, beside a floor measured in the same run: pipelined doorbell messages to the simdev
//! process, acknowledged through shared memory (posted SemaphoreIncrements until the semaphore
//! window shows them all).
//!
//! Run: `cargo bench -p tests --bench async_throughput`. Figures are printed, not asserted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use runtime::backend::sim::SimDevice;
use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use runtime::{Device, ModelHandle, Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::address_map::SEM_WINDOW_SEMAPHORES;
use shared::model::Target;
use tests::bench::{private_simdev, run_as_simdev_if_asked};

/// Posted doorbells per second, acknowledged through the mapped semaphore window.
fn doorbell_floor(dev: &SimDevice, nc: u32, messages: u32) -> f64 {
    let claimed = dev.claim_nc(nc).unwrap();
    let window = claimed.semaphore_window.unwrap();
    let pa = window.pa() + SEM_WINDOW_SEMAPHORES as u64 + 4 * 7;
    let start_value = window.load_u32(pa, Ordering::Acquire).unwrap();
    let t = Instant::now();
    for _ in 0..messages {
        dev.semaphore_increment(nc, 7, 1).unwrap();
    }
    while window
        .load_u32(pa, Ordering::Acquire)
        .unwrap()
        .wrapping_sub(start_value)
        < messages
    {
        std::hint::spin_loop();
    }
    f64::from(messages) / t.elapsed().as_secs_f64()
}

struct Slot {
    input: runtime::Tensor,
    ins: TensorSet,
    outs: TensorSet,
}

fn slots(rt: &Runtime, n: u32, in_bytes: u64, out_bytes: u64) -> Vec<Slot> {
    (0..n)
        .map(|_| {
            let input = rt
                .tensor_allocate(Placement::Device { vnc: 0 }, in_bytes, "i")
                .unwrap();
            let output = rt
                .tensor_allocate(Placement::Device { vnc: 0 }, out_bytes, "o")
                .unwrap();
            let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
            ins.add("input", &input);
            outs.add("output", &output);
            Slot { input, ins, outs }
        })
        .collect()
}

/// Executions per second with `in_flight` outstanding.
fn throughput(rt: &Runtime, m: ModelHandle, slots: &[Slot], executions: u32) -> f64 {
    let mut pending = VecDeque::new();
    let t = Instant::now();
    for e in 0..executions {
        if pending.len() == slots.len() {
            let r = pending.pop_front().unwrap();
            assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
        }
        let s = &slots[e as usize % slots.len()];
        pending.push_back(rt.execute_schedule(m, &s.ins, &s.outs).unwrap());
    }
    for r in pending {
        assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
    }
    f64::from(executions) / t.elapsed().as_secs_f64()
}

fn main() {
    run_as_simdev_if_asked();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let dev = Arc::new(private_simdev(&["--hbm", "128M"]));
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            num_cores: 1,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let floor = doorbell_floor(&dev, 1, 200_000);
    println!(
        "floor: pipelined doorbells acknowledged through shared memory: {floor:.0} messages/s"
    );
    let id = rt
        .load(
            &runtime::builder::identity(64)
                .to_container(Target::Simdev)
                .unwrap(),
            0,
        )
        .unwrap();
    for in_flight in [1u32, 4, 16] {
        let s = slots(&rt, in_flight, 64, 64);
        throughput(&rt, id, &s, 2_000);
        let eps = throughput(&rt, id, &s, 20_000);
        println!(
            "identity 64 B, {in_flight:>2} in flight: {eps:>8.0} executions/s   ({:.2} of the doorbell floor)",
            eps / floor
        );
    }
    let data = Digits::load(&digits::default_path()).unwrap();
    for (batch, in_flight, executions) in [(1u32, 16u32, 3_600u32), (360, 4, 200)] {
        let b = batch as u64;
        let m = rt
            .load(
                &data
                    .mlp()
                    .build(batch)
                    .unwrap()
                    .to_container(Target::Simdev)
                    .unwrap(),
                0,
            )
            .unwrap();
        let s = slots(
            &rt,
            in_flight,
            b * FEATURES as u64 * 4,
            b * CLASSES as u64 * 4,
        );
        let rows: Vec<u8> = data.inputs[..batch as usize * FEATURES]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        for slot in &s {
            slot.input.write(&rows, 0).unwrap();
        }
        throughput(&rt, m, &s, executions / 10);
        let eps = throughput(&rt, m, &s, executions);
        println!(
            "digits MLP batch {batch:>3}, {in_flight:>2} in flight: {eps:>8.0} executions/s, {:>9.0} images/s",
            eps * f64::from(batch)
        );
    }
    rt.close();
}
