//! The reliable flow's transport, as Linux's TCP behaves: how a lost packet is found and
//! repaired, and how fast a flow may send after a loss.
//!
//! A port keeps one [`TcpFlow`] per reliable flow once it can lose anything. A loss is
//! repaired in one of three ways ([`Recovery`]), as Linux's RACK-TLP stack repairs it:
//! - **SACK**: later data of the flow is acknowledged, so the hole is seen about one round
//!   trip after the lost packet left (plus RACK's reordering window of a quarter of the
//!   minimum RTT) and resent at once;
//! - **tail loss probe**: nothing after the lost packet is in flight, so nothing can reveal
//!   it before the probe timer fires and resends the last packet. The timer is `2·srtt + 2 ms`
//!   where more than one packet is outstanding, and `2·srtt + rto_min` where the lost one is
//!   alone (room for the receiver's worst delayed ACK), no later than the RTO itself; rounded up
//!   to the 4 ms timer tick (250 Hz). Linux probes only in the Open state: a tail lost while
//!   the flow is still recovering an earlier loss waits for the RTO;
//! - **retransmission timeout**: a retransmission is lost too with nothing behind it, or the
//!   tail was lost during a recovery, so only the RTO (`srtt + max(4·rttvar, rto_min)`,
//!   doubled at each further timeout) finds it. The doubling stands until a round-trip
//!   sample: a timeout resends one packet, and where it or the ACK answering it is lost,
//!   the next timeout, doubled, finds it again. Linux keeps one such timer per connection:
//!   a timeout armed while another of the flow's is pending fires only after that one, by
//!   its own RTO again, so the resends of frames sent back to back time out one after
//!   another, as the kernel's do, not together.
//!
//! The congestion window follows the kernel's algorithm ([`CongestionControl`]): an
//! initial window of 10 segments, slow start to `ssthresh`, then cubic's growth (with its
//! Reno-friendly floor) or Reno's one segment per round trip; a loss episode (at most one
//! per round trip; a frame's losses a window or more apart are episodes of their own, as
//! the window's rounds find them one by one) multiplies the window by 0.7 (cubic) or 0.5
//! (Reno); a timeout takes it
//! to one segment; after an idle spell longer than the RTO the window restarts at the
//! initial window. The window grows only while the flow uses it, as Linux's
//! `tcp_is_cwnd_limited` allows: within a round trip of the ACK of a frame the window held
//! back (or that was larger than it), or in slow start up to twice what the flow sends a
//! round trip; cubic's curve does not count a spell with nothing in flight, but counts the
//! spell a flow's last frame takes to drain a bottleneck further on, over which its ACKs
//! come back (a lone message of 160 KB: 13 ms at 100 Mbit/s). BBR does not
//! shrink on random loss; it paces at its bottleneck's rate, at most a round trip (or 4
//! segments) ahead of it, in a window of what Linux's BBR keeps in flight at most
//! ([`TcpFlow::with_bbr_window`]); a loss it finds with only that lead in flight (a frame
//! from idle) leaves it a window of that much (packet conservation), so the resend goes
//! alone (`Port::conserve`); a timeout takes it to one segment (Linux's Loss state), from
//! which its ACKs (a partly lost frame's too, less its losses) regrow the window to where
//! it stood, a window per round trip till then. A cubic or Reno flow sends a frame of `b`
//! bytes no sooner than `b · rtt / cwnd` after the one before (a window's worth per round
//! trip of the path, its ACK clock), and never faster than its bottleneck drains it.
//! The bottleneck may lie beyond the sender's NIC (a server's port behind workers' faster
//! NICs): the flow's own queue there counts in the round trip it measures, up to its window.
//! So does the wait of its ACKs at its own host's downlink, behind the data converging there
//! (`Port::enqueue_at_host`).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Nanos;

/// Segments in the initial congestion window (Linux's `TCP_INIT_CWND`, RFC 6928).
pub const INITIAL_WINDOW_SEGMENTS: f64 = 10.0;

/// The kernel's timer tick at 250 Hz: loss probe timers are rounded up to it.
const TIMER_TICK_NS: Nanos = 4_000_000;

/// The receiver's delayed ACK for a lone in-order segment (Linux's `TCP_DELACK_MIN`,
/// 40 ms: with the receiver's round trip under it, its `ato` is capped there).
pub(crate) const DELAYED_ACK_NS: Nanos = 40_000_000;

/// What Linux adds to `2·srtt` for the tail loss probe's timeout.
const PROBE_EXTRA_NS: Nanos = 2_000_000;

/// The longest retransmission timeout (Linux's `TCP_RTO_MAX`, 120 s).
const RTO_MAX_NS: Nanos = 120_000_000_000;

/// The most doublings a flow's RTO takes in a row (past them it has long reached
/// [`RTO_MAX_NS`]), and so the longest chain of lost lone resends a timeout draws.
pub(crate) const MAX_BACKOFFS: u32 = 16;

/// How much of a flow's data Linux's TCP small queues let into the host's qdisc: about
/// 1 ms at its pacing rate (`sk_pacing_shift` 10), at least two packets.
const SMALL_QUEUE_NS: f64 = 1e6;
const SMALL_QUEUE_PACKETS: f64 = 2.0;
/// Bytes of a full Ethernet frame (1,500 of IP and 14 of header), where no MTU is given.
const ETHERNET_FRAME_BYTES: f64 = 1_514.0;

/// The bytes of a host's own TCP data in its qdisc on a path of `bandwidth_bps` (`None`:
/// unlimited) with IP packets of `mtu_bytes` (`None`: Ethernet's), the rest held in the
/// sockets (TCP small queues): 1 ms of the path's rate, which flows sharing the path share
/// between them, and at least two packets.
pub(crate) fn tcp_small_queue_bytes(bandwidth_bps: Option<f64>, mtu_bytes: Option<f64>) -> usize {
    let packet = mtu_bytes.map_or(ETHERNET_FRAME_BYTES, |mtu| mtu + 14.0);
    let at_rate = bandwidth_bps.map_or(0.0, |bps| bps / 8.0 * SMALL_QUEUE_NS / 1e9);
    at_rate.max(SMALL_QUEUE_PACKETS * packet).ceil() as usize
}

/// Cubic's scaling constant `C` (segments per second cubed) and its multiplicative
/// decrease `β`.
const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;

/// The congestion control of the reliable flows, named as the kernel names it
/// (`net.ipv4.tcp_congestion_control`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CongestionControl {
    /// CUBIC (Linux's default in most distributions): window × 0.7 on a loss, cubic growth.
    #[default]
    Cubic,
    /// BBR (v1, as in Linux): paced at the measured delivery rate, random loss ignored.
    Bbr,
    /// NewReno: window halved on a loss, one segment more per round trip.
    Reno,
}

impl CongestionControl {
    /// The kernel's name of the algorithm, as in flags and TOML.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cubic => "cubic",
            Self::Bbr => "bbr",
            Self::Reno => "reno",
        }
    }

    /// The multiplicative decrease of a loss episode: cubic's 0.7, Reno's 0.5, BBR's none.
    fn beta(self) -> f64 {
        match self {
            Self::Cubic => CUBIC_BETA,
            Self::Reno => 0.5,
            Self::Bbr => 1.0,
        }
    }

    /// Whether a loss shrinks the window (cubic, Reno) or not (BBR).
    fn backs_off(self) -> bool {
        self != Self::Bbr
    }
}

impl fmt::Display for CongestionControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a lost packet of a reliable frame is found and resent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Later data's selective acknowledgements reveal it within about a round trip.
    Sack,
    /// Nothing follows it: the tail loss probe finds it; `lone`: the lost packet is the only
    /// one outstanding, so the probe waits for the receiver's worst delayed ACK too.
    LossProbe {
        /// The lost packet is the flow's only one outstanding.
        lone: bool,
    },
    /// A retransmission was lost, or a tail during a recovery: the retransmission timeout
    /// finds it. Why nothing found it sooner is the model's rule that decided it.
    Timeout(TimeoutCause),
}

impl Recovery {
    /// Whether the retransmission timeout finds the loss.
    pub fn is_timeout(self) -> bool {
        matches!(self, Self::Timeout(_))
    }
}

/// Why a loss waits for the retransmission timeout: what nothing the flow sent could reveal
/// (the model's rule; `scripts/tcp_waits.py` sorts the kernel's timeouts by what the sender
/// sent after the packet it resent). [`super::NetCounters`] counts each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutCause {
    /// A resend was lost with nothing of its flow after it.
    ResendLast,
    /// A resend was lost where nothing new can follow it before the timeout: it ends a
    /// round its window filled (a window of one segment: any resend), or an outage
    /// swallows what follows.
    ResendStalled,
    /// An original packet was lost with nothing after it to reveal it (the flow's tail, the
    /// end of a round of one or two segments, an outage) while the flow still recovers an
    /// earlier loss, when Linux sends no probe.
    OriginalInRecovery,
    /// Every acknowledgement of a window the flow filled was lost while it recovers.
    AcksInRecovery,
}

/// One reliable flow's transport state at a port: its round-trip estimate and its
/// congestion window.
#[derive(Debug, Clone)]
pub(crate) struct TcpFlow {
    /// Smoothed round trip and its variation (RFC 6298), ns.
    srtt: f64,
    /// The smoothed round trip without the flow's own queue at a bottleneck further on
    /// (its ACK clock: a window per such round trip, no faster than the bottleneck), ns.
    clock_rtt: f64,
    rttvar: f64,
    /// The smallest round trip seen, ns.
    min_rtt: f64,
    /// The congestion window and slow-start threshold, bytes (BBR: the window it regrows
    /// to after a timeout, infinite otherwise).
    cwnd: f64,
    ssthresh: f64,
    /// Cubic: the window before the last reduction (segments) and when growth restarted.
    w_max: f64,
    epoch: Nanos,
    /// The current loss episode (Linux's Recovery or Loss state) ends here, when the resend
    /// that began it is acknowledged: losses before it shrink the window no further, and a
    /// tail lost before it is not probed.
    recovery_until: Nanos,
    /// When the flow may start its next frame, and when it last started one.
    next_send: Nanos,
    last_send: Nanos,
    /// A flow whose window is full of unacknowledged loss sends nothing new before this
    /// (its probe or timeout), whatever its algorithm.
    stalled_until: Nanos,
    /// Frames of the flow offered to the port and not yet serialised.
    pub(crate) in_port: u32,
    /// Bytes of the flow's frames its window holds back: they wait in its socket, which
    /// takes no more once they reach the send window (`Port::flow_has_room`).
    pub(crate) held_bytes: usize,
    /// When the flow's retransmission timer fires (Linux has one per connection).
    timer_until: Nanos,
    /// Its bottleneck's time per byte (0: unlimited), and when the data it has sent so far
    /// would have left that bottleneck had it been alone there: its own queue, which its
    /// round trip holds (up to its window) and which BBR's pacing keeps short.
    bottleneck_ns_per_byte: f64,
    bottleneck_free: Nanos,
    /// What the flow keeps in flight, for the window's growth: the bytes it started in its
    /// current round trip (which ends at `round_end`) and in the one before.
    round_end: Nanos,
    round_bytes: f64,
    last_round_bytes: f64,
    /// Until when ACKs may grow the window: a round trip after that of a frame that used it
    /// (one the window held back, or larger than the window).
    window_limited_until: Nanos,
    /// BBR: the frame it started last found nothing of the flow queued at its bottleneck,
    /// so its pacing had only its lead in flight while the frame began.
    pub(crate) sent_from_idle: bool,
}

impl TcpFlow {
    /// A new flow whose round trip is at least `base_rtt` ns, through a bottleneck of
    /// `bottleneck_bps` (`None`: unlimited).
    pub(crate) fn new(base_rtt: Nanos, mss: f64, bottleneck_bps: Option<f64>) -> Self {
        let rtt = (base_rtt as f64).max(1.0);
        Self {
            srtt: rtt,
            clock_rtt: rtt,
            rttvar: rtt / 2.0,
            min_rtt: rtt,
            cwnd: INITIAL_WINDOW_SEGMENTS * mss,
            ssthresh: f64::INFINITY,
            w_max: 0.0,
            epoch: 0,
            recovery_until: 0,
            next_send: 0,
            last_send: 0,
            stalled_until: 0,
            in_port: 0,
            held_bytes: 0,
            timer_until: 0,
            bottleneck_ns_per_byte: bottleneck_bps.map_or(0.0, |bps| 8e9 / bps.max(1.0)),
            bottleneck_free: 0,
            round_end: 0,
            round_bytes: 0.0,
            last_round_bytes: 0.0,
            window_limited_until: 0,
            sent_from_idle: false,
        }
    }

    /// The flow under BBR: its window is what Linux's BBR keeps in flight at most
    /// (`bbr_target_cwnd` with its quantization budget): twice the bandwidth-delay product
    /// of its bottleneck and its round trip, plus three pacing quanta (what its pacing rate
    /// sends in about a millisecond, `rate >> sk_pacing_shift`, 2 to 127 segments), rounded
    /// up to an even number of segments: 26 at 100 Mbit/s over a round trip of tens of
    /// microseconds, where its initial window of 10 would hold a resend's losses back at
    /// every tenth packet; 382 and more at 10 Gbit/s. Without a bottleneck, the quanta alone.
    pub(crate) fn with_bbr_window(mut self, mss: f64) -> Self {
        let mss = mss.max(1.0);
        let bytes_per_ns = match self.bottleneck_ns_per_byte {
            b if b > 0.0 => 1.0 / b,
            _ => 0.0,
        };
        let quantum = match bytes_per_ns {
            r if r > 0.0 => (r * 1e9 / 1024.0 / mss).floor().clamp(2.0, 127.0),
            _ => 127.0,
        };
        let bdp = (2.0 * bytes_per_ns * self.min_rtt / mss).ceil();
        let segments = (bdp + 3.0 * quantum).max(4.0);
        self.cwnd = (segments / 2.0).ceil() * 2.0 * mss;
        self
    }

    /// The copy of a flow kept at a port that does not pace it (a receiver's ingress): it
    /// sees none of the sender's sends, so every ACK may grow its window.
    pub(crate) fn unpaced(mut self) -> Self {
        self.window_limited_until = Nanos::MAX;
        self
    }

    /// The flow's own data still queued at its bottleneck at `t` (what it sent faster than
    /// the bottleneck drains), at most `window` bytes, ns.
    pub(crate) fn own_backlog(&self, t: Nanos, window: usize) -> Nanos {
        let most = (window as f64 * self.bottleneck_ns_per_byte) as Nanos;
        self.bottleneck_free.saturating_sub(t).min(most)
    }

    /// `bytes` of the flow start at `start`: they join its queue at the bottleneck.
    fn through_bottleneck(&mut self, start: Nanos, bytes: usize) -> Nanos {
        let drain = (bytes as f64 * self.bottleneck_ns_per_byte) as Nanos;
        self.bottleneck_free = self.bottleneck_free.max(start).saturating_add(drain);
        start
    }

    /// How far ahead of its bottleneck BBR lets a flow run: its pacing at the bottleneck
    /// rate keeps about a round trip's data (`cwnd_gain` 2 bounds what is in flight to two
    /// delivery-rate-times-min-RTT), and at least 4 segments (its smallest window), ns.
    fn bbr_lead(&self, mss: f64) -> Nanos {
        let segments = 4.0 * mss * self.bottleneck_ns_per_byte;
        self.min_rtt.max(segments) as Nanos
    }

    /// The packets BBR's lead holds in flight ([`TcpFlow::bbr_lead`]): 4 on a path whose
    /// round trip is shorter than 4 packets' time at its bottleneck, as here at 100 Mbit/s.
    pub(crate) fn bbr_lead_packets(&self, mss: f64) -> u64 {
        let packet = mss * self.bottleneck_ns_per_byte;
        match packet > 0.0 {
            true => (self.bbr_lead(mss) as f64 / packet).ceil() as u64,
            false => 4,
        }
    }

    /// Takes a round-trip sample of `rtt` ns (RFC 6298's smoothing) for a frame that
    /// found `own_backlog` ns of the flow's own data ahead of it at its bottleneck further
    /// on: a full window drains there in turn, so the round trip the kernel measures is
    /// then the window's time at that rate (Little's law).
    pub(crate) fn sample_rtt(&mut self, rtt: Nanos, own_backlog: Nanos) {
        let path = (rtt as f64).max(1.0);
        self.clock_rtt = 0.875 * self.clock_rtt + 0.125 * path;
        let r = path.max(own_backlog as f64);
        self.rttvar = 0.75 * self.rttvar + 0.25 * (self.srtt - r).abs();
        self.srtt = 0.875 * self.srtt + 0.125 * r;
        self.min_rtt = self.min_rtt.min(r);
    }

    /// When the resend of a loss found by `recovery` is sent, given when the lost packet
    /// left (`lost_sent`), when the frame's last bit left (`done`), the minimum RTO and how
    /// many timeouts this frame already took.
    pub(crate) fn resend_at(
        &self,
        recovery: Recovery,
        lost_sent: Nanos,
        done: Nanos,
        rto_min: Nanos,
        timeouts: u32,
    ) -> Nanos {
        match recovery {
            Recovery::Sack => {
                let window = self.srtt + self.min_rtt / 4.0;
                lost_sent.saturating_add(window as Nanos).max(done)
            }
            Recovery::LossProbe { lone } => done.saturating_add(self.probe_timeout(lone, rto_min)),
            Recovery::Timeout(_) => done.saturating_add(self.rto(rto_min, timeouts)),
        }
    }

    /// The tail loss probe's timeout: `2·srtt + 2 ms`, or `2·srtt + rto_min` for a `lone`
    /// packet outstanding, rounded up to the timer tick; no later than the RTO.
    fn probe_timeout(&self, lone: bool, rto_min: Nanos) -> Nanos {
        let extra = if lone { rto_min } else { PROBE_EXTRA_NS };
        let pto = ((2.0 * self.srtt) as Nanos).saturating_add(extra);
        let on_tick = pto.div_ceil(TIMER_TICK_NS).saturating_mul(TIMER_TICK_NS);
        on_tick.min(self.rto(rto_min, 0))
    }

    /// A timeout armed at `armed` to fire at `fires`: where the flow's one timer is already
    /// pending then, it fires only after that one does, by as long again.
    pub(crate) fn serial_timeout(&mut self, armed: Nanos, fires: Nanos) -> Nanos {
        let at = if self.timer_until > armed {
            self.timer_until.saturating_add(fires.saturating_sub(armed))
        } else {
            fires
        };
        self.timer_until = self.timer_until.max(at);
        at
    }

    /// The flow's window is full of loss nothing will reveal: it sends nothing new before
    /// `until`, when the probe or timeout resends it.
    pub(crate) fn stall(&mut self, until: Nanos) {
        self.stalled_until = self.stalled_until.max(until);
    }

    /// Whether the flow is still recovering a loss at `t` (no tail loss probe then).
    pub(crate) fn in_recovery(&self, t: Nanos) -> bool {
        t < self.recovery_until
    }

    /// The retransmission timeout after `timeouts` earlier ones (doubled each time): Linux's
    /// `srtt + max(4·rttvar, rto_min)` (its `rttvar_us` is at least the minimum RTO), so
    /// never under a round trip plus the minimum.
    pub(crate) fn rto(&self, rto_min: Nanos, timeouts: u32) -> Nanos {
        let spread = ((4.0 * self.rttvar) as Nanos).max(rto_min);
        let base = (self.srtt as Nanos).saturating_add(spread);
        let backoff = 1u64
            .checked_shl(timeouts.min(MAX_BACKOFFS))
            .unwrap_or(u64::MAX);
        base.saturating_mul(backoff).min(RTO_MAX_NS.max(rto_min))
    }

    /// What a timeout after `timeouts` earlier ones costs where the lone packet it resends,
    /// or the ACK answering it, is lost `further` times in a row: each time the timer,
    /// doubled, fires again (Linux resets its backoff only on a round-trip sample).
    pub(crate) fn timeout_chain(&self, rto_min: Nanos, timeouts: u32, further: u32) -> Nanos {
        (0..=further).fold(0, |wait: Nanos, k| {
            wait.saturating_add(self.rto(rto_min, timeouts.saturating_add(k)))
        })
    }

    /// A loss found at `now` by `recovery` and resent at `resend`: the episode lasts until
    /// the resend is acknowledged; the window shrinks once per episode, to one segment
    /// after a timeout. Returns whether the loss began an episode.
    pub(crate) fn on_loss(
        &mut self,
        cc: CongestionControl,
        recovery: Recovery,
        now: Nanos,
        resend: Nanos,
        mss: f64,
    ) -> bool {
        let in_episode = self.in_recovery(now);
        let until = resend.saturating_add(self.srtt as Nanos);
        self.recovery_until = self.recovery_until.max(until);
        if !cc.backs_off() {
            // BBR ignores random loss, but a timeout is Linux's Loss state: one segment,
            // regrown by what ACKs acknowledge up to the window before it (`prior_cwnd`).
            if recovery.is_timeout() {
                if self.ssthresh.is_infinite() {
                    self.ssthresh = self.cwnd;
                }
                self.cwnd = mss;
            }
            return !in_episode;
        }
        let beta = cc.beta();
        if recovery.is_timeout() {
            self.ssthresh = (self.cwnd * beta).max(2.0 * mss);
            self.w_max = self.cwnd / mss;
            self.cwnd = mss;
            self.epoch = now;
            return !in_episode;
        }
        if !in_episode {
            self.cut(beta, now, mss);
        }
        !in_episode
    }

    /// One loss episode's multiplicative decrease, at `now`: the window × `beta`, at least
    /// two segments; cubic's curve restarts from the window before it.
    fn cut(&mut self, beta: f64, now: Nanos, mss: f64) {
        self.w_max = self.cwnd / mss;
        self.cwnd = (self.cwnd * beta).max(2.0 * mss);
        self.ssthresh = self.cwnd;
        self.epoch = now;
    }

    /// A frame of `packets` sent from the window at `now` lost the packets at `lost` (their
    /// places in the frame, from 0, in ascending order). Linux's recovery spans the window
    /// in flight when it began: a loss a window or more after the one that began the episode
    /// is found in a later round and begins one of its own. Each after the first cuts the
    /// window again (the first is cut when its loss is found, [`TcpFlow::on_loss`]), and the
    /// next round spans the smaller window; BBR ignores them. Returns the episodes.
    pub(crate) fn rounds_lost(
        &mut self,
        cc: CongestionControl,
        lost: impl IntoIterator<Item = u64>,
        now: Nanos,
        mss: f64,
    ) -> u32 {
        let beta = cc.beta();
        let segments = |cwnd: f64| (cwnd / mss).max(1.0) as u64;
        let mut lost = lost.into_iter();
        let Some(mut began) = lost.next() else {
            return 0;
        };
        // The window the current episode spans, and the one the next will span.
        let (mut span, mut next_span) = (segments(self.cwnd), segments(self.cwnd * beta));
        let mut episodes = 1u32;
        for place in lost {
            if place < began.saturating_add(span) {
                continue;
            }
            episodes = episodes.saturating_add(1);
            if cc.backs_off() {
                self.cut(beta, now, mss);
            }
            (began, span) = (place, next_span);
            next_span = segments((next_span as f64 * mss * beta).max(2.0 * mss));
        }
        episodes
    }

    /// `bytes` of the flow acknowledged at `now`: the window grows, if the flow uses it.
    pub(crate) fn on_acked(&mut self, cc: CongestionControl, bytes: usize, now: Nanos, mss: f64) {
        if !cc.backs_off() {
            self.bbr_regrow(bytes as f64);
            return;
        }
        let Some(most) = self.growth_limit(now) else {
            return;
        };
        let acked = bytes as f64;
        if self.cwnd < self.ssthresh {
            let cap = self.ssthresh.min(most).max(self.cwnd);
            self.cwnd = (self.cwnd + acked).min(cap);
            return;
        }
        let grown = match cc {
            CongestionControl::Reno => self.cwnd + mss * acked / self.cwnd,
            // A flow's last frame in the port (a message, a bulk flow's tail) is acknowledged
            // as it drains its bottleneck further on: cubic grows through that spell, which
            // nothing sent after it paces out here.
            _ if self.in_port <= 1 => self.cubic_window(now.max(self.bottleneck_free), mss),
            _ => self.cubic_window(now, mss),
        };
        // Growth of at most the bytes acknowledged (no more than slow start's pace).
        self.cwnd = grown.clamp(self.cwnd, self.cwnd + acked);
    }

    /// Part of a frame arrived (`acked` bytes) and part was lost (`lost`): BBR's window
    /// after a timeout grows by the difference, as Linux's does ACK by ACK (cubic and Reno
    /// grow only when a frame is whole).
    pub(crate) fn on_partly_acked(&mut self, cc: CongestionControl, acked: usize, lost: usize) {
        if !cc.backs_off() {
            self.bbr_regrow(acked.saturating_sub(lost) as f64);
        }
    }

    /// BBR after a timeout: its window grows by the `acked` bytes until it is back where it
    /// stood, when its pacing alone bounds the flow again.
    fn bbr_regrow(&mut self, acked: f64) {
        if self.ssthresh.is_finite() {
            self.cwnd = (self.cwnd + acked).min(self.ssthresh);
            if self.cwnd >= self.ssthresh {
                self.ssthresh = f64::INFINITY;
            }
        }
    }

    /// How large the flow's ACKs at `now` may grow its window (Linux's
    /// `tcp_is_cwnd_limited`), if at all: without bound where the window held a frame
    /// acknowledged within a round trip; in slow start, to twice what the flow keeps in
    /// flight. A flow whose sender sends less than its window allows (a pull, a slice between
    /// computations) keeps the window it needs rather than growing one it never fills.
    fn growth_limit(&self, now: Nanos) -> Option<f64> {
        if now <= self.window_limited_until {
            return Some(f64::INFINITY);
        }
        let twice_in_flight = 2.0 * self.round_bytes.max(self.last_round_bytes);
        (self.cwnd < self.ssthresh && self.cwnd < twice_in_flight).then_some(twice_in_flight)
    }

    /// `bytes` of the flow start at `start`: counted in the round trip they start in.
    fn count_sent(&mut self, start: Nanos, bytes: usize) {
        let round = self.srtt as Nanos;
        if start >= self.round_end {
            let adjacent = start < self.round_end.saturating_add(round);
            self.last_round_bytes = if adjacent { self.round_bytes } else { 0.0 };
            self.round_bytes = 0.0;
            self.round_end = start.saturating_add(round);
        }
        self.round_bytes += bytes as f64;
    }

    /// A frame that used the window (held back by it, or larger than it) is acknowledged at
    /// `now`: this ACK and those of the round trip after it may grow the window (Linux keeps
    /// `is_cwnd_limited` for a window after the send that found the window full).
    pub(crate) fn window_used(&mut self, now: Nanos) {
        let next_round = now.saturating_add(self.srtt as Nanos);
        self.window_limited_until = self.window_limited_until.max(next_round);
    }

    /// Cubic's window at `now`: `C·(t − K)³ + W_max` segments, or the Reno-friendly
    /// estimate where that is larger.
    fn cubic_window(&self, now: Nanos, mss: f64) -> f64 {
        let t = now.saturating_sub(self.epoch) as f64 * 1e-9;
        let k = (self.w_max * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
        let cubic = CUBIC_C * (t - k).powi(3) + self.w_max;
        let rtt_s = (self.srtt * 1e-9).max(1e-6);
        let friendly =
            self.w_max * CUBIC_BETA + 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA) * t / rtt_s;
        cubic.max(friendly) * mss
    }

    /// A frame of `bytes` the flow wants to send at `now` under `cc`: when it may start,
    /// one window per round trip (BBR: at once); an idle spell longer than the RTO restarts
    /// the window at the initial window.
    pub(crate) fn send_at(
        &mut self,
        cc: CongestionControl,
        now: Nanos,
        bytes: usize,
        rto_min: Nanos,
        mss: f64,
    ) -> Nanos {
        if !cc.backs_off() {
            let paced = self.bottleneck_free.saturating_sub(self.bbr_lead(mss));
            let mut start = now.max(self.stalled_until).max(paced);
            self.sent_from_idle = self.bottleneck_free <= start;
            if self.ssthresh.is_finite() {
                // Regrowing after a timeout: a window per round trip, as cubic's.
                start = start.max(self.next_send);
                let spacing = bytes as f64 * self.clock_rtt / self.cwnd.max(mss);
                self.next_send = start.saturating_add(spacing as Nanos);
            }
            return self.through_bottleneck(start, bytes);
        }
        // Idle: nothing of the flow in the port but the frame asking, and (its last frame
        // acknowledged) nothing in flight: cubic's curve resumes where it stood, the idle
        // spell not counted as growth (Linux's `CA_EVENT_TX_START`).
        let idle = now.saturating_sub(self.last_send);
        let acked_by = self.next_send.saturating_add(self.srtt as Nanos);
        if self.in_port <= 1 && now > acked_by && self.epoch > 0 {
            self.epoch = self.epoch.saturating_add(idle).min(now);
        }
        if idle > self.rto(rto_min, 0) && self.in_port <= 1 {
            self.cwnd = self.cwnd.min(INITIAL_WINDOW_SEGMENTS * mss);
            self.next_send = now;
        }
        let start = now.max(self.next_send).max(self.stalled_until);
        let window_paced = bytes as f64 * self.clock_rtt / self.cwnd.max(mss);
        let spacing = window_paced.max(bytes as f64 * self.bottleneck_ns_per_byte);
        self.next_send = start.saturating_add(spacing as Nanos);
        self.last_send = start;
        self.count_sent(start, bytes);
        self.through_bottleneck(start, bytes)
    }

    /// The rounds in which the flow under `cc` sends `packets` packets from its window now,
    /// as runs of `(rounds, packets a round)` in order. A BBR flow regrowing after a timeout
    /// grows its window ACK by ACK ([`TcpFlow::on_partly_acked`]), so each round's ACKs
    /// double the next one, up to where it stood; cubic's and Reno's window is the frame's
    /// throughout (it grows when the frame is whole). A last part-filled round, whose ACKs
    /// are the frame's final ones, is not counted.
    pub(crate) fn rounds(&self, cc: CongestionControl, packets: u64, mss: f64) -> Rounds {
        let segments = |bytes: f64| (bytes / mss).clamp(1.0, u32::MAX as f64) as u64;
        let window = segments(self.cwnd);
        let regrowing = !cc.backs_off() && self.ssthresh.is_finite();
        Rounds {
            left: packets,
            window,
            target: if regrowing {
                segments(self.ssthresh)
            } else {
                window
            },
        }
    }

    /// The congestion window, bytes (for tests and traces).
    #[cfg(test)]
    pub(crate) fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The smoothed round trip, ns.
    pub(crate) fn srtt_ns(&self) -> Nanos {
        self.srtt as Nanos
    }

    /// The congestion window in whole bytes (at most what a queue could hold).
    pub(crate) fn window_bytes(&self) -> usize {
        self.cwnd.min(1e12) as usize
    }
}

/// The rounds a flow sends a frame's packets in ([`TcpFlow::rounds`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounds {
    left: u64,
    window: u64,
    target: u64,
}

impl Iterator for Rounds {
    type Item = (u64, u32);

    fn next(&mut self) -> Option<(u64, u32)> {
        let acks = |w: u64| u32::try_from(w).unwrap_or(u32::MAX);
        if self.window < self.target && self.window <= self.left {
            let round = self.window;
            self.left -= round;
            self.window = self.window.saturating_mul(2).min(self.target);
            return Some((1, acks(round)));
        }
        let rounds = self.left / self.window.max(1);
        self.left = 0;
        (rounds > 0).then(|| (rounds, acks(self.window)))
    }
}

#[cfg(test)]
#[path = "tcp_tests.rs"]
mod tests;
