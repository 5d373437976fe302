//! How a reliable frame's loss is found when nothing of its flow follows it (the flow's
//! tail): the loss probe, waiting for the delayed ACK where the lost packet is alone, or the
//! timeout where the flow is still recovering an earlier loss (Linux probes only in Open).

use super::keyed_tests::lossy;
use super::reliable::{self, frame_loss, FrameLoss};
use super::*;
use crate::net::blackout::BlackedOut;
use crate::net::tcp::TimeoutCause;

const MS: Nanos = 1_000_000;
/// A timeout of any cause (the window's reaction does not depend on it).
const TIMEOUT: Recovery = Recovery::Timeout(TimeoutCause::ResendLast);

/// A new reliable frame of flow 9 on `port` (its flow made, nothing else of it in the port).
fn lone_frame(port: &mut Port) -> Held {
    let meta = FrameMeta::reliable(144_800, 9);
    Held {
        token: 0,
        meta,
        seq: 0,
        offered: 0,
        retransmissions: 0,
        wire_bytes: meta.bytes,
        slot: port.slot(meta.flow),
        draw: None,
        timeouts: 0,
        pacing: Pacing::Cleared,
        found_by: None,
        tail_repair: false,
        later: 0,
        streamed: None,
        conserving: false,
    }
}

/// A frame of 100 packets, 10 us each, whose last lost packet left at `last`.
fn lost(last: Nanos, before: Option<Nanos>) -> FrameLoss {
    FrameLoss {
        last,
        final_packet: last == MS,
        after: MS.saturating_sub(last) / 10_000,
        before,
        packet_ns: 10_000,
        packets: 100,
        stalled: false,
        reveal_lost: false,
    }
}

/// The port of [`lossy`] (a round trip of 500 us) and a lone frame on it.
fn port_and_frame() -> (Port, Held) {
    let profile = NetworkProfile {
        latency_ns: MS / 4,
        ..lossy()
    };
    let mut port = Port::egress(&profile, 1, 1);
    let held = lone_frame(&mut port);
    (port, held)
}

#[test]
fn a_lost_final_packet_alone_is_probed_after_the_delayed_ack_and_anything_else_sacked() {
    let (port, held) = port_and_frame();
    let lone = Recovery::LossProbe { lone: true };
    assert_eq!(port.recovery_of(&held, &mut lost(MS, None)), lone);
    // An earlier loss repaired more than a round trip before: the final one is alone again.
    assert_eq!(port.recovery_of(&held, &mut lost(MS, Some(0))), lone);
    // A packet after the lost one arrived: SACK reveals it.
    assert_eq!(
        port.recovery_of(&held, &mut lost(MS - 20_000, None)),
        Recovery::Sack
    );
}

#[test]
fn a_tail_lost_while_the_flow_recovers_waits_for_the_timeout() {
    let (mut port, mut held) = port_and_frame();
    // Another loss within the round trip, with packets between them that SACK reveals it
    // by: the flow is in recovery when the probe would fire.
    let mut near = lost(MS, Some(MS - 300_000));
    assert_eq!(
        port.recovery_of(&held, &mut near),
        Recovery::Timeout(TimeoutCause::OriginalInRecovery)
    );
    // The packet just before it lost too: nothing reveals that one before the probe, which
    // fires with two packets outstanding.
    let mut adjacent = lost(MS, Some(MS - 10_000));
    assert_eq!(
        port.recovery_of(&held, &mut adjacent),
        Recovery::LossProbe { lone: false }
    );
    // An earlier frame's loss still being repaired.
    let flow = &mut port.tcp.flows[held.slot];
    flow.on_loss(CongestionControl::Cubic, Recovery::Sack, 0, MS, 1_448.0);
    assert_eq!(
        port.recovery_of(&held, &mut lost(MS, None)),
        Recovery::Timeout(TimeoutCause::OriginalInRecovery)
    );
    // A lost resend of a tail: the timeout.
    held.retransmissions = 1;
    assert_eq!(
        port.recovery_of(&held, &mut lost(MS, None)),
        Recovery::Timeout(TimeoutCause::ResendLast)
    );
}

#[test]
fn the_final_packet_is_the_last_lost_one_as_often_as_any_other() {
    let (packets, draws) = (100u64, 20_000u64);
    let finals = (0..draws)
        .map(|key| frame_loss(Some(key), 1, None, packets, 0, MS))
        .filter(|l| l.final_packet)
        .count();
    let share = finals as f64 / draws as f64;
    assert!((0.008..0.012).contains(&share), "{share}");
    // Two lost: the one before is earlier; every packet lost: the last two at the end.
    for key in 0..1_000 {
        let l = frame_loss(Some(key), 2, None, packets, 0, MS);
        assert!(l.before.is_some_and(|b| b <= l.last), "{l:?}");
    }
    let all = frame_loss(Some(1), packets, None, packets, 0, MS);
    assert_eq!(
        (all.last, all.before, all.final_packet),
        (MS, Some(MS - 10_000), true)
    );
}

#[test]
fn an_outage_loses_a_run_of_packets_each_next_to_the_one_before() {
    let run = BlackedOut {
        packets: 3,
        last_at: MS,
    };
    let l = frame_loss(Some(5), 0, Some(run), 100, 0, MS);
    assert_eq!(l.last, MS);
    assert!(l.final_packet);
    assert_eq!(l.before, Some(MS - 10_000));
}

/// A tail's resend filed to wait for its probe at 201.5 ms, as `dispatch` files it.
fn waiting_for_the_probe(port: &mut Port, held: &mut Held) -> Nanos {
    let probe = Recovery::LossProbe { lone: true };
    let at = port.resend_time(probe, held, MS, MS);
    held.found_by = Some((probe, 0));
    let index = port.retransmit(at, *held, 0);
    port.wait_in_tail(at, index, held);
    at
}

#[test]
fn data_sent_after_a_tail_loss_reveals_it_before_the_probe() {
    let (mut port, mut held) = port_and_frame();
    let at = waiting_for_the_probe(&mut port, &mut held);
    // 2·srtt + 200 ms on the tick, 204 ms; the RTO (srtt + 200 ms) first.
    assert_eq!(at, MS + 200 * MS + MS / 2);
    // The flow's next frame leaves at 2 ms and arrives: its SACK reveals the loss a round
    // trip (500 us) and a quarter of the minimum one later.
    port.reveal_tail(held.slot, 2 * MS);
    let seen = 2 * MS + MS / 2 + MS / 8;
    assert_eq!(port.retransmits.first_key().map(|k| k.0), Some(seen));
    let resend = port.retransmits.pop_first().map(|h| port.found(seen, h));
    assert!(resend.is_some_and(|h| h.found_by.is_none() && h.timeouts == 0));
    let c = port.counters();
    assert_eq!((c.loss_probes, c.timeouts), (0, 0), "found by SACK");
    // The probe's own key comes and hands out nothing.
    assert!(port.retransmits.pop_first().is_none());
    assert!(port.tcp.tails[held.slot].is_none());
}

#[test]
fn a_tail_nothing_reveals_in_time_is_counted_when_its_probe_fires() {
    let (mut port, mut held) = port_and_frame();
    let at = waiting_for_the_probe(&mut port, &mut held);
    // Data sent too late to be acknowledged before the probe changes nothing.
    port.reveal_tail(held.slot, at);
    assert_eq!(port.retransmits.first_key().map(|k| k.0), Some(at));
    let resend = port.retransmits.pop_first().map(|h| port.found(at, h));
    assert!(resend.is_some());
    assert_eq!(port.counters().loss_probes, 1);
    assert!(port.tcp.tails[held.slot].is_none());
    // A timeout backs the next one off.
    held.found_by = Some((Recovery::Timeout(TimeoutCause::ResendLast), 0));
    let after = port.found(at, held);
    assert_eq!((after.timeouts, port.counters().timeouts), (1, 1));
    assert_eq!(port.counters().timeout_causes.resend_last, 1);
}

#[test]
fn a_lost_resend_is_found_by_data_after_it_only_where_the_window_lets_some_go() {
    let (mut port, mut held) = port_and_frame();
    held.retransmissions = 1;
    // Alone: nothing follows the resend.
    assert_eq!(
        port.recovery_of(&held, &mut lost(MS, None)),
        Recovery::Timeout(TimeoutCause::ResendLast)
    );
    // More of the flow in the port, and room in the window (10 segments) beside a resend of
    // two packets: RACK finds it.
    port.tcp.flows[held.slot].in_port = 2;
    let mut two = FrameLoss {
        packets: 2,
        ..lost(MS, None)
    };
    assert_eq!(port.recovery_of(&held, &mut two), Recovery::Sack);
    assert!(!two.stalled);
    // A resend of 10 packets fills the window: nothing new goes, only the timeout finds it,
    // and nothing the flow sends later will.
    let mut ten = FrameLoss {
        packets: 10,
        ..lost(MS, None)
    };
    assert_eq!(
        port.recovery_of(&held, &mut ten),
        Recovery::Timeout(TimeoutCause::ResendStalled)
    );
    assert!(ten.stalled);
    // The same resend losing its seventh packet: the three resent after it reveal it.
    let mut seventh = FrameLoss {
        packets: 10,
        ..lost(MS - 30_000, None)
    };
    assert_eq!(seventh.after, 3);
    assert_eq!(port.recovery_of(&held, &mut seventh), Recovery::Sack);
    // With a window of one segment every resent packet goes alone: any loss times out.
    let mss = port.tcp.mss;
    port.tcp.flows[held.slot].on_loss(CongestionControl::Cubic, TIMEOUT, 0, 0, mss);
    let mut alone = FrameLoss {
        packets: 10,
        ..lost(MS - 30_000, None)
    };
    assert_eq!(
        port.recovery_of(&held, &mut alone),
        Recovery::Timeout(TimeoutCause::ResendStalled)
    );
}

#[test]
fn a_lost_final_ack_is_probed_where_nothing_follows_and_stalls_only_a_full_window() {
    let (mut port, held) = port_and_frame();
    let acks = 5_000u64;
    for key in 0..acks {
        port.final_ack(&held, 0, Some(key), MS);
    }
    let share = port.counters().loss_probes as f64 / acks as f64;
    assert!(
        (0.015..0.025).contains(&share),
        "{share} of the ACKs lost, 2 % loss"
    );
    // The window (10 segments) has room: the flow's next frame goes at once.
    let (cc, rto_min, mss) = (CongestionControl::Cubic, port.tcp.rto_min, port.tcp.mss);
    let flow = &mut port.tcp.flows[held.slot];
    assert_eq!(flow.send_at(cc, 2 * MS, 1_000, rto_min, mss), 2 * MS);
    // After a timeout the window is one segment: a one-packet frame fills it, so a lost ACK
    // of it holds the flow until its probe resends the packet.
    flow.on_loss(cc, TIMEOUT, 0, 0, mss);
    let one = Held {
        meta: FrameMeta::reliable(1_000, 9),
        wire_bytes: 1_000,
        ..held
    };
    let before = port.counters().loss_probes;
    let lost = (0..1_000).find_map(|key| {
        let mut tried = port.clone();
        tried.final_ack(&one, 0, Some(key), 10 * MS);
        (tried.counters().loss_probes > before).then_some(tried)
    });
    let Some(mut port) = lost else {
        panic!("an ACK of 2 % loss is lost within a thousand draws");
    };
    let flow = &mut port.tcp.flows[held.slot];
    let probe = flow.resend_at(Recovery::LossProbe { lone: true }, 0, 10 * MS, rto_min, 0);
    assert!(probe >= 10 * MS + 200 * MS, "{probe}");
    assert_eq!(flow.send_at(cc, 11 * MS, 1_000, rto_min, mss), probe);
}

#[test]
fn a_lost_final_ack_while_the_flow_recovers_waits_for_the_timeout() {
    let (mut port, held) = port_and_frame();
    let (cc, mss) = (CongestionControl::Cubic, port.tcp.mss);
    // An earlier loss's resend at 1 ms: the flow recovers until it is acknowledged.
    port.tcp.flows[held.slot].on_loss(cc, Recovery::Sack, 0, MS, mss);
    let draws = 100_000u64;
    for key in 0..draws {
        port.final_ack(&held, 0, Some(key), MS);
    }
    let c = port.counters();
    assert_eq!(c.loss_probes, 0, "no probe outside the Open state");
    assert_eq!(c.timeout_causes.acks_in_recovery, c.timeouts);
    // The receiver holds data past the hole, so it acknowledges each of the two final
    // packets at once: both ACKs lost, 2 % x 2 %.
    let expected = 0.02 * 0.02 * draws as f64;
    let timeouts = c.timeouts as f64;
    assert!(
        (0.6 * expected..1.4 * expected).contains(&timeouts),
        "{timeouts} timeouts, {expected} expected"
    );
}

#[test]
fn lost_acks_in_a_frames_middle_hold_a_flow_only_at_a_window_of_a_few_packets() {
    let (mut port, held) = port_and_frame();
    let (cc, mss, rto_min) = (CongestionControl::Cubic, port.tcp.mss, port.tcp.rto_min);
    // The initial window, ten packets each acknowledged: never all ten ACKs lost.
    assert!((0..1_000).all(|key| port.middle_acks_lost(&held, 0, Some(key), MS) == MS));
    // After a timeout the window is one packet: each packet's ACK is its window's only one.
    port.tcp.flows[held.slot].on_loss(cc, TIMEOUT, 0, 0, mss);
    let packets = port.paths[0].loss.packets(held.wire_bytes);
    let frames = 500u64;
    let late: Nanos = (0..frames)
        .map(|key| port.middle_acks_lost(&held, 0, Some(key), MS) - MS)
        .sum();
    let c = port.counters();
    let expected = 0.02 * (packets - 2) as f64 * frames as f64;
    let stalls = c.loss_probes as f64;
    assert!(
        (0.85 * expected..1.15 * expected).contains(&stalls),
        "{stalls} waits for {expected} expected at 2 % loss"
    );
    assert_eq!(c.timeouts, 0, "outside a recovery the probe finds it");
    let flow = &port.tcp.flows[held.slot];
    let probe = flow.resend_at(Recovery::LossProbe { lone: true }, 0, 0, rto_min, 0);
    assert_eq!(late, probe * c.loss_probes, "each wait a probe's timeout");
    // While the flow recovers, only the timeout sets it going again.
    port.tcp.flows[held.slot].on_loss(cc, Recovery::Sack, 0, 10 * MS, mss);
    let before = port.counters().timeouts;
    let waits: u64 = (0..frames)
        .map(|key| u64::from(port.middle_acks_lost(&held, 0, Some(key), MS) > MS))
        .sum();
    assert!(port.counters().timeouts > before && waits > 0);
}

#[test]
fn timeouts_of_one_flow_fire_one_after_another_as_its_one_timer_does() {
    let (mut port, mut held) = port_and_frame();
    held.retransmissions = 1;
    let rto = port.tcp.flows[held.slot].rto(port.tcp.rto_min, 0);
    // Two resends lost back to back with nothing after them: the second's timeout is armed
    // while the first's is pending, so it fires one RTO after the first, not beside it.
    port.resend_lost(held, 0, &mut lost(MS, None), MS);
    let second = Held { token: 1, ..held };
    port.resend_lost(second, 0, &mut lost(2 * MS, None), 2 * MS);
    let fires: Vec<Nanos> = std::iter::from_fn(|| port.retransmits.pop_first())
        .map(|h| h.offered)
        .collect();
    assert_eq!(fires, vec![MS + rto, MS + 2 * rto]);
    // One armed after the timer fired runs its own course.
    let third = Held { token: 2, ..held };
    let late = MS + 3 * rto;
    port.resend_lost(third, 0, &mut lost(late, None), late);
    assert_eq!(port.retransmits.first_key().map(|k| k.0), Some(late + rto));
}

#[test]
fn a_tail_s_resend_filling_the_window_waits_for_the_receiver_s_delayed_ack() {
    let (mut port, held) = port_and_frame();
    let (cc, rto_min, mss) = (CongestionControl::Cubic, port.tcp.rto_min, port.tcp.mss);
    // Found by the timeout: the window is one segment, the resend one packet.
    port.tcp.flows[held.slot].on_loss(cc, TIMEOUT, 0, 0, mss);
    let resend = Held {
        wire_bytes: 1_000,
        retransmissions: 1,
        tail_repair: true,
        ..held
    };
    port.delayed_ack(&resend, 0, 10 * MS);
    // Acknowledged 40 ms after it left, back a round trip (500 us) later.
    let flow = &mut port.tcp.flows[held.slot];
    assert_eq!(
        flow.send_at(cc, 11 * MS, 1_000, rto_min, mss),
        50 * MS + MS / 2
    );
    // A resend SACK found (data after it arrived) draws an immediate ACK.
    let (mut port, held) = port_and_frame();
    port.tcp.flows[held.slot].on_loss(cc, TIMEOUT, 0, 0, mss);
    let sacked = Held {
        wire_bytes: 1_000,
        retransmissions: 1,
        ..held
    };
    port.delayed_ack(&sacked, 0, 10 * MS);
    let flow = &mut port.tcp.flows[held.slot];
    assert_eq!(flow.send_at(cc, 11 * MS, 1_000, rto_min, mss), 11 * MS);
}

/// [`port_and_frame`] with a frame of 1 MB behind which more of its flow waits, the flow's
/// cubic window at two segments (a timeout at 0, then one segment acknowledged).
fn window_of_two() -> (Port, Held) {
    let (mut port, mut held) = port_and_frame();
    let (cc, mss) = (CongestionControl::Cubic, port.tcp.mss);
    held.meta.bytes = 1_000_000;
    let flow = &mut port.tcp.flows[held.slot];
    flow.in_port = 2;
    flow.on_loss(cc, TIMEOUT, 0, 0, mss);
    flow.on_acked(cc, mss as usize, 0, mss);
    assert_eq!(flow.window_bytes(), 2 * mss as usize);
    (port, held)
}

#[test]
fn a_window_of_two_segments_probes_for_a_loss_ending_its_round() {
    let (port, held) = window_of_two();
    // Long after the timeout's episode, the 100th packet of 100 is lost: it ends a round of
    // two, so nothing follows it until the probe.
    let later = 300 * MS;
    let mut even = FrameLoss {
        after: 0,
        ..lost(later, None)
    };
    let found = port.recovery_of(&held, &mut even);
    assert_eq!(found, Recovery::LossProbe { lone: false });
    assert!(even.stalled);
    // The 99th: the 100th, sent after it in its round, reveals it.
    let mut odd = FrameLoss {
        after: 1,
        ..lost(later, None)
    };
    assert_eq!(port.recovery_of(&held, &mut odd), Recovery::Sack);
}

#[test]
fn a_window_of_two_in_recovery_finds_a_loss_ending_its_round_by_the_one_before_it() {
    let (mut port, held) = window_of_two();
    let (cc, mss) = (CongestionControl::Cubic, port.tcp.mss);
    let flow = &mut port.tcp.flows[held.slot];
    // A loss found at 300 ms, resent at once: the flow recovers until its ACK.
    let later = 300 * MS;
    flow.on_loss(cc, Recovery::Sack, later, later, mss);
    assert!(flow.in_recovery(later + 1));
    // The 100th packet of 100 is lost just after: the 99th arrived, and the receiver, holding
    // data past a hole, acknowledges it at once; the new data that ACK lets go reveals it.
    let mut even = FrameLoss {
        after: 0,
        ..lost(later + 1, None)
    };
    assert_eq!(port.recovery_of(&held, &mut even), Recovery::Sack);
    assert!(!even.stalled);
    // That ACK or that data lost too: nothing reveals it but the timeout (no probe while
    // recovering).
    let mut unrevealed = FrameLoss {
        after: 0,
        reveal_lost: true,
        ..lost(later + 1, None)
    };
    assert_eq!(
        port.recovery_of(&held, &mut unrevealed),
        Recovery::Timeout(TimeoutCause::OriginalInRecovery)
    );
    // The 99th lost as well: nothing of the round arrived to be acknowledged.
    let mut both = FrameLoss {
        after: 0,
        ..lost(later + 1, Some(later + 1 - 10_000))
    };
    assert_eq!(
        port.recovery_of(&held, &mut both),
        Recovery::Timeout(TimeoutCause::OriginalInRecovery)
    );
}

#[test]
fn a_resend_after_a_timeout_keeps_the_backoff_until_its_first_packet_is_answered() {
    let profile = NetworkProfile {
        loss: 0.2,
        ..lossy()
    };
    let (frames, mut unanswered, mut again) = (2_000u64, 0u64, 0u64);
    for key in 0..frames {
        let mut port = Port::egress(&profile, 1, 1);
        let mut held = lone_frame(&mut port);
        let (cc, mss, rto_min) = (CongestionControl::Cubic, port.tcp.mss, port.tcp.rto_min);
        port.tcp.flows[held.slot].on_loss(cc, TIMEOUT, 0, 0, mss);
        held.timeouts = 1;
        // The first packet lost: the timeout that finds it is backed off, as the frame's.
        assert_eq!(
            port.head_after_timeout(&mut held, 0, Some(key), true, MS),
            MS
        );
        assert_eq!(held.timeouts, 1);
        // It arrived: the backoff ends with its answer, after a backed-off timeout (or
        // more, doubling) where the answer was lost.
        let last = port.head_after_timeout(&mut held, 0, Some(key), false, MS);
        assert_eq!(held.timeouts, 0);
        let timeouts = port.counters().timeouts;
        let flow = &port.tcp.flows[held.slot];
        let chain = flow.timeout_chain(rto_min, 1, timeouts.saturating_sub(1) as u32);
        assert_eq!(
            last - MS,
            if timeouts == 0 { 0 } else { chain },
            "key {key}"
        );
        unanswered += u64::from(timeouts > 0);
        again += u64::from(timeouts > 1);
    }
    // The answer is lost as one packet (20 %); the timeout's resend or its answer again as
    // either of two (36 %).
    let expected = 0.2 * frames as f64;
    assert!((0.8 * expected..1.2 * expected).contains(&(unanswered as f64)));
    let share = again as f64 / unanswered as f64;
    assert!((0.26..0.46).contains(&share), "{share}");
}

#[test]
fn bbr_s_resend_of_a_loss_among_its_first_packets_from_idle_goes_alone() {
    let profile = NetworkProfile {
        tcp: CongestionControl::Bbr,
        bandwidth_bps: Some(1e8),
        ..lossy()
    };
    let mut port = Port::egress(&profile, 1, 1);
    let held = lone_frame(&mut port); // 100 packets
    let flow = &mut port.tcp.flows[held.slot];
    (flow.in_port, flow.sent_from_idle) = (1, true);
    let lead = flow.bbr_lead_packets(port.tcp.mss);
    assert_eq!(lead, 4);
    let (mut early, keys) = (0, 400);
    for key in 0..keys {
        let draw = Some(key);
        let first = reliable::first_lost_place(draw, 3, 100);
        let head = reliable::first_packet_lost(draw, 3, None, 100, 0, 100 * 116_000);
        assert_eq!(head, first == 0, "key {key}");
        let (mut h, mut loss) = (held, lost(MS, None));
        port.conserve(&mut h, &mut loss, false, (draw, 3, 100));
        assert!(!loss.stalled);
        assert_eq!(h.conserving, first < lead, "key {key}");
        if !h.conserving {
            continue;
        }
        early += 1;
        let resend = Held {
            retransmissions: 1,
            ..h
        };
        // Its first packet lost again: nothing follows it before the timeout.
        let (mut r, mut loss) = (resend, lost(MS / 2, None));
        port.conserve(&mut r, &mut loss, true, (draw, 1, 3));
        assert!(loss.stalled && !r.conserving);
        assert_eq!(
            port.recovery_of(&r, &mut loss),
            Recovery::Timeout(TimeoutCause::ResendStalled)
        );
        // It arrived: later losses of the resend are revealed as ever.
        let (mut r, mut loss) = (resend, lost(MS / 2, None));
        port.conserve(&mut r, &mut loss, false, (draw, 1, 3));
        assert!(!loss.stalled);
        assert_eq!(port.recovery_of(&r, &mut loss), Recovery::Sack);
        // Not from idle (more of the flow queued behind it, as in bulk): a window's room.
        let mut queued = port.clone();
        queued.tcp.flows[held.slot].in_port = 2;
        let mut h = held;
        queued.conserve(&mut h, &mut lost(MS, None), false, (draw, 3, 100));
        assert!(!h.conserving);
    }
    // The first of 3 losses among 100 packets falls in the first 4: 1 - 0.96^3, 11.5 %.
    let share = early as f64 / keys as f64;
    assert!((0.07..0.17).contains(&share), "{share}");
}
