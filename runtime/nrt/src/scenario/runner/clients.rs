//! Client processes: this program re-executed as `nrt scenario client` on the scenario's
//! simdev (`spawn_client`, `kill_client`, `wait_client`) and the one-shot lifecycle client
//! (`lifecycle`).
//!
//! A client prints one line per event on stdout (`ready`, `refused {json}`, `progress N`,
//! `done {json}`, `lifecycle {json}`); a reader thread forwards them to the runner. Its stderr
//! goes to a log file beside simdev's. Every child gets `PR_SET_PDEATHSIG`, so none outlives
//! the runner.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use runtime::NrtError;
use shared::NrtStatus;

use super::{Runner, secs};
use crate::scenario::spec::{
    ExitKind, LifecycleStep, SpawnClientStep, WaitClientStep, parse_status,
};

/// A client process.
#[derive(Debug)]
pub(super) struct Client {
    /// The process.
    pub(super) child: Child,
    /// Its stdout lines, as they come.
    lines: mpsc::Receiver<String>,
    /// The lines read so far.
    seen: Vec<String>,
    /// Its stderr ([`stderr_file`]).
    log: Option<std::fs::File>,
}

/// Sends `cmd`'s stderr to a file and returns the runner's handle to read it back: unlinked
/// from the start, so nothing is left behind however the runner ends (a file beside simdev's
/// socket would keep its private directory from being removed when the runner is killed).
/// Without one, stderr goes nowhere.
fn stderr_to_file(cmd: &mut Command) -> Option<std::fs::File> {
    let file = tempfile::tempfile().ok();
    match file.as_ref().and_then(|f| f.try_clone().ok()) {
        Some(child) => {
            cmd.stderr(Stdio::from(child));
            file
        }
        None => {
            cmd.stderr(Stdio::null());
            None
        }
    }
}

/// The last lines a child wrote to its stderr (at most 2 KiB), for a failure's message; empty
/// when it wrote nothing.
fn stderr_tail(log: Option<&std::fs::File>) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Some(mut f) = log else {
        return String::new();
    };
    let len = f.seek(SeekFrom::End(0)).unwrap_or(0);
    let start = len.saturating_sub(2048);
    let mut text = String::new();
    if f.seek(SeekFrom::Start(start)).is_err() || f.read_to_string(&mut text).is_err() {
        return String::new();
    }
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends: {}", text.replace('\n', " | "))
    }
}

/// The process id, for signals.
fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

/// A command for re-executing this program as a child that dies with us.
pub fn child_command(exe: &Path) -> Command {
    let mut cmd = Command::new(exe);
    shared::child::kill_with_parent(&mut cmd);
    cmd
}

impl Runner<'_> {
    /// simdev's socket, while it runs.
    fn socket(&self) -> Option<PathBuf> {
        self.simdev.as_ref().map(|s| s.socket().to_owned())
    }

    /// `spawn_client`: starts a client and judges its first line (`ready` or `refused`) as
    /// the init call's status.
    pub(super) fn spawn_client(&mut self, at: &str, step: &SpawnClientStep) {
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
        if let Some(n) = step.num_cores {
            cmd.arg("--num-cores").arg(n.to_string());
        }
        if let Some(n) = step.count {
            cmd.arg("--count").arg(n.to_string());
        }
        if let Some(lnc) = self.sc.runtime.lnc {
            cmd.arg("--lnc").arg(lnc.to_string());
        }
        let log = stderr_to_file(&mut cmd);
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
            log,
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
                    .and_then(|s| parse_status(s).ok())
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
        self.judge_call(at, step.call_expect(), &r, took);
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

    /// `kill_client` (`sig`: the signal sent first) and `wait_client` (`sig` none): waits for
    /// the exit and judges how it ended, the client's own verdict and its execution count.
    pub(super) fn end_client(&mut self, at: &str, step: &WaitClientStep, sig: Option<Signal>) {
        let name = step.name.clone().unwrap_or_else(|| "client".into());
        let Some(mut c) = self.clients.remove(&name) else {
            self.rec
                .fail(at, format!("client {name:?} exists"), "it does not");
            return;
        };
        let at = at.to_string();
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
        let want = step.expect_exit.unwrap_or(if sig == Some(Signal::SIGKILL) {
            ExitKind::Killed
        } else {
            ExitKind::Clean
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
        let ok = match want {
            ExitKind::Clean => status.code() == Some(0) && done.is_some(),
            ExitKind::Killed => status.signal() == sig.map(|s| s as i32),
        };
        let seen = if ok {
            seen
        } else {
            format!("{seen}{}", stderr_tail(c.log.as_ref()))
        };
        self.rec.record(
            ok,
            &at,
            format!(
                "the client exits {} within {}",
                want.name(),
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

    /// `lifecycle`: runs the lifecycle client to its end and judges each call's status.
    pub(super) fn lifecycle(&mut self, at: &str, step: &LifecycleStep) {
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
        let log = stderr_to_file(&mut cmd);
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
        let ran = out.status.success() && !codes.is_empty();
        self.rec.record(
            ran,
            at,
            "the lifecycle client runs to the end and exits 0",
            format!(
                "{} after {}{}",
                out.status,
                secs(took),
                if ran {
                    String::new()
                } else {
                    stderr_tail(log.as_ref())
                }
            ),
        );
        let named = step.expect_codes.clone().unwrap_or_default();
        // Unless the file says otherwise, the lifecycle must have run: its init and its
        // execute succeed (an NC held by the scenario's own runtime would fail both).
        let defaults: Vec<_> = ["init", "execute"]
            .into_iter()
            .filter(|op| !named.contains_key(*op))
            .map(|op| (op.to_string(), Ok(NrtStatus::Success)))
            .collect();
        let wanted: Vec<_> = named
            .into_iter()
            .map(|(op, want)| {
                let s = want.status();
                (op, s)
            })
            .chain(defaults)
            .collect();
        for (op, want) in wanted {
            let want = match want {
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
}
