//! Bounds-checked access to shared device memory, addressed by device PA.
//!
//! Every byte the runtime and simdev share — memory chunks, descriptor rings, notification
//! queues, the semaphore window — is a [`SharedChunk`]: one `MAP_SHARED` mapping of one memfd
//! (sim) or one driver chunk (hardware), placed at a device PA. The other party writes it
//! concurrently, so this module never hands out `&[u8]` or `&T` into the mapping: bytes are
//! copied in and out, and control words are accessed as atomics with an explicit
//! [`Ordering`]. All `unsafe` for shared memory lives here.
//!
//! Bulk byte copies ([`SharedChunk::read`], [`SharedChunk::write`], [`copy`]) are plain
//! `ptr::copy`. Their soundness relies on the protocol that publishes them: a data region is
//! handed from one side to the other by a release store of a control word (ring tail,
//! notification phase, semaphore) and read after the matching acquire load, so the two sides
//! never touch the same bytes at once. A peer that breaks the protocol can make us read
//! inconsistent bytes, never read or write outside the mapping.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use thiserror::Error;
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// An access that the accessor refused.
#[derive(Debug, Error)]
pub enum MemError {
    /// The range is not inside the chunk.
    #[error("access {pa:#x}+{len} is outside chunk {chunk_pa:#x}+{chunk_len}")]
    OutOfBounds {
        /// First PA of the access.
        pa: u64,
        /// Bytes accessed.
        len: usize,
        /// First PA of the chunk.
        chunk_pa: u64,
        /// Chunk size in bytes.
        chunk_len: usize,
    },
    /// An atomic access at a PA not aligned to its size.
    #[error("atomic access at {pa:#x} is not {align}-byte aligned")]
    Misaligned {
        /// PA of the access.
        pa: u64,
        /// Required alignment in bytes.
        align: usize,
    },
    /// A write to a chunk mapped read-only.
    #[error("chunk {chunk_pa:#x} is mapped read-only")]
    ReadOnly {
        /// First PA of the chunk.
        chunk_pa: u64,
    },
    /// `mmap` of the chunk failed.
    #[error("mapping chunk {pa:#x}+{len}")]
    Map {
        /// PA of the chunk.
        pa: u64,
        /// Bytes requested.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// `madvise(MADV_REMOVE)` of the chunk failed ([`SharedChunk::discard`]).
    #[error("giving back the pages of chunk {pa:#x}+{len}")]
    Discard {
        /// PA of the chunk.
        pa: u64,
        /// Its size in bytes.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// One shared mapping of a whole chunk, placed at device PA `pa`.
///
/// # Invariants
/// `map` is a live mapping of exactly `len` bytes (`len > 0`); every access checks
/// `pa..pa+len` before touching it.
#[derive(Debug)]
pub struct SharedChunk {
    map: MmapRaw,
    pa: u64,
    len: usize,
    writable: bool,
}

impl SharedChunk {
    /// Maps the whole of `fd` (`len` bytes from file offset 0) and places it at device `pa`.
    /// `writable` selects a read-write or read-only `MAP_SHARED` mapping.
    ///
    /// # Errors
    /// [`MemError::Map`] if `len` is 0 or `mmap` fails (e.g. a read-only sealed memfd mapped
    /// writable).
    pub fn map_fd(
        fd: &impl AsRawFd,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<Self, MemError> {
        Self::map_fd_at(fd, 0, pa, len, writable)
    }

    /// Maps `len` bytes of `fd` from file offset `file_offset` (the driver's mmap offset) and
    /// places them at device `pa`.
    ///
    /// # Errors
    /// [`MemError::Map`] if `len` is 0 or `mmap` fails.
    pub fn map_fd_at(
        fd: &impl AsRawFd,
        file_offset: u64,
        pa: u64,
        len: usize,
        writable: bool,
    ) -> Result<Self, MemError> {
        let err = |source| MemError::Map { pa, len, source };
        if len == 0 {
            return Err(err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty chunk",
            )));
        }
        let raw = fd.as_raw_fd();
        let mut opts = MmapOptions::new();
        opts.offset(file_offset).len(len);
        let map = if writable {
            opts.map_raw(raw)
        } else {
            opts.map_raw_read_only(raw)
        };
        let map = map.map_err(err)?;
        Ok(Self {
            map,
            pa,
            len,
            writable,
        })
    }

    /// A private anonymous mapping of `len` zeroed bytes placed at device `pa` (counters that
    /// live in this process only, through the same accessor as a shared file's).
    ///
    /// # Errors
    /// [`MemError::Map`] if `len` is 0 or `mmap` fails.
    pub fn anonymous(pa: u64, len: usize) -> Result<Self, MemError> {
        let err = |source| MemError::Map { pa, len, source };
        if len == 0 {
            return Err(err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty chunk",
            )));
        }
        let map = MmapOptions::new().len(len).map_anon().map_err(err)?;
        Ok(Self {
            map: MmapRaw::from(map),
            pa,
            len,
            writable: true,
        })
    }

    /// First device PA of the chunk.
    pub const fn pa(&self) -> u64 {
        self.pa
    }

    /// Size in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Always false: a chunk has at least one byte.
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// The host address of device PA `pa` inside the mapping (what `nrt_tensor_get_va`
    /// returns). Computing it is safe; using it is the caller's business.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] when `pa` is not a byte of the chunk.
    #[inline]
    pub fn host_address(&self, pa: u64) -> Result<*mut u8, MemError> {
        let off = self.offset(pa, 1)?;
        Ok(self.map.as_mut_ptr().wrapping_add(off))
    }

    /// Whether `pa..pa+len` lies inside the chunk.
    #[inline]
    pub fn contains(&self, pa: u64, len: usize) -> bool {
        self.offset(pa, len).is_ok()
    }

    #[inline]
    fn offset(&self, pa: u64, len: usize) -> Result<usize, MemError> {
        let oob = || MemError::OutOfBounds {
            pa,
            len,
            chunk_pa: self.pa,
            chunk_len: self.len,
        };
        let off = pa.checked_sub(self.pa).ok_or_else(oob)?;
        let off = usize::try_from(off).map_err(|_| oob())?;
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(off),
            _ => Err(oob()),
        }
    }

    #[inline]
    fn writable_offset(&self, pa: u64, len: usize) -> Result<usize, MemError> {
        if !self.writable {
            return Err(MemError::ReadOnly { chunk_pa: self.pa });
        }
        self.offset(pa, len)
    }

    #[inline]
    fn aligned_offset(&self, pa: u64, align: usize, write: bool) -> Result<usize, MemError> {
        let off = if write {
            self.writable_offset(pa, align)?
        } else {
            self.offset(pa, align)?
        };
        // The mapping is page-aligned, so PA alignment relative to the chunk is address alignment.
        if off % align != 0 {
            return Err(MemError::Misaligned { pa, align });
        }
        Ok(off)
    }

    #[inline]
    fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` was checked by `aligned_offset`: `off + 4 <= len` and `off` is 4-byte
        // aligned from a page-aligned base, so the pointer is in bounds and aligned for
        // AtomicU32. The mapping lives as long as `self` (type invariant), which bounds the
        // returned lifetime. Every access through it is atomic, so concurrent access by the peer
        // through its own mapping is not a data race.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(off).cast()) }
    }

    #[inline]
    fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: as in `atomic_u32`, with an 8-byte bound and alignment checked by
        // `aligned_offset(pa, 8, ..)`.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(off).cast()) }
    }

    /// Copies `buf.len()` bytes at `pa` into `buf`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`].
    #[inline]
    pub fn read(&self, pa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let off = self.offset(pa, buf.len())?;
        // SAFETY: `off + buf.len() <= len` (checked), the mapping is live (type invariant), and
        // `buf` is a distinct Rust allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    /// Copies `data` to `pa`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] or [`MemError::ReadOnly`].
    #[inline]
    pub fn write(&self, pa: u64, data: &[u8]) -> Result<(), MemError> {
        let off = self.writable_offset(pa, data.len())?;
        // SAFETY: in bounds (checked), mapping live and writable (checked), `data` is a distinct
        // Rust allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.map.as_mut_ptr().add(off), data.len())
        };
        Ok(())
    }

    /// Gives the chunk's pages back to the system while the mapping stays
    /// (`madvise(MADV_REMOVE)`: a hole punched in the memfd behind it, whose memory is freed
    /// at once, though other mappings of it exist). Later reads see zeros; a later write takes
    /// a new page. For memory the device has given up (its opener closed) that objects the
    /// caller still holds map: their pages would otherwise live as long as they do.
    ///
    /// # Errors
    /// [`MemError::ReadOnly`] for a read-only mapping; [`MemError::Discard`] when the kernel
    /// refuses (memory that is not a shared file mapping, e.g. [`SharedChunk::anonymous`]).
    pub fn discard(&self) -> Result<(), MemError> {
        if !self.writable {
            return Err(MemError::ReadOnly { chunk_pa: self.pa });
        }
        // SAFETY: MADV_REMOVE zeroes the pages under the mapping, which stays valid. Nothing
        // borrows them as plain memory: every access goes through this type's raw-pointer
        // copies or atomics (`atomic_words`), which already allow the peer process to write
        // the memory at any time, and zeroing is such a write.
        unsafe { self.map.unchecked_advise(memmap2::UncheckedAdvice::Remove) }.map_err(|source| {
            MemError::Discard {
                pa: self.pa,
                len: self.len,
                source,
            }
        })
    }

    /// Sets `len` bytes at `pa` to `byte`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] or [`MemError::ReadOnly`].
    pub fn fill(&self, pa: u64, len: usize, byte: u8) -> Result<(), MemError> {
        let off = self.writable_offset(pa, len)?;
        // SAFETY: in bounds and writable (checked), mapping live (type invariant).
        unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(off), byte, len) };
        Ok(())
    }

    /// Reads a plain-old-data value at `pa` (byte copy, no alignment required).
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`].
    #[inline]
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, pa: u64) -> Result<T, MemError> {
        let mut v = T::new_zeroed();
        self.read(pa, v.as_mut_bytes())?;
        Ok(v)
    }

    /// Writes a plain-old-data value at `pa` (byte copy).
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] or [`MemError::ReadOnly`].
    #[inline]
    pub fn write_obj<T: IntoBytes + Immutable>(&self, pa: u64, v: &T) -> Result<(), MemError> {
        self.write(pa, v.as_bytes())
    }

    /// Atomically loads the u32 at `pa`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] or [`MemError::Misaligned`].
    #[inline]
    pub fn load_u32(&self, pa: u64, order: Ordering) -> Result<u32, MemError> {
        let off = self.aligned_offset(pa, 4, false)?;
        Ok(self.atomic_u32(off).load(order))
    }

    /// Atomically stores the u32 at `pa`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`], [`MemError::Misaligned`] or [`MemError::ReadOnly`].
    #[inline]
    pub fn store_u32(&self, pa: u64, v: u32, order: Ordering) -> Result<(), MemError> {
        let off = self.aligned_offset(pa, 4, true)?;
        self.atomic_u32(off).store(v, order);
        Ok(())
    }

    /// Atomically adds `v` (wrapping) to the u32 at `pa`; returns the previous value.
    ///
    /// # Errors
    /// As [`SharedChunk::store_u32`].
    #[inline]
    pub fn fetch_add_u32(&self, pa: u64, v: u32, order: Ordering) -> Result<u32, MemError> {
        let off = self.aligned_offset(pa, 4, true)?;
        Ok(self.atomic_u32(off).fetch_add(v, order))
    }

    /// Atomically subtracts `v` (wrapping) from the u32 at `pa`; returns the previous value.
    ///
    /// # Errors
    /// As [`SharedChunk::store_u32`].
    #[inline]
    pub fn fetch_sub_u32(&self, pa: u64, v: u32, order: Ordering) -> Result<u32, MemError> {
        let off = self.aligned_offset(pa, 4, true)?;
        Ok(self.atomic_u32(off).fetch_sub(v, order))
    }

    /// Atomically loads the u64 at `pa`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] or [`MemError::Misaligned`].
    #[inline]
    pub fn load_u64(&self, pa: u64, order: Ordering) -> Result<u64, MemError> {
        let off = self.aligned_offset(pa, 8, false)?;
        Ok(self.atomic_u64(off).load(order))
    }

    /// Atomically stores the u64 at `pa`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`], [`MemError::Misaligned`] or [`MemError::ReadOnly`].
    #[inline]
    pub fn store_u64(&self, pa: u64, v: u64, order: Ordering) -> Result<(), MemError> {
        let off = self.aligned_offset(pa, 8, true)?;
        self.atomic_u64(off).store(v, order);
        Ok(())
    }

    /// Atomically adds `v` (wrapping) to the u64 at `pa`; returns the previous value.
    ///
    /// # Errors
    /// As [`SharedChunk::store_u64`].
    pub fn fetch_add_u64(&self, pa: u64, v: u64, order: Ordering) -> Result<u64, MemError> {
        let off = self.aligned_offset(pa, 8, true)?;
        Ok(self.atomic_u64(off).fetch_add(v, order))
    }

    /// Atomically subtracts `v` (wrapping) from the u64 at `pa`; returns the previous value.
    ///
    /// # Errors
    /// As [`SharedChunk::store_u64`].
    pub fn fetch_sub_u64(&self, pa: u64, v: u64, order: Ordering) -> Result<u64, MemError> {
        let off = self.aligned_offset(pa, 8, true)?;
        Ok(self.atomic_u64(off).fetch_sub(v, order))
    }

    /// Atomically stores the minimum of `v` and the u64 at `pa`; returns the previous value.
    ///
    /// # Errors
    /// As [`SharedChunk::store_u64`].
    pub fn fetch_min_u64(&self, pa: u64, v: u64, order: Ordering) -> Result<u64, MemError> {
        let off = self.aligned_offset(pa, 8, true)?;
        Ok(self.atomic_u64(off).fetch_min(v, order))
    }

    /// Atomically stores the maximum of `v` and the u64 at `pa`; returns the previous value.
    ///
    /// # Errors
    /// As [`SharedChunk::store_u64`].
    pub fn fetch_max_u64(&self, pa: u64, v: u64, order: Ordering) -> Result<u64, MemError> {
        let off = self.aligned_offset(pa, 8, true)?;
        Ok(self.atomic_u64(off).fetch_max(v, order))
    }

    /// Reads a plain-old-data value at `pa` one u64 word at a time with atomic loads of
    /// `order` (a record whose counters another process updates atomically). `T` must be a
    /// whole number of u64 words and `pa` 8-aligned.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`] or [`MemError::Misaligned`] (also for a `T` whose size is not
    /// a multiple of 8).
    pub fn load_words<T: FromBytes + IntoBytes>(
        &self,
        pa: u64,
        order: Ordering,
    ) -> Result<T, MemError> {
        let mut v = T::new_zeroed();
        let bytes = v.as_mut_bytes();
        if bytes.len() % 8 != 0 {
            return Err(MemError::Misaligned { pa, align: 8 });
        }
        let off = self.offset(pa, bytes.len())?;
        if off % 8 != 0 {
            return Err(MemError::Misaligned { pa, align: 8 });
        }
        for (i, word) in bytes.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&self.atomic_u64(off + 8 * i).load(order).to_ne_bytes());
        }
        Ok(v)
    }

    /// The `words` u64 words at `pa` as atomics: a record whose counters this process and its
    /// readers share, bounds-, alignment- and write-checked once for the whole range, so a
    /// writer updating many counters of one record pays one check, not one per counter.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`], [`MemError::Misaligned`] or [`MemError::ReadOnly`].
    pub fn atomic_words(&self, pa: u64, words: usize) -> Result<&[AtomicU64], MemError> {
        let bytes = words.checked_mul(8).ok_or(MemError::OutOfBounds {
            pa,
            len: usize::MAX,
            chunk_pa: self.pa,
            chunk_len: self.len,
        })?;
        let off = self.writable_offset(pa, bytes)?;
        if off % 8 != 0 {
            return Err(MemError::Misaligned { pa, align: 8 });
        }
        // SAFETY: `off + 8 * words <= len` (checked) and `off` is 8-byte aligned from a
        // page-aligned base, so the `words` AtomicU64s are in bounds and aligned. The mapping
        // is writable (checked) and lives as long as `self` (type invariant), which bounds the
        // returned lifetime. Every access through the slice is atomic, so concurrent access by
        // the peer through its own mapping is not a data race.
        Ok(unsafe {
            std::slice::from_raw_parts(self.map.as_mut_ptr().add(off).cast::<AtomicU64>(), words)
        })
    }

    /// Writes `words` at `pa` one u64 at a time with atomic stores of `order`.
    ///
    /// # Errors
    /// [`MemError::OutOfBounds`], [`MemError::Misaligned`] or [`MemError::ReadOnly`].
    pub fn store_words(&self, pa: u64, words: &[u64], order: Ordering) -> Result<(), MemError> {
        if words.is_empty() {
            return Ok(());
        }
        let off = self.writable_offset(pa, words.len() * 8)?;
        if off % 8 != 0 {
            return Err(MemError::Misaligned { pa, align: 8 });
        }
        for (i, w) in words.iter().enumerate() {
            self.atomic_u64(off + 8 * i).store(*w, order);
        }
        Ok(())
    }
}

/// Copies `len` bytes from `src_pa` in `src` to `dst_pa` in `dst` (the DMA data mover). The two
/// chunks may be the same chunk and the ranges may overlap (memmove semantics).
///
/// # Errors
/// [`MemError::OutOfBounds`] for either side, [`MemError::ReadOnly`] for `dst`.
#[inline]
pub fn copy(
    src: &SharedChunk,
    src_pa: u64,
    dst: &SharedChunk,
    dst_pa: u64,
    len: usize,
) -> Result<(), MemError> {
    let s = src.offset(src_pa, len)?;
    let d = dst.writable_offset(dst_pa, len)?;
    // SAFETY: both ranges were bounds-checked against their live mappings (type invariant) and
    // `dst` is writable; `ptr::copy` allows the ranges to overlap when both are the same chunk.
    unsafe { std::ptr::copy(src.map.as_ptr().add(s), dst.map.as_mut_ptr().add(d), len) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(pa: u64, len: usize) -> SharedChunk {
        let file = tempfile::tempfile().unwrap();
        file.set_len(len as u64).unwrap();
        SharedChunk::map_fd(&file, pa, len, true).unwrap()
    }

    #[test]
    fn reads_and_writes_are_addressed_by_pa() {
        let c = anon(0x10_0000_0000, 4096);
        c.write(0x10_0000_0010, b"neuron").unwrap();
        let mut buf = [0u8; 6];
        c.read(0x10_0000_0010, &mut buf).unwrap();
        assert_eq!(&buf, b"neuron");
        c.store_u32(0x10_0000_0100, 41, Ordering::Release).unwrap();
        assert_eq!(
            c.fetch_add_u32(0x10_0000_0100, 1, Ordering::AcqRel)
                .unwrap(),
            41
        );
        assert_eq!(c.load_u32(0x10_0000_0100, Ordering::Acquire).unwrap(), 42);
    }

    #[test]
    fn out_of_bounds_and_misaligned_accesses_are_refused() {
        let c = anon(0x1000, 4096);
        assert!(matches!(
            c.write(0x0FFF, b"x"),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.write(0x1FFF, b"xy"),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.read(u64::MAX, &mut [0u8; 2]),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.load_u32(0x1002, Ordering::Relaxed),
            Err(MemError::Misaligned { .. })
        ));
        assert!(matches!(
            c.load_u64(0x1FFC, Ordering::Relaxed),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(c.contains(0x1000, 4096));
        assert!(!c.contains(0x1000, 4097));
    }

    /// The pages are freed in the memfd itself (the memory the device gave up is gone,
    /// whoever else maps it), the mapping stays and reads zeros, and a later write works.
    #[test]
    fn a_discarded_chunk_frees_its_memfds_pages_and_stays_mapped() {
        use std::os::unix::fs::MetadataExt;
        let fd =
            nix::sys::memfd::memfd_create("discard", nix::sys::memfd::MFdFlags::empty()).unwrap();
        let file = std::fs::File::from(fd);
        file.set_len(64 * 1024).unwrap();
        let c = SharedChunk::map_fd(&file, 0x1000, 64 * 1024, true).unwrap();
        let other = SharedChunk::map_fd(&file, 0x1000, 64 * 1024, true).unwrap();
        c.fill(0x1000, 64 * 1024, 0xA5).unwrap();
        assert_eq!(
            file.metadata().unwrap().blocks(),
            128,
            "64 KiB in 512-byte blocks"
        );
        c.discard().unwrap();
        assert_eq!(file.metadata().unwrap().blocks(), 0);
        let mut buf = [1u8; 16];
        other.read(0x1000 + 4096, &mut buf).unwrap();
        assert_eq!(buf, [0; 16]);
        c.write(0x1000, b"again").unwrap();
        other.read(0x1000, &mut buf[..5]).unwrap();
        assert_eq!(&buf[..5], b"again");
        let read_only = SharedChunk::map_fd(&file, 0, 4096, false).unwrap();
        assert!(matches!(
            read_only.discard(),
            Err(MemError::ReadOnly { .. })
        ));
    }

    #[test]
    fn read_only_mappings_refuse_writes() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let c = SharedChunk::map_fd(&file, 0, 4096, false).unwrap();
        assert!(matches!(c.write(0, b"x"), Err(MemError::ReadOnly { .. })));
        assert!(matches!(
            c.store_u32(0, 1, Ordering::Relaxed),
            Err(MemError::ReadOnly { .. })
        ));
        assert_eq!(c.load_u32(0, Ordering::Relaxed).unwrap(), 0);
    }

    #[test]
    fn atomic_words_check_the_whole_range_once_and_alias_the_word_accessors() {
        let c = SharedChunk::anonymous(0x3000, 4096).unwrap();
        let w = c.atomic_words(0x3FE0, 4).unwrap();
        assert_eq!(w.len(), 4);
        w[1].fetch_add(9, Ordering::Relaxed);
        w[3].store(u64::MAX, Ordering::Relaxed);
        assert_eq!(c.load_u64(0x3FE8, Ordering::Relaxed).unwrap(), 9);
        assert_eq!(c.load_u64(0x3FF8, Ordering::Relaxed).unwrap(), u64::MAX);
        assert!(c.atomic_words(0x3000, 0).unwrap().is_empty());
        // One word past the end, a misaligned start, a length that overflows, a PA below.
        assert!(matches!(
            c.atomic_words(0x3FE0, 5),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.atomic_words(0x3004, 1),
            Err(MemError::Misaligned { .. })
        ));
        assert!(matches!(
            c.atomic_words(0x3000, usize::MAX / 4),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.atomic_words(0x2FF8, 1),
            Err(MemError::OutOfBounds { .. })
        ));
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let ro = SharedChunk::map_fd(&file, 0, 4096, false).unwrap();
        assert!(matches!(
            ro.atomic_words(0, 1),
            Err(MemError::ReadOnly { .. })
        ));
    }

    #[test]
    fn two_mappings_of_one_fd_see_each_other() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let a = SharedChunk::map_fd(&file, 0x4000, 8192, true).unwrap();
        let b = SharedChunk::map_fd(&file, 0x4000, 8192, true).unwrap();
        a.write_obj(0x5000, &0xDEAD_BEEF_u32).unwrap();
        assert_eq!(b.read_obj::<u32>(0x5000).unwrap(), 0xDEAD_BEEF);
    }

    #[test]
    fn u64_read_modify_writes_and_word_copies() {
        let c = SharedChunk::anonymous(0x2000, 4096).unwrap();
        assert_eq!(c.fetch_add_u64(0x2008, 5, Ordering::Relaxed).unwrap(), 0);
        assert_eq!(c.fetch_sub_u64(0x2008, 2, Ordering::Relaxed).unwrap(), 5);
        c.store_u64(0x2010, u64::MAX, Ordering::Relaxed).unwrap();
        assert_eq!(
            c.fetch_min_u64(0x2010, 7, Ordering::Relaxed).unwrap(),
            u64::MAX
        );
        assert_eq!(c.fetch_min_u64(0x2010, 9, Ordering::Relaxed).unwrap(), 7);
        assert_eq!(c.fetch_max_u64(0x2018, 9, Ordering::Relaxed).unwrap(), 0);
        assert_eq!(c.fetch_max_u64(0x2018, 3, Ordering::Relaxed).unwrap(), 9);
        let got: [u64; 3] = c.load_words(0x2008, Ordering::Relaxed).unwrap();
        assert_eq!(got, [3, 7, 9]);
        c.store_words(0x2100, &[1, 2], Ordering::Relaxed).unwrap();
        assert_eq!(
            c.load_words::<[u64; 2]>(0x2100, Ordering::Relaxed).unwrap(),
            [1, 2]
        );
        assert!(matches!(
            c.load_words::<[u64; 2]>(0x2004, Ordering::Relaxed),
            Err(MemError::Misaligned { .. })
        ));
        assert!(matches!(
            c.load_words::<[u32; 3]>(0x2000, Ordering::Relaxed),
            Err(MemError::Misaligned { .. })
        ));
        assert!(matches!(
            c.load_words::<[u64; 2]>(0x2ff8, Ordering::Relaxed),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            c.fetch_add_u64(0x2ffc, 1, Ordering::Relaxed),
            Err(MemError::OutOfBounds { .. })
        ));
        let file = tempfile::tempfile().unwrap();
        file.set_len(4096).unwrap();
        let ro = SharedChunk::map_fd(&file, 0, 4096, false).unwrap();
        assert!(matches!(
            ro.fetch_max_u64(0, 1, Ordering::Relaxed),
            Err(MemError::ReadOnly { .. })
        ));
        assert!(matches!(
            ro.store_words(0, &[1], Ordering::Relaxed),
            Err(MemError::ReadOnly { .. })
        ));
    }

    #[test]
    fn copy_moves_bytes_between_chunks_and_within_one() {
        let a = anon(0x1000, 4096);
        let b = anon(0x9000, 4096);
        a.write(0x1000, &[1, 2, 3, 4]).unwrap();
        copy(&a, 0x1000, &b, 0x9ffc, 4).unwrap();
        let mut out = [0u8; 4];
        b.read(0x9ffc, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
        copy(&a, 0x1000, &a, 0x1002, 4).unwrap();
        let mut out = [0u8; 6];
        a.read(0x1000, &mut out).unwrap();
        assert_eq!(
            out,
            [1, 2, 1, 2, 3, 4],
            "overlapping copy has memmove semantics"
        );
        assert!(copy(&a, 0x1000, &b, 0x9ffd, 4).is_err());
    }
}
