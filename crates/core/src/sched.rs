//! Schedulers: which queued slice goes next on a link.
//!
//! A scheduler only orders; the driver decides *when* a link can take another frame (its
//! bounded in-flight window), so a slice enqueued later can overtake queued ones at the next
//! frame boundary when the scheduler says so: that is P3's preemption at slice boundaries.
//!
//! Every scheduler orders by a total key ([`SchedulerKind::order_key`]), so an endpoint with
//! one queue per link can also pick the most urgent frame across its links when they share
//! one network interface.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

mod broadcast;

pub use broadcast::BroadcastQueue;

/// A unit of work waiting for a link: a slice (or ring segment) with its ordering data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pending {
    /// Index of the slice (or segment) in the owner's table.
    pub item: usize,
    /// Priority: smaller goes first under priority scheduling (layer index from the input).
    pub priority: i64,
    /// Tie-breaker within a priority (slice sequence within the key).
    pub sequence: u64,
    /// When the work became ready, as a counter the endpoint increments for every item it
    /// queues on any link: the FIFO order.
    pub arrival: u64,
}

/// Which scheduler a job uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerKind {
    /// Order of readiness (MXNet KVStore's behaviour: the baseline).
    #[default]
    Fifo,
    /// P3: lowest layer index first, then slice sequence, then item: a strict total order.
    Priority,
    /// ByteScheduler: priority order, with at most a credit of bytes in flight (pushed and
    /// not yet answered) per worker.
    Credit,
}

impl SchedulerKind {
    /// Every kind, for listings and sweeps.
    pub const ALL: [SchedulerKind; 3] = [
        SchedulerKind::Fifo,
        SchedulerKind::Priority,
        SchedulerKind::Credit,
    ];

    /// The name used on the command line and in configs.
    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Fifo => "fifo",
            SchedulerKind::Priority => "priority",
            SchedulerKind::Credit => "credit",
        }
    }

    /// The kind named `name` (as [`SchedulerKind::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// One line on what it does, for listings such as `--help`.
    pub fn description(self) -> &'static str {
        match self {
            SchedulerKind::Fifo => "order of readiness (MXNet KVStore's baseline)",
            SchedulerKind::Priority => "layer nearest the input first, preempting at frame boundaries (P3)",
            SchedulerKind::Credit => {
                "priority order with at most the credit of bytes pushed and unanswered (ByteScheduler)"
            }
        }
    }

    /// The key this scheduler orders by: smaller goes first. Distinct items have distinct
    /// keys as long as arrival stamps (FIFO) or items (priority) are distinct.
    pub fn order_key(self, p: &Pending) -> OrderKey {
        match self {
            SchedulerKind::Fifo => (0, p.arrival, p.item as u64),
            SchedulerKind::Priority | SchedulerKind::Credit => {
                (p.priority, p.sequence, p.item as u64)
            }
        }
    }

    /// Whether the kind limits the bytes in flight.
    pub fn uses_credit(self) -> bool {
        self == SchedulerKind::Credit
    }
}

/// Orders the work waiting for one link.
pub trait Scheduler: Send {
    /// Adds ready work.
    fn push(&mut self, p: Pending);
    /// Takes the next item to transmit.
    fn pop(&mut self) -> Option<Pending>;
    /// The item [`Scheduler::pop`] would return.
    fn peek(&self) -> Option<Pending>;
    /// Items waiting.
    fn len(&self) -> usize;
    /// Whether nothing waits.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// First in, first out.
#[derive(Debug, Default)]
pub struct Fifo {
    queue: VecDeque<Pending>,
}

impl Scheduler for Fifo {
    fn push(&mut self, p: Pending) {
        self.queue.push_back(p);
    }
    fn pop(&mut self) -> Option<Pending> {
        self.queue.pop_front()
    }
    fn peek(&self) -> Option<Pending> {
        self.queue.front().copied()
    }
    fn len(&self) -> usize {
        self.queue.len()
    }
}

/// Smallest [`SchedulerKind::order_key`] first (P3's priority queue; ByteScheduler's order).
#[derive(Debug)]
pub struct PriorityQueue {
    heap: BinaryHeap<Reverse<Entry>>,
}

/// What schedulers sort by: smaller goes first.
pub type OrderKey = (i64, u64, u64);

/// A pending item in the heap, ordered by the priority kinds' key `(priority, sequence,
/// item)` (both kinds a [`PriorityQueue`] serves order alike): the item alone, 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry(Pending);

impl Entry {
    fn key(&self) -> OrderKey {
        SchedulerKind::Priority.order_key(&self.0)
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.key(), self.0.arrival).cmp(&(other.key(), other.0.arrival))
    }
}

impl PriorityQueue {
    /// An empty queue ordered as `kind` orders (a priority kind: FIFO has [`Fifo`]).
    pub fn new(kind: SchedulerKind) -> Self {
        debug_assert!(kind != SchedulerKind::Fifo, "a priority queue for FIFO");
        Self {
            heap: BinaryHeap::new(),
        }
    }
}

impl Scheduler for PriorityQueue {
    fn push(&mut self, p: Pending) {
        self.heap.push(Reverse(Entry(p)));
    }
    fn pop(&mut self) -> Option<Pending> {
        self.heap.pop().map(|Reverse(e)| e.0)
    }
    fn peek(&self) -> Option<Pending> {
        self.heap.peek().map(|Reverse(e)| e.0)
    }
    fn len(&self) -> usize {
        self.heap.len()
    }
}

/// A new scheduler of the given kind.
pub fn new_scheduler(kind: SchedulerKind) -> Box<dyn Scheduler> {
    Box::new(AnyScheduler::new(kind))
}

/// A scheduler of any kind held by value (no box, no virtual call): [`LinkQueues`] keeps one
/// per link side by side, and a simulated worker reads one of its 32 at every frame.
#[derive(Debug)]
pub enum AnyScheduler {
    /// [`SchedulerKind::Fifo`].
    Fifo(Fifo),
    /// The priority kinds.
    Priority(PriorityQueue),
}

impl AnyScheduler {
    /// An empty scheduler of the given kind.
    pub fn new(kind: SchedulerKind) -> Self {
        match kind {
            SchedulerKind::Fifo => Self::Fifo(Fifo::default()),
            SchedulerKind::Priority | SchedulerKind::Credit => {
                Self::Priority(PriorityQueue::new(kind))
            }
        }
    }
}

impl Scheduler for AnyScheduler {
    fn push(&mut self, p: Pending) {
        match self {
            Self::Fifo(q) => q.push(p),
            Self::Priority(q) => q.push(p),
        }
    }
    fn pop(&mut self) -> Option<Pending> {
        match self {
            Self::Fifo(q) => q.pop(),
            Self::Priority(q) => q.pop(),
        }
    }
    fn peek(&self) -> Option<Pending> {
        match self {
            Self::Fifo(q) => q.peek(),
            Self::Priority(q) => q.peek(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Self::Fifo(q) => q.len(),
            Self::Priority(q) => q.len(),
        }
    }
}

/// Links from which [`LinkQueues`] keeps a tournament tree over its heads: below, a scan of
/// the offered links' heads costs less than keeping the tree (a worker and its few servers);
/// above, the tree does (a simulated worker and its 32 servers: 3 % fewer instructions in
/// all than with scans; a server and its thousand workers: no scan of them per frame).
const TREE_MIN_LINKS: usize = 16;

/// One queue per link, with the order key of every queue's head kept side by side and,
/// for many links, a tournament tree over them, so that the most urgent link among many is
/// found without reading every queue (a server with a thousand workers asks for it once
/// per frame).
pub struct LinkQueues {
    kind: SchedulerKind,
    queues: Vec<AnyScheduler>,
    /// `heads[l]`: the order key of `queues[l]`'s head (`None` when it is empty).
    heads: Vec<Option<OrderKey>>,
    /// A tournament over the heads (empty below [`TREE_MIN_LINKS`] links): node `i` holds
    /// the winner of nodes `2i` and `2i + 1` (the smaller `(head, link)`, empty heads
    /// losing), leaf `leaves + l` holds link `l`, node 1 the overall winner.
    tree: Vec<usize>,
    leaves: usize,
}

impl LinkQueues {
    /// `links` empty queues ordered as `kind` orders.
    pub fn new(kind: SchedulerKind, links: usize) -> Self {
        Self::build(kind, links, links >= TREE_MIN_LINKS)
    }

    /// `links` empty queues, with a tournament tree over their heads or without.
    fn build(kind: SchedulerKind, links: usize, with_tree: bool) -> Self {
        let leaves = if with_tree {
            links.next_power_of_two()
        } else {
            0
        };
        let mut tree = vec![0; 2 * leaves];
        for (l, leaf) in tree[leaves..].iter_mut().enumerate() {
            *leaf = l;
        }
        for i in (1..leaves).rev() {
            tree[i] = tree[2 * i];
        }
        Self {
            kind,
            queues: (0..links).map(|_| AnyScheduler::new(kind)).collect(),
            heads: vec![None; links],
            tree,
            leaves,
        }
    }

    /// Queues `p` on `link`.
    pub fn push(&mut self, link: usize, p: Pending) {
        self.queues[link].push(p);
        self.refresh(link);
    }

    /// The head of `link`'s queue (`None` if empty or no such link).
    pub fn peek(&self, link: usize) -> Option<Pending> {
        self.queues.get(link)?.peek()
    }

    /// Takes the head of `link`'s queue.
    pub fn pop(&mut self, link: usize) -> Option<Pending> {
        let p = self.queues.get_mut(link)?.pop();
        self.refresh(link);
        p
    }

    /// Whether every queue is empty.
    pub fn is_empty(&self) -> bool {
        self.most_urgent_of_all().is_none()
    }

    /// Among `links`, the one whose head goes first (ties to the lowest link; `None` when
    /// all are empty). Links out of range are ignored. With the tree, O(links) comparisons
    /// of integers when the overall winner is among them (a driver offering every link, or
    /// every link that can win); otherwise a scan of their heads.
    pub fn most_urgent(&self, links: impl Iterator<Item = usize> + Clone) -> Option<usize> {
        let offered = |best: usize| links.clone().any(|l| l == best);
        self.most_urgent_offered(links.clone(), offered)
    }

    /// [`LinkQueues::most_urgent`], told by `offered` whether a link is among `links` (for
    /// a caller that knows faster than a walk along them, as a scan of a slice of ranks is
    /// faster than mapping each to its link).
    pub fn most_urgent_offered(
        &self,
        links: impl Iterator<Item = usize>,
        offered: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        if !self.tree.is_empty() {
            let best = self.most_urgent_of_all()?;
            if offered(best) {
                return Some(best);
            }
        }
        links
            .filter_map(|l| self.heads.get(l).copied().flatten().map(|k| (k, l)))
            .min()
            .map(|(_, l)| l)
    }

    /// The link whose head goes first over all links (ties to the lowest link).
    pub fn most_urgent_of_all(&self) -> Option<usize> {
        let Some(&best) = self.tree.get(1) else {
            return self.most_urgent(0..self.queues.len());
        };
        self.heads.get(best).copied().flatten().map(|_| best)
    }

    /// Link `link`'s head changed: its key, then the tournament up from its leaf, as far as
    /// a node's winner changes or is `link` itself (a node won by another, unchanged link
    /// leaves everything above it as it was). Each node on the way is the winner of the
    /// child on the path, just settled (its head in hand), and of the sibling, unchanged:
    /// one node and one head read per level.
    fn refresh(&mut self, link: usize) {
        let head = self.queues[link].peek().map(|p| self.kind.order_key(&p));
        self.heads[link] = head;
        if self.tree.is_empty() {
            return;
        }
        let (heads, tree) = (&self.heads, &mut self.tree);
        let (mut node, mut cur, mut cur_head) = (self.leaves + link, link, head.as_ref());
        while node > 1 {
            let other = tree[node ^ 1];
            let other_head = heads.get(other).and_then(Option::as_ref);
            // Left against right: equal heads (and two empty ones) to the left.
            let other_wins = if node % 2 == 0 {
                beats(other_head, cur_head)
            } else {
                !beats(cur_head, other_head)
            };
            let winner = if other_wins { other } else { cur };
            node /= 2;
            if winner == tree[node] && winner != link {
                break;
            }
            tree[node] = winner;
            if other_wins {
                (cur, cur_head) = (other, other_head);
            }
        }
    }
}

/// Whether the right-hand head goes before the left-hand one in the tournament: it is
/// smaller, or only it is there.
#[inline(always)]
fn beats(right: Option<&OrderKey>, left: Option<&OrderKey>) -> bool {
    match (left, right) {
        (Some(l), Some(r)) => r < l,
        (None, Some(_)) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pending(item: usize, priority: i64, sequence: u64, arrival: u64) -> Pending {
        Pending {
            item,
            priority,
            sequence,
            arrival,
        }
    }

    fn drain(s: &mut dyn Scheduler) -> Vec<usize> {
        std::iter::from_fn(|| s.pop()).map(|p| p.item).collect()
    }

    #[test]
    fn fifo_keeps_readiness_order() {
        let mut s = new_scheduler(SchedulerKind::Fifo);
        for (i, prio) in [(0, 5), (1, 1), (2, 3)] {
            s.push(pending(i, prio, 0, i as u64));
        }
        assert_eq!(drain(s.as_mut()), vec![0, 1, 2]);
        assert!(s.is_empty());
    }

    #[test]
    fn priority_takes_the_layer_nearest_the_input_first() {
        let mut s = new_scheduler(SchedulerKind::Priority);
        s.push(pending(0, 5, 0, 0));
        s.push(pending(1, 1, 1, 1));
        s.push(pending(2, 1, 0, 2));
        s.push(pending(3, 3, 0, 3));
        assert_eq!(s.peek().map(|p| p.item), Some(2));
        assert_eq!(drain(s.as_mut()), vec![2, 1, 3, 0]);
    }

    /// A high-priority slice enqueued behind 100 queued low-priority slices is sent next.
    #[test]
    fn late_urgent_slice_overtakes_queued_ones() {
        let mut s = new_scheduler(SchedulerKind::Priority);
        for i in 0..100 {
            s.push(pending(i, 10, i as u64, i as u64));
        }
        assert_eq!(s.pop().map(|p| p.item), Some(0));
        s.push(pending(1000, 0, 0, 100));
        assert_eq!(s.pop().map(|p| p.item), Some(1000));
        assert_eq!(s.len(), 99);
    }

    #[test]
    fn most_urgent_compares_heads_across_queues() {
        for (kind, want) in [(SchedulerKind::Priority, 1), (SchedulerKind::Fifo, 0)] {
            let mut q = LinkQueues::new(kind, 3);
            q.push(0, pending(0, 4, 0, 0));
            q.push(1, pending(1, 2, 0, 1));
            assert_eq!(q.most_urgent(0..3), Some(want), "{kind:?}");
            assert_eq!(q.most_urgent([0, 2, 7].into_iter()), Some(0), "{kind:?}");
            assert_eq!(q.most_urgent([2].into_iter()), None);
        }
    }

    proptest! {
        /// The priority order is total and deterministic: whatever the insertion order (and
        /// whatever pops are interleaved), items leave sorted by (priority, sequence, item).
        #[test]
        fn priority_order_is_total_and_deterministic(
            items in proptest::collection::vec((0i64..6, 0u64..4), 1..80),
            shuffle_seed in any::<u64>(),
        ) {
            let all: Vec<Pending> = items
                .iter()
                .enumerate()
                .map(|(i, &(p, s))| pending(i, p, s, i as u64))
                .collect();
            let mut order: Vec<usize> = (0..all.len()).collect();
            let mut x = shuffle_seed | 1;
            for i in (1..order.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut s = new_scheduler(SchedulerKind::Priority);
            for &i in &order {
                s.push(all[i]);
            }
            let got = drain(s.as_mut());
            let mut want: Vec<usize> = (0..all.len()).collect();
            want.sort_by_key(|&i| SchedulerKind::Priority.order_key(&all[i]));
            prop_assert_eq!(got, want);
        }

        /// The kept head keys and the tournament over them always say what the queues'
        /// heads say: with items spread over 1 to 9 links (pushed to one link or to each),
        /// pops interleaved, `most_urgent` over any subset of links picks the link a scan
        /// of those heads picks.
        #[test]
        fn link_queues_pick_what_a_scan_of_the_heads_picks(
            links in 1usize..10,
            ops in proptest::collection::vec((0usize..10, 0i64..6, 0u8..4, any::<u16>()), 1..160),
            fifo in any::<bool>(),
            with_tree in any::<bool>(),
        ) {
            let kind = if fifo { SchedulerKind::Fifo } else { SchedulerKind::Priority };
            let mut q = LinkQueues::build(kind, links, with_tree);
            let mut plain: Vec<Box<dyn Scheduler>> = (0..links).map(|_| new_scheduler(kind)).collect();
            for (i, &(link, prio, op, subset)) in ops.iter().enumerate() {
                let link = link % links;
                let p = pending(i, prio, i as u64, i as u64);
                match op {
                    0 => prop_assert_eq!(q.pop(link), plain[link].pop()),
                    1 => {
                        (0..links).for_each(|l| q.push(l, p));
                        plain.iter_mut().for_each(|s| s.push(p));
                    }
                    _ => {
                        q.push(link, p);
                        plain[link].push(p);
                    }
                }
                let offered: Vec<usize> = (0..links + 1).filter(|l| subset >> l & 1 == 1).collect();
                let scan = |ls: &[usize]| ls.iter()
                    .filter_map(|&l| plain.get(l)?.peek().map(|p| (kind.order_key(&p), l)))
                    .min()
                    .map(|(_, l)| l);
                let all: Vec<usize> = (0..links).collect();
                prop_assert_eq!(q.most_urgent(0..links), scan(&all));
                prop_assert_eq!(q.most_urgent_of_all(), scan(&all));
                prop_assert_eq!(q.most_urgent(offered.iter().copied()), scan(&offered));
                let by_test = q.most_urgent_offered(offered.iter().copied(), |l| offered.contains(&l));
                prop_assert_eq!(by_test, scan(&offered));
                prop_assert_eq!(q.is_empty(), plain.iter().all(|s| s.is_empty()));
            }
        }
    }
}
