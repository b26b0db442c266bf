//! The explicit async API's tensor operations (`nrta_tensor_write`, `nrta_tensor_read`,
//! `nrta_tensor_copy`; issue 12 item 2) and `nrt_tensor_free` (item 4), on [`Runtime`].
//!
//! Each call checks everything before anything is enqueued — each refusal is NRT_INVALID
//! naming what was wrong, with nothing changed: the queue index (0 or 1), the logical core, a
//! size of 0 (refused: every sequence number of a TENSOR_OP XU stands for bytes the DMA moved;
//! libnrt's documentation does not say what 0 does), the tensor's placement (device tensors
//! only; on `lnc_idx`, both tensors of a copy on one logical core), its runtime, and
//! `offset + size` within the tensor (overflow-safe). A write copies the caller's bytes into
//! DMA-able staging before it returns; a read's bytes reach its [`ReadBuffer`] before the
//! request shows as completed. QUEUE_FULL consumes no sequence and writes no slot.
//!
//! **Nothing is freed under a scheduled request.** A scheduled tensor operation or
//! explicit-async execution holds the storage of every tensor it uses until its work item is
//! freed at completion, and marks them ([`crate::tensor::UseHold`]):
//! [`Runtime::tensor_free`] refuses such a tensor with NRT_INVALID naming the request's
//! sequence id (nothing is freed; free it again once the request completed). `nrt_unload`
//! waits for the model's scheduled executions, as the sync path does (the in-flight count each
//! work item holds), then frees the model.
//!
//! The TENSOR_OP XUs ([`TensorOps`]) sit in the runtime's XU table; the logical core's one
//! worker steps them beside its COMPUTE XU. A tensor operation is waited on and asked about
//! like any scheduled request: each call returns a [`ScheduledRequest`] (as
//! `execute_schedule` does), for [`Runtime::wait`], [`Runtime::is_completed`],
//! [`Runtime::get_sequence`] and the event registrations. Each one is recorded in the system
//! trace as it completes (the engine's [`crate::xu::CompletionEngine::completed`]).

use std::sync::Arc;

use shared::NrtStatus;
use shared::ids::{SeqId, XuType};

use super::{Runtime, ScheduledRequest, status_err};
use crate::backend::Device;
use crate::completion::NqEngine;
use crate::config::RuntimeConfig;
use crate::error::{NrtError, NrtResult};
use crate::metrics::Metrics;
use crate::sys_trace::SysTrace;
use crate::tensor::{Placement, ScheduledUser, Tensor, UseHold};
use crate::tensor_op::request::TensorOpKind;
use crate::tensor_op::staging::StagingLease;
use crate::tensor_op::{
    ReadBuffer, TENSOR_OP_QUEUES, TensorOpConfig, TensorOpEngine, TensorOpRequest,
};
use crate::xu::{ExecInfo, ExecStatus, ExecutionUnit, Xu, XuConfig};

/// The TENSOR_OP XUs of a runtime: per logical core `v`, queues 0 and 1 at `xus[2v]`,
/// `xus[2v + 1]`, their engine and metrics (kept apart from the executions'). The XUs live in
/// the runtime's XU table beside the logical core's COMPUTE and COLLECTIVES XUs, and the
/// core's one worker steps them all.
#[derive(Debug)]
pub(crate) struct TensorOps {
    engine: Arc<TensorOpEngine>,
    xus: Vec<Arc<Xu<TensorOpEngine>>>,
    metrics: Arc<Metrics>,
}

impl TensorOps {
    /// Creates the engine (a DMA queue per logical core and queue) and two TENSOR_OP XUs per
    /// logical core; the runtime puts them in its XU table, whose workers step them.
    pub(crate) fn new(
        device: &Arc<dyn Device>,
        nq: &Arc<NqEngine>,
        vncs: &[Vec<u32>],
        config: &RuntimeConfig,
        trace: &Arc<SysTrace>,
    ) -> NrtResult<Self> {
        let first_ncs: Vec<u32> = vncs.iter().filter_map(|v| v.first().copied()).collect();
        let engine = Arc::new(
            TensorOpEngine::new(
                device.clone(),
                nq.clone(),
                &first_ncs,
                TensorOpConfig {
                    timeout: config.exec_timeout,
                    ..TensorOpConfig::default()
                },
            )?
            .with_sys_trace(trace.clone()),
        );
        let metrics = Arc::new(Metrics::new(device.info().nc_count as usize));
        let mut xus = Vec::new();
        let built = (|| {
            for (v, ncs) in vncs.iter().enumerate() {
                for queue in 0..TENSOR_OP_QUEUES {
                    let cfg = XuConfig {
                        vnc: u32::try_from(v).unwrap_or(u32::MAX),
                        queue,
                        tpbs: ncs.clone(),
                        capacity: config.xu_capacity,
                        efd_pool_size: config.xu_capacity,
                        implicit_async_mode: false,
                    };
                    let xu = Xu::new_typed(XuType::TensorOp, cfg, engine.clone(), metrics.clone())
                        .map_err(|e| {
                            status_err(
                                e.status,
                                format!("creating a tensor-op execution unit: {}", e.message),
                            )
                        })?;
                    xus.push(Arc::new(xu));
                }
            }
            Ok(())
        })();
        match built {
            Ok(()) => Ok(Self {
                engine,
                xus,
                metrics,
            }),
            Err(e) => {
                engine.release();
                Err(e)
            }
        }
    }

    /// The TENSOR_OP XUs of logical core `vnc`, for the XU table.
    pub(crate) fn xus_of(&self, vnc: u32) -> impl Iterator<Item = Arc<dyn ExecutionUnit>> + '_ {
        (0..TENSOR_OP_QUEUES)
            .filter_map(move |q| self.xu(vnc, q))
            .map(|xu| xu.clone() as Arc<dyn ExecutionUnit>)
    }

    /// Releases the DMA queues and staging, once the XUs are shut down (`tpb_xu_shutdown`)
    /// and their workers joined.
    pub(crate) fn release(self) {
        self.engine.release();
    }

    fn xu(&self, vnc: u32, queue: u8) -> Option<&Arc<Xu<TensorOpEngine>>> {
        self.xus
            .get(vnc as usize * usize::from(TENSOR_OP_QUEUES) + usize::from(queue))
    }
}

/// Names a request for messages: `0x… (TENSOR_OP queue 1 of logical core 0)`.
pub(crate) fn describe(seq: SeqId) -> String {
    let id = seq.xu_id();
    let kind = match id.xu_type() {
        Some(XuType::TensorOp) => "TENSOR_OP",
        Some(XuType::Compute) => "COMPUTE",
        Some(XuType::Collectives) => "COLLECTIVES",
        None => "unknown XU type",
    };
    format!(
        "{:#x} ({kind} queue {} of logical core {})",
        seq.raw(),
        id.queue(),
        id.vnc_id()
    )
}

fn invalid(msg: String) -> NrtError {
    status_err(NrtStatus::Invalid, msg)
}

/// A tensor write checked and copied into staging, not yet scheduled
/// ([`Runtime::tensor_write_stage`]; scheduled by [`Runtime::tensor_write_submit`]).
#[derive(Debug)]
pub struct StagedTensorWrite {
    lnc: u32,
    queue: u8,
    req: TensorOpRequest,
}

impl Runtime {
    fn tensor_ops(&self) -> NrtResult<&TensorOps> {
        self.tensor_ops
            .as_ref()
            .ok_or_else(|| status_err(NrtStatus::Closed, "the runtime is closing"))
    }

    /// The TENSOR_OP XU of queue `queue` (0 or 1) of logical core `lnc`.
    pub fn tensor_op_xu(&self, lnc: u32, queue: u8) -> Option<&Arc<Xu<TensorOpEngine>>> {
        self.tensor_ops.as_ref()?.xu(lnc, queue)
    }

    /// The TENSOR_OP XUs' completion engine.
    pub fn tensor_op_engine(&self) -> Option<&Arc<TensorOpEngine>> {
        self.tensor_ops.as_ref().map(|t| &t.engine)
    }

    /// Per-NC counts and latencies of the completed tensor operations (apart from the
    /// executions' [`Runtime::metrics`]).
    pub fn tensor_op_metrics(&self) -> Option<&Arc<Metrics>> {
        self.tensor_ops.as_ref().map(|t| &t.metrics)
    }

    fn tensor_op_queue(queue: i32) -> NrtResult<u8> {
        u8::try_from(queue)
            .ok()
            .filter(|q| *q < TENSOR_OP_QUEUES)
            .ok_or_else(|| {
                invalid(format!(
                    "tensor-op queue {queue} does not exist: a logical core has TENSOR_OP queues 0 and 1"
                ))
            })
    }

    fn tensor_op_lnc(&self, lnc: i32) -> NrtResult<u32> {
        self.visible_core(i64::from(lnc))
    }

    /// Checks that `t` (the request's `role`) is a device tensor of this runtime — on logical
    /// core `lnc` when that is `Some` (a copy stays on one core) — and that `offset + size`
    /// lies within it; returns the device PA at `offset`.
    fn tensor_op_span(
        &self,
        role: &str,
        t: &Tensor,
        offset: u64,
        size: u64,
        lnc: Option<u32>,
    ) -> NrtResult<u64> {
        let name = t.name();
        let Placement::Device { vnc } = t.placement() else {
            return Err(invalid(format!(
                "{role} tensor {name:?} is in host memory: tensor operations move data to and from device tensors"
            )));
        };
        if t.runtime() != Some(self.id) {
            return Err(invalid(format!(
                "{role} tensor {name:?} was allocated by {}, not by this runtime ({}): its memory is not this runtime's",
                t.runtime()
                    .map_or_else(|| "no runtime".to_string(), |r| r.to_string()),
                self.id
            )));
        }
        if let Some(lnc) = lnc
            && vnc != lnc
        {
            return Err(invalid(format!(
                "{role} tensor {name:?} is on logical core {vnc}, the request is for logical core {lnc}"
            )));
        }
        if offset.checked_add(size).is_none_or(|end| end > t.size()) {
            return Err(invalid(format!(
                "{role} tensor {name:?}: offset {offset} + size {size} is beyond its {} bytes",
                t.size()
            )));
        }
        t.device_pa()
            .map(|pa| pa + offset)
            .ok_or_else(|| invalid(format!("{role} tensor {name:?} has no device address")))
    }

    fn check_size(size: u64) -> NrtResult<()> {
        if size == 0 {
            return Err(invalid(
                "size 0: a tensor operation must move at least one byte".to_string(),
            ));
        }
        Ok(())
    }

    fn tensor_op_xu_checked(&self, lnc: u32, queue: u8) -> NrtResult<&Arc<Xu<TensorOpEngine>>> {
        self.tensor_ops()?
            .xu(lnc, queue)
            .ok_or_else(|| invalid(format!("no TENSOR_OP queue {queue} on logical core {lnc}")))
    }

    /// The funnel's refusals seen before any staging is leased or filled (the funnel checks
    /// again under its lock): a degraded or full queue costs the caller no copy.
    fn tensor_op_precheck(&self, lnc: u32, queue: u8) -> NrtResult<()> {
        let xu = self.tensor_op_xu_checked(lnc, queue)?;
        let refused = if xu.health() == crate::xu::XuHealth::FatalShutdown {
            Some(NrtStatus::ExecUnitUnrecoverable)
        } else if xu.depth() >= self.config.xu_capacity as u64 {
            Some(NrtStatus::QueueFull)
        } else {
            None
        };
        refused.map_or(Ok(()), |s| Err(Self::tensor_op_refusal(s, lnc, queue)))
    }

    fn tensor_op_refusal(s: NrtStatus, lnc: u32, queue: u8) -> NrtError {
        let msg = match s {
            NrtStatus::ExecUnitUnrecoverable => format!(
                "TENSOR_OP queue {queue} of logical core {lnc} is degraded by an earlier fatal error"
            ),
            NrtStatus::QueueFull => format!(
                "TENSOR_OP queue {queue} of logical core {lnc} is full; nothing was scheduled"
            ),
            NrtStatus::Closed => "the runtime is closing".to_string(),
            s => format!("scheduling on TENSOR_OP queue {queue} of logical core {lnc}: {s}"),
        };
        status_err(s, msg)
    }

    /// Schedules `req` on TENSOR_OP queue `queue` of logical core `lnc` through the XU funnel
    /// and names its hold with the sequence id.
    fn schedule_tensor_op(
        &self,
        lnc: u32,
        queue: u8,
        mut req: TensorOpRequest,
    ) -> NrtResult<ScheduledRequest> {
        let xu = self.tensor_op_xu_checked(lnc, queue)?;
        let hold = UseHold::on(&req.tensors);
        let namer = hold.namer();
        req.hold = Some(hold);
        req.queue = queue;
        let status = Arc::new(ExecStatus::new());
        let seq_id = xu
            .schedule_request(
                xu.work_item(ExecInfo::execute(0, req)),
                Some(status.clone()),
                |_, _| Ok(()),
                |_| Ok(()),
            )
            .map_err(|s| Self::tensor_op_refusal(s, lnc, queue))?;
        namer.name(seq_id);
        Ok(ScheduledRequest::new(seq_id, status))
    }

    /// Checks that (`lnc`, `queue`) takes work, then leases `size` bytes of its DMA-able
    /// staging.
    fn tensor_op_staging(&self, lnc: u32, queue: u8, size: u64) -> NrtResult<StagingLease> {
        self.tensor_op_precheck(lnc, queue)?;
        let pool = self
            .tensor_ops()?
            .engine
            .staging(lnc, queue)
            .ok_or_else(|| {
                invalid(format!(
                    "no staging for queue {queue} of logical core {lnc}"
                ))
            })?;
        // A request's own deadline, as its DMA doorbell has (the timeout is capped at u32::MAX
        // seconds: the sum cannot overflow).
        let timeout = self.tensor_ops()?.engine.timeout();
        pool.lease(size, std::time::Instant::now() + timeout)
    }

    /// The checks a tensor write and read share, in order: the process, the queue index, the
    /// logical core, the size, and `size` bytes at `offset` of `tensor` (the `what` side of the
    /// transfer). The tensor may be on any logical core of this runtime: `lnc_idx` chooses the
    /// DMA engines (and the queue) that move the bytes, which reach the whole device's HBM
    /// (nrt-api.md §2.10). Returns the queue, the core and the device PA of the span.
    fn host_transfer_target(
        &self,
        what: &'static str,
        tensor: &Tensor,
        offset: u64,
        size: u64,
        lnc_idx: i32,
        queue: i32,
    ) -> NrtResult<(u8, u32, u64)> {
        self.check_process()?;
        let queue = Self::tensor_op_queue(queue)?;
        let lnc = self.tensor_op_lnc(lnc_idx)?;
        Self::check_size(size)?;
        let pa = self.tensor_op_span(what, tensor, offset, size, None)?;
        Ok((queue, lnc, pa))
    }

    /// `nrta_tensor_write`: schedules a copy of `buf` to byte `offset` of device tensor
    /// `tensor` on TENSOR_OP queue `queue` of logical core `lnc_idx`. The bytes are copied into
    /// staging before this returns: `buf` may be reused at once. The two halves,
    /// [`Runtime::tensor_write_stage`] and [`Runtime::tensor_write_submit`], let a caller that
    /// serializes its scheduling (libnrt records each request as it is scheduled) hold its lock
    /// for the submit only, not for the copy of a large buffer.
    ///
    /// # Errors
    /// NRT_INVALID (see the module doc; nothing changed), NRT_QUEUE_FULL (nothing changed),
    /// NRT_EXEC_UNIT_UNRECOVERABLE on a degraded queue, NRT_RESOURCE when staging cannot be
    /// allocated.
    pub fn tensor_write_schedule(
        &self,
        tensor: &Tensor,
        buf: &[u8],
        offset: u64,
        lnc_idx: i32,
        queue: i32,
    ) -> NrtResult<ScheduledRequest> {
        let staged = self.tensor_write_stage(tensor, buf, offset, lnc_idx, queue)?;
        self.tensor_write_submit(staged)
    }

    /// The first half of [`Runtime::tensor_write_schedule`]: checks the write and copies `buf`
    /// into a staging chunk of the queue; nothing is scheduled yet (dropped, the chunk goes
    /// back to the pool).
    ///
    /// # Errors
    /// As [`Runtime::tensor_write_schedule`], but never NRT_QUEUE_FULL.
    pub fn tensor_write_stage(
        &self,
        tensor: &Tensor,
        buf: &[u8],
        offset: u64,
        lnc_idx: i32,
        queue: i32,
    ) -> NrtResult<StagedTensorWrite> {
        let (queue, lnc, dst_pa) = self.host_transfer_target(
            "destination",
            tensor,
            offset,
            buf.len() as u64,
            lnc_idx,
            queue,
        )?;
        let size = buf.len() as u64;
        let staging = self.tensor_op_staging(lnc, queue, size)?;
        staging.write(buf)?;
        let req = TensorOpRequest {
            kind: TensorOpKind::Write,
            src_pa: staging.pa(),
            dst_pa,
            len: size,
            staging: Some(staging),
            tensors: vec![tensor.clone()],
            ..TensorOpRequest::default()
        };
        Ok(StagedTensorWrite { lnc, queue, req })
    }

    /// The second half of [`Runtime::tensor_write_schedule`]: schedules a staged write.
    ///
    /// # Errors
    /// As [`Runtime::tensor_write_schedule`].
    pub fn tensor_write_submit(&self, staged: StagedTensorWrite) -> NrtResult<ScheduledRequest> {
        let StagedTensorWrite { lnc, queue, req } = staged;
        self.schedule_tensor_op(lnc, queue, req)
    }

    /// `nrta_tensor_read`: schedules a copy of `size` bytes from byte `offset` of device tensor
    /// `tensor` into the start of `dest` on TENSOR_OP queue `queue` of logical core `lnc_idx`.
    /// `dest` holds the bytes once the request completed with NRT_SUCCESS.
    ///
    /// # Errors
    /// As [`Runtime::tensor_write_schedule`]; NRT_INVALID for a `dest` shorter than `size`.
    pub fn tensor_read_schedule(
        &self,
        dest: &ReadBuffer,
        tensor: &Tensor,
        offset: u64,
        size: u64,
        lnc_idx: i32,
        queue: i32,
    ) -> NrtResult<ScheduledRequest> {
        let (queue, lnc, src_pa) =
            self.host_transfer_target("source", tensor, offset, size, lnc_idx, queue)?;
        if (dest.len() as u64) < size {
            return Err(invalid(format!(
                "the read's destination holds {} bytes, the read is {size} bytes",
                dest.len()
            )));
        }
        let staging = self.tensor_op_staging(lnc, queue, size)?;
        let req = TensorOpRequest {
            kind: TensorOpKind::Read,
            src_pa,
            dst_pa: staging.pa(),
            len: size,
            staging: Some(staging),
            read_dest: Some(dest.clone()),
            tensors: vec![tensor.clone()],
            ..TensorOpRequest::default()
        };
        self.schedule_tensor_op(lnc, queue, req)
    }

    /// `nrta_tensor_copy`: schedules a device-to-device copy of `size` bytes from byte
    /// `src_offset` of `src` to byte `dst_offset` of `dst`, both device tensors of one logical
    /// core, on that core's TENSOR_OP queue `queue`.
    ///
    /// # Errors
    /// As [`Runtime::tensor_write_schedule`]; NRT_INVALID for tensors on two logical cores.
    pub fn tensor_copy_schedule(
        &self,
        src: &Tensor,
        src_offset: u64,
        dst: &Tensor,
        dst_offset: u64,
        size: u64,
        queue: i32,
    ) -> NrtResult<ScheduledRequest> {
        self.check_process()?;
        let queue = Self::tensor_op_queue(queue)?;
        Self::check_size(size)?;
        let lnc = match src.placement() {
            Placement::Device { vnc } => vnc,
            Placement::Host => {
                return Err(invalid(format!(
                    "source tensor {:?} is in host memory: tensor operations move data to and from device tensors",
                    src.name()
                )));
            }
        };
        let src_pa = self.tensor_op_span("source", src, src_offset, size, Some(lnc))?;
        let dst_pa = self
            .tensor_op_span("destination", dst, dst_offset, size, Some(lnc))
            .map_err(|mut e| {
                if matches!(dst.placement(), Placement::Device { vnc } if vnc != lnc) {
                    e.message = format!(
                        "a copy stays on one logical core: {} (the source is on logical core {lnc})",
                        e.message
                    );
                }
                e
            })?;
        let req = TensorOpRequest {
            kind: TensorOpKind::Copy,
            src_pa,
            dst_pa,
            len: size,
            tensors: vec![src.clone(), dst.clone()],
            ..TensorOpRequest::default()
        };
        self.schedule_tensor_op(lnc, queue, req)
    }

    /// `nrt_tensor_free`: drops the handle in `tensor` (setting it to `None`; `None` is a
    /// no-op). The device memory is freed once no other handle or tensor set holds it. A
    /// tensor that a scheduled request (tensor operation or explicit-async execution) still
    /// uses is refused, and the handle left in place.
    ///
    /// # Errors
    /// NRT_INVALID naming the request that holds the tensor.
    pub fn tensor_free(&self, tensor: &mut Option<Tensor>) -> NrtResult<()> {
        self.check_process()?;
        let Some(t) = tensor.as_ref() else {
            return Ok(());
        };
        match t.scheduled_user() {
            Some(ScheduledUser::Request(seq)) => Err(invalid(format!(
                "tensor {:?} is used by scheduled request {}; free it after that request completes",
                t.name(),
                describe(seq)
            ))),
            Some(ScheduledUser::Scheduling) => Err(invalid(format!(
                "tensor {:?} is used by a request being scheduled right now; free it after that request completes",
                t.name()
            ))),
            None => {
                *tensor = None;
                Ok(())
            }
        }
    }
}
