//! Who averages with whom on the chain strategies (ring reduce, step-wise averaging), step by
//! step, and what that mixing does in the long run.
//!
//! Every step is one *round* of the chain: the worker at the round's head is position 0 and
//! positions follow the ring to the right. In an *exact* round (ring reduce every step,
//! step-wise averaging's full syncs) the sum travels to the last position and the average
//! comes back to everyone. In a *partial* round (step-wise averaging) the worker at position
//! `k` adopts the mean of positions `0..=k` and nothing comes back. The endpoint
//! ([`crate::strategy::ChainPass`]) and the long-run analysis ([`ChainSchedule::effective_contributors`])
//! both read the rounds from here.

use serde::{Deserialize, Serialize};

use crate::strategy::Rank;

/// Where a step-wise averaging chain starts each step (`--stepwise-head`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepwiseHead {
    /// The head moves one position to the right every step.
    #[default]
    Rotate,
    /// Worker 0 is always the head (it never hears from anyone).
    Fixed,
}

impl StepwiseHead {
    /// Every choice.
    pub const ALL: [StepwiseHead; 2] = [StepwiseHead::Rotate, StepwiseHead::Fixed];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StepwiseHead::Rotate => "rotate",
            StepwiseHead::Fixed => "fixed",
        }
    }

    /// One line on what it does, for `--help`.
    pub fn description(self) -> &'static str {
        match self {
            StepwiseHead::Rotate => "the chain's head moves one worker to the right every step",
            StepwiseHead::Fixed => {
                "worker 0 always heads the chain (its weights never hear from the others)"
            }
        }
    }

    /// The head named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == name)
    }
}

/// One step's round on the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainRound {
    /// The worker at position 0.
    pub head: Rank,
    /// Whether the exact average comes back to every worker (else each adopts the mean of
    /// the positions up to its own).
    pub exact: bool,
}

/// Which chain rounds a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainSchedule {
    /// Ring reduce: every round exact, headed by worker 0 (the root is the last worker).
    RingReduce {
        /// Workers on the ring.
        workers: usize,
    },
    /// Step-wise averaging of weights.
    Stepwise {
        /// Workers on the ring.
        workers: usize,
        /// Where each round starts.
        head: StepwiseHead,
        /// Every this many steps an exact round instead (0: never).
        full_sync_every: u64,
    },
}

impl ChainSchedule {
    /// Workers on the ring (at least 1).
    pub fn workers(&self) -> usize {
        match *self {
            ChainSchedule::RingReduce { workers } | ChainSchedule::Stepwise { workers, .. } => {
                workers.max(1)
            }
        }
    }

    /// The round of step `step`. Step `t` is a full sync when `(t + 1)` is a multiple of
    /// `full_sync_every`.
    pub fn round(&self, step: u64) -> ChainRound {
        let n = self.workers() as u64;
        match *self {
            ChainSchedule::RingReduce { .. } => ChainRound {
                head: 0,
                exact: true,
            },
            ChainSchedule::Stepwise {
                head,
                full_sync_every,
                ..
            } => ChainRound {
                head: match head {
                    StepwiseHead::Rotate => (step % n) as Rank,
                    StepwiseHead::Fixed => 0,
                },
                exact: full_sync_every > 0 && (step + 1).is_multiple_of(full_sync_every),
            },
        }
    }

    /// `rank`'s position in step `step`'s chain (0 at the head).
    pub fn position(&self, rank: Rank, step: u64) -> usize {
        let n = self.workers();
        (rank % n + n - self.round(step).head) % n
    }

    /// The rank at `position` of step `step`'s chain.
    pub fn rank_at(&self, position: usize, step: u64) -> Rank {
        (self.round(step).head + position) % self.workers()
    }

    /// Steps after which the rounds repeat (from step 0).
    pub fn period(&self) -> u64 {
        match *self {
            ChainSchedule::RingReduce { .. } => 1,
            ChainSchedule::Stepwise {
                head,
                full_sync_every,
                ..
            } => {
                let heads = match head {
                    StepwiseHead::Rotate => self.workers() as u64,
                    StepwiseHead::Fixed => 1,
                };
                if full_sync_every == 0 {
                    heads
                } else {
                    lcm(heads, full_sync_every)
                }
            }
        }
    }

    /// `v W_step` for a row vector `v` indexed by rank, where `W_step` is step `step`'s
    /// averaging matrix (row `i`: the weights rank `i` gives each rank's values).
    pub fn apply_left(&self, v: &[f64], step: u64) -> Vec<f64> {
        let n = self.workers();
        let round = self.round(step);
        if round.exact {
            let mean = v.iter().sum::<f64>() / n as f64;
            return vec![mean; n];
        }
        // Row of position k averages positions 0..=k, so column j collects
        // sum over k >= j of v[k] / (k + 1): a suffix sum over positions.
        let mut out = vec![0.0; n];
        let mut suffix = 0.0;
        for pos in (0..n).rev() {
            suffix += v[self.rank_at(pos, step)] / (pos + 1) as f64;
            out[self.rank_at(pos, step)] = suffix;
        }
        out
    }

    /// The long-run share of each rank's values in the consensus: the left Perron vector
    /// `pi` of the product of the averaging matrices over one [`ChainSchedule::period`]
    /// (steps `0..period`, applied in order), normalised to sum to 1.
    pub fn long_run_shares(&self) -> Vec<f64> {
        let n = self.workers();
        let period = self.period();
        let mut pi = vec![1.0 / n as f64; n];
        for _ in 0..10_000 {
            let mut next = pi.clone();
            for step in (0..period).rev() {
                next = self.apply_left(&next, step);
            }
            let total: f64 = next.iter().sum();
            next.iter_mut().for_each(|x| *x /= total);
            let change: f64 = next.iter().zip(&pi).map(|(a, b)| (a - b).abs()).sum();
            pi = next;
            if change < 1e-13 {
                break;
            }
        }
        pi
    }

    /// The effective number of contributors `1 / sum(pi_i^2)` of the long-run mixing: the
    /// number of workers whose values the consensus weighs equally, N when every round is
    /// exact, 1 when one worker's trajectory is the consensus (a fixed head).
    pub fn effective_contributors(&self) -> f64 {
        let pi = self.long_run_shares();
        1.0 / pi.iter().map(|p| p * p).sum::<f64>()
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u64, b: u64) -> u64 {
    (a / gcd(a, b).max(1)).saturating_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stepwise(workers: usize, head: StepwiseHead, full_sync_every: u64) -> ChainSchedule {
        ChainSchedule::Stepwise {
            workers,
            head,
            full_sync_every,
        }
    }

    /// The dense averaging matrix of step `step` (row i: what rank i adopts).
    fn matrix(s: &ChainSchedule, step: u64) -> Vec<Vec<f64>> {
        let n = s.workers();
        let round = s.round(step);
        (0..n)
            .map(|i| {
                let k = s.position(i, step);
                (0..n)
                    .map(|j| {
                        if round.exact {
                            1.0 / n as f64
                        } else if s.position(j, step) <= k {
                            1.0 / (k + 1) as f64
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect()
    }

    fn mul(a: &[Vec<f64>], b: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let n = a.len();
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| (0..n).map(|k| a[i][k] * b[k][j]).sum())
                    .collect()
            })
            .collect()
    }

    /// pi by the direct route: P = W_{T-1} ... W_0 as dense matrices, then pi P = pi by
    /// repeated squaring of P (every row of P^(2^m) tends to pi).
    fn direct_contributors(s: &ChainSchedule) -> f64 {
        let n = s.workers();
        let mut p: Vec<Vec<f64>> = (0..n)
            .map(|i| (0..n).map(|j| f64::from(u8::from(i == j))).collect())
            .collect();
        for step in 0..s.period() {
            p = mul(&matrix(s, step), &p);
        }
        for _ in 0..40 {
            p = mul(&p, &p);
            for row in &mut p {
                let total: f64 = row.iter().sum();
                row.iter_mut().for_each(|x| *x /= total);
            }
        }
        1.0 / p[0].iter().map(|x| x * x).sum::<f64>()
    }

    #[test]
    fn heads_and_positions() {
        let s = stepwise(4, StepwiseHead::Rotate, 0);
        assert_eq!(s.round(5).head, 1);
        assert_eq!(s.position(1, 5), 0);
        assert_eq!(s.position(0, 5), 3);
        assert_eq!(s.rank_at(3, 5), 0);
        let f = stepwise(4, StepwiseHead::Fixed, 3);
        assert_eq!(f.round(5).head, 0);
        assert!(f.round(2).exact && f.round(5).exact && !f.round(3).exact);
        assert_eq!(f.period(), 3);
        assert_eq!(stepwise(4, StepwiseHead::Rotate, 6).period(), 12);
        assert!(ChainSchedule::RingReduce { workers: 3 }.round(7).exact);
    }

    #[test]
    fn effective_contributors_of_the_textbook_cases() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        for n in [1, 2, 3, 8] {
            let every_step = stepwise(n, StepwiseHead::Rotate, 1);
            assert!(close(every_step.effective_contributors(), n as f64));
            let ring = ChainSchedule::RingReduce { workers: n };
            assert!(close(ring.effective_contributors(), n as f64));
            let fixed = stepwise(n, StepwiseHead::Fixed, 0);
            assert!(close(fixed.effective_contributors(), 1.0), "{n}");
        }
        // Two workers, rotating: P = W1 W0 = [[3/4, 1/4], [1/2, 1/2]], pi = (2/3, 1/3).
        let two = stepwise(2, StepwiseHead::Rotate, 0);
        assert!(close(
            two.effective_contributors(),
            1.0 / (4.0 / 9.0 + 1.0 / 9.0)
        ));
    }

    #[test]
    fn effective_contributors_match_the_dense_matrix_product() {
        for n in 2..7 {
            for head in StepwiseHead::ALL {
                for h in [0, 1, 2, 5] {
                    let s = stepwise(n, head, h);
                    let (fast, direct) = (s.effective_contributors(), direct_contributors(&s));
                    assert!((fast - direct).abs() < 1e-6, "{s:?}: {fast} vs {direct}");
                    assert!((1.0..=n as f64 + 1e-9).contains(&fast), "{s:?}: {fast}");
                }
            }
        }
    }

    #[test]
    fn head_names_round_trip() {
        for h in StepwiseHead::ALL {
            assert_eq!(StepwiseHead::from_name(h.name()), Some(h));
        }
        assert_eq!(StepwiseHead::from_name("random"), None);
    }
}
