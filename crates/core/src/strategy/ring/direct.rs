//! Small buckets shared whole ([`RingAllReduce::with_direct_below`]): every worker's copy
//! travels the ring, or over a mesh ([`RingAllReduce::over_mesh`]) goes straight to every
//! other worker; with 4 workers on a ring the copies are exchanged in two rounds of
//! recursive doubling instead ([`RingAllReduce::pairwise`]). Each worker adds the n copies
//! in rank order, so all get the same bits.

use super::buckets::Outgoing;
use super::RingAllReduce;
use crate::aggregate::{add_assign, scale};
use crate::sched::new_scheduler;
use crate::strategy::{ProtocolError, Rank};
use crate::wire::{FrameKind, Header};

impl RingAllReduce {
    /// Shares buckets whose n copies hold at most `elems` values together whole instead of
    /// reducing them around the ring: each worker's copy travels the ring (n-1 hops instead
    /// of the 2(n-1) of reduce-scatter plus all-gather, for n-1 times the bucket's bytes
    /// instead of 2(n-1)/n), and every worker adds the n copies in rank order, so all get the
    /// same bits. For small buckets the hops, not the bytes, take the time. A bucket shared
    /// whole travels in one frame, so only buckets of at most a segment qualify. With 4
    /// workers on a ring they are exchanged by recursive doubling instead (2 hops; see
    /// [`RingAllReduce::pairwise`]). Call before the first step.
    pub fn with_direct_below(mut self, elems: usize) -> Self {
        let n = self.n;
        for (b, st) in self.buckets.iter_mut().zip(&mut self.state) {
            b.direct = n > 1 && b.len.saturating_mul(n) <= elems && b.len <= self.segment_elems;
            if b.direct {
                st.shares = vec![0.0; 2 * n * b.len];
                st.got_share = [vec![false; n], vec![false; n]];
            }
        }
        if self.pairwise() && self.buckets.iter().any(|b| b.direct) {
            // The second round goes to the left neighbour: one queue per link.
            let kind = self.scheduler;
            self.queues = (0..n).map(|_| new_scheduler(kind)).collect();
        }
        self.reset_state();
        self
    }

    /// Whether small buckets are exchanged by recursive doubling rather than sent around:
    /// with 4 workers on a ring, both rounds' partners are ring neighbours (rank `r ^ 1`,
    /// then `r ^ 3`: 0-1 and 2-3, then 0-3 and 1-2), so every worker sends and receives 2
    /// copies in 2 hops instead of 3 in 3. Both ends of a round add the same two sums (in
    /// either order: addition is commutative), so every worker ends with
    /// `((g0 + g1) + (g2 + g3)) / 4`, the same bits. Over a mesh the copies go in one hop
    /// instead (see [`RingAllReduce::over_mesh`]).
    pub(super) fn pairwise(&self) -> bool {
        self.n == 4 && !self.mesh
    }

    /// The partner of round `round` (0 or 1) of a pairwise exchange.
    pub(super) fn partner(&self, round: u64) -> Rank {
        self.rank ^ ((2 << round) - 1)
    }

    /// Sends the copies of buckets shared whole (see [`RingAllReduce::with_direct_below`])
    /// straight from each worker to every other one, one hop instead of n-1, where the
    /// driver links every worker to every other ([`crate::strategy::SyncPlan::mesh`]):
    /// each worker accepts a copy only from its origin's own link and forwards none. Larger
    /// buckets still use only the ring neighbours. With fewer than 3 workers the ring
    /// already is a mesh and nothing changes. Call before the first step.
    pub fn over_mesh(mut self) -> Self {
        if self.n >= 3 && !self.mesh {
            self.mesh = true;
            let kind = self.scheduler;
            self.queues = (0..self.n).map(|_| new_scheduler(kind)).collect();
        }
        self
    }

    /// The rank whose copy of a direct bucket travels as ring step `s` from `sender`.
    pub(super) fn share_origin(&self, sender: Rank, s: u64) -> Rank {
        (sender + self.n - (s as usize % self.n)) % self.n
    }

    /// Where the copy of direct bucket `b` from `origin` for `step` is kept.
    pub(super) fn share_range(&self, b: usize, step: u64, origin: Rank) -> std::ops::Range<usize> {
        let len = self.buckets[b].len;
        let start = ((step % 2) as usize * self.n + origin) * len;
        start..start + len
    }

    /// Direct bucket `b`'s own copy is in: send it around the ring, or over a mesh to every
    /// other worker at once (in rank order from the right neighbour on).
    pub(super) fn launch_direct(&mut self, b: usize) {
        let slot = if self.pairwise() { 0 } else { self.rank };
        let own = self.share_range(b, self.step, slot);
        let len = self.buckets[b].len;
        let st = &mut self.state[b];
        st.shares[own].copy_from_slice(&self.data[b]);
        if self.pairwise() {
            self.enqueue(Outgoing {
                to: self.partner(0),
                bucket: b,
                gather: true,
                ring_step: 0,
                offset: 0,
                len,
            });
            self.advance_pairwise(b);
            return;
        }
        let copies = if self.mesh { self.n - 1 } else { 1 };
        for i in 1..=copies {
            self.enqueue(Outgoing {
                to: (self.rank + i) % self.n,
                bucket: b,
                gather: true,
                ring_step: 0,
                offset: 0,
                len,
            });
        }
        self.maybe_finish_direct(b);
    }

    /// Once direct bucket `b` is launched and every copy is in: the mean, added in rank order.
    pub(super) fn maybe_finish_direct(&mut self, b: usize) {
        let parity = (self.step % 2) as usize;
        if !self.state[b].launched || self.state[b].shares_in[parity] + 1 < self.n {
            return;
        }
        let len = self.buckets[b].len;
        let base = parity * self.n * len;
        let shares = &self.state[b].shares[base..base + self.n * len];
        let out = &mut self.data[b];
        out.copy_from_slice(&shares[..len]);
        for copy in shares[len..].chunks_exact(len) {
            add_assign(out, copy);
        }
        scale(out, 1.0 / self.n as f32);
        self.finish_bucket(b);
    }

    /// Pairwise bucket `b` (see [`RingAllReduce::pairwise`]) has its own copy in: once the
    /// first round's copy is in, queue the pair's sum to the second partner; once the
    /// second's is in too, the mean. Each step's slots in `shares`: the own copy (sent in
    /// round 0), round 0's copy, the pair's sum (sent in round 1), round 1's copy.
    fn advance_pairwise(&mut self, b: usize) {
        let parity = (self.step % 2) as usize;
        let len = self.buckets[b].len;
        let st = &mut self.state[b];
        if !st.launched || st.done {
            return;
        }
        let base = parity * self.n * len;
        let slots = &mut st.shares[base..base + 4 * len];
        if !st.pair_sent {
            if !st.got_share[parity][1] {
                return;
            }
            let (received, pair) = slots.split_at_mut(2 * len);
            add_into(&mut pair[..len], &received[..len], &received[len..]);
            st.pair_sent = true;
            self.enqueue(Outgoing {
                to: self.partner(1),
                bucket: b,
                gather: true,
                ring_step: 1,
                offset: 0,
                len,
            });
        }
        let st = &mut self.state[b];
        if !st.got_share[parity][3] {
            return;
        }
        let slots = &st.shares[base..base + 4 * len];
        let out = &mut self.data[b];
        add_into(out, &slots[2 * len..3 * len], &slots[3 * len..]);
        scale(out, 1.0 / self.n as f32);
        self.finish_bucket(b);
    }

    /// Checks a copy of direct bucket `b`; returns the bucket and the copy's origin rank.
    pub(super) fn check_share(
        &self,
        link: Rank,
        h: &Header,
        b: usize,
    ) -> Result<(usize, usize), ProtocolError> {
        let err = |why: &str| ProtocolError::unexpected(link, h, why);
        if h.kind != FrameKind::Gather || h.offset != 0 || h.length as usize != self.buckets[b].len
        {
            return Err(err("a small bucket travels whole, in Gather frames"));
        }
        if self.mesh && h.sequence != 0 {
            return Err(err(
                "over a mesh a small bucket's copy comes straight from its origin, never forwarded",
            ));
        }
        if self.pairwise() {
            if h.sequence > 1 {
                return Err(err("a small bucket is exchanged in two rounds only"));
            }
            if link != self.partner(h.sequence) {
                return Err(err(
                    "an exchange round's copy comes only from that round's partner",
                ));
            }
        }
        let next_step = h.step == self.step + 1 || (!self.begun && h.step == self.step);
        if h.step != self.step && !next_step {
            return Err(err(&format!(
                "wrong step (this worker is at step {})",
                self.step
            )));
        }
        // On a ring, ring step s from the left neighbour is the copy of the rank s further
        // left; over a mesh (ring step 0 only) the copy of the link's own rank; in a
        // pairwise exchange, round s's copy has slot 2s + 1 (see `advance_pairwise`).
        let origin = if self.pairwise() {
            2 * h.sequence as usize + 1
        } else {
            self.share_origin(link, h.sequence)
        };
        if self.state[b].got_share[(h.step % 2) as usize][origin] {
            return Err(err("copy received twice"));
        }
        Ok((b, origin))
    }

    /// A copy of direct bucket `b` arrived in the frame `h` (checked: `slot` is the origin
    /// rank, or in a pairwise exchange the round's slot, that [`Self::check_share`] gave):
    /// record it, pass it on, and finish the bucket if it was the last.
    pub(super) fn share_arrived(&mut self, h: &Header, b: usize, slot: usize) {
        let s = h.sequence;
        if self.pairwise() {
            self.state[b].got_share[(h.step % 2) as usize][slot] = true;
            if h.step == self.step && self.begun {
                self.advance_pairwise(b);
            }
            return;
        }
        let parity = (h.step % 2) as usize;
        let st = &mut self.state[b];
        st.got_share[parity][slot] = true;
        st.shares_in[parity] += 1;
        if h.step != self.step || !self.begun {
            self.next_step_shares.push((b, s));
        } else {
            self.forward_share(b, s);
            self.maybe_finish_direct(b);
        }
    }

    /// A copy of direct bucket `b` arrived as ring step `s`: pass it on unless the right
    /// neighbour is the one it came from (over a mesh, every copy came from its origin and
    /// goes no further).
    pub(super) fn forward_share(&mut self, b: usize, s: u64) {
        if !self.mesh && (s as usize) + 2 < self.n {
            let len = self.buckets[b].len;
            self.enqueue(Outgoing {
                to: self.right(),
                bucket: b,
                gather: true,
                ring_step: s + 1,
                offset: 0,
                len,
            });
        }
    }
}

/// `out = a + b`.
fn add_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    out.copy_from_slice(a);
    add_assign(out, b);
}
