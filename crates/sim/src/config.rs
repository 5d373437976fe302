//! What to simulate: strategy, cluster, network, scale-down and trace window.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use syncopate_core::net::{round_to_u64, NetworkProfile};
use syncopate_core::sched::SchedulerKind;
use syncopate_core::step::Straggler;
use syncopate_core::wire::HEADER_LEN;

use crate::faults::FaultConfig;
use crate::SimError;

use syncopate_core::strategy::{scale_count, DlcpOptions, StepwiseHead, StrategyKind, SyncPlan};

/// Everything a simulation depends on (recorded in its report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Strategy.
    pub strategy: StrategyKind,
    /// Scheduler of every endpoint.
    pub scheduler: SchedulerKind,
    /// Bytes a worker may have pushed and not yet had answered (credit scheduler, full size).
    pub credit_bytes: usize,
    /// Workers (ranks `0..workers`).
    pub workers: usize,
    /// Parameter servers (ranks `workers..workers + servers`); 0 for all-reduce.
    pub servers: usize,
    /// Every host's network: bandwidth, latency, send window (`buffer_bytes`), the
    /// receiver's downlink (`ingress`), queues, loss, paths, retransmission timeout.
    pub network: NetworkProfile,
    /// Scale-down of the state machines' buffers, in `(0, 1]`; the wire is charged full size.
    pub scale: f64,
    /// Parameter-server slice size in full-size parameters (`None`: the strategy's default).
    pub slice_params: Option<usize>,
    /// All-reduce bucket capacity in full-size bytes.
    pub bucket_bytes: usize,
    /// Steps to simulate.
    pub steps: u64,
    /// Samples per step on each worker (for the throughput).
    pub batch: usize,
    /// Compute jitter: every layer time is multiplied by a uniform factor in `1 ± jitter`.
    pub jitter: f64,
    /// Seed of the jitter.
    pub seed: u64,
    /// Workers whose compute takes longer (`--slow-worker RANK:FACTOR`).
    #[serde(default)]
    pub stragglers: Vec<Straggler>,
    /// Steps whose compute and frames are recorded as trace events.
    pub trace_steps: Option<Range<u64>>,
    /// Where step-wise averaging's chain starts each step.
    #[serde(default)]
    pub stepwise_head: StepwiseHead,
    /// Step-wise averaging: an exact average every this many steps (0: never).
    #[serde(default)]
    pub full_sync_every: u64,
    /// DLCP's settings (`--strategy dlcp` only), at full size.
    #[serde(default)]
    pub dlcp: DlcpOptions,
    /// Search the credit online (`--autotune`, credit scheduler only).
    #[serde(default)]
    pub autotune: bool,
    /// Seeded faults (all off by default); with any on, every process runs the liveness
    /// rules and the report says how each ended.
    #[serde(default)]
    pub faults: FaultConfig,
    /// Link the all-reduce workers in a full mesh and send small buckets straight to every
    /// worker (`SyncPlan::mesh`; 3 to 8 workers, ring all-reduce only).
    #[serde(default)]
    pub mesh: bool,
}

impl SimConfig {
    /// The runtime's defaults for `strategy` on `workers` workers and `servers` servers:
    /// 10 Gbit/s links without latency and a 256 KiB window, full scale, 10 steps of 128.
    pub fn new(strategy: StrategyKind, workers: usize, servers: usize) -> Self {
        let plan = SyncPlan::new(strategy, workers, servers);
        Self {
            strategy,
            scheduler: plan.scheduler,
            credit_bytes: plan.credit_bytes,
            workers,
            servers,
            network: NetworkProfile {
                bandwidth_bps: Some(10e9),
                ..NetworkProfile::default()
            },
            scale: 1.0,
            slice_params: None,
            bucket_bytes: plan.bucket_bytes,
            steps: 10,
            batch: 128,
            jitter: 0.0,
            seed: 0,
            stragglers: Vec::new(),
            trace_steps: None,
            stepwise_head: plan.stepwise_head,
            full_sync_every: plan.full_sync_every,
            dlcp: plan.dlcp,
            autotune: plan.autotune,
            faults: FaultConfig::default(),
            mesh: plan.mesh,
        }
    }

    /// Checks the configuration against the strategy.
    pub fn validate(&self) -> Result<(), SimError> {
        let fail = |why: String| Err(SimError::Config(why));
        if let Err(e) = self.plan().validate() {
            return fail(e.to_string());
        }
        if !(self.scale > 0.0 && self.scale <= 1.0) {
            return fail(format!("scale {} is not in (0, 1]", self.scale));
        }
        if let Err(e) = Straggler::check(&self.stragglers, self.workers) {
            return fail(e.to_string());
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return fail(format!("jitter {} is not in [0, 1)", self.jitter));
        }
        if let Err(e) = self.network.validate() {
            return fail(e.to_string());
        }
        if self.batch == 0 {
            return fail("batch must be positive".into());
        }
        if self.steps == 0 {
            return fail("at least one step is needed".into());
        }
        self.faults.validate().map_err(SimError::Config)?;
        Ok(())
    }

    /// What a full-size count of `n` elements (or bytes) becomes at this scale: rounded up,
    /// at least 1 unless `n` is 0.
    pub fn scaled(&self, n: usize) -> usize {
        scale_count(n, self.scale)
    }

    /// The synchronisation plan the state machines are built from, at this scale.
    pub fn plan(&self) -> SyncPlan {
        let full = SyncPlan::new(self.strategy, self.workers, self.servers);
        SyncPlan {
            scheduler: self.scheduler,
            slice_params: self.slice_params.unwrap_or(full.slice_params),
            bucket_bytes: self.bucket_bytes,
            credit_bytes: self.credit_bytes,
            stepwise_head: self.stepwise_head,
            full_sync_every: self.full_sync_every,
            dlcp: self.dlcp,
            autotune: self.autotune,
            mesh: self.mesh,
            ..full
        }
        .scaled(self.scale)
    }

    /// Bytes the network charges for a frame carrying `elems` scaled values: the header plus
    /// the full-size payload, `48 + elems * 4 / scale`.
    pub fn wire_bytes(&self, elems: usize) -> usize {
        HEADER_LEN + round_to_u64(elems as f64 * 4.0 / self.scale) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_core::strategy::FRAME_ELEMS;

    #[test]
    fn scaling_rounds_up_and_the_wire_charges_full_size() {
        let mut c = SimConfig::new(StrategyKind::P3, 2, 1);
        c.scale = 1.0 / 16.0;
        assert_eq!(c.scaled(0), 0);
        assert_eq!(c.scaled(1), 1);
        assert_eq!(c.scaled(33), 3);
        assert_eq!(c.plan().slice_params, 2_500);
        assert_eq!(c.wire_bytes(2_500), 48 + 160_000);
        c.slice_params = Some(10 << 20);
        assert_eq!(
            c.plan().slice_params,
            FRAME_ELEMS / 16,
            "slices are clamped to a frame"
        );
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = |f: fn(&mut SimConfig)| {
            let mut c = SimConfig::new(StrategyKind::Ps, 2, 1);
            f(&mut c);
            c.validate().map_err(|e| e.to_string()).unwrap_err()
        };
        assert!(bad(|c| c.servers = 0).contains("server"));
        assert!(bad(|c| c.strategy = StrategyKind::Allreduce).contains("no server"));
        assert!(bad(|c| c.scale = 0.0).contains("scale"));
        assert!(bad(|c| c.jitter = 1.5).contains("jitter"));
        assert!(bad(|c| c.workers = 0).contains("worker"));
        assert!(bad(|c| c.network.loss = 2.0).contains("--loss"));
        assert!(bad(|c| c.network.buffer_bytes = 0).contains("buffer_bytes"));
        assert!(SimConfig::new(StrategyKind::Allreduce, 3, 0)
            .validate()
            .is_ok());
    }
}
