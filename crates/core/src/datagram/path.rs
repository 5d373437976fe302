//! One path of a datagram link, each direction: the sending side's rate controller, its
//! unsealed batch and the log that maps the link's sequence numbers onto this path's, and
//! the receiving side's feedback for the datagrams that arrive on it.
//!
//! A link numbers its datagrams once, over all its paths (the replay window is the link's),
//! but losses are counted path by path, so that datagrams reordered between two paths of
//! different delays never look lost: the receiver reports, for each path, how many
//! datagrams arrived on it and the highest number among them; the sender turns that number
//! into the path's own count through the log of the numbers it sent on the path.

use std::collections::VecDeque;

use super::batch::Pending;
use super::feedback::FeedbackState;
use crate::net::{RateConfig, RateController, RateSignal};
use crate::wire::datagram::{Feedback, REPLAY_WINDOW_BITS};

/// The most numbers a path's log keeps while no feedback covers them (beyond the replay
/// window, the receiver no longer tells them apart anyway).
const LOG_LIMIT: usize = 4 * REPLAY_WINDOW_BITS as usize;
/// The most batches whose write delay a path keeps while no feedback echoes them (and the
/// most stamps of batches with a small datagram).
const DEPARTURES_LIMIT: usize = 64;
/// A datagram under this share of the largest one sealed on the path is small: its delay
/// is not comparable with full-size ones' ([`RateSignal::full_size`]).
const FULL_SIZE_SHARE: f64 = 0.75;

/// One path of a link.
#[derive(Debug, Clone)]
pub(crate) struct PathState {
    /// Paces and controls what this end sends on the path.
    pub rate: RateController,
    /// Frames the pacer let go on this path, not yet sealed.
    pub batch: Vec<Pending>,
    /// What this end reports about the datagrams arriving on the path.
    pub feedback: FeedbackState,
    /// The link's numbers of the datagrams sealed for this path, from the highest one a
    /// feedback covered on (the first is the path's datagram number `first_index`).
    sent: VecDeque<u64>,
    first_index: u64,
    /// Bytes released onto this path (spraying's last tie-break).
    bytes_sent: u64,
    /// Per batch sealed for this path and written since the oldest one a feedback may
    /// still echo: its send stamp and the time from that stamp to its write.
    departures: VecDeque<(u64, u64)>,
    /// The stamps of the batches sealed for this path that held a small datagram, since the
    /// oldest one a feedback may still echo.
    small_batches: VecDeque<u64>,
    /// The largest datagram sealed for this path so far (bytes).
    largest: u64,
    /// When a frame was last released onto this path.
    last_release_ns: u64,
}

impl PathState {
    /// A path whose controller starts from `rate`.
    pub fn new(rate: RateConfig) -> Self {
        Self {
            rate: RateController::new(rate),
            batch: Vec::new(),
            feedback: FeedbackState::default(),
            sent: VecDeque::new(),
            first_index: 0,
            bytes_sent: 0,
            departures: VecDeque::new(),
            small_batches: VecDeque::new(),
            largest: 0,
            last_release_ns: 0,
        }
    }

    /// The path's number for the next datagram released onto it (the batch's count
    /// included).
    pub fn next_index(&self) -> u64 {
        self.first_index + (self.sent.len() + self.batch.len()) as u64
    }

    /// Bytes released onto this path so far.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// A frame of `ip_bytes` on the wire released at `now_ns` into the batch.
    pub fn release(&mut self, now_ns: u64, ip_bytes: u64, q: Pending) {
        self.rate.on_sent(now_ns, ip_bytes, self.next_index());
        self.bytes_sent = self.bytes_sent.saturating_add(ip_bytes);
        self.last_release_ns = now_ns;
        self.batch.push(q);
    }

    /// The round trip a datagram released at `now_ns` may expect (ns; 0 before the first
    /// sample): the smoothed one, less the time the path has been idle since its last
    /// release, down to the least one seen. What queued behind this end's datagrams drains
    /// while the path is idle, so a path left for its queue is not left for good.
    pub fn expected_rtt_ns(&self, now_ns: u64) -> u64 {
        let stats = self.rate.stats();
        (stats.srtt_ns.saturating_sub(self.idle_ns(now_ns))).max(stats.min_rtt_ns)
    }

    /// How long the path has carried nothing new at `now_ns` (since its last release).
    pub fn idle_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.last_release_ns)
    }

    /// The datagram numbered `seq` by the link was sealed for this path.
    pub fn log_sealed(&mut self, seq: u64) {
        if self.sent.len() >= LOG_LIMIT {
            self.sent.pop_front();
            self.first_index += 1;
        }
        self.sent.push_back(seq);
    }

    /// The batch stamped `stamp` left `delay` ns after it (a later batch of the
    /// same stamp replaces the delay: the receiver echoes the latest datagram it got).
    pub fn log_departure(&mut self, stamp: u64, delay: u64) {
        match self.departures.back_mut() {
            Some(last) if last.0 == stamp => last.1 = delay,
            _ => {
                if self.departures.len() >= DEPARTURES_LIMIT {
                    self.departures.pop_front();
                }
                self.departures.push_back((stamp, delay));
            }
        }
    }

    /// The batch stamped `stamp` was sealed with datagrams of `smallest` to `largest` bytes.
    pub fn log_batch(&mut self, stamp: u64, smallest: u64, largest: u64) {
        self.largest = self.largest.max(largest);
        if (smallest as f64) < FULL_SIZE_SHARE * self.largest as f64
            && self.small_batches.back() != Some(&stamp)
        {
            if self.small_batches.len() >= DEPARTURES_LIMIT {
                self.small_batches.pop_front();
            }
            self.small_batches.push_back(stamp);
        }
    }

    /// Whether the batch stamped `stamp` held full-size datagrams only; older batches are
    /// forgotten (stamps only grow).
    fn full_size(&mut self, stamp: u64) -> bool {
        while self.small_batches.front().is_some_and(|&s| s < stamp) {
            self.small_batches.pop_front();
        }
        self.small_batches.front() != Some(&stamp)
    }

    /// The write delay of the batch stamped `stamp` (0 if unknown); older batches are
    /// forgotten (a feedback echoes the latest datagram, and stamps only grow).
    fn departure_delay(&mut self, stamp: u64) -> u64 {
        while self.departures.front().is_some_and(|&(s, _)| s < stamp) {
            self.departures.pop_front();
        }
        match self.departures.front() {
            Some(&(s, delay)) if s == stamp => delay,
            _ => 0,
        }
    }

    /// A feedback about this path, sealed by the receiver at `sent_ns` on its clock,
    /// arrived at `now_ns`: the rate controller hears it with the highest number turned
    /// into the path's own (a feedback older than the log is dropped), the round trip and
    /// the forward path's one-way delay without the time either end held the datagram.
    pub fn on_feedback(&mut self, now_ns: u64, feedback: &Feedback, sent_ns: u64) {
        let covered = self.sent.partition_point(|&s| s <= feedback.highest_seq);
        let Some(kept) = covered.checked_sub(1) else {
            return;
        };
        self.sent.drain(..kept);
        self.first_index += kept as u64;
        let departed =
            (feedback.echo_sent_ns).saturating_add(self.departure_delay(feedback.echo_sent_ns));
        let rtt_ns = now_ns
            .saturating_sub(departed)
            .saturating_sub(feedback.echo_held_ns);
        // The receiver sealed the feedback when it took it: its arrival, on its clock, is
        // the feedback's stamp less the time held. The two clocks' offset stays in.
        let arrived = sent_ns.wrapping_sub(feedback.echo_held_ns);
        let full_size = self.full_size(feedback.echo_sent_ns);
        let signal = RateSignal {
            rtt_ns,
            forward_ns: Some(arrived.wrapping_sub(departed) as i64),
            full_size,
            received: feedback.received,
            highest_seq: self.first_index,
        };
        self.rate.on_feedback(now_ns, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A feedback echoing the batch stamped `echo_sent_ns`, held for no time.
    fn echo(received: u64, highest_seq: u64, echo_sent_ns: u64) -> Feedback {
        Feedback {
            received,
            highest_seq,
            echo_sent_ns,
            echo_held_ns: 0,
        }
    }

    fn feedback(received: u64, highest_seq: u64) -> Feedback {
        Feedback {
            received,
            highest_seq,
            echo_sent_ns: 0,
            echo_held_ns: 0,
        }
    }

    #[test]
    fn the_links_numbers_map_onto_the_paths_own() {
        let mut p = PathState::new(RateConfig::default());
        // The link numbered 0..20; this path carried the even ones.
        for seq in (0..20).step_by(2) {
            p.log_sealed(seq);
        }
        // Everything up to 9 arrived: the path's datagrams 0..=4, none lost.
        p.on_feedback(1_000_000, &feedback(5, 8), 0);
        assert_eq!(p.rate.stats().last_loss, 0.0);
        assert_eq!(p.first_index, 4);
        // Up to 18 seen, 4 of the path's 5 since: one lost (20 %).
        p.on_feedback(2_000_000, &feedback(9, 18), 0);
        assert!((p.rate.stats().last_loss - 0.2).abs() < 1e-9);
        assert_eq!(p.next_index(), 10);
        // A stale feedback moves nothing.
        p.on_feedback(3_000_000, &feedback(3, 4), 0);
        assert_eq!(p.rate.stats().feedbacks, 2);
    }

    /// On a 20 Mbit/s path a 1.4 KB datagram serialises for 560 us, a 200-byte one for 80:
    /// the small one's delay is not taken, or it would become the base and every full-size
    /// datagram would show a 480 us queue.
    #[test]
    fn a_small_datagrams_delay_does_not_become_the_base() {
        let mut p = PathState::new(RateConfig::default());
        for seq in 0..3 {
            p.log_sealed(seq);
        }
        p.log_batch(1_000_000, 1_400, 1_400);
        p.log_batch(2_000_000, 200, 1_400);
        p.log_batch(3_000_000, 1_400, 1_400);
        // Forward delays (receiver's clock less the stamp): 600, 120 and 600 us.
        p.on_feedback(1_700_000, &echo(1, 0, 1_000_000), 1_600_000);
        p.on_feedback(2_200_000, &echo(2, 1, 2_000_000), 2_120_000);
        p.on_feedback(3_700_000, &echo(3, 2, 3_000_000), 3_600_000);
        assert_eq!(
            p.rate.stats().delay_decreases + p.rate.stats().gradient_decreases,
            0
        );
        assert_eq!(p.rate.stats().feedbacks, 3);
        assert!(p.full_size(3_000_000));
        assert_eq!(p.small_batches.len(), 0, "echoed past: forgotten");
    }

    /// A path left idle for its queue expects it drained: the smoothed round trip less the
    /// time since its last release, never under the least one seen.
    #[test]
    fn an_idle_paths_queue_is_expected_to_drain() {
        let mut p = PathState::new(RateConfig::default());
        assert_eq!(p.expected_rtt_ns(0), 0, "nothing measured yet");
        // Round trips of 1 ms, then 40 ms behind a queue, ten times.
        for seq in 0..11u64 {
            p.log_sealed(seq);
        }
        p.on_feedback(1_000_000, &echo(1, 0, 0), 0);
        for seq in 1..11u64 {
            let sent = seq * 100_000_000;
            p.on_feedback(sent + 40_000_000, &echo(seq + 1, seq, sent), 0);
        }
        let at = 1_000_000_000;
        release_one(&mut p, at);
        let srtt = p.rate.stats().srtt_ns;
        assert!(srtt > 20_000_000, "{srtt}");
        assert_eq!(p.expected_rtt_ns(at), srtt);
        assert_eq!(p.expected_rtt_ns(at + 10_000_000), srtt - 10_000_000);
        assert_eq!(p.expected_rtt_ns(at + srtt), 1_000_000);
    }

    /// Releases an empty frame onto `p` at `now_ns`.
    fn release_one(p: &mut PathState, now_ns: u64) {
        let header = crate::wire::Header::data(crate::wire::FrameKind::Push, 0, 0, 0, 0);
        let q = Pending {
            header,
            payload: Vec::new(),
            path: 0,
        };
        p.release(now_ns, 100, q);
    }

    #[test]
    fn the_log_is_bounded_without_feedback() {
        let mut p = PathState::new(RateConfig::default());
        for seq in 0..(LOG_LIMIT as u64 + 10) {
            p.log_sealed(seq);
        }
        assert_eq!(p.sent.len(), LOG_LIMIT);
        assert_eq!(p.next_index(), LOG_LIMIT as u64 + 10);
    }

    #[test]
    fn the_time_before_a_batchs_write_is_not_a_round_trip() {
        let echo = |received, highest_seq, echo_sent_ns| Feedback {
            received,
            highest_seq,
            echo_sent_ns,
            echo_held_ns: 20_000,
        };
        let mut p = PathState::new(RateConfig::default());
        for seq in 0..32 {
            p.log_sealed(seq);
        }
        // Two batches stamped at 1 ms and 2 ms, written 300 us and 50 us after their stamps.
        p.log_departure(1_000_000, 300_000);
        p.log_departure(2_000_000, 50_000);
        // The first batch's echo: 400 us after its stamp, less 20 us held and 300 us of
        // the sender's own: 80 us.
        p.on_feedback(1_400_000, &echo(16, 15, 1_000_000), 0);
        assert_eq!(p.rate.stats().srtt_ns, 80_000);
        // The second's: its own delay only, and the first is forgotten.
        p.on_feedback(2_150_000, &echo(32, 31, 2_000_000), 0);
        assert_eq!(p.rate.stats().min_rtt_ns, 80_000);
        assert_eq!(p.departures.len(), 1);
        // A stamp of no batch written (a driver that never says): the whole time counts.
        let mut q = PathState::new(RateConfig::default());
        q.log_sealed(0);
        q.on_feedback(1_400_000, &echo(1, 0, 1_000_000), 0);
        assert_eq!(q.rate.stats().srtt_ns, 380_000);
    }

    #[test]
    fn a_batch_written_again_under_its_stamp_keeps_the_later_delay() {
        let mut p = PathState::new(RateConfig::default());
        p.log_departure(5, 10);
        p.log_departure(5, 30);
        for stamp in 6..(DEPARTURES_LIMIT as u64 + 10) {
            p.log_departure(stamp, 1);
        }
        assert_eq!(p.departures.len(), DEPARTURES_LIMIT);
        assert_eq!(p.departure_delay(5), 0, "forgotten beyond the limit");
        let mut q = PathState::new(RateConfig::default());
        q.log_departure(5, 10);
        q.log_departure(5, 30);
        assert_eq!(q.departure_delay(5), 30);
    }
}
