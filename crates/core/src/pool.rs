//! Buffers kept for reuse, and no more of them than the work in flight needs.
//!
//! A pool that only ever grows keeps its high-water mark: a burst (a step whose frames all
//! wait behind a slow link, every worker's share of every key in flight at once) leaves
//! buffers behind that nothing needs again, and a buffer grown for the largest use keeps its
//! capacity when it is next taken for a small one. [`Pool`] hands out a kept buffer that
//! fits (holds the values, at most twice over) and, at each [`Pool::trim`], drops the
//! buffers that no take reached since the last trim: the pool follows the live need of the
//! last period, not of the worst one.

use std::collections::BTreeMap;

/// Buffers of `T` kept for reuse: [`Pool::take`] hands one out, [`Pool::give`] takes one
/// back, [`Pool::trim`] drops those not needed since the last trim.
#[derive(Debug, Clone)]
pub struct Pool<T> {
    /// The kept buffers by capacity, so a take that needs a size finds it in log time
    /// however many buffers of other sizes are kept (a server keeps one per worker share).
    by_capacity: BTreeMap<usize, Kept<T>>,
    /// The capacity of the buffer given back last: where [`Pool::take`] looks first.
    last_given: usize,
}

/// The kept buffers of one capacity, the oldest first.
#[derive(Debug, Clone)]
struct Kept<T> {
    buffers: Vec<Vec<T>>,
    /// How many of the oldest no take has reached since the last trim.
    untouched: usize,
}

impl<T> Kept<T> {
    /// The buffer given back last (no more of the oldest stay untouched than remain).
    fn pop(&mut self) -> Option<Vec<T>> {
        let b = self.buffers.pop()?;
        self.untouched = self.untouched.min(self.buffers.len());
        Some(b)
    }
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self {
            by_capacity: BTreeMap::new(),
            last_given: 0,
        }
    }
}

impl<T> Pool<T> {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer: one of the capacity given back last, else the largest kept, else a
    /// new one.
    pub fn take(&mut self) -> Vec<T> {
        let capacity = if self.by_capacity.contains_key(&self.last_given) {
            Some(self.last_given)
        } else {
            self.by_capacity.keys().next_back().copied()
        };
        capacity.and_then(|c| self.pop(c)).unwrap_or_default()
    }

    /// An empty buffer for `len` values: the smallest kept one that holds them, if it is
    /// at most twice as large (a buffer of the largest use would otherwise serve every
    /// small one, and the next large use would grow another), else a new one of that
    /// capacity. A kept buffer that fits no use is dropped at a trim.
    pub fn take_for(&mut self, len: usize) -> Vec<T> {
        let most = len.saturating_mul(2);
        let fits = self.by_capacity.range(len..=most).next().map(|(&c, _)| c);
        fits.and_then(|c| self.pop(c))
            .unwrap_or_else(|| Vec::with_capacity(len))
    }

    /// The last kept buffer of capacity `capacity`.
    fn pop(&mut self, capacity: usize) -> Option<Vec<T>> {
        let kept = self.by_capacity.get_mut(&capacity)?;
        let b = kept.pop();
        if kept.buffers.is_empty() {
            self.by_capacity.remove(&capacity);
        }
        b
    }

    /// Keeps `buffer` (emptied) for reuse.
    pub fn give(&mut self, mut buffer: Vec<T>) {
        buffer.clear();
        self.last_given = buffer.capacity();
        let kept = self.by_capacity.entry(buffer.capacity()).or_insert(Kept {
            buffers: Vec::new(),
            untouched: 0,
        });
        kept.buffers.push(buffer);
    }

    /// Drops the kept buffers that no take has reached since the last trim (the work of
    /// that period never needed them), and starts the next period. Call it once a period
    /// that spans the work's cycle (a step, a second).
    pub fn trim(&mut self) {
        self.by_capacity.retain(|_, kept| {
            kept.buffers.drain(..kept.untouched);
            kept.untouched = kept.buffers.len();
            !kept.buffers.is_empty()
        });
    }

    /// How many buffers are kept.
    pub fn len(&self) -> usize {
        self.by_capacity.values().map(|k| k.buffers.len()).sum()
    }

    /// Whether no buffer is kept.
    pub fn is_empty(&self) -> bool {
        self.by_capacity.is_empty()
    }

    /// Bytes the kept buffers hold (their capacity).
    pub fn bytes(&self) -> usize {
        (self.by_capacity.iter())
            .map(|(&c, k)| c * k.buffers.len() * std::mem::size_of::<T>())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_dropped_once_a_period_passes_without_it() {
        let mut pool: Pool<u8> = Pool::new();
        let fill = |b: &mut Vec<u8>| b.resize(1000, 7);
        // A burst: 50 buffers in use at once, then all returned.
        let burst: Vec<Vec<u8>> = (0..50)
            .map(|_| {
                let mut b = pool.take();
                fill(&mut b);
                b
            })
            .collect();
        burst.into_iter().for_each(|b| pool.give(b));
        assert_eq!(pool.len(), 50);
        pool.trim();
        // Then steady work: two buffers in use at a time, over several periods.
        for _ in 0..3 {
            for _ in 0..10 {
                let (mut a, mut b) = (pool.take(), pool.take());
                fill(&mut a);
                fill(&mut b);
                pool.give(a);
                pool.give(b);
            }
            pool.trim();
        }
        assert_eq!(pool.len(), 2, "the pool keeps the live need, not the burst");
        assert!(
            pool.bytes() >= 2000 && pool.bytes() < 4000,
            "{}",
            pool.bytes()
        );
    }

    #[test]
    fn a_period_that_uses_every_buffer_keeps_them_all() {
        let mut pool: Pool<u8> = Pool::new();
        for _ in 0..3 {
            let held: Vec<Vec<u8>> = (0..5).map(|_| pool.take()).collect();
            held.into_iter().for_each(|b| pool.give(b));
            pool.trim();
        }
        assert_eq!(pool.len(), 5);
    }

    #[test]
    fn buffers_keep_the_size_of_their_use() {
        // Shares of 10 and of 100,000 values, taken and returned in turn: taking one that
        // fits keeps one buffer of each size, where taking the last kept one grows both to
        // the largest.
        let mut pool: Pool<f32> = Pool::new();
        for _ in 0..20 {
            let mut small = pool.take_for(10);
            small.resize(10, 0.0);
            let mut large = pool.take_for(100_000);
            large.resize(100_000, 0.0);
            pool.give(small);
            pool.give(large);
            pool.trim();
        }
        assert_eq!(pool.len(), 2);
        assert!(pool.bytes() < 100_100 * 4, "{}", pool.bytes());
    }

    #[test]
    fn take_for_hands_out_the_smallest_that_fits() {
        let mut pool: Pool<u8> = Pool::new();
        for c in [400, 150, 50, 100, 100] {
            pool.give(Vec::with_capacity(c));
        }
        assert_eq!(pool.take_for(90).capacity(), 100);
        assert_eq!(pool.take_for(120).capacity(), 150);
        assert_eq!(pool.take_for(300).capacity(), 400);
        assert_eq!(pool.take_for(30).capacity(), 50);
        assert_eq!(
            pool.take_for(500).capacity(),
            500,
            "none kept fits: a new one"
        );
        assert_eq!(pool.len(), 1);
        assert_eq!(pool.take().capacity(), 100);
        assert!(pool.is_empty());
    }

    #[test]
    fn take_for_makes_a_new_buffer_when_none_fits() {
        let mut pool: Pool<f32> = Pool::new();
        pool.give(Vec::with_capacity(10));
        pool.give(Vec::with_capacity(1000));
        // Too small, and too large: a new one; both stay kept until a trim.
        let b = pool.take_for(100);
        assert!(b.capacity() >= 100 && b.capacity() < 1000 && b.is_empty());
        assert_eq!(pool.len(), 2);
        let c = pool.take_for(600);
        assert_eq!(c.capacity(), 1000);
        pool.trim();
        assert_eq!(pool.len(), 1, "the buffer no take reached is dropped");
    }
}
