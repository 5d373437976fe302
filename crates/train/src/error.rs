//! Errors of the training crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading data, building a model or training it.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A dataset file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A dataset file exists but its contents are not what its format requires.
    #[error("{path}: {reason}")]
    BadData {
        /// The offending file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// No dataset files were found where they were looked for.
    #[error("dataset {dataset} not found: looked for {looked_for}. {hint}")]
    DatasetNotFound {
        /// Name of the dataset.
        dataset: String,
        /// The paths that were tried.
        looked_for: String,
        /// How to obtain it.
        hint: String,
    },
    /// A model name that does not exist, or a model that does not fit the data.
    #[error("{0}")]
    Model(String),
    /// A parameter key outside the model, or a value buffer of the wrong length.
    #[error("{0}")]
    Param(String),
    /// A checkpoint that cannot be read or does not match the model.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The tensor backend refused an operation (it should not; this names what was tried).
    #[error("tensor backend: {0}")]
    Backend(String),
    /// Invalid user settings (batch size 0, shard outside the world, ...).
    #[error("{0}")]
    Config(String),
}

/// Result alias of the training crate.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;
