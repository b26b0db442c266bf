//! One tensor-op queue's DMA channel: its DMA queue (TX and RX rings) and its completion words
//! in host memory.
//!
//! A segment is posted as its data pairs (≤ 64 KiB each, the last with the write barrier)
//! followed by the *completion pair*: an 8-byte copy from the record word (where the channel
//! has just stored a fresh token) to the completion word. The DMA processes a queue's pairs in
//! order, so the token in the completion word means every byte of the segment has landed.
//! Tokens count up from 1 per channel and are never reused, so a token seen is always this
//! segment's.
//!
//! # Invariants
//! At most one segment is posted and not yet seen complete (the engine posts the next only
//! after the previous token arrived), so the whole ring is free when a segment is posted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use shared::NrtStatus;
use shared::memory::SharedChunk;
use shared::protocol::MemLocation;
use shared::udma::MAX_DESC_LEN;

use crate::backend::{Allocation, Device, DmaQueueId};
use crate::dma::DmaQueue;
use crate::error::NrtError;

/// Offset of the completion word (the DMA writes the token here) in the channel's host chunk.
const COMPLETION_WORD: u64 = 0;
/// Offset of the record word (the token the completion pair copies).
const RECORD_WORD: u64 = 8;
/// Bytes of the completion pair's copy.
const RECORD_LEN: u64 = 8;

/// A tensor-op queue's DMA channel.
#[derive(Debug)]
pub struct Channel {
    queue: DmaQueue,
    words: Allocation,
    memory: SharedChunk,
    next_token: u64,
}

impl Channel {
    /// Creates the DMA queue `id` with rings of `ring_descs` descriptors in host memory, and a
    /// host chunk for the completion words.
    ///
    /// # Errors
    /// The device's errors, naming the queue.
    pub fn create(
        dev: &Arc<dyn Device>,
        id: DmaQueueId,
        ring_descs: u32,
    ) -> Result<Self, NrtError> {
        let fail = |e: &dyn std::error::Error, status| {
            NrtError::new(
                status,
                format!(
                    "tensor-op DMA queue (NC {}, engine {}, queue {}): {}",
                    id.nc,
                    id.engine,
                    id.queue,
                    crate::error::chain(e)
                ),
            )
        };
        let queue = DmaQueue::create(dev.as_ref(), id, ring_descs, MemLocation::Host)
            // The error names the queue already.
            .map_err(|e| NrtError::new(e.status(), format!("tensor-op {e}")))?;
        let words = match dev.mem_alloc(MemLocation::Host, 4096, 0) {
            Ok(a) => a,
            Err(e) => {
                let _ = queue.release(dev.as_ref());
                return Err(fail(&e, e.status()));
            }
        };
        let memory = match dev.mem_map(&words) {
            Ok(m) => m,
            Err(e) => {
                let _ = dev.mem_free(words.handle);
                let _ = queue.release(dev.as_ref());
                return Err(fail(&e, e.status()));
            }
        };
        Ok(Self {
            queue,
            words,
            memory,
            next_token: 1,
        })
    }

    /// The DMA queue.
    pub fn id(&self) -> DmaQueueId {
        self.queue.id()
    }

    /// The NC whose notification queue reports this queue's errors.
    pub fn nc(&self) -> u32 {
        self.queue.id().nc
    }

    /// The queue as a DmaQueueError notification names it (`engine << 8 | queue`).
    pub fn source(&self) -> u16 {
        let id = self.queue.id();
        u16::try_from((id.engine << 8) | id.queue).unwrap_or(u16::MAX)
    }

    /// The most bytes one segment moves: the ring's pairs but one (the completion pair), of
    /// 64 KiB each.
    pub fn max_segment_bytes(&self) -> u64 {
        u64::from(self.queue.tx().count().saturating_sub(1)) * u64::from(MAX_DESC_LEN)
    }

    /// Posts one segment — `len` bytes (at most [`Channel::max_segment_bytes`]) from `src` to
    /// `dst` and the completion pair — and rings the DMA doorbell, waiting on the device no
    /// later than `deadline` (the request's). Returns the token the completion word will hold
    /// once the segment has landed.
    ///
    /// # Errors
    /// The status the request completes with: the doorbell's (1203 for a queue a DMA abort
    /// stopped, NRT_TIMEOUT for a device that did not answer by `deadline`) or NRT_FAILURE
    /// when a descriptor cannot be written.
    pub fn post(
        &mut self,
        dev: &dyn Device,
        src: u64,
        dst: u64,
        len: u64,
        deadline: std::time::Instant,
    ) -> Result<u64, NrtStatus> {
        let token = self.next_token;
        self.next_token += 1;
        let base = self.words.pa;
        self.memory
            .store_u64(base + RECORD_WORD, token, Ordering::Release)
            .map_err(|_| NrtStatus::Failure)?;
        let posted = (|| {
            self.queue.push_copy(src, dst, len)?;
            self.queue
                .push_copy(base + RECORD_WORD, base + COMPLETION_WORD, RECORD_LEN)?;
            self.queue.kick_by(dev, deadline)
        })();
        posted.map_err(|e| {
            tracing::error!(queue = ?self.queue.id(), error = %e, "posting a tensor-op segment");
            e.status()
        })?;
        Ok(token)
    }

    /// Segments posted so far.
    pub fn segments_posted(&self) -> u64 {
        self.next_token - 1
    }

    /// Whether the segment of `token` has landed (acquire on the completion word).
    pub fn arrived(&self, token: u64) -> bool {
        self.memory
            .load_u64(self.words.pa + COMPLETION_WORD, Ordering::Acquire)
            .is_ok_and(|t| t == token)
    }

    /// Releases the DMA queue and frees the rings and the completion words.
    pub fn release(self, dev: &dyn Device) {
        let id = self.queue.id();
        if let Err(e) = self.queue.release(dev) {
            tracing::warn!(
                queue = %id,
                error = %e,
                "releasing a tensor-op DMA queue"
            );
        }
        drop(self.memory);
        if let Err(e) = dev.mem_free(self.words.handle) {
            tracing::warn!(queue = ?id, error = %e, "freeing a tensor-op completion page");
        }
    }
}
