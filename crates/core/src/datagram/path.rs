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
        self.batch.push(q);
    }

    /// The datagram numbered `seq` by the link was sealed for this path.
    pub fn log_sealed(&mut self, seq: u64) {
        if self.sent.len() >= LOG_LIMIT {
            self.sent.pop_front();
            self.first_index += 1;
        }
        self.sent.push_back(seq);
    }

    /// A feedback about this path arrived at `now_ns`: the rate controller hears it with
    /// the highest number turned into the path's own (a feedback older than the log is
    /// dropped).
    pub fn on_feedback(&mut self, now_ns: u64, feedback: &Feedback) {
        let covered = self.sent.partition_point(|&s| s <= feedback.highest_seq);
        let Some(kept) = covered.checked_sub(1) else {
            return;
        };
        self.sent.drain(..kept);
        self.first_index += kept as u64;
        let rtt_ns = now_ns
            .saturating_sub(feedback.echo_sent_ns)
            .saturating_sub(feedback.echo_held_ns);
        let signal = RateSignal {
            rtt_ns,
            received: feedback.received,
            highest_seq: self.first_index,
        };
        self.rate.on_feedback(now_ns, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        p.on_feedback(1_000_000, &feedback(5, 8));
        assert_eq!(p.rate.stats().last_loss, 0.0);
        assert_eq!(p.first_index, 4);
        // Up to 18 seen, 4 of the path's 5 since: one lost (20 %).
        p.on_feedback(2_000_000, &feedback(9, 18));
        assert!((p.rate.stats().last_loss - 0.2).abs() < 1e-9);
        assert_eq!(p.next_index(), 10);
        // A stale feedback moves nothing.
        p.on_feedback(3_000_000, &feedback(3, 4));
        assert_eq!(p.rate.stats().feedbacks, 2);
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
}
