//! Timed outages (`--blackout`): every packet that crosses a path while the network is out
//! is lost, datagrams and TCP alike, and TCP's resends inside the outage are lost too.

use super::*;
use crate::net::{Blackout, FrameIdentity};

const MS: Nanos = 1_000_000;

/// A 1 Gbit/s network out for the last millisecond of every 10.
fn out_1ms_in_10() -> NetworkProfile {
    NetworkProfile {
        bandwidth_bps: Some(1e9),
        blackout: Some(Blackout::per_second(MS).with_period(10 * MS)),
        ..NetworkProfile::default()
    }
}

#[test]
fn a_datagram_is_lost_exactly_when_it_crosses_during_an_outage() {
    let profile = out_1ms_in_10();
    let outage = profile.blackout.unwrap();
    let mut port = Port::egress(&profile, 5, 1);
    for packet in 0..250u64 {
        let meta = FrameMeta {
            reliable: false,
            identity: Some(FrameIdentity { step: 0, packet }),
            ..FrameMeta::reliable(12_500, 1)
        };
        port.enqueue(packet * 200_000, packet, meta);
    }
    let (mut lost, mut delivered) = (0, 0);
    while let Some(t) = port.poll_timeout() {
        while let Some(d) = port.poll_decision(t) {
            let out = outage.is_out(d.done);
            match d.fate {
                Fate::Lost { .. } if out => lost += 1,
                Fate::Delivered { .. } if !out => delivered += 1,
                other => panic!("{other:?} crossing at {} ns", d.done),
            }
        }
    }
    // Five outages of 1 ms, five datagrams crossing in each.
    assert_eq!((lost, delivered), (25, 225));
}

#[test]
fn a_reliable_frame_lost_in_an_outage_is_resent_after_it() {
    let profile = NetworkProfile {
        rto_ns: 5 * MS,
        blackout: Some(Blackout::per_second(20 * MS).with_period(100 * MS)),
        ..out_1ms_in_10()
    };
    let mut port = Port::egress(&profile, 5, 1);
    // 100 us on the wire, crossing at 81.1 ms: the probe's resend at about 85 ms is lost
    // too, then the timeouts' until one crosses after 100 ms.
    port.enqueue(81 * MS, 0, FrameMeta::reliable(12_500, 9));
    let mut fates = Vec::new();
    while let Some(t) = port.poll_timeout() {
        while let Some(d) = port.poll_decision(t) {
            fates.push(d.fate);
        }
    }
    let [Fate::Delivered {
        at,
        retransmissions,
        ..
    }] = fates[..]
    else {
        panic!("{fates:?}");
    };
    assert!(at > 100 * MS && at < 130 * MS, "delivered at {at}");
    assert!(retransmissions >= 2, "{retransmissions} resends");
    assert_eq!(port.counters().frames_lost, u64::from(retransmissions));
}
