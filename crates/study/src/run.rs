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

use crate::config::{RunSpec, StudyConfig, StudyKind, TESTBED};
use crate::select::Selection;
use crate::testbed;

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

/// Where a cell's job runs, under its run directory.
pub fn runtime_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("runtime")
}

/// Where a cell's simulation runs.
pub fn simulator_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("simulator")
}

/// Where a fidelity cell's job runs on the namespace testbed.
pub fn kernel_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("kernel")
}

/// Where a fidelity cell's job runs on the emulated network.
pub fn emulator_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("emulator")
}

/// The simulator's arguments for a cell: the job's without `--scale`, since the simulator
/// runs the full-size model (a scaled job stands for it).
pub fn simulator_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut given = args.iter();
    while let Some(a) = given.next() {
        if a == "--scale" {
            given.next();
        } else if !a.starts_with("--scale=") {
            out.push(a.clone());
        }
    }
    out
}

/// One command of a run: a run of a `launch` or `simulate` study is one, a cell of an
/// agreement study two (the job in `runtime/`, the simulation in `simulator/`).
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The `syncopate` subcommand.
    pub command: &'static str,
    /// Where it writes its `run.toml`, `log.txt` and `summary.json`.
    pub dir: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// The commands of `run`, whose directory is `run_dir`, in the order they run.
pub fn parts(kind: StudyKind, run: &RunSpec, run_dir: &Path) -> Vec<Part> {
    let part = |command, dir: PathBuf, args| Part { command, dir, args };
    match kind {
        StudyKind::Launch => vec![part("launch", run_dir.to_path_buf(), run.args.clone())],
        StudyKind::Simulate => vec![part("simulate", run_dir.to_path_buf(), run.args.clone())],
        StudyKind::Agreement => vec![
            part("launch", runtime_dir(run_dir), run.args.clone()),
            part(
                "simulate",
                simulator_dir(run_dir),
                simulator_args(&run.args),
            ),
        ],
        StudyKind::Kernel => vec![part(TESTBED, run_dir.to_path_buf(), run.testbed.clone())],
        StudyKind::Fidelity => vec![
            part(TESTBED, kernel_dir(run_dir), run.testbed.clone()),
            part("launch", emulator_dir(run_dir), run.args.clone()),
        ],
        StudyKind::SimulatorKernel => vec![
            part(TESTBED, kernel_dir(run_dir), run.testbed.clone()),
            part("simulate", simulator_dir(run_dir), run.args.clone()),
        ],
    }
}

/// Runs every run of `config` that `selection` keeps and is not yet finished under `dir`
/// with the `syncopate` executable `exe`, with a progress bar.
pub fn run_matrix(
    config: &StudyConfig,
    selection: &Selection,
    dir: &Path,
    exe: &Path,
    run_timeout: Duration,
    quiet: bool,
) -> Result<Vec<(RunSpec, RunOutcome)>> {
    let runs: Vec<RunSpec> = config
        .runs()
        .into_iter()
        .filter(|r| selection.keeps(r))
        .collect();
    let stale = stale_runs(config.kind, &runs, dir);
    if !stale.is_empty() {
        anyhow::bail!(
            "{} finished run(s) under {} were made with other arguments than the study now \
             gives ({}); remove them (or use another --out) to run them again",
            stale.len(),
            dir.join("runs").display(),
            stale.join(", ")
        );
    }
    check_network_files(config.kind, &runs, dir)?;
    let unfinished = |run: &RunSpec| {
        parts(config.kind, run, &dir.join("runs").join(&run.id))
            .iter()
            .any(|p| p.command == TESTBED && !summary_path(&p.dir).is_file())
    };
    if runs.iter().any(unfinished) {
        testbed::check_host()?;
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
        let mut outcome = RunOutcome::Skipped;
        for part in parts(config.kind, &run, &run_dir) {
            if summary_path(&part.dir).is_file() {
                continue;
            }
            if let Err(e) = execute(exe, &part, &run, run_timeout) {
                let msg = format!("{e:#}");
                bar.println(format!("run {} failed: {msg}", run.id));
                outcome = RunOutcome::Failed(msg);
                break;
            }
            outcome = RunOutcome::Done;
        }
        outcomes.push((run, outcome));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(outcomes)
}

/// Stops a study before its first run if a run still to do names a `--network` file that
/// does not exist.
fn check_network_files(kind: StudyKind, runs: &[RunSpec], dir: &Path) -> Result<()> {
    let to_do = runs.iter().filter(|run| {
        parts(kind, run, &dir.join("runs").join(&run.id))
            .iter()
            .any(|p| !summary_path(&p.dir).is_file())
    });
    if let Some((run, file)) = missing_network_file(to_do) {
        let here = std::env::current_dir().unwrap_or_default();
        anyhow::bail!(
            "run {}: its network file {file} is not under the current folder ({}); run the \
             study from the folder its paths start from (the repository root for studies/)",
            run.id,
            here.display()
        );
    }
    Ok(())
}

/// The first of `runs` whose `--network` file does not exist (paths are read from the
/// current folder): without this check it fails only when its turn comes.
fn missing_network_file<'a>(
    mut runs: impl Iterator<Item = &'a RunSpec>,
) -> Option<(&'a RunSpec, &'a str)> {
    runs.find_map(|run| {
        (run.arg("--network"))
            .filter(|file| !Path::new(file).is_file())
            .map(|file| (run, file))
    })
}

/// The finished runs under `dir` (a study of `kind`) whose recorded arguments (`run.toml`)
/// differ from what the study gives them now: resuming would silently reuse them.
pub fn stale_runs(kind: StudyKind, runs: &[RunSpec], dir: &Path) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Recorded {
        args: Vec<String>,
    }
    let stale = |part: &Part| {
        if !summary_path(&part.dir).is_file() {
            return false;
        }
        let recorded = std::fs::read_to_string(part.dir.join("run.toml"))
            .ok()
            .and_then(|text| toml::from_str::<Recorded>(&text).ok());
        recorded.is_none_or(|r| r.args != part.args)
    };
    runs.iter()
        .filter(|run| {
            parts(kind, run, &dir.join("runs").join(&run.id))
                .iter()
                .any(stale)
        })
        .map(|run| run.id.clone())
        .collect()
}

/// One run: writes its place in the matrix as `run.toml` and its output as `log.txt`;
/// `launch` adds the job's resolved `config.toml`, the metrics, the final weights and (on
/// success) `summary.json`, written to a temporary name first so a killed run never looks
/// finished; `simulate` adds its report as `summary.json` the same way.
fn execute(exe: &Path, part: &Part, run: &RunSpec, timeout: Duration) -> Result<()> {
    if part.command == TESTBED {
        return execute_testbed(exe, part, run, timeout);
    }
    let run_dir = part.dir.as_path();
    let launch = part.command == "launch";
    record(part, run)?;
    let partial = run_dir.join("summary.json.partial");
    let checkpoints = run_dir.join("checkpoints");
    let every = if launch {
        checkpoint_every(&part.args)
    } else {
        None
    };
    let resume = every.and_then(|_| newest_complete_any(&checkpoints));
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(resume.is_some())
        .write(true)
        .truncate(resume.is_none())
        .open(run_dir.join("log.txt"))?;
    let mut cmd = Command::new(exe);
    cmd.arg(part.command).args(&part.args);
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
    if launch {
        cmd.arg("--quiet")
            .arg("--summary-json")
            .arg(&partial)
            .arg("--metrics-dir")
            .arg(run_dir);
    } else {
        cmd.arg("--json").arg(&partial);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting syncopate {}", part.command))?;
    let status = wait_for(child, timeout, run_dir)?;
    if !status.success() {
        anyhow::bail!(
            "{} exited with {status} (see {})",
            part.command,
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

/// Writes `part`'s place in the matrix as `run.toml` into its directory (created).
fn record(part: &Part, run: &RunSpec) -> Result<()> {
    std::fs::create_dir_all(&part.dir)
        .with_context(|| format!("creating {}", part.dir.display()))?;
    let recorded = RunSpec {
        args: part.args.clone(),
        ..run.clone()
    };
    std::fs::write(
        part.dir.join("run.toml"),
        toml::to_string_pretty(&recorded).context("encoding the run's config")?,
    )?;
    Ok(())
}

/// One cell on the namespace testbed: `run.toml`, then the testbed's output as `log.txt`,
/// worker 0's `summary.json`, the kernel's counters (`kernel.json`, `tcp.json`) and every
/// process's log; a failed cell leaves no `summary.json`.
fn execute_testbed(exe: &Path, part: &Part, run: &RunSpec, timeout: Duration) -> Result<()> {
    record(part, run)?;
    let summary = summary_path(&part.dir);
    let _ = std::fs::remove_file(&summary);
    let log = std::fs::File::create(part.dir.join("log.txt"))?;
    let child = testbed::command(exe, &part.args, &part.dir)?
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting the namespace testbed")?;
    let status = wait_for(child, timeout, &part.dir)?;
    if !status.success() {
        let _ = std::fs::remove_file(&summary);
        anyhow::bail!(
            "the testbed exited with {status} (see {})",
            part.dir.join("log.txt").display()
        );
    }
    if !summary.is_file() {
        anyhow::bail!("the testbed wrote no summary ({})", summary.display());
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
            testbed: Vec::new(),
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
        let stale = |s| stale_runs(StudyKind::Launch, &[spec(s)], dir.path());
        assert!(stale("20").is_empty());
        std::fs::write(summary_path(&run_dir), "{}").unwrap();
        assert!(stale("10").is_empty());
        assert_eq!(stale("20"), vec!["lenet-ps"]);
        std::fs::remove_file(run_dir.join("run.toml")).unwrap();
        assert_eq!(stale("10"), vec!["lenet-ps"]);
    }

    #[test]
    fn a_missing_network_file_is_named_before_any_run() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("two-paths.toml");
        std::fs::write(&file, "").unwrap();
        let with = |path: &Path| {
            let mut run = spec("10");
            run.args
                .extend(["--network".into(), path.display().to_string()]);
            run
        };
        let runs = [
            spec("10"),
            with(&file),
            with(&dir.path().join("absent.toml")),
        ];
        let (run, missing) = missing_network_file(runs.iter()).expect("one is missing");
        assert_eq!(run.args, runs[2].args);
        assert!(missing.ends_with("absent.toml"));
        assert!(missing_network_file(runs[..2].iter()).is_none());
    }

    #[test]
    fn an_agreement_cell_is_a_scaled_job_and_a_full_size_simulation() {
        let mut run = spec("10");
        run.args
            .extend(["--scale", "1/16", "--model", "profile:vgg19"].map(String::from));
        let dir = Path::new("runs/cell");
        let parts = parts(StudyKind::Agreement, &run, dir);
        assert_eq!(parts.len(), 2);
        assert_eq!(
            (parts[0].command, parts[0].dir.as_path()),
            ("launch", Path::new("runs/cell/runtime"))
        );
        assert_eq!(parts[0].args, run.args);
        assert_eq!(parts[1].command, "simulate");
        assert_eq!(parts[1].dir, Path::new("runs/cell/simulator"));
        assert_eq!(parts[1].args, ["--steps", "10", "--model", "profile:vgg19"]);
        let one = super::parts(StudyKind::Simulate, &run, dir);
        assert_eq!((one.len(), one[0].dir.as_path()), (1, dir));
    }

    #[test]
    fn the_simulator_runs_at_full_size() {
        let args: Vec<String> = [
            "--model",
            "profile:vgg19",
            "--scale",
            "1/16",
            "--scale=2",
            "--steps",
            "4",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            simulator_args(&args),
            ["--model", "profile:vgg19", "--steps", "4"]
        );
    }
}
