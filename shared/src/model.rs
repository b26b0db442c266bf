//! The model container, version 2 (DESIGN §6): what `nrt_load` takes on simdev.
//!
//! A container is a 32-byte [`ContainerHeader`] — magic `b"NRTMODEL"`, format version, target,
//! body length, checksum, a reserved zero word — followed by the body: a [`Model`] encoded with bincode 2 (serde, standard
//! config). The body carries the metadata (I/O tensors with name, dtype, shape and byte size;
//! `sg_count`; `exec_req_flags`; activation/DVE table hashes; whether the model has a
//! collectives context) and, per TPB (physical NC of the vNC), the five engines' instruction
//! blocks, internal buffers (constants such as weights, scratch) and I/O DMA ring templates whose
//! descriptors bind patches with tensor PAs, keyed by tensor name.
//!
//! **Integrity.** The header's `checksum` is the CRC-32 (IEEE, `crc32fast`) of every byte of
//! the container except the checksum field itself: header bytes 0..24, the reserved word, then
//! the body. [`Model::from_container`] verifies it before decoding, so a corrupted file (any
//! single-bit flip, any burst of up to 32 bits) is refused with [`ContainerError::Checksum`]
//! instead of loading and running wrong — the role the MD5 hash in a NEFF's header plays for
//! libnrt. Version 1 containers (24-byte header, no checksum) are refused as another version:
//! rebuild them.
//!
//! Real NEFF files (a 1024-byte header, then a gzip'd tar) are recognised by
//! [`looks_like_neff`] and refused with a clear message until a NEFF path exists.

use serde::{Deserialize, Serialize};
use thiserror::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Container magic.
pub const MODEL_MAGIC: [u8; 8] = *b"NRTMODEL";
/// The container format version this crate reads and writes.
pub const MODEL_FORMAT_VERSION: u32 = 2;
/// Largest body accepted, in bytes (1 GiB).
pub const MAX_MODEL_BODY: u64 = 1 << 30;

/// What a container was built for.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Target {
    /// simdev's simulator ISA.
    Simdev = 1,
    /// NeuronCore silicon (instruction blocks in the silicon ISA).
    Silicon = 2,
}

impl Target {
    /// Decodes the header's target word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::Simdev),
            2 => Some(Self::Silicon),
            _ => None,
        }
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Simdev => "simdev",
            Self::Silicon => "silicon",
        }
    }
}

/// The 32-byte container header.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct ContainerHeader {
    /// [`MODEL_MAGIC`].
    pub magic: [u8; 8],
    /// [`MODEL_FORMAT_VERSION`].
    pub version: u32,
    /// A [`Target`] value.
    pub target: u32,
    /// Bytes of the body that follows.
    pub body_len: u64,
    /// CRC-32 of the container without this field (see [`container_checksum`]).
    pub checksum: u32,
    /// Zero (a nonzero value is refused).
    pub reserved: u32,
}

const _: () = assert!(std::mem::size_of::<ContainerHeader>() == 32);

/// Byte offset of [`ContainerHeader::checksum`] in a container.
pub const CHECKSUM_OFFSET: usize = std::mem::offset_of!(ContainerHeader, checksum);

/// The CRC-32 (IEEE) a container's header must carry: over every byte of `container` except
/// the 4 checksum bytes at [`CHECKSUM_OFFSET`]. `container` must be at least a header long.
pub fn container_checksum(container: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(container.get(..CHECKSUM_OFFSET).unwrap_or(container));
    h.update(container.get(CHECKSUM_OFFSET + 4..).unwrap_or_default());
    h.finalize()
}

/// Element types: libnrt's whole `nrt_dtype_t` (values 0x1..=0xF, not contiguous with the
/// developer guide's old list; `nrt-api.md` §2.2). `NRT_DTYPE_UNKNOWN` (0) is not a type a
/// tensor can have, so it has no variant: [`DType::from_u32`] returns `None` for it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    // The declaration order is the container encoding (bincode writes the variant's index):
    // the four types of format version 2 come first, in their original order; new types are
    // only ever appended.
    /// `NRT_DTYPE_UINT8` (0x3).
    U8 = 0x3,
    /// `NRT_DTYPE_BFLOAT16` (0x6).
    Bf16 = 0x6,
    /// `NRT_DTYPE_INT32` (0x8).
    I32 = 0x8,
    /// `NRT_DTYPE_FLOAT32` (0xA).
    F32 = 0xA,
    /// `NRT_DTYPE_UINT64` (0x1).
    U64 = 0x1,
    /// `NRT_DTYPE_INT8` (0x2).
    I8 = 0x2,
    /// `NRT_DTYPE_INT16` (0x4).
    I16 = 0x4,
    /// `NRT_DTYPE_UINT16` (0x5).
    U16 = 0x5,
    /// `NRT_DTYPE_FLOAT16` (0x7).
    F16 = 0x7,
    /// `NRT_DTYPE_UINT32` (0x9).
    U32 = 0x9,
    /// `NRT_DTYPE_FP32R` (0xB): fp32 with stochastic rounding, 4 bytes.
    Fp32r = 0xB,
    /// `NRT_DTYPE_INT64` (0xC).
    I64 = 0xC,
    /// `NRT_DTYPE_FP8_E3` (0xD): fp8 e3m4, 1 byte.
    Fp8E3 = 0xD,
    /// `NRT_DTYPE_FP8_E4` (0xE): fp8 e4m3, 1 byte.
    Fp8E4 = 0xE,
    /// `NRT_DTYPE_FP8_E5` (0xF): fp8 e5m2, 1 byte.
    Fp8E5 = 0xF,
}

impl DType {
    /// Every type, in `nrt_dtype_t` order.
    pub const ALL: [Self; 15] = [
        Self::U64,
        Self::I8,
        Self::U8,
        Self::I16,
        Self::U16,
        Self::Bf16,
        Self::F16,
        Self::I32,
        Self::U32,
        Self::F32,
        Self::Fp32r,
        Self::I64,
        Self::Fp8E3,
        Self::Fp8E4,
        Self::Fp8E5,
    ];

    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            Self::I8 | Self::U8 | Self::Fp8E3 | Self::Fp8E4 | Self::Fp8E5 => 1,
            Self::I16 | Self::U16 | Self::Bf16 | Self::F16 => 2,
            Self::I32 | Self::U32 | Self::F32 | Self::Fp32r => 4,
            Self::U64 | Self::I64 => 8,
        }
    }

    /// The type of an `nrt_dtype_t` value; `None` for 0 (`NRT_DTYPE_UNKNOWN`) and values past
    /// 0xF.
    pub const fn from_u32(v: u32) -> Option<Self> {
        if v >= 1 && v <= 15 {
            Some(Self::ALL[v as usize - 1])
        } else {
            None
        }
    }

    /// The `NRT_DTYPE_*` name.
    pub const fn nrt_name(self) -> &'static str {
        match self {
            Self::U64 => "NRT_DTYPE_UINT64",
            Self::I8 => "NRT_DTYPE_INT8",
            Self::U8 => "NRT_DTYPE_UINT8",
            Self::I16 => "NRT_DTYPE_INT16",
            Self::U16 => "NRT_DTYPE_UINT16",
            Self::Bf16 => "NRT_DTYPE_BFLOAT16",
            Self::F16 => "NRT_DTYPE_FLOAT16",
            Self::I32 => "NRT_DTYPE_INT32",
            Self::U32 => "NRT_DTYPE_UINT32",
            Self::F32 => "NRT_DTYPE_FLOAT32",
            Self::Fp32r => "NRT_DTYPE_FP32R",
            Self::I64 => "NRT_DTYPE_INT64",
            Self::Fp8E3 => "NRT_DTYPE_FP8_E3",
            Self::Fp8E4 => "NRT_DTYPE_FP8_E4",
            Self::Fp8E5 => "NRT_DTYPE_FP8_E5",
        }
    }

    /// The type a NEFF names with the numpy-style string of `neff.json` / `tensor_map.json`
    /// ("float16", "bfloat16", "float8_e4m3", ...); `None` for a name libnrt has no type for.
    pub fn from_neff_name(name: &str) -> Option<Self> {
        Some(match name {
            "uint64" => Self::U64,
            "int8" => Self::I8,
            "uint8" => Self::U8,
            "int16" => Self::I16,
            "uint16" => Self::U16,
            "bfloat16" => Self::Bf16,
            "float16" => Self::F16,
            "int32" => Self::I32,
            "uint32" => Self::U32,
            "float32" => Self::F32,
            "float32r" | "fp32r" => Self::Fp32r,
            "int64" => Self::I64,
            "float8_e3m4" | "fp8_e3" => Self::Fp8E3,
            "float8_e4m3" | "float8_e4m3fn" | "fp8_e4" => Self::Fp8E4,
            "float8_e5m2" | "fp8_e5" => Self::Fp8E5,
            _ => return None,
        })
    }

    /// The numpy-style name (the first spelling [`DType::from_neff_name`] accepts).
    pub const fn neff_name(self) -> &'static str {
        match self {
            Self::U64 => "uint64",
            Self::I8 => "int8",
            Self::U8 => "uint8",
            Self::I16 => "int16",
            Self::U16 => "uint16",
            Self::Bf16 => "bfloat16",
            Self::F16 => "float16",
            Self::I32 => "int32",
            Self::U32 => "uint32",
            Self::F32 => "float32",
            Self::Fp32r => "float32r",
            Self::I64 => "int64",
            Self::Fp8E3 => "float8_e3m4",
            Self::Fp8E4 => "float8_e4m3",
            Self::Fp8E5 => "float8_e5m2",
        }
    }
}

/// One model input or output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// The name tensor sets bind it by.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<u32>,
    /// Size in bytes (elements × dtype size).
    pub size: u64,
}

/// An address a ring template descriptor refers to, resolved at bind (tensors) or load
/// (buffers).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operand {
    /// Byte `offset` of the I/O tensor bound under `name`.
    Tensor {
        /// Model I/O tensor name.
        name: String,
        /// Byte offset in the tensor.
        offset: u64,
    },
    /// Byte `offset` of internal buffer `index` of this TPB.
    Buffer {
        /// Index into [`TpbProgram::buffers`].
        index: u32,
        /// Byte offset in the buffer.
        offset: u64,
    },
    /// Byte `offset` of SBUF partition `partition` of this TPB's NC (through the NC's SBUF DMA
    /// window; one descriptor stays inside one partition).
    Sbuf {
        /// Partition (0..128).
        partition: u32,
        /// Byte offset in the partition.
        offset: u64,
    },
}

/// One descriptor pair of an I/O ring template: copy `len` bytes from `src` to `dst`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoDesc {
    /// Source.
    pub src: Operand,
    /// Destination.
    pub dst: Operand,
    /// Bytes (1..=65536).
    pub len: u32,
}

/// An I/O DMA ring template: the descriptor pairs one execution posts on (engine, queue) of the
/// TPB, in order. The SP program starts them with `DmaStart(engine, queue, descs.len())`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoRing {
    /// DMA engine on the NC (not the exec queue's engine-queue pair).
    pub engine: u32,
    /// Queue on the engine.
    pub queue: u32,
    /// Ring size in descriptors (32 ≤ n ≤ 2^24−16, multiple of 16, ≥ 2 × descriptors).
    pub ring_descs: u32,
    /// The pairs of one execution.
    pub descs: Vec<IoDesc>,
}

/// An internal device buffer of a TPB: scratch, or constants loaded at load time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferSpec {
    /// A name for messages.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Initial bytes (weights); empty for zeroed scratch. At most `size` bytes.
    pub init: Vec<u8>,
}

/// What one physical NC of the vNC runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpbProgram {
    /// Instruction blocks of PE, ACT, POOL, DVE, SP (in that order).
    pub blocks: [Vec<u8>; 5],
    /// Internal buffers.
    pub buffers: Vec<BufferSpec>,
    /// I/O ring templates.
    pub io_rings: Vec<IoRing>,
}

/// A whole model (the container body).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    /// A name for messages.
    pub name: String,
    /// Inputs, in the order the model declares them.
    pub inputs: Vec<TensorSpec>,
    /// Outputs.
    pub outputs: Vec<TensorSpec>,
    /// Physical NCs the model runs on (1, or 2 at LNC=2); equals `tpbs.len()`.
    pub sg_count: u32,
    /// The sequencer configuration this model needs (`exec_req_tpb_config_t`, 52 bytes): a
    /// change from the last executed model's forces `reload_seq_config`.
    pub exec_req_flags: [u32; 13],
    /// Activation table hash (32 bytes).
    pub act_table_hash: [u8; 32],
    /// DVE table hash (32 bytes).
    pub dve_table_hash: [u8; 32],
    /// Whether the model has a collectives context (`cc_ctx.enc_ctx`).
    pub has_collectives: bool,
    /// Per TPB programs, `sg_count` of them.
    pub tpbs: Vec<TpbProgram>,
}

/// Why a container was refused. Messages name what was wrong.
#[derive(Debug, Error)]
pub enum ContainerError {
    /// A real NEFF file: the simulator cannot run silicon programs.
    #[error(
        "this is a NEFF file (neuronx-cc output, {num_tpb} TPBs): NEFFs carry the silicon ISA and cannot run on simdev; build a simdev model container instead"
    )]
    Neff {
        /// TPBs the NEFF header asks for.
        num_tpb: u32,
    },
    /// Too short or the wrong magic.
    #[error("not a model container (expected magic \"NRTMODEL\")")]
    BadMagic,
    /// Another format version.
    #[error(
        "model container version {found} is not supported (this runtime reads version {MODEL_FORMAT_VERSION})"
    )]
    UnsupportedVersion {
        /// Version in the header.
        found: u32,
    },
    /// Built for another target.
    #[error("model was built for {found}, this device is {expected}")]
    WrongTarget {
        /// Target word in the header.
        found: String,
        /// Target of the device.
        expected: &'static str,
    },
    /// The checksum in the header does not match the contents: the file is corrupted.
    #[error(
        "model container checksum mismatch: the header says {stored:#010x}, the contents hash to {computed:#010x} (the file is corrupted or was modified after it was built)"
    )]
    Checksum {
        /// CRC-32 in the header.
        stored: u32,
        /// CRC-32 of the contents.
        computed: u32,
    },
    /// The body length disagrees with the file.
    #[error("model body is {declared} bytes by its header, the file holds {actual}")]
    Truncated {
        /// Declared length.
        declared: u64,
        /// Bytes present.
        actual: u64,
    },
    /// The body does not decode.
    #[error("model body does not decode: {0}")]
    Body(String),
    /// The body decodes but breaks a rule.
    #[error("invalid model: {0}")]
    Invalid(String),
}

/// Whether `bytes` start like a NEFF: `pkg_version` 1–2, `header_size` 1024, a payload length
/// matching the file, and a gzip stream after the header. Returns the header's TPB count.
pub fn looks_like_neff(bytes: &[u8]) -> Option<u32> {
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let pkg = u64_at(0)?;
    let header = u64_at(8)?;
    let data = u64_at(16)?;
    let gzip = bytes.get(1024..1026)? == [0x1f, 0x8b];
    let sized = header.checked_add(data) == Some(bytes.len() as u64);
    if (1..=2).contains(&pkg) && header == 1024 && sized && gzip {
        Some(u32::from_le_bytes(bytes.get(0xA8..0xAC)?.try_into().ok()?))
    } else {
        None
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
}

impl Model {
    /// Checks the model's internal rules: `sg_count == tpbs.len()` in 1..=2, tensor sizes match
    /// their shapes and dtypes, names unique, ring templates refer to known tensors and buffers
    /// with in-range offsets and lengths, buffers hold their initial bytes.
    ///
    /// # Errors
    /// [`ContainerError::Invalid`] naming the first broken rule.
    pub fn validate(&self) -> Result<(), ContainerError> {
        let bad = |m: String| Err(ContainerError::Invalid(m));
        if !(1..=2).contains(&self.sg_count) || self.tpbs.len() != self.sg_count as usize {
            return bad(format!(
                "sg_count {} with {} TPB programs",
                self.sg_count,
                self.tpbs.len()
            ));
        }
        let mut names = std::collections::HashSet::new();
        for t in self.inputs.iter().chain(&self.outputs) {
            let elems: u64 = t.shape.iter().map(|&d| u64::from(d)).product();
            if elems.checked_mul(t.dtype.size()) != Some(t.size) || t.size == 0 {
                return bad(format!(
                    "tensor {:?}: size {} does not match shape {:?} of {:?}",
                    t.name, t.size, t.shape, t.dtype
                ));
            }
            if !names.insert(t.name.as_str()) {
                return bad(format!("tensor name {:?} is used twice", t.name));
            }
        }
        let tensor = |name: &str| {
            self.inputs
                .iter()
                .chain(&self.outputs)
                .find(|t| t.name == name)
        };
        for (i, tpb) in self.tpbs.iter().enumerate() {
            for b in &tpb.buffers {
                if b.init.len() as u64 > b.size || b.size == 0 {
                    return bad(format!(
                        "TPB {i} buffer {:?}: {} initial bytes for {} bytes",
                        b.name,
                        b.init.len(),
                        b.size
                    ));
                }
            }
            for ring in &tpb.io_rings {
                if ring.descs.is_empty()
                    || (ring.descs.len() as u64) * 2 > u64::from(ring.ring_descs)
                {
                    return bad(format!(
                        "TPB {i} ring ({}, {}): {} descriptors in a ring of {}",
                        ring.engine,
                        ring.queue,
                        ring.descs.len(),
                        ring.ring_descs
                    ));
                }
                for d in &ring.descs {
                    if d.len == 0 || d.len > 65536 {
                        return bad(format!(
                            "TPB {i} ring ({}, {}): descriptor length {}",
                            ring.engine, ring.queue, d.len
                        ));
                    }
                    for op in [&d.src, &d.dst] {
                        let (what, size, offset) = match op {
                            Operand::Tensor { name, offset } => match tensor(name) {
                                Some(t) => (format!("tensor {name:?}"), t.size, *offset),
                                None => {
                                    return bad(format!(
                                        "TPB {i}: ring refers to unknown tensor {name:?}"
                                    ));
                                }
                            },
                            Operand::Buffer { index, offset } => {
                                match tpb.buffers.get(*index as usize) {
                                    Some(b) => (format!("buffer {index}"), b.size, *offset),
                                    None => {
                                        return bad(format!(
                                            "TPB {i}: ring refers to unknown buffer {index}"
                                        ));
                                    }
                                }
                            }
                            Operand::Sbuf { partition, offset } => {
                                if *partition >= crate::isa::SBUF_PARTITIONS {
                                    return bad(format!(
                                        "TPB {i}: ring refers to SBUF partition {partition} (there are {})",
                                        crate::isa::SBUF_PARTITIONS
                                    ));
                                }
                                (
                                    format!("SBUF partition {partition}"),
                                    u64::from(crate::isa::SBUF_PARTITION_BYTES),
                                    *offset,
                                )
                            }
                        };
                        if offset
                            .checked_add(u64::from(d.len))
                            .is_none_or(|end| end > size)
                        {
                            return bad(format!(
                                "TPB {i}: {what} accessed at {offset}+{} beyond {size} bytes",
                                d.len
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Encodes the model as a container for `target`.
    ///
    /// # Errors
    /// [`ContainerError::Body`] when encoding fails.
    pub fn to_container(&self, target: Target) -> Result<Vec<u8>, ContainerError> {
        let body = bincode::serde::encode_to_vec(self, config())
            .map_err(|e| ContainerError::Body(e.to_string()))?;
        let header = ContainerHeader {
            magic: MODEL_MAGIC,
            version: MODEL_FORMAT_VERSION,
            target: target as u32,
            body_len: body.len() as u64,
            checksum: 0,
            reserved: 0,
        };
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(&body);
        let checksum = container_checksum(&out);
        out[CHECKSUM_OFFSET..CHECKSUM_OFFSET + 4].copy_from_slice(&checksum.to_le_bytes());
        Ok(out)
    }

    /// Decodes and validates a container built for `expected`.
    ///
    /// # Errors
    /// [`ContainerError`]: a NEFF, a bad magic, another version, a truncated body, a checksum
    /// mismatch (checked before anything else of the header is believed), a nonzero reserved
    /// word, another target, an undecodable body, a model breaking [`Model::validate`].
    pub fn from_container(bytes: &[u8], expected: Target) -> Result<Self, ContainerError> {
        if let Some(num_tpb) = looks_like_neff(bytes) {
            return Err(ContainerError::Neff { num_tpb });
        }
        let (header, body) =
            ContainerHeader::read_from_prefix(bytes).map_err(|_| ContainerError::BadMagic)?;
        if header.magic != MODEL_MAGIC {
            return Err(ContainerError::BadMagic);
        }
        if header.version != MODEL_FORMAT_VERSION {
            return Err(ContainerError::UnsupportedVersion {
                found: header.version,
            });
        }
        if header.body_len != body.len() as u64 || header.body_len > MAX_MODEL_BODY {
            return Err(ContainerError::Truncated {
                declared: header.body_len,
                actual: body.len() as u64,
            });
        }
        let computed = container_checksum(bytes);
        if computed != header.checksum {
            return Err(ContainerError::Checksum {
                stored: header.checksum,
                computed,
            });
        }
        if header.reserved != 0 {
            return Err(ContainerError::Invalid(format!(
                "reserved header word is {:#x}, must be 0",
                header.reserved
            )));
        }
        let target = Target::from_u32(header.target);
        if target != Some(expected) {
            let found = target.map_or_else(
                || format!("unknown target {}", header.target),
                |t| t.name().to_string(),
            );
            return Err(ContainerError::WrongTarget {
                found,
                expected: expected.name(),
            });
        }
        let (model, used) = decode_body(body).map_err(|e| ContainerError::Body(e.to_string()))?;
        if used != body.len() {
            return Err(ContainerError::Body(format!(
                "{} trailing bytes",
                body.len() - used
            )));
        }
        model.validate()?;
        Ok(model)
    }
}

/// Decodes a container body with a decode limit of 16 to 64 × its length (at least 4 KiB).
///
/// bincode allocates a string's claimed length before reading it, up to the limit: with one
/// fixed 1 GiB limit a few-byte body claiming a 1 GiB name made the parser allocate 1 GiB
/// (found by the `model` fuzz target). The limit counts each decoded value at its in-memory
/// size (a 1-byte varint `u64` counts 8) and each string byte once, so a real body never
/// needs more than 8 × its length; bodies above 64 MiB keep the 1 GiB limit.
fn decode_body(body: &[u8]) -> Result<(Model, usize), bincode::error::DecodeError> {
    macro_rules! decode_within {
        ($($shift:literal),*) => {
            $(
                if body.len().saturating_mul(16) <= 1 << $shift {
                    let config = bincode::config::standard().with_limit::<{ 1 << $shift }>();
                    return bincode::serde::decode_from_slice(body, config);
                }
            )*
        };
    }
    decode_within!(12, 14, 16, 18, 20, 22, 24, 26, 28);
    let config = bincode::config::standard().with_limit::<{ 1 << 30 }>();
    bincode::serde::decode_from_slice(body, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    fn identity(bytes: u32) -> Model {
        let t = |name: &str| TensorSpec {
            name: name.into(),
            dtype: DType::U8,
            shape: vec![bytes],
            size: u64::from(bytes),
        };
        Model {
            name: "identity".into(),
            inputs: vec![t("in")],
            outputs: vec![t("out")],
            sg_count: 1,
            exec_req_flags: [0; 13],
            act_table_hash: [0; 32],
            dve_table_hash: [0; 32],
            has_collectives: false,
            tpbs: vec![TpbProgram {
                blocks: Default::default(),
                buffers: vec![],
                io_rings: vec![IoRing {
                    engine: 1,
                    queue: 0,
                    ring_descs: 32,
                    descs: vec![IoDesc {
                        src: Operand::Tensor {
                            name: "in".into(),
                            offset: 0,
                        },
                        dst: Operand::Tensor {
                            name: "out".into(),
                            offset: 0,
                        },
                        len: bytes,
                    }],
                }],
            }],
        }
    }

    #[test]
    fn header_layout_and_golden_bytes() {
        assert_eq!(offset_of!(ContainerHeader, magic), 0);
        assert_eq!(offset_of!(ContainerHeader, version), 8);
        assert_eq!(offset_of!(ContainerHeader, target), 12);
        assert_eq!(offset_of!(ContainerHeader, body_len), 16);
        assert_eq!(offset_of!(ContainerHeader, checksum), 24);
        assert_eq!(offset_of!(ContainerHeader, reserved), 28);
        assert_eq!(CHECKSUM_OFFSET, 24);
        let bytes = identity(8).to_container(Target::Simdev).unwrap();
        assert_eq!(&bytes[..16], b"NRTMODEL\x02\0\0\0\x01\0\0\0");
        assert_eq!(
            u64::from_le_bytes(bytes[16..24].try_into().unwrap()),
            bytes.len() as u64 - 32
        );
        assert_eq!(&bytes[28..32], [0; 4]);
        // The checksum is the IEEE CRC-32 of everything but its own 4 bytes.
        let mut rest = bytes[..24].to_vec();
        rest.extend_from_slice(&bytes[28..]);
        assert_eq!(
            u32::from_le_bytes(bytes[24..28].try_into().unwrap()),
            crc32fast::hash(&rest)
        );
    }

    #[test]
    fn checksum_golden_value() {
        // A fixed header and 3-byte body, hashed independently of `to_container`: pins the
        // algorithm (CRC-32/ISO-HDLC, check value 0xCBF43926) and the bytes it covers.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        let mut c = b"NRTMODEL\x02\0\0\0\x01\0\0\0\x03\0\0\0\0\0\0\0".to_vec();
        c.extend_from_slice(&[0xAA; 4]); // checksum field: not covered
        c.extend_from_slice(&[0; 4]);
        c.extend_from_slice(b"abc");
        let mut covered = c[..24].to_vec();
        covered.extend_from_slice(&c[28..]);
        assert_eq!(container_checksum(&c), crc32fast::hash(&covered));
        c[24] = 0xBB;
        assert_eq!(container_checksum(&c), crc32fast::hash(&covered));
    }

    #[test]
    fn every_single_bit_flip_is_refused() {
        let mut m = identity(300);
        m.tpbs[0].buffers.push(BufferSpec {
            name: "weights".into(),
            size: 64,
            init: (0..64).collect(),
        });
        let good = m.to_container(Target::Simdev).unwrap();
        assert_eq!(Model::from_container(&good, Target::Simdev).unwrap(), m);
        let mut checksum_refusals = 0;
        for bit in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            match Model::from_container(&bad, Target::Simdev) {
                Ok(_) => panic!(
                    "bit {bit} (byte {}) flipped and the container loads",
                    bit / 8
                ),
                Err(ContainerError::Checksum { .. }) => checksum_refusals += 1,
                Err(_) => {}
            }
        }
        // Only magic, version and length flips are refused by an earlier check.
        assert!(
            checksum_refusals >= (good.len() - 24) * 8,
            "{checksum_refusals}"
        );
    }

    #[test]
    fn a_checksum_mismatch_names_both_values() {
        let mut bytes = identity(8).to_container(Target::Simdev).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x10;
        let e = Model::from_container(&bytes, Target::Simdev)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("model container checksum mismatch"), "{e}");
        assert!(e.contains("corrupted"), "{e}");
    }

    #[test]
    fn a_nonzero_reserved_word_is_refused() {
        let mut bytes = identity(8).to_container(Target::Simdev).unwrap();
        bytes[28] = 1;
        let sum = container_checksum(&bytes);
        bytes[24..28].copy_from_slice(&sum.to_le_bytes());
        let e = Model::from_container(&bytes, Target::Simdev)
            .unwrap_err()
            .to_string();
        assert!(e.contains("reserved header word is 0x1"), "{e}");
    }

    #[test]
    fn round_trip() {
        let m = identity(64);
        let bytes = m.to_container(Target::Simdev).unwrap();
        assert_eq!(Model::from_container(&bytes, Target::Simdev).unwrap(), m);
    }

    #[test]
    fn wrong_target_truncation_and_garbage_are_refused() {
        let bytes = identity(8).to_container(Target::Silicon).unwrap();
        let e = Model::from_container(&bytes, Target::Simdev)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "model was built for silicon, this device is simdev");
        let bytes = identity(8).to_container(Target::Simdev).unwrap();
        assert!(matches!(
            Model::from_container(&bytes[..bytes.len() - 1], Target::Simdev),
            Err(ContainerError::Truncated { .. })
        ));
        assert!(matches!(
            Model::from_container(b"hello", Target::Simdev),
            Err(ContainerError::BadMagic)
        ));
        let mut v1 = bytes.clone();
        v1[8] = 1;
        assert!(matches!(
            Model::from_container(&v1, Target::Simdev),
            Err(ContainerError::UnsupportedVersion { found: 1 })
        ));
    }

    #[test]
    fn invalid_models_name_the_problem() {
        let mut m = identity(8);
        m.tpbs[0].io_rings[0].descs[0].len = 9;
        let e = m.validate().unwrap_err().to_string();
        assert!(
            e.contains("tensor \"in\" accessed at 0+9 beyond 8 bytes"),
            "{e}"
        );
        let mut m = identity(8);
        m.outputs[0].name = "in".into();
        assert!(m.validate().unwrap_err().to_string().contains("used twice"));
        let mut m = identity(8);
        m.inputs[0].size = 7;
        assert!(
            m.validate()
                .unwrap_err()
                .to_string()
                .contains("does not match shape")
        );
    }

    /// Set in the child of [`a_tiny_body_claiming_a_huge_name_is_refused_without_allocating_it`].
    const HUGE_NAME_CHILD: &str = "SHARED_TEST_HUGE_NAME_CHILD";

    /// Runs in a child capped at 512 MiB of address space: the fixed 1 GiB decode limit let an
    /// 8-byte body make the parser allocate its claimed 1 GiB name, an abort under this cap.
    #[test]
    fn huge_name_child() {
        if std::env::var_os(HUGE_NAME_CHILD).is_none() {
            return;
        }
        use nix::sys::resource::{Resource, setrlimit};
        setrlimit(Resource::RLIMIT_AS, 512 << 20, 512 << 20).unwrap();
        // name: a u32 varint (0xFC) claiming 1 GiB - 256 bytes, then a few bytes.
        let mut body = vec![0xFC];
        body.extend_from_slice(&((1u32 << 30) - 256).to_le_bytes());
        body.extend_from_slice(&[0; 3]);
        let header = ContainerHeader {
            magic: MODEL_MAGIC,
            version: MODEL_FORMAT_VERSION,
            target: Target::Simdev as u32,
            body_len: body.len() as u64,
            checksum: 0,
            reserved: 0,
        };
        let mut file = header.as_bytes().to_vec();
        file.extend_from_slice(&body);
        // A valid checksum, so the body reaches the decoder.
        let checksum = container_checksum(&file);
        file[CHECKSUM_OFFSET..CHECKSUM_OFFSET + 4].copy_from_slice(&checksum.to_le_bytes());
        let e = Model::from_container(&file, Target::Simdev).unwrap_err();
        assert!(matches!(e, ContainerError::Body(_)), "{e}");
        // A real model still loads.
        let m = identity(512);
        let c = m.to_container(Target::Simdev).unwrap();
        assert_eq!(Model::from_container(&c, Target::Simdev).unwrap(), m);
        println!("HUGE_NAME_CHILD_OK");
    }

    #[test]
    fn a_tiny_body_claiming_a_huge_name_is_refused_without_allocating_it() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["model::tests::huge_name_child", "--exact", "--nocapture"])
            .env(HUGE_NAME_CHILD, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("HUGE_NAME_CHILD_OK"),
            "child: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn a_neff_header_is_recognised() {
        let mut neff = vec![0u8; 1024 + 16];
        neff[0] = 2;
        neff[8..16].copy_from_slice(&1024u64.to_le_bytes());
        neff[16..24].copy_from_slice(&16u64.to_le_bytes());
        neff[0xA8] = 2;
        neff[1024] = 0x1f;
        neff[1025] = 0x8b;
        assert_eq!(looks_like_neff(&neff), Some(2));
        let e = Model::from_container(&neff, Target::Simdev)
            .unwrap_err()
            .to_string();
        assert!(e.contains("NEFF"), "{e}");
    }

    #[test]
    fn dtypes_are_nrt_dtype_t_with_their_widths() {
        let widths: Vec<(u32, u64)> = DType::ALL.iter().map(|d| (*d as u32, d.size())).collect();
        assert_eq!(
            widths,
            [
                (0x1, 8),
                (0x2, 1),
                (0x3, 1),
                (0x4, 2),
                (0x5, 2),
                (0x6, 2),
                (0x7, 2),
                (0x8, 4),
                (0x9, 4),
                (0xA, 4),
                (0xB, 4),
                (0xC, 8),
                (0xD, 1),
                (0xE, 1),
                (0xF, 1)
            ]
        );
        assert_eq!(DType::from_u32(0), None);
        assert_eq!(DType::from_u32(16), None);
        for d in DType::ALL {
            assert_eq!(DType::from_u32(d as u32), Some(d));
            assert_eq!(DType::from_neff_name(d.neff_name()), Some(d));
        }
        assert_eq!(DType::from_neff_name("float16"), Some(DType::F16));
        assert_eq!(DType::from_neff_name("complex64"), None);
    }

    #[test]
    fn version_2_containers_keep_their_dtype_encoding() {
        // bincode writes a variant's declaration index: the four version-2 types keep 0..4.
        let enc = |d: DType| bincode::serde::encode_to_vec(d, config()).unwrap();
        assert_eq!(enc(DType::U8), [0]);
        assert_eq!(enc(DType::Bf16), [1]);
        assert_eq!(enc(DType::I32), [2]);
        assert_eq!(enc(DType::F32), [3]);
        assert_eq!(enc(DType::F16), [8]);
    }
}
