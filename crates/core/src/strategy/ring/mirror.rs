//! A ring of alike workers seen from one of them: when every worker hands over the same
//! gradients at the same times over alike links, each sends its right neighbour what its
//! left neighbour sends it, one chunk further on. A driver can then run one worker for all
//! of them, handing it back each frame it sends as the frame its left neighbour sends
//! ([`RingAllReduce::from_left`]).

use super::RingAllReduce;
use crate::wire::{FrameKind, Header};

impl RingAllReduce {
    /// Whether this ring's frames are alike from rank to rank up to a shift by one chunk:
    /// every chunk of a bucket reduced around the ring is cut into as many segments, and no
    /// bucket is exchanged pairwise (4 workers) or over a mesh (whose partners are no shift
    /// of one another). Needs at least 3 workers.
    pub fn shift_symmetric(&self) -> bool {
        if self.n < 3 || self.mesh || (self.pairwise() && self.buckets.iter().any(|b| b.direct)) {
            return false;
        }
        self.buckets.iter().filter(|b| !b.direct).all(|b| {
            let first = b.chunks.first().map_or(0, Vec::len);
            b.chunks.iter().all(|c| c.len() == first)
        })
    }

    /// In a ring of alike workers (see [`RingAllReduce::shift_symmetric`]), the header of
    /// the frame this worker receives from its left neighbour as the counterpart of `h`,
    /// which it sends its right neighbour: the same segment of the chunk one rank to the
    /// left (a small bucket's copy: the same header), from the left neighbour. `None` for
    /// a header that is no frame of this worker's to its right neighbour.
    pub fn from_left(&self, h: &Header) -> Option<Header> {
        let n = self.n;
        let bucket = self.buckets.get(h.key as usize)?;
        let mut out = *h;
        out.sender = self.left() as u32;
        if bucket.direct {
            return Some(out);
        }
        let s = (h.sequence % n as u64) as usize;
        // Rank r sends chunk r - s of ring step s when reducing, r + 1 - s when gathering.
        let chunk = match h.kind {
            FrameKind::Reduce => (self.rank + n - s) % n,
            FrameKind::Gather => (self.rank + 1 + n - s) % n,
            _ => return None,
        };
        let seg = (h.offset as usize, h.length as usize);
        let i = bucket.chunks[chunk].binary_search(&seg).ok()?;
        let (offset, length) = *bucket.chunks[(chunk + n - 1) % n].get(i)?;
        out.offset = offset as u32;
        out.length = length as u32;
        out.payload_len = (length * 4) as u32;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::KeyInfo;
    use crate::sched::SchedulerKind;
    use crate::strategy::{Endpoint, WorkerSync};

    fn ring(rank: usize, n: usize, numel: usize) -> RingAllReduce {
        let keys = vec![KeyInfo { numel, layer: 0 }];
        RingAllReduce::new(rank, n, keys, 1 << 20, 4, true, SchedulerKind::Priority)
    }

    #[test]
    fn the_left_neighbours_frames_are_the_own_ones_one_chunk_on() {
        // 5 workers, 40 values: chunks of 8 in segments of 4, 4.
        let (n, numel) = (5, 40);
        let mut rings: Vec<_> = (0..n).map(|r| ring(r, n, numel)).collect();
        assert!(rings[0].shift_symmetric());
        for r in &mut rings {
            r.begin_step(0);
            r.handle_gradient(0, &[1.0; 40]);
        }
        let mut out = Vec::new();
        let sent: Vec<Header> = std::iter::from_fn(|| {
            out.clear();
            rings[0].poll_transmit(1, &mut out).then(|| decode(&out))
        })
        .collect();
        let left: Vec<Header> = std::iter::from_fn(|| {
            out.clear();
            rings[n - 1]
                .poll_transmit(0, &mut out)
                .then(|| decode(&out))
        })
        .collect();
        assert_eq!(sent.len(), 2);
        let mirrored: Vec<Header> = sent.iter().filter_map(|h| rings[0].from_left(h)).collect();
        assert_eq!(mirrored, left);
        // Uneven chunks (41 values: one chunk of 9, cut 4 + 4 + 1) are no shift.
        assert!(!ring(0, n, 41).shift_symmetric());
        assert!(!ring(0, 4, 3).with_direct_below(1 << 20).shift_symmetric());
    }

    fn decode(b: &[u8]) -> Header {
        let head: &[u8; crate::wire::HEADER_LEN] = b[..crate::wire::HEADER_LEN].try_into().unwrap();
        Header::decode(head, u32::MAX).unwrap()
    }
}
