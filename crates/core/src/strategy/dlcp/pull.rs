//! MLT's loss-tolerant pulls for `--strategy dlcp` (`--pull-loss-bound p > 0`): a server
//! sends each worker's parameters as loss-tolerant packets, probes after a share's last
//! packet and resends what the worker says is missing; the worker completes a key's share
//! once every packet is in, or once the server has sent them all and ceil((1 - p) n) are
//! in. An entry whose packet never came keeps the value of the step before (the first step
//! of a run needs every packet, so every worker starts from the servers' values).

use std::collections::{BTreeSet, VecDeque};

use super::geometry::{Geometry, PacketId};
use super::tally::{packets_needed, PacketTally};

/// The server's sending of parameters to one worker: per key, the share's packets still to
/// send and whether the worker has stopped them.
pub struct PullSender {
    /// Per key: packets to send (indices in the share), in order.
    queues: Vec<VecDeque<usize>>,
    /// Per key: the packets made ready so far this step (a probe waits for all).
    ready: Vec<usize>,
    stopped: Vec<bool>,
    probing: Vec<bool>,
    /// Keys with a packet or a probe to send, by (layer, key).
    pub active: BTreeSet<(usize, usize)>,
    /// Per key: the values of this step's parameters (the share's slices in place).
    pub values: Vec<Vec<f32>>,
    /// Per key: the step being sent.
    pub step: Vec<u64>,
}

/// What the next frame of a [`PullSender`] is.
pub enum PullFrame {
    /// Packet `PacketId` of `key`.
    Packet(usize, PacketId),
    /// The probe after the share of `key`.
    Probe(usize),
}

impl PullSender {
    /// A sender of the shares of server `server` in `geo`.
    pub fn new(geo: &Geometry) -> Self {
        let keys = geo.registry().keys();
        Self {
            queues: vec![VecDeque::new(); keys.len()],
            ready: vec![0; keys.len()],
            stopped: vec![true; keys.len()],
            probing: vec![false; keys.len()],
            active: BTreeSet::new(),
            values: keys.iter().map(|k| vec![0.0; k.numel]).collect(),
            step: vec![0; keys.len()],
        }
    }

    /// The parameters of `slice` (values `values`, step `step`) are ready for the worker.
    pub fn take_slice(
        &mut self,
        geo: &Geometry,
        slice: usize,
        step: u64,
        layer: usize,
        values: &[f32],
    ) {
        let s = geo.registry().slices()[slice];
        if self.step[s.key] != step || self.stopped[s.key] {
            self.step[s.key] = step;
            self.ready[s.key] = 0;
            self.stopped[s.key] = false;
            self.probing[s.key] = false;
            self.queues[s.key].clear();
        }
        if let Some(dest) = self.values[s.key].get_mut(s.offset..s.offset + s.len) {
            dest.copy_from_slice(&values[..s.len.min(values.len())]);
        }
        for p in geo.packets_of(slice) {
            self.queues[s.key].push_back(p.in_share);
            self.ready[s.key] += 1;
        }
        self.active.insert((layer, s.key));
    }

    /// The next frame of the most urgent key, `None` if nothing is to be sent.
    pub fn next(&mut self, geo: &Geometry, server: usize) -> Option<PullFrame> {
        loop {
            let &(layer, key) = self.active.first()?;
            if let Some(i) = self.queues[key].pop_front() {
                if let Some(p) = geo.share_packet(key, server, i) {
                    return Some(PullFrame::Packet(key, p));
                }
                continue;
            }
            self.active.remove(&(layer, key));
            let all = self.ready[key] >= geo.share_packets(key, server);
            if all && !self.stopped[key] && !self.probing[key] {
                self.probing[key] = true;
                return Some(PullFrame::Probe(key));
            }
        }
    }

    /// The worker has enough of `key`'s share of step `step`; false if that is not the
    /// step being sent.
    pub fn stop(&mut self, key: usize, step: u64, layer: usize) -> bool {
        if self.step.get(key) != Some(&step) {
            return false;
        }
        self.stopped[key] = true;
        self.queues[key].clear();
        self.active.remove(&(layer, key));
        true
    }

    /// The worker's answer to a probe of `key`'s share of step `step`: resend `missing`.
    /// False if it answers no probe outstanding (stale, or a duplicate).
    pub fn resend(&mut self, key: usize, step: u64, layer: usize, missing: Vec<usize>) -> bool {
        if self.step.get(key) != Some(&step) || self.stopped[key] || !self.probing[key] {
            return false;
        }
        self.probing[key] = false;
        self.queues[key].extend(missing);
        self.active.insert((layer, key));
        true
    }

    /// The probe of `key`'s share went unanswered for its timeout: it goes again, unless
    /// the share has been stopped or answered since.
    pub fn probe_again(&mut self, key: usize, layer: usize) {
        if self.probing.get(key) == Some(&true) && !self.stopped[key] {
            self.probing[key] = false;
            self.active.insert((layer, key));
        }
    }

    /// Whether any share has not been stopped yet.
    pub fn pending(&self) -> bool {
        self.stopped.iter().any(|s| !s)
    }
}

/// What a worker did with a parameter packet or a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// Nothing to do yet (or the frame was late or a duplicate).
    Nothing,
    /// The share is complete: hand its slices over and send Stop.
    Complete,
    /// Answer the probe with this bitmap of missing packets.
    Missing(Vec<u32>),
}

/// The worker's receiving of parameters: per key and server, the packets of this step.
pub struct PullReceiver {
    bound_ppm: u64,
    servers: usize,
    /// Per key and server (`key * servers + server`).
    tallies: Vec<PacketTally>,
    probed: Vec<bool>,
    done: Vec<bool>,
    /// Per key: the latest values received (a lost entry keeps the one before).
    pub values: Vec<Vec<f32>>,
    /// The step whose shares are being received.
    step: u64,
    /// Whether this step must have every packet (the first of a run).
    exact: bool,
}

impl PullReceiver {
    /// A receiver of `geo`'s shares under a bound of `bound_ppm`.
    pub fn new(geo: &Geometry, bound_ppm: u64) -> Self {
        let servers = geo.registry().servers().max(1);
        let keys = geo.registry().keys();
        let mut r = Self {
            bound_ppm,
            servers,
            tallies: Vec::new(),
            probed: vec![false; keys.len() * servers],
            done: vec![false; keys.len() * servers],
            values: keys.iter().map(|k| vec![0.0; k.numel]).collect(),
            step: 0,
            exact: true,
        };
        r.tallies = (0..keys.len() * servers)
            .map(|i| PacketTally::new(geo.share_packets(i / servers, i % servers), 0))
            .collect();
        r.begin(geo, 0, true);
        r
    }

    /// Starts step `step`; `exact` if every packet is needed (the run's first step).
    pub fn begin(&mut self, geo: &Geometry, step: u64, exact: bool) {
        self.step = step;
        self.exact = exact;
        let ppm = if exact { 0 } else { self.bound_ppm };
        for (i, t) in self.tallies.iter_mut().enumerate() {
            let n = geo.share_packets(i / self.servers, i % self.servers);
            *t = PacketTally::new(n, packets_needed(n, ppm));
        }
        self.probed.fill(false);
        for (d, t) in self.done.iter_mut().zip(&self.tallies) {
            *d = t.is_whole();
        }
    }

    fn may_complete(&self, i: usize) -> bool {
        !self.done[i]
            && (self.tallies[i].is_whole() || (self.probed[i] && self.tallies[i].is_complete()))
    }

    fn complete(&mut self, i: usize) -> PullEvent {
        self.done[i] = true;
        PullEvent::Complete
    }

    /// Packet `p` of `key` from `server` of step `step`, its values `values`.
    pub fn packet(
        &mut self,
        key: usize,
        server: usize,
        step: u64,
        p: &PacketId,
        values: &[f32],
    ) -> PullEvent {
        let i = key * self.servers + server;
        if step != self.step || self.done[i] || self.tallies[i].has(p.in_share) {
            return PullEvent::Nothing;
        }
        self.tallies[i].mark(p.in_share);
        if let Some(dest) = self.values[key].get_mut(p.offset..p.offset + p.len) {
            dest.copy_from_slice(&values[..p.len.min(values.len())]);
        }
        if self.may_complete(i) {
            return self.complete(i);
        }
        PullEvent::Nothing
    }

    /// The server has sent every packet of `key`'s share of `step`.
    pub fn probe(&mut self, key: usize, server: usize, step: u64) -> PullEvent {
        let i = key * self.servers + server;
        if step != self.step || self.done[i] {
            return PullEvent::Nothing;
        }
        self.probed[i] = true;
        if self.may_complete(i) {
            return self.complete(i);
        }
        self.probed[i] = false;
        PullEvent::Missing(self.tallies[i].missing_words())
    }

    /// Whether `key`'s share from `server` lacked packets when it completed: the entries
    /// kept the step before's values. Returns the values filled.
    pub fn filled(&self, geo: &Geometry, key: usize, server: usize) -> u64 {
        let i = key * self.servers + server;
        (0..geo.share_packets(key, server))
            .filter(|&j| !self.tallies[i].has(j))
            .filter_map(|j| geo.share_packet(key, server, j))
            .map(|p| p.len as u64)
            .sum()
    }
}
