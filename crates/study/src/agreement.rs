//! Agreement studies (`kind = "agreement"`): every cell of the matrix runs twice, as a job
//! (`syncopate launch`: real sockets on this machine, a profile's tensors and the network
//! scaled by the study's `scale`) and in the simulator (`syncopate simulate`: the full-size
//! model on virtual time, the same network model and seed), and the report sets the two mean
//! step times side by side with their ratio and each side's queue drops and retransmissions.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;
use syncopate_report::HtmlReport;
use syncopate_sim::SimReport;

use crate::config::{RunSpec, StudyConfig};
use crate::csv_format;
use crate::rows::Summary;
use crate::run::{runtime_dir, simulator_dir, summary_path};
use crate::table::fixed;

/// One cell of an agreement study: one row of its `results.csv`, whose columns are these
/// fields in this order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgreementRow {
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
    /// Worker 0's mean step time in the job after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f4")]
    pub runtime_step_seconds: f64,
    /// The simulator's mean step time after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f4")]
    pub simulator_step_seconds: f64,
    /// Simulator over runtime (1: they agree).
    #[serde(serialize_with = "csv_format::f4")]
    pub simulator_over_runtime: f64,
    /// Frames a queue dropped in the job (worker 0's; `None`: not recorded).
    pub runtime_frames_dropped: Option<u64>,
    /// Frames the job retransmitted (worker 0's).
    pub runtime_frames_retransmitted: Option<u64>,
    /// Frames a queue dropped in the simulation (all hosts).
    pub simulator_frames_dropped: u64,
    /// Frames the simulation retransmitted (all hosts).
    pub simulator_frames_retransmitted: u64,
}

impl AgreementRow {
    /// A row of no cell: what names the columns of an empty `results.csv`.
    fn blank() -> Self {
        Self {
            id: String::new(),
            model: String::new(),
            variant: String::new(),
            network: String::new(),
            workers: 0,
            seed: 0,
            runtime_step_seconds: f64::NAN,
            simulator_step_seconds: f64::NAN,
            simulator_over_runtime: f64::NAN,
            runtime_frames_dropped: None,
            runtime_frames_retransmitted: None,
            simulator_frames_dropped: 0,
            simulator_frames_retransmitted: 0,
        }
    }
}

/// The mean of `steps` after the first `warmup` (NaN when none are left).
fn mean_after(steps: &[f64], warmup: u64) -> f64 {
    let measured = steps.get(warmup as usize..).unwrap_or_default();
    if measured.is_empty() {
        return f64::NAN;
    }
    measured.iter().sum::<f64>() / measured.len() as f64
}

/// The row of cell `run` from its job's summary and its simulation's report (their texts).
pub fn row(
    config: &StudyConfig,
    run: &RunSpec,
    runtime: &str,
    simulator: &str,
) -> Result<AgreementRow> {
    let job: Summary = serde_json::from_str(runtime).context("parsing the job's summary")?;
    let sim: SimReport =
        serde_json::from_str(simulator).context("parsing the simulation's report")?;
    let runtime_step_seconds = mean_after(&job.worker0.step_seconds, config.warmup_steps);
    let simulator_step_seconds = mean_after(&sim.step_seconds, config.warmup_steps);
    Ok(AgreementRow {
        id: run.id.clone(),
        model: run.model.clone(),
        variant: run.variant.clone(),
        network: run.network.clone(),
        workers: run.workers,
        seed: run.seed,
        runtime_step_seconds,
        simulator_step_seconds,
        simulator_over_runtime: simulator_step_seconds / runtime_step_seconds,
        runtime_frames_dropped: job.frames_dropped,
        runtime_frames_retransmitted: job.frames_retransmitted,
        simulator_frames_dropped: sim.network.frames_dropped,
        simulator_frames_retransmitted: sim.network.frames_retransmitted,
    })
}

/// The rows of every cell of `config` under `dir` whose job and simulation both finished.
pub fn collect(config: &StudyConfig, dir: &Path) -> Result<Vec<AgreementRow>> {
    let mut rows = Vec::new();
    for run in config.runs() {
        let run_dir = dir.join("runs").join(&run.id);
        let (job, sim) = (
            summary_path(&runtime_dir(&run_dir)),
            summary_path(&simulator_dir(&run_dir)),
        );
        if !job.is_file() || !sim.is_file() {
            continue;
        }
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let row = row(config, &run, &read(&job)?, &read(&sim)?)
            .with_context(|| format!("reading the cell {}", run_dir.display()))?;
        rows.push(row);
    }
    Ok(rows)
}

/// The header of the table of cells.
const HEADER: [&str; 8] = [
    "model",
    "variant",
    "network",
    "workers",
    "runtime step",
    "simulator step",
    "simulator / runtime",
    "drops, retransmissions: runtime (worker 0); simulator (all hosts)",
];

/// The cells of one row of the table.
fn cells(r: &AgreementRow) -> Vec<String> {
    let count = |v: Option<u64>| v.map_or("-".to_string(), |n| n.to_string());
    vec![
        r.model.clone(),
        r.variant.clone(),
        r.network.clone(),
        r.workers.to_string(),
        fixed(r.runtime_step_seconds, 3, " s"),
        fixed(r.simulator_step_seconds, 3, " s"),
        fixed(r.simulator_over_runtime, 3, ""),
        format!(
            "{}, {}; {}, {}",
            count(r.runtime_frames_dropped),
            count(r.runtime_frames_retransmitted),
            r.simulator_frames_dropped,
            r.simulator_frames_retransmitted
        ),
    ]
}

/// The table of cells in Markdown (what `table.md` holds and the terminal shows).
pub fn markdown_lines(rows: &[AgreementRow]) -> Vec<String> {
    let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
    let mut lines = vec![
        line(&HEADER.map(String::from)),
        format!("|{}", "---|".repeat(HEADER.len())),
    ];
    lines.extend(rows.iter().map(|r| line(&cells(r))));
    lines
}

/// What the figures of an agreement study are.
const EXPLAINED: &str = "Every cell runs twice: as a job over real sockets on this machine \
    (`syncopate launch`, a profile's tensors and the network scaled by the study's scale) and \
    in the simulator (`syncopate simulate`, the full-size model on virtual time), both with the \
    core's network model and the same seed. Step: the mean step time after the warm-up steps \
    (worker 0's in the job). Simulator / runtime: 1 when they agree.";

/// Writes `results.csv`, `table.md` and `report.html` under `dir`; returns the report's path.
pub fn write_report(config: &StudyConfig, dir: &Path, rows: &[AgreementRow]) -> Result<PathBuf> {
    std::fs::write(
        dir.join("results.csv"),
        csv_format::table(rows, &AgreementRow::blank())?,
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
    html.paragraph(EXPLAINED);
    let table: Vec<Vec<String>> = rows.iter().map(cells).collect();
    html.table(&HEADER, &table);
    let path = dir.join("report.html");
    std::fs::write(&path, html.finish())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STUDY: &str = r#"
name = "agree"
kind = "agreement"
steps = 4
warmup_steps = 1
batch_size = 128
workers = [4]
servers = 1
scale = "1/16"
bandwidths = ["10gbit"]
args = ["--ingress", "--loss", "1%"]
[[models]]
name = "profile:vgg19"
[[variants]]
label = "ps"
strategy = "ps"
[[variants]]
label = "p3"
strategy = "p3"
"#;

    fn job(steps: &[f64], dropped: u64) -> String {
        let worker = syncopate_runtime::worker::WorkerSummary {
            step_seconds: steps.to_vec(),
            ..Default::default()
        };
        serde_json::json!({"frames_dropped": dropped, "frames_retransmitted": 3,
            "worker0": worker})
        .to_string()
    }

    fn simulation(steps: &[f64], dropped: u64) -> String {
        let profile = syncopate_core::profile::ModelProfile::builtin("resnet50").unwrap();
        let mut sim =
            syncopate_sim::SimConfig::new(syncopate_core::strategy::StrategyKind::Allreduce, 2, 0);
        (sim.scale, sim.steps) = (1.0 / 1024.0, 1);
        let mut report = syncopate_sim::simulate(&profile, &sim).unwrap();
        report.step_seconds = steps.to_vec();
        report.network.frames_dropped = dropped;
        report.network.frames_retransmitted = 5;
        serde_json::to_string(&report).unwrap()
    }

    #[test]
    fn a_cell_reports_both_step_times_and_their_ratio() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), STUDY).unwrap();
        let config = StudyConfig::load(file.path()).unwrap();
        let run = &config.runs()[0];
        assert!(run.args.windows(2).any(|w| w == ["--scale", "1/16"]));
        let r = row(
            &config,
            run,
            &job(&[9.0, 1.0, 1.0], 2),
            &simulation(&[7.0, 1.5, 1.5], 4),
        )
        .unwrap();
        assert_eq!(
            (r.runtime_step_seconds, r.simulator_step_seconds),
            (1.0, 1.5)
        );
        assert_eq!(r.simulator_over_runtime, 1.5);
        assert_eq!(
            (r.runtime_frames_dropped, r.simulator_frames_dropped),
            (Some(2), 4)
        );
        let lines = markdown_lines(&[r]);
        assert_eq!(lines.len(), 3);
        assert!(
            lines[2].contains("| 1.000 s | 1.500 s | 1.500 | 2, 3; 4, 5 |"),
            "{}",
            lines[2]
        );
        // A summary whose worker 0 lacks a field is an error, not a NaN.
        assert!(row(
            &config,
            run,
            r#"{"worker0": {"rank": 0}}"#,
            &simulation(&[1.0], 0)
        )
        .is_err());
    }

    #[test]
    fn the_report_lists_finished_cells_only() {
        let dir = tempfile::tempdir().unwrap();
        let config: StudyConfig = toml::from_str(STUDY).unwrap();
        let runs = config.runs();
        for (i, run) in runs.iter().enumerate() {
            let run_dir = dir.path().join("runs").join(&run.id);
            let (job_dir, sim_dir) = (runtime_dir(&run_dir), simulator_dir(&run_dir));
            std::fs::create_dir_all(&job_dir).unwrap();
            std::fs::create_dir_all(&sim_dir).unwrap();
            std::fs::write(summary_path(&job_dir), job(&[1.0, 2.0], 0)).unwrap();
            // The second cell's simulation never finished.
            if i == 0 {
                std::fs::write(summary_path(&sim_dir), simulation(&[1.0, 1.0], 0)).unwrap();
            }
        }
        let rows = collect(&config, dir.path()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].simulator_over_runtime, 0.5);
        write_report(&config, dir.path(), &rows).unwrap();
        let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        let mut lines = csv.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with("id,model,variant,network,workers,seed,runtime_step_seconds"));
        assert!(
            lines
                .next()
                .unwrap()
                .contains(",2.0000,1.0000,0.5000,0,3,0,5"),
            "{csv}"
        );
        assert!(std::fs::read_to_string(dir.path().join("table.md"))
            .unwrap()
            .contains("| 0.500 |"));
        write_report(&config, dir.path(), &[]).unwrap();
        let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1, "the header alone: {csv}");
    }
}
