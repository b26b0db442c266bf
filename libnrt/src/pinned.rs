//! `nrt.h`'s pinned host buffers (runtime 2.34.10): `nrt_pinned_malloc(size, type)` and
//! `nrt_pinned_free(ptr)`.
//!
//! A buffer is an anonymous mapping of its own, locked in memory (`mlock`: "pinned"), kept in
//! a registry by address until freed; nothing else in this library needs it pinned (simdev
//! copies through shared memory), so a buffer the process may not lock (`RLIMIT_MEMLOCK`) is
//! still returned, unlocked, with a warning, and so is a huge-page buffer when the system has
//! no huge pages of that size reserved (`/proc/sys/vm/nr_hugepages`; most laptops): then it
//! is ordinary memory aligned to 2 MiB and advised as transparent huge pages. A laptop runs
//! the code written for an instance; the log says what it got.
//!
//! Every failure answers NULL and logs why: a size of 0, a type outside the enum, a size the
//! mapping cannot provide. `nrt_pinned_free` of NULL does nothing; of a pointer this library
//! did not return (or freed already) it logs an error and does nothing else.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use memmap2::{Advice, MmapMut, MmapOptions};
use runtime::NrtError;
use shared::NrtStatus;

use crate::boundary;

/// `nrt_pinned_alloc_type_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PinnedAllocType {
    /// `NRT_PINNED_ALLOC_TYPE_MALLOC`: page-aligned.
    Malloc = 0,
    /// `NRT_PINNED_ALLOC_TYPE_HUGEPAGE_2M`: on 2 MiB pages, the size rounded up to them.
    Hugepage2M = 1,
    /// `NRT_PINNED_ALLOC_TYPE_HUGEPAGE_1G`: on 1 GiB pages, the size rounded up to them.
    Hugepage1G = 2,
}

impl PinnedAllocType {
    fn from_c(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::Malloc),
            1 => Some(Self::Hugepage2M),
            2 => Some(Self::Hugepage1G),
            _ => None,
        }
    }

    /// log2 of the huge page size, `None` for small pages.
    fn huge_bits(self) -> Option<u8> {
        match self {
            Self::Malloc => None,
            Self::Hugepage2M => Some(21),
            Self::Hugepage1G => Some(30),
        }
    }
}

/// 2 MiB: the alignment of a huge-page buffer that fell back to ordinary pages.
const TWO_MIB: usize = 2 << 20;

/// A live buffer: its mapping (unmapped on drop).
struct Pinned {
    _map: MmapMut,
}

/// The live buffers by the address returned.
static BUFFERS: Mutex<BTreeMap<usize, Pinned>> = Mutex::new(BTreeMap::new());

/// Warns once per `flag` (a program allocating many buffers says it once).
fn warn_once(flag: &AtomicBool, message: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!("{}", message());
    }
}

/// A mapping of `len` bytes, failing with NRT_RESOURCE naming the request.
fn map(options: &MmapOptions, what: &str) -> Result<MmapMut, NrtError> {
    options
        .map_anon()
        .map_err(|e| NrtError::new(NrtStatus::Resource, format!("mapping {what}: {e}")))
}

/// The buffer for `size` bytes of `ty`: its mapping and where the buffer starts in it.
fn allocate(size: usize, ty: PinnedAllocType) -> Result<(MmapMut, usize), NrtError> {
    let Some(bits) = ty.huge_bits() else {
        let map = map(MmapOptions::new().len(size), &format!("{size} bytes"))?;
        return Ok((map, 0));
    };
    let page = 1usize << bits;
    let len = size.checked_next_multiple_of(page).ok_or_else(|| {
        NrtError::new(
            NrtStatus::Resource,
            format!("{size} bytes rounded up to {ty:?} pages overflow"),
        )
    })?;
    if let Ok(map) = MmapOptions::new().len(len).huge(Some(bits)).map_anon() {
        return Ok((map, 0));
    }
    static FELL_BACK: AtomicBool = AtomicBool::new(false);
    warn_once(&FELL_BACK, || {
        format!(
            "nrt_pinned_malloc: no {ty:?} huge pages reserved on this system \
             (/proc/sys/vm/nr_hugepages, hugetlbfs): the buffer is ordinary memory aligned to \
             2 MiB and advised as transparent huge pages"
        )
    });
    // One 2 MiB page more than the buffer, which starts at the first 2 MiB boundary in it.
    let padded = len
        .checked_add(TWO_MIB)
        .ok_or_else(|| NrtError::new(NrtStatus::Resource, format!("{size} bytes overflow")))?;
    let map = map(MmapOptions::new().len(padded), &format!("{len} bytes"))?;
    let start = (map.as_ptr() as usize).next_multiple_of(TWO_MIB) - map.as_ptr() as usize;
    // Advice only: the kernel may still use small pages.
    let _ = map.advise_range(Advice::HugePage, start, len);
    Ok((map, start))
}

/// `nrt_pinned_malloc`: `size` bytes of pinned host memory of `type` (see the module doc);
/// NULL, logged, for a size of 0, a type outside `nrt_pinned_alloc_type_t` or a size the
/// system cannot map. Callable at any time (no `nrt_init` needed).
#[unsafe(no_mangle)]
pub extern "C" fn nrt_pinned_malloc(size: usize, r#type: u32) -> *mut c_void {
    boundary::value("nrt_pinned_malloc", std::ptr::null_mut(), || {
        let Some(ty) = PinnedAllocType::from_c(r#type) else {
            return Err(NrtError::new(
                NrtStatus::Invalid,
                format!(
                    "type {type} is not a nrt_pinned_alloc_type_t (MALLOC 0, HUGEPAGE_2M 1, \
                     HUGEPAGE_1G 2)",
                    type = r#type
                ),
            ));
        };
        if size == 0 {
            return Err(NrtError::new(NrtStatus::Invalid, "size 0"));
        }
        let (mut map, start) = allocate(size, ty)?;
        if let Err(e) = map.lock() {
            static UNLOCKED: AtomicBool = AtomicBool::new(false);
            warn_once(&UNLOCKED, || {
                format!(
                    "nrt_pinned_malloc: could not lock {size} bytes in memory ({e}; raise \
                     RLIMIT_MEMLOCK, `ulimit -l`): returning them unlocked"
                )
            });
        }
        let ptr = map.as_mut_ptr().wrapping_add(start).cast::<c_void>();
        BUFFERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ptr as usize, Pinned { _map: map });
        Ok(ptr)
    })
}

/// `nrt_pinned_free`: frees a buffer `nrt_pinned_malloc` returned. NULL does nothing; any
/// other pointer (never returned, or freed already) is logged and left alone.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_pinned_free(ptr: *mut c_void) {
    boundary::value("nrt_pinned_free", (), || {
        if ptr.is_null() {
            return Ok(());
        }
        let freed = BUFFERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(ptr as usize));
        match freed {
            Some(buffer) => {
                drop(buffer);
                Ok(())
            }
            None => Err(NrtError::new(
                NrtStatus::Invalid,
                format!("{ptr:p} is not a buffer nrt_pinned_malloc returned (or it was freed)"),
            )),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alloc_type_values_are_libnrts() {
        assert_eq!(PinnedAllocType::Malloc as u32, 0);
        assert_eq!(PinnedAllocType::Hugepage2M as u32, 1);
        assert_eq!(PinnedAllocType::Hugepage1G as u32, 2);
        assert_eq!(PinnedAllocType::from_c(3), None);
    }

    #[test]
    fn buffers_are_writable_aligned_and_freed_once() {
        for (ty, align) in [(0, 4096), (1, TWO_MIB)] {
            let p = nrt_pinned_malloc(5000, ty);
            assert!(!p.is_null(), "type {ty}");
            assert_eq!(p as usize % align, 0, "type {ty}");
            assert!(BUFFERS.lock().unwrap().contains_key(&(p as usize)));
            nrt_pinned_free(p);
            assert!(!BUFFERS.lock().unwrap().contains_key(&(p as usize)));
            // A second free is refused (logged), not a crash.
            nrt_pinned_free(p);
        }
        assert!(nrt_pinned_malloc(0, 0).is_null());
        assert!(nrt_pinned_malloc(16, 3).is_null());
        assert!(nrt_pinned_malloc(usize::MAX, 0).is_null());
        assert!(nrt_pinned_malloc(usize::MAX - 4096, 1).is_null());
        nrt_pinned_free(std::ptr::null_mut());
    }
}
