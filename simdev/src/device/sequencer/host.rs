//! The device as one execution's engines see it: the [`engines::Host`] through which their
//! programs reach the NC's registers, DMA queues, compute state and the client's memory.

use std::time::Instant;

use shared::isa::Opcode;

use shared::exec_request::Engine;
use shared::isa::{INSTRUCTION_SIZE, Instruction};
use shared::notification::error_flags;

use std::sync::Arc;

use crate::compute::ComputeState;
use crate::counters::bump;
use crate::device::dma_run::Aborts;
use crate::device::{Claim, Core, Nc, lock};
use crate::dma::{Budget, DmaQueueId, QueueError, QueueStatus, error_chain};
use crate::engines::{self, Stop};
use crate::memory::{Chunk, ChunkCache};
use crate::reference::{Binding, BoundTensor};
use crate::shape_only;
use crate::trace::Detail;

use super::execution::{Account, dma_failure, nanos};

/// The device as one execution's engines see it.
pub(super) struct ExecHost<'a> {
    pub(super) core: &'a Core,
    pub(super) nc: &'a Nc,
    pub(super) claim: &'a Claim,
    pub(super) epoch: u64,
    pub(super) budget: &'a mut Budget,
    pub(super) acct: &'a mut Account,
    /// The NC's read cache, which the sequencer role holds (see
    /// [`Core::resolve_in`]).
    pub(super) reads: &'a mut ChunkCache,
    /// A reference ([`crate::reference`]) computed (or was to compute) this NEFF's outputs.
    pub(super) reference_used: bool,
    /// Whether a park may sleep on this thread (the NC's sequencer thread), or must suspend
    /// the execution for the sequencer thread to resume (the doorbell's thread, which has its
    /// connection to serve: the change the execution waits for may be that connection's next
    /// message).
    pub(super) may_sleep: bool,
}

impl ExecHost<'_> {
    fn abandoned(&self) -> bool {
        self.core.abandoned(self.nc, self.epoch)
    }
}

impl engines::Host for ExecHost<'_> {
    fn fetch(&mut self, engine: Engine, pa: u64) -> Result<Instruction, Stop> {
        let oob = || {
            Stop::failed(
                error_flags::OOB | error_flags::GENERIC,
                format!(
                    "{} fetches an instruction at {pa:#x}, which is not inside one chunk of the \
                     NC's owner",
                    engine.name()
                ),
            )
        };
        let chunk = self
            .core
            .resolve_in(self.reads, self.claim.client, pa, INSTRUCTION_SIZE)
            .ok_or_else(oob)?;
        chunk
            .memory()
            .read_obj::<Instruction>(pa)
            .map_err(|_| oob())
    }

    fn semaphore(&mut self, index: u32) -> u32 {
        self.claim.registers.semaphore(index).unwrap_or(0)
    }

    fn signal(&mut self, index: u32, value: u32) {
        match self.claim.registers.semaphore_add(index, value) {
            Ok(()) => self.acct.signals.add(index, value),
            Err(e) => tracing::error!("NC {}: signal: {e}", self.nc.index),
        }
    }

    fn event(&mut self, index: u32) -> u32 {
        self.claim.registers.event(index).unwrap_or(0)
    }

    fn dma_start(&mut self, engine: u32, queue: u32, count: u32) -> Result<(), Stop> {
        // Posted and run under one lock of the NC's state.
        let mut state = lock(&self.nc.state);
        if self.abandoned() {
            return Err(Stop::Abandoned);
        }
        state
            .queues
            .post(engine, queue, count, count)
            .map_err(|e| {
                let flags = match e {
                    QueueError::Stopped { .. } => error_flags::DMA_ABORT,
                    _ => error_flags::GENERIC,
                };
                Stop::failed(
                    flags,
                    format!("SP DmaStart of {count} descriptors: {}", error_chain(&e)),
                )
            })?;
        let mut aborts = Vec::new();
        let id = DmaQueueId {
            nc: self.nc.index,
            engine,
            queue,
        };
        self.core.run_dma_locked(
            self.claim.client,
            id,
            state,
            self.budget,
            &mut Aborts::Capture(&mut aborts),
            self.acct.trace_at(),
        );
        dma_failure(&aborts).map_or(Ok(()), Err)
    }

    fn dma_wait(&mut self, engine: u32, queue: u32) -> Result<(), Stop> {
        let state = lock(&self.nc.state);
        match state.queues.status(engine, queue) {
            Some(QueueStatus::Running) => Ok(()),
            Some(QueueStatus::Stopped(reason)) => Err(Stop::failed(
                error_flags::DMA_ABORT,
                format!("SP DmaWait: {reason}"),
            )),
            None => Err(Stop::generic(format!(
                "SP DmaWait of DMA engine {engine} queue {queue}, which is not initialised"
            ))),
        }
    }

    fn compute<R>(&mut self, f: impl FnOnce(&mut ComputeState) -> R) -> Result<R, Stop> {
        let mut compute = lock(&self.nc.compute);
        // Checked under the lock: a reset moves the epoch before it clears the state.
        if self.core.epoch_moved(self.nc, self.epoch) {
            return Err(Stop::Abandoned);
        }
        Ok(f(&mut compute))
    }

    fn round(&mut self) -> Result<u64, Stop> {
        // `token` is `None` once the device shuts down: with the epoch, what `abandoned`
        // checks, under one lock of the sequencer's state instead of two.
        let token = self.nc.seq.token().ok_or(Stop::Abandoned)?;
        if self.core.epoch_moved(self.nc, self.epoch) {
            return Err(Stop::Abandoned);
        }
        Ok(token)
    }

    fn park(&mut self, token: u64) -> Result<engines::Park, Stop> {
        if !self.may_sleep {
            tracing::debug!(
                "NC {}: execution waits for an event; handed to the sequencer thread",
                self.nc.index
            );
            return Ok(engines::Park::Suspend);
        }
        tracing::debug!(
            "NC {}: execution parked, waiting for an event",
            self.nc.index
        );
        self.nc.seq.wait_change(token);
        if self.abandoned() {
            return Err(Stop::Abandoned);
        }
        Ok(engines::Park::Woken)
    }

    fn timed(&self) -> bool {
        self.acct.events.is_some() && self.acct.model.is_none()
    }

    fn retired(&mut self, engine: Engine, op: Opcode, pc: u64, began: Option<Instant>) {
        let acct = &mut *self.acct;
        acct.charge.instructions += 1;
        if acct.events.is_none() {
            return;
        }
        let (ts_ns, dur_ns) = match acct.model {
            Some(model) => {
                let ts = acct.cursor;
                acct.cursor = ts.saturating_add(model.per_instruction_ns);
                (ts, model.per_instruction_ns)
            }
            None => {
                let began = began.unwrap_or_else(Instant::now);
                (self.core.since_start_ns(began), nanos(began.elapsed()))
            }
        };
        let detail = Detail::Instruction {
            engine,
            op,
            pc,
            compute_idx: acct.compute_idx,
        };
        acct.record(self.nc.index, ts_ns, Some(dur_ns), detail);
    }
}

impl shape_only::Host for ExecHost<'_> {
    fn resolve(&mut self, pa: u64, len: u64) -> Option<Arc<Chunk>> {
        let len = usize::try_from(len).ok()?;
        self.core
            .resolve_in(self.reads, self.claim.client, pa, len)
            .cloned()
    }

    fn compute_idx(&self) -> u32 {
        self.acct.compute_idx
    }

    fn live(&mut self) -> Result<(), Stop> {
        if self.abandoned() {
            return Err(Stop::Abandoned);
        }
        Ok(())
    }

    fn stream(&mut self, engine: Engine, pa: u64, records: u32, reference: Option<&Arc<str>>) {
        let acct = &mut *self.acct;
        acct.charge.instructions += u64::from(records);
        if acct.events.is_none() {
            return;
        }
        // One span per engine, not one event per record (matmul_large has 21,269 records).
        let (ts_ns, dur_ns) = match acct.model {
            Some(model) => {
                let ts = acct.cursor;
                let dur = u64::from(records).saturating_mul(model.per_instruction_ns);
                acct.cursor = ts.saturating_add(dur);
                (ts, dur)
            }
            None => (self.core.now_ns(), 0),
        };
        let detail = Detail::Stream {
            engine,
            records,
            reference: reference.cloned(),
            pa,
            compute_idx: acct.compute_idx,
        };
        acct.record(self.nc.index, ts_ns, Some(dur_ns), detail);
    }

    fn moved(&mut self, bytes: u64) {
        bump(&self.nc.counters.stream_bytes, bytes);
    }

    fn reference(&mut self, uuid: &[u8; 16], hash: &[u8; 16]) -> Option<Arc<Binding>> {
        let found = self.core.references.find(uuid, hash);
        // A golden file recorded from simdev's shape-only outputs replays them: the execution
        // counts as shape-only (not the NEFF's numbers), as its binding's label says.
        self.reference_used = found.as_ref().is_some_and(|b| !b.replays_shape_only());
        found
    }

    fn run_reference(&mut self, binding: &Binding, tensors: &[BoundTensor]) -> Result<(), String> {
        // The error is the execution's failure reason, logged once with it.
        self.core
            .references
            .run(binding, tensors)
            .map_err(|e| format!("NEFF {:?}: {e}", binding.name))
    }
}
