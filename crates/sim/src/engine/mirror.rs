//! The engine's side of the symmetric model ([`crate::symmetry`]): one worker's ring
//! frames handed back to it as its left neighbour's, and a server's frames charged for the
//! N workers they stand for.

use syncopate_core::strategy::Rank;
use syncopate_core::wire::{Header, HEADER_LEN};

use super::{Host, Sim};
use crate::build::{peers, RankEndpoint};
use crate::symmetry::Mirror;
use crate::{SimConfig, SimError};

impl Sim<'_> {
    /// Lets the one worker of this (reduced) simulation stand for the `mirror.workers` of
    /// `full`: on a ring it becomes rank 0 of `full`'s ring, linked to its two neighbours.
    pub(crate) fn with_mirror(mut self, mirror: Mirror, full: &SimConfig) -> Self {
        if mirror.ring.is_some() {
            let ring = full.plan().endpoints(self.keys.clone()).ring(0);
            let p = peers(full, 0);
            if let Some(Host {
                endpoint, links, ..
            }) = self.hosts.first_mut()
            {
                *endpoint = RankEndpoint::Worker(Box::new(ring));
                *links = p.iter().chain(&p).copied().collect();
            }
        }
        self.mirror = Some(mirror);
        self
    }

    /// How many frames one frame sent by (or to) host `h` stands for: the workers a
    /// server answers (or hears from) on the symmetric model of parameter servers, else 1.
    #[inline(always)]
    pub(super) fn fan(&self, h: Rank) -> usize {
        match &self.mirror {
            Some(m) if m.ring.is_none() && h >= self.cfg.workers => m.workers,
            _ => 1,
        }
    }

    /// Where the frame `header` (in `buf`) that `from` sends `to` goes: on a mirrored ring,
    /// back to the sender as its left neighbour's counterpart frame (`(left, sender)`, the
    /// counterpart's header, `buf` re-encoded for it); else where it was sent.
    #[inline(always)]
    pub(super) fn mirror_frame(
        &self,
        from: Rank,
        to: Rank,
        header: Header,
        buf: Vec<u8>,
    ) -> Result<(Rank, Rank, Header, Vec<u8>), SimError> {
        match self.mirror.as_ref().and_then(|m| m.ring.as_ref()) {
            None => Ok((from, to, header, buf)),
            Some(ring) => self.left_counterpart(ring, from, header, buf),
        }
    }

    #[cold]
    fn left_counterpart(
        &self,
        ring: &syncopate_core::strategy::RingAllReduce,
        from: Rank,
        header: Header,
        mut buf: Vec<u8>,
    ) -> Result<(Rank, Rank, Header, Vec<u8>), SimError> {
        let Some(h) = ring.from_left(&header) else {
            return Err(self.internal(format!(
                "rank {from}: frame {:?} key {} @{} has no counterpart from the left",
                header.kind, header.key, header.offset
            )));
        };
        buf.resize(HEADER_LEN + h.length as usize * 4, 0);
        buf[..HEADER_LEN].copy_from_slice(&h.encode());
        Ok((h.sender as Rank, from, h, buf))
    }
}
