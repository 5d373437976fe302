//! The bookkeeping of DLCP over the ring ([`super::ring::DlcpRing`]): its two phases, the
//! hops into a worker and how far each has come, and the sending of each chunk.

use std::collections::VecDeque;

use super::chunks::RingChunks;
use super::tally::{packets_needed, PacketTally};
use crate::wire::FrameKind;

/// The two halves of the ring all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Phase {
    /// All-gather: forwards complete sums (served before reduce-scatter packets).
    Gather = 0,
    /// Reduce-scatter: forwards partial sums.
    Reduce = 1,
}

impl Phase {
    pub(super) fn kind(self) -> FrameKind {
        match self {
            Phase::Reduce => FrameKind::Reduce,
            Phase::Gather => FrameKind::Gather,
        }
    }

    pub(super) fn from_sequence(sequence: u64) -> Option<Phase> {
        match sequence {
            0 => Some(Phase::Reduce),
            1 => Some(Phase::Gather),
            _ => None,
        }
    }

    pub(super) fn sequence(self) -> u64 {
        match self {
            Phase::Reduce => 0,
            Phase::Gather => 1,
        }
    }
}

/// The hops into this worker of one phase and step, per bucket and chunk (`bucket * n + chunk`).
pub(super) struct Hops {
    pub(super) tally: Vec<PacketTally>,
    /// The sender has sent every packet once (it probed): the bound may complete the hop.
    pub(super) probed: Vec<bool>,
    /// Complete: the sender was stopped, what is missing filled in and passed on.
    pub(super) done: Vec<bool>,
}

impl Hops {
    pub(super) fn new(geo: &RingChunks, n: usize, ppm: u64) -> Self {
        let tally: Vec<PacketTally> = (0..geo.keys() * n)
            .map(|i| {
                let packets = geo.chunk_packets(i / n, i % n);
                PacketTally::new(packets, packets_needed(packets, ppm))
            })
            .collect();
        let mut hops = Self {
            probed: vec![false; tally.len()],
            done: vec![false; tally.len()],
            tally,
        };
        hops.reset();
        hops
    }

    pub(super) fn reset(&mut self) {
        self.tally.iter_mut().for_each(PacketTally::reset);
        self.probed.fill(false);
        for (done, t) in self.done.iter_mut().zip(&self.tally) {
            *done = t.is_whole();
        }
    }

    /// Whether hop `i` may complete now: every packet is in, or the sender has sent them
    /// all and enough are in. Counting alone would stop packets that are merely behind.
    pub(super) fn may_complete(&self, i: usize) -> bool {
        !self.done[i]
            && (self.tally[i].is_whole() || (self.probed[i] && self.tally[i].is_complete()))
    }
}

/// The receive side of one step: both phases' hops, and reduce packets that came before
/// this worker's own gradient.
pub(super) struct Round {
    pub(super) step: u64,
    pub(super) hops: [Hops; 2],
    pub(super) inbox: Vec<Vec<f32>>,
}

/// This worker's sending of one chunk of one bucket in one phase, this step.
#[derive(Debug, Default, Clone)]
pub(super) struct ChunkSend {
    pub(super) queue: VecDeque<usize>,
    /// Packets made ready to go (each once); a probe waits for all of them.
    pub(super) ready: usize,
    pub(super) handed: usize,
    pub(super) stopped: bool,
    pub(super) probing: bool,
}
