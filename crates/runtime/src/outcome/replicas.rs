//! A job's replica statistics: where the workers write their weight snapshots, and, after
//! the job, the exact average's accuracy and the replicas' divergence at every evaluation
//! point, written into the job's outputs (the arithmetic is [`crate::replicas`]'s).

use std::path::{Path, PathBuf};

use syncopate_train::data::Split;
use syncopate_train::engine::BurnEngine;
use syncopate_train::model::ModelSpec;
use syncopate_train::TrainError;

use super::summary::{read_json, SummaryError};
use crate::replicas::{
    add_to_eval_csv, add_to_summary, average_replicas, clear_snapshots, evaluate_replica,
    remove_snapshots, snapshot_steps, write_atomic, ReplicaError, ReplicaPoint,
};

/// Why a job's replica statistics could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaStatsError {
    /// A snapshot could not be read, or the average evaluated.
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    /// The engine could not be built.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The job's summary could not be read.
    #[error(transparent)]
    Summary(#[from] SummaryError),
    /// The evaluations CSV could not be extended.
    #[error("in {}", path.display())]
    EvalCsv {
        /// The CSV file.
        path: PathBuf,
        /// Why.
        #[source]
        source: ReplicaError,
    },
    /// The workers wrote no snapshot.
    #[error("the workers wrote no replica snapshot into {}", .0.display())]
    NoSnapshots(PathBuf),
}

/// The folder the workers of a job write their snapshots to, cleared of any earlier
/// job's: `replica_dir`, else `metrics_dir/replicas`, else a fresh temporary folder.
pub fn snapshot_dir(
    replica_dir: Option<&Path>,
    metrics_dir: Option<&Path>,
) -> Result<PathBuf, ReplicaError> {
    let dir = match (replica_dir, metrics_dir) {
        (Some(dir), _) => dir.to_path_buf(),
        (None, Some(metrics)) => metrics.join("replicas"),
        (None, None) => temporary_dir(),
    };
    clear_snapshots(&dir)?;
    Ok(dir)
}

/// A fresh folder name under the system's temporary folder.
fn temporary_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("syncopate-replicas-{}-{nanos}", std::process::id()))
}

/// Where a job's replica statistics go, besides the line [`report`] returns.
pub struct ReplicaOutputs<'a> {
    /// `--metrics-dir`: its `evals-rank0.csv` gains the replica columns.
    pub metrics_dir: Option<&'a Path>,
    /// `--summary-json`: the summary gains the replica statistics.
    pub summary_json: Option<&'a Path>,
    /// Keep the snapshots once used (`--keep-replicas`).
    pub keep: bool,
}

/// After a successful job of `workers` workers training `spec` (seeded `seed`): the
/// replica statistics of every evaluation step in `dir` on `test`, into the `outputs`;
/// then the snapshots are removed unless kept.
pub fn report(
    spec: ModelSpec,
    seed: u64,
    test: &Split,
    workers: usize,
    dir: &Path,
    outputs: &ReplicaOutputs<'_>,
) -> Result<ReplicaReport, ReplicaStatsError> {
    let mut engine = BurnEngine::new(spec, seed)?;
    let steps = snapshot_steps(dir)?;
    let points = steps
        .iter()
        .map(|&step| average_replicas(&mut engine, dir, step, workers, test))
        .collect::<Result<Vec<ReplicaPoint>, _>>()?;
    let Some(last) = points.last() else {
        return Err(ReplicaStatsError::NoSnapshots(dir.to_path_buf()));
    };
    let worker0 = evaluate_replica(&mut engine, dir, last.step, 0, test)?;
    if let Some(metrics) = outputs.metrics_dir {
        update_eval_csv(&metrics.join("evals-rank0.csv"), &points)?;
    }
    if let Some(path) = outputs.summary_json {
        update_summary(path, &points)?;
    }
    if !outputs.keep {
        remove_snapshots(dir, &steps, workers)?;
    }
    Ok(ReplicaReport {
        last: *last,
        worker0_accuracy: worker0.accuracy,
    })
}

/// The replicas at the last evaluation point.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaReport {
    /// The exact average's figures and the divergence.
    pub last: ReplicaPoint,
    /// Worker 0's own test accuracy there.
    pub worker0_accuracy: f64,
}

impl ReplicaReport {
    /// The figures in one line.
    pub fn describe(&self) -> String {
        format!(
            "replicas: divergence {:.3e}, average accuracy {:.2} % (worker 0: {:.2} %)",
            self.last.divergence,
            self.last.average_accuracy * 100.0,
            self.worker0_accuracy * 100.0
        )
    }
}

/// Appends the replica columns to worker 0's evaluations CSV, if it wrote one.
fn update_eval_csv(path: &Path, points: &[ReplicaPoint]) -> Result<(), ReplicaStatsError> {
    let Ok(csv) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let text = add_to_eval_csv(&csv, points).map_err(|source| ReplicaStatsError::EvalCsv {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(write_atomic(path, text.as_bytes())?)
}

/// Fills the replica statistics into the summary JSON worker 0 wrote.
fn update_summary(path: &Path, points: &[ReplicaPoint]) -> Result<(), ReplicaStatsError> {
    let mut json = read_json(path)?;
    add_to_summary(&mut json, points);
    let text = serde_json::to_string_pretty(&json).map_err(SummaryError::Encode)? + "\n";
    Ok(write_atomic(path, text.as_bytes())?)
}
