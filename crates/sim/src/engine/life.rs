//! The processes' lives when faults are on: core's liveness rules on virtual time, the
//! goodbyes that end a job, the Aborts and closes that end it early, and the faults that
//! strike (see [`crate::faults`]).

use syncopate_core::liveness::{Failure, Liveness, LostReason};
use syncopate_core::strategy::Rank;

use super::Sim;
use crate::build::RankEndpoint;
use crate::faults::{draw_strikes, Ending, Fault, FaultReport, Strike};
use crate::queue::Event;
use crate::rng::Jitter;
use crate::SimConfig;

/// A control frame: it bypasses the data path (the runtime writes control frames around the
/// emulation), with the path's latency plus any fault delay, in order per link.
#[derive(Debug, Clone)]
enum ControlKind {
    Heartbeat,
    Goodbye,
    Abort(Failure),
    /// The connection closed (the sender exited, was killed, or stopped on an error).
    Close,
}

#[derive(Debug)]
struct Control {
    from: Rank,
    to: Rank,
    kind: ControlKind,
}

#[derive(Debug, Clone, Copy, Default)]
struct LinkFlags {
    goodbye_sent: bool,
    goodbye_received: bool,
    closed: bool,
    /// When the latest control frame on this link is delivered (they stay in order).
    last_control: u64,
}

impl LinkFlags {
    /// Whether the link may need a heartbeat: this end has not said goodbye on it and it
    /// is open (what waits to be written is not modelled: data frames count as written when
    /// they are queued).
    fn idle(&self) -> bool {
        !self.goodbye_sent && !self.closed
    }

    /// Whether the peer's silence counts: the link is open and the peer has not said goodbye.
    fn watched(&self) -> bool {
        !self.closed && !self.goodbye_received
    }
}

/// One process's life.
struct Life {
    ending: Option<Ending>,
    leaving: bool,
    liveness: Liveness,
    /// By link index: the host's peers in [`super::Host::links`] order.
    peers: Vec<Rank>,
    links: Vec<LinkFlags>,
    /// Links whose peer said goodbye or closed.
    heard: usize,
    armed: Option<u64>,
}

/// Every process's life, the faults of the run and the control frames on their way.
pub(super) struct Lives {
    strikes: Vec<Strike>,
    hosts: Vec<Life>,
    cut: Vec<(Rank, Rank)>,
    control: Vec<Option<Control>>,
    free: Vec<usize>,
    rng: Jitter,
    heartbeats: (u64, u64),
}

impl Lives {
    /// The lives of `cfg`'s processes whose peers are `peers`, or `None` without faults.
    pub(super) fn new(cfg: &SimConfig, peers: Vec<Vec<Rank>>) -> Option<Box<Self>> {
        let f = &cfg.faults;
        f.enabled().then(|| {
            let hosts = (peers.into_iter())
                .map(|peers| Life {
                    ending: None,
                    leaving: false,
                    liveness: Liveness::new(f.liveness, peers.len(), 0),
                    links: vec![LinkFlags::default(); peers.len()],
                    peers,
                    heard: 0,
                    armed: None,
                })
                .collect::<Vec<_>>();
            Box::new(Self {
                strikes: draw_strikes(f, cfg.seed, hosts.len()),
                hosts,
                cut: Vec::new(),
                control: Vec::new(),
                free: Vec::new(),
                rng: Jitter::new(cfg.seed, u64::MAX - 1, 0.0),
                heartbeats: (0, 0),
            })
        })
    }

    fn link(&self, h: Rank, peer: Rank) -> Option<usize> {
        self.hosts.get(h)?.peers.iter().position(|&p| p == peer)
    }

    /// Whether host `h` still runs (neither ended nor hit).
    pub(super) fn active(&self, h: Rank) -> bool {
        self.hosts.get(h).is_some_and(|l| l.ending.is_none())
    }

    /// Whether host `h`'s network port still moves frames: not once it crashed, froze or
    /// stopped (its sockets are gone or nobody drives them); a finished host's last frames
    /// still leave.
    pub(super) fn port_runs(&self, h: Rank) -> bool {
        self.hosts
            .get(h)
            .is_some_and(|l| matches!(l.ending, None | Some(Ending::Finished { .. })))
    }

    fn is_cut(&self, a: Rank, b: Rank) -> bool {
        self.cut.contains(&(a.min(b), a.max(b)))
    }

    /// Whether a data frame `from -> to` gets through: the receiver runs and the link is not
    /// cut. One that does counts as heard from `from`.
    pub(super) fn admit_data(&mut self, from: Rank, to: Rank, now: u64) -> bool {
        if !self.active(to) || self.is_cut(from, to) {
            return false;
        }
        if let Some(i) = self.link(to, from) {
            self.hosts[to].liveness.handle_received(i, now);
        }
        true
    }

    /// Host `h` wrote a data frame to `to`.
    pub(super) fn wrote(&mut self, h: Rank, to: Rank, now: u64) {
        if let Some(i) = self.link(h, to) {
            self.hosts[h].liveness.handle_written(i, now);
        }
    }
}

impl Sim<'_> {
    fn lives(&mut self) -> Option<&mut Lives> {
        self.lives.as_deref_mut()
    }

    /// Queues every fault of the run at its time.
    pub(super) fn schedule_strikes(&mut self) {
        let times: Vec<u64> = self
            .lives()
            .map_or_else(Vec::new, |l| l.strikes.iter().map(|s| s.at_ns).collect());
        for (i, at) in times.into_iter().enumerate() {
            self.queue.push(at, Event::Strike(i));
        }
    }

    /// Fault `i` strikes.
    pub(super) fn strike(&mut self, i: usize) {
        let now = self.now;
        let Some(lives) = self.lives() else { return };
        let Some(strike) = lives.strikes.get(i).copied() else {
            return;
        };
        match strike.fault {
            Fault::Crash(r) if lives.active(r) => {
                lives.hosts[r].ending = Some(Ending::Crashed { at_ns: now });
                self.close_all(r);
            }
            Fault::Freeze(r) if lives.active(r) => {
                lives.hosts[r].ending = Some(Ending::Frozen { at_ns: now });
            }
            Fault::Partition(a, b) => lives.cut.push((a.min(b), a.max(b))),
            Fault::Crash(_) | Fault::Freeze(_) => {}
        }
    }

    /// Sends a control frame from `from` on its link `i`.
    fn send_control(&mut self, from: Rank, i: usize, kind: ControlKind) {
        let (now, latency) = (self.now, self.cfg.network.latency_ns);
        let (loss, max_delay) = (
            self.cfg.faults.heartbeat_loss,
            self.cfg.faults.control_delay_ns,
        );
        let Some(lives) = self.lives() else { return };
        let delay = (lives.rng.unit() * max_delay as f64) as u64;
        let lost = matches!(kind, ControlKind::Heartbeat) && {
            lives.heartbeats.0 += 1;
            lives.rng.unit() < loss
        };
        let host = &mut lives.hosts[from];
        host.liveness.handle_written(i, now);
        let (Some(&to), Some(flags)) = (host.peers.get(i), host.links.get_mut(i)) else {
            return;
        };
        if lost {
            lives.heartbeats.1 += 1;
            return;
        }
        let at = (now.saturating_add(latency).saturating_add(delay)).max(flags.last_control);
        flags.last_control = at;
        let frame = Some(Control { from, to, kind });
        let slot = match lives.free.pop() {
            Some(slot) => {
                lives.control[slot] = frame;
                slot
            }
            None => {
                lives.control.push(frame);
                lives.control.len() - 1
            }
        };
        self.queue.push(at, Event::Control(slot));
    }

    /// Host `h` goes away: every open connection closes.
    fn close_all(&mut self, h: Rank) {
        let n = self.lives().map_or(0, |l| l.hosts[h].links.len());
        for i in 0..n {
            self.send_control(h, i, ControlKind::Close);
        }
    }

    /// Host `h` stops on `failure`: it tells every peer (an Abort), then closes.
    fn fail(&mut self, h: Rank, failure: Failure) {
        let now = self.now;
        let Some(lives) = self.lives() else { return };
        if !lives.active(h) {
            return;
        }
        let life = &mut lives.hosts[h];
        life.ending = Some(Ending::stopped(now, &failure));
        let open: Vec<usize> = (0..life.links.len())
            .filter(|&i| !life.links[i].closed)
            .collect();
        for &i in &open {
            self.send_control(h, i, ControlKind::Abort(failure.clone()));
        }
        self.close_all(h);
    }

    /// A control frame arrives.
    pub(super) fn control(&mut self, slot: usize) {
        let now = self.now;
        let Some(lives) = self.lives() else { return };
        let Some(Control { from, to, kind }) = lives.control.get_mut(slot).and_then(Option::take)
        else {
            return;
        };
        lives.free.push(slot);
        if !lives.active(to) || lives.is_cut(from, to) {
            return;
        }
        let Some(i) = lives.link(to, from) else {
            return;
        };
        let life = &mut lives.hosts[to];
        life.liveness.handle_received(i, now);
        let flags = &mut life.links[i];
        let heard_before = flags.goodbye_received || flags.closed;
        match &kind {
            ControlKind::Goodbye => flags.goodbye_received = true,
            ControlKind::Close => flags.closed = true,
            ControlKind::Heartbeat | ControlKind::Abort(_) => {}
        }
        if !heard_before && (flags.goodbye_received || flags.closed) {
            life.heard += 1;
        }
        let flags = life.links[i];
        match kind {
            ControlKind::Heartbeat | ControlKind::Goodbye => {}
            ControlKind::Abort(cause) => self.fail(
                to,
                Failure::Aborted {
                    peer: from,
                    cause: Box::new(cause),
                },
            ),
            ControlKind::Close => {
                if !flags.goodbye_received {
                    let reason = LostReason::Closed;
                    self.fail(to, Failure::Lost { peer: from, reason });
                }
            }
        }
        self.life_moved(to);
    }

    /// Host `h`'s liveness clocks came due: heartbeats on idle links, peers past the timeout.
    pub(super) fn liveness_due(&mut self, h: Rank) {
        let now = self.now;
        let Some(lives) = self.lives() else { return };
        let life = &mut lives.hosts[h];
        if life.armed != Some(now) {
            return;
        }
        life.armed = None;
        if life.ending.is_some() {
            return;
        }
        for i in 0..life.links.len() {
            let Some(lives) = self.lives() else { return };
            let life = &mut lives.hosts[h];
            let f = life.links[i];
            if life.liveness.heartbeat_due(i, now, f.idle()) {
                self.send_control(h, i, ControlKind::Heartbeat);
            }
            let Some(lives) = self.lives() else { return };
            let life = &lives.hosts[h];
            if let Err(reason) = life.liveness.check_link(i, now, f.watched(), false) {
                let peer = life.peers[i];
                self.fail(h, Failure::Lost { peer, reason });
                return;
            }
        }
        self.arm_liveness(h);
    }

    /// Queues host `h`'s next liveness look unless one is queued: deadlines only move
    /// later (bytes arrive, links stop being watched), so a queued look is never late; it
    /// finds the true deadline when it comes.
    pub(super) fn arm_liveness(&mut self, h: Rank) {
        let now = self.now;
        let Some(lives) = self.lives() else { return };
        let life = &mut lives.hosts[h];
        if life.ending.is_some() || life.armed.is_some() {
            return;
        }
        let next = (0..life.links.len())
            .filter_map(|i| {
                let f = life.links[i];
                life.liveness.link_deadline(i, f.idle(), f.watched(), false)
            })
            .min()
            .map(|t| t.max(now));
        if let Some(t) = next {
            life.armed = Some(t);
            self.queue.push(t, Event::Liveness(h));
        }
    }

    /// After anything happened to host `h`: a worker done with its steps, or a server every
    /// worker said goodbye to, says goodbye; one that has said and heard every goodbye exits.
    pub(super) fn life_moved(&mut self, h: Rank) {
        let now = self.now;
        let done = match &self.hosts[h].endpoint {
            RankEndpoint::Worker(_) => self.sequencers.get(h).is_some_and(|t| t.finished()),
            RankEndpoint::Server(_) => {
                (self.lives.as_ref()).is_some_and(|l| l.hosts[h].heard == l.hosts[h].links.len())
            }
        };
        let Some(lives) = self.lives() else { return };
        let life = &mut lives.hosts[h];
        if life.ending.is_some() {
            return;
        }
        if done && !life.leaving {
            life.leaving = true;
            for i in 0..life.links.len() {
                if let Some(lives) = self.lives() {
                    lives.hosts[h].links[i].goodbye_sent = true;
                }
                self.send_control(h, i, ControlKind::Goodbye);
            }
        }
        let Some(lives) = self.lives() else { return };
        let life = &mut lives.hosts[h];
        if life.leaving
            && life.heard == life.links.len()
            && life.links.iter().all(|f| f.goodbye_received)
        {
            life.ending = Some(Ending::Finished { at_ns: now });
            self.close_all(h);
        }
        self.arm_liveness(h);
    }

    /// What the faults did, once the queue ran dry: a process still running hung.
    pub(super) fn fault_report(&mut self) -> Option<FaultReport> {
        let digest = self.values_digest();
        let seed = self.cfg.seed;
        let lives = self.lives.take()?;
        let endings: Vec<Ending> = (lives.hosts.into_iter())
            .map(|l| l.ending.unwrap_or(Ending::Hung))
            .collect();
        Some(FaultReport {
            seed,
            strikes: lives.strikes,
            completed: endings.iter().all(|e| matches!(e, Ending::Finished { .. })),
            endings,
            values_digest: digest,
            heartbeats: lives.heartbeats,
        })
    }

    /// FNV-1a over the bits of every value every worker holds at the end.
    fn values_digest(&mut self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let keys = self.keys.len();
        for host in &mut self.hosts {
            let RankEndpoint::Worker(ep) = &mut host.endpoint else {
                continue;
            };
            for key in 0..keys {
                for v in ep.take_values(key) {
                    for b in v.to_bits().to_le_bytes() {
                        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                    }
                }
            }
        }
        hash
    }
}
