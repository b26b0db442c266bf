//! One subgraph: its `def.json` and every member it names (engine JSONs and streams, constants,
//! activation and DVE tables), checked into a [`Subgraph`].
//!
//! Invariants of a returned [`Subgraph`]: var ids are unique; every stream is whole 64-byte
//! records; every `file` var has its [`Constant`], whose data is exactly the var's `size`;
//! every `virtual` var's `backing_variable_off + size` fits in a u64; every alignment is a
//! power of two; a `dge-table` lists only this subgraph's input and output var ids.

use std::collections::{BTreeMap, BTreeSet};

use crate::def::{self, ActInfoJson, DefJson, DefVar, EngineJson, KelfGraph};
use crate::payload::Members;
use crate::{
    Constant, DmaQueueSet, NeffError, StateBufferReservation, Stream, Subgraph, Table, Var,
    VarKind, npy,
};

/// Bytes of an instruction record.
pub const RECORD_BYTES: usize = 64;

/// The directory prefix of a member path ("sg00/def.json" -> "sg00/").
pub(crate) fn dir_of(member: &str) -> &str {
    member.rfind('/').map_or("", |i| &member[..=i])
}

/// Reads subgraph `graph` from the payload.
pub(crate) fn read(graph: &KelfGraph, members: &Members) -> Result<Subgraph, NeffError> {
    let def_member = graph.definition.as_str();
    let dir = dir_of(def_member);
    let def: DefJson = def::parse(def_member, members.get(def_member)?)?;
    let vars = read_vars(def_member, &def)?;

    let mut streams = Vec::with_capacity(5);
    let mut engines = Vec::with_capacity(5);
    for (json, instr, key) in def.engines() {
        let engine_member = format!("{dir}{json}");
        let engine: EngineJson = def::parse(&engine_member, members.get(&engine_member)?)?;
        let instr = instr
            .or(engine.instr.as_deref())
            .ok_or_else(|| NeffError::Field {
                member: def_member.to_owned(),
                field: format!("{key}_instr"),
                problem: format!("absent here and in {engine_member}"),
            })?;
        let member = format!("{dir}{instr}");
        let bytes = members.get(&member)?;
        if bytes.len() % RECORD_BYTES != 0 {
            return Err(NeffError::StreamLength {
                member,
                len: bytes.len(),
            });
        }
        streams.push(Stream {
            member,
            bytes: bytes.to_vec(),
        });
        engines.push((engine_member, engine));
    }
    let streams: [Stream; 5] = streams.try_into().map_err(|_| NeffError::Field {
        member: def_member.to_owned(),
        field: "engines".into(),
        problem: "not five".into(),
    })?;

    let (act_member, act) = &engines[1];
    let act_tables = act_tables(dir, act_member, act, members)?;
    let (_, dve) = &engines[3];
    let mut dve_tables = Vec::new();
    for set in &dve.dve_tables {
        for name in set.values() {
            dve_tables.push(table(format!("{dir}{name}"), members)?);
        }
    }

    let constants = constants(dir, &vars, members)?;
    let dma_queues = def
        .dma_queue
        .into_iter()
        .map(|(name, q)| DmaQueueSet {
            name,
            kind: q.kind,
            owner: q.owner,
            num_queues: q.num_queues,
            semaphores: q.semaphore_set,
        })
        .collect();
    let state_buffer_reservations = def
        .runtime_statebuffer_reservation
        .iter()
        .map(|r| StateBufferReservation {
            offset: r.offset,
            base_partition: r.base_partition,
            partitions: r.partitions,
            size: r.size,
        })
        .collect();
    Ok(Subgraph {
        name: graph.name.clone(),
        vars,
        dma_queues,
        streams,
        constants,
        act_tables,
        dve_tables,
        state_buffer_reservations,
        runtime_event_count: def.runtime_event_count,
        runtime_semaphore_count: def.runtime_semaphore_count,
        features: def.neff_features,
    })
}

fn read_vars(member: &str, def: &DefJson) -> Result<BTreeMap<String, Var>, NeffError> {
    let field_err = |name: &str, field: &str, problem: String| NeffError::Field {
        member: member.to_owned(),
        field: format!("var.{name}.{field}"),
        problem,
    };
    let mut vars = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for (name, v) in &def.var {
        if !ids.insert(v.var_id) {
            return Err(field_err(
                name,
                "var_id",
                format!("{} is used twice", v.var_id),
            ));
        }
        let kind = var_kind(name, v, &field_err)?;
        let needs_size = matches!(
            kind,
            VarKind::Input | VarKind::Output | VarKind::File { .. } | VarKind::Virtual { .. }
        );
        let size = match v.size {
            Some(size) => size,
            None if needs_size => {
                return Err(field_err(
                    name,
                    "size",
                    format!("absent for a {} var", v.kind),
                ));
            }
            None => 0,
        };
        if let VarKind::Virtual {
            backing_variable_off,
        } = kind
            && backing_variable_off.checked_add(size).is_none()
        {
            return Err(field_err(
                name,
                "backing_variable_off",
                format!("{backing_variable_off} + size {size} overflows"),
            ));
        }
        vars.insert(
            name.clone(),
            Var {
                name: name.clone(),
                var_id: v.var_id,
                size,
                kind,
            },
        );
    }
    let io_ids: BTreeSet<u32> = vars
        .values()
        .filter(|v| matches!(v.kind, VarKind::Input | VarKind::Output))
        .map(|v| v.var_id)
        .collect();
    for var in vars.values() {
        if let VarKind::DgeTable { list } = &var.kind
            && let Some(bad) = list.iter().find(|id| !io_ids.contains(id))
        {
            return Err(field_err(
                &var.name,
                "list",
                format!("var id {bad} is not an input or output of this subgraph"),
            ));
        }
    }
    Ok(vars)
}

fn var_kind(
    name: &str,
    v: &DefVar,
    field_err: &impl Fn(&str, &str, String) -> NeffError,
) -> Result<VarKind, NeffError> {
    let missing = |field: &str| field_err(name, field, format!("absent for a {} var", v.kind));
    Ok(match v.kind.as_str() {
        "input" => VarKind::Input,
        "output" => VarKind::Output,
        "file" => {
            let alignment = v.alignment.unwrap_or(1);
            if !alignment.is_power_of_two() {
                return Err(field_err(
                    name,
                    "alignment",
                    format!("{alignment} is not a power of two"),
                ));
            }
            VarKind::File {
                file_name: v.file_name.clone().ok_or_else(|| missing("file_name"))?,
                alignment,
            }
        }
        "virtual" => VarKind::Virtual {
            backing_variable_off: v
                .backing_variable_off
                .ok_or_else(|| missing("backing_variable_off"))?,
        },
        "state-buffer" => VarKind::StateBuffer,
        "tmp-buf" => VarKind::TmpBuf,
        "pointer" => VarKind::Pointer,
        "dge-table" => VarKind::DgeTable {
            list: v.list.clone().ok_or_else(|| missing("list"))?,
        },
        other => {
            return Err(field_err(
                name,
                "type",
                format!("unknown var type {other:?}"),
            ));
        }
    })
}

fn table(member: String, members: &Members) -> Result<Table, NeffError> {
    let bytes = members.get(&member)?.to_vec();
    Ok(Table { member, bytes })
}

fn act_tables(
    dir: &str,
    engine_member: &str,
    act: &EngineJson,
    members: &Members,
) -> Result<Vec<Table>, NeffError> {
    let Some(info) = &act.act_info else {
        if let Some(set) = act.activation_function_sets.first() {
            return Err(NeffError::Field {
                member: engine_member.to_owned(),
                field: "act_info".into(),
                problem: format!("absent but activation_function_sets names {set:?}"),
            });
        }
        return Ok(Vec::new());
    };
    let info_member = format!("{dir}{info}");
    let info_table = table(info_member.clone(), members)?;
    let parsed: ActInfoJson = def::parse(&info_member, &info_table.bytes)?;
    let mut tables = vec![info_table];
    for set in &act.activation_function_sets {
        let entry = parsed
            .act_func_sets
            .iter()
            .find(|s| &s.name == set)
            .ok_or_else(|| NeffError::Field {
                member: engine_member.to_owned(),
                field: "activation_function_sets".into(),
                problem: format!("names {set:?}, which {info_member} does not describe"),
            })?;
        for name in [&entry.profile_json, &entry.bkt_bin, &entry.ctrl_bin] {
            tables.push(table(format!("{dir}{name}"), members)?);
        }
    }
    Ok(tables)
}

fn constants(
    dir: &str,
    vars: &BTreeMap<String, Var>,
    members: &Members,
) -> Result<Vec<Constant>, NeffError> {
    let mut constants = Vec::new();
    for var in vars.values() {
        let VarKind::File {
            file_name,
            alignment,
        } = &var.kind
        else {
            continue;
        };
        let member = format!("{dir}{file_name}");
        let array = npy::parse(members.get(&member)?).map_err(|problem| NeffError::Npy {
            member: member.clone(),
            problem,
        })?;
        if array.data.len() as u64 != var.size {
            return Err(NeffError::Npy {
                member,
                problem: format!(
                    "{} data bytes but var {} has size {}",
                    array.data.len(),
                    var.name,
                    var.size
                ),
            });
        }
        constants.push(Constant {
            var: var.name.clone(),
            member,
            dtype: array.dtype,
            shape: array.shape,
            data: array.data.to_vec(),
            alignment: *alignment,
        });
    }
    Ok(constants)
}
