//! Placing a NEFF the way libnrt places it (issue 14 item 4; DESIGN §6 "NEFF models"; the
//! device-side contract is `shared::neff_program`).
//!
//! [`plan`] turns a parsed [`Neff`] into one [`SubgraphPlan`] per subgraph — what goes into
//! the HBM of the subgraph's physical NC and at which offsets — without touching the device,
//! so the memory check ([`NeffPlan::check_memory`]) runs before anything is allocated. The
//! model manager (`kmgr`) then allocates and writes each plan.
//!
//! # Placement (per subgraph `k`, on the vNC's `k`-th NC)
//! - **Program chunk** (one allocation): the 128-byte [`NeffProgramHeader`] at offset 0 (with
//!   the NEFF header's uuid and the first 16 bytes of its hash field, so simdev knows which NEFF
//!   runs), then
//!   the five engine streams (PE first, so the header sits immediately before it), then the
//!   activation tables, then the DVE tables, then the DGE table copies. Every piece starts at a
//!   [`PROGRAM_ALIGN`] (64-byte, one stream record) aligned offset; the request's engine
//!   address of a stream is `_pa + align_offset + offset` (the chunk's PA, align offset 0,
//!   plus the stream's offset).
//! - **DGE table**: the `dge-table` var as `dge_copies` consecutive copies of its entries (one
//!   [`DgeEntry`] per var id of its `list`, in list order). `dge_copies` is the request-buffer
//!   slot count of the NC (`max_inflight + 1`, `crate::stage`): at most that many fan-outs are
//!   staged and not yet run, so a copy is never rewritten before its execution ran. Only
//!   `input`/`output` vars may be listed (anything else is refused at load).
//! - **`file` vars** (constants): one allocation each, aligned to the var's `alignment`, the
//!   `.npy` data written once.
//! - **`virtual` vars**: ONE scratchpad per subgraph of `max(backing_variable_off + size)`
//!   bytes; a virtual var's address is the scratchpad's PA + its `backing_variable_off`.
//! - **`tmp-buf` / `pointer` vars**: one zeroed allocation each.
//! - **`input` / `output` vars**: not allocated; bound per execution (the DGE table).
//! - **`state-buffer`**: not in HBM. Each `runtime_statebuffer_reservation` must fit the arch's
//!   SBUF ([`sbuf_partition_bytes`], the silicon's size: the NEFFs reserve the top of a 224 KiB
//!   partition), or the load is refused.
//! - **Dynamic DMA queues**: set `i` of `dma_queue` (in the reader's order) gets DMA engine
//!   [`FIRST_DYNAMIC_DMA_ENGINE`]` + i`, queues `0..num_queues`, each a TX and an RX ring of
//!   [`DYNAMIC_QUEUE_DESCS`] descriptors (on silicon the descriptor generator fills them on the
//!   device; 64 descriptors keep the 16 queues of a set at 128 KiB). The queues are the NC's,
//!   shared by the NEFF models loaded on it and released with the last of them
//!   (`HwExecQueue::acquire_dynamic_queues`). Every semaphore of a set must be below
//!   `shared::sequencer::FIRST_RESERVED_SEMAPHORE` and the NC's semaphore count.
//!
//! # Model-level facts
//! The model's table hashes are the MD5 of every subgraph's activation (resp. DVE) tables —
//! for each, its member name, its length as 8 little-endian bytes, its bytes — in bytes 0..16,
//! bytes 16..32 zero: equal tables skip `load_act_dve_tables` like a container's. Its
//! `exec_req_flags` are [`NEFF_EXEC_REQ_FLAGS`].

use crate::datastore::snapshot::MemKind;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use shared::memory::SharedChunk;
use shared::model::{Model, TensorSpec, TpbProgram};
use shared::neff_program::{
    DGE_ENTRY_SIZE, DGE_KIND_INPUT, DGE_KIND_OUTPUT, NEFF_PROGRAM_HEADER_SIZE, NEFF_PROGRAM_MAGIC,
    NEFF_PROGRAM_VERSION, NeffProgramHeader,
};
use shared::protocol::DeviceInfo;
use shared::protocol::MemLocation;
use shared::sequencer::FIRST_RESERVED_SEMAPHORE;
use shared::{Arch, NrtStatus};
use zerocopy::IntoBytes;

use neff::{Neff, Subgraph, VarKind};

use crate::backend::Device;
use crate::error::NrtError;
use crate::kmgr::LoadedTpb;
use crate::stage::HwExecQueue;

/// Alignment of every piece of the program chunk (one 64-byte stream record).
pub const PROGRAM_ALIGN: u64 = 64;
/// DMA engine of the first dynamic queue set; set `i` uses engine `4 + i`.
pub const FIRST_DYNAMIC_DMA_ENGINE: u32 = 4;
/// Last DMA engine dynamic queue sets may use (engine 15 carries the tensor-operation queues,
/// engine 0 the exec queue; engines 1..=3 are left to model containers' I/O rings).
pub const LAST_DYNAMIC_DMA_ENGINE: u32 = 14;
/// Descriptors of each ring of a dynamic DMA queue.
pub const DYNAMIC_QUEUE_DESCS: u32 = 64;
/// Device bytes of one dynamic queue: two rings, each one 4 KiB chunk.
const DYNAMIC_QUEUE_BYTES: u64 = 2 * 4096;
/// The `exec_req_flags` of every NEFF model: word 0 is "NEFF" in ASCII (little-endian), word 1
/// the program encoding ([`shared::neff_program::PROGRAM_NEFF`]), the rest zero. No builder of
/// this crate makes a container with these flags, so a switch between a container and a NEFF
/// reloads the sequencer configuration.
pub const NEFF_EXEC_REQ_FLAGS: [u32; 13] = [
    u32::from_le_bytes(*b"NEFF"),
    shared::neff_program::PROGRAM_NEFF,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
];

/// Bytes of one SBUF partition on silicon: 192 KiB on NC-v2 (trn1, inf2: 24 MiB per NC), 224 KiB
/// on NC-v3 (trn2: 28 MiB per NC, AWS's "28 MB of on-chip SRAM per core"). A NEFF's state-buffer
/// reservations are checked against these, not against simdev's ISA SBUF
/// (`shared::isa::SBUF_PARTITION_BYTES`), which is smaller than what real NEFFs reserve.
pub const fn sbuf_partition_bytes(arch: Arch) -> u64 {
    match arch {
        Arch::Trn1 | Arch::Inf2 => 192 * 1024,
        Arch::Trn2 => 224 * 1024,
    }
}

/// One DGE table entry's load-time facts; bind fills in the PA of the tensor bound to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DgeSlot {
    /// The I/O tensor's name (the var's name).
    pub tensor: String,
    /// The var's id.
    pub var_id: u32,
    /// [`DGE_KIND_INPUT`] or [`DGE_KIND_OUTPUT`].
    pub kind: u32,
    /// The var's bytes.
    pub size: u64,
}

/// A constant to allocate and write.
#[derive(Clone, Debug)]
pub struct ConstantPlan<'a> {
    /// The var's name.
    pub var: String,
    /// Bytes to allocate (the var's size).
    pub size: u64,
    /// Alignment of the allocation.
    pub alignment: u64,
    /// The data to write at its start.
    pub data: &'a [u8],
}

/// Where one subgraph goes on its NC.
#[derive(Clone, Debug)]
pub struct SubgraphPlan<'a> {
    /// The subgraph's name ("sg00").
    pub name: String,
    /// Its physical NC.
    pub nc: u32,
    /// Bytes of the program chunk.
    pub program_size: u64,
    /// Offset of each stream in the program chunk (PE, ACT, POOL, DVE, SP).
    pub stream_offsets: [u64; 5],
    /// The streams' bytes.
    pub streams: [&'a [u8]; 5],
    /// (offset, bytes) of each activation then DVE table in the program chunk.
    pub tables: Vec<(u64, &'a [u8])>,
    /// Offset of DGE copy 0 in the program chunk.
    pub dge_offset: u64,
    /// The header, with `dge_table_pa` relative to the chunk (the loader adds the PA).
    pub header: NeffProgramHeader,
    /// The DGE table's entries, in list order.
    pub dge: Vec<DgeSlot>,
    /// Constants.
    pub constants: Vec<ConstantPlan<'a>>,
    /// Scratchpad bytes (0: none).
    pub scratch_size: u64,
    /// (name, backing_variable_off) of each virtual var.
    pub virtuals: Vec<(String, u64)>,
    /// (name, bytes) of each tmp-buf or pointer var.
    pub tmp: Vec<(String, u64)>,
    /// (engine, queue) of each dynamic DMA queue.
    pub queues: Vec<(u32, u32)>,
    /// The subgraph's SBUF reservations (checked against the arch's SBUF).
    pub state_buffer_reservations: Vec<neff::StateBufferReservation>,
    /// HBM bytes the subgraph takes (every chunk rounded up to 4 KiB, dynamic queue rings
    /// included).
    pub hbm_bytes: u64,
    /// The largest HBM var (name, bytes), if any.
    pub largest: Option<(String, u64)>,
}

/// A NEFF's placement on a vNC and its model-level metadata.
#[derive(Clone, Debug)]
pub struct NeffPlan<'a> {
    /// The NEFF's name (its header's).
    pub name: String,
    /// Metadata in the container's shape: name, I/O, sg_count, flags, table hashes; its `tpbs`
    /// hold no blocks, buffers or rings (the program is in [`NeffPlan::subgraphs`]).
    pub meta: Model,
    /// One plan per subgraph, in subgraph (= TPB) order.
    pub subgraphs: Vec<SubgraphPlan<'a>>,
}

fn invalid(name: &str, what: impl std::fmt::Display) -> NrtError {
    NrtError::new(NrtStatus::Invalid, format!("loading NEFF {name:?}: {what}"))
}

/// The NUL-terminated name of the NEFF header ("file.neff"), or "model" when empty.
pub fn neff_name(neff: &Neff) -> String {
    let raw = &neff.header.name;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let s = String::from_utf8_lossy(&raw[..end]).into_owned();
    if s.is_empty() { "model".into() } else { s }
}

/// What computes `neff`'s outputs on `device`: `None` on a device that runs the NEFF's own
/// instructions (silicon); on a simulated one `Some(Some(label))` for the reference it bound to
/// the NEFF (matched by the header's uuid and hash, as simdev matches a running program), or
/// `Some(None)` when it runs the NEFF shape-only.
pub fn simulated_outputs(device: &dyn Device, neff: &Neff) -> Option<Option<String>> {
    let bindings = device.neff_references().ok()?;
    let hash: Option<[u8; 16]> = neff.header.hash[..16].try_into().ok();
    Some(
        bindings
            .into_iter()
            .find(|b| b.neff_uuid == neff.header.uuid && Some(b.neff_hash) == hash)
            .map(|b| b.label),
    )
}

/// simdev's variable of CPU-reference bindings (`FILE.neff=REFERENCE`, `;`-separated), read by
/// a simdev when it starts: a private simdev inherits it from the runtime's process.
pub const REFERENCE_ENV: &str = "NEURON_SIMDEV_REFERENCE";

/// What the shape-only line adds when this process sets [`REFERENCE_ENV`] (`value`) and the
/// simdev in use still binds nothing to the NEFF: the variable is read by a simdev at its
/// start, so a shared simdev never sees this process's value, and a private one binds only
/// the NEFF files it names, by uuid and content. Empty when the variable is unset or empty.
pub fn unused_reference_hint(value: Option<&std::ffi::OsStr>) -> String {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return String::new();
    };
    format!(
        ". {REFERENCE_ENV} is set in this process ({:?}) but the simdev in use binds nothing \
         to this NEFF: a simdev reads the variable when it starts, so a shared \
         simdev (NEURON_SIMDEV_SOCKET) needs it in its own environment or --reference, and a \
         private one binds only the NEFF files the variable names, matched by uuid and content",
        value.to_string_lossy()
    )
}

/// The `tracing` target of the line that says a NEFF runs shape-only: libnrt logs it at WARN
/// even where it logs only errors (its default), since a program's outputs are otherwise
/// silently not its model's numbers.
pub const SHAPE_ONLY_TARGET: &str = "nrt_simulated_outputs";

fn page(bytes: u64) -> u64 {
    bytes.next_multiple_of(4096)
}

fn table_hash<'t>(tables: impl Iterator<Item = &'t neff::Table>) -> [u8; 32] {
    use md5::Digest;
    let mut h = md5::Md5::new();
    for t in tables {
        h.update(t.member.as_bytes());
        h.update((t.bytes.len() as u64).to_le_bytes());
        h.update(&t.bytes);
    }
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&h.finalize());
    out
}

fn tensor_spec(name: &str, t: &neff::IoTensor) -> Result<TensorSpec, NrtError> {
    let shape = t
        .shape
        .iter()
        .map(|&d| {
            u32::try_from(d).map_err(|_| {
                invalid(
                    name,
                    format!(
                        "tensor {:?} has dimension {d}, more than {} (u32::MAX)",
                        t.name,
                        u32::MAX
                    ),
                )
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(TensorSpec {
        name: t.name.clone(),
        dtype: t.dtype,
        shape,
        size: t.size,
    })
}

/// What the arch and the configuration give a vNC, for the LNC message.
#[derive(Clone, Copy, Debug)]
pub struct VncShape<'a> {
    /// The logical core.
    pub vnc: u32,
    /// Its physical NCs, main first.
    pub ncs: &'a [u32],
    /// Requests the NC can have staged (the request-buffer slot count): the DGE copies.
    pub dge_copies: u32,
}

/// Plans `neff` on the vNC: checks its LNC against the vNC, its vars, queues and reservations
/// against the device, and lays out every subgraph.
///
/// # Errors
/// NRT_LOAD_NOT_ENOUGH_NC for a NEFF of another LNC than the vNC's; NRT_INVALID naming what
/// else does not fit (a var, a queue set, a reservation, a shape).
pub fn plan<'a>(
    neff: &'a Neff,
    info: &DeviceInfo,
    vnc: &VncShape<'_>,
) -> Result<NeffPlan<'a>, NrtError> {
    let name = neff_name(neff);
    let sg_count = neff.subgraphs.len();
    let lnc_size = neff.header.lnc_size.max(1) as usize;
    if sg_count != lnc_size {
        // One subgraph per physical core of the logical core (nrt-api.md §4): a header that
        // says otherwise is a malformed NEFF, whatever the core's size.
        return Err(NrtError::new(
            NrtStatus::Invalid,
            format!(
                "NEFF {name:?} is inconsistent: its header asks for LNC={lnc_size} (lnc_size at \
                 0x228) but it holds {sg_count} subgraph(s), one per physical core"
            ),
        ));
    }
    if lnc_size != vnc.ncs.len() {
        let nc_word = if vnc.ncs.len() == 1 { "NC" } else { "NCs" };
        // What to change: LNC=2 exists on trn2 only.
        let remedy = if lnc_size == 2 && info.arch != shared::Arch::Trn2 {
            "; LNC=2 needs a trn2 device, where it is the default (for a private simdev, \
             NEURON_SIMDEV_ARCH=trn2)"
                .to_string()
        } else if (1..=2).contains(&lnc_size) {
            format!("; set NEURON_LOGICAL_NC_CONFIG={lnc_size}")
        } else {
            String::new()
        };
        // nrt_load's status for a model the logical core's NCs cannot hold, as for a builder
        // container of another LNC.
        return Err(NrtError::new(
            NrtStatus::LoadNotEnoughNc,
            format!(
                "NEFF {name:?} needs LNC={lnc_size} ({sg_count} subgraphs), logical core {} has {} {nc_word} (LNC={} on {}){remedy}",
                vnc.vnc,
                vnc.ncs.len(),
                vnc.ncs.len(),
                info.arch.name()
            ),
        ));
    }
    let inputs = neff
        .inputs
        .iter()
        .map(|t| tensor_spec(&name, t))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs = neff
        .outputs
        .iter()
        .map(|t| tensor_spec(&name, t))
        .collect::<Result<Vec<_>, _>>()?;
    let subgraphs = neff
        .subgraphs
        .iter()
        .zip(vnc.ncs)
        .enumerate()
        .map(|(k, (sg, &nc))| {
            let at = Placement {
                k,
                sg_count,
                nc,
                dge_copies: vnc.dge_copies,
            };
            plan_subgraph(&name, &neff.header, sg, at, info)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta = Model {
        name: name.clone(),
        inputs,
        outputs,
        sg_count: u32::try_from(sg_count).unwrap_or(u32::MAX),
        exec_req_flags: NEFF_EXEC_REQ_FLAGS,
        act_table_hash: table_hash(neff.subgraphs.iter().flat_map(|s| &s.act_tables)),
        dve_table_hash: table_hash(neff.subgraphs.iter().flat_map(|s| &s.dve_tables)),
        has_collectives: false,
        tpbs: (0..sg_count)
            .map(|_| TpbProgram {
                blocks: Default::default(),
                buffers: Vec::new(),
                io_rings: Vec::new(),
            })
            .collect(),
    };
    Ok(NeffPlan {
        name,
        meta,
        subgraphs,
    })
}

/// Where one subgraph goes: its index, the subgraph count, its NC and the DGE copies.
#[derive(Clone, Copy)]
struct Placement {
    k: usize,
    sg_count: usize,
    nc: u32,
    dge_copies: u32,
}

fn plan_subgraph<'a>(
    name: &str,
    neff_header: &neff::NeffHeader,
    sg: &'a Subgraph,
    at: Placement,
    info: &DeviceInfo,
) -> Result<SubgraphPlan<'a>, NrtError> {
    let Placement {
        k,
        sg_count,
        nc,
        dge_copies,
    } = at;
    let bad = |what: String| invalid(name, format!("subgraph {}: {what}", sg.name));
    // The program chunk: header, streams, tables, DGE copies.
    let mut off = NEFF_PROGRAM_HEADER_SIZE;
    let mut stream_offsets = [0u64; 5];
    let mut records = [0u32; 5];
    for (i, s) in sg.streams.iter().enumerate() {
        stream_offsets[i] = off;
        records[i] = u32::try_from(s.records())
            .map_err(|_| bad(format!("stream {} has too many records", s.member)))?;
        off = (off + s.bytes.len() as u64).next_multiple_of(PROGRAM_ALIGN);
    }
    let mut tables = Vec::new();
    for t in sg.act_tables.iter().chain(&sg.dve_tables) {
        tables.push((off, t.bytes.as_slice()));
        off = (off + t.bytes.len() as u64).next_multiple_of(PROGRAM_ALIGN);
    }
    let dge_offset = off;
    // Vars.
    let mut dge_vars = sg.vars.values().filter_map(|v| match &v.kind {
        VarKind::DgeTable { list } => Some((v, list)),
        _ => None,
    });
    let dge_list = match (dge_vars.next(), dge_vars.next()) {
        (None, _) => &[][..],
        (Some((_, list)), None) => list.as_slice(),
        (Some((a, _)), Some((b, _))) => {
            return Err(bad(format!(
                "two dge-table vars ({:?} and {:?}); one is supported",
                a.name, b.name
            )));
        }
    };
    let mut dge = Vec::with_capacity(dge_list.len());
    for &id in dge_list {
        let v = sg
            .vars
            .values()
            .find(|v| v.var_id == id)
            .ok_or_else(|| bad(format!("the dge-table lists var id {id}, which no var has")))?;
        let kind = match v.kind {
            VarKind::Input => DGE_KIND_INPUT,
            VarKind::Output => DGE_KIND_OUTPUT,
            _ => {
                return Err(bad(format!(
                    "the dge-table lists var {:?} (id {id}), which is not an input or output",
                    v.name
                )));
            }
        };
        dge.push(DgeSlot {
            tensor: v.name.clone(),
            var_id: id,
            kind,
            size: v.size,
        });
    }
    let dge_entries = u32::try_from(dge.len()).map_err(|_| bad("DGE table too long".into()))?;
    let dge_bytes = u64::from(dge_entries) * DGE_ENTRY_SIZE * u64::from(dge_copies.max(1));
    let program_size = (dge_offset + dge_bytes).max(PROGRAM_ALIGN);
    let header = NeffProgramHeader {
        magic: NEFF_PROGRAM_MAGIC,
        version: NEFF_PROGRAM_VERSION,
        subgraph: u16::try_from(k).map_err(|_| bad("too many subgraphs".into()))?,
        subgraph_count: u16::try_from(sg_count).map_err(|_| bad("too many subgraphs".into()))?,
        records,
        dge_entries,
        dge_table_pa: dge_offset,
        dge_copies: dge_copies.max(1),
        flags: 0,
        reserved: 0,
        neff_uuid: neff_header.uuid,
        neff_hash: neff_id_hash(neff_header),
        reserved2: [0; 4],
    };
    let mut hbm_bytes = page(program_size);
    let mut largest: Option<(String, u64)> = None;
    let mut consider = |n: &str, size: u64| {
        if largest.as_ref().is_none_or(|(_, s)| size > *s) {
            largest = Some((n.to_string(), size));
        }
    };
    let mut constants = Vec::new();
    let mut scratch_size = 0u64;
    let mut virtuals = Vec::new();
    let mut tmp = Vec::new();
    for v in sg.vars.values() {
        match &v.kind {
            VarKind::File { alignment, .. } => {
                let c = sg
                    .constants
                    .iter()
                    .find(|c| c.var == v.name)
                    .ok_or_else(|| bad(format!("file var {:?} has no constant data", v.name)))?;
                if c.data.len() as u64 > v.size {
                    return Err(bad(format!(
                        "constant {:?} holds {} bytes, its var {:?} is {} bytes",
                        c.member,
                        c.data.len(),
                        v.name,
                        v.size
                    )));
                }
                let alignment = (*alignment).max(1);
                if !alignment.is_power_of_two() {
                    return Err(bad(format!(
                        "file var {:?} asks for alignment {alignment}, not a power of two",
                        v.name
                    )));
                }
                hbm_bytes += page(v.size).max(alignment);
                consider(&v.name, v.size);
                constants.push(ConstantPlan {
                    var: v.name.clone(),
                    size: v.size,
                    alignment,
                    data: &c.data,
                });
            }
            VarKind::Virtual {
                backing_variable_off,
            } => {
                let end = backing_variable_off
                    .checked_add(v.size)
                    .ok_or_else(|| bad(format!("virtual var {:?} ends past 2^64", v.name)))?;
                scratch_size = scratch_size.max(end);
                virtuals.push((v.name.clone(), *backing_variable_off));
                consider(&v.name, v.size);
            }
            VarKind::TmpBuf | VarKind::Pointer => {
                hbm_bytes += page(v.size.max(1));
                consider(&v.name, v.size);
                tmp.push((v.name.clone(), v.size.max(1)));
            }
            VarKind::Input | VarKind::Output | VarKind::StateBuffer | VarKind::DgeTable { .. } => {}
        }
    }
    if scratch_size > 0 {
        hbm_bytes += page(scratch_size);
    }
    // State-buffer reservations: in the arch's SBUF.
    let sbuf = sbuf_partition_bytes(info.arch);
    for r in &sg.state_buffer_reservations {
        let end = r.offset.checked_add(r.size);
        let parts = r.base_partition.checked_add(r.partitions);
        if end.is_none_or(|e| e > sbuf) || parts.is_none_or(|p| p > shared::isa::SBUF_PARTITIONS) {
            return Err(bad(format!(
                "state-buffer reservation at offset {} ({} bytes, partitions {}..+{}) does not fit the {} SBUF ({} partitions of {sbuf} bytes)",
                r.offset,
                r.size,
                r.base_partition,
                r.partitions,
                info.arch.name(),
                shared::isa::SBUF_PARTITIONS
            )));
        }
    }
    // Dynamic DMA queues.
    let semaphores = FIRST_RESERVED_SEMAPHORE.min(info.semaphores_per_nc);
    let mut queues = Vec::new();
    for (i, set) in sg.dma_queues.iter().enumerate() {
        let engine = u32::try_from(i)
            .ok()
            .and_then(|i| FIRST_DYNAMIC_DMA_ENGINE.checked_add(i))
            .filter(|&e| e <= LAST_DYNAMIC_DMA_ENGINE && e < info.dma_engines_per_nc)
            .ok_or_else(|| {
                bad(format!(
                    "DMA queue set {:?} is set {} of {}; this runtime places at most {} sets (engines {FIRST_DYNAMIC_DMA_ENGINE}..={LAST_DYNAMIC_DMA_ENGINE})",
                    set.name,
                    i + 1,
                    sg.dma_queues.len(),
                    LAST_DYNAMIC_DMA_ENGINE - FIRST_DYNAMIC_DMA_ENGINE + 1
                ))
            })?;
        if set.num_queues > info.dma_queues_per_engine {
            return Err(bad(format!(
                "DMA queue set {:?} has {} queues, a DMA engine has {}",
                set.name, set.num_queues, info.dma_queues_per_engine
            )));
        }
        if let Some(&s) = set.semaphores.iter().find(|&&s| s >= semaphores) {
            return Err(bad(format!(
                "DMA queue set {:?} uses semaphore {s}; the NC has {semaphores} semaphores a program may use (0..{semaphores})",
                set.name
            )));
        }
        queues.extend((0..set.num_queues).map(|q| (engine, q)));
    }
    hbm_bytes += queues.len() as u64 * DYNAMIC_QUEUE_BYTES;
    Ok(SubgraphPlan {
        name: sg.name.clone(),
        nc,
        program_size,
        stream_offsets,
        streams: std::array::from_fn(|i| sg.streams[i].bytes.as_slice()),
        tables,
        dge_offset,
        header,
        dge,
        constants,
        scratch_size,
        virtuals,
        tmp,
        queues,
        state_buffer_reservations: sg.state_buffer_reservations.clone(),
        hbm_bytes,
        largest,
    })
}

impl NeffPlan<'_> {
    /// Refuses, before anything is allocated, a subgraph that needs more HBM than its NC has
    /// free (`free_per_nc`).
    ///
    /// # Errors
    /// NRT_RESOURCE naming the subgraph, the NC, the largest var and both sizes.
    pub fn check_memory(&self, free_per_nc: u64) -> Result<(), NrtError> {
        for sg in &self.subgraphs {
            if sg.hbm_bytes > free_per_nc {
                let largest = sg.largest.as_ref().map_or_else(
                    || "the instruction streams".to_string(),
                    |(n, s)| format!("var {n:?} {s} bytes"),
                );
                return Err(NrtError::new(
                    NrtStatus::Resource,
                    format!(
                        "NEFF {:?} subgraph {} needs {} bytes of HBM on NC {} (largest: {largest}), NC {} has {free_per_nc} bytes free",
                        self.name, sg.name, sg.hbm_bytes, sg.nc, sg.nc
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// One subgraph's NEFF program as loaded on its NC (the NEFF part of a [`LoadedTpb`], whose
/// `blocks` is the program chunk and whose `buffers` are the constants, the scratchpad and the
/// tmp-buf/pointer vars).
#[derive(Debug)]
pub struct NeffTpb {
    /// The header as written before the PE stream (`dge_table_pa` absolute).
    pub header: NeffProgramHeader,
    /// The DGE table's entries (bind fills each one's tensor PA per execution).
    pub dge: Vec<DgeSlot>,
    /// Device address of every var placed in HBM (constants, virtual, tmp-buf, pointer).
    pub var_pas: BTreeMap<String, u64>,
    /// The program chunk's mapping: the stage writes DGE copies through it. Taken (unmapped)
    /// when the model is freed.
    pub program: Mutex<Option<SharedChunk>>,
    /// The dynamic DMA queues this model holds a use of.
    pub queues: Vec<(u32, u32)>,
    /// The SBUF reservations the program makes (not in HBM; recorded for the tools).
    pub state_buffer_reservations: Vec<neff::StateBufferReservation>,
    /// The NC's exec queues, weakly: a model outliving `nrt_close` (held by a work item of a
    /// failed XU) must not keep the runtime's queues from being released at close, which
    /// releases the dynamic queues with them.
    hwq: std::sync::Weak<HwExecQueue>,
}

impl NeffTpb {
    /// Gives back what the device mapping and the NC's queues hold (before the chunks are
    /// freed).
    pub(crate) fn release(&self, nc: u32) {
        drop(
            self.program
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        if let Some(hwq) = self.hwq.upgrade() {
            hwq.release_dynamic_queues(nc, &self.queues);
        }
    }
}

fn write_failed(name: &str, sg: &str, e: impl std::fmt::Display) -> NrtError {
    NrtError::new(
        NrtStatus::Failure,
        format!("loading NEFF {name:?} subgraph {sg}: writing device memory: {e}"),
    )
}

/// Allocates and writes subgraph `plan` on its NC, pushing its [`LoadedTpb`] onto `tpbs` as
/// soon as its program chunk exists — also when a later step fails — so the caller frees
/// everything it holds.
///
/// # Errors
/// The device's errors; NRT_FAILURE when device memory cannot be written.
pub(crate) fn place_subgraph(
    device: &Arc<dyn Device>,
    name: &str,
    plan: &SubgraphPlan<'_>,
    hwq: &Arc<HwExecQueue>,
    tpbs: &mut Vec<LoadedTpb>,
) -> Result<(), NrtError> {
    let nc = plan.nc;
    let chunk = device.mem_alloc(MemLocation::Hbm { nc }, plan.program_size, 0)?;
    let mut header = plan.header;
    header.dge_table_pa = chunk.pa + plan.dge_offset;
    let mut loaded = LoadedTpb {
        nc,
        blocks: chunk,
        engine_addresses: plan.stream_offsets.map(|o| chunk.pa + o),
        buffers: Vec::new(),
        buffer_kinds: Vec::new(),
        neff: Some(NeffTpb {
            header,
            dge: plan.dge.clone(),
            var_pas: BTreeMap::new(),
            program: Mutex::new(None),
            queues: Vec::new(),
            state_buffer_reservations: plan.state_buffer_reservations.clone(),
            hwq: Arc::downgrade(hwq),
        }),
    };
    let r = fill(device, name, plan, &mut loaded);
    tpbs.push(loaded);
    r
}

fn fill(
    device: &Arc<dyn Device>,
    name: &str,
    plan: &SubgraphPlan<'_>,
    loaded: &mut LoadedTpb,
) -> Result<(), NrtError> {
    let nc = plan.nc;
    let wf = |e: shared::memory::MemError| write_failed(name, &plan.name, e);
    let chunk = loaded.blocks;
    let map = device.mem_map(&chunk)?;
    let Some(neff) = loaded.neff.as_mut() else {
        return Err(write_failed(name, &plan.name, "not a NEFF TPB"));
    };
    map.write(chunk.pa, neff.header.as_bytes()).map_err(wf)?;
    for (off, bytes) in plan.stream_offsets.iter().zip(plan.streams) {
        map.write(chunk.pa + off, bytes).map_err(wf)?;
    }
    for (off, bytes) in &plan.tables {
        map.write(chunk.pa + off, bytes).map_err(wf)?;
    }
    *neff
        .program
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(map);
    for c in &plan.constants {
        let a = device.mem_alloc(MemLocation::Hbm { nc }, c.size, c.alignment)?;
        loaded.buffers.push(a);
        loaded.buffer_kinds.push(MemKind::Constants);
        neff.var_pas.insert(c.var.clone(), a.pa);
        device.mem_map(&a)?.write(a.pa, c.data).map_err(wf)?;
    }
    if plan.scratch_size > 0 {
        let a = device.mem_alloc(MemLocation::Hbm { nc }, plan.scratch_size, 0)?;
        loaded.buffers.push(a);
        loaded.buffer_kinds.push(MemKind::ModelSharedScratchpad);
        for (v, off) in &plan.virtuals {
            neff.var_pas.insert(v.clone(), a.pa + off);
        }
    }
    for (v, size) in &plan.tmp {
        let a = device.mem_alloc(MemLocation::Hbm { nc }, *size, 0)?;
        loaded.buffers.push(a);
        loaded.buffer_kinds.push(MemKind::ModelSharedScratchpad);
        neff.var_pas.insert(v.clone(), a.pa);
    }
    let hwq = neff
        .hwq
        .upgrade()
        .ok_or_else(|| write_failed(name, &plan.name, "the NC's exec queues are released"))?;
    hwq.acquire_dynamic_queues(nc, &plan.queues, DYNAMIC_QUEUE_DESCS)?;
    neff.queues.clone_from(&plan.queues);
    Ok(())
}

/// The first 16 bytes of the NEFF header's `hash` field, as stored (the program header's
/// `neff_hash`).
pub fn neff_id_hash(header: &neff::NeffHeader) -> [u8; 16] {
    let mut h = [0u8; 16];
    h.copy_from_slice(&header.hash[..16]);
    h
}
