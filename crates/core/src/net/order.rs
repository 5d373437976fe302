//! In-order delivery of reliable flows (TCP-like): a frame is handed out only once every
//! earlier frame of its flow has been, and never before them (head-of-line blocking), so
//! reliable deliveries on one flow are monotone in time.

use std::collections::VecDeque;

use super::{Decision, Fate, Nanos};

/// The reorder buffer of one reliable flow through a port.
#[derive(Debug, Clone, Default)]
#[repr(C)]
pub(crate) struct FlowSeq {
    /// Sequence number of the next frame offered.
    next_ticket: u64,
    /// Sequence number of the next frame to hand out.
    next_release: u64,
    /// Delivery time of the last frame handed out.
    last_at: Nanos,
    /// Decided frames waiting for an earlier one: entry `i` is frame `next_release + i`
    /// (tickets are dense, so a ring of slots is a cheaper map than a tree).
    held: VecDeque<Option<Decision>>,
}

impl FlowSeq {
    /// The sequence number of a new frame of the flow.
    pub fn ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket = t.saturating_add(1);
        t
    }

    /// Frame `seq` of the flow is delivered as `decision` says: hands it (and any frames
    /// it held up) to `out` in order, each delivered no earlier than the one before.
    /// A sequence number settled twice, or one never ticketed, is ignored.
    pub fn settle(&mut self, seq: u64, decision: Decision, out: &mut VecDeque<Decision>) {
        let Some(i) = (seq.checked_sub(self.next_release)).and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        if seq >= self.next_ticket {
            return;
        }
        if i > 0 {
            if self.held.len() <= i {
                self.held.resize_with(i + 1, || None);
            }
            self.held[i] = Some(decision);
            return;
        }
        // In order (the common case): no detour through the buffer.
        self.held.pop_front();
        self.release(decision, out);
        while let Some(Some(_)) = self.held.front() {
            if let Some(Some(d)) = self.held.pop_front() {
                self.release(d, out);
            }
        }
    }

    /// Hands out the next frame in order, delivered no earlier than the one before.
    fn release(&mut self, mut d: Decision, out: &mut VecDeque<Decision>) {
        if let Fate::Delivered { at, .. } = &mut d.fate {
            *at = (*at).max(self.last_at);
            self.last_at = *at;
        }
        out.push_back(d);
        self.next_release = self.next_release.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(token: u64, at: Nanos) -> Decision {
        Decision {
            token,
            fate: Fate::Delivered {
                at,
                retransmissions: 0,
                path: 0,
            },
            start: 0,
            done: 0,
            first_arrival: None,
        }
    }

    #[test]
    fn later_frames_wait_for_an_earlier_one() {
        let (mut one, mut two) = (FlowSeq::default(), FlowSeq::default());
        let mut out = VecDeque::new();
        let (a, b, c) = (one.ticket(), one.ticket(), two.ticket());
        one.settle(b, delivered(11, 100), &mut out);
        two.settle(c, delivered(20, 50), &mut out);
        assert_eq!(
            out.len(),
            1,
            "flow 2 is independent, flow 1 waits for its first frame"
        );
        one.settle(a, delivered(10, 500), &mut out);
        let got: Vec<Decision> = out.into_iter().collect();
        assert_eq!(
            got,
            [delivered(20, 50), delivered(10, 500), delivered(11, 500)]
        );
    }

    #[test]
    fn frames_settled_in_any_order_come_out_in_ticket_order() {
        let mut flow = FlowSeq::default();
        let tickets: Vec<u64> = (0..64).map(|_| flow.ticket()).collect();
        let mut order = tickets.clone();
        // A fixed shuffle: 37 is coprime with 64, so this visits every ticket once.
        order.sort_by_key(|&t| (t * 37) % 64);
        let mut out = VecDeque::new();
        for &t in &order {
            flow.settle(t, delivered(t, 1_000 - t), &mut out);
        }
        flow.settle(3, delivered(99, 0), &mut out);
        flow.settle(64, delivered(99, 0), &mut out);
        let tokens: Vec<u64> = out.iter().map(|d| d.token).collect();
        assert_eq!(
            tokens, tickets,
            "in order, and a settled or unticketed one ignored"
        );
        assert!(flow.held.is_empty());
    }
}
