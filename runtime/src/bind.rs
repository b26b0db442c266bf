//! Bind: validate the I/O tensor sets and build, outside the submit lock, this execution's
//! I/O descriptors into the model's pooled resource tracker (seed 000 §2: `kmgr_exec_pre` →
//! `dlr_check_valid_io_sets`, `kbl_compute_build_compute_resources`, and per TPB
//! `ddrs_build_dma_rings` / `ioqs_build_swap_data`).
//!
//! For every I/O ring of every TPB, bind resolves each descriptor's operands to device PAs
//! (tensor PAs now; buffer and SBUF PAs were fixed at load) and encodes the TX/RX UDMA
//! descriptors of each copy piece ([`crate::dma::build_copy`]) into the tracker — libnrt's
//! `ioq_switch_tx_descs` / `ioq_switch_rx_descs` / `ioq_switch_num_descs` of
//! `tdrv_compute_ioqs_resource_t`. Nothing is written to a ring here, so nothing depends on
//! the ring position and a request refused later (NRT_QUEUE_FULL) leaves no gap: the stage,
//! under the main TPB's `compute_req_lock`, only appends these ready descriptors, patching
//! each one's ring id for the slot it lands in ([`crate::dma::DmaQueue::append_prebuilt`]),
//! then patches the request's instruction-block addresses and appends the trigger pairs.
//! [`RingIo`]'s descriptors can only be filled here.
//!
//! The tracker is taken from the model's pool and returned on drop, and refilled in place:
//! after the first executions of a model, bind allocates nothing.
//!
//! Status choices (the seed names the checks, not every code): a missing, unknown or wrongly
//! sized tensor is NRT_INVALID (nrt-api.md: "tensor name/size mismatch with the model"); a
//! tensor that is not in device memory of the model's vNC is NRT_EXEC_BAD_INPUT; a device
//! tensor allocated by another runtime instance (another connection, whose memory the model's NCs
//! cannot reach: the device would refuse the DMA mid-execution) is NRT_INVALID. Every message
//! names the tensor.

use std::sync::Arc;

use shared::NrtStatus;
use shared::model::{IoRing, Operand};

use shared::neff_program::DgeEntry;

use crate::dma::{PrebuiltPair, build_copy, rebuild_copy};
use crate::error::NrtError;
use crate::kmgr::{InflightGuard, LoadedModel};
use crate::tensor::{BoundTensor, Placement, Tensor, TensorSet};

/// `kmgr_exec_mode_t`: the value the fork passes to bind — **inverted** from what one would
/// guess (seed 000 §1 QUIRK): the asynchronous mode is 0, the synchronous mode is 1.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecMode {
    /// `KMGR_EXEC_MODE_ASYNC` = 0 (the implicit-async pool).
    Async = 0,
    /// 1: the synchronous path (the default).
    Sync = 1,
}

impl ExecMode {
    /// The fork's computation: `mode = (async_exec_workers == NULL)`.
    pub const fn from_async_workers_present(present: bool) -> Self {
        if present { Self::Async } else { Self::Sync }
    }
}

/// One I/O ring's descriptors for one execution, encoded by bind with every PA resolved
/// (`ioq_switch_tx_descs`, `ioq_switch_rx_descs`, `ioq_switch_num_descs` of one queue). Its
/// fields are private to bind: the stage can read and append them, not build them.
///
/// A pooled `RingIo` keeps its descriptors between executions of its model, with its patch
/// plan: the copies that name a tensor, the only ones whose PAs change from one execution to
/// the next. The others (buffers and SBUF, whose PAs were fixed at load) stay as encoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingIo {
    engine: u32,
    queue: u32,
    descs: Vec<PrebuiltPair>,
    patches: Vec<Patch>,
}

/// One end of a planned copy: a PA fixed at load, or an offset into a bound tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlannedPa {
    /// A buffer or SBUF PA.
    Fixed(u64),
    /// Byte `offset` of the model tensor at `spec` (inputs first, then outputs).
    Tensor { spec: usize, offset: u64 },
}

/// A copy of a ring that names a tensor: re-encoded each execution into `descs[first..]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Patch {
    first: usize,
    src: PlannedPa,
    dst: PlannedPa,
    len: u64,
}

impl RingIo {
    /// DMA engine of the ring.
    pub const fn engine(&self) -> u32 {
        self.engine
    }

    /// Queue of the ring.
    pub const fn queue(&self) -> u32 {
        self.queue
    }

    /// The encoded descriptor pairs, in ring order (ring ids not yet patched).
    pub fn descs(&self) -> &[PrebuiltPair] {
        &self.descs
    }
}

#[cfg(test)]
impl RingIo {
    /// A ring's descriptors as bind would hold them (for the stage's tests).
    pub(crate) fn for_tests(engine: u32, queue: u32, descs: Vec<PrebuiltPair>) -> Self {
        Self {
            engine,
            queue,
            descs,
            patches: Vec::new(),
        }
    }
}

/// One TPB's bound I/O rings.
pub type TpbIo = Vec<RingIo>;

/// `tdrv_compute_resources_t` (0x20 in libnrt): the per-TPB I/O-queue resources of one
/// execution (`tdrv_compute_ioqs_resource_t` per TPB).
///
/// A tracker is pooled by its model ([`LoadedModel::begin_execution`]): the first execution that
/// takes it encodes every descriptor and records the patch plan ([`RingIo`]); later ones only
/// re-encode the copies that name a tensor, with this execution's tensor PAs — and none when
/// those PAs are the ones the tracker's descriptors are already encoded for.
#[derive(Debug, Default)]
pub struct TdrvComputeResources {
    /// Per TPB, the encoded I/O descriptors, ready to append.
    pub ioqs: Vec<TpbIo>,
    /// Per TPB of a NEFF model, this execution's DGE table entries (tensor PAs), in table
    /// order, ready for the stage to write into the copy of its `compute_idx` (empty for a
    /// container).
    pub dge: Vec<Vec<DgeEntry>>,
    /// `ioqs` holds every descriptor of the model's rings and their patch plans.
    planned: bool,
    /// This execution's device PA of each model tensor (inputs, then outputs); `None` for one
    /// without a device address.
    tensor_pas: Vec<Option<u64>>,
    /// The `tensor_pas` that every descriptor in `ioqs` is encoded for; empty while they are
    /// not all encoded for one set (before the plan, while re-encoding, after a failure). A
    /// descriptor depends only on its copy's PAs and length, so binding tensors at the PAs of
    /// the last bind of this tracker — the same tensor sets executed again — re-encodes
    /// nothing.
    encoded_for: Vec<Option<u64>>,
}

/// `kmgr_exec_resources_t` (0x38 in libnrt): what bind hands to the stage.
#[derive(Debug)]
pub struct ExecResources {
    /// The exec mode bind was called with.
    pub exec_mode: ExecMode,
    /// The per-TPB I/O resources.
    pub tdrv: TdrvComputeResources,
    /// The bound tensors, kept alive until the execution completes: the inputs, then the
    /// outputs from [`ExecResources::outputs`]' index.
    pub(crate) bound: Vec<BoundTensor>,
    /// Where the outputs start in `bound`.
    outputs_at: usize,
    /// The execution's in-flight count on the model whose tracker pool `tdrv` and `bound`
    /// came from (both returned there, with the count, on drop).
    inflight: Option<InflightGuard>,
}

impl ExecResources {
    /// The model the resources were bound for.
    pub(crate) fn model(&self) -> Option<&Arc<LoadedModel>> {
        self.inflight.as_ref().and_then(InflightGuard::model)
    }

    /// The bound output tensors.
    pub(crate) fn outputs(&self) -> &[BoundTensor] {
        self.bound.get(self.outputs_at..).unwrap_or_default()
    }
}

impl Drop for ExecResources {
    fn drop(&mut self) {
        // kmgr_exec_resources_free: release the tensors, hand the tracker back to the model.
        if self.exec_mode == ExecMode::Async {
            for t in &self.bound {
                t.end_use();
            }
        }
        self.bound.clear();
        if let Some(inflight) = self.inflight.take() {
            inflight.end((
                std::mem::take(&mut self.tdrv),
                std::mem::take(&mut self.bound),
            ));
        }
    }
}

/// Checks `set` against `specs` (see [`check_valid_io_sets`]), pushing each spec's tensor PA
/// onto `pas` in spec order.
fn check_set(
    model: &LoadedModel,
    set: &TensorSet,
    specs: &[shared::model::TensorSpec],
    kind: &str,
    pas: &mut Vec<Option<u64>>,
) -> Result<(), NrtError> {
    for spec in specs {
        let t = set.get(&spec.name).map_err(|_| {
            // A misspelt name is the usual cause: say what the set holds instead.
            let strays: Vec<&str> = set
                .iter()
                .map(|(name, _)| name)
                .filter(|name| !specs.iter().any(|s| s.name == *name))
                .collect();
            let strays = if strays.is_empty() {
                String::new()
            } else {
                format!("; the set holds {strays:?}, which the model has no {kind} of")
            };
            NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "{kind} tensor {:?} of model {:?} is not bound{strays}",
                    spec.name,
                    model.name()
                ),
            )
        })?;
        if t.size() != spec.size {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "{kind} tensor {:?} is {} bytes, model {:?} expects {}",
                    spec.name,
                    t.size(),
                    model.name(),
                    spec.size
                ),
            ));
        }
        check_same_runtime(model, t, &spec.name, kind)?;
        match t.placement() {
            Placement::Device { vnc } if vnc == model.vnc() => {}
            Placement::Device { vnc } => {
                return Err(NrtError::new(
                    NrtStatus::ExecBadInput,
                    format!(
                        "{kind} tensor {:?} is on logical core {vnc}, model {:?} runs on {}",
                        spec.name,
                        model.name(),
                        model.vnc()
                    ),
                ));
            }
            Placement::Host => {
                return Err(NrtError::new(
                    NrtStatus::ExecBadInput,
                    format!("{kind} tensor {:?} is in host memory", spec.name),
                ));
            }
        }
        pas.push(t.device_pa());
    }
    // Every spec's name is in the set and a loaded model's names are distinct (its validation
    // refuses one used twice), so a set of exactly as many tensors holds no other name.
    if set.len() == specs.len() {
        return Ok(());
    }
    for (name, _) in set.iter() {
        if !specs.iter().any(|s| s.name == name) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "tensor {name:?} is not an {kind} of model {:?}",
                    model.name()
                ),
            ));
        }
    }
    Ok(())
}

/// A device tensor must come from the runtime that loaded the model: its logical core numbers
/// and its memory are that runtime's (checked before the placement, whose `vnc` means nothing in
/// another runtime).
fn check_same_runtime(
    model: &LoadedModel,
    t: &Tensor,
    name: &str,
    kind: &str,
) -> Result<(), NrtError> {
    match t.runtime() {
        Some(owner) if owner != model.runtime() => Err(NrtError::new(
            NrtStatus::Invalid,
            format!(
                "{kind} tensor {name:?} belongs to another runtime ({owner}; model {:?} was \
                 loaded by {}): allocate the tensor with the runtime that loaded the model",
                model.name(),
                model.runtime()
            ),
        )),
        _ => Ok(()),
    }
}

/// `dlr_check_valid_io_sets`: tensor IO (every model input and output bound, names known,
/// byte sizes equal), ownership (device tensors of the runtime that loaded the model) and
/// placement (all in device memory of the model's vNC).
///
/// # Errors
/// NRT_INVALID or NRT_EXEC_BAD_INPUT naming the tensor.
pub fn check_valid_io_sets(
    model: &LoadedModel,
    inputs: &TensorSet,
    outputs: &TensorSet,
) -> Result<(), NrtError> {
    io_set_pas(model, inputs, outputs, &mut Vec::new())
}

/// [`check_valid_io_sets`], replacing `pas` with each I/O tensor's device PA (the model's
/// inputs, then its outputs): one lookup per tensor for both.
fn io_set_pas(
    model: &LoadedModel,
    inputs: &TensorSet,
    outputs: &TensorSet,
    pas: &mut Vec<Option<u64>>,
) -> Result<(), NrtError> {
    pas.clear();
    check_set(model, inputs, &model.model().inputs, "input", pas)?;
    check_set(model, outputs, &model.model().outputs, "output", pas)
}

/// Where operand `op` of TPB `tpb` lands: a buffer or SBUF PA (fixed at load), or a model
/// tensor (by its index, inputs first) plus an offset.
fn planned_pa(model: &LoadedModel, op: &Operand, tpb: usize) -> Result<PlannedPa, NrtError> {
    match op {
        Operand::Tensor { name, offset } => {
            let specs = model.model();
            let spec = (specs.inputs.iter().chain(&specs.outputs))
                .position(|s| s.name == *name)
                .ok_or_else(|| {
                    NrtError::new(NrtStatus::Invalid, format!("tensor {name:?} is not bound"))
                })?;
            Ok(PlannedPa::Tensor {
                spec,
                offset: *offset,
            })
        }
        Operand::Buffer { index, offset } => model
            .buffer_pa(tpb, *index)
            .map(|pa| PlannedPa::Fixed(pa + offset))
            .ok_or_else(|| {
                NrtError::new(
                    NrtStatus::Invalid,
                    format!("model {:?}: buffer {index} of TPB {tpb}", model.name()),
                )
            }),
        Operand::Sbuf { partition, offset } => model
            .sbuf_pa(tpb, *partition, *offset)
            .map(PlannedPa::Fixed)
            .ok_or_else(|| {
                NrtError::new(
                    NrtStatus::Invalid,
                    format!("model {:?}: SBUF operand of TPB {tpb}", model.name()),
                )
            }),
    }
}

/// The PA of `at` in this execution (`tensor_pas` as [`TdrvComputeResources`] holds them).
/// NRT_INVALID naming the model, the TPB and the I/O ring whose descriptors could not be built.
fn ring_error(
    model: &LoadedModel,
    tpb: usize,
    ring: &IoRing,
    e: impl std::fmt::Display,
) -> NrtError {
    NrtError::new(
        NrtStatus::Invalid,
        format!(
            "model {:?}: TPB {tpb} I/O ring ({}, {}): {e}",
            model.name(),
            ring.engine,
            ring.queue
        ),
    )
}

fn pa_now(model: &LoadedModel, tensor_pas: &[Option<u64>], at: PlannedPa) -> Result<u64, NrtError> {
    match at {
        PlannedPa::Fixed(pa) => Ok(pa),
        PlannedPa::Tensor { spec, offset } => {
            let specs = model.model();
            let name = (specs.inputs.iter().chain(&specs.outputs))
                .nth(spec)
                .map_or("?", |s| s.name.as_str());
            let base = tensor_pas.get(spec).copied().flatten().ok_or_else(|| {
                NrtError::new(
                    NrtStatus::ExecBadInput,
                    format!("tensor {name:?} has no device address"),
                )
            })?;
            Ok(base + offset)
        }
    }
}

/// Encodes every I/O descriptor of the model into `tdrv` (the descriptors of copies that name a
/// tensor with this execution's PAs, `tdrv.tensor_pas`) and records which copies name a tensor:
/// the first execution of a pooled tracker.
fn plan(model: &LoadedModel, tdrv: &mut TdrvComputeResources) -> Result<(), NrtError> {
    let tpbs = &model.model().tpbs;
    tdrv.ioqs.truncate(tpbs.len());
    tdrv.ioqs.resize_with(tpbs.len(), Vec::new);
    for (i, (tpb, rings)) in tpbs.iter().zip(tdrv.ioqs.iter_mut()).enumerate() {
        rings.truncate(tpb.io_rings.len());
        rings.resize_with(tpb.io_rings.len(), RingIo::default);
        for (ring, out) in tpb.io_rings.iter().zip(rings.iter_mut()) {
            out.engine = ring.engine;
            out.queue = ring.queue;
            out.descs.clear();
            out.patches.clear();
            for d in &ring.descs {
                let (src, dst) = (planned_pa(model, &d.src, i)?, planned_pa(model, &d.dst, i)?);
                let first = out.descs.len();
                build_copy(
                    pa_now(model, &tdrv.tensor_pas, src)?,
                    pa_now(model, &tdrv.tensor_pas, dst)?,
                    u64::from(d.len),
                    &mut out.descs,
                )
                .map_err(|e| ring_error(model, i, ring, e))?;
                if matches!(src, PlannedPa::Tensor { .. })
                    || matches!(dst, PlannedPa::Tensor { .. })
                {
                    out.patches.push(Patch {
                        first,
                        src,
                        dst,
                        len: u64::from(d.len),
                    });
                }
            }
        }
    }
    Ok(())
}

/// `kmgr_exec_pre`: validates, then builds the resource tracker: every I/O ring descriptor's
/// tensor operands resolved to device PAs (buffer operands were resolved at load) and encoded
/// as TX/RX UDMA descriptors, ready for the stage to append.
///
/// # Errors
/// As [`check_valid_io_sets`]; NRT_INVALID for a descriptor that cannot be encoded.
pub fn build_compute_resources(
    model: &Arc<LoadedModel>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    exec_mode: ExecMode,
) -> Result<ExecResources, NrtError> {
    // Counted in flight on the model, with a pooled tracker of it (same shape every time, so
    // refilling it allocates nothing), under one lock; a failure below drops `resources`,
    // which gives back both.
    let (inflight, (tdrv, bound)) = model.begin_execution()?;
    let mut resources = ExecResources {
        exec_mode,
        tdrv,
        bound,
        outputs_at: inputs.len(),
        inflight: Some(inflight),
    };
    let ExecResources { tdrv, bound, .. } = &mut resources;
    // Each tensor's PA once (one lookup per tensor, not one per descriptor), as it is checked.
    io_set_pas(model, inputs, outputs, &mut tdrv.tensor_pas)?;
    let specs = model.model();
    if !tdrv.planned {
        tdrv.encoded_for.clear();
        plan(model, tdrv)?;
        tdrv.planned = true;
        tdrv.encoded_for.extend_from_slice(&tdrv.tensor_pas);
    }
    let TdrvComputeResources {
        ioqs,
        tensor_pas,
        encoded_for,
        ..
    } = tdrv;
    if encoded_for != tensor_pas || encoded_for.is_empty() {
        // Encoded for no set until every patch below is re-encoded.
        encoded_for.clear();
        for (i, (tpb, rings)) in specs.tpbs.iter().zip(ioqs.iter_mut()).enumerate() {
            for (ring, out) in tpb.io_rings.iter().zip(rings.iter_mut()) {
                let RingIo { descs, patches, .. } = out;
                for patch in patches.iter() {
                    let pa = |at: PlannedPa| pa_now(model, tensor_pas, at);
                    let pieces = u64::from(shared::udma::MAX_DESC_LEN);
                    let end =
                        patch.first + usize::try_from(patch.len.div_ceil(pieces)).unwrap_or(0);
                    let pairs = descs.get_mut(patch.first..end).unwrap_or_default();
                    rebuild_copy(pa(patch.src)?, pa(patch.dst)?, patch.len, pairs)
                        .map_err(|e| ring_error(model, i, ring, e))?;
                }
            }
        }
        encoded_for.extend_from_slice(tensor_pas);
    }
    // A NEFF's DGE entries: the PA of each listed var's bound tensor (the NEFF counterpart of
    // writing tensor PAs into I/O rings).
    let tpbs = model.tpbs();
    tdrv.dge.truncate(tpbs.len());
    tdrv.dge.resize_with(tpbs.len(), Vec::new);
    for (tpb, entries) in tpbs.iter().zip(tdrv.dge.iter_mut()) {
        entries.clear();
        let Some(neff) = &tpb.neff else { continue };
        for slot in &neff.dge {
            let t = inputs
                .find(&slot.tensor)
                .or_else(|| outputs.find(&slot.tensor))
                .ok_or_else(|| {
                    NrtError::new(
                        NrtStatus::Invalid,
                        format!("tensor {:?} is not bound", slot.tensor),
                    )
                })?;
            let pa = t.device_pa().ok_or_else(|| {
                NrtError::new(
                    NrtStatus::ExecBadInput,
                    format!("tensor {:?} has no device address", slot.tensor),
                )
            })?;
            entries.push(DgeEntry {
                pa,
                size: slot.size,
                var_id: slot.var_id,
                kind: slot.kind,
                reserved: 0,
            });
        }
    }
    bound.clear();
    bound.extend(inputs.iter().map(|(_, t)| BoundTensor::input(t)));
    bound.extend(outputs.iter().map(|(_, t)| BoundTensor::output(t)));
    if exec_mode == ExecMode::Async {
        // The implicit-async pool returns before the execution ends: tensor reads and writes
        // wait for it (nrt-api.md §2.7).
        for t in bound.iter() {
            t.begin_use();
        }
    }
    Ok(resources)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::builder::MlpBuilder;
    use crate::dma::{pairs_built_on_this_thread, pairs_rebuilt_on_this_thread};
    use crate::test_support::{Rig, load};
    use crate::{Placement, Runtime};

    fn tensors(rt: &Runtime, rows: u64) -> (TensorSet, TensorSet) {
        let on = Placement::Device { vnc: 0 };
        let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
        ins.add("input", &rt.tensor_allocate(on, rows * 3 * 4, "i").unwrap());
        outs.add(
            "output",
            &rt.tensor_allocate(on, rows * 2 * 4, "o").unwrap(),
        );
        (ins, outs)
    }

    fn descs(r: &ExecResources) -> Vec<Vec<PrebuiltPair>> {
        r.tdrv.ioqs[0]
            .iter()
            .map(|ring| ring.descs().to_vec())
            .collect()
    }

    #[test]
    fn a_pooled_tracker_re_encodes_only_the_copies_that_name_a_tensor() {
        let rig = Rig::new();
        let rt = rig.sync_runtime();
        // 300 rows: 3 constants descriptors (buffer → SBUF, fixed at load) and 100 row blocks
        // in and 100 out (tensors).
        let mlp = MlpBuilder::new("t", 3).dense(vec![1.0; 6], vec![0.5, -0.5]);
        let m = rt.model(load(&rt, &mlp.build(300).unwrap(), 0)).unwrap();
        let (ins, outs) = tensors(&rt, 300);
        let first = build_compute_resources(&m, &ins, &outs, ExecMode::Sync).unwrap();
        drop(first);
        // Other tensors, through the pooled tracker.
        let (ins2, outs2) = tensors(&rt, 300);
        let (built, rebuilt) = (pairs_built_on_this_thread(), pairs_rebuilt_on_this_thread());
        let pooled = build_compute_resources(&m, &ins2, &outs2, ExecMode::Sync).unwrap();
        assert_eq!(
            (
                pairs_built_on_this_thread() - built,
                pairs_rebuilt_on_this_thread() - rebuilt
            ),
            (0, 200),
            "the pooled tracker re-encodes the 200 tensor copies and nothing else"
        );
        // The same tensors again (an execution loop): the tracker's descriptors are already
        // encoded for their PAs, and nothing is re-encoded.
        drop(pooled);
        let again = build_compute_resources(&m, &ins2, &outs2, ExecMode::Sync).unwrap();
        assert_eq!(pairs_rebuilt_on_this_thread() - rebuilt, 200);
        assert_eq!(pairs_built_on_this_thread() - built, 0);
        // Back to the first input with the second output: re-encoded for the new PA.
        drop(again);
        let mixed = build_compute_resources(&m, &ins, &outs2, ExecMode::Sync).unwrap();
        assert_eq!(pairs_rebuilt_on_this_thread() - rebuilt, 400);
        let pa = |set: &TensorSet, name| set.find(name).unwrap().device_pa().unwrap();
        assert_eq!(descs(&mixed)[1][0].tx().buf_ptr(), pa(&ins, "input"));
        drop(mixed);
        let pooled = build_compute_resources(&m, &ins2, &outs2, ExecMode::Sync).unwrap();
        assert_eq!(pairs_rebuilt_on_this_thread() - rebuilt, 600);
        // The pool is empty now: a new tracker encodes everything from scratch.
        let fresh = build_compute_resources(&m, &ins2, &outs2, ExecMode::Sync).unwrap();
        assert_eq!(pairs_built_on_this_thread() - built, 203);
        assert_eq!(
            descs(&pooled),
            descs(&fresh),
            "the same descriptors either way"
        );
        assert_eq!(descs(&pooled)[1][0].tx().buf_ptr(), pa(&ins2, "input"));
        assert_eq!(
            descs(&pooled)[2][99].rx().buf_ptr(),
            pa(&outs2, "output") + 99 * 3 * 2 * 4
        );
        // Validation still runs on every bind: a wrongly sized tensor is NRT_INVALID.
        drop((pooled, fresh));
        let (ins3, _) = tensors(&rt, 299);
        let err = build_compute_resources(&m, &ins3, &outs2, ExecMode::Sync).unwrap_err();
        assert_eq!(err.status, NrtStatus::Invalid);
    }

    #[test]
    fn a_set_with_a_name_the_model_lacks_is_refused_and_the_tracker_goes_back_to_the_pool() {
        let rig = Rig::new();
        let rt = rig.sync_runtime();
        let mlp = MlpBuilder::new("t", 3).dense(vec![1.0; 6], vec![0.5, -0.5]);
        let m = rt.model(load(&rt, &mlp.build(4).unwrap(), 0)).unwrap();
        let (mut ins, outs) = tensors(&rt, 4);
        drop(build_compute_resources(&m, &ins, &outs, ExecMode::Sync).unwrap());
        let built = pairs_built_on_this_thread();
        // Every input bound, plus one the model does not have: a stray, named.
        let on = Placement::Device { vnc: 0 };
        ins.add("inptu", &rt.tensor_allocate(on, 12, "stray").unwrap());
        let err = build_compute_resources(&m, &ins, &outs, ExecMode::Sync).unwrap_err();
        assert_eq!(err.status, NrtStatus::Invalid);
        assert!(
            err.message.contains("\"inptu\" is not an input"),
            "{}",
            err.message
        );
        // As many tensors as the model's outputs, one of them misnamed: the missing one is
        // named, with the stray.
        let (ins3, _) = tensors(&rt, 4);
        let mut renamed = TensorSet::new();
        renamed.add("outptu", outs.find("output").unwrap());
        let err = build_compute_resources(&m, &ins3, &renamed, ExecMode::Sync).unwrap_err();
        assert!(
            err.message.contains("\"output\"") && err.message.contains("outptu"),
            "{}",
            err.message
        );
        // The refused binds gave the pooled tracker back: a good bind builds nothing new.
        let ok = build_compute_resources(&m, &ins3, &outs, ExecMode::Sync).unwrap();
        assert_eq!(
            pairs_built_on_this_thread(),
            built,
            "the tracker was pooled"
        );
        drop(ok);
    }

    #[test]
    fn exec_mode_is_inverted_sync_one_async_zero() {
        // A naive `mode = async_workers_present as u32` would give sync 0.
        assert_eq!(ExecMode::from_async_workers_present(false) as u32, 1);
        assert_eq!(ExecMode::from_async_workers_present(true) as u32, 0);
    }
}
