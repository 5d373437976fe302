//! `syncopate study FILE.toml` and `syncopate report DIR`: their flags, handed to
//! `syncopate_study`, which runs the matrix and writes the report.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use syncopate_study::StudyOptions;

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
    /// Run only these variants (labels, comma-separated); the report has every finished run.
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// Run only these networks (names, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub networks: Vec<String>,
}

/// `syncopate report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A study's directory (it holds `study.toml` and `runs/`).
    pub dir: PathBuf,
}

/// Runs the study's unfinished runs, each a `syncopate launch` of this very executable, then
/// writes its report.
pub fn study_cmd(args: StudyArgs) -> Result<()> {
    syncopate_study::run_study(&StudyOptions {
        file: args.file,
        out: args.out,
        run_timeout: Duration::from_secs(args.run_timeout.max(1)),
        quiet: args.quiet,
        syncopate: std::env::current_exe().context("locating the syncopate executable")?,
        selection: syncopate_study::Selection {
            variants: args.variants,
            networks: args.networks,
        },
    })
}

/// Rebuilds a study's report from its finished runs.
pub fn report_cmd(args: ReportArgs) -> Result<()> {
    syncopate_study::rebuild_report(&args.dir)
}
