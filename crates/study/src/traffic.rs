//! How many bytes a run's workers had sent by each evaluation: the `sent_bytes` and
//! `sent_before_bytes` columns of their `steps-rank<R>.csv` (what a worker put on all its
//! links during the step, and between the previous step's end and this one's start, where a
//! periodic average or outer step runs), summed step by step and averaged over the
//! workers. What "bytes to the target accuracy" and the accuracy-against-bytes curves are
//! measured in.

use std::path::Path;

use crate::metrics::MetricsTable;

/// The mean over workers of the bytes each had sent by the end of every step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentByStep {
    /// Entry `i`: bytes sent by the evaluation after step `i + 1` (steps counted from 1):
    /// through that step and up to the next step's start, the mean over the workers.
    cumulative: Vec<f64>,
    /// What a step costs when the rows do not cover it: the run's mean bytes per step.
    mean_per_step: f64,
}

impl SentByStep {
    /// Reads workers `0..workers`' rows in `run_dir`; `mean_per_step` stands in where no
    /// row has a step (runs from before `sent_bytes` was recorded, or without metrics).
    pub fn read(run_dir: &Path, workers: usize, mean_per_step: f64) -> Self {
        let per_worker: Vec<Vec<f64>> = (0..workers)
            .filter_map(|r| MetricsTable::read(&run_dir.join(format!("steps-rank{r}.csv"))))
            .map(|t| by_evaluation(&t.column("sent_bytes"), &t.column("sent_before_bytes")))
            .filter(|c| !c.is_empty())
            .collect();
        Self::from_workers(&per_worker, mean_per_step)
    }

    /// The mean of the workers' cumulative bytes, over the steps every one of them has.
    pub fn from_workers(per_worker: &[Vec<f64>], mean_per_step: f64) -> Self {
        let steps = per_worker.iter().map(Vec::len).min().unwrap_or(0);
        let cumulative = (0..steps)
            .map(|i| {
                per_worker
                    .iter()
                    .map(|c| c.get(i).copied().unwrap_or(0.0))
                    .sum::<f64>()
                    / per_worker.len() as f64
            })
            .collect();
        Self {
            cumulative,
            mean_per_step,
        }
    }

    /// Bytes a worker had sent by the evaluation after step `step` (counted from 1; 0 before
    /// the first): measured when the rows reach it, else the mean per step times `step`
    /// (NaN when that is unknown too).
    pub fn by_step(&self, step: u64) -> f64 {
        if step == 0 {
            return 0.0;
        }
        let index = usize::try_from(step - 1).unwrap_or(usize::MAX);
        match self.cumulative.get(index) {
            Some(&bytes) => bytes,
            None => self.mean_per_step * step as f64,
        }
    }
}

/// Per step, the bytes sent by the evaluation after it: every byte sent during and before
/// the steps up to it, and before the next step (the synchronisation that ends it, under a
/// strategy that synchronises between steps). `before` may be empty (older rows).
fn by_evaluation(during: &[f64], before: &[f64]) -> Vec<f64> {
    let before_step = |i: usize| before.get(i).copied().filter(|b| b.is_finite());
    let through = running_sum(
        &(0..during.len())
            .map(|i| during[i] + before_step(i).unwrap_or(0.0))
            .collect::<Vec<_>>(),
    );
    through
        .iter()
        .enumerate()
        .map(|(i, sum)| sum + before_step(i + 1).unwrap_or(0.0))
        .collect()
}

/// The running sum of `values` (a non-finite value counts as 0).
fn running_sum(values: &[f64]) -> Vec<f64> {
    values
        .iter()
        .scan(0.0, |sum, v| {
            if v.is_finite() {
                *sum += v;
            }
            Some(*sum)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_by_step_are_the_mean_of_the_workers_running_sums() {
        let dir = tempfile::tempdir().unwrap();
        let header = "step,t_end_s,step_s,loss,data_s,compute_s,wait_s,optimizer_s,tensors,\
                      tensor_p50_s,tensor_p99_s,sent_bytes,sent_before_bytes";
        // Worker 1 sends twice what worker 0 sends; worker 2 (a server) is not read.
        for (rank, scale) in [(0, 1.0), (1, 2.0), (2, 100.0)] {
            let rows: String = [100.0, 0.0, 300.0]
                .iter()
                .enumerate()
                .map(|(i, b)| format!("{},0,0,0,0,0,0,0,0,0,0,{},0\n", i + 1, b * scale))
                .collect();
            std::fs::write(
                dir.path().join(format!("steps-rank{rank}.csv")),
                format!("{header}\n{rows}"),
            )
            .unwrap();
        }
        let sent = SentByStep::read(dir.path(), 2, 7.0);
        assert_eq!(
            (0..=3).map(|s| sent.by_step(s)).collect::<Vec<_>>(),
            [0.0, 150.0, 150.0, 600.0]
        );
        // Past the rows: the mean per step.
        assert_eq!(sent.by_step(5), 35.0);
    }

    #[test]
    fn without_the_column_the_mean_per_step_stands_in() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("steps-rank0.csv"),
            "step,t_end_s,step_s,loss\n1,0.5,0.5,2.0\n",
        )
        .unwrap();
        let sent = SentByStep::read(dir.path(), 2, 1e6);
        assert_eq!(sent.by_step(3), 3e6);
        assert!(SentByStep::read(dir.path(), 1, f64::NAN)
            .by_step(2)
            .is_nan());
    }

    #[test]
    fn a_synchronisation_between_steps_counts_for_the_evaluation_before_it() {
        // Local SGD averaging after steps 2 and 4: its bytes go out before steps 3 and 5.
        let during = [0.0, 0.0, 0.0, 0.0, 0.0];
        let before = [0.0, 0.0, 90.0, 0.0, 90.0];
        assert_eq!(
            by_evaluation(&during, &before),
            [0.0, 90.0, 90.0, 180.0, 180.0]
        );
        // All-reduce: every step's bytes in its own step; older rows have no `before`.
        assert_eq!(by_evaluation(&[5.0, 5.0], &[]), [5.0, 10.0]);
        assert_eq!(
            by_evaluation(&[1.0, 2.0], &[f64::NAN, 4.0]),
            [5.0, 7.0],
            "{}",
            "a missing cell counts as nothing"
        );
    }

    #[test]
    fn workers_with_fewer_rows_bound_the_steps() {
        let sent = SentByStep::from_workers(&[vec![1.0, 2.0, 3.0], vec![3.0, 4.0]], 10.0);
        assert_eq!(sent.by_step(2), 3.0);
        assert_eq!(sent.by_step(3), 30.0);
        assert_eq!(running_sum(&[1.0, f64::NAN, 2.0]), [1.0, 1.0, 3.0]);
    }
}
