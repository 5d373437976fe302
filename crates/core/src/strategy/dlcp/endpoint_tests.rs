//! DLCP's worker and server driven by hand: which packets are lost is chosen by the test.

use super::*;
use crate::net::SplitMix64;
use crate::registry::KeyInfo;
use crate::strategy::{
    Endpoint, Rank, ServerOptim, ServerSync, StrategyKind, SyncPlan, WorkerEvent, WorkerSync,
};
use crate::wire::{Flags, FrameKind, Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

const LR: f32 = 0.5;

/// Workers and one server of a DLCP job, frames moved by the test.
pub(super) struct Cluster {
    pub(super) workers: Vec<Box<dyn WorkerSync + Send>>,
    pub(super) server: Box<dyn ServerSync + Send>,
    sizes: Vec<usize>,
    /// Every frame sent: (sender, header); the server is rank `workers`.
    pub(super) sent: Vec<(Rank, Header)>,
}

/// The header of an encoded frame.
pub(super) fn decode(frame: &[u8]) -> Header {
    let mut raw = [0u8; HEADER_LEN];
    raw.copy_from_slice(&frame[..HEADER_LEN]);
    Header::decode(&raw, DEFAULT_MAX_PAYLOAD).expect("a valid header")
}

/// Hands an encoded frame from `from` to `to`, as a driver does.
pub(super) fn deliver(to: &mut dyn Endpoint, from: Rank, frame: &[u8]) {
    let h = decode(frame);
    let slot = to.recv_slot(from, &h).expect("accepted");
    crate::wire::f32_bytes_mut(slot).copy_from_slice(&frame[HEADER_LEN..]);
    to.handle_payload(from, &h).expect("accepted");
}

fn grad(worker: usize, key: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (1 + i + 10 * key) as f32 * if worker == 0 { 1.0 } else { 0.25 })
        .collect()
}

impl Cluster {
    pub(super) fn new(workers: usize, sizes: &[usize], opts: DlcpOptions) -> Self {
        let plan = SyncPlan {
            slice_params: 64,
            dlcp: opts,
            ..SyncPlan::new(StrategyKind::Dlcp, workers, 1)
        };
        plan.validate().expect("a valid plan");
        let keys = KeyInfo::one_per_layer(sizes);
        let init = sizes.iter().map(|&n| vec![0.0; n]).collect();
        let server = plan
            .server_endpoint(workers, keys.clone(), init, ServerOptim::plain(LR))
            .expect("a server");
        let mut workers: Vec<_> = (0..workers)
            .map(|r| plan.worker_endpoint(r, keys.clone()))
            .collect();
        for (r, w) in workers.iter_mut().enumerate() {
            w.begin_step(0);
            for key in (0..sizes.len()).rev() {
                w.handle_gradient(key, &grad(r, key, sizes[key]));
            }
            w.handle_backward_done();
        }
        Self {
            workers,
            server,
            sizes: sizes.to_vec(),
            sent: Vec::new(),
        }
    }

    /// Starts step `step` on every worker and hands over its gradients.
    pub(super) fn begin(&mut self, step: u64) {
        for (r, w) in self.workers.iter_mut().enumerate() {
            w.begin_step(step);
            for key in (0..self.sizes.len()).rev() {
                w.handle_gradient(key, &grad(r, key, self.sizes[key]));
            }
            w.handle_backward_done();
        }
    }

    /// Moves frames until none moves: each worker's frames in turn, then the server's
    /// (those `lose` picks, loss-tolerant only, never arrive; the server is rank `n`).
    /// Returns how many moved.
    pub(super) fn pump(&mut self, lose: &mut dyn FnMut(Rank, &Header) -> bool) -> usize {
        let n = self.workers.len();
        let mut moved = 0;
        loop {
            let before = moved;
            for w in 0..n {
                let mut out = Vec::new();
                while self.workers[w].poll_transmit(n, &mut out) {
                    let h = decode(&out);
                    self.sent.push((w, h));
                    moved += 1;
                    if !(h.flags.is_loss_tolerant() && lose(w, &h)) {
                        deliver(self.server.as_mut(), w, &out);
                    }
                    out.clear();
                }
            }
            let links: Vec<Rank> = (0..n).collect();
            let mut out = Vec::new();
            while let Some(to) = self.server.poll_transmit_any(&links, &mut out) {
                let h = decode(&out);
                self.sent.push((n, h));
                if !(h.flags.is_loss_tolerant() && lose(n, &h)) {
                    deliver(self.workers[to].as_mut(), n, &out);
                }
                moved += 1;
                out.clear();
            }
            if moved == before {
                return moved;
            }
        }
    }

    /// Each worker's values after the step (all workers must be done).
    fn params(&mut self) -> Vec<Vec<Vec<f32>>> {
        self.workers
            .iter_mut()
            .map(|w| {
                let mut values = vec![Vec::new(); self.sizes.len()];
                let mut done = false;
                while let Some(ev) = w.poll_event() {
                    match ev {
                        WorkerEvent::ParamsReady(k) => values[k] = w.take_values(k),
                        WorkerEvent::StepDone => done = true,
                        WorkerEvent::GradReady(_) => panic!("a parameter-server worker"),
                    }
                }
                assert!(done, "the step is done");
                values
            })
            .collect()
    }
}

pub(super) fn exact(packet: usize) -> DlcpOptions {
    DlcpOptions {
        loss_bound: 0.0,
        packet_elems: packet,
        ..DlcpOptions::default()
    }
}

/// With a loss bound of 0, packets lost at random are found by probes and resent until
/// every one is in: the result is SGD on the exact mean gradient.
#[test]
fn bound_zero_recovers_every_lost_packet_through_probes() {
    let sizes = [37, 5, 100];
    for seed in 0..20 {
        let mut c = Cluster::new(3, &sizes, exact(4));
        let mut rng = SplitMix64::new(seed);
        c.pump(&mut |_, _| rng.chance(0.3));
        let got = c.params();
        for (key, &n) in sizes.iter().enumerate() {
            let want: Vec<f32> = (0..n)
                .map(|i| -LR * (0..3).map(|w| grad(w, key, n)[i]).sum::<f32>() / 3.0)
                .collect();
            for w in &got {
                assert_eq!(w[key], want, "seed {seed} key {key}");
            }
        }
        let stats = c.server.loss_stats().expect("a loss-tolerant server");
        assert_eq!(stats.entries_filled, 0);
        assert!(
            stats.probes_answered > 0,
            "seed {seed}: losses were probed for"
        );
    }
}

/// A probe is answered with exactly the missing packets, and only those are resent.
#[test]
fn a_probe_gets_the_missing_packets_and_only_they_are_resent() {
    let mut c = Cluster::new(1, &[40], exact(4));
    let mut lost = vec![];
    c.pump(&mut |_, h| {
        let lose = (h.offset == 8 || h.offset == 28) && !lost.contains(&h.offset);
        if lose {
            lost.push(h.offset);
        }
        lose
    });
    assert_eq!(lost, vec![8, 28]);
    let after_probe: Vec<u32> = c
        .sent
        .iter()
        .skip_while(|(_, h)| !h.flags.is_last_of_share())
        .skip(1)
        .filter(|(_, h)| h.kind == FrameKind::Push)
        .map(|(_, h)| h.offset)
        .collect();
    assert_eq!(after_probe, vec![8, 28]);
    let stats = c.server.loss_stats().expect("stats");
    assert_eq!(
        stats.probes_answered, 1,
        "the second round's probe finds the share complete"
    );
    assert_eq!(
        c.params()[0][0],
        (0..40).map(|i| -LR * (1 + i) as f32).collect::<Vec<_>>()
    );
}

/// Under a loss bound, a worker's share completes at exactly ceil((1 - p) n) packets; what
/// never arrived counts as zero (or the sum is rescaled), and packets after the share was
/// aggregated are ignored, not added.
#[test]
fn zero_fill_and_rescale_are_exact_on_a_known_loss_pattern() {
    for fill in LossFill::ALL {
        let opts = DlcpOptions {
            loss_bound: 0.5,
            packet_elems: 1,
            fill,
            ..DlcpOptions::default()
        };
        // One key of 8 values, one value a packet: 4 of 8 complete a share. Worker 0 loses
        // packet 0 and delivers 1..7; worker 1 delivers 0..3, completing the key, so its
        // packets 4..7 come after the aggregation.
        let mut c = Cluster::new(2, &[8], opts);
        c.pump(&mut |w, h| w == 0 && h.offset == 0);
        let g0 = grad(0, 0, 8);
        let g1 = grad(1, 0, 8);
        let want: Vec<f32> = (0..8)
            .map(|i| {
                let (a, b) = (i != 0, i < 4);
                let sum = if a { g0[i] } else { 0.0 } + if b { g1[i] } else { 0.0 };
                let count = usize::from(a) + usize::from(b);
                let mean = match fill {
                    LossFill::Zero => sum / 2.0,
                    LossFill::Rescale if count > 0 => sum / count as f32,
                    LossFill::Rescale => 0.0,
                };
                -LR * mean
            })
            .collect();
        let got = c.params();
        assert_eq!(got[0][0], want, "{fill:?}");
        assert_eq!(got[1][0], want, "{fill:?}");
        let stats = c.server.loss_stats().expect("stats");
        assert_eq!((stats.entries, stats.entries_filled), (16, 5), "{fill:?}");
        let per_key = c.server.key_loss();
        let entries: u64 = per_key.iter().map(|k| k.entries).sum();
        let filled: u64 = per_key.iter().map(|k| k.filled).sum();
        assert_eq!((entries, filled), (16, 5), "per key: {per_key:?}");
        let summed = KeyLoss::sum([per_key.clone(), per_key.clone()]);
        assert_eq!(summed[0].entries, 2 * per_key[0].entries);
        assert!((summed[0].realised_loss() - per_key[0].realised_loss()).abs() < 1e-12);
        assert_eq!(stats.packets_ignored, 4, "worker 1's late packets");
        assert_eq!(stats.stops, 2);
        assert_eq!(
            stats.probes_answered, 0,
            "probes of complete shares are not answered"
        );
    }
}

/// Over TCP a Stop goes only where it cuts the sending short: a share complete with every
/// packet in gets none (the worker's Probe finds nothing missing), one complete at its bound
/// with packets still to come does; with control datagrams every complete share gets one.
#[test]
fn a_stop_goes_only_where_packets_are_still_to_come() {
    let stops = |c: &Cluster| {
        let server = c.workers.len();
        (c.sent.iter())
            .filter(|(from, h)| *from == server && h.kind == FrameKind::Stop)
            .count()
    };
    let mut whole = Cluster::new(2, &[8], exact(2));
    whole.pump(&mut |_, _| false);
    assert_eq!(stops(&whole), 0, "every packet in: no Stop over TCP");
    assert_eq!(
        whole.params()[0][0].len(),
        8,
        "the step ends on the parameters"
    );
    let mut bounded = Cluster::new(
        2,
        &[8],
        DlcpOptions {
            loss_bound: 0.5,
            packet_elems: 1,
            ..DlcpOptions::default()
        },
    );
    bounded.pump(&mut |_, _| false);
    assert_eq!(
        stops(&bounded),
        2,
        "complete at 4 of 8, a Stop to each worker"
    );
    let datagrams = DlcpOptions {
        control_datagrams: true,
        ..exact(2)
    };
    let mut c = Cluster::new(2, &[8], datagrams);
    c.pump(&mut |_, _| false);
    assert_eq!(
        stops(&c),
        2,
        "with control datagrams, a Stop to each worker"
    );
}

/// A duplicated packet is counted once.
#[test]
fn a_duplicated_packet_is_counted_once() {
    let mut c = Cluster::new(1, &[4], exact(2));
    let mut out = Vec::new();
    assert!(c.workers[0].poll_transmit(1, &mut out));
    deliver(c.server.as_mut(), 0, &out);
    deliver(c.server.as_mut(), 0, &out);
    c.pump(&mut |_, _| false);
    assert_eq!(
        c.params()[0][0],
        (0..4).map(|i| -LR * (1 + i) as f32).collect::<Vec<_>>()
    );
    let stats = c.server.loss_stats().expect("stats");
    assert_eq!((stats.packets, stats.packets_ignored), (2, 1));
}

/// Over many steps, the server keeps no more spare share buffers than the shares need:
/// each key's buffers keep their key's size, not grown to the largest key's as they pass
/// from key to key (whose arrival order the losses change).
#[test]
fn spare_share_buffers_stay_at_the_live_need() {
    let sizes = [3000, 10, 10, 10, 10, 10];
    let workers = 2;
    let mut c = Cluster::new(workers, &sizes, exact(64));
    let need = workers * sizes.iter().sum::<usize>() * std::mem::size_of::<f32>();
    let mut rng = SplitMix64::new(7);
    for step in 0..30 {
        if step > 0 {
            c.begin(step);
        }
        c.pump(&mut |_, _| rng.chance(0.05));
        c.params();
        let kept = c.server.pooled_bytes();
        assert!(
            kept <= 2 * need,
            "step {step}: {kept} bytes kept, the shares need {need}"
        );
    }
}

/// The same losses give the same bits.
#[test]
fn the_same_seed_gives_the_same_bits() {
    let opts = DlcpOptions {
        loss_bound: 0.2,
        packet_elems: 3,
        ..DlcpOptions::default()
    };
    let run = |seed| {
        let mut c = Cluster::new(3, &[50, 7, 31], opts);
        let mut rng = SplitMix64::new(seed);
        c.pump(&mut |_, _| rng.chance(0.1));
        (c.params(), c.server.loss_stats())
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

/// Over TCP the last packet of a share is its probe: it travels reliably and no Probe frame
/// follows it; a share it finds incomplete is answered with what is missing, and a server
/// refuses a reliable push not so marked, and the mark where control travels as datagrams.
#[test]
fn the_last_packet_of_a_share_is_its_probe_over_tcp() {
    let mut c = Cluster::new(1, &[40], exact(4));
    c.pump(&mut |_, h| h.kind == FrameKind::Push && h.offset == 12);
    let kinds: Vec<(FrameKind, u32, bool)> = (c.sent.iter())
        .map(|(_, h)| (h.kind, h.offset, h.flags.is_last_of_share()))
        .collect();
    assert!(kinds.iter().all(|&(kind, ..)| kind != FrameKind::Probe));
    let tail: Vec<_> = kinds.iter().skip(9).copied().collect();
    assert_eq!(
        tail[..3],
        [
            (FrameKind::Push, 36, true),
            (FrameKind::Missing, 0, false),
            (FrameKind::Push, 12, true)
        ],
        "{kinds:?}"
    );
    assert_eq!(c.server.loss_stats().expect("stats").probes_answered, 1);
    assert_eq!(
        c.params()[0][0],
        (0..40).map(|i| -LR * (1 + i) as f32).collect::<Vec<_>>()
    );
    let refused = |opts: DlcpOptions, flags: Flags| {
        let mut c = Cluster::new(1, &[40], opts);
        let mut h = Header::data(FrameKind::Push, 0, 0, 0, 4);
        h.flags = flags;
        c.server.recv_slot(0, &h).is_err()
    };
    assert!(refused(exact(4), Flags::class(0)));
    assert!(!refused(exact(4), Flags::class(0).last_of_share()));
    let datagrams = DlcpOptions {
        control_datagrams: true,
        ..exact(4)
    };
    assert!(refused(datagrams, Flags::class(0).last_of_share()));
}

/// Packets carry their layer's class and a drop-eligible mark below the median magnitude;
/// probes and pulls are reliable.
#[test]
fn packets_carry_class_marks_and_spraying() {
    let mut c = Cluster::new(
        1,
        &[8, 8],
        DlcpOptions {
            packet_elems: 2,
            ..DlcpOptions::default()
        },
    );
    c.pump(&mut |_, _| false);
    let pushes: Vec<&Header> = c
        .sent
        .iter()
        .map(|(_, h)| h)
        .filter(|h| h.kind == FrameKind::Push)
        .collect();
    assert_eq!(pushes.len(), 8);
    for h in &pushes {
        let last = h.flags.is_last_of_share();
        assert_eq!(h.flags.is_loss_tolerant() && h.flags.is_sprayed(), !last);
        assert_eq!(
            last,
            h.offset == 6,
            "the last packet of each key's share probes"
        );
        assert_eq!(h.flags.priority_class(), class_of_layer(h.key as usize, 2));
        // Values rise with the offset: the first half of each key is below its median.
        assert_eq!(h.flags.is_drop_eligible(), h.offset < 4, "{h:?}");
    }
    assert_eq!(pushes[0].key, 0, "the front layer goes first");
    let control = |h: &&Header| h.kind != FrameKind::Push;
    assert!(
        c.sent
            .iter()
            .map(|(_, h)| h)
            .filter(control)
            .all(|h| !h.flags.is_loss_tolerant()),
        "control frames and parameters stay reliable without control datagrams"
    );
    let off = DlcpOptions {
        packet_elems: 2,
        priority: false,
        spray: false,
        ..DlcpOptions::default()
    };
    let mut c = Cluster::new(1, &[8, 8], off);
    c.pump(&mut |_, _| false);
    for (_, h) in &c.sent {
        assert_eq!(h.flags.priority_class(), 0);
        assert!(!h.flags.is_drop_eligible() && !h.flags.is_sprayed());
    }
}

/// With a pull bound, a parameter packet the network loses leaves that worker's entries at
/// the step before's values once the bound lets the share complete; the first step of a
/// run needs every packet; the other worker gets the exact values.
#[test]
fn a_pull_bound_keeps_the_step_befores_parameters() {
    let o = DlcpOptions {
        pull_loss_bound: 0.25,
        ..exact(1)
    };
    let mut c = Cluster::new(2, &[8], o);
    let mut rng = SplitMix64::new(5);
    // Step 0: parameter packets lost at random are all recovered (probes and resends).
    c.pump(&mut |from, h| from == 2 && h.kind == FrameKind::Params && rng.chance(0.3));
    let step0 = c.params();
    assert_eq!(
        step0[0], step0[1],
        "the first step's parameters are exact everywhere"
    );
    c.begin(1);
    c.pump(&mut |from, h| {
        from == 2 && h.kind == FrameKind::Params && h.offset == 7 && h.sequence < u64::MAX
    });
    let step1 = c.params();
    // Worker 1 (or 0): entry 7 never came to either worker, so both kept step 0's value.
    for w in &step1 {
        assert_eq!(w[0][7], step0[0][0][7], "the step before's value");
        assert_ne!(w[0][0], step0[0][0][0], "the other entries moved on");
    }
    let stale: u64 = c
        .workers
        .iter()
        .map(|w| w.loss_stats().expect("a pull bound").entries_stale)
        .sum();
    assert_eq!(stale, 2);
    let sent = c
        .sent
        .iter()
        .filter(|(from, h)| *from < 2 && h.kind == FrameKind::Stop)
        .count();
    assert!(sent >= 2, "the workers stopped the server's sends");
}

/// The bitmaps of the Missing frames `server` has queued for worker link 0.
fn queued_missing(server: &mut dyn Endpoint) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut bitmaps = Vec::new();
    while server.poll_transmit(0, &mut out) {
        if decode(&out).kind == FrameKind::Missing {
            let words = out[HEADER_LEN..].chunks_exact(4);
            bitmaps.push(
                words
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            );
        }
        out.clear();
    }
    bitmaps
}

/// A worker that probes again and again without reading the answers leaves one Missing
/// queued at the server, and it names what is missing after the latest probe.
#[test]
fn repeated_probes_queue_one_missing_with_the_latest_bitmap() {
    let mut c = Cluster::new(1, &[8], exact(1));
    let mut packets = Vec::new();
    let mut out = Vec::new();
    while c.workers[0].poll_transmit(1, &mut out) {
        if decode(&out).kind == FrameKind::Push {
            packets.push(out.clone());
        }
        out.clear();
    }
    assert_eq!(packets.len(), 8);
    let mut probe = Vec::new();
    crate::wire::encode_data_frame(&mut probe, &Header::data(FrameKind::Probe, 0, 0, 0, 0), &[]);
    for p in &packets[..5] {
        deliver(c.server.as_mut(), 0, p);
        for _ in 0..100 {
            deliver(c.server.as_mut(), 0, &probe);
        }
    }
    assert_eq!(queued_missing(c.server.as_mut()), vec![vec![0b1110_0000]]);
    assert!(!c.server.has_pending_replies());
}

/// Under a bound, a lost packet holds its slice only until a packet far enough behind it
/// arrives: the slice is summed and its parameters sent at once, not after the whole key.
#[test]
fn a_slice_missing_a_lost_packet_goes_once_later_packets_arrive() {
    let opts = DlcpOptions {
        loss_bound: 0.1,
        packet_elems: 4,
        ..DlcpOptions::default()
    };
    // One key of 640 values: 160 packets, slices of 64 values (16 packets each).
    let mut c = Cluster::new(1, &[640], opts);
    let (mut out, mut reply) = (Vec::new(), Vec::new());
    let (mut delivered, mut first_params) = (0, None);
    while c.workers[0].poll_transmit(1, &mut out) {
        let h = decode(&out);
        if h.kind == FrameKind::Push && h.offset != 8 {
            deliver(c.server.as_mut(), 0, &out);
            delivered += 1;
        }
        out.clear();
        while c.server.poll_transmit_any(&[0], &mut reply).is_some() {
            let h = decode(&reply);
            if h.kind == FrameKind::Params && first_params.is_none() {
                first_params = Some((delivered, h.offset));
            }
            reply.clear();
        }
    }
    // Packet 2 (values 8..12) is given up when packet 10 arrives; slice 0's other 15
    // packets are in after 15 deliveries (the key would need 144).
    assert_eq!(first_params, Some((15, 0)));
    // The share completes at 144 of 160: the lost packet and the 15 after it are filled in.
    let stats = c.server.loss_stats().expect("stats");
    assert_eq!(stats.entries_filled, 16 * 4);
}

/// A worker sends its most urgent share first (the lowest layer, the next forward's first
/// need): a gradient handed over while a later layer's packets go takes over at once, and
/// the later layer's packets follow once the more urgent ones are out.
#[test]
fn the_most_urgent_share_goes_first_and_takes_over() {
    let sizes = [32, 32, 32];
    let mut c = Cluster::new(1, &sizes, exact(8));
    c.pump(&mut |_, _| false);
    c.params();
    let w = &mut c.workers[0];
    w.begin_step(1);
    let mut out = Vec::new();
    let mut next_key = |w: &mut Box<dyn WorkerSync + Send>| {
        out.clear();
        w.poll_transmit(1, &mut out).then(|| decode(&out).key)
    };
    w.handle_gradient(2, &grad(0, 2, 32));
    assert_eq!(next_key(w), Some(2));
    w.handle_gradient(1, &grad(0, 1, 32));
    assert_eq!(next_key(w), Some(1));
    w.handle_gradient(0, &grad(0, 0, 32));
    w.handle_backward_done();
    let mut keys = Vec::new();
    while let Some(key) = next_key(w) {
        keys.push(key);
    }
    // Four packets a key: key 0's four, then key 1's other three, then key 2's.
    assert_eq!(keys, [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
}
