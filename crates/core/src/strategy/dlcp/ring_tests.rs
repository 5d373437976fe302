//! DLCP's ring worker driven by hand: which packets are lost is chosen by the test.

use super::endpoint_tests::{decode, deliver};
use super::*;
use crate::registry::KeyInfo;
use crate::strategy::{Rank, StrategyKind, SyncPlan, WorkerEvent, WorkerSync};
use crate::wire::{FrameKind, Header};

/// The workers of a `dlcp-allreduce` job, frames moved by the test.
struct Ring {
    workers: Vec<Box<dyn WorkerSync + Send>>,
    sizes: Vec<usize>,
    /// Every frame sent: (from, to, header, frame).
    sent: Vec<(Rank, Rank, Header)>,
}

fn grad(worker: usize, key: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (1 + i + 10 * key) as f32 * (1 << worker) as f32)
        .collect()
}

impl Ring {
    fn new(n: usize, sizes: &[usize], opts: DlcpOptions) -> Self {
        let plan = SyncPlan {
            dlcp: opts,
            ..SyncPlan::new(StrategyKind::DlcpAllreduce, n, 0)
        };
        plan.validate().expect("a valid plan");
        let keys = KeyInfo::one_per_layer(sizes);
        let workers = (0..n)
            .map(|r| plan.worker_endpoint(r, keys.clone()))
            .collect();
        let mut ring = Self {
            workers,
            sizes: sizes.to_vec(),
            sent: Vec::new(),
        };
        ring.begin(0);
        ring
    }

    fn begin(&mut self, step: u64) {
        for (r, w) in self.workers.iter_mut().enumerate() {
            w.begin_step(step);
            for key in (0..self.sizes.len()).rev() {
                w.handle_gradient(key, &grad(r, key, self.sizes[key]));
            }
            w.handle_backward_done();
        }
    }

    /// Moves frames until none moves (those `lose` picks, loss-tolerant only, never
    /// arrive). Returns how many moved.
    fn pump(&mut self, lose: &mut dyn FnMut(Rank, &Header) -> bool) -> usize {
        let n = self.workers.len();
        let mut moved = 0;
        loop {
            let before = moved;
            for w in 0..n {
                for to in [(w + 1) % n, (w + n - 1) % n] {
                    let mut out = Vec::new();
                    while self.workers[w].poll_transmit(to, &mut out) {
                        let h = decode(&out);
                        self.sent.push((w, to, h));
                        moved += 1;
                        if !(h.flags.is_loss_tolerant() && lose(w, &h)) {
                            deliver(self.workers[to].as_mut(), w, &out);
                        }
                        out.clear();
                    }
                }
            }
            if moved == before {
                return moved;
            }
        }
    }

    /// Each worker's averaged gradients, once all are done.
    fn results(&mut self) -> Vec<Vec<Vec<f32>>> {
        self.workers
            .iter_mut()
            .map(|w| {
                let mut values = vec![Vec::new(); self.sizes.len()];
                let mut done = false;
                while let Some(ev) = w.poll_event() {
                    match ev {
                        WorkerEvent::GradReady(k) => values[k] = w.take_values(k),
                        WorkerEvent::StepDone => done = true,
                        WorkerEvent::ParamsReady(_) => panic!("a ring worker"),
                    }
                }
                assert!(done, "every worker finishes the step");
                values
            })
            .collect()
    }

    fn stats(&self) -> LossStats {
        let mut total = LossStats::default();
        for w in &self.workers {
            total.add(&w.loss_stats().expect("a loss-tolerant worker"));
        }
        total
    }
}

fn mean(n: usize, key: usize, len: usize) -> Vec<f32> {
    let mut acc = vec![0.0f32; len];
    for w in 0..n {
        for (a, g) in acc.iter_mut().zip(grad(w, key, len)) {
            *a += g;
        }
    }
    acc.iter().map(|a| a / n as f32).collect()
}

fn opts(bound: f64, packet: usize) -> DlcpOptions {
    DlcpOptions {
        loss_bound: bound,
        packet_elems: packet,
        ..DlcpOptions::default()
    }
}

/// With a loss bound of 0, probes recover every lost packet and the result is exact.
#[test]
fn bound_zero_recovers_every_loss() {
    let sizes = [37, 5, 64];
    let mut ring = Ring::new(3, &sizes, opts(0.0, 4));
    let mut rng = crate::net::SplitMix64::new(7);
    let lost = ring.pump(&mut |_, _| rng.next_u64().is_multiple_of(4));
    assert!(lost > 0);
    let results = ring.results();
    for (key, &len) in sizes.iter().enumerate() {
        let want = mean(3, key, len);
        for r in &results {
            assert_eq!(r[key], results[0][key], "every worker has the same bits");
            let close = r[key]
                .iter()
                .zip(&want)
                .all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs());
            assert!(close, "key {key}: {:?} vs {want:?}", r[key]);
        }
    }
    let stats = ring.stats();
    assert_eq!(stats.entries_filled, 0);
    assert!(stats.probes_answered > 0, "losses were found by probing");
}

/// Two workers, one key of 100 values: each chunk is 50 packets of one value; a bound of
/// 10 % completes a hop at exactly 45 of them.
#[test]
fn a_hop_completes_at_the_bound_and_fills_zero() {
    let lose_first = |k: u32| {
        move |from: Rank, h: &Header| from == 0 && h.kind == FrameKind::Reduce && h.offset < k
    };
    let mut ring = Ring::new(2, &[100], opts(0.1, 1));
    ring.pump(&mut lose_first(5));
    let results = ring.results();
    let g1 = grad(1, 0, 100);
    let want: Vec<f32> = mean(2, 0, 100)
        .iter()
        .enumerate()
        .map(|(i, &m)| if i < 5 { g1[i] / 2.0 } else { m })
        .collect();
    assert_eq!(
        results[0][0], want,
        "zero-filled: worker 0's lost values are missing"
    );
    assert_eq!(results[1][0], want, "the all-gather is exact");
    let stats = ring.stats();
    assert_eq!((stats.entries, stats.entries_filled), (100, 5));
    assert_eq!(
        stats.probes_answered, 0,
        "45 of 50 complete the hop: no probe"
    );
    assert_eq!(ring.workers[1].key_loss()[0].filled, 5);

    // Six lost: 44 are not enough; the probe's answer names exactly those six, and only
    // they are sent again.
    let mut ring = Ring::new(2, &[100], opts(0.1, 1));
    let mut first = true;
    ring.pump(&mut |from, h| {
        let lose = from == 0 && h.kind == FrameKind::Reduce && h.offset < 6 && first;
        if lose && h.offset == 5 {
            first = false;
        }
        lose
    });
    let resent: Vec<u32> = ring
        .sent
        .iter()
        .filter(|(from, _, h)| *from == 0 && h.kind == FrameKind::Reduce)
        .map(|(_, _, h)| h.offset)
        .skip(50)
        .collect();
    assert_eq!(resent, vec![0, 1, 2, 3, 4, 5]);
    let missing = ring
        .sent
        .iter()
        .filter(|(_, _, h)| h.kind == FrameKind::Missing)
        .count();
    assert_eq!(missing, 1);
    let results = ring.results();
    assert_eq!(results[0][0], mean(2, 0, 100), "the resent packets arrived");
}

/// A duplicated packet, or one of a hop already complete, is ignored, not added twice.
#[test]
fn duplicates_and_late_packets_are_ignored() {
    let mut ring = Ring::new(2, &[8], opts(0.0, 2));
    let mut out = Vec::new();
    assert!(ring.workers[0].poll_transmit(1, &mut out));
    let h = decode(&out);
    assert_eq!(h.kind, FrameKind::Reduce);
    for _ in 0..2 {
        deliver(ring.workers[1].as_mut(), 0, &out);
    }
    ring.pump(&mut |_, _| false);
    let results = ring.results();
    assert_eq!(results[1][0], mean(2, 0, 8));
    assert!(ring.stats().packets_ignored >= 1);
}

/// With a pull bound, a lost all-gather packet keeps the previous step's value at the
/// worker that lost it (zero on the first step); the others are exact.
#[test]
fn a_pull_bound_keeps_stale_values() {
    let o = DlcpOptions {
        pull_loss_bound: 0.25,
        ..opts(0.0, 1)
    };
    let mut ring = Ring::new(2, &[8], o);
    // Worker 0 owns chunk 1 ([4, 8)) and sends it to worker 1 in the all-gather.
    ring.pump(&mut |from, h| from == 0 && h.kind == FrameKind::Gather && h.offset == 7);
    let results = ring.results();
    let m = mean(2, 0, 8);
    assert_eq!(results[0][0], m);
    let mut stale = m.clone();
    stale[7] = 0.0;
    assert_eq!(results[1][0], stale);
    assert_eq!(ring.stats().entries_stale, 1);

    // Step 1 loses entry 6 instead: it keeps step 0's value, which equals this step's
    // (the test's gradients do not change from step to step).
    ring.begin(1);
    ring.pump(&mut |from, h| from == 0 && h.kind == FrameKind::Gather && h.offset == 6);
    let results = ring.results();
    assert_eq!(
        results[1][0], m,
        "step 0's value of entry 6, step 1's of entry 7"
    );
    assert_eq!(ring.stats().entries_stale, 2);
}

/// The same seed loses the same packets and gives the same values.
#[test]
fn the_same_losses_give_the_same_bits() {
    let run = |seed: u64| {
        let mut ring = Ring::new(4, &[50, 9], opts(0.2, 3));
        let mut rng = crate::net::SplitMix64::new(seed);
        ring.pump(&mut |_, _| rng.next_u64().is_multiple_of(5));
        (ring.results(), ring.stats())
    };
    let (a, sa) = run(3);
    let (b, sb) = run(3);
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    assert!(sa.entries_filled > 0, "something was lost and filled");
}

/// Malformed frames are refused with a reason, never a panic.
#[test]
fn bad_frames_are_refused() {
    let mut ring = Ring::new(3, &[10], opts(0.0, 2));
    let w = ring.workers[1].as_mut();
    let mut h = Header::data(FrameKind::Reduce, 0, 0, 1, 2);
    assert!(w.recv_slot(0, &h).is_err(), "not a packet boundary");
    h.offset = 0;
    assert!(w.recv_slot(2, &h).is_err(), "data only from the left");
    h.key = 9;
    assert!(w.recv_slot(0, &h).is_err(), "no such key");
    let mut stop = Header::data(FrameKind::Stop, 0, 0, 7, 0);
    assert!(w.recv_slot(2, &stop).is_err(), "no such chunk");
    stop.offset = 0;
    stop.sequence = 9;
    assert!(w.recv_slot(2, &stop).is_err(), "no such phase");
    let mut ahead = Header::data(FrameKind::Reduce, 5, 0, 0, 2);
    ahead.sender = 0;
    let slot = w.recv_slot(0, &ahead).expect("a packet's slot");
    slot.fill(1.0);
    assert!(w.handle_payload(0, &ahead).is_err(), "steps ahead");
}

/// Reduce-scatter packets are loss-tolerant, sprayed, classed by their bucket's front-most
/// layer and marked drop-eligible below the median; the all-gather's are reliable and never
/// drop-eligible, loss-tolerant only under a pull bound. The ablations switch each off.
#[test]
fn packets_carry_class_marks_and_spraying() {
    let flags_of = |o: DlcpOptions| {
        // Two keys in one bucket: layer 0 (front) and layer 7.
        let mut ring = Ring::new(2, &[40, 1, 1, 1, 1, 1, 1, 40], o);
        ring.pump(&mut |_, _| false);
        ring.results();
        ring.sent
    };
    let sent = flags_of(opts(0.0, 4));
    let reduce: Vec<_> = sent
        .iter()
        .filter(|(_, _, h)| h.kind == FrameKind::Reduce)
        .collect();
    let gather: Vec<_> = sent
        .iter()
        .filter(|(_, _, h)| h.kind == FrameKind::Gather)
        .collect();
    assert!(!reduce.is_empty() && !gather.is_empty());
    for (_, _, h) in &reduce {
        assert!(h.flags.is_loss_tolerant() && h.flags.is_sprayed());
        assert_eq!(h.flags.priority_class(), 0, "the bucket holds layer 0");
    }
    let marked = reduce
        .iter()
        .filter(|(_, _, h)| h.flags.is_drop_eligible())
        .count();
    assert!(
        marked > 0 && marked < reduce.len(),
        "{marked} of {}",
        reduce.len()
    );
    for (_, _, h) in &gather {
        assert!(!h.flags.is_loss_tolerant() && !h.flags.is_drop_eligible());
    }
    let pulled = flags_of(DlcpOptions {
        pull_loss_bound: 0.01,
        ..opts(0.0, 4)
    });
    assert!(pulled
        .iter()
        .filter(|(_, _, h)| h.kind == FrameKind::Gather)
        .all(|(_, _, h)| h.flags.is_loss_tolerant() && !h.flags.is_drop_eligible()));
    let plain = flags_of(DlcpOptions {
        priority: false,
        spray: false,
        ..opts(0.0, 4)
    });
    assert!(plain
        .iter()
        .filter(|(_, _, h)| h.kind == FrameKind::Reduce)
        .all(|(_, _, h)| !h.flags.is_sprayed() && !h.flags.is_drop_eligible()));
}

/// A left-hand neighbour that probes again and again without reading the answers leaves
/// one Missing queued, naming what is missing after the latest probe.
#[test]
fn repeated_probes_queue_one_missing_with_the_latest_bitmap() {
    let mut ring = Ring::new(2, &[16], opts(0.0, 1));
    let (mut packets, mut probe) = (Vec::new(), None);
    let mut out = Vec::new();
    while probe.is_none() && ring.workers[0].poll_transmit(1, &mut out) {
        match decode(&out).kind {
            FrameKind::Reduce => packets.push(out.clone()),
            FrameKind::Probe => probe = Some(out.clone()),
            _ => {}
        }
        out.clear();
    }
    let probe = probe.expect("worker 0 probes once its chunk is out");
    assert_eq!(packets.len(), 8);
    for p in &packets[..3] {
        deliver(ring.workers[1].as_mut(), 0, p);
        for _ in 0..100 {
            deliver(ring.workers[1].as_mut(), 0, &probe);
        }
    }
    let mut bitmaps = Vec::new();
    while ring.workers[1].poll_transmit(0, &mut out) {
        if decode(&out).kind == FrameKind::Missing {
            bitmaps.push(out[crate::wire::HEADER_LEN..].to_vec());
        }
        out.clear();
    }
    assert_eq!(bitmaps, vec![0b1111_1000u32.to_le_bytes().to_vec()]);
}
