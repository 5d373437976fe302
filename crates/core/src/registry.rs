//! The tensor registry: keys (parameter tensors numbered from the input), their cutting into
//! slices, and the placement of slices on parameter servers.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One parameter tensor as the synchronisation layer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// Number of `f32` values.
    pub numel: usize,
    /// Layer that owns the key (0 = nearest the input).
    pub layer: usize,
}

impl KeyInfo {
    /// One key per size, key `i` on layer `i`: the model most tests synchronise.
    #[cfg(test)]
    pub(crate) fn one_per_layer(sizes: &[usize]) -> Vec<KeyInfo> {
        sizes
            .iter()
            .enumerate()
            .map(|(layer, &numel)| KeyInfo { numel, layer })
            .collect()
    }
}

/// A contiguous range of one key: the unit of scheduling and of the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slice {
    /// The key.
    pub key: usize,
    /// First element.
    pub offset: usize,
    /// Elements.
    pub len: usize,
    /// Position of this slice within its key (0, 1, ...): the priority tie-breaker.
    pub index_in_key: usize,
}

impl Slice {
    /// The element range within the key.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// How slices are spread over servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Placement {
    /// Balanced by bytes: slices largest first, each onto the least-loaded server. A key
    /// that fits one slice stays whole on one server; a key larger than a slice is spread
    /// over the servers, as MXNet's KVStore splits arrays above
    /// `MXNET_KVSTORE_BIGARRAY_BOUND` (so no single server carries a VGG's fc6 alone).
    KeysByBytes,
    /// Slice after slice, round robin over the servers (P3's placement).
    SlicesRoundRobin,
}

/// Keys, their slices, and which server owns each slice. Immutable once built; clones share
/// the tables behind one pointer (every endpoint of a simulated cluster holds one, and reads
/// them on every frame: one shared copy stays in cache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRegistry {
    tables: Arc<Tables>,
}

/// What a [`TensorRegistry`] shares.
#[derive(Debug, PartialEq, Eq)]
struct Tables {
    keys: Vec<KeyInfo>,
    slices: Vec<Slice>,
    key_slices: Vec<std::ops::Range<usize>>,
    /// Where each key starts when every key's values lie end to end.
    key_starts: Vec<usize>,
    owner: Vec<usize>,
    servers: usize,
}

impl TensorRegistry {
    /// Cuts every key into slices of at most `slice_len` elements (a key of 0 elements has no
    /// slice) and places them on `servers` servers (0 servers: no placement, for all-reduce).
    ///
    /// # Panics
    /// Panics if `slice_len` is 0 (callers validate user input first).
    pub fn new(keys: Vec<KeyInfo>, slice_len: usize, servers: usize, placement: Placement) -> Self {
        assert!(slice_len > 0, "slice length must be positive");
        let mut slices = Vec::new();
        let mut key_slices = Vec::with_capacity(keys.len());
        for (key, info) in keys.iter().enumerate() {
            let start = slices.len();
            let mut offset = 0;
            while offset < info.numel {
                let len = slice_len.min(info.numel - offset);
                slices.push(Slice {
                    key,
                    offset,
                    len,
                    index_in_key: slices.len() - start,
                });
                offset += len;
            }
            key_slices.push(start..slices.len());
        }
        let owner = match (servers, placement) {
            (0, _) => vec![0; slices.len()],
            (_, Placement::SlicesRoundRobin) => (0..slices.len()).map(|i| i % servers).collect(),
            (_, Placement::KeysByBytes) => {
                let mut order: Vec<usize> = (0..slices.len()).collect();
                // Largest first; ties by position so the placement is deterministic.
                order.sort_by(|&a, &b| slices[b].len.cmp(&slices[a].len).then(a.cmp(&b)));
                let mut load = vec![0usize; servers];
                let mut owner = vec![0; slices.len()];
                for i in order {
                    let (server, _) = load
                        .iter()
                        .enumerate()
                        .min_by_key(|&(s, &l)| (l, s))
                        .unwrap_or((0, &0));
                    owner[i] = server;
                    load[server] += slices[i].len;
                }
                owner
            }
        };
        let key_starts = keys
            .iter()
            .scan(0usize, |next, k| {
                let start = *next;
                *next = next.saturating_add(k.numel);
                Some(start)
            })
            .collect();
        let tables = Tables {
            keys,
            slices,
            key_slices,
            key_starts,
            owner,
            servers,
        };
        Self {
            tables: Arc::new(tables),
        }
    }

    /// Every key.
    pub fn keys(&self) -> &[KeyInfo] {
        &self.tables.keys
    }

    /// Every slice, in key order then offset order.
    pub fn slices(&self) -> &[Slice] {
        &self.tables.slices
    }

    /// Where `key`'s values start when every key's lie end to end, in key order (one flat
    /// buffer of all of them holds `key` at `key_start(key)..key_start(key) + numel`).
    pub fn key_start(&self, key: usize) -> usize {
        self.tables.key_starts[key]
    }

    /// Values of every key together.
    pub fn total_numel(&self) -> usize {
        let keys = &self.tables.keys;
        keys.last().map_or(0, |k| {
            self.key_start(keys.len() - 1).saturating_add(k.numel)
        })
    }

    /// Indices (into [`TensorRegistry::slices`]) of the slices of `key`.
    pub fn slices_of(&self, key: usize) -> std::ops::Range<usize> {
        self.tables.key_slices[key].clone()
    }

    /// The server owning slice `slice`.
    pub fn owner(&self, slice: usize) -> usize {
        self.tables.owner[slice]
    }

    /// Number of servers.
    pub fn servers(&self) -> usize {
        self.tables.servers
    }

    /// Finds the slice of `key` that starts at `offset` and has `len` elements.
    pub fn find_slice(&self, key: usize, offset: usize, len: usize) -> Option<usize> {
        let range = self.tables.key_slices.get(key)?.clone();
        // Every slice of a key but the last has the first one's length: O(1), no search.
        let stride = self.tables.slices.get(range.start)?.len;
        let i = range.start.checked_add(offset / stride)?;
        let s = self.tables.slices.get(i).filter(|_| range.contains(&i))?;
        (s.offset == offset && s.len == len).then_some(i)
    }

    /// Elements held by each server.
    pub fn server_loads(&self) -> Vec<usize> {
        let mut load = vec![0; self.tables.servers];
        for (i, s) in self.tables.slices.iter().enumerate() {
            if self.tables.servers > 0 {
                load[self.tables.owner[i]] += s.len;
            }
        }
        load
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Slicing covers every parameter of every key exactly once, in order, with no slice
        /// longer than the limit; every slice has an owner among the servers.
        #[test]
        fn slicing_covers_every_parameter_exactly_once(
            sizes in prop::collection::vec(0usize..200_000, 1..20),
            slice_len in 1usize..50_000,
            servers in 0usize..5,
            round_robin: bool,
        ) {
            let placement = if round_robin { Placement::SlicesRoundRobin } else { Placement::KeysByBytes };
            let reg = TensorRegistry::new(KeyInfo::one_per_layer(&sizes), slice_len, servers, placement);
            for (key, &n) in sizes.iter().enumerate() {
                let mut next = 0;
                for (j, i) in reg.slices_of(key).enumerate() {
                    let s = reg.slices()[i];
                    prop_assert_eq!(s.key, key);
                    prop_assert_eq!(s.offset, next);
                    prop_assert_eq!(s.index_in_key, j);
                    prop_assert!(s.len > 0 && s.len <= slice_len);
                    prop_assert_eq!(reg.find_slice(key, s.offset, s.len), Some(i));
                    prop_assert_eq!(reg.find_slice(key, s.offset, s.len + 1), None);
                    if s.len > 1 {
                        prop_assert_eq!(reg.find_slice(key, s.offset + 1, s.len - 1), None);
                    }
                    next += s.len;
                    if servers > 0 { prop_assert!(reg.owner(i) < servers); }
                }
                prop_assert_eq!(next, n);
                prop_assert_eq!(reg.find_slice(key, n, 1), None);
                // Keys lie end to end in a flat buffer, in order.
                prop_assert_eq!(reg.key_start(key), sizes[..key].iter().sum::<usize>());
            }
            prop_assert_eq!(reg.total_numel(), sizes.iter().sum::<usize>());
            if servers > 0 {
                prop_assert_eq!(reg.server_loads().iter().sum::<usize>(), sizes.iter().sum::<usize>());
            }
        }
    }

    #[test]
    fn keys_by_bytes_balances_keeps_small_keys_whole_and_spreads_big_ones() {
        let reg = TensorRegistry::new(
            KeyInfo::one_per_layer(&[100, 60, 50, 10]),
            100,
            2,
            Placement::KeysByBytes,
        );
        assert_eq!(reg.server_loads(), vec![110, 110]);
        for key in 0..4 {
            let owners: std::collections::HashSet<_> =
                reg.slices_of(key).map(|i| reg.owner(i)).collect();
            assert_eq!(owners.len(), 1);
        }
        // A key of 400 next to small ones: its 4 slices are spread, the loads balanced.
        let reg = TensorRegistry::new(
            KeyInfo::one_per_layer(&[10, 400, 20]),
            100,
            4,
            Placement::KeysByBytes,
        );
        let owners: std::collections::HashSet<_> = reg.slices_of(1).map(|i| reg.owner(i)).collect();
        assert_eq!(owners.len(), 4);
        assert_eq!(reg.server_loads().iter().max(), Some(&120));
        let reg = TensorRegistry::new(
            KeyInfo::one_per_layer(&[100, 60, 50, 10]),
            7,
            2,
            Placement::KeysByBytes,
        );
        assert_eq!(reg.find_slice(0, 7, 6), None);
        assert_eq!(reg.find_slice(9, 0, 1), None);
    }
}
