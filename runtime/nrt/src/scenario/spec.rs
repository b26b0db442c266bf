//! The scenario file schema (TOML), as documented in `scenarios/README.md`.
//!
//! A file is parsed twice: once into [`Scenario`] (serde, `deny_unknown_fields`, so a misspelt
//! key is an error with its line), and once as a plain table to check that every key of a step
//! or check applies to its `action` / `what` ([`check_keys`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use shared::NrtStatus;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen, LatencyModel};

/// One scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name in reports (default: the file stem).
    pub name: Option<String>,
    /// What the scenario shows (for people; not checked).
    pub description: Option<String>,
    /// Wall-clock limit for the whole scenario (default 60 s): past it the runner reports a
    /// failure and exits.
    pub time_limit_s: Option<f64>,
    /// The simulated device.
    #[serde(default)]
    pub device: DeviceSpec,
    /// The runtime's configuration (the `NEURON_RT_*` knobs).
    #[serde(default)]
    pub runtime: RuntimeSpec,
    /// Models by name.
    #[serde(default)]
    pub models: BTreeMap<String, ModelSpec>,
    /// Faults armed before the first step.
    #[serde(default)]
    pub faults: Vec<FaultEntry>,
    /// The steps, in order.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// Checks made after the last step.
    #[serde(default)]
    pub expect: Vec<Check>,
}

/// `[device]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// `trn1` (default), `inf2` or `trn2`.
    #[serde(default = "default_arch")]
    pub arch: String,
    /// NCs (default: the arch's count).
    pub ncs: Option<u32>,
    /// HBM per NC, as simdev's `--hbm` takes it (default `64M`).
    #[serde(default = "default_hbm")]
    pub hbm: String,
    /// Seed of the runner's input patterns and the default seed of probability faults.
    #[serde(default)]
    pub seed: u64,
    /// The latency model, set before the runtime starts.
    pub latency: Option<LatencySpec>,
}

impl Default for DeviceSpec {
    fn default() -> Self {
        Self {
            arch: default_arch(),
            ncs: None,
            hbm: default_hbm(),
            seed: 0,
            latency: None,
        }
    }
}

fn default_arch() -> String {
    "trn1".into()
}

fn default_hbm() -> String {
    "64M".into()
}

/// `[device.latency]` or a `set_latency` step's `latency`: simulated nanoseconds.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencySpec {
    /// Fixed cost of every execution.
    #[serde(default)]
    pub per_execution_ns: u64,
    /// Cost of each instruction.
    #[serde(default)]
    pub per_instruction_ns: u64,
    /// Cost of a sequencer config reload.
    #[serde(default)]
    pub per_config_reload_ns: u64,
    /// Cost of an activation/DVE table load.
    #[serde(default)]
    pub per_table_load_ns: u64,
    /// Also sleep the simulated time in wall-clock time.
    #[serde(default)]
    pub wall_clock_pacing: bool,
}

impl LatencySpec {
    /// The protocol's model.
    pub fn model(&self) -> LatencyModel {
        LatencyModel {
            per_execution_ns: self.per_execution_ns,
            per_instruction_ns: self.per_instruction_ns,
            per_config_reload_ns: self.per_config_reload_ns,
            per_table_load_ns: self.per_table_load_ns,
            wall_clock_pacing: self.wall_clock_pacing,
        }
    }
}

/// A string or an integer (`visible_cores = "0-1"` or `visible_cores = 1`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Cores {
    /// `"3"`, `"3-5"`, `"3-5,6"`.
    Text(String),
    /// One core.
    One(u32),
}

impl Cores {
    /// As `NEURON_RT_VISIBLE_CORES` spells it.
    pub fn text(&self) -> String {
        match self {
            Self::Text(s) => s.clone(),
            Self::One(n) => n.to_string(),
        }
    }
}

/// `[runtime]`: the runner builds a `RuntimeConfig` from these (never from the environment).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Start a runtime before the first step (default true).
    #[serde(default = "yes")]
    pub init: bool,
    /// `NEURON_RT_EXEC_TIMEOUT`, seconds (default 5 here; libnrt's default is 30).
    #[serde(default = "default_timeout")]
    pub exec_timeout: f64,
    /// `NEURON_RT_VISIBLE_CORES`.
    pub visible_cores: Option<Cores>,
    /// `NEURON_RT_NUM_CORES` (0 = all).
    #[serde(default)]
    pub num_cores: u32,
    /// `NEURON_LOGICAL_NC_CONFIG`: 1 or 2.
    #[serde(default = "one")]
    pub lnc: u32,
    /// `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS` (> 0: the implicit async pool).
    #[serde(default)]
    pub async_max_inflight: u32,
    /// Slots of each logical core's XU queue (the explicit async queue depth; default 16).
    #[serde(default = "default_xu_capacity")]
    pub xu_capacity: usize,
    /// `NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION` (default true).
    #[serde(default = "yes")]
    pub skip_config_optimization: bool,
    /// `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY`: `"critical"` reports numerical errors as 1003;
    /// unset or `"none"` (libnrt's default) makes them successes.
    pub numerical_errors_verbosity: Option<String>,
}

impl Default for RuntimeSpec {
    fn default() -> Self {
        Self {
            init: true,
            exec_timeout: default_timeout(),
            visible_cores: None,
            num_cores: 0,
            lnc: 1,
            async_max_inflight: 0,
            xu_capacity: default_xu_capacity(),
            skip_config_optimization: true,
            numerical_errors_verbosity: None,
        }
    }
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

fn default_timeout() -> f64 {
    5.0
}

fn default_xu_capacity() -> usize {
    16
}

/// `[models.NAME]`: a built-in builder or a container file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `identity`, `identity_split`, `identity_cc`, `never_ending` or `digits`.
    pub builder: Option<String>,
    /// A model container file, relative to the scenario file.
    pub file: Option<PathBuf>,
    /// What a file model computes, for output checks: `identity` or `none` (default).
    pub reference: Option<String>,
    /// Tensor bytes (identity builders; default 4096).
    pub bytes: Option<u32>,
    /// Images per execution (digits; default 1).
    pub batch: Option<u32>,
    /// Every word of the model's `exec_req_flags` (identity; default 0): models whose flags
    /// differ force a config reload when the runtime switches between them.
    pub exec_req_flags: Option<u32>,
    /// Every byte of the activation table hash (identity; default 0).
    pub table_hash: Option<u8>,
    /// Collectives context bytes (identity_cc; default 4096).
    pub ctx_bytes: Option<u64>,
    /// The event the program waits on (never_ending; default 3).
    pub event: Option<u32>,
    /// Largest |output − reference| accepted (digits; default 1e-4).
    pub tolerance: Option<f32>,
}

/// A fault, in `[[faults]]` or a `fault` step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultEntry {
    /// `nc_uncorrectable`, `hbm_uncorrectable`, `hbm_repairable`, `dma_abort`, `out_of_bounds`,
    /// `numerical`, `generic_error`, `missing_completion`, `late_completion`, `extra_latency`,
    /// `device_lost`.
    pub kind: String,
    /// The NC (default: any NC).
    pub nc: Option<u32>,
    /// Fire at the Nth execution on the NC counted from arming (1 = the next).
    pub at_execution: Option<u64>,
    /// Or fire on each execution with this chance in a million.
    pub per_million: Option<u32>,
    /// The probability's seed (default `[device] seed`).
    pub seed: Option<u64>,
    /// `late_completion`: wall-clock delay.
    pub delay_ms: Option<u32>,
    /// `extra_latency`: simulated nanoseconds.
    pub ns: Option<u64>,
}

impl FaultEntry {
    /// The protocol's fault.
    ///
    /// # Errors
    /// A message naming the missing or conflicting key.
    pub fn spec(&self, default_seed: u64) -> Result<FaultSpec, String> {
        let kind = match self.kind.as_str() {
            "nc_uncorrectable" => FaultKind::NcUncorrectable,
            "hbm_uncorrectable" => FaultKind::HbmUncorrectable,
            "hbm_repairable" => FaultKind::HbmRepairable,
            "dma_abort" => FaultKind::DmaAbort,
            "out_of_bounds" => FaultKind::OutOfBounds,
            "numerical" => FaultKind::Numerical,
            "generic_error" => FaultKind::GenericError,
            "missing_completion" => FaultKind::MissingCompletion,
            "late_completion" => FaultKind::LateCompletion {
                delay_ms: self
                    .delay_ms
                    .ok_or("late_completion needs delay_ms (wall-clock milliseconds)")?,
            },
            "extra_latency" => FaultKind::ExtraLatency {
                ns: self
                    .ns
                    .ok_or("extra_latency needs ns (simulated nanoseconds)")?,
            },
            "device_lost" => FaultKind::DeviceLost,
            other => {
                return Err(format!(
                    "fault kind {other:?} is not one of nc_uncorrectable, hbm_uncorrectable, \
                     hbm_repairable, dma_abort, out_of_bounds, numerical, generic_error, \
                     missing_completion, late_completion, extra_latency, device_lost"
                ));
            }
        };
        if self.delay_ms.is_some() && !matches!(kind, FaultKind::LateCompletion { .. }) {
            return Err(format!(
                "delay_ms applies to late_completion, not {}",
                self.kind
            ));
        }
        if self.ns.is_some() && !matches!(kind, FaultKind::ExtraLatency { .. }) {
            return Err(format!("ns applies to extra_latency, not {}", self.kind));
        }
        let when = match (self.at_execution, self.per_million) {
            (Some(n), None) => {
                if self.seed.is_some() {
                    return Err("seed applies to per_million faults".into());
                }
                FaultWhen::NthExecution(n)
            }
            (None, Some(per_million)) => FaultWhen::Probability {
                per_million,
                seed: self.seed.unwrap_or(default_seed),
            },
            _ => {
                return Err(format!(
                    "fault {}: give exactly one of at_execution (the Nth execution) or \
                     per_million (a seeded probability)",
                    self.kind
                ));
            }
        };
        Ok(FaultSpec {
            kind,
            nc: self.nc,
            when,
        })
    }
}

/// A status: a name (`"NRT_TIMEOUT"`, `"TIMEOUT"`) or a number (`5`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StatusSel {
    /// A number.
    Code(u32),
    /// A name.
    Name(String),
}

impl StatusSel {
    /// The status.
    ///
    /// # Errors
    /// A message naming the unknown status.
    pub fn status(&self) -> Result<NrtStatus, String> {
        match self {
            Self::Code(c) => {
                NrtStatus::from_u32(*c).ok_or_else(|| format!("{c} is not an NRT_STATUS value"))
            }
            Self::Name(n) => parse_status(n),
        }
    }
}

/// Parses a status name (with or without `NRT_`) or number.
///
/// # Errors
/// A message naming the unknown status.
pub fn parse_status(text: &str) -> Result<NrtStatus, String> {
    let t = text.trim();
    if let Ok(c) = t.parse::<u32>() {
        return NrtStatus::from_u32(c).ok_or_else(|| format!("{c} is not an NRT_STATUS value"));
    }
    let upper = t.to_ascii_uppercase();
    NrtStatus::ALL
        .iter()
        .copied()
        .find(|s| s.name() == upper || s.name().strip_prefix("NRT_") == Some(upper.as_str()))
        .ok_or_else(|| format!("{t:?} is not an NRT_STATUS name"))
}

/// One status or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StatusList {
    /// One.
    One(StatusSel),
    /// Several.
    Many(Vec<StatusSel>),
}

impl StatusList {
    /// The statuses.
    ///
    /// # Errors
    /// An unknown status.
    pub fn statuses(&self) -> Result<Vec<NrtStatus>, String> {
        match self {
            Self::One(s) => Ok(vec![s.status()?]),
            Self::Many(v) => v.iter().map(StatusSel::status).collect(),
        }
    }
}

/// A bound on a number: exact (`3`), a range (`{ min = 1, max = 9 }`), or the same value as in
/// a snapshot (`"baseline"`, or a `snapshot` step's name).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Bound {
    /// Exactly this.
    Exact(u64),
    /// Within (inclusive).
    Range {
        /// Lower bound.
        min: Option<u64>,
        /// Upper bound.
        max: Option<u64>,
    },
    /// The value the named snapshot recorded for the same quantity.
    Same(String),
}

/// One step of `[[steps]]`. Which keys apply depends on `action` (see the README).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// What the step does.
    pub action: String,
    /// A name shown in reports instead of the action.
    pub label: Option<String>,
    /// `load`: a `[models]` name; `execute`, `unload`, `cycles`: a loaded handle's name.
    pub model: Option<String>,
    /// `load`: the handle's name (default: the model's name).
    #[serde(rename = "as")]
    pub handle_as: Option<String>,
    /// `load`, `cycles`: the logical core (default 0).
    pub vnc: Option<i32>,
    /// Executions, cycles or client executions.
    pub count: Option<u64>,
    /// `execute`: threads sharing the executions (default 1).
    pub threads: Option<u32>,
    /// `execute`: `sync` (default) or `async` (the explicit async API).
    pub mode: Option<String>,
    /// `execute`: pass host tensors (sync only).
    pub host_tensors: Option<bool>,
    /// `execute`: allocate the tensors on this logical core instead of the model's.
    pub tensors_on_vnc: Option<u32>,
    /// `execute`: check outputs of executions that delivered them (default true).
    pub check_outputs: Option<bool>,
    /// `execute`: run in the background under this name (see `join`).
    pub background: Option<String>,
    /// `execute` async: requests one thread keeps outstanding (default: 2 × xu_capacity).
    pub inflight: Option<u32>,
    /// `join`, `snapshot`, `*_client`: a name; `cycles`: the name of the snapshot taken after
    /// the warm-up cycles (default `warmup`).
    pub name: Option<String>,
    /// `sleep`: milliseconds.
    pub ms: Option<u64>,
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
    pub max_call_s: Option<f64>,
    /// Every call returns within the exec timeout plus this many seconds.
    pub within_timeout_plus_s: Option<f64>,
    /// Every call takes at least this many seconds.
    pub min_call_s: Option<f64>,
    /// The whole step takes at most this many seconds.
    pub max_step_s: Option<f64>,
    /// `execute` async: NRT_QUEUE_FULL refusals seen at least this many times.
    pub min_queue_full: Option<u64>,
    /// `fault`: as in `[[faults]]`.
    pub kind: Option<String>,
    /// `fault`: the NC.
    pub nc: Option<u32>,
    /// `fault`: the Nth execution.
    pub at_execution: Option<u64>,
    /// `fault`: chance per execution in a million.
    pub per_million: Option<u32>,
    /// `fault`: probability seed.
    pub seed: Option<u64>,
    /// `fault` late_completion: delay.
    pub delay_ms: Option<u32>,
    /// `fault` extra_latency: simulated ns.
    pub ns: Option<u64>,
    /// `set_latency`: the new model.
    pub latency: Option<LatencySpec>,
    /// `kill_client`, `kill_simdev`: `SIGKILL` (default), `SIGINT` or `SIGTERM`.
    pub signal: Option<String>,
    /// `spawn_client`: the client's `NEURON_RT_VISIBLE_CORES`.
    pub visible_cores: Option<Cores>,
    /// `spawn_client`: identity tensor bytes (default 4096).
    pub bytes: Option<u32>,
    /// `kill_client`, `wait_client`: how long to wait for the exit (default 5 s).
    pub within_s: Option<f64>,
    /// `kill_client`, `wait_client`: `clean` (closed and exited 0) or `killed` (by the signal).
    pub expect_exit: Option<String>,
    /// `kill_client`, `wait_client`: the client ran at least this many executions.
    pub min_executions: Option<u64>,
    /// `lifecycle`: the status of each call of the lifecycle client.
    pub expect_codes: Option<BTreeMap<String, StatusSel>>,
    /// `cycles`: cycles before the resident-memory baseline is taken (default 50).
    pub warmup: Option<u64>,
    /// `cycles`: execute once per cycle.
    pub execute_each: Option<bool>,
    /// `cycles`: resident memory may grow at most this much after the warm-up.
    pub max_rss_growth_kib: Option<u64>,
    /// `check`: the checks.
    pub check: Option<Vec<Check>>,
}

/// A check (`[[expect]]` or a `check` step's `[[steps.check]]`). Which keys apply depends on
/// `what`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// `counters`, `device_stats`, `no_leaks`, `xu_health`, `stale_notifications`, `sim_time`,
    /// `simdev`.
    pub what: String,
    /// `counters`, `sim_time`: the physical NC.
    pub nc: Option<u32>,
    /// `sim_time`: subtract this NC's simulated time.
    pub minus_nc: Option<u32>,
    /// `xu_health`: the logical core.
    pub vnc: Option<u32>,
    /// `xu_health`: `healthy`, `shutdown` or `fatal_shutdown`.
    pub health: Option<String>,
    /// `simdev`: whether simdev is still running.
    pub running: Option<bool>,
    /// Poll until the check holds, for at most this long (default 0; `no_leaks` 3 s).
    pub within_s: Option<f64>,
    /// `stale_notifications`: late notifications the runtime discarded.
    pub count: Option<Bound>,
    /// `sim_time`: simulated nanoseconds.
    pub ns: Option<Bound>,
    /// Counter.
    pub dma_descriptors: Option<Bound>,
    /// Counter.
    pub dma_bytes: Option<Bound>,
    /// Counter.
    pub dma_aborts: Option<Bound>,
    /// Counter.
    pub register_writes: Option<Bound>,
    /// Counter.
    pub doorbells: Option<Bound>,
    /// Counter.
    pub notifications: Option<Bound>,
    /// Counter.
    pub nq_overflows: Option<Bound>,
    /// Counter.
    pub posted_errors: Option<Bound>,
    /// Counter.
    pub resets: Option<Bound>,
    /// Counter.
    pub executions: Option<Bound>,
    /// Counter.
    pub exec_errors: Option<Bound>,
    /// Counter.
    pub config_reloads: Option<Bound>,
    /// Counter.
    pub table_loads: Option<Bound>,
    /// Counter.
    pub cc_chains: Option<Bound>,
    /// Device stat.
    pub memory_in_use: Option<Bound>,
    /// Device stat.
    pub chunks: Option<Bound>,
    /// Device stat.
    pub clients: Option<Bound>,
    /// Device stat.
    pub claimed_ncs: Option<Bound>,
    /// Device stat.
    pub dma_queues: Option<Bound>,
    /// Device stat.
    pub armed_faults: Option<Bound>,
}

/// The NC counter keys of a `counters` check.
pub const COUNTER_KEYS: [&str; 14] = [
    "dma_descriptors",
    "dma_bytes",
    "dma_aborts",
    "register_writes",
    "doorbells",
    "notifications",
    "nq_overflows",
    "posted_errors",
    "resets",
    "executions",
    "exec_errors",
    "config_reloads",
    "table_loads",
    "cc_chains",
];

/// The device-stat keys of a `device_stats` check.
pub const STAT_KEYS: [&str; 6] = [
    "memory_in_use",
    "chunks",
    "clients",
    "claimed_ncs",
    "dma_queues",
    "armed_faults",
];

const STATUS_KEYS: [&str; 7] = [
    "expect",
    "expect_each",
    "expect_counts",
    "expect_not",
    "expect_one_of",
    "expect_message_contains",
    "max_step_s",
];

/// The keys each step action takes besides `action` and `label`.
fn step_keys(action: &str) -> Option<Vec<&'static str>> {
    let simple = ["expect", "expect_message_contains", "max_step_s"];
    let v: Vec<&'static str> = match action {
        "init" => simple.to_vec(),
        "load" => [&simple[..], &["model", "as", "vnc"]].concat(),
        "unload" => [&simple[..], &["model"]].concat(),
        "execute" => [
            &STATUS_KEYS[..],
            &[
                "model",
                "count",
                "threads",
                "mode",
                "host_tensors",
                "tensors_on_vnc",
                "check_outputs",
                "background",
                "inflight",
                "max_call_s",
                "within_timeout_plus_s",
                "min_call_s",
                "min_queue_full",
            ],
        ]
        .concat(),
        "join" => vec!["name"],
        "close" => vec!["max_step_s"],
        "sleep" => vec!["ms"],
        "fault" => vec![
            "kind",
            "nc",
            "at_execution",
            "per_million",
            "seed",
            "delay_ms",
            "ns",
        ],
        "clear_faults" => vec![],
        "set_latency" => vec!["latency"],
        "snapshot" => vec!["name"],
        "check" => vec!["check"],
        "spawn_client" => [&simple[..], &["name", "visible_cores", "bytes", "count"]].concat(),
        "kill_client" => vec![
            "name",
            "signal",
            "within_s",
            "expect_exit",
            "min_executions",
        ],
        "wait_client" => vec!["name", "within_s", "expect_exit", "min_executions"],
        "kill_simdev" => vec!["signal"],
        "restart_simdev" => vec![],
        "lifecycle" => vec!["expect_codes", "max_step_s"],
        "cycles" => vec![
            "name",
            "model",
            "vnc",
            "count",
            "warmup",
            "execute_each",
            "max_rss_growth_kib",
            "max_step_s",
        ],
        _ => return None,
    };
    Some(v)
}

/// The keys each check takes besides `what`.
fn check_keys_of(what: &str) -> Option<Vec<&'static str>> {
    let v: Vec<&'static str> = match what {
        "counters" => [&COUNTER_KEYS[..], &["nc", "within_s"]].concat(),
        "device_stats" => [&STAT_KEYS[..], &["within_s"]].concat(),
        "no_leaks" => vec!["within_s"],
        "xu_health" => vec!["vnc", "health"],
        "stale_notifications" => vec!["count"],
        "sim_time" => vec!["nc", "minus_nc", "ns"],
        "simdev" => vec!["running", "within_s"],
        _ => return None,
    };
    Some(v)
}

fn check_table(t: &toml::Table, where_: &str, errors: &mut Vec<String>) {
    let Some(what) = t.get("what").and_then(toml::Value::as_str) else {
        errors.push(format!("{where_}: a check needs `what`"));
        return;
    };
    let Some(allowed) = check_keys_of(what) else {
        errors.push(format!(
            "{where_}: what = {what:?} is not one of counters, device_stats, no_leaks, \
             xu_health, stale_notifications, sim_time, simdev"
        ));
        return;
    };
    for k in t.keys() {
        if k != "what" && !allowed.contains(&k.as_str()) {
            errors.push(format!(
                "{where_}: key `{k}` does not apply to what = {what:?} (it takes: {})",
                allowed.join(", ")
            ));
        }
    }
}

/// Checks that every key of every step and check applies to its action / what.
///
/// # Errors
/// Every misplaced key, one per line.
pub fn check_keys(text: &str) -> Result<(), String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let mut errors = Vec::new();
    if let Some(steps) = table.get("steps").and_then(toml::Value::as_array) {
        for (i, s) in steps.iter().enumerate() {
            let Some(t) = s.as_table() else { continue };
            let n = i + 1;
            let Some(action) = t.get("action").and_then(toml::Value::as_str) else {
                errors.push(format!("step {n}: needs `action`"));
                continue;
            };
            let Some(allowed) = step_keys(action) else {
                errors.push(format!(
                    "step {n}: action {action:?} is not one of init, load, unload, execute, \
                     join, close, sleep, fault, clear_faults, set_latency, snapshot, check, \
                     spawn_client, kill_client, wait_client, kill_simdev, restart_simdev, \
                     lifecycle, cycles"
                ));
                continue;
            };
            for k in t.keys() {
                if k != "action" && k != "label" && !allowed.contains(&k.as_str()) {
                    errors.push(format!(
                        "step {n} ({action}): key `{k}` does not apply (it takes: {})",
                        allowed.join(", ")
                    ));
                }
            }
            if let Some(checks) = t.get("check").and_then(toml::Value::as_array) {
                for (j, c) in checks.iter().enumerate() {
                    if let Some(ct) = c.as_table() {
                        check_table(ct, &format!("step {n} check {}", j + 1), &mut errors);
                    }
                }
            }
        }
    }
    if let Some(checks) = table.get("expect").and_then(toml::Value::as_array) {
        for (j, c) in checks.iter().enumerate() {
            if let Some(ct) = c.as_table() {
                check_table(ct, &format!("expect {}", j + 1), &mut errors);
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// Parses and checks a scenario file's text.
///
/// # Errors
/// The TOML error (with its line) or the misplaced keys.
pub fn parse(text: &str) -> Result<Scenario, String> {
    let sc: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
    check_keys(text)?;
    Ok(sc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_parse_by_name_short_name_and_number() {
        assert_eq!(parse_status("NRT_TIMEOUT"), Ok(NrtStatus::Timeout));
        assert_eq!(parse_status("timeout"), Ok(NrtStatus::Timeout));
        assert_eq!(parse_status("101"), Ok(NrtStatus::ExecUnitUnrecoverable));
        assert!(parse_status("NRT_NOPE").is_err());
    }

    #[test]
    fn misplaced_and_misspelt_keys_are_refused() {
        let e = parse("[[steps]]\naction = \"sleep\"\nthreads = 2\n").unwrap_err();
        assert!(e.contains("key `threads` does not apply"), "{e}");
        let e = parse("[[steps]]\naction = \"sleep\"\nmss = 2\n").unwrap_err();
        assert!(e.contains("mss"), "{e}");
        let e = parse("[[expect]]\nwhat = \"counters\"\nhealth = \"x\"\n").unwrap_err();
        assert!(e.contains("`health`"), "{e}");
        parse("[[steps]]\naction = \"sleep\"\nms = 2\n").unwrap();
    }

    #[test]
    fn faults_need_one_trigger() {
        let f = |at: Option<u64>, pm: Option<u32>| FaultEntry {
            kind: "numerical".into(),
            nc: None,
            at_execution: at,
            per_million: pm,
            seed: None,
            delay_ms: None,
            ns: None,
        };
        assert!(f(None, None).spec(0).is_err());
        assert!(f(Some(1), Some(1)).spec(0).is_err());
        assert_eq!(
            f(None, Some(5)).spec(9).unwrap().when,
            FaultWhen::Probability {
                per_million: 5,
                seed: 9
            }
        );
    }
}
