//! Tensor sets (`nrt.h`): names (a model's I/O names) to tensor handles. A set holds handles,
//! not tensors: a tensor must stay allocated while it is in a set (libnrt's contract), and one
//! freed meanwhile is refused with NRT_INVALID at the next execution instead of being used.

use std::ffi::{c_char, c_void};

use runtime::NrtError;
use shared::NrtStatus;

use crate::handles::{SETS, SetEntry, TENSORS};
use crate::{boundary, raw, rt};

/// `nrt_allocate_tensor_set`: a new, empty set.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_allocate_tensor_set(result: *mut *mut c_void) -> u32 {
    boundary::status("nrt_allocate_tensor_set", || {
        let _rt = rt()?;
        raw::check_out(result, "result")?;
        let h = SETS.insert(SetEntry::default());
        raw::write_out(result, h, "result")
    })
}

/// `nrt_destroy_tensor_set`: frees the set (not its tensors) and NULLs the caller's pointer.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_destroy_tensor_set(tensor_set: *mut *mut c_void) {
    boundary::value("nrt_destroy_tensor_set", (), || {
        let h = raw::read_in(tensor_set, "tensor_set")?;
        if h.is_null() {
            return Ok(());
        }
        SETS.remove(h, "tensor_set")?;
        raw::write_out(tensor_set, std::ptr::null_mut(), "tensor_set")
    });
}

/// `nrt_add_tensor_to_tensor_set`: adds or replaces `tensor_name`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_add_tensor_to_tensor_set(
    tensor_set: *mut c_void,
    tensor_name: *const c_char,
    tensor: *mut c_void,
) -> u32 {
    boundary::status("nrt_add_tensor_to_tensor_set", || {
        let _rt = rt()?;
        let set = SETS.get(tensor_set, "tensor_set")?;
        let name = raw::c_str(tensor_name, "tensor_name")?;
        TENSORS.get(tensor, "tensor")?;
        let mut state = set
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.members.insert(name.to_string(), tensor as usize);
        state.resolved = None;
        Ok(())
    })
}

/// `nrt_get_tensor_from_tensor_set`: the tensor under `tensor_name`; NRT_FAILURE and no write
/// when absent.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_tensor_from_tensor_set(
    tensor_set: *mut c_void,
    tensor_name: *const c_char,
    tensor: *mut *mut c_void,
) -> u32 {
    boundary::status_quiet_failure("nrt_get_tensor_from_tensor_set", || {
        let _rt = rt()?;
        raw::check_out(tensor, "tensor")?;
        let set = SETS.get(tensor_set, "tensor_set")?;
        let name = raw::c_str(tensor_name, "tensor_name")?;
        let h = set
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .members
            .get(name)
            .copied()
            .ok_or_else(|| {
                NrtError::new(
                    NrtStatus::Failure,
                    format!("no tensor named {name:?} in the set"),
                )
            })?;
        TENSORS.get(
            h as *const c_void,
            &format!("the set's tensor {name:?}, handle"),
        )?;
        raw::write_out(tensor, h as *mut c_void, "tensor")
    })
}
