//! Random loss on a path: Bernoulli, or bursty (Gilbert-Elliott), from a seeded stream.

use super::profile::{BurstLoss, PathSpec};
use super::rng::SplitMix64;

/// The loss process of one path: decides, frame by frame, whether it is lost.
#[derive(Debug, Clone)]
pub(crate) struct LossProcess {
    /// Loss probability in the good state (the only state without bursts).
    good: f64,
    burst: Option<BurstLoss>,
    in_burst: bool,
    rng: SplitMix64,
}

impl LossProcess {
    /// The process of `spec`, drawing from `rng`.
    pub fn new(spec: &PathSpec, rng: SplitMix64) -> Self {
        Self {
            good: spec.loss,
            burst: spec.loss_burst,
            in_burst: false,
            rng,
        }
    }

    /// Whether the next frame is lost: decided in the current state, then the chain moves
    /// (with bursts). Draws nothing when no loss is configured.
    pub fn lose(&mut self) -> bool {
        let Some(b) = self.burst else {
            return self.good > 0.0 && self.rng.chance(self.good);
        };
        let p = if self.in_burst {
            b.loss_in_burst
        } else {
            self.good
        };
        let lost = p > 0.0 && self.rng.chance(p);
        let flip = if self.in_burst { b.p_leave } else { b.p_enter };
        if self.rng.chance(flip) {
            self.in_burst = !self.in_burst;
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(loss: f64, loss_burst: Option<BurstLoss>) -> PathSpec {
        PathSpec {
            bandwidth_bps: None,
            latency_ns: 0,
            loss,
            loss_burst,
        }
    }

    /// Realised Bernoulli loss over 10^5 frames lies within 3 sigma of p.
    #[test]
    fn bernoulli_rate_within_three_sigma() {
        let n = 100_000;
        for (p, seed) in [(0.01, 1u64), (0.1, 2), (0.5, 3)] {
            let mut l = LossProcess::new(&spec(p, None), SplitMix64::derive(&[seed]));
            let lost = (0..n).filter(|_| l.lose()).count() as f64;
            let sigma = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (lost - n as f64 * p).abs() < 3.0 * sigma,
                "p {p}: {lost} lost of {n}"
            );
        }
        let mut none = LossProcess::new(&spec(0.0, None), SplitMix64::new(0));
        assert!((0..n).all(|_| !none.lose()));
    }

    /// With every burst frame lost and none outside, runs of losses are the bursts: their
    /// mean length is 1 / p_leave and the loss rate p_enter / (p_enter + p_leave).
    #[test]
    fn gilbert_elliott_burst_length_and_stationary_rate() {
        let b = BurstLoss {
            p_enter: 0.01,
            p_leave: 0.25,
            loss_in_burst: 1.0,
        };
        let mut l = LossProcess::new(&spec(0.0, Some(b)), SplitMix64::derive(&[9]));
        let n = 400_000;
        let (mut lost, mut runs, mut prev) = (0u64, 0u64, false);
        for _ in 0..n {
            let x = l.lose();
            lost += x as u64;
            runs += (x && !prev) as u64;
            prev = x;
        }
        let mean_run = lost as f64 / runs as f64;
        assert!((mean_run - 4.0).abs() < 0.2, "mean burst {mean_run}");
        let rate = lost as f64 / n as f64;
        let expect = b.stationary_loss(0.0);
        assert!(
            (rate - expect).abs() < 0.1 * expect,
            "rate {rate} vs {expect}"
        );
    }

    /// A half-lossy burst state and a lossy good state give the mixed stationary rate.
    #[test]
    fn gilbert_elliott_mixed_rate() {
        let b = BurstLoss {
            p_enter: 0.05,
            p_leave: 0.2,
            loss_in_burst: 0.5,
        };
        let mut l = LossProcess::new(&spec(0.01, Some(b)), SplitMix64::derive(&[4]));
        let n = 200_000;
        let rate = (0..n).filter(|_| l.lose()).count() as f64 / n as f64;
        let expect = b.stationary_loss(0.01);
        assert!(
            (rate - expect).abs() < 0.1 * expect,
            "rate {rate} vs {expect}"
        );
    }
}
