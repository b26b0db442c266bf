//! The allocation-free interpreter against the one it replaced: the previous `execute` (every
//! operand gathered into a new vector, results collected into another, the matmul through
//! `matrixmultiply::sgemm`) is kept here as the oracle, and both run the same random
//! instructions on the same random SBUF and PSUM; simdev's GEMM kernel against
//! `matrixmultiply::sgemm` over random shapes.

use shared::isa::Instruction;

use super::fuzz::{Rng, random_instruction, wild_instruction_on};
use super::*;

/// The previous interpreter, verbatim but for its matmul, which calls the GEMM crate.
fn naive_execute(state: &mut ComputeState, op: &Op) -> Result<Effect, ExecError> {
    let scalars = |state: &mut ComputeState, scalar: Scalar, dst: &Tile| -> Vec<f32> {
        let mut out = Vec::new();
        state.scalars_into(scalar, dst, &mut out).unwrap();
        out
    };
    let non_finite = match op.0 {
        Kind::Matmul {
            dst,
            stationary,
            moving,
            accumulate,
        } => {
            let stat = state.gather(&stationary)?;
            let mov = state.gather(&moving)?;
            let (k, m, n) = (
                idx(stationary.partitions),
                idx(stationary.elems),
                idx(moving.elems),
            );
            let mut out = if accumulate {
                state.gather(&dst)?
            } else {
                vec![0.0; m * n]
            };
            crate_sgemm(&stat, &mov, (k, m, n), &mut out, accumulate);
            state.scatter(&dst, &out)?
        }
        Kind::Activation {
            dst,
            src,
            func,
            scale,
            bias,
        } => {
            if !state.tables_loaded {
                return Err(ExecError::TablesNotLoaded);
            }
            let x = state.gather(&src)?;
            let bias = scalars(state, bias, &dst);
            let out: Vec<f32> = x
                .chunks(idx(src.elems).max(1))
                .zip(bias)
                .flat_map(|(row, b)| row.iter().map(move |&v| activate(func, v * scale + b)))
                .collect();
            state.scatter(&dst, &out)?
        }
        Kind::TensorTensor { dst, a, b, op } => {
            let a = state.gather(&a)?;
            let b = state.gather(&b)?;
            let out: Vec<f32> = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| alu_apply(op, x, y))
                .collect();
            state.scatter(&dst, &out)?
        }
        Kind::TensorScalar {
            dst,
            src,
            op,
            scalar,
        } => {
            let x = state.gather(&src)?;
            let s = scalars(state, scalar, &dst);
            let out: Vec<f32> = x
                .chunks(idx(src.elems).max(1))
                .zip(s)
                .flat_map(|(row, s)| row.iter().map(move |&v| alu_apply(op, v, s)))
                .collect();
            state.scatter(&dst, &out)?
        }
        Kind::Reduce { dst, src, op } => {
            let x = state.gather(&src)?;
            let out: Vec<f32> = x
                .chunks(idx(src.elems).max(1))
                .map(|row| match op {
                    ReduceOp::Sum => row.iter().fold(0.0, |acc, &v| acc + v),
                    ReduceOp::Max => row.iter().copied().fold(f32::NEG_INFINITY, max_nan),
                })
                .collect();
            state.scatter(&dst, &out)?
        }
        Kind::Copy { dst, src } => {
            let x = state.gather(&src)?;
            state.scatter(&dst, &x)?
        }
        Kind::Transpose { dst, src } => {
            let x = state.gather(&src)?;
            let (p, f) = (idx(src.partitions), idx(src.elems));
            let out: Vec<f32> = (0..f)
                .flat_map(|j| (0..p).map(move |i| (i, j)))
                .map(|(i, j)| x.get(i * f + j).copied().unwrap_or(0.0))
                .collect();
            state.scatter(&dst, &out)?
        }
        Kind::Iota {
            dst,
            base,
            pstep,
            step,
        } => {
            let mut out = Vec::new();
            let mut row = base;
            for _ in 0..dst.partitions {
                let mut v = row;
                for _ in 0..dst.elems {
                    out.push(match dst.dtype {
                        Dt::F32 => v as f32,
                        Dt::Bf16 => i32_to_bf16_value(v),
                    });
                    v = v.wrapping_add(step);
                }
                row = row.wrapping_add(pstep);
            }
            state.scatter(&dst, &out)?
        }
    };
    Ok(Effect { non_finite })
}

/// The previous matmul: `matrixmultiply::sgemm` reading `stat` through transposed strides.
fn crate_sgemm(
    stat: &[f32],
    mov: &[f32],
    (k, m, n): (usize, usize, usize),
    out: &mut [f32],
    accumulate: bool,
) {
    assert_eq!((stat.len(), mov.len(), out.len()), (k * m, k * n, m * n));
    let beta = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: A = statᵀ is M × K at stat[k·M + m], B = mov is K × N at mov[k·N + n], C = out
    // is M × N at out[m·N + n]; the lengths were just asserted, and `out` aliases neither.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            stat.as_ptr(),
            1,
            isize::try_from(m).unwrap(),
            mov.as_ptr(),
            isize::try_from(n).unwrap(),
            1,
            beta,
            out.as_mut_ptr(),
            isize::try_from(n).unwrap(),
            1,
        );
    }
}

/// The same value: equal bits, both NaN (payloads may differ), or both zeros (the GEMM crate
/// itself stores `+0` or `-0` for a `-0` product depending on where the element falls in its
/// blocking).
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a == 0.0 && b == 0.0)
}

fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(g, w),
            "{what}[{i}]: got {g:e} ({:#x}), want {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// A value with a random sign, exponent near 0 and mantissa (so products round), sometimes
/// zero, NaN or infinite.
fn value(rng: &mut Rng) -> f32 {
    match rng.below(64) {
        0 => 0.0,
        1 => -0.0,
        2 => f32::NAN,
        3 => f32::INFINITY,
        _ => {
            let sign = u32::try_from(rng.below(2)).unwrap() << 31;
            let exponent = (120 + u32::try_from(rng.below(14)).unwrap()) << 23;
            let mantissa = rng.word() & 0x007F_FFFF;
            f32::from_bits(sign | exponent | mantissa)
        }
    }
}

#[test]
fn gemm_rounds_as_the_gemm_crate_over_random_shapes() {
    let mut rng = Rng(17);
    for case in 0..300 {
        let k = 1 + usize::try_from(rng.below(128)).unwrap();
        let m = 1 + usize::try_from(rng.below(128)).unwrap();
        let n = 1 + usize::try_from(rng.below(if case % 4 == 0 { 1200 } else { 70 })).unwrap();
        let finite = |rng: &mut Rng| loop {
            let v = value(rng);
            if v.is_finite() || case % 8 == 0 {
                return v;
            }
        };
        let stat: Vec<f32> = (0..k * m).map(|_| finite(&mut rng)).collect();
        let mov: Vec<f32> = (0..k * n).map(|_| finite(&mut rng)).collect();
        let old: Vec<f32> = (0..m * n).map(|_| finite(&mut rng)).collect();
        for accumulate in [false, true] {
            let mut want = old.clone();
            crate_sgemm(&stat, &mov, (k, m, n), &mut want, accumulate);
            let mut got = old.clone();
            sgemm(
                &stat,
                &mov,
                (k, m, n),
                &mut got,
                accumulate,
                &mut Vec::new(),
            )
            .unwrap();
            assert_same(
                &got,
                &want,
                &format!("K {k} M {m} N {n} accumulate {accumulate}"),
            );
        }
    }
}

/// `rows` × `cols` of `v` placed at `start` with rows `stride` apart in a slice of `filler`s.
fn placed(v: &[f32], (rows, cols): (usize, usize), (start, stride): (usize, usize)) -> Vec<f32> {
    let mut out = vec![-7.5f32; start + rows * stride];
    for (r, row) in v.chunks(cols).enumerate() {
        out[start + r * stride..][..cols].copy_from_slice(row);
    }
    out
}

/// The kernel on the layouts of SBUF and PSUM tiles (rows apart by more than their length, at
/// an offset), and with `k` past a partition count (the kernel that reads the moving matrix in
/// place), against the crate on contiguous copies; nothing between the output's rows is
/// touched.
#[test]
fn gemm_on_strided_layouts_and_long_k_rounds_as_the_gemm_crate() {
    let mut rng = Rng(31);
    for case in 0..120 {
        let k = 1 + usize::try_from(rng.below(if case % 3 == 0 { 300 } else { 128 })).unwrap();
        let m = 1 + usize::try_from(rng.below(40)).unwrap();
        let n = 1 + usize::try_from(rng.below(90)).unwrap();
        let gap = |rng: &mut Rng| usize::try_from(rng.below(9)).unwrap();
        let l = gemm::Layout {
            stat: (gap(&mut rng), m + gap(&mut rng)),
            mov: (gap(&mut rng), n + gap(&mut rng)),
            out: (gap(&mut rng), n + gap(&mut rng)),
        };
        let stat: Vec<f32> = (0..k * m).map(|_| value(&mut rng)).collect();
        let mov: Vec<f32> = (0..k * n).map(|_| value(&mut rng)).collect();
        let old: Vec<f32> = (0..m * n).map(|_| value(&mut rng)).collect();
        for accumulate in [false, true] {
            let mut want = old.clone();
            crate_sgemm(&stat, &mov, (k, m, n), &mut want, accumulate);
            let mut got = placed(&old, (m, n), l.out);
            gemm::gemm(
                &placed(&stat, (k, m), l.stat),
                &placed(&mov, (k, n), l.mov),
                (k, m, n),
                l,
                &mut got,
                accumulate,
                &mut Vec::new(),
            );
            let what = format!("K {k} M {m} N {n} {l:?} accumulate {accumulate}");
            assert_same(&got, &placed(&want, (m, n), l.out), &what);
        }
    }
}

/// Both states' SBUF and PSUM, compared value by value (4-byte words).
fn assert_same_state(got: &mut ComputeState, want: &mut ComputeState, what: &str) {
    for space in [Space::Sbuf, Space::Psum] {
        let words = |s: &mut ComputeState| -> Vec<f32> {
            s.buffer(space)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let (g, w) = (words(got), words(want));
        assert_same(&g, &w, &format!("{what}: {}", space_name(space)));
    }
}

#[test]
fn execute_matches_the_previous_interpreter_on_random_instructions() {
    let mut rng = Rng(23);
    let mut new = ComputeState::new();
    let mut old = ComputeState::new();
    // Random values in the first 8 KiB of every SBUF and PSUM partition (where most random
    // tiles fall), the same in both.
    for space in [Space::Sbuf, Space::Psum] {
        let tile = Tile::sbuf(0, 128, 0, 2048);
        let tile = Tile { space, ..tile };
        let values: Vec<f32> = (0..128 * 2048).map(|_| value(&mut rng)).collect();
        new.scatter(&tile, &values).unwrap();
        old.scatter(&tile, &values).unwrap();
    }
    let mut executed = 0;
    for i in 0..6000 {
        let tables = i % 5 != 0;
        new.set_tables_loaded(tables);
        old.set_tables_loaded(tables);
        let inst: Instruction = if i % 2 == 0 {
            random_instruction(&mut rng)
        } else {
            let engine = rng.pick(&Engine::ALL);
            wild_instruction_on(&mut rng, engine)
        };
        let Some(opcode) = inst.op() else { continue };
        let Some(&engine) = engines_of(opcode).and_then(|e| e.first()) else {
            continue;
        };
        let Ok(Some(op)) = decode(engine, opcode, &inst) else {
            continue;
        };
        let got = execute(&mut new, &op);
        let want = naive_execute(&mut old, &op);
        assert_eq!(got, want, "instruction {i}: {op:?}");
        executed += usize::from(got.is_ok());
        if i % 500 == 0 {
            assert_same_state(&mut new, &mut old, &format!("after instruction {i}"));
        }
    }
    assert_same_state(&mut new, &mut old, "at the end");
    assert!(executed > 300, "{executed} executed");
}

#[test]
fn the_layer_builders_matmul_and_activation_write_their_tiles_directly_and_match_the_previous_interpreter()
 {
    use shared::isa::{ActFunc, Opcode, ScalarMode};
    let mut rng = Rng(29);
    let mut new = ComputeState::new();
    let mut old = ComputeState::new();
    // A batch of 200 columns of 64 features at 0, weights 64 × 32 at 4096, a bias per partition
    // at 4224, the layer's output at 8192; one infinity among the inputs.
    let (x, w, b, h, out) = (0, 4096, 4224, 8192, 16384);
    let fill = |state: &mut ComputeState, tile: Tile, values: &[f32]| {
        state.scatter(&tile, values).unwrap();
    };
    let mut xs: Vec<f32> = (0..64 * 200).map(|_| value(&mut rng)).collect();
    xs[777] = f32::INFINITY;
    let ws: Vec<f32> = (0..64 * 32).map(|_| value(&mut rng)).collect();
    let bs: Vec<f32> = (0..32).map(|_| value(&mut rng)).collect();
    for state in [&mut new, &mut old] {
        state.set_tables_loaded(true);
        fill(state, Tile::sbuf(0, 64, x, 200), &xs);
        fill(state, Tile::sbuf(0, 64, w, 32), &ws);
        fill(state, Tile::sbuf(0, 32, b, 1), &bs);
    }
    let program = [
        (
            Engine::Pe,
            Instruction::with_tiles(
                Opcode::Matmul,
                &[
                    Tile::psum(0, 32, 0, 200),
                    Tile::sbuf(0, 64, w, 32),
                    Tile::sbuf(0, 64, x, 200),
                ],
                &[],
            ),
        ),
        (
            Engine::Act,
            Instruction::with_tiles(
                Opcode::Activation,
                &[Tile::sbuf(0, 32, h, 200), Tile::psum(0, 32, 0, 200)],
                &[
                    ActFunc::Relu as u32,
                    1.0f32.to_bits(),
                    ScalarMode::PerPartition as u32,
                    b,
                ],
            ),
        ),
        (
            Engine::Dve,
            Instruction::with_tiles(
                Opcode::Transpose,
                &[
                    Tile::sbuf(0, 120, out, 32),
                    Tile::sbuf(0, 32, h + 80 * 4, 120),
                ],
                &[],
            ),
        ),
    ];
    for (i, (engine, inst)) in program.iter().enumerate() {
        let opcode = inst.op().unwrap();
        let op = decode(*engine, opcode, inst).unwrap().unwrap();
        new.scratch = Scratch::default();
        let got = execute(&mut new, &op).unwrap();
        let want = naive_execute(&mut old, &op).unwrap();
        assert_eq!(got, want, "op {i}: {op:?}");
        assert_same_state(&mut new, &mut old, &format!("after op {i}"));
        let s = &new.scratch;
        match opcode {
            // The result goes straight to PSUM: no result buffer.
            Opcode::Matmul => assert_eq!(s.c.capacity(), 0, "the matmul's result was buffered"),
            // Rows straight from PSUM to SBUF: nothing gathered.
            Opcode::Activation => assert_eq!(
                (s.a.capacity(), s.b.capacity()),
                (0, 0),
                "the activation gathered its source"
            ),
            _ => {}
        }
    }
    assert!(
        execute(
            &mut new,
            &decode(Engine::Pe, Opcode::Matmul, &program[0].1)
                .unwrap()
                .unwrap()
        )
        .unwrap()
        .non_finite,
        "the infinity reached the matmul's output"
    );
}

/// The layer builder's transposes (a tile of input rows into columns, the last layer's columns
/// back into rows), one whose destination overlaps its source and one of a bf16 source, run
/// in place (no result buffer) and leave the same SBUF and effects as the previous
/// interpreter. An fp32 source that does not overlap its destination (in the same space,
/// sharing partitions but not bytes, or in the other space) is read where it lies: nothing is
/// gathered; an overlapping or bf16 source is gathered first.
#[test]
fn transposes_write_their_destination_rows_in_place_and_match_the_previous_interpreter() {
    use shared::isa::Dt;
    let mut rng = Rng(37);
    let mut new = ComputeState::new();
    let mut old = ComputeState::new();
    let mut xs: Vec<f32> = (0..128 * 2048).map(|_| value(&mut rng)).collect();
    xs[5] = f32::INFINITY;
    for state in [&mut new, &mut old] {
        state.scatter(&Tile::sbuf(0, 128, 0, 2048), &xs).unwrap();
    }
    let bf16 = Tile {
        dtype: Dt::Bf16,
        ..Tile::sbuf(0, 40, 4096, 24)
    };
    // (dst, src, whether the source is read in place).
    let cases = [
        (
            Tile::sbuf(0, 64, 2048, 120),
            Tile::sbuf(0, 120, 0, 64),
            true,
        ),
        (
            Tile::sbuf(0, 120, 6000, 10),
            Tile::sbuf(0, 10, 512, 120),
            true,
        ),
        // Overlapping: partitions 3..20 at bytes 100..180 are in both.
        (Tile::sbuf(3, 30, 100, 20), Tile::sbuf(0, 20, 96, 30), false),
        // Its own transpose, in place over itself.
        (
            Tile::sbuf(5, 16, 300, 16),
            Tile::sbuf(5, 16, 300, 16),
            false,
        ),
        // Touching but not overlapping: the source ends where the destination starts.
        (Tile::sbuf(0, 8, 1032, 8), Tile::sbuf(0, 8, 1000, 8), true),
        (Tile::sbuf(0, 24, 7000, 40), bf16, false),
        (Tile::psum(0, 16, 64, 9), Tile::sbuf(0, 9, 0, 16), true),
        (Tile::sbuf(1, 9, 7500, 16), Tile::psum(0, 16, 64, 9), true),
    ];
    for (i, (dst, src, direct)) in cases.into_iter().enumerate() {
        let inst = Instruction::with_tiles(Opcode::Transpose, &[dst, src], &[]);
        let op = decode(Engine::Dve, Opcode::Transpose, &inst)
            .unwrap()
            .unwrap();
        new.scratch = Scratch::default();
        let got = execute(&mut new, &op).unwrap();
        let want = naive_execute(&mut old, &op).unwrap();
        assert_eq!(got, want, "transpose {i}: {op:?}");
        assert_same_state(&mut new, &mut old, &format!("after transpose {i}"));
        assert_eq!(new.scratch.c.capacity(), 0, "transpose {i} was buffered");
        assert_eq!(
            new.scratch.a.capacity() == 0,
            direct,
            "transpose {i}: source gathered ({}) or read in place ({direct})",
            new.scratch.a.capacity()
        );
    }
}

/// Activations of narrow tiles (rows of 1 to 9 values: below, at and above the vector width,
/// as the digits MLP's at batch 1), PSUM to SBUF and SBUF to PSUM, each function, a bias per
/// partition or an immediate, a scale of 1 or not, over values with NaNs, infinities and
/// signed zeros: the same SBUF, PSUM and effects as the previous interpreter.
#[test]
fn narrow_activations_match_the_previous_interpreter() {
    let mut rng = Rng(41);
    let mut new = ComputeState::new();
    let mut old = ComputeState::new();
    let mut values: Vec<f32> = (0..128 * 64).map(|_| value(&mut rng)).collect();
    for (i, special) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0]
        .into_iter()
        .enumerate()
    {
        values[i * 131 + 7] = special;
    }
    for state in [&mut new, &mut old] {
        state.set_tables_loaded(true);
        for space in [Space::Sbuf, Space::Psum] {
            let tile = Tile {
                space,
                ..Tile::sbuf(0, 128, 0, 64)
            };
            state.scatter(&tile, &values).unwrap();
        }
    }
    let mut ran = 0;
    for elems in 1..=9u32 {
        for (f, func) in (0u32..).zip(ActFunc::ALL) {
            for (to_sbuf, per_partition, scale) in [
                (true, true, 1.0f32),
                (false, false, 0.5),
                (true, false, -2.0),
            ] {
                let parts = 1 + (elems * 13 + f * 7) % 100;
                let (src, dst) = (
                    Tile::psum(parts % 5, parts, 4 * elems, elems),
                    Tile::sbuf(parts % 3, parts, 1024 + 4 * elems, elems),
                );
                let (src, dst) = if to_sbuf { (src, dst) } else { (dst, src) };
                let (mode, bias) = if per_partition {
                    (ScalarMode::PerPartition as u32, 8 * elems)
                } else {
                    (ScalarMode::Immediate as u32, 0.25f32.to_bits())
                };
                let inst = Instruction::with_tiles(
                    Opcode::Activation,
                    &[dst, src],
                    &[func as u32, scale.to_bits(), mode, bias],
                );
                let op = decode(Engine::Act, Opcode::Activation, &inst)
                    .unwrap()
                    .unwrap();
                let got = execute(&mut new, &op);
                let want = naive_execute(&mut old, &op);
                assert_eq!(got, want, "{elems} values, {func:?}: {op:?}");
                ran += 1;
            }
        }
        assert_same_state(&mut new, &mut old, &format!("after rows of {elems}"));
    }
    assert_eq!(ran, 9 * 7 * 3);
}
