//! A host's full-duplex network interface: egress serialisation behind a send window (as the
//! runtime's communication loop does) and optional ingress serialisation.

use syncopate_core::net::{LinkProfile, Shaper};

/// One host's NIC.
#[derive(Debug, Clone)]
pub(crate) struct Nic {
    /// Egress: frames serialise one after another, then travel the latency.
    pub egress: Shaper,
    /// Ingress: arriving frames serialise again at the receiver (when modelled).
    pub ingress: Option<Shaper>,
    /// A wake-up is scheduled at this time (to refill the window).
    pub wake_at: Option<u64>,
}

impl Nic {
    /// A NIC of `profile`, shaping ingress too when `shape_ingress`.
    pub fn new(profile: LinkProfile, shape_ingress: bool) -> Self {
        let ingress = LinkProfile {
            latency_ns: 0,
            ..profile
        };
        Self {
            egress: Shaper::new(profile),
            ingress: shape_ingress.then(|| Shaper::new(ingress)),
            wake_at: None,
        }
    }

    /// Whether the endpoint may be asked for another frame at `now`: the bytes given to the
    /// interface and not yet serialised are below the window (always, without a bandwidth).
    pub fn has_room(&self, now: u64) -> bool {
        self.egress.backlog_bytes(now) < self.egress.profile().buffer_bytes
    }

    /// The first instant after `now` at which [`Nic::has_room`] holds (the backlog shrinks
    /// as the link serialises).
    pub fn room_at(&self, now: u64) -> u64 {
        let p = self.egress.profile();
        let free = self.egress.free_at_ns();
        let drain_ns = match p.bandwidth_bps {
            Some(bps) => ((p.buffer_bytes as f64 - 1.0) * 8e9 / bps).floor() as u64,
            None => 0,
        };
        let mut t = free.saturating_sub(drain_ns).max(now + 1);
        while !self.has_room(t) && t < free {
            t += 1;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_returns_exactly_when_the_backlog_drops_below_the_window() {
        for (bps, window) in [(1e9, 1000usize), (3e9, 4096), (7.7e9, 262_144)] {
            let profile = LinkProfile {
                bandwidth_bps: Some(bps),
                latency_ns: 10,
                buffer_bytes: window,
            };
            let mut nic = Nic::new(profile, false);
            nic.egress.schedule(0, 10 * window + 17);
            assert!(!nic.has_room(0));
            let t = nic.room_at(0);
            assert!(nic.has_room(t), "room at {t}");
            assert!(!nic.has_room(t - 1), "no room just before {t}");
        }
    }
}
