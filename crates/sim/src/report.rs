//! What a simulation reports, and its trace as Chrome/Perfetto JSON.

use std::fmt::Write;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use syncopate_core::net::{NetCounters, RateStats, TimeoutCauses};
use syncopate_core::strategy::Rank;
use syncopate_core::wire::datagram::DatagramCounters;

use crate::SimConfig;

/// Bytes one host put on and took off the network (full-size bytes, headers included), and
/// how its ports recovered reliable frames' losses (as the kernel's TCP counts per host).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HostTraffic {
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Losses found by a retransmission timeout: of the frames this host sent, and of those
    /// its ingress port dropped (the kernel's `TcpExtTCPTimeouts` in its namespace).
    #[serde(default)]
    pub timeouts: u64,
    /// Losses found by a tail loss probe, likewise (`TcpExtTCPLossProbes`).
    #[serde(default)]
    pub loss_probes: u64,
    /// The timeouts by why nothing found their losses sooner (as `scripts/tcp_waits.py`
    /// sorts a kernel capture's).
    #[serde(default, skip_serializing_if = "TimeoutCauses::is_empty")]
    pub timeout_causes: TimeoutCauses,
    /// The congestion windows of the reliable flows this host sends (cubic and Reno), as
    /// `scripts/netns-cluster.sh --sample-sockets` reads the kernel's; `None` where none
    /// was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<FlowWindows>,
}

/// A host's reliable flows seen each time one offered a frame to its congestion window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowWindows {
    /// Frames offered to a window.
    pub offers: u64,
    /// The share of them the window held back (its flow window-limited).
    pub held_share: f64,
    /// The window at an offer, segments: mean and largest.
    pub cwnd_segments_mean: f64,
    /// The largest window at an offer, segments.
    pub cwnd_segments_max: u64,
    /// The smoothed round trip at an offer, ms: mean and longest.
    pub srtt_ms_mean: f64,
    /// The longest smoothed round trip at an offer, ms.
    pub srtt_ms_max: f64,
    /// The most bytes one flow's socket held back for its window at once (at most the
    /// send window, `--send-buffer`, and one frame).
    #[serde(default)]
    pub socket_bytes_max: u64,
}

impl FlowWindows {
    /// What `c` counted at the windows; `None` where nothing was offered to one.
    pub fn of(c: &NetCounters) -> Option<Self> {
        (c.window_offers > 0).then(|| Self {
            offers: c.window_offers,
            held_share: c.window_held_share(),
            cwnd_segments_mean: c.mean_cwnd_segments(),
            cwnd_segments_max: c.cwnd_segments_max,
            srtt_ms_mean: c.mean_srtt_ns() * 1e-6,
            srtt_ms_max: c.srtt_ns_max as f64 * 1e-6,
            socket_bytes_max: c.socket_bytes_max,
        })
    }
}

/// Which track of its host an event is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lane {
    /// Forward and backward compute (Chrome `tid` 0).
    Compute,
    /// A frame serialising on the host's egress (`tid` 1).
    Send,
    /// A frame arriving at the host (`tid` 2): its bits coming in, or its ingress serialisation.
    Receive,
}

/// One interval of the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Rank of the host.
    pub host: usize,
    /// Track within the host.
    pub lane: Lane,
    /// What happened, e.g. `forward node4` or `Push key 3 @0 0->2`.
    pub name: String,
    /// Start, virtual nanoseconds.
    pub start_ns: u64,
    /// Duration, nanoseconds.
    pub dur_ns: u64,
}

/// The outcome of a simulation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// Model name of the profile.
    pub model: String,
    /// What the datagram links did, summed over every link (`None` where loss-tolerant
    /// frames travelled as frames): data and feedback sent and received, refusals by
    /// reason; the network's losses and drops of them are in `network`.
    #[serde(default)]
    pub datagrams: Option<DatagramCounters>,
    /// Worker 0's datagram links at the end: each peer and its paths' rate controllers (by
    /// path index), as the runtime's summary gives them (`worker0.datagrams.rates`), so a
    /// simulation's controllers can be set beside a job's; empty without datagrams.
    #[serde(default)]
    pub datagram_rates: Vec<(Rank, Vec<RateStats>)>,
    /// The configuration simulated.
    pub config: SimConfig,
    /// When each step was complete on every worker (its last StepDone), virtual ns.
    pub step_end_ns: Vec<u64>,
    /// Duration of each step (between consecutive step ends; the first from 0), seconds.
    pub step_seconds: Vec<f64>,
    /// Mean step time: the last step's end over the number of steps, seconds.
    pub mean_step_seconds: f64,
    /// Samples per second over all workers: `workers * batch / mean_step_seconds`.
    pub samples_per_sec: f64,
    /// Traffic per rank (workers, then servers).
    pub traffic: Vec<HostTraffic>,
    /// Egress utilisation of each worker: bytes sent / (bandwidth x elapsed); 0 unshaped.
    pub worker_utilisation: Vec<f64>,
    /// Egress utilisation of each server.
    pub server_utilisation: Vec<f64>,
    /// Frames transmitted (each once, however often the network retransmitted it).
    pub frames: u64,
    /// What the network did, summed over every host's ports: frames and bytes sent
    /// (retransmissions included), lost, retransmitted, dropped by a queue; queueing delay.
    pub network: NetCounters,
    /// What the loss-tolerant servers (dlcp) lost and recovered, summed over the servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dlcp: Option<syncopate_core::strategy::LossStats>,
    /// Per key, the fraction of its gradient values the loss-tolerant servers filled in
    /// (empty for reliable strategies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub realised_loss_per_key: Vec<f64>,
    /// Per-tensor completion times over every worker: from a key's hand-over to its values
    /// back ([`syncopate_core::latency`]).
    #[serde(default)]
    pub tensor_completion: syncopate_core::latency::Percentiles,
    /// What worker 0's tuner measured and chose (`--autotune`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<syncopate_core::tune::TuneReport>,
    /// Events processed.
    pub events: u64,
    /// Which model ran and why: packet level (every worker, every frame) or one worker
    /// standing for all alike workers ([`crate::model_choice`]).
    #[serde(default)]
    pub model_path: String,
    /// What the faults did (with any fault on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<crate::faults::FaultReport>,
    /// Trace events of the steps in `config.trace_steps`, in the order they were recorded.
    pub trace: Vec<TraceEvent>,
}

/// Collects the trace events of a window of steps.
#[derive(Debug, Default)]
pub(crate) struct Tracer {
    window: Option<Range<u64>>,
    events: Vec<TraceEvent>,
}

impl Tracer {
    /// Records the steps in `window` (nothing when `None`).
    pub fn new(window: Option<Range<u64>>) -> Self {
        Self {
            window,
            events: Vec::new(),
        }
    }

    /// Records `[start, end)` on `host`'s `lane` if `step` is in the window (the name is
    /// only built then). Inlined: an untraced step costs its caller a comparison, not a
    /// call (two per frame).
    #[inline]
    pub fn record(
        &mut self,
        step: u64,
        host: usize,
        lane: Lane,
        span: (u64, u64),
        name: impl FnOnce() -> String,
    ) {
        if self.window.as_ref().is_some_and(|w| w.contains(&step)) {
            self.push(host, lane, span, name());
        }
    }

    #[cold]
    fn push(&mut self, host: usize, lane: Lane, (start_ns, end): (u64, u64), name: String) {
        self.events.push(TraceEvent {
            host,
            lane,
            name,
            start_ns,
            dur_ns: end.saturating_sub(start_ns),
        });
    }

    /// The events, in the order they were recorded.
    pub fn into_events(self) -> Vec<TraceEvent> {
        self.events
    }
}

fn escape_json(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// The events as a Chrome trace (`chrome://tracing`, Perfetto): complete (`"ph":"X"`) events
/// with microsecond times, `pid` = host rank, `tid` = lane (0 compute, 1 send, 2 receive).
pub fn chrome_trace_json(events: &[TraceEvent]) -> String {
    let mut out = String::from("{\"traceEvents\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"name\":\"");
        escape_json(&e.name, &mut out);
        let tid = match e.lane {
            Lane::Compute => 0,
            Lane::Send => 1,
            Lane::Receive => 2,
        };
        let _ = write!(
            out,
            "\",\"ph\":\"X\",\"ts\":{}.{:03},\"dur\":{}.{:03},\"pid\":{},\"tid\":{}}}",
            e.start_ns / 1000,
            e.start_ns % 1000,
            e.dur_ns / 1000,
            e.dur_ns % 1000,
            e.host,
            tid
        );
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_trace_is_valid_json_in_microseconds() {
        let events = vec![
            TraceEvent {
                host: 3,
                lane: Lane::Send,
                name: "say \"hi\"\\\n".into(),
                start_ns: 1_234_567,
                dur_ns: 5,
            },
            TraceEvent {
                host: 0,
                lane: Lane::Compute,
                name: "forward".into(),
                start_ns: 0,
                dur_ns: 2_000,
            },
        ];
        let json: serde_json::Value = serde_json::from_str(&chrome_trace_json(&events)).unwrap();
        let first = &json["traceEvents"][0];
        assert_eq!(first["name"], "say \"hi\"\\\n");
        assert_eq!(first["ph"], "X");
        assert_eq!(first["ts"].as_f64(), Some(1234.567));
        assert_eq!(first["dur"].as_f64(), Some(0.005));
        assert_eq!(
            (first["pid"].as_u64(), first["tid"].as_u64()),
            (Some(3), Some(1))
        );
        assert_eq!(json["traceEvents"][1]["dur"].as_f64(), Some(2.0));
        assert_eq!(chrome_trace_json(&[]), "{\"traceEvents\":[]}");
    }
}
