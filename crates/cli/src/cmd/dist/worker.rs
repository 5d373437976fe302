//! `syncopate worker`: one worker of a distributed job, and worker 0's account of it
//! (the console lines, the tuner's outcome and the job's summary).

use anyhow::Result;
use syncopate_core::step::Straggler;
use syncopate_runtime::job::{steps_of, ProcessContext};
use syncopate_runtime::outcome::config::{describe_tuning, record_tuning};
use syncopate_runtime::outcome::summary::{write_job_summary, write_worker_own, JobOutcome};
use syncopate_runtime::worker::{run_worker, WorkerPlan, WorkerSummary};
use syncopate_train::engine::{BurnEngine, ProfileEngine};
use syncopate_train::model::ModelSpec;
use syncopate_train::trainer::{Duration as TrainDuration, Evaluation, Observer};

use super::{context, Job, JobArgs, MemberArgs};
use crate::progress::{RankNotices, TrainProgress};

/// `syncopate worker`.
pub fn worker_cmd(member: MemberArgs) -> Result<()> {
    let job = member.job()?;
    let (args, layout) = (&job.args, &job.layout);
    let mut ctx = context(args, layout, true)?;
    let s = &args.settings;
    let duration = s.duration()?;
    let (spec, data) = args.model_and_data()?;
    ctx.comm.liveness.stall_timeout_ns =
        layout.stall_timeout_ns(args.stall_timeout, spec.num_params())?;
    let steps_hint = steps_of(duration, data.train.len(), s.batch_size, layout.workers);
    let plan = worker_plan(args, &ctx, &spec, duration, steps_hint)?;
    let test_len = data.test.len();
    let mut progress = TrainProgress::new(steps_hint, args.quiet);
    let mut notices = RankNotices { rank: ctx.rank };
    let observer: &mut dyn Observer = if ctx.rank == 0 {
        &mut progress
    } else {
        &mut notices
    };
    let summary = if spec.is_profile() {
        let engine = ProfileEngine::new(spec.clone(), s.seed)?;
        run_worker(&ctx, layout, engine, data, &plan, observer)
    } else {
        let engine = BurnEngine::new(spec.clone(), s.seed)?;
        run_worker(&ctx, layout, engine, data, &plan, observer)
    };
    progress.finish();
    let summary = summary?;
    if let Some(path) = &args.summary_json {
        write_worker_own(path, ctx.rank, &summary)?;
    }
    if ctx.rank != 0 {
        return Ok(());
    }
    let test = summary.test.unwrap_or(Evaluation {
        accuracy: f64::NAN,
        loss: f64::NAN,
        samples: test_len,
    });
    report(&job, &summary, &test)
}

/// What this worker runs: the training settings, where it saves and what it records.
fn worker_plan(
    args: &JobArgs,
    ctx: &ProcessContext,
    spec: &ModelSpec,
    duration: TrainDuration,
    steps_hint: u64,
) -> Result<WorkerPlan> {
    let s = &args.settings;
    let optim = s.optim(steps_hint)?;
    Ok(WorkerPlan {
        batch_size: s.batch_size,
        duration,
        optim,
        weight_settings: args.weight_settings(&optim),
        seed: s.seed,
        load: args.load.clone(),
        // A job with a metrics directory keeps its final weights there (real models only).
        save: match (&args.save, &args.metrics_dir) {
            _ if ctx.rank != 0 => None,
            (Some(path), _) => Some(path.clone()),
            (None, Some(dir)) if !spec.is_profile() => Some(dir.join("weights.safetensors")),
            _ => None,
        },
        eval_every: args.eval_every,
        replica_dir: args.replica_dir.clone(),
        target_accuracy: args.target_accuracy,
        slowdown: Straggler::slowdown(&args.slow_worker, ctx.rank),
        checkpoint: args.checkpoint_plan()?,
        resume: args.resume.clone(),
    })
}

/// Worker 0's account of the job: the figures on stdout, the tuner's outcome, the summary.
fn report(job: &Job, summary: &WorkerSummary, test: &Evaluation) -> Result<()> {
    let (args, layout) = (&job.args, &job.layout);
    println!(
        "done: {} steps, {:.0} samples/s over {} workers, final loss {:.4}, test accuracy {:.2} % \
         (compute {:.1} s, waiting on communication {:.1} s)",
        summary.steps,
        summary.samples_per_sec,
        layout.workers,
        summary.final_loss,
        test.accuracy * 100.0,
        summary.times.compute,
        summary.times.wait
    );
    if let Some(target) = args.target_accuracy {
        match (summary.time_to_accuracy, summary.steps_to_accuracy) {
            (Some(t), Some(step)) => println!(
                "reached {:.2} % test accuracy after {t:.1} s of training (step {step})",
                target * 100.0
            ),
            _ => println!(
                "never reached {:.2} % test accuracy (evaluations: every epoch{})",
                target * 100.0,
                args.eval_every
                    .map_or(String::new(), |n| format!(" and every {n} steps"))
            ),
        }
    }
    if let Some(tune) = &summary.autotune {
        println!("{}", describe_tuning(tune, args.scale_factor()?));
        if let Some(dir) = &args.metrics_dir {
            record_tuning(dir, tune)?;
        }
    }
    if let Some(path) = &args.summary_json {
        let outcome = JobOutcome {
            command: if job.launched { "launch" } else { "worker" },
            worker0: summary,
            test,
            target_accuracy: args.target_accuracy,
            settings: args,
        };
        write_job_summary(path, layout, &outcome)?;
    }
    Ok(())
}
