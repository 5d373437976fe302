//! A distributed job's summary (`--summary-json`): what worker 0 writes, the files of the
//! servers and loss-tolerant workers beside it, and what `launch` adds from those.

use std::path::{Path, PathBuf};

use serde::Serialize;
use syncopate_core::strategy::{KeyLoss, LossStats};
use syncopate_core::wire::datagram::DatagramCounters;
use syncopate_report::summary::JobSummary;
use syncopate_train::trainer::Evaluation;

use crate::comm::DatagramReport;
use crate::job::JobLayout;
use crate::server::ServerSummary;
use crate::worker::{OwnLoss, WorkerSummary};

/// Why a summary file could not be written, read or completed.
#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    /// A file could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// A file is not JSON.
    #[error("parsing {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A member's summary lacks a part `launch` adds up, or holds it malformed.
    #[error("{}: {what}", path.display())]
    Part {
        /// The member's file.
        path: PathBuf,
        /// What is wrong (`no loss statistics`, `malformed key_loss`, ...).
        what: &'static str,
        /// The decoder's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A summary could not be encoded as JSON.
    #[error("encoding a summary")]
    Encode(#[from] serde_json::Error),
}

/// What worker 0's summary of the job holds besides the layout and its own figures.
pub struct JobOutcome<'a, S> {
    /// The command that ran the job (`launch`, or `worker` started by hand).
    pub command: &'static str,
    /// Worker 0's summary.
    pub worker0: &'a WorkerSummary,
    /// Its final test evaluation.
    pub test: &'a Evaluation,
    /// `--target-accuracy`.
    pub target_accuracy: Option<f64>,
    /// The job's settings as given (its flags).
    pub settings: &'a S,
}

/// Writes worker 0's summary of the job to `path`.
pub fn write_job_summary<S: Serialize>(
    path: &Path,
    layout: &JobLayout,
    outcome: &JobOutcome<'_, S>,
) -> Result<(), SummaryError> {
    let (summary, test) = (outcome.worker0, outcome.test);
    let file = JobSummary {
        command: outcome.command.into(),
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
        target_accuracy: outcome.target_accuracy,
        time_to_accuracy_s: summary.time_to_accuracy,
        steps_to_accuracy: summary.steps_to_accuracy,
        average_accuracy: None,
        average_loss: None,
        divergence: None,
        bytes_per_step: summary.bytes_per_step,
        textbook_bytes_per_step: summary.textbook_bytes_per_step,
        worker0: summary,
        settings: outcome.settings,
        dlcp: None,
    };
    write_json(path, &file)
}

/// Where a server or a loss-tolerant worker `rank` writes its own summary beside the job's
/// `summary` (`run.json` -> `run.server-2.json`, `run.worker-1.json`).
pub fn member_summary_path(summary: &Path, role: &str, rank: usize) -> PathBuf {
    let stem = summary.file_stem().unwrap_or_default().to_string_lossy();
    summary.with_file_name(format!("{stem}.{role}-{rank}.json"))
}

/// A loss-tolerant worker's own losses and datagram counts, beside the job's `summary`
/// (for `launch` to add up); nothing for a worker that has neither.
pub fn write_worker_own(
    summary: &Path,
    rank: usize,
    worker: &WorkerSummary,
) -> Result<(), SummaryError> {
    match OwnLoss::of(rank, worker) {
        Some(own) => write_json(&member_summary_path(summary, "worker", rank), &own),
        None => Ok(()),
    }
}

/// Server `rank`'s summary, beside the job's `summary`.
pub fn write_server_own(
    summary: &Path,
    rank: usize,
    server: &ServerSummary,
) -> Result<(), SummaryError> {
    write_json(&member_summary_path(summary, "server", rank), server)
}

/// Adds what the loss-tolerant receivers (dlcp's servers, dlcp-allreduce's workers) lost
/// and recovered, summed, to the job's summary:
/// `"dlcp": {entries, entries_filled, packets, ..., realised_loss}`; returns the sums.
pub fn merge_loss_stats(summary: &Path, layout: &JobLayout) -> Result<LossStats, SummaryError> {
    let mut total = LossStats::default();
    let mut per_server = Vec::new();
    let (role, ranks) = if layout.strategy.uses_servers() {
        ("server", layout.workers..layout.world_size())
    } else {
        ("worker", 0..layout.workers)
    };
    for rank in ranks {
        let path = member_summary_path(summary, role, rank);
        let server = read_json(&path)?;
        total.add(&part(&path, &server["loss"], "no loss statistics")?);
        if let Some(keys) = server.get("key_loss") {
            per_server.push(part::<Vec<KeyLoss>>(&path, keys, "malformed key_loss")?);
        }
    }
    if layout.strategy.uses_servers() {
        // Workers with loss-tolerant pulls count the parameter values they kept stale.
        for rank in 0..layout.workers {
            let path = member_summary_path(summary, "worker", rank);
            if !path.exists() {
                continue;
            }
            let worker = read_json(&path)?;
            if worker["loss"].is_null() {
                continue;
            }
            total.add(&part(&path, &worker["loss"], "no loss statistics")?);
        }
    }
    let per_key: Vec<f64> = KeyLoss::sum(per_server)
        .iter()
        .map(KeyLoss::realised_loss)
        .collect();
    let mut job = read_json(summary)?;
    let mut stats = serde_json::to_value(total)?;
    stats["realised_loss"] = total.realised_loss().into();
    let steps = job["steps"].as_u64().unwrap_or(0).max(1);
    stats["probes_per_step"] = (total.probes_answered as f64 / steps as f64).into();
    stats["max_key_realised_loss"] = per_key.iter().copied().fold(0.0, f64::max).into();
    stats["realised_loss_per_key"] = per_key.into();
    job["dlcp"] = stats;
    write_json(summary, &job)?;
    Ok(total)
}

/// The job's loss statistics in one line.
pub fn describe_loss(total: &LossStats) -> String {
    format!(
        "dlcp: realised loss {:.4} % of gradient values, {} packets ignored, {} probes answered",
        total.realised_loss() * 100.0,
        total.packets_ignored,
        total.probes_answered
    )
}

/// What every process's datagram path did, summed.
#[derive(Debug, Clone, Copy, Default)]
pub struct DatagramTotals {
    /// Datagrams and bytes sent and received, and the drops by reason.
    pub counters: DatagramCounters,
    /// Datagrams the local kernels refused to send.
    pub send_failures: u64,
    /// Datagrams dropped by a full socket receive buffer.
    pub buffer_drops: u64,
}

impl DatagramTotals {
    /// The totals in one line.
    pub fn describe(&self) -> String {
        let c = &self.counters;
        format!(
            "datagrams: {} sent, {} received, {} dropped on arrival, {} refused by the kernel, \
             {} dropped by a full receive buffer",
            c.sent,
            c.received,
            c.drops(),
            self.send_failures,
            self.buffer_drops
        )
    }
}

/// Adds what every process's datagram path did (`--transport udp`), summed, to the job's
/// summary: `"datagrams": {sent, received, ..., bad_mac, replayed, ..., send_failures,
/// receive_buffer_drops}`, and returns the sums. Nothing (`None`) without datagrams.
pub fn merge_datagrams(
    summary: &Path,
    layout: &JobLayout,
) -> Result<Option<DatagramTotals>, SummaryError> {
    let mut total = DatagramTotals::default();
    let mut found = false;
    for rank in 0..layout.world_size() {
        let role = if rank < layout.workers {
            "worker"
        } else {
            "server"
        };
        let path = member_summary_path(summary, role, rank);
        if !path.exists() {
            continue;
        }
        let member = read_json(&path)?;
        let Some(report) = member.get("datagrams").filter(|d| !d.is_null()) else {
            continue;
        };
        let report: DatagramReport = part(&path, report, "malformed datagrams")?;
        total.counters.add(&report.counters);
        total.send_failures += report.send_failures;
        total.buffer_drops += report.receive_buffer_drops.unwrap_or(0);
        found = true;
    }
    if !found {
        return Ok(None);
    }
    let mut job = read_json(summary)?;
    let mut counts = serde_json::to_value(total.counters)?;
    counts["send_failures"] = total.send_failures.into();
    counts["receive_buffer_drops"] = total.buffer_drops.into();
    job["datagrams"] = counts;
    write_json(summary, &job)?;
    Ok(Some(total))
}

/// A part of the member summary at `path`, decoded; `what` names the fault.
fn part<T: serde::de::DeserializeOwned>(
    path: &Path,
    value: &serde_json::Value,
    what: &'static str,
) -> Result<T, SummaryError> {
    serde_json::from_value(value.clone()).map_err(|source| SummaryError::Part {
        path: path.to_path_buf(),
        what,
        source,
    })
}

/// A JSON file, read and parsed, with its path in any error.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, SummaryError> {
    let text = std::fs::read_to_string(path).map_err(|source| SummaryError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| SummaryError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `value` as pretty JSON to `path`.
fn write_json(path: &Path, value: &impl Serialize) -> Result<(), SummaryError> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(path, text).map_err(|source| SummaryError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_write_beside_the_job_summary() {
        let p = member_summary_path(Path::new("/runs/a/run.json"), "server", 2);
        assert_eq!(p, Path::new("/runs/a/run.server-2.json"));
    }
}
