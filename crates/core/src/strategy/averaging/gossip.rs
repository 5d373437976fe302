//! Gossip (decentralised SGD on the ring): every step each worker sends its freshly
//! optimised weights to its two ring neighbours and adopts the mix
//! `a * w_left + b * w_own + a * w_right` of a doubly stochastic mixing matrix
//! ([`gossip_weights`]). Approximate: the workers' weights differ, but their average over
//! the workers is what it would be without the exchange ([`mix_into`] keeps it).
//!
//! Each key travels on its own, cut into [`FrameKind::Mix`] frames, to both neighbours as
//! soon as it is handed over; the key is mixed once its own weights and both neighbours'
//! values of the step are in. A worker cannot finish a step without both neighbours'
//! values of that step, so neighbours are at most one step apart: two receive buffers, by
//! step parity, take the frames of the step after this one.

use std::collections::VecDeque;
use std::ops::Range;

use crate::registry::KeyInfo;
use crate::sched::{LinkQueues, Pending, SchedulerKind};
use crate::strategy::bucket::cut;
use crate::strategy::ring_layout::{left_of, right_of, LentFrames};
use crate::strategy::{Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::wire::{encode_data_frame, FrameKind, Header};

/// The weights of one row of gossip's mixing matrix on a ring: what a worker's own values
/// and each distinct neighbour's values count in its mix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixWeights {
    /// The weight of the worker's own values (`b`).
    pub own: f64,
    /// The weight of each distinct ring neighbour's values (`a`).
    pub neighbour: f64,
}

/// The mixing weights on a ring of `workers`: a third each from 3 workers on; a half each
/// with 2 (the one neighbour is both left and right); the own values alone with 1.
pub fn gossip_weights(workers: usize) -> MixWeights {
    match workers {
        0 | 1 => MixWeights {
            own: 1.0,
            neighbour: 0.0,
        },
        2 => MixWeights {
            own: 0.5,
            neighbour: 0.5,
        },
        _ => MixWeights {
            own: 1.0 / 3.0,
            neighbour: 1.0 / 3.0,
        },
    }
}

/// The ranks worker `rank` exchanges with on a ring of `workers`, left neighbour first:
/// two from 3 workers on, one with 2, none with 1.
pub fn gossip_peers(rank: Rank, workers: usize) -> Vec<Rank> {
    if workers < 2 {
        return Vec::new();
    }
    let mut peers = vec![left_of(rank, workers), right_of(rank, workers)];
    peers.dedup();
    peers
}

/// The dense mixing matrix of a ring of `workers`: row `i` holds what each worker's
/// values count in worker `i`'s mix. Doubly stochastic (every row and column sums to 1).
pub fn gossip_matrix(workers: usize) -> Vec<Vec<f64>> {
    let w = gossip_weights(workers);
    (0..workers)
        .map(|i| {
            let mut row = vec![0.0; workers];
            if let Some(own) = row.get_mut(i) {
                *own += w.own;
            }
            for j in gossip_peers(i, workers) {
                if let Some(cell) = row.get_mut(j) {
                    *cell += w.neighbour;
                }
            }
            row
        })
        .collect()
}

/// Writes the mix of `own` with `neighbours` (left first, then right; none or one where
/// the ring has fewer) into `out`: `a * left + b * own + a * right` element by element,
/// summed in that order in `f64` and rounded once, so the same inputs give the same bits
/// everywhere. Only the first `len` elements are written, `len` being the shortest slice's
/// length.
pub fn mix_into(out: &mut [f32], own: &[f32], neighbours: &[&[f32]], weights: MixWeights) {
    let len = neighbours
        .iter()
        .fold(out.len().min(own.len()), |m, v| m.min(v.len()));
    let (first, rest) = match neighbours.split_first() {
        Some((first, rest)) => (Some(&first[..len]), rest),
        None => (None, neighbours),
    };
    for (i, (o, &mine)) in out[..len].iter_mut().zip(&own[..len]).enumerate() {
        let mut acc = first.map_or(0.0, |l| weights.neighbour * f64::from(l[i]));
        acc += weights.own * f64::from(mine);
        for r in rest {
            acc += weights.neighbour * f64::from(r[i]);
        }
        *o = acc as f32;
    }
}

/// One frame of a key: the same cut for every step and both neighbours.
#[derive(Debug, Clone, Copy)]
struct Frame {
    key: usize,
    offset: usize,
    len: usize,
    /// The key's layer: the priority scheduler sends front layers first.
    layer: usize,
}

/// The gossip strategy of one worker (`gossip`).
pub struct Gossip {
    rank: Rank,
    weights: MixWeights,
    /// The ranks of the neighbours, left first (their index is the side).
    peers: Vec<Rank>,
    frame_elems: usize,
    frames: Vec<Frame>,
    /// Per key: its frames' indices in [`Gossip::frames`].
    key_frames: Vec<Range<usize>>,
    /// Per key: the weights handed over this step (what is sent).
    own: Vec<Vec<f32>>,
    /// Per key: the mix adopted this step.
    mixed: Vec<Vec<f32>>,
    /// Per step parity, side and key: the neighbour's values.
    incoming: [Vec<Vec<Vec<f32>>>; 2],
    /// Per step parity: whether frame `side * frames + frame` is in.
    got: [Vec<bool>; 2],
    /// Per step parity and key: frames in from all sides.
    frames_in: [Vec<usize>; 2],
    step: u64,
    begun: bool,
    handed: Vec<bool>,
    done: Vec<bool>,
    keys_left: usize,
    /// One queue per side, of frame indices.
    queues: LinkQueues,
    arrivals: u64,
    lent: LentFrames,
    step_done: bool,
    events: VecDeque<WorkerEvent>,
}

impl Gossip {
    /// Worker `rank` of a ring of `workers`, synchronising `keys` in frames of at most
    /// `frame_elems` values, sent in `scheduler`'s order.
    pub fn new(
        rank: Rank,
        workers: usize,
        keys: Vec<KeyInfo>,
        frame_elems: usize,
        scheduler: SchedulerKind,
    ) -> Self {
        let workers = workers.max(1);
        let rank = rank % workers;
        let peers = gossip_peers(rank, workers);
        let frame_elems = frame_elems.max(1);
        let mut frames = Vec::new();
        let mut key_frames = Vec::with_capacity(keys.len());
        for (key, info) in keys.iter().enumerate() {
            let first = frames.len();
            frames.extend(
                cut(0, info.numel, frame_elems)
                    .into_iter()
                    .map(|(offset, len)| Frame {
                        key,
                        offset,
                        len,
                        layer: info.layer,
                    }),
            );
            key_frames.push(first..frames.len());
        }
        let zeros = || keys.iter().map(|k| vec![0.0; k.numel]).collect::<Vec<_>>();
        let per_side = || peers.iter().map(|_| zeros()).collect::<Vec<_>>();
        let flags = vec![false; peers.len() * frames.len()];
        let mut gossip = Self {
            rank,
            weights: gossip_weights(workers),
            frame_elems,
            key_frames,
            own: zeros(),
            mixed: zeros(),
            incoming: [per_side(), per_side()],
            got: [flags.clone(), flags],
            frames_in: [vec![0; keys.len()], vec![0; keys.len()]],
            step: 0,
            begun: false,
            handed: vec![false; keys.len()],
            done: vec![false; keys.len()],
            keys_left: keys.len(),
            queues: LinkQueues::new(scheduler, peers.len()),
            arrivals: 0,
            lent: LentFrames::default(),
            step_done: false,
            events: VecDeque::new(),
            frames,
            peers,
        };
        gossip.reset(0);
        gossip
    }

    /// The mixing weights this worker uses.
    pub fn weights(&self) -> MixWeights {
        self.weights
    }

    /// The side (index in the peers, left first) of `link`, if it is a neighbour.
    fn side_of(&self, link: Rank) -> Option<usize> {
        self.peers.iter().position(|&p| p == link)
    }

    /// Makes the state that of step `step`, not yet begun, reusing every buffer. Frames of
    /// `step` may be in already (a neighbour ran ahead); the other parity's were the last
    /// step's, all consumed.
    fn reset(&mut self, step: u64) {
        debug_assert!(self.queues.is_empty(), "a step began with frames queued");
        self.step = step;
        self.handed.fill(false);
        self.done.fill(false);
        self.keys_left = self.handed.len();
        let other = 1 - (step % 2) as usize;
        self.got[other].fill(false);
        self.frames_in[other].fill(0);
        self.step_done = false;
    }

    /// Queues every frame of `key` for every neighbour.
    fn enqueue(&mut self, key: usize) {
        let Some(range) = self.key_frames.get(key).cloned() else {
            return;
        };
        for frame in range {
            let f = self.frames[frame];
            for side in 0..self.peers.len() {
                self.arrivals += 1;
                let pending = Pending {
                    item: frame,
                    priority: f.layer as i64,
                    sequence: f.offset as u64,
                    arrival: self.arrivals,
                };
                self.queues.push(side, pending);
            }
        }
    }

    /// Mixes `key` once its own weights and every neighbour's values of the step are in.
    fn try_mix(&mut self, key: usize) {
        let parity = (self.step % 2) as usize;
        let needed = self.peers.len() * self.key_frames.get(key).map_or(0, |r| r.len());
        let ready = self.handed.get(key) == Some(&true)
            && self.done.get(key) == Some(&false)
            && self.frames_in[parity].get(key) == Some(&needed);
        if !ready {
            return;
        }
        let neighbours: Vec<&[f32]> = self.incoming[parity]
            .iter()
            .map(|side| side[key].as_slice())
            .collect();
        mix_into(
            &mut self.mixed[key],
            &self.own[key],
            &neighbours,
            self.weights,
        );
        self.done[key] = true;
        self.keys_left -= 1;
        self.events.push_back(WorkerEvent::ParamsReady(key));
        self.maybe_step_done();
    }

    fn maybe_step_done(&mut self) {
        if self.begun
            && !self.step_done
            && self.keys_left == 0
            && self.queues.is_empty()
            && self.lent.none()
        {
            self.step_done = true;
            self.events.push_back(WorkerEvent::StepDone);
        }
    }

    /// The frame a header names (its key, offset and length exactly as cut here).
    fn frame_of(&self, h: &Header) -> Option<usize> {
        let range = self.key_frames.get(h.key as usize)?;
        let index = h.offset as usize / self.frame_elems;
        let frame = range
            .start
            .checked_add(index)
            .filter(|f| range.contains(f))?;
        let f = self.frames.get(frame)?;
        (f.offset == h.offset as usize && f.len == h.length as usize).then_some(frame)
    }

    /// The side and frame a received header names, checked against the protocol state.
    fn check(&self, link: Rank, h: &Header) -> Result<(usize, usize), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        if h.kind != FrameKind::Mix {
            return Err(err("a gossip worker expects Mix frames only"));
        }
        let side = self
            .side_of(link)
            .ok_or_else(|| err("gossip frames come only from the ring neighbours"))?;
        let this = self.begun && h.step == self.step;
        let next = if self.begun {
            self.step.checked_add(1)
        } else {
            Some(self.step)
        };
        if !this && Some(h.step) != next {
            return Err(err(&format!(
                "wrong step (this worker is at {})",
                self.step
            )));
        }
        let frame = self
            .frame_of(h)
            .ok_or_else(|| err("frame does not match the keys' cut"))?;
        let parity = (h.step % 2) as usize;
        if self.got[parity][side * self.frames.len() + frame] {
            return Err(err("frame received twice"));
        }
        Ok((side, frame))
    }

    /// The header of frame `frame` of this step.
    fn header(&self, frame: usize) -> Header {
        let f = self.frames[frame];
        let mut h = Header::data(
            FrameKind::Mix,
            self.step,
            f.key as u32,
            f.offset as u32,
            f.len as u32,
        );
        h.priority = i32::try_from(f.layer).unwrap_or(i32::MAX);
        h.sender = self.rank as u32;
        h.sequence = frame as u64;
        h
    }

    /// Own values of this step under a header's key and range (empty if none).
    fn own_values(&self, h: &Header) -> &[f32] {
        let start = h.offset as usize;
        let Some(end) = usize::try_from(h.end()).ok() else {
            return &[];
        };
        self.own
            .get(h.key as usize)
            .and_then(|v| v.get(start..end))
            .unwrap_or(&[])
    }

    /// The most urgent side among `links` with a frame queued.
    fn most_urgent_side(&self, links: &[Rank]) -> Option<usize> {
        let offered = |side: usize| self.peers.get(side).is_some_and(|p| links.contains(p));
        let sides = (0..self.peers.len()).filter(|&s| offered(s));
        self.queues.most_urgent_offered(sides, offered)
    }

    /// Takes the head of `side`'s queue: its header.
    fn next_frame(&mut self, side: usize) -> Option<Header> {
        let p = self.queues.pop(side)?;
        Some(self.header(p.item))
    }
}

impl WorkerSync for Gossip {
    fn start_at(&mut self, step: u64) {
        self.begun = false;
        self.reset(step);
    }

    fn begin_step(&mut self, step: u64) {
        self.reset(step);
        self.begun = true;
        self.maybe_step_done();
    }

    /// The freshly optimised weights of `key` (weight averaging hands weights, not
    /// gradients): sent to both neighbours at once. A key handed twice in a step, or before
    /// the step began, is ignored.
    fn handle_gradient(&mut self, key: usize, weights: &[f32]) {
        if !self.begun || self.handed.get(key) != Some(&false) {
            return;
        }
        let own = &mut self.own[key];
        let n = weights.len().min(own.len());
        own[..n].copy_from_slice(&weights[..n]);
        self.handed[key] = true;
        self.enqueue(key);
        self.try_mix(key);
    }

    fn handle_backward_done(&mut self) {
        self.maybe_step_done();
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.events.pop_front()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.mixed.get(key).cloned().unwrap_or_default()
    }
}

impl Endpoint for Gossip {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        let Some(h) = self.side_of(link).and_then(|side| self.next_frame(side)) else {
            return false;
        };
        encode_data_frame(out, &h, self.own_values(&h));
        self.maybe_step_done();
        true
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        let link = *self.peers.get(self.most_urgent_side(links)?)?;
        self.poll_transmit(link, out).then_some(link)
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        let side = self.most_urgent_side(links)?;
        let link = *self.peers.get(side)?;
        let h = self.next_frame(side)?;
        Some(self.lent.lend(out, link, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        self.own_values(h)
    }

    fn handle_sent(&mut self, _link: Rank, _h: &Header) {
        self.lent.returned();
        self.maybe_step_done();
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        let (side, frame) = self.check(link, h)?;
        let f = self.frames[frame];
        let parity = (h.step % 2) as usize;
        Ok(&mut self.incoming[parity][side][f.key][f.offset..f.offset + f.len])
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let (side, frame) = self.check(link, h)?;
        let parity = (h.step % 2) as usize;
        self.got[parity][side * self.frames.len() + frame] = true;
        let key = self.frames[frame].key;
        self.frames_in[parity][key] += 1;
        if self.begun && h.step == self.step {
            self.try_mix(key);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "gossip_tests.rs"]
mod tests;
