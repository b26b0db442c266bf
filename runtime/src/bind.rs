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
use shared::model::Operand;

use shared::neff_program::DgeEntry;

use crate::dma::{PrebuiltPair, build_copy};
use crate::error::NrtError;
use crate::kmgr::LoadedModel;
use crate::tensor::{Placement, Tensor, TensorSet};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingIo {
    engine: u32,
    queue: u32,
    descs: Vec<PrebuiltPair>,
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
        }
    }
}

/// One TPB's bound I/O rings.
pub type TpbIo = Vec<RingIo>;

/// `tdrv_compute_resources_t` (0x20 in libnrt): the per-TPB I/O-queue resources of one
/// execution (`tdrv_compute_ioqs_resource_t` per TPB).
#[derive(Debug, Default)]
pub struct TdrvComputeResources {
    /// Per TPB, the encoded I/O descriptors, ready to append.
    pub ioqs: Vec<TpbIo>,
    /// Per TPB of a NEFF model, this execution's DGE table entries (tensor PAs), in table
    /// order, ready for the stage to write into the copy of its `compute_idx` (empty for a
    /// container).
    pub dge: Vec<Vec<DgeEntry>>,
}

/// `kmgr_exec_resources_t` (0x38 in libnrt): what bind hands to the stage.
#[derive(Debug)]
pub struct ExecResources {
    /// The exec mode bind was called with.
    pub exec_mode: ExecMode,
    /// The per-TPB I/O resources.
    pub tdrv: TdrvComputeResources,
    /// The bound tensors, kept alive until the execution completes.
    pub bound: Vec<Tensor>,
    /// The model whose tracker pool this came from (returned there on drop).
    home: Option<Arc<LoadedModel>>,
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
        if let Some(home) = self.home.take() {
            home.return_tracker(
                std::mem::take(&mut self.tdrv),
                std::mem::take(&mut self.bound),
            );
        }
    }
}

fn check_set(
    model: &LoadedModel,
    set: &TensorSet,
    specs: &[shared::model::TensorSpec],
    kind: &str,
) -> Result<(), NrtError> {
    for spec in specs {
        let t = set.get(&spec.name).map_err(|_| {
            NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "{kind} tensor {:?} of model {:?} is not bound",
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
    check_set(model, inputs, &model.model().inputs, "input")?;
    check_set(model, outputs, &model.model().outputs, "output")
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
    check_valid_io_sets(model, inputs, outputs)?;
    let pa_of = |op: &Operand, tpb: usize| -> Result<u64, NrtError> {
        match op {
            Operand::Tensor { name, offset } => {
                let t = inputs
                    .find(name)
                    .or_else(|| outputs.find(name))
                    .ok_or_else(|| {
                        NrtError::new(NrtStatus::Invalid, format!("tensor {name:?} is not bound"))
                    })?;
                let base = t.device_pa().ok_or_else(|| {
                    NrtError::new(
                        NrtStatus::ExecBadInput,
                        format!("tensor {name:?} has no device address"),
                    )
                })?;
                Ok(base + offset)
            }
            Operand::Buffer { index, offset } => model
                .buffer_pa(tpb, *index)
                .map(|pa| pa + offset)
                .ok_or_else(|| {
                    NrtError::new(
                        NrtStatus::Invalid,
                        format!("model {:?}: buffer {index} of TPB {tpb}", model.name()),
                    )
                }),
            Operand::Sbuf { partition, offset } => {
                model.sbuf_pa(tpb, *partition, *offset).ok_or_else(|| {
                    NrtError::new(
                        NrtStatus::Invalid,
                        format!("model {:?}: SBUF operand of TPB {tpb}", model.name()),
                    )
                })
            }
        }
    };
    // A pooled tracker of this model: same shape every time, so refilling it allocates nothing.
    let (mut tdrv, mut bound) = model.take_tracker();
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
            for d in &ring.descs {
                build_copy(
                    pa_of(&d.src, i)?,
                    pa_of(&d.dst, i)?,
                    u64::from(d.len),
                    &mut out.descs,
                )
                .map_err(|e| {
                    NrtError::new(
                        NrtStatus::Invalid,
                        format!(
                            "model {:?}: TPB {i} I/O ring ({}, {}): {e}",
                            model.name(),
                            ring.engine,
                            ring.queue
                        ),
                    )
                })?;
            }
        }
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
    bound.extend(inputs.iter().chain(outputs.iter()).map(|(_, t)| t.clone()));
    if exec_mode == ExecMode::Async {
        // The implicit-async pool returns before the execution ends: tensor reads and writes
        // wait for it (nrt-api.md §2.7).
        for t in &bound {
            t.begin_use();
        }
    }
    Ok(ExecResources {
        exec_mode,
        tdrv,
        bound,
        home: Some(model.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_mode_is_inverted_sync_one_async_zero() {
        // A naive `mode = async_workers_present as u32` would give sync 0.
        assert_eq!(ExecMode::from_async_workers_present(false) as u32, 1);
        assert_eq!(ExecMode::from_async_workers_present(true) as u32, 0);
    }
}
