//! The scenario's private simdev and the runner's control connection to it: start (with the
//! latency model and the `baseline` snapshot), signal and reap, restart, faults and latency.
//!
//! The control connection counts as one simdev client and holds nothing; it is dropped before
//! simdev is killed, so a dead simdev is never asked for anything.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use runtime::backend::sim::{PrivateSimdev, SimDevice, SimdevCommand};

use super::Runner;
use crate::scenario::spec::{FaultEntry, SetLatencyStep};

/// Whether process `pid` runs (exists and is not a zombie).
pub(super) fn process_running(pid: u32) -> bool {
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

/// `binding` with its relative paths made relative to `dir` (the scenario file's directory);
/// a binding that does not parse is passed as it is, for simdev to refuse by name.
fn resolve_binding(binding: &str, dir: &std::path::Path) -> String {
    use simdev::reference::{BindingSpec, Target};
    let Ok(spec) = BindingSpec::parse(binding) else {
        return binding.to_owned();
    };
    let neff = dir.join(&spec.neff);
    match spec.target {
        Target::Python { module, function } => format!(
            "{}={}:{function}",
            neff.display(),
            dir.join(module).display()
        ),
        Target::Golden(file) => format!("{}={}", neff.display(), dir.join(file).display()),
    }
}

impl Runner<'_> {
    /// simdev's command line from `[device]`.
    fn simdev_args(&self) -> Vec<std::ffi::OsString> {
        let d = &self.sc.device;
        let mut v: Vec<std::ffi::OsString> = vec![
            "--arch".into(),
            d.arch.name().into(),
            "--hbm".into(),
            d.hbm.clone().into(),
        ];
        if let Some(n) = d.ncs {
            v.push("--ncs".into());
            v.push(n.to_string().into());
        }
        for r in &d.references {
            v.push("--reference".into());
            v.push(resolve_binding(r, &self.dir).into());
        }
        v
    }

    /// Starts simdev, connects the control connection, sets the latency model, takes the
    /// baseline snapshot.
    pub(super) fn start_simdev(&mut self) -> Result<(), String> {
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

    /// Arms a fault (`[[faults]]` or a `fault` step).
    pub(super) fn arm(&self, f: &FaultEntry) -> Result<(), String> {
        let spec = f.spec(self.sc.device.seed)?;
        let c = self
            .control
            .as_ref()
            .ok_or("simdev is not running, nothing to arm")?;
        c.inject_fault(spec).map_err(|e| crate::error_chain(&e))
    }

    /// `clear_faults`.
    pub(super) fn clear_faults(&mut self, at: &str) {
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

    /// `set_latency`.
    pub(super) fn set_latency(&mut self, at: &str, step: &SetLatencyStep) {
        let l = step.latency.unwrap_or_default();
        let r = self
            .control
            .as_ref()
            .map(|c| c.set_latency(l.model()).map_err(|e| crate::error_chain(&e)));
        match r {
            Some(Ok(())) => {
                // simdev's clocks start again at 0: so do the sim_time checks.
                self.sim_time_base = self.rt.as_ref().map(|rt| {
                    let base = (0..simdev::config::MAX_NCS as usize)
                        .filter_map(|nc| {
                            let t = rt.metrics().snapshot(nc)?.nc.total_us;
                            Some((u32::try_from(nc).ok()?, i128::from(t) * 1000))
                        })
                        .collect();
                    (rt.clone(), base)
                });
            }
            Some(Err(e)) => self.rec.fail(at, "the latency model is set", e),
            None => self
                .rec
                .fail(at, "the latency model is set", "simdev is not running"),
        }
    }

    /// `kill_simdev` (and the first half of `restart_simdev`): drops the control connection,
    /// signals simdev, waits up to 5 s for it to exit and reaps it.
    pub(super) fn kill_simdev(&mut self, at: &str, sig: Signal) {
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

    /// `restart_simdev`: kills simdev if it runs, starts a new one (new baseline).
    pub(super) fn restart_simdev(&mut self, at: &str) {
        if self.simdev.is_some() {
            self.kill_simdev(at, Signal::SIGKILL);
        }
        if let Err(e) = self.start_simdev() {
            self.rec.fail(at, "simdev restarts", e);
        }
    }
}
