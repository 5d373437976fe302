//! `syncopate launch`, `syncopate worker` and `syncopate server`: distributed training.
//! This module holds the job's flags and turns them into the runtime's settings
//! (`syncopate_runtime::job` and `::outcome` decide what they mean); `launch`, `worker` and `server` have a
//! module each.

#[cfg(test)]
mod frame_mac_tests;
mod launch;
mod server;
mod worker;

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use syncopate_core::net::NetworkProfile;
use syncopate_core::step::Straggler;
use syncopate_core::strategy::SyncPlan;
use syncopate_runtime::auth::JobToken;
use syncopate_runtime::checkpoint::{CheckpointPlan, JobFolders, TrainingFlags, WeightSettings};
use syncopate_runtime::comm::CommOptions;
use syncopate_runtime::job::{JobLayout, MetricsOptions, ProcessContext, Transport};
use syncopate_runtime::process::local_ip_towards;
use syncopate_train::model;
use syncopate_train::trainer::OptimConfig;

use crate::args::{parse_seconds, LivenessArgs, NetworkArgs, StepWindow, TrainSettings};
use crate::sync_args::{transport_parser, SyncArgs};

pub use launch::launch_cmd;
pub use server::server_cmd;
pub use worker::worker_cmd;

/// Frame integrity after the handshake, as `launch`, `worker`, `server` and `bench-comm`
/// take it: on unless `--no-frame-mac`.
#[derive(Debug, Clone, Copy, Args, Serialize, Deserialize)]
pub struct FrameMacArgs {
    /// Send frames after the handshake without MACs. By default every frame carries one
    /// (keyed BLAKE3 under a key of its connection and direction, over its number, header
    /// and payload), so a frame injected, altered, replayed, reordered or dropped on the way
    /// stops the job with an error naming the peer; without them only connections are
    /// authenticated (see the README's trust model). Hashing costs CPU time per byte: 1-3 %
    /// of training jobs on a 2-core machine, 37-63 % of a raw all-reduce's bus bandwidth
    /// over its loopback (docs/BENCHMARKS.md, "Frame MACs"). Every process of a job must be
    /// given the same.
    #[arg(long = "no-frame-mac", action = clap::ArgAction::SetFalse)]
    #[serde(rename = "frame_mac")]
    enabled: bool,
    /// Frame MACs on: the default, accepted so that a command may say so.
    #[arg(long = "frame-mac", conflicts_with = "enabled")]
    #[serde(skip)]
    explicitly_on: bool,
}

impl FrameMacArgs {
    /// Whether every frame is tagged and checked.
    pub fn on(&self) -> bool {
        self.enabled
    }
}

/// Everything a distributed job needs; `launch`, `worker` and `server` take the same flags.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct JobArgs {
    #[command(flatten)]
    pub settings: TrainSettings,
    #[command(flatten)]
    pub sync: SyncArgs,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// The emulated network (default: unlimited bandwidth, lossless); the resolved profile
    /// is recorded in config.toml's `sync.network`.
    #[command(flatten)]
    #[serde(skip)]
    pub net: NetworkArgs,
    /// Job token as 64 hex digits (default: $SYNCOPATE_TOKEN, then --token-file,
    /// then $SYNCOPATE_TOKEN_FILE; `launch` generates one).
    #[arg(long, hide_env_values = true)]
    #[serde(skip)]
    pub token: Option<String>,
    /// File holding the job token.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub liveness: LivenessArgs,
    /// A worker gives up when nothing of a step's synchronisation arrives for this many
    /// seconds although every peer is alive (a protocol stall). Default: 120 s plus four
    /// times the time the model's bytes take through the emulated interface. 0: never.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub stall_timeout: Option<f64>,
    /// After moving any byte, the communication thread keeps polling its sockets without
    /// sleeping for this many microseconds (lower latency for small frames, at the cost of
    /// CPU time taken from compute); 0: it sleeps until something happens.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 0)]
    pub busy_poll_us: u64,
    #[command(flatten)]
    #[serde(flatten)]
    pub frame_mac: FrameMacArgs,
    /// How loss-tolerant packets travel (DLCP's pushes and loss-tolerant pulls,
    /// dlcp-allreduce's hops). tcp: on the TCP links with every other frame, where the
    /// emulation flags (--loss, --queue, ...) decide their fate. udp: as UDP datagrams the
    /// real network may drop, each authenticated under its link's keys, paced by a
    /// congestion controller, marked with its priority class in the IP DSCP field and
    /// sprayed over the --paths; the handshake, control and reliable frames stay on TCP.
    /// A packet is then one datagram that fits a 1500-byte MTU (--packet-bytes at most
    /// 1388, the default). For dlcp and dlcp-allreduce on a real (or kernel-shaped)
    /// network; every process of the job needs the same.
    #[arg(long, value_parser = transport_parser(), default_value = "tcp")]
    pub transport: Transport,
    /// With --transport udp: this process's address on each path, comma-separated, one
    /// per --paths (default: the address it accepts links on; on loopback 127.0.0.1,
    /// 127.0.0.2, ... one per path).
    #[arg(long, value_name = "IP[,IP...]", value_delimiter = ',')]
    pub udp_addrs: Vec<IpAddr>,
    /// With --transport udp: the datagram rate controller's settings, a TOML file with any
    /// of initial_bps, min_bps, max_bps, additive_bps, beta, t_low_ns, t_high_ns,
    /// feedback_timeout_floor_ns and burst_bytes (numbers; the others keep their defaults,
    /// documented in crates/core/src/net/rate.rs). For comparing controllers; every
    /// process may be given its own.
    #[arg(long, value_name = "FILE")]
    pub rate_control: Option<PathBuf>,
    /// Make worker RANK a straggler: its compute takes FACTOR (>= 1) times as long (the real
    /// engine waits out the difference after every layer; profiles stretch their times).
    /// Repeat the flag for several.
    #[arg(long = "slow-worker", value_name = "RANK:FACTOR")]
    pub slow_worker: Vec<Straggler>,
    /// Seconds the processes get to find each other.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds)]
    pub connect_timeout: f64,
    /// Address to accept peer connections on (default: the one that reaches MASTER_ADDR).
    #[arg(long)]
    pub bind: Option<IpAddr>,
    /// Initial weights (safetensors).
    #[arg(long, value_name = "FILE")]
    pub load: Option<PathBuf>,
    /// Where worker 0 saves the final weights.
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,
    /// Every process writes its state (weights, momentum, steps done; servers their shards)
    /// every N steps into --checkpoint-dir (or the --resume folder), keeping the two newest
    /// steps every process completed and any newer ones.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: Option<u64>,
    /// Folder of the job's checkpoints (`step-<S>/rank-<R>.safetensors` and a manifest per
    /// process). Unless given a token (--token, --token-file, $SYNCOPATE_TOKEN), `launch`
    /// also keeps the one it generates there (job.token, mode 0600), so that --resume can
    /// run under the same token. A job started afresh refuses a folder that already holds
    /// step folders (another job's) unless given --replace-checkpoints.
    #[arg(long, value_name = "DIR", requires = "checkpoint_every")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Delete the step folders (`step-<S>/`, every rank's state, record and manifest) that
    /// another job left in --checkpoint-dir, instead of refusing to start there. The job's
    /// token file and other files stay.
    #[arg(long, requires = "checkpoint_dir")]
    pub replace_checkpoints: bool,
    /// The run id under which a job started afresh writes its checkpoints (`launch` makes a
    /// fresh one; a resumed job goes on under its checkpoint's).
    #[arg(long, value_name = "HEX", hide = true)]
    pub run_id: Option<String>,
    /// Restart the job from the newest checkpoint in DIR that every process completed; the
    /// run goes on to the same --steps/--epochs and ends with the weights an uninterrupted
    /// run would have had. A checkpoint of another model, strategy, worker or server count
    /// or token, or written with other settings that change the weights (slicing, buckets,
    /// DLCP bounds, batch size, learning rate and schedule, momentum, seed, dataset), is
    /// refused before training, naming each difference.
    #[arg(long, value_name = "DIR", conflicts_with = "load")]
    pub resume: Option<PathBuf>,
    /// Every process samples its CPU, memory, disk and network into
    /// DIR/metrics-rank<R>.csv.
    #[arg(long, value_name = "DIR")]
    pub metrics_dir: Option<PathBuf>,
    /// Seconds between resource samples.
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
    pub metrics_interval: f64,
    /// Record a timeline of these steps (e.g. 10..20, 0-based, end excluded) into
    /// --metrics-dir: one trace-rank<R>.json per worker, merged by `launch` into trace.json
    /// (Chrome trace format; open it in Perfetto).
    #[arg(long, value_name = "A..B", requires = "metrics_dir")]
    pub trace_steps: Option<StepWindow>,
    /// Worker 0 also evaluates the test set every N steps (besides after every epoch and
    /// after the last step); the time spent evaluating (and writing replica snapshots) is
    /// left out of every training time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub eval_every: Option<u64>,
    /// Test accuracy to reach (a fraction, e.g. 0.97): the summary's time_to_accuracy_s is
    /// the training time until the first evaluation at or above it (pair with --eval-every).
    #[arg(long, value_name = "F")]
    pub target_accuracy: Option<f64>,
    /// Where worker 0 writes the job's final figures as JSON.
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// No replica statistics. By default (real models: there is a test set) every worker
    /// writes its weights at each evaluation point, and after the job `launch` evaluates
    /// their exact average and measures how far apart they are: evals-rank0.csv gains the
    /// columns average_accuracy, average_loss and divergence (mean over workers of
    /// |x_i - avg|^2 / |avg|^2), --summary-json the same per evaluation and for the last.
    #[arg(long, conflicts_with = "replica_dir")]
    pub no_replica_stats: bool,
    /// Keep the replica snapshots once `launch` has used them (they are removed otherwise).
    #[arg(long)]
    pub keep_replicas: bool,
    /// Folder of the replica snapshots (step-000050-rank1.f32: every parameter in key order,
    /// flat little-endian f32). `launch` uses this, else METRICS_DIR/replicas, else a
    /// temporary folder, and passes it to the workers; a worker without it writes none.
    #[arg(long, value_name = "DIR")]
    pub replica_dir: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The flags of `worker` and `server`: the job's, or the job `launch` resolved and handed
/// to the processes it starts.
#[derive(Debug, Clone, Args)]
pub struct MemberArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// The job as `launch` resolved it (JSON), given by `launch` to the processes it starts
    /// in place of its flags.
    #[arg(long, hide = true, value_name = "JSON")]
    pub launched_job: Option<String>,
}

/// What `launch` hands every process it starts: the job's flags with what it filled in,
/// and the synchronisation plan and network it resolved and checked them to (after
/// --scale), so no process parses or resolves them again.
#[derive(Serialize, Deserialize)]
struct LaunchedJob {
    job: JobArgs,
    sync: SyncPlan,
    network: NetworkProfile,
}

/// A job as one process runs it: its flags, and the layout they resolve to.
struct Job {
    args: JobArgs,
    layout: JobLayout,
    /// Whether `launch` started this process (and resolved the job for it).
    launched: bool,
}

impl MemberArgs {
    /// The job: the one `launch` handed over, else the flags' own.
    fn job(self) -> Result<Job> {
        let Some(text) = &self.launched_job else {
            let layout = self.job.layout()?;
            let args = self.job;
            return Ok(Job {
                args,
                layout,
                launched: false,
            });
        };
        let handed: LaunchedJob =
            serde_json::from_str(text).context("--launched-job: not the job `launch` resolves")?;
        let layout = JobLayout {
            sync: handed.sync,
            network: handed.network,
            net_seed: handed.job.settings.seed,
        };
        Ok(Job {
            args: handed.job,
            layout,
            launched: true,
        })
    }
}

impl JobArgs {
    /// The job's layout: the synchronisation plan and the network, checked and scaled.
    pub(crate) fn layout(&self) -> Result<JobLayout> {
        let factor = self.scale_factor()?;
        let network = self.net.resolve()?.scaled(factor);
        let strategy = self.sync.strategy()?;
        let sync = self
            .sync
            .plan_on(strategy, self.workers, 0, self.transport)?
            .scaled(factor);
        let layout = JobLayout::checked(sync, network, self.settings.seed, self.transport)?;
        Straggler::check(&self.slow_worker, self.workers)?;
        Ok(layout)
    }

    /// `--scale` as a factor in (0, 1]; 1 without it.
    fn scale_factor(&self) -> Result<f64> {
        let Some(factor) = self.sync.scale else {
            return Ok(1.0);
        };
        if !model::is_profile_name(&self.settings.model) {
            bail!(
                "--scale applies to profile:NAME models only (the model is {})",
                self.settings.model
            );
        }
        Ok(factor)
    }

    /// The model and the data it trains on: a real model with its dataset, or a compute
    /// profile with a tiny placeholder dataset (its batches only set the step's sample count).
    pub(crate) fn model_and_data(
        &self,
    ) -> Result<(model::ModelSpec, syncopate_train::data::Dataset)> {
        let s = &self.settings;
        if model::is_profile_name(&s.model) {
            if s.steps.is_none() {
                bail!("profile models replay compute only: give --steps N");
            }
            let spec = model::profile_model(&s.model, 1.0 / self.scale_factor()?)?;
            let data = syncopate_train::data::SyntheticSpec {
                train_len: s.batch_size.max(1) * self.workers.max(1),
                test_len: 1,
                shape: [1, 1, 1],
                classes: 2,
                noise: 1.0,
                seed: s.seed,
            }
            .generate();
            return Ok((spec, data));
        }
        let data = s.load_dataset()?;
        let spec = model::build(&s.model, data.train.shape, data.classes)?;
        Ok((spec, data))
    }

    /// The communication thread's options: the liveness rules, polling and frame MACs.
    fn comm_options(&self) -> Result<CommOptions> {
        Ok(CommOptions {
            liveness: self.liveness.config()?,
            busy_poll: Duration::from_micros(self.busy_poll_us),
            frame_mac: self.frame_mac.on(),
            ..CommOptions::default()
        })
    }

    /// `--checkpoint-dir` and `--resume`.
    fn folders(&self) -> JobFolders<'_> {
        JobFolders {
            checkpoint_dir: self.checkpoint_dir.as_deref(),
            resume: self.resume.as_deref(),
        }
    }

    /// `--checkpoint-every N` into `--checkpoint-dir` (or, resuming, the `--resume` folder).
    fn checkpoint_plan(&self) -> Result<Option<CheckpointPlan>> {
        let plan = self.folders().plan(
            self.checkpoint_every,
            self.replace_checkpoints,
            self.run_id.as_deref(),
        )?;
        Ok(plan)
    }

    /// The training settings that change the weights, as the job's checkpoints record them
    /// (with `optim`, the optimizer they resolve to).
    fn weight_settings(&self, optim: &OptimConfig) -> WeightSettings {
        let s = &self.settings;
        TrainingFlags {
            optim,
            batch_size: s.batch_size,
            seed: s.seed,
            dataset: s.dataset.into(),
            synthetic_samples: s.synthetic_samples,
            synthetic_shape: s.synthetic_shape.as_deref(),
        }
        .weight_settings()
    }
}

/// This process's place in the job (its rank from the environment, checked against the
/// layout and the role it was started as), the token, the coordinator and its options.
fn context(args: &JobArgs, layout: &JobLayout, want_worker: bool) -> Result<ProcessContext> {
    let place = layout.placement(want_worker)?;
    let token = JobToken::resolve(args.token.as_deref(), args.token_file.as_deref())?;
    let bind_ip = args
        .bind
        .unwrap_or_else(|| local_ip_towards(place.coordinator));
    let mut comm = args.comm_options()?;
    comm.datagram = args.transport.datagram_options(
        &args.udp_addrs,
        args.rate_control.as_deref(),
        layout.network.paths,
        bind_ip,
    )?;
    Ok(ProcessContext {
        rank: place.rank,
        token,
        coordinator: place.coordinator,
        host_coordinator: place.host_coordinator,
        bind_ip,
        connect_timeout: Duration::from_secs_f64(args.connect_timeout.max(1.0)),
        comm,
        metrics: args.metrics_dir.as_ref().map(|dir| MetricsOptions {
            dir: dir.clone(),
            interval: Duration::from_secs_f64(args.metrics_interval.max(0.01)),
            trace_steps: args.trace_steps.clone().map(|w| w.0),
        }),
    })
}
