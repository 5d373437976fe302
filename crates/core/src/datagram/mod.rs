//! The datagram link: one link's loss-tolerant frames as authenticated datagrams, sans-IO.
//! Both drivers run this one copy: the runtime over UDP sockets, and any driver that moves
//! datagrams between links in memory (tests, models).
//!
//! A frame handed over ([`DatagramLink::enqueue`]) takes its path (sprayed frames the next
//! path in turn, the others their key's path, one flow per key as ECMP hashes one) and
//! waits for the link's pacer ([`RateController`]). What the pacer lets go gathers into a
//! batch of one path; [`DatagramLink::poll_transmit`] hands out the batch sealed
//! ([`batch`]: ordered by DSCP, numbered in that order, cut into GSO runs) once it is full,
//! the next frame takes another path, a feedback is due, or the driver flushes, and hands
//! out the receiver's feedback when due ([`feedback`]). A received datagram
//! ([`DatagramLink::handle_datagram`]) is opened under the link's key and checked against
//! the replay window; data goes to the endpoint, feedback to the rate controller, and every
//! refusal is counted by reason ([`DatagramCounters`]), never an error of the job.

pub mod batch;
pub mod feedback;

use std::collections::VecDeque;

use crate::net::{RateConfig, RateController, RateSignal, RateStats};
use crate::strategy::{Endpoint, ProtocolError, Rank};
use crate::wire::datagram::{
    datagram_keys, DatagramCounters, DatagramOpener, DatagramSealer, DropReason, Opened,
    IP_UDP_HEADERS,
};
use crate::wire::mac::LinkKeys;
use crate::wire::{f32_bytes_mut, Header};

pub use batch::{Pending, Run, Sealed, SendLimits};
pub use feedback::{FEEDBACK_EVERY_DATAGRAMS, FEEDBACK_EVERY_NS};
use feedback::FeedbackState;

/// The most datagrams one batch holds.
pub const BATCH_DATAGRAMS: usize = 128;
/// DSCP of feedback datagrams: the class of the TCP links (control traffic).
pub const FEEDBACK_DSCP: u8 = 0;

/// One link's datagram state, both directions: the sending side's queue, pacer and sealer,
/// the receiving side's opener and feedback.
pub struct DatagramLink {
    peer: Rank,
    paths: usize,
    max_payload: u32,
    sealer: DatagramSealer,
    opener: DatagramOpener,
    rate: RateController,
    /// Frames waiting for the pacer.
    queue: VecDeque<Pending>,
    /// Frames the pacer let go, not yet sealed: all on `batch_path`.
    batch: Vec<Pending>,
    batch_path: usize,
    sprayed: usize,
    feedback: FeedbackState,
    counters: DatagramCounters,
}

impl DatagramLink {
    /// The link to `peer` over `paths` paths, keyed from the link's frame `keys`, paced by
    /// a controller of `rate`, taking payloads of at most `max_payload` bytes.
    pub fn new(peer: Rank, keys: &LinkKeys, paths: usize, rate: RateConfig, max_payload: u32) -> Self {
        let keys = datagram_keys(keys);
        Self {
            peer,
            paths: paths.max(1),
            max_payload,
            sealer: DatagramSealer::new(&keys.send),
            opener: DatagramOpener::new(&keys.recv),
            rate: RateController::new(rate),
            queue: VecDeque::new(),
            batch: Vec::new(),
            batch_path: 0,
            sprayed: 0,
            feedback: FeedbackState::default(),
            counters: DatagramCounters::default(),
        }
    }

    /// The peer's rank.
    pub fn peer(&self) -> Rank {
        self.peer
    }

    /// Takes a loss-tolerant frame: `header` and its payload bytes.
    pub fn enqueue(&mut self, header: Header, payload: &[u8]) {
        let path = self.choose_path(&header);
        self.queue.push_back(Pending {
            header,
            payload: payload.to_vec(),
            path,
        });
    }

    /// Whether every frame handed over left the pacer (the link may take more).
    pub fn takes_more(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether nothing waits to be sent: no frame queued, none in an unsealed batch.
    pub fn is_drained(&self) -> bool {
        self.queue.is_empty() && self.batch.is_empty()
    }

    /// What the datagrams of this link did so far.
    pub fn counters(&self) -> DatagramCounters {
        self.counters
    }

    /// The sending direction's rate controller, for the summary.
    pub fn rate_stats(&self) -> RateStats {
        self.rate.stats()
    }

    /// Hands out, sealed into `out` (emptied first), the next datagrams to send at
    /// `now_ns`, if any: the feedback due (after the batch, whose datagrams take their
    /// numbers first), or the batch once it is full or the next frame takes another path,
    /// or, with `flush`, whatever the batch holds. Call until it returns `false`.
    pub fn poll_transmit(&mut self, now_ns: u64, flush: bool, limits: SendLimits, out: &mut Sealed) -> bool {
        out.clear();
        self.handle_timeout(now_ns);
        if self.feedback.is_due(now_ns) {
            if self.batch.is_empty() {
                self.seal_feedback(now_ns, out);
            } else {
                self.seal_batch(now_ns, limits, out);
            }
            return true;
        }
        while self.rate.next_send_at(now_ns) <= now_ns {
            let Some(front) = self.queue.front() else {
                break;
            };
            let joins = front.path == self.batch_path && self.batch.len() < BATCH_DATAGRAMS;
            if !self.batch.is_empty() && !joins {
                self.seal_batch(now_ns, limits, out);
                return true;
            }
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            self.release(now_ns, q);
        }
        if self.batch.is_empty() || !(flush || self.batch.len() >= BATCH_DATAGRAMS) {
            return false;
        }
        self.seal_batch(now_ns, limits, out);
        true
    }

    /// When the link next needs [`DatagramLink::poll_transmit`] or
    /// [`DatagramLink::handle_timeout`]: the pacer's next departure, a feedback due, the
    /// rate controller's timeout.
    pub fn poll_timeout(&self, now_ns: u64) -> Option<u64> {
        let send = (!self.queue.is_empty()).then(|| self.rate.next_send_at(now_ns));
        [send, self.feedback.due_at(), self.rate.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The time from [`DatagramLink::poll_timeout`] may have come: the rate controller's
    /// feedback timeout fires if it is due (early or repeated calls do nothing).
    pub fn handle_timeout(&mut self, now_ns: u64) {
        if self.rate.poll_timeout().is_some_and(|t| t <= now_ns) {
            self.rate.handle_timeout(now_ns);
        }
    }

    /// A datagram from the peer's address arrived at `now_ns`: opened and acted on. Data
    /// goes to `deliver` (header and payload; `false`: the endpoint refused it, a frame of
    /// a finished step), feedback to the rate controller. A refusal is counted and said.
    pub fn handle_datagram(
        &mut self,
        now_ns: u64,
        datagram: &[u8],
        deliver: impl FnOnce(&Header, &[u8]) -> bool,
    ) -> Result<(), DropReason> {
        self.counters.bytes_received = (self.counters.bytes_received)
            .saturating_add(datagram.len() as u64);
        let result = self.open(now_ns, datagram, deliver);
        if let Err(reason) = result {
            self.counters.count_drop(reason);
        }
        result
    }

    /// [`DatagramLink::handle_datagram`] before the count of a refusal.
    fn open(
        &mut self,
        now_ns: u64,
        datagram: &[u8],
        deliver: impl FnOnce(&Header, &[u8]) -> bool,
    ) -> Result<(), DropReason> {
        let opened = self.opener.open(datagram, self.max_payload)?;
        // Every authentic datagram counts as received, feedback too: the two share the
        // direction's numbers, and the sender reads a gap in them as loss.
        let (Opened::Data { seq, .. } | Opened::Feedback { seq, .. }) = opened;
        self.feedback.on_authentic(seq);
        match opened {
            Opened::Feedback { feedback, .. } => {
                self.counters.feedback_received += 1;
                let rtt_ns = now_ns
                    .saturating_sub(feedback.echo_sent_ns)
                    .saturating_sub(feedback.echo_held_ns);
                let signal = RateSignal {
                    rtt_ns,
                    received: feedback.received,
                    highest_seq: feedback.highest_seq,
                };
                self.rate.on_feedback(now_ns, signal);
                Ok(())
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
                self.feedback.on_data(sent_ns, now_ns);
                deliver(&header, payload).then_some(()).ok_or(DropReason::Stale)
            }
        }
    }

    /// The path a frame takes: sprayed frames the next path in turn, the others their
    /// key's path (one flow per key, as ECMP hashes one).
    fn choose_path(&mut self, header: &Header) -> usize {
        if self.paths <= 1 {
            return 0;
        }
        if header.flags.is_sprayed() {
            self.sprayed = (self.sprayed + 1) % self.paths;
            self.sprayed
        } else {
            header.key as usize % self.paths
        }
    }

    /// Moves `q` from the pacer into the batch at `now_ns`.
    fn release(&mut self, now_ns: u64, q: Pending) {
        let len = q.sealed_len() as u64;
        let seq = self.sealer.next_seq() + self.batch.len() as u64;
        self.counters.sent += 1;
        self.counters.bytes_sent = self.counters.bytes_sent.saturating_add(len);
        self.rate.on_sent(now_ns, len + IP_UDP_HEADERS as u64, seq);
        if self.batch.is_empty() {
            self.batch_path = q.path;
        }
        self.batch.push(q);
    }

    /// Seals the batch into `out`.
    fn seal_batch(&mut self, now_ns: u64, limits: SendLimits, out: &mut Sealed) {
        batch::order(&mut self.batch);
        out.path = self.batch_path;
        batch::seal(&self.batch, &mut self.sealer, now_ns, limits, out);
        self.batch.clear();
    }

    /// Seals the receiver's feedback into `out` (on the first path).
    fn seal_feedback(&mut self, now_ns: u64, out: &mut Sealed) {
        let feedback = self.feedback.take(now_ns);
        self.sealer.seal_feedback(&mut out.bytes, &feedback, now_ns);
        out.path = 0;
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
        return Err(ProtocolError::unexpected(peer, header, "a payload that does not fit its slot"));
    }
    dest.copy_from_slice(payload);
    endpoint.handle_payload(peer, header)
}

#[cfg(test)]
mod tests;
