//! `nrt`: the Neuron runtime's command-line tool.
//!
//! - `nrt ls [--json-output]`: the devices in neuron-ls's shapes (cores, memory, the processes
//!   holding them), then the backend and each NC's resources.
//! - `nrt bench [--model digits|identity] [--batch B] [--ncs N] [--iterations K] [--json]`: run
//!   the digits MLP over the UCI test set (or the identity model), report accuracy, logit error,
//!   latency percentiles and throughput.
//! - `nrt scenario run FILE... [--json]`: run scripted device scenarios (faults, timing, model
//!   switches, crashes), one private simdev each, with a PASS/FAIL line per expectation.
//! - `nrt neff info FILE [--json]`: a NEFF's header, I/O tensors, subgraphs, constants, DMA
//!   queues, instruction records per engine and the device memory a load needs.
//! - `nrt neff record FILE --out GOLDEN.safetensors [--executions N] [--seed S]`: run a NEFF
//!   with seeded inputs and record its inputs and outputs in a golden file simdev can replay.
//! - `nrt monitor [--period 1s] [--count N] [--prometheus ADDR]`: neuron-monitor's JSON stream
//!   of the runtime processes' datastores and simdev's counters (and a Prometheus endpoint).
//! - `nrt top [--period 1s]`: a live terminal view like neuron-top.
//! - `nrt install --prefix DIR [--lib FILE]`: the C library (`libnrt.so.1`) and its headers laid
//!   out like `/opt/aws/neuron`, with a simdev for the library to start.
//! - `nrt simdev [simdev options]` (or this program run under the name `simdev`): run as the
//!   simdev device process. `nrt` re-executes itself
//!   this way to start a private device when none is present, so one binary works on a fresh
//!   clone.

use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand};
use runtime::backend::sim::SimdevCommand;
use runtime::backend::{BackendKind, Device, OpenOptions};

mod bench;
use bench::BenchOptions;
mod install;
mod ls;
mod monitor;
mod neff_info;
mod neff_record;
mod scenario;
mod top;

/// What `nrt --help` says about the environment (README "Choosing a backend" and
/// "Configuration" say the rest).
const ENVIRONMENT: &str = "\
Environment (README \"Choosing a backend\" and \"Configuration\"):
  NEURON_RT_BACKEND         auto (default: /dev/neuron0, else NEURON_SIMDEV_SOCKET, else a private simdev), sim, neuron
  NEURON_SIMDEV_SOCKET      a running simdev's socket (`nrt simdev --socket S`)
  NEURON_SIMDEV_ARCH        a private simdev's arch: trn1 (default), inf2, trn2
  NEURON_SIMDEV_BIN         the simdev program to start privately (default: this program, as `nrt simdev`)
  NEURON_SIMDEV_REFERENCE   NEFFs bound to a CPU reference (FILE.neff=MODULE.py:FUNCTION), read by simdev
  NEURON_SIMDEV_PYTHON      the Python (with numpy) simdev runs references with (default python3)
  NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES, NEURON_LOGICAL_NC_CONFIG, NEURON_RT_RESET_CORES,
  NEURON_RT_EXEC_TIMEOUT, NEURON_RT_VALIDATE_HASH, NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS,
  NEURON_RT_NUMERICAL_ERRORS_VERBOSITY, NEURON_FAIL_ON_NAN, NEURON_RT_LOG_LEVEL
                            as libnrt reads them; other NEURON_RT_* libnrt variables are named in a WARN at init
  NEURON_RT_DATASTORE       off: no datastore file (default on: the counters `nrt monitor` and `nrt top` read)
  NEURON_RT_DATASTORE_DIR   the datastore's directory
  NEURON_RT_TRACE           write the runtime's and the device's timeline (Perfetto JSON) to this file at close
  NEURON_RT_FUNTIME         1: executions return success without a device
  NEURON_RT_ENABLE_SKIP_CONFIG_OPTIMIZATION  0: always reload the sequencer config
  TMPDIR                    where a private simdev's directory goes (/tmp when too long for a socket path)
  RUST_LOG                  this program's and simdev's logging (default warn), to stderr";

#[derive(Parser, Debug)]
#[command(
    name = "nrt",
    version,
    about = "Neuron runtime tool: devices, benchmarks, scenarios",
    after_help = ENVIRONMENT
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the devices as neuron-ls does (cores, memory, the processes holding them), then
    /// the backend and each NC's resources.
    Ls {
        /// Print neuron-ls's JSON (an array of devices) instead of tables.
        #[arg(long = "json-output", short = 'j', visible_alias = "json")]
        json: bool,
    },
    /// Load a model (by default the digits MLP, built on the fly), run it over the whole test set
    /// (or K executions) with every output checked, and report accuracy, max |logit - reference|,
    /// latency percentiles and throughput.
    // A negative number is a value (refused as one: "invalid value '-5' for '--bytes'"), not
    // an unknown flag.
    #[command(allow_negative_numbers = true)]
    Bench {
        /// `digits` (the trained MLP on the UCI digits test set) or `identity`.
        #[arg(long, default_value = "digits")]
        model: String,
        /// Images per execution (digits).
        #[arg(long, default_value_t = 1)]
        batch: u32,
        /// Tensor size in bytes (identity).
        #[arg(long, default_value_t = bench::DEFAULT_BYTES)]
        bytes: u32,
        /// Executions to time (default: one pass over the test set; identity and NEFF: 1000).
        #[arg(long)]
        iterations: Option<u32>,
        /// Benchmark a NEFF file instead of --model: inputs filled with seeded random data (an
        /// input above 64 MiB in its first and last MiB only, as the report says), on
        /// simdev run shape-only (outputs are checked against the documented shape-only
        /// function of the inputs, not the model's numbers). A NEFF's tensors have the sizes it
        /// declares, so --batch and --bytes are refused with it.
        #[arg(long, conflicts_with_all = ["model", "batch", "bytes"])]
        neff: Option<std::path::PathBuf>,
        /// Untimed executions per core before the timed ones (after one per in-flight slot).
        #[arg(long, default_value_t = 0)]
        warmup: u32,
        /// Seed of a NEFF's random inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Logical cores to run on, one thread each [default: as many as
        /// NEURON_RT_VISIBLE_CORES names, else a non-zero NEURON_RT_NUM_CORES, else 1].
        #[arg(long)]
        ncs: Option<u32>,
        /// Keep N executions in flight per core through the explicit async API (0: synchronous).
        #[arg(long = "async", default_value_t = 0)]
        in_flight: u32,
        /// Write the runtime's timeline at the end: its execute, bind, stage, doorbell, wait and
        /// harvest spans with the device's engine, DMA, doorbell and notification events, on
        /// one clock (Chrome trace-event JSON that opens in Perfetto; `NEURON_RT_TRACE`). Works
        /// with a private or a shared simdev.
        #[arg(long)]
        trace: Option<std::path::PathBuf>,
        /// The runtime datastore: `env` (as NEURON_RT_DATASTORE says), `on`, `off`, or `both`
        /// (identity model: alternating blocks of off and on in this one process, printing
        /// both sides' p50 and mean and their ratios).
        #[arg(long, value_enum, default_value_t = bench::DatastoreChoice::Env)]
        datastore: bench::DatastoreChoice,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Scripted device scenarios: `nrt scenario run FILE... [--json]` (see scenarios/README.md).
    Scenario {
        /// What to do.
        #[command(subcommand)]
        command: scenario::ScenarioCommand,
    },
    /// Inspect a NEFF (neuronx-cc output): `nrt neff info FILE [--json]`; record a golden file
    /// of its executions: `nrt neff record FILE --out GOLDEN.safetensors`.
    Neff {
        /// What to do.
        #[command(subcommand)]
        command: neff_info::NeffCommand,
    },
    /// Write a model container that `nrt_load` takes (C programs load it from the file):
    /// `digits` (the trained MLP at --batch images per execution) or `identity` (--bytes in,
    /// the same bytes out).
    Model {
        /// `digits` or `identity`.
        name: String,
        /// Images per execution (digits).
        #[arg(long, default_value_t = 1)]
        batch: u32,
        /// Tensor size in bytes (identity).
        #[arg(long, default_value_t = 64)]
        bytes: u32,
        /// NCs per logical core the container is built for (1, or 2 for trn2's LNC=2).
        #[arg(long, default_value_t = 1)]
        lnc: u32,
        /// The file to write.
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Install the C library and headers: DIR/lib/libnrt.so.1 (+ libnrt.so), DIR/include/nrt/,
    /// DIR/bin/nrt and DIR/bin/simdev (the device libnrt starts when none is present).
    Install {
        /// The prefix (like /opt/aws/neuron).
        #[arg(long)]
        prefix: std::path::PathBuf,
        /// The library to install (default: libnrt.so beside this executable).
        #[arg(long)]
        lib: Option<std::path::PathBuf>,
    },
    /// A neuron-monitor-style stream: one JSON document per period with every runtime
    /// process's utilisation, executions, errors, latency and memory (from the runtime
    /// datastores) and simdev's per-NC counters; `--prometheus ADDR` serves the same figures.
    Monitor(monitor::MonitorArgs),
    /// A live view like neuron-top: logical cores (utilisation, executions/s, latency, errors)
    /// and processes (models, device memory). `q`, Esc or Ctrl-C quits.
    Top(top::TopArgs),
    /// Run as the simdev device process (what `nrt` starts when no device is present).
    #[command(disable_help_flag = true)]
    Simdev {
        /// simdev's own options (see `nrt simdev --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// How long an operator tool (`nrt ls`, `nrt monitor`, `nrt top`) waits for a running
/// simdev's reply: no execution runs on a tool's connection, so a slow reply means a stopped
/// or stuck simdev.
pub(crate) const TOOL_CONTROL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// SIGINT, SIGTERM or SIGHUP (Ctrl-C, `timeout`, a CI job cancelled) ends a command that may
/// have started a private simdev through `exit`, so the exit hook stops that simdev and removes
/// its directory and the datastore file (a signal's default action would leave them). Exit
/// status 130.
fn exit_cleanly_on_signals() {
    if let Err(e) = ctrlc::set_handler(|| {
        if STOP_GRACEFULLY.load(Ordering::Acquire) && !INTERRUPTED.swap(true, Ordering::AcqRel) {
            eprintln!(
                "nrt: interrupted; stopping after the executions in flight (again to exit at once)"
            );
            // A stop that hangs (an execution that never completes) ends as the others do.
            let watchdog = std::thread::Builder::new().spawn(|| {
                std::thread::sleep(GRACEFUL_STOP_LIMIT);
                eprintln!("nrt: still stopping after {GRACEFUL_STOP_LIMIT:?}; exiting");
                std::process::exit(130);
            });
            if watchdog.is_ok() {
                return;
            }
        }
        eprintln!("nrt: interrupted; stopping");
        std::process::exit(130);
    }) {
        tracing::warn!("installing the SIGINT/SIGTERM handler: {e}");
    }
}

/// Set while a command that can stop in order runs (`nrt bench`): its first signal sets
/// [`INTERRUPTED`] instead of exiting, and the command stops submitting, lets what is in
/// flight end, closes its runtime (writing `--trace`), reports what ran and exits 130.
static STOP_GRACEFULLY: AtomicBool = AtomicBool::new(false);

/// A signal asked the running command to stop ([`STOP_GRACEFULLY`]).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How long a stop in order may take before the process exits anyway.
const GRACEFUL_STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a signal asked the command to stop (checked between executions).
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Acquire)
}

/// Opens the device (starting a private simdev, as this very binary, when none is set up).
fn open_device() -> Result<Box<dyn Device>, runtime::DeviceError> {
    open_device_waiting(None)
}

/// [`open_device`] with control requests to a running simdev waiting at most `control_timeout`.
fn open_device_waiting(
    control_timeout: Option<std::time::Duration>,
) -> Result<Box<dyn Device>, runtime::DeviceError> {
    let mut opts = OpenOptions::from_env()?;
    opts.control_timeout = control_timeout;
    if let Ok(exe) = std::env::current_exe() {
        opts.simdev_command = Some(SimdevCommand {
            program: exe,
            args_prefix: vec!["simdev".into()],
            extra_args: Vec::new(),
        });
    }
    runtime::backend::open(&opts)
}

/// The log filter: `NEURON_RT_LOG_LEVEL` (libnrt's level names, or `tracing` directives), else
/// `RUST_LOG`, else `default`. A value that is neither is said on stderr and `default` used.
pub(crate) fn log_filter(default: &str) -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::EnvFilter;
    match std::env::var("NEURON_RT_LOG_LEVEL") {
        Ok(v) if !v.trim().is_empty() => match runtime::config::log_directive(&v) {
            Ok(d) => EnvFilter::try_new(&d).unwrap_or_else(|e| {
                eprintln!("nrt: NEURON_RT_LOG_LEVEL={v:?}: {e}; logging at {default}");
                EnvFilter::new(default)
            }),
            Err(e) => {
                eprintln!("nrt: {e}; logging at {default}");
                EnvFilter::new(default)
            }
        },
        _ => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    }
}

fn init_tracing() {
    let filter = log_filter("warn");
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log write that fails (a full disk, a closed stderr) is dropped: the default
        // reports it with `eprintln!`, which panics when stderr is what failed.
        .log_internal_errors(false)
        // A private simdev (`nrt simdev`) logs to a file: no colour sequences there.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() -> ExitCode {
    // `nrt simdev ...` hands the whole argument list to simdev before clap sees it, so every
    // simdev option (including --help) is simdev's.
    let mut args: Vec<OsString> = std::env::args_os().collect();
    // Installed as `simdev` too (`nrt install`): that name runs the device.
    let invoked_as_simdev = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "simdev");
    if invoked_as_simdev {
        return simdev::cli::main_with_args(args);
    }
    if args.get(1).is_some_and(|a| a == "simdev") {
        args.remove(0);
        return simdev::cli::main_with_args(args);
    }
    // Like other Unix tools, end quietly when a reader such as `head` closes our stdout. Not
    // simdev (above), which keeps Rust's SIGPIPE = ignore: a device whose runtime died (and
    // with it the pipe of simdev's stdout) must still stop in order and clean up.
    // SAFETY: called in main before any thread exists; SIG_DFL is a valid disposition.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    // stdout that cannot be written (`> /dev/full`, a closed descriptor) ends the command
    // with one line and status 1, not a panic's backtrace (`println!` panics on a write
    // error); `head` closing it still ends it quietly (SIGPIPE, above).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Some(why) = output_failure(info.payload()) {
            let _ = writeln!(std::io::stderr(), "nrt: {why}");
        } else {
            default_hook(info);
        }
    }));
    match std::panic::catch_unwind(|| run_cli(args)) {
        Ok(code) => code,
        Err(payload) if output_failure(&*payload).is_some() => ExitCode::FAILURE,
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// The message of a panic of `println!` (or `print!`) whose write failed: `failed printing to
/// stdout: <error>`.
fn output_failure(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())?;
    text.starts_with("failed printing to stdout")
        .then_some(text)
}

/// The `nrt` command line (not `simdev`).
fn run_cli(args: Vec<OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    match &cli.command {
        Command::Scenario { command } => scenario::init_tracing(command),
        _ => init_tracing(),
    }
    if matches!(
        cli.command,
        Command::Bench { .. }
            | Command::Neff { .. }
            | Command::Ls { .. }
            | Command::Scenario {
                command: scenario::ScenarioCommand::Run { .. }
            }
    ) {
        exit_cleanly_on_signals();
    }
    match cli.command {
        Command::Ls { json } => {
            // Like neuron-ls (and nrt monitor/top), ls never starts a device: on a host with
            // none it lists none, so a tool summing nc_count counts no cores.
            match OpenOptions::from_env() {
                Ok(o)
                    if o.simdev_socket.is_none()
                        && (o.kind == BackendKind::Sim
                            || (o.kind == BackendKind::Auto && !o.neuron_device.exists())) =>
                {
                    let why = format!(
                        "no Neuron device: {} is absent and NEURON_SIMDEV_SOCKET is unset (nrt ls never starts a simdev; start one with `nrt simdev --socket S` and set NEURON_SIMDEV_SOCKET=S)",
                        o.neuron_device.display()
                    );
                    if json {
                        eprintln!("nrt ls: {why}");
                        println!("[]");
                    } else {
                        println!("{why}");
                    }
                    return ExitCode::SUCCESS;
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("nrt ls: {}", error_chain(&e));
                    return ExitCode::FAILURE;
                }
            }
            let dev = match open_device_waiting(Some(TOOL_CONTROL_TIMEOUT)) {
                Ok(dev) => dev,
                Err(e) => {
                    eprintln!("nrt ls: {}", error_chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            let devices = match ls::configured().and_then(|c| ls::describe(dev.as_ref(), &c)) {
                Ok(devices) => devices,
                Err(e) => {
                    eprintln!("nrt ls: {e}");
                    return ExitCode::FAILURE;
                }
            };
            if json {
                match serde_json::to_string_pretty(&devices) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("nrt ls: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                ls::print(&devices);
            }
            ExitCode::SUCCESS
        }
        Command::Bench {
            model,
            batch,
            bytes,
            iterations,
            neff,
            warmup,
            seed,
            ncs,
            in_flight,
            json,
            trace,
            datastore,
        } => {
            let opts = BenchOptions {
                datastore,
                in_flight,
                model,
                neff,
                warmup,
                seed,
                batch,
                bytes,
                iterations,
                ncs: ncs.unwrap_or_else(bench::default_ncs),
                progress: !json,
                trace: trace.as_ref().map(|p| {
                    std::env::current_dir()
                        .map(|d| d.join(p))
                        .unwrap_or_else(|_| p.clone())
                }),
            };
            STOP_GRACEFULLY.store(true, Ordering::Release);
            let ran = bench::run(&opts, open_device);
            let code_if_ok = if interrupted() {
                ExitCode::from(130)
            } else {
                ExitCode::SUCCESS
            };
            match ran {
                Ok(report) => {
                    if json {
                        println!("{}", serde_json::to_string(&report).unwrap_or_default());
                    } else {
                        bench::print(&report);
                    }
                    if let Some(path) = &trace {
                        // Written at the runtime's close: an empty file is one that failed (the
                        // error was logged above).
                        if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
                            eprintln!(
                                "trace written to {}{}",
                                path.display(),
                                bench::trace_drops(path)
                            );
                        } else {
                            eprintln!(
                                "nrt bench: the trace was not written to {} (see the error above)",
                                path.display()
                            );
                            return ExitCode::FAILURE;
                        }
                    }
                    if let Some(e) = &report.error {
                        eprintln!("nrt bench: {e}");
                        ExitCode::FAILURE
                    } else if report.failures == 0 {
                        code_if_ok
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("nrt bench: {e}");
                    if json {
                        // A script reading stdout still gets one document, saying why.
                        println!("{}", serde_json::json!({ "error": e }));
                    }
                    if interrupted() {
                        ExitCode::from(130)
                    } else {
                        ExitCode::FAILURE
                    }
                }
            }
        }
        Command::Scenario { command } => scenario::main(command),
        Command::Neff { command } => neff_info::main(command),
        Command::Model {
            name,
            batch,
            bytes,
            lnc,
            out,
        } => match write_model(&name, batch, bytes, lnc, &out) {
            Ok(n) => {
                println!("{name}: {n} bytes written to {}", out.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nrt model: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Install { prefix, lib } => match install::install(&prefix, lib.as_deref()) {
            Ok(i) => {
                println!("library  {}", i.library.display());
                println!("headers  {}", i.headers.display());
                println!("nrt      {}", i.nrt.display());
                println!("simdev   {}", i.simdev.display());
                println!("valgrind {} (--suppressions)", i.suppressions.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nrt install: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Monitor(args) => monitor::main(&args, monitor::datastore_source(true)),
        Command::Top(args) => top::main(&args, monitor::datastore_source(false)),
        Command::Simdev { args } => {
            simdev::cli::main_with_args(std::iter::once(OsString::from("simdev")).chain(args))
        }
    }
}

/// An error and its sources, joined with ": " ([`runtime::error::chain`]).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    runtime::error::chain(e)
}

/// `nrt model`: builds the named model's container and writes it to `out`; returns its size.
fn write_model(
    name: &str,
    batch: u32,
    bytes: u32,
    lnc: u32,
    out: &std::path::Path,
) -> Result<usize, String> {
    use runtime::builder::digits::{self, Digits};
    if !(1..=2).contains(&lnc) {
        return Err(format!("--lnc {lnc}: a logical core is 1 or 2 NCs"));
    }
    let model = match name {
        "digits" => Digits::load(&digits::default_path())?
            .mlp()
            .build_split(batch, lnc)
            .map_err(|e| e.to_string())?,
        "identity" if bytes == 0 => return Err("--bytes must be at least 1".into()),
        "identity" if lnc > 1 => runtime::builder::identity_split(bytes.max(2)),
        "identity" => runtime::builder::identity(bytes),
        other => return Err(format!("unknown model {other:?} (digits or identity)")),
    };
    // A model the runtime's default configuration cannot load is not written.
    let in_flight = runtime::config::RuntimeConfig::default().max_inflight();
    runtime::kmgr::check_io_rings(&model, in_flight)
        .map_err(|why| format!("the runtime would refuse to load this model: {why}"))?;
    let container = model
        .to_container(shared::model::Target::Simdev)
        .map_err(|e| e.to_string())?;
    std::fs::write(out, &container).map_err(|e| format!("writing {}: {e}", out.display()))?;
    Ok(container.len())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// `nrt --help` names every variable of the README's backend table.
    #[test]
    fn help_names_every_variable_of_the_readmes_table() {
        let help = Cli::command().render_long_help().to_string();
        let readme = include_str!("../../../README.md");
        let table: Vec<&str> = readme
            .lines()
            .filter_map(|l| l.strip_prefix("| `NEURON"))
            .filter_map(|rest| rest.split('`').next())
            .collect();
        assert!(table.len() >= 10, "the README's table: {table:?}");
        for rest in table {
            let name = format!("NEURON{rest}");
            assert!(
                help.contains(&name),
                "nrt --help does not name {name}:\n{help}"
            );
        }
    }
}
