//! Pushes that reach a parameter server before their turn in its rank-order sum, held until
//! the pushes of every lower rank are added. The table says, per owned slice and worker, in
//! four bytes, where such a push waits; the pushes themselves live in a slab whose buffers
//! are reused. With a thousand workers most pushes come early, and a table of full entries
//! (32 bytes each) was a stream of cache misses through tens of megabytes a step.

use crate::pool::Pool;

/// No push waiting.
const NONE: u32 = u32::MAX;

/// A waiting push: its values and whether all of them are in.
#[derive(Debug, Clone, Default)]
struct Waiting {
    values: Vec<f32>,
    complete: bool,
}

/// The early pushes of one server.
#[derive(Debug, Clone, Default)]
pub(super) struct EarlyPushes {
    /// Per slice, per worker: the push's place in `waiting`, or [`NONE`] (empty for the
    /// slices another server owns).
    at: Vec<Vec<u32>>,
    waiting: Vec<Waiting>,
    /// Places in `waiting` free for the next early push.
    free: Vec<u32>,
    /// The freed places' buffers, each taken again for a push of about its size (a buffer
    /// taken by whichever push came next would end at the largest slice's size).
    buffers: Pool<f32>,
}

impl EarlyPushes {
    /// A table for slices with `workers_of(slice)` workers each (0 for slices not owned).
    pub fn new(workers_per_slice: impl Iterator<Item = usize>) -> Self {
        Self {
            at: workers_per_slice.map(|n| vec![NONE; n]).collect(),
            ..Self::default()
        }
    }

    fn place(&self, slice: usize, link: usize) -> Option<usize> {
        let at = *self.at.get(slice)?.get(link)?;
        (at != NONE).then_some(at as usize)
    }

    /// Whether a push of `link` to `slice` waits (arriving or complete).
    pub fn holds(&self, slice: usize, link: usize) -> bool {
        self.place(slice, link).is_some()
    }

    /// Whether the push of `link` to `slice` waits with all its values in.
    pub fn holds_complete(&self, slice: usize, link: usize) -> bool {
        self.place(slice, link)
            .is_some_and(|i| self.waiting[i].complete)
    }

    /// The buffer of `len` values the push of `link` to `slice` arrives into: the one it
    /// was given, or a new one. `None` if the slice has no such worker.
    pub fn buffer(&mut self, slice: usize, link: usize, len: usize) -> Option<&mut [f32]> {
        let i = match self.place(slice, link) {
            Some(i) => i,
            None => {
                let entry = self.at.get_mut(slice)?.get_mut(link)?;
                let i = match self.free.pop() {
                    Some(i) => i as usize,
                    None => {
                        self.waiting.push(Waiting::default());
                        self.waiting.len() - 1
                    }
                };
                *entry = u32::try_from(i).ok()?;
                let w = &mut self.waiting[i];
                w.values = self.buffers.take_for(len);
                w.values.resize(len, 0.0);
                w.complete = false;
                i
            }
        };
        Some(self.waiting[i].values.as_mut_slice())
    }

    /// All of the waiting push of `link` to `slice` is in; false if none waits.
    pub fn complete(&mut self, slice: usize, link: usize) -> bool {
        match self.place(slice, link) {
            Some(i) => {
                self.waiting[i].complete = true;
                true
            }
            None => false,
        }
    }

    /// The values of the waiting push of `link` to `slice` (empty if none).
    pub fn values(&self, slice: usize, link: usize) -> &[f32] {
        self.place(slice, link)
            .map_or(&[], |i| self.waiting[i].values.as_slice())
    }

    /// Forgets the waiting push of `link` to `slice`, keeping its buffer for another.
    pub fn release(&mut self, slice: usize, link: usize) {
        if let Some(i) = self.place(slice, link) {
            self.at[slice][link] = NONE;
            self.free.push(i as u32);
            self.buffers
                .give(std::mem::take(&mut self.waiting[i].values));
        }
    }

    /// Bytes the freed places' buffers hold.
    pub fn pooled_bytes(&self) -> usize {
        self.buffers.bytes()
    }

    /// Drops the kept buffers no early push has needed since the last call (once a step).
    pub fn trim(&mut self) {
        self.buffers.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_wait_complete_and_free_their_place() {
        let mut early = EarlyPushes::new([3, 0].into_iter());
        assert!(!early.holds(0, 1));
        assert!(
            early.buffer(1, 0, 2).is_none(),
            "slice 1 has no workers here"
        );
        assert!(early.buffer(0, 3, 2).is_none(), "no worker 3");
        early.buffer(0, 1, 2).unwrap().copy_from_slice(&[1.0, 2.0]);
        early.buffer(0, 2, 2).unwrap()[0] = 5.0;
        assert!(early.holds(0, 1) && !early.holds_complete(0, 1));
        assert_eq!(
            early.buffer(0, 1, 2).unwrap(),
            &[1.0, 2.0],
            "the same buffer again"
        );
        assert!(early.complete(0, 1));
        assert!(!early.complete(0, 0), "nothing waits for worker 0");
        assert!(early.holds_complete(0, 1));
        assert_eq!(early.values(0, 1), &[1.0, 2.0]);
        early.release(0, 1);
        assert!(!early.holds(0, 1));
        assert_eq!(early.values(0, 1), &[] as &[f32]);
        // The freed place is reused, zeroed and sized afresh.
        assert_eq!(early.buffer(0, 0, 3).unwrap(), &[0.0, 0.0, 0.0]);
        assert_eq!(early.waiting.len(), 2);
        assert_eq!(early.values(0, 2), &[5.0, 0.0]);
    }

    /// One large and four small slices, pushed early every step and released in an order
    /// that moves on each step: the buffers kept are of the pushes' sizes, not all of the
    /// largest slice's.
    #[test]
    fn freed_buffers_keep_the_size_of_their_use() {
        let sizes = [1000, 10, 10, 10, 10];
        let n = sizes.len();
        let mut early = EarlyPushes::new(sizes.iter().map(|_| 2));
        for step in 0..10 {
            for (slice, &len) in sizes.iter().enumerate() {
                early.buffer(slice, 1, len).unwrap();
            }
            for k in 0..n {
                early.release((k + step) % n, 1);
            }
            early.trim();
        }
        let held: usize = early.waiting.iter().map(|w| w.values.capacity()).sum();
        let kept = held + early.buffers.bytes() / std::mem::size_of::<f32>();
        let need: usize = sizes.iter().sum();
        assert!(kept <= 2 * need, "{kept} values kept for pushes of {need}");
    }
}
