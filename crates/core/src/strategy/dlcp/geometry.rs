//! Where each packet lies: slices cut into packets, numbered within each server's share of
//! a key (the unit the receiver counts) and within the key (the unit of drop marks).

use std::sync::Arc;

use super::tally::packets_needed;
use super::DlcpOptions;
use crate::registry::TensorRegistry;

/// One packet, located.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketId {
    /// The slice it belongs to.
    pub slice: usize,
    /// Its index within its key's share at the slice's owner.
    pub in_share: usize,
    /// Its index within its key (over every server's slices).
    pub in_key: usize,
    /// Its first value's position within the share's values (the owned slices of the key
    /// one after another).
    pub share_offset: usize,
    /// First value within the key.
    pub offset: usize,
    /// Values carried.
    pub len: usize,
}

/// The packets of a registry's slices (cheap to clone: every endpoint of a job shares one
/// cut).
#[derive(Debug, Clone)]
pub struct Geometry {
    reg: TensorRegistry,
    cut: Arc<Cut>,
}

/// What a [`Geometry`] shares.
#[derive(Debug)]
struct Cut {
    /// Per key: the values of its packets (the last of each slice perhaps shorter).
    packet: Vec<usize>,
    /// Per slice: its first packet's index within its share, and within its key.
    share_base: Vec<usize>,
    key_base: Vec<usize>,
    /// Per slice: its first value's position within its share.
    share_elem: Vec<usize>,
    /// Per key and server (`key * servers + server`): packets and values of the share.
    share_packets: Vec<usize>,
    share_elems: Vec<usize>,
    /// Per key: its packets.
    key_packets: Vec<usize>,
    /// The most values any packet carries (no more than its slice holds).
    longest: usize,
    /// Per key and server: the share's place among the shares that hold packets.
    slot: Vec<Option<usize>>,
    /// Per such share: its key and server.
    slots: Vec<(usize, usize)>,
}

impl Cut {
    /// The values of `key`'s packets (at least 1; an unknown key's are single values).
    fn packet_len(&self, key: usize) -> usize {
        self.packet.get(key).copied().unwrap_or(1).max(1)
    }
}

impl Geometry {
    /// Packets of at most `packet` values (at least 1) cut from every slice of `reg`.
    pub fn new(reg: TensorRegistry, packet: usize) -> Self {
        let packet = vec![packet.max(1); reg.keys().len()];
        Self::cut(reg, packet)
    }

    /// The packets `opts` cut from `reg`: [`Geometry::new`]'s, except that with
    /// [`DlcpOptions::whole_slices`] a key whose every share the bounds need whole (each
    /// share of fewer than `1 / bound` packets, so no packet of it may stay lost) travels a
    /// slice a packet: the bound still needs every packet, and each stands for those of
    /// its slice.
    pub fn of(reg: TensorRegistry, opts: &DlcpOptions) -> Self {
        let fine = Self::new(reg, opts.packet_elems);
        if !opts.whole_slices {
            return fine;
        }
        let ppm = opts.loss_bound_ppm().max(opts.pull_loss_bound_ppm());
        let servers = fine.reg.servers().max(1);
        let packet = (0..fine.reg.keys().len())
            .map(|key| {
                let whole = (0..servers).all(|server| {
                    let n = fine.share_packets(key, server);
                    packets_needed(n, ppm) == n
                });
                let slices = fine.reg.slices_of(key);
                let longest = fine.reg.slices()[slices].iter().map(|s| s.len).max();
                match longest {
                    Some(len) if whole => len.max(fine.packet_len(key)),
                    _ => fine.packet_len(key),
                }
            })
            .collect();
        Self::cut(fine.reg, packet)
    }

    /// The geometry of `reg` cut into packets of `packet[key]` values per key.
    fn cut(reg: TensorRegistry, packet: Vec<usize>) -> Self {
        let servers = reg.servers().max(1);
        let keys = reg.keys().len();
        let slices = reg.slices().len();
        let mut g = Cut {
            packet,
            share_base: vec![0; slices],
            key_base: vec![0; slices],
            share_elem: vec![0; slices],
            share_packets: vec![0; keys * servers],
            share_elems: vec![0; keys * servers],
            key_packets: vec![0; keys],
            longest: 1,
            slot: vec![None; keys * servers],
            slots: Vec::new(),
        };
        for slice in 0..slices {
            let s = reg.slices()[slice];
            let owner = reg.owner(slice).min(servers - 1);
            let share = s.key * servers + owner;
            let packet = g.packet_len(s.key);
            let n = s.len.div_ceil(packet);
            g.share_base[slice] = g.share_packets[share];
            g.share_elem[slice] = g.share_elems[share];
            g.key_base[slice] = g.key_packets[s.key];
            g.share_packets[share] += n;
            g.share_elems[share] += s.len;
            g.key_packets[s.key] += n;
            g.longest = g.longest.max(s.len.min(packet));
            if n > 0 && g.slot[share].is_none() {
                g.slot[share] = Some(g.slots.len());
                g.slots.push((s.key, owner));
            }
        }
        Self {
            reg,
            cut: Arc::new(g),
        }
    }

    /// The values of `key`'s packets (the last of a slice perhaps fewer).
    fn packet_len(&self, key: usize) -> usize {
        self.cut.packet_len(key)
    }

    /// How many shares (a key's slices at one server) hold packets: per-share state is
    /// kept for these only ([`Geometry::share_slot`]), not for every key and server.
    pub fn shares(&self) -> usize {
        self.cut.slots.len()
    }

    /// The place of `server`'s share of `key` among [`Geometry::shares`], if it holds any
    /// packet.
    pub fn share_slot(&self, key: usize, server: usize) -> Option<usize> {
        let i = self.share_index(key, server);
        self.cut.slot.get(i).copied().flatten()
    }

    /// The key and server of the share at `slot`.
    pub fn share_at(&self, slot: usize) -> Option<(usize, usize)> {
        self.cut.slots.get(slot).copied()
    }

    /// The most values any packet carries (a receive buffer's size): a packet never holds
    /// more than its slice, so a scaled model's tiny slices need tiny buffers.
    pub fn max_packet(&self) -> usize {
        self.cut.longest
    }

    /// The registry.
    pub fn registry(&self) -> &TensorRegistry {
        &self.reg
    }

    fn share_index(&self, key: usize, server: usize) -> usize {
        let servers = self.reg.servers().max(1);
        if server >= servers {
            return usize::MAX;
        }
        key.saturating_mul(servers).saturating_add(server)
    }

    /// Packets of `server`'s share of `key` (0 if it owns none of it).
    pub fn share_packets(&self, key: usize, server: usize) -> usize {
        let i = self.share_index(key, server);
        self.cut.share_packets.get(i).copied().unwrap_or(0)
    }

    /// Values of `server`'s share of `key`.
    pub fn share_elems(&self, key: usize, server: usize) -> usize {
        let i = self.share_index(key, server);
        self.cut.share_elems.get(i).copied().unwrap_or(0)
    }

    /// Packets of `key`.
    pub fn key_packets(&self, key: usize) -> usize {
        self.cut.key_packets.get(key).copied().unwrap_or(0)
    }

    /// The packets of `slice`, in order.
    pub fn packets_of(&self, slice: usize) -> impl Iterator<Item = PacketId> + '_ {
        let s = self.reg.slices()[slice];
        let packet = self.packet_len(s.key);
        (0..s.len.div_ceil(packet)).map(move |j| self.packet_at(slice, j))
    }

    fn packet_at(&self, slice: usize, j: usize) -> PacketId {
        let s = self.reg.slices()[slice];
        let packet = self.packet_len(s.key);
        let start = j * packet;
        PacketId {
            slice,
            in_share: self.cut.share_base[slice] + j,
            in_key: self.cut.key_base[slice] + j,
            share_offset: self.cut.share_elem[slice] + start,
            offset: s.offset + start,
            len: packet.min(s.len - start),
        }
    }

    /// The packet of `key` that starts at `offset` and carries `len` values, if it is one.
    pub fn locate(&self, key: usize, offset: usize, len: usize) -> Option<PacketId> {
        let range = self.reg.slices_of(key);
        let first = self.reg.slices().get(range.start)?;
        let slice = range.start.checked_add(offset / first.len.max(1))?;
        let s = self
            .reg
            .slices()
            .get(slice)
            .filter(|_| range.contains(&slice))?;
        let start = offset.checked_sub(s.offset)?;
        let packet = self.packet_len(key);
        if start % packet != 0 || start >= s.len {
            return None;
        }
        let id = self.packet_at(slice, start / packet);
        (id.len == len).then_some(id)
    }

    /// Packet `i` of `server`'s share of `key`.
    pub fn share_packet(&self, key: usize, server: usize, i: usize) -> Option<PacketId> {
        self.reg
            .slices_of(key)
            .filter(|&s| self.reg.owner(s) == server)
            .find_map(|slice| {
                let j = i.checked_sub(self.cut.share_base[slice])?;
                let n = self.reg.slices()[slice].len.div_ceil(self.packet_len(key));
                (j < n).then(|| self.packet_at(slice, j))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{KeyInfo, Placement};
    use proptest::prelude::*;

    #[test]
    fn whole_slices_only_where_the_bound_needs_every_packet() {
        // Key 0: shares of 20 packets of 10 (fewer than 1 / 1 %): a slice a packet. Key 1:
        // shares of 200, of which the bound lets 2 stay lost: packet by packet.
        let keys = KeyInfo::one_per_layer(&[400, 4000]);
        let reg = TensorRegistry::new(keys, 100, 2, Placement::SlicesRoundRobin);
        let opts = DlcpOptions {
            packet_elems: 10,
            loss_bound: 0.01,
            whole_slices: true,
            ..DlcpOptions::default()
        };
        let g = Geometry::of(reg.clone(), &opts);
        assert_eq!((g.key_packets(0), g.key_packets(1)), (4, 400));
        assert_eq!((g.share_packets(0, 1), g.max_packet()), (2, 100));
        assert_eq!(g.locate(0, 100, 100).map(|p| p.in_share), Some(0));
        let fine = DlcpOptions {
            whole_slices: false,
            ..opts
        };
        let g = Geometry::of(reg, &fine);
        assert_eq!((g.key_packets(0), g.max_packet()), (40, 10));
    }

    #[test]
    fn no_packet_is_longer_than_its_slice() {
        let keys = KeyInfo::one_per_layer(&[30, 70]);
        let reg = TensorRegistry::new(keys, 40, 2, Placement::SlicesRoundRobin);
        let g = Geometry::new(reg, 2048);
        assert_eq!(g.max_packet(), 40);
        assert_eq!(g.locate(1, 40, 30).map(|p| p.len), Some(30));
    }

    proptest! {
        #[test]
        fn packets_tile_every_share_and_are_found_again(
            sizes in proptest::collection::vec(1usize..500, 1..6),
            slice in 1usize..200,
            packet in 1usize..64,
            servers in 1usize..4,
        ) {
            let keys = KeyInfo::one_per_layer(&sizes);
            let reg = TensorRegistry::new(keys, slice, servers, Placement::SlicesRoundRobin);
            let g = Geometry::new(reg.clone(), packet);
            for (key, &numel) in sizes.iter().enumerate() {
                let mut in_key = 0;
                let mut shares = vec![(0usize, 0usize); servers];
                for s in reg.slices_of(key) {
                    let owner = reg.owner(s);
                    for p in g.packets_of(s) {
                        prop_assert_eq!(p.in_key, in_key);
                        prop_assert_eq!(p.in_share, shares[owner].0);
                        prop_assert_eq!(p.share_offset, shares[owner].1);
                        prop_assert_eq!(g.locate(key, p.offset, p.len), Some(p));
                        prop_assert_eq!(g.share_packet(key, owner, p.in_share), Some(p));
                        prop_assert!(p.len >= 1 && p.len <= packet);
                        in_key += 1;
                        shares[owner].0 += 1;
                        shares[owner].1 += p.len;
                    }
                }
                prop_assert_eq!(g.key_packets(key), in_key);
                for (server, &(n, e)) in shares.iter().enumerate() {
                    prop_assert_eq!(g.share_packets(key, server), n);
                    prop_assert_eq!(g.share_elems(key, server), e);
                    prop_assert_eq!(g.share_packet(key, server, n), None);
                    let slot = g.share_slot(key, server);
                    prop_assert_eq!(slot.is_some(), n > 0);
                    prop_assert_eq!(slot.and_then(|i| g.share_at(i)), (n > 0).then_some((key, server)));
                }
                prop_assert_eq!(g.share_slot(key, servers), None);
                prop_assert_eq!(g.locate(key, numel, 1), None);
            }
            let held = (0..sizes.len() * servers)
                .filter(|i| g.share_packets(i / servers, i % servers) > 0)
                .count();
            prop_assert_eq!(g.shares(), held, "a slot for each share that holds packets");
        }
    }
}
