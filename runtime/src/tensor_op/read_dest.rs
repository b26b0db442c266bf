//! Where a scheduled tensor read delivers its bytes: [`ReadBuffer`].
//!
//! A read completes asynchronously, so its destination must outlive the call that schedules it.
//! The safe form is an `Arc`'d host buffer owned by the runtime and the caller together
//! ([`ReadBuffer::new`]): the worker copies the bytes from staging into it at completion and
//! the caller reads them afterwards ([`ReadBuffer::with_bytes`]). The C ABI passes a raw
//! pointer instead; [`ReadBuffer::from_raw`] wraps one under a documented contract. This
//! module is the only one with `unsafe` for it.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use shared::NrtStatus;
use shared::memory::{MemError, SharedChunk};

use crate::error::NrtError;
use crate::tensor::zeroed_host_bytes;

/// A caller-owned destination (the C ABI's `void *buf`).
#[derive(Debug)]
struct RawDest {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `RawDest` is only built by `ReadBuffer::from_raw`, whose caller promised that the
// `len` bytes at `ptr` stay valid and untouched by anyone else until the read completes; the
// only access is the worker's one copy into them, from whichever thread runs it.
unsafe impl Send for RawDest {}
// SAFETY: as for `Send`: shared references never touch the bytes; only `fill` writes them, once,
// from the worker.
unsafe impl Sync for RawDest {}

#[derive(Debug)]
enum Target {
    Owned(Mutex<Vec<u8>>),
    Raw(RawDest),
}

/// The destination of a scheduled tensor read. Cloning shares it.
#[derive(Clone, Debug)]
pub struct ReadBuffer {
    target: Arc<Target>,
}

impl ReadBuffer {
    /// A runtime-owned host buffer of `len` zero bytes.
    ///
    /// # Errors
    /// NRT_RESOURCE when host memory cannot hold `len` bytes.
    pub fn new(len: u64) -> Result<Self, NrtError> {
        let bytes = zeroed_host_bytes("a tensor read's destination", len)?;
        Ok(Self {
            target: Arc::new(Target::Owned(Mutex::new(bytes))),
        })
    }

    /// Wraps caller-owned memory (the C ABI's `buf`): the read writes its bytes there when it
    /// completes.
    ///
    /// # Errors
    /// NRT_INVALID for a null `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes from this call until the read scheduled
    /// with this buffer has completed (its sequence id shows completed, or its status cell is
    /// set), and nothing else may read or write those bytes in that time. If the read is never
    /// scheduled (the schedule call fails), the contract ends when the last clone of the
    /// returned value is dropped.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<Self, NrtError> {
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            NrtError::new(NrtStatus::Invalid, "a tensor read's destination is NULL")
        })?;
        Ok(Self {
            target: Arc::new(Target::Raw(RawDest { ptr, len })),
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match &*self.target {
            Target::Owned(v) => v
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .len(),
            Target::Raw(r) => r.len,
        }
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the bytes of a runtime-owned buffer ([`ReadBuffer::new`]); `None` for
    /// caller-owned memory (the caller reads it directly). Call it after the read completed:
    /// before, the bytes are those of an earlier read (or zeros).
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        match &*self.target {
            Target::Owned(v) => Some(f(&v
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner))),
            Target::Raw(_) => None,
        }
    }

    /// The bytes of a runtime-owned buffer, copied (see [`ReadBuffer::with_bytes`]).
    pub fn to_vec(&self) -> Option<Vec<u8>> {
        self.with_bytes(<[u8]>::to_vec)
    }

    /// Copies `len` bytes at `pa` of `memory` to the start of the buffer (the worker, at the
    /// read's completion). `len` was checked against [`ReadBuffer::len`] at schedule time.
    pub(crate) fn fill(&self, memory: &SharedChunk, pa: u64, len: usize) -> Result<(), MemError> {
        match &*self.target {
            Target::Owned(v) => {
                let mut v = v.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let n = len.min(v.len());
                memory.read(pa, &mut v[..n])
            }
            Target::Raw(r) => {
                let n = len.min(r.len);
                // SAFETY: `from_raw`'s contract: the `r.len` bytes at `r.ptr` are valid for
                // writes and nobody else touches them until this read completes, which is after
                // this copy (the status and the completion are published after it).
                let dest = unsafe { std::slice::from_raw_parts_mut(r.ptr.as_ptr(), n) };
                memory.read(pa, dest)
            }
        }
    }
}
