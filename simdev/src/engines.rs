//! The five engines of an NC running one execution's programs (DESIGN §5–§6,
//! [`shared::isa`]).
//!
//! Each of PE, ACT, POOL, DVE and SP has a program counter that starts at its instruction-block
//! address from the `device_exec_request` and steps through 64-byte [`Instruction`]s. A
//! deterministic round-robin scheduler gives every unfinished engine one step per round, in
//! [`Engine::ALL`] order; there are no threads per engine. One step of an engine:
//!
//! 1. fetch the instruction at its PC (once per PC; [`Host::fetch`] resolves it in the client's
//!    memory);
//! 2. check it completely: a defined opcode, an opcode its engine may run (`DmaStart`,
//!    `DmaWait` and `WaitEvent` are SP-only), semaphore indices below
//!    [`FIRST_RESERVED_SEMAPHORE`] (the rest belong to the sequencer), engine/queue/event
//!    operands inside the arch's counts, `DmaStart` of at least one descriptor and not of the
//!    exec queue, a compute instruction passing every check of [`compute::decode`] (its
//!    engine, tiles, shapes and operand words), and at most [`MAX_PROGRAM_INSTRUCTIONS`]
//!    executed by the engine;
//! 3. with [`FLAG_WAIT`], the engine is *blocked* while `semaphore < wait_value` (the
//!    semaphore read as the i32 it is on silicon, `wait_value` as an unsigned threshold); a
//!    `WaitEvent` is blocked while its event register is zero (it does not clear it);
//! 4. otherwise execute it (`Nop`; `End`; `DmaStart`/`DmaWait` through the [`Host`]; a
//!    compute instruction with [`compute::execute`] on the NC's [`ComputeState`], which
//!    [`Host::compute`] lends), then apply [`FLAG_SIGNAL`] (`semaphore += signal_value`,
//!    wrapping) and advance (an `End` finishes the engine instead).
//!
//! A compute instruction that writes a NaN or an infinity does not stop the execution: it is
//! counted in [`Stats::non_finite`], and the execution's notification carries
//! [`error_flags::NUMERICAL`] (added to the flags of a failure that ends it later, too). An
//! `Activation` while the NC's activation tables are not loaded fails with GENERIC.
//!
//! A round in which no engine made progress ends the execution: with GENERIC ("deadlock")
//! when no blocked engine waits on an event, or parks it ([`Host::park`]) until a semaphore or
//! event of the NC changes when one does — waiting for the outside world is never a deadlock.
//!
//! The interpreter is pure: every effect goes through [`Host`], which the device implements
//! for one execution and the unit tests fake.

use std::fmt;
use std::time::Instant;

use shared::address_map::Arch;
use shared::exec_request::Engine;
use shared::isa::{
    FLAG_SIGNAL, FLAG_WAIT, INSTRUCTION_SIZE, Instruction, MAX_PROGRAM_INSTRUCTIONS, Opcode,
};
use shared::notification::error_flags;
use shared::sequencer::{EXEC_QUEUE, EXEC_QUEUE_ENGINE, FIRST_RESERVED_SEMAPHORE};

use crate::compute::{self, ComputeState};

/// Why an execution stopped before every engine ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The execution failed: the notification's error flags and a sentence for the log.
    Failed {
        /// [`error_flags`] bits (never 0).
        flags: u32,
        /// What went wrong, naming the engine, address or index.
        reason: String,
    },
    /// The NC was reset, released or reclaimed, or the device is going away: the execution
    /// ends without a notification.
    Abandoned,
}

impl Stop {
    /// A failure with `flags`.
    pub fn failed(flags: u32, reason: impl Into<String>) -> Self {
        Self::Failed {
            flags,
            reason: reason.into(),
        }
    }

    /// A failure with [`error_flags::GENERIC`].
    pub fn generic(reason: impl Into<String>) -> Self {
        Self::failed(error_flags::GENERIC, reason)
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { flags, reason } => write!(f, "{reason} (error flags {flags:#x})"),
            Self::Abandoned => f.write_str("abandoned"),
        }
    }
}

/// The counts the interpreter checks operands against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Programs may wait on and signal semaphores `0..semaphores`.
    pub semaphores: u32,
    /// Events per NC.
    pub events: u32,
    /// DMA engines per NC.
    pub dma_engines: u32,
    /// Queues per DMA engine.
    pub dma_queues: u32,
    /// Most instructions one engine may execute in one execution.
    pub max_instructions: u32,
    /// Most compute work (element operations, [`compute::Op::cost`]) all engines together may
    /// do in one execution: about a second of matmul on one core, so a hostile program of a
    /// million maximal instructions ends with an error instead of occupying the NC for hours.
    pub max_compute_ops: u64,
}

/// The default [`Limits::max_compute_ops`]: 2^36 element operations.
pub const MAX_COMPUTE_OPS: u64 = 1 << 36;

impl Limits {
    /// The limits of `arch`: semaphores below [`FIRST_RESERVED_SEMAPHORE`], the arch's event and
    /// DMA counts, [`MAX_PROGRAM_INSTRUCTIONS`].
    pub fn for_arch(arch: Arch) -> Self {
        Self {
            semaphores: FIRST_RESERVED_SEMAPHORE.min(arch.semaphores_per_nc()),
            events: arch.events_per_nc(),
            dma_engines: arch.dma_engines_per_nc(),
            dma_queues: arch.dma_queues_per_engine(),
            max_instructions: MAX_PROGRAM_INSTRUCTIONS,
            max_compute_ops: MAX_COMPUTE_OPS,
        }
    }
}

/// The rest of the device as one execution's engines see it.
pub trait Host {
    /// The instruction at `pa`, for `engine`.
    ///
    /// # Errors
    /// A [`Stop`] (OOB|GENERIC when `pa..pa+64` is not inside one chunk of the client).
    fn fetch(&mut self, engine: Engine, pa: u64) -> Result<Instruction, Stop>;

    /// The value of semaphore `index` (in range).
    fn semaphore(&mut self, index: u32) -> u32;

    /// Adds `value` to semaphore `index` (in range), atomically and wrapping.
    fn signal(&mut self, index: u32, value: u32);

    /// The value of event `index` (in range).
    fn event(&mut self, index: u32) -> u32;

    /// `DmaStart`: posts `count` descriptors on the RX then TX ring of (`engine`, `queue`) (in
    /// range, not the exec queue) and processes them.
    ///
    /// # Errors
    /// A [`Stop`]: GENERIC when the queue refuses the post, DMA_ABORT (with OOB when the
    /// cause was an address outside the client's memory) when processing aborted.
    fn dma_start(&mut self, engine: u32, queue: u32, count: u32) -> Result<(), Stop>;

    /// `DmaWait`: checks that (`engine`, `queue`) finished its posted descriptors.
    ///
    /// # Errors
    /// A [`Stop`]: DMA_ABORT when the queue was stopped by an abort, GENERIC when it is not
    /// initialised.
    fn dma_wait(&mut self, engine: u32, queue: u32) -> Result<(), Stop>;

    /// Runs `f` on the NC's compute state (SBUF, PSUM, activation-tables flag), exclusively.
    ///
    /// # Errors
    /// [`Stop::Abandoned`] when the execution must end now without a notification (the NC's
    /// state may already be cleared for its next owner; `f` did not run).
    fn compute<R>(&mut self, f: impl FnOnce(&mut ComputeState) -> R) -> Result<R, Stop>;

    /// Called before every scheduling round: a token that changes whenever a semaphore or
    /// event of the NC changes from outside the execution (compared by [`Host::park`]).
    ///
    /// # Errors
    /// [`Stop::Abandoned`] when the execution must end now without a notification.
    fn round(&mut self) -> Result<u64, Stop>;

    /// Every unfinished engine is blocked and at least one waits on an event: sleep until the
    /// NC's semaphores or events changed since `token` was taken (no busy loop) and answer
    /// [`Park::Woken`], or, when this thread must not sleep (it has other work: the doorbell's
    /// thread), answer [`Park::Suspend`] at once: [`Run::resume`] then returns
    /// [`Progress::Suspended`] and the run is resumed later, on a thread that may sleep.
    ///
    /// # Errors
    /// [`Stop::Abandoned`] when the NC was reset, released or reclaimed, or the device is
    /// going away, while parked.
    fn park(&mut self, token: u64) -> Result<Park, Stop>;

    /// Whether [`Host::retired`] wants the wall-clock time each step began (a trace on the
    /// wall clock); asked once per step.
    fn timed(&self) -> bool {
        false
    }

    /// `engine` executed `op` at `pc` (a step that was not blocked); `began` is when the step
    /// began, if [`Host::timed`] asked for it. Called for every executed instruction, so the
    /// host can count them (the latency model) and trace them.
    fn retired(&mut self, engine: Engine, op: Opcode, pc: u64, began: Option<Instant>) {
        let _ = (engine, op, pc, began);
    }
}

/// What a finished execution did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Instructions each engine executed, in [`Engine::ALL`] order.
    pub instructions: [u32; 5],
    /// Scheduling rounds run.
    pub rounds: u64,
    /// Times the execution parked waiting for the outside world.
    pub parks: u64,
    /// Compute instructions that wrote a NaN or an infinity — for a NEFF run by a reference,
    /// outputs that hold one (the execution's notification carries
    /// [`error_flags::NUMERICAL`] when this is not 0).
    pub non_finite: u64,
}

/// What [`Host::park`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Park {
    /// It slept until a semaphore or event changed: the scheduler runs another round.
    Woken,
    /// It did not sleep: the run stops here, to be resumed by [`Run::resume`].
    Suspend,
}

/// How far [`Run::resume`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every engine ended.
    Done(Stats),
    /// The run waits for the outside world and the host did not sleep ([`Park::Suspend`]):
    /// resume it later.
    Suspended,
}

/// What blocks an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    /// `FLAG_WAIT`: `semaphore[index] >= value` does not hold (it is `is`).
    Semaphore { index: u32, value: u32, is: u32 },
    /// `WaitEvent`: event `index` is zero.
    Event { index: u32 },
}

enum Step {
    Progress,
    Blocked(Block),
}

/// One engine's program state.
#[derive(Debug)]
struct EngineState {
    engine: Engine,
    pc: u64,
    executed: u32,
    current: Option<Current>,
    done: bool,
    non_finite: u64,
}

/// The instruction at an engine's program counter, fetched and checked once: an engine
/// blocked on it retries it every scheduling round without fetching or checking it again.
#[derive(Clone, Copy, Debug)]
struct Current {
    inst: Instruction,
    op: Opcode,
    /// The decoded operands of a compute instruction.
    compute: Option<compute::Op>,
}

/// Whether `semaphore >= wait_value`, the semaphore read as the i32 it is on silicon and the
/// wait value as an unsigned threshold.
fn wait_holds(semaphore: u32, wait_value: u32) -> bool {
    i64::from(i32::from_ne_bytes(semaphore.to_ne_bytes())) >= i64::from(wait_value)
}

/// Runs the five programs starting at `addresses` (in [`Engine::ALL`] order) to the end of
/// all of them, parking on `host` as often as they wait for the outside world.
///
/// # Errors
/// The [`Stop`] that ended the execution early (see the module doc for every cause), with
/// [`error_flags::NUMERICAL`] added when a compute instruction wrote a NaN or an infinity
/// before it; GENERIC when the host suspends the run (use [`Run`] with such a host).
pub fn run(addresses: [u64; 5], limits: &Limits, host: &mut impl Host) -> Result<Stats, Stop> {
    match Run::new(addresses).resume(limits, host)? {
        Progress::Done(stats) => Ok(stats),
        Progress::Suspended => Err(Stop::generic(
            "the host suspended a run that cannot be resumed (a simdev bug)",
        )),
    }
}

/// One execution's five programs in progress: the engines' program counters and what they
/// did so far. Plain data, so a run suspended on one thread ([`Park::Suspend`]) resumes on
/// another.
#[derive(Debug)]
pub struct Run {
    engines: [EngineState; 5],
    stats: Stats,
    /// Element operations of compute instructions so far (bounded by
    /// [`Limits::max_compute_ops`]).
    spent: u64,
}

impl Run {
    /// The programs at `addresses` (in [`Engine::ALL`] order), before their first instruction.
    pub fn new(addresses: [u64; 5]) -> Self {
        Self {
            engines: Engine::ALL.map(|engine| EngineState {
                engine,
                pc: addresses[engine.index()],
                executed: 0,
                current: None,
                done: false,
                non_finite: 0,
            }),
            stats: Stats::default(),
            spent: 0,
        }
    }

    /// Runs scheduling rounds until every engine ended, or the host suspends the run at a park
    /// ([`Progress::Suspended`]; call `resume` again, on any thread, to go on: the next round
    /// looks at the semaphores and events afresh, so no change is missed).
    ///
    /// # Errors
    /// As [`run`].
    pub fn resume(&mut self, limits: &Limits, host: &mut impl Host) -> Result<Progress, Stop> {
        let result = self.schedule(limits, host);
        let non_finite: u64 = self.engines.iter().map(|e| e.non_finite).sum();
        self.stats.non_finite = non_finite;
        match result {
            Ok(true) => Ok(Progress::Done(self.stats)),
            Ok(false) => Ok(Progress::Suspended),
            Err(Stop::Failed { flags, reason }) if non_finite > 0 => Err(Stop::Failed {
                flags: flags | error_flags::NUMERICAL,
                reason,
            }),
            Err(stop) => Err(stop),
        }
    }

    /// The scheduling rounds of [`Run::resume`]: `true` when every engine ended, `false` when
    /// the host suspended the run.
    fn schedule(&mut self, limits: &Limits, host: &mut impl Host) -> Result<bool, Stop> {
        loop {
            let token = host.round()?;
            self.stats.rounds += 1;
            let mut progressed = false;
            // At most one blocked engine per engine: no allocation per round.
            let mut blocked: [Option<(Engine, Block)>; 5] = [None; 5];
            for (slot, state) in blocked.iter_mut().zip(self.engines.iter_mut()) {
                if state.done {
                    continue;
                }
                match step(state, limits, &mut self.spent, host)? {
                    Step::Progress => progressed = true,
                    Step::Blocked(block) => *slot = Some((state.engine, block)),
                }
            }
            for state in &self.engines {
                self.stats.instructions[state.engine.index()] = state.executed;
            }
            if self.engines.iter().all(|e| e.done) {
                return Ok(true);
            }
            if progressed {
                continue;
            }
            if blocked
                .iter()
                .flatten()
                .any(|(_, block)| matches!(block, Block::Event { .. }))
            {
                self.stats.parks += 1;
                if host.park(token)? == Park::Suspend {
                    return Ok(false);
                }
            } else {
                let blocked: Vec<(Engine, Block)> = blocked.iter().flatten().copied().collect();
                return Err(Stop::generic(deadlock(&blocked)));
            }
        }
    }
}

fn deadlock(blocked: &[(Engine, Block)]) -> String {
    let waits: Vec<String> = blocked
        .iter()
        .map(|(engine, block)| match block {
            Block::Semaphore { index, value, is } => format!(
                "{} waits for semaphore {index} >= {value} (it is {})",
                engine.name(),
                i32::from_ne_bytes(is.to_ne_bytes())
            ),
            Block::Event { index } => format!("{} waits for event {index}", engine.name()),
        })
        .collect();
    format!(
        "deadlock: every unfinished engine is blocked on a semaphore: {}",
        waits.join("; ")
    )
}

/// Checks an instruction before it runs; the reason names the rule it breaks. Returns the
/// opcode and, for a compute instruction, its decoded operands.
fn check(
    engine: Engine,
    pc: u64,
    inst: &Instruction,
    limits: &Limits,
) -> Result<(Opcode, Option<compute::Op>), Stop> {
    let at = || format!("{} instruction at {pc:#x}", engine.name());
    let op = inst
        .op()
        .ok_or_else(|| Stop::generic(format!("{}: undefined opcode {:#04x}", at(), inst.opcode)))?;
    let sp_only = matches!(op, Opcode::DmaStart | Opcode::DmaWait | Opcode::WaitEvent);
    if sp_only && engine != Engine::Sp {
        return Err(Stop::generic(format!(
            "{}: {op:?} runs only on SP, not on {}",
            at(),
            engine.name()
        )));
    }
    let semaphore = |what: &str, index: u8| {
        if u32::from(index) < limits.semaphores {
            Ok(())
        } else {
            Err(Stop::generic(format!(
                "{}: {what} semaphore {index} is out of range (programs use 0..{}; the rest are \
                 the sequencer's)",
                at(),
                limits.semaphores
            )))
        }
    };
    if inst.flags & FLAG_WAIT != 0 {
        semaphore("wait", inst.wait_sem)?;
    }
    if inst.flags & FLAG_SIGNAL != 0 {
        semaphore("signal", inst.signal_sem)?;
    }
    let [a0, a1, ..] = inst.args;
    match op {
        Opcode::DmaStart | Opcode::DmaWait => {
            if a0 >= limits.dma_engines || a1 >= limits.dma_queues {
                return Err(Stop::generic(format!(
                    "{}: {op:?} of DMA engine {a0} queue {a1} is out of range (the NC has {} \
                     engines of {} queues)",
                    at(),
                    limits.dma_engines,
                    limits.dma_queues
                )));
            }
            if op == Opcode::DmaStart && inst.args[2] == 0 {
                return Err(Stop::generic(format!(
                    "{}: DmaStart of 0 descriptors (a tail increment must be at least 1)",
                    at()
                )));
            }
            if op == Opcode::DmaStart && (a0, a1) == (EXEC_QUEUE_ENGINE, EXEC_QUEUE) {
                return Err(Stop::generic(format!(
                    "{}: DmaStart of the exec queue (engine {a0} queue {a1}); only the \
                     sequencer posts it",
                    at()
                )));
            }
        }
        Opcode::WaitEvent => {
            if a0 >= limits.events {
                return Err(Stop::generic(format!(
                    "{}: WaitEvent of event {a0} is out of range (the NC has {})",
                    at(),
                    limits.events
                )));
            }
        }
        Opcode::Nop | Opcode::End => {}
        Opcode::Matmul
        | Opcode::Activation
        | Opcode::TensorTensor
        | Opcode::TensorScalar
        | Opcode::Reduce
        | Opcode::Copy
        | Opcode::Transpose
        | Opcode::Iota => {
            let decoded = compute::decode(engine, op, inst)
                .map_err(|rule| Stop::generic(format!("{}: {rule}", at())))?;
            return Ok((op, decoded));
        }
    }
    Ok((op, None))
}

/// One step of one engine.
fn step(
    state: &mut EngineState,
    limits: &Limits,
    spent: &mut u64,
    host: &mut impl Host,
) -> Result<Step, Stop> {
    let began = host.timed().then(Instant::now);
    if state.current.is_none() {
        let inst = host.fetch(state.engine, state.pc)?;
        let (op, compute) = check(state.engine, state.pc, &inst, limits)?;
        state.current = Some(Current { inst, op, compute });
    }
    // Read in place (a copy of the decoded instruction per step would cost more than most
    // instructions' work); `state`'s other fields stay writable beside it.
    let Some(Current {
        inst,
        op,
        compute: compute_op,
    }) = &state.current
    else {
        return Err(Stop::generic(format!(
            "{} instruction at {:#x} was not fetched (a simdev bug)",
            state.engine.name(),
            state.pc
        )));
    };
    let op = *op;
    if state.executed >= limits.max_instructions {
        return Err(Stop::generic(format!(
            "{} executed more than {} instructions",
            state.engine.name(),
            limits.max_instructions
        )));
    }
    if inst.flags & FLAG_WAIT != 0 {
        let index = u32::from(inst.wait_sem);
        let is = host.semaphore(index);
        if !wait_holds(is, inst.wait_value) {
            return Ok(Step::Blocked(Block::Semaphore {
                index,
                value: inst.wait_value,
                is,
            }));
        }
    }
    let [a0, a1, a2, ..] = inst.args;
    match op {
        Opcode::WaitEvent => {
            if host.event(a0) == 0 {
                return Ok(Step::Blocked(Block::Event { index: a0 }));
            }
        }
        Opcode::DmaStart => host.dma_start(a0, a1, a2)?,
        Opcode::DmaWait => host.dma_wait(a0, a1)?,
        Opcode::Nop | Opcode::End => {}
        Opcode::Matmul
        | Opcode::Activation
        | Opcode::TensorTensor
        | Opcode::TensorScalar
        | Opcode::Reduce
        | Opcode::Copy
        | Opcode::Transpose
        | Opcode::Iota => {
            let (engine, pc) = (state.engine, state.pc);
            let Some(compute_op) = compute_op else {
                return Err(Stop::generic(format!(
                    "{} instruction at {pc:#x}: {op:?} was not decoded (a simdev bug)",
                    engine.name()
                )));
            };
            *spent = spent.saturating_add(compute_op.cost());
            if *spent > limits.max_compute_ops {
                return Err(Stop::generic(format!(
                    "{} instruction at {pc:#x}: the execution exceeded its compute budget of {} element operations",
                    engine.name(),
                    limits.max_compute_ops
                )));
            }
            let effect = host
                .compute(|cs| compute::execute(cs, compute_op))?
                .map_err(|e| {
                    Stop::generic(format!("{} instruction at {pc:#x}: {e}", engine.name()))
                })?;
            if effect.non_finite {
                state.non_finite += 1;
                tracing::debug!(
                    "{} instruction at {pc:#x}: {op:?} wrote a NaN or an infinity",
                    engine.name()
                );
            }
        }
    }
    state.executed += 1;
    host.retired(state.engine, op, state.pc, began);
    if inst.flags & FLAG_SIGNAL != 0 {
        host.signal(u32::from(inst.signal_sem), inst.signal_value);
    }
    if op == Opcode::End {
        state.done = true;
    } else {
        state.pc = state
            .pc
            .checked_add(INSTRUCTION_SIZE as u64)
            .ok_or_else(|| {
                Stop::failed(
                    error_flags::OOB | error_flags::GENERIC,
                    format!(
                        "{} runs past the end of the address space",
                        state.engine.name()
                    ),
                )
            })?;
        state.current = None;
    }
    Ok(Step::Progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A fake NC: programs at fixed addresses, semaphores, events, and a log of DMA calls.
    #[derive(Default)]
    struct Fake {
        code: HashMap<u64, Instruction>,
        semaphores: HashMap<u32, u32>,
        events: HashMap<u32, u32>,
        dma: Vec<(&'static str, u32, u32, u32)>,
        stopped_queues: Vec<(u32, u32)>,
        /// Events set by the "outside world" at the n-th park.
        on_park: Vec<(u32, u32)>,
        parks: usize,
        /// Parks answer [`Park::Suspend`] (the doorbell's thread).
        suspend: bool,
        order: Vec<Engine>,
        compute: ComputeState,
        retired: Vec<(Engine, Opcode, u64)>,
    }

    impl Fake {
        fn load(&mut self, base: u64, program: &[Instruction]) {
            for (i, inst) in (0u64..).zip(program) {
                self.code.insert(base + i * 64, *inst);
            }
        }
    }

    impl Host for Fake {
        fn fetch(&mut self, engine: Engine, pa: u64) -> Result<Instruction, Stop> {
            self.order.push(engine);
            self.code
                .get(&pa)
                .copied()
                .ok_or_else(|| Stop::failed(error_flags::OOB | error_flags::GENERIC, "not mapped"))
        }
        fn semaphore(&mut self, index: u32) -> u32 {
            self.semaphores.get(&index).copied().unwrap_or(0)
        }
        fn signal(&mut self, index: u32, value: u32) {
            let s = self.semaphores.entry(index).or_default();
            *s = s.wrapping_add(value);
        }
        fn event(&mut self, index: u32) -> u32 {
            self.events.get(&index).copied().unwrap_or(0)
        }
        fn dma_start(&mut self, engine: u32, queue: u32, count: u32) -> Result<(), Stop> {
            self.dma.push(("start", engine, queue, count));
            Ok(())
        }
        fn dma_wait(&mut self, engine: u32, queue: u32) -> Result<(), Stop> {
            self.dma.push(("wait", engine, queue, 0));
            if self.stopped_queues.contains(&(engine, queue)) {
                return Err(Stop::failed(error_flags::DMA_ABORT, "stopped"));
            }
            Ok(())
        }
        fn compute<R>(&mut self, f: impl FnOnce(&mut ComputeState) -> R) -> Result<R, Stop> {
            Ok(f(&mut self.compute))
        }
        fn round(&mut self) -> Result<u64, Stop> {
            Ok(0)
        }
        fn park(&mut self, _token: u64) -> Result<Park, Stop> {
            if self.suspend {
                return Ok(Park::Suspend);
            }
            let Some(&(index, value)) = self.on_park.get(self.parks) else {
                return Err(Stop::Abandoned);
            };
            self.parks += 1;
            self.events.insert(index, value);
            Ok(Park::Woken)
        }
        fn timed(&self) -> bool {
            true
        }
        fn retired(&mut self, engine: Engine, op: Opcode, pc: u64, began: Option<Instant>) {
            assert!(began.is_some(), "timed() asked for the start of each step");
            self.retired.push((engine, op, pc));
        }
    }

    const BASES: [u64; 5] = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000];

    fn end() -> Instruction {
        Instruction::new(Opcode::End, &[])
    }

    /// A fake with every engine's program `End` except those given.
    fn fake(programs: &[(Engine, Vec<Instruction>)]) -> Fake {
        let mut f = Fake::default();
        for engine in Engine::ALL {
            f.load(BASES[engine.index()], &[end()]);
        }
        for (engine, program) in programs {
            f.load(BASES[engine.index()], program);
        }
        f
    }

    fn limits() -> Limits {
        Limits::for_arch(Arch::Trn1)
    }

    fn generic_reason(result: Result<Stats, Stop>) -> String {
        match result {
            Err(Stop::Failed { flags, reason }) => {
                assert_eq!(flags, error_flags::GENERIC, "{reason}");
                reason
            }
            other => panic!("expected a GENERIC failure, got {other:?}"),
        }
    }

    #[test]
    fn engines_synchronise_through_semaphores_in_round_robin_order() {
        // PE waits for SP's signal; SP starts a queue, waits for it, signals PE, ends.
        let mut f = fake(&[
            (Engine::Pe, vec![end().wait(3, 1).signal(4, 1)]),
            (
                Engine::Sp,
                vec![
                    Instruction::new(Opcode::DmaStart, &[1, 2, 5]),
                    Instruction::new(Opcode::DmaWait, &[1, 2]).signal(3, 1),
                    end().wait(4, 1),
                ],
            ),
        ]);
        let stats = run(BASES, &limits(), &mut f).unwrap();
        assert_eq!(f.dma, [("start", 1, 2, 5), ("wait", 1, 2, 0)]);
        assert_eq!(stats.instructions, [1, 1, 1, 1, 3]);
        let sp = BASES[Engine::Sp.index()];
        assert_eq!(
            f.retired,
            [
                (Engine::Act, Opcode::End, BASES[1]),
                (Engine::Pool, Opcode::End, BASES[2]),
                (Engine::Dve, Opcode::End, BASES[3]),
                (Engine::Sp, Opcode::DmaStart, sp),
                (Engine::Sp, Opcode::DmaWait, sp + 64),
                (Engine::Pe, Opcode::End, BASES[0]),
                (Engine::Sp, Opcode::End, sp + 128),
            ],
            "every executed instruction is retired once, blocked steps are not"
        );
        assert_eq!(f.semaphores[&3], 1);
        assert_eq!(f.semaphores[&4], 1);
        assert_eq!(
            &f.order[..5],
            &Engine::ALL,
            "round-robin in PE, ACT, POOL, DVE, SP order"
        );
    }

    #[test]
    fn engines_waiting_on_each_other_deadlock_with_generic() {
        let mut f = fake(&[
            (Engine::Act, vec![end().wait(1, 1).signal(2, 1)]),
            (Engine::Dve, vec![end().wait(2, 1).signal(1, 1)]),
        ]);
        let reason = generic_reason(run(BASES, &limits(), &mut f));
        assert!(reason.contains("deadlock"), "{reason}");
        assert!(
            reason.contains("ACT waits for semaphore 1 >= 1"),
            "{reason}"
        );
        assert!(
            reason.contains("DVE waits for semaphore 2 >= 1"),
            "{reason}"
        );
    }

    #[test]
    fn waiting_on_an_event_parks_until_it_is_set() {
        let mut f = fake(&[(
            Engine::Sp,
            vec![Instruction::new(Opcode::WaitEvent, &[7]), end()],
        )]);
        f.on_park = vec![(7, 1)];
        let stats = run(BASES, &limits(), &mut f).unwrap();
        assert_eq!(stats.parks, 1);
        assert_eq!(f.events[&7], 1, "WaitEvent does not clear the event");

        let mut never = fake(&[(Engine::Sp, vec![Instruction::new(Opcode::WaitEvent, &[7])])]);
        assert_eq!(
            run(BASES, &limits(), &mut never),
            Err(Stop::Abandoned),
            "an abandoned park ends the execution"
        );
    }

    #[test]
    fn a_suspended_run_resumes_where_it_stopped() {
        // PE counts to 2 on semaphore 3 before and after SP's event wait; SP signals only after
        // the event.
        let mut f = fake(&[
            (
                Engine::Pe,
                vec![
                    Instruction::new(Opcode::Nop, &[]).signal(3, 1),
                    Instruction::new(Opcode::Nop, &[]).wait(4, 1),
                    end(),
                ],
            ),
            (
                Engine::Sp,
                vec![
                    Instruction::new(Opcode::WaitEvent, &[7]).signal(4, 1),
                    end(),
                ],
            ),
        ]);
        f.suspend = true;
        let mut run = Run::new(BASES);
        assert_eq!(
            run.resume(&limits(), &mut f),
            Ok(Progress::Suspended),
            "the doorbell's thread does not sleep"
        );
        assert_eq!(
            f.semaphores[&3], 1,
            "PE's first step ran once, before the suspension"
        );
        assert_eq!(
            run.resume(&limits(), &mut f),
            Ok(Progress::Suspended),
            "resumed with the event still clear, it suspends again"
        );
        assert_eq!(f.semaphores[&3], 1, "nothing ran twice");
        // Another thread resumes it and may sleep: the outside world sets the event.
        f.suspend = false;
        f.on_park = vec![(7, 1)];
        let Ok(Progress::Done(stats)) = run.resume(&limits(), &mut f) else {
            panic!("the resumed run ends");
        };
        assert_eq!(stats.parks, 3, "two suspensions and one sleep");
        assert_eq!(stats.instructions[Engine::Pe.index()], 3);
        assert_eq!(stats.instructions[Engine::Sp.index()], 2);
        assert_eq!(f.semaphores[&3], 1);
        assert_eq!(f.semaphores[&4], 1);
        let mut again = fake(&[(Engine::Sp, vec![Instruction::new(Opcode::WaitEvent, &[7])])]);
        again.suspend = true;
        assert!(
            generic_reason(run_fn(&mut again)).contains("cannot be resumed"),
            "run() refuses a host that suspends"
        );
    }

    fn run_fn(f: &mut Fake) -> Result<Stats, Stop> {
        run(BASES, &limits(), f)
    }

    #[test]
    fn negative_semaphores_do_not_satisfy_waits() {
        assert!(wait_holds(5, 5));
        assert!(!wait_holds(4, 5));
        assert!(!wait_holds(u32::MAX, 1), "-1 < 1");
        assert!(wait_holds(0, 0));
        assert!(!wait_holds(0, u32::MAX));
    }

    #[test]
    fn bad_instructions_end_with_generic() {
        let cases: Vec<(Engine, Instruction, &str)> = vec![
            (
                Engine::Pe,
                Instruction {
                    opcode: 0xEE,
                    ..end()
                },
                "undefined opcode 0xee",
            ),
            (
                Engine::Pe,
                Instruction::new(Opcode::DmaStart, &[1, 0, 1]),
                "runs only on SP",
            ),
            (
                Engine::Act,
                Instruction::new(Opcode::WaitEvent, &[1]),
                "runs only on SP",
            ),
            (
                Engine::Sp,
                Instruction::new(Opcode::DmaStart, &[16, 0, 1]),
                "out of range",
            ),
            (
                Engine::Sp,
                Instruction::new(Opcode::DmaWait, &[0, 16]),
                "out of range",
            ),
            (
                Engine::Sp,
                Instruction::new(Opcode::DmaStart, &[0, 0, 1]),
                "DmaStart of the exec queue",
            ),
            (
                Engine::Sp,
                Instruction::new(Opcode::DmaStart, &[1, 0, 0]),
                "DmaStart of 0 descriptors",
            ),
            (
                Engine::Sp,
                Instruction::new(Opcode::WaitEvent, &[256]),
                "event 256 is out of range",
            ),
            (Engine::Pool, end().wait(248, 0), "wait semaphore 248"),
            (Engine::Pool, end().signal(250, 1), "signal semaphore 250"),
        ];
        for (engine, inst, expected) in cases {
            let mut f = fake(&[(engine, vec![inst])]);
            let reason = generic_reason(run(BASES, &limits(), &mut f));
            assert!(reason.contains(expected), "{expected}: {reason}");
            assert!(f.dma.is_empty(), "nothing ran: {:?}", f.dma);
        }
    }

    #[test]
    fn fetch_failures_and_aborted_queues_keep_their_flags() {
        let mut f = fake(&[]);
        f.code.remove(&BASES[Engine::Dve.index()]);
        assert!(matches!(
            run(BASES, &limits(), &mut f),
            Err(Stop::Failed { flags, .. }) if flags == error_flags::OOB | error_flags::GENERIC
        ));
        let mut f = fake(&[(
            Engine::Sp,
            vec![Instruction::new(Opcode::DmaWait, &[2, 3]), end()],
        )]);
        f.stopped_queues.push((2, 3));
        assert!(matches!(
            run(BASES, &limits(), &mut f),
            Err(Stop::Failed { flags, .. }) if flags == error_flags::DMA_ABORT
        ));
    }

    #[test]
    fn compute_instructions_run_on_the_hosts_compute_state() {
        use shared::isa::{AluOp, Tile};
        let t = Tile::sbuf(0, 2, 0, 4);
        let iota = Instruction::with_tiles(Opcode::Iota, &[t], &[1, 10, 1]).signal(1, 1);
        let double =
            Instruction::with_tiles(Opcode::TensorTensor, &[t, t, t], &[AluOp::Add as u32])
                .wait(1, 1);
        let mut f = fake(&[
            (Engine::Pool, vec![iota, end()]),
            (Engine::Dve, vec![double, end()]),
        ]);
        let stats = run(BASES, &limits(), &mut f).unwrap();
        assert_eq!(stats.non_finite, 0);
        let mut out = [0u8; 16];
        assert!(f.compute.read_sbuf(1, 0, &mut out));
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, [22.0, 24.0, 26.0, 28.0], "DVE waited for POOL's iota");
    }

    #[test]
    fn bad_compute_instructions_end_with_generic_naming_engine_and_pc() {
        use shared::isa::{ActFunc, Tile};
        let t = Tile::sbuf(0, 2, 0, 4);
        let act = Instruction::with_tiles(Opcode::Activation, &[t, t], &[ActFunc::Relu as u32]);
        let cases: Vec<(Engine, Instruction, &str)> = vec![
            (
                Engine::Dve,
                Instruction::with_tiles(Opcode::Iota, &[t], &[]),
                "DVE instruction at 0x4040: Iota runs on POOL only, not on DVE",
            ),
            (
                Engine::Pool,
                Instruction::with_tiles(Opcode::Copy, &[t, Tile::sbuf(127, 2, 0, 4)], &[]),
                "POOL instruction at 0x3040: src tile covers partitions 127..129",
            ),
            (
                Engine::Act,
                act,
                "ACT instruction at 0x2040: activation tables not loaded",
            ),
        ];
        for (engine, inst, expected) in cases {
            let nop = Instruction::new(Opcode::Nop, &[]);
            let mut f = fake(&[(engine, vec![nop, inst, end()])]);
            let reason = generic_reason(run(BASES, &limits(), &mut f));
            assert!(reason.contains(expected), "{expected}: {reason}");
        }
        // With the tables loaded the activation runs.
        let mut f = fake(&[(Engine::Act, vec![act, end()])]);
        f.compute.set_tables_loaded(true);
        assert!(run(BASES, &limits(), &mut f).is_ok());
    }

    #[test]
    fn non_finite_writes_mark_the_execution_numerical() {
        use shared::isa::{AluOp, Tile};
        let t = Tile::sbuf(0, 1, 0, 1);
        let nan =
            Instruction::with_tiles(Opcode::TensorTensor, &[t, t, t], &[AluOp::Divide as u32]);
        let mut f = fake(&[(Engine::Dve, vec![nan, nan, end()])]);
        let stats = run(BASES, &limits(), &mut f).unwrap();
        assert_eq!(stats.non_finite, 2, "0/0 twice");
        // A later failure carries NUMERICAL too.
        let mut f = fake(&[(Engine::Dve, vec![nan, end().wait(9, 1)])]);
        assert!(matches!(
            run(BASES, &limits(), &mut f),
            Err(Stop::Failed { flags, .. }) if flags == error_flags::GENERIC | error_flags::NUMERICAL
        ));
    }

    #[test]
    fn an_execution_may_not_exceed_its_compute_budget() {
        use shared::isa::{AluOp, Tile};
        let t = Tile::sbuf(0, 8, 0, 8); // 64 element operations each
        let add = Instruction::with_tiles(Opcode::TensorTensor, &[t, t, t], &[AluOp::Add as u32]);
        let small = Limits {
            max_compute_ops: 128,
            ..limits()
        };
        let mut ok = fake(&[(Engine::Dve, vec![add, add, end()])]);
        assert!(
            run(BASES, &small, &mut ok).is_ok(),
            "two adds fit the budget exactly"
        );
        let mut over = fake(&[(Engine::Dve, vec![add, add, add, end()])]);
        let reason = generic_reason(run(BASES, &small, &mut over));
        assert!(reason.contains("compute budget of 128"), "{reason}");
    }

    #[test]
    fn an_engine_may_not_run_more_than_the_instruction_limit() {
        let small = Limits {
            max_instructions: 4,
            ..limits()
        };
        let nop = Instruction::new(Opcode::Nop, &[]);
        let mut ok = fake(&[(Engine::Pe, vec![nop, nop, nop, end()])]);
        assert_eq!(run(BASES, &small, &mut ok).unwrap().instructions[0], 4);
        let mut long = fake(&[(Engine::Pe, vec![nop, nop, nop, nop, end()])]);
        let reason = generic_reason(run(BASES, &small, &mut long));
        assert!(reason.contains("PE executed more than 4"), "{reason}");
    }
}
