//! `syncopate transfer`: transfers through the network model alone (no strategy, no
//! compute), in bulk or as messages, the model's half of the calibration ladder
//! (`scripts/calibrate-net.sh`).

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use syncopate_core::net::{parse_duration_ns, parse_size, NetCounters};
use syncopate_sim::transfer::{transfer, TransferSpec};

use crate::args::NetworkArgs;
use crate::cmd::stats::quantile;

/// `syncopate transfer`.
#[derive(Debug, Args)]
pub struct TransferArgs {
    /// Senders, each sending --bytes to the one receiver on a flow of its own (with
    /// --ingress and several flows: an incast into the receiver's port).
    #[arg(long, default_value_t = 1)]
    pub flows: usize,
    /// Bytes each sender sends, e.g. 10MB.
    #[arg(long, default_value = "10MB")]
    pub bytes: String,
    /// Bytes a sender hands the network at a time (one socket write; with --every, one
    /// message).
    #[arg(long, default_value = "64KiB")]
    pub frame: String,
    /// Send messages instead of bulk: each sender's frames one every DURATION (e.g. 20ms),
    /// as a job's slices, each ending in a tail a loss may strike; every message's latency,
    /// from when it was due to its last byte's arrival, is reported (`message_latency_s`).
    /// Default: bulk, each frame as soon as the sender's port and socket take it.
    #[arg(long, value_name = "DURATION")]
    pub every: Option<String>,
    /// Seed of the loss draws: the same seed, the same losses.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the result as one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
    /// The network model (default bandwidth 100mbit).
    #[command(flatten)]
    pub net: NetworkArgs,
}

/// What `syncopate transfer --json` prints (and `syncopate summary` reads): one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransferReport {
    /// Seconds until the last flow's last byte arrived.
    pub completion_s: f64,
    /// Seconds until each flow's last byte arrived, flow by flow.
    pub flow_completion_s: Vec<f64>,
    /// Payload bits over the completion time, Mbit/s.
    pub goodput_mbit_s: f64,
    /// The TCP congestion control modelled.
    pub tcp: String,
    /// What the network did to the senders' frames as they left (none in a kernel
    /// transfer's report, `scripts/tcp_transfer.py`: the kernel counts in its TCP counters).
    #[serde(default)]
    pub egress: NetCounters,
    /// What it did to them at the receiver's port (none in a kernel transfer's report).
    #[serde(default)]
    pub ingress: NetCounters,
    /// Messages (`--every`): each one's latency, from when it was due to its last byte's
    /// arrival, seconds, in the order they arrived.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_latency_s: Vec<f64>,
}

/// Runs one transfer and prints when it completed.
pub fn run(args: TransferArgs) -> Result<()> {
    let profile = args.net.resolve_with(Some(1e8))?;
    let spec = TransferSpec {
        flows: args.flows,
        bytes: parse_size(&args.bytes).context("--bytes")? as u64,
        frame_bytes: parse_size(&args.frame).context("--frame")?,
        seed: args.seed,
        every: (args.every.as_deref())
            .map(parse_duration_ns)
            .transpose()
            .context("--every")?,
    };
    if spec.every == Some(0) {
        bail!("--every must be longer than 0 (leave it out for a bulk transfer)");
    }
    let report = transfer(&profile, &spec).map_err(|e| anyhow!("transfer: {e}"))?;
    let seconds = report.completion_ns as f64 * 1e-9;
    let payload_bits = 8.0 * spec.bytes as f64 * spec.flows as f64;
    let goodput = payload_bits / seconds.max(1e-12) / 1e6;
    if args.json {
        let flows: Vec<f64> = (report.flow_completion_ns.iter())
            .map(|&ns| ns as f64 * 1e-9)
            .collect();
        let out = TransferReport {
            completion_s: seconds,
            flow_completion_s: flows,
            goodput_mbit_s: goodput,
            tcp: profile.tcp.name().to_string(),
            egress: report.egress,
            ingress: report.ingress,
            message_latency_s: seconds_of(&report.message_latency_ns),
        };
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "transfer: {} flow(s) x {} bytes over TCP {}: {seconds:.4} s, goodput {goodput:.1} Mbit/s{}; {}",
        spec.flows,
        spec.bytes,
        profile.tcp,
        latencies(&seconds_of(&report.message_latency_ns)),
        losses(&report.egress, &report.ingress)
    );
    Ok(())
}

/// Nanoseconds as seconds.
fn seconds_of(ns: &[u64]) -> Vec<f64> {
    ns.iter().map(|&t| t as f64 * 1e-9).collect()
}

/// Messages' latencies in words (nothing in bulk): their count, median, 90th percentile
/// and largest.
fn latencies(seconds: &[f64]) -> String {
    if seconds.is_empty() {
        return String::new();
    }
    let ms = |q: f64| quantile(seconds, q) * 1e3;
    format!(
        "; {} messages, latency median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        seconds.len(),
        ms(0.5),
        ms(0.9),
        ms(1.0)
    )
}

/// The losses and repairs of a transfer, in words.
fn losses(egress: &NetCounters, ingress: &NetCounters) -> String {
    let mut all = *egress;
    all.add(ingress);
    let causes = all.timeout_causes;
    format!(
        "{} frames lost, {} dropped, {} resent ({} bytes) in {} loss episodes; {} found by the \
         loss probe, {} by the timeout ({} a resend with nothing after it, {} a resend its window held, {} an \
         original while recovering, {} lost ACKs while recovering)",
        all.frames_lost,
        all.frames_dropped,
        all.frames_retransmitted,
        all.bytes_retransmitted,
        all.loss_episodes,
        all.loss_probes,
        all.timeouts,
        causes.resend_last,
        causes.resend_stalled,
        causes.original_in_recovery,
        causes.acks_in_recovery
    )
}
