//! The event loop: hosts (a state machine, a NIC and links), frames in flight, the workers'
//! compute, and the counters that become the report.

use std::ops::Range;
use std::rc::Rc;

use syncopate_core::latency::{HandOvers, Histogram};
use syncopate_core::net::{NetCounters, Rotation};
use syncopate_core::profile::ModelProfile;
use syncopate_core::registry::KeyInfo;
use syncopate_core::step::{Action, StepPlan, StepSequencer, Straggler};
use syncopate_core::strategy::{Endpoint, KeyLoss, ProtocolError, Rank, WorkerEvent, WorkerSync};
use syncopate_core::wire::{f32_bytes_mut, Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

use crate::build::{model_keys, peers, rank_endpoints, server_key_owners, RankEndpoint};
use crate::nic::Nic;
use crate::offer::{Frontier, Outbox};
use crate::queue::{Event, EventQueue};
use crate::report::{FlowWindows, HostTraffic, Lane, SimReport, Tracer};
use crate::rng::Jitter;
use crate::symmetry::times;
use crate::{SimConfig, SimError};

mod datagrams;
mod life;
mod mirror;
mod network;
mod prefetch;

/// When endpoints are asked for frames, and on which links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Polling {
    /// Only when something that can produce a frame happened (a gradient handed over; a
    /// frame delivered to a ring or credit worker; a slice updated on a server), and only on
    /// the links that can hold the most urgent frame (see [`crate::offer`]).
    Lean,
    /// As the runtime does: after every event, on every link (O(workers) per server frame);
    /// the reference that `Lean` is tested against.
    #[cfg_attr(not(test), allow(dead_code))]
    Exhaustive,
}

/// Laid out in the order of use (`repr(C)`, from a cache line's start): a delivery reads the
/// endpoint and counts the bytes, a sender reads its links and then its NIC.
#[repr(C, align(64))]
struct Host {
    endpoint: RankEndpoint,
    traffic: HostTraffic,
    /// The peers, twice over, so that a rotation is a sub-slice.
    links: Vec<Rank>,
    /// A worker's fairness among its links (core's rule, the runtime's too).
    rotation: Rotation,
    nic: Nic,
}

struct InFlight {
    from: Rank,
    to: Rank,
    header: Header,
    buf: Vec<u8>,
    bytes: usize,
    /// When the frame starts arriving (first bit, or start of ingress serialisation).
    recv_start: u64,
    /// A frame its sender repaired by resending lost packets: when the first of the rest
    /// arrived ([`syncopate_core::net::Decision::first_arrival`]).
    first_arrival: Option<u64>,
    /// A datagram of a datagram link (its DSCP and path), not a frame.
    datagram: Option<(u8, usize)>,
    /// The path its sender's NIC sent it on (its path at the receiver's ingress).
    path: usize,
}

/// One simulation run.
pub(crate) struct Sim<'a> {
    cfg: &'a SimConfig,
    profile: &'a ModelProfile,
    polling: Polling,
    /// Whether servers' replies are checked against the frontier bookkeeping (parameter
    /// servers whose every frame is a reply to a complete slice, one update at a time; a
    /// loss-tolerant server also sends stops and bitmaps, and updates a key at once).
    checks_replies: bool,
    /// Whether a delivery can give a worker something to send (ring forwarding, credit).
    sends_on_delivery: bool,
    hosts: Vec<Host>,
    /// Each worker's step sequencer (core's, as the runtime's workers run it).
    sequencers: Vec<StepSequencer>,
    /// Each worker's keys handed over and not yet back.
    tensors: Vec<HandOvers>,
    /// Every worker's per-tensor completion times (one histogram: the report shows them
    /// all together, and one stays in cache where a thousand would not).
    completion: Histogram,
    jitter: Vec<Jitter>,
    /// Each worker's compute factor (stragglers above 1).
    slowdown: Vec<f64>,
    frontiers: Vec<Frontier>,
    /// Parameter-server workers only.
    outboxes: Vec<Outbox>,
    key_owners: Vec<Vec<(usize, u32)>>,
    updates: Vec<u64>,
    keys: Vec<KeyInfo>,
    layer_keys: Rc<[Range<usize>]>,
    grad: Vec<f32>,
    queue: EventQueue,
    frames: Vec<Option<InFlight>>,
    free_slots: Vec<usize>,
    pool: Vec<Vec<u8>>,
    /// Scratch: the links whose sockets have room (`Sim::poll_frame`).
    socket_open: Vec<Rank>,
    now: u64,
    events: u64,
    frames_sent: u64,
    step_end: Vec<u64>,
    tracer: Tracer,
    /// Per host: the endpoint timer a [`Event::Timeout`] is queued for.
    timers: Vec<Option<u64>>,
    /// The last frame's `(elements, wire bytes)`: frames of one slice size follow one
    /// another, and [`SimConfig::wire_bytes`] divides and rounds.
    last_wire: (usize, usize),
    /// The processes' lives, with faults on (`None`: no faults, no liveness rules).
    lives: Option<Box<life::Lives>>,
    /// One worker standing for all ([`crate::symmetry`]); `None` at packet level.
    mirror: Option<crate::symmetry::Mirror>,
    /// The datagram links, where loss-tolerant frames travel as datagrams.
    datagrams: Option<Box<datagrams::Datagrams>>,
}

/// The network flow of the directed link `from -> to` (ranks fit 32 bits).
fn flow(from: Rank, to: Rank) -> u64 {
    ((from as u64) << 32) | (to as u64 & 0xFFFF_FFFF)
}

/// The header of a frame `from` produced.
fn decode(buf: &[u8], from: Rank) -> Result<Header, ProtocolError> {
    let head: Option<&[u8; HEADER_LEN]> = buf.get(..HEADER_LEN).and_then(|b| b.try_into().ok());
    let head = head.ok_or_else(|| ProtocolError::Unexpected {
        from,
        reason: format!("frame of {} bytes is shorter than a header", buf.len()),
    })?;
    Ok(Header::decode(head, DEFAULT_MAX_PAYLOAD)?)
}

fn frame_name(h: &Header, from: Rank, to: Rank) -> String {
    format!("{:?} key {} @{} {from}->{to}", h.kind, h.key, h.offset)
}

/// What [`drain`] records a worker's events in.
struct Records<'s> {
    /// The worker's step sequencer, which the events move on.
    sequencer: &'s mut StepSequencer,
    /// The worker's keys handed over and not yet back.
    tensors: &'s mut HandOvers,
    /// The run's per-tensor completion times.
    completion: &'s mut Histogram,
    /// The run's step end times.
    step_end: &'s mut [u64],
}

impl<'s> Records<'s> {
    /// Worker `w`'s records, out of the run's.
    #[inline(always)]
    fn of(
        w: usize,
        sequencers: &'s mut [StepSequencer],
        tensors: &'s mut [HandOvers],
        completion: &'s mut Histogram,
        step_end: &'s mut [u64],
    ) -> Self {
        Self {
            sequencer: &mut sequencers[w],
            tensors: &mut tensors[w],
            completion,
            step_end,
        }
    }
}

/// Hands the endpoint's events to its step sequencer; records when tensors and steps
/// complete. Returns whether there was any. Inlined into its three callers (once per
/// delivery to a worker): the call cost more than the work when there is no event.
#[inline(always)]
fn drain(ep: &mut dyn WorkerSync, records: Records, now: u64) -> bool {
    let Records {
        sequencer,
        tensors,
        completion,
        step_end,
    } = records;
    let mut any = false;
    while let Some(ev) = ep.poll_event() {
        any = true;
        if let WorkerEvent::ParamsReady(key) | WorkerEvent::GradReady(key) = ev {
            if let Some(ns) = tensors.completed(key, now) {
                completion.record(ns);
            }
        }
        sequencer.handle_event(ev);
        if ev == WorkerEvent::StepDone {
            let done = sequencer.steps_done() as usize;
            if let Some(end) = step_end.get_mut(done.saturating_sub(1)) {
                *end = (*end).max(now);
            }
        }
    }
    any
}

impl<'a> Sim<'a> {
    /// Builds the job of `cfg` on `profile`.
    pub fn new(
        profile: &'a ModelProfile,
        cfg: &'a SimConfig,
        polling: Polling,
    ) -> Result<Self, SimError> {
        cfg.validate()?;
        // Lean polling relies on servers that only ever reply to complete slices.
        let polling = if cfg.strategy.loss_tolerant() {
            Polling::Exhaustive
        } else {
            polling
        };
        let (keys, layer_keys) = model_keys(profile, cfg);
        let layer_keys: Rc<[Range<usize>]> = layer_keys.into();
        let plan = StepPlan::new(cfg.strategy, cfg.steps, layer_keys.to_vec())
            .with_tuning(cfg.plan().tune_spec(&keys));
        let hosts = rank_endpoints(cfg, &keys)?
            .into_iter()
            .enumerate()
            .map(|(rank, endpoint)| {
                let p = peers(cfg, rank);
                Host {
                    endpoint,
                    links: p.iter().chain(&p).copied().collect(),
                    rotation: Rotation::new(),
                    nic: Nic::new(&cfg.nic_profile(rank, &cfg.network), cfg.seed, rank as u64),
                    traffic: HostTraffic::default(),
                }
            })
            .collect();
        let n = cfg.workers;
        let lives = life::Lives::new(
            cfg,
            (0..cfg.workers + cfg.servers)
                .map(|r| peers(cfg, r))
                .collect(),
        );
        Ok(Self {
            lives,
            mirror: None,
            datagrams: datagrams::Datagrams::for_job(cfg),
            cfg,
            profile,
            polling,
            sends_on_delivery: !cfg.strategy.uses_servers()
                || cfg.scheduler.uses_credit()
                || cfg.strategy.loss_tolerant(),
            checks_replies: !cfg.strategy.loss_tolerant(),
            hosts,
            sequencers: (0..n).map(|_| StepSequencer::new(plan.clone())).collect(),
            tensors: (0..n).map(|_| HandOvers::new(keys.len())).collect(),
            completion: Histogram::default(),
            jitter: (0..n)
                .map(|w| Jitter::new(cfg.seed, w as u64, cfg.jitter))
                .collect(),
            slowdown: (0..n)
                .map(|w| Straggler::slowdown(&cfg.stragglers, w))
                .collect(),
            frontiers: vec![Frontier::default(); cfg.servers],
            outboxes: vec![Outbox::new(n, cfg.servers); if cfg.servers > 0 { n } else { 0 }],
            key_owners: server_key_owners(cfg, &keys),
            updates: vec![0; cfg.servers],
            grad: vec![1e-3; keys.iter().map(|k| k.numel).max().unwrap_or(0)],
            keys,
            layer_keys,
            queue: EventQueue::default(),
            frames: Vec::new(),
            free_slots: Vec::new(),
            pool: Vec::new(),
            socket_open: Vec::new(),
            now: 0,
            events: 0,
            frames_sent: 0,
            step_end: vec![0; cfg.steps as usize],
            tracer: Tracer::new(cfg.trace_steps.clone()),
            timers: vec![None; cfg.workers + cfg.servers],
            last_wire: (0, cfg.wire_bytes(0)),
        })
    }

    /// Runs every event and builds the report.
    pub fn run(mut self) -> Result<SimReport, SimError> {
        for w in 0..self.cfg.workers {
            self.drive(w, false)?;
        }
        for h in 0..self.hosts.len() {
            self.arm_timer(h);
            self.arm_liveness(h);
        }
        self.schedule_strikes();
        while let Some((t, ev)) = self.queue.pop() {
            self.now = t;
            self.events += 1;
            self.prefetch_next();
            if !self.runs(ev) {
                continue;
            }
            let touched = self.touched_host(ev);
            match ev {
                Event::ComputeDone(w) => {
                    self.sequencers[w].compute_done();
                    self.drive(w, false)?;
                }
                Event::NicReady(h) => {
                    self.hosts[h].nic.wake_at = None;
                    if h < self.cfg.workers {
                        self.send(h)?;
                    } else {
                        self.fill(h)?;
                    }
                }
                Event::Arrive(slot) => self.arrive(slot)?,
                Event::Deliver(slot) => self.deliver(slot)?,
                Event::NetPoll { host, ingress } => {
                    // A poll armed for a later time than a newer one is stale: the newer
                    // one polls (acting on both would keep each duplicate alive).
                    let armed = &mut self.hosts[host].nic.poll_at[usize::from(ingress)];
                    if *armed == Some(t) {
                        *armed = None;
                        self.port_polled(host, ingress, t)?;
                    }
                }
                Event::Timeout(h) => self.timeout(h)?,
                Event::Strike(i) => self.strike(i),
                Event::Control(slot) => self.control(slot),
                Event::Liveness(h) => self.liveness_due(h),
                Event::Datagram(h) => self.datagram_timer(h)?,
            }
            if let Some(h) = touched {
                self.arm_timer(h);
                if self.lives.is_some() {
                    self.life_moved(h);
                }
            }
        }
        if self.lives.is_some() {
            let faults = self.fault_report();
            let mut report = self.report();
            report.faults = faults;
            return Ok(report);
        }
        let stuck: Vec<String> = (self.sequencers.iter().enumerate())
            .filter(|(_, t)| !t.finished())
            .take(4)
            .map(|(w, t)| format!("worker {w} at {}", t.describe()))
            .collect();
        if !stuck.is_empty() {
            return Err(SimError::Stalled {
                time_ns: self.now,
                what: stuck.join("; "),
            });
        }
        Ok(self.report())
    }

    /// Whether event `ev` still happens: with faults on, a host that crashed, froze or
    /// stopped computes, sends and times out no more (frames to it are dropped on arrival).
    fn runs(&self, ev: Event) -> bool {
        let Some(lives) = &self.lives else {
            return true;
        };
        match ev {
            Event::ComputeDone(h) | Event::NicReady(h) | Event::Timeout(h) | Event::Datagram(h) => {
                lives.active(h)
            }
            Event::NetPoll { host, .. } => lives.port_runs(host),
            Event::Arrive(_)
            | Event::Deliver(_)
            | Event::Strike(_)
            | Event::Control(_)
            | Event::Liveness(_) => true,
        }
    }

    /// Whether the frame in `slot` reaches its receiver (faults may stop it); one that does
    /// not is freed. Inlined: without faults (every frame of most runs) it is one test.
    #[inline]
    fn admitted(&mut self, slot: usize) -> bool {
        self.lives.is_none() || self.survives_faults(slot)
    }

    /// [`Sim::admitted`] with faults on.
    fn survives_faults(&mut self, slot: usize) -> bool {
        let now = self.now;
        let Some(lives) = self.lives.as_deref_mut() else {
            return true;
        };
        let Some(f) = self.frames.get(slot).and_then(Option::as_ref) else {
            return true;
        };
        if lives.admit_data(f.from, f.to, now) {
            return true;
        }
        if let Some(f) = self.frames[slot].take() {
            self.pool.push(f.buf);
        }
        self.free_slots.push(slot);
        false
    }

    fn internal(&self, what: String) -> SimError {
        SimError::Internal {
            time_ns: self.now,
            what,
        }
    }

    /// Runs worker `w`'s loop until it computes or waits, offering its NIC frames whenever
    /// it may have some (`poll`: it may already, e.g. a frame was just delivered to a ring
    /// worker), until its endpoint has no more events (transmitting can end a ring step).
    fn drive(&mut self, w: usize, poll: bool) -> Result<(), SimError> {
        let may_send = self.run_sequencer(w)?;
        if may_send || poll || self.polling == Polling::Exhaustive {
            self.send(w)?;
        }
        Ok(())
    }

    /// Offers worker `w`'s NIC frames; as long as that gives its step sequencer events, runs
    /// the sequencer again and, if it may have more to send, offers again. Between events
    /// every sequencer waits (each [`Sim::drive`] leaves it so), so this is `drive(w, true)`
    /// without asking a waiting sequencer for an action first: all a reopened send window
    /// needs.
    fn send(&mut self, w: usize) -> Result<(), SimError> {
        loop {
            self.fill(w)?;
            let RankEndpoint::Worker(ep) = &mut self.hosts[w].endpoint else {
                return Ok(());
            };
            let worker = Records::of(
                w,
                &mut self.sequencers,
                &mut self.tensors,
                &mut self.completion,
                &mut self.step_end,
            );
            if !drain(ep.as_mut(), worker, self.now) || !self.run_sequencer(w)? {
                return Ok(());
            }
        }
    }

    /// Runs worker `w`'s step sequencer until it computes or waits; returns whether any of
    /// its actions may have given the endpoint something to send.
    fn run_sequencer(&mut self, w: usize) -> Result<bool, SimError> {
        let mut may_send = false;
        let profile = self.profile;
        let RankEndpoint::Worker(ep) = &mut self.hosts[w].endpoint else {
            return Err(self.internal(format!("rank {w} is not a worker")));
        };
        let sequencer = &mut self.sequencers[w];
        loop {
            let action = sequencer.poll_action();
            may_send |= matches!(
                action,
                Action::Begin(_) | Action::HandOver(_) | Action::BackwardDone
            );
            match action {
                Action::Wait | Action::Finished => return Ok(may_send),
                Action::Begin(step) => ep.begin_step(step),
                Action::Retune(knobs) => {
                    ep.retune(knobs);
                    may_send = true;
                }
                Action::StepEnd(_) => sequencer.handle_step_end(self.now),
                Action::Forward(layer) | Action::Backward(layer) => {
                    let l = &profile.layers[layer];
                    let backward = matches!(action, Action::Backward(_));
                    let ns = self.jitter[w].apply(if backward {
                        l.backward_ns
                    } else {
                        l.forward_ns
                    });
                    let ns = (ns as f64 * self.slowdown[w]).round() as u64;
                    let (now, step) = (self.now, sequencer.step());
                    self.queue.push(now + ns, Event::ComputeDone(w));
                    let what = if backward { "backward" } else { "forward" };
                    let name = || format!("{what} {}", l.name);
                    self.tracer
                        .record(step, w, Lane::Compute, (now, now + ns), name);
                    continue;
                }
                Action::HandOver(layer) => {
                    for key in self.layer_keys[layer].clone() {
                        self.tensors[w].handed(key, self.now);
                        ep.handle_gradient(key, &self.grad[..self.keys[key].numel]);
                        if let Some(outbox) = self.outboxes.get_mut(w) {
                            outbox.handed(&self.key_owners[key]);
                        }
                    }
                }
                // Data, loss, optimizer and evaluation take no modelled time (and
                // simulated models have no buffers to relay).
                Action::LoadBatch(_)
                | Action::SyncBuffers(_)
                | Action::Loss
                | Action::OptimizeLayer(_)
                | Action::Optimize
                | Action::Evaluate { .. }
                | Action::Checkpoint(_) => continue,
                Action::BackwardDone => ep.handle_backward_done(),
            }
            let worker = Records {
                sequencer: &mut *sequencer,
                tensors: &mut self.tensors[w],
                completion: &mut self.completion,
                step_end: &mut self.step_end,
            };
            drain(ep.as_mut(), worker, self.now);
        }
    }

    /// A frame is handed to its receiver: its payload is read into the slot the endpoint
    /// designates, then the receiver reacts (replies, forwards, computes).
    fn deliver(&mut self, slot: usize) -> Result<(), SimError> {
        if !self.admitted(slot) {
            return Ok(());
        }
        if (self.frames.get(slot)).is_some_and(|f| f.as_ref().is_some_and(|f| f.datagram.is_some()))
        {
            return self.deliver_datagram(slot);
        }
        // Read where it lies (a frame is a hundred bytes: not copied out to be read once).
        let Some(f) = self.frames.get_mut(slot).and_then(Option::as_mut) else {
            return Err(self.internal(format!("no frame in slot {slot}")));
        };
        let (now, from, to, h) = (self.now, f.from, f.to, &f.header);
        let fan = match &self.mirror {
            Some(m) if m.ring.is_none() && to >= self.cfg.workers => m.workers,
            _ => 1,
        };
        self.hosts[to].traffic.bytes_received += (f.bytes * fan) as u64;
        self.tracer
            .record(h.step, to, Lane::Receive, (f.recv_start, now), || {
                frame_name(h, from, to)
            });
        let ep: &mut dyn Endpoint = match &mut self.hosts[to].endpoint {
            RankEndpoint::Worker(w) => w.as_mut(),
            RankEndpoint::Server(s) => s.as_mut(),
        };
        let payload = f.buf.get(HEADER_LEN..).unwrap_or_default();
        let result = match ep.recv_slot(from, h).map(f32_bytes_mut) {
            Ok(dst) if dst.len() == payload.len() => {
                dst.copy_from_slice(payload);
                ep.handle_payload(from, h)
            }
            Ok(dst) => Err(ProtocolError::Unexpected {
                from,
                reason: format!(
                    "{}-byte slot for a {}-byte payload",
                    dst.len(),
                    payload.len()
                ),
            }),
            Err(e) => Err(e),
        };
        let h = (h.step, h.key, h.offset);
        self.pool.push(std::mem::take(&mut f.buf));
        self.frames[slot] = None;
        self.free_slots.push(slot);
        result.map_err(|source| SimError::Protocol {
            time_ns: now,
            host: to,
            from,
            source,
        })?;
        self.react(to, h)
    }

    /// Receiver `to` reacts to a frame of `slice` it was handed: a server (whose updates
    /// are checked) may reply, a worker's step sequencer may move on and the worker send.
    fn react(&mut self, to: Rank, slice: (u64, u32, u32)) -> Result<(), SimError> {
        let now = self.now;
        match &mut self.hosts[to].endpoint {
            RankEndpoint::Server(s) => {
                let i = to - self.cfg.workers;
                let updates = s.updates();
                if !self.checks_replies {
                    self.updates[i] = updates;
                    self.fill(to)
                } else if updates == self.updates[i] + 1 {
                    self.updates[i] = updates;
                    self.frontiers[i].updated(slice);
                    self.fill(to)
                } else if updates != self.updates[i] {
                    Err(self.internal(format!(
                        "server rank {to} applied {updates} updates at once"
                    )))
                } else if self.polling == Polling::Exhaustive {
                    self.fill(to)
                } else {
                    Ok(())
                }
            }
            RankEndpoint::Worker(ep) => {
                let worker = Records::of(
                    to,
                    &mut self.sequencers,
                    &mut self.tensors,
                    &mut self.completion,
                    &mut self.step_end,
                );
                let any = drain(ep.as_mut(), worker, now);
                // A worker waits on its sequencer as the last drive left it unless an event
                // moved the sequencer on or the frame may give it something to send (always
                // asked, polling exhaustively).
                if any || self.sends_on_delivery || self.polling == Polling::Exhaustive {
                    self.drive(to, self.sends_on_delivery)?;
                }
                Ok(())
            }
        }
    }

    /// The host whose endpoint event `ev` calls (whose timer may then change).
    fn touched_host(&self, ev: Event) -> Option<usize> {
        match ev {
            Event::ComputeDone(h) | Event::NicReady(h) | Event::Timeout(h) | Event::Datagram(h) => {
                Some(h)
            }
            Event::Deliver(slot) => self.frames.get(slot)?.as_ref().map(|f| f.to),
            Event::Control(_) | Event::Strike(_) => None,
            Event::Liveness(h) => Some(h),
            Event::Arrive(_) | Event::NetPoll { .. } => None,
        }
    }

    /// Queues a [`Event::Timeout`] for host `h`'s endpoint timer unless one is queued for it.
    /// Inlined into the event loop (once per event; the timer seldom changes).
    #[inline(always)]
    fn arm_timer(&mut self, h: usize) {
        let ep: &dyn Endpoint = match &self.hosts[h].endpoint {
            RankEndpoint::Worker(w) => w.as_ref(),
            RankEndpoint::Server(s) => s.as_ref(),
        };
        let at = ep.poll_timeout();
        let Some(armed) = self.timers.get_mut(h) else {
            return;
        };
        if at != *armed {
            *armed = at;
            self.queue_timeout(h, at);
        }
    }

    /// Queues a [`Event::Timeout`] at `at` for host `h` (if any).
    #[cold]
    fn queue_timeout(&mut self, h: usize, at: Option<u64>) {
        if let Some(at) = at {
            self.queue.push(at.max(self.now), Event::Timeout(h));
        }
    }

    /// Host `h`'s endpoint timer came due (a stale event, for a timer since moved, does
    /// nothing): the endpoint handles it, then is polled as after any event.
    fn timeout(&mut self, h: usize) -> Result<(), SimError> {
        if self.timers[h].is_none_or(|at| at > self.now) {
            return Ok(());
        }
        self.timers[h] = None;
        let now = self.now;
        match &mut self.hosts[h].endpoint {
            RankEndpoint::Worker(ep) => {
                ep.handle_timeout(now);
                self.drive(h, true)
            }
            RankEndpoint::Server(ep) => {
                ep.handle_timeout(now);
                self.fill(h)
            }
        }
    }

    /// Worker `w`'s endpoint, for tests that wrap it.
    #[cfg(test)]
    pub(crate) fn worker_mut(&mut self, w: usize) -> Option<&mut Box<dyn WorkerSync>> {
        match &mut self.hosts.get_mut(w)?.endpoint {
            RankEndpoint::Worker(ep) => Some(ep),
            RankEndpoint::Server(_) => None,
        }
    }

    /// What every host's NIC counted, summed.
    fn network_counters(&self) -> NetCounters {
        let mut network = NetCounters::default();
        let fan = self.mirror.as_ref().map_or(1, |m| m.workers) as u64;
        for (i, h) in self.hosts.iter().enumerate() {
            let c = h.nic.counters();
            // A mirrored worker's counts stand for every worker's; a server's bytes already
            // do (its frames were charged for every worker), its frames not yet.
            let c = match i < self.cfg.workers {
                true => times(&c, fan),
                false => NetCounters {
                    frames_sent: c.frames_sent.saturating_mul(fan),
                    ..c
                },
            };
            network.add(&c);
        }
        network
    }

    fn report(self) -> SimReport {
        let cfg = self.cfg;
        let elapsed = self.step_end.last().copied().unwrap_or(0);
        let secs = elapsed as f64 * 1e-9;
        let mut prev = 0;
        let step_seconds = (self.step_end.iter())
            .map(|&e| {
                let d = e.saturating_sub(prev);
                prev = e;
                d as f64 * 1e-9
            })
            .collect();
        let mean = secs / cfg.steps as f64;
        let paths = cfg.network.paths.max(1) as f64;
        let util = |t: &HostTraffic| match cfg.network.bandwidth_bps {
            Some(bps) if elapsed > 0 => t.bytes_sent as f64 * 8.0 / (bps * paths * secs),
            _ => 0.0,
        };
        let network = self.network_counters();
        let traffic: Vec<HostTraffic> = (self.hosts.iter())
            .map(|h| {
                let c = h.nic.counters();
                let (timeouts, loss_probes) = (c.timeouts, c.loss_probes);
                HostTraffic {
                    timeouts,
                    loss_probes,
                    timeout_causes: c.timeout_causes,
                    windows: FlowWindows::of(&c),
                    ..h.traffic
                }
            })
            .collect();
        let dlcp = self
            .hosts
            .iter()
            .filter_map(|h| match &h.endpoint {
                RankEndpoint::Server(s) => s.loss_stats(),
                RankEndpoint::Worker(w) => w.loss_stats(),
            })
            .reduce(|mut a, b| {
                a.add(&b);
                a
            });
        let key_loss = KeyLoss::sum(self.hosts.iter().map(|h| match &h.endpoint {
            RankEndpoint::Server(s) => s.key_loss(),
            RankEndpoint::Worker(w) => w.key_loss(),
        }));
        SimReport {
            datagrams: self.datagrams.as_ref().map(|d| d.counters()),
            datagram_rates: (self.datagrams.as_ref()).map_or_else(Vec::new, |d| d.rates_of(0)),
            model: self.profile.name.clone(),
            config: cfg.clone(),
            step_end_ns: self.step_end,
            step_seconds,
            mean_step_seconds: mean,
            samples_per_sec: if mean > 0.0 {
                (cfg.workers * cfg.batch) as f64 / mean
            } else {
                0.0
            },
            worker_utilisation: traffic[..cfg.workers].iter().map(util).collect(),
            server_utilisation: traffic[cfg.workers..].iter().map(util).collect(),
            traffic,
            frames: self.frames_sent,
            network,
            dlcp,
            realised_loss_per_key: key_loss.iter().map(KeyLoss::realised_loss).collect(),
            tensor_completion: self.completion.summary(),
            autotune: self
                .sequencers
                .first()
                .and_then(|t| t.tuner())
                .map(|t| t.report()),
            events: self.events,
            model_path: String::new(),
            faults: None,
            trace: self.tracer.into_events(),
        }
    }
}
