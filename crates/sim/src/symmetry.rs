//! Which model a simulation runs: every worker and every frame (packet level), or one
//! worker standing for all of them (symmetric), where that is exact enough.
//!
//! When every worker replays the same profile with no jitter, no straggler and no fault,
//! over a lossless network with one path and no trace asked for, all workers do the same
//! thing at the same time: a ring's workers send one another the same frames shifted by
//! one chunk, and a parameter server's workers push the same slices at once and get the
//! same replies. One worker then stands for all of them, driven by the same state machines:
//!
//! - **ring all-reduce**: the one worker of a ring of N runs as rank 0; every frame it sends
//!   its right neighbour comes back to it as the frame its left neighbour sends at that
//!   moment (the core's [`RingAllReduce::from_left`]). Frames and events per step fall from
//!   `N * 2(N-1)` segments to `2(N-1)`, memory from N workers to one.
//! - **parameter servers** (ps, p3): one worker and every server; a server's frame stands
//!   for its N replies to N workers, so its port serialises N times its bytes (the last
//!   worker's copy is the one that arrives), and a push reaching a server's ingress stands
//!   for N pushes converging on it. Step times are those of the last worker to be
//!   answered, which paces the next step's aggregation.
//!
//! Everything else (loss, finite queues, incast drops, stragglers, jitter, faults,
//! loss-tolerant strategies) runs at packet level. `tests.rs` checks both models' step
//! times against each other where both run.

use syncopate_core::net::NetCounters;
use syncopate_core::profile::ModelProfile;
use syncopate_core::strategy::{RingAllReduce, StrategyKind};

use crate::build::model_keys;
use crate::report::HostTraffic;
use crate::{SimConfig, SimReport};

/// Which model ran, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    /// One worker stands for all (see the module's documentation).
    pub symmetric: bool,
    /// Hosts simulated: workers and servers (one worker on the symmetric model).
    pub hosts: usize,
    /// One line saying which model and why, as the report and `simulate` show it.
    pub why: String,
}

/// Why the symmetric model cannot stand for `cfg` before its layout is looked at; `None`
/// when it may.
fn refusal(cfg: &SimConfig) -> Option<String> {
    let ring = matches!(
        cfg.strategy,
        StrategyKind::Allreduce | StrategyKind::AllreduceNoOverlap
    );
    let servers = matches!(
        cfg.strategy,
        StrategyKind::Ps | StrategyKind::PsNoOverlap | StrategyKind::P3
    );
    let why = if !ring && !servers {
        format!("{} has no symmetric model", cfg.strategy.name())
    } else if cfg.workers < if ring { 5 } else { 2 } {
        "too few workers to need it".into()
    } else if cfg.network.is_lossy() {
        "the network can lose or drop frames".into()
    } else if cfg.network.paths > 1 {
        "several paths".into()
    } else if cfg.servers > 0 && cfg.network.worker_bandwidth_bps.is_some() {
        "the workers' NICs differ from the servers'".into()
    } else if cfg.jitter > 0.0 || !cfg.stragglers.is_empty() {
        "workers differ (jitter or stragglers)".into()
    } else if cfg.faults.enabled() {
        "faults are on".into()
    } else if cfg.trace_steps.is_some() {
        "a trace of every host is asked for".into()
    } else if cfg.sync.mesh || cfg.sync.autotune || cfg.scheduler.uses_credit() {
        "mesh, credit or autotune (a worker's window depends on its own replies)".into()
    } else {
        return None;
    };
    Some(why)
}

/// What the engine needs to let one worker stand for all.
pub(crate) struct Mirror {
    /// The workers the simulated one stands for.
    pub workers: usize,
    /// Ring all-reduce: the representative's ring, which mirrors its frames (`None`:
    /// parameter servers).
    pub ring: Option<RingAllReduce>,
}

/// The representative's ring when `cfg` is a ring the symmetric model can stand for.
pub(crate) fn mirror_ring(profile: &ModelProfile, cfg: &SimConfig) -> Option<RingAllReduce> {
    let (keys, _) = model_keys(profile, cfg);
    let plan = cfg.plan();
    let ring = plan.endpoints(keys).ring(0);
    ring.shift_symmetric().then_some(ring)
}

/// Which model [`crate::simulate`] runs for `cfg` on `profile`, and why.
pub fn model_choice(profile: &ModelProfile, cfg: &SimConfig) -> ModelChoice {
    let all = cfg.workers + cfg.servers;
    let packet = |why: String| ModelChoice {
        symmetric: false,
        hosts: all,
        why: format!(
            "packet-level model: every worker and every frame ({why}){}",
            if cfg.whole_slices() {
                "; dlcp: shares the bound needs whole travel a slice a packet (--packet-level: \
                 every packet)"
            } else {
                ""
            }
        ),
    };
    if let Some(why) = refusal(cfg) {
        return packet(why);
    }
    if !cfg.strategy.uses_servers() && mirror_ring(profile, cfg).is_none() {
        return packet("the ring's chunks are cut unevenly at this scale".into());
    }
    ModelChoice {
        symmetric: true,
        hosts: 1 + cfg.servers,
        why: format!(
            "symmetric model: one worker stands for {} alike workers (lossless single-path \
             network, no jitter, stragglers or faults)",
            cfg.workers
        ),
    }
}

/// The configuration the symmetric model simulates: one worker (the servers unchanged).
pub(crate) fn reduced(cfg: &SimConfig) -> SimConfig {
    let mut one = cfg.clone();
    one.sync.workers = 1;
    one
}

/// The report of `full` from the symmetric model's report `one`: every worker's figures are
/// the representative's, the counts of frames and worker traffic N times its own.
pub(crate) fn expand(mut one: SimReport, full: &SimConfig, why: String) -> SimReport {
    let n = full.workers;
    let repeat = |v: &[f64]| -> Vec<f64> { v.first().map(|&u| vec![u; n]).unwrap_or_default() };
    let worker = one.traffic.first().copied().unwrap_or_default();
    let traffic: Vec<HostTraffic> = std::iter::repeat_n(worker, n)
        .chain(one.traffic.iter().skip(1).copied())
        .collect();
    one.worker_utilisation = repeat(&one.worker_utilisation);
    one.traffic = traffic;
    one.frames = one.frames.saturating_mul(n as u64);
    one.tensor_completion.count = one.tensor_completion.count.saturating_mul(n as u64);
    one.samples_per_sec *= n as f64;
    one.config = full.clone();
    one.model_path = why;
    one
}

/// `c`'s counts `k` times over (its maximum unchanged).
pub(crate) fn times(c: &NetCounters, k: u64) -> NetCounters {
    NetCounters {
        frames_sent: c.frames_sent.saturating_mul(k),
        bytes_sent: c.bytes_sent.saturating_mul(k),
        queueing_ns_total: c.queueing_ns_total.saturating_mul(k),
        frames_lost: c.frames_lost.saturating_mul(k),
        bytes_lost: c.bytes_lost.saturating_mul(k),
        frames_retransmitted: c.frames_retransmitted.saturating_mul(k),
        bytes_retransmitted: c.bytes_retransmitted.saturating_mul(k),
        frames_dropped: c.frames_dropped.saturating_mul(k),
        bytes_dropped: c.bytes_dropped.saturating_mul(k),
        ..*c
    }
}
