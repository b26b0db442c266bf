//! Runs one scenario: a private simdev, a control connection to it, the runtime, the steps and
//! the checks.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use runtime::backend::sim::{PrivateSimdev, SimDevice, SimdevCommand};
use runtime::config::{RuntimeConfig, parse_visible_cores};
use runtime::xu::XuHealth;
use runtime::{Device, ModelHandle, NrtError, Placement, Runtime, ScheduledExecution, TensorSet};
use shared::NrtStatus;
use shared::protocol::{DeviceStats, NcCounters};

use super::models::BuiltModel;
use super::report::Recorder;
use super::spec::{Bound, Check, FaultEntry, Scenario, StatusSel, Step};

/// A model loaded under a handle name.
#[derive(Debug, Clone)]
struct Loaded {
    handle: ModelHandle,
    model: Arc<BuiltModel>,
}

/// What a `snapshot` step (and the automatic `baseline`) records.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    stats: Option<DeviceStats>,
    counters: Vec<Option<NcCounters>>,
}

/// One execution's result.
#[derive(Debug, Clone)]
struct ExecRecord {
    e: u64,
    status: NrtStatus,
    message: String,
    secs: f64,
    output: Option<Result<(), String>>,
}

/// An `execute` step's results.
#[derive(Debug, Default)]
struct ExecOutcome {
    records: Vec<ExecRecord>,
    queue_full: u64,
    errors: Vec<String>,
    seconds: f64,
}

/// How an `execute` step runs.
#[derive(Debug, Clone)]
struct ExecParams {
    count: u64,
    threads: u32,
    asynchronous: bool,
    host: bool,
    tensors_vnc: u32,
    check: bool,
    inflight: usize,
    seed: u64,
}

/// A background `execute` step.
#[derive(Debug)]
struct Background {
    step_no: usize,
    step: Step,
    thread: std::thread::JoinHandle<ExecOutcome>,
}

/// A client process.
#[derive(Debug)]
struct Client {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

/// The scenario's state while it runs.
pub struct Runner<'a> {
    sc: &'a Scenario,
    /// Outcomes.
    pub rec: Recorder,
    dir: PathBuf,
    exe: PathBuf,
    simdev: Option<PrivateSimdev>,
    control: Option<SimDevice>,
    rt: Option<Arc<Runtime>>,
    models: BTreeMap<String, Arc<BuiltModel>>,
    handles: BTreeMap<String, Loaded>,
    snapshots: BTreeMap<String, Snapshot>,
    background: BTreeMap<String, Background>,
    clients: BTreeMap<String, Client>,
}

fn status_of(r: &Result<(), NrtError>) -> NrtStatus {
    r.as_ref().err().map_or(NrtStatus::Success, |e| e.status)
}

fn secs(d: f64) -> String {
    format!("{d:.3} s")
}

fn histogram(records: &[ExecRecord]) -> BTreeMap<&'static str, u64> {
    let mut h = BTreeMap::new();
    for r in records {
        *h.entry(r.status.name()).or_insert(0) += 1;
    }
    h
}

fn show_hist(h: &BTreeMap<&'static str, u64>) -> String {
    if h.is_empty() {
        return "no calls".into();
    }
    h.iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn names(v: &[NrtStatus]) -> String {
    v.iter().map(|s| s.name()).collect::<Vec<_>>().join(" | ")
}

fn parse_signal(s: Option<&str>) -> Result<Signal, String> {
    match s.unwrap_or("SIGKILL").to_ascii_uppercase().as_str() {
        "SIGKILL" | "KILL" | "9" => Ok(Signal::SIGKILL),
        "SIGINT" | "INT" | "2" => Ok(Signal::SIGINT),
        "SIGTERM" | "TERM" | "15" => Ok(Signal::SIGTERM),
        other => Err(format!(
            "signal {other:?} is not SIGKILL, SIGINT or SIGTERM"
        )),
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

/// Whether process `pid` runs (exists and is not a zombie).
fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("");
            !matches!(state, "Z" | "X" | "x")
        }
        Err(_) => false,
    }
}

/// Resident memory of this process in KiB (`VmRSS`).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A command for re-executing this program as a child that dies with us.
pub fn child_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2), which
    // is async-signal-safe; it touches no memory shared with the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    cmd
}

fn counter(c: &NcCounters, key: &str) -> u64 {
    match key {
        "dma_descriptors" => c.dma_descriptors,
        "dma_bytes" => c.dma_bytes,
        "dma_aborts" => c.dma_aborts,
        "register_writes" => c.register_writes,
        "doorbells" => c.doorbells,
        "notifications" => c.notifications,
        "nq_overflows" => c.nq_overflows,
        "posted_errors" => c.posted_errors,
        "resets" => c.resets,
        "executions" => c.executions,
        "exec_errors" => c.exec_errors,
        "config_reloads" => c.config_reloads,
        "table_loads" => c.table_loads,
        _ => c.cc_chains,
    }
}

fn stat(s: &DeviceStats, key: &str) -> u64 {
    match key {
        "memory_in_use" => s.memory_in_use,
        "chunks" => s.chunks,
        "clients" => u64::from(s.clients),
        "claimed_ncs" => u64::from(s.claimed_ncs),
        "dma_queues" => u64::from(s.dma_queues),
        _ => u64::from(s.armed_faults),
    }
}

fn counter_bound<'c>(c: &'c Check, key: &str) -> Option<&'c Bound> {
    match key {
        "dma_descriptors" => c.dma_descriptors.as_ref(),
        "dma_bytes" => c.dma_bytes.as_ref(),
        "dma_aborts" => c.dma_aborts.as_ref(),
        "register_writes" => c.register_writes.as_ref(),
        "doorbells" => c.doorbells.as_ref(),
        "notifications" => c.notifications.as_ref(),
        "nq_overflows" => c.nq_overflows.as_ref(),
        "posted_errors" => c.posted_errors.as_ref(),
        "resets" => c.resets.as_ref(),
        "executions" => c.executions.as_ref(),
        "exec_errors" => c.exec_errors.as_ref(),
        "config_reloads" => c.config_reloads.as_ref(),
        "table_loads" => c.table_loads.as_ref(),
        "cc_chains" => c.cc_chains.as_ref(),
        "memory_in_use" => c.memory_in_use.as_ref(),
        "chunks" => c.chunks.as_ref(),
        "clients" => c.clients.as_ref(),
        "claimed_ncs" => c.claimed_ncs.as_ref(),
        "dma_queues" => c.dma_queues.as_ref(),
        "armed_faults" => c.armed_faults.as_ref(),
        _ => None,
    }
}

/// Whether `v` satisfies `b`; the expected text. `same` resolves a snapshot name.
fn bound_ok(
    b: &Bound,
    v: i128,
    same: impl Fn(&str) -> Result<u64, String>,
) -> Result<(bool, String), String> {
    Ok(match b {
        Bound::Exact(x) => (v == i128::from(*x), format!("{x}")),
        Bound::Range { min, max } => {
            let lo = min.is_none_or(|m| v >= i128::from(m));
            let hi = max.is_none_or(|m| v <= i128::from(m));
            let text = match (min, max) {
                (Some(a), Some(b)) => format!("{a}..={b}"),
                (Some(a), None) => format!(">= {a}"),
                (None, Some(b)) => format!("<= {b}"),
                (None, None) => "anything".into(),
            };
            (lo && hi, text)
        }
        Bound::Same(name) => {
            let x = same(name)?;
            (v == i128::from(x), format!("{x} (as at {name})"))
        }
    })
}

/// The status expectations of a step, resolved.
struct StatusRules {
    each: Option<Vec<NrtStatus>>,
    counts: Option<Vec<(NrtStatus, u64)>>,
    all: Option<NrtStatus>,
    not: Option<Vec<NrtStatus>>,
    one_of: Option<Vec<NrtStatus>>,
}

fn resolve(list: &[StatusSel]) -> Result<Vec<NrtStatus>, String> {
    list.iter().map(StatusSel::status).collect()
}

impl StatusRules {
    fn of(step: &Step) -> Result<Self, String> {
        let counts = match &step.expect_counts {
            None => None,
            Some(m) => {
                let mut out = Vec::new();
                for (k, v) in m {
                    out.push((super::spec::parse_status(k)?, *v));
                }
                Some(out)
            }
        };
        let mut r = Self {
            each: step.expect_each.as_deref().map(resolve).transpose()?,
            counts,
            all: step.expect.as_ref().map(StatusSel::status).transpose()?,
            not: step
                .expect_not
                .as_ref()
                .map(super::spec::StatusList::statuses)
                .transpose()?,
            one_of: step.expect_one_of.as_deref().map(resolve).transpose()?,
        };
        if r.each.is_none()
            && r.counts.is_none()
            && r.all.is_none()
            && r.not.is_none()
            && r.one_of.is_none()
        {
            r.all = Some(NrtStatus::Success);
        }
        Ok(r)
    }

    /// Records one outcome per rule over `records` (sorted by execution index).
    fn judge(&self, rec: &mut Recorder, at: &str, records: &[ExecRecord]) {
        let h = histogram(records);
        if let Some(all) = self.all {
            let ok = !records.is_empty() && records.iter().all(|r| r.status == all);
            let seen = match records.iter().find(|r| r.status != all) {
                Some(r) if !r.message.is_empty() => {
                    format!(
                        "{} (first other: call {}: {})",
                        show_hist(&h),
                        r.e,
                        r.message
                    )
                }
                _ => show_hist(&h),
            };
            rec.record(ok, at, format!("every call returns {}", all.name()), seen);
        }
        if let Some(each) = &self.each {
            let seen: Vec<NrtStatus> = records.iter().map(|r| r.status).collect();
            rec.record(
                seen == *each,
                at,
                format!("calls return, in order, [{}]", names(each)),
                format!("[{}]", names(&seen)),
            );
        }
        if let Some(counts) = &self.counts {
            let mut ok = true;
            for (s, n) in counts {
                if h.get(s.name()).copied().unwrap_or(0) != *n {
                    ok = false;
                }
            }
            for (name, n) in &h {
                if *n > 0 && !counts.iter().any(|(s, _)| s.name() == *name) {
                    ok = false;
                }
            }
            let want: BTreeMap<&'static str, u64> =
                counts.iter().map(|(s, n)| (s.name(), *n)).collect();
            rec.record(
                ok,
                at,
                format!("statuses {}", show_hist(&want)),
                show_hist(&h),
            );
        }
        if let Some(not) = &self.not {
            let ok = !records.is_empty() && records.iter().all(|r| !not.contains(&r.status));
            rec.record(
                ok,
                at,
                format!("no call returns {}", names(not)),
                show_hist(&h),
            );
        }
        if let Some(one_of) = &self.one_of {
            let ok = !records.is_empty() && records.iter().all(|r| one_of.contains(&r.status));
            rec.record(
                ok,
                at,
                format!("every call returns one of {}", names(one_of)),
                show_hist(&h),
            );
        }
    }
}

/// Runs an `execute` step's executions.
fn run_execute(rt: &Runtime, m: &BuiltModel, h: ModelHandle, p: &ExecParams) -> ExecOutcome {
    let start = Instant::now();
    let next = AtomicU64::new(0);
    let per_thread: Vec<ExecOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..p.threads.max(1))
            .map(|_| {
                let next = &next;
                s.spawn(move || {
                    if p.asynchronous {
                        exec_thread_async(rt, m, h, p, next)
                    } else {
                        exec_thread_sync(rt, m, h, p, next)
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|t| {
                t.join().unwrap_or_else(|_| ExecOutcome {
                    errors: vec!["an execution thread panicked".into()],
                    ..ExecOutcome::default()
                })
            })
            .collect()
    });
    let mut out = ExecOutcome::default();
    for t in per_thread {
        out.records.extend(t.records);
        out.errors.extend(t.errors);
        out.queue_full += t.queue_full;
    }
    out.records.sort_by_key(|r| r.e);
    out.seconds = start.elapsed().as_secs_f64();
    out
}

struct Slot {
    input: runtime::Tensor,
    output: runtime::Tensor,
    ins: TensorSet,
    outs: TensorSet,
}

fn slot(rt: &Runtime, m: &BuiltModel, p: &ExecParams) -> Result<Slot, String> {
    let placement = if p.host {
        Placement::Host
    } else {
        Placement::Device { vnc: p.tensors_vnc }
    };
    let input = rt
        .tensor_allocate(placement, m.in_bytes.max(1), "input")
        .map_err(|e| format!("allocating the input tensor: {e}"))?;
    let output = rt
        .tensor_allocate(placement, m.out_bytes.max(1), "output")
        .map_err(|e| format!("allocating the output tensor: {e}"))?;
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &input);
    outs.add("output", &output);
    Ok(Slot {
        input,
        output,
        ins,
        outs,
    })
}

fn prepare(m: &BuiltModel, p: &ExecParams, s: &Slot, e: u64) -> Result<Vec<u8>, String> {
    let input = m.input(p.seed, e);
    s.input
        .write(&input, 0)
        .map_err(|err| format!("writing the input of execution {e}: {err}"))?;
    let zeros = vec![0u8; usize::try_from(s.output.size()).unwrap_or(0)];
    s.output
        .write(&zeros, 0)
        .map_err(|err| format!("clearing the output of execution {e}: {err}"))?;
    Ok(input)
}

fn verify(
    m: &BuiltModel,
    p: &ExecParams,
    s: &Slot,
    e: u64,
    status: NrtStatus,
    input: &[u8],
) -> Option<Result<(), String>> {
    let delivered = matches!(
        status,
        NrtStatus::Success | NrtStatus::ExecCompletedWithNumErr
    );
    if !p.check || !m.checkable() || !delivered {
        return None;
    }
    let mut out = vec![0u8; usize::try_from(s.output.size()).unwrap_or(0)];
    Some(
        s.output
            .read(&mut out, 0)
            .map_err(|err| format!("reading the output of execution {e}: {err}"))
            .and_then(|()| m.check(p.seed, e, input, &out)),
    )
}

fn exec_thread_sync(
    rt: &Runtime,
    m: &BuiltModel,
    h: ModelHandle,
    p: &ExecParams,
    next: &AtomicU64,
) -> ExecOutcome {
    let mut out = ExecOutcome::default();
    let s = match slot(rt, m, p) {
        Ok(s) => s,
        Err(e) => {
            out.errors.push(e);
            return out;
        }
    };
    loop {
        let e = next.fetch_add(1, Ordering::Relaxed);
        if e >= p.count {
            break;
        }
        let input = match prepare(m, p, &s, e) {
            Ok(i) => i,
            Err(err) => {
                out.errors.push(err);
                continue;
            }
        };
        let t0 = Instant::now();
        let r = rt.execute(h, &s.ins, &s.outs);
        if r.is_ok() && rt.implicit_async() {
            // The implicit async pool returns at submission: wait for the results.
            rt.async_drain(h.vnc);
        }
        let secs = t0.elapsed().as_secs_f64();
        let status = status_of(&r);
        out.records.push(ExecRecord {
            e,
            status,
            message: r.err().map(|e| e.message).unwrap_or_default(),
            secs,
            output: verify(m, p, &s, e, status, &input),
        });
    }
    out
}

fn exec_thread_async(
    rt: &Runtime,
    m: &BuiltModel,
    h: ModelHandle,
    p: &ExecParams,
    next: &AtomicU64,
) -> ExecOutcome {
    let mut out = ExecOutcome::default();
    let mut slots = Vec::new();
    for _ in 0..p.inflight.max(1) {
        match slot(rt, m, p) {
            Ok(s) => slots.push(s),
            Err(e) => {
                out.errors.push(e);
                return out;
            }
        }
    }
    let mut free: Vec<usize> = (0..slots.len()).rev().collect();
    let mut pending: VecDeque<(u64, usize, Instant, ScheduledExecution, Vec<u8>)> = VecDeque::new();
    let complete = |pending: &mut VecDeque<(u64, usize, Instant, ScheduledExecution, Vec<u8>)>,
                    free: &mut Vec<usize>,
                    out: &mut ExecOutcome| {
        let Some((e, i, t0, req, input)) = pending.pop_front() else {
            return;
        };
        let (status, message) = match rt.wait(&req) {
            Ok(s) => (s, String::new()),
            Err(err) => (err.status, err.message),
        };
        out.records.push(ExecRecord {
            e,
            status,
            message,
            secs: t0.elapsed().as_secs_f64(),
            output: verify(m, p, &slots[i], e, status, &input),
        });
        free.push(i);
    };
    loop {
        let e = next.fetch_add(1, Ordering::Relaxed);
        if e >= p.count {
            break;
        }
        if free.is_empty() {
            complete(&mut pending, &mut free, &mut out);
        }
        let Some(i) = free.pop() else {
            out.errors.push("no free tensor slot".into());
            break;
        };
        let input = match prepare(m, p, &slots[i], e) {
            Ok(v) => v,
            Err(err) => {
                out.errors.push(err);
                free.push(i);
                continue;
            }
        };
        let retry_until = Instant::now() + Duration::from_secs(10);
        loop {
            let t0 = Instant::now();
            match rt.execute_schedule(h, &slots[i].ins, &slots[i].outs) {
                Ok(req) => {
                    pending.push_back((e, i, t0, req, input));
                    break;
                }
                Err(err) if err.status == NrtStatus::QueueFull && Instant::now() < retry_until => {
                    out.queue_full += 1;
                    if pending.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                    } else {
                        complete(&mut pending, &mut free, &mut out);
                    }
                }
                Err(err) => {
                    out.records.push(ExecRecord {
                        e,
                        status: err.status,
                        message: err.message,
                        secs: t0.elapsed().as_secs_f64(),
                        output: None,
                    });
                    free.push(i);
                    break;
                }
            }
        }
    }
    while !pending.is_empty() {
        complete(&mut pending, &mut free, &mut out);
    }
    out
}

impl<'a> Runner<'a> {
    /// A runner for `sc` (from a file in `dir`), re-executing `exe` for simdev and clients.
    pub fn new(sc: &'a Scenario, name: &str, dir: &Path, exe: &Path, print: bool) -> Self {
        Self {
            sc,
            rec: Recorder::new(name, print),
            dir: dir.to_owned(),
            exe: exe.to_owned(),
            simdev: None,
            control: None,
            rt: None,
            models: BTreeMap::new(),
            handles: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            background: BTreeMap::new(),
            clients: BTreeMap::new(),
        }
    }

    fn exec_timeout(&self) -> f64 {
        self.sc.runtime.exec_timeout
    }

    fn config(&self) -> Result<RuntimeConfig, String> {
        let r = &self.sc.runtime;
        if !(r.exec_timeout > 0.0 && r.exec_timeout.is_finite()) {
            return Err(format!(
                "[runtime] exec_timeout = {}: must be a positive number of seconds",
                r.exec_timeout
            ));
        }
        let visible_cores = r
            .visible_cores
            .as_ref()
            .map(|v| parse_visible_cores(&v.text()))
            .transpose()
            .map_err(|e| format!("[runtime] visible_cores: {e}"))?;
        let report_numerical_errors = r
            .numerical_errors_verbosity
            .as_deref()
            .map(runtime::config::parse_numerical_errors_verbosity)
            .transpose()
            .map_err(|e| format!("[runtime] numerical_errors_verbosity: {e}"))?
            .unwrap_or(false);
        Ok(RuntimeConfig {
            visible_cores,
            num_cores: r.num_cores,
            exec_timeout: Duration::from_secs_f64(r.exec_timeout),
            async_max_inflight: r.async_max_inflight,
            skip_config_optimization: r.skip_config_optimization,
            funtime: false,
            xu_capacity: r.xu_capacity,
            lnc: r.lnc,
            report_numerical_errors,
        })
    }

    fn simdev_args(&self) -> Vec<std::ffi::OsString> {
        let d = &self.sc.device;
        let mut v: Vec<std::ffi::OsString> = vec![
            "--arch".into(),
            d.arch.clone().into(),
            "--hbm".into(),
            d.hbm.clone().into(),
        ];
        if let Some(n) = d.ncs {
            v.push("--ncs".into());
            v.push(n.to_string().into());
        }
        v
    }

    /// Starts simdev, connects the control connection, sets the latency model, takes the
    /// baseline snapshot.
    fn start_simdev(&mut self) -> Result<(), String> {
        let cmd = SimdevCommand {
            program: self.exe.clone(),
            args_prefix: vec!["simdev".into()],
            extra_args: self.simdev_args(),
        };
        let simdev = PrivateSimdev::spawn(&cmd).map_err(|e| crate::error_chain(&e))?;
        let control = SimDevice::connect(simdev.socket())
            .map_err(|e| format!("control connection: {}", crate::error_chain(&e)))?;
        if let Some(l) = &self.sc.device.latency {
            control
                .set_latency(l.model())
                .map_err(|e| format!("setting the latency model: {}", crate::error_chain(&e)))?;
        }
        self.simdev = Some(simdev);
        self.control = Some(control);
        let base = self.snapshot();
        self.snapshots.insert("baseline".into(), base);
        Ok(())
    }

    fn snapshot(&self) -> Snapshot {
        let Some(c) = &self.control else {
            return Snapshot::default();
        };
        Snapshot {
            stats: c.device_stats().ok(),
            counters: (0..c.info().nc_count)
                .map(|nc| c.nc_counters(nc).ok())
                .collect(),
        }
    }

    fn init_runtime(&mut self) -> Result<(), NrtError> {
        let config = self
            .config()
            .map_err(|m| NrtError::new(NrtStatus::Invalid, m))?;
        let socket = self
            .simdev
            .as_ref()
            .map(|s| s.socket().to_owned())
            .ok_or_else(|| NrtError::new(NrtStatus::HwError, "simdev is not running"))?;
        let dev = SimDevice::connect(&socket)?;
        let rt = Runtime::init(Arc::new(dev) as Arc<dyn Device>, config)?;
        self.rt = Some(Arc::new(rt));
        Ok(())
    }

    /// Runs the whole scenario.
    pub fn run(&mut self) {
        for (name, spec) in &self.sc.models {
            match BuiltModel::build(name, spec, &self.dir) {
                Ok(m) => {
                    self.models.insert(name.clone(), Arc::new(m));
                }
                Err(e) => self.rec.fail("setup", "every model builds", e),
            }
        }
        if self.rec.failed() {
            return;
        }
        if let Err(e) = self.start_simdev() {
            self.rec.fail("setup", "simdev starts", e);
            return;
        }
        for (i, f) in self.sc.faults.iter().enumerate() {
            if let Err(e) = self.arm(f) {
                self.rec
                    .fail(&format!("fault {}", i + 1), "the fault is armed", e);
            }
        }
        if self.sc.runtime.init
            && let Err(e) = self.init_runtime()
        {
            self.rec
                .fail("setup", "the runtime initialises", e.to_string());
            return;
        }
        let steps = self.sc.steps.clone();
        for (i, step) in steps.iter().enumerate() {
            let at = match &step.label {
                Some(l) => format!("step {} {l}", i + 1),
                None => format!("step {} {}", i + 1, describe(step)),
            };
            self.step(i + 1, &at, step);
        }
        let checks = self.sc.expect.clone();
        for (i, c) in checks.iter().enumerate() {
            self.check(&format!("expect {} {}", i + 1, c.what), c);
        }
        self.cleanup();
    }

    fn arm(&self, f: &FaultEntry) -> Result<(), String> {
        let spec = f.spec(self.sc.device.seed)?;
        let c = self
            .control
            .as_ref()
            .ok_or("simdev is not running, nothing to arm")?;
        c.inject_fault(spec).map_err(|e| crate::error_chain(&e))
    }

    fn cleanup(&mut self) {
        let names: Vec<String> = self.clients.keys().cloned().collect();
        for n in names {
            if let Some(mut c) = self.clients.remove(&n) {
                let _ = c.child.kill();
                let _ = c.child.wait();
            }
        }
        let names: Vec<String> = self.background.keys().cloned().collect();
        for n in names {
            if let Some(b) = self.background.remove(&n) {
                let _ = b.thread.join();
                self.rec.fail(
                    &format!("step {}", b.step_no),
                    format!("background step {n:?} is joined"),
                    "it was never joined",
                );
            }
        }
        self.handles.clear();
        if let Some(rt) = self.rt.take()
            && let Ok(rt) = Arc::try_unwrap(rt)
        {
            rt.close();
        }
        self.control = None;
        self.simdev = None;
    }

    fn runtime(&mut self, at: &str) -> Option<Arc<Runtime>> {
        let rt = self.rt.clone();
        if rt.is_none() {
            self.rec.fail(
                at,
                "a runtime is open",
                "there is none (init = false, or closed)",
            );
        }
        rt
    }

    /// The `[models]` entry the step names, or a failed expectation saying it is not defined.
    fn defined_model(&mut self, at: &str, step: &Step) -> Option<(String, Arc<BuiltModel>)> {
        let name = step.model.clone().unwrap_or_default();
        let m = self.models.get(&name).cloned();
        if m.is_none() {
            self.rec.fail(
                at,
                format!("model {name:?} is defined in [models]"),
                "it is not",
            );
        }
        Some((name, m?))
    }

    fn judge_simple(&mut self, at: &str, step: &Step, r: &Result<(), NrtError>, took: f64) {
        let want = match step.expect.as_ref().map(StatusSel::status).transpose() {
            Ok(w) => w.unwrap_or(NrtStatus::Success),
            Err(e) => {
                self.rec.fail(at, "a valid expect", e);
                return;
            }
        };
        let seen = match r {
            Ok(()) => NrtStatus::Success.name().to_string(),
            Err(e) => format!("{}: {}", e.status.name(), e.message),
        };
        self.rec
            .record(status_of(r) == want, at, want.name().to_string(), seen);
        if let Some(sub) = &step.expect_message_contains {
            let msg = r
                .as_ref()
                .err()
                .map(|e| e.message.clone())
                .unwrap_or_default();
            self.rec.record(
                msg.contains(sub.as_str()),
                at,
                format!("the error message contains {sub:?}"),
                if msg.is_empty() {
                    "no error".to_string()
                } else {
                    format!("{msg:?}")
                },
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                took <= max,
                at,
                format!("returns within {}", secs(max)),
                format!("took {}", secs(took)),
            );
        }
    }

    fn step(&mut self, n: usize, at: &str, step: &Step) {
        match step.action.as_str() {
            "init" => {
                if self.rt.is_some() {
                    self.rec
                        .fail(at, "no runtime is open", "one is: close it first");
                    return;
                }
                let t0 = Instant::now();
                let r = self.init_runtime();
                self.judge_simple(at, step, &r, t0.elapsed().as_secs_f64());
            }
            "load" => self.load(at, step),
            "unload" => {
                let Some(rt) = self.runtime(at) else { return };
                let name = step.model.clone().unwrap_or_default();
                let Some(l) = self.handles.remove(&name) else {
                    self.rec
                        .fail(at, format!("model {name:?} is loaded"), "it is not");
                    return;
                };
                let t0 = Instant::now();
                let r = rt.unload(l.handle);
                self.judge_simple(at, step, &r, t0.elapsed().as_secs_f64());
            }
            "execute" => self.execute(n, at, step),
            "join" => {
                let name = step.name.clone().unwrap_or_default();
                let Some(b) = self.background.remove(&name) else {
                    self.rec.fail(
                        at,
                        format!("background step {name:?} exists"),
                        "it does not",
                    );
                    return;
                };
                let outcome = b.thread.join().unwrap_or_else(|_| ExecOutcome {
                    errors: vec!["the background thread panicked".into()],
                    ..ExecOutcome::default()
                });
                let at = format!("{at} (step {} execute)", b.step_no);
                let m = b
                    .step
                    .model
                    .as_ref()
                    .and_then(|h| self.handles.get(h))
                    .map(|l| l.model.clone());
                self.judge_exec(&at, &b.step, &outcome, m.as_deref());
            }
            "close" => {
                let Some(rt) = self.rt.take() else {
                    self.rec.fail(at, "a runtime is open", "there is none");
                    return;
                };
                match Arc::try_unwrap(rt) {
                    Ok(rt) => {
                        self.handles.clear();
                        let t0 = Instant::now();
                        rt.close();
                        let took = t0.elapsed().as_secs_f64();
                        let max = step.max_step_s.unwrap_or(f64::INFINITY);
                        self.rec.record(
                            took <= max,
                            at,
                            if max.is_finite() {
                                format!("close returns within {}", secs(max))
                            } else {
                                "close returns".into()
                            },
                            format!("returned after {}", secs(took)),
                        );
                    }
                    Err(rt) => {
                        self.rt = Some(rt);
                        self.rec.fail(
                            at,
                            "no background step still uses the runtime",
                            "one does: join it first",
                        );
                    }
                }
            }
            "sleep" => std::thread::sleep(Duration::from_millis(step.ms.unwrap_or(0))),
            "fault" => {
                let f = FaultEntry {
                    kind: step.kind.clone().unwrap_or_default(),
                    nc: step.nc,
                    at_execution: step.at_execution,
                    per_million: step.per_million,
                    seed: step.seed,
                    delay_ms: step.delay_ms,
                    ns: step.ns,
                };
                if let Err(e) = self.arm(&f) {
                    self.rec.fail(at, "the fault is armed", e);
                }
            }
            "clear_faults" => {
                let r = self
                    .control
                    .as_ref()
                    .map(|c| c.clear_faults().map_err(|e| crate::error_chain(&e)));
                match r {
                    Some(Ok(())) => {}
                    Some(Err(e)) => self.rec.fail(at, "faults are cleared", e),
                    None => self
                        .rec
                        .fail(at, "faults are cleared", "simdev is not running"),
                }
            }
            "set_latency" => {
                let l = step.latency.unwrap_or_default();
                let r = self
                    .control
                    .as_ref()
                    .map(|c| c.set_latency(l.model()).map_err(|e| crate::error_chain(&e)));
                match r {
                    Some(Ok(())) => {}
                    Some(Err(e)) => self.rec.fail(at, "the latency model is set", e),
                    None => self
                        .rec
                        .fail(at, "the latency model is set", "simdev is not running"),
                }
            }
            "snapshot" => {
                let s = self.snapshot();
                self.snapshots
                    .insert(step.name.clone().unwrap_or_default(), s);
            }
            "check" => {
                for (j, c) in step.check.clone().unwrap_or_default().iter().enumerate() {
                    self.check(&format!("{at} [{}: {}]", j + 1, c.what), c);
                }
            }
            "spawn_client" => self.spawn_client(at, step),
            "kill_client" | "wait_client" => self.end_client(at, step),
            "kill_simdev" => {
                let sig = match parse_signal(step.signal.as_deref()) {
                    Ok(s) => s,
                    Err(e) => {
                        self.rec.fail(at, "a valid signal", e);
                        return;
                    }
                };
                self.kill_simdev(at, sig);
            }
            "restart_simdev" => {
                if self.simdev.is_some() {
                    self.kill_simdev(at, Signal::SIGKILL);
                }
                if let Err(e) = self.start_simdev() {
                    self.rec.fail(at, "simdev restarts", e);
                }
            }
            "lifecycle" => self.lifecycle(at, step),
            "cycles" => self.cycles(at, step),
            other => self.rec.fail(at, "a known action", format!("{other:?}")),
        }
    }

    fn kill_simdev(&mut self, at: &str, sig: Signal) {
        self.control = None;
        match self.simdev.take() {
            Some(mut s) => {
                let pid = Pid::from_raw(i32::try_from(s.pid()).unwrap_or(i32::MAX));
                if let Err(e) = nix::sys::signal::kill(pid, sig) {
                    self.rec.fail(at, "simdev is signalled", e.to_string());
                }
                let deadline = Instant::now() + Duration::from_secs(5);
                while process_running(s.pid()) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(2));
                }
                s.stop();
            }
            None => self.rec.fail(at, "simdev is running", "it is not"),
        }
    }

    fn load(&mut self, at: &str, step: &Step) {
        let Some(rt) = self.runtime(at) else { return };
        let Some((name, m)) = self.defined_model(at, step) else {
            return;
        };
        let t0 = Instant::now();
        let r = rt.load(&m.container, step.vnc.unwrap_or(0));
        let took = t0.elapsed().as_secs_f64();
        let unit = r.as_ref().map(|_| ()).map_err(Clone::clone);
        self.judge_simple(at, step, &unit, took);
        if let Ok(handle) = r {
            let key = step.handle_as.clone().unwrap_or(name);
            self.handles.insert(key, Loaded { handle, model: m });
        }
    }

    fn execute(&mut self, n: usize, at: &str, step: &Step) {
        let Some(rt) = self.runtime(at) else { return };
        let name = step.model.clone().unwrap_or_default();
        let Some(l) = self.handles.get(&name).cloned() else {
            self.rec
                .fail(at, format!("model {name:?} is loaded"), "it is not");
            return;
        };
        let asynchronous = match step.mode.as_deref().unwrap_or("sync") {
            "sync" => false,
            "async" => true,
            other => {
                self.rec
                    .fail(at, "mode sync or async", format!("{other:?}"));
                return;
            }
        };
        let p = ExecParams {
            count: step.count.unwrap_or(1),
            threads: step.threads.unwrap_or(1),
            asynchronous,
            host: step.host_tensors.unwrap_or(false),
            tensors_vnc: step.tensors_on_vnc.unwrap_or(l.handle.vnc),
            check: step.check_outputs.unwrap_or(true),
            inflight: step.inflight.map_or(2 * self.sc.runtime.xu_capacity, |i| {
                usize::try_from(i).unwrap_or(1)
            }),
            seed: self.sc.device.seed,
        };
        if let Some(bg) = &step.background {
            let model = l.model.clone();
            let thread = std::thread::spawn(move || run_execute(&rt, &model, l.handle, &p));
            self.background.insert(
                bg.clone(),
                Background {
                    step_no: n,
                    step: step.clone(),
                    thread,
                },
            );
            return;
        }
        let outcome = run_execute(&rt, &l.model, l.handle, &p);
        self.judge_exec(at, step, &outcome, Some(&l.model));
    }

    fn judge_exec(&mut self, at: &str, step: &Step, o: &ExecOutcome, m: Option<&BuiltModel>) {
        for e in &o.errors {
            self.rec.fail(at, "the execution is set up", e.clone());
        }
        match StatusRules::of(step) {
            Ok(rules) => rules.judge(&mut self.rec, at, &o.records),
            Err(e) => self.rec.fail(at, "valid status expectations", e),
        }
        if let Some(sub) = &step.expect_message_contains {
            let failed: Vec<&ExecRecord> = o
                .records
                .iter()
                .filter(|r| r.status != NrtStatus::Success)
                .collect();
            let bad = failed.iter().find(|r| !r.message.contains(sub.as_str()));
            let ok = !failed.is_empty() && bad.is_none();
            let seen = match (failed.first(), bad) {
                (None, _) => "no call failed".to_string(),
                (_, Some(r)) => format!("call {}: {:?}", r.e, r.message),
                (Some(r), None) => format!("{:?}", r.message),
            };
            self.rec.record(
                ok,
                at,
                format!("every failed call's message contains {sub:?}"),
                seen,
            );
        }
        if m.is_some_and(BuiltModel::checkable) && step.check_outputs.unwrap_or(true) {
            let checked: Vec<&ExecRecord> =
                o.records.iter().filter(|r| r.output.is_some()).collect();
            if !checked.is_empty() {
                let wrong: Vec<&String> = checked
                    .iter()
                    .filter_map(|r| r.output.as_ref().and_then(|x| x.as_ref().err()))
                    .collect();
                self.rec.record(
                    wrong.is_empty(),
                    at,
                    "every delivered output equals the reference",
                    match wrong.first() {
                        None => format!("{}/{} equal", checked.len(), checked.len()),
                        Some(w) => format!(
                            "{}/{} equal; {w}",
                            checked.len() - wrong.len(),
                            checked.len()
                        ),
                    },
                );
            }
        }
        let slowest = o.records.iter().max_by(|a, b| a.secs.total_cmp(&b.secs));
        let fastest = o.records.iter().min_by(|a, b| a.secs.total_cmp(&b.secs));
        let limit = |rec: &mut Recorder, max: f64, what: String| {
            let seen = slowest.map_or("no calls".to_string(), |r| {
                format!(
                    "slowest {} (call {}, {})",
                    secs(r.secs),
                    r.e,
                    r.status.name()
                )
            });
            rec.record(slowest.is_some_and(|r| r.secs <= max), at, what, seen);
        };
        if let Some(max) = step.max_call_s {
            limit(
                &mut self.rec,
                max,
                format!("every call returns within {}", secs(max)),
            );
        }
        if let Some(margin) = step.within_timeout_plus_s {
            let t = self.exec_timeout();
            limit(
                &mut self.rec,
                t + margin,
                format!(
                    "every call returns within the timeout + {} = {}",
                    secs(margin),
                    secs(t + margin)
                ),
            );
        }
        if let Some(min) = step.min_call_s {
            self.rec.record(
                fastest.is_some_and(|r| r.secs >= min),
                at,
                format!("every call takes at least {}", secs(min)),
                fastest.map_or("no calls".to_string(), |r| {
                    format!("fastest {} (call {})", secs(r.secs), r.e)
                }),
            );
        }
        if let Some(min) = step.min_queue_full {
            self.rec.record(
                o.queue_full >= min,
                at,
                format!("NRT_QUEUE_FULL refused a schedule at least {min} times"),
                format!("{} times", o.queue_full),
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                o.seconds <= max,
                at,
                format!("the step takes at most {}", secs(max)),
                format!("took {}", secs(o.seconds)),
            );
        }
    }

    fn same(&self, name: &str, key: &str, nc: Option<u32>) -> Result<u64, String> {
        let s = self
            .snapshots
            .get(name)
            .ok_or_else(|| format!("no snapshot named {name:?}"))?;
        match nc {
            Some(nc) => s
                .counters
                .get(usize::try_from(nc).unwrap_or(usize::MAX))
                .and_then(|c| c.as_ref())
                .map(|c| counter(c, key))
                .ok_or_else(|| format!("snapshot {name:?} has no counters of NC {nc}")),
            None => s
                .stats
                .as_ref()
                .map(|st| stat(st, key))
                .ok_or_else(|| format!("snapshot {name:?} has no device stats")),
        }
    }

    /// One attempt at a check: `(pass, expected, seen)` per line.
    fn eval(&self, c: &Check) -> Result<Vec<(bool, String, String)>, String> {
        let mut out = Vec::new();
        match c.what.as_str() {
            "counters" => {
                let nc = c.nc.ok_or("a counters check needs nc")?;
                let ctl = self.control.as_ref().ok_or("simdev is not running")?;
                let v = ctl.nc_counters(nc).map_err(|e| {
                    format!("reading NC {nc}'s counters: {}", crate::error_chain(&e))
                })?;
                let (mut ok, mut want, mut seen) = (true, Vec::new(), Vec::new());
                for key in super::spec::COUNTER_KEYS {
                    if let Some(b) = counter_bound(c, key) {
                        let x = counter(&v, key);
                        let (pass, text) =
                            bound_ok(b, i128::from(x), |n| self.same(n, key, Some(nc)))?;
                        ok &= pass;
                        want.push(format!("{key} {text}"));
                        seen.push(format!("{key} {x}"));
                    }
                }
                out.push((ok, format!("NC {nc}: {}", want.join(", ")), seen.join(", ")));
            }
            "device_stats" => {
                let ctl = self.control.as_ref().ok_or("simdev is not running")?;
                let v = ctl
                    .device_stats()
                    .map_err(|e| format!("reading device stats: {}", crate::error_chain(&e)))?;
                let (mut ok, mut want, mut seen) = (true, Vec::new(), Vec::new());
                for key in super::spec::STAT_KEYS {
                    if let Some(b) = counter_bound(c, key) {
                        let x = stat(&v, key);
                        let (pass, text) = bound_ok(b, i128::from(x), |n| self.same(n, key, None))?;
                        ok &= pass;
                        want.push(format!("{key} {text}"));
                        seen.push(format!("{key} {x}"));
                    }
                }
                out.push((ok, want.join(", "), seen.join(", ")));
            }
            "no_leaks" => {
                let ctl = self.control.as_ref().ok_or("simdev is not running")?;
                let v = ctl
                    .device_stats()
                    .map_err(|e| format!("reading device stats: {}", crate::error_chain(&e)))?;
                let base = self
                    .snapshots
                    .get("baseline")
                    .and_then(|s| s.stats)
                    .ok_or("no baseline device stats")?;
                let show = |s: &DeviceStats| {
                    format!(
                        "{} B in {} chunks, {} clients, {} NCs claimed, {} DMA queues",
                        s.memory_in_use, s.chunks, s.clients, s.claimed_ncs, s.dma_queues
                    )
                };
                let ok = v.memory_in_use == base.memory_in_use
                    && v.chunks == base.chunks
                    && v.clients == base.clients
                    && v.claimed_ncs == base.claimed_ncs
                    && v.dma_queues == base.dma_queues;
                out.push((
                    ok,
                    format!("nothing held beyond the baseline: {}", show(&base)),
                    show(&v),
                ));
            }
            "xu_health" => {
                let vnc = c.vnc.unwrap_or(0);
                let want = c.health.clone().unwrap_or_else(|| "healthy".into());
                let rt = self.rt.as_ref().ok_or("no runtime is open")?;
                let seen = match rt.xu(vnc).map(|x| x.health()) {
                    Some(XuHealth::Healthy) => "healthy",
                    Some(XuHealth::Shutdown) => "shutdown",
                    Some(XuHealth::FatalShutdown) => "fatal_shutdown",
                    None => "no such logical core",
                };
                out.push((
                    seen == want,
                    format!("logical core {vnc}'s XU is {want}"),
                    seen.to_string(),
                ));
            }
            "stale_notifications" => {
                let rt = self.rt.as_ref().ok_or("no runtime is open")?;
                let x = rt.stale_notifications();
                let b = c.count.as_ref().ok_or("needs count")?;
                let (pass, text) = bound_ok(b, i128::from(x), |_| {
                    Err("stale_notifications takes no snapshot names".into())
                })?;
                out.push((
                    pass,
                    format!("late notifications discarded: {text}"),
                    x.to_string(),
                ));
            }
            "sim_time" => {
                let rt = self.rt.as_ref().ok_or("no runtime is open")?;
                let nc = c.nc.ok_or("a sim_time check needs nc")?;
                let t = |nc: u32| -> Result<i128, String> {
                    rt.metrics()
                        .snapshot(usize::try_from(nc).unwrap_or(usize::MAX))
                        .map(|m| i128::from(m.nc.total_us) * 1000)
                        .ok_or_else(|| format!("no metrics for NC {nc}"))
                };
                let mut x = t(nc)?;
                let mut what = format!("simulated time of NC {nc}");
                if let Some(other) = c.minus_nc {
                    x -= t(other)?;
                    what = format!("{what} minus NC {other}'s");
                }
                let b = c.ns.as_ref().ok_or("a sim_time check needs ns")?;
                let (pass, text) =
                    bound_ok(b, x, |_| Err("sim_time takes no snapshot names".into()))?;
                out.push((pass, format!("{what}: {text} ns"), format!("{x} ns")));
            }
            "simdev" => {
                let running = self
                    .simdev
                    .as_ref()
                    .is_some_and(|s| process_running(s.pid()));
                let want = c.running.unwrap_or(true);
                out.push((
                    running == want,
                    if want {
                        "simdev is running"
                    } else {
                        "simdev has exited"
                    }
                    .into(),
                    if running { "running" } else { "exited" }.into(),
                ));
            }
            other => return Err(format!("unknown check {other:?}")),
        }
        Ok(out)
    }

    fn check(&mut self, at: &str, c: &Check) {
        let default_wait = if c.what == "no_leaks" { 3.0 } else { 0.0 };
        let wait = Duration::from_secs_f64(c.within_s.unwrap_or(default_wait).max(0.0));
        let deadline = Instant::now() + wait;
        loop {
            let r = self.eval(c);
            let done = match &r {
                Ok(v) => v.iter().all(|(p, _, _)| *p),
                Err(_) => false,
            };
            if done || Instant::now() >= deadline {
                match r {
                    Ok(v) => {
                        for (pass, want, seen) in v {
                            self.rec.record(pass, at, want, seen);
                        }
                    }
                    Err(e) => self.rec.fail(at, "the check can be made", e),
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn socket(&self) -> Option<PathBuf> {
        self.simdev.as_ref().map(|s| s.socket().to_owned())
    }

    fn log_path(&self, name: &str) -> Option<PathBuf> {
        self.simdev
            .as_ref()
            .map(|s| s.dir().join(format!("{name}.log")))
    }

    fn spawn_client(&mut self, at: &str, step: &Step) {
        let name = step.name.clone().unwrap_or_else(|| "client".into());
        let Some(socket) = self.socket() else {
            self.rec.fail(at, "simdev is running", "it is not");
            return;
        };
        let mut cmd = child_command(&self.exe);
        cmd.arg("scenario")
            .arg("client")
            .arg("--socket")
            .arg(&socket)
            .arg("--bytes")
            .arg(step.bytes.unwrap_or(4096).to_string())
            .arg("--exec-timeout")
            .arg(self.exec_timeout().to_string())
            .arg("--seed")
            .arg(self.sc.device.seed.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if let Some(v) = &step.visible_cores {
            cmd.arg("--visible-cores").arg(v.text());
        }
        if let Some(n) = step.count {
            cmd.arg("--count").arg(n.to_string());
        }
        match self
            .log_path(&name)
            .and_then(|p| std::fs::File::create(p).ok())
        {
            Some(f) => cmd.stderr(f),
            None => cmd.stderr(Stdio::null()),
        };
        let t0 = Instant::now();
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                self.rec.fail(at, "the client starts", e.to_string());
                return;
            }
        };
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut client = Client {
            child,
            lines: rx,
            seen: Vec::new(),
        };
        let first = client.lines.recv_timeout(Duration::from_secs(20));
        let took = t0.elapsed().as_secs_f64();
        let r: Result<(), NrtError> = match first {
            Ok(line) if line.starts_with("ready") => {
                client.seen.push(line);
                Ok(())
            }
            Ok(line) if line.starts_with("refused ") => {
                let v: serde_json::Value =
                    serde_json::from_str(&line["refused ".len()..]).unwrap_or_default();
                let status = v["status"]
                    .as_str()
                    .and_then(|s| super::spec::parse_status(s).ok())
                    .unwrap_or(NrtStatus::Failure);
                client.seen.push(line.clone());
                Err(NrtError::new(
                    status,
                    v["message"].as_str().unwrap_or(&line).to_string(),
                ))
            }
            Ok(line) => Err(NrtError::new(
                NrtStatus::Failure,
                format!("unexpected first line {line:?}"),
            )),
            Err(_) => Err(NrtError::new(
                NrtStatus::Failure,
                "the client printed nothing within 20 s (see its log beside simdev's)",
            )),
        };
        self.judge_simple(at, step, &r, took);
        if r.is_ok() {
            self.clients.insert(name, client);
        } else {
            // A refused client exits by itself; reap it (or stop it if it hangs).
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(client.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = client.child.kill();
            let _ = client.child.wait();
        }
    }

    fn end_client(&mut self, at: &str, step: &Step) {
        let name = step.name.clone().unwrap_or_else(|| "client".into());
        let Some(mut c) = self.clients.remove(&name) else {
            self.rec
                .fail(at, format!("client {name:?} exists"), "it does not");
            return;
        };
        let at = at.to_string();
        let kill = step.action == "kill_client";
        let sig = if kill {
            match parse_signal(step.signal.as_deref()) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.rec.fail(&at, "a valid signal", e);
                    return;
                }
            }
        } else {
            None
        };
        if let Some(sig) = sig
            && let Err(e) = nix::sys::signal::kill(pid_of(&c.child), sig)
        {
            self.rec.fail(&at, "the client is signalled", e.to_string());
        }
        let t0 = Instant::now();
        let wait = Duration::from_secs_f64(step.within_s.unwrap_or(5.0).max(0.0));
        let status = loop {
            match c.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if t0.elapsed() < wait => std::thread::sleep(Duration::from_millis(5)),
                _ => break None,
            }
        };
        let took = t0.elapsed().as_secs_f64();
        let Some(status) = status else {
            let _ = c.child.kill();
            let _ = c.child.wait();
            self.rec.fail(
                &at,
                format!("the client exits within {}", secs(wait.as_secs_f64())),
                "it did not (killed it)",
            );
            return;
        };
        while let Ok(line) = c.lines.recv_timeout(Duration::from_millis(500)) {
            c.seen.push(line);
        }
        let done: Option<serde_json::Value> = c
            .seen
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("done "))
            .and_then(|j| serde_json::from_str(j).ok());
        let want = step.expect_exit.clone().unwrap_or_else(|| {
            if sig == Some(Signal::SIGKILL) {
                "killed".into()
            } else {
                "clean".into()
            }
        });
        let seen = match (status.code(), status.signal()) {
            (Some(0), _) if done.is_some() => "clean (closed, exit 0)".to_string(),
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(s)) => format!(
                "killed by {}",
                Signal::try_from(s).map_or_else(|_| s.to_string(), |x| x.as_str().to_string())
            ),
            _ => "unknown".into(),
        };
        let ok = match want.as_str() {
            "clean" => status.code() == Some(0) && done.is_some(),
            "killed" => status.signal() == sig.map(|s| s as i32),
            _ => false,
        };
        self.rec.record(
            ok,
            &at,
            format!(
                "the client exits {want} within {}",
                secs(wait.as_secs_f64())
            ),
            format!("{seen} after {}", secs(took)),
        );
        if let Some(d) = &done {
            let failures = d["failures"].as_u64().unwrap_or(u64::MAX);
            self.rec.record(
                failures == 0,
                &at,
                "every client execution succeeded with the right output",
                format!(
                    "{} executions, {failures} failures{}",
                    d["executions"].as_u64().unwrap_or(0),
                    d["first_failure"]
                        .as_str()
                        .map(|s| format!(" (first: {s})"))
                        .unwrap_or_default()
                ),
            );
        }
        if let Some(min) = step.min_executions {
            let n = done
                .as_ref()
                .and_then(|d| d["executions"].as_u64())
                .or_else(|| {
                    // A killed client reports progress lines.
                    c.seen
                        .iter()
                        .rev()
                        .find_map(|l| l.strip_prefix("progress "))
                        .and_then(|v| v.trim().parse().ok())
                });
            self.rec.record(
                n.is_some_and(|n| n >= min),
                &at,
                format!("the client ran at least {min} executions"),
                n.map_or("unknown".to_string(), |n| format!("{n}")),
            );
        }
    }

    fn lifecycle(&mut self, at: &str, step: &Step) {
        let Some(socket) = self.socket() else {
            self.rec.fail(at, "simdev is running", "it is not");
            return;
        };
        let mut cmd = child_command(&self.exe);
        cmd.arg("scenario")
            .arg("client")
            .arg("--lifecycle")
            .arg("--socket")
            .arg(&socket)
            .env("NEURON_RT_BACKEND", "sim")
            .env("NEURON_SIMDEV_SOCKET", &socket)
            .env("NEURON_RT_EXEC_TIMEOUT", self.exec_timeout().to_string())
            .env_remove("NEURON_RT_VISIBLE_CORES")
            .env_remove("NEURON_RT_NUM_CORES")
            .env_remove("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS")
            .env_remove("NEURON_LOGICAL_NC_CONFIG")
            .env_remove("NEURON_RT_FUNTIME")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        match self
            .log_path("lifecycle")
            .and_then(|p| std::fs::File::create(p).ok())
        {
            Some(f) => cmd.stderr(f),
            None => cmd.stderr(Stdio::null()),
        };
        let t0 = Instant::now();
        let out = match cmd.output() {
            Ok(o) => o,
            Err(e) => {
                self.rec
                    .fail(at, "the lifecycle client runs", e.to_string());
                return;
            }
        };
        let took = t0.elapsed().as_secs_f64();
        let text = String::from_utf8_lossy(&out.stdout);
        let codes: BTreeMap<String, String> = text
            .lines()
            .find_map(|l| l.strip_prefix("lifecycle "))
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default();
        self.rec.record(
            out.status.success() && !codes.is_empty(),
            at,
            "the lifecycle client runs to the end and exits 0",
            format!("{} after {}", out.status, secs(took)),
        );
        for (op, want) in step.expect_codes.clone().unwrap_or_default() {
            let want = match want.status() {
                Ok(s) => s,
                Err(e) => {
                    self.rec.fail(at, format!("a valid status for {op}"), e);
                    continue;
                }
            };
            let seen = codes.get(&op).cloned().unwrap_or_else(|| "not run".into());
            self.rec.record(
                seen.split(':').next() == Some(want.name()),
                at,
                format!("{op} returns {}", want.name()),
                seen,
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                took <= max,
                at,
                format!("the lifecycle takes at most {}", secs(max)),
                secs(took),
            );
        }
    }

    fn cycles(&mut self, at: &str, step: &Step) {
        let Some(rt) = self.runtime(at) else { return };
        let Some((_, m)) = self.defined_model(at, step) else {
            return;
        };
        let count = step.count.unwrap_or(1000);
        let warmup = step.warmup.unwrap_or(50).min(count);
        let vnc = step.vnc.unwrap_or(0);
        let exec = step.execute_each.unwrap_or(false);
        let p = ExecParams {
            count: 1,
            threads: 1,
            asynchronous: false,
            host: false,
            tensors_vnc: u32::try_from(vnc.max(0)).unwrap_or(0),
            check: true,
            inflight: 1,
            seed: self.sc.device.seed,
        };
        let s = if exec {
            match slot(&rt, &m, &p) {
                Ok(s) => Some(s),
                Err(e) => {
                    self.rec.fail(at, "the tensors are allocated", e);
                    return;
                }
            }
        } else {
            None
        };
        let t0 = Instant::now();
        let (mut ok, mut first_err) = (0u64, None::<String>);
        let mut rss_base = rss_kib();
        let snap_name = step.name.clone().unwrap_or_else(|| "warmup".into());
        let mut warm = None;
        for i in 0..count {
            if i == warmup {
                rss_base = rss_kib();
                warm = Some(self.snapshot());
            }
            let r = rt.load(&m.container, vnc).and_then(|h| {
                let run = match &s {
                    Some(s) => {
                        let input = prepare(&m, &p, s, i)
                            .map_err(|e| NrtError::new(NrtStatus::Failure, e))?;
                        let r = rt.execute(h, &s.ins, &s.outs);
                        match (r, verify(&m, &p, s, i, NrtStatus::Success, &input)) {
                            (Err(e), _) => Err(e),
                            (Ok(()), Some(Err(e))) => Err(NrtError::new(NrtStatus::Failure, e)),
                            (Ok(()), _) => Ok(()),
                        }
                    }
                    None => Ok(()),
                };
                let u = rt.unload(h);
                run.and(u)
            });
            match r {
                Ok(()) => ok += 1,
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(format!("cycle {i}: {e}"));
                    }
                }
            }
        }
        drop(s);
        let took = t0.elapsed().as_secs_f64();
        let warm = warm.unwrap_or_else(|| self.snapshot());
        self.snapshots.insert(snap_name, warm);
        let rss_end = rss_kib();
        self.rec.record(
            ok == count,
            at,
            format!(
                "{count} load{} / unload cycles succeed",
                if exec { " / execute" } else { "" }
            ),
            format!(
                "{ok} succeeded in {}{}",
                secs(took),
                first_err.map(|e| format!("; {e}")).unwrap_or_default()
            ),
        );
        if let Some(max) = step.max_rss_growth_kib {
            let grew = rss_end.saturating_sub(rss_base);
            self.rec.record(
                grew <= max,
                at,
                format!("resident memory grows at most {max} KiB after {warmup} warm-up cycles"),
                format!("{rss_base} KiB -> {rss_end} KiB (+{grew} KiB)"),
            );
        }
        if let Some(max) = step.max_step_s {
            self.rec.record(
                took <= max,
                at,
                format!("the step takes at most {}", secs(max)),
                format!("took {}", secs(took)),
            );
        }
    }
}

/// A short description of a step for report lines: `execute(m ×64, 8 threads)`.
fn describe(s: &Step) -> String {
    let mut parts = Vec::new();
    if let Some(m) = &s.model {
        parts.push(m.clone());
    }
    if let Some(n) = &s.name {
        parts.push(n.clone());
    }
    if let Some(c) = s.count
        && s.action != "spawn_client"
    {
        parts.push(format!("×{c}"));
    }
    if let Some(t) = s.threads.filter(|t| *t > 1) {
        parts.push(format!("{t} threads"));
    }
    if s.mode.as_deref() == Some("async") {
        parts.push("async".into());
    }
    if let Some(k) = &s.kind {
        parts.push(k.clone());
    }
    if let Some(ms) = s.ms {
        parts.push(format!("{ms} ms"));
    }
    if let Some(sig) = &s.signal {
        parts.push(sig.clone());
    }
    if parts.is_empty() {
        s.action.clone()
    } else {
        format!("{}({})", s.action, parts.join(", "))
    }
}
