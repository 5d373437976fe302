//! The datagram link end to end: two links, one per end, passing sealed datagrams in
//! memory.

use super::*;
use crate::wire::mac::FrameKey;
use crate::wire::{Flags, FrameKind};

const GSO: SendLimits = SendLimits {
    gso: true,
    max_segments: 64,
    max_bytes: 65_507,
};

/// The two ends of a link between ranks 0 and 1 over `paths` paths, at `rate` bit/s.
fn pair(paths: usize, rate: f64) -> (DatagramLink, DatagramLink) {
    let keys = LinkKeys {
        send: FrameKey::new([1; 32]),
        recv: FrameKey::new([2; 32]),
    };
    let config = RateConfig {
        initial_bps: rate,
        ..RateConfig::default()
    };
    let a = DatagramLink::new(1, &keys, paths, config, 1 << 16);
    let b = DatagramLink::new(0, &keys.reversed(), paths, config, 1 << 16);
    (a, b)
}

/// A loss-tolerant push of `values` values of `key` from rank 0, sprayed if so.
fn push(key: u32, values: u32, sprayed: bool) -> (Header, Vec<u8>) {
    let mut header = Header::data(FrameKind::Push, 0, key, 0, values);
    header.sender = 0;
    header.flags = Flags::class(0).loss_tolerant().spray_if(sprayed);
    (header, (0..values * 4).map(|i| i as u8).collect())
}

/// Everything `from` hands out at `now` (flushing), as sealed batches.
fn drain(from: &mut DatagramLink, now: u64) -> Vec<Sealed> {
    let mut all = Vec::new();
    let mut out = Sealed::default();
    while from.poll_transmit(now, true, GSO, &mut out) {
        all.push(out.clone());
    }
    all
}

/// Hands every datagram of `batches` to `to` at `now`; the payloads it delivered.
fn deliver_all(to: &mut DatagramLink, batches: &[Sealed], now: u64) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for sealed in batches {
        for run in &sealed.runs {
            for datagram in sealed.run_bytes(run).chunks(run.segment) {
                let _ = to.handle_datagram(now, sealed.path, datagram, |_, p| {
                    got.push(p.to_vec());
                    true
                });
            }
        }
    }
    got
}

#[test]
fn frames_cross_the_link_and_feedback_comes_back() {
    let (mut a, mut b) = pair(1, 1e9);
    let frames: Vec<_> = (0..3).map(|k| push(k, 100, false)).collect();
    for (h, p) in &frames {
        a.enqueue(*h, p);
    }
    let sent = drain(&mut a, 1_000);
    assert_eq!(sent.len(), 1, "one batch");
    assert_eq!(sent[0].datagrams(), 3);
    assert!(a.is_drained());
    let got = deliver_all(&mut b, &sent, 51_000);
    assert_eq!(
        got,
        frames.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>()
    );
    assert_eq!(b.counters().received, 3);
    // The receiver's feedback falls due by time and carries the round trip back.
    assert!(drain(&mut b, 51_000).is_empty(), "not yet due");
    let due = b.poll_timeout(51_000).unwrap_or(u64::MAX);
    let feedback = drain(&mut b, due);
    assert_eq!(feedback.len(), 1);
    assert_eq!(feedback[0].runs[0].dscp, FEEDBACK_DSCP);
    deliver_all(&mut a, &feedback, due + 50_000);
    let stats = a.rate_stats()[0];
    assert_eq!((stats.feedbacks, stats.last_loss), (1, 0.0));
    assert_eq!(a.counters().feedback_received, 1);
    assert_eq!(
        stats.srtt_ns, 100_000,
        "two 50 us hops, the time held excluded"
    );
}

#[test]
fn the_time_a_batch_waits_for_its_write_is_not_counted_as_round_trip() {
    let (mut a, mut b) = pair(1, 1e9);
    let (h, p) = push(0, 100, false);
    a.enqueue(h, &p);
    let mut out = Sealed::default();
    assert!(a.poll_transmit(1_000, true, GSO, &mut out));
    // Sealed at 1 us, written at 301 us (a long batch to seal, a preempted thread).
    a.handle_departure(301_000);
    a.handle_departure(900_000); // nothing sealed since: ignored
    deliver_all(&mut b, std::slice::from_ref(&out), 351_000);
    let due = b.poll_timeout(351_000).unwrap_or(u64::MAX);
    let feedback = drain(&mut b, due);
    deliver_all(&mut a, &feedback, due + 50_000);
    assert_eq!(
        a.rate_stats()[0].srtt_ns,
        100_000,
        "two 50 us hops: neither the sender's wait nor the receiver's hold"
    );
}

#[test]
fn the_pacer_lets_frames_go_at_its_rate_and_says_when_next() {
    // 10 Mbit/s: a 2 ms bucket holds 2,500 bytes, about two 1,100-byte datagrams.
    let (mut a, _) = pair(1, 10e6);
    for k in 0..10 {
        let (h, p) = push(k, 256, false);
        a.enqueue(h, &p);
    }
    let first: usize = drain(&mut a, 0).iter().map(Sealed::datagrams).sum();
    assert!((1..10).contains(&first), "{first} left at once");
    assert!(!a.takes_more());
    let next = a.poll_timeout(0).unwrap_or(u64::MAX);
    assert!(next > 0 && next < 2_000_000, "next departure at {next} ns");
    let mut left = first;
    let mut now = next;
    while !a.is_drained() && now < 100_000_000 {
        left += drain(&mut a, now)
            .iter()
            .map(Sealed::datagrams)
            .sum::<usize>();
        now = a.poll_timeout(now).unwrap_or(now + 1_000_000).max(now + 1);
    }
    assert_eq!(left, 10);
    let bits = 10.0 * (256.0 * 4.0 + 100.0) * 8.0;
    assert!(
        now as f64 >= 0.5 * bits / 10e6 * 1e9,
        "paced, not all at once: {now} ns"
    );
}

#[test]
fn sprayed_frames_share_the_paths_and_the_others_keep_their_keys_path() {
    let (mut a, mut b) = pair(2, 1e9);
    for k in 0..4 {
        let (h, p) = push(k, 10, true);
        a.enqueue(h, &p);
    }
    let sent = drain(&mut a, 0);
    let shape: Vec<(usize, usize)> = sent.iter().map(|s| (s.path, s.datagrams())).collect();
    assert_eq!(
        shape,
        [(0, 2), (1, 2)],
        "alike paths: the one that carried fewer bytes"
    );
    assert_eq!(deliver_all(&mut b, &sent, 1).len(), 4);
    // Unsprayed: by key, so keys 0 and 2 share a path and a batch.
    for k in [0, 2, 1] {
        let (h, p) = push(k, 10, false);
        a.enqueue(h, &p);
    }
    let sent = drain(&mut a, 1);
    let shape: Vec<(usize, usize)> = sent.iter().map(|s| (s.path, s.datagrams())).collect();
    assert_eq!(shape, [(0, 2), (1, 1)]);
}

#[test]
fn a_slow_path_carries_what_its_pacer_allows_and_the_fast_one_the_rest() {
    let (mut a, _) = pair(2, 100e6);
    // Path 1 has been cut to 10 Mbit/s (its controller timed out, as on a loss burst).
    a.paths[1] = path::PathState::new(RateConfig {
        initial_bps: 10e6,
        ..RateConfig::default()
    });
    for k in 0..400 {
        let (h, p) = push(k, 256, true);
        a.enqueue(h, &p);
    }
    let mut per_path = [0usize; 2];
    let mut now = 0;
    while !a.is_drained() && now < 1_000_000_000 {
        for s in drain(&mut a, now) {
            per_path[s.path] += s.datagrams();
        }
        now = a.poll_timeout(now).unwrap_or(now + 1_000_000).max(now + 1);
    }
    assert_eq!(per_path[0] + per_path[1], 400);
    let share = per_path[1] as f64 / 400.0;
    assert!(
        (0.04..0.2).contains(&share),
        "the 10 Mbit/s path took {per_path:?}"
    );
}

#[test]
fn datagrams_reordered_between_paths_are_not_loss_and_a_lossy_path_is_slowed_alone() {
    let (mut a, mut b) = pair(2, 1e9);
    for k in 0..64 {
        let (h, p) = push(k, 10, true);
        a.enqueue(h, &p);
    }
    let mut sent = drain(&mut a, 0);
    // Path 1's datagrams arrive first (a shorter path); on path 0 three of every four are
    // lost, heavy loss (random loss of a few percent would leave its rate alone).
    sent.sort_by_key(|s| std::cmp::Reverse(s.path));
    for s in &mut sent {
        if s.path == 0 {
            let kept: Vec<Vec<u8>> = (s.run_bytes(&s.runs[0]).chunks(s.runs[0].segment))
                .enumerate()
                .filter(|(n, _)| n % 4 == 3)
                .map(|(_, d)| d.to_vec())
                .collect();
            let mut out = Sealed {
                path: 0,
                ..Sealed::default()
            };
            for d in kept {
                let start = out.bytes.len();
                out.bytes.extend_from_slice(&d);
                let end = out.bytes.len();
                out.runs.push(Run {
                    dscp: 0,
                    start,
                    end,
                    count: 1,
                    segment: end - start,
                });
            }
            *s = out;
        }
    }
    assert_eq!(deliver_all(&mut b, &sent, 10_000).len(), 32 + 8);
    let feedback = drain(&mut b, FEEDBACK_EVERY_NS);
    assert_eq!(
        feedback.iter().map(|s| s.path).collect::<Vec<_>>(),
        [0, 1],
        "one per path"
    );
    deliver_all(&mut a, &feedback, FEEDBACK_EVERY_NS + 10_000);
    let stats = a.rate_stats();
    assert_eq!(stats[1].last_loss, 0.0, "reordered, not lost");
    assert!(
        (stats[0].last_loss - 0.75).abs() < 0.05,
        "path 0 lost three quarters: {}",
        stats[0].last_loss
    );
    assert!(stats[0].rate_bps < stats[1].rate_bps);
}

#[test]
fn forged_replayed_foreign_and_refused_datagrams_are_counted_not_delivered() {
    let (mut a, mut b) = pair(1, 1e9);
    let (h, p) = push(0, 10, false);
    a.enqueue(h, &p);
    let sent = drain(&mut a, 0);
    let datagram = sent[0].bytes.clone();
    let mut forged = datagram.clone();
    if let Some(last) = forged.last_mut() {
        *last ^= 1;
    }
    assert_eq!(
        b.handle_datagram(1, 0, &forged, |_, _| true),
        Err(DropReason::BadMac)
    );
    assert_eq!(
        b.handle_datagram(1, 0, &datagram, |_, _| false),
        Err(DropReason::Stale)
    );
    assert_eq!(
        b.handle_datagram(1, 0, &datagram, |_, _| true),
        Err(DropReason::Replayed)
    );
    let long = vec![0; crate::wire::datagram::MAX_DATAGRAM_LEN + 1];
    assert_eq!(
        b.handle_datagram(1, 0, &long, |_, _| true),
        Err(DropReason::Oversized)
    );
    // A frame that names another sender than the link's peer.
    let (mut h, p) = push(1, 10, false);
    h.sender = 2;
    a.enqueue(h, &p);
    let sent = drain(&mut a, 2);
    assert_eq!(
        b.handle_datagram(3, 0, &sent[0].bytes, |_, _| true),
        Err(DropReason::Malformed)
    );
    let c = b.counters();
    assert_eq!(
        (c.bad_mac, c.stale, c.replayed, c.oversized, c.malformed),
        (1, 1, 1, 1, 1)
    );
    assert_eq!(c.drops(), 5);
}

#[test]
fn a_feedback_due_seals_the_batch_first_so_numbers_follow_the_send_order() {
    let (mut a, mut b) = pair(1, 1e9);
    // b receives something, so that its feedback falls due...
    let (h, p) = push(0, 10, false);
    b.enqueue(Header { sender: 1, ..h }, &p);
    let to_a = drain(&mut b, 0);
    deliver_all(&mut a, &to_a, 0);
    // ...while a has a batch open (no flush): the batch leaves first.
    let (h, p) = push(1, 10, false);
    a.enqueue(h, &p);
    let mut out = Sealed::default();
    assert!(
        !a.poll_transmit(0, false, GSO, &mut out),
        "the batch waits for a flush"
    );
    assert!(!a.is_drained());
    assert!(a.poll_transmit(FEEDBACK_EVERY_NS, false, GSO, &mut out));
    assert_eq!(
        out.runs[0].dscp,
        crate::wire::datagram::dscp_of(h.flags),
        "data first"
    );
    let data = out.clone();
    assert!(a.poll_transmit(FEEDBACK_EVERY_NS, false, GSO, &mut out));
    assert_eq!(out.runs[0].dscp, FEEDBACK_DSCP, "then the feedback");
    // In that order the receiver's window sees no gap and no replay.
    assert_eq!(
        deliver_all(&mut b, &[data, out], FEEDBACK_EVERY_NS).len(),
        1
    );
    assert_eq!(b.counters().drops(), 0);
}

/// Probes, Stops and Missing answers take the path of the shortest round trip, whatever
/// their key: behind a slow path's queue a Probe outlives the timer that the fastest
/// path's round trip sets, and a Stop arrives after the packets it was to spare.
#[test]
fn control_takes_the_path_of_the_shortest_round_trip() {
    for slow in [0, 1] {
        let mut a = measured_pair(slow, 5_000_000);
        let now = 2 * FEEDBACK_EVERY_NS;
        drain(&mut a, now);
        for (key, kind) in
            (0..6).zip([FrameKind::Probe, FrameKind::Stop, FrameKind::Missing].repeat(2))
        {
            let mut h = Header::data(kind, 0, key, 0, 0);
            h.flags = Flags::class(0).loss_tolerant();
            a.enqueue(h, &[]);
            let paths: Vec<usize> = drain(&mut a, now).iter().map(|s| s.path).collect();
            assert_eq!(paths, [1 - slow], "{kind:?} of key {key}");
        }
    }
}

/// A link over two paths at 1 Gbit/s whose path `slow` measured a round trip of `late_ns`
/// and the other one of 10 us (its feedback came back at `FEEDBACK_EVERY_NS` plus those).
fn measured_pair(slow: usize, late_ns: u64) -> DatagramLink {
    let (mut a, mut b) = pair(2, 1e9);
    for k in 0..8 {
        let (h, p) = push(k, 10, true);
        a.enqueue(h, &p);
    }
    let sent = drain(&mut a, 0);
    assert!(
        sent.iter().any(|s| s.path == 1),
        "both paths carried pushes"
    );
    deliver_all(&mut b, &sent, 10_000);
    let feedback = drain(&mut b, FEEDBACK_EVERY_NS);
    for s in &feedback {
        let late = if s.path == slow { late_ns } else { 10_000 };
        deliver_all(&mut a, std::slice::from_ref(s), FEEDBACK_EVERY_NS + late);
    }
    let rtts: Vec<u64> = a.rate_stats().iter().map(|r| r.srtt_ns).collect();
    assert!(rtts[slow] > rtts[1 - slow], "{rtts:?}");
    a
}

/// A path of a long round trip takes sprayed frames only while the fast path alone would
/// take longer to carry the queue (earliest completion first): the bulk of a large share,
/// none of its last frames, none of a small share.
#[test]
fn a_slow_path_carries_a_long_queues_bulk_but_not_its_last_frames() {
    let mut a = measured_pair(1, 5_000_000);
    let mut now = 2 * FEEDBACK_EVERY_NS;
    for k in 0..8 {
        let (h, p) = push(k, 10, true);
        a.enqueue(h, &p);
    }
    let small: Vec<usize> = drain(&mut a, now).iter().map(|s| s.path).collect();
    assert_eq!(small, [0], "a small share waits for the fast path");
    // 1,000 frames of 1 KB: 8 ms at 1 Gbit/s, so a datagram on the slow path (5 ms) lands
    // sooner than the fast path would carry the queue, until 5 ms of it are left.
    for k in 0..1_000 {
        let (h, p) = push(k, 256, true);
        a.enqueue(h, &p);
    }
    let mut order = Vec::new();
    while !a.is_drained() && now < 10 * FEEDBACK_EVERY_NS {
        for s in drain(&mut a, now) {
            order.extend(std::iter::repeat_n(s.path, s.datagrams()));
        }
        now = a.poll_timeout(now).unwrap_or(now + 1_000_000).max(now + 1);
    }
    let on_slow = order.iter().filter(|&&p| p == 1).count();
    let last_slow = order.iter().rposition(|&p| p == 1).unwrap_or(0);
    assert!(
        (100..400).contains(&on_slow),
        "the slow path took {on_slow}"
    );
    assert!(
        order.len() - last_slow > 500,
        "the last frame on the slow path was {last_slow} of {}",
        order.len()
    );
}

/// A path kept idle by its round trip takes one frame once it has been idle for
/// `PROBE_IDLE_NS`, so it is measured again, and no more while it shows no better.
#[test]
fn a_path_idle_for_long_is_probed_with_one_frame() {
    let mut a = measured_pair(1, 5_000_000);
    // 300 frames of 1 KB: 2.4 ms at 1 Gbit/s, sooner than a datagram crosses the slow path.
    let carry = |a: &mut DatagramLink, from: u64| {
        let mut per_path = [0usize; 2];
        for k in 0..300 {
            let (h, p) = push(k, 256, true);
            a.enqueue(h, &p);
        }
        let mut now = from;
        while !a.is_drained() && now < from + FEEDBACK_EVERY_NS * 100 {
            for s in drain(a, now) {
                per_path[s.path] += s.datagrams();
            }
            now = a.poll_timeout(now).unwrap_or(now + 1_000_000).max(now + 1);
        }
        per_path
    };
    assert_eq!(carry(&mut a, 2 * FEEDBACK_EVERY_NS), [300, 0]);
    assert_eq!(carry(&mut a, PROBE_IDLE_NS + FEEDBACK_EVERY_NS), [299, 1]);
}
