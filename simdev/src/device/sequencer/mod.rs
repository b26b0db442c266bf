//! The per-NC sequencer: what one INFERENCE_START count makes the device do (the contract is
//! [`shared::sequencer`]; DESIGN §3 step 7, §5).
//!
//! An NC's executions run one at a time, in order, on the thread holding the NC's *sequencer
//! role* (`thread`): normally the connection thread that received the doorbell, which runs
//! the execution to its notification before it reads its connection's next message — no
//! thread hand-off. The NC's sequencer thread (started the first time semaphore
//! [`SEM_INFERENCE_START`](shared::sequencer::SEM_INFERENCE_START) of the NC is written) takes
//! over what may not hold a connection's thread: an execution that must wait for the outside
//! world is suspended there and resumed on the sequencer thread (a doorbell's thread never
//! sleeps on an execution: what it waits for may be that connection's next message), and
//! executions under a latency model, with faults armed or references bound, or counted by
//! anything but a doorbell message. While the semaphore is positive the role's holder takes one
//! count (subtracting 1) and runs one execution, to its end, before looking again: executions
//! of one NC are serial and in order; other NCs have their own roles.
//!
//! One execution:
//!
//! 1. **Batch fetch.** The sequencer reads the four pairs at the head of the exec queue
//!    ([`EXEC_QUEUE_ENGINE`](shared::sequencer::EXEC_QUEUE_ENGINE), [`EXEC_QUEUE`](shared::sequencer::EXEC_QUEUE)) without any DMA_QUEUE_COPY_START (nobody posts
//!    them) and checks each one exactly as DMA processing would (ring id of the pass, lengths,
//!    the source in the client's memory, the destination in its memory, a DMEM it owns or a
//!    register). [`check_batch`] then requires the staged shape: a 52-byte copy into this NC's
//!    DMEM at offset 0, a 4-byte write of 1 to event
//!    [`EVENT_HW_EXEC_QUEUE_REQUEST_LOAD`](shared::sequencer::EVENT_HW_EXEC_QUEUE_REQUEST_LOAD) of this NC, and writes of the same `M` into the
//!    exec queue's own RX then TX tail-increment registers; [`check_trailer`] requires the
//!    request slot's `cc_dma_increment` trailer (0x34 past pair 1's source) to equal `M`
//!    (`shared::sequencer`). Only when all four are right does
//!    it execute them (request into DMEM, event poke, `M` posted on both rings; `M` = 0 posts
//!    nothing) and consume them (heads advance, pending counts untouched). The `M` posted
//!    pairs (the collectives chain) are then processed like any posted pairs; a chain whose
//!    last pair pokes [`EVENT_COLLECTIVES_CTX_LOAD`](shared::sequencer::EVENT_COLLECTIVES_CTX_LOAD) of this NC counts in `cc_chains`.
//! 2. **Request.** The 52-byte `device_exec_request` is decoded from DMEM; a request with
//!    `do_model_switch` = 0 must run the NC's previous engine addresses
//!    ([`check_model_switch`], GENERIC otherwise); bit 0 of `reload_seq_config`
//!    ([`reload_requested`](shared::neff_program::reload_requested)) counts a config reload, `load_act_dve_tables` = 1 a table load and marks the NC's
//!    activation tables loaded (until the NC's reset, release or reclaim, or a DMA_QUEUE_INIT
//!    of the exec queue; an `Activation` without them fails with GENERIC).
//! 3. **Program.** The request names a [`Program`] in bits 8..16 of `reload_seq_config`
//!    ([`shared::neff_program`]): the five engines run the simulator ISA from the request's
//!    addresses ([`crate::engines`]), or a NEFF subgraph runs **shape-only**
//!    ([`crate::shape_only`]: streams charged, inputs and outputs through the DGE table,
//!    counted in `neff_shape_only_executions`), or, when the NEFF is bound to a reference,
//!    with its outputs computed by the reference ([`crate::reference`], counted in
//!    `neff_reference_executions`); any other encoding is GENERIC.
//! 4. **Notification.** One entry of kind `Execution`: `compute_idx` (batches the exec queue
//!    ran before this one since its DMA_QUEUE_INIT, NC reset, release or reclaim), the error
//!    flags (0 on success; NUMERICAL when a compute instruction wrote a NaN or an infinity, the
//!    results being delivered all the same), `device_ts_ns` and `nc_ts_ns`: with the default
//!    latency model the wall-clock ns since simdev started and the execution's wall-clock
//!    duration, under a model ([`crate::timing`]) the NC's simulated clock after the execution
//!    and its simulated duration (slept first when the model paces). A numerical error counts
//!    in `exec_errors` like any non-zero flags.
//!
//! # Injected faults
//! Every execution that takes a count (and a `compute_idx`) asks the fault table once, before
//! anything runs ([`crate::faults`]). Error faults add their flag to the notification (the
//! execution still runs and writes its results); DmaAbort also stops the exec queue (counted
//! in `dma_aborts`) before the notification is posted, so later counts fail fast as for any
//! stopped exec queue; MissingCompletion posts nothing; LateCompletion posts from another
//! thread after the delay while the NC goes on (the stale notification arrives out of order,
//! and not at all if the NC is reset, released or reclaimed meanwhile); ExtraLatency lengthens
//! the execution (simulated time under a model, a real sleep without one); DeviceLost posts
//! DeviceLost to every claimed NC instead of running, and stops simdev (exit status 3).
//!
//! # Errors
//! - A batch that is not there or not well formed (the exec queue not initialised or stopped,
//!   descriptors already pending on it, a pair breaking a descriptor rule, a pair of the wrong
//!   kind or destination, RX and TX increments that differ, `M` larger than a ring) ends the
//!   execution with GENERIC, and **stops the exec queue** (a DMA abort, counted in
//!   `dma_aborts`, when a descriptor broke a DMA rule; otherwise a stop with a "malformed exec
//!   batch" reason). The sequencer cannot know where the next batch starts, so the exec
//!   queue needs a new DMA_QUEUE_INIT; until then every count ends with GENERIC at once.
//!   A DMA abort inside the `M` chain ends the execution with GENERIC too (the chain's queue
//!   stays stopped).
//! - Program failures ([`crate::engines`]) end the execution with their flags; the batch was
//!   consumed completely, so the next execution on the NC runs normally.
//! - DMA aborts during an execution post no DmaQueueError notification of their own: they
//!   end the execution, whose notification carries them.
//!
//! # Parking and abandoning
//! An execution whose engines all wait and at least one waits on an event parks: on the
//! sequencer thread it sleeps on its condition variable until a semaphore or event of the NC
//! changes, then runs the scheduler again (on a doorbell's thread it is first suspended and
//! handed to the sequencer thread). Later counts wait behind it. NC reset, release and
//! reclaim abandon it (and any execution in progress) without a notification; simdev's
//! shutdown ([`crate::Device::device_lost`]) posts DeviceLost to the NC and abandons it.
//!
//! # Where the code is
//! The device side of executions is glue to the device's state and locks (see the locking
//! rules in [`crate::device`]):
//! - `thread`: the sequencer role (the doorbell's thread or the NC's sequencer thread), its
//!   wake-ups, and taking INFERENCE_START counts.
//! - `batch`: the shape of an exec-queue batch ([`check_batch`]).
//! - `execution`: one execution: its faults, the batch fetch, the request, the programs, its
//!   timing and its notification.
//! - [`Program`]: what an execution runs; the place for a new kind of program.
//! - `host`: the [`engines::Host`](crate::engines::Host) through which the engines' programs
//!   reach the NC's registers, DMA queues and the client's memory.

mod batch;
mod execution;
mod host;
mod program;
mod thread;

pub use batch::{BATCH_HEAD_PAIRS, check_batch, check_model_switch, check_trailer, is_cc_poke};
pub use program::Program;
pub(in crate::device) use thread::SeqSync;

#[cfg(test)]
mod tests;
