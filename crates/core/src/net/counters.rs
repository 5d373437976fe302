//! What a port counts: frames and bytes sent, lost, retransmitted and dropped, and the
//! queueing delay, in total and per flow.

use serde::{Deserialize, Serialize};

use super::tcp::TimeoutCause;
use super::Nanos;

/// Counters of a port (or of one flow through it, or a sum of several). The fields every
/// transmission updates come first, so that they share a cache line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[repr(C)]
pub struct NetCounters {
    /// Transmissions serialised (retransmissions included).
    pub frames_sent: u64,
    /// Bytes serialised (retransmissions included).
    pub bytes_sent: u64,
    /// Sum over transmissions of the time waited in the queue before serialising.
    pub queueing_ns_total: u64,
    /// The longest such wait.
    pub queueing_ns_max: Nanos,
    /// Frames lost on a path (random loss).
    pub frames_lost: u64,
    /// Bytes lost on a path.
    pub bytes_lost: u64,
    /// Retransmissions of reliable frames (after a loss or a drop).
    pub frames_retransmitted: u64,
    /// Bytes retransmitted.
    pub bytes_retransmitted: u64,
    /// Frames dropped by a full queue (or past the drop threshold, when drop-eligible).
    pub frames_dropped: u64,
    /// Bytes dropped by a queue.
    pub bytes_dropped: u64,
    /// Losses of reliable frames found by the tail loss probe.
    #[serde(default)]
    pub loss_probes: u64,
    /// Losses of reliable frames found by the retransmission timeout.
    #[serde(default)]
    pub timeouts: u64,
    /// Loss episodes of reliable flows found by SACK or the probe, each a window's losses
    /// repaired together: the kernel's `TcpExtTCPSackRecovery`.
    #[serde(default)]
    pub loss_episodes: u64,
    /// Reliable frames offered to their flow's congestion window (cubic and Reno at an
    /// egress port; the model's BBR has no window), and how many it held back.
    #[serde(default)]
    pub window_offers: u64,
    /// Of those, the frames the window held back (the flow was window-limited).
    #[serde(default)]
    pub window_held: u64,
    /// The flow's congestion window at each offer, segments: their sum and the largest.
    #[serde(default)]
    pub cwnd_segments_total: u64,
    /// The largest congestion window at an offer, segments.
    #[serde(default)]
    pub cwnd_segments_max: u64,
    /// The flow's smoothed round trip at each offer: their sum, ns.
    #[serde(default)]
    pub srtt_ns_total: u64,
    /// The longest smoothed round trip at an offer.
    #[serde(default)]
    pub srtt_ns_max: Nanos,
    /// The most bytes a reliable flow's socket held back for its congestion window at once
    /// (at most the send window and one frame: a driver offers nothing to a full socket).
    #[serde(default)]
    pub socket_bytes_max: u64,
    /// The timeouts by why nothing found their losses sooner.
    #[serde(default)]
    pub timeout_causes: TimeoutCauses,
}

/// Timeouts of reliable frames by [`TimeoutCause`]: the model's side of what
/// `scripts/tcp_waits.py` reads from a kernel capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutCauses {
    /// A resend lost with nothing of its flow after it.
    pub resend_last: u64,
    /// A resend lost where its window (or an outage) let nothing new follow it.
    pub resend_stalled: u64,
    /// An original lost with nothing after it while its flow recovered an earlier loss.
    pub original_in_recovery: u64,
    /// A full window's acknowledgements lost while its flow recovered.
    pub acks_in_recovery: u64,
}

impl TimeoutCauses {
    /// Counts one timeout of `cause`.
    fn count(&mut self, cause: TimeoutCause) {
        let n = match cause {
            TimeoutCause::ResendLast => &mut self.resend_last,
            TimeoutCause::ResendStalled => &mut self.resend_stalled,
            TimeoutCause::OriginalInRecovery => &mut self.original_in_recovery,
            TimeoutCause::AcksInRecovery => &mut self.acks_in_recovery,
        };
        *n = n.saturating_add(1);
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &TimeoutCauses) {
        self.resend_last = self.resend_last.saturating_add(other.resend_last);
        self.resend_stalled = self.resend_stalled.saturating_add(other.resend_stalled);
        self.original_in_recovery =
            (self.original_in_recovery).saturating_add(other.original_in_recovery);
        self.acks_in_recovery = self.acks_in_recovery.saturating_add(other.acks_in_recovery);
    }

    /// The timeouts of every cause.
    pub fn total(&self) -> u64 {
        (self.resend_last)
            .saturating_add(self.resend_stalled)
            .saturating_add(self.original_in_recovery)
            .saturating_add(self.acks_in_recovery)
    }

    /// Whether no timeout was counted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl NetCounters {
    /// Adds `other` into `self` (sums, and the larger maximum).
    pub fn add(&mut self, other: &NetCounters) {
        self.frames_sent = self.frames_sent.saturating_add(other.frames_sent);
        self.bytes_sent = self.bytes_sent.saturating_add(other.bytes_sent);
        self.frames_lost = self.frames_lost.saturating_add(other.frames_lost);
        self.bytes_lost = self.bytes_lost.saturating_add(other.bytes_lost);
        self.frames_retransmitted =
            (self.frames_retransmitted).saturating_add(other.frames_retransmitted);
        self.bytes_retransmitted =
            (self.bytes_retransmitted).saturating_add(other.bytes_retransmitted);
        self.frames_dropped = self.frames_dropped.saturating_add(other.frames_dropped);
        self.bytes_dropped = self.bytes_dropped.saturating_add(other.bytes_dropped);
        self.queueing_ns_total = self
            .queueing_ns_total
            .saturating_add(other.queueing_ns_total);
        self.queueing_ns_max = self.queueing_ns_max.max(other.queueing_ns_max);
        self.loss_probes = self.loss_probes.saturating_add(other.loss_probes);
        self.timeouts = self.timeouts.saturating_add(other.timeouts);
        self.loss_episodes = self.loss_episodes.saturating_add(other.loss_episodes);
        self.window_offers = self.window_offers.saturating_add(other.window_offers);
        self.window_held = self.window_held.saturating_add(other.window_held);
        self.cwnd_segments_total =
            (self.cwnd_segments_total).saturating_add(other.cwnd_segments_total);
        self.cwnd_segments_max = self.cwnd_segments_max.max(other.cwnd_segments_max);
        self.srtt_ns_total = self.srtt_ns_total.saturating_add(other.srtt_ns_total);
        self.srtt_ns_max = self.srtt_ns_max.max(other.srtt_ns_max);
        self.socket_bytes_max = self.socket_bytes_max.max(other.socket_bytes_max);
        self.timeout_causes.add(&other.timeout_causes);
    }

    /// Counts a reliable frame offered to its flow's window of `cwnd_segments` with a
    /// smoothed round trip of `srtt_ns`; `held`: the window held it back.
    pub(crate) fn offered_to_window(&mut self, cwnd_segments: u64, srtt_ns: Nanos, held: bool) {
        self.window_offers = self.window_offers.saturating_add(1);
        self.window_held = self.window_held.saturating_add(u64::from(held));
        self.cwnd_segments_total = self.cwnd_segments_total.saturating_add(cwnd_segments);
        self.cwnd_segments_max = self.cwnd_segments_max.max(cwnd_segments);
        self.srtt_ns_total = self.srtt_ns_total.saturating_add(srtt_ns);
        self.srtt_ns_max = self.srtt_ns_max.max(srtt_ns);
    }

    /// Mean congestion window over the offers to it, segments (0 without any).
    pub fn mean_cwnd_segments(&self) -> f64 {
        mean(self.cwnd_segments_total, self.window_offers)
    }

    /// Mean smoothed round trip over the offers to a window, ns (0 without any).
    pub fn mean_srtt_ns(&self) -> f64 {
        mean(self.srtt_ns_total, self.window_offers)
    }

    /// The share of offers the window held back (0 without any).
    pub fn window_held_share(&self) -> f64 {
        mean(self.window_held, self.window_offers)
    }

    /// Counts a loss found by `recovery`.
    pub(crate) fn recovered(&mut self, recovery: super::Recovery) {
        match recovery {
            super::Recovery::Sack => {}
            super::Recovery::LossProbe { .. } => {
                self.loss_probes = self.loss_probes.saturating_add(1)
            }
            super::Recovery::Timeout(cause) => {
                self.timeouts = self.timeouts.saturating_add(1);
                self.timeout_causes.count(cause);
            }
        }
    }

    /// Counts one transmission of `bytes` that waited `queued` in the queue.
    pub(crate) fn sent(&mut self, bytes: usize, queued: Nanos) {
        self.frames_sent = self.frames_sent.saturating_add(1);
        self.bytes_sent = self.bytes_sent.saturating_add(bytes as u64);
        self.queueing_ns_total = self.queueing_ns_total.saturating_add(queued);
        self.queueing_ns_max = self.queueing_ns_max.max(queued);
    }

    /// Counts a frame of `bytes` lost on a path.
    pub(crate) fn lost(&mut self, bytes: usize) {
        self.frames_lost = self.frames_lost.saturating_add(1);
        self.bytes_lost = self.bytes_lost.saturating_add(bytes as u64);
    }

    /// Counts a frame of `bytes` dropped by a queue.
    pub(crate) fn dropped(&mut self, bytes: usize) {
        self.frames_dropped = self.frames_dropped.saturating_add(1);
        self.bytes_dropped = self.bytes_dropped.saturating_add(bytes as u64);
    }

    /// Counts a retransmission of `bytes`.
    pub(crate) fn retransmitted(&mut self, bytes: usize) {
        self.frames_retransmitted = self.frames_retransmitted.saturating_add(1);
        self.bytes_retransmitted = self.bytes_retransmitted.saturating_add(bytes as u64);
    }

    /// Mean queueing delay per transmission, nanoseconds (0 when nothing was sent).
    pub fn mean_queueing_ns(&self) -> f64 {
        mean(self.queueing_ns_total, self.frames_sent)
    }
}

/// `total / count`, 0 where nothing was counted.
fn mean(total: u64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        total as f64 / count as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_offers_give_means_that_sum_across_counters() {
        let mut a = NetCounters::default();
        assert_eq!((a.mean_cwnd_segments(), a.window_held_share()), (0.0, 0.0));
        a.offered_to_window(10, 2_000_000, false);
        a.offered_to_window(30, 4_000_000, true);
        let mut b = NetCounters::default();
        b.offered_to_window(2, 9_000_000, true);
        a.add(&b);
        assert_eq!(a.window_offers, 3);
        assert_eq!(a.mean_cwnd_segments(), 14.0);
        assert_eq!(a.mean_srtt_ns(), 5_000_000.0);
        assert!((a.window_held_share() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!((a.cwnd_segments_max, a.srtt_ns_max), (30, 9_000_000));
    }
}
