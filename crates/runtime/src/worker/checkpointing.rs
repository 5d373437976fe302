//! A worker's checkpoint: its weights and buffers (every worker holds its own: under
//! step-wise averaging they differ), its momentum and the steps done; the data sampler's
//! position and the learning rate's follow from the steps.

use std::collections::BTreeMap;
use std::path::Path;

use syncopate_train::checkpoint::{encode, engine_tensors, Decoded, NamedTensor};
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::LocalOptimizer;

use crate::checkpoint::{write, CheckpointPlan, JobIdentity, ResumePoint};
use crate::error::RunError;

/// The name of `key`'s momentum in a worker's checkpoint.
fn momentum_name(key_name: &str) -> String {
    format!("momentum.{key_name}")
}

/// Writes one worker's checkpoints.
pub(crate) struct Checkpointer {
    /// Where and how often.
    pub plan: CheckpointPlan,
    /// The job, as its manifests name it.
    pub job: JobIdentity,
    /// This worker's rank.
    pub rank: usize,
}

impl Checkpointer {
    /// Writes the state of `engine` and `optimizer` after `steps` steps.
    pub fn write(
        &self,
        engine: &dyn LayerwiseEngine,
        optimizer: &LocalOptimizer,
        steps: u64,
    ) -> Result<(), RunError> {
        let spec = engine.spec();
        let mut tensors = engine_tensors(engine)?;
        for (k, v) in spec.keys().into_iter().zip(optimizer.velocity()) {
            tensors.push(NamedTensor {
                name: momentum_name(&k.name),
                shape: vec![v.len()],
                values: v.clone(),
            });
        }
        let metadata = BTreeMap::from([("steps".to_string(), steps.to_string())]);
        let bytes = encode(spec, &tensors, metadata, &self.plan.dir)?;
        write(&self.plan.dir, steps, self.rank, &self.job, &bytes)?;
        tracing::info!(rank = self.rank, steps, "checkpoint written");
        Ok(())
    }
}

/// Loads worker `rank`'s state from `point` into `engine` and `optimizer`.
pub(crate) fn restore(
    point: &ResumePoint,
    rank: usize,
    engine: &mut dyn LayerwiseEngine,
    optimizer: &mut LocalOptimizer,
) -> Result<(), RunError> {
    let bytes = point.read_state(rank)?;
    let path = point.dir.join(format!("rank-{rank}.safetensors"));
    let decoded = Decoded::parse(&bytes, Path::new(&path))?;
    decoded.load_into(engine)?;
    let velocity = engine
        .spec()
        .keys()
        .iter()
        .map(|k| decoded.tensor(&momentum_name(&k.name), &[k.shape.iter().product()]))
        .collect::<Result<Vec<_>, _>>()?;
    optimizer.restore(velocity, point.step)?;
    Ok(())
}
