//! A frame repaired by resending its lost packets: the rest went on from its first
//! attempt, so the receiver's port serialises it from the first packet's arrival and finishes
//! with the resend, not the whole frame again once the resend is in.

use super::*;
use crate::net::{transmission_ns, FrameIdentity};

/// 160 KB: 111 packets, 13.4 ms at 100 Mbit/s.
const MESSAGE: usize = 160_000;

/// The testbed's hosts: a sender's port at 10 Gbit/s losing 1 % per packet, 100 us to the
/// receiver, whose port is the 100 Mbit/s bottleneck.
fn testbed() -> NetworkProfile {
    NetworkProfile {
        loss: 0.01,
        mtu_bytes: Some(1_500.0),
        bandwidth_bps: Some(1e8),
        worker_bandwidth_bps: Some(1e10),
        latency_ns: 100_000,
        ingress: true,
        ..NetworkProfile::default()
    }
}

/// Every decision of `port`, in the order given.
fn decisions(port: &mut Port) -> Vec<Decision> {
    let mut out = Vec::new();
    while let Some(t) = port.poll_timeout() {
        out.extend(std::iter::from_fn(|| port.poll_decision(t)));
    }
    out
}

#[test]
fn a_repaired_frame_tells_when_its_first_packets_arrived() {
    let mut port = Port::egress(&testbed().worker_nic(), 1, 0);
    for token in 0..200 {
        let meta = FrameMeta {
            identity: Some(FrameIdentity {
                step: 0,
                packet: token,
            }),
            ..FrameMeta::reliable(MESSAGE, 0)
        };
        // One message every 100 ms: each goes alone.
        port.enqueue(token * 100_000_000, token, meta);
    }
    let (mut repaired, mut whole) = (0, 0);
    for d in decisions(&mut port) {
        let Fate::Delivered {
            at,
            retransmissions,
            ..
        } = d.fate
        else {
            panic!("a reliable frame was given up: {d:?}");
        };
        let sent = d.token * 100_000_000;
        match d.first_arrival {
            Some(first) => {
                repaired += 1;
                assert!(retransmissions > 0, "{d:?}");
                // Its first attempt started when it was offered (an idle port), 100 us away.
                assert_eq!(first, sent + 100_000, "{d:?}");
                assert!(first < d.start && first < at, "{d:?}");
            }
            None => {
                whole += 1;
                assert_eq!(retransmissions, 0, "{d:?}");
            }
        }
    }
    // 1 - 0.99^111: two in three messages lose a packet.
    assert!(
        (110..150).contains(&repaired),
        "{repaired} repaired, {whole} whole"
    );
}

#[test]
fn a_receivers_port_serialises_a_repaired_frame_from_its_first_packet() {
    let profile = testbed();
    let deliver = |since: Option<Nanos>, last: Nanos| {
        let mut port = Port::ingress(&profile, 1, 2);
        port.enqueue_streamed(last, 0, FrameMeta::reliable(MESSAGE, 0), since);
        let out = decisions(&mut port);
        match out.as_slice() {
            [Decision {
                fate: Fate::Delivered { at, .. },
                ..
            }] => *at,
            other => panic!("one delivery expected: {other:?}"),
        }
    };
    // Repaired 2 ms after its first packet came: done as if it had come whole then, its
    // 116 packets' time (headers included) after the first came in.
    let bottleneck = deliver(Some(0), 2_000_000);
    assert!(
        (13_300_000..13_500_000).contains(&bottleneck),
        "{bottleneck}"
    );
    // Whole, it streams in with its last attempt, a hundredth of that at the sender's NIC.
    let whole = deliver(None, 2_000_000);
    let streaming = 2_000_000 + bottleneck - bottleneck / 100;
    assert!(
        whole.abs_diff(streaming) < 1_000,
        "{whole} against {streaming}"
    );
    // A resend arriving after the rest has drained finishes a packet's time later.
    let late = bottleneck + 5_000_000;
    let packet = transmission_ns(profile.bandwidth_bps, 1_514);
    assert_eq!(deliver(Some(0), late), late + packet);
}

#[test]
fn a_repaired_frame_handed_over_whole_is_serialised_as_if_it_streamed_in() {
    let profile = testbed();
    let port = || Port::ingress(&profile, 1, 2);
    let delivered = |mut port: Port, at: Nanos, since: Option<Nanos>| {
        port.enqueue_streamed(at, 0, FrameMeta::reliable(MESSAGE, 0), since);
        match decisions(&mut port).as_slice() {
            [Decision {
                fate: Fate::Delivered { at, .. },
                ..
            }] => *at,
            other => panic!("one delivery expected: {other:?}"),
        }
    };
    let decided = |at: Nanos, first_arrival: Option<Nanos>| Decision {
        token: 0,
        fate: Fate::Delivered {
            at,
            retransmissions: 1,
            path: 0,
        },
        start: at,
        done: at,
        first_arrival,
    };
    // The resend in 2 ms after the first packet, or after the rest had drained.
    for at in [2_000_000, 20_000_000] {
        let d = decided(at, Some(0));
        let handover = port().handover_at(&d, MESSAGE);
        let whole = handover.map(|h| delivered(port(), h, None));
        assert_eq!(
            whole,
            Some(delivered(port(), at, Some(0))),
            "resend at {at}"
        );
        assert!(handover.is_some_and(|h| h <= at));
    }
    // A frame that went whole with its last attempt is handed over as delivered.
    assert_eq!(
        port().handover_at(&decided(2_000_000, None), MESSAGE),
        Some(2_000_000)
    );
}
