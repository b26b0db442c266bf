//! The host-driven collectives of `nrt.h` and `nrt_experimental.h` for a group of one rank:
//! simdev is one device, so `nrt_build_global_comm`, `nrt_cc_global_comm_init`, `nrt_barrier`
//! and `nrt_all_gather` succeed for rank 0 of a group of one (the barrier has nobody to wait
//! for; the gather's output is the rank's own input) and refuse a larger group with
//! NRT_INVALID, saying collectives across ranks are not simulated — as `nrt_load_collectives`
//! does. A single-device program that calls them therefore runs unchanged.

use std::ffi::c_void;

use crate::{boundary, raw, rt};

/// `nrt_build_global_comm`: the global communicator of a group of one needs nothing built.
///
/// # Safety
/// A C entry point (no pointer arguments).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_build_global_comm(
    vnc: i32,
    g_device_id: u32,
    g_device_count: u32,
) -> u32 {
    boundary::status("nrt_build_global_comm", || {
        rt()?.group_of_one(i64::from(vnc), g_device_id, g_device_count)
    })
}

/// `nrt_cc_global_comm_init`: as [`nrt_build_global_comm`], for host-initiated collectives.
///
/// # Safety
/// A C entry point (no pointer arguments).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_cc_global_comm_init(
    vnc: u32,
    g_device_id: u32,
    g_device_count: u32,
) -> u32 {
    boundary::status("nrt_cc_global_comm_init", || {
        rt()?.group_of_one(i64::from(vnc), g_device_id, g_device_count)
    })
}

/// `nrt_barrier`: every rank of a group of one has arrived.
///
/// # Safety
/// A C entry point (no pointer arguments).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_barrier(vnc: i32, g_device_id: u32, g_device_count: u32) -> u32 {
    boundary::status("nrt_barrier", || {
        rt()?.group_of_one(i64::from(vnc), g_device_id, g_device_count)
    })
}

/// `nrt_all_gather`: `rank_input_size` bytes of `input` from every rank into `output` (rank
/// order, `g_device_count · rank_input_size` bytes); for a group of one, `input` copied to
/// `output`. The group is checked before either buffer is touched.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_all_gather(
    vnc: i32,
    g_device_id: u32,
    g_device_count: u32,
    rank_input_size: u32,
    input: *mut c_void,
    output: *mut c_void,
) -> u32 {
    boundary::status("nrt_all_gather", || {
        let rt = rt()?;
        rt.group_of_one(i64::from(vnc), g_device_id, g_device_count)?;
        let len = rank_input_size as usize;
        let input = raw::bytes(input, len, "input")?;
        let output = raw::bytes_mut(output, len, "output")?;
        rt.all_gather(vnc, (g_device_id, g_device_count), input, output)
    })
}
