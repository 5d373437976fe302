//! Random loss on a path: Bernoulli, or bursty (Gilbert-Elliott), from a seeded stream;
//! per frame, or per packet of a frame (a frame is lost when any of its packets is).
//! Bernoulli loss of a frame with a draw key is a pure function of the path's seed and the
//! key (the frame's identity), whatever came before it; the bursty chain's state moves
//! frame by frame in arrival order, so it draws from the stream.

use super::profile::{BurstLoss, PathSpec};
use super::rng::SplitMix64;
use super::tcp::MAX_BACKOFFS;

/// Mixed into a frame's draw key for its acknowledgement's draw.
const ACK_KEY: u64 = 0xAC4_0000_0001;
/// Mixed in too for the draws of its windows' acknowledgements.
const WINDOWS_KEY: u64 = 0x3D;
/// Mixed in too for the draws of what would reveal a loss at the end of a small window's
/// round (the ACK of the packet before it, the data that ACK lets go).
const REVEAL_KEY: u64 = 0x5E7;
/// Mixed in too for the draw of the acknowledgement of a resend's first packet after a
/// timeout.
const HEAD_ACK_KEY: u64 = 0x4EAD;
/// Mixed in too for the draws of a timeout's lone resend and its answer.
const HEAD_KEY: u64 = 0x4EAE;
/// A window's acknowledgements all lost less often than this is taken never to happen
/// (windows of more than a few packets: no draws).
const MIN_WINDOW_STALL: f64 = 1e-6;

/// The loss process of one path: decides, frame by frame, whether it is lost.
#[derive(Debug, Clone)]
pub(crate) struct LossProcess {
    /// Loss probability in the good state (the only state without bursts).
    good: f64,
    burst: Option<BurstLoss>,
    in_burst: bool,
    /// Timed outages strike the path too (decided by the port, which knows the times).
    blackout: bool,
    /// Bytes of one packet when loss strikes packets (`None`: it strikes whole frames).
    packet_bytes: Option<f64>,
    rng: SplitMix64,
    /// The seed of keyed draws (from the path's stream, before any draw).
    key_seed: u64,
}

impl LossProcess {
    /// The process of `spec`, drawing from `rng`.
    pub fn new(spec: &PathSpec, rng: SplitMix64) -> Self {
        Self {
            good: spec.loss,
            burst: spec.loss_burst,
            in_burst: false,
            blackout: spec.blackout.is_some(),
            packet_bytes: spec.packet_bytes,
            key_seed: rng.clone().next_u64(),
            rng,
        }
    }

    /// How many packets of the next frame, of `bytes`, are lost (0: it arrives whole).
    /// Per frame: one unit, decided in the current state, then the chain moves (with
    /// bursts). Per packet: each of its packets is decided so in turn; without bursts that
    /// is one draw of whether any is lost (`1 - (1 - p)^packets`), then, for a lost frame
    /// only, where the first loss falls and the fate of each packet after it. Draws nothing
    /// when no loss is configured.
    pub fn lose(&mut self, bytes: usize) -> u64 {
        let packets = self.packets(bytes);
        let Some(b) = self.burst else {
            return lose_bernoulli(self.good, packets, &mut self.rng);
        };
        (0..packets).map(|_| self.lose_one(b) as u64).sum()
    }

    /// [`LossProcess::lose`] for a frame whose draws come from `key` (its identity's draw
    /// key): without bursts, the same key on a path of the same seed loses the same packets
    /// whatever was decided before; with bursts, or without a key, the stream decides.
    pub fn lose_keyed(&mut self, bytes: usize, key: Option<u64>) -> u64 {
        match key {
            Some(key) if self.burst.is_none() => {
                let mut rng = SplitMix64::derive(&[self.key_seed, key]);
                lose_bernoulli(self.good, self.packets(bytes), &mut rng)
            }
            _ => self.lose(bytes),
        }
    }

    /// Whether `acks` acknowledgements of a delivered frame are all lost on their way back,
    /// each as one packet of this path's loss in its current state: the reverse path is
    /// taken to lose as this one does (the testbed drops at a port in both directions).
    /// Drawn from `key`'s own stream where the frame has one (so its data's draws are
    /// unchanged; one draw, so the ACKs that lose two also lose one), else from the path's.
    pub fn lose_acks(&mut self, key: Option<u64>, acks: u64) -> bool {
        let p = self.packet_loss_now();
        if p <= 0.0 {
            return false;
        }
        let all = p.powi(i32::try_from(acks.max(1)).unwrap_or(i32::MAX));
        match key {
            Some(key) => SplitMix64::derive(&[self.key_seed, key, ACK_KEY]).chance(all),
            None => self.rng.chance(all),
        }
    }

    /// Whether any of `packets` packets of a frame's exchange after its data (an ACK, the
    /// data the ACK lets go) is lost, each as one packet of this path's loss in its current
    /// state. Drawn from `key`'s own stream where the frame has one, else from the path's.
    pub fn lose_any(&mut self, key: Option<u64>, packets: u64) -> bool {
        self.lose_any_of(key, packets, REVEAL_KEY)
    }

    /// Whether the acknowledgement of the first packet a flow resends after a timeout (the
    /// one packet its window then holds) is lost: one packet of this path's loss in its
    /// current state, drawn from `key`'s own stream where the frame has one.
    pub fn lose_head_ack(&mut self, key: Option<u64>) -> bool {
        self.lose_any_of(key, 1, HEAD_ACK_KEY)
    }

    /// How many times in a row the lone packet a flow resends at a timeout, or the ACK that
    /// answers it, is lost (each try: either of two packets of this path's loss in its
    /// current state), so that the next timeout, backed off, finds it again; at most
    /// [`MAX_BACKOFFS`].
    /// Drawn from `key`'s own stream for the flow's `nth` such timeout of the frame.
    pub fn lose_resent_head(&mut self, key: Option<u64>, nth: u64) -> u32 {
        let p = self.packet_loss_now();
        if p <= 0.0 {
            return 0;
        }
        let either = 1.0 - (1.0 - p) * (1.0 - p);
        let mut own;
        let rng = match key {
            Some(key) => {
                own = SplitMix64::derive(&[self.key_seed, key, ACK_KEY, HEAD_KEY, nth]);
                &mut own
            }
            None => &mut self.rng,
        };
        (0..MAX_BACKOFFS).take_while(|_| rng.chance(either)).count() as u32
    }

    /// Whether any of `packets` packets is lost, drawn from `key`'s stream salted with
    /// `salt` (one stream per kind of draw), else from the path's.
    fn lose_any_of(&mut self, key: Option<u64>, packets: u64, salt: u64) -> bool {
        let p = self.packet_loss_now();
        if p <= 0.0 {
            return false;
        }
        let any = 1.0 - (1.0 - p).powi(i32::try_from(packets).unwrap_or(i32::MAX));
        match key {
            Some(key) => SplitMix64::derive(&[self.key_seed, key, ACK_KEY, salt]).chance(any),
            None => self.rng.chance(any),
        }
    }

    /// Of the windows a frame was sent in by a flow with a small window (`windows`: how
    /// many windows of how many acknowledgements, in the order sent), how many lose every
    /// one of their acknowledgements on the way back (each as one packet of this path's
    /// loss in its current state), leaving the sender with nothing to clock it on. Drawn
    /// from `key`'s own stream where the frame has one, else from the path's.
    pub fn lose_windows_acks(
        &mut self,
        key: Option<u64>,
        windows: impl IntoIterator<Item = (u64, u32)>,
    ) -> u64 {
        let p = self.packet_loss_now();
        let mut own;
        let rng = match key {
            Some(key) => {
                own = SplitMix64::derive(&[self.key_seed, key, ACK_KEY, WINDOWS_KEY]);
                &mut own
            }
            None => &mut self.rng,
        };
        let mut stalls = 0;
        for (count, acks) in windows {
            let all = p.powi(i32::try_from(acks).unwrap_or(i32::MAX));
            if all >= MIN_WINDOW_STALL {
                stalls += (0..count).filter(|_| rng.chance(all)).count() as u64;
            }
        }
        stalls
    }

    /// The chance of losing one packet in the chain's current state.
    fn packet_loss_now(&self) -> f64 {
        match self.burst {
            Some(b) if self.in_burst => b.loss_in_burst,
            _ => self.good,
        }
    }

    /// Whether no frame is ever lost (no loss rate, no bursts, no outages).
    pub fn never_loses(&self) -> bool {
        self.good <= 0.0 && self.burst.is_none() && !self.blackout
    }

    /// The bytes a reliable transport sends again for a frame of `bytes` that lost `lost`
    /// packets: those packets (the last one perhaps short), or the whole frame when loss
    /// strikes whole frames.
    pub fn resend_bytes(&self, bytes: usize, lost: u64) -> usize {
        match self.packet_bytes {
            Some(mtu) => ((lost as f64 * mtu).ceil() as usize).clamp(1, bytes.max(1)),
            None => bytes,
        }
    }

    /// Packets a frame of `bytes` crosses the path as: one per started packet (at least
    /// one), or one when loss strikes whole frames.
    pub fn packets(&self, bytes: usize) -> u64 {
        match self.packet_bytes {
            // A float-to-integer cast saturates; a frame is never zero packets.
            Some(mtu) => ((bytes as f64 / mtu).ceil() as u64).max(1),
            None => 1,
        }
    }

    /// One step of the Gilbert-Elliott chain: whether this unit is lost, then the move.
    fn lose_one(&mut self, b: BurstLoss) -> bool {
        let p = if self.in_burst {
            b.loss_in_burst
        } else {
            self.good
        };
        let lost = p > 0.0 && self.rng.chance(p);
        let flip = if self.in_burst { b.p_leave } else { b.p_enter };
        if self.rng.chance(flip) {
            self.in_burst = !self.in_burst;
        }
        lost
    }
}

/// Lost packets out of `n`, each lost with `p`, independently, drawn from `rng`.
fn lose_bernoulli(p: f64, n: u64, rng: &mut SplitMix64) -> u64 {
    let any = any_of(p, n);
    if !(any > 0.0 && rng.chance(any)) {
        return 0;
    }
    if n == 1 {
        return 1;
    }
    if p >= 1.0 {
        return n;
    }
    // The first loss, given that there is one: P(i) = (1 - p)^i p / any, by inversion.
    let u = rng.next_f64();
    let first = ((-u * any).ln_1p() / (-p).ln_1p()).ceil() - 1.0;
    let first = (first.max(0.0) as u64).min(n - 1);
    let after = (first + 1..n).filter(|_| rng.chance(p)).count() as u64;
    1 + after
}

/// Probability that at least one of `n` independent units, each lost with `p`, is lost:
/// `1 - (1 - p)^n`, computed without cancellation for small `p`; exactly `p` for one unit.
fn any_of(p: f64, n: u64) -> f64 {
    if n <= 1 || p <= 0.0 {
        return p;
    }
    -(n as f64 * (-p).ln_1p()).exp_m1()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(loss: f64, loss_burst: Option<BurstLoss>) -> PathSpec {
        PathSpec {
            bandwidth_bps: None,
            latency_ns: 0,
            loss,
            loss_burst,
            packet_bytes: None,
            blackout: None,
        }
    }

    /// Realised Bernoulli loss over 10^5 frames lies within 3 sigma of p.
    #[test]
    fn bernoulli_rate_within_three_sigma() {
        let n = 100_000;
        for (p, seed) in [(0.01, 1u64), (0.1, 2), (0.5, 3)] {
            let mut l = LossProcess::new(&spec(p, None), SplitMix64::derive(&[seed]));
            let lost = (0..n).filter(|_| l.lose(1) > 0).count() as f64;
            let sigma = (n as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (lost - n as f64 * p).abs() < 3.0 * sigma,
                "p {p}: {lost} lost of {n}"
            );
        }
        let mut none = LossProcess::new(&spec(0.0, None), SplitMix64::new(0));
        assert!((0..n).all(|_| none.lose(1) == 0));
    }

    /// With every burst frame lost and none outside, runs of losses are the bursts: their
    /// mean length is 1 / p_leave and the loss rate p_enter / (p_enter + p_leave).
    #[test]
    fn gilbert_elliott_burst_length_and_stationary_rate() {
        let b = BurstLoss {
            p_enter: 0.01,
            p_leave: 0.25,
            loss_in_burst: 1.0,
        };
        let mut l = LossProcess::new(&spec(0.0, Some(b)), SplitMix64::derive(&[9]));
        let n = 400_000;
        let (mut lost, mut runs, mut prev) = (0u64, 0u64, false);
        for _ in 0..n {
            let x = l.lose(1) > 0;
            lost += x as u64;
            runs += (x && !prev) as u64;
            prev = x;
        }
        let mean_run = lost as f64 / runs as f64;
        assert!((mean_run - 4.0).abs() < 0.2, "mean burst {mean_run}");
        let rate = lost as f64 / n as f64;
        let expect = b.stationary_loss(0.0);
        assert!(
            (rate - expect).abs() < 0.1 * expect,
            "rate {rate} vs {expect}"
        );
    }

    /// A half-lossy burst state and a lossy good state give the mixed stationary rate.
    #[test]
    fn gilbert_elliott_mixed_rate() {
        let b = BurstLoss {
            p_enter: 0.05,
            p_leave: 0.2,
            loss_in_burst: 0.5,
        };
        let mut l = LossProcess::new(&spec(0.01, Some(b)), SplitMix64::derive(&[4]));
        let n = 200_000;
        let rate = (0..n).filter(|_| l.lose(1) > 0).count() as f64 / n as f64;
        let expect = b.stationary_loss(0.01);
        assert!(
            (rate - expect).abs() < 0.1 * expect,
            "rate {rate} vs {expect}"
        );
    }

    /// A timeout's lone resend or its answer is lost as either of two packets: a chain of
    /// `k` or more such losses comes with probability `q^k`, `q = 1 - (1 - p)^2`; the same
    /// key gives the same chain, and a lossless path none.
    #[test]
    fn a_timeout_s_lone_resend_is_lost_again_as_either_of_two_packets() {
        let p = 0.1;
        let mut l = LossProcess::new(&spec(p, None), SplitMix64::derive(&[5]));
        let n = 100_000u64;
        let chains: Vec<u32> = (0..n).map(|key| l.lose_resent_head(Some(key), 1)).collect();
        let q = 1.0 - (1.0 - p) * (1.0 - p);
        for k in 1..=3 {
            let at_least = chains.iter().filter(|&&c| c >= k).count() as f64;
            let expect = q.powi(k as i32) * n as f64;
            let sigma = (expect * (1.0 - q.powi(k as i32))).sqrt();
            assert!((at_least - expect).abs() < 4.0 * sigma, "{k}: {at_least}");
        }
        assert_eq!(l.lose_resent_head(Some(7), 1), chains[7]);
        let mut none = LossProcess::new(&spec(0.0, None), SplitMix64::new(0));
        assert!((0..n).all(|key| none.lose_resent_head(Some(key), 1) == 0));
    }

    fn per_packet(spec: PathSpec, mtu: f64) -> PathSpec {
        PathSpec {
            packet_bytes: Some(mtu),
            ..spec
        }
    }

    /// Per packet, a frame of k packets is lost at 1 - (1 - p)^k (within 3 sigma), and a
    /// frame's size is rounded up to whole packets.
    #[test]
    fn per_packet_frame_loss_rate() {
        let n = 100_000;
        // 8 KiB + header in 1500-byte packets: 6; a P3 slice of 160,000 bytes: 107.
        for (bytes, k, seed) in [(8_240usize, 6i32, 5u64), (160_000, 107, 6), (1_500, 1, 7)] {
            let p = 0.01;
            let s = per_packet(spec(p, None), 1_500.0);
            let mut l = LossProcess::new(&s, SplitMix64::derive(&[seed]));
            let (mut lost, mut packets) = (0.0, 0.0);
            for _ in 0..n {
                let k = l.lose(bytes);
                lost += (k > 0) as u64 as f64;
                packets += k as f64;
            }
            let q = 1.0 - (1.0 - p).powi(k);
            let sigma = (n as f64 * q * (1.0 - q)).sqrt();
            assert!(
                (lost - n as f64 * q).abs() < 3.0 * sigma,
                "{bytes} bytes: {lost} lost of {n}, expected {q}"
            );
            // Each of the k packets is lost with p: k p lost per frame on average.
            let mean = n as f64 * f64::from(k) * p;
            let sigma = (mean * (1.0 - p)).sqrt();
            assert!(
                (packets - mean).abs() < 3.0 * sigma,
                "{bytes} bytes: {packets} packets lost, expected {mean}"
            );
        }
    }

    /// What a reliable transport sends again: the lost packets, or the whole frame.
    #[test]
    fn resend_bytes_are_the_lost_packets_or_the_frame() {
        let rng = SplitMix64::new(1);
        let packets = LossProcess::new(&per_packet(spec(0.01, None), 1_500.0), rng.clone());
        assert_eq!(packets.resend_bytes(160_048, 2), 3_000);
        assert_eq!(packets.resend_bytes(1_000, 1), 1_000);
        let frames = LossProcess::new(&spec(0.01, None), rng);
        assert_eq!(frames.resend_bytes(160_048, 1), 160_048);
    }

    #[test]
    fn any_of_is_exact_for_one_unit_and_accurate_for_many() {
        assert_eq!(any_of(0.01, 1), 0.01);
        assert_eq!(any_of(0.0, 1_000), 0.0);
        assert_eq!(any_of(1.0, 3), 1.0);
        assert!((any_of(1e-9, 1_000) - 1e-6).abs() < 1e-12);
        assert!((any_of(0.01, 107) - (1.0 - 0.99f64.powi(107))).abs() < 1e-12);
    }

    proptest! {
        /// A frame no larger than one packet is decided exactly as loss per frame decides
        /// it, with or without bursts: the same seed gives the same losses.
        #[test]
        fn one_packet_frames_match_loss_per_frame(
            seed in any::<u64>(),
            p in 0.0f64..1.0,
            bursty in any::<bool>(),
            sizes in proptest::collection::vec(1usize..=1_500, 1..200),
        ) {
            let burst = bursty.then_some(BurstLoss { p_enter: 0.05, p_leave: 0.3, loss_in_burst: 0.7 });
            let rng = SplitMix64::derive(&[seed]);
            let mut frames = LossProcess::new(&spec(p, burst), rng.clone());
            let mut packets = LossProcess::new(&per_packet(spec(p, burst), 1_500.0), rng);
            for b in sizes {
                prop_assert_eq!(frames.lose(b), packets.lose(b));
            }
        }

        /// Bursty loss per packet: a frame of k packets loses exactly as many packets as
        /// the next k decisions of the per-frame chain (same seed) lose.
        #[test]
        fn bursty_packets_are_consecutive_chain_steps(
            seed in any::<u64>(),
            good in 0.0f64..0.2,
            counts in proptest::collection::vec(1usize..40, 1..60),
        ) {
            let burst = Some(BurstLoss { p_enter: 0.02, p_leave: 0.25, loss_in_burst: 0.8 });
            let rng = SplitMix64::derive(&[seed]);
            let mut chain = LossProcess::new(&spec(good, burst), rng.clone());
            let mut packets = LossProcess::new(&per_packet(spec(good, burst), 1_000.0), rng);
            for k in counts {
                let expect: u64 = (0..k).map(|_| chain.lose(1)).sum();
                prop_assert_eq!(packets.lose(k * 1_000 - 1), expect);
            }
        }
    }
}
