//! The implicit asynchronous mode (`nrt_experimental.h`): with
//! NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0, `nrt_execute` queues and a registered
//! callback reports each completion.

use std::ffi::c_void;
use std::sync::Arc;

use runtime::NrtError;
use shared::NrtStatus;

use crate::{boundary, rt};

/// The C completion callback: (params, model id, logical core, job id, status).
pub type AsyncExecCallback = extern "C" fn(*mut c_void, u32, u32, u64, u32);

/// `nrt_register_async_exec_callback`: replaces the completion callback.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_register_async_exec_callback(
    callback: Option<AsyncExecCallback>,
    params: *mut c_void,
) -> u32 {
    boundary::status("nrt_register_async_exec_callback", || {
        let rt = rt()?;
        let cb = callback.ok_or_else(|| NrtError::new(NrtStatus::Invalid, "callback is NULL"))?;
        // The caller's context pointer, passed back untouched on the runtime's thread.
        let params = params as usize;
        rt.register_async_exec_callback(Arc::new(move |model, vnc, job, status| {
            cb(
                params as *mut c_void,
                u32::try_from(model).unwrap_or(u32::MAX),
                vnc,
                job,
                status as u32,
            );
        }))
    })
}

/// `nrt_async_drain_queued_execs`: blocks until logical core `vnc` has nothing queued.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_async_drain_queued_execs(vnc: i32) -> u32 {
    boundary::status("nrt_async_drain_queued_execs", || {
        let rt = rt()?;
        if runtime::async_pool::in_exec_callback() {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                "called from the async exec callback, which runs on the core's own exec thread: a drain would wait for itself (drain after the callback returns)",
            ));
        }
        let v = u32::try_from(vnc).map_err(|_| {
            NrtError::new(
                NrtStatus::Invalid,
                format!("logical core {vnc} is not a core"),
            )
        })?;
        if v >= rt.visible_vnc_count() {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!("logical core {vnc} is not visible to this process"),
            ));
        }
        rt.async_drain(v);
        Ok(())
    })
}
