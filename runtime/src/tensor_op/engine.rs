//! [`TensorOpEngine`]: the completion engine of the TENSOR_OP XUs (see the module doc of
//! [`crate::tensor_op`]).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shared::NrtStatus;
use shared::ids::SeqId;

use crate::backend::{Device, DmaQueueId};
use crate::completion::{NqEngine, decode_flags};
use crate::error::NrtError;
use crate::sys_trace::{self, SysTrace};
use crate::xu::{CompletionEngine, ExecInfo, Progress, Wake};

use super::channel::Channel;
use super::request::{TensorOpKind, TensorOpRequest};
use super::staging::StagingPool;
use super::{TENSOR_OP_DMA_ENGINE, TENSOR_OP_DMA_QUEUES, TENSOR_OP_QUEUES, TENSOR_OP_RING_DESCS};

/// How long a request whose completion word has not arrived waits before its XU is stepped
/// again: on the NC's notification eventfd (a DMA error arrives there), or asleep on silicon.
pub const POLL_INTERVAL: Duration = Duration::from_micros(20);

/// How the engine is built.
#[derive(Clone, Copy, Debug)]
pub struct TensorOpConfig {
    /// Descriptors per ring (a segment moves at most `(ring_descs − 1) × 64 KiB`).
    pub ring_descs: u32,
    /// A request whose completion has not arrived after this long is NRT_TIMEOUT (fatal to
    /// its XU): `NEURON_RT_EXEC_TIMEOUT`.
    pub timeout: Duration,
    /// Bytes of free staging each queue keeps for reuse.
    pub staging_retain: u64,
}

impl Default for TensorOpConfig {
    fn default() -> Self {
        Self {
            ring_descs: TENSOR_OP_RING_DESCS,
            timeout: Duration::from_secs(30),
            staging_retain: 64 << 20,
        }
    }
}

/// One (logical core, tensor-op queue): its channel (locked only by that XU's worker step, and
/// at release) and its staging pool.
#[derive(Debug)]
struct Lane {
    /// The NC whose DMA queue serves the lane (its notification queue reports the queue's
    /// errors).
    nc: u32,
    channel: Mutex<Option<Channel>>,
    staging: Arc<StagingPool>,
    /// Tests: the lane's requests stay in flight unposted ([`TensorOpEngine::stall_lane_for_test`]).
    #[cfg(test)]
    stalled: std::sync::atomic::AtomicBool,
}

/// Ends a test's stall of a lane when dropped.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct StallGuard<'a>(&'a Lane);

#[cfg(test)]
impl Drop for StallGuard<'_> {
    fn drop(&mut self) {
        self.0
            .stalled
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// The completion engine of every TENSOR_OP XU of a runtime: one lane per (logical core,
/// queue). Requests carry their queue index; the step is given the logical core.
#[derive(Debug)]
pub struct TensorOpEngine {
    device: Arc<dyn Device>,
    nq: Arc<NqEngine>,
    lanes: Vec<Lane>,
    timeout: Duration,
    /// The runtime's system trace: every tensor operation is recorded as it completes.
    trace: Option<Arc<SysTrace>>,
}

impl TensorOpEngine {
    /// Creates, for each logical core (`vnc_first_ncs[v]`: the first physical NC of logical
    /// core `v`) and each tensor-op queue, its DMA queue on that NC (engine
    /// [`TENSOR_OP_DMA_ENGINE`], queue [`TENSOR_OP_DMA_QUEUES`]`[q]`) with its rings, completion
    /// words and staging pool. `nq` is the engine that reads those NCs' notification queues.
    ///
    /// # Errors
    /// The device's errors (what was created is released).
    pub fn new(
        device: Arc<dyn Device>,
        nq: Arc<NqEngine>,
        vnc_first_ncs: &[u32],
        config: TensorOpConfig,
    ) -> Result<Self, NrtError> {
        let mut this = Self {
            device: device.clone(),
            nq,
            lanes: Vec::new(),
            timeout: config.timeout,
            trace: None,
        };
        for &nc in vnc_first_ncs {
            for dma_queue in TENSOR_OP_DMA_QUEUES {
                let id = DmaQueueId {
                    nc,
                    engine: TENSOR_OP_DMA_ENGINE,
                    queue: dma_queue,
                };
                match Channel::create(&device, id, config.ring_descs) {
                    Ok(ch) => this.lanes.push(Lane {
                        nc,
                        channel: Mutex::new(Some(ch)),
                        staging: Arc::new(StagingPool::new(device.clone(), config.staging_retain)),
                        #[cfg(test)]
                        stalled: std::sync::atomic::AtomicBool::new(false),
                    }),
                    Err(e) => {
                        this.release();
                        return Err(e);
                    }
                }
            }
        }
        Ok(this)
    }

    /// Records every completed tensor operation in `trace` (one relaxed load per completion
    /// while nothing captures).
    #[must_use]
    pub fn with_sys_trace(mut self, trace: Arc<SysTrace>) -> Self {
        self.trace = Some(trace);
        self
    }

    fn lane(&self, vnc: u32, queue: u8) -> Option<&Lane> {
        if queue >= TENSOR_OP_QUEUES {
            return None;
        }
        self.lanes
            .get(vnc as usize * usize::from(TENSOR_OP_QUEUES) + usize::from(queue))
    }

    fn channel(lane: &Lane) -> MutexGuard<'_, Option<Channel>> {
        lane.channel
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The DMA queue serving tensor-op queue `queue` of logical core `vnc`.
    pub fn dma_queue(&self, vnc: u32, queue: u8) -> Option<DmaQueueId> {
        Self::channel(self.lane(vnc, queue)?)
            .as_ref()
            .map(Channel::id)
    }

    /// Segments posted so far on tensor-op queue `queue` of logical core `vnc` (each a DMA
    /// doorbell ending with a completion pair).
    pub fn segments_posted(&self, vnc: u32, queue: u8) -> Option<u64> {
        Self::channel(self.lane(vnc, queue)?)
            .as_ref()
            .map(Channel::segments_posted)
    }

    /// Stalls (`vnc`, `queue`) until the guard drops: its requests stay in flight without being
    /// posted, and the step still returns at once (tests: a stalled queue beside working ones on
    /// the same worker).
    #[cfg(test)]
    pub(crate) fn stall_lane_for_test(&self, vnc: u32, queue: u8) -> StallGuard<'_> {
        let lane = self.lane(vnc, queue).expect("a lane");
        lane.stalled
            .store(true, std::sync::atomic::Ordering::Release);
        StallGuard(lane)
    }

    /// How long a tensor operation may take: the execution timeout.
    pub(crate) const fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The staging pool of tensor-op queue `queue` of logical core `vnc`.
    pub(crate) fn staging(&self, vnc: u32, queue: u8) -> Option<&Arc<StagingPool>> {
        self.lane(vnc, queue).map(|l| &l.staging)
    }

    /// Releases every DMA queue, completion page and kept staging chunk (runtime close, after
    /// the XUs drained).
    pub fn release(&self) {
        for lane in &self.lanes {
            if let Some(ch) = Self::channel(lane).take() {
                ch.release(self.device.as_ref());
            }
            lane.staging.release();
        }
    }

    /// The completion word has not arrived: a DmaQueueError for the queue (recorded by any
    /// reader of the NC's notification queue, or drained here) ends the request with its
    /// status; the device lost or the deadline passed end it too; else it is still in flight.
    fn not_arrived(&self, ch: &Channel, req: &TensorOpRequest) -> Progress {
        let (nc, source) = (ch.nc(), ch.source());
        let mut flags = self.nq.take_dma_error(nc, source);
        let mut lost = false;
        if flags.is_none() {
            lost = self.nq.drain_for_dma_errors(nc);
            flags = self.nq.take_dma_error(nc, source);
        }
        if let Some(flags) = flags {
            let (status, _) = decode_flags(flags);
            tracing::error!(queue = ?ch.id(), flags, %status, "a tensor operation's DMA queue stopped; degrading the execution unit");
            return Progress::Error(status);
        }
        if lost {
            tracing::error!(queue = ?ch.id(), done = req.done, len = req.len, "a tensor operation lost its device (the connection hung up); degrading the execution unit");
            return Progress::Error(NrtStatus::HwError);
        }
        if req.deadline.is_some_and(|d| Instant::now() >= d) {
            tracing::error!(queue = ?ch.id(), done = req.done, len = req.len, "a tensor operation timed out; degrading the execution unit");
            return Progress::Error(NrtStatus::Timeout);
        }
        // Silicon (no notification eventfd): a short sleep between polls; on simdev the
        // worker waits on the eventfd for at most POLL_INTERVAL (`wake_on`).
        if self.nq.notify_fd(ch.nc()).is_none() {
            std::thread::sleep(POLL_INTERVAL);
        }
        Progress::InFlight
    }

    /// Every byte landed: a read's bytes go from staging to the caller's buffer.
    fn finish(req: &TensorOpRequest) -> Progress {
        if req.kind == TensorOpKind::Read {
            let (Some(dest), Some((memory, pa))) = (
                &req.read_dest,
                req.staging.as_ref().and_then(|s| s.memory()),
            ) else {
                return Progress::Done(NrtStatus::Failure);
            };
            let len = usize::try_from(req.len).unwrap_or(usize::MAX);
            if let Err(e) = dest.fill(memory, pa, len) {
                tracing::error!(error = %e, "copying a tensor read out of staging");
                return Progress::Done(NrtStatus::Failure);
            }
        }
        Progress::Done(NrtStatus::Success)
    }
}

impl CompletionEngine for TensorOpEngine {
    type Request = TensorOpRequest;

    /// Posts the request's next segment when none is in flight; when the in-flight segment's
    /// token has arrived, counts it and posts the next (or finishes); else checks for a DMA
    /// error and returns in flight.
    fn progress_one_step(&self, vnc: u32, info: &mut ExecInfo<TensorOpRequest>) -> Progress {
        let req = &mut info.request;
        if req.kind == TensorOpKind::Stop || req.len == 0 {
            return Progress::Done(NrtStatus::Success);
        }
        let Some(lane) = self.lane(vnc, req.queue) else {
            tracing::error!(vnc, queue = req.queue, "no tensor-op lane");
            return Progress::Error(NrtStatus::Failure);
        };
        #[cfg(test)]
        if lane.stalled.load(std::sync::atomic::Ordering::Acquire) {
            return Progress::InFlight;
        }
        let mut guard = Self::channel(lane);
        let Some(ch) = guard.as_mut() else {
            return Progress::Error(NrtStatus::Closed);
        };
        let deadline = *req.deadline.get_or_insert_with(|| {
            let now = Instant::now();
            req.started = Some(now);
            now + self.timeout
        });
        loop {
            if let Some((token, bytes)) = req.in_flight {
                if !ch.arrived(token) {
                    return self.not_arrived(ch, req);
                }
                req.in_flight = None;
                req.done += bytes;
                if req.done >= req.len {
                    return Self::finish(req);
                }
            }
            let bytes = (req.len - req.done).min(ch.max_segment_bytes());
            match ch.post(
                self.device.as_ref(),
                req.src_pa + req.done,
                req.dst_pa + req.done,
                bytes,
                deadline,
            ) {
                Ok(token) => req.in_flight = Some((token, bytes)),
                Err(status) => {
                    // A queue stopped earlier: its notification says why, if it is there.
                    let flags = self.nq.take_dma_error(ch.nc(), ch.source());
                    let status = flags.map_or(status, |f| decode_flags(f).0);
                    tracing::error!(queue = ?ch.id(), %status, "a tensor operation's DMA doorbell failed; degrading the execution unit");
                    return Progress::Error(status);
                }
            }
        }
    }

    /// Records the tensor operation in the system trace: seq id, queue, bytes, its submit,
    /// start (first step; its submit when it never started) and end, and status. One relaxed
    /// load and no allocation while nothing captures.
    fn completed(
        &self,
        vnc: u32,
        seq_id: SeqId,
        info: &ExecInfo<TensorOpRequest>,
        status: NrtStatus,
    ) {
        let Some(trace) = &self.trace else {
            return;
        };
        if !trace.armed() {
            return;
        }
        let req = &info.request;
        let op = match req.kind {
            TensorOpKind::Read => sys_trace::TensorOpKind::Read,
            TensorOpKind::Write => sys_trace::TensorOpKind::Write,
            TensorOpKind::Copy => sys_trace::TensorOpKind::Copy,
            TensorOpKind::Stop => return,
        };
        trace.record_tensor_op(
            vnc,
            &sys_trace::TensorOp {
                op,
                seq_id: seq_id.raw(),
                queue: u32::from(req.queue),
                bytes: req.len,
                submit: info.submission_ts,
                start: req.started.unwrap_or(info.submission_ts),
                end: Instant::now(),
                status,
            },
        );
    }

    /// A request in flight waits on its NC's notification eventfd (a DMA error of its queue
    /// arrives there) for at most [`POLL_INTERVAL`], then its completion word is checked again.
    fn wake_on(&self, vnc: u32, info: &ExecInfo<TensorOpRequest>) -> Option<Wake<'_>> {
        let req = &info.request;
        let lane = self.lane(vnc, req.queue)?;
        #[cfg(test)]
        let stalled = lane.stalled.load(std::sync::atomic::Ordering::Acquire);
        #[cfg(not(test))]
        let stalled = false;
        if req.in_flight.is_none() && !stalled {
            return None;
        }
        let fd = self.nq.notify_fd(lane.nc)?;
        let within = req.deadline.map_or(POLL_INTERVAL, |d| {
            d.saturating_duration_since(Instant::now())
                .min(POLL_INTERVAL)
        });
        Some(Wake {
            fd,
            within: Some(within),
        })
    }
}
