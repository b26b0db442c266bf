//! serde structs for the JSON members: `neff.json`, `info.json`, `kelf-0.json`, a subgraph's
//! `def.json` and `tensor_map.json`, the engine JSONs and `act_info.json`.
//!
//! Only the fields the reader uses are declared (unknown fields are ignored, as libnrt ignores
//! what it does not know); a missing or mistyped required field is serde's error, which names
//! the field, wrapped with the member name and the field's path by [`parse`].

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::NeffError;

/// Parses JSON member `member`.
///
/// # Errors
/// [`NeffError::Json`] naming the member, with serde's message (field, line, column).
pub fn parse<T: DeserializeOwned>(member: &str, bytes: &[u8]) -> Result<T, NeffError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        NeffError::Json {
            member: member.to_owned(),
            message: if path == "." {
                inner.to_string()
            } else {
                format!("field {path}: {inner}")
            },
        }
    })?;
    de.end().map_err(|e| NeffError::Json {
        member: member.to_owned(),
        message: e.to_string(),
    })?;
    Ok(value)
}

/// `neff.json` (TVM-graph style); only its signature is used.
#[derive(Debug, Deserialize)]
pub struct NeffJson {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Metadata,
}

/// `neff.json`'s `metadata`.
#[derive(Debug, Default, Deserialize)]
pub struct Metadata {
    /// `signatures` by name ("default").
    #[serde(default)]
    pub signatures: BTreeMap<String, Signature>,
}

/// A signature: I/O tensors by name.
#[derive(Debug, Default, Deserialize)]
pub struct Signature {
    /// `inputs`.
    #[serde(default)]
    pub inputs: BTreeMap<String, SigTensor>,
    /// `outputs` (empty in the observed files).
    #[serde(default)]
    pub outputs: BTreeMap<String, SigTensor>,
}

/// A signature tensor.
#[derive(Debug, Deserialize)]
pub struct SigTensor {
    /// Position.
    pub id: u32,
    /// numpy-style dtype name.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<u64>,
}

/// `info.json`.
#[derive(Debug, Deserialize)]
pub struct InfoJson {
    /// The compiler's version.
    pub tool_version: String,
}

/// `kelf-0.json`.
#[derive(Debug, Deserialize)]
pub struct KelfJson {
    /// The subgraphs.
    pub graphs: Vec<KelfGraph>,
    /// The target ("cayman").
    #[serde(default)]
    pub target: String,
}

/// A `kelf-0.json` graph.
#[derive(Debug, Deserialize)]
pub struct KelfGraph {
    /// "sg00".
    pub name: String,
    /// "sg00/def.json".
    pub definition: String,
}

/// A subgraph's `def.json`.
#[derive(Debug, Deserialize)]
pub struct DefJson {
    /// Variables by name.
    pub var: BTreeMap<String, DefVar>,
    /// DMA queue sets by name.
    #[serde(default)]
    pub dma_queue: BTreeMap<String, DefQueue>,
    /// PE engine JSON.
    pub pe: String,
    /// ACT engine JSON.
    pub act: String,
    /// Pool engine JSON.
    pub pool: String,
    /// DVE engine JSON.
    pub dve: String,
    /// SP engine JSON.
    pub sp: String,
    /// PE stream.
    pub pe_instr: Option<String>,
    /// ACT stream.
    pub act_instr: Option<String>,
    /// Pool stream.
    pub pool_instr: Option<String>,
    /// DVE stream.
    pub dve_instr: Option<String>,
    /// SP stream.
    pub sp_instr: Option<String>,
    /// `runtime_event_count`.
    #[serde(default)]
    pub runtime_event_count: u32,
    /// `runtime_semaphore_count`.
    #[serde(default)]
    pub runtime_semaphore_count: u32,
    /// `runtime_statebuffer_reservation`.
    #[serde(default)]
    pub runtime_statebuffer_reservation: Vec<DefReservation>,
    /// `neff_features`.
    #[serde(default)]
    pub neff_features: Vec<String>,
}

impl DefJson {
    /// The engine JSONs and streams, in [`shared::Engine::ALL`] order.
    pub fn engines(&self) -> [(&str, Option<&str>, &'static str); 5] {
        [
            (&self.pe, self.pe_instr.as_deref(), "pe"),
            (&self.act, self.act_instr.as_deref(), "act"),
            (&self.pool, self.pool_instr.as_deref(), "pool"),
            (&self.dve, self.dve_instr.as_deref(), "dve"),
            (&self.sp, self.sp_instr.as_deref(), "sp"),
        ]
    }
}

/// A `def.json` `var` entry.
#[derive(Debug, Deserialize)]
pub struct DefVar {
    /// `type`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `var_id`.
    pub var_id: u32,
    /// `size` in bytes.
    pub size: Option<u64>,
    /// `file` vars: the `.npy` member.
    pub file_name: Option<String>,
    /// `file` vars: alignment.
    pub alignment: Option<u64>,
    /// `virtual` vars: offset in the scratchpad.
    pub backing_variable_off: Option<u64>,
    /// `dge-table` vars: var ids.
    pub list: Option<Vec<u32>>,
}

/// A `def.json` `dma_queue` set.
#[derive(Debug, Deserialize)]
pub struct DefQueue {
    /// `type`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `owner` engine.
    pub owner: String,
    /// `num_queues`.
    pub num_queues: u32,
    /// `semaphore_set`.
    #[serde(default)]
    pub semaphore_set: Vec<u32>,
}

/// A `runtime_statebuffer_reservation` entry.
#[derive(Debug, Deserialize)]
pub struct DefReservation {
    /// Byte offset in each partition.
    pub offset: u64,
    /// First partition.
    #[serde(default)]
    pub base_partition: u32,
    /// Partitions.
    pub partitions: u32,
    /// Bytes per partition.
    pub size: u64,
}

/// An engine JSON (`PE.json`, `Activation.json`, ...).
#[derive(Debug, Deserialize)]
pub struct EngineJson {
    /// The stream member (relative to the subgraph).
    pub instr: Option<String>,
    /// ACT: the activation info member.
    pub act_info: Option<String>,
    /// ACT: the function sets used.
    #[serde(default)]
    pub activation_function_sets: Vec<String>,
    /// DVE: table sets (role -> member).
    #[serde(default)]
    pub dve_tables: Vec<BTreeMap<String, String>>,
}

/// `act_info.json`.
#[derive(Debug, Deserialize)]
pub struct ActInfoJson {
    /// Every function set the compiler knows (only those the engine JSON names are packed).
    pub act_func_sets: Vec<ActFuncSet>,
}

/// An `act_info.json` function set.
#[derive(Debug, Deserialize)]
pub struct ActFuncSet {
    /// Its name.
    pub name: String,
    /// Bucket table member.
    pub bkt_bin: String,
    /// Control table member.
    pub ctrl_bin: String,
    /// Profile member.
    pub profile_json: String,
}

/// A `tensor_map.json` entry.
#[derive(Debug, Deserialize)]
pub struct TensorMapEntry {
    /// numpy-style dtype name.
    pub dtype: String,
    /// "input" / "output" (absent for constants).
    pub kind: Option<String>,
    /// The framework's shape.
    pub tf_shape: Option<Vec<u64>>,
}
