//! The symmetric model against the packet-level one: ResNet-50 at 25 Gbit/s for 10 steps,
//! both models at the scale `simulate` gives the packet-level model, one row of a
//! markdown table per size. Run each model in its own process to read its peak memory.
//!
//! `cargo run -p syncopate-sim --example symmetry -- allreduce|p3 WORKERS,... [both|packet|symmetric] [GBIT] [SERVERS]`
//! (25 Gbit/s and as many servers as workers unless given).

use std::time::Instant;

use syncopate_core::profile::ModelProfile;
use syncopate_core::strategy::StrategyKind;
use syncopate_sim::{simulate, simulate_packet_level, SimConfig, SimError, SimReport};

type Run = fn(&ModelProfile, &SimConfig) -> Result<SimReport, SimError>;

fn timed(run: Run, profile: &ModelProfile, c: &SimConfig) -> Result<(f64, f64), SimError> {
    let start = Instant::now();
    let report = run(profile, c)?;
    Ok((report.mean_step_seconds, start.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let strategy = StrategyKind::from_name(args.get(1).map_or("allreduce", String::as_str))
        .ok_or("strategy: allreduce or p3")?;
    let sizes = args.get(2).map_or("8,16,32,64", String::as_str);
    let which = args.get(3).map_or("both", String::as_str);
    let gbit: f64 = args.get(4).map_or(Ok(25.0), |a| a.parse())?;
    let fixed_servers: Option<usize> = args.get(5).map(|a| a.parse()).transpose()?;
    let profile = ModelProfile::builtin("resnet50")?;
    println!("| strategy | workers | servers | Gbit/s | packet step s | symmetric step s | difference | packet wall s | symmetric wall s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes.split(',') {
        let n: usize = n.trim().parse()?;
        let servers = match strategy.uses_servers() {
            true => fixed_servers.unwrap_or(n),
            false => 0,
        };
        let mut c = SimConfig::new(strategy, n, servers);
        c.network.bandwidth_bps = Some(gbit * 1e9);
        c.steps = 10;
        let hosts = (n + servers) as f64;
        c.scale = (5e7 / (hosts * profile.param_count() as f64)).min(1.0);
        let none = (f64::NAN, f64::NAN);
        let p = match which {
            "symmetric" => none,
            _ => timed(simulate_packet_level, &profile, &c)?,
        };
        let s = match which {
            "packet" => none,
            _ => timed(simulate, &profile, &c)?,
        };
        println!(
            "| {} | {n} | {servers} | {gbit} | {:.4} | {:.4} | {:+.2} % | {:.2} | {:.2} |",
            strategy.name(),
            p.0,
            s.0,
            (s.0 - p.0) / p.0 * 100.0,
            p.1,
            s.1
        );
    }
    Ok(())
}
