//! [`Later`]: what a port offers at a later time, taken in order of `(time, order)`.
//!
//! A binary heap of small keys over a slab of the values, in place of an ordered map of
//! the values themselves: a port of a lossy 1,024-worker simulation files and takes a
//! frame here for nearly every frame through it (its retransmissions, frames held back by
//! a congestion window, and at an ingress port every frame waiting behind its flow's), and
//! the map's node searches and moves of whole frames were a twentieth of the run. Keys are
//! unique (the order is a counter), so both hand values out in the same order.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Nanos;

/// Values keyed by `(time, order)`, taken smallest key first.
#[derive(Debug, Clone)]
pub(crate) struct Later<T> {
    /// `(time, order, slab index)`, smallest first.
    keys: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    /// The values, `None` where free.
    slab: Vec<Option<T>>,
    /// Free places in `slab`.
    free: Vec<usize>,
}

impl<T> Default for Later<T> {
    fn default() -> Self {
        Self {
            keys: BinaryHeap::new(),
            slab: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Later<T> {
    /// Where the next value filed will be kept (what [`Later::cancel`] takes).
    pub(crate) fn next_index(&self) -> usize {
        self.free.last().copied().unwrap_or(self.slab.len())
    }

    /// Takes back the value kept at `index` before its time: its key stays, and hands out
    /// nothing when it comes.
    pub(crate) fn cancel(&mut self, index: usize) -> Option<T> {
        self.slab.get_mut(index).and_then(Option::take)
    }

    /// Files `value` under `key` (`key.1` unique among the values held).
    pub(crate) fn insert(&mut self, key: (Nanos, u64), value: T) {
        let index = match self.free.pop() {
            Some(i) => {
                self.slab[i] = Some(value);
                i
            }
            None => {
                self.slab.push(Some(value));
                self.slab.len() - 1
            }
        };
        self.keys.push(Reverse((key.0, key.1, index)));
    }

    /// The smallest key held.
    pub(crate) fn first_key(&self) -> Option<(Nanos, u64)> {
        self.keys.peek().map(|Reverse((t, order, _))| (*t, *order))
    }

    /// Takes the value of the smallest key (`None` if it was cancelled).
    pub(crate) fn pop_first(&mut self) -> Option<T> {
        let Reverse((_, _, index)) = self.keys.pop()?;
        let value = self.slab.get_mut(index).and_then(Option::take);
        self.free.push(index);
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// The same values in the same order as an ordered map, inserts and takes mixed.
        #[test]
        fn hands_values_out_as_an_ordered_map_does(
            ops in prop::collection::vec(prop::option::of(0u64..50), 0..300),
        ) {
            let mut later = Later::default();
            let mut map = BTreeMap::new();
            for (order, op) in ops.into_iter().enumerate() {
                match op {
                    Some(t) => {
                        later.insert((t, order as u64), order);
                        map.insert((t, order as u64), order);
                    }
                    None => {
                        prop_assert_eq!(later.pop_first(), map.pop_first().map(|(_, v)| v));
                    }
                }
                prop_assert_eq!(later.first_key(), map.keys().next().copied());
            }
        }
    }
}
