//! The communication loop: drives one sans-IO
//! [`Endpoint`](syncopate_core::strategy::Endpoint) over a set of TCP links with
//! non-blocking I/O (mio), emulated link timing, heartbeats and liveness deadlines.
//!
//! Here are the public types and the state they share: the [`CommLoop`] and, per link, its
//! `LinkState` (the socket, what is being read, what waits to be written). The loop's work
//! is in five parts, one job each:
//!
//! - `event_loop`: the rounds of [`CommLoop::run`], in the endpoint's call order
//!   (commands, the endpoint's timer, transmits, progress), and the wait for I/O or the
//!   next deadline between them.
//! - `emulation`: the process's emulated network interface (core's [`Port`]): which frames
//!   the endpoint may hand over and on which links, when each is released to its socket,
//!   and the ingress port that holds arriving frames.
//! - `writer`: frames on their way out: tagged (frame MACs), batched and written.
//! - `reader`: frames coming in: parsed from the bytes as they land, checked, and handed to
//!   the endpoint (data) or to `control`.
//! - `control`: what keeps links alive and ends them: heartbeats and liveness deadlines,
//!   goodbyes, aborts, and the frames the hooks relay.
//!
//! A data frame goes endpoint, `emulation` (admitted, its fate and release time decided),
//! `writer` (sealed and written), socket, `reader` (parsed, held at the `emulation`'s
//! ingress gate, its tag checked) and endpoint.
//!
//! - `datagram`: with [`CommOptions::datagram`], the loss-tolerant frames as UDP
//!   datagrams beside the TCP links: sealed, paced, sent and received there.
//!
//! Every link is a TCP byte stream. Only two functions touch its socket, the reader's
//! `read_link` and the writer's `write_batch`; the datagram sockets are the `datagram`
//! part's alone.

mod control;
mod datagram;
mod emulation;
mod event_loop;
mod reader;
mod send_batch;
mod udp_io;
mod writer;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Interest, Poll, Token, Waker};

use crate::sampler::TrafficTotals;
use crate::timer::PreciseTimer;
use crate::trace::TraceRecorder;
use reader::{fresh_header, ReadState, STAGING_BYTES};
use syncopate_core::buffers::BufferRelay;
use syncopate_core::liveness::{Liveness, LivenessConfig};
use syncopate_core::net::{LinkCap, NetCounters, NetworkProfile, Port, Rotation};
use syncopate_core::pool::Pool;
use syncopate_core::strategy::{Endpoint, ProtocolError, Rank};
use syncopate_core::wire::mac::{FrameOpener, FrameSealer, IntegrityError, LinkKeys};
use syncopate_core::wire::{Header, DEFAULT_MAX_PAYLOAD};
use writer::OutFrame;

pub use datagram::DatagramOptions;
use datagram::DatagramPath;
use syncopate_core::net::RateStats;
use syncopate_core::wire::datagram::DatagramCounters;
pub use udp_io::Offloads;

/// The poll token of the waker (other threads' commands).
const WAKER: Token = Token(usize::MAX);
/// The poll token of the precise timer (frame releases, the endpoint's timer).
const TIMER: Token = Token(usize::MAX - 1);

/// One connection to a peer.
#[derive(Debug)]
pub struct Link {
    /// The peer's rank.
    pub peer: Rank,
    /// The connected, authenticated stream.
    pub stream: std::net::TcpStream,
    /// The frame keys its handshake derived (used with [`CommOptions::frame_mac`], and to
    /// derive the datagram keys).
    pub keys: LinkKeys,
    /// The peer's datagram address on each path (empty: the job sends no datagrams).
    pub datagram_addrs: Vec<std::net::SocketAddr>,
}

/// Timing knobs of the loop.
#[derive(Debug, Clone)]
pub struct CommOptions {
    /// Heartbeats, the peer timeout and the stall watchdog (core's rules).
    pub liveness: LivenessConfig,
    /// Largest payload accepted.
    pub max_payload: u32,
    /// After moving any byte, poll without sleeping for this long (zero: always sleep until
    /// something happens). Trades CPU for latency, as MPI's progress loop does.
    pub busy_poll: Duration,
    /// Tag every frame sent and check the tag of every frame received (the two ends of a
    /// link must agree; the handshake checks that they do). On by default.
    pub frame_mac: bool,
    /// Loss-tolerant frames as UDP datagrams (`None`: every frame on the TCP links).
    pub datagram: Option<DatagramOptions>,
}

impl Default for CommOptions {
    fn default() -> Self {
        Self {
            liveness: LivenessConfig::default(),
            max_payload: DEFAULT_MAX_PAYLOAD,
            busy_poll: Duration::ZERO,
            frame_mac: true,
            datagram: None,
        }
    }
}

/// Why the loop stopped with an error. Every variant names the peer and the step.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// The connection closed or failed.
    #[error("lost {peer} at step {step}: {reason}")]
    Lost {
        /// Who.
        peer: String,
        /// Step of this process at the time.
        step: u64,
        /// What happened.
        reason: String,
    },
    /// The peer sent something that breaks the protocol.
    #[error("{peer} broke the protocol at step {step}: {error}")]
    Protocol {
        /// Who.
        peer: String,
        /// Step of this process.
        step: u64,
        /// What it sent.
        error: ProtocolError,
    },
    /// A frame from the peer does not carry the tag its link's key gives it.
    #[error(
        "frame {frame} from {peer} failed its integrity check at step {step} (altered, \
         replayed, reordered or dropped on the way)"
    )]
    Integrity {
        /// Who.
        peer: String,
        /// The frame's number on its link, from the peer's first frame on (0).
        frame: u64,
        /// Step of this process.
        step: u64,
    },
    /// The peer gave up and said why.
    #[error("{peer} aborted at step {step}: {reason}")]
    Aborted {
        /// Who.
        peer: String,
        /// Step of this process.
        step: u64,
        /// The peer's reason.
        reason: String,
    },
    /// This process's own side failed (poll, a closed command channel, ...).
    #[error("{0}")]
    Local(String),
}

/// What the loop should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// Say goodbye to every peer, flush, and return.
    Finish,
}

/// Status of the links, for the hooks.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkStatus {
    /// Peers that said goodbye.
    pub goodbyes: usize,
    /// Links in all.
    pub links: usize,
    /// The first peer (in link order) whose goodbye has arrived, if any.
    pub first_goodbye: Option<Rank>,
}

/// The role-specific part of a loop: commands in, events out.
pub trait Hooks<E: ?Sized> {
    /// Applies commands from other threads (called after every wake-up and round).
    fn on_commands(&mut self, endpoint: &mut E) -> Result<Flow, CommError>;
    /// Drains the endpoint's events after frames were handled.
    fn on_progress(&mut self, endpoint: &mut E, status: LinkStatus) -> Result<Flow, CommError>;
    /// The step this process is at (for error messages).
    fn step(&self) -> u64;
    /// How to name a rank in messages, e.g. `rank 2 (server 0)`.
    fn describe(&self, rank: Rank) -> String;
    /// The buffer relay and frame timeline these hooks keep, if any: the loop hands the
    /// relay [`FrameKind::Buffers`](syncopate_core::wire::FrameKind::Buffers) frames (worker
    /// 0's buffers relayed beside the strategy's frames, [`syncopate_core::buffers`]; hooks
    /// that relay none refuse them), and the defaults of [`Hooks::poll_control`],
    /// [`Hooks::traces_frames`] and [`Hooks::on_frame_sent`] use them.
    fn extras(&mut self) -> Option<&mut HookExtras> {
        None
    }
    /// The next frame the hooks want written beside the strategy's (relayed buffers), and
    /// its link; the loop asks after every command and every frame received.
    fn poll_control(&mut self) -> Option<(Rank, Vec<u8>)> {
        self.extras()?.buffers.poll_transmit()
    }
    /// Whether to report every data frame ([`Hooks::on_frame_sent`],
    /// [`Hooks::on_frame_received`]), for timelines.
    fn traces_frames(&mut self) -> bool {
        self.extras().is_some_and(|x| x.tracer.is_some())
    }
    /// A data frame went out: handed to the network interface at `queued`, its last byte
    /// written to the socket at `written`.
    fn on_frame_sent(&mut self, header: &Header, queued: Instant, written: Instant) {
        if let Some(t) = self.extras().and_then(|x| x.tracer.as_mut()) {
            t.frame_sent(header, queued, written);
        }
    }
    /// A data frame from `peer` came in: its header at `arrived`, its last byte at `read`;
    /// the endpoint had handled it at `handled`. The default records it, from its header to
    /// its handling, on the timeline.
    fn on_frame_received(
        &mut self,
        _endpoint: &E,
        peer: Rank,
        header: &Header,
        arrived: Instant,
        _read: Instant,
        handled: Instant,
    ) {
        if let Some(t) = self.extras().and_then(|x| x.tracer.as_mut()) {
            t.frame_received(peer, header, arrived, handled);
        }
    }
}

/// What a server's or worker's hooks keep beside their endpoint: their part in relaying
/// worker 0's buffers and the recorder of their frame timeline.
pub struct HookExtras {
    /// This process's part in relaying worker 0's buffers.
    pub buffers: BufferRelay,
    /// The frames' timeline, when a window of steps is recorded.
    pub tracer: Option<TraceRecorder>,
}

/// The frame MACs of a link: the frames it sends are tagged, those it receives checked.
struct LinkMac {
    seal: FrameSealer,
    open: FrameOpener,
}

/// One link's state: its socket, the frame being read, the frames waiting to be written
/// (in the emulation, released, being written, control), and its goodbyes.
struct LinkState {
    peer: Rank,
    stream: TcpStream,
    read: ReadState,
    /// Bytes read from the socket and not yet parsed are `staging[staged]`; they stay there
    /// past a goodbye, for the next run of the loop.
    staging: Box<[u8]>,
    /// Where the payload of a data frame the ingress port lost is read to: never the
    /// endpoint's slot, so a lost frame leaves no trace in the endpoint's state.
    discard: Vec<u8>,
    staged: std::ops::Range<usize>,
    /// Frames offered to the emulated interface whose fate it has not yet decided, with
    /// their tokens.
    awaiting: VecDeque<(u64, OutFrame)>,
    /// Frames scheduled on the emulated link, with their release times.
    scheduled: VecDeque<(u64, OutFrame)>,
    /// The release time of the link's latest scheduled frame (frames leave in order).
    last_release: u64,
    /// Heartbeats, aborts and goodbyes: bypass the emulation.
    control: VecDeque<Vec<u8>>,
    /// Frames being written, in order (released by the emulated link, or control frames),
    /// at most one batch of them.
    writing: VecDeque<OutFrame>,
    /// Bytes of the first frame in `writing` already written.
    written: usize,
    queued_bytes: usize,
    goodbye_received: bool,
    goodbye_sent: bool,
    closed: bool,
    bytes_sent: u64,
    bytes_received: u64,
    /// Frame MACs (`None`: frames go without tags).
    mac: Option<LinkMac>,
}

impl LinkState {
    /// Whether nothing of the link is waiting to be written.
    fn is_drained(&self) -> bool {
        self.writing.is_empty()
            && self.control.is_empty()
            && self.scheduled.is_empty()
            && self.awaiting.is_empty()
    }
}

/// Byte counters of one link, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// The peer.
    pub peer: Rank,
    /// Bytes written to the socket.
    pub sent: u64,
    /// Bytes read from the socket.
    pub received: u64,
    /// What the emulated network did to the frames sent on this link: lost, retransmitted
    /// and dropped frames and bytes, queueing delay.
    pub net: NetCounters,
    /// What this host's emulated ingress port did to the frames received on this link
    /// (queueing delay, drops of a full queue; zero without `ingress`).
    pub ingress: NetCounters,
}

/// What a loop's datagram path did, for the run summary.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DatagramReport {
    /// Datagrams and bytes sent and received, and the drops by reason.
    pub counters: DatagramCounters,
    /// Datagrams the local kernel refused to send (lost at home).
    pub send_failures: u64,
    /// Datagrams the local kernel dropped on arrival for want of socket receive-buffer
    /// room: lost at home, not in the network (`None`: the kernel does not say).
    #[serde(default)]
    pub receive_buffer_drops: Option<u64>,
    /// What the kernel took of the batching offloads (GSO, GRO) and receive timestamps.
    #[serde(default)]
    pub offloads: Offloads,
    /// Each link's rate controllers: its peer and each path's figures (by path index).
    pub rates: Vec<(Rank, Vec<RateStats>)>,
}

/// The emulated network of one process: the job's profile, and the job's seed and this
/// host's id, from which its random streams derive (same seed, same losses).
#[derive(Debug, Clone, Default)]
pub struct Emulation {
    /// Every knob of the network.
    pub profile: NetworkProfile,
    /// The job's seed.
    pub seed: u64,
    /// This host (its rank).
    pub host: u64,
}

/// A communication loop over a set of links.
pub struct CommLoop {
    poll: Poll,
    waker: Arc<Waker>,
    timer: PreciseTimer,
    links: Vec<LinkState>,
    /// When each link last moved bytes, by link index.
    liveness: Liveness,
    options: CommOptions,
    origin: Instant,
    /// The process's emulated NIC: admission (the send window), when each frame leaves
    /// and reaches the peer, losses and retransmissions.
    egress: Port,
    /// What one link may hold not yet written (a window's worth on a network without a
    /// bandwidth, as the sockets' back-pressure; core's rule).
    cap: LinkCap,
    /// The token of the next frame offered to the NIC.
    next_token: u64,
    /// The host's emulated ingress port (with `ingress = true`): arriving data frames
    /// queue and serialise there before their payload is read; tokens are link indices.
    ingress: Option<Port>,
    /// Whether the last fill stopped because the interface's window was full (so the loop
    /// must wake when it drains below the window).
    window_full: bool,
    /// Frame buffers for reuse, trimmed about once a second to what the last second used.
    pool: Pool<u8>,
    /// When the pools' bytes were last published to the sampler (the loop's clock).
    pools_published_ns: u64,
    /// Scratch list of the links that can take a frame, in the rotation's order.
    open: Vec<Rank>,
    /// Fairness among the links (core's rule, the simulator's too): the order moves on
    /// with each frame handed over.
    rotation: Rotation,
    /// Bytes on all links, for the resource sampler.
    traffic: Arc<TrafficTotals>,
    /// The datagram path, with `CommOptions::datagram` and its sockets.
    datagram: Option<DatagramPath>,
}

impl CommLoop {
    /// Registers the links, which share one emulated interface of `network`, and the
    /// datagram sockets (one per path; empty without `options.datagram`); returns the loop
    /// and a waker for other threads.
    pub fn new(
        links: Vec<Link>,
        options: CommOptions,
        network: Emulation,
        datagram_sockets: Vec<std::net::UdpSocket>,
    ) -> io::Result<(Self, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let timer = PreciseTimer::new(poll.registry(), TIMER)?;
        let now = Instant::now();
        let traffic = Arc::new(TrafficTotals::for_peers(links.iter().map(|l| l.peer)));
        let datagram =
            DatagramPath::for_links(&options, &links, datagram_sockets, poll.registry(), now)?;
        let mut states = Vec::with_capacity(links.len());
        for (i, link) in links.into_iter().enumerate() {
            let mac = options.frame_mac.then(|| LinkMac {
                seal: FrameSealer::new(&link.keys.send),
                open: FrameOpener::new(&link.keys.recv),
            });
            link.stream.set_nonblocking(true)?;
            link.stream.set_nodelay(true)?;
            let mut stream = TcpStream::from_std(link.stream);
            poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            states.push(LinkState {
                peer: link.peer,
                stream,
                read: fresh_header(),
                staging: vec![0; STAGING_BYTES].into_boxed_slice(),
                staged: 0..0,
                discard: Vec::new(),
                awaiting: VecDeque::new(),
                scheduled: VecDeque::new(),
                last_release: 0,
                control: VecDeque::new(),
                writing: VecDeque::new(),
                written: 0,
                queued_bytes: 0,
                goodbye_received: false,
                goodbye_sent: false,
                closed: false,
                bytes_sent: 0,
                bytes_received: 0,
                mac,
            });
        }
        Ok((
            Self {
                poll,
                waker: waker.clone(),
                timer,
                liveness: Liveness::new(options.liveness, states.len(), 0),
                links: states,
                options,
                origin: now,
                egress: Port::egress(&network.profile, network.seed, network.host),
                cap: LinkCap::new(&network.profile),
                next_token: 0,
                ingress: (network.profile.ingress)
                    .then(|| Port::ingress(&network.profile, network.seed, network.host)),
                window_full: false,
                pool: Pool::new(),
                pools_published_ns: 0,
                open: Vec::new(),
                rotation: Rotation::new(),
                traffic,
                datagram,
            },
            waker,
        ))
    }

    /// Byte counters of every link.
    pub fn counters(&self) -> Vec<LinkCounters> {
        self.links
            .iter()
            .map(|l| LinkCounters {
                peer: l.peer,
                sent: l.bytes_sent,
                received: l.bytes_received,
                net: (self.egress)
                    .flow_counters(l.peer as u64)
                    .copied()
                    .unwrap_or_default(),
                ingress: (self.ingress.as_ref())
                    .and_then(|p| p.flow_counters(l.peer as u64))
                    .copied()
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// What the datagram path did: datagrams sent, received and dropped by reason, the
    /// sends the local kernel refused, and every link's rate controller (`None` without
    /// datagrams).
    pub fn datagram_report(&self) -> Option<DatagramReport> {
        let d = self.datagram.as_ref()?;
        let (counters, send_failures) = d.counters();
        Some(DatagramReport {
            counters,
            send_failures,
            receive_buffer_drops: d.receive_buffer_drops(),
            offloads: d.offloads(),
            rates: d.rate_stats(),
        })
    }

    /// The running byte totals of all links (shared with a sampler).
    pub fn traffic(&self) -> Arc<TrafficTotals> {
        self.traffic.clone()
    }

    /// A waker that interrupts the loop's wait (to apply new commands).
    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    /// Nanoseconds on the loop's clock.
    fn now_ns(&self) -> u64 {
        ns_since(self.origin)
    }

    /// About once a second: trims the frame pool to what the last second used, and publishes
    /// the bytes it and `endpoint` keep for reuse to the sampler.
    fn publish_pools<E: Endpoint + ?Sized>(&mut self, endpoint: &E) {
        let now_ns = self.now_ns();
        if now_ns < self.pools_published_ns.saturating_add(POOL_PERIOD_NS) {
            return;
        }
        self.pools_published_ns = now_ns;
        self.pool.trim();
        (self.traffic.frame_pool_bytes).store(self.pool.bytes() as u64, Ordering::Relaxed);
        (self.traffic.endpoint_pool_bytes).store(endpoint.pooled_bytes() as u64, Ordering::Relaxed);
    }
}

/// How often the loop publishes its pools' bytes.
const POOL_PERIOD_NS: u64 = 1_000_000_000;

/// Nanoseconds since `origin` (the loop's clock).
fn ns_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The error of a link to `peer` that closed or failed.
fn lost<E: ?Sized>(hooks: &dyn Hooks<E>, peer: Rank, reason: &str) -> CommError {
    CommError::Lost {
        peer: hooks.describe(peer),
        step: hooks.step(),
        reason: reason.into(),
    }
}

/// The error of a frame from `peer` whose tag does not check.
fn integrity<E: ?Sized>(hooks: &dyn Hooks<E>, peer: Rank, error: IntegrityError) -> CommError {
    CommError::Integrity {
        peer: hooks.describe(peer),
        frame: error.frame,
        step: hooks.step(),
    }
}

/// The error of a frame from `peer` that breaks the protocol.
fn protocol<E: ?Sized>(hooks: &dyn Hooks<E>, peer: Rank, error: ProtocolError) -> CommError {
    CommError::Protocol {
        peer: hooks.describe(peer),
        step: hooks.step(),
        error,
    }
}

#[cfg(test)]
mod datagram_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
#[path = "ingress_tests.rs"]
mod ingress_tests;
