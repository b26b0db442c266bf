//! The digits MLP executed on a real simdev process beside its floors, measured in the same run
//! and interleaved (one of each in turn, so both see the same machine):
//!
//! - batch 360 against a straight forward pass of the same network on the same inputs in this
//!   process: `matrixmultiply::sgemm` per layer (`X · W`, row-major), then bias and ReLU;
//! - batch 1 against the identity model of the same input bytes (256), the execute round trip
//!   with no arithmetic.
//!
//! Every execution's logits are checked against the forward pass (exactly equal: simdev's
//! kernel rounds as the GEMM crate does).
//!
//! Run: `cargo bench -p tests --bench digits_forward`. Figures are printed, not asserted.

use std::time::{Duration, Instant};

use runtime::builder::digits::{self, CLASSES, Digits, FEATURES};
use runtime::config::RuntimeConfig;
use runtime::{Placement, Runtime, TensorSet};
use shared::model::Target;
use tests::bench::{IdentityIo, percentile, private_simdev, run_as_simdev_if_asked, us};

/// `x [rows × k] · w [k × n] + b`, then ReLU unless `last`: the straight forward pass of one
/// layer.
fn dense(x: &[f32], rows: usize, (w, b): &(Vec<f32>, Vec<f32>), last: bool, y: &mut Vec<f32>) {
    let (k, n) = (x.len() / rows, b.len());
    y.clear();
    y.resize(rows * n, 0.0);
    // SAFETY: x is rows × k (row stride k), w is k × n (row stride n), y is rows × n (row
    // stride n); the lengths are exactly those, and y aliases neither input.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            n as isize,
            1,
            0.0,
            y.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    for row in y.chunks_mut(n) {
        for (v, bias) in row.iter_mut().zip(b) {
            *v += bias;
            if !last {
                *v = v.max(0.0);
            }
        }
    }
}

/// The forward pass of the three layers over `rows` images; the logits in `bufs.1`.
fn forward(data: &Digits, x: &[f32], rows: usize, bufs: &mut (Vec<f32>, Vec<f32>)) {
    dense(x, rows, &data.layers[0], false, &mut bufs.0);
    dense(&bufs.0, rows, &data.layers[1], false, &mut bufs.1);
    std::mem::swap(&mut bufs.0, &mut bufs.1);
    dense(&bufs.0, rows, &data.layers[2], true, &mut bufs.1);
}

fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

/// The digits model at `batch` loaded on core 0 with its tensors.
struct DigitsIo {
    model: runtime::ModelHandle,
    input: runtime::Tensor,
    output: runtime::Tensor,
    inputs: TensorSet,
    outputs: TensorSet,
}

fn load_digits(rt: &Runtime, data: &Digits, batch: u32) -> DigitsIo {
    let container = data
        .mlp()
        .build(batch)
        .unwrap()
        .to_container(Target::Simdev)
        .unwrap();
    let model = rt.load(&container, 0).unwrap();
    let core0 = Placement::Device { vnc: 0 };
    let b = u64::from(batch);
    let input = rt
        .tensor_allocate(core0, b * FEATURES as u64 * 4, "digits-in")
        .unwrap();
    let output = rt
        .tensor_allocate(core0, b * CLASSES as u64 * 4, "digits-out")
        .unwrap();
    let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
    inputs.add("input", &input);
    outputs.add("output", &output);
    DigitsIo {
        model,
        input,
        output,
        inputs,
        outputs,
    }
}

fn p50_p99(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (us(percentile(&v, 500)), us(percentile(&v, 990)))
}

fn main() {
    run_as_simdev_if_asked();
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let data = Digits::load(&digits::default_path()).unwrap();
    let dev = std::sync::Arc::new(private_simdev(&["--hbm", "256M"]));
    let rt = Runtime::init(
        dev,
        RuntimeConfig {
            exec_timeout: Duration::from_secs(10),
            ..RuntimeConfig::default()
        },
    )
    .unwrap();

    // Batch 360 against the forward pass.
    let n = 300;
    let d = load_digits(&rt, &data, 360);
    d.input.write(&to_bytes(&data.inputs), 0).unwrap();
    let mut bufs = (Vec::new(), Vec::new());
    forward(&data, &data.inputs, 360, &mut bufs);
    let mut out = vec![0u8; 360 * CLASSES * 4];
    let (mut sim, mut gemm) = (Vec::new(), Vec::new());
    for i in 0..n + 20 {
        let t = Instant::now();
        rt.execute(d.model, &d.inputs, &d.outputs).unwrap();
        let e = t.elapsed();
        let t = Instant::now();
        forward(&data, std::hint::black_box(&data.inputs), 360, &mut bufs);
        let f = t.elapsed();
        if i >= 20 {
            sim.push(e);
            gemm.push(f);
        }
    }
    d.output.read(&mut out, 0).unwrap();
    let logits: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let max_diff = logits
        .iter()
        .zip(&bufs.1)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let ((sp50, sp99), (gp50, gp99)) = (p50_p99(sim), p50_p99(gemm));
    println!("digits batch 360, {n} executions interleaved with the forward pass");
    println!("  simdev execute      p50 {sp50:>8.1} us   p99 {sp99:>8.1} us");
    println!("  sgemm forward pass  p50 {gp50:>8.1} us   p99 {gp99:>8.1} us");
    println!(
        "  ratio (p50)  {:.2}x   (target <= 1.5x)   max |simdev - forward| {max_diff:.2e}",
        sp50 / gp50
    );

    // Batch 1 against the identity model of the same input bytes.
    let n = 2000;
    let one = load_digits(&rt, &data, 1);
    one.input
        .write(&to_bytes(&data.inputs[..FEATURES]), 0)
        .unwrap();
    let id = IdentityIo::load(&rt, u32::try_from(FEATURES * 4).unwrap());
    let (mut sim, mut ident) = (Vec::new(), Vec::new());
    for i in 0..n + 100 {
        let t = Instant::now();
        rt.execute(one.model, &one.inputs, &one.outputs).unwrap();
        let e = t.elapsed();
        let t = Instant::now();
        rt.execute(id.model, &id.inputs, &id.outputs).unwrap();
        let f = t.elapsed();
        if i >= 100 {
            sim.push(e);
            ident.push(f);
        }
    }
    let ((sp50, sp99), (ip50, ip99)) = (p50_p99(sim), p50_p99(ident));
    println!("digits batch 1, {n} executions interleaved with the identity model (256 B)");
    println!("  digits batch 1      p50 {sp50:>8.1} us   p99 {sp99:>8.1} us");
    println!("  identity 256 B      p50 {ip50:>8.1} us   p99 {ip99:>8.1} us");
    println!("  ratio (p50)  {:.2}x   (target <= 2x)", sp50 / ip50);
}
