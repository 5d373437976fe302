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

mod buckets;
mod direct;
mod mirror;

use buckets::{Bucket, BucketState, Outgoing};

use super::bucket::Buckets;
use super::ring_layout::{left_of, right_of, KeySlots, LentFrames};
use super::{frame_values, Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::aggregate::{add_assign, scale};
use crate::registry::KeyInfo;
use crate::sched::{new_scheduler, Pending, Scheduler, SchedulerKind};
use crate::wire::{encode_data_frame, FrameKind, Header};

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

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
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
        if self.buckets[b].direct {
            self.share_arrived(h, b, segment);
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
