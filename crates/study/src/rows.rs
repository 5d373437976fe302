//! The figures of a study's finished runs: one [`RunRow`] per run, read from its typed
//! summary (`summary.json`) and its processes' resource CSVs.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use syncopate_core::latency::Percentiles;
use syncopate_core::net::parse_bandwidth;
use syncopate_report::summary::JobSummary;
use syncopate_runtime::worker::{EvalPoint, WorkerSummary};
use syncopate_train::model::{self, LayerOp};

use crate::config::{RunSpec, StudyConfig};
use crate::csv_format;
use crate::metrics::{worker_resources, MetricsTable, WorkerResources};
use crate::traffic::SentByStep;

/// A run's `summary.json`: worker 0's part read as the runtime writes it.
pub type Summary = JobSummary<WorkerSummary>;

/// The figures of one finished run: one row of `results.csv`, whose columns are these fields
/// in this order (each number written as the column's format says).
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// Run id.
    pub id: String,
    /// Model.
    pub model: String,
    /// Variant label.
    pub variant: String,
    /// The network's name (the bandwidth as written for an entry of `bandwidths`).
    pub network: String,
    /// Bandwidth as written.
    pub bandwidth: String,
    /// Bandwidth in Gbit/s (NaN when unlimited).
    #[serde(serialize_with = "csv_format::plain")]
    pub bandwidth_gbps: f64,
    /// One-way latency of every link, milliseconds.
    #[serde(serialize_with = "csv_format::plain")]
    pub latency_ms: f64,
    /// Workers.
    pub workers: usize,
    /// Seed.
    pub seed: u64,
    /// Mean step time after the warm-up steps, seconds: from one step's end to the next on
    /// worker 0's training clock (a synchronisation between steps included, evaluations
    /// not), or the mean of the steps' own durations for runs without per-step rows.
    #[serde(serialize_with = "csv_format::f4")]
    pub step_seconds: f64,
    /// Samples per second over all workers, after the warm-up.
    #[serde(serialize_with = "csv_format::f2")]
    pub samples_per_sec: f64,
    /// Ideal samples/s: workers x batch / max(compute, communication); NaN when unknown.
    #[serde(serialize_with = "csv_format::f2")]
    pub ideal_samples_per_sec: f64,
    /// Measured over ideal.
    #[serde(serialize_with = "csv_format::f4")]
    pub fraction_of_ideal: f64,
    /// Per-step seconds of compute and of waiting on communication (worker 0).
    #[serde(serialize_with = "csv_format::f4")]
    pub compute_per_step: f64,
    /// Seconds per step blocked on communication (worker 0).
    #[serde(serialize_with = "csv_format::f4")]
    pub wait_per_step: f64,
    /// Test accuracy (NaN for profile replays).
    #[serde(serialize_with = "csv_format::f4")]
    pub test_accuracy: f64,
    /// Wall time of the training loop, seconds.
    #[serde(serialize_with = "csv_format::f2")]
    pub wall_seconds: f64,
    /// The target accuracy of the run (NaN without one).
    #[serde(serialize_with = "csv_format::plain")]
    pub target_accuracy: f64,
    /// Training seconds until an evaluation first reached the target (NaN: never, or no
    /// target).
    #[serde(serialize_with = "csv_format::f2", rename = "time_to_accuracy_s")]
    pub time_to_accuracy: f64,
    /// Final test accuracy of the exact average of all replicas (NaN: not recorded).
    #[serde(serialize_with = "csv_format::f4")]
    pub average_accuracy: f64,
    /// Final replica divergence, mean over workers of ||x_i - mean||^2 / ||mean||^2 (NaN: not
    /// recorded).
    #[serde(serialize_with = "csv_format::e3")]
    pub divergence: f64,
    /// Bytes sent per step per worker, measured (NaN: not recorded).
    #[serde(serialize_with = "csv_format::f0")]
    pub bytes_per_step: f64,
    /// Bytes per step per worker the strategy needs on paper (NaN: not recorded).
    #[serde(serialize_with = "csv_format::f0")]
    pub textbook_bytes_per_step: f64,
    /// Mean CPU per worker, % of one core (NaN: no metrics).
    #[serde(serialize_with = "csv_format::f1")]
    pub mean_cpu_percent: f64,
    /// Peak resident memory per worker, bytes (mean over workers; NaN: no metrics).
    #[serde(serialize_with = "csv_format::f0")]
    pub peak_rss_bytes: f64,
    /// Bytes sent on the links per worker over the run (NaN: no metrics).
    #[serde(serialize_with = "csv_format::f0")]
    pub net_bytes: f64,
    /// Bytes read and written on storage per worker over the run (NaN: no metrics).
    #[serde(serialize_with = "csv_format::f0")]
    pub disk_bytes: f64,
    /// Frames worker 0 lost on the emulated network; in a kernel study, the packets the
    /// kernel dropped at the bottleneck (qdisc tail drops, nftables' random and blackout
    /// drops: `kernel.json`) (NaN: not recorded).
    #[serde(serialize_with = "csv_format::plain")]
    pub frames_lost: f64,
    /// Fraction of gradient values a loss-tolerant strategy filled in (NaN: not one).
    #[serde(serialize_with = "csv_format::f6")]
    pub realised_loss: f64,
    /// Worker 0's median per-tensor completion time, seconds (NaN: not recorded).
    #[serde(serialize_with = "csv_format::f6")]
    pub tensor_p50_s: f64,
    /// Its 99th percentile, seconds (NaN: not recorded).
    #[serde(serialize_with = "csv_format::f6")]
    pub tensor_p99_s: f64,
    /// Steps until an evaluation first reached the target (NaN: never, or no target).
    #[serde(serialize_with = "csv_format::plain")]
    pub steps_to_accuracy: f64,
    /// Bytes a worker sent (mean over workers) until that evaluation: measured step by step
    /// where the rows record it, else bytes per step times those steps (NaN: not reached).
    #[serde(serialize_with = "csv_format::f0")]
    pub bytes_to_accuracy: f64,
    /// Compute utilisation of worker 0: its forward, backward and optimizer seconds over the
    /// training loop's wall seconds (evaluations excluded); for a simulated run, the
    /// profile's forward and backward over the simulated step time (NaN: not recorded).
    #[serde(serialize_with = "csv_format::f4")]
    pub compute_utilisation: f64,
    /// Rank 0's evaluations during training (those with a time).
    #[serde(skip)]
    pub evaluations: Vec<EvalPoint>,
    /// Per evaluation, the bytes a worker had sent by then (see `bytes_to_accuracy`).
    #[serde(skip)]
    pub evaluation_bytes: Vec<f64>,
}

/// The row of a `launch` run from its summary (`text`) and the files in `run_dir`.
pub fn launch_row(
    config: &StudyConfig,
    run: &RunSpec,
    run_dir: &Path,
    text: &str,
) -> Result<RunRow> {
    let summary: Summary = serde_json::from_str(text).context("parsing the summary")?;
    let resources = worker_resources(run_dir, run.workers);
    let mut row = row(config, run, &summary, resources)?;
    let rows0 = MetricsTable::read(&run_dir.join("steps-rank0.csv")).unwrap_or_default();
    let warm = config.warmup_steps as usize;
    if let Some(step_seconds) = step_seconds_between_ends(&rows0.column("t_end_s"), warm) {
        row.step_seconds = step_seconds;
        row.samples_per_sec = (config.batch_size * run.workers) as f64 / step_seconds;
        row.fraction_of_ideal = row.samples_per_sec / row.ideal_samples_per_sec;
    }
    let sent = SentByStep::read(run_dir, run.workers, row.bytes_per_step);
    row.bytes_to_accuracy = summary
        .steps_to_accuracy
        .map_or(f64::NAN, |s| sent.by_step(s));
    row.evaluation_bytes = row
        .evaluations
        .iter()
        .map(|e| sent.by_step(e.step))
        .collect();
    Ok(row)
}

/// The mean time from one step's end to the next after the first `warm` steps, from worker
/// 0's training clock at each step's end (`t_end_s`: evaluations excluded, a synchronisation
/// between steps included, which the steps' own durations leave out); `None` without a
/// step end (one step: its own end).
fn step_seconds_between_ends(ends: &[f64], warm: usize) -> Option<f64> {
    let warm = warm.min(ends.len().saturating_sub(1));
    let (first, last) = match warm {
        0 => (0.0, *ends.last()?),
        w => (*ends.get(w - 1)?, *ends.last()?),
    };
    let steps = ends.len() - warm;
    let mean = (last - first) / steps as f64;
    (mean.is_finite() && mean > 0.0).then_some(mean)
}

/// The first of `figures` that is a number (not NaN); NaN when none is.
fn first_number(figures: impl IntoIterator<Item = f64>) -> f64 {
    figures
        .into_iter()
        .find(|v| !v.is_nan())
        .unwrap_or(f64::NAN)
}

fn row(
    config: &StudyConfig,
    run: &RunSpec,
    summary: &Summary,
    resources: WorkerResources,
) -> Result<RunRow> {
    let w0 = &summary.worker0;
    let steps = &w0.step_seconds;
    let warm = (config.warmup_steps as usize).min(steps.len().saturating_sub(1));
    let measured = &steps[warm..];
    let step_seconds = measured.iter().sum::<f64>() / measured.len().max(1) as f64;
    let samples = (config.batch_size * run.workers) as f64;
    let samples_per_sec = samples / step_seconds;
    let bandwidth_bps = parse_bandwidth(&run.bandwidth)?;
    let ideal =
        ideal_step_seconds(&run.model, bandwidth_bps).map_or(f64::NAN, |ideal| samples / ideal);
    let n = steps.len().max(1) as f64;
    let optional = |v: Option<f64>| v.unwrap_or(f64::NAN);
    let completion = Some(&w0.tensor_completion).filter(|t| t.count > 0);
    let tensor = |p: fn(&Percentiles) -> f64| completion.map_or(f64::NAN, p);
    Ok(RunRow {
        id: run.id.clone(),
        model: run.model.clone(),
        variant: run.variant.clone(),
        network: run.network.clone(),
        bandwidth: run.bandwidth.clone(),
        latency_ms: run.latency_ms,
        bandwidth_gbps: bandwidth_bps.map_or(f64::NAN, |b| b / 1e9),
        workers: run.workers,
        seed: run.seed,
        step_seconds,
        samples_per_sec,
        ideal_samples_per_sec: ideal,
        fraction_of_ideal: samples_per_sec / ideal,
        compute_per_step: w0.times.compute / n,
        wait_per_step: w0.times.wait / n,
        test_accuracy: summary.test_accuracy,
        wall_seconds: summary.wall_seconds,
        target_accuracy: optional(summary.target_accuracy),
        time_to_accuracy: optional(summary.time_to_accuracy_s),
        average_accuracy: optional(summary.average_accuracy),
        divergence: optional(summary.divergence),
        frames_lost: summary.frames_lost.map_or(f64::NAN, |f| f as f64),
        realised_loss: summary.dlcp.as_ref().map_or(f64::NAN, |d| d.realised_loss),
        tensor_p50_s: tensor(|t| t.p50_s),
        tensor_p99_s: tensor(|t| t.p99_s),
        bytes_per_step: mean_bytes_per_step(summary, &resources),
        textbook_bytes_per_step: first_number([
            summary.textbook_bytes_per_step,
            w0.textbook_bytes_per_step,
        ]),
        mean_cpu_percent: resources.mean_cpu_percent,
        peak_rss_bytes: resources.peak_rss_bytes,
        net_bytes: resources.net_bytes,
        disk_bytes: resources.disk_bytes,
        steps_to_accuracy: summary.steps_to_accuracy.map_or(f64::NAN, |s| s as f64),
        bytes_to_accuracy: f64::NAN,
        compute_utilisation: compute_utilisation(summary),
        evaluations: timed_evaluations(summary),
        evaluation_bytes: Vec::new(),
    })
}

/// Worker 0's forward, backward and optimizer seconds over the training loop's wall seconds
/// (evaluations excluded); NaN when either is not recorded.
fn compute_utilisation(summary: &Summary) -> f64 {
    let times = &summary.worker0.times;
    let busy = times.compute + times.optimizer;
    if summary.wall_seconds > 0.0 {
        busy / summary.wall_seconds
    } else {
        f64::NAN
    }
}

/// Rank 0's evaluations that say when they were made.
fn timed_evaluations(summary: &Summary) -> Vec<EvalPoint> {
    summary
        .worker0
        .evaluations
        .iter()
        .filter(|e| e.seconds.is_finite())
        .copied()
        .collect()
}

/// Bytes a worker sent per step, the mean over workers (their metrics' last `net_sent_bytes`
/// over the run's steps: under step-wise averaging or ring reduce workers send different
/// amounts), or the summary's own figure (job level, else worker 0's) when the run has no
/// metrics.
fn mean_bytes_per_step(summary: &Summary, resources: &WorkerResources) -> f64 {
    if resources.net_bytes.is_finite() && summary.steps > 0 {
        resources.net_bytes / summary.steps as f64
    } else {
        first_number([summary.bytes_per_step, summary.worker0.bytes_per_step])
    }
}

/// The ideal step time of a profile model at `bandwidth_bps` (full size): compute (every
/// layer's forward and backward) or pushing every parameter once through the worker's
/// interface, whichever is longer; pulls travel the other direction at the same time.
pub fn ideal_step_seconds(model_name: &str, bandwidth_bps: Option<f64>) -> Option<f64> {
    if !model::is_profile_name(model_name) {
        return None;
    }
    let spec = model::profile_model(model_name, 1.0).ok()?;
    let compute_ns: u64 = spec
        .layers
        .iter()
        .map(|l| match l.op {
            LayerOp::Profiled {
                forward_ns,
                backward_ns,
            } => forward_ns + backward_ns,
            _ => 0,
        })
        .sum();
    let comm = bandwidth_bps.map_or(0.0, |b| spec.num_params() as f64 * 32.0 / b);
    Some((compute_ns as f64 * 1e-9).max(comm))
}

impl RunRow {
    /// A row of `model` with `workers` workers and nothing else: every figure NaN.
    pub fn empty(model: &str, workers: usize) -> Self {
        let nan = f64::NAN;
        RunRow {
            id: String::new(),
            model: model.into(),
            variant: String::new(),
            network: String::new(),
            bandwidth: String::new(),
            latency_ms: nan,
            bandwidth_gbps: nan,
            workers,
            seed: 0,
            step_seconds: nan,
            samples_per_sec: nan,
            ideal_samples_per_sec: nan,
            fraction_of_ideal: nan,
            compute_per_step: nan,
            wait_per_step: nan,
            test_accuracy: nan,
            wall_seconds: nan,
            target_accuracy: nan,
            time_to_accuracy: nan,
            average_accuracy: nan,
            divergence: nan,
            frames_lost: nan,
            realised_loss: nan,
            tensor_p50_s: nan,
            tensor_p99_s: nan,
            bytes_per_step: nan,
            textbook_bytes_per_step: nan,
            mean_cpu_percent: nan,
            peak_rss_bytes: nan,
            net_bytes: nan,
            disk_bytes: nan,
            steps_to_accuracy: nan,
            bytes_to_accuracy: nan,
            compute_utilisation: nan,
            evaluations: Vec::new(),
            evaluation_bytes: Vec::new(),
        }
    }
}

/// `json` with its `worker0` made whole: a default [`WorkerSummary`] with the given fields
/// over it (objects merged field by field), as a summary the runtime wrote would have it.
#[cfg(test)]
pub(crate) fn with_whole_worker0(mut json: serde_json::Value) -> serde_json::Value {
    fn merge(into: &mut serde_json::Value, patch: &serde_json::Value) {
        match (into.as_object_mut(), patch.as_object()) {
            (Some(into), Some(patch)) => {
                for (k, v) in patch {
                    merge(into.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
            _ => *into = patch.clone(),
        }
    }
    let mut worker0 = serde_json::to_value(WorkerSummary::default()).unwrap();
    if let Some(patch) = json.get("worker0") {
        merge(&mut worker0, patch);
    }
    json["worker0"] = worker0;
    json
}

#[cfg(test)]
#[path = "rows_tests.rs"]
mod tests;
