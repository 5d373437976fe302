//! The event queue: events ordered by virtual time, ties in insertion order, so the
//! simulation never depends on how a heap breaks ties.
//!
//! Times only grow (every event is scheduled at or after the current one), so a radix heap
//! fits, here with 4-bit digits: an event waits at the level of the highest digit in which
//! its time differs from the last popped time, in the slot of its own digit there; the
//! events at exactly that time wait in a queue of their own. Popping empties the earliest
//! occupied slot (the lowest set bit of one bit map) into lower levels around its earliest
//! time, in order, so equal times (always in one slot) stay in insertion order. An event
//! moves down once per level it passes, a few times in practice; with 1-bit digits it moved
//! once per differing bit (a tenth of a 1,024-worker simulation's instructions), and 8-bit
//! digits spread the events over so many slots that the cache misses ate the gain.

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

/// Bits of a digit.
const DIGIT_BITS: u32 = 4;
/// Slots per level (values of a digit).
const SLOTS: usize = 1 << DIGIT_BITS;
/// Levels (digits of a time).
const LEVELS: usize = (u64::BITS / DIGIT_BITS) as usize;
/// Words of the occupancy bit map (a bit per slot, level by level).
const WORDS: usize = LEVELS * SLOTS / 64;

/// A monotone min-queue of `(time, event)`.
#[derive(Debug)]
pub(crate) struct EventQueue {
    last: u64,
    now: VecDeque<Event>,
    /// Level `l`'s slot `d` at `l * SLOTS + d`.
    slots: Vec<Vec<(u64, Event)>>,
    /// A bit per occupied slot, in the slots' order: the lowest set bit is the earliest slot.
    occupied: [u64; WORDS],
    /// A bit per word of `occupied` that is not 0.
    words: u64,
}

impl Default for EventQueue {
    fn default() -> Self {
        Self {
            last: 0,
            now: VecDeque::new(),
            slots: vec![Vec::new(); LEVELS * SLOTS],
            occupied: [0; WORDS],
            words: 0,
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

    /// Files an event of `time >= last` into the current instant or its level's slot.
    fn place(&mut self, time: u64, event: Event) {
        let diff = time ^ self.last;
        if diff == 0 {
            self.now.push_back(event);
            return;
        }
        let level = (u64::BITS - 1 - diff.leading_zeros()) / DIGIT_BITS;
        let digit = (time >> (level * DIGIT_BITS)) as usize & (SLOTS - 1);
        let i = level as usize * SLOTS + digit;
        self.slots[i].push((time, event));
        self.occupied[i / 64] |= 1 << (i % 64);
        self.words |= 1 << (i / 64);
    }

    /// The earliest occupied slot, marked empty.
    fn take_lowest_slot(&mut self) -> Option<usize> {
        if self.words == 0 {
            return None;
        }
        let w = self.words.trailing_zeros() as usize;
        let word = &mut self.occupied[w];
        let i = w * 64 + word.trailing_zeros() as usize;
        *word &= *word - 1;
        if *word == 0 {
            self.words &= !(1 << w);
        }
        Some(i)
    }

    /// The earliest event (first scheduled among equal times).
    pub fn pop(&mut self) -> Option<(u64, Event)> {
        if self.now.is_empty() {
            let i = self.take_lowest_slot()?;
            let mut slot = std::mem::take(&mut self.slots[i]);
            self.last = slot.iter().map(|&(t, _)| t).min()?;
            // Every event of the slot agrees with the new `last` down to the slot's digit:
            // each goes to a lower level or to the current instant, in order.
            for &(time, event) in &slot {
                self.place(time, event);
            }
            // Keep the slot's allocation for reuse.
            slot.clear();
            self.slots[i] = slot;
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
                    let t = now + (delta << shift);
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
