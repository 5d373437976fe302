//! What a distributed job is: its strategy, its processes and how they reach each other.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use syncopate_core::net::LinkProfile;
use syncopate_core::registry::{KeyInfo, Placement, TensorRegistry};
use syncopate_core::sched::SchedulerKind;
use syncopate_core::strategy::Rank;

use crate::auth::JobToken;
use crate::comm::CommOptions;

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
}

impl StrategyKind {
    /// The name used on the command line and in the handshake.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Ps => "ps",
            StrategyKind::PsNoOverlap => "ps-no-overlap",
            StrategyKind::Allreduce => "allreduce",
            StrategyKind::AllreduceNoOverlap => "allreduce-no-overlap",
        }
    }

    /// Whether it needs parameter servers.
    pub fn uses_servers(self) -> bool {
        matches!(self, StrategyKind::Ps | StrategyKind::PsNoOverlap)
    }

    /// Whether communication overlaps backward.
    pub fn overlaps(self) -> bool {
        matches!(self, StrategyKind::Ps | StrategyKind::Allreduce)
    }
}

/// The synchronisation layer's view of a model's keys.
pub fn key_infos(spec: &syncopate_train::model::ModelSpec) -> Vec<KeyInfo> {
    spec.keys()
        .iter()
        .map(|k| KeyInfo {
            numel: k.numel,
            layer: k.layer,
        })
        .collect()
}

/// Largest frame payload in elements: big keys travel in frames of at most 4 MiB.
pub const FRAME_ELEMS: usize = 1 << 20;

/// The process layout and the synchronisation settings shared by every process of a job.
#[derive(Debug, Clone)]
pub struct JobLayout {
    /// Strategy.
    pub strategy: StrategyKind,
    /// Workers (ranks `0..workers`).
    pub workers: usize,
    /// Parameter servers (ranks `workers..workers + servers`).
    pub servers: usize,
    /// Scheduler of every link.
    pub scheduler: SchedulerKind,
    /// All-reduce bucket capacity in bytes.
    pub bucket_bytes: usize,
    /// Emulated profile of every link.
    pub network: LinkProfile,
}

impl JobLayout {
    /// Total processes.
    pub fn world_size(&self) -> usize {
        self.workers + self.servers
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
        if self.strategy.uses_servers() {
            if rank < self.workers {
                (self.workers..self.world_size()).collect()
            } else {
                (0..self.workers).collect()
            }
        } else if self.workers < 2 {
            Vec::new()
        } else {
            let left = (rank + self.workers - 1) % self.workers;
            let right = (rank + 1) % self.workers;
            let mut p = vec![left, right];
            p.sort_unstable();
            p.dedup();
            p
        }
    }

    /// The parameter-server registry of a model with these keys.
    pub fn registry(&self, keys: Vec<KeyInfo>) -> TensorRegistry {
        TensorRegistry::new(keys, FRAME_ELEMS, self.servers, Placement::KeysByBytes)
    }

    /// Checks the layout against the strategy.
    pub fn validate(&self) -> Result<(), String> {
        if self.workers == 0 {
            return Err("a job needs at least one worker (--workers)".into());
        }
        if self.strategy.uses_servers() && self.servers == 0 {
            return Err(format!(
                "strategy {} needs at least one parameter server (--servers)",
                self.strategy.name()
            ));
        }
        if !self.strategy.uses_servers() && self.servers > 0 {
            return Err(format!(
                "strategy {} uses no parameter server; drop --servers",
                self.strategy.name()
            ));
        }
        Ok(())
    }
}

/// Where this process stands in the job and how it finds the others.
#[derive(Debug, Clone)]
pub struct ProcessContext {
    /// This process's rank.
    pub rank: Rank,
    /// The job's secret.
    pub token: JobToken,
    /// The rendezvous address (MASTER_ADDR:MASTER_PORT).
    pub coordinator: SocketAddr,
    /// Whether this process hosts the rendezvous (rank 0 unless a launcher does).
    pub host_coordinator: bool,
    /// Address this process's data listener binds to.
    pub bind_ip: IpAddr,
    /// Rendezvous and connection deadline.
    pub connect_timeout: Duration,
    /// Heartbeat and liveness settings.
    pub comm: CommOptions,
}
