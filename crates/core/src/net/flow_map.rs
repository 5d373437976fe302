//! The flow table of a port: where the state of each of the drivers' 64-bit flow numbers is.
//!
//! Open addressing with linear probing over one array of `(flow, slot)` pairs, so that a
//! lookup reads one cache line where a general hash map reads a group of control bytes and
//! then a bucket (two cache misses per frame in a 1,024-worker simulation, whose ports hold
//! a thousand flows each).
//!
//! Drivers number a flow by its two ends (the simulator: `from << 32 | to`; the runtime: the
//! peer's rank), so the flows through one port differ in one half only, and densely: the
//! table starts a flow's probe at its two halves XOR-ed together, modulo the table's size.
//! Distinct flows of one port then start at distinct entries, and a server answering its
//! workers in rank order reads the table in order (a mixing hash scattered those reads, a
//! cache miss each). Any other numbering still works: collisions only probe further.

/// An empty entry's slot.
const EMPTY: usize = usize::MAX;

/// Flow numbers to slots (`0, 1, 2, ...` in order of first appearance).
#[derive(Debug, Clone, Default)]
pub(crate) struct FlowTable {
    /// `(flow, slot)`, `slot == EMPTY` where free; a power of two long, at most half full.
    entries: Vec<(u64, usize)>,
    len: usize,
}

/// A flow number's two halves folded together.
fn fold(flow: u64) -> u64 {
    flow ^ (flow >> 32)
}

impl FlowTable {
    /// Where `flow`'s probe starts in a table of `entries` (a power of two) entries.
    fn start(flow: u64, entries: usize) -> usize {
        fold(flow) as usize & entries.saturating_sub(1)
    }

    /// `flow`'s entry, or the free entry where it would go.
    fn find(&self, flow: u64) -> usize {
        let mask = self.entries.len() - 1;
        let mut i = Self::start(flow, self.entries.len());
        loop {
            let (f, slot) = self.entries[i];
            if slot == EMPTY || f == flow {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// `flow`'s slot, if it has one.
    pub fn get(&self, flow: u64) -> Option<usize> {
        if self.entries.is_empty() {
            return None;
        }
        let (_, slot) = self.entries[self.find(flow)];
        (slot != EMPTY).then_some(slot)
    }

    /// `flow`'s slot; a flow seen for the first time gets slot `len()`.
    pub fn slot(&mut self, flow: u64) -> usize {
        if (self.len + 1) * 2 > self.entries.len() {
            self.grow();
        }
        let i = self.find(flow);
        if self.entries[i].1 == EMPTY {
            self.entries[i] = (flow, self.len);
            self.len += 1;
        }
        self.entries[i].1
    }

    /// Number of flows.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Doubles the table (at least 8 entries) and files every flow again.
    fn grow(&mut self) {
        let size = (self.entries.len() * 2).max(8);
        let old = std::mem::replace(&mut self.entries, vec![(0, EMPTY); size]);
        for (flow, slot) in old.into_iter().filter(|e| e.1 != EMPTY) {
            let i = self.find(flow);
            self.entries[i] = (flow, slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Flows that differ only in their high half (every worker's flow into one server)
    /// spread over a table's entries.
    #[test]
    fn flows_into_one_port_spread_over_the_table() {
        let starts: std::collections::BTreeSet<usize> = (0u64..1024)
            .map(|from| FlowTable::start((from << 32) | 7, 2048))
            .collect();
        assert_eq!(starts.len(), 1024, "one entry each");
        // A port's flows in rank order start in order, block by block of 8 entries (two
        // cache lines): host 5's flow to `to` within the 8 entries from `to` rounded down.
        for to in 0..1024 {
            let start = FlowTable::start((5 << 32) | to as u64, 2048);
            assert_eq!(start / 8, to / 8, "flow to {to}");
        }
    }

    proptest! {
        /// Slots in order of first appearance, found again, for any flows (colliding ones
        /// included: a few distinct values drawn many times, and arbitrary 64-bit ones).
        #[test]
        fn slots_are_given_in_order_of_first_appearance(
            flows in prop::collection::vec(
                prop_oneof![0u64..8, any::<u64>(), (0u64..64).prop_map(|f| f << 32)],
                0..300,
            ),
        ) {
            let mut table = FlowTable::default();
            let mut reference: HashMap<u64, usize> = HashMap::new();
            for &flow in &flows {
                prop_assert_eq!(table.get(flow), reference.get(&flow).copied());
                let next = reference.len();
                let want = *reference.entry(flow).or_insert(next);
                prop_assert_eq!(table.slot(flow), want);
                prop_assert_eq!(table.len(), reference.len());
            }
            for (&flow, &slot) in &reference {
                prop_assert_eq!(table.get(flow), Some(slot));
            }
            prop_assert_eq!(table.get(u64::MAX - 1).is_some(), reference.contains_key(&(u64::MAX - 1)));
        }
    }
}
