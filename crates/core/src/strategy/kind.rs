//! Which strategy a job runs, and what follows from it alone: its properties, its defaults,
//! how its parameter-server slices are placed, and which ranks talk to which. The runtime,
//! the simulator and the command line all take these from this one description (the
//! endpoints themselves are built by [`super::SyncPlan`]).

use serde::{Deserialize, Serialize};

use super::Rank;
use crate::registry::Placement;
use crate::sched::SchedulerKind;

/// Largest frame payload in elements: big keys travel in frames of at most 4 MiB.
pub const FRAME_ELEMS: usize = 1 << 20;

/// Buckets whose n copies hold at most this many values together (128 KiB: a 64 KiB bucket
/// with 2 workers, 32 KiB with 4) are shared whole around the ring rather than reduced and
/// gathered: n-1 hops instead of 2(n-1), for n/2 times the bytes, which pays where hops, not
/// bytes, take the time (`RingAllReduce::with_direct_below`; with 4 workers two rounds of
/// recursive doubling between ring neighbours instead; measured in docs/BENCHMARKS.md).
pub const DIRECT_SHARE_ELEMS: usize = 32 << 10;

/// Largest all-reduce job whose workers may be linked in a full mesh rather than a ring only
/// (`SyncPlan::mesh`, from 3 workers on; with 2 the ring already links both). Over the mesh
/// a small bucket shared whole goes from each worker straight to every other one, one hop
/// instead of the ring's n-1, while large buckets still use only the ring neighbours. The
/// limit is there because links (connections, heartbeats, buffers) grow as n^2 and a
/// bucket's copies as n: past a handful of workers the bytes, not the hops, dominate anyway.
pub const MESH_MAX_WORKERS: usize = 8;

/// Largest frame of the chain strategies (64 KiB of values): a bucket streams along the chain
/// only when it is cut finer than the bucket, since one worker at a time holds a segment.
pub const CHAIN_SEGMENT_ELEMS: usize = 16 << 10;

/// P3's slice size (`MXNET_KVSTORE_SLICE_THRESHOLD` in the authors' code).
pub const P3_SLICE_PARAMS: usize = 40_000;

/// All-reduce bucket capacity when none is asked for (PyTorch DDP's 25 MB).
pub const DEFAULT_BUCKET_BYTES: usize = 25_000_000;

/// ByteScheduler-style credit when none is asked for: 4 P3 slices.
pub const DEFAULT_CREDIT_BYTES: usize = 4 * P3_SLICE_PARAMS * 4;

/// How a step's gradients and parameters are synchronised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Sharded parameter server; each layer pushed as soon as backward produces it.
    Ps,
    /// Parameter server; everything pushed after the whole backward (baseline).
    PsNoOverlap,
    /// Ring all-reduce over gradient buckets launched as backward fills them.
    Allreduce,
    /// Ring all-reduce after the whole backward (baseline).
    AllreduceNoOverlap,
    /// P3: parameter server with 40,000-parameter slices placed round robin, priority
    /// scheduling by layer, and the next forward starting layer by layer as slices return.
    P3,
    /// Ring reduce: the gradients' sum along the ring's chain to a root, then the root's
    /// average along the chain again (reduce then broadcast).
    RingReduce,
    /// Step-wise averaging: after its own optimizer step each worker adopts the mean of its
    /// weights and those of the workers before it on the step's chain; no second pass.
    Stepwise,
    /// DLCP: P3 whose pushes are loss-tolerant packets, complete once a bounded fraction
    /// has arrived, with packet priority, priority dropping and per-packet paths.
    Dlcp,
    /// DLCP over ring all-reduce: reduce-scatter hops of loss-tolerant packets complete at
    /// the loss bound (lost contributions are missing from the sum), with packet priority,
    /// priority dropping and per-packet paths.
    DlcpAllreduce,
    /// Local SGD (periodic model averaging): every worker steps alone; every H-th step the
    /// weights are averaged exactly by ring all-reduce.
    LocalSgd,
    /// DiLoCo: H steps of each worker's own optimizer, then the weights' change since the
    /// last outer step is averaged by ring all-reduce and applied by an outer Nesterov
    /// step.
    Diloco,
    /// Gossip (decentralised SGD): each step every worker mixes its weights with its two
    /// ring neighbours'; optionally an exact average every H-th step.
    Gossip,
}

/// What a strategy averages across the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Averaged {
    /// Gradients: the step applies the mean gradient (on the servers or on every worker).
    Gradients,
    /// Weights: every worker adopts an average of the replicas' weights.
    Weights,
}

/// Which endpoints a strategy's job is made of, and so which ranks are linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Workers and parameter servers: every worker linked to every server.
    ParameterServers,
    /// Workers only, each linked to its ring neighbours (the all-reduce strategies; a full
    /// mesh where the strategy allows one, see [`StrategyInfo::mesh`]).
    Ring,
    /// Workers only, passing values along the ring's chain ([`super::ChainPass`]).
    Chain,
}

/// Everything that follows from the strategy alone: one row per strategy, read by the
/// [`StrategyKind`] methods, the plan and the factory of endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrategyInfo {
    /// The name used on the command line and in the handshake.
    pub name: &'static str,
    /// One line on what it does, for listings such as `--help`.
    pub description: &'static str,
    /// What it averages across the workers.
    pub averages: Averaged,
    /// Whether it sends loss-tolerant frames and completes without some of them (DLCP).
    pub loss_tolerant: bool,
    /// Which endpoints its job is made of.
    pub topology: Topology,
    /// Whether communication overlaps backward.
    pub overlaps: bool,
    /// Whether its workers may be linked in a full mesh (see [`StrategyKind::can_mesh`]).
    pub mesh: bool,
    /// Whether the step-wise averaging settings (chain head) apply to it.
    pub stepwise_settings: bool,
    /// Whether an exact average every H-th step (`full_sync_every`) applies to it.
    pub full_syncs: bool,
    /// Steps from one averaging to the next when none is asked for (`average_every`); 0
    /// where the setting does not apply (the strategy synchronises every step).
    pub average_every: u64,
    /// Whether it has an outer optimizer (`outer_lr`, `outer_momentum`: DiLoCo).
    pub outer_optimizer: bool,
    /// The scheduler used when none is asked for.
    pub scheduler: SchedulerKind,
    /// Parameter-server slice size in parameters when none is asked for.
    pub slice_params: usize,
    /// All-reduce bucket capacity in bytes when none is asked for.
    pub bucket_bytes: usize,
    /// The credit scheduler's credit in bytes when none is asked for.
    pub credit_bytes: usize,
    /// How its parameter-server slices are placed on the servers.
    pub placement: Placement,
}

impl StrategyInfo {
    /// The row every other row starts from: an exact, overlapping ring all-reduce with the
    /// default sizes. Rows spell out what they change.
    const BASE: StrategyInfo = StrategyInfo {
        name: "",
        description: "",
        averages: Averaged::Gradients,
        loss_tolerant: false,
        topology: Topology::Ring,
        overlaps: true,
        mesh: false,
        stepwise_settings: false,
        full_syncs: false,
        average_every: 0,
        outer_optimizer: false,
        scheduler: SchedulerKind::Fifo,
        slice_params: FRAME_ELEMS,
        bucket_bytes: DEFAULT_BUCKET_BYTES,
        credit_bytes: DEFAULT_CREDIT_BYTES,
        placement: Placement::KeysByBytes,
    };
}

const PS: StrategyInfo = StrategyInfo {
    name: "ps",
    description: "sharded parameter server, each layer pushed as soon as backward produces it",
    topology: Topology::ParameterServers,
    ..StrategyInfo::BASE
};

const PS_NO_OVERLAP: StrategyInfo = StrategyInfo {
    name: "ps-no-overlap",
    description: "parameter server, everything pushed after the whole backward (baseline)",
    topology: Topology::ParameterServers,
    overlaps: false,
    ..StrategyInfo::BASE
};

const ALLREDUCE: StrategyInfo = StrategyInfo {
    name: "allreduce",
    description: "ring all-reduce over gradient buckets launched as backward fills them (DDP)",
    mesh: true,
    ..StrategyInfo::BASE
};

const ALLREDUCE_NO_OVERLAP: StrategyInfo = StrategyInfo {
    name: "allreduce-no-overlap",
    description: "ring all-reduce after the whole backward (baseline)",
    overlaps: false,
    mesh: true,
    ..StrategyInfo::BASE
};

const P3: StrategyInfo = StrategyInfo {
    name: "p3",
    description: "P3: slices round robin over the servers, priority by layer, preemption at \
                  slice boundaries, next forward layer by layer",
    topology: Topology::ParameterServers,
    scheduler: SchedulerKind::Priority,
    slice_params: P3_SLICE_PARAMS,
    placement: Placement::SlicesRoundRobin,
    ..StrategyInfo::BASE
};

const RING_REDUCE: StrategyInfo = StrategyInfo {
    name: "ring-reduce",
    description: "ring reduce: gradient sums along the ring to a root, its average back around \
                  (exact, ~2M bytes per worker)",
    topology: Topology::Chain,
    ..StrategyInfo::BASE
};

const STEPWISE: StrategyInfo = StrategyInfo {
    name: "stepwise",
    description: "step-wise averaging (approximate): after its own optimizer step each worker \
                  adopts the mean of the weights before it on the chain, no second pass (~M bytes)",
    averages: Averaged::Weights,
    topology: Topology::Chain,
    stepwise_settings: true,
    full_syncs: true,
    average_every: 1,
    ..StrategyInfo::BASE
};

const DLCP: StrategyInfo = StrategyInfo {
    name: "dlcp",
    description: "DLCP (approximate): P3 with loss-tolerant packet pushes complete at a loss \
                  bound, packet priority and priority dropping by layer and gradient \
                  magnitude, per-packet paths",
    loss_tolerant: true,
    ..P3
};

const DLCP_ALLREDUCE: StrategyInfo = StrategyInfo {
    name: "dlcp-allreduce",
    description: "DLCP over ring all-reduce (approximate): loss-tolerant reduce-scatter packets \
                  complete at a loss bound, lost contributions missing from the sum; packet \
                  priority, priority dropping, per-packet paths",
    loss_tolerant: true,
    scheduler: SchedulerKind::Priority,
    ..StrategyInfo::BASE
};

const LOCAL_SGD: StrategyInfo = StrategyInfo {
    name: "local-sgd",
    description: "local SGD (approximate): every worker steps alone, every H-th step \
                  (--average-every) the weights are averaged exactly by ring all-reduce \
                  (~2M/H bytes per step)",
    averages: Averaged::Weights,
    average_every: DEFAULT_LOCAL_SGD_EVERY,
    ..StrategyInfo::BASE
};

const DILOCO: StrategyInfo = StrategyInfo {
    name: "diloco",
    description: "DiLoCo (approximate): H inner steps of each worker's optimizer, then the \
                  change since the last outer step averaged by ring all-reduce and applied \
                  by an outer Nesterov step (--outer-lr, --outer-momentum; ~2M/H bytes per step)",
    averages: Averaged::Weights,
    average_every: DEFAULT_DILOCO_EVERY,
    outer_optimizer: true,
    ..StrategyInfo::BASE
};

const GOSSIP: StrategyInfo = StrategyInfo {
    name: "gossip",
    description: "gossip (approximate): each step every worker mixes its weights with its two \
                  ring neighbours' (1/3 each), optionally an exact average every H-th step \
                  (--full-sync-every; ~2M bytes per step whatever the workers)",
    averages: Averaged::Weights,
    full_syncs: true,
    ..StrategyInfo::BASE
};

/// Local SGD's steps between two averagings when none is asked for.
pub const DEFAULT_LOCAL_SGD_EVERY: u64 = 8;

/// DiLoCo's inner steps between two outer steps when none is asked for.
pub const DEFAULT_DILOCO_EVERY: u64 = 16;

impl StrategyKind {
    /// Every strategy.
    pub const ALL: [StrategyKind; 12] = [
        StrategyKind::Ps,
        StrategyKind::PsNoOverlap,
        StrategyKind::Allreduce,
        StrategyKind::AllreduceNoOverlap,
        StrategyKind::P3,
        StrategyKind::RingReduce,
        StrategyKind::Stepwise,
        StrategyKind::Dlcp,
        StrategyKind::DlcpAllreduce,
        StrategyKind::LocalSgd,
        StrategyKind::Diloco,
        StrategyKind::Gossip,
    ];

    /// The strategy's row: everything that follows from the strategy alone.
    pub const fn info(self) -> &'static StrategyInfo {
        match self {
            StrategyKind::Ps => &PS,
            StrategyKind::PsNoOverlap => &PS_NO_OVERLAP,
            StrategyKind::Allreduce => &ALLREDUCE,
            StrategyKind::AllreduceNoOverlap => &ALLREDUCE_NO_OVERLAP,
            StrategyKind::P3 => &P3,
            StrategyKind::RingReduce => &RING_REDUCE,
            StrategyKind::Stepwise => &STEPWISE,
            StrategyKind::Dlcp => &DLCP,
            StrategyKind::DlcpAllreduce => &DLCP_ALLREDUCE,
            StrategyKind::LocalSgd => &LOCAL_SGD,
            StrategyKind::Diloco => &DILOCO,
            StrategyKind::Gossip => &GOSSIP,
        }
    }

    /// The strategy named `name` (as [`StrategyKind::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The name used on the command line and in the handshake.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// One line on what it does, for listings such as `--help`.
    pub fn description(self) -> &'static str {
        self.info().description
    }

    /// [`StrategyKind::description`] followed by the defaults it runs with:
    /// `... [scheduler priority, slices of 40000 parameters]`.
    pub fn summary(self) -> String {
        let info = self.info();
        let bucket_mb = info.bucket_bytes as f64 / 1e6;
        let size = if self.uses_servers() {
            format!("slices of {} parameters", info.slice_params)
        } else if info.loss_tolerant {
            format!(
                "buckets of {bucket_mb} MB, packets of {} KiB",
                super::dlcp::DEFAULT_PACKET_ELEMS * 4 / 1024
            )
        } else {
            format!("buckets of {bucket_mb} MB")
        };
        let scheduler = info.scheduler.name();
        format!("{} [scheduler {scheduler}, {size}]", info.description)
    }

    /// What it averages across the workers.
    pub fn averages(self) -> Averaged {
        self.info().averages
    }

    /// Whether every worker ends each step with exactly the values of single-process
    /// training on the workers' whole batch (to float tolerance); approximate strategies
    /// report their deviation instead.
    pub fn exact(self) -> bool {
        self.averages() == Averaged::Gradients && !self.loss_tolerant()
    }

    /// Whether it sends loss-tolerant frames and completes without some of them (exact
    /// only with `--loss-bound 0`).
    pub fn loss_tolerant(self) -> bool {
        self.info().loss_tolerant
    }

    /// Which endpoints its job is made of.
    pub fn topology(self) -> Topology {
        self.info().topology
    }

    /// Whether its workers pass values along the ring's chain ([`super::ChainPass`]).
    pub fn chain(self) -> bool {
        self.topology() == Topology::Chain
    }

    /// Whether it needs parameter servers.
    pub fn uses_servers(self) -> bool {
        self.topology() == Topology::ParameterServers
    }

    /// Whether communication overlaps backward (and, for parameter servers, the next
    /// forward: layer `k` runs as soon as its parameters are back).
    pub fn overlaps(self) -> bool {
        self.info().overlaps
    }

    /// Whether the next forward overlaps this step's synchronisation: layer `k` of the next
    /// step runs as soon as layer `k`'s fresh values are back, instead of after the whole
    /// step is done. That holds where workers receive values rather than gradients
    /// (parameter servers with overlap, P3, step-wise averaging).
    pub fn forward_overlap(self) -> bool {
        self.overlaps() && (self.uses_servers() || self.averages() == Averaged::Weights)
    }

    /// The scheduler used when none is asked for.
    pub fn default_scheduler(self) -> SchedulerKind {
        self.info().scheduler
    }

    /// Parameters per slice when none is asked for (before any `--scale`).
    pub fn default_slice_params(self) -> usize {
        self.info().slice_params
    }

    /// All-reduce bucket capacity in bytes when none is asked for (before any `--scale`).
    pub fn default_bucket_bytes(self) -> usize {
        self.info().bucket_bytes
    }

    /// The credit scheduler's credit in bytes when none is asked for (before any `--scale`).
    pub fn default_credit_bytes(self) -> usize {
        self.info().credit_bytes
    }

    /// How its parameter-server slices are placed on the servers: P3 round robin, the
    /// other strategies balanced by bytes (MXNet's KVStore).
    pub fn placement(self) -> Placement {
        self.info().placement
    }

    /// Whether its `workers` workers can be linked in a full mesh (every worker to every
    /// other) rather than to their ring neighbours only, where the plan asks for it
    /// (`SyncPlan::mesh`): the ring all-reduce strategies with 3 to [`MESH_MAX_WORKERS`]
    /// workers, whose small buckets then go straight to every worker
    /// (`RingAllReduce::over_mesh`).
    pub fn can_mesh(self, workers: usize) -> bool {
        self.info().mesh && (3..=MESH_MAX_WORKERS).contains(&workers)
    }

    /// The ranks `rank` has links to: workers to every server and servers to every worker
    /// (parameter servers), or each worker to its ring neighbours (`SyncPlan::peers` adds the
    /// full mesh where the plan asks for one).
    pub fn peers(self, workers: usize, servers: usize, rank: Rank) -> Vec<Rank> {
        match self.topology() {
            Topology::ParameterServers if rank < workers => (workers..workers + servers).collect(),
            Topology::ParameterServers => (0..workers).collect(),
            Topology::Ring | Topology::Chain => super::ring_layout::neighbours(workers, rank),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_topologies() {
        for s in StrategyKind::ALL {
            assert_eq!(StrategyKind::from_name(s.name()), Some(s));
        }
        assert_eq!(StrategyKind::P3.peers(2, 2, 0), vec![2, 3]);
        assert_eq!(StrategyKind::Ps.peers(2, 2, 3), vec![0, 1]);
        assert_eq!(StrategyKind::Allreduce.peers(4, 0, 0), vec![1, 3]);
        assert!(StrategyKind::Allreduce.can_mesh(3));
        assert!(StrategyKind::AllreduceNoOverlap.can_mesh(MESH_MAX_WORKERS));
        assert!(!StrategyKind::Allreduce.can_mesh(2));
        assert!(!StrategyKind::Allreduce.can_mesh(MESH_MAX_WORKERS + 1));
        assert!(!StrategyKind::RingReduce.can_mesh(4));
        assert!(!StrategyKind::DlcpAllreduce.can_mesh(4));
        assert_eq!(StrategyKind::Allreduce.peers(2, 0, 1), vec![0]);
        assert!(StrategyKind::Allreduce.peers(1, 0, 0).is_empty());
    }

    #[test]
    fn the_table_says_what_each_strategy_is() {
        use StrategyKind::*;
        let which = |has: fn(StrategyKind) -> bool| -> Vec<StrategyKind> {
            StrategyKind::ALL.into_iter().filter(|&s| has(s)).collect()
        };
        fn approximate(s: StrategyKind) -> bool {
            matches!(
                s,
                Stepwise | Dlcp | DlcpAllreduce | LocalSgd | Diloco | Gossip
            )
        }
        assert_eq!(which(StrategyKind::exact), which(|s| !approximate(s)));
        assert_eq!(
            which(StrategyKind::forward_overlap),
            [Ps, P3, Stepwise, Dlcp, LocalSgd, Diloco, Gossip]
        );
        assert_eq!(
            which(StrategyKind::uses_servers),
            [Ps, PsNoOverlap, P3, Dlcp]
        );
        assert_eq!(which(StrategyKind::chain), [RingReduce, Stepwise]);
        assert_eq!(
            which(|s| s.info().average_every > 0),
            [Stepwise, LocalSgd, Diloco]
        );
        assert_eq!(which(|s| s.info().full_syncs), [Stepwise, Gossip]);
        assert_eq!(which(|s| s.info().outer_optimizer), [Diloco]);
        for s in StrategyKind::ALL {
            let info = s.info();
            assert_eq!(info.bucket_bytes, DEFAULT_BUCKET_BYTES, "{}", info.name);
            assert_eq!(info.credit_bytes, DEFAULT_CREDIT_BYTES, "{}", info.name);
            let p3_like = matches!(s, P3 | Dlcp);
            assert_eq!(info.placement == Placement::SlicesRoundRobin, p3_like);
            assert_eq!(info.slice_params == P3_SLICE_PARAMS, p3_like);
        }
        assert_eq!(
            StrategyKind::Dlcp.summary(),
            format!(
                "{} [scheduler priority, slices of 40000 parameters]",
                DLCP.description
            )
        );
    }
}
