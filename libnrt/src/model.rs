//! Models (`nrt.h`) and their tensor information (`nrt_experimental.h`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use runtime::{ModelHandle, NrtError, NrtResult, Runtime, TensorSet};
use shared::NrtStatus;
use shared::model::TensorSpec;
use zerocopy::IntoBytes;

use crate::abi::{self, NrtModelInfo, NrtTensorInfo, TENSOR_INFO_ARRAY_HEADER, c_field};
use crate::handles::{MODELS, SETS, SetEntry, TENSOR_GENERATION, TENSORS};
use crate::{boundary, raw, rt};

/// The runtime's handle of C model handle `model`, for a use by runtime `rt`: a model loaded by
/// a runtime `nrt_close` closed since is refused (NRT_INVALID), never taken for the model of
/// this runtime that has the same id.
pub(crate) fn live_model(rt: &Runtime, model: *const c_void) -> Result<ModelHandle, NrtError> {
    let entry = MODELS.get(model, "model")?;
    if entry.runtime != rt.id() {
        return Err(NrtError::new(
            NrtStatus::Invalid,
            format!("model {model:?} was loaded by a runtime nrt_close has closed"),
        ));
    }
    Ok(entry.handle)
}

/// Maps the runtime's refusal of a model handle that `model` still named when the call began
/// (NRT_INVALID_HANDLE, naming the runtime's internal handle) to what a call on an unloaded
/// model gets (NRT_INVALID, naming the pointer), when `nrt_unload` on another thread took the
/// pointer meanwhile: it removes the pointer before the runtime unloads.
pub(crate) fn unloaded_meanwhile(model: *const c_void) -> impl Fn(NrtError) -> NrtError {
    move |e| {
        if e.status == NrtStatus::InvalidHandle && MODELS.get(model, "model").is_err() {
            invalid(format!(
                "model {model:?} was unloaded (nrt_unload on another thread) while this call \
                 used it"
            ))
        } else {
            e
        }
    }
}

fn invalid(message: impl Into<String>) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

/// `vnc_count` of `nrt_load`: deprecated; -1, 0 or 1 load one copy.
fn check_vnc_count(vnc_count: i32) -> Result<(), NrtError> {
    if vnc_count > 1 {
        return Err(invalid(format!(
            "vnc_count {vnc_count}: replicating a model over several cores is not supported (pass -1)"
        )));
    }
    Ok(())
}

/// `nrt_load`: loads `size` bytes of model on logical core `vnc`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_load(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    model: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_load", || {
        load_with(neff_bytes, size, vnc_count, model, |rt, b| rt.load(b, vnc))
    })
}

/// The checks and the handle of `nrt_load` and `nrt_load_collectives`: `load` loads the bytes.
fn load_with(
    neff_bytes: *const c_void,
    size: usize,
    vnc_count: i32,
    model: *mut *mut c_void,
    load: impl FnOnce(&runtime::Runtime, &[u8]) -> NrtResult<runtime::ModelHandle>,
) -> NrtResult<()> {
    let rt = rt()?;
    raw::check_out(model, "model")?;
    check_vnc_count(vnc_count)?;
    if size == 0 {
        return Err(invalid("the model is 0 bytes"));
    }
    let bytes = raw::bytes(neff_bytes, size, "neff_bytes")?;
    let handle = load(&rt, bytes)?;
    let h = MODELS.insert(crate::handles::ModelEntry {
        handle,
        runtime: rt.id(),
    });
    raw::write_out(model, h, "model")
}

/// `nrt_load_collectives`: a group of one rank loads like `nrt_load`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_load_collectives(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    ctx_device_id: u32,
    ctx_device_count: u32,
    model: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_load_collectives", || {
        load_with(neff_bytes, size, vnc_count, model, |rt, b| {
            rt.load_collectives(b, vnc, ctx_device_id, ctx_device_count)
        })
    })
}

/// `nrt_unload`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_unload(model: *mut c_void) -> u32 {
    boundary::status("nrt_unload", || {
        let rt = rt()?;
        let m = live_model(&rt, model)?;
        // The pointer goes before the unload waits for the model's executions in flight: a
        // call that starts meanwhile is refused as on any unloaded model (NRT_INVALID naming
        // the pointer), not by the runtime's unload under way (NRT_INVALID_HANDLE naming its
        // internal handle). A second nrt_unload of it is refused the same way.
        MODELS.remove(model, "model")?;
        rt.unload(m)
    })
}

/// A C tensor set resolved to the runtime's: every member handle must still name a tensor.
/// The resolution is cached on the set until a member changes or any tensor handle is freed
/// or re-attached ([`TENSOR_GENERATION`]), so an execution on an unchanged set allocates
/// nothing here.
pub(crate) fn resolve_set(set: *const c_void, what: &str) -> Result<Arc<TensorSet>, NrtError> {
    let entry: Arc<SetEntry> = SETS.get(set, what)?;
    let mut state = entry
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let generation = TENSOR_GENERATION.load(Ordering::Acquire);
    if let Some((g, resolved)) = &state.resolved
        && *g == generation
    {
        return Ok(resolved.clone());
    }
    let mut out = TensorSet::new();
    for (name, h) in &state.members {
        let t = TENSORS
            .get(
                *h as *const c_void,
                &format!("{what}'s tensor {name:?}, handle"),
            )?
            .get();
        out.add(name, &t);
    }
    let out = Arc::new(out);
    state.resolved = Some((generation, out.clone()));
    Ok(out)
}

/// `nrt_execute`: runs the model once, synchronously.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_execute(
    model: *mut c_void,
    input_set: *const c_void,
    output_set: *mut c_void,
) -> u32 {
    boundary::status("nrt_execute", || {
        let rt = rt()?;
        let m = live_model(&rt, model)?;
        let ins = resolve_set(input_set, "input_set")?;
        let outs = resolve_set(output_set, "output_set")?;
        rt.execute(m, &ins, &outs)
            .map_err(unloaded_meanwhile(model))
    })
}

/// `nrt_execute_repeat`: only a repeat count of 1 (or less) runs.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_execute_repeat(
    model: *mut c_void,
    input_set: *const c_void,
    output_set: *mut c_void,
    repeat_count: i32,
) -> u32 {
    boundary::status("nrt_execute_repeat", || {
        let rt = rt()?;
        let m = live_model(&rt, model)?;
        let ins = resolve_set(input_set, "input_set")?;
        let outs = resolve_set(output_set, "output_set")?;
        rt.execute_repeat(m, &ins, &outs, repeat_count)
            .map_err(unloaded_meanwhile(model))
    })
}

/// `nrt_get_model_info`: at most `info_size_in` bytes of `nrt_model_info_t`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_info(
    model: *const c_void,
    info: *mut c_void,
    info_size_in: usize,
    info_size_out: *mut usize,
) -> u32 {
    boundary::status("nrt_get_model_info", || {
        let rt = rt()?;
        raw::check_out(info, "info")?;
        raw::check_out(info_size_out, "info_size_out")?;
        let m = live_model(&rt, model)?;
        let loaded = rt.model(m).map_err(unloaded_meanwhile(model))?;
        let out = NrtModelInfo { vnc: loaded.vnc() };
        let bytes = out.as_bytes();
        let n = info_size_in.min(bytes.len());
        raw::write_struct_prefix(info, &bytes[..n], "info")?;
        raw::write_out(info_size_out, n, "info_size_out")
    })
}

fn model_vnc_count(name: &'static str, model: *const c_void, out: *mut u32) -> u32 {
    boundary::status(name, || {
        let rt = rt()?;
        raw::check_out(out, "vnc_count")?;
        let m = live_model(&rt, model)?;
        rt.model(m).map_err(unloaded_meanwhile(model))?;
        raw::write_out(out, 1, "vnc_count")
    })
}

/// `nrt_get_model_vnc_count`: a model uses one logical core.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_vnc_count(model: *const c_void, vnc_count: *mut u32) -> u32 {
    model_vnc_count("nrt_get_model_vnc_count", model, vnc_count)
}

/// `nrt_get_model_nc_count`: the deprecated name of `nrt_get_model_vnc_count`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_nc_count(model: *const c_void, nc_count: *mut u32) -> u32 {
    model_vnc_count("nrt_get_model_nc_count", model, nc_count)
}

/// `nrt_get_model_instance_count` (deprecated): the model's staged copies, 1 — this runtime
/// stages a model once and pipelines concurrent `nrt_execute` calls on it through its logical
/// core's request slots.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_instance_count(
    model: *const c_void,
    instance_count: *mut u32,
) -> u32 {
    boundary::status("nrt_get_model_instance_count", || {
        let rt = rt()?;
        raw::check_out(instance_count, "instance_count")?;
        let m = live_model(&rt, model)?;
        rt.model(m).map_err(unloaded_meanwhile(model))?;
        raw::write_out(instance_count, 1, "instance_count")
    })
}

/// One `nrt_tensor_info_array_t` handed to C: its bytes (8-aligned words) and the shapes its
/// entries point to. Kept until `nrt_free_model_tensor_info`.
#[derive(Debug)]
struct InfoArray {
    words: Vec<u64>,
    _shapes: Vec<Box<[u32]>>,
}

/// Arrays handed out, by address.
static INFO_ARRAYS: Mutex<Option<HashMap<usize, InfoArray>>> = Mutex::new(None);

/// The array describing `specs` (inputs then outputs, with their usage).
fn info_array(specs: &[(&TensorSpec, u32)]) -> InfoArray {
    let entry = std::mem::size_of::<NrtTensorInfo>();
    let len = TENSOR_INFO_ARRAY_HEADER + specs.len() * entry;
    let mut words = vec![0u64; len.div_ceil(8)];
    let shapes: Vec<Box<[u32]>> = specs
        .iter()
        .map(|(s, _)| s.shape.clone().into_boxed_slice())
        .collect();
    words[0] = specs.len() as u64;
    let bytes = words.as_mut_bytes();
    for (i, ((spec, usage), shape)) in specs.iter().zip(&shapes).enumerate() {
        let info = NrtTensorInfo {
            name: c_field(&spec.name),
            usage: *usage,
            _pad0: 0,
            size: spec.size,
            dtype: spec.dtype as u32,
            _pad1: 0,
            shape: shape.as_ptr() as u64,
            ndim: u32::try_from(shape.len()).unwrap_or(u32::MAX),
            _pad2: 0,
        };
        let at = TENSOR_INFO_ARRAY_HEADER + i * entry;
        bytes[at..at + entry].copy_from_slice(info.as_bytes());
    }
    InfoArray {
        words,
        _shapes: shapes,
    }
}

/// `nrt_get_model_tensor_info`: a library-allocated array of every input and output.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_tensor_info(
    model: *mut c_void,
    tensor_info: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_get_model_tensor_info", || {
        let rt = rt()?;
        raw::check_out(tensor_info, "tensor_info")?;
        let m = live_model(&rt, model)?;
        let loaded = rt.model(m).map_err(unloaded_meanwhile(model))?;
        let spec = loaded.model();
        let specs: Vec<(&TensorSpec, u32)> = spec
            .inputs
            .iter()
            .map(|s| (s, abi::USAGE_INPUT))
            .chain(spec.outputs.iter().map(|s| (s, abi::USAGE_OUTPUT)))
            .collect();
        let mut array = info_array(&specs);
        let ptr = array.words.as_mut_ptr().cast::<c_void>();
        INFO_ARRAYS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(HashMap::new)
            .insert(ptr as usize, array);
        raw::write_out(tensor_info, ptr, "tensor_info")
    })
}

/// `nrt_free_model_tensor_info`: frees an array this library handed out (once).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_free_model_tensor_info(tensor_info: *mut c_void) -> u32 {
    boundary::status("nrt_free_model_tensor_info", || {
        if tensor_info.is_null() {
            // As free(NULL): cleanup code frees whatever it has, NULL included.
            return Ok(());
        }
        let mut arrays = INFO_ARRAYS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let removed = arrays
            .as_mut()
            .and_then(|a| a.remove(&(tensor_info as usize)));
        if arrays.as_ref().is_some_and(HashMap::is_empty) {
            // The table's memory goes with its last array: nothing of it is left at exit for a
            // leak checker to call lost.
            *arrays = None;
        }
        drop(arrays);
        match removed {
            Some(_) => Ok(()),
            None => Err(invalid(format!(
                "tensor_info {tensor_info:?} is not an array from nrt_get_model_tensor_info (or was freed)"
            ))),
        }
    })
}

#[cfg(test)]
mod tests {
    use shared::model::DType;

    use super::*;

    #[test]
    fn the_info_array_has_the_reference_layout() {
        let x = TensorSpec {
            name: "x".into(),
            dtype: DType::F32,
            shape: vec![2, 3],
            size: 24,
        };
        let y = TensorSpec {
            name: "logits".into(),
            dtype: DType::U8,
            shape: vec![7],
            size: 7,
        };
        let a = info_array(&[(&x, abi::USAGE_INPUT), (&y, abi::USAGE_OUTPUT)]);
        let b = a.words.as_bytes();
        assert_eq!(b.len(), 8 + 2 * 296);
        assert_eq!(&b[..8], &2u64.to_le_bytes());
        let e1 = &b[8 + 296..];
        assert_eq!(&e1[..7], b"logits\0");
        assert_eq!(&e1[256..260], &1u32.to_le_bytes());
        assert_eq!(&e1[264..272], &7u64.to_le_bytes());
        assert_eq!(&e1[272..276], &3u32.to_le_bytes());
        assert_eq!(&e1[288..292], &1u32.to_le_bytes());
        let e0 = &b[8..];
        assert_eq!(&e0[272..276], &0xAu32.to_le_bytes());
        let shape_ptr = u64::from_le_bytes(e0[280..288].try_into().unwrap());
        assert_eq!(shape_ptr, a._shapes[0].as_ptr() as u64);
    }

    #[test]
    fn a_foreign_info_array_is_refused() {
        let mut local = [0u64; 4];
        // SAFETY: a pointer to our own array; the library must refuse it without touching it.
        let status = unsafe { nrt_free_model_tensor_info(local.as_mut_ptr().cast()) };
        assert_eq!(status, NrtStatus::Invalid as u32);
        assert_eq!(local, [0; 4]);
    }
}
