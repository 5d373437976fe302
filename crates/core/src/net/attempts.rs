//! Which random draws decide a frame's loss: a key that is a pure function of the frame's
//! identity (its flow, step, packet and attempt), so that with the path's seed every run
//! loses the same packets, whatever order frames reach the port in (the runtime's arrival
//! order depends on timing; the simulator's does not).

use std::collections::HashMap;

use super::rng::hash;
use super::FrameIdentity;

/// Steps of attempts remembered behind the newest step seen (a frame of an older step is
/// late: its endpoint ignores it, whatever its attempt number).
const KEEP_STEPS: u64 = 2;

/// Most identities remembered at once: beyond it the table starts afresh (a bound on what
/// frames can make it hold, whoever numbers their steps).
const MAX_REMEMBERED: usize = 1 << 20;

/// Per frame identity on a port, how many times it has been offered: a loss-tolerant
/// packet resent after a probe is a new attempt, with draws of its own.
#[derive(Debug, Clone, Default)]
pub(crate) struct Attempts {
    seen: HashMap<(u64, FrameIdentity), u32>,
    newest_step: u64,
}

impl Attempts {
    /// The draw key of the next offer of `identity` on `flow`: `hash(flow, step, packet,
    /// attempt)`, the attempt counting that identity's earlier offers on the flow.
    pub(crate) fn draw_key(&mut self, flow: u64, identity: FrameIdentity) -> u64 {
        if identity.step > self.newest_step {
            self.newest_step = identity.step;
            let oldest = identity.step.saturating_sub(KEEP_STEPS);
            self.seen.retain(|(_, id), _| id.step >= oldest);
        }
        if self.seen.len() >= MAX_REMEMBERED {
            self.seen.clear();
        }
        let count = self.seen.entry((flow, identity)).or_insert(0);
        let attempt = *count;
        *count = count.saturating_add(1);
        draw_key(flow, identity, attempt)
    }
}

/// The draw key of attempt `attempt` of `identity` on `flow`.
pub(crate) fn draw_key(flow: u64, identity: FrameIdentity, attempt: u32) -> u64 {
    hash(&[flow, identity.step, identity.packet, u64::from(attempt)])
}
