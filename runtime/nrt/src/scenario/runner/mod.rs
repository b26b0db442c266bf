//! Runs one scenario: a private simdev, a control connection to it, the runtime, the steps and
//! the checks.
//!
//! [`Runner`] holds the scenario's state and drives it ([`Runner::run`]); each step kind is a
//! method in the module named after what it does:
//!
//! | module | what |
//! |---|---|
//! | [`simdev`] | the private simdev and the control connection: start, kill, restart, faults, latency |
//! | [`execution`] | `execute` and `join`: threads, tensor slots, sync and async executions |
//! | [`expectations`] | judging a call or an `execute` step against its status and timing expectations |
//! | [`checks`] | `[[expect]]` and `check` steps; snapshots and bounds |
//! | [`clients`] | client processes: `spawn_client`, `kill_client`, `wait_client`, `lifecycle` |
//! | [`cycles`] | `cycles`: load / unload (/ execute) loops and the RSS bound |
//!
//! This module keeps the driver and the runtime's own calls (`init`, `load`, `unload`, `close`).
//! Every outcome goes to [`Recorder`]; a step that cannot run records a failure and the scenario
//! goes on.

mod checks;
mod clients;
mod cycles;
mod execution;
mod expectations;
mod simdev;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use runtime::backend::sim::{PrivateSimdev, SimDevice};
use runtime::config::{RuntimeConfig, parse_visible_cores};
use runtime::{Device, ModelHandle, NrtError, Runtime};
use shared::NrtStatus;

use super::models::BuiltModel;
use super::report::Recorder;
use super::spec::{Action, CloseStep, Cores, InitStep, LoadStep, Scenario, Step, UnloadStep};
use checks::Snapshot;
use clients::Client;
use execution::Background;

/// A model loaded under a handle name.
#[derive(Debug, Clone)]
struct Loaded {
    handle: ModelHandle,
    model: Arc<BuiltModel>,
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
    /// Further runtimes (`init` with `as`), each on its own connection, by name.
    others: BTreeMap<String, Arc<Runtime>>,
    models: BTreeMap<String, Arc<BuiltModel>>,
    handles: BTreeMap<String, Loaded>,
    snapshots: BTreeMap<String, Snapshot>,
    background: BTreeMap<String, Background>,
    clients: BTreeMap<String, Client>,
    /// Each NC's simulated time (ns) in the runtime's metrics at the last `set_latency`, which
    /// resets simdev's clocks: `sim_time` checks count from it. Kept with the runtime it was
    /// read from (a later runtime's metrics start at 0).
    sim_time_base: Option<(Arc<Runtime>, BTreeMap<u32, i128>)>,
    /// The implicit async pool's completion statuses, registered on the scenario's runtime.
    jobs: Arc<execution::JobStatuses>,
}

/// A call's status (NRT_SUCCESS for `Ok`).
fn status_of(r: &Result<(), NrtError>) -> NrtStatus {
    r.as_ref().err().map_or(NrtStatus::Success, |e| e.status)
}

/// Seconds as report lines show them (`0.123 s`).
fn secs(d: f64) -> String {
    format!("{d:.3} s")
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
            sim_time_base: None,
            others: BTreeMap::new(),
            models: BTreeMap::new(),
            handles: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            background: BTreeMap::new(),
            clients: BTreeMap::new(),
            jobs: Arc::default(),
        }
    }

    /// `[runtime] exec_timeout`, seconds.
    fn exec_timeout(&self) -> f64 {
        self.sc.runtime.exec_timeout
    }

    /// The runtime's configuration from `[runtime]` (never from the environment, but for
    /// where its counters are published: `NEURON_RT_DATASTORE` and `NEURON_RT_DATASTORE_DIR`,
    /// which change no behaviour), with an `init` step's `visible_cores` instead of
    /// `[runtime]`'s if given.
    fn config(&self, visible: Option<&Cores>) -> Result<RuntimeConfig, String> {
        let r = &self.sc.runtime;
        let (datastore, datastore_dir) =
            RuntimeConfig::datastore_from_lookup(|k| std::env::var(k).ok())
                .map_err(|e| e.to_string())?;
        if !(r.exec_timeout > 0.0 && r.exec_timeout.is_finite()) {
            return Err(format!(
                "[runtime] exec_timeout = {}: must be a positive number of seconds",
                r.exec_timeout
            ));
        }
        let visible_cores = visible
            .or(r.visible_cores.as_ref())
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
            datastore,
            datastore_dir,
            ..RuntimeConfig::default()
        })
    }

    /// Opens the scenario's runtime on its own connection to simdev.
    fn init_runtime(&mut self) -> Result<(), NrtError> {
        let rt = self.open_runtime(None)?;
        self.adopt(rt)
    }

    /// Makes `rt` the scenario's runtime; under the implicit async pool, with the completion
    /// callback that reports each execution's status to the `execute` steps.
    fn adopt(&mut self, rt: Runtime) -> Result<(), NrtError> {
        if rt.implicit_async() {
            rt.register_async_exec_callback(self.jobs.callback())?;
        }
        self.rt = Some(Arc::new(rt));
        Ok(())
    }

    /// A new runtime on its own connection to simdev.
    fn open_runtime(&self, visible: Option<&Cores>) -> Result<Runtime, NrtError> {
        let config = self
            .config(visible)
            .map_err(|m| NrtError::new(NrtStatus::Invalid, m))?;
        let socket = self
            .simdev
            .as_ref()
            .map(|s| s.socket().to_owned())
            .ok_or_else(|| NrtError::new(NrtStatus::HwError, "simdev is not running"))?;
        let dev = SimDevice::connect(&socket)?;
        Runtime::init(Arc::new(dev) as Arc<dyn Device>, config)
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
        let sc = self.sc;
        for (i, step) in sc.steps.iter().enumerate() {
            let at = match &step.label {
                Some(l) => format!("step {} {l}", i + 1),
                None => format!("step {} {}", i + 1, step.action.describe()),
            };
            let failures = self.failures();
            self.step(i + 1, &at, step);
            self.pass_on_device_log(&at, failures);
        }
        for (i, c) in sc.expect.iter().enumerate() {
            let failures = self.failures();
            let at = format!("expect {} {}", i + 1, c.what());
            self.check(&at, c);
            self.pass_on_device_log(&at, failures);
        }
        self.cleanup();
    }

    /// Failed expectations so far.
    fn failures(&self) -> usize {
        self.rec.outcomes.iter().filter(|o| !o.pass).count()
    }

    /// What simdev logged at warn or error level during `at` (a reference's exception, a DMA
    /// abort's reason), written to stderr when `at` failed an expectation (`before`: the
    /// failures before it) — the log file goes with simdev's private directory. The PASS/FAIL
    /// lines on stdout are unchanged.
    fn pass_on_device_log(&mut self, at: &str, before: usize) {
        let Some(sim) = &self.simdev else { return };
        let lines = sim.take_log();
        if self.failures() > before {
            for l in lines {
                eprintln!("{} {at}: simdev: {l}", self.rec.scenario());
            }
        }
    }

    /// Kills remaining clients, joins (and fails) unjoined background steps, closes the
    /// runtime, stops simdev.
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
        for (_, rt) in std::mem::take(&mut self.others) {
            if let Ok(rt) = Arc::try_unwrap(rt) {
                rt.close();
            }
        }
        if let Some(rt) = self.rt.take()
            && let Ok(rt) = Arc::try_unwrap(rt)
        {
            rt.close();
        }
        self.control = None;
        self.simdev = None;
    }

    /// The open runtime, or a failed expectation saying there is none.
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

    /// The `[models]` entry a step names, or a failed expectation saying it is not defined.
    fn defined_model(
        &mut self,
        at: &str,
        model: Option<&str>,
    ) -> Option<(String, Arc<BuiltModel>)> {
        let name = model.unwrap_or_default().to_string();
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

    /// Runs one step.
    fn step(&mut self, n: usize, at: &str, step: &Step) {
        match &step.action {
            Action::Init(s) if s.runtime_as.is_some() => self.init_other(at, s),
            Action::Init(s) => {
                if self.rt.is_some() {
                    self.rec
                        .fail(at, "no runtime is open", "one is: close it first");
                    return;
                }
                let t0 = Instant::now();
                let r = self
                    .open_runtime(s.visible_cores.as_ref())
                    .and_then(|rt| self.adopt(rt));
                self.judge_call(at, s.call_expect(), &r, t0.elapsed().as_secs_f64());
            }
            Action::Load(s) => self.load(at, s),
            Action::Unload(s) => self.unload(at, s),
            Action::Execute(s) => self.execute(n, at, s),
            Action::Join(s) => self.join(at, s),
            Action::Close(s) => self.close(at, s),
            Action::Sleep(s) => std::thread::sleep(Duration::from_millis(s.ms.unwrap_or(0))),
            Action::Fault(f) => {
                if let Err(e) = self.arm(f) {
                    self.rec.fail(at, "the fault is armed", e);
                }
            }
            Action::ClearFaults(_) => self.clear_faults(at),
            Action::SetLatency(s) => self.set_latency(at, s),
            Action::Snapshot(s) => {
                let snap = self.snapshot();
                self.snapshots
                    .insert(s.name.clone().unwrap_or_default(), snap);
            }
            Action::Check(s) => {
                for (j, c) in s.check.iter().enumerate() {
                    self.check(&format!("{at} [{}: {}]", j + 1, c.what()), c);
                }
            }
            Action::SpawnClient(s) => self.spawn_client(at, s),
            Action::KillClient(s) => {
                let sig = s.signal.as_ref().map_or(Signal::SIGKILL, |g| g.signal);
                self.end_client(at, &s.end(), Some(sig));
            }
            Action::WaitClient(s) => self.end_client(at, s, None),
            Action::KillSimdev(s) => {
                let sig = s.signal.as_ref().map_or(Signal::SIGKILL, |g| g.signal);
                self.kill_simdev(at, sig);
            }
            Action::RestartSimdev(_) => self.restart_simdev(at),
            Action::Lifecycle(s) => self.lifecycle(at, s),
            Action::Cycles(s) => self.cycles(at, s),
            Action::TensorOp(s) => self.tensor_op(at, s),
        }
    }

    /// `load`.
    fn load(&mut self, at: &str, step: &LoadStep) {
        let Some(rt) = self.runtime(at) else { return };
        let Some((name, m)) = self.defined_model(at, step.model.as_deref()) else {
            return;
        };
        let t0 = Instant::now();
        let r = rt.load(&m.container, step.vnc.unwrap_or(0));
        let took = t0.elapsed().as_secs_f64();
        let unit = r.as_ref().map(|_| ()).map_err(Clone::clone);
        self.judge_call(at, step.call_expect(), &unit, took);
        if let Ok(handle) = r {
            let key = step.handle_as.clone().unwrap_or(name);
            self.handles.insert(key, Loaded { handle, model: m });
        }
    }

    /// `unload`.
    fn unload(&mut self, at: &str, step: &UnloadStep) {
        let Some(rt) = self.runtime(at) else { return };
        let name = step.model.clone().unwrap_or_default();
        let Some(l) = self.handles.remove(&name) else {
            self.rec
                .fail(at, format!("model {name:?} is loaded"), "it is not");
            return;
        };
        let t0 = Instant::now();
        let r = rt.unload(l.handle);
        self.judge_call(at, step.call_expect(), &r, t0.elapsed().as_secs_f64());
    }

    /// `init` with `as`: a further runtime under that name.
    fn init_other(&mut self, at: &str, step: &InitStep) {
        let name = step.runtime_as.clone().unwrap_or_default();
        if self.others.contains_key(&name) {
            self.rec.fail(
                at,
                format!("no runtime named {name:?} is open"),
                "one is: close it first",
            );
            return;
        }
        let t0 = Instant::now();
        let r = self.open_runtime(step.visible_cores.as_ref());
        let took = t0.elapsed().as_secs_f64();
        let unit = r.as_ref().map(|_| ()).map_err(Clone::clone);
        self.judge_call(at, step.call_expect(), &unit, took);
        if let Ok(rt) = r {
            self.others.insert(name, Arc::new(rt));
        }
    }

    /// A runtime opened by `init` with `as`, or a failed expectation saying there is none.
    fn other_runtime(&mut self, at: &str, name: &str) -> Option<Arc<Runtime>> {
        let rt = self.others.get(name).cloned();
        if rt.is_none() {
            self.rec.fail(
                at,
                format!("a runtime named {name:?} is open"),
                "there is none (no init step with this `as`, or closed)",
            );
        }
        rt
    }

    /// `close`: only when no background step still holds the runtime.
    fn close(&mut self, at: &str, step: &CloseStep) {
        let named = step.runtime.as_ref();
        let rt = match named {
            Some(n) => self.others.remove(n),
            None => self.rt.take(),
        };
        let Some(rt) = rt else {
            let what = named.map_or("a runtime is open".into(), |n| {
                format!("a runtime named {n:?} is open")
            });
            self.rec.fail(at, what, "there is none");
            return;
        };
        match Arc::try_unwrap(rt) {
            Ok(rt) => {
                if named.is_none() {
                    self.handles.clear();
                }
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
                match named {
                    Some(n) => {
                        self.others.insert(n.clone(), rt);
                    }
                    None => self.rt = Some(rt),
                }
                self.rec.fail(
                    at,
                    "no background step still uses the runtime",
                    "one does: join it first",
                );
            }
        }
    }
}
