//! The datagram path: loss-tolerant frames (DLCP's packets and loss-tolerant pulls,
//! `dlcp-allreduce`'s hops) travel as UDP datagrams that the network may really drop, while
//! the handshake, control and reliable frames stay on the TCP links.
//!
//! The endpoint is the same sans-IO endpoint; only the driver differs: a frame the endpoint
//! hands over whose flags say loss-tolerant goes to its link's
//! [`DatagramLink`] (core: path choice, pacing, batches, sealing, feedback, opening) instead
//! of the TCP stream. This module keeps only the sockets: it writes the batches the links
//! seal, with the DSCP of each run and through the kernel's offloads where it has them
//! ([`super::send_batch`], [`super::udp_io`]), and reads datagrams a budget at a time,
//! handing each to the link of the peer whose address it comes from (one from no peer's
//! address is dropped and counted) with its kernel receive time.

use std::io;
use std::net::{SocketAddr, UdpSocket};

use mio::{Interest, Registry, Token};
use syncopate_core::datagram::{hand_over, DatagramLink, Sealed};
use syncopate_core::net::{RateConfig, RateStats};
use syncopate_core::strategy::{Endpoint, Rank};
use syncopate_core::wire::datagram::{DatagramCounters, DropReason};
use syncopate_core::wire::mac::LinkKeys;
use syncopate_core::wire::{Header, HEADER_LEN};

use super::send_batch::{Outbox, PathSocket};
use super::udp_io::{self, Offloads, MAX_BATCH_BYTES};
/// Socket buffer sizes asked for: a burst of a step's packets must not overflow the
/// receiver's socket (the drops to study are the network's, not ours).
const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// The most refused datagrams (strangers', forged, replayed ...) read from one socket per
/// wake-up: then the loop goes round (timers, heartbeats, sends) before it reads on, so a
/// flood cannot hold it in `receive`.
pub const RECEIVE_BUDGET: usize = 64;
/// The most datagrams of any kind read from one socket per wake-up: the job's own flow is
/// read in long runs (a Probe on the TCP link must not overtake the packets sent before it
/// that already wait in the socket), but not forever.
pub const RECEIVE_BUDGET_ALL: usize = 4096;

/// The datagram transport of one process: its addresses (one per path) and the rate
/// controller's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DatagramOptions {
    /// The local address of each path: a UDP socket is bound on each (port 0).
    pub addrs: Vec<std::net::IpAddr>,
    /// Settings of every link's rate controller.
    pub rate: RateConfig,
}

impl DatagramOptions {
    /// Binds one UDP socket per path address (port 0), with large socket buffers.
    pub fn bind(&self) -> io::Result<Vec<UdpSocket>> {
        self.addrs
            .iter()
            .map(|ip| {
                let socket = UdpSocket::bind(SocketAddr::new(*ip, 0))?;
                grow_buffers(&socket);
                Ok(socket)
            })
            .collect()
    }
}

/// Asks for [`SOCKET_BUFFER_BYTES`] of socket buffer each way: beyond the kernel's cap
/// (`net.core.rmem_max`, `wmem_max`) where this process may (root), else up to it.
fn grow_buffers(socket: &UdpSocket) {
    use rustix::net::sockopt;
    let fd = rustix::fd::AsFd::as_fd(socket);
    if sockopt::set_socket_recv_buffer_size_force(fd, SOCKET_BUFFER_BYTES).is_err() {
        let _ = sockopt::set_socket_recv_buffer_size(fd, SOCKET_BUFFER_BYTES);
    }
    if sockopt::set_socket_send_buffer_size_force(fd, SOCKET_BUFFER_BYTES).is_err() {
        let _ = sockopt::set_socket_send_buffer_size(fd, SOCKET_BUFFER_BYTES);
    }
    // The kernel reports twice what it granted (its own bookkeeping included).
    let granted = sockopt::socket_recv_buffer_size(fd).unwrap_or(0) / 2;
    if granted < SOCKET_BUFFER_BYTES / 2 {
        tracing::warn!(
            "a datagram socket got a {granted}-byte receive buffer of the {SOCKET_BUFFER_BYTES} \
             asked (net.core.rmem_max caps it for non-root processes): a burst may overflow it, \
             and such drops count as receive_buffer_drops, not network loss"
        );
    }
}

/// One link's datagrams: the core's link and the peer's address on each path.
struct PeerDatagrams {
    link: DatagramLink,
    addrs: Vec<SocketAddr>,
}

/// The datagram path of a communication loop.
pub(super) struct DatagramPath {
    out: Outbox,
    /// By link index.
    peers: Vec<PeerDatagrams>,
    /// Drops no link can count: from no peer's address, or truncated by the kernel.
    counters: DatagramCounters,
    /// One receive: a datagram, or a run of them the kernel coalesced (GRO).
    recv_buf: Vec<u8>,
    /// By path: whether its socket may hold more datagrams than the last read's budget
    /// took (the poll will not say so again: readiness is edge-triggered).
    backlog: Vec<bool>,
    /// By link: whether an authentic datagram came from its peer since the last
    /// [`DatagramPath::take_heard`] (proof that the peer lives, whatever its TCP link does).
    heard: Vec<bool>,
    /// One batch being sealed.
    sealed: Sealed,
    /// The loop's clock: a batch's write is timed on it, and the next batch sealed after.
    origin: std::time::Instant,
}

/// The first poll token of the datagram sockets; path `j` is `FIRST_TOKEN - j`.
pub(super) const FIRST_TOKEN: usize = usize::MAX - 2;

impl DatagramPath {
    /// The path over `sockets` (one per path, bound), to the peers of `links` (link index
    /// order: their rank, frame keys and addresses, one per path), registered with `registry`.
    pub(super) fn new(
        sockets: Vec<UdpSocket>,
        links: &[(Rank, LinkKeys, Vec<SocketAddr>)],
        rate: RateConfig,
        max_payload: u32,
        registry: &Registry,
        origin: std::time::Instant,
    ) -> io::Result<Self> {
        let mut paths = Vec::with_capacity(sockets.len());
        for (j, socket) in sockets.into_iter().enumerate() {
            socket.set_nonblocking(true)?;
            let offloads = udp_io::enable_offloads(&socket);
            let mut socket = mio::net::UdpSocket::from_std(socket);
            registry.register(&mut socket, Token(FIRST_TOKEN - j), Interest::READABLE)?;
            paths.push(PathSocket { socket, offloads });
        }
        let paths_len = paths.len();
        let mut peers = Vec::with_capacity(links.len());
        for (rank, keys, addrs) in links {
            if addrs.len() != paths.len() {
                return Err(io::Error::other(format!(
                    "rank {rank} has {} datagram address(es), this process {}: every process \
                     of the job needs --transport udp with as many --udp-addrs as --paths",
                    addrs.len(),
                    paths.len()
                )));
            }
            peers.push(PeerDatagrams {
                link: DatagramLink::new(*rank, keys, paths_len, rate, max_payload),
                addrs: addrs.clone(),
            });
        }
        Ok(Self {
            out: Outbox::new(paths),
            peers,
            counters: DatagramCounters::default(),
            recv_buf: vec![0; MAX_BATCH_BYTES],
            sealed: Sealed::default(),
            backlog: vec![false; paths_len],
            heard: vec![false; links.len()],
            origin,
        })
    }

    /// The path of a loop with `options` over `links`, on `sockets` (`None` without
    /// `options.datagram` or without sockets).
    pub(super) fn for_links(
        options: &super::CommOptions,
        links: &[super::Link],
        sockets: Vec<UdpSocket>,
        registry: &Registry,
        origin: std::time::Instant,
    ) -> io::Result<Option<Self>> {
        let Some(d) = options.datagram.as_ref().filter(|_| !sockets.is_empty()) else {
            return Ok(None);
        };
        let peers: Vec<_> = (links.iter())
            .map(|l| (l.peer, l.keys.clone(), l.datagram_addrs.clone()))
            .collect();
        Self::new(
            sockets,
            &peers,
            d.rate,
            options.max_payload,
            registry,
            origin,
        )
        .map(Some)
    }

    /// Whether the poll token is one of this path's sockets (and which).
    pub(super) fn socket_of(&self, token: Token) -> Option<usize> {
        let j = FIRST_TOKEN.checked_sub(token.0)?;
        (j < self.out.paths()).then_some(j)
    }

    /// The number of paths (sockets).
    pub(super) fn paths(&self) -> usize {
        self.out.paths()
    }

    /// The links whose peers sent an authentic datagram since the last call.
    pub(super) fn take_heard(&mut self) -> impl Iterator<Item = usize> + '_ {
        (self.heard.iter_mut().enumerate()).filter_map(|(i, h)| std::mem::take(h).then_some(i))
    }

    /// Whether a socket's last read left datagrams on it (its budget ran out).
    pub(super) fn has_backlog(&self) -> bool {
        self.backlog.contains(&true)
    }

    /// The paths whose sockets the last read left datagrams on (its budget ran out).
    pub(super) fn backlogged(&self) -> Vec<usize> {
        (self.backlog.iter().enumerate())
            .filter_map(|(j, &more)| more.then_some(j))
            .collect()
    }

    /// Whether nothing waits to be sent on link `i`.
    pub(super) fn is_drained(&self, i: usize) -> bool {
        self.peers.get(i).is_none_or(|p| p.link.is_drained()) && !self.out.holds(i)
    }

    /// Whether link `i` may take another frame: its pacer let every datagram go into a
    /// batch, and that batch will leave before the link's next TCP write (the loop flushes
    /// it first; a batch the socket refused holds the link back). A Probe on TCP thus
    /// never overtakes the packets handed over before it.
    pub(super) fn takes_more(&self, i: usize) -> bool {
        self.peers.get(i).is_none_or(|p| p.link.takes_more()) && !self.out.holds(i)
    }

    /// Takes a loss-tolerant frame for link `i`: `header`, and its payload bytes.
    pub(super) fn enqueue(&mut self, i: usize, header: Header, payload: &[u8]) {
        if let Some(p) = self.peers.get_mut(i) {
            p.link.enqueue(header, payload);
        }
    }

    /// What the datagrams did so far, over every link (sends the kernel refused count as
    /// dropped at home).
    pub(super) fn counters(&self) -> (DatagramCounters, u64) {
        let mut all = self.counters;
        for p in &self.peers {
            all.add(&p.link.counters());
        }
        (all, self.out.send_failures())
    }

    /// Datagrams the kernel dropped on arrival for want of receive-buffer room, over every
    /// path (`None` where the kernel does not say).
    pub(super) fn receive_buffer_drops(&self) -> Option<u64> {
        (0..self.out.paths())
            .map(|j| udp_io::receive_buffer_drops(&self.out.socket(j)?.socket))
            .sum()
    }

    /// What the kernel took of the offloads, on the first path.
    pub(super) fn offloads(&self) -> Offloads {
        self.out.socket(0).map(|s| s.offloads).unwrap_or_default()
    }

    /// Every link's rate controllers (by path), for the summary.
    pub(super) fn rate_stats(&self) -> Vec<(Rank, Vec<RateStats>)> {
        (self.peers.iter())
            .map(|p| (p.link.peer(), p.link.rate_stats()))
            .collect()
    }

    /// Sends what the pacers allow and the feedback that is due, every batch included.
    pub(super) fn pump(&mut self, now_ns: u64) {
        self.send_due(now_ns, true);
    }

    /// Sends the batches that are full and the feedback that is due; the batches still
    /// open wait for [`DatagramPath::pump`] (the frames the endpoint hands over next may
    /// join them).
    pub(super) fn batch_due(&mut self, now_ns: u64) {
        self.send_due(now_ns, false);
    }

    /// Writes what the links hand out from `now_ns` on (with `flush`, their open batches
    /// too), until a socket refuses a batch. Each batch is sealed at the time it is asked
    /// for and its link told when its write starts: sealing a full batch takes longer than
    /// a round trip on loopback.
    fn send_due(&mut self, now_ns: u64, flush: bool) {
        if !self.out.retry(now_ns) {
            return;
        }
        let mut now_ns = now_ns;
        for (i, p) in self.peers.iter_mut().enumerate() {
            let limits = self.out.limits(0);
            while p
                .link
                .poll_transmit(now_ns, flush, limits, &mut self.sealed)
            {
                let Some(&to) = p.addrs.get(self.sealed.path) else {
                    continue;
                };
                now_ns = super::ns_since(self.origin).max(now_ns);
                p.link.handle_departure(now_ns);
                if !self.out.send(i, &mut self.sealed, to, now_ns) {
                    return;
                }
            }
        }
    }

    /// When the path next needs [`DatagramPath::pump`]: a pacer's next departure, a
    /// feedback due, a rate controller's timeout, the retry of a refused batch.
    pub(super) fn next_deadline(&self, now_ns: u64) -> Option<u64> {
        let retry = self.out.retry_at();
        let links = (self.peers.iter())
            .filter_map(|p| p.link.poll_timeout(now_ns))
            .map(|t| t.max(retry.unwrap_or(0)));
        links.chain(retry).min()
    }

    /// Reads the datagrams waiting on path `j`'s socket (up to [`RECEIVE_BUDGET`] refused
    /// ones, [`RECEIVE_BUDGET_ALL`] in all) and hands each to its peer's link, which opens
    /// it and gives the good ones to the endpoint; `origin` is the loop's clock.
    pub(super) fn receive<E: Endpoint + ?Sized>(
        &mut self,
        j: usize,
        endpoint: &mut E,
        origin: std::time::Instant,
    ) -> Result<(), String> {
        let (mut read, mut refused) = (0, 0);
        loop {
            let (Some(socket), Some(more)) = (self.out.socket(j), self.backlog.get_mut(j)) else {
                return Ok(());
            };
            if refused >= RECEIVE_BUDGET || read >= RECEIVE_BUDGET_ALL {
                *more = true;
                return Ok(());
            }
            let got = match udp_io::recv(&socket.socket, &mut self.recv_buf) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    *more = false;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // An ICMP error queued by an earlier send (a peer gone): not this datagram's.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(format!("receiving datagrams failed: {e}")),
            };
            let arrived_ns = arrival_ns(origin, got.kernel_ns);
            let run = self.recv_buf.get(..got.len).unwrap_or_default();
            let datagrams = run.chunks(got.segment.max(1));
            read += datagrams.len();
            let peer = self
                .peers
                .iter_mut()
                .enumerate()
                .find(|(_, p)| p.addrs.contains(&got.from));
            let Some((i, p)) = peer.filter(|_| !got.truncated) else {
                let reason = if got.truncated {
                    DropReason::Oversized
                } else {
                    DropReason::UnknownAddress
                };
                for _ in datagrams {
                    self.counters.count_drop(reason);
                    refused += 1;
                }
                continue;
            };
            let rank = p.link.peer();
            for datagram in datagrams {
                let deliver = |h: &Header, payload: &[u8]| {
                    hand_over(endpoint, rank, h, payload)
                        .map_err(|e| {
                            tracing::debug!("a datagram from rank {rank} was refused: {e}")
                        })
                        .is_ok()
                };
                match p.link.handle_datagram(arrived_ns, j, datagram, deliver) {
                    // Authentic, if late: its peer lives.
                    Ok(()) | Err(DropReason::Stale) => self.heard[i] = true,
                    Err(_) => refused += 1,
                }
                if let Some(srtt) = p.link.srtt_ns() {
                    endpoint.handle_path_rtt(rank, srtt);
                }
            }
        }
    }
}

/// When a datagram arrived, on the loop's clock (`origin`): the kernel's receive time
/// (`kernel_ns`, real-time clock) moved onto it, so that the time this thread took to read
/// it does not count as network delay; now where the kernel gave no time.
fn arrival_ns(origin: std::time::Instant, kernel_ns: Option<u128>) -> u64 {
    let Some(kernel_ns) = kernel_ns else {
        return super::ns_since(origin);
    };
    let (now_ns, real_now) = clocks_now(origin);
    let waited = u64::try_from(real_now.saturating_sub(kernel_ns)).unwrap_or(u64::MAX);
    now_ns.saturating_sub(waited)
}

/// The loop's clock and the real-time clock (ns since the Unix epoch) at one instant: read
/// between two readings of the loop's clock that lie close together (a thread preempted
/// between the readings would make the pair disagree by the preemption, and a round trip
/// of microseconds look like none).
fn clocks_now(origin: std::time::Instant) -> (u64, u128) {
    let real = || {
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
            .map_or(0, |d| d.as_nanos())
    };
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..4 {
        let before = super::ns_since(origin);
        let real_now = real();
        let after = super::ns_since(origin);
        let spread = after.saturating_sub(before);
        if spread < best.0 {
            best = (spread, before + spread / 2, real_now);
        }
        if spread < 2_000 {
            break;
        }
    }
    (best.1, best.2)
}

/// The header and payload of a frame the endpoint handed over as one buffer.
pub(super) fn split_frame(frame: &[u8]) -> Option<(Header, &[u8])> {
    let raw: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    let header = Header::decode(raw, u32::MAX).ok()?;
    Some((header, frame.get(HEADER_LEN..)?))
}
