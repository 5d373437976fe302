//! The datagram link: one link's loss-tolerant frames as authenticated datagrams, sans-IO.
//! Both drivers run this one copy: the runtime over UDP sockets, and any driver that moves
//! datagrams between links in memory (tests, models).
//!
//! Each path of the link has its own rate controller and pacer, batch and feedback
//! ([`path`]). A frame handed over ([`DatagramLink::enqueue`]) waits in the link's queue
//! until a path takes it: a frame that is not sprayed takes its key's path (one flow per
//! key, as ECMP hashes one); a sprayed frame takes, of the paths where it would land
//! soonest, the one whose pacer lets it go first, then the one of the lowest expected round
//! trip, then the one that carried the fewest bytes (multipath TCP's lowest-RTT-first
//! scheduler with the pacer's budget as its window, and ECF's rule: a slower path only while
//! the fastest alone would take longer to carry the queue). So a slow path carries its share
//! of a large queue and not the last frames of a step, and a path that loses or queues slows
//! down alone. [`DatagramLink::poll_transmit`] hands out a path's
//! batch sealed ([`batch`]: ordered by DSCP, numbered in that order, cut into GSO runs)
//! once it is full, a feedback on its path is due, or the driver flushes, and hands out
//! each path's feedback when due ([`feedback`]), on that path. A received datagram
//! ([`DatagramLink::handle_datagram`]) is opened under the link's key and checked against
//! the replay window; data goes to the endpoint, a feedback to the controller of the path
//! it came back on, and every refusal is counted by reason ([`DatagramCounters`]), never
//! an error of the job.

pub mod batch;
pub mod feedback;
mod path;

use std::collections::VecDeque;

use crate::net::{RateConfig, RateStats};
use crate::strategy::{Endpoint, ProtocolError, Rank};
use crate::wire::datagram::{
    datagram_keys, DatagramCounters, DatagramOpener, DatagramSealer, DropReason, Opened,
    IP_UDP_HEADERS,
};
use crate::wire::mac::LinkKeys;
use crate::wire::{f32_bytes_mut, FrameKind, Header};

pub use batch::{Pending, Run, Sealed, SendLimits};
pub use feedback::{FEEDBACK_EVERY_DATAGRAMS, FEEDBACK_EVERY_NS};
use path::PathState;

/// The most datagrams one batch holds.
pub const BATCH_DATAGRAMS: usize = 128;
/// DSCP of feedback datagrams: the class of the TCP links (control traffic).
pub const FEEDBACK_DSCP: u8 = 0;
/// How long a path may go without a frame before one is sent on it to measure it again,
/// whatever round trip it last showed (ns).
pub const PROBE_IDLE_NS: u64 = 1_000_000_000;

/// One link's datagram state, both directions: the queue, the sealer and opener, and
/// each path's controller, batch and feedback.
pub struct DatagramLink {
    peer: Rank,
    max_payload: u32,
    sealer: DatagramSealer,
    opener: DatagramOpener,
    /// Frames waiting for a path's pacer.
    queue: VecDeque<Pending>,
    /// The sealed bytes of the frames in `queue`.
    queued_bytes: u64,
    /// By path index (at least one).
    paths: Vec<PathState>,
    counters: DatagramCounters,
    /// The path and send stamp of the data batch [`DatagramLink::poll_transmit`] handed
    /// out last, until the driver says it leaves ([`DatagramLink::handle_departure`]).
    departing: Option<(usize, u64)>,
}

impl DatagramLink {
    /// The link to `peer` over `paths` paths, keyed from the link's frame `keys`, each path
    /// paced by a controller of `rate`, taking payloads of at most `max_payload` bytes.
    pub fn new(
        peer: Rank,
        keys: &LinkKeys,
        paths: usize,
        rate: RateConfig,
        max_payload: u32,
    ) -> Self {
        let keys = datagram_keys(keys);
        Self {
            peer,
            max_payload,
            sealer: DatagramSealer::new(&keys.send),
            opener: DatagramOpener::new(&keys.recv),
            queue: VecDeque::new(),
            queued_bytes: 0,
            paths: (0..paths.max(1)).map(|_| PathState::new(rate)).collect(),
            counters: DatagramCounters::default(),
            departing: None,
        }
    }

    /// The peer's rank.
    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// Takes a loss-tolerant frame: `header` and its payload bytes.
    pub fn enqueue(&mut self, header: Header, payload: &[u8]) {
        let pending = Pending {
            header,
            payload: payload.to_vec(),
            path: 0,
        };
        self.queued_bytes = (self.queued_bytes).saturating_add(pending.sealed_len() as u64);
        self.queue.push_back(pending);
    }

    /// Whether every frame handed over left the pacers (the link may take more).
    pub fn takes_more(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether nothing waits to be sent: no frame queued, none in an unsealed batch.
    pub fn is_drained(&self) -> bool {
        self.queue.is_empty() && self.paths.iter().all(|p| p.batch.is_empty())
    }

    /// What the datagrams of this link did so far.
    pub fn counters(&self) -> DatagramCounters {
        self.counters
    }

    /// The smoothed round trip of the link's fastest measured path; `None` before any
    /// feedback came back.
    pub fn srtt_ns(&self) -> Option<u64> {
        self.fastest_path()
            .map(|j| self.paths[j].rate.stats().srtt_ns)
    }

    /// The measured path of the least smoothed round trip (the lowest index of equals);
    /// `None` before any feedback came back.
    fn fastest_path(&self) -> Option<usize> {
        let srtt = |j: usize| self.paths[j].rate.stats().srtt_ns;
        (0..self.paths.len())
            .filter(|&j| srtt(j) > 0)
            .min_by_key(|&j| (srtt(j), j))
    }

    /// Each path's rate controller (by path index), for the summary.
    pub fn rate_stats(&self) -> Vec<RateStats> {
        self.paths.iter().map(|p| p.rate.stats()).collect()
    }

    /// Hands out, sealed into `out` (emptied first), the next datagrams to send at
    /// `now_ns`, if any: a path's feedback due (after that path's batch, whose datagrams
    /// take their numbers first), a path's batch once it is full, or, with `flush`,
    /// whatever a batch holds. Call until it returns `false`.
    pub fn poll_transmit(
        &mut self,
        now_ns: u64,
        flush: bool,
        limits: SendLimits,
        out: &mut Sealed,
    ) -> bool {
        out.clear();
        self.handle_timeout(now_ns);
        let due = (0..self.paths.len()).find(|&j| self.paths[j].feedback.is_due(now_ns));
        if let Some(j) = due {
            if self.paths[j].batch.is_empty() {
                self.seal_feedback(j, now_ns, out);
            } else {
                self.seal_batch(j, now_ns, limits, out);
            }
            return true;
        }
        while let Some(front) = self.queue.front() {
            let j = self.choose_path(&front.header, now_ns);
            if self.paths[j].rate.next_send_at(now_ns) > now_ns {
                break;
            }
            if self.paths[j].batch.len() >= BATCH_DATAGRAMS {
                self.seal_batch(j, now_ns, limits, out);
                return true;
            }
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            self.release(j, now_ns, q);
        }
        let ready =
            |p: &PathState| !p.batch.is_empty() && (flush || p.batch.len() >= BATCH_DATAGRAMS);
        let Some(j) = self.paths.iter().position(ready) else {
            return false;
        };
        self.seal_batch(j, now_ns, limits, out);
        true
    }

    /// The batch [`DatagramLink::poll_transmit`] handed out last starts to leave at
    /// `now_ns` (a driver whose sealing takes no time need not say so). Its datagrams carry
    /// the time it was sealed at; the time until its write (sealing a full batch, a thread
    /// preempted before the write) is the sender's own, not the network's, and the round
    /// trips measured on the batch leave it out, as they leave out the receiver's.
    pub fn handle_departure(&mut self, now_ns: u64) {
        if let Some((j, stamp)) = self.departing.take() {
            self.paths[j].log_departure(stamp, now_ns.saturating_sub(stamp));
        }
    }

    /// When the link next needs [`DatagramLink::poll_transmit`] or
    /// [`DatagramLink::handle_timeout`]: the next departure of the queue's first frame, a
    /// feedback due, a rate controller's timeout.
    pub fn poll_timeout(&self, now_ns: u64) -> Option<u64> {
        let send = (self.queue.front()).map(|q| {
            let j = self.choose_path(&q.header, now_ns);
            self.paths[j].rate.next_send_at(now_ns)
        });
        let paths = (self.paths.iter()).flat_map(|p| [p.feedback.due_at(), p.rate.poll_timeout()]);
        paths.chain([send]).flatten().min()
    }

    /// The time from [`DatagramLink::poll_timeout`] may have come: each path's feedback
    /// timeout fires if it is due (early or repeated calls do nothing).
    pub fn handle_timeout(&mut self, now_ns: u64) {
        for p in &mut self.paths {
            if p.rate.poll_timeout().is_some_and(|t| t <= now_ns) {
                p.rate.handle_timeout(now_ns);
            }
        }
    }

    /// A datagram from the peer's address on path `path` arrived at `now_ns`: opened and
    /// acted on. Data goes to `deliver` (header and payload; `false`: the endpoint refused
    /// it, a frame of a finished step), a feedback to that path's controller. A refusal is
    /// counted and said.
    pub fn handle_datagram(
        &mut self,
        now_ns: u64,
        path: usize,
        datagram: &[u8],
        deliver: impl FnOnce(&Header, &[u8]) -> bool,
    ) -> Result<(), DropReason> {
        self.counters.bytes_received =
            (self.counters.bytes_received).saturating_add(datagram.len() as u64);
        let result = match self.accept(now_ns, path, datagram) {
            Ok(Some((header, payload))) => deliver(&header, payload)
                .then_some(())
                .ok_or(DropReason::Stale),
            Ok(None) => Ok(()),
            Err(reason) => Err(reason),
        };
        if let Err(reason) = result {
            self.counters.count_drop(reason);
        }
        result
    }

    /// Opens `datagram`, arrived on `path` at `now_ns`, and counts it: a feedback goes to
    /// the path's controller (`None`), data is handed back (its header and payload) for the
    /// endpoint.
    fn accept<'a>(
        &mut self,
        now_ns: u64,
        path: usize,
        datagram: &'a [u8],
    ) -> Result<Option<(Header, &'a [u8])>, DropReason> {
        let opened = self.opener.open(datagram, self.max_payload)?;
        let p = self.paths.get_mut(path).ok_or(DropReason::UnknownAddress)?;
        // Every authentic datagram counts as received, feedback too: the two share the
        // numbers, and the sender reads a gap in them as loss.
        let (Opened::Data { seq, .. } | Opened::Feedback { seq, .. }) = opened;
        p.feedback.on_authentic(seq);
        match opened {
            Opened::Feedback {
                feedback, sent_ns, ..
            } => {
                self.counters.feedback_received += 1;
                p.on_feedback(now_ns, &feedback, sent_ns);
                Ok(None)
            }
            Opened::Data {
                header,
                payload,
                sent_ns,
                ..
            } => {
                if header.sender as usize != self.peer || !header.flags.is_loss_tolerant() {
                    return Err(DropReason::Malformed);
                }
                self.counters.received += 1;
                p.feedback.on_data(sent_ns, now_ns);
                Ok(Some((header, payload)))
            }
        }
    }

    /// The path a frame takes at `now_ns` (see the module docs).
    fn choose_path(&self, header: &Header, now_ns: u64) -> usize {
        let k = self.paths.len();
        if k <= 1 {
            return 0;
        }
        if matches!(
            header.kind,
            FrameKind::Probe | FrameKind::Stop | FrameKind::Missing
        ) {
            // Control goes on the path of the shortest round trip, the one the probe timer
            // is set by: behind a slow path's queue a Probe would time out, and a Stop come
            // after the packets it was to spare.
            return self.fastest_path().unwrap_or(0);
        }
        if !header.flags.is_sprayed() {
            return header.key as usize % k;
        }
        let eligible = self.paths_worth_taking(now_ns);
        let order = |j: usize| {
            let p = &self.paths[j];
            let at = p.rate.next_send_at(now_ns).max(now_ns);
            (at, p.expected_rtt_ns(now_ns), p.bytes_sent(), j)
        };
        (0..k)
            .filter(|&j| eligible(j))
            .min_by_key(|&j| order(j))
            .unwrap_or(0)
    }

    /// Which paths a sprayed frame may take at `now_ns` (earliest completion first, as ECF
    /// of multipath TCP): the measured path of the least expected round trip, a path not
    /// measured yet, and a slower path only if a datagram on it lands before that fastest
    /// path alone would have carried the whole queue (its rate's time for the queued bytes
    /// plus its round trip). So a path behind a long queue carries the bulk of a large
    /// share and not its last datagrams, which would hold the step back by its round trip.
    /// A path idle for [`PROBE_IDLE_NS`] may take one frame whatever it expects, to be
    /// measured again: its least round trip may date from a queue long gone.
    fn paths_worth_taking(&self, now_ns: u64) -> impl Fn(usize) -> bool + '_ {
        let rtt = move |j: usize| self.paths[j].expected_rtt_ns(now_ns);
        let measured = (0..self.paths.len()).filter(|&j| rtt(j) > 0);
        let fastest = measured.min_by_key(|&j| (rtt(j), j));
        let horizon_ns = fastest.map_or(u64::MAX, |f| {
            let drain_ns = self.queued_bytes as f64 * 8.0 * 1e9 / self.paths[f].rate.rate_bps();
            // `as` saturates; the rate is finite and positive.
            rtt(f).saturating_add(drain_ns as u64)
        });
        move |j| rtt(j) <= horizon_ns || self.paths[j].idle_ns(now_ns) >= PROBE_IDLE_NS
    }

    /// Moves `q`, taken from the queue, into path `j`'s batch at `now_ns`.
    fn release(&mut self, j: usize, now_ns: u64, q: Pending) {
        let len = q.sealed_len() as u64;
        self.queued_bytes = self.queued_bytes.saturating_sub(len);
        self.counters.sent += 1;
        self.counters.bytes_sent = self.counters.bytes_sent.saturating_add(len);
        self.paths[j].release(
            now_ns,
            len + IP_UDP_HEADERS as u64,
            Pending { path: j, ..q },
        );
    }

    /// Seals path `j`'s batch into `out`.
    fn seal_batch(&mut self, j: usize, now_ns: u64, limits: SendLimits, out: &mut Sealed) {
        let p = &mut self.paths[j];
        batch::order(&mut p.batch);
        out.path = j;
        let first = self.sealer.next_seq();
        let sizes = p.batch.iter().map(|q| q.sealed_len() as u64);
        let (smallest, largest) = sizes.fold((u64::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
        p.log_batch(now_ns, smallest, largest);
        batch::seal(&p.batch, &mut self.sealer, now_ns, limits, out);
        self.departing = Some((j, now_ns));
        p.batch.clear();
        for seq in first..self.sealer.next_seq() {
            p.log_sealed(seq);
        }
    }

    /// Seals path `j`'s feedback into `out`, on path `j`.
    fn seal_feedback(&mut self, j: usize, now_ns: u64, out: &mut Sealed) {
        let p = &mut self.paths[j];
        let feedback = p.feedback.take(now_ns);
        p.log_sealed(self.sealer.next_seq());
        self.sealer.seal_feedback(&mut out.bytes, &feedback, now_ns);
        out.path = j;
        let len = out.bytes.len();
        out.runs.push(Run {
            dscp: FEEDBACK_DSCP,
            start: 0,
            end: len,
            count: 1,
            segment: len,
        });
        self.counters.feedback_sent += 1;
        self.counters.bytes_sent = self.counters.bytes_sent.saturating_add(len as u64);
    }
}

/// Writes a datagram's payload into `endpoint`'s slot for the frame `header` from `peer`
/// and tells it. An error where it refuses the frame (of a step it has finished: the
/// network reorders and delays datagrams) or the payload does not fit the slot.
pub fn hand_over<E: Endpoint + ?Sized>(
    endpoint: &mut E,
    peer: Rank,
    header: &Header,
    payload: &[u8],
) -> Result<(), ProtocolError> {
    let dest = f32_bytes_mut(endpoint.recv_slot(peer, header)?);
    if dest.len() != payload.len() {
        return Err(ProtocolError::unexpected(
            peer,
            header,
            "a payload that does not fit its slot",
        ));
    }
    dest.copy_from_slice(payload);
    endpoint.handle_payload(peer, header)
}

#[cfg(test)]
mod tests;
