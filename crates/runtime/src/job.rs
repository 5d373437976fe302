//! What a distributed job is: its strategy, its processes and how they reach each other.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use syncopate_core::net::NetworkProfile;
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::Rank;

use crate::auth::JobToken;
use crate::checkpoint::{settings_of, JobIdentity, WeightSettings};
use crate::comm::CommOptions;

pub use syncopate_core::strategy::{StrategyKind, SyncPlan};

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

/// A job: its synchronisation plan, shared by every process, placed on an emulated network.
/// It dereferences to its [`SyncPlan`], so `layout.strategy`, `layout.workers`,
/// `layout.worker_endpoint(..)` and the rest read the plan.
#[derive(Debug, Clone)]
pub struct JobLayout {
    /// Strategy, processes, sizes, and the factory of the endpoints.
    pub sync: SyncPlan,
    /// The emulated network (every process's NIC).
    pub network: NetworkProfile,
    /// The job's seed, from which the emulated network's random streams derive.
    pub net_seed: u64,
}

impl JobLayout {
    /// The emulated network of process `rank`.
    pub fn emulation(&self, rank: Rank) -> crate::comm::Emulation {
        crate::comm::Emulation {
            profile: self.network.clone(),
            seed: self.net_seed,
            host: rank as u64,
        }
    }

    /// The identity of this job, training `spec` under `token`, as its checkpoints name it:
    /// with every field of the plan that changes the weights (`plan.<field>`; the
    /// scheduler, the credit and its tuning only change when bytes move) and `training`,
    /// the training settings that do.
    pub fn identity(
        &self,
        token: &JobToken,
        spec: &syncopate_train::model::ModelSpec,
        training: &WeightSettings,
    ) -> JobIdentity {
        const TIMING_ONLY: [&str; 6] = [
            "strategy",
            "workers",
            "servers",
            "scheduler",
            "credit_bytes",
            "autotune",
        ];
        let mut settings = settings_of("plan", &self.sync, &TIMING_ONLY);
        settings.extend(training.clone());
        JobIdentity::new(
            &spec.name,
            spec.fingerprint(),
            self.strategy.name(),
            (self.workers, self.servers),
            token,
            settings,
        )
    }
}

impl std::ops::Deref for JobLayout {
    type Target = SyncPlan;

    fn deref(&self) -> &SyncPlan {
        &self.sync
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
    /// This process's timeline recorder, if a window of steps is to be traced.
    pub fn tracer(&self) -> Option<crate::trace::TraceRecorder> {
        let window = self.metrics.as_ref()?.trace_steps.clone()?;
        Some(crate::trace::TraceRecorder::new(self.rank, window))
    }

    /// Starts this process's resource sampler if metrics were asked for.
    pub fn start_sampler(
        &self,
        traffic: std::sync::Arc<crate::sampler::TrafficTotals>,
    ) -> Result<Option<crate::sampler::ResourceSampler>, crate::sampler::SamplerError> {
        let Some(m) = &self.metrics else {
            return Ok(None);
        };
        crate::sampler::ResourceSampler::start_in(&m.dir, self.rank, m.interval, traffic).map(Some)
    }
}
