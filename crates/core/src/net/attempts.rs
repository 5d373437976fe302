//! Which random draws decide a frame's loss: a key that is a pure function of the frame's
//! identity (its flow, step, packet and attempt), so that with the path's seed every run
//! loses the same packets, whatever order frames reach the port in (the runtime's arrival
//! order depends on timing; the simulator's does not).

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
    /// One table per step still remembered, keyed by the identity's [`identity_key`] (two
    /// identities share a count only if their 64-bit keys collide).
    steps: Vec<(u64, Offers)>,
    /// Emptied tables, kept for their capacity.
    spare: Vec<Offers>,
    newest_step: u64,
    /// Identities in all the tables.
    remembered: usize,
}

/// Offers so far per identity key: open addressing with linear probing over one array, so
/// that counting an offer reads one cache line (a general hash map reads a group of control
/// bytes and then a bucket: two cache misses a frame in a 1,024-worker simulation, whose
/// ports meet a million identities a step). A key is a hash already, so its low bits place it.
#[derive(Debug, Clone, Default)]
struct Offers {
    /// `(key, offers)`, `offers == 0` where free; a power of two long, at most three
    /// quarters full.
    entries: Vec<(u64, u32)>,
    len: usize,
}

impl Offers {
    /// Counts one more offer of `key`; returns the offers before it.
    fn count(&mut self, key: u64) -> u32 {
        if (self.len + 1) * 4 > self.entries.len() * 3 {
            self.grow();
        }
        let i = self.find(key);
        let entry = &mut self.entries[i];
        if entry.1 == 0 {
            entry.0 = key;
            self.len += 1;
        }
        let before = entry.1;
        entry.1 = before.saturating_add(1);
        before
    }

    /// `key`'s entry, or the free entry where it would go.
    fn find(&self, key: u64) -> usize {
        let mask = self.entries.len() - 1;
        let mut i = key as usize & mask;
        loop {
            let (k, offers) = self.entries[i];
            if offers == 0 || k == key {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the table (at least 64 entries) and files every key again.
    fn grow(&mut self) {
        let size = (self.entries.len() * 2).max(64);
        let old = std::mem::replace(&mut self.entries, vec![(0, 0); size]);
        for entry in old.into_iter().filter(|e| e.1 != 0) {
            let i = self.find(entry.0);
            self.entries[i] = entry;
        }
    }

    /// Forgets every key, keeping the capacity.
    fn clear(&mut self) {
        self.entries.fill((0, 0));
        self.len = 0;
    }
}

impl Attempts {
    /// The draw key of the next offer of `identity` on `flow`: `hash(flow, step, packet,
    /// attempt)`, the attempt counting that identity's earlier offers on the flow.
    pub(crate) fn draw_key(&mut self, flow: u64, identity: FrameIdentity) -> u64 {
        if identity.step > self.newest_step {
            self.newest_step = identity.step;
            self.forget_before(identity.step.saturating_sub(KEEP_STEPS));
        }
        if self.remembered >= MAX_REMEMBERED {
            self.forget_before(u64::MAX);
        }
        let key = identity_key(flow, identity);
        let i = match self.steps.iter().position(|(s, _)| *s == identity.step) {
            Some(i) => i,
            None => {
                let table = self.spare.pop().unwrap_or_default();
                self.steps.push((identity.step, table));
                self.steps.len() - 1
            }
        };
        let attempt = self.steps[i].1.count(key);
        if attempt == 0 {
            self.remembered += 1;
        }
        attempt_key(key, attempt)
    }

    /// Forgets every identity of a step before `oldest`.
    fn forget_before(&mut self, oldest: u64) {
        let mut i = 0;
        while i < self.steps.len() {
            if self.steps[i].0 >= oldest {
                i += 1;
                continue;
            }
            let (_, mut table) = self.steps.swap_remove(i);
            self.remembered = self.remembered.saturating_sub(table.len);
            table.clear();
            self.spare.push(table);
        }
    }
}

/// What keys an identity's attempts on `flow`: `hash(flow, step, packet)`, which
/// [`attempt_key`] extends (`hash` folds its words one by one) to `hash(flow, step, packet,
/// attempt)`.
fn identity_key(flow: u64, identity: FrameIdentity) -> u64 {
    hash(&[flow, identity.step, identity.packet])
}

/// `hash(flow, step, packet, attempt)` from the identity's key.
fn attempt_key(identity_key: u64, attempt: u32) -> u64 {
    mix(identity_key ^ mix(u64::from(attempt)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// The draw key of attempt `attempt` of `identity` on `flow`, as it is defined.
    fn draw_key(flow: u64, identity: FrameIdentity, attempt: u32) -> u64 {
        hash(&[flow, identity.step, identity.packet, u64::from(attempt)])
    }

    #[test]
    fn the_attempt_key_extends_the_identity_key() {
        let id = FrameIdentity {
            step: 7,
            packet: 0xDEAD_BEEF,
        };
        for attempt in [0, 1, 5, u32::MAX] {
            assert_eq!(
                attempt_key(identity_key(3, id), attempt),
                draw_key(3, id, attempt)
            );
        }
    }

    #[test]
    fn steps_behind_the_newest_two_are_forgotten() {
        let mut a = Attempts::default();
        let id = |step| FrameIdentity { step, packet: 1 };
        assert_eq!(a.draw_key(0, id(1)), draw_key(0, id(1), 0));
        assert_eq!(a.draw_key(0, id(1)), draw_key(0, id(1), 1));
        a.draw_key(0, id(3));
        assert_eq!(a.draw_key(0, id(1)), draw_key(0, id(1), 2), "kept");
        a.draw_key(0, id(4));
        assert_eq!(a.draw_key(0, id(1)), draw_key(0, id(1), 0), "forgotten");
        assert_eq!(a.remembered, 3);
    }

    proptest! {
        /// The table counts as a map does, for any keys (colliding low bits included: keys
        /// that differ only above the table's mask, and a few values drawn many times).
        #[test]
        fn offers_are_counted_as_a_map_counts_them(
            keys in prop::collection::vec(
                prop_oneof![0u64..8, any::<u64>(), (0u64..64).prop_map(|k| k << 40)],
                0..400,
            ),
        ) {
            let mut table = Offers::default();
            let mut reference: HashMap<u64, u32> = HashMap::new();
            for (i, &key) in keys.iter().enumerate() {
                let before = reference.entry(key).or_insert(0);
                prop_assert_eq!(table.count(key), *before);
                *before += 1;
                prop_assert_eq!(table.len, reference.len());
                if i == keys.len() / 2 {
                    table.clear();
                    reference.clear();
                }
            }
        }
    }
}
