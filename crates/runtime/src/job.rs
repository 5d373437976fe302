//! What a distributed job is: its strategy, its processes and how they reach each other.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use syncopate_core::net::NetworkProfile;
use syncopate_core::registry::{KeyInfo, TensorRegistry};
use syncopate_core::sched::SchedulerKind;
use syncopate_core::strategy::Rank;

use crate::auth::JobToken;
use crate::comm::CommOptions;

pub use syncopate_core::strategy::{
    StrategyKind, DEFAULT_CREDIT_BYTES, DIRECT_SHARE_ELEMS, FRAME_ELEMS, P3_SLICE_PARAMS,
};

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
    /// Parameter-server slice size in parameters (frames are never larger).
    pub slice_params: usize,
    /// Bytes a worker may have pushed and not yet had answered under the credit scheduler.
    pub credit_bytes: usize,
    /// All-reduce bucket capacity in bytes.
    pub bucket_bytes: usize,
    /// The emulated network (every process's NIC).
    pub network: NetworkProfile,
    /// The job's seed, from which the emulated network's random streams derive.
    pub net_seed: u64,
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

    /// The emulated network of process `rank`.
    pub fn emulation(&self, rank: Rank) -> crate::comm::Emulation {
        crate::comm::Emulation {
            profile: self.network.clone(),
            seed: self.net_seed,
            host: rank as u64,
        }
    }

    /// The ranks `rank` needs a link to.
    pub fn peers(&self, rank: Rank) -> Vec<Rank> {
        self.strategy.peers(self.workers, self.servers, rank)
    }

    /// The state machine of worker `rank` for a model with these keys.
    pub fn worker_endpoint(
        &self,
        rank: Rank,
        keys: Vec<KeyInfo>,
    ) -> Box<dyn syncopate_core::strategy::WorkerSync + Send> {
        self.worker_endpoint_segmented(rank, keys, FRAME_ELEMS)
    }

    /// [`JobLayout::worker_endpoint`] with ring all-reduce frames of at most
    /// `segment_elems` values (benchmarks of the frame size; training uses
    /// [`FRAME_ELEMS`]). Parameter-server frames are sized by `slice_params`.
    pub fn worker_endpoint_segmented(
        &self,
        rank: Rank,
        keys: Vec<KeyInfo>,
        segment_elems: usize,
    ) -> Box<dyn syncopate_core::strategy::WorkerSync + Send> {
        use syncopate_core::strategy::{PsWorker, RingAllReduce};
        if self.strategy.uses_servers() {
            Box::new(PsWorker::new(
                rank,
                self.workers,
                self.registry(keys),
                self.strategy.overlaps(),
                self.scheduler,
                self.credit_bytes,
            ))
        } else {
            Box::new(
                RingAllReduce::new(
                    rank,
                    self.workers,
                    keys,
                    (self.bucket_bytes / 4).max(1),
                    segment_elems.clamp(1, FRAME_ELEMS),
                    self.strategy.overlaps(),
                    self.scheduler,
                )
                .with_direct_below(DIRECT_SHARE_ELEMS),
            )
        }
    }

    /// The parameter-server registry of a model with these keys.
    pub fn registry(&self, keys: Vec<KeyInfo>) -> TensorRegistry {
        self.strategy
            .registry(keys, self.slice_params, self.servers)
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
        if self.scheduler.uses_credit() {
            d.push_str(&format!("/credit={}", self.credit_bytes));
        }
        d
    }

    /// Checks the layout against the strategy.
    pub fn validate(&self) -> Result<(), String> {
        if self.workers == 0 {
            return Err("a job needs at least one worker (--workers)".into());
        }
        if self.slice_params == 0 {
            return Err("--slice-params must be at least 1".into());
        }
        if self.scheduler.uses_credit() && self.credit_bytes == 0 {
            return Err("--credit-bytes must be positive".into());
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
    /// Where and how often to sample this process's resources (`None`: no sampling).
    pub metrics: Option<MetricsOptions>,
}

/// Resource sampling of a process: `dir/metrics-rank<R>.csv` every `interval`.
#[derive(Debug, Clone)]
pub struct MetricsOptions {
    /// Folder of the CSV files (one per process).
    pub dir: std::path::PathBuf,
    /// Sampling interval.
    pub interval: Duration,
    /// Steps whose timeline workers record into `dir/trace-rank<R>.json`.
    pub trace_steps: Option<std::ops::Range<u64>>,
}

impl ProcessContext {
    /// Starts this process's resource sampler if metrics were asked for.
    pub fn start_sampler(
        &self,
        traffic: std::sync::Arc<crate::sampler::TrafficTotals>,
    ) -> Result<Option<crate::sampler::ResourceSampler>, crate::error::RunError> {
        let Some(m) = &self.metrics else {
            return Ok(None);
        };
        std::fs::create_dir_all(&m.dir).map_err(|e| {
            crate::error::RunError::Local(format!("creating {}: {e}", m.dir.display()))
        })?;
        let path = m.dir.join(format!("metrics-rank{}.csv", self.rank));
        crate::sampler::ResourceSampler::start(m.interval, traffic, Some(path))
            .map(Some)
            .map_err(|e| crate::error::RunError::Local(format!("starting the sampler: {e}")))
    }
}

/// Stops a sampler and writes its CSV.
pub fn finish_sampler(
    sampler: Option<crate::sampler::ResourceSampler>,
) -> Result<(), crate::error::RunError> {
    if let Some(s) = sampler {
        s.finish().map_err(|e| {
            crate::error::RunError::Local(format!("writing the resource samples: {e}"))
        })?;
    }
    Ok(())
}
