//! The XU layer: the per-vNC work queue, its worker threads and the completion hand-off
//! (seed 004, "The XU Work-Queue and Worker Threads").
//!
//! - [`queue`]: `xu_queue`, the lock-free SPSC ring with three cache-line-isolated cursors,
//!   split into its only [`Producer`] and only [`Consumer`] (both `Send`, not `Sync`, `&mut`).
//! - [`handoff`]: the owned completion eventfd ([`CompEfd`]), the install-vs-signal race and the
//!   `mark_comp_lock` that closes it.
//! - [`unit`]: the XU (`tpb_execution_unit_t`): submit funnel (`tpb_xu_schedule_request`),
//!   worker step (`tpb_xu_step`), `report_complete`, synchronous waiting, event registration.
//! - [`execution_unit`]: [`ExecutionUnit`], an XU of any type behind one object-safe trait (its
//!   worker side behind a crate-private [`WorkerKey`]), and the shutdown of every XU.
//! - [`table`]: the XU table of every type (`tpb_xus`, `tpb_xu_get`): per vNC COMPUTE q0,
//!   TENSOR_OP q0/q1, COLLECTIVES q0..q2.
//! - [`worker`]: one epoll worker thread per vNC over all its XUs (`kmgr_xu_worker_do_work`);
//!   the worker, not the step, waits for in-flight requests.
//!
//! Ordering contract, in one place: the producer writes a slot, then publishes
//! `scheduled_tail` (release); after stage and doorbell it publishes `scheduled_head` (release)
//! and writes `has_work_efd`. The worker acquires `scheduled_head`, reads the slot, and — under
//! `mark_comp_lock` — takes the slot's completion eventfd and empties the slot before publishing
//! `exec_head` (release), then writes that eventfd. The producer acquires `exec_head` before
//! reusing a slot. The status is published before the pop, so a woken waiter reads it.
//!
//! Who may touch what is enforced by types: the XU keeps the ring's producer inside
//! `submit_work_lock` and its consumer inside the worker's lock; `step` and `report_complete`
//! are crate-private (and [`ExecutionUnit`]'s worker side takes a [`WorkerKey`] only this crate
//! makes); the public view of an XU reads cursors, waits, and registers completion eventfds.

pub mod execution_unit;
pub mod handoff;
pub mod queue;
pub(crate) mod sync;
pub mod table;
pub mod unit;
pub mod worker;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use execution_unit::{ExecutionUnit, StepOutcome, Wake, WorkerKey};
pub use handoff::CompEfd;
pub use queue::{Consumer, ExecStatus, Install, Producer, Registration, Triggered, XuQueue};
pub use table::XuTable;
pub use unit::{
    CollectivesEngine, CompletionEngine, ExecInfo, ExecKind, MAX_TPBS_PER_VNC, Progress,
    XU_QUEUE_LIMIT, Xu, XuConfig, XuHealth,
};
pub use worker::XuWorkers;
