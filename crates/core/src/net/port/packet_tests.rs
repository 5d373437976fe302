//! Packets on the wire (`--mtu`): a full packet is the MTU and its Ethernet header, and
//! loss strikes it once, so a full-size datagram is lost at the path's rate, not twice it.

use super::keyed_tests::lossy;
use super::*;
use crate::net::FrameIdentity;

/// The share of `frames` datagrams of `bytes` lost on an egress port losing 2 % per packet.
fn lost_share(bytes: usize, frames: u64) -> f64 {
    let mut port = Port::egress(&lossy(), 3, 1);
    for packet in 0..frames {
        let meta = FrameMeta {
            reliable: false,
            identity: Some(FrameIdentity { step: 0, packet }),
            ..FrameMeta::reliable(bytes, 1)
        };
        port.enqueue(packet * 20_000, packet, meta);
    }
    let mut lost = 0u64;
    while let Some(t) = port.poll_timeout() {
        while let Some(d) = port.poll_decision(t) {
            lost += u64::from(matches!(d.fate, Fate::Lost { .. }));
        }
    }
    lost as f64 / frames as f64
}

#[test]
fn a_full_size_datagram_is_one_packet_and_lost_at_the_paths_rate() {
    // 1,472 bytes of UDP payload: 1,514 on the wire, one packet.
    let full = lost_share(1_472, 40_000);
    assert!((0.017..0.023).contains(&full), "{full}");
    // One byte more is two packets: 1 - 0.98^2.
    let two = lost_share(1_473, 40_000);
    assert!((0.036..0.043).contains(&two), "{two}");
}
