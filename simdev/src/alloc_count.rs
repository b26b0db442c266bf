//! A counting global allocator for simdev's unit tests: it counts the allocations (and
//! reallocations) made by the current thread while that thread is [`counting`], so a test can
//! assert that a steady-state path allocates nothing, however many other tests run in parallel
//! on other threads. Allocation counts are deterministic; nothing here measures time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Whether this thread counts, and its count (const-initialised, no destructor: reading
    /// them never allocates, so the allocator may use them).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Delegates to the system allocator and counts this thread's allocations while it counts.
struct CountingAlloc;

fn count_one() {
    // `try_with`: during thread teardown the slots may be gone; such allocations are not the
    // test's.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every call is delegated unchanged to the system allocator; only a thread-local
// counter (which never allocates) is added.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: as above, for `alloc_zeroed`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above, for `dealloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: as above, for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `f` on this thread and returns its result with the allocations it made on this thread.
pub fn counting<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = COUNT.with(Cell::get);
    COUNTING.with(|on| on.set(true));
    let out = f();
    COUNTING.with(|on| on.set(false));
    (out, COUNT.with(Cell::get) - before)
}

#[test]
fn the_counter_counts_this_threads_allocations_only() {
    let (v, n) = counting(|| std::hint::black_box(vec![0u8; 64]));
    assert_eq!(n, 1);
    drop(v);
    let (_, n) = counting(|| {
        std::thread::spawn(|| std::hint::black_box(vec![0u8; 64]).len())
            .join()
            .unwrap()
    });
    assert!(n >= 1, "spawning allocates on this thread");
    let (_, none) = counting(|| std::hint::black_box(1 + 1));
    assert_eq!(none, 0);
}
