//! The run summary a distributed job writes (`syncopate launch --summary-json`), as types
//! that the writer serialises and a study deserialises: a renamed field breaks the build or
//! the tests instead of reading as NaN.
//!
//! The parts defined by the crates above this one (worker 0's whole summary, the job's
//! settings, its network profile, what its strategy averages) are type parameters: the writer
//! fills them with its own types, a reader leaves the defaults, which read what a study needs
//! ([`WorkerRecord`]) or keep the JSON as it is ([`serde_json::Value`]).
//!
//! Reading is tolerant, so that the summaries of older runs still report: a field that is
//! absent reads as NaN (numbers), `None` (optional figures) or empty (lists), and a number
//! written as `null` (JSON has no NaN) reads as NaN.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// NaN: what an absent figure reads as.
fn nan() -> f64 {
    f64::NAN
}

/// A number, or NaN where the file has `null` (a NaN when it was written).
fn nan_if_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// A list of numbers, with NaN where the file has `null`.
fn nans_if_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<f64>, D::Error> {
    let numbers = Vec::<Option<f64>>::deserialize(deserializer)?;
    Ok(numbers.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

/// What `--summary-json` holds for a distributed job: worker 0 writes it at the end of the
/// run; `launch` then adds the replica statistics (`average_accuracy`, `average_loss`,
/// `divergence`) and, for loss-tolerant strategies, `dlcp`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSummary<Worker = WorkerRecord, Settings = Value, Network = Value, Averages = Value> {
    /// The command that ran the job (`launch`).
    #[serde(default)]
    pub command: String,
    /// The strategy's name.
    #[serde(default)]
    pub strategy: String,
    /// Whether every worker ends each step with single-process training's values.
    #[serde(default)]
    pub exact: bool,
    /// What the workers average: gradients or weights.
    #[serde(default)]
    pub averages: Averages,
    /// 1 / sum(pi_i^2) of the long-run mixing (the worker count where averaging is exact).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub effective_contributors: f64,
    /// Workers.
    #[serde(default)]
    pub workers: usize,
    /// Parameter servers.
    #[serde(default)]
    pub servers: usize,
    /// The emulated network.
    #[serde(default)]
    pub network: Network,
    /// Worker 0's frames lost by the emulated network (`None`: not recorded).
    pub frames_lost: Option<u64>,
    /// Its frames retransmitted.
    pub frames_retransmitted: Option<u64>,
    /// Its frames dropped by a queue.
    pub frames_dropped: Option<u64>,
    /// Final test accuracy of worker 0 (NaN for profile replays).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub test_accuracy: f64,
    /// Final test loss of worker 0.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub test_loss: f64,
    /// Mean training loss over the last steps.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub final_loss: f64,
    /// Steps run.
    #[serde(default)]
    pub steps: u64,
    /// Wall time of the training loop, seconds.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub wall_seconds: f64,
    /// Samples per second over all workers.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub samples_per_sec: f64,
    /// Test accuracy after each epoch.
    #[serde(default, deserialize_with = "nans_if_null")]
    pub epoch_accuracy: Vec<f64>,
    /// The test accuracy the run aimed at (`None`: no target).
    pub target_accuracy: Option<f64>,
    /// Training seconds until an evaluation first reached the target (`None`: never).
    pub time_to_accuracy_s: Option<f64>,
    /// Steps until then.
    pub steps_to_accuracy: Option<u64>,
    /// Test accuracy of the exact average of the workers' weights at the last evaluation
    /// (filled in by `launch` after the job; null without replica statistics).
    pub average_accuracy: Option<f64>,
    /// Test loss of that average.
    pub average_loss: Option<f64>,
    /// The workers' divergence at the last evaluation: mean of |x_i - avg|^2 / |avg|^2.
    pub divergence: Option<f64>,
    /// Bytes worker 0 sent per step, all links (measured).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub bytes_per_step: f64,
    /// The strategy's textbook bytes per step per worker for this model.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub textbook_bytes_per_step: f64,
    /// Worker 0's own summary.
    #[serde(default)]
    pub worker0: Worker,
    /// The job's settings as given.
    #[serde(default)]
    pub settings: Settings,
    /// What the loss-tolerant receivers lost and filled in, summed (added by `launch` after
    /// a loss-tolerant job; `None` as worker 0 writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dlcp: Option<LossSummary>,
}

/// Worker 0's summary as a study reads it: the part of the runtime's worker summary that a
/// report uses (the other fields are passed over).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Wall time of every step, seconds (evaluations excluded).
    #[serde(default, deserialize_with = "nans_if_null")]
    pub step_seconds: Vec<f64>,
    /// Time spent in each phase over the run.
    #[serde(default)]
    pub times: PhaseTimes,
    /// Every evaluation during training, in order.
    #[serde(default)]
    pub evaluations: Vec<Evaluation>,
    /// Bytes this worker sent on all its links per step (measured).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub bytes_per_step: f64,
    /// The strategy's textbook bytes per step per worker.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub textbook_bytes_per_step: f64,
    /// Per-tensor completion times (`None`: not recorded).
    pub tensor_completion: Option<CompletionTimes>,
}

/// A summary that recorded nothing: NaN figures, no steps, evaluations or completion times.
impl Default for WorkerRecord {
    fn default() -> Self {
        Self {
            step_seconds: Vec::new(),
            times: PhaseTimes::default(),
            evaluations: Vec::new(),
            bytes_per_step: f64::NAN,
            textbook_bytes_per_step: f64::NAN,
            tensor_completion: None,
        }
    }
}

/// Time a worker spent in each phase over the run, seconds (NaN: not recorded).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct PhaseTimes {
    /// Waiting for the data loader.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub data: f64,
    /// Forward and backward.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub compute: f64,
    /// Blocked on communication after backward.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub wait: f64,
    /// Local optimizer.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub optimizer: f64,
}

/// Nothing recorded: NaN for every phase.
impl Default for PhaseTimes {
    fn default() -> Self {
        Self {
            data: f64::NAN,
            compute: f64::NAN,
            wait: f64::NAN,
            optimizer: f64::NAN,
        }
    }
}

/// One evaluation of the test set during training.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Evaluation {
    /// Steps done.
    #[serde(default)]
    pub step: u64,
    /// Training seconds so far (evaluations excluded; NaN: not recorded).
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub seconds: f64,
    /// Test accuracy of the worker's replica, a fraction.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub accuracy: f64,
    /// Its test loss.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Test accuracy of the exact average of every worker's weights (`None`: not computed).
    pub average_accuracy: Option<f64>,
    /// Test loss of that average.
    pub average_loss: Option<f64>,
    /// Mean over workers of ||x_i - mean||^2 / ||mean||^2.
    pub divergence: Option<f64>,
}

/// Per-tensor completion times: from a key's hand-over to its synchronised values back.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CompletionTimes {
    /// Tensors measured.
    #[serde(default)]
    pub count: u64,
    /// Median, seconds.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub p50_s: f64,
    /// 99th percentile, seconds.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub p99_s: f64,
    /// Longest, seconds.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub max_s: f64,
}

/// What a loss-tolerant job's receivers lost and filled in, summed over them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LossSummary {
    /// Fraction of gradient values filled in rather than received.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub realised_loss: f64,
    /// Probes answered per step.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub probes_per_step: f64,
    /// The largest realised loss of one key.
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub max_key_realised_loss: f64,
    /// Realised loss per key.
    #[serde(default, deserialize_with = "nans_if_null")]
    pub realised_loss_per_key: Vec<f64>,
    /// The receivers' counters (entries, packets, probes, ...), as written.
    #[serde(flatten)]
    pub counters: serde_json::Map<String, Value>,
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
