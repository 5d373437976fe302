//! The run summary a distributed job writes (`syncopate launch --summary-json`), as types
//! that the writer serialises and a study deserialises: a renamed field breaks the build or
//! the tests instead of reading as NaN.
//!
//! The parts defined by the crates above this one (worker 0's whole summary, the job's
//! settings, its network profile, what its strategy averages) are type parameters: the writer
//! fills them with its own types and a reader reads them with the same ones (worker 0's is
//! the runtime's `WorkerSummary`, on both sides), or keeps the JSON as it is
//! ([`serde_json::Value`]).
//!
//! The job-level figures read tolerantly, so that the summaries of older runs still report:
//! a field that is absent reads as NaN (numbers), `None` (optional figures) or empty
//! (lists). Worker 0's summary must be there, whole: a missing field is an error naming it.
//! A number written as `null` (JSON has no NaN) reads as NaN.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use syncopate_core::json::{nan_if_null, nans_if_null};

/// NaN: what an absent figure reads as.
fn nan() -> f64 {
    f64::NAN
}

/// What `--summary-json` holds for a distributed job: worker 0 writes it at the end of the
/// run; `launch` then adds the replica statistics (`average_accuracy`, `average_loss`,
/// `divergence`) and, for loss-tolerant strategies, `dlcp`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSummary<Worker, Settings = Value, Network = Value, Averages = Value> {
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
    /// Worker 0's own summary (required).
    pub worker0: Worker,
    /// The job's settings as given.
    #[serde(default)]
    pub settings: Settings,
    /// What the loss-tolerant receivers lost and filled in, summed (added by `launch` after
    /// a loss-tolerant job; `None` as worker 0 writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dlcp: Option<LossSummary>,
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
