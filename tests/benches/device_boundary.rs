//! Device-boundary benchmarks against a real simdev process (run with
//! `cargo bench -p tests --bench device_boundary`; figures are printed, not asserted).
//!
//! 1. Doorbell round trip: a posted `SemaphoreIncrement` message until the new value is visible
//!    in the NC's mapped semaphore window (median, p99), beside a floor measured in the same
//!    run: a one-byte SOCK_SEQPACKET ping-pong between two threads of this process.
//! 2. DMA copy bandwidth: an M2M copy through a real descriptor ring (64 KiB descriptor pairs),
//!    doorbell to completion, beside `memcpy` of the same size between the same two mapped
//!    chunks in this process. The ratio is DMA time / memcpy time.
//!
//! The benchmark starts simdev by re-executing itself (`<bench> simdev ...`), so it needs no
//! other binary.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, MsgFlags};
use runtime::backend::sim::SimDevice;
use runtime::backend::{Device, DmaQueueId};
use runtime::dma::DmaQueue;
use shared::address_map::SEM_WINDOW_SEMAPHORES;
use shared::protocol::MemLocation;
use tests::bench::{percentile, private_simdev, run_as_simdev_if_asked, us};

fn summarize(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 500), percentile(&samples, 990));
    println!(
        "{name:<48} median {:>8.2} us   p99 {:>8.2} us   (n = {})",
        us(p50),
        us(p99),
        samples.len()
    );
    (p50, p99)
}

fn seqpacket_ping_pong_floor(iterations: usize) -> Vec<Duration> {
    let (a, b) = shared::fd_passing::seqpacket_pair().unwrap();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let n = socket::recvmsg::<()>(b.as_raw_fd(), &mut iov, None, MsgFlags::empty())
                .map(|m| m.bytes)
                .unwrap_or(0);
            if n == 0 {
                return;
            }
            let _ = socket::sendmsg::<()>(
                b.as_raw_fd(),
                &[IoSlice::new(&[1])],
                &[],
                MsgFlags::MSG_NOSIGNAL,
                None,
            );
        }
    });
    let mut samples = Vec::with_capacity(iterations);
    let mut buf = [0u8; 16];
    for _ in 0..iterations {
        let t = Instant::now();
        socket::sendmsg::<()>(
            a.as_raw_fd(),
            &[IoSlice::new(&[1])],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .unwrap();
        let mut iov = [IoSliceMut::new(&mut buf)];
        socket::recvmsg::<()>(a.as_raw_fd(), &mut iov, None, MsgFlags::empty()).unwrap();
        samples.push(t.elapsed());
    }
    drop(a);
    echo.join().unwrap();
    samples
}

fn doorbell_round_trip(dev: &SimDevice, iterations: usize) -> Vec<Duration> {
    let nc = dev.claim_nc(0).unwrap();
    let window = nc.semaphore_window.expect("sim maps the semaphore window");
    let pa = window.pa() + SEM_WINDOW_SEMAPHORES as u64 + 4 * 3;
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let before = window.load_u32(pa, Ordering::Acquire).unwrap();
        let t = Instant::now();
        dev.semaphore_increment(0, 3, 1).unwrap();
        while window.load_u32(pa, Ordering::Acquire).unwrap() == before {
            std::hint::spin_loop();
        }
        samples.push(t.elapsed());
    }
    samples
}

fn dma_vs_memcpy(dev: &SimDevice, size: u64, reps: usize) -> (f64, f64) {
    let len = usize::try_from(size).unwrap();
    let src = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, size, 0).unwrap();
    let dst = dev.mem_alloc(MemLocation::Hbm { nc: 0 }, size, 0).unwrap();
    let (ms, md) = (dev.mem_map(&src).unwrap(), dev.mem_map(&dst).unwrap());
    ms.fill(src.pa, len, 0x5A).unwrap();
    let pairs = u32::try_from(size.div_ceil(65536))
        .unwrap()
        .next_multiple_of(16)
        .max(32);
    let mut q = DmaQueue::create(
        dev,
        DmaQueueId {
            nc: 0,
            engine: 0,
            queue: 0,
        },
        pairs,
        MemLocation::Hbm { nc: 0 },
    )
    .unwrap();
    let mut dma = Vec::with_capacity(reps);
    let mut mem = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        q.push_copy(src.pa, dst.pa, size).unwrap();
        q.kick(dev).unwrap();
        dma.push(t.elapsed());
        let t = Instant::now();
        shared::memory::copy(&ms, src.pa, &md, dst.pa, len).unwrap();
        mem.push(t.elapsed());
    }
    dma.sort();
    mem.sort();
    let gbps = |d: Duration| size as f64 / d.as_secs_f64() / 1e9;
    let (d, m) = (percentile(&dma, 500), percentile(&mem, 500));
    q.release(dev).unwrap();
    dev.mem_free(src.handle).unwrap();
    dev.mem_free(dst.handle).unwrap();
    (gbps(d), gbps(m))
}

fn main() {
    run_as_simdev_if_asked();
    let dev = private_simdev(&["--hbm", "256M"]);
    println!(
        "device boundary benchmark (simdev pid in {}, release build)",
        dev.info().description
    );

    let n = 20_000;
    let (floor50, floor99) = summarize(
        "floor: SOCK_SEQPACKET ping-pong, two threads",
        seqpacket_ping_pong_floor(n),
    );
    let (db50, db99) = summarize(
        "doorbell -> semaphore visible in shared memory",
        doorbell_round_trip(&dev, n),
    );
    println!(
        "{:<48} median {:>8.2}x   p99 {:>8.2}x",
        "doorbell / floor",
        db50.as_secs_f64() / floor50.as_secs_f64(),
        db99.as_secs_f64() / floor99.as_secs_f64()
    );
    println!();
    for (size, reps) in [(64u64 << 10, 400), (1 << 20, 100), (16 << 20, 20)] {
        let (dma, mem) = dma_vs_memcpy(&dev, size, reps);
        println!(
            "copy {:>6} KiB: DMA {:>7.2} GB/s   memcpy {:>7.2} GB/s   DMA/memcpy bandwidth {:.2}",
            size >> 10,
            dma,
            mem,
            dma / mem
        );
    }
}
