//! DMA-able host staging for tensor operations: chunks of host memory the device can reach
//! (`mem_alloc(Host)` + `mem_map`), leased per request and given back at completion.
//!
//! A [`StagingPool`] serves one tensor-op queue. A lease takes the smallest free chunk that
//! holds the request, or allocates one of the next power of two (at least 4 KiB) — so a
//! steady stream of requests of one size allocates only while the number in flight grows.
//! A chunk given back is kept for reuse while the pool retains at most `retain` bytes; beyond
//! that it is freed — except that a queue moving tensors larger than `retain` keeps its one
//! largest chunk, up to [`KEEP_ONE_MAX`], in place of the small ones ([`keep`]): a stream of
//! large writes (weights uploaded tensor by tensor) then allocates, maps and first-touches
//! its staging once instead of once per request. A chunk above [`KEEP_ONE_MAX`] is kept so
//! only once one at least as large was given back before: a single huge write (a 4 GiB
//! tensor uploaded once) leaves nothing held, while a loop writing it every step pays for
//! fresh staging twice, not every step (fresh pages cost this project's 2-core VM about 3 s
//! per GiB). Everything kept is freed by [`StagingPool::release`] (runtime close).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use shared::NrtStatus;
use shared::memory::SharedChunk;
use shared::protocol::MemLocation;

use crate::backend::{Allocation, Device};
use crate::error::NrtError;

/// The largest chunk a pool keeps beyond its `retain` budget, alone (1 GiB).
pub const KEEP_ONE_MAX: u64 = 1 << 30;

/// What becomes of a chunk given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Kept beside the free chunks.
    Beside,
    /// Kept alone: the free chunks are freed instead.
    Alone,
    /// Freed.
    Free,
}

/// The pool's rule for a chunk of `size` bytes given back while free chunks of `kept` sizes
/// are held, `repeated` when a chunk at least as large was given back before: beside them
/// while the total stays within `retain`; otherwise alone when it is larger than `retain` and
/// than every kept chunk, and at most [`KEEP_ONE_MAX`] or `repeated`; else freed. So a pool
/// holds at most `max(retain, KEEP_ONE_MAX)` bytes, or the largest size it moved twice.
pub fn keep(kept: &[u64], size: u64, retain: u64, repeated: bool) -> Keep {
    let total = kept.iter().fold(size, |t, k| t.saturating_add(*k));
    if total <= retain {
        Keep::Beside
    } else if size > retain && (size <= KEEP_ONE_MAX || repeated) && kept.iter().all(|k| *k < size)
    {
        Keep::Alone
    } else {
        Keep::Free
    }
}

/// One staging chunk, mapped.
#[derive(Debug)]
struct StagingBuf {
    allocation: Allocation,
    memory: SharedChunk,
}

/// The staging chunks of one tensor-op queue.
#[derive(Debug)]
pub struct StagingPool {
    device: Arc<dyn Device>,
    /// The free chunks; `None` once released (a chunk given back then is freed).
    free: Mutex<Option<Vec<StagingBuf>>>,
    retain: u64,
    /// The largest chunk given back so far ([`keep`]'s `repeated`).
    largest_given_back: std::sync::atomic::AtomicU64,
}

impl StagingPool {
    /// An empty pool keeping at most `retain` bytes of free chunks.
    pub fn new(device: Arc<dyn Device>, retain: u64) -> Self {
        Self {
            device,
            free: Mutex::new(Some(Vec::new())),
            retain,
            largest_given_back: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<StagingBuf>>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A chunk of at least `len` bytes, until the lease drops. A new chunk's allocation and
    /// mapping wait on the device no later than `deadline` (the caller is a schedule call,
    /// which must not block on a stopped simdev).
    ///
    /// # Errors
    /// NRT_RESOURCE when the device cannot give host memory (naming the size); NRT_TIMEOUT
    /// when the device has not answered by `deadline`; the device's errors.
    pub fn lease(self: &Arc<Self>, len: u64, deadline: Instant) -> Result<StagingLease, NrtError> {
        let reuse = {
            let mut guard = self.lock();
            guard.as_mut().and_then(|free| {
                let best = free
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.allocation.size >= len)
                    .min_by_key(|(_, b)| b.allocation.size)
                    .map(|(i, _)| i);
                best.map(|i| free.swap_remove(i))
            })
        };
        let buf = match reuse {
            Some(b) => b,
            None => {
                let size = len.max(4096).checked_next_power_of_two().unwrap_or(len);
                let allocation = self
                    .device
                    .mem_alloc_by(MemLocation::Host, size, 0, deadline)
                    .map_err(|e| {
                        let mut err = NrtError::from(e);
                        err.message = format!(
                            "allocating {size} bytes of DMA-able host staging: {}",
                            err.message
                        );
                        err
                    })?;
                match self.device.mem_map_by(&allocation, deadline) {
                    Ok(memory) => StagingBuf { allocation, memory },
                    Err(e) => {
                        let _ = self.device.mem_free(allocation.handle);
                        return Err(e.into());
                    }
                }
            }
        };
        Ok(StagingLease {
            buf: Some(buf),
            pool: self.clone(),
        })
    }

    fn give_back(&self, buf: StagingBuf) {
        let size = buf.allocation.size;
        let repeated = self
            .largest_given_back
            .fetch_max(size, std::sync::atomic::Ordering::Relaxed)
            >= size;
        let mut guard = self.lock();
        let freed = match guard.as_mut() {
            None => vec![buf],
            Some(free) => {
                let kept: Vec<u64> = free.iter().map(|b| b.allocation.size).collect();
                match keep(&kept, size, self.retain, repeated) {
                    Keep::Beside => {
                        free.push(buf);
                        return;
                    }
                    Keep::Alone => std::mem::replace(free, vec![buf]),
                    Keep::Free => vec![buf],
                }
            }
        };
        // Freed outside the lock (each is a device call).
        drop(guard);
        for b in freed {
            self.free_chunk(b);
        }
    }

    fn free_chunk(&self, buf: StagingBuf) {
        let handle = buf.allocation.handle;
        drop(buf.memory);
        if let Err(e) = self.device.mem_free(handle) {
            tracing::warn!(error = %e, "freeing a staging chunk");
        }
    }

    /// Bytes of free chunks kept for reuse.
    pub fn retained(&self) -> u64 {
        self.lock()
            .iter()
            .flatten()
            .map(|b| b.allocation.size)
            .sum()
    }

    /// Frees every chunk kept; from now on a chunk given back is freed (leases still out free
    /// theirs when they drop).
    pub fn release(&self) {
        let bufs = self.lock().take().unwrap_or_default();
        for b in bufs {
            self.free_chunk(b);
        }
    }
}

/// A staging chunk leased to one request; back to its pool when dropped.
#[derive(Debug)]
pub struct StagingLease {
    buf: Option<StagingBuf>,
    pool: Arc<StagingPool>,
}

impl StagingLease {
    fn buf(&self) -> Result<&StagingBuf, NrtError> {
        self.buf
            .as_ref()
            .ok_or_else(|| NrtError::new(NrtStatus::Failure, "staging lease already returned"))
    }

    /// Device PA of the chunk's first byte.
    pub fn pa(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.allocation.pa)
    }

    /// Copies `data` to the start of the chunk.
    ///
    /// # Errors
    /// NRT_FAILURE when `data` is larger than the chunk.
    pub fn write(&self, data: &[u8]) -> Result<(), NrtError> {
        let b = self.buf()?;
        b.memory
            .write(b.allocation.pa, data)
            .map_err(|e| NrtError::new(NrtStatus::Failure, format!("staging: {e}")))
    }

    /// The mapping and PA, for a copy out of the chunk.
    pub(crate) fn memory(&self) -> Option<(&SharedChunk, u64)> {
        self.buf.as_ref().map(|b| (&b.memory, b.allocation.pa))
    }
}

impl Drop for StagingLease {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_chunks_are_kept_within_the_budget_and_one_large_one_alone() {
        let retain = 64 * MIB;
        // Within the budget: beside the others.
        assert_eq!(keep(&[], 4096, retain, false), Keep::Beside);
        assert_eq!(keep(&[32 * MIB], 32 * MIB, retain, false), Keep::Beside);
        // Over it, but no larger than the budget: freed (the pool stays within it).
        assert_eq!(
            keep(&[32 * MIB, 16 * MIB], 32 * MIB, retain, false),
            Keep::Free
        );
        // Larger than the budget: kept alone, the small ones freed instead.
        assert_eq!(
            keep(&[32 * MIB, 16 * MIB], 128 * MIB, retain, false),
            Keep::Alone
        );
        assert_eq!(keep(&[], 256 * MIB, retain, false), Keep::Alone);
        assert_eq!(keep(&[], KEEP_ONE_MAX, retain, false), Keep::Alone);
        // A second one as large, a smaller one, or one above the cap: freed.
        assert_eq!(keep(&[256 * MIB], 256 * MIB, retain, false), Keep::Free);
        assert_eq!(keep(&[256 * MIB], 128 * MIB, retain, false), Keep::Free);
        assert_eq!(keep(&[256 * MIB], 4096, retain, false), Keep::Free);
        assert_eq!(keep(&[], 2 * KEEP_ONE_MAX, retain, false), Keep::Free);
        // A larger one replaces it.
        assert_eq!(keep(&[256 * MIB], 512 * MIB, retain, false), Keep::Alone);
        // Above the cap, once one as large came back before: kept alone too.
        assert_eq!(keep(&[], 2 * KEEP_ONE_MAX, retain, true), Keep::Alone);
        assert_eq!(keep(&[MIB], 4 * KEEP_ONE_MAX, retain, true), Keep::Alone);
        assert_eq!(
            keep(&[4 * KEEP_ONE_MAX], 2 * KEEP_ONE_MAX, retain, true),
            Keep::Free
        );
    }
}
