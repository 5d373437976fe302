//! DLCP with its Probes, Stops and Missing bitmaps as datagrams, on a virtual clock: any of
//! them may be lost, and the senders' probe timers recover each within a probe timeout.

use super::endpoint_tests::{exact, Cluster};
use super::probe::{PROBE_CEIL_NS, PROBE_DEFAULT_NS};
use super::tally::packets_needed;
use super::*;
use crate::net::SplitMix64;
use crate::strategy::{Rank, WorkerEvent};
use crate::wire::{FrameKind, Header};

/// A [`Cluster`] on a clock: time jumps to the next timer whenever nothing moves.
struct Timed {
    c: Cluster,
    now: u64,
}

impl Timed {
    fn new(workers: usize, sizes: &[usize], opts: DlcpOptions) -> Self {
        let opts = DlcpOptions {
            control_datagrams: true,
            ..opts
        };
        Self {
            c: Cluster::new(workers, sizes, opts),
            now: 0,
        }
    }

    /// Moves every frame ready now (those `lose` picks, loss-tolerant only, never arrive);
    /// returns whether any moved.
    fn pump(&mut self, lose: &mut dyn FnMut(Rank, &Header) -> bool) -> bool {
        self.c.pump(lose) > 0
    }

    /// The earliest timer of any endpoint.
    fn next_timer(&self) -> Option<u64> {
        let workers = self.c.workers.iter().filter_map(|w| w.poll_timeout());
        workers.chain(self.c.server.poll_timeout()).min()
    }

    /// Runs the step begun until every worker is done, jumping the clock to each timer
    /// when nothing moves; the time it took, or `None` if it hung (no frame, no timer, or
    /// a minute of virtual time).
    fn run_step(&mut self, lose: &mut dyn FnMut(Rank, &Header) -> bool) -> Option<u64> {
        let start = self.now;
        let give_up = start + 60_000_000_000;
        let mut done = vec![false; self.c.workers.len()];
        loop {
            while self.pump(lose) {}
            for (w, d) in self.c.workers.iter_mut().zip(&mut done) {
                while let Some(ev) = w.poll_event() {
                    match ev {
                        WorkerEvent::ParamsReady(k) => drop(w.take_values(k)),
                        WorkerEvent::StepDone => *d = true,
                        WorkerEvent::GradReady(_) => panic!("a parameter-server worker"),
                    }
                }
            }
            if done.iter().all(|&d| d) {
                return Some(self.now - start);
            }
            let at = self.next_timer().filter(|&at| at < give_up)?;
            self.now = self.now.max(at);
            for w in &mut self.c.workers {
                w.handle_timeout(self.now);
            }
            self.c.server.handle_timeout(self.now);
        }
    }

    /// Goes on after a step (timers and frames, at most 20 timeouts) until no endpoint
    /// has a frame to send or wants a timer; whether it came to that.
    fn settle(&mut self, lose: &mut dyn FnMut(Rank, &Header) -> bool) -> bool {
        for _ in 0..20 {
            while self.pump(lose) {}
            if self.settled(lose) {
                return true;
            }
            self.now = self.next_timer().unwrap_or(self.now);
        }
        false
    }

    /// Whether no endpoint has a frame to send (any it has are sent, `lose` picking the
    /// lost) or wants a timer, told the time first.
    fn settled(&mut self, lose: &mut dyn FnMut(Rank, &Header) -> bool) -> bool {
        for w in &mut self.c.workers {
            w.handle_timeout(self.now);
        }
        self.c.server.handle_timeout(self.now);
        !self.pump(lose) && self.next_timer().is_none()
    }
}

/// Control frames are loss-tolerant datagrams, and the receivers take them as such.
#[test]
fn control_frames_travel_as_loss_tolerant_datagrams() {
    let mut c = Timed::new(1, &[8], exact(2));
    c.run_step(&mut |_, h| h.kind == FrameKind::Push && h.offset == 2 && h.sequence < 5)
        .expect("the step completes");
    let control: Vec<&Header> = (c.c.sent.iter().map(|(_, h)| h))
        .filter(|h| {
            matches!(
                h.kind,
                FrameKind::Probe | FrameKind::Stop | FrameKind::Missing
            )
        })
        .collect();
    let kinds = |k| control.iter().filter(|h| h.kind == k).count();
    assert!(kinds(FrameKind::Probe) >= 2 && kinds(FrameKind::Missing) >= 1);
    assert!(kinds(FrameKind::Stop) >= 1);
    for h in control {
        assert!(h.flags.is_loss_tolerant(), "{h:?}");
        let to_server = h.kind == FrameKind::Probe;
        let accepts = if to_server {
            c.c.server.accepts_loss(0, h)
        } else {
            c.c.workers[0].accepts_loss(1, h)
        };
        assert!(accepts, "{h:?}");
    }
}

/// A lost Probe, a lost Missing: the share completes one probe timeout later (with no
/// network delay, exactly then), never a retransmission timeout.
#[test]
fn a_lost_probe_or_missing_costs_one_probe_timeout() {
    for lost in [FrameKind::Probe, FrameKind::Missing] {
        let mut c = Timed::new(1, &[8], exact(2));
        let mut once = [false; 2];
        let took = c
            .run_step(&mut |_, h| {
                let first = |i: usize, once: &mut [bool; 2]| !std::mem::replace(&mut once[i], true);
                match h.kind {
                    FrameKind::Push if h.offset == 4 => first(0, &mut once),
                    k if k == lost => first(1, &mut once),
                    _ => false,
                }
            })
            .expect("the step completes");
        assert_eq!(took, PROBE_DEFAULT_NS, "{lost:?}");
        assert!(c.settled(&mut |_, _| false), "{lost:?}: stopped");
    }
}

/// Lost Stops: the parameters come reliably, so the step ends; the worker's share is
/// stopped by the answer to a later Probe, each lost Stop costing one (backed-off) probe
/// timeout, and then no timer is left running.
#[test]
fn lost_stops_are_recovered_by_the_next_probe() {
    let mut c = Timed::new(1, &[8], exact(2));
    let mut stops = 0;
    let mut lose = |_: Rank, h: &Header| {
        let lost = h.kind == FrameKind::Stop && stops < 3;
        stops += usize::from(h.kind == FrameKind::Stop);
        lost
    };
    assert_eq!(c.run_step(&mut lose), Some(0));
    assert!(c.settle(&mut lose), "the share was stopped");
    assert_eq!(c.now, PROBE_DEFAULT_NS * (1 + 2 + 4));
    assert_eq!(stops, 4, "the fourth Stop arrived, and no Probe after it");
}

/// With a pull bound, a lost parameter Probe of the server's is sent again after its
/// timeout, and the worker's lost Stop is answered again at the next one.
#[test]
fn a_lost_pull_probe_is_sent_again() {
    let mut c = Timed::new(
        1,
        &[8],
        DlcpOptions {
            pull_loss_bound: 0.25,
            ..exact(2)
        },
    );
    let mut once = [false; 3];
    let mut lose = |from: Rank, h: &Header| {
        let mut first = |i: usize| !std::mem::replace(&mut once[i], true);
        match (from, h.kind) {
            (1, FrameKind::Params) if h.offset == 4 => first(0),
            (1, FrameKind::Probe) => first(1),
            (0, FrameKind::Stop) => first(2),
            _ => false,
        }
    };
    assert_eq!(c.run_step(&mut lose), Some(PROBE_DEFAULT_NS));
    assert!(c.settle(&mut lose), "the server's sends were stopped");
    assert_eq!(c.now, PROBE_DEFAULT_NS + PROBE_DEFAULT_NS);
    assert!(once.iter().all(|&o| o), "each loss happened");
}

/// Random loss of every datagram, control included, at up to half: no step hangs, each
/// completes within a bounded time, and no share is aggregated with more packets missing
/// than the bound allows (pushes) nor handed over with more stale ones (pulls).
#[test]
fn random_loss_of_control_never_hangs_and_keeps_the_bound() {
    let sizes = [37, 5, 100];
    let packet = 4;
    for seed in 0..120u64 {
        let loss = [0.05, 0.2, 0.5][seed as usize % 3];
        let opts = DlcpOptions {
            loss_bound: [0.0, 0.1, 0.3][(seed as usize / 3) % 3],
            pull_loss_bound: if seed % 2 == 0 { 0.0 } else { 0.2 },
            packet_elems: packet,
            ..DlcpOptions::default()
        };
        let workers = 3;
        let mut c = Timed::new(workers, &sizes, opts);
        let mut rng = SplitMix64::new(seed);
        let mut filled_before = vec![0; sizes.len()];
        for step in 0..4 {
            if step > 0 {
                c.c.begin(step);
            }
            let took = c.run_step(&mut |_, _| rng.chance(loss));
            let took = took.unwrap_or_else(|| panic!("seed {seed} step {step}: hung"));
            assert!(
                took < 200 * PROBE_CEIL_NS,
                "seed {seed} step {step}: {took} ns"
            );
            for (key, loss) in c.c.server.key_loss().iter().enumerate() {
                let n = sizes[key].div_ceil(packet);
                let allowed = n - packets_needed(n, opts.loss_bound_ppm());
                let filled = loss.filled - filled_before[key];
                assert!(
                    filled <= (workers * allowed * packet) as u64,
                    "seed {seed} step {step} key {key}: {filled} values filled"
                );
                filled_before[key] = loss.filled;
            }
        }
        let stale: u64 = (c.c.workers.iter())
            .filter_map(|w| w.loss_stats())
            .map(|s| s.entries_stale)
            .sum();
        let per_step: usize = (sizes.iter())
            .map(|&n| n.div_ceil(packet))
            .map(|n| n - packets_needed(n, opts.pull_loss_bound_ppm()))
            .sum();
        assert!(
            stale <= (3 * workers * per_step * packet) as u64,
            "seed {seed}: {stale} stale values (the first step is exact)"
        );
    }
}
