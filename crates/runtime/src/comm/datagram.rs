//! The datagram path: loss-tolerant frames (DLCP's packets and loss-tolerant pulls,
//! `dlcp-allreduce`'s hops) travel as UDP datagrams that the network may really drop, while
//! the handshake, control and reliable frames stay on the TCP links.
//!
//! The endpoint is the same sans-IO endpoint; only the driver differs: a frame the endpoint
//! hands over whose flags say loss-tolerant goes into its link's datagram queue instead of
//! the TCP stream. Each datagram is sealed (core's [`syncopate_core::wire::datagram`]) under keys
//! derived from its link's handshake when it leaves, paced by its link's
//! [`RateController`], sent with the IP DSCP of its priority class
//! ([`syncopate_core::wire::datagram::dscp_of`]), on the path its flags choose (sprayed: the
//! next path in turn; otherwise the key's path), in batches ([`super::send_batch`]) through
//! the kernel's offloads where it has them ([`super::udp_io`]). A received datagram, read a
//! budget at a time, is handed to the endpoint only once it comes from
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
    datagram_keys, DatagramCounters, DatagramOpener, DatagramSealer, DropReason, Feedback, Opened,
    DATA_OVERHEAD, IP_UDP_HEADERS, MAX_DATAGRAM_LEN,
};
use syncopate_core::wire::mac::LinkKeys;
use syncopate_core::wire::{f32_bytes_mut, Header, HEADER_LEN};

use super::send_batch::{Outbox, PathSocket, Queued};
use super::udp_io::{self, Offloads, MAX_BATCH_BYTES};

/// A receiver sends feedback at least this often while datagrams arrive (1 ms)...
pub const FEEDBACK_EVERY_NS: u64 = 1_000_000;
/// ...and after at most this many datagrams.
pub const FEEDBACK_EVERY_DATAGRAMS: u32 = 16;
/// Socket buffer sizes asked for: a burst of a step's packets must not overflow the
/// receiver's socket (the drops to study are the network's, not ours).
const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// DSCP of feedback datagrams: the class of the TCP links (control traffic).
const FEEDBACK_DSCP: u8 = 0;
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

impl FeedbackState {
    /// Whether a feedback is due at `now_ns`.
    fn is_due(&self, now_ns: u64) -> bool {
        self.pending >= FEEDBACK_EVERY_DATAGRAMS
            || (self.pending > 0 && now_ns.saturating_sub(self.last_sent_ns) >= FEEDBACK_EVERY_NS)
    }
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
}

/// The datagram path of a communication loop.
pub(super) struct DatagramPath {
    out: Outbox,
    /// By link index.
    peers: Vec<PeerDatagrams>,
    counters: DatagramCounters,
    sprayed: usize,
    max_payload: u32,
    /// One receive: a datagram, or a run of them the kernel coalesced (GRO).
    recv_buf: Vec<u8>,
    /// By path: whether its socket may hold more datagrams than the last read's budget
    /// took (the poll will not say so again: readiness is edge-triggered).
    backlog: Vec<bool>,
    /// By link: whether an authentic datagram came from its peer since the last
    /// [`DatagramPath::take_heard`] (proof that the peer lives, whatever its TCP link does).
    heard: Vec<bool>,
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
            let keys = datagram_keys(keys);
            peers.push(PeerDatagrams {
                rank: *rank,
                addrs: addrs.clone(),
                sealer: DatagramSealer::new(&keys.send),
                opener: DatagramOpener::new(&keys.recv),
                rate: RateController::new(rate),
                queue: VecDeque::new(),
                feedback: FeedbackState::default(),
            });
        }
        Ok(Self {
            out: Outbox::new(paths),
            peers,
            counters: DatagramCounters::default(),
            sprayed: 0,
            max_payload,
            recv_buf: vec![0; MAX_BATCH_BYTES],
            seal_buf: Vec::with_capacity(MAX_DATAGRAM_LEN),
            backlog: vec![false; paths_len],
            heard: vec![false; links.len()],
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
        self.peers.get(i).is_none_or(|p| p.queue.is_empty()) && !self.out.holds(i)
    }

    /// Whether link `i` may take another frame: its pacer let every datagram go into a
    /// batch, and that batch will leave before the link's next TCP write (the loop flushes
    /// it first; a batch the socket refused holds the link back). A Probe on TCP thus
    /// never overtakes the packets handed over before it.
    pub(super) fn takes_more(&self, i: usize) -> bool {
        let held = self.out.holds(i) && self.out.is_blocked();
        self.peers.get(i).is_none_or(|p| p.queue.is_empty()) && !held
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
        (self.counters, self.out.send_failures())
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

    /// Every link's rate controller, for the summary.
    pub(super) fn rate_stats(&self) -> Vec<(Rank, RateStats)> {
        self.peers
            .iter()
            .map(|p| (p.rank, p.rate.stats()))
            .collect()
    }

    /// Sends what the pacers allow and the feedback that is due, in batches.
    pub(super) fn pump(&mut self, now_ns: u64) {
        self.batch_due(now_ns);
        self.flush(now_ns);
    }

    /// Sends the batch (sealing its datagrams under its link's keys); `false` while the
    /// socket refuses it.
    fn flush(&mut self, now_ns: u64) -> bool {
        let Some(p) = self.out.link().and_then(|i| self.peers.get_mut(i)) else {
            return true;
        };
        self.out.flush(&mut p.sealer, now_ns)
    }

    /// Moves what the pacers allow into batches, sending a batch only once it is full or
    /// the next datagram cannot join it; the last batch stays for [`DatagramPath::pump`]
    /// (the frames the endpoint hands over next may join it). Sends the feedback due.
    pub(super) fn batch_due(&mut self, now_ns: u64) {
        if self.out.is_blocked() && !self.flush(now_ns) {
            return;
        }
        for i in 0..self.peers.len() {
            // The batch is one link's, and its datagrams take their numbers before the
            // link's feedback does.
            let feedback_due = self.peers[i].feedback.is_due(now_ns);
            let other = self.out.link().is_some_and(|l| l != i || feedback_due);
            if other && !self.flush(now_ns) {
                return;
            }
            self.send_feedback_if_due(i, now_ns);
            let p = &mut self.peers[i];
            if p.rate.poll_timeout().is_some_and(|t| t <= now_ns) {
                p.rate.handle_timeout(now_ns);
            }
            let paths = self.out.paths();
            while p.rate.next_send_at(now_ns) <= now_ns {
                let Some(q) = p.queue.front() else {
                    break;
                };
                let path = choose_path(&q.header, paths, &mut self.sprayed);
                let Some(&to) = p.addrs.get(path) else {
                    break;
                };
                if !self.out.takes(i, path, to) && !self.out.flush(&mut p.sealer, now_ns) {
                    break;
                }
                let Some(q) = p.queue.pop_front() else {
                    break;
                };
                let len = DATA_OVERHEAD + q.payload.len();
                let seq = p.sealer.next_seq() + self.out.len() as u64;
                self.counters.sent += 1;
                self.counters.bytes_sent += len as u64;
                p.rate.on_sent(now_ns, (len + IP_UDP_HEADERS) as u64, seq);
                self.out.push(i, path, to, q);
            }
        }
    }

    /// Sends link `i`'s receiver feedback if it is due.
    fn send_feedback_if_due(&mut self, i: usize, now_ns: u64) {
        let Some(p) = self.peers.get_mut(i) else {
            return;
        };
        let f = &p.feedback;
        if !f.is_due(now_ns) {
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
        let (Some(socket), Some(addr)) = (self.out.socket(0), p.addrs.first()) else {
            return;
        };
        match udp_io::send(&socket.socket, &self.seal_buf, None, *addr, FEEDBACK_DSCP) {
            Ok(_) => self.counters.feedback_sent += 1,
            Err(e) => tracing::debug!("feedback to rank {} was not sent: {e}", p.rank),
        }
        p.feedback.pending = 0;
        p.feedback.last_sent_ns = now_ns;
    }

    /// When the path next needs [`DatagramPath::pump`]: a pacer's next departure, a
    /// feedback due, a rate controller's timeout.
    pub(super) fn next_deadline(&self, now_ns: u64) -> Option<u64> {
        let blocked = self.out.blocked_until();
        let retry = self.out.link().map(|_| blocked);
        let peers = self.peers.iter().flat_map(|p| {
            let send = (!p.queue.is_empty()).then(|| p.rate.next_send_at(now_ns).max(blocked));
            let feedback = (p.feedback.pending > 0)
                .then(|| p.feedback.last_sent_ns.saturating_add(FEEDBACK_EVERY_NS));
            [send, feedback, p.rate.poll_timeout()]
        });
        peers.chain([retry]).flatten().min()
    }

    /// Reads the datagrams waiting on path `j`'s socket (up to [`RECEIVE_BUDGET`] refused
    /// ones, [`RECEIVE_BUDGET_ALL`] in all) and hands the good ones to the endpoint; `origin` is the loop's clock. A datagram longer than
    /// [`MAX_DATAGRAM_LEN`] is refused by its length alone.
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
            let Some(i) = self.peers.iter().position(|p| p.addrs.contains(&got.from)) else {
                for _ in datagrams {
                    self.counters.count_drop(DropReason::UnknownAddress);
                    refused += 1;
                }
                continue;
            };
            for datagram in datagrams {
                let result = if got.truncated || datagram.len() > MAX_DATAGRAM_LEN {
                    Err(DropReason::Oversized)
                } else {
                    let p = &mut self.peers[i];
                    deliver(
                        p,
                        datagram,
                        self.max_payload,
                        endpoint,
                        arrived_ns,
                        &mut self.counters,
                    )
                };
                match result {
                    Ok(()) => self.heard[i] = true,
                    Err(DropReason::Stale) => {
                        // Authentic, only late: its peer lives.
                        self.heard[i] = true;
                        self.counters.count_drop(DropReason::Stale);
                    }
                    Err(reason) => {
                        self.counters.count_drop(reason);
                        refused += 1;
                    }
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

/// The header and payload of a frame the endpoint handed over as one buffer.
pub(super) fn split_frame(frame: &[u8]) -> Option<(Header, &[u8])> {
    let raw: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    let header = Header::decode(raw, u32::MAX).ok()?;
    Some((header, frame.get(HEADER_LEN..)?))
}
