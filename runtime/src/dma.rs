//! UDMA descriptor rings as the runtime writes them (`reference/driver-abi.md` §2).
//!
//! A [`DescRing`] is one TX or RX ring in a mapped chunk: the runtime writes 16-byte
//! descriptors at `next`, and when the slot at index `count − 1` has been written the ring id
//! advances (1, 2, 3, 0, …), exactly as the driver's rings do. A [`DmaQueue`] pairs a TX and an
//! RX ring on one (NC, engine, queue), builds M2M copies (≤ 64 KiB per descriptor pair, the last
//! pair of a transfer with the write barrier) and rings the DMA doorbell
//! ([`crate::backend::Device::dma_queue_copy_start`]: RX count, then TX count).
//!
//! Descriptors can also be encoded before their ring position is known: [`build_copy`] turns
//! a copy into [`PrebuiltPair`]s (this is what bind does for an execution's I/O, outside the
//! submit lock), and [`DmaQueue::append_prebuilt`] appends them, patching only the ring id of
//! the pass each slot belongs to (the one field that depends on the position). The result is
//! byte-identical to [`DmaQueue::push_copy`] of the same copy at the same position.
//!
//! This module is backend-independent: the same descriptors go to simdev and to silicon.

use shared::memory::{MemError, SharedChunk};
use shared::protocol::MemLocation;
#[cfg(test)]
use shared::udma::MAX_RING_DESCS;
use shared::udma::{self, DescError, MAX_DESC_LEN, RingId, UDMA_DESC_SIZE, UdmaDesc};
use thiserror::Error;
use zerocopy::IntoBytes;

use crate::backend::{Allocation, Device, DeviceError, DmaQueueId, DmaRings};

/// A DMA ring or queue operation that failed.
#[derive(Debug, Error)]
pub enum DmaError {
    /// A ring size the driver would refuse.
    #[error(
        "ring of {count} descriptors breaks the driver's rule (32 <= n <= 2^24-16, n % 16 == 0)"
    )]
    BadRingSize {
        /// The size asked for.
        count: u32,
    },
    /// More descriptors posted than the ring holds before the doorbell.
    #[error("ring full: {count} descriptors already posted since the last doorbell")]
    RingFull {
        /// Ring size.
        count: u32,
    },
    /// Writing a descriptor into the ring's memory failed.
    // The layers below are part of the text (every message formats these with `{e}`), not
    // `source()`s, which a chain would print twice.
    #[error("writing descriptor {index}: {error}")]
    WriteDescriptor {
        /// Slot index.
        index: u32,
        /// The accessor's error.
        error: MemError,
    },
    /// A copy that cannot be expressed as descriptors.
    #[error("building a copy descriptor: {0}")]
    Build(DescError),
    /// The device refused a ring or queue operation. The device error's own sources (simdev's
    /// reason, the errno) are part of the text too.
    #[error("DMA queue ({queue}): {}", crate::error::chain(error))]
    Device {
        /// The queue.
        queue: DmaQueueId,
        /// The backend's error.
        error: DeviceError,
    },
}

impl DmaError {
    /// The `NRT_STATUS` a call reports for it: the device's for a refusal (NRT_RESOURCE for
    /// device memory or descriptors that ran out), else NRT_FAILURE.
    pub fn status(&self) -> shared::NrtStatus {
        match self {
            Self::Device { error, .. } => error.status(),
            _ => shared::NrtStatus::Failure,
        }
    }
}

/// Checks a ring size against the driver's rule ([`udma::is_valid_ring_size`], §2.5).
///
/// # Errors
/// [`DmaError::BadRingSize`].
pub fn check_ring_size(count: u32) -> Result<(), DmaError> {
    if udma::is_valid_ring_size(count) {
        Ok(())
    } else {
        Err(DmaError::BadRingSize { count })
    }
}

/// One descriptor ring in a mapped chunk.
///
/// # Invariants
/// `next < count`; `ring_id` is the id of the pass `next` belongs to.
#[derive(Debug)]
pub struct DescRing {
    memory: SharedChunk,
    count: u32,
    next: u32,
    ring_id: RingId,
}

impl DescRing {
    /// A ring of `count` descriptors at the start of `memory`, positioned at index 0, ring id 1
    /// (the state DMA_QUEUE_INIT gives the queue).
    ///
    /// # Errors
    /// [`DmaError::BadRingSize`], or a chunk smaller than `count · 16` bytes.
    pub fn new(memory: SharedChunk, count: u32) -> Result<Self, DmaError> {
        check_ring_size(count)?;
        let bytes = count as usize * UDMA_DESC_SIZE;
        if memory.len() < bytes {
            return Err(DmaError::WriteDescriptor {
                index: count - 1,
                error: MemError::OutOfBounds {
                    pa: memory.pa(),
                    len: bytes,
                    chunk_pa: memory.pa(),
                    chunk_len: memory.len(),
                },
            });
        }
        Ok(Self {
            memory,
            count,
            next: 0,
            ring_id: RingId::INITIAL,
        })
    }

    /// Ring size in descriptors.
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// Index of the next slot to write.
    pub const fn next_index(&self) -> u32 {
        self.next
    }

    /// Ring id of the pass the next slot belongs to.
    pub const fn ring_id(&self) -> RingId {
        self.ring_id
    }

    /// Device PA of slot `index`.
    pub fn slot_pa(&self, index: u32) -> u64 {
        self.memory.pa() + u64::from(index) * UDMA_DESC_SIZE as u64
    }

    /// Reads back the descriptor in slot `index` (for inspection and tests).
    pub fn read(&self, index: u32) -> Option<UdmaDesc> {
        (index < self.count)
            .then(|| self.memory.read_obj(self.slot_pa(index)).ok())
            .flatten()
    }

    /// Writes `desc` at the next slot and advances (wrapping, with a ring-id advance).
    ///
    /// # Errors
    /// [`DmaError::WriteDescriptor`].
    pub fn push(&mut self, desc: &UdmaDesc) -> Result<(), DmaError> {
        let index = self.next;
        self.memory
            .write_obj(self.slot_pa(index), desc)
            .map_err(|error| DmaError::WriteDescriptor { index, error })?;
        self.next += 1;
        if self.next == self.count {
            // INVARIANT: the pass ended at slot count-1; the next slot is 0 on the next pass.
            self.next = 0;
            self.ring_id = self.ring_id.next();
        }
        Ok(())
    }

    /// Writes `desc(i)` for each item `i` of `items` at the next slots, each with the ring id
    /// of the pass its slot belongs to (every other bit as given), and advances:
    /// [`DescRing::push`] for each, with one bounds check and one copy per run of at most
    /// [`RUN`] slots that does not wrap, instead of one per descriptor.
    ///
    /// # Errors
    /// [`DmaError::WriteDescriptor`] (the slots of the runs before it are written).
    pub fn push_all<T>(
        &mut self,
        items: &[T],
        desc: impl Fn(&T) -> UdmaDesc,
    ) -> Result<(), DmaError> {
        if let [item] = items {
            // One descriptor (a small tensor's copy): no run to assemble.
            return self.push(&desc(item).with_ring_id(self.ring_id));
        }
        let mut run = [UdmaDesc::default(); RUN];
        let mut rest = items;
        while !rest.is_empty() {
            let index = self.next;
            // A run stays inside one pass: its slots share a ring id.
            let room = usize::try_from(self.count - index).unwrap_or(RUN).min(RUN);
            let (now, later) = rest.split_at(rest.len().min(room));
            let n = now.len();
            for (slot, item) in run.iter_mut().zip(now) {
                *slot = desc(item).with_ring_id(self.ring_id);
            }
            self.memory
                .write(self.slot_pa(index), run[..n].as_bytes())
                .map_err(|error| DmaError::WriteDescriptor { index, error })?;
            // 1 <= n <= count - index, so next <= count.
            self.next += u32::try_from(n).unwrap_or(0);
            if self.next == self.count {
                // INVARIANT: the pass ended at slot count-1; the next slot is 0 on the next pass.
                self.next = 0;
                self.ring_id = self.ring_id.next();
            }
            rest = later;
        }
        Ok(())
    }
}

/// Most descriptors [`DescRing::push_all`] writes with one copy (512 B on the stack).
const RUN: usize = 32;

/// The pieces of a `len`-byte copy: (src, dst, bytes ≤ 64 KiB, write barrier on the last).
fn copy_pieces(src: u64, dst: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64, bool)> {
    let max = u64::from(MAX_DESC_LEN);
    (0..len.div_ceil(max)).map(move |k| {
        let done = k * max;
        let chunk = (len - done).min(max);
        (src + done, dst + done, chunk, done + chunk == len)
    })
}

/// One M2M copy piece's TX and RX descriptors, encoded before their ring position is known.
/// Only [`build_copy`] makes one; [`DmaQueue::append_prebuilt`] writes it with the ring id of
/// the slot it lands in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrebuiltPair {
    tx: UdmaDesc,
    rx: UdmaDesc,
}

impl PrebuiltPair {
    /// The TX (source) descriptor as encoded (ring id not yet patched).
    pub const fn tx(&self) -> &UdmaDesc {
        &self.tx
    }

    /// The RX (destination) descriptor as encoded (ring id not yet patched).
    pub const fn rx(&self) -> &UdmaDesc {
        &self.rx
    }
}

#[cfg(test)]
thread_local! {
    /// Pairs [`build_copy`] encoded on this thread (tests check who builds descriptors).
    static PAIRS_BUILT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// Pairs [`rebuild_copy`] re-encoded on this thread.
    static PAIRS_REBUILT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Pairs [`rebuild_copy`] has re-encoded on the calling thread (test builds only).
#[cfg(test)]
pub(crate) fn pairs_rebuilt_on_this_thread() -> u64 {
    PAIRS_REBUILT.with(std::cell::Cell::get)
}

/// Pairs [`build_copy`] has encoded on the calling thread (test builds only).
#[cfg(test)]
pub(crate) fn pairs_built_on_this_thread() -> u64 {
    PAIRS_BUILT.with(std::cell::Cell::get)
}

/// Encodes the descriptor pairs of a `len`-byte copy from `src` to `dst` (device PAs) and
/// appends them to `out`: pieces of at most 64 KiB, the last with the write barrier — the
/// pairs [`DmaQueue::push_copy`] would write, with the ring id left for
/// [`DmaQueue::append_prebuilt`] to set. Returns the number of pairs. Allocates only if `out`
/// has to grow.
///
/// # Errors
/// [`DmaError::Build`] for a zero length (nothing is appended).
pub fn build_copy(
    src: u64,
    dst: u64,
    len: u64,
    out: &mut Vec<PrebuiltPair>,
) -> Result<u32, DmaError> {
    if len == 0 {
        return Err(DmaError::Build(DescError::BadLength(0)));
    }
    let start = out.len();
    for (s, d, n, barrier) in copy_pieces(src, dst, len) {
        match udma::m2m_copy_descriptors(s, d, n, RingId::INITIAL, barrier) {
            Ok((tx, rx)) => out.push(PrebuiltPair { tx, rx }),
            Err(e) => {
                out.truncate(start);
                return Err(DmaError::Build(e));
            }
        }
    }
    let pairs = out.len() - start;
    #[cfg(test)]
    PAIRS_BUILT.with(|c| c.set(c.get() + pairs as u64));
    Ok(u32::try_from(pairs).unwrap_or(u32::MAX))
}

/// Re-encodes, in place, the pairs [`build_copy`] made for a copy of the same `len` into
/// `pairs`, for new `src` and `dst` PAs: the pieces of a copy depend on its length only, so the
/// pairs keep their number and order, and each is exactly what [`build_copy`] would encode for
/// the new PAs.
///
/// # Errors
/// [`DmaError::Build`] for a zero length or when `pairs` is not as long as the copy's pieces
/// (nothing is written then; past those checks every piece is 1..=64 KiB and encodes).
pub fn rebuild_copy(
    src: u64,
    dst: u64,
    len: u64,
    pairs: &mut [PrebuiltPair],
) -> Result<(), DmaError> {
    let pieces = len.div_ceil(u64::from(MAX_DESC_LEN));
    if len == 0 || u64::try_from(pairs.len()).ok() != Some(pieces) {
        return Err(DmaError::Build(DescError::BadLength(len)));
    }
    for (slot, (s, d, n, barrier)) in pairs.iter_mut().zip(copy_pieces(src, dst, len)) {
        let (tx, rx) = udma::m2m_copy_descriptors(s, d, n, RingId::INITIAL, barrier)
            .map_err(DmaError::Build)?;
        *slot = PrebuiltPair { tx, rx };
    }
    #[cfg(test)]
    PAIRS_REBUILT.with(|c| c.set(c.get() + pieces));
    Ok(())
}

/// A TX/RX ring pair bound to one DMA queue, with the chunks it allocated.
#[derive(Debug)]
pub struct DmaQueue {
    id: DmaQueueId,
    tx: DescRing,
    rx: DescRing,
    allocations: [Allocation; 2],
    posted_tx: u32,
    posted_rx: u32,
}

impl DmaQueue {
    /// Device bytes of the queue's two rings.
    pub fn device_bytes(&self) -> u64 {
        self.allocations.iter().map(|a| a.size).sum()
    }

    /// Allocates two rings of `desc_count` descriptors in `location`, maps them and binds them to
    /// `id` (DMA_QUEUE_INIT).
    ///
    /// # Errors
    /// [`DmaError::BadRingSize`]; [`DmaError::Device`] for allocation, mapping or init.
    pub fn create(
        dev: &dyn Device,
        id: DmaQueueId,
        desc_count: u32,
        location: MemLocation,
    ) -> Result<Self, DmaError> {
        check_ring_size(desc_count)?;
        let bytes = u64::from(desc_count) * UDMA_DESC_SIZE as u64;
        let device = |error| DmaError::Device { queue: id, error };
        let tx_alloc = dev.mem_alloc(location, bytes, 0).map_err(device)?;
        let rx_alloc = match dev.mem_alloc(location, bytes, 0) {
            Ok(a) => a,
            Err(e) => {
                let _ = dev.mem_free(tx_alloc.handle);
                return Err(device(e));
            }
        };
        let result = (|| {
            let tx = DescRing::new(dev.mem_map(&tx_alloc).map_err(device)?, desc_count)?;
            let rx = DescRing::new(dev.mem_map(&rx_alloc).map_err(device)?, desc_count)?;
            let rings = DmaRings {
                tx_ring: tx_alloc.handle,
                tx_desc_count: desc_count,
                rx_ring: rx_alloc.handle,
                rx_desc_count: desc_count,
            };
            dev.dma_queue_init(id, &rings).map_err(device)?;
            Ok((tx, rx))
        })();
        match result {
            Ok((tx, rx)) => Ok(Self {
                id,
                tx,
                rx,
                allocations: [tx_alloc, rx_alloc],
                posted_tx: 0,
                posted_rx: 0,
            }),
            Err(e) => {
                let _ = dev.mem_free(tx_alloc.handle);
                let _ = dev.mem_free(rx_alloc.handle);
                Err(e)
            }
        }
    }

    /// The queue's id.
    pub const fn id(&self) -> DmaQueueId {
        self.id
    }

    /// The TX ring.
    pub const fn tx(&self) -> &DescRing {
        &self.tx
    }

    /// The RX ring.
    pub const fn rx(&self) -> &DescRing {
        &self.rx
    }

    /// Descriptor pairs posted since the last doorbell.
    pub const fn posted(&self) -> u32 {
        self.posted_rx
    }

    /// Writes the descriptor pairs of a `len`-byte copy from `src` to `dst` (device PAs), split
    /// into chunks of at most 64 KiB; the last pair carries the write barrier. Returns the
    /// number of pairs written. Nothing moves until [`DmaQueue::kick`].
    ///
    /// # Errors
    /// [`DmaError::RingFull`] when the copy does not fit in the ring before the next doorbell
    /// (nothing is written then); [`DmaError::Build`] for a zero length.
    pub fn push_copy(&mut self, src: u64, dst: u64, len: u64) -> Result<u32, DmaError> {
        if len == 0 {
            return Err(DmaError::Build(DescError::BadLength(0)));
        }
        let pairs = len.div_ceil(u64::from(MAX_DESC_LEN));
        let room = u64::from(self.tx.count() - self.posted_tx.max(self.posted_rx));
        if pairs > room {
            return Err(DmaError::RingFull {
                count: self.tx.count(),
            });
        }
        for (s, d, n, last) in copy_pieces(src, dst, len) {
            self.push_pair_raw(s, d, n, last)?;
        }
        Ok(u32::try_from(pairs).unwrap_or(u32::MAX))
    }

    /// Appends descriptor pairs [`build_copy`] encoded earlier, setting in each descriptor the
    /// ring id of the pass its slot belongs to (TX and RX rings each their own) and changing
    /// nothing else: no descriptor is built here. Returns the number of pairs appended.
    ///
    /// # Errors
    /// [`DmaError::RingFull`] when the pairs do not all fit in the ring before the next
    /// doorbell (nothing is written then, so the ring stays in step with the device);
    /// [`DmaError::WriteDescriptor`].
    pub fn append_prebuilt(&mut self, pairs: &[PrebuiltPair]) -> Result<u32, DmaError> {
        let room = self.tx.count() - self.posted_tx.max(self.posted_rx);
        let n = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        if n > room {
            return Err(DmaError::RingFull {
                count: self.tx.count(),
            });
        }
        self.tx.push_all(pairs, |p| p.tx)?;
        self.rx.push_all(pairs, |p| p.rx)?;
        // n <= room: posted stays within the ring.
        self.posted_tx += n;
        self.posted_rx += n;
        Ok(n)
    }

    /// Writes one descriptor pair built with the rings' current ring ids.
    fn push_pair_raw(
        &mut self,
        src: u64,
        dst: u64,
        len: u64,
        barrier: bool,
    ) -> Result<(), DmaError> {
        // Encoded once; each ring's id set in its descriptor (`with_ring_id` changes nothing
        // else, as `append_prebuilt` relies on too).
        let (tx, rx) = udma::m2m_copy_descriptors(src, dst, len, RingId::INITIAL, barrier)
            .map_err(DmaError::Build)?;
        self.push_descriptors(
            &tx.with_ring_id(self.tx.ring_id()),
            &rx.with_ring_id(self.rx.ring_id()),
        )
    }

    /// Writes a raw TX/RX descriptor pair (for callers that build descriptors themselves, and
    /// for tests of the device's decoder).
    ///
    /// # Errors
    /// [`DmaError::RingFull`] or [`DmaError::WriteDescriptor`].
    pub fn push_descriptors(&mut self, tx: &UdmaDesc, rx: &UdmaDesc) -> Result<(), DmaError> {
        if self.posted_tx >= self.tx.count() || self.posted_rx >= self.rx.count() {
            return Err(DmaError::RingFull {
                count: self.tx.count(),
            });
        }
        self.tx.push(tx)?;
        self.rx.push(rx)?;
        self.posted_tx += 1;
        self.posted_rx += 1;
        Ok(())
    }

    /// Hands everything posted since the last doorbell to the device without ringing it: for
    /// queues the device starts itself (the sequencer's exec queue, I/O queues an SP program
    /// starts with `DmaStart`). The caller bounds how far it runs ahead of the device.
    pub fn hand_to_device(&mut self) {
        self.posted_tx = 0;
        self.posted_rx = 0;
    }

    /// The DMA doorbell for everything posted since the last one (DMA_QUEUE_COPY_START: RX count
    /// then TX count). A no-op when nothing is posted.
    ///
    /// # Errors
    /// [`DmaError::Device`] (e.g. the queue was stopped by a DMA abort).
    pub fn kick(&mut self, dev: &dyn Device) -> Result<(), DmaError> {
        self.ring(|id, tx, rx| dev.dma_queue_copy_start(id, tx, rx))
    }

    /// [`DmaQueue::kick`] waiting on the device no later than `deadline`
    /// ([`Device::dma_queue_copy_start_by`]): for the XU worker.
    ///
    /// # Errors
    /// As [`DmaQueue::kick`], and [`DmaError::Device`] with [`DeviceError::Late`] when the
    /// device did not answer by `deadline`.
    pub fn kick_by(
        &mut self,
        dev: &dyn Device,
        deadline: std::time::Instant,
    ) -> Result<(), DmaError> {
        self.ring(|id, tx, rx| dev.dma_queue_copy_start_by(id, tx, rx, deadline))
    }

    fn ring(
        &mut self,
        copy_start: impl FnOnce(DmaQueueId, u32, u32) -> Result<(), DeviceError>,
    ) -> Result<(), DmaError> {
        if self.posted_rx == 0 {
            return Ok(());
        }
        let (tx, rx) = (self.posted_tx, self.posted_rx);
        self.posted_tx = 0;
        self.posted_rx = 0;
        copy_start(self.id, tx, rx).map_err(|source| DmaError::Device {
            queue: self.id,
            error: source,
        })
    }

    /// Releases the queue and frees its rings.
    ///
    /// # Errors
    /// [`DmaError::Device`] for the first failing step (the others are still attempted).
    pub fn release(self, dev: &dyn Device) -> Result<(), DmaError> {
        let id = self.id;
        let allocations = self.allocations;
        drop(self.tx);
        drop(self.rx);
        let mut first = dev.dma_queue_release(id).err();
        for a in allocations {
            if let Err(e) = dev.mem_free(a.handle) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), |error| Err(DmaError::Device { queue: id, error }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(count: u32) -> DescRing {
        let file = tempfile::tempfile().unwrap();
        file.set_len(u64::from(count) * 16).unwrap();
        let mem = SharedChunk::map_fd(&file, 0x10_0000_0000, count as usize * 16, true).unwrap();
        DescRing::new(mem, count).unwrap()
    }

    /// A queue on two tempfile-backed rings (no device: only descriptor writes are tested).
    fn queue(count: u32) -> DmaQueue {
        let alloc = Allocation {
            handle: crate::backend::MemHandle(0),
            pa: 0,
            size: 0,
            location: MemLocation::Hbm { nc: 0 },
        };
        DmaQueue {
            id: DmaQueueId {
                nc: 0,
                engine: 1,
                queue: 2,
            },
            tx: ring(count),
            rx: ring(count),
            allocations: [alloc, alloc],
            posted_tx: 0,
            posted_rx: 0,
        }
    }

    fn slots(r: &DescRing) -> Vec<[u8; UDMA_DESC_SIZE]> {
        (0..r.count())
            .map(|i| r.read(i).unwrap().to_le_bytes())
            .collect()
    }

    #[test]
    fn prebuilt_pairs_are_byte_identical_to_push_copy_across_a_ring_wrap() {
        // 150 KiB: 64 + 64 + 22 KiB pieces, the last with the write barrier; then a 4-byte copy.
        let copies = [(0x10_0000u64, 0x90_0000u64, 150 << 10), (0x7000, 0x8000, 4)];
        let mut prebuilt = Vec::new();
        for &(src, dst, len) in &copies {
            build_copy(src, dst, len, &mut prebuilt).unwrap();
        }
        assert_eq!(prebuilt.len(), 4);
        assert!(prebuilt.iter().all(|p| p.tx().ring_id() == RingId::INITIAL));
        let (mut old, mut new) = (queue(32), queue(32));
        // Both at slot 30 of pass 1: the pieces land in slots 30, 31 (ring id 1), 0, 1 (id 2).
        for q in [&mut old, &mut new] {
            for _ in 0..30 {
                q.push_copy(0x1, 0x2, 16).unwrap();
            }
            q.hand_to_device();
        }
        for &(src, dst, len) in &copies {
            old.push_copy(src, dst, len).unwrap();
        }
        assert_eq!(new.append_prebuilt(&prebuilt).unwrap(), 4);
        assert_eq!(slots(&old.tx), slots(&new.tx), "TX ring bytes");
        assert_eq!(slots(&old.rx), slots(&new.rx), "RX ring bytes");
        let ids = |r: &DescRing| [30, 31, 0, 1].map(|i| r.read(i).unwrap().ring_id().value());
        assert_eq!(ids(&new.tx), [1, 1, 2, 2]);
        assert_eq!(ids(&new.rx), [1, 1, 2, 2]);
        assert_eq!((new.tx.next_index(), new.tx.ring_id().value()), (2, 2));
        // The pieces, decoded on the pass each slot belongs to.
        let tx2 = new
            .tx
            .read(0)
            .unwrap()
            .decode_tx(RingId::new(2).unwrap())
            .unwrap();
        assert_eq!((tx2.src, tx2.len, tx2.barrier), (0x12_0000, 22 << 10, true));
        let tx1 = new.tx.read(31).unwrap().decode_tx(RingId::INITIAL).unwrap();
        assert_eq!((tx1.src, tx1.len, tx1.barrier), (0x11_0000, 65536, false));
        let rx3 = new
            .rx
            .read(1)
            .unwrap()
            .decode_rx(RingId::new(2).unwrap())
            .unwrap();
        assert_eq!((rx3.dst, rx3.len), (0x8000, 4));
    }

    #[test]
    fn push_all_writes_what_push_writes_in_runs_across_wraps() {
        // 100 distinct descriptors into a 64-slot ring from slot 40: runs of 24 (to the wrap),
        // 32, 32 and 12 on passes 1, 2, 2, 2 — then 40 more, wrapping again into pass 3, to
        // slot 52.
        let descs: Vec<UdmaDesc> = (0..140u64)
            .map(|i| {
                let (tx, _) = udma::m2m_copy_descriptors(
                    0x1000 * i,
                    0x2000,
                    4 + i,
                    RingId::INITIAL,
                    i % 3 == 0,
                )
                .unwrap();
                tx
            })
            .collect();
        let (mut one, mut runs) = (ring(64), ring(64));
        for r in [&mut one, &mut runs] {
            for _ in 0..40 {
                r.push(&descs[0]).unwrap();
            }
        }
        for d in &descs {
            one.push(&d.with_ring_id(one.ring_id())).unwrap();
        }
        runs.push_all(&descs[..100], |d| *d).unwrap();
        runs.push_all(&descs[100..], |d| *d).unwrap();
        // Then one at a time (the single-descriptor path) from slot 52 across the next wrap.
        for d in &descs[..14] {
            one.push(&d.with_ring_id(one.ring_id())).unwrap();
            runs.push_all(std::slice::from_ref(d), |d| *d).unwrap();
        }
        assert_eq!(slots(&one), slots(&runs));
        assert_eq!(
            (runs.next_index(), runs.ring_id()),
            (one.next_index(), one.ring_id())
        );
        assert_eq!((runs.next_index(), runs.ring_id().value()), (2, 0));
        // Slots 52..63 were written on pass 3 (ring id 3), slots 0 and 1 on pass 4 (ring id 0).
        assert_eq!(runs.read(63).unwrap().ring_id().value(), 3);
        assert_eq!(runs.read(1).unwrap().ring_id().value(), 0);
        assert_eq!(runs.read(2).unwrap().ring_id().value(), 3);
    }

    #[test]
    fn prebuilt_pairs_get_every_ring_id_over_four_passes() {
        let mut pairs = Vec::new();
        build_copy(0x100, 0x200, 64, &mut pairs).unwrap();
        let mut q = queue(32);
        for pass in 0..4u32 {
            for slot in 0..32 {
                q.append_prebuilt(&pairs).unwrap();
                q.hand_to_device();
                let want = u8::try_from((1 + pass) % 4).unwrap();
                assert_eq!(q.tx.read(slot).unwrap().ring_id().value(), want);
                assert_eq!(q.rx.read(slot).unwrap().ring_id().value(), want);
            }
        }
    }

    #[test]
    fn append_prebuilt_refuses_what_does_not_fit_and_writes_nothing() {
        let mut pairs = Vec::new();
        build_copy(0x100, 0x200, 3 * 65536, &mut pairs).unwrap();
        let mut q = queue(32);
        for _ in 0..30 {
            q.push_copy(0x1, 0x2, 16).unwrap();
        }
        let before = (slots(&q.tx), slots(&q.rx), q.tx.next_index(), q.posted());
        assert!(matches!(
            q.append_prebuilt(&pairs),
            Err(DmaError::RingFull { count: 32 })
        ));
        assert_eq!(
            (slots(&q.tx), slots(&q.rx), q.tx.next_index(), q.posted()),
            before
        );
        q.hand_to_device();
        assert_eq!(q.append_prebuilt(&pairs).unwrap(), 3);
    }

    #[test]
    fn build_copy_refuses_zero_bytes_and_appends_nothing() {
        let mut pairs = Vec::new();
        build_copy(0x100, 0x200, 4, &mut pairs).unwrap();
        assert!(matches!(
            build_copy(0x100, 0x200, 0, &mut pairs),
            Err(DmaError::Build(DescError::BadLength(0)))
        ));
        assert_eq!(pairs.len(), 1);
    }

    #[test]
    fn ring_sizes_follow_the_driver_rules() {
        for ok in [32, 48, 4096, MAX_RING_DESCS] {
            assert!(check_ring_size(ok).is_ok(), "{ok}");
        }
        for bad in [0, 16, 31, 33, 40, MAX_RING_DESCS + 16] {
            assert!(
                matches!(check_ring_size(bad), Err(DmaError::BadRingSize { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn ring_id_advances_after_the_last_slot() {
        let mut r = ring(32);
        let d = UdmaDesc::default();
        for _ in 0..31 {
            r.push(&d).unwrap();
        }
        assert_eq!((r.next_index(), r.ring_id().value()), (31, 1));
        r.push(&d).unwrap();
        assert_eq!((r.next_index(), r.ring_id().value()), (0, 2));
        for _ in 0..32 * 3 {
            r.push(&d).unwrap();
        }
        assert_eq!(r.ring_id().value(), 1, "1 -> 2 -> 3 -> 0 -> 1");
    }

    #[test]
    fn descriptors_land_at_their_slot() {
        let mut r = ring(32);
        let (tx, _) = udma::m2m_copy_descriptors(1, 2, 3, r.ring_id(), false).unwrap();
        r.push(&tx).unwrap();
        r.push(&tx).unwrap();
        let got: UdmaDesc = r.memory.read_obj(r.slot_pa(1)).unwrap();
        assert_eq!(got, tx);
    }

    #[test]
    fn a_device_error_names_the_queue_and_what_the_device_said() {
        let e = DmaError::Device {
            queue: DmaQueueId {
                nc: 0,
                engine: 1,
                queue: 2,
            },
            error: DeviceError::OutOfRange {
                op: "DmaQueueInit",
                what: "ring size",
                value: 5,
                limit: 4,
            },
        };
        assert_eq!(
            e.to_string(),
            "DMA queue (NC 0 engine 1 queue 2): DmaQueueInit: ring size 5 is out of range (limit 4)"
        );
        // The text holds it all; no source repeats it in a chain.
        assert_eq!(crate::error::chain(&e), e.to_string());
    }

    #[test]
    fn a_device_refusal_keeps_simdevs_reason_in_the_text() {
        let e = DmaError::Device {
            queue: DmaQueueId {
                nc: 0,
                engine: 15,
                queue: 13,
            },
            error: DeviceError::Remote {
                op: "MemAlloc",
                source: shared::protocol::RemoteError {
                    kind: shared::protocol::ErrorKind::OutOfMemory,
                    message: "creating the chunk's memfd: EMFILE".into(),
                },
            },
        };
        // The device error's own source (simdev's reason) was dropped: "MemAlloc refused by
        // simdev" and nothing more reached the caller.
        assert!(
            e.to_string().ends_with(
                "MemAlloc refused by simdev: OutOfMemory: creating the chunk's memfd: EMFILE"
            ),
            "{e}"
        );
        assert_eq!(crate::error::chain(&e), e.to_string());
        // An I/O ring that could not be made for want of device memory is NRT_RESOURCE (it
        // was NRT_FAILURE).
        assert_eq!(e.status(), shared::NrtStatus::Resource);
    }
}
