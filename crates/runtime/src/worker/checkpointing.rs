//! A worker's checkpoint: its weights and buffers (every worker holds its own: under
//! the averaging strategies they differ), its momentum, the strategy's own state (DiLoCo's
//! anchor and outer momentum) and the steps done; the data sampler's position, the learning
//! rate's and the inner step within an averaging period follow from the steps.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use syncopate_train::checkpoint::{encode, engine_tensors, Decoded, NamedTensor};
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::LocalOptimizer;

use super::step_rows::RowsMark;
use super::WorkerTimes;
use crate::checkpoint::{
    newest_complete, write, CheckpointPlan, JobIdentity, ProcessState, ResumePoint,
};
use crate::error::RunError;

/// The name of `key`'s momentum in a worker's checkpoint.
fn momentum_name(key_name: &str) -> String {
    format!("momentum.{key_name}")
}

/// The name of tensor `index` of the strategy's own state in a worker's checkpoint.
fn sync_state_name(index: usize) -> String {
    format!("strategy.{index}")
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
    /// How far `evals-rank0.csv`'s rows went (kept in their own file, like the step rows;
    /// `None`: this worker evaluates not).
    pub(super) evals: Option<RowsMark>,
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
    /// Whether the strategy keeps state of its own to checkpoint
    /// ([`syncopate_core::strategy::WorkerSync::sync_state`]).
    pub keeps_sync_state: bool,
}

impl Checkpointer {
    /// Writes the state of `engine`, `optimizer` and the strategy (`sync_state`) after
    /// `steps` steps.
    pub fn write(
        &self,
        engine: &dyn LayerwiseEngine,
        optimizer: &LocalOptimizer,
        sync_state: Vec<Vec<f32>>,
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
        for (i, values) in sync_state.into_iter().enumerate() {
            tensors.push(NamedTensor {
                name: sync_state_name(i),
                shape: vec![values.len()],
                values,
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

/// What a resume loads into: the model, its optimizer, and the sizes of the strategy's own
/// state tensors (none for most strategies).
pub(crate) struct ResumeInto<'a> {
    pub engine: &'a mut dyn LayerwiseEngine,
    pub optimizer: &'a mut LocalOptimizer,
    pub state_sizes: &'a [usize],
}

/// What a resume found besides the model and optimizer it loaded.
pub(crate) struct Resumed {
    /// The steps the checkpoint holds.
    pub steps: u64,
    /// What had been measured until then (`None`: the checkpoint holds no record).
    pub carried: Option<CarriedRecord>,
    /// The strategy's own state.
    pub sync_state: Vec<Vec<f32>>,
    /// The run id of the checkpoint, which the job goes on under.
    pub run: String,
}

/// Resumes worker `rank` of `job` from the newest complete checkpoint in `dir`: loads its
/// state into `into`, and returns the steps done, what it had measured and the strategy's
/// own state.
pub(crate) fn resume(
    dir: &Path,
    job: &JobIdentity,
    rank: usize,
    into: ResumeInto<'_>,
) -> Result<Resumed, RunError> {
    let point = newest_complete(dir, job)?;
    let resumed = restore(&point, rank, into)?;
    tracing::info!(
        rank,
        steps = point.step,
        "resuming from {}",
        point.dir.display()
    );
    Ok(resumed)
}

/// Loads worker `rank`'s state from `point` into `into`.
fn restore(point: &ResumePoint, rank: usize, into: ResumeInto<'_>) -> Result<Resumed, RunError> {
    let bytes = point.read_state(rank)?;
    let path = point.dir.join(format!("rank-{rank}.safetensors"));
    let decoded = Decoded::parse(&bytes, Path::new(&path))?;
    decoded.load_into(into.engine)?;
    let velocity = into
        .engine
        .spec()
        .keys()
        .iter()
        .map(|k| decoded.tensor(&momentum_name(&k.name), &[k.shape.iter().product()]))
        .collect::<Result<Vec<_>, _>>()?;
    into.optimizer.restore(velocity, point.step)?;
    let sync_state = into
        .state_sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| decoded.tensor(&sync_state_name(i), &[len]))
        .collect::<Result<Vec<_>, _>>()?;
    let carried = match point.read_record(rank)? {
        None => None,
        Some(record) => Some(serde_json::from_slice(&record).map_err(|e| {
            RunError::Local(format!(
                "reading rank {rank}'s record in its checkpoint: {e}"
            ))
        })?),
    };
    Ok(Resumed {
        steps: point.step,
        carried,
        sync_state,
        run: point.run().to_string(),
    })
}
