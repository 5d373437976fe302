//! Tests of gossip: clusters of workers driven in-process, frames delivered in seeded
//! adversarial orders (any frame in flight, not per link in order), checked against the
//! dense ring mixing matrix written out by hand; the mixing's properties; and the frames a
//! worker must refuse.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::wire::{DEFAULT_MAX_PAYLOAD, HEADER_LEN};

/// A frame between two workers.
struct Flight {
    from: Rank,
    to: Rank,
    header: Header,
    /// The payload as handed out (a lent one's as it was when lent).
    payload: Vec<f32>,
    /// Whether the frame is on the wire (a lent frame is not until its sender is told).
    written: bool,
}

/// Workers of one gossip ring and the frames between them.
struct Cluster {
    workers: Vec<Gossip>,
    /// `weights[step][worker][key]`: what each worker hands over.
    weights: Vec<Vec<Vec<Vec<f32>>>>,
    /// `results[step][worker][key]`: what each worker adopted.
    results: Vec<Vec<Vec<Vec<f32>>>>,
    first: u64,
    /// Per worker: the step it is in (the end when finished) and whether it has begun it.
    step: Vec<u64>,
    begun: Vec<bool>,
    /// Per worker: keys still to hand over this step, last layer first.
    to_hand: Vec<Vec<usize>>,
    flights: Vec<Flight>,
    /// Frames delivered to a worker before it had begun their step.
    early_frames: usize,
}

impl Cluster {
    /// `n` workers resuming at step `first` for `steps` steps of keys of `sizes`, weights
    /// drawn from `seed`.
    fn new(n: usize, sizes: &[usize], frame: usize, first: u64, steps: u64, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let weights = (0..steps)
            .map(|_| {
                (0..n)
                    .map(|_| {
                        let draw = |&len: &usize| -> Vec<f32> {
                            (0..len).map(|_| rng.gen_range(-4.0f32..4.0)).collect()
                        };
                        sizes.iter().map(draw).collect()
                    })
                    .collect()
            })
            .collect();
        let keys = KeyInfo::one_per_layer(sizes);
        let schedulers = SchedulerKind::ALL;
        let workers = (0..n)
            .map(|r| {
                let mut w = Gossip::new(r, n, keys.clone(), frame, schedulers[r % 3]);
                w.start_at(first);
                w
            })
            .collect();
        Self {
            workers,
            weights,
            results: vec![vec![vec![Vec::new(); sizes.len()]; n]; steps as usize],
            first,
            step: vec![first; n],
            begun: vec![false; n],
            to_hand: vec![Vec::new(); n],
            flights: Vec::new(),
            early_frames: 0,
        }
    }

    fn end(&self) -> u64 {
        self.first + self.weights.len() as u64
    }

    fn finished(&self) -> bool {
        self.step.iter().all(|&s| s == self.end())
    }

    fn begin(&mut self, w: usize) {
        if self.begun[w] || self.step[w] == self.end() {
            return;
        }
        self.begun[w] = true;
        self.to_hand[w] = (0..self.results[0][w].len()).rev().collect();
        self.workers[w].begin_step(self.step[w]);
        self.drain(w);
    }

    /// Hands over the next key of worker `w`; returns whether there was one.
    fn hand(&mut self, w: usize) -> bool {
        if !self.begun[w] || self.to_hand[w].is_empty() {
            return false;
        }
        let key = self.to_hand[w].remove(0);
        let values = &self.weights[(self.step[w] - self.first) as usize][w][key];
        self.workers[w].handle_gradient(key, values);
        if self.to_hand[w].is_empty() {
            self.workers[w].handle_backward_done();
        }
        self.drain(w);
        true
    }

    /// Asks worker `w` for one frame, one way or another; returns whether it gave one.
    fn transmit(&mut self, w: usize, how: u8) -> bool {
        let mut links = gossip_peers(w, self.workers.len());
        let Some(&link) = links.get(usize::from(how / 3) % links.len().max(1)) else {
            return false;
        };
        links.reverse();
        let mut out = Vec::new();
        let ep = &mut self.workers[w];
        let sent = match how % 3 {
            0 => ep
                .poll_transmit(link, &mut out)
                .then_some(Transmit::Copied(link)),
            1 => ep.poll_transmit_any(&links, &mut out).map(Transmit::Copied),
            _ => ep.poll_transmit_lent(&links, &mut out),
        };
        let (to, header, payload, written) = match sent {
            None => return false,
            Some(Transmit::Copied(to)) => {
                let payload = out[HEADER_LEN..]
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                (to, decode(&out), payload, true)
            }
            Some(Transmit::Lent(to, header)) => {
                assert_eq!(out, header.encode(), "a lent frame's header");
                (to, header, ep.lent_payload(&header).to_vec(), false)
            }
        };
        let from = w;
        let flight = Flight {
            from,
            to,
            header,
            payload,
            written,
        };
        assert_eq!(flight.header.kind, FrameKind::Mix);
        assert_eq!(flight.header.step, self.step[w]);
        assert_eq!(flight.payload.len(), flight.header.length as usize);
        self.flights.push(flight);
        self.drain(w);
        true
    }

    /// Writes lent frame `i` (its payload must not have changed since it was lent).
    fn write(&mut self, i: usize) {
        let f = &mut self.flights[i];
        if f.written {
            return;
        }
        let sender = &mut self.workers[f.from];
        assert_eq!(
            sender.lent_payload(&f.header),
            &f.payload[..],
            "lent payload changed"
        );
        f.written = true;
        sender.handle_sent(f.to, &f.header);
        let from = f.from;
        self.drain(from);
    }

    /// Delivers written frame `i`, reading its payload in two parts.
    fn deliver(&mut self, i: usize) {
        if !self.flights[i].written {
            return;
        }
        let f = self.flights.swap_remove(i);
        let to = f.to;
        if self.step[to] < f.header.step || (self.step[to] == f.header.step && !self.begun[to]) {
            self.early_frames += 1;
        }
        let worker = &mut self.workers[to];
        let half = f.payload.len() / 2;
        let slot = worker.recv_slot(f.from, &f.header).expect("frame accepted");
        slot[..half].copy_from_slice(&f.payload[..half]);
        let slot = worker
            .recv_slot(f.from, &f.header)
            .expect("frame accepted again");
        slot[half..].copy_from_slice(&f.payload[half..]);
        worker
            .handle_payload(f.from, &f.header)
            .expect("payload accepted");
        self.drain(to);
    }

    /// Takes worker `w`'s events: adopted values, and the end of its step.
    fn drain(&mut self, w: usize) {
        while let Some(ev) = self.workers[w].poll_event() {
            let s = (self.step[w] - self.first) as usize;
            match ev {
                WorkerEvent::ParamsReady(k) => {
                    assert!(self.results[s][w][k].is_empty(), "key {k} ready twice");
                    self.results[s][w][k] = self.workers[w].take_values(k);
                }
                WorkerEvent::GradReady(_) => panic!("gossip averages weights"),
                WorkerEvent::StepDone => {
                    assert!(self.begun[w], "step done before it began");
                    assert!(self.to_hand[w].is_empty(), "step done before every key");
                    assert!(self.results[s][w].iter().all(|v| !v.is_empty()));
                    let lent = self.flights.iter().any(|f| f.from == w && !f.written);
                    assert!(!lent, "step done with a lent frame unwritten");
                    self.step[w] += 1;
                    self.begun[w] = false;
                }
            }
        }
    }

    /// Runs to the end in an order drawn from `seed`; worker `slow`, if any, acts ten
    /// times less often than the others.
    fn run(&mut self, seed: u64, slow: Option<usize>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = self.workers.len();
        let mut guard = 0;
        while !self.finished() {
            guard += 1;
            assert!(guard < 1_000_000, "no progress");
            let w = rng.gen_range(0..n);
            let waits = Some(w) == slow && rng.gen_bool(0.9);
            match rng.gen_range(0..6) {
                0 | 1 if !self.flights.is_empty() => {
                    self.deliver(rng.gen_range(0..self.flights.len()));
                }
                2 if !self.flights.is_empty() => self.write(rng.gen_range(0..self.flights.len())),
                _ if waits => {}
                3 => self.begin(w),
                4 => {
                    self.hand(w);
                }
                _ => {
                    self.transmit(w, rng.gen());
                }
            }
        }
        assert!(self.flights.is_empty(), "frames left over");
    }

    /// Checks every worker's adopted values against the hand-written mixing matrix.
    fn check(&self) {
        let n = self.workers.len();
        let m = hand_matrix(n);
        for (s, per_worker) in self.results.iter().enumerate() {
            for (w, keys) in per_worker.iter().enumerate() {
                for (k, got) in keys.iter().enumerate() {
                    let len = self.weights[s][w][k].len();
                    assert_eq!(got.len(), len, "step {s} worker {w} key {k}");
                    for (i, &g) in got.iter().enumerate() {
                        let want: f64 = (0..n)
                            .map(|j| m[w][j] * f64::from(self.weights[s][j][k][i]))
                            .sum();
                        let tol = 1e-6 * want.abs().max(1e-6);
                        assert!(
                            (f64::from(g) - want).abs() <= tol,
                            "step {s} worker {w} key {k} [{i}]: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

fn decode(frame: &[u8]) -> Header {
    let mut hb = [0u8; HEADER_LEN];
    hb.copy_from_slice(&frame[..HEADER_LEN]);
    Header::decode(&hb, DEFAULT_MAX_PAYLOAD).expect("valid header")
}

/// The ring's mixing matrix written out: a third to oneself and each neighbour, a half
/// each with two workers, all to oneself alone.
fn hand_matrix(n: usize) -> Vec<Vec<f64>> {
    let mut m = vec![vec![0.0; n]; n];
    for (i, row) in m.iter_mut().enumerate() {
        match n {
            1 => row[0] = 1.0,
            2 => row.fill(0.5),
            _ => {
                row[i] = 1.0 / 3.0;
                row[(i + 1) % n] = 1.0 / 3.0;
                row[(i + n - 1) % n] = 1.0 / 3.0;
            }
        }
    }
    m
}

const SIZES: [usize; 4] = [7, 1, 12, 5];

#[test]
fn every_worker_adopts_the_mixing_matrix_times_the_weights_in_any_order() {
    for n in [1, 2, 3, 4, 7] {
        for seed in 0..4 {
            let mut cluster = Cluster::new(n, &SIZES, 3, 0, 3, seed);
            cluster.run(seed * 31 + n as u64, None);
            cluster.check();
        }
    }
}

#[test]
fn a_lagging_worker_receives_its_neighbours_next_step_early() {
    for n in [2, 3, 4, 7] {
        let mut cluster = Cluster::new(n, &SIZES, 4, 0, 4, 5);
        cluster.run(n as u64, Some(1));
        cluster.check();
        assert!(cluster.early_frames > 0, "{n} workers: nothing ran ahead");
    }
}

#[test]
fn a_resumed_job_mixes_from_its_first_step_on() {
    let mut cluster = Cluster::new(4, &SIZES, 2, 1001, 3, 9);
    cluster.run(17, Some(2));
    cluster.check();
}

#[test]
fn the_same_weights_give_the_same_bits_in_every_order() {
    let mut first = Cluster::new(7, &SIZES, 3, 0, 2, 3);
    first.run(1, None);
    for seed in 2..5 {
        let mut other = Cluster::new(7, &SIZES, 3, 0, 2, 3);
        other.run(seed, Some(seed as usize % 7));
        assert_eq!(other.results, first.results, "delivery order {seed}");
    }
}

#[test]
fn a_worker_a_step_ahead_does_not_mix_its_next_step_into_this_one() {
    let mut c = Cluster::new(3, &SIZES, 4, 0, 2, 11);
    for w in 0..3 {
        c.begin(w);
        while c.hand(w) {}
        while c.transmit(w, 1) {}
    }
    // Worker 0 gets its step-0 frames, finishes, and sends step 1 straight away.
    while let Some(i) = c.flights.iter().position(|f| f.to == 0) {
        c.deliver(i);
    }
    assert_eq!(c.step, vec![1, 0, 0]);
    c.begin(0);
    while c.hand(0) {}
    while c.transmit(0, 2) {}
    // Its step-1 frames reach the others before their own step-0 frames do.
    for i in 0..c.flights.len() {
        c.write(i);
    }
    while let Some(i) = c.flights.iter().position(|f| f.header.step == 1) {
        c.deliver(i);
    }
    assert!(c.early_frames > 0);
    assert_eq!(
        c.step,
        vec![1, 0, 0],
        "a step ended on the next step's frames"
    );
    c.run(4, None);
    c.check();
}

#[test]
fn the_step_ends_only_once_every_lent_frame_is_written() {
    let mut c = Cluster::new(2, &[6], 2, 0, 1, 1);
    for w in 0..2 {
        c.begin(w);
        c.hand(w);
    }
    while c.transmit(0, 2) {}
    while c.transmit(1, 0) {}
    while let Some(i) = c.flights.iter().position(|f| f.to == 0) {
        c.deliver(i);
    }
    assert!(!c.results[0][0][0].is_empty(), "the key is mixed");
    assert_eq!(c.step[0], 0, "done while its frames are still lent");
    for i in 0..c.flights.len() {
        c.write(i);
    }
    assert_eq!(c.step[0], 1);
}

#[test]
fn gossip_matrix_is_the_hand_written_one() {
    for n in 1..=16 {
        assert_eq!(gossip_matrix(n), hand_matrix(n), "{n} workers");
    }
}

/// A gossip worker of 4 (rank 0: left 3, right 1), keys of 10 and 5 values in frames of 4.
fn worker_of_four() -> Gossip {
    let mut g = Gossip::new(
        0,
        4,
        KeyInfo::one_per_layer(&[10, 5]),
        4,
        SchedulerKind::Fifo,
    );
    g.begin_step(0);
    g
}

fn mix(step: u64, key: u32, offset: u32, length: u32) -> Header {
    Header::data(FrameKind::Mix, step, key, offset, length)
}

/// Asserts that `g` refuses `h` from `link`, naming the sender and saying `why`.
fn refused(g: &mut Gossip, link: Rank, h: Header, why: &str) {
    let e = g
        .recv_slot(link, &h)
        .expect_err("frame refused")
        .to_string();
    assert!(
        e.contains(&format!("rank {link}")) && e.contains(why),
        "{e}"
    );
    assert!(
        g.handle_payload(link, &h).is_err(),
        "payload of {h:?} accepted"
    );
}

/// Receives `h` from `link` whole.
fn accept(g: &mut Gossip, link: Rank, h: Header) {
    let slot = g.recv_slot(link, &h).expect("frame accepted");
    assert_eq!(slot.len(), h.length as usize);
    g.handle_payload(link, &h).expect("payload accepted");
}

#[test]
fn frames_from_others_than_the_neighbours_are_refused() {
    let mut g = worker_of_four();
    refused(&mut g, 2, mix(0, 0, 0, 4), "neighbours");
    refused(&mut g, 9, mix(0, 0, 0, 4), "neighbours");
    refused(&mut g, 0, mix(0, 0, 0, 4), "neighbours");
    let mut reduce = mix(0, 0, 0, 4);
    reduce.kind = FrameKind::Reduce;
    refused(&mut g, 1, reduce, "Mix frames only");
    let mut alone = Gossip::new(0, 1, KeyInfo::one_per_layer(&[4]), 4, SchedulerKind::Fifo);
    alone.begin_step(0);
    refused(&mut alone, 0, mix(0, 0, 0, 4), "neighbours");
    refused(&mut alone, 1, mix(0, 0, 0, 4), "neighbours");
}

#[test]
fn frames_of_steps_other_than_this_one_and_the_next_are_refused() {
    let mut g = worker_of_four();
    refused(&mut g, 1, mix(2, 0, 0, 4), "wrong step");
    refused(&mut g, 3, mix(u64::MAX, 0, 0, 4), "wrong step");
    accept(&mut g, 1, mix(1, 0, 0, 4));
    accept(&mut g, 1, mix(0, 0, 0, 4));
    let mut resumed = Gossip::new(2, 4, KeyInfo::one_per_layer(&[4]), 4, SchedulerKind::Fifo);
    resumed.start_at(7);
    refused(&mut resumed, 1, mix(6, 0, 0, 4), "wrong step");
    refused(&mut resumed, 1, mix(8, 0, 0, 4), "wrong step");
    accept(&mut resumed, 3, mix(7, 0, 0, 4));
}

#[test]
fn a_frame_twice_is_refused() {
    let mut g = worker_of_four();
    accept(&mut g, 1, mix(0, 0, 4, 4));
    refused(&mut g, 1, mix(0, 0, 4, 4), "twice");
    accept(&mut g, 3, mix(0, 0, 4, 4));
    accept(&mut g, 3, mix(1, 0, 4, 4));
    refused(&mut g, 3, mix(1, 0, 4, 4), "twice");
}

#[test]
fn frames_off_the_keys_cut_are_refused() {
    let mut g = worker_of_four();
    for (key, offset, length) in [
        (2, 0, 4),
        (u32::MAX, 0, 4),
        (0, 2, 4),
        (0, 12, 4),
        (0, 8, 4),
        (0, 0, 3),
        (1, 4, 4),
        (0, u32::MAX, u32::MAX),
        (1, 4, 0),
    ] {
        refused(&mut g, 1, mix(0, key, offset, length), "cut");
    }
    accept(&mut g, 1, mix(0, 0, 8, 2));
    accept(&mut g, 1, mix(0, 1, 4, 1));
}

proptest! {
    /// Any header from any link is answered without a panic, and an accepted one gets a
    /// slot of exactly its length.
    #[test]
    fn any_header_is_answered_without_a_panic(
        link in 0usize..6,
        kind in prop::sample::select(vec![FrameKind::Mix, FrameKind::Gather, FrameKind::Ack]),
        step in prop::sample::select(vec![0u64, 1, 2, u64::MAX]),
        key in prop::sample::select(vec![0u32, 1, 2, u32::MAX]),
        offset in prop::sample::select(vec![0u32, 3, 4, 8, 9, u32::MAX]),
        length in prop::sample::select(vec![0u32, 1, 2, 4, u32::MAX]),
    ) {
        let mut g = worker_of_four();
        let mut h = mix(step, key, offset, length);
        h.kind = kind;
        if let Ok(slot) = g.recv_slot(link, &h) {
            prop_assert_eq!(slot.len(), length as usize);
            prop_assert!(g.handle_payload(link, &h).is_ok());
        } else {
            prop_assert!(g.handle_payload(link, &h).is_err());
        }
    }

    /// The mix keeps the workers' average of every value, whatever the values and the
    /// ring's size.
    #[test]
    fn mixing_keeps_the_average_of_the_weights(
        n in 1usize..=16,
        values in prop::collection::vec(prop::collection::vec(-1e3f32..1e3, 6), 16),
    ) {
        let weights = gossip_weights(n);
        let values = &values[..n];
        let mixed: Vec<Vec<f32>> = (0..n)
            .map(|w| {
                let peers: Vec<&[f32]> =
                    gossip_peers(w, n).iter().map(|&p| values[p].as_slice()).collect();
                let mut out = vec![0.0; 6];
                mix_into(&mut out, &values[w], &peers, weights);
                out
            })
            .collect();
        for i in 0..6 {
            let mean = |vs: &[Vec<f32>]| vs.iter().map(|v| f64::from(v[i])).sum::<f64>() / n as f64;
            let magnitude = values.iter().map(|v| f64::from(v[i].abs())).fold(1e-3, f64::max);
            let (before, after) = (mean(values), mean(&mixed));
            prop_assert!((after - before).abs() <= 1e-5 * magnitude, "{} vs {}", after, before);
        }
    }

    /// Every row and column of the mixing matrix sums to one, and no weight is negative.
    #[test]
    fn the_mixing_matrix_is_doubly_stochastic(n in 1usize..=16) {
        let m = gossip_matrix(n);
        prop_assert_eq!(m.len(), n);
        for i in 0..n {
            prop_assert_eq!(m[i].len(), n);
            let row: f64 = m[i].iter().sum();
            let column: f64 = m.iter().map(|r| r[i]).sum();
            prop_assert!((row - 1.0).abs() < 1e-12 && (column - 1.0).abs() < 1e-12);
            prop_assert!(m[i].iter().all(|&x| x >= 0.0));
        }
    }
}
