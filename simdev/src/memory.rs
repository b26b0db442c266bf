//! The device's memory: chunks backed by memfds, placed in the PA space by a first-fit
//! allocator per region, and resolved by PA for DMA.
//!
//! As in the driver (`reference/driver-abi.md` §1.5–§1.6), every allocation is its own chunk:
//! sizes are rounded up to 4 KiB, a chunk has a small non-zero handle, and its owner maps
//! exactly the whole chunk. Here a chunk is one memfd that simdev maps read-write as a
//! [`SharedChunk`] at the chunk's PA and hands (dup'ed) to its owner, so a client can only ever
//! touch memory it allocated. Regions: one per NC for HBM ([`AddressMap::hbm_range`]) and one
//! for host-visible memory ([`AddressMap::host_range`]); PA space costs nothing until it is
//! allocated, and an allocated chunk costs nothing until it is written: its memfd is sized
//! with `ftruncate` (sparse) and mapped without populating, and nothing zero-fills or touches
//! it at allocation, so the silicon's 16 GiB per NC is simdev's default.
//!
//! A chunk's size is fixed for its life, as a dma-buf's is: its memfd is sealed against
//! shrinking and growing (and against further seals) once sized. The owner holds the same file
//! (its mapping, `nrt_get_dmabuf_fd`), and a file cut short under simdev's mapping would turn
//! simdev's next DMA into the chunk into a SIGBUS — one client stopping the device for all.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use shared::address_map::{AddressMap, CHUNK_GRANULE};
use shared::memory::{MemError, SharedChunk};
use shared::protocol::MemLocation;
use thiserror::Error;

use crate::client::ClientId;

/// A region of the PA space with its own allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// HBM of one NC.
    Hbm(u32),
    /// Host-visible memory.
    Host,
}

impl From<MemLocation> for Region {
    fn from(location: MemLocation) -> Self {
        match location {
            MemLocation::Hbm { nc } => Self::Hbm(nc),
            MemLocation::Host => Self::Host,
        }
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Hbm(nc) => write!(f, "HBM of NC {nc}"),
            Self::Host => f.write_str("host-visible memory"),
        }
    }
}

/// Free PA ranges of one region, first-fit, merged on free.
///
/// # Invariants
/// `free` maps each free range's start to its end (exclusive); ranges are non-empty, disjoint
/// and never adjacent (adjacent ranges are merged).
#[derive(Debug)]
pub struct FreeList {
    free: BTreeMap<u64, u64>,
}

impl FreeList {
    /// All of `start..end` free.
    pub fn new(start: u64, end: u64) -> Self {
        let mut free = BTreeMap::new();
        if start < end {
            free.insert(start, end);
        }
        Self { free }
    }

    /// Takes the first range of `size` bytes whose start is a multiple of `align` (a power of
    /// two); returns its start, or `None` when no free range fits.
    pub fn allocate(&mut self, size: u64, align: u64) -> Option<u64> {
        let (start, end, at) = self.free.iter().find_map(|(&start, &end)| {
            let at = start.checked_next_multiple_of(align)?;
            let stop = at.checked_add(size)?;
            (stop <= end).then_some((start, end, at))
        })?;
        self.free.remove(&start);
        if start < at {
            self.free.insert(start, at);
        }
        let stop = at + size;
        if stop < end {
            self.free.insert(stop, end);
        }
        Some(at)
    }

    /// Returns `start..start+size` (previously allocated) to the free ranges, merging it with
    /// free neighbours.
    pub fn release(&mut self, start: u64, size: u64) {
        let mut lo = start;
        let mut hi = start.saturating_add(size);
        if let Some((&prev_start, &prev_end)) = self.free.range(..start).next_back()
            && prev_end == start
        {
            self.free.remove(&prev_start);
            lo = prev_start;
        }
        if let Some(next_end) = self.free.remove(&hi) {
            hi = next_end;
        }
        self.free.insert(lo, hi);
    }

    /// The free ranges in address order, as `(start, end)`.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(&start, &end)| (start, end))
    }
}

/// One allocation: a memfd mapped by simdev at its PA.
#[derive(Debug)]
pub struct Chunk {
    handle: u64,
    owner: ClientId,
    region: Region,
    memfd: OwnedFd,
    memory: SharedChunk,
}

impl Chunk {
    /// The chunk's handle (non-zero, unique for the simdev run).
    pub const fn handle(&self) -> u64 {
        self.handle
    }

    /// The client that allocated it.
    pub const fn owner(&self) -> ClientId {
        self.owner
    }

    /// Where it lives.
    pub const fn region(&self) -> Region {
        self.region
    }

    /// First device PA.
    pub const fn pa(&self) -> u64 {
        self.memory.pa()
    }

    /// Size in bytes (a multiple of 4 KiB).
    pub fn size(&self) -> u64 {
        // A usize always fits in a u64 on the 64-bit targets simdev supports.
        u64::try_from(self.memory.len()).unwrap_or(u64::MAX)
    }

    /// simdev's read-write mapping, addressed by PA.
    pub const fn memory(&self) -> &SharedChunk {
        &self.memory
    }

    /// The backing memfd (to dup for the owner's MemMap).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }
}

/// An allocation request simdev refused.
#[derive(Debug, Error)]
pub enum AllocError {
    /// A size of 0 bytes, or one that overflows when rounded up to 4 KiB.
    #[error("size {size} bytes is not allocatable (must be 1 to 2^64-4096 bytes)")]
    BadSize {
        /// The size requested.
        size: u64,
    },
    /// An alignment that is not a power of two.
    #[error("alignment {align} is not a power of two (0 means the 4 KiB default)")]
    BadAlign {
        /// The alignment requested.
        align: u64,
    },
    /// An HBM region of an NC the device does not have.
    #[error("NC {nc} does not exist (the device has {nc_count} NCs)")]
    NoSuchNc {
        /// The NC asked for.
        nc: u32,
        /// NCs on the device.
        nc_count: u32,
    },
    /// No free range of the region fits.
    #[error("no free range of {size} bytes aligned to {align} in {region}")]
    OutOfMemory {
        /// Bytes requested after rounding.
        size: u64,
        /// Alignment after defaulting.
        align: u64,
        /// The region.
        region: Region,
    },
    /// `memfd_create` failed.
    #[error("creating the memfd of a {size}-byte chunk")]
    CreateMemfd {
        /// Chunk size.
        size: u64,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// `ftruncate` of the memfd failed.
    #[error("sizing the memfd of a {size}-byte chunk")]
    SizeMemfd {
        /// Chunk size.
        size: u64,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// Sealing the memfd's size failed.
    #[error("sealing the size of a {size}-byte chunk's memfd")]
    SealMemfd {
        /// Chunk size.
        size: u64,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// Mapping the memfd failed.
    #[error("mapping a {size}-byte chunk")]
    MapChunk {
        /// Chunk size.
        size: u64,
        /// What the accessor reported.
        #[source]
        source: MemError,
    },
}

/// A handle the client may not use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("handle {handle} is not a chunk of this client")]
pub struct BadHandle {
    /// The handle given.
    pub handle: u64,
}

/// An access that hits no chunk of the client entirely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("{pa:#x}+{len} is not inside one chunk of this client")]
pub struct Unresolved {
    /// First PA of the access.
    pub pa: u64,
    /// Bytes accessed.
    pub len: usize,
}

/// The generation of an [`AddressSpace`]: a counter that every allocation and every free
/// moves (under the address space's write lock, before the change is visible), readable
/// without the lock. A resolution made while the generation was `g` is still exactly what
/// [`AddressSpace::resolve`] would answer as long as the generation is still `g`: this is
/// how DMA caches the chunks its descriptors point into ([`crate::dma`]).
#[derive(Debug, Default)]
pub struct Generation(AtomicU64);

impl Generation {
    /// The current generation.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// Sets of a [`ChunkCache`]: a lookup of `pa` that is neither of the last two tries the set
/// of `pa`'s 4 KiB page (chunks are 4 KiB-aligned, so chunks allocated one after another
/// fall in different sets).
const CHUNK_CACHE_SETS: usize = 64;
/// Chunks each set holds.
const CHUNK_CACHE_WAYS: usize = 2;
/// Chunks a [`ChunkCache`] holds: the chunks of 16 executions in flight with an input and an
/// output tensor each, and their request slots, stay cached together.
pub const CHUNK_CACHE_SLOTS: usize = CHUNK_CACHE_SETS * CHUNK_CACHE_WAYS;
const _: () = assert!(CHUNK_CACHE_WAYS >= 2 && CHUNK_CACHE_SETS.is_power_of_two());

/// The chunks recent accesses of one user (an NC's DMA queues, an engine's instruction
/// fetch) resolved to, so that steady-state resolution is O(1) instead of a B-tree search of
/// the [`AddressSpace`].
///
/// A lookup tries, in order, the slot of the last lookup (a run of pairs reads or writes one
/// tensor), the slot of the one before it (a run copying between two chunks alternates), and
/// the ways of `pa`'s page's set (executions cycling over many tensor sets); a miss searches
/// and fills a way of that set. Each step is a constant number of comparisons.
///
/// # Invariants
/// Every cached chunk was live (resolvable) in the address space when the generation was
/// `generation` or later. A lookup answers from the cache only while the address space is
/// still at `generation` (no allocation or free since: the chunk is still live and nothing
/// else was placed in its range), for the chunk's own client, and when the chunk holds the
/// whole range: exactly what [`AddressSpace::resolve`] would answer then. Any other lookup
/// searches; a generation change empties the cache. A miss never fills the slot of the lookup
/// before it (`last`), so the answers of two lookups in a row at one generation stay cached
/// together ([`ChunkCache::find`], [`ChunkCache::lend`]). `last` and `prev` are slot indexes
/// (below [`CHUNK_CACHE_SLOTS`]).
#[derive(Debug)]
pub struct ChunkCache {
    generation: u64,
    chunks: [Option<Arc<Chunk>>; CHUNK_CACHE_SLOTS],
    /// The slot of the last hit or fill, tried first.
    last: usize,
    /// The slot `last` was before it, tried second.
    prev: usize,
}

impl Default for ChunkCache {
    fn default() -> Self {
        Self::empty(0)
    }
}

impl ChunkCache {
    /// A cache holding nothing, labelled `generation`.
    fn empty(generation: u64) -> Self {
        Self {
            generation,
            chunks: std::array::from_fn(|_| None),
            last: 0,
            prev: 0,
        }
    }

    /// The chunk of `owner` that holds all of `pa..pa+len`: from the cache while the address
    /// space is at `generation` (read from its [`Generation`] *before* `search` runs), else
    /// what `search` (an [`AddressSpace::resolve`]) finds, which is then cached.
    pub fn resolve(
        &mut self,
        generation: u64,
        owner: ClientId,
        pa: u64,
        len: usize,
        search: impl FnOnce() -> Option<Arc<Chunk>>,
    ) -> Option<Arc<Chunk>> {
        self.resolve_ref(generation, owner, pa, len, search)
            .map(Arc::clone)
    }

    /// [`ChunkCache::resolve`], lending the cached chunk instead of cloning its `Arc` (a hit
    /// then touches no reference count: an instruction fetch only reads through it).
    #[inline]
    pub fn resolve_ref(
        &mut self,
        generation: u64,
        owner: ClientId,
        pa: u64,
        len: usize,
        search: impl FnOnce() -> Option<Arc<Chunk>>,
    ) -> Option<&Arc<Chunk>> {
        let at = self.find(generation, owner, pa, len, search)?;
        self.lend(at)
    }

    /// The chunk in `slot`: the answer of the [`ChunkCache::find`] that named it while at most
    /// one more lookup at the same generation has been made since (a DMA pair's source and
    /// destination are lent together). `None` only for a slot that lookups have since reused.
    #[inline]
    pub fn lend(&self, slot: CacheSlot) -> Option<&Arc<Chunk>> {
        self.chunks.get(slot.0)?.as_ref()
    }

    /// [`ChunkCache::resolve`] as the slot holding its answer (filled by `search` on a miss),
    /// for [`ChunkCache::lend`].
    #[inline]
    pub fn find(
        &mut self,
        generation: u64,
        owner: ClientId,
        pa: u64,
        len: usize,
        search: impl FnOnce() -> Option<Arc<Chunk>>,
    ) -> Option<CacheSlot> {
        // The last slot's hit, inlined into the caller (a DMA pair's lookup nearly always is
        // one: its run of pairs reads or writes one tensor).
        if generation == self.generation && self.holds(self.last, owner, pa, len) {
            return Some(CacheSlot(self.last));
        }
        self.find_or_fill(generation, owner, pa, len, search)
    }

    /// Whether `slot` holds a chunk of `owner` containing all of `pa..pa+len`.
    #[inline]
    fn holds(&self, slot: usize, owner: ClientId, pa: u64, len: usize) -> bool {
        matches!(
            self.chunks.get(slot),
            Some(Some(chunk)) if chunk.owner == owner && chunk.memory.contains(pa, len)
        )
    }

    /// Makes `slot` the last lookup's.
    fn touch(&mut self, slot: usize) -> Option<CacheSlot> {
        if slot != self.last {
            self.prev = self.last;
            self.last = slot;
        }
        Some(CacheSlot(slot))
    }

    /// [`ChunkCache::find`] past its last slot (which `find` tried): the slot before it, then
    /// the ways of `pa`'s set, else `search`.
    fn find_or_fill(
        &mut self,
        generation: u64,
        owner: ClientId,
        pa: u64,
        len: usize,
        search: impl FnOnce() -> Option<Arc<Chunk>>,
    ) -> Option<CacheSlot> {
        let set = set_of(pa) * CHUNK_CACHE_WAYS;
        let ways = set..set + CHUNK_CACHE_WAYS;
        if generation == self.generation {
            if self.holds(self.prev, owner, pa, len) {
                return self.touch(self.prev);
            }
            if let Some(at) = ways.clone().find(|&at| self.holds(at, owner, pa, len)) {
                return self.touch(at);
            }
        } else {
            *self = Self::empty(generation);
        }
        let chunk = search()?;
        // Labelled with the generation read before the search: a change during the search
        // empties the cache at the next lookup. Never into the slot of the lookup before,
        // which may still be lent beside this one's answer; an empty way first, then one that
        // is not `prev` either (a run alternating between two chunks keeps both).
        let free = ways.clone().filter(|&at| at != self.last);
        let at = free
            .clone()
            .find(|&at| self.chunks.get(at).is_some_and(Option::is_none))
            .or_else(|| free.clone().find(|&at| at != self.prev))
            .or_else(|| free.clone().next())
            // Never taken: a set has another way than `last` (CHUNK_CACHE_WAYS >= 2).
            .unwrap_or(set);
        if let Some(slot) = self.chunks.get_mut(at) {
            *slot = Some(chunk);
        }
        self.touch(at)
    }
}

/// The [`ChunkCache`] set of `pa`: its chunk granule's number, masked (below
/// [`CHUNK_CACHE_SETS`]).
fn set_of(pa: u64) -> usize {
    // The mask keeps the low bits, so the cast truncates nothing that is kept.
    (pa / CHUNK_GRANULE) as usize & (CHUNK_CACHE_SETS - 1)
}

/// A slot of a [`ChunkCache`] that a lookup answered from, to [`ChunkCache::lend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSlot(usize);

/// All chunks of the device and the allocators of its regions.
///
/// # Invariants
/// `by_pa` and `by_handle` hold the same chunks; every change of them bumps `generation`
/// first (see [`Generation`]).
#[derive(Debug)]
pub struct AddressSpace {
    map: AddressMap,
    hbm: Vec<FreeList>,
    host: FreeList,
    by_pa: BTreeMap<u64, Arc<Chunk>>,
    by_handle: HashMap<u64, Arc<Chunk>>,
    next_handle: u64,
    generation: Arc<Generation>,
    /// B-tree searches made by [`AddressSpace::resolve`] (the slow path of DMA resolution).
    searches: AtomicU64,
}

impl AddressSpace {
    /// An empty address space for `map`.
    pub fn new(map: AddressMap) -> Self {
        let hbm = (0..map.nc_count)
            .map(|nc| {
                let range = map.hbm_range(nc);
                FreeList::new(range.start, range.end)
            })
            .collect();
        let host = map.host_range();
        Self {
            map,
            hbm,
            host: FreeList::new(host.start, host.end),
            by_pa: BTreeMap::new(),
            by_handle: HashMap::new(),
            next_handle: 1,
            generation: Arc::default(),
            searches: AtomicU64::new(0),
        }
    }

    /// The address space's [`Generation`], to read without its lock.
    pub fn generation(&self) -> Arc<Generation> {
        Arc::clone(&self.generation)
    }

    /// How many B-tree searches [`AddressSpace::resolve`] made so far.
    pub fn searches(&self) -> u64 {
        self.searches.load(Ordering::Relaxed)
    }

    fn free_list(&mut self, region: Region) -> Result<&mut FreeList, AllocError> {
        match region {
            Region::Host => Ok(&mut self.host),
            Region::Hbm(nc) => {
                let nc_count = self.map.nc_count;
                usize::try_from(nc)
                    .ok()
                    .and_then(|i| self.hbm.get_mut(i))
                    .ok_or(AllocError::NoSuchNc { nc, nc_count })
            }
        }
    }

    /// Allocates a chunk of `size` bytes (rounded up to 4 KiB) in `region` for `owner`,
    /// aligned to `align` bytes (0 means 4 KiB; otherwise a power of two, raised to at least
    /// 4 KiB). The chunk is zeroed.
    ///
    /// # Errors
    /// [`AllocError`]: a bad size or alignment, an unknown NC, no room in the region, or an OS
    /// failure creating the backing memfd.
    pub fn allocate(
        &mut self,
        owner: ClientId,
        region: Region,
        size: u64,
        align: u64,
    ) -> Result<Arc<Chunk>, AllocError> {
        let rounded = match size.checked_next_multiple_of(CHUNK_GRANULE) {
            Some(rounded) if size > 0 => rounded,
            _ => return Err(AllocError::BadSize { size }),
        };
        let align = match align {
            0 => CHUNK_GRANULE,
            a if a.is_power_of_two() => a.max(CHUNK_GRANULE),
            a => return Err(AllocError::BadAlign { align: a }),
        };
        let len = usize::try_from(rounded).map_err(|_| AllocError::BadSize { size })?;
        let pa =
            self.free_list(region)?
                .allocate(rounded, align)
                .ok_or(AllocError::OutOfMemory {
                    size: rounded,
                    align,
                    region,
                })?;
        match Self::back(pa, rounded, len) {
            Ok((memfd, memory)) => {
                let handle = self.next_handle;
                self.next_handle += 1;
                let chunk = Arc::new(Chunk {
                    handle,
                    owner,
                    region,
                    memfd,
                    memory,
                });
                self.generation.bump();
                self.by_pa.insert(pa, Arc::clone(&chunk));
                self.by_handle.insert(handle, Arc::clone(&chunk));
                Ok(chunk)
            }
            Err(e) => {
                self.free_list(region)?.release(pa, rounded);
                Err(e)
            }
        }
    }

    /// Creates, sizes, seals and maps the memfd of a chunk at `pa`.
    fn back(pa: u64, size: u64, len: usize) -> Result<(OwnedFd, SharedChunk), AllocError> {
        let memfd = memfd_create(
            "simdev-chunk",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|source| AllocError::CreateMemfd { size, source })?;
        let file_len = i64::try_from(size).map_err(|_| AllocError::SizeMemfd {
            size,
            source: nix::Error::EFBIG,
        })?;
        nix::unistd::ftruncate(&memfd, file_len)
            .map_err(|source| AllocError::SizeMemfd { size, source })?;
        // Writes stay allowed (the owner's and simdev's mappings are the device memory), and so
        // does punching holes (`SharedChunk::discard`): a hole reads as zeros, never faults.
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&memfd, FcntlArg::F_ADD_SEALS(seals))
            .map_err(|source| AllocError::SealMemfd { size, source })?;
        let memory = SharedChunk::map_fd(&memfd, pa, len, true)
            .map_err(|source| AllocError::MapChunk { size, source })?;
        Ok((memfd, memory))
    }

    /// The chunk `handle` if `owner` allocated it.
    ///
    /// # Errors
    /// [`BadHandle`] for an unknown handle or another client's.
    pub fn get(&self, owner: ClientId, handle: u64) -> Result<Arc<Chunk>, BadHandle> {
        match self.by_handle.get(&handle) {
            Some(chunk) if chunk.owner == owner => Ok(Arc::clone(chunk)),
            _ => Err(BadHandle { handle }),
        }
    }

    /// Frees chunk `handle` of `owner`: its PA range goes back to the allocator and no longer
    /// resolves. Holders of the `Arc` (a DMA queue's ring, a notification queue) keep the
    /// mapping alive.
    ///
    /// # Errors
    /// [`BadHandle`] for an unknown handle or another client's.
    pub fn free(&mut self, owner: ClientId, handle: u64) -> Result<Arc<Chunk>, BadHandle> {
        let chunk = self.get(owner, handle)?;
        self.generation.bump();
        self.by_handle.remove(&handle);
        self.by_pa.remove(&chunk.pa());
        let (pa, size, region) = (chunk.pa(), chunk.size(), chunk.region);
        if let Ok(list) = self.free_list(region) {
            list.release(pa, size);
        }
        Ok(chunk)
    }

    /// Frees every chunk of `owner`; returns how many.
    pub fn free_all(&mut self, owner: ClientId) -> usize {
        let handles: Vec<u64> = self
            .by_handle
            .values()
            .filter(|c| c.owner == owner)
            .map(|c| c.handle)
            .collect();
        handles
            .into_iter()
            .filter(|&h| self.free(owner, h).is_ok())
            .count()
    }

    /// The chunk of `owner` that holds all of `pa..pa+len`, for a DMA access.
    ///
    /// # Errors
    /// [`Unresolved`] when no chunk holds the range, the range straddles chunks, or the chunk
    /// is another client's.
    pub fn resolve(&self, owner: ClientId, pa: u64, len: usize) -> Result<Arc<Chunk>, Unresolved> {
        self.searches.fetch_add(1, Ordering::Relaxed);
        match self.by_pa.range(..=pa).next_back() {
            Some((_, chunk)) if chunk.owner == owner && chunk.memory.contains(pa, len) => {
                Ok(Arc::clone(chunk))
            }
            _ => Err(Unresolved { pa, len }),
        }
    }

    /// Number of live chunks (all clients).
    pub fn chunk_count(&self) -> usize {
        self.by_handle.len()
    }

    /// Bytes of live chunks (all clients, notification-queue rings included).
    pub fn bytes_in_use(&self) -> u64 {
        self.by_handle.values().map(|c| c.size()).sum()
    }

    /// Bytes of live chunks per owner.
    pub fn bytes_by_owner(&self) -> std::collections::HashMap<ClientId, u64> {
        let mut by_owner = std::collections::HashMap::new();
        for chunk in self.by_handle.values() {
            *by_owner.entry(chunk.owner).or_insert(0) += chunk.size();
        }
        by_owner
    }

    /// The free ranges of `region`, in address order (for tests and diagnostics).
    pub fn free_ranges(&self, region: Region) -> Vec<(u64, u64)> {
        match region {
            Region::Host => self.host.ranges().collect(),
            Region::Hbm(nc) => usize::try_from(nc)
                .ok()
                .and_then(|i| self.hbm.get(i))
                .map(|l| l.ranges().collect())
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::address_map::Arch;

    const MIB: u64 = 1 << 20;

    fn space() -> AddressSpace {
        AddressSpace::new(AddressMap {
            arch: Arch::Trn1,
            nc_count: 2,
            hbm_bytes_per_nc: MIB,
        })
    }

    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);

    #[test]
    fn sizes_round_up_to_4k_and_chunks_are_zeroed() {
        let mut mem = space();
        let chunk = mem.allocate(A, Region::Hbm(0), 1, 0).unwrap();
        assert_eq!(chunk.size(), 4096);
        assert_eq!(
            chunk.pa(),
            0x10_0000_0000,
            "first fit starts at the HBM base"
        );
        assert_eq!(
            chunk.memory().read_obj::<u64>(chunk.pa() + 8).unwrap(),
            0,
            "fresh memfds are zeroed"
        );
        let next = mem.allocate(A, Region::Hbm(0), 4097, 0).unwrap();
        assert_eq!(next.size(), 8192);
        assert_eq!(next.pa(), 0x10_0000_1000);
    }

    #[test]
    fn alignment_is_a_power_of_two_of_at_least_4k() {
        let mut mem = space();
        mem.allocate(A, Region::Hbm(0), 4096, 0).unwrap();
        let aligned = mem.allocate(A, Region::Hbm(0), 4096, 64 << 10).unwrap();
        assert_eq!(aligned.pa() % (64 << 10), 0);
        assert_eq!(aligned.pa(), 0x10_0001_0000);
        let small = mem.allocate(A, Region::Hbm(0), 4096, 16).unwrap();
        assert_eq!(small.pa(), 0x10_0000_1000, "align 16 is raised to 4 KiB");
        assert!(matches!(
            mem.allocate(A, Region::Hbm(0), 4096, 3),
            Err(AllocError::BadAlign { align: 3 })
        ));
        assert!(matches!(
            mem.allocate(A, Region::Hbm(0), 0, 0),
            Err(AllocError::BadSize { size: 0 })
        ));
        assert!(matches!(
            mem.allocate(A, Region::Hbm(0), u64::MAX, 0),
            Err(AllocError::BadSize { .. })
        ));
        assert!(matches!(
            mem.allocate(A, Region::Hbm(0), 4096, 1 << 63),
            Err(AllocError::OutOfMemory { .. })
        ));
    }

    #[test]
    fn out_of_memory_then_success_after_free() {
        let mut mem = space();
        let whole = mem.allocate(A, Region::Hbm(1), MIB, 0).unwrap();
        let err = mem.allocate(A, Region::Hbm(1), 4096, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no free range of 4096 bytes aligned to 4096 in HBM of NC 1"
        );
        mem.allocate(A, Region::Hbm(0), 4096, 0)
            .expect("other NCs' HBM is separate");
        mem.free(A, whole.handle()).unwrap();
        let again = mem.allocate(A, Region::Hbm(1), 4096, 0).unwrap();
        assert_eq!(again.pa(), whole.pa());
    }

    #[test]
    fn freed_neighbours_merge() {
        let mut mem = space();
        let parts: Vec<_> = (0..4)
            .map(|_| mem.allocate(A, Region::Hbm(0), MIB / 4, 0).unwrap())
            .collect();
        assert!(mem.free_ranges(Region::Hbm(0)).is_empty());
        mem.free(A, parts[1].handle()).unwrap();
        mem.free(A, parts[3].handle()).unwrap();
        assert_eq!(mem.free_ranges(Region::Hbm(0)).len(), 2);
        mem.free(A, parts[2].handle()).unwrap();
        let base = 0x10_0000_0000;
        assert_eq!(
            mem.free_ranges(Region::Hbm(0)),
            [(base + MIB / 4, base + MIB)],
            "1, 2 and 3 merged into one range"
        );
        let big = mem.allocate(A, Region::Hbm(0), 3 * MIB / 4, 0).unwrap();
        assert_eq!(big.pa(), base + MIB / 4);
        mem.free(A, parts[0].handle()).unwrap();
        mem.free(A, big.handle()).unwrap();
        assert_eq!(mem.free_ranges(Region::Hbm(0)), [(base, base + MIB)]);
    }

    #[test]
    fn handles_are_non_zero_unique_and_owned() {
        let mut mem = space();
        let a = mem.allocate(A, Region::Host, 4096, 0).unwrap();
        mem.free(A, a.handle()).unwrap();
        let b = mem.allocate(A, Region::Host, 4096, 0).unwrap();
        assert_ne!(a.handle(), 0);
        assert_ne!(a.handle(), b.handle(), "a freed handle is never reused");
        assert_eq!(
            mem.get(B, b.handle()).unwrap_err(),
            BadHandle { handle: b.handle() }
        );
        assert!(mem.free(B, b.handle()).is_err());
        assert!(mem.get(A, 0).is_err());
        assert!(mem.get(A, b.handle()).is_ok());
    }

    #[test]
    fn resolve_needs_one_whole_chunk_of_the_owner() {
        let mut mem = space();
        let a = mem.allocate(A, Region::Host, 4096, 0).unwrap();
        let a2 = mem.allocate(A, Region::Host, 4096, 0).unwrap();
        assert_eq!(a2.pa(), a.pa() + 4096);
        assert!(mem.resolve(A, a.pa() + 100, 200).is_ok());
        assert!(
            mem.resolve(A, a.pa() + 4000, 200).is_err(),
            "straddles two chunks"
        );
        assert!(mem.resolve(B, a.pa(), 4).is_err(), "another client's chunk");
        assert!(
            mem.resolve(A, 0x1000, 4).is_err(),
            "a raw offset is no chunk"
        );
        assert!(mem.resolve(A, u64::MAX, 4).is_err());
        mem.free(A, a.handle()).unwrap();
        assert!(
            mem.resolve(A, a.pa(), 4).is_err(),
            "freed chunks do not resolve"
        );
        assert_eq!(mem.free_all(A), 1);
        assert_eq!(mem.chunk_count(), 0);
    }

    #[test]
    fn the_chunk_cache_answers_only_what_resolve_would_at_the_same_generation() {
        let mut mem = space();
        let generation = mem.generation();
        let a = mem.allocate(A, Region::Host, 8192, 0).unwrap();
        let mut cache = ChunkCache::default();
        let resolve = |cache: &mut ChunkCache, mem: &AddressSpace, owner, pa, len| {
            cache.resolve(generation.get(), owner, pa, len, || {
                mem.resolve(owner, pa, len).ok()
            })
        };
        assert!(resolve(&mut cache, &mem, A, a.pa(), 16).is_some());
        let searched = mem.searches();
        for offset in [0, 100, 4096, 8000] {
            let hit = resolve(&mut cache, &mem, A, a.pa() + offset, 16).unwrap();
            assert!(Arc::ptr_eq(&hit, &a));
        }
        assert_eq!(mem.searches(), searched, "hits do not search");
        assert!(
            resolve(&mut cache, &mem, B, a.pa(), 16).is_none(),
            "not B's"
        );
        assert!(
            resolve(&mut cache, &mem, A, a.pa() + 8190, 16).is_none(),
            "past its end"
        );
        mem.free(A, a.handle()).unwrap();
        assert!(
            resolve(&mut cache, &mem, A, a.pa(), 16).is_none(),
            "freed: the cache was emptied"
        );
        let b = mem.allocate(B, Region::Host, 8192, 0).unwrap();
        assert_eq!(b.pa(), a.pa());
        assert!(
            resolve(&mut cache, &mem, A, a.pa(), 16).is_none(),
            "B's now"
        );
        let hit = resolve(&mut cache, &mem, B, b.pa(), 16).unwrap();
        assert!(Arc::ptr_eq(&hit, &b), "the new chunk, never the freed one");
    }

    /// Allocates 4 KiB chunks of `A` until `n` of them fall in the cache set of the first.
    fn chunks_of_one_set(mem: &mut AddressSpace, n: usize) -> Vec<Arc<Chunk>> {
        let first = mem.allocate(A, Region::Host, 4096, 0).unwrap();
        let mut same = vec![first];
        while same.len() < n {
            let c = mem.allocate(A, Region::Host, 4096, 0).unwrap();
            if set_of(c.pa()) == set_of(same[0].pa()) {
                same.push(c);
            }
        }
        same
    }

    /// A DMA pair lends its source's and destination's chunks together: the destination's
    /// miss must not fill the source's slot, even when it is in the destination's set and
    /// that set is full.
    #[test]
    fn a_miss_never_fills_the_slot_of_the_lookup_before_it() {
        let mut mem = space();
        let chunks = chunks_of_one_set(&mut mem, 3);
        let generation = mem.generation().get();
        let mut cache = ChunkCache::default();
        let find = |cache: &mut ChunkCache, c: &Arc<Chunk>| {
            cache
                .find(generation, A, c.pa(), 16, || {
                    mem.resolve(A, c.pa(), 16).ok()
                })
                .unwrap()
        };
        // Both ways of the set filled, then the first way hit again.
        let first = find(&mut cache, &chunks[0]);
        find(&mut cache, &chunks[1]);
        let src = find(&mut cache, &chunks[0]);
        assert_eq!(src, first, "a hit in the set");
        let dst = find(&mut cache, &chunks[2]);
        assert_ne!(src, dst);
        assert!(
            Arc::ptr_eq(cache.lend(src).unwrap(), &chunks[0]),
            "the source stays lent"
        );
        assert!(Arc::ptr_eq(cache.lend(dst).unwrap(), &chunks[2]));
    }

    /// What the cache is for (issue 17, target 3): executions in flight cycle over many
    /// tensors, a run of pairs walks one chunk page by page, a copy alternates between two
    /// chunks; after one pass, none of them searches.
    #[test]
    fn steady_state_lookups_of_cycling_walking_and_alternating_runs_search_nothing() {
        let mut mem = space();
        // 16 executions in flight: 16 inputs and 16 outputs; and two 512 KiB chunks, whose
        // 128 pages each fill every set twice over.
        let tensors: Vec<_> = (0..32)
            .map(|_| mem.allocate(A, Region::Host, 4096, 0).unwrap())
            .collect();
        let big: Vec<_> = (0..2)
            .map(|_| mem.allocate(A, Region::Host, 512 * 1024, 0).unwrap())
            .collect();
        let generation = mem.generation().get();
        let mut cache = ChunkCache::default();
        let lookups = |cache: &mut ChunkCache| {
            let mut find = |c: &Arc<Chunk>, offset: u64| {
                let pa = c.pa() + offset;
                let at = cache
                    .find(generation, A, pa, 64, || mem.resolve(A, pa, 64).ok())
                    .unwrap();
                assert!(Arc::ptr_eq(cache.lend(at).unwrap(), c));
            };
            for pair in tensors.chunks(2) {
                find(&pair[0], 0);
                find(&pair[1], 0);
            }
            for page in 0..16 {
                find(&big[0], page * 4096);
            }
            for page in 0..128 {
                find(&big[0], page * 4096 + 64);
                find(&big[1], page * 4096 + 64);
            }
        };
        lookups(&mut cache);
        let warm = mem.searches();
        for _ in 0..3 {
            lookups(&mut cache);
        }
        assert_eq!(mem.searches(), warm, "hits do not search");
    }

    #[test]
    fn a_chunks_memfd_cannot_be_resized_by_whoever_holds_it_but_stays_writable_and_discardable() {
        let mut mem = space();
        let chunk = mem.allocate(A, Region::Hbm(0), 8192, 0).unwrap();
        // What the owner receives: a duplicate of the same open file.
        let held = chunk.memfd().try_clone_to_owned().unwrap();
        for len in [0, 4096, 8191, 8193, 1 << 20] {
            assert_eq!(
                nix::unistd::ftruncate(&held, len),
                Err(nix::Error::EPERM),
                "ftruncate to {len} bytes"
            );
        }
        assert_eq!(
            fcntl(&held, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_WRITE)),
            Err(nix::Error::EPERM),
            "no further seal (a write seal would stop the device's own writes)"
        );
        let last = chunk.pa() + 8192 - 8;
        chunk.memory().write_obj(last, &7u64).unwrap();
        assert_eq!(
            nix::unistd::write(&held, b"x"),
            Ok(1),
            "writes stay allowed"
        );
        chunk.memory().discard().unwrap();
        assert_eq!(
            chunk.memory().read_obj::<u64>(last).unwrap(),
            0,
            "a hole reads as zeros"
        );
    }
}
