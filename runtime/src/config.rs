//! Runtime configuration from libnrt's environment variables (DESIGN §9,
//! `reference/nrt-api.md` §3), read at `nrt_init` (the load-time ones again at each `nrt_load`).
//!
//! | variable | meaning |
//! |---|---|
//! | `NEURON_RT_VISIBLE_CORES` | exact logical cores: `3`, `3-5`, `3-5,6` (contiguous, increasing); wins over NUM_CORES |
//! | `NEURON_RT_NUM_CORES` | reserve N *free* logical cores, the runtime choosing (0 = all) |
//! | `NEURON_RT_RESET_CORES` | reset each reserved NC at init (default 1; 0 skips) |
//! | `NEURON_RT_EXEC_TIMEOUT` | seconds per execution before NRT_TIMEOUT (default 30; fractions allowed); read again at each load ([`RuntimeConfig::at_load`]) |
//! | `NEURON_LOGICAL_NC_CONFIG` | physical NCs per logical core: 1 or 2 (2 only on trn2); default libnrt's: 2 on trn2, 1 elsewhere ([`RuntimeConfig::lnc_on`]) |
//! | `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS` | > 0 selects the implicit async pool (`async_pool`) with that many executions in flight per logical core, at most 63 |
//! | `NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION` | ours: 0 disables the model-switch skip-config optimisation (`reload_seq_config` always 1); default 1 |
//! | `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY` | `critical`: report NaN/Inf results as NRT_EXEC_COMPLETED_WITH_NUM_ERR (1003); `none` (default, as libnrt since 2.25): the execution returns success. The outputs are delivered either way |
//! | `NEURON_FAIL_ON_NAN` | 1: the same as `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical` |
//! | `NEURON_RT_VALIDATE_HASH` | 1: `nrt_load` checks a NEFF's header hash (the MD5 of its payload) and refuses a mismatch; default 0, as libnrt; read again at each load |
//! | `NEURON_RT_DATASTORE` | ours: `off` (or 0) keeps the runtime's counters in private memory instead of the shared datastore file ([`crate::datastore`]); default on |
//! | `NEURON_RT_DATASTORE_DIR` | ours: the directory of the datastore files `nrt-datastore-<pid>` (default `/dev/shm`, else the temp dir) |
//! | `NEURON_RT_FUNTIME` | ours: 1 makes `execute` return success without touching a device (the seed's `gconf()->funtime` short-circuit) |
//! | `NEURON_RT_TRACE` | ours: a file path; the runtime records its execution spans and the device's events and writes them there as one Perfetto timeline at close (`crate::trace`) |

use std::time::Duration;

use shared::{Arch, NrtStatus};

/// Parsed configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeConfig {
    /// Logical cores requested by `NEURON_RT_VISIBLE_CORES` (first, count), if set.
    pub visible_cores: Option<(u32, u32)>,
    /// `NEURON_RT_NUM_CORES` (0 = all available).
    pub num_cores: u32,
    /// Per-execution timeout.
    pub exec_timeout: Duration,
    /// `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`, at most 63.
    pub async_max_inflight: u32,
    /// The value `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS` asked for when it was above the
    /// limit of 63 ([`RuntimeConfig::log_notes`] says so once per `nrt_init`).
    pub async_max_inflight_asked: Option<u32>,
    /// The skip-config optimisation (`enable_model_switch_skip_tpb_config_optimization`).
    pub skip_config_optimization: bool,
    /// The funtime short-circuit.
    pub funtime: bool,
    /// Slots of each vNC's XU queue.
    pub xu_capacity: usize,
    /// Physical NCs per logical core (`NEURON_LOGICAL_NC_CONFIG`): 1 or 2; `None` (unset) is the
    /// device's default, known once the device is ([`RuntimeConfig::lnc_on`]). A runtime's
    /// own config holds the resolved value.
    pub lnc: Option<u32>,
    /// Report numerical errors as NRT_EXEC_COMPLETED_WITH_NUM_ERR
    /// (`NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical` or `NEURON_FAIL_ON_NAN=1`); off by
    /// default, as in libnrt since 2.25.
    pub report_numerical_errors: bool,
    /// `NEURON_RT_RESET_CORES`: reset every reserved NC at init.
    pub reset_cores: bool,
    /// `NEURON_RT_VALIDATE_HASH`: check a NEFF's header hash at load (off by default).
    pub validate_hash: bool,
    /// `NEURON_RT_TRACE`: the Perfetto timeline file written at close ([`crate::trace`]);
    /// `None` (the default) records nothing.
    pub trace_file: Option<std::path::PathBuf>,
    /// `NEURON_RT_DATASTORE`: publish the counters in a shared datastore file (default on).
    pub datastore: bool,
    /// `NEURON_RT_DATASTORE_DIR`: where the datastore file goes (`None`:
    /// [`crate::datastore::default_dir`]).
    pub datastore_dir: Option<std::path::PathBuf>,
}

/// Which logical cores `nrt_init` reserves ([`RuntimeConfig::select_vncs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreSelection {
    /// Exactly these (`NEURON_RT_VISIBLE_CORES`, or every core): a busy one is an error.
    Fixed {
        /// The first logical core.
        first: u32,
        /// How many, contiguous.
        count: u32,
    },
    /// Any `count` free ones (`NEURON_RT_NUM_CORES`), tried in index order, busy ones skipped.
    Free {
        /// How many.
        count: u32,
    },
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            visible_cores: None,
            num_cores: 0,
            exec_timeout: Duration::from_secs(30),
            async_max_inflight: 0,
            async_max_inflight_asked: None,
            skip_config_optimization: true,
            funtime: false,
            xu_capacity: 16,
            lnc: None,
            report_numerical_errors: false,
            reset_cores: true,
            validate_hash: false,
            trace_file: None,
            datastore: true,
            datastore_dir: None,
        }
    }
}

/// The sync wait budget on the simulator platform (`tdrv_get_platform_type() ∈ {1, 2}`): 432000 s.
pub const SIMULATOR_WAIT_BUDGET: Duration = Duration::from_secs(432_000);

/// What `tdrv_get_platform_type` answers, as the runtime knows it: from the backend it opened
/// (`sim` is the simulator platform, `neuron` — the kernel driver — is hardware).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// simdev (libnrt's platform types 1 and 2).
    Simulator,
    /// Real devices through `/dev/neuronN`.
    Hardware,
}

impl Platform {
    /// The platform of a backend named `backend_name` ([`crate::Device::backend_name`]):
    /// `"sim"` is the simulator; anything else drives hardware.
    pub fn of_backend(backend_name: &str) -> Self {
        if backend_name == "sim" {
            Self::Simulator
        } else {
            Self::Hardware
        }
    }
}

/// The longest time a setting may hold, in seconds (`u32::MAX`, about 136 years): every
/// such setting converts to a `Duration`, an `Instant` plus it does not overflow, and three
/// quarters of it in milliseconds fits the private simdev's `--reference-timeout`.
pub const MAX_SECONDS: f64 = u32::MAX as f64;

/// `secs` as a `Duration` when it is a number of seconds from 0 (above 0 when `positive`) to
/// [`MAX_SECONDS`].
///
/// # Errors
/// What is wrong with it.
pub fn check_seconds(secs: f64, positive: bool) -> Result<Duration, String> {
    if secs.is_infinite() && secs > 0.0 {
        return Err(format!("at most {MAX_SECONDS} seconds (about 136 years)"));
    }
    if secs.is_nan() || secs < 0.0 || (positive && secs == 0.0) {
        return Err(if positive {
            "must be a positive number of seconds".into()
        } else {
            "must be a number of seconds, 0 or more".into()
        });
    }
    if secs > MAX_SECONDS {
        return Err(format!("at most {MAX_SECONDS} seconds (about 136 years)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A bad configuration value.
#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong.
    pub why: String,
}

impl ConfigError {
    /// `nrt_init` reports configuration errors as NRT_INVALID.
    pub fn status(&self) -> NrtStatus {
        NrtStatus::Invalid
    }
}

/// Parses a `NEURON_RT_VISIBLE_CORES` value into (first core, count): `"3"`, `"3-6"`, `"3-5,6"`.
/// The cores must be contiguous and increasing.
///
/// # Errors
/// A message naming the problem.
pub fn parse_visible_cores(value: &str) -> Result<(u32, u32), String> {
    // (first core, last core) so far: ranges are checked as they come, never expanded (a
    // range of four billion cores is one comparison, not a vector of them).
    let mut span: Option<(u32, u32)> = None;
    for part in value.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(format!(
                "{value:?} has an empty entry (two commas in a row, or one at an end)"
            ));
        }
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let a: u32 = a
            .parse()
            .map_err(|_| format!("{part:?} is not a core index or range"))?;
        let b: u32 = b
            .parse()
            .map_err(|_| format!("{part:?} is not a core index or range"))?;
        if b < a {
            return Err(format!("range {part:?} is decreasing"));
        }
        span = match span {
            None => Some((a, b)),
            Some((first, last)) if last.checked_add(1) == Some(a) => Some((first, b)),
            Some(_) => return Err("cores must be contiguous and increasing".into()),
        };
    }
    let Some((first, last)) = span else {
        return Err("no cores listed".into());
    };
    let count = (last - first)
        .checked_add(1)
        .ok_or_else(|| "too many cores".to_string())?;
    Ok((first, count))
}

/// Parses `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY`: whether numerical errors are reported.
///
/// # Errors
/// A message naming the accepted values.
pub fn parse_numerical_errors_verbosity(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "critical" => Ok(true),
        "none" => Ok(false),
        _ => Err("expected critical (report NaNs as 1003) or none (the default)".into()),
    }
}

/// `NEURON_RT_LOG_LEVEL` as a `tracing` filter directive. libnrt's names — ERROR, WARN or
/// WARNING, INFO, DEBUG, TRACE, and QUIET for nothing — in any case become that level for
/// everything; a value with `=` is a `tracing` directive list (`runtime=debug,simdev=info`),
/// passed on as it is.
///
/// # Errors
/// Any other value, with a message naming the names taken: `tracing` would read a bare word
/// as a target and silence every other line, errors included.
pub fn log_directive(value: &str) -> Result<String, String> {
    let v = value.trim();
    let level = match v.to_ascii_lowercase().as_str() {
        "error" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        "quiet" | "off" => "off",
        _ if v.contains('=') => return Ok(v.to_string()),
        _ => {
            return Err(format!(
                "NEURON_RT_LOG_LEVEL={value:?} is not a level: ERROR, WARN (or WARNING), INFO, \
                 DEBUG, TRACE or QUIET, or tracing directives such as runtime=debug"
            ));
        }
    };
    Ok(level.to_string())
}

/// A boolean variable: 1/0, true/false, yes/no, on/off in any case, with blanks around it
/// ignored; `None` when it is unset or empty (its default applies), as for every variable.
fn parse_bool(var: &'static str, value: Option<String>) -> Result<Option<bool>, ConfigError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        _ => Err(ConfigError {
            var,
            value,
            why: "expected 1/0 or true/false".into(),
        }),
    }
}

/// `NEURON_RT_EXEC_TIMEOUT`: a positive number of seconds (fractions allowed); `None` when
/// unset or empty.
fn parse_exec_timeout(value: Option<String>) -> Result<Option<Duration>, ConfigError> {
    const VAR: &str = "NEURON_RT_EXEC_TIMEOUT";
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let refuse = |why: String| ConfigError {
        var: VAR,
        value: value.clone(),
        why,
    };
    let secs: f64 = value
        .trim()
        .parse()
        .map_err(|_| refuse("not a number of seconds".into()))?;
    check_seconds(secs, true).map(Some).map_err(refuse)
}

/// The variables libnrt reads at `nrt_load`, not at `nrt_init` (nrt-api §3, "at load"): each
/// model keeps the values set when it was loaded. `NEURON_RT_STOCHASTIC_ROUNDING_EN`, the
/// third, has no effect here (simdev's casts round to nearest).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadConfig {
    /// `NEURON_RT_EXEC_TIMEOUT`: the model's executions time out after this.
    pub exec_timeout: Duration,
    /// `NEURON_RT_VALIDATE_HASH`: check the NEFF's header hash.
    pub validate_hash: bool,
}

/// libnrt's variables (nrt-api §3) this runtime does not act on, as exact names or as
/// prefixes ending in `_`. Setting one changes nothing here; `nrt_init` says so
/// ([`unsupported_variables`]).
pub const UNSUPPORTED_VARIABLES: &[&str] = &[
    "NEURON_RT_VIRTUAL_CORE_SIZE",
    "NEURON_RT_LOG_LEVEL_",
    "NEURON_RT_LOG_LOCATION",
    "NEURON_RT_STOCHASTIC_ROUNDING_EN",
    "NEURON_RT_STOCHASTIC_ROUNDING_SEED",
    "NEURON_RT_MULTI_INSTANCE_SHARED_WEIGHTS",
    "NEURON_RT_ALLOW_LEGACY_NEFF",
    "NEURON_RT_ROOT_COMM_ID",
    "NEURON_RT_DBG_",
    "NEURON_RT_DEBUG_",
    "NEURON_RT_ENABLE_DEVICE_MEMORY_OOM_LOG",
    "NEURON_RT_CONTIGUOUS_SCRATCHPAD",
    "NEURON_SCRATCHPAD_PAGE_SIZE",
    "NEURON_RT_ENABLE_DGE_NOTIFICATIONS",
    "NEURON_RT_LOW_LATENCY_TASKS_CPU_AFFINITY",
    "NEURON_RT_ONE_THREAD_PER_CORE",
    "NEURON_RT_RANKS_PER_NETWORK_PROXY",
    "NEURON_RT_GPSIMD_STDOUT_QUEUE_SIZE_BYTES",
    "NEURON_RT_PROFILE_BUF_",
    "NEURON_RT_INSPECT_",
    "NEURON_RT_ASYNC_SENDRECV_",
    "NEURON_RT_ULTRASERVER_",
    "NEURON_RT_LOCAL_CORE_DUMP_DIRECTORY",
    "NEURON_RT_S3_CORE_DUMP_PREFIX",
    "NEURONCORE_GROUP_SIZES",
];

/// Which of `names` (the environment's variable names) are libnrt variables this runtime does
/// not act on ([`UNSUPPORTED_VARIABLES`]), in order.
pub fn unsupported_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names
        .into_iter()
        .filter(|name| {
            UNSUPPORTED_VARIABLES.iter().any(|u| {
                if u.ends_with('_') {
                    name.starts_with(u)
                } else {
                    name == u
                }
            })
        })
        .collect()
}

/// libnrt's logical-core size on a device of `arch` when `NEURON_LOGICAL_NC_CONFIG` is unset:
/// 2 on trn2 (one logical core is a pair of physical NCs), 1 elsewhere (nrt-api.md §3).
#[must_use]
pub const fn default_lnc(arch: Arch) -> u32 {
    match arch {
        Arch::Trn2 => 2,
        Arch::Inf2 | Arch::Trn1 => 1,
    }
}

impl RuntimeConfig {
    /// Physical NCs per logical core on a device of `arch`: `NEURON_LOGICAL_NC_CONFIG`'s value,
    /// else [`default_lnc`].
    ///
    /// # Errors
    /// LNC=2 asked of a device that is not trn2 (the message names its arch); an LNC that is
    /// neither 1 nor 2.
    pub fn lnc_on(&self, arch: Arch) -> Result<u32, String> {
        match self.lnc {
            None => Ok(default_lnc(arch)),
            Some(1) => Ok(1),
            Some(2) if arch == Arch::Trn2 => Ok(2),
            Some(2) => Err(format!(
                "NEURON_LOGICAL_NC_CONFIG=2 needs a trn2 device; this one is {}",
                arch.name()
            )),
            Some(other) => Err(format!("NEURON_LOGICAL_NC_CONFIG={other}: must be 1 or 2")),
        }
    }

    /// `NEURON_LOGICAL_NC_CONFIG` alone, through `get`: what the instance's logical core count
    /// depends on (`nrt_get_total_vnc_count` is unaffected by the other variables, even
    /// malformed ones).
    ///
    /// # Errors
    /// [`ConfigError`] for a value other than 1 or 2.
    pub fn lnc_from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<u32>, ConfigError> {
        let Some(v) = get("NEURON_LOGICAL_NC_CONFIG").filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        match v.trim() {
            "1" => Ok(Some(1)),
            "2" => Ok(Some(2)),
            _ => Err(ConfigError {
                var: "NEURON_LOGICAL_NC_CONFIG",
                value: v,
                why: "must be 1 or 2".into(),
            }),
        }
    }

    /// Reads the variables above from the environment.
    ///
    /// # Errors
    /// [`ConfigError`] naming the variable and the problem.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// `NEURON_RT_DATASTORE` and `NEURON_RT_DATASTORE_DIR` alone, through `get`: where the
    /// counters are published, for a tool that takes every other setting from elsewhere (the
    /// scenario runner's `[runtime]`).
    ///
    /// # Errors
    /// [`ConfigError`] for a `NEURON_RT_DATASTORE` that is no boolean.
    pub fn datastore_from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(bool, Option<std::path::PathBuf>), ConfigError> {
        let mut on = true;
        if let Some(v) = parse_bool("NEURON_RT_DATASTORE", get("NEURON_RT_DATASTORE"))? {
            on = v;
        }
        let dir = get("NEURON_RT_DATASTORE_DIR")
            .filter(|v| !v.trim().is_empty())
            .map(Into::into);
        Ok((on, dir))
    }

    /// Reads the variables through `get` (the environment, or a map in tests).
    ///
    /// # Errors
    /// [`ConfigError`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        let err = |var: &'static str, value: &str, why: String| ConfigError {
            var,
            value: value.into(),
            why,
        };
        if let Some(v) = get("NEURON_RT_VISIBLE_CORES").filter(|v| !v.trim().is_empty()) {
            c.visible_cores = Some(
                parse_visible_cores(&v).map_err(|why| err("NEURON_RT_VISIBLE_CORES", &v, why))?,
            );
        }
        if let Some(v) = get("NEURON_RT_NUM_CORES").filter(|v| !v.trim().is_empty()) {
            c.num_cores = v.trim().parse().map_err(|_| {
                err(
                    "NEURON_RT_NUM_CORES",
                    &v,
                    "not a whole number of cores, 0 (all) or more".into(),
                )
            })?;
        }
        if let Some(t) = parse_exec_timeout(get("NEURON_RT_EXEC_TIMEOUT"))? {
            c.exec_timeout = t;
        }
        if let Some(v) =
            get("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS").filter(|v| !v.trim().is_empty())
        {
            c.async_max_inflight = v.trim().parse().map_err(|_| {
                err(
                    "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
                    &v,
                    "not a number".into(),
                )
            })?;
            if c.async_max_inflight > 63 {
                c.async_max_inflight_asked = Some(c.async_max_inflight);
                c.async_max_inflight = 63;
            }
        }
        if let Some(v) = parse_bool(
            "NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION",
            get("NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION"),
        )? {
            c.skip_config_optimization = v;
        }
        c.lnc = Self::lnc_from_lookup(&get)?;
        if let Some(v) =
            get("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY").filter(|v| !v.trim().is_empty())
        {
            c.report_numerical_errors = parse_numerical_errors_verbosity(&v)
                .map_err(|why| err("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", &v, why))?;
        }
        if let Some(v) = parse_bool("NEURON_FAIL_ON_NAN", get("NEURON_FAIL_ON_NAN"))? {
            c.report_numerical_errors |= v;
        }
        if let Some(v) = parse_bool("NEURON_RT_RESET_CORES", get("NEURON_RT_RESET_CORES"))? {
            c.reset_cores = v;
        }
        if let Some(v) = parse_bool("NEURON_RT_VALIDATE_HASH", get("NEURON_RT_VALIDATE_HASH"))? {
            c.validate_hash = v;
        }
        (c.datastore, c.datastore_dir) = Self::datastore_from_lookup(&get)?;
        if let Some(v) = parse_bool("NEURON_RT_FUNTIME", get("NEURON_RT_FUNTIME"))? {
            c.funtime = v;
        }
        if let Some(v) = get("NEURON_RT_TRACE").filter(|v| !v.trim().is_empty()) {
            c.trace_file = Some(v.into());
        }
        Ok(c)
    }

    /// The load-time variables read through `get` when a model is loaded; one unset (or
    /// empty) then keeps the value read at `nrt_init` (or the default).
    ///
    /// # Errors
    /// [`ConfigError`] for a malformed value.
    pub fn at_load(&self, get: impl Fn(&str) -> Option<String>) -> Result<LoadConfig, ConfigError> {
        Ok(LoadConfig {
            exec_timeout: parse_exec_timeout(get("NEURON_RT_EXEC_TIMEOUT"))?
                .unwrap_or(self.exec_timeout),
            validate_hash: parse_bool("NEURON_RT_VALIDATE_HASH", get("NEURON_RT_VALIDATE_HASH"))?
                .unwrap_or(self.validate_hash),
        })
    }

    /// Logs, once (`nrt_init` calls it; reading the configuration logs nothing, however often a
    /// count before init reads it), what the configuration asks for that deserves a warning:
    /// libnrt variables set that this runtime ignores, the implicit async mode and its limit.
    pub fn log_notes(&self) {
        let set: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        let ignored = unsupported_variables(set.iter().map(String::as_str));
        if !ignored.is_empty() {
            tracing::warn!(
                "{} set, but this runtime does not act on {} (README, Configuration: the libnrt variables it ignores)",
                ignored.join(", "),
                if ignored.len() == 1 { "it" } else { "them" }
            );
        }
        if let Some(asked) = self.async_max_inflight_asked {
            tracing::warn!(
                "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS={asked}: the implicit async in-flight limit is 63; using 63"
            );
        }
        if self.async_max_inflight > 0 {
            // libnrt deprecated the mode with a warning (SDK 2.30) and removed it in the
            // runtime whose API this reports (2.34.10): code tested on it here would take a
            // path the real library ignores.
            tracing::warn!(
                "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS={}: the implicit async mode is deprecated, and libnrt 2.34.10 removed it (there the variable only warns); this runtime keeps it, as seed 000 specifies. Use the nrta_* API for new code",
                self.async_max_inflight_asked
                    .unwrap_or(self.async_max_inflight)
            );
        }
    }

    /// Executions that may be outstanding on one logical core at once: the XU depth or the
    /// implicit-async in-flight limit, whichever is larger (sizes request slots and I/O rings).
    pub fn max_inflight(&self) -> u32 {
        u32::try_from(self.xu_capacity)
            .unwrap_or(u32::MAX)
            .max(self.async_max_inflight)
    }

    /// The sync path's wait budget (seed 000 §6 NOTE): how long a synchronous execute retries
    /// NRT_QUEUE_FULL (every 100 µs) before NRT_TIMEOUT, and how long the poll fallback waits
    /// when no pooled completion eventfd is free. 432000 s (5 days) on the simulator platform;
    /// `exec_timeout * (async_exec_max_inflight_requests + 1)` on hardware.
    pub fn wait_budget(&self, platform: Platform) -> Duration {
        match platform {
            Platform::Simulator => SIMULATOR_WAIT_BUDGET,
            Platform::Hardware => self
                .exec_timeout
                .saturating_mul(self.async_max_inflight.saturating_add(1)),
        }
    }

    /// The logical cores to reserve out of the device's `available`.
    ///
    /// # Errors
    /// `NRT_LOAD_NOT_ENOUGH_NC`-class problems as a message: more cores asked than exist.
    pub fn select_vncs(&self, available: u32) -> Result<CoreSelection, String> {
        match self.visible_cores {
            Some((first, count))
                if first.checked_add(count).is_some_and(|end| end <= available) =>
            {
                Ok(CoreSelection::Fixed { first, count })
            }
            Some((first, count)) => Err(format!(
                "NEURON_RT_VISIBLE_CORES asks for {} but the device has {}",
                match count {
                    1 => format!("core {first}"),
                    n => format!("cores {first} to {}", u64::from(first) + u64::from(n) - 1),
                },
                match available {
                    0 => "none".to_string(),
                    1 => "1 (core 0)".to_string(),
                    n => format!("{n} (cores 0 to {})", n - 1),
                }
            )),
            None if self.num_cores == 0 => Ok(CoreSelection::Fixed {
                first: 0,
                count: available,
            }),
            None if self.num_cores <= available => Ok(CoreSelection::Free {
                count: self.num_cores,
            }),
            None => Err(format!(
                "NEURON_RT_NUM_CORES={} but the device has {available}",
                self.num_cores
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<RuntimeConfig, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        RuntimeConfig::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn visible_cores_forms() {
        assert_eq!(parse_visible_cores("3"), Ok((3, 1)));
        assert_eq!(parse_visible_cores("3-6"), Ok((3, 4)));
        assert_eq!(parse_visible_cores("3-5,6"), Ok((3, 4)));
        assert!(parse_visible_cores("3,5").is_err(), "not contiguous");
        assert!(parse_visible_cores("6-3").is_err());
        assert!(parse_visible_cores("x").is_err());
        // An empty entry is a typo, not a separator to skip.
        for v in ["1,,2", "1,", ",1", "0-1,,2"] {
            let e = parse_visible_cores(v).unwrap_err();
            assert!(e.contains("empty entry"), "{v}: {e}");
        }
    }

    /// A range is one comparison: a parser that lists the cores first spends 16 GiB and 15 s
    /// on the first of these.
    #[test]
    fn visible_cores_ranges_are_checked_without_being_expanded() {
        assert_eq!(parse_visible_cores("0-4294967294"), Ok((0, u32::MAX)));
        assert_eq!(parse_visible_cores("5-4294967295"), Ok((5, u32::MAX - 4)));
        assert_eq!(
            parse_visible_cores("0-4294967295"),
            Err("too many cores".into()),
            "2^32 cores do not fit a count"
        );
        assert_eq!(parse_visible_cores("0-3, 4-4294967294"), Ok((0, u32::MAX)));
        assert!(parse_visible_cores("0-3,3-5").is_err(), "overlapping");
        assert!(
            parse_visible_cores("4294967295,0").is_err(),
            "decreasing, no wrap"
        );
    }

    #[test]
    fn booleans_take_blanks_and_an_empty_value_is_unset_as_for_every_variable() {
        let c = cfg(&[
            ("NEURON_RT_RESET_CORES", " 0 "),
            ("NEURON_RT_VALIDATE_HASH", "\tTRUE"),
            ("NEURON_RT_FUNTIME", ""),
            ("NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION", "  "),
            ("NEURON_RT_DATASTORE", " off"),
            ("NEURON_FAIL_ON_NAN", ""),
        ])
        .unwrap();
        let d = RuntimeConfig::default();
        assert!(!c.reset_cores && c.validate_hash && !c.datastore);
        assert_eq!(c.funtime, d.funtime);
        assert_eq!(c.skip_config_optimization, d.skip_config_optimization);
        assert_eq!(c.report_numerical_errors, d.report_numerical_errors);
        let e = cfg(&[("NEURON_RT_RESET_CORES", "2")]).unwrap_err();
        assert_eq!((e.var, e.value.as_str()), ("NEURON_RT_RESET_CORES", "2"));
    }

    #[test]
    fn numbers_out_of_range_are_named_as_such() {
        let e = cfg(&[("NEURON_RT_NUM_CORES", "-1")]).unwrap_err();
        assert!(e.why.contains("whole number of cores"), "{e}");
        let e = cfg(&[("NEURON_RT_EXEC_TIMEOUT", "1e400")]).unwrap_err();
        assert!(e.why.contains("at most"), "{e}");
        let e = cfg(&[("NEURON_RT_EXEC_TIMEOUT", "-inf")]).unwrap_err();
        assert!(e.why.contains("positive"), "{e}");
        let e = cfg(&[("NEURON_RT_EXEC_TIMEOUT", "NaN")]).unwrap_err();
        assert!(e.why.contains("positive"), "{e}");
    }

    #[test]
    fn load_time_variables_are_read_at_load_and_fall_back_to_init_when_unset() {
        let init = cfg(&[
            ("NEURON_RT_EXEC_TIMEOUT", "7"),
            ("NEURON_RT_VALIDATE_HASH", "1"),
        ])
        .unwrap();
        let at = |pairs: &[(&str, &str)]| {
            let m: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect();
            init.at_load(|k| m.get(k).cloned())
        };
        assert_eq!(
            at(&[]).unwrap(),
            LoadConfig {
                exec_timeout: Duration::from_secs(7),
                validate_hash: true
            }
        );
        assert_eq!(
            at(&[
                ("NEURON_RT_EXEC_TIMEOUT", "0.5"),
                ("NEURON_RT_VALIDATE_HASH", "false"),
            ])
            .unwrap(),
            LoadConfig {
                exec_timeout: Duration::from_millis(500),
                validate_hash: false
            }
        );
        assert_eq!(
            at(&[("NEURON_RT_EXEC_TIMEOUT", "")])
                .unwrap()
                .exec_timeout
                .as_secs(),
            7
        );
        let e = at(&[("NEURON_RT_EXEC_TIMEOUT", "soon")]).unwrap_err();
        assert_eq!(e.var, "NEURON_RT_EXEC_TIMEOUT");
    }

    #[test]
    fn libnrt_variables_this_runtime_ignores_are_found_by_name_or_prefix() {
        let env = [
            "PATH",
            "NEURON_RT_LOG_LEVEL",
            "NEURON_RT_LOG_LEVEL_NRT",
            "NEURON_RT_VIRTUAL_CORE_SIZE",
            "NEURON_RT_VIRTUAL_CORE_SIZEX",
            "NEURON_RT_INSPECT_ENABLE",
            "NEURON_RT_EXEC_TIMEOUT",
            "NEURON_RT_DBG_DUMP_INPUTS_ON_ERR",
        ];
        assert_eq!(
            unsupported_variables(env),
            [
                "NEURON_RT_LOG_LEVEL_NRT",
                "NEURON_RT_VIRTUAL_CORE_SIZE",
                "NEURON_RT_INSPECT_ENABLE",
                "NEURON_RT_DBG_DUMP_INPUTS_ON_ERR"
            ]
        );
        // None of the variables this runtime reads is on the list.
        let read = [
            "NEURON_RT_VISIBLE_CORES",
            "NEURON_RT_NUM_CORES",
            "NEURON_RT_RESET_CORES",
            "NEURON_RT_EXEC_TIMEOUT",
            "NEURON_LOGICAL_NC_CONFIG",
            "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
            "NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION",
            "NEURON_RT_NUMERICAL_ERRORS_VERBOSITY",
            "NEURON_FAIL_ON_NAN",
            "NEURON_RT_VALIDATE_HASH",
            "NEURON_RT_DATASTORE",
            "NEURON_RT_DATASTORE_DIR",
            "NEURON_RT_FUNTIME",
            "NEURON_RT_TRACE",
            "NEURON_RT_LOG_LEVEL",
            "NEURON_RT_BACKEND",
        ];
        assert!(unsupported_variables(read).is_empty());
    }

    #[test]
    fn the_implicit_async_limit_is_kept_with_what_was_asked() {
        let c = cfg(&[("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "64")]).unwrap();
        assert_eq!(
            (c.async_max_inflight, c.async_max_inflight_asked),
            (63, Some(64))
        );
        let c = cfg(&[("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "63")]).unwrap();
        assert_eq!(
            (c.async_max_inflight, c.async_max_inflight_asked),
            (63, None)
        );
    }

    #[test]
    fn visible_cores_win_over_num_cores() {
        let c = cfg(&[
            ("NEURON_RT_VISIBLE_CORES", "1"),
            ("NEURON_RT_NUM_CORES", "2"),
        ])
        .unwrap();
        assert_eq!(
            c.select_vncs(2),
            Ok(CoreSelection::Fixed { first: 1, count: 1 })
        );
        let c = cfg(&[("NEURON_RT_NUM_CORES", "1")]).unwrap();
        assert_eq!(c.select_vncs(2), Ok(CoreSelection::Free { count: 1 }));
        let c = cfg(&[("NEURON_RT_NUM_CORES", "0")]).unwrap();
        assert_eq!(
            c.select_vncs(2),
            Ok(CoreSelection::Fixed { first: 0, count: 2 })
        );
        assert!(
            cfg(&[("NEURON_RT_NUM_CORES", "3")])
                .unwrap()
                .select_vncs(2)
                .is_err()
        );
        assert_eq!(
            cfg(&[("NEURON_RT_VISIBLE_CORES", "1-2")])
                .unwrap()
                .select_vncs(2),
            Err(
                "NEURON_RT_VISIBLE_CORES asks for cores 1 to 2 but the device has 2 (cores 0 to 1)"
                    .into()
            )
        );
        assert_eq!(
            cfg(&[("NEURON_RT_VISIBLE_CORES", "7")])
                .unwrap()
                .select_vncs(4),
            Err(
                "NEURON_RT_VISIBLE_CORES asks for core 7 but the device has 4 (cores 0 to 3)"
                    .into()
            )
        );
    }

    #[test]
    fn neff_hash_validation_is_off_unless_asked() {
        assert!(!cfg(&[]).unwrap().validate_hash);
        assert!(cfg(&[]).unwrap().datastore);
        assert!(!cfg(&[("NEURON_RT_DATASTORE", "off")]).unwrap().datastore);
        assert!(!cfg(&[("NEURON_RT_DATASTORE", "0")]).unwrap().datastore);
        assert!(cfg(&[("NEURON_RT_DATASTORE", "maybe")]).is_err());
        assert_eq!(cfg(&[]).unwrap().datastore_dir, None);
        assert_eq!(
            cfg(&[("NEURON_RT_DATASTORE_DIR", "/tmp/x")])
                .unwrap()
                .datastore_dir,
            Some("/tmp/x".into())
        );
        assert!(
            cfg(&[("NEURON_RT_VALIDATE_HASH", "1")])
                .unwrap()
                .validate_hash
        );
        assert!(
            !cfg(&[("NEURON_RT_VALIDATE_HASH", "0")])
                .unwrap()
                .validate_hash
        );
        assert_eq!(
            cfg(&[("NEURON_RT_VALIDATE_HASH", "sure")]).unwrap_err().var,
            "NEURON_RT_VALIDATE_HASH"
        );
    }

    #[test]
    fn cores_are_reset_unless_told_not_to() {
        assert!(cfg(&[]).unwrap().reset_cores);
        assert!(!cfg(&[("NEURON_RT_RESET_CORES", "0")]).unwrap().reset_cores);
        assert!(cfg(&[("NEURON_RT_RESET_CORES", "maybe")]).is_err());
    }

    #[test]
    fn the_trace_file_is_off_by_default_and_set_by_neuron_rt_trace() {
        assert_eq!(cfg(&[]).unwrap().trace_file, None);
        assert_eq!(cfg(&[("NEURON_RT_TRACE", " ")]).unwrap().trace_file, None);
        assert_eq!(
            cfg(&[("NEURON_RT_TRACE", "/tmp/t.json")])
                .unwrap()
                .trace_file,
            Some("/tmp/t.json".into())
        );
    }

    #[test]
    fn timeouts_and_switches() {
        let c = cfg(&[
            ("NEURON_RT_EXEC_TIMEOUT", "0.5"),
            ("NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION", "0"),
        ])
        .unwrap();
        assert_eq!(c.exec_timeout, Duration::from_millis(500));
        assert!(!c.skip_config_optimization);
        let e = cfg(&[("NEURON_RT_EXEC_TIMEOUT", "-1")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("NEURON_RT_EXEC_TIMEOUT=\"-1\""), "{e}");
        // Seconds no `Duration` holds are refused, not a panic.
        for v in ["1e20", "1.8e19", "inf", "NaN"] {
            let e = cfg(&[("NEURON_RT_EXEC_TIMEOUT", v)])
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("NEURON_RT_EXEC_TIMEOUT=\"{v}\"")),
                "{e}"
            );
        }
        let c = cfg(&[("NEURON_RT_EXEC_TIMEOUT", "4294967295")]).unwrap();
        assert_eq!(c.exec_timeout, Duration::from_secs(u64::from(u32::MAX)));
    }

    #[test]
    fn async_inflight_selects_the_pool_and_is_capped_at_63() {
        assert_eq!(cfg(&[]).unwrap().async_max_inflight, 0, "off by default");
        let c = cfg(&[("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "4")]).unwrap();
        assert_eq!(c.async_max_inflight, 4);
        assert_eq!(
            c.max_inflight(),
            4.max(u32::try_from(c.xu_capacity).unwrap())
        );
        let c = cfg(&[("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "1000")]).unwrap();
        assert_eq!(c.async_max_inflight, 63);
        let e = cfg(&[("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "many")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS"),
            "{e}"
        );
    }

    #[test]
    fn the_wait_budget_is_five_days_on_the_simulator_and_scales_with_inflight_on_hardware() {
        let c = cfg(&[
            ("NEURON_RT_EXEC_TIMEOUT", "2.5"),
            ("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", "3"),
        ])
        .unwrap();
        assert_eq!(
            c.wait_budget(Platform::Simulator),
            Duration::from_secs(432_000)
        );
        assert_eq!(c.wait_budget(Platform::Hardware), Duration::from_secs(10));
        let c = cfg(&[("NEURON_RT_EXEC_TIMEOUT", "7")]).unwrap();
        assert_eq!(
            c.wait_budget(Platform::Hardware),
            Duration::from_secs(7),
            "no async pool: exec_timeout * (0 + 1)"
        );
        assert_eq!(Platform::of_backend("sim"), Platform::Simulator);
        assert_eq!(Platform::of_backend("neuron"), Platform::Hardware);
    }

    #[test]
    fn numerical_errors_are_off_by_default_and_on_with_either_variable() {
        assert!(!cfg(&[]).unwrap().report_numerical_errors);
        let on = |pairs: &[(&str, &str)]| cfg(pairs).unwrap().report_numerical_errors;
        assert!(on(&[("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "critical")]));
        assert!(on(&[("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "CRITICAL")]));
        assert!(!on(&[("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "none")]));
        assert!(on(&[("NEURON_FAIL_ON_NAN", "1")]));
        assert!(!on(&[("NEURON_FAIL_ON_NAN", "0")]));
        assert!(on(&[
            ("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "none"),
            ("NEURON_FAIL_ON_NAN", "1")
        ]));
        let e = cfg(&[("NEURON_RT_NUMERICAL_ERRORS_VERBOSITY", "loud")]).unwrap_err();
        assert_eq!(e.var, "NEURON_RT_NUMERICAL_ERRORS_VERBOSITY");
        assert!(e.why.contains("critical"), "{e}");
        assert_eq!(
            cfg(&[("NEURON_FAIL_ON_NAN", "x")]).unwrap_err().var,
            "NEURON_FAIL_ON_NAN"
        );
    }

    #[test]
    fn the_logical_core_size_defaults_to_libnrts_per_arch_and_lnc_2_needs_trn2() {
        let unset = RuntimeConfig::default();
        assert_eq!(unset.lnc_on(Arch::Trn2), Ok(2));
        assert_eq!(unset.lnc_on(Arch::Trn1), Ok(1));
        assert_eq!(unset.lnc_on(Arch::Inf2), Ok(1));
        let one = RuntimeConfig {
            lnc: Some(1),
            ..RuntimeConfig::default()
        };
        assert_eq!(one.lnc_on(Arch::Trn2), Ok(1));
        let two = RuntimeConfig {
            lnc: Some(2),
            ..RuntimeConfig::default()
        };
        assert_eq!(two.lnc_on(Arch::Trn2), Ok(2));
        let e = two.lnc_on(Arch::Trn1).unwrap_err();
        assert!(
            e.contains("needs a trn2 device") && e.contains("trn1"),
            "{e}"
        );
        let three = RuntimeConfig {
            lnc: Some(3),
            ..RuntimeConfig::default()
        };
        assert!(three.lnc_on(Arch::Trn2).unwrap_err().contains("1 or 2"));
    }

    #[test]
    fn logical_nc_config_is_1_or_2() {
        assert_eq!(cfg(&[]).unwrap().lnc, None);
        assert_eq!(cfg(&[("NEURON_LOGICAL_NC_CONFIG", "")]).unwrap().lnc, None);
        assert_eq!(
            cfg(&[("NEURON_LOGICAL_NC_CONFIG", "2")]).unwrap().lnc,
            Some(2)
        );
        assert_eq!(
            cfg(&[("NEURON_LOGICAL_NC_CONFIG", " 1 ")]).unwrap().lnc,
            Some(1)
        );
        for bad in ["0", "3", "two"] {
            let e = cfg(&[("NEURON_LOGICAL_NC_CONFIG", bad)])
                .unwrap_err()
                .to_string();
            assert!(e.contains("must be 1 or 2"), "{bad}: {e}");
        }
    }

    #[test]
    fn log_levels_take_libnrts_names_in_any_case_and_refuse_a_bare_word() {
        for (v, want) in [
            ("ERROR", "error"),
            ("WARNING", "warn"),
            ("warning", "warn"),
            ("Warn", "warn"),
            (" INFO ", "info"),
            ("debug", "debug"),
            ("TRACE", "trace"),
            ("QUIET", "off"),
            ("runtime=debug,simdev=info", "runtime=debug,simdev=info"),
        ] {
            assert_eq!(log_directive(v).as_deref(), Ok(want), "{v}");
        }
        let e = log_directive("bogus").unwrap_err();
        assert!(
            e.contains("\"bogus\" is not a level") && e.contains("WARNING"),
            "{e}"
        );
    }
}
