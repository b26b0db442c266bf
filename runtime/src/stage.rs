//! Stage: appending an execution's ready I/O descriptors to its I/O rings, building the
//! `device_exec_request` and appending the trigger descriptors to each NC's hardware exec queue
//! (seed 000 §3 `hw_exec_queue_add_exec_request_impl`, §4 `kbl_compute_setup`; the device side
//! of the contract is `shared::sequencer`).
//!
//! Stage runs under the main TPB's `compute_req_lock` and does only what depends on the ring
//! and slot positions: bind already resolved every tensor PA and encoded the TX/RX descriptors
//! of each I/O copy outside the lock (`crate::bind`, libnrt's `ioq_switch_tx_descs` /
//! `ioq_switch_rx_descs` / `ioq_switch_num_descs`), so stage appends them as they are,
//! setting each one's ring id for the slot it lands in ([`DmaQueue::append_prebuilt`]); no
//! I/O descriptor is built here. It then writes the request with the instruction-block
//! addresses into the fan-out's slot and appends the trigger pairs. Ring positions are taken
//! only here, under the lock, so a request refused before the stage (NRT_QUEUE_FULL) leaves
//! no gap in any ring.
//!
//! Everything here is allocated once — at runtime init for each claimed NC (request buffer
//! slots, the exec queue's rings, the I/O rings) — and an execution only writes descriptors and
//! 56 bytes (the request and its `cc_dma_increment` trailer) into memory that already exists.

use crate::FastHashMap;
use std::sync::{Arc, Mutex};

use shared::exec_request::{
    CC_DMA_INCREMENT_OFFSET, DEVICE_EXEC_REQUEST_SIZE, DeviceExecRequest, Engine,
};
use shared::memory::SharedChunk;
use shared::neff_program::{DgeEntry, NeffProgramHeader, ProgramEncoding};
use shared::protocol::MemLocation;
use shared::sequencer::{
    EVENT_HW_EXEC_QUEUE_REQUEST_LOAD, EXEC_QUEUE, EXEC_QUEUE_DESCS, EXEC_QUEUE_ENGINE,
};
use shared::udma;
use shared::{AddressMap, NrtStatus, Register};
use zerocopy::IntoBytes;

use crate::backend::{Allocation, Device, DmaQueueId};
use crate::dma::{DmaQueue, PrebuiltPair, build_copy};
use crate::error::NrtError;

/// Bytes of one request-buffer slot: the 52-byte request, the 4-byte `cc_dma_increment`
/// trailer at 0x34 (`M`, the collectives-chain pairs the tail increments post: trigger pair 3
/// takes its source there) and the event-poke source word (1) at 0x38; 64 keeps slots aligned.
pub const REQUEST_SLOT_SIZE: u64 = 64;
/// Offset of the word holding 1, the value trigger pair 2 writes to the request-load event.
pub const EVENT_POKE_WORD: u64 = 0x38;
/// Offset of the `cc_dma_increment` trailer in a slot, the source of trigger pair 3.
pub const CC_DMA_INCREMENT_WORD: u64 = CC_DMA_INCREMENT_OFFSET as u64;
/// Descriptors in each I/O ring the runtime creates per (engine, queue) of an NC.
pub const IO_RING_DESCS: u32 = 16384;

/// A cached collectives model-switch chain: descriptor pairs built once per model and reused on
/// every switch to it (seed 000 §3 GOTCHA).
#[derive(Debug, Clone)]
pub struct CcChain {
    /// (src PA, dst PA, bytes) of each pair; every pair ≤ 64 KiB; the last pokes the
    /// collectives-context-load event.
    pub pairs: Vec<(u64, u64, u64)>,
}

/// What the stage needs of one model on one TPB.
#[derive(Debug)]
pub struct StagedProgram<'a> {
    /// Device address of each engine's instruction block (`_pa + align_offset + offset`).
    pub engine_addresses: [u64; 5],
    /// The model's `exec_req_flags`.
    pub exec_req_flags: &'a [u32; 13],
    /// The model's activation and DVE table hashes.
    pub table_hashes: (&'a [u8; 32], &'a [u8; 32]),
    /// This execution's I/O descriptors, by ring, as bind encoded them.
    pub io: &'a [crate::bind::RingIo],
    /// The collectives chain to append on a model switch (first NC only), if any.
    pub cc_chain: Option<&'a CcChain>,
    /// The program's encoding, set in `reload_seq_config` bits 8..16 on every request
    /// (`shared::neff_program`).
    pub encoding: ProgramEncoding,
    /// A NEFF program's DGE table and this execution's entries, if any.
    pub dge: Option<DgeWrite<'a>>,
}

/// Where a NEFF subgraph's DGE table copies are and what this execution writes into one.
#[derive(Debug)]
pub struct DgeWrite<'a> {
    /// The mapped program chunk holding the copies.
    pub chunk: &'a SharedChunk,
    /// The program header (copy 0's PA, the copy and entry counts).
    pub header: &'a NeffProgramHeader,
    /// This execution's entries (`header.dge_entries` of them).
    pub entries: &'a [DgeEntry],
}

/// What one staged request looked like (for tests and traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedRequest {
    /// The request as written.
    pub request: DeviceExecRequest,
    /// The fan-out's compute index (the slot it used).
    pub compute_idx: u32,
    /// Descriptor pairs appended to the exec queue (4 + chain), as written.
    pub exec_pairs: u32,
}

/// One TPB's hardware exec queue state (`hw_exec_queue_t` without its lock): its exec queue,
/// request buffer, skip-config caches and I/O rings.
#[derive(Debug)]
pub struct HwExecState {
    nc: u32,
    exec_queue: DmaQueue,
    req_buf: SharedChunk,
    req_alloc: Allocation,
    slots: u32,
    last_exec_req_flags: Option<[u32; 13]>,
    last_exec_req_tbl_hashes: Option<([u8; 32], [u8; 32])>,
    io_queues: FastHashMap<(u32, u32), DmaQueue>,
    /// The three trigger pairs of each request slot (request copy, event poke, RX and TX tail
    /// increments: four descriptor pairs), encoded once here: they depend only on the slot and
    /// this NC's fixed DMEM and register addresses. A batch appends its slot's pairs with the
    /// ring ids of their pass.
    trigger_pairs: Vec<[PrebuiltPair; TRIGGER_PAIRS]>,
    /// The NC's dynamic DMA queues of loaded NEFF models, with how many models use each.
    dynamic_queues: FastHashMap<(u32, u32), (DmaQueue, u32)>,
}

/// What the main TPB's `compute_req_lock` guards: the single `compute_idx_tail` of the vNC and
/// the exec queue state of every TPB of the vNC (seed 000 §4 QUIRK: one lock for the fan-out,
/// no per-TPB locking, one monotonic index on the main TPB).
#[derive(Debug)]
pub struct ComputeReq {
    compute_idx_tail: u32,
    tpbs: Vec<HwExecState>,
}

/// The hardware exec queues of one vNC, behind its main TPB's `compute_req_lock`.
///
/// # Invariants
/// The runtime's `compute_idx_tail` is the number of fan-outs staged; every TPB's exec queue
/// received exactly one batch per fan-out, so each NC's sequencer — which counts its own
/// batches — numbers the batch of fan-out `k` with `k` too (`shared::sequencer`).
#[derive(Debug)]
pub struct HwExecQueue {
    /// The main TPB's physical NC (`tpbs[0]`).
    pub nc: u32,
    /// The main TPB's `compute_req_lock`: taken once for the whole fan-out.
    pub compute_req_lock: Mutex<ComputeReq>,
    device: Arc<dyn Device>,
}

fn fail(what: impl std::fmt::Display) -> NrtError {
    NrtError::new(NrtStatus::Failure, what.to_string())
}

impl HwExecQueue {
    /// Device bytes of the runtime's own structures behind this queue: each TPB's exec queue
    /// rings and request slots (the datastore's `runtime_memory`; models' I/O and dynamic
    /// queues are the models').
    pub fn runtime_device_bytes(&self) -> u64 {
        let req = self
            .compute_req_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        req.tpbs
            .iter()
            .map(|t| t.exec_queue.device_bytes() + t.req_alloc.size)
            .sum()
    }

    /// Allocates and initialises the exec queue of each NC in `ncs` (the vNC's TPBs, main
    /// first) and a request buffer of `slots` slots per NC (one per execution that may be in
    /// flight).
    ///
    /// # Errors
    /// The device's allocation or init error (what was set up is released).
    pub fn new(device: Arc<dyn Device>, ncs: &[u32], slots: u32) -> Result<Self, NrtError> {
        let main = *ncs
            .first()
            .ok_or_else(|| NrtError::new(NrtStatus::Invalid, "a logical core with no NC"))?;
        let mut tpbs = Vec::with_capacity(ncs.len());
        for &nc in ncs {
            match HwExecState::new(&device, nc, slots) {
                Ok(st) => tpbs.push(st),
                Err(e) => {
                    for st in tpbs {
                        st.release(device.as_ref());
                    }
                    return Err(e);
                }
            }
        }
        Ok(Self {
            nc: main,
            compute_req_lock: Mutex::new(ComputeReq {
                compute_idx_tail: 0,
                tpbs,
            }),
            device,
        })
    }

    /// Creates the I/O ring (engine, queue) of NC `nc` if it does not exist yet (at model load).
    ///
    /// # Errors
    /// The device's error; NRT_INVALID for the exec queue's own (engine, queue), a queue
    /// reserved for tensor operations ([`crate::tensor_op::TENSOR_OP_DMA_QUEUES`]) or an NC not
    /// of this vNC.
    pub fn ensure_io_queue(&self, nc: u32, engine: u32, queue: u32) -> Result<(), NrtError> {
        if (engine, queue) == (EXEC_QUEUE_ENGINE, EXEC_QUEUE) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!("I/O ring on ({engine}, {queue}) collides with the exec queue"),
            ));
        }
        if engine == crate::tensor_op::TENSOR_OP_DMA_ENGINE
            && crate::tensor_op::TENSOR_OP_DMA_QUEUES.contains(&queue)
        {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "I/O ring on ({engine}, {queue}) collides with a queue reserved for tensor operations"
                ),
            ));
        }
        let mut req = self
            .compute_req_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let st = req.tpb_mut(nc)?;
        if st.io_queues.contains_key(&(engine, queue)) {
            return Ok(());
        }
        if st.dynamic_queues.contains_key(&(engine, queue)) {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "I/O ring on ({engine}, {queue}) collides with a dynamic DMA queue of a loaded NEFF"
                ),
            ));
        }
        let id = DmaQueueId { nc, engine, queue };
        let q = DmaQueue::create(
            self.device.as_ref(),
            id,
            IO_RING_DESCS,
            MemLocation::Hbm { nc },
        )
        .map_err(|e| {
            NrtError::new(
                e.status(),
                format!("NC {nc}: creating I/O ring ({engine}, {queue}): {e}"),
            )
        })?;
        st.io_queues.insert((engine, queue), q);
        Ok(())
    }

    /// Takes a use of each dynamic DMA queue `queues` (engine, queue) of NC `nc` for a NEFF
    /// model, creating the ones no loaded NEFF uses yet with rings of `descs` descriptors. All or
    /// nothing: on an error, the uses taken here are given back.
    ///
    /// # Errors
    /// NRT_INVALID for a queue that is the exec queue's, a tensor-operation queue or a model
    /// container's I/O ring; the device's error.
    pub fn acquire_dynamic_queues(
        &self,
        nc: u32,
        queues: &[(u32, u32)],
        descs: u32,
    ) -> Result<(), NrtError> {
        let mut req = self
            .compute_req_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let st = req.tpb_mut(nc)?;
        for (n, &(engine, queue)) in queues.iter().enumerate() {
            let taken = st.acquire_dynamic_queue(self.device.as_ref(), engine, queue, descs);
            if let Err(e) = taken {
                st.release_dynamic_queues(self.device.as_ref(), &queues[..n]);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Gives back one use of each of `queues` on NC `nc`; a queue no NEFF uses any more is
    /// released on the device.
    pub fn release_dynamic_queues(&self, nc: u32, queues: &[(u32, u32)]) {
        let mut req = self
            .compute_req_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Ok(st) = req.tpb_mut(nc) {
            st.release_dynamic_queues(self.device.as_ref(), queues);
        }
    }

    /// Releases every TPB's exec queue, I/O rings and request buffer (runtime close).
    pub fn release(self) {
        let req = self
            .compute_req_lock
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for st in req.tpbs {
            st.release(self.device.as_ref());
        }
    }
}

impl ComputeReq {
    /// The next fan-out's compute index (`compute_idx_tail` of the main TPB).
    pub fn compute_idx_tail(&self) -> u32 {
        self.compute_idx_tail
    }

    /// Takes the next compute index (`compute_idx_tail++`), once per fan-out.
    pub fn next_compute_idx(&mut self) -> u32 {
        let idx = self.compute_idx_tail;
        self.compute_idx_tail = idx.wrapping_add(1);
        idx
    }

    /// The exec queue state of TPB `nc` of this vNC.
    ///
    /// # Errors
    /// NRT_FAILURE when `nc` is not a TPB of this vNC.
    pub fn tpb_mut(&mut self, nc: u32) -> Result<&mut HwExecState, NrtError> {
        self.tpbs
            .iter_mut()
            .find(|t| t.nc == nc)
            .ok_or_else(|| fail(format!("NC {nc} has no exec queue on this logical core")))
    }

    /// The exec queue state of TPB `nc` of this vNC, if it is one.
    pub fn tpb(&self, nc: u32) -> Option<&HwExecState> {
        self.tpbs.iter().find(|t| t.nc == nc)
    }
}

impl HwExecState {
    fn new(device: &Arc<dyn Device>, nc: u32, slots: u32) -> Result<Self, NrtError> {
        let info = device.info();
        let map = AddressMap {
            arch: info.arch,
            nc_count: info.nc_count,
            hbm_bytes_per_nc: info.hbm_bytes_per_nc,
        };
        let id = DmaQueueId {
            nc,
            engine: EXEC_QUEUE_ENGINE,
            queue: EXEC_QUEUE,
        };
        let exec_queue = DmaQueue::create(
            device.as_ref(),
            id,
            EXEC_QUEUE_DESCS,
            MemLocation::Hbm { nc },
        )
        .map_err(|e| fail(format!("NC {nc}: creating the hardware exec queue: {e}")))?;
        let req_alloc = device.mem_alloc(
            MemLocation::Hbm { nc },
            u64::from(slots) * REQUEST_SLOT_SIZE,
            0,
        )?;
        let req_buf = device.mem_map(&req_alloc)?;
        for s in 0..u64::from(slots) {
            req_buf
                .store_u32(
                    req_alloc.pa + s * REQUEST_SLOT_SIZE + EVENT_POKE_WORD,
                    1,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .map_err(fail)?;
        }
        let trigger_pairs = (0..u64::from(slots))
            .map(|s| trigger_pairs(&map, nc, req_alloc.pa + s * REQUEST_SLOT_SIZE))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            nc,
            exec_queue,
            req_buf,
            req_alloc,
            slots,
            trigger_pairs,
            last_exec_req_flags: None,
            last_exec_req_tbl_hashes: None,
            io_queues: FastHashMap::default(),
            dynamic_queues: FastHashMap::default(),
        })
    }

    fn release(self, dev: &dyn Device) {
        let _ = self.exec_queue.release(dev);
        for (_, q) in self.io_queues {
            let _ = q.release(dev);
        }
        for (_, (q, _)) in self.dynamic_queues {
            let _ = q.release(dev);
        }
        drop(self.req_buf);
        let _ = dev.mem_free(self.req_alloc.handle);
    }

    fn acquire_dynamic_queue(
        &mut self,
        dev: &dyn Device,
        engine: u32,
        queue: u32,
        descs: u32,
    ) -> Result<(), NrtError> {
        let nc = self.nc;
        if let Some((_, uses)) = self.dynamic_queues.get_mut(&(engine, queue)) {
            *uses += 1;
            return Ok(());
        }
        let reserved = (engine, queue) == (EXEC_QUEUE_ENGINE, EXEC_QUEUE)
            || (engine == crate::tensor_op::TENSOR_OP_DMA_ENGINE
                && crate::tensor_op::TENSOR_OP_DMA_QUEUES.contains(&queue))
            || self.io_queues.contains_key(&(engine, queue));
        if reserved {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "NC {nc}: dynamic DMA queue ({engine}, {queue}) is taken by the runtime or a model container's I/O ring"
                ),
            ));
        }
        let id = DmaQueueId { nc, engine, queue };
        let q = DmaQueue::create(dev, id, descs, MemLocation::Hbm { nc }).map_err(|e| {
            let status = e.status();
            NrtError::new(
                status,
                format!("NC {nc}: creating dynamic DMA queue ({engine}, {queue}): {e}"),
            )
        })?;
        self.dynamic_queues.insert((engine, queue), (q, 1));
        Ok(())
    }

    fn release_dynamic_queues(&mut self, dev: &dyn Device, queues: &[(u32, u32)]) {
        for key in queues {
            if let Some((_, uses)) = self.dynamic_queues.get_mut(key) {
                *uses -= 1;
                if *uses == 0
                    && let Some((q, _)) = self.dynamic_queues.remove(key)
                {
                    let _ = q.release(dev);
                }
            }
        }
    }

    /// Dynamic DMA queues of NEFF models on this NC, with their use counts.
    pub fn dynamic_queue_uses(&self) -> impl Iterator<Item = ((u32, u32), u32)> + '_ {
        self.dynamic_queues.iter().map(|(k, (_, n))| (*k, *n))
    }

    /// The physical NC.
    pub fn nc(&self) -> u32 {
        self.nc
    }

    /// The request staged in slot `compute_idx % slots` (what the device copies to DMEM).
    ///
    /// # Errors
    /// The accessor's error.
    pub fn read_request(&self, compute_idx: u32) -> Result<DeviceExecRequest, NrtError> {
        let slot_pa = self.req_alloc.pa + u64::from(compute_idx % self.slots) * REQUEST_SLOT_SIZE;
        self.req_buf
            .read_obj::<DeviceExecRequest>(slot_pa)
            .map_err(fail)
    }

    /// The exec queue (its rings hold the trigger pairs).
    pub fn exec_queue(&self) -> &DmaQueue {
        &self.exec_queue
    }

    /// `hw_exec_queue_add_exec_request_impl`: appends this execution's I/O descriptors (encoded
    /// by bind; only their ring ids are set here) to the I/O rings, builds the request (engine addresses split lo/hi; `reload_seq_config` from the
    /// `exec_req_flags` diff — always 1 when the optimisation is off; `load_act_dve_tables` from
    /// the table-hash diff), copies it into the request slot then the `cc_dma_increment` trailer
    /// at 0x34 (`M`, the chain length), appends trigger pair 1 (52-byte request → DMEM), pair 2
    /// (4-byte event poke), pair 3 (two 4-byte tail increments sourced from the trailer) and the
    /// chain, in that
    /// order, then updates the caches. `compute_idx` is the fan-out's single index (the main
    /// TPB's); it picks the request slot.
    ///
    /// # Errors
    /// NRT_FAILURE when a ring or the request buffer cannot be written (the caller poisons the
    /// XU).
    pub fn add_exec_request(
        &mut self,
        compute_idx: u32,
        program: &StagedProgram<'_>,
        model_switch: bool,
        skip_config_optimization: bool,
    ) -> Result<StagedRequest, NrtError> {
        let nc = self.nc;
        for ring in program.io {
            let (engine, queue) = (ring.engine(), ring.queue());
            let q = self.io_queues.get_mut(&(engine, queue)).ok_or_else(|| {
                fail(format!(
                    "NC {nc}: I/O ring ({engine}, {queue}) was not created at load"
                ))
            })?;
            // Append only: bind built them; the ring id is the one position-dependent field.
            q.append_prebuilt(ring.descs())
                .map_err(|e| fail(format!("NC {nc}: I/O ring ({engine}, {queue}): {e}")))?;
            q.hand_to_device();
        }
        if let Some(dge) = &program.dge {
            // The NEFF counterpart of the I/O descriptors: this fan-out's tensor PAs into copy
            // `compute_idx % dge_copies` of the table, which the device reads for this batch.
            let pa = dge
                .header
                .dge_copy_pa(compute_idx)
                .ok_or_else(|| fail(format!("NC {nc}: NEFF program header has no DGE copies")))?;
            if dge.entries.len() != dge.header.dge_entries as usize {
                return Err(fail(format!(
                    "NC {nc}: {} DGE entries bound, the table has {}",
                    dge.entries.len(),
                    dge.header.dge_entries
                )));
            }
            dge.chunk
                .write(pa, dge.entries.as_bytes())
                .map_err(|e| fail(format!("NC {nc}: writing the DGE table: {e}")))?;
        }
        let mut request = DeviceExecRequest {
            do_model_switch: u32::from(model_switch),
            ..Default::default()
        };
        request.reload_seq_config = if skip_config_optimization {
            u32::from(self.last_exec_req_flags.as_ref() != Some(program.exec_req_flags))
        } else {
            1
        };
        request.reload_seq_config |= program.encoding.config_bits();
        let hashes = (*program.table_hashes.0, *program.table_hashes.1);
        request.load_act_dve_tables = u32::from(self.last_exec_req_tbl_hashes != Some(hashes));
        for (engine, addr) in Engine::ALL.iter().zip(program.engine_addresses) {
            request.set_engine_address(*engine, addr);
        }
        let slot_pa = self.req_alloc.pa + u64::from(compute_idx % self.slots) * REQUEST_SLOT_SIZE;
        let chain_len = program.cc_chain.map_or(0, |c| c.pairs.len());
        let m = u32::try_from(chain_len).map_err(fail)?;
        self.req_buf
            .write(slot_pa, request.as_bytes())
            .map_err(|e| fail(format!("Unable to copy execution request to device: {e}")))?;
        // cc_dma_increment: a separate 4-byte copy-in after the body (seed 000 §3).
        self.req_buf
            .write(slot_pa + CC_DMA_INCREMENT_WORD, &m.to_le_bytes())
            .map_err(|e| fail(format!("Unable to copy CC DMA increment to device: {e}")))?;
        let q = &mut self.exec_queue;
        let trigger = self
            .trigger_pairs
            .get((compute_idx % self.slots) as usize)
            .ok_or_else(|| fail(format!("NC {nc}: no trigger pairs for request slot")))?;
        // Counted as written, not computed: the pairs this batch really put in the ring.
        let mut exec_pairs = q
            .append_prebuilt(trigger)
            .map_err(|e| fail(format!("NC {nc}: exec queue: {e}")))?;
        if let Some(chain) = program.cc_chain {
            for &(src, dst, len) in &chain.pairs {
                exec_pairs += q
                    .push_copy(src, dst, len)
                    .map_err(|e| fail(format!("NC {nc}: exec queue: {e}")))?;
            }
        }
        self.exec_queue.hand_to_device();
        self.last_exec_req_flags = Some(*program.exec_req_flags);
        self.last_exec_req_tbl_hashes = Some(hashes);
        Ok(StagedRequest {
            request,
            compute_idx,
            exec_pairs,
        })
    }
}

/// Descriptor pairs per request slot that [`trigger_pairs`] encodes.
const TRIGGER_PAIRS: usize = 4;

/// The trigger pairs of the request slot at `slot_pa` on NC `nc` (seed 000 §3), ring ids not
/// yet set: the request copy into DMEM, the event poke, then the RX and TX tail increments of
/// the exec queue (both from the slot's `cc_dma_increment` word).
fn trigger_pairs(
    map: &AddressMap,
    nc: u32,
    slot_pa: u64,
) -> Result<[PrebuiltPair; TRIGGER_PAIRS], NrtError> {
    let event = map.register_address(Register::Event {
        nc,
        index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD,
    });
    let tail_increment = |register| (slot_pa + CC_DMA_INCREMENT_WORD, register, 4);
    let copies = [
        (
            slot_pa,
            map.dmem_address(nc, 0),
            DEVICE_EXEC_REQUEST_SIZE as u64,
        ), // pair 1
        (slot_pa + EVENT_POKE_WORD, event, 4), // pair 2
        tail_increment(map.register_address(Register::RxTailIncrement {
            nc,
            engine: EXEC_QUEUE_ENGINE,
            queue: EXEC_QUEUE,
        })), // pair 3, RX
        tail_increment(map.register_address(Register::TxTailIncrement {
            nc,
            engine: EXEC_QUEUE_ENGINE,
            queue: EXEC_QUEUE,
        })), // pair 3, TX
    ];
    let mut pairs = Vec::with_capacity(TRIGGER_PAIRS);
    for (src, dst, len) in copies {
        build_copy(src, dst, len, &mut pairs)
            .map_err(|e| fail(format!("NC {nc}: encoding a trigger pair: {e}")))?;
    }
    // Each copy is at most 64 KiB: one pair each.
    pairs.try_into().map_err(|built: Vec<PrebuiltPair>| {
        fail(format!(
            "NC {nc}: {} trigger pairs encoded, {TRIGGER_PAIRS} expected",
            built.len()
        ))
    })
}

/// Builds raw descriptor pairs for a collectives chain, checking each ≤ 64 KiB (used when the
/// chain is built, once per model).
///
/// # Errors
/// NRT_INVALID for a pair over 64 KiB.
pub fn check_cc_chain(chain: &CcChain) -> Result<(), NrtError> {
    for &(src, dst, len) in &chain.pairs {
        udma::m2m_copy_descriptors(src, dst, len, shared::RingId::INITIAL, false)
            .map_err(|e| NrtError::new(NrtStatus::Invalid, format!("collectives chain: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use shared::memory::SharedChunk;
    use shared::protocol::{DeviceInfo, NcCounters};
    use shared::{Arch, RingId};

    use super::*;
    use crate::backend::{ClaimedNc, DeviceError, DmaRings, MemHandle, NotificationQueue};
    use crate::bind::RingIo;
    use crate::dma::{build_copy, pairs_built_on_this_thread};

    /// A device whose memory is tempfiles and whose control calls succeed and do nothing:
    /// enough to stage into real rings and read them back.
    #[derive(Debug)]
    struct MemoryOnlyDevice {
        info: DeviceInfo,
        chunks: Mutex<Vec<(File, Allocation)>>,
    }

    impl MemoryOnlyDevice {
        fn new() -> Self {
            Self {
                info: DeviceInfo {
                    arch: Arch::Trn1,
                    nc_count: 2,
                    hbm_bytes_per_nc: 1 << 30,
                    hbm_bases: vec![0, 1 << 30],
                    host_base: 1 << 40,
                    reg_base: 1 << 41,
                    semaphores_per_nc: 32,
                    events_per_nc: 256,
                    dma_engines_per_nc: 16,
                    dma_queues_per_engine: 16,
                    description: "stage unit tests".into(),
                },
                chunks: Mutex::new(Vec::new()),
            }
        }
    }

    fn unsupported(op: &'static str) -> DeviceError {
        DeviceError::OutOfRange {
            op,
            what: "call",
            value: 0,
            limit: 0,
        }
    }

    impl Device for MemoryOnlyDevice {
        fn backend_name(&self) -> &'static str {
            "memory-only"
        }
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn claim_nc(&self, _: u32) -> Result<ClaimedNc, DeviceError> {
            Err(unsupported("claim_nc"))
        }
        fn release_nc(&self, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn mem_alloc(
            &self,
            location: MemLocation,
            size: u64,
            _: u64,
        ) -> Result<Allocation, DeviceError> {
            let mut chunks = self.chunks.lock().unwrap();
            let size = size.next_multiple_of(4096);
            let pa = chunks.last().map_or(0x10_0000, |(_, a)| a.pa + a.size);
            let file = tempfile::tempfile().map_err(|_| unsupported("mem_alloc"))?;
            file.set_len(size).map_err(|_| unsupported("mem_alloc"))?;
            let a = Allocation {
                handle: MemHandle(chunks.len() as u64),
                pa,
                size,
                location,
            };
            chunks.push((file, a));
            Ok(a)
        }
        fn mem_free(&self, _: MemHandle) -> Result<(), DeviceError> {
            Ok(())
        }
        fn mem_map(&self, allocation: &Allocation) -> Result<SharedChunk, DeviceError> {
            let chunks = self.chunks.lock().unwrap();
            let (file, a) = chunks
                .iter()
                .find(|(_, a)| a.handle == allocation.handle)
                .ok_or_else(|| unsupported("mem_map"))?;
            SharedChunk::map_fd(file, a.pa, usize::try_from(a.size).unwrap(), true)
                .map_err(|_| unsupported("mem_map"))
        }
        fn dma_queue_init(&self, _: DmaQueueId, _: &DmaRings) -> Result<(), DeviceError> {
            Ok(())
        }
        fn dma_queue_release(&self, _: DmaQueueId) -> Result<(), DeviceError> {
            Ok(())
        }
        fn dma_queue_copy_start(&self, _: DmaQueueId, _: u32, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn semaphore_increment(&self, _: u32, _: u32, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn semaphore_decrement(&self, _: u32, _: u32, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn semaphore_read(&self, _: u32, _: u32) -> Result<u32, DeviceError> {
            Ok(0)
        }
        fn semaphore_write(&self, _: u32, _: u32, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn event_set(&self, _: u32, _: u32, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn event_get(&self, _: u32, _: u32) -> Result<u32, DeviceError> {
            Ok(0)
        }
        fn notification_queue_init(
            &self,
            _: u32,
            _: u32,
        ) -> Result<NotificationQueue, DeviceError> {
            Err(unsupported("notification_queue_init"))
        }
        fn nc_reset(&self, _: u32) -> Result<(), DeviceError> {
            Ok(())
        }
        fn nc_counters(&self, _: u32) -> Result<NcCounters, DeviceError> {
            Ok(NcCounters::default())
        }
    }

    /// Stages `n` batches of `program` on TPB 0 (the next `n` compute indexes); each appends
    /// the four trigger pairs to the exec queue.
    fn stage_batches(req: &mut ComputeReq, program: &StagedProgram<'_>, n: u32) {
        for _ in 0..n {
            let idx = req.next_compute_idx();
            let staged = req
                .tpb_mut(0)
                .unwrap()
                .add_exec_request(idx, program, false, true)
                .unwrap();
            assert_eq!(
                staged.exec_pairs, 4,
                "the trigger pairs are still the stage's"
            );
        }
    }

    #[test]
    fn stage_appends_binds_descriptors_as_they_are_patching_only_ring_ids() {
        const ENGINE: u32 = 3;
        const QUEUE: u32 = 1;
        let hw = HwExecQueue::new(Arc::new(MemoryOnlyDevice::new()), &[0], 4).unwrap();
        hw.ensure_io_queue(0, ENGINE, QUEUE).unwrap();
        // What bind holds for one 150 KiB tensor: three pieces (64, 64, 22 KiB).
        let mut descs = Vec::new();
        build_copy(0x4000_0000, 0x5000_0000, 150 << 10, &mut descs).unwrap();
        let io = [RingIo::for_tests(ENGINE, QUEUE, descs.clone())];
        let (flags, act, dve) = ([0u32; 13], [1u8; 32], [2u8; 32]);
        let program = StagedProgram {
            engine_addresses: [0x1000, 0x2000, 0x3000, 0x4000, 0x5000],
            exec_req_flags: &flags,
            table_hashes: (&act, &dve),
            io: &io,
            cc_chain: None,
            encoding: ProgramEncoding::SimdevIsa,
            dge: None,
        };
        let built = pairs_built_on_this_thread();
        let mut req = hw.compute_req_lock.lock().unwrap();
        // 5462 executions of 3 pairs: the one at 5461 lands on slots 16383 (pass 1), 0 and 1
        // (pass 2) of the 16384-descriptor ring.
        let wrap_at = IO_RING_DESCS / 3;
        stage_batches(&mut req, &program, wrap_at + 1);
        assert_eq!(
            pairs_built_on_this_thread(),
            built,
            "the stage encoded I/O descriptors of its own"
        );
        let q = &req.tpb(0).unwrap().io_queues[&(ENGINE, QUEUE)];
        let pass2 = RingId::new(2).unwrap();
        for (slot, piece, rid) in [
            (IO_RING_DESCS - 1, 0, RingId::INITIAL),
            (0, 1, pass2),
            (1, 2, pass2),
        ] {
            assert_eq!(q.tx().read(slot), Some(descs[piece].tx().with_ring_id(rid)));
            assert_eq!(q.rx().read(slot), Some(descs[piece].rx().with_ring_id(rid)));
        }
        assert_eq!((q.tx().next_index(), q.tx().ring_id()), (2, pass2));
    }

    /// The trigger pairs encoded at creation are what seed 000 §3 appends per batch: the
    /// request copy of the batch's slot (`compute_idx % slots`) into DMEM, the event poke, the
    /// RX then TX tail increments from the slot's `cc_dma_increment` word — each one M2M pair
    /// with a write barrier, carrying the ring id of the pass its slot is on (checked here on
    /// both sides of the exec queue's first wrap).
    #[test]
    fn each_batch_appends_its_request_slots_trigger_pairs_with_its_passs_ring_id() {
        const SLOTS: u32 = 4;
        let device = Arc::new(MemoryOnlyDevice::new());
        let info = device.info.clone();
        let hw = HwExecQueue::new(device, &[0], SLOTS).unwrap();
        let (flags, act, dve) = ([0u32; 13], [1u8; 32], [2u8; 32]);
        let program = StagedProgram {
            engine_addresses: [0x1000, 0x2000, 0x3000, 0x4000, 0x5000],
            exec_req_flags: &flags,
            table_hashes: (&act, &dve),
            io: &[],
            cc_chain: None,
            encoding: ProgramEncoding::SimdevIsa,
            dge: None,
        };
        let mut req = hw.compute_req_lock.lock().unwrap();
        let per_pass = EXEC_QUEUE_DESCS / 4; // batches of four pairs
        stage_batches(&mut req, &program, per_pass + 2);
        let tpb = req.tpb(0).unwrap();
        let map = AddressMap {
            arch: info.arch,
            nc_count: info.nc_count,
            hbm_bytes_per_nc: info.hbm_bytes_per_nc,
        };
        let q = &tpb.exec_queue;
        let reg = |r| map.register_address(r);
        let (engine, queue) = (EXEC_QUEUE_ENGINE, EXEC_QUEUE);
        // The last batch of pass 1, then the first two of pass 2.
        for (compute_idx, first_slot, rid) in [
            (per_pass - 1, EXEC_QUEUE_DESCS - 4, RingId::INITIAL),
            (per_pass, 0, RingId::INITIAL.next()),
            (per_pass + 1, 4, RingId::INITIAL.next()),
        ] {
            let slot_pa = tpb.req_alloc.pa + u64::from(compute_idx % SLOTS) * REQUEST_SLOT_SIZE;
            let increment = slot_pa + CC_DMA_INCREMENT_WORD;
            let want = [
                (
                    slot_pa,
                    map.dmem_address(0, 0),
                    DEVICE_EXEC_REQUEST_SIZE as u64,
                ),
                (
                    slot_pa + EVENT_POKE_WORD,
                    reg(Register::Event {
                        nc: 0,
                        index: EVENT_HW_EXEC_QUEUE_REQUEST_LOAD,
                    }),
                    4,
                ),
                (
                    increment,
                    reg(Register::RxTailIncrement {
                        nc: 0,
                        engine,
                        queue,
                    }),
                    4,
                ),
                (
                    increment,
                    reg(Register::TxTailIncrement {
                        nc: 0,
                        engine,
                        queue,
                    }),
                    4,
                ),
            ];
            for (k, (src, dst, len)) in (0u32..).zip(want) {
                let (tx, rx) = udma::m2m_copy_descriptors(src, dst, len, rid, true).unwrap();
                let slot = first_slot + k;
                assert_eq!(
                    q.tx().read(slot),
                    Some(tx),
                    "batch {compute_idx}, pair {k}: TX"
                );
                assert_eq!(
                    q.rx().read(slot),
                    Some(rx),
                    "batch {compute_idx}, pair {k}: RX"
                );
            }
        }
    }

    #[test]
    fn a_collectives_chain_piece_over_64_kib_is_refused() {
        let ok = CcChain {
            pairs: vec![(0x1000, 0x9_0000, 65536), (0x2000, 0xA_0000, 4)],
        };
        assert!(check_cc_chain(&ok).is_ok());
        let bad = CcChain {
            pairs: vec![(0x1000, 0x9_0000, 65536), (0x2000, 0xA_0000, 65537)],
        };
        let e = check_cc_chain(&bad).unwrap_err();
        assert_eq!(e.status, NrtStatus::Invalid);
        assert!(e.message.contains("collectives chain"), "{e}");
    }
}

#[cfg(test)]
mod in_process_tests;
