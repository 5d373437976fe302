//! The synchronisation flags, one group for every command that builds a [`SyncPlan`]
//! (`launch`, `worker`, `server`, `simulate`, `bench-comm`): each flag is declared, parsed
//! and checked here once, over the core's defaults, and the core validates the plan.

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;
use serde::{Deserialize, Serialize};
use syncopate_core::net::{parse_probability, parse_size};
use syncopate_core::sched::SchedulerKind;
use syncopate_core::strategy::{
    LossFill, OuterOptions, StepwiseHead, StrategyKind, SyncPlan, DEFAULT_BUCKET_BYTES,
    DEFAULT_CREDIT_BYTES, MESH_MAX_WORKERS,
};
use syncopate_runtime::job::Transport;

/// How the workers synchronise: the strategy, its servers, the scheduler and every size and
/// switch of the strategies' state machines. Every flag left out takes the core's default
/// for the strategy ([`SyncPlan::new`]).
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct SyncArgs {
    /// Synchronisation strategy; `simulate` takes a comma-separated list for a sweep, the
    /// other commands one.
    #[arg(
        long = "strategy",
        value_name = "STRATEGY",
        value_parser = strategy_parser(),
        value_delimiter = ',',
        default_value = StrategyKind::Allreduce.name()
    )]
    pub strategies: Vec<StrategyKind>,
    /// Parameter-server processes of the ps strategies (ps, p3, dlcp; ignored by the
    /// others). Default: simulate one per worker, bench-comm 1; launch, worker and server
    /// need it with a ps strategy.
    #[arg(long)]
    pub servers: Option<usize>,
    /// Order of the frames on every link (default: the strategy's, listed with --strategy's
    /// values). Also applies to ps and allreduce, so each P3 mechanism can be switched on
    /// alone.
    #[arg(long, value_parser = scheduler_parser())]
    pub scheduler: Option<SchedulerKind>,
    /// Parameter-server slice size in parameters (default: the strategy's, listed with
    /// --strategy's values; never more than a frame).
    #[arg(long)]
    pub slice_params: Option<usize>,
    /// Bucket size in MB of the ring strategies (allreduce, ring-reduce, stepwise; the
    /// default is PyTorch DDP's).
    #[arg(long, default_value_t = DEFAULT_BUCKET_BYTES as f64 / 1e6)]
    pub bucket_mb: f64,
    /// Credit of the credit scheduler: bytes pushed and not yet answered, e.g. 640KB.
    #[arg(long, default_value_t = DEFAULT_CREDIT_BYTES.to_string())]
    pub credit_bytes: String,
    /// Tune the credit online (--scheduler credit only), as ByteScheduler does: each
    /// worker measures candidates on a doubling grid from one slice to the whole model,
    /// starting at --credit-bytes, three steps each (one to settle, two timed), keeps the
    /// fastest, and searches again when its steps stay 25 % slower for 5 steps. `launch`
    /// writes the chosen credit and every candidate to summary.json and config.toml
    /// (`[autotune]`); `simulate` reports what worker 0 chose and the mean step once it
    /// settled.
    #[arg(long)]
    pub autotune: bool,
    /// All-reduce with 3 to 8 workers: link every worker to every other and send small
    /// buckets (n copies within 128 KiB) straight to each, one hop instead of n-1 around the
    /// ring; large buckets still go around the ring. Pays where a hop costs network latency
    /// (1.8-2.1x at 100 us a link); over loopback on few cores it is slower (docs/BENCHMARKS.md).
    /// In a simulate sweep it goes to the members it applies to.
    #[arg(long)]
    pub mesh: bool,
    /// Scale the model down by this factor in (0, 1], e.g. 1/16 or 0.25. launch (profile
    /// models only): every tensor, every bandwidth, slices, buckets, credit, send window and
    /// queues are multiplied by it while compute times stay, so the
    /// communication-to-computation ratio is the full-size model's at --bandwidth (default
    /// 1). simulate: the state machines' buffers shrink and the wire is charged full size
    /// (default: small enough that all hosts together hold about 50 M values).
    #[arg(long, value_name = "F", value_parser = parse_scale)]
    pub scale: Option<f64>,
    #[command(flatten)]
    pub averaging: AveragingArgs,
    #[command(flatten)]
    pub dlcp: DlcpArgs,
}

/// `--scale`: a factor in (0, 1] written as a fraction (1/16) or a number (0.25).
fn parse_scale(text: &str) -> Result<f64, String> {
    let parsed = match text.split_once('/') {
        Some((a, b)) => a
            .trim()
            .parse::<f64>()
            .and_then(|a| b.trim().parse::<f64>().map(|b| a / b)),
        None => text.trim().parse::<f64>(),
    };
    match parsed {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "'{text}' is not a factor in (0, 1] such as 1/16 or 0.25"
        )),
    }
}

impl SyncArgs {
    /// The one strategy of a job (`launch`, `worker`, `server`, `bench-comm`).
    pub fn strategy(&self) -> Result<StrategyKind> {
        match self.strategies[..] {
            [one] => Ok(one),
            _ => bail!("--strategy: this command runs one strategy (a list is a simulate sweep)"),
        }
    }

    /// The validated plan of `strategy` on `workers` workers, at full size: the core's
    /// defaults for the strategy, every flag given over them. `default_servers` is the
    /// command's server count of a ps strategy when `--servers` is not given.
    pub fn plan(
        &self,
        strategy: StrategyKind,
        workers: usize,
        default_servers: usize,
    ) -> Result<SyncPlan> {
        self.plan_on(strategy, workers, default_servers, Transport::Tcp)
    }

    /// [`SyncArgs::plan`] for a job whose loss-tolerant packets travel on `transport`,
    /// which sizes them (`--packet-bytes` checked against it, or its default).
    pub fn plan_on(
        &self,
        strategy: StrategyKind,
        workers: usize,
        default_servers: usize,
        transport: Transport,
    ) -> Result<SyncPlan> {
        if self.bucket_mb.is_nan() || self.bucket_mb <= 0.0 {
            bail!("--bucket-mb must be positive");
        }
        if self.mesh && !strategy.can_mesh(workers) {
            bail!(
                "--mesh links the workers of a ring all-reduce in a full mesh: it needs \
                 --strategy allreduce or allreduce-no-overlap and 3 to {MESH_MAX_WORKERS} workers \
                 (with 2 the ring already links both)"
            );
        }
        let servers = match strategy.uses_servers() {
            true => self.servers.unwrap_or(default_servers),
            false => 0,
        };
        let defaults = SyncPlan::new(strategy, workers, servers);
        let plan = SyncPlan {
            scheduler: self.scheduler.unwrap_or(defaults.scheduler),
            slice_params: self.slice_params.unwrap_or(defaults.slice_params),
            credit_bytes: parse_size(&self.credit_bytes).context("--credit-bytes")?,
            bucket_bytes: (self.bucket_mb * 1e6) as usize,
            autotune: self.autotune,
            mesh: self.mesh,
            ..defaults
        };
        self.refuse_other_families(strategy)?;
        let plan = self.dlcp.apply(self.averaging.apply(plan), transport)?;
        plan.validate()?;
        Ok(plan)
    }

    /// Settings of a family of strategies (parameter servers, step-wise averaging, DLCP)
    /// that `strategy` is not of, given even at their default values, refused naming the
    /// flag (core refuses only values that differ from the defaults, and knows no flags).
    fn refuse_other_families(&self, strategy: StrategyKind) -> Result<()> {
        let name = strategy.name();
        if let (false, Some(1..)) = (strategy.uses_servers(), self.servers) {
            bail!("--servers: strategy {name} has no parameter servers (leave --servers out)");
        }
        if let (false, Some(flag)) = (strategy.loss_tolerant(), self.dlcp.first_given()) {
            bail!(
                "{flag} applies to --strategy dlcp and dlcp-allreduce only (this job runs {name})"
            );
        }
        match self.averaging.refused_by(strategy) {
            Some((flag, applies_to)) => {
                bail!("{flag} applies to --strategy {applies_to} only (this job runs {name})")
            }
            None => Ok(()),
        }
    }

    /// These flags as one member of a `simulate` sweep over `members` (strategy, workers)
    /// takes them: the settings of a family of strategies (`--servers`, step-wise averaging,
    /// DLCP, `--mesh`) go to the members they apply to, as long as some member takes them (else
    /// they stay, and the plan refuses them).
    pub fn for_sweep_member(
        &self,
        strategy: StrategyKind,
        workers: usize,
        members: &[(StrategyKind, usize)],
    ) -> SyncArgs {
        let some = |takes: &dyn Fn(StrategyKind, usize) -> bool| {
            !takes(strategy, workers) && members.iter().any(|&(s, n)| takes(s, n))
        };
        let mut own = self.clone();
        if some(&|s, _| s.uses_servers()) {
            own.servers = None;
        }
        let strategies: Vec<StrategyKind> = members.iter().map(|&(s, _)| s).collect();
        own.averaging = self.averaging.for_member(strategy, &strategies);
        if some(&|s, _| s.loss_tolerant()) {
            own.dlcp = DlcpArgs::default();
        }
        if some(&|s, n| s.can_mesh(n)) {
            own.mesh = false;
        }
        own
    }
}

/// Values of `--strategy`: the core's strategies by name, each listed in `--help` with its
/// summary.
pub fn strategy_parser() -> impl TypedValueParser<Value = StrategyKind> {
    let values = StrategyKind::ALL.map(|s| PossibleValue::new(s.name()).help(s.summary()));
    PossibleValuesParser::new(values).try_map(|name| {
        StrategyKind::from_name(&name).ok_or_else(|| format!("unknown strategy '{name}'"))
    })
}

/// Values of `--transport`: the runtime's transports by name, each listed in `--help` with
/// its description.
pub fn transport_parser() -> impl TypedValueParser<Value = Transport> {
    let values = Transport::ALL.map(|t| PossibleValue::new(t.name()).help(t.description()));
    PossibleValuesParser::new(values).try_map(|name| {
        Transport::from_name(&name).ok_or_else(|| format!("unknown transport '{name}'"))
    })
}

/// Values of `--scheduler`: the core's schedulers by name, each listed in `--help` with its
/// description.
pub fn scheduler_parser() -> impl TypedValueParser<Value = SchedulerKind> {
    let values = SchedulerKind::ALL.map(|k| PossibleValue::new(k.name()).help(k.description()));
    PossibleValuesParser::new(values).try_map(|name| {
        SchedulerKind::from_name(&name).ok_or_else(|| format!("unknown scheduler '{name}'"))
    })
}

/// Values of `--stepwise-head`, each listed in `--help` with its description.
fn stepwise_head_parser() -> impl TypedValueParser<Value = StepwiseHead> {
    let values = StepwiseHead::ALL.map(|h| PossibleValue::new(h.name()).help(h.description()));
    PossibleValuesParser::new(values).try_map(|name| {
        StepwiseHead::from_name(&name).ok_or_else(|| format!("unknown stepwise head '{name}'"))
    })
}

/// The settings of the averaging strategies (step-wise averaging, local SGD, DiLoCo,
/// gossip), each refused for a strategy it does not apply to.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
pub struct AveragingArgs {
    /// Step-wise averaging: where each step's chain starts (default rotate).
    #[arg(long, value_parser = stepwise_head_parser())]
    pub stepwise_head: Option<StepwiseHead>,
    /// Step-wise averaging and gossip: every H-th step an exact average of the weights
    /// (step-wise: the sum along the chain and the average back around; gossip: a ring
    /// all-reduce) so the replicas meet again; 0 (the default): never. With
    /// --average-every, step-wise averaging counts it in chain passes.
    #[arg(long, value_name = "H")]
    pub full_sync_every: Option<u64>,
    /// Local SGD, DiLoCo and step-wise averaging: synchronise every H-th step only, each
    /// worker stepping alone in between (local SGD: exact average of the weights; DiLoCo:
    /// the outer step; step-wise: one chain pass). Default: local-sgd 8, diloco 16,
    /// stepwise 1 (every step).
    #[arg(long, value_name = "H", visible_alias = "stepwise-every")]
    pub average_every: Option<u64>,
    /// DiLoCo: the outer optimizer's learning rate (default 0.7).
    #[arg(long, value_name = "LR")]
    pub outer_lr: Option<f32>,
    /// DiLoCo: the outer optimizer's Nesterov momentum in [0, 1) (default 0.9).
    #[arg(long, value_name = "M")]
    pub outer_momentum: Option<f32>,
}

impl AveragingArgs {
    /// `plan` with the settings given.
    fn apply(&self, plan: SyncPlan) -> SyncPlan {
        SyncPlan {
            stepwise_head: self.stepwise_head.unwrap_or(plan.stepwise_head),
            full_sync_every: self.full_sync_every.unwrap_or(plan.full_sync_every),
            average_every: self.average_every.unwrap_or(plan.average_every),
            outer: OuterOptions {
                lr: self.outer_lr.unwrap_or(plan.outer.lr),
                momentum: self.outer_momentum.unwrap_or(plan.outer.momentum),
            },
            ..plan
        }
    }

    /// Each flag with the strategies it applies to, and whether `strategy` is one of them.
    fn flags(&self, strategy: StrategyKind) -> [(&'static str, &'static str, bool, bool); 5] {
        let info = strategy.info();
        [
            (
                "--stepwise-head",
                "stepwise",
                self.stepwise_head.is_some(),
                info.stepwise_settings,
            ),
            (
                "--full-sync-every",
                "stepwise or gossip",
                self.full_sync_every.is_some(),
                info.full_syncs,
            ),
            (
                "--average-every",
                "local-sgd, diloco or stepwise",
                self.average_every.is_some(),
                info.average_every > 0,
            ),
            (
                "--outer-lr",
                "diloco",
                self.outer_lr.is_some(),
                info.outer_optimizer,
            ),
            (
                "--outer-momentum",
                "diloco",
                self.outer_momentum.is_some(),
                info.outer_optimizer,
            ),
        ]
    }

    /// The first flag given that `strategy` does not take, with the strategies that do.
    fn refused_by(&self, strategy: StrategyKind) -> Option<(&'static str, &'static str)> {
        self.flags(strategy)
            .into_iter()
            .find(|&(_, _, given, applies)| given && !applies)
            .map(|(flag, applies_to, _, _)| (flag, applies_to))
    }

    /// These settings as `strategy`, one member of a sweep over `members`, takes them: each
    /// flag it does not take is left out where some member takes it (else it stays, and
    /// the plan refuses it).
    fn for_member(&self, strategy: StrategyKind, members: &[StrategyKind]) -> Self {
        let applies = |s: StrategyKind| self.flags(s).map(|(_, _, _, applies)| applies);
        let own = applies(strategy);
        let anyone = |i: usize| members.iter().any(|&m| applies(m)[i]);
        let keep = |i: usize| own[i] || !anyone(i);
        Self {
            stepwise_head: self.stepwise_head.filter(|_| keep(0)),
            full_sync_every: self.full_sync_every.filter(|_| keep(1)),
            average_every: self.average_every.filter(|_| keep(2)),
            outer_lr: self.outer_lr.filter(|_| keep(3)),
            outer_momentum: self.outer_momentum.filter(|_| keep(4)),
        }
    }
}

/// Values of `--loss-fill`.
fn loss_fill_parser() -> impl TypedValueParser<Value = LossFill> {
    let values = LossFill::ALL.map(|f| {
        PossibleValue::new(f.name()).help(match f {
            LossFill::Zero => "lost values count as zero; the sum is divided by all workers",
            LossFill::Rescale => "each value's sum is divided by the workers whose packet came",
        })
    });
    PossibleValuesParser::new(values).try_map(|name| {
        LossFill::from_name(&name).ok_or_else(|| format!("unknown loss fill '{name}'"))
    })
}

/// The settings of DLCP (`--strategy dlcp` and `dlcp-allreduce` only; the plan refuses
/// them for another strategy). Each mechanism can be switched off alone, for ablations.
#[derive(Debug, Clone, Default, Args, Serialize, Deserialize)]
pub struct DlcpArgs {
    /// DLCP: the fraction of a key's packets (per worker, step and server; per chunk and
    /// ring hop for dlcp-allreduce) that may be missing when the receiver completes it, in
    /// [0, 0.5]: "1%" or 0.01 (default 1%); 0 needs every packet (exact, losses recovered
    /// by probes).
    #[arg(long, value_name = "P")]
    pub loss_bound: Option<String>,
    /// DLCP: payload bytes per packet, a multiple of 4 up to a frame (default 8KiB).
    #[arg(long, value_name = "SIZE")]
    pub packet_bytes: Option<String>,
    /// DLCP: what stands in for values whose packet never came (default zero; rescale is
    /// for dlcp only).
    #[arg(long, value_parser = loss_fill_parser())]
    pub loss_fill: Option<LossFill>,
    /// DLCP: packets whose mean |gradient| lies below this quantile of their key's
    /// packets are marked drop-eligible (default 0.5, the median; 0 marks none). Our
    /// rule: the papers do not publish theirs.
    #[arg(long, value_name = "Q")]
    pub dlcp_drop_quantile: Option<f64>,
    /// DLCP ablation: no packet priority classes and no drop-eligible marks.
    #[arg(long)]
    pub dlcp_no_priority: bool,
    /// DLCP ablation: packets follow their flow's path (hashing) instead of spraying.
    #[arg(long)]
    pub dlcp_no_spray: bool,
    /// DLCP: the fraction of the packets coming back that may be missing, in [0, 0.5]:
    /// per key share of a worker's parameters (dlcp), per chunk and hop of the all-gather
    /// (dlcp-allreduce). Default 0: they come back reliably and every worker holds the same
    /// values. A lost entry keeps the previous step's value (MLT's loss-tolerant pulls), so
    /// the replicas drift apart.
    #[arg(long, value_name = "P")]
    pub pull_loss_bound: Option<String>,
}

impl DlcpArgs {
    /// The first of these flags given, if any.
    fn first_given(&self) -> Option<&'static str> {
        let given = [
            ("--loss-bound", self.loss_bound.is_some()),
            ("--packet-bytes", self.packet_bytes.is_some()),
            ("--loss-fill", self.loss_fill.is_some()),
            ("--dlcp-drop-quantile", self.dlcp_drop_quantile.is_some()),
            ("--dlcp-no-priority", self.dlcp_no_priority),
            ("--dlcp-no-spray", self.dlcp_no_spray),
            ("--pull-loss-bound", self.pull_loss_bound.is_some()),
        ];
        given.iter().find(|(_, g)| *g).map(|(flag, _)| *flag)
    }

    /// `plan` with the settings given, parsed (their ranges are the plan's to check);
    /// `transport` decides the packet size: the one given, checked, or its default.
    fn apply(&self, plan: SyncPlan, transport: Transport) -> Result<SyncPlan> {
        let mut dlcp = plan.dlcp;
        if let Some(text) = &self.loss_bound {
            dlcp.loss_bound =
                parse_probability(text).with_context(|| format!("--loss-bound {text}"))?;
        }
        if let Some(text) = &self.pull_loss_bound {
            dlcp.pull_loss_bound =
                parse_probability(text).with_context(|| format!("--pull-loss-bound {text}"))?;
        }
        let packet_bytes = match &self.packet_bytes {
            Some(text) => {
                let bytes = parse_size(text).with_context(|| format!("--packet-bytes {text}"))?;
                if bytes == 0 || bytes % 4 != 0 {
                    bail!("--packet-bytes {text}: must be a positive multiple of 4 bytes");
                }
                Some(bytes)
            }
            None => None,
        };
        if plan.strategy.loss_tolerant() {
            dlcp.packet_elems = transport.packet_elems(packet_bytes, dlcp.packet_elems)?;
            // Where packets are datagrams, so are the Probes, Stops and Missing bitmaps.
            dlcp.control_datagrams = transport == Transport::Udp;
        }
        if let Some(fill) = self.loss_fill {
            dlcp.fill = fill;
        }
        if let Some(q) = self.dlcp_drop_quantile {
            dlcp.drop_quantile = q;
        }
        dlcp.priority &= !self.dlcp_no_priority;
        dlcp.spray &= !self.dlcp_no_spray;
        Ok(SyncPlan { dlcp, ..plan })
    }
}
