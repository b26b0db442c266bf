//! Every raw-pointer conversion of the C boundary, each checked before use: C strings bounded by
//! `NRT_TENSOR_NAME_MAX`, caller buffers as slices, out-parameters written, and the caller-owned
//! buffer of `nrt_tensor_attach_buffer`.
//!
//! What is checked here is what can be checked: NULL, string length and encoding. That a
//! non-NULL pointer points to as many bytes as the call says is the C caller's part of the
//! contract (as in libnrt); sizes are checked against the tensor *before* a buffer is turned
//! into a slice, so a wrong size is refused without touching the buffer.

use std::ffi::{c_char, c_void};

use runtime::NrtError;
use runtime::tensor::HostBuffer;
use shared::NrtStatus;

use crate::abi::NRT_TENSOR_NAME_MAX;

fn invalid(message: String) -> NrtError {
    NrtError::new(NrtStatus::Invalid, message)
}

/// A required C string argument (`what` names it in errors), at most
/// `NRT_TENSOR_NAME_MAX - 1` bytes before its NUL, UTF-8.
///
/// # Errors
/// NRT_INVALID for NULL, an unterminated or too long string, or bytes that are not UTF-8.
pub fn c_str<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, NrtError> {
    opt_c_str(ptr, what)?.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// An optional C string argument (NULL is `None`), bounded as [`c_str`].
///
/// # Errors
/// As [`c_str`], except NULL.
pub fn opt_c_str<'a>(ptr: *const c_char, what: &str) -> Result<Option<&'a str>, NrtError> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: `ptr` is non-NULL and, by the API's contract, a C string: strnlen reads at most
    // NRT_TENSOR_NAME_MAX bytes and stops at the first NUL, so it never reads past the string.
    let len = unsafe { libc::strnlen(ptr, NRT_TENSOR_NAME_MAX) };
    if len >= NRT_TENSOR_NAME_MAX {
        return Err(invalid(format!(
            "{what} is longer than {} bytes (NRT_TENSOR_NAME_MAX includes the NUL)",
            NRT_TENSOR_NAME_MAX - 1
        )));
    }
    // SAFETY: strnlen found a NUL at `len`, so the `len` bytes before it are the string's,
    // readable; the slice lives only as long as the call that borrowed it.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    std::str::from_utf8(bytes)
        .map(Some)
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// An optional C string that is only a label for logs (a tensor's name, a framework's version):
/// NULL is `None`; C strings are bytes, so any bytes are taken — longer than
/// `NRT_TENSOR_NAME_MAX - 1` bytes it is cut there, and bytes that are not UTF-8 show as
/// U+FFFD. Never refused.
pub fn label(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is non-NULL and, by the API's contract, a C string: strnlen reads at most
    // NRT_TENSOR_NAME_MAX - 1 bytes and stops at the first NUL, so it never reads past the
    // string.
    let len = unsafe { libc::strnlen(ptr, NRT_TENSOR_NAME_MAX - 1) };
    // SAFETY: the string has at least `len` bytes before its NUL (strnlen's result), readable;
    // the slice lives only as long as this call.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    Some(String::from_utf8_lossy(bytes).into_owned())
}

/// A required C string naming a file, at most `PATH_MAX - 1` bytes before its NUL, UTF-8.
///
/// # Errors
/// NRT_INVALID for NULL, an empty, unterminated or too long path, or bytes that are not UTF-8.
pub fn c_path<'a>(ptr: *const c_char, what: &str) -> Result<&'a str, NrtError> {
    const PATH_MAX: usize = 4096;
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: `ptr` is non-NULL and, by the API's contract, a C string: strnlen reads at most
    // PATH_MAX bytes and stops at the first NUL.
    let len = unsafe { libc::strnlen(ptr, PATH_MAX) };
    if len >= PATH_MAX || len == 0 {
        return Err(invalid(format!(
            "{what} is empty or longer than {} bytes",
            PATH_MAX - 1
        )));
    }
    // SAFETY: strnlen found a NUL at `len`: the `len` bytes before it are the string's.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    std::str::from_utf8(bytes).map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// `len` bytes at `ptr` (a caller's input buffer). Length 0 needs no buffer.
///
/// # Errors
/// NRT_INVALID for NULL with a length.
pub fn bytes<'a>(ptr: *const c_void, len: usize, what: &str) -> Result<&'a [u8], NrtError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if isize::try_from(len).is_err() {
        return Err(invalid(format!("{what}: size {len} is too large")));
    }
    // SAFETY: non-NULL; by the call's contract `ptr` points to `len` readable bytes (the size
    // was already checked against the tensor); the slice lives only during the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// `len` writable bytes at `ptr` (a caller's output buffer). Length 0 needs no buffer.
///
/// # Errors
/// NRT_INVALID for NULL with a length.
pub fn bytes_mut<'a>(ptr: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8], NrtError> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if isize::try_from(len).is_err() {
        return Err(invalid(format!("{what}: size {len} is too large")));
    }
    // SAFETY: non-NULL; by the call's contract `ptr` points to `len` writable bytes that
    // nothing else accesses during the call; the slice lives only during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

/// The caller's array of `len` `T`s at `ptr` (an input array of structs). Length 0 needs no
/// array.
///
/// # Errors
/// NRT_INVALID for NULL with a length, an address not aligned for `T`, or a length whose bytes
/// do not fit the address space.
pub fn slice<'a, T: Copy>(ptr: *const T, len: u64, what: &str) -> Result<&'a [T], NrtError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    if !ptr.is_aligned() {
        return Err(invalid(format!(
            "{what} ({ptr:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    let n = usize::try_from(len)
        .ok()
        .filter(|n| {
            n.checked_mul(std::mem::size_of::<T>())
                .is_some_and(|b| isize::try_from(b).is_ok())
        })
        .ok_or_else(|| {
            invalid(format!(
                "{what}: {len} entries do not fit the address space"
            ))
        })?;
    // SAFETY: non-NULL and aligned (checked), `n · size_of::<T>()` bytes fit `isize`
    // (checked); by the call's contract `ptr` points to `len` initialised `T`s (plain C
    // structs: every bit pattern is a value) that the caller does not change during the
    // call; the slice lives only during the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

/// Checks that an out-parameter is not NULL (before any work whose result it would receive).
///
/// # Errors
/// NRT_INVALID naming it.
pub fn check_out<T>(ptr: *mut T, what: &str) -> Result<(), NrtError> {
    if ptr.is_null() {
        Err(invalid(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Writes `v` to the out-parameter `ptr`.
///
/// # Errors
/// NRT_INVALID for NULL.
pub fn write_out<T: Copy>(ptr: *mut T, v: T, what: &str) -> Result<(), NrtError> {
    check_out(ptr, what)?;
    // SAFETY: non-NULL; the caller passes a pointer to a `T` it owns (the out-parameter of the
    // call); an unaligned write tolerates any alignment.
    unsafe { ptr.write_unaligned(v) };
    Ok(())
}

/// Reads the caller's `T` at `ptr` (the handle inside a `T**` argument).
///
/// # Errors
/// NRT_INVALID for NULL.
pub fn read_in<T: Copy>(ptr: *const T, what: &str) -> Result<T, NrtError> {
    if ptr.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL; the caller passes a pointer to its own `T`; unaligned-tolerant read.
    Ok(unsafe { ptr.read_unaligned() })
}

/// Copies `src` to the caller's struct at `ptr` (a size-versioned struct: the caller said how
/// many bytes it has, and `src` is no longer than that).
///
/// # Errors
/// NRT_INVALID for NULL.
pub fn write_struct_prefix(ptr: *mut c_void, src: &[u8], what: &str) -> Result<(), NrtError> {
    check_out(ptr, what)?;
    // SAFETY: non-NULL; the caller declared at least `src.len()` bytes at `ptr` (its size
    // argument, which bounds `src`); the regions cannot overlap (`src` is our own memory).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.cast::<u8>(), src.len()) };
    Ok(())
}

/// A caller-owned buffer attached to a tensor (`nrt_tensor_attach_buffer`).
///
/// # Invariants
/// `addr..addr+len` is memory the caller keeps valid while any tensor uses it (the API's
/// contract); the runtime only calls `read`/`write` with ranges inside `len`.
#[derive(Debug)]
pub struct AttachedBuffer {
    addr: usize,
    len: u64,
}

impl AttachedBuffer {
    /// The buffer at `ptr` of `len` bytes.
    ///
    /// # Errors
    /// NRT_INVALID for NULL or a length of 0 or beyond the address space.
    pub fn new(ptr: *mut c_void, len: usize) -> Result<Self, NrtError> {
        if ptr.is_null() || len == 0 || isize::try_from(len).is_err() {
            return Err(invalid(format!(
                "buffer {ptr:?} of {len} bytes is not a buffer"
            )));
        }
        Ok(Self {
            addr: ptr as usize,
            len: len as u64,
        })
    }
}

impl HostBuffer for AttachedBuffer {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, offset: u64, buf: &mut [u8]) {
        let Ok(off) = usize::try_from(offset) else {
            return;
        };
        // SAFETY: the runtime checked `offset + buf.len() <= len` (HostBuffer's contract) and
        // the caller keeps the buffer valid while the tensor exists (type invariant).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (self.addr as *const u8).add(off),
                buf.as_mut_ptr(),
                buf.len(),
            );
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let Ok(off) = usize::try_from(offset) else {
            return;
        };
        // SAFETY: as in `read`; the caller's buffer is writable by the API's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                (self.addr as *mut u8).add(off),
                data.len(),
            );
        }
    }

    fn address(&self) -> *mut u8 {
        self.addr as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_bounded_and_checked() {
        assert_eq!(c_str(c"input".as_ptr(), "name").unwrap(), "input");
        assert_eq!(
            c_str(std::ptr::null(), "name").unwrap_err().status,
            NrtStatus::Invalid
        );
        assert_eq!(opt_c_str(std::ptr::null(), "name").unwrap(), None);
        let long = vec![b'a'; NRT_TENSOR_NAME_MAX]; // no NUL within the bound
        let e = c_str(long.as_ptr().cast(), "name").unwrap_err();
        assert!(e.message.contains("longer than 255"), "{e}");
        let mut max = vec![b'a'; NRT_TENSOR_NAME_MAX - 1];
        max.push(0);
        assert_eq!(c_str(max.as_ptr().cast(), "name").unwrap().len(), 255);
        let bad = [0xFFu8, 0];
        assert_eq!(
            c_str(bad.as_ptr().cast(), "name").unwrap_err().status,
            NrtStatus::Invalid
        );
    }

    /// A label is never refused: cut at 255 bytes, not UTF-8 shown lossily.
    #[test]
    fn labels_take_any_bytes() {
        assert_eq!(label(std::ptr::null()), None);
        assert_eq!(label(c"input".as_ptr()).as_deref(), Some("input"));
        let long = vec![b'a'; 2 * NRT_TENSOR_NAME_MAX]; // no NUL within the bound
        assert_eq!(label(long.as_ptr().cast()).map(|l| l.len()), Some(255));
        let latin1 = *b"caf\xE9\0";
        assert_eq!(
            label(latin1.as_ptr().cast()).as_deref(),
            Some("caf\u{FFFD}")
        );
    }

    #[test]
    fn buffers_and_out_parameters_refuse_null() {
        assert!(bytes(std::ptr::null(), 0, "buf").unwrap().is_empty());
        assert!(bytes(std::ptr::null(), 1, "buf").is_err());
        assert!(bytes_mut(std::ptr::null_mut(), 1, "buf").is_err());
        assert!(write_out(std::ptr::null_mut::<u32>(), 1, "out").is_err());
        let mut v = 0u32;
        write_out(&mut v, 7, "out").unwrap();
        assert_eq!(v, 7);
        assert!(AttachedBuffer::new(std::ptr::null_mut(), 8).is_err());
    }

    #[test]
    fn an_attached_buffer_reads_and_writes_the_callers_memory() {
        let mut mem = [0u8; 8];
        let b = AttachedBuffer::new(mem.as_mut_ptr().cast(), mem.len()).unwrap();
        b.write(2, &[7, 8]);
        let mut out = [0u8; 3];
        b.read(1, &mut out);
        assert_eq!(out, [0, 7, 8]);
        assert_eq!(b.address(), mem.as_mut_ptr());
    }
}
