//! A finite queue in front of a serialiser, with its discipline: which waiting frame goes
//! next, and which arriving frame is refused.

use std::collections::VecDeque;

use super::profile::QueueDiscipline;
use super::{Nanos, CLASSES};

/// Why a queue refused a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The queue is full (tail drop).
    Full,
    /// The frame is drop-eligible and the queue would pass its drop threshold.
    Threshold,
}

/// A queue holding frames of type `T` until their serialisation starts, and remembering
/// the frames in (or scheduled for) serialisation, which still occupy it until their last
/// bit leaves.
///
/// At a host's egress the host's own TCP frames are admitted whatever the queue holds
/// (TCP's socket keeps what the qdisc cannot), and, with an own share set
/// ([`FrameQueue::set_own_share`]), count toward what other frames meet only up to that
/// share: Linux's TCP small queues let about 1 ms of a flow's data (at least two packets)
/// into the host's qdisc and keep the rest in the socket, so a datagram queues behind a
/// few packets of a large TCP write, not behind the whole write.
#[derive(Debug, Clone)]
pub(crate) struct FrameQueue<T> {
    discipline: QueueDiscipline,
    capacity: Option<usize>,
    /// Bytes past which drop-eligible frames are refused (`prio` only).
    threshold: Option<usize>,
    /// Waiting frames by class (`fifo` uses class 0 only): bytes, the host's own TCP, frame.
    classes: Vec<VecDeque<(usize, bool, T)>>,
    waiting_bytes: usize,
    /// Frames whose serialisation has been scheduled: (last bit out, bytes, own), in the
    /// order of their last bit out.
    serialising: VecDeque<(Nanos, usize, bool)>,
    serialising_bytes: usize,
    /// Of the bytes held (waiting or serialising), those of the host's own TCP frames.
    own_bytes: usize,
    /// The most of `own_bytes` other frames meet (`None`: all of them).
    own_share: Option<usize>,
    /// The most bytes of one frame an acknowledgement queued behind it waits for, and the
    /// held frames' bytes so counted ([`FrameQueue::set_ack_cap`]).
    ack_cap: usize,
    capped_bytes: usize,
}

impl<T> FrameQueue<T> {
    /// A queue of `capacity` bytes (`None`: unbounded) under `discipline`, refusing
    /// drop-eligible frames past `threshold` of the capacity.
    pub fn new(discipline: QueueDiscipline, capacity: Option<usize>, threshold: f64) -> Self {
        let threshold = match discipline {
            QueueDiscipline::Prio => capacity.map(|c| (c as f64 * threshold).floor() as usize),
            QueueDiscipline::Fifo => None,
        };
        let classes = match discipline {
            QueueDiscipline::Prio => CLASSES,
            QueueDiscipline::Fifo => 1,
        };
        Self {
            discipline,
            capacity,
            threshold,
            classes: (0..classes).map(|_| VecDeque::new()).collect(),
            waiting_bytes: 0,
            serialising: VecDeque::new(),
            serialising_bytes: 0,
            own_bytes: 0,
            own_share: None,
            ack_cap: usize::MAX,
            capped_bytes: 0,
        }
    }

    /// Counts each held frame at most `bytes` toward what an acknowledgement arriving
    /// behind it waits for ([`FrameQueue::ack_wait`]): where the model holds a flow's frame
    /// whole, TCP keeps only its window in the queue and the rest in the sender's socket.
    pub fn set_ack_cap(&mut self, bytes: usize) {
        self.ack_cap = bytes.max(1);
    }

    /// What an acknowledgement arriving at `now` waits behind: the held frames' bytes, each
    /// counted at most the cap, and the frame serialising first, if any (last bit out,
    /// bytes), whose bytes are among them.
    pub fn ack_wait(&self, now: Nanos) -> (usize, Option<(Nanos, usize)>) {
        // Frames that left by `now` are forgotten at the next admission; skip them here.
        let mut capped = self.capped_bytes;
        let mut first = None;
        for &(done, bytes, _) in &self.serialising {
            if done > now {
                first = Some((done, bytes));
                break;
            }
            capped = capped.saturating_sub(bytes.min(self.ack_cap));
        }
        (capped, first)
    }

    /// The most of one frame's bytes an acknowledgement waits for.
    pub fn ack_cap(&self) -> usize {
        self.ack_cap
    }

    /// Lets the host's own TCP frames count toward other frames' admission only up to
    /// `bytes` (see the type's documentation).
    pub fn set_own_share(&mut self, bytes: usize) {
        self.own_share = Some(bytes);
    }

    /// The most of the host's own TCP bytes other frames meet, if set.
    pub fn own_share(&self) -> Option<usize> {
        self.own_share
    }

    /// The host's own TCP frames scheduled to serialise past `now`: (last bit out, bytes).
    pub fn own_serialising_after(&self, now: Nanos) -> impl Iterator<Item = (Nanos, usize)> + '_ {
        (self.serialising.iter())
            .filter(move |&&(done, _, own)| own && done > now)
            .map(|&(done, bytes, _)| (done, bytes))
    }

    /// Bytes held at `now`: waiting, plus frames not yet fully serialised.
    pub fn occupancy(&mut self, now: Nanos) -> usize {
        while let Some(&(done, bytes, own)) = self.serialising.front() {
            if done > now {
                break;
            }
            self.serialising.pop_front();
            self.serialising_bytes = self.serialising_bytes.saturating_sub(bytes);
            self.capped_bytes = self.capped_bytes.saturating_sub(bytes.min(self.ack_cap));
            if own {
                self.own_bytes = self.own_bytes.saturating_sub(bytes);
            }
        }
        self.waiting_bytes.saturating_add(self.serialising_bytes)
    }

    /// Whether a frame of `bytes` may enter at `now`. An empty queue takes any frame.
    pub fn admit(&mut self, now: Nanos, bytes: usize, drop_eligible: bool) -> Result<(), Refusal> {
        let all = self.occupancy(now);
        let held = match self.own_share {
            Some(share) => all - self.own_bytes + self.own_bytes.min(share),
            None => all,
        };
        if held == 0 {
            return Ok(());
        }
        let after = held.saturating_add(bytes);
        if self.capacity.is_some_and(|c| after > c) {
            return Err(Refusal::Full);
        }
        if drop_eligible && self.threshold.is_some_and(|t| after > t) {
            return Err(Refusal::Threshold);
        }
        Ok(())
    }

    /// Adds an admitted frame of `bytes` and `class`; `own`: one of the host's own TCP
    /// frames (see [`FrameQueue::set_own_share`]).
    pub fn push(&mut self, bytes: usize, class: u8, own: bool, frame: T) {
        let c = match self.discipline {
            QueueDiscipline::Prio => usize::from(class).min(CLASSES - 1),
            QueueDiscipline::Fifo => 0,
        };
        self.classes[c].push_back((bytes, own, frame));
        self.waiting_bytes = self.waiting_bytes.saturating_add(bytes);
        self.capped_bytes = self.capped_bytes.saturating_add(bytes.min(self.ack_cap));
        if own {
            self.own_bytes = self.own_bytes.saturating_add(bytes);
        }
    }

    /// Takes the frame that goes next: the oldest of the most urgent class.
    /// Its bytes stay counted (as the host's own TCP where they were) until
    /// [`FrameQueue::serialising`] records when they leave.
    pub fn pop(&mut self) -> Option<T> {
        let q = self.classes.iter_mut().find(|q| !q.is_empty())?;
        let (bytes, own, frame) = q.pop_front()?;
        self.waiting_bytes = self.waiting_bytes.saturating_sub(bytes);
        self.capped_bytes = self.capped_bytes.saturating_sub(bytes.min(self.ack_cap));
        if own {
            self.own_bytes = self.own_bytes.saturating_sub(bytes);
        }
        Some(frame)
    }

    /// Whether the queue serves in arrival order and refuses nothing (`fifo`, unbounded).
    pub fn is_unbounded_fifo(&self) -> bool {
        self.discipline == QueueDiscipline::Fifo && self.capacity.is_none()
    }

    /// Whether no frame waits.
    pub fn is_empty(&self) -> bool {
        self.classes.iter().all(VecDeque::is_empty)
    }

    /// Frames recorded as serialising (those that left are forgotten at the next
    /// [`FrameQueue::occupancy`]).
    #[cfg(test)]
    pub fn serialising_records(&self) -> usize {
        self.serialising.len()
    }

    /// Records that a frame of `bytes` (`own`: the host's own TCP) serialises until `done`
    /// (it keeps its room until then). Records stay in the order of `done`: a frame that
    /// passed own TCP bytes still in the socket finishes before them.
    pub fn serialising(&mut self, done: Nanos, bytes: usize, own: bool) {
        let at = (self.serialising.iter().rev())
            .take_while(|&&(d, _, _)| d > done)
            .count();
        (self.serialising).insert(self.serialising.len() - at, (done, bytes, own));
        self.serialising_bytes = self.serialising_bytes.saturating_add(bytes);
        self.capped_bytes = self.capped_bytes.saturating_add(bytes.min(self.ack_cap));
        if own {
            self.own_bytes = self.own_bytes.saturating_add(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_priority_serves_class_zero_first_fifo_within_a_class() {
        let mut q = FrameQueue::new(QueueDiscipline::Prio, None, 0.5);
        for (i, class) in [3u8, 7, 0, 3, 0, 200].into_iter().enumerate() {
            q.push(10, class, false, i);
        }
        let order: Vec<usize> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, [2, 4, 0, 3, 1, 5]);
        assert!(q.is_empty());
        let mut f = FrameQueue::new(QueueDiscipline::Fifo, None, 0.5);
        for (i, class) in [3u8, 0, 7].into_iter().enumerate() {
            f.push(10, class, false, i);
        }
        assert_eq!(
            std::iter::from_fn(|| f.pop()).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    /// Capacity 100, threshold 50: drop-eligible frames are refused past 50, others only
    /// when 100 would be exceeded.
    #[test]
    fn drop_eligible_first_past_the_threshold_tail_drop_only_when_full() {
        let mut q = FrameQueue::new(QueueDiscipline::Prio, Some(100), 0.5);
        q.push(40, 0, false, ());
        assert_eq!(q.admit(0, 10, true), Ok(()));
        assert_eq!(q.admit(0, 11, true), Err(Refusal::Threshold));
        assert_eq!(q.admit(0, 11, false), Ok(()));
        q.push(50, 0, false, ());
        assert_eq!(q.admit(0, 10, false), Ok(()));
        assert_eq!(q.admit(0, 11, false), Err(Refusal::Full));
        assert_eq!(q.admit(0, 11, true), Err(Refusal::Full));
        // FIFO has no threshold: tail drop only.
        let mut f = FrameQueue::new(QueueDiscipline::Fifo, Some(100), 0.5);
        f.push(90, 0, false, ());
        assert_eq!(f.admit(0, 10, true), Ok(()));
        assert_eq!(f.admit(0, 11, true), Err(Refusal::Full));
    }

    #[test]
    fn an_ack_waits_for_each_held_frame_up_to_the_cap() {
        let mut q: FrameQueue<()> = FrameQueue::new(QueueDiscipline::Prio, None, 0.5);
        q.set_ack_cap(100);
        q.push(250, 3, false, ());
        q.push(40, 0, false, ());
        assert_eq!(q.ack_wait(0), (140, None));
        assert_eq!(q.pop(), Some(()));
        q.serialising(1_000, 40, false);
        assert_eq!(q.ack_wait(0), (140, Some((1_000, 40))));
        assert_eq!(q.pop(), Some(()));
        q.serialising(2_000, 250, false);
        assert_eq!(q.ack_wait(1_000), (100, Some((2_000, 250))));
        assert_eq!(q.ack_wait(2_000), (0, None));
    }

    proptest::proptest! {
        /// An acknowledgement waits for every held frame's bytes up to the cap, whatever mix
        /// of arrivals, starts of serialisation and time passing came before.
        #[test]
        fn an_ack_waits_for_every_held_frame_up_to_the_cap(
            cap in 1usize..3_000,
            ops in proptest::collection::vec((0u8..3, 1usize..5_000, 0u64..2_000), 0..200),
        ) {
            let mut q: FrameQueue<usize> = FrameQueue::new(QueueDiscipline::Fifo, None, 0.5);
            q.set_ack_cap(cap);
            let mut waiting = VecDeque::new();
            let mut serialising: Vec<(Nanos, usize)> = Vec::new();
            let mut now = 0;
            for (op, bytes, dt) in ops {
                match op {
                    0 => {
                        q.push(bytes, 0, false, bytes);
                        waiting.push_back(bytes);
                    }
                    1 => {
                        let popped = q.pop();
                        proptest::prop_assert_eq!(popped, waiting.pop_front());
                        if let Some(b) = popped {
                            q.serialising(now + dt, b, false);
                            let at = serialising.partition_point(|&(d, _)| d <= now + dt);
                            serialising.insert(at, (now + dt, b));
                        }
                    }
                    _ => {
                        now += dt;
                        if dt % 2 == 0 {
                            q.occupancy(now);
                        }
                    }
                }
                let live: Vec<_> = serialising.iter().filter(|&&(d, _)| d > now).collect();
                let held = waiting.iter().chain(live.iter().map(|(_, b)| b));
                let expected: usize = held.map(|&b| b.min(cap)).sum();
                let first = live.first().map(|&&r| r);
                proptest::prop_assert_eq!(q.ack_wait(now), (expected, first));
            }
        }
    }

    #[test]
    fn serialising_frames_hold_room_until_their_last_bit() {
        let mut q: FrameQueue<()> = FrameQueue::new(QueueDiscipline::Fifo, Some(100), 0.5);
        q.serialising(1_000, 80, false);
        assert_eq!(q.occupancy(999), 80);
        assert_eq!(q.admit(999, 30, false), Err(Refusal::Full));
        assert_eq!(q.occupancy(1_000), 0);
        // An empty queue takes a frame larger than itself.
        assert_eq!(q.admit(1_000, 1_000, false), Ok(()));
    }

    #[test]
    fn own_tcp_bytes_count_for_others_only_up_to_the_own_share() {
        let mut q: FrameQueue<()> = FrameQueue::new(QueueDiscipline::Fifo, Some(100), 0.5);
        q.push(10, 0, false, ());
        q.serialising(1_000, 150, true);
        q.push(150, 0, true, ());
        // Without a share the own 300 bytes fill the queue.
        assert_eq!(q.admit(0, 10, false), Err(Refusal::Full));
        q.set_own_share(30);
        assert_eq!(q.occupancy(0), 310);
        assert_eq!(
            q.admit(0, 60, false),
            Ok(()),
            "10 + 30 of own + 60 fit in 100"
        );
        assert_eq!(q.admit(0, 61, false), Err(Refusal::Full));
        // The own frame that waited goes to the serialiser, the first one leaves.
        assert_eq!(q.pop(), Some(()));
        assert_eq!(q.pop(), Some(()));
        q.serialising(2_000, 150, true);
        assert_eq!(q.occupancy(1_000), 150);
        assert_eq!(q.admit(1_000, 70, false), Ok(()));
        assert_eq!(q.admit(1_000, 71, false), Err(Refusal::Full));
        assert_eq!(q.occupancy(2_000), 0);
    }
}
