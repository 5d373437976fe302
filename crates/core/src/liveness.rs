//! Liveness: when a process sends a heartbeat, when it declares a peer lost, when a worker
//! gives up on a stalled protocol, and what an error does to the other processes.
//!
//! Both drivers follow these rules: the runtime with its clock, the simulator with virtual
//! time (and its seeded faults, `syncopate_sim::faults`), so that a crash, a freeze or a
//! partition ends a simulated job the way it ends a real one. Times are nanoseconds from any
//! origin the driver chooses; nothing here reads a clock.
//!
//! The rules:
//! - a link on which nothing has been written for [`LivenessConfig::heartbeat_ns`], and
//!   nothing waits to be written, gets a heartbeat (until the process says goodbye on it);
//! - a peer from which nothing has arrived for longer than
//!   [`LivenessConfig::peer_timeout_ns`] is lost ([`LostReason::Silent`]), and so is one to
//!   which bytes have waited that long without any being written ([`LostReason::NotReading`]);
//!   a link stops being watched once its peer said goodbye or the connection closed;
//! - a closed connection without a goodbye loses the peer at once ([`LostReason::Closed`]);
//! - a worker whose step synchronisation has not moved for
//!   [`LivenessConfig::stall_timeout_ns`] although every peer is alive gives up
//!   ([`StallWatch`]);
//! - a process that stops on an error tells every peer why (an Abort frame carrying its
//!   error) and closes its connections; a process that receives an Abort stops, naming the
//!   sender and carrying the sender's reason ([`Failure::Aborted`]), and tells its own peers
//!   the same way. So the rank that was lost first is named everywhere.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::strategy::Rank;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

/// Timing of the liveness rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivenessConfig {
    /// Send a heartbeat on a link after this long without writing anything on it.
    pub heartbeat_ns: u64,
    /// Declare a peer lost after this long without receiving anything from it.
    pub peer_timeout_ns: u64,
    /// A worker gives up when its step's synchronisation has not moved for this long
    /// although every peer is alive; `None`: never.
    pub stall_timeout_ns: Option<u64>,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            heartbeat_ns: 500 * MS,
            peer_timeout_ns: 5 * SEC,
            stall_timeout_ns: Some(120 * SEC),
        }
    }
}

impl LivenessConfig {
    /// The rules for a peer timeout of `peer_timeout_ns`: a heartbeat every fifth of it, at
    /// most every 500 ms, so that a few lost heartbeats never look like a lost peer.
    pub fn with_peer_timeout(self, peer_timeout_ns: u64) -> Self {
        Self {
            heartbeat_ns: (peer_timeout_ns / 5).min(500 * MS),
            peer_timeout_ns,
            ..self
        }
    }

    /// The default stall timeout of a job whose model has `params` f32 parameters on links
    /// of `bandwidth_bps` (unlimited: `None`): 120 s plus four transfers of the model.
    pub fn default_stall_timeout_ns(params: usize, bandwidth_bps: Option<f64>) -> u64 {
        let transfer_s = bandwidth_bps.map_or(0.0, |bps| params as f64 * 32.0 / bps);
        // An absurd model or rate saturates rather than wrapping.
        (120 * SEC).saturating_add((4.0 * transfer_s * 1e9).min(u64::MAX as f64 / 2.0) as u64)
    }
}

/// Why a peer was declared lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// Nothing arrived from it for this long.
    Silent {
        /// The peer timeout, in nanoseconds.
        for_ns: u64,
    },
    /// Bytes for it waited this long without any being written (it stopped reading).
    NotReading {
        /// The peer timeout, in nanoseconds.
        for_ns: u64,
    },
    /// Its connection closed without a goodbye.
    Closed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Silent { for_ns } => write!(
                f,
                "no frame for {:.1} s (process hung or network down)",
                *for_ns as f64 * 1e-9
            ),
            Self::NotReading { .. } => write!(f, "it stopped reading (send stalled)"),
            Self::Closed => write!(f, "connection closed"),
        }
    }
}

/// Why a process stopped before the end of its job, as the simulator reports it (the
/// runtime's errors carry the same facts as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// It declared `peer` lost.
    Lost {
        /// Who.
        peer: Rank,
        /// Why.
        reason: LostReason,
    },
    /// `peer` told it that it stopped, because of `cause`.
    Aborted {
        /// The peer whose Abort arrived.
        peer: Rank,
        /// What stopped that peer.
        cause: Box<Failure>,
    },
    /// Its step's synchronisation did not move for this long although every peer was alive.
    Stalled {
        /// How long it waited, in nanoseconds.
        waited_ns: u64,
    },
}

impl Failure {
    /// The rank this failure goes back to: the peer the first process to stop declared lost
    /// (`None` for a stall, which names no peer).
    pub fn root(&self) -> Option<Rank> {
        match self {
            Self::Lost { peer, .. } => Some(*peer),
            Self::Aborted { cause, .. } => cause.root(),
            Self::Stalled { .. } => None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lost { peer, reason } => write!(f, "lost rank {peer}: {reason}"),
            Self::Aborted { peer, cause } => write!(f, "rank {peer} aborted: {cause}"),
            Self::Stalled { waited_ns } => write!(
                f,
                "stalled: nothing of the step's synchronisation arrived for {:.0} s although \
                 every peer is alive",
                *waited_ns as f64 * 1e-9
            ),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct LinkClock {
    last_recv: u64,
    last_written: u64,
}

/// The liveness clocks of one process's links, indexed as the driver indexes its links.
#[derive(Debug, Clone)]
pub struct Liveness {
    config: LivenessConfig,
    links: Vec<LinkClock>,
}

impl Liveness {
    /// Clocks for `links` links, all of them heard from and written to at `now_ns`.
    pub fn new(config: LivenessConfig, links: usize, now_ns: u64) -> Self {
        let clock = LinkClock {
            last_recv: now_ns,
            last_written: now_ns,
        };
        Self {
            config,
            links: vec![clock; links],
        }
    }

    /// The timing these clocks follow.
    pub fn config(&self) -> &LivenessConfig {
        &self.config
    }

    /// Bytes arrived on link `link`.
    pub fn handle_received(&mut self, link: usize, now_ns: u64) {
        if let Some(l) = self.links.get_mut(link) {
            l.last_recv = l.last_recv.max(now_ns);
        }
    }

    /// Bytes were written on link `link` (a frame, part of one, or a heartbeat).
    pub fn handle_written(&mut self, link: usize, now_ns: u64) {
        if let Some(l) = self.links.get_mut(link) {
            l.last_written = l.last_written.max(now_ns);
        }
    }

    /// Whether link `link` needs a heartbeat now. `idle`: nothing waits to be written on it
    /// and the process has not said goodbye on it.
    pub fn heartbeat_due(&self, link: usize, now_ns: u64, idle: bool) -> bool {
        idle && self
            .links
            .get(link)
            .is_some_and(|l| now_ns.saturating_sub(l.last_written) >= self.config.heartbeat_ns)
    }

    /// Whether link `link`'s peer is still alive at `now_ns`. `watched`: the connection is
    /// open and the peer has not said goodbye; `backlog`: bytes wait to be written to it.
    pub fn check_link(
        &self,
        link: usize,
        now_ns: u64,
        watched: bool,
        backlog: bool,
    ) -> Result<(), LostReason> {
        let Some(l) = self.links.get(link).filter(|_| watched) else {
            return Ok(());
        };
        let timeout = self.config.peer_timeout_ns;
        if now_ns.saturating_sub(l.last_recv) > timeout {
            return Err(LostReason::Silent { for_ns: timeout });
        }
        if backlog && now_ns.saturating_sub(l.last_written) > timeout {
            return Err(LostReason::NotReading { for_ns: timeout });
        }
        Ok(())
    }

    /// The next time link `link` needs looking at: its heartbeat (when `idle`, as for
    /// [`Self::heartbeat_due`]) or the first instant its peer would be lost (when
    /// `watched`, with or without a `backlog`, as for [`Self::check_link`]).
    pub fn link_deadline(
        &self,
        link: usize,
        idle: bool,
        watched: bool,
        backlog: bool,
    ) -> Option<u64> {
        let l = self.links.get(link)?;
        let timeout = self.config.peer_timeout_ns.saturating_add(1);
        let heartbeat = idle.then(|| l.last_written.saturating_add(self.config.heartbeat_ns));
        let silent = watched.then(|| l.last_recv.saturating_add(timeout));
        let not_reading = (watched && backlog).then(|| l.last_written.saturating_add(timeout));
        heartbeat.into_iter().chain(silent).chain(not_reading).min()
    }

    /// The latest time anything moved on any link (for a driver's busy polling).
    pub fn last_activity(&self) -> Option<u64> {
        self.links
            .iter()
            .map(|l| l.last_recv.max(l.last_written))
            .max()
    }
}

/// A worker's protocol-stall watchdog: how long its step's synchronisation may stay still
/// although every peer is alive.
#[derive(Debug, Clone, Copy)]
pub struct StallWatch {
    limit_ns: Option<u64>,
    since: u64,
}

impl StallWatch {
    /// A watchdog with the limit of `config`, started at `now_ns`.
    pub fn new(config: &LivenessConfig, now_ns: u64) -> Self {
        Self {
            limit_ns: config.stall_timeout_ns,
            since: now_ns,
        }
    }

    /// The synchronisation moved (a message of the step arrived) at `now_ns`.
    pub fn handle_progress(&mut self, now_ns: u64) {
        self.since = self.since.max(now_ns);
    }

    /// The stall, if the synchronisation has not moved for longer than the limit at `now_ns`.
    pub fn poll_stalled(&self, now_ns: u64) -> Option<Failure> {
        let waited_ns = now_ns.saturating_sub(self.since);
        (self.limit_ns? < waited_ns).then_some(Failure::Stalled { waited_ns })
    }

    /// When the watchdog fires if nothing moves.
    pub fn poll_timeout(&self) -> Option<u64> {
        Some(self.since.saturating_add(self.limit_ns?).saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LivenessConfig {
        LivenessConfig {
            heartbeat_ns: 100,
            peer_timeout_ns: 1_000,
            stall_timeout_ns: Some(10_000),
        }
    }

    #[test]
    fn an_idle_link_gets_a_heartbeat_after_the_interval_and_not_before() {
        let mut l = Liveness::new(config(), 2, 0);
        assert!(!l.heartbeat_due(0, 99, true));
        assert!(l.heartbeat_due(0, 100, true));
        assert!(!l.heartbeat_due(0, 100, false), "frames wait: no heartbeat");
        l.handle_written(0, 100);
        assert!(!l.heartbeat_due(0, 150, true));
        assert_eq!(l.link_deadline(0, true, false, false), Some(200));
        assert!(l.heartbeat_due(1, 150, true), "links are clocked apart");
    }

    #[test]
    fn the_heartbeat_follows_the_peer_timeout() {
        let c = LivenessConfig::default().with_peer_timeout(SEC);
        assert_eq!((c.heartbeat_ns, c.peer_timeout_ns), (200 * MS, SEC));
        let c = LivenessConfig::default().with_peer_timeout(60 * SEC);
        assert_eq!(c.heartbeat_ns, 500 * MS);
        let big = LivenessConfig::default_stall_timeout_ns(usize::MAX, Some(1.0));
        assert!(big > 120 * SEC);
        assert_eq!(LivenessConfig::default_stall_timeout_ns(1, None), 120 * SEC);
    }

    #[test]
    fn a_silent_peer_is_lost_just_past_the_timeout() {
        let mut l = Liveness::new(config(), 1, 0);
        assert_eq!(l.check_link(0, 1_000, true, false), Ok(()));
        assert_eq!(
            l.check_link(0, 1_001, true, false),
            Err(LostReason::Silent { for_ns: 1_000 })
        );
        assert_eq!(l.check_link(0, 1_001, false, false), Ok(()), "unwatched");
        assert_eq!(l.link_deadline(0, false, true, false), Some(1_001));
        assert_eq!(l.link_deadline(0, false, false, true), None);
        l.handle_received(0, 900);
        assert_eq!(l.check_link(0, 1_500, true, false), Ok(()));
    }

    #[test]
    fn a_peer_that_stops_reading_is_lost_only_with_a_backlog() {
        let mut l = Liveness::new(config(), 1, 0);
        l.handle_received(0, 2_000);
        assert_eq!(l.check_link(0, 2_000, true, false), Ok(()));
        assert_eq!(
            l.check_link(0, 2_000, true, true),
            Err(LostReason::NotReading { for_ns: 1_000 })
        );
    }

    #[test]
    fn the_stall_watch_fires_past_its_limit_and_never_without_one() {
        let mut s = StallWatch::new(&config(), 0);
        assert_eq!(s.poll_stalled(10_000), None);
        assert_eq!(
            s.poll_stalled(10_001),
            Some(Failure::Stalled { waited_ns: 10_001 })
        );
        s.handle_progress(5_000);
        assert_eq!(s.poll_stalled(10_001), None);
        assert_eq!(s.poll_timeout(), Some(15_001));
        let never = LivenessConfig {
            stall_timeout_ns: None,
            ..config()
        };
        assert_eq!(StallWatch::new(&never, 0).poll_stalled(u64::MAX), None);
    }

    proptest::proptest! {
        /// Whatever arrives when, a watched peer is lost exactly from one nanosecond past
        /// the timeout after its last byte, the deadline says that instant, and a heartbeat
        /// is due exactly from one interval after the last write.
        #[test]
        fn loss_and_heartbeats_fall_exactly_on_their_deadlines(
            gaps in proptest::collection::vec((0u64..3_000, proptest::bool::ANY), 0..40),
        ) {
            let mut l = Liveness::new(config(), 1, 0);
            let (mut now, mut last_recv, mut last_written) = (0u64, 0u64, 0u64);
            for (gap, received) in gaps {
                now += gap;
                if received {
                    l.handle_received(0, now);
                    last_recv = now;
                } else {
                    l.handle_written(0, now);
                    last_written = now;
                }
                let lost_at = last_recv + 1_001;
                proptest::prop_assert_eq!(l.link_deadline(0, false, true, false), Some(lost_at));
                proptest::prop_assert!(l.check_link(0, lost_at - 1, true, false).is_ok());
                proptest::prop_assert!(l.check_link(0, lost_at, true, false).is_err());
                proptest::prop_assert_eq!(l.check_link(0, now, true, false).is_err(), now >= lost_at);
                let beat_at = last_written + 100;
                proptest::prop_assert!(!l.heartbeat_due(0, beat_at - 1, true));
                proptest::prop_assert!(l.heartbeat_due(0, beat_at, true));
                proptest::prop_assert_eq!(
                    l.link_deadline(0, true, true, false),
                    Some(beat_at.min(lost_at))
                );
            }
        }
    }

    #[test]
    fn an_abort_carries_the_rank_lost_first() {
        let lost = Failure::Lost {
            peer: 3,
            reason: LostReason::Closed,
        };
        let relayed = Failure::Aborted {
            peer: 1,
            cause: Box::new(Failure::Aborted {
                peer: 2,
                cause: Box::new(lost),
            }),
        };
        assert_eq!(relayed.root(), Some(3));
        assert_eq!(
            relayed.to_string(),
            "rank 1 aborted: rank 2 aborted: lost rank 3: connection closed"
        );
    }
}
