//! Replica statistics: how far apart the workers' replicas are, and how good their exact
//! average is. Approximate strategies leave the workers with different weights, so worker
//! 0's accuracy alone does not say what the job learned.
//!
//! At every evaluation point each worker writes its weights to a snapshot file
//! ([`write_snapshot`], outside its timed training loop). After the job, `launch` reads
//! every worker's snapshot of each evaluation step, computes in f64 the exact average x̄ and
//! the divergence (the mean over the N workers of ||x_i − x̄||² / ||x̄||², 0 when ||x̄|| is
//! 0), and evaluates a model holding x̄ on the test set ([`average_replicas`]).

mod outputs;
mod snapshot;

use std::path::{Path, PathBuf};

use syncopate_train::data::Split;
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::{evaluate, Evaluation};
use syncopate_train::TrainError;

pub use outputs::{add_to_eval_csv, add_to_summary};
pub use snapshot::{
    buffers_file, clear_snapshots, read_values, remove_snapshots, snapshot_file, snapshot_steps,
    write_atomic, write_snapshot,
};

/// Samples per evaluation batch (as the workers evaluate).
const EVAL_BATCH: usize = 256;

/// Why the replica statistics could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// A snapshot file (or its folder) could not be read or written.
    #[error("replica snapshot {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A worker's snapshot is not there.
    #[error("replica snapshot {0} is missing: its worker wrote none at that evaluation point")]
    Missing(PathBuf),
    /// A snapshot of the wrong length: truncated, or of another model.
    #[error(
        "replica snapshot {path} holds {found} bytes, the model needs {expected}: \
         truncated, or written by another model"
    )]
    Size {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        found: u64,
        /// The length the model needs.
        expected: u64,
    },
    /// A row of an evaluations CSV that cannot be read.
    #[error("{0}")]
    Csv(String),
    /// The engine refused the values, or the evaluation failed.
    #[error(transparent)]
    Train(#[from] TrainError),
}

impl ReplicaError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        ReplicaError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The replicas at one evaluation point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaPoint {
    /// Steps done.
    pub step: u64,
    /// Test accuracy of the exact average of the workers' weights, a fraction.
    pub average_accuracy: f64,
    /// Test loss of the exact average.
    pub average_loss: f64,
    /// Mean over workers of ||x_i − x̄||² / ||x̄||² (0 when ||x̄|| is 0).
    pub divergence: f64,
}

/// Adds `x` to the running sum `sum`, value by value, in f64.
fn accumulate(sum: &mut [f64], x: &[f32]) {
    for (s, v) in sum.iter_mut().zip(x) {
        *s += f64::from(*v);
    }
}

/// ||x − mean||², in f64.
fn squared_distance(x: &[f32], mean: &[f64]) -> f64 {
    x.iter()
        .zip(mean)
        .map(|(v, m)| (f64::from(*v) - m).powi(2))
        .sum()
}

/// `sum_of_distances` / (workers · ||mean||²), 0 when ||mean|| is 0.
fn relative_divergence(sum_of_distances: f64, workers: usize, mean: &[f64]) -> f64 {
    let norm: f64 = mean.iter().map(|m| m * m).sum();
    if norm == 0.0 || workers == 0 {
        return 0.0;
    }
    sum_of_distances / (workers as f64 * norm)
}

/// The exact average of `replicas` (all of one length), in f64.
pub fn average(replicas: &[Vec<f32>]) -> Vec<f64> {
    let mut sum = vec![0.0; replicas.first().map_or(0, Vec::len)];
    for x in replicas {
        accumulate(&mut sum, x);
    }
    let n = replicas.len().max(1) as f64;
    sum.iter_mut().for_each(|s| *s /= n);
    sum
}

/// The mean over `replicas` of ||x_i − mean||² / ||mean||², 0 when ||mean|| is 0.
pub fn divergence(replicas: &[Vec<f32>], mean: &[f64]) -> f64 {
    let sum = replicas.iter().map(|x| squared_distance(x, mean)).sum();
    relative_divergence(sum, replicas.len(), mean)
}

/// The exact average and the divergence of the snapshots at `paths`, each `values` long,
/// read one at a time (twice: once for the average, once for the distances).
fn average_of_files(paths: &[PathBuf], values: usize) -> Result<(Vec<f64>, f64), ReplicaError> {
    let mut mean = vec![0.0; values];
    for path in paths {
        accumulate(&mut mean, &read_values(path, values)?);
    }
    let n = paths.len().max(1) as f64;
    mean.iter_mut().for_each(|s| *s /= n);
    let mut distances = 0.0;
    for path in paths {
        distances += squared_distance(&read_values(path, values)?, &mean);
    }
    Ok((
        mean.clone(),
        relative_divergence(distances, paths.len(), &mean),
    ))
}

/// Installs the flat `values` (every key in key order) into `engine`.
fn install_params(
    engine: &mut dyn LayerwiseEngine,
    values: impl IntoIterator<Item = f32>,
) -> Result<(), ReplicaError> {
    let mut values = values.into_iter();
    for key in engine.spec().keys() {
        let v: Vec<f32> = values.by_ref().take(key.numel).collect();
        engine.set_param(key.key, v)?;
    }
    Ok(())
}

/// Installs rank 0's buffers after `step` steps (batch-norm running statistics) into
/// `engine`.
fn install_buffers(
    engine: &mut dyn LayerwiseEngine,
    dir: &Path,
    step: u64,
) -> Result<(), ReplicaError> {
    let current = engine.buffers()?;
    let total = current.iter().map(|(_, v)| v.len()).sum();
    let mut values = read_values(&buffers_file(dir, step), total)?.into_iter();
    for (name, v) in current {
        engine.set_buffer(&name, values.by_ref().take(v.len()).collect())?;
    }
    Ok(())
}

/// The number of f32 values in a weight snapshot of `engine`'s model.
fn model_values(engine: &dyn LayerwiseEngine) -> usize {
    engine.spec().keys().iter().map(|k| k.numel).sum()
}

/// Reads the snapshots of ranks `0..workers` after `step` steps in `dir`, installs their
/// exact average into `engine` and evaluates it on `test`.
///
/// Buffers are not averaged: the model takes rank 0's (its batch-norm running statistics,
/// which every worker gathers on its own shard, as rank 0's own evaluation uses them), so
/// with identical replicas the average evaluates exactly as worker 0 does.
pub fn average_replicas(
    engine: &mut dyn LayerwiseEngine,
    dir: &Path,
    step: u64,
    workers: usize,
    test: &Split,
) -> Result<ReplicaPoint, ReplicaError> {
    let paths: Vec<PathBuf> = (0..workers)
        .map(|rank| snapshot_file(dir, step, rank))
        .collect();
    let (mean, divergence) = average_of_files(&paths, model_values(engine))?;
    install_params(engine, mean.into_iter().map(|m| m as f32))?;
    install_buffers(engine, dir, step)?;
    let eval = evaluate(engine, test, EVAL_BATCH)?;
    Ok(ReplicaPoint {
        step,
        average_accuracy: eval.accuracy,
        average_loss: eval.loss,
        divergence,
    })
}

/// Evaluates worker `rank`'s own snapshot after `step` steps on `test` (with rank 0's
/// buffers, as [`average_replicas`]).
pub fn evaluate_replica(
    engine: &mut dyn LayerwiseEngine,
    dir: &Path,
    step: u64,
    rank: usize,
    test: &Split,
) -> Result<Evaluation, ReplicaError> {
    let values = read_values(&snapshot_file(dir, step, rank), model_values(engine))?;
    install_params(engine, values)?;
    install_buffers(engine, dir, step)?;
    Ok(evaluate(engine, test, EVAL_BATCH)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_and_divergence_of_hand_made_replicas() {
        let replicas = vec![vec![1.0, 2.0, 3.0], vec![3.0, 2.0, 1.0]];
        let mean = average(&replicas);
        assert_eq!(mean, vec![2.0, 2.0, 2.0]);
        // ||x_i - mean||² = 2 for both, ||mean||² = 12: (2 + 2) / (2 · 12).
        assert!((divergence(&replicas, &mean) - 1.0 / 6.0).abs() < 1e-15);
        // Identical replicas: the average is each of them, and they do not diverge.
        let same = vec![vec![0.1, -7.5, 3.25]; 4];
        let mean = average(&same);
        assert_eq!(mean.iter().map(|&m| m as f32).collect::<Vec<_>>(), same[0]);
        assert_eq!(divergence(&same, &mean), 0.0);
        // A zero average: divergence 0 by definition, never NaN.
        let opposite = vec![vec![1.0, -1.0], vec![-1.0, 1.0]];
        let mean = average(&opposite);
        assert_eq!(mean, vec![0.0, 0.0]);
        assert_eq!(divergence(&opposite, &mean), 0.0);
    }

    #[test]
    fn files_give_what_vectors_give() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = vec![vec![1.0f32, 0.5, -2.0], vec![0.0, 1.5, 4.0], vec![2.0; 3]];
        let mut paths = Vec::new();
        for (rank, r) in replicas.iter().enumerate() {
            let path = snapshot_file(dir.path(), 10, rank);
            let bytes: Vec<u8> = r.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(&path, bytes).unwrap();
            paths.push(path);
        }
        let (mean, div) = average_of_files(&paths, 3).unwrap();
        assert_eq!(mean, average(&replicas));
        assert_eq!(div, divergence(&replicas, &mean));
        assert_eq!(snapshot_steps(dir.path()).unwrap(), vec![10]);
        // One short file: an error naming it, never a panic.
        std::fs::write(&paths[2], [0u8; 11]).unwrap();
        let err = average_of_files(&paths, 3).unwrap_err().to_string();
        assert!(err.contains(&paths[2].display().to_string()), "{err}");
        remove_snapshots(dir.path(), &[10], 3).unwrap();
        assert!(!dir.path().exists());
    }
}
