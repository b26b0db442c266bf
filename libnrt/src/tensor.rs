//! Tensors (`nrt.h`) and copies into mapped device memory (`nrt_experimental.h`).

use std::ffi::{c_char, c_void};
use std::os::fd::IntoRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use runtime::{NrtError, Placement, Runtime, Tensor};
use shared::NrtStatus;
use zerocopy::IntoBytes;

use crate::abi::{self, NrtTensorDeviceAllocationInfo};
use crate::handles::{TENSOR_GENERATION, TENSORS, TensorEntry};
use crate::{boundary, raw, rt};

fn invalid(message: impl Into<String>) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

fn to_u64(v: usize) -> u64 {
    v as u64
}

fn to_usize(v: u64, what: &str) -> Result<usize, NrtError> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} {v} does not fit the address space")))
}

fn register(tensor: Tensor, out: *mut *mut c_void) -> Result<(), NrtError> {
    let h = TENSORS.insert(TensorEntry {
        tensor: RwLock::new(tensor),
    });
    raw::write_out(out, h, "tensor")
}

fn tensor(handle: *const c_void, what: &str) -> Result<Tensor, NrtError> {
    Ok(TENSORS.get(handle, what)?.get())
}

/// The tensor behind `handle`, for a use by runtime `rt`: a device tensor allocated by a runtime
/// `nrt_close` closed since (before this `nrt_init`) is refused — its memory is that runtime's
/// device's. It can still be freed.
pub(crate) fn live_tensor(
    rt: &Runtime,
    handle: *const c_void,
    what: &str,
) -> Result<Tensor, NrtError> {
    let t = tensor(handle, what)?;
    match t.runtime() {
        Some(id) if id != rt.id() => Err(invalid(format!(
            "{what} {:?} was allocated by a runtime nrt_close has closed: free it \
             (nrt_tensor_free) and allocate it again",
            t.name()
        ))),
        _ => Ok(t),
    }
}

/// `nrt_tensor_allocate`: device memory of logical core `vnc`, or host memory.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate(
    tensor_placement: u32,
    vnc: i32,
    size: usize,
    name: *const c_char,
    tensor: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_tensor_allocate", || {
        let rt = rt()?;
        raw::check_out(tensor, "tensor")?;
        let name = raw::label(name).unwrap_or_default();
        let placement = match tensor_placement {
            abi::PLACEMENT_DEVICE => Placement::Device {
                vnc: u32::try_from(vnc).map_err(|_| {
                    invalid(format!(
                        "tensor {name:?}: a device tensor needs a logical core, not {vnc}"
                    ))
                })?,
            },
            abi::PLACEMENT_HOST => Placement::Host,
            other => {
                return Err(invalid(format!(
                    "tensor {name:?}: placement {other} is not an nrt_tensor_placement_t"
                )));
            }
        };
        let t = rt.tensor_allocate(placement, to_u64(size), &name)?;
        register(t, tensor)
    })
}

/// `nrt_tensor_free`: frees the tensor and NULLs the caller's pointer. A pointer this library
/// did not hand out, or a tensor a scheduled request still uses, is refused (logged, naming
/// the request) and left as it is.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_free(tensor: *mut *mut c_void) {
    boundary::value("nrt_tensor_free", (), || {
        let h = raw::read_in(tensor, "tensor")?;
        if h.is_null() {
            return Ok(());
        }
        // A tensor a scheduled request still uses is refused, naming the request, and the
        // caller's handle is left as it is (free it again after the request completed).
        let entry = TENSORS.get(h, "tensor")?;
        if let Ok(rt) = rt() {
            rt.tensor_free(&mut Some(entry.get()))?;
        }
        // A wait for its output completion in progress ends (NRT_INVALID: freed).
        entry.get().abandon_output_completion();
        TENSORS.remove(h, "tensor")?;
        TENSOR_GENERATION.fetch_add(1, Ordering::AcqRel);
        raw::write_out(tensor, std::ptr::null_mut(), "tensor")
    });
}

/// `nrt_tensor_read`: `size` bytes from byte `offset` into `buf`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_read(
    tensor: *const c_void,
    buf: *mut c_void,
    offset: usize,
    size: usize,
) -> u32 {
    boundary::status("nrt_tensor_read", || {
        let rt = rt()?;
        let t = live_tensor(&rt, tensor, "tensor")?;
        t.check_range(to_u64(offset), to_u64(size))?;
        let buf = raw::bytes_mut(buf, size, "buf")?;
        t.read(buf, to_u64(offset))
    })
}

/// `nrt_tensor_write`: `size` bytes from `buf` to byte `offset`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_write(
    tensor: *mut c_void,
    buf: *const c_void,
    offset: usize,
    size: usize,
) -> u32 {
    boundary::status("nrt_tensor_write", || {
        let rt = rt()?;
        let t = live_tensor(&rt, tensor, "tensor")?;
        t.check_range(to_u64(offset), to_u64(size))?;
        let buf = raw::bytes(buf, size, "buf")?;
        t.write(buf, to_u64(offset))
    })
}

/// One operation of a tensor batch, checked: its tensor, range and buffer.
struct BatchOp {
    tensor: Tensor,
    offset: u64,
    size: usize,
    buffer: *mut c_void,
}

/// Every operation of the caller's `num_batches` batches, each checked (a live tensor, a range
/// inside it, a buffer where there are bytes) before any is run: a batch with one wrong
/// operation copies nothing.
fn batch_ops(
    rt: &Runtime,
    batches: *const abi::NrtTensorBatch,
    num_batches: u64,
) -> Result<Vec<BatchOp>, NrtError> {
    let batches = raw::slice(batches, num_batches, "batches")?;
    let mut ops = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        let tensor = live_tensor(
            rt,
            abi::field_ptr::<c_void>(b.tensor),
            &format!("batches[{i}].tensor"),
        )?;
        let list = raw::slice(
            abi::field_ptr::<abi::NrtTensorBatchOp>(b.ops),
            u64::from(b.num_ops),
            &format!("batches[{i}].ops"),
        )?;
        for (j, op) in list.iter().enumerate() {
            let what = || format!("batches[{i}].ops[{j}]");
            tensor
                .check_range(op.offset, op.size)
                .map_err(|e| invalid(format!("{}: {}", what(), e.message)))?;
            let size = to_usize(op.size, &format!("{}.size", what()))?;
            if size > 0 && op.buffer == 0 {
                return Err(invalid(format!("{}.buffer is NULL", what())));
            }
            ops.push(BatchOp {
                tensor: tensor.clone(),
                offset: op.offset,
                size,
                buffer: abi::field_ptr(op.buffer),
            });
        }
    }
    Ok(ops)
}

/// Which way a tensor batch copies.
#[derive(Clone, Copy)]
enum BatchDirection {
    /// From the tensors into the buffers.
    Read,
    /// From the buffers into the tensors.
    Write,
}

/// Runs the caller's batches one operation after another, once every operation is checked
/// ([`batch_ops`]).
fn run_batches(
    name: &'static str,
    batches: *const abi::NrtTensorBatch,
    num_batches: u64,
    direction: BatchDirection,
) -> u32 {
    boundary::status(name, || {
        let rt = rt()?;
        for op in batch_ops(&rt, batches, num_batches)? {
            // The buffer was checked (not NULL where there are bytes, a size inside the tensor).
            match direction {
                BatchDirection::Read => {
                    let buf = raw::bytes_mut(op.buffer, op.size, "a batch operation's buffer")?;
                    op.tensor.read(buf, op.offset)?;
                }
                BatchDirection::Write => {
                    let buf = raw::bytes(op.buffer, op.size, "a batch operation's buffer")?;
                    op.tensor.write(buf, op.offset)?;
                }
            }
        }
        Ok(())
    })
}

/// `nrt_tensor_read_batch`: every operation's `size` bytes from byte `offset` of its batch's
/// tensor into its `buffer`, in order. Nothing is read unless every operation is valid. A
/// third argument (`bool unsafe`, of the signature before 2.34.10) is not read: tensors are
/// tracked as `unsafe = false` asks, as `nrt_tensor_read` tracks them (a read waits for the
/// implicit-async executions using its tensor; `nrta_*` requests are the caller's to wait
/// for).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_read_batch(
    batches: *const abi::NrtTensorBatch,
    num_batches: u64,
) -> u32 {
    run_batches(
        "nrt_tensor_read_batch",
        batches,
        num_batches,
        BatchDirection::Read,
    )
}

/// `nrt_tensor_write_batch`: every operation's `size` bytes from its `buffer` to byte `offset`
/// of its batch's tensor, in order (a later operation on the same bytes wins). Nothing is
/// written unless every operation is valid. As [`nrt_tensor_read_batch`], a third argument is
/// not read.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_write_batch(
    batches: *const abi::NrtTensorBatch,
    num_batches: u64,
) -> u32 {
    run_batches(
        "nrt_tensor_write_batch",
        batches,
        num_batches,
        BatchDirection::Write,
    )
}

/// `nrt_tensor_copy`: `size` bytes between tensors.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_copy(
    src: *const c_void,
    src_offset: usize,
    dst: *mut c_void,
    dst_offset: usize,
    size: usize,
) -> u32 {
    boundary::status("nrt_tensor_copy", || {
        let rt = rt()?;
        let s = live_tensor(&rt, src, "src")?;
        let d = live_tensor(&rt, dst, "dst")?;
        d.copy_range(to_u64(dst_offset), &s, to_u64(src_offset), to_u64(size))
    })
}

/// `nrt_tensor_memset`: `size` bytes from byte `offset` set to `value` as a byte.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_memset(
    tensor: *mut c_void,
    offset: u64,
    value: i32,
    size: usize,
) -> u32 {
    boundary::status("nrt_tensor_memset", || {
        let rt = rt()?;
        let t = live_tensor(&rt, tensor, "tensor")?;
        // memset(3)'s conversion: the low byte of the int.
        t.memset(offset, value.to_le_bytes()[0], to_u64(size))
    })
}

/// `nrt_tensor_get_size`: bytes, or 0 for a handle that is no tensor (logged).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_size(tensor: *const c_void) -> usize {
    boundary::value("nrt_tensor_get_size", 0, || {
        to_usize(self::tensor(tensor, "tensor")?.size(), "size")
    })
}

/// `nrt_tensor_get_va`: the host address of the tensor's memory, or NULL (logged).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_va(tensor: *const c_void) -> *mut c_void {
    boundary::value("nrt_tensor_get_va", std::ptr::null_mut(), || {
        let t = self::tensor(tensor, "tensor")?;
        t.host_address()
            .map(|p| p.cast::<c_void>())
            .ok_or_else(|| invalid(format!("tensor {:?} has no memory", t.name())))
    })
}

/// `nrt_tensor_allocate_slice`: a tensor aliasing part of another.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate_slice(
    tensor_source: *const c_void,
    offset: usize,
    size: usize,
    name: *const c_char,
    tensor_slice: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_tensor_allocate_slice", || {
        let rt = rt()?;
        raw::check_out(tensor_slice, "tensor_slice")?;
        let src = live_tensor(&rt, tensor_source, "tensor_source")?;
        let name = raw::label(name).unwrap_or_default();
        let s = src.slice(to_u64(offset), to_u64(size), &name)?;
        register(s, tensor_slice)
    })
}

/// `nrt_tensor_allocate_empty`: a tensor with no memory yet.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate_empty(
    name: *const c_char,
    tensor: *mut *mut c_void,
) -> u32 {
    boundary::status("nrt_tensor_allocate_empty", || {
        let _rt = rt()?;
        raw::check_out(tensor, "tensor")?;
        let name = raw::label(name).unwrap_or_default();
        register(Tensor::empty(&name), tensor)
    })
}

/// `nrt_tensor_attach_buffer`: the tensor now uses the caller's buffer; its previous memory is
/// freed (unless slices of it remain).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_attach_buffer(
    tensor: *mut c_void,
    buffer: *mut c_void,
    size: usize,
) -> u32 {
    boundary::status("nrt_tensor_attach_buffer", || {
        let _rt = rt()?;
        let entry = TENSORS.get(tensor, "tensor")?;
        let buf = raw::AttachedBuffer::new(buffer, size)?;
        let mut t = entry
            .tensor
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = t.name().to_string();
        // The same handle: its output completion count carries over.
        *t = Tensor::attached(&name, Arc::new(buf)).with_output_completion_of(&t);
        TENSOR_GENERATION.fetch_add(1, Ordering::AcqRel);
        Ok(())
    })
}

/// `nrt_tensor_check_output_completion`: waits until `expected_completion_count` executions
/// have written `output_tensor` as an output (since its count was last reset), for at most
/// `timeout` microseconds (negative: unbounded, with a warning after 30 s; 0: a poll). An
/// execution counts once its outputs are written: it ended with NRT_SUCCESS or
/// NRT_EXEC_COMPLETED_WITH_NUM_ERR. Like libnrt's, no lifecycle gate: any live tensor handle.
/// NRT_TIMEOUT (logged at debug level: an answer) when the count falls short; NRT_INVALID when
/// the tensor is freed meanwhile, NRT_CLOSED when `nrt_close` is called meanwhile.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_check_output_completion(
    output_tensor: *const c_void,
    timeout: i64,
    expected_completion_count: u64,
) -> u32 {
    boundary::status_answering(
        "nrt_tensor_check_output_completion",
        NrtStatus::Timeout,
        || {
            let t = self::tensor(output_tensor, "output_tensor")?;
            let timeout = u64::try_from(timeout)
                .ok()
                .map(std::time::Duration::from_micros);
            let closes = crate::lifecycle::closes();
            t.wait_output_completion_or(expected_completion_count, timeout, || {
                (crate::lifecycle::closes() != closes).then(|| {
                    NrtError::new(
                        NrtStatus::Closed,
                        format!(
                            "nrt_close was called while waiting for output tensor {:?}",
                            t.name()
                        ),
                    )
                })
            })
        },
    )
}

/// `nrt_tensor_reset_output_completion`: `output_tensor`'s completion count back to 0. No
/// lifecycle gate.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_reset_output_completion(output_tensor: *mut c_void) -> u32 {
    boundary::status("nrt_tensor_reset_output_completion", || {
        self::tensor(output_tensor, "output_tensor")?.reset_output_completion();
        Ok(())
    })
}

/// `nrt_tensor_get_device_allocation_info`.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_device_allocation_info(
    tensor: *const c_void,
    alloc_info: *mut c_void,
) -> u32 {
    boundary::status("nrt_tensor_get_device_allocation_info", || {
        let rt = rt()?;
        raw::check_out(alloc_info, "alloc_info")?;
        let t = live_tensor(&rt, tensor, "tensor")?;
        let a = t
            .device_allocation()
            .ok_or_else(|| invalid(format!("tensor {:?} is not in device memory", t.name())))?;
        let out = NrtTensorDeviceAllocationInfo {
            physical_address: a.physical_address,
            size: a.size,
            hbm_index: i32::try_from(a.hbm_index).unwrap_or(i32::MAX),
            _pad: 0,
        };
        raw::write_struct_prefix(alloc_info, out.as_bytes(), "alloc_info")
    })
}

/// `nrt_tensor_get_lnc_index`: the logical core of a device tensor; -1 for host memory or an
/// attached buffer, which belong to no core (the `-1` of `nrt_tensor_allocate`'s host
/// placement; first-party callers read it as "a CPU tensor").
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_lnc_index(tensor: *const c_void, lnc_idx: *mut i32) -> u32 {
    boundary::status("nrt_tensor_get_lnc_index", || {
        let rt = rt()?;
        raw::check_out(lnc_idx, "lnc_idx")?;
        let t = live_tensor(&rt, tensor, "tensor")?;
        let lnc = t
            .vnc()
            .map_or(-1, |vnc| i32::try_from(vnc).unwrap_or(i32::MAX));
        raw::write_out(lnc_idx, lnc, "lnc_idx")
    })
}

/// The device tensor of runtime `rt` whose mapping holds `va..va+size`, and `va`'s offset in
/// it. An address in a tensor a closed runtime allocated is refused as its handle is
/// ([`live_tensor`]): its memory went with that runtime's device.
fn device_tensor_at(rt: &Runtime, va: usize, size: usize) -> Result<(Tensor, u64), NrtError> {
    let end = va
        .checked_add(size)
        .ok_or_else(|| invalid(format!("{va:#x}+{size} overflows")))?;
    let (t, offset) = TENSORS
        .snapshot()
        .into_iter()
        .map(|(_, e)| e.get())
        .filter(|t| t.vnc().is_some())
        .find_map(|t| {
            let start = t.host_address()? as usize;
            let t_end = start.checked_add(usize::try_from(t.size()).ok()?)?;
            (va >= start && end <= t_end).then(|| (t, to_u64(va - start)))
        })
        .ok_or_else(|| {
            invalid(format!(
                "{va:#x}+{size} is not inside the memory of a device tensor of this library"
            ))
        })?;
    match t.runtime() {
        Some(id) if id != rt.id() => Err(invalid(format!(
            "{va:#x} is in tensor {:?}, allocated by a runtime nrt_close has closed: free it \
             (nrt_tensor_free) and allocate it again",
            t.name()
        ))),
        _ => Ok((t, offset)),
    }
}

/// `nrt_get_attached_efa_bdf`: the BDF of the EFA NIC attached to the device whose memory
/// `va` lies in. Libraries that move device memory over EFA (libfabric-based transfer
/// libraries) look it up by `dlsym` and take a failure as "no NIC for this buffer"; the answer
/// here is that failure: simdev has no EFA NIC, and this runtime does not read a Neuron
/// device's PCI topology.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_attached_efa_bdf(
    va: *const c_void,
    efa_bdf: *mut c_char,
    len: *mut usize,
) -> u32 {
    boundary::status("nrt_get_attached_efa_bdf", || {
        let rt = rt()?;
        raw::check_out(efa_bdf, "efa_bdf")?;
        let capacity = raw::read_in(len, "len")?;
        if capacity == 0 {
            return Err(NrtError::new(NrtStatus::Resource, "*len is 0"));
        }
        let (t, _) = device_tensor_at(&rt, va as usize, 1)?;
        Err(NrtError::new(
            NrtStatus::Failure,
            format!(
                "no EFA NIC is attached to the device of {va:p} (tensor {:?}): {}",
                t.name(),
                if rt.device().backend_name() == "sim" {
                    "simdev has no network"
                } else {
                    "this runtime does not read the device's PCI topology"
                }
            ),
        ))
    })
}

/// `nrt_get_hbm_mmap_va`: the mapping of a whole HBM region. This runtime maps each device
/// allocation alone (as simdev hands them out), never a region whole: NRT_INVALID, the answer
/// the API gives where it is unsupported.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_hbm_mmap_va(
    device_id: i32,
    hbm_idx: i32,
    addr: *mut *mut c_void,
    size: *mut usize,
) -> u32 {
    boundary::status("nrt_get_hbm_mmap_va", || {
        let _rt = rt()?;
        raw::check_out(addr, "addr")?;
        raw::check_out(size, "size")?;
        Err(invalid(format!(
            "HBM region {hbm_idx} of device {device_id}: unsupported, this runtime maps each device allocation alone, never an HBM region whole (use nrt_tensor_get_va)"
        )))
    })
}

/// `nrt_memcpy_to_device`: copies into a device tensor's mapping, found by address.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_memcpy_to_device(
    dest: *mut c_void,
    src: *const c_void,
    size: usize,
) -> u32 {
    boundary::status("nrt_memcpy_to_device", || {
        let rt = rt()?;
        if dest.is_null() {
            return Err(invalid("dest is NULL"));
        }
        let (t, offset) = device_tensor_at(&rt, dest as usize, size)?;
        let data = raw::bytes(src, size, "src")?;
        t.write(data, offset)
    })
}

/// `nrt_get_dmabuf_fd`: a descriptor mapping the device memory at `va` (the start of a device
/// allocation) from offset 0.
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_dmabuf_fd(va: u64, size: u64, fd: *mut i32) -> u32 {
    boundary::status("nrt_get_dmabuf_fd", || {
        let rt = rt()?;
        raw::check_out(fd, "fd")?;
        let (t, offset) = device_tensor_at(&rt, to_usize(va, "va")?, to_usize(size, "size")?)?;
        let (owned, base) = t.dmabuf_fd()?;
        if base + offset != 0 {
            return Err(invalid(format!(
                "va {va:#x} is {} bytes into its device allocation: a dma-buf maps a whole allocation, pass its first address",
                base + offset
            )));
        }
        raw::write_out(fd, owned.into_raw_fd(), "fd")
    })
}

/// `nrt_get_dmabuf_fd_v2`: a descriptor mapping the device memory `va` lies in, and where `va`
/// lies in it (`va` may be anywhere inside a device tensor's mapping).
///
/// # Safety
/// A C entry point: pointer arguments are NULL or valid as `include/nrt` documents.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_dmabuf_fd_v2(
    va: u64,
    size: u64,
    fd: *mut i32,
    offset: *mut u64,
) -> u32 {
    boundary::status("nrt_get_dmabuf_fd_v2", || {
        let rt = rt()?;
        raw::check_out(fd, "fd")?;
        raw::check_out(offset, "offset")?;
        let (t, within) = device_tensor_at(&rt, to_usize(va, "va")?, to_usize(size, "size")?)?;
        let (owned, base) = t.dmabuf_fd()?;
        raw::write_out(offset, base + within, "offset")?;
        // Last: nothing can fail after the descriptor is handed over.
        raw::write_out(fd, owned.into_raw_fd(), "fd")
    })
}
