//! Ring all-reduce (reduce-scatter then all-gather) over gradient buckets, pipelined at
//! segment granularity: a received segment is forwarded as soon as it has been added,
//! so a large bucket streams around the ring instead of moving chunk by chunk.
//!
//! Buckets are filled in the order backward produces gradients (last layer first) up to a
//! capacity, like PyTorch DDP's 25 MB buckets; a bucket is launched when all of its keys
//! are in (with overlap) or when backward is done (without). Additions are always
//! `local + received` in ring order, so every run gives the same bits.
//!
//! Small buckets are shared whole instead ([`RingAllReduce::with_direct_below`]): every
//! worker's copy travels the ring, or, where the workers are linked in a full mesh
//! ([`RingAllReduce::over_mesh`]), goes straight to every other worker in one hop; each
//! worker then adds the n copies in rank order. With 4 workers on a ring, small buckets are
//! exchanged in two rounds of recursive doubling instead, whose partners are both ring
//! neighbours (see [`RingAllReduce::pairwise`]).

use std::collections::VecDeque;

mod mirror;

use super::bucket::{cut, Buckets};
use super::ring_layout::{left_of, right_of, KeySlots, LentFrames};
use super::{frame_values, Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::aggregate::{add_assign, scale};
use crate::registry::KeyInfo;
use crate::sched::{new_scheduler, Pending, Scheduler, SchedulerKind};
use crate::wire::{encode_data_frame, FrameKind, Header};

/// A contiguous run of keys synchronised together.
#[derive(Debug, Clone)]
struct Bucket {
    /// `(key, offset in the bucket)` in fill order.
    keys: Vec<(usize, usize)>,
    len: usize,
    /// Segments `(offset, len)` of each chunk.
    chunks: Vec<Vec<(usize, usize)>>,
    /// Index of each chunk's first segment among the bucket's segments.
    first_segment: Vec<usize>,
    /// Highest layer among its keys (the bucket's priority).
    layer: usize,
    /// Small enough to be shared whole instead (see [`RingAllReduce::with_direct_below`]).
    direct: bool,
}

/// A frame waiting for its link (the right-hand one, but for small buckets' copies over a
/// mesh).
#[derive(Debug, Clone, Copy)]
struct Outgoing {
    /// The rank it goes to.
    to: Rank,
    bucket: usize,
    gather: bool,
    ring_step: u64,
    offset: usize,
    len: usize,
}

#[derive(Debug, Default, Clone)]
struct BucketState {
    missing_keys: usize,
    launched: bool,
    done: bool,
    received: usize,
    expected: usize,
    /// Reduce segments that arrived before the local gradients: `(ring_step, offset, len)`.
    early: Vec<(u64, usize, usize)>,
    /// Per segment of the bucket: whether its reduce (gather) frame of this step arrived.
    got_reduce: Vec<bool>,
    /// Per segment: whether its reduce frame of the step after this one arrived early.
    got_reduce_next: Vec<bool>,
    got_gather: Vec<bool>,
    /// Direct buckets, per step parity: every rank's copy, `(parity * n + origin) * len`.
    shares: Vec<f32>,
    /// Direct buckets, per step parity and origin rank: whether its copy arrived.
    got_share: [Vec<bool>; 2],
    /// Direct buckets, per step parity: copies of other ranks arrived.
    shares_in: [usize; 2],
    /// Pairwise buckets: whether this step's pair sum has been formed and queued.
    pair_sent: bool,
}

impl Bucket {
    /// The buckets of `fill`, each cut into one chunk per worker of a ring of `n` and each
    /// chunk into segments of at most `segment_elems` values.
    fn cut_all(fill: &Buckets, keys: &[KeyInfo], n: usize, segment_elems: usize) -> Vec<Self> {
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
    fn of(b: &Bucket) -> Self {
        let segments = b.chunks.iter().map(Vec::len).sum();
        BucketState {
            got_reduce: vec![false; segments],
            got_reduce_next: vec![false; segments],
            got_gather: vec![false; segments],
            ..Default::default()
        }
    }
}

/// The ring all-reduce strategy of one worker (`allreduce`, `allreduce-no-overlap`).
pub struct RingAllReduce {
    rank: Rank,
    n: usize,
    overlap: bool,
    slots: KeySlots,
    buckets: Vec<Bucket>,
    data: Vec<Vec<f32>>,
    incoming: Vec<Vec<f32>>,
    state: Vec<BucketState>,
    /// Reduce frames of the next step that arrived early:
    /// `(bucket, segment, ring_step, offset, len)`.
    next_step_early: Vec<(usize, usize, u64, usize, usize)>,
    /// Copies of direct buckets of the next step that arrived early, to be forwarded once it
    /// begins: `(bucket, ring_step)`.
    next_step_shares: Vec<(usize, u64)>,
    step: u64,
    /// Whether `begin_step` has been called for `step` (before the first call, frames of
    /// step 0 are early, like frames of the next step).
    begun: bool,
    sends: Vec<Outgoing>,
    /// Frames waiting, one queue per link: the right-hand link's only on a ring; on a mesh
    /// one per rank (the own one unused).
    queues: Vec<Box<dyn Scheduler>>,
    scheduler: SchedulerKind,
    /// Whether this worker has links to every other one (see [`RingAllReduce::over_mesh`]).
    mesh: bool,
    events: VecDeque<WorkerEvent>,
    buckets_left: usize,
    /// StepDone is reported once every bucket is complete *and* every frame of the step has
    /// been handed to the transport (the next step overwrites the buffers they are read from).
    step_done: bool,
    /// Frames handed out as [`Transmit::Lent`] whose regions of `data` must not change yet.
    lent: LentFrames,
    sequence: u64,
    /// Largest frame payload in values.
    segment_elems: usize,
}

impl RingAllReduce {
    /// Worker `rank` of a ring of `workers`; buckets of at most `bucket_elems` values
    /// (a key larger than that gets a bucket of its own); frames of at most `segment_elems`.
    pub fn new(
        rank: Rank,
        workers: usize,
        keys: Vec<KeyInfo>,
        bucket_elems: usize,
        segment_elems: usize,
        overlap: bool,
        scheduler: SchedulerKind,
    ) -> Self {
        let n = workers.max(1);
        let segment_elems = segment_elems.max(1);
        let fill = Buckets::fill(&keys, bucket_elems);
        let buckets = Bucket::cut_all(&fill, &keys, n, segment_elems);
        let state = buckets.iter().map(BucketState::of).collect();
        let mut ring = Self {
            rank,
            n,
            overlap,
            slots: KeySlots::new(&keys, &fill),
            data: buckets.iter().map(|b| vec![0.0; b.len]).collect(),
            incoming: buckets.iter().map(|b| vec![0.0; b.len]).collect(),
            state,
            next_step_early: Vec::new(),
            next_step_shares: Vec::new(),
            begun: false,
            step: 0,
            sends: Vec::new(),
            queues: vec![new_scheduler(scheduler)],
            scheduler,
            mesh: false,
            events: VecDeque::new(),
            buckets_left: 0,
            step_done: false,
            lent: LentFrames::default(),
            sequence: 0,
            segment_elems,
            buckets,
        };
        ring.reset_state();
        ring
    }

    /// Shares buckets whose n copies hold at most `elems` values together whole instead of
    /// reducing them around the ring: each worker's copy travels the ring (n-1 hops instead
    /// of the 2(n-1) of reduce-scatter plus all-gather, for n-1 times the bucket's bytes
    /// instead of 2(n-1)/n), and every worker adds the n copies in rank order, so all get the
    /// same bits. For small buckets the hops, not the bytes, take the time. A bucket shared
    /// whole travels in one frame, so only buckets of at most a segment qualify. With 4
    /// workers on a ring they are exchanged by recursive doubling instead (2 hops; see
    /// [`RingAllReduce::pairwise`]). Call before the first step.
    pub fn with_direct_below(mut self, elems: usize) -> Self {
        let n = self.n;
        for (b, st) in self.buckets.iter_mut().zip(&mut self.state) {
            b.direct = n > 1 && b.len.saturating_mul(n) <= elems && b.len <= self.segment_elems;
            if b.direct {
                st.shares = vec![0.0; 2 * n * b.len];
                st.got_share = [vec![false; n], vec![false; n]];
            }
        }
        if self.pairwise() && self.buckets.iter().any(|b| b.direct) {
            // The second round goes to the left neighbour: one queue per link.
            let kind = self.scheduler;
            self.queues = (0..n).map(|_| new_scheduler(kind)).collect();
        }
        self.reset_state();
        self
    }

    /// Whether small buckets are exchanged by recursive doubling rather than sent around:
    /// with 4 workers on a ring, both rounds' partners are ring neighbours (rank `r ^ 1`,
    /// then `r ^ 3`: 0-1 and 2-3, then 0-3 and 1-2), so every worker sends and receives 2
    /// copies in 2 hops instead of 3 in 3. Both ends of a round add the same two sums (in
    /// either order: addition is commutative), so every worker ends with
    /// `((g0 + g1) + (g2 + g3)) / 4`, the same bits. Over a mesh the copies go in one hop
    /// instead (see [`RingAllReduce::over_mesh`]).
    fn pairwise(&self) -> bool {
        self.n == 4 && !self.mesh
    }

    /// The partner of round `round` (0 or 1) of a pairwise exchange.
    fn partner(&self, round: u64) -> Rank {
        self.rank ^ ((2 << round) - 1)
    }

    /// Sends the copies of buckets shared whole (see [`RingAllReduce::with_direct_below`])
    /// straight from each worker to every other one, one hop instead of n-1, where the
    /// driver links every worker to every other ([`crate::strategy::SyncPlan::mesh`]):
    /// each worker accepts a copy only from its origin's own link and forwards none. Larger
    /// buckets still use only the ring neighbours. With fewer than 3 workers the ring
    /// already is a mesh and nothing changes. Call before the first step.
    pub fn over_mesh(mut self) -> Self {
        if self.n >= 3 && !self.mesh {
            self.mesh = true;
            let kind = self.scheduler;
            self.queues = (0..self.n).map(|_| new_scheduler(kind)).collect();
        }
        self
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The rank whose copy of a direct bucket travels as ring step `s` from `sender`.
    fn share_origin(&self, sender: Rank, s: u64) -> Rank {
        (sender + self.n - (s as usize % self.n)) % self.n
    }

    /// Where the copy of direct bucket `b` from `origin` for `step` is kept.
    fn share_range(&self, b: usize, step: u64, origin: Rank) -> std::ops::Range<usize> {
        let len = self.buckets[b].len;
        let start = ((step % 2) as usize * self.n + origin) * len;
        start..start + len
    }

    /// Direct bucket `b`'s own copy is in: send it around the ring, or over a mesh to every
    /// other worker at once (in rank order from the right neighbour on).
    fn launch_direct(&mut self, b: usize) {
        let slot = if self.pairwise() { 0 } else { self.rank };
        let own = self.share_range(b, self.step, slot);
        let len = self.buckets[b].len;
        let st = &mut self.state[b];
        st.shares[own].copy_from_slice(&self.data[b]);
        if self.pairwise() {
            self.enqueue(Outgoing {
                to: self.partner(0),
                bucket: b,
                gather: true,
                ring_step: 0,
                offset: 0,
                len,
            });
            self.advance_pairwise(b);
            return;
        }
        let copies = if self.mesh { self.n - 1 } else { 1 };
        for i in 1..=copies {
            self.enqueue(Outgoing {
                to: (self.rank + i) % self.n,
                bucket: b,
                gather: true,
                ring_step: 0,
                offset: 0,
                len,
            });
        }
        self.maybe_finish_direct(b);
    }

    /// Once direct bucket `b` is launched and every copy is in: the mean, added in rank order.
    fn maybe_finish_direct(&mut self, b: usize) {
        let parity = (self.step % 2) as usize;
        if !self.state[b].launched || self.state[b].shares_in[parity] + 1 < self.n {
            return;
        }
        let len = self.buckets[b].len;
        let base = parity * self.n * len;
        let shares = &self.state[b].shares[base..base + self.n * len];
        let out = &mut self.data[b];
        out.copy_from_slice(&shares[..len]);
        for copy in shares[len..].chunks_exact(len) {
            add_assign(out, copy);
        }
        scale(out, 1.0 / self.n as f32);
        self.finish_bucket(b);
    }

    /// Pairwise bucket `b` (see [`RingAllReduce::pairwise`]) has its own copy in: once the
    /// first round's copy is in, queue the pair's sum to the second partner; once the
    /// second's is in too, the mean. Each step's slots in `shares`: the own copy (sent in
    /// round 0), round 0's copy, the pair's sum (sent in round 1), round 1's copy.
    fn advance_pairwise(&mut self, b: usize) {
        let parity = (self.step % 2) as usize;
        let len = self.buckets[b].len;
        let st = &mut self.state[b];
        if !st.launched || st.done {
            return;
        }
        let base = parity * self.n * len;
        let slots = &mut st.shares[base..base + 4 * len];
        if !st.pair_sent {
            if !st.got_share[parity][1] {
                return;
            }
            let (received, pair) = slots.split_at_mut(2 * len);
            add_into(&mut pair[..len], &received[..len], &received[len..]);
            st.pair_sent = true;
            self.enqueue(Outgoing {
                to: self.partner(1),
                bucket: b,
                gather: true,
                ring_step: 1,
                offset: 0,
                len,
            });
        }
        let st = &mut self.state[b];
        if !st.got_share[parity][3] {
            return;
        }
        let slots = &st.shares[base..base + 4 * len];
        let out = &mut self.data[b];
        add_into(out, &slots[2 * len..3 * len], &slots[3 * len..]);
        scale(out, 1.0 / self.n as f32);
        self.finish_bucket(b);
    }

    /// The values a frame we send carries: a segment of a bucket, or a direct bucket's copy.
    fn payload(&self, h: &Header) -> &[f32] {
        match self.buckets.get(h.key as usize) {
            Some(bucket) if bucket.direct && self.pairwise() => {
                let r = self.share_range(h.key as usize, h.step, 2 * h.sequence as usize);
                &self.state[h.key as usize].shares[r]
            }
            Some(bucket) if bucket.direct => {
                let origin = self.share_origin(self.rank, h.sequence);
                let r = self.share_range(h.key as usize, h.step, origin);
                &self.state[h.key as usize].shares[r]
            }
            _ => frame_values(&self.data, h),
        }
    }

    fn left(&self) -> Rank {
        left_of(self.rank, self.n)
    }

    fn right(&self) -> Rank {
        right_of(self.rank, self.n)
    }

    /// The queue of the frames for `link`, if this worker sends on it.
    fn queue_of(&self, link: Rank) -> Option<usize> {
        if self.n == 1 || link >= self.n || link == self.rank {
            None
        } else if self.queues.len() == self.n {
            Some(link)
        } else if link == self.right() {
            Some(0)
        } else {
            None
        }
    }

    /// Whether no frame waits on any link.
    fn nothing_queued(&self) -> bool {
        self.queues.iter().all(|q| q.is_empty())
    }

    fn chunk_index(&self, offset_from_rank: i64) -> usize {
        (self.rank as i64 + offset_from_rank).rem_euclid(self.n as i64) as usize
    }

    /// Makes every bucket's state that of a step not yet begun, reusing its buffers.
    fn reset_state(&mut self) {
        let n = self.n;
        let own = self.rank % n;
        let done_at_me = (self.rank + 1) % n;
        for (b, st) in self.buckets.iter().zip(&mut self.state) {
            let segs = |c: usize| b.chunks[c].len();
            let reduce: usize = (0..n).filter(|&c| c != own).map(segs).sum();
            let gather: usize = (0..n).filter(|&c| c != done_at_me).map(segs).sum();
            st.missing_keys = b.keys.len();
            st.launched = false;
            st.done = false;
            st.received = 0;
            st.expected = if n == 1 { 0 } else { reduce + gather };
            st.early.clear();
            st.pair_sent = false;
            st.got_reduce.fill(false);
            st.got_gather.fill(false);
            if b.direct {
                // This step's copies may already be in (sent by ranks that are ahead); the
                // slots of the next step are those of the last one, free now.
                let next = ((self.step + 1) % 2) as usize;
                st.got_share[next].fill(false);
                st.shares_in[next] = 0;
            }
        }
        self.buckets_left = self.buckets.len();
        self.step_done = false;
        debug_assert!(
            self.nothing_queued(),
            "a step began with frames of the last one queued"
        );
        self.sends.clear();
    }

    fn enqueue(&mut self, s: Outgoing) {
        let priority = self.buckets[s.bucket].layer as i64;
        let Some(q) = self.queue_of(s.to) else {
            debug_assert!(false, "a frame for rank {} has no link", s.to);
            return;
        };
        self.sends.push(s);
        self.queues[q].push(Pending {
            item: self.sends.len() - 1,
            priority,
            sequence: s.offset as u64,
            arrival: self.sends.len() as u64,
        });
    }

    fn launch(&mut self, b: usize) {
        let st = &mut self.state[b];
        if st.launched {
            return;
        }
        st.launched = true;
        if self.n == 1 {
            self.finish_bucket(b);
            return;
        }
        if self.buckets[b].direct {
            self.launch_direct(b);
            return;
        }
        for &(off, len) in &self.buckets[b].chunks[self.rank].clone() {
            self.enqueue(Outgoing {
                to: self.right(),
                bucket: b,
                gather: false,
                ring_step: 0,
                offset: off,
                len,
            });
        }
        for (s, off, len) in std::mem::take(&mut self.state[b].early) {
            self.reduce_arrived(b, s, off, len);
        }
        if self.state[b].expected == 0 {
            self.finish_bucket(b);
        }
    }

    /// A reduce segment of ring step `s` is in `incoming` and the bucket is launched.
    fn reduce_arrived(&mut self, b: usize, s: u64, off: usize, len: usize) {
        let r = off..off + len;
        add_assign(&mut self.data[b][r.clone()], &self.incoming[b][r.clone()]);
        if (s as usize) + 2 < self.n {
            self.enqueue(Outgoing {
                to: self.right(),
                bucket: b,
                gather: false,
                ring_step: s + 1,
                offset: off,
                len,
            });
        } else {
            // The last reduce step completes this chunk here: average it and start its gather.
            scale(&mut self.data[b][r], 1.0 / self.n as f32);
            self.enqueue(Outgoing {
                to: self.right(),
                bucket: b,
                gather: true,
                ring_step: 0,
                offset: off,
                len,
            });
        }
        self.count_received(b);
    }

    fn count_received(&mut self, b: usize) {
        self.state[b].received += 1;
        if self.state[b].received == self.state[b].expected {
            self.finish_bucket(b);
        }
    }

    fn finish_bucket(&mut self, b: usize) {
        let st = &mut self.state[b];
        if st.done {
            return;
        }
        st.done = true;
        for &(key, _) in &self.buckets[b].keys {
            self.events.push_back(WorkerEvent::GradReady(key));
        }
        self.buckets_left -= 1;
        self.maybe_step_done();
    }

    fn maybe_step_done(&mut self) {
        if !self.step_done && self.buckets_left == 0 && self.nothing_queued() && self.lent.none() {
            self.step_done = true;
            self.events.push_back(WorkerEvent::StepDone);
        }
    }

    /// Checks a frame against the segmentation and the ring schedule; returns the bucket and
    /// the segment's index in it.
    fn check(&self, link: Rank, h: &Header) -> Result<(usize, usize), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        let direct = self.buckets.get(h.key as usize).is_some_and(|b| b.direct);
        if self.mesh && direct {
            if link >= self.n || link == self.rank {
                return Err(err("a small bucket's copy comes only from another worker"));
            }
        } else if direct && self.pairwise() {
            // Each round's partner is checked with the round (`check_share`).
        } else if link != self.left() || self.n == 1 {
            return Err(err("ring frames come only from the left neighbour"));
        }
        let gather = match h.kind {
            FrameKind::Reduce => false,
            FrameKind::Gather => true,
            _ => return Err(err("a ring worker expects only Reduce and Gather frames")),
        };
        let b = h.key as usize;
        let bucket = self.buckets.get(b).ok_or_else(|| err("no such bucket"))?;
        if h.sequence >= self.n as u64 - 1 {
            return Err(err("ring step beyond the ring"));
        }
        if bucket.direct {
            return self.check_share(link, h, b);
        }
        let s = h.sequence as i64;
        let chunk = if gather {
            self.chunk_index(-s)
        } else {
            self.chunk_index(-s - 1)
        };
        let seg = (h.offset as usize, h.length as usize);
        let segment = match bucket.chunks[chunk].binary_search(&seg) {
            Ok(i) => bucket.first_segment[chunk] + i,
            Err(_) => return Err(err("segment does not match the ring schedule")),
        };
        let st = &self.state[b];
        let next_step =
            (h.step == self.step + 1 || (!self.begun && h.step == self.step)) && !gather;
        if h.step != self.step && !next_step {
            return Err(err(&format!(
                "wrong step (this worker is at step {})",
                self.step
            )));
        }
        if gather && !st.launched {
            return Err(err("gather before this worker's own contribution"));
        }
        let seen = if gather {
            &st.got_gather
        } else {
            &st.got_reduce
        };
        let seen = if next_step { &st.got_reduce_next } else { seen };
        if seen[segment] {
            return Err(err("segment received twice"));
        }
        Ok((b, segment))
    }

    /// Checks a copy of direct bucket `b`; returns the bucket and the copy's origin rank.
    fn check_share(
        &self,
        link: Rank,
        h: &Header,
        b: usize,
    ) -> Result<(usize, usize), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        if h.kind != FrameKind::Gather || h.offset != 0 || h.length as usize != self.buckets[b].len
        {
            return Err(err("a small bucket travels whole, in Gather frames"));
        }
        if self.mesh && h.sequence != 0 {
            return Err(err(
                "over a mesh a small bucket's copy comes straight from its origin, never forwarded",
            ));
        }
        if self.pairwise() {
            if h.sequence > 1 {
                return Err(err("a small bucket is exchanged in two rounds only"));
            }
            if link != self.partner(h.sequence) {
                return Err(err(
                    "an exchange round's copy comes only from that round's partner",
                ));
            }
        }
        let next_step = h.step == self.step + 1 || (!self.begun && h.step == self.step);
        if h.step != self.step && !next_step {
            return Err(err(&format!(
                "wrong step (this worker is at step {})",
                self.step
            )));
        }
        // On a ring, ring step s from the left neighbour is the copy of the rank s further
        // left; over a mesh (ring step 0 only) the copy of the link's own rank; in a
        // pairwise exchange, round s's copy has slot 2s + 1 (see `advance_pairwise`).
        let origin = if self.pairwise() {
            2 * h.sequence as usize + 1
        } else {
            self.share_origin(link, h.sequence)
        };
        if self.state[b].got_share[(h.step % 2) as usize][origin] {
            return Err(err("copy received twice"));
        }
        Ok((b, origin))
    }
}

impl WorkerSync for RingAllReduce {
    fn start_at(&mut self, step: u64) {
        self.step = step;
    }

    fn begin_step(&mut self, step: u64) {
        self.step = step;
        self.begun = true;
        self.reset_state();
        for (b, s) in std::mem::take(&mut self.next_step_shares) {
            self.forward_share(b, s);
        }
        for st in &mut self.state {
            st.got_reduce_next.fill(false);
        }
        for (b, segment, s, off, len) in std::mem::take(&mut self.next_step_early) {
            self.state[b].got_reduce[segment] = true;
            self.state[b].early.push((s, off, len));
        }
    }

    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        let Some((b, off)) = self.slots.place(key) else {
            return;
        };
        self.data[b][off..off + grad.len()].copy_from_slice(grad);
        self.handle_gradient_in_place(key);
    }

    fn gradient_slot(&mut self, key: usize) -> Option<&mut [f32]> {
        self.slots.values_mut(&mut self.data, key)
    }

    fn handle_gradient_in_place(&mut self, key: usize) {
        let Some((b, _)) = self.slots.place(key) else {
            return;
        };
        self.state[b].missing_keys -= 1;
        if self.overlap && self.state[b].missing_keys == 0 {
            self.launch(b);
        }
    }

    fn handle_backward_done(&mut self) {
        for b in 0..self.buckets.len() {
            if self.state[b].missing_keys == 0 {
                self.launch(b);
            }
        }
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.events.pop_front()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.slots.values(&self.data, key).to_vec()
    }
}

impl Endpoint for RingAllReduce {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        let Some(h) = self.next_frame(link) else {
            return false;
        };
        encode_data_frame(out, &h, self.payload(&h));
        self.maybe_step_done();
        true
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        // The first of the offered links (in the driver's rotating order) with a frame.
        let link = links
            .iter()
            .copied()
            .find(|&l| self.queue_of(l).is_some_and(|q| !self.queues[q].is_empty()))?;
        let h = self.next_frame(link)?;
        Some(self.lent.lend(out, link, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        self.payload(h)
    }

    fn handle_sent(&mut self, _link: Rank, _h: &Header) {
        self.lent.returned();
        self.maybe_step_done();
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        let (b, origin) = self.check(link, h)?;
        if self.buckets[b].direct {
            let r = self.share_range(b, h.step, origin);
            return Ok(&mut self.state[b].shares[r]);
        }
        let r = h.offset as usize..h.offset as usize + h.length as usize;
        Ok(if h.kind == FrameKind::Gather {
            &mut self.data[b][r]
        } else {
            &mut self.incoming[b][r]
        })
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let (b, segment) = self.check(link, h)?;
        let (off, len, s) = (h.offset as usize, h.length as usize, h.sequence);
        if self.buckets[b].direct && self.pairwise() {
            self.state[b].got_share[(h.step % 2) as usize][segment] = true;
            if h.step == self.step && self.begun {
                self.advance_pairwise(b);
            }
            return Ok(());
        }
        if self.buckets[b].direct {
            let parity = (h.step % 2) as usize;
            let st = &mut self.state[b];
            st.got_share[parity][segment] = true;
            st.shares_in[parity] += 1;
            if h.step != self.step || !self.begun {
                self.next_step_shares.push((b, s));
            } else {
                self.forward_share(b, s);
                self.maybe_finish_direct(b);
            }
            return Ok(());
        }
        if h.step != self.step || !self.begun {
            self.state[b].got_reduce_next[segment] = true;
            self.next_step_early.push((b, segment, s, off, len));
            return Ok(());
        }
        if h.kind == FrameKind::Gather {
            self.state[b].got_gather[segment] = true;
            if (s as usize) + 2 < self.n {
                self.enqueue(Outgoing {
                    to: self.right(),
                    bucket: b,
                    gather: true,
                    ring_step: s + 1,
                    offset: off,
                    len,
                });
            }
            self.count_received(b);
        } else {
            self.state[b].got_reduce[segment] = true;
            if self.state[b].launched {
                self.reduce_arrived(b, s, off, len);
            } else {
                self.state[b].early.push((s, off, len));
            }
        }
        Ok(())
    }
}

impl RingAllReduce {
    /// A copy of direct bucket `b` arrived as ring step `s`: pass it on unless the right
    /// neighbour is the one it came from (over a mesh, every copy came from its origin and
    /// goes no further).
    fn forward_share(&mut self, b: usize, s: u64) {
        if !self.mesh && (s as usize) + 2 < self.n {
            let len = self.buckets[b].len;
            self.enqueue(Outgoing {
                to: self.right(),
                bucket: b,
                gather: true,
                ring_step: s + 1,
                offset: 0,
                len,
            });
        }
    }

    /// Takes the next queued frame for `link` and says what it carries (the payload is
    /// `data[key][offset..offset + length]`).
    fn next_frame(&mut self, link: Rank) -> Option<Header> {
        let q = self.queue_of(link)?;
        let p = self.queues[q].pop()?;
        let s = self.sends[p.item];
        debug_assert_eq!(s.to, link, "a frame queued for another link");
        let kind = if s.gather {
            FrameKind::Gather
        } else {
            FrameKind::Reduce
        };
        let mut h = Header::data(
            kind,
            self.step,
            s.bucket as u32,
            s.offset as u32,
            s.len as u32,
        );
        h.sequence = s.ring_step;
        h.priority = p.priority as i32;
        h.sender = self.rank as u32;
        self.sequence += 1;
        Some(h)
    }
}

/// `out = a + b`.
fn add_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.copy_from_slice(a);
    add_assign(out, b);
}
