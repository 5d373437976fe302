//! [`BroadcastQueue`]: work queued for every link at once (a parameter server's answers,
//! one per worker for each updated slice), each link taking it in the scheduler's order at
//! its own pace.
//!
//! It behaves exactly as a [`LinkQueues`](super::LinkQueues) to whose every link each item
//! is pushed (tested against one), but holds each item once with a bit per link rather
//! than a copy in every link's heap: a server with a thousand workers then touches a few
//! compact entries per frame instead of a heap per worker.

use super::{OrderKey, Pending, SchedulerKind};

/// Items queued for every link, each taken once by each link, most urgent first (FIFO:
/// in the order of their arrival stamps, which the pusher increments).
#[derive(Debug, Clone)]
pub struct BroadcastQueue {
    kind: SchedulerKind,
    links: usize,
    /// Items some link has still to take, in the order links take them: by order key, then
    /// arrival (the same item may be queued twice, for two steps).
    items: Vec<Queued>,
    /// Bitmaps of items every link has taken, for reuse.
    spare: Vec<Vec<u64>>,
}

/// An item and which links have taken it.
#[derive(Debug, Clone)]
struct Queued {
    pending: Pending,
    key: OrderKey,
    /// Bit `l`: link `l` has taken it.
    taken: Vec<u64>,
    /// Links that have not.
    left: usize,
    /// The lowest link that has not.
    first: usize,
}

impl Queued {
    fn taken_by(&self, link: usize) -> bool {
        self.taken
            .get(link / 64)
            .is_some_and(|w| w >> (link % 64) & 1 == 1)
    }

    /// The order links take items in.
    fn rank(&self) -> (OrderKey, u64) {
        (self.key, self.pending.arrival)
    }
}

impl BroadcastQueue {
    /// An empty queue for `links` links, ordered as `kind` orders.
    pub fn new(kind: SchedulerKind, links: usize) -> Self {
        Self {
            kind,
            links,
            items: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// Queues `p` on every link.
    pub fn push_all(&mut self, p: Pending) {
        if self.links == 0 {
            return;
        }
        let mut taken = self.spare.pop().unwrap_or_default();
        taken.clear();
        taken.resize(self.links.div_ceil(64), 0);
        let item = Queued {
            pending: p,
            key: self.kind.order_key(&p),
            taken,
            left: self.links,
            first: 0,
        };
        let at = self.items.partition_point(|q| q.rank() <= item.rank());
        self.items.insert(at, item);
    }

    /// Index in `items` of `link`'s head.
    fn head(&self, link: usize) -> Option<usize> {
        if link >= self.links {
            return None;
        }
        self.items.iter().position(|q| !q.taken_by(link))
    }

    /// The head of `link`'s queue (`None` if empty or no such link).
    pub fn peek(&self, link: usize) -> Option<Pending> {
        self.head(link).map(|i| self.items[i].pending)
    }

    /// Takes the head of `link`'s queue.
    pub fn pop(&mut self, link: usize) -> Option<Pending> {
        let i = self.head(link)?;
        let q = &mut self.items[i];
        let p = q.pending;
        q.taken[link / 64] |= 1 << (link % 64);
        q.left -= 1;
        if q.left == 0 {
            let done = self.items.remove(i);
            self.spare.push(done.taken);
        } else if q.first == link {
            while q.taken_by(q.first) {
                q.first += 1;
            }
        }
        Some(p)
    }

    /// Whether every link has taken every item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Among `links`, the one whose head goes first (ties to the lowest link; `None` when
    /// all are empty), as [`LinkQueues::most_urgent`](super::LinkQueues::most_urgent)
    /// chooses. Over all links the winner is the lowest link yet to take the most urgent
    /// item (its head can be nothing more urgent), so it is read off the first items;
    /// offered links without it are scanned. Where `links` holds link `l` at index `l` (a
    /// server offered all its workers), finding the winner among them takes no scan.
    pub fn most_urgent(&self, links: &[usize]) -> Option<usize> {
        let first = self.items.first()?;
        // The same item queued for two steps shares its key: the lower link wins the tie.
        let best = (self.items.iter())
            .take_while(|q| q.key == first.key)
            .map(|q| q.first)
            .min()?;
        if links.get(best) == Some(&best) || links.contains(&best) {
            return Some(best);
        }
        (links.iter())
            .filter_map(|&l| self.head(l).map(|i| (self.items[i].key, l)))
            .min()
            .map(|(_, l)| l)
    }
}

#[cfg(test)]
mod tests {
    use super::super::LinkQueues;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The same answers as per-link queues that are only ever pushed to all at once,
        /// for any interleaving of pushes (the same item queued again included), pops on any
        /// link, and choices among any subset of links, up to 130 links (three bitmap words).
        #[test]
        fn answers_as_per_link_queues_pushed_to_all(
            links in prop_oneof![1usize..6, 60usize..70, 120usize..131],
            ops in proptest::collection::vec((0u8..3, 0usize..200, 0i64..4, 0usize..5, any::<u64>()), 1..300),
            fifo in any::<bool>(),
        ) {
            let kind = if fifo { SchedulerKind::Fifo } else { SchedulerKind::Priority };
            let mut b = BroadcastQueue::new(kind, links);
            let mut q = LinkQueues::new(kind, links);
            for (arrival, &(op, link, priority, item, subset)) in ops.iter().enumerate() {
                if op == 0 {
                    let p = Pending { item, priority, sequence: item as u64, arrival: arrival as u64 };
                    b.push_all(p);
                    (0..links).for_each(|l| q.push(l, p));
                } else {
                    // Pops favour low links, as a driver taking the most urgent link does.
                    let link = if op == 1 { link % links } else { link % links.min(3) };
                    prop_assert_eq!(b.pop(link), q.pop(link));
                }
                let offered: Vec<usize> = (0..links + 2).filter(|&l| subset >> (l % 64) & 1 == 1).collect();
                let all: Vec<usize> = (0..links).collect();
                prop_assert_eq!(b.most_urgent(&all), q.most_urgent(0..links));
                prop_assert_eq!(b.most_urgent(&offered), q.most_urgent(offered.iter().copied()));
                prop_assert_eq!(b.peek(link % links), q.peek(link % links));
                prop_assert_eq!(b.is_empty(), q.is_empty());
            }
        }
    }

    #[test]
    fn an_item_leaves_once_every_link_took_it() {
        let mut b = BroadcastQueue::new(SchedulerKind::Priority, 3);
        let p = |item, priority| Pending {
            item,
            priority,
            sequence: 0,
            arrival: item as u64,
        };
        b.push_all(p(7, 2));
        b.push_all(p(8, 1));
        assert_eq!(b.most_urgent(&[0, 1, 2]), Some(0));
        assert_eq!(b.pop(0).map(|p| p.item), Some(8));
        assert_eq!(b.most_urgent(&[0, 1, 2]), Some(1));
        assert_eq!(b.most_urgent(&[1, 2]), Some(1));
        assert_eq!(b.most_urgent(&[2]), Some(2));
        assert_eq!(b.most_urgent(&[0]), Some(0));
        for link in [1, 2, 0, 1, 2] {
            assert!(b.pop(link).is_some());
        }
        assert!(b.is_empty());
        assert_eq!(b.pop(0), None);
        assert_eq!(b.pop(5), None);
    }
}
