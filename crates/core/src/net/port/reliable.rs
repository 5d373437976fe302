//! The reliable flows of a [`Port`]: their frames held to the congestion window, how each
//! loss is found and when it is resent ([`super::super::tcp`]), and the headers every
//! packet carries on the wire.

use super::super::profile::{NetworkProfile, ETHERNET_HEADER_BYTES};
use super::super::rng::{hash, SplitMix64};
use super::super::tcp::Recovery;
use super::super::Nanos;
use super::{Held, Pacing, Port, TcpModel};

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
            packets,
            flows: Vec::new(),
            held_bytes: 0,
        }
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

/// When the last of `lost` of a frame's `packets` serialised from `start` to `done` left: a
/// deterministic draw from the frame's key (the largest of `lost` uniform positions), the
/// middle without a key, the end when every packet was lost.
pub(super) fn lost_at(
    draw: Option<u64>,
    lost: u64,
    packets: u64,
    start: Nanos,
    done: Nanos,
) -> Nanos {
    let position = match draw {
        _ if lost >= packets => 1.0,
        Some(key) => {
            let u = SplitMix64::new(hash(&[key, 0x5ACC])).next_f64();
            u.powf(1.0 / lost.max(1) as f64)
        }
        None => 0.5,
    };
    let span = done.saturating_sub(start) as f64;
    start.saturating_add((span * position) as Nanos)
}

impl Port {
    /// Holds a new reliable frame offered at `t` to its flow's congestion window: `false`
    /// if it must wait (it is offered again when its time comes).
    pub(super) fn pass_window(&mut self, t: Nanos, held: &mut Held) -> bool {
        match held.pacing {
            Pacing::Cleared => true,
            Pacing::Held => {
                self.tcp.held_bytes = self.tcp.held_bytes.saturating_sub(held.wire_bytes);
                held.pacing = Pacing::Cleared;
                true
            }
            Pacing::Unasked => {
                held.pacing = Pacing::Cleared;
                let (cc, rto_min, mss) = (self.tcp.cc, self.tcp.rto_min, self.tcp.mss);
                let Some(flow) = self.tcp.flows.get_mut(held.slot) else {
                    return true;
                };
                let at = flow.send_at(cc, t, held.wire_bytes, rto_min, mss);
                if at <= t {
                    return true;
                }
                held.pacing = Pacing::Held;
                self.tcp.held_bytes = self.tcp.held_bytes.saturating_add(held.wire_bytes);
                self.offer_later(at, *held);
                false
            }
        }
    }

    /// How a loss of `held` whose last lost packet left at `lost_sent` (its last bit at
    /// `done`) is found. Data sent after a lost packet reveals it (SACK; RACK for a lost
    /// resend): later frames of the flow, or the rest of this frame where that takes more
    /// than a round trip. Without either the loss is in the flow's tail: the loss probe
    /// finds it, and a lost resend of a tail loss only the timeout.
    pub(super) fn recovery_of(&self, held: &mut Held, lost_sent: Nanos, done: Nanos) -> Recovery {
        let flow = self.tcp.flows.get(held.slot);
        let alone = flow.is_none_or(|f| f.in_port <= 1);
        if held.retransmissions > 0 {
            return if alone && held.tail {
                Recovery::Timeout
            } else {
                Recovery::Sack
            };
        }
        let round_trip = flow.map_or(0, |f| f.srtt_ns());
        held.tail = alone && done.saturating_sub(lost_sent) <= round_trip;
        if held.tail {
            Recovery::LossProbe
        } else {
            Recovery::Sack
        }
    }

    /// When a loss of `held` on path `i` found by `recovery` is resent (the lost packet
    /// left at `lost_sent`, the frame's last bit at `done`), telling its flow's window at
    /// `now` and counting how it was found.
    pub(super) fn recover(
        &mut self,
        recovery: Recovery,
        held: &Held,
        i: usize,
        lost_sent: Nanos,
        done: Nanos,
        now: Nanos,
    ) -> Nanos {
        let (cc, rto_min, mss) = (self.tcp.cc, self.tcp.rto_min, self.tcp.mss);
        let Some(flow) = self.tcp.flows.get_mut(held.slot) else {
            return done.saturating_add(rto_min);
        };
        let at = flow.resend_at(recovery, lost_sent, done, rto_min, held.timeouts);
        flow.on_loss(cc, recovery, now, mss);
        self.count(held.slot, i, |c| c.recovered(recovery));
        at
    }

    /// A reliable frame of `held` delivered on path `i` after waiting `queued` in the
    /// queue, its last bit out at `done`: a round-trip sample, and the window grows.
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
        let own = crate::net::transmission_ns(bps, flow.window_bytes());
        flow.sample_rtt(queued.min(own) + segment + latency.saturating_mul(2));
        flow.on_acked(cc, held.meta.bytes, done, mss);
    }
}
