//! The probe timer of a sender whose Probes travel as datagrams: a share whose Probe has
//! gone without an answer (a Stop or a Missing) probes again after about two smoothed
//! round trips and a margin, doubling the wait for each unanswered Probe in a row, so a
//! lost Probe, Stop or Missing costs one probe timeout, not a retransmission timeout.
//!
//! An endpoint is told the time only by `handle_timeout`, not when it hands out a frame: a
//! Probe sent since the last call asks for a timeout at once (at the last time known),
//! and that call arms its deadline from the time it brings.

use std::collections::BTreeSet;

/// The wait before the first re-probe while no round trip has been measured.
pub const PROBE_DEFAULT_NS: u64 = 5_000_000;
/// The shortest wait before a re-probe, whatever the round trip.
pub const PROBE_FLOOR_NS: u64 = 2_000_000;
/// The longest wait before a re-probe, backed off or not.
pub const PROBE_CEIL_NS: u64 = 50_000_000;
/// Added to twice the smoothed round trip: the receiver's time to answer.
pub const PROBE_MARGIN_NS: u64 = 1_000_000;
/// Unanswered Probes in a row after which the wait stops doubling.
const MAX_BACKOFF: u32 = 5;

/// The wait before re-probing a share whose last `unanswered` Probes went unanswered, with
/// a smoothed round trip of `srtt_ns` (`None`: none measured).
pub fn probe_timeout_ns(srtt_ns: Option<u64>, unanswered: u32) -> u64 {
    let base = srtt_ns.map_or(PROBE_DEFAULT_NS, |rtt| {
        rtt.saturating_mul(2).saturating_add(PROBE_MARGIN_NS)
    });
    let base = base.clamp(PROBE_FLOOR_NS, PROBE_CEIL_NS);
    base.saturating_mul(1 << unanswered.min(MAX_BACKOFF))
        .min(PROBE_CEIL_NS)
}

/// One share's timer: its deadline once armed (or whether it waits to be armed) and its
/// unanswered Probes in a row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ShareTimer {
    deadline: Option<u64>,
    unarmed: bool,
    unanswered: u32,
}

/// The re-probe timers of a sender's shares (numbered by the sender).
#[derive(Debug, Default)]
pub(super) struct ProbeTimers {
    shares: Vec<ShareTimer>,
    /// Shares probed since the last `handle_timeout`, their deadlines not yet set.
    unarmed: Vec<usize>,
    /// Armed deadlines, earliest first.
    deadlines: BTreeSet<(u64, usize)>,
    /// The latest time told.
    now: u64,
    /// Per peer: the smoothed round trip its datagram link measured, if any.
    srtt_ns: Vec<Option<u64>>,
}

impl ProbeTimers {
    /// Timers for `shares` shares sent to `peers` peers.
    pub(super) fn new(shares: usize, peers: usize) -> Self {
        Self {
            shares: vec![ShareTimer::default(); shares],
            srtt_ns: vec![None; peers],
            ..Self::default()
        }
    }

    /// The Probe of share `i` went out.
    pub(super) fn probe_sent(&mut self, i: usize) {
        let Some(t) = self.shares.get_mut(i) else {
            return;
        };
        if let Some(at) = t.deadline.take() {
            self.deadlines.remove(&(at, i));
        }
        if !t.unarmed {
            t.unarmed = true;
            self.unarmed.push(i);
        }
    }

    /// Share `i`'s Probe was answered (a Stop or a Missing), or the share is over: no
    /// re-probe, and the next Probe's wait starts from the base again.
    pub(super) fn answered(&mut self, i: usize) {
        let Some(t) = self.shares.get_mut(i) else {
            return;
        };
        if let Some(at) = t.deadline.take() {
            self.deadlines.remove(&(at, i));
        }
        *t = ShareTimer::default();
    }

    /// Every share is over (a new step).
    pub(super) fn clear(&mut self) {
        self.shares.fill(ShareTimer::default());
        self.unarmed.clear();
        self.deadlines.clear();
    }

    /// The smoothed round trip to peer `peer` is `srtt_ns`.
    pub(super) fn set_srtt(&mut self, peer: usize, srtt_ns: u64) {
        if let Some(s) = self.srtt_ns.get_mut(peer) {
            *s = Some(srtt_ns).filter(|&r| r > 0);
        }
    }

    /// When `handle_timeout` is wanted: at once (the latest time known) while a Probe
    /// waits for its deadline to be armed, else the earliest deadline.
    pub(super) fn poll_timeout(&self) -> Option<u64> {
        if self.unarmed.is_empty() {
            self.deadlines.first().map(|&(at, _)| at)
        } else {
            Some(self.now)
        }
    }

    /// The time is `now`: arms the deadlines of the Probes sent since the last call, and
    /// returns the shares whose deadline has come (each to probe again), oldest first.
    /// `peer_of` names a share's peer (for its round trip).
    pub(super) fn handle_timeout(
        &mut self,
        now: u64,
        peer_of: impl Fn(usize) -> usize,
    ) -> Vec<usize> {
        self.now = self.now.max(now);
        for i in std::mem::take(&mut self.unarmed) {
            let srtt = self.srtt_ns.get(peer_of(i)).copied().flatten();
            let Some(t) = self.shares.get_mut(i).filter(|t| t.unarmed) else {
                continue;
            };
            let at = self
                .now
                .saturating_add(probe_timeout_ns(srtt, t.unanswered));
            t.unarmed = false;
            t.deadline = Some(at);
            self.deadlines.insert((at, i));
        }
        let mut due = Vec::new();
        while let Some(&(at, i)) = self.deadlines.first() {
            if at > self.now {
                break;
            }
            self.deadlines.remove(&(at, i));
            if let Some(t) = self.shares.get_mut(i) {
                *t = ShareTimer {
                    deadline: None,
                    unarmed: false,
                    unanswered: t.unanswered.saturating_add(1),
                };
            }
            due.push(i);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_two_round_trips_and_a_margin_clamped_and_backed_off() {
        assert_eq!(probe_timeout_ns(None, 0), PROBE_DEFAULT_NS);
        assert_eq!(probe_timeout_ns(Some(3_000_000), 0), 7_000_000);
        assert_eq!(probe_timeout_ns(Some(10), 0), PROBE_FLOOR_NS);
        assert_eq!(probe_timeout_ns(Some(u64::MAX), 0), PROBE_CEIL_NS);
        assert_eq!(probe_timeout_ns(None, 1), 2 * PROBE_DEFAULT_NS);
        assert_eq!(probe_timeout_ns(None, 2), 4 * PROBE_DEFAULT_NS);
        assert_eq!(probe_timeout_ns(None, 30), PROBE_CEIL_NS);
    }

    #[test]
    fn a_probe_arms_at_the_next_call_and_fires_once_unanswered() {
        let mut t = ProbeTimers::new(3, 1);
        assert_eq!(t.poll_timeout(), None);
        t.probe_sent(1);
        assert_eq!(t.poll_timeout(), Some(0), "at once, to learn the time");
        assert!(t.handle_timeout(1_000, |_| 0).is_empty());
        let at = 1_000 + PROBE_DEFAULT_NS;
        assert_eq!(t.poll_timeout(), Some(at));
        assert!(t.handle_timeout(at - 1, |_| 0).is_empty(), "not yet");
        assert_eq!(t.handle_timeout(at, |_| 0), vec![1]);
        assert_eq!(t.handle_timeout(at, |_| 0), Vec::<usize>::new(), "once");
        assert_eq!(t.poll_timeout(), None);
        t.probe_sent(1);
        t.handle_timeout(at, |_| 0);
        assert_eq!(
            t.poll_timeout(),
            Some(at + 2 * PROBE_DEFAULT_NS),
            "backed off"
        );
        t.answered(1);
        assert_eq!(t.poll_timeout(), None);
        t.probe_sent(1);
        t.set_srtt(0, 3_000_000);
        t.handle_timeout(at, |_| 0);
        assert_eq!(
            t.poll_timeout(),
            Some(at + 7_000_000),
            "from the round trip"
        );
        t.probe_sent(2);
        t.handle_timeout(at, |_| 0);
        t.probe_sent(2);
        assert_eq!(t.poll_timeout(), Some(at), "a Probe sent again re-arms");
        t.clear();
        assert_eq!(t.poll_timeout(), None);
        t.probe_sent(99);
        assert_eq!(t.poll_timeout(), None, "no such share");
    }
}
