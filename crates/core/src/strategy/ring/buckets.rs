//! The ring's buckets: how each is cut into chunks and segments, where it stands in the
//! step under way, and the frames it has waiting for a link.

use crate::registry::KeyInfo;
use crate::strategy::bucket::{cut, Buckets};
use crate::strategy::Rank;

/// A contiguous run of keys synchronised together.
#[derive(Debug, Clone)]
pub(super) struct Bucket {
    /// `(key, offset in the bucket)` in fill order.
    pub(super) keys: Vec<(usize, usize)>,
    pub(super) len: usize,
    /// Segments `(offset, len)` of each chunk.
    pub(super) chunks: Vec<Vec<(usize, usize)>>,
    /// Index of each chunk's first segment among the bucket's segments.
    pub(super) first_segment: Vec<usize>,
    /// Highest layer among its keys (the bucket's priority).
    pub(super) layer: usize,
    /// Small enough to be shared whole instead (see [`RingAllReduce::with_direct_below`]).
    pub(super) direct: bool,
}

/// A frame waiting for its link (the right-hand one, but for small buckets' copies over a
/// mesh).
#[derive(Debug, Clone, Copy)]
pub(super) struct Outgoing {
    /// The rank it goes to.
    pub(super) to: Rank,
    pub(super) bucket: usize,
    pub(super) gather: bool,
    pub(super) ring_step: u64,
    pub(super) offset: usize,
    pub(super) len: usize,
}

/// Where one bucket stands in the step under way.
#[derive(Debug, Default, Clone)]
pub(super) struct BucketState {
    pub(super) missing_keys: usize,
    pub(super) launched: bool,
    pub(super) done: bool,
    pub(super) received: usize,
    pub(super) expected: usize,
    /// Reduce segments that arrived before the local gradients: `(ring_step, offset, len)`.
    pub(super) early: Vec<(u64, usize, usize)>,
    /// Per segment of the bucket: whether its reduce (gather) frame of this step arrived.
    pub(super) got_reduce: Vec<bool>,
    /// Per segment: whether its reduce frame of the step after this one arrived early.
    pub(super) got_reduce_next: Vec<bool>,
    pub(super) got_gather: Vec<bool>,
    /// Direct buckets, per step parity: every rank's copy, `(parity * n + origin) * len`.
    pub(super) shares: Vec<f32>,
    /// Direct buckets, per step parity and origin rank: whether its copy arrived.
    pub(super) got_share: [Vec<bool>; 2],
    /// Direct buckets, per step parity: copies of other ranks arrived.
    pub(super) shares_in: [usize; 2],
    /// Pairwise buckets: whether this step's pair sum has been formed and queued.
    pub(super) pair_sent: bool,
}

impl Bucket {
    /// The buckets of `fill`, each cut into one chunk per worker of a ring of `n` and each
    /// chunk into segments of at most `segment_elems` values.
    pub(super) fn cut_all(
        fill: &Buckets,
        keys: &[KeyInfo],
        n: usize,
        segment_elems: usize,
    ) -> Vec<Self> {
        let keys_at = fill.keys_at();
        keys_at
            .into_iter()
            .zip(&fill.lens)
            .map(|(bucket_keys, &len)| {
                let chunks: Vec<_> = (0..n)
                    .map(|c| cut(c * len / n, (c + 1) * len / n, segment_elems))
                    .collect();
                let first_segment = chunks
                    .iter()
                    .scan(0, |first, segs| {
                        let this = *first;
                        *first += segs.len();
                        Some(this)
                    })
                    .collect();
                let layer = bucket_keys
                    .iter()
                    .map(|&(k, _)| keys[k].layer)
                    .max()
                    .unwrap_or(0);
                Bucket {
                    keys: bucket_keys,
                    len,
                    chunks,
                    first_segment,
                    layer,
                    direct: false,
                }
            })
            .collect()
    }
}

impl BucketState {
    /// The state of bucket `b` before its first step.
    pub(super) fn of(b: &Bucket) -> Self {
        let segments = b.chunks.iter().map(Vec::len).sum();
        BucketState {
            got_reduce: vec![false; segments],
            got_reduce_next: vec![false; segments],
            got_gather: vec![false; segments],
            ..Default::default()
        }
    }
}
