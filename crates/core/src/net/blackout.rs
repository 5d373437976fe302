//! [`Blackout`]: timed outages of the whole network, as the namespace testbed's
//! `--blackout MS` makes them (an nftables rule at the switch that drops every packet for
//! the last MS milliseconds of each second): every packet that crosses a path while the
//! network is out is lost, whatever its flow, transport or direction.
//!
//! Packets cross at the end of their serialisation, when the switch forwards them: the
//! `n` packets of a frame serialised from `start` to `done` cross at even steps of the
//! span, the last at `done`.

use serde::{Deserialize, Serialize};

use super::parse::serde_helpers;
use super::Nanos;

/// The period of the testbed's blackouts: once a second.
pub const DEFAULT_BLACKOUT_PERIOD_NS: u64 = 1_000_000_000;

/// Outages at fixed times: every `period_ns` of the driver's clock (from its origin), the
/// last `duration_ns` of the period lose every packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blackout {
    /// How long each outage lasts, nanoseconds or `"20ms"`.
    #[serde(with = "serde_helpers::duration")]
    pub duration_ns: u64,
    /// Time from one outage's start to the next, nanoseconds or `"1s"` (default a second).
    #[serde(with = "serde_helpers::duration", default = "default_period")]
    pub period_ns: u64,
}

fn default_period() -> u64 {
    DEFAULT_BLACKOUT_PERIOD_NS
}

/// Where the packets a blackout took from a frame were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlackedOut {
    /// How many of the frame's packets were lost.
    pub packets: u64,
    /// When the last of them crossed.
    pub last_at: Nanos,
}

impl Blackout {
    /// Outages of `duration_ns` once a second.
    pub fn per_second(duration_ns: u64) -> Self {
        Self {
            duration_ns,
            period_ns: DEFAULT_BLACKOUT_PERIOD_NS,
        }
    }

    /// The same outages every `period_ns`.
    pub fn with_period(self, period_ns: u64) -> Self {
        Self { period_ns, ..self }
    }

    /// Whether a packet crossing at `t` is lost.
    pub fn is_out(&self, t: Nanos) -> bool {
        self.phase(t) >= self.period_ns.saturating_sub(self.duration_ns)
    }

    /// `t`'s place in its period.
    fn phase(&self, t: Nanos) -> Nanos {
        t.checked_rem(self.period_ns).unwrap_or(0)
    }

    /// The packets lost of a frame of `packets` packets serialised from `start` to `done`
    /// (`None`: none was).
    pub(crate) fn lost(&self, packets: u64, start: Nanos, done: Nanos) -> Option<BlackedOut> {
        let span = done.saturating_sub(start);
        let packets = packets.max(1);
        // The first period boundary after `start` at which an outage begins, if the frame
        // reaches it: most frames cross no outage and are decided without a loop.
        let out_from = self.period_ns.saturating_sub(self.duration_ns);
        let first_cross = start.saturating_add(span / packets);
        if !self.is_out(first_cross) && !self.reaches_outage(first_cross, done, out_from) {
            return None;
        }
        let cross = |j: u64| start.saturating_add(scaled(span, j.saturating_add(1), packets));
        let mut lost = BlackedOut {
            packets: 0,
            last_at: 0,
        };
        for t in (0..packets).map(cross).filter(|&t| self.is_out(t)) {
            lost.packets = lost.packets.saturating_add(1);
            lost.last_at = t;
        }
        (lost.packets > 0).then_some(lost)
    }

    /// Whether an outage begins within `(from, to]`.
    fn reaches_outage(&self, from: Nanos, to: Nanos, out_from: Nanos) -> bool {
        let phase = self.phase(from);
        let to_outage = if phase < out_from {
            out_from - phase
        } else {
            // In an outage already (not reached here), or past it: the next period's.
            self.period_ns
                .saturating_sub(phase)
                .saturating_add(out_from)
        };
        to.saturating_sub(from) >= to_outage
    }
}

/// `span * j / n` without overflow (`n > 0`).
fn scaled(span: Nanos, j: u64, n: u64) -> Nanos {
    let v = u128::from(span) * u128::from(j) / u128::from(n.max(1));
    Nanos::try_from(v).unwrap_or(Nanos::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_last_milliseconds_of_each_period_are_out() {
        let b = Blackout::per_second(20 * MS);
        assert!(!b.is_out(0));
        assert!(!b.is_out(980 * MS - 1));
        assert!(b.is_out(980 * MS));
        assert!(b.is_out(1_000 * MS - 1));
        assert!(!b.is_out(1_000 * MS));
        assert!(b.is_out(1_990 * MS));
    }

    #[test]
    fn a_frame_across_the_outage_loses_the_packets_inside_it() {
        let b = Blackout::per_second(20 * MS);
        // 100 packets from 970 ms to 1,010 ms, 0.4 ms apart: those crossing in 980..1000.
        let lost = b.lost(100, 970 * MS, 1_010 * MS);
        let lost = lost.map(|l| (l.packets, l.last_at));
        assert_eq!(lost, Some((50, 999_600_000)));
        assert_eq!(b.lost(100, 100 * MS, 140 * MS), None);
        let whole = b.lost(1, 985 * MS, 986 * MS).map(|l| l.packets);
        assert_eq!(whole, Some(1));
    }

    proptest! {
        /// The quick test never misses a lost packet: the count equals the packet-by-packet
        /// one, and the last lost packet is the last one out.
        #[test]
        fn the_count_matches_packet_by_packet(
            duration in 1u64..500,
            period in 500u64..2_000,
            start in 0u64..10_000,
            span in 0u64..3_000,
            packets in 1u64..200,
        ) {
            let b = Blackout { duration_ns: duration, period_ns: period };
            let done = start + span;
            let crossings: Vec<u64> =
                (0..packets).map(|j| start + span * (j + 1) / packets).collect();
            let out: Vec<u64> = crossings.into_iter().filter(|&t| b.is_out(t)).collect();
            let expect = out.last().map(|&last| (out.len() as u64, last));
            let got = b.lost(packets, start, done).map(|l| (l.packets, l.last_at));
            prop_assert_eq!(got, expect);
        }
    }
}
