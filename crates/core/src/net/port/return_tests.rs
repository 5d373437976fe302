//! A reliable flow's acknowledgements come back through its host's downlink, behind the
//! data converging on the host: the round trip it measures holds that wait, each frame
//! ahead counted at most an initial window.

use super::*;

/// 100 Mbit/s, 50 us each way, packets of 1,500 bytes, a deep queue (flows modelled).
fn profile() -> NetworkProfile {
    NetworkProfile {
        bandwidth_bps: Some(1e8),
        latency_ns: 50_000,
        queue_bytes: Some(10_000_000),
        mtu_bytes: Some(1_500.0),
        ingress: true,
        ..NetworkProfile::default()
    }
}

/// A downlink holding one 200 KB frame of each of four flows at `t` 0.
fn busy_downlink() -> Port {
    let mut ingress = Port::ingress(&profile(), 1, 0);
    for flow in 1..=4 {
        ingress.enqueue(0, flow, FrameMeta::reliable(200_000, flow));
    }
    ingress
}

/// Ten segments of 1,448 bytes with their 66 bytes of headers, at 100 Mbit/s.
const INITIAL_WINDOW_NS: Nanos = 15_140 * 80;

#[test]
fn an_ack_waits_for_an_initial_window_of_each_frame_ahead() {
    let ingress = busy_downlink();
    assert_eq!(ingress.ack_wait_ns(0), 4 * INITIAL_WINDOW_NS);
    // The first frame (139 packets) has half a window left: that and three windows remain.
    let first_done = (200_000 + 139 * 66) * 80;
    let t = first_done - INITIAL_WINDOW_NS / 2;
    assert_eq!(
        ingress.ack_wait_ns(t),
        3 * INITIAL_WINDOW_NS + INITIAL_WINDOW_NS / 2
    );
    // The first frame has left: three windows.
    assert_eq!(ingress.ack_wait_ns(first_done), 3 * INITIAL_WINDOW_NS);
    assert_eq!(ingress.ack_wait_ns(4 * first_done), 0);
}

/// The smoothed round trip of flow 9 after one frame offered at `t` 0 at an egress port
/// whose host's downlink is `downlink`.
fn srtt_after_one_frame(downlink: Option<&Port>) -> Nanos {
    let mut egress = Port::egress(&profile(), 1, 0);
    egress.enqueue_at_host(0, 0, FrameMeta::reliable(1_448, 9), downlink);
    while egress.poll_decision(Nanos::MAX / 2).is_some() {}
    let slot = egress.slots.get(9).unwrap_or_default();
    egress.tcp.flows[slot].srtt_ns()
}

#[test]
fn a_flow_s_round_trip_holds_the_wait_at_its_host_s_downlink() {
    let idle = srtt_after_one_frame(None);
    let downlink = busy_downlink();
    let behind = srtt_after_one_frame(Some(&downlink));
    // One sample of RFC 6298's smoothing: an eighth of the extra wait.
    let extra = behind - idle;
    let expected = 4 * INITIAL_WINDOW_NS / 8;
    assert!(extra.abs_diff(expected) <= 1, "{extra} ns, not {expected}");
}
