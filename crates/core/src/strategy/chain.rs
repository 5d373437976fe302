//! The chain strategies: one pipelined pass of running sums along the ring, from the round's
//! head to its last position, and in exact rounds the average back around to everyone.
//!
//! - **Ring reduce** (`ring-reduce`, exact): gradients; every round headed by worker 0, so
//!   the last worker is the root. The sum `((g0 + g1) + g2) + ...` reaches the root, which
//!   scales it and sends it around again: every worker installs the root's bits.
//! - **Step-wise averaging** (`stepwise`, approximate): weights after each worker's own
//!   optimizer step. The worker at position `k` receives the running sum of positions
//!   `0..k`, adds its own weights, forwards the sum and adopts `sum / (k + 1)` at once; no
//!   second pass. Which rounds are exact and who heads them is [`ChainSchedule`]'s call.
//!
//! Buckets of keys are cut into segments; a segment moves on as soon as it is added, so a
//! bucket streams along the chain. Values leave only to the right neighbour.
//!
//! In a partial round nothing comes back, so a head could run ahead of the chain forever;
//! the receiver therefore acknowledges ([`FrameKind::Ack`], to the left) once it has begun
//! the step and holds all of it, and a sender's step ends only with that acknowledgement.
//! Neighbours are thus at most one step apart, and two receive buffers (by step parity)
//! suffice.

use std::collections::VecDeque;
use std::ops::Range;

use super::averaging::{ChainRound, ChainSchedule};
use super::bucket::{cut, Buckets};
use super::ring_layout::{left_of, right_of, KeySlots, LentFrames};
use super::{Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::aggregate::{add_assign, scale};
use crate::registry::KeyInfo;
use crate::sched::{new_scheduler, Pending, Scheduler, SchedulerKind};
use crate::wire::{encode_data_frame, FrameKind, Header};

/// A contiguous run of keys launched together.
#[derive(Debug, Clone)]
struct Bucket {
    keys: Vec<usize>,
    /// Its segments' indices in [`ChainPass::segments`].
    segments: Range<usize>,
}

/// A piece of a bucket that travels in one frame.
#[derive(Debug, Clone)]
struct Segment {
    bucket: usize,
    offset: usize,
    len: usize,
    /// The keys it overlaps.
    keys: Vec<usize>,
    /// Lowest layer among them: the priority scheduler sends front layers first.
    layer: usize,
}

/// How far a segment is in the current step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegState {
    /// Waiting for this worker's values or for the running sum from the left.
    Open,
    /// Added and queued (or handed out) to the right; a partial round finishes it once sent.
    Forwarded,
    /// Waiting for the average coming back (exact rounds).
    AwaitAverage,
    /// Final for this step.
    Done,
}

/// The chain strategy of one worker (`ring-reduce`, `stepwise`).
pub struct ChainPass {
    rank: Rank,
    n: usize,
    schedule: ChainSchedule,
    overlap: bool,
    slots: KeySlots,
    buckets: Vec<Bucket>,
    segments: Vec<Segment>,
    /// Own values, then running sums, then the adopted values, per bucket.
    data: Vec<Vec<f32>>,
    /// Running sums received, per step parity and bucket.
    incoming: [Vec<Vec<f32>>; 2],
    /// Per step parity and segment: whether its running sum from the left is in.
    got_sum: [Vec<bool>; 2],
    step: u64,
    begun: bool,
    round: ChainRound,
    position: usize,
    missing_keys: Vec<usize>,
    launched: Vec<bool>,
    seg_state: Vec<SegState>,
    key_segments_left: Vec<usize>,
    segments_left: usize,
    sums_in: usize,
    /// Frames to the right: `(segment, average)`, by index in the scheduler.
    sends: Vec<(usize, bool)>,
    queue: Box<dyn Scheduler>,
    arrivals: u64,
    lent: LentFrames,
    /// An acknowledgement of this step ready to send to the left.
    ack_due: bool,
    /// Whether this step's acknowledgement has been handed out.
    ack_sent: bool,
    /// Whether the right neighbour has acknowledged this step (partial rounds).
    acked: bool,
    step_done: bool,
    events: VecDeque<WorkerEvent>,
}

impl ChainPass {
    /// Worker `rank` of `schedule`'s ring; buckets of at most `bucket_elems` values (a larger
    /// key gets its own), cut into segments of at most `segment_elems`.
    pub fn new(
        rank: Rank,
        schedule: ChainSchedule,
        keys: Vec<KeyInfo>,
        bucket_elems: usize,
        segment_elems: usize,
        overlap: bool,
        scheduler: SchedulerKind,
    ) -> Self {
        let n = schedule.workers();
        let (buckets, segments, slots) = cut_buckets(&keys, bucket_elems, segment_elems);
        let lens: Vec<usize> = buckets
            .iter()
            .map(|b| b.keys.iter().map(|&k| keys[k].numel).sum())
            .collect();
        let zeros = || lens.iter().map(|&l| vec![0.0; l]).collect::<Vec<_>>();
        let segs = segments.len();
        let mut chain = Self {
            rank: rank % n,
            n,
            schedule,
            overlap,
            slots,
            data: zeros(),
            incoming: [zeros(), zeros()],
            got_sum: [vec![false; segs], vec![false; segs]],
            step: 0,
            begun: false,
            round: schedule.round(0),
            position: schedule.position(rank, 0),
            missing_keys: vec![0; buckets.len()],
            launched: vec![false; buckets.len()],
            seg_state: vec![SegState::Open; segs],
            key_segments_left: vec![0; keys.len()],
            segments_left: 0,
            sums_in: 0,
            sends: Vec::new(),
            queue: new_scheduler(scheduler),
            arrivals: 0,
            lent: LentFrames::default(),
            ack_due: false,
            ack_sent: false,
            acked: false,
            step_done: false,
            events: VecDeque::new(),
            buckets,
            segments,
        };
        chain.reset(0);
        chain
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    fn left(&self) -> Rank {
        left_of(self.rank, self.n)
    }

    fn right(&self) -> Rank {
        right_of(self.rank, self.n)
    }

    fn last(&self) -> bool {
        self.position + 1 == self.n
    }

    /// Whether this round ends with this worker's acknowledgement from the right.
    fn needs_ack(&self) -> bool {
        !self.round.exact && !self.last()
    }

    /// Whether this round starts with a running sum from the left.
    fn expects_sums(&self) -> bool {
        self.position > 0
    }

    /// Makes the state that of step `step`, not yet begun, reusing every buffer.
    fn reset(&mut self, step: u64) {
        self.step = step;
        self.round = self.schedule.round(step);
        self.position = self.schedule.position(self.rank, step);
        for (b, bucket) in self.buckets.iter().enumerate() {
            self.missing_keys[b] = bucket.keys.len();
        }
        self.launched.fill(false);
        self.seg_state.fill(SegState::Open);
        self.key_segments_left.fill(0);
        for seg in &self.segments {
            for &k in &seg.keys {
                self.key_segments_left[k] += 1;
            }
        }
        self.segments_left = self.segments.len();
        // Sums of this step may be in already (the left neighbour ran ahead); the slots of
        // the step after are those of the last step, free now.
        let parity = (step % 2) as usize;
        self.sums_in = self.got_sum[parity].iter().filter(|&&g| g).count();
        self.got_sum[1 - parity].fill(false);
        debug_assert!(self.queue.is_empty(), "a step began with frames queued");
        self.sends.clear();
        self.ack_due = false;
        self.ack_sent = false;
        self.acked = false;
        self.step_done = false;
    }

    fn enqueue(&mut self, segment: usize, average: bool) {
        self.sends.push((segment, average));
        self.arrivals += 1;
        let seg = &self.segments[segment];
        self.queue.push(Pending {
            item: self.sends.len() - 1,
            priority: seg.layer as i64,
            sequence: seg.offset as u64,
            arrival: self.arrivals,
        });
    }

    fn range(&self, segment: usize) -> (usize, Range<usize>) {
        let s = &self.segments[segment];
        (s.bucket, s.offset..s.offset + s.len)
    }

    fn launch(&mut self, b: usize) {
        if std::mem::replace(&mut self.launched[b], true) {
            return;
        }
        for &k in &self.buckets[b].keys {
            if self.key_segments_left[k] == 0 {
                self.events.push_back(self.ready(k));
            }
        }
        for segment in self.buckets[b].segments.clone() {
            self.try_add(segment);
        }
        self.maybe_step_done();
    }

    /// Adds the running sum to this worker's values once both are in, and moves on.
    fn try_add(&mut self, segment: usize) {
        let (b, r) = self.range(segment);
        let parity = (self.step % 2) as usize;
        if !self.launched[b]
            || self.seg_state[segment] != SegState::Open
            || (self.expects_sums() && !self.got_sum[parity][segment])
        {
            return;
        }
        if self.expects_sums() {
            add_assign(
                &mut self.data[b][r.clone()],
                &self.incoming[parity][b][r.clone()],
            );
        }
        if !self.last() {
            self.seg_state[segment] = SegState::Forwarded;
            self.enqueue(segment, false);
            return;
        }
        // The last position holds the sum of everyone.
        scale(&mut self.data[b][r], 1.0 / self.n as f32);
        if self.round.exact && self.n > 1 {
            self.enqueue(segment, true);
        }
        self.finish(segment);
    }

    /// A frame of segment `segment` has left (its payload is no longer read).
    fn frame_gone(&mut self, segment: usize, average: bool) {
        if average || self.seg_state[segment] != SegState::Forwarded {
            return;
        }
        if self.round.exact {
            self.seg_state[segment] = SegState::AwaitAverage;
        } else {
            let (b, r) = self.range(segment);
            scale(&mut self.data[b][r], 1.0 / (self.position + 1) as f32);
            self.finish(segment);
        }
    }

    fn ready(&self, key: usize) -> WorkerEvent {
        match self.schedule {
            ChainSchedule::RingReduce { .. } => WorkerEvent::GradReady(key),
            ChainSchedule::Stepwise { .. } => WorkerEvent::ParamsReady(key),
        }
    }

    fn finish(&mut self, segment: usize) {
        self.seg_state[segment] = SegState::Done;
        self.segments_left -= 1;
        for i in 0..self.segments[segment].keys.len() {
            let k = self.segments[segment].keys[i];
            self.key_segments_left[k] -= 1;
            if self.key_segments_left[k] == 0 {
                self.events.push_back(self.ready(k));
            }
        }
        self.maybe_step_done();
    }

    /// Whether this round ends with an acknowledgement to the left neighbour.
    fn owes_ack(&self) -> bool {
        !self.round.exact && self.expects_sums() && !self.segments.is_empty()
    }

    fn maybe_ack(&mut self) {
        if self.begun && self.owes_ack() && !self.ack_sent && self.sums_in == self.segments.len() {
            self.ack_due = true;
        }
    }

    fn maybe_step_done(&mut self) {
        let all_sent =
            self.queue.is_empty() && self.lent.none() && (self.ack_sent || !self.owes_ack());
        let acked = self.acked || !self.needs_ack() || self.segments.is_empty();
        let all_launched = self.launched.iter().all(|&l| l);
        if self.begun
            && !self.step_done
            && all_launched
            && self.segments_left == 0
            && all_sent
            && acked
        {
            self.step_done = true;
            self.events.push_back(WorkerEvent::StepDone);
        }
    }

    /// The segment a data frame names, checked against the chain of its step.
    fn check(&self, link: Rank, h: &Header) -> Result<(usize, usize), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        if self.n == 1 {
            return Err(err("a chain of one worker exchanges nothing"));
        }
        let next = if self.begun { self.step + 1 } else { self.step };
        let b = h.key as usize;
        let bucket = self.buckets.get(b).ok_or_else(|| err("no such bucket"))?;
        let first = bucket.segments.start;
        let segs = &self.segments[bucket.segments.clone()];
        let i = segs
            .binary_search_by_key(&(h.offset as usize), |s| s.offset)
            .ok()
            .filter(|&i| segs[i].len == h.length as usize)
            .ok_or_else(|| err("segment does not match the chain's cut"))?;
        let segment = first + i;
        match h.kind {
            FrameKind::Reduce => {
                if link != self.left() {
                    return Err(err("running sums come only from the left neighbour"));
                }
                let this = self.begun && h.step == self.step;
                if !this && h.step != next {
                    return Err(err(&format!(
                        "wrong step (this worker is at {})",
                        self.step
                    )));
                }
                if self.schedule.position(self.rank, h.step) == 0 {
                    return Err(err("the head of the chain receives no running sum"));
                }
                if self.got_sum[(h.step % 2) as usize][segment] {
                    return Err(err("running sum received twice"));
                }
            }
            FrameKind::Gather => {
                if link != self.left() {
                    return Err(err("the average comes only from the left neighbour"));
                }
                if !self.begun || h.step != self.step {
                    return Err(err(&format!(
                        "wrong step (this worker is at {})",
                        self.step
                    )));
                }
                if !self.round.exact || self.last() {
                    return Err(err("no average comes back to this worker in this round"));
                }
                // The average can only follow this worker's sum, so a sum not yet reported
                // sent (Forwarded) has left all the same.
                if !matches!(
                    self.seg_state[segment],
                    SegState::Forwarded | SegState::AwaitAverage
                ) {
                    return Err(err("average before this worker's sum, or twice"));
                }
            }
            _ => return Err(err("a chain worker expects Reduce, Gather and Ack frames")),
        }
        Ok((b, segment))
    }

    fn check_ack(&self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        if link != self.right() || self.n == 1 {
            return Err(err("acknowledgements come only from the right neighbour"));
        }
        if !self.begun || h.step != self.step || !self.needs_ack() || self.acked {
            return Err(err(&format!(
                "no acknowledgement expected (this worker is at step {})",
                self.step
            )));
        }
        Ok(())
    }

    /// The next frame for the right neighbour: its header, its segment and whether it
    /// carries the average.
    fn next_frame(&mut self) -> Option<(Header, usize, bool)> {
        let p = self.queue.pop()?;
        let (segment, average) = self.sends[p.item];
        let s = &self.segments[segment];
        let kind = if average {
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
        h.priority = s.layer as i32;
        h.sender = self.rank as u32;
        h.sequence = self.position as u64;
        Some((h, segment, average))
    }

    fn ack_header(&self) -> Header {
        let mut h = Header::data(FrameKind::Ack, self.step, 0, 0, 0);
        h.sender = self.rank as u32;
        h
    }

    fn segment_of(&self, h: &Header) -> Option<usize> {
        let bucket = self.buckets.get(h.key as usize)?;
        let segs = &self.segments[bucket.segments.clone()];
        let i = segs
            .binary_search_by_key(&(h.offset as usize), |s| s.offset)
            .ok()?;
        Some(bucket.segments.start + i)
    }
}

/// Cuts `keys` into buckets (as every ring strategy fills them) and the buckets into
/// segments; returns them with each key's slot.
fn cut_buckets(
    keys: &[KeyInfo],
    bucket_elems: usize,
    segment_elems: usize,
) -> (Vec<Bucket>, Vec<Segment>, KeySlots) {
    let fill = Buckets::fill(keys, bucket_elems);
    let slots = KeySlots::new(keys, &fill);
    let mut segments = Vec::new();
    let mut out = Vec::new();
    for (b, (bucket_keys, &len)) in fill.keys.into_iter().zip(&fill.lens).enumerate() {
        let first = segments.len();
        for (offset, seg_len) in cut(0, len, segment_elems) {
            let overlapping: Vec<usize> = bucket_keys
                .iter()
                .copied()
                .filter(|&k| {
                    let start = fill.place[k].1;
                    start < offset + seg_len && offset < start + keys[k].numel
                })
                .collect();
            let layer = overlapping
                .iter()
                .map(|&k| keys[k].layer)
                .min()
                .unwrap_or(0);
            segments.push(Segment {
                bucket: b,
                offset,
                len: seg_len,
                keys: overlapping,
                layer,
            });
        }
        out.push(Bucket {
            keys: bucket_keys,
            segments: first..segments.len(),
        });
    }
    (out, segments, slots)
}

impl WorkerSync for ChainPass {
    fn start_at(&mut self, step: u64) {
        // Round and position of the first step, for its frames arriving before it begins.
        self.reset(step);
    }

    fn begin_step(&mut self, step: u64) {
        self.reset(step);
        self.begun = true;
        self.maybe_ack();
    }

    fn handle_gradient(&mut self, key: usize, values: &[f32]) {
        let (Some((b, off)), Some(len)) = (self.slots.place(key), self.slots.len(key)) else {
            return;
        };
        let n = values.len().min(len);
        self.data[b][off..off + n].copy_from_slice(&values[..n]);
        self.missing_keys[b] = self.missing_keys[b].saturating_sub(1);
        if self.overlap && self.missing_keys[b] == 0 {
            self.launch(b);
        }
    }

    fn handle_backward_done(&mut self) {
        for b in 0..self.buckets.len() {
            if self.missing_keys[b] == 0 {
                self.launch(b);
            }
        }
        self.maybe_step_done();
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.events.pop_front()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.slots.values(&self.data, key).to_vec()
    }
}

impl Endpoint for ChainPass {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        if self.n == 1 {
            return false;
        }
        if link == self.left() && self.ack_due {
            self.ack_due = false;
            self.ack_sent = true;
            encode_data_frame(out, &self.ack_header(), &[]);
            self.maybe_step_done();
            return true;
        }
        if link != self.right() {
            return false;
        }
        let Some((h, segment, average)) = self.next_frame() else {
            return false;
        };
        let (b, r) = self.range(segment);
        encode_data_frame(out, &h, &self.data[b][r]);
        self.frame_gone(segment, average);
        self.maybe_step_done();
        true
    }

    /// The acknowledgement first, then the data: the same choice whatever the links' order.
    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        let (left, right) = (self.left(), self.right());
        if self.ack_due && links.contains(&left) && self.poll_transmit(left, out) {
            return Some(left);
        }
        (links.contains(&right) && self.poll_transmit(right, out)).then_some(right)
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        if self.n == 1 {
            return None;
        }
        if self.ack_due && links.contains(&self.left()) {
            self.poll_transmit(self.left(), out);
            return Some(Transmit::Copied(self.left()));
        }
        if !links.contains(&self.right()) {
            return None;
        }
        let (h, _, _) = self.next_frame()?;
        Some(self.lent.lend(out, self.right(), h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        match self.segment_of(h) {
            Some(segment) => {
                let (b, r) = self.range(segment);
                &self.data[b][r]
            }
            None => &[],
        }
    }

    fn handle_sent(&mut self, _link: Rank, h: &Header) {
        self.lent.returned();
        if let Some(segment) = self.segment_of(h).filter(|_| h.step == self.step) {
            self.frame_gone(segment, h.kind == FrameKind::Gather);
        }
        self.maybe_step_done();
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        if h.kind == FrameKind::Ack {
            self.check_ack(link, h)?;
            return Ok(&mut []);
        }
        let (b, segment) = self.check(link, h)?;
        let (_, r) = self.range(segment);
        Ok(if h.kind == FrameKind::Gather {
            &mut self.data[b][r]
        } else {
            &mut self.incoming[(h.step % 2) as usize][b][r]
        })
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        if h.kind == FrameKind::Ack {
            self.check_ack(link, h)?;
            self.acked = true;
            self.maybe_step_done();
            return Ok(());
        }
        let (_, segment) = self.check(link, h)?;
        if h.kind == FrameKind::Gather {
            if self.position + 2 < self.n {
                self.enqueue(segment, true);
            }
            self.finish(segment);
            return Ok(());
        }
        self.got_sum[(h.step % 2) as usize][segment] = true;
        if self.begun && h.step == self.step {
            self.sums_in += 1;
            self.maybe_ack();
            self.try_add(segment);
            self.maybe_step_done();
        }
        Ok(())
    }
}
