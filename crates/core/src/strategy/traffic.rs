//! The textbook traffic of a strategy: the bytes a worker moves per step for a model of a
//! given size, to set beside what a run measures.

use super::StrategyKind;

/// The textbook bytes per step per worker of `strategy` with `workers` workers for a model
/// of `model_bytes` bytes (M below; N the workers):
///
/// - `ps`, `ps-no-overlap`, `p3`: 2M, the push of the gradients (M) and the pull of the
///   parameters (M) through the servers. This counts both directions of the worker's link:
///   what a worker *sends* is M.
/// - `allreduce`, `allreduce-no-overlap`: 2(N−1)/N·M sent (reduce-scatter and all-gather,
///   each (N−1)/N·M; a worker receives as much); 0 with one worker.
pub fn textbook_bytes_per_step(strategy: StrategyKind, workers: usize, model_bytes: f64) -> f64 {
    let n = workers.max(1) as f64;
    match strategy {
        StrategyKind::Ps | StrategyKind::PsNoOverlap | StrategyKind::P3 => 2.0 * model_bytes,
        StrategyKind::Allreduce | StrategyKind::AllreduceNoOverlap => {
            2.0 * (n - 1.0) / n * model_bytes
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_servers_move_the_model_twice_whatever_the_workers() {
        for s in [
            StrategyKind::Ps,
            StrategyKind::PsNoOverlap,
            StrategyKind::P3,
        ] {
            for n in [1, 2, 8] {
                assert_eq!(textbook_bytes_per_step(s, n, 1000.0), 2000.0);
            }
        }
    }

    #[test]
    fn ring_all_reduce_moves_two_n_minus_one_over_n() {
        for s in [StrategyKind::Allreduce, StrategyKind::AllreduceNoOverlap] {
            assert_eq!(textbook_bytes_per_step(s, 1, 1000.0), 0.0);
            assert_eq!(textbook_bytes_per_step(s, 2, 1000.0), 1000.0);
            assert_eq!(textbook_bytes_per_step(s, 4, 1000.0), 1500.0);
            // A degenerate job of no workers reads as one, never a division by zero.
            assert_eq!(textbook_bytes_per_step(s, 0, 1000.0), 0.0);
        }
    }
}
