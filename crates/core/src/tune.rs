//! Online tuning of a worker's credit (`--autotune`): ByteScheduler's idea of searching the
//! credit while the job runs, with a small search of our own instead of its Bayesian
//! optimisation.
//!
//! The credit scheduler's best credit depends on the bandwidth, the round trip through the
//! servers and the model: too small and the link idles while answers travel back, too large
//! and a late urgent slice waits behind bytes already committed. The tuner measures
//! candidates on a doubling grid around the starting credit, each over a few steps of the
//! running job, and keeps the fastest:
//!
//! 1. **Expand**: from the start, multiply by 4 while each candidate is faster than the best
//!    so far by at least the minimum gain; if the first larger candidate is not faster, divide
//!    by 4 instead, likewise.
//! 2. **Refine**: measure the neighbours (x2, /2) of the best candidate not yet measured.
//! 3. **Settle** on the best. If the step time then stays above the best candidate's by the
//!    drift margin for several steps in a row, search again from the current credit.
//!
//! A candidate's figure is the mean step time of its measured steps; the first steps after
//! a change are skipped, since slices already in flight were sent under the old credit. The
//! tuner is sans-IO: the step sequencer feeds it step times
//! ([`CreditTuner::handle_step`]) and hands out what it proposes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The settings a tuner may change on a worker's endpoint
/// ([`crate::strategy::WorkerSync::retune`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knobs {
    /// Bytes a worker may have pushed and not yet had answered (credit scheduler).
    pub credit_bytes: usize,
}

/// Where and how a [`CreditTuner`] searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TuneSpec {
    /// The first candidate: the job's configured credit.
    pub start: usize,
    /// The smallest candidate (one slice: a smaller credit still lets one slice go).
    pub min: usize,
    /// The largest candidate (a whole model: more changes nothing).
    pub max: usize,
    /// Steps skipped after each change.
    pub settle_steps: u32,
    /// Steps measured per candidate.
    pub measure_steps: u32,
    /// A larger or smaller candidate must be this much faster, in parts per million, for the
    /// search to go on in its direction.
    pub min_gain_ppm: u32,
    /// Once settled: the step time must exceed the best candidate's by this many percent ...
    pub drift_percent: u32,
    /// ... for this many steps in a row to start a new search.
    pub drift_steps: u32,
}

impl TuneSpec {
    /// The default search for a credit starting at `start`, between one slice of
    /// `slice_bytes` and `model_bytes`: one step skipped and two measured per candidate, a
    /// 3 % gain to go on, a new search after 5 steps 25 % slower than the best.
    pub fn credit(start: usize, slice_bytes: usize, model_bytes: usize) -> Self {
        let min = slice_bytes.max(1);
        let max = model_bytes.max(min);
        Self {
            start: start.clamp(min, max),
            min,
            max,
            settle_steps: 1,
            measure_steps: 2,
            min_gain_ppm: 30_000,
            drift_percent: 25,
            drift_steps: 5,
        }
    }

    /// Checks the bounds and counts.
    pub fn validate(&self) -> Result<(), String> {
        if self.min == 0 || self.min > self.start || self.start > self.max {
            return Err(format!(
                "autotune needs 0 < min <= start <= max (min {}, start {}, max {})",
                self.min, self.start, self.max
            ));
        }
        if self.measure_steps == 0 || self.drift_steps == 0 {
            return Err("autotune needs at least one measured step and one drift step".into());
        }
        Ok(())
    }
}

/// One measured candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// The credit measured.
    pub credit_bytes: usize,
    /// Its mean step time in seconds.
    pub step_seconds: f64,
}

/// What a tuner measured and chose, for reports (`summary.json`, the simulator's report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneReport {
    /// The settings in force at the end.
    pub chosen: Knobs,
    /// Whether the last search had ended.
    pub settled: bool,
    /// Searches started again because the step time drifted.
    pub retunes: u32,
    /// Step times fed to the tuner when the last search ended (`None`: it has not).
    pub settled_after_steps: Option<u64>,
    /// Every candidate measured, in order.
    pub trials: Vec<Trial>,
}

impl TuneReport {
    /// `credit 2560000 bytes (full size) after 6 candidates`, with `, still searching` and
    /// the searches started again after drift when there are any; the state machines ran
    /// at `scale` (`--scale`), the line says full-size bytes as `--credit-bytes` does.
    pub fn describe(&self, scale: f64) -> String {
        let mut s = format!(
            "credit {:.0} bytes (full size) after {} candidates",
            self.chosen.credit_bytes as f64 / scale,
            self.trials.len()
        );
        if !self.settled {
            s.push_str(", still searching");
        }
        if self.retunes > 0 {
            s.push_str(&format!(", {} new search(es) after drift", self.retunes));
        }
        s
    }
}

/// Where the search is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Going outwards from the start by `dir` exponents at a time.
    Expand { dir: i32 },
    /// Measuring the best candidate's neighbours.
    Refine,
    /// On the best candidate, watching for drift.
    Settled,
}

/// A search for the credit that gives the shortest steps; see the module docs.
#[derive(Debug, Clone)]
pub struct CreditTuner {
    spec: TuneSpec,
    /// Candidate `j` is `origin * 2^j`, within `lo..=hi`.
    origin: usize,
    lo: i32,
    hi: i32,
    stage: Stage,
    current: i32,
    skip: u32,
    samples: u32,
    sum: f64,
    measured: BTreeMap<i32, f64>,
    trials: Vec<Trial>,
    slow_steps: u32,
    retunes: u32,
    steps_fed: u64,
    settled_at: Option<u64>,
}

/// Exponents `j` such that `origin * 2^j` stays within `min..=max`: the last one each way may
/// be clamped onto the bound.
fn exponent_range(origin: usize, min: usize, max: usize) -> (i32, i32) {
    let (mut lo, mut v) = (0, origin as u128);
    while v > min as u128 {
        v /= 2;
        lo -= 1;
    }
    let (mut hi, mut v) = (0, origin as u128);
    while v < max as u128 {
        v *= 2;
        hi += 1;
    }
    (lo, hi)
}

impl CreditTuner {
    /// A tuner that starts by measuring `spec.start`.
    pub fn new(spec: TuneSpec) -> Self {
        let (lo, hi) = exponent_range(spec.start, spec.min, spec.max);
        Self {
            spec,
            origin: spec.start,
            lo,
            hi,
            stage: Stage::Expand { dir: 2 },
            current: 0,
            skip: spec.settle_steps,
            samples: 0,
            sum: 0.0,
            measured: BTreeMap::new(),
            trials: Vec::new(),
            slow_steps: 0,
            retunes: 0,
            steps_fed: 0,
            settled_at: None,
        }
    }

    /// The search's settings.
    pub fn spec(&self) -> &TuneSpec {
        &self.spec
    }

    /// Candidate `j`'s credit.
    fn credit(&self, j: i32) -> usize {
        let v = if j >= 0 {
            (self.origin as u128) << j.min(64)
        } else {
            (self.origin as u128) >> (-j).min(64)
        };
        v.clamp(self.spec.min as u128, self.spec.max as u128) as usize
    }

    /// The settings in force.
    pub fn knobs(&self) -> Knobs {
        Knobs {
            credit_bytes: self.credit(self.current),
        }
    }

    /// Whether the search has ended (until drift starts another).
    pub fn settled(&self) -> bool {
        self.stage == Stage::Settled
    }

    /// Every candidate measured, in order (across searches).
    pub fn trials(&self) -> &[Trial] {
        &self.trials
    }

    /// The fastest candidate of the current search.
    pub fn best(&self) -> Option<Trial> {
        self.best_exponent().map(|(j, s)| Trial {
            credit_bytes: self.credit(j),
            step_seconds: s,
        })
    }

    /// Searches started again because the step time drifted.
    pub fn retunes(&self) -> u32 {
        self.retunes
    }

    /// What it measured and chose.
    pub fn report(&self) -> TuneReport {
        TuneReport {
            chosen: self.knobs(),
            settled: self.settled(),
            retunes: self.retunes,
            settled_after_steps: self.settled_at,
            trials: self.trials.clone(),
        }
    }

    fn best_exponent(&self) -> Option<(i32, f64)> {
        // Ties go to the smaller credit: it keeps more room for preemption.
        self.measured
            .iter()
            .map(|(&j, &s)| (j, s))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }

    /// One step took `seconds`; returns new settings to apply, if the tuner changes them.
    /// Non-finite or negative times are ignored.
    pub fn handle_step(&mut self, seconds: f64) -> Option<Knobs> {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return None;
        }
        self.steps_fed += 1;
        if self.stage == Stage::Settled {
            return self.watch_drift(seconds);
        }
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.sum += seconds;
        self.samples += 1;
        if self.samples < self.spec.measure_steps {
            return None;
        }
        let mean = self.sum / f64::from(self.samples);
        let before = self.best_exponent();
        self.measured.insert(self.current, mean);
        self.trials.push(Trial {
            credit_bytes: self.credit(self.current),
            step_seconds: mean,
        });
        let next = self.next_candidate(mean, before);
        self.move_to(next)
    }

    /// Where the search goes after measuring the current candidate at `mean`; `None` to
    /// settle. `before` was the best before this measurement.
    fn next_candidate(&mut self, mean: f64, before: Option<(i32, f64)>) -> Option<i32> {
        let gain = f64::from(self.spec.min_gain_ppm) / 1e6;
        if let Stage::Expand { dir } = self.stage {
            let improved = before.is_none_or(|(_, best)| mean < best * (1.0 - gain));
            let next = self.current + dir;
            if improved && (self.lo..=self.hi).contains(&next) {
                return Some(next);
            }
            if improved && self.credit(next) != self.credit(self.current) {
                return Some(next.clamp(self.lo, self.hi));
            }
            // Going up gained nothing over the start (or the start is the largest credit):
            // try smaller credits instead.
            let nothing_above = dir > 0 && self.best_exponent().is_some_and(|(j, _)| j == 0);
            let down = (-2).max(self.lo);
            if nothing_above && down < 0 {
                self.stage = Stage::Expand { dir: -2 };
                return Some(down);
            }
            self.stage = Stage::Refine;
        }
        let (best, _) = self.best_exponent()?;
        [best + 1, best - 1]
            .into_iter()
            .find(|j| (self.lo..=self.hi).contains(j) && !self.measured.contains_key(j))
    }

    /// Starts measuring candidate `next`, or settles on the best one.
    fn move_to(&mut self, next: Option<i32>) -> Option<Knobs> {
        let old = self.knobs();
        let target = match next {
            Some(j) => j,
            None => {
                self.stage = Stage::Settled;
                self.settled_at = Some(self.steps_fed);
                self.slow_steps = 0;
                self.best_exponent().map_or(self.current, |(j, _)| j)
            }
        };
        self.current = target;
        self.skip = self.spec.settle_steps;
        self.samples = 0;
        self.sum = 0.0;
        let new = self.knobs();
        (new != old).then_some(new)
    }

    fn watch_drift(&mut self, seconds: f64) -> Option<Knobs> {
        let best = self.best_exponent().map_or(f64::INFINITY, |(_, s)| s);
        let limit = best * (1.0 + f64::from(self.spec.drift_percent) / 100.0);
        if seconds <= limit {
            self.slow_steps = 0;
            return None;
        }
        self.slow_steps += 1;
        if self.slow_steps < self.spec.drift_steps {
            return None;
        }
        // Search again around what runs now: the settled credit is the new origin.
        let origin = self.credit(self.current);
        let (lo, hi) = exponent_range(origin, self.spec.min, self.spec.max);
        self.origin = origin;
        (self.lo, self.hi) = (lo, hi);
        self.current = 0;
        self.measured.clear();
        self.stage = Stage::Expand { dir: 2 };
        self.skip = 0;
        self.samples = 0;
        self.sum = 0.0;
        self.slow_steps = 0;
        self.settled_at = None;
        self.retunes += 1;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(start: usize, min: usize, max: usize) -> TuneSpec {
        TuneSpec::credit(start, min, max)
    }

    /// Feeds `cost(credit)` step after step until the tuner settles; returns the steps fed.
    fn run(t: &mut CreditTuner, cost: impl Fn(usize) -> f64, limit: u32) -> u32 {
        let mut steps = 0;
        while !t.settled() && steps < limit {
            let credit = t.knobs().credit_bytes;
            assert!((t.spec.min..=t.spec.max).contains(&credit), "{credit}");
            t.handle_step(cost(credit));
            steps += 1;
        }
        steps
    }

    #[test]
    fn grows_the_credit_while_larger_is_faster_and_stops_at_the_plateau() {
        // The link idles below 16 slices in flight, then nothing changes.
        let mut t = CreditTuner::new(spec(4, 1, 1 << 20));
        let steps = run(&mut t, |c| if c >= 16 { 1.0 } else { 16.0 / c as f64 }, 200);
        assert!(t.settled(), "after {steps} steps: {:?}", t.trials());
        assert_eq!(t.knobs().credit_bytes, 16, "{:?}", t.trials());
        assert_eq!(t.best().unwrap().step_seconds, 1.0);
        assert!(steps <= 5 * 3, "{steps} steps");
    }

    #[test]
    fn goes_down_when_larger_is_no_faster() {
        let mut t = CreditTuner::new(spec(64, 1, 1 << 20));
        run(&mut t, |c| 1.0 + (c as f64).log2().abs() / 10.0, 200);
        assert_eq!(t.knobs().credit_bytes, 1, "{:?}", t.trials());
    }

    #[test]
    fn a_search_starting_at_the_largest_credit_goes_down() {
        let mut t = CreditTuner::new(spec(1 << 10, 1, 1 << 10));
        run(&mut t, |c| 1.0 + (c as f64).log2() / 10.0, 200);
        assert_eq!(t.knobs().credit_bytes, 1, "{:?}", t.trials());
    }

    #[test]
    fn a_search_keeps_within_the_bounds_and_clamps_onto_them() {
        let mut t = CreditTuner::new(spec(100, 30, 1000));
        run(&mut t, |c| 1.0 / c as f64, 200);
        assert_eq!(t.knobs().credit_bytes, 1000, "{:?}", t.trials());
        let mut t = CreditTuner::new(spec(100, 30, 1000));
        run(&mut t, |c| c as f64, 200);
        assert_eq!(t.knobs().credit_bytes, 30, "{:?}", t.trials());
    }

    #[test]
    fn a_lasting_slowdown_starts_a_new_search_and_noise_does_not() {
        let mut t = CreditTuner::new(spec(4, 1, 1 << 10));
        run(&mut t, |c| if c >= 16 { 1.0 } else { 16.0 / c as f64 }, 200);
        assert!(t.settled());
        for _ in 0..100 {
            assert_eq!(t.handle_step(1.2), None);
        }
        assert!(t.settled() && t.retunes() == 0);
        for _ in 0..4 {
            t.handle_step(2.0);
        }
        t.handle_step(1.0);
        assert!(
            t.settled(),
            "a slow spell shorter than drift_steps is ignored"
        );
        for _ in 0..5 {
            t.handle_step(2.0);
        }
        assert!(!t.settled());
        assert_eq!(t.retunes(), 1);
        // The link got slower: now 64 slices are needed.
        run(
            &mut t,
            |c| if c >= 64 { 2.0 } else { 128.0 / c as f64 },
            200,
        );
        assert_eq!(t.knobs().credit_bytes, 64, "{:?}", t.trials());
    }

    #[test]
    fn meaningless_times_are_ignored() {
        let mut t = CreditTuner::new(spec(4, 1, 64));
        for s in [f64::NAN, f64::INFINITY, -1.0] {
            assert_eq!(t.handle_step(s), None);
        }
        assert!(t.trials().is_empty());
        assert!(spec(4, 1, 64).validate().is_ok());
        let bad = TuneSpec {
            min: 0,
            ..spec(4, 1, 64)
        };
        assert!(bad.validate().is_err());
    }

    proptest! {
        /// On a cost with one minimum and enough curvature (quadratic in log2 of the credit),
        /// the search ends on the minimum of the grid, within a bounded number of steps.
        #[test]
        fn finds_the_minimum_of_a_convex_cost(
            start_exp in 0u32..20,
            best_exp in 0u32..24,
            curvature in 0.05f64..1.0,
            floor in 0.01f64..10.0,
        ) {
            let (min, max) = (1usize, 1usize << 23);
            let mut t = CreditTuner::new(spec(1 << start_exp, min, max));
            let cost = |c: usize| {
                let d = (c as f64).log2() - f64::from(best_exp.min(23));
                floor * (1.0 + curvature * d * d)
            };
            let steps = run(&mut t, cost, 1000);
            prop_assert!(t.settled(), "{:?}", t.trials());
            prop_assert_eq!(t.knobs().credit_bytes, 1 << best_exp.min(23), "{:?}", t.trials());
            // Each candidate is measured once: at most every grid point plus the start.
            prop_assert!(steps <= 3 * 26, "{} steps", steps);
            let mut seen = std::collections::HashSet::new();
            prop_assert!(t.trials().iter().all(|tr| seen.insert(tr.credit_bytes)));
        }

        /// Whatever the step times, proposals stay within the bounds and the search ends.
        #[test]
        fn any_times_stay_in_bounds_and_settle(
            start in 1usize..1_000_000,
            span in 1usize..1000,
            times in proptest::collection::vec(0.0f64..100.0, 200),
        ) {
            let min = (start / span).max(1);
            let max = start.saturating_mul(span);
            let mut t = CreditTuner::new(spec(start, min, max));
            for (i, s) in times.into_iter().enumerate() {
                if let Some(k) = t.handle_step(s) {
                    prop_assert!((min..=max).contains(&k.credit_bytes));
                }
                prop_assert_eq!(t.knobs().credit_bytes.clamp(min, max), t.knobs().credit_bytes);
                if i >= 3 * 30 && t.retunes() == 0 {
                    prop_assert!(t.settled(), "{:?}", t.trials());
                }
            }
        }
    }
}
