//! Model builders: assemble model containers for simdev's ISA.
//!
//! [`identity`] is the smallest real model: its SP program starts one I/O ring whose descriptor
//! pairs copy the input tensor to the output tensor (≤ 64 KiB per pair), waits for it and ends;
//! the other four engines only end.

pub mod digits;
pub mod mlp;

pub use mlp::{Layer, MlpBuilder};

use shared::isa::{Instruction, Opcode, encode_program, end_program};
use shared::model::{BufferSpec, DType, IoDesc, IoRing, Model, Operand, TensorSpec, TpbProgram};

/// DMA engine of the identity model's I/O ring.
pub const IDENTITY_ENGINE: u32 = 1;
/// Queue of the identity model's I/O ring.
pub const IDENTITY_QUEUE: u32 = 0;

/// An identity model over `bytes` bytes (u8 tensors `input` → `output`). `exec_req_flags` and
/// the table hashes are parameters so tests can build models that differ in configuration.
///
/// # Panics
/// If `bytes` is 0.
pub fn identity_with(
    bytes: u32,
    name: &str,
    exec_req_flags: [u32; 13],
    table_hash: [u8; 32],
) -> Model {
    assert!(bytes > 0, "an identity model needs at least one byte");
    let spec = |n: &str| TensorSpec {
        name: n.into(),
        dtype: DType::U8,
        shape: vec![bytes],
        size: u64::from(bytes),
    };
    let mut descs = Vec::new();
    let mut off = 0u64;
    while off < u64::from(bytes) {
        let len = (u64::from(bytes) - off).min(65536);
        descs.push(IoDesc {
            src: Operand::Tensor {
                name: "input".into(),
                offset: off,
            },
            dst: Operand::Tensor {
                name: "output".into(),
                offset: off,
            },
            len: u32::try_from(len).unwrap_or(65536),
        });
        off += len;
    }
    let n = u32::try_from(descs.len()).unwrap_or(u32::MAX);
    let sp = encode_program(&[
        Instruction::new(Opcode::DmaStart, &[IDENTITY_ENGINE, IDENTITY_QUEUE, n]),
        Instruction::new(Opcode::DmaWait, &[IDENTITY_ENGINE, IDENTITY_QUEUE]),
        Instruction::new(Opcode::End, &[]),
    ]);
    let ring_descs = shared::udma::ring_size_for(n * 2);
    Model {
        name: name.into(),
        inputs: vec![spec("input")],
        outputs: vec![spec("output")],
        sg_count: 1,
        exec_req_flags,
        act_table_hash: table_hash,
        dve_table_hash: [0; 32],
        has_collectives: false,
        tpbs: vec![TpbProgram {
            blocks: [
                end_program(),
                end_program(),
                end_program(),
                end_program(),
                sp,
            ],
            buffers: vec![],
            io_rings: vec![IoRing {
                engine: IDENTITY_ENGINE,
                queue: IDENTITY_QUEUE,
                ring_descs,
                descs,
            }],
        }],
    }
}

/// The identity model over `bytes` bytes with default configuration.
pub fn identity(bytes: u32) -> Model {
    identity_with(bytes, "identity", [0; 13], [0; 32])
}

/// An identity model for LNC=2: each of the two NCs copies its half of the bytes (the first NC
/// the larger half).
///
/// # Panics
/// If `bytes` is below 2.
pub fn identity_split(bytes: u32) -> Model {
    assert!(bytes >= 2, "two NCs need at least one byte each");
    let mut m = identity_with(bytes, "identity-lnc2", [0; 13], [0; 32]);
    let first = bytes.div_ceil(2);
    let half = |from: u32, len: u32| {
        let mut t = identity_with(len, "half", [0; 13], [0; 32]).tpbs.remove(0);
        for d in &mut t.io_rings[0].descs {
            for op in [&mut d.src, &mut d.dst] {
                if let Operand::Tensor { offset, .. } = op {
                    *offset += u64::from(from);
                }
            }
        }
        t
    };
    m.tpbs = vec![half(0, first), half(first, bytes - first)];
    m.sg_count = 2;
    m
}

/// An identity model with a collectives context of `ctx_bytes` bytes (buffers `cc_ctx`,
/// `cc_ctx_dst`, `cc_one`): a model switch to it loads the context through the cached
/// model-switch chain.
pub fn identity_with_collectives(bytes: u32, ctx_bytes: u64) -> Model {
    let mut m = identity_with(bytes, "identity-cc", [3; 13], [3; 32]);
    m.has_collectives = true;
    let ctx: Vec<u8> = (0..ctx_bytes).map(|i| i.to_le_bytes()[0] ^ 0x5A).collect();
    m.tpbs[0].buffers = vec![
        BufferSpec {
            name: "cc_ctx".into(),
            size: ctx_bytes,
            init: ctx,
        },
        BufferSpec {
            name: "cc_ctx_dst".into(),
            size: ctx_bytes,
            init: Vec::new(),
        },
        BufferSpec {
            name: "cc_one".into(),
            size: 4,
            init: 1u32.to_le_bytes().to_vec(),
        },
    ];
    m
}

/// A model whose SP program waits for event `event` of its NC, which nobody sets: it never
/// ends (a missing completion, for timeout tests).
pub fn never_ending(event: u32) -> Model {
    let mut m = identity_with(1, "never-ending", [0; 13], [0; 32]);
    m.tpbs[0].blocks[4] = encode_program(&[
        Instruction::new(Opcode::WaitEvent, &[event]),
        Instruction::new(Opcode::End, &[]),
    ]);
    m
}

/// An identity model whose SP program also signals program semaphore `semaphore` once and never
/// consumes it: every execution leaves it one higher, which breaks the device contract
/// (`shared::sequencer`, "What an execution leaves behind") — for tests of that contract.
pub fn semaphore_leak(bytes: u32, semaphore: u32) -> Model {
    let mut m = identity_with(bytes, "semaphore-leak", [0; 13], [0; 32]);
    let n = u32::try_from(m.tpbs[0].io_rings[0].descs.len()).unwrap_or(u32::MAX);
    let sem = u8::try_from(semaphore).unwrap_or(u8::MAX);
    m.tpbs[0].blocks[4] = encode_program(&[
        Instruction::new(Opcode::DmaStart, &[IDENTITY_ENGINE, IDENTITY_QUEUE, n]),
        Instruction::new(Opcode::DmaWait, &[IDENTITY_ENGINE, IDENTITY_QUEUE]).signal(sem, 1),
        Instruction::new(Opcode::End, &[]),
    ]);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_splits_into_64k_pairs_and_validates() {
        let m = identity(4 << 20);
        m.validate().unwrap();
        assert_eq!(m.tpbs[0].io_rings[0].descs.len(), 64);
        let odd = identity(65537);
        assert_eq!(
            odd.tpbs[0].io_rings[0]
                .descs
                .iter()
                .map(|d| d.len)
                .collect::<Vec<_>>(),
            [65536, 1]
        );
        never_ending(3).validate().unwrap();
    }
}
