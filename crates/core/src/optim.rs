//! SGD with momentum and weight decay on flat `f32` slices, and learning-rate schedules.
//!
//! The update works on any contiguous range of a parameter, so a parameter server can apply
//! it to the slices it owns exactly as a single process applies it to whole tensors; both
//! give bit-identical results because the arithmetic is element-wise.

use serde::{Deserialize, Serialize};

/// Hyper-parameters of SGD, with PyTorch's `torch.optim.SGD` semantics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SgdConfig {
    /// Momentum factor (0 disables the velocity buffer).
    pub momentum: f32,
    /// L2 penalty added to the gradient (`g + weight_decay * w`).
    pub weight_decay: f32,
}

impl Default for SgdConfig {
    fn default() -> Self {
        Self {
            momentum: 0.9,
            weight_decay: 0.0,
        }
    }
}

/// The SGD update rule; stateless itself, the velocity lives with the caller's slice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgd {
    config: SgdConfig,
}

impl Sgd {
    /// Creates the update rule from its hyper-parameters.
    pub fn new(config: SgdConfig) -> Self {
        Self { config }
    }

    /// The hyper-parameters this rule applies.
    pub fn config(&self) -> SgdConfig {
        self.config
    }

    /// Applies one step in place: `v = m*v + (g + wd*w); w -= lr*v` (PyTorch's order).
    ///
    /// `velocity` must have the same length as `param` and `grad`; on the first step it holds
    /// zeros, which gives PyTorch's first-step behaviour (`v = g`) for any momentum.
    ///
    /// # Panics
    /// Panics if the three slices differ in length: that is a programming error of the
    /// caller, never a consequence of peer or user input.
    pub fn step(&self, lr: f32, param: &mut [f32], grad: &[f32], velocity: &mut [f32]) {
        assert_eq!(param.len(), grad.len(), "param and grad lengths differ");
        assert_eq!(
            param.len(),
            velocity.len(),
            "param and velocity lengths differ"
        );
        let SgdConfig {
            momentum,
            weight_decay,
        } = self.config;
        // Three monomorphic loops so each one vectorises without branches inside.
        if momentum == 0.0 {
            for (w, &g) in param.iter_mut().zip(grad) {
                *w -= lr * (g + weight_decay * *w);
            }
        } else if weight_decay == 0.0 {
            for ((w, &g), v) in param.iter_mut().zip(grad).zip(velocity.iter_mut()) {
                *v = momentum * *v + g;
                *w -= lr * *v;
            }
        } else {
            for ((w, &g), v) in param.iter_mut().zip(grad).zip(velocity.iter_mut()) {
                *v = momentum * *v + (g + weight_decay * *w);
                *w -= lr * *v;
            }
        }
    }
}

/// How the learning rate changes with the step number.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LrSchedule {
    /// The base learning rate throughout.
    #[default]
    Constant,
    /// Multiply by `gamma` every `every_steps` steps.
    Step {
        /// Steps between two decays.
        every_steps: u64,
        /// Factor applied at each decay.
        gamma: f32,
    },
    /// Cosine annealing from the base rate to `min_lr` over `total_steps`.
    Cosine {
        /// Steps over which the rate falls to `min_lr`.
        total_steps: u64,
        /// Final learning rate.
        min_lr: f32,
    },
}

impl LrSchedule {
    /// The learning rate for `step` (0-based) given the base rate.
    pub fn lr_at(&self, base_lr: f32, step: u64) -> f32 {
        match *self {
            LrSchedule::Constant => base_lr,
            LrSchedule::Step { every_steps, gamma } => {
                let decays = step.checked_div(every_steps).unwrap_or(0);
                base_lr * gamma.powi(decays.min(i32::MAX as u64) as i32)
            }
            LrSchedule::Cosine {
                total_steps,
                min_lr,
            } => {
                if total_steps == 0 {
                    return base_lr;
                }
                let progress = (step.min(total_steps) as f64) / (total_steps as f64);
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                (min_lr as f64 + (base_lr as f64 - min_lr as f64) * cos) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference_step(cfg: SgdConfig, lr: f32, w: &mut [f32], g: &[f32], v: &mut [f32]) {
        for i in 0..w.len() {
            let d = g[i] + cfg.weight_decay * w[i];
            v[i] = cfg.momentum * v[i] + d;
            w[i] -= lr * v[i];
        }
    }

    #[test]
    fn first_step_with_zero_velocity_is_plain_sgd() {
        let sgd = Sgd::new(SgdConfig {
            momentum: 0.9,
            weight_decay: 0.0,
        });
        let mut w = vec![1.0, 2.0];
        let mut v = vec![0.0; 2];
        sgd.step(0.5, &mut w, &[1.0, -2.0], &mut v);
        assert_eq!(w, vec![0.5, 3.0]);
        assert_eq!(v, vec![1.0, -2.0]);
    }

    #[test]
    fn schedules() {
        assert_eq!(LrSchedule::Constant.lr_at(0.1, 1000), 0.1);
        let s = LrSchedule::Step {
            every_steps: 10,
            gamma: 0.5,
        };
        assert_eq!(s.lr_at(1.0, 9), 1.0);
        assert_eq!(s.lr_at(1.0, 10), 0.5);
        assert_eq!(s.lr_at(1.0, 25), 0.25);
        let c = LrSchedule::Cosine {
            total_steps: 100,
            min_lr: 0.0,
        };
        assert!((c.lr_at(1.0, 0) - 1.0).abs() < 1e-6);
        assert!((c.lr_at(1.0, 50) - 0.5).abs() < 1e-6);
        assert!(c.lr_at(1.0, 100).abs() < 1e-6);
        assert!(c.lr_at(1.0, 500).abs() < 1e-6);
    }

    proptest! {
        /// Applying the update slice by slice equals applying it to the whole tensor, and both
        /// equal the textbook formula, for every code path (momentum and decay on or off).
        #[test]
        fn sliced_update_equals_whole_update(
            w in prop::collection::vec(-10.0f32..10.0, 1..300),
            cut in 0usize..300,
            momentum in prop::sample::select(vec![0.0f32, 0.9]),
            weight_decay in prop::sample::select(vec![0.0f32, 5e-4]),
        ) {
            let cfg = SgdConfig { momentum, weight_decay };
            let sgd = Sgd::new(cfg);
            let g: Vec<f32> = w.iter().map(|x| x * 0.3 - 1.0).collect();
            let cut = cut.min(w.len());
            let (mut whole, mut v_whole) = (w.clone(), vec![0.25; w.len()]);
            let (mut parts, mut v_parts) = (w.clone(), vec![0.25; w.len()]);
            let (mut refw, mut refv) = (w.clone(), vec![0.25; w.len()]);
            for _ in 0..3 {
                sgd.step(0.01, &mut whole, &g, &mut v_whole);
                let (w0, w1) = parts.split_at_mut(cut);
                let (v0, v1) = v_parts.split_at_mut(cut);
                sgd.step(0.01, w0, &g[..cut], v0);
                sgd.step(0.01, w1, &g[cut..], v1);
                reference_step(cfg, 0.01, &mut refw, &g, &mut refv);
            }
            prop_assert_eq!(&whole, &parts);
            if momentum != 0.0 {
                prop_assert_eq!(&whole, &refw);
            }
        }
    }
}
