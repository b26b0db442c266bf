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
//! Every failure is a [`NeffError`] naming the member and field; no byte sequence panics, and
//! unpacking stops at [`Limits`] ([`Neff::parse_with_limits`]). Tools that report the hash
//! whatever `NEURON_RT_VALIDATE_HASH` says use [`hash_matches`]; [`looks_like_neff`] tells a
//! NEFF from other files by its header alone.
//!
//! Modules: [`header`] (layout, checks, hash), [`payload`] (gzip + tar under caps), [`def`]
//! (serde structs of the JSON members), [`npy`] (constants), `subgraph` (a `def.json` and
//! what it names), `io` (the model's inputs and outputs), `footprint` (device bytes a load
//! needs).

use std::collections::BTreeMap;

use shared::model::DType;

pub mod def;
mod error;
mod footprint;
pub mod header;
mod io;
pub mod npy;
pub mod pack;
pub mod payload;
mod subgraph;

pub use error::NeffError;
pub use footprint::DeviceBytes;
pub use header::{NEFF_HEADER_SIZE, NeffHeader, hash_matches, looks_like_neff};
pub use payload::Limits;

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

impl Subgraph {
    /// The device bytes a load of this subgraph needs on its NC (see [`DeviceBytes`]).
    pub fn device_bytes(&self) -> DeviceBytes {
        footprint::of(self)
    }

    /// Records per engine, in [`shared::Engine::ALL`] order.
    pub fn records(&self) -> [u64; 5] {
        self.streams.each_ref().map(Stream::records)
    }

    /// The var with `var_id`.
    pub fn var_by_id(&self, var_id: u32) -> Option<&Var> {
        self.vars.values().find(|v| v.var_id == var_id)
    }

    /// The `dge-table` vars.
    pub fn dge_tables(&self) -> impl Iterator<Item = &Var> {
        self.vars
            .values()
            .filter(|v| matches!(v.kind, VarKind::DgeTable { .. }))
    }

    /// The input and output names of the first DGE table in its `list` order: the order a
    /// shape-only run takes them in (`shared::neff_program::shape_only`).
    pub fn dge_io_order(&self) -> (Vec<String>, Vec<String>) {
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        let list = self.dge_tables().find_map(|v| match &v.kind {
            VarKind::DgeTable { list } => Some(list.as_slice()),
            _ => None,
        });
        for v in list
            .unwrap_or_default()
            .iter()
            .filter_map(|&id| self.var_by_id(id))
        {
            match v.kind {
                VarKind::Input => inputs.push(v.name.clone()),
                VarKind::Output => outputs.push(v.name.clone()),
                _ => {}
            }
        }
        (inputs, outputs)
    }
}

impl VarKind {
    /// The `def.json` `type` string.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Output => "output",
            Self::File { .. } => "file",
            Self::Virtual { .. } => "virtual",
            Self::StateBuffer => "state-buffer",
            Self::TmpBuf => "tmp-buf",
            Self::Pointer => "pointer",
            Self::DgeTable { .. } => "dge-table",
        }
    }
}

impl Neff {
    /// Parses a whole NEFF file under the default [`Limits`].
    ///
    /// # Errors
    /// A [`NeffError`] naming what is wrong.
    pub fn parse(bytes: &[u8], options: &ParseOptions) -> Result<Self, NeffError> {
        Self::parse_with_limits(bytes, options, &Limits::DEFAULT)
    }

    /// Parses a whole NEFF file, unpacking at most what `limits` allow.
    ///
    /// # Errors
    /// A [`NeffError`] naming what is wrong.
    pub fn parse_with_limits(
        bytes: &[u8],
        options: &ParseOptions,
        limits: &Limits,
    ) -> Result<Self, NeffError> {
        let header = header::check(bytes)?;
        let payload = &bytes[NEFF_HEADER_SIZE..];
        let hash = if options.validate_hash {
            header::check_hash(&header, payload)?;
            HashVerdict::Valid
        } else {
            HashVerdict::NotChecked
        };
        let members = payload::unpack(payload, limits)?;
        Self::from_members(header, hash, &members)
    }

    /// The NEFF described by the unpacked members, under a checked header.
    pub(crate) fn from_members(
        header: NeffHeader,
        hash: HashVerdict,
        members: &payload::Members,
    ) -> Result<Self, NeffError> {
        let neff_json: def::NeffJson = def::parse("neff.json", members.get("neff.json")?)?;
        let info: def::InfoJson = def::parse("info.json", members.get("info.json")?)?;
        let kelf: def::KelfJson = def::parse("kelf-0.json", members.get("kelf-0.json")?)?;
        if kelf.graphs.len() > header::MAX_NUM_TPB as usize {
            return Err(NeffError::Field {
                member: "kelf-0.json".into(),
                field: "graphs".into(),
                problem: format!(
                    "{} subgraphs, more than {}",
                    kelf.graphs.len(),
                    header::MAX_NUM_TPB
                ),
            });
        }
        let subgraphs = kelf
            .graphs
            .iter()
            .map(|g| subgraph::read(g, members))
            .collect::<Result<Vec<_>, _>>()?;
        let tensor_map: io::TensorMap = match kelf.graphs.first() {
            Some(g) => {
                let member = format!("{}tensor_map.json", subgraph::dir_of(&g.definition));
                match members.get(&member) {
                    Ok(bytes) => def::parse(&member, bytes)?,
                    Err(_) => io::TensorMap::new(),
                }
            }
            None => io::TensorMap::new(),
        };
        let signatures = neff_json.metadata.signatures;
        let empty = def::Signature::default();
        let signature = signatures
            .get("default")
            .or_else(|| signatures.values().next())
            .unwrap_or(&empty);
        let (inputs, outputs) = io::model_io(signature, &tensor_map, &subgraphs)?;
        Ok(Self {
            header,
            hash,
            tool_version: info.tool_version,
            target: kelf.target,
            inputs,
            outputs,
            subgraphs,
        })
    }

    /// The first subgraph's [`Subgraph::dge_io_order`] (every subgraph declares the same I/O).
    pub fn dge_io_order(&self) -> (Vec<String>, Vec<String>) {
        self.subgraphs
            .first()
            .map(Subgraph::dge_io_order)
            .unwrap_or_default()
    }

    /// Logical core size the NEFF needs (the header's `lnc_size`: 1 or 2).
    pub fn lnc_size(&self) -> u32 {
        self.header.lnc_size
    }

    /// The header's name ("file.neff").
    pub fn name(&self) -> String {
        self.header.name()
    }

    /// The header's uuid, 32 hex digits.
    pub fn uuid_hex(&self) -> String {
        self.header.uuid_hex()
    }

    /// Device bytes a load needs on all NCs together: per-subgraph figures summed, except
    /// `io`, which is the model's I/O once (the user binds each tensor once per execution).
    pub fn device_bytes(&self) -> DeviceBytes {
        let mut total = self
            .subgraphs
            .iter()
            .fold(DeviceBytes::default(), |a, sg| a.add(&sg.device_bytes()));
        total.io = self
            .inputs
            .iter()
            .chain(&self.outputs)
            .fold(0u64, |a, t| a.saturating_add(t.size));
        total
    }
}

#[cfg(test)]
mod tests;
