//! `syncopate simulate`: the core's strategies on virtual time, from 4 to 1,024+ workers.
//! Several strategies, bandwidths or worker counts make a sweep: a table, a CSV and a plot.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use syncopate_core::profile::ModelProfile;
use syncopate_core::strategy::StrategyKind;
use syncopate_core::tune::TuneReport;
use syncopate_report::{LineChart, LineStyle, Scale, Series};
use syncopate_runtime::job::Transport;
use syncopate_sim::{chrome_trace_json, model_choice, simulate, SimConfig, SimReport};
use syncopate_train::model;

use super::sim_faults::{print_report, FaultArgs};
use crate::args::{NetworkArgs, StepWindow};
use crate::sync_args::{transport_parser, SyncArgs};

/// `syncopate simulate`.
#[derive(Debug, Args)]
#[command(mut_arg("strategies", |a| a.default_value(StrategyKind::P3.name())))]
pub struct SimulateArgs {
    /// A compute profile: profile:resnet50, profile:vgg16, profile:vgg19, profile:sockeye or
    /// profile:FILE (PipeDream graph.txt, or a profile written by `syncopate.torch.profile`).
    #[arg(long, default_value = "profile:resnet50")]
    pub model: String,
    /// How the workers synchronise (lists of strategies make a sweep; each family's
    /// settings go to the strategies of the family).
    #[command(flatten)]
    pub sync: SyncArgs,
    /// How the loss-tolerant packets of dlcp and dlcp-allreduce travel: tcp, each a frame
    /// on the ports (lost or not as the network model decides); udp, as the runtime's
    /// --transport udp sends them: datagrams of the core's datagram link between each pair
    /// of processes (pacing and rate control by its feedback, its choice of path per
    /// packet), each a packet of the network model, with packets of at most 1388 bytes
    /// and the model at scale 1. The other strategies' frames are reliable either way.
    #[arg(long, value_parser = transport_parser(), default_value = "tcp")]
    pub transport: Transport,
    /// With --transport udp: the datagram rate controller's settings, the TOML file that
    /// `launch --rate-control` reads (any of initial_bps, min_bps, max_bps, additive_bps,
    /// beta, t_low_ns, t_high_ns, feedback_timeout_floor_ns, burst_bytes; the rest keep
    /// core's defaults), for every process.
    #[arg(long, value_name = "FILE")]
    pub rate_control: Option<PathBuf>,
    /// DLCP below scale 1: every packet a frame, even where the loss bound needs a share
    /// whole (by default such shares travel a slice a packet, each standing for its
    /// slice's packets: far fewer events, the same bound; with --mtu every packet is a
    /// frame anyway, as loss strikes packets).
    #[arg(long)]
    pub packet_level: bool,
    /// Workers, comma-separated for a sweep.
    #[arg(long, default_value = "4")]
    pub workers: String,
    /// The network model (--bandwidth accepts a comma list for a sweep, e.g.
    /// 1gbit,10gbit; default 10gbit, or the --network profile's).
    #[command(flatten)]
    pub net: NetworkArgs,
    #[command(flatten)]
    pub faults: FaultArgs,
    /// Steps to simulate.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Samples per step per worker, for samples/s (default: the batch the profile was
    /// measured at, else 128).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Compute jitter: each layer time times a uniform factor in 1 +- J.
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,
    /// Seed of the jitter and of the faults: the same seed, the same run.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Make worker RANK a straggler: its layer times are multiplied by FACTOR (>= 1), as
    /// `launch --slow-worker` does. Repeat the flag for several.
    #[arg(long = "slow-worker", value_name = "RANK:FACTOR")]
    pub slow_worker: Vec<syncopate_core::step::Straggler>,
    /// Write a Chrome/Perfetto trace of these steps (e.g. 2..4, 0-based, end excluded) to
    /// --trace.
    #[arg(long, value_name = "A..B")]
    pub trace_steps: Option<StepWindow>,
    /// Trace file (with --trace-steps).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Folder for a sweep's results.csv and throughput.svg.
    #[arg(long, default_value = "runs/simulate")]
    pub out: PathBuf,
    /// Write the (last) report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One simulation of a sweep: strategy, workers, the bandwidth's label and bit rate, and
/// what it measured.
type Row = (StrategyKind, usize, String, f64, SimReport);

fn list<T>(s: &str, parse: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    s.split(',').map(|p| parse(p.trim())).collect()
}

/// Resolves `profile:NAME` or `profile:FILE`.
fn profile(model: &str) -> Result<ModelProfile> {
    if !model::is_profile_name(model) {
        bail!("the simulator replays compute profiles: use --model profile:NAME (got {model})");
    }
    Ok(model::load_profile(model)?)
}

/// Runs the simulations and prints their figures.
pub fn run(args: SimulateArgs) -> Result<()> {
    let profile = profile(&args.model)?;
    let workers = list(&args.workers, |w| {
        w.parse::<usize>()
            .with_context(|| format!("--workers '{w}'"))
    })?;
    let members: Vec<(StrategyKind, usize)> = (args.sync.strategies.iter())
        .flat_map(|&s| workers.iter().map(move |&n| (s, n)))
        .collect();
    let bandwidths = args
        .net
        .resolve_sweep(Some(SimConfig::DEFAULT_BANDWIDTH_BPS))?;
    println!(
        "{:<22} {:>6} {:>7} {:>10} {:>9} {:>11} {:>9} {:>9} {:>8}",
        "strategy",
        "workers",
        "servers",
        "bandwidth",
        "step s",
        "samples/s",
        "w util",
        "s util",
        "wall s"
    );
    let mut rows: Vec<Row> = Vec::new();
    for &(s, n) in &members {
        for (name, network) in &bandwidths {
            let mut config = sim_config(&args, &profile, s, n, &members)?;
            config.network = network.clone();
            let report = run_one(&args, &profile, &config, name)?;
            let bps = network.bandwidth_bps.unwrap_or(f64::NAN);
            rows.push((s, n, name.clone(), bps, report));
        }
    }
    if let (Some(path), Some((_, _, _, _, report))) = (&args.json, rows.last()) {
        std::fs::write(path, serde_json::to_string_pretty(report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if rows.len() > 1 {
        write_sweep(&args, &profile, &rows, bandwidths.len() > 1)?;
    }
    Ok(())
}

/// The simulation of `strategy` on `workers` workers (one member of the sweep over
/// `members`) that the flags describe, over the default network.
pub(crate) fn sim_config(
    args: &SimulateArgs,
    profile: &ModelProfile,
    strategy: StrategyKind,
    workers: usize,
    members: &[(StrategyKind, usize)],
) -> Result<SimConfig> {
    let datagrams = args.transport == Transport::Udp && strategy.loss_tolerant();
    let transport = if datagrams {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let sync = (args.sync.for_sweep_member(strategy, workers, members))
        .plan_on(strategy, workers, workers, transport)
        .with_context(|| format!("{} with {workers} workers", strategy.name()))?;
    let hosts = sync.world_size() as f64;
    let mut config = SimConfig::with_plan(sync);
    config.steps = args.steps;
    config.batch = (args.batch_size)
        .or(profile.batch_size)
        .unwrap_or(SimConfig::DEFAULT_BATCH);
    config.jitter = args.jitter;
    config.seed = args.seed;
    config.stragglers = args.slow_worker.clone();
    config.faults = args.faults.config()?;
    config.trace_steps = args.trace_steps.clone().map(|w| w.0);
    let rate = args.transport.rate_config(args.rate_control.as_deref())?;
    config.datagram = datagrams.then_some(rate);
    config.packet_level = args.packet_level;
    config.scale = match args.sync.scale {
        Some(f) => f,
        // A datagram carries the values its packet holds: the model at full size.
        None if datagrams => 1.0,
        None => auto_scale(profile, &mut config, hosts),
    };
    Ok(config)
}

/// The scale that keeps the simulated hosts' buffers to about 50 million values in all:
/// the hosts of the symmetric model (one worker and the servers) where it will run
/// ([`model_choice`]), else all `hosts`.
fn auto_scale(profile: &ModelProfile, config: &mut SimConfig, hosts: f64) -> f64 {
    let scale = |hosts: f64| (5e7 / (hosts * profile.param_count().max(1) as f64)).min(1.0);
    config.scale = scale((1 + config.servers) as f64);
    let choice = model_choice(profile, config);
    match choice.symmetric {
        true => config.scale,
        false => scale(hosts),
    }
}

/// Simulates one member of the run and prints its row (and what its network, faults and
/// tuner did); writes the trace if one is asked for.
fn run_one(
    args: &SimulateArgs,
    profile: &ModelProfile,
    config: &SimConfig,
    bandwidth: &str,
) -> Result<SimReport> {
    let (s, n, servers) = (config.strategy, config.workers, config.servers);
    let start = Instant::now();
    let report = simulate(profile, config)
        .with_context(|| format!("simulating {} with {n} workers at {bandwidth}", s.name()))?;
    let wall = start.elapsed().as_secs_f64();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let server_util = if servers == 0 {
        "-".to_string()
    } else {
        format!("{:.0}%", mean(&report.server_utilisation) * 100.0)
    };
    println!(
        "{:<22} {:>6} {:>7} {:>10} {:>9.4} {:>11.1} {:>8.0}% {:>9} {:>8.2}",
        format!("{}/{}", s.name(), config.scheduler.name()),
        n,
        servers,
        bandwidth,
        report.mean_step_seconds,
        report.samples_per_sec,
        mean(&report.worker_utilisation) * 100.0,
        server_util,
        wall
    );
    print_details(&report, config)?;
    if let (Some(path), Some(_)) = (&args.trace, &args.trace_steps) {
        std::fs::write(path, chrome_trace_json(&report.trace))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

/// What the network, the faults and the tuner did in a simulation, where there is anything
/// to say.
fn print_details(report: &SimReport, config: &SimConfig) -> Result<()> {
    println!("  {}", report.model_path);
    let net = &report.network;
    if config.network.is_lossy() || net.frames_lost + net.frames_dropped > 0 {
        let t = &report.tensor_completion;
        println!(
            "  network: {} frames lost, {} dropped by queues, {} retransmitted; \
             queueing mean {:.1} us, max {:.1} us; tensor completion p50 {:.4} s, \
             p99 {:.4} s",
            net.frames_lost,
            net.frames_dropped,
            net.frames_retransmitted,
            net.mean_queueing_ns() / 1e3,
            net.queueing_ns_max as f64 / 1e3,
            t.p50_s,
            t.p99_s
        );
    }
    if let Some(d) = &report.datagrams {
        println!(
            "  datagrams: {} sent, {} received ({} lost or dropped on the way), {} refused; \
             feedback {} sent, {} received",
            d.sent,
            d.received,
            d.sent.saturating_sub(d.received + d.drops()),
            d.drops(),
            d.feedback_sent,
            d.feedback_received
        );
    }
    if let Some(faults) = &report.faults {
        print_report(faults, config)?;
    }
    if let Some(tune) = &report.autotune {
        println!(
            "  {}",
            describe_tuning(tune, &report.step_seconds, config.scale)
        );
    }
    Ok(())
}

/// What the tuner chose (in full-size bytes: the state machines run at `scale`), and the
/// mean step after its last candidate was measured.
fn describe_tuning(tune: &TuneReport, step_seconds: &[f64], scale: f64) -> String {
    // The tuner's n-th step time is step n's (the first step has none before it).
    let after = tune
        .settled_after_steps
        .and_then(|n| step_seconds.get(n as usize + 1..))
        .unwrap_or(&[]);
    let settled = match after.len() {
        0 => "no step left after the search".to_string(),
        n => format!(
            "{:.4} s a step over the {n} steps after it",
            after.iter().sum::<f64>() / n as f64
        ),
    };
    format!("autotune: {}; {settled}", tune.describe(scale))
}

fn write_sweep(
    args: &SimulateArgs,
    profile: &ModelProfile,
    rows: &[Row],
    by_bandwidth: bool,
) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut csv = String::from("model,strategy,scheduler,workers,servers,bandwidth,bandwidth_gbps,step_seconds,samples_per_sec,frames_lost,frames_dropped,frames_retransmitted,mean_queueing_us,tensor_p50_s,tensor_p99_s\n");
    for (s, n, name, bps, r) in rows {
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{:.6},{:.2},{},{},{},{:.3},{:.6},{:.6}\n",
            profile.name,
            s.name(),
            r.config.scheduler.name(),
            n,
            r.config.servers,
            name,
            bps / 1e9,
            r.mean_step_seconds,
            r.samples_per_sec,
            r.network.frames_lost,
            r.network.frames_dropped,
            r.network.frames_retransmitted,
            r.network.mean_queueing_ns() / 1e3,
            r.tensor_completion.p50_s,
            r.tensor_completion.p99_s
        ));
    }
    std::fs::write(args.out.join("results.csv"), csv)?;
    let mut series: Vec<Series> = Vec::new();
    for (s, n, _, bps, r) in rows {
        let label = if by_bandwidth {
            format!("{} ({n} workers)", s.name())
        } else {
            s.name().to_string()
        };
        let x = if by_bandwidth { bps / 1e9 } else { *n as f64 };
        match series.iter_mut().find(|x| x.name == label) {
            Some(existing) => existing.points.push((x, r.samples_per_sec)),
            None => series.push(Series {
                name: label,
                points: vec![(x, r.samples_per_sec)],
                style: LineStyle::Solid,
                colour: None,
            }),
        }
    }
    let chart = LineChart {
        title: format!("simulated {}: throughput", profile.name),
        x_label: if by_bandwidth {
            "bandwidth per host, Gbit/s".into()
        } else {
            "workers".into()
        },
        y_label: "samples/s (all workers)".into(),
        x_scale: Scale::Log,
        y_scale: if by_bandwidth {
            Scale::Linear
        } else {
            Scale::Log
        },
        series,
        width: 820,
        height: 480,
    };
    std::fs::write(args.out.join("throughput.svg"), chart.to_svg()?)?;
    println!(
        "sweep: {} and {}",
        args.out.join("results.csv").display(),
        args.out.join("throughput.svg").display()
    );
    Ok(())
}
