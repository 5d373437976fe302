//! `simulate`'s fault flags, and how a faulty run is reported.

use anyhow::{bail, Result};
use clap::Args;
use syncopate_sim::faults::{stop_bound_ns, Ending, FaultConfig, FaultReport};
use syncopate_sim::SimConfig;

use crate::args::{parse_seconds, LivenessArgs};

/// Seeded faults (all off by default; any one on makes every process run the runtime's
/// liveness rules: heartbeats, the peer timeout, goodbyes, aborts). Reproduce a run with
/// its --seed.
#[derive(Debug, Args)]
pub struct FaultArgs {
    /// Probability that each process is killed (its connections close) at a random time
    /// within --fault-window.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub fault_crash: f64,
    /// Probability that each process freezes (stops answering; connections stay open).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub fault_freeze: f64,
    /// Probability that each pair of processes is cut apart (nothing passes either way).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub fault_partition: f64,
    /// Fraction of heartbeats lost on the way.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub fault_heartbeat_loss: f64,
    /// Largest extra delay of a control frame (heartbeat, goodbye, abort, close), in
    /// milliseconds, drawn per frame.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub fault_control_delay_ms: f64,
    /// Faults strike at a random time within this many seconds of virtual time.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_seconds)]
    pub fault_window: f64,
    #[command(flatten)]
    pub liveness: LivenessArgs,
}

impl FaultArgs {
    /// The fault configuration these flags describe (validated with the rest of the job).
    pub fn config(&self) -> Result<FaultConfig> {
        let ms = self.fault_control_delay_ms;
        if !ms.is_finite() || !(0.0..=3.6e6).contains(&ms) {
            bail!("--fault-control-delay-ms {ms} is not a delay from 0 to an hour");
        }
        Ok(FaultConfig {
            crash: self.fault_crash,
            freeze: self.fault_freeze,
            partition: self.fault_partition,
            heartbeat_loss: self.fault_heartbeat_loss,
            control_delay_ns: (ms * 1e6) as u64,
            window_ns: (self.fault_window * 1e9) as u64,
            liveness: self.liveness.config()?,
        })
    }
}

/// Prints what the faults did; an error if a process hung or stopped naming nobody a
/// fault hit, or too late (with the seed that reproduces it).
pub fn print_report(report: &FaultReport, config: &SimConfig) -> Result<()> {
    if report.strikes.is_empty() {
        println!("  faults: none struck (seed {})", report.seed);
    }
    for s in &report.strikes {
        println!("  fault at {:.3} s: {}", s.at_ns as f64 * 1e-9, s.fault);
    }
    let count = |f: fn(&Ending) -> bool| report.endings.iter().filter(|e| f(e)).count();
    let stopped = count(|e| matches!(e, Ending::Stopped { .. }));
    println!(
        "  {}: {} finished, {} stopped, {} crashed, {} frozen, {} hung; heartbeats {} sent, {} lost",
        if report.completed {
            "job completed"
        } else {
            "job stopped"
        },
        count(|e| matches!(e, Ending::Finished { .. })),
        stopped,
        count(|e| matches!(e, Ending::Crashed { .. })),
        count(|e| matches!(e, Ending::Frozen { .. })),
        count(|e| matches!(e, Ending::Hung)),
        report.heartbeats.0,
        report.heartbeats.1
    );
    if let Some((rank, Ending::Stopped { at_ns, error, .. })) = (report.endings.iter())
        .enumerate()
        .filter(|(_, e)| matches!(e, Ending::Stopped { .. }))
        .min_by_key(|(_, e)| match e {
            Ending::Stopped { at_ns, .. } => *at_ns,
            _ => u64::MAX,
        })
    {
        println!(
            "  first to stop: rank {rank} at {:.3} s: {error}",
            *at_ns as f64 * 1e-9
        );
    }
    if let Err(why) = report.check(stop_bound_ns(config)) {
        bail!("fault check failed: {why}");
    }
    Ok(())
}
