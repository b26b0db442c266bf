//! Each compute instruction against a straightforward reference computed here, the checks of
//! [`decode`], and a fuzz of random instructions through [`decode`] and [`execute`].

use shared::isa::Instruction;

use super::fuzz::{Rng, random_instruction};
use super::*;

fn n(t: &Tile) -> usize {
    idx(t.partitions) * idx(t.elems)
}

fn put(state: &mut ComputeState, tile: Tile, values: &[f32]) {
    assert_eq!(values.len(), n(&tile));
    state.scatter(&tile, values).unwrap();
}

fn get(state: &mut ComputeState, tile: Tile) -> Vec<f32> {
    state.gather(&tile).unwrap()
}

/// Decodes `inst` for `engine` and executes it.
fn run(state: &mut ComputeState, engine: Engine, inst: &Instruction) -> Result<Effect, String> {
    let op = inst.op().ok_or("undefined opcode")?;
    let decoded = decode(engine, op, inst)?.ok_or("a control opcode")?;
    assert_eq!(decoded.opcode(), op);
    execute(state, &decoded).map_err(|e| e.to_string())
}

fn ok(state: &mut ComputeState, engine: Engine, inst: &Instruction) -> Effect {
    run(state, engine, inst).unwrap_or_else(|e| panic!("{inst:?}: {e}"))
}

/// Random small integers (exact in fp32) written to `stat_t` and `mov_t`, then `inst` (a
/// matmul of the two) run; returns their product by the reference.
fn random_matmul(
    s: &mut ComputeState,
    rng: &mut Rng,
    (stat_t, mov_t): (Tile, Tile),
    inst: &Instruction,
) -> Vec<f32> {
    let stat = rng.ints(n(&stat_t), 8);
    let mov = rng.ints(n(&mov_t), 8);
    put(s, stat_t, &stat);
    put(s, mov_t, &mov);
    ok(s, Engine::Pe, inst);
    let (k, m, nn) = (stat_t.partitions, stat_t.elems, mov_t.elems);
    reference_matmul(&stat, &mov, idx(k), idx(m), idx(nn))
}

fn refused(engine: Engine, inst: &Instruction) -> String {
    let op = inst.op().unwrap();
    match decode(engine, op, inst) {
        Err(rule) => rule,
        Ok(decoded) => panic!("{inst:?} decoded as {decoded:?}"),
    }
}

fn close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 2e-6 * w.abs().max(1.0);
        assert!(
            (f64::from(g) - w).abs() <= tol,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// `out[m][n] = Σ_k stat[k][m] · mov[k][n]`, plainly.
fn reference_matmul(stat: &[f32], mov: &[f32], k: usize, m: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                out[i * n + j] += stat[kk * m + i] * mov[kk * n + j];
            }
        }
    }
    out
}

fn matmul(dst: Tile, stat: Tile, mov: Tile) -> Instruction {
    Instruction::with_tiles(Opcode::Matmul, &[dst, stat, mov], &[])
}

#[test]
fn matmul_with_k_below_128_and_bf16_operands() {
    let mut s = ComputeState::new();
    let mut rng = Rng(1);
    let (k, m, nn) = (5u32, 3u32, 7u32);
    let stat_t = Tile::sbuf(10, k, 100, m);
    let mov_t = Tile::sbuf(10, k, 200, nn).with_dtype(Dt::Bf16);
    let dst = Tile::psum(2, m, 64, nn);
    let stat = rng.ints(n(&stat_t), 20);
    let mov = rng.ints(n(&mov_t), 20);
    put(&mut s, stat_t, &stat);
    put(&mut s, mov_t, &mov);
    let effect = ok(&mut s, Engine::Pe, &matmul(dst, stat_t, mov_t));
    assert!(!effect.non_finite);
    let want = reference_matmul(&stat, &mov, idx(k), idx(m), idx(nn));
    assert_eq!(get(&mut s, dst), want, "integers: exact");
    // Overwrite, not accumulate.
    ok(&mut s, Engine::Pe, &matmul(dst, stat_t, mov_t));
    assert_eq!(get(&mut s, dst), want);
}

#[test]
fn matmul_with_k_128_and_accumulation() {
    let mut s = ComputeState::new();
    let mut rng = Rng(2);
    let (k, m, nn) = (128u32, 64u32, 300u32);
    let stat_t = Tile::sbuf(0, k, 0, m);
    let mov_t = Tile::sbuf(0, k, 4096, nn);
    let dst = Tile::psum(64, m, 0, nn);
    let first = random_matmul(
        &mut s,
        &mut rng,
        (stat_t, mov_t),
        &matmul(dst, stat_t, mov_t),
    );
    assert_eq!(get(&mut s, dst), first);
    // A second product accumulated on top.
    let accumulate = matmul(dst, stat_t, mov_t).accumulate();
    let second = random_matmul(&mut s, &mut rng, (stat_t, mov_t), &accumulate);
    let sum: Vec<f32> = first.iter().zip(&second).map(|(a, b)| a + b).collect();
    assert_eq!(get(&mut s, dst), sum);
    // Fractions: close to the plain loop.
    let stat3 = rng.fracs(n(&stat_t));
    let mov3 = rng.fracs(n(&mov_t));
    put(&mut s, stat_t, &stat3);
    put(&mut s, mov_t, &mov3);
    ok(&mut s, Engine::Pe, &matmul(dst, stat_t, mov_t));
    let want: Vec<f64> = reference_matmul(&stat3, &mov3, idx(k), idx(m), idx(nn))
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    let got = get(&mut s, dst);
    for (g, w) in got.iter().zip(&want) {
        assert!((f64::from(*g) - w).abs() < 1e-3, "{g} vs {w}");
    }
}

#[test]
fn the_public_matmul_helper_checks_shapes() {
    let stat = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // K = 2, M = 3
    let mov = [1.0, 0.0, 0.0, 1.0]; // K = 2, N = 2
    let mut out = [7.0f32; 6];
    matmul_f32(&stat, &mov, 2, 3, 2, &mut out).unwrap();
    assert_eq!(out, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    matmul_f32_accumulate(&stat, &mov, 2, 3, 2, &mut out).unwrap();
    assert_eq!(out, [2.0, 8.0, 4.0, 10.0, 6.0, 12.0]);
    let err = matmul_f32(&stat, &mov, 2, 3, 3, &mut out).unwrap_err();
    assert_eq!((err.moving, err.out), (4, 6));
    assert!(matmul_f32(&[], &[], 0, 0, 0, &mut []).is_ok());
    let mut zeros = [5.0f32; 4];
    matmul_f32(&[], &[], 0, 2, 2, &mut zeros).unwrap();
    assert_eq!(zeros, [0.0; 4], "K = 0 is an empty sum");
}

fn reference_act(f: ActFunc, x: f64) -> f64 {
    let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
    match f {
        ActFunc::Identity => x,
        ActFunc::Relu => x.max(0.0),
        ActFunc::Sigmoid => sigmoid(x),
        ActFunc::Tanh => x.tanh(),
        ActFunc::Exp => x.exp(),
        ActFunc::Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044_715 * x.powi(3))).tanh())
        }
        ActFunc::Silu => x * sigmoid(x),
    }
}

#[test]
fn every_activation_function_with_scale_and_bias() {
    let mut s = ComputeState::new();
    s.set_tables_loaded(true);
    let mut rng = Rng(3);
    let src = Tile::sbuf(3, 6, 0, 40);
    let dst = Tile::sbuf(3, 6, 1024, 40);
    let x = rng.fracs(n(&src));
    put(&mut s, src, &x);
    // Per-partition biases at byte 8192 of each destination partition.
    let biases: Vec<f32> = (0..6)
        .map(|p| f32::from(u8::try_from(p).unwrap()) * 0.25 - 0.5)
        .collect();
    put(&mut s, Tile::sbuf(3, 6, 8192, 1), &biases);
    let scale = 0.75f32;
    for func in ActFunc::ALL {
        for (mode, bias_word) in [(0u32, 0u32), (1, 0.5f32.to_bits()), (2, 8192)] {
            let inst = Instruction::with_tiles(
                Opcode::Activation,
                &[dst, src],
                &[func as u32, scale.to_bits(), mode, bias_word],
            );
            assert!(!ok(&mut s, Engine::Act, &inst).non_finite);
            let want: Vec<f64> = x
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let b = match mode {
                        0 => 0.0,
                        1 => 0.5,
                        _ => f64::from(biases[i / 40]),
                    };
                    reference_act(func, f64::from(v) * f64::from(scale) + b)
                })
                .collect();
            close(
                &get(&mut s, dst),
                &want,
                &format!("{func:?} bias mode {mode}"),
            );
        }
    }
    // bf16 in place: the source is read whole before the destination is written.
    let t = Tile::sbuf(0, 2, 0, 8).with_dtype(Dt::Bf16);
    let xs = rng.fracs(16);
    put(&mut s, t, &xs);
    let inst = Instruction::with_tiles(
        Opcode::Activation,
        &[t, t],
        &[ActFunc::Exp as u32, 1.0f32.to_bits(), 0, 0],
    );
    ok(&mut s, Engine::Act, &inst);
    let want: Vec<f32> = xs
        .iter()
        .map(|&v| bf16_to_f32(f32_to_bf16(v.exp())))
        .collect();
    assert_eq!(get(&mut s, t), want);
}

#[test]
fn activation_needs_the_tables() {
    let mut s = ComputeState::new();
    let t = Tile::sbuf(0, 1, 0, 4);
    let inst = Instruction::with_tiles(Opcode::Activation, &[t, t], &[0, 1.0f32.to_bits(), 0]);
    let err = run(&mut s, Engine::Act, &inst).unwrap_err();
    assert!(err.contains("activation tables not loaded"), "{err}");
    s.set_tables_loaded(true);
    ok(&mut s, Engine::Act, &inst);
    s.clear();
    assert!(!s.tables_loaded());
}

const ALU_OPS: [AluOp; 6] = [
    AluOp::Add,
    AluOp::Subtract,
    AluOp::Multiply,
    AluOp::Max,
    AluOp::Min,
    AluOp::Divide,
];

fn reference_alu(op: AluOp, a: f32, b: f32) -> f32 {
    match op {
        AluOp::Add => a + b,
        AluOp::Subtract => a - b,
        AluOp::Multiply => a * b,
        AluOp::Max => {
            if a >= b {
                a
            } else {
                b
            }
        }
        AluOp::Min => {
            if a <= b {
                a
            } else {
                b
            }
        }
        AluOp::Divide => a / b,
    }
}

/// Non-zero values, so Divide stays finite.
fn nonzero(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = rng.frac();
            if v == 0.0 { 1.0 } else { v }
        })
        .collect()
}

#[test]
fn every_alu_op_of_tensor_tensor() {
    let mut s = ComputeState::new();
    let mut rng = Rng(4);
    let a_t = Tile::sbuf(0, 9, 0, 33);
    let b_t = Tile::psum(50, 9, 12, 33).with_dtype(Dt::Bf16);
    let a = rng.fracs(n(&a_t));
    let b = nonzero(&mut rng, n(&b_t));
    put(&mut s, a_t, &a);
    put(&mut s, b_t, &b);
    for (engine, dt) in [(Engine::Dve, Dt::F32), (Engine::Pool, Dt::Bf16)] {
        let dst = Tile::sbuf(100, 9, 500, 33).with_dtype(dt);
        for op in ALU_OPS {
            let inst =
                Instruction::with_tiles(Opcode::TensorTensor, &[dst, a_t, b_t], &[op as u32]);
            assert!(!ok(&mut s, engine, &inst).non_finite);
            let want: Vec<f32> = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| {
                    let v = reference_alu(op, x, y);
                    if dt == Dt::Bf16 {
                        bf16_to_f32(f32_to_bf16(v))
                    } else {
                        v
                    }
                })
                .collect();
            assert_eq!(get(&mut s, dst), want, "{op:?} to {dt:?} on {engine:?}");
        }
    }
}

#[test]
fn every_alu_op_of_tensor_scalar_with_immediate_and_per_partition_scalars() {
    let mut s = ComputeState::new();
    let mut rng = Rng(5);
    let src = Tile::sbuf(20, 7, 0, 50);
    let dst = Tile::sbuf(60, 7, 0, 50);
    let x = rng.fracs(n(&src));
    put(&mut s, src, &x);
    // The per-partition scalars sit at byte 4000 of the destination's partitions.
    let per = nonzero(&mut rng, 7);
    put(&mut s, Tile::sbuf(60, 7, 4000, 1), &per);
    for engine in [Engine::Dve, Engine::Pool, Engine::Act] {
        for op in ALU_OPS {
            for (mode, word) in [(1u32, (-1.25f32).to_bits()), (2, 4000)] {
                let inst = Instruction::with_tiles(
                    Opcode::TensorScalar,
                    &[dst, src],
                    &[op as u32, mode, word],
                );
                assert!(!ok(&mut s, engine, &inst).non_finite);
                let want: Vec<f32> = x
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| {
                        let sc = if mode == 1 { -1.25 } else { per[i / 50] };
                        reference_alu(op, v, sc)
                    })
                    .collect();
                assert_eq!(get(&mut s, dst), want, "{op:?} mode {mode} on {engine:?}");
            }
        }
    }
}

#[test]
fn max_and_min_propagate_nan() {
    let mut s = ComputeState::new();
    let a = Tile::sbuf(0, 1, 0, 3);
    let b = Tile::sbuf(0, 1, 64, 3);
    let d = Tile::sbuf(0, 1, 128, 3);
    put(&mut s, a, &[f32::NAN, 1.0, 2.0]);
    put(&mut s, b, &[0.0, f32::NAN, 3.0]);
    for op in [AluOp::Max, AluOp::Min] {
        let inst = Instruction::with_tiles(Opcode::TensorTensor, &[d, a, b], &[op as u32]);
        assert!(ok(&mut s, Engine::Dve, &inst).non_finite);
        let got = get(&mut s, d);
        assert!(got[0].is_nan() && got[1].is_nan(), "{op:?}: {got:?}");
        assert_eq!(got[2], reference_alu(op, 2.0, 3.0));
    }
}

#[test]
fn reduce_sum_and_max_along_the_free_axis() {
    let mut s = ComputeState::new();
    let mut rng = Rng(6);
    let src = Tile::sbuf(0, 128, 0, 1000).with_dtype(Dt::Bf16);
    let x = rng.ints(n(&src), 100);
    put(&mut s, src, &x);
    for (engine, op) in [(Engine::Dve, ReduceOp::Sum), (Engine::Pool, ReduceOp::Max)] {
        let dst = Tile::psum(0, 128, 8, 1);
        let inst = Instruction::with_tiles(Opcode::Reduce, &[dst, src], &[op as u32]);
        ok(&mut s, engine, &inst);
        let want: Vec<f32> = x
            .chunks(1000)
            .map(|row| match op {
                ReduceOp::Sum => row.iter().sum(),
                ReduceOp::Max => row.iter().copied().fold(f32::MIN, f32::max),
            })
            .collect();
        assert_eq!(get(&mut s, dst), want, "{op:?}");
    }
}

#[test]
fn copy_rounds_f32_to_bf16_ties_to_even_and_widens_bf16_exactly() {
    let mut s = ComputeState::new();
    let bits: [u32; 8] = [
        0x3F80_0000, // 1.0
        0x3F80_8000, // 1 + 2^-8: a tie, to the even 1.0
        0x3F81_8000, // 1 + 3·2^-8: a tie, to the even 0x3F82
        0x3F80_8001, // above half: up
        0x3F80_7FFF, // below half: down
        0xBF81_8000, // negative tie: to even
        0x7F7F_FFFF, // f32::MAX: rounds to infinity
        0x0000_0001, // the smallest subnormal: to +0
    ];
    let want: [u16; 8] = [
        0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82, 0x7F80, 0x0000,
    ];
    let src = Tile::sbuf(5, 1, 16, 8);
    let dst = Tile::sbuf(5, 1, 256, 8).with_dtype(Dt::Bf16);
    let values: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    put(&mut s, src, &values);
    let inst = Instruction::with_tiles(Opcode::Copy, &[dst, src], &[]);
    assert!(
        ok(&mut s, Engine::Act, &inst).non_finite,
        "f32::MAX became an infinity"
    );
    let mut raw = [0u8; 16];
    assert!(s.read_sbuf(5, 256, &mut raw));
    let got: Vec<u16> = raw
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(got, want);
    // bf16 → f32 is exact.
    let back = Tile::sbuf(5, 1, 512, 8);
    let inst = Instruction::with_tiles(Opcode::Copy, &[back, dst], &[]);
    ok(&mut s, Engine::Pool, &inst);
    let widened: Vec<f32> = want.iter().map(|&b| bf16_to_f32(b)).collect();
    assert_eq!(get(&mut s, back), widened);
    // Without the infinity, nothing is non-finite.
    let finite = Tile::sbuf(5, 1, 16, 6);
    let inst = Instruction::with_tiles(
        Opcode::Copy,
        &[Tile::sbuf(5, 1, 1024, 6).with_dtype(Dt::Bf16), finite],
        &[],
    );
    assert!(!ok(&mut s, Engine::Dve, &inst).non_finite);
}

#[test]
fn transpose_of_small_and_full_tiles() {
    let mut s = ComputeState::new();
    let mut rng = Rng(7);
    for (p, f) in [(5u32, 7u32), (128, 128), (1, 128), (128, 1)] {
        let src = Tile::sbuf(0, p, 0, f);
        let dst = Tile::sbuf(0, f, 1024, p).with_dtype(Dt::Bf16);
        let x = rng.fracs(n(&src));
        put(&mut s, src, &x);
        ok(
            &mut s,
            Engine::Dve,
            &Instruction::with_tiles(Opcode::Transpose, &[dst, src], &[]),
        );
        let (pu, fu) = (idx(p), idx(f));
        let want: Vec<f32> = (0..fu)
            .flat_map(|j| (0..pu).map(move |i| (i, j)))
            .map(|(i, j)| x[i * fu + j])
            .collect();
        assert_eq!(get(&mut s, dst), want, "{p} × {f}");
    }
}

#[test]
fn iota_in_wrapping_i32_rounded_once() {
    let mut s = ComputeState::new();
    let dst = Tile::sbuf(2, 3, 40, 4);
    let words = |base: i32, pstep: i32, step: i32| {
        [base, pstep, step].map(|v| u32::from_ne_bytes(v.to_ne_bytes()))
    };
    let inst = Instruction::with_tiles(Opcode::Iota, &[dst], &words(10, 100, -3));
    ok(&mut s, Engine::Pool, &inst);
    let want: Vec<f32> = (0..3)
        .flat_map(|p| (0..4).map(move |i| f32::from(i16::try_from(10 + 100 * p - 3 * i).unwrap())))
        .collect();
    assert_eq!(get(&mut s, dst), want, "p is relative to the tile");
    // Wrapping past i32::MAX.
    let one = Tile::sbuf(0, 1, 0, 2);
    ok(
        &mut s,
        Engine::Pool,
        &Instruction::with_tiles(Opcode::Iota, &[one], &words(i32::MAX, 0, 1)),
    );
    assert_eq!(get(&mut s, one), [2_147_483_648.0, -2_147_483_648.0]);
    // bf16: 257 is a tie (to the even 256); 2^24 + 2^16 + 1 is above half way and must round
    // up to 2^24 + 2^17 (through f32 first it would tie down to 2^24).
    let bf = Tile::sbuf(0, 1, 64, 2).with_dtype(Dt::Bf16);
    ok(
        &mut s,
        Engine::Pool,
        &Instruction::with_tiles(Opcode::Iota, &[bf], &words(257, 0, 16_842_496)),
    );
    assert_eq!(get(&mut s, bf), [256.0, 16_908_288.0]);
    ok(
        &mut s,
        Engine::Pool,
        &Instruction::with_tiles(Opcode::Iota, &[bf], &words(-257, 0, -16_842_496)),
    );
    assert_eq!(get(&mut s, bf), [-256.0, -16_908_288.0]);
    assert_eq!(i32_to_bf16_value(i32::MIN), -2_147_483_648.0);
    assert_eq!(i32_to_bf16_value(0), 0.0);
}

#[test]
fn non_finite_results_are_written_and_reported() {
    let mut s = ComputeState::new();
    s.set_tables_loaded(true);
    let t = Tile::sbuf(0, 1, 0, 3);
    let d = Tile::sbuf(0, 1, 64, 3);
    put(&mut s, t, &[0.0, 1.0, 100.0]);
    let div = Instruction::with_tiles(Opcode::TensorTensor, &[d, t, t], &[AluOp::Divide as u32]);
    assert!(ok(&mut s, Engine::Dve, &div).non_finite);
    let got = get(&mut s, d);
    assert!(got[0].is_nan());
    assert_eq!(&got[1..], [1.0, 1.0]);
    let exp = Instruction::with_tiles(
        Opcode::Activation,
        &[d, t],
        &[ActFunc::Exp as u32, 1.0f32.to_bits(), 0],
    );
    assert!(ok(&mut s, Engine::Act, &exp).non_finite);
    assert_eq!(get(&mut s, d)[2], f32::INFINITY);
}

#[test]
fn sbuf_window_access_stays_inside_a_partition() {
    let mut s = ComputeState::new();
    let mut out = [9u8; 4];
    assert!(s.read_sbuf(127, 65532, &mut out));
    assert_eq!(out, [0; 4], "an untouched SBUF reads as zeros");
    assert!(s.write_sbuf(127, 65532, &[1, 2, 3, 4]));
    assert!(!s.write_sbuf(127, 65533, &[1, 2, 3, 4]));
    assert!(!s.write_sbuf(128, 0, &[1]));
    assert!(!s.read_sbuf(0, u64::MAX, &mut out));
    assert!(s.read_sbuf(127, 65532, &mut out));
    assert_eq!(out, [1, 2, 3, 4]);
    assert_eq!(
        get(&mut s, Tile::sbuf(127, 1, 65532, 1)),
        [f32::from_le_bytes([1, 2, 3, 4])]
    );
    s.clear();
    assert!(s.read_sbuf(127, 65532, &mut out));
    assert_eq!(out, [0; 4], "cleared");
}

#[test]
fn wrong_engines_are_refused() {
    let t = Tile::sbuf(0, 1, 0, 1);
    let cases = [
        (Opcode::Matmul, [Engine::Pe].as_slice()),
        (Opcode::Activation, &[Engine::Act]),
        (Opcode::TensorTensor, &[Engine::Dve, Engine::Pool]),
        (
            Opcode::TensorScalar,
            &[Engine::Dve, Engine::Pool, Engine::Act],
        ),
        (Opcode::Reduce, &[Engine::Dve, Engine::Pool]),
        (Opcode::Copy, &[Engine::Act, Engine::Dve, Engine::Pool]),
        (Opcode::Transpose, &[Engine::Dve]),
        (Opcode::Iota, &[Engine::Pool]),
    ];
    for (op, allowed) in cases {
        assert_eq!(engines_of(op), Some(allowed));
        let inst = Instruction::with_tiles(op, &[t, t, t], &[]);
        for engine in Engine::ALL {
            if !allowed.contains(&engine) {
                let rule = refused(engine, &inst);
                assert!(
                    rule.contains("runs on") && rule.contains(&format!("not on {}", engine.name())),
                    "{op:?} on {engine:?}: {rule}"
                );
            }
        }
    }
    for op in [
        Opcode::Nop,
        Opcode::End,
        Opcode::DmaStart,
        Opcode::DmaWait,
        Opcode::WaitEvent,
    ] {
        assert_eq!(engines_of(op), None);
        assert_eq!(decode(Engine::Pe, op, &Instruction::new(op, &[])), Ok(None));
    }
}

#[test]
fn bad_tiles_and_shapes_are_refused_with_the_rule() {
    let good = Tile::sbuf(0, 4, 0, 8);
    let tt = |d: Tile, a: Tile, b: Tile, op: u32| {
        Instruction::with_tiles(Opcode::TensorTensor, &[d, a, b], &[op])
    };
    let mut bad_space = good.encode();
    bad_space[0] |= 3;
    let mut reserved = good.encode();
    reserved[0] |= 1 << 30;
    let raw = |w: [u32; 3]| {
        let mut args = w.to_vec();
        args.extend(good.encode());
        args.extend(good.encode());
        Instruction::new(Opcode::TensorTensor, &args)
    };
    let cases: Vec<(Engine, Instruction, &str)> = vec![
        (Engine::Dve, raw(bad_space), "undefined space or dtype"),
        (Engine::Dve, raw(reserved), "reserved bits"),
        (
            Engine::Dve,
            tt(Tile::sbuf(0, 0, 0, 8), good, good, 0),
            "0 partitions",
        ),
        (
            Engine::Dve,
            tt(Tile::sbuf(125, 4, 0, 8), good, good, 0),
            "partitions 125..129",
        ),
        (
            Engine::Dve,
            tt(Tile::sbuf(0, 200, 0, 8), good, good, 0),
            "partitions 0..200",
        ),
        (
            Engine::Dve,
            tt(Tile::sbuf(0, 4, 0, 0), good, good, 0),
            "0 elements",
        ),
        (
            Engine::Dve,
            tt(good, Tile::sbuf(0, 4, 65536 - 28, 8), good, 0),
            "ends at byte 65540",
        ),
        (
            Engine::Dve,
            tt(good, good, Tile::psum(0, 4, 16384 - 16, 8), 0),
            "16384-byte PSUM",
        ),
        (
            Engine::Dve,
            tt(good, good, Tile::sbuf(0, 4, u32::MAX, u32::MAX), 0),
            "past the",
        ),
        (Engine::Dve, tt(good, good, good, 6), "ALU op 6"),
        (
            Engine::Dve,
            tt(good, Tile::sbuf(0, 4, 0, 9), good, 0),
            "a is 4 × 9 but dst is 4 × 8",
        ),
        (
            Engine::Dve,
            tt(good, good, Tile::sbuf(0, 3, 0, 8), 0),
            "b is 3 × 8",
        ),
        (
            Engine::Pe,
            matmul(good, good, good),
            "Matmul dst must be an fp32 PSUM tile",
        ),
        (
            Engine::Pe,
            matmul(Tile::psum(0, 8, 0, 8).with_dtype(Dt::Bf16), good, good),
            "not bf16 PSUM",
        ),
        (
            Engine::Pe,
            matmul(Tile::psum(0, 8, 0, 8), good, Tile::sbuf(0, 5, 0, 8)),
            "stationary has K = 4 but moving has 5",
        ),
        (
            Engine::Pe,
            matmul(Tile::psum(0, 7, 0, 8), good, good),
            "dst has 7 partitions but stationary has M = 8",
        ),
        (
            Engine::Pe,
            matmul(Tile::psum(0, 8, 0, 9), good, good),
            "dst has 9 elements but moving has N = 8",
        ),
        (
            Engine::Act,
            Instruction::with_tiles(Opcode::Activation, &[good, good], &[7, 0, 0, 0]),
            "activation function 7",
        ),
        (
            Engine::Act,
            Instruction::with_tiles(Opcode::Activation, &[good, good], &[0, 0, 3, 0]),
            "bias scalar mode 3",
        ),
        (
            Engine::Act,
            Instruction::with_tiles(Opcode::Activation, &[good, good], &[0, 0, 2, 65533]),
            "per-partition scalars at SBUF byte 65533",
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::TensorScalar, &[good, good], &[0, 0, 0]),
            "scalar mode None",
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Reduce, &[Tile::sbuf(0, 4, 0, 2), good], &[0]),
            "1 element per partition, not 2",
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Reduce, &[Tile::sbuf(0, 3, 0, 1), good], &[0]),
            "Reduce dst has 3 partitions but src has 4",
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Reduce, &[Tile::sbuf(0, 4, 0, 1), good], &[2]),
            "reduce op 2",
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Copy, &[good, Tile::sbuf(0, 4, 0, 16)], &[]),
            "src is 4 × 16",
        ),
        (
            Engine::Dve,
            Instruction::with_tiles(Opcode::Transpose, &[good, good], &[]),
            "needs a 8 × 4 dst, not 4 × 8",
        ),
        (
            Engine::Dve,
            Instruction::with_tiles(
                Opcode::Transpose,
                &[Tile::sbuf(0, 4, 0, 129), Tile::sbuf(0, 4, 0, 129)],
                &[],
            ),
            "Transpose of 129 elements per partition",
        ),
        (
            Engine::Pool,
            Instruction::with_tiles(Opcode::Iota, &[Tile::psum(0, 1, 0, 4097)], &[]),
            "past the 16384-byte PSUM partition",
        ),
    ];
    for (engine, inst, expected) in cases {
        let rule = refused(engine, &inst);
        assert!(rule.contains(expected), "{expected}: {rule}");
    }
    // Only the shape must match: a source on other partitions is fine.
    let shifted = Instruction::with_tiles(
        Opcode::Activation,
        &[good, Tile::sbuf(1, 4, 0, 8)],
        &[0, 0, 0, 0],
    );
    assert!(decode(Engine::Act, Opcode::Activation, &shifted).is_ok_and(|d| d.is_some()));
}

#[test]
fn random_instructions_never_panic() {
    let mut rng = Rng(8);
    let mut s = ComputeState::new();
    let (mut decoded, mut executed) = (0, 0);
    for i in 0..20_000 {
        s.set_tables_loaded(i % 3 != 0);
        let inst = random_instruction(&mut rng);
        let Some(op) = inst.op() else { continue };
        // Mostly an engine that may run the opcode.
        let engine = match engines_of(op) {
            Some(allowed) if rng.below(4) != 0 => {
                allowed[usize::try_from(rng.below(u64::try_from(allowed.len()).unwrap())).unwrap()]
            }
            _ => Engine::ALL[usize::try_from(rng.below(5)).unwrap()],
        };
        if let Ok(Some(op)) = decode(engine, op, &inst) {
            decoded += 1;
            if execute(&mut s, &op).is_ok() {
                executed += 1;
            }
        }
    }
    assert!(
        decoded > 500 && executed > 500,
        "{decoded} decoded, {executed} executed"
    );
}

/// The SBUF DMA window's in-place accessors: a range inside one partition is lent where it
/// lies (partitions do not overlap in simdev's padded layout: a whole partition written
/// leaves its neighbours' bytes alone), a range that leaves its partition or a partition past
/// the last is refused, and an SBUF never written reads as zeros without being allocated.
#[test]
fn the_sbuf_window_lends_ranges_inside_one_partition_and_refuses_the_rest() {
    let mut s = ComputeState::new();
    assert_eq!(s.sbuf_bytes(127, 65528, 8), Some(&[0u8; 8][..]));
    assert_eq!(s.sbuf_bytes(0, 0, 65536).map(<[u8]>::len), Some(65536));
    assert!(s.sbuf.is_none(), "reading allocated nothing");
    let refused: [(u32, u64, usize); 6] = [
        (128, 0, 1),
        (0, 65535, 2),
        (3, 65536, 1),
        (0, 0, 65537),
        (0, u64::MAX, 1),
        (u32::MAX, 0, 1),
    ];
    for (p, offset, len) in refused {
        assert!(s.sbuf_bytes(p, offset, len).is_none(), "{p} {offset} {len}");
        assert!(
            s.sbuf_bytes_mut(p, offset, len).is_none(),
            "{p} {offset} {len}"
        );
    }
    assert!(s.sbuf.is_none(), "refusals allocated nothing");
    for p in [0, 5, 126] {
        s.sbuf_bytes_mut(p, 0, 65536).unwrap().fill(0xA5);
    }
    for (p, offset) in [(1, 0), (4, 65532), (6, 0), (125, 65532), (127, 0)] {
        assert_eq!(
            s.sbuf_bytes(p, offset, 4),
            Some(&[0u8; 4][..]),
            "{p} {offset}"
        );
    }
    s.sbuf_bytes_mut(6, 100, 4)
        .unwrap()
        .copy_from_slice(&[1, 2, 3, 4]);
    assert_eq!(s.sbuf_bytes(6, 98, 8), Some(&[0, 0, 1, 2, 3, 4, 0, 0][..]));
    let mut word = [0u8; 4];
    assert!(s.read_sbuf(6, 100, &mut word));
    assert_eq!(word, [1, 2, 3, 4]);
    assert_eq!(s.sbuf_bytes(5, 65532, 4), Some(&[0xA5u8; 4][..]));
}

/// SBUF and PSUM are allocated on their own huge-page-aligned mappings (`pages`): every tile
/// walk down the partitions then stays within a few TLB entries.
#[test]
fn sbuf_and_psum_start_on_a_huge_page_boundary() {
    let mut s = ComputeState::new();
    for space in [Space::Sbuf, Space::Psum] {
        let at = s.buffer(space).as_ptr() as usize;
        assert_eq!(at % (2 << 20), 0, "{space:?} at {at:#x}");
    }
}

/// A matmul whose stationary and moving operands are fp32 SBUF tiles reads both where they
/// lie: nothing is gathered into the scratch operands (the stationary operand used to be),
/// and the product is the reference's.
#[test]
fn a_matmul_of_sbuf_fp32_operands_gathers_neither() {
    let mut s = ComputeState::new();
    let mut rng = Rng(61);
    let (k, m, nn) = (64u32, 10u32, 37u32);
    let stat_t = Tile::sbuf(3, k, 4100, m);
    let mov_t = Tile::sbuf(3, k, 200, nn);
    let dst = Tile::psum(1, m, 8, nn);
    let want = random_matmul(
        &mut s,
        &mut rng,
        (stat_t, mov_t),
        &matmul(dst, stat_t, mov_t),
    );
    assert!(
        s.scratch.a.is_empty(),
        "the stationary operand was gathered"
    );
    assert!(s.scratch.b.is_empty(), "the moving operand was gathered");
    assert_eq!(get(&mut s, dst), want);
}

/// The most lines of one tile — `partitions` rows of `lines` cache lines, all at the same
/// offset of their partitions of `space` — that fall in one set of a cache of `sets` sets
/// (set = line address mod `sets`, as in the second-level caches simdev runs on).
fn deepest_set(space: Space, partitions: u32, lines: u32, sets: u32) -> u32 {
    let stride = partition_stride(space) / CACHE_LINE;
    let mut count = vec![0u32; sets as usize];
    for p in 0..partitions {
        for l in 0..lines {
            count[((p * stride + l) % sets) as usize] += 1;
        }
    }
    count.into_iter().max().unwrap_or(0)
}

#[test]
fn a_tiles_rows_spread_over_the_cache_sets() {
    for space in [Space::Sbuf, Space::Psum] {
        // 128 rows of 23 lines (360 f32, the digits MLP at batch 360): 2944 lines in 2048 sets.
        // With partitions one line more than a power of two apart, SBUF's put 12 in a set.
        assert!(deepest_set(space, 128, 23, 2048) <= 2, "{space:?}");
        assert!(deepest_set(space, 128, 57, 2048) <= 4, "{space:?}");
        assert!(deepest_set(space, 128, 23, 1024) <= 4, "{space:?}");
        // A transpose's 8 × 8 block: its 8 rows in 8 different first-level sets (64 sets).
        let stride = partition_stride(space) / CACHE_LINE;
        let sets: std::collections::BTreeSet<u32> = (0..8).map(|p| (p * stride) % 64).collect();
        assert_eq!(sets.len(), 8, "{space:?}");
    }
}
