//! A runtime process for the datastore tests: connects to `NEURON_SIMDEV_SOCKET`, initialises a
//! runtime from the environment (`NEURON_RT_DATASTORE_DIR`, `NEURON_RT_VISIBLE_CORES`, …),
//! loads a 64-byte identity model, executes it N times (the first argument), then prints
//! `executed N BYTES` (BYTES: what `nrt_get_vnc_memory_stats` reports for core 0) and waits for
//! a line on stdin: `close` (or end of input) closes the runtime, prints `closed` and exits 0.
//!
//! Exit status 2 with `error: ...` on stderr when any step fails.

use std::io::BufRead;
use std::sync::Arc;

use runtime::Runtime;
use runtime::backend::sim::SimDevice;
use runtime::config::RuntimeConfig;
use tests::bench::IdentityIo;

fn run() -> Result<(), String> {
    let socket =
        std::env::var_os("NEURON_SIMDEV_SOCKET").ok_or("NEURON_SIMDEV_SOCKET is not set")?;
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .ok_or("usage: datastore-writer EXECUTIONS")?;
    let dev = SimDevice::connect(socket.as_ref()).map_err(|e| format!("connect: {e}"))?;
    let config = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    let rt = Runtime::init(Arc::new(dev), config).map_err(|e| format!("init: {e}"))?;
    let io = IdentityIo::load(&rt, 64);
    for _ in 0..n {
        rt.execute(io.model, &io.inputs, &io.outputs)
            .map_err(|e| format!("execute: {e}"))?;
    }
    let used = rt
        .vnc_memory_stats(0)
        .map_err(|e| format!("memory stats: {e}"))?
        .bytes_used;
    println!("executed {n} {used}");
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
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
