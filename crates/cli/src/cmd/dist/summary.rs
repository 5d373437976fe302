//! A distributed job's summary (`--summary-json`): what worker 0 writes, the files of the
//! servers and loss-tolerant workers beside it, and what `launch` adds from those.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use syncopate_core::strategy::{KeyLoss, LossStats};
use syncopate_core::wire::datagram::DatagramCounters;
use syncopate_report::summary::JobSummary;
use syncopate_runtime::comm::DatagramReport;
use syncopate_runtime::job::JobLayout;
use syncopate_runtime::worker::WorkerSummary;
use syncopate_train::trainer::Evaluation;

use super::JobArgs;

/// Writes worker 0's summary of the job to `path`; `command` names the command that ran
/// (`launch`, or `worker` started by hand).
pub(super) fn write_job_summary(
    path: &Path,
    command: &'static str,
    layout: &JobLayout,
    summary: &WorkerSummary,
    test: &Evaluation,
    args: &JobArgs,
) -> Result<()> {
    let file = JobSummary {
        command: command.into(),
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
        worker0: summary,
        settings: args,
        dlcp: None,
    };
    std::fs::write(path, serde_json::to_string_pretty(&file)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// Where a server or a loss-tolerant worker `rank` writes its own summary beside the job's
/// `summary` (`run.json` -> `run.server-2.json`, `run.worker-1.json`).
pub(super) fn member_summary_path(summary: &Path, role: &str, rank: usize) -> PathBuf {
    let stem = summary.file_stem().unwrap_or_default().to_string_lossy();
    summary.with_file_name(format!("{stem}.{role}-{rank}.json"))
}

/// Adds what the loss-tolerant receivers (dlcp's servers, dlcp-allreduce's workers) lost
/// and recovered, summed, to the job's summary:
/// `"dlcp": {entries, entries_filled, packets, ..., realised_loss}`.
pub(super) fn merge_loss_stats(summary: &Path, layout: &JobLayout) -> Result<()> {
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
            if !path.exists() {
                continue;
            }
            let worker = read_json(&path)?;
            if worker["loss"].is_null() {
                continue;
            }
            let loss: LossStats = serde_json::from_value(worker["loss"].clone())
                .with_context(|| format!("{}: no loss statistics", path.display()))?;
            total.add(&loss);
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
    eprintln!(
        "dlcp: realised loss {:.4} % of gradient values, {} packets ignored, {} probes answered",
        total.realised_loss() * 100.0,
        total.packets_ignored,
        total.probes_answered
    );
    Ok(())
}

/// Adds what every process's datagram path did (`--transport udp`), summed, to the job's
/// summary: `"datagrams": {sent, received, ..., bad_mac, replayed, ..., send_failures,
/// receive_buffer_drops}`.
/// Nothing without datagrams.
pub(super) fn merge_datagrams(summary: &Path, layout: &JobLayout) -> Result<()> {
    let mut total = DatagramCounters::default();
    let mut send_failures = 0;
    let mut buffer_drops = 0;
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
        let report: DatagramReport = serde_json::from_value(report.clone())
            .with_context(|| format!("{}: malformed datagrams", path.display()))?;
        total.add(&report.counters);
        send_failures += report.send_failures;
        buffer_drops += report.receive_buffer_drops.unwrap_or(0);
        found = true;
    }
    if !found {
        return Ok(());
    }
    let mut job = read_json(summary)?;
    let mut counts = serde_json::to_value(total)?;
    counts["send_failures"] = send_failures.into();
    counts["receive_buffer_drops"] = buffer_drops.into();
    job["datagrams"] = counts;
    write_json(summary, &job)?;
    eprintln!(
        "datagrams: {} sent, {} received, {} dropped on arrival, {} refused by the kernel, \
         {buffer_drops} dropped by a full receive buffer",
        total.sent,
        total.received,
        total.drops(),
        send_failures
    );
    Ok(())
}

/// A JSON file, read and parsed, with its path in any error.
fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes `value` as pretty JSON to `path`.
fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}
