//! The datagram path: loss-tolerant frames (DLCP's packets and loss-tolerant pulls,
//! `dlcp-allreduce`'s hops) travel as UDP datagrams that the network may really drop, while
//! the handshake, control and reliable frames stay on the TCP links.
//!
//! The endpoint is the same sans-IO endpoint; only the driver differs: a frame the endpoint
//! hands over whose flags say loss-tolerant goes into its link's datagram queue instead of
//! the TCP stream. Each datagram is sealed (core's [`syncopate_core::wire::datagram`]) under keys
//! derived from its link's handshake when it leaves, paced by its link's
//! [`RateController`], sent with the IP DSCP of its priority class
//! ([`dscp_of`]), on the path its flags choose (sprayed: the next path in turn; otherwise
//! the key's path). A received datagram is handed to the endpoint only once it comes from
//! a peer's known address, opens under that link's key, is fresh (the replay window) and is
//! of the link's peer; every other one is dropped and counted by reason
//! ([`DatagramCounters`]), never an error of the job. A datagram the endpoint refuses
//! (of a step it has finished: the network reorders and delays them) is dropped as
//! [`DropReason::Stale`].
//!
//! The receiver of each direction sends transport feedback back (what it received, and
//! the echo of the latest datagram's timestamp) every [`FEEDBACK_EVERY_NS`] or
//! [`FEEDBACK_EVERY_DATAGRAMS`], whichever comes first, for the sender's rate controller.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};

use mio::{Interest, Registry, Token};
use syncopate_core::net::{RateConfig, RateController, RateSignal, RateStats};
use syncopate_core::strategy::{Endpoint, Rank};
use syncopate_core::wire::datagram::{
    datagram_keys, dscp_of, DatagramCounters, DatagramOpener, DatagramSealer, DropReason, Feedback,
    Opened, IP_UDP_HEADERS, MAX_DATAGRAM_LEN,
};
use syncopate_core::wire::mac::LinkKeys;
use syncopate_core::wire::{f32_bytes_mut, Header, HEADER_LEN};

/// A receiver sends feedback at least this often while datagrams arrive (1 ms)...
pub const FEEDBACK_EVERY_NS: u64 = 1_000_000;
/// ...and after at most this many datagrams.
pub const FEEDBACK_EVERY_DATAGRAMS: u32 = 16;
/// How long to wait before retrying a send the socket refused for lack of buffer space.
const RETRY_NS: u64 = 100_000;
/// Socket buffer sizes asked for: a burst of a step's packets must not overflow the
/// receiver's socket (the drops to study are the network's, not ours).
const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// DSCP of feedback datagrams: the class of the TCP links (control traffic).
const FEEDBACK_DSCP: u8 = 0;
/// The most datagrams read from one socket per wake-up: then the loop goes round (timers,
/// heartbeats, sends) before it reads on, so a flood cannot hold it in `receive`.
pub const RECEIVE_BUDGET: usize = 64;

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
                let fd = rustix::fd::AsFd::as_fd(&socket);
                // Best effort: the kernel caps both at its own maximum.
                let _ = rustix::net::sockopt::set_socket_recv_buffer_size(fd, SOCKET_BUFFER_BYTES);
                let _ = rustix::net::sockopt::set_socket_send_buffer_size(fd, SOCKET_BUFFER_BYTES);
                Ok(socket)
            })
            .collect()
    }
}

/// One path's socket and the DSCP it is set to now (set again only when it changes).
struct PathSocket {
    socket: mio::net::UdpSocket,
    dscp: Option<u8>,
}

/// A loss-tolerant frame waiting for its link's pacer: its header and its payload bytes.
struct Queued {
    header: Header,
    payload: Vec<u8>,
}

/// What the receiving side of one direction reports back to its sender.
#[derive(Default)]
struct FeedbackState {
    /// Authentic datagrams received (data and feedback: they share the numbers).
    received: u64,
    highest_seq: u64,
    latest_sent_ns: u64,
    latest_arrival_ns: u64,
    /// Datagrams received since the last feedback.
    pending: u32,
    last_sent_ns: u64,
}

/// The datagram state of one link.
struct PeerDatagrams {
    rank: Rank,
    /// The peer's address on each path.
    addrs: Vec<SocketAddr>,
    sealer: DatagramSealer,
    opener: DatagramOpener,
    rate: RateController,
    /// Frames waiting for the pacer (the loop offers the link no more until they left).
    queue: VecDeque<Queued>,
    feedback: FeedbackState,
    /// When a send last found the socket full (retry after [`RETRY_NS`]).
    blocked_until: u64,
}

/// The datagram path of a communication loop.
pub(super) struct DatagramPath {
    sockets: Vec<PathSocket>,
    /// By link index.
    peers: Vec<PeerDatagrams>,
    counters: DatagramCounters,
    /// Datagrams the local kernel refused to send (a full local queue, an unreachable
    /// peer): lost, as the network would lose them.
    send_failures: u64,
    sprayed: usize,
    max_payload: u32,
    /// One received datagram (one byte more than the largest, to see oversized ones).
    recv_buf: Vec<u8>,
    /// By path: whether its socket may hold more datagrams than the last read's budget
    /// took (the poll will not say so again: readiness is edge-triggered).
    backlog: Vec<bool>,
    /// One datagram being sealed.
    seal_buf: Vec<u8>,
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
    ) -> io::Result<Self> {
        let mut paths = Vec::with_capacity(sockets.len());
        for (j, socket) in sockets.into_iter().enumerate() {
            socket.set_nonblocking(true)?;
            let mut socket = mio::net::UdpSocket::from_std(socket);
            registry.register(&mut socket, Token(FIRST_TOKEN - j), Interest::READABLE)?;
            paths.push(PathSocket { socket, dscp: None });
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
            let keys = datagram_keys(keys);
            peers.push(PeerDatagrams {
                rank: *rank,
                addrs: addrs.clone(),
                sealer: DatagramSealer::new(&keys.send),
                opener: DatagramOpener::new(&keys.recv),
                rate: RateController::new(rate),
                queue: VecDeque::new(),
                feedback: FeedbackState::default(),
                blocked_until: 0,
            });
        }
        Ok(Self {
            sockets: paths,
            peers,
            counters: DatagramCounters::default(),
            send_failures: 0,
            sprayed: 0,
            max_payload,
            recv_buf: vec![0; MAX_DATAGRAM_LEN + 1],
            seal_buf: Vec::with_capacity(MAX_DATAGRAM_LEN),
            backlog: vec![false; paths_len],
        })
    }

    /// The path of a loop with `options` over `links`, on `sockets` (`None` without
    /// `options.datagram` or without sockets).
    pub(super) fn for_links(
        options: &super::CommOptions,
        links: &[super::Link],
        sockets: Vec<UdpSocket>,
        registry: &Registry,
    ) -> io::Result<Option<Self>> {
        let Some(d) = options.datagram.as_ref().filter(|_| !sockets.is_empty()) else {
            return Ok(None);
        };
        let peers: Vec<_> = (links.iter())
            .map(|l| (l.peer, l.keys.clone(), l.datagram_addrs.clone()))
            .collect();
        Self::new(sockets, &peers, d.rate, options.max_payload, registry).map(Some)
    }

    /// Whether the poll token is one of this path's sockets (and which).
    pub(super) fn socket_of(&self, token: Token) -> Option<usize> {
        let j = FIRST_TOKEN.checked_sub(token.0)?;
        (j < self.sockets.len()).then_some(j)
    }

    /// The number of paths (sockets).
    pub(super) fn paths(&self) -> usize {
        self.sockets.len()
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
        self.peers.get(i).is_none_or(|p| p.queue.is_empty())
    }

    /// Takes a loss-tolerant frame for link `i`: `header`, and its payload bytes.
    pub(super) fn enqueue(&mut self, i: usize, header: Header, payload: &[u8]) {
        if let Some(p) = self.peers.get_mut(i) {
            p.queue.push_back(Queued {
                header,
                payload: payload.to_vec(),
            });
        }
    }

    /// What the datagrams did so far (sends the kernel refused count as dropped at home).
    pub(super) fn counters(&self) -> (DatagramCounters, u64) {
        (self.counters, self.send_failures)
    }

    /// Every link's rate controller, for the summary.
    pub(super) fn rate_stats(&self) -> Vec<(Rank, RateStats)> {
        self.peers
            .iter()
            .map(|p| (p.rank, p.rate.stats()))
            .collect()
    }

    /// Sends what the pacers allow and the feedback that is due.
    pub(super) fn pump(&mut self, now_ns: u64) {
        for i in 0..self.peers.len() {
            self.send_feedback_if_due(i, now_ns);
            let p = &mut self.peers[i];
            if p.rate.poll_timeout().is_some_and(|t| t <= now_ns) {
                p.rate.handle_timeout(now_ns);
            }
            while p.blocked_until <= now_ns && p.rate.next_send_at(now_ns) <= now_ns {
                let Some(q) = p.queue.front() else {
                    break;
                };
                let path = choose_path(&q.header, self.sockets.len(), &mut self.sprayed);
                let seq = p.sealer.next_seq();
                self.seal_buf.clear();
                p.sealer
                    .seal_data(&mut self.seal_buf, &q.header, &q.payload, now_ns);
                let dscp = dscp_of(q.header.flags);
                let (Some(socket), Some(addr)) = (self.sockets.get_mut(path), p.addrs.get(path))
                else {
                    break;
                };
                match send(socket, &self.seal_buf, *addr, dscp) {
                    Ok(n) => {
                        self.counters.sent += 1;
                        self.counters.bytes_sent += n as u64;
                        p.rate.on_sent(now_ns, (n + IP_UDP_HEADERS) as u64, seq);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // Not sent: the sealed number is skipped (the receiver's window
                        // does not mind a gap) and the frame retried.
                        p.blocked_until = now_ns.saturating_add(RETRY_NS);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!("a datagram to rank {} was not sent: {e}", p.rank);
                        self.send_failures += 1;
                        p.rate
                            .on_sent(now_ns, (self.seal_buf.len() + IP_UDP_HEADERS) as u64, seq);
                    }
                }
                p.queue.pop_front();
            }
        }
    }

    /// Sends link `i`'s receiver feedback if it is due.
    fn send_feedback_if_due(&mut self, i: usize, now_ns: u64) {
        let Some(p) = self.peers.get_mut(i) else {
            return;
        };
        let f = &p.feedback;
        let due = f.pending >= FEEDBACK_EVERY_DATAGRAMS
            || (f.pending > 0 && now_ns.saturating_sub(f.last_sent_ns) >= FEEDBACK_EVERY_NS);
        if !due {
            return;
        }
        let feedback = Feedback {
            received: f.received,
            highest_seq: f.highest_seq,
            echo_sent_ns: f.latest_sent_ns,
            echo_held_ns: now_ns.saturating_sub(f.latest_arrival_ns),
        };
        self.seal_buf.clear();
        p.sealer
            .seal_feedback(&mut self.seal_buf, &feedback, now_ns);
        let (Some(socket), Some(addr)) = (self.sockets.first_mut(), p.addrs.first()) else {
            return;
        };
        match send(socket, &self.seal_buf, *addr, FEEDBACK_DSCP) {
            Ok(_) => self.counters.feedback_sent += 1,
            Err(e) => tracing::debug!("feedback to rank {} was not sent: {e}", p.rank),
        }
        p.feedback.pending = 0;
        p.feedback.last_sent_ns = now_ns;
    }

    /// When the path next needs [`DatagramPath::pump`]: a pacer's next departure, a
    /// feedback due, a rate controller's timeout.
    pub(super) fn next_deadline(&self, now_ns: u64) -> Option<u64> {
        self.peers
            .iter()
            .flat_map(|p| {
                let send =
                    (!p.queue.is_empty()).then(|| p.rate.next_send_at(now_ns).max(p.blocked_until));
                let feedback = (p.feedback.pending > 0)
                    .then(|| p.feedback.last_sent_ns.saturating_add(FEEDBACK_EVERY_NS));
                [send, feedback, p.rate.poll_timeout()]
            })
            .flatten()
            .min()
    }

    /// Reads up to [`RECEIVE_BUDGET`] datagrams waiting on path `j`'s socket and hands the
    /// good ones to the endpoint; `origin` is the loop's clock. A datagram longer than
    /// [`MAX_DATAGRAM_LEN`] (read into one byte more) is refused by its length alone.
    pub(super) fn receive<E: Endpoint + ?Sized>(
        &mut self,
        j: usize,
        endpoint: &mut E,
        origin: std::time::Instant,
    ) -> Result<(), String> {
        let mut read = 0;
        loop {
            let (Some(socket), Some(more)) = (self.sockets.get(j), self.backlog.get_mut(j)) else {
                return Ok(());
            };
            if read == RECEIVE_BUDGET {
                *more = true;
                return Ok(());
            }
            let (n, from) = match socket.socket.recv_from(&mut self.recv_buf) {
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
            read += 1;
            // Each datagram's own time: a batch read in one go spans a while, and a stale
            // time would shorten the round trips measured from it.
            let now_ns = super::ns_since(origin);
            let Some(i) = self.peers.iter().position(|p| p.addrs.contains(&from)) else {
                self.counters.count_drop(DropReason::UnknownAddress);
                continue;
            };
            if n > MAX_DATAGRAM_LEN {
                self.counters.count_drop(DropReason::Oversized);
                continue;
            }
            let datagram = self.recv_buf.get(..n).unwrap_or_default();
            if let Err(reason) = deliver(
                &mut self.peers[i],
                datagram,
                self.max_payload,
                endpoint,
                now_ns,
                &mut self.counters,
            ) {
                self.counters.count_drop(reason);
            }
        }
    }
}

/// Opens one datagram from link `p`'s peer and acts on it: data to the endpoint, feedback
/// to the rate controller.
fn deliver<E: Endpoint + ?Sized>(
    p: &mut PeerDatagrams,
    datagram: &[u8],
    max_payload: u32,
    endpoint: &mut E,
    now_ns: u64,
    counters: &mut DatagramCounters,
) -> Result<(), DropReason> {
    let opened = p.opener.open(datagram, max_payload)?;
    // Every authentic datagram counts as received, feedback too: the two share the
    // direction's numbers, and the sender reads a gap in them as loss.
    let (Opened::Data { seq, .. } | Opened::Feedback { seq, .. }) = opened;
    p.feedback.received += 1;
    p.feedback.highest_seq = p.feedback.highest_seq.max(seq);
    match opened {
        Opened::Feedback { feedback, .. } => {
            counters.feedback_received += 1;
            let rtt_ns = now_ns
                .saturating_sub(feedback.echo_sent_ns)
                .saturating_sub(feedback.echo_held_ns);
            p.rate.on_feedback(
                now_ns,
                RateSignal {
                    rtt_ns,
                    received: feedback.received,
                    highest_seq: feedback.highest_seq,
                },
            );
            Ok(())
        }
        Opened::Data {
            header,
            payload,
            sent_ns,
            ..
        } => {
            if header.sender as usize != p.rank || !header.flags.is_loss_tolerant() {
                return Err(DropReason::Malformed);
            }
            counters.received += 1;
            counters.bytes_received += datagram.len() as u64;
            let f = &mut p.feedback;
            f.latest_sent_ns = sent_ns;
            f.latest_arrival_ns = now_ns;
            f.pending = f.pending.saturating_add(1);
            hand_over(endpoint, p.rank, &header, payload)
        }
    }
}

/// Writes a datagram's payload into the endpoint's slot and tells it; a frame it refuses
/// is [`DropReason::Stale`].
fn hand_over<E: Endpoint + ?Sized>(
    endpoint: &mut E,
    rank: Rank,
    header: &Header,
    payload: &[u8],
) -> Result<(), DropReason> {
    let slot = endpoint.recv_slot(rank, header).map_err(|e| {
        tracing::debug!("a datagram from rank {rank} was refused: {e}");
        DropReason::Stale
    })?;
    let dest = f32_bytes_mut(slot);
    if dest.len() != payload.len() {
        return Err(DropReason::Stale);
    }
    dest.copy_from_slice(payload);
    endpoint.handle_payload(rank, header).map_err(|e| {
        tracing::debug!("a datagram from rank {rank} was refused: {e}");
        DropReason::Stale
    })
}

/// The path a frame takes: sprayed frames the next path in turn, the others their key's
/// path (one flow per key, as ECMP hashes one).
fn choose_path(header: &Header, paths: usize, sprayed: &mut usize) -> usize {
    if paths <= 1 {
        return 0;
    }
    if header.flags.is_sprayed() {
        *sprayed = (*sprayed + 1) % paths;
        *sprayed
    } else {
        header.key as usize % paths
    }
}

/// Sends one datagram to `addr` with `dscp`, setting the socket's TOS when it changes.
fn send(socket: &mut PathSocket, bytes: &[u8], addr: SocketAddr, dscp: u8) -> io::Result<usize> {
    if socket.dscp != Some(dscp) {
        let fd = rustix::fd::AsFd::as_fd(&socket.socket);
        rustix::net::sockopt::set_ip_tos(fd, dscp << 2)?;
        socket.dscp = Some(dscp);
    }
    socket.socket.send_to(bytes, addr)
}

/// The header and payload of a frame the endpoint handed over as one buffer.
pub(super) fn split_frame(frame: &[u8]) -> Option<(Header, &[u8])> {
    let raw: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    let header = Header::decode(raw, u32::MAX).ok()?;
    Some((header, frame.get(HEADER_LEN..)?))
}
