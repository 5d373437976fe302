//! `syncopate launch`, `syncopate worker` and `syncopate server`: distributed training.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use syncopate_core::liveness::LivenessConfig;
use syncopate_core::net::{parse_size, NetworkProfile};

use crate::args::NetworkArgs;
use syncopate_core::sched::SchedulerKind;
use syncopate_core::step::Straggler;
use syncopate_core::strategy::{
    Averaged, KeyLoss, LossStats, SyncPlan, DEFAULT_BUCKET_BYTES, DEFAULT_CREDIT_BYTES,
    MESH_MAX_WORKERS,
};
use syncopate_core::tune::TuneReport;
use syncopate_report::summary::JobSummary;
use syncopate_runtime::auth::{AuthError, JobToken};
use syncopate_runtime::checkpoint::CheckpointPlan;
use syncopate_runtime::comm::CommOptions;
use syncopate_runtime::env;
use syncopate_runtime::job::{JobLayout, MetricsOptions, ProcessContext, StrategyKind};
use syncopate_runtime::launch::{launch, LaunchPlan, LAUNCH_GRACE};
use syncopate_runtime::server::{run_server, ServerPlan};
use syncopate_runtime::trace::merge_traces;
use syncopate_runtime::worker::{run_worker, WorkerPlan};
use syncopate_train::checkpoint;
use syncopate_train::engine::{BurnEngine, ProfileEngine};
use syncopate_train::model;
use syncopate_train::trainer::Duration as TrainDuration;

use super::replicas;
use crate::args::{scheduler_parser, strategy_parser, DlcpArgs, StepwiseArgs, TrainSettings};
use crate::progress::{RankNotices, TrainProgress};

/// Everything a distributed job needs; `launch`, `worker` and `server` take the same flags.
#[derive(Debug, Clone, Args, Serialize)]
pub struct JobArgs {
    #[command(flatten)]
    pub settings: TrainSettings,
    /// Synchronisation strategy.
    #[arg(long, value_parser = strategy_parser(), default_value = StrategyKind::Allreduce.name())]
    pub strategy: StrategyKind,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Parameter-server processes (ps strategies only).
    #[arg(long, default_value_t = 0)]
    pub servers: usize,
    /// The emulated network (default: unlimited bandwidth, lossless); the resolved profile
    /// is recorded in config.toml's `sync.network`.
    #[command(flatten)]
    #[serde(skip)]
    pub net: NetworkArgs,
    /// Bucket size in MB of the ring strategies (allreduce, ring-reduce, stepwise; the
    /// default is PyTorch DDP's).
    #[arg(long, default_value_t = DEFAULT_BUCKET_BYTES as f64 / 1e6)]
    pub bucket_mb: f64,
    #[command(flatten)]
    pub stepwise: StepwiseArgs,
    #[command(flatten)]
    pub dlcp: DlcpArgs,
    /// Order of the frames on every link (default: the strategy's, listed with --strategy's
    /// values). Also applies to ps and allreduce, so each P3 mechanism can be switched on
    /// alone.
    #[arg(long, value_parser = scheduler_parser())]
    pub scheduler: Option<SchedulerKind>,
    /// Parameter-server slice size in parameters (default: the strategy's, listed with
    /// --strategy's values; never more than a frame).
    #[arg(long)]
    pub slice_params: Option<usize>,
    /// Credit of the credit scheduler: bytes pushed and not yet answered, e.g. 640KB.
    #[arg(long, default_value_t = DEFAULT_CREDIT_BYTES.to_string())]
    pub credit_bytes: String,
    /// Tune the credit online (--scheduler credit only), as ByteScheduler does: each
    /// worker measures candidates on a doubling grid from one slice to the whole model,
    /// starting at --credit-bytes, three steps each (one to settle, two timed), keeps the
    /// fastest, and searches again when its steps stay 25 % slower for 5 steps. The chosen
    /// credit and every candidate go to summary.json and config.toml (`[autotune]`).
    #[arg(long)]
    pub autotune: bool,
    /// All-reduce with 3 to 8 workers: link every worker to every other and send small
    /// buckets (n copies within 128 KiB) straight to each, one hop instead of n-1 around the
    /// ring; large buckets still go around the ring. Pays where a hop costs network latency
    /// (2x at 100 us a link); over loopback on few cores it is slower (docs/BENCHMARKS.md).
    #[arg(long)]
    pub mesh: bool,
    /// Scale profile models down: every tensor, every bandwidth, slices, buckets, credit,
    /// send window and queues are multiplied by this factor (e.g. 1/16) while compute times
    /// stay, so the communication-to-computation ratio is the full-size model's at
    /// --bandwidth.
    #[arg(long, value_name = "F")]
    pub scale: Option<String>,
    /// Job token as 64 hex digits (default: $SYNCOPATE_TOKEN, then --token-file,
    /// then $SYNCOPATE_TOKEN_FILE; `launch` generates one).
    #[arg(long, hide_env_values = true)]
    #[serde(skip)]
    pub token: Option<String>,
    /// File holding the job token.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Declare a silent peer lost after this many seconds.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    pub peer_timeout: f64,
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
    /// Protect every frame's integrity after the handshake: each frame carries a MAC (keyed
    /// BLAKE3 under a key of its connection and direction, over its number, header and
    /// payload), so a frame altered, replayed, reordered or dropped on the way stops the job
    /// with an error naming the peer. Without it only connections are authenticated (see
    /// the README's trust model). Off by default: hashing costs CPU time per byte, about
    /// 40 % of all-reduce bus bandwidth over loopback at 100 MiB, and nothing measurable on
    /// an emulated 1 Gbit/s link (docs/BENCHMARKS.md). Every process must be given the same.
    #[arg(long)]
    pub frame_mac: bool,
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
    /// every N steps into --checkpoint-dir (or the --resume folder), keeping the last two.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: Option<u64>,
    /// Folder of the job's checkpoints (`step-<S>/rank-<R>.safetensors` and a manifest per
    /// process). `launch` also keeps a generated job token there (job.token), so that
    /// --resume can run under the same token.
    #[arg(long, value_name = "DIR", requires = "checkpoint_every")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Restart the job from the newest checkpoint in DIR that every process completed; the
    /// run goes on to the same --steps/--epochs and ends with the weights an uninterrupted
    /// run would have had. A checkpoint of another model, strategy, worker or server count
    /// or token is refused.
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
    pub trace_steps: Option<String>,
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

/// The longest duration a flag accepts: a week.
const MAX_FLAG_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// A duration flag in seconds: a finite number from 0 to a week.
pub(crate) fn parse_seconds(text: &str) -> Result<f64, String> {
    let s: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !s.is_finite() || !(0.0..=MAX_FLAG_SECONDS).contains(&s) {
        return Err(format!(
            "{text} s is not a duration from 0 to {MAX_FLAG_SECONDS} s (a week)"
        ));
    }
    Ok(s)
}

impl JobArgs {
    fn layout(&self) -> Result<JobLayout> {
        let factor = self.scale_factor()?;
        let network = self.net.resolve()?.scaled(factor);
        let layout = JobLayout {
            sync: self.sync_plan()?.scaled(factor),
            network,
            net_seed: self.settings.seed,
        };
        layout.network.validate()?;
        layout.validate()?;
        Straggler::check(&self.slow_worker, self.workers)?;
        Ok(layout)
    }

    /// The synchronisation flags over the strategy's defaults, at full size.
    fn sync_plan(&self) -> Result<SyncPlan> {
        if self.bucket_mb.is_nan() || self.bucket_mb <= 0.0 {
            bail!("--bucket-mb must be positive");
        }
        if self.mesh && !self.strategy.can_mesh(self.workers) {
            bail!(
                "--mesh links the workers of a ring all-reduce in a full mesh: it needs \
                 --strategy allreduce or allreduce-no-overlap and 3 to {MESH_MAX_WORKERS} workers \
                 (with 2 the ring already links both)"
            );
        }
        let defaults = SyncPlan::new(self.strategy, self.workers, self.servers);
        let plan = self.stepwise.apply(SyncPlan {
            scheduler: self.scheduler.unwrap_or(defaults.scheduler),
            slice_params: self.slice_params.unwrap_or(defaults.slice_params),
            credit_bytes: parse_size(&self.credit_bytes)?,
            bucket_bytes: (self.bucket_mb * 1e6) as usize,
            autotune: self.autotune,
            mesh: self.mesh,
            ..defaults
        })?;
        self.dlcp.apply(plan)
    }

    /// `--trace-steps A..B` as a range.
    fn trace_window(&self) -> Result<Option<std::ops::Range<u64>>> {
        let Some(text) = &self.trace_steps else {
            return Ok(None);
        };
        let parsed = text
            .split_once("..")
            .and_then(|(a, b)| Some(a.trim().parse::<u64>().ok()?..b.trim().parse::<u64>().ok()?));
        match parsed {
            Some(r) if r.start < r.end => Ok(Some(r)),
            _ => bail!("--trace-steps '{text}' is not A..B with A < B (e.g. 10..20)"),
        }
    }

    /// `--scale` as a factor in (0, 1]; 1 without it.
    fn scale_factor(&self) -> Result<f64> {
        let Some(text) = &self.scale else {
            return Ok(1.0);
        };
        if !model::is_profile_name(&self.settings.model) {
            bail!(
                "--scale applies to profile:NAME models only (the model is {})",
                self.settings.model
            );
        }
        let parsed = match text.split_once('/') {
            Some((a, b)) => a
                .trim()
                .parse::<f64>()
                .and_then(|a| b.trim().parse::<f64>().map(|b| a / b)),
            None => text.trim().parse::<f64>(),
        };
        match parsed {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
            _ => bail!("--scale '{text}' is not a factor in (0, 1] such as 1/16 or 0.25"),
        }
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

    fn comm_options(&self) -> Result<CommOptions> {
        if self.peer_timeout.is_nan() || self.peer_timeout <= 0.0 {
            bail!("--peer-timeout must be positive");
        }
        let timeout = Duration::from_secs_f64(self.peer_timeout);
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Ok(CommOptions {
            liveness: LivenessConfig::default().with_peer_timeout(timeout_ns),
            busy_poll: Duration::from_micros(self.busy_poll_us),
            frame_mac: self.frame_mac,
            ..CommOptions::default()
        })
    }

    /// `--checkpoint-every N` into `--checkpoint-dir` (or, resuming, the `--resume` folder).
    fn checkpoint_plan(&self) -> Result<Option<CheckpointPlan>> {
        let Some(every) = self.checkpoint_every else {
            return Ok(None);
        };
        let Some(dir) = self.checkpoint_dir.as_ref().or(self.resume.as_ref()) else {
            bail!("--checkpoint-every needs --checkpoint-dir DIR (or --resume DIR) to write into");
        };
        Ok(Some(CheckpointPlan {
            dir: dir.clone(),
            every,
        }))
    }

    /// The folder where `launch` keeps a generated token for the job's checkpoints.
    fn token_home(&self) -> Option<&std::path::Path> {
        self.checkpoint_dir.as_deref().or(self.resume.as_deref())
    }

    /// The job's token for `launch`: the given one, else (with checkpoints) the one kept in
    /// the checkpoint folder, made and kept there on the first run; `None`: a fresh one.
    fn launch_token(&self) -> Result<Option<JobToken>> {
        if let Some(token) = self.given_token()? {
            return Ok(Some(token));
        }
        if let Some(dir) = self.resume.as_deref().filter(|d| !d.is_dir()) {
            bail!("--resume {}: no such folder", dir.display());
        }
        let Some(dir) = self.token_home() else {
            return Ok(None);
        };
        let path = dir.join("job.token");
        if path.exists() {
            return Ok(Some(JobToken::resolve(None, Some(&path))?));
        }
        if self.resume.is_some() && self.checkpoint_dir.is_none() {
            bail!(
                "{} has no job.token: resume with the job's --token or --token-file",
                dir.display()
            );
        }
        let token = JobToken::generate();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_secret(&path, &token.to_hex())?;
        Ok(Some(token))
    }

    /// The token given with `--token`, `--token-file` or the environment (`None`: `launch`
    /// makes a fresh one).
    fn given_token(&self) -> Result<Option<JobToken>> {
        match JobToken::resolve(self.token.as_deref(), self.token_file.as_deref()) {
            Ok(token) => Ok(Some(token)),
            Err(AuthError::NoToken) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// `--stall-timeout` in nanoseconds, or its default for a model of `params` parameters.
    fn stall_timeout(&self, params: usize, layout: &JobLayout) -> Result<Option<u64>> {
        match self.stall_timeout {
            Some(s) if s.is_nan() || s < 0.0 => bail!("--stall-timeout must be >= 0, got {s}"),
            Some(0.0) => Ok(None),
            Some(s) => {
                let ns = u64::try_from(Duration::try_from_secs_f64(s)?.as_nanos());
                Ok(Some(ns.unwrap_or(u64::MAX)))
            }
            None => Ok(Some(LivenessConfig::default_stall_timeout_ns(
                params,
                layout.network.bandwidth_bps,
            ))),
        }
    }
}

/// What `config.toml` in a job's --metrics-dir holds: every flag with its default filled
/// in, and what the flags resolved to.
#[derive(Serialize)]
struct ResolvedConfig<'a> {
    sync: ResolvedSync,
    job: &'a JobArgs,
}

/// The synchronisation settings a job runs with, after defaults and --scale.
#[derive(Serialize)]
struct ResolvedSync {
    strategy: &'static str,
    scheduler: &'static str,
    descriptor: String,
    slice_params: usize,
    credit_bytes: usize,
    bucket_bytes: usize,
    /// The network in words (an absent bandwidth_bps below means unlimited).
    network_summary: String,
    network: NetworkProfile,
}

/// Writes the job's resolved configuration as `dir/config.toml`.
fn write_resolved_config(dir: &std::path::Path, args: &JobArgs, layout: &JobLayout) -> Result<()> {
    let config = ResolvedConfig {
        sync: ResolvedSync {
            strategy: layout.strategy.name(),
            scheduler: layout.scheduler.name(),
            descriptor: layout.sync_descriptor(),
            slice_params: layout.slice_params,
            credit_bytes: layout.credit_bytes,
            bucket_bytes: layout.bucket_bytes,
            network_summary: describe_network(&layout.network),
            network: layout.network.clone(),
        },
        job: args,
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("config.toml");
    let text = toml::to_string_pretty(&config).context("encoding the resolved config")?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// `syncopate launch`: every process of the job on this machine.
pub fn launch_cmd(args: JobArgs) -> Result<()> {
    let layout = args.layout()?;
    args.trace_window()?;
    args.checkpoint_plan()?;
    let token = args.launch_token()?;
    if let Some(t) = args.target_accuracy {
        if !(t > 0.0 && t <= 1.0) {
            bail!("--target-accuracy {t} is not a fraction in (0, 1] (e.g. 0.97)");
        }
    }
    if let Some(dir) = &args.metrics_dir {
        write_resolved_config(dir, &args, &layout)?;
    }
    if model::is_profile_name(&args.settings.model) && args.settings.steps.is_none() {
        bail!("profile models replay compute only: give --steps N");
    }
    let exe = std::env::current_exe().context("locating the syncopate executable")?;
    // Everything after `launch` is passed on unchanged: the processes parse the same flags.
    let mut forwarded: Vec<_> = std::env::args_os().skip(2).collect();
    let replicas = replicas::snapshot_dir(&args)?;
    if let (Some(dir), None) = (&replicas, &args.replica_dir) {
        forwarded.push("--replica-dir".into());
        forwarded.push(dir.clone().into_os_string());
    }
    let scale = match &args.scale {
        Some(f) => format!(" (model scaled by {f}: bytes and bandwidth)"),
        None => String::new(),
    };
    eprintln!(
        "launching {} worker(s) and {} server(s), {}, network {}{scale}",
        layout.workers,
        layout.servers,
        layout.sync_descriptor(),
        describe_network(&layout.network)
    );
    if layout.strategy.averages() == Averaged::Weights {
        eprintln!("{}", describe_mixing(&layout));
    }
    launch(&LaunchPlan {
        exe,
        args: forwarded,
        subcommands: ["worker".into(), "server".into()],
        workers: layout.workers,
        servers: layout.servers,
        connect_timeout: Duration::from_secs_f64(args.connect_timeout.max(1.0)),
        grace: LAUNCH_GRACE,
        token,
    })?;
    if let Some(dir) = &replicas {
        replicas::report(&args, layout.workers, dir)?;
    }
    if let (Some(path), true) = (&args.summary_json, layout.strategy.loss_tolerant()) {
        merge_loss_stats(path, &layout)?;
    }
    if let (Some(dir), Some(_)) = (&args.metrics_dir, &args.trace_steps) {
        if let Some(path) = merge_traces(dir).context("merging the processes' traces")? {
            eprintln!(
                "timeline: {} (open it in https://ui.perfetto.dev)",
                path.display()
            );
        }
    }
    Ok(())
}

fn describe_network(p: &NetworkProfile) -> String {
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
    format!(
        "{bw}, latency {:.3} ms, send buffer {} KiB{loss}",
        p.latency_ns as f64 / 1e6,
        p.buffer_bytes / 1024
    )
}

/// What an approximate strategy's mixing amounts to, for the start-up banner.
fn describe_mixing(layout: &JobLayout) -> String {
    let sync = match layout.full_sync_every {
        0 => "never".to_string(),
        h => format!("every {h} steps"),
    };
    format!(
        "{} averages weights, not gradients (approximate): chain head {}, exact average {sync}; \
         effective number of contributors {:.2} of {} workers",
        layout.strategy.name(),
        layout.stepwise_head.name(),
        layout.effective_contributors(),
        layout.workers
    )
}

fn context(args: &JobArgs, layout: &JobLayout, want_worker: bool) -> Result<ProcessContext> {
    let env = env::from_env()?.ok_or_else(|| {
        anyhow::anyhow!(
            "no rank in the environment: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT \
             (torchrun style), or start under mpirun or srun, or use `syncopate launch`"
        )
    })?;
    if env.world_size != layout.world_size() {
        bail!(
            "{} says the world has {} processes, but --workers {} --servers {} make {}",
            env.source,
            env.world_size,
            layout.workers,
            layout.servers,
            layout.world_size()
        );
    }
    let is_worker = env.rank < layout.workers;
    if is_worker != want_worker {
        bail!(
            "rank {} is a {} rank (workers are ranks 0..{}, servers the rest); start it with `syncopate {}`",
            env.rank,
            if is_worker { "worker" } else { "server" },
            layout.workers,
            if is_worker { "worker" } else { "server" }
        );
    }
    let coordinator: SocketAddr = (env.master_addr.as_str(), env.master_port)
        .to_socket_addrs()
        .with_context(|| format!("resolving MASTER_ADDR {}", env.master_addr))?
        .next()
        .with_context(|| format!("MASTER_ADDR {} has no address", env.master_addr))?;
    let token = JobToken::resolve(args.token.as_deref(), args.token_file.as_deref())?;
    let external = std::env::var_os("SYNCOPATE_EXTERNAL_COORDINATOR").is_some();
    Ok(ProcessContext {
        rank: env.rank,
        token,
        coordinator,
        host_coordinator: env.rank == 0 && !external,
        bind_ip: args.bind.unwrap_or_else(|| local_ip_towards(coordinator)),
        connect_timeout: Duration::from_secs_f64(args.connect_timeout.max(1.0)),
        comm: args.comm_options()?,
        metrics: match &args.metrics_dir {
            Some(dir) => Some(MetricsOptions {
                dir: dir.clone(),
                interval: Duration::from_secs_f64(args.metrics_interval.max(0.01)),
                trace_steps: args.trace_window()?,
            }),
            None => None,
        },
    })
}

/// Writes `text` to a new file at `path` that only its owner may read.
fn write_secret(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// The local address that routes to `peer` (no packet is sent).
fn local_ip_towards(peer: SocketAddr) -> IpAddr {
    if peer.ip().is_loopback() {
        return IpAddr::V4(Ipv4Addr::LOCALHOST);
    }
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect(peer).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
}

/// Steps of a run: what the learning-rate schedule spans, on workers and servers alike.
fn steps_of(duration: TrainDuration, train_len: usize, batch: usize, workers: usize) -> u64 {
    match duration {
        TrainDuration::Steps(n) => n,
        TrainDuration::Epochs(e) => e * (train_len / (batch * workers).max(1)) as u64,
    }
}

/// `syncopate worker`.
pub fn worker_cmd(args: JobArgs) -> Result<()> {
    let layout = args.layout()?;
    let mut ctx = context(&args, &layout, true)?;
    let s = &args.settings;
    let duration = s.duration()?;
    let (spec, data) = args.model_and_data()?;
    ctx.comm.liveness.stall_timeout_ns = args.stall_timeout(spec.num_params(), &layout)?;
    let steps_hint = steps_of(duration, data.train.len(), s.batch_size, layout.workers);
    let plan = WorkerPlan {
        batch_size: s.batch_size,
        duration,
        optim: s.optim(steps_hint)?,
        seed: s.seed,
        load: args.load.clone(),
        // A job with a metrics directory keeps its final weights there (real models only).
        save: match (&args.save, &args.metrics_dir) {
            _ if ctx.rank != 0 => None,
            (Some(path), _) => Some(path.clone()),
            (None, Some(dir)) if !spec.is_profile() => Some(dir.join("weights.safetensors")),
            _ => None,
        },
        eval_every: args.eval_every,
        replica_dir: args.replica_dir.clone(),
        target_accuracy: args.target_accuracy,
        slowdown: Straggler::slowdown(&args.slow_worker, ctx.rank),
        checkpoint: args.checkpoint_plan()?,
        resume: args.resume.clone(),
    };
    let test_len = data.test.len();
    let mut progress = TrainProgress::new(steps_hint, args.quiet);
    let mut notices = RankNotices { rank: ctx.rank };
    let observer: &mut dyn syncopate_train::trainer::Observer = if ctx.rank == 0 {
        &mut progress
    } else {
        &mut notices
    };
    let summary = if spec.is_profile() {
        let engine = ProfileEngine::new(spec.clone(), s.seed)?;
        run_worker(&ctx, &layout, engine, data, &plan, observer)
    } else {
        let engine = BurnEngine::new(spec.clone(), s.seed)?;
        run_worker(&ctx, &layout, engine, data, &plan, observer)
    };
    progress.finish();
    let summary = summary?;
    if let (Some(path), Some(loss)) = (&args.summary_json, &summary.loss) {
        let path = member_summary_path(path, "worker", ctx.rank);
        let own =
            serde_json::json!({ "rank": ctx.rank, "loss": loss, "key_loss": summary.key_loss });
        std::fs::write(&path, serde_json::to_string_pretty(&own)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if ctx.rank != 0 {
        return Ok(());
    }
    let test = summary
        .test
        .unwrap_or(syncopate_train::trainer::Evaluation {
            accuracy: f64::NAN,
            loss: f64::NAN,
            samples: test_len,
        });
    println!(
        "done: {} steps, {:.0} samples/s over {} workers, final loss {:.4}, test accuracy {:.2} % \
         (compute {:.1} s, waiting on communication {:.1} s)",
        summary.steps,
        summary.samples_per_sec,
        layout.workers,
        summary.final_loss,
        test.accuracy * 100.0,
        summary.times.compute,
        summary.times.wait
    );
    if let Some(target) = args.target_accuracy {
        match (summary.time_to_accuracy, summary.steps_to_accuracy) {
            (Some(t), Some(step)) => println!(
                "reached {:.2} % test accuracy after {t:.1} s of training (step {step})",
                target * 100.0
            ),
            _ => println!(
                "never reached {:.2} % test accuracy (evaluations: every epoch{})",
                target * 100.0,
                args.eval_every
                    .map_or(String::new(), |n| format!(" and every {n} steps"))
            ),
        }
    }
    if let Some(tune) = &summary.autotune {
        println!("{}", describe_tuning(tune, args.scale_factor()?));
        if let Some(dir) = &args.metrics_dir {
            record_tuning(dir, tune)?;
        }
    }
    if let Some(path) = &args.summary_json {
        let file = JobSummary {
            command: "launch".into(),
            strategy: layout.strategy.name().into(),
            exact: layout.strategy.exact(),
            averages: layout.strategy.averages(),
            effective_contributors: layout.effective_contributors(),
            workers: layout.workers,
            servers: layout.servers,
            network: layout.network.clone(),
            frames_lost: Some(summary.network.frames_lost),
            frames_retransmitted: Some(summary.network.frames_retransmitted),
            frames_dropped: Some(summary.network.frames_dropped),
            test_accuracy: test.accuracy,
            test_loss: test.loss,
            final_loss: summary.final_loss,
            steps: summary.steps,
            wall_seconds: summary.train_seconds,
            samples_per_sec: summary.samples_per_sec,
            epoch_accuracy: summary.epoch_accuracy.clone(),
            target_accuracy: args.target_accuracy,
            time_to_accuracy_s: summary.time_to_accuracy,
            steps_to_accuracy: summary.steps_to_accuracy,
            average_accuracy: None,
            average_loss: None,
            divergence: None,
            bytes_per_step: summary.bytes_per_step,
            textbook_bytes_per_step: summary.textbook_bytes_per_step,
            worker0: &summary,
            settings: &args,
            dlcp: None,
        };
        std::fs::write(path, serde_json::to_string_pretty(&file)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One line on what the tuner chose, with the chosen credit's measured step time.
fn describe_tuning(tune: &TuneReport, scale: f64) -> String {
    let best = tune
        .trials
        .iter()
        .filter(|t| t.credit_bytes == tune.chosen.credit_bytes)
        .map(|t| t.step_seconds)
        .next_back()
        .map_or(String::new(), |s| format!("; {s:.3} s a step"));
    format!("autotune: {}{best}", tune.describe(scale))
}

/// Appends worker 0's tuning outcome to the run's `config.toml` as its `[autotune]` table
/// (the chosen settings first, then every candidate measured).
fn record_tuning(dir: &std::path::Path, tune: &TuneReport) -> Result<()> {
    #[derive(Serialize)]
    struct Table<'a> {
        autotune: &'a TuneReport,
    }
    let path = dir.join("config.toml");
    let text = toml::to_string_pretty(&Table { autotune: tune })
        .context("encoding the autotune outcome")?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    use std::io::Write as _;
    writeln!(
        file,
        "\n# Chosen by worker 0's tuner (--autotune) during the run.\n{text}"
    )
    .with_context(|| format!("writing {}", path.display()))
}

/// `syncopate server`.
pub fn server_cmd(args: JobArgs) -> Result<()> {
    let layout = args.layout()?;
    let ctx = context(&args, &layout, false)?;
    let s = &args.settings;
    // The server reads the dataset only to know the run's length in steps, which the
    // learning-rate schedule it applies depends on (exactly as the workers compute it).
    let (spec, data) = args.model_and_data()?;
    let initial = match &args.load {
        Some(path) => checkpoint::load_values(&spec, path)?,
        None => spec.init_params(s.seed),
    };
    let steps_hint = steps_of(
        s.duration()?,
        data.train.len(),
        s.batch_size,
        layout.workers,
    );
    let plan = ServerPlan {
        initial,
        optim: s.optim(steps_hint)?,
        steps: steps_hint,
        checkpoint: args.checkpoint_plan()?,
        resume: args.resume.clone(),
    };
    let summary = run_server(&ctx, &layout, &spec, plan)?;
    tracing::info!(
        updates = summary.updates,
        peak_early_values = summary.peak_early_values,
        "server done"
    );
    if let Some(loss) = &summary.loss {
        tracing::info!(
            realised_loss = loss.realised_loss(),
            packets = loss.packets,
            ignored = loss.packets_ignored,
            probes = loss.probes_answered,
            "loss-tolerant pushes"
        );
    }
    if let Some(path) = &args.summary_json {
        let path = member_summary_path(path, "server", ctx.rank);
        std::fs::write(&path, serde_json::to_string_pretty(&summary)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Where a server or a loss-tolerant worker `rank` writes its own summary beside the job's
/// `summary` (`run.json` -> `run.server-2.json`, `run.worker-1.json`).
fn member_summary_path(summary: &std::path::Path, role: &str, rank: usize) -> PathBuf {
    let stem = summary.file_stem().unwrap_or_default().to_string_lossy();
    summary.with_file_name(format!("{stem}.{role}-{rank}.json"))
}

/// Adds what the loss-tolerant receivers (dlcp's servers, dlcp-allreduce's workers) lost
/// and recovered, summed, to the job's summary:
/// `"dlcp": {entries, entries_filled, packets, ..., realised_loss}`.
fn merge_loss_stats(summary: &std::path::Path, layout: &JobLayout) -> Result<()> {
    let mut total = LossStats::default();
    let mut per_server = Vec::new();
    let (role, ranks) = if layout.strategy.uses_servers() {
        ("server", layout.workers..layout.world_size())
    } else {
        ("worker", 0..layout.workers)
    };
    for rank in ranks {
        let path = member_summary_path(summary, role, rank);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let server: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let loss: LossStats = serde_json::from_value(server["loss"].clone())
            .with_context(|| format!("{}: no loss statistics", path.display()))?;
        total.add(&loss);
        if let Some(keys) = server.get("key_loss") {
            let keys: Vec<KeyLoss> = serde_json::from_value(keys.clone())
                .with_context(|| format!("{}: malformed key_loss", path.display()))?;
            per_server.push(keys);
        }
    }
    if layout.strategy.uses_servers() {
        // Workers with loss-tolerant pulls count the parameter values they kept stale.
        for rank in 0..layout.workers {
            let path = member_summary_path(summary, "worker", rank);
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let worker: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            let loss: LossStats = serde_json::from_value(worker["loss"].clone())
                .with_context(|| format!("{}: no loss statistics", path.display()))?;
            total.add(&loss);
        }
    }
    let per_key: Vec<f64> = KeyLoss::sum(per_server)
        .iter()
        .map(KeyLoss::realised_loss)
        .collect();
    let text = std::fs::read_to_string(summary)
        .with_context(|| format!("reading {}", summary.display()))?;
    let mut job: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", summary.display()))?;
    let mut stats = serde_json::to_value(total)?;
    stats["realised_loss"] = total.realised_loss().into();
    let steps = job["steps"].as_u64().unwrap_or(0).max(1);
    stats["probes_per_step"] = (total.probes_answered as f64 / steps as f64).into();
    stats["max_key_realised_loss"] = per_key.iter().copied().fold(0.0, f64::max).into();
    stats["realised_loss_per_key"] = per_key.into();
    job["dlcp"] = stats;
    std::fs::write(summary, serde_json::to_string_pretty(&job)? + "\n")
        .with_context(|| format!("writing {}", summary.display()))?;
    eprintln!(
        "dlcp: realised loss {:.4} % of gradient values, {} packets ignored, {} probes answered",
        total.realised_loss() * 100.0,
        total.packets_ignored,
        total.probes_answered
    );
    Ok(())
}
