//! What the loop measures: the [`Record`] the worker's outputs are drawn from, and each
//! step's row and progress at its end.

use std::collections::VecDeque;
use std::time::Instant;

use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::Evaluation;

use super::StepLoop;
use crate::error::RunError;
use crate::worker::checkpointing::CarriedRecord;
use crate::worker::step_rows::StepRows;
use crate::worker::{EvalLog, WorkerTimes};

/// What the loop measured, for the worker's outputs.
pub(in crate::worker) struct Record {
    /// Per-phase times.
    pub times: WorkerTimes,
    /// The last (up to) 20 training losses.
    pub recent: VecDeque<f64>,
    /// Test accuracy after each epoch.
    pub epoch_accuracy: Vec<f64>,
    /// Every evaluation.
    pub evals: EvalLog,
    /// Seconds spent evaluating and writing checkpoints (left out of training time).
    pub excluded_seconds: f64,
    /// Wall time of every step.
    pub step_seconds: Vec<f64>,
    /// `steps-rank<R>.csv`, appended to its file.
    pub step_rows: StepRows,
    /// The evaluation after the last step.
    pub test: Option<Evaluation>,
    /// When training started.
    pub start: Instant,
    /// Training seconds of the whole run (evaluations left out), once it has finished.
    pub trained: f64,
    /// Training seconds before this process started (a resumed job's earlier part).
    pub carried: f64,
}

impl Record {
    /// A new record whose step rows go to `step_rows` and evaluations to `evals`.
    pub fn new(step_rows: StepRows, evals: EvalLog) -> Self {
        Self {
            times: WorkerTimes::default(),
            recent: VecDeque::new(),
            epoch_accuracy: Vec::new(),
            evals,
            excluded_seconds: 0.0,
            step_seconds: Vec::new(),
            step_rows,
            test: None,
            start: Instant::now(),
            trained: 0.0,
            carried: 0.0,
        }
    }

    /// Training seconds so far (evaluations left out), the earlier part of a resumed job
    /// included.
    pub fn train_seconds(&self) -> f64 {
        self.carried + self.start.elapsed().as_secs_f64() - self.excluded_seconds
    }

    /// Nanoseconds since training started in this process: the clock of the tuner and the
    /// tensor completion times.
    pub fn clock_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// What a checkpoint keeps of this record (its step rows and evaluations made durable
    /// first).
    pub fn carry(&mut self) -> Result<CarriedRecord, RunError> {
        Ok(CarriedRecord {
            times: self.times,
            recent: self.recent.clone(),
            epoch_accuracy: self.epoch_accuracy.clone(),
            evals: self.evals.rows.mark()?,
            rows: self.step_rows.mark()?,
            trained: self.train_seconds(),
        })
    }

    /// A record that goes on from `carried`, a resumed job's earlier part, whose step rows
    /// `step_rows` and evaluations `evals` go on from and whose steps took `step_seconds`.
    pub fn resumed(
        carried: CarriedRecord,
        step_rows: StepRows,
        step_seconds: Vec<f64>,
        evals: EvalLog,
    ) -> Self {
        Self {
            times: carried.times,
            recent: carried.recent,
            epoch_accuracy: carried.epoch_accuracy,
            step_seconds,
            carried: carried.trained,
            ..Self::new(step_rows, evals)
        }
    }
}

impl<E: LayerwiseEngine> StepLoop<'_, E> {
    pub(super) fn step_end(&mut self, step: u64, steps: u64) -> Result<(), RunError> {
        let out = self
            .out
            .take()
            .ok_or_else(|| RunError::Local("a step ended without a loss".into()))?;
        let sent = self.sent_so_far();
        let r = &mut self.record;
        if r.recent.len() == 20 {
            r.recent.pop_front();
        }
        r.recent.push_back(f64::from(out.loss));
        let step_s = self.step_start.elapsed().as_secs_f64();
        r.step_seconds.push(step_s);
        let (now, before) = (r.times, self.times_at_step_start);
        let tensors = self.tensors.take_interval();
        let (last_end, start) = self.sent_at;
        let (sent_between, sent_in_step) =
            (start.saturating_sub(last_end), sent.saturating_sub(start));
        self.sent_at = (sent, sent);
        r.step_rows.push(&format!(
            "{},{:.4},{:.4},{:.5},{:.4},{:.4},{:.4},{:.4},{},{:.6},{:.6},{},{}\n",
            step + 1,
            r.train_seconds(),
            step_s,
            out.loss,
            now.data - before.data,
            now.compute - before.compute,
            now.wait - before.wait,
            now.optimizer - before.optimizer,
            tensors.count,
            tensors.p50_s,
            tensors.p99_s,
            sent_in_step,
            sent_between
        ))?;
        let rate = (step + 1 - self.first_step) as f64 * self.global_batch as f64
            / r.train_seconds().max(1e-9);
        self.observer.on_step(step + 1, steps, &out, rate);
        Ok(())
    }
}
