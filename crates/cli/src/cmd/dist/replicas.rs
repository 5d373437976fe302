//! `launch`'s replica statistics: where the workers write their weight snapshots, and,
//! after the job, the exact average's accuracy and the replicas' divergence at every
//! evaluation point, written into the job's outputs (see `syncopate_runtime::replicas`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use syncopate_runtime::replicas::{
    add_to_eval_csv, add_to_summary, average_replicas, clear_snapshots, evaluate_replica,
    remove_snapshots, snapshot_steps, write_atomic, ReplicaPoint,
};
use syncopate_train::engine::BurnEngine;
use syncopate_train::model;

use super::JobArgs;

/// The folder the workers of this `launch` write their snapshots to, cleared of any
/// earlier job's; `None` with `--no-replica-stats` or for a profile model (no test set).
pub fn snapshot_dir(args: &JobArgs) -> Result<Option<PathBuf>> {
    if args.no_replica_stats || model::is_profile_name(&args.settings.model) {
        return Ok(None);
    }
    let dir = match (&args.replica_dir, &args.metrics_dir) {
        (Some(dir), _) => dir.clone(),
        (None, Some(metrics)) => metrics.join("replicas"),
        (None, None) => temporary_dir(),
    };
    clear_snapshots(&dir)?;
    Ok(Some(dir))
}

/// A fresh folder name under the system's temporary folder.
fn temporary_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("syncopate-replicas-{}-{nanos}", std::process::id()))
}

/// After a successful job: the replica statistics of every evaluation step in `dir`, into
/// evals-rank0.csv (--metrics-dir) and --summary-json, and one line on stdout; then the
/// snapshots are removed unless --keep-replicas.
pub fn report(args: &JobArgs, workers: usize, dir: &Path) -> Result<()> {
    let (spec, data) = args.model_and_data()?;
    let mut engine = BurnEngine::new(spec, args.settings.seed)?;
    let steps = snapshot_steps(dir)?;
    let points = steps
        .iter()
        .map(|&step| average_replicas(&mut engine, dir, step, workers, &data.test))
        .collect::<Result<Vec<ReplicaPoint>, _>>()?;
    let Some(last) = points.last() else {
        bail!(
            "the workers wrote no replica snapshot into {}",
            dir.display()
        );
    };
    let worker0 = evaluate_replica(&mut engine, dir, last.step, 0, &data.test)?;
    if let Some(metrics) = &args.metrics_dir {
        update_eval_csv(&metrics.join("evals-rank0.csv"), &points)?;
    }
    if let Some(path) = &args.summary_json {
        update_summary(path, &points)?;
    }
    println!(
        "replicas: divergence {:.3e}, average accuracy {:.2} % (worker 0: {:.2} %)",
        last.divergence,
        last.average_accuracy * 100.0,
        worker0.accuracy * 100.0
    );
    if args.keep_replicas {
        eprintln!("replica snapshots kept in {}", dir.display());
    } else {
        remove_snapshots(dir, &steps, workers)?;
    }
    Ok(())
}

/// Appends the replica columns to worker 0's evaluations CSV, if it wrote one.
fn update_eval_csv(path: &Path, points: &[ReplicaPoint]) -> Result<()> {
    let Ok(csv) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let text = add_to_eval_csv(&csv, points).with_context(|| format!("in {}", path.display()))?;
    Ok(write_atomic(path, text.as_bytes())?)
}

/// Fills the replica statistics into the summary JSON worker 0 wrote.
fn update_summary(path: &Path, points: &[ReplicaPoint]) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut json: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    add_to_summary(&mut json, points);
    let text = serde_json::to_string_pretty(&json)? + "\n";
    Ok(write_atomic(path, text.as_bytes())?)
}
