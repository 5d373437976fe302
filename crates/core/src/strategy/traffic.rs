//! The textbook traffic of a strategy: the bytes a worker moves per step for a model of a
//! given size, to set beside what a run measures.

use super::StrategyKind;

/// The textbook bytes a worker *sends* per step, as a mean over the workers, under `strategy`
/// with `workers` workers for a model of `model_bytes` bytes (M below; N the workers), to
/// set beside the measured `bytes_per_step`:
///
/// - `ps`, `ps-no-overlap`, `p3`: M. The model goes through the servers twice per step (2M
///   per worker: the push of the gradients and the pull of the parameters); a worker sends
///   the push and receives the pull.
/// - `allreduce`, `allreduce-no-overlap`: 2(N−1)/N·M (reduce-scatter and all-gather, each
///   (N−1)/N·M); 0 with one worker.
/// - `dlcp`: M as well (at most: a share complete at its loss bound stops early; packet
///   headers, probes and resent packets come on top).
/// - `ring-reduce`: 2(N−1)/N·M. The sum travels N−1 hops of M and the average N−1 hops
///   again: the head of the chain (worker 0) and the workers after it send 2M, the root
///   (the last worker) and the worker before it M.
/// - `stepwise`: (N−1)/N·M: one pass of M along N−1 hops, nothing back (steps that are full
///   syncs cost as ring reduce). Each worker sends M except the last of the step's chain:
///   with a fixed head, worker 0 always sends M and the last worker nothing.
/// - `local-sgd`, `diloco`: 2(N−1)/N·M on a sync step (ring all-reduce of the weights or
///   of the outer gradient), nothing in between; [`super::SyncPlan::textbook_bytes_per_step`]
///   spreads it over the period.
/// - `gossip`: 2M, the model to each ring neighbour (M with two workers, 0 alone),
///   whatever N.
///
/// A run's measured `bytes_per_step` is worker 0's, so on the chain strategies it is not
/// the mean this returns.
pub fn textbook_bytes_per_step(strategy: StrategyKind, workers: usize, model_bytes: f64) -> f64 {
    let n = workers.max(1) as f64;
    let hops = (n - 1.0) / n;
    match strategy {
        StrategyKind::Ps | StrategyKind::PsNoOverlap | StrategyKind::P3 | StrategyKind::Dlcp => {
            model_bytes
        }
        StrategyKind::Allreduce
        | StrategyKind::AllreduceNoOverlap
        | StrategyKind::RingReduce
        | StrategyKind::DlcpAllreduce
        | StrategyKind::LocalSgd
        | StrategyKind::Diloco => 2.0 * hops * model_bytes,
        StrategyKind::Stepwise => hops * model_bytes,
        // Each neighbour gets the whole model (one neighbour with two workers, none alone).
        StrategyKind::Gossip => (workers.clamp(1, 3) - 1) as f64 * model_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_server_workers_send_the_model_once_whatever_the_workers() {
        for s in [
            StrategyKind::Ps,
            StrategyKind::PsNoOverlap,
            StrategyKind::P3,
        ] {
            for n in [1, 2, 8] {
                assert_eq!(textbook_bytes_per_step(s, n, 1000.0), 1000.0);
            }
        }
    }

    #[test]
    fn ring_all_reduce_moves_two_n_minus_one_over_n() {
        for s in [
            StrategyKind::Allreduce,
            StrategyKind::AllreduceNoOverlap,
            StrategyKind::RingReduce,
        ] {
            assert_eq!(textbook_bytes_per_step(s, 1, 1000.0), 0.0);
            assert_eq!(textbook_bytes_per_step(s, 2, 1000.0), 1000.0);
            assert_eq!(textbook_bytes_per_step(s, 4, 1000.0), 1500.0);
            // A degenerate job of no workers reads as one, never a division by zero.
            assert_eq!(textbook_bytes_per_step(s, 0, 1000.0), 0.0);
        }
    }

    #[test]
    fn stepwise_sends_the_model_once_along_the_chain() {
        assert_eq!(
            textbook_bytes_per_step(StrategyKind::Stepwise, 4, 1000.0),
            750.0
        );
        assert_eq!(
            textbook_bytes_per_step(StrategyKind::Stepwise, 1, 1000.0),
            0.0
        );
    }
}
