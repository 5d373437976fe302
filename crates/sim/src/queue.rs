//! The event queue: events ordered by virtual time, ties in insertion order, so the
//! simulation never depends on how a heap breaks ties.
//!
//! Times only grow (every event is scheduled at or after the current one), so a radix heap
//! fits: bucket `i` holds the events whose time first differs from the last popped time in
//! bit `i - 1`, bucket 0 those at exactly that time. Popping empties the lowest bucket into
//! lower ones around its earliest time, in order, so equal times stay in insertion order.
//! Amortised O(1) per event and far fewer unpredictable branches than a binary heap.

use std::collections::VecDeque;

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

/// A monotone min-queue of `(time, event)`.
#[derive(Debug)]
pub(crate) struct EventQueue {
    last: u64,
    now: VecDeque<Event>,
    buckets: Vec<Vec<(u64, Event)>>,
    /// Bit `i` set: bucket `i` holds events (the lowest found without scanning).
    occupied: u64,
}

impl Default for EventQueue {
    fn default() -> Self {
        Self {
            last: 0,
            now: VecDeque::new(),
            buckets: vec![Vec::new(); 64],
            occupied: 0,
        }
    }
}

impl EventQueue {
    /// Schedules `event` at `time_ns`; a time before the last popped one counts as that one.
    pub fn push(&mut self, time_ns: u64, event: Event) {
        debug_assert!(time_ns >= self.last, "event scheduled in the past");
        let time = time_ns.max(self.last);
        self.place(time, event);
    }

    /// Files an event of `time >= last` into the current instant or its bucket.
    fn place(&mut self, time: u64, event: Event) {
        match time ^ self.last {
            0 => self.now.push_back(event),
            diff => {
                let i = 63 - diff.leading_zeros() as usize;
                self.buckets[i].push((time, event));
                self.occupied |= 1 << i;
            }
        }
    }

    /// The earliest event (first scheduled among equal times).
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        if self.now.is_empty() {
            if self.occupied == 0 {
                return None;
            }
            let i = self.occupied.trailing_zeros() as usize;
            self.occupied &= !(1 << i);
            let mut bucket = std::mem::take(&mut self.buckets[i]);
            self.last = bucket.iter().map(|&(t, _)| t).min()?;
            // Every event of bucket `i` differs from the new `last` below bit `i`: each
            // goes to a lower bucket or to the current instant, in order.
            for &(time, event) in &bucket {
                self.place(time, event);
            }
            // Keep the bucket's allocation for reuse.
            bucket.clear();
            self.buckets[i] = bucket;
        }
        self.now.pop_front().map(|e| (self.last, e))
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
        /// pushes (at or after the last pop) and pops.
        #[test]
        fn matches_a_heap_ordered_by_time_then_sequence(
            ops in prop::collection::vec((any::<bool>(), 0u64..1_000, 0u32..40), 1..400),
        ) {
            let mut q = EventQueue::default();
            let mut reference = BinaryHeap::new();
            let (mut now, mut seq) = (0u64, 0usize);
            for (pop, delta, shift) in ops {
                if pop {
                    let got = q.pop();
                    let want = reference.pop().map(|Reverse((t, s))| (t, Event::Deliver(s)));
                    prop_assert_eq!(got, want);
                    if let Some((t, _)) = got {
                        now = t;
                    }
                } else {
                    let t = now + (delta << shift.min(20));
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
