//! Which links the simulator offers an endpoint's `poll_transmit_any`: only those whose
//! queue can hold the frame the endpoint would pick among all of them, which gives the very
//! same choice at a fraction of the cost. The simulator checks every frame against this
//! bookkeeping, and its tests compare with offering every link.
//!
//! Servers: `PsServer` queues every updated slice for all `N` workers at once and picks the
//! smallest `(order key, link)` over the offered links' heads; its `BroadcastQueue` knows the
//! winner over all links at once, but checks that the winner was offered, O(links offered),
//! so offering all `N` links would cost O(N) per frame. The workers served with a given reply
//! always form a prefix `0..next` (by induction: the most urgent reply `x` is at the head of
//! link `next(x)` and of no lower link), so only the links `{next(x)}` can win. Where some
//! links' sockets are full and are not offered, a reply also goes to links past a gap
//! (`ahead`), and the winner is, for some reply, the lowest offered link not yet served
//! ([`Frontier::open_candidates`]).
//!
//! Parameter-server workers: a queue is empty unless a slice owned by that server was handed
//! over and not yet sent, and empty queues never win; counting slices per server suffices.

use syncopate_core::strategy::Rank;

/// Replies one server still has to hand out, and how far each has got.
#[derive(Debug, Clone, Default)]
pub(crate) struct Frontier {
    /// `(step, key, offset)` of each updated slice still being handed out.
    replies: Vec<(u64, u32, u32)>,
    /// The next worker to get each reply (side by side with `replies`: they are the
    /// candidates, asked for at every frame, so kept as they change rather than gathered).
    links: Vec<usize>,
    /// Per reply, the links past `next` it already went to, ascending (empty unless a
    /// socket was full when its turn came).
    ahead: Vec<Vec<usize>>,
    /// Where in `replies` the last reply sent was: a server hands one reply to worker
    /// after worker, so the next is nearly always there (looked at before a scan).
    last: usize,
}

impl Frontier {
    /// The slice `(step, key, offset)` was updated: it is queued for every worker.
    pub fn updated(&mut self, slice: (u64, u32, u32)) {
        self.replies.push(slice);
        self.links.push(0);
        self.ahead.push(Vec::new());
    }

    /// Whether every reply has been handed out.
    pub fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// The links whose queue heads can be the most urgent (one per reply still being handed
    /// out, so possibly repeated: the choice among them does not depend on order or repeats).
    pub fn candidates(&self) -> &[usize] {
        &self.links
    }

    /// [`Frontier::candidates`] when only the links for which `offered` holds are offered:
    /// per reply, the lowest such link it has not gone to, into `out`.
    pub fn open_candidates(
        &self,
        workers: usize,
        offered: impl Fn(usize) -> bool,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        for (&next, ahead) in self.links.iter().zip(&self.ahead) {
            let mut served = ahead.iter().peekable();
            let found = (next..workers).find(|&k| {
                while served.next_if(|&&a| a < k).is_some() {}
                served.peek() != Some(&&k) && offered(k)
            });
            out.extend(found);
        }
    }

    /// The reply for `slice` went to `link`, of `workers` workers. Errs (with what was
    /// expected) if it had gone there already or the slice was not updated.
    pub fn sent(
        &mut self,
        slice: (u64, u32, u32),
        link: usize,
        workers: usize,
    ) -> Result<(), String> {
        let Some(i) = self.find(slice) else {
            return Err(format!("reply {slice:?} to {link} was never queued"));
        };
        self.last = i;
        let Some(next) = self.links.get_mut(i) else {
            return Err(format!("reply {slice:?} has no next worker"));
        };
        let ahead = &mut self.ahead[i];
        let at = ahead.binary_search(&link);
        match at {
            Err(at) if link > *next => {
                ahead.insert(at, link);
                return Ok(());
            }
            _ if link != *next => {
                return Err(format!(
                    "reply {slice:?} went to {link}, expected {next} or a later one not served"
                ));
            }
            _ => {}
        }
        *next += 1;
        while ahead.first() == Some(next) {
            ahead.remove(0);
            *next += 1;
        }
        if *next >= workers {
            self.replies.remove(i);
            self.links.remove(i);
            self.ahead.remove(i);
        }
        Ok(())
    }

    /// Where the reply for `slice` is in `replies`: where the last one sent was, or else
    /// wherever a scan finds it (the same place: a slice is updated once a step, so it is
    /// in `replies` at most once).
    fn find(&self, slice: (u64, u32, u32)) -> Option<usize> {
        match self.replies.get(self.last) {
            Some(&r) if r == slice => Some(self.last),
            _ => self.replies.iter().position(|&r| r == slice),
        }
    }
}

/// Slices a parameter-server worker was handed and has not sent, per server.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    first: Rank,
    owed: Vec<u32>,
    /// The ranks of the servers owed a slice, ascending (kept as `owed` changes: asked for
    /// at every frame, they change only when a server's count reaches or leaves 0).
    links: Vec<Rank>,
}

impl Outbox {
    /// A worker talking to servers of ranks `first..first + servers`.
    pub fn new(first: Rank, servers: usize) -> Self {
        Self {
            first,
            owed: vec![0; servers],
            links: Vec::with_capacity(servers),
        }
    }

    /// A key was handed over: `(server index, slices)` of each server owning part of it.
    pub fn handed(&mut self, owners: &[(usize, u32)]) {
        for &(server, slices) in owners {
            let owed = &mut self.owed[server];
            let was_owed = *owed > 0;
            *owed += slices;
            let rank = self.first + server;
            if !was_owed && *owed > 0 {
                if let Err(at) = self.links.binary_search(&rank) {
                    self.links.insert(at, rank);
                }
            }
        }
    }

    /// A slice went to server rank `link`.
    pub fn sent(&mut self, link: Rank) -> Result<(), String> {
        match link
            .checked_sub(self.first)
            .and_then(|s| self.owed.get_mut(s))
        {
            Some(owed) if *owed > 0 => {
                *owed -= 1;
                if *owed == 0 {
                    self.links.retain(|&l| l != link);
                }
                Ok(())
            }
            _ => Err(format!("a slice went to rank {link}, which was owed none")),
        }
    }

    /// The server links that may have a slice queued, ascending.
    pub fn candidates(&self) -> &[Rank] {
        &self.links
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_prefixes_and_refuses_out_of_order_replies() {
        let mut f = Frontier::default();
        f.updated((0, 1, 0));
        f.updated((0, 2, 0));
        assert_eq!(f.candidates(), &[0, 0]);
        f.sent((0, 2, 0), 0, 2).unwrap();
        assert_eq!(f.candidates(), &[0, 1]);
        assert!(f.sent((0, 2, 0), 0, 2).unwrap_err().contains("expected 1"));
        f.sent((0, 2, 0), 1, 2).unwrap();
        assert_eq!(f.candidates(), &[0]);
        f.sent((0, 1, 0), 0, 2).unwrap();
        f.sent((0, 1, 0), 1, 2).unwrap();
        assert!(f.is_empty());
        assert!(f.sent((0, 1, 0), 0, 2).is_err());
    }

    #[test]
    fn a_reply_past_a_full_socket_fills_its_gap_later() {
        let mut f = Frontier::default();
        f.updated((0, 1, 0));
        let mut out = Vec::new();
        f.open_candidates(4, |k| k != 0, &mut out);
        assert_eq!(out, [1], "link 0 is not offered");
        f.sent((0, 1, 0), 1, 4).unwrap();
        f.sent((0, 1, 0), 3, 4).unwrap();
        assert!(f.sent((0, 1, 0), 3, 4).is_err(), "link 3 was served");
        f.open_candidates(4, |k| k != 0, &mut out);
        assert_eq!(out, [2]);
        f.open_candidates(4, |_| true, &mut out);
        assert_eq!(out, [0]);
        assert_eq!(f.candidates(), &[0]);
        f.sent((0, 1, 0), 0, 4).unwrap();
        assert_eq!(f.candidates(), &[2], "the prefix closes up to the next gap");
        f.sent((0, 1, 0), 2, 4).unwrap();
        assert!(f.is_empty());
    }

    #[test]
    fn outbox_offers_the_servers_still_owed_a_slice() {
        let mut o = Outbox::new(4, 3);
        assert!(o.candidates().is_empty());
        o.handed(&[(0, 1), (2, 2)]);
        assert_eq!(o.candidates(), &[4, 6]);
        o.sent(6).unwrap();
        o.sent(4).unwrap();
        assert_eq!(o.candidates(), &[6]);
        assert!(o.sent(5).unwrap_err().contains("rank 5"));
        assert!(o.sent(3).is_err());
        o.handed(&[(1, 1), (2, 1), (0, 2)]);
        assert_eq!(o.candidates(), &[4, 5, 6], "kept ascending");
        o.sent(6).unwrap();
        o.sent(6).unwrap();
        o.sent(4).unwrap();
        assert_eq!(o.candidates(), &[4, 5], "server 4 is still owed one");
    }
}
