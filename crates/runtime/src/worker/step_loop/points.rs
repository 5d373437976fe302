//! The points between steps the sequencer calls for: relaying worker 0's buffers,
//! writing a checkpoint, evaluating (all left out of training time).

use std::time::Instant;

use syncopate_core::step::StepSequencer;
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::{evaluate, Evaluation};

use super::StepLoop;
use crate::error::RunError;
use crate::replicas::write_snapshot;
use crate::worker::comm_thread::ToComm;

impl<E: LayerwiseEngine> StepLoop<'_, E> {
    /// At an evaluation point: worker 0 sends its buffers; every other worker waits for
    /// them and installs them (left out of training time, as the evaluation is).
    pub(super) fn sync_buffers(
        &mut self,
        seq: &mut StepSequencer,
        step: u64,
    ) -> Result<(), RunError> {
        let t = Instant::now();
        if self.rank == 0 {
            let values = self
                .engine
                .buffers()?
                .into_iter()
                .flat_map(|(_, v)| v)
                .collect();
            self.comm.send(ToComm::Buffers(step, values))?;
        } else {
            let values = loop {
                match self.relayed.take() {
                    Some((at, values)) if at == step => break values,
                    Some((at, _)) => {
                        return Err(RunError::Local(format!(
                            "worker 0's buffers of step {} arrived at step {}",
                            at + 1,
                            step + 1
                        )))
                    }
                    None => self.receive(seq)?,
                }
            };
            self.install_buffers(values)?;
        }
        self.record.excluded_seconds += t.elapsed().as_secs_f64();
        self.span("buffers", "relay buffers", t, Instant::now());
        Ok(())
    }

    /// Installs worker 0's buffers, in the order of [`LayerwiseEngine::buffers`].
    fn install_buffers(&mut self, values: Vec<f32>) -> Result<(), RunError> {
        let mut rest = values.as_slice();
        for (name, mine) in self.engine.buffers()? {
            if rest.len() < mine.len() {
                return Err(RunError::Local("worker 0's buffers are too few".into()));
            }
            let (theirs, tail) = rest.split_at(mine.len());
            self.engine.set_buffer(&name, theirs.to_vec())?;
            rest = tail;
        }
        if !rest.is_empty() {
            return Err(RunError::Local("worker 0's buffers are too many".into()));
        }
        Ok(())
    }

    /// At a checkpoint point: writes this worker's state after `step` (0-based), left out
    /// of training time.
    pub(super) fn checkpoint(&mut self, step: u64) -> Result<(), RunError> {
        let t = Instant::now();
        let keeps_state = self
            .checkpoints
            .as_ref()
            .is_some_and(|c| c.keeps_sync_state);
        let sync_state = match keeps_state {
            true => self.sync_state()?,
            false => Vec::new(),
        };
        if let Some(c) = &self.checkpoints {
            let carried = self.record.carry()?;
            c.write(
                &*self.engine,
                &self.optimizer,
                sync_state,
                step + 1,
                &carried,
            )?;
            self.observer.on_checkpoint(step + 1);
        }
        self.record.excluded_seconds += t.elapsed().as_secs_f64();
        self.span("checkpoint", "checkpoint", t, Instant::now());
        Ok(())
    }

    /// At an evaluation point: writes this worker's weight snapshot (when asked) and
    /// evaluates the test set (where this worker has one), both left out of training time.
    pub(super) fn evaluate(
        &mut self,
        step: u64,
        epoch_end: bool,
        last: bool,
        steps: u64,
    ) -> Result<(), RunError> {
        let trained = self.record.train_seconds();
        let t = Instant::now();
        if let Some((dir, rank)) = &self.snapshots {
            write_snapshot(&*self.engine, dir, step + 1, *rank)?;
        }
        let eval = match self.test {
            Some(test) => Some(evaluate(&mut *self.engine, test, 256)?),
            None => None,
        };
        self.record.excluded_seconds += t.elapsed().as_secs_f64();
        if let Some(eval) = eval {
            self.record_eval(step, epoch_end, last, steps, trained, eval)?;
        }
        Ok(())
    }

    /// Records the evaluation after step `step` (`trained` seconds of training so far).
    fn record_eval(
        &mut self,
        step: u64,
        epoch_end: bool,
        last: bool,
        steps: u64,
        trained: f64,
        eval: Evaluation,
    ) -> Result<(), RunError> {
        (self.record.evals).push(self.epoch + 1, step + 1, trained, &eval)?;
        if epoch_end {
            self.record.epoch_accuracy.push(eval.accuracy);
            self.observer.on_eval(self.epoch + 1, &eval);
        } else if last {
            self.observer.on_eval(self.epoch + 1, &eval);
        }
        if last {
            debug_assert_eq!(step + 1, steps);
            self.record.test = Some(eval);
        }
        Ok(())
    }
}
