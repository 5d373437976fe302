//! Hints to the processor: the frame the next event acts on was filed tens of
//! milliseconds of virtual time (millions of events) earlier, so its record has left the
//! caches; asking for it while the current event runs hides most of that miss (a lossy
//! 1,024-worker simulation spent a twentieth of its time waiting for these records).

use super::{InFlight, Sim};
use crate::queue::Event;

impl Sim<'_> {
    /// Starts loading the in-flight record of the frame the next event in the queue's
    /// window delivers or lands (a hint: nothing is read, and a wrong guess costs nothing).
    #[inline(always)]
    pub(super) fn prefetch_next(&self) {
        if let Some(Event::Arrive(slot) | Event::Deliver(slot)) = self.queue.peek_in_window() {
            if let Some(frame) = self.frames.get(slot) {
                prefetch_record(frame);
            }
        }
    }
}

/// Asks for the cache lines of `record`.
#[inline(always)]
fn prefetch_record(record: &Option<InFlight>) {
    let start = (record as *const Option<InFlight>).cast::<i8>();
    let size = std::mem::size_of::<Option<InFlight>>();
    for offset in (0..size).step_by(64) {
        prefetch_line(start.wrapping_add(offset));
    }
}

/// Asks for the cache line at `at` (any address: a prefetch never faults).
#[inline(always)]
fn prefetch_line(at: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is a hint: it reads nothing into the program and never faults,
    // whatever the address; SSE, which it needs, is part of x86_64's baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
