//! The compute path allocates nothing in the steady state, counted by the crate's per-thread
//! counting allocator ([`crate::alloc_count`]), so tests running beside it on other threads do
//! not disturb the count.

use shared::isa::{ActFunc, AluOp, Instruction, ReduceOp, ScalarMode};

use super::*;
use crate::alloc_count::counting;

/// The instructions of a digits-like execution at batch 360 (three 128-row tiles): input
/// transposes, three matmul + bias/ReLU layers, output transposes and a softmax's
/// arithmetic, plus every other opcode once.
fn program() -> Vec<(Engine, Op)> {
    let batch = 360u32;
    let (xin, xt, w, bias, h, out, tmp) = (0u32, 1024, 4096, 8192, 9216, 12288, 16384);
    let mut insts: Vec<(Engine, Instruction)> = Vec::new();
    insts.push((
        Engine::Pool,
        Instruction::with_tiles(Opcode::Iota, &[Tile::sbuf(0, 128, xin, 3 * 64)], &[1, 3, 7]),
    ));
    insts.push((
        Engine::Pool,
        Instruction::with_tiles(Opcode::Iota, &[Tile::sbuf(0, 128, w, 64)], &[0, 1, 2]),
    ));
    for t in 0..3u32 {
        let rows = (batch - t * 128).min(128);
        insts.push((
            Engine::Dve,
            Instruction::with_tiles(
                Opcode::Transpose,
                &[
                    Tile::sbuf(0, 64, xt + t * 512, rows),
                    Tile::sbuf(0, rows, xin + t * 256, 64),
                ],
                &[],
            ),
        ));
    }
    for (l, (k, m)) in [(64u32, 64u32), (64, 32), (32, 10)].into_iter().enumerate() {
        let moving = if l == 0 { xt } else { h };
        let psum = Tile::psum(0, m, 0, batch);
        insts.push((
            Engine::Pe,
            Instruction::with_tiles(
                Opcode::Matmul,
                &[
                    psum,
                    Tile::sbuf(0, k, w, m),
                    Tile::sbuf(0, k, moving, batch),
                ],
                &[],
            ),
        ));
        insts.push((
            Engine::Act,
            Instruction::with_tiles(
                Opcode::Activation,
                &[Tile::sbuf(0, m, h, batch), psum],
                &[
                    ActFunc::Relu as u32,
                    1.0f32.to_bits(),
                    ScalarMode::PerPartition as u32,
                    bias,
                ],
            ),
        ));
    }
    let o = Tile::sbuf(0, 120, out, 10);
    insts.push((
        Engine::Dve,
        Instruction::with_tiles(Opcode::Transpose, &[o, Tile::sbuf(0, 10, h, 120)], &[]),
    ));
    let m = Tile::sbuf(0, 120, tmp, 1);
    insts.push((
        Engine::Dve,
        Instruction::with_tiles(Opcode::Reduce, &[m, o], &[ReduceOp::Max as u32]),
    ));
    insts.push((
        Engine::Dve,
        Instruction::with_tiles(
            Opcode::TensorScalar,
            &[o, o],
            &[AluOp::Subtract as u32, ScalarMode::PerPartition as u32, tmp],
        ),
    ));
    insts.push((
        Engine::Dve,
        Instruction::with_tiles(Opcode::TensorTensor, &[o, o, o], &[AluOp::Max as u32]),
    ));
    insts.push((
        Engine::Pool,
        Instruction::with_tiles(
            Opcode::Copy,
            &[Tile::sbuf(0, 120, tmp + 64, 10).with_dtype(Dt::Bf16), o],
            &[],
        ),
    ));
    insts.push((
        Engine::Pe,
        Instruction::with_tiles(
            Opcode::Matmul,
            &[
                Tile::psum(0, 10, 0, 120),
                Tile::sbuf(0, 10, w, 10),
                Tile::sbuf(0, 10, out, 120),
            ],
            &[],
        )
        .accumulate(),
    ));
    insts
        .into_iter()
        .map(|(engine, inst)| {
            let op = decode(engine, inst.op().unwrap(), &inst)
                .unwrap_or_else(|rule| panic!("{inst:?}: {rule}"))
                .expect("a compute op");
            (engine, op)
        })
        .collect()
}

#[test]
fn a_steady_state_execution_of_compute_instructions_allocates_nothing() {
    // The counter counts (so the bound below cannot hold vacuously).
    let ((), n) = counting(|| drop(std::hint::black_box(vec![0u8; 64])));
    assert_eq!(n, 1);

    let program = program();
    let mut state = ComputeState::new();
    state.set_tables_loaded(true);
    // Warm-up: SBUF, PSUM and the scratch buffers grow here.
    for _ in 0..2 {
        for (_, op) in &program {
            execute(&mut state, op).unwrap();
        }
    }
    let ((), n) = counting(|| {
        for _ in 0..5 {
            for (_, op) in &program {
                execute(&mut state, op).unwrap();
            }
        }
    });
    let per_execution = n as f64 / 5.0;
    assert_eq!(
        per_execution,
        0.0,
        "{per_execution} allocations per execution of {} compute instructions",
        program.len()
    );
}
