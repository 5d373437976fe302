//! Losses drawn from the frame's identity: the same seed loses the same packets whatever
//! order they reach the port in, and a resend of a lost packet is a new attempt.

use proptest::prelude::*;

use super::*;
use crate::net::FrameIdentity;

/// A loss-tolerant packet `packet` of step `step` on `flow`, of `bytes`.
fn packet(flow: u64, step: u64, packet: u64, bytes: usize) -> FrameMeta {
    FrameMeta {
        reliable: false,
        identity: Some(FrameIdentity { step, packet }),
        ..FrameMeta::reliable(bytes, flow)
    }
}

/// The lossy profile of the DLCP reproducibility check: 2 % per 1,500-byte packet.
pub(super) fn lossy() -> NetworkProfile {
    NetworkProfile {
        loss: 0.02,
        mtu_bytes: Some(1_500.0),
        bandwidth_bps: Some(1e9),
        ..NetworkProfile::default()
    }
}

/// Offers `frames` (flow, step, packet) in this order, one every microsecond, on an egress
/// port of `seed`; returns the identities lost, sorted.
fn lost_in_order(seed: u64, frames: &[(u64, u64, u64)]) -> Vec<(u64, u64, u64)> {
    let mut port = Port::egress(&lossy(), seed, 1);
    for (i, &(flow, step, p)) in frames.iter().enumerate() {
        port.enqueue(i as u64 * 1_000, i as u64, packet(flow, step, p, 8_000));
    }
    let mut lost = Vec::new();
    while let Some(t) = port.poll_timeout() {
        while let Some((token, fate)) = port.poll_fate(t) {
            if matches!(fate, Fate::Lost { .. }) {
                lost.push(frames[token as usize]);
            }
        }
    }
    lost.sort_unstable();
    lost
}

#[test]
fn the_same_identity_draws_the_same_loss_and_a_resend_draws_anew() {
    let frames: Vec<(u64, u64, u64)> = (0..2_000).map(|i| (i % 2, 0, i)).collect();
    let lost = lost_in_order(3, &frames);
    // 8,000 bytes are 6 packets: 1 - 0.98^6, about 11 % of the frames.
    assert!((100..350).contains(&lost.len()), "{}", lost.len());
    assert_eq!(lost, lost_in_order(3, &frames));
    assert_ne!(lost, lost_in_order(4, &frames));
    // Every packet offered twice: the second offer is an attempt of its own.
    let twice: Vec<_> = frames.iter().chain(&frames).copied().collect();
    let both = lost_in_order(3, &twice);
    let lost_twice = both.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(
        lost_twice < lost.len() / 4,
        "{lost_twice} of {}",
        lost.len()
    );
}

proptest! {
    /// Two runs of the same seed lose the same packets whatever order the packets reach
    /// the port in (the runtime's order depends on timing).
    #[test]
    fn losses_do_not_depend_on_arrival_order(
        seed in any::<u64>(),
        frames in prop::collection::btree_set((0u64..4, 0u64..3, 0u64..500), 1..300),
        shuffle in any::<u64>(),
    ) {
        let frames: Vec<_> = frames.into_iter().collect();
        let mut shuffled = frames.clone();
        let mut rng = SplitMix64::new(shuffle);
        for i in (1..shuffled.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            shuffled.swap(i, j);
        }
        prop_assert_eq!(lost_in_order(seed, &frames), lost_in_order(seed, &shuffled));
    }

    /// The draw key is a function of (flow, step, packet, attempt) alone.
    #[test]
    fn the_draw_key_depends_only_on_the_identity(
        flow in any::<u64>(), step in 0u64..10, p in any::<u64>(), others in prop::collection::vec((any::<u64>(), 0u64..10, any::<u64>()), 0..50),
    ) {
        let id = FrameIdentity { step, packet: p };
        let mut a = Attempts::default();
        let first = a.draw_key(flow, id);
        let mut b = Attempts::default();
        for &(f, s, q) in &others {
            let other = FrameIdentity { step: s.min(step), packet: q };
            if (f, other) != (flow, id) {
                b.draw_key(f, other);
            }
        }
        prop_assert_eq!(b.draw_key(flow, id), first);
        prop_assert_ne!(a.draw_key(flow, id), first, "a second offer is a new attempt");
    }
}
