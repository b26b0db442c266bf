//! The completion engine: `exec_request_progress_one_step` over the NCs' notification queues
//! (DESIGN §3 step 8).
//!
//! Silicon has no completion interrupt, so the engine polls notification memory; on simdev the
//! worker also waits on the NC's notification eventfd between polls (the harvest code is the
//! same). A step never sleeps on that eventfd itself: it drains it, harvests, and when the
//! execution is still in flight names it as the XU's wake fd ([`CompletionEngine::wake_on`]),
//! so the vNC's worker epolls it beside its other XUs. Draining before harvesting means a
//! notification posted after the harvest leaves the eventfd readable: no wake-up is lost. Each step drains the NQ of every TPB the execution runs on: an `Execution` entry whose
//! `compute_idx` is this execution's completes that TPB; one with an older index is a late
//! notification of an execution that already timed out and is discarded — never credited to a
//! later one; one with a newer index (a later execution finished while this one's notification
//! is late) is held until its own execution asks for it ([`EARLY_LIMIT`] of them at most). A
//! `DeviceLost` entry fails the execution (fatal). A device that goes without posting one (a
//! killed simdev) is noticed by a reader that finds nothing posted: it asks the device whether
//! it hung up ([`crate::backend::Device::hung_up`]), at most once per [`HANGUP_CHECK`], and a
//! hang-up counts as a `DeviceLost` entry.
//!
//! # Other readers of the NQ: DMA queue errors
//! The NQ also carries `DmaQueueError` entries: a DMA queue stopped outside an execution (a
//! doorbell's DMA aborted), naming the queue in `source = engine << 8 | queue`. They belong to
//! whoever moves data on that queue — the tensor-op engine ([`crate::tensor_op`]) — so whichever
//! reader drains one records it in the engine's [`DmaQueueErrors`] board, where the owner of the
//! queue takes it ([`NqEngine::take_dma_error`]). The tensor-op step drains an NQ itself
//! ([`NqEngine::drain_for_dma_errors`]) when its completion word has not arrived; it takes no
//! Execution entry from the compute harvest: it holds them in the reader's `early` list, and the
//! compute harvest credits an early entry with its own `compute_idx` and discards (as stale,
//! counted) an early entry older than it, as it does for the entries it reads directly. A
//! `DeviceLost` entry, whoever reads it, marks the reader lost for good: every later harvest on
//! that NC fails with it.
//!
//! # Status decode and what is fatal to the XU
//! This section is the one statement of which statuses degrade a logical core. Seed 004 §5:
//! when `exec_request_progress_one_step` returns 2 ([`Progress::Error`] here) the worker sets
//! the XU to FATAL_SHUTDOWN, and every later submit gets NRT_EXEC_UNIT_UNRECOVERABLE (101); a
//! completion with an error status ([`Progress::Done`]) leaves it healthy. The rule: an
//! execution's status is fatal exactly when the device can no longer be trusted to run the next
//! execution — the device is lost, a DMA queue is stopped, NC or unrepairable HBM memory is
//! corrupt, or the execution timed out and may still be running. Errors confined to the
//! execution (an out-of-bounds access alone, a repairable HBM error, a generic or numerical
//! error) are not. The fault table in `scenarios/README.md` repeats this per injected fault, and
//! `tests/tests/fault_table.rs` checks it against [`decode_flags`].
//!
//! Flags are decoded in this order (the first present wins):
//!
//! | flag | status | fatal |
//! |---|---|---|
//! | DEVICE_LOST | NRT_HW_ERROR (6) | yes: the device is gone |
//! | OOB | NRT_EXEC_OOB (1006) | only with DMA_ABORT (a DMA engine refused the access mid-execution and its queue is stopped) |
//! | DMA_ABORT | NRT_EXEC_HW_ERR_DMA_ABORT (1203) | yes: the queue is stopped |
//! | NC_UE | NRT_EXEC_HW_ERR_NC_UE (1202) | yes |
//! | HBM_UE | NRT_EXEC_HW_ERR_HBM_UE (1201) | yes: results can no longer be trusted |
//! | HBM_UE_REPAIRABLE | NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE (1205) | no |
//! | GENERIC | NRT_EXEC_COMPLETED_WITH_ERR (1004) | no |
//! | NUMERICAL | NRT_EXEC_COMPLETED_WITH_NUM_ERR (1003) | no (outputs are delivered) |
//!
//! NUMERICAL counts only when numerical errors are reported
//! ([`NqEngine::with_numerical_errors`]: `NEURON_RT_NUMERICAL_ERRORS_VERBOSITY=critical` or
//! `NEURON_FAIL_ON_NAN=1`); by default, as libnrt since 2.25, such an execution is a success.
//! The flag stays in the execution's metrics either way.
//!
//! A timeout (`NEURON_RT_EXEC_TIMEOUT`) is NRT_TIMEOUT (5) and fatal: the NC may still be
//! running the execution, so nothing more can be queued behind it.
//!
//! # Why an execution failed
//! The status is all the notification says. An execution that ends with any status but
//! NRT_SUCCESS has the engine pass on what the device logged since the last such look
//! ([`Device::take_device_log`](crate::backend::Device::take_device_log), given by
//! [`NqEngine::with_device_log`]) as error lines of target `simdev` in this process's log: a
//! private simdev's log is otherwise a file removed with it, and the reason of a failed
//! execution (a reference's exception, a DMA abort, a golden file's mismatch) is there.

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use shared::NrtStatus;
use shared::notification::{
    NOTIFICATION_ENTRY_SIZE, NOTIFICATION_PHASE_OFFSET, NQ_HEADER_SIZE, NotificationEntry,
    NotificationKind, NqCursor, error_flags, phase_of,
};

use crate::backend::NotificationQueue;
use crate::bind::ExecResources;
use crate::sys_trace::{ExecStamp, SysTrace};
use crate::xu::{CompletionEngine, ExecInfo, MAX_TPBS_PER_VNC, Progress, Wake};

/// Most notifications of later executions held while an earlier one is late.
pub const EARLY_LIMIT: usize = 4096;

/// The longest the worker waits on a notification eventfd before stepping (checking the
/// deadline) again; a request with a deadline waits at most until its deadline.
///
/// Longer than the scheduler tick of any common kernel ([`LONGEST_TICK`]), so that on a busy
/// CPU the tick's timer always expires first: the epoll timeout of the wait is then queued and
/// cancelled without reprogramming the CPU's timer. A shorter slice (it was 2 ms, under a
/// 250 Hz tick) made every sync execution arm the hardware timer as the worker went to sleep
/// and again as it woke — a TSC-deadline register write, which in a VM exits to the
/// hypervisor (about 0.75 writes per execution, traced with `msr:write_msr`). A request that
/// makes no progress on the fd (a STOP, a lost notification) is still stepped within this
/// slice, well inside the shutdown drain's 100 ms poll.
pub const POLL_SLICE: Duration = Duration::from_millis(20);

/// How often a reader that finds nothing posted asks the device whether it hung up
/// ([`crate::backend::Device::hung_up`]): a killed simdev posts no DeviceLost entry, and its
/// executions would otherwise wait out their timeout.
pub const HANGUP_CHECK: Duration = POLL_SLICE;

/// The scheduler tick of `CONFIG_HZ=100`, the slowest common kernel configuration.
pub const LONGEST_TICK: Duration = Duration::from_millis(10);

const _: () = assert!(
    POLL_SLICE.as_nanos() > LONGEST_TICK.as_nanos(),
    "the worker's wait must outlast a scheduler tick"
);

/// Decodes notification error flags into the execution's status and whether it is fatal to the
/// XU (see the module table).
pub fn decode_flags(flags: u32) -> (NrtStatus, bool) {
    use error_flags as f;
    if flags & f::DEVICE_LOST != 0 {
        (NrtStatus::HwError, true)
    } else if flags & f::OOB != 0 {
        (NrtStatus::ExecOob, flags & f::DMA_ABORT != 0)
    } else if flags & f::DMA_ABORT != 0 {
        (NrtStatus::ExecHwErrDmaAbort, true)
    } else if flags & f::NC_UE != 0 {
        (NrtStatus::ExecHwErrNcUe, true)
    } else if flags & f::HBM_UE != 0 {
        (NrtStatus::ExecHwErrHbmUe, true)
    } else if flags & f::HBM_UE_REPAIRABLE != 0 {
        (NrtStatus::ExecHwErrRepairableHbmUe, false)
    } else if flags & f::GENERIC != 0 {
        (NrtStatus::ExecCompletedWithErr, false)
    } else if flags & f::NUMERICAL != 0 {
        (NrtStatus::ExecCompletedWithNumErr, false)
    } else {
        (NrtStatus::Success, false)
    }
}

/// One NC's notification queue as the engine reads it.
#[derive(Debug)]
pub struct NqReader {
    nq: NotificationQueue,
    cursor: NqCursor,
    notify_fd: Option<OwnedFd>,
    stale: u64,
    /// Notifications of executions after the one being harvested that arrived before it
    /// (possible when the device posts one late), or that another reader drained, held until
    /// their turn.
    early: Vec<NotificationEntry>,
    /// A DeviceLost entry was read, or the device hung up: it is gone (sticky).
    lost: bool,
    /// A DeviceLost entry was read (the device said so itself).
    lost_reported: bool,
    /// When the device may next be asked whether it hung up ([`HANGUP_CHECK`]).
    next_hangup_check: Option<Instant>,
}

impl NqReader {
    /// A reader at entry 0 of `nq`, sleeping on `notify_fd` between polls when there is one.
    pub fn new(nq: NotificationQueue, notify_fd: Option<OwnedFd>) -> Self {
        Self {
            cursor: NqCursor::new(nq.allocation.pa, nq.entries),
            nq,
            notify_fd,
            stale: 0,
            early: Vec::new(),
            lost: false,
            lost_reported: false,
            next_hangup_check: None,
        }
    }

    /// The next entry, if written (acquire on the phase word, then the body; the new head is
    /// published with release so the device may reuse the slot).
    pub fn try_next(&mut self) -> Option<NotificationEntry> {
        self.cursor.try_next(&self.nq.memory).ok().flatten()
    }

    /// Whether the entry at the cursor is written (the phase word matches, acquire), without
    /// consuming it: the test [`NqReader::try_next`] starts with, and no system call.
    pub fn has_posted(&self) -> bool {
        let entries = u64::from(self.nq.entries);
        if entries == 0 {
            return false;
        }
        let head = self.cursor.head();
        let base = self.nq.allocation.pa
            + NQ_HEADER_SIZE as u64
            + (head % entries) * NOTIFICATION_ENTRY_SIZE as u64;
        self.nq
            .memory
            .load_u32(base + NOTIFICATION_PHASE_OFFSET as u64, Ordering::Acquire)
            .is_ok_and(|phase| phase == phase_of(head / entries))
    }

    /// Late notifications discarded so far.
    pub fn stale(&self) -> u64 {
        self.stale
    }
}

/// Waits until `wake` says the in-flight request may have progressed (its fd readable, or its
/// `within` elapsed): for a caller that drives a [`CompletionEngine`] on its own thread (the
/// implicit-async pool) rather than through the XU worker's epoll. `None`: returns at once.
pub fn block_on_wake(wake: Option<Wake<'_>>) {
    let Some(w) = wake else { return };
    let ms = w.within.map_or(PollTimeout::NONE, |d| {
        PollTimeout::from(u16::try_from(d.as_millis().max(1)).unwrap_or(u16::MAX))
    });
    let mut fds = [PollFd::new(w.fd, PollFlags::POLLIN)];
    let _ = poll(&mut fds, ms);
}

/// Drains an NC's notification eventfd (non-blocking: nothing to read is fine).
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = nix::unistd::read(fd, &mut buf);
}

/// `DmaQueueError` notifications routed by the queue they name, until the queue's owner takes
/// them: per (NC, `source = engine << 8 | queue`) the error flags of the first one not yet
/// taken (a stopped queue stays stopped: later ones add nothing). At most one record per queue,
/// so the board is bounded by the device's queue count.
#[derive(Debug, Default)]
pub struct DmaQueueErrors {
    records: Mutex<Vec<(u32, u16, u32)>>,
}

impl DmaQueueErrors {
    /// Records a DmaQueueError of NC `nc` for queue `source` (the first one wins until taken).
    pub fn record(&self, nc: u32, source: u16, flags: u32) {
        let mut r = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !r.iter().any(|&(n, s, _)| (n, s) == (nc, source)) {
            r.push((nc, source, flags));
        }
    }

    /// Takes the record of queue `source` of NC `nc`: its error flags.
    pub fn take(&self, nc: u32, source: u16) -> Option<u32> {
        let mut r = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let pos = r.iter().position(|&(n, s, _)| (n, s) == (nc, source))?;
        Some(r.swap_remove(pos).2)
    }
}

/// The per-execution state the engine keeps in the work item (`exec_request` state).
#[derive(Debug, Default)]
pub struct ExecRequest {
    /// The physical NCs the execution runs on (`num_tpbs` of them).
    pub ncs: [u32; MAX_TPBS_PER_VNC],
    /// Number of NCs used.
    pub num_tpbs: usize,
    /// This execution's compute index: the main TPB's `compute_idx_tail++`, one index for the
    /// whole multi-NC execution (seed 000 §3, `kbl_compute_setup` QUIRK). Every NC of the vNC
    /// is staged in lockstep, so each NC reports the execution under this same index.
    pub compute_idx: u32,
    /// Which NCs have reported.
    pub done: [bool; MAX_TPBS_PER_VNC],
    /// Error flags reported by each NC.
    pub flags: [u32; MAX_TPBS_PER_VNC],
    /// When the execution times out.
    pub deadline: Option<Instant>,
    /// The bound resources, released when the work item is freed (with them, the model's
    /// in-flight count for the execution).
    pub resources: Option<ExecResources>,
    /// The system trace's stamp (set at stage while anything captures).
    pub trace: ExecStamp,
    /// The execution's sequence id for the timeline's harvest span (set at stage, or by the
    /// implicit-async pool, while [`crate::trace`] records).
    pub timeline_seq_id: u64,
    /// Marks the bound tensors as used by this scheduled request until the work item is freed
    /// (an explicit free is refused meanwhile, naming the request).
    pub hold: Option<crate::tensor::UseHold>,
}

/// One NC's reader and its notification eventfd (outside the lock: the worker epolls it).
#[derive(Debug)]
struct NcReader {
    nc: u32,
    notify_fd: Option<OwnedFd>,
    reader: Mutex<NqReader>,
}

/// The notification-queue completion engine: one [`NqReader`] per claimed NC.
#[derive(Debug)]
pub struct NqEngine {
    readers: Vec<NcReader>,
    stale_total: AtomicU64,
    /// Whether the NUMERICAL flag makes the status 1003 (else it is ignored).
    report_numerical_errors: bool,
    /// What the last timeout of each logical core waited for (for the error message).
    timeouts: Mutex<Vec<(u32, String)>>,
    /// Records each execution whose status it returns.
    trace: Arc<SysTrace>,
    /// Records the harvest span of each execution whose status it returns.
    timeline: Arc<crate::trace::Timeline>,
    /// DmaQueueError notifications, routed to the queue they name.
    dma_errors: DmaQueueErrors,
    /// The device: whose log a failed execution passes on (see the module doc), and whether
    /// it hung up.
    device: Option<Arc<dyn crate::backend::Device>>,
}

impl NqEngine {
    /// An engine over `(nc, reader)` pairs. The readers' notification eventfds are made
    /// non-blocking (a step drains them).
    pub fn new(readers: Vec<(u32, NqReader)>) -> Self {
        Self {
            readers: readers
                .into_iter()
                .map(|(nc, mut r)| {
                    let notify_fd = r.notify_fd.take();
                    if let Some(fd) = &notify_fd
                        && let Err(e) = fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
                    {
                        tracing::warn!(nc, errno = %e, "making the notification eventfd non-blocking");
                    }
                    NcReader {
                        nc,
                        notify_fd,
                        reader: Mutex::new(r),
                    }
                })
                .collect(),
            stale_total: AtomicU64::new(0),
            report_numerical_errors: false,
            timeouts: Mutex::new(Vec::new()),
            trace: Arc::new(SysTrace::new(Vec::new())),
            timeline: Arc::new(crate::trace::Timeline::disabled()),
            dma_errors: DmaQueueErrors::default(),
            device: None,
        }
    }

    /// Passes on `device`'s log lines when an execution fails (see the module doc), and asks
    /// it whether it hung up when a reader finds nothing ([`HANGUP_CHECK`]).
    #[must_use]
    pub fn with_device(mut self, device: Arc<dyn crate::backend::Device>) -> Self {
        self.device = Some(device);
        self
    }

    /// Marks `r` (NC `nc`'s reader, which found nothing posted) lost if the device hung up,
    /// asking at most once per [`HANGUP_CHECK`]; returns whether `r` is lost.
    fn check_hangup(&self, nc: u32, r: &mut NqReader) -> bool {
        let Some(device) = &self.device else {
            return r.lost;
        };
        if r.lost {
            return true;
        }
        let now = Instant::now();
        if r.next_hangup_check.is_some_and(|t| now < t) {
            return false;
        }
        r.next_hangup_check = Some(now + HANGUP_CHECK);
        if device.hung_up() {
            tracing::error!(
                nc,
                "the device is gone: its connection hung up (simdev exited or was killed)"
            );
            r.lost = true;
        }
        r.lost
    }

    /// A failed execution's explanation: what the device logged since the last look, as error
    /// lines of target `simdev` (the device's lines name the NC and the execution).
    fn pass_on_device_log(&self) {
        let Some(device) = &self.device else {
            return;
        };
        for line in device.take_device_log() {
            tracing::error!(target: "simdev", "{line}");
        }
    }

    /// Records every execution whose status the engine returns in `trace`.
    #[must_use]
    pub fn with_sys_trace(mut self, trace: Arc<SysTrace>) -> Self {
        self.trace = trace;
        self
    }

    /// Records the harvest span of every execution whose status the engine returns in
    /// `timeline`.
    #[must_use]
    pub fn with_timeline(mut self, timeline: Arc<crate::trace::Timeline>) -> Self {
        self.timeline = timeline;
        self
    }

    /// Reports numerical errors as NRT_EXEC_COMPLETED_WITH_NUM_ERR when `report` (see the
    /// module doc); the default ignores them.
    #[must_use]
    pub fn with_numerical_errors(mut self, report: bool) -> Self {
        self.report_numerical_errors = report;
        self
    }

    /// What logical core `vnc`'s last timeout waited for: the physical NCs whose notification
    /// was missing and the execution's `compute_idx`.
    pub fn timeout_detail(&self, vnc: u32) -> Option<String> {
        let t = self
            .timeouts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.iter().find(|(v, _)| *v == vnc).map(|(_, d)| d.clone())
    }

    fn record_timeout(&self, vnc: u32, req: &ExecRequest, n: usize) {
        let missing: Vec<String> = (0..n)
            .filter(|&i| !req.done[i])
            .map(|i| req.ncs[i].to_string())
            .collect();
        let detail = format!(
            "no notification from physical NC {} for compute_idx {} (logical core {vnc} = NC {})",
            missing.join(" and "),
            req.compute_idx,
            req.ncs[..n]
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" + "),
        );
        tracing::error!(
            vnc,
            "execution timed out: {detail}; degrading the execution unit"
        );
        let mut t = self
            .timeouts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.retain(|(v, _)| *v != vnc);
        t.push((vnc, detail));
    }

    fn nc_reader(&self, nc: u32) -> Option<&NcReader> {
        self.readers.iter().find(|r| r.nc == nc)
    }

    fn reader(&self, nc: u32) -> Option<&Mutex<NqReader>> {
        self.nc_reader(nc).map(|r| &r.reader)
    }

    /// Whether NC `nc`'s reader read a DeviceLost notification (the device reported itself
    /// lost).
    pub fn device_lost_reported(&self, nc: u32) -> bool {
        self.reader(nc).is_some_and(|r| {
            r.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .lost_reported
        })
    }

    /// Late notifications discarded so far (all NCs).
    pub fn stale_notifications(&self) -> u64 {
        self.stale_total.load(Ordering::Relaxed)
    }

    /// Takes the DmaQueueError recorded for queue `source` (`engine << 8 | queue`) of NC `nc`:
    /// its error flags (DMA_ABORT, with OOB for an out-of-bounds access).
    pub fn take_dma_error(&self, nc: u32, source: u16) -> Option<u32> {
        self.dma_errors.take(nc, source)
    }

    /// Drains NC `nc`'s notification queue for another reader than the compute harvest (the
    /// tensor-op step): DmaQueueError entries go to the board ([`NqEngine::take_dma_error`]),
    /// Execution entries are held in the reader's `early` list for the compute harvest (none is
    /// consumed here), DeviceLost marks the reader lost. Never blocks: when the compute harvest
    /// holds the reader, it is the one draining, and this returns at once. Returns whether the
    /// device was lost.
    pub fn drain_for_dma_errors(&self, nc: u32) -> bool {
        let Some(reader) = self.reader(nc) else {
            return false;
        };
        let mut r = match reader.try_lock() {
            Ok(r) => r,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        // The tensor-op step waits on this eventfd too: drain it before reading the queue (a
        // notification posted later re-arms it), and re-arm it for the compute harvest when
        // an Execution entry is held for it, so the compute XU's wait is not lost.
        if let Some(fd) = r.notify_fd.as_ref() {
            drain(fd);
        }
        let mut held = false;
        while r.early.len() < EARLY_LIMIT {
            let Some(e) = r.try_next() else { break };
            match NotificationKind::from_u16(e.kind) {
                Some(NotificationKind::Execution) => {
                    r.early.push(e);
                    held = true;
                }
                Some(NotificationKind::DeviceLost) => {
                    tracing::error!(nc, "the device was lost");
                    r.lost = true;
                    r.lost_reported = true;
                }
                Some(NotificationKind::DmaQueueError) => self.route_dma_error(nc, &e),
                None => tracing::warn!(nc, kind = e.kind, "unknown notification kind"),
            }
        }
        if held && let Some(fd) = r.notify_fd.as_ref() {
            let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
        }
        r.lost || (!held && self.check_hangup(nc, &mut r))
    }

    /// NC `nc`'s notification eventfd (simdev; `None` on silicon): what a step waiting for
    /// something the NC's notification queue may report waits on.
    pub(crate) fn notify_fd(&self, nc: u32) -> Option<BorrowedFd<'_>> {
        self.nc_reader(nc)?.notify_fd.as_ref().map(AsFd::as_fd)
    }

    fn route_dma_error(&self, nc: u32, e: &NotificationEntry) {
        tracing::warn!(
            nc,
            engine = e.source >> 8,
            queue = e.source & 0xff,
            flags = e.error_flags,
            "a DMA queue stopped outside an execution"
        );
        self.dma_errors.record(nc, e.source, e.error_flags);
    }

    /// Drains NC `i` of `req`; returns a fatal status if the NQ says so.
    fn harvest(
        &self,
        req: &mut ExecRequest,
        info_resp: &mut crate::metrics::TpbResponse,
        i: usize,
    ) -> Option<NrtStatus> {
        let nc = req.ncs[i];
        let Some(reader) = self.reader(nc) else {
            tracing::error!(nc, "no notification queue for NC");
            return Some(NrtStatus::Failure);
        };
        let mut r = reader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.lost {
            req.done[i] = true;
            req.flags[i] = error_flags::DEVICE_LOST;
            return None;
        }
        // Early entries older than this execution are late notifications of executions that
        // already ended (another reader may have drained them into `early`): stale.
        let before = r.early.len();
        r.early
            .retain(|e| (req.compute_idx.wrapping_sub(e.compute_idx) as i32) <= 0);
        let dropped = (before - r.early.len()) as u64;
        if dropped > 0 {
            r.stale += dropped;
            self.stale_total.fetch_add(dropped, Ordering::Relaxed);
            tracing::warn!(
                nc,
                dropped,
                current = req.compute_idx,
                "discarding late notifications held early"
            );
        }
        if let Some(pos) = r
            .early
            .iter()
            .position(|e| e.compute_idx == req.compute_idx)
        {
            let e = r.early.swap_remove(pos);
            req.done[i] = true;
            req.flags[i] = e.error_flags;
            *info_resp = crate::metrics::TpbResponse {
                device_ts_ns: e.device_ts_ns,
                nc_ns: e.nc_ts_ns,
                error_flags: e.error_flags,
            };
            return None;
        }
        while !req.done[i] {
            let Some(e) = r.try_next() else { break };
            match NotificationKind::from_u16(e.kind) {
                Some(NotificationKind::Execution) => {
                    let behind = req.compute_idx.wrapping_sub(e.compute_idx) as i32;
                    if behind > 0 {
                        r.stale += 1;
                        self.stale_total.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            nc,
                            late = e.compute_idx,
                            current = req.compute_idx,
                            "discarding a late notification"
                        );
                    } else if behind < 0 {
                        // A later execution finished first (this one's notification is late):
                        // keep it for its turn.
                        if r.early.len() >= EARLY_LIMIT {
                            tracing::error!(
                                nc,
                                got = e.compute_idx,
                                want = req.compute_idx,
                                "too many notifications ahead of a missing one"
                            );
                            return Some(NrtStatus::HwError);
                        }
                        r.early.push(e);
                    } else {
                        req.done[i] = true;
                        req.flags[i] = e.error_flags;
                        *info_resp = crate::metrics::TpbResponse {
                            device_ts_ns: e.device_ts_ns,
                            nc_ns: e.nc_ts_ns,
                            error_flags: e.error_flags,
                        };
                    }
                }
                Some(NotificationKind::DeviceLost) => {
                    tracing::error!(nc, "the device was lost");
                    r.lost = true;
                    r.lost_reported = true;
                    req.done[i] = true;
                    req.flags[i] = error_flags::DEVICE_LOST;
                }
                Some(NotificationKind::DmaQueueError) => self.route_dma_error(nc, &e),
                None => tracing::warn!(nc, kind = e.kind, "unknown notification kind"),
            }
        }
        if !req.done[i] && self.check_hangup(nc, &mut r) {
            req.done[i] = true;
            req.flags[i] = error_flags::DEVICE_LOST;
        }
        None
    }
}

/// An asynchronous execution's failure, named: its caller gets only a status (a sync caller
/// gets the error itself from `execute`).
fn log_async_failure(vnc: u32, req: &ExecRequest, status: NrtStatus) {
    let model = req
        .resources
        .as_ref()
        .and_then(ExecResources::model)
        .map_or_else(|| "?".to_owned(), |m| format!("{:?}", m.name()));
    let seq = req
        .hold
        .as_ref()
        .and_then(crate::tensor::UseHold::seq_id)
        .map_or_else(String::new, |s| format!(" (sequence id {:#x})", s.raw()));
    tracing::error!(
        "async execution of model {model} on logical core {vnc}{seq} ended with {status}"
    );
}

impl CompletionEngine for NqEngine {
    type Request = ExecRequest;

    /// One step ([`NqEngine::progress`]); an execution that ends here is recorded in the
    /// system trace, and this step is its timeline's `harvest` span.
    fn progress_one_step(&self, vnc: u32, info: &mut ExecInfo<ExecRequest>) -> Progress {
        let start = self.timeline.now();
        let p = self.progress(vnc, info);
        if let Progress::Done(s) | Progress::Error(s) = p {
            // Its outputs are written (counted before the completion is published, so a caller
            // that saw it complete finds the count already there).
            if matches!(s, NrtStatus::Success | NrtStatus::ExecCompletedWithNumErr)
                && let Some(r) = &info.request.resources
            {
                for t in r.outputs() {
                    t.output_completed();
                }
            }
            if s != NrtStatus::Success {
                self.pass_on_device_log();
                if !info.sync_exec {
                    log_async_failure(vnc, &info.request, s);
                }
            }
            self.trace.record_execution(vnc, info, s);
            if start.is_some() {
                let ids = crate::trace::ExecIds {
                    seq_id: info.request.timeline_seq_id,
                    compute_idx: info.request.compute_idx,
                    vnc,
                    model_id: info.model_id,
                };
                self.timeline
                    .record(crate::trace::SpanKind::Harvest, start, ids);
            }
        }
        p
    }

    /// The notification eventfd of the execution's first NC still to report, for at most
    /// [`POLL_SLICE`] (or until the deadline, if sooner).
    fn wake_on(&self, _vnc: u32, info: &ExecInfo<ExecRequest>) -> Option<Wake<'_>> {
        let req = &info.request;
        let n = req.num_tpbs.min(MAX_TPBS_PER_VNC);
        let first_pending = (0..n).find(|&i| !req.done[i])?;
        let fd = self.nc_reader(req.ncs[first_pending])?.notify_fd.as_ref()?;
        let within = req.deadline.map_or(POLL_SLICE, |d| {
            d.saturating_duration_since(Instant::now()).min(POLL_SLICE)
        });
        Some(Wake {
            fd: fd.as_fd(),
            within: Some(within),
        })
    }

    /// Whether every NC of the execution still to report has something to harvest: an entry
    /// posted at its NQ's cursor or held early (or the device was lost there). Reads the NQ's
    /// phase word only — no eventfd, nothing consumed — so the worker can step the execution
    /// at once after the previous one completed (a harvest burst).
    fn progress_posted(&self, _vnc: u32, info: &ExecInfo<ExecRequest>) -> bool {
        let req = &info.request;
        let n = req.num_tpbs.min(MAX_TPBS_PER_VNC);
        n > 0
            && (0..n).filter(|&i| !req.done[i]).all(|i| {
                self.reader(req.ncs[i]).is_some_and(|r| {
                    let r = r.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    r.lost || !r.early.is_empty() || r.has_posted()
                })
            })
    }

    /// The notification eventfd of the completed execution's first NC (the vNC's next
    /// execution reports there too), for [`NqEngine::IDLE_WATCH`]. A step that found its
    /// notification posted left the eventfd unread, and it is left so: the worker watches it
    /// edge-triggered ([`Wake::fd`]), so the watch ends on the next notification's write, not
    /// on this one's (whose wake-up the worker already had). No read on the hot path.
    fn idle_wake(&self, _vnc: u32, info: &ExecInfo<ExecRequest>) -> Option<Wake<'_>> {
        let req = &info.request;
        if req.num_tpbs == 0 {
            return None;
        }
        let fd = self.nc_reader(req.ncs[0])?.notify_fd.as_ref()?;
        Some(Wake {
            fd: fd.as_fd(),
            within: Some(Self::IDLE_WATCH),
        })
    }

    /// Whether nothing of `info` (never stepped) is posted yet on an NC of it that reports
    /// through `wake`'s eventfd: its notification there is posted later, and that write wakes
    /// the watch. Reads the NQ's phase word only, as
    /// [`CompletionEngine::progress_posted`] does; an NC that lost its device or holds an early
    /// entry counts as posted (a step would find it at once).
    fn progress_shows_on(&self, _vnc: u32, info: &ExecInfo<ExecRequest>, wake: &Wake<'_>) -> bool {
        let req = &info.request;
        let n = req.num_tpbs.min(MAX_TPBS_PER_VNC);
        (0..n).any(|i| {
            !req.done[i]
                && self.nc_reader(req.ncs[i]).is_some_and(|nc| {
                    nc.notify_fd
                        .as_ref()
                        .is_some_and(|fd| fd.as_raw_fd() == wake.fd.as_raw_fd())
                        && {
                            let r = nc
                                .reader
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            !r.lost && r.early.is_empty() && !r.has_posted()
                        }
                })
        })
    }
}

impl NqEngine {
    /// How long the worker watches the notification eventfd of a vNC whose last request just
    /// completed ([`CompletionEngine::idle_wake`]).
    pub const IDLE_WATCH: Duration = POLL_SLICE;

    /// Harvests each of the first `n` TPBs of `info` once; a fatal status if an NQ says so.
    fn harvest_all(&self, info: &mut ExecInfo<ExecRequest>, n: usize) -> Option<NrtStatus> {
        (0..n).find_map(|i| self.harvest(&mut info.request, &mut info.resp[i], i))
    }

    /// `exec_request_progress_one_step`: harvests each TPB's notification queue once; done
    /// when every TPB reported, an error on a fatal status or past the deadline.
    fn progress(&self, vnc: u32, info: &mut ExecInfo<ExecRequest>) -> Progress {
        let n = info.request.num_tpbs.min(MAX_TPBS_PER_VNC);
        // First without a system call: with executions queued back to back, the notification
        // is usually posted already. Only a step about to report InFlight (whose waker then
        // sleeps on the notification eventfds) drains them, and harvests again after the
        // drain: a notification posted after that harvest writes the fd again, so no wake-up
        // is lost. (The NQ is the truth; the eventfd only says "look again".)
        if let Some(fatal) = self.harvest_all(info, n) {
            return Progress::Error(fatal);
        }
        if !info.request.done[..n].iter().all(|d| *d) {
            let mut drained = false;
            for i in (0..n).filter(|&i| !info.request.done[i]) {
                if let Some(fd) = self
                    .nc_reader(info.request.ncs[i])
                    .and_then(|r| r.notify_fd.as_ref())
                {
                    drain(fd);
                    drained = true;
                }
            }
            if drained && let Some(fatal) = self.harvest_all(info, n) {
                return Progress::Error(fatal);
            }
        }
        let req = &info.request;
        if req.done[..n].iter().all(|d| *d) {
            let mut flags = req.flags[..n].iter().fold(0, |a, f| a | f);
            if !self.report_numerical_errors {
                flags &= !error_flags::NUMERICAL;
            }
            let (status, fatal) = decode_flags(flags);
            return if fatal {
                Progress::Error(status)
            } else {
                Progress::Done(status)
            };
        }
        let now = Instant::now();
        if let Some(deadline) = req.deadline {
            if now >= deadline {
                self.record_timeout(vnc, req, n);
                return Progress::Error(NrtStatus::Timeout);
            }
            // Silicon (no eventfd): a short sleep between polls; with an eventfd the worker
            // waits on it (`wake_on`).
            let first_pending = (0..n).find(|&i| !req.done[i]).unwrap_or(0);
            if self
                .nc_reader(req.ncs[first_pending])
                .is_some_and(|r| r.notify_fd.is_none())
            {
                std::thread::sleep((deadline - now).min(Duration::from_micros(20)));
            }
        }
        Progress::InFlight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Allocation, MemHandle};
    use crate::xu::ExecInfo;
    use shared::memory::SharedChunk;
    use shared::protocol::MemLocation;

    const PA: u64 = 0x1000_0000_0000;

    /// An in-memory NQ of `entries` entries and a writer that posts as simdev does.
    /// An engine over NC 3's 8-entry NQ with a non-blocking notification eventfd: the engine,
    /// the NQ's writer side, and a duplicate of the eventfd.
    fn engine_with_notify_fd() -> (NqEngine, SharedChunk, OwnedFd) {
        let (mut reader, w) = nq(8);
        let efd = nix::sys::eventfd::EventFd::from_value_and_flags(
            0,
            nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
        )
        .unwrap();
        let mine = efd.as_fd().try_clone_to_owned().unwrap();
        reader.notify_fd = Some(efd.into());
        (NqEngine::new(vec![(3, reader)]), w, mine)
    }

    fn nq(entries: u32) -> (NqReader, SharedChunk) {
        let len = shared::notification::nq_bytes(entries).next_multiple_of(4096);
        let file = tempfile::tempfile().unwrap();
        file.set_len(len as u64).unwrap();
        let reader_map = SharedChunk::map_fd(&file, PA, len, true).unwrap();
        let writer_map = SharedChunk::map_fd(&file, PA, len, true).unwrap();
        let allocation = Allocation {
            handle: MemHandle(1),
            pa: PA,
            size: len as u64,
            location: MemLocation::Host,
        };
        (
            NqReader::new(
                NotificationQueue {
                    allocation,
                    entries,
                    memory: reader_map,
                },
                None,
            ),
            writer_map,
        )
    }

    fn post(w: &SharedChunk, entries: u32, n: u64, compute_idx: u32, flags: u32) {
        let e = NotificationEntry {
            compute_idx,
            kind: NotificationKind::Execution as u16,
            error_flags: flags,
            device_ts_ns: 1000 * u64::from(compute_idx),
            ..Default::default()
        };
        post_entry(w, entries, n, &e);
    }

    /// Posts entry `n` of kind `kind` with `source` and `flags` (compute_idx 0).
    fn post_kind(
        w: &SharedChunk,
        entries: u32,
        n: u64,
        kind: NotificationKind,
        source: u16,
        flags: u32,
    ) {
        let e = NotificationEntry {
            kind: kind as u16,
            source,
            error_flags: flags,
            ..Default::default()
        };
        post_entry(w, entries, n, &e);
    }

    /// Writes `e` as entry `n` the way simdev does: the body with the phase word zeroed, then
    /// the phase word (release).
    fn post_entry(w: &SharedChunk, entries: u32, n: u64, e: &NotificationEntry) {
        let base =
            PA + NQ_HEADER_SIZE as u64 + (n % u64::from(entries)) * NOTIFICATION_ENTRY_SIZE as u64;
        let mut body = zerocopy::IntoBytes::as_bytes(e).to_vec();
        body[NOTIFICATION_PHASE_OFFSET..NOTIFICATION_PHASE_OFFSET + 4].copy_from_slice(&[0; 4]);
        w.write(base, &body).unwrap();
        w.store_u32(
            base + NOTIFICATION_PHASE_OFFSET as u64,
            phase_of(n / u64::from(entries)),
            Ordering::Release,
        )
        .unwrap();
    }

    #[test]
    fn dma_queue_errors_reach_the_queue_they_name_whoever_drains_them() {
        let (reader, w) = nq(8);
        let engine = NqEngine::new(vec![(3, reader)]);
        let (abort, oob) = (
            error_flags::DMA_ABORT,
            error_flags::DMA_ABORT | error_flags::OOB,
        );
        // The compute harvest drains one while it waits for its execution.
        post_kind(&w, 8, 0, NotificationKind::DmaQueueError, 0x0F0C, abort);
        let mut first = info(0);
        assert_eq!(engine.progress_one_step(0, &mut first), Progress::InFlight);
        // Another reader drains the next one; the Execution entry behind it is kept for compute.
        post_kind(&w, 8, 1, NotificationKind::DmaQueueError, 0x0F0D, oob);
        post(&w, 8, 2, 0, 0);
        assert!(!engine.drain_for_dma_errors(3));
        assert_eq!(engine.take_dma_error(3, 0x0F0C), Some(abort));
        assert_eq!(engine.take_dma_error(3, 0x0F0C), None, "taken once");
        assert_eq!(engine.take_dma_error(3, 0x0F0D), Some(oob));
        assert_eq!(engine.take_dma_error(4, 0x0F0D), None, "another NC");
        assert_eq!(
            engine.progress_one_step(0, &mut first),
            Progress::Done(NrtStatus::Success),
            "the drained Execution entry is credited to its execution"
        );
        assert_eq!(engine.stale_notifications(), 0);
    }

    #[test]
    fn early_entries_older_than_the_execution_are_discarded_as_stale() {
        let (reader, w) = nq(8);
        let engine = NqEngine::new(vec![(3, reader)]);
        // Execution 0 timed out; its late entry and execution 1's are drained by another
        // reader before execution 1's harvest.
        post(&w, 8, 0, 0, error_flags::GENERIC);
        post(&w, 8, 1, 1, 0);
        engine.drain_for_dma_errors(3);
        assert_eq!(
            engine.progress_one_step(0, &mut info(1)),
            Progress::Done(NrtStatus::Success)
        );
        assert_eq!(
            engine.stale_notifications(),
            1,
            "idx 0 discarded, not held forever"
        );
        let r = engine.reader(3).unwrap().lock().unwrap();
        assert!(r.early.is_empty(), "{:?}", r.early);
    }

    #[test]
    fn a_device_lost_drained_by_another_reader_fails_the_compute_harvest() {
        let (reader, w) = nq(8);
        let engine = NqEngine::new(vec![(3, reader)]);
        post_kind(&w, 8, 0, NotificationKind::DeviceLost, 0, 0);
        assert!(engine.drain_for_dma_errors(3), "lost");
        assert_eq!(
            engine.progress_one_step(0, &mut info(0)),
            Progress::Error(NrtStatus::HwError)
        );
    }

    /// The idle watch's test for a request released after the watch's fd was drained: covered
    /// while nothing of it is posted on the NC reporting through that fd; not once its entry
    /// is posted (the write that said so may have been drained), nor when another reader
    /// holds its entry early, nor for a watch on another fd.
    #[test]
    fn a_request_shows_on_the_idle_watch_only_while_nothing_of_it_is_posted_there() {
        let (engine, w, _fd) = engine_with_notify_fd();
        let mut first = info(0);
        post(&w, 8, 0, 0, 0);
        assert_eq!(
            engine.progress_one_step(0, &mut first),
            Progress::Done(NrtStatus::Success)
        );
        let wake = engine
            .idle_wake(0, &first)
            .expect("a watch on NC 3's eventfd");
        let next = info(1);
        assert!(engine.progress_shows_on(0, &next, &wake), "nothing posted");
        let other = nix::sys::eventfd::EventFd::new().unwrap();
        let elsewhere = Wake {
            fd: other.as_fd(),
            within: None,
        };
        assert!(
            !engine.progress_shows_on(0, &next, &elsewhere),
            "its NC does not report through that fd"
        );
        post(&w, 8, 1, 1, 0);
        assert!(!engine.progress_shows_on(0, &next, &wake), "posted");
        // Another reader drains it: held early for the harvest, still not covered.
        engine.drain_for_dma_errors(3);
        assert!(!engine.reader(3).unwrap().lock().unwrap().early.is_empty());
        assert!(!engine.progress_shows_on(0, &next, &wake), "held early");
    }

    fn info(compute_idx: u32) -> ExecInfo<ExecRequest> {
        let mut req = ExecRequest {
            num_tpbs: 1,
            deadline: Some(Instant::now() + Duration::from_secs(5)),
            ..Default::default()
        };
        req.ncs[0] = 3;
        req.compute_idx = compute_idx;
        ExecInfo::execute(1, req)
    }

    /// A step never sleeps on the notification eventfd: it drains it, harvests, and names it
    /// as the wake fd (the worker epolls it beside the vNC's other XUs). Draining comes before
    /// the harvest, so a notification posted afterwards leaves the fd readable.
    #[test]
    fn an_in_flight_step_drains_the_notification_fd_and_names_it_as_the_wake_fd() {
        use std::os::fd::AsRawFd;
        let (engine, w, mine) = engine_with_notify_fd();
        let mut exec = info(0);
        // A stale wake-up (count 5) and nothing posted: in flight, the fd drained.
        nix::unistd::write(&mine, &5u64.to_ne_bytes()).unwrap();
        let started = Instant::now();
        assert_eq!(engine.progress_one_step(0, &mut exec), Progress::InFlight);
        let mut fds = [PollFd::new(mine.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 0, "drained");
        let wake = engine.wake_on(0, &exec).expect("a wake fd on simdev");
        let engine_fd = engine.readers[0].notify_fd.as_ref().unwrap().as_raw_fd();
        assert_eq!(
            wake.fd.as_raw_fd(),
            engine_fd,
            "the NC's notification eventfd"
        );
        assert!(wake.within.is_some_and(|d| d <= POLL_SLICE));
        // The old step slept POLL_SLICE on the fd; this one returns without waiting for it.
        // (Bound generously: the guarantee is structural, the worker test checks the effect.)
        assert!(started.elapsed() < Duration::from_secs(1));
        post(&w, 8, 0, 0, 0);
        nix::unistd::write(&mine, &1u64.to_ne_bytes()).unwrap();
        assert_eq!(
            engine.progress_one_step(0, &mut exec),
            Progress::Done(NrtStatus::Success)
        );
        assert!(
            engine.wake_on(0, &exec).is_none(),
            "nothing left to wait for"
        );
    }

    /// A step that finds its notification already in the NQ (executions queued back to back)
    /// completes without a system call: it leaves the eventfd alone. A step that finds nothing
    /// drains it (and harvests again) before going in flight.
    #[test]
    fn a_step_whose_notification_is_posted_reads_no_eventfd_and_one_that_drains_harvests_again() {
        let (engine, w, mine) = engine_with_notify_fd();
        post(&w, 8, 0, 0, 0);
        post(&w, 8, 1, 1, 0);
        nix::unistd::write(&mine, &2u64.to_ne_bytes()).unwrap();
        for idx in 0..2 {
            let mut exec = info(idx);
            assert_eq!(
                engine.progress_one_step(0, &mut exec),
                Progress::Done(NrtStatus::Success)
            );
        }
        let mut fds = [PollFd::new(mine.as_fd(), PollFlags::POLLIN)];
        assert_eq!(
            poll(&mut fds, PollTimeout::ZERO).unwrap(),
            1,
            "both completions were harvested without reading the eventfd"
        );
        // Nothing posted for execution 2: the step drains (its waker sleeps on the fd next).
        let mut exec = info(2);
        assert_eq!(engine.progress_one_step(0, &mut exec), Progress::InFlight);
        assert_eq!(
            poll(&mut fds, PollTimeout::ZERO).unwrap(),
            0,
            "the step that goes in flight drained the eventfd"
        );
        post(&w, 8, 2, 2, 0);
        assert_eq!(
            engine.progress_one_step(0, &mut exec),
            Progress::Done(NrtStatus::Success)
        );
    }

    /// `progress_posted` (what lets the worker step the next execution without `epoll_wait`)
    /// is true exactly when the execution's notification is at the NQ's cursor or held early,
    /// and consumes nothing: the step after it still harvests the entry.
    #[test]
    fn progress_posted_sees_a_posted_or_early_notification_without_consuming_it() {
        let (engine, w, _mine) = engine_with_notify_fd();
        let exec0 = info(0);
        assert!(!engine.progress_posted(0, &exec0), "nothing posted");
        post(&w, 8, 0, 0, 0);
        assert!(engine.progress_posted(0, &exec0));
        assert!(
            engine.progress_posted(0, &exec0),
            "peeking consumed nothing"
        );
        let mut exec0 = exec0;
        assert_eq!(
            engine.progress_one_step(0, &mut exec0),
            Progress::Done(NrtStatus::Success)
        );
        let mut exec1 = info(1);
        assert!(!engine.progress_posted(0, &exec1), "the cursor moved on");
        // Execution 2's notification overtakes execution 1's: held early, so execution 1's
        // step has something to look at.
        post(&w, 8, 1, 2, 0);
        assert_eq!(engine.progress_one_step(0, &mut exec1), Progress::InFlight);
        assert!(engine.progress_posted(0, &exec1), "an entry is held early");
        post(&w, 8, 2, 1, 0);
        assert_eq!(
            engine.progress_one_step(0, &mut exec1),
            Progress::Done(NrtStatus::Success)
        );
    }

    /// The degrade rule (module doc): each flag's completion is `Progress::Error` (the worker
    /// poisons the XU, seed 004 §5) exactly when the status is fatal.
    #[test]
    fn only_fatal_statuses_complete_as_errors_that_poison_the_xu() {
        use error_flags as f;
        let cases = [
            (f::OOB, Progress::Done(NrtStatus::ExecOob)),
            (f::OOB | f::DMA_ABORT, Progress::Error(NrtStatus::ExecOob)),
            (f::DMA_ABORT, Progress::Error(NrtStatus::ExecHwErrDmaAbort)),
            (f::NC_UE, Progress::Error(NrtStatus::ExecHwErrNcUe)),
            (f::HBM_UE, Progress::Error(NrtStatus::ExecHwErrHbmUe)),
            (
                f::HBM_UE_REPAIRABLE,
                Progress::Done(NrtStatus::ExecHwErrRepairableHbmUe),
            ),
            (f::GENERIC, Progress::Done(NrtStatus::ExecCompletedWithErr)),
            (f::DEVICE_LOST, Progress::Error(NrtStatus::HwError)),
        ];
        for (flags, want) in cases {
            let (reader, w) = nq(4);
            let engine = NqEngine::new(vec![(3, reader)]);
            post(&w, 4, 0, 0, flags);
            assert_eq!(
                engine.progress_one_step(0, &mut info(0)),
                want,
                "flags {flags:#x}"
            );
        }
    }

    #[test]
    fn a_late_notification_is_never_credited_to_a_later_execution() {
        let (reader, w) = nq(4);
        let engine = NqEngine::new(vec![(3, reader)]);
        // Execution 0 timed out; its notification arrives while execution 1 waits.
        let mut second = info(1);
        post(&w, 4, 0, 0, error_flags::GENERIC);
        assert_eq!(
            engine.progress_one_step(0, &mut second),
            Progress::InFlight,
            "idx 0 is not ours"
        );
        assert_eq!(engine.stale_notifications(), 1);
        post(&w, 4, 1, 1, 0);
        assert_eq!(
            engine.progress_one_step(0, &mut second),
            Progress::Done(NrtStatus::Success)
        );
        assert_eq!(second.resp[0].device_ts_ns, 1000);
    }

    #[test]
    fn a_notification_overtaken_by_a_later_one_is_still_credited_in_order() {
        let (reader, w) = nq(8);
        let engine = NqEngine::new(vec![(3, reader)]);
        post(&w, 8, 0, 1, 0);
        let mut first = info(0);
        assert_eq!(
            engine.progress_one_step(0, &mut first),
            Progress::InFlight,
            "idx 1 is held, not ours"
        );
        post(&w, 8, 1, 0, error_flags::GENERIC);
        assert_eq!(
            engine.progress_one_step(0, &mut first),
            Progress::Done(NrtStatus::ExecCompletedWithErr)
        );
        let mut second = info(1);
        assert_eq!(
            engine.progress_one_step(0, &mut second),
            Progress::Done(NrtStatus::Success),
            "the held entry"
        );
        assert_eq!(second.resp[0].device_ts_ns, 1000);
    }

    #[test]
    fn entries_wrap_with_the_phase_and_a_missing_one_times_out() {
        let (reader, w) = nq(2);
        let engine = NqEngine::new(vec![(3, reader)]);
        for n in 0..5u32 {
            post(&w, 2, u64::from(n), n, 0);
            assert_eq!(
                engine.progress_one_step(0, &mut info(n)),
                Progress::Done(NrtStatus::Success),
                "entry {n}"
            );
        }
        post(&w, 2, 5, 7, 0);
        let mut waiting = info(5);
        waiting.request.deadline = Some(Instant::now() + Duration::from_millis(20));
        assert_eq!(
            engine.progress_one_step(0, &mut waiting),
            Progress::InFlight,
            "idx 7 is held"
        );
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(
            engine.progress_one_step(0, &mut waiting),
            Progress::Error(NrtStatus::Timeout)
        );
    }

    #[test]
    fn numerical_errors_are_success_unless_reported_and_the_flag_stays_in_the_metrics() {
        for (report, want) in [
            (false, NrtStatus::Success),
            (true, NrtStatus::ExecCompletedWithNumErr),
        ] {
            let (reader, w) = nq(4);
            let engine = NqEngine::new(vec![(3, reader)]).with_numerical_errors(report);
            post(&w, 4, 0, 0, error_flags::NUMERICAL);
            let mut i = info(0);
            assert_eq!(engine.progress_one_step(0, &mut i), Progress::Done(want));
            assert_eq!(i.resp[0].error_flags, error_flags::NUMERICAL);
            // Other errors are reported whatever the policy.
            post(&w, 4, 1, 1, error_flags::NUMERICAL | error_flags::GENERIC);
            assert_eq!(
                engine.progress_one_step(0, &mut info(1)),
                Progress::Done(NrtStatus::ExecCompletedWithErr)
            );
        }
    }

    #[test]
    fn an_lnc2_timeout_names_the_physical_nc_whose_notification_is_missing() {
        let (r4, w4) = nq(4);
        let (r5, _w5) = nq(4);
        let engine = NqEngine::new(vec![(4, r4), (5, r5)]);
        let mut i = info(9);
        i.request.num_tpbs = 2;
        i.request.ncs[..2].copy_from_slice(&[4, 5]);
        post(&w4, 4, 0, 9, 0);
        i.request.deadline = Some(Instant::now());
        assert_eq!(
            engine.progress_one_step(2, &mut i),
            Progress::Error(NrtStatus::Timeout)
        );
        let d = engine.timeout_detail(2).unwrap();
        assert!(d.contains("physical NC 5 "), "{d}");
        assert!(d.contains("compute_idx 9"), "{d}");
        assert!(d.contains("logical core 2 = NC 4 + 5"), "{d}");
        assert_eq!(engine.timeout_detail(0), None);
    }

    #[test]
    fn a_deadline_in_the_past_is_a_fatal_timeout() {
        let (reader, _w) = nq(2);
        let engine = NqEngine::new(vec![(3, reader)]);
        let mut i = info(0);
        i.request.deadline = Some(Instant::now());
        assert_eq!(
            engine.progress_one_step(0, &mut i),
            Progress::Error(NrtStatus::Timeout)
        );
    }

    #[test]
    fn flags_decode_with_the_documented_priority() {
        use error_flags as f;
        assert_eq!(decode_flags(0), (NrtStatus::Success, false));
        assert_eq!(
            decode_flags(f::NUMERICAL),
            (NrtStatus::ExecCompletedWithNumErr, false)
        );
        assert_eq!(
            decode_flags(f::GENERIC | f::NUMERICAL),
            (NrtStatus::ExecCompletedWithErr, false)
        );
        assert_eq!(decode_flags(f::OOB), (NrtStatus::ExecOob, false));
        assert_eq!(
            decode_flags(f::OOB | f::DMA_ABORT),
            (NrtStatus::ExecOob, true)
        );
        assert_eq!(
            decode_flags(f::DMA_ABORT),
            (NrtStatus::ExecHwErrDmaAbort, true)
        );
        assert_eq!(decode_flags(f::HBM_UE), (NrtStatus::ExecHwErrHbmUe, true));
        assert_eq!(
            decode_flags(f::HBM_UE_REPAIRABLE),
            (NrtStatus::ExecHwErrRepairableHbmUe, false)
        );
        assert_eq!(decode_flags(f::NC_UE), (NrtStatus::ExecHwErrNcUe, true));
        assert_eq!(
            decode_flags(f::DEVICE_LOST | f::GENERIC),
            (NrtStatus::HwError, true)
        );
    }
}
