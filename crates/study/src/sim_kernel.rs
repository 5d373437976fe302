//! Simulator-kernel studies (`kind = "simulator-kernel"`): every cell of the matrix runs
//! twice, on the kernel's network (the namespace testbed, as a `kernel` study runs it) and in
//! the simulator (`syncopate simulate` with the network's `args`), and the report sets the
//! two mean step times side by side with their ratio. The model is a profile (for a built-in
//! model, one that `syncopate models --profile` measured), replayed on both sides, so the two
//! differ only in the network and the hosts: the check of the simulator's network model,
//! datagram link included, against the real thing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::StudyConfig;
use crate::csv_format;
use crate::pairs::{job_side, simulation_side, PairRow};
use crate::run::{kernel_dir, simulator_dir};
use crate::table::fixed;

/// What one cell measured: the columns of its row of `results.csv` after its place
/// ([`crate::pairs::Place`]), in this order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SimKernelRow {
    /// Worker 0's mean step on the testbed after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f4")]
    pub kernel_step_seconds: f64,
    /// The simulator's mean step after the warm-up steps, seconds.
    #[serde(serialize_with = "csv_format::f4")]
    pub simulator_step_seconds: f64,
    /// Simulator over kernel (1: they agree).
    #[serde(serialize_with = "csv_format::f4")]
    pub simulator_over_kernel: f64,
    /// Frames a queue dropped in the simulation (all hosts).
    pub simulator_frames_dropped: u64,
    /// Frames the simulation retransmitted (all hosts).
    pub simulator_frames_retransmitted: u64,
    /// Losses the kernel's TCP found by a retransmission timeout (`TcpExtTCPTimeouts`, all
    /// hosts; empty where the testbed wrote no `tcp.json`).
    pub kernel_timeouts: Option<u64>,
    /// Losses the simulator's reliable flows found by a retransmission timeout.
    pub simulator_timeouts: u64,
    /// Tail loss probes the kernel's TCP sent (`TcpExtTCPLossProbes`, all hosts).
    pub kernel_loss_probes: Option<u64>,
    /// Losses the simulator's reliable flows found by a tail loss probe.
    pub simulator_loss_probes: u64,
}

/// What the testbed's `tcp.json` holds that the table uses: the hosts' counters summed.
#[derive(Debug, Deserialize)]
struct KernelTcp {
    total: KernelTotals,
}

/// The kernel's TCP counters over a job, summed over the hosts.
#[derive(Debug, Deserialize)]
struct KernelTotals {
    #[serde(rename = "TcpExtTCPTimeouts")]
    timeouts: u64,
    #[serde(rename = "TcpExtTCPLossProbes")]
    loss_probes: u64,
}

/// The kernel's TCP counters of the testbed job under `run_dir` (`None` where it wrote none).
fn kernel_tcp(run_dir: &Path) -> Result<Option<KernelTotals>> {
    let path = kernel_dir(run_dir).join("tcp.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let tcp: KernelTcp =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    Ok(Some(tcp.total))
}

/// `kernel, simulator`, the kernel's `-` where it was not counted.
fn side_by_side(kernel: Option<u64>, simulator: u64) -> String {
    let kernel = kernel.map_or_else(|| "-".to_string(), |k| k.to_string());
    format!("{kernel}, {simulator}")
}

impl PairRow for SimKernelRow {
    const HEADER: &'static [&'static str] = &HEADER;
    const EXPLAINED: &'static str = EXPLAINED;
    const SIDES: [fn(&Path) -> PathBuf; 2] = [kernel_dir, simulator_dir];

    fn cells(&self) -> Vec<String> {
        let r = self;
        vec![
            fixed(r.kernel_step_seconds, 4, " s"),
            fixed(r.simulator_step_seconds, 4, " s"),
            fixed(r.simulator_over_kernel, 3, ""),
            format!(
                "{}, {}",
                r.simulator_frames_dropped, r.simulator_frames_retransmitted
            ),
            side_by_side(r.kernel_timeouts, r.simulator_timeouts),
            side_by_side(r.kernel_loss_probes, r.simulator_loss_probes),
        ]
    }

    fn read(config: &StudyConfig, run_dir: &Path, first: &str, second: &str) -> Result<Self> {
        let tcp = kernel_tcp(run_dir)?;
        Ok(SimKernelRow {
            kernel_timeouts: tcp.as_ref().map(|t| t.timeouts),
            kernel_loss_probes: tcp.as_ref().map(|t| t.loss_probes),
            ..row(config, first, second)?
        })
    }
}

/// The figures of a cell from its testbed job's summary and its simulation's report (texts).
pub fn row(config: &StudyConfig, kernel: &str, simulator: &str) -> Result<SimKernelRow> {
    let (_, kernel_step_seconds) = job_side(config, kernel, "testbed job")?;
    let (sim, simulator_step_seconds) = simulation_side(config, simulator)?;
    Ok(SimKernelRow {
        kernel_step_seconds,
        simulator_step_seconds,
        simulator_over_kernel: simulator_step_seconds / kernel_step_seconds,
        simulator_frames_dropped: sim.network.frames_dropped,
        simulator_frames_retransmitted: sim.network.frames_retransmitted,
        simulator_timeouts: sim.network.timeouts,
        simulator_loss_probes: sim.network.loss_probes,
        ..SimKernelRow::default()
    })
}

/// The header of the table's figures (after the cell's place).
const HEADER: [&str; 6] = [
    "kernel step",
    "simulator step",
    "simulator / kernel",
    "simulator: drops, retransmissions",
    "TCP timeouts: kernel, simulator",
    "loss probes: kernel, simulator",
];

/// What the figures of a simulator-kernel study are.
const EXPLAINED: &str = "Every cell runs twice: on the kernel's network (the namespace \
    testbed: one host per process, htb, qdiscs and nftables) and in the simulator (`syncopate \
    simulate`, the network's flags), both replaying the same compute profile. Step: the mean \
    step time after the warm-up steps (worker 0's on the testbed). Simulator / kernel: 1 when \
    they agree; the simulator charges no host CPU for packets, copies or aggregation. TCP \
    timeouts and loss probes: over the whole job and every host, the kernel's from its \
    counters (`TcpExtTCPTimeouts`, `TcpExtTCPLossProbes` in the testbed's `tcp.json`; each \
    host's in that file), the simulator's from its reliable flows (each host's in its \
    report's `traffic`): where the step times part, these say whether the losses were \
    recovered alike.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pairs::{collect, markdown_lines, Paired, Place};
    use crate::run::summary_path;

    const STUDY: &str = r#"
name = "sim-kernel"
kind = "simulator-kernel"
steps = 4
warmup_steps = 1
batch_size = 64
workers = [4]
servers = 1
networks = [{ label = "a", bandwidth = "100mbit", args = ["--ingress", "--mtu", "1500"] }]
[[models]]
name = "profile:resnet50"
[[variants]]
label = "dlcp-10"
strategy = "dlcp"
args = ["--loss-bound", "10%", "--transport", "udp"]
"#;

    fn job(steps: &[f64]) -> String {
        let worker = syncopate_runtime::worker::WorkerSummary {
            step_seconds: steps.to_vec(),
            ..Default::default()
        };
        serde_json::json!({"worker0": worker}).to_string()
    }

    fn simulation(steps: &[f64]) -> String {
        let profile = syncopate_core::profile::ModelProfile::builtin("resnet50").unwrap();
        let mut sim =
            syncopate_sim::SimConfig::new(syncopate_core::strategy::StrategyKind::Allreduce, 2, 0);
        (sim.scale, sim.steps) = (1.0 / 1024.0, 1);
        let mut report = syncopate_sim::simulate(&profile, &sim).unwrap();
        report.step_seconds = steps.to_vec();
        report.network.frames_dropped = 4;
        report.network.frames_retransmitted = 5;
        (report.network.timeouts, report.network.loss_probes) = (6, 7);
        serde_json::to_string(&report).unwrap()
    }

    #[test]
    fn a_cell_runs_on_the_testbed_and_in_the_simulator_with_the_same_job_flags() {
        let config = StudyConfig::parse(STUDY).unwrap();
        let run = &config.runs()[0];
        let parts = crate::run::parts(config.kind, run, Path::new("cell"));
        let commands: Vec<&str> = parts.iter().map(|p| p.command).collect();
        assert_eq!(commands, [crate::config::TESTBED, "simulate"]);
        assert_eq!(parts[0].dir, kernel_dir(Path::new("cell")));
        let after_dashes = |args: &[String]| {
            let at = args.iter().position(|a| a == "--").unwrap();
            args[at + 1..].to_vec()
        };
        for flag in ["--transport", "--loss-bound"] {
            assert!(after_dashes(&parts[0].args).iter().any(|a| a == flag));
            assert!(parts[1].args.iter().any(|a| a == flag));
        }
        assert!(parts[1].args.iter().any(|a| a == "--ingress"));
        assert!(!parts[0].args.iter().any(|a| a == "--ingress"));
    }

    #[test]
    fn a_cell_reports_both_step_times_and_their_ratio_once_both_finished() {
        let dir = tempfile::tempdir().unwrap();
        let config = StudyConfig::parse(STUDY).unwrap();
        let run = &config.runs()[0];
        let run_dir = dir.path().join("runs").join(&run.id);
        let (kernel, sim) = (kernel_dir(&run_dir), simulator_dir(&run_dir));
        std::fs::create_dir_all(&kernel).unwrap();
        std::fs::create_dir_all(&sim).unwrap();
        std::fs::write(summary_path(&kernel), job(&[9.0, 2.0, 2.0])).unwrap();
        let rows: Vec<Paired<SimKernelRow>> = collect(&config, dir.path()).unwrap();
        assert!(rows.is_empty(), "the simulation has not finished");
        std::fs::write(summary_path(&sim), simulation(&[7.0, 1.8, 1.8])).unwrap();
        let rows: Vec<Paired<SimKernelRow>> = collect(&config, dir.path()).unwrap();
        let r = &rows[0].figures;
        assert_eq!(
            (r.kernel_step_seconds, r.simulator_step_seconds),
            (2.0, 1.8)
        );
        assert!((r.simulator_over_kernel - 0.9).abs() < 1e-12);
        let line = |r: &SimKernelRow| {
            let place = Place::of(run);
            let figures = r.clone();
            markdown_lines(&[Paired { place, figures }])[2].clone()
        };
        let without_counters = "| 2.0000 s | 1.8000 s | 0.900 | 4, 5 | -, 6 | -, 7 |";
        assert!(line(r).contains(without_counters), "{}", line(r));

        let tcp = r#"{"congestion_control": "cubic", "hosts": [],
            "total": {"TcpExtTCPTimeouts": 2, "TcpExtTCPLossProbes": 46, "TcpOutSegs": 9}}"#;
        std::fs::write(kernel.join("tcp.json"), tcp).unwrap();
        let rows: Vec<Paired<SimKernelRow>> = collect(&config, dir.path()).unwrap();
        let r = &rows[0].figures;
        assert_eq!(
            (r.kernel_timeouts, r.kernel_loss_probes),
            (Some(2), Some(46))
        );
        assert!(line(r).ends_with("| 4, 5 | 2, 6 | 46, 7 |"), "{}", line(r));

        std::fs::write(kernel.join("tcp.json"), r#"{"total": {}}"#).unwrap();
        let err = collect::<SimKernelRow>(&config, dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("tcp.json"), "{err:#}");
    }
}
