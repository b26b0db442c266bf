//! The simulator ISA: the instruction encoding of the five engines' programs on simdev
//! (DESIGN §6). **Simulator-defined**: the NeuronCore silicon ISA inside a NEFF is not public.
//! The runtime treats instruction blocks as opaque bytes it loads into device memory and whose
//! addresses it patches into the `device_exec_request`; only simdev and the model builder read
//! them.
//!
//! Every instruction is [`INSTRUCTION_SIZE`] (64) little-endian bytes:
//!
//! | offset | field | meaning |
//! |---|---|---|
//! | 0 | `opcode: u8` | [`Opcode`] |
//! | 1 | `flags: u8` | [`FLAG_WAIT`], [`FLAG_SIGNAL`], opcode-specific bits above |
//! | 2 | `wait_sem: u8` | semaphore to wait on (with `FLAG_WAIT`) |
//! | 3 | `signal_sem: u8` | semaphore to add to when done (with `FLAG_SIGNAL`) |
//! | 4 | `wait_value: u32` | wait until `semaphore >= wait_value` |
//! | 8 | `signal_value: u32` | amount added to `signal_sem` |
//! | 12 | `args: [u32; 13]` | operands, per opcode |
//!
//! # Compute state and tiles
//! Each NC has an SBUF of [`SBUF_PARTITIONS`] partitions × [`SBUF_PARTITION_BYTES`] and a PSUM of
//! the same partitions × [`PSUM_PARTITION_BYTES`]. Compute instructions name their operands as
//! [`Tile`]s (3 argument words each): a space (SBUF or PSUM), an element type (fp32 or bf16),
//! partitions `[start, start + count)`, and `elems` elements starting at byte `offset` of every
//! one of those partitions (NKI's layout: the partition dimension first, the free dimension
//! contiguous). Reads convert bf16 to fp32; writes of bf16 round to nearest even. DMA reaches
//! SBUF through the NC's SBUF window ([`crate::AddressMap::sbuf_address`]); PSUM is reached only
//! by engines. An instruction whose operands fall outside their space, overlap the partition
//! count, or mismatch in shape fails the execution; so does an activation before the NC loaded
//! its activation tables (`load_act_dve_tables`). A NaN or infinity written by a compute
//! instruction marks the execution with a numerical error (the results are still delivered).
//!
//! | opcode | engines | args |
//! |---|---|---|
//! | `Matmul` | PE | dst PSUM fp32 [M × N] (0..3), stationary [K × M] (3..6), moving [K × N] (6..9); K ≤ 128 is the contraction over partitions: `dst[m][n] (+)= Σ_k stat[k][m] · mov[k][n]`; [`FLAG_ACCUMULATE`] adds instead of overwriting |
//! | `Activation` | ACT | dst (0..3), src (3..6), [`ActFunc`] (6), scale f32 bits (7), bias [`ScalarMode`] (8), bias (9): `dst = f(src · scale + bias)` |
//! | `TensorTensor` | DVE, POOL | dst (0..3), a (3..6), b (6..9), [`AluOp`] (9): `dst = a op b` |
//! | `TensorScalar` | DVE, POOL, ACT | dst (0..3), src (3..6), [`AluOp`] (6), [`ScalarMode`] (7), scalar (8): `dst = src op s` |
//! | `Reduce` | DVE, POOL | dst [P × 1] (0..3), src [P × F] (3..6), [`ReduceOp`] (6): along the free axis |
//! | `Copy` | ACT, DVE, POOL | dst (0..3), src (3..6): same shape, converting dtypes |
//! | `Transpose` | DVE | dst [F × P] (0..3), src [P × F] (3..6); P, F ≤ 128 |
//! | `Iota` | POOL | dst (0..3), base i32 (3), partition step i32 (4), element step i32 (5): `dst[p][i] = base + p·pstep + i·step` |
//!
//! A [`ScalarMode`] operand is an immediate fp32 (its bits in the next word) or a per-partition
//! vector: one fp32 per destination partition at the given SBUF byte offset of that partition.
//!
//! A program is a sequence of instructions ending with [`Opcode::End`]. An engine executes its
//! instructions in order; before one with `FLAG_WAIT` it blocks until the wait holds; after one
//! with `FLAG_SIGNAL` completes it adds `signal_value` to `signal_sem`. The five engines of an NC
//! synchronise only through these semaphores (and the sequencer's events).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Bytes per instruction.
pub const INSTRUCTION_SIZE: usize = 64;
/// Operand words per instruction.
pub const ARG_WORDS: usize = 13;
/// `flags` bit: wait for `wait_sem >= wait_value` before executing.
pub const FLAG_WAIT: u8 = 1 << 0;
/// `flags` bit: add `signal_value` to `signal_sem` after executing.
pub const FLAG_SIGNAL: u8 = 1 << 1;
/// `flags` bit of `Matmul`: accumulate into PSUM instead of overwriting.
pub const FLAG_ACCUMULATE: u8 = 1 << 2;
/// SBUF (and PSUM) partitions per NC.
pub const SBUF_PARTITIONS: u32 = 128;
/// Bytes of one SBUF partition in simdev (8 MiB of SBUF per NC).
pub const SBUF_PARTITION_BYTES: u32 = 64 * 1024;
/// Bytes of one PSUM partition (2 MiB of PSUM per NC).
pub const PSUM_PARTITION_BYTES: u32 = 16 * 1024;
/// Most instructions one engine may execute in one program (a bound on hostile programs).
pub const MAX_PROGRAM_INSTRUCTIONS: u32 = 1 << 20;

/// Instruction opcodes. Values are ABI (never renumbered).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Opcode {
    /// 0x00: no operation (waits and signals still apply).
    Nop = 0x00,
    /// 0x01: end of the engine's program.
    End = 0x01,
    /// 0x10 (SP): start DMA on one of the NC's queues: `args = [engine, queue, desc_count]`;
    /// adds `desc_count` to the queue's RX then TX tail, as a tail-increment register write does.
    DmaStart = 0x10,
    /// 0x11 (SP): wait for a queue's posted descriptors to finish: `args = [engine, queue]`. A
    /// queue stopped by a DMA abort fails the execution.
    DmaWait = 0x11,
    /// 0x12 (SP): wait until event `args[0]` of this NC is non-zero (set by the host or by
    /// DMA); waiting on an event is waiting for the outside world, never a deadlock.
    WaitEvent = 0x12,
    /// 0x20 (PE): matrix multiply into PSUM (see the table above).
    Matmul = 0x20,
    /// 0x30 (ACT): activation function with scale and bias.
    Activation = 0x30,
    /// 0x40 (DVE, POOL): elementwise op of two tiles.
    TensorTensor = 0x40,
    /// 0x41 (DVE, POOL, ACT): elementwise op of a tile and a scalar.
    TensorScalar = 0x41,
    /// 0x42 (DVE, POOL): reduction along the free axis.
    Reduce = 0x42,
    /// 0x43 (ACT, DVE, POOL): copy with dtype conversion.
    Copy = 0x43,
    /// 0x44 (DVE): transpose of a tile of at most 128 × 128.
    Transpose = 0x44,
    /// 0x50 (POOL): fill with an arithmetic sequence.
    Iota = 0x50,
}

/// Where a tile lives.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    /// The state buffer.
    Sbuf = 0,
    /// The matmul accumulation buffer.
    Psum = 1,
}

/// Element type of a tile.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dt {
    /// IEEE fp32 (4 bytes).
    F32 = 0,
    /// bfloat16 (2 bytes; stores round to nearest even).
    Bf16 = 1,
}

impl Dt {
    /// Bytes per element.
    pub const fn size(self) -> u32 {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }
}

/// A tile operand (3 words): `w0 = space | dtype << 2 | partition_start << 8 | partitions << 16`,
/// `w1 = byte offset in each partition`, `w2 = elements per partition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    /// SBUF or PSUM.
    pub space: Space,
    /// Element type.
    pub dtype: Dt,
    /// First partition (0..128).
    pub partition_start: u32,
    /// Partitions (1..=128).
    pub partitions: u32,
    /// Byte offset of element 0 in each partition.
    pub offset: u32,
    /// Elements per partition (the free size).
    pub elems: u32,
}

impl Tile {
    /// An fp32 SBUF tile.
    pub const fn sbuf(partition_start: u32, partitions: u32, offset: u32, elems: u32) -> Self {
        Self {
            space: Space::Sbuf,
            dtype: Dt::F32,
            partition_start,
            partitions,
            offset,
            elems,
        }
    }

    /// An fp32 PSUM tile.
    pub const fn psum(partition_start: u32, partitions: u32, offset: u32, elems: u32) -> Self {
        Self {
            space: Space::Psum,
            dtype: Dt::F32,
            partition_start,
            partitions,
            offset,
            elems,
        }
    }

    /// The same tile with element type `dtype`.
    pub const fn with_dtype(mut self, dtype: Dt) -> Self {
        self.dtype = dtype;
        self
    }

    /// The three argument words.
    pub const fn encode(&self) -> [u32; 3] {
        [
            self.space as u32
                | (self.dtype as u32) << 2
                | (self.partition_start & 0xFF) << 8
                | (self.partitions & 0x1FF) << 16,
            self.offset,
            self.elems,
        ]
    }

    /// Decodes three argument words; `None` for an undefined space or dtype (ranges are the
    /// executor's to check).
    pub const fn decode(w: [u32; 3]) -> Option<Self> {
        let space = match w[0] & 3 {
            0 => Space::Sbuf,
            1 => Space::Psum,
            _ => return None,
        };
        let dtype = match (w[0] >> 2) & 3 {
            0 => Dt::F32,
            1 => Dt::Bf16,
            _ => return None,
        };
        if w[0] & 0xFE00_00F0 != 0 {
            return None;
        }
        Some(Self {
            space,
            dtype,
            partition_start: (w[0] >> 8) & 0xFF,
            partitions: (w[0] >> 16) & 0x1FF,
            offset: w[1],
            elems: w[2],
        })
    }
}

/// Activation functions of `Activation`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFunc {
    /// x.
    Identity = 0,
    /// max(x, 0).
    Relu = 1,
    /// 1 / (1 + e^-x).
    Sigmoid = 2,
    /// tanh x.
    Tanh = 3,
    /// e^x.
    Exp = 4,
    /// GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
    Gelu = 5,
    /// x · sigmoid(x).
    Silu = 6,
}

impl ActFunc {
    /// Every function, in encoding order.
    pub const ALL: [Self; 7] = [
        Self::Identity,
        Self::Relu,
        Self::Sigmoid,
        Self::Tanh,
        Self::Exp,
        Self::Gelu,
        Self::Silu,
    ];

    /// Decodes a function word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Identity),
            1 => Some(Self::Relu),
            2 => Some(Self::Sigmoid),
            3 => Some(Self::Tanh),
            4 => Some(Self::Exp),
            5 => Some(Self::Gelu),
            6 => Some(Self::Silu),
            _ => None,
        }
    }
}

/// Elementwise ops of `TensorTensor` and `TensorScalar`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AluOp {
    /// a + b.
    Add = 0,
    /// a − b.
    Subtract = 1,
    /// a · b.
    Multiply = 2,
    /// max(a, b).
    Max = 3,
    /// min(a, b).
    Min = 4,
    /// a / b.
    Divide = 5,
}

impl AluOp {
    /// Decodes an op word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Add),
            1 => Some(Self::Subtract),
            2 => Some(Self::Multiply),
            3 => Some(Self::Max),
            4 => Some(Self::Min),
            5 => Some(Self::Divide),
            _ => None,
        }
    }
}

/// Reductions of `Reduce`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Σ.
    Sum = 0,
    /// max.
    Max = 1,
}

impl ReduceOp {
    /// Decodes an op word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Sum),
            1 => Some(Self::Max),
            _ => None,
        }
    }
}

/// How a scalar operand is given.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarMode {
    /// No scalar (bias only): 0.
    None = 0,
    /// An immediate fp32: the next word holds its bits.
    Immediate = 1,
    /// One fp32 per destination partition, at the SBUF byte offset in the next word.
    PerPartition = 2,
}

impl ScalarMode {
    /// Decodes a mode word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::None),
            1 => Some(Self::Immediate),
            2 => Some(Self::PerPartition),
            _ => None,
        }
    }
}

/// Rounds an fp32 to bf16, nearest even (NaN stays NaN).
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        let [_, _, lo, hi] = bits.to_le_bytes();
        return u16::from_le_bytes([lo, hi]) | 0x40;
    }
    let round = 0x7FFF + ((bits >> 16) & 1);
    let [_, _, lo, hi] = bits.wrapping_add(round).to_le_bytes();
    u16::from_le_bytes([lo, hi])
}

/// Widens a bf16 to fp32 (exact).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

impl Opcode {
    /// Decodes an opcode byte; `None` for an undefined one.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0x00 => Some(Self::Nop),
            0x01 => Some(Self::End),
            0x10 => Some(Self::DmaStart),
            0x11 => Some(Self::DmaWait),
            0x12 => Some(Self::WaitEvent),
            0x20 => Some(Self::Matmul),
            0x30 => Some(Self::Activation),
            0x40 => Some(Self::TensorTensor),
            0x41 => Some(Self::TensorScalar),
            0x42 => Some(Self::Reduce),
            0x43 => Some(Self::Copy),
            0x44 => Some(Self::Transpose),
            0x50 => Some(Self::Iota),
            _ => None,
        }
    }
}

/// One 64-byte instruction, as stored in an instruction block.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Instruction {
    /// [`Opcode`] byte.
    pub opcode: u8,
    /// [`FLAG_WAIT`] | [`FLAG_SIGNAL`] | opcode-specific bits.
    pub flags: u8,
    /// Semaphore index waited on.
    pub wait_sem: u8,
    /// Semaphore index signalled.
    pub signal_sem: u8,
    /// Wait until the semaphore is at least this.
    pub wait_value: u32,
    /// Added to the signalled semaphore.
    pub signal_value: u32,
    /// Operands.
    pub args: [u32; ARG_WORDS],
}

const _: () = assert!(std::mem::size_of::<Instruction>() == INSTRUCTION_SIZE);

impl Instruction {
    /// An instruction with `opcode` and `args` (missing args are 0), no wait, no signal.
    pub fn new(opcode: Opcode, args: &[u32]) -> Self {
        let mut a = [0u32; ARG_WORDS];
        for (slot, v) in a.iter_mut().zip(args) {
            *slot = *v;
        }
        Self {
            opcode: opcode as u8,
            args: a,
            ..Self::default()
        }
    }

    /// An instruction with tile operands followed by plain words.
    pub fn with_tiles(opcode: Opcode, tiles: &[Tile], words: &[u32]) -> Self {
        let mut args: Vec<u32> = tiles.iter().flat_map(|t| t.encode()).collect();
        args.extend_from_slice(words);
        Self::new(opcode, &args)
    }

    /// Sets the accumulate flag (matmul).
    pub fn accumulate(mut self) -> Self {
        self.flags |= FLAG_ACCUMULATE;
        self
    }

    /// Adds a wait for `sem >= value` before the instruction.
    pub fn wait(mut self, sem: u8, value: u32) -> Self {
        self.flags |= FLAG_WAIT;
        self.wait_sem = sem;
        self.wait_value = value;
        self
    }

    /// Adds a signal `sem += value` after the instruction.
    pub fn signal(mut self, sem: u8, value: u32) -> Self {
        self.flags |= FLAG_SIGNAL;
        self.signal_sem = sem;
        self.signal_value = value;
        self
    }

    /// The decoded opcode, if defined.
    pub fn op(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }
}

/// Encodes a program (instructions back to back) into bytes.
pub fn encode_program(program: &[Instruction]) -> Vec<u8> {
    program
        .iter()
        .flat_map(|i| i.as_bytes().iter().copied())
        .collect()
}

/// The program that does nothing but end (for engines a model does not use).
pub fn end_program() -> Vec<u8> {
    encode_program(&[Instruction::new(Opcode::End, &[])])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn layout() {
        assert_eq!(offset_of!(Instruction, opcode), 0);
        assert_eq!(offset_of!(Instruction, flags), 1);
        assert_eq!(offset_of!(Instruction, wait_sem), 2);
        assert_eq!(offset_of!(Instruction, signal_sem), 3);
        assert_eq!(offset_of!(Instruction, wait_value), 4);
        assert_eq!(offset_of!(Instruction, signal_value), 8);
        assert_eq!(offset_of!(Instruction, args), 12);
    }

    #[test]
    fn golden_bytes_of_a_dma_start_with_wait_and_signal() {
        let i = Instruction::new(Opcode::DmaStart, &[3, 2, 16])
            .wait(4, 1)
            .signal(5, 2);
        let mut golden = [0u8; 64];
        golden[..16].copy_from_slice(&[0x10, 0x03, 4, 5, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]);
        golden[16] = 2;
        golden[20] = 16;
        assert_eq!(i.as_bytes(), golden);
        assert_eq!(Instruction::read_from_bytes(&golden).unwrap(), i);
    }

    #[test]
    fn tiles_round_trip_and_reject_undefined_bits() {
        let t = Tile::psum(3, 128, 256, 360).with_dtype(Dt::Bf16);
        assert_eq!(t.encode(), [0x0080_0305, 256, 360]);
        assert_eq!(Tile::decode(t.encode()), Some(t));
        assert_eq!(Tile::decode([3, 0, 0]), None, "space 3");
        assert_eq!(Tile::decode([0x8000_0000, 0, 0]), None, "reserved bits");
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is exactly half way between two bf16 values: ties go to the even one (1.0).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        // 1 + 3·2^-8 is half way too, and rounds up to the even 0x3F82.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x3F80_8001)),
            0x3F81,
            "above half rounds up"
        );
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(0xC040), -3.0);
    }

    #[test]
    fn act_func_all_is_every_function_in_encoding_order() {
        for (v, f) in (0u32..).zip(ActFunc::ALL) {
            assert_eq!(ActFunc::from_u32(v), Some(f));
            assert_eq!(f as u32, v);
        }
        let n = u32::try_from(ActFunc::ALL.len()).unwrap();
        assert_eq!(
            ActFunc::from_u32(n),
            None,
            "a function missing from ActFunc::ALL"
        );
    }

    #[test]
    fn undefined_opcodes_do_not_decode() {
        assert_eq!(Opcode::from_u8(0xFF), None);
        assert_eq!(Instruction::new(Opcode::End, &[]).op(), Some(Opcode::End));
        assert_eq!(end_program().len(), INSTRUCTION_SIZE);
    }
}
