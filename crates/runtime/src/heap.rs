//! The live heap: a global-allocator wrapper that counts the bytes the program holds, so that
//! the metrics tell a leak (the live heap grows) from an allocator keeping freed pages for
//! reuse (resident memory grows, the live heap does not).
//!
//! A binary opts in by wrapping its allocator:
//! `#[global_allocator] static A: CountingAlloc<MiMalloc> = CountingAlloc(MiMalloc);`.
//! The cost is one relaxed atomic add per allocation and per free.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

/// Wraps a global allocator and counts the bytes allocated and not yet freed.
pub struct CountingAlloc<A>(pub A);

fn grew(bytes: usize) {
    if !COUNTING.load(Ordering::Relaxed) {
        COUNTING.store(true, Ordering::Relaxed);
    }
    LIVE.fetch_add(bytes, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the wrapped allocator unchanged; only counters are kept.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the wrapped allocator's.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { self.0.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            let old = layout.size();
            if new_size >= old {
                grew(new_size - old);
            } else {
                shrank(old - new_size);
            }
        }
        p
    }
}

/// Bytes allocated and not yet freed, if this program counts them ([`CountingAlloc`]).
pub fn live_bytes() -> Option<u64> {
    COUNTING
        .load(Ordering::Relaxed)
        .then(|| LIVE.load(Ordering::Relaxed) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    #[test]
    fn counts_what_is_held_through_alloc_realloc_and_free() {
        let a = CountingAlloc(System);
        let before = LIVE.load(Ordering::Relaxed);
        let held = || LIVE.load(Ordering::Relaxed).wrapping_sub(before);
        let layout = Layout::from_size_align(1000, 8).unwrap();
        // SAFETY: a non-zero layout; the pointer is freed with the layout it has.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(held(), 1000);
            let q = a.realloc(p, layout, 3000);
            assert_eq!(held(), 3000);
            let q = a.realloc(q, Layout::from_size_align(3000, 8).unwrap(), 10);
            assert_eq!(held(), 10);
            a.dealloc(q, Layout::from_size_align(10, 8).unwrap());
        }
        assert_eq!(held(), 0);
        assert!(live_bytes().is_some());
    }
}
