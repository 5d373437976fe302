//! The controller on a modelled bottleneck: flows paced by their own controllers share one
//! link of `C` bit/s behind a tail-drop FIFO of `Q` bytes; each receiver answers as the
//! runtime's does (every 1 ms or 16 datagrams, whichever first, only with news), with the
//! queueing delay in the RTT and the drops in its counts. Deterministic: time moves in
//! steps of [`STEP_NS`], random loss comes from a seeded stream.

use std::collections::VecDeque;

use super::*;
use crate::net::SplitMix64;

/// Whole IP packet bytes of one datagram.
const DATAGRAM: u64 = 1_400;
/// The model's time step (ns): sends keep their exact paced times inside a step;
/// arrivals, feedbacks and timeouts are handled at the step's end.
const STEP_NS: Nanos = 20_000;
/// The receiver answers after this long with news...
const FEEDBACK_EVERY_NS: Nanos = 1_000_000;
/// ... or after this many datagrams, whichever comes first.
const FEEDBACK_DATAGRAMS: u64 = 16;
/// The measurement window at the end of a run.
const LAST_SECOND_NS: Nanos = 1_000_000_000;

/// One run of the model.
#[derive(Debug, Clone)]
pub(super) struct Scenario {
    /// Bottleneck rate (bit/s).
    pub bps: f64,
    /// Its FIFO's size (bytes); an arriving datagram that does not fit is dropped.
    pub queue_bytes: u64,
    /// Each flow's base round trip (ns) and start time (ns).
    pub flows: Vec<(Nanos, Nanos)>,
    /// Random loss before the queue (probability per datagram).
    pub loss: f64,
    /// How long the run lasts (ns).
    pub duration_ns: Nanos,
    /// Seed of the random loss.
    pub seed: u64,
}

/// What a run measured over its last second.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    /// Each flow's delivered rate (bit/s).
    pub rates: Vec<f64>,
    /// Delivered bits over `C x 1 s`.
    pub utilisation: f64,
    /// Jain's fairness index of `rates`.
    pub jain: f64,
    /// Datagrams dropped by the full queue, over the whole run.
    pub drops: u64,
}

/// Jain's fairness index: `(sum x)^2 / (n sum x^2)`, 1 when all are equal.
pub(super) fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

/// The receiver's side of one flow.
#[derive(Debug, Default)]
struct Receiver {
    received: u64,
    highest_seq: u64,
    /// Datagrams since the latest feedback.
    news: u64,
    last_feedback_at: Nanos,
    /// The latest datagram's send time and arrival time (the echo).
    latest: (Nanos, Nanos),
}

/// A feedback on its way back: when it reaches the sender and what it carries.
#[derive(Debug, Clone, Copy)]
struct Feedback {
    arrives: Nanos,
    /// The sender's time of the echoed datagram and how long the receiver held it.
    echo_sent: Nanos,
    held: Nanos,
    received: u64,
    highest_seq: u64,
}

/// One flow: its controller, the datagrams in flight (arrival at the receiver, seq, send
/// time), its receiver and the feedbacks in flight.
struct Flow {
    controller: RateController,
    base_rtt: Nanos,
    start: Nanos,
    next_seq: u64,
    in_flight: VecDeque<(Nanos, u64, Nanos)>,
    receiver: Receiver,
    feedbacks: VecDeque<Feedback>,
    delivered_last_second: u64,
}

impl Flow {
    fn new(base_rtt: Nanos, start: Nanos) -> Self {
        Self {
            controller: RateController::new(RateConfig::default()),
            base_rtt,
            start,
            next_seq: 0,
            in_flight: VecDeque::new(),
            receiver: Receiver::default(),
            feedbacks: VecDeque::new(),
            delivered_last_second: 0,
        }
    }

    /// The receiver answers at `at`, when it has news.
    fn answer(&mut self, at: Nanos) {
        let r = &mut self.receiver;
        if r.news == 0 {
            return;
        }
        self.feedbacks.push_back(Feedback {
            arrives: at + self.base_rtt / 2,
            echo_sent: r.latest.0,
            held: at - r.latest.1,
            received: r.received,
            highest_seq: r.highest_seq,
        });
        r.news = 0;
        r.last_feedback_at = at;
    }

    /// Everything due by `now` at the receiver and back at the sender.
    fn deliver(&mut self, now: Nanos, measure_from: Nanos) {
        while let Some(&(arrives, seq, sent)) = self.in_flight.front() {
            if arrives > now {
                break;
            }
            self.in_flight.pop_front();
            let r = &mut self.receiver;
            r.received += 1;
            r.highest_seq = r.highest_seq.max(seq);
            r.news += 1;
            r.latest = (sent, arrives);
            if arrives >= measure_from {
                self.delivered_last_second += DATAGRAM;
            }
            if r.news >= FEEDBACK_DATAGRAMS {
                self.answer(arrives);
            }
        }
        if now.saturating_sub(self.receiver.last_feedback_at) >= FEEDBACK_EVERY_NS {
            self.answer(now);
        }
        while let Some(&f) = self.feedbacks.front() {
            if f.arrives > now {
                break;
            }
            self.feedbacks.pop_front();
            let signal = RateSignal {
                forward_ns: None,
                rtt_ns: f.arrives - f.echo_sent - f.held,
                full_size: true,
                received: f.received,
                highest_seq: f.highest_seq,
            };
            self.controller.on_feedback(now, signal);
        }
        if self.controller.poll_timeout().is_some_and(|at| at <= now) {
            self.controller.handle_timeout(now);
        }
    }

    /// The datagrams the pacer lets leave in `(from, to]`, each at its exact time.
    fn send(&mut self, flow: usize, from: Nanos, to: Nanos, out: &mut Vec<(Nanos, usize, u64)>) {
        if to < self.start {
            return;
        }
        let from = from.max(self.start);
        loop {
            let at = self.controller.next_send_at(to).max(from);
            if at > to {
                break;
            }
            self.controller.on_sent(at, DATAGRAM, self.next_seq);
            out.push((at, flow, self.next_seq));
            self.next_seq += 1;
        }
    }
}

/// The bottleneck: a FIFO served at `bps`, idle from `busy_until` on.
struct Bottleneck {
    bps: f64,
    queue_bytes: u64,
    busy_until: Nanos,
}

impl Bottleneck {
    /// A datagram arriving at `at` leaves the link at the returned time, or is dropped.
    fn offer(&mut self, at: Nanos) -> Option<Nanos> {
        let backlog = self.busy_until.saturating_sub(at) as f64 * self.bps / 8e9;
        if backlog + DATAGRAM as f64 > self.queue_bytes as f64 {
            return None;
        }
        let serialise = (DATAGRAM as f64 * 8e9 / self.bps) as Nanos;
        self.busy_until = self.busy_until.max(at) + serialise;
        Some(self.busy_until)
    }
}

/// Runs `scenario` and measures its last second.
pub(super) fn run(scenario: &Scenario) -> Outcome {
    let mut flows: Vec<Flow> = (scenario.flows.iter())
        .map(|&(rtt, start)| Flow::new(rtt, start))
        .collect();
    let mut link = Bottleneck {
        bps: scenario.bps,
        queue_bytes: scenario.queue_bytes,
        busy_until: 0,
    };
    let mut rng = SplitMix64::new(scenario.seed);
    let measure_from = scenario.duration_ns.saturating_sub(LAST_SECOND_NS);
    let mut drops = 0;
    let mut sends = Vec::new();
    let mut now = 0;
    while now < scenario.duration_ns {
        let next = now + STEP_NS;
        sends.clear();
        for (i, flow) in flows.iter_mut().enumerate() {
            flow.send(i, now, next, &mut sends);
        }
        sends.sort_unstable();
        for &(at, i, seq) in &sends {
            if rng.next_f64() < scenario.loss {
                continue;
            }
            let Some(done) = link.offer(at) else {
                drops += 1;
                continue;
            };
            let flow = &mut flows[i];
            flow.in_flight
                .push_back((done + flow.base_rtt / 2, seq, at));
        }
        now = next;
        for flow in &mut flows {
            flow.deliver(now, measure_from);
        }
    }
    let rates: Vec<f64> = flows
        .iter()
        .map(|f| f.delivered_last_second as f64 * 8.0)
        .collect();
    Outcome {
        utilisation: rates.iter().sum::<f64>() / scenario.bps,
        jain: jain(&rates),
        rates,
        drops,
    }
}
