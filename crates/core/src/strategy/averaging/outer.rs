//! DiLoCo's outer optimizer: the weights every worker held after the last outer step (the
//! *anchor*), and Nesterov momentum over the averaged change since then.
//!
//! After H inner steps each worker hands over its weights `w_i`; what is averaged is the
//! *outer gradient* `d_i = anchor - w_i`, so the mean `d` points from the workers' average
//! back to the anchor. The outer step is SGD with Nesterov momentum on `d`, as PyTorch's
//! `SGD(nesterov=True)` writes it:
//!
//! ```text
//! v      = momentum * v + d
//! anchor = anchor - lr * (d + momentum * v)
//! ```
//!
//! and every worker goes on from the new anchor. With `lr = 1` and `momentum = 0` the outer
//! step is plain averaging: `anchor - (anchor - mean(w)) = mean(w)`, local SGD.

use serde::{Deserialize, Serialize};

/// The outer optimizer's settings (`--outer-lr`, `--outer-momentum`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OuterOptions {
    /// Outer learning rate (DiLoCo's 0.7 by default).
    pub lr: f32,
    /// Outer Nesterov momentum (DiLoCo's 0.9 by default; 0: none).
    pub momentum: f32,
}

impl Default for OuterOptions {
    fn default() -> Self {
        Self {
            lr: 0.7,
            momentum: 0.9,
        }
    }
}

impl OuterOptions {
    /// Refuses settings the outer step cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        if !self.lr.is_finite() || self.lr <= 0.0 {
            return Err(format!("--outer-lr {}: must be a positive number", self.lr));
        }
        if !self.momentum.is_finite() || !(0.0..1.0).contains(&self.momentum) {
            return Err(format!(
                "--outer-momentum {}: must be in [0, 1)",
                self.momentum
            ));
        }
        Ok(())
    }
}

/// One worker's outer optimizer: the anchor and the momentum of every key.
#[derive(Debug, Clone, PartialEq)]
pub struct OuterNesterov {
    options: OuterOptions,
    anchor: Vec<Vec<f32>>,
    velocity: Vec<Vec<f32>>,
}

impl OuterNesterov {
    /// An optimizer over keys of `sizes` values, anchored at zero until
    /// [`OuterNesterov::set_anchor`] gives the initial weights.
    pub fn new(sizes: &[usize], options: OuterOptions) -> Self {
        let zeros = || sizes.iter().map(|&n| vec![0.0; n]).collect::<Vec<_>>();
        Self {
            options,
            anchor: zeros(),
            velocity: zeros(),
        }
    }

    /// The weights of `key` at the last outer step (the initial weights before the first).
    pub fn anchor(&self, key: usize) -> &[f32] {
        self.anchor.get(key).map_or(&[], |a| a.as_slice())
    }

    /// Sets `key`'s anchor (the job's initial weights); values beyond the key are ignored.
    pub fn set_anchor(&mut self, key: usize, values: &[f32]) {
        if let Some(a) = self.anchor.get_mut(key) {
            let n = a.len().min(values.len());
            a[..n].copy_from_slice(&values[..n]);
        }
    }

    /// Writes the outer gradient `anchor - weights` of `key` into `out` (as many values as
    /// all three hold).
    pub fn outer_gradient(&self, key: usize, weights: &[f32], out: &mut [f32]) {
        for ((o, a), w) in out.iter_mut().zip(self.anchor(key)).zip(weights) {
            *o = a - w;
        }
    }

    /// Applies the outer step to `key` with the workers' mean outer gradient; returns the
    /// new anchor, the weights every worker goes on from.
    pub fn step(&mut self, key: usize, mean: &[f32]) -> &[f32] {
        let OuterOptions { lr, momentum } = self.options;
        let (Some(anchor), Some(velocity)) = (self.anchor.get_mut(key), self.velocity.get_mut(key))
        else {
            return &[];
        };
        for ((a, v), d) in anchor.iter_mut().zip(velocity.iter_mut()).zip(mean) {
            *v = momentum * *v + d;
            *a -= lr * (d + momentum * *v);
        }
        anchor
    }

    /// What a checkpoint keeps: every key's anchor, then every key's momentum.
    pub fn state(&self) -> Vec<Vec<f32>> {
        self.anchor.iter().chain(&self.velocity).cloned().collect()
    }

    /// Restores what [`OuterNesterov::state`] gave; refuses a state of other keys.
    pub fn restore(&mut self, state: Vec<Vec<f32>>) -> Result<(), String> {
        let keys = self.anchor.len();
        let fits = state.len() == 2 * keys
            && state
                .iter()
                .zip(self.anchor.iter().chain(&self.velocity))
                .all(|(s, own)| s.len() == own.len());
        if !fits {
            return Err(format!(
                "the outer optimizer's state has {} tensors, not the anchor and momentum of \
                 this model's {keys} keys",
                state.len()
            ));
        }
        let mut state = state.into_iter();
        self.anchor = state.by_ref().take(keys).collect();
        self.velocity = state.collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outer_step_is_nesterov_momentum_on_the_mean_change() {
        let options = OuterOptions {
            lr: 0.5,
            momentum: 0.9,
        };
        let mut outer = OuterNesterov::new(&[2], options);
        outer.set_anchor(0, &[1.0, -2.0]);
        let mut d = [0.0; 2];
        outer.outer_gradient(0, &[0.5, -1.0], &mut d);
        assert_eq!(d, [0.5, -1.0]);
        // v = 0.9 * 0 + d = d; anchor -= 0.5 * (d + 0.9 d) = 0.95 d.
        assert_eq!(outer.step(0, &[0.5, -1.0]), &[1.0 - 0.475, -2.0 + 0.95]);
        // Second step with mean change (0.1, 0.2): v = 0.9 * (0.5, -1) + (0.1, 0.2)
        // = (0.55, -0.7); anchor -= 0.5 * ((0.1, 0.2) + 0.9 * (0.55, -0.7)).
        let expect = [
            0.525 - 0.5 * (0.1 + 0.9 * 0.55),
            -1.05 - 0.5 * (0.2 + 0.9 * -0.7),
        ];
        let got = outer.step(0, &[0.1, 0.2]).to_vec();
        for (g, e) in got.iter().zip(expect) {
            assert!((g - e).abs() < 1e-6, "{got:?} vs {expect:?}");
        }
    }

    #[test]
    fn unit_rate_without_momentum_is_plain_averaging() {
        let plain = OuterOptions {
            lr: 1.0,
            momentum: 0.0,
        };
        let mut outer = OuterNesterov::new(&[3], plain);
        outer.set_anchor(0, &[4.0, 0.0, -1.0]);
        let workers = [[3.0, 1.0, -1.0], [1.0, -1.0, 0.0]];
        let mut mean = [0.0f32; 3];
        for w in &workers {
            let mut d = [0.0; 3];
            outer.outer_gradient(0, w, &mut d);
            mean.iter_mut().zip(d).for_each(|(m, d)| *m += d / 2.0);
        }
        assert_eq!(outer.step(0, &mean), &[2.0, 0.0, -0.5]);
    }

    #[test]
    fn state_round_trips_and_refuses_other_shapes() {
        let mut outer = OuterNesterov::new(&[2, 1], OuterOptions::default());
        outer.set_anchor(1, &[3.0]);
        outer.step(0, &[1.0, 1.0]);
        let state = outer.state();
        assert_eq!(state.len(), 4);
        let mut other = OuterNesterov::new(&[2, 1], OuterOptions::default());
        other.restore(state.clone()).unwrap();
        assert_eq!(other, outer);
        let mut wrong = OuterNesterov::new(&[2, 2], OuterOptions::default());
        assert!(wrong.restore(state).is_err());
        assert!(OuterOptions {
            lr: 0.0,
            momentum: 0.5
        }
        .validate()
        .is_err());
        assert!(OuterOptions {
            lr: 0.7,
            momentum: 1.0
        }
        .validate()
        .is_err());
    }
}
