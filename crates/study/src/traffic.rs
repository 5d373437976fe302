//! How many bytes a run's workers had sent by the end of each step: the `sent_bytes` column
//! of their `steps-rank<R>.csv` (the bytes a worker put on all its links since its previous
//! step ended), summed step by step and averaged over the workers. What "bytes to the
//! target accuracy" and the accuracy-against-bytes curves are measured in.

use std::path::Path;

use crate::metrics::MetricsTable;

/// The mean over workers of the bytes each had sent by the end of every step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SentByStep {
    /// Entry `i`: bytes sent by the end of step `i + 1` (steps counted from 1), the mean over
    /// the workers whose rows have it.
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
            .map(|t| running_sum(&t.column("sent_bytes")))
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

    /// Bytes a worker had sent by the end of step `step` (counted from 1; 0 before the
    /// first): measured when the rows reach it, else the mean per step times `step` (NaN
    /// when that is unknown too).
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
                      tensor_p50_s,tensor_p99_s,sent_bytes";
        // Worker 1 sends twice what worker 0 sends; worker 2 (a server) is not read.
        for (rank, scale) in [(0, 1.0), (1, 2.0), (2, 100.0)] {
            let rows: String = [100.0, 0.0, 300.0]
                .iter()
                .enumerate()
                .map(|(i, b)| format!("{},0,0,0,0,0,0,0,0,0,0,{}\n", i + 1, b * scale))
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
    fn workers_with_fewer_rows_bound_the_steps() {
        let sent = SentByStep::from_workers(&[vec![1.0, 2.0, 3.0], vec![3.0, 4.0]], 10.0);
        assert_eq!(sent.by_step(2), 3.0);
        assert_eq!(sent.by_step(3), 30.0);
        assert_eq!(running_sum(&[1.0, f64::NAN, 2.0]), [1.0, 1.0, 3.0]);
    }
}
