//! Command-line arguments shared by several commands: training settings, the network model,
//! the peer timeout, and the parsers of durations and step windows. The synchronisation
//! flags have their own module, `sync_args`.

use std::ops::Range;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use syncopate_core::liveness::LivenessConfig;
use syncopate_core::net::{
    parse_bandwidth, parse_duration_ns, parse_probability, parse_size, Blackout, BurstLoss,
    NetworkProfile, DEFAULT_BLACKOUT_PERIOD_NS,
};
use syncopate_core::{LrSchedule, SgdConfig};
use syncopate_train::data::{self, Dataset, DatasetKind, SyntheticSpec};
use syncopate_train::trainer::{Duration, OptimConfig};

/// Datasets on the command line.
#[derive(Debug, Clone, Copy, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetArg {
    /// Seeded synthetic images, generated in memory (needs no files).
    Synthetic,
    /// MNIST digits from IDX files.
    Mnist,
    /// Fashion-MNIST from IDX files.
    FashionMnist,
    /// CIFAR-10 binary batches.
    Cifar10,
}

impl From<DatasetArg> for DatasetKind {
    fn from(d: DatasetArg) -> Self {
        match d {
            DatasetArg::Synthetic => DatasetKind::Synthetic,
            DatasetArg::Mnist => DatasetKind::Mnist,
            DatasetArg::FashionMnist => DatasetKind::FashionMnist,
            DatasetArg::Cifar10 => DatasetKind::Cifar10,
        }
    }
}

/// Learning-rate schedules on the command line.
#[derive(Debug, Clone, Copy, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleArg {
    /// The same rate throughout.
    Constant,
    /// Multiply by --lr-gamma every --lr-step-every steps.
    Step,
    /// Cosine annealing to 0 over the run.
    Cosine,
}

/// Model, data and optimisation settings of a training run.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct TrainSettings {
    /// Model to train (see `syncopate models`): mlp, lenet, resnet20, vgg-mini.
    #[arg(long, default_value = "lenet")]
    pub model: String,
    /// Dataset.
    #[arg(long, value_enum, default_value = "synthetic")]
    pub dataset: DatasetArg,
    /// Directory of the dataset's files. Default: $SYNCOPATE_DATA/<name>, ./data/<name>,
    /// ../shared/data/<name>, and for Fashion-MNIST /usr/share/datasets/fashion-mnist.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Train for this many epochs (default 1 when --steps is not given).
    #[arg(long, conflicts_with = "steps")]
    pub epochs: Option<u64>,
    /// Train for this many steps instead of whole epochs.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Samples per step (per worker in distributed runs).
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Base learning rate (with the default cosine schedule, LeNet reaches 98.9 % on MNIST
    /// in 2 epochs).
    #[arg(long, default_value_t = 0.02)]
    #[serde(serialize_with = "shortest_f32")]
    pub lr: f32,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    #[serde(serialize_with = "shortest_f32")]
    pub momentum: f32,
    /// L2 weight decay.
    #[arg(long, default_value_t = 0.0)]
    #[serde(serialize_with = "shortest_f32")]
    pub weight_decay: f32,
    /// Learning-rate schedule (cosine anneals to 0 over the run's steps).
    #[arg(long, value_enum, default_value = "cosine")]
    pub lr_schedule: ScheduleArg,
    /// Steps between decays of the `step` schedule.
    #[arg(long, default_value_t = 1000)]
    pub lr_step_every: u64,
    /// Decay factor of the `step` schedule.
    #[arg(long, default_value_t = 0.1)]
    #[serde(serialize_with = "shortest_f32")]
    pub lr_gamma: f32,
    /// Seed of initialisation, shuffling and synthetic data: same seed, same weights.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Training samples of the synthetic dataset.
    #[arg(long, default_value_t = 8192)]
    pub synthetic_samples: usize,
    /// Sample shape of the synthetic dataset as CxHxW (default: 3x32x32 for resnet20 and
    /// vgg-mini, 1x28x28 otherwise).
    #[arg(long, value_name = "CxHxW")]
    pub synthetic_shape: Option<String>,
}

impl TrainSettings {
    /// How long to train.
    pub fn duration(&self) -> Result<Duration> {
        match (self.epochs, self.steps) {
            (Some(0), _) | (_, Some(0)) => bail!("--epochs and --steps must be at least 1"),
            (_, Some(s)) => Ok(Duration::Steps(s)),
            (e, None) => Ok(Duration::Epochs(e.unwrap_or(1))),
        }
    }

    /// The optimizer settings, validated.
    pub fn optim(&self, total_steps: u64) -> Result<OptimConfig> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr must be a positive number, got {}", self.lr);
        }
        if !(0.0..1.0).contains(&self.momentum) {
            bail!("--momentum must be in [0, 1), got {}", self.momentum);
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            bail!("--weight-decay must be >= 0, got {}", self.weight_decay);
        }
        let schedule = match self.lr_schedule {
            ScheduleArg::Constant => LrSchedule::Constant,
            ScheduleArg::Step => LrSchedule::Step {
                every_steps: self.lr_step_every.max(1),
                gamma: self.lr_gamma,
            },
            ScheduleArg::Cosine => LrSchedule::Cosine {
                total_steps,
                min_lr: 0.0,
            },
        };
        Ok(OptimConfig {
            lr: self.lr,
            sgd: SgdConfig {
                momentum: self.momentum,
                weight_decay: self.weight_decay,
            },
            schedule,
        })
    }

    fn synthetic_shape(&self) -> Result<[usize; 3]> {
        match &self.synthetic_shape {
            Some(s) => parse_shape(s),
            None if matches!(self.model.as_str(), "resnet20" | "vgg-mini") => Ok([3, 32, 32]),
            None => Ok([1, 28, 28]),
        }
    }

    /// Loads the dataset these settings name.
    pub fn load_dataset(&self) -> Result<Dataset> {
        if self.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        let shape = self.synthetic_shape()?;
        let synthetic = SyntheticSpec {
            train_len: self.synthetic_samples,
            test_len: (self.synthetic_samples / 8).max(64),
            shape,
            seed: self.seed,
            ..SyntheticSpec::default()
        };
        let kind: DatasetKind = self.dataset.into();
        data::load(kind, self.data.as_deref(), &synthetic)
            .with_context(|| format!("loading dataset {}", kind.name()))
    }
}

/// Writes an `f32` as the shortest decimal that reads back as it (0.02, not
/// 0.019999999552965164), for resolved configs that people read.
fn shortest_f32<S: serde::Serializer>(v: &f32, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(v.to_string().parse::<f64>().unwrap_or(f64::from(*v)))
}

/// Parses `CxHxW`.
pub fn parse_shape(s: &str) -> Result<[usize; 3]> {
    let parts: Vec<usize> = s
        .split('x')
        .map(|p| p.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("shape '{s}' is not CxHxW (e.g. 3x32x32)"))?;
    match parts[..] {
        [c, h, w] if c > 0 && h > 0 && w > 0 => Ok([c, h, w]),
        _ => bail!("shape '{s}' is not CxHxW with three positive numbers (e.g. 3x32x32)"),
    }
}

/// The network model's settings on the command line, shared by every command that moves
/// frames (simulate, and the runtime's commands): a TOML profile (`--network FILE`), then
/// flags that override it. See the README section "Network model".
#[derive(Debug, Clone, Default, Args)]
pub struct NetworkArgs {
    /// Bandwidth of every host's NIC (and of each path unless the profile overrides it),
    /// e.g. 1gbit, 25gbit, unlimited. Frames serialise one after another at this rate.
    /// Default: the --network profile's, else the command's default.
    #[arg(long)]
    pub bandwidth: Option<String>,
    /// One-way latency of every link, added after serialisation, e.g. 50us, 1ms (default 0,
    /// or the --network profile's).
    #[arg(long)]
    pub latency: Option<String>,
    /// Send window of every NIC: the scheduler is asked for another frame only while fewer
    /// bytes than this are offered and not yet serialised, so a late urgent frame waits
    /// behind at most this much; also each reliable flow's socket, which takes no more frames
    /// once this much waits for its congestion window (default 256KiB, or the --network
    /// profile's).
    #[arg(long)]
    pub send_buffer: Option<String>,
    /// TOML network profile (bandwidth_bps, latency_ns, buffer_bytes, ingress, queue_bytes,
    /// queue_discipline, drop_threshold, loss, loss_burst, blackout, mtu_bytes, paths,
    /// [[path]], rto_ns, tcp); the other flags override it.
    #[arg(long, value_name = "FILE")]
    pub network: Option<PathBuf>,
    /// Also model the receiver's downlink: frames converging on one host (N workers pushing
    /// to a server) queue and serialise at its bandwidth, as at a switch port (incast).
    /// Default: off (only the sender's NIC is a bottleneck).
    #[arg(long)]
    pub ingress: bool,
    /// Capacity of each queue (per path at the sender, and at the receiver with --ingress),
    /// e.g. 1MiB; a frame that does not fit is dropped. Default: unbounded (no drops).
    #[arg(long, value_name = "BYTES")]
    pub queue: Option<String>,
    /// Queue discipline: fifo (first in first out, tail drop) or prio (strict priority over
    /// the frame's class 0..7, and frames marked drop-eligible dropped first once the queue
    /// passes --drop-threshold). Default: fifo.
    #[arg(long, value_name = "fifo|prio")]
    pub queue_discipline: Option<String>,
    /// prio only: fraction of the queue past which drop-eligible frames are dropped, in
    /// (0, 1] (default 0.5).
    #[arg(long, value_name = "FRACTION")]
    pub drop_threshold: Option<f64>,
    /// Random (Bernoulli) loss per frame on every path, e.g. 1% or 0.01, drawn from the
    /// job's --seed (same seed, same losses). With --loss-burst, the loss outside bursts.
    /// Default: 0.
    #[arg(long, value_name = "P")]
    pub loss: Option<String>,
    /// Bursty (Gilbert-Elliott) loss: P_ENTER,P_LEAVE,LOSS_IN_BURST, the per-frame chances
    /// of entering and leaving a burst and of losing a frame in one (mean burst 1/P_LEAVE
    /// frames), e.g. 0.001,0.2,50%. Default: none.
    #[arg(long, value_name = "P_ENTER,P_LEAVE,LOSS")]
    pub loss_burst: Option<String>,
    /// Timed outages: the network loses every packet, of every flow, for the last MS of
    /// each period, e.g. 20ms (once a second) or 50ms/2s, as the namespace testbed's
    /// --blackout (an nftables drop-all rule at the switch). Periods count from the job's
    /// start. Default: none.
    #[arg(long, value_name = "MS[/PERIOD]")]
    pub blackout: Option<String>,
    /// The IP MTU, e.g. 1500 (Ethernet): a frame crosses the network as packets of this
    /// size, each with its Ethernet, IP and TCP or UDP headers counted on the wire, and
    /// --loss and --loss-burst strike each packet (a reliable frame resends only its lost
    /// packets), so a 160 KB P3 slice is lost far more often than an 8 KiB DLCP packet.
    /// Default: none, frames without headers, each lost with --loss whatever its size.
    #[arg(long, value_name = "BYTES")]
    pub mtu: Option<String>,
    /// Paths between two hosts, each with its own serialiser (per-path bandwidth, latency
    /// and loss in the --network profile's [[path]] tables); a flow is hashed to one path
    /// (ECMP) unless its strategy sprays frames. Default: 1; at most 64.
    #[arg(long, value_name = "K")]
    pub paths: Option<usize>,
    /// Minimum retransmission timeout of the reliable (TCP-like) transport (Linux's
    /// rto_min): the timeout, srtt + max(4 rttvar, this) as Linux sets it, doubled at each
    /// further one, fires where no probe or SACK finds a loss. Default 200ms, Linux's; a datacenter-tuned
    /// stack would use a few ms or less.
    #[arg(long, value_name = "DURATION")]
    pub rto: Option<String>,
    /// Congestion control of the reliable (TCP-like) flows, named as the kernel names it:
    /// cubic (the window x 0.7 on a loss, cubic growth), bbr (paced at the delivery rate,
    /// random loss ignored) or reno (halved). Losses are repaired as Linux repairs them:
    /// SACK within a round trip, a tail loss probe, the timeout only when a resend is lost.
    /// Default: cubic, or the --network profile's `tcp`.
    #[arg(long, value_name = "cubic|bbr|reno")]
    pub tcp: Option<String>,
    /// The workers' NICs, both ways and on every path, where they differ from the servers'
    /// (--bandwidth), e.g. 10gbit: the servers' ports are the bottleneck, as the namespace
    /// testbed's --bottleneck shapes only the server's switch port. Strategies without
    /// servers keep --bandwidth on every host. Default: --bandwidth for every host.
    #[arg(long, value_name = "RATE")]
    pub worker_bandwidth: Option<String>,
}

impl NetworkArgs {
    /// The validated profile: the --network file (else the default profile with
    /// `default_bandwidth`), then every flag over it.
    pub fn resolve_with(&self, default_bandwidth: Option<f64>) -> Result<NetworkProfile> {
        let mut p = self.base(default_bandwidth)?;
        if let Some(b) = &self.bandwidth {
            p.bandwidth_bps = parse_bandwidth(b).context("--bandwidth")?;
        }
        p.validate()?;
        Ok(p)
    }

    /// [`NetworkArgs::resolve_with`] with an unlimited default bandwidth (the runtime's
    /// commands, once they flatten these flags).
    pub fn resolve(&self) -> Result<NetworkProfile> {
        self.resolve_with(None)
    }

    /// One validated profile per comma-separated `--bandwidth` (a sweep), with its label;
    /// a single profile without `--bandwidth`.
    pub fn resolve_sweep(
        &self,
        default_bandwidth: Option<f64>,
    ) -> Result<Vec<(String, NetworkProfile)>> {
        let Some(list) = &self.bandwidth else {
            let p = self.resolve_with(default_bandwidth)?;
            let label =
                (p.bandwidth_bps).map_or("unlimited".into(), |b| format!("{}gbit", b / 1e9));
            return Ok(vec![(label, p)]);
        };
        let base = self.base(default_bandwidth)?;
        list.split(',')
            .map(|b| {
                let mut p = base.clone();
                p.bandwidth_bps = parse_bandwidth(b.trim()).context("--bandwidth")?;
                p.validate()?;
                Ok((b.trim().to_string(), p))
            })
            .collect()
    }

    /// The file (or default) with every flag but --bandwidth applied, not yet validated.
    fn base(&self, default_bandwidth: Option<f64>) -> Result<NetworkProfile> {
        let mut p = match &self.network {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading network profile {}", path.display()))?;
                toml::from_str::<NetworkProfile>(&text)
                    .with_context(|| format!("network profile {}", path.display()))?
            }
            None => NetworkProfile {
                bandwidth_bps: default_bandwidth,
                ..NetworkProfile::default()
            },
        };
        if let Some(l) = &self.latency {
            p.latency_ns = parse_duration_ns(l).context("--latency")?;
        }
        if let Some(b) = &self.send_buffer {
            p.buffer_bytes = parse_size(b).context("--send-buffer")?;
        }
        p.ingress |= self.ingress;
        if let Some(q) = &self.queue {
            p.queue_bytes = Some(parse_size(q).context("--queue")?);
        }
        if let Some(d) = &self.queue_discipline {
            p.queue_discipline = d.parse()?;
        }
        if let Some(t) = self.drop_threshold {
            p.drop_threshold = t;
        }
        if let Some(l) = &self.loss {
            p.loss = parse_probability(l).context("--loss")?;
        }
        if let Some(b) = &self.loss_burst {
            p.loss_burst = Some(parse_burst(b)?);
        }
        if let Some(b) = &self.blackout {
            p.blackout = Some(parse_blackout(b)?);
        }
        if let Some(m) = &self.mtu {
            p.mtu_bytes = Some(parse_size(m).context("--mtu")? as f64);
        }
        if let Some(k) = self.paths {
            p.paths = k;
        }
        if let Some(r) = &self.rto {
            p.rto_ns = parse_duration_ns(r).context("--rto")?;
        }
        if let Some(cc) = &self.tcp {
            p.tcp = cc.parse()?;
        }
        if let Some(b) = &self.worker_bandwidth {
            p.worker_bandwidth_bps = parse_bandwidth(b).context("--worker-bandwidth")?;
        }
        Ok(p)
    }
}

/// Parses `--blackout DURATION[/PERIOD]` (a bare number is milliseconds, as the testbed's).
fn parse_blackout(s: &str) -> Result<Blackout> {
    let ms = |x: &str| {
        let x = x.trim();
        let text = if x.bytes().all(|c| c.is_ascii_digit()) {
            format!("{x}ms")
        } else {
            x.to_string()
        };
        parse_duration_ns(&text).with_context(|| format!("--blackout '{s}'"))
    };
    let (duration, period) = match s.split_once('/') {
        Some((d, p)) => (ms(d)?, ms(p)?),
        None => (ms(s)?, DEFAULT_BLACKOUT_PERIOD_NS),
    };
    Ok(Blackout {
        duration_ns: duration,
        period_ns: period,
    })
}

/// Parses `--loss-burst P_ENTER,P_LEAVE,LOSS_IN_BURST`.
fn parse_burst(s: &str) -> Result<BurstLoss> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [enter, leave, loss] = parts.as_slice() else {
        bail!("--loss-burst '{s}': expected P_ENTER,P_LEAVE,LOSS_IN_BURST, e.g. 0.001,0.2,50%");
    };
    let p = |x: &str| parse_probability(x).with_context(|| format!("--loss-burst '{s}'"));
    Ok(BurstLoss {
        p_enter: p(enter)?,
        p_leave: p(leave)?,
        loss_in_burst: p(loss)?,
    })
}

/// The longest duration a flag accepts: a week.
const MAX_FLAG_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// A duration flag in seconds: a finite number from 0 to a week.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
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

/// The liveness rules' flag, shared by `launch` and `simulate`'s faults.
#[derive(Debug, Clone, Args, Serialize, Deserialize)]
pub struct LivenessArgs {
    /// Declare a silent peer lost after this many seconds (heartbeats go every fifth of
    /// it, at most every 0.5 s).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds,
          default_value_t = LivenessConfig::default().peer_timeout_ns as f64 / 1e9)]
    pub peer_timeout: f64,
}

impl LivenessArgs {
    /// The core's liveness rules with this peer timeout.
    pub fn config(&self) -> Result<LivenessConfig> {
        if self.peer_timeout.is_nan() || self.peer_timeout <= 0.0 {
            bail!("--peer-timeout must be positive");
        }
        let timeout = std::time::Duration::from_secs_f64(self.peer_timeout);
        let timeout_ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        Ok(LivenessConfig::default().with_peer_timeout(timeout_ns))
    }
}

/// A window of steps, `A..B` on the command line (0-based, B excluded, A < B): the steps a
/// trace records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct StepWindow(pub Range<u64>);

impl std::str::FromStr for StepWindow {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let parsed = text
            .split_once("..")
            .and_then(|(a, b)| Some(a.trim().parse::<u64>().ok()?..b.trim().parse::<u64>().ok()?));
        match parsed {
            Some(r) if r.start < r.end => Ok(StepWindow(r)),
            _ => Err(format!("'{text}' is not A..B with A < B (e.g. 10..20)")),
        }
    }
}

impl TryFrom<String> for StepWindow {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<StepWindow> for String {
    fn from(w: StepWindow) -> String {
        format!("{}..{}", w.0.start, w.0.end)
    }
}

#[cfg(test)]
mod network_tests {
    use super::*;

    #[test]
    fn flags_override_the_default_and_are_validated() {
        let args = NetworkArgs {
            loss: Some("1%".into()),
            loss_burst: Some("0.001, 0.2, 50%".into()),
            queue: Some("64KiB".into()),
            queue_discipline: Some("prio".into()),
            paths: Some(2),
            rto: Some("2ms".into()),
            mtu: Some("1500".into()),
            ..NetworkArgs::default()
        };
        let p = args.resolve_with(Some(10e9)).unwrap();
        assert_eq!(p.mtu_bytes, Some(1500.0));
        assert_eq!(p.bandwidth_bps, Some(10e9));
        assert_eq!(p.loss, 0.01);
        assert_eq!(p.queue_bytes, Some(64 << 10));
        assert_eq!(p.rto_ns, 2_000_000);
        assert_eq!(p.loss_burst.map(|b| b.p_leave), Some(0.2));
        let bad = NetworkArgs {
            paths: Some(0),
            ..NetworkArgs::default()
        };
        assert!(format!("{:#}", bad.resolve().unwrap_err()).contains("--paths"));
        let bad = NetworkArgs {
            loss: Some("120%".into()),
            ..NetworkArgs::default()
        };
        assert!(format!("{:#}", bad.resolve().unwrap_err()).contains("--loss"));
        for mtu in ["0", "-5", "big"] {
            let bad = NetworkArgs {
                mtu: Some(mtu.into()),
                ..NetworkArgs::default()
            };
            assert!(format!("{:#}", bad.resolve().unwrap_err()).contains("--mtu"));
        }
        let sweep = NetworkArgs {
            bandwidth: Some("1gbit,10gbit".into()),
            ..NetworkArgs::default()
        };
        let s = sweep.resolve_sweep(Some(10e9)).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].1.bandwidth_bps, Some(1e9));
    }

    #[test]
    fn a_blackout_is_milliseconds_once_a_second_unless_told() {
        let blackout = |text: &str| {
            let args = NetworkArgs {
                blackout: Some(text.into()),
                ..NetworkArgs::default()
            };
            args.resolve().map(|p| p.blackout)
        };
        let b = |d: u64, p: u64| Some(Blackout::per_second(d).with_period(p));
        let ms = 1_000_000;
        assert_eq!(blackout("20").unwrap(), b(20 * ms, 1_000 * ms));
        assert_eq!(blackout("50ms/2s").unwrap(), b(50 * ms, 2_000 * ms));
        assert_eq!(blackout("5 / 100").unwrap(), b(5 * ms, 100 * ms));
        for bad in ["0", "1s", "20/10", "x", "20/"] {
            let e = format!("{:#}", blackout(bad).unwrap_err());
            assert!(e.contains("--blackout"), "{bad}: {e}");
        }
    }
}
