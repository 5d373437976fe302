//! The network model: what happens to a frame between two endpoints.
//!
//! Both drivers use it: the runtime to emulate a constrained network on real sockets, the
//! simulator to move frames on virtual time. It is sans-IO like the rest of the core: time
//! comes in as `now` (nanoseconds from any fixed origin), and every random choice comes from
//! the job's seed: a frame's loss is drawn from a key of the seed and the frame's identity
//! ([`FrameIdentity`]: flow, step, packet, attempt), so every run loses the same packets
//! whatever order they reach the port in.
//!
//! - [`NetworkProfile`]: every knob (bandwidth, latency, send window, ingress bottleneck,
//!   finite queues and their discipline, Bernoulli and Gilbert-Elliott loss, timed
//!   outages ([`Blackout`]), several paths,
//!   the reliable flows' congestion control and minimum RTO), read from TOML and checked by
//!   [`NetworkProfile::validate`]. Its default is a lossless link of unlimited bandwidth.
//! - [`Port`]: one bottleneck direction of a host (its egress NIC, or its ingress port):
//!   a finite queue with a discipline, a serialiser per path, loss and retransmission. The
//!   driver offers frames ([`Port::enqueue`]) and collects their fate ([`Port::poll_fate`]).
//! - [`LinkProfile`] and [`Shaper`]: the lossless FIFO link of earlier versions, kept for
//!   the callers that need only that; a [`Port`] of the default profile reproduces it exactly.
//! - [`RateController`]: the congestion controller and pacer of a datagram flow on a real
//!   network (delay- and loss-driven, TIMELY-like), with its [`RateConfig`].
//! - [`Rotation`] and [`LinkCap`]: fairness among a host's links, the order they are offered
//!   to the scheduler in and what one link may hold on an unshaped network.
//! - the parsers of bandwidths, durations, sizes and probabilities.

mod attempts;
mod blackout;
mod counters;
mod flow_map;
mod later;
mod link;
mod loss;
mod order;
mod parse;
mod paths;
mod port;
mod profile;
mod queue;
mod rate;
mod rng;
mod rotation;
mod tcp;
mod window;

pub use blackout::{Blackout, DEFAULT_BLACKOUT_PERIOD_NS};
pub use counters::{NetCounters, TimeoutCauses};
pub use link::{LinkProfile, Shaper, DEFAULT_BUFFER_BYTES};
pub use parse::{parse_bandwidth, parse_duration_ns, parse_probability, parse_size, ParseError};
pub use port::Port;
pub use profile::{
    BurstLoss, NetworkProfile, PathProfile, PathSpec, ProfileError, QueueDiscipline,
    DEFAULT_DROP_THRESHOLD, DEFAULT_RTO_NS, MAX_PATHS,
};
pub use rate::{
    RateConfig, RateController, RateSignal, RateStats, ADDITIVE_ROUND_NS, MAX_HYPER_INCREASE,
};
pub use rng::SplitMix64;
pub use rotation::{LinkCap, Rotation};
pub use tcp::{CongestionControl, Recovery, TimeoutCause, INITIAL_WINDOW_SEGMENTS};

/// Nanoseconds on the driver's clock (monotonic in the runtime, virtual in the simulator).
pub type Nanos = u64;

/// Number of priority classes of the `prio` discipline (0 is the most urgent).
pub const CLASSES: usize = 8;

/// What the network needs to know of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameMeta {
    /// Bytes the frame occupies on the wire (headers included).
    pub bytes: usize,
    /// Priority class, 0 the most urgent .. 7 the least (values above 7 count as 7); only
    /// the `prio` discipline looks at it.
    pub class: u8,
    /// Whether the `prio` discipline may drop this frame first once its queue passes the
    /// drop threshold.
    pub drop_eligible: bool,
    /// The flow the frame belongs to (e.g. the directed link's id): path hashing, in-order
    /// delivery of reliable frames and per-flow counters are per flow.
    pub flow: u64,
    /// Choose the path per frame (spraying) rather than per flow (hashing, as ECMP does).
    pub spray: bool,
    /// The path its sender chose (a datagram link's choice, one socket per path): taken
    /// as it is (modulo the port's paths), before any hashing or spraying.
    pub path: Option<usize>,
    /// Reliable transport (TCP-like): a lost or dropped frame is retransmitted after the
    /// retransmission timeout and deliveries on the flow stay in order. Otherwise the frame
    /// is simply lost ([`Fate::Lost`], [`Fate::Dropped`]).
    pub reliable: bool,
    /// Which frame this is (its loss is drawn from a key of it): `None` draws from the
    /// path's stream in arrival order.
    pub identity: Option<FrameIdentity>,
    /// A datagram: no flow control holds the next one back at its receiver, so an ingress
    /// port queues every datagram that comes, where it holds one frame of a flow at a time.
    pub datagram: bool,
}

/// What identifies a frame within its flow for the loss draws: its step and a hash of its
/// kind, key and place in the key. Resends of the same packet are told apart by the port
/// (each offer is a new attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FrameIdentity {
    /// The training step the frame belongs to.
    pub step: u64,
    /// The packet within the step: a hash of the frame's kind, key, offset and length.
    pub packet: u64,
}

impl FrameIdentity {
    /// The identity of the frame with header `header`.
    pub fn of_header(header: &crate::wire::Header) -> Self {
        let kind = header.kind as u64;
        let place = [
            kind,
            header.key.into(),
            header.offset.into(),
            header.length.into(),
        ];
        Self {
            step: header.step,
            packet: rng::hash(&place),
        }
    }
}

impl FrameMeta {
    /// A reliable frame of `bytes` on `flow`, class 0, hashed to a path: what every
    /// TCP-like strategy sends.
    pub fn reliable(bytes: usize, flow: u64) -> Self {
        Self {
            bytes,
            flow,
            reliable: true,
            ..Self::default()
        }
    }

    /// What the network sees of a frame with header `header`, `bytes` on the wire, on
    /// `flow`: the class, loss tolerance, drop eligibility and spraying its sender declared
    /// in the header's [`crate::wire::Flags`] (none: a reliable class-0 frame).
    pub fn of_frame(header: &crate::wire::Header, bytes: usize, flow: u64) -> Self {
        let f = header.flags;
        Self {
            bytes,
            class: f.priority_class(),
            drop_eligible: f.is_drop_eligible(),
            flow,
            spray: f.is_sprayed(),
            path: None,
            reliable: !f.is_loss_tolerant(),
            identity: Some(FrameIdentity::of_header(header)),
            datagram: false,
        }
    }

    /// What the network sees of a datagram of `bytes` (its UDP payload: a port that models
    /// packets adds the UDP, IP and Ethernet headers, as for every frame) with IP DSCP
    /// `dscp`, on `flow`, sent on `path`: never retransmitted, of the class and drop
    /// eligibility its DSCP marks ([`crate::wire::datagram::class_of_dscp`]), its loss drawn
    /// from the path's stream.
    pub fn of_datagram(dscp: u8, bytes: usize, flow: u64, path: usize) -> Self {
        let (class, drop_eligible) = crate::wire::datagram::class_of_dscp(dscp);
        Self {
            bytes,
            class,
            drop_eligible,
            flow,
            path: Some(path),
            datagram: true,
            ..Self::default()
        }
    }
}

/// The fate of a frame once the model has decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The frame reaches the other end at `at` (for an ingress port: is handed to the
    /// receiver), after `retransmissions` retransmissions, last sent on `path`.
    Delivered {
        /// Delivery time.
        at: Nanos,
        /// How many times it was retransmitted (0: delivered first time).
        retransmissions: u32,
        /// The path of its last transmission.
        path: usize,
    },
    /// Lost on `path` (loss-tolerant frames only: reliable ones are retransmitted).
    Lost {
        /// The path it was lost on.
        path: usize,
    },
    /// Dropped by a full queue (loss-tolerant frames only).
    Dropped,
}

/// A decided frame with the timing of its last transmission attempt, for traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The driver's token given to [`Port::enqueue`].
    pub token: u64,
    /// What happens to the frame.
    pub fate: Fate,
    /// When the last attempt started serialising (the drop time for a dropped frame).
    pub start: Nanos,
    /// When the last attempt finished serialising (the drop time for a dropped frame).
    pub done: Nanos,
    /// An egress port's frame whose lost packets a resend repaired: when the first of its
    /// other packets reached the path's far end. They went on from the attempt that got them
    /// through, not with the resend, and a driver hands that to the next port
    /// ([`Port::enqueue_streamed`]). `None`: the frame went whole with its last attempt.
    pub first_arrival: Option<Nanos>,
}

/// Nanoseconds that `bytes` occupy a link of `bandwidth_bps` (0 when unlimited).
pub fn transmission_ns(bandwidth_bps: Option<f64>, bytes: usize) -> Nanos {
    match bandwidth_bps {
        Some(bps) => round_to_u64((bytes as f64 * 8.0 / bps) * 1e9),
        None => 0,
    }
}

/// `x.round() as u64`, without the library call that `round` is on the x86-64 baseline (the
/// send window and the serialisers ask for it several times per frame, a simulator once
/// per frame): the same value for every `x`, negative, huge and NaN included.
pub fn round_to_u64(x: f64) -> u64 {
    // 2^52: from it to 2^53 the doubles are exactly the integers.
    const INTEGERS: f64 = 4_503_599_627_370_496.0;
    if (0.0..INTEGERS).contains(&x) {
        // Adding 2^52 rounds `x` to an integer (ties to even) that the sum's mantissa
        // holds; the conversions `as` costs (a dozen instructions each way on the x86-64
        // baseline) are not needed. `x - nearest` is exact (they are within 0.5).
        let sum = x + INTEGERS;
        let nearest = sum - INTEGERS;
        let n = sum.to_bits() - INTEGERS.to_bits();
        // A tie rounded down to even: `round` takes it away from zero.
        return if x - nearest == 0.5 { n + 1 } else { n };
    }
    let whole = x as u64;
    // Exact: `x` less its integer part is representable.
    if x - whole as f64 >= 0.5 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// `x.ceil() as usize`, without the library call (see [`round_to_u64`]): the same value for
/// every `x`.
fn ceil_to_usize(x: f64) -> usize {
    let whole = x as usize;
    if (whole as f64) < x {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// Bytes not yet serialised at `now` by a link of `bandwidth_bps` busy until `busy_until`
/// (0 without a bandwidth).
pub fn backlog_bytes(bandwidth_bps: Option<f64>, busy_until: Nanos, now: Nanos) -> usize {
    match bandwidth_bps {
        Some(bps) => {
            let ns = busy_until.saturating_sub(now) as f64;
            ceil_to_usize(ns * 1e-9 * bps / 8.0)
        }
        None => 0,
    }
}

#[cfg(test)]
mod rounding_tests {
    use super::*;
    use proptest::prelude::*;

    const EDGES: [f64; 19] = [
        0.0,
        -0.0,
        0.5,
        0.49999999999999994,
        1.5,
        2.5,
        4503599627370494.5,
        4503599627370495.0,
        4503599627370496.0,
        -0.5,
        -3.7,
        4503599627370495.5,
        9007199254740993.0,
        f64::MIN_POSITIVE,
        1.8446744073709552e19,
        1e300,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];

    #[test]
    fn rounding_helpers_agree_with_the_library_at_the_edges() {
        for x in EDGES {
            assert_eq!(round_to_u64(x), x.round() as u64, "round {x}");
            assert_eq!(ceil_to_usize(x), x.ceil() as usize, "ceil {x}");
        }
    }

    proptest! {
        /// The send window's and the serialisers' rounding, as the library rounds.
        #[test]
        fn rounding_helpers_agree_with_the_library(
            x in prop_oneof![0.0f64..10.0, 0.0f64..1e7, -1e3f64..1e19, any::<f64>()],
        ) {
            prop_assert_eq!(round_to_u64(x), x.round() as u64);
            prop_assert_eq!(ceil_to_usize(x), x.ceil() as usize);
        }

        /// Halfway cases and their neighbours, where rounding to even and away from zero
        /// differ, over the whole range of exact integers and just past it.
        #[test]
        fn round_to_u64_takes_ties_away_from_zero(
            whole in prop_oneof![0u64..1_000, 0u64..(1 << 52), (1u64 << 52)..(1 << 54)],
        ) {
            let tie = whole as f64 + 0.5;
            for x in [tie, f64::from_bits(tie.to_bits() - 1), f64::from_bits(tie.to_bits() + 1)] {
                prop_assert_eq!(round_to_u64(x), x.round() as u64, "{}", x);
            }
        }
    }
}
