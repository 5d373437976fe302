//! Where a ring's packets lie: each tensor (the ring's buckets) cut into one chunk per
//! worker, each chunk into packets (the unit a ring hop counts), numbered within the chunk
//! and within the tensor.

use crate::registry::KeyInfo;

/// One packet of a chunk, located.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPacket {
    /// The chunk it belongs to.
    pub chunk: usize,
    /// Its index within the chunk.
    pub in_chunk: usize,
    /// Its index within the key (over every chunk).
    pub in_key: usize,
    /// First value within the key.
    pub offset: usize,
    /// Values carried.
    pub len: usize,
}

/// The chunks and packets of every key of a ring of `workers`.
#[derive(Debug, Clone)]
pub struct RingChunks {
    workers: usize,
    packet: usize,
    lens: Vec<usize>,
    /// Per key: packets before each chunk (`workers + 1` entries).
    bases: Vec<Vec<usize>>,
}

impl RingChunks {
    /// `keys` cut into `workers` chunks each (`[c len / n, (c + 1) len / n)`, as the ring
    /// all-reduce cuts its buckets), and chunks into packets of at most `packet` values.
    pub fn new(keys: &[KeyInfo], workers: usize, packet: usize) -> Self {
        let mut g = Self {
            workers: workers.max(1),
            packet: packet.max(1),
            lens: keys.iter().map(|k| k.numel).collect(),
            bases: Vec::new(),
        };
        g.bases = (0..keys.len())
            .map(|key| {
                let mut base = vec![0; g.workers + 1];
                for c in 0..g.workers {
                    base[c + 1] = base[c] + g.chunk_packets(key, c);
                }
                base
            })
            .collect();
        g
    }

    /// Keys.
    pub fn keys(&self) -> usize {
        self.lens.len()
    }

    /// Values of `key` (0 for a key that does not exist).
    pub fn key_len(&self, key: usize) -> usize {
        self.lens.get(key).copied().unwrap_or(0)
    }

    /// Values `[start, end)` of chunk `c` of `key`.
    pub fn chunk_range(&self, key: usize, c: usize) -> (usize, usize) {
        let len = self.key_len(key) as u128;
        let n = self.workers as u128;
        let at = |c: usize| (c as u128 * len / n) as usize;
        (at(c), at(c + 1))
    }

    /// Packets of chunk `c` of `key`.
    pub fn chunk_packets(&self, key: usize, c: usize) -> usize {
        let (start, end) = self.chunk_range(key, c);
        (end - start).div_ceil(self.packet)
    }

    /// Packets of `key` over all its chunks.
    pub fn key_packets(&self, key: usize) -> usize {
        self.bases
            .get(key)
            .and_then(|b| b.last())
            .copied()
            .unwrap_or(0)
    }

    /// Packet `j` of chunk `c` of `key` (`None` past its last).
    pub fn packet(&self, key: usize, c: usize, j: usize) -> Option<ChunkPacket> {
        let (start, end) = self.chunk_range(key, c);
        let offset = start.checked_add(j.checked_mul(self.packet)?)?;
        if offset >= end {
            return None;
        }
        let before = self.bases.get(key)?.get(c).copied()?;
        Some(ChunkPacket {
            chunk: c,
            in_chunk: j,
            in_key: before + j,
            offset,
            len: self.packet.min(end - offset),
        })
    }

    /// The packet of `key` that starts at `offset` and carries `len` values, if it is one.
    pub fn locate(&self, key: usize, offset: usize, len: usize) -> Option<ChunkPacket> {
        let total = self.key_len(key);
        if offset >= total {
            return None;
        }
        let n = self.workers;
        let mut c = ((offset as u128 * n as u128) / total as u128) as usize;
        while c > 0 && self.chunk_range(key, c).0 > offset {
            c -= 1;
        }
        while c + 1 < n && self.chunk_range(key, c).1 <= offset {
            c += 1;
        }
        let (start, _) = self.chunk_range(key, c);
        let from_start = offset - start;
        if !from_start.is_multiple_of(self.packet) {
            return None;
        }
        self.packet(key, c, from_start / self.packet)
            .filter(|p| p.len == len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn packets_tile_every_chunk_and_are_found_again(
            sizes in proptest::collection::vec(1usize..300, 1..5),
            workers in 1usize..7,
            packet in 1usize..40,
        ) {
            let keys = KeyInfo::one_per_layer(&sizes);
            let g = RingChunks::new(&keys, workers, packet);
            for (key, &numel) in sizes.iter().enumerate() {
                let mut next = 0;
                let mut in_key = 0;
                for c in 0..workers {
                    let (start, end) = g.chunk_range(key, c);
                    prop_assert_eq!(start, next);
                    next = end;
                    for j in 0..g.chunk_packets(key, c) {
                        let p = g.packet(key, c, j).unwrap();
                        prop_assert_eq!(p.in_key, in_key);
                        prop_assert!(p.len >= 1 && p.len <= packet && p.offset + p.len <= end);
                        prop_assert_eq!(g.locate(key, p.offset, p.len), Some(p));
                        in_key += 1;
                    }
                    prop_assert_eq!(g.packet(key, c, g.chunk_packets(key, c)), None);
                }
                prop_assert_eq!(next, numel);
                prop_assert_eq!(g.key_packets(key), in_key);
                prop_assert_eq!(g.locate(key, numel, 1), None);
            }
        }
    }
}
