//! A study's report files: `results.csv` (one row per finished run, every figure) and
//! `report.html`: per model, one chart per metric comparing the variants (see `compare`),
//! the table of every run, and each run's resources per process as detail.

use std::path::Path;

use anyhow::Result;
use syncopate_report::{HtmlReport, LineChart, LineStyle, Scale, Series};

use crate::compare::{groups, ideal_chart, metric_chart, metrics, ChartContext};
use crate::config::{StudyConfig, StudyKind};
use crate::curves::curve_charts;
use crate::metrics::{self, MetricsTable};
use crate::rows::RunRow;
use crate::scale::scale_section;
use crate::styles::Styles;
use crate::table::summary_table;

/// `results.csv`: a header naming [`RunRow`]'s columns (its serialised fields), then one row
/// per run, both from that one type.
fn results_csv(rows: &[RunRow]) -> Result<Vec<u8>> {
    crate::csv_format::table(rows, &RunRow::empty("", 0))
}

/// What the figures that need a definition are.
const DEFINITIONS: &str = "Time to the target: seconds of training (evaluations, and the \
    evaluation of the exact average, left out) until worker 0's first evaluation at or above the target \
    accuracy. Bytes to the target: what a worker had sent on all its links (frames, headers \
    and heartbeats; the mean over workers) by the end of that evaluation's step, summed from \
    the sent_bytes column of steps-rank<R>.csv (runs without it: bytes per step times the \
    steps). Bytes per step: a worker's bytes sent over the run over its steps, the mean over \
    workers. Compute utilisation: worker 0's forward, backward and optimizer seconds over the \
    training loop's wall seconds (evaluations excluded), so 1 - utilisation is the share of \
    wall time spent loading data or waiting on communication; in a simulated run, the \
    profile's forward and backward over the simulated step. Final accuracy of the average: the \
    test accuracy of the exact mean of every worker's weights at the last evaluation (for \
    exact strategies, every replica's own).";

/// What a simulated study's figures are.
const SIMULATED: &str = "Every run is `syncopate simulate`: the strategies' own state \
    machines on virtual time, compute replayed from the model's per-layer profile, every \
    host's NIC serialising at the bandwidth. Step time: the mean simulated step after the \
    warm-up steps (a variant that averages every H steps runs a multiple of H steps, so its \
    mean carries its averaging). Bytes per worker per step: what each worker put on the \
    network over the run (full-size bytes, headers included) over the steps, the mean over \
    workers.";

/// What a kernel study's runs are.
const ON_THE_KERNEL: &str = "Every run is a job on the kernel's network \
    (scripts/netns-cluster.sh): one network namespace per process on a bridge, the network's \
    bandwidth as the kernel's htb bottleneck, its testbed flags for the queues, loss and paths; \
    each run's directory keeps the kernel's counters over the job (kernel.json, tcp.json) and \
    every process's log. The figures are worker 0's.";

/// Writes `results.csv` and `report.html` under `dir`; returns the report's path.
pub fn write_report(
    config: &StudyConfig,
    dir: &Path,
    rows: &[RunRow],
) -> Result<std::path::PathBuf> {
    std::fs::write(dir.join("results.csv"), results_csv(rows)?)?;
    let mut html = HtmlReport::new(&format!("Study {}", config.name));
    if !config.description.is_empty() {
        html.paragraph(&config.description);
    }
    html.paragraph(&format!(
        "{} finished runs; {} steps each, the first {} left out of the throughput; batch {} per \
         worker. Each technique has one colour in every chart, and each variant of a technique \
         its own dash pattern or markers (curves) and shade (bars), as the legend below shows; \
         where the study has several seeds, bars are the mean over them and curves show the \
         first seed. The ideal bound of a profile model is workers x batch / max(compute, model \
         bytes / bandwidth).",
        rows.len(),
        config.steps,
        config.warmup_steps,
        config.batch_size
    ));
    html.paragraph(DEFINITIONS);
    html.svg(&Styles::of(config).legend_svg());
    match config.kind {
        StudyKind::Launch => comparative_section(&mut html, config, dir, rows)?,
        StudyKind::Kernel => {
            html.paragraph(ON_THE_KERNEL);
            comparative_section(&mut html, config, dir, rows)?;
        }
        StudyKind::Simulate => {
            html.paragraph(SIMULATED);
            let matrix = crate::sim_matrix::collect(config, dir)?;
            crate::sim_matrix::html_section(&mut html, config, &matrix);
            scale_section(&mut html, config, rows)?;
        }
        StudyKind::Agreement | StudyKind::Fidelity | StudyKind::SimulatorKernel => {
            unreachable!("a study of cells run twice writes its own report")
        }
    }
    html.heading("All runs");
    let (header, table) = summary_table(rows);
    html.table(&header, &table);
    resource_charts(&mut html, config, dir, rows)?;
    let path = dir.join("report.html");
    std::fs::write(&path, html.finish())?;
    Ok(path)
}

/// Most runs whose per-process resource charts go into the report (every run's CSVs stay in
/// its directory).
const RESOURCE_CHART_RUNS: usize = 6;

/// CPU, memory, network and disk over time for every process of the first runs, in the
/// variant's colour: worker 0 a line, the other workers points, servers dashed.
fn resource_charts(
    html: &mut HtmlReport,
    config: &StudyConfig,
    dir: &Path,
    rows: &[RunRow],
) -> Result<()> {
    let with_metrics: Vec<&RunRow> = rows
        .iter()
        .filter(|r| {
            dir.join("runs")
                .join(&r.id)
                .join("metrics-rank0.csv")
                .is_file()
        })
        .collect();
    if with_metrics.is_empty() {
        return Ok(());
    }
    html.heading("Resources per process");
    html.paragraph(&format!(
        "CPU (user + system, % of one core), resident memory, bytes sent and disk bytes read and \
         written per process, sampled every second, in the variant's colour (worker 0: line, \
         other workers: points, servers: dashed); charts for the first {} of {} runs (every \
         run's metrics-rank<R>.csv is in its directory).",
        RESOURCE_CHART_RUNS.min(with_metrics.len()),
        with_metrics.len()
    ));
    let styles = Styles::of(config);
    for r in with_metrics.into_iter().take(RESOURCE_CHART_RUNS) {
        for chart in run_resource_charts(dir, r, styles.colour(&r.variant)) {
            html.svg(&chart.to_svg()?);
        }
    }
    Ok(())
}

/// The four resource charts of one run, one series per process.
fn run_resource_charts(dir: &Path, r: &RunRow, colour: Option<usize>) -> Vec<LineChart> {
    let run_dir = dir.join("runs").join(&r.id);
    let tables: Vec<MetricsTable> = (0..)
        .map_while(|rank| MetricsTable::read(&run_dir.join(format!("metrics-rank{rank}.csv"))))
        .collect();
    let resources: [(&str, &str, &[&str], f64); 4] = [
        ("CPU", "% of one core", metrics::CPU, 1.0),
        ("memory (RSS)", "MB", metrics::RSS, 1e6),
        ("sent on the links", "MB (cumulative)", metrics::NET, 1e6),
        ("disk read + written", "MB (cumulative)", metrics::DISK, 1e6),
    ];
    resources
        .into_iter()
        .map(|(what, unit, columns, divisor)| {
            let series = tables
                .iter()
                .enumerate()
                .map(|(rank, t)| {
                    let values: Vec<f64> = t.sum_of(columns).iter().map(|v| v / divisor).collect();
                    process_series(rank, r.workers, t.over_time(&values), colour)
                })
                .collect();
            LineChart {
                title: format!("{} - {} @ {}: {what}", r.model, r.variant, r.network),
                x_label: "seconds since the process started".into(),
                y_label: unit.into(),
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                series,
                width: 640,
                height: 320,
            }
        })
        .collect()
}

/// A process's series: named and styled by its rank (workers first, then servers).
fn process_series(
    rank: usize,
    workers: usize,
    points: Vec<(f64, f64)>,
    colour: Option<usize>,
) -> Series {
    let (name, style) = match rank {
        0 => ("worker 0".to_string(), LineStyle::Solid),
        r if r < workers => (format!("worker {r}"), LineStyle::Points),
        r => (format!("server {}", r - workers), LineStyle::Dashed),
    };
    Series {
        name,
        points,
        style,
        colour,
    }
}

/// Every comparative chart of the study, group by group, under a heading each.
fn comparative_section(
    html: &mut HtmlReport,
    config: &StudyConfig,
    dir: &Path,
    rows: &[RunRow],
) -> Result<()> {
    let context = ChartContext::of(config);
    for group in groups(config, rows) {
        html.heading(&group.title);
        if let Some(chart) = ideal_chart(&group, &context) {
            html.svg(&chart.to_svg()?);
        }
        for m in metrics() {
            if let Some(chart) = metric_chart(&group, &m, &context) {
                html.svg(&chart.to_svg()?);
            }
        }
        for chart in curve_charts(dir, &group, &context) {
            html.svg(&chart.to_svg()?);
        }
    }
    Ok(())
}
