//! Backend selection: `NEURON_RT_BACKEND=auto|sim|neuron` (DESIGN §4, §9).
//!
//! - `neuron`: `/dev/neuron0` (or [`OpenOptions::neuron_device`]).
//! - `sim`: the simdev at `NEURON_SIMDEV_SOCKET` if set, else a private simdev child.
//! - `auto` (default): `/dev/neuron0` when present, else `NEURON_SIMDEV_SOCKET` when set, else a
//!   private simdev child, stopped when the returned device is dropped.
//!
//! The private child's program is, in order: `NEURON_SIMDEV_BIN`; the caller's
//! [`OpenOptions::simdev_command`] (the `nrt` tool passes itself, re-executed as simdev); a
//! `simdev` binary beside the current executable; `simdev` on `PATH`. Its arch comes from
//! `NEURON_SIMDEV_ARCH` (default trn1).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::neuron::NeuronDevice;
use super::sim::{SimDevice, SimdevCommand};
use super::{Device, DeviceError};

/// Which backend [`open`] uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Hardware if present, else simdev.
    Auto,
    /// simdev only.
    Sim,
    /// `/dev/neuronN` only.
    Neuron,
}

impl BackendKind {
    /// Parses `auto`, `sim` or `neuron` (case-insensitive).
    ///
    /// # Errors
    /// [`DeviceError::Config`] naming the bad value.
    pub fn parse(value: &str) -> Result<Self, DeviceError> {
        match value.to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "sim" => Ok(Self::Sim),
            "neuron" => Ok(Self::Neuron),
            other => Err(DeviceError::Config {
                message: format!("NEURON_RT_BACKEND={other:?} is not one of auto, sim, neuron"),
            }),
        }
    }
}

/// Where [`open`] looks for a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Backend choice.
    pub kind: BackendKind,
    /// The hardware device node.
    pub neuron_device: PathBuf,
    /// A running simdev's socket.
    pub simdev_socket: Option<PathBuf>,
    /// `NEURON_SIMDEV_BIN`: the simdev program to spawn (wins over `simdev_command`).
    pub simdev_bin: Option<PathBuf>,
    /// The caller's way to start simdev (e.g. `nrt` re-executing itself), used when
    /// `simdev_bin` is unset.
    pub simdev_command: Option<SimdevCommand>,
    /// Options for a private simdev (e.g. `--arch trn2`).
    pub simdev_args: Vec<OsString>,
    /// Where the caller looked for a simdev program before setting `simdev_command` (libnrt:
    /// beside the library and in its `../bin`), named when none is found.
    pub simdev_searched: Vec<PathBuf>,
    /// How long a control request to a running simdev waits for its reply (default
    /// [`crate::backend::sim::CONTROL_TIMEOUT`]).
    pub control_timeout: Option<std::time::Duration>,
}

/// simdev's `--reference-timeout` for a runtime whose executions time out after `exec_timeout`:
/// three quarters of it (at least 1 ms).
pub fn reference_timeout_args(exec_timeout: std::time::Duration) -> [OsString; 2] {
    let ms = (exec_timeout.as_millis() * 3 / 4).max(1);
    [
        OsString::from("--reference-timeout"),
        OsString::from(format!("{ms}ms")),
    ]
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            kind: BackendKind::Auto,
            neuron_device: PathBuf::from("/dev/neuron0"),
            simdev_socket: None,
            simdev_bin: None,
            simdev_command: None,
            simdev_args: Vec::new(),
            simdev_searched: Vec::new(),
            control_timeout: None,
        }
    }
}

impl OpenOptions {
    /// Options from the environment: `NEURON_RT_BACKEND`, `NEURON_SIMDEV_SOCKET`,
    /// `NEURON_SIMDEV_BIN`, `NEURON_SIMDEV_ARCH`.
    ///
    /// # Errors
    /// A bad `NEURON_RT_BACKEND` or `NEURON_SIMDEV_ARCH` value.
    pub fn from_env() -> Result<Self, DeviceError> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let kind = match std::env::var("NEURON_RT_BACKEND") {
            Ok(v) => BackendKind::parse(&v)?,
            Err(_) => BackendKind::Auto,
        };
        let mut simdev_args = Vec::new();
        if let Some(arch) = var("NEURON_SIMDEV_ARCH") {
            // Refused here, by name, rather than by the simdev it would start; any case and
            // blanks around it are taken, as for the other variables.
            let name = arch.to_str().map(|a| a.trim().to_ascii_lowercase());
            let Some(name) = name.filter(|n| shared::Arch::parse(n).is_some()) else {
                return Err(DeviceError::Config {
                    message: format!(
                        "NEURON_SIMDEV_ARCH={:?} is not one of trn1, inf2, trn2",
                        arch.to_string_lossy()
                    ),
                });
            };
            simdev_args.extend([OsString::from("--arch"), OsString::from(name)]);
        }
        // A private simdev's Python references get less time than an execution: a hung one
        // then fails its execution (1004) before the runtime times it out and degrades the NC.
        if var("NEURON_RT_EXEC_TIMEOUT").is_some()
            && let Ok(config) = crate::config::RuntimeConfig::from_env()
        {
            simdev_args.extend(reference_timeout_args(config.exec_timeout));
        }
        Ok(Self {
            kind,
            simdev_socket: var("NEURON_SIMDEV_SOCKET").map(PathBuf::from),
            simdev_bin: var("NEURON_SIMDEV_BIN").map(PathBuf::from),
            simdev_args,
            ..Self::default()
        })
    }

    /// The command that would start a private simdev, if one can be found.
    pub fn simdev_program(&self) -> Option<SimdevCommand> {
        let with_args = |mut c: SimdevCommand| {
            c.extra_args.extend(self.simdev_args.iter().cloned());
            c
        };
        let plain = |program: PathBuf| SimdevCommand {
            program,
            args_prefix: Vec::new(),
            extra_args: Vec::new(),
        };
        if let Some(bin) = &self.simdev_bin {
            return Some(with_args(plain(bin.clone())));
        }
        if let Some(cmd) = &self.simdev_command {
            return Some(with_args(cmd.clone()));
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join("simdev")));
        if let Some(path) = beside.filter(|p| p.is_file()) {
            return Some(with_args(plain(path)));
        }
        let on_path = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("simdev"))
                .find(|p| p.is_file())
        });
        on_path.map(|p| with_args(plain(p)))
    }
}

fn open_sim(opts: &OpenOptions) -> Result<Box<dyn Device>, DeviceError> {
    if let Some(socket) = &opts.simdev_socket {
        return Ok(Box::new(SimDevice::connect_with_timeout(
            socket,
            opts.control_timeout
                .unwrap_or(crate::backend::sim::CONTROL_TIMEOUT),
        )?));
    }
    let Some(cmd) = opts.simdev_program() else {
        return Err(DeviceError::NoDevice {
            hint: no_device_hint(&opts.neuron_device, &opts.simdev_searched),
        });
    };
    Ok(Box::new(SimDevice::spawn_private(&cmd)?))
}

fn no_device_hint(node: &Path, searched: &[PathBuf]) -> String {
    let mut places: Vec<String> = vec!["NEURON_SIMDEV_BIN (unset)".to_owned()];
    places.extend(searched.iter().map(|p| p.display().to_string()));
    places.push(
        std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.join("simdev")))
            .map_or_else(
                || "beside this executable".to_owned(),
                |p| p.display().to_string(),
            ),
    );
    places.push("simdev on PATH".to_owned());
    format!(
        "{} is absent, NEURON_SIMDEV_SOCKET is unset and no simdev program was found (looked \
         at: {}). Set NEURON_SIMDEV_BIN to the simdev program (`nrt install --prefix P` puts it \
         in P/bin, beside P/lib/libnrt.so.1), or start one by hand with \
         `simdev --socket /tmp/simdev.sock` and set NEURON_SIMDEV_SOCKET=/tmp/simdev.sock",
        node.display(),
        places.join(", ")
    )
}

/// Opens the device that `opts` selects.
///
/// # Errors
/// [`DeviceError::NoDevice`] with a hint on how to start simdev; the backend's own errors.
pub fn open(opts: &OpenOptions) -> Result<Box<dyn Device>, DeviceError> {
    match opts.kind {
        BackendKind::Neuron => Ok(Box::new(NeuronDevice::open(&opts.neuron_device)?)),
        BackendKind::Sim => open_sim(opts),
        BackendKind::Auto if opts.neuron_device.exists() => {
            Ok(Box::new(NeuronDevice::open(&opts.neuron_device)?))
        }
        BackendKind::Auto => open_sim(opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_simdevs_references_get_three_quarters_of_the_execution_timeout() {
        use std::time::Duration;
        assert_eq!(
            reference_timeout_args(Duration::from_secs(30)),
            ["--reference-timeout", "22500ms"].map(OsString::from)
        );
        assert_eq!(
            reference_timeout_args(Duration::from_secs(4)),
            ["--reference-timeout", "3000ms"].map(OsString::from)
        );
        assert_eq!(reference_timeout_args(Duration::ZERO)[1], "1ms");
        // simdev takes what it is given.
        assert!(simdev::cli::parse_duration("22500ms").is_ok());
    }

    #[test]
    fn backend_kind_parses_the_three_names() {
        assert_eq!(BackendKind::parse("auto").unwrap(), BackendKind::Auto);
        assert_eq!(BackendKind::parse("SIM").unwrap(), BackendKind::Sim);
        assert_eq!(BackendKind::parse("neuron").unwrap(), BackendKind::Neuron);
        let err = BackendKind::parse("gpu").unwrap_err().to_string();
        assert!(err.contains("\"gpu\""), "{err}");
    }

    #[test]
    fn simdev_bin_wins_over_the_callers_command() {
        let opts = OpenOptions {
            simdev_bin: Some("/opt/simdev".into()),
            simdev_command: Some(SimdevCommand {
                program: "/usr/bin/nrt".into(),
                args_prefix: vec!["simdev".into()],
                extra_args: Vec::new(),
            }),
            simdev_args: vec!["--arch".into(), "trn2".into()],
            ..OpenOptions::default()
        };
        let cmd = opts.simdev_program().unwrap();
        assert_eq!(cmd.program, PathBuf::from("/opt/simdev"));
        assert!(cmd.args_prefix.is_empty());
        assert_eq!(
            cmd.extra_args,
            vec![OsString::from("--arch"), OsString::from("trn2")]
        );
    }

    #[test]
    fn no_device_error_says_how_to_start_simdev() {
        let hint = no_device_hint(
            Path::new("/dev/neuron0"),
            &[PathBuf::from("/opt/nrt/lib/simdev")],
        );
        assert!(hint.contains("--socket /tmp/simdev.sock"), "{hint}");
        assert!(
            hint.contains("looked at: NEURON_SIMDEV_BIN (unset), /opt/nrt/lib/simdev, /"),
            "{hint}"
        );
    }
}
