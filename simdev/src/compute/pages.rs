//! The zeroed byte buffer of an NC's SBUF or PSUM: an anonymous mapping of its own, aligned
//! to 2 MiB and advised as transparent huge pages (`MADV_HUGEPAGE`).
//!
//! Every op walks a tile down its partitions, which lie a little more than 64 KiB (SBUF) or
//! 16 KiB (PSUM) apart: a tile of 120 partitions touches 120 small pages, more than the CPU's
//! first-level TLB holds, and each miss is a page walk (two-dimensional in a virtual machine).
//! On huge pages the whole SBUF is five TLB entries. The kernel may still answer with small
//! pages (THP disabled, no free huge page): only the speed differs, never a value. A buffer
//! the mapping cannot provide is an allocation failure, as `vec![0; len]` would be. The price:
//! an NC that computes holds its whole SBUF (8 MiB) and PSUM (2 MiB), with their padding, in
//! memory once it touches them, where small pages held only the pages touched.
//!
//! The mapping (`memmap2`) reserves one huge page more than the buffer needs and the buffer
//! starts at the first 2 MiB boundary inside it; the slack before and after is never touched,
//! so it costs address space only.

use std::alloc::{Layout, handle_alloc_error};

use memmap2::{Advice, MmapMut};

/// A huge page.
const HUGE: usize = 2 << 20;

/// `len` zeroed bytes of their own anonymous mapping (see the module doc), unmapped on drop.
///
/// # Invariants
/// `offset + len <= map.len()`, `offset` is where the mapping crosses its first `HUGE`
/// boundary, and `len > 0`.
pub(super) struct Pages {
    map: MmapMut,
    offset: usize,
    len: usize,
}

impl Pages {
    /// `len` zeroed bytes (`len` is at least one byte: an empty buffer is rounded to one).
    pub(super) fn zeroed(len: usize) -> Self {
        let len = len.max(1);
        let fail =
            || -> ! { handle_alloc_error(Layout::array::<u8>(len).unwrap_or(Layout::new::<u8>())) };
        let Some((huge_len, reserve)) = len
            .checked_next_multiple_of(HUGE)
            .and_then(|m| Some((m, m.checked_add(HUGE)?)))
        else {
            fail()
        };
        let Ok(map) = MmapMut::map_anon(reserve) else {
            fail()
        };
        let at = map.as_ptr() as usize;
        let offset = at.next_multiple_of(HUGE) - at;
        // Only advice: refused (THP disabled), the pages stay small.
        let _ = map.advise_range(Advice::HugePage, offset, huge_len);
        Self { map, offset, len }
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
        // Always `Some` (the type's invariant); the empty slice is never seen.
        self.map
            .get(self.offset..self.offset + self.len)
            .unwrap_or_default()
    }
}

impl std::ops::DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        let range = self.offset..self.offset + self.len;
        self.map.get_mut(range).unwrap_or_default()
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
