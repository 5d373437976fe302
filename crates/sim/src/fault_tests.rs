//! Seeded faults end to end: what a crash, a freeze, a cut link and lost heartbeats do to a
//! simulated job, and a sweep of 1,000 seeds of random faults that must each end with the
//! exact result or with every process stopped, naming a rank a fault hit, in time.

use syncopate_core::profile::{LayerProfile, ModelProfile};
use syncopate_core::strategy::StrategyKind;

use crate::faults::{Ending, Fault, FaultConfig, FaultReport};
use crate::{simulate, SimConfig};

const MS: u64 = 1_000_000;

/// A small model: 4 layers, 10 k to 40 k parameters, 2-6 ms of compute each way.
fn model() -> ModelProfile {
    ModelProfile {
        name: "faulty".into(),
        batch_size: None,
        layers: (0..4)
            .map(|i| LayerProfile {
                name: format!("layer{i}"),
                op: "test".into(),
                forward_ns: (2 + i) * MS,
                backward_ns: (3 + i) * MS,
                param_count: 10_000 * (i as usize + 1),
                tensors: Vec::new(),
            })
            .collect(),
    }
}

/// A job of `steps` steps on 1 Gbit/s links with 20 µs latency, a 100 ms peer timeout
/// (20 ms heartbeats) and `faults`.
fn job(strategy: StrategyKind, workers: usize, steps: u64, faults: FaultConfig) -> SimConfig {
    let servers = if strategy.uses_servers() { 2 } else { 0 };
    let mut c = SimConfig::new(strategy, workers, servers);
    c.network.bandwidth_bps = Some(1e9);
    c.network.latency_ns = 20_000;
    c.steps = steps;
    c.faults = FaultConfig {
        liveness: faults.liveness.with_peer_timeout(100 * MS),
        ..faults
    };
    c
}

fn faults_of(c: &SimConfig) -> FaultReport {
    match simulate(&model(), c) {
        Ok(r) => r.faults.unwrap_or_else(|| panic!("no fault report")),
        Err(e) => panic!("simulation failed: {e}; reproduce with --seed {}", c.seed),
    }
}

fn bound(c: &SimConfig) -> u64 {
    crate::faults::stop_bound_ns(c)
}

/// The first seed whose only fault is one that `wanted` accepts.
fn seed_with_one_fault(c: &SimConfig, what: &str, wanted: impl Fn(Fault) -> bool) -> u64 {
    let hosts = c.workers + c.servers;
    (0..1_000)
        .find(|&seed| {
            let strikes = crate::faults::draw_strikes(&c.faults, seed, hosts);
            matches!(strikes[..], [s] if wanted(s.fault))
        })
        .unwrap_or_else(|| panic!("no seed of 1,000 {what}"))
}

/// With faults on but none striking: a delay on control frames, lost heartbeats.
fn harmless() -> FaultConfig {
    FaultConfig {
        control_delay_ns: MS,
        heartbeat_loss: 0.3,
        ..FaultConfig::default()
    }
}

#[test]
fn delayed_control_frames_and_lost_heartbeats_change_nothing_of_the_result() {
    for strategy in [StrategyKind::Ps, StrategyKind::P3, StrategyKind::Allreduce] {
        let quiet = FaultConfig {
            control_delay_ns: 1,
            ..FaultConfig::default()
        };
        let base = faults_of(&job(strategy, 4, 6, quiet));
        assert!(base.completed, "{strategy:?}: {:?}", base.endings);
        let noisy = faults_of(&job(strategy, 4, 6, harmless()));
        assert!(noisy.completed, "{strategy:?}: {:?}", noisy.endings);
        assert_eq!(noisy.values_digest, base.values_digest, "{strategy:?}");
        assert!(noisy.heartbeats.1 > 0, "some heartbeats were lost");
    }
}

#[test]
fn a_crashed_worker_is_named_by_every_other_process_within_the_timeout() {
    let mut c = job(
        StrategyKind::P3,
        4,
        200,
        FaultConfig {
            crash: 0.3,
            window_ns: 200 * MS,
            ..FaultConfig::default()
        },
    );
    // The first seed whose only fault is one worker's crash.
    c.seed = seed_with_one_fault(
        &c,
        "crashes one worker",
        |f| matches!(f, Fault::Crash(r) if r < 4),
    );
    let report = faults_of(&c);
    let [strike] = report.strikes[..] else {
        panic!("{:?}", report.strikes);
    };
    let Fault::Crash(dead) = strike.fault else {
        panic!("{strike:?}");
    };
    assert!(!report.completed);
    for (rank, ending) in report.endings.iter().enumerate() {
        match ending {
            Ending::Crashed { at_ns } => assert_eq!((rank, *at_ns), (dead, strike.at_ns)),
            Ending::Stopped { at_ns, names, .. } => {
                assert_eq!(*names, Some(dead), "rank {rank}: {ending:?}");
                // A crash closes connections: nobody waits for the timeout.
                assert!(*at_ns - strike.at_ns < MS, "rank {rank}: {ending:?}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    assert_eq!(report.check(bound(&c)), Ok(()));
}

#[test]
fn a_frozen_server_is_found_by_the_peer_timeout() {
    let mut c = job(
        StrategyKind::Ps,
        3,
        200,
        FaultConfig {
            freeze: 0.2,
            window_ns: 200 * MS,
            ..FaultConfig::default()
        },
    );
    c.seed = seed_with_one_fault(
        &c,
        "freezes one server",
        |f| matches!(f, Fault::Freeze(r) if r >= 3),
    );
    let report = faults_of(&c);
    let Fault::Freeze(frozen) = report.strikes[0].fault else {
        panic!("{:?}", report.strikes);
    };
    let at = report.strikes[0].at_ns;
    let timeout = c.faults.liveness.peer_timeout_ns;
    for (rank, ending) in report.endings.iter().enumerate() {
        match ending {
            Ending::Frozen { .. } => assert_eq!(rank, frozen),
            Ending::Stopped { at_ns, names, .. } => {
                assert_eq!(*names, Some(frozen), "rank {rank}: {ending:?}");
                // Silence is only noticed after the timeout, and not much later.
                let after = *at_ns - at;
                assert!(after <= bound(&c), "rank {rank}: {after} ns");
                if rank < 3 {
                    assert!(
                        after + timeout / 5 >= timeout / 2,
                        "rank {rank} stopped {after} ns after the freeze"
                    );
                }
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn a_cut_link_stops_the_ring_naming_one_of_its_ends() {
    let mut c = job(
        StrategyKind::Allreduce,
        4,
        200,
        FaultConfig {
            partition: 0.2,
            window_ns: 200 * MS,
            ..FaultConfig::default()
        },
    );
    // A link the ring uses: neighbours.
    c.seed = seed_with_one_fault(
        &c,
        "cuts one ring link",
        |f| matches!(f, Fault::Partition(a, b) if b - a == 1),
    );
    let report = faults_of(&c);
    let Fault::Partition(a, b) = report.strikes[0].fault else {
        panic!("{:?}", report.strikes);
    };
    for (rank, ending) in report.endings.iter().enumerate() {
        let Ending::Stopped { names, .. } = ending else {
            panic!("rank {rank}: {ending:?}");
        };
        assert!(names.is_some_and(|r| r == a || r == b), "{ending:?}");
    }
    assert_eq!(report.check(bound(&c)), Ok(()));
}

#[test]
fn the_same_seed_gives_the_same_endings() {
    let c = job(
        StrategyKind::P3,
        6,
        100,
        FaultConfig {
            crash: 0.1,
            freeze: 0.1,
            partition: 0.05,
            heartbeat_loss: 0.2,
            control_delay_ns: 2 * MS,
            window_ns: 300 * MS,
            ..FaultConfig::default()
        },
    );
    for seed in 0..5 {
        let c = SimConfig { seed, ..c.clone() };
        assert_eq!(faults_of(&c), faults_of(&c));
    }
}

/// The sweep: 1,000 seeds, each a random mix of faults over ps, p3 or all-reduce at 8 to
/// 32 workers. Every run ends with the exact result of the same job without faults, or
/// with every process not itself hit stopped in time, naming a rank a fault hit.
#[test]
fn a_thousand_seeds_of_random_faults_never_hang_and_always_name_the_lost_rank() {
    let strategies = [StrategyKind::Ps, StrategyKind::P3, StrategyKind::Allreduce];
    let mut exact = std::collections::HashMap::new();
    let (mut completed, mut stopped) = (0, 0);
    for seed in 0..1_000u64 {
        let strategy = strategies[(seed % 3) as usize];
        let workers = [8, 16, 32][(seed / 3 % 3) as usize];
        let hosts = workers + if strategy.uses_servers() { 2 } else { 0 };
        // About one process or link fault in two runs, lost heartbeats and delays in all.
        // Heartbeat loss stays low: five heartbeats a timeout all lost (p^5 = 3e-9) would
        // make a live peer look dead, a stop that no crash, freeze or cut explains.
        let per_host = 0.25 / hosts as f64;
        let faults = FaultConfig {
            crash: per_host,
            freeze: per_host,
            partition: 0.5 / (hosts * hosts) as f64,
            heartbeat_loss: 0.02,
            control_delay_ns: MS,
            window_ns: 120 * MS,
            ..FaultConfig::default()
        };
        let c = SimConfig {
            seed,
            ..job(strategy, workers, 8, faults)
        };
        let report = faults_of(&c);
        if let Err(why) = report.check(bound(&c)) {
            panic!("{strategy:?} x {workers}: {why}");
        }
        if report.completed {
            let want = *exact.entry((strategy.name(), workers)).or_insert_with(|| {
                let quiet = FaultConfig {
                    control_delay_ns: 1,
                    ..FaultConfig::default()
                };
                faults_of(&job(strategy, workers, 8, quiet)).values_digest
            });
            assert_eq!(
                report.values_digest, want,
                "{strategy:?} x {workers} completed with other values; reproduce with --seed {seed}"
            );
            completed += 1;
        } else {
            stopped += 1;
        }
    }
    println!("{completed} runs completed exactly, {stopped} stopped in time naming a hit rank");
    // Both outcomes are exercised.
    assert!(
        completed > 100 && stopped > 100,
        "{completed} completed, {stopped} stopped"
    );
}
