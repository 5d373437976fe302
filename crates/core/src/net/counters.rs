//! What a port counts: frames and bytes sent, lost, retransmitted and dropped, and the
//! queueing delay, in total and per flow.

use serde::{Deserialize, Serialize};

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
    }

    /// Counts a loss found by `recovery`.
    pub(crate) fn recovered(&mut self, recovery: super::Recovery) {
        match recovery {
            super::Recovery::Sack => {}
            super::Recovery::LossProbe { .. } => {
                self.loss_probes = self.loss_probes.saturating_add(1)
            }
            super::Recovery::Timeout => self.timeouts = self.timeouts.saturating_add(1),
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
        if self.frames_sent == 0 {
            0.0
        } else {
            self.queueing_ns_total as f64 / self.frames_sent as f64
        }
    }
}
