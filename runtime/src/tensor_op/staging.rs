//! DMA-able host staging for tensor operations: chunks of host memory the device can reach
//! (`mem_alloc(Host)` + `mem_map`), leased per request and given back at completion.
//!
//! A [`StagingPool`] serves one tensor-op queue. A lease takes the smallest free chunk that
//! holds the request, or allocates one of the next power of two (at least 4 KiB) — so a
//! steady stream of requests of one size allocates only while the number in flight grows.
//! A chunk given back is kept for reuse while the pool retains at most `retain` bytes; beyond
//! that it is freed. Everything kept is freed by [`StagingPool::release`] (runtime close).

use std::sync::{Arc, Mutex};

use shared::NrtStatus;
use shared::memory::SharedChunk;
use shared::protocol::MemLocation;

use crate::backend::{Allocation, Device};
use crate::error::NrtError;

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
    free: Mutex<Vec<StagingBuf>>,
    retain: u64,
}

impl StagingPool {
    /// An empty pool keeping at most `retain` bytes of free chunks.
    pub fn new(device: Arc<dyn Device>, retain: u64) -> Self {
        Self {
            device,
            free: Mutex::new(Vec::new()),
            retain,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<StagingBuf>> {
        self.free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A chunk of at least `len` bytes, until the lease drops.
    ///
    /// # Errors
    /// NRT_RESOURCE when the device cannot give host memory (naming the size); the device's
    /// errors.
    pub fn lease(self: &Arc<Self>, len: u64) -> Result<StagingLease, NrtError> {
        let reuse = {
            let mut free = self.lock();
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.allocation.size >= len)
                .min_by_key(|(_, b)| b.allocation.size)
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let buf = match reuse {
            Some(b) => b,
            None => {
                let size = len.max(4096).checked_next_power_of_two().unwrap_or(len);
                let allocation =
                    self.device
                        .mem_alloc(MemLocation::Host, size, 0)
                        .map_err(|e| {
                            let mut err = NrtError::from(e);
                            err.message = format!(
                                "allocating {size} bytes of DMA-able host staging: {}",
                                err.message
                            );
                            err
                        })?;
                match self.device.mem_map(&allocation) {
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
        let mut free = self.lock();
        let kept: u64 = free.iter().map(|b| b.allocation.size).sum();
        if kept.saturating_add(buf.allocation.size) <= self.retain {
            free.push(buf);
            return;
        }
        drop(free);
        self.free_chunk(buf);
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
        self.lock().iter().map(|b| b.allocation.size).sum()
    }

    /// Frees every chunk kept (leases still out free theirs when they drop, as the pool is
    /// then over its budget of 0).
    pub fn release(&self) {
        let bufs = std::mem::take(&mut *self.lock());
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
