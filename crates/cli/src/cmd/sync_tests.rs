//! The synchronisation flags mean the same to every command: `launch` and `simulate` build
//! the same plan from the same flags, and a setting of another strategy is refused by the
//! plan, naming the flag.

use clap::Parser;
use syncopate_core::profile::ModelProfile;
use syncopate_core::strategy::SyncPlan;

use super::bench::BenchArgs;
use super::dist::JobArgs;
use super::simulate::{sim_config, SimulateArgs};

#[derive(Parser)]
struct Launch {
    #[command(flatten)]
    job: JobArgs,
}

#[derive(Parser)]
struct Simulate {
    #[command(flatten)]
    sim: SimulateArgs,
}

#[derive(Parser)]
struct Bench {
    #[command(flatten)]
    bench: BenchArgs,
}

/// The plan `launch` resolves from `flags` (at full size: no --scale).
fn launch_plan(flags: &[&str]) -> anyhow::Result<SyncPlan> {
    let launch = Launch::try_parse_from(["launch"].iter().chain(flags))?;
    Ok(launch.job.layout()?.sync)
}

/// The plan `simulate` runs from `flags`, at full size.
fn simulate_plan(flags: &[&str]) -> anyhow::Result<SyncPlan> {
    let args = Simulate::try_parse_from(["simulate", "--scale", "1"].iter().chain(flags))?.sim;
    let (strategy, workers) = (args.sync.strategy()?, args.workers.parse()?);
    let profile = ModelProfile::builtin("resnet50")?;
    let config = sim_config(&args, &profile, strategy, workers, &[(strategy, workers)])?;
    Ok(config.plan())
}

#[test]
fn launch_and_simulate_build_the_same_plan_from_the_same_flags() {
    let cases: [&[&str]; 6] = [
        &[
            "--strategy",
            "allreduce",
            "--workers",
            "4",
            "--bucket-mb",
            "4",
        ],
        &["--strategy", "allreduce", "--workers", "4", "--mesh"],
        &[
            "--strategy",
            "p3",
            "--workers",
            "3",
            "--servers",
            "2",
            "--slice-params",
            "5000",
            "--scheduler",
            "credit",
            "--credit-bytes",
            "300KB",
            "--autotune",
        ],
        &[
            "--strategy",
            "ps",
            "--workers",
            "2",
            "--servers",
            "1",
            "--scheduler",
            "priority",
        ],
        &[
            "--strategy",
            "stepwise",
            "--workers",
            "5",
            "--full-sync-every",
            "4",
            "--stepwise-head",
            "fixed",
        ],
        &[
            "--strategy",
            "dlcp",
            "--workers",
            "4",
            "--servers",
            "2",
            "--loss-bound",
            "2%",
            "--packet-bytes",
            "4KiB",
            "--loss-fill",
            "rescale",
            "--dlcp-no-spray",
            "--pull-loss-bound",
            "0.01",
            "--slice-params",
            "20000",
        ],
    ];
    for flags in cases {
        let launched = launch_plan(flags).unwrap_or_else(|e| panic!("launch {flags:?}: {e:#}"));
        let simulated =
            simulate_plan(flags).unwrap_or_else(|e| panic!("simulate {flags:?}: {e:#}"));
        assert_eq!(launched, simulated, "{flags:?}");
        assert_ne!(
            launched,
            SyncPlan::new(launched.strategy, launched.workers, launched.servers),
            "{flags:?}: the flags changed nothing"
        );
    }
}

#[test]
fn another_strategys_setting_is_refused_the_same_way_everywhere() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--strategy", "allreduce", "--servers", "2"],
            "--servers: strategy allreduce has no parameter servers",
        ),
        (
            &["--strategy", "p3", "--servers", "1", "--loss-bound", "2%"],
            "--loss-bound applies to --strategy dlcp and dlcp-allreduce only",
        ),
        (
            &["--strategy", "allreduce", "--full-sync-every", "3"],
            "--full-sync-every applies to --strategy stepwise",
        ),
        (
            &["--strategy", "p3", "--servers", "1", "--mesh"],
            "--mesh links the workers",
        ),
    ];
    for (flags, why) in cases {
        let flags: Vec<&str> = flags.iter().copied().chain(["--workers", "4"]).collect();
        for result in [launch_plan(&flags), simulate_plan(&flags)] {
            let err = format!("{:#}", result.expect_err(why));
            assert!(err.contains(why), "{flags:?}: {err}");
        }
    }
    let bench =
        Bench::try_parse_from(["bench-comm", "--slice-params", "100"]).map(|b| b.bench.layout());
    let err = format!("{:#}", bench.expect("parses").expect_err("refused"));
    assert!(
        err.contains("--slice-params does not apply to bench-comm"),
        "{err}"
    );
}

#[test]
fn a_simulate_sweep_gives_each_family_its_own_settings() {
    let args = Simulate::try_parse_from([
        "simulate",
        "--strategy",
        "p3,dlcp,stepwise",
        "--servers",
        "2",
        "--loss-bound",
        "3%",
        "--full-sync-every",
        "2",
    ])
    .map(|s| s.sim)
    .expect("parses");
    let profile = ModelProfile::builtin("resnet50").expect("a built-in profile");
    let members = args
        .sync
        .strategies
        .iter()
        .map(|&s| (s, 4))
        .collect::<Vec<_>>();
    let plans: Vec<SyncPlan> = members
        .iter()
        .map(|&(s, n)| sim_config(&args, &profile, s, n, &members).map(|c| c.sync))
        .collect::<anyhow::Result<_>>()
        .expect("every member takes what applies to it");
    assert_eq!(plans[0], SyncPlan::new(plans[0].strategy, 4, 2));
    assert_eq!(plans[1].dlcp.loss_bound, 0.03);
    assert_eq!((plans[2].full_sync_every, plans[2].servers), (2, 0));
}

#[test]
fn the_transport_sizes_dlcps_packets_in_the_plan() {
    let udp = launch_plan(&["--strategy", "dlcp-allreduce", "--transport", "udp"]).unwrap();
    assert_eq!(udp.dlcp.packet_elems * 4, 1388);
    let given = [
        "--strategy",
        "dlcp-allreduce",
        "--transport",
        "udp",
        "--packet-bytes",
        "400",
    ];
    assert_eq!(launch_plan(&given).unwrap().dlcp.packet_elems, 100);
    let big = [
        "--strategy",
        "dlcp-allreduce",
        "--transport",
        "udp",
        "--packet-bytes",
        "8KiB",
    ];
    let e = launch_plan(&big).unwrap_err().to_string();
    assert!(e.contains("at most 1388 bytes"), "{e}");
    let tcp = launch_plan(&["--strategy", "dlcp-allreduce"]).unwrap();
    assert_eq!(
        tcp.dlcp.packet_elems,
        SyncPlan::new(tcp.strategy, 2, 1).dlcp.packet_elems
    );
    let e = launch_plan(&["--strategy", "allreduce", "--transport", "udp"]).unwrap_err();
    assert!(
        e.to_string().contains("dlcp and dlcp-allreduce only"),
        "{e}"
    );
}
