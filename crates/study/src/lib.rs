//! Studies: a matrix of distributed jobs (models x variants x bandwidths x workers x seeds)
//! run one after another, each a `syncopate launch` in its own directory (an interrupted
//! study resumes), and the report that compares them: `results.csv`, `report.html` and a
//! table on the terminal. This crate's one job is that loop from a study file to its
//! report; the `syncopate study` and `syncopate report` commands only hand it their flags.
//! A study's `kind` says what a run is: a job (`launch`), a simulation (`simulate`), or both
//! side by side (`agreement`), a job on the kernel's network-namespace testbed (`kernel`), or
//! that and the emulated job side by side (`fidelity`). A simulated study also sets each variant against its
//! `baseline` in `table.md` (see `sim_matrix`).

mod agreement;
mod compare;
mod config;
mod csv_format;
mod curves;
mod fidelity;
mod metrics;
mod pairs;
mod report;
mod rows;
mod run;
mod scale;
mod select;
mod sim_kernel;
mod sim_matrix;
mod sim_rows;
mod styles;
mod table;
mod testbed;
mod traffic;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

pub use config::{ModelEntry, NetworkEntry, RunSpec, StudyConfig, StudyKind, Variant};
use run::RunOutcome;
pub use select::Selection;

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
    /// The variants and networks to run now (default: all).
    pub selection: Selection,
}

/// Runs the study's unfinished runs, then writes its report (and prints its table); fails
/// after the report when a run failed.
pub fn run_study(options: &StudyOptions) -> Result<()> {
    let config = StudyConfig::load(&options.file)?;
    let dir = options.out.join(&config.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(&options.file, dir.join("study.toml"))
        .with_context(|| format!("copying the study file into {}", dir.display()))?;
    options.selection.check(&config)?;
    let total = config
        .runs()
        .iter()
        .filter(|r| options.selection.keeps(r))
        .count();
    eprintln!("study {}: {total} runs into {}", config.name, dir.display());
    let outcomes = run::run_matrix(
        &config,
        &options.selection,
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
    if config.kind == StudyKind::Agreement {
        return pairs::report::<agreement::AgreementRow>(config, dir);
    }
    if config.kind == StudyKind::Fidelity {
        return pairs::report::<fidelity::FidelityRow>(config, dir);
    }
    if config.kind == StudyKind::SimulatorKernel {
        return pairs::report::<sim_kernel::SimKernelRow>(config, dir);
    }
    let rows = collect_rows(config, dir)?;
    for line in table::terminal_lines(&rows) {
        println!("{line}");
    }
    if config.kind == StudyKind::Simulate {
        let matrix = sim_matrix::collect(config, dir)?;
        sim_matrix::write(config, dir, &matrix)?;
        for line in sim_matrix::markdown_lines(config, &matrix) {
            println!("{line}");
        }
    }
    report::write_report(config, dir, &rows)
}

/// Reads every finished run of `config` under `dir`.
fn collect_rows(config: &StudyConfig, dir: &Path) -> Result<Vec<rows::RunRow>> {
    let mut rows = Vec::new();
    for run in config.runs() {
        let run_dir = dir.join("runs").join(&run.id);
        let path = run::summary_path(&run_dir);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let row = match config.kind {
            StudyKind::Launch | StudyKind::Kernel => {
                rows::launch_row(config, &run, &run_dir, &text)
            }
            StudyKind::Simulate => crate::sim_rows::row(config, &run, &text),
            StudyKind::Agreement | StudyKind::Fidelity | StudyKind::SimulatorKernel => {
                unreachable!("a study of cells run twice reads its own rows")
            }
        };
        let mut row = row.with_context(|| format!("reading {}", path.display()))?;
        if config.kind == StudyKind::Kernel {
            row.frames_lost = testbed::kernel_drops(&run_dir)?.map_or(f64::NAN, |d| d as f64);
        }
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests;
