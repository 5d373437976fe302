//! The figures of a simulated run (a `kind = "simulate"` study): its [`RunRow`] read from the
//! report `syncopate simulate --json` wrote (the simulator's own [`SimReport`]), the part of
//! it a study compares (step times and each host's traffic).

use anyhow::{Context, Result};
use syncopate_core::net::parse_bandwidth;
use syncopate_sim::SimReport;

use crate::config::{RunSpec, StudyConfig};
use crate::rows::{ideal_step_seconds, RunRow};

/// The row of simulated run `run` from its report `text`: the mean step after the warm-up
/// steps, bytes per worker per step (the mean over workers of what each sent over the whole
/// run, per step) and the compute utilisation (the profile's forward and backward over that
/// step time).
pub fn row(config: &StudyConfig, run: &RunSpec, text: &str) -> Result<RunRow> {
    let outcome: SimReport =
        serde_json::from_str(text).context("parsing the simulation's report")?;
    let steps = &outcome.step_seconds;
    let step_seconds = mean_after_warmup(steps, config.warmup_steps);
    let workers = outcome.traffic.iter().take(run.workers);
    let sent: Vec<f64> = workers.map(|h| h.bytes_sent as f64).collect();
    let bytes_per_step =
        sent.iter().sum::<f64>() / sent.len().max(1) as f64 / steps.len().max(1) as f64;
    let bandwidth_bps = parse_bandwidth(&run.bandwidth)?;
    let samples = (config.batch_size * run.workers) as f64;
    let model = run.arg("--model").unwrap_or(&run.model);
    let compute = ideal_step_seconds(model, None).unwrap_or(f64::NAN);
    let ideal = ideal_step_seconds(model, bandwidth_bps).unwrap_or(f64::NAN);
    Ok(RunRow {
        id: run.id.clone(),
        variant: run.variant.clone(),
        network: run.network.clone(),
        bandwidth: run.bandwidth.clone(),
        latency_ms: run.latency_ms,
        bandwidth_gbps: bandwidth_bps.map_or(f64::NAN, |b| b / 1e9),
        seed: run.seed,
        step_seconds,
        samples_per_sec: samples / step_seconds,
        ideal_samples_per_sec: samples / ideal,
        fraction_of_ideal: ideal / step_seconds,
        compute_per_step: compute,
        wait_per_step: step_seconds - compute,
        wall_seconds: steps.iter().sum(),
        bytes_per_step,
        net_bytes: sent.iter().sum::<f64>() / sent.len().max(1) as f64,
        compute_utilisation: compute / step_seconds,
        ..RunRow::empty(&run.model, run.workers)
    })
}

/// The mean of `steps` after the first `warmup` (all but the last when there are no more).
pub fn mean_after_warmup(steps: &[f64], warmup: u64) -> f64 {
    let warm = (warmup as usize).min(steps.len().saturating_sub(1));
    let measured = steps.get(warm..).unwrap_or_default();
    measured.iter().sum::<f64>() / measured.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_run_gives_step_time_and_bytes_per_worker_per_step() {
        let config: StudyConfig = toml::from_str(
            "name = \"s\"\nkind = \"simulate\"\nsteps = 4\nwarmup_steps = 1\n\
             batch_size = 128\nworkers = [2]\nbandwidths = [\"1gbit\"]\n\
             [[models]]\nname = \"profile:resnet50\"\n\
             [[variants]]\nlabel = \"allreduce\"\nstrategy = \"allreduce\"\n",
        )
        .unwrap();
        let run = &config.runs()[0];
        // A real report, its steps and traffic set: two workers, then a server whose bytes
        // are not a worker's.
        let profile = syncopate_core::profile::ModelProfile::builtin("resnet50").unwrap();
        let allreduce = syncopate_core::strategy::StrategyKind::Allreduce;
        let mut sim = syncopate_sim::SimConfig::new(allreduce, 2, 0);
        (sim.scale, sim.steps) = (1.0 / 1024.0, 1);
        let mut report = syncopate_sim::simulate(&profile, &sim).unwrap();
        report.step_seconds = vec![9.0, 1.0, 2.0, 3.0];
        report.traffic = [400, 800, 99999]
            .map(|bytes_sent| syncopate_sim::HostTraffic {
                bytes_sent,
                ..Default::default()
            })
            .to_vec();
        let report = serde_json::to_string(&report).unwrap();
        let r = row(&config, run, &report).unwrap();
        assert_eq!(r.step_seconds, 2.0, "the warm-up step left out");
        assert_eq!(r.bytes_per_step, 150.0);
        assert_eq!(r.samples_per_sec, 128.0);
        let compute = ideal_step_seconds("profile:resnet50", None).unwrap();
        assert!((r.compute_utilisation - compute / 2.0).abs() < 1e-12);
        assert_eq!((r.network.as_str(), r.workers), ("1gbit", 2));
        assert!(r.test_accuracy.is_nan());
        assert!(row(&config, run, "{}").is_err());
    }
}
