//! Command-line arguments shared by every command that trains, and the values of
//! `--strategy` and `--scheduler`, taken from the core's lists.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, ValueEnum};
use serde::Serialize;
use syncopate_core::sched::SchedulerKind;
use syncopate_core::strategy::StrategyKind;
use syncopate_core::{LrSchedule, SgdConfig};
use syncopate_train::data::{self, Dataset, DatasetKind, SyntheticSpec};
use syncopate_train::trainer::{Duration, OptimConfig};

/// Datasets on the command line.
#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
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
#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
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
#[derive(Debug, Clone, Args, Serialize)]
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

/// Values of `--strategy`: the core's strategies by name, each listed in `--help` with its
/// summary.
pub fn strategy_parser() -> impl TypedValueParser<Value = StrategyKind> {
    let values = StrategyKind::ALL.map(|s| PossibleValue::new(s.name()).help(s.summary()));
    PossibleValuesParser::new(values).try_map(|name| {
        StrategyKind::from_name(&name).ok_or_else(|| format!("unknown strategy '{name}'"))
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
