//! One job's synchronisation settings and the one factory of its endpoints: the runtime's
//! processes, `bench-comm` and the simulator all build their worker and server state
//! machines from a [`SyncPlan`], so a strategy's parameters are chosen in one place.

use serde::{Deserialize, Serialize};

use super::dlcp::Geometry;
use super::kind::{CHAIN_SEGMENT_ELEMS, DIRECT_SHARE_ELEMS, FRAME_ELEMS};
use super::{
    ChainPass, ChainSchedule, DlcpOptions, DlcpRing, DlcpServer, DlcpWorker, Gossip, OuterNesterov,
    OuterOptions, Periodic, PsServer, PsWorker, Rank, RingAllReduce, ServerOptim, ServerSync,
    StepwiseHead, StrategyKind, WorkerSync,
};
use crate::registry::{KeyInfo, TensorRegistry};
use crate::scale::scale_count;
use crate::sched::SchedulerKind;
use crate::tune::TuneSpec;

/// A plan that cannot run, or a rank that has no such role in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No worker at all.
    #[error("a job needs at least one worker")]
    NoWorkers,
    /// A parameter-server strategy without servers.
    #[error("strategy {0} needs at least one server")]
    NoServers(&'static str),
    /// Servers asked for a strategy that has none.
    #[error("strategy {0} uses no server; set servers to 0")]
    UnusedServers(&'static str),
    /// A size that must be positive is 0.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// A server endpoint asked for a rank that is not a server's.
    #[error("rank {rank} is not a server rank (servers are ranks {workers}..{world})")]
    NotAServer {
        /// The rank asked for.
        rank: Rank,
        /// Workers, the first server rank.
        workers: usize,
        /// Processes in the job, one past the last server rank.
        world: usize,
    },
    /// A setting (the plan's field) given to a strategy it does not apply to.
    #[error("{setting} applies to {applies_to} only (this job runs {strategy})")]
    NotApplicable {
        /// The plan's field.
        setting: &'static str,
        /// The strategies it applies to.
        applies_to: &'static str,
        /// The job's strategy.
        strategy: &'static str,
    },
    /// DiLoCo's outer optimizer settings out of range.
    #[error("{0}")]
    Outer(String),
    /// A DLCP setting given to another strategy.
    #[error("the DLCP settings (loss bound, packet size, loss fill, pull loss bound, priority, drop quantile, spraying) apply to the dlcp and dlcp-allreduce strategies only (this job runs {0})")]
    DlcpOnly(&'static str),
    /// A DLCP setting out of range.
    #[error("{0}")]
    Dlcp(String),
    /// `--autotune` without a scheduler that has anything to tune.
    #[error("--autotune searches the credit of --scheduler credit; this job's scheduler is {0}")]
    AutotuneNeedsCredit(&'static str),
}

/// How a job synchronises: the strategy, the scheduler, the processes and every size the
/// state machines are built with. [`SyncPlan::new`] gives the strategy's defaults;
/// [`SyncPlan::scaled`] the same plan for a scaled-down model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncPlan {
    /// Strategy.
    pub strategy: StrategyKind,
    /// Scheduler of every link.
    pub scheduler: SchedulerKind,
    /// Workers (ranks `0..workers`).
    pub workers: usize,
    /// Parameter servers (ranks `workers..workers + servers`).
    pub servers: usize,
    /// Parameter-server slice size in parameters (never more than a frame).
    pub slice_params: usize,
    /// All-reduce bucket capacity in bytes.
    pub bucket_bytes: usize,
    /// Bytes a worker may have pushed and not yet had answered under the credit scheduler.
    pub credit_bytes: usize,
    /// Largest frame payload in elements: ring segments and parameter-server slices.
    pub frame_elems: usize,
    /// Ring buckets whose copies hold at most this many values together are shared whole
    /// (see [`DIRECT_SHARE_ELEMS`]).
    pub direct_share_elems: usize,
    /// Largest frame payload in elements on the chain strategies (see [`CHAIN_SEGMENT_ELEMS`]).
    #[serde(default = "default_chain_segment")]
    pub chain_segment_elems: usize,
    /// Where step-wise averaging's chain starts each step.
    #[serde(default)]
    pub stepwise_head: StepwiseHead,
    /// Step-wise averaging and gossip: every this many steps an exact average instead (0:
    /// never; with a period, counted in step-wise averaging's chain passes).
    #[serde(default)]
    pub full_sync_every: u64,
    /// Local SGD, DiLoCo and step-wise averaging: steps from one averaging to the next
    /// (the sync step is every H-th; 1: every step). 0 for the strategies it does not apply
    /// to.
    #[serde(default)]
    pub average_every: u64,
    /// DiLoCo's outer optimizer.
    #[serde(default)]
    pub outer: OuterOptions,
    /// DLCP's settings (`--strategy dlcp` only).
    #[serde(default)]
    pub dlcp: DlcpOptions,
    /// Search the credit online from `credit_bytes` on (`--autotune`, credit scheduler only).
    #[serde(default)]
    pub autotune: bool,
    /// Link every worker to every other and send small buckets' copies straight to each
    /// (`--mesh`; ring all-reduce with 3 to [`super::MESH_MAX_WORKERS`] workers only, see
    /// [`StrategyKind::can_mesh`]; ignored elsewhere). Off by default: one hop instead of
    /// n-1 pays where hops cost network latency, but over loopback on a few cores each copy
    /// then takes its own send and receive call, which costs more than the hops it saves
    /// (docs/BENCHMARKS.md).
    #[serde(default)]
    pub mesh: bool,
}

fn default_chain_segment() -> usize {
    CHAIN_SEGMENT_ELEMS
}

impl SyncPlan {
    /// `strategy` on `workers` workers and `servers` servers with the strategy's defaults.
    pub fn new(strategy: StrategyKind, workers: usize, servers: usize) -> Self {
        Self {
            strategy,
            scheduler: strategy.default_scheduler(),
            workers,
            servers,
            slice_params: strategy.default_slice_params(),
            bucket_bytes: strategy.default_bucket_bytes(),
            credit_bytes: strategy.default_credit_bytes(),
            frame_elems: FRAME_ELEMS,
            direct_share_elems: DIRECT_SHARE_ELEMS,
            chain_segment_elems: CHAIN_SEGMENT_ELEMS,
            stepwise_head: StepwiseHead::default(),
            full_sync_every: 0,
            average_every: strategy.info().average_every,
            outer: OuterOptions::default(),
            dlcp: DlcpOptions::default(),
            autotune: false,
            mesh: false,
        }
    }

    /// The plan for a model whose tensors are scaled by `factor`: every size (slices, at
    /// most a frame, buckets, credit, frames, the direct-share bound) scaled alike, so the
    /// scaled job cuts its messages as the full-size one does.
    pub fn scaled(self, factor: f64) -> Self {
        Self {
            slice_params: scale_count(self.frame_slice_params(), factor),
            bucket_bytes: scale_count(self.bucket_bytes, factor),
            credit_bytes: scale_count(self.credit_bytes, factor),
            frame_elems: scale_count(self.frame_elems, factor),
            direct_share_elems: scale_count(self.direct_share_elems, factor),
            chain_segment_elems: scale_count(self.chain_segment_elems, factor),
            dlcp: if self.strategy.loss_tolerant() {
                DlcpOptions {
                    packet_elems: scale_count(self.dlcp.packet_elems, factor),
                    ..self.dlcp
                }
            } else {
                self.dlcp
            },
            ..self
        }
    }

    /// Checks the processes and sizes against the strategy.
    pub fn validate(&self) -> Result<(), PlanError> {
        let name = self.strategy.name();
        if self.workers == 0 {
            return Err(PlanError::NoWorkers);
        }
        if self.strategy.uses_servers() && self.servers == 0 {
            return Err(PlanError::NoServers(name));
        }
        if !self.strategy.uses_servers() && self.servers > 0 {
            return Err(PlanError::UnusedServers(name));
        }
        let sizes = [
            (self.slice_params, "slice_params"),
            (self.bucket_bytes, "bucket_bytes"),
            (self.frame_elems, "frame_elems"),
            (self.chain_segment_elems, "chain_segment_elems"),
        ];
        if let Some((_, what)) = sizes.iter().find(|(n, _)| *n == 0) {
            return Err(PlanError::Zero(what));
        }
        if self.scheduler.uses_credit() && self.credit_bytes == 0 {
            return Err(PlanError::Zero("credit_bytes"));
        }
        if self.strategy.loss_tolerant() {
            self.dlcp
                .validate(self.frame_elems)
                .map_err(PlanError::Dlcp)?;
            if self.scheduler != SchedulerKind::Priority {
                return Err(PlanError::Dlcp(format!(
                    "--scheduler {}: {name} always sends the most urgent layer's packets first \
                     (leave the scheduler at its default, priority)",
                    self.scheduler.name()
                )));
            }
            self.validate_dlcp_variant()?;
        } else if self.dlcp != DlcpOptions::default() {
            return Err(PlanError::DlcpOnly(name));
        }
        if self.autotune && !self.scheduler.uses_credit() {
            return Err(PlanError::AutotuneNeedsCredit(self.scheduler.name()));
        }
        self.validate_averaging()
    }

    /// The settings of the averaging strategies: each only where it applies.
    fn validate_averaging(&self) -> Result<(), PlanError> {
        let info = self.strategy.info();
        let not_applicable = |setting, applies_to| PlanError::NotApplicable {
            setting,
            applies_to,
            strategy: info.name,
        };
        if !info.stepwise_settings && self.stepwise_head != StepwiseHead::default() {
            return Err(not_applicable("stepwise_head", "stepwise"));
        }
        if !info.full_syncs && self.full_sync_every > 0 {
            return Err(not_applicable("full_sync_every", "stepwise and gossip"));
        }
        let periodic = "local-sgd, diloco and stepwise";
        match (info.average_every > 0, self.average_every) {
            (true, 0) => return Err(PlanError::Zero("average_every")),
            (false, 1..) => return Err(not_applicable("average_every", periodic)),
            _ => {}
        }
        if !info.outer_optimizer && self.outer != OuterOptions::default() {
            return Err(not_applicable("outer_lr and outer_momentum", "diloco"));
        }
        self.outer.validate().map_err(PlanError::Outer)
    }

    /// What one DLCP strategy supports and the other does not.
    fn validate_dlcp_variant(&self) -> Result<(), PlanError> {
        if self.strategy == StrategyKind::DlcpAllreduce
            && self.dlcp.fill == super::LossFill::Rescale
        {
            return Err(PlanError::Dlcp(
                "--loss-fill rescale: a ring's partial sums carry no count of their \
                 contributors, so dlcp-allreduce fills lost values with zero only"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Total processes.
    pub fn world_size(&self) -> usize {
        self.workers + self.servers
    }

    /// The NIC of process `rank` on `network`: a worker of a job with servers has the
    /// workers' NIC ([`NetworkProfile::worker_nic`]), every other process the profile's.
    pub fn nic_profile(
        &self,
        rank: Rank,
        network: &crate::net::NetworkProfile,
    ) -> crate::net::NetworkProfile {
        if self.servers > 0 && rank < self.workers {
            network.worker_nic()
        } else {
            network.clone()
        }
    }

    /// `rank 2 (server 0)`, `rank 1 (worker 1)`.
    pub fn describe(&self, rank: Rank) -> String {
        if rank < self.workers {
            format!("rank {rank} (worker {rank})")
        } else {
            format!("rank {rank} (server {})", rank - self.workers)
        }
    }

    /// The ranks `rank` needs a link to.
    pub fn peers(&self, rank: Rank) -> Vec<Rank> {
        if self.meshed() {
            return (0..self.workers).filter(|&r| r != rank).collect();
        }
        self.strategy.peers(self.workers, self.servers, rank)
    }

    /// Whether the workers are linked in a full mesh: asked for ([`SyncPlan::mesh`]) and
    /// possible ([`StrategyKind::can_mesh`]).
    pub fn meshed(&self) -> bool {
        self.mesh && self.strategy.can_mesh(self.workers)
    }

    /// What every process must agree on besides the model, for the handshake:
    /// `p3/priority/slice=40000`.
    pub fn sync_descriptor(&self) -> String {
        let mut d = format!("{}/{}", self.strategy.name(), self.scheduler.name());
        if self.strategy.uses_servers() {
            d.push_str(&format!("/slice={}", self.slice_params));
        } else {
            d.push_str(&format!("/bucket={}", self.bucket_bytes));
        }
        if self.strategy.chain() {
            d.push_str(&format!("/segment={}", self.chain_segment_elems));
        }
        let info = self.strategy.info();
        if info.stepwise_settings {
            d.push_str(&format!("/head={}", self.stepwise_head.name()));
        }
        if info.full_syncs {
            d.push_str(&format!("/full-sync={}", self.full_sync_every));
        }
        if info.average_every > 0 {
            d.push_str(&format!("/every={}", self.average_every));
        }
        if info.outer_optimizer {
            let OuterOptions { lr, momentum } = self.outer;
            d.push_str(&format!("/outer-lr={lr}/outer-momentum={momentum}"));
        }
        if self.strategy.loss_tolerant() {
            d.push_str(&self.dlcp.descriptor());
        }
        if self.scheduler.uses_credit() {
            d.push_str(&format!("/credit={}", self.credit_bytes));
        }
        if self.autotune {
            d.push_str("/autotune");
        }
        if self.meshed() {
            d.push_str("/mesh");
        }
        d
    }

    /// The online search a worker of this plan runs over a model with these keys (`None`
    /// without `--autotune`): the credit from one slice to the whole model, starting at
    /// `credit_bytes`.
    pub fn tune_spec(&self, keys: &[KeyInfo]) -> Option<TuneSpec> {
        let slice_bytes = self.frame_slice_params().saturating_mul(4);
        let model_bytes = keys.iter().map(|k| k.numel.saturating_mul(4)).sum();
        self.autotune
            .then(|| TuneSpec::credit(self.credit_bytes, slice_bytes, model_bytes))
    }

    /// The parameter-server registry of a model with these keys: slices of `slice_params`
    /// (at most a frame), placed as the strategy places them.
    pub fn registry(&self, keys: Vec<KeyInfo>) -> TensorRegistry {
        let slice = self.frame_slice_params().max(1);
        TensorRegistry::new(keys, slice, self.servers, self.strategy.placement())
    }

    /// The slice size in parameters as the endpoints cut slices: `slice_params`, at most a
    /// frame (the one place that cap is applied).
    pub fn frame_slice_params(&self) -> usize {
        self.slice_params.min(self.frame_elems)
    }

    /// All-reduce bucket capacity in values.
    pub fn bucket_elems(&self) -> usize {
        (self.bucket_bytes / 4).max(1)
    }

    /// Who averages with whom on a chain strategy (`None` for the others).
    pub fn chain_schedule(&self) -> Option<ChainSchedule> {
        match self.strategy {
            StrategyKind::RingReduce => Some(self.ring_reduce_schedule()),
            StrategyKind::Stepwise => Some(self.stepwise_schedule()),
            StrategyKind::Ps
            | StrategyKind::PsNoOverlap
            | StrategyKind::Allreduce
            | StrategyKind::AllreduceNoOverlap
            | StrategyKind::P3
            | StrategyKind::Dlcp
            | StrategyKind::DlcpAllreduce
            | StrategyKind::LocalSgd
            | StrategyKind::Diloco
            | StrategyKind::Gossip => None,
        }
    }

    /// Steps from one synchronisation to the next: [`SyncPlan::average_every`] where it
    /// applies, 1 for the strategies that synchronise every step.
    pub fn sync_period(&self) -> u64 {
        self.average_every.max(1)
    }

    /// The textbook bytes a worker sends per step for a model of `model_bytes`
    /// ([`super::textbook_bytes_per_step`] of each sync step, spread over the period).
    pub fn textbook_bytes_per_step(&self, model_bytes: f64) -> f64 {
        super::textbook_bytes_per_step(self.strategy, self.workers, model_bytes)
            / self.sync_period() as f64
    }

    fn ring_reduce_schedule(&self) -> ChainSchedule {
        ChainSchedule::RingReduce {
            workers: self.workers,
        }
    }

    fn stepwise_schedule(&self) -> ChainSchedule {
        ChainSchedule::Stepwise {
            workers: self.workers,
            head: self.stepwise_head,
            full_sync_every: self.full_sync_every,
        }
    }

    /// The effective number of contributors of the long-run mixing (see
    /// [`ChainSchedule::effective_contributors`]): the worker count for every strategy that
    /// averages exactly.
    pub fn effective_contributors(&self) -> f64 {
        match self.chain_schedule() {
            Some(schedule) => schedule.effective_contributors(),
            None => self.workers as f64,
        }
    }

    /// What an approximate strategy's averaging amounts to, in words, for start-up banners:
    /// `local-sgd averages weights, not gradients (approximate): an exact average every 8
    /// steps; effective number of contributors 4.00 of 4 workers`.
    pub fn describe_averaging(&self) -> String {
        let (every, full) = (self.sync_period(), self.full_sync_every);
        let exact = |unit: &str| match full {
            0 => "never".to_string(),
            h => format!("every {h} {unit}"),
        };
        let how = match self.strategy {
            StrategyKind::Stepwise => format!(
                "a chain pass every {every} step(s), chain head {}, exact average {}",
                self.stepwise_head.name(),
                exact(if every > 1 { "chain passes" } else { "steps" })
            ),
            StrategyKind::LocalSgd => {
                format!("an exact average of the weights every {every} steps")
            }
            StrategyKind::Diloco => format!(
                "every {every} steps an outer Nesterov step (lr {}, momentum {}) on the mean \
                 change of the weights",
                self.outer.lr, self.outer.momentum
            ),
            StrategyKind::Gossip => format!(
                "each step a mix with both ring neighbours, exact average {}",
                exact("steps")
            ),
            other if other.loss_tolerant() => "lost values are missing from the sums".into(),
            _ => "exact every step".into(),
        };
        format!(
            "{} averages {}, not gradients (approximate): {how}; effective number of \
             contributors {:.2} of {} workers",
            self.strategy.name(),
            match self.strategy.averages() {
                super::Averaged::Weights => "weights",
                super::Averaged::Gradients => "gradients",
            },
            self.effective_contributors(),
            self.workers
        )
    }

    /// The state machine of worker `rank` for a model with these keys.
    pub fn worker_endpoint(&self, rank: Rank, keys: Vec<KeyInfo>) -> Box<dyn WorkerSync + Send> {
        self.endpoints(keys).worker(rank)
    }

    /// The state machine of server `rank` for a model with these keys, starting from the
    /// `initial` values of every key and applying `optim` to the averaged gradients.
    pub fn server_endpoint(
        &self,
        rank: Rank,
        keys: Vec<KeyInfo>,
        initial: Vec<Vec<f32>>,
        optim: ServerOptim,
    ) -> Result<Box<dyn ServerSync + Send>, PlanError> {
        self.endpoints(keys).server(rank, initial, optim)
    }

    /// The factory of every rank's state machine for a model with these keys, the keys cut
    /// and placed once: the endpoints it builds share one registry (a simulator builds a
    /// thousand workers, whose lookups then read one copy of it).
    pub fn endpoints(&self, keys: Vec<KeyInfo>) -> Endpoints<'_> {
        let reg = self.registry(keys.clone());
        let geo =
            (self.strategy == StrategyKind::Dlcp).then(|| Geometry::of(reg.clone(), &self.dlcp));
        Endpoints {
            plan: self,
            keys,
            reg,
            geo,
        }
    }
}

/// Builds the endpoints of one plan for one model (see [`SyncPlan::endpoints`]).
#[derive(Debug, Clone)]
pub struct Endpoints<'a> {
    plan: &'a SyncPlan,
    keys: Vec<KeyInfo>,
    reg: TensorRegistry,
    /// DLCP's packets, cut once for every endpoint.
    geo: Option<Geometry>,
}

impl Endpoints<'_> {
    /// DLCP's packets of this plan's registry.
    fn geometry(&self) -> Geometry {
        (self.geo.clone()).unwrap_or_else(|| Geometry::of(self.reg.clone(), &self.plan.dlcp))
    }

    /// The state machine of worker `rank`: one arm per strategy.
    pub fn worker(&self, rank: Rank) -> Box<dyn WorkerSync + Send> {
        let plan = self.plan;
        match plan.strategy {
            StrategyKind::Ps | StrategyKind::PsNoOverlap | StrategyKind::P3 => {
                Box::new(self.ps_worker(rank, plan.scheduler))
            }
            StrategyKind::Dlcp => {
                // DLCP orders its packets itself: the P3 worker underneath only has to hand
                // over every slice at once.
                let ps = self.ps_worker(rank, SchedulerKind::Fifo);
                Box::new(DlcpWorker::new(
                    ps,
                    self.geometry(),
                    rank,
                    plan.workers,
                    plan.dlcp,
                ))
            }
            StrategyKind::Allreduce | StrategyKind::AllreduceNoOverlap => {
                let ring = self.ring(rank);
                if plan.meshed() {
                    return Box::new(ring.over_mesh());
                }
                Box::new(ring)
            }
            StrategyKind::DlcpAllreduce => {
                let (keys, bucket) = (self.keys.clone(), plan.bucket_elems());
                Box::new(DlcpRing::new(rank, plan.workers, keys, bucket, plan.dlcp))
            }
            StrategyKind::RingReduce => self.chain(rank, plan.ring_reduce_schedule()),
            StrategyKind::Stepwise if plan.sync_period() > 1 => {
                let chain = self.chain(rank, plan.stepwise_schedule());
                Box::new(Periodic::averaging(
                    plan.sync_period(),
                    self.keys.len(),
                    chain,
                ))
            }
            StrategyKind::Stepwise => self.chain(rank, plan.stepwise_schedule()),
            StrategyKind::LocalSgd => {
                let ring = self.exact_ring(rank);
                Box::new(Periodic::averaging(
                    plan.sync_period(),
                    self.keys.len(),
                    ring,
                ))
            }
            StrategyKind::Diloco => {
                let sizes: Vec<usize> = self.keys.iter().map(|k| k.numel).collect();
                let outer = OuterNesterov::new(&sizes, plan.outer);
                let (every, keys) = (plan.sync_period(), self.keys.len());
                Box::new(Periodic::outer(every, keys, self.exact_ring(rank), outer))
            }
            StrategyKind::Gossip => {
                let gossip = Box::new(Gossip::new(
                    rank,
                    plan.workers,
                    self.keys.clone(),
                    plan.frame_elems,
                    plan.scheduler,
                ));
                match plan.full_sync_every {
                    0 => gossip,
                    every => {
                        let ring = self.exact_ring(rank);
                        Box::new(Periodic::alternating(every, self.keys.len(), ring, gossip))
                    }
                }
            }
        }
    }

    /// The ring all-reduce of worker `rank`: the mean of what every worker hands over, over
    /// the ring only.
    pub fn ring(&self, rank: Rank) -> RingAllReduce {
        let plan = self.plan;
        let ring = RingAllReduce::new(
            rank,
            plan.workers,
            self.keys.clone(),
            plan.bucket_elems(),
            plan.frame_elems,
            plan.strategy.overlaps(),
            plan.scheduler,
        );
        ring.with_direct_below(plan.direct_share_elems)
    }

    /// The ring all-reduce that averages exactly what the workers hand over (weights, or
    /// DiLoCo's outer gradients) at the sync steps of the periodic strategies.
    fn exact_ring(&self, rank: Rank) -> Box<dyn WorkerSync + Send> {
        Box::new(self.ring(rank))
    }

    /// The parameter-server worker `rank`, its frames ordered by `scheduler`.
    fn ps_worker(&self, rank: Rank, scheduler: SchedulerKind) -> PsWorker {
        let plan = self.plan;
        let overlap = plan.strategy.overlaps();
        let (reg, credit) = (self.reg.clone(), plan.credit_bytes);
        PsWorker::new(rank, plan.workers, reg, overlap, scheduler, credit)
    }

    /// The chain worker `rank` of `schedule`.
    fn chain(&self, rank: Rank, schedule: ChainSchedule) -> Box<dyn WorkerSync + Send> {
        let plan = self.plan;
        Box::new(ChainPass::new(
            rank,
            schedule,
            self.keys.clone(),
            plan.bucket_elems(),
            plan.chain_segment_elems.min(plan.frame_elems),
            plan.strategy.overlaps(),
            plan.scheduler,
        ))
    }

    /// The state machine of server `rank`, starting from the `initial` values of every key
    /// and applying `optim` to the averaged gradients; one arm per strategy (those without
    /// servers have no server rank).
    pub fn server(
        &self,
        rank: Rank,
        initial: Vec<Vec<f32>>,
        optim: ServerOptim,
    ) -> Result<Box<dyn ServerSync + Send>, PlanError> {
        let plan = self.plan;
        let not_a_server = PlanError::NotAServer {
            rank,
            workers: plan.workers,
            world: plan.world_size(),
        };
        let index = rank
            .checked_sub(plan.workers)
            .filter(|&i| i < plan.servers)
            .ok_or(not_a_server.clone())?;
        let reg = self.reg.clone();
        let ps = |reg| PsServer::new(index, plan.workers, reg, initial, optim, plan.scheduler);
        match plan.strategy {
            StrategyKind::Ps | StrategyKind::PsNoOverlap | StrategyKind::P3 => {
                Ok(Box::new(ps(reg)))
            }
            StrategyKind::Dlcp => {
                let dlcp =
                    DlcpServer::new(ps(reg), self.geometry(), index, plan.workers, plan.dlcp);
                Ok(Box::new(dlcp))
            }
            StrategyKind::Allreduce
            | StrategyKind::AllreduceNoOverlap
            | StrategyKind::DlcpAllreduce
            | StrategyKind::RingReduce
            | StrategyKind::Stepwise
            | StrategyKind::LocalSgd
            | StrategyKind::Diloco
            | StrategyKind::Gossip => Err(not_a_server),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the workers of a job with servers take the workers' NIC.
    #[test]
    fn the_workers_of_a_job_with_servers_take_the_workers_nic() {
        let net = crate::net::NetworkProfile {
            bandwidth_bps: Some(1e8),
            worker_bandwidth_bps: Some(1e10),
            ..crate::net::NetworkProfile::default()
        };
        let bps = |plan: &SyncPlan, rank| plan.nic_profile(rank, &net).bandwidth_bps;
        let p3 = SyncPlan::new(StrategyKind::P3, 2, 1);
        assert_eq!(
            [bps(&p3, 0), bps(&p3, 1), bps(&p3, 2)],
            [Some(1e10), Some(1e10), Some(1e8)]
        );
        let ring = SyncPlan::new(StrategyKind::Allreduce, 3, 0);
        assert_eq!(bps(&ring, 0), Some(1e8));
    }

    #[test]
    fn defaults_come_from_the_strategy() {
        let p3 = SyncPlan::new(StrategyKind::P3, 2, 1);
        assert_eq!(p3.scheduler, SchedulerKind::Priority);
        assert_eq!(p3.slice_params, super::super::P3_SLICE_PARAMS);
        assert_eq!(p3.sync_descriptor(), "p3/priority/slice=40000");
        let ring = SyncPlan::new(StrategyKind::Allreduce, 2, 0);
        assert_eq!(ring.bucket_bytes, 25_000_000);
        assert_eq!(ring.credit_bytes, 640_000);
        assert_eq!(ring.sync_descriptor(), "allreduce/fifo/bucket=25000000");
    }

    #[test]
    fn autotune_searches_the_credit_from_one_slice_to_the_model() {
        let mut p = SyncPlan::new(StrategyKind::P3, 2, 1);
        p.autotune = true;
        assert_eq!(
            p.validate(),
            Err(PlanError::AutotuneNeedsCredit("priority"))
        );
        p.scheduler = SchedulerKind::Credit;
        assert_eq!(p.validate(), Ok(()));
        assert!(p.sync_descriptor().ends_with("/credit=640000/autotune"));
        let keys = vec![
            KeyInfo {
                numel: 1_000_000,
                layer: 0,
            },
            KeyInfo {
                numel: 500_000,
                layer: 1,
            },
        ];
        let spec = p.tune_spec(&keys).unwrap();
        assert_eq!(
            (spec.min, spec.start, spec.max),
            (160_000, 640_000, 6_000_000)
        );
        p.autotune = false;
        assert_eq!(p.tune_spec(&keys), None);
    }

    #[test]
    fn scaling_rounds_up_and_clamps_slices_to_a_frame() {
        let mut p = SyncPlan::new(StrategyKind::Ps, 2, 1);
        p.slice_params = 10 << 20;
        let s = p.clone().scaled(1.0 / 16.0);
        assert_eq!(s.slice_params, FRAME_ELEMS / 16);
        assert_eq!(s.frame_elems, FRAME_ELEMS / 16);
        assert_eq!(s.credit_bytes, 40_000);
        assert_eq!(s.direct_share_elems, DIRECT_SHARE_ELEMS / 16);
        assert_eq!(scale_count(0, 0.5), 0);
        assert_eq!(scale_count(33, 1.0 / 16.0), 3);
        p.slice_params = 0;
        assert_eq!(
            p.scaled(0.5).validate(),
            Err(PlanError::Zero("slice_params"))
        );
    }

    #[test]
    fn validation_and_roles() {
        let ps = SyncPlan::new(StrategyKind::Ps, 2, 1);
        assert!(ps.validate().is_ok());
        let err = |p: SyncPlan| p.validate().map_err(|e| e.to_string()).unwrap_err();
        assert!(err(SyncPlan::new(StrategyKind::Ps, 2, 0)).contains("at least one server"));
        assert!(err(SyncPlan::new(StrategyKind::Allreduce, 2, 1)).contains("no server"));
        assert!(err(SyncPlan::new(StrategyKind::Allreduce, 0, 0)).contains("worker"));
        let keys = vec![KeyInfo { numel: 8, layer: 0 }];
        let optim = ServerOptim::plain(0.1);
        assert!(ps
            .server_endpoint(2, keys.clone(), vec![vec![0.0; 8]], optim)
            .is_ok());
        for rank in [0, 3] {
            let e = ps.server_endpoint(rank, keys.clone(), vec![vec![0.0; 8]], optim);
            assert!(matches!(e, Err(PlanError::NotAServer { .. })), "{rank}");
        }
        assert_eq!(ps.describe(2), "rank 2 (server 0)");
        assert_eq!(ps.peers(0), vec![2]);
    }
}
