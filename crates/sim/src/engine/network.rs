//! Frames between the endpoints and the network: a host's endpoint is asked for frames
//! while its NIC admits them (a worker's links offered in core's fair [`Rotation`]), each
//! frame is offered to the host's egress port, and the fates the ports decide become
//! arrivals at the receiver's ingress port and deliveries.

use syncopate_core::net::{Decision, Fate, FrameMeta};
#[cfg(doc)]
use syncopate_core::net::{Port, Rotation};
use syncopate_core::strategy::{Endpoint, Rank};

use super::{decode, flow, frame_name, InFlight, Polling, Sim};
use crate::build::RankEndpoint;
use crate::queue::Event;
use crate::report::Lane;
use crate::SimError;

impl Sim<'_> {
    /// Asks host `h`'s endpoint for frames while its NIC's backlog is below the window (the
    /// runtime's `fill`); arms a wake-up for when the backlog drains below it.
    pub(super) fn fill(&mut self, h: Rank) -> Result<(), SimError> {
        self.offer_frames(h)?;
        // The endpoint has nothing more for now: the datagram links' open batches leave.
        self.pump(h, None, true)
    }

    /// [`Sim::fill`]'s offers: frames while the NIC has room and the endpoint has any.
    fn offer_frames(&mut self, h: Rank) -> Result<(), SimError> {
        let workers = self.cfg.workers;
        loop {
            if !self.nic_has_room(h) {
                return Ok(());
            }
            let mut buf = self.pool.pop().unwrap_or_default();
            buf.clear();
            let Some(to) = self.poll_frame(h, &mut buf) else {
                self.pool.push(buf);
                // Replies waiting is a bug unless their sockets are full.
                let blocked = self.hosts[h].nic.egress.flow_room_at(self.now).is_some();
                if h >= workers
                    && self.checks_replies
                    && !blocked
                    && !self.frontiers[h - workers].is_empty()
                {
                    return Err(
                        self.internal(format!("server rank {h} holds replies but sent none"))
                    );
                }
                return Ok(());
            };
            if self.datagrams.is_some() && self.hand_to_datagrams(h, to, &buf)? {
                self.pool.push(buf);
                continue;
            }
            self.send_frame(h, to, buf)?;
        }
    }

    /// Whether host `h`'s NIC admits another frame now; if not, arms a wake-up (one at a
    /// time) for when it will.
    #[inline(always)]
    fn nic_has_room(&mut self, h: Rank) -> bool {
        let now = self.now;
        let nic = &mut self.hosts[h].nic;
        if nic.egress.has_room(now) {
            return true;
        }
        if nic.wake_at.is_none() {
            let at = nic.egress.room_at(now);
            nic.wake_at = Some(at);
            self.queue.push(at, Event::NicReady(h));
        }
        false
    }

    /// Asks host `h`'s endpoint for a frame into `buf`, on the links its polling offers
    /// whose sockets have room (core's [`Port::flow_has_room`]); returns the frame's link.
    /// A full socket drains when its port lets a held frame go, at a port poll, which then
    /// asks again (`Sim::port_polled`).
    #[inline(always)]
    fn poll_frame(&mut self, h: Rank, buf: &mut Vec<u8>) -> Option<Rank> {
        let workers = self.cfg.workers;
        let host = &mut self.hosts[h];
        let n = host.links.len() / 2;
        let egress = &host.nic.egress;
        let full = egress.flow_room_at(self.now).is_some();
        let room = |to: Rank| egress.flow_has_room(flow(h, to));
        if let Some(d) = self.datagrams.as_deref_mut() {
            // The runtime's rule: only the links whose datagrams have all left the pacer.
            let mut open = d.open_links(h, &host.links[..n], &host.rotation);
            if full {
                open.retain(|&to| room(to));
            }
            let ep: &mut dyn Endpoint = match &mut host.endpoint {
                RankEndpoint::Worker(w) => w.as_mut(),
                RankEndpoint::Server(s) => s.as_mut(),
            };
            let to = (!open.is_empty())
                .then(|| ep.poll_transmit_any(&open, buf))
                .flatten();
            if to.is_some() {
                host.rotation.sent();
            }
            d.give_open(open);
            return to;
        }
        let offered: &[Rank] = match &host.endpoint {
            RankEndpoint::Worker(_) if n == 0 => return None,
            RankEndpoint::Worker(_) if self.polling == Polling::Lean && h < self.outboxes.len() => {
                self.outboxes[h].candidates()
            }
            // The order moves on with each frame sent, not with each poll (core's rule):
            // lean and exhaustive polling, which poll in vain unequally often, keep the
            // same order (it matters where frames wait for two links at once).
            RankEndpoint::Worker(_) => host.rotation.window(&host.links),
            RankEndpoint::Server(_) => match self.polling {
                Polling::Lean => self.frontiers[h - workers].candidates(),
                Polling::Exhaustive => &host.links[..n],
            },
        };
        // Only where some socket is full are the offered links filtered, into a scratch.
        let mut kept = std::mem::take(&mut self.socket_open);
        kept.clear();
        let is_server = matches!(host.endpoint, RankEndpoint::Server(_));
        let links = if !full {
            offered
        } else if is_server && self.polling == Polling::Lean {
            // The frontier's own candidates among the links offered (`offer.rs`).
            self.frontiers[h - workers].open_candidates(workers, room, &mut kept);
            &kept[..]
        } else {
            kept.extend(offered.iter().copied().filter(|&to| room(to)));
            &kept[..]
        };
        let rotates = matches!(host.endpoint, RankEndpoint::Worker(_))
            && !(self.polling == Polling::Lean && h < self.outboxes.len());
        let to = match &mut host.endpoint {
            RankEndpoint::Worker(ep) => ep.poll_transmit_any(links, buf),
            RankEndpoint::Server(ep) => ep.poll_transmit_any(links, buf),
        };
        if rotates && to.is_some() {
            host.rotation.sent();
        }
        self.socket_open = kept;
        to
    }

    /// Sends the frame in `buf` that host `h`'s endpoint made for `to`: checks it against
    /// the reply bookkeeping, gives it a slot and offers it to `h`'s egress port.
    #[inline(always)]
    fn send_frame(&mut self, h: Rank, to: Rank, buf: Vec<u8>) -> Result<(), SimError> {
        let (now, workers) = (self.now, self.cfg.workers);
        let header = decode(&buf, h).map_err(|source| SimError::Protocol {
            time_ns: now,
            host: to,
            from: h,
            source,
        })?;
        let checked = if !self.checks_replies {
            Ok(())
        } else if h >= workers {
            let slice = (header.step, header.key, header.offset);
            self.frontiers[h - workers].sent(slice, to, workers)
        } else {
            self.outboxes.get_mut(h).map_or(Ok(()), |o| o.sent(to))
        };
        if let Err(what) = checked {
            return Err(self.internal(format!("rank {h}: {what}")));
        }
        let bytes = self.wire_bytes(header.length as usize);
        let charged = bytes * self.fan(h);
        let meta = FrameMeta::of_frame(&header, charged, flow(h, to));
        let (from, to, header, buf) = self.mirror_frame(h, to, header, buf)?;
        let frame = InFlight {
            from,
            to,
            header,
            buf,
            bytes,
            recv_start: 0,
            first_arrival: None,
            datagram: None,
            path: 0,
        };
        let slot = self.file_frame(frame);
        if let Some(lives) = self.lives.as_deref_mut() {
            lives.wrote(h, to, now);
        }
        let host = &mut self.hosts[h];
        host.traffic.bytes_sent += charged as u64;
        self.frames_sent += 1;
        let nic = &mut host.nic;
        (nic.egress).enqueue_at_host(now, slot as u64, meta, nic.ingress.as_ref());
        self.collect(h, false)
    }

    /// Gives `frame` a slot of the in-flight table.
    #[inline(always)]
    pub(super) fn file_frame(&mut self, frame: InFlight) -> usize {
        match self.free_slots.pop() {
            Some(slot) => {
                self.frames[slot] = Some(frame);
                slot
            }
            None => {
                self.frames.push(Some(frame));
                self.frames.len() - 1
            }
        }
    }

    /// [`SimConfig::wire_bytes`](crate::SimConfig::wire_bytes) of `elems`, from the last frame's when it had as many.
    #[inline]
    fn wire_bytes(&mut self, elems: usize) -> usize {
        if self.last_wire.0 != elems {
            self.last_wire = (elems, self.cfg.wire_bytes(elems));
        }
        self.last_wire.1
    }

    /// Takes the fates host `h`'s egress (or ingress) port has decided: a frame leaving the
    /// egress arrives at the receiver's ingress (when modelled) or is delivered; a frame
    /// through the ingress is delivered. Arms a poll for the port's next due time. Inlined
    /// (with [`Sim::decided`]) into `fill`, which calls it once per frame sent.
    #[inline(always)]
    pub(super) fn collect(&mut self, h: Rank, ingress: bool) -> Result<(), SimError> {
        let now = self.now;
        while let Some(d) = self.hosts[h]
            .nic
            .port(ingress)
            .and_then(|p| p.poll_decision(now))
        {
            self.decided(h, ingress, d)?;
        }
        let nic = &mut self.hosts[h].nic;
        let due = nic.port(ingress).and_then(|p| p.poll_timeout());
        let armed = &mut nic.poll_at[usize::from(ingress)];
        if let Some(t) = due
            .map(|t| t.max(now))
            .filter(|&t| armed.is_none_or(|a| t < a))
        {
            *armed = Some(t);
            self.queue.push(t, Event::NetPoll { host: h, ingress });
        }
        Ok(())
    }

    /// A poll of host `h`'s port armed for `t`: collects its fates and, where the egress had
    /// sockets full of held frames (some may have drained), asks the host for frames again.
    pub(super) fn port_polled(&mut self, h: Rank, ingress: bool, t: u64) -> Result<(), SimError> {
        let full = !ingress && self.hosts[h].nic.egress.flow_room_at(t).is_some();
        self.collect(h, ingress)?;
        if !full {
            return Ok(());
        }
        if h < self.cfg.workers {
            self.send(h)?;
        } else {
            self.fill(h)?;
        }
        self.arm_timer(h);
        Ok(())
    }

    /// Acts on one decided frame of host `h`'s egress or ingress port.
    #[inline(always)]
    fn decided(&mut self, h: Rank, ingress: bool, d: Decision) -> Result<(), SimError> {
        let slot = d.token as usize;
        let Some(f) = self.frames.get_mut(slot).and_then(Option::as_mut) else {
            return Err(self.internal(format!("no frame in slot {slot}")));
        };
        let Fate::Delivered { at, path, .. } = d.fate else {
            if !f.header.flags.is_loss_tolerant() {
                return Err(self.internal(format!(
                    "rank {h}: a reliable frame was given up ({:?})",
                    d.fate
                )));
            }
            // Lost or dropped: a loss-tolerant frame simply never arrives.
            self.frames[slot] = None;
            self.free_slots.push(slot);
            return Ok(());
        };
        if ingress {
            f.recv_start = d.start;
            self.queue.push(at, Event::Deliver(slot));
            return Ok(());
        }
        f.path = path;
        // First bit at the receiver: the start plus the path's latency.
        f.recv_start = d.start + at.saturating_sub(d.done);
        f.first_arrival = d.first_arrival;
        // The header stays in its slot (not copied per frame for a trace seldom taken).
        let (from, to, header) = (f.from, f.to, &f.header);
        if f.datagram.is_none() {
            self.tracer
                .record(header.step, from, Lane::Send, (d.start, d.done), || {
                    frame_name(header, from, to)
                });
        }
        let arrive = self.cfg.network.ingress;
        self.queue.push(
            at,
            if arrive {
                Event::Arrive(slot)
            } else {
                Event::Deliver(slot)
            },
        );
        Ok(())
    }

    /// A frame reached its receiver's NIC: it queues and serialises through the ingress.
    pub(super) fn arrive(&mut self, slot: usize) -> Result<(), SimError> {
        let now = self.now;
        if !self.admitted(slot) {
            return Ok(());
        }
        let Some(f) = self.frames.get(slot).and_then(Option::as_ref) else {
            return Err(self.internal(format!("no frame in slot {slot}")));
        };
        let (from, to, first) = (f.from, f.to, f.first_arrival);
        let bytes = f.bytes * self.fan(to);
        let meta = match f.datagram {
            Some((dscp, path)) => FrameMeta::of_datagram(dscp, bytes, flow(from, to), path),
            None => FrameMeta {
                path: Some(f.path),
                ..FrameMeta::of_frame(&f.header, bytes, flow(from, to))
            },
        };
        let Some(ingress) = self.hosts[to].nic.ingress.as_mut() else {
            return Err(self.internal(format!("rank {to} has no ingress port")));
        };
        ingress.enqueue_streamed(now, slot as u64, meta, first);
        self.collect(to, true)
    }
}
