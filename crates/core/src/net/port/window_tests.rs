//! A congestion window grows only while its flow uses it (Linux's `tcp_is_cwnd_limited`):
//! a sender that offers less than its window allows keeps the initial window.

use super::*;

/// The largest window (segments) flow 0 had at an egress port of 1 Gbit/s and a 100 us
/// round trip, its sender offering `frames` frames of `bytes`, each `gap` ns after the one
/// before or (`gap` 0) as soon as the send window and its socket have room.
fn largest_window(bytes: usize, frames: u64, gap: Nanos) -> u64 {
    let profile = NetworkProfile {
        bandwidth_bps: Some(1e9),
        latency_ns: 50_000,
        queue_bytes: Some(10_000_000),
        mtu_bytes: Some(1_500.0),
        ..NetworkProfile::default()
    };
    let mut port = Port::egress(&profile, 1, 0);
    let (mut now, mut token) = (0, 0);
    loop {
        while token < frames && port.has_room(now) && port.flow_has_room(0) && now >= token * gap {
            port.enqueue(now, token, FrameMeta::reliable(bytes, 0));
            token += 1;
        }
        while port.poll_decision(now).is_some() {}
        let room = match port.flow_has_room(0) {
            true => port.room_at(now),
            false => port.flow_room_at(now).unwrap_or(now),
        };
        let next_offer = (token < frames).then(|| room.max(token * gap));
        match next_offer.into_iter().chain(port.poll_timeout()).min() {
            Some(t) => now = t.max(now),
            None => return port.counters().cwnd_segments_max,
        }
    }
}

#[test]
fn a_sender_short_of_its_window_keeps_the_initial_window() {
    // Two segments a millisecond: 2 in flight, under half the initial window.
    assert_eq!(largest_window(2_896, 2_000, 1_000_000), 10);
}

#[test]
fn a_sender_that_fills_its_window_grows_it() {
    // Frames of 10 segments offered at once: the window holds them back and grows.
    let bulk = largest_window(14_480, 2_000, 0);
    assert!(bulk > 100, "{bulk} segments");
}

/// A flow whose window holds a socket's worth of frames takes no more, and leaves the send
/// window to the host's other flows; it has room again when its window lets one go.
#[test]
fn a_full_socket_blocks_its_flow_alone() {
    let profile = NetworkProfile {
        bandwidth_bps: Some(1e9),
        latency_ns: 50_000,
        queue_bytes: Some(10_000_000),
        mtu_bytes: Some(1_500.0),
        buffer_bytes: 64 << 10,
        ..NetworkProfile::default()
    };
    let mut port = Port::egress(&profile, 1, 0);
    let mut token = 0;
    while port.flow_has_room(0) && token < 1_000 {
        port.enqueue(0, token, FrameMeta::reliable(14_480, 0));
        token += 1;
        while port.poll_decision(0).is_some() {}
    }
    assert!(token < 1_000, "the flow's socket never filled");
    assert!(port.flow_has_room(1), "another flow still has room");
    assert!(port.has_room(0) || port.backlog_bytes(0) <= 64 << 10);
    let at = port
        .flow_room_at(0)
        .expect("a full socket says when to ask again");
    assert!(at > 0);
    let mut now = 0;
    while !port.flow_has_room(0) {
        now = port
            .poll_timeout()
            .expect("the held frames are let go in time");
        while port.poll_decision(now).is_some() {}
    }
    assert_eq!(port.flow_room_at(now), None);
}
