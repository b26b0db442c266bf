//! DMA queues and descriptor processing: the UDMA engines of one NC
//! (`reference/driver-abi.md` §2, DESIGN §5).
//!
//! Each of an NC's `engines × queues` DMA queues has a TX (M2S, source) ring and an RX (S2M,
//! destination) ring of 16-byte descriptors in client memory. A queue's *pending* counts are
//! the descriptors posted past its head (the tail increments of DMA_QUEUE_COPY_START, or a DMA
//! write into a DRTP_INC register) and not yet processed. Processing takes pairs while both
//! rings have pending descriptors: the TX descriptor names a source, the RX descriptor a
//! destination of the same length, which is either client memory (a copy), a range of the
//! sequencer DMEM of an NC the client owns (any length that fits the DMEM window), a range of
//! one SBUF partition of an NC the client owns (the SBUF window,
//! [`AddressMap::decode_sbuf`]), or a register (a 4-byte write: semaphore, event, or another
//! queue's tail increment). A source is client memory or one SBUF partition of an NC the client
//! owns; the rest of the register window cannot be read. A descriptor that runs past the end of
//! an SBUF partition decodes as no SBUF range, and so as an out-of-bounds register access.
//!
//! Every pair is checked completely before anything is written, so a bad pair stops the queue
//! with all earlier pairs done and nothing of itself or later ones: the queue becomes
//! [`QueueStatus::Stopped`] with a reason naming the descriptor, the ring and the rule (an
//! [`Abort`], which the device turns into a DMA-abort notification). Work per doorbell is
//! bounded by a [`Budget`], so a queue that re-arms itself forever aborts instead of hanging
//! simdev.
//!
//! This module owns no locks. Memory resolution and register writes that leave this NC go
//! through a [`Bus`] that the device implements for one client; a tail increment of another
//! NC's queue is returned as [`Outcome::Deferred`] so the device can apply it after releasing
//! this NC's lock (never two NC locks at once) and then [`DmaQueues::finish_deferred`].

use std::sync::Arc;

use shared::address_map::{AddressMap, Register};
use shared::memory::{MemError, copy};
use shared::udma::{self, DescError, Direction, RingId, UDMA_DESC_SIZE, UdmaDesc, check_pair};
use thiserror::Error;

use crate::client::ClientId;
use crate::memory::{CacheSlot, Chunk, ChunkCache};
use crate::registers::RegisterWriteError;

/// Default [`Budget`] per doorbell, in descriptor pairs.
pub const DEFAULT_BUDGET_PAIRS: u64 = 1 << 26;
/// Default [`Budget`] per doorbell, in bytes moved (64 GiB).
pub const DEFAULT_BUDGET_BYTES: u64 = 1 << 36;

/// One DMA queue of the device (the one id type shared with the runtime).
pub use shared::udma::DmaQueueId;

/// Whether a queue takes work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueStatus {
    /// Processing descriptors as they are posted.
    Running,
    /// Stopped by a DMA abort; the reason names the descriptor and the rule. A new
    /// DMA_QUEUE_INIT restarts it.
    Stopped(String),
}

/// A queue request that broke a rule (the device maps each variant to an error kind).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum QueueError {
    /// Engine or queue index outside the arch's counts.
    #[error(
        "engine {engine} queue {queue} is out of range (the NC has {engines} engines of {queues} queues)"
    )]
    OutOfRange {
        /// Engine given.
        engine: u32,
        /// Queue given.
        queue: u32,
        /// Engines per NC.
        engines: u32,
        /// Queues per engine.
        queues: u32,
    },
    /// A ring size the hardware does not take.
    #[error(
        "{dir:?} ring of {count} descriptors breaks the ring rule 32 <= n <= 2^24-16 and n % 16 == 0"
    )]
    RingSize {
        /// Which ring.
        dir: Direction,
        /// Size given, in descriptors.
        count: u32,
    },
    /// The ring's chunk is smaller than its descriptors.
    #[error("{dir:?} ring of {count} descriptors needs {needed} bytes, its chunk has {chunk}")]
    RingTooSmall {
        /// Which ring.
        dir: Direction,
        /// Ring size in descriptors.
        count: u32,
        /// `count × 16` bytes.
        needed: u64,
        /// The chunk's size in bytes.
        chunk: u64,
    },
    /// DMA_QUEUE_INIT was never done (or the queue was released or reset).
    #[error("DMA engine {engine} queue {queue} is not initialised")]
    NotInitialized {
        /// Engine.
        engine: u32,
        /// Queue.
        queue: u32,
    },
    /// A DMA abort stopped the queue.
    #[error("DMA engine {engine} queue {queue} is stopped: {reason}")]
    Stopped {
        /// Engine.
        engine: u32,
        /// Queue.
        queue: u32,
        /// The abort reason.
        reason: String,
    },
    /// DMA_QUEUE_COPY_START with no RX descriptor.
    #[error(
        "rx_desc_count must be at least 1 (0 hits a kernel BUG_ON on hardware in the tail-increment helper)"
    )]
    ZeroRx,
    /// A tail-increment register write of 0.
    #[error("a tail increment must be at least 1")]
    ZeroIncrement,
    /// More descriptors posted than the ring holds.
    #[error(
        "ring overrun: {dir:?} ring of {size} descriptors has {pending} pending, {count} more would exceed it"
    )]
    Overrun {
        /// Which ring.
        dir: Direction,
        /// Descriptors posted now.
        count: u32,
        /// Descriptors already pending.
        pending: u32,
        /// Ring size.
        size: u32,
    },
}

/// Why a descriptor pair stopped its queue.
#[derive(Debug, Error)]
pub enum Fault {
    /// A descriptor broke a decoding rule (ring id, reserved bits, length mismatch…).
    #[error(transparent)]
    Descriptor(#[from] DescError),
    /// The ring memory could not be read (a simdev bug: ring chunks are size-checked).
    #[error("reading the descriptor ring")]
    RingRead(#[source] MemError),
    /// The source is not inside one chunk of the queue's client.
    #[error("TX source {pa:#x}+{len} is not in this client's memory")]
    SourceOutOfBounds {
        /// Source PA.
        pa: u64,
        /// Length in bytes.
        len: u32,
    },
    /// The source is in the register window (outside an SBUF partition), which DMA cannot
    /// read.
    #[error(
        "TX source {pa:#x} is in the register window outside an SBUF partition; DMA cannot read registers"
    )]
    RegisterSource {
        /// Source PA.
        pa: u64,
    },
    /// An SBUF range of an NC the client does not own.
    #[error("SBUF range {pa:#x}+{len} is on NC {nc}, which this client does not own")]
    ForeignSbuf {
        /// The range's PA.
        pa: u64,
        /// Length in bytes.
        len: u32,
        /// The SBUF's NC.
        nc: u32,
    },
    /// The destination is not inside one chunk of the queue's client.
    #[error("RX destination {pa:#x}+{len} is not in this client's memory")]
    DestinationOutOfBounds {
        /// Destination PA.
        pa: u64,
        /// Length in bytes.
        len: u32,
    },
    /// The destination is in the register window but names no register.
    #[error("RX destination {pa:#x} is in the register window but names no register")]
    UnknownRegister {
        /// Destination PA.
        pa: u64,
    },
    /// A register write of other than 4 bytes.
    #[error("register write to {pa:#x} is {len} bytes; registers take exactly 4")]
    RegisterLength {
        /// Destination PA.
        pa: u64,
        /// Length in bytes.
        len: u32,
    },
    /// A DMEM range of an NC the client does not own.
    #[error("DMEM destination {pa:#x}+{len} is on NC {nc}, which this client does not own")]
    ForeignDmem {
        /// Destination PA.
        pa: u64,
        /// Length in bytes.
        len: u32,
        /// The DMEM's NC.
        nc: u32,
    },
    /// A register of an NC the client does not own.
    #[error("register {reg:?} is on NC {nc}, which this client does not own")]
    ForeignRegister {
        /// The register.
        reg: Register,
        /// Its NC.
        nc: u32,
    },
    /// The register file refused the write.
    #[error("register {reg:?} refused the write")]
    Register {
        /// The register.
        reg: Register,
        /// Why.
        #[source]
        source: RegisterWriteError,
    },
    /// A tail-increment register write broke a queue rule.
    #[error("tail increment {reg:?} by {value} refused")]
    TailIncrement {
        /// The register.
        reg: Register,
        /// The value written.
        value: u32,
        /// Why.
        #[source]
        source: QueueError,
    },
    /// The data copy failed (a simdev bug: both sides were resolved).
    #[error("copying the data")]
    Copy(#[source] MemError),
    /// A fault injected at the doorbell ([`shared::protocol::FaultWhen::NthCopyStart`]).
    #[error("injected fault at the DMA doorbell ({})", if *oob { "out of bounds" } else { "DMA abort" })]
    Injected {
        /// An out-of-bounds access (`OutOfBounds`) rather than a plain abort (`DmaAbort`).
        oob: bool,
    },
    /// The doorbell's work budget is spent.
    #[error(
        "the doorbell's budget of {pairs} descriptor pairs / {bytes} bytes is spent (a queue re-arming itself?)"
    )]
    Budget {
        /// Pair budget.
        pairs: u64,
        /// Byte budget.
        bytes: u64,
    },
}

impl Fault {
    /// Whether the fault is an access outside the client's memory or registers (reported with
    /// the OOB error flag).
    pub const fn is_oob(&self) -> bool {
        matches!(
            self,
            Self::SourceOutOfBounds { .. }
                | Self::RegisterSource { .. }
                | Self::DestinationOutOfBounds { .. }
                | Self::UnknownRegister { .. }
                | Self::ForeignRegister { .. }
                | Self::ForeignDmem { .. }
                | Self::ForeignSbuf { .. }
                | Self::Injected { oob: true }
        )
    }
}

/// A queue stopped by a bad pair: what the device reports in its DMA-abort notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Abort {
    /// The queue.
    pub queue: DmaQueueId,
    /// Whether the cause was an out-of-bounds access.
    pub oob: bool,
    /// The stop reason (also the queue's [`QueueStatus::Stopped`] text).
    pub reason: String,
}

/// Work left for one doorbell (a CopyStart and every queue it starts through tail increments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pairs: u64,
    bytes: u64,
    pairs_left: u64,
    bytes_left: u64,
}

impl Budget {
    /// At most `pairs` descriptor pairs and `bytes` bytes.
    pub const fn new(pairs: u64, bytes: u64) -> Self {
        Self {
            pairs,
            bytes,
            pairs_left: pairs,
            bytes_left: bytes,
        }
    }

    fn spent(&self) -> Option<Fault> {
        (self.pairs_left == 0 || self.bytes_left == 0).then_some(Fault::Budget {
            pairs: self.pairs,
            bytes: self.bytes,
        })
    }

    fn charge(&mut self, len: u32) {
        self.pairs_left = self.pairs_left.saturating_sub(1);
        self.bytes_left = self.bytes_left.saturating_sub(u64::from(len));
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(DEFAULT_BUDGET_PAIRS, DEFAULT_BUDGET_BYTES)
    }
}

/// What a [`Bus`] did with a register write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterWrite {
    /// Written.
    Done,
    /// A tail increment of another NC's queue: the device applies it after this NC's lock is
    /// released (see [`Outcome::Deferred`]).
    Deferred,
}

/// The rest of the device as one client's DMA sees it.
pub trait Bus {
    /// The client's chunk that holds all of `pa..pa+len`; `None` when no chunk of the client
    /// holds the whole range (nothing there, straddling chunks, another client's chunk).
    fn resolve(&self, pa: u64, len: usize) -> Option<Arc<Chunk>>;

    /// The client whose DMA this is.
    fn client(&self) -> ClientId;

    /// The address space's current [`Generation`](crate::memory::Generation): a resolution
    /// made at this generation stands while it is unchanged.
    fn memory_generation(&self) -> u64;

    /// Writes `value` to `reg`, a register that is not a tail increment of this NC (those are
    /// applied by [`DmaQueues`] itself).
    ///
    /// # Errors
    /// [`Fault::ForeignRegister`] when the register's NC is not the client's,
    /// [`Fault::Register`] when the register file refuses the write.
    fn write_register(&mut self, reg: Register, value: u32) -> Result<RegisterWrite, Fault>;

    /// Writes `data` at byte `offset` of NC `nc`'s sequencer DMEM (`offset + data.len()` is
    /// inside the window: [`AddressMap::decode_dmem`] checked it).
    ///
    /// # Errors
    /// [`Fault::ForeignDmem`] when the NC is not the client's.
    fn write_dmem(&mut self, nc: u32, offset: u64, data: &[u8]) -> Result<(), Fault>;

    /// Whether the client owns NC `nc` (an SBUF range of another NC is out of bounds).
    fn owns_nc(&self, nc: u32) -> bool;

    /// Calls `read` on the `len` bytes at `at` = (`nc`, `partition`, `offset`) of an SBUF
    /// partition, where they lie (inside the partition: [`AddressMap::decode_sbuf`] checked it), so a
    /// DMA out of SBUF copies once; `read`'s result.
    ///
    /// `read` should return something small (`()`, a `bool`): its result comes back right
    /// after the copy, and a large one (a `Result` of a [`Fault`]) moved through memory there
    /// makes the CPU wait for all of the copy's stores to drain (see `CopyError` here).
    ///
    /// # Errors
    /// [`Fault::ForeignSbuf`] when the NC is not the client's (`read` is not called).
    fn with_sbuf<T>(
        &self,
        at: (u32, u32, u64),
        len: usize,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, Fault>;

    /// Calls `write` on the `len` bytes at `at` = (`nc`, `partition`, `offset`) of an SBUF
    /// partition, where they lie (inside the partition: [`AddressMap::decode_sbuf`] checked it), so a
    /// DMA into SBUF copies once; `write`'s result, which should be small, as for
    /// [`Bus::with_sbuf`]. A `write` that fails must leave the bytes unchanged (a refused pair
    /// writes nothing).
    ///
    /// # Errors
    /// [`Fault::ForeignSbuf`] when the NC is not the client's (`write` is not called).
    fn with_sbuf_mut<T>(
        &mut self,
        at: (u32, u32, u64),
        len: usize,
        write: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, Fault>;

    /// Queue `queue` (of this NC) got work from a tail increment: process it after the current
    /// one.
    fn schedule(&mut self, queue: DmaQueueId);
}

/// What a checked descriptor pair does, as [`DmaQueues::peek`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairEffect {
    /// A copy into client memory at `dst`.
    Copy {
        /// Destination PA.
        dst: u64,
    },
    /// A write into SBUF partition `partition` of NC `nc` at `offset`.
    Sbuf {
        /// The SBUF's NC.
        nc: u32,
        /// The partition.
        partition: u32,
        /// Byte offset in the partition.
        offset: u64,
    },
    /// A write of `data` into NC `nc`'s sequencer DMEM at `offset`.
    Dmem {
        /// The DMEM's NC.
        nc: u32,
        /// Byte offset in the DMEM.
        offset: u64,
        /// The source bytes (read when the pair was checked).
        data: DmemBytes,
    },
    /// A 4-byte register write.
    Register {
        /// The register.
        reg: Register,
        /// The value the source holds.
        value: u32,
    },
}

/// Bytes of a DMEM write read by [`DmaQueues::peek`]: held inline up to
/// [`DmemBytes::INLINE`] bytes (the sequencer's 52-byte request), so peeking a batch allocates
/// nothing; a longer write is held on the heap.
#[derive(Clone, PartialEq, Eq)]
pub struct DmemBytes(DmemRepr);

#[derive(Clone, PartialEq, Eq)]
enum DmemRepr {
    Inline {
        len: usize,
        bytes: [u8; DmemBytes::INLINE],
    },
    Heap(Vec<u8>),
}

impl DmemBytes {
    /// Bytes held without a heap allocation.
    pub const INLINE: usize = 64;

    /// `len` zero bytes.
    fn zeroed(len: usize) -> Self {
        if len <= Self::INLINE {
            Self(DmemRepr::Inline {
                len,
                bytes: [0; Self::INLINE],
            })
        } else {
            Self(DmemRepr::Heap(vec![0; len]))
        }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.0 {
            DmemRepr::Inline { len, bytes } => bytes.get_mut(..*len).unwrap_or_default(),
            DmemRepr::Heap(v) => v,
        }
    }
}

impl std::ops::Deref for DmemBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            DmemRepr::Inline { len, bytes } => bytes.get(..*len).unwrap_or_default(),
            DmemRepr::Heap(v) => v,
        }
    }
}

impl From<&[u8]> for DmemBytes {
    fn from(data: &[u8]) -> Self {
        let mut out = Self::zeroed(data.len());
        out.as_mut_slice().copy_from_slice(data);
        out
    }
}

impl From<Vec<u8>> for DmemBytes {
    fn from(data: Vec<u8>) -> Self {
        Self::from(data.as_slice())
    }
}

impl std::fmt::Debug for DmemBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A descriptor pair read and checked without being executed ([`DmaQueues::peek`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeekedPair {
    /// Length in bytes (both sides).
    pub len: u32,
    /// What the pair would do.
    pub effect: PairEffect,
    /// The source PA when the pair reads client memory (the sequencer reads the request
    /// slot's `cc_dma_increment` trailer next to pair 1's source).
    pub src_pa: Option<u64>,
}

/// Why [`DmaQueues::peek`] found no valid pair.
#[derive(Debug, Error)]
pub enum PeekError {
    /// The queue is not initialised or is stopped.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The pair breaks a descriptor rule, exactly as processing would find it (a stale ring id
    /// when nothing was staged there).
    #[error(transparent)]
    Fault(#[from] Fault),
}

/// The result of [`DmaQueues::process`].
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No more pairs to process (or the queue is absent, stopped, or waiting on a deferred
    /// write).
    Idle,
    /// A pair stopped the queue.
    Aborted(Abort),
    /// The pair at the head is a tail increment of another NC's queue: apply it without this
    /// NC's lock, then call [`DmaQueues::finish_deferred`].
    Deferred(Deferred),
}

/// A register write waiting for the device (see [`Outcome::Deferred`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deferred {
    /// The queue that wrote it.
    pub queue: DmaQueueId,
    /// The register (a tail increment of another NC).
    pub reg: Register,
    /// The value written.
    pub value: u32,
    generation: u64,
}

/// Checks a ring size against the hardware's rule, [`udma::is_valid_ring_size`]: 32 ≤ n ≤
/// 2^24 − 16 and n a multiple of 16 (`driver-abi.md` §2.5).
///
/// # Errors
/// [`QueueError::RingSize`].
pub fn check_ring_size(dir: Direction, count: u32) -> Result<(), QueueError> {
    if udma::is_valid_ring_size(count) {
        Ok(())
    } else {
        Err(QueueError::RingSize { dir, count })
    }
}

/// One ring of a queue.
#[derive(Debug)]
struct Ring {
    chunk: Arc<Chunk>,
    size: u32,
    head: u32,
    pending: u32,
    ring_id: RingId,
}

impl Ring {
    fn new(dir: Direction, chunk: Arc<Chunk>, count: u32) -> Result<Self, QueueError> {
        check_ring_size(dir, count)?;
        let needed = u64::from(count) * UDMA_DESC_SIZE as u64;
        if chunk.size() < needed {
            return Err(QueueError::RingTooSmall {
                dir,
                count,
                needed,
                chunk: chunk.size(),
            });
        }
        Ok(Self {
            chunk,
            size: count,
            head: 0,
            pending: 0,
            ring_id: RingId::INITIAL,
        })
    }

    fn check_post(&self, dir: Direction, count: u32) -> Result<(), QueueError> {
        match self.pending.checked_add(count) {
            Some(total) if total <= self.size => Ok(()),
            _ => Err(QueueError::Overrun {
                dir,
                count,
                pending: self.pending,
                size: self.size,
            }),
        }
    }

    /// The slot `ahead` descriptors past the head and the ring id of the pass it is on.
    fn slot(&self, ahead: u32) -> (u32, RingId) {
        slot_at(self.head, self.size, self.ring_id, ahead)
    }

    fn read(&self, index: u32) -> Result<UdmaDesc, Fault> {
        let pa = self.chunk.pa() + u64::from(index) * UDMA_DESC_SIZE as u64;
        self.chunk.memory().read_obj(pa).map_err(Fault::RingRead)
    }

    fn advance(&mut self) {
        self.pending = self.pending.saturating_sub(1);
        self.step_head();
    }

    /// Moves the head past one slot (a new pass, with the next ring id, after the last slot).
    fn step_head(&mut self) {
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
            self.ring_id = self.ring_id.next();
        }
    }
}

/// The slot `ahead` descriptors past slot `head` of a ring of `size` whose head is on the
/// pass of `ring_id`, and the ring id of the pass that slot is on.
fn slot_at(head: u32, size: u32, ring_id: RingId, ahead: u32) -> (u32, RingId) {
    // A slot on the head's own pass, as every processed pair's (`ahead` 0) and nearly every
    // peeked one's is: no division (ring sizes are multiples of 16, not powers of two, and a
    // division's latency sits on the path to the descriptor's load in every pair).
    if let Some(index) = head.checked_add(ahead).filter(|&i| i < size) {
        return (index, ring_id);
    }
    let pos = u64::from(head) + u64::from(ahead);
    let size = u64::from(size.max(1));
    let index = u32::try_from(pos % size).unwrap_or(0);
    let mut ring_id = ring_id;
    for _ in 0..(pos / size) % 4 {
        ring_id = ring_id.next();
    }
    (index, ring_id)
}

/// One initialised queue.
#[derive(Debug)]
struct DmaQueue {
    tx: Ring,
    rx: Ring,
    status: QueueStatus,
    generation: u64,
    /// A deferred register write of the pair at the head is being applied.
    in_flight: bool,
}

/// What an NC's DMA queues did: pairs completed, bytes moved, register writes made and
/// queues stopped on a bad descriptor, counted by [`DmaQueues`] itself. Plain adds, not
/// atomic ones: the queues change only through `&mut DmaQueues`, which simdev holds only under
/// its NC's state lock, and readers copy them under the same lock ([`DmaQueues::counts`]).
/// A locked add per counter per run cost about 30 cycles each on the CI VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaCounts {
    /// Descriptor pairs completed.
    pub descriptors: u64,
    /// Bytes moved (register writes count their 4 bytes).
    pub bytes: u64,
    /// Register writes performed by DMA.
    pub register_writes: u64,
    /// Queues stopped on a bad descriptor, or by an injected DMA abort.
    pub aborts: u64,
}

impl DmaCounts {
    /// Counts one completed pair of `len` bytes, a register write when `register`.
    fn pair(&mut self, len: u32, register: bool) {
        self.descriptors += 1;
        self.bytes += u64::from(len);
        self.register_writes += u64::from(register);
    }
}

/// Where a checked pair's bytes come from.
enum Source<'c> {
    /// Client memory (a chunk lent by the queues' [`ChunkCache`]).
    Memory { chunk: &'c Chunk, pa: u64 },
    /// One SBUF partition of an NC the client owns.
    Sbuf {
        nc: u32,
        partition: u32,
        offset: u64,
    },
}

impl Source<'_> {
    /// Reads the source bytes into `out` (the pair's length).
    #[inline]
    fn read_into(&self, out: &mut [u8], bus: &impl Bus) -> Result<(), Fault> {
        match self {
            Self::Memory { chunk, pa } => chunk.memory().read(*pa, out).map_err(Fault::Copy),
            Self::Sbuf {
                nc,
                partition,
                offset,
            } => bus.with_sbuf((*nc, *partition, *offset), out.len(), |bytes| {
                out.copy_from_slice(bytes);
            }),
        }
    }

    /// Reads the 4-byte source of a register write (a fixed-size read: no copy loop).
    fn read_word(&self, bus: &impl Bus) -> Result<u32, Fault> {
        let word = match self {
            Self::Memory { chunk, pa } => chunk
                .memory()
                .read_obj::<[u8; 4]>(*pa)
                .map_err(Fault::Copy)?,
            Self::Sbuf { .. } => {
                let mut word = [0u8; 4];
                self.read_into(&mut word, bus)?;
                word
            }
        };
        Ok(u32::from_le_bytes(word))
    }

    /// Reads the `len` source bytes into `scratch` (grown as needed) and returns them.
    fn read<'s>(
        &self,
        len: u32,
        bus: &impl Bus,
        scratch: &'s mut Vec<u8>,
    ) -> Result<&'s [u8], Fault> {
        let len = len_usize(len);
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        let out = scratch.get_mut(..len).unwrap_or_default();
        self.read_into(out, bus)?;
        Ok(out)
    }
}

/// The error of a chunk copy made inside [`Bus::with_sbuf`] or [`Bus::with_sbuf_mut`], kept
/// aside so that their closures return nothing.
///
/// A `Result<(), Fault>` is larger than two registers, so it goes through memory: a closure
/// returning one writes its small `Ok` tag just after the copy, and the caller then moves the
/// whole `Result` with wide loads. A wide load over a narrow store still in the store buffer
/// cannot be forwarded from it and waits until the store commits, behind every store of the
/// copy (hundreds of bytes, often to lines not yet in the cache). simdev's trace showed it:
/// memory-to-SBUF runs took about a fifth longer than without it.
#[derive(Default)]
struct CopyError(Option<MemError>);

impl CopyError {
    /// Keeps the error of `copied`, if any.
    #[inline]
    fn keep(&mut self, copied: Result<(), MemError>) {
        if let Err(e) = copied {
            self.0 = Some(e);
        }
    }

    /// The kept error as a [`Fault::Copy`].
    #[inline]
    fn into_result(self) -> Result<(), Fault> {
        self.0.map_or(Ok(()), |e| Err(Fault::Copy(e)))
    }
}

/// What a checked pair will do.
enum Action<'c> {
    Copy {
        src: Source<'c>,
        dst: &'c Chunk,
        dst_pa: u64,
    },
    Dmem {
        nc: u32,
        offset: u64,
        src: Source<'c>,
    },
    Sbuf {
        nc: u32,
        partition: u32,
        offset: u64,
        src: Source<'c>,
    },
    Register {
        reg: Register,
        value: u32,
    },
}

/// The DMA queues of one NC.
#[derive(Debug)]
pub struct DmaQueues {
    map: AddressMap,
    nc: u32,
    engines: u32,
    queues_per_engine: u32,
    slots: Vec<Option<DmaQueue>>,
    generation: u64,
    /// The chunks recent descriptors of this NC's queues resolved to.
    cache: ChunkCache,
    /// The staging buffer of pairs that copy neither chunk to chunk nor between a chunk and
    /// SBUF (into DMEM, SBUF to SBUF, out of SBUF into DMEM): grown to the longest such pair
    /// once, then reused.
    scratch: Vec<u8>,
    /// What the queues did since the NC was made (never reset: the NC's counters).
    counts: DmaCounts,
}

impl DmaQueues {
    /// No queue initialised, for NC `nc` of `map`.
    pub fn new(map: AddressMap, nc: u32) -> Self {
        let engines = map.arch.dma_engines_per_nc();
        let queues_per_engine = map.arch.dma_queues_per_engine();
        let count = usize::try_from(engines * queues_per_engine).unwrap_or(0);
        Self {
            map,
            nc,
            engines,
            queues_per_engine,
            slots: std::iter::repeat_with(|| None).take(count).collect(),
            generation: 0,
            cache: ChunkCache::default(),
            scratch: Vec::new(),
            counts: DmaCounts::default(),
        }
    }

    fn index(&self, engine: u32, queue: u32) -> Result<usize, QueueError> {
        if engine >= self.engines || queue >= self.queues_per_engine {
            return Err(QueueError::OutOfRange {
                engine,
                queue,
                engines: self.engines,
                queues: self.queues_per_engine,
            });
        }
        usize::try_from(engine * self.queues_per_engine + queue).map_err(|_| {
            QueueError::OutOfRange {
                engine,
                queue,
                engines: self.engines,
                queues: self.queues_per_engine,
            }
        })
    }

    const fn id(&self, engine: u32, queue: u32) -> DmaQueueId {
        DmaQueueId {
            nc: self.nc,
            engine,
            queue,
        }
    }

    /// Checks an engine/queue pair against the arch's counts.
    ///
    /// # Errors
    /// [`QueueError::OutOfRange`].
    pub fn check_id(&self, engine: u32, queue: u32) -> Result<(), QueueError> {
        self.index(engine, queue).map(drop)
    }

    /// DMA_QUEUE_INIT: binds the rings and (re)starts the queue at head 0, ring id 1, nothing
    /// pending, running. Replaces any previous state of the queue.
    ///
    /// # Errors
    /// [`QueueError::OutOfRange`], [`QueueError::RingSize`] or [`QueueError::RingTooSmall`].
    pub fn init(
        &mut self,
        engine: u32,
        queue: u32,
        tx: (Arc<Chunk>, u32),
        rx: (Arc<Chunk>, u32),
    ) -> Result<(), QueueError> {
        let index = self.index(engine, queue)?;
        let tx = Ring::new(Direction::Tx, tx.0, tx.1)?;
        let rx = Ring::new(Direction::Rx, rx.0, rx.1)?;
        self.generation += 1;
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Some(DmaQueue {
                tx,
                rx,
                status: QueueStatus::Running,
                generation: self.generation,
                in_flight: false,
            });
        }
        Ok(())
    }

    /// DMA_QUEUE_RELEASE: forgets the queue (a no-op when it is not initialised, as in the
    /// driver).
    ///
    /// # Errors
    /// [`QueueError::OutOfRange`].
    pub fn release(&mut self, engine: u32, queue: u32) -> Result<(), QueueError> {
        let index = self.index(engine, queue)?;
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = None;
        }
        Ok(())
    }

    /// Forgets every queue (NC reset, release, reclaim).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|slot| *slot = None);
        self.cache = ChunkCache::default();
    }

    /// Queues initialised (stopped ones included, until released or reset).
    pub fn initialised(&self) -> usize {
        self.slots.iter().filter(|slot| slot.is_some()).count()
    }

    /// The status of a queue, `None` when it is not initialised.
    pub fn status(&self, engine: u32, queue: u32) -> Option<&QueueStatus> {
        let index = self.index(engine, queue).ok()?;
        self.slots.get(index)?.as_ref().map(|q| &q.status)
    }

    /// Head indices `(tx, rx)` of a queue, `None` when it is not initialised.
    pub fn heads(&self, engine: u32, queue: u32) -> Option<(u32, u32)> {
        let index = self.index(engine, queue).ok()?;
        let q = self.slots.get(index)?.as_ref()?;
        Some((q.tx.head, q.rx.head))
    }

    fn running(&mut self, engine: u32, queue: u32) -> Result<&mut DmaQueue, QueueError> {
        let index = self.index(engine, queue)?;
        let q = self
            .slots
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or(QueueError::NotInitialized { engine, queue })?;
        match &q.status {
            QueueStatus::Running => Ok(q),
            QueueStatus::Stopped(reason) => Err(QueueError::Stopped {
                engine,
                queue,
                reason: reason.clone(),
            }),
        }
    }

    /// DMA_QUEUE_COPY_START: posts `rx_count` RX then `tx_count` TX descriptors (the driver's
    /// doorbell order). Nothing is posted unless both fit.
    ///
    /// # Errors
    /// [`QueueError::OutOfRange`], [`QueueError::NotInitialized`], [`QueueError::Stopped`],
    /// [`QueueError::ZeroRx`] or [`QueueError::Overrun`] (a count above the ring size included).
    pub fn post(
        &mut self,
        engine: u32,
        queue: u32,
        tx_count: u32,
        rx_count: u32,
    ) -> Result<(), QueueError> {
        let q = self.running(engine, queue)?;
        if rx_count == 0 {
            return Err(QueueError::ZeroRx);
        }
        q.rx.check_post(Direction::Rx, rx_count)?;
        q.tx.check_post(Direction::Tx, tx_count)?;
        q.rx.pending += rx_count;
        q.tx.pending += tx_count;
        Ok(())
    }

    /// A DMA write of `value` into a queue's TX or RX DRTP_INC register: posts `value`
    /// descriptors on that ring.
    ///
    /// # Errors
    /// [`QueueError::OutOfRange`], [`QueueError::NotInitialized`], [`QueueError::Stopped`],
    /// [`QueueError::ZeroIncrement`] or [`QueueError::Overrun`].
    pub fn tail_increment(
        &mut self,
        engine: u32,
        queue: u32,
        dir: Direction,
        value: u32,
    ) -> Result<(), QueueError> {
        let q = self.running(engine, queue)?;
        if value == 0 {
            return Err(QueueError::ZeroIncrement);
        }
        let ring = match dir {
            Direction::Tx => &mut q.tx,
            Direction::Rx => &mut q.rx,
        };
        ring.check_post(dir, value)?;
        ring.pending += value;
        Ok(())
    }

    /// Processes pairs of queue (`engine`, `queue`) while both rings have pending descriptors.
    /// Counts each completed pair ([`DmaQueues::counts`]), charges `budget`, and reports the
    /// first bad pair as an [`Outcome::Aborted`] (the queue is then stopped).
    pub fn process(
        &mut self,
        engine: u32,
        queue: u32,
        bus: &mut impl Bus,
        budget: &mut Budget,
    ) -> Outcome {
        let Ok(index) = self.index(engine, queue) else {
            return Outcome::Idle;
        };
        loop {
            let Some(q) = self.slots.get(index).and_then(Option::as_ref) else {
                return Outcome::Idle;
            };
            if q.status != QueueStatus::Running
                || q.in_flight
                || q.tx.pending == 0
                || q.rx.pending == 0
            {
                return Outcome::Idle;
            }
            let generation = q.generation;
            let checked = match budget.spent() {
                Some(fault) => Err(fault),
                None => check_pair_at(&self.map, &mut self.cache, q, 0, bus),
            };
            let (action, len) = match checked {
                Ok(checked) => checked,
                Err(fault) => {
                    return Outcome::Aborted(self.stop(index, engine, queue, &fault));
                }
            };
            let register = matches!(action, Action::Register { .. });
            let done = match action {
                Action::Copy {
                    src: Source::Memory { chunk, pa },
                    dst,
                    dst_pa,
                } => copy(chunk.memory(), pa, dst.memory(), dst_pa, len_usize(len))
                    .map_err(Fault::Copy),
                // Out of SBUF: straight from the partition into the chunk.
                Action::Copy {
                    src:
                        Source::Sbuf {
                            nc,
                            partition,
                            offset,
                        },
                    dst,
                    dst_pa,
                } => {
                    let mut failed = CopyError::default();
                    bus.with_sbuf((nc, partition, offset), len_usize(len), |data| {
                        failed.keep(dst.memory().write(dst_pa, data));
                    })
                    .and_then(|()| failed.into_result())
                }
                Action::Dmem { nc, offset, src } => src
                    .read(len, bus, &mut self.scratch)
                    .and_then(|data| bus.write_dmem(nc, offset, data)),
                // Into SBUF from memory: straight from the chunk into the partition (the
                // chunk's read checks its range before it copies anything).
                Action::Sbuf {
                    nc,
                    partition,
                    offset,
                    src: Source::Memory { chunk, pa },
                } => {
                    let mut failed = CopyError::default();
                    bus.with_sbuf_mut((nc, partition, offset), len_usize(len), |slot| {
                        failed.keep(chunk.memory().read(pa, slot));
                    })
                    .and_then(|()| failed.into_result())
                }
                // SBUF to SBUF (perhaps the same partition, overlapping): through the scratch.
                Action::Sbuf {
                    nc,
                    partition,
                    offset,
                    src,
                } => src.read(len, bus, &mut self.scratch).and_then(|data| {
                    bus.with_sbuf_mut((nc, partition, offset), data.len(), |slot| {
                        slot.copy_from_slice(data);
                    })
                }),
                Action::Register { reg, value } => {
                    match self.write_register(engine, queue, reg, value, bus) {
                        Ok(RegisterWrite::Done) => Ok(()),
                        Ok(RegisterWrite::Deferred) => {
                            if let Some(q) = self.slots.get_mut(index).and_then(Option::as_mut) {
                                q.in_flight = true;
                            }
                            budget.charge(len);
                            return Outcome::Deferred(Deferred {
                                queue: self.id(engine, queue),
                                reg,
                                value,
                                generation,
                            });
                        }
                        Err(fault) => Err(fault),
                    }
                }
            };
            if let Err(fault) = done {
                return Outcome::Aborted(self.stop(index, engine, queue, &fault));
            }
            budget.charge(len);
            self.complete(index, len, register);
        }
    }

    /// Descriptors pending `(tx, rx)` on a queue and whether a deferred register write of its
    /// head pair is in flight; `None` when it is not initialised.
    pub fn pending(&self, engine: u32, queue: u32) -> Option<(u32, u32, bool)> {
        let index = self.index(engine, queue).ok()?;
        let q = self.slots.get(index)?.as_ref()?;
        Some((q.tx.pending, q.rx.pending, q.in_flight))
    }

    /// Ring sizes `(tx, rx)` in descriptors of a queue; `None` when it is not initialised.
    pub fn ring_sizes(&self, engine: u32, queue: u32) -> Option<(u32, u32)> {
        let index = self.index(engine, queue).ok()?;
        let q = self.slots.get(index)?.as_ref()?;
        Some((q.tx.size, q.rx.size))
    }

    /// Reads and checks, without executing or consuming it, the pair `ahead` slots past the
    /// heads of a running queue, whether or not it was posted: the descriptors must carry the
    /// ring id of the pass their slots are on and pass every rule processing applies (lengths,
    /// source in the client's memory, destination in its memory, a DMEM it owns or a register).
    /// This is how the sequencer fetches the exec queue's staged batch.
    ///
    /// # Errors
    /// [`PeekError::Queue`] when the queue is not initialised or stopped, [`PeekError::Fault`]
    /// naming the broken rule.
    pub fn peek(
        &mut self,
        engine: u32,
        queue: u32,
        ahead: u32,
        bus: &impl Bus,
    ) -> Result<PeekedPair, PeekError> {
        let index = self.index(engine, queue)?;
        let q = self
            .slots
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(QueueError::NotInitialized { engine, queue })?;
        if let QueueStatus::Stopped(reason) = &q.status {
            return Err(QueueError::Stopped {
                engine,
                queue,
                reason: reason.clone(),
            }
            .into());
        }
        let (action, len) = check_pair_at(&self.map, &mut self.cache, q, ahead, bus)?;
        let src_pa = match &action {
            Action::Copy { src, .. } | Action::Dmem { src, .. } | Action::Sbuf { src, .. } => {
                match src {
                    Source::Memory { pa, .. } => Some(*pa),
                    Source::Sbuf { .. } => None,
                }
            }
            Action::Register { .. } => None,
        };
        let effect = match action {
            Action::Copy { dst_pa, .. } => PairEffect::Copy { dst: dst_pa },
            Action::Sbuf {
                nc,
                partition,
                offset,
                ..
            } => PairEffect::Sbuf {
                nc,
                partition,
                offset,
            },
            Action::Dmem { nc, offset, src } => {
                let mut data = DmemBytes::zeroed(len_usize(len));
                src.read_into(data.as_mut_slice(), bus)?;
                PairEffect::Dmem { nc, offset, data }
            }
            Action::Register { reg, value } => PairEffect::Register { reg, value },
        };
        Ok(PeekedPair {
            len,
            effect,
            src_pa,
        })
    }

    /// Consumes the pairs at the heads of a queue that the caller executed itself (the
    /// sequencer's fetch of pairs nobody posted), each given as its length and whether it
    /// wrote a register: advances both heads past them without touching the pending counts,
    /// and counts them like processed pairs.
    pub fn consume_heads(
        &mut self,
        engine: u32,
        queue: u32,
        pairs: impl IntoIterator<Item = (u32, bool)>,
    ) {
        let Ok(index) = self.index(engine, queue) else {
            return;
        };
        let Some(q) = self.slots.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        for (len, register) in pairs {
            q.tx.step_head();
            q.rx.step_head();
            self.counts.pair(len, register);
        }
    }

    /// Stops a queue on `fault` found outside [`DmaQueues::process`] (the sequencer's fetch):
    /// a DMA abort, counted, with the usual reason text. `None` when the queue is not
    /// initialised.
    pub fn abort(&mut self, engine: u32, queue: u32, fault: &Fault) -> Option<Abort> {
        let index = self.index(engine, queue).ok()?;
        self.slots.get(index)?.as_ref()?;
        Some(self.stop(index, engine, queue, fault))
    }

    /// Stops a running queue with `reason` without a DMA abort (the sequencer refusing a
    /// malformed batch); a new DMA_QUEUE_INIT restarts it. Whether it was running (and is
    /// now stopped).
    pub fn stop_with(&mut self, engine: u32, queue: u32, reason: String) -> bool {
        let Ok(index) = self.index(engine, queue) else {
            return false;
        };
        match self.slots.get_mut(index).and_then(Option::as_mut) {
            Some(q) if q.status == QueueStatus::Running => {
                q.status = QueueStatus::Stopped(reason);
                q.in_flight = false;
                true
            }
            _ => false,
        }
    }

    /// Stops a running queue with `reason` as a DMA abort does (an injected DmaAbort fault),
    /// counted in [`DmaCounts::aborts`]; a queue not running is left as it is.
    pub fn stop_aborted(&mut self, engine: u32, queue: u32, reason: String) {
        if self.stop_with(engine, queue, reason) {
            self.counts.aborts += 1;
        }
    }

    /// What the queues did since the NC was made.
    pub fn counts(&self) -> DmaCounts {
        self.counts
    }

    /// Finishes the pair whose register write was [`Outcome::Deferred`]: on success the pair
    /// completes and the queue may be processed further; on failure the queue stops. Does
    /// nothing when the queue was re-initialised, released or reset meanwhile.
    pub fn finish_deferred(
        &mut self,
        deferred: &Deferred,
        result: Result<(), Fault>,
    ) -> Option<Abort> {
        let DmaQueueId { engine, queue, .. } = deferred.queue;
        let index = self.index(engine, queue).ok()?;
        let q = self.slots.get_mut(index)?.as_mut()?;
        if q.generation != deferred.generation || !q.in_flight {
            return None;
        }
        q.in_flight = false;
        match result {
            Ok(()) => {
                self.complete(index, 4, true);
                None
            }
            Err(fault) => Some(self.stop(index, engine, queue, &fault)),
        }
    }

    /// Applies a register write of the pair at the head of (`engine`, `queue`).
    fn write_register(
        &mut self,
        engine: u32,
        queue: u32,
        reg: Register,
        value: u32,
        bus: &mut impl Bus,
    ) -> Result<RegisterWrite, Fault> {
        let (target, dir) = match reg {
            Register::TxTailIncrement {
                nc,
                engine: e,
                queue: q,
            } if nc == self.nc => ((e, q), Direction::Tx),
            Register::RxTailIncrement {
                nc,
                engine: e,
                queue: q,
            } if nc == self.nc => ((e, q), Direction::Rx),
            _ => return bus.write_register(reg, value),
        };
        self.tail_increment(target.0, target.1, dir, value)
            .map_err(|source| Fault::TailIncrement { reg, value, source })?;
        if target != (engine, queue) {
            bus.schedule(self.id(target.0, target.1));
        }
        Ok(RegisterWrite::Done)
    }

    /// Advances both heads of the queue at `index` past a completed pair of `len` bytes.
    fn complete(&mut self, index: usize, len: u32, register: bool) {
        if let Some(q) = self.slots.get_mut(index).and_then(Option::as_mut) {
            q.tx.advance();
            q.rx.advance();
        }
        self.counts.pair(len, register);
    }

    /// Stops the queue at `index` on `fault`.
    fn stop(&mut self, index: usize, engine: u32, queue: u32, fault: &Fault) -> Abort {
        let (tx_index, rx_index) = self
            .slots
            .get(index)
            .and_then(Option::as_ref)
            .map_or((0, 0), |q| (q.tx.head, q.rx.head));
        let reason = format!(
            "DMA abort on NC {} engine {engine} queue {queue} at TX descriptor {tx_index}, RX descriptor {rx_index}: {}",
            self.nc,
            error_chain(fault)
        );
        if let Some(q) = self.slots.get_mut(index).and_then(Option::as_mut) {
            q.status = QueueStatus::Stopped(reason.clone());
            q.in_flight = false;
        }
        self.counts.aborts += 1;
        Abort {
            queue: self.id(engine, queue),
            oob: fault.is_oob(),
            reason,
        }
    }
}

/// Reads and checks the pair `ahead` slots past the heads of `q` (with the ring ids of the
/// pass those slots are on); resolves both sides through `cache`, which lends their chunks
/// (no reference count is touched per pair).
#[inline(always)]
fn check_pair_at<'c>(
    map: &AddressMap,
    cache: &'c mut ChunkCache,
    q: &DmaQueue,
    ahead: u32,
    bus: &impl Bus,
) -> Result<(Action<'c>, u32), Fault> {
    let (tx_index, tx_ring_id) = q.tx.slot(ahead);
    let (rx_index, rx_ring_id) = q.rx.slot(ahead);
    let tx = q.tx.read(tx_index)?.decode_tx(tx_ring_id)?;
    let rx = q.rx.read(rx_index)?.decode_rx(rx_ring_id)?;
    check_pair(&tx, &rx)?;
    let len = tx.len;
    // Both sides are looked up at one generation: the source's slot then stays cached through
    // the destination's lookup (`ChunkCache`'s invariant), and both are lent together.
    let generation = bus.memory_generation();
    let src = if let Some((nc, partition, offset)) = map.decode_sbuf(tx.src, u64::from(len)) {
        if !bus.owns_nc(nc) {
            return Err(Fault::ForeignSbuf {
                pa: tx.src,
                len,
                nc,
            });
        }
        Place::Sbuf(Source::Sbuf {
            nc,
            partition,
            offset,
        })
    } else if map.register_range().contains(&tx.src) {
        return Err(Fault::RegisterSource { pa: tx.src });
    } else {
        // let-else, not `ok_or`: the fault (a `Drop` type) is built only on the error path.
        let Some(slot) = find(cache, bus, generation, tx.src, len_usize(len)) else {
            return Err(Fault::SourceOutOfBounds { pa: tx.src, len });
        };
        Place::Memory { slot, pa: tx.src }
    };
    if let Some((nc, offset)) = map.decode_dmem(rx.dst, u64::from(len)) {
        let src = src.lend(cache, len)?;
        return Ok((Action::Dmem { nc, offset, src }, len));
    }
    if let Some((nc, partition, offset)) = map.decode_sbuf(rx.dst, u64::from(len)) {
        if !bus.owns_nc(nc) {
            return Err(Fault::ForeignSbuf {
                pa: rx.dst,
                len,
                nc,
            });
        }
        let src = src.lend(cache, len)?;
        return Ok((
            Action::Sbuf {
                nc,
                partition,
                offset,
                src,
            },
            len,
        ));
    }
    if map.register_range().contains(&rx.dst) {
        let Some(reg) = map.decode_register(rx.dst) else {
            return Err(Fault::UnknownRegister { pa: rx.dst });
        };
        if len != 4 {
            return Err(Fault::RegisterLength { pa: rx.dst, len });
        }
        let value = src.lend(cache, len)?.read_word(bus)?;
        return Ok((Action::Register { reg, value }, len));
    }
    let Some(dst) = find(cache, bus, generation, rx.dst, len_usize(len)) else {
        return Err(Fault::DestinationOutOfBounds { pa: rx.dst, len });
    };
    let cache: &'c ChunkCache = cache;
    let Some(dst) = cache.lend(dst) else {
        return Err(Fault::DestinationOutOfBounds { pa: rx.dst, len });
    };
    Ok((
        Action::Copy {
            src: src.lend(cache, len)?,
            dst,
            dst_pa: rx.dst,
        },
        len,
    ))
}

/// A checked pair's source before its chunk is lent: SBUF, or the cache slot of a chunk.
enum Place {
    Sbuf(Source<'static>),
    Memory { slot: CacheSlot, pa: u64 },
}

impl Place {
    /// The source, its chunk lent by `cache` (a pair of `len` bytes).
    ///
    /// # Errors
    /// [`Fault::SourceOutOfBounds`] should the slot no longer hold a chunk, which
    /// [`check_pair_at`]'s two lookups at one generation rule out.
    fn lend(self, cache: &ChunkCache, len: u32) -> Result<Source<'_>, Fault> {
        match self {
            Self::Sbuf(sbuf) => Ok(sbuf),
            Self::Memory { slot, pa } => match cache.lend(slot) {
                Some(chunk) => Ok(Source::Memory { chunk, pa }),
                None => Err(Fault::SourceOutOfBounds { pa, len }),
            },
        }
    }
}

/// The cache slot of the client's chunk holding `pa..pa+len` at `generation`, from `cache`
/// or else [`Bus::resolve`].
#[inline]
fn find(
    cache: &mut ChunkCache,
    bus: &impl Bus,
    generation: u64,
    pa: u64,
    len: usize,
) -> Option<CacheSlot> {
    cache.find(generation, bus.client(), pa, len, || bus.resolve(pa, len))
}

/// A descriptor length (at most 65536) as a `usize`.
fn len_usize(len: u32) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

/// `err` and its sources, joined by ": ", skipping a source whose text the message already
/// contains.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `slot_at` by division alone (what it computed before its fast path).
    fn slot_by_division(head: u32, size: u32, ring_id: RingId, ahead: u32) -> (u32, RingId) {
        let pos = u64::from(head) + u64::from(ahead);
        let passes = pos / u64::from(size);
        let mut id = ring_id;
        for _ in 0..passes % 4 {
            id = id.next();
        }
        (u32::try_from(pos % u64::from(size)).unwrap(), id)
    }

    #[test]
    fn a_copy_error_kept_aside_is_the_pairs_copy_fault() {
        let mut none = CopyError::default();
        none.keep(Ok(()));
        assert!(none.into_result().is_ok());
        let mut failed = CopyError::default();
        failed.keep(Err(MemError::ReadOnly { chunk_pa: 0x1000 }));
        failed.keep(Ok(()));
        assert!(matches!(
            failed.into_result(),
            Err(Fault::Copy(MemError::ReadOnly { chunk_pa: 0x1000 }))
        ));
    }

    #[test]
    fn slots_on_the_heads_pass_and_past_it_match_the_division() {
        for size in [32, 48, 4096] {
            for ring_id in (0..4).filter_map(RingId::new) {
                for head in (0..size).step_by(size as usize / 16).chain([size - 1]) {
                    for ahead in (0..3 * size + 7).chain([u32::MAX - size, u32::MAX]) {
                        assert_eq!(
                            slot_at(head, size, ring_id, ahead),
                            slot_by_division(head, size, ring_id, ahead),
                            "size {size} head {head} ahead {ahead} ring id {ring_id:?}"
                        );
                    }
                }
            }
        }
    }
}
