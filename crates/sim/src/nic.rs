//! A host's full-duplex network interface, as the core's network model sees it: an egress
//! [`Port`] (send window, queue, paths, loss, retransmission) and, when the profile models
//! the receiver's downlink, an ingress [`Port`].

use syncopate_core::net::{Nanos, NetCounters, NetworkProfile, Port};

/// One host's NIC: the driver's wake-up times first, then the ports (`repr(C)`: a reopened
/// send window reads its wake-up and the egress port together).
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct Nic {
    /// A wake-up is scheduled at this time (to refill the window).
    pub wake_at: Option<u64>,
    /// A poll of the egress (index 0) or ingress (1) port is scheduled at this time.
    pub poll_at: [Option<Nanos>; 2],
    /// Egress: frames serialise one after another per path, then travel the latency.
    pub egress: Port,
    /// Ingress: arriving frames queue and serialise again at the receiver (when modelled).
    pub ingress: Option<Port>,
}

impl Nic {
    /// The NIC of host `host` under `profile`, its random streams from `seed` (the report
    /// counts per host, so its ports keep no per-flow counters).
    pub fn new(profile: &NetworkProfile, seed: u64, host: u64) -> Self {
        let ingress = || Port::ingress(profile, seed, host).without_flow_counters();
        Self {
            egress: Port::egress(profile, seed, host).without_flow_counters(),
            ingress: profile.ingress.then(ingress),
            wake_at: None,
            poll_at: [None; 2],
        }
    }

    /// The egress (`ingress == false`) or ingress port.
    pub fn port(&mut self, ingress: bool) -> Option<&mut Port> {
        if ingress {
            self.ingress.as_mut()
        } else {
            Some(&mut self.egress)
        }
    }

    /// Counters of both directions together.
    pub fn counters(&self) -> NetCounters {
        let mut c = self.egress.counters();
        if let Some(i) = &self.ingress {
            c.add(&i.counters());
        }
        c
    }
}
