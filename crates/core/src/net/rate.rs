//! The rate controller and pacer of one direction of a datagram flow: how fast loss-tolerant
//! packets may leave as UDP datagrams, so that a sender shares a bottleneck instead of
//! blasting datagrams at memory speed into it.
//!
//! It is sans-IO like the rest of the core: the driver reports each datagram it sends
//! ([`RateController::on_sent`]) and each transport feedback the receiver sends back
//! ([`RateController::on_feedback`]), asks when the next datagram may leave
//! ([`RateController::next_send_at`]) and arms its timer at
//! [`RateController::poll_timeout`]. Time comes in as nanoseconds on the driver's clock.
//!
//! The controller is rate-based and delay-driven, in the spirit of TIMELY (Mittal et al.,
//! SIGCOMM 2015) as MLT uses it:
//! - **delay** is the primary signal: the queueing delay is the forward path's one-way
//!   delay over its base, as LEDBAT measures it (an RTT over its base where the
//!   driver cannot tell one-way delays: [`RateSignal::forward_ns`]), so that a queue on the
//!   reverse path does not count. Under `t_low` the rate grows; between `t_low` and
//!   `t_high` it holds, or decreases multiplicatively while the delay's smoothed gradient
//!   rises; over `t_high` it decreases multiplicatively, more the longer the queue. Delay
//!   decreases come at most once per smoothed RTT (a decrease shows a round trip later).
//! - **loss** is the second signal, for congestion only: a feedback that reports lost
//!   datagrams while the queueing delay is over `t_low` (the queue that overflowed is
//!   there to see), or while the loss smoothed over the last hundred or so datagrams is
//!   heavy (a queue too short to show, a dead path), lowers the rate in proportion to the
//!   lost fraction and to the share of a round trip the feedback covers, so that heavy
//!   loss halves the rate per round trip. Loss with no queue behind it is random (a lossy
//!   link, not a full one): the rate neither falls nor stops growing for it, as TIMELY and
//!   BBR ignore it, or a 10 % random loss would hold one flow to a fifth of its link.
//! - **growth**: slow start doubles the rate per round trip until the first congestion
//!   signal; afterwards the rate grows additively, by `additive_bps` per millisecond, faster
//!   the longer no decrease came (up to [`MAX_HYPER_INCREASE`] times). Growth is per unit
//!   of time, not per round trip, so flows of different RTTs converge to the same share.
//!   A flow that did not use its rate (it sent less than half of it since the last
//!   feedback) does not grow.
//! - **silence**: no feedback for `max(4 x smoothed RTT, feedback_timeout_floor_ns)` while
//!   datagrams are outstanding halves the rate.
//!
//! The rate always stays within `[min_bps, max_bps]`, finite and positive, and the pacer
//! never stalls: the next datagram may always leave no later than `bytes * 8 / min_bps`
//! after the previous one.

use serde::{Deserialize, Serialize};

use super::Nanos;
use delay::QueueDelay;

mod delay;

/// Nanoseconds per second, as a float.
const NS_PER_S: f64 = 1e9;
/// The least burst the pacer allows, as time at the current rate (2 ms): a driver woken
/// late by a busy scheduler sends what it owes in one batch instead of losing the budget
/// (a bucket of a few datagrams holds 50 us at 1 Gbit/s, less than one wake-up).
pub const BURST_TIME_NS: Nanos = 2_000_000;
/// Once its bucket is empty, a paced flow waits until it may send this much time of its
/// rate at once (250 us), not one datagram: at 10 Gbit/s one datagram every 1.1 us would
/// take a wake-up and a system call each, more than the machine can. Linux's TCP does the
/// same with a millisecond of its pacing rate per segmentation-offload burst; at 100
/// Mbit/s and below, 250 us is about one datagram, so slow flows stay paced per datagram.
pub const PACING_QUANTUM_NS: Nanos = 250_000;
/// The time unit `additive_bps` is added per (1 ms).
pub const ADDITIVE_ROUND_NS: Nanos = 1_000_000;
/// The most a growth step is multiplied by after a long time without a decrease.
pub const MAX_HYPER_INCREASE: f64 = 16.0;
/// The most time one feedback's growth counts for (4 ms: four of the receiver's feedback
/// intervals).
const MAX_GROWTH_NS: Nanos = 4_000_000;
/// Without a decrease for this long (or a smoothed RTT, if longer), growth speeds up by
/// one more `additive_bps` per round.
const HYPER_STEP_NS: Nanos = 20_000_000;
/// The least time between two decreases for a queue over `t_high` (a decrease shows in
/// the RTT a round trip later; one hold for every flow keeps them equal).
const DELAY_HOLD_NS: Nanos = 4_000_000;
/// A rising delay takes `1 / (1 + slope)` off the rate per this much time.
const GRADIENT_ROUND_NS: Nanos = 1_000_000;
/// Weight of a new RTT sample in the smoothed RTT (RFC 6298's 1/8).
const SRTT_GAIN: f64 = 0.125;
/// A smoothed loss fraction at or over this is congestion whatever the delay shows: it
/// lowers the rate and ends slow start and the hyper-increase (random loss of a few
/// percent, even 10 %, does not).
const HEAVY_LOSS: f64 = 0.2;
/// Weight of each newly expected datagram in the smoothed loss (about the last 64 count).
const LOSS_GAIN: f64 = 1.0 / 64.0;
/// The least share of a round trip a lossy feedback is counted for (so that any loss lowers
/// the rate, however soon after the previous feedback it comes).
const MIN_LOSS_COVERAGE: f64 = 1.0 / 64.0;

/// Settings of a datagram flow's rate controller.
///
/// The defaults suit networks of 10 Mbit/s to 10 Gbit/s with round trips of tens of
/// microseconds to a few milliseconds (a cluster, a testbed of namespaces).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateConfig {
    /// Rate a new flow starts at (default 20 Mbit/s: a fifth of a 100 Mbit/s bottleneck, so
    /// four workers starting together do not overflow it; slow start finds more within a
    /// few round trips).
    pub initial_bps: f64,
    /// The least rate (default 1 Mbit/s: a 1.4 KB datagram every 11 ms at worst, so a flow
    /// behind a congested or silent path still trickles and learns when it recovers).
    pub min_bps: f64,
    /// The most rate (default 40 Gbit/s: above any NIC this runs on; only the network's
    /// own signals limit the rate).
    pub max_bps: f64,
    /// Additive growth per millisecond without congestion (default 2 Mbit/s: a flow
    /// recovers a quarter of 100 Mbit/s in about 10 ms, and growth speeds up to
    /// [`MAX_HYPER_INCREASE`] times when no decrease comes, for fast links).
    pub additive_bps: f64,
    /// Multiplicative decrease: the most a delay signal or a round trip of total loss takes
    /// off the rate (default 0.5: halving, what AIMD's fairness rests on).
    pub beta: f64,
    /// Queueing delay under which the rate grows (default 200 us: a few datagrams queued at
    /// 100 Mbit/s, so a flow keeps the bottleneck busy without a standing queue).
    pub t_low_ns: u64,
    /// Queueing delay over which the rate decreases (default 2 ms: a shallow switch buffer's
    /// worth at 100 Mbit/s; below it only a rising delay decreases).
    pub t_high_ns: u64,
    /// The least time without feedback, while datagrams are outstanding, that halves the
    /// rate (default 20 ms: the receiver answers within 1 ms, so this is a loop stalled by
    /// work or a path that lost everything, not a slow answer).
    pub feedback_timeout_floor_ns: u64,
    /// The least bytes an idle flow may send back to back (default 5,600: four 1.4 KB
    /// datagrams); the bucket holds [`BURST_TIME_NS`] of the current rate when that is more
    /// (25 KB at 100 Mbit/s: within a 32-packet switch buffer).
    pub burst_bytes: u64,
}

impl Default for RateConfig {
    fn default() -> Self {
        Self {
            initial_bps: 20e6,
            min_bps: 1e6,
            max_bps: 40e9,
            additive_bps: 1e6,
            beta: 0.5,
            t_low_ns: 200_000,
            t_high_ns: 2_000_000,
            feedback_timeout_floor_ns: 20_000_000,
            burst_bytes: 5_600,
        }
    }
}

impl RateConfig {
    /// Checks the settings: rates finite and positive with `min <= initial <= max`, the
    /// additive growth finite and positive, `beta` in `(0, 1]`, `0 < t_low < t_high`, a
    /// positive timeout floor and burst.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, x: f64| {
            if x.is_finite() && x > 0.0 {
                Ok(())
            } else {
                Err(format!("rate {name} must be finite and positive, got {x}"))
            }
        };
        positive("initial_bps", self.initial_bps)?;
        positive("min_bps", self.min_bps)?;
        positive("max_bps", self.max_bps)?;
        positive("additive_bps", self.additive_bps)?;
        if !(self.min_bps <= self.initial_bps && self.initial_bps <= self.max_bps) {
            return Err(format!(
                "rate needs min_bps <= initial_bps <= max_bps, got {} <= {} <= {}",
                self.min_bps, self.initial_bps, self.max_bps
            ));
        }
        if !(self.beta > 0.0 && self.beta <= 1.0) {
            return Err(format!("rate beta must be in (0, 1], got {}", self.beta));
        }
        if !(self.t_low_ns > 0 && self.t_low_ns < self.t_high_ns) {
            return Err(format!(
                "rate needs 0 < t_low_ns < t_high_ns, got {} and {}",
                self.t_low_ns, self.t_high_ns
            ));
        }
        if self.feedback_timeout_floor_ns == 0 {
            return Err("rate feedback_timeout_floor_ns must be positive".into());
        }
        if self.burst_bytes == 0 {
            return Err("rate burst_bytes must be positive".into());
        }
        Ok(())
    }

    /// The settings made safe to run with: what [`RateConfig::validate`] refuses is
    /// replaced by the default's value (the controller never trusts its settings blindly).
    fn sanitised(self) -> Self {
        if self.validate().is_ok() {
            return self;
        }
        let d = Self::default();
        let positive = |x: f64, or: f64| if x.is_finite() && x > 0.0 { x } else { or };
        let min_bps = positive(self.min_bps, d.min_bps);
        let max_bps = positive(self.max_bps, d.max_bps).max(min_bps);
        let (t_low_ns, t_high_ns) = if self.t_low_ns > 0 && self.t_low_ns < self.t_high_ns {
            (self.t_low_ns, self.t_high_ns)
        } else {
            (d.t_low_ns, d.t_high_ns)
        };
        Self {
            initial_bps: positive(self.initial_bps, d.initial_bps).clamp(min_bps, max_bps),
            min_bps,
            max_bps,
            additive_bps: positive(self.additive_bps, d.additive_bps),
            beta: if self.beta > 0.0 && self.beta <= 1.0 {
                self.beta
            } else {
                d.beta
            },
            t_low_ns,
            t_high_ns,
            feedback_timeout_floor_ns: self.feedback_timeout_floor_ns.max(1),
            burst_bytes: self.burst_bytes.max(1),
        }
    }
}

/// One transport feedback as the sender sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSignal {
    /// Round-trip time sample (ns): the feedback's arrival less the echoed send time of the
    /// receiver's latest datagram and the time the receiver held it, on the sender's clock.
    pub rtt_ns: u64,
    /// The one-way delay of that datagram: its arrival on the receiver's clock less its
    /// stamp on the sender's, an unknown offset between the clocks included (only its
    /// changes mean anything). The queueing delay is measured on it, so that a queue on
    /// the reverse path, which other traffic fills, does not slow this flow; `None` where
    /// the driver cannot tell, and the round trip stands in.
    pub forward_ns: Option<i64>,
    /// Whether the echoed datagram was full-size. Its delay holds its own serialisation at
    /// the bottleneck, so the delay of a smaller one (a control datagram, a key's last
    /// packet) lies under the base of full-size ones: taken as the base, it would read a
    /// queue into every full-size datagram on a slow path (580 us of a 1.4 KB datagram at
    /// 20 Mbit/s), and the rate could never grow. Its delay is not sampled.
    pub full_size: bool,
    /// Datagrams the receiver got so far (cumulative).
    pub received: u64,
    /// The highest datagram sequence number the receiver saw.
    pub highest_seq: u64,
}

/// What a controller measured and did, for the run summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RateStats {
    /// The current rate (bit/s).
    pub rate_bps: f64,
    /// Smoothed RTT (ns; 0 before the first sample).
    pub srtt_ns: u64,
    /// The least RTT seen (ns; 0 before the first sample).
    pub min_rtt_ns: u64,
    /// The loss fraction the last accepted feedback measured.
    pub last_loss: f64,
    /// Feedbacks accepted.
    pub feedbacks: u64,
    /// Feedbacks ignored as stale or duplicated (counts going backwards or not moving).
    pub stale_feedbacks: u64,
    /// Decreases because the queueing delay passed `t_high`.
    pub delay_decreases: u64,
    /// Decreases because the RTT rose between `t_low` and `t_high`.
    pub gradient_decreases: u64,
    /// Decreases because datagrams were lost.
    pub loss_decreases: u64,
    /// Feedbacks whose loss was taken as random (no queue, the smoothed loss light): the
    /// rate did not fall for them.
    #[serde(default)]
    pub random_losses: u64,
    /// Feedback timeouts that halved the rate.
    pub timeouts: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Whether the flow is still in slow start.
    pub slow_start: bool,
}

/// The token bucket that paces datagrams: up to `burst_bytes` of tokens, refilled at the
/// rate; a datagram may leave once the bucket holds as many tokens as the latest datagram
/// took (or `burst_bytes`, if less), and takes its bytes out.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pacer {
    /// Tokens (bytes) at `updated_at`; negative: debt (a datagram sent before its time).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    updated_at: Nanos,
    /// When the latest datagram left and its size: the never-stall bound's origin.
    last_sent: Option<(Nanos, u64)>,
    /// Whether datagrams leave back to back (from a full bucket, or since the bucket held a
    /// quantum) until it runs dry; if not, the next waits for a quantum.
    batching: bool,
}

/// Tokens (bytes) that count as there though float rounding left them just short.
const TOKEN_TOLERANCE: f64 = 1e-6;

impl Pacer {
    /// A full bucket.
    fn new(burst_bytes: u64) -> Self {
        Self {
            tokens: burst_bytes as f64,
            updated_at: 0,
            last_sent: None,
            batching: true,
        }
    }

    /// Brings the tokens up to `now` at `rate_bps` (call before the rate changes).
    fn settle(&mut self, now: Nanos, rate_bps: f64, burst_bytes: u64) {
        let elapsed = now.saturating_sub(self.updated_at) as f64;
        let refill = elapsed * rate_bps / (8.0 * NS_PER_S);
        self.tokens = (self.tokens + refill).min(burst_bytes as f64);
        self.updated_at = self.updated_at.max(now);
    }

    /// A datagram of `bytes` left at `now` (a debt of more than its own size is forgiven).
    fn take(&mut self, now: Nanos, bytes: u64, rate_bps: f64, burst_bytes: u64) {
        self.settle(now, rate_bps, burst_bytes);
        let size = bytes as f64;
        self.tokens = (self.tokens - size).max(-size);
        self.last_sent = Some((self.updated_at, bytes));
        // The batch goes on while the bucket holds another datagram like this one.
        self.batching = self.tokens + TOKEN_TOLERANCE >= size.min(burst_bytes as f64);
    }

    /// The tokens the next datagram needs: what the latest one took, at most a burst.
    fn needed(&self, burst_bytes: u64) -> f64 {
        self.last_sent
            .map_or(0.0, |(_, bytes)| bytes.min(burst_bytes) as f64)
    }

    /// The tokens the next datagram waits for: what the latest one took (at most a burst),
    /// and, unless a batch is going on, at least `quantum` bytes (at most a burst).
    fn wanted(&self, burst_bytes: u64, quantum: f64) -> f64 {
        let needed = self.needed(burst_bytes);
        if self.batching {
            needed
        } else {
            needed.max(quantum.min(burst_bytes as f64))
        }
    }

    /// When the bucket next holds what the next datagram waits for ([`Pacer::wanted`]) at
    /// `rate_bps`; never later than the never-stall bound: the latest datagram's time plus
    /// its bytes at `min_bps`, plus 1 ns.
    fn next_at(&self, rate_bps: f64, min_bps: f64, burst_bytes: u64, quantum: f64) -> Nanos {
        let short = self.wanted(burst_bytes, quantum) - self.tokens;
        let at = if short <= TOKEN_TOLERANCE {
            self.updated_at
        } else {
            self.updated_at
                .saturating_add(ns_for_bytes(short, rate_bps).saturating_add(1))
        };
        match self.last_sent {
            Some((sent_at, bytes)) => {
                let bound = sent_at
                    .saturating_add(ns_for_bytes(bytes as f64, min_bps))
                    .saturating_add(1);
                at.min(bound)
            }
            None => at,
        }
    }

    /// Whether a datagram may leave with the tokens of the bucket's latest update.
    fn ready(&self, burst_bytes: u64, quantum: f64) -> bool {
        self.wanted(burst_bytes, quantum) - self.tokens <= TOKEN_TOLERANCE
    }
}

/// Whole nanoseconds (rounded down) that `bytes` take at `rate_bps`, saturating.
fn ns_for_bytes(bytes: f64, rate_bps: f64) -> Nanos {
    let ns = bytes * 8.0 * NS_PER_S / rate_bps;
    if ns.is_nan() || ns <= 0.0 {
        0
    } else {
        // `as` saturates at u64::MAX.
        ns as u64
    }
}

/// The round-trip time as the feedbacks measure it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct RttEstimate {
    /// Smoothed RTT (ns), 0 before the first sample.
    srtt: f64,
    /// The least sample (ns), `u64::MAX` before the first.
    min: Nanos,
}

impl RttEstimate {
    /// No sample yet.
    fn new() -> Self {
        Self {
            min: Nanos::MAX,
            ..Self::default()
        }
    }

    /// Takes a sample (at least 1 ns).
    fn sample(&mut self, rtt: Nanos) {
        let rtt = rtt.max(1);
        let x = rtt as f64;
        if self.min == Nanos::MAX {
            self.srtt = x;
        } else {
            self.srtt += SRTT_GAIN * (x - self.srtt);
        }
        self.min = self.min.min(rtt);
    }

    /// The smoothed RTT in whole ns (0 before the first sample).
    fn srtt_ns(&self) -> Nanos {
        self.srtt as u64
    }
}

/// The receiver's counts at the latest accepted feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Acknowledged {
    /// When it arrived.
    at: Nanos,
    /// Its cumulative received count.
    received: u64,
    /// Its highest sequence number.
    highest_seq: u64,
}

/// What one feedback says beyond its RTT sample.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Interval {
    /// Nanoseconds it covers (since the previous feedback or the first datagram).
    elapsed: Nanos,
    /// Fraction of the newly expected datagrams (sequence numbers the receiver moved
    /// past) that did not arrive, in `[0, 1]`.
    loss: f64,
    /// How many datagrams were newly expected.
    expected: u64,
}

/// The rate controller and pacer of one direction of a datagram flow (see the module
/// docs for the algorithm).
#[derive(Debug, Clone)]
pub struct RateController {
    config: RateConfig,
    rate_bps: f64,
    slow_start: bool,
    pacer: Pacer,
    rtt: RttEstimate,
    /// The queueing delay, on the forward path where the signals say it.
    queue: QueueDelay,
    /// The queueing delay of the latest full-size sample (what a feedback without one
    /// goes by).
    queueing: Nanos,
    /// The loss fraction smoothed over the newly expected datagrams ([`LOSS_GAIN`] each).
    smoothed_loss: f64,
    acknowledged: Option<Acknowledged>,
    /// The first sequence number sent (the first feedback's loss counts from it).
    first_seq: Option<u64>,
    /// When the first datagram left (the first feedback's interval starts there).
    first_sent_at: Option<Nanos>,
    /// Bytes sent since the latest feedback (whether the flow used its rate).
    bytes_since_feedback: u64,
    /// Smoothed datagram size (bytes), for how many datagrams a round trip holds.
    datagram_bytes: f64,
    /// When the oldest datagram still waiting for a feedback left (the timeout's origin).
    waiting_since: Option<Nanos>,
    /// When the latest decrease for a queue over `t_high` happened.
    last_delay_decrease: Option<Nanos>,
    /// When growth last restarted (a decrease of any kind): hyper-increase counts from it.
    growth_since: Nanos,
    stats: RateStats,
}

impl RateController {
    /// A controller at `config.initial_bps`, in slow start, with a full bucket. Settings
    /// that [`RateConfig::validate`] refuses are replaced by the defaults' values.
    pub fn new(config: RateConfig) -> Self {
        let config = config.sanitised();
        Self {
            config,
            rate_bps: config.initial_bps,
            slow_start: true,
            pacer: Pacer::new(config.burst_bytes),
            rtt: RttEstimate::new(),
            queue: QueueDelay::new(),
            queueing: 0,
            smoothed_loss: 0.0,
            acknowledged: None,
            first_seq: None,
            first_sent_at: None,
            bytes_since_feedback: 0,
            datagram_bytes: 0.0,
            waiting_since: None,
            last_delay_decrease: None,
            growth_since: 0,
            stats: RateStats::default(),
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &RateConfig {
        &self.config
    }

    /// The current sending rate (bit/s): finite, within `[min_bps, max_bps]`.
    pub fn rate_bps(&self) -> f64 {
        self.rate_bps
    }

    /// The bucket's size now: `burst_bytes`, or [`BURST_TIME_NS`] at the current rate if
    /// more.
    fn burst(&self) -> u64 {
        let of_rate = self.rate_bps * BURST_TIME_NS as f64 / (8.0 * NS_PER_S);
        // `as` saturates; the rate is finite and positive.
        self.config.burst_bytes.max(of_rate as u64)
    }

    /// The earliest time the next datagram may leave (pacing: a token bucket of
    /// [`RateController::burst`] refilled at the rate); at or before `now_ns` means now.
    /// Once the bucket is empty, that is when it holds [`PACING_QUANTUM_NS`] of the rate
    /// (or one datagram, if more), so datagrams leave in batches a wake-up each. Never later
    /// than the latest datagram's time plus its bytes at `min_bps` (plus 1 ns).
    pub fn next_send_at(&self, now_ns: u64) -> u64 {
        let burst = self.burst();
        let quantum = self.rate_bps * PACING_QUANTUM_NS as f64 / (8.0 * NS_PER_S);
        let at = (self.pacer).next_at(self.rate_bps, self.config.min_bps, burst, quantum);
        if self.pacer.ready(burst, quantum) {
            at.min(now_ns)
        } else {
            at
        }
    }

    /// A datagram of `bytes` (whole IP packet bytes) with sequence number `seq` left at
    /// `now_ns`.
    pub fn on_sent(&mut self, now_ns: u64, bytes: u64, seq: u64) {
        self.pacer.take(now_ns, bytes, self.rate_bps, self.burst());
        self.first_seq.get_or_insert(seq);
        self.first_sent_at.get_or_insert(now_ns);
        self.waiting_since.get_or_insert(now_ns);
        self.bytes_since_feedback = self.bytes_since_feedback.saturating_add(bytes);
        let size = bytes as f64;
        self.datagram_bytes = if self.stats.datagrams_sent == 0 {
            size
        } else {
            self.datagram_bytes + 0.125 * (size - self.datagram_bytes)
        };
        self.stats.datagrams_sent = self.stats.datagrams_sent.saturating_add(1);
    }

    /// A feedback arrived at `now_ns`: adjust the rate (delay, gradient, loss). Stale or
    /// duplicated signals (`highest_seq` or `received` going backwards, or neither
    /// moving) are ignored.
    pub fn on_feedback(&mut self, now_ns: u64, signal: RateSignal) {
        let Some(interval) = self.accept(now_ns, signal) else {
            self.stats.stale_feedbacks = self.stats.stale_feedbacks.saturating_add(1);
            return;
        };
        self.rtt.sample(signal.rtt_ns);
        let queueing = self.sample_delay(now_ns, signal);
        self.pacer.settle(now_ns, self.rate_bps, self.burst());
        let decreased = match queueing {
            Some(queueing) => self.react_to_delay(now_ns, queueing, interval.elapsed),
            None => self.queueing > self.config.t_low_ns,
        };
        self.smooth_loss(interval);
        let congested = interval.loss > 0.0
            && (self.queueing > self.config.t_low_ns || self.smoothed_loss >= HEAVY_LOSS);
        if congested {
            self.react_to_loss(now_ns, interval);
        } else if !decreased && self.used_its_rate(interval.elapsed) {
            self.grow(now_ns, interval.elapsed);
        }
        if interval.loss > 0.0 && !congested {
            self.stats.random_losses = self.stats.random_losses.saturating_add(1);
        }
        self.bytes_since_feedback = 0;
        self.waiting_since = None;
        self.stats.last_loss = interval.loss;
        self.stats.feedbacks = self.stats.feedbacks.saturating_add(1);
    }

    /// When the feedback timeout fires: `max(4 x smoothed RTT, floor)` after the oldest
    /// datagram sent since the latest feedback (or timeout); `None` while nothing is
    /// outstanding.
    pub fn poll_timeout(&self) -> Option<u64> {
        let since = self.waiting_since?;
        let four_rtt = self.rtt.srtt_ns().saturating_mul(4);
        Some(since.saturating_add(four_rtt.max(self.config.feedback_timeout_floor_ns)))
    }

    /// The time from [`RateController::poll_timeout`] has come: halve the rate (never
    /// below `min_bps`). Spurious calls (early, repeated, nothing outstanding) do nothing.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        match self.poll_timeout() {
            Some(at) if now_ns >= at => {}
            _ => return,
        }
        self.pacer.settle(now_ns, self.rate_bps, self.burst());
        self.set_rate(self.rate_bps * 0.5);
        self.slow_start = false;
        self.growth_since = now_ns;
        self.waiting_since = None;
        self.stats.timeouts = self.stats.timeouts.saturating_add(1);
    }

    /// Smoothed RTT, min RTT, the last loss fraction and the counters.
    pub fn stats(&self) -> RateStats {
        RateStats {
            rate_bps: self.rate_bps,
            srtt_ns: self.rtt.srtt_ns(),
            min_rtt_ns: if self.rtt.min == Nanos::MAX {
                0
            } else {
                self.rtt.min
            },
            slow_start: self.slow_start,
            ..self.stats
        }
    }

    /// Checks `signal` against the latest accepted feedback and, if it brings news,
    /// records it and says what interval it covers; `None` for a stale or duplicate one.
    fn accept(&mut self, now: Nanos, signal: RateSignal) -> Option<Interval> {
        let (expected, got, start) = match self.acknowledged {
            Some(previous) => {
                let backwards = signal.highest_seq < previous.highest_seq
                    || signal.received < previous.received;
                let still = signal.highest_seq == previous.highest_seq
                    && signal.received == previous.received;
                if backwards || still {
                    return None;
                }
                (
                    signal.highest_seq - previous.highest_seq,
                    signal.received - previous.received,
                    previous.at,
                )
            }
            None => {
                // Sequence numbers from the first one sent up to the highest seen.
                let expected = match self.first_seq {
                    Some(first) if signal.highest_seq >= first => {
                        (signal.highest_seq - first).saturating_add(1)
                    }
                    _ => 0,
                };
                (expected, signal.received, self.first_sent_at.unwrap_or(now))
            }
        };
        self.acknowledged = Some(Acknowledged {
            at: now.max(start),
            received: signal.received,
            highest_seq: signal.highest_seq,
        });
        let loss = if expected == 0 || got >= expected {
            0.0
        } else {
            1.0 - got as f64 / expected as f64
        };
        Some(Interval {
            elapsed: now.saturating_sub(start),
            loss,
            expected,
        })
    }

    /// The queueing delay `signal` shows at `now` (`None` for a datagram not full-size,
    /// whose delay is not sampled).
    fn sample_delay(&mut self, now: Nanos, signal: RateSignal) -> Option<Nanos> {
        if !signal.full_size {
            return None;
        }
        let delay = (signal.forward_ns)
            .unwrap_or_else(|| i64::try_from(signal.rtt_ns.max(1)).unwrap_or(i64::MAX));
        self.queueing = self.queue.sample(delay, now);
        Some(self.queueing)
    }

    /// The delay signal of `queueing` at `now`, on a feedback covering `elapsed` ns: a
    /// decrease over `t_high` (at most once per [`DELAY_HOLD_NS`] or smoothed RTT,
    /// whichever is longer), or a decrease as the delay rises between `t_low` and
    /// `t_high`. Whether the rate must not grow on this feedback (queueing over `t_low`).
    fn react_to_delay(&mut self, now: Nanos, queueing: Nanos, elapsed: Nanos) -> bool {
        if queueing <= self.config.t_low_ns {
            return false;
        }
        let beta = self.config.beta;
        if queueing > self.config.t_high_ns {
            let hold = self.rtt.srtt_ns().max(DELAY_HOLD_NS);
            let held = (self.last_delay_decrease).is_some_and(|at| now.saturating_sub(at) < hold);
            if !held {
                // From 1 - beta/2 just over t_high towards 1 - beta for a long queue.
                let q = queueing as f64;
                self.decrease(now, 1.0 - beta * q / (q + self.config.t_high_ns as f64));
                self.last_delay_decrease = Some(now);
                self.stats.delay_decreases = self.stats.delay_decreases.saturating_add(1);
            }
            return true;
        }
        // The queue grows at `slope` times the bottleneck's rate: every flow sharing it
        // takes off the same fraction per unit of time, which brings the sum back to the
        // rate whatever each flow's RTT.
        let slope = self.queue.slope();
        if slope.is_nan() || slope <= 0.0 {
            return true;
        }
        let rounds = (elapsed as f64 / GRADIENT_ROUND_NS as f64).min(1.0);
        let factor = (1.0 + slope).powf(-rounds).max(1.0 - beta);
        self.decrease(now, factor);
        self.stats.gradient_decreases = self.stats.gradient_decreases.saturating_add(1);
        true
    }

    /// A delay decrease by `factor` at `now`: slow start ends, growth starts over.
    fn decrease(&mut self, now: Nanos, factor: f64) {
        self.set_rate(self.rate_bps * factor);
        self.slow_start = false;
        self.growth_since = now;
    }

    /// Folds `interval`'s loss into the smoothed loss, each newly expected datagram
    /// weighing [`LOSS_GAIN`] (a feedback of two datagrams moves it little, whatever
    /// fraction of them it lost).
    fn smooth_loss(&mut self, interval: Interval) {
        let datagrams = i32::try_from(interval.expected).unwrap_or(i32::MAX);
        let weight = 1.0 - (1.0 - LOSS_GAIN).powi(datagrams);
        self.smoothed_loss += weight * (interval.loss - self.smoothed_loss);
    }

    /// The loss signal of a congested path: lower the rate by `beta x loss x` the share of
    /// a round trip (at least [`ADDITIVE_ROUND_NS`]) the feedback covers, counted at least
    /// [`MIN_LOSS_COVERAGE`] so that any such loss lowers it. Heavy smoothed loss also ends
    /// slow start and the hyper-increase.
    fn react_to_loss(&mut self, now: Nanos, interval: Interval) {
        let round = self.rtt.srtt.max(ADDITIVE_ROUND_NS as f64);
        let coverage = (interval.elapsed as f64 / round).clamp(MIN_LOSS_COVERAGE, 1.0);
        let coverage = if coverage.is_nan() {
            MIN_LOSS_COVERAGE
        } else {
            coverage
        };
        self.set_rate(self.rate_bps * (1.0 - self.config.beta * interval.loss * coverage));
        self.stats.loss_decreases = self.stats.loss_decreases.saturating_add(1);
        if self.smoothed_loss >= HEAVY_LOSS {
            self.slow_start = false;
            self.growth_since = now;
        }
    }

    /// Whether the flow sent at least half of what its rate allowed over `elapsed` ns (a
    /// flow that sends less learns nothing about a higher rate).
    fn used_its_rate(&self, elapsed: Nanos) -> bool {
        let allowed_bits = self.rate_bps * elapsed as f64 / NS_PER_S;
        (self.bytes_since_feedback as f64) * 8.0 >= 0.5 * allowed_bits
    }

    /// Growth over a feedback covering `elapsed` ns (at most one smoothed RTT, or one
    /// millisecond, counts): doubling per RTT in slow start, else additive, sped up by
    /// the time since the latest decrease.
    fn grow(&mut self, now: Nanos, elapsed: Nanos) {
        let srtt = self.rtt.srtt.max(1.0);
        if self.slow_start {
            let rounds = (elapsed as f64 / srtt).min(1.0);
            self.set_rate(self.rate_bps * rounds.exp2());
            return;
        }
        // A feedback after a long silence (a path whose feedback the queue or loss holds
        // up) counts for no more than MAX_GROWTH_NS: the rate grows only while the
        // controller hears how the path takes it.
        let counted = elapsed.min(self.rtt.srtt_ns().clamp(ADDITIVE_ROUND_NS, MAX_GROWTH_NS));
        let rounds = counted as f64 / ADDITIVE_ROUND_NS as f64;
        // Calm is counted in round trips (at least HYPER_STEP_NS each): a path whose round
        // trip is long learns of its growth late, so it speeds up as late.
        let hyper_step = self.rtt.srtt_ns().max(HYPER_STEP_NS);
        let calm = now.saturating_sub(self.growth_since) / hyper_step;
        let speed = (1.0 + calm as f64).min(MAX_HYPER_INCREASE);
        self.set_rate(self.rate_bps + self.config.additive_bps * rounds * speed);
    }

    /// Sets the rate, clamped to `[min_bps, max_bps]` (a NaN keeps the least rate).
    fn set_rate(&mut self, rate_bps: f64) {
        let (min, max) = (self.config.min_bps, self.config.max_bps);
        self.rate_bps = if rate_bps.is_nan() {
            min
        } else {
            rate_bps.clamp(min, max)
        };
    }
}

#[cfg(test)]
mod fluid_tests;
#[cfg(test)]
mod tests;
