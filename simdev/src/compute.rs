//! The compute instructions of the simulator ISA ([`shared::isa`], DESIGN §6): each NC's SBUF
//! and PSUM ([`ComputeState`]), the complete check of an instruction ([`decode`]) and its
//! execution ([`execute`]).
//!
//! # Checks
//! [`decode`] accepts an instruction only when everything about it is right, and otherwise
//! names the rule it breaks (the interpreter turns that into a GENERIC failure naming the
//! engine and the PC):
//!
//! - the engine may run the opcode ([`engines_of`]: Matmul on PE; Activation on ACT;
//!   TensorTensor on DVE and POOL; TensorScalar on DVE, POOL and ACT; Reduce on DVE and POOL;
//!   Copy on ACT, DVE and POOL; Transpose on DVE; Iota on POOL);
//! - every tile decodes ([`Tile::decode`]), covers `1 ≤ partitions`, `start + partitions ≤
//!   128`, has at least one element per partition, and `offset + elems · dtype size` fits the
//!   partition of its space (SBUF [`SBUF_PARTITION_BYTES`], PSUM [`PSUM_PARTITION_BYTES`]);
//! - the function, ALU op, reduce op and scalar mode words are defined; a per-partition scalar
//!   vector (`offset + 4` within an SBUF partition) is read at that offset of every destination
//!   partition; TensorScalar needs a scalar (mode `None` is refused), Activation's bias may be
//!   `None` (0);
//! - shapes: Matmul `stationary.partitions == moving.partitions` (K), a PSUM fp32 `dst` with
//!   `dst.partitions == stationary.elems` (M) and `dst.elems == moving.elems` (N); Activation,
//!   TensorTensor, TensorScalar and Copy operands of the destination's shape; Reduce
//!   `dst.elems == 1` and as many partitions as its source; Transpose `dst.partitions ==
//!   src.elems ≤ 128` and `dst.elems == src.partitions`.
//!
//! Argument words an opcode does not use, and flag bits other than FLAG_WAIT, FLAG_SIGNAL and
//! Matmul's FLAG_ACCUMULATE, are ignored.
//!
//! # Semantics
//! Every operand (and a per-partition scalar vector) is read completely before anything is
//! written, so a destination may overlap its sources. Reads widen bf16 to f32; the result is
//! computed in f32; writes to bf16 round to nearest even ([`f32_to_bf16`]). Matmul goes
//! through [`matmul_f32`] (simdev's kernel, rounding as `matrixmultiply::sgemm` does); `Activation` computes
//! `f(x · scale + bias)` as two f32 roundings (no fused multiply-add); Max, Min, Relu and a max
//! reduction propagate NaN (an input NaN is never hidden); a sum reduction adds left to right
//! from 0; `Iota` takes `p` relative to the destination's first partition, computes
//! `base + p·pstep + i·step` in wrapping i32 and rounds it once to the destination type. The
//! only state an op depends on besides its operands is the NC's activation-tables flag, which
//! `Activation` requires. [`Effect::non_finite`] tells whether any value written was a NaN or
//! an infinity (after rounding to the destination type).
//!
//! Every op's work is bounded by its tiles (at most 128 × 32768 elements, a Matmul at most
//! 128 × 128 × 4096 multiply-adds); nothing here panics on any instruction.

use std::fmt;
use std::ops::Range;

use gemm::Layout;
use pages::Pages;
use shared::exec_request::Engine;
use shared::isa::{
    ActFunc, AluOp, Dt, FLAG_ACCUMULATE, Instruction, Opcode, PSUM_PARTITION_BYTES, ReduceOp,
    SBUF_PARTITION_BYTES, SBUF_PARTITIONS, ScalarMode, Space, Tile, bf16_to_f32, f32_to_bf16,
};
use thiserror::Error;

/// √(2/π), GELU's constant.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// Bytes of one partition of `space`.
const fn partition_bytes(space: Space) -> u32 {
    match space {
        Space::Sbuf => SBUF_PARTITION_BYTES,
        Space::Psum => PSUM_PARTITION_BYTES,
    }
}

/// Bytes between the starts of two partitions of `space` in simdev's buffers: the partition
/// and a few cache lines more ([`partition_pad_lines`]). Only simdev's own layout: nothing
/// outside this module sees it.
const fn partition_stride(space: Space) -> u32 {
    partition_bytes(space) + partition_pad_lines(space) * CACHE_LINE
}

/// A cache line.
const CACHE_LINE: u32 = 64;

/// Cache lines added after every partition of `space`, so that the rows of a tile — one per
/// partition, all at the same offset — spread over the CPU's cache sets instead of piling
/// into a few of them.
///
/// A second-level cache of 2048 sets (1 MiB 8-way or 2 MiB 16-way; the set is address bits
/// 6–16) maps partitions exactly 64 KiB apart to the same set, since 64 KiB is 1024 lines.
/// With one line of padding, partition `p` starts `p · 1025 ≡ p (+1024 when p is odd)` sets
/// further, so a tile's rows still overlap: the digits MLP's 64 rows of 360 values (23 lines
/// each) put 12 lines in every set they use, more than an 8-way cache holds and most of a
/// 16-way one, and each tile evicted the one before. With 15 lines, SBUF's partitions start
/// `1039 · p` sets apart (mod 2048), PSUM's with 43 lines `299 · p`: no set holds more than 2
/// lines of a 128-row tile of 23-line rows, or 4 of 57-line rows (8 with 1024 sets, 2 with
/// 4096). Both pads are odd, so 8 consecutive partitions (a transpose's block) also fall in 8
/// different first-level sets (64 of them). Measured with `cargo bench -p tests --bench
/// simdev_speed`: the digits MLP at batch 360 went from about 1.75x the GEMM crate's forward
/// pass to about 1.25x. The price: 120 KiB more SBUF and 344 KiB more PSUM per NC that
/// computes.
const fn partition_pad_lines(space: Space) -> u32 {
    match space {
        Space::Sbuf => 15,
        Space::Psum => 43,
    }
}

/// `v` as a `usize` (u32 always fits on the platforms simdev runs on).
fn idx(v: u32) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// One NC's compute state: SBUF, PSUM, and whether the activation tables are loaded.
///
/// SBUF and PSUM are allocated on first use (zeroed huge pages of their own, see `pages`) and
/// dropped by [`ComputeState::clear`], so an NC that never computes costs no memory.
#[derive(Default)]
pub struct ComputeState {
    sbuf: Option<Pages>,
    psum: Option<Pages>,
    tables_loaded: bool,
    program: Option<[u64; 5]>,
    scratch: Scratch,
}

/// Reusable f32 buffers of [`execute`]: operands are read into them and results computed in
/// them, so an op allocates nothing once they have grown to the largest tiles an NC's programs
/// use (each holds at most 128 × 32768 values). They carry no state between ops: every op
/// writes what it reads from them first.
#[derive(Default)]
struct Scratch {
    /// The first operand (a matmul's stationary operand, the only source of a one-source op).
    a: Vec<f32>,
    /// The second operand (a matmul's moving operand, TensorTensor's `b`).
    b: Vec<f32>,
    /// Results, and per-partition scalars.
    c: Vec<f32>,
    /// A matmul's moving operand packed into column panels (the portable and AVX2 kernels';
    /// the AVX-512 kernel reads it in place).
    pack: Vec<f32>,
}

impl fmt::Debug for ComputeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ComputeState")
            .field("sbuf_allocated", &self.sbuf.is_some())
            .field("psum_allocated", &self.psum.is_some())
            .field("tables_loaded", &self.tables_loaded)
            .finish()
    }
}

impl ComputeState {
    /// Zeroed SBUF and PSUM, tables not loaded.
    pub fn new() -> Self {
        Self::default()
    }

    /// Zeroes SBUF and PSUM and forgets the activation tables (NC claim, reset, release and
    /// reclaim).
    pub fn clear(&mut self) {
        self.sbuf = None;
        self.psum = None;
        self.tables_loaded = false;
        self.program = None;
        self.scratch = Scratch::default();
    }

    /// The engine addresses of the last request the sequencer ran (`None` after a clear).
    pub const fn program(&self) -> Option<[u64; 5]> {
        self.program
    }

    /// Records the engine addresses of the request the sequencer runs.
    pub fn set_program(&mut self, addresses: [u64; 5]) {
        self.program = Some(addresses);
    }

    /// Whether the activation tables are loaded.
    pub const fn tables_loaded(&self) -> bool {
        self.tables_loaded
    }

    /// Marks the activation tables loaded (a request with `load_act_dve_tables` = 1) or not
    /// (an exec-queue DMA_QUEUE_INIT).
    pub fn set_tables_loaded(&mut self, loaded: bool) {
        self.tables_loaded = loaded;
    }

    /// The byte range of `len` bytes at `offset` of `partition` of `space` in its buffer, when
    /// it stays inside that partition.
    fn range(space: Space, partition: u32, offset: u64, len: usize) -> Option<Range<usize>> {
        let bytes = u64::from(partition_bytes(space));
        let end = offset.checked_add(u64::try_from(len).ok()?)?;
        if partition >= SBUF_PARTITIONS || end > bytes {
            return None;
        }
        let base = u64::from(partition) * u64::from(partition_stride(space));
        Some(usize::try_from(base + offset).ok()?..usize::try_from(base + end).ok()?)
    }

    /// The buffer of `space`, allocated (zeroed) on first use.
    fn buffer(&mut self, space: Space) -> &mut [u8] {
        let partition = partition_stride(space);
        let buf = match space {
            Space::Sbuf => &mut self.sbuf,
            Space::Psum => &mut self.psum,
        };
        buf.get_or_insert_with(|| Pages::zeroed(idx(SBUF_PARTITIONS) * idx(partition)))
    }

    /// Reads `out.len()` bytes at `offset` of SBUF partition `partition` (the SBUF DMA
    /// window); `false`, reading nothing, when the range leaves the partition.
    pub fn read_sbuf(&self, partition: u32, offset: u64, out: &mut [u8]) -> bool {
        match self.sbuf_bytes(partition, offset, out.len()) {
            Some(bytes) => {
                out.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// Writes `data` at `offset` of SBUF partition `partition` (the SBUF DMA window); `false`,
    /// writing nothing, when the range leaves the partition.
    pub fn write_sbuf(&mut self, partition: u32, offset: u64, data: &[u8]) -> bool {
        match self.sbuf_bytes_mut(partition, offset, data.len()) {
            Some(slot) => {
                slot.copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    /// The `len` bytes at `offset` of SBUF partition `partition` (the SBUF DMA window), for a
    /// DMA to read in place; `None` when the range leaves the partition. An SBUF not yet
    /// allocated reads as zeros (without allocating it).
    pub fn sbuf_bytes(&self, partition: u32, offset: u64, len: usize) -> Option<&[u8]> {
        /// What an SBUF partition holds before anything is written to it.
        static ZEROS: [u8; SBUF_PARTITION_BYTES as usize] = [0; SBUF_PARTITION_BYTES as usize];
        let range = Self::range(Space::Sbuf, partition, offset, len)?;
        match &self.sbuf {
            Some(sbuf) => sbuf.get(range),
            None => ZEROS.get(..len),
        }
    }

    /// The `len` bytes at `offset` of SBUF partition `partition` (the SBUF DMA window), for a
    /// DMA to write in place (SBUF is allocated on first use); `None` when the range leaves
    /// the partition.
    pub fn sbuf_bytes_mut(&mut self, partition: u32, offset: u64, len: usize) -> Option<&mut [u8]> {
        let range = Self::range(Space::Sbuf, partition, offset, len)?;
        self.buffer(Space::Sbuf).get_mut(range)
    }

    /// The bytes of partition `p` of `tile` (its range was checked by [`decode`]).
    fn row(&mut self, tile: &Tile, p: u32) -> Result<&mut [u8], ExecError> {
        let len = idx(tile.elems).saturating_mul(idx(tile.dtype.size()));
        let range = Self::range(tile.space, p, u64::from(tile.offset), len)
            .ok_or_else(|| ExecError::Internal(format!("{tile:?} leaves its space")))?;
        self.buffer(tile.space)
            .get_mut(range)
            .ok_or_else(|| ExecError::Internal(format!("{tile:?} leaves its buffer")))
    }

    /// The partitions of `tile`.
    fn partitions(tile: &Tile) -> Range<u32> {
        tile.partition_start..tile.partition_start.saturating_add(tile.partitions)
    }

    /// Reads `tile` as f32, partition by partition (`partitions × elems`, row-major), into
    /// `out` (cleared first; it allocates only to grow).
    fn gather_into(&mut self, tile: &Tile, out: &mut Vec<f32>) -> Result<(), ExecError> {
        // Appended row by row: nothing is zeroed first (the scratch buffers are shared by ops
        // of every size, so growing them with zeros would clear most of each tile again).
        out.clear();
        for p in Self::partitions(tile) {
            let row = self.row(tile, p)?;
            match tile.dtype {
                Dt::F32 => out.extend(
                    row.as_chunks::<4>()
                        .0
                        .iter()
                        .map(|c| f32::from_le_bytes(*c)),
                ),
                Dt::Bf16 => out.extend(
                    (row.as_chunks::<2>().0.iter()).map(|c| bf16_to_f32(u16::from_le_bytes(*c))),
                ),
            }
        }
        Ok(())
    }

    /// Reads `tile` as f32 into a new vector (tests).
    #[cfg(test)]
    fn gather(&mut self, tile: &Tile) -> Result<Vec<f32>, ExecError> {
        let mut out = Vec::new();
        self.gather_into(tile, &mut out)?;
        Ok(out)
    }

    /// Writes `values` (`partitions × elems`, row-major) into `tile`, rounding to its dtype;
    /// whether any value stored is a NaN or an infinity.
    fn scatter(&mut self, tile: &Tile, values: &[f32]) -> Result<bool, ExecError> {
        let elems = idx(tile.elems);
        if values.len() != idx(tile.partitions).saturating_mul(elems) {
            return Err(ExecError::Internal(format!(
                "{} values for {tile:?}",
                values.len()
            )));
        }
        let mut non_finite = false;
        for (p, chunk) in Self::partitions(tile).zip(values.chunks(elems.max(1))) {
            let row = self.row(tile, p)?;
            match tile.dtype {
                Dt::F32 => {
                    let (slots, _) = row.as_chunks_mut::<4>();
                    for (slot, v) in slots.iter_mut().zip(chunk) {
                        non_finite |= !v.is_finite();
                        *slot = v.to_le_bytes();
                    }
                }
                Dt::Bf16 => {
                    let (slots, _) = row.as_chunks_mut::<2>();
                    for (slot, v) in slots.iter_mut().zip(chunk) {
                        let b = f32_to_bf16(*v);
                        non_finite |= !bf16_to_f32(b).is_finite();
                        *slot = b.to_le_bytes();
                    }
                }
            }
        }
        Ok(non_finite)
    }

    /// The scalar of every partition of `dst`, into `out` (cleared first).
    fn scalars_into(
        &mut self,
        scalar: Scalar,
        dst: &Tile,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        out.clear();
        match scalar {
            Scalar::Immediate(v) => out.resize(idx(dst.partitions), v),
            Scalar::PerPartition(offset) => {
                for p in Self::partitions(dst) {
                    let mut word = [0u8; 4];
                    if !self.read_sbuf(p, u64::from(offset), &mut word) {
                        return Err(ExecError::Internal(format!(
                            "per-partition scalar at {offset} of partition {p}"
                        )));
                    }
                    out.push(f32::from_le_bytes(word));
                }
            }
        }
        Ok(())
    }
}

/// A scalar operand: an immediate, or one fp32 per destination partition at an SBUF offset.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scalar {
    Immediate(f32),
    PerPartition(u32),
}

/// A checked compute instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Matmul {
        dst: Tile,
        stationary: Tile,
        moving: Tile,
        accumulate: bool,
    },
    Activation {
        dst: Tile,
        src: Tile,
        func: ActFunc,
        scale: f32,
        bias: Scalar,
    },
    TensorTensor {
        dst: Tile,
        a: Tile,
        b: Tile,
        op: AluOp,
    },
    TensorScalar {
        dst: Tile,
        src: Tile,
        op: AluOp,
        scalar: Scalar,
    },
    Reduce {
        dst: Tile,
        src: Tile,
        op: ReduceOp,
    },
    Copy {
        dst: Tile,
        src: Tile,
    },
    Transpose {
        dst: Tile,
        src: Tile,
    },
    Iota {
        dst: Tile,
        base: i32,
        pstep: i32,
        step: i32,
    },
}

/// A compute instruction that passed every check of [`decode`], ready for [`execute`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Op(Kind);

impl Op {
    /// The work of the instruction in element operations: `K · M · N` multiply-adds for a
    /// matmul, the elements read by the largest operand otherwise. Executions are bounded by the
    /// sum of these (see `engines::Limits::max_compute_ops`).
    pub fn cost(&self) -> u64 {
        let n = |t: &Tile| u64::from(t.partitions) * u64::from(t.elems);
        match &self.0 {
            Kind::Matmul {
                stationary, moving, ..
            } => {
                u64::from(stationary.partitions)
                    * u64::from(stationary.elems)
                    * u64::from(moving.elems)
            }
            Kind::Activation { dst, src, .. }
            | Kind::TensorScalar { dst, src, .. }
            | Kind::Reduce { dst, src, .. }
            | Kind::Copy { dst, src }
            | Kind::Transpose { dst, src } => n(dst).max(n(src)),
            Kind::TensorTensor { dst, a, b, .. } => n(dst).max(n(a)).max(n(b)),
            Kind::Iota { dst, .. } => n(dst),
        }
    }

    /// The opcode.
    pub const fn opcode(&self) -> Opcode {
        match self.0 {
            Kind::Matmul { .. } => Opcode::Matmul,
            Kind::Activation { .. } => Opcode::Activation,
            Kind::TensorTensor { .. } => Opcode::TensorTensor,
            Kind::TensorScalar { .. } => Opcode::TensorScalar,
            Kind::Reduce { .. } => Opcode::Reduce,
            Kind::Copy { .. } => Opcode::Copy,
            Kind::Transpose { .. } => Opcode::Transpose,
            Kind::Iota { .. } => Opcode::Iota,
        }
    }
}

/// What an executed op did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    /// A value written was a NaN or an infinity (the execution carries NUMERICAL).
    pub non_finite: bool,
}

/// Why [`execute`] refused a decoded op.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ExecError {
    /// `Activation` while the NC's activation tables are not loaded.
    #[error(
        "activation tables not loaded (no request with load_act_dve_tables = 1 since the NC's \
         claim, reset or exec-queue init)"
    )]
    TablesNotLoaded,
    /// A range [`decode`] should have refused (a simdev bug).
    #[error("internal range error (a simdev bug): {0}")]
    Internal(String),
}

/// The engines that may run compute opcode `op`; `None` for a control opcode (Nop, End,
/// DmaStart, DmaWait, WaitEvent).
pub const fn engines_of(op: Opcode) -> Option<&'static [Engine]> {
    match op {
        Opcode::Matmul => Some(&[Engine::Pe]),
        Opcode::Activation => Some(&[Engine::Act]),
        Opcode::TensorTensor | Opcode::Reduce => Some(&[Engine::Dve, Engine::Pool]),
        Opcode::TensorScalar => Some(&[Engine::Dve, Engine::Pool, Engine::Act]),
        Opcode::Copy => Some(&[Engine::Act, Engine::Dve, Engine::Pool]),
        Opcode::Transpose => Some(&[Engine::Dve]),
        Opcode::Iota => Some(&[Engine::Pool]),
        Opcode::Nop | Opcode::End | Opcode::DmaStart | Opcode::DmaWait | Opcode::WaitEvent => None,
    }
}

fn space_name(space: Space) -> &'static str {
    match space {
        Space::Sbuf => "SBUF",
        Space::Psum => "PSUM",
    }
}

fn dtype_name(dtype: Dt) -> &'static str {
    match dtype {
        Dt::F32 => "fp32",
        Dt::Bf16 => "bf16",
    }
}

/// Decodes and range-checks the tile operand `what` from its three words.
fn tile(what: &str, words: [u32; 3]) -> Result<Tile, String> {
    let t = Tile::decode(words).ok_or_else(|| {
        format!(
            "{what} tile word {:#010x} has an undefined space or dtype, or reserved bits set",
            words[0]
        )
    })?;
    let space = space_name(t.space);
    if t.partitions == 0 {
        return Err(format!("{what} tile has 0 partitions"));
    }
    if t.partition_start + t.partitions > SBUF_PARTITIONS {
        return Err(format!(
            "{what} tile covers partitions {}..{}, past the {SBUF_PARTITIONS} of {space}",
            t.partition_start,
            t.partition_start + t.partitions
        ));
    }
    if t.elems == 0 {
        return Err(format!("{what} tile has 0 elements per partition"));
    }
    let end = u64::from(t.offset) + u64::from(t.elems) * u64::from(t.dtype.size());
    if end > u64::from(partition_bytes(t.space)) {
        return Err(format!(
            "{what} tile of {} {} elements at byte {} ends at byte {end}, past the {}-byte {space} \
             partition",
            t.elems,
            dtype_name(t.dtype),
            t.offset,
            partition_bytes(t.space)
        ));
    }
    Ok(t)
}

fn same_shape(what: &str, t: &Tile, dst: &Tile) -> Result<(), String> {
    if (t.partitions, t.elems) == (dst.partitions, dst.elems) {
        Ok(())
    } else {
        Err(format!(
            "{what} is {} × {} but dst is {} × {} (partitions × elements)",
            t.partitions, t.elems, dst.partitions, dst.elems
        ))
    }
}

fn alu(word: u32) -> Result<AluOp, String> {
    AluOp::from_u32(word).ok_or_else(|| format!("ALU op {word} is undefined"))
}

/// A scalar operand given by `mode` and `value`; `None` is 0 when `none_allowed`.
fn scalar(what: &str, mode: u32, value: u32, none_allowed: bool) -> Result<Scalar, String> {
    match ScalarMode::from_u32(mode) {
        None => Err(format!("{what} scalar mode {mode} is undefined")),
        Some(ScalarMode::None) if none_allowed => Ok(Scalar::Immediate(0.0)),
        Some(ScalarMode::None) => Err(format!(
            "{what} scalar mode None: the op needs an immediate or per-partition scalar"
        )),
        Some(ScalarMode::Immediate) => Ok(Scalar::Immediate(f32::from_bits(value))),
        Some(ScalarMode::PerPartition) => {
            if u64::from(value) + 4 > u64::from(SBUF_PARTITION_BYTES) {
                Err(format!(
                    "{what} per-partition scalars at SBUF byte {value} run past the \
                     {SBUF_PARTITION_BYTES}-byte partition"
                ))
            } else {
                Ok(Scalar::PerPartition(value))
            }
        }
    }
}

fn i32_of(word: u32) -> i32 {
    i32::from_ne_bytes(word.to_ne_bytes())
}

/// Checks compute instruction `inst` (opcode `op`) for `engine` completely (see the module
/// doc). `Ok(None)` for a control opcode, which the interpreter checks itself.
///
/// # Errors
/// A sentence naming the rule the instruction breaks.
pub fn decode(engine: Engine, op: Opcode, inst: &Instruction) -> Result<Option<Op>, String> {
    let Some(engines) = engines_of(op) else {
        return Ok(None);
    };
    if !engines.contains(&engine) {
        let names: Vec<&str> = engines.iter().map(|e| e.name()).collect();
        return Err(format!(
            "{op:?} runs on {} only, not on {}",
            names.join(", "),
            engine.name()
        ));
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, ..] = inst.args;
    let dst = tile("dst", [a0, a1, a2])?;
    let kind = match op {
        Opcode::Matmul => {
            let stationary = tile("stationary", [a3, a4, a5])?;
            let moving = tile("moving", [a6, a7, a8])?;
            if (dst.space, dst.dtype) != (Space::Psum, Dt::F32) {
                return Err(format!(
                    "Matmul dst must be an fp32 PSUM tile, not {} {}",
                    dtype_name(dst.dtype),
                    space_name(dst.space)
                ));
            }
            if stationary.partitions != moving.partitions {
                return Err(format!(
                    "Matmul contracts over partitions: stationary has K = {} but moving has {}",
                    stationary.partitions, moving.partitions
                ));
            }
            if dst.partitions != stationary.elems {
                return Err(format!(
                    "Matmul dst has {} partitions but stationary has M = {} elements",
                    dst.partitions, stationary.elems
                ));
            }
            if dst.elems != moving.elems {
                return Err(format!(
                    "Matmul dst has {} elements but moving has N = {}",
                    dst.elems, moving.elems
                ));
            }
            Kind::Matmul {
                dst,
                stationary,
                moving,
                accumulate: inst.flags & FLAG_ACCUMULATE != 0,
            }
        }
        Opcode::Activation => {
            let src = tile("src", [a3, a4, a5])?;
            same_shape("src", &src, &dst)?;
            let func = ActFunc::from_u32(a6)
                .ok_or_else(|| format!("activation function {a6} is undefined"))?;
            Kind::Activation {
                dst,
                src,
                func,
                scale: f32::from_bits(a7),
                bias: scalar("bias", a8, a9, true)?,
            }
        }
        Opcode::TensorTensor => {
            let a = tile("a", [a3, a4, a5])?;
            let b = tile("b", [a6, a7, a8])?;
            same_shape("a", &a, &dst)?;
            same_shape("b", &b, &dst)?;
            Kind::TensorTensor {
                dst,
                a,
                b,
                op: alu(a9)?,
            }
        }
        Opcode::TensorScalar => {
            let src = tile("src", [a3, a4, a5])?;
            same_shape("src", &src, &dst)?;
            Kind::TensorScalar {
                dst,
                src,
                op: alu(a6)?,
                scalar: scalar("the", a7, a8, false)?,
            }
        }
        Opcode::Reduce => {
            let src = tile("src", [a3, a4, a5])?;
            if dst.elems != 1 {
                return Err(format!(
                    "Reduce dst must have 1 element per partition, not {}",
                    dst.elems
                ));
            }
            if dst.partitions != src.partitions {
                return Err(format!(
                    "Reduce dst has {} partitions but src has {}",
                    dst.partitions, src.partitions
                ));
            }
            let op =
                ReduceOp::from_u32(a6).ok_or_else(|| format!("reduce op {a6} is undefined"))?;
            Kind::Reduce { dst, src, op }
        }
        Opcode::Copy => {
            let src = tile("src", [a3, a4, a5])?;
            same_shape("src", &src, &dst)?;
            Kind::Copy { dst, src }
        }
        Opcode::Transpose => {
            let src = tile("src", [a3, a4, a5])?;
            if src.elems > SBUF_PARTITIONS {
                return Err(format!(
                    "Transpose of {} elements per partition: at most {SBUF_PARTITIONS}",
                    src.elems
                ));
            }
            if (dst.partitions, dst.elems) != (src.elems, src.partitions) {
                return Err(format!(
                    "Transpose of a {} × {} src needs a {} × {} dst, not {} × {}",
                    src.partitions, src.elems, src.elems, src.partitions, dst.partitions, dst.elems
                ));
            }
            Kind::Transpose { dst, src }
        }
        Opcode::Iota => Kind::Iota {
            dst,
            base: i32_of(a3),
            pstep: i32_of(a4),
            step: i32_of(a5),
        },
        Opcode::Nop | Opcode::End | Opcode::DmaStart | Opcode::DmaWait | Opcode::WaitEvent => {
            return Ok(None);
        }
    };
    Ok(Some(Op(kind)))
}

/// `max` that propagates NaN (as f32's default NaN), with `+0` above `−0` (IEEE 754's
/// `maximum`). `f32::max` leaves the sign of a zero result unspecified (an optimised build
/// answered `+0` for `max(−0, +0)` where a debug build answered `−0`); here it is fixed, so
/// the vector rows (`maxps` with `+0` second) and this agree in every build.
fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a == b {
        // Equal: the same bits, or two zeros, of which `+0` wins.
        f32::from_bits(a.to_bits() & b.to_bits())
    } else {
        a.max(b)
    }
}

/// `min` that propagates NaN (as f32's default NaN), with `−0` below `+0` (IEEE 754's
/// `minimum`; see [`max_nan`]).
fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a == b {
        // Equal: the same bits, or two zeros, of which `−0` wins.
        f32::from_bits(a.to_bits() | b.to_bits())
    } else {
        a.min(b)
    }
}

/// `a op b` in f32.
pub fn alu_apply(op: AluOp, a: f32, b: f32) -> f32 {
    match op {
        AluOp::Add => a + b,
        AluOp::Subtract => a - b,
        AluOp::Multiply => a * b,
        AluOp::Max => max_nan(a, b),
        AluOp::Min => min_nan(a, b),
        AluOp::Divide => a / b,
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Activation function `f` of `x` in f32 (GELU is the tanh approximation; ReLU propagates
/// NaN).
pub fn activate(f: ActFunc, x: f32) -> f32 {
    match f {
        ActFunc::Identity => x,
        ActFunc::Relu => max_nan(x, 0.0),
        ActFunc::Sigmoid => sigmoid(x),
        ActFunc::Tanh => x.tanh(),
        ActFunc::Exp => x.exp(),
        ActFunc::Gelu => 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh()),
        ActFunc::Silu => x * sigmoid(x),
    }
}

/// `v` rounded once to the nearest bf16 (ties to even), as an f32.
fn i32_to_bf16_value(v: i32) -> f32 {
    let a = v.unsigned_abs();
    let bits = 32 - a.leading_zeros();
    // Above 24 significant bits the conversion to f32 would round too (twice in all): round
    // to odd at bit `shift` first, which keeps the one rounding to bf16 exact.
    let a = if bits > 24 {
        let shift = bits - 24;
        let kept = a >> shift << shift;
        if kept == a { a } else { kept | (1 << shift) }
    } else {
        a
    };
    // Exact: at most 24 significant bits.
    let magnitude = bf16_to_f32(f32_to_bf16(a as f32));
    if v < 0 { -magnitude } else { magnitude }
}

/// Runs a decoded op on `state` (see the module doc for the semantics).
///
/// Operands are read into the state's reusable scratch buffers and results computed there,
/// so an op allocates nothing in the steady state (the buffers only grow, to the largest tiles
/// the NC's programs use).
///
/// # Errors
/// [`ExecError::TablesNotLoaded`] for an `Activation` before the tables were loaded; nothing
/// was written then.
pub fn execute(state: &mut ComputeState, op: &Op) -> Result<Effect, ExecError> {
    let mut scratch = std::mem::take(&mut state.scratch);
    let result = run_op(state, &mut scratch, op);
    state.scratch = scratch;
    result.map(|non_finite| Effect { non_finite })
}

/// `x[p][i] = f(x[p][i], s[p])` for every row `p` of `elems` values.
fn map_rows(x: &mut [f32], elems: usize, s: &[f32], f: impl Fn(f32, f32) -> f32) {
    for (row, &s) in x.chunks_mut(elems.max(1)).zip(s) {
        for v in row {
            *v = f(*v, s);
        }
    }
}

/// `x[i] = f(x[i], y[i])`.
fn zip_with(x: &mut [f32], y: &[f32], f: impl Fn(f32, f32) -> f32) {
    for (v, &w) in x.iter_mut().zip(y) {
        *v = f(*v, w);
    }
}

/// `x[p][i] = func(x[p][i] · scale + bias[p])`, each function in its own loop.
fn activate_rows(x: &mut [f32], elems: usize, bias: &[f32], func: ActFunc, scale: f32) {
    match func {
        ActFunc::Identity => map_rows(x, elems, bias, |v, b| v * scale + b),
        ActFunc::Relu => map_rows(x, elems, bias, |v, b| max_nan(v * scale + b, 0.0)),
        f => map_rows(x, elems, bias, |v, b| activate(f, v * scale + b)),
    }
}

/// `x[p][i] = x[p][i] op y` with `y` either one value per row or (`per_element`) one per
/// element, each ALU op in its own loop.
fn alu_rows(x: &mut [f32], elems: usize, y: &[f32], op: AluOp, per_element: bool) {
    macro_rules! apply {
        ($f:expr) => {
            if per_element {
                zip_with(x, y, $f)
            } else {
                map_rows(x, elems, y, $f)
            }
        };
    }
    match op {
        AluOp::Add => apply!(|a, b| a + b),
        AluOp::Subtract => apply!(|a, b| a - b),
        AluOp::Multiply => apply!(|a, b| a * b),
        AluOp::Max => apply!(max_nan),
        AluOp::Min => apply!(min_nan),
        AluOp::Divide => apply!(|a, b| a / b),
    }
}

/// [`execute`] with the scratch buffers taken out of `state`: whether a value written was not
/// finite.
fn run_op(state: &mut ComputeState, s: &mut Scratch, op: &Op) -> Result<bool, ExecError> {
    match op.0 {
        Kind::Matmul {
            dst,
            stationary,
            moving,
            accumulate,
        } => {
            if let Some(result) =
                in_place::matmul(state, s, &dst, (&stationary, &moving), accumulate)
            {
                return result;
            }
            state.gather_into(&stationary, &mut s.a)?;
            state.gather_into(&moving, &mut s.b)?;
            let (k, m, n) = (
                idx(stationary.partitions),
                idx(stationary.elems),
                idx(moving.elems),
            );
            if accumulate {
                state.gather_into(&dst, &mut s.c)?;
            } else {
                // Not accumulating, the kernel writes every element without reading it.
                s.c.resize(m.saturating_mul(n), 0.0);
            }
            sgemm(&s.a, &s.b, (k, m, n), &mut s.c, accumulate, &mut s.pack)
                .map_err(|e| ExecError::Internal(e.to_string()))?;
            state.scatter(&dst, &s.c)
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
            if let Some(result) = in_place::activation(state, s, (&dst, &src), func, scale, bias) {
                return result;
            }
            state.gather_into(&src, &mut s.a)?;
            state.scalars_into(bias, &dst, &mut s.c)?;
            activate_rows(&mut s.a, idx(src.elems), &s.c, func, scale);
            state.scatter(&dst, &s.a)
        }
        Kind::TensorTensor { dst, a, b, op } => {
            state.gather_into(&a, &mut s.a)?;
            state.gather_into(&b, &mut s.b)?;
            alu_rows(&mut s.a, idx(a.elems), &s.b, op, true);
            state.scatter(&dst, &s.a)
        }
        Kind::TensorScalar {
            dst,
            src,
            op,
            scalar,
        } => {
            state.gather_into(&src, &mut s.a)?;
            state.scalars_into(scalar, &dst, &mut s.c)?;
            alu_rows(&mut s.a, idx(src.elems), &s.c, op, false);
            state.scatter(&dst, &s.a)
        }
        Kind::Reduce { dst, src, op } => {
            state.gather_into(&src, &mut s.a)?;
            s.c.clear();
            s.c.extend(s.a.chunks(idx(src.elems).max(1)).map(|row| match op {
                ReduceOp::Sum => row.iter().fold(0.0, |acc, &v| acc + v),
                ReduceOp::Max => row.iter().copied().fold(f32::NEG_INFINITY, max_nan),
            }));
            state.scatter(&dst, &s.c)
        }
        Kind::Copy { dst, src } => {
            state.gather_into(&src, &mut s.a)?;
            state.scatter(&dst, &s.a)
        }
        Kind::Transpose { dst, src } => {
            if let Some(result) = in_place::transpose(state, s, (&dst, &src)) {
                return result;
            }
            state.gather_into(&src, &mut s.a)?;
            let (p, f) = (idx(src.partitions), idx(src.elems));
            s.c.resize(p.saturating_mul(f), 0.0);
            // Every element is written: dst[j][i] = src[i][j], the source row by row.
            for (i, row) in s.a.chunks(f.max(1)).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    if let Some(slot) = s.c.get_mut(j * p + i) {
                        *slot = v;
                    }
                }
            }
            state.scatter(&dst, &s.c)
        }
        Kind::Iota {
            dst,
            base,
            pstep,
            step,
        } => {
            s.c.clear();
            let mut row = base;
            for _ in 0..dst.partitions {
                let mut v = row;
                for _ in 0..dst.elems {
                    s.c.push(match dst.dtype {
                        // Rounds to nearest even, once.
                        Dt::F32 => v as f32,
                        Dt::Bf16 => i32_to_bf16_value(v),
                    });
                    v = v.wrapping_add(step);
                }
                row = row.wrapping_add(pstep);
            }
            state.scatter(&dst, &s.c)
        }
    }
}

/// The slices given to [`matmul_f32`] do not have the sizes its shape needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error(
    "matmul of K = {k}, M = {m}, N = {n} needs {k}·{m} stationary, {k}·{n} moving and {m}·{n} \
     output elements; got {stationary}, {moving} and {out}"
)]
pub struct MatmulShapeError {
    /// Contraction size.
    pub k: usize,
    /// Output rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// Stationary elements given.
    pub stationary: usize,
    /// Moving elements given.
    pub moving: usize,
    /// Output elements given.
    pub out: usize,
}

/// The matmul of the `Matmul` instruction on f32 buffers: `out[m][n] = Σ_k stat[k][m] ·
/// mov[k][n]` with `stat` K × M, `mov` K × N and `out` M × N, all row-major (the partition
/// dimension first, as gathered from tiles). Computed by simdev's own register-blocked
/// kernel, which allocates nothing and rounds as `matrixmultiply::sgemm` does (one fused
/// multiply-add chain over `k` per element on a CPU with FMA). Public so benchmarks can time
/// simdev's matmul path beside the raw GEMM crate.
///
/// # Errors
/// [`MatmulShapeError`] when a slice's length is not its shape's.
pub fn matmul_f32(
    stat: &[f32],
    mov: &[f32],
    k: usize,
    m: usize,
    n: usize,
    out: &mut [f32],
) -> Result<(), MatmulShapeError> {
    with_pack(|pack| sgemm(stat, mov, (k, m, n), out, false, pack))
}

/// [`matmul_f32`] adding into `out` instead of overwriting it (`Matmul` with
/// [`FLAG_ACCUMULATE`]).
///
/// # Errors
/// [`MatmulShapeError`] when a slice's length is not its shape's.
pub fn matmul_f32_accumulate(
    stat: &[f32],
    mov: &[f32],
    k: usize,
    m: usize,
    n: usize,
    out: &mut [f32],
) -> Result<(), MatmulShapeError> {
    with_pack(|pack| sgemm(stat, mov, (k, m, n), out, true, pack))
}

/// `f` with this thread's packing buffer of the public matmul helpers (kept between calls, so
/// they allocate nothing once it has grown).
fn with_pack<T>(f: impl FnOnce(&mut Vec<f32>) -> T) -> T {
    thread_local! {
        static PACK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    PACK.with(|pack| match pack.try_borrow_mut() {
        Ok(mut pack) => f(&mut pack),
        Err(_) => f(&mut Vec::new()),
    })
}

fn sgemm(
    stat: &[f32],
    mov: &[f32],
    (k, m, n): (usize, usize, usize),
    out: &mut [f32],
    accumulate: bool,
    pack: &mut Vec<f32>,
) -> Result<(), MatmulShapeError> {
    let shape_error = MatmulShapeError {
        k,
        m,
        n,
        stationary: stat.len(),
        moving: mov.len(),
        out: out.len(),
    };
    if k.checked_mul(m) != Some(stat.len())
        || k.checked_mul(n) != Some(mov.len())
        || m.checked_mul(n) != Some(out.len())
    {
        return Err(shape_error);
    }
    gemm::gemm(
        stat,
        mov,
        (k, m, n),
        Layout::contiguous(m, n),
        out,
        accumulate,
        pack,
    );
    Ok(())
}

/// [`shared::neff_program::shape_only::fill`], compiled for AVX2 where this CPU has it: every
/// shape-only NEFF execution writes its outputs with it (megabytes each). The bytes are the
/// same at every level (integer arithmetic; only how many words are computed at once
/// differs), and the tests compare the levels.
pub(crate) fn shape_only_fill(stream: u64, offset: u64, buf: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if simd::level() >= simd::Level::Avx2Fma {
        // SAFETY: AVX2 was detected on this CPU (`simd::level` never answers a level the CPU
        // lacks).
        return unsafe { shape_only_fill_avx2(stream, offset, buf) };
    }
    shared::neff_program::shape_only::fill(stream, offset, buf);
}

/// [`shared::neff_program::shape_only::fill`] inlined here and vectorized for AVX2 (the
/// 64-bit multiplies of four words at once).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn shape_only_fill_avx2(stream: u64, offset: u64, buf: &mut [u8]) {
    shared::neff_program::shape_only::fill(stream, offset, buf);
}

mod gemm;
mod in_place;
mod pages;
mod simd;

#[cfg(test)]
mod alloc_count;
#[cfg(test)]
mod equivalence;
#[cfg(test)]
pub(crate) mod fuzz;
#[cfg(test)]
mod levels;
#[cfg(test)]
mod tests;
