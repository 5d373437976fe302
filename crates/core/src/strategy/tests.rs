//! Deterministic in-process tests of the strategies: a seeded network shuttles frames
//! between the state machines in random (but per-link in-order, like TCP) interleavings,
//! and the results are checked against direct arithmetic.

use std::collections::VecDeque;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::optim::{LrSchedule, Sgd, SgdConfig};
use crate::registry::{KeyInfo, Placement, TensorRegistry};
use crate::sched::SchedulerKind;
use crate::wire::{Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

#[path = "averaging/periodic_tests.rs"]
mod periodic;

/// A frame handed to a link.
enum Queued {
    /// Encoded, on the wire.
    Wire(Vec<u8>),
    /// Handed out as [`Transmit::Lent`] and not yet written: its header, and the payload
    /// as it was when lent (which must still be what the endpoint lends when it is written).
    Lent(Header, Vec<f32>),
}

/// Frames in flight on one directed link, in order.
type InFlight = VecDeque<Queued>;

/// In-flight frames on each directed link `(from, to)`.
struct Net {
    links: Vec<((Rank, Rank), InFlight)>,
}

impl Net {
    fn new(pairs: &[(Rank, Rank)]) -> Self {
        Self {
            links: pairs.iter().map(|&p| (p, VecDeque::new())).collect(),
        }
    }

    /// Writes the first lent frame of link `i`, whose sender is `from`: checks that its
    /// payload has not changed since it was lent, then hands the buffer back.
    fn write_lent(&mut self, i: usize, from: &mut dyn Endpoint) {
        let ((_, to), q) = &mut self.links[i];
        let Some(entry) = q.iter_mut().find(|e| matches!(e, Queued::Lent(..))) else {
            return;
        };
        let Queued::Lent(h, snapshot) = entry else {
            return;
        };
        let h = *h;
        assert_eq!(
            from.lent_payload(&h),
            &snapshot[..],
            "a lent payload changed before it was written"
        );
        let mut frame = h.encode().to_vec();
        frame.extend_from_slice(crate::wire::f32_bytes(snapshot));
        *entry = Queued::Wire(frame);
        from.handle_sent(*to, &h);
    }

    /// Delivers the head frame of link `i` into `to`; returns whether there was one.
    fn deliver(&mut self, i: usize, to: &mut dyn Endpoint) -> bool {
        self.deliver_around(i, None, to)
    }

    /// Delivers the head frame of link `i` into `to` in two parts, asking for its slot each
    /// time as a driver reading a frame as it arrives does, and between the parts delivers
    /// the head frame of link `between` (another link into `to`), as frames of several links
    /// complete while one is still arriving. Returns whether link `i` had a frame.
    fn deliver_around(&mut self, i: usize, between: Option<usize>, to: &mut dyn Endpoint) -> bool {
        let from = self.links[i].0 .0;
        if !matches!(self.links[i].1.front(), Some(Queued::Wire(_))) {
            return false;
        }
        let Some(Queued::Wire(frame)) = self.links[i].1.pop_front() else {
            return false;
        };
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&frame[..HEADER_LEN]);
        let h = Header::decode(&hb, DEFAULT_MAX_PAYLOAD).expect("valid header");
        let payload = &frame[HEADER_LEN..];
        let half = payload.len() / 8 * 4;
        let slot = to.recv_slot(from, &h).expect("frame accepted");
        crate::wire::f32_bytes_mut(slot)[..half].copy_from_slice(&payload[..half]);
        if let Some(j) = between.filter(|&j| j != i && self.links[j].0 .1 == self.links[i].0 .1) {
            self.deliver(j, to);
        }
        let slot = to.recv_slot(from, &h).expect("frame accepted again");
        crate::wire::f32_bytes_mut(slot)[half..].copy_from_slice(&payload[half..]);
        to.handle_payload(from, &h).expect("payload accepted");
        true
    }
}

fn keys(sizes: &[usize]) -> Vec<KeyInfo> {
    KeyInfo::one_per_layer(sizes)
}

/// Values with rounding in their sums (0.1 is no binary fraction), so the order of additions
/// shows in the bits.
fn grad(step: u64, worker: usize, key: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + key * 13 + worker * 31 + step as usize * 3) % 17) as f32 * 0.1 - 0.8)
        .collect()
}

/// Runs `steps` synchronous steps of a worker strategy plus optional servers, delivering
/// frames in a seeded random order; each worker starts its next step as soon as it has
/// finished the last one, as a real worker does, and hands each gradient over as a copy
/// or, now and then, written into the strategy's own buffer. Returns each worker's `take_values` per
/// step and key.
fn drive(
    workers: &mut [Box<dyn WorkerSync>],
    servers: &mut [Box<dyn ServerSync + Send>],
    sizes: &[usize],
    steps: u64,
    seed: u64,
) -> Vec<Vec<Vec<Vec<f32>>>> {
    let n = workers.len();
    let total = n + servers.len();
    let mut pairs = Vec::new();
    for a in 0..total {
        for b in 0..total {
            if a != b {
                pairs.push((a, b));
            }
        }
    }
    let mut net = Net::new(&pairs);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut results = vec![vec![vec![Vec::new(); sizes.len()]; n]; steps as usize];
    // Per worker: current step, keys still to hand over (last layer first).
    let mut step = vec![0u64; n];
    let mut to_hand: Vec<Vec<usize>> = (0..n).map(|_| (0..sizes.len()).rev().collect()).collect();
    for w in workers.iter_mut() {
        w.begin_step(0);
    }
    let mut guard = 0;
    while step.iter().any(|&s| s < steps) {
        guard += 1;
        assert!(guard < 5_000_000, "no progress");
        let actions = if net.links.is_empty() { 1 } else { 4 };
        match rng.gen_range(0..actions) {
            0 => {
                let w = rng.gen_range(0..n);
                if step[w] < steps {
                    if let Some(key) = to_hand[w].first().copied() {
                        to_hand[w].remove(0);
                        let g = grad(step[w], w, key, sizes[key]);
                        // Now and then written in place, where the strategy offers its buffer.
                        let slot = match rng.gen_bool(0.5) {
                            true => workers[w].gradient_slot(key),
                            false => None,
                        };
                        let in_place = slot.map(|slot| slot.copy_from_slice(&g)).is_some();
                        if in_place {
                            workers[w].handle_gradient_in_place(key);
                        } else {
                            workers[w].handle_gradient(key, &g);
                        }
                        if to_hand[w].is_empty() {
                            workers[w].handle_backward_done();
                        }
                    }
                }
            }
            1 => {
                let i = rng.gen_range(0..net.links.len());
                let (from, to) = net.links[i].0;
                let mut out = Vec::new();
                let ep: &mut dyn Endpoint = if from < n {
                    workers[from].as_mut()
                } else {
                    servers[from - n].as_mut()
                };
                // The sender asks for a frame for one link, or picks among all its links as
                // over a shared NIC, copied or (where the endpoint can) lent.
                let tos: Vec<Rank> = net
                    .links
                    .iter()
                    .filter(|l| l.0 .0 == from)
                    .map(|l| l.0 .1)
                    .collect();
                let sent = match rng.gen_range(0..3) {
                    0 => ep
                        .poll_transmit(to, &mut out)
                        .then_some(Transmit::Copied(to)),
                    1 => ep.poll_transmit_any(&tos, &mut out).map(Transmit::Copied),
                    _ => ep.poll_transmit_lent(&tos, &mut out),
                };
                let (to, queued) = match sent {
                    None => continue,
                    Some(Transmit::Copied(to)) => (to, Queued::Wire(out)),
                    Some(Transmit::Lent(to, h)) => {
                        assert_eq!(out, h.encode().to_vec(), "a lent frame's header");
                        (to, Queued::Lent(h, ep.lent_payload(&h).to_vec()))
                    }
                };
                let j = net
                    .links
                    .iter()
                    .position(|l| l.0 == (from, to))
                    .expect("link exists");
                net.links[j].1.push_back(queued);
            }
            2 => {
                let i = rng.gen_range(0..net.links.len());
                let from = net.links[i].0 .0;
                if from < n {
                    net.write_lent(i, workers[from].as_mut());
                } else {
                    net.write_lent(i, servers[from - n].as_mut());
                }
            }
            _ => {
                let i = rng.gen_range(0..net.links.len());
                let to = net.links[i].0 .1;
                // Now and then another link's frame completes while this one arrives.
                let between = rng.gen_bool(0.3).then(|| rng.gen_range(0..net.links.len()));
                if to < n {
                    net.deliver_around(i, between, workers[to].as_mut());
                } else {
                    net.deliver_around(i, between, servers[to - n].as_mut());
                }
            }
        }
        for w in 0..n {
            while let Some(ev) = workers[w].poll_event() {
                match ev {
                    WorkerEvent::ParamsReady(k) | WorkerEvent::GradReady(k) => {
                        results[step[w] as usize][w][k] = workers[w].take_values(k);
                    }
                    WorkerEvent::StepDone => {
                        assert!(to_hand[w].is_empty(), "step done before backward finished");
                        step[w] += 1;
                        if step[w] < steps {
                            to_hand[w] = (0..sizes.len()).rev().collect();
                            workers[w].begin_step(step[w]);
                        }
                    }
                }
            }
        }
    }
    results
}

fn mean_grad(step: u64, n: usize, key: usize, len: usize) -> Vec<f32> {
    let mut acc = vec![0f32; len];
    for w in 0..n {
        for (a, g) in acc.iter_mut().zip(grad(step, w, key, len)) {
            *a += g;
        }
    }
    acc.iter().map(|a| a / n as f32).collect()
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}

/// Every worker's values after each step as single-process training on the workers' whole
/// batch would have them: the mean gradient where the workers apply the optimizer, the
/// parameters after SGD on the mean gradient where the servers do.
fn reference(
    kind: StrategyKind,
    n: usize,
    sizes: &[usize],
    steps: u64,
    init: &[Vec<f32>],
    cfg: SgdConfig,
) -> Vec<Vec<Vec<f32>>> {
    assert_eq!(
        kind.averages(),
        Averaged::Gradients,
        "no reference for {kind:?} yet"
    );
    let sgd = Sgd::new(cfg);
    let mut params = init.to_vec();
    let mut vel: Vec<Vec<f32>> = sizes.iter().map(|&l| vec![0.0; l]).collect();
    (0..steps)
        .map(|step| {
            (0..sizes.len())
                .map(|key| {
                    let g = mean_grad(step, n, key, sizes[key]);
                    if !kind.uses_servers() {
                        return g;
                    }
                    sgd.step(LR, &mut params[key], &g, &mut vel[key]);
                    params[key].clone()
                })
                .collect()
        })
        .collect()
}

/// DLCP's settings for a test of exactness: a loss bound of 0 (every packet needed) and
/// packets of `packet` values; the defaults for every other strategy.
fn exact_dlcp(kind: StrategyKind, packet: usize) -> DlcpOptions {
    if kind.loss_tolerant() {
        DlcpOptions {
            loss_bound: 0.0,
            packet_elems: packet,
            ..DlcpOptions::default()
        }
    } else {
        DlcpOptions::default()
    }
}

/// The servers' learning rate in the property test.
const LR: f32 = 0.1;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every strategy, its endpoints built by [`SyncPlan`] as every driver builds them, gives
    /// every worker the same bits, equal to direct arithmetic (the mean gradient, or SGD
    /// applied to it on the servers), for any cluster, slice, bucket, frame and credit
    /// sizes, small buckets shared whole or not, any scheduler and any interleaving.
    #[test]
    fn every_strategy_matches_direct_arithmetic(
        n in 1usize..5,
        servers in 1usize..4,
        sizes in prop::collection::vec(1usize..60, 1..6),
        slice in 1usize..30,
        bucket in 1usize..100,
        frame in 1usize..40,
        direct_below in prop::sample::select(vec![0usize, 10, 40, 1000]),
        mesh: bool,
        scheduler in prop::sample::select(SchedulerKind::ALL.to_vec()),
        credit_bytes in 4usize..200,
        packet in 1usize..12,
        seed: u64,
    ) {
        let init: Vec<Vec<f32>> = sizes.iter().map(|&len| (0..len).map(|i| i as f32 * 0.01).collect()).collect();
        let cfg = SgdConfig { momentum: 0.9, weight_decay: 1e-3 };
        let optim = ServerOptim { sgd: Sgd::new(cfg), lr: LR, schedule: LrSchedule::Constant };
        for kind in StrategyKind::ALL {
            let plan = SyncPlan {
                scheduler: if kind.loss_tolerant() { kind.default_scheduler() } else { scheduler },
                slice_params: slice,
                bucket_bytes: 4 * bucket,
                credit_bytes,
                frame_elems: frame,
                direct_share_elems: direct_below,
                mesh,
                dlcp: exact_dlcp(kind, packet.min(frame)),
                ..SyncPlan::new(kind, n, if kind.uses_servers() { servers } else { 0 })
            };
            prop_assert!(plan.validate().is_ok());
            let mut ws: Vec<Box<dyn WorkerSync>> = (0..n)
                .map(|r| -> Box<dyn WorkerSync> { plan.worker_endpoint(r, keys(&sizes)) })
                .collect();
            let mut ss: Vec<Box<dyn ServerSync + Send>> = (n..plan.world_size())
                .map(|r| plan.server_endpoint(r, keys(&sizes), init.clone(), optim))
                .collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let results = drive(&mut ws, &mut ss, &sizes, 3, seed);
            if !kind.exact() && !kind.loss_tolerant() {
                continue;
            }
            let want = reference(kind, n, &sizes, 3, &init, cfg);
            for (step, per_worker) in results.iter().enumerate() {
                for key in 0..sizes.len() {
                    let w0 = &per_worker[0][key];
                    prop_assert!(close(w0, &want[step][key]), "{:?} step {} key {}: {:?} vs {:?}", kind, step, key, w0, want[step][key]);
                    for other in &per_worker[1..] {
                        prop_assert_eq!(&other[key], w0);
                    }
                }
            }
        }
    }
}

#[test]
fn wrong_frames_are_refused_with_the_sender_named() {
    let reg = TensorRegistry::new(keys(&[10, 10]), 4, 1, Placement::KeysByBytes);
    let optim = ServerOptim {
        sgd: Sgd::new(SgdConfig::default()),
        lr: 0.1,
        schedule: LrSchedule::Constant,
    };
    let mut server = PsServer::new(
        0,
        2,
        reg.clone(),
        vec![vec![0.0; 10]; 2],
        optim,
        SchedulerKind::Fifo,
    );
    let bad_slice = Header::data(crate::wire::FrameKind::Push, 0, 0, 1, 4);
    let e = server.recv_slot(1, &bad_slice).unwrap_err().to_string();
    assert!(e.contains("rank 1") && e.contains("no such slice"), "{e}");
    let from_server = Header::data(crate::wire::FrameKind::Push, 0, 0, 0, 4);
    assert!(server.recv_slot(2, &from_server).is_err());
    let ok = Header::data(crate::wire::FrameKind::Push, 0, 0, 0, 4);
    server.recv_slot(0, &ok).unwrap();
    server.handle_payload(0, &ok).unwrap();
    let e = server.recv_slot(0, &ok).unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
    let mut other_step = ok;
    other_step.step = 5;
    assert!(server
        .recv_slot(1, &other_step)
        .unwrap_err()
        .to_string()
        .contains("step"));

    let mut worker = PsWorker::new(0, 2, reg, true, SchedulerKind::Fifo, 0);
    worker.begin_step(3);
    let params = Header::data(crate::wire::FrameKind::Params, 2, 0, 0, 4);
    assert!(worker
        .recv_slot(2, &params)
        .unwrap_err()
        .to_string()
        .contains("step"));
    let mut ring = RingAllReduce::new(0, 3, keys(&[10]), 100, 4, true, SchedulerKind::Fifo);
    ring.begin_step(0);
    let from_right = Header::data(crate::wire::FrameKind::Reduce, 0, 0, 0, 3);
    assert!(ring
        .recv_slot(1, &from_right)
        .unwrap_err()
        .to_string()
        .contains("left"));
}

/// A worker takes each slice's answer once per step, across its bit set's words (100
/// slices: two words), and takes them all again the next step.
#[test]
fn a_worker_refuses_an_answer_twice_in_a_step() {
    let reg = TensorRegistry::new(keys(&[400]), 4, 1, Placement::KeysByBytes);
    let mut worker = PsWorker::new(0, 1, reg, true, SchedulerKind::Fifo, 0);
    let answer =
        |step, slice: u32| Header::data(crate::wire::FrameKind::Params, step, 0, slice * 4, 4);
    for step in 0..2 {
        worker.begin_step(step);
        for slice in [0, 63, 64, 99] {
            worker.recv_slot(1, &answer(step, slice)).unwrap();
            worker.handle_payload(1, &answer(step, slice)).unwrap();
        }
        for slice in [0, 63, 64, 99] {
            let e = worker.recv_slot(1, &answer(step, slice)).unwrap_err();
            assert!(e.to_string().contains("twice"), "{e}");
        }
        for slice in [1, 62, 65, 98] {
            worker.recv_slot(1, &answer(step, slice)).unwrap();
        }
    }
}

/// Found by the `endpoint_frames` fuzz target: header fields at the top of their range are
/// refused, not overflowed (a ring step of `u64::MAX`, a push for step `u64::MAX`).
#[test]
fn extreme_steps_and_ring_steps_are_refused() {
    let mut ring = RingAllReduce::new(0, 2, keys(&[10]), 100, 4, true, SchedulerKind::Fifo);
    ring.begin_step(0);
    let mut reduce = Header::data(crate::wire::FrameKind::Reduce, 0, 0, 5, 5);
    reduce.sequence = u64::MAX;
    let e = ring.recv_slot(1, &reduce).unwrap_err().to_string();
    assert!(e.contains("ring step beyond the ring"), "{e}");

    let reg = TensorRegistry::new(keys(&[10]), 10, 1, Placement::KeysByBytes);
    let optim = ServerOptim {
        sgd: Sgd::new(SgdConfig::default()),
        lr: 0.1,
        schedule: LrSchedule::Constant,
    };
    let mut server = PsServer::new(0, 1, reg, vec![vec![0.0; 10]], optim, SchedulerKind::Fifo);
    let push = Header::data(crate::wire::FrameKind::Push, u64::MAX, 0, 0, 10);
    let e = server.recv_slot(0, &push).unwrap_err().to_string();
    assert!(e.contains("step out of range"), "{e}");
}

/// P3's preemption: with the priority scheduler, a slice of the first layer handed over
/// after 100 queued slices of a later layer is the next frame on the wire.
#[test]
fn late_first_layer_slice_preempts_queued_slices() {
    let reg = TensorRegistry::new(keys(&[4, 400]), 4, 1, Placement::SlicesRoundRobin);
    let mut worker = PsWorker::new(0, 1, reg.clone(), true, SchedulerKind::Priority, 0);
    worker.begin_step(0);
    worker.handle_gradient(1, &[0.5; 400]);
    let mut out = Vec::new();
    assert!(worker.poll_transmit(1, &mut out));
    worker.handle_gradient(0, &[0.25; 4]);
    out.clear();
    assert_eq!(worker.poll_transmit_any(&[1], &mut out), Some(1));
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&out[..HEADER_LEN]);
    let h = Header::decode(&hb, DEFAULT_MAX_PAYLOAD).unwrap();
    assert_eq!(
        (h.key, h.offset),
        (0, 0),
        "the first layer's slice goes next"
    );

    // FIFO keeps readiness order: the 99 queued slices of layer 1 go first.
    let mut fifo = PsWorker::new(0, 1, reg, true, SchedulerKind::Fifo, 0);
    fifo.begin_step(0);
    fifo.handle_gradient(1, &[0.5; 400]);
    fifo.handle_gradient(0, &[0.25; 4]);
    let mut keys_sent = Vec::new();
    while {
        out.clear();
        fifo.poll_transmit(1, &mut out)
    } {
        hb.copy_from_slice(&out[..HEADER_LEN]);
        keys_sent.push(Header::decode(&hb, DEFAULT_MAX_PAYLOAD).unwrap().key);
    }
    assert_eq!(keys_sent.len(), 101);
    assert_eq!(keys_sent.last(), Some(&0));
}

/// Credit scheduling keeps at most the credit in flight (one slice when nothing is); a
/// retuned credit applies from the next frame: a larger one lets more slices go at once.
#[test]
fn credit_bounds_the_bytes_in_flight_and_a_retuned_credit_applies_at_once() {
    let reg = TensorRegistry::new(keys(&[40]), 4, 1, Placement::SlicesRoundRobin);
    let mut worker = PsWorker::new(0, 1, reg, true, SchedulerKind::Credit, 32);
    worker.begin_step(0);
    worker.handle_gradient(0, &[1.0; 40]);
    let mut out = Vec::new();
    let mut sent = 0;
    while worker.poll_transmit(1, &mut out) {
        sent += 1;
    }
    assert_eq!(sent, 2, "two 16-byte slices fit a 32-byte credit");
    worker.retune(crate::tune::Knobs { credit_bytes: 96 });
    while worker.poll_transmit(1, &mut out) {
        sent += 1;
    }
    assert_eq!(sent, 6, "six 16-byte slices fit a 96-byte credit");
}

/// A neighbour may start step 0 and send its first segments before this worker has begun
/// the step: they are kept, not wiped by `begin_step` (this once hung real jobs).
#[test]
fn ring_keeps_frames_that_arrive_before_the_first_step_begins() {
    let n = 2;
    let sizes = [6usize];
    let mut ws: Vec<RingAllReduce> = (0..n)
        .map(|r| RingAllReduce::new(r, n, keys(&sizes), 100, 2, true, SchedulerKind::Fifo))
        .collect();
    let mut net = Net::new(&[(0, 1), (1, 0)]);
    // Worker 1 runs ahead: begins, hands its gradient, sends all it can to worker 0.
    ws[1].begin_step(0);
    ws[1].handle_gradient(0, &grad(0, 1, 0, 6));
    let mut out = Vec::new();
    while ws[1].poll_transmit(0, &mut out) {
        net.links[1]
            .1
            .push_back(Queued::Wire(std::mem::take(&mut out)));
    }
    while net.deliver(1, &mut ws[0]) {}
    // Only now worker 0 begins the step.
    ws[0].begin_step(0);
    ws[0].handle_gradient(0, &grad(0, 0, 0, 6));
    let mut done = [false; 2];
    for _ in 0..100 {
        for (from, to, link) in [(0usize, 1usize, 0usize), (1, 0, 1)] {
            while ws[from].poll_transmit(to, &mut out) {
                net.links[link]
                    .1
                    .push_back(Queued::Wire(std::mem::take(&mut out)));
            }
        }
        while net.deliver(0, &mut ws[1]) {}
        while net.deliver(1, &mut ws[0]) {}
        for (w, d) in ws.iter_mut().zip(done.iter_mut()) {
            while let Some(ev) = w.poll_event() {
                *d |= ev == WorkerEvent::StepDone;
            }
        }
    }
    assert_eq!(done, [true, true], "both workers finish the step");
    let want = mean_grad(0, n, 0, 6);
    for w in &mut ws {
        assert!(close(&w.take_values(0), &want));
    }
}

/// What the worker at each rank adopts in step `step` of `schedule` when every worker hands
/// over `grad(step, rank, key)` as its weights: the mean of positions `0..=k`, summed in
/// chain order and scaled as the chain does, or the exact mean of everyone in a full sync.
fn stepwise_reference(
    schedule: &ChainSchedule,
    step: u64,
    key: usize,
    len: usize,
) -> Vec<Vec<f32>> {
    let n = schedule.workers();
    let round = schedule.round(step);
    let mut sums: Vec<Vec<f32>> = Vec::new();
    let mut acc = vec![0f32; len];
    for pos in 0..n {
        let own = grad(step, schedule.rank_at(pos, step), key, len);
        if pos == 0 {
            acc = own;
        } else {
            acc.iter_mut().zip(&own).for_each(|(a, x)| *a += x);
        }
        sums.push(acc.clone());
    }
    (0..n)
        .map(|rank| {
            let pos = if round.exact {
                n - 1
            } else {
                schedule.position(rank, step)
            };
            let f = 1.0 / (pos + 1) as f32;
            sums[pos].iter().map(|s| s * f).collect()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Step-wise averaging, whatever the interleaving, buckets, segments and scheduler:
    /// after each step the worker at chain position k holds exactly the mean of positions
    /// 0..=k's handed-over weights (rotating or fixed head), and after a full sync every
    /// replica holds the same bits, the mean of all.
    #[test]
    fn stepwise_adopts_the_mean_of_the_chain_up_to_each_worker(
        n in 1usize..6,
        sizes in prop::collection::vec(1usize..40, 1..5),
        bucket in 1usize..80,
        segment in 1usize..30,
        scheduler in prop::sample::select(vec![SchedulerKind::Fifo, SchedulerKind::Priority]),
        head in prop::sample::select(StepwiseHead::ALL.to_vec()),
        full_sync_every in 0u64..3,
        seed: u64,
    ) {
        let plan = SyncPlan {
            scheduler,
            bucket_bytes: 4 * bucket,
            chain_segment_elems: segment,
            stepwise_head: head,
            full_sync_every,
            ..SyncPlan::new(StrategyKind::Stepwise, n, 0)
        };
        prop_assert!(plan.validate().is_ok());
        let schedule = plan.chain_schedule().expect("a chain strategy");
        let mut ws: Vec<Box<dyn WorkerSync>> = (0..n)
            .map(|r| -> Box<dyn WorkerSync> { plan.worker_endpoint(r, keys(&sizes)) })
            .collect();
        let steps = 5;
        let results = drive(&mut ws, &mut [], &sizes, steps, seed);
        for step in 0..steps {
            for (key, &len) in sizes.iter().enumerate() {
                let want = stepwise_reference(&schedule, step, key, len);
                for rank in 0..n {
                    let got = &results[step as usize][rank][key];
                    prop_assert_eq!(got, &want[rank], "step {} rank {} key {}", step, rank, key);
                }
            }
        }
    }
}

#[test]
fn a_head_cannot_run_more_than_a_step_ahead_of_its_right_neighbour() {
    // Fixed head, two workers: worker 0 never receives anything, so only worker 1's
    // acknowledgement holds it back.
    let plan = SyncPlan {
        stepwise_head: StepwiseHead::Fixed,
        ..SyncPlan::new(StrategyKind::Stepwise, 2, 0)
    };
    let mut head = plan.worker_endpoint(0, keys(&[3]));
    head.begin_step(0);
    head.handle_gradient(0, &[1.0, 2.0, 3.0]);
    head.handle_backward_done();
    let mut out = Vec::new();
    assert!(head.poll_transmit(1, &mut out));
    let events: Vec<_> = std::iter::from_fn(|| head.poll_event()).collect();
    assert_eq!(
        events,
        vec![WorkerEvent::ParamsReady(0)],
        "no StepDone before the ack"
    );
    let mut ack = Header::data(crate::wire::FrameKind::Ack, 0, 0, 0, 0);
    ack.sender = 1;
    assert!(head.recv_slot(1, &ack).is_ok());
    head.handle_payload(1, &ack).expect("the ack of step 0");
    assert_eq!(head.poll_event(), Some(WorkerEvent::StepDone));
    assert!(
        head.handle_payload(1, &ack).is_err(),
        "a second ack is refused"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every synchronous strategy gives the same bits whatever order its frames arrive in:
    /// two interleavings of the same job end with identical values (parameter servers add
    /// the pushes in rank order, rings in ring order).
    #[test]
    fn synchronous_strategies_give_the_same_bits_in_any_interleaving(
        n in 3usize..6,
        servers in 1usize..3,
        sizes in prop::collection::vec(1usize..50, 1..5),
        slice in 1usize..20,
        scheduler in prop::sample::select(SchedulerKind::ALL.to_vec()),
        seeds in (any::<u64>(), any::<u64>()),
    ) {
        let init: Vec<Vec<f32>> = sizes.iter().map(|&len| (0..len).map(|i| i as f32 * 0.37).collect()).collect();
        let cfg = SgdConfig { momentum: 0.9, weight_decay: 1e-3 };
        let optim = ServerOptim { sgd: Sgd::new(cfg), lr: LR, schedule: LrSchedule::Constant };
        for kind in StrategyKind::ALL.into_iter().filter(|k| k.exact() || k.loss_tolerant()) {
            let plan = SyncPlan {
                scheduler: if kind.loss_tolerant() { kind.default_scheduler() } else { scheduler },
                slice_params: slice,
                frame_elems: 16,
                dlcp: exact_dlcp(kind, 3),
                ..SyncPlan::new(kind, n, if kind.uses_servers() { servers } else { 0 })
            };
            let run = |seed| {
                let mut ws: Vec<Box<dyn WorkerSync>> = (0..n)
                    .map(|r| -> Box<dyn WorkerSync> { plan.worker_endpoint(r, keys(&sizes)) })
                    .collect();
                let mut ss: Vec<Box<dyn ServerSync + Send>> = (n..plan.world_size())
                    .map(|r| plan.server_endpoint(r, keys(&sizes), init.clone(), optim).expect("a server"))
                    .collect();
                drive(&mut ws, &mut ss, &sizes, 3, seed)
            };
            prop_assert_eq!(run(seeds.0), run(seeds.1), "{:?}", kind);
        }
    }
}

/// A server knows the step it is at (its errors name it; they all said "step 0").
#[test]
fn a_server_knows_its_latest_step() {
    let plan = SyncPlan::new(StrategyKind::Ps, 2, 1);
    let sizes = [5, 7];
    let mut ws: Vec<Box<dyn WorkerSync>> = (0..2)
        .map(|r| -> Box<dyn WorkerSync> { plan.worker_endpoint(r, keys(&sizes)) })
        .collect();
    let init: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut ss = vec![plan
        .server_endpoint(2, keys(&sizes), init, ServerOptim::plain(0.1))
        .expect("a server")];
    assert_eq!(ss[0].latest_step(), 0);
    drive(&mut ws, &mut ss, &sizes, 4, 7);
    assert_eq!(ss[0].latest_step(), 3);
    let completed: Vec<u64> = std::iter::from_fn(|| ss[0].poll_step_complete()).collect();
    assert_eq!(completed, vec![0, 1, 2, 3], "each step once, in order");
}

/// A server restored from its state after 4 steps holds that state, and refuses pushes of
/// the steps its checkpoint already holds.
#[test]
fn a_restored_server_resumes_at_its_checkpoints_step() {
    let plan = SyncPlan::new(StrategyKind::Ps, 2, 1);
    let sizes = [5, 7];
    let init: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let mut server = plan
        .server_endpoint(2, keys(&sizes), init.clone(), ServerOptim::plain(0.1))
        .expect("a server");
    let params: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![1.5; n]).collect();
    let velocity: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.25; n]).collect();
    assert!(server
        .restore(vec![vec![1.0; 3]], velocity.clone(), 4)
        .is_err());
    server.restore(params.clone(), velocity.clone(), 4).unwrap();
    assert_eq!(server.state(), (&params[..], &velocity[..]));
    let old = Header::data(crate::wire::FrameKind::Push, 3, 0, 0, 5);
    let e = server.recv_slot(0, &old).unwrap_err().to_string();
    assert!(e.contains("step already completed"), "{e}");
    let now = Header::data(crate::wire::FrameKind::Push, 4, 0, 0, 5);
    assert!(server.recv_slot(0, &now).is_ok());
}

/// A reduce frame of a step not yet begun, delivered twice, is refused the second time
/// (it was kept twice and added twice at the step's start: silent corruption).
#[test]
fn a_replayed_early_ring_frame_is_refused() {
    let sizes = [6usize];
    let mut ahead = RingAllReduce::new(1, 2, keys(&sizes), 100, 2, true, SchedulerKind::Fifo);
    let mut behind = RingAllReduce::new(0, 2, keys(&sizes), 100, 2, true, SchedulerKind::Fifo);
    ahead.begin_step(0);
    ahead.handle_gradient(0, &grad(0, 1, 0, 6));
    let mut frame = Vec::new();
    assert!(ahead.poll_transmit(0, &mut frame));
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&frame[..HEADER_LEN]);
    let h = Header::decode(&hb, DEFAULT_MAX_PAYLOAD).expect("a header");
    let deliver = |w: &mut RingAllReduce| -> Result<(), ProtocolError> {
        let slot = w.recv_slot(1, &h)?;
        crate::wire::f32_bytes_mut(slot).copy_from_slice(&frame[HEADER_LEN..]);
        w.handle_payload(1, &h)
    };
    deliver(&mut behind).expect("the first copy is kept for the step");
    let err = deliver(&mut behind).expect_err("the replay is refused");
    assert!(err.to_string().contains("twice"), "{err}");
}

/// Every frame a worker hands out, as `(from, to, header)`, in order.
type SentLog = std::rc::Rc<std::cell::RefCell<Vec<(Rank, Rank, Header)>>>;

/// A worker endpoint that notes the header and link of every frame it hands out.
struct Recorder {
    rank: Rank,
    inner: Box<dyn WorkerSync>,
    sent: SentLog,
}

impl Recorder {
    fn note(&self, to: Rank, frame: &[u8]) {
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&frame[..HEADER_LEN]);
        let h = Header::decode(&hb, DEFAULT_MAX_PAYLOAD).expect("a header");
        self.sent.borrow_mut().push((self.rank, to, h));
    }
}

impl Endpoint for Recorder {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        let sent = self.inner.poll_transmit(link, out);
        if sent {
            self.note(link, &out[start..]);
        }
        sent
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        let start = out.len();
        let to = self.inner.poll_transmit_any(links, out)?;
        self.note(to, &out[start..]);
        Some(to)
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        let start = out.len();
        let t = self.inner.poll_transmit_lent(links, out)?;
        let (Transmit::Copied(to) | Transmit::Lent(to, _)) = t;
        self.note(to, &out[start..]);
        Some(t)
    }

    fn lent_payload(&self, h: &Header) -> &[f32] {
        self.inner.lent_payload(h)
    }

    fn handle_sent(&mut self, link: Rank, h: &Header) {
        self.inner.handle_sent(link, h);
    }

    fn recv_slot(&mut self, link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        self.inner.recv_slot(link, h)
    }

    fn handle_payload(&mut self, link: Rank, h: &Header) -> Result<(), ProtocolError> {
        self.inner.handle_payload(link, h)
    }
}

impl WorkerSync for Recorder {
    fn start_at(&mut self, step: u64) {
        self.inner.start_at(step);
    }
    fn begin_step(&mut self, step: u64) {
        self.inner.begin_step(step);
    }
    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        self.inner.handle_gradient(key, grad);
    }
    fn handle_backward_done(&mut self) {
        self.inner.handle_backward_done();
    }
    fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.inner.poll_event()
    }
    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.inner.take_values(key)
    }
}

/// The mean gradient of `key` as the small-bucket exchange computes it: the workers' copies
/// added in rank order, then scaled by 1/n (bit for bit).
fn rank_order_mean(step: u64, n: usize, key: usize, len: usize) -> Vec<f32> {
    let mut acc = grad(step, 0, key, len);
    for w in 1..n {
        crate::aggregate::add_assign(&mut acc, &grad(step, w, key, len));
    }
    crate::aggregate::scale(&mut acc, 1.0 / n as f32);
    acc
}

/// The mean gradient of `key` as 4 workers' pairwise exchange computes it:
/// `((g0 + g1) + (g2 + g3)) / 4`, bit for bit.
fn pairwise_mean(step: u64, key: usize, len: usize) -> Vec<f32> {
    let pair = |a: usize| {
        let mut acc = grad(step, a, key, len);
        crate::aggregate::add_assign(&mut acc, &grad(step, a + 1, key, len));
        acc
    };
    let mut acc = pair(0);
    crate::aggregate::add_assign(&mut acc, &pair(2));
    crate::aggregate::scale(&mut acc, 0.25);
    acc
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// With 3 or 4 workers and [`SyncPlan::mesh`] the all-reduce strategies link every worker
    /// to every other, and a
    /// small bucket's copy goes from each worker straight to each other one: per worker,
    /// step and bucket exactly n-1 frames, to n-1 distinct peers, all ring step 0 (none
    /// forwarded). On a ring (the endpoint built without the mesh, as for more workers than
    /// [`MESH_MAX_WORKERS`]) the n-1 copies go to the right neighbour only, one per ring
    /// step, and every worker ends each step with the same bits: the copies added in rank
    /// order, then scaled; but 4 workers on a ring exchange 2 copies each, round 0 with rank
    /// `r ^ 1` and round 1 with rank `r ^ 3` (both ring neighbours), and end with
    /// `((g0 + g1) + (g2 + g3)) / 4`.
    #[test]
    fn small_buckets_cross_a_mesh_in_one_hop(
        n in 3usize..5,
        mesh: bool,
        overlap: bool,
        sizes in prop::collection::vec(1usize..20, 1..5),
        bucket in 1usize..40,
        scheduler in prop::sample::select(SchedulerKind::ALL.to_vec()),
        seed: u64,
    ) {
        let kind = if overlap { StrategyKind::Allreduce } else { StrategyKind::AllreduceNoOverlap };
        let plan = SyncPlan {
            scheduler,
            bucket_bytes: 4 * bucket,
            direct_share_elems: 1000,
            mesh: true,
            ..SyncPlan::new(kind, n, 0)
        };
        prop_assert!(plan.validate().is_ok());
        prop_assert!(plan.meshed());
        prop_assert!(plan.sync_descriptor().ends_with("/mesh"));
        let log = SentLog::default();
        for r in 0..n {
            prop_assert_eq!(plan.peers(r), (0..n).filter(|&p| p != r).collect::<Vec<_>>());
        }
        let mut ws: Vec<Box<dyn WorkerSync>> = (0..n)
            .map(|r| -> Box<dyn WorkerSync> {
                let inner: Box<dyn WorkerSync> = if mesh {
                    plan.worker_endpoint(r, keys(&sizes))
                } else {
                    Box::new(
                        RingAllReduce::new(r, n, keys(&sizes), bucket, FRAME_ELEMS, overlap, scheduler)
                            .with_direct_below(1000),
                    )
                };
                Box::new(Recorder { rank: r, inner, sent: log.clone() })
            })
            .collect();
        let steps = 3;
        let results = drive(&mut ws, &mut [], &sizes, steps, seed);
        for (step, per_worker) in results.iter().enumerate() {
            for (key, &len) in sizes.iter().enumerate() {
                let want = if n == 4 && !mesh {
                    pairwise_mean(step as u64, key, len)
                } else {
                    rank_order_mean(step as u64, n, key, len)
                };
                for (w, got) in per_worker.iter().enumerate() {
                    prop_assert_eq!(&got[key], &want, "step {} worker {} key {}", step, w, key);
                }
            }
        }
        // Every bucket is small (n copies of at most 40 values fit 1000): group its frames.
        let mut frames = std::collections::BTreeMap::<(Rank, u64, u32), Vec<(Rank, Header)>>::new();
        for &(from, to, h) in log.borrow().iter() {
            frames.entry((from, h.step, h.key)).or_default().push((to, h));
        }
        let buckets = frames.keys().map(|k| k.2).collect::<std::collections::BTreeSet<_>>().len();
        prop_assert_eq!(frames.len(), n * steps as usize * buckets);
        for ((from, step, b), sent) in &frames {
            let copies = if n == 4 && !mesh { 2 } else { n - 1 };
            prop_assert_eq!(sent.len(), copies, "worker {} step {} bucket {}", from, step, b);
            let mut tos: Vec<Rank> = sent.iter().map(|s| s.0).collect();
            tos.sort_unstable();
            tos.dedup();
            let mut ring_steps: Vec<u64> = sent.iter().map(|s| s.1.sequence).collect();
            ring_steps.sort_unstable();
            prop_assert!(sent.iter().all(|(_, h)| h.kind == crate::wire::FrameKind::Gather));
            if mesh {
                prop_assert_eq!(tos, (0..n).filter(|r| r != from).collect::<Vec<_>>());
                prop_assert!(ring_steps.iter().all(|&s| s == 0), "forwarded: {:?}", ring_steps);
            } else if n == 4 {
                let mut partners: Vec<(u64, Rank)> = sent.iter().map(|(to, h)| (h.sequence, *to)).collect();
                partners.sort_unstable();
                prop_assert_eq!(partners, vec![(0, from ^ 1), (1, from ^ 3)]);
            } else {
                prop_assert_eq!(tos, vec![(from + 1) % n]);
                prop_assert_eq!(ring_steps, (0..n as u64 - 1).collect::<Vec<_>>());
            }
        }
    }
}

/// In 4 workers' pairwise exchange a small bucket's copy is accepted once per round, from
/// that round's partner only (rank 1 takes round 0 from rank 0 and round 1 from rank 2);
/// a third round, the other partner, the far rank or a second copy is a protocol error.
#[test]
fn a_pairwise_exchange_refuses_misplaced_copies() {
    use crate::wire::FrameKind;
    let mut w = RingAllReduce::new(1, 4, keys(&[10]), 10, 1000, true, SchedulerKind::Fifo)
        .with_direct_below(100);
    w.begin_step(0);
    let round = |s: u64| {
        let mut h = Header::data(FrameKind::Gather, 0, 0, 0, 10);
        h.sequence = s;
        h
    };
    let refused = |w: &mut RingAllReduce, link: Rank, h: &Header, why: &str| {
        let e = w.recv_slot(link, h).expect_err("refused").to_string();
        assert!(
            e.contains(why) && e.contains(&format!("rank {link}")),
            "{e}"
        );
    };
    refused(&mut w, 2, &round(0), "partner");
    refused(&mut w, 3, &round(0), "partner");
    refused(&mut w, 0, &round(1), "partner");
    refused(&mut w, 0, &round(2), "two rounds");
    for (link, s) in [(0, 0), (2, 1)] {
        w.recv_slot(link, &round(s)).expect("accepted").fill(1.0);
        w.handle_payload(link, &round(s)).expect("accepted");
        refused(&mut w, link, &round(s), "twice");
    }
}

/// Over a mesh, a small bucket's copy is accepted once, from any other worker's own link,
/// as ring step 0 of this step or the next; anything else (from this worker's own rank or
/// a rank outside the job, claiming to be forwarded, of another kind, size or step, a
/// second time), and a large bucket's frame from anyone but the left neighbour, is a
/// protocol error, never a panic.
#[test]
fn a_mesh_refuses_misplaced_copies() {
    use crate::wire::FrameKind;
    // Bucket 0 holds key 1 (500 values: reduced around the ring), bucket 1 key 0 (10
    // values: 4 copies of 10 fit 100, shared whole).
    let mut w = RingAllReduce::new(0, 4, keys(&[10, 500]), 10, 1000, true, SchedulerKind::Fifo)
        .with_direct_below(100)
        .over_mesh();
    w.begin_step(0);
    let copy = Header::data(FrameKind::Gather, 0, 1, 0, 10);
    let refused = |w: &mut RingAllReduce, link: Rank, h: &Header, why: &str| {
        let e = w.recv_slot(link, h).expect_err("refused").to_string();
        assert!(
            e.contains(why) && e.contains(&format!("rank {link}")),
            "{e}"
        );
        let e = w.handle_payload(link, h).expect_err("refused").to_string();
        assert!(e.contains(why), "{e}");
    };
    refused(&mut w, 0, &copy, "another worker");
    refused(&mut w, 4, &copy, "another worker");
    refused(&mut w, usize::MAX, &copy, "another worker");
    let mut forwarded = copy;
    forwarded.sequence = 1;
    refused(&mut w, 3, &forwarded, "never forwarded");
    forwarded.sequence = u64::MAX;
    refused(&mut w, 3, &forwarded, "beyond the ring");
    let mut reduce = copy;
    reduce.kind = FrameKind::Reduce;
    refused(&mut w, 2, &reduce, "whole");
    let mut short = copy;
    short.length = 9;
    refused(&mut w, 2, &short, "whole");
    let mut later = copy;
    later.step = 2;
    refused(&mut w, 2, &later, "wrong step");
    // A large bucket's segment still comes only from the left neighbour (rank 3).
    let segment = Header::data(FrameKind::Reduce, 0, 0, 375, 125);
    refused(&mut w, 2, &segment, "left");
    assert!(w.recv_slot(3, &segment).is_ok());
    // The copy from rank 2, and one of the next step from rank 1, are accepted once each.
    for (link, step) in [(2, 0), (1, 1)] {
        let mut h = copy;
        h.step = step;
        w.recv_slot(link, &h).expect("accepted").fill(1.0);
        w.handle_payload(link, &h).expect("accepted");
        refused(&mut w, link, &h, "twice");
    }
}

/// Ring all-reduce with its values on the wire as bfloat16 or half: every worker ends with
/// the same bits, each a value of that float, and the mean within the roundings of its hops.
#[test]
fn half_wire_rings_agree_bit_for_bit_within_the_roundings_of_the_mean() {
    use crate::wire::WireFloat;
    let sizes = [5, 301, 40];
    for n in [2, 3, 4] {
        for (float, tolerance) in [(WireFloat::Bf16, 0.05), (WireFloat::F16, 0.005)] {
            let mut workers: Vec<Box<dyn WorkerSync>> = (0..n)
                .map(|r| {
                    let ring =
                        RingAllReduce::new(r, n, keys(&sizes), 128, 32, true, SchedulerKind::Fifo);
                    Box::new(HalfWire::new(Box::new(ring), float)) as Box<dyn WorkerSync>
                })
                .collect();
            let results = drive(&mut workers, &mut [], &sizes, 3, 11 + n as u64);
            for (step, per_worker) in results.iter().enumerate() {
                for (key, &len) in sizes.iter().enumerate() {
                    let first = &per_worker[0][key];
                    for other in &per_worker[1..] {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(first), bits(&other[key]), "{float:?} n {n} key {key}");
                    }
                    let mean = mean_grad(step as u64, n, key, len);
                    for (got, want) in first.iter().zip(&mean) {
                        assert_eq!(float.round(*got), *got, "not a {float:?}");
                        assert!(
                            (got - want).abs() <= tolerance,
                            "{float:?}: {got} for {want}"
                        );
                    }
                }
            }
        }
    }
}

/// A collective whose frames travel as halves refuses a frame of f32 values (a peer that
/// disagrees), naming the floats.
#[test]
fn a_half_wire_ring_refuses_a_frame_of_another_float() {
    use crate::wire::{FrameKind, WireFloat};
    let ring = RingAllReduce::new(0, 2, keys(&[10]), 100, 4, true, SchedulerKind::Fifo);
    let mut worker = HalfWire::new(Box::new(ring), WireFloat::Bf16);
    // Rank 1's first reduce segment: chunk 1 of [0..5, 5..10], in frames of 4 values.
    let h = Header::data(FrameKind::Reduce, 0, 0, 5, 4);
    let err = worker.recv_slot(1, &h).expect_err("an f32 frame");
    assert!(err.to_string().contains("F32"), "{err}");
    let slot = worker
        .recv_slot(1, &h.with_float(WireFloat::Bf16))
        .expect("a bf16 frame");
    assert_eq!(slot.len(), 2, "4 values packed in 2 words");
}

/// A half-wire worker's step is done only once every frame of it it lent has been written
/// (a driver may drop a finished collective's endpoint and its buffers).
#[test]
fn a_half_wire_step_is_done_only_once_its_lent_frames_are_written() {
    use crate::wire::WireFloat;
    let mut workers: Vec<HalfWire> = (0..2)
        .map(|r| {
            let ring = RingAllReduce::new(r, 2, keys(&[9]), 100, 4, true, SchedulerKind::Fifo);
            HalfWire::new(Box::new(ring), WireFloat::Bf16)
        })
        .collect();
    let mut unwritten: Vec<Vec<Header>> = vec![Vec::new(), Vec::new()];
    let mut done = [false; 2];
    for w in &mut workers {
        w.begin_step(0);
        w.handle_gradient(0, &[1.0; 9]);
        w.handle_backward_done();
    }
    for round in 0..100 {
        for w in 0..2 {
            let mut out = Vec::new();
            if let Some(Transmit::Lent(to, h)) = workers[w].poll_transmit_lent(&[1 - w], &mut out) {
                let payload = workers[w].lent_payload(&h).to_vec();
                let slot = workers[to].recv_slot(w, &h).expect("slot");
                slot.copy_from_slice(&payload);
                workers[to].handle_payload(w, &h).expect("payload");
                unwritten[w].push(h);
            }
            // Written late: every other round.
            if round % 2 == 1 {
                for h in std::mem::take(&mut unwritten[w]) {
                    workers[w].handle_sent(1 - w, &h);
                }
            }
            while let Some(event) = workers[w].poll_event() {
                if event == WorkerEvent::StepDone {
                    assert!(unwritten[w].is_empty(), "step done with a frame still lent");
                    done[w] = true;
                }
            }
        }
    }
    assert_eq!(done, [true, true]);
}
