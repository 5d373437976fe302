//! What the receiving side of one direction of a datagram link reports back to its sender,
//! and when: every [`FEEDBACK_EVERY_NS`] or [`FEEDBACK_EVERY_DATAGRAMS`], whichever comes
//! first, while datagrams arrive.

use crate::wire::datagram::Feedback;

/// A receiver sends feedback at least this often while datagrams arrive (1 ms)...
pub const FEEDBACK_EVERY_NS: u64 = 1_000_000;
/// ...and after at most this many datagrams.
pub const FEEDBACK_EVERY_DATAGRAMS: u32 = 16;

/// The receiving side's record of one direction, for its feedback.
#[derive(Debug, Clone, Default)]
pub(crate) struct FeedbackState {
    /// Authentic datagrams received (data and feedback: they share the numbers).
    received: u64,
    highest_seq: u64,
    latest_sent_ns: u64,
    latest_arrival_ns: u64,
    /// Data datagrams received since the last feedback.
    pending: u32,
    last_sent_ns: u64,
}

impl FeedbackState {
    /// An authentic datagram numbered `seq` arrived (data or feedback).
    pub fn on_authentic(&mut self, seq: u64) {
        self.received = self.received.saturating_add(1);
        self.highest_seq = self.highest_seq.max(seq);
    }

    /// A data datagram stamped `sent_ns` by its sender arrived at `now_ns`.
    pub fn on_data(&mut self, sent_ns: u64, now_ns: u64) {
        self.latest_sent_ns = sent_ns;
        self.latest_arrival_ns = now_ns;
        self.pending = self.pending.saturating_add(1);
    }

    /// Whether a feedback is due at `now_ns`.
    pub fn is_due(&self, now_ns: u64) -> bool {
        self.pending >= FEEDBACK_EVERY_DATAGRAMS
            || (self.pending > 0 && now_ns.saturating_sub(self.last_sent_ns) >= FEEDBACK_EVERY_NS)
    }

    /// When the next feedback falls due by time (`None`: no datagram waits for one).
    pub fn due_at(&self) -> Option<u64> {
        (self.pending > 0).then(|| self.last_sent_ns.saturating_add(FEEDBACK_EVERY_NS))
    }

    /// The feedback to send at `now_ns`, counted as sent.
    pub fn take(&mut self, now_ns: u64) -> Feedback {
        self.pending = 0;
        self.last_sent_ns = now_ns;
        Feedback {
            received: self.received,
            highest_seq: self.highest_seq,
            echo_sent_ns: self.latest_sent_ns,
            echo_held_ns: now_ns.saturating_sub(self.latest_arrival_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_falls_due_by_count_or_by_time() {
        let mut f = FeedbackState::default();
        assert!(!f.is_due(u64::MAX), "nothing received, nothing due");
        assert_eq!(f.due_at(), None);
        for seq in 0..u64::from(FEEDBACK_EVERY_DATAGRAMS) - 1 {
            f.on_authentic(seq);
            f.on_data(seq * 10, 100);
        }
        assert!(!f.is_due(100));
        assert_eq!(f.due_at(), Some(FEEDBACK_EVERY_NS));
        assert!(f.is_due(FEEDBACK_EVERY_NS), "by time");
        f.on_authentic(99);
        f.on_data(990, 150);
        assert!(f.is_due(150), "by count");
        let sent = f.take(400);
        assert_eq!(sent.received, u64::from(FEEDBACK_EVERY_DATAGRAMS));
        assert_eq!(
            (sent.highest_seq, sent.echo_sent_ns, sent.echo_held_ns),
            (99, 990, 250)
        );
        assert!(!f.is_due(u64::MAX), "nothing since");
    }
}
