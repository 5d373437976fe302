//! The process's emulated network interface, shared by all its links as a host's NIC is:
//! core's egress [`Port`] (the same network model the simulator runs). Frames go out when
//! the endpoint's scheduler offers them (the most urgent across the links, offered in
//! core's fair [`Rotation`](syncopate_core::net::Rotation),
//! [`Endpoint::poll_transmit_lent`]) while the port admits them (it holds less than its
//! send window of bytes not yet serialised), and each frame is released to its socket at
//! the time the port says it would have reached the peer (serialisation, the latency, and
//! for a lost frame a retransmission timeout and its re-serialisation; a link's frames
//! leave in order). A small window is what makes priority preemption real: a late urgent
//! slice waits behind at most a window of bytes. Without a bandwidth limit each link holds
//! at most a window of frames not yet written to its socket (core's
//! [`LinkCap`](syncopate_core::net::LinkCap), back-pressure).
//!
//! With `ingress`, arriving data frames also wait in the host's ingress [`Port`] before
//! their payload is read: the reader asks [`ingress_open`] before reading past a data
//! frame's header.

use std::time::Instant;

use syncopate_core::net::{Fate, FrameMeta, Port};
use syncopate_core::strategy::{Endpoint, Rank, Transmit};
use syncopate_core::wire::mac::TAG_LEN;
use syncopate_core::wire::{f32_bytes, Header, HEADER_LEN};

use super::datagram::split_frame;
use super::writer::OutFrame;
use super::{CommError, CommLoop, Hooks};

/// Where a data frame's payload stands with the receiver's emulated ingress port: the link
/// is not read past the frame's header until the port releases the frame, so the frames
/// of all links converging on this host queue and serialise there (and a sender whose
/// frames wait feels TCP's back-pressure, never a deadlock: the port releases by time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Not yet offered to the port.
    New,
    /// Offered; its fate is not decided yet (`droppable`: the receiving endpoint takes the
    /// frame's flow as loss-tolerant, so the port may lose it).
    Waiting {
        /// Whether the port was told it may lose the frame.
        droppable: bool,
    },
    /// Released at this time (the loop's clock).
    DueAt(u64),
    /// Readable (released, or no ingress port).
    Open,
    /// Lost or dropped by the port, a frame of a flow the endpoint takes as loss-tolerant:
    /// read into the link's discard buffer, never into the endpoint's slot, and never
    /// handed to the endpoint.
    Discard,
}

impl CommLoop {
    /// Asks the endpoint for frames while the interface (or, unshaped, each link) has room,
    /// then collects the fates the interface has decided; returns how many frames it handed
    /// over.
    pub(super) fn fill<E: Endpoint + ?Sized>(&mut self, endpoint: &mut E) -> usize {
        let handed = self.offer_frames(endpoint);
        self.collect_fates(endpoint);
        handed
    }

    /// Offers the endpoint's frames to the emulated interface while it admits them.
    fn offer_frames<E: Endpoint + ?Sized>(&mut self, endpoint: &mut E) -> usize {
        let now_ns = self.now_ns();
        let cap = self.cap;
        self.window_full = false;
        let mut handed = 0;
        loop {
            if !self.egress.has_room(now_ns) {
                self.window_full = true;
                return handed;
            }
            self.open.clear();
            // A link whose datagrams wait for their pacer takes nothing more until they
            // have left: its next frame (a probe on TCP) must not overtake them.
            let datagram = self.datagram.as_ref();
            // A link whose socket is full of frames its congestion window holds back
            // takes nothing more either (core's rule; the port's timeout lets them go).
            let egress = &self.egress;
            self.open.extend(
                (self.links.iter().enumerate())
                    .filter(|(i, l)| {
                        datagram.is_none_or(|d| d.takes_more(*i))
                            && cap.admits(l.queued_bytes)
                            && egress.flow_has_room(l.peer as u64)
                    })
                    .map(|(_, l)| l.peer),
            );
            if self.open.is_empty() {
                return handed;
            }
            self.rotation.arrange(&mut self.open);
            let mut buf = self.pool.take();
            let Some(transmit) = endpoint.poll_transmit_lent(&self.open, &mut buf) else {
                self.pool.give(buf);
                return handed;
            };
            // A frame handed over moves the order on; a poll in vain does not.
            self.rotation.sent();
            let (peer, lent) = match transmit {
                Transmit::Copied(peer) => (peer, None),
                Transmit::Lent(peer, header) => (peer, Some(header)),
            };
            if self.hand_hand_to_datagrams(endpoint, peer, lent, &buf) {
                self.pool.give(buf);
                handed += 1;
                // Into a batch now if the pacer allows, so the link takes the next one.
                let now_ns = self.now_ns();
                if let Some(d) = self.datagram.as_mut() {
                    d.batch_due(now_ns);
                }
                continue;
            }
            let frame = OutFrame::new(buf, lent, Some(Instant::now()), self.options.frame_mac);
            let Some(link) = self.links.iter_mut().find(|l| l.peer == peer) else {
                // The endpoint named a link it was not offered: a bug, but never leave a lent
                // payload unreturned.
                if let Some(h) = frame.lent {
                    endpoint.handle_sent(peer, &h);
                }
                self.pool.give(frame.bytes);
                return handed;
            };
            let token = self.next_token;
            self.next_token = token.wrapping_add(1);
            // One flow per link. A reliable frame (every strategy's but DLCP's packets) is
            // retransmitted by the port when lost and kept in order, as TCP does.
            let meta = match frame_header(&frame.bytes) {
                Some(h) => FrameMeta::of_frame(&h, frame.len(), peer as u64),
                None => FrameMeta::reliable(frame.len(), peer as u64),
            };
            (self.egress).enqueue_at_host(now_ns, token, meta, self.ingress.as_ref());
            link.queued_bytes += frame.len();
            link.awaiting.push_back((token, frame));
            handed += 1;
        }
    }

    /// Hands a loss-tolerant frame for `peer` (its buffer `buf`, or its header `lent`) to the
    /// datagram path, if the loop has one; a lent payload is copied and returned to the
    /// endpoint at once. Returns whether it did.
    fn hand_hand_to_datagrams<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        peer: Rank,
        lent: Option<Header>,
        buf: &[u8],
    ) -> bool {
        let Some(datagram) = self.datagram.as_mut() else {
            return false;
        };
        let Some(i) = self.links.iter().position(|l| l.peer == peer) else {
            return false;
        };
        if let Some(h) = lent {
            if !h.flags.is_loss_tolerant() {
                return false;
            }
            datagram.enqueue(i, h, f32_bytes(endpoint.lent_payload(&h)));
            endpoint.handle_sent(peer, &h);
            return true;
        }
        match split_frame(buf) {
            Some((h, payload)) if h.flags.is_loss_tolerant() => {
                datagram.enqueue(i, h, payload);
                true
            }
            _ => false,
        }
    }

    /// Takes the fates the emulated interface has decided: a delivered frame is released to
    /// its socket at its delivery time (never before the link's previous frame); a frame the
    /// network gave up (loss-tolerant frames only) is returned to the endpoint unsent.
    fn collect_fates<E: Endpoint + ?Sized>(&mut self, endpoint: &mut E) {
        let now_ns = self.now_ns();
        let mut decided = false;
        while let Some(d) = self.egress.poll_decision(now_ns) {
            let (token, fate) = (d.token, d.fate);
            decided = true;
            let found = self.links.iter_mut().find_map(|l| {
                let pos = l.awaiting.iter().position(|(t, _)| *t == token)?;
                Some((l, pos))
            });
            let Some((link, pos)) = found else {
                continue;
            };
            let Some((_, frame)) = link.awaiting.remove(pos) else {
                continue;
            };
            match fate {
                Fate::Delivered { at, .. } => {
                    // The peer's port (as this host's) learns of a frame only once it has
                    // come whole: a repaired frame goes early enough to count as streamed.
                    let handover =
                        (self.ingress.as_ref()).and_then(|port| port.handover_at(&d, frame.len()));
                    let release = handover.unwrap_or(at).max(link.last_release);
                    link.last_release = release;
                    link.scheduled.push_back((release, frame));
                }
                Fate::Lost { .. } | Fate::Dropped => {
                    link.queued_bytes = link.queued_bytes.saturating_sub(frame.len());
                    if let Some(h) = frame.lent {
                        endpoint.handle_sent(link.peer, &h);
                    }
                    if frame.queued.is_some() {
                        self.pool.give(frame.bytes);
                    }
                }
            }
        }
        if decided {
            self.publish_net_counters();
        }
    }

    /// Takes the ingress port's decisions and lets the links whose held frame is due read
    /// on (their bytes may already wait in the socket or the staging buffer, with no
    /// readiness event to come).
    pub(super) fn release_ingress<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let now_ns = self.now_ns();
        let Some(port) = self.ingress.as_mut() else {
            return Ok(());
        };
        while let Some((token, fate)) = port.poll_fate(now_ns) {
            let link = usize::try_from(token)
                .ok()
                .and_then(|i| self.links.get_mut(i));
            let Some(link) = link else {
                continue;
            };
            let Some((gate, header)) = link.read.gate() else {
                continue;
            };
            let Gate::Waiting { droppable } = *gate else {
                continue;
            };
            *gate = match fate {
                Fate::Delivered { at, .. } => Gate::DueAt(at),
                Fate::Lost { .. } | Fate::Dropped if droppable => Gate::Discard,
                Fate::Lost { .. } | Fate::Dropped => Gate::DueAt(now_ns),
            };
            if *gate == Gate::Discard {
                // The payload is read here, not into the endpoint's slot.
                let len = header.payload_len as usize;
                link.discard.clear();
                link.discard.resize(len, 0);
            }
        }
        for i in 0..self.links.len() {
            if let Some((gate, _)) = self.links[i].read.gate() {
                let due = matches!(*gate, Gate::DueAt(at) if at <= now_ns);
                if due {
                    *gate = Gate::Open;
                }
                if due || *gate == Gate::Discard {
                    self.read_link(i, endpoint, hooks)?;
                }
            }
        }
        Ok(())
    }

    /// Hands each link's network counters to the sampler.
    pub(super) fn publish_net_counters(&self) {
        for (l, shared) in self.links.iter().zip(&self.traffic.links) {
            if let Some(c) = self.egress.flow_counters(l.peer as u64) {
                shared.net.store(c);
            }
        }
    }
}

/// What the ingress port sees of a data frame with `header` from `peer` (`tagged`: a frame
/// MAC follows it): its class and marks as its sender declared them, but loss-tolerant only
/// if the receiving endpoint takes its flow as such (`accepts_loss`,
/// [`Endpoint::accepts_loss`]); a frame flagged loss-tolerant on any other flow is reliable
/// to the port (delayed by a loss, never lost).
pub(super) fn ingress_meta(
    header: &Header,
    peer: Rank,
    tagged: bool,
    accepts_loss: bool,
) -> FrameMeta {
    let tag = if tagged { TAG_LEN } else { 0 };
    let bytes = HEADER_LEN + header.payload_len as usize + tag;
    let meta = FrameMeta::of_frame(header, bytes, peer as u64);
    FrameMeta {
        reliable: meta.reliable || !accepts_loss,
        ..meta
    }
}

/// Whether the data frame being read on link `index` (`gate` its) may be read past its
/// header: at once without an ingress port; with one, once the port has released it. A
/// frame's first asking offers it to the port as `meta` ([`ingress_meta`]).
pub(super) fn ingress_open(
    gate: &mut Gate,
    meta: impl FnOnce() -> FrameMeta,
    ingress: Option<&mut Port>,
    index: usize,
    now_ns: u64,
) -> bool {
    match (*gate, ingress) {
        (Gate::Open | Gate::Discard, _) => true,
        (Gate::New, None) => {
            *gate = Gate::Open;
            true
        }
        (Gate::New, Some(port)) => {
            let meta = meta();
            port.enqueue(now_ns, index as u64, meta);
            *gate = Gate::Waiting {
                droppable: !meta.reliable,
            };
            false
        }
        (Gate::Waiting { .. } | Gate::DueAt(_), _) => false,
    }
}

/// The header at the start of an encoded frame, if it is one.
fn frame_header(frame: &[u8]) -> Option<Header> {
    let raw: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    Header::decode(raw, u32::MAX).ok()
}
