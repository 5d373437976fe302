//! Replaying a model's compute from a profile: each layer's forward and backward take their
//! profiled time (the thread waits, as a host thread waits on a GPU, leaving the CPU cores
//! to the transport) while parameter-sized buffers are handed out as gradients.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flat::{FlatView, LayerGrads};
use super::{LayerwiseEngine, OnLayer, StepOutput};
use crate::data::Batch;
use crate::error::{Result, TrainError};
use crate::model::{LayerOp, ModelSpec};

/// Paces a sequence of timed phases against absolute deadlines, so that the small overshoot
/// of every sleep does not add up over hundreds of layers.
#[derive(Debug)]
struct Pacer {
    deadline: Instant,
}

impl Pacer {
    fn new() -> Self {
        Self {
            deadline: Instant::now(),
        }
    }

    /// Restarts from now (after the thread waited on something else).
    fn resync(&mut self) {
        self.deadline = self.deadline.max(Instant::now());
    }

    /// Waits until `ns` after the previous phase ended.
    fn run(&mut self, ns: u64) {
        self.deadline += Duration::from_nanos(ns);
        let now = Instant::now();
        if self.deadline > now {
            std::thread::sleep(self.deadline - now);
        }
    }
}

/// An engine whose layers are [`LayerOp::Profiled`]: forward and backward wait for the
/// profiled times; gradients are fixed pseudo-random buffers of each key's size; parameters
/// are plain vectors that the synchronisation layer replaces.
pub struct ProfileEngine {
    spec: ModelSpec,
    layer_keys: Vec<std::ops::Range<usize>>,
    params: Vec<Arc<[f32]>>,
    grads: Vec<Arc<[f32]>>,
    pacer: Pacer,
    samples: usize,
}

impl ProfileEngine {
    /// An engine replaying `spec` (built by [`ModelSpec::from_profile`]).
    pub fn new(spec: ModelSpec, seed: u64) -> Result<Self> {
        if !spec
            .layers
            .iter()
            .all(|l| matches!(l.op, LayerOp::Profiled { .. }))
        {
            return Err(TrainError::Model(format!(
                "{} is not a compute profile (use a profile:NAME model)",
                spec.name
            )));
        }
        let params = spec.init_params(seed).into_iter().map(Arc::from).collect();
        // Small alternating-sign values: the servers' SGD moves the parameters a little
        // each step, as real gradients would, without overflowing over long runs.
        let grads = spec
            .keys()
            .iter()
            .map(|k| {
                (0..k.numel)
                    .map(|i| if (i + k.key) % 2 == 0 { 1e-4 } else { -1e-4 })
                    .collect::<Vec<f32>>()
                    .into()
            })
            .collect();
        Ok(Self {
            layer_keys: spec.layer_keys(),
            spec,
            params,
            grads,
            pacer: Pacer::new(),
            samples: 0,
        })
    }

    fn times(&self, layer: usize) -> (u64, u64) {
        match self.spec.layers.get(layer).map(|l| l.op) {
            Some(LayerOp::Profiled {
                forward_ns,
                backward_ns,
            }) => (forward_ns, backward_ns),
            _ => (0, 0),
        }
    }
}

impl LayerwiseEngine for ProfileEngine {
    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    fn begin_forward(&mut self, batch: &Batch) -> Result<()> {
        self.samples = batch.len();
        self.pacer = Pacer::new();
        Ok(())
    }

    fn forward_layer(&mut self, layer: usize) -> Result<()> {
        // The driver may have waited for this layer's parameters just before.
        self.pacer.resync();
        self.pacer.run(self.times(layer).0);
        Ok(())
    }

    fn finish_forward(&mut self) -> Result<StepOutput> {
        Ok(StepOutput {
            loss: f32::NAN,
            correct: 0,
            samples: self.samples,
        })
    }

    fn backward(&mut self, on_layer: &mut OnLayer<'_>) -> Result<()> {
        self.pacer.resync();
        for layer in (0..self.spec.layers.len()).rev() {
            self.pacer.run(self.times(layer).1);
            // Every layer is reported, with or without parameters, as the trait promises.
            let keys = self.layer_keys[layer].clone();
            let grads = LayerGrads {
                grads: keys
                    .map(|k| (k, FlatView::shared(self.grads[k].clone())))
                    .collect(),
            };
            on_layer(layer, &grads, self)?;
            // Handing the gradients over is the caller's time, not the layer's.
            self.pacer.resync();
        }
        Ok(())
    }

    fn param(&self, key: usize) -> Result<FlatView> {
        self.params
            .get(key)
            .map(|p| FlatView::shared(p.clone()))
            .ok_or_else(|| TrainError::Model(format!("no parameter key {key}")))
    }

    fn set_param(&mut self, key: usize, values: Vec<f32>) -> Result<()> {
        let want = self.spec.keys().get(key).map(|k| k.numel);
        match (self.params.get_mut(key), want) {
            (Some(slot), Some(n)) if n == values.len() => {
                *slot = values.into();
                Ok(())
            }
            _ => Err(TrainError::Model(format!(
                "parameter key {key}: no such key or {} values of the wrong length",
                values.len()
            ))),
        }
    }

    fn evaluate(&mut self, batch: &Batch) -> Result<StepOutput> {
        Ok(StepOutput {
            loss: f32::NAN,
            correct: 0,
            samples: batch.len(),
        })
    }

    fn buffers(&self) -> Result<Vec<(String, Vec<f32>)>> {
        Ok(Vec::new())
    }

    fn set_buffer(&mut self, name: &str, _: Vec<f32>) -> Result<()> {
        Err(TrainError::Model(format!(
            "a profile replay has no buffer {name}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_core::profile::ModelProfile;

    #[test]
    fn replays_profiled_times_and_hands_out_every_key() {
        let profile = ModelProfile::builtin("resnet50")
            .unwrap()
            .scaled(1000.0)
            .unwrap();
        let spec = ModelSpec::from_profile(&profile);
        let keys = spec.keys().len();
        let mut engine = ProfileEngine::new(spec, 1).unwrap();
        let batch = Batch {
            images: vec![0.0; 2],
            labels: vec![0, 0],
            shape: [1, 1, 1],
        };
        let t = Instant::now();
        engine.forward(&batch, &mut |_, _| Ok(())).unwrap();
        let mut seen = Vec::new();
        engine
            .backward(&mut |_, g, _| {
                seen.extend(g.iter().map(|(k, _)| k));
                Ok(())
            })
            .unwrap();
        let elapsed = t.elapsed();
        let want = Duration::from_nanos(profile.forward_ns() + profile.backward_ns());
        // Sleeping never returns early; the deadlines keep the overshoot from accumulating.
        assert!(elapsed >= want, "{elapsed:?} < {want:?}");
        seen.sort_unstable();
        assert_eq!(seen, (0..keys).collect::<Vec<_>>());
    }

    #[test]
    fn burn_refuses_to_train_a_profile() {
        let profile = ModelProfile::builtin("vgg16").unwrap();
        let spec = ModelSpec::from_profile(&profile);
        let err = crate::engine::BurnEngine::new(spec, 0).err().unwrap();
        assert!(err.to_string().contains("compute profile"), "{err}");
    }
}
