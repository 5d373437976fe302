//! `syncopate launch`: resolves and checks the job once, records it, starts every process
//! of it on this machine with the resolved job, and completes the job's outputs after.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use syncopate_core::net::NetworkProfile;
use syncopate_core::strategy::Averaged;
use syncopate_runtime::auth::{AuthError, JobToken, TOKEN_ENV};
use syncopate_runtime::checkpoint::{new_run_id, newest_complete_any};
use syncopate_runtime::job::JobLayout;
use syncopate_runtime::launch::{launch, LaunchPlan, LAUNCH_GRACE};
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
    let token = args.launch_token()?;
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

/// The name of the file in a checkpoint folder where `launch` keeps a token it generated.
const TOKEN_NAME: &str = "job.token";

impl JobArgs {
    /// The job's token for `launch`: the given one (a --token-file that does not exist yet
    /// receives a fresh one, kept there rather than beside the checkpoints), else the one
    /// kept in the folder resumed from (copied into another --checkpoint-dir, so that a
    /// later resume from there finds it), else the one kept in --checkpoint-dir, made and
    /// kept there on the first run; `None`: a fresh one.
    fn launch_token(&self) -> Result<Option<JobToken>> {
        if let Some(dir) = self.resume.as_deref().filter(|d| !d.is_dir()) {
            bail!("--resume {}: no such folder", dir.display());
        }
        let token_env = std::env::var(TOKEN_ENV).is_ok_and(|t| !t.trim().is_empty());
        let new_file = self.token_file.as_deref().filter(|p| !p.exists());
        if let (Some(path), None, false) = (new_file, &self.token, token_env) {
            if self.resume.is_some() {
                bail!(
                    "--token-file {}: no such file, and a resumed job needs the token it \
                     was started with",
                    path.display()
                );
            }
            let token = JobToken::generate();
            write_secret(path, &token.to_hex())?;
            return Ok(Some(token));
        }
        if let Some(token) = self.given_token()? {
            return Ok(Some(token));
        }
        if let Some(from) = self.resume.as_deref() {
            let path = from.join(TOKEN_NAME);
            if !path.exists() {
                bail!(
                    "{} has no {TOKEN_NAME}: resume with the job's --token or --token-file",
                    from.display()
                );
            }
            let token = JobToken::resolve(None, Some(&path))?;
            if let (Some(to), true) = (&self.checkpoint_dir, self.writes_into_another_folder()) {
                keep_token(to, &token)?;
            }
            return Ok(Some(token));
        }
        let Some(dir) = self.checkpoint_dir.as_deref() else {
            return Ok(None);
        };
        let path = dir.join(TOKEN_NAME);
        if path.exists() {
            return Ok(Some(JobToken::resolve(None, Some(&path))?));
        }
        let token = JobToken::generate();
        keep_token(dir, &token)?;
        Ok(Some(token))
    }

    /// The token given with `--token`, `--token-file` or the environment (`None`: `launch`
    /// makes a fresh one).
    fn given_token(&self) -> Result<Option<JobToken>> {
        match JobToken::resolve(self.token.as_deref(), self.token_file.as_deref()) {
            Ok(token) => Ok(Some(token)),
            Err(AuthError::NoToken) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// Keeps `token` as `dir/job.token` (mode 0600), replacing a file of another token there.
fn keep_token(dir: &std::path::Path, token: &JobToken) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(TOKEN_NAME);
    if path.exists() {
        if JobToken::resolve(None, Some(&path)).is_ok_and(|t| t.to_hex() == token.to_hex()) {
            return Ok(());
        }
        std::fs::remove_file(&path).with_context(|| format!("replacing {}", path.display()))?;
    }
    write_secret(&path, &token.to_hex())
}

/// What `config.toml` in a job's --metrics-dir holds: every flag with its default filled
/// in, and what the flags resolved to.
#[derive(Serialize)]
struct ResolvedConfig<'a> {
    sync: ResolvedSync,
    job: &'a JobArgs,
}

/// The synchronisation settings a job runs with, after defaults and --scale.
#[derive(Serialize)]
struct ResolvedSync {
    strategy: &'static str,
    scheduler: &'static str,
    descriptor: String,
    slice_params: usize,
    credit_bytes: usize,
    bucket_bytes: usize,
    /// The network in words (an absent bandwidth_bps below means unlimited).
    network_summary: String,
    network: NetworkProfile,
}

/// Writes the job's resolved configuration as `dir/config.toml`.
fn write_resolved_config(dir: &std::path::Path, args: &JobArgs, layout: &JobLayout) -> Result<()> {
    let config = ResolvedConfig {
        sync: ResolvedSync {
            strategy: layout.strategy.name(),
            scheduler: layout.scheduler.name(),
            descriptor: layout.sync_descriptor(),
            slice_params: layout.slice_params,
            credit_bytes: layout.credit_bytes,
            bucket_bytes: layout.bucket_bytes,
            network_summary: describe_network(&layout.network),
            network: layout.network.clone(),
        },
        job: args,
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("config.toml");
    let text = toml::to_string_pretty(&config).context("encoding the resolved config")?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// The network in words for the start-up banner and config.toml.
fn describe_network(p: &NetworkProfile) -> String {
    let bw = p.bandwidth_bps.map_or("unlimited".to_string(), |b| {
        format!("{:.3} Gbit/s", b / 1e9)
    });
    let loss = if p.is_lossy() {
        let unit = p
            .mtu_bytes
            .map_or("frame".to_string(), |m| format!("{m}-byte packet"));
        format!(
            ", loss {:.3} % per {unit} (rto {:.1} ms)",
            p.loss * 100.0,
            p.rto_ns as f64 / 1e6
        )
    } else {
        String::new()
    };
    format!(
        "{bw}, latency {:.3} ms, send buffer {} KiB{loss}",
        p.latency_ns as f64 / 1e6,
        p.buffer_bytes / 1024
    )
}

/// Writes `text` to a new file at `path` that only its owner may read.
fn write_secret(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
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
