//! `nrt`: the Neuron runtime's command-line tool.
//!
//! - `nrt ls [--json]`: the device, its NCs and their resources.
//! - `nrt bench [--model identity] [--bytes N] [--iterations K] [--json]`: load a model, run it
//!   K times with every output checked, report latency percentiles and executions per second.
//! - `nrt simdev [simdev options]`: run as the simdev device process. `nrt` re-executes itself
//!   this way to start a private device when none is present, so one binary works on a fresh
//!   clone.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use runtime::backend::sim::SimdevCommand;
use runtime::backend::{Device, OpenOptions};
use serde::Serialize;

#[derive(Parser, Debug)]
#[command(
    name = "nrt",
    version,
    about = "Neuron runtime tool: devices, benchmarks, scenarios"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List the device: backend, arch, NCs, HBM per NC, semaphores, events and DMA queues per NC.
    Ls {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Load a model, run it K times with every output checked, report latency percentiles and
    /// executions per second.
    Bench {
        /// The model to build: `identity` (output = input, moved by the I/O rings).
        #[arg(long, default_value = "identity")]
        model: String,
        /// Tensor size in bytes (identity).
        #[arg(long, default_value_t = 64)]
        bytes: u32,
        /// Executions to time.
        #[arg(long, default_value_t = 1000)]
        iterations: u32,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run as the simdev device process (what `nrt` starts when no device is present).
    #[command(disable_help_flag = true)]
    Simdev {
        /// simdev's own options (see `nrt simdev --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

/// One NC's resources, as `ls` reports them.
#[derive(Serialize, Debug)]
struct NcReport {
    nc: u32,
    hbm_base: u64,
    hbm_bytes: u64,
    semaphores: u32,
    events: u32,
    dma_engines: u32,
    dma_queues_per_engine: u32,
    dma_queues: u32,
}

/// The device, as `ls --json` prints it.
#[derive(Serialize, Debug)]
struct LsReport {
    backend: &'static str,
    description: String,
    arch: &'static str,
    arch_version: u32,
    nc_count: u32,
    hbm_bytes_per_nc: u64,
    host_base: u64,
    ncs: Vec<NcReport>,
}

fn open_device() -> Result<Box<dyn Device>, runtime::DeviceError> {
    let mut opts = OpenOptions::from_env()?;
    if let Ok(exe) = std::env::current_exe() {
        opts.simdev_command = Some(SimdevCommand {
            program: exe,
            args_prefix: vec!["simdev".into()],
            extra_args: Vec::new(),
        });
    }
    runtime::backend::open(&opts)
}

fn ls_report(dev: &dyn Device) -> LsReport {
    let info = dev.info();
    let ncs = (0..info.nc_count)
        .map(|nc| NcReport {
            nc,
            hbm_base: info.hbm_bases.get(nc as usize).copied().unwrap_or_default(),
            hbm_bytes: info.hbm_bytes_per_nc,
            semaphores: info.semaphores_per_nc,
            events: info.events_per_nc,
            dma_engines: info.dma_engines_per_nc,
            dma_queues_per_engine: info.dma_queues_per_engine,
            dma_queues: info.dma_engines_per_nc * info.dma_queues_per_engine,
        })
        .collect();
    LsReport {
        backend: dev.backend_name(),
        description: info.description.clone(),
        arch: info.arch.name(),
        arch_version: info.arch.version(),
        nc_count: info.nc_count,
        hbm_bytes_per_nc: info.hbm_bytes_per_nc,
        host_base: info.host_base,
        ncs,
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {name}", bytes / size);
        }
    }
    format!("{bytes} B")
}

fn print_ls(report: &LsReport) {
    println!("backend  {} ({})", report.backend, report.description);
    println!("arch     {} (V{})", report.arch, report.arch_version);
    println!("NCs      {}", report.nc_count);
    println!("HBM/NC   {}", human_bytes(report.hbm_bytes_per_nc));
    println!();
    println!(
        "{:>3}  {:>18}  {:>10}  {:>10}  {:>6}  {:>18}",
        "NC", "HBM base", "HBM", "semaphores", "events", "DMA queues"
    );
    for nc in &report.ncs {
        println!(
            "{:>3}  {:>#18x}  {:>10}  {:>10}  {:>6}  {:>18}",
            nc.nc,
            nc.hbm_base,
            human_bytes(nc.hbm_bytes),
            nc.semaphores,
            nc.events,
            format!(
                "{} ({}x{})",
                nc.dma_queues, nc.dma_engines, nc.dma_queues_per_engine
            ),
        );
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NEURON_RT_LOG_LEVEL")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    // `nrt simdev ...` hands the whole argument list to simdev before clap sees it, so every
    // simdev option (including --help) is simdev's.
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "simdev") {
        args.remove(0);
        return simdev::cli::main_with_args(args);
    }
    let cli = Cli::parse_from(args);
    init_tracing();
    match cli.command {
        Command::Ls { json } => {
            let dev = match open_device() {
                Ok(dev) => dev,
                Err(e) => {
                    eprintln!("nrt ls: {}", error_chain(&e));
                    return ExitCode::FAILURE;
                }
            };
            let report = ls_report(dev.as_ref());
            if json {
                match serde_json::to_string(&report) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("nrt ls: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print_ls(&report);
            }
            ExitCode::SUCCESS
        }
        Command::Bench {
            model,
            bytes,
            iterations,
            json,
        } => match bench(&model, bytes, iterations) {
            Ok(report) => {
                if json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                } else {
                    print_bench(&report);
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("nrt bench: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Simdev { args } => {
            simdev::cli::main_with_args(std::iter::once(OsString::from("simdev")).chain(args))
        }
    }
}

/// What `bench` measured.
#[derive(Serialize, Debug)]
struct BenchReport {
    model: String,
    backend: &'static str,
    bytes: u32,
    iterations: u32,
    outputs_checked: u32,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    executions_per_second: f64,
}

fn bench(model: &str, bytes: u32, iterations: u32) -> Result<BenchReport, String> {
    use runtime::{Placement, Runtime, TensorSet};
    if model != "identity" {
        return Err(format!("unknown model {model:?} (available: identity)"));
    }
    if bytes == 0 || iterations == 0 {
        return Err("--bytes and --iterations must be at least 1".into());
    }
    let dev = open_device().map_err(|e| error_chain(&e))?;
    let backend = dev.backend_name();
    let config = runtime::config::RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    let rt = Runtime::init(std::sync::Arc::from(dev), config).map_err(|e| e.to_string())?;
    let container = runtime::builder::identity(bytes)
        .to_container(shared::model::Target::Simdev)
        .map_err(|e| e.to_string())?;
    let m = rt.load(&container, 0).map_err(|e| e.to_string())?;
    let i = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, u64::from(bytes), "input")
        .map_err(|e| e.to_string())?;
    let o = rt
        .tensor_allocate(Placement::Device { vnc: 0 }, u64::from(bytes), "output")
        .map_err(|e| e.to_string())?;
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    ins.add("input", &i);
    outs.add("output", &o);
    let len = bytes as usize;
    let mut data = vec![0u8; len];
    let mut out = vec![0u8; len];
    let mut samples = Vec::with_capacity(iterations as usize);
    let warmup = iterations.min(100);
    for k in 0..warmup + iterations {
        for (j, b) in data.iter_mut().enumerate() {
            *b = j.to_le_bytes()[0] ^ j.to_le_bytes()[1] ^ k.to_le_bytes()[0];
        }
        i.write(&data, 0).map_err(|e| e.to_string())?;
        let t = std::time::Instant::now();
        rt.execute(m, &ins, &outs)
            .map_err(|e| format!("execution {k}: {e}"))?;
        let dt = t.elapsed();
        o.read(&mut out, 0).map_err(|e| e.to_string())?;
        if out != data {
            return Err(format!("execution {k}: the output differs from the input"));
        }
        if k >= warmup {
            samples.push(dt);
        }
    }
    let total: f64 = samples.iter().map(std::time::Duration::as_secs_f64).sum();
    samples.sort();
    let pct =
        |per_mille: usize| samples[(samples.len() - 1) * per_mille / 1000].as_secs_f64() * 1e6;
    let report = BenchReport {
        model: model.into(),
        backend,
        bytes,
        iterations,
        outputs_checked: warmup + iterations,
        p50_us: pct(500),
        p90_us: pct(900),
        p99_us: pct(990),
        executions_per_second: f64::from(iterations) / total,
    };
    drop((i, o, ins, outs));
    rt.close();
    Ok(report)
}

fn print_bench(r: &BenchReport) {
    println!(
        "model {} ({} bytes) on {} — {} executions timed, {} outputs checked",
        r.model, r.bytes, r.backend, r.iterations, r.outputs_checked
    );
    println!(
        "latency  p50 {:.1} us   p90 {:.1} us   p99 {:.1} us",
        r.p50_us, r.p90_us, r.p99_us
    );
    println!(
        "throughput {:.0} executions/s (sync, one thread)",
        r.executions_per_second
    );
}

/// An error and its sources, joined with ": ".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
