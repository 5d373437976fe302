//! A study's results: one row per finished run (`results.csv`) and `report.html` with
//! throughput against bandwidth per model next to the ideal bound, a step breakdown and a
//! summary table.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use syncopate_core::net::parse_bandwidth;
use syncopate_report::{HtmlReport, LineChart, LineStyle, Scale, Series, StackedBars};
use syncopate_train::model::{self, LayerOp};

use super::config::{RunSpec, StudyConfig};
use super::run::summary_path;

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
}

/// Reads every finished run of `config` under `dir`.
pub fn collect(config: &StudyConfig, dir: &Path) -> Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    for run in config.runs() {
        let path = summary_path(&dir.join("runs").join(&run.id));
        if !path.is_file() {
            continue;
        }
        let json: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))?;
        rows.push(row(config, &run, &json)?);
    }
    Ok(rows)
}

fn row(config: &StudyConfig, run: &RunSpec, json: &serde_json::Value) -> Result<RunRow> {
    let w0 = &json["worker0"];
    let steps: Vec<f64> = w0["step_seconds"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
        .unwrap_or_default();
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
    })
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

/// Writes `results.csv` and `report.html` under `dir`; returns the report's path.
pub fn write_report(
    config: &StudyConfig,
    dir: &Path,
    rows: &[RunRow],
) -> Result<std::path::PathBuf> {
    let mut csv = String::from(
        "id,model,variant,bandwidth,bandwidth_gbps,workers,seed,step_seconds,samples_per_sec,\
         ideal_samples_per_sec,fraction_of_ideal,compute_per_step,wait_per_step,test_accuracy,\
         wall_seconds,target_accuracy,time_to_accuracy_s\n",
    );
    for r in rows {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{:.4},{:.2},{:.2},{:.4},{:.4},{:.4},{:.4},{:.2},{},{:.2}\n",
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
            r.time_to_accuracy
        ));
    }
    std::fs::write(dir.join("results.csv"), csv)?;

    let mut html = HtmlReport::new(&format!("Study {}", config.name));
    if !config.description.is_empty() {
        html.paragraph(&config.description);
    }
    html.paragraph(&format!(
        "{} finished runs; {} steps each, the first {} left out of the throughput; batch {} per \
         worker. The ideal bound of a profile model is workers x batch / max(compute, model bytes / \
         bandwidth).",
        rows.len(),
        config.steps,
        config.warmup_steps,
        config.batch_size
    ));
    let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    models.dedup();
    for model in models {
        let of_model: Vec<&RunRow> = rows.iter().filter(|r| r.model == model).collect();
        html.heading(model);
        let mut series = Vec::new();
        let mut variants: Vec<&str> = of_model.iter().map(|r| r.variant.as_str()).collect();
        variants.dedup();
        variants.sort_unstable();
        variants.dedup();
        for v in &variants {
            series.push(Series {
                name: v.to_string(),
                points: of_model
                    .iter()
                    .filter(|r| r.variant == *v)
                    .map(|r| (r.bandwidth_gbps, r.samples_per_sec))
                    .collect(),
                style: LineStyle::Solid,
            });
        }
        let mut ideal: Vec<(f64, f64)> = of_model
            .iter()
            .map(|r| (r.bandwidth_gbps, r.ideal_samples_per_sec))
            .filter(|p| p.1.is_finite())
            .collect();
        ideal.sort_by(|a, b| a.0.total_cmp(&b.0));
        ideal.dedup_by(|a, b| a.0 == b.0);
        if !ideal.is_empty() {
            series.push(Series {
                name: "ideal max(compute, comm)".into(),
                points: ideal,
                style: LineStyle::Dashed,
            });
        }
        let chart = LineChart {
            title: format!("{model}: throughput vs bandwidth"),
            x_label: "bandwidth per worker, Gbit/s (full-size model)".into(),
            y_label: "samples/s (all workers)".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Linear,
            series,
            width: 820,
            height: 480,
        };
        let svg = chart.to_svg()?;
        let file: String = model
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        std::fs::write(dir.join(format!("throughput-{file}.svg")), &svg)?;
        html.svg(&svg);
        let categories: Vec<String> = of_model
            .iter()
            .map(|r| format!("{} @ {}", r.variant, r.bandwidth))
            .collect();
        let bars = StackedBars {
            title: format!("{model}: step breakdown (worker 0)"),
            y_label: "seconds per step".into(),
            categories,
            parts: vec![
                (
                    "compute".into(),
                    of_model.iter().map(|r| r.compute_per_step).collect(),
                ),
                (
                    "waiting on communication".into(),
                    of_model.iter().map(|r| r.wait_per_step).collect(),
                ),
            ],
            width: 820.max(60 * of_model.len() as u32),
            height: 420,
        };
        html.svg(&bars.to_svg()?);
        time_to_accuracy_chart(&mut html, model, &of_model)?;
        convergence_charts(&mut html, dir, model, &of_model)?;
    }
    resource_charts(&mut html, dir, rows)?;
    html.heading("All runs");
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.model.clone(),
                r.variant.clone(),
                r.bandwidth.clone(),
                r.workers.to_string(),
                format!("{:.3}", r.step_seconds),
                format!("{:.1}", r.samples_per_sec),
                format!("{:.1}", r.ideal_samples_per_sec),
                format!("{:.0} %", r.fraction_of_ideal * 100.0),
                if r.test_accuracy.is_finite() {
                    format!("{:.2} %", r.test_accuracy * 100.0)
                } else {
                    "-".into()
                },
                time_to_accuracy_cell(r),
            ]
        })
        .collect();
    html.table(
        &[
            "model",
            "variant",
            "bandwidth",
            "workers",
            "step s",
            "samples/s",
            "ideal samples/s",
            "of ideal",
            "accuracy",
            "time to accuracy",
        ],
        &table,
    );
    let path = dir.join("report.html");
    std::fs::write(&path, html.finish())?;
    Ok(path)
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

/// Training time until the target accuracy, one bar per run (runs that never reached it
/// have no bar); nothing when no run has a target.
fn time_to_accuracy_chart(html: &mut HtmlReport, model: &str, runs: &[&RunRow]) -> Result<()> {
    let Some(target) = runs
        .iter()
        .map(|r| r.target_accuracy)
        .find(|t| t.is_finite())
    else {
        return Ok(());
    };
    let bars = StackedBars {
        title: format!(
            "{model}: training time to {:.1} % test accuracy (no bar: not reached)",
            target * 100.0
        ),
        y_label: "seconds of training".into(),
        categories: runs
            .iter()
            .map(|r| format!("{} @ {}", r.variant, r.bandwidth))
            .collect(),
        parts: vec![(
            "time to accuracy".into(),
            runs.iter()
                .map(|r| {
                    if r.time_to_accuracy.is_finite() {
                        r.time_to_accuracy
                    } else {
                        0.0
                    }
                })
                .collect(),
        )],
        width: 820.max(60 * runs.len() as u32),
        height: 420,
    };
    html.svg(&bars.to_svg()?);
    Ok(())
}

/// `(x, y)` columns of a CSV file, rows with non-finite values left out.
fn csv_points(path: &Path, x: usize, y: usize) -> Vec<(f64, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let v: Vec<f64> = l
                .split(',')
                .map(|c| c.parse().unwrap_or(f64::NAN))
                .collect();
            Some((*v.get(x)?, *v.get(y)?))
        })
        .filter(|(a, b)| a.is_finite() && b.is_finite())
        .collect()
}

/// Training loss (worker 0's shard) and test accuracy against wall time, one line per run.
fn convergence_charts(
    html: &mut HtmlReport,
    dir: &Path,
    model: &str,
    runs: &[&RunRow],
) -> Result<()> {
    for (what, file, x, y, unit) in [
        ("training loss", "steps-rank0.csv", 1, 3, "loss (worker 0)"),
        ("test accuracy", "evals-rank0.csv", 2, 3, "accuracy"),
    ] {
        let series: Vec<Series> = runs
            .iter()
            .map(|r| Series {
                name: format!("{} @ {}", r.variant, r.bandwidth),
                points: csv_points(&dir.join("runs").join(&r.id).join(file), x, y),
                style: if what == "test accuracy" {
                    LineStyle::Points
                } else {
                    LineStyle::Solid
                },
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let chart = LineChart {
            title: format!("{model}: {what} vs wall time"),
            x_label: "seconds of training".into(),
            y_label: unit.into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            series,
            width: 820,
            height: 420,
        };
        html.svg(&chart.to_svg()?);
    }
    Ok(())
}

/// Most runs whose per-process resource charts go into the report (every run's CSVs stay in
/// its directory).
const RESOURCE_CHART_RUNS: usize = 6;

/// CPU, memory and network over time for every process of the first runs.
fn resource_charts(html: &mut HtmlReport, dir: &Path, rows: &[RunRow]) -> Result<()> {
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
         written per process, sampled every second; charts for the first {} of {} runs (every run's metrics-rank<R>.csv is in \
         its directory).",
        RESOURCE_CHART_RUNS.min(with_metrics.len()),
        with_metrics.len()
    ));
    for r in with_metrics.into_iter().take(RESOURCE_CHART_RUNS) {
        let run_dir = dir.join("runs").join(&r.id);
        let mut cpu = Vec::new();
        let mut rss = Vec::new();
        let mut net = Vec::new();
        let mut disk = Vec::new();
        for rank in 0.. {
            let path = run_dir.join(format!("metrics-rank{rank}.csv"));
            let Ok(text) = std::fs::read_to_string(&path) else {
                break;
            };
            let rows: Vec<Vec<f64>> = text
                .lines()
                .skip(1)
                .map(|l| {
                    l.split(',')
                        .map(|v| v.parse().unwrap_or(f64::NAN))
                        .collect()
                })
                .filter(|v: &Vec<f64>| v.len() >= 8)
                .collect();
            let name = if rank < r.workers {
                format!("worker {rank}")
            } else {
                format!("server {}", rank - r.workers)
            };
            let series = |f: &dyn Fn(&[f64]) -> f64| Series {
                name: name.clone(),
                points: rows.iter().map(|v| (v[0], f(v))).collect(),
                style: LineStyle::Solid,
            };
            cpu.push(series(&|v| v[1] + v[2]));
            rss.push(series(&|v| v[3] / 1e6));
            net.push(series(&|v| v[6] / 1e6));
            disk.push(series(&|v| (v[4] + v[5]) / 1e6));
        }
        for (what, unit, series) in [
            ("CPU", "% of one core", cpu),
            ("memory (RSS)", "MB", rss),
            ("sent on the links", "MB (cumulative)", net),
            ("disk read + written", "MB (cumulative)", disk),
        ] {
            let chart = LineChart {
                title: format!("{} - {}: {what}", r.model, r.variant),
                x_label: "seconds since the process started".into(),
                y_label: unit.into(),
                x_scale: Scale::Linear,
                y_scale: Scale::Linear,
                series,
                width: 640,
                height: 320,
            };
            html.svg(&chart.to_svg()?);
        }
    }
    Ok(())
}

fn quote(s: &str) -> String {
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
