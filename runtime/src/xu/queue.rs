//! `xu_queue`: the lock-free single-producer/single-consumer ring between the submitting thread
//! and the vNC's worker (seed 004 §1–§2), split rtrb-style into a [`Producer`] and a
//! [`Consumer`] over one shared [`XuQueue`].
//!
//! # Cursors
//! Three monotone 48-bit cursors, each on its own 64-byte cache line (+0x40, +0x80, +0xC0 of the
//! seed's 256-byte header), all starting at **1** (seq_num 0 is never an in-queue sequence):
//!
//! ```text
//!   reclaimed      in flight on device        submitted, not triggered     free
//! ◀──── exec_head ─────────── scheduled_head ───────────── scheduled_tail ─────▶
//! ```
//!
//! - `scheduled_tail` — advanced by [`Producer::client_submit`] after the slot body is written
//!   (release).
//! - `scheduled_head` — advanced by [`Producer::client_trigger_next`] after the request was
//!   staged and its doorbell rung (release); the consumer acquires it.
//! - `exec_head` — advanced by [`Consumer::worker_pop_current_exec`] after it has taken the
//!   slot's completion eventfd and emptied the slot (release); the producer acquires it for the
//!   full check.
//!
//! Invariant: `exec_head <= scheduled_head <= scheduled_tail <= exec_head + capacity`.
//! Full: `scheduled_tail - exec_head >= capacity` — submitted-but-untriggered slots count
//! (seed 004 QUIRK). Last completed: `exec_head - 1`.
//!
//! # Single producer, single consumer, by construction
//! [`XuQueue::with_capacity`] returns the only [`Producer`] and the only [`Consumer`] of the ring. Both
//! are `Send` and not `Sync`, and every method that touches a slot takes `&mut self`: a thread
//! can drive a half only while it owns it (or holds the lock it lives in — the XU keeps its
//! producer inside `submit_work_lock` and its consumer inside the worker's lock). The shared
//! [`XuQueue`] offers only reads of the cursors and the completion-eventfd install, which goes
//! through `mark_comp_lock` ([`XuQueue::install_comp_efd`]).
//!
//! ```
//! use runtime::xu::XuQueue;
//! use shared::ids::{XuId, XuType};
//!
//! let (mut producer, mut consumer) =
//!     XuQueue::<u64>::with_capacity(XuId::new(XuType::Compute, 0, 0), 2).unwrap();
//! let seq = producer.client_submit(Box::new(7), None).unwrap();
//! producer.client_trigger_next().unwrap();
//! assert_eq!(consumer.worker_take_item().map(|b| *b), Some(7));
//! consumer.worker_pop_current_exec(|_, efd| efd.signal()).unwrap();
//! assert!(producer.queue().is_completed(seq));
//! ```
//!
//! The halves cannot be driven through a shared reference, so two threads can never race a
//! slot:
//!
//! ```compile_fail,E0596
//! use runtime::xu::Producer;
//! fn submit_from_a_shared_reference(producer: &Producer<u64>) {
//!     let _ = producer.client_submit(Box::new(1), None);
//! }
//! ```
//!
//! ```compile_fail,E0277
//! fn assert_sync<T: Sync>() {}
//! assert_sync::<runtime::xu::Consumer<u64>>();
//! ```

use std::cell::Cell;
use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use nix::errno::Errno;
use shared::NrtStatus;
use shared::ids::{NRTA_SEQ_NUM_MAX, SEQ_NUM_MASK, SeqId, XuId};

use super::handoff::{CompEfd, MarkCompLock, SlotEfds};
use super::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell};

/// Where a request's final status is published (the seed's `NRT_STATUS *exec_status`): written
/// by the worker before the slot is popped, read by the submitter after it wakes.
#[derive(Debug)]
pub struct ExecStatus(AtomicU32);

impl ExecStatus {
    const PENDING: u32 = u32::MAX;

    /// A status cell that reads as pending.
    pub fn new() -> Self {
        Self(AtomicU32::new(Self::PENDING))
    }

    /// Publishes `status` (release).
    pub fn publish(&self, status: NrtStatus) {
        self.0.store(status.as_u32(), Ordering::Release);
    }

    /// Makes the cell read as pending again, for reuse by the same waiter. Only the waiter that
    /// owns the cell calls it, after its previous request completed.
    pub fn reset(&self) {
        self.0.store(Self::PENDING, Ordering::Relaxed);
    }

    /// The published status, or `None` while pending (acquire).
    pub fn get(&self) -> Option<NrtStatus> {
        match self.0.load(Ordering::Acquire) {
            Self::PENDING => None,
            v => NrtStatus::from_u32(v),
        }
    }
}

impl Default for ExecStatus {
    fn default() -> Self {
        Self::new()
    }
}

/// One ring slot (`xuq_exec_info_t` without its `mark_comp_efd`/`efd_from_pool`, which live
/// under `mark_comp_lock`): `seq_id` @0, `exec_status` @8, `exec_info` @16.
#[repr(C)]
#[derive(Debug)]
struct XuqExecInfo<T> {
    seq_id: AtomicU64,
    exec_status: UnsafeCell<Option<Arc<ExecStatus>>>,
    exec_info: UnsafeCell<Option<Box<T>>>,
}

impl<T> XuqExecInfo<T> {
    fn empty() -> Self {
        Self {
            seq_id: AtomicU64::new(0),
            exec_status: UnsafeCell::new(None),
            exec_info: UnsafeCell::new(None),
        }
    }
}

/// A cache-line (64-byte) aligned cell: keeps each cursor on its own line.
#[repr(C, align(64))]
#[derive(Debug)]
struct CacheLine<T>(T);

#[derive(Debug)]
struct Meta<T> {
    buffer: Box<[XuqExecInfo<T>]>,
    capacity: u64,
    /// `capacity - 1` when the capacity is a power of two (the default 16): the slot index is
    /// then a mask, not a division (about ten per execution).
    mask: Option<u64>,
    xu_id: XuId,
}

/// The shared part of the ring: the seed's 256-byte `xu_queue_t` header (slot buffer, capacity,
/// xu_id; the three cursors at +0x40/+0x80/+0xC0) followed by the line holding
/// `mark_comp_lock` and the slots' completion eventfds. `T` is the work item.
///
/// Shared by the [`Producer`], the [`Consumer`] and any reader (`Arc`); its own methods only read
/// cursors or install a completion eventfd under the lock.
#[repr(C)]
#[derive(Debug)]
pub struct XuQueue<T> {
    meta: CacheLine<Meta<T>>,
    /// `1 ..= scheduled_head`; written only by the consumer, under `mark_comp_lock`.
    exec_head: CacheLine<AtomicU64>,
    /// `exec_head ..= scheduled_tail`; written only by the producer.
    scheduled_head: CacheLine<AtomicU64>,
    /// `scheduled_head ..= exec_head + capacity`, `< NRTA_SEQ_NUM_MAX`; written only by the
    /// producer.
    scheduled_tail: CacheLine<AtomicU64>,
    mark_comp_lock: CacheLine<MarkCompLock>,
}

// SAFETY: the slot cells are only touched through the ring's single `Producer` and single
// `Consumer` (each `&mut self`, not `Sync`), under the SPSC discipline documented on the module:
// the producer writes a slot only in its free region (`>= scheduled_tail`, after an acquire of
// `exec_head` proved the consumer is done with it); the consumer reads/empties a slot only in
// `[exec_head, scheduled_head)` after acquiring `scheduled_head`. The methods on `&XuQueue` read
// atomics or lock `mark_comp_lock`. `T: Send` because work items move from the producer's thread
// to the consumer's.
unsafe impl<T: Send> Sync for XuQueue<T> {}
// SAFETY: as above; the queue owns its items, which are `Send`.
unsafe impl<T: Send> Send for XuQueue<T> {}

/// The producer half (`xuq_client_*`): the only handle that writes slots and advances
/// `scheduled_tail`/`scheduled_head`. `Send`, not `Sync`.
#[derive(Debug)]
pub struct Producer<T> {
    queue: Arc<XuQueue<T>>,
    _not_sync: PhantomData<Cell<()>>,
}

/// The consumer half (`xuq_worker_*`): the only handle that reads and empties triggered slots
/// and advances `exec_head`. `Send`, not `Sync`.
#[derive(Debug)]
pub struct Consumer<T> {
    queue: Arc<XuQueue<T>>,
    _not_sync: PhantomData<Cell<()>>,
}

/// A slot as the producer hands it over at trigger time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Triggered {
    /// The slot's seq_id.
    pub seq_id: SeqId,
}

/// Result of [`XuQueue::install_comp_efd`]. Every variant but `Installed` hands the eventfd
/// back unsignalled.
#[derive(Debug)]
pub enum Install {
    /// The eventfd will be written (once) when the slot is popped.
    Installed,
    /// The request already completed; nothing was installed and nobody will write the fd.
    AlreadyComplete(CompEfd),
    /// The seq_id names no submitted request of this queue (another XU, or not yet submitted).
    Unknown(CompEfd),
    /// Another waiter's eventfd is installed for this request.
    Occupied(CompEfd),
}

impl Install {
    /// Whether the eventfd was installed.
    pub fn is_installed(&self) -> bool {
        matches!(self, Self::Installed)
    }
}

fn debug_assert_slot(slot_seq: u64, cursor: u64) {
    // Seed 004 QUIRK (queue.c:0x6A / 0x87): the cheapest detector of a torn slot or a broken
    // fence. Kept in debug builds.
    debug_assert_eq!(
        slot_seq & SEQ_NUM_MASK,
        cursor & SEQ_NUM_MASK,
        "xu_queue slot does not hold the cursor's seq_num"
    );
}

impl<T> XuQueue<T> {
    /// `xu_queue_init`: a ring of `capacity` slots for `xu_id`, cursors at 1; returns its only
    /// producer and only consumer.
    ///
    /// # Errors
    /// `NRT_INVALID` when `capacity` is 0 ("XU Queue size must be greater than 0").
    pub fn with_capacity(
        xu_id: XuId,
        capacity: usize,
    ) -> Result<(Producer<T>, Consumer<T>), NrtStatus> {
        Self::with_mark_comp_lock(xu_id, capacity, MarkCompLock::new)
    }

    /// As [`XuQueue::with_capacity`], with a `mark_comp_lock` that does not span the cursor check and bump
    /// (the loom model of the race it closes).
    #[cfg(all(test, loom))]
    pub(crate) fn new_with_narrowed_lock_for_test(
        xu_id: XuId,
        capacity: usize,
    ) -> Result<(Producer<T>, Consumer<T>), NrtStatus> {
        Self::with_mark_comp_lock(xu_id, capacity, MarkCompLock::narrowed_for_test)
    }

    fn with_mark_comp_lock(
        xu_id: XuId,
        capacity: usize,
        mark_comp_lock: fn(usize) -> MarkCompLock,
    ) -> Result<(Producer<T>, Consumer<T>), NrtStatus> {
        if capacity == 0 {
            return Err(NrtStatus::Invalid);
        }
        let buffer = (0..capacity).map(|_| XuqExecInfo::empty()).collect();
        let queue = Arc::new(Self {
            meta: CacheLine(Meta {
                buffer,
                capacity: capacity as u64,
                mask: capacity.is_power_of_two().then(|| capacity as u64 - 1),
                xu_id,
            }),
            exec_head: CacheLine(AtomicU64::new(1)),
            scheduled_head: CacheLine(AtomicU64::new(1)),
            scheduled_tail: CacheLine(AtomicU64::new(1)),
            mark_comp_lock: CacheLine(mark_comp_lock(capacity)),
        });
        Ok((
            Producer {
                queue: queue.clone(),
                _not_sync: PhantomData,
            },
            Consumer {
                queue,
                _not_sync: PhantomData,
            },
        ))
    }

    /// Moves all three cursors to `cursor` (an empty queue there): tests of the seq-space end.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn set_cursors_for_test(&self, cursor: u64) {
        self.exec_head.0.store(cursor, Ordering::Relaxed);
        self.scheduled_head.0.store(cursor, Ordering::Relaxed);
        self.scheduled_tail.0.store(cursor, Ordering::Relaxed);
    }

    /// Overwrites the seq_id stored in the slot `cursor` maps to: tests of the slot tripwire.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn corrupt_slot_seq_for_test(&self, cursor: u64, raw: u64) {
        self.slot(cursor).seq_id.store(raw, Ordering::Relaxed);
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> u64 {
        self.meta.0.capacity
    }

    /// The queue's XU id.
    pub fn xu_id(&self) -> XuId {
        self.meta.0.xu_id
    }

    /// The index of the slot that `cursor` maps to (`cursor % capacity`).
    pub fn slot_index(&self, cursor: u64) -> u64 {
        match self.meta.0.mask {
            Some(mask) => cursor & mask,
            None => cursor % self.meta.0.capacity,
        }
    }

    fn slot_usize(&self, cursor: u64) -> usize {
        // `slot_index < capacity == buffer.len()`, a usize: the conversion cannot fail.
        usize::try_from(self.slot_index(cursor)).unwrap_or(0)
    }

    fn slot(&self, cursor: u64) -> &XuqExecInfo<T> {
        &self.meta.0.buffer[self.slot_usize(cursor)]
    }

    /// Current `exec_head` (acquire).
    pub fn exec_head(&self) -> u64 {
        self.exec_head.0.load(Ordering::Acquire)
    }

    /// Current `scheduled_head` (acquire).
    pub fn scheduled_head(&self) -> u64 {
        self.scheduled_head.0.load(Ordering::Acquire)
    }

    /// Current `scheduled_tail` (acquire).
    pub fn scheduled_tail(&self) -> u64 {
        self.scheduled_tail.0.load(Ordering::Acquire)
    }

    /// `xuq_get_last_completed`: the seq_id of `exec_head − 1` (seq_num 0 on a fresh queue).
    pub fn last_completed(&self) -> SeqId {
        SeqId::new(self.xu_id(), self.exec_head().wrapping_sub(1))
    }

    /// Whether the request `seq_id` of this queue has completed.
    pub fn is_completed(&self, seq_id: SeqId) -> bool {
        seq_id.seq_num() <= self.last_completed().seq_num()
    }

    /// Requests submitted and not yet popped (`scheduled_tail − exec_head`).
    pub fn depth(&self) -> u64 {
        self.scheduled_tail().wrapping_sub(self.exec_head())
    }

    /// Whether everything released to the device has completed: `scheduled_head == exec_head`
    /// (`wait_exec_queue_empty`'s condition; submitted-but-untriggered slots do not count).
    pub fn is_drained(&self) -> bool {
        self.scheduled_head() == self.exec_head()
    }

    /// `tpb_xu_base_get_comp_efd` (a waiter, any thread): installs `efd` as the completion
    /// eventfd of request `seq_id` under `mark_comp_lock`, unless the request already completed,
    /// is not a submitted request of this queue, or has an eventfd already. Serialised against
    /// [`Consumer::worker_pop_current_exec`], so an installed eventfd is signalled exactly once.
    pub fn install_comp_efd(&self, seq_id: SeqId, efd: CompEfd) -> Install {
        let lock = &self.mark_comp_lock.0;
        let spans = lock.spans_check_and_act();
        let guard = spans.then(|| lock.lock());
        let cursor = seq_id.seq_num();
        if seq_id.xu_id() != self.xu_id() {
            return Install::Unknown(efd);
        }
        // exec_head only moves under this lock: while we hold it, `cursor` cannot complete.
        if cursor < self.exec_head() {
            return Install::AlreadyComplete(efd);
        }
        // Acquire: the slot of a cursor below the tail is written and stays the producer's
        // no more until exec_head passes it.
        if cursor >= self.scheduled_tail() {
            return Install::Unknown(efd);
        }
        debug_assert_slot(self.slot(cursor).seq_id.load(Ordering::Relaxed), cursor);
        let mut efds = guard.unwrap_or_else(|| lock.lock());
        let cell = &mut efds[self.slot_usize(cursor)].mark_comp_efd;
        if cell.is_some() {
            return Install::Occupied(efd);
        }
        *cell = efd;
        Install::Installed
    }

    /// The seq-id event registration (`nrta_event_register_seq_id_completion`, any thread):
    /// under `mark_comp_lock`, adds `fd` to the eventfds request `seq_id` writes 1 to at its pop
    /// (any number of them), or with `None` removes (and closes) every eventfd registered for
    /// it. A request that already completed has `fd` written at once (and closed); a
    /// deregistration then changes nothing. Serialised against
    /// [`Consumer::worker_pop_current_exec`], which signals the registered eventfds inside the
    /// same lock: a registration is signalled exactly once, whether it lands before or after
    /// the pop, and an eventfd is never written after its deregistration returned.
    pub fn register_seq_efd(&self, seq_id: SeqId, fd: Option<OwnedFd>) -> Registration {
        if seq_id.xu_id() != self.xu_id() {
            return Registration::Unknown;
        }
        let cursor = seq_id.seq_num();
        let mut efds = self.mark_comp_lock.0.lock();
        // exec_head only moves under this lock.
        if cursor < self.exec_head() {
            if let Some(fd) = fd {
                SlotEfds::signal_registered(vec![fd]);
                return Registration::AlreadyComplete;
            }
            return Registration::Deregistered;
        }
        if cursor >= self.scheduled_tail() {
            return Registration::Unknown;
        }
        let registered = &mut efds[self.slot_usize(cursor)].registered;
        match fd {
            Some(fd) => {
                registered.push(fd);
                Registration::Registered
            }
            None => {
                registered.clear();
                Registration::Deregistered
            }
        }
    }
}

/// Result of [`XuQueue::register_seq_efd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The eventfd will be written once, at the request's pop.
    Registered,
    /// The request had already completed: the eventfd was written at once.
    AlreadyComplete,
    /// The request's registered eventfds were removed (none left to signal).
    Deregistered,
    /// The seq_id names no submitted request of this queue (another XU, or beyond the last
    /// submitted).
    Unknown,
}

impl<T> Producer<T> {
    /// The shared ring.
    pub fn queue(&self) -> &Arc<XuQueue<T>> {
        &self.queue
    }

    /// `xuq_client_submit`: writes the slot at `scheduled_tail` — seq_id, status cell, the work
    /// item — then publishes the tail (release). The slot's completion eventfd is empty: the
    /// pop of its previous request took it.
    ///
    /// # Errors
    /// `Err((NRT_QUEUE_FULL, item))` when `scheduled_tail − exec_head >= capacity`; the queue is
    /// unchanged and the item is handed back.
    ///
    /// # Panics
    /// If the 48-bit sequence space is exhausted (`scheduled_tail >= NRTA_SEQ_NUM_MAX`), the
    /// seed's runtime-bug assert (queue.c:0x5C), after logging.
    pub fn client_submit(
        &mut self,
        item: Box<T>,
        exec_status: Option<Arc<ExecStatus>>,
    ) -> Result<SeqId, (NrtStatus, Box<T>)> {
        let q = &*self.queue;
        let tail = q.scheduled_tail.0.load(Ordering::Relaxed);
        // Acquire: the consumer emptied the slot we may reuse before its exec_head bump, so
        // that happens before our overwrite.
        let head = q.exec_head.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= q.capacity() {
            return Err((NrtStatus::QueueFull, item));
        }
        let seq = SeqId::new(q.xu_id(), tail);
        let slot = q.slot(tail);
        slot.seq_id.store(seq.raw(), Ordering::Relaxed);
        // SAFETY: `tail` is in the producer's free region (checked against exec_head above) and
        // only this producer (`&mut self`, the ring's only one) writes there; the consumer reads
        // the slot only after `scheduled_head` passes it, which happens after this write.
        slot.exec_status.with_mut(|s| unsafe { *s = exec_status });
        // SAFETY: as above.
        slot.exec_info.with_mut(|s| unsafe { *s = Some(item) });
        // PUBLISH (release): the slot body above is complete before the tail moves.
        let new_tail = q.scheduled_tail.0.fetch_add(1, Ordering::Release) + 1;
        if new_tail >= NRTA_SEQ_NUM_MAX {
            tracing::error!(xu = ?q.xu_id(), new_tail, "xu_queue seq_num space exhausted");
            panic!("xu_queue: scheduled_tail {new_tail:#x} reached NRTA_SEQ_NUM_MAX");
        }
        Ok(seq)
    }

    /// `xuq_client_trigger_next`: releases the oldest submitted-but-untriggered slot to the
    /// consumer by advancing `scheduled_head` (release). Call it after the request's stage and
    /// doorbell.
    ///
    /// # Errors
    /// `NRT_QUEUE_EMPTY` when nothing is waiting for a trigger.
    pub fn client_trigger_next(&mut self) -> Result<Triggered, NrtStatus> {
        let q = &*self.queue;
        let head = q.scheduled_head.0.load(Ordering::Relaxed);
        if head == q.scheduled_tail.0.load(Ordering::Relaxed) {
            return Err(NrtStatus::QueueEmpty);
        }
        let seq = q.slot(head).seq_id.load(Ordering::Relaxed);
        debug_assert_slot(seq, head);
        q.scheduled_head.0.fetch_add(1, Ordering::Release);
        Ok(Triggered {
            seq_id: SeqId::from_raw(seq),
        })
    }
}

impl<T> Consumer<T> {
    /// The shared ring.
    pub fn queue(&self) -> &Arc<XuQueue<T>> {
        &self.queue
    }

    /// The cursor of the slot at `exec_head`, if it is triggered (acquire of `scheduled_head`,
    /// pairing with the trigger's release: the slot body is visible).
    fn current(&self) -> Option<u64> {
        let q = &*self.queue;
        let head = q.exec_head.0.load(Ordering::Relaxed);
        (head != q.scheduled_head.0.load(Ordering::Acquire)).then_some(head)
    }

    /// `xuq_worker_peek_current_exec`: the seq_id at `exec_head`, or `None` when nothing
    /// triggered is outstanding (`exec_head == scheduled_head`).
    pub fn worker_peek_current_exec(&mut self) -> Option<SeqId> {
        let head = self.current()?;
        let seq = self.queue.slot(head).seq_id.load(Ordering::Relaxed);
        debug_assert_slot(seq, head);
        Some(SeqId::from_raw(seq))
    }

    /// Takes the work item of the slot at `exec_head`. The seed frees the item before reporting
    /// completion; taking it out is how the worker gets to own and drop it.
    pub fn worker_take_item(&mut self) -> Option<Box<T>> {
        let head = self.current()?;
        // SAFETY: the slot at exec_head is in [exec_head, scheduled_head), owned by the consumer
        // until exec_head moves; the producer does not touch it (its free region starts at
        // exec_head + capacity). `&mut self`: this is the ring's only consumer.
        self.queue
            .slot(head)
            .exec_info
            .with_mut(|s| unsafe { (*s).take() })
    }

    /// Runs `f` on the work item of the slot at `exec_head`, if there is one.
    pub fn worker_with_item<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let head = self.current()?;
        // SAFETY: as in `worker_take_item`: the consumer owns this slot until it pops it.
        self.queue
            .slot(head)
            .exec_info
            .with_mut(|s| unsafe { (*s).as_deref_mut().map(f) })
    }

    /// Takes the status cell of the slot at `exec_head` (the pop empties the slot anyway:
    /// moving the reference out touches no reference count, a clone would).
    pub fn worker_take_exec_status(&mut self) -> Option<Arc<ExecStatus>> {
        let head = self.current()?;
        // SAFETY: as in `worker_take_item`.
        self.queue
            .slot(head)
            .exec_status
            .with_mut(|s| unsafe { (*s).take() })
    }

    /// `xuq_worker_pop_current_exec`: under `mark_comp_lock`, takes the slot's completion
    /// eventfd and its registered seq-id eventfds and empties the slot, advances `exec_head`
    /// (release), writes the registered eventfds (then closes them); then, with the lock
    /// released, calls `signal` with the seq_id and the eventfd and drops the eventfd — closing
    /// a fresh one, keeping a pooled one — whether or not `signal` failed.
    ///
    /// The seed writes `mark_comp_efd` inside the locked pop. Here `signal` runs after the
    /// unlock: the eventfd was captured under the lock (so an install either saw the request
    /// complete or handed its eventfd to this pop), and the woken waiter, which on a shared CPU
    /// preempts the worker at the write, never has to wait for a preempted worker to release
    /// `mark_comp_lock` before its next install.
    ///
    /// # Errors
    /// `NRT_QUEUE_EMPTY` when nothing triggered is outstanding (nothing changed);
    /// `NRT_FAILURE` when `signal` failed (the slot *was* popped; the error is logged).
    pub fn worker_pop_current_exec(
        &mut self,
        signal: impl FnOnce(SeqId, &CompEfd) -> Result<(), Errno>,
    ) -> Result<SeqId, NrtStatus> {
        let q = &*self.queue;
        let lock = &q.mark_comp_lock.0;
        let mut guard = lock.lock();
        let head = self.current().ok_or(NrtStatus::QueueEmpty)?;
        let slot = q.slot(head);
        let seq = SeqId::from_raw(slot.seq_id.load(Ordering::Relaxed));
        debug_assert_slot(seq.raw(), head);
        // CAPTURE before the bump (seed 004 GOTCHA): once exec_head moves the slot is the
        // producer's again.
        let cell = &mut guard[q.slot_usize(head)];
        let efd = std::mem::take(&mut cell.mark_comp_efd);
        // Empty unless someone registered: taking an empty Vec neither allocates nor frees.
        let registered = std::mem::take(&mut cell.registered);
        // SAFETY: consumer-owned slot (see `worker_take_item`); drop the status reference and
        // any item left so the slot holds nothing once it is back in the producer's region.
        slot.exec_status.with_mut(|s| unsafe { *s = None });
        // SAFETY: as above.
        slot.exec_info.with_mut(|s| unsafe { *s = None });
        let guard = lock.spans_check_and_act().then_some(guard);
        q.exec_head.0.fetch_add(1, Ordering::Release);
        // The registered seq-id eventfds first, the waiter's last (a woken waiter finds every
        // event of its request written).
        if !registered.is_empty() {
            SlotEfds::signal_registered(registered);
        }
        // The waiter's eventfd is written after the unlock (the seed writes it inside): it was
        // taken under the lock, so the install/pop race stays closed, and a waiter woken onto
        // this CPU — which preempts the worker at the write — never finds the lock held by the
        // preempted worker when its next submit installs an eventfd (two context switches and
        // a futex wait per sync execution otherwise).
        drop(guard);
        let signalled = signal(seq, &efd);
        drop(efd);
        match signalled {
            Ok(()) => Ok(seq),
            Err(e) => {
                tracing::error!(seq = seq.raw(), errno = %e, "Failed to signal completion event for request");
                Err(NrtStatus::Failure)
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use shared::ids::XuType;
    use std::mem::{offset_of, size_of};

    fn xu() -> XuId {
        XuId::new(XuType::Compute, 0, 3)
    }

    type Ring = (Producer<u64>, Consumer<u64>);

    fn ring(capacity: usize) -> Ring {
        XuQueue::<u64>::with_capacity(xu(), capacity).unwrap()
    }

    /// Pops with the runtime's signal (write the eventfd, if any).
    fn pop(c: &mut Consumer<u64>) -> Result<SeqId, NrtStatus> {
        c.worker_pop_current_exec(|_, efd| efd.signal())
    }

    fn submit_trigger(p: &mut Producer<u64>, v: u64) -> SeqId {
        let seq = p.client_submit(Box::new(v), None).unwrap();
        p.client_trigger_next().unwrap();
        seq
    }

    fn nonblocking_efd() -> Arc<EventFd> {
        Arc::new(EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK).unwrap())
    }

    #[test]
    fn header_and_slot_layout() {
        // The seed's 256-byte header: cursors on their own lines at +0x40/+0x80/+0xC0. The
        // slots' completion eventfds moved under mark_comp_lock, on the next line.
        assert_eq!(offset_of!(XuQueue<u64>, exec_head), 0x40);
        assert_eq!(offset_of!(XuQueue<u64>, scheduled_head), 0x80);
        assert_eq!(offset_of!(XuQueue<u64>, scheduled_tail), 0xC0);
        assert_eq!(offset_of!(XuQueue<u64>, mark_comp_lock), 0x100);
        assert_eq!(size_of::<XuQueue<u64>>(), 256 + 64);
        assert_eq!(size_of::<XuqExecInfo<u64>>(), 24);
        assert_eq!(offset_of!(XuqExecInfo<u64>, seq_id), 0);
        assert_eq!(offset_of!(XuqExecInfo<u64>, exec_status), 8);
        assert_eq!(offset_of!(XuqExecInfo<u64>, exec_info), 16);
    }

    #[test]
    fn both_halves_are_send() {
        fn assert_send<S: Send>() {}
        assert_send::<Producer<u64>>();
        assert_send::<Consumer<u64>>();
    }

    #[test]
    fn capacity_zero_is_invalid() {
        assert_eq!(
            XuQueue::<u64>::with_capacity(xu(), 0).err(),
            Some(NrtStatus::Invalid)
        );
    }

    #[test]
    fn fresh_queue_reports_seq_num_0_completed_and_first_submit_lands_in_slot_1() {
        let (mut p, _c) = ring(4);
        let q = p.queue().clone();
        assert_eq!(q.last_completed().seq_num(), 0, "not 0xFFFF_FFFF_FFFF");
        assert_eq!(q.last_completed().xu_id(), xu());
        let seq = p.client_submit(Box::new(7), None).unwrap();
        assert_eq!(seq.seq_num(), 1);
        assert_eq!(q.slot_index(seq.seq_num()), 1);
        assert!(!q.is_completed(seq));
        assert_eq!(seq, SeqId::new(xu(), 1));
    }

    #[test]
    fn slot_index_is_the_cursor_modulo_capacity_across_several_wraps() {
        let (p, _c) = ring(3);
        let q = p.queue();
        let got: Vec<u64> = (1..=10).map(|c| q.slot_index(c)).collect();
        assert_eq!(got, [1, 2, 0, 1, 2, 0, 1, 2, 0, 1]);
        assert_eq!(q.slot_index(3 * 1_000_003 + 2), 2);
        // A power-of-two capacity takes the mask: the same slots.
        for capacity in [1, 2, 16, 64] {
            let (p, _c) = ring(capacity);
            let q = p.queue();
            for c in [1, 2, 15, 16, 17, 63, 64, 65, 1_000_003, u64::MAX >> 16] {
                assert_eq!(q.slot_index(c), c % capacity as u64, "{c} % {capacity}");
            }
        }
    }

    #[test]
    fn items_keep_their_own_slots_across_several_wraps() {
        // Three requests in flight at a time in a ring of 3, over four laps: any slot position
        // other than cursor % capacity makes two live requests share a slot.
        let (mut p, mut c) = ring(3);
        let mut next_pop = 1;
        for v in 1..=12u64 {
            if p.queue().depth() == 3 {
                assert_eq!(c.worker_take_item().map(|b| *b), Some(next_pop));
                pop(&mut c).unwrap();
                next_pop += 1;
            }
            assert_eq!(submit_trigger(&mut p, v).seq_num(), v);
        }
        while next_pop <= 12 {
            assert_eq!(
                c.worker_peek_current_exec().map(SeqId::seq_num),
                Some(next_pop)
            );
            assert_eq!(c.worker_take_item().map(|b| *b), Some(next_pop));
            pop(&mut c).unwrap();
            next_pop += 1;
        }
    }

    #[test]
    fn cursors_beyond_32_bits_keep_their_high_seq_num_bits() {
        // Bits 32..47 set: a seq_num mask narrowed to 32 bits loses them.
        let cursor = 0x8765_4321_0FED;
        let (mut p, mut c) = ring(4);
        let q = p.queue().clone();
        q.set_cursors_for_test(cursor);
        let seq = submit_trigger(&mut p, 1);
        assert_eq!(seq.seq_num(), cursor);
        assert_eq!(seq.xu_id(), xu());
        assert!(!q.is_completed(seq));
        assert_eq!(c.worker_peek_current_exec(), Some(seq));
        assert_eq!(pop(&mut c), Ok(seq));
        assert_eq!(q.last_completed(), seq);
        assert!(q.is_completed(seq));
        assert!(!q.is_completed(SeqId::new(xu(), cursor + 1)));
    }

    #[test]
    #[cfg_attr(
        not(debug_assertions),
        ignore = "the slot tripwire is a debug assertion"
    )]
    #[should_panic(expected = "does not hold the cursor's seq_num")]
    fn the_slot_tripwire_fires_on_a_corrupted_slot() {
        let (mut p, mut c) = ring(4);
        submit_trigger(&mut p, 1);
        // Only bit 40 differs: the tripwire compares all 48 bits of the seq_num.
        p.queue()
            .corrupt_slot_seq_for_test(1, SeqId::new(xu(), 1 | 1 << 40).raw());
        let _ = c.worker_peek_current_exec();
    }

    #[test]
    fn full_counts_submitted_but_untriggered_slots() {
        // A naive queue gating on scheduled_head would admit a 3rd submit here and overwrite
        // slot 1, which holds a written-but-not-doorbelled request.
        let (mut p, mut c) = ring(2);
        p.client_submit(Box::new(1), None).unwrap();
        p.client_submit(Box::new(2), None).unwrap();
        assert_eq!(p.queue().scheduled_head(), 1, "nothing triggered yet");
        let (status, item) = p.client_submit(Box::new(3), None).unwrap_err();
        assert_eq!((status, *item), (NrtStatus::QueueFull, 3));
        p.client_trigger_next().unwrap();
        assert_eq!(c.worker_with_item(|v| *v), Some(1), "slot 1 not clobbered");
        pop(&mut c).unwrap();
        assert_eq!(p.client_submit(Box::new(3), None).unwrap().seq_num(), 3);
    }

    #[test]
    fn worker_sees_only_triggered_slots_and_drained_ignores_untriggered_ones() {
        let (mut p, mut c) = ring(4);
        p.client_submit(Box::new(10), None).unwrap();
        assert_eq!(
            c.worker_peek_current_exec(),
            None,
            "submitted, not triggered"
        );
        assert!(
            p.queue().is_drained(),
            "the drain waits on scheduled_head, not the tail"
        );
        assert_eq!(
            c.worker_pop_current_exec(|_, _| Ok(())),
            Err(NrtStatus::QueueEmpty)
        );
        p.client_trigger_next().unwrap();
        assert!(!p.queue().is_drained());
        assert_eq!(c.worker_peek_current_exec().map(SeqId::seq_num), Some(1));
        assert_eq!(p.client_trigger_next().err(), Some(NrtStatus::QueueEmpty));
    }

    #[test]
    fn the_pop_signals_the_installed_efd_once_and_last_completed_follows_exec_head() {
        let (mut p, mut c) = ring(4);
        let q = p.queue().clone();
        let seq = submit_trigger(&mut p, 1);
        let efd = nonblocking_efd();
        assert!(
            q.install_comp_efd(seq, CompEfd::Pool(efd.clone()))
                .is_installed()
        );
        assert_eq!(pop(&mut c), Ok(seq));
        assert_eq!(efd.read(), Ok(1), "signalled exactly once");
        assert_eq!(Arc::strong_count(&efd), 1, "the slot dropped its reference");
        assert_eq!(q.last_completed(), seq);
        assert!(q.is_completed(seq));
        let late = q.install_comp_efd(seq, CompEfd::Pool(efd.clone()));
        assert!(matches!(late, Install::AlreadyComplete(CompEfd::Pool(_))));
    }

    /// The waiter's eventfd is written with `mark_comp_lock` released: a waiter woken onto the
    /// worker's CPU preempts the worker at the write, and its next install must not find the
    /// lock held by the preempted worker. The request is already complete when it is written,
    /// and an install from the signal (the woken waiter's next request) neither blocks nor
    /// misses it.
    #[test]
    fn the_waiter_is_signalled_after_mark_comp_lock_is_released() {
        let (mut p, mut c) = ring(4);
        let q = p.queue().clone();
        let seq = submit_trigger(&mut p, 1);
        let next = submit_trigger(&mut p, 2);
        let efd = nonblocking_efd();
        assert!(
            q.install_comp_efd(seq, CompEfd::Pool(efd.clone()))
                .is_installed()
        );
        let popped = c.worker_pop_current_exec(|s, e| {
            assert_eq!(s, seq);
            assert!(
                q.mark_comp_lock.0.is_free(),
                "mark_comp_lock is still held when the waiter is woken"
            );
            assert!(q.is_completed(seq), "woken before its request completed");
            // The woken waiter's next install goes through at once.
            assert!(
                q.install_comp_efd(next, CompEfd::Pool(nonblocking_efd()))
                    .is_installed()
            );
            e.signal()
        });
        assert_eq!(popped, Ok(seq));
        assert_eq!(efd.read(), Ok(1));
    }
    #[test]
    fn a_completion_with_no_waiter_writes_no_fd_even_in_a_reused_slot() {
        // Capacity 1: every request reuses slot 0. Request 1 had a waiter; request 2 has none,
        // so its pop must find no eventfd (the first pop took it) and write nothing.
        let (mut p, mut c) = ring(1);
        let q = p.queue().clone();
        let efd = nonblocking_efd();
        let first = submit_trigger(&mut p, 1);
        assert!(
            q.install_comp_efd(first, CompEfd::Pool(efd.clone()))
                .is_installed()
        );
        pop(&mut c).unwrap();
        assert_eq!(efd.read(), Ok(1));
        for v in 2..5 {
            submit_trigger(&mut p, v);
            let mut seen = Vec::new();
            c.worker_pop_current_exec(|_, e| {
                seen.push(e.is_some());
                e.signal()
            })
            .unwrap();
            assert_eq!(seen, [false], "request {v} had no waiter");
        }
        assert_eq!(efd.read(), Err(Errno::EAGAIN), "written once in all");
    }

    #[test]
    fn install_refuses_foreign_unsubmitted_and_occupied_requests() {
        let (mut p, _c) = ring(4);
        let q = p.queue().clone();
        let seq = submit_trigger(&mut p, 1);
        let other_xu = SeqId::new(XuId::new(XuType::Compute, 0, 4), 1);
        assert!(matches!(
            q.install_comp_efd(other_xu, CompEfd::None),
            Install::Unknown(_)
        ));
        assert!(matches!(
            q.install_comp_efd(SeqId::new(xu(), 2), CompEfd::None),
            Install::Unknown(_)
        ));
        assert!(
            q.install_comp_efd(seq, CompEfd::Pool(nonblocking_efd()))
                .is_installed()
        );
        assert!(matches!(
            q.install_comp_efd(seq, CompEfd::Pool(nonblocking_efd())),
            Install::Occupied(_)
        ));
    }

    #[test]
    fn a_failed_signal_still_pops_closes_a_fresh_fd_and_keeps_a_pooled_one() {
        let (mut p, mut c) = ring(2);
        let q = p.queue().clone();
        // Fresh: the read end of a pipe, which cannot be written (EBADF).
        let (read_end, write_end) = nix::unistd::pipe().unwrap();
        let seq = submit_trigger(&mut p, 1);
        assert!(
            q.install_comp_efd(seq, CompEfd::Fresh(read_end))
                .is_installed()
        );
        assert_eq!(pop(&mut c), Err(NrtStatus::Failure));
        assert!(q.is_completed(seq), "the slot was popped");
        assert_eq!(
            nix::unistd::write(&write_end, b"x"),
            Err(Errno::EPIPE),
            "the fresh fd (the pipe's only read end) was closed"
        );
        // Pooled: an eventfd at its maximum count, whose write of 1 would block (EAGAIN).
        let full = nonblocking_efd();
        full.write(u64::MAX - 1).unwrap();
        let seq = submit_trigger(&mut p, 2);
        assert!(
            q.install_comp_efd(seq, CompEfd::Pool(full.clone()))
                .is_installed()
        );
        assert_eq!(pop(&mut c), Err(NrtStatus::Failure));
        assert_eq!(Arc::strong_count(&full), 1);
        assert_eq!(full.read(), Ok(u64::MAX - 1), "the pooled fd is still open");
    }

    #[test]
    fn a_fresh_fd_is_closed_after_a_successful_signal() {
        // The write end of a pipe as a fresh completion fd: the signal's 8 bytes arrive, then
        // end-of-file once the slot closed its (only) write end.
        let (mut p, mut c) = ring(2);
        let (read_end, write_end) = nix::unistd::pipe().unwrap();
        let seq = submit_trigger(&mut p, 1);
        assert!(
            p.queue()
                .install_comp_efd(seq, CompEfd::Fresh(write_end))
                .is_installed()
        );
        assert_eq!(pop(&mut c), Ok(seq));
        let mut buf = [0u8; 16];
        assert_eq!(nix::unistd::read(&read_end, &mut buf), Ok(8));
        assert_eq!(u64::from_ne_bytes(buf[..8].try_into().unwrap()), 1);
        assert_eq!(nix::unistd::read(&read_end, &mut buf), Ok(0));
    }

    #[test]
    fn status_cells_publish_once() {
        let s = ExecStatus::new();
        assert_eq!(s.get(), None);
        s.publish(NrtStatus::ExecOob);
        assert_eq!(s.get(), Some(NrtStatus::ExecOob));
    }
}
