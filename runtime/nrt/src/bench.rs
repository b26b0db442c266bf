//! `nrt bench`: load a model, run it with every output checked, report accuracy, the largest
//! logit error against the reference, latency percentiles and throughput.
//!
//! The digits model runs the 360 held-out UCI digits through the trained MLP in batches of
//! `--batch` images (the last batch of a pass is zero-padded and its padding ignored), on
//! `--ncs` logical cores at once, one thread each. The identity model copies `--bytes` bytes and
//! checks them.
//!
//! `--neff FILE` runs a NEFF with inputs of seeded random bytes. On simdev a NEFF runs
//! **shape-only** (its instruction encoding is not public): the report says so, and the
//! outputs are checked against the documented shape-only function of the inputs
//! (`shared::neff_program::shape_only`), not against the model's numbers. When simdev has a
//! reference bound to the NEFF (issue 15) its outputs are the reference's: simdev's NC counters
//! before and after the run tell which ([`neff_outputs`]), and the report says `"reference"`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use runtime::{Device, DeviceError, ModelHandle, Placement, Runtime, Tensor, TensorSet};
use serde::Serialize;
use shared::model::{DType, Target};
use shared::protocol::NcCounters;

/// `--bytes`' default (the identity model's tensor size).
pub const DEFAULT_BYTES: u32 = 64;

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
    /// A NEFF file to run instead of `model`.
    pub neff: Option<std::path::PathBuf>,
    /// Untimed executions per core before the timed ones.
    pub warmup: u32,
    /// Seed of a NEFF's random inputs.
    pub seed: u64,
    /// Write the runtime's timeline (its spans and the device's events) there at close
    /// (`NEURON_RT_TRACE`'s file; it wins over that variable).
    pub trace: Option<std::path::PathBuf>,
    /// The runtime datastore: as the environment says, on, off, or both in alternating blocks
    /// (`--datastore`).
    pub datastore: DatastoreChoice,
}

/// `nrt bench --datastore`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DatastoreChoice {
    /// As `NEURON_RT_DATASTORE` says (default on).
    #[default]
    Env,
    /// The shared datastore file.
    On,
    /// The counters in private memory only.
    Off,
    /// Alternating blocks of off and on in one process (and one simdev), each block on a fresh
    /// runtime; the report is the "on" blocks' and adds both sides' p50 and mean and their
    /// ratios.
    Both,
}

/// Blocks of `--datastore both` (half off, half on, alternating, off first).
const DATASTORE_BLOCKS: u64 = 10;

/// The two sides of `--datastore both`.
#[derive(Serialize, Debug)]
pub struct DatastoreComparison {
    /// Blocks run (half each way).
    blocks: u64,
    /// Timed executions per side.
    executions_per_side: u64,
    off_p50_us: f64,
    off_mean_us: f64,
    on_p50_us: f64,
    on_mean_us: f64,
    /// on p50 / off p50.
    p50_ratio: f64,
    /// on mean / off mean.
    mean_ratio: f64,
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
    mean_us: f64,
    min_us: f64,
    max_us: f64,
    std_us: f64,
    executions_per_second: f64,
    images_per_second: f64,
    /// The share of the timed span the bench itself spent writing inputs and checking outputs
    /// (part of the throughput's time, none of any latency).
    host_check_share: f64,
    /// Why fewer executions than `--async` were in flight at once, when they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    in_flight_note: Option<String>,
    /// Whether the executions ran on a device: false with `NEURON_RT_FUNTIME=1`, where execute
    /// returns success at once and no output (hence no accuracy) means anything.
    ran_on_device: bool,
    /// Why the figures do not describe a device, when they do not.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// A signal stopped the run early: the figures are of the executions before it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    interrupted: bool,
    /// What stopped the run early (an execution that failed, the device lost): the figures
    /// are of the executions before it, and `nrt bench` exits 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the outputs came from: `"computed"` (the model's numbers), `"shape-only"` (a NEFF
    /// on simdev: the documented function of the inputs, not the model's numbers),
    /// `"reference"` (a NEFF on simdev whose outputs a bound reference computed) or
    /// `"shape-only and reference"` ([`NeffOutputs`], from simdev's NC counters).
    outputs: &'static str,
    /// Untimed warm-up executions per core.
    warmup: u32,
    /// NEFF runs: seconds `nrt_load` of the NEFF took (the first core's).
    #[serde(skip_serializing_if = "Option::is_none")]
    load_seconds: Option<f64>,
    /// NEFF runs with a reference: the reference simdev has bound to this NEFF
    /// (`"ref_matmul.py:matmul"`, or a golden file's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
    /// `--datastore both`: the off and on sides (the report's own figures are the on side's).
    #[serde(skip_serializing_if = "Option::is_none")]
    datastore: Option<DatastoreComparison>,
}

/// The note of a NEFF run on simdev.
const SHAPE_ONLY_NOTE: &str = "shape-only: simdev does not run NEFF instructions (their encoding is not public); every output is the documented function of the inputs (shared::neff_program::shape_only), checked here — not the model's numbers";

/// The note of a NEFF run whose outputs simdev computed with a bound reference.
const REFERENCE_NOTE: &str = "reference: simdev computed every output with the reference bound to this NEFF (a CPU function or a golden file; see simdev --reference), not shape-only; outputs are not checked here";

/// The note of a NEFF run on simdev where some executions were shape-only and some used a
/// reference.
const MIXED_NOTE: &str = "shape-only and reference: simdev ran some executions shape-only (outputs a documented function of the inputs) and some with a bound reference; outputs are not checked here";

/// Where a NEFF run's outputs came from on simdev, as its NC counters tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NeffOutputs {
    /// Every execution shape-only ([`shared::neff_program::shape_only`]).
    ShapeOnly,
    /// Every execution computed by a reference bound to the NEFF.
    Reference,
    /// Some of each.
    Mixed,
}

impl NeffOutputs {
    /// The report's `outputs` value.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::ShapeOnly => "shape-only",
            Self::Reference => "reference",
            Self::Mixed => "shape-only and reference",
        }
    }

    /// The report's note.
    const fn note(self) -> &'static str {
        match self {
            Self::ShapeOnly => SHAPE_ONLY_NOTE,
            Self::Reference => REFERENCE_NOTE,
            Self::Mixed => MIXED_NOTE,
        }
    }
}

/// Every NC's counters now; `None` for an NC whose counters cannot be read (hardware has none).
pub(crate) fn nc_counters(dev: &dyn Device) -> Vec<Option<NcCounters>> {
    (0..dev.info().nc_count)
        .map(|nc| dev.nc_counters(nc).ok())
        .collect()
}

/// NEFF executions on one NC whose outputs a reference computed.
///
/// Executions whose outputs a bound reference computed (simdev's `neff_reference_executions`).
fn reference_executions(c: &NcCounters) -> u64 {
    c.neff_reference_executions
}

/// Where the outputs of the NEFF executions between counter snapshots `before` and `after`
/// came from; `None` when the counters say nothing (unreadable, or no execution ran).
pub(crate) fn neff_outputs(
    before: &[Option<NcCounters>],
    after: &[Option<NcCounters>],
) -> Option<NeffOutputs> {
    let (mut shape_only, mut reference) = (0u64, 0u64);
    for (b, a) in before.iter().zip(after) {
        if let (Some(b), Some(a)) = (b, a) {
            shape_only += a
                .neff_shape_only_executions
                .saturating_sub(b.neff_shape_only_executions);
            reference += reference_executions(a).saturating_sub(reference_executions(b));
        }
    }
    match (shape_only > 0, reference > 0) {
        (true, false) => Some(NeffOutputs::ShapeOnly),
        (false, true) => Some(NeffOutputs::Reference),
        (true, true) => Some(NeffOutputs::Mixed),
        (false, false) => None,
    }
}

/// The note of a `NEURON_RT_FUNTIME=1` run.
const FUNTIME_NOTE: &str = "NEURON_RT_FUNTIME=1: nothing ran on a device (execute returned success at once); outputs were not checked and no accuracy is reported";

impl BenchReport {
    /// The report of `executions` timed executions producing `images` images, taking `samples`
    /// latencies over `wall` seconds: outputs "computed", no accuracy, no failures (callers set
    /// what their model checks).
    fn timed(
        model: String,
        backend: &'static str,
        opts: &BenchOptions,
        ncs: u32,
        (executions, images): (u64, u64),
        samples: Vec<Duration>,
        wall: f64,
    ) -> Self {
        // A run stopped by a signal timed fewer executions than it was asked for: its figures
        // are of those (one latency sample each).
        let (executions, images) = match u64::try_from(samples.len()) {
            Ok(ran) if ran < executions => (ran, images / executions.max(1) * ran),
            _ => (executions, images),
        };
        let st = stats(samples);
        // No time (a run stopped before its first timed execution): no rate.
        let rate = |n: u64| if wall > 0.0 { n as f64 / wall } else { 0.0 };
        Self {
            model,
            backend,
            batch: 1,
            nc_count: ncs,
            in_flight: opts.in_flight,
            executions,
            images,
            accuracy: None,
            max_abs_logit_diff: None,
            failures: 0,
            p50_us: st.p50,
            p90_us: st.p90,
            p99_us: st.p99,
            mean_us: st.mean,
            min_us: st.min,
            max_us: st.max,
            std_us: st.std,
            executions_per_second: rate(executions),
            images_per_second: rate(images),
            host_check_share: 0.0,
            in_flight_note: in_flight_note(opts.in_flight),
            ran_on_device: true,
            note: None,
            interrupted: false,
            error: None,
            outputs: "computed",
            warmup: opts.warmup,
            load_seconds: None,
            reference: None,
            datastore: None,
        }
    }
}

/// What `--async n` above the XU queue's depth means for the figures (`None` at or below it).
fn in_flight_note(n: u32) -> Option<String> {
    let depth = u32::from(runtime::xu::XU_QUEUE_LIMIT);
    (n > depth).then(|| {
        format!(
            "--async {n}: an XU queue holds {depth} executions, so at most {depth} were in flight \
             per core; the other slots waited for a completion, and their latencies include \
             that wait"
        )
    })
}

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

pub(crate) struct Core {
    pub(crate) model: ModelHandle,
    input: Tensor,
    output: Tensor,
    pub(crate) ins: TensorSet,
    pub(crate) outs: TensorSet,
    /// Every input and output tensor by name, in the model's order (NEFF runs).
    pub(crate) named: Vec<(String, Tensor)>,
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
        named: vec![
            ("input".into(), input.clone()),
            ("output".into(), output.clone()),
        ],
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

/// `--ncs` when it is not given: the logical cores the environment asks for, as libnrt reads
/// it — `NEURON_RT_VISIBLE_CORES`'s count, else a non-zero `NEURON_RT_NUM_CORES` — else 1. (A
/// malformed variable gives 1 here; [`run`] then refuses it by name.)
pub fn default_ncs() -> u32 {
    RuntimeConfig::from_env().map_or(1, |c| ncs_asked_by(&c))
}

fn ncs_asked_by(config: &RuntimeConfig) -> u32 {
    match config.visible_cores {
        Some((_, count)) => count,
        None if config.num_cores > 0 => config.num_cores,
        None => 1,
    }
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
        _ if opts.neff.is_some() => {}
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
        "digits" if opts.bytes != DEFAULT_BYTES => {
            return Err(format!(
                "--bytes applies to the identity model; the digits model moves 256 B in and 40 B \
                 out per image (--batch sets the images per execution), not --bytes {}",
                opts.bytes
            ));
        }
        "digits" | "identity" => {}
        other => {
            return Err(format!(
                "unknown model {other:?} (available: digits, identity)"
            ));
        }
    }
    let mut config = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    if let Some(path) = &opts.trace {
        config.trace_file = Some(path.clone());
    }
    let dev = open().map_err(|e| crate::error_chain(&e))?;
    let lnc = config.lnc_on(dev.info().arch)?;
    if opts.neff.is_none() && opts.model == "digits" && opts.batch < lnc {
        return Err(format!(
            "--batch {} is too small for NEURON_LOGICAL_NC_CONFIG={lnc}{}: each execution's rows are split over the {lnc} physical NCs of a logical core; use --batch {lnc} or more",
            opts.batch,
            if config.lnc.is_none() {
                " (the device's default)"
            } else {
                ""
            },
        ));
    }
    let logical = dev.info().nc_count / lnc;
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
    match opts.datastore {
        DatastoreChoice::Env => {}
        DatastoreChoice::On => config.datastore = true,
        DatastoreChoice::Off => config.datastore = false,
        DatastoreChoice::Both => return run_datastore_both(opts, config, Arc::from(dev), backend),
    }
    // Without visible cores, --ncs set the runtime's NEURON_RT_NUM_CORES above.
    let from_ncs = config.visible_cores.is_none();
    let rt = Runtime::init(Arc::from(dev), config).map_err(|e| {
        if from_ncs && e.message.contains("NEURON_RT_NUM_CORES") {
            // The variable is how --ncs asks the runtime for cores: say where it came from.
            format!(
                "--ncs {} (asked of the runtime as NEURON_RT_NUM_CORES={}): {e}",
                opts.ncs, opts.ncs
            )
        } else if let Some(path) = &opts.trace
            && e.message.starts_with("NEURON_RT_TRACE=")
        {
            // Likewise for --trace, which the runtime takes as NEURON_RT_TRACE.
            format!("--trace {} (as NEURON_RT_TRACE): {e}", path.display())
        } else {
            e.to_string()
        }
    })?;
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
    let visible = rt.visible_vnc_count();
    if opts.ncs > visible {
        // Running on fewer cores than asked would report another benchmark than the one
        // asked for (--ncs without NEURON_RT_VISIBLE_CORES was asked of the runtime above).
        rt.close();
        return Err(format!(
            "--ncs {} but NEURON_RT_VISIBLE_CORES makes {visible} logical core(s) visible",
            opts.ncs
        ));
    }
    let ncs = opts.ncs;
    let result = match opts.model.as_str() {
        _ if opts.neff.is_some() => run_neff(&rt, opts, ncs, backend),
        "digits" => run_digits(&rt, opts, ncs, backend),
        _ => run_identity(&rt, opts, ncs, backend),
    };
    let funtime = rt.config().funtime;
    rt.close();
    result.map(|mut r| {
        r.interrupted = crate::interrupted();
        if r.interrupted || r.error.is_some() {
            // Its pass over the test set may be partial: no accuracy is claimed.
            r.accuracy = None;
            r.max_abs_logit_diff = None;
        }
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
    f: impl Fn(usize, &[Core]) -> Result<Timed, String> + Sync,
) -> Result<Ran, String> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = all
            .iter()
            .enumerate()
            .map(|(v, slots)| s.spawn(move || f(v, slots)))
            .collect();
        let mut runs = Vec::new();
        for h in handles {
            runs.push(
                h.join()
                    .map_err(|_| "a bench thread panicked".to_string())??,
            );
        }
        Ok(Timed::merge(runs))
    })
}

/// One core's timed executions: their latencies, and when the first timed one started and
/// the last one ended (the untimed warm-up executions before it are outside that span).
struct Timed {
    times: Vec<Duration>,
    start: Instant,
    end: Instant,
    /// Time the bench itself spent writing inputs and checking outputs between `start` and
    /// `end` (inside the throughput's time, outside every latency sample).
    host: Duration,
    /// What stopped the timed executions early (an execution that failed, a device lost):
    /// `times` are those before it.
    error: Option<String>,
}

/// Every core's timed executions together.
struct Ran {
    /// Every core's latencies.
    samples: Vec<Duration>,
    /// Seconds from the first core's timed start to the last core's end: the time throughput
    /// is over (never a warm-up execution's).
    wall: f64,
    /// The first core's error that stopped its timed executions, if one did.
    error: Option<String>,
    /// The share of the cores' timed spans the bench spent writing inputs and checking
    /// outputs (0 when nothing was timed).
    host_share: f64,
}

impl Timed {
    fn merge(runs: Vec<Self>) -> Ran {
        let start = runs.iter().map(|r| r.start).min();
        let end = runs.iter().map(|r| r.end).max();
        let wall = match (start, end) {
            (Some(s), Some(e)) => e.saturating_duration_since(s).as_secs_f64(),
            _ => 0.0,
        };
        let mut error = None;
        let mut samples = Vec::new();
        let (mut host, mut spans) = (0.0, 0.0);
        for r in runs {
            host += r.host.as_secs_f64();
            spans += r.end.saturating_duration_since(r.start).as_secs_f64();
            samples.extend(r.times);
            error = error.or(r.error);
        }
        Ran {
            samples,
            wall,
            error,
            host_share: if spans > 0.0 { host / spans } else { 0.0 },
        }
    }
}

/// Runs executions `es` of one core through `slots` (tensor sets): synchronously with one slot,
/// or keeping `slots.len()` in flight through the explicit async API. `prepare` writes slot
/// inputs for execution `e`; `finish` checks its outputs. Returns each execution's latency
/// (schedule to observed completion) and the span of the timed executions (after warm-up); an
/// error among the timed executions ends them and is returned with the latencies before it
/// (an error in the warm-up, before anything was timed, is the `Err`).
#[allow(clippy::too_many_arguments)]
fn pipeline(
    rt: &Runtime,
    slots: &[Core],
    asynchronous: bool,
    warmup: u32,
    es: impl Iterator<Item = u64>,
    mut prepare: impl FnMut(u64, &Core) -> Result<(), String>,
    mut finish: impl FnMut(u64, &Core) -> Result<(), String>,
    pb: &indicatif::ProgressBar,
) -> Result<Timed, String> {
    let mut times = Vec::new();
    if crate::interrupted() {
        // Stopping (a later block of `--datastore both`, say): nothing more runs.
        let now = Instant::now();
        return Ok(Timed {
            times,
            start: now,
            end: now,
            host: Duration::ZERO,
            error: None,
        });
    }
    // One untimed execution per slot first (table loads, first-touch of ring pages).
    for c in slots {
        rt.execute(c.model, &c.ins, &c.outs)
            .map_err(|err| format!("warm-up: {err}"))?;
    }
    // And the --warmup ones, untimed.
    for _ in 0..warmup {
        let c = &slots[0];
        rt.execute(c.model, &c.ins, &c.outs)
            .map_err(|err| format!("warm-up: {err}"))?;
    }
    // The bench's own work between executions (input writes, output checks), timed apart.
    let host = std::cell::Cell::new(Duration::ZERO);
    let on_host = |since: Instant| host.set(host.get() + since.elapsed());
    let prepare = |e: u64, c: &Core| {
        let t = Instant::now();
        let r = prepare(e, c);
        on_host(t);
        r
    };
    let finish = |e: u64, c: &Core| {
        let t = Instant::now();
        let r = finish(e, c);
        on_host(t);
        r
    };
    let start = Instant::now();
    let run = if asynchronous {
        timed_async(rt, slots, es, prepare, finish, pb, &mut times)
    } else {
        timed_sync(rt, &slots[0], es, prepare, finish, pb, &mut times)
    };
    Ok(Timed {
        times,
        start,
        end: Instant::now(),
        host: host.get(),
        error: run.err(),
    })
}

/// [`pipeline`]'s timed executions, synchronous, through slot `c`; `times` gets each one's
/// latency.
fn timed_sync(
    rt: &Runtime,
    c: &Core,
    es: impl Iterator<Item = u64>,
    mut prepare: impl FnMut(u64, &Core) -> Result<(), String>,
    mut finish: impl FnMut(u64, &Core) -> Result<(), String>,
    pb: &indicatif::ProgressBar,
    times: &mut Vec<Duration>,
) -> Result<(), String> {
    for e in es {
        if crate::interrupted() {
            break;
        }
        prepare(e, c)?;
        let t = Instant::now();
        rt.execute(c.model, &c.ins, &c.outs)
            .map_err(|err| format!("execution {e}: {err}"))?;
        times.push(t.elapsed());
        finish(e, c)?;
        pb.inc(1);
    }
    Ok(())
}

/// [`pipeline`]'s timed executions, `slots.len()` in flight; `times` gets each one's latency.
/// On an error the executions still in flight are left to the runtime's close.
fn timed_async(
    rt: &Runtime,
    slots: &[Core],
    es: impl Iterator<Item = u64>,
    mut prepare: impl FnMut(u64, &Core) -> Result<(), String>,
    mut finish: impl FnMut(u64, &Core) -> Result<(), String>,
    pb: &indicatif::ProgressBar,
    times: &mut Vec<Duration>,
) -> Result<(), String> {
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
        if status != shared::NrtStatus::Success {
            return Err(format!("execution {e} ended with {status}"));
        }
        times.push(t.elapsed());
        finish(e, &slots[slot])?;
        free.push(slot);
        pb.inc(1);
        Ok(())
    };
    for e in es {
        if crate::interrupted() {
            break;
        }
        if free.is_empty() {
            complete(&mut pending, &mut free, times)?;
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
                    complete(&mut pending, &mut free, times)?;
                }
                Err(err) => return Err(format!("execution {e}: {err}")),
            }
        };
        pending.push_back((e, slot, t, req));
    }
    while !pending.is_empty() {
        complete(&mut pending, &mut free, times)?;
    }
    Ok(())
}

/// Latency figures of the timed executions, in µs.
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    min: f64,
    max: f64,
    std: f64,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    if samples.is_empty() {
        return Stats::default();
    }
    samples.sort();
    let us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    // Nearest rank: the smallest sample with at least `per_mille` of them at or below it
    // (so with 3 samples p90 and p99 are the largest, not the median).
    let pct = |per_mille: usize| us[(us.len() * per_mille).div_ceil(1000).max(1) - 1];
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    let var = us.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / us.len() as f64;
    Stats {
        p50: pct(500),
        p90: pct(900),
        p99: pct(990),
        mean,
        min: us[0],
        max: us[us.len() - 1],
        std: var.sqrt(),
    }
}

fn run_digits(
    rt: &Runtime,
    opts: &BenchOptions,
    ncs: u32,
    backend: &'static str,
) -> Result<BenchReport, String> {
    let data = Digits::load(&digits::default_path())?;
    let batch = opts.batch;
    let lnc = rt.lnc();
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
    let ran = on_each_core(&all, |v, slots| {
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
        pipeline(
            rt,
            slots,
            opts.in_flight > 0,
            opts.warmup,
            es,
            prepare,
            finish,
            &pb,
        )
    })?;
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
    let images = (executions.min(per_pass) * batch as u64).min(count as u64)
        + executions.saturating_sub(per_pass) * batch as u64;
    let mut r = BenchReport::timed(
        "digits".into(),
        backend,
        opts,
        ncs,
        (executions, images),
        ran.samples,
        ran.wall,
    );
    r.host_check_share = ran.host_share;
    r.error = ran.error;
    r.batch = batch;
    r.accuracy = accuracy;
    r.max_abs_logit_diff = max_diff;
    Ok(r)
}

/// `--datastore both` (identity model, synchronous or `--async`): [`DATASTORE_BLOCKS`] blocks
/// of `iterations / blocks` executions, alternating a runtime with the datastore off and one
/// with it on (each block initialises, loads, warms up, runs and closes its own runtime on the
/// same device), so drift of the machine affects both sides alike.
fn run_datastore_both(
    opts: &BenchOptions,
    config: RuntimeConfig,
    dev: Arc<dyn Device>,
    backend: &'static str,
) -> Result<BenchReport, String> {
    if opts.neff.is_some() || opts.model != "identity" {
        return Err("--datastore both runs the identity model (--model identity)".into());
    }
    let total = u64::from(opts.iterations.unwrap_or(1000));
    let per_block = (total / DATASTORE_BLOCKS).max(1);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let (mut wall_on, mut failures) = (0.0, 0u64);
    let pb = bar(per_block * DATASTORE_BLOCKS, opts.progress);
    for block in 0..DATASTORE_BLOCKS {
        let datastore = block % 2 == 1;
        let rt = Runtime::init(
            dev.clone(),
            RuntimeConfig {
                datastore,
                ..config.clone()
            },
        )
        .map_err(|e| e.to_string())?;
        let ncs = rt.visible_vnc_count().min(opts.ncs);
        let r = identity_samples(&rt, opts, ncs, per_block, &pb);
        rt.close();
        let (ran, f) = r?;
        if let Some(e) = ran.error {
            // Half a comparison compares nothing.
            return Err(e);
        }
        failures += f;
        if datastore {
            on.extend(ran.samples);
            wall_on += ran.wall;
        } else {
            off.extend(ran.samples);
        }
    }
    pb.finish_and_clear();
    let (so, sn) = (stats(off.clone()), stats(on.clone()));
    let side = per_block * DATASTORE_BLOCKS / 2;
    let mut r = BenchReport::timed(
        "identity".into(),
        backend,
        opts,
        opts.ncs,
        (side, side),
        on,
        wall_on,
    );
    r.failures = failures;
    r.datastore = Some(DatastoreComparison {
        blocks: DATASTORE_BLOCKS,
        executions_per_side: side,
        off_p50_us: so.p50,
        off_mean_us: so.mean,
        on_p50_us: sn.p50,
        on_mean_us: sn.mean,
        p50_ratio: sn.p50 / so.p50,
        mean_ratio: sn.mean / so.mean,
    });
    Ok(r)
}

fn run_identity(
    rt: &Runtime,
    opts: &BenchOptions,
    ncs: u32,
    backend: &'static str,
) -> Result<BenchReport, String> {
    let executions = u64::from(opts.iterations.unwrap_or(1000));
    let pb = bar(executions, opts.progress);
    let (ran, failures) = identity_samples(rt, opts, ncs, executions, &pb)?;
    pb.finish_and_clear();
    let mut r = BenchReport::timed(
        "identity".into(),
        backend,
        opts,
        ncs,
        (executions, executions),
        ran.samples,
        ran.wall,
    );
    r.host_check_share = ran.host_share;
    r.error = ran.error;
    r.failures = failures;
    Ok(r)
}

/// Runs `executions` identity executions on `ncs` cores of `rt`, each output checked: what ran
/// ([`Ran`]) and the outputs that did not match.
fn identity_samples(
    rt: &Runtime,
    opts: &BenchOptions,
    ncs: u32,
    executions: u64,
    pb: &indicatif::ProgressBar,
) -> Result<(Ran, u64), String> {
    if opts.bytes == 0 {
        return Err("--bytes must be at least 1".into());
    }
    let lnc = rt.lnc();
    if lnc > 1 && opts.bytes < lnc {
        return Err(format!(
            "--bytes {} is fewer than the logical core's {lnc} physical cores: the identity \
             model gives each its share of the bytes; use --bytes {lnc} or more (or \
             NEURON_LOGICAL_NC_CONFIG=1)",
            opts.bytes
        ));
    }
    let model = if lnc > 1 {
        runtime::builder::identity_split(opts.bytes)
    } else {
        runtime::builder::identity(opts.bytes)
    };
    let container = model
        .to_container(Target::Simdev)
        .map_err(|e| e.to_string())?;
    let len = opts.bytes as usize;
    let all = cores(rt, ncs, opts.in_flight, &container, len as u64, len as u64)?;
    let failures = std::sync::atomic::AtomicU64::new(0);
    let ran = on_each_core(&all, |v, slots| {
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
        pipeline(
            rt,
            slots,
            opts.in_flight > 0,
            opts.warmup,
            es,
            prepare,
            finish,
            pb,
        )
    })?;
    Ok((ran, failures.into_inner()))
}

/// One slot of a NEFF: a device tensor per input and output, inputs of seeded random bytes
/// (as [`fill_neff_inputs`] writes them).
pub(crate) fn neff_core(
    rt: &Runtime,
    vnc: u32,
    model: ModelHandle,
    neff: &neff::Neff,
    seed: u64,
) -> Result<Core, String> {
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let mut named = Vec::new();
    for (io, is_input) in neff
        .inputs
        .iter()
        .map(|t| (t, true))
        .chain(neff.outputs.iter().map(|t| (t, false)))
    {
        let t = rt
            .tensor_allocate(Placement::Device { vnc }, io.size, &io.name)
            .map_err(|e| format!("allocating {:?} ({} bytes): {e}", io.name, io.size))?;
        if is_input {
            fill_random(&t, io.dtype, seed ^ fnv(&io.name))?;
            ins.add(&io.name, &t);
        } else {
            outs.add(&io.name, &t);
        }
        named.push((io.name.clone(), t));
    }
    let first = |set: &TensorSet| set.iter().next().map(|(_, t)| t.clone());
    Ok(Core {
        model,
        input: first(&ins).ok_or("the NEFF has no input")?,
        output: first(&outs).ok_or("the NEFF has no output")?,
        ins,
        outs,
        named,
    })
}

/// Why in-flight slot `i` of `n` (`--async n`) could not be set up: each slot has I/O tensors
/// of its own, which a large NEFF's `n` sets may not fit in device memory.
fn slot_failure(neff: &neff::Neff, i: u32, n: u32, e: &str) -> String {
    let io: u64 = neff
        .inputs
        .iter()
        .chain(&neff.outputs)
        .map(|t| t.size)
        .sum();
    format!(
        "in-flight slot {} of {n} (--async {n}: each slot allocates its own I/O tensors, {io} \
         bytes, {} in all; a smaller --async needs less): {e}",
        i + 1,
        u64::from(n).saturating_mul(io)
    )
}

/// Writes the seeded random inputs of `seed` into `c`'s NEFF inputs (what [`neff_core`] wrote
/// with that seed).
pub(crate) fn fill_neff_inputs(neff: &neff::Neff, c: &Core, seed: u64) -> Result<(), String> {
    for io in &neff.inputs {
        let t = c
            .named
            .iter()
            .find(|(n, _)| *n == io.name)
            .map(|(_, t)| t)
            .ok_or_else(|| format!("no tensor {:?}", io.name))?;
        fill_random(t, io.dtype, seed ^ fnv(&io.name))?;
    }
    Ok(())
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Inputs larger than this are filled in their first and last MiB only ([`fill_random`]).
pub(crate) const SPARSE_ABOVE: u64 = 64 << 20;

/// What a report says of `neff`'s inputs that [`fill_random`] fills sparsely, if any.
pub(crate) fn sparse_inputs_note(neff: &neff::Neff) -> Option<String> {
    let sparse: Vec<String> = neff
        .inputs
        .iter()
        .filter(|t| t.size > SPARSE_ABOVE)
        .map(|t| format!("{:?} ({} MiB)", t.name, t.size >> 20))
        .collect();
    (!sparse.is_empty()).then(|| {
        format!(
            "inputs above 64 MiB get seeded random data in their first and last MiB only, zeros between: {}",
            sparse.join(", ")
        )
    })
}

/// Writes seeded random elements of `dtype` into `t` ([`finite_floats`] for a float type, random
/// bytes else), 1 MiB at a time. Inputs larger than [`SPARSE_ABOVE`] get random elements in their first
/// and last MiB only and stay untouched (sparse) in between: a 4 GiB input costs 2 MiB of
/// memory, and the shape-only function reads only the first and last 4 KiB.
fn fill_random(t: &Tensor, dtype: DType, seed: u64) -> Result<(), String> {
    const PIECE: u64 = 1 << 20;
    let size = t.size();
    let ranges = if size > SPARSE_ABOVE {
        [0..PIECE, size - PIECE..size]
    } else {
        [0..size, size..size]
    };
    for r in ranges {
        let mut off = r.start;
        while off < r.end {
            let n = (r.end - off).min(PIECE);
            let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
            shared::neff_program::shape_only::fill(seed, off, &mut buf);
            finite_floats(dtype, &mut buf);
            t.write(&buf, off).map_err(|e| e.to_string())?;
            off += n;
        }
    }
    Ok(())
}

/// Turns random bytes into random finite numbers of float type `dtype` (other types are left
/// as they are): each element keeps a random sign and mantissa, and its exponent is set to one
/// of the four just below and at the bias, so every value is normal (or, for fp8 e3m4, at
/// least finite) with magnitude in [1/8, 2). Raw random bits would make about one fp16 or
/// fp8 element in thirty NaN or infinite, and every output that reads one NaN too: a golden
/// file of NaNs catches no wrong answer. `buf` starts on an element boundary.
pub(crate) fn finite_floats(dtype: DType, buf: &mut [u8]) {
    let Some((bits, man_bits, bias)) = float_layout(dtype) else {
        return;
    };
    let width = bits as usize / 8;
    for e in buf.chunks_exact_mut(width) {
        let mut r = [0u8; 8];
        r[..width].copy_from_slice(e);
        let r = u64::from_le_bytes(r);
        let sign = r & 1;
        let exponent = bias - ((r >> 1) & 3);
        let mantissa = (r >> 3) & ((1 << man_bits) - 1);
        let v = sign << (bits - 1) | exponent << man_bits | mantissa;
        e.copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

/// A float type's (bits, mantissa bits, exponent bias); `None` for other types.
fn float_layout(dtype: DType) -> Option<(u32, u32, u64)> {
    Some(match dtype {
        DType::F32 | DType::Fp32r => (32, 23, 127),
        DType::Bf16 => (16, 7, 127),
        DType::F16 => (16, 10, 15),
        DType::Fp8E4 => (8, 3, 7),
        DType::Fp8E5 => (8, 2, 15),
        DType::Fp8E3 => (8, 4, 3),
        _ => return None,
    })
}

/// What the shape-only outputs of `c`'s inputs must be (first and last 4 KiB of each input feed
/// the seed): each output's expected bytes by name.
fn shape_only_outputs(neff: &neff::Neff, c: &Core) -> Result<Vec<(String, Vec<u8>)>, String> {
    use shared::neff_program::shape_only::{EDGE_BYTES, Seed};
    let (inputs, outputs) = neff.dge_io_order();
    let tensor = |name: &str| {
        c.named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| format!("no tensor {name:?}"))
    };
    let mut seed = Seed::default();
    for name in &inputs {
        let t = tensor(name)?;
        let size = t.size();
        let n = size.min(EDGE_BYTES as u64);
        let mut head = vec![0u8; usize::try_from(n).unwrap_or(0)];
        let mut tail = head.clone();
        t.read(&mut head, 0).map_err(|e| e.to_string())?;
        t.read(&mut tail, size - n).map_err(|e| e.to_string())?;
        seed.input(size, &head, &tail);
    }
    outputs
        .iter()
        .enumerate()
        .map(|(j, name)| {
            let size = tensor(name)?.size();
            let j = u32::try_from(j).unwrap_or(u32::MAX);
            let bytes = shared::neff_program::shape_only::expected_output(
                seed,
                j,
                usize::try_from(size).unwrap_or(0),
            );
            Ok((name.clone(), bytes))
        })
        .collect()
}

fn run_neff(
    rt: &Runtime,
    opts: &BenchOptions,
    ncs: u32,
    backend: &'static str,
) -> Result<BenchReport, String> {
    let path = opts.neff.as_deref().ok_or("no NEFF")?;
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let neff = neff::Neff::parse(&bytes, &neff::ParseOptions::default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let mut load_seconds = None;
    let all = (0..ncs)
        .map(|v| {
            let t = Instant::now();
            let m = rt
                .load(&bytes, i32::try_from(v).unwrap_or(0))
                .map_err(|e| format!("loading {}: {e}", path.display()))?;
            load_seconds.get_or_insert(t.elapsed().as_secs_f64());
            let slots = opts.in_flight.max(1);
            (0..slots)
                .map(|i| {
                    neff_core(rt, v, m, &neff, opts.seed.wrapping_add(u64::from(i))).map_err(|e| {
                        match slots {
                            1 => e,
                            n => slot_failure(&neff, i, n, &e),
                        }
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .collect::<Result<Vec<_>, String>>()?;
    // On simdev simdev's NC counters tell whether the outputs were shape-only or a bound
    // reference's; shape-only outputs are checked against the shape-only function of the
    // inputs once per slot (the inputs do not change between executions), after the timed runs.
    let counters_before = nc_counters(rt.device().as_ref());
    let executions = u64::from(opts.iterations.unwrap_or(1000));
    let pb = bar(executions, opts.progress);
    let ran = on_each_core(&all, |v, slots| {
        let es = (v as u64..executions).step_by(ncs as usize);
        pipeline(
            rt,
            slots,
            opts.in_flight > 0,
            opts.warmup,
            es,
            |_, _| Ok(()),
            |_, _| Ok(()),
            &pb,
        )
    })?;
    pb.finish_and_clear();
    let source = (backend == "sim").then(|| {
        // No execution counted (NEURON_RT_FUNTIME=1): shape-only is what simdev would run.
        neff_outputs(&counters_before, &nc_counters(rt.device().as_ref()))
            .unwrap_or(NeffOutputs::ShapeOnly)
    });
    let mut failures = 0;
    // After an error the outputs are not checked: the executions that stopped never wrote theirs.
    if source == Some(NeffOutputs::ShapeOnly) && !rt.config().funtime && ran.error.is_none() {
        for c in all.iter().flatten() {
            for (name, want) in shape_only_outputs(&neff, c)? {
                let t = c
                    .named
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, t)| t)
                    .ok_or("output missing")?;
                let mut got = vec![0u8; want.len()];
                t.read(&mut got, 0).map_err(|e| e.to_string())?;
                if got != want {
                    failures += 1;
                }
            }
        }
    }
    let mut r = BenchReport::timed(
        name,
        backend,
        opts,
        ncs,
        (executions, executions),
        ran.samples,
        ran.wall,
    );
    r.host_check_share = ran.host_share;
    r.error = ran.error;
    r.failures = failures;
    r.load_seconds = load_seconds;
    if let Some(source) = source {
        r.note = Some(source.note().to_string());
        r.outputs = source.label();
    }
    if matches!(source, Some(NeffOutputs::Reference | NeffOutputs::Mixed)) {
        r.reference =
            runtime::kmgr::neff_load::simulated_outputs(rt.device().as_ref(), &neff).flatten();
        if let (Some(label), Some(note)) = (&r.reference, &mut r.note) {
            // "reference: simdev computed ..." becomes "reference ref.py:f: simdev computed ...".
            if let Some((kind, rest)) = note.split_once(": ") {
                *note = format!("{kind} {label}: {rest}");
            }
        }
    }
    if let Some(sparse) = sparse_inputs_note(&neff) {
        r.note = Some(match r.note.take() {
            Some(note) => format!("{note}; {sparse}"),
            None => sparse,
        });
    }
    Ok(r)
}

/// Prints a report as text.
pub fn print(r: &BenchReport) {
    print!("{}", text(r));
}

/// A report as text. Images and the batch are the digits model's; the identity model and a
/// NEFF count executions only.
fn text(r: &BenchReport) -> String {
    use std::fmt::Write;
    let digits = r.model == "digits";
    let mut o = String::new();
    let batch = if digits {
        format!("batch {}, ", r.batch)
    } else {
        String::new()
    };
    let images = if digits {
        format!(", {} images", r.images)
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "model {} on {} — {batch}{} logical core(s), {} executions{images}",
        r.model, r.backend, r.nc_count, r.executions
    );
    if let Some(note) = &r.note {
        let _ = writeln!(o, "{note}");
    }
    if r.interrupted {
        let _ = writeln!(
            o,
            "interrupted by a signal: the figures are of the {} executions before it",
            r.executions
        );
    }
    if let Some(error) = &r.error {
        let _ = writeln!(
            o,
            "stopped by an error: the figures are of the {} executions before it: {error}",
            r.executions
        );
    }
    if !r.ran_on_device || r.interrupted || r.error.is_some() {
        // No accuracy: the outputs were never computed, or not all of them.
    } else if let (Some(acc), Some(diff)) = (r.accuracy, r.max_abs_logit_diff) {
        let _ = writeln!(o, "accuracy {acc:.6}   max |logit - reference| {diff:.2e}");
    } else if r.model == "digits" {
        let _ = writeln!(
            o,
            "accuracy: not computed (it needs a full pass over the 360 test images; raise --iterations)"
        );
    }
    if r.failures > 0 {
        let _ = writeln!(o, "{} outputs did not match", r.failures);
    }
    let _ = writeln!(
        o,
        "latency  p50 {:.1} us   p90 {:.1} us   p99 {:.1} us   mean {:.1} us   min {:.1} us   max {:.1} us   std {:.1} us",
        r.p50_us, r.p90_us, r.p99_us, r.mean_us, r.min_us, r.max_us, r.std_us
    );
    if let Some(d) = &r.datastore {
        let _ = writeln!(
            o,
            "datastore off  p50 {:.1} us   mean {:.1} us   ({} executions in {} alternating blocks)",
            d.off_p50_us,
            d.off_mean_us,
            d.executions_per_side,
            d.blocks / 2
        );
        let _ = writeln!(
            o,
            "datastore on   p50 {:.1} us   mean {:.1} us   ({} executions in {} alternating blocks)",
            d.on_p50_us,
            d.on_mean_us,
            d.executions_per_side,
            d.blocks / 2
        );
        let _ = writeln!(
            o,
            "on/off         p50 {:.4}   mean {:.4}",
            d.p50_ratio, d.mean_ratio
        );
    }
    if let Some(s) = r.load_seconds {
        let _ = writeln!(o, "load {:.1} ms", s * 1e3);
    }
    if let Some(note) = &r.in_flight_note {
        let _ = writeln!(o, "{note}");
    }
    if r.host_check_share >= 0.01 {
        let _ = writeln!(
            o,
            "the bench's own input writes and output checks took {:.0}% of the time the \
             throughput is over (no latency includes them)",
            r.host_check_share * 100.0
        );
    }
    let _ = write!(o, "throughput {:.0} executions/s", r.executions_per_second);
    if digits {
        let _ = write!(o, ", {:.0} images/s", r.images_per_second);
    }
    o.push('\n');
    o
}

/// What a timeline file's `otherData` says was dropped, as a clause for `nrt bench`'s "trace
/// written" line (empty when nothing was, or the file cannot say).
pub fn trace_drops(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).map_or_else(|_| String::new(), |text| drops_in(&text))
}

/// [`trace_drops`] of a timeline file's text.
fn drops_in(text: &str) -> String {
    let Some(other) = text
        .rfind("\"otherData\":")
        .and_then(|i| text.get(i + "\"otherData\":".len()..))
        .and_then(|tail| tail.trim_end().strip_suffix('}'))
        .and_then(|o| serde_json::from_str::<serde_json::Value>(o).ok())
    else {
        return String::new();
    };
    let count = |key: &str| other[key].as_u64().unwrap_or(0);
    let (spans, device) = (count("dropped_spans"), count("dropped_device_events"));
    if spans == 0 && device == 0 {
        return String::new();
    }
    format!(
        " — incomplete: its buffers filled, and {spans} later runtime spans and {device} device \
         events were dropped (run fewer --iterations to see them all)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let us = |v: &[u64]| {
            v.iter()
                .map(|&x| Duration::from_micros(x))
                .collect::<Vec<_>>()
        };
        let s = stats(us(&[30, 10, 20]));
        assert_eq!((s.p50, s.p90, s.p99, s.max), (20.0, 30.0, 30.0, 30.0));
        let s = stats(us(&(1..=1000).collect::<Vec<_>>()));
        assert_eq!((s.p50, s.p90, s.p99), (500.0, 900.0, 990.0));
        let s = stats(us(&[7]));
        assert_eq!((s.p50, s.p99, s.min), (7.0, 7.0, 7.0));
    }

    /// `nrt bench --model MODEL --batch 8 --iterations 4`, otherwise the defaults.
    fn options(model: &str) -> BenchOptions {
        BenchOptions {
            model: model.into(),
            batch: 8,
            bytes: 64,
            iterations: Some(4),
            ncs: 1,
            in_flight: 0,
            progress: false,
            neff: None,
            warmup: 0,
            seed: 1,
            trace: None,
            datastore: DatastoreChoice::Env,
        }
    }

    #[test]
    fn a_trace_whose_buffers_filled_says_what_was_dropped() {
        let file = |spans: u64, device: u64| {
            format!(
                "{{\"traceEvents\":[\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"dropped_spans\":{spans},\"dropped_device_events\":{device}}}}}\n"
            )
        };
        assert_eq!(drops_in(&file(0, 0)), "");
        let said = drops_in(&file(97862, 3));
        assert!(
            said.contains("97862 later runtime spans and 3 device events"),
            "{said}"
        );
        assert_eq!(drops_in("not a trace"), "");
    }

    #[test]
    fn only_the_digits_report_counts_images_and_cores_are_logical_cores() {
        let opts = options;
        let samples = vec![Duration::from_micros(50); 4];
        let report = |model: &str, images| {
            let mut r = BenchReport::timed(
                model.into(),
                "sim",
                &opts(model),
                1,
                (4, images),
                samples.clone(),
                0.001,
            );
            // As the digits run sets it.
            r.batch = 8;
            text(&r)
        };
        let digits = report("digits", 32);
        assert!(
            digits.starts_with(
                "model digits on sim — batch 8, 1 logical core(s), 4 executions, 32 images\n"
            ) && digits.ends_with("throughput 4000 executions/s, 32000 images/s\n"),
            "{digits}"
        );
        for model in ["identity", "matmul_small.neff"] {
            let t = report(model, 4);
            assert!(
                t.starts_with(&format!(
                    "model {model} on sim — 1 logical core(s), 4 executions\n"
                )) && t.ends_with("throughput 4000 executions/s\n")
                    && !t.contains("image")
                    && !t.contains("batch"),
                "{t}"
            );
        }
    }

    #[test]
    fn throughput_is_over_the_timed_span_of_every_core_not_the_warm_up() {
        // Core 0 warmed up for 40 ms and timed from 40 to 43 ms; core 1 timed from 41 to
        // 45 ms. The wall is 40..45 ms: 5 ms, not the 45 ms since the first warm-up.
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let us = Duration::from_micros;
        let ran = Timed::merge(vec![
            Timed {
                times: vec![us(10), us(20)],
                start: at(40),
                end: at(43),
                host: Duration::from_millis(1),
                error: None,
            },
            Timed {
                times: vec![us(30)],
                start: at(41),
                end: at(45),
                host: Duration::from_millis(1),
                error: Some("execution 1 ended with NRT_HW_ERROR (6)".into()),
            },
        ]);
        assert_eq!(ran.samples, [us(10), us(20), us(30)]);
        assert!((ran.wall - 0.005).abs() < 1e-9, "wall {}", ran.wall);
        // 2 ms of input writes and output checks in the cores' 3 + 4 ms.
        assert!(
            (ran.host_share - 2.0 / 7.0).abs() < 1e-9,
            "{}",
            ran.host_share
        );
        assert_eq!(
            ran.error.as_deref(),
            Some("execution 1 ended with NRT_HW_ERROR (6)"),
            "a core's error is the run's"
        );
        let none = Timed::merge(Vec::new());
        assert!(none.samples.is_empty() && none.wall == 0.0 && none.error.is_none());
    }

    #[test]
    fn the_report_says_what_the_bench_itself_took_and_what_async_above_the_queue_means() {
        // Four identity executions of 100 µs in 1 ms with `--async in_flight`.
        let report = |in_flight: u32| {
            let mut opts = options("identity");
            opts.in_flight = in_flight;
            BenchReport::timed(
                "identity".into(),
                "sim",
                &opts,
                1,
                (4, 4),
                vec![Duration::from_micros(100); 4],
                0.001,
            )
        };
        let mut r = report(20);
        r.host_check_share = 0.6;
        let t = text(&r);
        assert!(
            t.contains(
                "input writes and output checks took 60% of the time the throughput is over"
            ),
            "{t}"
        );
        assert!(
            t.contains("--async 20: an XU queue holds 16 executions, so at most 16 were in flight"),
            "{t}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["host_check_share"], 0.6);
        assert!(
            json["in_flight_note"]
                .as_str()
                .unwrap()
                .contains("at most 16")
        );
        let t = text(&report(16));
        assert!(
            !t.contains("XU queue") && !t.contains("output checks took"),
            "{t}"
        );
    }

    #[test]
    fn a_report_stopped_by_an_error_says_so_and_claims_no_accuracy() {
        let mut r = BenchReport::timed(
            "digits".into(),
            "sim",
            &options("digits"),
            1,
            (360, 360),
            vec![Duration::from_micros(50); 3],
            0.001,
        );
        r.error = Some("execution 3: NRT_HW_ERROR (6)".into());
        r.accuracy = Some(0.5);
        r.max_abs_logit_diff = Some(0.0);
        let t = text(&r);
        assert!(
            t.contains(
                "stopped by an error: the figures are of the 3 executions before it: execution 3: NRT_HW_ERROR (6)\n"
            ) && !t.contains("accuracy"),
            "{t}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["error"], "execution 3: NRT_HW_ERROR (6)");
        assert_eq!(json["executions"], 3);
    }

    #[test]
    fn without_ncs_the_bench_runs_on_the_cores_the_environment_asks_for() {
        let asked = |vars: &[(&str, &str)]| {
            let c = RuntimeConfig::from_lookup(|k| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            })
            .unwrap();
            ncs_asked_by(&c)
        };
        assert_eq!(asked(&[]), 1);
        assert_eq!(asked(&[("NEURON_RT_NUM_CORES", "3")]), 3);
        assert_eq!(
            asked(&[("NEURON_RT_NUM_CORES", "0")]),
            1,
            "0 = all: not a count"
        );
        assert_eq!(asked(&[("NEURON_RT_VISIBLE_CORES", "1-2")]), 2);
        assert_eq!(
            asked(&[
                ("NEURON_RT_VISIBLE_CORES", "4"),
                ("NEURON_RT_NUM_CORES", "3")
            ]),
            1,
            "VISIBLE_CORES wins, as in the runtime"
        );
    }

    #[test]
    fn random_float_inputs_are_finite_normal_and_well_scaled() {
        for dtype in DType::ALL {
            let mut buf: Vec<u8> = (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0])
                .collect();
            let before = buf.clone();
            finite_floats(dtype, &mut buf);
            let Some((bits, man_bits, bias)) = float_layout(dtype) else {
                assert_eq!(buf, before, "{dtype:?} is left as random bytes");
                continue;
            };
            let width = bits as usize / 8;
            let exp_mask = (1u64 << (bits - 1 - man_bits)) - 1;
            let mut signs = [0; 2];
            for e in buf.chunks_exact(width) {
                let mut r = [0u8; 8];
                r[..width].copy_from_slice(e);
                let v = u64::from_le_bytes(r);
                let exponent = (v >> man_bits) & exp_mask;
                assert!(
                    (bias - 3..=bias).contains(&exponent) && exponent != exp_mask,
                    "{dtype:?}: exponent {exponent} of {v:#x}"
                );
                signs[usize::from(v >> (bits - 1) == 1)] += 1;
            }
            assert!(signs[0] > 0 && signs[1] > 0, "{dtype:?}: both signs");
        }
        let mut f32s: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7).to_le_bytes()[0])
            .collect();
        finite_floats(DType::F32, &mut f32s);
        for e in f32s.chunks_exact(4) {
            let x = f32::from_le_bytes(e.try_into().unwrap()).abs();
            assert!((0.125..2.0).contains(&x), "{x}");
        }
    }

    /// Counters of `executions`, `errors` of them failed, `shape_only` of the rest shape-only and
    /// the others reference-backed.
    fn counters(executions: u64, shape_only: u64, errors: u64) -> Option<NcCounters> {
        Some(NcCounters {
            executions,
            neff_shape_only_executions: shape_only,
            neff_reference_executions: executions - errors - shape_only,
            exec_errors: errors,
            ..NcCounters::default()
        })
    }

    #[test]
    fn simdev_counters_tell_shape_only_from_reference_outputs() {
        let before = [counters(5, 5, 0), counters(5, 5, 0)];
        // LNC=2: both NCs of the logical core count each execution.
        let shape_only = [counters(15, 15, 0), counters(15, 15, 0)];
        assert_eq!(
            neff_outputs(&before, &shape_only),
            Some(NeffOutputs::ShapeOnly)
        );
        let reference = [counters(15, 5, 0), counters(15, 5, 0)];
        assert_eq!(
            neff_outputs(&before, &reference),
            Some(NeffOutputs::Reference)
        );
        let mixed = [counters(15, 10, 0), counters(15, 10, 0)];
        assert_eq!(neff_outputs(&before, &mixed), Some(NeffOutputs::Mixed));
        // Executions that failed are neither.
        let failed = [counters(7, 5, 2), counters(7, 5, 2)];
        assert_eq!(neff_outputs(&before, &failed), None);
        // Nothing ran, or no counters (hardware): the counters say nothing.
        assert_eq!(neff_outputs(&before, &before), None);
        assert_eq!(neff_outputs(&[None, None], &[None, None]), None);
        assert_eq!(NeffOutputs::Reference.label(), "reference");
    }
}
