//! A worker's outcome: the summary it writes and a study reads back, one type on both
//! sides, and how it is drawn from what the run recorded.

use serde::{Deserialize, Serialize};
use syncopate_core::json::{nan_if_null, nans_if_null};
use syncopate_core::latency::Percentiles;
use syncopate_core::step::StepSequencer;
use syncopate_core::strategy::{KeyLoss, LossStats, Rank};
use syncopate_core::tune::TuneReport;
use syncopate_train::trainer::Evaluation;

use super::comm_thread::CommOutcome;
use super::step_loop::Record;
use super::WorkerPlan;
use crate::job::JobLayout;
use crate::losses::Losses;

/// Time spent in each phase over the run, seconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct WorkerTimes {
    /// Waiting for the data loader.
    pub data: f64,
    /// Forward and backward (compute; communication overlaps it).
    pub compute: f64,
    /// Blocked on communication after backward.
    pub wait: f64,
    /// Local optimizer (all-reduce strategies).
    pub optimizer: f64,
}

/// A worker's outcome: what it writes as its summary (`summary.json`'s `worker0`, and the
/// member files beside it) and what a study reads back, this one type on both sides. Every
/// field is required when read; a figure that was NaN is written as `null` and reads back
/// as NaN.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerSummary {
    /// This worker's rank.
    pub rank: Rank,
    /// Steps run.
    pub steps: u64,
    /// Wall time of the training loop (evaluations excluded), seconds.
    #[serde(deserialize_with = "nan_if_null")]
    pub train_seconds: f64,
    /// Samples per second over all workers (N x batch x steps / time).
    #[serde(deserialize_with = "nan_if_null")]
    pub samples_per_sec: f64,
    /// Mean training loss over the last (up to) 20 steps, on this worker's shard.
    #[serde(deserialize_with = "nan_if_null")]
    pub final_loss: f64,
    /// Test evaluation at the end (rank 0 only).
    pub test: Option<Evaluation>,
    /// Test accuracy after each epoch (rank 0 only).
    #[serde(deserialize_with = "nans_if_null")]
    pub epoch_accuracy: Vec<f64>,
    /// Every evaluation (rank 0 only), in order.
    pub evaluations: Vec<EvalPoint>,
    /// Training seconds (evaluations excluded) until the first evaluation that reached the
    /// target accuracy; `None` without a target or when no evaluation reached it.
    pub time_to_accuracy: Option<f64>,
    /// Steps until then.
    pub steps_to_accuracy: Option<u64>,
    /// Per-phase times.
    pub times: WorkerTimes,
    /// Wall time of every step, seconds (evaluations excluded).
    #[serde(deserialize_with = "nans_if_null")]
    pub step_seconds: Vec<f64>,
    /// Bytes per link: (peer, sent, received).
    pub links: Vec<(Rank, u64, u64)>,
    /// Bytes this worker sent on all its links per step (measured: headers, heartbeats
    /// and all).
    #[serde(deserialize_with = "nan_if_null")]
    pub bytes_per_step: f64,
    /// Bytes this worker received on all its links per step (measured).
    #[serde(deserialize_with = "nan_if_null")]
    pub received_bytes_per_step: f64,
    /// The textbook bytes per step per worker of the strategy for this model
    /// ([`syncopate_core::strategy::textbook_bytes_per_step`]).
    #[serde(deserialize_with = "nan_if_null")]
    pub textbook_bytes_per_step: f64,
    /// What the emulated network did to this worker's frames (sent, and received at its
    /// ingress port), all links together.
    pub network: syncopate_core::net::NetCounters,
    /// Per-tensor completion times of the run: from a key's hand-over to its synchronised
    /// values back ([`syncopate_core::latency`]).
    pub tensor_completion: Percentiles,
    /// What the tuner measured and chose (`--autotune`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<TuneReport>,
    /// What a loss-tolerant worker (dlcp-allreduce) lost and filled in, and what its
    /// datagrams did.
    #[serde(flatten)]
    pub losses: Losses,
}

/// A loss-tolerant worker's own file beside the job's summary (`summary.worker-N.json`):
/// what it lost and filled in, and what its datagrams did, for `launch` to add up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OwnLoss {
    /// The worker's rank.
    pub rank: Rank,
    /// Values lost and filled in (`None`: an exact strategy).
    pub loss: Option<LossStats>,
    /// The same per key.
    #[serde(default)]
    pub key_loss: Vec<KeyLoss>,
    /// What its datagrams did (`--transport udp`).
    #[serde(default)]
    pub datagrams: Option<crate::comm::DatagramReport>,
}

impl OwnLoss {
    /// Worker `rank`'s file from its `summary`; `None` where it has nothing of its own
    /// (an exact strategy over TCP).
    pub fn of(rank: Rank, summary: &WorkerSummary) -> Option<Self> {
        let l = &summary.losses;
        (l.loss.is_some() || l.datagrams.is_some()).then(|| OwnLoss {
            rank,
            loss: l.loss,
            key_loss: l.key_loss.clone(),
            datagrams: l.datagrams.clone(),
        })
    }
}

/// One evaluation of the test set during training.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct EvalPoint {
    /// Steps done.
    pub step: u64,
    /// Training seconds so far (evaluations excluded).
    #[serde(deserialize_with = "nan_if_null")]
    pub seconds: f64,
    /// Test accuracy, a fraction.
    #[serde(deserialize_with = "nan_if_null")]
    pub accuracy: f64,
    /// Test loss.
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// Test accuracy of the exact average of every worker's weights at this step; filled in
    /// by `launch` after the job from the replica snapshots (`None`: not computed).
    pub average_accuracy: Option<f64>,
    /// Test loss of that average.
    pub average_loss: Option<f64>,
    /// Mean over workers of ||x_i − x̄||² / ||x̄||² at this step (see
    /// [`crate::replicas`]).
    pub divergence: Option<f64>,
}

/// The worker's summary from what its loop recorded, what its communication thread handed
/// back and what its sequencer ran, for a model of `model_bytes`.
pub(super) fn summarise(
    rank: Rank,
    plan: &WorkerPlan,
    layout: &JobLayout,
    model_bytes: f64,
    record: Record,
    outcome: CommOutcome,
    seq: &StepSequencer,
) -> WorkerSummary {
    let workers = layout.workers;
    let counters = &outcome.counters;
    let total = seq.plan().steps;
    let steps_run = total - seq.plan().first_step;
    // The links' counters cover this process's steps; the record, the whole job's.
    let per_step = |bytes: u64| bytes as f64 / steps_run.max(1) as f64;
    let train_seconds = record.trained;
    let reached = plan
        .target_accuracy
        .and_then(|target| record.evals.points.iter().find(|e| e.accuracy >= target));
    let (time_to_accuracy, steps_to_accuracy) =
        (reached.map(|e| e.seconds), reached.map(|e| e.step));
    WorkerSummary {
        rank,
        steps: total,
        train_seconds,
        samples_per_sec: total as f64 * (plan.batch_size * workers) as f64
            / train_seconds.max(1e-9),
        final_loss: record.recent.iter().sum::<f64>() / record.recent.len().max(1) as f64,
        test: record.test,
        epoch_accuracy: record.epoch_accuracy,
        evaluations: record.evals.points,
        time_to_accuracy,
        steps_to_accuracy,
        times: record.times,
        step_seconds: record.step_seconds,
        links: counters
            .iter()
            .map(|c| (c.peer, c.sent, c.received))
            .collect(),
        bytes_per_step: per_step(counters.iter().map(|c| c.sent).sum()),
        received_bytes_per_step: per_step(counters.iter().map(|c| c.received).sum()),
        textbook_bytes_per_step: layout.sync.textbook_bytes_per_step(model_bytes),
        network: counters.iter().fold(Default::default(), |mut sum, c| {
            sum.add(&c.net);
            sum.add(&c.ingress);
            sum
        }),
        autotune: seq.tuner().map(|t| t.report()),
        tensor_completion: Percentiles::default(),
        losses: outcome.losses,
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod summary_tests;
