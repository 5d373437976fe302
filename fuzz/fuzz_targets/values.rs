//! What the values a worker of the fuzzed cluster receives may be.
//!
//! Every worker hands the same gradient every step, so without loss every average is that
//! gradient, and under parameter servers every parameter is the honest SGD trajectory
//! (pushes summed in rank order, then the mean, as the server computes it): checked to 1e-4
//! relative.
//!
//! Under DLCP's loss bounds the values may legitimately differ, and what the contract still
//! promises is checked entry by entry (to the same tolerance):
//!
//! * a lost push contribution counts as zero (`LossFill::Zero`: the entry's average is
//!   `k / n` of the gradient for the `k` of `n` contributions that arrived) or the sum is
//!   rescaled over those that arrived (`LossFill::Rescale`: the gradient itself, or zero if
//!   none did). Either way the average of an entry lies between 0 and the gradient;
//! * a lost pull (or all-gather) packet leaves the entry at the value of an earlier step.
//!
//! So an all-reduce value lies between 0 and the gradient, and a parameter lies within the
//! envelope of every trajectory whose per-step gradient does (computed by interval
//! arithmetic on the SGD update), widened to every step so far for stale pulls. A doubled,
//! misplaced, unscaled or uninitialised contribution falls outside. The exact check applies
//! as long as the job's loss counters (servers' filled values, workers' filled and stale
//! values) are zero: a value handed out after a fill is counted after it.

use syncopate_core::optim::{LrSchedule, Sgd, SgdConfig};

/// Relative tolerance of every comparison.
const TOLERANCE: f64 = 1e-4;
/// Base learning rate of the fuzzed jobs' servers.
pub const BASE_LR: f32 = 0.1;

/// A closed interval `[lo, hi]` of values one entry may take.
#[derive(Debug, Clone, Copy)]
struct Span {
    lo: f64,
    hi: f64,
}

impl Span {
    fn point(x: f32) -> Self {
        Self {
            lo: f64::from(x),
            hi: f64::from(x),
        }
    }

    /// The values between 0 and `g`: an average of `g`'s with some contributions lost.
    fn zero_to(g: f32) -> Self {
        let g = f64::from(g);
        Self {
            lo: g.min(0.0),
            hi: g.max(0.0),
        }
    }

    fn hull(self, o: Span) -> Self {
        Self {
            lo: self.lo.min(o.lo),
            hi: self.hi.max(o.hi),
        }
    }

    fn holds(self, x: f32) -> bool {
        let x = f64::from(x);
        let slack = |b: f64| TOLERANCE * b.abs().max(1.0);
        x >= self.lo - slack(self.lo) && x <= self.hi + slack(self.hi)
    }
}

/// The servers' parameters step by step: the honest trajectory and the envelope of the
/// lossy ones.
pub struct ServerModel {
    sgd: Sgd,
    config: SgdConfig,
    schedule: LrSchedule,
    workers: usize,
    grad: Vec<f32>,
    /// Parameters per key after each step so far (index 0: the initial values).
    exact: Vec<Vec<Vec<f32>>>,
    velocity: Vec<Vec<f32>>,
    /// Envelope of the parameters and momentum after the latest step, under any push loss.
    params_span: Vec<Vec<Span>>,
    velocity_span: Vec<Vec<Span>>,
    /// Per step (index as `exact`): the hull of the envelopes of steps 1 to it (what a
    /// worker whose pulls lost packets may still hold).
    reach: Vec<Vec<Vec<Span>>>,
}

impl ServerModel {
    /// Servers starting from `init` with SGD `config`, learning-rate `schedule` and `workers`
    /// workers that each push `grad` (its first `len` values for a key of `len`).
    pub fn new(
        config: SgdConfig,
        schedule: LrSchedule,
        workers: usize,
        grad: Vec<f32>,
        init: Vec<Vec<f32>>,
    ) -> Self {
        let spans: Vec<Vec<Span>> = init
            .iter()
            .map(|k| k.iter().copied().map(Span::point).collect())
            .collect();
        Self {
            sgd: Sgd::new(config),
            config,
            schedule,
            workers,
            grad,
            velocity: init.iter().map(|k| vec![0.0; k.len()]).collect(),
            velocity_span: init
                .iter()
                .map(|k| vec![Span::point(0.0); k.len()])
                .collect(),
            params_span: spans.clone(),
            reach: vec![spans],
            exact: vec![init],
        }
    }

    /// Adds the next step: the honest update, and the envelope's.
    fn advance(&mut self) {
        let s = self.exact.len() as u64 - 1;
        let lr = self.schedule.lr_at(BASE_LR, s);
        let mut next = self.exact[self.exact.len() - 1].clone();
        for (p, v) in next.iter_mut().zip(self.velocity.iter_mut()) {
            let mut acc = vec![0.0f32; p.len()];
            for _ in 0..self.workers {
                for (a, g) in acc.iter_mut().zip(&self.grad[..p.len()]) {
                    *a += g;
                }
            }
            let inv = 1.0 / self.workers as f32;
            acc.iter_mut().for_each(|a| *a *= inv);
            self.sgd.step(lr, p, &acc, v);
        }
        self.exact.push(next);
        // v' = m v + a + d p and p' = p - lr v' = (1 - lr d) p - lr m v - lr a are monotone
        // in p, v and a (lr, m, d >= 0 and lr d <= 1), so the bounds map to bounds.
        let (lr, m, d) = (
            f64::from(lr),
            f64::from(self.config.momentum),
            f64::from(self.config.weight_decay),
        );
        let previous = self.reach.last().cloned().unwrap_or_default();
        let first = self.reach.len() == 1;
        for (ps, vs) in self
            .params_span
            .iter_mut()
            .zip(self.velocity_span.iter_mut())
        {
            for (i, (p, v)) in ps.iter_mut().zip(vs.iter_mut()).enumerate() {
                let a = Span::zero_to(self.grad[i]);
                let nv = Span {
                    lo: m * v.lo + a.lo + d * p.lo,
                    hi: m * v.hi + a.hi + d * p.hi,
                };
                let np = Span {
                    lo: (1.0 - lr * d) * p.lo - lr * m * v.hi - lr * a.hi,
                    hi: (1.0 - lr * d) * p.hi - lr * m * v.lo - lr * a.lo,
                };
                *p = np;
                *v = nv;
            }
        }
        let reach = self
            .params_span
            .iter()
            .zip(&previous)
            .map(|(now, before)| {
                now.iter()
                    .zip(before)
                    .map(|(&n, &b)| if first { n } else { n.hull(b) })
                    .collect()
            })
            .collect();
        self.reach.push(reach);
    }

    /// Makes sure step `step`'s parameters are known; `None` beyond any step an input
    /// reaches.
    fn reach_step(&mut self, step: u64) -> Option<usize> {
        let step = usize::try_from(step).ok().filter(|&s| s < 100_000)?;
        while self.exact.len() <= step + 1 {
            self.advance();
        }
        Some(step + 1)
    }
}

/// What the values a worker receives must be.
pub enum Expect {
    /// The input every worker hands (an average of identical inputs).
    Input(Vec<f32>),
    /// The parameters after the step's update by the servers.
    ServerUpdate(Box<ServerModel>),
}

impl Expect {
    /// Checks `values` that worker `w` received for `key` (of `len` values) at `step`;
    /// `lossy` once the job has lost a packet. Panics, saying what differs, where they
    /// break the contract.
    pub fn check(
        &mut self,
        w: usize,
        (step, key, len): (u64, usize, usize),
        values: &[f32],
        lossy: bool,
    ) {
        let (exact, spans): (&[f32], Vec<Span>) = match self {
            Expect::Input(grad) => {
                let want = &grad[..len];
                (want, want.iter().copied().map(Span::zero_to).collect())
            }
            Expect::ServerUpdate(model) => {
                let Some(at) = model.reach_step(step) else {
                    return;
                };
                let spans = model.reach[at][key].clone();
                (&model.exact[at][key], spans)
            }
        };
        assert_eq!(
            values.len(),
            exact.len(),
            "rank {w}: key {key} has {} values",
            values.len()
        );
        for (i, (&got, &want)) in values.iter().zip(exact).enumerate() {
            if lossy {
                let span = spans[i];
                assert!(
                    span.holds(got),
                    "rank {w}, step {step}, key {key}[{i}]: received {got}, outside [{}, {}], \
                     what any loss within the bounds allows (the lossless result is {want})",
                    span.lo,
                    span.hi
                );
            } else {
                assert!(
                    Span::point(want).holds(got),
                    "rank {w}, step {step}, key {key}[{i}]: received {got}, the honest result \
                     is {want} (no dishonest frame was written into any endpoint, no packet \
                     was lost)"
                );
            }
        }
    }
}
