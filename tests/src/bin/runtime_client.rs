//! A runtime process for tests of the operator tools (`nrt monitor`, `nrt top`, the
//! datastore): it opens the device the environment names (`NEURON_SIMDEV_SOCKET`), initialises
//! a runtime from the environment (`NEURON_RT_VISIBLE_CORES`, `NEURON_RT_DATASTORE_DIR`, ...),
//! loads the identity model, executes it `--executions N` times (64 bytes), and prints one
//! JSON line of what it counted: `{"pid", "executions", "nc_executions": [per NC of logical
//! core 0]}`. Then it waits until its stdin closes (or it is killed), closes the runtime, and
//! prints `closed`.
//!
//! Exit status 2 with `error: ...` on stderr when any step fails.

use std::io::Read;
use std::sync::Arc;

use runtime::Runtime;
use runtime::backend::OpenOptions;
use runtime::config::RuntimeConfig;
use tests::bench::IdentityIo;

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut executions = 0u64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--executions" => {
                executions = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--executions needs a count")?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let opts = OpenOptions::from_env().map_err(|e| format!("device options: {e}"))?;
    let dev = runtime::backend::open(&opts).map_err(|e| format!("open the device: {e}"))?;
    let config = RuntimeConfig::from_env().map_err(|e| format!("config: {e}"))?;
    let rt = Runtime::init(Arc::from(dev), config).map_err(|e| format!("nrt_init: {e}"))?;
    let io = IdentityIo::load(&rt, 64);
    io.input.write(&[0x5A; 64], 0).map_err(|e| e.to_string())?;
    for k in 0..executions {
        rt.execute(io.model, &io.inputs, &io.outputs)
            .map_err(|e| format!("execution {k}: {e}"))?;
    }
    let ncs = rt.vnc_ncs(0).ok_or("no logical core 0")?.to_vec();
    let per_nc: Vec<u64> = ncs
        .iter()
        .map(|&nc| {
            rt.metrics()
                .snapshot(nc as usize)
                .map_or(0, |m| m.executions())
        })
        .collect();
    println!(
        "{{\"pid\": {}, \"executions\": {executions}, \"ncs\": {ncs:?}, \"nc_executions\": {per_nc:?}}}",
        std::process::id()
    );
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(io);
    rt.close();
    println!("closed");
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
