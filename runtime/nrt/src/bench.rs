//! `nrt bench`: load a model, run it with every output checked, report accuracy, the largest
//! logit error against the reference, latency percentiles and throughput.
//!
//! The digits model runs the 360 held-out UCI digits through the trained MLP in batches of
//! `--batch` images (the last batch of a pass is zero-padded and its padding ignored), on
//! `--ncs` logical cores at once, one thread each. The identity model copies `--bytes` bytes and
//! checks them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use runtime::{Device, DeviceError, ModelHandle, Placement, Runtime, Tensor, TensorSet};
use serde::Serialize;
use shared::model::Target;

/// What to run.
#[derive(Debug)]
pub struct BenchOptions {
    /// `digits` or `identity`.
    pub model: String,
    /// Images per execution (digits).
    pub batch: u32,
    /// Bytes (identity).
    pub bytes: u32,
    /// Executions to time.
    pub iterations: Option<u32>,
    /// Logical cores.
    pub ncs: u32,
    /// Executions kept in flight per core through the explicit async API (0: synchronous).
    pub in_flight: u32,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// What `bench` measured (the `--json` object).
#[derive(Serialize, Debug)]
pub struct BenchReport {
    model: String,
    backend: &'static str,
    batch: u32,
    nc_count: u32,
    /// Executions in flight per core (0 = synchronous).
    in_flight: u32,
    executions: u64,
    images: u64,
    /// Correct / classified (digits; null for identity).
    accuracy: Option<f64>,
    /// max |logit − reference| over the test set (digits).
    max_abs_logit_diff: Option<f32>,
    /// Outputs that did not match (identity) — 0 on success.
    pub failures: u64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    executions_per_second: f64,
    images_per_second: f64,
    /// Whether the executions ran on a device: false with `NEURON_RT_FUNTIME=1`, where execute
    /// returns success at once and no output (hence no accuracy) means anything.
    ran_on_device: bool,
    /// Why the figures do not describe a device, when they do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// The note of a `NEURON_RT_FUNTIME=1` run.
const FUNTIME_NOTE: &str = "NEURON_RT_FUNTIME=1: nothing ran on a device (execute returned success at once); outputs were not checked and no accuracy is reported";

/// File descriptors each in-flight slot costs: its two device tensors are two memory chunks,
/// each a memfd in simdev (and a mapping here).
const FDS_PER_SLOT: u64 = 2;

/// File descriptors kept for everything else: sockets, eventfds, rings, stdio.
const FD_RESERVE: u64 = 256;

/// The most `--async` slots per core that `ncs` cores can open within this process's
/// `RLIMIT_NOFILE` (a private simdev inherits the same limit).
fn max_in_flight(ncs: u32) -> Result<u64, String> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_err(|e| format!("reading RLIMIT_NOFILE: {e}"))?;
    Ok(soft.saturating_sub(FD_RESERVE) / (FDS_PER_SLOT * u64::from(ncs.max(1))))
}

struct Core {
    model: ModelHandle,
    input: Tensor,
    output: Tensor,
    ins: TensorSet,
    outs: TensorSet,
}

/// One tensor pair of a loaded model on one core.
fn core(
    rt: &Runtime,
    vnc: u32,
    model: ModelHandle,
    in_bytes: u64,
    out_bytes: u64,
) -> Result<Core, String> {
    let input = rt
        .tensor_allocate(Placement::Device { vnc }, in_bytes, "input")
        .map_err(|e| e.to_string())?;
    let output = rt
        .tensor_allocate(Placement::Device { vnc }, out_bytes, "output")
        .map_err(|e| e.to_string())?;
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &input);
    outs.add("output", &output);
    Ok(Core {
        model,
        input,
        output,
        ins,
        outs,
    })
}

/// Loads `container` on each of `ncs` cores and allocates `slots` tensor pairs per core.
fn cores(
    rt: &Runtime,
    ncs: u32,
    slots: u32,
    container: &[u8],
    in_bytes: u64,
    out_bytes: u64,
) -> Result<Vec<Vec<Core>>, String> {
    (0..ncs)
        .map(|v| {
            let m = rt
                .load(container, i32::try_from(v).unwrap_or(0))
                .map_err(|e| e.to_string())?;
            (0..slots.max(1))
                .map(|_| core(rt, v, m, in_bytes, out_bytes))
                .collect()
        })
        .collect()
}

fn bar(total: u64, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} executions {elapsed_precise} {per_sec}",
    ) {
        pb.set_style(style);
    }
    pb
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs the benchmark on the device `open` returns.
///
/// # Errors
/// A message naming the failing step.
pub fn run(
    opts: &BenchOptions,
    open: impl FnOnce() -> Result<Box<dyn Device>, DeviceError>,
) -> Result<BenchReport, String> {
    if opts.ncs == 0 {
        return Err("--ncs must be at least 1".into());
    }
    if opts.iterations == Some(0) {
        return Err("--iterations must be at least 1".into());
    }
    let most = max_in_flight(opts.ncs)?;
    if u64::from(opts.in_flight) > most {
        return Err(format!(
            "--async {} on {} core(s) needs about {} file descriptors ({FDS_PER_SLOT} per in-flight slot) but RLIMIT_NOFILE allows {most} slots per core: use --async {most} or fewer (an XU queue holds 16 executions; further slots wait for a completion), or raise the limit (ulimit -n)",
            opts.in_flight,
            opts.ncs,
            u64::from(opts.in_flight) * FDS_PER_SLOT * u64::from(opts.ncs),
        ));
    }
    match opts.model.as_str() {
        "digits" if !(1..=360).contains(&opts.batch) => {
            return Err(format!(
                "--batch {} is outside 1..=360 (the digits test set has 360 images)",
                opts.batch
            ));
        }
        "identity" if opts.batch != 1 => {
            return Err(
                "--batch applies to the digits model; the identity model copies --bytes".into(),
            );
        }
        "digits" | "identity" => {}
        other => {
            return Err(format!(
                "unknown model {other:?} (available: digits, identity)"
            ));
        }
    }
    let mut config = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    let dev = open().map_err(|e| crate::error_chain(&e))?;
    let arch = dev.info().arch;
    if config.lnc == 2 && arch != shared::Arch::Trn2 {
        return Err(format!(
            "NEURON_LOGICAL_NC_CONFIG=2 needs a trn2 device; this one is {}",
            arch.name()
        ));
    }
    if opts.model == "digits" && opts.batch < config.lnc {
        return Err(format!(
            "--batch {} is too small for NEURON_LOGICAL_NC_CONFIG={}: each execution's rows are split over the {} physical NCs of a logical core; use --batch {} or more",
            opts.batch, config.lnc, config.lnc, config.lnc
        ));
    }
    let logical = dev.info().nc_count / config.lnc.max(1);
    if config.visible_cores.is_none() {
        if opts.ncs > logical {
            return Err(format!(
                "--ncs {} but the device has {logical} logical cores",
                opts.ncs
            ));
        }
        config.num_cores = opts.ncs;
    }
    let backend = dev.backend_name();
    let rt = Runtime::init(Arc::from(dev), config).map_err(|e| e.to_string())?;
    let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
    if rt.implicit_async() {
        // Implicit async: execute returns at once, statuses arrive through the callback and
        // tensor reads wait for the executions that use them.
        let f = failures.clone();
        rt.register_async_exec_callback(Arc::new(move |_, _, _, status| {
            if status != shared::NrtStatus::Success {
                f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }))
        .map_err(|e| e.to_string())?;
    }
    let ncs = rt.visible_vnc_count().min(opts.ncs);
    let result = match opts.model.as_str() {
        "digits" => run_digits(&rt, opts, ncs, backend),
        _ => run_identity(&rt, opts, ncs, backend),
    };
    let funtime = rt.config().funtime;
    rt.close();
    result.map(|mut r| {
        r.failures += failures.load(std::sync::atomic::Ordering::Relaxed);
        if funtime {
            // Nothing ran: the outputs are whatever the tensors held.
            r.ran_on_device = false;
            r.note = Some(FUNTIME_NOTE.into());
            r.accuracy = None;
            r.max_abs_logit_diff = None;
        }
        r
    })
}

/// Runs `f(core index, its tensor slots)` on one scoped thread per core and gathers the
/// latencies.
fn on_each_core(
    all: &[Vec<Core>],
    f: impl Fn(usize, &[Core]) -> Result<Vec<Duration>, String> + Sync,
) -> Result<Vec<Duration>, String> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = all
            .iter()
            .enumerate()
            .map(|(v, slots)| s.spawn(move || f(v, slots)))
            .collect();
        let mut samples = Vec::new();
        for h in handles {
            samples.extend(
                h.join()
                    .map_err(|_| "a bench thread panicked".to_string())??,
            );
        }
        Ok(samples)
    })
}

/// Runs executions `es` of one core through `slots` (tensor sets): synchronously with one slot,
/// or keeping `slots.len()` in flight through the explicit async API. `prepare` writes slot
/// inputs for execution `e`; `finish` checks its outputs. Returns each execution's latency
/// (schedule to observed completion).
fn pipeline(
    rt: &Runtime,
    slots: &[Core],
    asynchronous: bool,
    es: impl Iterator<Item = u64>,
    mut prepare: impl FnMut(u64, &Core) -> Result<(), String>,
    mut finish: impl FnMut(u64, &Core) -> Result<(), String>,
    pb: &indicatif::ProgressBar,
) -> Result<Vec<Duration>, String> {
    let mut times = Vec::new();
    // One untimed execution per slot first (table loads, first-touch of ring pages).
    for c in slots {
        rt.execute(c.model, &c.ins, &c.outs)
            .map_err(|err| format!("warm-up: {err}"))?;
    }
    if !asynchronous {
        let c = &slots[0];
        for e in es {
            prepare(e, c)?;
            let t = Instant::now();
            rt.execute(c.model, &c.ins, &c.outs)
                .map_err(|err| format!("execution {e}: {err}"))?;
            times.push(t.elapsed());
            finish(e, c)?;
            pb.inc(1);
        }
        return Ok(times);
    }
    type Pending = std::collections::VecDeque<(u64, usize, Instant, runtime::ScheduledExecution)>;
    let mut pending: Pending = std::collections::VecDeque::new();
    let mut free: Vec<usize> = (0..slots.len()).rev().collect();
    let mut complete = |pending: &mut Pending,
                        free: &mut Vec<usize>,
                        times: &mut Vec<Duration>|
     -> Result<(), String> {
        let Some((e, slot, t, req)) = pending.pop_front() else {
            return Ok(());
        };
        let status = rt
            .wait(&req)
            .map_err(|err| format!("execution {e}: {err}"))?;
        times.push(t.elapsed());
        if status != shared::NrtStatus::Success {
            return Err(format!("execution {e} ended with {status}"));
        }
        finish(e, &slots[slot])?;
        free.push(slot);
        pb.inc(1);
        Ok(())
    };
    for e in es {
        if free.is_empty() {
            complete(&mut pending, &mut free, &mut times)?;
        }
        let slot = free.pop().ok_or("no free slot")?;
        let c = &slots[slot];
        prepare(e, c)?;
        let t = Instant::now();
        // More slots than the XU queue holds: on QUEUE_FULL wait for the oldest execution and
        // retry, as users of the async API must.
        let req = loop {
            match rt.execute_schedule(c.model, &c.ins, &c.outs) {
                Ok(req) => break req,
                Err(err) if err.status == shared::NrtStatus::QueueFull && !pending.is_empty() => {
                    complete(&mut pending, &mut free, &mut times)?;
                }
                Err(err) => return Err(format!("execution {e}: {err}")),
            }
        };
        pending.push_back((e, slot, t, req));
    }
    while !pending.is_empty() {
        complete(&mut pending, &mut free, &mut times)?;
    }
    Ok(times)
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let pct =
        |per_mille: usize| samples[(samples.len() - 1) * per_mille / 1000].as_secs_f64() * 1e6;
    (pct(500), pct(900), pct(990))
}

fn run_digits(
    rt: &Runtime,
    opts: &BenchOptions,
    ncs: u32,
    backend: &'static str,
) -> Result<BenchReport, String> {
    let data = Digits::load(&digits::default_path())?;
    let batch = opts.batch;
    let lnc = rt.config().lnc.max(1);
    let model = data
        .mlp()
        .build_split(batch, lnc)
        .map_err(|e| e.to_string())?;
    let container = model
        .to_container(Target::Simdev)
        .map_err(|e| e.to_string())?;
    let count = data.count();
    let per_pass = count.div_ceil(batch as usize) as u64;
    let executions = opts.iterations.map_or(per_pass, u64::from);
    let b = batch as usize;
    let all = cores(
        rt,
        ncs,
        opts.in_flight,
        &container,
        (b * FEATURES * 4) as u64,
        (b * CLASSES * 4) as u64,
    )?;
    let pb = bar(executions, opts.progress);
    let logits = std::sync::Mutex::new(vec![f32::NAN; count * CLASSES]);
    let started = Instant::now();
    let samples = on_each_core(&all, |v, slots| {
        let mut input = vec![0f32; b * FEATURES];
        let mut out = vec![0u8; b * CLASSES * 4];
        let rows_of = |e: u64| {
            let first = usize::try_from(e % per_pass).unwrap_or(0) * b;
            (first, b.min(count - first))
        };
        let prepare = |e: u64, c: &Core| {
            let (first, rows) = rows_of(e);
            input.fill(0.0);
            input[..rows * FEATURES]
                .copy_from_slice(&data.inputs[first * FEATURES..(first + rows) * FEATURES]);
            c.input
                .write(&to_bytes(&input), 0)
                .map_err(|e| e.to_string())
        };
        let finish = |e: u64, c: &Core| {
            c.output.read(&mut out, 0).map_err(|e| e.to_string())?;
            if e < per_pass {
                let (first, rows) = rows_of(e);
                let mut l = logits
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for (i, chunk) in out[..rows * CLASSES * 4].chunks_exact(4).enumerate() {
                    l[first * CLASSES + i] =
                        f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                }
            }
            Ok(())
        };
        let es = (v as u64..executions).step_by(ncs as usize);
        pipeline(rt, slots, opts.in_flight > 0, es, prepare, finish, &pb)
    })?;
    let wall = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let logits = logits
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let covered = executions >= per_pass;
    let (accuracy, max_diff) = if covered {
        let predicted = digits::argmax_rows(&logits);
        let correct = predicted
            .iter()
            .zip(&data.labels)
            .filter(|(p, l)| i32::try_from(**p).ok() == Some(**l))
            .count();
        let diff = logits
            .iter()
            .zip(&data.logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, |m, d| if d.is_nan() || d > m { d } else { m });
        (Some(correct as f64 / count as f64), Some(diff))
    } else {
        (None, None)
    };
    let (p50, p90, p99) = percentiles(samples);
    let images = (executions.min(per_pass) * batch as u64).min(count as u64)
        + executions.saturating_sub(per_pass) * batch as u64;
    Ok(BenchReport {
        model: "digits".into(),
        backend,
        batch,
        nc_count: ncs,
        in_flight: opts.in_flight,
        executions,
        images,
        accuracy,
        max_abs_logit_diff: max_diff,
        failures: 0,
        p50_us: p50,
        p90_us: p90,
        p99_us: p99,
        executions_per_second: executions as f64 / wall,
        images_per_second: images as f64 / wall,
        ran_on_device: true,
        note: None,
    })
}

fn run_identity(
    rt: &Runtime,
    opts: &BenchOptions,
    ncs: u32,
    backend: &'static str,
) -> Result<BenchReport, String> {
    if opts.bytes == 0 {
        return Err("--bytes must be at least 1".into());
    }
    let model = if rt.config().lnc > 1 {
        runtime::builder::identity_split(opts.bytes.max(2))
    } else {
        runtime::builder::identity(opts.bytes)
    };
    let container = model
        .to_container(Target::Simdev)
        .map_err(|e| e.to_string())?;
    let executions = u64::from(opts.iterations.unwrap_or(1000));
    let len = opts.bytes as usize;
    let all = cores(rt, ncs, opts.in_flight, &container, len as u64, len as u64)?;
    let pb = bar(executions, opts.progress);
    let failures = std::sync::atomic::AtomicU64::new(0);
    let started = Instant::now();
    let samples = on_each_core(&all, |v, slots| {
        let pattern = |e: u64| -> Vec<u8> {
            (0..len)
                .map(|j| j.to_le_bytes()[0] ^ j.to_le_bytes()[1] ^ e.to_le_bytes()[0])
                .collect()
        };
        let mut out = vec![0u8; len];
        let prepare = |e: u64, c: &Core| c.input.write(&pattern(e), 0).map_err(|e| e.to_string());
        let finish = |e: u64, c: &Core| {
            c.output.read(&mut out, 0).map_err(|e| e.to_string())?;
            if !rt.config().funtime && out != pattern(e) {
                failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(())
        };
        let es = (v as u64..executions).step_by(ncs as usize);
        pipeline(rt, slots, opts.in_flight > 0, es, prepare, finish, &pb)
    })?;
    let wall = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let (p50, p90, p99) = percentiles(samples);
    Ok(BenchReport {
        model: "identity".into(),
        backend,
        batch: 1,
        nc_count: ncs,
        in_flight: opts.in_flight,
        executions,
        images: executions,
        accuracy: None,
        max_abs_logit_diff: None,
        failures: failures.into_inner(),
        p50_us: p50,
        p90_us: p90,
        p99_us: p99,
        executions_per_second: executions as f64 / wall,
        images_per_second: executions as f64 / wall,
        ran_on_device: true,
        note: None,
    })
}

/// Prints a report as text.
pub fn print(r: &BenchReport) {
    println!(
        "model {} on {} — batch {}, {} NC(s), {} executions, {} images",
        r.model, r.backend, r.batch, r.nc_count, r.executions, r.images
    );
    if let Some(note) = &r.note {
        println!("{note}");
    }
    if !r.ran_on_device {
        // No accuracy: the outputs were never computed.
    } else if let (Some(acc), Some(diff)) = (r.accuracy, r.max_abs_logit_diff) {
        println!("accuracy {acc:.6}   max |logit - reference| {diff:.2e}");
    } else if r.model == "digits" {
        println!(
            "accuracy: not computed (it needs a full pass over the 360 test images; raise --iterations)"
        );
    }
    if r.failures > 0 {
        println!("{} outputs did not match", r.failures);
    }
    println!(
        "latency  p50 {:.1} us   p90 {:.1} us   p99 {:.1} us",
        r.p50_us, r.p90_us, r.p99_us
    );
    println!(
        "throughput {:.0} executions/s, {:.0} images/s",
        r.executions_per_second, r.images_per_second
    );
}
