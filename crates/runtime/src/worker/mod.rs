//! A worker process: trains its shard on a compute thread, in the order core's step
//! sequencer gives ([`step_loop`]), while a communication thread ([`comm_thread`]) drives
//! the strategy's state machine over the links; its outcome is a [`WorkerSummary`].

use std::sync::Arc;

use syncopate_core::registry::KeyInfo;
use syncopate_core::step::{CheckpointSchedule, EvalSchedule, StepPlan, StepSequencer};
use syncopate_core::strategy::WorkerSync;
use syncopate_train::checkpoint;
use syncopate_train::data::{Dataset, EpochSampler, Loader};
use syncopate_train::engine::LayerwiseEngine;
use syncopate_train::trainer::{Duration, LocalOptimizer, Observer, OptimConfig};

use crate::checkpoint::{CheckpointPlan, JobIdentity};
use crate::error::RunError;
use crate::job::{key_infos, JobLayout, ProcessContext};
use crate::trace::TraceRecorder;

mod checkpointing;
mod comm_thread;
mod eval_log;
mod step_loop;
mod step_rows;
mod summary;
use checkpointing::CarriedRecord;
use checkpointing::Checkpointer;
use comm_thread::connect;
use eval_log::EvalLog;
use step_loop::{Record, StepLoop};
use step_rows::Log;
use summary::summarise;
pub use summary::{EvalPoint, OwnLoss, WorkerSummary, WorkerTimes};

/// What a worker trains and how.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Samples per step on this worker.
    pub batch_size: usize,
    /// How long.
    pub duration: Duration,
    /// Optimizer (applied locally by all-reduce workers, by the servers otherwise).
    pub optim: OptimConfig,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Initial weights.
    pub load: Option<std::path::PathBuf>,
    /// Where rank 0 saves the final weights.
    pub save: Option<std::path::PathBuf>,
    /// Rank 0 also evaluates every this many steps (besides at the end of every epoch).
    pub eval_every: Option<u64>,
    /// Where every worker writes a snapshot of its weights at each evaluation point (see
    /// [`crate::replicas`]); `None`: no snapshots. Profile models write none.
    pub replica_dir: Option<std::path::PathBuf>,
    /// Test accuracy (a fraction) whose first evaluation at or above it sets the time to
    /// accuracy.
    pub target_accuracy: Option<f64>,
    /// Compute takes this many times as long as measured (a straggler, `--slow-worker`);
    /// 1 for a normal worker.
    pub slowdown: f64,
    /// Where and how often this worker writes checkpoints (`None`: never).
    pub checkpoint: Option<CheckpointPlan>,
    /// A checkpoint folder to resume from (its newest step every process completed).
    pub resume: Option<std::path::PathBuf>,
    /// The training settings that change the weights, which its checkpoints record and a
    /// resumed job must repeat (every process of the job is given the same).
    pub weight_settings: crate::checkpoint::WeightSettings,
}

/// Runs worker `ctx.rank`: joins the job, trains (or replays a compute profile) as core's
/// step sequencer directs, and (rank 0) evaluates and saves.
pub fn run_worker<E: LayerwiseEngine>(
    ctx: &ProcessContext,
    layout: &JobLayout,
    mut engine: E,
    data: Dataset,
    plan: &WorkerPlan,
    observer: &mut dyn Observer,
) -> Result<WorkerSummary, RunError> {
    let spec = engine.spec().clone();
    let keys: Vec<KeyInfo> = key_infos(&spec);
    let sizes: Vec<usize> = keys.iter().map(|k| k.numel).collect();
    let mut endpoint = layout.worker_endpoint(ctx.rank, keys.clone());
    let state_sizes: Vec<usize> = endpoint.sync_state().iter().map(Vec::len).collect();
    let start = starting_state(ctx, layout, plan, &mut engine, &sizes, &state_sizes)?;
    start_endpoint(endpoint.as_mut(), &engine, &start)?;
    let evaluates = ctx.rank == 0 && !spec.is_profile();
    let snapshots = plan.replica_dir.clone().filter(|_| !spec.is_profile());
    let buffer_values = engine.buffers()?.iter().map(|(_, v)| v.len()).sum();
    let fingerprint = spec.fingerprint();
    let mut comm = connect(ctx, layout, &keys, endpoint, buffer_values, fingerprint)?;
    let resources = ctx.start_sampler(comm.traffic.clone())?;

    let sampler = EpochSampler::new(
        data.train.len(),
        plan.batch_size,
        ctx.rank,
        layout.workers,
        plan.seed,
    )?;
    let steps_per_epoch = sampler.steps_per_epoch() as u64;
    let evaluated = evaluates || snapshots.is_some();
    let mut seq = StepSequencer::new(
        step_plan(plan, layout, &spec, &keys, steps_per_epoch, evaluated)
            .with_buffer_sync(buffer_values > 0 && layout.workers > 1)
            .resumed_at(start.first_step),
    );
    let mut run = StepLoop::new(
        &mut engine,
        &mut comm,
        Loader::spawn(Arc::new(data.train), sampler, start.first_step, None, 4),
        start.optimizer,
        evaluates.then_some(&data.test),
        observer,
        ctx.tracer(),
        &sizes,
    );
    run.slowdown = plan.slowdown;
    run.rank = ctx.rank;
    run.snapshots = snapshots.map(|dir| (dir, ctx.rank));
    run.record = starting_record(ctx, plan, start.carried, evaluates)?;
    run.checkpoints = plan.checkpoint.clone().map(|plan| Checkpointer {
        plan,
        job: start.job,
        rank: ctx.rank,
        keeps_sync_state: !state_sizes.is_empty(),
    });
    run.global_batch = plan.batch_size * layout.workers;
    run.run(&mut seq)?;
    let tensor_completion = run.tensors.run().summary();
    let (mut record, tracer) = (run.record, run.tracer);
    if ctx.rank == 0 {
        if let Some(path) = &plan.save {
            checkpoint::save(&engine, path)?;
        }
    }
    let mut outcome = comm.finish()?;
    crate::sampler::finish_sampler(resources)?;
    write_outputs(ctx, tracer, outcome.frames.take(), &mut record, evaluates)?;
    let model_bytes = (spec.num_params() * 4) as f64;
    let mut summary = summarise(ctx.rank, plan, layout, model_bytes, record, outcome, &seq);
    summary.tensor_completion = tensor_completion;
    Ok(summary)
}

/// The record a worker starts with: a new one, or a resumed job's (`carried`) going on;
/// either way with its step rows' file open (see [`step_rows`]).
fn starting_record(
    ctx: &ProcessContext,
    plan: &WorkerPlan,
    carried: Option<CarriedRecord>,
    evaluates: bool,
) -> Result<Record, RunError> {
    let checkpoints = plan.checkpoint.as_ref().map(|c| c.dir.as_path());
    let metrics = ctx.metrics.as_ref().map(|m| m.dir.as_path());
    let resume_dir = plan.resume.as_deref();
    let resumed_rows = resume_dir.zip(carried.as_ref().and_then(|c| c.rows.as_ref()));
    let (rows, earlier) =
        step_rows::open(Log::Steps, ctx.rank, checkpoints, metrics, resumed_rows)?;
    let evals = if evaluates {
        let resumed_evals = resume_dir.zip(carried.as_ref().and_then(|c| c.evals.as_ref()));
        let (file, earlier_evals) =
            step_rows::open(Log::Evals, ctx.rank, checkpoints, metrics, resumed_evals)?;
        EvalLog::resumed(file, &earlier_evals)?
    } else {
        EvalLog::default()
    };
    Ok(match carried {
        Some(carried) => Record::resumed(carried, rows, step_rows::step_seconds(&earlier), evals),
        None => Record::new(rows, evals),
    })
}

/// Where a worker starts: its optimizer, the steps already done and what was measured
/// during them (a resumed job's), and the job's identity in its checkpoints.
struct StartingState {
    optimizer: LocalOptimizer,
    first_step: u64,
    carried: Option<CarriedRecord>,
    job: JobIdentity,
    /// The strategy's own state in the checkpoint resumed from (`None`: not resumed).
    sync_state: Option<Vec<Vec<f32>>>,
}

/// Readies `endpoint` for the first step of this run: its own state restored from the
/// checkpoint resumed from, or else the model's initial weights handed over.
fn start_endpoint(
    endpoint: &mut dyn WorkerSync,
    engine: &dyn LayerwiseEngine,
    start: &StartingState,
) -> Result<(), RunError> {
    endpoint.start_at(start.first_step);
    if let Some(state) = &start.sync_state {
        return endpoint
            .restore_sync_state(state.clone())
            .map_err(|e| RunError::Local(format!("resuming the strategy's state: {e}")));
    }
    for key in 0..engine.spec().keys().len() {
        let values = engine.param(key)?;
        endpoint.handle_initial_weights(key, &values);
    }
    Ok(())
}

/// Loads the initial weights into `engine` (`plan.load`) and resumes from the newest
/// complete checkpoint (`plan.resume`), if asked; `sizes` are the model's key sizes,
/// `state_sizes` those of the strategy's own state.
fn starting_state<E: LayerwiseEngine>(
    ctx: &ProcessContext,
    layout: &JobLayout,
    plan: &WorkerPlan,
    engine: &mut E,
    sizes: &[usize],
    state_sizes: &[usize],
) -> Result<StartingState, RunError> {
    if let Some(path) = &plan.load {
        checkpoint::load(engine, path)?;
    }
    let mut optimizer = LocalOptimizer::new(plan.optim, sizes);
    let mut job = layout.identity(&ctx.token, engine.spec(), &plan.weight_settings);
    if let Some(checkpoints) = &plan.checkpoint {
        job = checkpoints.fresh_identity(job);
    }
    let into = checkpointing::ResumeInto {
        engine,
        optimizer: &mut optimizer,
        state_sizes,
    };
    let (first_step, carried, sync_state) = match &plan.resume {
        Some(dir) => {
            let resumed = checkpointing::resume(dir, &job, ctx.rank, into)?;
            job = job.with_run(&resumed.run);
            (resumed.steps, resumed.carried, Some(resumed.sync_state))
        }
        None => (0, None, None),
    };
    Ok(StartingState {
        optimizer,
        first_step,
        carried,
        job,
        sync_state,
    })
}

/// The step sequencer's plan of a worker training `spec` (whose keys are `keys`) for
/// `plan.duration`, with `steps_per_epoch`, evaluating if `evaluates`.
fn step_plan(
    plan: &WorkerPlan,
    layout: &JobLayout,
    spec: &syncopate_train::model::ModelSpec,
    keys: &[KeyInfo],
    steps_per_epoch: u64,
    evaluates: bool,
) -> StepPlan {
    let total = match plan.duration {
        Duration::Epochs(e) => e * steps_per_epoch,
        Duration::Steps(s) => s,
    };
    let eval = EvalSchedule {
        enabled: evaluates,
        steps_per_epoch,
        every: plan.eval_every,
    };
    let checkpoints = CheckpointSchedule {
        every: plan.checkpoint.as_ref().map(|c| c.every),
    };
    StepPlan::new(layout.strategy, total, spec.layer_keys())
        .with_eval(eval)
        .with_checkpoints(checkpoints)
        .with_tuning(layout.tune_spec(keys))
}

/// Writes the run directory's per-worker files: steps, timeline, evaluations.
fn write_outputs(
    ctx: &ProcessContext,
    mut tracer: Option<TraceRecorder>,
    frame_trace: Option<TraceRecorder>,
    record: &mut Record,
    evaluates: bool,
) -> Result<(), RunError> {
    if let (Some(t), Some(frames)) = (tracer.as_mut(), frame_trace) {
        t.absorb(frames);
    }
    let Some(m) = &ctx.metrics else {
        record.evals.rows.finish(None)?;
        return record.step_rows.finish(None);
    };
    let steps_csv = step_rows::steps_csv_in(&m.dir, ctx.rank);
    record.step_rows.finish(Some(&steps_csv))?;
    if let Some(t) = &tracer {
        t.write(&m.dir, &format!("worker {}", ctx.rank))
            .map_err(|e| RunError::Local(format!("writing the trace: {e}")))?;
    }
    if evaluates {
        (record.evals.rows).finish(Some(&Log::Evals.in_metrics(&m.dir, ctx.rank)))?;
    }
    Ok(())
}
