//! DLCP: loss-tolerant gradient pushes to parameter servers (Wang et al., 2020, and its
//! successor MLT, NSDI 2024), on top of P3's slicing, placement and priority.
//!
//! - **Packets.** A worker cuts each slice it pushes into packets of at most
//!   [`DlcpOptions::packet_elems`] values; each carries its key, offset and step, so the
//!   server writes it in place whatever order packets arrive in. Packets are loss-tolerant
//!   ([`crate::wire::Flags::loss_tolerant`]): the network never retransmits them.
//! - **Bounded loss.** Per key and step, a server counts the packets of its share of the key
//!   that arrived from each worker. Once at least `ceil((1 - p) n)` of the `n` are in, it
//!   treats that worker's share as complete and, if some are still to come (or the Stops
//!   travel as datagrams), sends [`crate::wire::FrameKind::Stop`];
//!   the entries of the packets still missing count as zero (or the sum is rescaled,
//!   [`LossFill`]). A packet far behind one of its share that arrived is given up for
//!   lost while the bound allows, so that its slice need not wait for the whole key (the
//!   server's `REORDER_PACKETS`). A worker that has sent every packet of a share without a
//!   Stop probes it; the server answers with the bitmap of what is missing
//!   ([`crate::wire::FrameKind::Missing`]) and the worker resends only that, then probes
//!   again. Over TCP the probe is the share's last packet, sent reliably and marked
//!   [`crate::wire::Flags::last_of_share`] (one frame fewer per share; only that packet
//!   can wait for the transport's recovery). Where the packets are datagrams
//!   ([`DlcpOptions::control_datagrams`]) the probe is a [`crate::wire::FrameKind::Probe`]
//!   datagram after the last packet, Stops and Missing are datagrams too, and any may be
//!   lost: a sender re-probes a share left unanswered after a probe timeout ([`probe`]),
//!   and a receiver answers every Probe (a Stop again for a share complete or gone).
//! - **Priority and priority dropping.** Each packet carries a priority class from its layer
//!   (front layers most urgent, 8 classes) and, if the mean |gradient| of its values lies
//!   below a quantile of the key's packets this step ([`DlcpOptions::drop_quantile`], the
//!   median by default), a drop-eligible mark: a `prio` queue past its threshold drops those
//!   first. The papers do not publish their exact rule; this one is ours.
//! - **Spraying.** Packets may take any path ([`crate::wire::Flags::spray_if`]); reliable
//!   frames stay on their flow's path.
//!
//! Parameters come back reliably and whole, as in P3, unless [`DlcpOptions::pull_loss_bound`]
//! is above 0: then they come back as loss-tolerant packets too (MLT's pulls, [`pull`]).
//! With `loss_bound` 0 every pushed packet is needed, and the result is exactly P3's.

mod chunks;
mod control;
mod geometry;
mod probe;
mod pull;
mod ring;
mod ring_hops;
mod server;
mod tally;
mod worker;

pub use geometry::Geometry;
pub use ring::DlcpRing;
pub use server::DlcpServer;
pub use worker::DlcpWorker;

use serde::{Deserialize, Serialize};

/// Default packet payload: 8 KiB of values, as in the public bounded-loss prototype.
pub const DEFAULT_PACKET_ELEMS: usize = 2048;

/// Default loss bound: 1 % of a key's packets per worker and step may be missing.
pub const DEFAULT_LOSS_BOUND: f64 = 0.01;

/// Default drop-eligibility quantile: packets below the key's median mean |gradient|.
pub const DEFAULT_DROP_QUANTILE: f64 = 0.5;

/// What stands in for the values of packets that never arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossFill {
    /// Zero: the lost contributions are missing from the sum, which is still divided by the
    /// number of workers (the papers' choice).
    #[default]
    Zero,
    /// Rescale: each entry's sum is divided by the number of workers whose packet arrived.
    Rescale,
}

impl LossFill {
    /// Every fill, for listings.
    pub const ALL: [LossFill; 2] = [LossFill::Zero, LossFill::Rescale];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            LossFill::Zero => "zero",
            LossFill::Rescale => "rescale",
        }
    }

    /// The fill named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The settings of `--strategy dlcp`; every mechanism can be switched off alone.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DlcpOptions {
    /// Values per packet (`--packet-bytes` / 4).
    pub packet_elems: usize,
    /// Fraction of a key's packets (per worker, step and server) that may be missing, in
    /// [0, 0.5]; 0 needs every packet (exact).
    pub loss_bound: f64,
    /// What stands in for lost values.
    pub fill: LossFill,
    /// Packets whose mean |gradient| lies below this quantile of their key's packets are
    /// drop-eligible, in [0, 1]; 0 marks none.
    pub drop_quantile: f64,
    /// Priority classes by layer and drop-eligible marks (off: every packet class 0,
    /// none drop-eligible).
    pub priority: bool,
    /// Per-packet path choice (off: packets follow their flow's path, as ECMP hashing).
    pub spray: bool,
    /// Fraction of the packets coming back that may be missing, in [0, 0.5]: per key share
    /// of a worker's parameters (`dlcp`), per chunk and hop of the all-gather
    /// (`dlcp-allreduce`); a lost entry keeps the previous step's value. 0 (the default)
    /// sends them reliably, so every worker holds the same values.
    pub pull_loss_bound: f64,
    /// A scaled model's packets (`--scale` below 1, where each value already stands for
    /// many): a key whose shares the bounds need whole travels a slice a packet
    /// ([`Geometry::of`]), so a packet stands for those of its slice; off, every packet is
    /// cut at `packet_elems`. The simulator's switch (`--packet-level` keeps it off); a
    /// real packet never does so.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub whole_slices: bool,
    /// Probes, Stops and Missing bitmaps travel as loss-tolerant datagrams beside the
    /// packets, a lost one recovered by the sender's probe timer ([`probe`]); off, on the
    /// reliable path. Not a flag: on where the packets travel as datagrams
    /// (`--transport udp`, the simulator's datagrams).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub control_datagrams: bool,
}

impl Default for DlcpOptions {
    fn default() -> Self {
        Self {
            packet_elems: DEFAULT_PACKET_ELEMS,
            loss_bound: DEFAULT_LOSS_BOUND,
            fill: LossFill::Zero,
            drop_quantile: DEFAULT_DROP_QUANTILE,
            priority: true,
            spray: true,
            pull_loss_bound: 0.0,
            whole_slices: false,
            control_datagrams: false,
        }
    }
}

impl DlcpOptions {
    /// The loss bound in parts per million, the unit the counting is done in (exact
    /// integer arithmetic, so a key of 100 packets at 1 % needs exactly 99).
    pub fn loss_bound_ppm(&self) -> u64 {
        (self.loss_bound.clamp(0.0, 1.0) * 1e6).round() as u64
    }

    /// [`DlcpOptions::pull_loss_bound`] in parts per million.
    pub fn pull_loss_bound_ppm(&self) -> u64 {
        (self.pull_loss_bound.clamp(0.0, 1.0) * 1e6).round() as u64
    }

    /// What every process must agree on, for the handshake.
    pub fn descriptor(&self) -> String {
        format!(
            "/packet={}/bound={}/fill={}/dq={}/prio={}/spray={}",
            self.packet_elems,
            self.loss_bound_ppm(),
            self.fill.name(),
            self.drop_quantile,
            u8::from(self.priority),
            u8::from(self.spray)
        ) + &if self.pull_loss_bound_ppm() > 0 {
            format!("/pull-bound={}", self.pull_loss_bound_ppm())
        } else {
            String::new()
        } + if self.whole_slices {
            "/whole-slices"
        } else {
            ""
        } + if self.control_datagrams {
            "/control=datagram"
        } else {
            ""
        }
    }

    /// Checks the ranges; the error names the flag.
    pub fn validate(&self, frame_elems: usize) -> Result<(), String> {
        if !(0.0..=0.5).contains(&self.loss_bound) {
            return Err(format!(
                "--loss-bound must lie in [0, 0.5], not {}",
                self.loss_bound
            ));
        }
        if !(0.0..=0.5).contains(&self.pull_loss_bound) {
            return Err(format!(
                "--pull-loss-bound must lie in [0, 0.5], not {}",
                self.pull_loss_bound
            ));
        }
        if self.packet_elems == 0 || self.packet_elems > frame_elems {
            return Err(format!(
                "--packet-bytes must lie in 4..={} (a frame), not {}",
                frame_elems.saturating_mul(4),
                self.packet_elems.saturating_mul(4)
            ));
        }
        if !(0.0..=1.0).contains(&self.drop_quantile) {
            return Err(format!(
                "--dlcp-drop-quantile must lie in [0, 1], not {}",
                self.drop_quantile
            ));
        }
        Ok(())
    }
}

/// What a loss-tolerant server lost and recovered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LossStats {
    /// Gradient values that were aggregated (per worker contribution).
    pub entries: u64,
    /// Of those, values that never arrived and were filled in.
    pub entries_filled: u64,
    /// Packets received and counted.
    pub packets: u64,
    /// Packets that came late (their share already aggregated) or twice, ignored.
    pub packets_ignored: u64,
    /// Probes answered with a bitmap of missing packets.
    pub probes_answered: u64,
    /// Stops sent.
    pub stops: u64,
    /// Values of loss-tolerant all-gather packets that never arrived and kept the previous
    /// step's value (`dlcp-allreduce` with a pull bound).
    #[serde(default)]
    pub entries_stale: u64,
}

impl LossStats {
    /// Adds another server's counts.
    pub fn add(&mut self, o: &LossStats) {
        self.entries += o.entries;
        self.entries_filled += o.entries_filled;
        self.packets += o.packets;
        self.packets_ignored += o.packets_ignored;
        self.probes_answered += o.probes_answered;
        self.stops += o.stops;
        self.entries_stale += o.entries_stale;
    }

    /// The realised loss: the fraction of gradient values filled in.
    pub fn realised_loss(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.entries_filled as f64 / self.entries as f64
        }
    }
}

/// One key's gradient values aggregated and filled in at one server (or, summed, the job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KeyLoss {
    /// Gradient values aggregated (per worker contribution).
    pub entries: u64,
    /// Of those, values that never arrived and were filled in.
    pub filled: u64,
}

impl KeyLoss {
    /// The key's realised loss: the fraction of its values filled in (0 if none aggregated).
    pub fn realised_loss(&self) -> f64 {
        if self.entries == 0 {
            0.0
        } else {
            self.filled as f64 / self.entries as f64
        }
    }

    /// Sums per-key counts of several servers, key by key.
    pub fn sum(per_server: impl IntoIterator<Item = Vec<KeyLoss>>) -> Vec<KeyLoss> {
        let mut total: Vec<KeyLoss> = Vec::new();
        for keys in per_server {
            if total.len() < keys.len() {
                total.resize(keys.len(), KeyLoss::default());
            }
            for (t, k) in total.iter_mut().zip(keys) {
                t.entries += k.entries;
                t.filled += k.filled;
            }
        }
        total
    }
}

/// The priority class of `layer` among `layers` layers: front layers most urgent, spread
/// over the network's 8 classes.
pub fn class_of_layer(layer: usize, layers: usize) -> u8 {
    let classes = crate::net::CLASSES;
    let class = layer.saturating_mul(classes) / layers.max(1);
    class.min(classes - 1) as u8
}

/// Which of a key's packets are drop-eligible: those whose mean |value| lies strictly below
/// the value at quantile `q` of the packets' means (`q` = 0.5: below the median).
pub fn drop_eligible(means: &[f32], q: f64) -> Vec<bool> {
    let mut sorted: Vec<f32> = means.to_vec();
    sorted.sort_by(f32::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).floor() as usize;
    match sorted.get(rank) {
        Some(&cut) => means.iter().map(|&m| m < cut).collect(),
        None => vec![!means.is_empty(); means.len()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_spread_layers_front_first() {
        assert_eq!(class_of_layer(0, 5), 0);
        assert_eq!(class_of_layer(4, 5), 6);
        assert_eq!(class_of_layer(99, 100), 7);
        assert_eq!(class_of_layer(3, 4), 6);
        assert_eq!(class_of_layer(0, 0), 0);
    }

    #[test]
    fn drop_marks_fall_below_the_quantile() {
        let means = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(drop_eligible(&means, 0.5), vec![false, true, false, true]);
        assert_eq!(drop_eligible(&means, 0.0), vec![false; 4]);
        assert_eq!(drop_eligible(&means, 1.0), vec![true; 4]);
        assert!(drop_eligible(&[], 0.5).is_empty());
    }

    #[test]
    fn options_validate_naming_the_flag() {
        let ok = DlcpOptions::default();
        assert!(ok.validate(1 << 20).is_ok());
        let bad = |o: DlcpOptions| o.validate(1 << 20).unwrap_err();
        assert!(bad(DlcpOptions {
            loss_bound: 0.6,
            ..ok
        })
        .contains("--loss-bound"));
        assert!(bad(DlcpOptions {
            loss_bound: f64::NAN,
            ..ok
        })
        .contains("--loss-bound"));
        assert!(bad(DlcpOptions {
            packet_elems: 0,
            ..ok
        })
        .contains("--packet-bytes"));
        assert!(ok.validate(1024).unwrap_err().contains("--packet-bytes"));
        assert_eq!(
            DlcpOptions {
                loss_bound: 0.01,
                ..ok
            }
            .loss_bound_ppm(),
            10_000
        );
    }
}

#[cfg(test)]
mod endpoint_tests;

#[cfg(test)]
mod control_datagram_tests;

#[cfg(test)]
mod ring_tests;
