//! Studies: a matrix of distributed jobs (models x variants x bandwidths x workers x seeds)
//! run one after another, each a `syncopate launch` in its own directory (an interrupted
//! study resumes), and the report that compares them: `results.csv`, `report.html` and a
//! table on the terminal. This crate's one job is that loop from a study file to its
//! report; the `syncopate study` and `syncopate report` commands only hand it their flags.

mod compare;
mod config;
mod metrics;
mod report;
mod rows;
mod run;
mod table;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

pub use config::{ModelEntry, RunSpec, StudyConfig, Variant};
use run::RunOutcome;

/// How to run a study.
#[derive(Debug, Clone)]
pub struct StudyOptions {
    /// The study file (TOML).
    pub file: PathBuf,
    /// Folder that holds the study's directory (`<out>/<name>/`).
    pub out: PathBuf,
    /// How long one run may take before it is given up.
    pub run_timeout: Duration,
    /// No progress bar.
    pub quiet: bool,
    /// The `syncopate` executable whose `launch` runs each job.
    pub syncopate: PathBuf,
}

/// Runs the study's unfinished runs, then writes its report (and prints its table); fails
/// after the report when a run failed.
pub fn run_study(options: &StudyOptions) -> Result<()> {
    let config = StudyConfig::load(&options.file)?;
    let dir = options.out.join(&config.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(&options.file, dir.join("study.toml"))
        .with_context(|| format!("copying the study file into {}", dir.display()))?;
    let total = config.runs().len();
    eprintln!("study {}: {total} runs into {}", config.name, dir.display());
    let outcomes = run::run_matrix(
        &config,
        &dir,
        &options.syncopate,
        options.run_timeout,
        options.quiet,
    )?;
    let skipped = outcomes
        .iter()
        .filter(|(_, o)| *o == RunOutcome::Skipped)
        .count();
    let failed: Vec<_> = outcomes
        .iter()
        .filter_map(|(r, o)| match o {
            RunOutcome::Failed(why) => Some(format!("  {}: {why}", r.id)),
            _ => None,
        })
        .collect();
    if skipped > 0 {
        eprintln!("{skipped} run(s) were already finished and kept");
    }
    let path = build_report(&config, &dir)?;
    println!("report: {}", path.display());
    if !failed.is_empty() {
        bail!("{} run(s) failed:\n{}", failed.len(), failed.join("\n"));
    }
    Ok(())
}

/// Rebuilds the report of the study in `dir` (it holds `study.toml` and `runs/`) from its
/// finished runs.
pub fn rebuild_report(dir: &Path) -> Result<()> {
    let config = StudyConfig::load(&dir.join("study.toml"))?;
    let path = build_report(&config, dir)?;
    println!("report: {}", path.display());
    Ok(())
}

/// Prints the terminal table of the finished runs and writes the report; returns its path.
fn build_report(config: &StudyConfig, dir: &Path) -> Result<PathBuf> {
    let rows = rows::collect(config, dir)?;
    for line in table::terminal_lines(&rows) {
        println!("{line}");
    }
    report::write_report(config, dir, &rows)
}

#[cfg(test)]
mod tests;
