//! `syncopate server`: one parameter server of a distributed job.

use anyhow::Result;
use syncopate_runtime::job::steps_of;
use syncopate_runtime::outcome::summary::write_server_own;
use syncopate_runtime::server::{run_server, ServerPlan};
use syncopate_train::checkpoint;

use super::{context, Job, MemberArgs};

/// `syncopate server`.
pub fn server_cmd(member: MemberArgs) -> Result<()> {
    let Job { args, layout, .. } = member.job()?;
    let ctx = context(&args, &layout, false)?;
    let s = &args.settings;
    // The server reads the dataset only to know the run's length in steps, which the
    // learning-rate schedule it applies depends on (exactly as the workers compute it).
    let (spec, data) = args.model_and_data()?;
    let initial = match &args.load {
        Some(path) => checkpoint::load_values(&spec, path)?,
        None => spec.init_params(s.seed),
    };
    let steps_hint = steps_of(
        s.duration()?,
        data.train.len(),
        s.batch_size,
        layout.workers,
    );
    let optim = s.optim(steps_hint)?;
    let plan = ServerPlan {
        initial,
        optim,
        weight_settings: args.weight_settings(&optim),
        steps: steps_hint,
        checkpoint: args.checkpoint_plan()?,
        resume: args.resume.clone(),
    };
    let summary = run_server(&ctx, &layout, &spec, plan)?;
    tracing::info!(
        updates = summary.updates,
        peak_early_values = summary.peak_early_values,
        "server done"
    );
    if let Some(loss) = &summary.losses.loss {
        tracing::info!(
            realised_loss = loss.realised_loss(),
            packets = loss.packets,
            ignored = loss.packets_ignored,
            probes = loss.probes_answered,
            "loss-tolerant pushes"
        );
    }
    if let Some(path) = &args.summary_json {
        write_server_own(path, ctx.rank, &summary)?;
    }
    Ok(())
}
