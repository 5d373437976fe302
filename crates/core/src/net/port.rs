//! [`Port`]: one bottleneck direction of a host, its egress NIC or its ingress port.
//!
//! A frame offered to a port takes a path (by flow hash, or sprayed per frame), is admitted
//! or refused by that path's finite queue, waits for the path's serialiser (FIFO, or strict
//! priority over its class), serialises at the path's bandwidth, may be lost on the path,
//! then travels the path's latency (an ingress port adds none and loses nothing at random:
//! it only queues and serialises what converges on the host). A reliable frame that is lost
//! or dropped is offered again, at the port that lost it, when Linux's TCP would resend it
//! (`reliable.rs`, [`super::tcp`]): about a round trip after later data of its flow that
//! arrives reveals it (SACK), at the tail loss probe where nothing follows it (data the flow
//! sends before the probe fires still reveals it: the resend is filed again, sooner), one
//! retransmission timeout later when a resend of a tail is lost too or the flow was still
//! recovering; a flow whose window shrank on a loss is held to it. A loss is counted, and
//! told to the flow's window, when its resend goes. Reliable frames of one flow are handed
//! out in order, none before the one ahead of it. A loss-tolerant frame is simply lost. With
//! loss per packet (`mtu_bytes`) a frame is lost when any of its packets is, and its
//! retransmission carries only the lost packets, as TCP's selective acknowledgements
//! allow; a frame dropped by a full queue is sent again whole.
//!
//! A host's egress queue never drops its own reliable frames (TCP's socket holds what the
//! queue cannot: the send window bounds it); a network queue (the ingress port) does, and
//! then drops a reliable frame once: its retransmission is admitted whatever the queue
//! holds. A frame is the model's unit of loss where TCP loses segments and its
//! congestion window shrinks so that the retransmission fits; without this rule every
//! retransmission met the queue the other senders kept full, was dropped again an RTO
//! later, and the whole incast collapsed (docs/BENCHMARKS.md, issue 13).
//!
//! An ingress port serialises cut-through: a frame offered when its last bit arrived may
//! have started one serialisation earlier, as its first bit came in, so an idle ingress port
//! adds no delay at the sender's rate and only converging frames queue (serialising whole
//! frames after they arrived doubled every hop's time, the more the bigger the frames). Where
//! the senders' NICs are faster than the port (`worker_bandwidth_bps`), the first bit came in
//! only one serialisation at their rate earlier, and the port's own rate shows from it. A
//! frame its sender repaired by resending only its lost packets streamed in from its first
//! attempt ([`Decision::first_arrival`], [`Port::enqueue_streamed`]): the port serialises it
//! from its first packet's arrival and finishes once the resend, its last packet, can follow
//! (where it entered whole with the resend, a lossy message took a round trip too long). A
//! driver whose receivers see only whole frames hands such a frame over at
//! [`Port::handover_at`], to the same effect.
//!
//! An ingress port holds one frame per flow at a time, as a receiver reads one frame of a
//! connection before the next (the runtime's reader does exactly that): later frames of the
//! flow wait outside the queue, where TCP's flow control keeps them (in the sender's
//! socket), and are offered as the one ahead leaves the port (delivered, or a loss-tolerant
//! one lost or dropped). Frames converging from N senders thus hold at most N places in the
//! queue, as in the runtime. Datagrams have no flow control: every one that comes meets the
//! queue, and a flow's datagram on one path never waits for one of the flow on another.
//!
//! Fates are decided as early as they can be: under `fifo` when the frame is offered (its
//! start is then known), under `prio` when its serialisation starts; a retransmission is
//! decided when it is offered again. The driver calls [`Port::poll_fate`] after each
//! [`Port::enqueue`] and again at [`Port::poll_timeout`].
//!
//! An egress port of one lossless path with an unbounded `fifo` queue decides each frame
//! on offer by a shorter route (`direct.rs`), to the same bits.
//!
//! Counters are kept in total, per path and per flow ([`Port::flow_counters`]), so a driver
//! with one port per host can still report per link: give each directed link its own
//! `flow`.

use std::collections::VecDeque;

use super::attempts::Attempts;
use super::counters::NetCounters;
use super::flow_map::FlowTable;
use super::later::Later;
use super::order::FlowSeq;
use super::paths::{choose, Path};
use super::profile::{NetworkProfile, PathSpec, QueueDiscipline};
use super::rng::{hash, SplitMix64};
use super::tcp::{tcp_small_queue_bytes, CongestionControl, Recovery, TcpFlow};
use super::window::{self, Backlog, OnePath};
use super::{Decision, Fate, FrameMeta, Nanos};
use reliable::{first_packet_lost, frame_loss, PacketHeaders};

/// Which side of a host a port models (part of its random streams' derivation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Egress = 0,
    Ingress = 1,
}

/// A frame the port holds, with what it needs to decide it.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: u64,
    meta: FrameMeta,
    /// Sequence number in its flow (reliable frames).
    seq: u64,
    /// When this attempt was offered.
    offered: Nanos,
    retransmissions: u32,
    /// Bytes this attempt puts on the wire: the frame, or (a retransmission with loss per
    /// packet) only its lost packets.
    wire_bytes: usize,
    /// Its flow's place in the port's flow table (looked up once, on entry).
    slot: usize,
    /// The key its loss draws come from (with the retransmission count), if it has an
    /// identity and the port may lose frames.
    draw: Option<u64>,
    /// Retransmission timeouts this frame has taken (the RTO's backoff).
    timeouts: u32,
    /// Where it stands with its flow's congestion window.
    pacing: Pacing,
    /// A resend: the loss it repairs, how that was found and on which path (counted, and
    /// told to the window, when it goes).
    found_by: Option<(Recovery, usize)>,
    /// A resend of the flow's tail, found by its probe or timeout: it arrives in order
    /// with nothing after it, so the receiver acknowledges it at its delayed-ACK timer.
    tail_repair: bool,
    /// Where it is kept while it waits in `Port::retransmits`.
    later: usize,
    /// A frame whose packets went on ahead of its last attempt: when the first of them
    /// arrived at the path's far end (at an egress, of the attempt that first got some
    /// through, a resend then carrying only the lost ones; at an ingress, as its driver
    /// said, [`Port::enqueue_streamed`]).
    streamed: Option<Nanos>,
    /// BBR found its loss with little in flight: its resend's first packet goes alone
    /// (`Port::conserve`).
    conserving: bool,
}

/// A reliable frame's passage through its flow's congestion window (egress only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pacing {
    /// Not yet asked (a new frame).
    Unasked,
    /// Held back by the window until its time comes (counted in the send window).
    Held,
    /// Let through (or never subject to it: retransmissions, loss-tolerant frames).
    Cleared,
    /// Let through after the window held it back: its ACKs show the flow using its window.
    Released,
}

/// What a port reads and updates of a flow at every frame, in one cache line: a frame
/// looks its flow up once when it enters and carries the slot from then on (per-flow hash
/// lookups at every step were a fifth of a 1,024-worker simulation, most of it cache
/// misses). The flow's counters and the frames waiting behind its gate are kept apart.
#[derive(Debug, Clone, Default)]
#[repr(C, align(64))]
struct FlowState {
    /// The reorder buffer (reliable frames).
    order: FlowSeq,
    /// Ingress only: whether the flow's frame is in the port, and when the next may enter.
    gate: FlowGate,
}

const _: () = assert!(std::mem::size_of::<FlowState>() == 64, "one cache line");

/// An ingress flow's frame in the port (the frames waiting behind it are in
/// `Port::waiting`): one word, so that [`FlowState`] fits a cache line.
#[derive(Debug, Clone, Default)]
struct FlowGate {
    /// When the last decided frame leaves the port (the next may not enter before), or
    /// [`FlowGate::BUSY`] while a frame of the flow is in the port, its fate not decided.
    free_from: Nanos,
}

impl FlowGate {
    const BUSY: Nanos = Nanos::MAX;

    /// Whether a frame of the flow is in the port.
    fn busy(&self) -> bool {
        self.free_from == Self::BUSY
    }

    /// A frame enters the port: returns when it may (no earlier than the last one left).
    fn enter(&mut self) -> Nanos {
        std::mem::replace(&mut self.free_from, Self::BUSY)
    }

    /// The frame in the port leaves it at `left`; none waits behind it.
    fn leave(&mut self, left: Nanos) {
        self.free_from = left.min(Self::BUSY - 1);
    }
}

/// One bottleneck direction of a host: a finite queue with a discipline and a serialiser
/// per path, loss, retransmission, and counters.
#[derive(Debug, Clone)]
pub struct Port {
    paths: Vec<Path<Held>>,
    /// The send window, bytes.
    window: usize,
    /// Whether decisions wait for the serialiser (`prio`) or are made on offer (`fifo`).
    lazy: bool,
    /// Salt of the flow hash (from the job's seed).
    salt: u64,
    /// Frames to offer at a later time, by (time, order): retransmissions, and (ingress)
    /// the next frame of a flow once the one ahead has left.
    retransmits: Later<Held>,
    /// Ingress only: one frame of a flow in the port at a time, the others waiting behind
    /// it ([`FlowGate`]).
    one_per_flow: bool,
    retransmit_order: u64,
    ready: VecDeque<Decision>,
    /// Per flow (in order of first appearance) its state, and where each flow's is.
    flows: Vec<FlowState>,
    slots: FlowTable,
    /// Per flow, its counters (none if the driver does not ask for them).
    flow_counters: Vec<NetCounters>,
    count_flows: bool,
    /// Ingress only: per flow, the frames waiting behind the one in the port.
    waiting: Vec<VecDeque<Held>>,
    /// The latest `now` seen.
    clock: Nanos,
    /// Whether frames take the direct path ([`direct`]).
    direct: bool,
    /// Ingress only: the fastest a sender's NIC puts a frame's bits on the wire (the
    /// workers' NICs where they are faster than the servers' ports), so a frame that
    /// arrived whole cannot have begun arriving more than its time at that rate earlier.
    arrival_bps: Option<f64>,
    /// The send window in closed form, where the port has one path of a valid rate.
    one_path: Option<OnePath>,
    /// Whether any path may lose a frame (only then are draw keys kept).
    lossy: bool,
    /// Per frame identity, its offers so far (each one an attempt with draws of its own).
    attempts: Attempts,
    /// How reliable flows recover and send ([`TcpFlow`], one per flow slot, kept only
    /// where the port can lose or drop anything).
    tcp: TcpModel,
}

/// The reliable transport's settings at a port, and each flow's state.
#[derive(Debug, Clone)]
struct TcpModel {
    /// Whether flows are modelled at all (the port can lose or drop frames).
    on: bool,
    /// Whether flows are held to their congestion windows here (an egress port).
    paced: bool,
    cc: CongestionControl,
    rto_min: Nanos,
    /// The round trip before any queueing: twice the one-way latency, ns.
    base_rtt: Nanos,
    /// A full segment's payload, bytes.
    mss: f64,
    /// The narrowest rate the flows' data meets ([`NetworkProfile::reliable_bottleneck_bps`]).
    bottleneck_bps: Option<f64>,
    /// Per packet: the IP MTU, and header bytes of a TCP and of a UDP packet on the wire
    /// (Ethernet, IP and transport); `None` where the model has no packets.
    packets: Option<PacketHeaders>,
    flows: Vec<TcpFlow>,
    /// Per flow, its tail's resend waiting for the probe or the timeout, which data the
    /// flow sends meanwhile may reveal earlier ([`reliable`]).
    tails: Vec<Option<TailWait>>,
    /// Flows whose held-back frames fill their sockets ([`Port::flow_has_room`]).
    full_flows: usize,
    /// Egress: how long the flows' acknowledgements wait at the host's downlink behind the
    /// data converging on it, as of the latest frame offered ([`Port::enqueue_at_host`]).
    return_queue_ns: Nanos,
}

/// A flow's resend waiting for its tail loss probe or its timeout: when, and where it is
/// kept in `Port::retransmits` (taken back and filed again if SACK finds it first).
#[derive(Debug, Clone, Copy)]
struct TailWait {
    at: Nanos,
    index: usize,
}

impl Port {
    /// A host's egress NIC under `profile`: one serialiser per path, each with the path's
    /// bandwidth, latency and loss; random streams derived from `(seed, host, egress, path)`.
    pub fn egress(profile: &NetworkProfile, seed: u64, host: u64) -> Self {
        let specs = (0..profile.paths.max(1))
            .map(|i| profile.path_spec(i))
            .collect();
        Self::new(profile, seed, host, Direction::Egress, specs)
    }

    /// A host's ingress port under `profile`: arriving frames queue and serialise at the
    /// bandwidth of the path they came on (a host has a downlink per path, as it has an
    /// egress NIC per path), with no latency added and no random loss (drops of a full queue
    /// only); random streams derived from `(seed, host, ingress)`. A frame keeps the path it
    /// took at the sender where [`FrameMeta::path`] names it.
    pub fn ingress(profile: &NetworkProfile, seed: u64, host: u64) -> Self {
        let specs = (0..profile.paths.max(1))
            .map(|i| PathSpec {
                bandwidth_bps: profile.path_spec(i).bandwidth_bps,
                latency_ns: 0,
                loss: 0.0,
                loss_burst: None,
                packet_bytes: None,
                blackout: None,
            })
            .collect();
        let mut port = Self::new(profile, seed, host, Direction::Ingress, specs);
        port.arrival_bps = profile.worker_bandwidth_bps;
        let cap = port.tcp.ack_cap_bytes();
        port.paths.iter_mut().for_each(|p| p.queue.set_ack_cap(cap));
        port
    }

    /// A port of `specs` paths.
    fn new(
        profile: &NetworkProfile,
        seed: u64,
        host: u64,
        direction: Direction,
        specs: Vec<PathSpec>,
    ) -> Self {
        let d = direction as u64;
        let paths: Vec<Path<Held>> = (specs.into_iter().enumerate())
            .map(|(i, spec)| {
                let rng = SplitMix64::derive(&[seed, host, d, i as u64]);
                let mut path = Path::new(profile, spec, rng);
                if direction == Direction::Egress {
                    let share = tcp_small_queue_bytes(spec.bandwidth_bps, profile.mtu_bytes);
                    path.queue.set_own_share(share);
                }
                path
            })
            .collect();
        let tcp = TcpModel::new(profile, direction == Direction::Egress);
        let mut port = Self {
            tcp,
            paths,
            window: profile.buffer_bytes,
            lazy: profile.queue_discipline == QueueDiscipline::Prio,
            salt: hash(&[seed, 0xEC3F]),
            retransmits: Later::default(),
            one_per_flow: direction == Direction::Ingress,
            retransmit_order: 0,
            ready: VecDeque::new(),
            flows: Vec::new(),
            slots: FlowTable::default(),
            flow_counters: Vec::new(),
            count_flows: true,
            waiting: Vec::new(),
            clock: 0,
            direct: false,
            arrival_bps: None,
            one_path: None,
            lossy: false,
            attempts: Attempts::default(),
        };
        port.lossy = port.paths.iter().any(|p| !p.loss.never_loses());
        port.tcp.on = port.lossy || profile.queue_bytes.is_some();
        port.direct = port.direct_path_applies(direction);
        port.one_path = match port.paths.as_slice() {
            [only] => OnePath::new(only.spec.bandwidth_bps, port.window),
            _ => None,
        };
        port
    }

    /// The offered work of every path, for the send window.
    fn backlogs(&self) -> impl Iterator<Item = Backlog> + Clone + '_ {
        self.paths.iter().map(Path::backlog)
    }

    /// Send-window admission (egress): whether the driver may ask its scheduler for another
    /// frame at `now`, i.e. the port holds fewer unserialised bytes than the window (always,
    /// without a bandwidth). A retransmission counts once it is offered again; a frame its
    /// flow's congestion window holds back does not (it waits in its socket, which
    /// [`Port::flow_has_room`] bounds, as Linux's small queues bound the qdisc alone).
    pub fn has_room(&self, now: Nanos) -> bool {
        if let (Some(one), [only]) = (self.one_path, self.paths.as_slice()) {
            return one.has_room(only.work_until, now);
        }
        window::has_room(self.backlogs(), self.window, now)
    }

    /// The first instant `>= now + 1` at which [`Port::has_room`] holds (exact: in closed
    /// form for one path, else searched from the backlogs' drain).
    pub fn room_at(&self, now: Nanos) -> Nanos {
        if let (Some(one), [only]) = (self.one_path, self.paths.as_slice()) {
            return one.room_at(only.work_until, now);
        }
        window::room_at(self.backlogs(), self.window, now)
    }

    /// Unserialised bytes held at `now` (what the send window compares).
    pub fn backlog_bytes(&self, now: Nanos) -> usize {
        window::held(self.backlogs(), now)
    }

    /// Whether `flow`'s socket takes another frame: the bytes its congestion window holds
    /// back are fewer than the send window (a socket's buffer, per flow). The driver offers
    /// its scheduler only the links whose flows have room.
    pub fn flow_has_room(&self, flow: u64) -> bool {
        self.tcp.full_flows == 0
            || (self.slots.get(flow))
                .and_then(|slot| self.tcp.flows.get(slot))
                .is_none_or(|f| f.held_bytes < self.window)
    }

    /// When to ask again for the flows without room ([`Port::flow_has_room`]): the first
    /// frame the port holds for later is let through then (`None`: every flow has room).
    pub fn flow_room_at(&self, now: Nanos) -> Option<Nanos> {
        if self.tcp.full_flows == 0 {
            return None;
        }
        let first = self.retransmits.first_key().map_or(now, |(t, _)| t);
        Some(first.max(now.saturating_add(1)))
    }

    /// Offers a frame identified by the driver's `token` at `now`.
    pub fn enqueue(&mut self, now: Nanos, token: u64, meta: FrameMeta) {
        self.enqueue_streamed(now, token, meta, None);
    }

    /// Offers a frame as [`Port::enqueue`] does, whose last bit arrives at `now` but whose
    /// first packet arrived at `since`: a frame a sender repaired by resending its lost
    /// packets ([`Decision::first_arrival`]), the rest of which streamed in from its first
    /// attempt. An ingress port serialises it from `since`, finishing no sooner than its
    /// last packet, which arrives at `now`, can follow.
    pub fn enqueue_streamed(
        &mut self,
        now: Nanos,
        token: u64,
        meta: FrameMeta,
        since: Option<Nanos>,
    ) {
        if self.direct {
            self.enqueue_direct(now, token, meta);
            return;
        }
        self.advance(now);
        let slot = self.slot(meta.flow);
        let flow = &mut self.flows[slot];
        let seq = if meta.reliable {
            flow.order.ticket()
        } else {
            0
        };
        let draw = match meta.identity {
            Some(id) if self.lossy => Some(self.attempts.draw_key(meta.flow, id)),
            _ => None,
        };
        let pacing = if meta.reliable && self.tcp.paced && self.tcp.on {
            Pacing::Unasked
        } else {
            Pacing::Cleared
        };
        let held = Held {
            token,
            meta,
            seq,
            offered: now,
            retransmissions: 0,
            wire_bytes: self.tcp.on_wire(meta.bytes, meta.reliable),
            slot,
            draw,
            timeouts: 0,
            pacing,
            found_by: None,
            tail_repair: false,
            later: 0,
            streamed: since.filter(|&t| t < now && self.one_per_flow),
            conserving: false,
        };
        if meta.reliable {
            if let Some(flow) = self.tcp.flows.get_mut(slot) {
                flow.in_port = flow.in_port.saturating_add(1);
            }
        }
        if self.one_per_flow && !meta.datagram {
            if flow.gate.busy() {
                self.waiting[slot].push_back(held);
                return;
            }
            let at = flow.gate.enter();
            if at > now {
                self.offer_later(at, held);
                return;
            }
        }
        self.offer(now, held);
    }

    /// For an ingress port like this one (the same profile) at the receiver of a frame of
    /// `bytes` that its sender's port decided as `d`: when to hand the frame over where the
    /// receiver learns of a frame only once it has arrived whole (a process of the runtime),
    /// so that its port, cutting it through from there, serialises it as a frame that
    /// streamed in ([`Port::enqueue_streamed`]): from its first packet's arrival, ending no
    /// sooner than its resend can follow. `d`'s delivery where nothing went ahead of the
    /// last attempt; `None` for a frame not delivered.
    pub fn handover_at(&self, d: &Decision, bytes: usize) -> Option<Nanos> {
        let Fate::Delivered { at, .. } = d.fate else {
            return None;
        };
        let (Some(since), Some(path), true) =
            (d.first_arrival, self.paths.first(), self.one_per_flow)
        else {
            return Some(at);
        };
        let wire = self.tcp.on_wire(bytes, true);
        let tx = path.transmission_ns(wire);
        let resend = path.transmission_ns(self.tcp.packet_bytes());
        let first_bit = since.max(at.saturating_add(resend).saturating_sub(tx));
        Some(
            path.whole_arrival(self.arrival_bps, first_bit, tx, wire)
                .min(at),
        )
    }

    /// Offers a frame as [`Port::enqueue`] does, at the egress of a host whose downlink is
    /// `downlink` (its ingress port, where the driver models one). The acknowledgements of
    /// this port's reliable flows come back through that port's queue, behind the data
    /// converging on the host (a server's pulls' ACKs behind the workers' pushes, in one FIFO
    /// at the server's switch port), so the round trip the flows measure and clock their
    /// windows by holds that wait.
    pub fn enqueue_at_host(
        &mut self,
        now: Nanos,
        token: u64,
        meta: FrameMeta,
        downlink: Option<&Port>,
    ) {
        if meta.reliable {
            self.tcp.return_queue_ns = downlink.map_or(0, |port| port.ack_wait_ns(now));
        }
        self.enqueue(now, token, meta);
    }

    /// The next frame whose fate is decided by `now`, in the order decided.
    pub fn poll_fate(&mut self, now: Nanos) -> Option<(u64, Fate)> {
        self.poll_decision(now).map(|d| (d.token, d.fate))
    }

    /// As [`Port::poll_fate`], with the timing of the frame's last transmission.
    pub fn poll_decision(&mut self, now: Nanos) -> Option<Decision> {
        if self.direct {
            // Nothing is ever due later on the direct path: every frame is decided on offer.
            self.clock = self.clock.max(now);
        } else {
            self.advance(now);
        }
        self.ready.pop_front()
    }

    /// When the driver must call [`Port::poll_fate`] again (`None`: nothing pending).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        if !self.ready.is_empty() {
            return Some(self.clock);
        }
        if self.direct {
            return None;
        }
        let retransmit = self.retransmits.first_key().map(|(t, _)| t);
        let dispatch = self.next_dispatch().map(|(t, _)| t);
        retransmit.into_iter().chain(dispatch).min()
    }

    /// Counters of everything through this port so far (the sum of its paths').
    pub fn counters(&self) -> NetCounters {
        let mut total = NetCounters::default();
        self.paths.iter().for_each(|p| total.add(&p.counters));
        total
    }

    /// Counters of each path, by index.
    pub fn path_counters(&self) -> Vec<NetCounters> {
        self.paths.iter().map(|p| p.counters).collect()
    }

    /// Counters of one flow (`None` if nothing of it entered, or the port was built
    /// [`Port::without_flow_counters`]).
    pub fn flow_counters(&self, flow: u64) -> Option<&NetCounters> {
        self.flow_counters.get(self.slots.get(flow)?)
    }

    /// The same port keeping no per-flow counters (totals and per-path ones only), for a
    /// driver that never reads them: counting per flow costs a cache line per frame where
    /// a port carries a thousand flows.
    pub fn without_flow_counters(mut self) -> Self {
        self.count_flows = false;
        self.flow_counters = Vec::new();
        self
    }

    /// Where `flow`'s state is (made on its first frame).
    fn slot(&mut self, flow: u64) -> usize {
        let slot = self.slots.slot(flow);
        if slot == self.flows.len() {
            self.flows.push(FlowState::default());
            if self.count_flows {
                self.flow_counters.push(NetCounters::default());
            }
            if self.one_per_flow {
                self.waiting.push(VecDeque::new());
            }
            if self.tcp.on {
                let tcp = &self.tcp;
                let mut flow = TcpFlow::new(tcp.base_rtt, tcp.mss, tcp.bottleneck_bps);
                if tcp.cc == CongestionControl::Bbr {
                    flow = flow.with_bbr_window(tcp.mss);
                }
                let flow = if tcp.paced { flow } else { flow.unpaced() };
                self.tcp.flows.push(flow);
                self.tcp.tails.push(None);
            }
        }
        slot
    }

    /// Number of paths.
    pub fn paths(&self) -> usize {
        self.paths.len()
    }

    /// The earliest pending serialisation start under `prio`: (time, path).
    fn next_dispatch(&self) -> Option<(Nanos, usize)> {
        if !self.lazy {
            return None;
        }
        (self.paths.iter().enumerate())
            .filter(|(_, p)| !p.queue.is_empty())
            .map(|(i, p)| (p.free_at, i))
            .min()
    }

    /// Processes, in time order, every retransmission and serialisation start due by `now`
    /// (a retransmission first at equal times, so that it competes for that start).
    fn advance(&mut self, now: Nanos) {
        self.clock = self.clock.max(now);
        loop {
            let retransmit = self.retransmits.first_key().filter(|&(t, _)| t <= now);
            let dispatch = self.next_dispatch().filter(|&(t, _)| t <= now);
            match (retransmit, dispatch) {
                (Some(key), d) if d.is_none_or(|(t, _)| key.0 <= t) => {
                    if let Some(held) = self.retransmits.pop_first() {
                        let held = self.found(key.0, held);
                        self.offer(key.0, held);
                    }
                }
                (_, Some((_, i))) => self.dispatch(i),
                _ => break,
            }
        }
    }

    /// A frame reaches the queues at `t`: it passes its flow's congestion window, takes a
    /// path, then is queued or refused.
    fn offer(&mut self, t: Nanos, mut held: Held) {
        if !self.pass_window(t, &mut held) {
            return;
        }
        let i = choose(&self.paths, &held.meta, self.salt, t);
        let path = &mut self.paths[i];
        let (bytes, class) = (held.wire_bytes, held.meta.class);
        // A host's own queue never drops its reliable frames: what it cannot hold waits in
        // the sender's socket, as TCP's backpressure keeps it (the send window bounds it).
        let own_tcp = held.meta.reliable && !self.one_per_flow;
        if own_tcp {
            // Nothing is admitted here, so nothing else forgets the frames that have left:
            // forget them now, as an admission at `t` would (or the record grows forever).
            path.queue.occupancy(t);
        }
        let refused = !own_tcp && path.queue.admit(t, bytes, held.meta.drop_eligible).is_err();
        if refused && held.retransmissions == 0 {
            self.count(held.slot, i, |c| c.dropped(bytes));
            if held.meta.reliable {
                let at = self.resend_time(Recovery::Sack, &held, t, t);
                held.found_by = Some((Recovery::Sack, i));
                self.retransmit(at, held, i);
            } else {
                self.decided(
                    &held,
                    Decision {
                        token: held.token,
                        fate: Fate::Dropped,
                        start: t,
                        done: t,
                        first_arrival: None,
                    },
                );
            }
            return;
        }
        path.admit_work(t, bytes);
        path.queue.push(bytes, class, own_tcp, held);
        if !self.lazy || path.free_at <= t {
            self.dispatch(i);
        }
    }

    /// Path `i`'s serialiser takes its next frame (no earlier than `t`'s frame was offered
    /// and the serialiser is free): decides loss, then the fate or a retransmission.
    fn dispatch(&mut self, i: usize) {
        let path = &mut self.paths[i];
        let Some(mut held) = path.queue.pop() else {
            return;
        };
        let bytes = held.wire_bytes;
        let own_tcp = held.meta.reliable && !self.one_per_flow;
        let tx = path.transmission_ns(bytes);
        let (earliest, last_bit) = self.arrival(i, &held, tx);
        let path = &mut self.paths[i];
        let in_turn = path.free_at.max(earliest);
        let start = if own_tcp || self.one_per_flow || self.lazy {
            in_turn
        } else {
            in_turn.saturating_sub(path.own_tcp_in_socket_ns(earliest))
        };
        let done = start.saturating_add(tx).max(last_bit);
        // Work is conserved: a frame that passed own TCP bytes delays them by its own time.
        path.free_at = in_turn.saturating_add(tx).max(last_bit);
        path.queue.serialising(done, bytes, own_tcp);
        let draw = (held.draw).map(|k| hash(&[k, u64::from(held.retransmissions)]));
        let packets = path.loss.packets(bytes);
        let outage = path.spec.blackout;
        let blacked = outage.and_then(|b| b.lost(packets, start, done));
        let random = path.loss.lose_keyed(bytes, draw);
        // Random loss and an outage may strike the same packet: at most every packet.
        let lost_packets = random
            .saturating_add(blacked.map_or(0, |b| b.packets))
            .min(packets);
        let (resend, latency) = (
            path.loss.resend_bytes(bytes, lost_packets),
            path.spec.latency_ns,
        );
        let head_lost = (held.timeouts > 0 || held.conserving)
            && first_packet_lost(draw, random, outage, packets, start, done);
        let done_flow = self.head_after_timeout(&mut held, i, draw, head_lost, done);
        let done_flow = self.middle_acks_lost(&held, i, draw, done_flow);
        let at = done_flow.saturating_add(latency);
        let queued = start.saturating_sub(held.offered);
        self.count(held.slot, i, |c| c.sent(bytes, queued));
        if held.meta.reliable && lost_packets < packets {
            let first_out = start.saturating_add(tx / packets.max(1));
            self.reveal_tail(held.slot, first_out);
        }
        let fate = if lost_packets > 0 {
            self.count(held.slot, i, |c| c.lost(bytes));
            if held.meta.reliable {
                let mut loss = frame_loss(draw, random, blacked, packets, start, done);
                let next = loss.last.saturating_add(loss.packet_ns);
                loss.stalled = outage.is_some_and(|b| b.is_out(next));
                loss.reveal_lost = self.paths[i].loss.lose_any(draw, 2);
                self.conserve(&mut held, &mut loss, head_lost, (draw, random, packets));
                self.cut_later_rounds(&held, i, draw, random, packets, done);
                self.partly_delivered(&mut held, bytes, resend, start.saturating_add(latency));
                self.resend_lost(held, i, &mut loss, done_flow);
                return;
            }
            Fate::Lost { path: i }
        } else {
            if held.meta.reliable {
                self.delayed_ack(&held, i, done);
                self.acked(&held, i, queued, done);
                self.final_ack(&held, i, draw, done_flow);
            }
            held.offered = start;
            Fate::Delivered {
                at,
                retransmissions: held.retransmissions,
                path: i,
            }
        };
        let d = Decision {
            token: held.token,
            fate,
            start,
            done,
            first_arrival: held.streamed.filter(|_| !self.one_per_flow),
        };
        self.decided(&held, d);
    }

    /// When `held` (`tx` ns on path `i`) may start serialising, and when its last bit has
    /// come in: at its offer on an egress port; cut-through on an ingress port, where a
    /// repaired frame streamed in from its first packet and its resend, the last packet in,
    /// takes its own serialisation after it came.
    fn arrival(&self, i: usize, held: &Held, tx: Nanos) -> (Nanos, Nanos) {
        let path = &self.paths[i];
        match held.streamed {
            _ if !self.one_per_flow => (held.offered, held.offered),
            Some(since) if held.retransmissions == 0 => {
                let packet = path.transmission_ns(self.tcp.packet_bytes());
                (since, held.offered.saturating_add(packet))
            }
            _ => {
                let first = path.first_bit_at(self.arrival_bps, held.offered, tx, held.wire_bytes);
                (first, held.offered)
            }
        }
    }

    /// A reliable frame lost (or dropped) on path `i` is offered again at `at`; returns
    /// where it is kept until then.
    fn retransmit(&mut self, at: Nanos, mut held: Held, i: usize) -> usize {
        self.count(held.slot, i, |c| c.retransmitted(held.wire_bytes));
        held.retransmissions = held.retransmissions.saturating_add(1);
        self.offer_later(at, held)
    }

    /// Hands out a decision: reliable frames through their flow's reorder buffer.
    fn decided(&mut self, held: &Held, d: Decision) {
        if !held.meta.datagram {
            self.release_next(held.slot, &d);
        }
        if held.meta.reliable {
            if let Some(flow) = self.tcp.flows.get_mut(held.slot) {
                flow.in_port = flow.in_port.saturating_sub(1);
            }
            self.flows[held.slot]
                .order
                .settle(held.seq, d, &mut self.ready);
        } else {
            self.ready.push_back(d);
        }
    }

    /// Ingress: the frame ahead in flow `slot` has its fate `d`, so the next one waiting
    /// (if any) is offered when the one ahead has left the port.
    fn release_next(&mut self, slot: usize, d: &Decision) {
        if !self.one_per_flow {
            return;
        }
        let left = match d.fate {
            Fate::Delivered { at, .. } => at,
            Fate::Lost { .. } | Fate::Dropped => d.done,
        };
        match self.waiting.get_mut(slot).and_then(VecDeque::pop_front) {
            Some(next) => {
                self.offer_later(left, next);
            }
            None => self.flows[slot].gate.leave(left),
        }
    }

    /// Offers `held` at `at` (no earlier than the port's clock); returns where it is kept.
    fn offer_later(&mut self, at: Nanos, mut held: Held) -> usize {
        held.offered = at.max(self.clock);
        let order = self.retransmit_order;
        self.retransmit_order = order.wrapping_add(1);
        held.later = self.retransmits.next_index();
        self.retransmits.insert((held.offered, order), held);
        held.later
    }

    /// Applies `f` to path `i`'s and flow `slot`'s counters.
    fn count(&mut self, slot: usize, i: usize, f: impl Fn(&mut NetCounters)) {
        if let Some(path) = self.paths.get_mut(i) {
            f(&mut path.counters);
        }
        if let Some(counters) = self.flow_counters.get_mut(slot) {
            f(counters);
        }
    }
}

mod direct;
mod reliable;
impl Port {
    /// Frames each path still records as serialising (bounded by what can be in flight).
    #[cfg(test)]
    fn serialising_records(&self) -> usize {
        self.paths
            .iter()
            .map(|p| p.queue.serialising_records())
            .sum()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "port/keyed_tests.rs"]
mod keyed_tests;

#[cfg(test)]
#[path = "port/socket_tests.rs"]
mod socket_tests;

#[cfg(test)]
#[path = "port/packet_tests.rs"]
mod packet_tests;
#[cfg(test)]
#[path = "port/stream_tests.rs"]
mod stream_tests;

#[cfg(test)]
#[path = "port/blackout_tests.rs"]
mod blackout_tests;

#[cfg(test)]
#[path = "port/tail_tests.rs"]
mod tail_tests;

#[cfg(test)]
#[path = "port/window_tests.rs"]
mod window_tests;

#[cfg(test)]
#[path = "port/return_tests.rs"]
mod return_tests;
