//! What the ring strategies share (ring all-reduce, ring reduce and step-wise averaging,
//! DLCP over the ring): a worker's neighbours on the ring, where each key's values sit in
//! the buckets, and the count of frames lent to the driver.

use std::ops::Range;

use super::bucket::Buckets;
use super::{Rank, Transmit};
use crate::registry::KeyInfo;
use crate::wire::Header;

/// The left-hand neighbour of `rank` on a ring of `n` (frames come from it).
pub(crate) fn left_of(rank: Rank, n: usize) -> Rank {
    (rank + n - 1) % n
}

/// The right-hand neighbour of `rank` on a ring of `n` (frames go to it).
pub(crate) fn right_of(rank: Rank, n: usize) -> Rank {
    (rank + 1) % n
}

/// The ranks `rank` is linked to on a ring of `workers`: both neighbours, once each (none
/// with one worker, one with two).
pub(crate) fn neighbours(workers: usize, rank: Rank) -> Vec<Rank> {
    if workers < 2 {
        return Vec::new();
    }
    let mut p = vec![left_of(rank, workers), right_of(rank, workers)];
    p.sort_unstable();
    p.dedup();
    p
}

/// Where every key's values sit in the buckets: its bucket and range there.
#[derive(Debug, Clone)]
pub(crate) struct KeySlots {
    /// Per key: its bucket, its offset in the bucket and its length.
    slots: Vec<(usize, usize, usize)>,
}

impl KeySlots {
    /// The slots of `keys` as `fill` placed them.
    pub fn new(keys: &[KeyInfo], fill: &Buckets) -> Self {
        let slots = keys
            .iter()
            .zip(&fill.place)
            .map(|(k, &(bucket, offset))| (bucket, offset, k.numel))
            .collect();
        Self { slots }
    }

    /// Key `key`'s bucket and offset in it.
    pub fn place(&self, key: usize) -> Option<(usize, usize)> {
        self.slots.get(key).map(|&(b, off, _)| (b, off))
    }

    /// Key `key`'s length in values.
    pub fn len(&self, key: usize) -> Option<usize> {
        self.slots.get(key).map(|&(_, _, len)| len)
    }

    /// Key `key`'s bucket and its range of values there.
    pub fn range(&self, key: usize) -> Option<(usize, Range<usize>)> {
        self.slots
            .get(key)
            .map(|&(b, off, len)| (b, off..off + len))
    }

    /// Key `key`'s values in the buckets `data` (empty if there is no such key).
    pub fn values<'a>(&self, data: &'a [Vec<f32>], key: usize) -> &'a [f32] {
        self.range(key)
            .and_then(|(b, r)| data.get(b)?.get(r))
            .unwrap_or(&[])
    }

    /// Key `key`'s values in the buckets `data`, to write.
    pub fn values_mut<'a>(&self, data: &'a mut [Vec<f32>], key: usize) -> Option<&'a mut [f32]> {
        let (b, r) = self.range(key)?;
        data.get_mut(b)?.get_mut(r)
    }
}

/// Frames handed out as [`Transmit::Lent`] whose last byte is not yet written: the
/// values they are read from must not change, so a step is not done before none is left.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LentFrames(usize);

impl LentFrames {
    /// Lends the frame with header `h` on `link`: its header goes into `out`, its values
    /// stay where they are until the driver has written them (`handle_sent`).
    pub fn lend(&mut self, out: &mut Vec<u8>, link: Rank, h: Header) -> Transmit {
        out.extend_from_slice(&h.encode());
        self.0 += 1;
        Transmit::Lent(link, h)
    }

    /// A lent frame was written (`handle_sent`).
    pub fn returned(&mut self) {
        self.0 = self.0.saturating_sub(1);
    }

    /// Whether every lent frame has been written.
    pub fn none(&self) -> bool {
        self.0 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameKind;

    #[test]
    fn neighbours_and_slots() {
        assert_eq!(neighbours(4, 0), vec![1, 3]);
        assert_eq!(neighbours(2, 1), vec![0]);
        assert!(neighbours(1, 0).is_empty());
        let keys: Vec<KeyInfo> = [3, 4]
            .iter()
            .map(|&numel| KeyInfo { numel, layer: 0 })
            .collect();
        let slots = KeySlots::new(&keys, &Buckets::fill(&keys, 16));
        assert_eq!(slots.range(0), Some((0, 4..7)));
        let data = vec![(0..7).map(|v| v as f32).collect::<Vec<_>>()];
        assert_eq!(slots.values(&data, 1), &[0.0, 1.0, 2.0, 3.0]);
        assert!(slots.values(&data, 2).is_empty());
        let mut lent = LentFrames::default();
        let (mut out, h) = (Vec::new(), Header::data(FrameKind::Gather, 0, 0, 0, 0));
        assert!(matches!(lent.lend(&mut out, 1, h), Transmit::Lent(1, _)));
        assert_eq!(out, h.encode());
        assert!(!lent.none());
        lent.returned();
        lent.returned();
        assert!(lent.none());
    }
}
