//! Agreement studies (`kind = "agreement"`): every cell of the matrix runs twice, as a job
//! (`syncopate launch`: real sockets on this machine, a profile's tensors and the network
//! scaled by the study's `scale`) and in the simulator (`syncopate simulate`: the full-size
//! model on virtual time, the same network model and seed), and the report sets the two mean
//! step times side by side with their ratio and each side's queue drops and retransmissions.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use crate::config::StudyConfig;
use crate::csv_format;
use crate::pairs::{job_side, simulation_side, PairRow};
use crate::run::{runtime_dir, simulator_dir};
use crate::table::fixed;

/// What one cell of an agreement study measured: the columns of its row of `results.csv` after
/// its place ([`crate::pairs::Place`]), in this order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgreementRow {
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

impl PairRow for AgreementRow {
    const HEADER: &'static [&'static str] = &HEADER;
    const EXPLAINED: &'static str = EXPLAINED;
    const SIDES: [fn(&Path) -> PathBuf; 2] = [runtime_dir, simulator_dir];

    fn cells(&self) -> Vec<String> {
        let r = self;
        let count = |v: Option<u64>| v.map_or("-".to_string(), |n| n.to_string());
        vec![
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

    fn read(config: &StudyConfig, _: &Path, first: &str, second: &str) -> Result<Self> {
        row(config, first, second)
    }
}

/// The figures of a cell from its job's summary and its simulation's report (their texts).
pub fn row(config: &StudyConfig, runtime: &str, simulator: &str) -> Result<AgreementRow> {
    let (job, runtime_step_seconds) = job_side(config, runtime, "job")?;
    let (sim, simulator_step_seconds) = simulation_side(config, simulator)?;
    Ok(AgreementRow {
        runtime_step_seconds,
        simulator_step_seconds,
        simulator_over_runtime: simulator_step_seconds / runtime_step_seconds,
        runtime_frames_dropped: job.frames_dropped,
        runtime_frames_retransmitted: job.frames_retransmitted,
        simulator_frames_dropped: sim.network.frames_dropped,
        simulator_frames_retransmitted: sim.network.frames_retransmitted,
    })
}

/// The header of the table's figures (after the cell's place).
const HEADER: [&str; 4] = [
    "runtime step",
    "simulator step",
    "simulator / runtime",
    "drops, retransmissions: runtime (worker 0); simulator (all hosts)",
];

/// What the figures of an agreement study are.
const EXPLAINED: &str = "Every cell runs twice: as a job over real sockets on this machine \
    (`syncopate launch`, a profile's tensors and the network scaled by the study's scale) and \
    in the simulator (`syncopate simulate`, the full-size model on virtual time), both with the \
    core's network model and the same seed. Step: the mean step time after the warm-up steps \
    (worker 0's in the job). Simulator / runtime: 1 when they agree.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pairs::{collect, markdown_lines, write_report, Paired, Place};
    use crate::run::summary_path;

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
        let config = StudyConfig::parse(STUDY).unwrap();
        let run = &config.runs()[0];
        assert!(run.args.windows(2).any(|w| w == ["--scale", "1/16"]));
        let r = row(
            &config,
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
        let lines = markdown_lines(&[Paired {
            place: Place::of(run),
            figures: r,
        }]);
        assert_eq!(lines.len(), 3);
        assert!(
            lines[2].contains("| 1.000 s | 1.500 s | 1.500 | 2, 3; 4, 5 |"),
            "{}",
            lines[2]
        );
        // A summary whose worker 0 lacks a field is an error, not a NaN.
        assert!(row(
            &config,
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
        let rows: Vec<Paired<AgreementRow>> = collect(&config, dir.path()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].figures.simulator_over_runtime, 0.5);
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
        write_report::<AgreementRow>(&config, dir.path(), &[]).unwrap();
        let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1, "the header alone: {csv}");
    }
}
