//! The explicit asynchronous API 3.x (`nrt_async.h`): requests scheduled on the execution
//! units of a logical core, their completion by sequence id, and completion eventfds.
//!
//! Each schedule call checks its pointers (`ret` and `req_sequence` non-NULL) before anything
//! is scheduled, makes sure the completion relay watches the XU, then schedules under
//! [`PENDING`]'s lock and records the request with its `ret` there ([`crate::completions`]
//! says how `ret` is written before the request is reported complete). A tensor read's `buf`
//! is written by the runtime's worker before the request completes
//! ([`runtime::ReadBuffer::from_raw`]).

use std::ffi::c_void;

use runtime::{NrtError, ReadBuffer, Runtime};
use shared::NrtStatus;
use shared::ids::{SeqId, XuType};

use crate::completions::{self, PENDING, RetPtr, Scheduled};
use crate::model::resolve_set;
use crate::{boundary, raw, rt};

fn invalid(message: impl Into<String>) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

/// `nrta_xu_t` from C.
fn xu_type(xu: u32) -> Result<XuType, NrtError> {
    u8::try_from(xu)
        .ok()
        .and_then(XuType::from_bits)
        .ok_or_else(|| {
            invalid(format!(
                "XU type {xu} is not an nrta_xu_t (TENSOR_OP 0, COMPUTE 1, COLLECTIVES 2)"
            ))
        })
}

/// A queue index from C: negative is no queue.
fn queue_index(queue: i32) -> Result<u8, NrtError> {
    u8::try_from(queue).map_err(|_| invalid(format!("queue {queue} does not exist")))
}

/// Watches the XU a tensor operation will use; a core or queue the runtime does not have is
/// left to the schedule call to refuse (it checks them first, naming them).
fn watch_tensor_op(rt: &Runtime, lnc: i32, queue: i32) {
    if let (Ok(lnc), Ok(q)) = (u32::try_from(lnc), u8::try_from(queue))
        && let Err(e) = completions::watch(rt, lnc, XuType::TensorOp, q)
        && e.status != NrtStatus::Invalid
    {
        tracing::warn!(target: "nrt", "watching TENSOR_OP queue {q} of logical core {lnc}: {}", e.message);
    }
}

/// Schedules with `schedule` under [`PENDING`]'s lock and records the request with `ret`;
/// writes its sequence id to `req_sequence`.
fn schedule(
    ret: *mut u32,
    req_sequence: *mut u64,
    schedule: impl FnOnce() -> Result<Scheduled, NrtError>,
) -> Result<(), NrtError> {
    let ret = RetPtr::new(ret)?;
    raw::check_out(req_sequence, "req_sequence")?;
    let mut pending = PENDING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let req = schedule()?;
    let seq = req.seq_id().raw();
    pending.push(req, ret);
    drop(pending);
    raw::write_out(req_sequence, seq, "req_sequence")
}

/// `nrta_execute_schedule`: one execution of `model` on its core's COMPUTE XU (queue 0).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents; `ret`
/// stays valid until the request is reported complete.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_execute_schedule(
    model: *mut c_void,
    input: *const c_void,
    output: *mut c_void,
    queue: i32,
    ret: *mut u32,
    req_sequence: *mut u64,
) -> u32 {
    boundary::status("nrta_execute_schedule", || {
        let rt = rt()?;
        if queue != 0 {
            return Err(invalid(format!(
                "queue {queue} does not exist: a COMPUTE execution unit has queue 0 only"
            )));
        }
        RetPtr::new(ret)?;
        raw::check_out(req_sequence, "req_sequence")?;
        let m = crate::model::live_model(&rt, model)?;
        let ins = resolve_set(input, "input")?;
        let outs = resolve_set(output, "output")?;
        completions::watch(&rt, m.vnc, XuType::Compute, 0)?;
        schedule(ret, req_sequence, || {
            rt.execute_schedule(m, &ins, &outs)
                .map_err(crate::model::unloaded_meanwhile(model))
                .map(Scheduled::Execution)
        })
    })
}

/// The checks `nrta_tensor_write` and `nrta_tensor_read` share, before the host buffer is
/// touched: the runtime, `ret` and `req_sequence`, the tensor handle, and `offset + size`
/// within the tensor. Returns the runtime, the tensor and `size` as a length.
fn host_transfer_args(
    ret: *mut u32,
    req_sequence: *mut u64,
    tensor: *mut c_void,
    offset: u64,
    size: u64,
) -> Result<(crate::InCall, runtime::Tensor, usize), NrtError> {
    let rt = rt()?;
    RetPtr::new(ret)?;
    raw::check_out(req_sequence, "req_sequence")?;
    let t = crate::tensor::live_tensor(&rt, tensor, "tensor")?;
    t.check_range(offset, size)?;
    let len = usize::try_from(size).map_err(|_| invalid(format!("size {size} is too large")))?;
    Ok((rt, t, len))
}

/// `nrta_tensor_write`: `size` bytes of `buf` (copied before this returns) to byte `offset` of
/// a device tensor, on TENSOR_OP queue `queue` of logical core `lnc_idx`.
///
/// # Safety
/// As [`nrta_execute_schedule`]; `buf` holds `size` readable bytes during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_write(
    tensor: *mut c_void,
    buf: *const c_void,
    offset: u64,
    size: u64,
    lnc_idx: i32,
    queue: i32,
    ret: *mut u32,
    req_sequence: *mut u64,
) -> u32 {
    boundary::status("nrta_tensor_write", || {
        // Bounds first, so a wrong size never turns `buf` into a slice.
        let (rt, t, len) = host_transfer_args(ret, req_sequence, tensor, offset, size)?;
        let data = raw::bytes(buf, len, "buf")?;
        watch_tensor_op(&rt, lnc_idx, queue);
        // The copy into staging outside PENDING's lock: other threads' schedule calls, and
        // the completion relay, wait for that lock (a 1.5 GiB write held them 1.4 s).
        let staged = rt.tensor_write_stage(&t, data, offset, lnc_idx, queue)?;
        schedule(ret, req_sequence, || {
            rt.tensor_write_submit(staged).map(Scheduled::TensorOp)
        })
    })
}

/// `nrta_tensor_read`: `size` bytes from byte `offset` of a device tensor into `buf`, written
/// by the runtime before the request completes, on TENSOR_OP queue `queue` of core `lnc_idx`.
///
/// # Safety
/// As [`nrta_execute_schedule`]; `buf` holds `size` writable bytes, untouched by the caller,
/// until the request is reported complete.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_read(
    buf: *mut c_void,
    tensor: *mut c_void,
    offset: u64,
    size: u64,
    lnc_idx: i32,
    queue: i32,
    ret: *mut u32,
    req_sequence: *mut u64,
) -> u32 {
    boundary::status("nrta_tensor_read", || {
        let (rt, t, len) = host_transfer_args(ret, req_sequence, tensor, offset, size)?;
        if buf.is_null() {
            return Err(invalid("buf is NULL"));
        }
        // SAFETY: non-NULL; by this function's contract (`nrt_async.h`) `buf` holds `size`
        // writable bytes nobody else touches until the read is reported complete, which the
        // runtime does after its worker's one copy into them.
        let dest = unsafe { ReadBuffer::from_raw(buf.cast::<u8>(), len)? };
        watch_tensor_op(&rt, lnc_idx, queue);
        schedule(ret, req_sequence, || {
            rt.tensor_read_schedule(&dest, &t, offset, size, lnc_idx, queue)
                .map(Scheduled::TensorOp)
        })
    })
}

/// `nrta_tensor_copy`: `size` bytes between device tensors of one logical core, on its
/// TENSOR_OP queue `queue`.
///
/// # Safety
/// As [`nrta_execute_schedule`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_copy(
    src: *mut c_void,
    src_offset: u64,
    dst: *mut c_void,
    dst_offset: u64,
    size: u64,
    queue: i32,
    ret: *mut u32,
    req_sequence: *mut u64,
) -> u32 {
    boundary::status("nrta_tensor_copy", || {
        let rt = rt()?;
        RetPtr::new(ret)?;
        raw::check_out(req_sequence, "req_sequence")?;
        let s = crate::tensor::live_tensor(&rt, src, "src")?;
        let d = crate::tensor::live_tensor(&rt, dst, "dst")?;
        if let Some(v) = s.vnc() {
            watch_tensor_op(&rt, i32::try_from(v).unwrap_or(-1), queue);
        }
        schedule(ret, req_sequence, || {
            rt.tensor_copy_schedule(&s, src_offset, &d, dst_offset, size, queue)
                .map(Scheduled::TensorOp)
        })
    })
}

/// `nrta_is_completed`: whether request `seq` completed (its `ret` is written first).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_is_completed(seq: u64, is_completed: *mut bool) -> u32 {
    boundary::status("nrta_is_completed", || {
        let rt = rt()?;
        raw::check_out(is_completed, "is_completed")?;
        let done = rt.is_completed(SeqId::from_raw(seq))?;
        if done {
            completions::settle();
        }
        raw::write_out(is_completed, done, "is_completed")
    })
}

/// `nrta_get_sequence`: the last completed sequence id of queue `queue` of XU type `xu` on
/// logical core `lnc` (every request up to it has its `ret` written first).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_get_sequence(lnc: u32, xu: u32, queue: i32, seq: *mut u64) -> u32 {
    boundary::status("nrta_get_sequence", || {
        let rt = rt()?;
        raw::check_out(seq, "seq")?;
        let last = rt.get_sequence(lnc, xu_type(xu)?, u32::from(queue_index(queue)?))?;
        completions::settle();
        raw::write_out(seq, last.raw(), "seq")
    })
}

/// `nrta_event_register_seq_id_completion`: signal eventfd `fd` when `seq` completes; -1
/// deregisters.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_event_register_seq_id_completion(seq: u64, fd: i32) -> u32 {
    boundary::status("nrta_event_register_seq_id_completion", || {
        let rt = rt()?;
        completions::register_seq(&rt, SeqId::from_raw(seq), fd)
    })
}

/// `nrta_event_register_xu_completion`: signal eventfd `fd` after every completion of an XU;
/// -1 deregisters.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_event_register_xu_completion(
    lnc: i32,
    xu: u32,
    queue: i32,
    fd: i32,
) -> u32 {
    boundary::status("nrta_event_register_xu_completion", || {
        let rt = rt()?;
        let lnc =
            u32::try_from(lnc).map_err(|_| invalid(format!("logical core {lnc} is not a core")))?;
        completions::register_xu(&rt, lnc, xu_type(xu)?, queue_index(queue)?, fd)
    })
}

/// Why no collective runs here (both collective entry points say it).
const NO_COLLECTIVES: &str = "collectives are not simulated: simdev is one device with no collective engines (nrta_cc_prepare/nrta_cc_schedule are refused; a program using them builds, and fails here)";

/// `nrta_cc_prepare`: refused after its arguments are checked (see [`NO_COLLECTIVES`]);
/// `*cc_ctx` is left as it was.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_cc_prepare(
    comm: *mut c_void,
    input: *mut c_void,
    output: *mut c_void,
    dtype: u32,
    op: u32,
    cc_op: u32,
    cc_ctx: *mut *mut c_void,
) -> u32 {
    boundary::status("nrta_cc_prepare", || {
        let _rt = rt()?;
        for (p, what) in [(comm, "comm"), (input, "input"), (output, "output")] {
            if p.is_null() {
                return Err(invalid(format!("{what} is NULL")));
            }
        }
        raw::check_out(cc_ctx, "cc_ctx")?;
        if op > 3 {
            return Err(invalid(format!("op {op} is not an nrt_op_type_t")));
        }
        if cc_op > 2 {
            return Err(invalid(format!("cc_op {cc_op} is not an nrt_cc_op_type_t")));
        }
        Err(invalid(format!(
            "{NO_COLLECTIVES} (cc_op {cc_op}, op {op}, dtype {dtype:#x})"
        )))
    })
}

/// `nrta_cc_schedule`: NRT_INVALID: no collective context is ever prepared here
/// ([`nrta_cc_prepare`]); `ret` and `req_sequence` are left as they were.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_cc_schedule(
    cc_ctx: *mut *mut c_void,
    queue: i32,
    ret: *mut u32,
    req_sequence: *mut u64,
) -> u32 {
    boundary::status("nrta_cc_schedule", || {
        let _rt = rt()?;
        if cc_ctx.is_null() {
            return Err(invalid("cc_ctx is NULL"));
        }
        if queue != 0 {
            return Err(invalid(format!(
                "queue {queue} does not exist: collectives are scheduled on queue 0"
            )));
        }
        RetPtr::new(ret)?;
        raw::check_out(req_sequence, "req_sequence")?;
        Err(invalid(format!(
            "cc_ctx is not a context from nrta_cc_prepare: {NO_COLLECTIVES}"
        )))
    })
}
