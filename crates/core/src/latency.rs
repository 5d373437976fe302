//! Per-tensor completion times: how long each key's synchronisation takes, from the moment
//! the training loop hands its gradient (or weights) over to the strategy to the moment its
//! averaged values are back (`ParamsReady` or `GradReady`). Its tail (p99) is what a lossy
//! network stretches and what DLCP's bounded loss is meant to cut.
//!
//! Both drivers report the two instants on their own clock; times are kept in a log-scale
//! histogram (16 buckets per octave, under 4.4 % apart), so a run of any length holds a few
//! kilobytes and percentiles are read to that resolution.

use serde::{Deserialize, Serialize};

/// Buckets per doubling.
const PER_OCTAVE: u32 = 16;
/// Octaves from 1 ns: up to 2^42 ns, about 73 minutes.
const OCTAVES: u32 = 42;

/// A log-scale histogram of durations in nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max_ns: u64,
}

/// The bucket of `ns`: 0 holds 0 and 1 ns, then 16 per octave.
fn bucket(ns: u64) -> usize {
    if ns < 2 {
        return 0;
    }
    let octave = 63 - ns.leading_zeros(); // floor(log2 ns) >= 1
    let top = OCTAVES * PER_OCTAVE;
    if octave >= OCTAVES {
        return top as usize;
    }
    // The fraction within the octave, from the bits below the leading one.
    let frac = if octave >= 4 {
        (ns >> (octave - 4)) & 0xF
    } else {
        (ns << (4 - octave)) & 0xF
    };
    (octave * PER_OCTAVE + frac as u32) as usize
}

/// The largest duration bucket `b` holds.
fn upper(b: usize) -> u64 {
    let (octave, frac) = (b as u32 / PER_OCTAVE, b as u64 % PER_OCTAVE as u64);
    if octave >= OCTAVES {
        return u64::MAX;
    }
    let base = 1u64 << octave;
    let step = (base / PER_OCTAVE as u64).max(1);
    base + (frac + 1) * step - 1
}

impl Histogram {
    /// Adds one duration.
    pub fn record(&mut self, ns: u64) {
        let b = bucket(ns);
        if self.counts.len() <= b {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.total += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Adds every duration of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.total += other.total;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Durations recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q`-quantile (0..=1) in nanoseconds: the upper bound of the bucket holding it
    /// (never above the largest duration recorded); 0 when empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(b).min(self.max_ns);
            }
        }
        self.max_ns
    }

    /// Count, median, p99 and maximum in seconds.
    pub fn summary(&self) -> Percentiles {
        Percentiles {
            count: self.total,
            p50_s: self.quantile_ns(0.5) as f64 / 1e9,
            p99_s: self.quantile_ns(0.99) as f64 / 1e9,
            max_s: self.max_ns as f64 / 1e9,
        }
    }
}

/// What reports show of a set of completion times.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Percentiles {
    /// Tensors measured.
    pub count: u64,
    /// Median, seconds.
    pub p50_s: f64,
    /// 99th percentile, seconds.
    pub p99_s: f64,
    /// Longest, seconds.
    pub max_s: f64,
}

/// One worker's keys handed over and not yet back: per key, the hand-over instant.
#[derive(Debug, Clone, Default)]
pub struct HandOvers {
    handed: Vec<Option<u64>>,
}

impl HandOvers {
    /// Hand-overs for a model of `keys` keys.
    pub fn new(keys: usize) -> Self {
        Self {
            handed: vec![None; keys],
        }
    }

    /// `key` was handed to the strategy at `now_ns`.
    pub fn handed(&mut self, key: usize, now_ns: u64) {
        if let Some(h) = self.handed.get_mut(key) {
            *h = Some(now_ns);
        }
    }

    /// `key`'s synchronised values are in at `now_ns`: how long it took (`None` unless it
    /// was handed over and not completed since).
    pub fn completed(&mut self, key: usize, now_ns: u64) -> Option<u64> {
        let start = self.handed.get_mut(key).and_then(Option::take)?;
        Some(now_ns.saturating_sub(start))
    }
}

/// One worker's per-tensor completion times: its hand-overs, and the histograms of the run
/// and of the interval since the last [`TensorTimes::take_interval`].
#[derive(Debug, Clone, Default)]
pub struct TensorTimes {
    handed: HandOvers,
    run: Histogram,
    interval: Histogram,
}

impl TensorTimes {
    /// Times for a model of `keys` keys.
    pub fn new(keys: usize) -> Self {
        Self {
            handed: HandOvers::new(keys),
            ..Self::default()
        }
    }

    /// `key` was handed to the strategy at `now_ns`.
    pub fn handed(&mut self, key: usize, now_ns: u64) {
        self.handed.handed(key, now_ns);
    }

    /// `key`'s synchronised values are in at `now_ns` (ignored unless it was handed over
    /// and not completed since).
    pub fn completed(&mut self, key: usize, now_ns: u64) {
        if let Some(ns) = self.handed.completed(key, now_ns) {
            self.run.record(ns);
            self.interval.record(ns);
        }
    }

    /// The completions since the last call (a step's row), and starts a new interval.
    pub fn take_interval(&mut self) -> Percentiles {
        std::mem::take(&mut self.interval).summary()
    }

    /// Every completion of the run.
    pub fn run(&self) -> &Histogram {
        &self.run
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn completion_is_measured_from_the_hand_over() {
        let mut t = TensorTimes::new(3);
        t.handed(0, 1_000);
        t.handed(1, 2_000);
        t.completed(1, 2_000_002_000);
        t.completed(2, 5_000); // never handed: ignored
        t.completed(0, 1_000_001_000);
        t.completed(0, 9_000_000_000); // twice: ignored
        let step = t.take_interval();
        assert_eq!(step.count, 2);
        assert!((step.max_s - 2.0).abs() < 1e-9);
        assert!((step.p50_s - 1.0).abs() / 1.0 < 0.045, "{step:?}");
        assert_eq!(t.take_interval().count, 0, "a new interval starts empty");
        assert_eq!(t.run().count(), 2);
    }

    proptest! {
        /// Quantiles are within a bucket (4.4 %) of the exact order statistic, never above
        /// the maximum, and merging two histograms is recording both.
        #[test]
        fn quantiles_are_within_a_bucket_of_the_exact_ones(
            mut values in prop::collection::vec(0u64..1u64 << 41, 1..400),
            q in 0.0f64..=1.0,
            split in 0usize..400,
        ) {
            let (mut h, mut a, mut b) = (Histogram::default(), Histogram::default(), Histogram::default());
            for (i, &v) in values.iter().enumerate() {
                h.record(v);
                if i < split { a.record(v) } else { b.record(v) }
            }
            a.merge(&b);
            prop_assert_eq!(&a, &h);
            values.sort_unstable();
            let rank = ((q * values.len() as f64).ceil() as usize).max(1);
            let exact = values[rank - 1];
            let got = h.quantile_ns(q);
            prop_assert!(got >= exact, "{} < {}", got, exact);
            prop_assert!(got as f64 <= (exact as f64 * 1.0625).max(exact as f64 + 1.0), "{} vs {}", got, exact);
            prop_assert!(got <= *values.last().unwrap());
        }

        /// Buckets are ordered: a longer duration never falls in an earlier bucket, and each
        /// bucket's upper bound holds.
        #[test]
        fn buckets_are_monotone(a in 0u64..1u64 << 50, b in 0u64..1u64 << 50) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(bucket(lo) <= bucket(hi));
            prop_assert!(upper(bucket(lo)) >= lo);
        }
    }
}
