//! The model manager (`kmgr`): loading a model container onto a vNC, the model database with
//! handles and in-flight reference counts, and unload that waits for in-flight work
//! (seed 000 §1 `kmgr_exec`, `db_get_nn_ref_count`).
//!
//! Load allocates everything an execution needs, once: per TPB one chunk holding the five
//! instruction blocks, the internal buffers (weights written here), and the NC's I/O rings the
//! model uses. The hot path allocates nothing of this.
//!
//! A NEFF (recognised by its header) is parsed by the `neff` crate and placed as libnrt places
//! it ([`neff_load`]): its [`LoadedModel::model`] is then the NEFF's metadata (I/O, sg_count,
//! flags, table hashes) and each [`LoadedTpb`] carries its [`neff_load::NeffTpb`].

use crate::FastHashMap;
use crate::datastore::ModelSlot;
use crate::datastore::snapshot::MemKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use shared::isa;
use shared::model::{Model, Target};
use shared::protocol::MemLocation;
use shared::udma::MAX_DESC_LEN;
use shared::{AddressMap, NrtStatus};

use crate::backend::{Allocation, Device};
use crate::bind::TdrvComputeResources;
use crate::error::NrtError;
use crate::stage::{CcChain, HwExecQueue, IO_RING_DESCS};
use crate::tensor::{BoundTensor, RuntimeId};

pub mod neff_load;

/// Alignment of each instruction block inside a TPB's block chunk.
pub const BLOCK_ALIGN: u64 = 256;

/// One TPB's loaded program.
#[derive(Debug)]
pub struct LoadedTpb {
    /// The physical NC.
    pub nc: u32,
    /// The chunk holding the five blocks.
    pub blocks: Allocation,
    /// Device address of each engine's block (PE, ACT, POOL, DVE, SP).
    pub engine_addresses: [u64; 5],
    /// Internal buffers, by index (for a NEFF: constants, the scratchpad, tmp-buf/pointer vars).
    pub buffers: Vec<Allocation>,
    /// What each of `buffers` holds, for the datastore's memory by kind (constants: weights
    /// and other initialised data; scratchpad: everything else).
    pub buffer_kinds: Vec<MemKind>,
    /// The NEFF program of this TPB (`None` for a model container).
    pub neff: Option<neff_load::NeffTpb>,
}

/// A model loaded on a vNC.
#[derive(Debug)]
pub struct LoadedModel {
    id: u64,
    vnc: u32,
    model: Model,
    tpbs: Vec<LoadedTpb>,
    inflight: Mutex<Inflight>,
    idle: Condvar,
    /// `idle` notifications so far (an execution ending while an unload waits).
    idle_wakes: AtomicU64,
    map: AddressMap,
    cc_chain: std::sync::OnceLock<Result<CcChain, NrtError>>,
    cc_builds: AtomicU64,
    device: Arc<dyn Device>,
    runtime: RuntimeId,
    /// Its datastore slot, set once after load.
    datastore_slot: std::sync::OnceLock<Option<ModelSlot>>,
    /// The CPU reference simdev runs for this NEFF (its label), set once after load.
    reference: std::sync::OnceLock<String>,
    /// Its executions' timeout (`NEURON_RT_EXEC_TIMEOUT` when it was loaded).
    exec_timeout: std::time::Duration,
}

impl LoadedModel {
    /// The handle id (`h_nn`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.model.name
    }

    /// How long one of its executions may take before NRT_TIMEOUT: `NEURON_RT_EXEC_TIMEOUT`
    /// as its load read it.
    pub fn exec_timeout(&self) -> std::time::Duration {
        self.exec_timeout
    }

    /// The CPU reference simdev computes this NEFF's outputs with (`module.py:function`, or a
    /// golden file's name), if one is bound.
    pub fn reference(&self) -> Option<&str> {
        self.reference.get().map(String::as_str)
    }

    /// The NEFF header's uuid; zeros for a simdev model container, which has none.
    pub fn uuid(&self) -> [u8; 16] {
        self.tpbs
            .first()
            .and_then(|t| t.neff.as_ref())
            .map_or([0; 16], |n| n.header.neff_uuid)
    }

    /// The logical core it runs on.
    pub fn vnc(&self) -> u32 {
        self.vnc
    }

    /// The runtime that loaded it.
    pub fn runtime(&self) -> RuntimeId {
        self.runtime
    }

    /// The container's metadata and programs; for a NEFF its metadata (its `tpbs` hold no
    /// blocks, buffers or rings: the program is in each [`LoadedTpb::neff`]).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The loaded TPBs.
    pub fn tpbs(&self) -> &[LoadedTpb] {
        &self.tpbs
    }

    /// Device PA of internal buffer `index` of TPB `tpb`.
    pub fn buffer_pa(&self, tpb: usize, index: u32) -> Option<u64> {
        Some(self.tpbs.get(tpb)?.buffers.get(index as usize)?.pa)
    }

    /// Device PA of byte `offset` of SBUF partition `partition` on TPB `tpb`'s NC.
    pub fn sbuf_pa(&self, tpb: usize, partition: u32, offset: u64) -> Option<u64> {
        Some(
            self.map
                .sbuf_address(self.tpbs.get(tpb)?.nc, partition, offset),
        )
    }

    /// The collectives model-switch chain, built on first use and cached on the model (seed 000
    /// §3 GOTCHA: never rebuilt, never built on a second NC). A model with a collectives context
    /// carries, on its first TPB, buffers named `cc_ctx` (the context), `cc_ctx_dst` (where the
    /// switch loads it, same size) and `cc_one` (a word holding 1); the chain copies the context
    /// in pieces of at most 64 KiB and its last pair pokes the first NC's
    /// collectives-context-load event with that word.
    ///
    /// # Errors
    /// NRT_INVALID when the model lacks those buffers.
    pub fn cc_chain(&self) -> Result<&CcChain, NrtError> {
        self.cc_chain
            .get_or_init(|| {
                self.cc_builds.fetch_add(1, Ordering::Relaxed);
                self.build_cc_chain()
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// How many times the collectives chain was built (at most once).
    pub fn cc_chain_builds(&self) -> u64 {
        self.cc_builds.load(Ordering::Relaxed)
    }

    fn build_cc_chain(&self) -> Result<CcChain, NrtError> {
        let tpb = &self.tpbs[0];
        let spec = &self.model.tpbs[0];
        let find = |name: &str| {
            spec.buffers
                .iter()
                .position(|b| b.name == name)
                .and_then(|i| tpb.buffers.get(i))
                .ok_or_else(|| {
                    NrtError::new(
                        NrtStatus::Invalid,
                        format!(
                            "model {:?} has a collectives context but no buffer {name:?}",
                            self.name()
                        ),
                    )
                })
        };
        let (src, dst, one) = (find("cc_ctx")?, find("cc_ctx_dst")?, find("cc_one")?);
        let len = src.size.min(dst.size);
        let mut pairs = Vec::new();
        let mut off = 0;
        while off < len {
            let n = (len - off).min(65536);
            pairs.push((src.pa + off, dst.pa + off, n));
            off += n;
        }
        let event = self.map.register_address(shared::Register::Event {
            nc: tpb.nc,
            index: shared::sequencer::EVENT_COLLECTIVES_CTX_LOAD,
        });
        pairs.push((one.pa, event, 4));
        let chain = CcChain { pairs };
        crate::stage::check_cc_chain(&chain)?;
        Ok(chain)
    }

    /// Counts one execution in flight until the guard ends or drops, before anything of it
    /// reaches the device (bind begins it), and hands it a resource tracker from the model's
    /// pool (empty ones are made on first use), under one lock: bind refills the tracker in
    /// place with this execution's encoded I/O descriptors (`ioq_switch_tx_descs` /
    /// `ioq_switch_rx_descs`), so steady-state executions allocate no tracker and no descriptor
    /// storage; [`InflightGuard::end`] gives it back.
    ///
    /// # Errors
    /// NRT_INVALID_HANDLE once the model is being unloaded: an execution that resolved the
    /// model before `unload` took it must not stage into memory `unload` is about to free.
    pub(crate) fn begin_execution(self: &Arc<Self>) -> Result<(InflightGuard, Tracker), NrtError> {
        let mut n = self
            .inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if n.unloading {
            return Err(NrtError::new(
                NrtStatus::InvalidHandle,
                format!("model {:?} is being unloaded", self.name()),
            ));
        }
        n.executions += 1;
        let tracker = n.trackers.pop().unwrap_or_default();
        drop(n);
        let guard = InflightGuard {
            model: Some(self.clone()),
        };
        Ok((guard, tracker))
    }

    /// Ends an execution counted by [`LoadedModel::begin_execution`], returning its tracker
    /// to the pool when it has one (`kmgr_exec_resources_free`), under one lock.
    fn end_execution(&self, tracker: Option<Tracker>) {
        let mut n = self
            .inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tracker) = tracker {
            n.trackers.push(tracker);
        }
        n.executions -= 1;
        // `notify_all` is a futex system call even with nobody waiting: on the sync path it
        // would cost one per execution. Waiters register under the same lock, so none is missed.
        if n.executions == 0 && n.waiters > 0 {
            self.idle_wakes.fetch_add(1, Ordering::Relaxed);
            self.idle.notify_all();
        }
    }

    /// Executions counted in flight ([`LoadedModel::begin_execution`]).
    pub fn executions_in_flight(&self) -> u64 {
        u64::from(
            self.inflight
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .executions,
        )
    }

    /// Refuses new executions ([`LoadedModel::begin_execution`]) and waits for those in flight.
    fn wait_idle(&self) {
        let mut n = self
            .inflight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        n.unloading = true;
        n.waiters += 1;
        while n.executions > 0 {
            n = self
                .idle
                .wait(n)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        n.waiters -= 1;
    }

    /// Times an ending execution woke the threads waiting for the model to be idle (only
    /// when one waits: an execution ending with nobody unloading costs no wake-up call).
    pub fn idle_wakes(&self) -> u64 {
        self.idle_wakes.load(Ordering::Relaxed)
    }

    /// Device bytes the model holds (instruction blocks and internal buffers of every TPB).
    pub fn device_bytes(&self) -> u64 {
        self.tpbs
            .iter()
            .map(|t| t.blocks.size + t.buffers.iter().map(|b| b.size).sum::<u64>())
            .sum()
    }

    /// [`LoadedModel::device_bytes`] by memory kind ([`MemKind::ALL`] order): instruction
    /// blocks, streams and tables are model code; buffers as [`LoadedTpb::buffer_kinds`] says.
    pub fn device_bytes_by_kind(&self) -> [u64; 5] {
        let mut kinds = [0u64; 5];
        for t in &self.tpbs {
            kinds[MemKind::ModelCode as usize] += t.blocks.size;
            for (i, b) in t.buffers.iter().enumerate() {
                let k = t
                    .buffer_kinds
                    .get(i)
                    .copied()
                    .unwrap_or(MemKind::ModelSharedScratchpad);
                kinds[k as usize] += b.size;
            }
        }
        kinds
    }

    /// The model's datastore slot (`None` when it has none).
    pub fn datastore_slot(&self) -> Option<ModelSlot> {
        self.datastore_slot.get().copied().flatten()
    }

    /// Records the model's datastore slot (once, right after load).
    pub(crate) fn set_datastore_slot(&self, slot: Option<ModelSlot>) {
        let _ = self.datastore_slot.set(slot);
    }

    /// Whether this is a NEFF model.
    pub fn is_neff(&self) -> bool {
        self.tpbs.first().is_some_and(|t| t.neff.is_some())
    }

    fn free(&self) {
        for tpb in &self.tpbs {
            if let Some(n) = &tpb.neff {
                n.release(tpb.nc);
            }
            let _ = self.device.mem_free(tpb.blocks.handle);
            for b in &tpb.buffers {
                let _ = self.device.mem_free(b.handle);
            }
        }
    }
}

/// A pooled resource tracker: an execution's encoded I/O descriptors and the storage of its
/// bound tensors' holds (see [`TdrvComputeResources`]).
pub(crate) type Tracker = (TdrvComputeResources, Vec<BoundTensor>);

/// Holds a model's in-flight count for one execution (and the model: the only reference
/// the execution's resources hold to it).
///
/// # Invariants
/// `model` is `Some` until the count is given back, by [`InflightGuard::end`] or the drop.
#[derive(Debug)]
pub struct InflightGuard {
    model: Option<Arc<LoadedModel>>,
}

impl InflightGuard {
    /// The model.
    pub fn model(&self) -> Option<&Arc<LoadedModel>> {
        self.model.as_ref()
    }

    /// Ends the execution and gives `tracker` back to the model's pool, under one lock.
    pub(crate) fn end(mut self, tracker: Tracker) {
        if let Some(model) = self.model.take() {
            model.end_execution(Some(tracker));
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Some(model) = self.model.take() {
            model.end_execution(None);
        }
    }
}

/// A model's executions in flight and the threads waiting for them to end (under one lock).
#[derive(Debug, Default)]
struct Inflight {
    executions: u32,
    waiters: u32,
    /// Set by `unload` before it waits: no execution begins after it.
    unloading: bool,
    /// The resource tracker pool: one taken with each execution's count, given back with it.
    trackers: Vec<Tracker>,
}

/// What loading needs of the runtime.
#[derive(Clone, Copy, Debug)]
pub struct LoadContext<'a> {
    /// The device.
    pub device: &'a Arc<dyn Device>,
    /// The claimed NCs' exec queues.
    pub hw_queues: &'a FastHashMap<u32, Arc<HwExecQueue>>,
    /// The ISA the device runs.
    pub target: Target,
    /// Executions that may be in flight per logical core (the XU depth).
    pub max_inflight: u32,
    /// The runtime loading it (bind accepts only that runtime's tensors).
    pub runtime: RuntimeId,
    /// `NEURON_RT_VALIDATE_HASH`: check a NEFF's header hash.
    pub validate_hash: bool,
    /// `NEURON_RT_EXEC_TIMEOUT` as the load read it: the model's executions time out after it.
    pub exec_timeout: std::time::Duration,
    /// Device bytes the logical core already holds (its memory stats' `bytes_used`): a NEFF is
    /// refused when a subgraph needs more than `hbm_bytes_per_nc` minus this (conservative
    /// with LNC=2: the whole vNC's use is counted against each of its NCs).
    pub hbm_in_use: u64,
}

/// The model database: handle id → loaded model.
#[derive(Debug, Default)]
pub struct ModelDb {
    models: Mutex<FastHashMap<u64, Arc<LoadedModel>>>,
}

/// The last model handle id handed out, in this process: ids are never reused, not even by a
/// runtime started after another closed (`nrt_init` after `nrt_close`), so a stale handle names
/// no model rather than another runtime's.
static LAST_MODEL_ID: AtomicU64 = AtomicU64::new(0);

/// Whether every I/O ring of `model` fits the runtime's rings with `max_inflight` executions
/// in flight: each posts its descriptors once per execution, and the ring of
/// [`IO_RING_DESCS`] holds `max_inflight + 1` executions' worth. `nrt model` checks a model it
/// writes against the default configuration with this, as load does against the runtime's.
///
/// # Errors
/// The ring that does not fit, what it posts and the most it could.
pub fn check_io_rings(model: &Model, max_inflight: u32) -> Result<(), String> {
    for (i, tpb) in model.tpbs.iter().enumerate() {
        for ring in &tpb.io_rings {
            let per_exec = ring.descs.len() as u64 * u64::from(max_inflight + 1);
            if per_exec > u64::from(IO_RING_DESCS) {
                // What fits: descriptors per execution, and bytes in full 64 KiB ones.
                let max_descs = IO_RING_DESCS / (max_inflight + 1);
                let bytes: u64 = ring.descs.iter().map(|d| u64::from(d.len)).sum();
                return Err(format!(
                    "TPB {i} ring ({}, {}) posts {} descriptors ({bytes} bytes) per execution; with {max_inflight} in flight the {IO_RING_DESCS}-descriptor ring takes at most {max_descs} per execution, i.e. at most {} bytes per execution in {MAX_DESC_LEN}-byte descriptors",
                    ring.engine,
                    ring.queue,
                    ring.descs.len(),
                    u64::from(max_descs) * u64::from(MAX_DESC_LEN),
                ));
            }
        }
    }
    Ok(())
}

fn load_failure(status: NrtStatus, model: &str, what: impl std::fmt::Display) -> NrtError {
    NrtError::new(status, format!("loading model {model:?}: {what}"))
}

/// A NEFF the reader refused: NRT_UNSUPPORTED_NEFF_VERSION for a version it does not read,
/// NRT_INVALID otherwise, with the reader's message and the file's header name.
fn neff_refused(bytes: &[u8], e: &neff::NeffError) -> NrtError {
    let name = bytes
        .get(0xDC..0xDC + 256)
        .map(|raw| {
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            String::from_utf8_lossy(&raw[..end]).into_owned()
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "model".into());
    NrtError::new(neff_error_status(e), format!("loading NEFF {name:?}: {e}"))
}

fn neff_error_status(e: &neff::NeffError) -> NrtStatus {
    match e {
        neff::NeffError::UnsupportedVersion { .. } => NrtStatus::UnsupportedNeffVersion,
        _ => NrtStatus::Invalid,
    }
}

/// Whether `bytes` start like a NEFF header (`pkg_version` 1 or 2, `header_size` 1024): a NEFF
/// the reader refuses is then named as one (by the header's name), otherwise the refusal says
/// the bytes are no model at all.
fn is_neff_header(bytes: &[u8]) -> bool {
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    matches!(u64_at(0), Some(1 | 2)) && u64_at(8) == Some(neff::NEFF_HEADER_SIZE as u64)
}

impl ModelDb {
    /// `db_get_nn_ref_count`: the model of handle `id`, if loaded.
    pub fn get(&self, id: u64) -> Option<Arc<LoadedModel>> {
        self.models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// Loaded models.
    pub fn len(&self) -> usize {
        self.models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether no model is loaded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The longest execution timeout of the loaded models (each read `NEURON_RT_EXEC_TIMEOUT`
    /// at its load); `None` when none is loaded.
    pub fn longest_exec_timeout(&self) -> Option<std::time::Duration> {
        self.models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|m| m.exec_timeout)
            .max()
    }

    /// Decodes `bytes` — a NEFF (recognised by its header, parsed and placed by
    /// [`ModelDb::load_neff`]) or a model container (one for another target is refused) —,
    /// places the model on `vnc` whose physical NCs are `ncs`, and loads every TPB's blocks,
    /// buffers and I/O rings.
    ///
    /// # Errors
    /// NRT_INVALID (bad container or NEFF, wrong target, a NEFF's LNC not the vNC's),
    /// NRT_UNSUPPORTED_NEFF_VERSION, NRT_LOAD_NOT_ENOUGH_NC (sg_count does not match the vNC),
    /// NRT_RESOURCE (device memory, rings too small for the XU depth).
    pub fn load(
        &self,
        ctx: &LoadContext<'_>,
        bytes: &[u8],
        vnc: u32,
        ncs: &[u32],
    ) -> Result<Arc<LoadedModel>, NrtError> {
        // Anything but a model container (its magic) is read as a NEFF, whose reader names the
        // header field or payload member that is wrong.
        if !bytes.starts_with(&shared::model::MODEL_MAGIC) {
            let neff = neff::Neff::parse(
                bytes,
                &neff::ParseOptions {
                    validate_hash: ctx.validate_hash,
                },
            )
            .map_err(|e| {
                if is_neff_header(bytes) {
                    neff_refused(bytes, &e)
                } else {
                    NrtError::new(
                        neff_error_status(&e),
                        format!(
                            "the model is neither a model container (no \"NRTMODEL\" magic) nor a NEFF: {e}"
                        ),
                    )
                }
            })?;
            return self.load_neff(ctx, &neff, vnc, ncs);
        }
        let LoadContext {
            device,
            hw_queues,
            target,
            max_inflight,
            ..
        } = *ctx;
        let model = Model::from_container(bytes, target)
            .map_err(|e| NrtError::new(NrtStatus::Invalid, e.to_string()))?;
        if model.sg_count as usize != ncs.len() {
            return Err(load_failure(
                NrtStatus::LoadNotEnoughNc,
                &model.name,
                format!(
                    "it was compiled for LNC={} (one subgraph per physical NC of a logical \
                     core) and logical core {vnc} is LNC={} (NEURON_LOGICAL_NC_CONFIG={} loads \
                     it where the device has that size)",
                    model.sg_count,
                    ncs.len(),
                    model.sg_count
                ),
            ));
        }
        check_io_rings(&model, max_inflight)
            .map_err(|why| load_failure(NrtStatus::Resource, &model.name, why))?;
        let mut tpbs: Vec<LoadedTpb> = Vec::with_capacity(ncs.len());
        let result = (|| {
            for (tpb, &nc) in model.tpbs.iter().zip(ncs) {
                let hwq = hw_queues.get(&nc).ok_or_else(|| {
                    load_failure(
                        NrtStatus::Failure,
                        &model.name,
                        format!("NC {nc} is not claimed"),
                    )
                })?;
                for ring in &tpb.io_rings {
                    hwq.ensure_io_queue(nc, ring.engine, ring.queue)?;
                }
                let blocks: Vec<Vec<u8>> = tpb
                    .blocks
                    .iter()
                    .map(|b| {
                        if b.is_empty() {
                            isa::end_program()
                        } else {
                            b.clone()
                        }
                    })
                    .collect();
                let mut offsets = [0u64; 5];
                let mut size = 0u64;
                for (o, b) in offsets.iter_mut().zip(&blocks) {
                    *o = size;
                    size += (b.len() as u64).next_multiple_of(BLOCK_ALIGN);
                }
                let chunk = device.mem_alloc(MemLocation::Hbm { nc }, size, 0)?;
                let mut loaded = LoadedTpb {
                    nc,
                    blocks: chunk,
                    engine_addresses: [0; 5],
                    buffers: Vec::new(),
                    buffer_kinds: Vec::new(),
                    neff: None,
                };
                let map = device.mem_map(&chunk);
                let write = || -> Result<(), NrtError> {
                    let map = map?;
                    for ((addr, off), b) in
                        loaded.engine_addresses.iter_mut().zip(offsets).zip(&blocks)
                    {
                        *addr = chunk.pa + off;
                        map.write(*addr, b)
                            .map_err(|e| load_failure(NrtStatus::Failure, &model.name, e))?;
                    }
                    for b in &tpb.buffers {
                        let a = device.mem_alloc(MemLocation::Hbm { nc }, b.size, 0)?;
                        loaded.buffers.push(a);
                        loaded.buffer_kinds.push(if b.init.is_empty() {
                            MemKind::ModelSharedScratchpad
                        } else {
                            MemKind::Constants
                        });
                        if !b.init.is_empty() {
                            let m = device.mem_map(&a)?;
                            m.write(a.pa, &b.init)
                                .map_err(|e| load_failure(NrtStatus::Failure, &model.name, e))?;
                        }
                    }
                    Ok(())
                };
                let r = write();
                tpbs.push(loaded);
                r?;
            }
            Ok(())
        })();
        self.finish(ctx, model, vnc, tpbs, result)
    }

    /// Places a parsed NEFF on `vnc` whose physical NCs are `ncs` (see [`neff_load`]): plans
    /// it, checks the HBM it needs against what each NC has free, then allocates and writes
    /// every subgraph. A failure frees everything allocated.
    ///
    /// # Errors
    /// NRT_INVALID (LNC mismatch, a var, queue set or reservation that does not fit),
    /// NRT_RESOURCE (not enough HBM, before anything is allocated), the device's errors.
    pub fn load_neff(
        &self,
        ctx: &LoadContext<'_>,
        neff: &neff::Neff,
        vnc: u32,
        ncs: &[u32],
    ) -> Result<Arc<LoadedModel>, NrtError> {
        let info = ctx.device.info();
        let shape = neff_load::VncShape {
            vnc,
            ncs,
            dge_copies: ctx.max_inflight.saturating_add(1),
        };
        let plan = neff_load::plan(neff, info, &shape)?;
        plan.check_memory(info.hbm_bytes_per_nc.saturating_sub(ctx.hbm_in_use))?;
        let mut tpbs = Vec::with_capacity(plan.subgraphs.len());
        let mut result = Ok(());
        for sg in &plan.subgraphs {
            let Some(hwq) = ctx.hw_queues.get(&sg.nc) else {
                result = Err(load_failure(
                    NrtStatus::Failure,
                    &plan.name,
                    format!("NC {} is not claimed", sg.nc),
                ));
                break;
            };
            if let Err(e) = neff_load::place_subgraph(ctx.device, &plan.name, sg, hwq, &mut tpbs) {
                result = Err(e);
                break;
            }
        }
        let loaded = self.finish(ctx, plan.meta, vnc, tpbs, result)?;
        // Where simdev cannot know what silicon knows (the instruction encoding), say so.
        let simulated = neff_load::simulated_outputs(ctx.device.as_ref(), neff);
        if let Some(Some(label)) = simulated {
            let _ = loaded.reference.set(label);
        } else if simulated.is_some() {
            tracing::warn!(
                target: neff_load::SHAPE_ONLY_TARGET,
                "NEFF {:?} (uuid {}) runs shape-only on simdev: simdev cannot decode the NEFF \
                 instruction encoding, so its outputs have the right shapes and sizes but are \
                 not the model's numbers. Bind a CPU reference to get them (simdev --reference, or \
                 NEURON_SIMDEV_REFERENCE for a private simdev; README \"Real numbers for a \
                 NEFF\"){}",
                plan.name,
                neff.uuid_hex(),
                neff_load::unused_reference_hint(
                    std::env::var_os(neff_load::REFERENCE_ENV).as_deref()
                )
            );
        }
        Ok(loaded)
    }

    /// Registers a loaded model, or frees what it holds when `result` is an error.
    fn finish(
        &self,
        ctx: &LoadContext<'_>,
        model: Model,
        vnc: u32,
        tpbs: Vec<LoadedTpb>,
        result: Result<(), NrtError>,
    ) -> Result<Arc<LoadedModel>, NrtError> {
        let device = ctx.device;
        let runtime = ctx.runtime;
        let id = LAST_MODEL_ID.fetch_add(1, Ordering::Relaxed) + 1;
        let loaded = Arc::new(LoadedModel {
            id,
            vnc,
            model,
            tpbs,
            inflight: Mutex::new(Inflight::default()),
            idle: Condvar::new(),
            idle_wakes: AtomicU64::new(0),
            map: AddressMap {
                arch: device.info().arch,
                nc_count: device.info().nc_count,
                hbm_bytes_per_nc: device.info().hbm_bytes_per_nc,
            },
            cc_chain: std::sync::OnceLock::new(),
            cc_builds: AtomicU64::new(0),
            device: device.clone(),
            runtime,
            datastore_slot: std::sync::OnceLock::new(),
            reference: std::sync::OnceLock::new(),
            exec_timeout: ctx.exec_timeout,
        });
        if let Err(e) = result {
            loaded.free();
            return Err(e);
        }
        self.models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, loaded.clone());
        Ok(loaded)
    }

    /// `nrt_unload`: forgets handle `id`, waits for its in-flight executions, frees its device
    /// memory.
    ///
    /// # Errors
    /// NRT_INVALID_HANDLE for an unknown (or already unloaded) handle; NRT_INVALID from the
    /// completion callback of the model's logical core while executions of it are in flight
    /// (the thread would wait for itself).
    pub fn unload(&self, id: u64) -> Result<(), NrtError> {
        let mut models = self
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(model) = models.get(&id) else {
            return Err(NrtError::new(
                NrtStatus::InvalidHandle,
                format!("model handle {id} is not loaded"),
            ));
        };
        let in_flight = model.executions_in_flight();
        if in_flight > 0 && crate::async_pool::exec_callback_vnc() == Some(model.vnc()) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "model {:?}: {in_flight} execution(s) queued on logical core {} are still in flight, and this is that core's completion callback, the thread that completes them: unloading waits for them and would never end (unload after the callback returns)",
                    model.name(),
                    model.vnc()
                ),
            ));
        }
        let model = models.remove(&id).ok_or_else(|| {
            NrtError::new(
                NrtStatus::InvalidHandle,
                format!("model handle {id} is not loaded"),
            )
        })?;
        drop(models);
        model.wait_idle();
        model.free();
        Ok(())
    }

    /// Unloads everything (runtime close).
    pub fn unload_all(&self) {
        let ids: Vec<u64> = self
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .copied()
            .collect();
        for id in ids {
            let _ = self.unload(id);
        }
    }
}

#[cfg(test)]
mod in_process_tests;
#[cfg(test)]
mod neff_tests;
