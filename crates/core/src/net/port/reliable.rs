//! The reliable flows of a [`Port`]: their frames held to the congestion window, how each
//! loss is found and when it is resent ([`super::super::tcp`]), and the headers every
//! packet carries on the wire.

use super::super::blackout::{BlackedOut, Blackout};
use super::super::profile::{NetworkProfile, ETHERNET_HEADER_BYTES};
use super::super::rng::{hash, SplitMix64};
use super::super::tcp::{
    CongestionControl, Recovery, TcpFlow, TimeoutCause, DELAYED_ACK_NS, INITIAL_WINDOW_SEGMENTS,
};
use super::super::Nanos;
use super::{Held, Pacing, Port, TailWait, TcpModel};

/// Header bytes inside the IP MTU: IP (20) and TCP with timestamps (32), or UDP (8).
const TCP_INSIDE_MTU: f64 = 52.0;
const UDP_INSIDE_MTU: f64 = 28.0;
/// The segment size without packets in the model (an Ethernet MTU's).
const DEFAULT_MSS: f64 = 1_448.0;

/// What headers add to each packet: the MTU and the header bytes (scaled with the model's
/// bytes, like the MTU).
#[derive(Debug, Clone, Copy)]
pub(super) struct PacketHeaders {
    mtu: f64,
    scale: f64,
}

impl TcpModel {
    /// The reliable transport of a port under `profile` (`paced`: an egress port, where
    /// windows hold frames back); flows are modelled once the port knows it can lose.
    pub(super) fn new(profile: &NetworkProfile, paced: bool) -> Self {
        let scale = profile.byte_scale;
        let packets = (profile.mtu_bytes)
            .filter(|&mtu| mtu > TCP_INSIDE_MTU * scale)
            .map(|mtu| PacketHeaders { mtu, scale });
        let mss = packets.map_or(DEFAULT_MSS * scale, |p| p.mtu - TCP_INSIDE_MTU * scale);
        Self {
            on: false,
            paced,
            cc: profile.tcp,
            rto_min: profile.rto_ns,
            base_rtt: profile.latency_ns.saturating_mul(2),
            mss: mss.max(f64::MIN_POSITIVE),
            bottleneck_bps: profile.reliable_bottleneck_bps(),
            packets,
            flows: Vec::new(),
            tails: Vec::new(),
            full_flows: 0,
            return_queue_ns: 0,
        }
    }

    /// Flow `slot`'s window holds back (`hold`) or lets go `bytes`: its socket's fill, and
    /// the count of full sockets against a send window of `window` bytes. Returns the
    /// socket's fill after.
    pub(super) fn hold(&mut self, slot: usize, bytes: usize, hold: bool, window: usize) -> usize {
        let Some(flow) = self.flows.get_mut(slot) else {
            return 0;
        };
        let was_full = flow.held_bytes >= window;
        flow.held_bytes = if hold {
            flow.held_bytes.saturating_add(bytes)
        } else {
            flow.held_bytes.saturating_sub(bytes)
        };
        match (was_full, flow.held_bytes >= window) {
            (false, true) => self.full_flows += 1,
            (true, false) => self.full_flows = self.full_flows.saturating_sub(1),
            _ => {}
        }
        flow.held_bytes
    }

    /// Bytes of one full packet on the wire (Ethernet header included); 0 without packets.
    pub(super) fn packet_bytes(&self) -> usize {
        self.packets.map_or(0, |p| {
            crate::net::round_to_u64(p.mtu + ETHERNET_HEADER_BYTES * p.scale) as usize
        })
    }

    /// What an acknowledgement waits for of one frame ahead of it at a host's downlink: an
    /// initial window of segments on the wire. The model holds a flow's frame there whole
    /// where TCP keeps at most its congestion window in the queue (the rest waits in the
    /// sender's socket), and the downlink does not know its senders' windows; 10 segments
    /// is the median window of P3's pushes in the kernel's cell c (`--sample-sockets`).
    pub(super) fn ack_cap_bytes(&self) -> usize {
        self.on_wire((INITIAL_WINDOW_SEGMENTS * self.mss) as usize, true)
    }

    /// Bytes a frame of `bytes` occupies on the wire: with packets, each one's Ethernet,
    /// IP and TCP (`reliable`) or UDP headers added.
    pub(super) fn on_wire(&self, bytes: usize, reliable: bool) -> usize {
        let Some(p) = self.packets else {
            return bytes;
        };
        let inside = if reliable {
            TCP_INSIDE_MTU
        } else {
            UDP_INSIDE_MTU
        };
        let payload = p.mtu - inside * p.scale;
        let packets = (bytes as f64 / payload).ceil().max(1.0);
        let headers = packets * (inside + ETHERNET_HEADER_BYTES) * p.scale;
        bytes.saturating_add(crate::net::round_to_u64(headers) as usize)
    }
}

/// Where a lost frame's packets fell: what decides how its flow finds the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FrameLoss {
    /// When the last lost packet left.
    pub(super) last: Nanos,
    /// Whether that packet was the frame's final one (nothing of the frame behind it).
    pub(super) final_packet: bool,
    /// How many of the frame's packets follow it.
    pub(super) after: u64,
    /// When the lost packet before it left (`None`: it was the only one lost).
    pub(super) before: Option<Nanos>,
    /// How long one packet of the frame took to leave, and how many it had.
    pub(super) packet_ns: Nanos,
    pub(super) packets: u64,
    /// The path was out when the packet after the lost one left: nothing the flow sends
    /// reveals the loss until the outage ends.
    pub(super) stalled: bool,
    /// What would reveal the loss where it ends a round of a window of two (the ACK of the
    /// packet before it, the new data that ACK lets go) is lost too.
    pub(super) reveal_lost: bool,
}

/// Where the lost packets of a frame of `packets` serialised from `start` to `done` fell:
/// `random` of them at random positions (the largest of `random` uniform draws from the
/// frame's key, then the largest of the rest below it; the middle without a key) and an
/// outage's run of consecutive ones (`blacked`). Every packet lost: the last at the end.
pub(super) fn frame_loss(
    draw: Option<u64>,
    random: u64,
    blacked: Option<BlackedOut>,
    packets: u64,
    start: Nanos,
    done: Nanos,
) -> FrameLoss {
    let n = packets.max(1);
    let span = done.saturating_sub(start) as f64;
    let packet_ns = (span / n as f64) as Nanos;
    let at = |position: f64| start.saturating_add((span * position) as Nanos);
    let mut below = lost_places(draw);
    let mut times = [None; 4];
    if random >= n {
        times[0] = Some(done);
        times[1] = (n >= 2).then(|| done.saturating_sub(packet_ns));
    } else if random > 0 {
        let last = below(1.0, random);
        times[0] = Some(at(last));
        times[1] = (random >= 2).then(|| at(below(last, random - 1)));
    }
    if let Some(b) = blacked {
        times[2] = Some(b.last_at);
        times[3] = (b.packets >= 2).then(|| b.last_at.saturating_sub(packet_ns));
    }
    times.sort_unstable_by(|a, b| b.cmp(a));
    let last = times[0].unwrap_or(done);
    FrameLoss {
        last,
        final_packet: done.saturating_sub(last) <= packet_ns,
        after: ((done.saturating_sub(last) as f64 / packet_ns.max(1) as f64) as u64).min(n - 1),
        before: times[1],
        packet_ns,
        packets: n,
        stalled: false,
        reveal_lost: false,
    }
}

/// Whether the first packet of a frame of `packets` serialised from `start` to `done` was
/// lost: every packet lost, the first of the `random` places [`frame_loss`] draws from the
/// frame's key (`draw`) falling in it, or an outage over when it crossed.
pub(super) fn first_packet_lost(
    draw: Option<u64>,
    random: u64,
    outage: Option<Blackout>,
    packets: u64,
    start: Nanos,
    done: Nanos,
) -> bool {
    let n = packets.max(1);
    let first_cross = start.saturating_add(done.saturating_sub(start) / n);
    if random >= n || outage.is_some_and(|b| b.is_out(first_cross)) {
        return true;
    }
    random > 0 && first_lost_place(draw, random, n) == 0
}

/// The place (from 0) of the first of the `random` packets (at least one) of a frame of
/// `packets` lost at random, as [`frame_loss`] places them from the frame's key `draw`.
pub(super) fn first_lost_place(draw: Option<u64>, random: u64, packets: u64) -> u64 {
    let n = packets.max(1);
    if random >= n {
        return 0;
    }
    let (mut below, mut top) = (lost_places(draw), 1.0);
    for left in (1..=random).rev() {
        top = below(top, left);
    }
    ((top * n as f64) as u64).min(n - 1)
}

/// Where a frame's randomly lost packets fell, from its loss key (`None`: the middle), as
/// fractions of the frame in descending order: called with the last one's bound (1 at
/// first) and how many are left to place, it returns the largest of that many uniform draws
/// below the bound, the next lost packet back.
fn lost_places(draw: Option<u64>) -> impl FnMut(f64, u64) -> f64 {
    let mut rng = draw.map(|key| SplitMix64::new(hash(&[key, 0x5ACC])));
    move |top: f64, of: u64| match rng.as_mut() {
        Some(r) => top * r.next_f64().powf(1.0 / of.max(1) as f64),
        None => top * 0.5,
    }
}

impl Port {
    /// A reliable frame `held` of `packets` lost `random` of them at random (`draw` its loss
    /// key) on path `i` when its last bit left at `done`: losses in later rounds of its
    /// window than the first's are loss episodes of their own, each cutting the window
    /// ([`TcpFlow::rounds_lost`]) and counted (the first is, when it is found). Only a
    /// frame's first attempt (a resend's losses are found within the episode that resends
    /// them), and not a frame lost whole.
    pub(super) fn cut_later_rounds(
        &mut self,
        held: &Held,
        i: usize,
        draw: Option<u64>,
        random: u64,
        packets: u64,
        done: Nanos,
    ) {
        let (cc, mss) = (self.tcp.cc, self.tcp.mss);
        if held.retransmissions > 0 || random < 2 || random >= packets {
            return;
        }
        let Some(flow) = self.tcp.flows.get_mut(held.slot) else {
            return;
        };
        if packets as f64 <= flow.window_bytes() as f64 / mss {
            return; // one round: one episode
        }
        let (mut few, mut many) = ([0; 64], Vec::new());
        let places = match usize::try_from(random) {
            Ok(n) if n <= few.len() => &mut few[..n],
            _ => {
                many.resize(random.min(packets) as usize, 0);
                &mut many[..]
            }
        };
        // Drawn from the last back, as `frame_loss` draws them; kept in the order sent.
        let (mut below, mut top) = (lost_places(draw), 1.0);
        for (left, place) in places.iter_mut().enumerate().rev() {
            top = below(top, left as u64 + 1);
            *place = ((top * packets as f64) as u64).min(packets - 1);
        }
        let later = flow.rounds_lost(cc, places.iter().copied(), done, mss);
        self.count(held.slot, i, |c| {
            c.loss_episodes = c
                .loss_episodes
                .saturating_add(u64::from(later.saturating_sub(1)));
        });
    }

    /// BBR's recovery window is what it has in flight when it finds a loss (Linux's packet
    /// conservation: `cwnd = in flight + acked`, less the losses). A frame started from idle
    /// has only its pacing lead in flight ([`TcpFlow::bbr_lead_packets`]) while it begins:
    /// where its first attempt loses one of those first packets (`random` of its `packets`
    /// lost, placed from `draw`), its resend's first packet goes alone, and if that is lost
    /// too (`head_lost` on the resend's own attempt), nothing follows it to reveal it before
    /// the timeout: `loss` is stalled. Decides both for `held`'s attempt now on the wire.
    pub(super) fn conserve(
        &self,
        held: &mut Held,
        loss: &mut FrameLoss,
        head_lost: bool,
        (draw, random, packets): (Option<u64>, u64, u64),
    ) {
        loss.stalled |= std::mem::take(&mut held.conserving) && head_lost;
        let Some(flow) = self.tcp.flows.get(held.slot) else {
            return;
        };
        let from_idle = flow.sent_from_idle && flow.in_port <= 1;
        if self.tcp.cc != CongestionControl::Bbr || held.retransmissions > 0 || !from_idle {
            return;
        }
        let lead = flow.bbr_lead_packets(self.tcp.mss);
        held.conserving = first_lost_place(draw, random, packets) < lead;
    }

    /// A resend after a timeout leaves as Linux sends it, its first packet alone in a window
    /// of one segment; the timer stays backed off until that packet's ACK brings a round-trip
    /// sample (RFC 6298; Linux's `icsk_backoff`). So where the first packet was lost
    /// (`head_lost`) the next timeout, which finds it, is backed off again; where it arrived
    /// but its ACK was lost (drawn from `draw`'s stream) the flow waits for that backed-off
    /// timeout before the rest of the resend goes (returned: when its last bit then leaves,
    /// from `done`); otherwise the backoff is over and the resend's later losses find an
    /// unbacked timer. A resend of one packet's ACK is [`Port::final_ack`]'s draw.
    pub(super) fn head_after_timeout(
        &mut self,
        held: &mut Held,
        i: usize,
        draw: Option<u64>,
        head_lost: bool,
        done: Nanos,
    ) -> Nanos {
        if held.timeouts == 0 || head_lost || !self.tcp.on {
            return done;
        }
        let (rto_min, packets) = (self.tcp.rto_min, held.wire_bytes);
        let (Some(path), Some(flow)) = (self.paths.get_mut(i), self.tcp.flows.get_mut(held.slot))
        else {
            return done;
        };
        if path.loss.packets(packets) < 2 {
            return done;
        }
        let mut last = done;
        if path.loss.lose_head_ack(draw) {
            let further = path.loss.lose_resent_head(draw, HEAD_DRAW);
            let wait = flow.timeout_chain(rto_min, held.timeouts, further);
            last = flow.serial_timeout(done, done.saturating_add(wait));
            flow.stall(last);
            self.count_timeouts(held.slot, i, 1 + u64::from(further));
        }
        held.timeouts = 0;
        last
    }

    /// Holds a new reliable frame offered at `t` to its flow's congestion window: `false`
    /// if it must wait (it is offered again when its time comes).
    pub(super) fn pass_window(&mut self, t: Nanos, held: &mut Held) -> bool {
        match held.pacing {
            Pacing::Cleared | Pacing::Released => true,
            Pacing::Held => {
                self.tcp
                    .hold(held.slot, held.wire_bytes, false, self.window);
                held.pacing = Pacing::Released;
                true
            }
            Pacing::Unasked => {
                held.pacing = Pacing::Cleared;
                let (cc, rto_min, mss) = (self.tcp.cc, self.tcp.rto_min, self.tcp.mss);
                let Some(flow) = self.tcp.flows.get_mut(held.slot) else {
                    return true;
                };
                let at = flow.send_at(cc, t, held.wire_bytes, rto_min, mss);
                if cc != CongestionControl::Bbr {
                    let cwnd = (flow.window_bytes() as f64 / mss) as u64;
                    let srtt = flow.srtt_ns();
                    // A reliable flow takes the first path.
                    let slot = held.slot;
                    self.count(slot, 0, |c| c.offered_to_window(cwnd, srtt, at > t));
                }
                if at <= t {
                    return true;
                }
                held.pacing = Pacing::Held;
                let socket = self.tcp.hold(held.slot, held.wire_bytes, true, self.window);
                self.count(held.slot, 0, |c| {
                    c.socket_bytes_max = c.socket_bytes_max.max(socket as u64);
                });
                self.offer_later(at, *held);
                false
            }
        }
    }

    /// How a loss of `held` (its packets lost at `loss`) is found. Data sent after a lost
    /// packet reveals it (SACK, or RACK for a lost resend): later frames of the flow, or the
    /// rest of this frame. Without either (or with an outage swallowing them too) the loss
    /// is the flow's tail: the loss probe finds it, unless the flow is still recovering an
    /// earlier loss (its own earlier frame's, or one of this frame within a round trip
    /// before it with data between them that SACK reveals it by), when only the timeout
    /// does. A lost resend is recovering by definition: only data sent after it reveals it,
    /// and none goes where nothing of the flow follows or its window (at least the resend's
    /// packets) has no room left for new data (then `loss` is marked stalled: nothing will).
    pub(super) fn recovery_of(&self, held: &Held, loss: &mut FrameLoss) -> Recovery {
        let flow = self.tcp.flows.get(held.slot);
        let alone = flow.is_none_or(|f| f.in_port <= 1);
        let mss = self.tcp.mss;
        let window = flow.map_or(1, |f| ((f.window_bytes() as f64 / mss) as u64).max(1));
        // The lost packet's place in the frame, from 1.
        let index = loss.packets.saturating_sub(loss.after);
        if held.retransmissions > 0 {
            // The resend leaves a window at a time: RACK finds a lost packet by one resent
            // after it in its round, or new data where the round has room; a packet that
            // ends a full round has nothing after it until the timeout.
            loss.stalled |= index.is_multiple_of(window);
            return if alone && loss.final_packet {
                Recovery::Timeout(TimeoutCause::ResendLast)
            } else if loss.stalled {
                Recovery::Timeout(TimeoutCause::ResendStalled)
            } else {
                Recovery::Sack
            };
        }
        // A window of one or two segments goes a round at a time: a lost packet ending its
        // round has nothing after it, so only the probe finds it (the timeout while the flow
        // recovers), unless one before it in its round arrived. While the flow recovers, the
        // receiver acknowledges that one at once, and the new data it lets go reveals the
        // loss (unless either is lost); otherwise it waits for the receiver's delayed ACK,
        // and the probe comes first.
        if window <= 2 && index.is_multiple_of(window) && !loss.stalled {
            let recovering = flow.is_some_and(|f| f.in_recovery(loss.last));
            let next_to = |b: Nanos| b.saturating_add(loss.packet_ns) >= loss.last;
            let revealed = window == 2 && !loss.before.is_some_and(next_to) && !loss.reveal_lost;
            if !(recovering && revealed) {
                loss.stalled = true;
                return match recovering {
                    true => Recovery::Timeout(TimeoutCause::OriginalInRecovery),
                    false => Recovery::LossProbe { lone: window == 1 },
                };
            }
        }
        if !(loss.stalled || (alone && loss.final_packet)) {
            return Recovery::Sack;
        }
        let round_trip = flow.map_or(0, |f| f.srtt_ns());
        let recovering = flow.is_some_and(|f| f.in_recovery(loss.last));
        let gap = loss.before.map(|b| loss.last.saturating_sub(b));
        match gap {
            _ if recovering => Recovery::Timeout(TimeoutCause::OriginalInRecovery),
            None => Recovery::LossProbe { lone: true },
            Some(gap) if gap > round_trip => Recovery::LossProbe { lone: true },
            // Nothing between the two lost packets to reveal the first before the probe.
            Some(gap) if gap < loss.packet_ns.saturating_mul(3) / 2 => {
                Recovery::LossProbe { lone: false }
            }
            // The earlier one's recovery is under way when this one would be probed.
            Some(_) => Recovery::Timeout(TimeoutCause::OriginalInRecovery),
        }
    }

    /// A reliable frame `held` (its resend's bytes already set) lost its packets at `loss`
    /// on path `i`, its last bit out at `done`: filed again for when its loss is found.
    pub(super) fn resend_lost(
        &mut self,
        mut held: Held,
        i: usize,
        loss: &mut FrameLoss,
        done: Nanos,
    ) {
        let recovery = self.recovery_of(&held, loss);
        let mut at = self.resend_time(recovery, &held, loss.last, done);
        if recovery.is_timeout() {
            if let Some(flow) = self.tcp.flows.get_mut(held.slot) {
                at = flow.serial_timeout(done, at);
            }
        }
        held.found_by = Some((recovery, i));
        let index = self.retransmit(at, held, i);
        // A flow whose data an outage swallows gets no acknowledgements and stops at its
        // window, as one whose window the resends fill: it sends nothing that could reveal
        // the loss before the probe or timeout.
        match self.tcp.flows.get_mut(held.slot) {
            Some(flow) if loss.stalled => flow.stall(at),
            _ => self.wait_in_tail(at, index, &held),
        }
    }

    /// A reliable frame `held` of `sent` bytes on the wire lost `resend` of them, which it
    /// resends: the rest go on, the first of them arriving at `first_arrival` (unless an
    /// earlier attempt's went on before), and their ACKs regrow a BBR window after a
    /// timeout, less the losses (Linux's BBR in its Loss state: `cwnd + acked - losses`,
    /// packet by packet).
    pub(super) fn partly_delivered(
        &mut self,
        held: &mut Held,
        sent: usize,
        resend: usize,
        first_arrival: Nanos,
    ) {
        if resend < sent {
            held.streamed.get_or_insert(first_arrival);
        }
        held.wire_bytes = resend;
        let cc = self.tcp.cc;
        if let Some(flow) = self.tcp.flows.get_mut(held.slot) {
            flow.on_partly_acked(cc, sent.saturating_sub(resend), resend);
        }
    }

    /// When a loss of `held` found by `recovery` is resent (its last lost packet left at
    /// `lost_sent`, the frame's last bit at `done`).
    pub(super) fn resend_time(
        &self,
        recovery: Recovery,
        held: &Held,
        lost_sent: Nanos,
        done: Nanos,
    ) -> Nanos {
        let rto_min = self.tcp.rto_min;
        match self.tcp.flows.get(held.slot) {
            Some(flow) => flow.resend_at(recovery, lost_sent, done, rto_min, held.timeouts),
            None => done.saturating_add(rto_min),
        }
    }

    /// A resend filed at `at` (kept at `index`) waits for its flow's probe or timeout: data
    /// the flow sends before then may reveal the loss sooner (one such wait per flow).
    pub(super) fn wait_in_tail(&mut self, at: Nanos, index: usize, held: &Held) {
        let tail = matches!(held.found_by, Some((r, _)) if r != Recovery::Sack);
        match self.tcp.tails.get_mut(held.slot) {
            Some(wait @ None) if tail => *wait = Some(TailWait { at, index }),
            _ => {}
        }
    }

    /// Data of flow `slot` whose first packet left at `sent` and arrived: its selective
    /// acknowledgement reveals the flow's tail loss (RACK: a round trip and a quarter of the
    /// minimum one later), which is resent then if that is before its probe or timeout.
    pub(super) fn reveal_tail(&mut self, slot: usize, sent: Nanos) {
        let (Some(flow), Some(&Some(wait))) = (self.tcp.flows.get(slot), self.tcp.tails.get(slot))
        else {
            return;
        };
        let seen = flow.resend_at(Recovery::Sack, sent, sent, self.tcp.rto_min, 0);
        if seen >= wait.at {
            return;
        }
        self.tcp.tails[slot] = None;
        if let Some(mut held) = self.retransmits.cancel(wait.index) {
            held.found_by = held.found_by.map(|(_, path)| (Recovery::Sack, path));
            self.offer_later(seen, held);
        }
    }

    /// A resend taken from `Port::retransmits` at `now`: its loss is counted as found and
    /// told to its flow's window (a timeout backs the next one off).
    pub(super) fn found(&mut self, now: Nanos, mut held: Held) -> Held {
        let Some((recovery, path)) = held.found_by.take() else {
            return held;
        };
        if let Some(wait) = self.tcp.tails.get_mut(held.slot) {
            if wait.is_some_and(|w| w.index == held.later) {
                *wait = None;
            }
        }
        if recovery.is_timeout() {
            held.timeouts = held.timeouts.saturating_add(1);
        }
        held.tail_repair = recovery != Recovery::Sack;
        let (cc, mss) = (self.tcp.cc, self.tcp.mss);
        let began = (self.tcp.flows.get_mut(held.slot))
            .is_some_and(|flow| flow.on_loss(cc, recovery, now, now, mss));
        self.count(held.slot, path, |c| {
            c.recovered(recovery);
            if began && !recovery.is_timeout() {
                c.loss_episodes = c.loss_episodes.saturating_add(1);
            }
        });
        held
    }

    /// A reliable frame of `held` delivered on path `i` after waiting `queued` in the
    /// queue, its last bit out at `done`: a round-trip sample, and the window grows by what
    /// the ACKs before its last acknowledge ([`Port::final_ack`] decides that last one).
    pub(super) fn acked(&mut self, held: &Held, i: usize, queued: Nanos, done: Nanos) {
        let (cc, mss) = (self.tcp.cc, self.tcp.mss);
        let Some(path) = self.paths.get(i) else {
            return;
        };
        let latency = if self.one_per_flow {
            self.tcp.base_rtt / 2
        } else {
            path.spec.latency_ns
        };
        let bps = path.spec.bandwidth_bps;
        let segment = crate::net::transmission_ns(bps, mss as usize);
        let Some(flow) = self.tcp.flows.get_mut(held.slot) else {
            return;
        };
        // What the flow itself queues is at most its window: the rest of a frame waits in
        // the sender's socket, which no round trip sees.
        let window = flow.window_bytes();
        let own = crate::net::transmission_ns(bps, window);
        let backlog = flow.own_backlog(done, window);
        let path_rtt = (queued.min(own) + segment + latency.saturating_mul(2))
            .saturating_add(self.tcp.return_queue_ns);
        flow.sample_rtt(path_rtt, backlog);
        if fills_window(held, flow) {
            flow.window_used(done);
        }
        let last = final_ack_packets(&path.loss, held.wire_bytes) as f64 * mss;
        let before_last = (held.meta.bytes as f64 - last).max(0.0) as usize;
        flow.on_acked(cc, before_last, done, mss);
    }

    /// A resend of the flow's tail (`held`, found by its probe or timeout) delivered on path
    /// `i`, its last bit out at `done`: it arrives in order with nothing after it, so the
    /// receiver acknowledges it only at its delayed-ACK timer. Where the window has no room
    /// for new data (which would draw an immediate ACK), the flow waits for that ACK.
    pub(super) fn delayed_ack(&mut self, held: &Held, i: usize, done: Nanos) {
        let mss = self.tcp.mss;
        let (Some(path), Some(flow)) = (self.paths.get(i), self.tcp.flows.get_mut(held.slot))
        else {
            return;
        };
        let resent = path.loss.packets(held.wire_bytes) as f64 * mss;
        if held.tail_repair && (flow.in_port <= 1 || flow.window_bytes() as f64 <= resent) {
            let acked = done.saturating_add(DELAYED_ACK_NS);
            flow.stall(acked.saturating_add(path.spec.latency_ns.saturating_mul(2)));
        }
    }

    /// The acknowledgement of `held`'s final packets (delivered on path `i`, its last bit
    /// out at `done`; `draw` its loss key) comes back, or is lost with the path's loss (or
    /// in an outage; while the flow recovers, one ACK per packet, all lost). A lost one is
    /// covered by later acknowledgements where more of the flow follows; where nothing does,
    /// the sender's loss probe (or, while it recovers, its timeout) resends the last packet,
    /// which the receiver answers with a duplicate SACK, so the window is not cut (Linux
    /// undoes it). That costs the flow nothing unless its window is full of those packets
    /// (one segment after a timeout, two at the floor): then it sends nothing new until the
    /// probe or timeout, and a timeout's resend or its answer may be lost again
    /// ([`TcpFlow::timeout_chain`]).
    pub(super) fn final_ack(&mut self, held: &Held, i: usize, draw: Option<u64>, done: Nanos) {
        let (cc, mss, rto_min) = (self.tcp.cc, self.tcp.mss, self.tcp.rto_min);
        let Some(path) = self.paths.get_mut(i) else {
            return;
        };
        let packets = final_ack_packets(&path.loss, held.wire_bytes);
        let last = (packets as f64 * mss).min(held.meta.bytes as f64) as usize;
        let Some(flow) = self.tcp.flows.get_mut(held.slot) else {
            return;
        };
        let full = flow.window_bytes() as f64 <= packets as f64 * mss;
        let alone = flow.in_port <= 1;
        let back = done.saturating_add(path.spec.latency_ns);
        let outage = path.spec.blackout.is_some_and(|b| b.is_out(back));
        // While the flow recovers, the receiver holds data past a hole and acknowledges
        // each packet at once: every one of those ACKs must be lost.
        let recovering = flow.in_recovery(done);
        let acks = if recovering { packets } else { 1 };
        if !((full || alone) && (outage || path.loss.lose_acks(draw, acks))) {
            if fills_window(held, flow) {
                flow.window_used(done);
            }
            flow.on_acked(cc, last, done, mss);
            return;
        }
        let recovery = if recovering {
            Recovery::Timeout(TimeoutCause::AcksInRecovery)
        } else {
            Recovery::LossProbe { lone: packets == 1 }
        };
        if !full {
            self.count(held.slot, i, |c| c.recovered(recovery));
            return;
        }
        if recovering {
            let further = path.loss.lose_resent_head(draw, 0);
            let wait = flow.timeout_chain(rto_min, held.timeouts, further);
            let at = flow.serial_timeout(done, done.saturating_add(wait));
            flow.stall(at);
            self.count_timeouts(held.slot, i, 1 + u64::from(further));
        } else {
            flow.stall(flow.resend_at(recovery, done, done, rto_min, held.timeouts));
            self.count(held.slot, i, |c| c.recovered(recovery));
        }
    }
}

impl Port {
    /// How long an acknowledgement reaching this port (a host's downlink) at `now` waits
    /// behind the data converging on the host, on the first path (the reliable flows'):
    /// the frame serialising, then those queued, each counted at most an initial window
    /// ([`FrameQueue::set_ack_cap`](super::super::queue::FrameQueue::set_ack_cap)).
    pub(super) fn ack_wait_ns(&self, now: Nanos) -> Nanos {
        let Some(path) = self.paths.first() else {
            return 0;
        };
        let (capped, first) = path.queue.ack_wait(now);
        let Some((done, bytes)) = first else {
            return path.transmission_ns(capped);
        };
        let current = bytes.min(path.queue.ack_cap());
        let rest = path.transmission_ns(capped.saturating_sub(current));
        let left = done.saturating_sub(now).min(path.transmission_ns(current));
        rest.saturating_add(left)
    }

    /// The windows of `held` before its final packets (sent on path `i`, its last bit out
    /// at `done`; `draw` its loss key) whose acknowledgements are all lost. With a window
    /// of a few packets (cubic's floor under heavy loss) the sender is then left with
    /// nothing in flight to clock it, and waits for its loss probe (its timeout while it
    /// recovers, whose lone resend or its answer may be lost again), whose answer sets it
    /// going again; the window is not cut (the probe's duplicate SACK undoes it). Returns when the frame's last bit leaves after those
    /// waits (the link serves others meanwhile), each counted; the flow sends nothing new
    /// before then.
    pub(super) fn middle_acks_lost(
        &mut self,
        held: &Held,
        i: usize,
        draw: Option<u64>,
        done: Nanos,
    ) -> Nanos {
        let (cc, mss, rto_min) = (self.tcp.cc, self.tcp.mss, self.tcp.rto_min);
        if !(held.meta.reliable && self.tcp.on) {
            return done;
        }
        let (Some(path), Some(flow)) = (self.paths.get_mut(i), self.tcp.flows.get(held.slot))
        else {
            return done;
        };
        let packets = path.loss.packets(held.wire_bytes);
        let middle = packets.saturating_sub(final_ack_packets(&path.loss, held.wire_bytes));
        let stalls = path
            .loss
            .lose_windows_acks(draw, flow.rounds(cc, middle, mss));
        let window = ((flow.window_bytes() as f64 / mss) as u64).max(1);
        if stalls == 0 {
            return done;
        }
        let recovering = flow.in_recovery(done);
        let probe = Recovery::LossProbe { lone: window == 1 };
        let (mut last, mut timeouts) = (done, 0u64);
        for nth in 1..=stalls {
            if recovering {
                // Not backed off at first: the ACKs before the window's took round-trip
                // samples.
                let further = path.loss.lose_resent_head(draw, nth);
                last = last.saturating_add(flow.timeout_chain(rto_min, 0, further));
                timeouts = timeouts.saturating_add(1 + u64::from(further));
            } else {
                last = last.saturating_add(flow.resend_at(probe, 0, 0, rto_min, 0));
            }
        }
        if recovering {
            self.count_timeouts(held.slot, i, timeouts);
        } else {
            (0..stalls).for_each(|_| self.count(held.slot, i, |c| c.recovered(probe)));
        }
        if let Some(flow) = self.tcp.flows.get_mut(held.slot) {
            if recovering {
                last = flow.serial_timeout(done, last);
            }
            flow.stall(last);
        }
        last
    }
}

/// The draw of a resend's first packet's exchange after a timeout, apart from those of
/// the frame's final ACK (0) and its windows' (from 1).
const HEAD_DRAW: u64 = u64::MAX;

impl Port {
    /// `n` timeouts of flow `slot` on path `i` that found ACKs lost while it recovers, or,
    /// backed off, its lone resend after one or that resend's answer lost.
    fn count_timeouts(&mut self, slot: usize, i: usize, n: u64) {
        let recovery = Recovery::Timeout(TimeoutCause::AcksInRecovery);
        for _ in 0..n {
            self.count(slot, i, |c| c.recovered(recovery));
        }
    }
}

/// Whether `held` shows its flow using its window: the window held it back, or it is larger
/// than the window (its sender had more than a window to send).
fn fills_window(held: &Held, flow: &TcpFlow) -> bool {
    held.pacing == Pacing::Released || held.meta.bytes >= flow.window_bytes()
}

/// The packets the receiver acknowledges last of a frame of `bytes`: two (an ACK every
/// second segment), one for a frame of one packet.
fn final_ack_packets(loss: &super::super::loss::LossProcess, bytes: usize) -> u64 {
    loss.packets(bytes).min(2)
}
