//! Ring all-reduce (reduce-scatter then all-gather) over gradient buckets, pipelined at
//! segment granularity: a received segment is forwarded as soon as it has been added,
//! so a large bucket streams around the ring instead of moving chunk by chunk.
//!
//! Buckets are filled in the order backward produces gradients (last layer first) up to a
//! capacity, like PyTorch DDP's 25 MB buckets; a bucket is launched when all of its keys
//! are in (with overlap) or when backward is done (without). Additions are always
//! `local + received` in ring order, so every run gives the same bits.

use std::collections::VecDeque;

use super::{
    encode_frame_from, frame_values, Endpoint, ProtocolError, Rank, Transmit, WorkerEvent,
    WorkerSync,
};
use crate::aggregate::{add_assign, scale};
use crate::registry::KeyInfo;
use crate::sched::{new_scheduler, Pending, Scheduler, SchedulerKind};
use crate::wire::{FrameKind, Header};

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
}

/// A frame waiting for the right-hand link.
#[derive(Debug, Clone, Copy)]
struct Send {
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
    got_gather: Vec<bool>,
}

/// The ring all-reduce strategy of one worker (`allreduce`, `allreduce-no-overlap`).
pub struct RingAllReduce {
    rank: Rank,
    n: usize,
    overlap: bool,
    keys: Vec<KeyInfo>,
    key_place: Vec<(usize, usize)>,
    buckets: Vec<Bucket>,
    data: Vec<Vec<f32>>,
    incoming: Vec<Vec<f32>>,
    state: Vec<BucketState>,
    /// Reduce frames of the next step that arrived early:
    /// `(bucket, segment, ring_step, offset, len)`.
    next_step_early: Vec<(usize, usize, u64, usize, usize)>,
    step: u64,
    /// Whether `begin_step` has been called for `step` (before the first call, frames of
    /// step 0 are early, like frames of the next step).
    begun: bool,
    sends: Vec<Send>,
    queue: Box<dyn Scheduler>,
    events: VecDeque<WorkerEvent>,
    buckets_left: usize,
    /// StepDone is reported once every bucket is complete *and* every frame of the step has
    /// been handed to the transport (the next step overwrites the buffers they are read from).
    step_done: bool,
    /// Frames handed out as [`Transmit::Lent`] whose last byte is not yet written: their
    /// regions of `data` must not change, so the step is not done before this is zero.
    lent: usize,
    sequence: u64,
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
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut key_place = vec![(0, 0); keys.len()];
        for key in (0..keys.len()).rev() {
            let numel = keys[key].numel;
            let fits = buckets
                .last()
                .is_some_and(|b| b.len > 0 && b.len + numel <= bucket_elems);
            if !fits {
                buckets.push(Bucket {
                    keys: Vec::new(),
                    len: 0,
                    chunks: Vec::new(),
                    first_segment: Vec::new(),
                    layer: 0,
                });
            }
            let b = buckets.len() - 1;
            let bucket = &mut buckets[b];
            key_place[key] = (b, bucket.len);
            bucket.keys.push((key, bucket.len));
            bucket.len += numel;
            bucket.layer = bucket.layer.max(keys[key].layer);
        }
        for b in &mut buckets {
            b.chunks = (0..n)
                .map(|c| {
                    let (start, end) = (c * b.len / n, (c + 1) * b.len / n);
                    let mut segs = Vec::new();
                    let mut off = start;
                    while off < end {
                        let len = segment_elems.min(end - off);
                        segs.push((off, len));
                        off += len;
                    }
                    segs
                })
                .collect();
            b.first_segment = b
                .chunks
                .iter()
                .scan(0, |first, segs| {
                    let this = *first;
                    *first += segs.len();
                    Some(this)
                })
                .collect();
        }
        let data = buckets.iter().map(|b| vec![0.0; b.len]).collect();
        let incoming = buckets.iter().map(|b| vec![0.0; b.len]).collect();
        let mut ring = Self {
            rank,
            n,
            overlap,
            keys,
            key_place,
            data,
            incoming,
            state: Vec::new(),
            next_step_early: Vec::new(),
            begun: false,
            step: 0,
            sends: Vec::new(),
            queue: new_scheduler(scheduler),
            events: VecDeque::new(),
            buckets_left: 0,
            step_done: false,
            lent: 0,
            sequence: 0,
            buckets,
        };
        ring.state = ring
            .buckets
            .iter()
            .map(|b| {
                let segments = b.chunks.iter().map(Vec::len).sum();
                BucketState {
                    got_reduce: vec![false; segments],
                    got_gather: vec![false; segments],
                    ..Default::default()
                }
            })
            .collect();
        ring.reset_state();
        ring
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    fn left(&self) -> Rank {
        (self.rank + self.n - 1) % self.n
    }

    fn right(&self) -> Rank {
        (self.rank + 1) % self.n
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
            st.got_reduce.fill(false);
            st.got_gather.fill(false);
        }
        self.buckets_left = self.buckets.len();
        self.step_done = false;
        debug_assert!(
            self.queue.is_empty(),
            "a step began with frames of the last one queued"
        );
        self.sends.clear();
    }

    fn enqueue(&mut self, s: Send) {
        let priority = self.buckets[s.bucket].layer as i64;
        self.sends.push(s);
        self.queue.push(Pending {
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
        for &(off, len) in &self.buckets[b].chunks[self.rank].clone() {
            self.enqueue(Send {
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
            self.enqueue(Send {
                bucket: b,
                gather: false,
                ring_step: s + 1,
                offset: off,
                len,
            });
        } else {
            // The last reduce step completes this chunk here: average it and start its gather.
            scale(&mut self.data[b][r], 1.0 / self.n as f32);
            self.enqueue(Send {
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
        if !self.step_done && self.buckets_left == 0 && self.queue.is_empty() && self.lent == 0 {
            self.step_done = true;
            self.events.push_back(WorkerEvent::StepDone);
        }
    }

    /// Checks a frame against the segmentation and the ring schedule; returns the bucket and
    /// the segment's index in it.
    fn check(&self, link: Rank, h: &Header) -> Result<(usize, usize), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        if link != self.left() || self.n == 1 {
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
        if !next_step && seen[segment] {
            return Err(err("segment received twice"));
        }
        Ok((b, segment))
    }
}

impl WorkerSync for RingAllReduce {
    fn begin_step(&mut self, step: u64) {
        self.step = step;
        self.begun = true;
        self.reset_state();
        for (b, segment, s, off, len) in std::mem::take(&mut self.next_step_early) {
            self.state[b].got_reduce[segment] = true;
            self.state[b].early.push((s, off, len));
        }
    }

    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        let (b, off) = self.key_place[key];
        self.data[b][off..off + grad.len()].copy_from_slice(grad);
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
        let (b, off) = self.key_place[key];
        self.data[b][off..off + self.keys[key].numel].to_vec()
    }
}

impl Endpoint for RingAllReduce {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        let Some(h) = self.next_frame(link) else {
            return false;
        };
        encode_frame_from(out, &h, &self.data);
        self.maybe_step_done();
        true
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        let link = self.right();
        if !links.contains(&link) {
            return None;
        }
        let h = self.next_frame(link)?;
        out.extend_from_slice(&h.encode());
        self.lent += 1;
        Some(Transmit::Lent(link, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        frame_values(&self.data, h)
    }

    fn handle_sent(&mut self, _link: Rank, _h: &Header) {
        self.lent = self.lent.saturating_sub(1);
        self.maybe_step_done();
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        let (b, _) = self.check(link, h)?;
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
        if h.step != self.step || !self.begun {
            self.next_step_early.push((b, segment, s, off, len));
            return Ok(());
        }
        if h.kind == FrameKind::Gather {
            self.state[b].got_gather[segment] = true;
            if (s as usize) + 2 < self.n {
                self.enqueue(Send {
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
        if link != self.right() || self.n == 1 {
            return None;
        }
        let p = self.queue.pop()?;
        let s = self.sends[p.item];
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
