//! The debug stream of `ndebug_stream.h`: events a model's device prints send to a host client,
//! one client per logical core.
//!
//! This runtime has no source of such events. On simdev, a NEFF's instructions are not decoded
//! (it runs shape-only) and the simulator ISA has no device print; on a Neuron device, this
//! runtime does not read the device's debug stream. So a connection is refused, saying so —
//! as the collectives across ranks are — rather than handed out as a stream that would stay
//! silent whatever the model printed. The header is provided so that a program with a debug
//! handler (nkipy's spike has one) builds unchanged; its handler sees the refusal and runs
//! without the stream. Arguments are checked first, as for every export: a NULL out-pointer
//! or a core this process does not see is named as such.

use std::ffi::{c_int, c_void};

use runtime::NrtError;
use shared::NrtStatus;

use crate::abi::NdebugStreamEventHeader;
use crate::{boundary, raw, rt};

/// Why no debug stream can be connected (or read).
const NO_EVENTS: &str = "this runtime has no debug-stream events to deliver: on simdev a NEFF's \
     instructions are not decoded (it runs shape-only) and the simulator ISA has no device \
     print; on a Neuron device this runtime does not read the device's debug stream";

/// `nrt_debug_client_connect`: refused (NRT_INVALID, saying why) once the core is checked.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_debug_client_connect(
    logical_nc_idx: i32,
    stream_fd: *mut c_int,
) -> u32 {
    boundary::status("nrt_debug_client_connect", || {
        let rt = rt()?;
        raw::check_out(stream_fd, "stream_fd")?;
        rt.visible_core(i64::from(logical_nc_idx))?;
        Err(NrtError::new(
            NrtStatus::Invalid,
            format!("debug stream of logical core {logical_nc_idx}: {NO_EVENTS}"),
        ))
    })
}

/// `nrt_debug_client_connect_close`: no connection exists, so any `stream_fd` is refused
/// (logged; the caller's descriptor is not touched).
///
/// # Safety
/// A C entry point (no pointer arguments).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_debug_client_connect_close(stream_fd: c_int) {
    boundary::value("nrt_debug_client_connect_close", (), || {
        Err(not_a_stream(stream_fd))
    });
}

/// `nrt_debug_client_read_one_event`: no connection exists, so any `stream_fd` is refused;
/// `header` and `payload` are checked first and left untouched.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_debug_client_read_one_event(
    stream_fd: c_int,
    header: *mut NdebugStreamEventHeader,
    payload: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_debug_client_read_one_event", || {
        raw::check_out(header, "header")?;
        raw::check_out(payload, "payload")?;
        Err(not_a_stream(stream_fd))
    })
}

fn not_a_stream(stream_fd: c_int) -> NrtError {
    NrtError::new(
        NrtStatus::Invalid,
        format!(
            "stream_fd {stream_fd} is not a debug-stream connection (nrt_debug_client_connect \
             makes none: {NO_EVENTS})"
        ),
    )
}
