//! simdev's `Matmul` instruction (SBUF to PSUM through simdev's own kernel, at the widest vector
//! level this CPU runs) beside the GEMM crate called directly on the same shapes, in the same
//! run: the digits MLP's layers at batch 360 and batch 1, and two larger ones.
//!
//! Run: `cargo bench -p tests --bench matmul`. Figures are printed, not asserted.

use std::time::Instant;

use shared::exec_request::Engine;
use shared::isa::{Instruction, Opcode, Tile};
use simdev::compute::{ComputeState, decode, execute};

fn gflops(k: usize, m: usize, n: usize, secs: f64) -> f64 {
    2.0 * (k * m * n) as f64 / secs / 1e9
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!(
        "ratio: simdev's GFLOP/s over sgemm's (above 1, simdev is faster; at N = 1 sgemm's \
         fixed cost per call dominates)"
    );
    println!(
        "{:>18} {:>14} {:>14} {:>8}",
        "K x M x N", "simdev GFLOP/s", "sgemm GFLOP/s", "ratio"
    );
    for (k, m, n) in [
        (64usize, 64usize, 360usize),
        (64, 32, 360),
        // The digits MLP at batch 1: one column.
        (64, 64, 1),
        (64, 32, 1),
        (32, 10, 1),
        (128, 128, 512),
        (128, 128, 4096),
    ] {
        let (ku, mu, nu) = (
            u32::try_from(k).unwrap(),
            u32::try_from(m).unwrap(),
            u32::try_from(n).unwrap(),
        );
        // Stationary [K x M] at SBUF offset 0, moving [K x N] after it; PSUM [M x N].
        let stat = Tile::sbuf(0, ku, 0, mu);
        let mov = Tile::sbuf(0, ku, mu * 4, nu);
        let dst = Tile::psum(0, mu, 0, nu);
        let inst = Instruction::with_tiles(Opcode::Matmul, &[dst, stat, mov], &[]);
        let op = decode(Engine::Pe, Opcode::Matmul, &inst)
            .unwrap()
            .expect("a compute op");
        let mut state = ComputeState::new();
        let reps = (2_000_000_000 / (2 * k * m * n)).clamp(20, 20_000);
        for _ in 0..3 {
            execute(&mut state, &op).unwrap();
        }
        let t = Instant::now();
        for _ in 0..reps {
            execute(&mut state, &op).unwrap();
        }
        let sim = gflops(k, m, n, t.elapsed().as_secs_f64() / reps as f64);
        // The crate directly: out[M x N] = stat^T [M x K] · mov [K x N], stat read transposed.
        let a: Vec<f32> = (0..k * m).map(|i| (i % 7) as f32 * 0.25).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        let mut c = vec![0f32; m * n];
        let run = |c: &mut [f32]| {
            // SAFETY: a is K x M (row stride M), read as M x K via strides (1, M); b is K x N
            // row-major; c is M x N row-major; all slices hold exactly those many elements.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    a.as_ptr(),
                    1,
                    m as isize,
                    b.as_ptr(),
                    n as isize,
                    1,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        };
        for _ in 0..3 {
            run(&mut c);
        }
        let t = Instant::now();
        for _ in 0..reps {
            run(&mut c);
        }
        let raw = gflops(k, m, n, t.elapsed().as_secs_f64() / reps as f64);
        println!(
            "{:>18} {sim:>14.2} {raw:>14.2} {:>8.2}",
            format!("{k} x {m} x {n}"),
            sim / raw
        );
    }
}
