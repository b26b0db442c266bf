//! Tensor operations against a real simdev process: tensor-write throughput (GB/s) of 4 KiB,
//! 64 KiB and 4 MiB requests on one TENSOR_OP queue and on both, beside a `memcpy` of the same
//! sizes in the same run (the ratio); and the round trip of one 64-byte tensor write to its
//! completion — waited with `wait`, and with a seq-id eventfd and poll(2) as serving code does —
//! beside the sync execute round trip of the identity model (64 bytes); and an
//! `nrt_tensor_copy` of a 16 MiB device tensor into a host tensor beside `nrt_tensor_read` of
//! it (the ratio).
//!
//! Each write is staged (the caller's bytes copied into DMA-able host memory), moved by the
//! device's DMA in 64 KiB descriptor pairs and acknowledged by a completion pair; every queue
//! keeps up to 8 requests in flight. The runtime, its workers and the simdev process all run on
//! one CPU (see `tests::bench::pin_to_one_cpu`), as in the other benchmarks.
//!
//! Run: `cargo bench -p tests --bench tensor_ops`. Figures are printed, not asserted.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use runtime::config::RuntimeConfig;
use runtime::{Placement, Runtime, ScheduledRequest, Tensor};
use shared::NrtStatus;
use tests::bench::{IdentityIo, percentile, private_simdev, run_as_simdev_if_asked, us};

/// Requests each queue keeps in flight.
const DEPTH: usize = 8;

/// Writes `count` requests of `size` bytes spread over `queues` (each with its own tensor),
/// keeping [`DEPTH`] in flight per queue; returns the elapsed time.
fn write_throughput(
    rt: &Runtime,
    tensors: &[Tensor],
    queues: &[i32],
    size: usize,
    count: usize,
) -> Duration {
    let data = vec![0xA5u8; size];
    let mut inflight: Vec<VecDeque<ScheduledRequest>> =
        queues.iter().map(|_| VecDeque::new()).collect();
    let start = Instant::now();
    let mut issued = 0;
    while issued < count || inflight.iter().any(|q| !q.is_empty()) {
        for (k, &queue) in queues.iter().enumerate() {
            if issued < count && inflight[k].len() < DEPTH {
                match rt.tensor_write_schedule(&tensors[k], &data, 0, 0, queue) {
                    Ok(op) => {
                        inflight[k].push_back(op);
                        issued += 1;
                        continue;
                    }
                    Err(e) if e.status == NrtStatus::QueueFull => {}
                    Err(e) => panic!("{e}"),
                }
            }
            if let Some(op) = inflight[k].pop_front() {
                assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
            }
        }
    }
    start.elapsed()
}

/// `count` memcpys of `size` bytes between two buffers (touched first, so no page fault is
/// timed); the best of three runs.
fn memcpy_throughput(size: usize, count: usize) -> Duration {
    let src = vec![0x5Au8; size];
    let mut dst = vec![0xFFu8; size];
    dst.copy_from_slice(&src);
    (0..3)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..count {
                dst.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut dst);
            }
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    run_as_simdev_if_asked();
    tests::bench::pin_to_one_cpu();
    let dev = Arc::new(private_simdev(&["--hbm", "64M"]));
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            num_cores: 1,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let tensors: Vec<Tensor> = (0..2)
        .map(|k| {
            rt.tensor_allocate(Placement::Device { vnc: 0 }, 4 << 20, &format!("t{k}"))
                .unwrap()
        })
        .collect();
    println!("tensor-write throughput, simdev, {DEPTH} requests in flight per queue, one CPU");
    println!(
        "  {:>7} {:>9} | {:>13} {:>13} | {:>12} | {:>7} {:>7}",
        "size", "requests", "1 queue GB/s", "2 queues GB/s", "memcpy GB/s", "1q/mc", "2q/mc"
    );
    for (size, count) in [
        (4usize << 10, 20_000usize),
        (64 << 10, 4_000),
        (4 << 20, 96),
    ] {
        // Warm up (staging chunks allocated once, then reused).
        write_throughput(&rt, &tensors, &[0, 1], size, 4 * DEPTH);
        let one = write_throughput(&rt, &tensors[..1], &[0], size, count);
        let two = write_throughput(&rt, &tensors, &[0, 1], size, count);
        let mc = memcpy_throughput(size, count);
        let bytes = size * count;
        let (g1, g2, gm) = (gbps(bytes, one), gbps(bytes, two), gbps(bytes, mc));
        println!(
            "  {:>7} {:>9} | {:>13.3} {:>13.3} | {:>12.2} | {:>6.3}x {:>6.3}x",
            if size >= 1 << 20 {
                format!("{} MiB", size >> 20)
            } else {
                format!("{} KiB", size >> 10)
            },
            count,
            g1,
            g2,
            gm,
            g1 / gm,
            g2 / gm
        );
    }

    // Round trips: one 64-byte tensor write to its completion, beside a sync execute.
    let n = 20_000;
    let t = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, 64, "small")
        .unwrap();
    let data = [0x3Cu8; 64];
    let write_once = || {
        let op = rt.tensor_write_schedule(&t, &data, 0, 0, 0).unwrap();
        assert_eq!(rt.wait(&op).unwrap(), NrtStatus::Success);
    };
    // As serving code waits: a seq-id eventfd of its own (`nrta_event_register_seq_id_completion`)
    // and poll(2).
    let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC).unwrap();
    let write_to_eventfd = || {
        let op = rt.tensor_write_schedule(&t, &data, 0, 0, 0).unwrap();
        rt.event_register_seq_id_completion(op.seq_id(), Some(efd.as_fd()))
            .unwrap();
        let mut fds = [PollFd::new(efd.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::NONE).unwrap(), 1);
        assert_eq!(efd.read().unwrap(), 1);
        assert_eq!(op.status(), Some(NrtStatus::Success));
    };
    let IdentityIo {
        model: m,
        input: i,
        output: o,
        inputs: ins,
        outputs: outs,
    } = IdentityIo::load(&rt, 64);
    for _ in 0..2_000 {
        write_once();
        write_to_eventfd();
        rt.execute(m, &ins, &outs).unwrap();
    }
    let (mut writes, mut efd_writes, mut execs) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for _ in 0..n / 1000 {
        for _ in 0..1000 {
            let s = Instant::now();
            write_once();
            writes.push(s.elapsed());
        }
        for _ in 0..1000 {
            let s = Instant::now();
            write_to_eventfd();
            efd_writes.push(s.elapsed());
        }
        for _ in 0..1000 {
            let s = Instant::now();
            rt.execute(m, &ins, &outs).unwrap();
            execs.push(s.elapsed());
        }
    }
    writes.sort();
    efd_writes.sort();
    execs.sort();
    println!("round trip, 64 bytes, interleaved chunks (n = {n} each)");
    for (name, p) in [("median", 500), ("p99", 990)] {
        println!(
            "  {name:<6} tensor write -> wait {:>7.1} us | -> seq-id eventfd {:>7.1} us | sync execute (identity) {:>7.1} us | ratio (eventfd/execute) {:.2}x",
            us(percentile(&writes, p)),
            us(percentile(&efd_writes, p)),
            us(percentile(&execs, p)),
            percentile(&efd_writes, p).as_secs_f64() / percentile(&execs, p).as_secs_f64()
        );
    }
    drop((t, tensors, i, o, ins, outs));
    copy_vs_read(&rt);
    rt.close();
}

/// `nrt_tensor_copy` of a device tensor into a host tensor, beside `nrt_tensor_read` of the
/// same tensor into a buffer of this process (both destinations touched first, so no page fault
/// of theirs is timed): the copy moves the same bytes, so the read is its floor.
fn copy_vs_read(rt: &Runtime) {
    const SIZE: u64 = 16 << 20;
    const RUNS: usize = 20;
    let dev = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, SIZE, "copied")
        .unwrap();
    dev.memset(0, 0x6B, SIZE).unwrap();
    let host = rt.tensor_allocate(Placement::Host, SIZE, "copy").unwrap();
    host.memset(0, 0, SIZE).unwrap();
    let mut buf = vec![0u8; usize::try_from(SIZE).unwrap()];
    let (mut copies, mut reads) = (Vec::with_capacity(RUNS), Vec::with_capacity(RUNS));
    for _ in 0..RUNS {
        let s = Instant::now();
        host.copy_range(0, &dev, 0, SIZE).unwrap();
        copies.push(s.elapsed());
        let s = Instant::now();
        dev.read(&mut buf, 0).unwrap();
        reads.push(s.elapsed());
    }
    let mut last = [0u8; 1];
    host.read(&mut last, SIZE - 1).unwrap();
    assert_eq!(
        (buf[0], last[0]),
        (0x6B, 0x6B),
        "the copy and the read moved the bytes"
    );
    copies.sort();
    reads.sort();
    let (c, r) = (percentile(&copies, 500), percentile(&reads, 500));
    println!(
        "device -> host tensor copy, {} MiB, interleaved (n = {RUNS} each)",
        SIZE >> 20
    );
    println!(
        "  median nrt_tensor_copy {:>8.0} us | nrt_tensor_read {:>8.0} us | ratio {:.2}x",
        us(c),
        us(r),
        c.as_secs_f64() / r.as_secs_f64()
    );
}
