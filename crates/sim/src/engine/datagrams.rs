//! Loss-tolerant frames as datagrams ([`SimConfig::datagram`](crate::SimConfig::datagram)):
//! each pair of processes runs the core's [`DatagramLink`] at both ends, as the runtime does
//! over UDP sockets. A loss-tolerant frame the endpoint hands over goes to its link's queue
//! instead of the port; the link paces, batches, seals and picks the path; each sealed
//! datagram is a packet of the network model on that path (its loss, queues and delays);
//! one that arrives is handed to the receiver's link, which opens it and gives data to the
//! endpoint and feedback to the path's controller. Each host's links share one timer event,
//! at the earliest of their [`DatagramLink::poll_timeout`]s.
//!
//! The driving rules are the runtime's (`comm::emulation`, `comm::event_loop`): a link is
//! offered to the endpoint only while it takes more ([`DatagramLink::takes_more`], so a
//! reliable frame never overtakes the link's datagrams), a frame handed over is let into a
//! batch at once if its pacer allows, and once the endpoint has nothing more every batch is
//! flushed.

use syncopate_core::datagram::{hand_over, DatagramLink, Sealed, SendLimits};
use syncopate_core::net::{FrameMeta, RateConfig, RateStats, Rotation};
use syncopate_core::strategy::{Endpoint, Rank};
use syncopate_core::wire::datagram::DatagramCounters;
use syncopate_core::wire::mac::{FrameKey, LinkKeys};
use syncopate_core::wire::{Flags, FrameKind, Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

use super::{flow, InFlight, Sim};
use crate::build::{peers, RankEndpoint};
use crate::queue::Event;
use crate::{SimConfig, SimError};

/// One host's datagram links, by peer (in the order of its peers), and its timer.
struct HostLinks {
    peers: Vec<Rank>,
    links: Vec<DatagramLink>,
    /// The time a [`Event::Datagram`] is queued for.
    timer: Option<u64>,
}

/// Every host's datagram links.
pub(super) struct Datagrams {
    hosts: Vec<HostLinks>,
    /// One sealed batch, reused.
    sealed: Sealed,
    /// The links offered to an endpoint, reused.
    open: Vec<Rank>,
}

/// The frame keys of the link `from -> to`, from a fixed derivation (the simulated
/// processes share no handshake): the two ends' keys mirror each other.
fn link_keys(from: Rank, to: Rank) -> LinkKeys {
    let key = |a: Rank, b: Rank| {
        let mut bytes = [0x5a; 32];
        bytes[..8].copy_from_slice(&(a as u64).to_le_bytes());
        bytes[8..16].copy_from_slice(&(b as u64).to_le_bytes());
        FrameKey::new(bytes)
    };
    LinkKeys {
        send: key(from, to),
        recv: key(to, from),
    }
}

/// The header the in-flight table keeps for a datagram (the frames it carries are sealed
/// in it): loss-tolerant, so the network may lose it.
pub(super) fn datagram_header() -> Header {
    let mut h = Header::data(FrameKind::Push, 0, 0, 0, 0);
    h.flags = Flags::class(0).loss_tolerant();
    h
}

impl Datagrams {
    /// The links of job `cfg` if its loss-tolerant frames travel as datagrams.
    pub fn for_job(cfg: &SimConfig) -> Option<Box<Self>> {
        let rate = cfg.datagram.filter(|_| cfg.strategy.loss_tolerant())?;
        let peers = (0..cfg.workers + cfg.servers).map(|r| peers(cfg, r));
        Some(Box::new(Self::new(
            peers.collect(),
            cfg.network.paths.max(1),
            rate,
        )))
    }

    /// The links of every host, `peers[h]` host `h`'s peers, over `paths` paths with
    /// controllers of `rate`.
    pub fn new(peers: Vec<Vec<Rank>>, paths: usize, rate: RateConfig) -> Self {
        let hosts = (peers.into_iter().enumerate())
            .map(|(h, peers)| HostLinks {
                links: (peers.iter())
                    .map(|&p| {
                        DatagramLink::new(p, &link_keys(h, p), paths, rate, DEFAULT_MAX_PAYLOAD)
                    })
                    .collect(),
                peers,
                timer: None,
            })
            .collect();
        Self {
            hosts,
            sealed: Sealed::default(),
            open: Vec::new(),
        }
    }

    /// Host `h`'s link to `peer`.
    fn link(&mut self, h: Rank, peer: Rank) -> Option<&mut DatagramLink> {
        let host = self.hosts.get_mut(h)?;
        let i = host.peers.iter().position(|&p| p == peer)?;
        host.links.get_mut(i)
    }

    /// Whether host `h`'s link to `peer` may take another frame.
    pub fn takes_more(&self, h: Rank, peer: Rank) -> bool {
        let Some(host) = self.hosts.get(h) else {
            return true;
        };
        let i = host.peers.iter().position(|&p| p == peer);
        i.and_then(|i| host.links.get(i))
            .is_none_or(DatagramLink::takes_more)
    }

    /// Every link's counters, summed.
    pub fn counters(&self) -> DatagramCounters {
        let mut all = DatagramCounters::default();
        for link in self.hosts.iter().flat_map(|h| &h.links) {
            all.add(&link.counters());
        }
        all
    }

    /// Host `h`'s links: each peer and its paths' rate controllers.
    pub fn rates_of(&self, h: Rank) -> Vec<(Rank, Vec<RateStats>)> {
        self.hosts.get(h).map_or_else(Vec::new, |host| {
            let links = host.peers.iter().zip(&host.links);
            links.map(|(&p, l)| (p, l.rate_stats())).collect()
        })
    }

    /// The links of `links` that host `h`'s endpoint may be offered, in core's fair order
    /// (the runtime's: those that take more, arranged by `rotation`), in a scratch list
    /// (given back with [`Datagrams::give_open`]).
    pub fn open_links(&mut self, h: Rank, links: &[Rank], rotation: &Rotation) -> Vec<Rank> {
        let mut open = std::mem::take(&mut self.open);
        open.clear();
        open.extend(links.iter().copied().filter(|&p| self.takes_more(h, p)));
        rotation.arrange(&mut open);
        open
    }

    /// Gives the scratch list back.
    pub fn give_open(&mut self, open: Vec<Rank>) {
        self.open = open;
    }
}

impl Sim<'_> {
    /// Hands the frame in `buf` that host `h`'s endpoint made for `to` to their datagram
    /// link if it is loss-tolerant and the job sends such frames as datagrams, and lets it
    /// into a batch if the pacer allows; returns whether it did.
    pub(super) fn hand_to_datagrams(
        &mut self,
        h: Rank,
        to: Rank,
        buf: &[u8],
    ) -> Result<bool, SimError> {
        let Some(d) = self.datagrams.as_deref_mut() else {
            return Ok(false);
        };
        let Ok(header) = super::decode(buf, h) else {
            return Ok(false);
        };
        if !header.flags.is_loss_tolerant() {
            return Ok(false);
        }
        let Some(link) = d.link(h, to) else {
            return Ok(false);
        };
        link.enqueue(header, buf.get(HEADER_LEN..).unwrap_or_default());
        self.pump(h, Some(to), false)?;
        Ok(true)
    }

    /// Sends what host `h`'s links hand out now (`only`: that peer's link alone; `flush`:
    /// their open batches too), each datagram as a packet on its path, and arms the host's
    /// timer for the earliest of its links' next deadlines.
    pub(super) fn pump(
        &mut self,
        h: Rank,
        only: Option<Rank>,
        flush: bool,
    ) -> Result<(), SimError> {
        let Some(mut d) = self.datagrams.take() else {
            return Ok(());
        };
        let now = self.now;
        let mut sealed = std::mem::take(&mut d.sealed);
        let mut sent = false;
        if let Some(host) = d.hosts.get_mut(h) {
            for (link, &to) in host.links.iter_mut().zip(&host.peers) {
                if only.is_some_and(|o| o != to) {
                    continue;
                }
                while link.poll_transmit(now, flush, SendLimits::ONE_BY_ONE, &mut sealed) {
                    for run in &sealed.runs {
                        let bytes = sealed.run_bytes(run);
                        self.send_datagram(h, to, sealed.path, run.dscp, bytes);
                        sent = true;
                    }
                }
            }
            let next = (host.links.iter())
                .filter_map(|l| l.poll_timeout(now))
                .min();
            // Never at this very instant again: what is due now was just done.
            let next = next.map(|t| t.max(now + 1));
            if let Some(t) = next.filter(|&t| host.timer.is_none_or(|a| t < a || a <= now)) {
                host.timer = Some(t);
                self.queue.push(t, Event::Datagram(h));
            }
        }
        d.sealed = sealed;
        self.datagrams = Some(d);
        if sent {
            self.collect(h, false)?;
        }
        Ok(())
    }

    /// A sealed datagram of host `h` for `to` leaves on `path`, marked `dscp`: a packet of
    /// the network model.
    fn send_datagram(&mut self, h: Rank, to: Rank, path: usize, dscp: u8, bytes: &[u8]) {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        // The UDP payload: the ports add the headers where they model packets (`--mtu`).
        let wire = bytes.len();
        let meta = FrameMeta::of_datagram(dscp, wire, flow(h, to), path);
        let frame = InFlight {
            from: h,
            to,
            header: datagram_header(),
            buf,
            bytes: wire,
            recv_start: 0,
            first_arrival: None,
            datagram: Some((dscp, path)),
            path,
        };
        let slot = self.file_frame(frame);
        if let Some(lives) = self.lives.as_deref_mut() {
            lives.wrote(h, to, self.now);
        }
        let host = &mut self.hosts[h];
        host.traffic.bytes_sent += wire as u64;
        (host.nic.egress).enqueue(self.now, slot as u64, meta);
        // Its fate is collected with the frames' (the driver's `collect` after a fill).
    }

    /// Host `h`'s datagram timer came due (a stale event, for a timer since moved, does
    /// nothing): its links send what is due, then its endpoint is offered the links that
    /// take more.
    pub(super) fn datagram_timer(&mut self, h: Rank) -> Result<(), SimError> {
        let now = self.now;
        let Some(d) = self.datagrams.as_deref_mut() else {
            return Ok(());
        };
        let Some(host) = d.hosts.get_mut(h) else {
            return Ok(());
        };
        if host.timer.is_none_or(|at| at > now) {
            return Ok(());
        }
        host.timer = None;
        self.pump(h, None, true)?;
        self.offer_host(h)
    }

    /// Offers host `h`'s endpoint its links (and sends what it hands over).
    fn offer_host(&mut self, h: Rank) -> Result<(), SimError> {
        if h < self.cfg.workers {
            self.send(h)
        } else {
            self.fill(h)
        }
    }

    /// The datagram in `slot` is handed to its receiver's link: data goes to the endpoint,
    /// which reacts as to a frame; a feedback to the path's controller. A datagram the link
    /// refuses (an endpoint's refusal included: a frame of a step it has finished) is
    /// counted by the link, as the runtime counts it.
    pub(super) fn deliver_datagram(&mut self, slot: usize) -> Result<(), SimError> {
        let Some(f) = self.frames.get_mut(slot).and_then(Option::take) else {
            return Err(self.internal(format!("no datagram in slot {slot}")));
        };
        self.free_slots.push(slot);
        let (now, from, to) = (self.now, f.from, f.to);
        let path = f.datagram.map_or(0, |(_, path)| path);
        self.hosts[to].traffic.bytes_received += f.bytes as u64;
        let mut got = None;
        if let Some(link) = self.datagrams.as_deref_mut().and_then(|d| d.link(to, from)) {
            let ep: &mut dyn Endpoint = match &mut self.hosts[to].endpoint {
                RankEndpoint::Worker(w) => w.as_mut(),
                RankEndpoint::Server(s) => s.as_mut(),
            };
            let deliver = |h: &Header, payload: &[u8]| {
                let ok = hand_over(ep, from, h, payload).is_ok();
                if ok {
                    got = Some((h.step, h.key, h.offset));
                }
                ok
            };
            // A refusal is counted by the link; nothing else to do.
            let _ = link.handle_datagram(now, path, &f.buf, deliver);
            if let Some(srtt) = link.srtt_ns() {
                ep.handle_path_rtt(from, srtt);
            }
        }
        self.pool.push(f.buf);
        match got {
            Some(slice) => self.react(to, slice),
            None => self.offer_host(to),
        }
    }
}
