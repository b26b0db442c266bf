//! The execution contract between the runtime's hardware exec queue and simdev's per-NC
//! sequencer (seed 000 §3, DESIGN §3 steps 4–7). The trigger-pair mechanism is the seed's; where
//! the seed leaves the hardware's side open, this module fixes a **simulator-defined** reading.
//!
//! # The hardware exec queue (`model_exec_desc_q`)
//! Each NC's exec queue is the DMA queue ([`EXEC_QUEUE_ENGINE`], [`EXEC_QUEUE`]). The runtime
//! initialises it once (DMA_QUEUE_INIT) when it first loads a model on the NC, and per execution
//! appends, with plain stores into the ring memory (no DMA doorbell):
//!
//! 1. **pair 1** — copy the 52-byte `device_exec_request` from the request buffer to the NC's
//!    sequencer DMEM ([`AddressMap::dmem_address`](crate::AddressMap::dmem_address), offset 0);
//! 2. **pair 2** — a 4-byte poke of event [`EVENT_HW_EXEC_QUEUE_REQUEST_LOAD`] (value 1):
//!    "a new request is ready";
//! 3. **pair 3** — two 4-byte writes to the exec queue's own RX then TX tail-increment
//!    registers, each carrying `M`, the number of descriptor pairs that follow in this batch.
//!    Their source is the request slot's `cc_dma_increment` trailer
//!    ([`CC_DMA_INCREMENT_OFFSET`](crate::exec_request::CC_DMA_INCREMENT_OFFSET), 0x34: the
//!    4-byte copy-in the runtime writes after the 52-byte body), which holds `M`;
//! 4. then `M` pairs: the cached collectives model-switch chain (first NC of the vNC, on a model
//!    switch, for a model with a collectives context), whose last pair pokes event
//!    [`EVENT_COLLECTIVES_CTX_LOAD`]. `M` is 0 otherwise.
//!
//! The doorbell is `semaphore_increment(nc, SEM_INFERENCE_START, 1)`.
//!
//! # What the sequencer does (simdev)
//! For each INFERENCE_START count it takes one batch from the exec queue: pairs 1–3 from the
//! queue's head (ring ids checked, as any DMA), which must be exactly a 52-byte copy into DMEM,
//! a write of the value 1 to the request-load event and the two tail increments (equal values);
//! the tail increments post the `M` following pairs, which it runs too.
//!
//! **The `cc_dma_increment` reading (simulator-defined).** The seed names the trailer but not
//! what the hardware does with it. Here it is the number of collectives-chain descriptor pairs
//! the tail increments post: the sequencer reads the 4-byte word at 0x34 past pair 1's source
//! (the request's slot) and requires it to equal the `M` both tail increments carry; a trailer
//! that disagrees (never written, stale, corrupted, or the increments sourced elsewhere) makes
//! the batch malformed — an error notification, the exec queue stopped — before anything of it
//! runs.
//!
//! **`do_model_switch` (simulator-defined).** A request with `do_model_switch` = 0 must run the
//! same five engine addresses as the NC's previous request (the runtime sets it to 0 only when
//! the same model was posted last); otherwise the execution ends with an error notification
//! naming the engine. `do_model_switch` = 1 is always accepted (a model loaded where an
//! unloaded one was may reuse its addresses). It then decodes the request from DMEM, performs a config
//! reload when `reload_seq_config` is 1 and a table load when `load_act_dve_tables` is 1
//! (counting both), runs the five engines' programs from the request's addresses, and posts one
//! notification of kind `Execution` whose `compute_idx` is the number of batches the exec queue
//! ran before this one since its DMA_QUEUE_INIT. A malformed batch ends the execution with an
//! error notification.
//!
//! # One `compute_idx` per fan-out
//! The runtime keeps a single `compute_idx_tail`, on the main TPB of the vNC, and stages every
//! TPB of the vNC under the main TPB's `compute_req_lock` before taking `compute_idx =
//! compute_idx_tail++` (seed 000 §4 QUIRK). Each NC's sequencer still counts only its own
//! batches. Since every fan-out puts exactly one batch on every TPB's exec queue, and all of
//! them were initialised together at `nrt_init`, every NC of the vNC has run the same number of
//! batches before fan-out `k`: each NC's notification for it carries `k` (mod 2^32), the
//! runtime's single index, and the completion engine matches each TPB's notification against
//! that one index.

//!
//! # What an execution leaves behind (the guarantee between executions)
//! A model's program may use the NC's program semaphores (indices below
//! [`FIRST_RESERVED_SEMAPHORE`]) any way it likes during its execution, but it must leave each
//! at the value it found (the builder's programs do: every consumer subtracts what it waited
//! for). The driver resets semaphores only with the NC (NC_RESET) and the runtime never writes
//! them between executions, so a value left behind would be seen by every later execution of
//! every model on the NC — a wait satisfied early, or never — and nothing would tell which
//! model was at fault. The sequencer therefore sums, per program semaphore, what the
//! execution's program signalled (its `FLAG_SIGNAL`s, wrapping) and checks the sums when it
//! ends: when any is not zero, it undoes every such net change and reports **that** execution
//! as completed with an error: error flag `GENERIC` (NRT_EXEC_COMPLETED_WITH_ERR, 1004 — an
//! error of the execution, not of the NC: not fatal, the next execution runs on restored
//! state) with `source` = [`SEMAPHORE_LEAK_SOURCE`] | the lowest such index, and a log line
//! naming each. Only the program's own signals count: the host may change a semaphore during an
//! execution (the outside world a waiting engine waits for). Not covered: semaphore writes
//! made by DMA descriptors, and events (the host sets them; the builder's programs do not
//! write them). An abandoned execution (NC reset, release) is not checked: the reset zeroes
//! everything.

/// `source` of an `Execution` notification whose program left a program semaphore changed:
/// this bit | the semaphore's index (see "What an execution leaves behind").
pub const SEMAPHORE_LEAK_SOURCE: u16 = 0x8000;

/// DMA engine of each NC's hardware exec queue.
pub const EXEC_QUEUE_ENGINE: u32 = 0;
/// Queue (on [`EXEC_QUEUE_ENGINE`]) of each NC's hardware exec queue.
pub const EXEC_QUEUE: u32 = 0;
/// Descriptors in the exec queue's rings, as the runtime creates them.
pub const EXEC_QUEUE_DESCS: u32 = 1024;
/// Semaphore whose increment starts an execution (`tdrv_sync_get_inference_start`).
pub const SEM_INFERENCE_START: u32 = 250;
/// Event poked by trigger pair 2 (`tdrv_sync_get_hw_exec_queue_request_load`).
pub const EVENT_HW_EXEC_QUEUE_REQUEST_LOAD: u32 = 250;
/// Event poked by the last pair of the collectives model-switch chain
/// (`tdrv_sync_get_collectives_ctx_load`).
pub const EVENT_COLLECTIVES_CTX_LOAD: u32 = 251;
/// Semaphores at or above this index are reserved for the sequencer; programs use the ones
/// below.
pub const FIRST_RESERVED_SEMAPHORE: u32 = 248;
/// Bytes of each NC's sequencer DMEM window.
pub const SEQ_DMEM_SIZE: u64 = 4096;
