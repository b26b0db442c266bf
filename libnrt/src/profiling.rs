//! The per-model profile (`nrt_profile.h`) and the system trace (`nrt_sys_trace.h`).
//!
//! Capture configurations and fetch options are registry handles like tensors
//! ([`SYS_TRACE_CONFIGS`], [`FETCH_OPTIONS`]): a pointer this library did not hand out, or
//! freed, is refused (logged; the `void` setters change nothing). They are plain data, usable
//! before `nrt_init`. The fetched JSON buffers and event-type arrays are remembered by address
//! until freed, so freeing a stranger's pointer is refused instead of corrupting the heap.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, PoisonError};

use runtime::NrtError;
use runtime::sys_trace::{EVENT_TYPES, SysTraceConfig, SysTraceFetchOptions};
use shared::NrtStatus;

use crate::handles::{FETCH_OPTIONS, SYS_TRACE_CONFIGS};
use crate::{boundary, raw, rt};

fn invalid(message: impl Into<String>) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

/// `nrt_profile_start`: records `model`'s executions until `nrt_profile_stop(filename)`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_start(model: *mut c_void, filename: *const c_char) -> u32 {
    boundary::status("nrt_profile_start", || {
        let rt = rt()?;
        let m = crate::model::live_model(&rt, model)?;
        let path = raw::c_path(filename, "filename")?;
        rt.profile_start(m, path)
            .map_err(crate::model::unloaded_meanwhile(model))
    })
}

/// `nrt_profile_stop`: writes the profile started for `filename` there (Chrome trace JSON).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_stop(filename: *const c_char) -> u32 {
    boundary::status("nrt_profile_stop", || {
        let rt = rt()?;
        let path = raw::c_path(filename, "filename")?;
        rt.profile_stop(path)
    })
}

/// Runs `f` on the configuration behind `config`.
fn with_config<T>(
    config: *const c_void,
    f: impl FnOnce(&mut SysTraceConfig) -> Result<T, NrtError>,
) -> Result<T, NrtError> {
    let entry = SYS_TRACE_CONFIGS.get(config, "config")?;
    let mut c = entry.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut c)
}

/// Runs `f` on the fetch options behind `options`.
fn with_options(
    options: *const c_void,
    f: impl FnOnce(&mut SysTraceFetchOptions),
) -> Result<(), NrtError> {
    let entry = FETCH_OPTIONS.get(options, "options")?;
    f(&mut entry.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(())
}

/// `nrt_sys_trace_config_allocate`: a configuration with the defaults.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_allocate(config: *mut *mut c_void) -> u32 {
    boundary::status("nrt_sys_trace_config_allocate", || {
        raw::check_out(config, "config")?;
        let h = SYS_TRACE_CONFIGS.insert(Mutex::new(SysTraceConfig::new()));
        raw::write_out(config, h, "config")
    })
}

/// `nrt_sys_trace_config_set_defaults`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_defaults(config: *mut c_void) {
    boundary::value("nrt_sys_trace_config_set_defaults", (), || {
        with_config(config, |c| {
            c.set_defaults();
            Ok(())
        })
    });
}

/// `nrt_sys_trace_config_free`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_free(config: *mut c_void) {
    boundary::value("nrt_sys_trace_config_free", (), || {
        if config.is_null() {
            return Ok(());
        }
        SYS_TRACE_CONFIGS.remove(config, "config").map(|_| ())
    });
}

/// `nrt_sys_trace_config_set_max_events_per_nc` (0 is refused at start).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_max_events_per_nc(
    config: *mut c_void,
    max_events_per_nc: u64,
) {
    boundary::value("nrt_sys_trace_config_set_max_events_per_nc", (), || {
        with_config(config, |c| {
            c.set_max_events_per_nc(max_events_per_nc);
            Ok(())
        })
    });
}

/// `nrt_sys_trace_config_set_capture_enabled_for_nc` (the core is checked at start).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_capture_enabled_for_nc(
    config: *mut c_void,
    nc_idx: u32,
    enabled: bool,
) {
    boundary::value(
        "nrt_sys_trace_config_set_capture_enabled_for_nc",
        (),
        || {
            with_config(config, |c| {
                c.set_capture_enabled_for_nc(nc_idx, enabled);
                Ok(())
            })
        },
    );
}

/// `nrt_sys_trace_config_set_capture_enabled_for_event_type`: NRT_INVALID for an unknown type.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_set_capture_enabled_for_event_type(
    config: *mut c_void,
    event_type: *const c_char,
    enabled: bool,
) -> u32 {
    boundary::status(
        "nrt_sys_trace_config_set_capture_enabled_for_event_type",
        || {
            let name = raw::c_str(event_type, "event_type")?;
            with_config(config, |c| {
                c.set_capture_enabled_for_event_type(name, enabled)
            })
        },
    )
}

/// Event-type arrays handed out (address → the pointers), until freed.
static TYPE_ARRAYS: Mutex<Option<HashMap<usize, Box<[usize]>>>> = Mutex::new(None);

/// The C string of each event type (static, NUL-terminated).
fn type_c_str(name: &str) -> *const c_char {
    match name {
        "execute" => c"execute".as_ptr(),
        _ => c"tensor_op".as_ptr(),
    }
}

/// Hands `names` out as a `const char **` array in `*out`, its length in `*count`.
fn hand_out_types(
    names: &[&str],
    out: *mut *const *const c_char,
    count: *mut usize,
) -> Result<(), NrtError> {
    raw::check_out(out, "event_types")?;
    raw::check_out(count, "count")?;
    // A non-empty allocation even for no type, so the address is unique.
    let mut array: Box<[usize]> = names
        .iter()
        .map(|n| type_c_str(n) as usize)
        .chain(std::iter::once(0))
        .collect();
    let ptr = array.as_mut_ptr().cast::<*const c_char>().cast_const();
    TYPE_ARRAYS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(ptr as usize, array);
    raw::write_out(out, ptr, "event_types")?;
    raw::write_out(count, names.len(), "count")
}

/// `nrt_sys_trace_get_event_types`: every event type's name.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_get_event_types(
    event_types: *mut *const *const c_char,
    count: *mut usize,
) -> u32 {
    boundary::status("nrt_sys_trace_get_event_types", || {
        hand_out_types(&EVENT_TYPES, event_types, count)
    })
}

/// `nrt_sys_trace_config_get_enabled_event_types`: the types `config` captures.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_config_get_enabled_event_types(
    config: *const c_void,
    event_types: *mut *const *const c_char,
    count: *mut usize,
) -> u32 {
    boundary::status("nrt_sys_trace_config_get_enabled_event_types", || {
        let names = with_config(config, |c| Ok(c.enabled_event_types()))?;
        hand_out_types(&names, event_types, count)
    })
}

/// `nrt_sys_trace_free_event_types`: frees an array from the two calls above.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_free_event_types(
    event_types: *const *const c_char,
    count: usize,
) {
    boundary::value("nrt_sys_trace_free_event_types", (), || {
        if event_types.is_null() {
            return Ok(());
        }
        let mut arrays = TYPE_ARRAYS.lock().unwrap_or_else(PoisonError::into_inner);
        let map = arrays.get_or_insert_with(HashMap::new);
        match map.get(&(event_types as usize)) {
            Some(a) if a.len() == count + 1 => {
                map.remove(&(event_types as usize));
                // The table's own memory too, once nothing is handed out: a leak checker
                // finds nothing of it at exit.
                if map.is_empty() {
                    *arrays = None;
                }
                Ok(())
            }
            Some(a) => Err(invalid(format!(
                "event_types {event_types:?} holds {} types, not {count}",
                a.len() - 1
            ))),
            None => Err(invalid(format!(
                "event_types {event_types:?} is not an array this library handed out (or was freed)"
            ))),
        }
    });
}

/// `nrt_sys_trace_start`: starts capturing with `config` (NULL: the defaults).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_start(config: *mut c_void) -> u32 {
    boundary::status("nrt_sys_trace_start", || {
        let rt = rt()?;
        let c = if config.is_null() {
            SysTraceConfig::new()
        } else {
            with_config(config, |c| Ok(c.clone()))?
        };
        rt.sys_trace_start(&c)
    })
}

/// `nrt_sys_trace_stop`.
///
/// # Safety
/// A C entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_stop() -> u32 {
    boundary::status("nrt_sys_trace_stop", || rt()?.sys_trace_stop())
}

/// `nrt_sys_trace_fetch_options_allocate`: every core, every held event.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_allocate(options: *mut *mut c_void) -> u32 {
    boundary::status("nrt_sys_trace_fetch_options_allocate", || {
        raw::check_out(options, "options")?;
        let h = FETCH_OPTIONS.insert(Mutex::new(SysTraceFetchOptions::default()));
        raw::write_out(options, h, "options")
    })
}

/// `nrt_sys_trace_fetch_options_set_defaults`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_set_defaults(options: *mut c_void) {
    boundary::value("nrt_sys_trace_fetch_options_set_defaults", (), || {
        with_options(options, |o| *o = SysTraceFetchOptions::default())
    });
}

/// `nrt_sys_trace_fetch_options_free`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_free(options: *mut c_void) {
    boundary::value("nrt_sys_trace_fetch_options_free", (), || {
        if options.is_null() {
            return Ok(());
        }
        FETCH_OPTIONS.remove(options, "options").map(|_| ())
    });
}

/// `nrt_sys_trace_fetch_options_set_max_events_per_nc`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_set_max_events_per_nc(
    options: *mut c_void,
    max_events_per_nc: u64,
) {
    boundary::value(
        "nrt_sys_trace_fetch_options_set_max_events_per_nc",
        (),
        || with_options(options, |o| o.max_events_per_nc = Some(max_events_per_nc)),
    );
}

/// `nrt_sys_trace_fetch_options_set_nc_idx` (checked at fetch).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_options_set_nc_idx(options: *mut c_void, nc_idx: u64) {
    boundary::value("nrt_sys_trace_fetch_options_set_nc_idx", (), || {
        // A value beyond u32 is no core: the fetch refuses it, naming it.
        with_options(options, |o| {
            o.nc_idx = Some(u32::try_from(nc_idx).unwrap_or(u32::MAX));
        })
    });
}

/// Fetched JSON buffers handed out (address → the bytes with their NUL), until freed.
static BUFFERS: Mutex<Option<HashMap<usize, Box<[u8]>>>> = Mutex::new(None);

/// `nrt_sys_trace_fetch_events`: the held events as a NUL-terminated JSON document (consumed
/// from the rings).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_fetch_events(
    buffer: *mut *mut c_char,
    written_size: *mut usize,
    options: *const c_void,
) -> u32 {
    boundary::status("nrt_sys_trace_fetch_events", || {
        let rt = rt()?;
        raw::check_out(buffer, "buffer")?;
        raw::check_out(written_size, "written_size")?;
        let o = if options.is_null() {
            SysTraceFetchOptions::default()
        } else {
            *FETCH_OPTIONS
                .get(options, "options")?
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        let json = rt.sys_trace_fetch_events(&o)?;
        let len = json.len();
        let mut bytes = json.into_bytes();
        bytes.push(0);
        let mut bytes = bytes.into_boxed_slice();
        let ptr = bytes.as_mut_ptr().cast::<c_char>();
        BUFFERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .insert(ptr as usize, bytes);
        raw::write_out(buffer, ptr, "buffer")?;
        raw::write_out(written_size, len, "written_size")
    })
}

/// `nrt_sys_trace_buffer_free`: frees a buffer from `nrt_sys_trace_fetch_events` (a pointer
/// it did not return is refused, logged).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sys_trace_buffer_free(buffer: *mut c_char) {
    boundary::value("nrt_sys_trace_buffer_free", (), || {
        if buffer.is_null() {
            return Ok(());
        }
        let mut buffers = BUFFERS.lock().unwrap_or_else(PoisonError::into_inner);
        let map = buffers.get_or_insert_with(HashMap::new);
        let freed = map.remove(&(buffer as usize)).map(|_| ());
        // The table's own memory too, once nothing is handed out.
        if map.is_empty() {
            *buffers = None;
        }
        freed.ok_or_else(|| {
            invalid(format!(
                "buffer {buffer:?} is not a buffer from nrt_sys_trace_fetch_events (or was freed)"
            ))
        })
    });
}
