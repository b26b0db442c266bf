//! The scenario file schema (TOML), as documented in `scenarios/README.md`.
//!
//! Parsed once, with serde: every table has `deny_unknown_fields`, and steps and checks are
//! enums tagged by `action` and `what` ([`step`], [`check`]) with one struct per kind, so a
//! misspelt key, or a key that does not apply to its step or check, is refused before anything
//! runs, with the step's or check's position and kind.

mod check;
mod step;

/// The keys that hold seconds (`*_s`, `exec_timeout`): each is checked as it is read — a
/// number, not negative, at most [`runtime::config::MAX_SECONDS`] — so every one converts to a
/// `Duration` and an error names the key (toml adds its line, a step its position).
pub(crate) mod seconds {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer};

    fn check(secs: f64) -> Result<f64, String> {
        runtime::config::check_seconds(secs, false)
            .map(|_| secs)
            .map_err(|why| format!("{secs} seconds: {why}"))
    }

    /// An optional number of seconds (0 allowed).
    pub fn opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Option::<f64>::deserialize(d)?
            .map(check)
            .transpose()
            .map_err(D::Error::custom)
    }

    /// An optional number of seconds above 0.
    pub fn opt_positive<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        Option::<f64>::deserialize(d)?
            .map(|secs| {
                runtime::config::check_seconds(secs, true)
                    .map(|_| secs)
                    .map_err(|why| format!("{secs} seconds: {why}"))
            })
            .transpose()
            .map_err(D::Error::custom)
    }

    /// A number of seconds above 0.
    pub fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let secs = f64::deserialize(d)?;
        runtime::config::check_seconds(secs, true)
            .map(|_| secs)
            .map_err(|why| D::Error::custom(format!("{secs} seconds: {why}")))
    }
}

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use shared::NrtStatus;
use shared::protocol::{FaultKind, FaultSpec, FaultWhen, LatencyModel};

pub use check::Check;
pub use step::{
    Action, CallExpect, CloseStep, CyclesStep, ExecMode, ExecuteStep, ExitKind, InitStep, JoinStep,
    LifecycleStep, LoadStep, SetLatencyStep, SpawnClientStep, Step, TensorOpKind, TensorOpStep,
    UnloadStep, WaitClientStep,
};

/// One scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name in reports (default: the file stem).
    pub name: Option<String>,
    /// What the scenario shows (for people; not checked).
    pub description: Option<String>,
    /// Wall-clock limit for the whole scenario in seconds, above 0 (default 60): past it the
    /// runner reports a failure and exits.
    #[serde(default, deserialize_with = "seconds::opt_positive")]
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
    #[serde(default, deserialize_with = "steps")]
    pub steps: Vec<Step>,
    /// Checks made after the last step.
    #[serde(default, deserialize_with = "check::expect_checks")]
    pub expect: Vec<Check>,
}

/// `[device]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// `trn1` (default), `inf2` or `trn2`: any other name is refused with the file, not
    /// when simdev starts.
    #[serde(default = "default_arch", deserialize_with = "arch")]
    pub arch: shared::Arch,
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
    /// simdev `--reference` bindings, `FILE.neff=MODULE.py:FUNCTION` or
    /// `FILE.neff=GOLDEN.safetensors`, their paths relative to the scenario file: the bound
    /// NEFFs' outputs come from the reference, not the shape-only function (so their models
    /// take `reference = "none"`).
    #[serde(default)]
    pub references: Vec<String>,
}

impl Default for DeviceSpec {
    fn default() -> Self {
        Self {
            arch: default_arch(),
            ncs: None,
            hbm: default_hbm(),
            seed: 0,
            latency: None,
            references: Vec::new(),
        }
    }
}

fn default_arch() -> shared::Arch {
    shared::Arch::Trn1
}

/// `arch` by its name.
fn arch<'de, D: Deserializer<'de>>(d: D) -> Result<shared::Arch, D::Error> {
    let name = String::deserialize(d)?;
    shared::Arch::parse(&name)
        .ok_or_else(|| D::Error::custom(format!("unknown arch {name:?}: trn1, inf2 or trn2")))
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
    /// Cost of an NC reset.
    #[serde(default)]
    pub per_nc_reset_ns: u64,
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
            per_nc_reset_ns: self.per_nc_reset_ns,
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
    #[serde(default = "default_timeout", deserialize_with = "seconds::positive")]
    pub exec_timeout: f64,
    /// `NEURON_RT_VISIBLE_CORES`.
    pub visible_cores: Option<Cores>,
    /// `NEURON_RT_NUM_CORES` (0 = all).
    #[serde(default)]
    pub num_cores: u32,
    /// `NEURON_LOGICAL_NC_CONFIG`: 1 or 2; unset, the device's default (2 on trn2, 1
    /// elsewhere, as libnrt).
    #[serde(default)]
    pub lnc: Option<u32>,
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
            lnc: None,
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
    /// The program semaphore the program leaves one higher (semaphore_leak; default 5).
    pub semaphore: Option<u32>,
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
    /// Or fire at the Nth DMA doorbell on queue (`engine`, `queue`) of the NC (dma_abort and
    /// out_of_bounds only).
    pub at_copy_start: Option<u64>,
    /// `at_copy_start`: the DMA engine.
    pub engine: Option<u32>,
    /// `at_copy_start`: the queue on the engine.
    pub queue: Option<u32>,
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
        if self.at_copy_start.is_none() && (self.engine.is_some() || self.queue.is_some()) {
            return Err("engine and queue apply to at_copy_start faults".into());
        }
        // What simdev refuses to arm, refused here, when the file is read.
        if self.at_execution == Some(0) || self.at_copy_start == Some(0) {
            return Err(format!(
                "fault {}: at_execution and at_copy_start count from 1 (the first)",
                self.kind
            ));
        }
        if let Some(p) = self.per_million.filter(|&p| p > 1_000_000) {
            return Err(format!(
                "fault {}: per_million = {p}, but a probability is at most 1000000 (always)",
                self.kind
            ));
        }
        let when = match (self.at_execution, self.per_million, self.at_copy_start) {
            (None, None, Some(n)) => FaultWhen::NthCopyStart {
                engine: self
                    .engine
                    .ok_or("at_copy_start needs engine (the DMA engine of the NC)")?,
                queue: self
                    .queue
                    .ok_or("at_copy_start needs queue (the queue of the DMA engine)")?,
                n,
            },
            (Some(n), None, None) => {
                if self.seed.is_some() {
                    return Err("seed applies to per_million faults".into());
                }
                FaultWhen::NthExecution(n)
            }
            (None, Some(per_million), None) => FaultWhen::Probability {
                per_million,
                seed: self.seed.unwrap_or(default_seed),
            },
            _ => {
                return Err(format!(
                    "fault {}: give exactly one of at_execution (the Nth execution), \
                     at_copy_start (the Nth DMA doorbell on a queue) or per_million (a seeded \
                     probability)",
                    self.kind
                ));
            }
        };
        Ok(FaultSpec {
            kind,
            nc: self.nc,
            when,
        })
        .and_then(|spec| {
            // The rest of what simdev would refuse to arm (a doorbell fault of a kind no DMA
            // doorbell has), by simdev's own rule.
            simdev::faults::check(&spec)
                .map(|()| spec)
                .map_err(|e| format!("fault {}: {e}", self.kind))
        })
    }
}

/// A status: a name (`"NRT_TIMEOUT"`, `"TIMEOUT"`) or a number (`5`); one that names no
/// NRT_STATUS is refused when the file is read.
#[derive(Clone, Debug)]
pub enum StatusSel {
    /// A number.
    Code(u32),
    /// A name.
    Name(String),
}

impl<'de> Deserialize<'de> for StatusSel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Code(u32),
            Name(String),
        }
        let sel = match Raw::deserialize(d)? {
            Raw::Code(c) => Self::Code(c),
            Raw::Name(n) => Self::Name(n),
        };
        sel.status().map_err(D::Error::custom)?;
        Ok(sel)
    }
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
///
/// Read by value type rather than `untagged`, so a misspelt range key (`{ mn = 1 }`) is
/// refused by name instead of becoming a range that accepts anything.
#[derive(Clone, Debug)]
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

/// The table form of a [`Bound`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RangeKeys {
    min: Option<u64>,
    max: Option<u64>,
}

impl<'de> Deserialize<'de> for Bound {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let invalid = |what: &str| {
            D::Error::custom(format!(
                "a bound is a number, a {{ min, max }} table or a snapshot name, not {what}"
            ))
        };
        match toml::Value::deserialize(d)? {
            toml::Value::Integer(n) => u64::try_from(n)
                .map(Self::Exact)
                .map_err(|_| invalid(&n.to_string())),
            toml::Value::String(name) => Ok(Self::Same(name)),
            toml::Value::Table(t) => {
                let r = RangeKeys::deserialize(toml::Value::Table(t))
                    .map_err(|e| D::Error::custom(e.message()))?;
                Ok(Self::Range {
                    min: r.min,
                    max: r.max,
                })
            }
            other => Err(invalid(other.type_str())),
        }
    }
}

/// Deserializes a list of tables, each into a `T`, and names the failing entry in the error:
/// `{name} {index from 1} ({its tag value})`, then serde's message (`unknown field `x`,
/// expected ...`, `unknown variant ...`, `missing field ...`).
pub(super) fn named_list<'de, D, T>(d: D, name: &str, tag: &str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Vec::<toml::Table>::deserialize(d)?
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let at = match t.get(tag).and_then(toml::Value::as_str) {
                Some(kind) => format!("{name} {} ({kind})", i + 1),
                None => format!("{name} {}", i + 1),
            };
            T::deserialize(toml::Value::Table(t))
                .map_err(|e| D::Error::custom(format!("{at}: {}", e.message())))
        })
        .collect()
}

/// `[[steps]]`: each entry's errors name `step N (action)`.
fn steps<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Step>, D::Error> {
    named_list(d, "step", "action")
}

/// Parses a scenario file's text.
///
/// # Errors
/// The TOML error with its line; or, for a step or check whose keys do not fit its `action` /
/// `what`, serde's message after the entry's position and kind (`step 3 (sleep): unknown field
/// `threads`, expected `ms``). Those come without a line: toml would point at the first entry
/// of the list, not at the one that failed.
pub fn parse(text: &str) -> Result<Scenario, String> {
    let scenario: Scenario = toml::from_str(text).map_err(|e| {
        if names_its_entry(e.message()) {
            e.message().to_string()
        } else {
            e.to_string()
        }
    })?;
    scenario.check_faults()?;
    scenario.check_bounds()?;
    scenario.check_names()?;
    scenario.check_sizes()?;
    scenario.check_references()?;
    Ok(scenario)
}

/// The snapshot names a check's bounds compare with (`same = "name"`), and whether the check
/// takes them at all (`stale_notifications` and `sim_time` do not).
fn snapshot_names(c: &Check) -> (Vec<&str>, bool) {
    fn same(b: Option<&Bound>) -> Option<&str> {
        match b {
            Some(Bound::Same(name)) => Some(name.as_str()),
            _ => None,
        }
    }
    match c {
        Check::Counters(c) => (
            c.bounds().iter().filter_map(|(_, b)| same(*b)).collect(),
            true,
        ),
        Check::DeviceStats(c) => (
            c.bounds().iter().filter_map(|(_, b)| same(*b)).collect(),
            true,
        ),
        Check::StaleNotifications(c) => (same(c.count.as_ref()).into_iter().collect(), false),
        Check::SimTime(c) => (same(c.ns.as_ref()).into_iter().collect(), false),
        Check::NoLeaks(_) | Check::XuHealth(_) | Check::Simdev(_) => (Vec::new(), true),
    }
}

impl Scenario {
    /// What the file names is there before anything runs: a `load` or `cycles` step's
    /// `[models]` name; a snapshot a check compares with, recorded by an earlier step (or the
    /// automatic `baseline`); no `host_tensors` with an `async` execute (the explicit async
    /// API takes device tensors only). Found at run time, each of these failed a step after
    /// the earlier steps had run, typo and all.
    fn check_references(&self) -> Result<(), String> {
        let defined = |n: usize, kind: &str, model: Option<&str>| -> Result<(), String> {
            let name = model.unwrap_or_default();
            if self.models.contains_key(name) {
                return Ok(());
            }
            let known: Vec<&str> = self.models.keys().map(String::as_str).collect();
            Err(match model {
                None => format!("step {n} ({kind}): no model: give model = one of {known:?}"),
                Some(m) => {
                    format!("step {n} ({kind}): model {m:?} is not in [models] (it has {known:?})")
                }
            })
        };
        let compare = |at: &str, c: &Check, taken: &BTreeSet<&str>| -> Result<(), String> {
            let (names, takes_them) = snapshot_names(c);
            if let Some(name) = names.first()
                && !takes_them
            {
                return Err(format!(
                    "{at} ({}): compares with snapshot {name:?}, but this check takes no \
                     snapshot names",
                    c.what()
                ));
            }
            for name in names {
                if !taken.contains(name) {
                    return Err(format!(
                        "{at} ({}): snapshot {name:?} is not taken before it (taken: {:?})",
                        c.what(),
                        taken
                    ));
                }
            }
            Ok(())
        };
        let mut taken: BTreeSet<&str> = BTreeSet::from(["baseline"]);
        for (i, step) in self.steps.iter().enumerate() {
            let n = i + 1;
            match &step.action {
                Action::Load(s) => defined(n, "load", s.model.as_deref())?,
                Action::Cycles(s) => {
                    defined(n, "cycles", s.model.as_deref())?;
                    taken.insert(s.name.as_deref().unwrap_or("warmup"));
                }
                Action::Snapshot(s) => {
                    taken.insert(s.name.as_deref().unwrap_or_default());
                }
                Action::Check(cs) => {
                    for (j, c) in cs.check.iter().enumerate() {
                        compare(&format!("step {n} check {}", j + 1), c, &taken)?;
                    }
                }
                Action::Execute(e) if e.mode == ExecMode::Async && e.host_tensors == Some(true) => {
                    return Err(format!(
                        "step {n} (execute): host_tensors = true with mode = \"async\": the \
                         explicit async API takes device tensors only (host_tensors is for sync)"
                    ));
                }
                _ => {}
            }
        }
        for (i, c) in self.expect.iter().enumerate() {
            compare(&format!("expect {}", i + 1), c, &taken)?;
        }
        Ok(())
    }

    /// Background `execute` names and client names are unique while in use: a second
    /// background step (client) of a name before the first is joined (waited for or killed)
    /// would leave the first one unjudged. A `wait_client` or `kill_client` names a client
    /// that is running.
    fn check_names(&self) -> Result<(), String> {
        /// A client a `wait_client` or `kill_client` ends: one spawned and not ended before.
        fn ended(
            clients: &mut BTreeMap<&str, usize>,
            n: usize,
            action: &str,
            name: Option<&str>,
        ) -> Result<(), String> {
            let name = name.unwrap_or("client");
            clients.remove(name).map(|_| ()).ok_or_else(|| {
                let running: Vec<&str> = clients.keys().copied().collect();
                format!(
                    "step {n} ({action}): no client {name:?} is running (spawn_client it \
                     first; running: {running:?})"
                )
            })
        }
        let mut background: BTreeMap<&str, usize> = BTreeMap::new();
        let mut clients: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, step) in self.steps.iter().enumerate() {
            let n = i + 1;
            match &step.action {
                Action::Execute(e) => {
                    if let Some(name) = e.background.as_deref()
                        && let Some(j) = background.insert(name, n)
                    {
                        return Err(format!(
                            "step {n} (execute): background {name:?} of step {j} is not joined yet: \
                             join it first, or give this one another name"
                        ));
                    }
                }
                Action::Join(j) => {
                    background.remove(j.name.as_deref().unwrap_or_default());
                }
                Action::SpawnClient(c) => {
                    let name = c.name.as_deref().unwrap_or("client");
                    if let Some(j) = clients.insert(name, n) {
                        return Err(format!(
                            "step {n} (spawn_client): client {name:?} of step {j} has not ended: \
                             wait_client or kill_client it first, or give this one another name"
                        ));
                    }
                }
                Action::WaitClient(c) => {
                    ended(&mut clients, n, "wait_client", c.name.as_deref())?;
                }
                Action::KillClient(c) => {
                    ended(&mut clients, n, "kill_client", c.name.as_deref())?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Counts that must be at least 1 (and NCs within simdev's range) are, named by their key.
    fn check_sizes(&self) -> Result<(), String> {
        if let Some(ncs) = self.device.ncs
            && !(1..=simdev::config::MAX_NCS).contains(&ncs)
        {
            return Err(format!(
                "[device] ncs = {ncs}: a device has 1 to {} NCs",
                simdev::config::MAX_NCS
            ));
        }
        if self.runtime.xu_capacity == 0 {
            return Err("[runtime] xu_capacity = 0: an XU queue needs at least 1 slot".to_string());
        }
        for (i, step) in self.steps.iter().enumerate() {
            if let Action::Execute(e) = &step.action
                && e.threads == Some(0)
            {
                return Err(format!(
                    "step {} (execute): threads = 0: at least 1 thread runs the executions",
                    i + 1
                ));
            }
        }
        Ok(())
    }

    /// Every counters and device_stats check names at least one bound: one naming none would
    /// pass having checked nothing. No range is empty (`min` above `max` holds for no value),
    /// and a check's NC is one the device has.
    fn check_bounds(&self) -> Result<(), String> {
        /// The most bytes a `tensor_op` step moves.
        const TENSOR_OP_MAX_BYTES: u64 = 1 << 30;
        let ncs = self
            .device
            .ncs
            .unwrap_or_else(|| self.device.arch.default_nc_count());
        let empty = |c: &Check| match c {
            Check::Counters(c) => c.bounds().iter().all(|(_, b)| b.is_none()),
            Check::DeviceStats(c) => c.bounds().iter().all(|(_, b)| b.is_none()),
            _ => false,
        };
        let why = "names no bound: give at least one (e.g. executions = 3)";
        let sound = |at: &str, c: &Check| -> Result<(), String> {
            let (bounds, nc): (Vec<(&str, Option<&Bound>)>, Option<u32>) = match c {
                Check::Counters(c) => (c.bounds().to_vec(), c.nc),
                Check::DeviceStats(c) => (c.bounds().to_vec(), None),
                Check::StaleNotifications(c) => (vec![("count", c.count.as_ref())], None),
                Check::SimTime(c) => (vec![("ns", c.ns.as_ref())], c.nc.max(c.minus_nc)),
                Check::NoLeaks(_) | Check::XuHealth(_) | Check::Simdev(_) => (Vec::new(), None),
            };
            for (key, b) in bounds {
                if let Some(Bound::Range {
                    min: Some(lo),
                    max: Some(hi),
                }) = b
                    && lo > hi
                {
                    return Err(format!(
                        "{at} ({}): {key} = {{ min = {lo}, max = {hi} }} holds for no value",
                        c.what()
                    ));
                }
            }
            match nc {
                Some(nc) if nc >= ncs => Err(format!(
                    "{at} ({}): nc = {nc}, but the device has {ncs} NCs ({} by [device])",
                    c.what(),
                    self.device.arch.name()
                )),
                _ => Ok(()),
            }
        };
        for (i, c) in self.expect.iter().enumerate() {
            if empty(c) {
                return Err(format!("expect {} ({}): {why}", i + 1, c.what()));
            }
            sound(&format!("expect {}", i + 1), c)?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            // The step builds its bytes in this process: a size is refused here, not by an
            // allocation failing.
            if let Action::TensorOp(t) = &step.action
                && let Some(b) = t.bytes
                && !(1..=TENSOR_OP_MAX_BYTES).contains(&b)
            {
                return Err(format!(
                    "step {} (tensor_op): bytes = {b}: must be 1 to {TENSOR_OP_MAX_BYTES} (1 GiB)",
                    i + 1
                ));
            }
            if let Action::Check(cs) = &step.action {
                for (j, c) in cs.check.iter().enumerate() {
                    if empty(c) {
                        return Err(format!(
                            "step {} check {} ({}): {why}",
                            i + 1,
                            j + 1,
                            c.what()
                        ));
                    }
                    sound(&format!("step {} check {}", i + 1, j + 1), c)?;
                }
            }
            // Each execution's status, in order: as many as there are executions.
            if let Action::Execute(e) = &step.action
                && let Some(each) = &e.expect_each
            {
                let count = e.count.unwrap_or(1);
                if each.len() as u64 != count {
                    return Err(format!(
                        "step {} (execute): expect_each lists {} statuses for count = {count} \
                         executions (one per execution, in order)",
                        i + 1,
                        each.len()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every fault — of `[[faults]]` and of `fault` steps — as simdev would be asked to arm
    /// it: its kind, its keys and its NC (below the device's NC count), before anything runs.
    fn check_faults(&self) -> Result<(), String> {
        let ncs = self
            .device
            .ncs
            .unwrap_or_else(|| self.device.arch.default_nc_count());
        let check = |f: &FaultEntry| -> Result<(), String> {
            f.spec(self.device.seed)?;
            match f.nc {
                Some(nc) if nc >= ncs => Err(format!(
                    "nc = {nc}, but the device has {ncs} NCs ({} by [device])",
                    self.device.arch.name()
                )),
                _ => Ok(()),
            }
        };
        for (i, f) in self.faults.iter().enumerate() {
            check(f).map_err(|e| format!("fault {}: {e}", i + 1))?;
        }
        for (i, step) in self.steps.iter().enumerate() {
            if let Action::Fault(f) = &step.action {
                check(f).map_err(|e| format!("step {} (fault): {e}", i + 1))?;
            }
        }
        Ok(())
    }
}

/// Whether an error message starts as [`named_list`] starts it (`step 3 `, `expect 1:`).
fn names_its_entry(message: &str) -> bool {
    ["step ", "expect "].iter().any(|p| {
        message
            .strip_prefix(p)
            .map(|rest| rest.trim_start_matches(|c: char| c.is_ascii_digit()))
            .is_some_and(|rest| {
                rest.len() < message.len() - p.len() && rest.starts_with([' ', ':'])
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_run_would_refuse_is_refused_when_the_file_is_read() {
        let refused = |text: &str, want: &str| {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        };
        // A doorbell fault of a kind no DMA doorbell has (simdev's own rule).
        refused(
            "[[faults]]\nkind = \"missing_completion\"\nat_copy_start = 1\nengine = 0\nqueue = 0\n",
            "fault 1: fault missing_completion: NthCopyStart fires only dma_abort or out_of_bounds",
        );
        // A range that holds for no value.
        refused(
            "[[steps]]\naction = \"check\"\n[[steps.check]]\nwhat = \"counters\"\nnc = 0\n\
             executions = { min = 5, max = 1 }\n",
            "step 1 check 1 (counters): executions = { min = 5, max = 1 } holds for no value",
        );
        // An NC the device does not have, in a check and in an expectation.
        refused(
            "[[steps]]\naction = \"check\"\n[[steps.check]]\nwhat = \"counters\"\nnc = 9\n\
             executions = 1\n",
            "step 1 check 1 (counters): nc = 9, but the device has 2 NCs (trn1 by [device])",
        );
        refused(
            "[[expect]]\nwhat = \"sim_time\"\nnc = 0\nminus_nc = 4\nns = 1\n",
            "expect 1 (sim_time): nc = 4, but the device has 2 NCs",
        );
        // One status per execution.
        refused(
            "[models.m]\nbuilder = \"identity\"\n[[steps]]\naction = \"init\"\n\
             [[steps]]\naction = \"load\"\nmodel = \"m\"\n[[steps]]\naction = \"execute\"\n\
             model = \"m\"\ncount = 3\nexpect_each = [\"NRT_SUCCESS\"]\n",
            "step 3 (execute): expect_each lists 1 statuses for count = 3 executions",
        );
        // A client that was never spawned, or has already ended.
        refused(
            "[[steps]]\naction = \"kill_client\"\nname = \"ghost\"\n",
            "step 1 (kill_client): no client \"ghost\" is running",
        );
        refused(
            "[[steps]]\naction = \"spawn_client\"\nname = \"a\"\n\
             [[steps]]\naction = \"kill_client\"\nname = \"a\"\n\
             [[steps]]\naction = \"wait_client\"\nname = \"a\"\n",
            "step 3 (wait_client): no client \"a\" is running",
        );
    }

    #[test]
    fn statuses_parse_by_name_short_name_and_number() {
        assert_eq!(parse_status("NRT_TIMEOUT"), Ok(NrtStatus::Timeout));
        assert_eq!(parse_status("timeout"), Ok(NrtStatus::Timeout));
        assert_eq!(parse_status("101"), Ok(NrtStatus::ExecUnitUnrecoverable));
        assert!(parse_status("NRT_NOPE").is_err());
    }

    #[test]
    fn unknown_statuses_and_faults_that_cannot_be_armed_are_refused_when_read() {
        let e = parse("[[steps]]\naction = \"init\"\nexpect = \"NRT_SUCCES\"\n").unwrap_err();
        assert!(
            e.contains("\"NRT_SUCCES\" is not an NRT_STATUS name"),
            "{e}"
        );
        let e = parse("[[faults]]\nkind = \"dma_abrot\"\nat_execution = 1\n").unwrap_err();
        assert!(
            e.starts_with("fault 1: fault kind \"dma_abrot\" is not one of"),
            "{e}"
        );
        let e = parse("[[faults]]\nkind = \"dma_abort\"\n").unwrap_err();
        assert!(e.starts_with("fault 1: "), "{e}");
        let e = parse("[[faults]]\nkind = \"dma_abort\"\nnc = 7\nat_execution = 1\n").unwrap_err();
        assert_eq!(
            e,
            "fault 1: nc = 7, but the device has 2 NCs (trn1 by [device])"
        );
        let e = parse(
            "[[steps]]\naction = \"sleep\"\nms = 1\n[[steps]]\naction = \"fault\"\nkind = \"x\"\nat_execution = 1\n",
        )
        .unwrap_err();
        assert!(e.starts_with("step 2 (fault): fault kind \"x\""), "{e}");
        parse("[device]\narch = \"trn2\"\n[[faults]]\nkind = \"dma_abort\"\nnc = 7\nat_execution = 1\n")
            .unwrap();
        // What simdev would refuse to arm mid-run.
        let e = parse("[[faults]]\nkind = \"dma_abort\"\nat_execution = 0\n").unwrap_err();
        assert!(e.contains("count from 1"), "{e}");
        let e =
            parse("[[steps]]\naction = \"fault\"\nkind = \"numerical\"\nper_million = 2000000\n")
                .unwrap_err();
        assert!(
            e.starts_with("step 1 (fault): ") && e.contains("at most 1000000"),
            "{e}"
        );
        parse("[[faults]]\nkind = \"numerical\"\nper_million = 1000000\n").unwrap();
        // A check naming no bound would pass having checked nothing.
        let e = parse("[[expect]]\nwhat = \"counters\"\nnc = 0\n").unwrap_err();
        assert!(e.starts_with("expect 1 (counters): names no bound"), "{e}");
        let e = parse("[[steps]]\naction = \"check\"\n[[steps.check]]\nwhat = \"device_stats\"\n")
            .unwrap_err();
        assert!(e.starts_with("step 1 check 1 (device_stats)"), "{e}");
    }

    #[test]
    fn a_tensor_op_of_no_bytes_or_of_more_than_a_gib_is_refused_before_anything_runs() {
        for (bytes, ok) in [
            (0u64, false),
            (1, true),
            (1 << 30, true),
            ((1 << 30) + 1, false),
        ] {
            let r = parse(&format!(
                "[[steps]]\naction = \"tensor_op\"\nbytes = {bytes}\n"
            ));
            match (r, ok) {
                (Ok(_), true) => {}
                (Err(e), false) => assert!(
                    e.starts_with("step 1 (tensor_op): bytes = ") && e.contains("1 GiB"),
                    "{e}"
                ),
                (r, _) => panic!("bytes = {bytes}: {:?}", r.map(|_| ())),
            }
        }
    }

    #[test]
    fn a_model_snapshot_or_host_tensor_that_cannot_be_is_refused_before_anything_runs() {
        const MODELS: &str = "[models.id]\nbuilder = \"identity\"\n";
        let e = parse(&format!("{MODELS}[[steps]]\naction = \"load\"\n")).unwrap_err();
        assert_eq!(e, "step 1 (load): no model: give model = one of [\"id\"]");
        let e = parse(&format!(
            "{MODELS}[[steps]]\naction = \"sleep\"\nms = 1\n[[steps]]\naction = \"cycles\"\nmodel = \"idd\"\n"
        ))
        .unwrap_err();
        assert_eq!(
            e,
            "step 2 (cycles): model \"idd\" is not in [models] (it has [\"id\"])"
        );
        parse(&format!(
            "{MODELS}[[steps]]\naction = \"load\"\nmodel = \"id\"\n"
        ))
        .unwrap();
        // A snapshot is compared with only after the step that takes it.
        let check = "[[steps]]\naction = \"check\"\n[[steps.check]]\nwhat = \"counters\"\nexecutions = \"s\"\n";
        let snap = "[[steps]]\naction = \"snapshot\"\nname = \"s\"\n";
        let e = parse(&format!("{check}{snap}")).unwrap_err();
        assert!(
            e.starts_with("step 1 check 1 (counters): snapshot \"s\" is not taken before it"),
            "{e}"
        );
        parse(&format!("{snap}{check}")).unwrap();
        let expect = "[[expect]]\nwhat = \"device_stats\"\nchunks = \"warmup\"\n";
        let e = parse(expect).unwrap_err();
        assert!(
            e.starts_with("expect 1 (device_stats): snapshot \"warmup\""),
            "{e}"
        );
        // `cycles` takes `warmup` unless named; `baseline` is always there.
        parse(&format!(
            "{MODELS}[[steps]]\naction = \"cycles\"\nmodel = \"id\"\n{expect}"
        ))
        .unwrap();
        parse("[[expect]]\nwhat = \"device_stats\"\nchunks = \"baseline\"\n").unwrap();
        let e = parse("[[expect]]\nwhat = \"sim_time\"\nns = \"baseline\"\n").unwrap_err();
        assert!(e.contains("this check takes no snapshot names"), "{e}");
        // The explicit async API takes device tensors only.
        let e = parse("[[steps]]\naction = \"execute\"\nmode = \"async\"\nhost_tensors = true\n")
            .unwrap_err();
        assert!(
            e.starts_with("step 1 (execute): host_tensors = true with mode = \"async\""),
            "{e}"
        );
        parse("[[steps]]\naction = \"execute\"\nmode = \"async\"\nhost_tensors = false\n").unwrap();
    }

    #[test]
    fn seconds_that_no_duration_holds_are_refused_naming_the_key() {
        let e = parse("time_limit_s = 1e20\n").unwrap_err();
        assert!(
            e.contains("line 1") && e.contains("at most 4294967295 seconds"),
            "{e}"
        );
        let e = parse("[runtime]\nexec_timeout = 1e20\n").unwrap_err();
        assert!(e.contains("exec_timeout") && e.contains("at most"), "{e}");
        let e = parse("[runtime]\nexec_timeout = 0\n").unwrap_err();
        assert!(e.contains("must be a positive number of seconds"), "{e}");
        let e =
            parse("[[expect]]\nwhat = \"simdev\"\nrunning = true\nwithin_s = 1e20\n").unwrap_err();
        assert!(e.starts_with("expect 1") && e.contains("at most"), "{e}");
        let e = parse("[[steps]]\naction = \"wait_client\"\nwithin_s = -1\n").unwrap_err();
        assert!(e.starts_with("step 1") && e.contains("0 or more"), "{e}");
        let e = parse("[[steps]]\naction = \"init\"\nmax_step_s = inf\n").unwrap_err();
        assert!(e.starts_with("step 1"), "{e}");
        parse("time_limit_s = 4294967295\n[[expect]]\nwhat = \"simdev\"\nrunning = true\nwithin_s = 0\n")
            .unwrap();
    }

    #[test]
    fn a_name_in_use_and_counts_of_zero_are_refused_when_read() {
        let bg = |name: &str| {
            format!("[[steps]]\naction = \"execute\"\nmodel = \"m\"\nbackground = \"{name}\"\n")
        };
        let join = "[[steps]]\naction = \"join\"\nname = \"x\"\n";
        let e = parse(&format!("{}{}", bg("x"), bg("x"))).unwrap_err();
        assert_eq!(
            e,
            "step 2 (execute): background \"x\" of step 1 is not joined yet: join it first, or give this one another name"
        );
        parse(&format!("{}{}{}{}", bg("x"), bg("y"), join, bg("x"))).unwrap();
        let spawn = "[[steps]]\naction = \"spawn_client\"\n";
        let e = parse(&format!("{spawn}{spawn}")).unwrap_err();
        assert!(
            e.starts_with("step 2 (spawn_client): client \"client\" of step 1"),
            "{e}"
        );
        parse(&format!(
            "{spawn}[[steps]]\naction = \"kill_client\"\n{spawn}"
        ))
        .unwrap();
        let e = parse("[[steps]]\naction = \"execute\"\nmodel = \"m\"\nthreads = 0\n").unwrap_err();
        assert!(e.starts_with("step 1 (execute): threads = 0"), "{e}");
        let e = parse("[runtime]\nxu_capacity = 0\n").unwrap_err();
        assert!(e.starts_with("[runtime] xu_capacity = 0"), "{e}");
        for ncs in [0, 9] {
            let e = parse(&format!("[device]\nncs = {ncs}\n")).unwrap_err();
            assert_eq!(e, format!("[device] ncs = {ncs}: a device has 1 to 8 NCs"));
        }
    }

    #[test]
    fn an_unknown_arch_is_refused_with_its_line() {
        let e = parse("[device]\narch = \"trn3\"\n").unwrap_err();
        assert!(
            e.contains("line 2") && e.contains("unknown arch \"trn3\": trn1, inf2 or trn2"),
            "{e}"
        );
        let s = parse("[device]\narch = \"inf2\"\n").unwrap();
        assert_eq!(s.device.arch, shared::Arch::Inf2);
        assert_eq!(parse("").unwrap().device.arch, shared::Arch::Trn1);
    }

    #[test]
    fn misplaced_and_misspelt_keys_are_refused() {
        let e = parse("[[steps]]\naction = \"sleep\"\nthreads = 2\n").unwrap_err();
        assert!(
            e.starts_with("step 1 (sleep): unknown field `threads`, expected `ms`"),
            "{e}"
        );
        let e = parse("[[steps]]\naction = \"sleep\"\nmss = 2\n").unwrap_err();
        assert!(e.contains("mss"), "{e}");
        let e = parse("[[expect]]\nwhat = \"counters\"\nhealth = \"x\"\n").unwrap_err();
        assert!(
            e.starts_with("expect 1 (counters): unknown field `health`"),
            "{e}"
        );
        parse("[[steps]]\naction = \"sleep\"\nms = 2\n").unwrap();
    }

    #[test]
    fn faults_need_one_trigger() {
        let f = |at: Option<u64>, pm: Option<u32>| FaultEntry {
            kind: "numerical".into(),
            nc: None,
            at_execution: at,
            at_copy_start: None,
            engine: None,
            queue: None,
            per_million: pm,
            seed: None,
            delay_ms: None,
            ns: None,
        };
        assert!(f(None, None).spec(0).is_err());
        assert!(f(Some(1), Some(1)).spec(0).is_err());
        let doorbell = FaultEntry {
            kind: "dma_abort".into(),
            at_execution: None,
            at_copy_start: Some(2),
            engine: Some(15),
            queue: Some(12),
            ..f(None, None)
        };
        assert_eq!(
            doorbell.spec(0).unwrap().when,
            FaultWhen::NthCopyStart {
                engine: 15,
                queue: 12,
                n: 2
            }
        );
        let no_queue = FaultEntry {
            queue: None,
            ..doorbell.clone()
        };
        assert!(no_queue.spec(0).unwrap_err().contains("needs queue"));
        let stray = FaultEntry {
            at_copy_start: None,
            at_execution: Some(1),
            ..doorbell
        };
        assert!(
            stray
                .spec(0)
                .unwrap_err()
                .contains("apply to at_copy_start")
        );
        assert_eq!(
            f(None, Some(5)).spec(9).unwrap().when,
            FaultWhen::Probability {
                per_million: 5,
                seed: 9
            }
        );
    }

    #[test]
    fn every_scenario_file_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|x| x == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 23, "{n} scenario files");
    }

    #[test]
    fn only_list_errors_drop_the_toml_position() {
        assert!(names_its_entry("step 3 (sleep): unknown field `x`"));
        assert!(names_its_entry("expect 1: missing field `what`"));
        assert!(!names_its_entry("step into it"));
        assert!(!names_its_entry("expected one of `a`"));
        let e = parse("nme = 1\n").unwrap_err();
        assert!(e.starts_with("TOML parse error at line 1"), "{e}");
    }
}
