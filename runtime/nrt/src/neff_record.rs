//! `nrt neff record FILE.neff --out GOLDEN.safetensors [--executions N] [--seed S]`: run a NEFF
//! on the device the runtime finds and record every execution's inputs and outputs in a golden
//! file (issue 15 item 4), which simdev can later replay as the NEFF's reference
//! (`simdev --reference FILE.neff=GOLDEN.safetensors`).
//!
//! The NEFF is loaded on logical core 0 of the device `nrt` opens (silicon through
//! `/dev/neuron`, or simdev — a private one when none is running). Execution `k` (0-based)
//! runs with the seeded random inputs `nrt bench --neff --seed S+k` writes into its first
//! slot; every input and output is read back whole after the execution. The file is
//! `simdev::reference::golden`'s format (`nrt-golden` version 1); its `source` metadata says
//! where the outputs came from: `"silicon"`, or on simdev `"simdev shape-only"` or
//! `"simdev reference"` (from simdev's NC counters, as `nrt bench` tells them apart). A
//! recording of shape-only outputs is still a valid golden file (useful for tests), but not
//! the model's numbers.
//!
//! Golden files hold whole tensors in memory: a NEFF with an input or output larger than
//! [`MAX_TENSOR_BYTES`] is refused before the device is opened. `NEURON_RT_FUNTIME=1` is
//! refused too (nothing would run).

use std::path::Path;
use std::sync::Arc;

use runtime::Runtime;
use runtime::config::RuntimeConfig;
use simdev::reference::golden;

use crate::bench::{self, NeffOutputs};

/// The largest input or output a recording takes (golden files hold whole tensors).
pub const MAX_TENSOR_BYTES: u64 = 256 << 20;

/// What `nrt neff record` wrote.
#[derive(Debug)]
pub struct Recording {
    /// Executions recorded.
    pub executions: u32,
    /// The `source` metadata.
    pub source: &'static str,
    /// Bytes of the file.
    pub bytes: u64,
}

/// Records `executions` executions of the NEFF at `file` into `out` (see the module doc).
///
/// # Errors
/// A message naming the failing step: the NEFF unreadable, a tensor too large or of a dtype
/// a golden file cannot hold, no device, the load, an execution, reading a tensor back,
/// writing the file.
pub fn record(file: &Path, out: &Path, executions: u32, seed: u64) -> Result<Recording, String> {
    if executions == 0 {
        return Err("--executions must be at least 1".into());
    }
    check_out(out)?;
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let neff = neff::Neff::parse(&bytes, &neff::ParseOptions::default())
        .map_err(|e| format!("{}: {e}", file.display()))?;
    for (t, kind) in neff
        .inputs
        .iter()
        .map(|t| (t, "input"))
        .chain(neff.outputs.iter().map(|t| (t, "output")))
    {
        if t.size > MAX_TENSOR_BYTES {
            return Err(format!(
                "{kind} {:?} is {} bytes; a golden file holds whole tensors, and nrt neff record takes at most {MAX_TENSOR_BYTES} bytes ({} MiB) per tensor",
                t.name,
                t.size,
                MAX_TENSOR_BYTES >> 20
            ));
        }
        golden::safetensors_dtype(t.dtype).map_err(|e| format!("{kind} {:?}: {e}", t.name))?;
    }
    let mut config = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    if config.funtime {
        return Err(
            "NEURON_RT_FUNTIME=1: executions would not run, so there is nothing to record".into(),
        );
    }
    let dev = crate::open_device().map_err(|e| crate::error_chain(&e))?;
    config.lnc_on(dev.info().arch)?;
    if config.visible_cores.is_none() {
        config.num_cores = 1;
    }
    let backend = dev.backend_name();
    let rt = Runtime::init(Arc::from(dev), config).map_err(|e| e.to_string())?;
    let result = run(&rt, &neff, &bytes, executions, seed, backend)
        .map_err(|e| format!("{}: {e}", file.display()));
    rt.close();
    let (recorded, source) = result?;
    let bytes = golden::write(out, &neff, source, &recorded)?;
    Ok(Recording {
        executions,
        source,
        bytes,
    })
}

/// Refuses an `--out` that could not be written before any execution runs: a directory, or
/// a file in a directory that does not exist.
fn check_out(out: &Path) -> Result<(), String> {
    if out.is_dir() {
        return Err(format!("--out {}: is a directory", out.display()));
    }
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(format!(
            "--out {}: directory {} does not exist",
            out.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// Loads the NEFF, runs the executions and reads every tensor back; returns them and the
/// `source` metadata.
fn run(
    rt: &Runtime,
    neff: &neff::Neff,
    bytes: &[u8],
    executions: u32,
    seed: u64,
    backend: &str,
) -> Result<(Vec<golden::Recorded>, &'static str), String> {
    let model = rt.load(bytes, 0).map_err(|e| format!("load: {e}"))?;
    let c = bench::neff_core(rt, 0, model, neff, seed)?;
    let before = bench::nc_counters(rt.device().as_ref());
    let mut recorded = Vec::new();
    for k in 0..executions {
        let seed_k = seed.wrapping_add(u64::from(k));
        if k > 0 {
            bench::fill_neff_inputs(neff, &c, seed_k)?;
        }
        rt.execute(c.model, &c.ins, &c.outs)
            .map_err(|e| format!("execution {k}: {e}"))?;
        let mut e = golden::Recorded::default();
        for (name, t) in &c.named {
            let mut buf = vec![0u8; usize::try_from(t.size()).map_err(|e| e.to_string())?];
            t.read(&mut buf, 0)
                .map_err(|e| format!("execution {k}: reading {name:?} back: {e}"))?;
            if neff.inputs.iter().any(|i| i.name == *name) {
                e.inputs.push((name.clone(), buf));
            } else {
                e.outputs.push((name.clone(), buf));
            }
        }
        recorded.push(e);
    }
    let source = if backend == "sim" {
        match bench::neff_outputs(&before, &bench::nc_counters(rt.device().as_ref())) {
            Some(NeffOutputs::Reference) => "simdev reference",
            Some(NeffOutputs::Mixed) => "simdev shape-only and reference",
            Some(NeffOutputs::ShapeOnly) | None => "simdev shape-only",
        }
    } else {
        "silicon"
    };
    rt.unload(model).map_err(|e| format!("unload: {e}"))?;
    Ok((recorded, source))
}
