//! Studies whose every cell runs twice and sets the two side by side (`agreement`: a job and
//! its simulation; `fidelity`: a job on the kernel's testbed and on the emulator): the mean
//! step they compare, and their `results.csv`, `table.md` and `report.html`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Serialize, Serializer};
use syncopate_report::HtmlReport;
use syncopate_sim::SimReport;

use crate::config::{RunSpec, StudyConfig};
use crate::rows::Summary;
use crate::run::summary_path;

/// Where a cell sits in the matrix: the first columns of its row.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Place {
    /// Run id.
    pub id: String,
    /// Model.
    pub model: String,
    /// Variant label.
    pub variant: String,
    /// The network's name.
    pub network: String,
    /// Workers.
    pub workers: usize,
    /// Seed.
    pub seed: u64,
}

impl Place {
    /// The place of cell `run`.
    pub fn of(run: &RunSpec) -> Self {
        Place {
            id: run.id.clone(),
            model: run.model.clone(),
            variant: run.variant.clone(),
            network: run.network.clone(),
            workers: run.workers,
            seed: run.seed,
        }
    }
}

/// One cell's row of `results.csv` and of the table: its place, then its figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Paired<R> {
    /// Where the cell sits.
    pub place: Place,
    /// What its two sides measured.
    pub figures: R,
}

impl<R: Serialize> Serialize for Paired<R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.place, &self.figures).serialize(s)
    }
}

/// Prints the table of the finished cells of `config` under `dir` and writes their
/// report; returns its path.
pub fn report<R: PairRow>(config: &StudyConfig, dir: &Path) -> Result<PathBuf> {
    let rows: Vec<Paired<R>> = collect(config, dir)?;
    for line in markdown_lines(&rows) {
        println!("{line}");
    }
    write_report(config, dir, &rows)
}

/// The rows of every cell of `config` under `dir` whose two sides both finished.
pub fn collect<R: PairRow>(config: &StudyConfig, dir: &Path) -> Result<Vec<Paired<R>>> {
    let mut rows = Vec::new();
    for run in config.runs() {
        let run_dir = dir.join("runs").join(&run.id);
        let [first, second] = R::SIDES.map(|side| summary_path(&side(&run_dir)));
        if !first.is_file() || !second.is_file() {
            continue;
        }
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let figures = R::read(config, &run_dir, &read(&first)?, &read(&second)?)
            .with_context(|| format!("reading the cell {}", run_dir.display()))?;
        rows.push(Paired {
            place: Place::of(&run),
            figures,
        });
    }
    Ok(rows)
}

/// A job's summary (`text`; `what` names it in errors) and worker 0's mean step after the
/// study's warm-up steps.
pub fn job_side(config: &StudyConfig, text: &str, what: &str) -> Result<(Summary, f64)> {
    let job: Summary =
        serde_json::from_str(text).with_context(|| format!("parsing the {what}'s summary"))?;
    let step = mean_after(&job.worker0.step_seconds, config.warmup_steps);
    Ok((job, step))
}

/// A simulation's report (`text`) and its mean step after the study's warm-up steps.
pub fn simulation_side(config: &StudyConfig, text: &str) -> Result<(SimReport, f64)> {
    let sim: SimReport = serde_json::from_str(text).context("parsing the simulation's report")?;
    let step = mean_after(&sim.step_seconds, config.warmup_steps);
    Ok((sim, step))
}

/// The mean of `steps` after the first `warmup` (NaN when none are left).
pub fn mean_after(steps: &[f64], warmup: u64) -> f64 {
    let measured = steps.get(warmup as usize..).unwrap_or_default();
    if measured.is_empty() {
        return f64::NAN;
    }
    measured.iter().sum::<f64>() / measured.len() as f64
}

/// The figures of a cell run twice, after its [`Place`] in its row of `results.csv` (its
/// serialised fields; its default names the columns of an empty one) and of the table.
pub trait PairRow: serde::Serialize + Default {
    /// The names of the table's figures (after the place's columns).
    const HEADER: &'static [&'static str];
    /// What the figures are (the report's paragraph).
    const EXPLAINED: &'static str;
    /// Where each side runs under the cell's directory.
    const SIDES: [fn(&Path) -> PathBuf; 2];
    /// The figures of a cell from its two sides' summaries (their texts); `run_dir` holds
    /// what else the sides wrote (the kernel's counters).
    fn read(config: &StudyConfig, run_dir: &Path, first: &str, second: &str) -> Result<Self>;
    /// The row's figures in the table, after its place.
    fn cells(&self) -> Vec<String>;
}

/// The columns of a cell's place, before its figures.
const PLACE: [&str; 4] = ["model", "variant", "network", "workers"];

/// The table's header: the place's columns, then the figures'.
fn header<R: PairRow>() -> Vec<&'static str> {
    PLACE.iter().chain(R::HEADER).copied().collect()
}

/// A row of the table: its place, then its figures.
fn table_row<R: PairRow>(r: &Paired<R>) -> Vec<String> {
    let p = &r.place;
    let mut row = vec![
        p.model.clone(),
        p.variant.clone(),
        p.network.clone(),
        p.workers.to_string(),
    ];
    row.extend(r.figures.cells());
    row
}

/// The table of `rows` in Markdown (what `table.md` holds and the terminal shows).
pub fn markdown_lines<R: PairRow>(rows: &[Paired<R>]) -> Vec<String> {
    let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
    let header: Vec<String> = header::<R>().into_iter().map(String::from).collect();
    let mut lines = vec![line(&header), format!("|{}", "---|".repeat(header.len()))];
    lines.extend(rows.iter().map(|r| line(&table_row(r))));
    lines
}

/// Writes `results.csv`, `table.md` and `report.html` of `rows` under `dir`; returns the
/// report's path.
pub fn write_report<R: PairRow>(
    config: &StudyConfig,
    dir: &Path,
    rows: &[Paired<R>],
) -> Result<PathBuf> {
    let blank = Paired::<R>::default();
    std::fs::write(
        dir.join("results.csv"),
        crate::csv_format::table(rows, &blank)?,
    )?;
    let markdown = markdown_lines(rows).join("\n") + "\n";
    std::fs::write(dir.join("table.md"), markdown)?;
    let mut html = HtmlReport::new(&format!("Study {}", config.name));
    if !config.description.is_empty() {
        html.paragraph(&config.description);
    }
    html.paragraph(&format!(
        "{} finished cells; {} steps each, the first {} left out of the means.",
        rows.len(),
        config.steps,
        config.warmup_steps
    ));
    html.paragraph(R::EXPLAINED);
    let table: Vec<Vec<String>> = rows.iter().map(table_row).collect();
    html.table(&header::<R>(), &table);
    let path = dir.join("report.html");
    std::fs::write(&path, html.finish())?;
    Ok(path)
}
