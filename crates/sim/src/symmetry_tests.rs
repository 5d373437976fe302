//! The symmetric model against the packet-level one, on the sizes both run: ResNet-50's
//! step times under ring all-reduce and P3, and which model runs when.

use syncopate_core::profile::ModelProfile;
use syncopate_core::strategy::StrategyKind;

use crate::{model_choice, simulate, simulate_packet_level, SimConfig, SimReport};

/// How far the symmetric model's mean step time may be from the packet level's.
const TOLERANCE: f64 = 0.02;

fn resnet50() -> ModelProfile {
    match ModelProfile::builtin("resnet50") {
        Ok(p) => p,
        Err(e) => panic!("resnet50 profile: {e}"),
    }
}

fn config(strategy: StrategyKind, workers: usize, servers: usize) -> SimConfig {
    let mut c = SimConfig::new(strategy, workers, servers);
    c.network.bandwidth_bps = Some(25e9);
    c.network.latency_ns = 5_000;
    c.steps = 3;
    c.scale = 1.0 / 1024.0;
    c
}

fn both(profile: &ModelProfile, c: &SimConfig) -> (SimReport, SimReport) {
    let symmetric = simulate(profile, c).unwrap_or_else(|e| panic!("symmetric: {e}"));
    let packet = simulate_packet_level(profile, c).unwrap_or_else(|e| panic!("packet: {e}"));
    (symmetric, packet)
}

/// The relative difference of the two models' mean step times.
fn gap(symmetric: &SimReport, packet: &SimReport) -> f64 {
    (symmetric.mean_step_seconds - packet.mean_step_seconds).abs() / packet.mean_step_seconds
}

#[test]
fn a_ring_of_alike_workers_is_simulated_by_one_to_within_two_percent() {
    let profile = resnet50();
    for (workers, ingress) in [(8, false), (24, true), (64, false)] {
        let mut c = config(StrategyKind::Allreduce, workers, 0);
        c.network.ingress = ingress;
        let choice = model_choice(&profile, &c);
        assert!(choice.symmetric, "{}", choice.why);
        let (s, p) = both(&profile, &c);
        assert!(s.model_path.starts_with("symmetric"), "{}", s.model_path);
        assert!(
            gap(&s, &p) <= TOLERANCE,
            "{workers} workers: symmetric {} s, packet {} s",
            s.mean_step_seconds,
            p.mean_step_seconds
        );
        assert_eq!(s.frames, p.frames, "{workers} workers: the same frames");
        assert_eq!(s.traffic.len(), p.traffic.len());
        assert!(s.events * (workers as u64 / 2) < p.events);
    }
}

#[test]
fn p3_with_alike_workers_is_simulated_by_one_to_within_two_percent() {
    let profile = resnet50();
    for (workers, servers, ingress) in [(8, 8, false), (16, 2, true), (32, 32, false)] {
        let mut c = config(StrategyKind::P3, workers, servers);
        c.network.ingress = ingress;
        let (s, p) = both(&profile, &c);
        assert!(s.model_path.starts_with("symmetric"), "{}", s.model_path);
        assert!(
            gap(&s, &p) <= TOLERANCE,
            "{workers} workers, {servers} servers: symmetric {} s, packet {} s",
            s.mean_step_seconds,
            p.mean_step_seconds
        );
        assert_eq!(s.frames, p.frames);
    }
}

#[test]
fn anything_that_tells_workers_apart_runs_at_packet_level() {
    let profile = resnet50();
    let base = config(StrategyKind::Allreduce, 8, 0);
    let refused = |f: fn(&mut SimConfig)| {
        let mut c = base.clone();
        f(&mut c);
        let choice = model_choice(&profile, &c);
        assert!(!choice.symmetric, "{}", choice.why);
        assert_eq!(choice.hosts, c.workers + c.servers);
        choice.why
    };
    assert!(refused(|c| c.network.loss = 0.01).contains("lose"));
    assert!(refused(|c| c.network.queue_bytes = Some(1 << 20)).contains("drop"));
    assert!(refused(|c| c.jitter = 0.1).contains("jitter"));
    assert!(refused(|c| c.sync.workers = 4).contains("few"));
    assert!(refused(|c| c.sync.strategy = StrategyKind::Dlcp).contains("dlcp"));
    let ring = model_choice(&profile, &base);
    assert_eq!((ring.symmetric, ring.hosts), (true, 1));
}

/// The workers' NICs apart from the server's (`worker_bandwidth_bps`): at a hundredth of
/// the server's rate, the workers' pushes pace the step; a packet-level run says why.
#[test]
fn the_workers_nic_rate_applies_to_the_workers() {
    let profile = resnet50();
    let mut c = config(StrategyKind::P3, 8, 1);
    c.network.bandwidth_bps = Some(1e10);
    let step = |c: &SimConfig| match simulate(&profile, c) {
        Ok(r) => r.mean_step_seconds,
        Err(e) => panic!("{e}"),
    };
    let shared = step(&c);
    c.network.worker_bandwidth_bps = Some(1e8);
    let choice = model_choice(&profile, &c);
    assert!(
        !choice.symmetric && choice.why.contains("NICs"),
        "{}",
        choice.why
    );
    let slow = step(&c);
    assert!(slow > 1.5 * shared, "{slow} s against {shared} s");
    let mut ring = config(StrategyKind::Allreduce, 8, 0);
    ring.network.worker_bandwidth_bps = Some(1e8);
    assert!(
        model_choice(&profile, &ring).symmetric,
        "a ring has no servers"
    );
}
