//! Datasets: IDX (MNIST, Fashion-MNIST), CIFAR-10 binary batches and a seeded synthetic set;
//! deterministic sharded sampling and a prefetching loader.

mod cifar;
mod idx;
mod loader;
mod sampler;
mod synthetic;

use std::path::{Path, PathBuf};

pub use cifar::load_cifar10;
pub use idx::load_idx_pair;
pub use loader::Loader;
pub use sampler::EpochSampler;
pub use synthetic::SyntheticSpec;

use crate::error::{Result, TrainError};

/// One split of a labelled image dataset, held in memory as normalised `f32` (NCHW).
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// `len * channels * height * width` values, already normalised.
    pub images: Vec<f32>,
    /// One class index per sample.
    pub labels: Vec<u8>,
    /// Shape of one sample: `[channels, height, width]`.
    pub shape: [usize; 3],
}

impl Split {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split holds no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values in one sample.
    pub fn sample_len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Gathers the samples at `indices` into a batch.
    pub fn gather(&self, indices: &[usize]) -> Batch {
        let n = self.sample_len();
        let mut images = Vec::with_capacity(indices.len() * n);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend_from_slice(&self.images[i * n..(i + 1) * n]);
            labels.push(self.labels[i]);
        }
        Batch {
            images,
            labels,
            shape: self.shape,
        }
    }
}

/// A batch of samples ready for the engine: labelled images in memory, as a [`Split`]
/// holds them (a batch is a small split, gathered from a larger one).
pub type Batch = Split;

/// A dataset with its training and test splits.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Short name (`mnist`, `synthetic`, ...), recorded in run outputs.
    pub name: String,
    /// Training split.
    pub train: Split,
    /// Test split.
    pub test: Split,
    /// Number of classes.
    pub classes: usize,
}

/// The datasets Syncopate knows how to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// Deterministic seeded synthetic images (the embedded default; needs no files).
    Synthetic,
    /// MNIST handwritten digits (IDX files).
    Mnist,
    /// Fashion-MNIST (IDX files, same layout as MNIST).
    FashionMnist,
    /// CIFAR-10 binary version (`data_batch_{1..5}.bin`, `test_batch.bin`).
    Cifar10,
}

impl DatasetKind {
    /// The name used on the command line and in outputs.
    pub fn name(self) -> &'static str {
        match self {
            DatasetKind::Synthetic => "synthetic",
            DatasetKind::Mnist => "mnist",
            DatasetKind::FashionMnist => "fashion-mnist",
            DatasetKind::Cifar10 => "cifar10",
        }
    }

    /// Places searched, in order, when no `--data` directory is given.
    pub fn default_dirs(self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let Some(root) = std::env::var_os("SYNCOPATE_DATA") {
            dirs.push(PathBuf::from(root).join(self.name()));
        }
        dirs.push(PathBuf::from("data").join(self.name()));
        dirs.push(PathBuf::from("../shared/data").join(self.name()));
        if self == DatasetKind::FashionMnist {
            dirs.push(PathBuf::from("/usr/share/datasets/fashion-mnist"));
        }
        dirs
    }

    /// Per-channel normalisation constants (mean, std) applied after scaling to [0, 1].
    fn normalisation(self) -> (f32, f32) {
        match self {
            DatasetKind::Mnist => (0.1307, 0.3081),
            DatasetKind::FashionMnist => (0.2860, 0.3530),
            DatasetKind::Cifar10 => (0.4734, 0.2516),
            DatasetKind::Synthetic => (0.0, 1.0),
        }
    }
}

/// Loads `kind` from `dir` (or the default places when `dir` is `None`).
///
/// The synthetic set ignores `dir` and is generated from `synthetic`.
pub fn load(kind: DatasetKind, dir: Option<&Path>, synthetic: &SyntheticSpec) -> Result<Dataset> {
    if kind == DatasetKind::Synthetic {
        return Ok(synthetic.generate());
    }
    let dirs = match dir {
        Some(d) => vec![d.to_path_buf()],
        None => kind.default_dirs(),
    };
    let found = dirs.iter().find(|d| d.is_dir());
    let Some(dir) = found else {
        return Err(TrainError::DatasetNotFound {
            dataset: kind.name().into(),
            looked_for: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            hint: hint_for(kind),
        });
    };
    let (mean, std) = kind.normalisation();
    let (train, test, classes) = match kind {
        DatasetKind::Mnist | DatasetKind::FashionMnist => {
            let train = load_idx_pair(dir, "train", mean, std)?;
            let test = load_idx_pair(dir, "t10k", mean, std)?;
            (train, test, 10)
        }
        DatasetKind::Cifar10 => {
            let (train, test) = load_cifar10(dir, mean, std)?;
            (train, test, 10)
        }
        DatasetKind::Synthetic => unreachable!("handled above"),
    };
    check_labels(&train, classes, dir)?;
    check_labels(&test, classes, dir)?;
    Ok(Dataset {
        name: kind.name().into(),
        train,
        test,
        classes,
    })
}

fn check_labels(split: &Split, classes: usize, dir: &Path) -> Result<()> {
    if let Some(bad) = split.labels.iter().find(|&&l| usize::from(l) >= classes) {
        return Err(TrainError::BadData {
            path: dir.to_path_buf(),
            reason: format!("label {bad} outside the {classes} classes"),
        });
    }
    Ok(())
}

fn hint_for(kind: DatasetKind) -> String {
    match kind {
        DatasetKind::FashionMnist => "Pass --data DIR holding the IDX files (train-images-idx3-ubyte[.gz], ...), or `apt-get install dataset-fashion-mnist`.".into(),
        DatasetKind::Mnist => "Pass --data DIR holding the IDX files (train-images-idx3-ubyte[.gz], ...), or set SYNCOPATE_DATA.".into(),
        DatasetKind::Cifar10 => "Pass --data DIR holding the CIFAR-10 binary batches (data_batch_1.bin ... test_batch.bin).".into(),
        DatasetKind::Synthetic => String::new(),
    }
}
