//! End-to-end checks of the simulator: closed forms, determinism, strategy comparisons and
//! scale, all through the public [`simulate`] entry point.

use proptest::prelude::*;
use syncopate_core::net::{LinkProfile, Shaper};
use syncopate_core::profile::{LayerProfile, ModelProfile};
use syncopate_core::sched::SchedulerKind;
use syncopate_core::strategy::StrategyKind;

use crate::engine::{Polling, Sim};
use crate::{chrome_trace_json, simulate, HostTraffic, Lane, SimConfig, SimReport};

const GBIT: f64 = 1e9;

/// A model of the given layers `(params, forward ns, backward ns)`.
fn model(layers: &[(usize, u64, u64)]) -> ModelProfile {
    ModelProfile {
        name: "test".into(),
        batch_size: None,
        layers: (layers.iter().enumerate())
            .map(
                |(i, &(param_count, forward_ns, backward_ns))| LayerProfile {
                    name: format!("layer{i}"),
                    op: "test".into(),
                    forward_ns,
                    backward_ns,
                    param_count,
                    tensors: Vec::new(),
                },
            )
            .collect(),
    }
}

fn config(
    strategy: StrategyKind,
    workers: usize,
    servers: usize,
    bps: f64,
    latency_ns: u64,
) -> SimConfig {
    let mut c = SimConfig::new(strategy, workers, servers);
    c.network.bandwidth_bps = Some(bps);
    c.network.latency_ns = latency_ns;
    c
}

/// Serialisation time of a frame of `bytes` at `bps`, as the core's shaper rounds it.
fn ser_ns(bps: f64, bytes: usize) -> u64 {
    Shaper::new(LinkProfile {
        bandwidth_bps: Some(bps),
        ..LinkProfile::default()
    })
    .transmission_ns(bytes)
}

fn run(profile: &ModelProfile, c: &SimConfig) -> SimReport {
    match simulate(profile, c) {
        Ok(r) => r,
        Err(e) => panic!("simulation failed: {e}"),
    }
}

/// One worker, one server, one key of 3 Mi values (three 1 Mi-value frames of F bytes, T to
/// serialise), no compute. The worker pushes the three frames back to back (the window is
/// refilled before the NIC idles): push i is in at `iT + L`; the server answers each at
/// once, and its replies leave back to back from `T + L`, so the last is in at `4T + 2L`.
/// In general n frames through two store-and-forward serialisations take `(n + 1)T + 2L`,
/// not the `2(nT + L)` of push-then-pull. Shaping ingress at the same rate adds nothing:
/// the ingress port is cut-through, so a frame it receives leaves as its last bit comes in
/// (it added two serialisation stages, `(n + 3)T + 2L`, when it stored and forwarded whole
/// frames). Every step repeats the first: the next forward waits for the values. The scaled model (1/64) charges the same bytes, so it must give the same times.
#[test]
fn ps_step_time_matches_the_closed_form_to_the_nanosecond() {
    let (bps, latency) = (GBIT, 50_000);
    let profile = model(&[(3 << 20, 0, 0)]);
    let t = ser_ns(bps, 48 + (4 << 20));
    assert_eq!(t, 33_554_816);
    for (scale, window, ingress, want) in [
        (1.0, 256 << 10, false, 4 * t + 2 * latency),
        (1.0 / 64.0, 256 << 10, false, 4 * t + 2 * latency),
        (1.0, 64 << 20, false, 4 * t + 2 * latency),
        (1.0, 256 << 10, true, 4 * t + 2 * latency),
    ] {
        let mut c = config(StrategyKind::Ps, 1, 1, bps, latency);
        (c.scale, c.network.buffer_bytes, c.network.ingress, c.steps) = (scale, window, ingress, 3);
        let r = run(&profile, &c);
        assert_eq!(
            r.step_end_ns,
            vec![want, 2 * want, 3 * want],
            "scale {scale} window {window} ingress {ingress}"
        );
        assert_eq!(r.traffic[0].bytes_sent, 3 * 3 * (48 + (4 << 20)));
        assert_eq!(r.traffic[1].bytes_received, r.traffic[0].bytes_sent);
        assert_eq!(r.frames, 3 * 6);
    }
}

/// A small bucket (4 copies of 1,000 values, shared whole) with 4 workers, no compute, 1
/// Gbit/s and 100 us of latency: on the ring the workers exchange copies with a neighbour
/// in two rounds (2(T + L), T a frame's serialisation: 2 frames each); over the mesh every
/// worker serialises its 3 copies back to back and each lands one latency later (3T + L).
#[test]
fn small_buckets_cross_a_mesh_in_one_hop() {
    let (n, latency) = (4usize, 100_000u64);
    let profile = model(&[(1000, 0, 0)]);
    let t = ser_ns(GBIT, 48 + 4000);
    let step = |mesh: bool| {
        let mut c = config(StrategyKind::Allreduce, n, 0, GBIT, latency);
        (c.steps, c.sync.mesh) = (2, mesh);
        assert_eq!(c.plan().meshed(), mesh);
        let r = run(&profile, &c);
        let frames = if mesh { 3 } else { 2 };
        let per_worker = frames * (48 + 4000) * 2u64;
        assert!(r
            .traffic
            .iter()
            .all(|t| t.bytes_sent == per_worker && t.bytes_received == per_worker));
        r.step_end_ns
    };
    let ring = 2 * (t + latency);
    assert_eq!(step(false), vec![ring, 2 * ring]);
    let mesh = 3 * t + latency;
    assert_eq!(step(true), vec![mesh, 2 * mesh]);
}

/// Ring all-reduce of one bucket of S bytes over n workers, no compute. With one segment per
/// chunk (m = 1) the 2(n-1) ring steps are sequential hops of one frame each:
/// `2(n-1)(T_chunk + L)`, T_chunk the time of `48 + S/n` bytes. With m segments per chunk and
/// `L <= (m-1)T_seg` every NIC sends its `2(n-1)m` frames back to back (each forwarded
/// segment arrives before the NIC is free), so the last frame lands at `2(n-1)m T_seg + L`:
/// the pipelining hides all but one latency. Both are within 2 % of the textbook
/// `2(n-1)/n S/B + 2(n-1)L` when L is small next to the transfer (case 2).
#[test]
fn ring_allreduce_matches_the_closed_form() {
    let textbook = |n: u64, s: f64, l: u64| {
        2.0 * (n - 1) as f64 / n as f64 * s * 8.0 + (2 * (n - 1) * l) as f64
    };
    // n = 8, S = 8 MiB: chunks of 256 Ki values, one segment each.
    let (n, latency) = (8usize, 100_000u64);
    let profile = model(&[(8 << 18, 0, 0)]);
    let t_chunk = ser_ns(GBIT, 48 + (1 << 20));
    let mut c = config(StrategyKind::Allreduce, n, 0, GBIT, latency);
    c.steps = 2;
    let r = run(&profile, &c);
    let want = 2 * (n as u64 - 1) * (t_chunk + latency);
    assert_eq!(r.step_end_ns, vec![want, 2 * want]);
    let book = textbook(n as u64, (32 << 20) as f64 / 4.0, latency);
    assert!((want as f64 / book - 1.0).abs() < 0.02, "{want} vs {book}");

    // n = 4, S = 32 MiB: chunks of 2 Mi values, m = 2 segments of 1 Mi; also scaled 1/256.
    let (n, latency) = (4usize, 1_000u64);
    let profile = model(&[(8 << 20, 0, 0)]);
    let t_seg = ser_ns(GBIT, 48 + (4 << 20));
    let want = 2 * (n as u64 - 1) * 2 * t_seg + latency;
    for scale in [1.0, 1.0 / 256.0] {
        let mut c = config(StrategyKind::Allreduce, n, 0, GBIT, latency);
        (c.sync.bucket_bytes, c.scale, c.steps) = (64 << 20, scale, 2);
        let r = run(&profile, &c);
        assert_eq!(r.step_end_ns, vec![want, 2 * want], "scale {scale}");
        let book = textbook(n as u64, (32 << 20) as f64, latency);
        assert!((want as f64 / book - 1.0).abs() < 0.02, "{want} vs {book}");
        let per_worker = 2 * 3 * 2 * (48 + (4u64 << 20)) * 2;
        assert!(r
            .traffic
            .iter()
            .all(|t| t.bytes_sent == per_worker && t.bytes_received == per_worker));
    }
}

/// Without a bandwidth limit or latency, communication is instant: every strategy's step is
/// exactly the compute (forward + backward of every layer).
#[test]
fn an_infinitely_fast_network_leaves_only_compute() {
    let profile = ModelProfile::builtin("resnet50").unwrap();
    let compute = profile.forward_ns() + profile.backward_ns();
    for strategy in StrategyKind::ALL {
        let servers = if strategy.uses_servers() { 2 } else { 0 };
        let mut c = SimConfig::new(strategy, 3, servers);
        (c.network.bandwidth_bps, c.scale, c.steps) = (None, 1.0 / 1024.0, 3);
        let r = run(&profile, &c);
        assert_eq!(
            r.step_end_ns,
            vec![compute, 2 * compute, 3 * compute],
            "{strategy:?}"
        );
        assert!(r.worker_utilisation.iter().all(|&u| u == 0.0));
    }
}

#[test]
fn same_config_same_report_and_the_seed_matters() {
    let profile = ModelProfile::builtin("resnet50").unwrap();
    let mut c = config(StrategyKind::P3, 6, 2, 5.0 * GBIT, 20_000);
    (c.scale, c.steps, c.jitter, c.seed, c.trace_steps) = (1.0 / 256.0, 3, 0.05, 1, Some(1..2));
    let a = run(&profile, &c);
    let b = run(&profile, &c);
    assert_eq!(a, b);
    assert!(!a.trace.is_empty());
    let json = serde_json::to_string(&a).unwrap();
    let back: SimReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a);
    c.seed = 2;
    let other = run(&profile, &c);
    assert_ne!(a.step_end_ns, other.step_end_ns);
    c.jitter = 0.0;
    let plain = run(&profile, &c);
    assert_ne!(plain.step_end_ns, a.step_end_ns);
}

/// The trace holds the traced steps only: compute of every layer on every worker, one send
/// and one receive per frame, and forms a valid Chrome trace.
#[test]
fn trace_covers_the_window_only() {
    let profile = model(&[
        (1000, 10_000, 20_000),
        (0, 5_000, 5_000),
        (3000, 10_000, 20_000),
    ]);
    let mut c = config(StrategyKind::P3, 2, 2, GBIT, 1_000);
    (c.steps, c.sync.slice_params, c.trace_steps) = (4, 700, Some(1..3));
    let r = run(&profile, &c);
    let count = |lane| r.trace.iter().filter(|e| e.lane == lane).count();
    assert_eq!(count(Lane::Compute), 2 * 2 * 2 * 3);
    assert_eq!(count(Lane::Send), r.frames as usize / 2);
    assert_eq!(count(Lane::Send), count(Lane::Receive));
    let json: serde_json::Value = serde_json::from_str(&chrome_trace_json(&r.trace)).unwrap();
    assert_eq!(
        json["traceEvents"].as_array().map(Vec::len),
        Some(r.trace.len())
    );
}

/// P3 (slices, round robin, priority) is never slower than FIFO `ps` on VGG-19, and faster
/// where the network is the bottleneck but not hopelessly so.
#[test]
fn p3_beats_fifo_ps_on_vgg19() {
    let profile = ModelProfile::builtin("vgg19").unwrap();
    for gbit in [1.0, 5.0, 25.0] {
        let mean = |strategy| {
            let mut c = config(strategy, 4, 4, gbit * GBIT, 10_000);
            (c.scale, c.steps) = (1.0 / 16.0, 4);
            run(&profile, &c).mean_step_seconds
        };
        let (ps, p3) = (mean(StrategyKind::Ps), mean(StrategyKind::P3));
        eprintln!("vgg19 {gbit} Gbit/s: ps {ps:.4} s, p3 {p3:.4} s");
        assert!(p3 <= ps, "{gbit} Gbit/s: p3 {p3} > ps {ps}");
        if gbit == 5.0 {
            assert!(
                p3 < 0.95 * ps,
                "5 Gbit/s: p3 {p3} not clearly faster than ps {ps}"
            );
        }
    }
}

/// Where a fixed credit leaves the link idle (ResNet-50 at 1 Gbit/s), `--autotune` finds a
/// credit whose steps are as fast as p3's once its search is over, and reports it.
#[test]
fn an_autotuned_credit_runs_as_fast_as_p3_after_its_search() {
    let profile = ModelProfile::builtin("resnet50").unwrap();
    let run_with = |scheduler, autotune| {
        let mut c = config(StrategyKind::P3, 4, 4, GBIT, 10_000);
        (c.scale, c.steps, c.sync.scheduler, c.sync.autotune) =
            (1.0 / 16.0, 40, scheduler, autotune);
        run(&profile, &c)
    };
    let p3 = run_with(SchedulerKind::Priority, false);
    let fixed = run_with(SchedulerKind::Credit, false);
    let tuned = run_with(SchedulerKind::Credit, true);
    assert!(p3.autotune.is_none() && fixed.autotune.is_none());
    let tune = tuned.autotune.as_ref().expect("the tuner's report");
    let settled = tune
        .settled_after_steps
        .expect("the search ends within 40 steps") as usize;
    let after = &tuned.step_seconds[settled + 1..];
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let p3_step = mean(&p3.step_seconds[settled + 1..]);
    eprintln!(
        "p3 {p3_step:.4} s, fixed credit {:.4} s, tuned {:.4} s after step {settled}: {tune:?}",
        fixed.mean_step_seconds,
        mean(after)
    );
    assert!(
        fixed.mean_step_seconds > 1.5 * p3.mean_step_seconds,
        "the test needs a slow credit"
    );
    assert!(
        mean(after) < 1.02 * p3_step,
        "tuned {} vs p3 {p3_step}",
        mean(after)
    );
    assert!(tune.chosen.credit_bytes > 4 * fixed.config.plan().credit_bytes);
    assert_eq!(
        tune.trials[0].credit_bytes,
        fixed.config.plan().credit_bytes
    );
}

/// Every key of every step on every worker has a completion time; under loss the tail
/// (p99) carries the repairs.
#[test]
fn tensor_completion_times_show_the_retransmission_tail() {
    let profile = model(&[(100_000, 200_000, 400_000); 8]);
    let run_with = |loss: f64| {
        let mut c = config(StrategyKind::P3, 4, 2, GBIT, 10_000);
        (c.steps, c.network.loss, c.network.rto_ns) = (20, loss, 200_000_000);
        run(&profile, &c).tensor_completion
    };
    let (clean, lossy) = (run_with(0.0), run_with(0.02));
    assert_eq!(clean.count, 4 * 20 * 8);
    assert_eq!(lossy.count, 4 * 20 * 8);
    assert!(clean.p99_s < 0.2, "{clean:?}");
    assert!(lossy.p99_s > clean.p99_s, "{lossy:?} against {clean:?}");
}

/// Each host's timeouts and loss probes (the kernel's per-namespace counters' match) add up
/// to the network's, and the servers, which send the pulls, recover losses of their own.
#[test]
fn each_timeout_is_counted_once_by_its_cause() {
    let profile = model(&[(100_000, 200_000, 400_000); 8]);
    let mut c = config(StrategyKind::Allreduce, 4, 0, GBIT, 10_000);
    (c.steps, c.network.loss, c.network.mtu_bytes) = (20, 0.05, Some(1_500.0));
    let report = run(&profile, &c);
    let network = &report.network;
    assert!(network.timeouts > 0, "{network:?}");
    assert_eq!(network.timeout_causes.total(), network.timeouts);
    assert!((report.traffic.iter()).all(|t| t.timeout_causes.total() == t.timeouts));
}

#[test]
fn each_host_counts_the_losses_its_ports_recovered() {
    let profile = model(&[(100_000, 200_000, 400_000); 8]);
    let mut c = config(StrategyKind::P3, 4, 2, GBIT, 10_000);
    (c.steps, c.network.loss) = (20, 0.02);
    let report = run(&profile, &c);
    let sum = |f: fn(&HostTraffic) -> u64| report.traffic.iter().map(f).sum::<u64>();
    let network = &report.network;
    assert!(network.timeouts + network.loss_probes > 0, "{network:?}");
    assert_eq!(sum(|t| t.timeouts), network.timeouts);
    assert_eq!(sum(|t| t.loss_probes), network.loss_probes);
    let servers = &report.traffic[4..];
    assert!(
        servers.iter().any(|t| t.timeouts + t.loss_probes > 0),
        "{servers:?}"
    );
    // Every host sent reliable frames through its flows' windows (cubic): what they were.
    for t in &report.traffic {
        let w = t.windows.unwrap_or_else(|| panic!("no windows: {t:?}"));
        assert!(w.offers > 0 && (0.0..=1.0).contains(&w.held_share), "{w:?}");
        assert!(
            w.cwnd_segments_mean >= 2.0,
            "cubic's floor is 2 segments: {w:?}"
        );
        assert!(w.cwnd_segments_max as f64 >= w.cwnd_segments_mean, "{w:?}");
        assert!(
            w.srtt_ms_mean > 0.0 && w.srtt_ms_max >= w.srtt_ms_mean,
            "{w:?}"
        );
        // A socket holds at most the send window and the frame that filled it (the
        // largest key, 400,000 bytes, and its headers).
        let largest_frame = 400_000 + 1_000;
        let bound = (c.network.buffer_bytes + largest_frame) as u64;
        assert!(
            w.socket_bytes_max > 0 && w.socket_bytes_max < bound,
            "{w:?}"
        );
    }
    // The model's BBR has no window to report.
    c.network.tcp = syncopate_core::net::CongestionControl::Bbr;
    let bbr = run(&profile, &c);
    assert!(bbr.traffic.iter().all(|t| t.windows.is_none()));
}

#[test]
fn sixty_four_workers_resnet50_p3() {
    let profile = ModelProfile::builtin("resnet50").unwrap();
    let mut c = config(StrategyKind::P3, 64, 8, 10.0 * GBIT, 10_000);
    (c.scale, c.steps) = (1.0 / 256.0, 2);
    let r = run(&profile, &c);
    assert_eq!(r.step_end_ns.len(), 2);
    assert!(r.step_end_ns[0] > 0 && r.step_end_ns[1] > r.step_end_ns[0]);
    // Every worker pushes every slice once a step; every server answers all workers.
    let pushed: u64 = r.traffic[..64].iter().map(|t| t.bytes_sent).sum();
    let answered: u64 = r.traffic[64..].iter().map(|t| t.bytes_sent).sum();
    assert_eq!(pushed, answered);
    let sent: u64 = r.traffic.iter().map(|t| t.bytes_sent).sum();
    assert_eq!(
        sent,
        r.traffic.iter().map(|t| t.bytes_received).sum::<u64>()
    );
    // About 25.5 M parameters (4 bytes each, at full size) a step each way per worker.
    let per_step = pushed as f64 / 64.0 / 2.0;
    assert!(
        (per_step / (profile.param_count() as f64 * 4.0) - 1.0).abs() < 0.02,
        "{per_step}"
    );
    assert!(r.server_utilisation.iter().all(|&u| u > 0.0 && u <= 1.0));
}

#[test]
fn bad_configs_are_errors() {
    let profile = model(&[(10, 1, 1)]);
    let c = SimConfig::new(StrategyKind::Ps, 1, 0);
    assert!(simulate(&profile, &c)
        .unwrap_err()
        .to_string()
        .contains("server"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Lean polling (servers offered only their frontier links, endpoints polled only after
    /// what can produce a frame) gives exactly the report of polling every link after every
    /// event, as the runtime does (and the frontier invariant holds on every frame).
    #[test]
    fn lean_polling_equals_exhaustive_polling(
        workers in 1usize..9,
        servers in 1usize..4,
        sizes in prop::collection::vec(0usize..30_000, 1..6),
        strategy in prop::sample::select(StrategyKind::ALL.to_vec()),
        scheduler in prop::sample::select(SchedulerKind::ALL.to_vec()),
        ingress: bool,
        window in 1usize..100_000,
        jitter in 0.0f64..0.3,
        seed: u64,
    ) {
        let servers = if strategy.uses_servers() { servers } else { 0 };
        // dlcp orders its packets itself and runs only under its default scheduler.
        let scheduler = if strategy.loss_tolerant() { strategy.default_scheduler() } else { scheduler };
        let layers: Vec<(usize, u64, u64)> = sizes.iter().map(|&s| (s, s as u64 * 3, s as u64 * 7)).collect();
        let profile = model(&layers);
        let mut c = config(strategy, workers, servers, 2.0 * GBIT, 3_000);
        (c.sync.scheduler, c.network.ingress, c.network.buffer_bytes) = (scheduler, ingress, window);
        (c.jitter, c.seed, c.steps, c.sync.slice_params, c.sync.credit_bytes) = (jitter, seed, 3, 4_000, 20_000);
        c.sync.bucket_bytes = 40_000;
        let full = Sim::new(&profile, &c, Polling::Exhaustive).and_then(Sim::run);
        let lean = Sim::new(&profile, &c, Polling::Lean).and_then(Sim::run);
        match (full, lean) {
            (Ok(full), Ok(lean)) => prop_assert_eq!(full, lean),
            (full, lean) => prop_assert!(false, "{:?} / {:?}", full.err(), lean.err()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Under loss, where reliable flows' windows hold frames back and fill their sockets,
    /// a server offered only its frontier's links with room (`Frontier::open_candidates`)
    /// still gives the report of offering every link with room.
    #[test]
    fn lean_polling_equals_exhaustive_polling_past_full_sockets(
        workers in 2usize..7,
        strategy in prop::sample::select(vec![StrategyKind::Ps, StrategyKind::P3]),
        loss in 0.02f64..0.15,
        window in 3_000usize..40_000,
        seed: u64,
    ) {
        let profile = model(&[(20_000, 60_000, 140_000), (6_000, 20_000, 40_000)]);
        let mut c = config(strategy, workers, 1, 2.0 * GBIT, 3_000);
        (c.network.ingress, c.network.buffer_bytes, c.network.loss) = (true, window, loss);
        c.network.mtu_bytes = Some(1_500.0);
        (c.seed, c.steps, c.sync.slice_params) = (seed, 3, 2_000);
        let full = Sim::new(&profile, &c, Polling::Exhaustive).and_then(Sim::run);
        let lean = Sim::new(&profile, &c, Polling::Lean).and_then(Sim::run);
        match (full, lean) {
            // Polls in vain arm wake-ups for the full sockets: only the event count differs.
            (Ok(mut full), Ok(lean)) => {
                prop_assert!(full.network.window_held > 0, "no socket ever held a frame");
                full.events = lean.events;
                prop_assert_eq!(full, lean)
            }
            (full, lean) => prop_assert!(false, "{:?} / {:?}", full.err(), lean.err()),
        }
    }
}

/// A straggler (`--slow-worker 2:3`) stretches its own compute threefold, and a synchronous
/// strategy makes every worker wait for it: the step ends between 6 ms (the straggler's
/// extra compute) and 6 ms plus the lossless step's communication later.
#[test]
fn a_straggler_delays_every_synchronous_step_by_its_extra_compute() {
    let profile = model(&[(1 << 10, 1_000_000, 2_000_000)]);
    for (strategy, servers) in [(StrategyKind::Allreduce, 0), (StrategyKind::Ps, 1)] {
        let mut c = config(strategy, 4, servers, 10.0 * GBIT, 1_000);
        c.steps = 1;
        // Both at packet level, where a straggler runs (the symmetric model's serialisation
        // of a server's replies rounds once for all, a nanosecond apart).
        let base = crate::simulate_packet_level(&profile, &c).map(|r| r.step_end_ns[0]);
        let base = base.unwrap_or_else(|e| panic!("{e}"));
        c.stragglers = vec!["2:3".parse().unwrap()];
        let slow = run(&profile, &c).step_end_ns[0];
        let comm = base - 3_000_000;
        assert!(
            slow >= base + 6_000_000 && slow <= base + 6_000_000 + comm,
            "{strategy:?}: base {base} ns, with the straggler {slow} ns"
        );
        c.stragglers = vec!["4:3".parse().unwrap()];
        assert!(simulate(&profile, &c).is_err(), "rank 4 is no worker");
    }
}
/// Wraps a worker's endpoint, adding a timer at each of `deadlines` in turn and recording
/// the virtual time each fired at.
struct TimerProbe {
    inner: Option<Box<dyn syncopate_core::strategy::WorkerSync>>,
    deadlines: Vec<u64>,
    fired: std::rc::Rc<std::cell::RefCell<Vec<u64>>>,
}

mod probe_impl {
    use super::TimerProbe;
    use syncopate_core::strategy::{
        Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync,
    };
    use syncopate_core::wire::Header;

    impl Endpoint for TimerProbe {
        fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
            self.inner
                .as_mut()
                .is_some_and(|e| e.poll_transmit(link, out))
        }
        fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
            self.inner.as_mut()?.poll_transmit_any(links, out)
        }
        fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
            self.inner.as_mut()?.poll_transmit_lent(links, out)
        }
        fn lent_payload(&self, header: &Header) -> &[f32] {
            self.inner.as_ref().map_or(&[], |e| e.lent_payload(header))
        }
        fn handle_sent(&mut self, link: Rank, header: &Header) {
            if let Some(e) = self.inner.as_mut() {
                e.handle_sent(link, header);
            }
        }
        fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
            match self.inner.as_mut() {
                Some(e) => e.recv_slot(link, h),
                None => Ok(&mut []),
            }
        }
        fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
            self.inner
                .as_mut()
                .map_or(Ok(()), |e| e.handle_payload(link, h))
        }
        fn poll_timeout(&self) -> Option<u64> {
            self.deadlines.get(self.fired.borrow().len()).copied()
        }
        fn handle_timeout(&mut self, now_ns: u64) {
            if self.poll_timeout().is_some_and(|at| at <= now_ns) {
                self.fired.borrow_mut().push(now_ns);
            }
        }
    }

    impl WorkerSync for TimerProbe {
        fn start_at(&mut self, step: u64) {
            if let Some(e) = self.inner.as_mut() {
                e.start_at(step);
            }
        }
        fn begin_step(&mut self, step: u64) {
            if let Some(e) = self.inner.as_mut() {
                e.begin_step(step);
            }
        }
        fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
            if let Some(e) = self.inner.as_mut() {
                e.handle_gradient(key, grad);
            }
        }
        fn handle_backward_done(&mut self) {
            if let Some(e) = self.inner.as_mut() {
                e.handle_backward_done();
            }
        }
        fn poll_event(&mut self) -> Option<WorkerEvent> {
            self.inner.as_mut()?.poll_event()
        }
        fn take_values(&mut self, key: usize) -> Vec<f32> {
            self.inner
                .as_mut()
                .map_or_else(Vec::new, |e| e.take_values(key))
        }
    }
}

/// An endpoint's timer fires at exactly the virtual time it asked for (one of them after the
/// last step), once each, and a timer that does nothing leaves the run unchanged.
#[test]
fn endpoint_timers_fire_at_their_virtual_time() {
    let profile = model(&[(1 << 20, 100_000, 200_000), (1 << 18, 50_000, 80_000)]);
    let mut c = config(StrategyKind::Allreduce, 2, 0, GBIT, 10_000);
    c.steps = 3;
    let plain = run(&profile, &c);
    let end = *plain.step_end_ns.last().unwrap();
    let mut deadlines = vec![1_000_000, 2_500_000, 2_500_001, end / 2, end + 7];
    deadlines.sort_unstable();
    let fired = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let mut sim = Sim::new(&profile, &c, Polling::Lean).unwrap();
    let slot = sim.worker_mut(1).unwrap();
    let placeholder: Box<dyn syncopate_core::strategy::WorkerSync> = Box::new(TimerProbe {
        inner: None,
        deadlines: Vec::new(),
        fired: fired.clone(),
    });
    let inner = std::mem::replace(slot, placeholder);
    *slot = Box::new(TimerProbe {
        inner: Some(inner),
        deadlines: deadlines.clone(),
        fired: fired.clone(),
    });
    let timed = sim.run().unwrap();
    assert_eq!(*fired.borrow(), deadlines);
    assert_eq!(timed.step_end_ns, plain.step_end_ns);
    assert_eq!(timed.frames, plain.frames);
}

/// The chain strategies run in the simulator on the same core: ring reduce moves about
/// twice the model per worker (the sum along the chain, the average back), step-wise
/// averaging about once (the running sum only), and a fixed head never receives.
#[test]
fn chain_strategies_move_their_textbook_bytes() {
    let layers: Vec<(usize, u64, u64)> = (0..6).map(|_| (200_000, 100_000, 200_000)).collect();
    let profile = model(&layers);
    let model_bytes = 6.0 * 200_000.0 * 4.0;
    let n = 8;
    let sent = |strategy, head| {
        let mut c = config(strategy, n, 0, 10.0 * GBIT, 5_000);
        c.steps = 4;
        if strategy == StrategyKind::Stepwise {
            c.sync.stepwise_head = head;
        }
        let r = run(&profile, &c);
        assert_eq!(r.step_seconds.len(), 4);
        let per_worker: Vec<f64> = r.traffic[..n]
            .iter()
            .map(|t| t.bytes_sent as f64 / 4.0 / model_bytes)
            .collect();
        (r, per_worker)
    };
    use syncopate_core::strategy::StepwiseHead::{Fixed, Rotate};
    let (_, ring) = sent(StrategyKind::RingReduce, Rotate);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ring_mean = mean(&ring);
    assert!((ring_mean - 2.0 * 7.0 / 8.0).abs() < 0.05, "{ring:?}");
    let (rotate_report, rotate) = sent(StrategyKind::Stepwise, Rotate);
    assert!((mean(&rotate) - 7.0 / 8.0).abs() < 0.05, "{rotate:?}");
    let (_, fixed) = sent(StrategyKind::Stepwise, Fixed);
    // Worker 7 is the last of a chain headed by worker 0: it forwards nothing.
    assert!(fixed[n - 1] < 0.01 && fixed[0] > 0.95, "{fixed:?}");
    let (allreduce_report, _) = sent(StrategyKind::Allreduce, Rotate);
    assert!(rotate_report.mean_step_seconds <= allreduce_report.mean_step_seconds * 1.01);
}
