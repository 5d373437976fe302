//! The DLCP worker: a P3 worker whose slices go out as loss-tolerant packets, most urgent
//! layer first, each share ending in a probe (its reliable last packet over TCP, a Probe
//! datagram after it otherwise) until its server says Stop.

use std::collections::VecDeque;

use super::control::ControlQueue;
use super::geometry::{Geometry, PacketId};
use super::probe::ProbeTimers;
use super::pull::{PullEvent, PullReceiver};
use super::tally::indices_of;
use super::{class_of_layer, drop_eligible, DlcpOptions, LossStats};
use crate::strategy::{Endpoint, ProtocolError, PsWorker, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::wire::{Flags, FrameKind, Header};

/// A server's head in [`DlcpWorker::heads`] while it has no share to send.
const IDLE: u64 = u64::MAX;

/// A share's place in the order of urgency, (layer, key) packed into one word so that
/// choosing among the servers compares words (a registry of 2^32 keys or layers would
/// only tie, not misorder, the shares beyond).
fn urgency(layer: usize, key: usize) -> u64 {
    let part = |v: usize| {
        u64::try_from(v)
            .unwrap_or(u64::MAX)
            .min(u64::from(u32::MAX - 1))
    };
    (part(layer) << 32) | part(key)
}

/// What this worker still has to do for one server's share of one key this step.
#[derive(Debug, Default)]
struct SendShare {
    queue: VecDeque<PacketId>,
    stopped: bool,
    probing: bool,
}

/// The worker side of `--strategy dlcp`.
pub struct DlcpWorker {
    inner: PsWorker,
    geo: Geometry,
    rank: Rank,
    workers: usize,
    servers: usize,
    opts: DlcpOptions,
    layers: usize,
    step: u64,
    sequence: u64,
    /// Per share that holds packets (numbered by [`Geometry::share_slot`]).
    shares: Vec<SendShare>,
    /// Per server: the shares with a packet or a probe to send, (layer, key) in descending
    /// order: the most urgent is the last, where it is taken off and where the backward
    /// pass, whose keys come ever more urgent, puts each new one.
    active: Vec<Vec<(usize, usize)>>,
    /// Per server: the [`urgency`] of its most urgent `active` share ([`IDLE`]: none),
    /// beside the list so that choosing among the links reads one word per server.
    heads: Vec<u64>,
    /// How many servers have a head (none between a step's sends and the next backward,
    /// when a poll need not look at any link).
    sending: usize,
    /// Per key: which of its packets are drop-eligible this step.
    marks: Vec<Vec<bool>>,
    /// Per server link: a Missing frame's bitmap as it arrives.
    bitmap: Vec<Vec<f32>>,
    drained: Vec<u8>,
    /// With a pull bound: the parameters' loss-tolerant packets received.
    pull: Option<PullReceiver>,
    /// The run's first step (its pulls need every packet).
    first_step: u64,
    /// Per server: Stops and Missing bitmaps about the parameters, to send.
    answers: Vec<ControlQueue>,
    /// How many servers have answers to send (none most of the time, so a poll for one
    /// need not look at every link).
    answering: usize,
    /// Per server link: one parameter packet's values as it arrives. A driver may read a
    /// packet in parts, asking for its slot again each time, while whole packets of other
    /// servers arrive in between: one buffer per link keeps the parts together.
    packet: Vec<Vec<f32>>,
    /// With control datagrams: the re-probe timers of the shares (indexed as `shares`).
    timers: Option<ProbeTimers>,
    stats: LossStats,
}

impl DlcpWorker {
    /// Worker `rank` of `workers`, wrapping the P3 worker `inner` whose registry `geo` cuts.
    pub fn new(
        inner: PsWorker,
        geo: Geometry,
        rank: Rank,
        workers: usize,
        opts: DlcpOptions,
    ) -> Self {
        let keys = geo.registry().keys().len();
        let servers = geo.registry().servers().max(1);
        let layers = geo
            .registry()
            .keys()
            .iter()
            .map(|k| k.layer + 1)
            .max()
            .unwrap_or(1);
        Self {
            inner,
            rank,
            workers,
            servers,
            opts,
            layers,
            step: 0,
            sequence: 0,
            shares: (0..geo.shares()).map(|_| SendShare::default()).collect(),
            active: vec![Vec::new(); servers],
            heads: vec![IDLE; servers],
            sending: 0,
            marks: vec![Vec::new(); keys],
            bitmap: vec![Vec::new(); servers],
            drained: Vec::new(),
            pull: (opts.pull_loss_bound_ppm() > 0)
                .then(|| PullReceiver::new(&geo, opts.pull_loss_bound_ppm())),
            first_step: 0,
            answers: (0..servers).map(|_| ControlQueue::default()).collect(),
            answering: 0,
            packet: vec![vec![0.0; geo.max_packet()]; servers],
            timers: opts
                .control_datagrams
                .then(|| ProbeTimers::new(geo.shares(), servers)),
            stats: LossStats::default(),
            geo,
        }
    }

    fn server_of(&self, link: Rank) -> Option<usize> {
        link.checked_sub(self.workers).filter(|&s| s < self.servers)
    }

    fn layer(&self, key: usize) -> usize {
        self.geo.registry().keys().get(key).map_or(0, |k| k.layer)
    }

    fn class(&self, key: usize) -> u8 {
        if self.opts.priority {
            class_of_layer(self.layer(key), self.layers)
        } else {
            0
        }
    }

    /// Takes every slice the P3 worker has released and queues its packets.
    fn drain(&mut self) {
        let links: Vec<Rank> = (self.workers..self.workers + self.servers).collect();
        loop {
            self.drained.clear();
            let h = match self.inner.poll_transmit_lent(&links, &mut self.drained) {
                Some(Transmit::Lent(_, h)) => h,
                Some(Transmit::Copied(_)) => {
                    let mut raw = [0u8; crate::wire::HEADER_LEN];
                    raw.copy_from_slice(&self.drained[..crate::wire::HEADER_LEN]);
                    match Header::decode(&raw, u32::MAX) {
                        Ok(h) => h,
                        Err(_) => continue,
                    }
                }
                None => return,
            };
            let reg = self.geo.registry();
            let Some(slice) = reg.find_slice(h.key as usize, h.offset as usize, h.length as usize)
            else {
                continue;
            };
            let server = reg.owner(slice);
            let key = h.key as usize;
            let Some(share) =
                (self.geo.share_slot(key, server)).and_then(|i| self.shares.get_mut(i))
            else {
                continue;
            };
            share.queue.extend(self.geo.packets_of(slice));
            if !share.stopped {
                let layer = self.layer(key);
                self.activate(server, (layer, key));
            }
        }
    }

    /// Marks `share` (layer, key) of `server` as having a packet or a probe to send.
    fn activate(&mut self, server: usize, share: (usize, usize)) {
        let set = &mut self.active[server];
        if let Err(i) = set.binary_search_by(|s| share.cmp(s)) {
            set.insert(i, share);
        }
        self.update_head(server);
    }

    /// Marks `share` (layer, key) of `server` as having nothing to send.
    fn deactivate(&mut self, server: usize, share: (usize, usize)) {
        let set = &mut self.active[server];
        if let Ok(i) = set.binary_search_by(|s| share.cmp(s)) {
            set.remove(i);
        }
        self.update_head(server);
    }

    /// `server`'s head after its `active` shares changed.
    fn update_head(&mut self, server: usize) {
        let head = self.active[server].last().copied();
        let head = head.map_or(IDLE, |(layer, key)| urgency(layer, key));
        match (self.heads[server] != IDLE, head != IDLE) {
            (false, true) => self.sending += 1,
            (true, false) => self.sending = self.sending.saturating_sub(1),
            _ => {}
        }
        self.heads[server] = head;
    }

    /// The server among `links` whose most urgent share comes first.
    fn most_urgent(&self, links: &[Rank]) -> Option<usize> {
        if self.sending == 0 {
            return None;
        }
        let mut best = (IDLE, usize::MAX);
        for s in links.iter().filter_map(|&l| self.server_of(l)) {
            best = best.min((self.heads[s], s));
        }
        (best.0 != IDLE).then_some(best.1)
    }

    /// The next frame of `server`'s most urgent share: a packet, or the probe after its last.
    /// Where control travels on the reliable path, the last packet is the probe: it travels
    /// reliably, marked [`Flags::last_of_share`], and no Probe frame follows it.
    fn next_frame(&mut self, server: usize) -> Option<Header> {
        let &(layer, key) = self.active[server].last()?;
        let class = self.class(key);
        let slot = self.geo.share_slot(key, server)?;
        let share = self.shares.get_mut(slot)?;
        let h = match share.queue.pop_front() {
            Some(p) => {
                let mut h = Header::data(
                    FrameKind::Push,
                    self.step,
                    key as u32,
                    p.offset as u32,
                    p.len as u32,
                );
                if share.queue.is_empty() && !self.opts.control_datagrams {
                    share.probing = true;
                    h.flags = Flags::class(class).last_of_share();
                    self.deactivate(server, (layer, key));
                    return Some(self.stamped(h, layer));
                }
                let marked =
                    self.opts.priority && self.marks[key].get(p.in_key).copied().unwrap_or(false);
                h.flags = Flags::class(class)
                    .loss_tolerant()
                    .drop_eligible_if(marked)
                    .spray_if(self.opts.spray);
                h
            }
            None => {
                share.probing = true;
                self.deactivate(server, (layer, key));
                let mut h = Header::data(FrameKind::Probe, self.step, key as u32, 0, 0);
                h.flags = self.control_flags(class);
                if let Some(t) = self.timers.as_mut() {
                    t.probe_sent(slot);
                }
                h
            }
        };
        Some(self.stamped(h, layer))
    }

    /// `h` with its layer's priority, this worker's next sequence number and its rank.
    fn stamped(&mut self, mut h: Header, layer: usize) -> Header {
        h.priority = layer as i32;
        h.sequence = self.sequence;
        h.sender = self.rank as u32;
        self.sequence += 1;
        h
    }

    fn check(&self, link: Rank, h: &Header) -> Result<usize, ProtocolError> {
        let server = self.server_of(link).ok_or_else(|| {
            ProtocolError::unexpected(link, h, "a worker accepts frames only from servers")
        })?;
        if self.geo.share_packets(h.key as usize, server) == 0 {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "that server owns no share of the key",
            ));
        }
        if h.step > self.step {
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!("step ahead (this worker is at step {})", self.step),
            ));
        }
        Ok(server)
    }

    /// The flags of a control frame (a Probe, Stop or Missing) of class `class`.
    fn control_flags(&self, class: u8) -> Flags {
        let flags = Flags::class(class);
        if self.opts.control_datagrams {
            flags.loss_tolerant()
        } else {
            flags
        }
    }

    fn handle_stop(&mut self, server: usize, h: &Header) {
        let key = h.key as usize;
        let layer = self.layer(key);
        let Some(slot) = self.geo.share_slot(key, server) else {
            return;
        };
        if let Some(t) = self.timers.as_mut() {
            t.answered(slot);
        }
        let Some(share) = self.shares.get_mut(slot) else {
            return;
        };
        share.stopped = true;
        share.queue.clear();
        self.deactivate(server, (layer, key));
    }

    fn handle_missing(
        &mut self,
        link: Rank,
        server: usize,
        h: &Header,
    ) -> Result<(), ProtocolError> {
        let key = h.key as usize;
        let packets = self.geo.share_packets(key, server);
        let words: Vec<u32> = self.bitmap[server].iter().map(|w| w.to_bits()).collect();
        let missing =
            indices_of(&words, packets).map_err(|e| ProtocolError::unexpected(link, h, &e))?;
        let layer = self.layer(key);
        let Some(slot) = self.geo.share_slot(key, server) else {
            return Ok(());
        };
        let Some(share) = self.shares.get_mut(slot) else {
            return Ok(());
        };
        if share.stopped || !share.probing {
            return Ok(());
        }
        share.probing = false;
        if let Some(t) = self.timers.as_mut() {
            t.answered(slot);
        }
        share.queue.extend(
            missing
                .into_iter()
                .filter_map(|i| self.geo.share_packet(key, server, i)),
        );
        self.activate(server, (layer, key));
        Ok(())
    }
}

impl DlcpWorker {
    /// A parameter packet or a probe from `server`, with a pull bound.
    fn handle_pull(&mut self, link: Rank, server: usize, h: &Header) -> Result<(), ProtocolError> {
        let key = h.key as usize;
        let Some(pull) = self.pull.as_mut() else {
            return Ok(());
        };
        let event = if h.kind == FrameKind::Probe {
            pull.probe(key, server, h.step)
        } else {
            let p = self
                .geo
                .locate(key, h.offset as usize, h.length as usize)
                .filter(|p| self.geo.registry().owner(p.slice) == server)
                .ok_or_else(|| {
                    ProtocolError::unexpected(link, h, "not a packet of that server's share")
                })?;
            let values = self
                .packet
                .get(server)
                .and_then(|packet| packet.get(..p.len))
                .ok_or_else(|| {
                    ProtocolError::unexpected(link, h, "a packet longer than a packet")
                })?;
            pull.packet(key, server, h.step, &p, values)
        };
        let mut answer = Header::data(FrameKind::Stop, h.step, h.key, 0, 0);
        answer.sender = self.rank as u32;
        answer.flags = self.control_flags(self.class(key));
        match event {
            // A probe of a share complete (or of a step gone): its Stop may have been lost.
            PullEvent::Nothing if h.kind == FrameKind::Probe && self.timers.is_some() => {
                self.answer(server, |q| q.push_stop(answer));
                Ok(())
            }
            PullEvent::Nothing => Ok(()),
            PullEvent::Missing(words) => {
                self.stats.probes_answered += 1;
                self.answer(server, |q| q.push_missing(answer, words));
                Ok(())
            }
            PullEvent::Complete => {
                self.answer(server, |q| q.push_stop(answer));
                self.hand_over_params(link, server, key)
            }
        }
    }

    /// `server`'s share of `key`'s parameters is complete: its slices go to the P3 worker,
    /// lost entries with the values of the step before.
    fn hand_over_params(
        &mut self,
        link: Rank,
        server: usize,
        key: usize,
    ) -> Result<(), ProtocolError> {
        let Some(pull) = self.pull.as_ref() else {
            return Ok(());
        };
        self.stats.entries_stale += pull.filled(&self.geo, key, server);
        let reg = self.geo.registry();
        let slices: Vec<_> = reg
            .slices_of(key)
            .filter(|&s| reg.owner(s) == server)
            .map(|s| reg.slices()[s])
            .collect();
        for s in slices {
            let mut h = Header::data(
                FrameKind::Params,
                self.step,
                key as u32,
                s.offset as u32,
                s.len as u32,
            );
            h.sender = link as u32;
            let values = &pull.values[key][s.offset..s.offset + s.len];
            self.inner.recv_slot(link, &h)?.copy_from_slice(values);
            self.inner.handle_payload(link, &h)?;
        }
        Ok(())
    }

    /// Queues an answer to `server` with `push`.
    fn answer(&mut self, server: usize, push: impl FnOnce(&mut ControlQueue)) {
        let queue = &mut self.answers[server];
        let was_empty = queue.is_empty();
        push(queue);
        if was_empty && !queue.is_empty() {
            self.answering += 1;
        }
    }

    /// The next Stop or Missing for a server among `links`.
    fn poll_answer(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        if self.answering == 0 {
            return None;
        }
        let link = links.iter().copied().find(|&l| {
            self.server_of(l)
                .is_some_and(|s| !self.answers[s].is_empty())
        })?;
        let server = self.server_of(link)?;
        let queue = &mut self.answers[server];
        let sent = queue.encode_next(out);
        if queue.is_empty() {
            self.answering = self.answering.saturating_sub(1);
        }
        sent.then_some(link)
    }
}

impl WorkerSync for DlcpWorker {
    fn start_at(&mut self, step: u64) {
        self.inner.start_at(step);
        self.step = step;
        self.first_step = step;
    }

    fn begin_step(&mut self, step: u64) {
        self.inner.begin_step(step);
        self.step = step;
        let exact = step == self.first_step;
        if let Some(pull) = self.pull.as_mut() {
            pull.begin(&self.geo, step, exact);
        }
        for s in &mut self.shares {
            s.queue.clear();
            s.stopped = false;
            s.probing = false;
        }
        if let Some(t) = self.timers.as_mut() {
            t.clear();
        }
        self.active.iter_mut().for_each(Vec::clear);
        self.heads.fill(IDLE);
        self.sending = 0;
    }

    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        if self.opts.priority && self.opts.drop_quantile > 0.0 {
            let reg = self.geo.registry();
            let means: Vec<f32> = reg
                .slices_of(key)
                .flat_map(|s| self.geo.packets_of(s))
                .map(|p| {
                    let v = grad.get(p.offset..p.offset + p.len).unwrap_or_default();
                    v.iter().map(|x| x.abs()).sum::<f32>() / v.len().max(1) as f32
                })
                .collect();
            self.marks[key] = drop_eligible(&means, self.opts.drop_quantile);
        }
        self.inner.handle_gradient(key, grad);
        self.drain();
    }

    fn handle_backward_done(&mut self) {
        self.inner.handle_backward_done();
        self.drain();
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.inner.poll_event()
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.inner.take_values(key)
    }

    /// With a pull bound: the parameter values that kept the step before's value.
    fn loss_stats(&self) -> Option<LossStats> {
        self.pull.as_ref().map(|_| self.stats)
    }
}

impl Endpoint for DlcpWorker {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        self.poll_transmit_any(&[link], out).is_some()
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        if let Some(link) = self.poll_answer(links, out) {
            return Some(link);
        }
        let server = self.most_urgent(links)?;
        let h = self.next_frame(server)?;
        crate::wire::encode_data_frame(out, &h, self.inner.lent_payload(&h));
        Some(self.workers + server)
    }

    // A packet's values stay unchanged until the next step's backward, which starts only
    // after every share has been stopped and answered.
    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        if let Some(link) = self.poll_answer(links, out) {
            return Some(Transmit::Copied(link));
        }
        let server = self.most_urgent(links)?;
        let h = self.next_frame(server)?;
        out.extend_from_slice(&h.encode());
        Some(Transmit::Lent(self.workers + server, h))
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        match h.kind {
            FrameKind::Push => self.inner.lent_payload(h),
            _ => &[],
        }
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        match h.kind {
            FrameKind::Params if self.pull.is_some() => {
                let server = self.check(link, h)?;
                let p = self
                    .geo
                    .locate(h.key as usize, h.offset as usize, h.length as usize)
                    .ok_or_else(|| ProtocolError::unexpected(link, h, "not a packet of the key"))?;
                self.packet
                    .get_mut(server)
                    .and_then(|packet| packet.get_mut(..p.len))
                    .ok_or_else(|| {
                        ProtocolError::unexpected(link, h, "a packet longer than a packet")
                    })
            }
            FrameKind::Params => self.inner.recv_slot(link, h),
            FrameKind::Probe if self.pull.is_some() => {
                self.check(link, h)?;
                Ok(&mut [])
            }
            FrameKind::Stop => {
                self.check(link, h)?;
                Ok(&mut [])
            }
            FrameKind::Missing => {
                let server = self.check(link, h)?;
                let words = self.geo.share_packets(h.key as usize, server).div_ceil(32);
                if h.length as usize != words {
                    return Err(ProtocolError::unexpected(
                        link,
                        h,
                        "a bitmap of the wrong size",
                    ));
                }
                let buf = &mut self.bitmap[server];
                buf.resize(words, 0.0);
                Ok(buf.as_mut_slice())
            }
            _ => Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP worker expects parameters, stops and bitmaps",
            )),
        }
    }

    fn accepts_loss(&self, link: Rank, h: &Header) -> bool {
        let control = matches!(h.kind, FrameKind::Stop | FrameKind::Missing)
            || (h.kind == FrameKind::Probe && self.pull.is_some());
        let tolerant = (h.kind == FrameKind::Params && self.pull.is_some())
            || (control && self.opts.control_datagrams);
        tolerant && self.server_of(link).is_some()
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.timers.as_ref()?.poll_timeout()
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        let Some(timers) = self.timers.as_mut() else {
            return;
        };
        let geo = &self.geo;
        let server_of = |i| geo.share_at(i).map_or(0, |(_, server)| server);
        for i in timers.handle_timeout(now_ns, server_of) {
            let Some((key, server)) = self.geo.share_at(i) else {
                continue;
            };
            let layer = self.layer(key);
            if self.shares.get(i).is_some_and(|s| s.probing && !s.stopped) {
                self.activate(server, (layer, key));
            }
        }
    }

    fn handle_path_rtt(&mut self, link: Rank, srtt_ns: u64) {
        if let (Some(server), Some(t)) = (self.server_of(link), self.timers.as_mut()) {
            t.set_srtt(server, srtt_ns);
        }
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        match h.kind {
            FrameKind::Params | FrameKind::Probe if self.pull.is_some() => {
                let server = self.check(link, h)?;
                self.handle_pull(link, server, h)
            }
            FrameKind::Params => self.inner.handle_payload(link, h),
            FrameKind::Stop | FrameKind::Missing => {
                let server = self.check(link, h)?;
                if h.step < self.step {
                    return Ok(());
                }
                if h.kind == FrameKind::Stop {
                    self.handle_stop(server, h);
                    Ok(())
                } else {
                    self.handle_missing(link, server, h)
                }
            }
            _ => Err(ProtocolError::unexpected(
                link,
                h,
                "a DLCP worker expects parameters, stops and bitmaps",
            )),
        }
    }
}
