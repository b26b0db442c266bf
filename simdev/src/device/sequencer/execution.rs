//! One execution, from the count taken to the notification posted.
//!
//! Faults, timing and trace: each execution asks the fault table once, when it takes its
//! `compute_idx` ([`crate::faults`]); an [`Account`] follows it through the batch, the request
//! and the programs, counting what the latency model charges ([`crate::timing`]) and buffering
//! its trace events, which are handed to the tracer in one go when it ends.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared::protocol::LatencyModel;

use shared::address_map::Register;
use shared::exec_request::DeviceExecRequest;
use shared::notification::{NotificationEntry, NotificationKind, error_flags};
use shared::sequencer::{
    EXEC_QUEUE, EXEC_QUEUE_ENGINE, FIRST_RESERVED_SEMAPHORE, SEMAPHORE_LEAK_SOURCE,
};
use shared::udma::Direction;

use crate::counters::bump;
use crate::device::dispatch::panic_text;
use crate::device::dma_run::{Aborts, ClientBus};
use crate::device::sequencer::{self, BATCH_HEAD_PAIRS};
use crate::device::trace_events::TraceAt;
use crate::device::{Claim, Core, Nc, NcState, lock};
use crate::dma::{Abort, Budget, DmaQueueId, PairEffect, PeekError, QueueStatus, error_chain};
use crate::engines::{Limits, Progress, Stop};
use crate::faults::{Delivery, Effects};
use crate::memory::ChunkCache;
use crate::timing::{self, Charge};
use crate::trace::{Detail, Event};

use super::host::ExecHost;
use super::program::{Program, Running};
use super::thread::Work;

/// Nanoseconds of a duration, saturating.
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One execution's bookkeeping: what the latency model charges, where the trace's simulated
/// cursor is, and the trace events it buffers.
pub(super) struct Account {
    pub(super) compute_idx: u32,
    /// The latency model, `None` while device time follows the wall clock.
    pub(super) model: Option<LatencyModel>,
    pub(super) charge: Charge,
    /// Under a model, the simulated time at which the next traced step starts.
    pub(super) cursor: u64,
    /// The execution's trace events (`None` without a trace), at most `room` of them.
    pub(super) events: Option<Vec<Event>>,
    pub(super) room: usize,
    /// Events beyond `room`.
    pub(super) dropped: u64,
    /// The program's net signals on the program semaphores.
    pub(super) signals: ProgramSignals,
}

impl Account {
    pub(super) fn record(&mut self, nc: u32, ts_ns: u64, dur_ns: Option<u64>, detail: Detail) {
        if let Some(events) = &mut self.events {
            if events.len() < self.room {
                events.push(Event {
                    nc,
                    ts_ns,
                    dur_ns,
                    detail,
                });
            } else {
                self.dropped += 1;
            }
        }
    }

    /// Where a DMA run of this execution is traced.
    pub(super) fn trace_at(&self) -> TraceAt {
        if self.model.is_some() {
            TraceAt::Sim(self.cursor)
        } else {
            TraceAt::Now
        }
    }

    /// Charges a config reload (`config`) or a table load, and traces it: under a model as a
    /// span of its cost at the cursor, on the wall clock as a zero-length span at `wall_ns`.
    fn reload(&mut self, nc: u32, config: bool, wall_ns: u64) {
        if config {
            self.charge.config_reload = true;
        } else {
            self.charge.table_load = true;
        }
        if self.events.is_none() {
            return;
        }
        let detail = Detail::Reload {
            config,
            compute_idx: self.compute_idx,
        };
        match self.model {
            Some(model) => {
                let cost = if config {
                    model.per_config_reload_ns
                } else {
                    model.per_table_load_ns
                };
                let ts = self.cursor;
                self.cursor = ts.saturating_add(cost);
                self.record(nc, ts, Some(cost), detail);
            }
            None => self.record(nc, wall_ns, Some(0), detail),
        }
    }
}

/// An execution's duration and, under a latency model, its device timestamp.
#[derive(Clone, Copy, Debug)]
struct Timing {
    nc_ts_ns: u64,
    /// The device timestamp of the end: the wall clock's, or the NC's simulated clock.
    device_ts_ns: u64,
}

/// How an execution ended, as its notification tells it.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    compute_idx: u32,
    flags: u32,
    /// The notification's `source` ([`SEMAPHORE_LEAK_SOURCE`] | index for a leaked semaphore).
    source: u16,
}

/// What an execution's program signalled on each program semaphore (those below
/// [`FIRST_RESERVED_SEMAPHORE`]), net and wrapping: checked and undone when it ends (the
/// contract in [`shared::sequencer`], "What an execution leaves behind"). Only the program's
/// own signals count: the host may change a semaphore meanwhile (the outside world a waiting
/// engine waits for), and that is not the execution's doing.
pub(super) struct ProgramSignals {
    /// Net change per program semaphore.
    net: [u32; PROGRAM_SEMAPHORES],
    /// Bit `i` set: semaphore `i` was signalled (only those are looked at when it ends).
    touched: [u64; PROGRAM_SEMAPHORES.div_ceil(64)],
    /// Program semaphores of the arch (at most [`PROGRAM_SEMAPHORES`]).
    count: u32,
}

/// Semaphores below [`FIRST_RESERVED_SEMAPHORE`]: the most any arch gives programs.
const PROGRAM_SEMAPHORES: usize = FIRST_RESERVED_SEMAPHORE as usize;

impl ProgramSignals {
    fn new(arch: shared::address_map::Arch) -> Self {
        Self {
            net: [0; PROGRAM_SEMAPHORES],
            touched: [0; PROGRAM_SEMAPHORES.div_ceil(64)],
            count: FIRST_RESERVED_SEMAPHORE.min(arch.semaphores_per_nc()),
        }
    }

    /// The program added `value` (wrapping) to semaphore `index`.
    pub(super) fn add(&mut self, index: u32, value: u32) {
        if index >= self.count {
            return;
        }
        let Ok(i) = usize::try_from(index) else {
            return;
        };
        if let (Some(net), Some(word)) = (self.net.get_mut(i), self.touched.get_mut(i / 64)) {
            *net = net.wrapping_add(value);
            *word |= 1 << (i % 64);
        }
    }

    /// Undoes the net change of every program semaphore the execution left changed, each
    /// logged naming it; the lowest such index, if any.
    fn check_and_restore(&self, nc: u32, compute_idx: u32, claim: &Claim) -> Option<u16> {
        let mut first = None;
        for (w, &word) in self.touched.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let net = self.net.get(i).copied().unwrap_or(0);
                if net == 0 {
                    continue;
                }
                let Ok(index) = u32::try_from(i) else {
                    continue;
                };
                let delta = i32::from_ne_bytes(net.to_ne_bytes());
                tracing::warn!(
                    "NC {nc} execution {compute_idx} failed: its program left semaphore {index} \
                     changed by {delta}; restored"
                );
                if let Err(e) = claim.registers.semaphore_sub(index, net) {
                    tracing::error!("NC {nc}: restoring semaphore {index}: {e}");
                }
                first = first.or(u16::try_from(index).ok());
            }
        }
        first
    }
}

/// DMA aborts collected during an execution as one failure: DMA_ABORT, plus OOB when any of
/// them was an access outside the client's memory.
pub(super) fn dma_failure(aborts: &[Abort]) -> Option<Stop> {
    let first = aborts.first()?;
    let mut flags = error_flags::DMA_ABORT;
    if aborts.iter().any(|a| a.oob) {
        flags |= error_flags::OOB;
    }
    let more = match aborts.len() {
        1 => String::new(),
        n => format!(" (and {} more aborts)", n - 1),
    };
    Some(Stop::failed(flags, format!("{}{more}", first.reason)))
}

/// One execution in flight, from its count taken to its notification: everything it needs to
/// go on, so that an execution suspended at a park on the doorbell's thread resumes on the
/// NC's sequencer thread ([`Core::resume`]).
pub(in crate::device) struct Execution {
    work: Work,
    started: Instant,
    /// Device time at the start (the trace's and the fault events' timestamp).
    start_ns: u64,
    effects: Effects,
    acct: Account,
    budget: Budget,
    /// The program in progress, once the batch ran and the request was decoded.
    running: Option<Running>,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution")
            .field("compute_idx", &self.acct.compute_idx)
            .field("epoch", &self.work.epoch)
            .finish_non_exhaustive()
    }
}

/// How far [`Core::execute`] or [`Core::resume`] took an execution.
pub(in crate::device) enum Ran {
    /// It ended: its notification is posted (or withheld, or it was abandoned). With the
    /// claim it ran for (the role's next look at the semaphore uses it).
    Ended(Arc<Claim>),
    /// It waits for the outside world and this thread may not sleep: resume it on the
    /// sequencer thread.
    Suspended(Box<Execution>),
}

/// How an execution's run ended, before its notification.
enum RunEnd {
    /// It ran to its end (or failed) with these error flags.
    Flags(u32),
    /// It was abandoned: no notification.
    Abandoned,
    /// It was suspended at a park.
    Suspended,
}

impl Core {
    /// Runs one execution and posts its notification (unless it is abandoned), applying the
    /// faults that fire on it, the latency model, and tracing it. With `may_sleep` false (the
    /// doorbell's thread) an execution that must wait for the outside world is suspended
    /// instead and returned, for the sequencer thread to resume. `reads`: the NC's read cache,
    /// which the sequencer role holds.
    pub(super) fn execute(
        &self,
        nc: &Nc,
        work: Work,
        may_sleep: bool,
        reads: &mut ChunkCache,
    ) -> Ran {
        let started = Instant::now();
        let compute_idx = {
            let mut state = lock(&nc.state);
            if self.abandoned(nc, work.epoch) {
                return Ran::Ended(work.claim);
            }
            let idx = state.exec_batches;
            state.exec_batches = idx.wrapping_add(1);
            idx
        };
        let effects = self.fire_faults(nc, compute_idx);
        if effects.device_lost {
            self.lose_device(nc, compute_idx);
            return Ran::Ended(work.claim);
        }
        let model = self.latency_model();
        let sim_start = nc.clock.now();
        let start_ns = if model.is_some() {
            sim_start
        } else {
            self.since_start_ns(started)
        };
        let tracing = self.tracer.enabled();
        // Built in place (the account's semaphore table is a kilobyte: no moves of it).
        let mut exec = Execution {
            work,
            started,
            start_ns,
            acct: Account {
                compute_idx,
                model,
                charge: Charge {
                    extra_ns: effects.extra_ns,
                    ..Charge::default()
                },
                cursor: sim_start.saturating_add(model.map_or(0, |m| m.per_execution_ns)),
                events: tracing.then(Vec::new),
                room: if tracing { self.tracer.room() } else { 0 },
                dropped: 0,
                signals: ProgramSignals::new(self.map.arch),
            },
            effects,
            budget: self.budget(),
            running: None,
        };
        for &kind in &exec.effects.kinds {
            exec.acct.record(
                nc.index,
                start_ns,
                None,
                Detail::Fault { kind, compute_idx },
            );
        }
        match self.go_on(nc, &mut exec, may_sleep, reads) {
            true => Ran::Ended(exec.work.claim),
            false => Ran::Suspended(Box::new(exec)),
        }
    }

    /// Resumes an execution a doorbell's thread suspended; on the sequencer thread, which may
    /// sleep, it runs to its end.
    pub(super) fn resume(&self, nc: &Nc, mut exec: Box<Execution>, reads: &mut ChunkCache) {
        if !self.go_on(nc, &mut exec, true, reads) {
            tracing::error!(
                "NC {}: execution {} suspended on the sequencer thread (a simdev bug); abandoned",
                nc.index,
                exec.acct.compute_idx
            );
        }
    }

    /// Runs `exec` on; `false` when it was suspended at a park (only when `!may_sleep`).
    fn go_on(
        &self,
        nc: &Nc,
        exec: &mut Execution,
        may_sleep: bool,
        reads: &mut ChunkCache,
    ) -> bool {
        let compute_idx = exec.acct.compute_idx;
        match self.run_and_flag(nc, exec, may_sleep, reads) {
            RunEnd::Suspended => return false,
            RunEnd::Abandoned => {}
            RunEnd::Flags(flags) => {
                let leaked =
                    exec.acct
                        .signals
                        .check_and_restore(nc.index, compute_idx, &exec.work.claim);
                let flags = flags | exec.effects.flags | leaked.map_or(0, |_| error_flags::GENERIC);
                let timing = self.time_execution(nc, exec.work.epoch, exec.started, &exec.acct);
                exec.acct.record(
                    nc.index,
                    exec.start_ns,
                    Some(timing.nc_ts_ns),
                    Detail::Execution {
                        compute_idx,
                        flags,
                        instructions: exec.acct.charge.instructions,
                    },
                );
                let source = leaked.map_or(0, |index| SEMAPHORE_LEAK_SOURCE | index);
                let outcome = Outcome {
                    compute_idx,
                    flags,
                    source,
                };
                self.finish_execution(nc, &exec.work, outcome, timing, &exec.effects);
            }
        }
        if let Some(events) = exec.acct.events.take() {
            self.tracer.record_all(events, exec.acct.dropped);
        }
        true
    }

    /// The faults that fire on execution `compute_idx` of `nc`, counted and logged.
    fn fire_faults(&self, nc: &Nc, compute_idx: u32) -> Effects {
        if !self.faults_armed() {
            return Effects::default();
        }
        let kinds = self.with_faults(|f| f.on_execution(nc.index));
        if kinds.is_empty() {
            return Effects::default();
        }
        let effects = Effects::of(kinds);
        bump(&nc.counters.faults_fired, effects.count());
        for kind in &effects.kinds {
            tracing::info!(
                "NC {} execution {compute_idx}: injected fault {kind:?} fires",
                nc.index
            );
        }
        effects
    }

    /// An injected DeviceLost fault fired on execution `compute_idx` of `nc`: posts DeviceLost
    /// to every claimed NC (the execution gets no notification of its own), then runs the
    /// lost hook (the server removes its socket and stops; simdev exits with status 3).
    fn lose_device(&self, nc: &Nc, compute_idx: u32) {
        tracing::warn!(
            "NC {} execution {compute_idx}: injected DeviceLost fault: the device is lost",
            nc.index
        );
        if self.tracer.enabled() {
            self.tracer.record(Event {
                nc: nc.index,
                ts_ns: self.device_time_ns(nc),
                dur_ns: None,
                detail: Detail::Fault {
                    kind: shared::protocol::FaultKind::DeviceLost,
                    compute_idx,
                },
            });
        }
        self.device_lost();
        let hook = lock(&self.lost_hook).clone();
        if let Some(hook) = hook {
            (hook.0)();
        }
    }

    /// The duration of a finished execution (after sleeping what the model or an ExtraLatency
    /// fault asks for) and, under a model, its device timestamp (the NC's clock advanced by the
    /// duration).
    fn time_execution(&self, nc: &Nc, epoch: u64, started: Instant, acct: &Account) -> Timing {
        let cut = || self.epoch_moved(nc, epoch);
        match acct.model {
            None => {
                // Device time is the wall clock: extra latency is real time.
                if acct.charge.extra_ns > 0 {
                    nc.seq
                        .sleep(Duration::from_nanos(acct.charge.extra_ns), cut);
                }
                // One clock read for both: the NC's duration and the device timestamp.
                let ended = Instant::now();
                Timing {
                    nc_ts_ns: nanos(ended.saturating_duration_since(started)),
                    device_ts_ns: self.since_start_ns(ended),
                }
            }
            Some(model) => {
                let duration = timing::duration_ns(&model, &acct.charge);
                if model.wall_clock_pacing {
                    let left = Duration::from_nanos(duration).saturating_sub(started.elapsed());
                    nc.seq.sleep(left, cut);
                }
                Timing {
                    nc_ts_ns: duration,
                    device_ts_ns: nc.clock.advance(duration),
                }
            }
        }
    }

    /// Runs the execution on: its error flags, or whether it was abandoned or suspended.
    fn run_and_flag(
        &self,
        nc: &Nc,
        exec: &mut Execution,
        may_sleep: bool,
        reads: &mut ChunkCache,
    ) -> RunEnd {
        let compute_idx = exec.acct.compute_idx;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.run_execution(nc, exec, may_sleep, reads)
        }))
        .unwrap_or_else(|payload| {
            Err(Stop::generic(format!(
                "simdev failed internally running the execution (a simdev bug): {}",
                panic_text(payload.as_ref())
            )))
        });
        let flags = match outcome {
            Ok(Progress::Suspended) => return RunEnd::Suspended,
            Ok(Progress::Done(stats)) if stats.non_finite > 0 => {
                tracing::warn!(
                    "NC {} execution {compute_idx} done with a numerical error: {} compute \
                     instructions (or reference outputs) wrote a NaN or an infinity",
                    nc.index,
                    stats.non_finite
                );
                error_flags::NUMERICAL
            }
            Ok(Progress::Done(stats)) => {
                tracing::debug!(
                    "NC {} execution {compute_idx} done: {:?} instructions, {} rounds, {} parks",
                    nc.index,
                    stats.instructions,
                    stats.rounds,
                    stats.parks
                );
                0
            }
            Err(Stop::Failed { flags, reason }) => {
                tracing::warn!(
                    "NC {} execution {compute_idx} failed (error flags {flags:#x}): {reason}",
                    nc.index
                );
                flags
            }
            Err(Stop::Abandoned) => {
                tracing::info!(
                    "NC {} execution {compute_idx} abandoned (NC reset, released or reclaimed, \
                     or the device is going away)",
                    nc.index
                );
                return RunEnd::Abandoned;
            }
        };
        RunEnd::Flags(flags)
    }

    /// Applies the faults' effects on the notification (a DMA abort stops the exec queue
    /// first), counts the execution and posts its notification (now, later or never), unless
    /// it was abandoned meanwhile.
    fn finish_execution(
        &self,
        nc: &Nc,
        work: &Work,
        outcome: Outcome,
        timing: Timing,
        effects: &Effects,
    ) {
        let Outcome {
            compute_idx,
            flags,
            source,
        } = outcome;
        let epoch = work.epoch;
        let mut state = lock(&nc.state);
        if self.abandoned(nc, epoch) {
            return;
        }
        if effects.stop_exec_queue {
            abort_exec_queue(nc, &mut state, compute_idx);
        }
        let entry = NotificationEntry {
            compute_idx,
            kind: NotificationKind::Execution as u16,
            source,
            error_flags: flags,
            phase: 0,
            device_ts_ns: timing.device_ts_ns,
            nc_ts_ns: timing.nc_ts_ns,
        };
        match effects.delivery {
            // Not abandoned: the execution's claim is still the NC's owner (see
            // `Core::reset_nc`), signalled without looking the owner up.
            Delivery::OnTime => self.post_execution(nc, &mut state, &entry, Some(&work.claim)),
            Delivery::Missing => tracing::info!(
                "NC {} execution {compute_idx}: notification withheld (injected \
                 MissingCompletion)",
                nc.index
            ),
            Delivery::Late(delay) => {
                drop(state);
                self.post_late(nc, epoch, entry, delay);
            }
        }
    }

    /// Counts an execution and posts its notification, signalling `owner` (the NC's owner,
    /// known to the caller) or, when `None`, the owner it looks up.
    fn post_execution(
        &self,
        nc: &Nc,
        state: &mut NcState,
        entry: &NotificationEntry,
        owner: Option<&Arc<Claim>>,
    ) {
        state.posted.executions += 1;
        if entry.error_flags != 0 {
            state.posted.exec_errors += 1;
        }
        self.post_to(nc, state, entry, owner);
    }

    /// Posts an execution's notification `delay` of wall-clock time from now, from a thread of
    /// its own, unless the execution is abandoned by then (NC reset, release or reclaim, the
    /// device lost or dropped).
    fn post_late(&self, nc: &Nc, epoch: u64, entry: NotificationEntry, delay: Duration) {
        let index = nc.index;
        let compute_idx = entry.compute_idx;
        tracing::info!(
            "NC {index} execution {compute_idx}: notification delayed by {delay:?} (injected \
             LateCompletion)"
        );
        let core = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("simdev-late-nc{index}"))
            .spawn(move || {
                std::thread::sleep(delay);
                let Some(core) = core.upgrade() else {
                    return;
                };
                let Some(nc) = core.nc_ref(index) else {
                    return;
                };
                let mut state = lock(&nc.state);
                if core.abandoned(nc, epoch) {
                    tracing::info!(
                        "NC {index} execution {compute_idx}: late notification abandoned"
                    );
                    return;
                }
                core.post_execution(nc, &mut state, &entry, None);
            });
        if let Err(e) = spawned {
            tracing::error!(
                "NC {index}: starting the late-completion thread: {e}; posting at once"
            );
            let mut state = lock(&nc.state);
            if !self.abandoned(nc, epoch) {
                self.post_execution(nc, &mut state, &entry, None);
            }
        }
    }

    /// The batch, the request, the programs (on a resumed execution: the program, on), with
    /// the NC's read cache `reads` in hand (the sequencer role's: see
    /// [`crate::device::sequencer::thread`]).
    fn run_execution(
        &self,
        nc: &Nc,
        exec: &mut Execution,
        may_sleep: bool,
        reads: &mut ChunkCache,
    ) -> Result<Progress, Stop> {
        if exec.running.is_none() {
            // Started in place: the engines' state is half a kilobyte.
            let program = self.start_program(nc, exec, reads)?;
            exec.running = Some(program.start());
        }
        let Execution {
            work,
            acct,
            budget,
            running: Some(running),
            ..
        } = exec
        else {
            return Err(Stop::generic("the execution has no program (a simdev bug)"));
        };
        let mut host = ExecHost {
            core: self,
            nc,
            claim: &work.claim,
            epoch: work.epoch,
            budget,
            acct,
            reads,
            reference_used: false,
            may_sleep,
        };
        let progress = running.resume(&Limits::for_arch(self.map.arch), &mut host);
        let reference_used = host.reference_used;
        let progress = progress?;
        if let Progress::Done(_) = progress {
            if reference_used {
                bump(&nc.counters.neff_reference_executions, 1);
            } else if matches!(running, Running::Neff { .. }) {
                bump(&nc.counters.neff_shape_only_executions, 1);
            }
        }
        Ok(progress)
    }

    /// Runs the batch, decodes the request, honours its reload flags and checks its model
    /// switch: the program it names.
    fn start_program(
        &self,
        nc: &Nc,
        exec: &mut Execution,
        reads: &mut ChunkCache,
    ) -> Result<Program, Stop> {
        let work = &exec.work;
        let acct = &mut exec.acct;
        self.run_batch(nc, work, &mut exec.budget, acct.trace_at(), reads)?;
        let request = DeviceExecRequest::decode(&lock(&nc.dmem))
            .ok_or_else(|| Stop::generic("the DMEM is smaller than a request"))?;
        let program = Program::of_request(&request)?;
        if shared::neff_program::reload_requested(&request) {
            bump(&nc.counters.config_reloads, 1);
            acct.reload(nc.index, true, self.now_ns());
        }
        if request.load_act_dve_tables == 1 {
            bump(&nc.counters.table_loads, 1);
            acct.reload(nc.index, false, self.now_ns());
            let mut compute = lock(&nc.compute);
            if self.epoch_moved(nc, work.epoch) {
                return Err(Stop::Abandoned);
            }
            compute.set_tables_loaded(true);
        }
        let addresses = shared::exec_request::Engine::ALL.map(|e| request.engine_address(e));
        {
            let mut compute = lock(&nc.compute);
            sequencer::check_model_switch(compute.program(), &request).map_err(Stop::generic)?;
            compute.set_program(addresses);
        }
        Ok(program)
    }

    /// Fetches, checks and runs one batch of the exec queue (see [`crate::device::sequencer`]); its
    /// DMA is traced at `at`.
    fn run_batch(
        &self,
        nc: &Nc,
        work: &Work,
        budget: &mut Budget,
        at: TraceAt,
        reads: &mut ChunkCache,
    ) -> Result<(), Stop> {
        let (engine, queue) = (EXEC_QUEUE_ENGINE, EXEC_QUEUE);
        let client = work.claim.client;
        let (m, cc) = {
            let mut state = lock(&nc.state);
            if self.abandoned(nc, work.epoch) {
                return Err(Stop::Abandoned);
            }
            let m = self.stage_batch(nc, &mut state, work, at, reads)?;
            let mut worklist = VecDeque::new();
            let bus = ClientBus::new(self, client, &mut worklist);
            // Pairs 1–3 are consumed: the chain starts at the heads.
            let cc = m > 0
                && state
                    .queues
                    .peek(engine, queue, m - 1, &bus)
                    .is_ok_and(|last| sequencer::is_cc_poke(nc.index, &last));
            (m, cc)
        };
        if m == 0 {
            return Ok(());
        }
        let mut aborts = Vec::new();
        let exec_queue = DmaQueueId {
            nc: nc.index,
            engine,
            queue,
        };
        self.run_dma_with(
            client,
            exec_queue,
            budget,
            &mut Aborts::Capture(&mut aborts),
            at,
        );
        if let Some(Stop::Failed { reason, .. }) = dma_failure(&aborts) {
            return Err(Stop::generic(format!(
                "the exec batch's chain of {m} pairs aborted: {reason}"
            )));
        }
        if cc {
            bump(&nc.counters.cc_chains, 1);
        }
        Ok(())
    }

    /// Reads and checks pairs 1–3 of the batch at the head of the exec queue and, when they are
    /// right, executes and consumes them (posting the chain's `M` pairs); returns `M`. A batch
    /// that is missing or malformed stops the exec queue.
    fn stage_batch(
        &self,
        nc: &Nc,
        state: &mut NcState,
        work: &Work,
        at: TraceAt,
        reads: &mut ChunkCache,
    ) -> Result<u32, Stop> {
        let wall_ns = if self.tracer.enabled() {
            self.now_ns()
        } else {
            0
        };
        let (engine, queue) = (EXEC_QUEUE_ENGINE, EXEC_QUEUE);
        let malformed = |state: &mut NcState, why: String| {
            let reason = format!("malformed exec batch on NC {}: {why}", nc.index);
            state.queues.stop_with(engine, queue, reason.clone());
            Stop::generic(reason)
        };
        match state.queues.pending(engine, queue) {
            None => {
                return Err(Stop::generic(format!(
                    "NC {}: the exec queue (DMA engine {engine} queue {queue}) is not initialised",
                    nc.index
                )));
            }
            Some((0, 0, false)) => {}
            Some((tx, rx, _)) => {
                return Err(malformed(
                    state,
                    format!(
                        "{tx} TX and {rx} RX descriptors were already posted on the exec queue \
                         (the sequencer fetches its batches itself)"
                    ),
                ));
            }
        }
        // The NC's reused buffer: taken out so `state` stays free to borrow, put back on every
        // path that does not stop the queue (a malformed batch may allocate a new one).
        let mut pairs = std::mem::take(&mut state.batch_pairs);
        pairs.clear();
        let trailer;
        {
            let mut worklist = VecDeque::new();
            let bus = ClientBus::new(self, work.claim.client, &mut worklist);
            for k in 0..BATCH_HEAD_PAIRS {
                match state.queues.peek(engine, queue, k, &bus) {
                    Ok(pair) => pairs.push(pair),
                    // A pair that cannot be read is reported as such only when the pairs
                    // before it are right; else as what stands in the first wrong one's place
                    // (`check_batch` checks in order and stops at the first wrong pair: a
                    // prefix fails exactly when the whole does, at the same pair).
                    Err(_)
                        if !pairs.is_empty()
                            && sequencer::check_batch(nc.index, &pairs).is_err() =>
                    {
                        break;
                    }
                    Err(PeekError::Queue(e)) => {
                        return Err(Stop::generic(format!(
                            "NC {}: no exec batch: {e}",
                            nc.index
                        )));
                    }
                    Err(PeekError::Fault(fault)) => {
                        let reason = state
                            .queues
                            .abort(engine, queue, &fault)
                            .map_or_else(|| error_chain(&fault), |abort| abort.reason);
                        return Err(Stop::generic(format!(
                            "exec batch descriptor pair {} of 4: {reason}",
                            k + 1
                        )));
                    }
                }
            }
            trailer = self.read_cc_dma_increment(reads, work.claim.client, &pairs);
        }
        let m = match sequencer::check_batch(nc.index, &pairs) {
            Ok(Some(m)) => m,
            Ok(None) => return Err(malformed(state, "an incomplete batch".to_owned())),
            Err(why) => return Err(malformed(state, why)),
        };
        if let Err(why) = sequencer::check_trailer(m, trailer) {
            return Err(malformed(state, why));
        }
        let (tx_size, rx_size) = state.queues.ring_sizes(engine, queue).unwrap_or((0, 0));
        if m > tx_size.min(rx_size) {
            return Err(malformed(
                state,
                format!("a chain of {m} pairs does not fit the exec queue's rings"),
            ));
        }
        let mut consumed = [(0, false); BATCH_HEAD_PAIRS as usize];
        for (pair, consumed) in pairs.iter().zip(&mut consumed) {
            let register = match &pair.effect {
                PairEffect::Dmem { offset, data, .. } => {
                    let start = usize::try_from(*offset).unwrap_or(usize::MAX);
                    let mut dmem = lock(&nc.dmem);
                    if let Some(slot) = start
                        .checked_add(data.len())
                        .and_then(|end| dmem.get_mut(start..end))
                    {
                        slot.copy_from_slice(data);
                    }
                    false
                }
                PairEffect::Register {
                    reg: Register::Event { index, .. },
                    value,
                } => {
                    if let Err(e) = work.claim.registers.event_set(*index, *value) {
                        tracing::error!("NC {}: request-load event: {e}", nc.index);
                    }
                    true
                }
                // The tail increments: applied below, as one post of M on both rings.
                PairEffect::Register { .. } | PairEffect::Copy { .. } | PairEffect::Sbuf { .. } => {
                    true
                }
            };
            *consumed = (pair.len, register);
        }
        state
            .queues
            .consume_heads(engine, queue, consumed.into_iter().take(pairs.len()));
        if self.tracer.enabled() {
            let bytes = pairs.iter().map(|p| u64::from(p.len)).sum();
            let id = DmaQueueId {
                nc: nc.index,
                engine,
                queue,
            };
            let count = u64::try_from(pairs.len()).unwrap_or(u64::MAX);
            self.trace_dma(nc, id, count, bytes, true, at, wall_ns);
        }
        state.batch_pairs = pairs;
        if m > 0 {
            state
                .queues
                .tail_increment(engine, queue, Direction::Rx, m)
                .and_then(|()| state.queues.tail_increment(engine, queue, Direction::Tx, m))
                .map_err(|e| malformed(state, e.to_string()))?;
        }
        Ok(m)
    }
}

impl Core {
    /// The request slot's `cc_dma_increment` trailer: the 4-byte word
    /// [`CC_DMA_INCREMENT_OFFSET`](shared::exec_request::CC_DMA_INCREMENT_OFFSET) past pair 1's
    /// source, if pair 1 reads `client`'s memory and the word is in it.
    fn read_cc_dma_increment(
        &self,
        reads: &mut ChunkCache,
        client: crate::client::ClientId,
        pairs: &[crate::dma::PeekedPair],
    ) -> Option<u32> {
        let offset = u64::try_from(shared::exec_request::CC_DMA_INCREMENT_OFFSET).ok()?;
        let pa = pairs.first()?.src_pa?.checked_add(offset)?;
        let chunk = self.resolve_in(reads, client, pa, 4)?;
        let mut word = [0u8; 4];
        chunk.memory().read(pa, &mut word).ok()?;
        Some(u32::from_le_bytes(word))
    }
}

/// Stops `nc`'s exec queue for an injected DmaAbort fault on execution `compute_idx`, as a
/// DMA abort would (counted in `dma_aborts`); later counts fail fast until a new
/// DMA_QUEUE_INIT. Nothing to stop when the queue is not running.
fn abort_exec_queue(nc: &Nc, state: &mut NcState, compute_idx: u32) {
    let (engine, queue) = (EXEC_QUEUE_ENGINE, EXEC_QUEUE);
    if state.queues.status(engine, queue) != Some(&QueueStatus::Running) {
        return;
    }
    let reason = format!(
        "DMA abort on NC {} engine {engine} queue {queue}: injected DmaAbort fault on execution \
         {compute_idx}",
        nc.index
    );
    tracing::warn!("{reason}");
    state.queues.stop_aborted(engine, queue, reason);
}
