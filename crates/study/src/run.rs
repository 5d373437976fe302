//! Running a study's matrix: one `syncopate launch` after another, each in its own run
//! directory; a run whose `summary.json` exists is finished and skipped, so an interrupted
//! study resumes where it stopped. A run of a real model checkpoints every tenth of its
//! steps into `checkpoints/`, and an interrupted run resumes from its newest complete
//! checkpoint rather than from scratch (its figures cover the whole run: the checkpoint
//! carries what the workers measured; the resource samples cover the last part only).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::io::Write;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use syncopate_runtime::checkpoint::newest_complete_any;

use crate::config::{RunSpec, StudyConfig, StudyKind};

/// Outcome of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunOutcome {
    /// Ran now and succeeded.
    Done,
    /// Finished by an earlier invocation.
    Skipped,
    /// Failed; the message says why (the run's `log.txt` has its output).
    Failed(String),
}

/// The file a finished run leaves.
pub fn summary_path(run_dir: &Path) -> PathBuf {
    run_dir.join("summary.json")
}

/// Runs every run of `config` not yet finished under `dir` with the `syncopate` executable
/// `exe`, with a progress bar.
pub fn run_matrix(
    config: &StudyConfig,
    dir: &Path,
    exe: &Path,
    run_timeout: Duration,
    quiet: bool,
) -> Result<Vec<(RunSpec, RunOutcome)>> {
    let runs = config.runs();
    let stale = stale_runs(&runs, dir);
    if !stale.is_empty() {
        anyhow::bail!(
            "{} finished run(s) under {} were made with other arguments than the study now \
             gives ({}); remove them (or use another --out) to run them again",
            stale.len(),
            dir.join("runs").display(),
            stale.join(", ")
        );
    }
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(runs.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {pos}/{len} runs, {elapsed} elapsed, ~{eta} left  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut outcomes = Vec::with_capacity(runs.len());
    for run in runs {
        bar.set_message(run.id.clone());
        let run_dir = dir.join("runs").join(&run.id);
        let outcome = if summary_path(&run_dir).is_file() {
            RunOutcome::Skipped
        } else {
            match execute(exe, config.kind, &run, &run_dir, run_timeout) {
                Ok(()) => RunOutcome::Done,
                Err(e) => {
                    let msg = format!("{e:#}");
                    bar.println(format!("run {} failed: {msg}", run.id));
                    RunOutcome::Failed(msg)
                }
            }
        };
        outcomes.push((run, outcome));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(outcomes)
}

/// The finished runs under `dir` whose recorded arguments (`run.toml`) differ from what
/// the study gives them now: resuming would silently reuse them.
pub fn stale_runs(runs: &[RunSpec], dir: &Path) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Recorded {
        args: Vec<String>,
    }
    runs.iter()
        .filter(|run| {
            let run_dir = dir.join("runs").join(&run.id);
            if !summary_path(&run_dir).is_file() {
                return false;
            }
            let recorded = std::fs::read_to_string(run_dir.join("run.toml"))
                .ok()
                .and_then(|text| toml::from_str::<Recorded>(&text).ok());
            recorded.is_none_or(|r| r.args != run.args)
        })
        .map(|run| run.id.clone())
        .collect()
}

/// One run: writes its place in the matrix as `run.toml` and its output as `log.txt`;
/// `launch` adds the job's resolved `config.toml`, the metrics, the final weights and (on
/// success) `summary.json`, written to a temporary name first so a killed run never looks
/// finished; `simulate` adds its report as `summary.json` the same way.
fn execute(
    exe: &Path,
    kind: StudyKind,
    run: &RunSpec,
    run_dir: &Path,
    timeout: Duration,
) -> Result<()> {
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    std::fs::write(
        run_dir.join("run.toml"),
        toml::to_string_pretty(run).context("encoding the run's config")?,
    )?;
    let partial = run_dir.join("summary.json.partial");
    let checkpoints = run_dir.join("checkpoints");
    let every = match kind {
        StudyKind::Launch => checkpoint_every(&run.args),
        StudyKind::Simulate => None,
    };
    let resume = every.and_then(|_| newest_complete_any(&checkpoints));
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(resume.is_some())
        .write(true)
        .truncate(resume.is_none())
        .open(run_dir.join("log.txt"))?;
    let mut cmd = Command::new(exe);
    cmd.arg(kind.command()).args(&run.args);
    if let Some(every) = every {
        cmd.arg("--checkpoint-every")
            .arg(every.to_string())
            .arg("--checkpoint-dir")
            .arg(&checkpoints);
    }
    if let (Some(_), None) = (every, resume) {
        // The run starts afresh: what an interrupted attempt left before its first
        // complete step is its own, not another job's.
        cmd.arg("--replace-checkpoints");
    }
    if let Some(step) = resume {
        writeln!(
            log,
            "study: resuming the interrupted run after its step {step}"
        )?;
        cmd.arg("--resume").arg(&checkpoints);
    }
    match kind {
        StudyKind::Launch => cmd
            .arg("--quiet")
            .arg("--summary-json")
            .arg(&partial)
            .arg("--metrics-dir")
            .arg(run_dir),
        StudyKind::Simulate => cmd.arg("--json").arg(&partial),
    };
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting syncopate {}", kind.command()))?;
    let status = wait_for(child, timeout, run_dir)?;
    if !status.success() {
        anyhow::bail!(
            "{} exited with {status} (see {})",
            kind.command(),
            run_dir.join("log.txt").display()
        );
    }
    std::fs::rename(&partial, summary_path(run_dir))
        .with_context(|| format!("the run wrote no summary ({})", partial.display()))?;
    // Finished: its weights are in weights.safetensors.
    if checkpoints.exists() {
        std::fs::remove_dir_all(&checkpoints)
            .with_context(|| format!("removing {}", checkpoints.display()))?;
    }
    Ok(())
}

/// Waits for `child` to exit, killing it after `timeout`.
fn wait_for(
    mut child: std::process::Child,
    timeout: Duration,
    run_dir: &Path,
) -> Result<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "no result after {} s (see {})",
                timeout.as_secs(),
                run_dir.join("log.txt").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How often a run with launch arguments `args` checkpoints: every tenth of its `--steps`
/// (at least 1), 50 steps without `--steps`; `None` for profile models, which hold no
/// weights worth keeping.
fn checkpoint_every(args: &[String]) -> Option<u64> {
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    if value("--model").is_some_and(|m| syncopate_train::model::is_profile_name(m)) {
        return None;
    }
    Some(match value("--steps").and_then(|s| s.parse::<u64>().ok()) {
        Some(steps) => (steps / 10).max(1),
        None => 50,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(steps: &str) -> RunSpec {
        RunSpec {
            id: "lenet-ps".into(),
            model: "lenet".into(),
            variant: "ps".into(),
            network: "1gbit".into(),
            bandwidth: "1gbit".into(),
            latency_ms: 0.0,
            workers: 2,
            seed: 1,
            args: vec!["--steps".into(), steps.into()],
        }
    }

    #[test]
    fn a_finished_run_made_with_other_arguments_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("runs").join("lenet-ps");
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::write(
            run_dir.join("run.toml"),
            toml::to_string(&spec("10")).unwrap(),
        )
        .unwrap();
        // Not finished: never stale.
        assert!(stale_runs(&[spec("20")], dir.path()).is_empty());
        std::fs::write(summary_path(&run_dir), "{}").unwrap();
        assert!(stale_runs(&[spec("10")], dir.path()).is_empty());
        assert_eq!(stale_runs(&[spec("20")], dir.path()), vec!["lenet-ps"]);
        std::fs::remove_file(run_dir.join("run.toml")).unwrap();
        assert_eq!(stale_runs(&[spec("10")], dir.path()), vec!["lenet-ps"]);
    }
}
