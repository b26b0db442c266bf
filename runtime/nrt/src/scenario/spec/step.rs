//! `[[steps]]`: one serde enum, tagged by `action`, one struct per action.
//!
//! Every action's struct has `deny_unknown_fields`, so a key that does not apply to the action
//! (or is misspelt) is refused while the file is parsed. `label` applies to every step and is
//! taken off the table before the action is read ([`Step`]); the list deserializer
//! ([`super::named_list`]) puts the step's index and action in front of the error.

use std::collections::BTreeMap;

use nix::sys::signal::Signal;
use serde::Deserialize;

use super::check::Check;
use super::{Cores, FaultEntry, LatencySpec, StatusList, StatusSel};

/// One `[[steps]]` entry.
#[derive(Clone, Debug)]
pub struct Step {
    /// A name shown in reports instead of the generated description.
    pub label: Option<String>,
    /// What the step does, with its keys.
    pub action: Action,
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(d)?;
        let label = match table.remove("label") {
            None => None,
            Some(toml::Value::String(s)) => Some(s),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "`label` must be a string, not {}",
                    other.type_str()
                )));
            }
        };
        let action = Action::deserialize(toml::Value::Table(table))
            .map_err(|e| D::Error::custom(e.message()))?;
        Ok(Self { label, action })
    }
}

/// What a step does (`action = "..."`) and the keys that apply to it.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// A new runtime (`[runtime]` config) on the current simdev.
    Init(InitStep),
    /// Load a `[models]` entry under a handle name.
    Load(LoadStep),
    /// Unload a handle.
    Unload(UnloadStep),
    /// Run executions of a loaded handle (boxed: by far the largest step).
    Execute(Box<ExecuteStep>),
    /// Wait for a background `execute` and judge it.
    Join(JoinStep),
    /// Close the runtime.
    Close(CloseStep),
    /// Sleep.
    Sleep(SleepStep),
    /// Arm a fault now (the keys of `[[faults]]`).
    Fault(FaultEntry),
    /// Disarm every fault not yet fired.
    ClearFaults(NoKeys),
    /// A new latency model.
    SetLatency(SetLatencyStep),
    /// Record device stats and NC counters under a name.
    Snapshot(SnapshotStep),
    /// Run checks now.
    Check(CheckStep),
    /// Start a client process.
    SpawnClient(SpawnClientStep),
    /// Signal a client process and judge its exit.
    KillClient(KillClientStep),
    /// Wait for a client process to finish and judge its exit.
    WaitClient(WaitClientStep),
    /// Signal simdev and reap it.
    KillSimdev(KillSimdevStep),
    /// Kill simdev if it runs and start a new one.
    RestartSimdev(NoKeys),
    /// Drive the process-global facade in a client process of its own.
    Lifecycle(LifecycleStep),
    /// Load / unload (/ execute) cycles.
    Cycles(CyclesStep),
    /// A tensor operation through the explicit async API (`nrta_tensor_write`/`read`/`copy`).
    TensorOp(TensorOpStep),
}

impl Action {
    /// The `action` value, as written in the file.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Init(_) => "init",
            Self::Load(_) => "load",
            Self::Unload(_) => "unload",
            Self::Execute(_) => "execute",
            Self::Join(_) => "join",
            Self::Close(_) => "close",
            Self::Sleep(_) => "sleep",
            Self::Fault(_) => "fault",
            Self::ClearFaults(_) => "clear_faults",
            Self::SetLatency(_) => "set_latency",
            Self::Snapshot(_) => "snapshot",
            Self::Check(_) => "check",
            Self::SpawnClient(_) => "spawn_client",
            Self::KillClient(_) => "kill_client",
            Self::WaitClient(_) => "wait_client",
            Self::KillSimdev(_) => "kill_simdev",
            Self::RestartSimdev(_) => "restart_simdev",
            Self::Lifecycle(_) => "lifecycle",
            Self::Cycles(_) => "cycles",
            Self::TensorOp(_) => "tensor_op",
        }
    }

    /// A short description for report lines: the action and its main keys,
    /// `execute(m, ×64, 8 threads, async)`.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        match self {
            Self::Load(s) => parts.extend(s.model.clone()),
            Self::Unload(s) => parts.extend(s.model.clone()),
            Self::Execute(s) => {
                parts.extend(s.model.clone());
                parts.extend(s.count.map(|c| format!("×{c}")));
                parts.extend(s.threads.filter(|t| *t > 1).map(|t| format!("{t} threads")));
                if s.mode == ExecMode::Async {
                    parts.push("async".into());
                }
            }
            Self::Init(s) => parts.extend(s.runtime_as.clone()),
            Self::Close(s) => parts.extend(s.runtime.clone()),
            Self::Join(s) => parts.extend(s.name.clone()),
            Self::Sleep(s) => parts.extend(s.ms.map(|ms| format!("{ms} ms"))),
            Self::Fault(f) => parts.push(f.kind.clone()),
            Self::Snapshot(s) => parts.extend(s.name.clone()),
            Self::SpawnClient(s) => parts.extend(s.name.clone()),
            Self::KillClient(s) => {
                parts.extend(s.name.clone());
                parts.extend(s.signal.as_ref().map(|g| g.text.clone()));
            }
            Self::WaitClient(s) => parts.extend(s.name.clone()),
            Self::KillSimdev(s) => parts.extend(s.signal.as_ref().map(|g| g.text.clone())),
            Self::Cycles(s) => {
                parts.extend(s.model.clone());
                parts.extend(s.name.clone());
                parts.extend(s.count.map(|c| format!("×{c}")));
            }
            Self::TensorOp(s) => {
                parts.push(
                    match s.op.unwrap_or_default() {
                        TensorOpKind::Write => "write",
                        TensorOpKind::Read => "read",
                        TensorOpKind::Copy => "copy",
                    }
                    .into(),
                );
                parts.push(format!("queue {}", s.queue.unwrap_or(0)));
            }
            Self::ClearFaults(_)
            | Self::SetLatency(_)
            | Self::Check(_)
            | Self::RestartSimdev(_)
            | Self::Lifecycle(_) => {}
        }
        if parts.is_empty() {
            self.name().into()
        } else {
            format!("{}({})", self.name(), parts.join(", "))
        }
    }
}

/// An action that takes no keys (`clear_faults`, `restart_simdev`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoKeys {}

/// The expectations of one call (`init`, `load`, `unload`, `spawn_client`), borrowed from the
/// step.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallExpect<'a> {
    /// The call's status (default NRT_SUCCESS).
    pub expect: Option<&'a StatusSel>,
    /// The error message contains this.
    pub message_contains: Option<&'a str>,
    /// The call returns within this many seconds.
    pub max_step_s: Option<f64>,
}

/// `init`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitStep {
    /// A further runtime under this name, on its own connection to the same simdev (steps
    /// keep using the scenario's runtime; `execute`'s `tensors_from` and `close`'s `runtime`
    /// name it). Default: the scenario's runtime.
    #[serde(rename = "as")]
    pub runtime_as: Option<String>,
    /// This runtime's `NEURON_RT_VISIBLE_CORES` instead of `[runtime]`'s.
    pub visible_cores: Option<Cores>,
    /// The call's status (default NRT_SUCCESS).
    pub expect: Option<StatusSel>,
    /// The error message contains this.
    pub expect_message_contains: Option<String>,
    /// The call returns within this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// `load`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadStep {
    /// A `[models]` name.
    pub model: Option<String>,
    /// The handle's name (default: the model's name).
    #[serde(rename = "as")]
    pub handle_as: Option<String>,
    /// The logical core (default 0; -1 = the first).
    pub vnc: Option<i32>,
    /// The call's status (default NRT_SUCCESS).
    pub expect: Option<StatusSel>,
    /// The error message contains this.
    pub expect_message_contains: Option<String>,
    /// The call returns within this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// What a `tensor_op` step moves.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TensorOpKind {
    /// Host bytes to a device tensor (`nrta_tensor_write`).
    #[default]
    Write,
    /// A device tensor's bytes to the host (`nrta_tensor_read`).
    Read,
    /// One device tensor to another on the same logical core (`nrta_tensor_copy`).
    Copy,
}

/// `tensor_op`: one tensor operation on a TENSOR_OP queue, waited for; when it succeeds, the
/// bytes are checked where they landed.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorOpStep {
    /// `write` (default), `read` or `copy`.
    pub op: Option<TensorOpKind>,
    /// The TENSOR_OP queue, 0 (default) or 1.
    pub queue: Option<i32>,
    /// Bytes moved (default 4096).
    pub bytes: Option<u64>,
    /// The logical core of the device tensors (default 0).
    pub vnc: Option<u32>,
    /// The operation's status (default NRT_SUCCESS): the schedule call's, else the
    /// completion's.
    pub expect: Option<StatusSel>,
    /// The error message contains this.
    pub expect_message_contains: Option<String>,
    /// The step takes at most this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// `unload`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnloadStep {
    /// A handle name.
    pub model: Option<String>,
    /// The call's status (default NRT_SUCCESS).
    pub expect: Option<StatusSel>,
    /// The error message contains this.
    pub expect_message_contains: Option<String>,
    /// The call returns within this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// How `execute` calls the runtime.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// `nrt_execute` (default).
    #[default]
    Sync,
    /// The explicit async API: `execute_schedule` + wait.
    Async,
}

/// `execute`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteStep {
    /// A handle name; the logical core is the handle's.
    pub model: Option<String>,
    /// Executions (default 1).
    pub count: Option<u64>,
    /// Threads sharing the executions (default 1).
    pub threads: Option<u32>,
    /// `sync` (default) or `async`.
    #[serde(default)]
    pub mode: ExecMode,
    /// Pass host tensors (sync only).
    pub host_tensors: Option<bool>,
    /// Allocate the tensors on this logical core instead of the model's.
    pub tensors_on_vnc: Option<u32>,
    /// Allocate the tensors with the runtime of this name (an `init` step's `as`) instead of
    /// the scenario's (on `tensors_on_vnc`, default the handle's logical core number).
    pub tensors_from: Option<String>,
    /// Check outputs of executions that delivered them (default true).
    pub check_outputs: Option<bool>,
    /// Run in the background under this name (see `join`).
    pub background: Option<String>,
    /// Async: requests one thread keeps outstanding (default: 2 × xu_capacity).
    pub inflight: Option<u32>,
    /// Every call's status.
    pub expect: Option<StatusSel>,
    /// Each execution's status, in execution order.
    pub expect_each: Option<Vec<StatusSel>>,
    /// How many executions ended with each status.
    pub expect_counts: Option<BTreeMap<String, u64>>,
    /// Statuses no call may return.
    pub expect_not: Option<StatusList>,
    /// Every call returns one of these.
    pub expect_one_of: Option<Vec<StatusSel>>,
    /// Every failed call's message contains this.
    pub expect_message_contains: Option<String>,
    /// Every call returns within this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_call_s: Option<f64>,
    /// Every call returns within the exec timeout plus this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_timeout_plus_s: Option<f64>,
    /// Every call takes at least this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub min_call_s: Option<f64>,
    /// The whole step takes at most this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
    /// Async: NRT_QUEUE_FULL refusals seen at least this many times.
    pub min_queue_full: Option<u64>,
}

/// `join`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinStep {
    /// The background `execute`'s name.
    pub name: Option<String>,
}

/// `close`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseStep {
    /// Close the runtime of this name (an `init` step's `as`) instead of the scenario's.
    pub runtime: Option<String>,
    /// Close returns within this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// `sleep`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepStep {
    /// Milliseconds.
    pub ms: Option<u64>,
}

/// `set_latency`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetLatencyStep {
    /// The new model (`{}` or none: wall clock).
    pub latency: Option<LatencySpec>,
}

/// `snapshot`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotStep {
    /// The snapshot's name.
    pub name: Option<String>,
}

/// `check`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckStep {
    /// The checks (`[[steps.check]]`, same form as `[[expect]]`).
    #[serde(default, deserialize_with = "super::check::step_checks")]
    pub check: Vec<Check>,
}

/// `spawn_client`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnClientStep {
    /// The client's name (default `client`).
    pub name: Option<String>,
    /// The client's `NEURON_RT_VISIBLE_CORES`.
    pub visible_cores: Option<Cores>,
    /// The client's `NEURON_RT_NUM_CORES` (any free cores; without `visible_cores`).
    pub num_cores: Option<u32>,
    /// Identity tensor bytes (default 4096).
    pub bytes: Option<u32>,
    /// Executions, then exit (default: until signalled).
    pub count: Option<u64>,
    /// Its init status (default NRT_SUCCESS = ready).
    pub expect: Option<StatusSel>,
    /// Its init error message contains this.
    pub expect_message_contains: Option<String>,
    /// It is ready (or refused) within this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// A signal the runner sends: `SIGKILL`, `SIGINT` or `SIGTERM` (also `KILL`, `9`, any case).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub struct SignalName {
    /// As written (shown in reports).
    pub text: String,
    /// The signal.
    pub signal: Signal,
}

impl TryFrom<String> for SignalName {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let signal = match text.to_ascii_uppercase().as_str() {
            "SIGKILL" | "KILL" | "9" => Signal::SIGKILL,
            "SIGINT" | "INT" | "2" => Signal::SIGINT,
            "SIGTERM" | "TERM" | "15" => Signal::SIGTERM,
            other => {
                return Err(format!(
                    "signal {other:?} is not SIGKILL, SIGINT or SIGTERM"
                ));
            }
        };
        Ok(Self { text, signal })
    }
}

/// How a client process is expected to end.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExitKind {
    /// Closed its runtime and exited 0.
    Clean,
    /// Killed by the signal sent.
    Killed,
}

impl ExitKind {
    /// As written in the file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Clean => "clean",
            Self::Killed => "killed",
        }
    }
}

/// `kill_client`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillClientStep {
    /// The client's name (default `client`).
    pub name: Option<String>,
    /// The signal (default SIGKILL).
    pub signal: Option<SignalName>,
    /// How long to wait for the exit (default 5 s).
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_s: Option<f64>,
    /// `clean` or `killed` (default: `killed` for SIGKILL, else `clean`).
    pub expect_exit: Option<ExitKind>,
    /// The client ran at least this many executions.
    pub min_executions: Option<u64>,
}

impl KillClientStep {
    /// The keys it shares with `wait_client`.
    pub fn end(&self) -> WaitClientStep {
        WaitClientStep {
            name: self.name.clone(),
            within_s: self.within_s,
            expect_exit: self.expect_exit,
            min_executions: self.min_executions,
        }
    }
}

/// `wait_client`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitClientStep {
    /// The client's name (default `client`).
    pub name: Option<String>,
    /// How long to wait for the exit (default 5 s).
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub within_s: Option<f64>,
    /// `clean` or `killed` (default `clean`).
    pub expect_exit: Option<ExitKind>,
    /// The client ran at least this many executions.
    pub min_executions: Option<u64>,
}

/// `kill_simdev`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillSimdevStep {
    /// The signal (default SIGKILL).
    pub signal: Option<SignalName>,
}

/// `lifecycle`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecycleStep {
    /// The status of each call of the lifecycle client, by name.
    pub expect_codes: Option<BTreeMap<String, StatusSel>>,
    /// The lifecycle takes at most this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

/// `cycles`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CyclesStep {
    /// The snapshot taken after the warm-up (default `warmup`).
    pub name: Option<String>,
    /// A `[models]` name.
    pub model: Option<String>,
    /// The logical core (default 0).
    pub vnc: Option<i32>,
    /// Cycles (default 1000).
    pub count: Option<u64>,
    /// Cycles before the baselines are taken (default 50).
    pub warmup: Option<u64>,
    /// Execute once per cycle, output checked.
    pub execute_each: Option<bool>,
    /// Resident memory may grow at most this much after the warm-up.
    pub max_rss_growth_kib: Option<u64>,
    /// The whole step takes at most this many seconds.
    #[serde(default, deserialize_with = "super::seconds::opt")]
    pub max_step_s: Option<f64>,
}

macro_rules! call_expect {
    ($($t:ty),*) => {$(
        impl $t {
            /// The call's expectations.
            pub fn call_expect(&self) -> CallExpect<'_> {
                CallExpect {
                    expect: self.expect.as_ref(),
                    message_contains: self.expect_message_contains.as_deref(),
                    max_step_s: self.max_step_s,
                }
            }
        }
    )*};
}

call_expect!(
    InitStep,
    LoadStep,
    UnloadStep,
    SpawnClientStep,
    TensorOpStep
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::spec::parse;

    /// Every action with a minimal body (the keys it needs, if any).
    const MINIMAL: [(&str, &str); 20] = [
        ("init", ""),
        ("load", "model = \"id\""),
        ("unload", "model = \"id\""),
        ("execute", "model = \"id\""),
        ("join", "name = \"bg\""),
        ("close", ""),
        ("sleep", "ms = 5"),
        ("fault", "kind = \"numerical\"\nat_execution = 1"),
        ("clear_faults", ""),
        ("set_latency", "latency = {}"),
        ("snapshot", "name = \"s\""),
        ("check", "[[steps.check]]\nwhat = \"no_leaks\""),
        ("spawn_client", "name = \"a\""),
        ("kill_client", "name = \"a\""),
        ("wait_client", "name = \"a\""),
        ("kill_simdev", ""),
        ("restart_simdev", ""),
        ("lifecycle", ""),
        ("cycles", "model = \"id\""),
        ("tensor_op", "op = \"copy\""),
    ];

    fn one_step(action: &str, body: &str) -> Result<Step, String> {
        // `[[steps.check]]` must come after the step's own keys; the models the snippets name
        // (`id`, `m`) are defined, as a file must define them, and the client a wait_client or
        // kill_client ends is spawned first (step 1; the step itself is then step 2).
        let spawn = if needs_a_client(action) {
            "[[steps]]\naction = \"spawn_client\"\nname = \"a\"\n"
        } else {
            ""
        };
        let text = format!(
            "[models.id]\nbuilder = \"identity\"\n[models.m]\nbuilder = \"identity\"\n\
             {spawn}[[steps]]\naction = \"{action}\"\n{body}\n"
        );
        parse(&text).map(|mut sc| {
            assert_eq!(sc.steps.len(), 1 + usize::from(!spawn.is_empty()));
            sc.steps.pop().expect("the step")
        })
    }

    /// Whether `action` ends a client (so [`one_step`] spawns client "a" before it).
    fn needs_a_client(action: &str) -> bool {
        matches!(action, "wait_client" | "kill_client")
    }

    /// The position [`one_step`] gives its step.
    fn position(action: &str) -> usize {
        1 + usize::from(needs_a_client(action))
    }

    /// The actions serde knows, from its own "expected one of" list.
    fn known_actions() -> Vec<String> {
        let e = parse("[[steps]]\naction = \"no_such_action\"\n").unwrap_err();
        let list = e
            .split("expected one of ")
            .nth(1)
            .unwrap_or_else(|| panic!("{e}"));
        list.split(", ")
            .map(|a| a.trim_matches('`').to_string())
            .collect()
    }

    #[test]
    fn every_step_kind_parses_from_a_minimal_snippet() {
        let known = known_actions();
        assert_eq!(known.len(), MINIMAL.len(), "{known:?}");
        for a in &known {
            assert!(
                MINIMAL.iter().any(|(m, _)| m == a),
                "action {a} has no snippet"
            );
        }
        for (action, body) in MINIMAL {
            let step = one_step(action, body).unwrap_or_else(|e| panic!("{action}: {e}"));
            assert_eq!(step.action.name(), action);
            assert_eq!(step.label, None);
        }
    }

    #[test]
    fn keys_land_in_their_actions_fields() {
        let s = one_step(
            "execute",
            "model = \"m\"\ncount = 3\nthreads = 2\nmode = \"async\"\ninflight = 4\n\
             expect_counts = { NRT_SUCCESS = 3 }\nmax_call_s = 0.5",
        )
        .unwrap();
        let Action::Execute(e) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!(e.model.as_deref(), Some("m"));
        assert_eq!(
            (e.count, e.threads, e.inflight),
            (Some(3), Some(2), Some(4))
        );
        assert_eq!(e.mode, ExecMode::Async);
        assert_eq!(e.max_call_s, Some(0.5));
        assert_eq!(s.action.describe(), "execute(m, ×3, 2 threads, async)");

        let s = one_step("load", "model = \"id\"\nas = \"m0\"\nvnc = -1").unwrap();
        let Action::Load(l) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!((l.handle_as.as_deref(), l.vnc), (Some("m0"), Some(-1)));

        let s = one_step("kill_client", "name = \"a\"\nsignal = \"int\"").unwrap();
        let Action::KillClient(k) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!(k.signal.as_ref().map(|g| g.signal), Some(Signal::SIGINT));
        assert_eq!(s.action.describe(), "kill_client(a, int)");

        let s = one_step("check", "[[steps.check]]\nwhat = \"xu_health\"\nvnc = 1").unwrap();
        let Action::Check(c) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!(c.check.len(), 1);
        assert_eq!(c.check[0].what(), "xu_health");

        let s = one_step("init", "as = \"other\"\nvisible_cores = \"1\"").unwrap();
        let Action::Init(i) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!(i.runtime_as.as_deref(), Some("other"));
        assert_eq!(
            i.visible_cores.as_ref().map(Cores::text).as_deref(),
            Some("1")
        );
        assert_eq!(s.action.describe(), "init(other)");
        let s = one_step("execute", "model = \"m\"\ntensors_from = \"other\"").unwrap();
        let Action::Execute(e) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!(e.tensors_from.as_deref(), Some("other"));
        let s = one_step("close", "runtime = \"other\"").unwrap();
        let Action::Close(c) = &s.action else {
            panic!("{s:?}")
        };
        assert_eq!(c.runtime.as_deref(), Some("other"));
        assert_eq!(s.action.describe(), "close(other)");

        let s = one_step("sleep", "label = \"a pause\"\nms = 7").unwrap();
        assert_eq!(s.label.as_deref(), Some("a pause"));
        assert_eq!(s.action.describe(), "sleep(7 ms)");
    }

    #[test]
    fn an_unknown_key_in_each_step_kind_is_refused_naming_the_key() {
        for (action, body) in MINIMAL {
            // `check`'s body is a sub-table: put the key before it.
            let text = format!("[[steps]]\naction = \"{action}\"\nbogus_key = 1\n{body}\n");
            let e = parse(&text).unwrap_err();
            let want = format!("step 1 ({action}): unknown field `bogus_key`");
            assert!(e.starts_with(&want), "{action}: {e}");
        }
    }

    #[test]
    fn a_key_of_another_step_kind_is_refused_naming_the_key() {
        for (action, body) in MINIMAL {
            // `threads` belongs to execute only; `ms` to sleep only.
            let key = if action == "execute" { "ms" } else { "threads" };
            let text = format!("[[steps]]\naction = \"{action}\"\n{key} = 2\n{body}\n");
            let e = parse(&text).unwrap_err();
            let want = format!("step 1 ({action}): unknown field `{key}`");
            assert!(e.starts_with(&want), "{action}: {e}");
        }
        // wait_client sends no signal; kill_client does.
        let e = one_step("wait_client", "name = \"a\"\nsignal = \"SIGINT\"").unwrap_err();
        assert!(
            e.starts_with("step 2 (wait_client): unknown field `signal`"),
            "{e}"
        );
    }

    #[test]
    fn the_failing_step_is_named_by_its_position() {
        let text = "[[steps]]\naction = \"sleep\"\nms = 1\n\n[[steps]]\naction = \"init\"\n\n\
                    [[steps]]\naction = \"close\"\nmodel = \"m\"\n";
        let e = parse(text).unwrap_err();
        assert!(
            e.starts_with("step 3 (close): unknown field `model`"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_or_missing_step_kind_is_refused() {
        let e = parse("[[steps]]\naction = \"slep\"\nms = 1\n").unwrap_err();
        assert!(
            e.starts_with("step 1 (slep): unknown variant `slep`"),
            "{e}"
        );
        assert!(e.contains("`sleep`"), "{e}");
        let e = parse("[[steps]]\nms = 1\n").unwrap_err();
        assert!(e.starts_with("step 1: missing field `action`"), "{e}");
        let e = parse("[[steps]]\naction = 3\n").unwrap_err();
        assert!(e.starts_with("step 1: "), "{e}");
    }

    #[test]
    fn closed_value_sets_are_refused_at_parse_time() {
        for (action, body, key) in [
            ("execute", "model = \"m\"\nmode = \"asinc\"", "asinc"),
            ("kill_client", "signal = \"SIGHUP\"", "SIGHUP"),
            ("kill_simdev", "signal = \"SIGSTOP\"", "SIGSTOP"),
            ("wait_client", "expect_exit = \"cleen\"", "cleen"),
        ] {
            let e = one_step(action, body).unwrap_err();
            assert!(
                e.starts_with(&format!("step {} ({action}): ", position(action)))
                    && e.contains(key),
                "{action}: {e}"
            );
        }
        let e = one_step("sleep", "label = 3\nms = 1").unwrap_err();
        assert!(
            e.starts_with("step 1 (sleep): `label` must be a string"),
            "{e}"
        );
    }

    #[test]
    fn a_check_inside_a_step_is_named_by_both_positions() {
        let e = one_step(
            "check",
            "[[steps.check]]\nwhat = \"no_leaks\"\n[[steps.check]]\nwhat = \"xu_health\"\n\
             health = \"helthy\"",
        )
        .unwrap_err();
        assert!(
            e.starts_with("step 1 (check): check 2 (xu_health): unknown variant `helthy`"),
            "{e}"
        );
        let e = one_step(
            "check",
            "[[steps.check]]\nwhat = \"counters\"\nnc = 0\nvnc = 0",
        )
        .unwrap_err();
        assert!(
            e.starts_with("step 1 (check): check 1 (counters): unknown field `vnc`"),
            "{e}"
        );
    }
}
