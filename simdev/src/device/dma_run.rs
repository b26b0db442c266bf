//! DMA runs: processing a client's queue, and every queue its descriptors start, within one
//! [`Budget`], over the client's [`Bus`] view of the device; and where the aborts go (a
//! DmaQueueError notification for a doorbell's DMA, or collected by the execution that started
//! the DMA). A tail increment written into another NC's register is applied after the first
//! NC's lock is released ([`Outcome::Deferred`]).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use shared::address_map::Register;
use shared::notification::{NotificationKind, error_flags};
use shared::sequencer::SEM_INFERENCE_START;
use shared::udma::Direction;

use crate::compute::ComputeState;
use crate::dma::{Abort, Budget, Bus, Deferred, DmaQueueId, Fault, Outcome, RegisterWrite};
use crate::memory::Chunk;

use super::trace_events::{DmaMark, TraceAt};
use super::{Core, Nc, NcState, lock, read};
use crate::client::ClientId;

impl Core {
    /// Processes queue `first` and every queue its descriptors start, one at a time, within one
    /// [`Budget`]; aborts post DmaQueueError notifications.
    pub(super) fn run_dma(&self, client: ClientId, first: DmaQueueId) {
        let mut budget = self.budget();
        self.run_dma_with(
            client,
            first,
            &mut budget,
            &mut Aborts::Notify,
            TraceAt::Now,
        );
    }

    /// Processes queue `first` and every queue its descriptors start, one at a time, within
    /// `budget`; each abort goes to `aborts`. Each run of a queue is traced at `at`.
    pub(super) fn run_dma_with(
        &self,
        client: ClientId,
        first: DmaQueueId,
        budget: &mut Budget,
        aborts: &mut Aborts<'_>,
        at: TraceAt,
    ) {
        self.run_dma_from(client, first, None, budget, aborts, at);
    }

    /// [`Core::run_dma_with`] for a queue whose NC's state the caller holds (`state`, locked
    /// to post descriptors on `first`): its first run goes on under that lock, without taking
    /// it again.
    pub(super) fn run_dma_locked(
        &self,
        client: ClientId,
        first: DmaQueueId,
        state: MutexGuard<'_, NcState>,
        budget: &mut Budget,
        aborts: &mut Aborts<'_>,
        at: TraceAt,
    ) {
        self.run_dma_from(client, first, Some(state), budget, aborts, at);
    }

    fn run_dma_from(
        &self,
        client: ClientId,
        first: DmaQueueId,
        held: Option<MutexGuard<'_, NcState>>,
        budget: &mut Budget,
        aborts: &mut Aborts<'_>,
        at: TraceAt,
    ) {
        // The worklist of this thread, reused from run to run (taken, so that a nested run
        // finds none and starts its own).
        let mut worklist = WORKLIST.take();
        worklist.clear();
        worklist.push_back(first);
        self.run_worklist(client, &mut worklist, held, budget, aborts, at);
        WORKLIST.set(worklist);
    }

    /// Runs the queues of `worklist` in turn; `held`, when given, is the state of the first
    /// one's NC, already locked.
    fn run_worklist(
        &self,
        client: ClientId,
        worklist: &mut VecDeque<DmaQueueId>,
        mut held: Option<MutexGuard<'_, NcState>>,
        budget: &mut Budget,
        aborts: &mut Aborts<'_>,
        at: TraceAt,
    ) {
        while let Some(id) = worklist.pop_front() {
            let held = held.take();
            let Some(nc) = self.nc_ref(id.nc) else {
                continue;
            };
            if !self.owned_by(nc, client) {
                continue;
            }
            let mut state = held.unwrap_or_else(|| lock(&nc.state));
            loop {
                let mark = self
                    .tracer
                    .enabled()
                    .then(|| DmaMark::take(self, state.queues.counts()));
                let outcome = {
                    // Dropped (letting go of any SBUF it holds) before anything else locks.
                    let mut bus = ClientBus::for_run(self, client, worklist);
                    state.queues.process(id.engine, id.queue, &mut bus, budget)
                };
                let done = match outcome {
                    Outcome::Idle => true,
                    Outcome::Aborted(abort) => {
                        self.on_abort(nc, &mut state, abort, aborts);
                        true
                    }
                    Outcome::Deferred(deferred) => {
                        drop(state);
                        let result = self.remote_tail_increment(client, &deferred, worklist);
                        state = lock(&nc.state);
                        let abort = state.queues.finish_deferred(&deferred, result);
                        abort.is_some_and(|abort| {
                            self.on_abort(nc, &mut state, abort, aborts);
                            true
                        })
                    }
                };
                if let Some(mark) = mark {
                    let now = state.queues.counts();
                    let pairs = now.descriptors.saturating_sub(mark.pairs);
                    let bytes = now.bytes.saturating_sub(mark.bytes);
                    self.trace_dma(nc, id, pairs, bytes, false, at, mark.wall_ns);
                }
                if done {
                    break;
                }
            }
        }
    }

    /// Applies a tail increment that a queue of another NC wrote (its NC's lock is not held).
    fn remote_tail_increment(
        &self,
        client: ClientId,
        deferred: &Deferred,
        worklist: &mut VecDeque<DmaQueueId>,
    ) -> Result<(), Fault> {
        let reg = deferred.reg;
        let value = deferred.value;
        let (nc, engine, queue, dir) = match reg {
            Register::TxTailIncrement { nc, engine, queue } => (nc, engine, queue, Direction::Tx),
            Register::RxTailIncrement { nc, engine, queue } => (nc, engine, queue, Direction::Rx),
            _ => {
                return Err(Fault::UnknownRegister {
                    pa: self.map.register_address(reg),
                });
            }
        };
        let foreign = Fault::ForeignRegister { reg, nc };
        let Some(n) = self.nc_ref(nc) else {
            return Err(foreign);
        };
        if !self.owned_by(n, client) {
            return Err(foreign);
        }
        lock(&n.state)
            .queues
            .tail_increment(engine, queue, dir, value)
            .map_err(|source| Fault::TailIncrement { reg, value, source })?;
        schedule(worklist, DmaQueueId { nc, engine, queue });
        Ok(())
    }

    /// An injected doorbell fault ([`crate::faults::FaultTable::on_copy_start`]) fired: the
    /// queue stops before processing the doorbell's descriptors and a DmaQueueError
    /// notification names it (DMA_ABORT, with OOB when an `OutOfBounds` fault fired).
    pub(super) fn abort_doorbell(
        &self,
        nc: &Nc,
        engine: u32,
        queue: u32,
        fired: &[shared::protocol::FaultKind],
    ) {
        let oob = fired.contains(&shared::protocol::FaultKind::OutOfBounds);
        bump_fired(nc, fired.len());
        let mut state = lock(&nc.state);
        let fault = Fault::Injected { oob };
        if let Some(abort) = state.queues.abort(engine, queue, &fault) {
            self.report_abort(nc, &mut state, &abort);
        }
    }

    fn on_abort(&self, nc: &Nc, state: &mut NcState, abort: Abort, aborts: &mut Aborts<'_>) {
        match aborts {
            Aborts::Notify => self.report_abort(nc, state, &abort),
            Aborts::Capture(list) => {
                tracing::warn!("{} (during an execution)", abort.reason);
                list.push(abort);
            }
        }
    }

    fn report_abort(&self, nc: &Nc, state: &mut NcState, abort: &Abort) {
        tracing::warn!("{}", abort.reason);
        let source = (abort.queue.engine << 8) | abort.queue.queue;
        let mut flags = error_flags::DMA_ABORT;
        if abort.oob {
            flags |= error_flags::OOB;
        }
        let entry = self.entry(
            nc,
            NotificationKind::DmaQueueError,
            u16::try_from(source).unwrap_or(u16::MAX),
            flags,
        );
        self.post(nc, state, &entry);
    }
}

thread_local! {
    /// The queues a DMA run on this thread still has to process (kept between runs, so a run
    /// allocates nothing once the thread's first runs have grown it).
    static WORKLIST: std::cell::Cell<VecDeque<DmaQueueId>> = const { std::cell::Cell::new(VecDeque::new()) };
}

/// Where the aborts of a DMA run go.
pub(super) enum Aborts<'a> {
    /// A DmaQueueError notification each (a doorbell's DMA).
    Notify,
    /// Collected for the execution that started the DMA, which reports them itself.
    Capture(&'a mut Vec<Abort>),
}

fn bump_fired(nc: &Nc, n: usize) {
    nc.counters
        .faults_fired
        .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
}

fn schedule(worklist: &mut VecDeque<DmaQueueId>, queue: DmaQueueId) {
    if !worklist.contains(&queue) {
        worklist.push_back(queue);
    }
}

/// One client's view of the device for its DMA.
///
/// # Lock order
/// A bus made [`ClientBus::for_run`] keeps the SBUF lock (`Nc::compute`) of the NC its last
/// pair copied to or from, for the next pair of the same run: one lock per run of SBUF pairs
/// instead of one per pair (whose locked instructions wait for the copy's stores to drain).
/// It holds at most one NC's, and lets it go before it takes any other lock (resolving a
/// chunk, a register or DMEM write, another NC's SBUF) and when dropped, so the locks are
/// taken in the same order as by a bus that locks per pair ([`ClientBus::new`]).
pub(super) struct ClientBus<'a> {
    device: &'a Core,
    client: ClientId,
    worklist: &'a mut VecDeque<DmaQueueId>,
    /// Whether SBUF stays locked from one pair to the next.
    keep: bool,
    held: Cell<Option<HeldSbuf<'a>>>,
}

/// The locked SBUF (compute state) of NC `nc`.
struct HeldSbuf<'a> {
    nc: u32,
    compute: MutexGuard<'a, ComputeState>,
}

impl<'a> ClientBus<'a> {
    /// A bus that locks SBUF for each access.
    pub(super) fn new(
        device: &'a Core,
        client: ClientId,
        worklist: &'a mut VecDeque<DmaQueueId>,
    ) -> Self {
        Self {
            device,
            client,
            worklist,
            keep: false,
            held: Cell::new(None),
        }
    }

    /// A bus for one [`crate::dma::DmaQueues::process`] run, keeping SBUF locked from one pair
    /// to the next (see [`ClientBus`]'s lock order); drop it when the run returns.
    pub(super) fn for_run(
        device: &'a Core,
        client: ClientId,
        worklist: &'a mut VecDeque<DmaQueueId>,
    ) -> Self {
        Self {
            keep: true,
            ..Self::new(device, client, worklist)
        }
    }

    /// The SBUF of `n` (NC `nc`), locked: the one held if it is `n`'s, else (letting a held one
    /// go first) newly locked.
    fn sbuf(&self, n: &'a Nc, nc: u32) -> HeldSbuf<'a> {
        match self.held.take() {
            Some(held) if held.nc == nc => held,
            other => {
                drop(other);
                HeldSbuf {
                    nc,
                    compute: lock(&n.compute),
                }
            }
        }
    }

    /// Keeps `held` for the next pair, when this bus keeps SBUF locked.
    fn keep(&self, held: HeldSbuf<'a>) {
        if self.keep {
            self.held.set(Some(held));
        }
    }

    /// Lets go of a held SBUF lock (before another lock is taken).
    fn release(&self) {
        drop(self.held.take());
    }
}

impl Bus for ClientBus<'_> {
    fn resolve(&self, pa: u64, len: usize) -> Option<Arc<Chunk>> {
        self.release();
        read(&self.device.memory).resolve(self.client, pa, len).ok()
    }

    fn client(&self) -> ClientId {
        self.client
    }

    fn memory_generation(&self) -> u64 {
        self.device.memory_generation.get()
    }

    fn write_register(&mut self, reg: Register, value: u32) -> Result<RegisterWrite, Fault> {
        self.release();
        let nc = match reg {
            Register::Event { nc, .. }
            | Register::SemaphoreRead { nc, .. }
            | Register::SemaphoreSet { nc, .. }
            | Register::SemaphoreIncrement { nc, .. }
            | Register::SemaphoreDecrement { nc, .. }
            | Register::TxTailIncrement { nc, .. }
            | Register::RxTailIncrement { nc, .. } => nc,
        };
        let claim = self
            .device
            .nc_ref(nc)
            .and_then(|n| self.device.owner(n))
            .filter(|c| c.client == self.client)
            .ok_or(Fault::ForeignRegister { reg, nc })?;
        match reg {
            Register::TxTailIncrement { .. } | Register::RxTailIncrement { .. } => {
                Ok(RegisterWrite::Deferred)
            }
            _ => {
                claim
                    .registers
                    .write(reg, value)
                    .map_err(|source| Fault::Register { reg, source })?;
                let starts = matches!(
                    reg,
                    Register::SemaphoreIncrement { index, .. } | Register::SemaphoreSet { index, .. }
                        if index == SEM_INFERENCE_START
                );
                if let Some(n) = self.device.nc_ref(nc) {
                    self.device.registers_changed(n, starts);
                }
                Ok(RegisterWrite::Done)
            }
        }
    }

    fn write_dmem(&mut self, nc: u32, offset: u64, data: &[u8]) -> Result<(), Fault> {
        self.release();
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let pa = self.device.map.dmem_address(nc, offset);
        let foreign = || Fault::ForeignDmem { pa, len, nc };
        let n = self.device.nc_ref(nc).ok_or_else(foreign)?;
        if !self.device.owned_by(n, self.client) {
            return Err(foreign());
        }
        let start = usize::try_from(offset).map_err(|_| foreign())?;
        let mut dmem = lock(&n.dmem);
        let slot = start
            .checked_add(data.len())
            .and_then(|end| dmem.get_mut(start..end))
            .ok_or_else(foreign)?;
        slot.copy_from_slice(data);
        Ok(())
    }

    fn owns_nc(&self, nc: u32) -> bool {
        self.device
            .nc_ref(nc)
            .is_some_and(|n| self.device.owned_by(n, self.client))
    }

    fn with_sbuf<T>(
        &self,
        (nc, partition, offset): (u32, u32, u64),
        len: usize,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, Fault> {
        let n = self.sbuf_nc(nc, partition, offset, len)?;
        let held = self.sbuf(n, nc);
        let out = held.compute.sbuf_bytes(partition, offset, len).map(read);
        self.keep(held);
        out.ok_or_else(|| self.sbuf_fault(nc, partition, offset, len))
    }

    fn with_sbuf_mut<T>(
        &mut self,
        (nc, partition, offset): (u32, u32, u64),
        len: usize,
        write: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, Fault> {
        let n = self.sbuf_nc(nc, partition, offset, len)?;
        let mut held = self.sbuf(n, nc);
        let out = held
            .compute
            .sbuf_bytes_mut(partition, offset, len)
            .map(write);
        self.keep(held);
        out.ok_or_else(|| self.sbuf_fault(nc, partition, offset, len))
    }

    fn schedule(&mut self, queue: DmaQueueId) {
        schedule(self.worklist, queue);
    }
}

impl<'a> ClientBus<'a> {
    fn sbuf_fault(&self, nc: u32, partition: u32, offset: u64, len: usize) -> Fault {
        Fault::ForeignSbuf {
            pa: self.device.map.sbuf_address(nc, partition, offset),
            len: u32::try_from(len).unwrap_or(u32::MAX),
            nc,
        }
    }

    /// NC `nc`, when the client owns it.
    fn sbuf_nc(&self, nc: u32, partition: u32, offset: u64, len: usize) -> Result<&'a Nc, Fault> {
        self.device
            .nc_ref(nc)
            .filter(|n| self.device.owned_by(n, self.client))
            .ok_or_else(|| self.sbuf_fault(nc, partition, offset, len))
    }
}

#[cfg(test)]
mod cache_tests;
#[cfg(test)]
mod tests;
