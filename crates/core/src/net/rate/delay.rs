//! The queueing delay a rate controller reacts to, from one delay sample per feedback.
//!
//! A sample is either a round trip or, where the driver can tell, the one-way delay of the
//! forward path: the receiver's arrival time less the sender's stamp, across two clocks
//! whose offset is unknown. Only the forward path's queue is this flow's to drain: a round
//! trip also holds the reverse path's queue, which other traffic fills (a parameter server's
//! pulls, TCP in the other direction), and a flow that backs off for it loses its share for
//! nothing. The offset cancels out against the base delay, the least sample seen, as in
//! LEDBAT (RFC 6817); the base is the least of the last two windows of [`BASE_WINDOW_NS`],
//! so two clocks that drift apart move it along instead of reading as a queue. It rises by
//! at most [`MAX_BASE_RISE_NS`] a window, what drifting clocks can move it: a queue that
//! stands for longer than two windows (a slow path behind a deep buffer) stays a queue, and
//! never becomes the base.

use super::super::Nanos;

/// How long one window of the base delay lasts (the base is the least sample over the
/// latest two): LEDBAT keeps ten minutes of one-minute windows; two 5-second windows
/// bound the error of clocks that drift apart by 10 ppm to 100 us, under `t_low`.
pub const BASE_WINDOW_NS: Nanos = 5_000_000_000;
/// The most the base delay rises from one window to the next (250 us a window: clocks
/// drifting apart by 50 ppm). Without a bound, a queue standing through two windows became
/// the base: the controller read a full 20 Mbit/s path behind 1,000 packets of buffer as
/// empty, grew its rate, and the path dropped half of what it was sent.
pub const MAX_BASE_RISE_NS: i64 = 250_000;
/// The steepest slope one pair of samples counts for (samples close in time say little).
const MAX_SLOPE: f64 = 4.0;
/// Weight of a new slope in the smoothed slope.
const SLOPE_GAIN: f64 = 0.25;

/// The queueing delay and its trend, from delay samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct QueueDelay {
    /// The least sample of the current window, and when the window began.
    current: (i64, Nanos),
    /// The least sample of the window before.
    previous: i64,
    /// The latest sample and when it came, for the slope.
    latest: Option<(i64, Nanos)>,
    /// Smoothed slope of the delay over time (ns of delay per ns): the queue's growth as a
    /// fraction of the bottleneck's rate, the same for every flow that shares it.
    slope: f64,
}

impl QueueDelay {
    /// No sample yet.
    pub fn new() -> Self {
        Self {
            current: (i64::MAX, 0),
            previous: i64::MAX,
            latest: None,
            slope: 0.0,
        }
    }

    /// Takes `delay` (any offset, the same for every sample) that came at `now`; returns
    /// the queueing it shows: how far it lies over the base delay.
    pub fn sample(&mut self, delay: i64, now: Nanos) -> Nanos {
        if self.latest.is_none() {
            self.current.1 = now;
        } else if now.saturating_sub(self.current.1) >= BASE_WINDOW_NS {
            let windows = now.saturating_sub(self.current.1) / BASE_WINDOW_NS;
            let rise = MAX_BASE_RISE_NS.saturating_mul(i64::try_from(windows).unwrap_or(i64::MAX));
            self.previous = self.current.0.min(self.previous.saturating_add(rise));
            self.current = (i64::MAX, now);
        }
        self.current.0 = self.current.0.min(delay);
        if let Some((latest, at)) = self.latest {
            if now > at {
                let slope = (delay.saturating_sub(latest)) as f64 / (now - at) as f64;
                let slope = slope.clamp(-MAX_SLOPE, MAX_SLOPE);
                self.slope += SLOPE_GAIN * (slope - self.slope);
            }
        }
        if self.latest.is_none_or(|(_, at)| now > at) {
            self.latest = Some((delay, now));
        }
        let base = self.current.0.min(self.previous);
        u64::try_from(delay.saturating_sub(base)).unwrap_or(0)
    }

    /// The smoothed slope of the delay (0 before two samples).
    pub fn slope(&self) -> f64 {
        self.slope
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_between_the_clocks_cancels_out() {
        for offset in [-5_000_000_000_i64, 0, 7_000_000_000_000] {
            let mut d = QueueDelay::new();
            assert_eq!(d.sample(offset + 50_000, 1_000), 0);
            assert_eq!(d.sample(offset + 40_000, 2_000), 0, "a new base");
            assert_eq!(d.sample(offset + 340_000, 3_000), 300_000);
        }
    }

    #[test]
    fn the_slope_follows_a_growing_queue() {
        let mut d = QueueDelay::new();
        for i in 0..20_u64 {
            d.sample(1_000 + (i as i64) * 500, i * 1_000);
        }
        assert!((d.slope() - 0.5).abs() < 0.01, "slope {}", d.slope());
        d.sample(0, 30_000);
        assert!(d.slope() < 0.5);
    }

    #[test]
    fn the_base_follows_clocks_that_drift_apart() {
        let mut d = QueueDelay::new();
        d.sample(100, 0);
        // Clocks drifting apart: every later sample 200 us higher (40 ppm).
        d.sample(200_100, BASE_WINDOW_NS);
        assert_eq!(
            d.sample(200_100, BASE_WINDOW_NS + 1),
            200_000,
            "still the old base"
        );
        assert_eq!(
            d.sample(200_100, 2 * BASE_WINDOW_NS),
            0,
            "the first window is gone"
        );
    }

    #[test]
    fn a_standing_queue_never_becomes_the_base() {
        let mut d = QueueDelay::new();
        d.sample(1_000, 0);
        // From then on a queue of 300 ms stands for a minute, sampled every millisecond.
        let standing = 300_000_000;
        let mut queueing = 0;
        for ms in 1..=60_000 {
            queueing = d.sample(1_000 + standing, ms * 1_000_000);
        }
        // The base rose by MAX_BASE_RISE_NS a window (12 windows: 3 ms), no more.
        assert!(queueing >= 297_000_000, "queueing {queueing}");
        // And after a long silence it rises by as much a window as it could have.
        let later = d.sample(1_000 + standing, 600 * BASE_WINDOW_NS);
        assert!(later < standing as u64, "queueing {later}");
    }
}
