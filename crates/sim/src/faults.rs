//! Seeded fault injection, TigerBeetle-style: crashes, freezes, a partitioned link, lost or
//! late heartbeats and delayed control frames, each an option that defaults to off, all drawn
//! from the job's one seed (`--seed`), so a failing run is reproduced by its seed alone.
//!
//! With any fault on, every process also runs core's liveness rules
//! ([`syncopate_core::liveness`]) as the runtime does: heartbeats on idle links, the peer
//! timeout, goodbyes at the end, and an Abort to every peer when it stops on an error. The
//! report then says how each process ended ([`Ending`]), and the run checks what the runtime
//! promises: every process that was not itself hit either finishes with the exact result or
//! stops naming the rank that was lost, within the peer timeout plus the time the news takes
//! to travel; none hangs.

use std::fmt;

use serde::{Deserialize, Serialize};
use syncopate_core::liveness::{Failure, LivenessConfig};
use syncopate_core::strategy::Rank;

use crate::rng::Jitter;
use crate::SimConfig;
use syncopate_core::strategy::FRAME_ELEMS;

const MS: u64 = 1_000_000;

/// Which faults strike a simulated job, and when. Every fault is off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultConfig {
    /// Probability that each process is killed (its connections close at once) at a time
    /// drawn uniformly from `[0, window_ns)`.
    pub crash: f64,
    /// Probability that each process freezes (stops answering; its connections stay open,
    /// as under SIGSTOP).
    pub freeze: f64,
    /// Probability that each link is cut in both directions (nothing, not even a close,
    /// gets through) from a time drawn as for crashes.
    pub partition: f64,
    /// Fraction of heartbeats lost on the way. Goodbyes and Aborts share the reliable
    /// stream with the data and are only delayed.
    pub heartbeat_loss: f64,
    /// Largest extra delay of a control frame (heartbeat, goodbye, abort, close), drawn
    /// uniformly per frame; a link's control frames stay in order.
    pub control_delay_ns: u64,
    /// Faults strike at a time drawn uniformly from `[0, window_ns)` of virtual time; one
    /// drawn after the job's end does nothing.
    pub window_ns: u64,
    /// Heartbeat interval, peer timeout and stall watchdog of every process (the runtime's
    /// defaults unless set).
    pub liveness: LivenessConfig,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            crash: 0.0,
            freeze: 0.0,
            partition: 0.0,
            heartbeat_loss: 0.0,
            control_delay_ns: 0,
            window_ns: 1_000 * MS,
            liveness: LivenessConfig::default(),
        }
    }
}

impl FaultConfig {
    /// Whether any fault is on (and so the liveness rules run).
    pub fn enabled(&self) -> bool {
        self.crash > 0.0
            || self.freeze > 0.0
            || self.partition > 0.0
            || self.heartbeat_loss > 0.0
            || self.control_delay_ns > 0
    }

    /// Refuses probabilities outside [0, 1], a zero window or peer timeout, and a heartbeat
    /// slower than the peer timeout.
    pub fn validate(&self) -> Result<(), String> {
        for (name, p) in [
            ("crash", self.crash),
            ("freeze", self.freeze),
            ("partition", self.partition),
            ("heartbeat-loss", self.heartbeat_loss),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("--fault-{name} {p} is not a probability in [0, 1]"));
            }
        }
        if self.window_ns == 0 {
            return Err("--fault-window must be positive".into());
        }
        let l = &self.liveness;
        if l.peer_timeout_ns == 0 || l.heartbeat_ns == 0 || l.heartbeat_ns >= l.peer_timeout_ns {
            return Err(format!(
                "the heartbeat ({} ns) must be positive and shorter than the peer timeout ({} ns)",
                l.heartbeat_ns, l.peer_timeout_ns
            ));
        }
        Ok(())
    }
}

/// How late a process of `config`'s job may stop after the rank it names was hit: the
/// peer timeout after the last byte that was already on its way from that rank arrived (a
/// send window and a frame from each host that can queue ahead at an ingress port), plus
/// one control frame's trip per process for the news to travel.
pub fn stop_bound_ns(config: &SimConfig) -> u64 {
    let net = &config.network;
    let hosts = (config.workers + config.servers) as u64;
    let hop = (net.latency_ns)
        .saturating_add(config.faults.control_delay_ns)
        .saturating_add(1);
    let queued = (net.buffer_bytes + config.wire_bytes(config.scaled(FRAME_ELEMS))) as f64;
    let senders = if net.ingress { hosts as f64 } else { 1.0 };
    let drain = net
        .bandwidth_bps
        .map_or(0.0, |bps| senders * queued * 8.0 / bps * 1e9);
    (config.faults.liveness.peer_timeout_ns)
        .saturating_add(1)
        .saturating_add(net.latency_ns)
        .saturating_add(drain.min(u64::MAX as f64 / 4.0) as u64)
        .saturating_add(hosts.saturating_mul(hop))
}

/// One fault of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The process is killed.
    Crash(Rank),
    /// The process stops answering.
    Freeze(Rank),
    /// Nothing passes between the two processes any more.
    Partition(Rank, Rank),
}

impl Fault {
    /// The ranks the fault hits (one whose loss may be named).
    pub fn ranks(&self) -> Vec<Rank> {
        match *self {
            Self::Crash(r) | Self::Freeze(r) => vec![r],
            Self::Partition(a, b) => vec![a, b],
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Crash(r) => write!(f, "rank {r} crashes"),
            Self::Freeze(r) => write!(f, "rank {r} freezes"),
            Self::Partition(a, b) => write!(f, "the link {a}-{b} is cut"),
        }
    }
}

/// A fault and when it strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strike {
    /// Virtual time, ns.
    pub at_ns: u64,
    /// What happens.
    pub fault: Fault,
}

/// The faults of a run, in time order, drawn from the seed: each process crashes or freezes
/// with its probability, each link (`links`, each pair once) is cut with its own.
pub(crate) fn draw_strikes(cfg: &FaultConfig, seed: u64, hosts: usize) -> Vec<Strike> {
    let mut rng = Jitter::new(seed, u64::MAX, 0.0);
    let time = |rng: &mut Jitter| (rng.unit() * cfg.window_ns as f64) as u64;
    let mut strikes = Vec::new();
    for rank in 0..hosts {
        // Every draw is made whatever the probabilities, so one knob does not move the
        // others' faults.
        let (crash, freeze) = (rng.unit(), rng.unit());
        let at_ns = time(&mut rng);
        if crash < cfg.crash {
            strikes.push(Strike {
                at_ns,
                fault: Fault::Crash(rank),
            });
        } else if freeze < cfg.freeze {
            strikes.push(Strike {
                at_ns,
                fault: Fault::Freeze(rank),
            });
        }
    }
    if cfg.partition > 0.0 {
        for a in 0..hosts {
            for b in a + 1..hosts {
                let (cut, at_ns) = (rng.unit(), time(&mut rng));
                if cut < cfg.partition {
                    strikes.push(Strike {
                        at_ns,
                        fault: Fault::Partition(a, b),
                    });
                }
            }
        }
    }
    strikes.sort_by_key(|s| s.at_ns);
    strikes
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ending {
    /// It finished every step and exchanged goodbyes with every peer.
    Finished {
        /// When, virtual ns.
        at_ns: u64,
    },
    /// A fault killed it.
    Crashed {
        /// When, virtual ns.
        at_ns: u64,
    },
    /// A fault froze it (the runtime's launcher kills such a process once the others stop).
    Frozen {
        /// When, virtual ns.
        at_ns: u64,
    },
    /// It stopped on an error.
    Stopped {
        /// When, virtual ns.
        at_ns: u64,
        /// The error, as the runtime would print it.
        error: String,
        /// The rank the error goes back to (the one lost first), if it names one.
        names: Option<Rank>,
    },
    /// The event queue ran dry with the process still running: a hang.
    Hung,
}

impl Ending {
    pub(crate) fn stopped(at_ns: u64, failure: &Failure) -> Self {
        Self::Stopped {
            at_ns,
            error: failure.to_string(),
            names: failure.root(),
        }
    }
}

/// What the faults did to a run (in the report when any fault is on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultReport {
    /// The seed that reproduces the run.
    pub seed: u64,
    /// The faults drawn, in time order (including those that struck after the job ended).
    pub strikes: Vec<Strike>,
    /// How each process ended, by rank.
    pub endings: Vec<Ending>,
    /// Whether every process finished.
    pub completed: bool,
    /// A digest of the values every worker holds at the end (bit-exact: equal digests,
    /// equal results), to compare with a run without faults.
    pub values_digest: u64,
    /// Heartbeats sent, and lost on the way.
    pub heartbeats: (u64, u64),
}

impl FaultReport {
    /// When a fault last hit `rank` before `at_ns`.
    fn hit_before(&self, rank: Rank, at_ns: u64) -> Option<u64> {
        (self.strikes.iter())
            .filter(|s| s.at_ns <= at_ns && s.fault.ranks().contains(&rank))
            .map(|s| s.at_ns)
            .max()
    }

    /// Checks what the runtime promises: nobody hangs, and every process not hit by a fault
    /// itself either finished or stopped naming a rank some fault hit, no later than
    /// `bound_ns` after that rank was hit. Returns what broke it, ending with the seed.
    pub fn check(&self, bound_ns: u64) -> Result<(), String> {
        for (rank, ending) in self.endings.iter().enumerate() {
            let bad = match ending {
                Ending::Hung => Some("hung".to_string()),
                Ending::Stopped {
                    at_ns,
                    error,
                    names,
                } => match names.and_then(|r| self.hit_before(r, *at_ns)) {
                    None => Some(format!("stopped naming no rank a fault hit: {error}")),
                    Some(hit) if at_ns.saturating_sub(hit) > bound_ns => Some(format!(
                        "stopped {:.3} s after the rank it names was hit, later than {:.3} s: \
                         {error}",
                        at_ns.saturating_sub(hit) as f64 * 1e-9,
                        bound_ns as f64 * 1e-9
                    )),
                    Some(_) => None,
                },
                Ending::Finished { .. } | Ending::Crashed { .. } | Ending::Frozen { .. } => None,
            };
            if let Some(bad) = bad {
                return Err(format!(
                    "rank {rank} {bad}; reproduce with --seed {}",
                    self.seed
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_off_by_default_and_drawn_from_the_seed() {
        let off = FaultConfig::default();
        assert!(!off.enabled());
        assert!(draw_strikes(&off, 1, 8).is_empty());
        let cfg = FaultConfig {
            crash: 0.2,
            partition: 0.05,
            ..FaultConfig::default()
        };
        let a = draw_strikes(&cfg, 7, 16);
        assert_eq!(a, draw_strikes(&cfg, 7, 16));
        assert_ne!(a, draw_strikes(&cfg, 8, 16));
        assert!(a.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert!(a.iter().all(|s| s.at_ns < cfg.window_ns));
        let crashes = |c: &FaultConfig| {
            (0..200u64)
                .map(|seed| draw_strikes(c, seed, 10).len())
                .sum::<usize>()
        };
        let all = FaultConfig {
            crash: 1.0,
            ..FaultConfig::default()
        };
        assert_eq!(crashes(&all), 2_000);
    }

    #[test]
    fn bad_knobs_are_named() {
        let bad = |f: fn(&mut FaultConfig)| {
            let mut c = FaultConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.crash = 1.5).contains("--fault-crash"));
        assert!(bad(|c| c.heartbeat_loss = -0.1).contains("--fault-heartbeat-loss"));
        assert!(bad(|c| c.window_ns = 0).contains("--fault-window"));
        assert!(
            bad(|c| c.liveness.heartbeat_ns = c.liveness.peer_timeout_ns).contains("heartbeat")
        );
    }

    #[test]
    fn the_check_names_hangs_wrong_ranks_and_late_stops_with_the_seed() {
        let report = |endings: Vec<Ending>| FaultReport {
            seed: 42,
            strikes: vec![Strike {
                at_ns: 100,
                fault: Fault::Crash(1),
            }],
            endings,
            completed: false,
            values_digest: 0,
            heartbeats: (0, 0),
        };
        let stop = |at_ns, names| Ending::Stopped {
            at_ns,
            error: "lost rank 1".into(),
            names,
        };
        let crashed = Ending::Crashed { at_ns: 100 };
        assert_eq!(
            report(vec![stop(150, Some(1)), crashed.clone()]).check(100),
            Ok(())
        );
        let hung = report(vec![Ending::Hung, crashed.clone()]).check(100);
        assert!(hung.unwrap_err().ends_with("reproduce with --seed 42"));
        assert!(report(vec![stop(150, Some(0)), crashed.clone()])
            .check(100)
            .unwrap_err()
            .contains("no rank a fault hit"));
        assert!(report(vec![stop(201, Some(1)), crashed])
            .check(100)
            .unwrap_err()
            .contains("later than"));
    }
}
