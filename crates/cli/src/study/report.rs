//! A study's results: one row per finished run (`results.csv`) and `report.html`: per model,
//! one chart per metric comparing the variants (see `compare`), a summary table, and each
//! run's resources per process as detail.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use syncopate_core::net::parse_bandwidth;
use syncopate_report::{HtmlReport, LineChart, LineStyle, Scale, Series};
use syncopate_train::model::{self, LayerOp};

use super::compare::{colour_of, comparative_section, variant_colours};
use super::config::{RunSpec, StudyConfig};
use super::run::summary_path;
use super::summary::{self, EvalSample, MetricsTable, WorkerResources};

/// The figures of one finished run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// Run id.
    pub id: String,
    /// Model.
    pub model: String,
    /// Variant label.
    pub variant: String,
    /// Bandwidth as written.
    pub bandwidth: String,
    /// Bandwidth in Gbit/s (NaN when unlimited).
    pub bandwidth_gbps: f64,
    /// Workers.
    pub workers: usize,
    /// Seed.
    pub seed: u64,
    /// Mean step time after the warm-up steps, seconds.
    pub step_seconds: f64,
    /// Samples per second over all workers, after the warm-up.
    pub samples_per_sec: f64,
    /// Ideal samples/s: workers x batch / max(compute, communication); NaN when unknown.
    pub ideal_samples_per_sec: f64,
    /// Measured over ideal.
    pub fraction_of_ideal: f64,
    /// Per-step seconds of compute and of waiting on communication (worker 0).
    pub compute_per_step: f64,
    /// Seconds per step blocked on communication (worker 0).
    pub wait_per_step: f64,
    /// Test accuracy (NaN for profile replays).
    pub test_accuracy: f64,
    /// Wall time of the training loop, seconds.
    pub wall_seconds: f64,
    /// The target accuracy of the run (NaN without one).
    pub target_accuracy: f64,
    /// Training seconds until an evaluation first reached the target (NaN: never, or no
    /// target).
    pub time_to_accuracy: f64,
    /// Final test accuracy of the exact average of all replicas (NaN: not recorded).
    pub average_accuracy: f64,
    /// Final replica divergence, mean over workers of ||x_i - mean||^2 / ||mean||^2 (NaN: not
    /// recorded).
    pub divergence: f64,
    /// Frames worker 0 lost on the emulated network (NaN: not recorded).
    pub frames_lost: f64,
    /// Fraction of gradient values a loss-tolerant strategy filled in (NaN: not one).
    pub realised_loss: f64,
    /// Worker 0's median per-tensor completion time, seconds (NaN: not recorded).
    pub tensor_p50_s: f64,
    /// Its 99th percentile, seconds (NaN: not recorded).
    pub tensor_p99_s: f64,
    /// Bytes sent per step per worker, measured (NaN: not recorded).
    pub bytes_per_step: f64,
    /// Bytes per step per worker the strategy needs on paper (NaN: not recorded).
    pub textbook_bytes_per_step: f64,
    /// Mean CPU per worker, % of one core (NaN: no metrics).
    pub mean_cpu_percent: f64,
    /// Peak resident memory per worker, bytes (mean over workers; NaN: no metrics).
    pub peak_rss_bytes: f64,
    /// Bytes sent on the links per worker over the run (NaN: no metrics).
    pub net_bytes: f64,
    /// Bytes read and written on storage per worker over the run (NaN: no metrics).
    pub disk_bytes: f64,
    /// Rank 0's evaluations during training.
    #[serde(skip)]
    pub evaluations: Vec<EvalSample>,
}

/// Reads every finished run of `config` under `dir`.
pub fn collect(config: &StudyConfig, dir: &Path) -> Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    for run in config.runs() {
        let run_dir = dir.join("runs").join(&run.id);
        let path = summary_path(&run_dir);
        if !path.is_file() {
            continue;
        }
        let json: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))?;
        let resources = summary::worker_resources(&run_dir, run.workers);
        rows.push(row(config, &run, &json, resources)?);
    }
    Ok(rows)
}

/// Worker 0's step times, seconds.
fn step_times(json: &serde_json::Value) -> Vec<f64> {
    json["worker0"]["step_seconds"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
        .unwrap_or_default()
}

fn row(
    config: &StudyConfig,
    run: &RunSpec,
    json: &serde_json::Value,
    resources: WorkerResources,
) -> Result<RunRow> {
    let w0 = &json["worker0"];
    let steps = step_times(json);
    let warm = (config.warmup_steps as usize).min(steps.len().saturating_sub(1));
    let measured = &steps[warm..];
    let step_seconds = measured.iter().sum::<f64>() / measured.len().max(1) as f64;
    let samples = (config.batch_size * run.workers) as f64;
    let samples_per_sec = samples / step_seconds;
    let bandwidth_bps = parse_bandwidth(&run.bandwidth)?;
    let ideal =
        ideal_step_seconds(&run.model, bandwidth_bps).map_or(f64::NAN, |ideal| samples / ideal);
    let n = steps.len().max(1) as f64;
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let field = |name| summary::number(json, name);
    Ok(RunRow {
        id: run.id.clone(),
        model: run.model.clone(),
        variant: run.variant.clone(),
        bandwidth: run.bandwidth.clone(),
        bandwidth_gbps: bandwidth_bps.map_or(f64::NAN, |b| b / 1e9),
        workers: run.workers,
        seed: run.seed,
        step_seconds,
        samples_per_sec,
        ideal_samples_per_sec: ideal,
        fraction_of_ideal: samples_per_sec / ideal,
        compute_per_step: num(&w0["times"]["compute"]) / n,
        wait_per_step: num(&w0["times"]["wait"]) / n,
        test_accuracy: num(&json["test_accuracy"]),
        wall_seconds: num(&json["wall_seconds"]),
        target_accuracy: num(&json["target_accuracy"]),
        time_to_accuracy: num(&json["time_to_accuracy_s"]),
        average_accuracy: field("average_accuracy"),
        divergence: field("divergence"),
        frames_lost: num(&json["frames_lost"]),
        realised_loss: num(&json["dlcp"]["realised_loss"]),
        tensor_p50_s: num(&w0["tensor_completion"]["p50_s"]),
        tensor_p99_s: num(&w0["tensor_completion"]["p99_s"]),
        bytes_per_step: mean_bytes_per_step(json, &resources),
        textbook_bytes_per_step: field("textbook_bytes_per_step"),
        mean_cpu_percent: resources.mean_cpu_percent,
        peak_rss_bytes: resources.peak_rss_bytes,
        net_bytes: resources.net_bytes,
        disk_bytes: resources.disk_bytes,
        evaluations: summary::evaluations(json),
    })
}

/// Bytes a worker sent per step, the mean over workers (their metrics' last `net_sent_bytes`
/// over the run's steps: under step-wise averaging or ring reduce workers send different
/// amounts), or worker 0's own figure when the run has no metrics.
fn mean_bytes_per_step(json: &serde_json::Value, resources: &WorkerResources) -> f64 {
    let steps = json["steps"].as_f64().unwrap_or(f64::NAN);
    if resources.net_bytes.is_finite() && steps > 0.0 {
        resources.net_bytes / steps
    } else {
        summary::number(json, "bytes_per_step")
    }
}

/// The ideal step time of a profile model at `bandwidth_bps` (full size): compute (every
/// layer's forward and backward) or pushing every parameter once through the worker's
/// interface, whichever is longer; pulls travel the other direction at the same time.
pub fn ideal_step_seconds(model_name: &str, bandwidth_bps: Option<f64>) -> Option<f64> {
    if !model::is_profile_name(model_name) {
        return None;
    }
    let spec = model::profile_model(model_name, 1.0).ok()?;
    let compute_ns: u64 = spec
        .layers
        .iter()
        .map(|l| match l.op {
            LayerOp::Profiled {
                forward_ns,
                backward_ns,
            } => forward_ns + backward_ns,
            _ => 0,
        })
        .sum();
    let comm = bandwidth_bps.map_or(0.0, |b| spec.num_params() as f64 * 32.0 / b);
    Some((compute_ns as f64 * 1e-9).max(comm))
}

/// The columns of `results.csv`.
const CSV_HEADER: &str = "id,model,variant,bandwidth,bandwidth_gbps,workers,seed,step_seconds,\
    samples_per_sec,ideal_samples_per_sec,fraction_of_ideal,compute_per_step,wait_per_step,\
    test_accuracy,wall_seconds,target_accuracy,time_to_accuracy_s,average_accuracy,divergence,\
    bytes_per_step,textbook_bytes_per_step,mean_cpu_percent,peak_rss_bytes,net_bytes,disk_bytes,\
    frames_lost,realised_loss,tensor_p50_s,tensor_p99_s\n";

/// One row of `results.csv`.
fn csv_row(r: &RunRow) -> String {
    format!(
        "{},{},{},{},{},{},{},{:.4},{:.2},{:.2},{:.4},{:.4},{:.4},{:.4},{:.2},{},{:.2},\
         {:.4},{:.6},{:.0},{:.0},{:.1},{:.0},{:.0},{:.0},{},{:.6},{:.6},{:.6}\n",
        r.id,
        r.model,
        quote(&r.variant),
        r.bandwidth,
        r.bandwidth_gbps,
        r.workers,
        r.seed,
        r.step_seconds,
        r.samples_per_sec,
        r.ideal_samples_per_sec,
        r.fraction_of_ideal,
        r.compute_per_step,
        r.wait_per_step,
        r.test_accuracy,
        r.wall_seconds,
        r.target_accuracy,
        r.time_to_accuracy,
        r.average_accuracy,
        r.divergence,
        r.bytes_per_step,
        r.textbook_bytes_per_step,
        r.mean_cpu_percent,
        r.peak_rss_bytes,
        r.net_bytes,
        r.disk_bytes,
        r.frames_lost,
        r.realised_loss,
        r.tensor_p50_s,
        r.tensor_p99_s
    )
}

/// Writes `results.csv` and `report.html` under `dir`; returns the report's path.
pub fn write_report(
    config: &StudyConfig,
    dir: &Path,
    rows: &[RunRow],
) -> Result<std::path::PathBuf> {
    let csv: String = std::iter::once(CSV_HEADER.to_string())
        .chain(rows.iter().map(csv_row))
        .collect();
    std::fs::write(dir.join("results.csv"), csv)?;
    let mut html = HtmlReport::new(&format!("Study {}", config.name));
    if !config.description.is_empty() {
        html.paragraph(&config.description);
    }
    html.paragraph(&format!(
        "{} finished runs; {} steps each, the first {} left out of the throughput; batch {} per \
         worker. Each variant has one colour in every chart; where the study has several seeds, \
         bars are the mean over them and curves over time show the first seed. The ideal bound \
         of a profile model is workers x batch / max(compute, model bytes / bandwidth).",
        rows.len(),
        config.steps,
        config.warmup_steps,
        config.batch_size
    ));
    comparative_section(&mut html, config, dir, rows)?;
    html.heading("All runs");
    let (header, table) = summary_table(rows);
    html.table(&header, &table);
    resource_charts(&mut html, config, dir, rows)?;
    let path = dir.join("report.html");
    std::fs::write(&path, html.finish())?;
    Ok(path)
}

/// `text` when `v` is finite, `-` otherwise.
pub fn or_dash(v: f64, text: String) -> String {
    if v.is_finite() {
        text
    } else {
        "-".into()
    }
}

/// `v` as a percentage with two decimals, or `-`.
pub fn percent_cell(v: f64) -> String {
    or_dash(v, format!("{:.2} %", v * 100.0))
}

/// `v / 1e6` with one decimal, or `-`.
pub fn mega_cell(v: f64) -> String {
    or_dash(v, format!("{:.1}", v / 1e6))
}

/// The header and rows of the summary table (the HTML report's and the printed one's).
pub fn summary_table(rows: &[RunRow]) -> (Vec<&'static str>, Vec<Vec<String>>) {
    let header = vec![
        "model",
        "variant",
        "bandwidth",
        "workers",
        "seed",
        "step s",
        "samples/s",
        "ideal samples/s",
        "of ideal",
        "accuracy",
        "avg-model accuracy",
        "divergence",
        "time to accuracy",
        "MB/step",
        "textbook MB/step",
        "CPU %",
        "peak RSS MB",
        "net MB",
        "disk MB",
        "frames lost",
        "realised loss",
        "tensor p99 s",
    ];
    let table = rows.iter().map(table_row).collect();
    (header, table)
}

fn table_row(r: &RunRow) -> Vec<String> {
    vec![
        r.model.clone(),
        r.variant.clone(),
        r.bandwidth.clone(),
        r.workers.to_string(),
        r.seed.to_string(),
        format!("{:.3}", r.step_seconds),
        format!("{:.1}", r.samples_per_sec),
        or_dash(
            r.ideal_samples_per_sec,
            format!("{:.1}", r.ideal_samples_per_sec),
        ),
        or_dash(
            r.fraction_of_ideal,
            format!("{:.0} %", r.fraction_of_ideal * 100.0),
        ),
        percent_cell(r.test_accuracy),
        percent_cell(r.average_accuracy),
        or_dash(r.divergence, format!("{:.3e}", r.divergence)),
        time_to_accuracy_cell(r),
        mega_cell(r.bytes_per_step),
        mega_cell(r.textbook_bytes_per_step),
        or_dash(r.mean_cpu_percent, format!("{:.0}", r.mean_cpu_percent)),
        mega_cell(r.peak_rss_bytes),
        mega_cell(r.net_bytes),
        mega_cell(r.disk_bytes),
        or_dash(r.frames_lost, format!("{}", r.frames_lost)),
        or_dash(r.realised_loss, format!("{:.3} %", r.realised_loss * 100.0)),
        or_dash(r.tensor_p99_s, format!("{:.4}", r.tensor_p99_s)),
    ]
}

/// `12.3 s to 97 %`, `not reached (97 %)` or `-` without a target.
pub fn time_to_accuracy_cell(r: &RunRow) -> String {
    match (
        r.target_accuracy.is_finite(),
        r.time_to_accuracy.is_finite(),
    ) {
        (false, _) => "-".into(),
        (true, true) => format!(
            "{:.1} s to {:.1} %",
            r.time_to_accuracy,
            r.target_accuracy * 100.0
        ),
        (true, false) => format!("not reached ({:.1} %)", r.target_accuracy * 100.0),
    }
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
    let colours = variant_colours(config);
    for r in with_metrics.into_iter().take(RESOURCE_CHART_RUNS) {
        for chart in run_resource_charts(dir, r, colour_of(&colours, &r.variant)) {
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
        ("CPU", "% of one core", summary::CPU, 1.0),
        ("memory (RSS)", "MB", summary::RSS, 1e6),
        ("sent on the links", "MB (cumulative)", summary::NET, 1e6),
        ("disk read + written", "MB (cumulative)", summary::DISK, 1e6),
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
                title: format!("{} - {} @ {}: {what}", r.model, r.variant, r.bandwidth),
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

fn quote(s: &str) -> String {
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A row with only its place in the matrix set and every figure NaN, for tests.
#[cfg(test)]
impl RunRow {
    pub fn empty(model: &str, workers: usize) -> Self {
        let nan = f64::NAN;
        RunRow {
            id: String::new(),
            model: model.into(),
            variant: String::new(),
            bandwidth: String::new(),
            bandwidth_gbps: nan,
            workers,
            seed: 0,
            step_seconds: nan,
            samples_per_sec: nan,
            ideal_samples_per_sec: nan,
            fraction_of_ideal: nan,
            compute_per_step: nan,
            wait_per_step: nan,
            test_accuracy: nan,
            wall_seconds: nan,
            target_accuracy: nan,
            time_to_accuracy: nan,
            average_accuracy: nan,
            divergence: nan,
            frames_lost: nan,
            realised_loss: nan,
            tensor_p50_s: nan,
            tensor_p99_s: nan,
            bytes_per_step: nan,
            textbook_bytes_per_step: nan,
            mean_cpu_percent: nan,
            peak_rss_bytes: nan,
            net_bytes: nan,
            disk_bytes: nan,
            evaluations: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_per_step_is_the_mean_over_workers_when_their_metrics_are_there() {
        let json = serde_json::json!({"steps": 2, "worker0": {"bytes_per_step": 5.0}});
        let mut r = WorkerResources {
            mean_cpu_percent: 1.0,
            peak_rss_bytes: 1.0,
            net_bytes: 3e6,
            disk_bytes: 0.0,
        };
        assert_eq!(mean_bytes_per_step(&json, &r), 1.5e6);
        r.net_bytes = f64::NAN;
        assert_eq!(
            mean_bytes_per_step(&json, &r),
            5.0,
            "worker 0's without metrics"
        );
    }

    #[test]
    fn ideal_bound_is_the_longer_of_compute_and_communication() {
        let compute = ideal_step_seconds("profile:vgg19", None).unwrap();
        assert!((0.7..0.9).contains(&compute), "{compute}");
        // 143.7 M parameters at 1 Gbit/s: 4.6 s of pushing.
        let slow = ideal_step_seconds("profile:vgg19", Some(1e9)).unwrap();
        assert!((slow - 143_667_240.0 * 32.0 / 1e9).abs() < 1e-9);
        assert_eq!(ideal_step_seconds("lenet", Some(1e9)), None);
    }
}
