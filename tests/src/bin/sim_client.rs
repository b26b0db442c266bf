//! A minimal simdev client process for tests that need a second process: it connects to
//! `NEURON_SIMDEV_SOCKET`, claims the NCs given as arguments, allocates `--alloc BYTES` of HBM
//! on each, prints `ready`, then waits until its stdin closes (or it is killed).
//!
//! Exit status 2 with `error: ...` on stderr when any step fails.

use std::io::Read;

use runtime::backend::Device;
use runtime::backend::sim::SimDevice;
use shared::protocol::MemLocation;

fn run() -> Result<(), String> {
    let socket =
        std::env::var_os("NEURON_SIMDEV_SOCKET").ok_or("NEURON_SIMDEV_SOCKET is not set")?;
    let mut args = std::env::args().skip(1);
    let mut ncs = Vec::new();
    let mut alloc = 0u64;
    while let Some(a) = args.next() {
        if a == "--alloc" {
            alloc = args
                .next()
                .and_then(|v| v.parse().ok())
                .ok_or("--alloc needs a byte count")?;
        } else {
            ncs.push(a.parse::<u32>().map_err(|e| format!("bad NC {a:?}: {e}"))?);
        }
    }
    let dev = SimDevice::connect(socket.as_ref()).map_err(|e| {
        format!(
            "{e}: {:?}",
            std::error::Error::source(&e).map(ToString::to_string)
        )
    })?;
    let mut held = Vec::new();
    for nc in ncs {
        held.push(dev.claim_nc(nc).map_err(|e| {
            format!(
                "claim NC {nc}: {e}: {:?}",
                std::error::Error::source(&e).map(ToString::to_string)
            )
        })?);
        if alloc > 0 {
            let a = dev
                .mem_alloc(MemLocation::Hbm { nc }, alloc, 0)
                .map_err(|e| format!("alloc on NC {nc}: {e}"))?;
            let m = dev.mem_map(&a).map_err(|e| format!("map: {e}"))?;
            m.fill(a.pa, usize::try_from(a.size).unwrap_or(0), 0xA5)
                .map_err(|e| format!("fill: {e}"))?;
        }
    }
    println!("ready");
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
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
