//! `syncopate launch`: resolves and checks the job once, records it, starts every process
//! of it on this machine with the resolved job, and completes the job's outputs after.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use syncopate_core::strategy::Averaged;
use syncopate_runtime::checkpoint::{new_run_id, newest_complete_any};
use syncopate_runtime::job::token::TokenSources;
use syncopate_runtime::job::{describe_network, JobLayout};
use syncopate_runtime::launch::{launch, LaunchPlan, LAUNCH_GRACE};
use syncopate_runtime::outcome::config::write_resolved_config;
use syncopate_runtime::outcome::replicas;
use syncopate_runtime::outcome::summary::{describe_loss, merge_datagrams, merge_loss_stats};
use syncopate_runtime::trace::merge_traces;
use syncopate_train::model;

use super::{JobArgs, LaunchedJob};

/// Refuses `--resume` from a checkpoint that already holds every step asked for with
/// `--steps`: the job would run nothing and report no accuracy.
fn refuse_a_finished_resume(args: &JobArgs) -> Result<()> {
    let (Some(dir), Some(steps)) = (args.resume.as_deref(), args.settings.steps) else {
        return Ok(());
    };
    match newest_complete_any(dir) {
        Some(done) if done >= steps => bail!(
            "--resume {}: its newest complete checkpoint is at step {done}, and --steps {steps} \
             asks for no more; give --steps above {done} to train on",
            dir.display()
        ),
        _ => Ok(()),
    }
}

/// `syncopate launch`: every process of the job on this machine, each handed the job as
/// resolved here.
pub fn launch_cmd(args: JobArgs) -> Result<()> {
    let layout = args.layout()?;
    args.checkpoint_plan()?;
    // What every process will check, checked here once, before any process starts.
    args.liveness.config()?;
    refuse_a_finished_resume(&args)?;
    let token = TokenSources {
        token: args.token.as_deref(),
        token_file: args.token_file.as_deref(),
        folders: args.folders(),
    }
    .launch_token()?;
    if let Some(t) = args.target_accuracy {
        if !(t > 0.0 && t <= 1.0) {
            bail!("--target-accuracy {t} is not a fraction in (0, 1] (e.g. 0.97)");
        }
    }
    if let Some(dir) = &args.metrics_dir {
        write_resolved_config(dir, &args, &layout)?;
    }
    if model::is_profile_name(&args.settings.model) && args.settings.steps.is_none() {
        bail!("profile models replay compute only: give --steps N");
    }
    let exe = std::env::current_exe().context("locating the syncopate executable")?;
    let replicas = match args.no_replica_stats || model::is_profile_name(&args.settings.model) {
        true => None,
        false => Some(replicas::snapshot_dir(
            args.replica_dir.as_deref(),
            args.metrics_dir.as_deref(),
        )?),
    };
    let handed = handed_job(&args, &layout, replicas.clone())?;
    let scale = match args.sync.scale {
        Some(f) => format!(" (model scaled by {f}: bytes and bandwidth)"),
        None => String::new(),
    };
    eprintln!(
        "launching {} worker(s) and {} server(s), {}, network {}{scale}",
        layout.workers,
        layout.servers,
        layout.sync_descriptor(),
        describe_network(&layout.network)
    );
    if layout.strategy.averages() == Averaged::Weights {
        eprintln!("{}", layout.describe_averaging());
    }
    launch(&LaunchPlan {
        exe,
        args: vec!["--launched-job".into(), handed.into()],
        subcommands: ["worker".into(), "server".into()],
        workers: layout.workers,
        servers: layout.servers,
        connect_timeout: Duration::from_secs_f64(args.connect_timeout.max(1.0)),
        grace: LAUNCH_GRACE,
        token,
    })?;
    if let Some(dir) = &replicas {
        replica_report(&args, layout.workers, dir)?;
    }
    if let (Some(path), true) = (&args.summary_json, layout.strategy.loss_tolerant()) {
        eprintln!("{}", describe_loss(&merge_loss_stats(path, &layout)?));
        if let Some(datagrams) = merge_datagrams(path, &layout)? {
            eprintln!("{}", datagrams.describe());
        }
    }
    if let (Some(dir), Some(_)) = (&args.metrics_dir, &args.trace_steps) {
        if let Some(path) = merge_traces(dir).context("merging the processes' traces")? {
            eprintln!(
                "timeline: {} (open it in https://ui.perfetto.dev)",
                path.display()
            );
        }
    }
    Ok(())
}

/// After a successful job: the replica statistics of every evaluation step in `dir`, into
/// evals-rank0.csv (--metrics-dir) and --summary-json, and one line on stdout; then the
/// snapshots are removed unless --keep-replicas.
fn replica_report(args: &JobArgs, workers: usize, dir: &std::path::Path) -> Result<()> {
    let (spec, data) = args.model_and_data()?;
    let outputs = replicas::ReplicaOutputs {
        metrics_dir: args.metrics_dir.as_deref(),
        summary_json: args.summary_json.as_deref(),
        keep: args.keep_replicas,
    };
    let report = replicas::report(spec, args.settings.seed, &data.test, workers, dir, &outputs)?;
    println!("{}", report.describe());
    if args.keep_replicas {
        eprintln!("replica snapshots kept in {}", dir.display());
    }
    Ok(())
}

/// The job as handed to every process on its command line (`--launched-job`): the flags
/// with what `launch` filled in, never the token (which every user of the machine could
/// read there; the processes get it in their environment).
fn handed_job(
    args: &JobArgs,
    layout: &JobLayout,
    replicas: Option<std::path::PathBuf>,
) -> Result<String> {
    let handed = LaunchedJob {
        job: JobArgs {
            replica_dir: args.replica_dir.clone().or(replicas),
            token: None,
            run_id: args.run_id.clone().or_else(|| Some(new_run_id())),
            ..args.clone()
        },
        sync: layout.sync.clone(),
        network: layout.network.clone(),
    };
    serde_json::to_string(&handed).context("encoding the resolved job")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Launch {
        #[command(flatten)]
        job: JobArgs,
    }

    #[test]
    fn the_handed_job_holds_no_token() {
        let token = "cd".repeat(32);
        let args = Launch::try_parse_from(["launch", "--workers", "2", "--token", &token])
            .unwrap()
            .job;
        assert_eq!(args.token.as_deref(), Some(token.as_str()));
        let handed = handed_job(&args, &args.layout().unwrap(), None).unwrap();
        assert!(!handed.contains(&token), "{handed}");
        assert!(handed.contains("\"workers\":2"), "{handed}");
    }
}
