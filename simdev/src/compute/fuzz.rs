//! Test support: a deterministic generator and random instructions, valid-looking or not
//! (shared by the compute unit tests and the device's fuzz of whole executions).

use shared::exec_request::Engine;
use shared::isa::{ARG_WORDS, Instruction, Opcode};

use super::engines_of;

/// A small deterministic generator (splitmix64).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(crate) fn word(&mut self) -> u32 {
        u32::try_from(self.next() >> 32).unwrap()
    }

    /// One of `items`.
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::try_from(self.below(u64::try_from(items.len()).unwrap())).unwrap()]
    }

    /// A small integer in `-r..=r` as f32 (exact in bf16 for r ≤ 256, sums exact in f32).
    pub(crate) fn int(&mut self, r: i64) -> f32 {
        let span = u64::try_from(2 * r + 1).unwrap();
        let v = i64::try_from(self.below(span)).unwrap() - r;
        f32::from(i16::try_from(v).unwrap())
    }

    /// A value in [-4, 4] with 1/64 steps (exact in bf16 and f32).
    pub(crate) fn frac(&mut self) -> f32 {
        self.int(256) / 64.0
    }

    pub(crate) fn ints(&mut self, n: usize, r: i64) -> Vec<f32> {
        (0..n).map(|_| self.int(r)).collect()
    }

    pub(crate) fn fracs(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.frac()).collect()
    }
}

/// The compute opcodes.
pub(crate) const COMPUTE_OPS: [Opcode; 8] = [
    Opcode::Matmul,
    Opcode::Activation,
    Opcode::TensorTensor,
    Opcode::TensorScalar,
    Opcode::Reduce,
    Opcode::Copy,
    Opcode::Transpose,
    Opcode::Iota,
];

/// A tile with mostly sane, sometimes wild fields.
pub(crate) fn wild_tile(rng: &mut Rng) -> [u32; 3] {
    let space = if rng.below(16) == 0 {
        rng.below(4)
    } else {
        rng.below(2)
    };
    let dtype = if rng.below(16) == 0 {
        rng.below(4)
    } else {
        rng.below(2)
    };
    let start = match rng.below(8) {
        0 => rng.below(256),
        _ => rng.below(8),
    };
    let partitions = match rng.below(16) {
        0 => rng.below(512),
        1 => 128,
        _ => 1 + rng.below(16),
    };
    let mut w0 = u32::try_from(space | dtype << 2 | start << 8 | partitions << 16).unwrap();
    if rng.below(32) == 0 {
        w0 |= rng.word();
    }
    let offset = match rng.below(8) {
        0 => rng.word(),
        1 => 65536 - 4 * u32::try_from(rng.below(16)).unwrap(),
        2 => 16384 - 4 * u32::try_from(rng.below(16)).unwrap(),
        _ => 4 * u32::try_from(rng.below(64)).unwrap(),
    };
    let elems = match rng.below(8) {
        0 => rng.word(),
        1 => rng.pick(&[128, 4096, 16384, 32768]),
        _ => u32::try_from(rng.below(40)).unwrap(),
    };
    [w0, offset, elems]
}

/// A random instruction of a compute opcode with wild operands.
pub(crate) fn wild_instruction(rng: &mut Rng) -> Instruction {
    let op = rng.pick(&COMPUTE_OPS);
    wild_operands(rng, op)
}

/// A random compute instruction that `engine` may run, with wild operands (any compute
/// opcode for SP, which may run none).
pub(crate) fn wild_instruction_on(rng: &mut Rng, engine: Engine) -> Instruction {
    let allowed: Vec<Opcode> = COMPUTE_OPS
        .into_iter()
        .filter(|&op| engines_of(op).is_some_and(|e| e.contains(&engine)))
        .collect();
    let op = if allowed.is_empty() {
        rng.pick(&COMPUTE_OPS)
    } else {
        rng.pick(&allowed)
    };
    wild_operands(rng, op)
}

/// Compute opcode `op` with wild operands, often shaped to pass the shape rules.
fn wild_operands(rng: &mut Rng, op: Opcode) -> Instruction {
    let mut args = [0u32; ARG_WORDS];
    for chunk in args[..9].chunks_mut(3) {
        chunk.copy_from_slice(&wild_tile(rng));
    }
    for a in &mut args[6..] {
        *a = match rng.below(4) {
            0 => rng.word(),
            1 => rng.pick(&[f32::NAN, f32::INFINITY, 1.0, -0.5]).to_bits(),
            _ => u32::try_from(rng.below(8)).unwrap(),
        };
    }
    if rng.below(4) != 0 {
        // Shapes that fit together for the op, so the checks get past them to the rest.
        let shape = |w: [u32; 3], partitions: u32, elems: u32| {
            [
                (w[0] & !(0x1FF << 16)) | (partitions & 0x1FF) << 16,
                w[1],
                elems,
            ]
        };
        let [d0, d1, d2] = [args[0], args[1], args[2]];
        let (p, e) = ((d0 >> 16) & 0x1FF, d2);
        let (t1, t2) = ([args[3], args[4], args[5]], [args[6], args[7], args[8]]);
        let (t1, t2) = match op {
            Opcode::Matmul => {
                let k = 1 + u32::try_from(rng.below(128)).unwrap();
                (shape(t1, k, p), shape(t2, k, e))
            }
            Opcode::Reduce => {
                args[2] = 1;
                (shape(t1, p, e), t2)
            }
            Opcode::Transpose => (shape(t1, e, p), t2),
            _ => (shape(t1, p, e), shape(t2, p, e)),
        };
        if op == Opcode::Matmul {
            args[0] = (d0 & !0xF) | 1;
        }
        args[3..6].copy_from_slice(&t1);
        if matches!(op, Opcode::Matmul | Opcode::TensorTensor) {
            args[6..9].copy_from_slice(&t2);
        }
        let _ = d1;
    }
    Instruction {
        opcode: op as u8,
        flags: u8::try_from(rng.below(8)).unwrap(),
        args,
        ..Instruction::default()
    }
}

/// Random bytes (half the time with a compute opcode), or a compute opcode with wild operands.
pub(crate) fn random_instruction(rng: &mut Rng) -> Instruction {
    if rng.below(2) == 0 {
        let mut bytes = [0u8; 64];
        for b in &mut bytes {
            *b = u8::try_from(rng.below(256)).unwrap();
        }
        if rng.below(2) == 0 {
            bytes[0] = rng.pick(&COMPUTE_OPS) as u8;
        }
        zerocopy::FromBytes::read_from_bytes(&bytes[..]).unwrap()
    } else {
        wild_instruction(rng)
    }
}
