//! Issue 17's targets, each measured beside its floor or peer in the same run, in interleaved
//! chunks (so drift of the machine affects both sides alike), printing p50, p99 and the ratio
//! with the target next to it (the verdict is the pooled samples' p50 ratio; beside it, for
//! sections 1–3, the spread of the chunks' own p50 ratios, which shows how much of a verdict
//! near its threshold is the machine's noise):
//!
//! 1. Identity 64 B sync execute vs the composite IPC floor (`tests::ipc_floor`: a message of
//!    a doorbell's encoded size to a peer process, the reply through a memfd and a
//!    non-private futex, an eventfd wake of the submitter). Target p50 <= 1.5x; p99 reported.
//! 2. Digits MLP batch 1 vs the identity model of the same I/O bytes. Digits moves 64 f32 in
//!    (256 B) and 10 f32 out (40 B), one DMA descriptor each way; the identity model of 256 B
//!    moves 256 B in and 256 B out (one descriptor each way): at least as many bytes in each
//!    direction. Target p50 <= 2x.
//! 3. Digits MLP batch 360 vs a straight `matrixmultiply::sgemm` forward pass of the same
//!    network (fc1 + bias + ReLU, fc2 + bias + ReLU, fc3 + bias) on the same 360 inputs in this
//!    process, whose logits are checked against simdev's. Target p50 <= 1.5x.
//! 4. Async identity 64 B throughput with 16 in flight (the explicit async API, as
//!    `nrt bench --async 16`) vs pipelined posted doorbells to the same simdev over the same
//!    connection: N `SemaphoreIncrement`s of semaphore 7 of NC 1 (claimed by the same client;
//!    no program is loaded there, so nothing starts), then one `SemaphoreRead` as a barrier.
//!    Target executions/s >= 0.5 x doorbells/s. Beside them, interleaved, the system calls
//!    the seeds prescribe per execution and nothing else (the submit's `has_work_efd` write
//!    and doorbell, the worker's read of one count, all on one thread): the rate no execution
//!    can beat. Then where the time goes: both processes' CPU time per execution and per
//!    doorbell, split user/kernel (`/proc`, over one long run of each), and the ratio the
//!    kernel's share alone would allow.
//! 5. simdev's own heap allocations per execution (counted inside the simdev process:
//!    `tests::counted_simdev`) and its thread hand-offs (its per-NC counters
//!    `inline_executions` and `sequencer_handoffs`), for identity sync, digits batch 1 and
//!    async 16. Target: 0 allocations, every execution inline (at most one hand-off). Beside
//!    them, the runtime's XU worker steps per execution (`tpb_xu_step` calls: 1 when each
//!    request is first stepped at its notification), its `epoll_wait` returns, and how often
//!    simdev's threads were preempted (involuntary context switches, from `/proc`).
//! 6. A real NEFF run shape-only (`matmul_large`, LNC=2 on a second, trn2 simdev): each sync
//!    execution has simdev write the 16 MiB `output0` as the documented function of the
//!    inputs (`shared::neff_program::shape_only`), each subgraph its half. Beside it, storing
//!    16 MiB in this process (`memset` into a buffer of the output's size: the machine's store
//!    bandwidth, a floor no run that writes those bytes can beat). Reported, no target: what a
//!    laptop user's large NEFF costs per call.
//!
//! Everything — this process, its threads, the floor's peer and simdev (the `counted-simdev`
//! binary) — runs on one CPU, the first it may run on (`tests::bench::pin_to_one_cpu`; children
//! inherit the mask): CPU 0, or CPU 1 under `taskset -c 1`.
//!
//! Run: `cargo bench -p tests --bench simdev_speed` (under a minute); add `-- --unpinned` to
//! let the scheduler place everything on every CPU, and `-- --sched normal` to run simdev's
//! threads with Linux's default policy and slice instead of simdev's default (`SCHED_BATCH`
//! with a 100 us slice, `simdev::sched`), and `-- --receive recvmmsg` to have its connection
//! thread write its notification eventfds and then wait in `recvmmsg` instead of both in one
//! io_uring call (`simdev::uring`), and `-- --only 1,3` to run those sections only (to profile
//! one). Figures are printed, not asserted.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::backend::sim::SimDevice;
use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use runtime::{Device, ModelHandle, Placement, Runtime, Tensor, TensorSet};
use shared::NrtStatus;
use shared::model::Target;
use shared::protocol::{self, MAX_MSG_SIZE, Request};
use tests::bench::{CpuTime, IdentityIo, percentile, us};
use tests::counted_simdev::{CountedSimdev, SimdevCost};
use tests::ipc_floor::CompositeFloor;
use tests::matmul_neff;

/// The NC the runtime uses.
const NC: u32 = 0;
/// The NC the doorbell peer of section 4 rings.
const DOORBELL_NC: u32 = 1;
/// Its semaphore (no program waits on it).
const DOORBELL_SEMAPHORE: u32 = 7;

/// `ratio 1.43x (target <= 1.5x, met)`.
fn verdict(ratio: f64, target: &str, met: bool) -> String {
    format!(
        "ratio {ratio:.2}x (target {target}, {})",
        if met { "met" } else { "NOT met" }
    )
}

/// Sorted samples.
fn sorted(mut v: Vec<Duration>) -> Vec<Duration> {
    v.sort();
    v
}

fn line(name: &str, s: &[Duration]) {
    println!(
        "  {name:<52} p50 {:>8.1} us   p99 {:>8.1} us   (n = {})",
        us(percentile(s, 500)),
        us(percentile(s, 990)),
        s.len()
    );
}

/// Samples of `a` and `b` from interleaved chunks, sorted, and the ratio of `a`'s p50 to `b`'s
/// in each chunk (how much of a pooled ratio is the machine's noise: a burst of it lands on
/// the chunks of both sides run around it).
struct Interleaved {
    a: Vec<Duration>,
    b: Vec<Duration>,
    chunk_p50_ratios: Vec<f64>,
}

impl Interleaved {
    /// `  p50 ratio per chunk: min 1.41x, median 1.47x, max 1.60x (20 chunks)`.
    fn spread(&self) -> String {
        let mut r = self.chunk_p50_ratios.clone();
        r.sort_by(f64::total_cmp);
        match (r.first(), r.get(r.len() / 2), r.last()) {
            (Some(min), Some(median), Some(max)) => format!(
                "p50 ratio per chunk: min {min:.2}x, median {median:.2}x, max {max:.2}x ({} chunks, reported)",
                r.len()
            ),
            _ => "no chunks".into(),
        }
    }
}

/// Runs `a` and `b` in `chunks` interleaved chunks of `per_chunk` samples each.
fn interleaved(
    chunks: usize,
    per_chunk: usize,
    mut a: impl FnMut() -> Duration,
    mut b: impl FnMut() -> Duration,
) -> Interleaved {
    let (mut va, mut vb) = (
        Vec::with_capacity(chunks * per_chunk),
        Vec::with_capacity(chunks * per_chunk),
    );
    let mut chunk_p50_ratios = Vec::with_capacity(chunks);
    for _ in 0..chunks {
        let ca = sorted((0..per_chunk).map(|_| a()).collect());
        let cb = sorted((0..per_chunk).map(|_| b()).collect());
        chunk_p50_ratios.push(
            percentile(&ca, 500).as_secs_f64() / percentile(&cb, 500).as_secs_f64().max(1e-12),
        );
        va.extend(ca);
        vb.extend(cb);
    }
    Interleaved {
        a: sorted(va),
        b: sorted(vb),
        chunk_p50_ratios,
    }
}

fn timed(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// The encoded size of a sync execute's doorbell.
fn doorbell_len() -> usize {
    let mut buf = [0u8; MAX_MSG_SIZE];
    protocol::encode(
        &Request::SemaphoreIncrement {
            nc: NC,
            index: shared::sequencer::SEM_INFERENCE_START,
            value: 1,
        },
        &mut buf,
    )
    .expect("a doorbell encodes")
}

/// Section 1.
fn identity_vs_floor(rt: &Runtime, id: &IdentityIo) {
    let len = doorbell_len();
    let floor = CompositeFloor::start(&std::env::current_exe().unwrap(), len).unwrap();
    let exec = || timed(|| rt.execute(id.model, &id.inputs, &id.outputs).unwrap());
    for _ in 0..2_000 {
        exec();
        floor.round_trip();
    }
    let runs = interleaved(20, 1_000, exec, || floor.round_trip());
    let (e, f) = (&runs.a, &runs.b);
    let mut out = [0u8; 64];
    id.output.read(&mut out, 0).unwrap();
    assert_eq!(out, [0x5A; 64], "the identity model copied its input");
    println!("1. sync execute, identity 64 B, vs the composite IPC floor");
    println!(
        "   (floor: {len} B SOCK_SEQPACKET message to a peer process, reply through a memfd + \
         non-private futex, eventfd wake of the submitter)"
    );
    line("identity 64 B sync execute", e);
    line("composite IPC floor", f);
    let ratio = |p| percentile(e, p).as_secs_f64() / percentile(f, p).as_secs_f64();
    println!(
        "  p50 {}",
        verdict(ratio(500), "<= 1.5x", ratio(500) <= 1.5)
    );
    println!("  p99 ratio {:.2}x (reported)", ratio(990));
    println!("  {}", runs.spread());
}

/// A model loaded on core 0 with one input and one output tensor.
struct Loaded {
    model: ModelHandle,
    input: Tensor,
    output: Tensor,
    ins: TensorSet,
    outs: TensorSet,
}

impl Loaded {
    fn new(rt: &Runtime, model: &shared::model::Model, in_bytes: u64, out_bytes: u64) -> Self {
        let model = rt
            .load(&model.to_container(Target::Simdev).unwrap(), 0)
            .unwrap();
        let on = Placement::Device { vnc: 0 };
        let input = rt.tensor_allocate(on, in_bytes, "input").unwrap();
        let output = rt.tensor_allocate(on, out_bytes, "output").unwrap();
        let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
        ins.add("input", &input);
        outs.add("output", &output);
        Self {
            model,
            input,
            output,
            ins,
            outs,
        }
    }

    fn execute(&self, rt: &Runtime) -> Duration {
        timed(|| rt.execute(self.model, &self.ins, &self.outs).unwrap())
    }

    fn logits(&self, rows: usize) -> Vec<f32> {
        let mut out = vec![0u8; rows * CLASSES * 4];
        self.output.read(&mut out, 0).unwrap();
        out.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn unload(self, rt: &Runtime) {
        let Self {
            model,
            input,
            output,
            ins,
            outs,
        } = self;
        drop((input, output, ins, outs));
        rt.unload(model).unwrap();
    }
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// The digits MLP at `batch` with its first `batch` test images written.
fn digits_model(rt: &Runtime, data: &Digits, batch: usize) -> Loaded {
    let model = data.mlp().build(u32::try_from(batch).unwrap()).unwrap();
    let d = Loaded::new(
        rt,
        &model,
        (batch * FEATURES * 4) as u64,
        (batch * CLASSES * 4) as u64,
    );
    d.input
        .write(&to_bytes(&data.inputs[..batch * FEATURES]), 0)
        .unwrap();
    d
}

/// Section 2.
fn digits_batch_1_vs_identity(rt: &Runtime, data: &Digits) {
    /// Digits' input row: 64 f32.
    const IDENTITY_BYTES: u32 = 256;
    const _: () = assert!(IDENTITY_BYTES as usize == FEATURES * 4);
    let digits = digits_model(rt, data, 1);
    let identity = Loaded::new(
        rt,
        &runtime::builder::identity(IDENTITY_BYTES),
        IDENTITY_BYTES.into(),
        IDENTITY_BYTES.into(),
    );
    identity.input.write(&[0x5A; FEATURES * 4], 0).unwrap();
    for _ in 0..300 {
        digits.execute(rt);
        identity.execute(rt);
    }
    let diff = max_abs_diff(&digits.logits(1), &data.logits[..CLASSES]);
    let runs = interleaved(20, 250, || digits.execute(rt), || identity.execute(rt));
    let (d, i) = (&runs.a, &runs.b);
    println!("2. digits MLP batch 1 vs identity of the same I/O bytes");
    println!(
        "   (digits moves 256 B in + 40 B out; identity {IDENTITY_BYTES} B moves {IDENTITY_BYTES} B \
         in + {IDENTITY_BYTES} B out: at least as many each way; logits within {diff:.1e} of the \
         reference)"
    );
    line("digits batch 1 sync execute", d);
    line(&format!("identity {IDENTITY_BYTES} B sync execute"), i);
    let ratio = |p| percentile(d, p).as_secs_f64() / percentile(i, p).as_secs_f64();
    println!("  p50 {}", verdict(ratio(500), "<= 2x", ratio(500) <= 2.0));
    println!("  p99 ratio {:.2}x (reported)", ratio(990));
    println!("  {}", runs.spread());
    digits.unload(rt);
    identity.unload(rt);
}

/// The digits MLP's forward pass on the host with `matrixmultiply::sgemm`: per layer, the
/// output rows start as the bias, `sgemm` adds `x · W` (beta = 1), then ReLU (not after fc3).
/// Buffers are made once; `forward` allocates nothing.
struct GemmForward<'a> {
    layers: &'a [(Vec<f32>, Vec<f32>)],
    rows: usize,
    hidden: Vec<Vec<f32>>,
}

impl<'a> GemmForward<'a> {
    fn new(data: &'a Digits, rows: usize) -> Self {
        let hidden = data
            .layers
            .iter()
            .map(|(_, b)| vec![0f32; rows * b.len()])
            .collect();
        Self {
            layers: &data.layers,
            rows,
            hidden,
        }
    }

    /// Logits `[rows, CLASSES]` of `input` `[rows, FEATURES]`.
    fn forward(&mut self, input: &[f32]) -> &[f32] {
        let last = self.layers.len() - 1;
        for (l, (w, b)) in self.layers.iter().enumerate() {
            let (k, n) = (w.len() / b.len(), b.len());
            let (before, rest) = self.hidden.split_at_mut(l);
            let x: &[f32] = if l == 0 { input } else { &before[l - 1] };
            let y = &mut rest[0];
            assert_eq!((x.len(), y.len()), (self.rows * k, self.rows * n));
            for row in y.chunks_exact_mut(n) {
                row.copy_from_slice(b);
            }
            // SAFETY: x is [rows x k] row-major (strides k, 1), w is [k x n] row-major
            // (strides n, 1), y is [rows x n] row-major (strides n, 1); the lengths were checked
            // above and y does not alias x or w.
            unsafe {
                matrixmultiply::sgemm(
                    self.rows,
                    k,
                    n,
                    1.0,
                    x.as_ptr(),
                    k as isize,
                    1,
                    w.as_ptr(),
                    n as isize,
                    1,
                    1.0,
                    y.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            if l != last {
                for v in y.iter_mut() {
                    *v = v.max(0.0);
                }
            }
        }
        &self.hidden[last]
    }
}

/// Section 3.
fn digits_batch_360_vs_gemm(rt: &Runtime, data: &Digits) {
    let rows = data.count();
    let digits = digits_model(rt, data, rows);
    let input = &data.inputs[..rows * FEATURES];
    let mut host = GemmForward::new(data, rows);
    digits.execute(rt);
    let sim_logits = digits.logits(rows);
    assert!(
        sim_logits.iter().any(|v| v.abs() > 1.0),
        "simdev's logits are not the network's"
    );
    let host_diff = max_abs_diff(host.forward(input), &sim_logits);
    let ref_diff = max_abs_diff(host.forward(input), &data.logits);
    assert!(
        host_diff <= 1e-3,
        "the host forward pass is not simdev's network: logits differ by {host_diff}"
    );
    for _ in 0..20 {
        digits.execute(rt);
        std::hint::black_box(host.forward(std::hint::black_box(input)));
    }
    let runs = interleaved(
        20,
        50,
        || digits.execute(rt),
        || {
            timed(|| {
                std::hint::black_box(host.forward(std::hint::black_box(input)));
            })
        },
    );
    let (d, g) = (&runs.a, &runs.b);
    println!("3. digits MLP batch {rows} vs a matrixmultiply::sgemm forward pass in this process");
    println!(
        "   (the same network: fc1+bias+ReLU, fc2+bias+ReLU, fc3+bias; host logits within \
         {host_diff:.1e} of simdev's, {ref_diff:.1e} of the reference)"
    );
    line(&format!("digits batch {rows} sync execute"), d);
    line("sgemm forward pass", g);
    let ratio = |p| percentile(d, p).as_secs_f64() / percentile(g, p).as_secs_f64();
    println!(
        "  p50 {}",
        verdict(ratio(500), "<= 1.5x", ratio(500) <= 1.5)
    );
    println!("  p99 ratio {:.2}x (reported)", ratio(990));
    println!("  {}", runs.spread());
    digits.unload(rt);
}

/// Runs `executions` of `m` keeping `slots.len()` in flight through the explicit async API.
fn run_async(rt: &Runtime, slots: &[Loaded], executions: u32) -> Duration {
    let mut pending = VecDeque::with_capacity(slots.len());
    let t = Instant::now();
    for e in 0..executions {
        if pending.len() == slots.len() {
            let r = pending.pop_front().unwrap();
            assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
        }
        let s = &slots[e as usize % slots.len()];
        pending.push_back(rt.execute_schedule(s.model, &s.ins, &s.outs).unwrap());
    }
    for r in pending {
        assert_eq!(rt.wait(&r).unwrap(), NrtStatus::Success);
    }
    t.elapsed()
}

/// `n` posted doorbells, then a round-trip request as the barrier that they were all handled.
fn run_doorbells(dev: &SimDevice, n: u32) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        dev.semaphore_increment(DOORBELL_NC, DOORBELL_SEMAPHORE, 1)
            .unwrap();
    }
    dev.semaphore_read(DOORBELL_NC, DOORBELL_SEMAPHORE).unwrap();
    t.elapsed()
}

/// `n` rounds of the system calls seeds 000 and 004 prescribe for each execution, and nothing
/// else: the submit's `write(has_work_efd, 1)` and its posted doorbell, then the worker's
/// `read(has_work_efd)` of one count (here on this thread: no hand-off, no wake-up, so a lower
/// bound on any execution's cost); then the barrier of [`run_doorbells`].
fn run_prescribed_calls(
    dev: &SimDevice,
    has_work: &nix::sys::eventfd::EventFd,
    n: u32,
) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        has_work.write(1).unwrap();
        dev.semaphore_increment(DOORBELL_NC, DOORBELL_SEMAPHORE, 1)
            .unwrap();
        assert_eq!(has_work.read().unwrap(), 1);
    }
    dev.semaphore_read(DOORBELL_NC, DOORBELL_SEMAPHORE).unwrap();
    t.elapsed()
}

/// Identity 64 B tensor sets for `n` executions in flight, sharing one loaded model.
fn async_slots(rt: &Runtime, n: usize) -> Vec<Loaded> {
    let first = Loaded::new(rt, &runtime::builder::identity(64), 64, 64);
    let model = first.model;
    let mut slots = vec![first];
    for _ in 1..n {
        let on = Placement::Device { vnc: 0 };
        let input = rt.tensor_allocate(on, 64, "input").unwrap();
        let output = rt.tensor_allocate(on, 64, "output").unwrap();
        let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
        ins.add("input", &input);
        outs.add("output", &output);
        slots.push(Loaded {
            model,
            input,
            output,
            ins,
            outs,
        });
    }
    slots
}

/// Section 4.
fn async_vs_doorbells(rt: &Runtime, dev: &SimDevice, simdev_pid: u32, slots: &[Loaded]) {
    const ROUNDS: u32 = 10;
    const EXECUTIONS: u32 = 5_000;
    const DOORBELLS: u32 = 20_000;
    run_async(rt, slots, 1_000);
    run_doorbells(dev, 2_000);
    // As has_work_efd is made (seed 004 §3: EFD_NONBLOCK | EFD_SEMAPHORE).
    let has_work = nix::sys::eventfd::EventFd::from_value_and_flags(
        0,
        nix::sys::eventfd::EfdFlags::EFD_NONBLOCK | nix::sys::eventfd::EfdFlags::EFD_SEMAPHORE,
    )
    .unwrap();
    let (mut exec_time, mut bell_time, mut calls_time) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        exec_time += run_async(rt, slots, EXECUTIONS);
        bell_time += run_doorbells(dev, DOORBELLS);
        calls_time += run_prescribed_calls(dev, &has_work, DOORBELLS);
    }
    let eps = f64::from(ROUNDS * EXECUTIONS) / exec_time.as_secs_f64();
    let dps = f64::from(ROUNDS * DOORBELLS) / bell_time.as_secs_f64();
    let cps = f64::from(ROUNDS * DOORBELLS) / calls_time.as_secs_f64();
    println!(
        "4. async identity 64 B, {} in flight, vs pipelined posted doorbells",
        slots.len()
    );
    println!(
        "   (doorbells: SemaphoreIncrement of semaphore {DOORBELL_SEMAPHORE} of NC {DOORBELL_NC}, \
         on which nothing waits, on the runtime's own connection; one SemaphoreRead barrier per \
         {DOORBELLS}; {ROUNDS} interleaved rounds)"
    );
    println!("  {:<52} {eps:>10.0} executions/s", "async identity");
    println!("  {:<52} {dps:>10.0} doorbells/s", "posted doorbells");
    println!(
        "  {:<52} {cps:>10.0} rounds/s",
        "prescribed calls only (has_work write, doorbell, read)"
    );
    println!(
        "  executions/s / doorbells/s {}",
        verdict(eps / dps, ">= 0.5x", eps / dps >= 0.5)
    );
    println!(
        "  the prescribed calls alone reach {:.2}x of doorbells/s (an execution cannot do better; \
         executions/s are {:.2}x of them)",
        cps / dps,
        eps / cps
    );
    cpu_split(rt, dev, simdev_pid, slots);
}

/// Where section 4's time goes: the CPU time of both processes (all threads) split between user
/// space and the kernel, over one long run of each kind (the kernel samples the split at its
/// tick, so short windows would mostly measure the sampling). The kernel's share — the system
/// calls the seeds prescribe per execution (the doorbell, the has_work_efd write and read) and
/// the wake-ups they cause — bounds the ratio even were all user-space work free.
fn cpu_split(rt: &Runtime, dev: &SimDevice, simdev_pid: u32, slots: &[Loaded]) {
    const EXECUTIONS: u32 = 150_000;
    const DOORBELLS: u32 = 400_000;
    let cpu = || {
        CpuTime::of(None)
            .zip(CpuTime::of(Some(simdev_pid)))
            .map(|(me, sim)| me + sim)
    };
    let during = |run: &dyn Fn() -> Duration| {
        let before = cpu();
        let took = run();
        (
            took,
            cpu().zip(before).map(|(after, before)| after.since(before)),
        )
    };
    let (_, exec) = during(&|| run_async(rt, slots, EXECUTIONS));
    let (bell_time, bell) = during(&|| run_doorbells(dev, DOORBELLS));
    let dps = f64::from(DOORBELLS) / bell_time.as_secs_f64();
    let (Some(e), Some(b)) = (exec, bell) else {
        println!("  CPU per execution: /proc cannot say");
        return;
    };
    let per = |t: Duration, n: u32| us(t) / f64::from(n);
    println!(
        "  CPU per execution {:.2} us (user {:.2}, kernel {:.2}); per doorbell {:.2} us (user \
         {:.2}, kernel {:.2}) — both processes, {EXECUTIONS} executions and {DOORBELLS} \
         doorbells, /proc's tick-sampled split",
        per(e.user + e.system, EXECUTIONS),
        per(e.user, EXECUTIONS),
        per(e.system, EXECUTIONS),
        per(b.user + b.system, DOORBELLS),
        per(b.user, DOORBELLS),
        per(b.system, DOORBELLS),
    );
    let kernel_us = per(e.system, EXECUTIONS);
    if kernel_us > 0.0 {
        println!(
            "  were user space free, executions/s / doorbells/s would be at most {:.2}x (the \
             kernel's time per execution alone, against this run's {dps:.0} doorbells/s)",
            1e6 / kernel_us / dps
        );
    }
}

/// Section 5: simdev's allocations and hand-offs per execution.
fn simdev_costs(
    rt: &Runtime,
    sim: &mut CountedSimdev,
    dev: &SimDevice,
    id: &IdentityIo,
    data: &Digits,
    slots: &[Loaded],
) {
    const N: u64 = 2_000;
    let digits = digits_model(rt, data, 1);
    let identity_sync = || {
        for _ in 0..N {
            rt.execute(id.model, &id.inputs, &id.outputs).unwrap();
        }
    };
    let digits_sync = || {
        for _ in 0..N {
            digits.execute(rt);
        }
    };
    let identity_async = || {
        run_async(rt, slots, u32::try_from(N).unwrap());
    };
    // Warm-up, then the counted run.
    identity_sync();
    digits_sync();
    identity_async();
    // The runtime's side of the same runs: tpb_xu_step calls of the XU worker per execution
    // (1 when the worker is first stepped at the notification; more when a has_work_efd wake
    // steps a request still in flight).
    let xu = rt.xu(NC).expect("the vNC's compute XU");
    // And the worker's epoll_wait returns per execution (below 1 when harvest bursts step
    // several completions per wake-up).
    let mut measure = |run: &dyn Fn()| {
        let (steps, waits) = (xu.steps(), rt.xu_worker_epoll_returns());
        let cost = SimdevCost::measure(sim, dev, NC, N, run).unwrap();
        let per = |n: u64| n as f64 / N as f64;
        (
            cost,
            (
                per(xu.steps() - steps),
                per(rt.xu_worker_epoll_returns() - waits),
            ),
        )
    };
    let costs = [
        ("identity 64 B sync", measure(&identity_sync)),
        ("digits batch 1 sync", measure(&digits_sync)),
        (
            "identity 64 B async, 16 in flight",
            measure(&identity_async),
        ),
    ];
    println!(
        "5. simdev's own cost per execution, steady state ({N} executions each after warm-up; \
         counted in the simdev process)"
    );
    println!(
        "  {:<36} {:>12} {:>12} {:>18} {:>12} {:>14} {:>13} {:>10}",
        "",
        "allocations",
        "executions",
        "inline_executions",
        "handoffs",
        "worker steps",
        "epoll waits",
        "preempted"
    );
    for (name, (c, (steps, waits))) in &costs {
        println!(
            "  {name:<36} {:>12.2} {:>12.2} {:>18.2} {:>12.2} {steps:>14.2} {waits:>13.2} {:>10.2}",
            c.per_call(c.allocations),
            c.per_call(c.executions),
            c.per_call(c.inline_executions),
            c.per_call(c.sequencer_handoffs),
            c.per_call(c.preemptions),
        );
    }
    println!(
        "  (preempted: simdev's involuntary context switches, from /proc: with --receive \
         recvmmsg its connection thread is preempted by the woken worker between its \
         notification write and its wait)"
    );
    let all_zero = costs.iter().all(|(_, (c, _))| c.allocations == 0);
    let all_inline = costs
        .iter()
        .take(2)
        .all(|(_, (c, _))| c.sequencer_handoffs == 0 && c.inline_executions == c.executions);
    println!(
        "  allocations per execution: target 0, {}; sync executions all inline, no sequencer \
         hand-off: {}",
        if all_zero { "met" } else { "NOT met" },
        if all_inline { "met" } else { "NOT met" }
    );
    digits.unload(rt);
}

/// matmul_large's tensor sizes in bytes (x[128,32768], y[32768,65536], output0[128,65536],
/// float16).
const LARGE: (u64, u64, u64) = (8 << 20, 4 << 30, 16 << 20);

/// Section 6.
fn neff_shape_only_vs_store(simdev: &Path, pinned: bool) {
    // Default HBM (12 GiB per NC on trn2): y's 4 GiB fits and stays sparse (only x is written;
    // the shape-only function reads the edges of each input).
    let sim = CountedSimdev::spawn(simdev, &["--arch", "trn2"]).unwrap();
    let rt = Runtime::init(
        Arc::new(sim.connect().unwrap()),
        RuntimeConfig {
            num_cores: 1,
            lnc: Some(2),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/data/neff/matmul_large.neff");
    let neff = std::fs::read(&path).unwrap();
    let model = rt.load(&neff, 0).unwrap();
    let io = matmul_neff::io(&rt, Placement::Device { vnc: 0 }, LARGE);
    let x: Vec<u8> = (0..LARGE.0).map(|i| (i % 251) as u8).collect();
    io.x.write(&x, 0).unwrap();
    let out_len = usize::try_from(LARGE.2).unwrap();
    let mut store = vec![0u8; out_len];
    let execute = || timed(|| rt.execute(model, &io.ins, &io.outs).unwrap());
    execute();
    // The output is the documented function (its first and last KiB checked here; the
    // integration tests check every byte).
    let mut out = vec![0u8; out_len];
    io.out.read(&mut out, 0).unwrap();
    assert!(
        out[..1024].iter().any(|&b| b != 0) && out[out_len - 1024..].iter().any(|&b| b != 0),
        "simdev wrote no output"
    );
    let mut byte = 0u8;
    let runs = interleaved(10, 10, execute, || {
        byte = byte.wrapping_add(1);
        timed(|| {
            std::hint::black_box(&mut store).fill(byte);
        })
    });
    let (e, f) = (&runs.a, &runs.b);
    println!(
        "6. shape-only NEFF matmul_large (LNC=2, trn2 simdev{}) vs storing its output in this process",
        if pinned { ", pinned with the rest" } else { "" }
    );
    println!(
        "   (each execution: simdev writes the 16 MiB output0 as the documented shape-only \
         function of the inputs, each subgraph its half; the floor: memset of 16 MiB)"
    );
    line("matmul_large sync execute (shape-only)", e);
    line("memset 16 MiB", f);
    let ratio = |p| percentile(e, p).as_secs_f64() / percentile(f, p).as_secs_f64();
    println!("  p50 ratio {:.2}x (reported, no target)", ratio(500));
    println!("  {}", runs.spread());
    drop(io);
    rt.unload(model).unwrap();
    rt.close();
}

fn main() {
    tests::ipc_floor::run_as_floor_peer_if_asked();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // `--unpinned`: the scheduler places everything on both CPUs (the throughput a user sees
    // with spare cores; the sync ratios then also depend on where each wake-up lands).
    let pinned = !std::env::args().any(|a| a == "--unpinned");
    if pinned {
        tests::bench::pin_to_one_cpu();
    }
    // `--sched POLICY`: simdev's thread policy (its own default when absent).
    let args: Vec<String> = std::env::args().collect();
    let option = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let sched = option("--sched");
    // `--receive PATH`: how simdev's connection thread receives (its default when absent).
    let receive = option("--receive");
    let mut simdev_args = vec!["--hbm", "256M"];
    simdev_args.extend(sched.iter().flat_map(|p| ["--sched", *p]));
    simdev_args.extend(receive.iter().flat_map(|p| ["--receive", *p]));
    let mut sim = CountedSimdev::spawn(
        Path::new(env!("CARGO_BIN_EXE_counted-simdev")),
        &simdev_args,
    )
    .unwrap();
    let dev = Arc::new(sim.connect().unwrap());
    dev.claim_nc(DOORBELL_NC).unwrap();
    let rt = Runtime::init(
        dev.clone(),
        RuntimeConfig {
            num_cores: 1,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    println!(
        "simdev speed (issue 17): this process, its threads, the floor's peer and simdev (pid {}, \
         counting allocator, threads {}, receiving {}) {}; release build",
        sim.pid(),
        sched.map_or(
            "SCHED_BATCH, 100 us slice (simdev's default)".into(),
            |p| format!("--sched {p}")
        ),
        receive.map_or(
            "through io_uring where the kernel allows (simdev's default)".into(),
            |p| { format!("--receive {p}") }
        ),
        if pinned {
            let cpu = nix::sched::sched_getcpu().map_or("?".into(), |c| c.to_string());
            format!("all pinned to CPU {cpu}")
        } else {
            "unpinned (--unpinned: placed by the scheduler)".into()
        }
    );
    // `--only 1,3`: those sections only (a profile of one of them).
    let only: Vec<u32> = option("--only")
        .map(|list| {
            list.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let runs = |section: u32| only.is_empty() || only.contains(&section);
    let id = IdentityIo::load(&rt, 64);
    id.input.write(&[0x5A; 64], 0).unwrap();
    let data = Digits::load(&digits::default_path()).unwrap();
    if runs(1) {
        identity_vs_floor(&rt, &id);
    }
    if runs(2) {
        digits_batch_1_vs_identity(&rt, &data);
    }
    if runs(3) {
        digits_batch_360_vs_gemm(&rt, &data);
    }
    if runs(4) || runs(5) {
        let slots = async_slots(&rt, 16);
        if runs(4) {
            async_vs_doorbells(&rt, &dev, sim.pid(), &slots);
        }
        if runs(5) {
            simdev_costs(&rt, &mut sim, &dev, &id, &data, &slots);
        }
        drop(slots);
    }
    drop(id);
    rt.close();
    if runs(6) {
        neff_shape_only_vs_store(Path::new(env!("CARGO_BIN_EXE_counted-simdev")), pinned);
    }
}
