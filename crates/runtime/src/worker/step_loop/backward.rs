//! The backward pass: the engine calls back after each layer, and the sequencer says what
//! follows it (its hand-over, and first, where weights are averaged, its local optimizer
//! step).

use std::ops::Range;
use std::time::Instant;

use syncopate_core::latency::TensorTimes;
use syncopate_core::step::{Action, OptimizerPlace, StepSequencer};
use syncopate_train::engine::{LayerGrads, LayerwiseEngine};
use syncopate_train::trainer::LocalOptimizer;

use super::{Record, StepLoop};
use crate::error::RunError;
use crate::worker::comm_thread::{Comm, ToComm};

impl<E: LayerwiseEngine> StepLoop<'_, E> {
    /// Runs the whole backward pass (the engine calls back after each layer); the
    /// sequencer says what follows each layer: its hand-over, and first, where weights are
    /// averaged, its local optimizer step.
    pub(super) fn backward(
        &mut self,
        seq: &mut StepSequencer,
        first: usize,
    ) -> Result<(), RunError> {
        let Self {
            engine,
            comm,
            tracer,
            layer_names,
            layer_keys,
            record,
            slowdown,
            step,
            grads,
            optimizer,
            tensors,
            ..
        } = self;
        let mut failure = None;
        let mut expected = first;
        let mut layer_start = Instant::now();
        let result = engine.backward(&mut |layer, layer_grads, engine| {
            let computed = layer_start.elapsed();
            if *slowdown > 1.0 {
                std::thread::sleep(computed.mul_f64(*slowdown - 1.0));
            }
            let now = Instant::now();
            record.times.compute += (now - layer_start).as_secs_f64();
            if let Some(t) = tracer.as_mut() {
                let name = format!("backward {}", layer_names[layer]);
                t.span(*step, "compute", &name, layer_start, now);
            }
            let mut after = AfterBackward {
                seq,
                comm,
                grads,
                optimizer,
                engine,
                record,
                tensors,
            };
            match after.run(layer, expected, &layer_keys[layer], layer_grads) {
                Ok(Some(next)) => expected = next,
                Ok(None) => {}
                Err(e) => {
                    let msg = e.to_string();
                    failure = Some(e);
                    return Err(syncopate_train::TrainError::Model(msg));
                }
            }
            layer_start = Instant::now();
            Ok(())
        });
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(result?)
    }
}

/// What runs after one layer's backward, inside the engine's callback.
struct AfterBackward<'s> {
    seq: &'s mut StepSequencer,
    comm: &'s mut Comm,
    grads: &'s mut [Vec<f32>],
    optimizer: &'s mut LocalOptimizer,
    engine: &'s mut dyn LayerwiseEngine,
    record: &'s mut Record,
    tensors: &'s mut TensorTimes,
}

impl AfterBackward<'_> {
    /// After layer `layer`'s backward: does what the sequencer asks until the engine's next
    /// layer (returned) or the end of the backward pass.
    fn run(
        &mut self,
        layer: usize,
        expected: usize,
        keys: &Range<usize>,
        layer_grads: &LayerGrads,
    ) -> Result<Option<usize>, RunError> {
        if layer != expected {
            return Err(RunError::Local(format!(
                "the engine computed layer {layer}'s backward where the step sequence expects layer {expected}"
            )));
        }
        self.seq.compute_done();
        let mut updated = false;
        loop {
            match self.seq.poll_action() {
                Action::OptimizeLayer(k) if k == layer => {
                    self.optimize_layer(keys, layer_grads)?;
                    updated = true;
                }
                // Weights after the layer's own optimizer step, or its gradients.
                Action::HandOver(k) if k == layer => {
                    let now = self.record.clock_ns();
                    keys.clone().for_each(|key| self.tensors.handed(key, now));
                    self.hand_over(keys, layer_grads, updated)?;
                }
                Action::Backward(next) => return Ok(Some(next)),
                Action::BackwardDone => {
                    // The step's layers are all updated: the next step's learning rate.
                    if self.seq.plan().optimizer == OptimizerPlace::BeforeSync {
                        self.optimizer.advance();
                    }
                    self.comm.send(ToComm::BackwardDone)?;
                    return Ok(None);
                }
                other => {
                    return Err(RunError::Local(format!(
                        "step sequence: {other:?} during layer {layer}'s backward"
                    )))
                }
            }
        }
    }

    /// Hands the layer's keys to the communication thread: its weights after the layer's
    /// own optimizer step (`updated`), or its gradients.
    fn hand_over(
        &mut self,
        keys: &Range<usize>,
        layer_grads: &LayerGrads,
        updated: bool,
    ) -> Result<(), RunError> {
        if updated {
            for key in keys.clone() {
                let weights = self.engine.param(key)?;
                self.comm.send(ToComm::Gradient(key, weights))?;
            }
        } else {
            for (key, g) in layer_grads.views() {
                debug_assert!(keys.contains(&key));
                self.comm.send(ToComm::Gradient(key, g.clone()))?;
            }
        }
        Ok(())
    }

    /// The optimizer on this layer's keys with their own gradients.
    fn optimize_layer(
        &mut self,
        keys: &Range<usize>,
        layer_grads: &LayerGrads,
    ) -> Result<(), RunError> {
        let t = Instant::now();
        for (key, g) in layer_grads.iter() {
            if let Some(slot) = self.grads.get_mut(key) {
                slot.clear();
                slot.extend_from_slice(g);
            }
        }
        self.optimizer
            .apply_keys(&mut *self.engine, keys.clone(), self.grads)?;
        self.record.times.optimizer += t.elapsed().as_secs_f64();
        Ok(())
    }
}
