//! `xu_queue`: the lock-free single-producer/single-consumer ring between the submitting thread
//! and the vNC's worker (seed 004 §1–§2).
//!
//! # Cursors
//! Three monotone 48-bit cursors, each on its own 64-byte cache line (+0x40, +0x80, +0xC0 of the
//! 256-byte header), all starting at **1** (seq_num 0 is never an in-queue sequence):
//!
//! ```text
//!   reclaimed      in flight on device        submitted, not triggered     free
//! ◀──── exec_head ─────────── scheduled_head ───────────── scheduled_tail ─────▶
//! ```
//!
//! - `scheduled_tail` — advanced by [`XuQueue::client_submit`] (the producer) after the slot body
//!   is written (release).
//! - `scheduled_head` — advanced by [`XuQueue::client_trigger_next`] (the producer) after the
//!   request was staged and its doorbell rung (release); the worker acquires it.
//! - `exec_head` — advanced by [`XuQueue::worker_pop_current_exec`] (the consumer) after it has
//!   captured the slot's completion eventfd (release); the producer acquires it for the full
//!   check.
//!
//! Invariant: `exec_head <= scheduled_head <= scheduled_tail <= exec_head + capacity`.
//! Full: `scheduled_tail - exec_head >= capacity` — submitted-but-untriggered slots count
//! (seed 004 QUIRK). Last completed: `exec_head - 1`.
//!
//! # Single producer, single consumer
//! The producer side (`client_*`) must be driven by one thread at a time — the XU's
//! `submit_work_lock` guarantees it; the consumer side (`worker_*`) only by the vNC's worker.
//! The completion eventfd of a slot is the one field both sides (and a waiter) touch; it is
//! installed and captured under the XU's `mark_comp_lock` (see [`XuQueue::install_comp_efd`]).

use shared::NrtStatus;
use shared::ids::{NRTA_SEQ_NUM_MAX, SEQ_NUM_MASK, SeqId, XuId};

use super::sync::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering, UnsafeCell};

/// "No eventfd installed" in a slot's `mark_comp_efd`.
pub const NO_EFD: i32 = -1;

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

/// One 32-byte ring slot (`xuq_exec_info_t`): `seq_id` @0, `exec_status` @8,
/// `mark_comp_efd` @16, `efd_from_pool` @20, `exec_info` @24.
#[repr(C)]
#[derive(Debug)]
pub struct XuqExecInfo<T> {
    seq_id: AtomicU64,
    exec_status: UnsafeCell<Option<std::sync::Arc<ExecStatus>>>,
    mark_comp_efd: AtomicI32,
    efd_from_pool: AtomicBool,
    exec_info: UnsafeCell<Option<Box<T>>>,
}

impl<T> XuqExecInfo<T> {
    fn empty() -> Self {
        Self {
            seq_id: AtomicU64::new(0),
            exec_status: UnsafeCell::new(None),
            mark_comp_efd: AtomicI32::new(NO_EFD),
            efd_from_pool: AtomicBool::new(false),
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
    xu_id: XuId,
}

/// The 256-byte `xu_queue_t` header with its slot buffer. `T` is the work item.
#[repr(C)]
#[derive(Debug)]
pub struct XuQueue<T> {
    meta: CacheLine<Meta<T>>,
    exec_head: CacheLine<AtomicU64>,
    scheduled_head: CacheLine<AtomicU64>,
    scheduled_tail: CacheLine<AtomicU64>,
}

// SAFETY: the slot cells are accessed under the SPSC discipline documented on the module: the
// producer writes a slot only in its free region (`>= scheduled_tail`, and only after an acquire
// of `exec_head` proved the consumer is done with it), the consumer reads/takes a slot only in
// `[exec_head, scheduled_head)` after acquiring `scheduled_head`. `T: Send` because work items
// move from the producer thread to the worker thread.
unsafe impl<T: Send> Sync for XuQueue<T> {}
// SAFETY: as above; the queue owns its items, which are `Send`.
unsafe impl<T: Send> Send for XuQueue<T> {}

/// A slot as the producer hands it over at trigger time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Triggered {
    /// The slot's seq_id.
    pub seq_id: SeqId,
}

/// What the consumer captured from the slot it popped (before advancing `exec_head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Popped {
    /// The slot's seq_id.
    pub seq_id: SeqId,
    /// The waiter's completion eventfd, or [`NO_EFD`].
    pub mark_comp_efd: i32,
    /// Whether that eventfd belongs to the pool (kept) rather than to the waiter (closed).
    pub efd_from_pool: bool,
}

/// Result of [`XuQueue::install_comp_efd`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// The eventfd will be written when the slot is popped.
    Installed,
    /// The request already completed; nothing was installed and nobody will write the fd.
    AlreadyComplete,
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
    /// `xu_queue_init`: a ring of `capacity` slots for `xu_id`, cursors at 1.
    ///
    /// # Errors
    /// `NRT_INVALID` when `capacity` is 0 ("XU Queue size must be greater than 0").
    pub fn new(xu_id: XuId, capacity: usize) -> Result<Self, NrtStatus> {
        if capacity == 0 {
            return Err(NrtStatus::Invalid);
        }
        let buffer = (0..capacity).map(|_| XuqExecInfo::empty()).collect();
        Ok(Self {
            meta: CacheLine(Meta {
                buffer,
                capacity: capacity as u64,
                xu_id,
            }),
            exec_head: CacheLine(AtomicU64::new(1)),
            scheduled_head: CacheLine(AtomicU64::new(1)),
            scheduled_tail: CacheLine(AtomicU64::new(1)),
        })
    }

    /// Moves all three cursors to `cursor` (an empty queue there): tests of the seq-space end.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn set_cursors_for_test(&self, cursor: u64) {
        self.exec_head.0.store(cursor, Ordering::Relaxed);
        self.scheduled_head.0.store(cursor, Ordering::Relaxed);
        self.scheduled_tail.0.store(cursor, Ordering::Relaxed);
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> u64 {
        self.meta.0.capacity
    }

    /// The queue's XU id.
    pub fn xu_id(&self) -> XuId {
        self.meta.0.xu_id
    }

    fn slot(&self, cursor: u64) -> &XuqExecInfo<T> {
        // `cursor % capacity < capacity == buffer.len()`: never out of bounds.
        let idx = usize::try_from(cursor % self.meta.0.capacity).unwrap_or(0);
        &self.meta.0.buffer[idx]
    }

    /// The index of the slot that `cursor` maps to (`cursor % capacity`).
    pub fn slot_index(&self, cursor: u64) -> u64 {
        cursor % self.meta.0.capacity
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

    /// `xuq_client_submit` (producer): writes the slot at `scheduled_tail` — seq_id, status cell,
    /// `mark_comp_efd = -1`, the work item — then publishes the tail (release).
    ///
    /// # Errors
    /// `Err((NRT_QUEUE_FULL, item))` when `scheduled_tail − exec_head >= capacity`; the queue is
    /// unchanged and the item is handed back.
    ///
    /// # Panics
    /// If the 48-bit sequence space is exhausted (`scheduled_tail >= NRTA_SEQ_NUM_MAX`), the
    /// seed's runtime-bug assert (queue.c:0x5C), after logging.
    pub fn client_submit(
        &self,
        item: Box<T>,
        exec_status: Option<std::sync::Arc<ExecStatus>>,
    ) -> Result<SeqId, (NrtStatus, Box<T>)> {
        let tail = self.scheduled_tail.0.load(Ordering::Relaxed);
        // Acquire: the worker's captures of the slot we may reuse happened before its exec_head
        // bump, so they happen before our overwrite.
        let head = self.exec_head.0.load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= self.capacity() {
            return Err((NrtStatus::QueueFull, item));
        }
        let seq = SeqId::new(self.xu_id(), tail);
        let slot = self.slot(tail);
        slot.seq_id.store(seq.raw(), Ordering::Relaxed);
        // SAFETY: `tail` is in the producer's free region (checked against exec_head above) and
        // only the producer (one thread, by the submit lock) writes there; the consumer reads
        // the slot only after `scheduled_head` passes it, which happens after this write.
        slot.exec_status.with_mut(|s| unsafe { *s = exec_status });
        slot.mark_comp_efd.store(NO_EFD, Ordering::Relaxed);
        slot.efd_from_pool.store(false, Ordering::Relaxed);
        // SAFETY: as above.
        slot.exec_info.with_mut(|s| unsafe { *s = Some(item) });
        // PUBLISH (release): the slot body above is complete before the tail moves.
        let new_tail = self.scheduled_tail.0.fetch_add(1, Ordering::Release) + 1;
        if new_tail >= NRTA_SEQ_NUM_MAX {
            tracing::error!(xu = ?self.xu_id(), new_tail, "xu_queue seq_num space exhausted");
            panic!("xu_queue: scheduled_tail {new_tail:#x} reached NRTA_SEQ_NUM_MAX");
        }
        Ok(seq)
    }

    /// `xuq_client_trigger_next` (producer): releases the oldest submitted-but-untriggered slot
    /// to the worker by advancing `scheduled_head` (release). Call it after the request's stage
    /// and doorbell.
    ///
    /// # Errors
    /// `NRT_QUEUE_EMPTY` when nothing is waiting for a trigger.
    pub fn client_trigger_next(&self) -> Result<Triggered, NrtStatus> {
        let head = self.scheduled_head.0.load(Ordering::Relaxed);
        if head == self.scheduled_tail.0.load(Ordering::Relaxed) {
            return Err(NrtStatus::QueueEmpty);
        }
        let seq = self.slot(head).seq_id.load(Ordering::Relaxed);
        debug_assert_slot(seq, head);
        self.scheduled_head.0.fetch_add(1, Ordering::Release);
        Ok(Triggered {
            seq_id: SeqId::from_raw(seq),
        })
    }

    /// `xuq_worker_peek_current_exec` (consumer): the seq_id at `exec_head`, or `None` when
    /// nothing triggered is outstanding (`exec_head == scheduled_head`).
    pub fn worker_peek_current_exec(&self) -> Option<SeqId> {
        let head = self.exec_head.0.load(Ordering::Relaxed);
        // Acquire: pairs with the trigger's release, making the slot body visible.
        if head == self.scheduled_head.0.load(Ordering::Acquire) {
            return None;
        }
        let seq = self.slot(head).seq_id.load(Ordering::Relaxed);
        debug_assert_slot(seq, head);
        Some(SeqId::from_raw(seq))
    }

    /// Takes the work item of the slot at `exec_head` (consumer; the slot must have been
    /// peeked). The seed frees the item before reporting completion; taking it out is how the
    /// worker gets to own and drop it.
    pub fn worker_take_item(&self) -> Option<Box<T>> {
        let head = self.exec_head.0.load(Ordering::Relaxed);
        if head == self.scheduled_head.0.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: the slot at exec_head is in [exec_head, scheduled_head), owned by the consumer
        // until exec_head moves; the producer does not touch it (its free region starts at
        // exec_head + capacity).
        self.slot(head)
            .exec_info
            .with_mut(|s| unsafe { (*s).take() })
    }

    /// Runs `f` on the work item of the slot at `exec_head` (consumer), if there is one.
    pub fn worker_with_item<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let head = self.exec_head.0.load(Ordering::Relaxed);
        if head == self.scheduled_head.0.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: as in `worker_take_item`: the consumer owns this slot until it pops it.
        self.slot(head)
            .exec_info
            .with_mut(|s| unsafe { (*s).as_deref_mut().map(f) })
    }

    /// The status cell of the slot at `exec_head` (consumer).
    pub fn worker_exec_status(&self) -> Option<std::sync::Arc<ExecStatus>> {
        let head = self.exec_head.0.load(Ordering::Relaxed);
        if head == self.scheduled_head.0.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: as in `worker_take_item`.
        self.slot(head)
            .exec_status
            .with_mut(|s| unsafe { (*s).clone() })
    }

    /// `xuq_worker_pop_current_exec` (consumer): captures the slot's `mark_comp_efd` and
    /// `efd_from_pool`, then advances `exec_head` (release). The caller writes the captured
    /// eventfd. Must run under the XU's `mark_comp_lock` so a concurrent
    /// [`XuQueue::install_comp_efd`] cannot slip between the capture and the bump.
    ///
    /// # Errors
    /// `NRT_QUEUE_EMPTY` when nothing triggered is outstanding.
    pub fn worker_pop_current_exec(&self) -> Result<Popped, NrtStatus> {
        let head = self.exec_head.0.load(Ordering::Relaxed);
        if head == self.scheduled_head.0.load(Ordering::Acquire) {
            return Err(NrtStatus::QueueEmpty);
        }
        let slot = self.slot(head);
        let seq = slot.seq_id.load(Ordering::Relaxed);
        debug_assert_slot(seq, head);
        // CAPTURE before the bump (seed 004 GOTCHA): once exec_head moves the producer may
        // overwrite mark_comp_efd with -1 for the next request.
        let mark_comp_efd = slot.mark_comp_efd.load(Ordering::Acquire);
        let efd_from_pool = slot.efd_from_pool.load(Ordering::Acquire);
        // SAFETY: consumer-owned slot (see `worker_take_item`); drop the status reference now so
        // the slot holds nothing once it is back in the producer's region.
        slot.exec_status.with_mut(|s| unsafe { *s = None });
        // SAFETY: as above.
        slot.exec_info.with_mut(|s| unsafe { *s = None });
        self.exec_head.0.fetch_add(1, Ordering::Release);
        Ok(Popped {
            seq_id: SeqId::from_raw(seq),
            mark_comp_efd,
            efd_from_pool,
        })
    }

    /// `tpb_xu_base_get_comp_efd` (a waiter): installs `efd` as the completion eventfd of
    /// request `seq_id`, unless it already completed. Must run under the XU's
    /// `mark_comp_lock`, which serialises it against [`XuQueue::worker_pop_current_exec`].
    pub fn install_comp_efd(&self, seq_id: SeqId, efd: i32, from_pool: bool) -> Install {
        let cursor = seq_id.seq_num();
        if cursor < self.exec_head.0.load(Ordering::Acquire) {
            return Install::AlreadyComplete;
        }
        let slot = self.slot(cursor);
        debug_assert_slot(slot.seq_id.load(Ordering::Relaxed), cursor);
        slot.efd_from_pool.store(from_pool, Ordering::Relaxed);
        slot.mark_comp_efd.store(efd, Ordering::Release);
        Install::Installed
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use shared::ids::XuType;
    use std::mem::{offset_of, size_of};

    fn xu() -> XuId {
        XuId::new(XuType::Compute, 0, 3)
    }

    #[test]
    fn header_and_slot_layout_match_the_seed() {
        assert_eq!(size_of::<XuQueue<u64>>(), 256);
        assert_eq!(offset_of!(XuQueue<u64>, exec_head), 0x40);
        assert_eq!(offset_of!(XuQueue<u64>, scheduled_head), 0x80);
        assert_eq!(offset_of!(XuQueue<u64>, scheduled_tail), 0xC0);
        assert_eq!(size_of::<XuqExecInfo<u64>>(), 32);
        assert_eq!(offset_of!(XuqExecInfo<u64>, seq_id), 0);
        assert_eq!(offset_of!(XuqExecInfo<u64>, exec_status), 8);
        assert_eq!(offset_of!(XuqExecInfo<u64>, mark_comp_efd), 16);
        assert_eq!(offset_of!(XuqExecInfo<u64>, efd_from_pool), 20);
        assert_eq!(offset_of!(XuqExecInfo<u64>, exec_info), 24);
    }

    #[test]
    fn capacity_zero_is_invalid() {
        assert_eq!(XuQueue::<u64>::new(xu(), 0).err(), Some(NrtStatus::Invalid));
    }

    #[test]
    fn fresh_queue_reports_seq_num_0_completed_and_first_submit_lands_in_slot_1() {
        let q = XuQueue::<u64>::new(xu(), 4).unwrap();
        assert_eq!(q.last_completed().seq_num(), 0, "not 0xFFFF_FFFF_FFFF");
        assert_eq!(q.last_completed().xu_id(), xu());
        let seq = q.client_submit(Box::new(7), None).unwrap();
        assert_eq!(seq.seq_num(), 1);
        let capacity = q.capacity();
        assert_eq!(q.slot_index(seq.seq_num()), 1 % capacity);
        assert!(!q.is_completed(seq));
        assert_eq!(seq, SeqId::new(xu(), 1));
    }

    #[test]
    fn full_counts_submitted_but_untriggered_slots() {
        // A naive queue gating on scheduled_head would admit a 3rd submit here and overwrite
        // slot 1, which holds a written-but-not-doorbelled request.
        let q = XuQueue::<u64>::new(xu(), 2).unwrap();
        q.client_submit(Box::new(1), None).unwrap();
        q.client_submit(Box::new(2), None).unwrap();
        assert_eq!(q.scheduled_head(), 1, "nothing triggered yet");
        let (status, item) = q.client_submit(Box::new(3), None).unwrap_err();
        assert_eq!((status, *item), (NrtStatus::QueueFull, 3));
        q.client_trigger_next().unwrap();
        assert_eq!(q.worker_with_item(|v| *v), Some(1), "slot 1 not clobbered");
        q.worker_pop_current_exec().unwrap();
        assert_eq!(q.client_submit(Box::new(3), None).unwrap().seq_num(), 3);
    }

    #[test]
    fn worker_sees_only_triggered_slots() {
        let q = XuQueue::<u64>::new(xu(), 4).unwrap();
        q.client_submit(Box::new(10), None).unwrap();
        assert_eq!(
            q.worker_peek_current_exec(),
            None,
            "submitted, not triggered"
        );
        q.client_trigger_next().unwrap();
        assert_eq!(q.worker_peek_current_exec().map(SeqId::seq_num), Some(1));
        assert_eq!(q.client_trigger_next(), Err(NrtStatus::QueueEmpty));
    }

    #[test]
    fn pop_captures_the_installed_efd_and_last_completed_follows_exec_head() {
        let q = XuQueue::<u64>::new(xu(), 4).unwrap();
        let seq = q
            .client_submit(Box::new(1), Some(std::sync::Arc::new(ExecStatus::new())))
            .unwrap();
        q.client_trigger_next().unwrap();
        assert_eq!(q.install_comp_efd(seq, 42, true), Install::Installed);
        let popped = q.worker_pop_current_exec().unwrap();
        assert_eq!(
            popped,
            Popped {
                seq_id: seq,
                mark_comp_efd: 42,
                efd_from_pool: true
            }
        );
        assert_eq!(q.last_completed(), seq);
        assert!(q.is_completed(seq));
        assert_eq!(q.install_comp_efd(seq, 43, false), Install::AlreadyComplete);
        // The next submit into the same slot starts with no efd installed.
        for _ in 0..3 {
            q.client_submit(Box::new(0), None).unwrap();
            q.client_trigger_next().unwrap();
            assert_eq!(q.worker_pop_current_exec().unwrap().mark_comp_efd, NO_EFD);
        }
    }

    #[test]
    fn status_cells_publish_once() {
        let s = ExecStatus::new();
        assert_eq!(s.get(), None);
        s.publish(NrtStatus::ExecOob);
        assert_eq!(s.get(), Some(NrtStatus::ExecOob));
    }
}
