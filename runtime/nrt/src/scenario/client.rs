//! The hidden `nrt scenario client`: a second runtime process the runner starts on the same
//! simdev.
//!
//! Loop mode connects to `--socket`, initialises a runtime on `--visible-cores` (or
//! `--num-cores` free ones), loads the
//! identity model on each of its logical cores and prints `ready {...}` (or `refused {"status",
//! "message"}` and exits 3 when init fails, e.g. an NC owned by another process). It then
//! executes round-robin over its cores, checking every output, printing `progress N` every 16
//! executions, until `--count` executions are done or SIGINT/SIGTERM arrives; then it closes the
//! runtime, prints `done {"executions", "failures", "first_failure"}` and exits 0. A core whose
//! execution failed with NRT_HW_ERROR (the device is gone) or 101 (degraded) takes no more;
//! with none left the client stops executing: it ends at once when `--count` was given (the
//! count cannot be reached), else it waits for its signal.
//!
//! Lifecycle mode (`--lifecycle`) drives the process-global `nrt` facade through its state
//! gates (before init, after close, a second close) and prints `lifecycle {op: status}`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use runtime::backend::sim::SimDevice;
use runtime::config::{RuntimeConfig, parse_visible_cores};
use runtime::{Device, ModelHandle, NrtResult, Placement, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::Target;

/// The client's options.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// simdev's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// `NEURON_RT_VISIBLE_CORES` of this client.
    #[arg(long)]
    pub visible_cores: Option<String>,
    /// `NEURON_RT_NUM_CORES` of this client (free cores, the runtime choosing).
    #[arg(long, default_value_t = 0)]
    pub num_cores: u32,
    /// Identity tensor bytes.
    #[arg(long, default_value_t = 4096)]
    pub bytes: u32,
    /// Execution timeout, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub exec_timeout: f64,
    /// NCs per logical core (`NEURON_LOGICAL_NC_CONFIG`; the arch's default when absent).
    #[arg(long)]
    pub lnc: Option<u32>,
    /// Executions before exiting (0: until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Input pattern seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run the facade lifecycle instead.
    #[arg(long)]
    pub lifecycle: bool,
}

fn refused(status: NrtStatus, message: &str) -> ExitCode {
    println!(
        "refused {}",
        serde_json::json!({ "status": status.name(), "message": message })
    );
    ExitCode::from(3)
}

/// Runs the client.
pub fn main(args: &ClientArgs) -> ExitCode {
    if args.lifecycle {
        return lifecycle(args);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    if let Err(e) = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)) {
        return refused(
            NrtStatus::Failure,
            &format!("installing the SIGINT handler: {e}"),
        );
    }
    let dev = match SimDevice::connect(&args.socket) {
        Ok(d) => d,
        Err(e) => return refused(e.status(), &crate::error_chain(&e)),
    };
    let visible_cores = match args
        .visible_cores
        .as_deref()
        .map(parse_visible_cores)
        .transpose()
    {
        Ok(v) => v,
        Err(e) => return refused(NrtStatus::Invalid, &e),
    };
    // Where its counters go, as the runner's own runtime (the environment is inherited).
    let (datastore, datastore_dir) =
        match RuntimeConfig::datastore_from_lookup(|k| std::env::var(k).ok()) {
            Ok(d) => d,
            Err(e) => return refused(NrtStatus::Invalid, &e.to_string()),
        };
    let config = RuntimeConfig {
        datastore,
        datastore_dir,
        visible_cores,
        num_cores: args.num_cores,
        exec_timeout: Duration::from_secs_f64(args.exec_timeout.max(0.001)),
        lnc: args.lnc,
        ..RuntimeConfig::default()
    };
    let rt = match Runtime::init(Arc::new(dev) as Arc<dyn Device>, config) {
        Ok(rt) => rt,
        Err(e) => return refused(e.status, &e.message),
    };
    let mut cores = Vec::new();
    for v in 0..rt.visible_vnc_count() {
        // A logical core of two NCs runs the identity split in halves, one per NC.
        let (model, bytes) = match rt.vnc_ncs(v).map_or(1, <[u32]>::len) {
            1 => (
                runtime::builder::identity(args.bytes.max(1)),
                args.bytes.max(1),
            ),
            _ => (
                runtime::builder::identity_split(args.bytes.max(2)),
                args.bytes.max(2),
            ),
        };
        let container = match model.to_container(Target::Simdev) {
            Ok(c) => c,
            Err(e) => {
                rt.close();
                return refused(NrtStatus::Invalid, &e.to_string());
            }
        };
        let setup = || -> NrtResult<_> {
            let h = rt.load(&container, i32::try_from(v).unwrap_or(0))?;
            let size = u64::from(bytes);
            let input = rt.tensor_allocate(Placement::Device { vnc: v }, size, "input")?;
            let output = rt.tensor_allocate(Placement::Device { vnc: v }, size, "output")?;
            let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
            ins.add("input", &input);
            outs.add("output", &output);
            Ok((h, input, output, ins, outs))
        };
        match setup() {
            Ok(c) => cores.push(c),
            Err(e) => {
                rt.close();
                return refused(e.status, &e.message);
            }
        }
    }
    let ncs: Vec<u32> = (0..rt.visible_vnc_count())
        .filter_map(|v| rt.vnc_ncs(v).map(<[u32]>::to_vec))
        .flatten()
        .collect();
    println!(
        "ready {}",
        serde_json::json!({ "vncs": rt.visible_vnc_count(), "ncs": ncs })
    );
    let (mut executions, mut failures, mut first_failure) = (0u64, 0u64, None::<String>);
    let mut e = 0u64;
    // Cores that can take no more executions: the device is gone (NRT_HW_ERROR) or the core
    // degraded (101). Executing on them again would only fail at once, in a busy loop.
    let mut dead = vec![false; cores.len()];
    'outer: while !stop.load(Ordering::SeqCst) {
        if dead.iter().all(|d| *d) {
            if args.count > 0 {
                break; // the count can no longer be reached
            }
            // Until stopped, as asked, without spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        for (k, (h, input, output, ins, outs)) in cores.iter().enumerate() {
            if stop.load(Ordering::SeqCst) || (args.count > 0 && executions >= args.count) {
                break 'outer;
            }
            if dead[k] {
                continue;
            }
            let pattern: Vec<u8> = (0..input.size())
                .map(|i| {
                    (args.seed ^ e.wrapping_mul(31) ^ i.wrapping_mul(7))
                        .wrapping_add(i)
                        .to_le_bytes()[0]
                })
                .collect();
            let r = input
                .write(&pattern, 0)
                .and_then(|()| rt.execute(*h, ins, outs))
                .and_then(|()| {
                    let mut got = vec![0u8; pattern.len()];
                    output.read(&mut got, 0)?;
                    if got == pattern {
                        Ok(())
                    } else {
                        Err(runtime::NrtError::new(
                            NrtStatus::Failure,
                            format!("execution {e}: the output differs from the input"),
                        ))
                    }
                });
            executions += 1;
            e += 1;
            if let Err(err) = r {
                failures += 1;
                dead[k] |= matches!(
                    err.status,
                    NrtStatus::HwError | NrtStatus::ExecUnitUnrecoverable
                );
                if first_failure.is_none() {
                    first_failure = Some(err.to_string());
                }
            }
            if executions.is_multiple_of(16) {
                println!("progress {executions}");
            }
        }
    }
    drop(cores);
    rt.close();
    println!(
        "done {}",
        serde_json::json!({
            "executions": executions,
            "failures": failures,
            "first_failure": first_failure,
        })
    );
    ExitCode::SUCCESS
}

fn code<T>(r: &NrtResult<T>) -> String {
    match r {
        Ok(_) => NrtStatus::Success.name().to_string(),
        Err(e) => format!("{}: {}", e.status.name(), e.message),
    }
}

/// The facade's lifecycle: calls before init, init, a load and an execute, close, calls after
/// close, a second close, a second init.
fn lifecycle(args: &ClientArgs) -> ExitCode {
    use runtime::nrt;
    let mut codes = serde_json::Map::new();
    let mut put = |k: &str, v: String| {
        codes.insert(k.into(), serde_json::Value::String(v));
    };
    let container = match runtime::builder::identity(64).to_container(Target::Simdev) {
        Ok(c) => c,
        Err(e) => return refused(NrtStatus::Invalid, &e.to_string()),
    };
    let bogus = ModelHandle { id: 1, vnc: 0 };
    let empty = TensorSet::new();
    put(
        "execute_before_init",
        code(&nrt::execute(bogus, &empty, &empty)),
    );
    put("load_before_init", code(&nrt::load(&container, 0)));
    put(
        "tensor_allocate_before_init",
        code(&nrt::tensor_allocate(Placement::Host, 64, "t")),
    );
    put("unload_before_init", code(&nrt::unload(bogus)));
    let opts = runtime::backend::OpenOptions {
        kind: runtime::backend::BackendKind::Sim,
        simdev_socket: Some(args.socket.clone()),
        ..runtime::backend::OpenOptions::default()
    };
    put("init", code(&nrt::init_with(&opts)));
    let loaded = nrt::load(&container, 0);
    put("load", code(&loaded));
    let run = loaded.and_then(|h| {
        let input = nrt::tensor_allocate(Placement::Device { vnc: 0 }, 64, "input")?;
        let output = nrt::tensor_allocate(Placement::Device { vnc: 0 }, 64, "output")?;
        let pattern: Vec<u8> = (0..64u8)
            .map(|i| i.wrapping_mul(3).wrapping_add(1))
            .collect();
        input.write(&pattern, 0)?;
        let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
        ins.add("input", &input);
        outs.add("output", &output);
        nrt::execute(h, &ins, &outs)?;
        let mut got = vec![0u8; 64];
        output.read(&mut got, 0)?;
        if got != pattern {
            return Err(runtime::NrtError::new(
                NrtStatus::Failure,
                "the output differs from the input",
            ));
        }
        Ok(h)
    });
    put("execute", code(&run));
    // nrt_close is void (nrt-api.md): what it did shows in the calls after it.
    nrt::close();
    let h = run.unwrap_or(bogus);
    let mut ins = TensorSet::new();
    if let Ok(t) = runtime::Tensor::host("input", 64) {
        ins.add("input", &t);
    }
    put("execute_after_close", code(&nrt::execute(h, &ins, &empty)));
    put("load_after_close", code(&nrt::load(&container, 0)));
    put(
        "tensor_allocate_after_close",
        code(&nrt::tensor_allocate(Placement::Host, 64, "t")),
    );
    put("unload_after_close", code(&nrt::unload(h)));
    // A second close is harmless: no panic, and the facade is still closed (not reset).
    nrt::close();
    put(
        "execute_after_second_close",
        code(&nrt::execute(h, &ins, &empty)),
    );
    // A new runtime may follow a closed one; the closed one's model handle names nothing in
    // it (handle ids are never reused in a process).
    put("init_after_close", code(&nrt::init_with(&opts)));
    put(
        "execute_stale_handle_after_reinit",
        code(&nrt::execute(h, &ins, &empty)),
    );
    nrt::close();
    println!("lifecycle {}", serde_json::Value::Object(codes));
    ExitCode::SUCCESS
}
