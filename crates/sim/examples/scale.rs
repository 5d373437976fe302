//! Times a large simulation: 1,024 workers and 32 servers training ResNet-50 under P3 for 10
//! steps at 10 Gbit/s, with the state machines' buffers scaled down 4,096 times.
//!
//! `cargo run -p syncopate-sim --release --example scale [workers] [servers] [steps] [1/scale]`

use std::time::Instant;

use syncopate_core::profile::ModelProfile;
use syncopate_core::strategy::StrategyKind;
use syncopate_sim::{simulate, SimConfig};

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (workers, servers, steps, inverse_scale) =
        (arg(1, 1024), arg(2, 32), arg(3, 10), arg(4, 4096));
    let profile = ModelProfile::builtin("resnet50")?;
    let mut config = SimConfig::new(StrategyKind::P3, workers as usize, servers as usize);
    config.network.bandwidth_bps = Some(10e9);
    config.network.latency_ns = 10_000;
    config.steps = steps;
    config.scale = 1.0 / inverse_scale as f64;
    let start = Instant::now();
    let report = simulate(&profile, &config)?;
    let wall = start.elapsed().as_secs_f64();
    let mean_util = |u: &[f64]| u.iter().sum::<f64>() / u.len().max(1) as f64;
    println!(
        "{workers} workers x {servers} servers, resnet50 p3, {steps} steps, scale 1/{inverse_scale}"
    );
    println!(
        "virtual: mean step {:.3} s, {:.0} samples/s; utilisation workers {:.2}, servers {:.2}",
        report.mean_step_seconds,
        report.samples_per_sec,
        mean_util(&report.worker_utilisation),
        mean_util(&report.server_utilisation)
    );
    println!(
        "{} frames, {} events in {wall:.2} s wall ({:.2} M events/s)",
        report.frames,
        report.events,
        report.events as f64 / wall / 1e6
    );
    Ok(())
}
