//! The matrix of a simulated study (`kind = "simulate"`): per model and worker count, its
//! networks by its variants, each cell a mean step time set against the variant's
//! `baseline` on the same network (their ratio), with the share of gradient values a
//! loss-tolerant strategy filled in and, for a run with `--autotune`, the step time after
//! the tuner's search, the credit it chose and the steps it took. `matrix.csv` holds one
//! row per run, `table.md` the tables.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use syncopate_sim::SimReport;

use crate::config::{RunSpec, StudyConfig};
use crate::csv_format;
use crate::run::summary_path;
use crate::sim_rows::mean_after_warmup;
use crate::table::fixed;

/// One simulated run against its baseline: one row of `matrix.csv`, whose columns are these
/// fields in this order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MatrixRow {
    /// Run id.
    pub id: String,
    /// Model.
    pub model: String,
    /// Workers.
    pub workers: usize,
    /// The network's name.
    pub network: String,
    /// Seed.
    pub seed: u64,
    /// Variant label.
    pub variant: String,
    /// Mean step time after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f6")]
    pub step_seconds: f64,
    /// The baseline variant's label (empty: none).
    pub baseline: String,
    /// Step time over the baseline's (NaN: no baseline, or it has not run).
    #[serde(serialize_with = "csv_format::f4")]
    pub over_baseline: f64,
    /// Share of the gradient values aggregated that never arrived and were filled in
    /// (`None`: not a loss-tolerant strategy).
    pub filled_share: Option<f64>,
    /// Frames the network lost.
    pub frames_lost: u64,
    /// Steps the autotuner's last search took (`None`: no autotuner, or still searching).
    pub search_steps: Option<u64>,
    /// The credit the autotuner chose, full-size bytes (`None`: no autotuner).
    pub credit_bytes: Option<f64>,
    /// Mean step time after the search, seconds (`None`: no finished search, or no steps).
    pub step_after_search: Option<f64>,
    /// The baseline's mean step time over the same steps.
    pub baseline_after_search: Option<f64>,
}

impl MatrixRow {
    /// A row of no run: what names the columns of an empty `matrix.csv`.
    fn blank() -> Self {
        Self {
            id: String::new(),
            model: String::new(),
            workers: 0,
            network: String::new(),
            seed: 0,
            variant: String::new(),
            step_seconds: f64::NAN,
            baseline: String::new(),
            over_baseline: f64::NAN,
            filled_share: None,
            frames_lost: 0,
            search_steps: None,
            credit_bytes: None,
            step_after_search: None,
            baseline_after_search: None,
        }
    }
}

/// The mean of `steps` from step `first` on (`None` when none are left).
fn mean_from(steps: &[f64], first: usize) -> Option<f64> {
    let rest = steps.get(first..).filter(|r| !r.is_empty())?;
    Some(rest.iter().sum::<f64>() / rest.len() as f64)
}

/// The row of run `run` from its report and, when its variant has one, its baseline's
/// (label and report).
pub fn row(
    config: &StudyConfig,
    run: &RunSpec,
    report: &SimReport,
    baseline: Option<(&str, Option<&SimReport>)>,
) -> MatrixRow {
    let step_seconds = mean_after_warmup(&report.step_seconds, config.warmup_steps);
    let base = baseline.and_then(|(_, b)| b);
    let base_step = base.map_or(f64::NAN, |b| {
        mean_after_warmup(&b.step_seconds, config.warmup_steps)
    });
    let tune = report.autotune.as_ref();
    let search_steps = tune.and_then(|t| t.settled_after_steps);
    // The tuner's n-th step time is step n's; the chosen credit runs from step n + 1.
    let after =
        |r: &SimReport| search_steps.and_then(|n| mean_from(&r.step_seconds, n as usize + 1));
    MatrixRow {
        id: run.id.clone(),
        model: run.model.clone(),
        workers: run.workers,
        network: run.network.clone(),
        seed: run.seed,
        variant: run.variant.clone(),
        step_seconds,
        baseline: baseline.map_or(String::new(), |(label, _)| label.to_string()),
        over_baseline: step_seconds / base_step,
        filled_share: report
            .dlcp
            .as_ref()
            .filter(|d| d.entries > 0)
            .map(|d| d.entries_filled as f64 / d.entries as f64),
        frames_lost: report.network.frames_lost,
        search_steps,
        credit_bytes: tune.map(|t| t.chosen.credit_bytes as f64 / report.config.scale),
        step_after_search: after(report),
        baseline_after_search: base.and_then(after),
    }
}

/// Reads the report of every finished run of `config` under `dir`, by run id.
fn reports(config: &StudyConfig, dir: &Path) -> Result<HashMap<String, SimReport>> {
    let mut out = HashMap::new();
    for run in config.runs() {
        let path = summary_path(&dir.join("runs").join(&run.id));
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let report: SimReport = serde_json::from_str(&text)
            .with_context(|| format!("parsing the simulation's report {}", path.display()))?;
        out.insert(run.id, report);
    }
    Ok(out)
}

/// The rows of every finished run of `config` under `dir`, in the matrix's order.
pub fn collect(config: &StudyConfig, dir: &Path) -> Result<Vec<MatrixRow>> {
    let runs = config.runs();
    let reports = reports(config, dir)?;
    let place = |r: &RunSpec, variant: &str| {
        (
            r.model.clone(),
            r.network.clone(),
            r.workers,
            r.seed,
            variant.to_string(),
        )
    };
    let ids: HashMap<_, &str> = runs
        .iter()
        .map(|r| (place(r, &r.variant), r.id.as_str()))
        .collect();
    let baseline_of = |variant: &str| {
        config
            .variants
            .iter()
            .find(|v| v.label == variant)
            .and_then(|v| v.baseline.as_deref())
    };
    let mut rows = Vec::new();
    for run in &runs {
        let Some(report) = reports.get(&run.id) else {
            continue;
        };
        let baseline = baseline_of(&run.variant).map(|label| {
            let id = ids.get(&place(run, label));
            (label, id.and_then(|id| reports.get(*id)))
        });
        rows.push(row(config, run, report, baseline));
    }
    Ok(rows)
}

/// A cell of `table.md`: the step time, its ratio to the baseline, the values filled in,
/// and the autotuner's outcome.
fn cell(r: &MatrixRow) -> String {
    let mut cell = fixed(r.step_seconds, 3, "");
    if !r.baseline.is_empty() {
        cell += &format!(" ({})", fixed(r.over_baseline, 2, ""));
    }
    if let Some(filled) = r.filled_share {
        cell += &format!(", {:.2} % filled", filled * 100.0);
    }
    if let Some(credit) = r.credit_bytes {
        cell += &match (r.search_steps, r.step_after_search) {
            (Some(n), Some(after)) => {
                let against = r
                    .baseline_after_search
                    .map_or(String::new(), |b| format!(" ({})", fixed(after / b, 2, "")));
                format!(
                    "; after the search {after:.3}{against}, credit {:.2} MB in {n} steps",
                    credit / 1e6
                )
            }
            _ => "; search not over".to_string(),
        };
    }
    cell
}

/// What every cell of the tables says.
pub const EXPLAINED: &str = "Mean step seconds (over the baseline; gradient values filled in; \
    after the autotuner's search, over the baseline's same steps)";

/// One table: a model at a worker count, a row per network (and seed), a column per variant.
pub struct MatrixTable {
    /// `resnet50, 16 workers`.
    pub title: String,
    /// `network`, then the variants' labels.
    pub header: Vec<String>,
    /// The network's name, then a cell per variant (`-`: not run).
    pub rows: Vec<Vec<String>>,
}

/// The first appearance of each value of `key` over `items`, in order.
fn distinct<'a, T, K: PartialEq>(items: &'a [T], key: impl Fn(&'a T) -> K) -> Vec<K> {
    let mut out: Vec<K> = Vec::new();
    for item in items {
        let k = key(item);
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// The tables of `rows`: per model and worker count (in the matrix's order), a row per
/// network and seed, a column per variant.
pub fn tables(config: &StudyConfig, rows: &[MatrixRow]) -> Vec<MatrixTable> {
    let variants: Vec<&str> = config.variants.iter().map(|v| v.label.as_str()).collect();
    let seeds = config.seeds.len() > 1;
    let header: Vec<String> = std::iter::once("network")
        .chain(variants.iter().copied())
        .map(String::from)
        .collect();
    let groups = distinct(rows, |r| (r.model.as_str(), r.workers));
    groups
        .into_iter()
        .map(|(model, workers)| {
            let in_group: Vec<&MatrixRow> = rows
                .iter()
                .filter(|r| r.model == model && r.workers == workers)
                .collect();
            let places = distinct(&in_group, |r| (r.network.as_str(), r.seed));
            let table_rows = places
                .into_iter()
                .map(|(network, seed)| {
                    let name = match seeds {
                        true => format!("{network}, seed {seed}"),
                        false => network.to_string(),
                    };
                    let cells = variants.iter().map(|v| {
                        in_group
                            .iter()
                            .find(|r| r.network == network && r.seed == seed && r.variant == *v)
                            .map_or("-".to_string(), |r| cell(r))
                    });
                    std::iter::once(name).chain(cells).collect()
                })
                .collect();
            MatrixTable {
                title: format!("{model}, {workers} workers"),
                header: header.clone(),
                rows: table_rows,
            }
        })
        .collect()
}

/// The tables of `table.md` in Markdown (see [`tables`]).
pub fn markdown_lines(config: &StudyConfig, rows: &[MatrixRow]) -> Vec<String> {
    let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
    let mut lines = vec![EXPLAINED.to_string()];
    for table in tables(config, rows) {
        lines.extend([String::new(), table.title, String::new()]);
        lines.push(line(&table.header));
        lines.push(format!("|{}", "---|".repeat(table.header.len())));
        lines.extend(table.rows.iter().map(|r| line(r)));
    }
    lines
}

/// The tables in the HTML report: a heading and a table each.
pub fn html_section(
    html: &mut syncopate_report::HtmlReport,
    config: &StudyConfig,
    rows: &[MatrixRow],
) {
    html.paragraph(EXPLAINED);
    for table in tables(config, rows) {
        html.heading(&table.title);
        let header: Vec<&str> = table.header.iter().map(String::as_str).collect();
        html.table(&header, &table.rows);
    }
}

/// Writes `matrix.csv` and `table.md` under `dir`.
pub fn write(config: &StudyConfig, dir: &Path, rows: &[MatrixRow]) -> Result<()> {
    std::fs::write(
        dir.join("matrix.csv"),
        csv_format::table(rows, &MatrixRow::blank())?,
    )?;
    let markdown = markdown_lines(config, rows).join("\n") + "\n";
    std::fs::write(dir.join("table.md"), markdown)?;
    Ok(())
}

#[cfg(test)]
#[path = "sim_matrix_tests.rs"]
mod tests;
