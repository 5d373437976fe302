//! Buffers kept for reuse by the ResNet kernels: a fresh buffer for every activation and
//! gradient was zeroed each time (a tenth of a step's cycles went to `memset` and page
//! faults). A buffer taken from here holds stale values: every user writes each value it
//! later reads.

use std::sync::Mutex;

/// Buffers given back and not yet taken again.
static KEPT: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());

/// At most this many buffers are kept: more than a training step uses (with 48, the
/// first block of a stage in the backward pass found none of its size and allocated).
const MAX_KEPT: usize = 256;

/// A buffer of `len` values, their contents unspecified: the smallest kept one that holds
/// them (a new one if none does).
pub fn take(len: usize) -> Vec<f32> {
    let kept = KEPT.lock().ok().and_then(|mut kept| {
        let best = kept
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        Some(kept.swap_remove(best))
    });
    let mut buffer = kept.unwrap_or_default();
    if buffer.len() >= len {
        buffer.truncate(len);
    } else {
        buffer.resize(len, 0.0);
    }
    buffer
}

/// Keeps `buffer` for a later [`take`] (drops it when enough are kept).
pub fn give_back(buffer: Vec<f32>) {
    if buffer.capacity() == 0 {
        return;
    }
    if let Ok(mut kept) = KEPT.lock() {
        if kept.len() < MAX_KEPT {
            kept.push(buffer);
        }
    }
}
