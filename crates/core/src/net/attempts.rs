//! Which random draws decide a frame's loss: a key that is a pure function of the frame's
//! identity (its flow, step, packet and attempt), so that with the path's seed every run
//! loses the same packets, whatever order frames reach the port in (the runtime's arrival
//! order depends on timing; the simulator's does not).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::rng::{hash, mix};
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
    seen: HashMap<(u64, FrameIdentity), u32, BuildHasherDefault<WordHasher>>,
    newest_step: u64,
}

/// The hasher of [`Attempts`]' table: its keys are three 64-bit words, one of them a hash
/// already, so a multiply per word and one SplitMix64 finish replace SipHash (which was a
/// tenth of a lossy 64-worker simulation). Which entries a table holds does not depend on
/// the hasher, so neither does any draw.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        mix(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(23) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
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
