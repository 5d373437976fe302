//! DLCP over the ring (`--strategy dlcp-allreduce`): a ring all-reduce whose hops carry
//! loss-tolerant packets and complete at the loss bound.
//!
//! Keys are grouped into buckets as the ring all-reduce groups them (in the order backward
//! produces them, up to `--bucket-size`), and a bucket starts once all its keys are in.
//! Each bucket is cut into one chunk per worker. In the reduce-scatter, worker `r` sends its
//! own chunk `r` to its right-hand neighbour, adds each packet of chunk `r - 1 - s` that
//! arrives at hop `s` to its gradient and forwards it at hop `s + 1`, packet by packet; the
//! owner of chunk `r + 1` holds its whole sum after hop `n - 2`. The all-gather forwards the
//! owners' sums around the ring the same way. Every hop is counted as a DLCP server counts a
//! share: once `ceil((1 - p) n)` of a chunk's packets are in, the receiver sends Stop to the
//! sender and forwards the packets still missing with what it has (its own values: the lost
//! contributions are simply missing from the sum). A sender that has sent a chunk's packets
//! without a Stop probes; the receiver answers with the bitmap of what is missing.
//!
//! The all-gather is reliable and exact by default; with a pull bound above 0 it is
//! loss-tolerant too, and a lost entry keeps the previous step's value (MLT's pulls).
//! Additions are `local + received` in ring order, so with no loss every worker ends with
//! the same bits in any interleaving. Control frames (Probe, Stop, Missing) name the chunk
//! in `offset` and the phase in `sequence` (0 reduce-scatter, 1 all-gather).

use std::collections::{BTreeSet, VecDeque};

mod checks;

use super::chunks::RingChunks;
use super::control::ControlQueue;
use super::ring_hops::{ChunkSend, Hops, Phase, Round};
use super::tally::{indices_of, PacketTally};
use super::{class_of_layer, drop_eligible, DlcpOptions, KeyLoss, LossStats};
use crate::aggregate::{add_assign, scale};
use crate::registry::KeyInfo;
use crate::strategy::bucket::Buckets;
use crate::strategy::ring_layout::{left_of, right_of, KeySlots, LentFrames};
use crate::strategy::{
    frame_values, Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync,
};
use crate::wire::{encode_data_frame, f32_bytes, Flags, FrameKind, Header};

/// The worker side of `--strategy dlcp-allreduce`.
pub struct DlcpRing {
    rank: Rank,
    n: usize,
    left: Rank,
    right: Rank,
    opts: DlcpOptions,
    /// Where each key sits in the buckets.
    slots: KeySlots,
    /// Per bucket: its keys and their offsets, in fill order.
    bucket_keys: Vec<Vec<(usize, usize)>>,
    /// Per bucket: keys of this step still to come.
    missing_keys: Vec<usize>,
    /// Per bucket: the front-most layer among its keys (its priority).
    layers: Vec<usize>,
    classes: usize,
    geo: RingChunks,
    step: u64,
    begun: bool,
    sum: Vec<Vec<f32>>,
    out: Vec<Vec<f32>>,
    rounds: [Round; 2],
    /// Per bucket: every key of this step is in and the bucket has started.
    grad_in: Vec<bool>,
    finished: Vec<bool>,
    buckets_left: usize,
    /// Per bucket, chunk and phase (`(bucket * n + chunk) * 2 + phase`).
    sends: Vec<ChunkSend>,
    sends_open: usize,
    active: BTreeSet<(usize, Phase, usize, usize)>,
    /// Stops and Missing bitmaps for the left-hand neighbour.
    control: ControlQueue,
    events: VecDeque<WorkerEvent>,
    step_done: bool,
    lent: LentFrames,
    sequence: u64,
    scratch: Vec<f32>,
    bitmap: Vec<f32>,
    marks: Vec<Vec<bool>>,
    stats: LossStats,
    key_loss: Vec<KeyLoss>,
}

impl DlcpRing {
    /// Worker `rank` of a ring of `workers` for a model with these keys, in buckets of at
    /// most `bucket_elems` values (a larger key gets a bucket of its own).
    pub fn new(
        rank: Rank,
        workers: usize,
        model: Vec<KeyInfo>,
        bucket_elems: usize,
        opts: DlcpOptions,
    ) -> Self {
        let n = workers.max(1);
        let fill = Buckets::fill(&model, bucket_elems.max(1));
        let layers: Vec<usize> = fill
            .keys
            .iter()
            .map(|ks| ks.iter().map(|&k| model[k].layer).min().unwrap_or(0))
            .collect();
        let keys: Vec<KeyInfo> = fill
            .lens
            .iter()
            .zip(&layers)
            .map(|(&numel, &layer)| KeyInfo { numel, layer })
            .collect();
        let bucket_keys = fill.keys_at();
        let geo = RingChunks::new(&keys, n, opts.packet_elems);
        let round = || Round {
            step: u64::MAX,
            hops: [
                Hops::new(&geo, n, opts.pull_loss_bound_ppm()),
                Hops::new(&geo, n, opts.loss_bound_ppm()),
            ],
            inbox: keys.iter().map(|k| vec![0.0; k.numel]).collect(),
        };
        let rounds = [round(), round()];
        Self {
            rank,
            n,
            left: left_of(rank, n),
            right: right_of(rank, n),
            slots: KeySlots::new(&model, &fill),
            bucket_keys,
            missing_keys: vec![0; keys.len()],
            layers,
            classes: model.iter().map(|k| k.layer + 1).max().unwrap_or(1),
            step: 0,
            begun: false,
            sum: keys.iter().map(|k| vec![0.0; k.numel]).collect(),
            out: keys.iter().map(|k| vec![0.0; k.numel]).collect(),
            rounds,
            grad_in: vec![false; keys.len()],
            finished: vec![false; keys.len()],
            buckets_left: 0,
            sends: vec![ChunkSend::default(); keys.len() * n * 2],
            sends_open: 0,
            active: BTreeSet::new(),
            control: ControlQueue::default(),
            events: VecDeque::new(),
            step_done: true,
            lent: LentFrames::default(),
            sequence: 0,
            scratch: vec![0.0; opts.packet_elems.max(1)],
            bitmap: Vec::new(),
            marks: vec![Vec::new(); keys.len()],
            stats: LossStats::default(),
            key_loss: vec![KeyLoss::default(); model.len()],
            opts,
            geo,
        }
    }

    fn send_index(&self, bucket: usize, chunk: usize, phase: Phase) -> usize {
        (bucket * self.n + chunk) * 2 + phase as usize
    }

    /// The chunk this worker owns the sum of after the reduce-scatter.
    fn owned(&self) -> usize {
        (self.rank + 1) % self.n
    }

    /// Whether this worker sends chunk `c` in `phase`: every chunk but the one it owns in
    /// the reduce-scatter, every chunk but its right-hand neighbour's in the all-gather.
    fn sends_chunk(&self, phase: Phase, c: usize) -> bool {
        self.n > 1
            && match phase {
                Phase::Reduce => c != self.owned(),
                Phase::Gather => c != (self.rank + 2) % self.n,
            }
    }

    /// Whether this worker receives chunk `c` in `phase`.
    fn receives_chunk(&self, phase: Phase, c: usize) -> bool {
        self.n > 1
            && match phase {
                Phase::Reduce => c != self.rank,
                Phase::Gather => c != self.owned(),
            }
    }

    fn phase_reliable(&self, phase: Phase) -> bool {
        phase == Phase::Gather && self.opts.pull_loss_bound_ppm() == 0
    }

    fn class(&self, bucket: usize) -> u8 {
        if self.opts.priority {
            class_of_layer(self.layers[bucket], self.classes)
        } else {
            0
        }
    }

    /// The receive state of step `x`, started afresh if it held an earlier step (which is
    /// over: only this step's and the next one's frames are accepted).
    fn round(&mut self, x: u64) -> &mut Round {
        let r = &mut self.rounds[(x % 2) as usize];
        if r.step != x {
            r.step = x;
            r.hops.iter_mut().for_each(Hops::reset);
        }
        r
    }

    fn queue(&mut self, phase: Phase, bucket: usize, c: usize, j: usize) {
        let i = self.send_index(bucket, c, phase);
        let s = &mut self.sends[i];
        if s.stopped {
            return;
        }
        s.queue.push_back(j);
        s.ready += 1;
        self.active.insert((self.layers[bucket], phase, bucket, c));
    }

    /// Packet `j` of chunk `c` of `bucket` is as complete as it will get at this worker this
    /// step (added, or filled): pass it on.
    fn ready_reduced(&mut self, bucket: usize, c: usize, j: usize) {
        let hop = (self.rank + self.n - 1 - c) % self.n;
        if hop + 2 < self.n {
            self.queue(Phase::Reduce, bucket, c, j);
            return;
        }
        if let Some(p) = self.geo.packet(bucket, c, j) {
            let range = p.offset..p.offset + p.len;
            self.out[bucket][range.clone()].copy_from_slice(&self.sum[bucket][range]);
            self.queue(Phase::Gather, bucket, c, j);
        }
    }

    /// Reduce packets of chunk `c` held for this step: adds those that arrived and passes
    /// on those ready (all once the hop is complete).
    fn absorb_reduce(&mut self, bucket: usize, c: usize) {
        let step = self.step;
        let packets = self.geo.chunk_packets(bucket, c);
        let idx = bucket * self.n + c;
        for j in 0..packets {
            let round = self.round(step);
            let hops = &round.hops[Phase::Reduce as usize];
            let (has, complete) = (hops.tally[idx].has(j), hops.done[idx]);
            if has {
                if let Some(p) = self.geo.packet(bucket, c, j) {
                    let range = p.offset..p.offset + p.len;
                    let inbox = &self.rounds[(step % 2) as usize].inbox[bucket];
                    add_assign(&mut self.sum[bucket][range.clone()], &inbox[range]);
                }
            }
            if has || complete {
                self.ready_reduced(bucket, c, j);
            }
        }
    }

    /// Counts the values filled when a hop completes.
    fn count_fill(&mut self, phase: Phase, bucket: usize, c: usize, tally: &PacketTally) {
        let packets = self.geo.chunk_packets(bucket, c);
        let mut values = 0u64;
        let mut filled = 0u64;
        for j in 0..packets {
            let Some(p) = self.geo.packet(bucket, c, j) else {
                continue;
            };
            let lost = !tally.has(j);
            values += p.len as u64;
            filled += if lost { p.len as u64 } else { 0 };
            if phase == Phase::Reduce {
                self.attribute(bucket, p.offset, p.offset + p.len, lost);
            }
        }
        match phase {
            Phase::Reduce => {
                self.stats.entries += values;
                self.stats.entries_filled += filled;
            }
            Phase::Gather => self.stats.entries_stale += filled,
        }
    }

    /// Counts the values `[start, end)` of `bucket` received (and, if `lost`, filled in)
    /// against the keys they belong to.
    fn attribute(&mut self, bucket: usize, start: usize, end: usize, lost: bool) {
        for &(key, off) in &self.bucket_keys[bucket] {
            let len = self.slots.len(key).unwrap_or(0);
            let overlap = end.min(off + len).saturating_sub(start.max(off)) as u64;
            self.key_loss[key].entries += overlap;
            if lost {
                self.key_loss[key].filled += overlap;
            }
        }
    }

    fn control_header(
        &self,
        kind: FrameKind,
        x: u64,
        bucket: usize,
        c: usize,
        phase: Phase,
    ) -> Header {
        let mut h = Header::data(kind, x, bucket as u32, c as u32, 0);
        h.sequence = phase.sequence();
        h.sender = self.rank as u32;
        h.flags = Flags::class(self.class(bucket));
        h.priority = self.layers[bucket] as i32;
        h
    }

    fn check_final(&mut self, bucket: usize) {
        if self.finished[bucket] || !self.grad_in[bucket] || !self.begun {
            return;
        }
        let step = self.step;
        let owned = self.owned();
        let n = self.n;
        if n > 1 {
            let round = self.round(step);
            let base = bucket * n;
            let [gather, reduce] = &round.hops;
            let done =
                reduce.done[base + owned] && (0..n).all(|c| c == owned || gather.done[base + c]);
            if !done {
                return;
            }
        }
        self.finished[bucket] = true;
        self.buckets_left -= 1;
        for &(key, _) in &self.bucket_keys[bucket] {
            self.events.push_back(WorkerEvent::GradReady(key));
        }
        self.maybe_step_done();
    }

    fn maybe_step_done(&mut self) {
        if !self.step_done
            && self.begun
            && self.buckets_left == 0
            && self.sends_open == 0
            && self.lent.none()
        {
            self.step_done = true;
            self.events.push_back(WorkerEvent::StepDone);
        }
    }

    fn close_send(&mut self, i: usize) {
        let s = &mut self.sends[i];
        if !s.stopped {
            s.stopped = true;
            s.queue.clear();
            self.sends_open -= 1;
        }
    }

    /// The next data frame for the right-hand neighbour: the most urgent chunk's next
    /// packet, or its probe after the last.
    fn next_data(&mut self) -> Option<Header> {
        loop {
            let &(layer, phase, bucket, c) = self.active.first()?;
            let i = self.send_index(bucket, c, phase);
            if let Some(j) = self.sends[i].queue.pop_front() {
                return self.packet_header(i, layer, phase, bucket, c, j);
            }
            self.active.remove(&(layer, phase, bucket, c));
            let reliable = self.phase_reliable(phase);
            let all_ready = self.sends[i].ready >= self.geo.chunk_packets(bucket, c);
            let s = &mut self.sends[i];
            if all_ready && !(reliable || s.stopped || s.probing) {
                s.probing = true;
                return Some(self.control_header(FrameKind::Probe, self.step, bucket, c, phase));
            }
        }
    }

    /// The header of packet `j` of send `i`, taken off its queue.
    fn packet_header(
        &mut self,
        i: usize,
        layer: usize,
        phase: Phase,
        bucket: usize,
        c: usize,
        j: usize,
    ) -> Option<Header> {
        let reliable = self.phase_reliable(phase);
        let p = self.geo.packet(bucket, c, j)?;
        let mut h = Header::data(
            phase.kind(),
            self.step,
            bucket as u32,
            p.offset as u32,
            p.len as u32,
        );
        let mut flags = Flags::class(self.class(bucket));
        if !reliable {
            let marked = phase == Phase::Reduce
                && self.opts.priority
                && self.marks[bucket].get(p.in_key).copied().unwrap_or(false);
            flags = flags
                .loss_tolerant()
                .drop_eligible_if(marked)
                .spray_if(self.opts.spray);
        }
        h.flags = flags;
        h.priority = layer as i32;
        h.sequence = self.sequence;
        h.sender = self.rank as u32;
        self.sequence += 1;
        if reliable {
            self.sends[i].handed += 1;
            if self.sends[i].handed >= self.geo.chunk_packets(bucket, c) {
                self.close_send(i);
            }
            if self.sends[i].queue.is_empty() {
                self.active.remove(&(layer, phase, bucket, c));
            }
        }
        Some(h)
    }

    fn payload(&self, h: &Header) -> &[f32] {
        match h.kind {
            FrameKind::Reduce => frame_values(&self.sum, h),
            FrameKind::Gather => frame_values(&self.out, h),
            _ => &[],
        }
    }

    fn handle_packet(&mut self, link: Rank, h: &Header, phase: Phase) -> Result<(), ProtocolError> {
        self.check_link(link, h, true)?;
        let bucket = h.key as usize;
        let p = self
            .geo
            .locate(bucket, h.offset as usize, h.length as usize)
            .ok_or_else(|| ProtocolError::unexpected(link, h, "not a packet of the bucket"))?;
        if !self.receives_chunk(phase, p.chunk) {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a chunk this worker does not receive in that phase",
            ));
        }
        if !self.check_incoming_step(link, h, phase == Phase::Reduce)? {
            self.stats.packets_ignored += 1;
            return Ok(());
        }
        let x = h.step;
        let idx = bucket * self.n + p.chunk;
        let hops = &mut self.round(x).hops[phase as usize];
        if hops.done[idx] || hops.tally[idx].has(p.in_chunk) {
            self.stats.packets_ignored += 1;
            return Ok(());
        }
        hops.tally[idx].mark(p.in_chunk);
        let completed = hops.may_complete(idx);
        self.stats.packets += 1;
        let range = p.offset..p.offset + p.len;
        let values = &self.scratch[..p.len];
        let current = x == self.step && self.grad_in[bucket];
        match phase {
            Phase::Reduce if current => {
                add_assign(&mut self.sum[bucket][range], values);
                self.ready_reduced(bucket, p.chunk, p.in_chunk);
            }
            Phase::Reduce => {
                self.rounds[(x % 2) as usize].inbox[bucket][range].copy_from_slice(values);
            }
            Phase::Gather => {
                self.out[bucket][range].copy_from_slice(values);
                if self.sends_chunk(Phase::Gather, p.chunk) {
                    self.queue(Phase::Gather, bucket, p.chunk, p.in_chunk);
                }
            }
        }
        if completed {
            self.hop_complete(x, bucket, p.chunk, phase, current);
        }
        self.check_final(bucket);
        Ok(())
    }

    /// A hop into this worker has enough packets: stop the sender, fill in, pass on.
    fn hop_complete(&mut self, x: u64, bucket: usize, c: usize, phase: Phase, current: bool) {
        let idx = bucket * self.n + c;
        let hops = &mut self.round(x).hops[phase as usize];
        hops.done[idx] = true;
        let tally = hops.tally[idx].clone();
        self.count_fill(phase, bucket, c, &tally);
        if !self.phase_reliable(phase) {
            self.stats.stops += 1;
            let header = self.control_header(FrameKind::Stop, x, bucket, c, phase);
            self.control.push_stop(header);
        }
        let forward = match phase {
            Phase::Reduce => current,
            Phase::Gather => self.sends_chunk(Phase::Gather, c),
        };
        if !forward {
            return;
        }
        for j in (0..self.geo.chunk_packets(bucket, c)).filter(|&j| !tally.has(j)) {
            match phase {
                Phase::Reduce => self.ready_reduced(bucket, c, j),
                Phase::Gather => self.queue(Phase::Gather, bucket, c, j),
            }
        }
    }

    fn handle_probe(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let (bucket, c, phase) = self.flowing_control_target(link, h)?;
        if !self.check_incoming_step(link, h, phase == Phase::Reduce)? {
            return Ok(());
        }
        let idx = bucket * self.n + c;
        let hops = &mut self.round(h.step).hops[phase as usize];
        if hops.done[idx] {
            return Ok(());
        }
        hops.probed[idx] = true;
        if hops.may_complete(idx) {
            let current = h.step == self.step && self.grad_in[bucket];
            self.hop_complete(h.step, bucket, c, phase, current);
            self.check_final(bucket);
            return Ok(());
        }
        // The sender resends what is missing and probes again when it is through.
        hops.probed[idx] = false;
        let words = hops.tally[idx].missing_words();
        self.stats.probes_answered += 1;
        let header = self.control_header(FrameKind::Missing, h.step, bucket, c, phase);
        self.control.push_missing(header, words);
        Ok(())
    }

    fn handle_missing(
        &mut self,
        link: Rank,
        h: &Header,
        (bucket, c, phase): (usize, usize, Phase),
    ) -> Result<(), ProtocolError> {
        let i = self.send_index(bucket, c, phase);
        let words: Vec<u32> = self.bitmap.iter().map(|w| w.to_bits()).collect();
        let missing = indices_of(&words, self.geo.chunk_packets(bucket, c))
            .map_err(|e| ProtocolError::unexpected(link, h, &e))?;
        let s = &mut self.sends[i];
        if s.stopped || !s.probing {
            return Ok(());
        }
        s.probing = false;
        s.queue.extend(missing);
        self.active.insert((self.layers[bucket], phase, bucket, c));
        Ok(())
    }
}

impl WorkerSync for DlcpRing {
    fn start_at(&mut self, step: u64) {
        self.step = step;
        self.begun = false;
    }

    fn begin_step(&mut self, step: u64) {
        self.step = step;
        self.begun = true;
        self.step_done = false;
        self.grad_in.fill(false);
        self.finished.fill(false);
        self.buckets_left = self.geo.keys();
        for (missing, keys) in self.missing_keys.iter_mut().zip(&self.bucket_keys) {
            *missing = keys.len();
        }
        self.active.clear();
        self.sends_open = 0;
        for bucket in 0..self.geo.keys() {
            for c in 0..self.n {
                for phase in [Phase::Reduce, Phase::Gather] {
                    let expected =
                        self.sends_chunk(phase, c) && self.geo.chunk_packets(bucket, c) > 0;
                    let i = self.send_index(bucket, c, phase);
                    self.sends[i] = ChunkSend {
                        stopped: !expected,
                        ..ChunkSend::default()
                    };
                    self.sends_open += usize::from(expected);
                }
            }
        }
        self.round(step);
        self.maybe_step_done();
    }

    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        let (Some((bucket, off)), Some(len)) = (self.slots.place(key), self.slots.len(key)) else {
            return;
        };
        if self.grad_in[bucket] || !self.begun || self.missing_keys[bucket] == 0 {
            return;
        }
        let len = len.min(grad.len());
        self.sum[bucket][off..off + len].copy_from_slice(&grad[..len]);
        self.missing_keys[bucket] -= 1;
        if self.missing_keys[bucket] == 0 {
            self.launch(bucket);
        }
    }

    fn handle_backward_done(&mut self) {}

    /// Reduce-scatter values received per hop and filled in (a value filled at hop `s`
    /// loses the contributions of the `s + 1` workers before this one on its chunk's way)
    /// and, with a pull bound, all-gather values that kept the previous step's.
    fn loss_stats(&self) -> Option<LossStats> {
        Some(self.stats)
    }

    fn key_loss(&self) -> Vec<KeyLoss> {
        self.key_loss.clone()
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.events.pop_front()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        let mut v = self.slots.values(&self.out, key).to_vec();
        if self.n > 1 {
            scale(&mut v, 1.0 / self.n as f32);
        }
        v
    }
}

impl DlcpRing {
    /// Every key of `bucket` is in: its own chunk goes out, reduce packets that came early
    /// are added.
    fn launch(&mut self, bucket: usize) {
        self.grad_in[bucket] = true;
        if self.n == 1 {
            let (out, sum) = (&mut self.out[bucket], &self.sum[bucket]);
            out.copy_from_slice(sum);
            self.check_final(bucket);
            return;
        }
        if self.opts.priority && self.opts.drop_quantile > 0.0 {
            let mut means: Vec<f32> = Vec::with_capacity(self.geo.key_packets(bucket));
            means.extend(
                (0..self.n)
                    .flat_map(|c| (0..self.geo.chunk_packets(bucket, c)).map(move |j| (c, j)))
                    .filter_map(|(c, j)| self.geo.packet(bucket, c, j))
                    .map(|p| {
                        let v = &self.sum[bucket][p.offset..p.offset + p.len];
                        v.iter().map(|x| x.abs()).sum::<f32>() / v.len().max(1) as f32
                    }),
            );
            self.marks[bucket] = drop_eligible(&means, self.opts.drop_quantile);
        }
        let own = self.rank;
        for j in 0..self.geo.chunk_packets(bucket, own) {
            self.queue(Phase::Reduce, bucket, own, j);
        }
        for c in (0..self.n).filter(|&c| c != own) {
            self.absorb_reduce(bucket, c);
        }
        self.check_final(bucket);
    }
}

impl Endpoint for DlcpRing {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        match self.poll_transmit_lent(&[link], out) {
            Some(Transmit::Lent(l, h)) => {
                out.extend_from_slice(f32_bytes(self.payload(&h)));
                self.handle_sent(l, &h);
                true
            }
            Some(Transmit::Copied(_)) => true,
            None => false,
        }
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        if self.n < 2 {
            return None;
        }
        if links.contains(&self.left) && self.control.encode_next(out) {
            return Some(Transmit::Copied(self.left));
        }
        if !links.contains(&self.right) {
            return None;
        }
        let h = self.next_data()?;
        if h.kind == FrameKind::Probe {
            encode_data_frame(out, &h, &[]);
            self.maybe_step_done();
            return Some(Transmit::Copied(self.right));
        }
        Some(self.lent.lend(out, self.right, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        self.payload(h)
    }

    fn handle_sent(&mut self, _link: Rank, _h: &Header) {
        self.lent.returned();
        self.maybe_step_done();
    }

    fn accepts_loss(&self, link: Rank, h: &Header) -> bool {
        link == self.left
            && match h.kind {
                FrameKind::Reduce => true,
                FrameKind::Gather => !self.phase_reliable(Phase::Gather),
                _ => false,
            }
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        match h.kind {
            FrameKind::Reduce | FrameKind::Gather => {
                self.check_link(link, h, true)?;
                let p = self
                    .geo
                    .locate(h.key as usize, h.offset as usize, h.length as usize)
                    .ok_or_else(|| {
                        ProtocolError::unexpected(link, h, "not a packet of the bucket")
                    })?;
                Ok(&mut self.scratch[..p.len])
            }
            FrameKind::Probe | FrameKind::Stop => {
                self.check_link(link, h, h.kind == FrameKind::Probe)?;
                self.control_target(link, h)?;
                if h.length != 0 {
                    return Err(ProtocolError::unexpected(
                        link,
                        h,
                        "a control frame with values",
                    ));
                }
                Ok(&mut [])
            }
            FrameKind::Missing => {
                self.check_link(link, h, false)?;
                let (bucket, c, _) = self.control_target(link, h)?;
                let words = self.geo.chunk_packets(bucket, c).div_ceil(32);
                if h.length as usize != words {
                    return Err(ProtocolError::unexpected(
                        link,
                        h,
                        "a bitmap of the wrong size",
                    ));
                }
                self.bitmap.resize(words, 0.0);
                Ok(self.bitmap.as_mut_slice())
            }
            _ => Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP ring worker expects packets, probes, stops and bitmaps",
            )),
        }
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        match h.kind {
            FrameKind::Reduce => self.handle_packet(link, h, Phase::Reduce),
            FrameKind::Gather => self.handle_packet(link, h, Phase::Gather),
            FrameKind::Probe => self.handle_probe(link, h),
            FrameKind::Stop => {
                if let Some((bucket, c, phase)) = self.outgoing_target(link, h)? {
                    self.active.remove(&(self.layers[bucket], phase, bucket, c));
                    self.close_send(self.send_index(bucket, c, phase));
                    self.maybe_step_done();
                }
                Ok(())
            }
            FrameKind::Missing => match self.outgoing_target(link, h)? {
                Some(target) => self.handle_missing(link, h, target),
                None => Ok(()),
            },
            _ => Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP ring worker expects packets, probes, stops and bitmaps",
            )),
        }
    }
}
