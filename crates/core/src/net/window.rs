//! The send window: the driver asks its scheduler for another frame only while the egress
//! holds fewer unserialised bytes than the window, so a late urgent frame waits behind at
//! most that much. One place for both drivers' arithmetic.

use super::{backlog_bytes, Nanos};

/// Work offered to one serialiser: its bandwidth and when it would be idle had it served
/// everything offered so far back to back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backlog {
    /// Bits per second (`None`: unlimited, never a backlog).
    pub bandwidth_bps: Option<f64>,
    /// When the offered work is done.
    pub busy_until: Nanos,
}

/// Unserialised bytes over all serialisers at `now`.
pub(crate) fn held<I: IntoIterator<Item = Backlog>>(backlogs: I, now: Nanos) -> usize {
    backlogs.into_iter().fold(0usize, |sum, b| {
        sum.saturating_add(backlog_bytes(b.bandwidth_bps, b.busy_until, now))
    })
}

/// Whether fewer than `window` bytes are unserialised at `now`.
pub(crate) fn has_room<I: IntoIterator<Item = Backlog>>(
    backlogs: I,
    window: usize,
    now: Nanos,
) -> bool {
    held(backlogs, now) < window
}

/// The first instant `>= now + 1` at which [`has_room`] holds, exact because the backlog
/// never grows with time. The backlogs' continuous drain says where it is to within
/// `slack` ns (each backlog rounds up by under a byte), so the answer is found by stepping
/// from that estimate, two or three evaluations in the common case; a binary search
/// covers whatever the estimate does not. If it never holds (a window of 0), the instant
/// every serialiser is idle.
pub(crate) fn room_at<I>(backlogs: I, window: usize, now: Nanos) -> Nanos
where
    I: IntoIterator<Item = Backlog> + Clone,
{
    let mut each = backlogs.clone().into_iter();
    if let (Some(only), None) = (each.next(), each.next()) {
        if let Some(t) = one_room_at(only, window, now) {
            return t;
        }
    }
    let room = |t: Nanos| has_room(backlogs.clone(), window, t);
    let mut lo = now.saturating_add(1);
    if room(lo) {
        return lo;
    }
    let idle = (backlogs.clone().into_iter())
        .map(|b| b.busy_until)
        .max()
        .unwrap_or(0);
    let mut hi = idle.max(lo);
    if hi == lo {
        return hi;
    }
    // Invariant from here: no room at lo; room at hi once `room_at_hi`.
    let mut room_at_hi = false;
    if let Some((estimate, slack)) = continuous_room_at(backlogs.clone(), window) {
        // The exact instant is nearly always the estimate or next to it.
        let t = estimate.clamp(lo + 1, hi);
        if room(t) {
            if !room(t - 1) {
                return t;
            }
            (hi, room_at_hi) = (t - 1, true);
        } else {
            if t == hi {
                return hi;
            }
            if room(t + 1) {
                return t + 1;
            }
            lo = t + 1;
        }
        let (below, above) = (
            estimate.saturating_sub(slack),
            estimate.saturating_add(slack),
        );
        if below > lo && below < hi && !room(below) {
            lo = below;
        }
        if above > lo && above < hi && room(above) {
            (hi, room_at_hi) = (above, true);
        }
    }
    if !room_at_hi && !room(hi) {
        return hi;
    }
    first_with_room(lo, hi, room)
}

/// The send window of a port with one serialiser, decided by one comparison: the backlog
/// depends only on the gap `busy_until - now` and never shrinks as the gap grows, so there
/// is a largest gap with room, found once. [`has_room`] and [`room_at`] to the bit
/// (`one_path_matches_the_general_window`), for a rate the profile allows (or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OnePath {
    /// The largest gap (ns) with room (`None`: no room ever, a window of 0).
    max_gap: Option<Nanos>,
}

impl OnePath {
    /// The window of `window` bytes over one serialiser of `bandwidth_bps`; `None` for a
    /// rate that is not finite and positive (the general search decides those).
    pub(crate) fn new(bandwidth_bps: Option<f64>, window: usize) -> Option<Self> {
        if bandwidth_bps.is_some_and(|bps| !(bps > 0.0 && bps.is_finite())) {
            return None;
        }
        let room = |gap: Nanos| backlog_bytes(bandwidth_bps, gap, 0) < window;
        let max_gap = if !room(0) {
            None
        } else if room(Nanos::MAX) {
            Some(Nanos::MAX)
        } else {
            // Room at 0, none at MAX: the last gap with room is one before the first without.
            Some(first_with_room(0, Nanos::MAX, |gap| !room(gap)) - 1)
        };
        Some(Self { max_gap })
    }

    /// [`has_room`] for the serialiser busy until `busy_until`.
    #[inline]
    pub(crate) fn has_room(self, busy_until: Nanos, now: Nanos) -> bool {
        self.max_gap
            .is_some_and(|max| busy_until.saturating_sub(now) <= max)
    }

    /// [`room_at`] for the serialiser busy until `busy_until`: where the gap first falls to
    /// the largest with room (never: when the serialiser is idle).
    #[inline]
    pub(crate) fn room_at(self, busy_until: Nanos, now: Nanos) -> Nanos {
        let lo = now.saturating_add(1);
        match self.max_gap {
            Some(max) => busy_until.saturating_sub(max).max(lo),
            None => busy_until.max(lo),
        }
    }
}

/// [`room_at`] for one serialiser (a host's usual egress), from its drain in closed form:
/// `None` where the answer is not within a step of the estimate (then the general search
/// decides), so what it returns is exact.
fn one_room_at(b: Backlog, window: usize, now: Nanos) -> Option<Nanos> {
    let bps = b
        .bandwidth_bps
        .filter(|&bps| bps > 0.0 && bps.is_finite())?;
    if window == 0 {
        return None;
    }
    let room = |t: Nanos| backlog_bytes(Some(bps), b.busy_until, t) < window;
    let lo = now.saturating_add(1);
    if room(lo) {
        return Some(lo);
    }
    if b.busy_until <= lo {
        return None;
    }
    // Room once at most `window - 1` bytes are left: `(window - 1) / rate` ns before idle.
    let left_ns = (window - 1) as f64 / (bps * 1e-9 / 8.0);
    let estimate = b.busy_until.saturating_sub(left_ns.max(0.0) as u64);
    let t = estimate.clamp(lo.saturating_add(1), b.busy_until);
    match (room(t - 1), room(t)) {
        (false, true) => Some(t),
        (false, false) if room(t + 1) => Some(t + 1),
        (true, _) if t - 1 > lo && !room(t - 2) => Some(t - 1),
        _ => None,
    }
}

/// The first instant in `(lo, hi]` with room, given none at `lo` and room at `hi` (and
/// that room, once there, stays): a binary search.
fn first_with_room(mut lo: Nanos, mut hi: Nanos, room: impl Fn(Nanos) -> bool) -> Nanos {
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if room(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// Where the backlogs, drained continuously (no rounding to bytes), hold `window - 1` bytes,
/// and how far the exact instant can be from it (ns): a guess that narrows the search.
fn continuous_room_at<I: IntoIterator<Item = Backlog>>(
    backlogs: I,
    window: usize,
) -> Option<(Nanos, Nanos)> {
    // Bytes a serialiser drains per ns, and when it is idle; latest first. A few paths at
    // most: no allocation on this hot path (more than `MAX` leave the search unnarrowed).
    const MAX: usize = 8;
    let mut all = [(0.0f64, 0.0f64); MAX];
    let mut n = 0;
    for b in backlogs {
        let Some(rate) = b.bandwidth_bps.map(|bps| bps / 8e9) else {
            continue;
        };
        if !(rate > 0.0 && rate.is_finite()) {
            continue;
        }
        *all.get_mut(n)? = (rate, b.busy_until as f64);
        n += 1;
    }
    let busy = &mut all[..n];
    if busy.is_empty() || window == 0 {
        return None;
    }
    busy.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
    let target = (window - 1) as f64;
    let slowest = busy
        .iter()
        .map(|&(rate, _)| rate)
        .fold(f64::INFINITY, f64::min);
    let slack = ((busy.len() as f64 + 1.0) / slowest).ceil() + 2.0;
    // On [next idle, this one's idle], the first k+1 serialisers drain: A - R t bytes left.
    let (mut a, mut r) = (0.0, 0.0);
    for (k, &(rate, until)) in busy.iter().enumerate() {
        a += rate * until;
        r += rate;
        let t = (a - target) / r;
        let floor = busy.get(k + 1).map_or(f64::NEG_INFINITY, |&(_, next)| next);
        if t >= floor {
            let clamp = |x: f64| x.clamp(0.0, u64::MAX as f64) as u64;
            return Some((clamp(t.ceil()), clamp(slack)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Serialisers of the given bandwidths busy until the given instants (pairwise).
    fn serialisers(bps: &[f64], busy: &[u64]) -> Vec<Backlog> {
        (bps.iter().zip(busy))
            .map(|(&b, &u)| Backlog {
                bandwidth_bps: Some(b),
                busy_until: u,
            })
            .collect()
    }

    /// The first instant with room by plain bisection over `[now + 1, idle]`: the reference.
    fn room_at_by_bisection(backlogs: &[Backlog], window: usize, now: Nanos) -> Nanos {
        let room = |t: Nanos| has_room(backlogs.iter().copied(), window, t);
        let lo = now + 1;
        let idle = backlogs.iter().map(|b| b.busy_until).max().unwrap_or(0);
        let hi = idle.max(lo);
        if room(lo) {
            return lo;
        }
        if !room(hi) {
            return hi;
        }
        first_with_room(lo, hi, room)
    }

    proptest! {
        /// Stepping from the continuous estimate finds what a plain bisection finds, for
        /// fast and slow links, one path or several, any window (0 included: never room).
        #[test]
        fn room_at_matches_a_plain_bisection(
            bps in prop::collection::vec(1e5f64..4e11, 1..5),
            busy in prop::collection::vec(0u64..50_000_000, 1..5),
            window in 0usize..2_000_000,
            now in 0u64..50_000_000,
        ) {
            let backlogs = serialisers(&bps, &busy);
            prop_assert_eq!(
                room_at(backlogs.iter().copied(), window, now),
                room_at_by_bisection(&backlogs, window, now)
            );
        }

        /// room_at is the exact first instant with room: room there, none one ns before.
        #[test]
        fn room_at_is_exact(
            bps in prop::collection::vec(1e6f64..1e11, 1..4),
            busy in prop::collection::vec(0u64..10_000_000, 1..4),
            window in 1usize..1_000_000,
            now in 0u64..5_000_000,
        ) {
            let backlogs = serialisers(&bps, &busy);
            let t = room_at(backlogs.iter().copied(), window, now);
            prop_assert!(t > now);
            prop_assert!(has_room(backlogs.iter().copied(), window, t));
            if t > now + 1 {
                prop_assert!(!has_room(backlogs.iter().copied(), window, t - 1));
            }
        }
    }

    proptest! {
        /// The closed form of one serialiser decides as the general check and search, for
        /// any rate the profile allows (or none), any window (0 included), at any time.
        #[test]
        fn one_path_matches_the_general_window(
            bps in prop::option::of(prop_oneof![1e-3f64..1e3, 1e5f64..4e11, 1e12f64..1e300]),
            busy in prop_oneof![0u64..50_000_000, any::<u64>()],
            window in prop_oneof![0usize..4, 0usize..2_000_000, any::<usize>()],
            now in prop_oneof![0u64..50_000_000, any::<u64>()],
        ) {
            let b = [Backlog { bandwidth_bps: bps, busy_until: busy }];
            let one = OnePath::new(bps, window).expect("a positive finite rate or none");
            prop_assert_eq!(one.has_room(busy, now), has_room(b, window, now));
            prop_assert_eq!(one.room_at(busy, now), room_at(b, window, now));
            // Near the instant the window reopens, where rounding decides.
            let t = room_at(b, window, now);
            for at in [t.saturating_sub(2), t.saturating_sub(1), t, t.saturating_add(1)] {
                prop_assert_eq!(one.has_room(busy, at), has_room(b, window, at));
                prop_assert_eq!(one.room_at(busy, at), room_at(b, window, at));
            }
        }
    }

    /// A rate the profile does not allow is left to the general search.
    #[test]
    fn one_path_declines_rates_that_are_not_positive_and_finite() {
        for bps in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            assert_eq!(OnePath::new(Some(bps), 1000), None, "{bps}");
        }
        assert!(OnePath::new(None, 0).is_some());
    }

    /// The simulator's former test: the window reopens exactly when the backlog drops below it.
    #[test]
    fn room_returns_exactly_when_the_backlog_drops_below_the_window() {
        for (bps, window) in [(1e9, 1000usize), (3e9, 4096), (7.7e9, 262_144)] {
            let tx = super::super::transmission_ns(Some(bps), 10 * window + 17);
            let b = [Backlog {
                bandwidth_bps: Some(bps),
                busy_until: tx,
            }];
            assert!(!has_room(b, window, 0));
            let t = room_at(b, window, 0);
            assert!(has_room(b, window, t), "room at {t}");
            assert!(!has_room(b, window, t - 1), "no room just before {t}");
        }
    }
}
