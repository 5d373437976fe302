//! A job's `config.toml` in its metrics folder: every setting it ran with and what they
//! resolved to (written by `launch`), and then what worker 0's tuner chose.

use std::io::Write as _;
use std::path::Path;

use serde::Serialize;
use syncopate_core::net::NetworkProfile;
use syncopate_core::tune::TuneReport;

use crate::file_error::FileError;
use crate::job::{describe_network, JobLayout};

/// Why `config.toml` could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file or folder could not be created, opened, written or replaced.
    #[error(transparent)]
    Io(#[from] FileError),
    /// The configuration could not be encoded as TOML.
    #[error("encoding the {what}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's reason.
        #[source]
        source: toml::ser::Error,
    },
}

/// What `config.toml` in a job's --metrics-dir holds: every flag with its default filled
/// in, and what the flags resolved to.
#[derive(Serialize)]
struct ResolvedConfig<'a, S> {
    sync: ResolvedSync,
    job: &'a S,
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

/// Writes the job's resolved configuration as `dir/config.toml`: `settings` (the job's
/// flags, defaults filled in) as its `[job]` table, and what `layout` resolved them to as
/// its `[sync]` table.
pub fn write_resolved_config<S: Serialize>(
    dir: &Path,
    settings: &S,
    layout: &JobLayout,
) -> Result<(), ConfigError> {
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
        job: settings,
    };
    std::fs::create_dir_all(dir).map_err(FileError::of("creating", dir))?;
    let path = dir.join("config.toml");
    let text = toml::to_string_pretty(&config).map_err(|source| ConfigError::Encode {
        what: "resolved config",
        source,
    })?;
    std::fs::write(&path, text).map_err(FileError::of("writing", &path))?;
    Ok(())
}

/// One line on what the tuner chose, with the chosen credit's measured step time
/// (`scale`: the job's --scale factor, 1 without it).
pub fn describe_tuning(tune: &TuneReport, scale: f64) -> String {
    let best = tune
        .trials
        .iter()
        .filter(|t| t.credit_bytes == tune.chosen.credit_bytes)
        .map(|t| t.step_seconds)
        .next_back()
        .map_or(String::new(), |s| format!("; {s:.3} s a step"));
    format!("autotune: {}{best}", tune.describe(scale))
}

/// Appends worker 0's tuning outcome to the run's `dir/config.toml` as its `[autotune]`
/// table (the chosen settings first, then every candidate measured).
pub fn record_tuning(dir: &Path, tune: &TuneReport) -> Result<(), ConfigError> {
    #[derive(Serialize)]
    struct Table<'a> {
        autotune: &'a TuneReport,
    }
    let path = dir.join("config.toml");
    let text = toml::to_string_pretty(&Table { autotune: tune }).map_err(|source| {
        ConfigError::Encode {
            what: "autotune outcome",
            source,
        }
    })?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(FileError::of("opening", &path))?;
    writeln!(
        file,
        "\n# Chosen by worker 0's tuner (--autotune) during the run.\n{text}"
    )
    .map_err(FileError::of("writing", &path))?;
    Ok(())
}
