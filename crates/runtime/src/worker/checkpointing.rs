//! A worker's checkpoint: its weights and buffers (every worker holds its own: under
//! step-wise averaging they differ), its momentum and the steps done; the data sampler's
//! position and the learning rate's follow from the steps.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use syncopate_train::checkpoint::{encode, engine_tensors, Decoded, NamedTensor};
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::LocalOptimizer;

use super::step_rows::RowsMark;
use super::{EvalLog, WorkerTimes};
use crate::checkpoint::{
    newest_complete, write, CheckpointPlan, JobIdentity, ProcessState, ResumePoint,
};
use crate::error::RunError;

/// The name of `key`'s momentum in a worker's checkpoint.
fn momentum_name(key_name: &str) -> String {
    format!("momentum.{key_name}")
}

/// What a checkpoint keeps of what a worker's training loop measured, so that a resumed job
/// reports the whole job: its evaluations, times and where its step rows went, and its training time so far.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct CarriedRecord {
    /// Per-phase times.
    pub(super) times: WorkerTimes,
    /// The last (up to) 20 training losses.
    pub(super) recent: VecDeque<f64>,
    /// Test accuracy after each epoch.
    pub(super) epoch_accuracy: Vec<f64>,
    /// Every evaluation.
    pub(super) evals: EvalLog,
    /// How far `steps-rank<R>.csv`'s rows went (kept in their own file, see
    /// [`super::step_rows`]; `None`: this worker kept none).
    pub(super) rows: Option<RowsMark>,
    /// Training seconds so far (evaluations left out).
    pub(super) trained: f64,
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
        record: &CarriedRecord,
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
        let record = serde_json::to_vec(record)
            .map_err(|e| RunError::Local(format!("encoding the worker's record: {e}")))?;
        let written = ProcessState {
            state: &bytes,
            record: Some(&record),
        };
        write(&self.plan.dir, steps, self.rank, &self.job, written)?;
        tracing::info!(rank = self.rank, steps, "checkpoint written");
        Ok(())
    }
}

/// Resumes worker `rank` of `job` from the newest complete checkpoint in `dir`: loads its
/// state into `engine` and `optimizer`, and returns the steps done and what it had measured.
pub(crate) fn resume(
    dir: &Path,
    job: &JobIdentity,
    rank: usize,
    engine: &mut dyn LayerwiseEngine,
    optimizer: &mut LocalOptimizer,
) -> Result<(u64, Option<CarriedRecord>), RunError> {
    let point = newest_complete(dir, job)?;
    let carried = restore(&point, rank, engine, optimizer)?;
    tracing::info!(
        rank,
        steps = point.step,
        "resuming from {}",
        point.dir.display()
    );
    Ok((point.step, carried))
}

/// Loads worker `rank`'s state from `point` into `engine` and `optimizer`; returns what it
/// had measured until then (`None`: the checkpoint holds no record).
fn restore(
    point: &ResumePoint,
    rank: usize,
    engine: &mut dyn LayerwiseEngine,
    optimizer: &mut LocalOptimizer,
) -> Result<Option<CarriedRecord>, RunError> {
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
    let Some(record) = point.read_record(rank)? else {
        return Ok(None);
    };
    let record = serde_json::from_slice(&record).map_err(|e| {
        RunError::Local(format!(
            "reading rank {rank}'s record in its checkpoint: {e}"
        ))
    })?;
    Ok(Some(record))
}
