//! What a distributed job is: its strategy, its processes and how they reach each other,
//! and how its packets travel ([`transport`]); what it leaves is [`crate::outcome`]'s. The
//! commands (`syncopate launch`, `worker`, `server`) parse flags and call these.

pub mod token;
pub mod transport;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use syncopate_core::liveness::LivenessConfig;
use syncopate_core::net::{NetworkProfile, ProfileError};
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{PlanError, Rank};
use syncopate_train::trainer::Duration as TrainDuration;

use crate::auth::JobToken;
use crate::checkpoint::{settings_of, JobIdentity, WeightSettings};
use crate::comm::CommOptions;

pub use syncopate_core::strategy::{StrategyKind, SyncPlan};
pub use transport::{Transport, TransportError};

/// Why a job cannot run as given, or a process cannot take its place in it.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The transport does not apply to the job.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The network's settings are out of range.
    #[error(transparent)]
    Network(#[from] ProfileError),
    /// The synchronisation plan's settings are out of range.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The launcher's variables are malformed.
    #[error(transparent)]
    Env(#[from] crate::env::EnvError),
    /// No rank in the environment.
    #[error(
        "no rank in the environment: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT \
         (torchrun style), or start under mpirun or srun, or use `syncopate launch`"
    )]
    NoRank,
    /// The launcher's world is not the job's.
    #[error(
        "{launcher} says the world has {given} processes, but --workers {workers} --servers \
         {servers} make {}", .workers + .servers
    )]
    WorldSize {
        /// The launcher that said so.
        launcher: &'static str,
        /// Its world size.
        given: usize,
        /// The job's workers.
        workers: usize,
        /// The job's servers.
        servers: usize,
    },
    /// A rank started as the other role.
    #[error(
        "rank {rank} is a {role} rank (workers are ranks 0..{workers}, servers the rest); \
         start it with `syncopate {role}`"
    )]
    WrongRole {
        /// The rank.
        rank: usize,
        /// What it is: `worker` or `server`.
        role: &'static str,
        /// The job's workers.
        workers: usize,
    },
    /// MASTER_ADDR does not resolve.
    #[error("resolving MASTER_ADDR {addr}")]
    Resolve {
        /// The address given.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// MASTER_ADDR resolves to nothing.
    #[error("MASTER_ADDR {0} has no address")]
    NoAddress(String),
    /// A negative or NaN `--stall-timeout`.
    #[error("--stall-timeout must be >= 0, got {0}")]
    StallTimeout(f64),
    /// A `--stall-timeout` too large for a duration.
    #[error(transparent)]
    Seconds(#[from] std::time::TryFromFloatSecsError),
}

/// Steps of a run: what the learning-rate schedule spans, on workers and servers alike
/// (`train_len` samples, `batch` per worker, `workers` workers).
pub fn steps_of(duration: TrainDuration, train_len: usize, batch: usize, workers: usize) -> u64 {
    match duration {
        TrainDuration::Steps(n) => n,
        TrainDuration::Epochs(e) => e * (train_len / (batch * workers).max(1)) as u64,
    }
}

/// The network in words, for the start-up banner and `config.toml`.
pub fn describe_network(p: &NetworkProfile) -> String {
    let bw = p.bandwidth_bps.map_or("unlimited".to_string(), |b| {
        format!("{:.3} Gbit/s", b / 1e9)
    });
    let loss = if p.is_lossy() {
        let unit = p
            .mtu_bytes
            .map_or("frame".to_string(), |m| format!("{m}-byte packet"));
        format!(
            ", loss {:.3} % per {unit} (rto {:.1} ms)",
            p.loss * 100.0,
            p.rto_ns as f64 / 1e6
        )
    } else {
        String::new()
    };
    let workers = p.worker_bandwidth_bps.map_or(String::new(), |b| {
        format!(" (workers' NICs {:.3} Gbit/s)", b / 1e9)
    });
    format!(
        "{bw}{workers}, latency {:.3} ms, send buffer {} KiB{loss}",
        p.latency_ns as f64 / 1e6,
        p.buffer_bytes / 1024
    )
}

/// Where a process stands in a job, from its launcher's variables.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Its rank.
    pub rank: Rank,
    /// The rendezvous address (MASTER_ADDR:MASTER_PORT).
    pub coordinator: SocketAddr,
    /// Whether it hosts the rendezvous: rank 0, unless `SYNCOPATE_EXTERNAL_COORDINATOR`
    /// says a launcher does.
    pub host_coordinator: bool,
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
    /// The stall timeout in nanoseconds (`None`: never): `seconds` (`--stall-timeout`; 0:
    /// never), or its default for a model of `params` parameters on the job's network.
    pub fn stall_timeout_ns(
        &self,
        seconds: Option<f64>,
        params: usize,
    ) -> Result<Option<u64>, JobError> {
        match seconds {
            Some(s) if s.is_nan() || s < 0.0 => Err(JobError::StallTimeout(s)),
            Some(0.0) => Ok(None),
            Some(s) => {
                let ns = u64::try_from(Duration::try_from_secs_f64(s)?.as_nanos());
                Ok(Some(ns.unwrap_or(u64::MAX)))
            }
            None => Ok(Some(LivenessConfig::default_stall_timeout_ns(
                params,
                self.network.bandwidth_bps,
            ))),
        }
    }

    /// The layout of a job: `sync` (its packets sized for `transport`) placed on
    /// `network`, every part checked, and `transport` checked against them.
    pub fn checked(
        sync: SyncPlan,
        network: NetworkProfile,
        net_seed: u64,
        transport: Transport,
    ) -> Result<Self, JobError> {
        transport.check(sync.strategy, &network)?;
        network.validate()?;
        sync.validate()?;
        Ok(JobLayout {
            sync,
            network,
            net_seed,
        })
    }

    /// This process's place in the job, from the launcher's variables in the environment,
    /// checked against the layout and the role it was started as (`worker`: a worker).
    pub fn placement(&self, worker: bool) -> Result<Placement, JobError> {
        let env = crate::env::from_env()?.ok_or(JobError::NoRank)?;
        if env.world_size != self.world_size() {
            return Err(JobError::WorldSize {
                launcher: env.source,
                given: env.world_size,
                workers: self.workers,
                servers: self.servers,
            });
        }
        let is_worker = env.rank < self.workers;
        if is_worker != worker {
            return Err(JobError::WrongRole {
                rank: env.rank,
                role: if is_worker { "worker" } else { "server" },
                workers: self.workers,
            });
        }
        let addr = env.master_addr.as_str();
        let coordinator = (addr, env.master_port)
            .to_socket_addrs()
            .map_err(|source| JobError::Resolve {
                addr: addr.to_string(),
                source,
            })?
            .next()
            .ok_or_else(|| JobError::NoAddress(addr.to_string()))?;
        let external = std::env::var_os("SYNCOPATE_EXTERNAL_COORDINATOR").is_some();
        Ok(Placement {
            rank: env.rank,
            coordinator,
            host_coordinator: env.rank == 0 && !external,
        })
    }

    /// The emulated network of process `rank`.
    pub fn emulation(&self, rank: Rank) -> crate::comm::Emulation {
        crate::comm::Emulation {
            profile: self.sync.nic_profile(rank, &self.network),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each process emulates its own NIC: the workers' rate on the workers, the profile's on
    /// the server; the banner names both; over UDP it is emulation, refused.
    #[test]
    fn a_worker_emulates_the_workers_nic_and_a_server_the_profiles() {
        let network = NetworkProfile {
            bandwidth_bps: Some(1e8),
            worker_bandwidth_bps: Some(1e10),
            ..NetworkProfile::default()
        };
        let plan = SyncPlan::new(StrategyKind::P3, 2, 1);
        let layout = JobLayout::checked(plan, network, 7, Transport::Tcp).unwrap();
        let bps = |rank| layout.emulation(rank).profile.bandwidth_bps;
        assert_eq!(
            [bps(0), bps(1), bps(2)],
            [Some(1e10), Some(1e10), Some(1e8)]
        );
        let banner = describe_network(&layout.network);
        assert!(
            banner.starts_with("0.100 Gbit/s (workers' NICs 10.000 Gbit/s)"),
            "{banner}"
        );
        let udp = Transport::Udp.check(StrategyKind::Dlcp, &layout.network);
        assert!(matches!(udp, Err(TransportError::Emulated)), "{udp:?}");
    }
}
