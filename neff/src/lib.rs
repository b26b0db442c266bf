//! A reader for NEFF files, the output of neuronx-cc that libnrt's `nrt_load` takes
//! (`../shared/reference/nrt-api.md` §4; DESIGN §6).
//!
//! A NEFF is a 1024-byte [`NeffHeader`] followed by a gzip'd POSIX tar. [`Neff::parse`] checks
//! the header (sizes, versions, the MD5 hash when asked, as `NEURON_RT_VALIDATE_HASH` asks
//! libnrt), unpacks the members it needs — `neff.json`, `info.json`, `kelf-0.json`, and per
//! subgraph `def.json`, `tensor_map.json`, the five engines' JSON and `.bin` streams, the
//! constants (`.npy`) and the activation/DVE tables — and returns a [`Neff`]: what the runtime
//! places in device memory and what the tools print.
//!
//! Every failure is a [`NeffError`] naming the member and field; no byte sequence panics.
//!
//! STATUS: data model only; the parser is being written (issue 14).

use std::collections::BTreeMap;

use shared::model::DType;
use thiserror::Error;

/// Bytes of the header.
pub const NEFF_HEADER_SIZE: usize = 1024;

/// The 1024-byte NEFF header (`nrt-api.md` §4), little-endian.
#[repr(C)]
#[derive(
    Clone,
    Copy,
    Debug,
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
)]
pub struct NeffHeader {
    /// Packaging version (2 observed).
    pub pkg_version: u64,
    /// Header bytes (1024).
    pub header_size: u64,
    /// Payload (gzip) bytes: the file is `header_size + data_size` long.
    pub data_size: u64,
    /// NEFF major version (2 observed).
    pub neff_version_major: u64,
    /// NEFF minor version (0 observed).
    pub neff_version_minor: u64,
    /// Build version string (zero in observed files).
    pub neff_build_version: [u8; 128],
    /// TPBs (cores) needed.
    pub num_tpb: u32,
    /// MD5 of the payload as four byte-swapped 32-bit words, the rest zero.
    pub hash: [u8; 32],
    /// Unique id.
    pub uuid: [u8; 16],
    /// NUL-terminated name ("file.neff").
    pub name: [u8; 256],
    /// Requested TPB count.
    pub requested_tpb_count: u32,
    /// TPBs per kelf node.
    pub tpb_per_node: [u8; 64],
    /// Incompatible-feature bits.
    pub feature_bits: u64,
    /// Logical core size the NEFF needs (2 observed).
    pub lnc_size: u32,
    /// Zero.
    pub pad: [u8; 468],
}

const _: () = assert!(std::mem::size_of::<NeffHeader>() == NEFF_HEADER_SIZE);

/// What [`Neff::parse`] checks beyond the format.
#[derive(Clone, Copy, Debug, Default)]
pub struct ParseOptions {
    /// Verify the header's hash against the payload (`NEURON_RT_VALIDATE_HASH`).
    pub validate_hash: bool,
}

/// The outcome of the hash check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashVerdict {
    /// Not asked for ([`ParseOptions::validate_hash`] false).
    NotChecked,
    /// The payload's MD5 matches the header.
    Valid,
}

/// The five engines' streams of a subgraph, in [`shared::Engine::ALL`] order (PE, ACT, POOL,
/// DVE, SP).
pub const ENGINE_FILES: [&str; 5] = ["PE", "Activation", "Pool", "DVE", "SP"];

/// A `var` entry of a subgraph's `def.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Var {
    /// The name (for I/O vars, the tensor name).
    pub name: String,
    /// `var_id`.
    pub var_id: u32,
    /// `size` in bytes (0 where `def.json` gives none: state-buffer, dge-table).
    pub size: u64,
    /// The type and its type-specific fields.
    pub kind: VarKind,
}

/// A var's `type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VarKind {
    /// `input`: bound per execution.
    Input,
    /// `output`: bound per execution.
    Output,
    /// `file`: a constant written once at load, from member `file_name` (an index into
    /// [`Subgraph::constants`]).
    File {
        /// The `.npy` member.
        file_name: String,
        /// `alignment` in bytes (1 when absent).
        alignment: u64,
    },
    /// `virtual`: scratch at `backing_variable_off` of the subgraph's shared scratchpad.
    Virtual {
        /// Offset in the scratchpad.
        backing_variable_off: u64,
    },
    /// `state-buffer`: the NC's SBUF (not allocated in HBM).
    StateBuffer,
    /// `tmp-buf`: scratch of `size` bytes.
    TmpBuf,
    /// `pointer`.
    Pointer,
    /// `dge-table`: the var ids of the I/O tensors, in table order.
    DgeTable {
        /// The listed var ids.
        list: Vec<u32>,
    },
}

/// A `dma_queue` set of `def.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmaQueueSet {
    /// Its key ("qSPDynamicHW").
    pub name: String,
    /// `type` ("dynamic").
    pub kind: String,
    /// `owner` engine ("sp", "pool", "act", ...).
    pub owner: String,
    /// `num_queues`.
    pub num_queues: u32,
    /// `semaphore_set`.
    pub semaphores: Vec<u32>,
}

/// An engine's instruction stream (`*.bin`): whole 64-byte records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stream {
    /// Member name ("sg00/PE.bin").
    pub member: String,
    /// The bytes (a multiple of 64).
    pub bytes: Vec<u8>,
}

impl Stream {
    /// Records in the stream.
    pub fn records(&self) -> u64 {
        self.bytes.len() as u64 / 64
    }
}

/// A constant of a `file` var: a `.npy` member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constant {
    /// The var's name.
    pub var: String,
    /// Member name.
    pub member: String,
    /// Element type (from the `.npy` header's `descr`).
    pub dtype: DType,
    /// Shape (from the `.npy` header).
    pub shape: Vec<u64>,
    /// The array's bytes (after the `.npy` header).
    pub data: Vec<u8>,
    /// Alignment its var asks for.
    pub alignment: u64,
}

/// An activation or DVE table member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Member name.
    pub member: String,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// A `runtime_statebuffer_reservation` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateBufferReservation {
    /// Byte offset in each partition.
    pub offset: u64,
    /// First partition.
    pub base_partition: u32,
    /// Partitions.
    pub partitions: u32,
    /// Bytes per partition.
    pub size: u64,
}

/// One subgraph (`sgNN/`): what one physical NC of the vNC runs.
#[derive(Clone, Debug)]
pub struct Subgraph {
    /// Its name in `kelf-0.json` ("sg00").
    pub name: String,
    /// `def.json`'s `var` entries, by name.
    pub vars: BTreeMap<String, Var>,
    /// `dma_queue` sets.
    pub dma_queues: Vec<DmaQueueSet>,
    /// The five streams, in [`shared::Engine::ALL`] order.
    pub streams: [Stream; 5],
    /// Constants of the `file` vars.
    pub constants: Vec<Constant>,
    /// Activation tables (the act_info and function-set members).
    pub act_tables: Vec<Table>,
    /// DVE tables.
    pub dve_tables: Vec<Table>,
    /// `runtime_statebuffer_reservation`.
    pub state_buffer_reservations: Vec<StateBufferReservation>,
    /// `runtime_event_count`.
    pub runtime_event_count: u32,
    /// `runtime_semaphore_count`.
    pub runtime_semaphore_count: u32,
    /// `neff_features`.
    pub features: Vec<String>,
}

/// A model input or output as the NEFF declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoTensor {
    /// The tensor name (the var name).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<u64>,
    /// Bytes (elements × width; equals the var's `size`).
    pub size: u64,
}

/// A parsed NEFF.
#[derive(Clone, Debug)]
pub struct Neff {
    /// The header.
    pub header: NeffHeader,
    /// Whether the hash was checked.
    pub hash: HashVerdict,
    /// `info.json`'s `tool_version`.
    pub tool_version: String,
    /// `kelf-0.json`'s `target`.
    pub target: String,
    /// Inputs, in `neff.json`'s signature order.
    pub inputs: Vec<IoTensor>,
    /// Outputs, in var-id order.
    pub outputs: Vec<IoTensor>,
    /// Subgraphs, in `kelf-0.json` order.
    pub subgraphs: Vec<Subgraph>,
}

/// Why a NEFF was refused. Each names the member and field where it applies.
#[derive(Debug, Error)]
pub enum NeffError {
    /// A placeholder until the parser exists.
    #[error("NEFF parsing is not implemented yet")]
    Unimplemented,
}

impl Neff {
    /// Parses a whole NEFF file.
    ///
    /// # Errors
    /// A [`NeffError`] naming what is wrong.
    pub fn parse(_bytes: &[u8], _options: &ParseOptions) -> Result<Self, NeffError> {
        Err(NeffError::Unimplemented)
    }
}
