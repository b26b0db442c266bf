//! The zeroed byte buffer of an NC's SBUF or PSUM: an anonymous mapping of its own, aligned
//! to 2 MiB and advised as transparent huge pages (`MADV_HUGEPAGE`).
//!
//! Every op walks a tile down its partitions, which lie 64 KiB (SBUF) or 16 KiB (PSUM) apart:
//! a tile of 120 partitions touches 120 small pages, more than the CPU's first-level TLB
//! holds, and each miss is a page walk (two-dimensional in a virtual machine). On huge pages
//! the whole SBUF is five TLB entries. The kernel may still answer with small pages (THP
//! disabled, no free huge page): only the speed differs, never a value. A buffer the mapping
//! cannot provide is an allocation failure, as `vec![0; len]` would be. The price: an NC that
//! computes holds its whole SBUF (8 MiB) and PSUM (2 MiB) in memory once it touches them,
//! where small pages held only the pages touched.

use std::alloc::{Layout, handle_alloc_error};
use std::ptr::NonNull;

/// A huge page.
const HUGE: usize = 2 << 20;

/// `len` zeroed bytes of their own anonymous mapping (see the module doc), unmapped on drop.
pub(super) struct Pages {
    /// The first byte, `HUGE`-aligned.
    ptr: NonNull<u8>,
    /// Bytes the slice covers (> 0).
    len: usize,
    /// Bytes mapped from `ptr` (`len` rounded up to `HUGE`).
    mapped: usize,
}

// SAFETY: `Pages` owns its mapping exclusively (like a `Box<[u8]>`): moving it to another
// thread moves that ownership.
unsafe impl Send for Pages {}
// SAFETY: as above: a shared reference gives only `&[u8]`.
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` zeroed bytes (`len` is at least one byte: an empty buffer is rounded to one).
    pub(super) fn zeroed(len: usize) -> Self {
        let len = len.max(1);
        let fail = || handle_alloc_error(Layout::array::<u8>(len).unwrap_or(Layout::new::<u8>()));
        let Some((mapped, reserve)) = len
            .checked_next_multiple_of(HUGE)
            .and_then(|m| Some((m, m.checked_add(HUGE)?)))
        else {
            fail()
        };
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses: it
        // touches no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            fail();
        }
        let base = base.cast::<u8>();
        // The slack before the first huge-page boundary and after `mapped` bytes from it.
        let head = (base as usize).next_multiple_of(HUGE) - base as usize;
        let tail = reserve - head - mapped;
        // SAFETY: `head + mapped + tail == reserve`: every range below lies in the mapping
        // just made, which nothing else uses; the middle `mapped` bytes stay mapped. The
        // advice is only advice: refused, the pages stay small.
        let ptr = unsafe {
            let ptr = base.add(head);
            if head > 0 {
                libc::munmap(base.cast(), head);
            }
            if tail > 0 {
                libc::munmap(ptr.add(mapped).cast(), tail);
            }
            libc::madvise(ptr.cast(), mapped, libc::MADV_HUGEPAGE);
            ptr
        };
        match NonNull::new(ptr) {
            Some(ptr) => Self { ptr, len, mapped },
            None => fail(),
        }
    }
}

impl Clone for Pages {
    fn clone(&self) -> Self {
        let mut copy = Self::zeroed(self.len);
        copy.copy_from_slice(self);
        copy
    }
}

impl std::ops::Deref for Pages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` ≤ `mapped` bytes (zeroed by the kernel, written
        // only through `deref_mut` since) for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`; `&mut self` makes the slice the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + mapped` is the mapping `zeroed` kept, no longer referenced.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zeroed, `len` bytes long, starting on a huge-page boundary; every byte writable (the
    /// last too); a clone is its own mapping with the same bytes.
    #[test]
    fn pages_are_zeroed_aligned_to_a_huge_page_and_cloned_into_their_own_mapping() {
        for len in [2, 4096, HUGE, HUGE + 1, 128 * (65536 + 64)] {
            let mut p = Pages::zeroed(len);
            assert_eq!(p.len(), len);
            assert_eq!(p.as_ptr() as usize % HUGE, 0, "{len}");
            assert!(p.iter().all(|&b| b == 0), "{len}");
            p[len - 1] = 7;
            p[0] = 3;
            let c = p.clone();
            assert_ne!(c.as_ptr(), p.as_ptr());
            assert_eq!(&c[..], &p[..]);
            drop(p);
            assert_eq!((c[0], c[len - 1]), (3, 7));
        }
    }
}
