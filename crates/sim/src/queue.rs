//! The event queue: events ordered by virtual time, ties in insertion order, so the
//! simulation never depends on how a heap breaks ties.
//!
//! Times only grow (every event is scheduled at or after the current one), so a calendar
//! fits: the next 1.05 ms from the current bucket on are a ring of 4,096 buckets of 256 ns,
//! each a list of its events in (time, insertion) order, with a bit per occupied bucket;
//! an event further ahead waits in a binary heap and moves into its bucket once the window
//! reaches it. A frame's events (its sender's window reopening, its delivery) land within
//! the window, so most events are filed once and found by a scan of a bit map. Beyond the
//! window a second ring of 4,096 coarse buckets, one window wide each (4.3 s in all),
//! holds the far events unordered; a coarse bucket goes into the heap only when the
//! window's end reaches it, so the heap holds about one window's events (under incast a
//! lossy 1,024-worker simulation delivers frames tens of milliseconds ahead, and one heap
//! of them all was its largest cost). Events beyond the coarse ring wait in a heap of
//! their own. Measured on
//! the 1,024-worker simulation (docs/BENCHMARKS.md): the radix heap with 4-bit digits used
//! before moved each event down four or five levels (a sixth of the instructions); a 4-ary
//! heap was slower than that; a window of 262 us sent a frame's delivery to the heap too
//! often, and wider buckets made their lists long.

use std::collections::BinaryHeap;

/// Something that happens at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A worker finished the layer it was computing.
    ComputeDone(usize),
    /// A host's egress backlog has dropped below its send window.
    NicReady(usize),
    /// A frame (slot in the in-flight table) reached the receiver's NIC.
    Arrive(usize),
    /// A frame is handed to the receiving endpoint.
    Deliver(usize),
    /// A host's endpoint timer ([`syncopate_core::strategy::Endpoint::poll_timeout`]) is due.
    Timeout(usize),
    /// A fault of the run's list strikes (index into it).
    Strike(usize),
    /// A control frame (slot in the control table) reaches its receiver.
    Control(usize),
    /// A host's datagram links have something due (a pacer's departure, a feedback, a rate
    /// controller's timeout).
    Datagram(usize),
    /// A host's liveness clocks need looking at (a heartbeat or a peer timeout is due).
    Liveness(usize),
    /// A host's network port has something due (a retransmission, a serialisation start).
    NetPoll {
        /// The host.
        host: usize,
        /// Its ingress port (else its egress).
        ingress: bool,
    },
}

/// Bits of a bucket's width in nanoseconds.
const WIDTH_BITS: u32 = 8;
/// Buckets of the window (a power of two, at most 64 x 64: one bit map word per 64).
const BUCKETS: usize = 4096;
/// Words of the occupancy bit map.
const WORDS: usize = BUCKETS / 64;
/// Nanoseconds the window spans.
const SPAN: u64 = (BUCKETS as u64) << WIDTH_BITS;
/// The end of a bucket's list, or of the free list.
const NIL: usize = usize::MAX;
/// Bits of a coarse bucket's width in nanoseconds: one window.
const COARSE_BITS: u32 = WIDTH_BITS + BUCKETS.trailing_zeros();
/// Coarse buckets in the ring.
const COARSE: u64 = 4096;

/// An event waiting in the window, linked into its bucket's list (or the free list): 32
/// bytes on a 32-byte boundary, so reading one reads one cache line. It needs no insertion
/// sequence: events of equal time are filed in the order they were pushed (see
/// [`EventQueue::file`]), so a list in time order, equal times in filing order, is in
/// (time, sequence) order.
#[derive(Debug, Clone, Copy)]
#[repr(align(32))]
struct Node {
    time: u64,
    event: Event,
    next: usize,
}

/// A bucket's list: its first and last node.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    head: usize,
    tail: usize,
}

/// An event beyond the window, ordered earliest first (then first pushed) in a max-heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Far {
    time: u64,
    seq: u64,
    event: Event,
}

impl Ord for Far {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

impl PartialOrd for Far {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A monotone min-queue of `(time, event)`.
#[derive(Debug)]
pub(crate) struct EventQueue {
    /// The time of the last event popped: nothing is earlier, and the window starts at its
    /// bucket.
    last: u64,
    /// Insertion order of the next event beyond the window (those in it need none).
    seq: u64,
    nodes: Vec<Node>,
    /// The first free node.
    free: usize,
    buckets: Vec<Bucket>,
    /// A bit per occupied bucket.
    occupied: [u64; WORDS],
    /// A bit per word of `occupied` that is not 0.
    words: u64,
    /// Events at or after the window's end whose coarse bucket (`time >> COARSE_BITS`) is
    /// before `spilled`.
    far: BinaryHeap<Far>,
    /// The coarse buckets from `spilled` on (bucket `c` at `c % COARSE`), unordered.
    coarse: Vec<Vec<Far>>,
    /// Events in `coarse`.
    in_coarse: usize,
    /// Events of coarse buckets at or past `spilled + COARSE`.
    beyond: BinaryHeap<Far>,
    /// The first coarse bucket not yet moved into `far`.
    spilled: u64,
    /// The node last filed inside a bucket's list (not at either end), while it is in the
    /// window (`NIL` once popped): a walk along that list starts there when it can.
    cursor: usize,
}

impl Default for EventQueue {
    fn default() -> Self {
        Self {
            last: 0,
            seq: 0,
            nodes: Vec::new(),
            free: NIL,
            buckets: vec![
                Bucket {
                    head: NIL,
                    tail: NIL
                };
                BUCKETS
            ],
            occupied: [0; WORDS],
            words: 0,
            far: BinaryHeap::new(),
            coarse: vec![Vec::new(); COARSE as usize],
            in_coarse: 0,
            beyond: BinaryHeap::new(),
            spilled: 0,
            cursor: NIL,
        }
    }
}

/// The bucket that holds time `t` while `t` is in the window.
fn bucket_of(t: u64) -> usize {
    (t >> WIDTH_BITS) as usize & (BUCKETS - 1)
}

impl EventQueue {
    /// Schedules `event` at `time_ns`; a time before the last popped one counts as that one.
    #[inline]
    pub fn push(&mut self, time_ns: u64, event: Event) {
        debug_assert!(time_ns >= self.last, "event scheduled in the past");
        let time = time_ns.max(self.last);
        if time < self.window_end() {
            self.file(time, event);
        } else {
            self.push_far(time, event);
        }
    }

    /// Queues an event beyond the window: in the heap if its coarse bucket was moved
    /// there, else in its coarse bucket, else beyond the coarse ring.
    #[inline(never)]
    fn push_far(&mut self, time: u64, event: Event) {
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        let far = Far { time, seq, event };
        let c = time >> COARSE_BITS;
        if c < self.spilled {
            self.far.push(far);
        } else if c - self.spilled < COARSE {
            self.coarse[(c % COARSE) as usize].push(far);
            self.in_coarse += 1;
        } else {
            self.beyond.push(far);
        }
    }

    /// Moves every coarse bucket up to `last` (inclusive), and the events beyond the ring
    /// that fall in them, into the heap.
    fn spill_through(&mut self, last: u64) {
        while self.spilled <= last {
            if self.in_coarse == 0 {
                // Nothing in the ring: skip to `last` at once.
                self.spilled = self.spilled.max(last);
            }
            let c = self.spilled;
            // Taken, not drained: a bucket keeps no capacity for the ring's next turn.
            let bucket = std::mem::take(&mut self.coarse[(c % COARSE) as usize]);
            self.in_coarse -= bucket.len();
            self.far.extend(bucket);
            while self
                .beyond
                .peek()
                .is_some_and(|f| f.time >> COARSE_BITS <= c)
            {
                if let Some(f) = self.beyond.pop() {
                    self.far.push(f);
                }
            }
            self.spilled = c + 1;
        }
    }

    /// Spills coarse buckets until the heap holds the earliest far event (`false`: there
    /// are none).
    fn spill_next(&mut self) -> bool {
        while self.far.is_empty() {
            let next = if self.in_coarse > 0 {
                self.spilled
            } else {
                match self.beyond.peek() {
                    Some(f) => f.time >> COARSE_BITS,
                    None => return false,
                }
            };
            self.spill_through(next);
        }
        true
    }

    /// The earliest event (first scheduled among equal times).
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        loop {
            if let Some(b) = self.first_occupied() {
                let node = self.unlink_head(b);
                self.last = node.time;
                if self.far_due() {
                    self.admit_far();
                }
                return Some((node.time, node.event));
            }
            // The window is empty: it moves to the earliest far event.
            if !self.spill_next() {
                return None;
            }
            self.last = self.far.peek()?.time;
            self.admit_far();
        }
    }

    /// The next event [`EventQueue::pop`] would take, where it is in the window already (a
    /// hint for prefetching: `None` says nothing about the events beyond it).
    pub fn peek_in_window(&self) -> Option<Event> {
        let b = self.first_occupied()?;
        self.nodes.get(self.buckets[b].head).map(|n| n.event)
    }

    /// The first instant past the window (which starts at the last event's bucket).
    fn window_end(&self) -> u64 {
        (self.last & !((1u64 << WIDTH_BITS) - 1)).saturating_add(SPAN)
    }

    /// Whether the window now reaches the earliest far event (rarely: out of line, the
    /// heap's pop would make every pop save and restore its registers).
    fn far_due(&self) -> bool {
        let end = self.window_end();
        (end - 1) >> COARSE_BITS >= self.spilled || self.far.peek().is_some_and(|f| f.time < end)
    }

    /// Files the far events the window now reaches into their buckets (first moving the
    /// coarse buckets it reaches into the heap).
    #[inline(never)]
    fn admit_far(&mut self) {
        let end = self.window_end();
        self.spill_through((end - 1) >> COARSE_BITS);
        while self.far.peek().is_some_and(|f| f.time < end) {
            if let Some(f) = self.far.pop() {
                self.file(f.time, f.event);
            }
        }
    }

    /// Links an event of the window into its bucket's list, after every event of its time
    /// or earlier. That is (time, sequence) order because events of one time are filed in
    /// sequence order: one pushed at a time already in the window is filed at once, after
    /// every earlier push of that time (a far one was admitted as soon as the window reached
    /// it, in heap order, before anything could be pushed at its time directly).
    fn file(&mut self, time: u64, event: Event) {
        let node = Node {
            time,
            event,
            next: NIL,
        };
        let n = if self.free == NIL {
            self.nodes.push(node);
            self.nodes.len() - 1
        } else {
            let n = self.free;
            self.free = self.nodes[n].next;
            self.nodes[n] = node;
            n
        };
        let b = bucket_of(time);
        let bucket = self.buckets[b];
        if bucket.head == NIL {
            self.buckets[b] = Bucket { head: n, tail: n };
            self.occupied[b / 64] |= 1 << (b % 64);
            self.words |= 1 << (b / 64);
        } else if self.nodes[bucket.tail].time <= time {
            self.nodes[bucket.tail].next = n;
            self.buckets[b].tail = n;
        } else if time < self.nodes[bucket.head].time {
            self.nodes[n].next = bucket.head;
            self.buckets[b].head = n;
        } else {
            let mut prev = self.walk_start(b, time);
            loop {
                let next = self.nodes[prev].next;
                if next == NIL || time < self.nodes[next].time {
                    break;
                }
                prev = next;
            }
            self.nodes[n].next = self.nodes[prev].next;
            self.nodes[prev].next = n;
            self.cursor = n;
        }
    }

    /// Where to start looking for the place of an event at `time` in bucket `b`'s list:
    /// the node last filed inside a list if it is in this one and not later, else the
    /// head. A bucket can hold a thousand events of one instant (every worker's, in
    /// lockstep), and the events filed inside it then come in time order: from its head,
    /// each would walk past all of them.
    fn walk_start(&self, b: usize, time: u64) -> usize {
        let c = self.cursor;
        match self.nodes.get(c) {
            Some(node) if bucket_of(node.time) == b && node.time <= time => c,
            _ => self.buckets[b].head,
        }
    }

    /// The first occupied bucket from the current one on, around the ring.
    fn first_occupied(&self) -> Option<usize> {
        if self.words == 0 {
            return None;
        }
        let c = bucket_of(self.last);
        let (w, bit) = (c / 64, c % 64);
        let here = self.occupied[w] & (u64::MAX << bit);
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        // Later words first, then around the ring from the first (ending with word `w`'s
        // buckets before `c`).
        let later = self.words & (u64::MAX << w).wrapping_shl(1);
        let next = if later != 0 {
            later.trailing_zeros()
        } else {
            self.words.trailing_zeros()
        } as usize;
        Some(next * 64 + self.occupied[next].trailing_zeros() as usize)
    }

    /// Takes bucket `b`'s first event.
    fn unlink_head(&mut self, b: usize) -> Node {
        let n = self.buckets[b].head;
        if n == self.cursor {
            self.cursor = NIL;
        }
        let node = self.nodes[n];
        self.buckets[b].head = node.next;
        if node.next == NIL {
            self.buckets[b].tail = NIL;
            let word = &mut self.occupied[b / 64];
            *word &= !(1 << (b % 64));
            if *word == 0 {
                self.words &= !(1 << (b / 64));
            }
        }
        self.nodes[n].next = self.free;
        self.free = n;
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    #[test]
    fn earliest_first_then_insertion_order() {
        let mut q = EventQueue::default();
        q.push(5, Event::Deliver(9));
        q.push(3, Event::NicReady(1));
        q.push(5, Event::ComputeDone(0));
        q.push(5, Event::Arrive(2));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (3, Event::NicReady(1)),
                (5, Event::Deliver(9)),
                (5, Event::ComputeDone(0)),
                (5, Event::Arrive(2))
            ]
        );
    }

    proptest! {
        /// Same order as a binary heap on (time, insertion sequence), for any interleaving of
        /// pushes (at or after the last pop) and pops: equal times, times within a bucket,
        /// around the window's end, far beyond it; an event peeked in the window is the next.
        #[test]
        fn matches_a_heap_ordered_by_time_then_sequence(
            ops in prop::collection::vec((any::<bool>(), prop_oneof![
                (0u64..1_000, 0u32..40).prop_map(|(d, shift)| d << shift),
                0u64..300,
                SPAN - 300..SPAN + 300,
                0..3 * SPAN,
                ((COARSE - 2) << COARSE_BITS)..((COARSE + 2) << COARSE_BITS),
            ]), 1..400),
        ) {
            let mut q = EventQueue::default();
            let mut reference = BinaryHeap::new();
            let (mut now, mut seq) = (0u64, 0usize);
            for (pop, delta) in ops {
                if pop {
                    let peeked = q.peek_in_window();
                    let got = q.pop();
                    let want = reference.pop().map(|Reverse((t, s))| (t, Event::Deliver(s)));
                    prop_assert_eq!(got, want);
                    if let Some(event) = peeked {
                        prop_assert_eq!(Some(event), got.map(|(_, e)| e), "the peek is the next pop");
                    }
                    if let Some((t, _)) = got {
                        now = t;
                    }
                } else {
                    let t = now + delta;
                    q.push(t, Event::Deliver(seq));
                    reference.push(Reverse((t, seq)));
                    seq += 1;
                }
            }
            while let Some(Reverse((t, s))) = reference.pop() {
                prop_assert_eq!(q.pop(), Some((t, Event::Deliver(s))));
            }
            prop_assert_eq!(q.pop(), None);
        }
    }
}
