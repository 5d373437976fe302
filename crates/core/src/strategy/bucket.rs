//! How the ring strategies group keys into buckets and cut them into frames: one rule for
//! ring all-reduce, ring reduce and step-wise averaging.

use crate::registry::KeyInfo;

/// Keys grouped into buckets in the order backward produces them (the last key first), a new
/// bucket whenever the next key would overflow the capacity (a larger key gets one of its
/// own), as PyTorch DDP fills its buckets.
#[derive(Debug, Clone)]
pub(crate) struct Buckets {
    /// Each bucket's keys, in fill order.
    pub keys: Vec<Vec<usize>>,
    /// Each bucket's length in values.
    pub lens: Vec<usize>,
    /// Each key's bucket and offset in it.
    pub place: Vec<(usize, usize)>,
}

impl Buckets {
    /// Fills buckets of at most `capacity` values with `keys`.
    pub fn fill(keys: &[KeyInfo], capacity: usize) -> Self {
        let mut out = Self {
            keys: Vec::new(),
            lens: Vec::new(),
            place: vec![(0, 0); keys.len()],
        };
        for key in (0..keys.len()).rev() {
            let numel = keys[key].numel;
            let fits = out
                .lens
                .last()
                .is_some_and(|&len| len > 0 && len + numel <= capacity);
            if !fits {
                out.keys.push(Vec::new());
                out.lens.push(0);
            }
            let b = out.lens.len() - 1;
            out.place[key] = (b, out.lens[b]);
            out.keys[b].push(key);
            out.lens[b] += numel;
        }
        out
    }

    /// Each bucket's keys with their offsets in it, in fill order.
    pub fn keys_at(&self) -> Vec<Vec<(usize, usize)>> {
        let at = |ks: &Vec<usize>| ks.iter().map(|&k| (k, self.place[k].1)).collect();
        self.keys.iter().map(at).collect()
    }
}

/// `start..end` cut into frames of at most `frame` values: `(offset, len)` pairs.
pub(crate) fn cut(start: usize, end: usize, frame: usize) -> Vec<(usize, usize)> {
    let frame = frame.max(1);
    (start..end)
        .step_by(frame)
        .map(|off| (off, frame.min(end - off)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_fill_from_the_last_key_and_big_keys_go_alone() {
        let keys: Vec<KeyInfo> = [3, 4, 10, 2]
            .iter()
            .map(|&numel| KeyInfo { numel, layer: 0 })
            .collect();
        let b = Buckets::fill(&keys, 6);
        assert_eq!(b.keys, vec![vec![3], vec![2], vec![1], vec![0]]);
        let b = Buckets::fill(&keys, 12);
        assert_eq!(b.keys, vec![vec![3, 2], vec![1, 0]]);
        assert_eq!(b.lens, vec![12, 7]);
        assert_eq!(b.place[0], (1, 4));
        assert_eq!(cut(5, 12, 3), vec![(5, 3), (8, 3), (11, 1)]);
        assert!(cut(4, 4, 3).is_empty());
    }
}
