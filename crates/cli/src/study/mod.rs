//! `syncopate study FILE.toml` and `syncopate report DIR`: a matrix of runs, run one after
//! another (resumable), and the report built from their summaries.

mod config;
mod report;
mod run;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

pub use config::StudyConfig;
use run::RunOutcome;

/// `syncopate study`.
#[derive(Debug, Args)]
pub struct StudyArgs {
    /// The study file (TOML; see studies/ for examples).
    pub file: PathBuf,
    /// Folder that holds the study's directory (`<out>/<name>/`).
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Give up on a run after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub run_timeout: u64,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `syncopate report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A study's directory (it holds `study.toml` and `runs/`).
    pub dir: PathBuf,
}

/// Runs the study's unfinished runs, then writes its report.
pub fn study_cmd(args: StudyArgs) -> Result<()> {
    let config = StudyConfig::load(&args.file)?;
    let dir = args.out.join(&config.name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(&args.file, dir.join("study.toml"))
        .with_context(|| format!("copying the study file into {}", dir.display()))?;
    let total = config.runs().len();
    eprintln!("study {}: {total} runs into {}", config.name, dir.display());
    let outcomes = run::run_matrix(
        &config,
        &dir,
        Duration::from_secs(args.run_timeout.max(1)),
        args.quiet,
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

/// Rebuilds a study's report from its finished runs.
pub fn report_cmd(args: ReportArgs) -> Result<()> {
    let config = StudyConfig::load(&args.dir.join("study.toml"))?;
    let path = build_report(&config, &args.dir)?;
    println!("report: {}", path.display());
    Ok(())
}

fn build_report(config: &StudyConfig, dir: &std::path::Path) -> Result<PathBuf> {
    let rows = report::collect(config, dir)?;
    print_table(&rows);
    report::write_report(config, dir, &rows)
}

fn print_table(rows: &[report::RunRow]) {
    let or_dash = |v: f64, text: String| if v.is_finite() { text } else { "-".into() };
    println!(
        "{:<18} {:<26} {:>10} {:>3} {:>8} {:>10} {:>9} {:>8} {:>9} {:>18}",
        "model",
        "variant",
        "bandwidth",
        "w",
        "step s",
        "samples/s",
        "ideal",
        "of ideal",
        "accuracy",
        "time to accuracy"
    );
    for r in rows {
        println!(
            "{:<18} {:<26} {:>10} {:>3} {:>8.3} {:>10.1} {:>9} {:>8} {:>9} {:>18}",
            r.model,
            r.variant,
            r.bandwidth,
            r.workers,
            r.step_seconds,
            r.samples_per_sec,
            or_dash(
                r.ideal_samples_per_sec,
                format!("{:.1}", r.ideal_samples_per_sec)
            ),
            or_dash(
                r.fraction_of_ideal,
                format!("{:.0} %", r.fraction_of_ideal * 100.0)
            ),
            or_dash(r.test_accuracy, format!("{:.2} %", r.test_accuracy * 100.0)),
            report::time_to_accuracy_cell(r),
        );
    }
}
