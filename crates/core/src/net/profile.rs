//! The whole network setting of a job ([`NetworkProfile`]): read from TOML, filled from
//! command-line flags, checked by [`NetworkProfile::validate`], whose errors name the field
//! and its flag.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::blackout::Blackout;
use super::link::{LinkProfile, DEFAULT_BUFFER_BYTES};
use super::parse::serde_helpers;
use super::tcp::CongestionControl;

/// Default retransmission timeout: 200 ms, Linux's minimum RTO (`TCP_RTO_MIN`). A
/// datacenter-tuned stack uses a few milliseconds or less.
pub const DEFAULT_RTO_NS: u64 = 200_000_000;

/// Default drop threshold of the `prio` discipline: drop-eligible frames are refused once
/// the queue would pass half its capacity.
pub const DEFAULT_DROP_THRESHOLD: f64 = 0.5;

/// How a finite queue orders and drops frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueDiscipline {
    /// First in, first out; a frame that does not fit is dropped (tail drop).
    #[default]
    Fifo,
    /// Strict priority over the frame's class (0 first, FIFO within a class, not
    /// preemptive); drop-eligible frames are dropped once the queue would pass the drop
    /// threshold, any frame once it is full.
    Prio,
}

impl QueueDiscipline {
    /// The name used in flags and TOML.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Prio => "prio",
        }
    }
}

impl fmt::Display for QueueDiscipline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QueueDiscipline {
    type Err = ProfileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fifo" => Ok(Self::Fifo),
            "prio" | "priority" => Ok(Self::Prio),
            _ => Err(ProfileError::new(
                "queue_discipline",
                "--queue-discipline",
                format!("unknown discipline '{s}' (use fifo or prio)"),
            )),
        }
    }
}

impl FromStr for CongestionControl {
    type Err = ProfileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cubic" => Ok(Self::Cubic),
            "bbr" => Ok(Self::Bbr),
            "reno" | "newreno" => Ok(Self::Reno),
            _ => Err(ProfileError::new(
                "tcp",
                "--tcp",
                format!("unknown congestion control '{s}' (use cubic, bbr or reno)"),
            )),
        }
    }
}

/// Bursty loss (Gilbert-Elliott): a two-state chain moved once per frame; in the burst
/// state a frame is lost with `loss_in_burst`, in the good state with the profile's `loss`.
/// Mean burst length `1 / p_leave` frames; stationary share of burst `p_enter / (p_enter +
/// p_leave)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BurstLoss {
    /// Probability per frame of entering the burst state from the good state.
    #[serde(with = "serde_helpers::probability")]
    pub p_enter: f64,
    /// Probability per frame of leaving the burst state.
    #[serde(with = "serde_helpers::probability")]
    pub p_leave: f64,
    /// Probability that a frame sent in the burst state is lost.
    #[serde(with = "serde_helpers::probability")]
    pub loss_in_burst: f64,
}

impl BurstLoss {
    /// Long-run share of frames lost, given the good state's loss `good`.
    pub fn stationary_loss(&self, good: f64) -> f64 {
        let bad = self.p_enter / (self.p_enter + self.p_leave);
        bad * self.loss_in_burst + (1.0 - bad) * good
    }
}

/// One path between two hosts; unset fields take the profile's values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathProfile {
    /// Bandwidth of this path, bits per second or `"10gbit"`.
    #[serde(
        with = "serde_helpers::bandwidth",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bandwidth_bps: Option<f64>,
    /// One-way latency of this path, nanoseconds or `"1ms"`.
    #[serde(
        with = "serde_helpers::opt_duration",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub latency_ns: Option<u64>,
    /// Random loss of this path (fraction or `"1%"`).
    #[serde(
        with = "serde_helpers::opt_probability",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub loss: Option<f64>,
    /// Bursty loss of this path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_burst: Option<BurstLoss>,
}

/// One path with every value resolved (`repr(C)`: the rate and latency, which every
/// frame reads, first).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct PathSpec {
    /// Bits per second (`None`: unlimited).
    pub bandwidth_bps: Option<f64>,
    /// One-way latency, nanoseconds.
    pub latency_ns: u64,
    /// Loss probability per frame, or per packet with `packet_bytes` (in the good state
    /// when bursty).
    pub loss: f64,
    /// Bursty loss, if any.
    pub loss_burst: Option<BurstLoss>,
    /// Bytes of a full packet on the wire when loss strikes packets: the profile's
    /// `mtu_bytes` and the Ethernet header, as a frame's wire bytes count them (scaled with
    /// the model's bytes); `None`: loss strikes whole frames.
    pub packet_bytes: Option<f64>,
    /// Timed outages of the network, if any (every path's).
    pub blackout: Option<Blackout>,
}

/// The Ethernet header, counted on the wire (beyond the MTU) as the kernel's qdiscs count it.
pub(crate) const ETHERNET_HEADER_BYTES: f64 = 14.0;

/// Most paths a network profile may have between two hosts. Per-packet spraying (DLCP, MLT)
/// uses a handful; every path costs a queue per host, and a bound keeps a mistyped `--paths`
/// an error rather than a host building billions of queues.
pub const MAX_PATHS: usize = 64;

/// The whole network setting: every knob of the model. The default is a lossless link of
/// unlimited bandwidth, no latency, a 256 KiB send window, one path, egress only, an
/// unbounded FIFO queue. Field names extend the older [`LinkProfile`]'s, so its TOML files
/// still read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkProfile {
    /// Bandwidth of every host's NIC (each path's unless overridden), bits per second or
    /// `"10gbit"`; absent: unlimited.
    #[serde(with = "serde_helpers::bandwidth", default)]
    pub bandwidth_bps: Option<f64>,
    /// One-way latency (each path's unless overridden), nanoseconds or `"1ms"`.
    #[serde(with = "serde_helpers::duration", default)]
    pub latency_ns: u64,
    /// The send window: the driver asks its scheduler for the next frame only while the
    /// egress holds fewer unserialised bytes than this (bytes or `"256KiB"`); and each
    /// reliable flow's socket: it takes no more once this much waits for its window.
    #[serde(with = "serde_helpers::size", default = "default_buffer")]
    pub buffer_bytes: usize,
    /// Also serialise (and queue) arriving frames at the receiver's downlink, as at a
    /// switch port where N senders converge on one host.
    #[serde(default)]
    pub ingress: bool,
    /// Capacity of each queue in bytes (per path at egress, and at ingress); absent:
    /// unbounded. A frame always enters an empty queue, whatever its size.
    #[serde(with = "serde_helpers::opt_size", default)]
    pub queue_bytes: Option<usize>,
    /// How queues order and drop frames.
    #[serde(default)]
    pub queue_discipline: QueueDiscipline,
    /// `prio` only: fraction of the queue capacity past which drop-eligible frames are
    /// dropped, in (0, 1].
    #[serde(default = "default_threshold")]
    pub drop_threshold: f64,
    /// Bernoulli loss per frame on every path (fraction or `"1%"`), or per packet with
    /// `mtu_bytes`; with `loss_burst`, the loss in the good state.
    #[serde(with = "serde_helpers::probability", default)]
    pub loss: f64,
    /// Bursty (Gilbert-Elliott) loss on every path.
    #[serde(default)]
    pub loss_burst: Option<BurstLoss>,
    /// Timed outages on every path: `{ duration_ns = "20ms", period_ns = "1s" }` loses
    /// every packet sent in the last 20 ms of each second, as the namespace testbed's
    /// `--blackout 20`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blackout: Option<Blackout>,
    /// Packet size for loss: with it, random and bursty loss strike each packet of at most
    /// this many bytes, and a frame is lost when any of its packets is (so a larger frame
    /// is likelier to be lost, as over IP); absent: loss strikes whole frames, whatever
    /// their size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu_bytes: Option<f64>,
    /// Number of paths between two hosts (1 to [`MAX_PATHS`]).
    #[serde(default = "one")]
    pub paths: usize,
    /// Per-path overrides, for paths `0..path.len()` (at most `paths`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<PathProfile>,
    /// The minimum retransmission timeout of the reliable transport (Linux's `rto_min`),
    /// nanoseconds or `"200ms"`: a timeout fires only when a retransmission is lost too.
    #[serde(with = "serde_helpers::duration", default = "default_rto")]
    pub rto_ns: u64,
    /// The reliable flows' congestion control, named as the kernel names it.
    #[serde(default)]
    pub tcp: CongestionControl,
    /// The workers' NICs, both ways and on every path, where they differ from the servers'
    /// (bits per second or `"10gbit"`; absent: every host at `bandwidth_bps`): a network
    /// whose bottleneck is the servers' ports, as the namespace testbed's `--bottleneck`
    /// shapes only the server's switch port. Hosts of strategies without servers keep
    /// `bandwidth_bps`.
    #[serde(with = "serde_helpers::bandwidth", default)]
    pub worker_bandwidth_bps: Option<f64>,
    /// The factor the model's bytes were scaled by ([`NetworkProfile::scaled`]): packet
    /// headers scale with it.
    #[serde(skip, default = "unscaled")]
    pub byte_scale: f64,
    /// The receiving hosts' downlink on the first path where it is slower than this NIC and
    /// a bottleneck (`ingress`): a worker's NIC in a topology with servers, whose data
    /// queues at the servers' ports ([`NetworkProfile::worker_nic`] sets it; never read
    /// from a file). A reliable flow's own data queues there, not at its NIC.
    #[serde(skip)]
    pub peer_downlink_bps: Option<f64>,
}

fn unscaled() -> f64 {
    1.0
}

fn default_buffer() -> usize {
    DEFAULT_BUFFER_BYTES
}

fn default_threshold() -> f64 {
    DEFAULT_DROP_THRESHOLD
}

fn default_rto() -> u64 {
    DEFAULT_RTO_NS
}

fn one() -> usize {
    1
}

impl Default for NetworkProfile {
    fn default() -> Self {
        Self::from(LinkProfile::default())
    }
}

impl From<LinkProfile> for NetworkProfile {
    fn from(link: LinkProfile) -> Self {
        Self {
            bandwidth_bps: link.bandwidth_bps,
            latency_ns: link.latency_ns,
            buffer_bytes: link.buffer_bytes,
            ingress: false,
            queue_bytes: None,
            queue_discipline: QueueDiscipline::Fifo,
            drop_threshold: DEFAULT_DROP_THRESHOLD,
            loss: 0.0,
            loss_burst: None,
            blackout: None,
            mtu_bytes: None,
            paths: 1,
            path: Vec::new(),
            rto_ns: DEFAULT_RTO_NS,
            tcp: CongestionControl::default(),
            worker_bandwidth_bps: None,
            byte_scale: 1.0,
            peer_downlink_bps: None,
        }
    }
}

/// A bad network setting, naming the TOML field and the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network profile: `{field}` ({flag}): {why}")]
pub struct ProfileError {
    /// The TOML field, e.g. `loss` or `path[1].bandwidth_bps`.
    pub field: String,
    /// The command-line flag setting it, e.g. `--loss`.
    pub flag: &'static str,
    /// What is wrong.
    pub why: String,
}

impl ProfileError {
    pub(crate) fn new(field: impl Into<String>, flag: &'static str, why: String) -> Self {
        Self {
            field: field.into(),
            flag,
            why,
        }
    }
}

/// Checks a probability field.
fn check_probability(field: String, flag: &'static str, p: f64) -> Result<(), ProfileError> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(ProfileError::new(
            field,
            flag,
            format!("{p} is not a probability in [0, 1] (0 to 100 %)"),
        ))
    }
}

/// Checks an optional bandwidth field.
/// The slowest link the model accepts (1 kbit/s): slower ones overflow its nanosecond clock
/// on large frames.
pub const MIN_BANDWIDTH_BPS: f64 = 1e3;

/// The fastest link the model accepts (1 Pbit/s).
pub const MAX_BANDWIDTH_BPS: f64 = 1e15;

/// The longest latency or retransmission timeout the model accepts (an hour).
pub const MAX_DELAY_NS: u64 = 3_600_000_000_000;

fn check_bandwidth(field: String, flag: &'static str, b: Option<f64>) -> Result<(), ProfileError> {
    match b {
        Some(bps) if !(MIN_BANDWIDTH_BPS..=MAX_BANDWIDTH_BPS).contains(&bps) => {
            Err(ProfileError::new(
                field,
                flag,
                format!(
                    "{bps:e} bit/s is outside {MIN_BANDWIDTH_BPS:e}..={MAX_BANDWIDTH_BPS:e} bit/s \
                     (1 kbit/s to 1 Pbit/s; leave it out for an unlimited link)"
                ),
            ))
        }
        _ => Ok(()),
    }
}

fn check_delay(field: String, flag: &'static str, ns: u64) -> Result<(), ProfileError> {
    if ns > MAX_DELAY_NS {
        return Err(ProfileError::new(
            field,
            flag,
            format!("{ns} ns is longer than an hour ({MAX_DELAY_NS} ns)"),
        ));
    }
    Ok(())
}

/// Checks a bursty-loss setting.
fn check_burst(field: &str, b: &BurstLoss) -> Result<(), ProfileError> {
    let flag = "--loss-burst";
    check_probability(format!("{field}.p_enter"), flag, b.p_enter)?;
    check_probability(format!("{field}.p_leave"), flag, b.p_leave)?;
    check_probability(format!("{field}.loss_in_burst"), flag, b.loss_in_burst)?;
    if b.p_leave <= 0.0 {
        return Err(ProfileError::new(
            format!("{field}.p_leave"),
            flag,
            "must be above 0, or a burst never ends".into(),
        ));
    }
    Ok(())
}

/// Checks that an outage fits its period.
fn check_blackout(b: &Blackout) -> Result<(), ProfileError> {
    let err = |field: &str, why: String| Err(ProfileError::new(field, "--blackout", why));
    if b.period_ns == 0 || b.period_ns > MAX_DELAY_NS {
        let why = format!("{} ns: give a period from 1 ns to an hour", b.period_ns);
        return err("blackout.period_ns", why);
    }
    if b.duration_ns == 0 || b.duration_ns >= b.period_ns {
        let why = format!(
            "{} ns: an outage must last more than 0 and less than its period ({} ns)",
            b.duration_ns, b.period_ns
        );
        return err("blackout.duration_ns", why);
    }
    Ok(())
}

impl NetworkProfile {
    /// The profile of an older [`LinkProfile`] (no loss, one path, egress only).
    pub fn from_link(link: LinkProfile) -> Self {
        Self::from(link)
    }

    /// The network of a model whose bytes are scaled by `factor` (`--scale`): every
    /// bandwidth, the send window and the queues scaled alike (rounded up, at least one
    /// byte), so frames take the time their full-size frames take; times and loss rates
    /// stay.
    pub fn scaled(mut self, factor: f64) -> Self {
        let bytes = |n: usize| crate::scale::scale_count(n, factor);
        self.bandwidth_bps = self.bandwidth_bps.map(|b| b * factor);
        self.worker_bandwidth_bps = self.worker_bandwidth_bps.map(|b| b * factor);
        self.peer_downlink_bps = self.peer_downlink_bps.map(|b| b * factor);
        for path in &mut self.path {
            path.bandwidth_bps = path.bandwidth_bps.map(|b| b * factor);
        }
        self.buffer_bytes = bytes(self.buffer_bytes);
        self.queue_bytes = self.queue_bytes.map(bytes);
        // Unrounded: a scaled frame is then cut into as many packets as its full size.
        self.mtu_bytes = self.mtu_bytes.map(|m| m * factor);
        self.byte_scale *= factor;
        self
    }

    /// The profile of a worker's NIC in a topology with servers: every path at
    /// `worker_bandwidth_bps` where that is set (the profile itself otherwise).
    pub fn worker_nic(&self) -> NetworkProfile {
        let Some(bps) = self.worker_bandwidth_bps else {
            return self.clone();
        };
        let mut p = self.clone();
        let downlink = self.path_spec(0).bandwidth_bps;
        if self.ingress && downlink.is_some_and(|d| d < bps) {
            p.peer_downlink_bps = downlink;
        }
        p.bandwidth_bps = Some(bps);
        for path in &mut p.path {
            path.bandwidth_bps = Some(bps);
        }
        p
    }

    /// The bandwidth, latency and send window alone, as the older [`LinkProfile`].
    pub fn link(&self) -> LinkProfile {
        LinkProfile {
            bandwidth_bps: self.bandwidth_bps,
            latency_ns: self.latency_ns,
            buffer_bytes: self.buffer_bytes,
        }
    }

    /// Whether any frame can be lost or dropped (random loss, outages or a finite queue).
    pub fn is_lossy(&self) -> bool {
        self.queue_bytes.is_some()
            || self.blackout.is_some()
            || (0..self.paths.max(1)).any(|i| {
                let p = self.path_spec(i);
                p.loss > 0.0 || p.loss_burst.is_some_and(|b| b.loss_in_burst > 0.0)
            })
    }

    /// The narrowest rate a reliable flow's data meets: the first path's (a reliable flow
    /// takes it) or the receiving downlink's where that is slower
    /// ([`NetworkProfile::peer_downlink_bps`]); `None`: unlimited.
    pub fn reliable_bottleneck_bps(&self) -> Option<f64> {
        let own = self.path_spec(0).bandwidth_bps;
        match (own, self.peer_downlink_bps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Path `i` with the profile's values where it sets none.
    pub fn path_spec(&self, i: usize) -> PathSpec {
        let o = self.path.get(i).copied().unwrap_or_default();
        PathSpec {
            bandwidth_bps: o.bandwidth_bps.or(self.bandwidth_bps),
            latency_ns: o.latency_ns.unwrap_or(self.latency_ns),
            loss: o.loss.unwrap_or(self.loss),
            loss_burst: o.loss_burst.or(self.loss_burst),
            packet_bytes: (self.mtu_bytes).map(|m| m + ETHERNET_HEADER_BYTES * self.byte_scale),
            blackout: self.blackout,
        }
    }

    /// Checks every value; the error names the field and its flag.
    pub fn validate(&self) -> Result<(), ProfileError> {
        check_bandwidth("bandwidth_bps".into(), "--bandwidth", self.bandwidth_bps)?;
        let worker = self.worker_bandwidth_bps;
        check_bandwidth("worker_bandwidth_bps".into(), "--worker-bandwidth", worker)?;
        check_delay("latency_ns".into(), "--latency", self.latency_ns)?;
        check_delay("rto_ns".into(), "--rto", self.rto_ns)?;
        if self.buffer_bytes == 0 {
            return Err(ProfileError::new(
                "buffer_bytes",
                "--send-buffer",
                "the send window must be positive".into(),
            ));
        }
        if self.queue_bytes == Some(0) {
            return Err(ProfileError::new(
                "queue_bytes",
                "--queue",
                "a queue of 0 bytes holds nothing; give a positive size or leave it unbounded"
                    .into(),
            ));
        }
        let t = self.drop_threshold;
        if !(t > 0.0 && t <= 1.0) {
            return Err(ProfileError::new(
                "drop_threshold",
                "--drop-threshold",
                format!("{t} is not a fraction of the queue in (0, 1]"),
            ));
        }
        check_probability("loss".into(), "--loss", self.loss)?;
        if let Some(b) = &self.loss_burst {
            check_burst("loss_burst", b)?;
        }
        if let Some(b) = &self.blackout {
            check_blackout(b)?;
        }
        if let Some(m) = self.mtu_bytes {
            if !(m.is_finite() && m > 0.0) {
                return Err(ProfileError::new(
                    "mtu_bytes",
                    "--mtu",
                    format!("{m} is not a packet size; give a positive number of bytes, e.g. 1500"),
                ));
            }
        }
        self.validate_paths()?;
        if self.rto_ns == 0 {
            return Err(ProfileError::new(
                "rto_ns",
                "--rto",
                "the retransmission timeout must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Checks the number of paths and each override.
    fn validate_paths(&self) -> Result<(), ProfileError> {
        if !(1..=MAX_PATHS).contains(&self.paths) {
            return Err(ProfileError::new(
                "paths",
                "--paths",
                format!("{} paths: give 1 to {MAX_PATHS}", self.paths),
            ));
        }
        if self.path.len() > self.paths {
            return Err(ProfileError::new(
                "path",
                "--network",
                format!(
                    "{} [[path]] entries for {} paths; set `paths` to at least {}",
                    self.path.len(),
                    self.paths,
                    self.path.len()
                ),
            ));
        }
        for (i, p) in self.path.iter().enumerate() {
            check_bandwidth(
                format!("path[{i}].bandwidth_bps"),
                "--network",
                p.bandwidth_bps,
            )?;
            if let Some(l) = p.latency_ns {
                check_delay(format!("path[{i}].latency_ns"), "--network", l)?;
            }
            if let Some(l) = p.loss {
                check_probability(format!("path[{i}].loss"), "--network", l)?;
            }
            if let Some(b) = &p.loss_burst {
                check_burst(&format!("path[{i}].loss_burst"), b)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::PathProfile as ScaledPath;

    #[test]
    fn scaling_scales_every_bandwidth_the_window_and_the_queue() {
        let p = NetworkProfile {
            bandwidth_bps: Some(1.6e10),
            latency_ns: 5_000,
            buffer_bytes: 256 * 1024,
            queue_bytes: Some(512 * 1024),
            paths: 2,
            path: vec![ScaledPath {
                bandwidth_bps: Some(1.6e9),
                ..ScaledPath::default()
            }],
            loss: 0.01,
            ..NetworkProfile::default()
        }
        .scaled(1.0 / 16.0);
        assert_eq!(p.bandwidth_bps, Some(1e9));
        assert_eq!(p.path[0].bandwidth_bps, Some(1e8));
        assert_eq!(
            (p.buffer_bytes, p.queue_bytes),
            (16 * 1024, Some(32 * 1024))
        );
        assert_eq!((p.latency_ns, p.loss), (5_000, 0.01));
    }

    /// The workers' NIC: every path at the workers' rate, the rest of the profile kept; the
    /// rate reads from TOML, scales, and is checked like the others.
    #[test]
    fn the_workers_nic_has_every_path_at_the_workers_rate() {
        let p = NetworkProfile {
            bandwidth_bps: Some(1e8),
            worker_bandwidth_bps: Some(1e10),
            paths: 2,
            path: vec![
                ScaledPath::default(),
                ScaledPath {
                    bandwidth_bps: Some(2e7),
                    ..ScaledPath::default()
                },
            ],
            loss: 0.01,
            ..NetworkProfile::default()
        };
        let w = p.worker_nic();
        assert_eq!(
            (w.path_spec(0).bandwidth_bps, w.path_spec(1).bandwidth_bps),
            (Some(1e10), Some(1e10))
        );
        assert_eq!((w.loss, w.paths), (0.01, 2));
        assert_eq!(
            p.path_spec(1).bandwidth_bps,
            Some(2e7),
            "the servers' keep theirs"
        );
        assert_eq!(
            w.peer_downlink_bps, None,
            "no ingress: the NIC is the bottleneck"
        );
        assert_eq!(w.reliable_bottleneck_bps(), Some(1e10));
        // With the servers' downlinks a bottleneck, a worker's reliable data queues there.
        let ingress = NetworkProfile {
            ingress: true,
            ..p.clone()
        };
        let w = ingress.worker_nic();
        assert_eq!(w.peer_downlink_bps, ingress.bandwidth_bps);
        assert_eq!(w.reliable_bottleneck_bps(), ingress.bandwidth_bps);
        assert_eq!(
            w.scaled(0.5).peer_downlink_bps,
            ingress.bandwidth_bps.map(|b| b / 2.0)
        );
        assert_eq!(ingress.reliable_bottleneck_bps(), ingress.bandwidth_bps);
        let same = NetworkProfile::default();
        assert_eq!(same.worker_nic(), same);
        assert_eq!(p.scaled(0.5).worker_bandwidth_bps, Some(5e9));
        let t: NetworkProfile = toml::from_str("worker_bandwidth_bps = \"10gbit\"").unwrap();
        assert_eq!(t.worker_bandwidth_bps, Some(1e10));
        let bad = NetworkProfile {
            worker_bandwidth_bps: Some(0.0),
            ..NetworkProfile::default()
        };
        let e = bad.validate().unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.flag),
            ("worker_bandwidth_bps", "--worker-bandwidth")
        );
    }

    /// The packet size scales with the model's bytes, unrounded, and reaches every path.
    #[test]
    fn packet_size_scales_unrounded_and_reaches_the_paths() {
        let p = NetworkProfile {
            mtu_bytes: Some(1_500.0),
            paths: 2,
            ..NetworkProfile::default()
        };
        assert_eq!(
            p.path_spec(1).packet_bytes,
            Some(1_514.0),
            "with the Ethernet header"
        );
        let s = p.scaled(1.0 / 4096.0);
        assert_eq!(s.mtu_bytes, Some(1_500.0 / 4096.0));
        assert_eq!(s.path_spec(0).packet_bytes, Some(1_514.0 / 4096.0));
        assert_eq!(NetworkProfile::default().path_spec(0).packet_bytes, None);
        let t: NetworkProfile = toml::from_str("loss = \"1%\"\nmtu_bytes = 1500").unwrap();
        assert_eq!((t.mtu_bytes, t.loss), (Some(1_500.0), 0.01));
        let mut bad = NetworkProfile::default();
        for m in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            bad.mtu_bytes = Some(m);
            let e = bad.validate().unwrap_err();
            assert_eq!((e.field.as_str(), e.flag), ("mtu_bytes", "--mtu"));
        }
    }

    use super::*;

    fn err(f: impl Fn(&mut NetworkProfile)) -> ProfileError {
        let mut p = NetworkProfile::default();
        f(&mut p);
        p.validate().unwrap_err()
    }

    #[test]
    fn default_is_valid_and_lossless() {
        let p = NetworkProfile::default();
        p.validate().unwrap();
        assert!(!p.is_lossy());
        assert_eq!(p.link(), LinkProfile::default());
    }

    #[test]
    fn validation_errors_name_the_field_and_flag() {
        let e = err(|p| p.loss = 1.5);
        assert_eq!((e.field.as_str(), e.flag), ("loss", "--loss"));
        assert!(err(|p| p.loss = f64::NAN).to_string().contains("`loss`"));
        assert!(err(|p| p.loss = -0.1).to_string().contains("--loss"));
        assert_eq!(err(|p| p.paths = 0).field, "paths");
        assert_eq!(err(|p| p.paths = MAX_PATHS + 1).flag, "--paths");
        assert!(err(|p| p.paths = 100_000_000_000)
            .to_string()
            .contains("1 to 64"));
        assert_eq!(err(|p| p.queue_bytes = Some(0)).field, "queue_bytes");
        assert_eq!(err(|p| p.buffer_bytes = 0).flag, "--send-buffer");
        assert_eq!(err(|p| p.bandwidth_bps = Some(-1.0)).flag, "--bandwidth");
        assert_eq!(
            err(|p| p.bandwidth_bps = Some(f64::NAN)).field,
            "bandwidth_bps"
        );
        assert_eq!(err(|p| p.rto_ns = 0).flag, "--rto");
        assert_eq!(err(|p| p.drop_threshold = 0.0).field, "drop_threshold");
        let burst = BurstLoss {
            p_enter: 0.1,
            p_leave: 0.0,
            loss_in_burst: 1.0,
        };
        assert_eq!(
            err(|p| p.loss_burst = Some(burst)).field,
            "loss_burst.p_leave"
        );
        let e = err(|p| {
            p.paths = 2;
            p.path = vec![
                PathProfile::default(),
                PathProfile {
                    loss: Some(2.0),
                    ..PathProfile::default()
                },
            ];
        });
        assert_eq!(e.field, "path[1].loss");
        assert_eq!(
            err(|p| p.path = vec![PathProfile::default(); 2]).field,
            "path"
        );
        assert!("lifo"
            .parse::<QueueDiscipline>()
            .unwrap_err()
            .to_string()
            .contains("--queue-discipline"));
        // A queue smaller than one frame is fine.
        let p = NetworkProfile {
            queue_bytes: Some(1),
            ..NetworkProfile::default()
        };
        p.validate().unwrap();
    }

    #[test]
    fn an_outage_as_long_as_its_period_is_refused() {
        let ms = 1_000_000;
        let with = |b: Blackout| NetworkProfile {
            blackout: Some(b),
            ..NetworkProfile::default()
        };
        let flag = |b: Blackout| with(b).validate().map_err(|e| e.flag);
        assert_eq!(
            flag(Blackout::per_second(2 * ms).with_period(ms)),
            Err("--blackout")
        );
        assert_eq!(
            flag(Blackout::per_second(ms).with_period(ms)),
            Err("--blackout")
        );
        assert_eq!(flag(Blackout::per_second(0)), Err("--blackout"));
        assert_eq!(
            flag(Blackout::per_second(ms).with_period(0)),
            Err("--blackout")
        );
        assert_eq!(flag(Blackout::per_second(50 * ms)), Ok(()));
    }

    #[test]
    fn reads_toml_with_units_and_paths() {
        let text = r#"
            bandwidth_bps = "10gbit"
            latency_ns = "50us"
            buffer_bytes = "256KiB"
            ingress = true
            queue_bytes = "1MiB"
            queue_discipline = "prio"
            loss = "0.1%"
            loss_burst = { p_enter = 0.001, p_leave = 0.2, loss_in_burst = "50%" }
            blackout = { duration_ns = "20ms" }
            paths = 2
            rto_ns = "5ms"
            [[path]]
            [[path]]
            bandwidth_bps = "1gbit"
            loss = "5%"
        "#;
        let p: NetworkProfile = toml::from_str(text).unwrap();
        p.validate().unwrap();
        assert_eq!(p.latency_ns, 50_000);
        assert_eq!(p.queue_bytes, Some(1 << 20));
        assert_eq!(p.queue_discipline, QueueDiscipline::Prio);
        assert_eq!(p.rto_ns, 5_000_000);
        assert_eq!(p.path_spec(0).bandwidth_bps, Some(10e9));
        assert_eq!(p.path_spec(1).bandwidth_bps, Some(1e9));
        assert_eq!(p.path_spec(1).loss, 0.05);
        assert_eq!(p.path_spec(0).loss, 0.001);
        let outage = Blackout::per_second(20_000_000);
        assert_eq!(p.path_spec(1).blackout, Some(outage));
        assert!(p.is_lossy());
        let old: NetworkProfile =
            toml::from_str("bandwidth_bps = 1e9\nlatency_ns = 1000\nbuffer_bytes = 4096").unwrap();
        assert_eq!(old.link().buffer_bytes, 4096);
        assert!(toml::from_str::<NetworkProfile>("bandwith = 1").is_err());
        assert!(toml::from_str::<NetworkProfile>("queue_discipline = \"red\"").is_err());
        let back: NetworkProfile = toml::from_str(&toml::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn links_no_clock_can_hold_are_refused() {
        let err = |text: &str| match toml::from_str::<NetworkProfile>(text) {
            Err(e) => e.to_string(),
            Ok(p) => p
                .validate()
                .map_err(|e| e.to_string())
                .err()
                .unwrap_or_default(),
        };
        for (text, want) in [
            ("bandwidth_bps = -5", "must be positive"),
            ("bandwidth_bps = 0", "must be positive"),
            ("bandwidth_bps = 1e-300", "bandwidth_bps"),
            ("bandwidth_bps = 1e300", "bandwidth_bps"),
            ("latency_ns = \"7200s\"", "latency_ns"),
            ("rto_ns = 4e12", "rto_ns"),
        ] {
            let e = err(text);
            assert!(e.contains(want), "{text}: {e:?}");
        }
        assert!(err("bandwidth_bps = \"1gbit\"\nlatency_ns = \"50s\"").is_empty());
    }
}
