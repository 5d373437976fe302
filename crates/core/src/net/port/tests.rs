//! The port against closed forms: the default profile is the old shaper, losses follow
//! their rates, a loss costs a round trip, a probe or a timeout as Linux's, reliable flows
//! stay in order, queues order and drop as their discipline says, paths are chosen as asked.

use proptest::prelude::*;

use super::*;
use crate::net::{BurstLoss, CongestionControl, LinkProfile, PathProfile, Shaper};

/// Drives `port` until nothing is pending, returning every decision in order.
fn run_all(port: &mut Port, mut out: Vec<Decision>) -> Vec<Decision> {
    while let Some(t) = port.poll_timeout() {
        while let Some(d) = port.poll_decision(t) {
            out.push(d);
        }
    }
    out
}

fn gbit(latency_ns: u64) -> NetworkProfile {
    NetworkProfile {
        bandwidth_bps: Some(1e9),
        latency_ns,
        ..NetworkProfile::default()
    }
}

/// When a delivered frame arrives and after how many retransmissions.
fn delivered_after(d: &Decision) -> (Nanos, u32) {
    match d.fate {
        Fate::Delivered {
            at,
            retransmissions,
            ..
        } => (at, retransmissions),
        other => panic!("not delivered: {other:?}"),
    }
}

fn delivered_at(d: &Decision) -> Nanos {
    match d.fate {
        Fate::Delivered { at, .. } => at,
        other => panic!("not delivered: {other:?}"),
    }
}

proptest! {
    /// With the default profile (one path, FIFO, unbounded, lossless) every frame is
    /// decided on offer and delivered exactly when the old shaper says; the send window is
    /// the old one.
    #[test]
    fn default_profile_reproduces_the_shaper(
        bps in prop::option::of(1e6f64..1e11),
        latency in 0u64..1_000_000,
        window in 1usize..1_000_000,
        frames in prop::collection::vec((0u64..200_000, 0usize..2_000_000, 0u64..4), 1..60),
    ) {
        let link = LinkProfile { bandwidth_bps: bps, latency_ns: latency, buffer_bytes: window };
        let profile = NetworkProfile::from(link);
        let mut shaper = Shaper::new(link);
        let mut port = Port::egress(&profile, 42, 3);
        let mut now = 0;
        for (token, &(gap, bytes, flow)) in frames.iter().enumerate() {
            now += gap;
            prop_assert_eq!(port.has_room(now), shaper.backlog_bytes(now) < window);
            prop_assert_eq!(port.backlog_bytes(now), shaper.backlog_bytes(now));
            let start = now.max(shaper.free_at_ns());
            let at = shaper.schedule(now, bytes);
            port.enqueue(now, token as u64, FrameMeta::reliable(bytes, flow));
            let d = port.poll_decision(now).expect("decided on offer");
            let fate = Fate::Delivered { at, retransmissions: 0, path: 0 };
            let want = Decision { token: token as u64, fate, start, done: shaper.free_at_ns(), first_arrival: None };
            prop_assert_eq!(d, want);
            prop_assert!(port.poll_decision(now).is_none());
            prop_assert_eq!(port.poll_timeout(), None);
            let t = port.room_at(now);
            prop_assert!(t > now && shaper.backlog_bytes(t) < window);
            prop_assert!(t == now + 1 || shaper.backlog_bytes(t - 1) >= window);
        }
        let c = port.counters();
        prop_assert_eq!(c.frames_sent, frames.len() as u64);
        prop_assert_eq!(c.frames_lost + c.frames_dropped + c.frames_retransmitted, 0);
    }

    /// Under loss, a reliable flow's deliveries are monotone in offer order, every frame is
    /// delivered exactly once, and a frame is never delivered before its lossless time.
    #[test]
    fn reliable_deliveries_on_a_flow_are_monotone(
        seed in any::<u64>(),
        prio in any::<bool>(),
        paths in 1usize..4,
        frames in prop::collection::vec((0u64..50_000, 1usize..20_000, 0u64..3, 0u8..8, any::<bool>()), 1..80),
    ) {
        let profile = NetworkProfile {
            loss: 0.2,
            paths,
            rto_ns: 1_000_000,
            queue_bytes: Some(30_000),
            queue_discipline: if prio { QueueDiscipline::Prio } else { QueueDiscipline::Fifo },
            ..gbit(10_000)
        };
        let mut port = Port::egress(&profile, seed, 0);
        let mut out = Vec::new();
        let mut now = 0;
        let mut offered = Vec::new();
        for (token, &(gap, bytes, flow, class, spray)) in frames.iter().enumerate() {
            now += gap;
            let meta = FrameMeta { class, spray, drop_eligible: spray, ..FrameMeta::reliable(bytes, flow) };
            port.enqueue(now, token as u64, meta);
            offered.push((flow, now + 10_000));
            while let Some(d) = port.poll_decision(now) {
                out.push(d);
            }
        }
        let out = run_all(&mut port, out);
        prop_assert_eq!(out.len(), frames.len());
        let mut at = vec![None; frames.len()];
        for d in &out {
            prop_assert!(at[d.token as usize].is_none(), "decided twice");
            at[d.token as usize] = Some(delivered_at(d));
        }
        for flow in 0..3 {
            let times: Vec<Nanos> = (0..frames.len())
                .filter(|&i| offered[i].0 == flow)
                .map(|i| at[i].unwrap_or(0))
                .collect();
            prop_assert!(times.windows(2).all(|w| w[0] <= w[1]), "flow {} {:?}", flow, times);
        }
        for (i, &(_, lossless)) in offered.iter().enumerate() {
            prop_assert!(at[i].unwrap_or(0) >= lossless);
        }
    }
}

/// On an otherwise idle port a lone frame has nothing behind it to reveal its loss: the
/// tail loss probe finds it (its packet the only one outstanding: 2·srtt + rto_min, no
/// later than the RTO, so the RTO here), and a lost retransmission only the timeout (srtt
/// and the 5 ms minimum, doubled at each further one).
#[test]
fn a_lone_lost_frame_waits_for_the_probe_and_a_lost_resend_for_the_timeout() {
    let rto_min = 5_000_000;
    let profile = NetworkProfile {
        loss: 0.5,
        rto_ns: rto_min,
        ..gbit(30_000)
    };
    let mut port = Port::egress(&profile, 7, 1);
    let bytes = 12_500; // 100 us at 1 Gbit/s
    let tx = 100_000;
    let mut retransmitted = 0;
    for i in 0..200u64 {
        let now = i * 1_000_000_000;
        // The round trip so far (the path's, 60 us, before the first sample).
        let srtt = port.tcp.flows.first().map_or(60_000, TcpFlow::srtt_ns);
        let rto = rto_min + srtt;
        let probe = rto;
        port.enqueue(now, i, FrameMeta::reliable(bytes, 9));
        let out = run_all(&mut port, Vec::new());
        assert_eq!(out.len(), 1);
        let (at, r) = delivered_after(&out[0]);
        let timeouts: u64 = (0..r.saturating_sub(1)).map(|k| (rto << k) + tx).sum();
        let recovery = if r > 0 { probe + tx + timeouts } else { 0 };
        assert_eq!(at, now + tx + 30_000 + recovery, "frame {i}, {r} resends");
        retransmitted += u64::from(r);
    }
    let c = port.counters();
    assert!(retransmitted > 50, "{retransmitted} retransmissions");
    assert_eq!(c.frames_retransmitted, retransmitted);
    assert_eq!(c.frames_lost, retransmitted);
    assert_eq!(c.frames_sent, 200 + retransmitted);
    assert_eq!(c.bytes_retransmitted, retransmitted * bytes as u64);
}

/// With loss per packet, a lost reliable frame sends again only its lost packets, and a
/// single loss costs about a round trip (SACK, or the probe for a lost last packet or one
/// ending a round of a window of two segments), never the 200 ms timeout; bigger frames are
/// lost more often.
#[test]
fn a_single_packet_loss_costs_a_round_trip_not_a_timeout() {
    let profile = NetworkProfile {
        loss: 0.01,
        mtu_bytes: Some(1_500.0),
        ..gbit(50_000)
    };
    let mut port = Port::egress(&profile, 3, 1);
    let bytes = 144_800; // 100 segments, about 1.2 ms at 1 Gbit/s with headers
    let wire = bytes as u64 + 100 * 66;
    let tx = |b: u64| b * 8; // ns at 1 Gbit/s
    let (mut once, mut frames_lost, mut within_rtt) = (0, 0, 0);
    for i in 0..300u64 {
        let now = i * 1_000_000_000;
        let before = port.counters().bytes_retransmitted;
        port.enqueue(now, i, FrameMeta::reliable(bytes, 9));
        let out = run_all(&mut port, Vec::new());
        let resent = port.counters().bytes_retransmitted - before;
        let (at, r) = delivered_after(&out[0]);
        frames_lost += u64::from(r > 0);
        if r == 1 {
            once += 1;
            assert!(resent > 0 && resent < wire / 10, "{resent} bytes resent");
            let late = at - (now + tx(wire) + 50_000 + tx(resent));
            // A loss ending a round of cubic's two-segment floor waits for the probe.
            assert!(
                late <= 10_000_000,
                "frame {i}: {late} ns past its lossless time"
            );
            within_rtt += u64::from(late <= 150_000);
        }
    }
    assert!(
        (150..230).contains(&frames_lost),
        "{frames_lost} of 300 lost"
    );
    assert!(
        once > frames_lost * 9 / 10,
        "{once} of {frames_lost} lost once"
    );
    // A frame a second at most restarts at 10 segments, cubic's curve does not count the
    // idle second, and a frame's losses a window apart each cut the window: it often
    // regrows only from its two-segment floor, and about 40 % of single losses end such a
    // round and wait for the probe.
    assert!(
        within_rtt > once / 2,
        "{within_rtt} of {once} within a round trip"
    );
}

/// Back-to-back frames on a port that may drop but does not fill the link: a lossless flow
/// is never held back by its window.
#[test]
fn a_lossless_reliable_flow_fills_the_link() {
    let profile = NetworkProfile {
        queue_bytes: Some(10_000_000),
        mtu_bytes: Some(1_500.0),
        ..gbit(100_000)
    };
    let mut port = Port::egress(&profile, 1, 0);
    for token in 0..1_000 {
        port.enqueue(0, token, FrameMeta::reliable(14_480, 4));
    }
    let out = run_all(&mut port, Vec::new());
    let last = out.iter().map(delivered_at).max().unwrap_or(0) as f64;
    let wire = 1_000 * (14_480 + 10 * 66) as u64;
    // Within the few round trips of slow start from the initial window.
    let ideal = (wire * 8 + 100_000) as f64;
    assert!(
        last >= ideal && last < ideal * 1.002,
        "{last} ns against {ideal}"
    );
}

/// A host's own TCP queue admits nothing, yet forgets the frames that have left: a long
/// reliable flow keeps a record as short as what is in flight, not one entry per frame
/// ever sent (which grew a parameter server's heap by 16 bytes a frame).
#[test]
fn a_long_reliable_flow_keeps_no_record_of_frames_gone() {
    let profile = NetworkProfile {
        loss: 0.01,
        mtu_bytes: Some(1_500.0),
        ..gbit(100_000)
    };
    let mut port = Port::egress(&profile, 3, 0);
    let out = drive(&mut port, 2, 20_000, 1_448);
    assert_eq!(out.len(), 40_000);
    let records = port.serialising_records();
    assert!(
        records < 1_000,
        "{records} frames still recorded as serialising"
    );
}

/// Drives `port` as a sender does: `frames` frames of `bytes` on each of `flows` flows
/// (token `seq << 8 | flow`), offered in turn while the send window has room; every
/// decision, in order.
fn drive(port: &mut Port, flows: u64, frames: u64, bytes: usize) -> Vec<Decision> {
    let mut left = vec![frames; flows as usize];
    let (mut out, mut now, mut seq, mut turn) = (Vec::new(), 0, 0u64, 0);
    loop {
        while port.has_room(now) && left.iter().any(|&l| l > 0) {
            let flow = turn % flows;
            turn += 1;
            if left[flow as usize] > 0 {
                left[flow as usize] -= 1;
                seq += 1;
                port.enqueue(now, seq << 8 | flow, FrameMeta::reliable(bytes, flow));
            }
        }
        while let Some(d) = port.poll_decision(now) {
            out.push(d);
        }
        let room = left.iter().any(|&l| l > 0).then(|| port.room_at(now));
        match room.into_iter().chain(port.poll_timeout()).min() {
            Some(t) => now = t.max(now),
            None => return out,
        }
    }
}

/// Time to deliver `frames` frames of 14,480 bytes on one flow over a 1 Gbit/s, 1 ms path
/// losing `loss` of its packets, under `cc`.
fn transfer_time(cc: CongestionControl, loss: f64, frames: u64) -> Nanos {
    let profile = NetworkProfile {
        loss,
        mtu_bytes: Some(1_500.0),
        tcp: cc,
        ..gbit(1_000_000)
    };
    let mut port = Port::egress(&profile, 9, 0);
    let out = drive(&mut port, 1, frames, 14_480);
    assert_eq!(out.len() as u64, frames);
    out.iter().map(delivered_at).max().unwrap_or(0)
}

/// Under 2 % loss with a 2 ms round trip cubic's window shrinks and the transfer takes far
/// longer than the link's time, and Reno's; BBR keeps the rate.
#[test]
fn cubic_backs_off_under_random_loss_and_bbr_does_not() {
    let lossless = transfer_time(CongestionControl::Cubic, 0.0, 1_000);
    let bbr = transfer_time(CongestionControl::Bbr, 0.02, 1_000);
    let cubic = transfer_time(CongestionControl::Cubic, 0.02, 1_000);
    let reno = transfer_time(CongestionControl::Reno, 0.02, 1_000);
    assert!(bbr < lossless * 12 / 10, "bbr {bbr} lossless {lossless}");
    assert!(cubic > bbr * 2, "cubic {cubic} bbr {bbr}");
    assert!(reno > bbr * 2, "reno {reno} bbr {bbr}");
}

/// Two flows through one lossy port get about the same share of it.
#[test]
fn two_flows_share_a_lossy_port_fairly() {
    let profile = NetworkProfile {
        loss: 0.01,
        mtu_bytes: Some(1_500.0),
        ..gbit(500_000)
    };
    let mut port = Port::egress(&profile, 5, 0);
    let out = drive(&mut port, 2, 1_000, 14_480);
    let horizon = out.iter().map(delivered_at).max().unwrap_or(0) / 2;
    let by = |flow: u64| {
        (out.iter())
            .filter(|d| d.token & 0xFF == flow && delivered_at(d) <= horizon)
            .count() as f64
    };
    let (a, b) = (by(0), by(1));
    assert!(
        a > 100.0 && (a / b - 1.0).abs() < 0.25,
        "{a} against {b} frames"
    );
}

/// The losses of a run, as (token, retransmissions).
fn losses(seed: u64, burst: bool) -> Vec<u32> {
    let profile = NetworkProfile {
        loss: 0.01,
        loss_burst: burst.then_some(BurstLoss {
            p_enter: 0.01,
            p_leave: 0.3,
            loss_in_burst: 0.5,
        }),
        ..gbit(0)
    };
    let mut port = Port::egress(&profile, seed, 2);
    for i in 0..10_000u64 {
        port.enqueue(i * 20_000, i, FrameMeta::reliable(1_000, i % 3));
    }
    let out = run_all(&mut port, Vec::new());
    let mut r = vec![0; out.len()];
    for d in out {
        if let Fate::Delivered {
            retransmissions, ..
        } = d.fate
        {
            r[d.token as usize] = retransmissions;
        }
    }
    r
}

#[test]
fn same_seed_same_losses_different_seed_different_losses() {
    for burst in [false, true] {
        let a = losses(11, burst);
        assert!(a.iter().any(|&r| r > 0));
        assert_eq!(a, losses(11, burst));
        assert_ne!(a, losses(12, burst));
    }
}

/// Loss-tolerant frames are lost for good: Bernoulli within 3 sigma over 10^5 frames.
#[test]
fn loss_tolerant_frames_are_lost_at_the_configured_rate() {
    let p = 0.01;
    let profile = NetworkProfile { loss: p, ..gbit(0) };
    let mut port = Port::egress(&profile, 5, 0);
    let n = 100_000u64;
    let mut lost = 0;
    for i in 0..n {
        let meta = FrameMeta {
            reliable: false,
            ..FrameMeta::reliable(100, 0)
        };
        port.enqueue(i * 1_000, i, meta);
        while let Some((_, fate)) = port.poll_fate(i * 1_000) {
            lost += matches!(fate, Fate::Lost { path: 0 }) as u64;
        }
    }
    let sigma = (n as f64 * p * (1.0 - p)).sqrt();
    assert!((lost as f64 - n as f64 * p).abs() < 3.0 * sigma, "{lost}");
    assert_eq!(port.counters().frames_lost, lost);
    assert_eq!(port.counters().frames_retransmitted, 0);
}

/// Under `prio`, frames waiting behind a busy serialiser go class 0 first.
#[test]
fn strict_priority_serves_class_zero_first() {
    let profile = NetworkProfile {
        queue_discipline: QueueDiscipline::Prio,
        ..gbit(0)
    };
    let mut port = Port::egress(&profile, 0, 0);
    let meta = |class| FrameMeta {
        class,
        ..FrameMeta::reliable(1_000, u64::from(class))
    };
    port.enqueue(0, 100, meta(7)); // starts at once, 8 us
    for (token, class) in [(5u64, 5u8), (3, 3), (0, 0), (6, 5)] {
        port.enqueue(1_000, token, meta(class));
    }
    assert_eq!(port.poll_fate(1_000).map(|(t, _)| t), Some(100));
    assert_eq!(
        port.poll_fate(1_000),
        None,
        "the others wait for the serialiser"
    );
    assert_eq!(port.poll_timeout(), Some(8_000));
    let out = run_all(&mut port, Vec::new());
    let order: Vec<u64> = out.iter().map(|d| d.token).collect();
    assert_eq!(order, [0, 3, 5, 6]);
    let starts: Vec<Nanos> = out.iter().map(|d| d.start).collect();
    assert_eq!(starts, [8_000, 16_000, 24_000, 32_000]);
    assert_eq!(port.counters().queueing_ns_max, 31_000);
}

/// A 10 kB prio queue with threshold 0.5: drop-eligible frames are dropped once 5 kB would
/// be passed, the others only once the queue is full.
#[test]
fn drop_eligible_frames_are_dropped_first_tail_drop_only_when_full() {
    let profile = NetworkProfile {
        queue_discipline: QueueDiscipline::Prio,
        queue_bytes: Some(10_000),
        ..gbit(0)
    };
    let mut port = Port::egress(&profile, 0, 0);
    let meta = |de| FrameMeta {
        drop_eligible: de,
        reliable: false,
        ..FrameMeta::reliable(2_000, 1)
    };
    // All offered at once: 2 kB serialising + waiting frames.
    let plan = [false, true, true, true, false, false, false, true, false];
    for (token, &de) in plan.iter().enumerate() {
        port.enqueue(0, token as u64, meta(de));
    }
    let out = run_all(&mut port, Vec::new());
    let dropped: Vec<u64> = (out.iter())
        .filter(|d| d.fate == Fate::Dropped)
        .map(|d| d.token)
        .collect();
    // held: 2k, 4k(de ok: 4k <= 5k), 6k (de refused), 6k (de refused), 6k, 8k, 10k,
    // then de refused and the last one refused by a full queue.
    assert_eq!(dropped, [2, 3, 7, 8]);
    assert_eq!(port.counters().frames_dropped, 4);
    assert_eq!(port.counters().bytes_dropped, 8_000);
}

/// A full network queue drops a reliable frame once: the resend gets in even though the
/// queue is still full when it comes back.
#[test]
fn a_retransmission_is_not_dropped_again() {
    let profile = NetworkProfile {
        queue_bytes: Some(3_000),
        ingress: true,
        ..gbit(0)
    };
    let mut port = Port::ingress(&profile, 0, 0);
    // 1.5 kB frames take 12 us each: the queue stays full far past the 1 us RTO.
    for token in 0..10 {
        port.enqueue(0, token, FrameMeta::reliable(1_500, token));
    }
    let out = run_all(&mut port, Vec::new());
    assert_eq!(out.len(), 10);
    let c = port.counters();
    assert_eq!((c.frames_dropped, c.frames_retransmitted), (8, 8));
    assert!(out
        .iter()
        .all(|d| matches!(d.fate, Fate::Delivered { retransmissions: r, .. } if r <= 1)));
}

/// A reliable frame dropped by a full FIFO queue is resent as soon as SACK reveals the
/// hole (a round trip, nothing on this latency-free port), behind what the queue holds.
#[test]
fn a_reliable_frame_dropped_by_a_full_queue_is_retransmitted() {
    let profile = NetworkProfile {
        queue_bytes: Some(3_000),
        ingress: true,
        ..gbit(0)
    };
    let mut port = Port::ingress(&profile, 0, 0);
    for token in 0..3 {
        port.enqueue(0, token, FrameMeta::reliable(1_500, token));
    }
    let out = run_all(&mut port, Vec::new());
    let at: Vec<Nanos> = out.iter().map(delivered_at).collect();
    assert_eq!(at, [12_000, 24_000, 36_000]);
    let c = port.counters();
    assert_eq!((c.frames_dropped, c.frames_retransmitted), (1, 1));
    assert_eq!(port.flow_counters(2).map(|c| c.frames_dropped), Some(1));
    assert_eq!(port.flow_counters(0).map(|c| c.frames_dropped), Some(0));
    // Without per-flow counters: the same fates and totals, no flow's counters.
    let mut lean = Port::ingress(&profile, 0, 0).without_flow_counters();
    for token in 0..3 {
        lean.enqueue(0, token, FrameMeta::reliable(1_500, token));
    }
    assert_eq!(run_all(&mut lean, Vec::new()), out);
    assert_eq!(lean.counters(), c);
    assert_eq!(lean.flow_counters(2), None);
}

fn multipath(paths: usize) -> NetworkProfile {
    NetworkProfile {
        paths,
        ..gbit(1_000)
    }
}

#[test]
fn spraying_spreads_bytes_evenly_over_paths() {
    for k in 2..5 {
        let mut port = Port::egress(&multipath(k), 3, 0);
        let mut rng = SplitMix64::new(k as u64);
        let mut now = 0;
        for token in 0..2_000 {
            now += rng.next_u64() % 20_000;
            let bytes = 1 + (rng.next_u64() % 9_000) as usize;
            let meta = FrameMeta {
                spray: true,
                ..FrameMeta::reliable(bytes, 1)
            };
            port.enqueue(now, token, meta);
        }
        let bytes: Vec<u64> = port.path_counters().iter().map(|c| c.bytes_sent).collect();
        let (lo, hi) = (bytes.iter().min(), bytes.iter().max());
        let spread = hi.unwrap_or(&0) - lo.unwrap_or(&0);
        assert!(spread <= 9_000, "{k} paths: {bytes:?}");
    }
}

/// Loss-tolerant flows are hashed to a path each (ECMP); reliable (TCP) flows all take the
/// first path, as connections to a host's first address do on the kernel testbed.
#[test]
fn hashing_pins_a_flow_to_one_path_and_tcp_to_the_first() {
    let mut tcp = Port::egress(&multipath(4), 3, 0);
    for token in 0..400u64 {
        tcp.enqueue(token * 100, token, FrameMeta::reliable(100, token % 40));
    }
    let out = run_all(&mut tcp, Vec::new());
    assert!(out
        .iter()
        .all(|d| matches!(d.fate, Fate::Delivered { path: 0, .. })));
    let mut port = Port::egress(&multipath(4), 3, 0);
    for token in 0..4_000u64 {
        let meta = FrameMeta {
            reliable: false,
            ..FrameMeta::reliable(100, token % 40)
        };
        port.enqueue(token * 100, token, meta);
    }
    let out = run_all(&mut port, Vec::new());
    let mut path_of = [None; 40];
    for d in &out {
        let Fate::Delivered { path, .. } = d.fate else {
            panic!()
        };
        let flow = (d.token % 40) as usize;
        assert_eq!(*path_of[flow].get_or_insert(path), path, "flow {flow}");
    }
    let used: std::collections::BTreeSet<usize> = path_of.iter().flatten().copied().collect();
    assert!(used.len() > 1, "40 flows all hashed to {used:?}");
}

/// A datagram takes the path its sender chose, whatever its flow hashes to (modulo the
/// port's paths), and the class its DSCP marks.
#[test]
fn a_datagram_takes_the_path_its_sender_chose() {
    let mut port = Port::egress(&multipath(3), 3, 0);
    for token in 0..300u64 {
        let meta = FrameMeta::of_datagram(46, 1_500, 7, token as usize % 4);
        assert!(!meta.reliable && meta.class == 0 && !meta.drop_eligible);
        port.enqueue(token * 100, token, meta);
    }
    for d in run_all(&mut port, Vec::new()) {
        let Fate::Delivered { path, .. } = d.fate else {
            panic!("{d:?}")
        };
        assert_eq!(path, (d.token % 4) as usize % 3, "token {}", d.token);
    }
    assert!(FrameMeta::of_datagram(8, 100, 7, 0).drop_eligible);
}

/// A degraded path (its own bandwidth, latency and loss) affects only the frames on it.
#[test]
fn each_path_has_its_own_bandwidth_latency_and_loss() {
    let profile = NetworkProfile {
        paths: 2,
        path: vec![
            PathProfile::default(),
            PathProfile {
                bandwidth_bps: Some(1e8),
                latency_ns: Some(50_000),
                loss: Some(1.0),
                loss_burst: None,
            },
        ],
        ..gbit(1_000)
    };
    let mut port = Port::egress(&profile, 0, 0);
    let meta = FrameMeta {
        spray: true,
        reliable: false,
        ..FrameMeta::reliable(1_250, 0)
    };
    port.enqueue(0, 0, meta);
    port.enqueue(0, 1, meta);
    let out = run_all(&mut port, Vec::new());
    assert_eq!(
        out[0].fate,
        Fate::Delivered {
            at: 11_000,
            retransmissions: 0,
            path: 0
        }
    );
    // Path 1 would finish at 100 us, path 0 at 20 us: the sprayed frame takes path 0.
    assert_eq!(out[1].fate, out[0].fate.with_at(21_000));
    assert_eq!(port.path_counters()[1].frames_sent, 0);
    let slow = FrameMeta {
        spray: false,
        ..meta
    };
    // Find a flow hashed to the degraded path: always lost there.
    let lost = (0..64u64).any(|flow| {
        port.enqueue(
            1_000_000 * (flow + 1),
            10 + flow,
            FrameMeta { flow, ..slow },
        );
        matches!(
            port.poll_fate(1_000_000 * (flow + 1)),
            Some((_, Fate::Lost { path: 1 }))
        )
    });
    assert!(lost);
}

/// An ingress port serialises arrivals but adds no latency and loses nothing at random.
#[test]
fn ingress_serialises_without_latency_or_loss() {
    let profile = NetworkProfile {
        loss: 1.0,
        ingress: true,
        ..gbit(1_000_000)
    };
    let mut port = Port::ingress(&profile, 0, 5);
    for token in 0..3 {
        port.enqueue(0, token, FrameMeta::reliable(125, token));
    }
    let at: Vec<Nanos> = run_all(&mut port, Vec::new())
        .iter()
        .map(delivered_at)
        .collect();
    assert_eq!(at, [1_000, 2_000, 3_000]);
}

/// An ingress port is cut-through: a frame offered as its last bit arrives began arriving
/// one serialisation earlier, so an idle port delivers it at once; frames converging from
/// two senders at the same time still queue, one serialisation apart.
#[test]
fn ingress_is_cut_through() {
    let profile = NetworkProfile {
        ingress: true,
        ..gbit(0)
    };
    let mut port = Port::ingress(&profile, 0, 5);
    port.enqueue(10_000, 0, FrameMeta::reliable(125, 1));
    let at = delivered_times(&mut port);
    assert_eq!(at, [10_000], "no second serialisation");
    let mut port = Port::ingress(&profile, 0, 5);
    port.enqueue(10_000, 0, FrameMeta::reliable(125, 1));
    port.enqueue(10_000, 1, FrameMeta::reliable(125, 2));
    let at = delivered_times(&mut port);
    assert_eq!(at, [10_000, 11_000], "converging frames queue");
    let mut egress = Port::egress(&profile, 0, 5);
    egress.enqueue(10_000, 0, FrameMeta::reliable(125, 1));
    let at = delivered_times(&mut egress);
    assert_eq!(at, [11_000], "an egress port serialises from the offer");
    // Senders whose NICs are ten times faster than the port: the frame's bits arrived in
    // 100 ns, and the idle port takes its 1,000 ns from the first of them.
    let fast_senders = NetworkProfile {
        worker_bandwidth_bps: Some(1e10),
        ..profile
    };
    let mut port = Port::ingress(&fast_senders, 0, 5);
    port.enqueue(10_000, 0, FrameMeta::reliable(125, 1));
    let at = delivered_times(&mut port);
    assert_eq!(at, [10_900], "the port's own rate from the first bit");
}

/// When each frame `port` decides is delivered, in order.
fn delivered_times(port: &mut Port) -> Vec<Nanos> {
    run_all(port, Vec::new()).iter().map(delivered_at).collect()
}

/// An ingress port holds one frame per flow: the next frame of a flow is offered when the
/// one ahead has left, so frames of other flows that arrived meanwhile go first, and N
/// converging flows hold at most N places in the queue.
#[test]
fn ingress_holds_one_frame_per_flow() {
    let profile = NetworkProfile {
        ingress: true,
        ..gbit(0)
    };
    let mut port = Port::ingress(&profile, 0, 5);
    for token in 0..3 {
        port.enqueue(0, token, FrameMeta::reliable(125, 1));
    }
    port.enqueue(0, 10, FrameMeta::reliable(125, 2));
    let out = run_all(&mut port, Vec::new());
    let got: Vec<(u64, Nanos)> = out.iter().map(|d| (d.token, delivered_at(d))).collect();
    assert_eq!(got, [(0, 1_000), (10, 2_000), (1, 3_000), (2, 4_000)]);
    assert_eq!(
        port.counters().queueing_ns_max,
        1_000,
        "waiting behind a frame of the flow is not queueing"
    );

    // Two flows of 1 kB frames into a 2 kB queue: nothing is dropped however many frames
    // each flow sends, where one queue for all of them would overflow.
    let profile = NetworkProfile {
        ingress: true,
        queue_bytes: Some(2_000),
        ..gbit(0)
    };
    let mut port = Port::ingress(&profile, 0, 5);
    for token in 0..20 {
        port.enqueue(0, token, FrameMeta::reliable(1_000, token % 2));
    }
    let out = run_all(&mut port, Vec::new());
    assert_eq!(out.len(), 20);
    assert_eq!(port.counters().frames_dropped, 0);
    assert_eq!(out.last().map(delivered_at), Some(20 * 8_000));
    let mut egress = Port::egress(&profile, 0, 5);
    let tolerant = |flow| FrameMeta {
        reliable: false,
        ..FrameMeta::reliable(1_000, flow)
    };
    for token in 0..20 {
        egress.enqueue(0, token, tolerant(token % 2));
    }
    let _ = run_all(&mut egress, Vec::new());
    assert!(
        egress.counters().frames_dropped > 0,
        "an egress queue is one queue for all"
    );
    // ... but it never drops its own host's reliable frames (they wait in the socket).
    let mut egress = Port::egress(&profile, 0, 5);
    for token in 0..20 {
        egress.enqueue(0, token, FrameMeta::reliable(1_000, token % 2));
    }
    assert_eq!(run_all(&mut egress, Vec::new()).len(), 20);
    assert_eq!(egress.counters().frames_dropped, 0);
}

/// A loss-tolerant frame dropped at the ingress lets the next one of its flow in at once.
#[test]
fn a_dropped_loss_tolerant_frame_releases_its_flow() {
    let profile = NetworkProfile {
        ingress: true,
        queue_bytes: Some(1_000),
        ..gbit(0)
    };
    let mut port = Port::ingress(&profile, 0, 5);
    let tolerant = |flow| FrameMeta {
        reliable: false,
        ..FrameMeta::reliable(1_000, flow)
    };
    port.enqueue(0, 0, FrameMeta::reliable(1_000, 1));
    port.enqueue(0, 1, tolerant(2)); // refused: the queue holds 1 kB
    port.enqueue(0, 2, tolerant(2)); // waits behind it, then is refused too at 0
    port.enqueue(0, 3, tolerant(2));
    let out = run_all(&mut port, Vec::new());
    let fates: Vec<(u64, bool)> = out
        .iter()
        .map(|d| (d.token, d.fate == Fate::Dropped))
        .collect();
    assert_eq!(fates, [(0, false), (1, true), (2, true), (3, true)]);
}

trait WithAt {
    fn with_at(self, at: Nanos) -> Self;
}

impl WithAt for Fate {
    fn with_at(self, new: Nanos) -> Self {
        match self {
            Fate::Delivered {
                retransmissions,
                path,
                ..
            } => Fate::Delivered {
                at: new,
                retransmissions,
                path,
            },
            other => other,
        }
    }
}

/// A host's own large TCP write holds only TCP small queues' share of its egress queue (1 ms
/// at 100 Mbit/s: 12,500 bytes): a datagram offered behind a 160 KB frame fits the 48 kB
/// queue and leaves before the write's end, where counting the whole write refused it (the
/// server's feedback lost behind its pulls). At the ingress, a network queue, nothing changes.
#[test]
fn a_datagram_fits_behind_a_large_own_tcp_write_in_a_shallow_egress_queue() {
    let profile = NetworkProfile {
        bandwidth_bps: Some(100e6),
        queue_bytes: Some(48_000),
        mtu_bytes: Some(1_500.0),
        ..NetworkProfile::default()
    };
    let datagram = FrameMeta {
        reliable: false,
        ..FrameMeta::reliable(1_400, 2)
    };
    let mut port = Port::egress(&profile, 0, 1);
    port.enqueue(0, 0, FrameMeta::reliable(160_000, 1));
    port.enqueue(0, 1, datagram);
    port.enqueue(
        0,
        2,
        FrameMeta {
            bytes: 36_000,
            ..datagram
        },
    );
    let mut out = run_all(&mut port, Vec::new());
    out.sort_by_key(|d| d.token);
    let fates: Vec<(u64, bool)> = (out.iter())
        .map(|d| (d.token, d.fate == Fate::Dropped))
        .collect();
    assert_eq!(
        fates,
        [(0, false), (1, false), (2, true)],
        "12.5 + 1.4 + 36 kB > 48 kB"
    );
    assert!(delivered_at(&out[1]) < delivered_at(&out[0]));
    assert_eq!(tcp_small_queue_bytes(Some(100e6), Some(1_500.0)), 12_500);
    assert_eq!(tcp_small_queue_bytes(Some(1e6), Some(1_500.0)), 3_028);
    assert_eq!(tcp_small_queue_bytes(None, None), 3_028);
}

/// An ingress port of two paths, 100 and 20 Mbit/s, each of a queue of `queue_bytes`.
fn ingress_100_and_20(queue_bytes: Option<usize>) -> NetworkProfile {
    NetworkProfile {
        ingress: true,
        paths: 2,
        path: vec![
            PathProfile::default(),
            PathProfile {
                bandwidth_bps: Some(20e6),
                ..PathProfile::default()
            },
        ],
        ..NetworkProfile {
            bandwidth_bps: Some(100e6),
            queue_bytes,
            ..NetworkProfile::default()
        }
    }
}

/// A host has a downlink per path: frames that came on a 20 Mbit/s second path serialise
/// there at its rate, beside the first path's, not behind them (a second path adds capacity
/// at the receiver too, as on a multi-homed host).
#[test]
fn an_ingress_port_serialises_each_path_at_its_own_rate() {
    let profile = ingress_100_and_20(None);
    let on = |path, flow| FrameMeta {
        path: Some(path),
        reliable: false,
        ..FrameMeta::reliable(125_000, flow)
    };
    let mut port = Port::ingress(&profile, 0, 1);
    port.enqueue(0, 0, on(0, 1));
    port.enqueue(0, 1, on(1, 2));
    port.enqueue(0, 2, on(0, 3));
    let mut out = run_all(&mut port, Vec::new());
    out.sort_by_key(|d| d.token);
    let at: Vec<Nanos> = out.iter().map(delivered_at).collect();
    // 125 kB take 10 ms at 100 Mbit/s and 50 ms at 20: the third frame follows the first
    // on path 0 (one serialiser for all: 10, 20 and 30 ms).
    assert_eq!(at, [10_000_000, 50_000_000, 20_000_000]);
}

/// Datagrams are not held one per flow at an ingress port (no flow control holds the next
/// back at the receiver): a datagram on the fast path does not wait for one of its flow on
/// the slow path, and a burst of them meets the queue whole.
#[test]
fn an_ingress_port_queues_every_datagram_of_a_flow() {
    let profile = ingress_100_and_20(Some(250_000));
    let mut port = Port::ingress(&profile, 0, 1);
    port.enqueue(0, 0, FrameMeta::of_datagram(0, 125_000, 1, 1));
    port.enqueue(0, 1, FrameMeta::of_datagram(0, 125_000, 1, 0));
    let mut out = run_all(&mut port, Vec::new());
    out.sort_by_key(|d| d.token);
    let at: Vec<Nanos> = out.iter().map(delivered_at).collect();
    assert_eq!(at, [50_000_000, 10_000_000]);

    // Three 125 kB datagrams of one flow into a 250 kB queue: the third is dropped, where
    // frames of a flow held one at a time never fill it.
    let mut port = Port::ingress(&profile, 0, 1);
    for token in 0..3 {
        port.enqueue(0, token, FrameMeta::of_datagram(0, 125_000, 1, 0));
    }
    let out = run_all(&mut port, Vec::new());
    let dropped: Vec<u64> = (out.iter())
        .filter(|d| d.fate == Fate::Dropped)
        .map(|d| d.token)
        .collect();
    assert_eq!(dropped, [2]);
}

/// An ingress flow's gate is one word: busy between a frame's entry and its leaving, and a
/// frame that leaves at the end of time does not leave the gate busy forever.
#[test]
fn a_gate_is_busy_from_entry_to_leaving() {
    let mut gate = FlowGate::default();
    assert!(!gate.busy());
    assert_eq!(gate.enter(), 0);
    assert!(gate.busy());
    gate.leave(7);
    assert!(!gate.busy());
    assert_eq!(gate.enter(), 7);
    gate.leave(Nanos::MAX);
    assert!(!gate.busy());
    assert_eq!(gate.enter(), Nanos::MAX - 1);
}
