//! Measuring a built-in model's compute profile on this host: each layer's forward and
//! backward time, the median over timed steps of the layer-wise engine on a synthetic batch,
//! as the profile (`graph.txt`) that `simulate --model profile:FILE` and `launch --model
//! profile:FILE` replay. So a job of a real model can be simulated, or replayed on a network
//! with the compute it had here.

use std::time::Instant;

use syncopate_core::profile::{LayerProfile, ModelProfile};

use crate::data::{Batch, SyntheticSpec};
use crate::engine::{BurnEngine, LayerwiseEngine};
use crate::error::{Result, TrainError};
use crate::model::ModelSpec;

/// How a profile is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRun {
    /// Samples in the batch the layers run on.
    pub batch_size: usize,
    /// Untimed steps first (allocations, caches).
    pub warmup: usize,
    /// Timed steps; each layer's time is the median over them.
    pub steps: usize,
    /// Seed of the weights and of the synthetic batch.
    pub seed: u64,
}

/// One step's time per layer, nanoseconds: forward and backward.
type StepTimes = (Vec<u64>, Vec<u64>);

/// The compute profile of `spec` measured on this host (see the module documentation).
/// A layer's forward includes the loss for the last layer; a layer's backward runs from the
/// previous layer's gradients (or the start of backward) to its own.
pub fn measure(spec: &ModelSpec, run: &ProfileRun) -> Result<ModelProfile> {
    if run.batch_size == 0 || run.steps == 0 {
        return Err(TrainError::Config(
            "a profile needs a batch of at least one sample and at least one timed step".into(),
        ));
    }
    let batch = synthetic_batch(spec, run);
    let mut engine = BurnEngine::new(spec.clone(), run.seed)?;
    for _ in 0..run.warmup {
        time_step(&mut engine, &batch)?;
    }
    let mut steps = Vec::with_capacity(run.steps);
    for _ in 0..run.steps {
        steps.push(time_step(&mut engine, &batch)?);
    }
    let layers = spec.layers.iter().enumerate().map(|(k, layer)| {
        let sizes: Vec<usize> = layer.params.iter().map(|p| p.numel()).collect();
        LayerProfile {
            name: layer.name.clone(),
            op: format!("{:?}", layer.op),
            forward_ns: median(steps.iter().map(|(f, _)| f[k])),
            backward_ns: median(steps.iter().map(|(_, b)| b[k])),
            param_count: sizes.iter().sum(),
            tensors: if sizes.len() > 1 { sizes } else { Vec::new() },
        }
    });
    Ok(ModelProfile {
        name: spec.name.clone(),
        layers: layers.collect(),
        batch_size: Some(run.batch_size),
    })
}

/// A batch of `run.batch_size` synthetic samples of the model's input shape and classes.
fn synthetic_batch(spec: &ModelSpec, run: &ProfileRun) -> Batch {
    let data = SyntheticSpec {
        train_len: run.batch_size,
        test_len: 0,
        shape: spec.input,
        classes: spec.classes,
        seed: run.seed,
        ..SyntheticSpec::default()
    }
    .generate();
    let indices: Vec<usize> = (0..run.batch_size).collect();
    data.train.gather(&indices)
}

/// Runs one training forward and backward pass (no optimizer step: its cost is not a
/// layer's), timing each layer.
fn time_step(engine: &mut BurnEngine, batch: &Batch) -> Result<StepTimes> {
    let layers = engine.spec().layers.len();
    let mut forward = vec![0u64; layers];
    engine.begin_forward(batch)?;
    for (k, slot) in forward.iter_mut().enumerate() {
        let start = Instant::now();
        engine.forward_layer(k)?;
        if k + 1 == layers {
            engine.finish_forward()?;
        }
        *slot = nanos(start);
    }
    let mut backward = vec![0u64; layers];
    let mut since = Instant::now();
    engine.backward(&mut |k, _, _| {
        if let Some(slot) = backward.get_mut(k) {
            *slot = nanos(since);
        }
        since = Instant::now();
        Ok(())
    })?;
    Ok((forward, backward))
}

fn nanos(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The median of `values` (the lower one of an even count); 0 for none.
fn median(values: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model;

    #[test]
    fn a_measured_profile_has_the_models_keys_and_reads_back() {
        let spec = model::build("lenet", [1, 28, 28], 10).unwrap();
        let run = ProfileRun {
            batch_size: 4,
            warmup: 1,
            steps: 3,
            seed: 1,
        };
        let profile = measure(&spec, &run).unwrap();
        let sizes = |keys: Vec<(usize, usize)>| -> Vec<usize> {
            keys.into_iter().map(|(_, n)| n).collect()
        };
        let model_sizes: Vec<usize> = spec.keys().iter().map(|k| k.numel).collect();
        assert_eq!(sizes(profile.keys()), model_sizes);
        assert!(profile.layers.iter().all(|l| l.forward_ns > 0));
        assert!(profile.forward_ns() > 0 && profile.backward_ns() > 0);
        let back = ModelProfile::parse("lenet", &profile.to_graph_text()).unwrap();
        assert_eq!(sizes(back.keys()), model_sizes);
        assert_eq!(back.batch_size, Some(4));
        let replayed = ModelSpec::from_profile(&back);
        let replayed_sizes: Vec<usize> = replayed.keys().iter().map(|k| k.numel).collect();
        assert_eq!(replayed_sizes, model_sizes);
    }

    #[test]
    fn an_empty_batch_or_no_timed_step_is_refused() {
        let spec = model::build("mlp", [1, 28, 28], 10).unwrap();
        let run = ProfileRun {
            batch_size: 0,
            warmup: 0,
            steps: 1,
            seed: 1,
        };
        assert!(measure(&spec, &run).is_err());
        assert!(measure(
            &spec,
            &ProfileRun {
                batch_size: 2,
                steps: 0,
                ..run
            }
        )
        .is_err());
    }

    #[test]
    fn the_median_takes_the_middle_value() {
        assert_eq!(median([5, 1, 9].into_iter()), 5);
        assert_eq!(median([4, 1, 9, 7].into_iter()), 4);
        assert_eq!(median(std::iter::empty()), 0);
    }
}
