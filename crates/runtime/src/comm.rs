//! The communication loop: drives one sans-IO [`Endpoint`] over a set of TCP links with
//! non-blocking I/O (mio), emulated link timing, heartbeats and liveness deadlines.
//!
//! The process has one emulated network interface shared by all its links, as a host's NIC
//! is: the core's egress [`Port`] (the same network model the simulator runs). Frames go
//! out when the endpoint's scheduler offers them (the most urgent across the links,
//! [`Endpoint::poll_transmit_lent`]) while the port admits them (it holds less than its send
//! window of bytes not yet serialised), and each frame is released to its socket at the
//! time the port says it would have reached the peer (serialisation, the latency, and for a
//! lost frame a retransmission timeout and its re-serialisation; a link's frames leave in
//! order). A small window is what makes priority preemption real: a late urgent slice waits
//! behind at most a window of bytes. With `ingress`, arriving data frames also wait in the
//! host's ingress [`Port`] before their payload is read. Without a bandwidth limit each link
//! holds at most a window of frames not yet written to its socket (back-pressure).
//!
//! Small frames are cheap: up to 32 due frames (256 KiB) go out in one vectored write,
//! and reads go through a staging buffer, many frames a read; large payloads are read
//! straight into the slot the endpoint designates, and lent payloads written straight from
//! the endpoint's buffers. A peer that closes without saying goodbye, sends a malformed or
//! unexpected frame, aborts, or stays silent past the deadline ends the loop with an error
//! that names it; the others are told through an Abort frame.
//!
//! With [`CommOptions::frame_mac`] every frame carries a MAC tag
//! ([`syncopate_core::wire::mac`]) under the keys of its link's handshake: a frame's tag is
//! computed when it joins the batch being written (so that the frames of a link are
//! numbered in the order they leave), and a frame received is hashed as its bytes land and
//! acted on only once the tag that follows it checks. A frame that fails ends the loop with
//! [`CommError::Integrity`]; its payload may already sit in the endpoint's slot, but the
//! endpoint is never told it arrived.
//!
//! The loop keeps the endpoint's call order (see [`syncopate_core::strategy`]): transmits,
//! then the endpoint's timer ([`Endpoint::poll_timeout`], armed on the same nanosecond
//! `timerfd` as the frame releases, on the loop's clock: nanoseconds since the loop was
//! created), then the hooks drain events; a due timer is handed to
//! [`Endpoint::handle_timeout`] at the top of the next round.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::sampler::TrafficTotals;
use crate::timer::PreciseTimer;
use syncopate_core::liveness::{Liveness, LivenessConfig};
use syncopate_core::net::{Fate, FrameMeta, NetCounters, NetworkProfile, Port};
use syncopate_core::strategy::{Endpoint, ProtocolError, Rank, Transmit};
use syncopate_core::wire::mac::{FrameOpener, FrameSealer, IntegrityError, LinkKeys, Tag, TAG_LEN};
use syncopate_core::wire::{
    f32_bytes, f32_bytes_mut, FrameKind, Header, WireError, DEFAULT_MAX_PAYLOAD, HEADER_LEN,
};

const WAKER: Token = Token(usize::MAX);
const TIMER: Token = Token(usize::MAX - 1);

/// One connection to a peer.
#[derive(Debug)]
pub struct Link {
    /// The peer's rank.
    pub peer: Rank,
    /// The connected, authenticated stream.
    pub stream: std::net::TcpStream,
    /// The frame keys its handshake derived (used with [`CommOptions::frame_mac`]).
    pub keys: LinkKeys,
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
    /// link must agree; the handshake checks that they do).
    pub frame_mac: bool,
}

impl Default for CommOptions {
    fn default() -> Self {
        Self {
            liveness: LivenessConfig::default(),
            max_payload: DEFAULT_MAX_PAYLOAD,
            busy_poll: Duration::ZERO,
            frame_mac: false,
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
    /// A [`FrameKind::Buffers`] frame from `peer` (worker 0's buffers relayed beside the
    /// strategy's frames, [`syncopate_core::buffers`]). Hooks that relay none refuse it.
    fn on_buffers(
        &mut self,
        peer: Rank,
        header: &Header,
        _payload: &[u8],
    ) -> Result<(), ProtocolError> {
        Err(ProtocolError::Unexpected {
            from: peer,
            reason: format!("buffers of step {} on a link that relays none", header.step),
        })
    }
    /// The next frame the hooks want written beside the strategy's (relayed buffers), and
    /// its link; the loop asks after every command and every frame received.
    fn poll_control(&mut self) -> Option<(Rank, Vec<u8>)> {
        None
    }
    /// Whether to report every data frame ([`Hooks::on_frame_sent`],
    /// [`Hooks::on_frame_received`]), for timelines.
    fn traces_frames(&self) -> bool {
        false
    }
    /// A data frame went out: handed to the network interface at `queued`, its last byte
    /// written to the socket at `written`.
    fn on_frame_sent(&mut self, _header: &Header, _queued: Instant, _written: Instant) {}
    /// A data frame from `peer` came in: its header at `arrived`, its last byte at `read`;
    /// the endpoint had handled it at `handled`.
    fn on_frame_received(
        &mut self,
        _endpoint: &E,
        _peer: Rank,
        _header: &Header,
        _arrived: Instant,
        _read: Instant,
        _handled: Instant,
    ) {
    }
}

enum ReadState {
    Header {
        buf: [u8; HEADER_LEN],
        filled: usize,
    },
    Data {
        header: Header,
        done: usize,
        arrived: Instant,
        /// Whether the payload may be read yet (the emulated ingress port's say).
        gate: Gate,
        /// Bytes of the payload fed to the link's frame MAC so far.
        hashed: usize,
    },
    Bytes {
        header: Header,
        buf: Vec<u8>,
        filled: usize,
    },
    /// The MAC tag after a frame read whole (links with frame MACs).
    Tag {
        buf: Tag,
        filled: usize,
        frame: Received,
    },
}

/// A frame read whole, to act on (on a link with frame MACs, once its tag has checked).
enum Received {
    Heartbeat(Header),
    /// A data frame, its payload in the endpoint's slot; its header came at `arrived`.
    Data {
        header: Header,
        arrived: Instant,
    },
    /// A control frame and its payload.
    Control {
        header: Header,
        payload: Vec<u8>,
    },
}

/// Where a data frame's payload stands with the receiver's emulated ingress port: the link
/// is not read past the frame's header until the port releases the frame, so the frames
/// of all links converging on this host queue and serialise there (and a sender whose
/// frames wait feels TCP's back-pressure, never a deadlock: the port releases by time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Not yet offered to the port.
    New,
    /// Offered; its fate is not decided yet.
    Waiting,
    /// Released at this time (the loop's clock).
    DueAt(u64),
    /// Readable (released, or no ingress port).
    Open,
    /// Lost or dropped by the port, a loss-tolerant frame: read, but never handed to the
    /// endpoint (its payload lands in the slot the endpoint gave, and
    /// [`Endpoint::handle_payload`] is not called).
    Discard,
}

impl ReadState {
    /// Bytes of a data frame's payload still to come (0 outside a payload).
    fn payload_left(&self) -> usize {
        match self {
            ReadState::Data { header, done, .. } => {
                (header.payload_len as usize).saturating_sub(*done)
            }
            _ => 0,
        }
    }
}

impl Received {
    fn header(&self) -> &Header {
        match self {
            Received::Heartbeat(header)
            | Received::Data { header, .. }
            | Received::Control { header, .. } => header,
        }
    }
}

/// Bytes a link reads from its socket at a time, ahead of the frame being parsed.
const STAGING_BYTES: usize = 64 << 10;
/// A payload with at least this many bytes still to come is read straight into its slot
/// (no copy); shorter ones go through the staging buffer, many frames to a read.
const DIRECT_READ_BYTES: usize = 32 << 10;
/// Largest payload of a control frame (an Abort's reason is at most 4 KiB): larger ones are
/// refused at their header, before anything is allocated.
const MAX_CONTROL_PAYLOAD: u32 = 64 << 10;

/// A frame on its way out.
struct OutFrame {
    /// The whole frame, or (lent) its header only.
    bytes: Vec<u8>,
    /// A lent frame's header: its payload is [`Endpoint::lent_payload`], written right after
    /// `bytes`, and the endpoint is told with [`Endpoint::handle_sent`] once it is.
    lent: Option<Header>,
    /// When a data frame was handed to the network interface (`None`: a control frame).
    queued: Option<Instant>,
    /// The frame's MAC tag, written last, on a link with frame MACs: reserved when the
    /// frame is made (so that its length on the wire is known from the start), computed
    /// when it joins the batch being written ([`LinkState::take_due`]).
    tag: Option<Tag>,
}

impl OutFrame {
    /// A frame with a tag to come if `tagged`.
    fn new(bytes: Vec<u8>, lent: Option<Header>, queued: Option<Instant>, tagged: bool) -> Self {
        Self {
            bytes,
            lent,
            queued,
            tag: tagged.then_some([0; TAG_LEN]),
        }
    }

    /// Bytes on the wire: header, payload and tag.
    fn len(&self) -> usize {
        self.bytes.len()
            + self.lent.map_or(0, |h| h.payload_len as usize)
            + self.tag.map_or(0, |t| t.len())
    }

    /// The frame's bytes in the order they are written: `bytes`, the lent payload (if
    /// any) and the tag (if any).
    fn parts<'a, E: Endpoint + ?Sized>(&'a self, endpoint: &'a E) -> [&'a [u8]; 3] {
        let payload = self
            .lent
            .map_or(&[][..], |h| f32_bytes(endpoint.lent_payload(&h)));
        let tag = self.tag.as_ref().map_or(&[][..], |t| &t[..]);
        [&self.bytes, payload, tag]
    }

    /// Computes the frame's tag (if it has one) as the next frame of `sealer`.
    fn seal<E: Endpoint + ?Sized>(&mut self, sealer: Option<&mut FrameSealer>, endpoint: &E) {
        let (Some(sealer), Some(_)) = (sealer, self.tag) else {
            return;
        };
        let [bytes, payload, _] = self.parts(endpoint);
        // Every frame made here starts with its header (one without could only fail).
        if let Some((header, body)) = bytes.split_first_chunk::<HEADER_LEN>() {
            let tag = sealer.seal(header, &[body, payload]);
            self.tag = Some(tag);
        }
    }
}

/// The parts of a frame from its byte `skip` on, empty ones left out.
fn unwritten(parts: [&[u8]; 3], mut skip: usize) -> impl Iterator<Item = &[u8]> {
    parts.into_iter().filter_map(move |part| {
        let rest = part.get(skip.min(part.len())..).unwrap_or_default();
        skip = skip.saturating_sub(part.len());
        (!rest.is_empty()).then_some(rest)
    })
}

/// The frame MACs of a link: the frames it sends are tagged, those it receives checked.
struct LinkMac {
    seal: FrameSealer,
    open: FrameOpener,
}

/// At most this many frames go into one vectored write (three slices each: bytes, lent
/// payload, tag)...
const BATCH_FRAMES: usize = 32;
/// ...and frames are added to it while it holds less than this many bytes (a frame in a
/// batch has left the emulated send window, so the batch bounds how far past the window a
/// late urgent frame can be, as the socket's own buffer does).
const BATCH_BYTES: usize = 256 << 10;

struct LinkState {
    peer: Rank,
    stream: TcpStream,
    read: ReadState,
    /// Bytes read from the socket and not yet parsed are `staging[staged]`; they stay there
    /// past a goodbye, for the next run of the loop.
    staging: Box<[u8]>,
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

    /// Moves the frames due at `now_ns` into the batch being written: control frames first
    /// (only at a frame boundary, when nothing is being written), then frames the emulated
    /// link has released, while the batch has room. Each frame is tagged as it joins.
    fn take_due<E: Endpoint + ?Sized>(&mut self, now_ns: u64, endpoint: &E) {
        if self.writing.is_empty() {
            if let Some(bytes) = self.control.pop_front() {
                let mut frame = OutFrame::new(bytes, None, None, self.mac.is_some());
                frame.seal(self.mac.as_mut().map(|m| &mut m.seal), endpoint);
                self.writing.push_back(frame);
            }
        }
        let mut bytes: usize = self.writing.iter().map(OutFrame::len).sum();
        while self.writing.len() < BATCH_FRAMES
            && (bytes < BATCH_BYTES || self.writing.is_empty())
            && self.scheduled.front().is_some_and(|(t, _)| *t <= now_ns)
        {
            let Some((_, mut frame)) = self.scheduled.pop_front() else {
                break;
            };
            // The frame has crossed the emulated link: it no longer occupies the send
            // buffer, so the next one can start serialising while this one is written.
            self.queued_bytes = self.queued_bytes.saturating_sub(frame.len());
            bytes += frame.len();
            frame.seal(self.mac.as_mut().map(|m| &mut m.seal), endpoint);
            self.writing.push_back(frame);
        }
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
    /// Whether the NIC has a bandwidth (else each link holds at most a window of frames
    /// not yet written, as the sockets' back-pressure).
    shaped: bool,
    window: usize,
    /// The token of the next frame offered to the NIC.
    next_token: u64,
    /// The host's emulated ingress port (with `ingress = true`): arriving data frames
    /// queue and serialise there before their payload is read; tokens are link indices.
    ingress: Option<Port>,
    /// Whether the last fill stopped because the interface's window was full (so the loop
    /// must wake when it drains below the window).
    window_full: bool,
    /// Frame buffers for reuse.
    pool: Vec<Vec<u8>>,
    /// Scratch list of the links that can take a frame, rotated for fairness.
    open: Vec<Rank>,
    rotation: usize,
    /// Bytes on all links, for the resource sampler.
    traffic: Arc<TrafficTotals>,
}

impl CommLoop {
    /// Registers the links, which share one emulated interface of `network`; returns the
    /// loop and a waker for other threads.
    pub fn new(
        links: Vec<Link>,
        options: CommOptions,
        network: Emulation,
    ) -> io::Result<(Self, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let timer = PreciseTimer::new(poll.registry(), TIMER)?;
        let now = Instant::now();
        let traffic = Arc::new(TrafficTotals::for_peers(links.iter().map(|l| l.peer)));
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
                read: ReadState::Header {
                    buf: [0; HEADER_LEN],
                    filled: 0,
                },
                staging: vec![0; STAGING_BYTES].into_boxed_slice(),
                staged: 0..0,
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
                shaped: network.profile.bandwidth_bps.is_some(),
                window: network.profile.buffer_bytes,
                next_token: 0,
                ingress: (network.profile.ingress)
                    .then(|| Port::ingress(&network.profile, network.seed, network.host)),
                window_full: false,
                pool: Vec::new(),
                open: Vec::new(),
                rotation: 0,
                traffic,
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

    /// The running byte totals of all links (shared with a sampler).
    pub fn traffic(&self) -> Arc<TrafficTotals> {
        self.traffic.clone()
    }

    /// A waker that interrupts the loop's wait (to apply new commands).
    pub fn waker(&self) -> Arc<Waker> {
        self.waker.clone()
    }

    fn now_ns(&self) -> u64 {
        ns_since(self.origin)
    }

    /// Runs until the hooks say [`Flow::Finish`] (then says goodbye and flushes) or an error.
    /// On an error every peer is sent an Abort frame carrying it.
    pub fn run<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        match self.run_inner(endpoint, hooks) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.abort_all(endpoint, &e.to_string());
                Err(e)
            }
        }
    }

    fn run_inner<E: Endpoint + ?Sized>(
        &mut self,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let mut events = Events::with_capacity(256);
        // Finishing: first drain every frame the endpoint still has, then say goodbye, then
        // return once our goodbyes are written and every peer's goodbye has arrived. A link
        // is not read past its goodbye, so the loop can run again (another endpoint, the
        // next round) over the same links without mixing rounds.
        for l in &mut self.links {
            l.goodbye_received = false;
            l.goodbye_sent = false;
        }
        // Frames of this run may already wait behind the last run's goodbye, read but not
        // parsed, with no readiness event to come for them.
        for i in 0..self.links.len() {
            self.read_link(i, endpoint, hooks)?;
        }
        let mut finishing = false;
        let mut goodbye_sent = false;
        loop {
            if !finishing && hooks.on_commands(endpoint)? == Flow::Finish {
                finishing = true;
            }
            self.fire_timeout(endpoint);
            let now_ns = self.now_ns();
            // Transmitting can complete a step (the last frame handed over or written), and
            // the hooks may then start the next one: its frames go out now, not after a wait
            // that nothing would end (every peer may be waiting for them).
            loop {
                self.queue_control(hooks)?;
                let handed = self.fill(endpoint);
                self.release_ingress(endpoint, hooks)?;
                for i in 0..self.links.len() {
                    if let Err(e) = self.flush(i, endpoint, hooks) {
                        // A peer that gave up may have said why just before closing: its
                        // Abort is the better error.
                        return Err(match self.read_link(i, endpoint, hooks) {
                            Err(aborted @ CommError::Aborted { .. }) => aborted,
                            _ => e,
                        });
                    }
                    self.check_liveness(i, now_ns, hooks)?;
                }
                if !finishing && hooks.on_progress(endpoint, self.status())? == Flow::Finish {
                    finishing = true;
                }
                if handed == 0 {
                    break;
                }
            }
            let drained = self.links.iter().all(|l| l.is_drained());
            if finishing && drained {
                if !goodbye_sent {
                    self.say_goodbye();
                    goodbye_sent = true;
                    continue;
                }
                if self.links.iter().all(|l| l.goodbye_received) {
                    return Ok(());
                }
            }
            let deadline = endpoint.poll_timeout();
            self.wait(&mut events, deadline)?;
            for ev in events.iter() {
                if ev.token() == WAKER {
                    continue;
                }
                if ev.token() == TIMER {
                    self.timer.clear();
                    continue;
                }
                let i = ev.token().0;
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.read_link(i, endpoint, hooks)?;
                }
            }
            if !finishing && hooks.on_progress(endpoint, self.status())? == Flow::Finish {
                finishing = true;
            }
        }
    }

    /// Queues the frames the hooks want written beside the strategy's on their links.
    fn queue_control<E: ?Sized>(&mut self, hooks: &mut dyn Hooks<E>) -> Result<(), CommError> {
        while let Some((peer, frame)) = hooks.poll_control() {
            let link = self.links.iter_mut().find(|l| l.peer == peer);
            let link = link.ok_or_else(|| {
                CommError::Local(format!(
                    "no link to {} for a relayed frame",
                    hooks.describe(peer)
                ))
            })?;
            link.control.push_back(frame);
        }
        Ok(())
    }

    /// Waits for I/O, a command or the next deadline. Within `busy_poll` of the last byte
    /// moved it only looks (a zero-timeout poll, then a yield): a process that has just
    /// sent or received is likely to be answered within microseconds, and waking a sleeping
    /// thread costs more than that (tens of microseconds on a virtual machine).
    /// `endpoint_deadline` is the endpoint's own timer ([`Endpoint::poll_timeout`]).
    fn wait(
        &mut self,
        events: &mut Events,
        endpoint_deadline: Option<u64>,
    ) -> Result<(), CommError> {
        let busy_ns = u64::try_from(self.options.busy_poll.as_nanos()).unwrap_or(u64::MAX);
        let busy = busy_ns > 0
            && (self.liveness.last_activity())
                .is_some_and(|t| self.now_ns().saturating_sub(t) < busy_ns);
        let timeout = if busy {
            Duration::ZERO
        } else {
            let mut timeout = self.next_timeout();
            if let Some(at) = endpoint_deadline {
                timeout = timeout.min(Duration::from_nanos(at.saturating_sub(self.now_ns())));
            }
            // Every deadline (frame releases, the endpoint's timer) goes to the precise
            // timer; the poll's own timeout is whole milliseconds and only a backstop.
            self.timer
                .arm(timeout)
                .map_err(|e| CommError::Local(format!("arming the timer failed: {e}")))?;
            timeout.max(Duration::from_millis(50))
        };
        if let Err(e) = self.poll.poll(events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(CommError::Local(format!("poll failed: {e}")));
            }
        }
        if busy && events.is_empty() {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Calls the endpoint's [`Endpoint::handle_timeout`] if the time it asked for has come.
    fn fire_timeout<E: Endpoint + ?Sized>(&self, endpoint: &mut E) {
        let now_ns = self.now_ns();
        if endpoint.poll_timeout().is_some_and(|at| at <= now_ns) {
            endpoint.handle_timeout(now_ns);
        }
    }

    fn status(&self) -> LinkStatus {
        LinkStatus {
            goodbyes: self.links.iter().filter(|l| l.goodbye_received).count(),
            links: self.links.len(),
        }
    }

    fn next_timeout(&self) -> Duration {
        let now_ns = self.now_ns();
        let heartbeat = Duration::from_nanos(self.options.liveness.heartbeat_ns);
        let mut t = heartbeat.min(Duration::from_millis(100));
        for l in &self.links {
            if let Some((release, _)) = l.scheduled.front() {
                if l.writing.is_empty() {
                    t = t.min(Duration::from_nanos(release.saturating_sub(now_ns)));
                }
            }
        }
        if self.window_full {
            let room = self.egress.room_at(now_ns);
            t = t.min(Duration::from_nanos(room.saturating_sub(now_ns)));
        }
        let ingress = self.ingress.as_ref().and_then(Port::poll_timeout);
        let held = self.links.iter().filter_map(|l| match l.read {
            ReadState::Data {
                gate: Gate::DueAt(at),
                ..
            } => Some(at),
            _ => None,
        });
        let port_times = self.egress.poll_timeout().into_iter().chain(ingress);
        if let Some(at) = port_times.chain(held).min() {
            t = t.min(Duration::from_nanos(at.saturating_sub(now_ns)));
        }
        t
    }

    /// Asks the endpoint for frames while the interface (or, unshaped, each link) has room,
    /// then collects the fates the interface has decided; returns how many frames it handed
    /// over.
    fn fill<E: Endpoint + ?Sized>(&mut self, endpoint: &mut E) -> usize {
        let handed = self.offer_frames(endpoint);
        self.collect_fates(endpoint);
        handed
    }

    /// Offers the endpoint's frames to the emulated interface while it admits them.
    fn offer_frames<E: Endpoint + ?Sized>(&mut self, endpoint: &mut E) -> usize {
        let now_ns = self.now_ns();
        let (shaped, window) = (self.shaped, self.window);
        self.window_full = false;
        let mut handed = 0;
        loop {
            if !self.egress.has_room(now_ns) {
                self.window_full = true;
                return handed;
            }
            self.open.clear();
            self.open.extend(
                self.links
                    .iter()
                    .filter(|l| shaped || l.queued_bytes < window)
                    .map(|l| l.peer),
            );
            if self.open.is_empty() {
                return handed;
            }
            let turn = self.rotation % self.open.len();
            self.open.rotate_left(turn);
            self.rotation = self.rotation.wrapping_add(1);
            let mut buf = self.pool.pop().unwrap_or_default();
            buf.clear();
            let Some(transmit) = endpoint.poll_transmit_lent(&self.open, &mut buf) else {
                self.pool.push(buf);
                return handed;
            };
            let (peer, lent) = match transmit {
                Transmit::Copied(peer) => (peer, None),
                Transmit::Lent(peer, header) => (peer, Some(header)),
            };
            let frame = OutFrame::new(buf, lent, Some(Instant::now()), self.options.frame_mac);
            let Some(link) = self.links.iter_mut().find(|l| l.peer == peer) else {
                // The endpoint named a link it was not offered: a bug, but never leave a lent
                // payload unreturned.
                if let Some(h) = frame.lent {
                    endpoint.handle_sent(peer, &h);
                }
                self.pool.push(frame.bytes);
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
            self.egress.enqueue(now_ns, token, meta);
            link.queued_bytes += frame.len();
            link.awaiting.push_back((token, frame));
            handed += 1;
        }
    }

    /// Takes the fates the emulated interface has decided: a delivered frame is released to
    /// its socket at its delivery time (never before the link's previous frame); a frame the
    /// network gave up (loss-tolerant frames only) is returned to the endpoint unsent.
    fn collect_fates<E: Endpoint + ?Sized>(&mut self, endpoint: &mut E) {
        let now_ns = self.now_ns();
        let mut decided = false;
        while let Some((token, fate)) = self.egress.poll_fate(now_ns) {
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
                    let release = at.max(link.last_release);
                    link.last_release = release;
                    link.scheduled.push_back((release, frame));
                }
                Fate::Lost { .. } | Fate::Dropped => {
                    link.queued_bytes = link.queued_bytes.saturating_sub(frame.len());
                    if let Some(h) = frame.lent {
                        endpoint.handle_sent(link.peer, &h);
                    }
                    if frame.queued.is_some() {
                        self.pool.push(frame.bytes);
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
    fn release_ingress<E: Endpoint + ?Sized>(
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
            if let Some(ReadState::Data { gate, header, .. }) = link.map(|l| &mut l.read) {
                if *gate == Gate::Waiting {
                    *gate = match fate {
                        Fate::Delivered { at, .. } => Gate::DueAt(at),
                        Fate::Lost { .. } | Fate::Dropped if header.flags.is_loss_tolerant() => {
                            Gate::Discard
                        }
                        Fate::Lost { .. } | Fate::Dropped => Gate::DueAt(now_ns),
                    };
                }
            }
        }
        for i in 0..self.links.len() {
            if let ReadState::Data { gate, .. } = &mut self.links[i].read {
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
    fn publish_net_counters(&self) {
        for (l, shared) in self.links.iter().zip(&self.traffic.links) {
            if let Some(c) = self.egress.flow_counters(l.peer as u64) {
                shared.net.store(c);
            }
        }
    }

    /// Writes what is due on link `i` until the socket would block: several frames at a
    /// time (one vectored write of up to [`BATCH_FRAMES`] frames or [`BATCH_BYTES`] bytes),
    /// so that small frames do not cost a system call each.
    fn flush<E: Endpoint + ?Sized>(
        &mut self,
        i: usize,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let now_ns = self.now_ns();
        let pool = &mut self.pool;
        let traffic = &self.traffic;
        let liveness = &mut self.liveness;
        let link = &mut self.links[i];
        if link.closed {
            return Ok(());
        }
        let idle = link.writing.is_empty() && link.control.is_empty() && !link.goodbye_sent;
        if liveness.heartbeat_due(i, now_ns, idle) {
            link.control
                .push_back(Header::control(FrameKind::Heartbeat, 0).encode().to_vec());
        }
        loop {
            link.take_due(now_ns, &*endpoint);
            if link.writing.is_empty() {
                return Ok(());
            }
            match write_batch(&mut link.stream, &link.writing, link.written, &*endpoint) {
                Ok(0) => {
                    return Err(lost(&*hooks, link.peer, "connection closed while sending"));
                }
                Ok(n) => {
                    link.bytes_sent += n as u64;
                    traffic.add_sent(i, n as u64);
                    liveness.handle_written(i, now_ns);
                    link.written += n;
                    while let Some(len) = link.writing.front().map(OutFrame::len) {
                        if link.written < len {
                            break;
                        }
                        link.written -= len;
                        if let Some(frame) = link.writing.pop_front() {
                            if let Some(h) = frame.lent {
                                endpoint.handle_sent(link.peer, &h);
                            }
                            if let Some(queued) = frame.queued {
                                report_sent(&mut *hooks, &frame.bytes, queued);
                                pool.push(frame.bytes);
                            }
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(lost(&*hooks, link.peer, &format!("send failed: {e}"))),
            }
        }
    }

    fn check_liveness<E: ?Sized>(
        &self,
        i: usize,
        now_ns: u64,
        hooks: &dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let link = &self.links[i];
        let watched = !link.closed && !link.goodbye_received;
        (self.liveness)
            .check_link(i, now_ns, watched, !link.writing.is_empty())
            .map_err(|reason| lost(hooks, link.peer, &reason.to_string()))
    }

    /// Reads every complete frame available on link `i`. Reads go into the link's staging
    /// buffer (many small frames a system call), and the frames are taken out of it; a
    /// payload with at least [`DIRECT_READ_BYTES`] still to come is read straight into the
    /// endpoint's slot instead.
    fn read_link<E: Endpoint + ?Sized>(
        &mut self,
        i: usize,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let max_payload = self.options.max_payload;
        let now_ns = self.now_ns();
        let origin = self.origin;
        let liveness = &mut self.liveness;
        let link = &mut self.links[i];
        let peer = link.peer;
        loop {
            if link.closed || link.goodbye_received {
                return Ok(());
            }
            if let ReadState::Data { header, gate, .. } = &mut link.read {
                match (*gate, self.ingress.as_mut()) {
                    (Gate::Open | Gate::Discard, _) => {}
                    (Gate::New, None) => *gate = Gate::Open,
                    (Gate::New, Some(port)) => {
                        let tag = if link.mac.is_some() { TAG_LEN } else { 0 };
                        let bytes = HEADER_LEN + header.payload_len as usize + tag;
                        let meta = FrameMeta::of_frame(header, bytes, peer as u64);
                        port.enqueue(now_ns, i as u64, meta);
                        *gate = Gate::Waiting;
                        return Ok(());
                    }
                    (Gate::Waiting | Gate::DueAt(_), _) => return Ok(()),
                }
            }
            let staged = link.staging.get(link.staged.clone()).unwrap_or_default();
            if !staged.is_empty() {
                let dest = destination(&mut link.read, endpoint, peer, &*hooks)?;
                let n = dest.len().min(staged.len());
                dest[..n].copy_from_slice(&staged[..n]);
                link.staged.start += n;
                advance(link, n, endpoint, hooks, max_payload)?;
                continue;
            }
            let direct = link.read.payload_left() >= DIRECT_READ_BYTES;
            let read = if direct {
                let dest = destination(&mut link.read, endpoint, peer, &*hooks)?;
                link.stream.read(dest)
            } else {
                link.staged = 0..0;
                link.stream.read(&mut link.staging[..])
            };
            let n = match read {
                Ok(0) => return Err(lost(&*hooks, peer, "connection closed")),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(lost(&*hooks, peer, &format!("receive failed: {e}"))),
            };
            link.bytes_received += n as u64;
            self.traffic.add_received(i, n as u64);
            liveness.handle_received(i, ns_since(origin));
            if direct {
                advance(link, n, endpoint, hooks, max_payload)?;
            } else {
                link.staged = 0..n;
            }
        }
    }

    fn say_goodbye(&mut self) {
        for l in &mut self.links {
            l.control
                .push_back(Header::control(FrameKind::Goodbye, 0).encode().to_vec());
            l.goodbye_sent = true;
        }
    }

    /// Best effort: tells every peer why this process gives up (finishing a partly written
    /// frame first, so the abort arrives on a frame boundary), within a short deadline.
    fn abort_all<E: Endpoint + ?Sized>(&mut self, endpoint: &E, reason: &str) {
        let payload = reason.as_bytes();
        let len = payload.len().min(4096);
        let header = Header::control(FrameKind::Abort, len as u32).encode();
        let body = &payload[..len];
        let deadline = Instant::now() + Duration::from_millis(500);
        for l in &mut self.links {
            l.awaiting.clear();
            l.scheduled.clear();
            if l.closed {
                continue;
            }
            // Only the first frame being written may be partly written; the rest go unsent,
            // and the numbers their tags took go to the abort.
            let first = l.writing.pop_front();
            let pos = std::mem::take(&mut l.written);
            let unsent = l.writing.len() as u64;
            l.writing.clear();
            if let Some(mac) = &mut l.mac {
                mac.seal.unseal(unsent);
            }
            if let Some(current) = first {
                let rest: Vec<u8> = unwritten(current.parts(endpoint), pos)
                    .collect::<Vec<_>>()
                    .concat();
                if !write_all_until(&mut l.stream, &rest, deadline) {
                    continue;
                }
            }
            let mut frame = [&header[..], body].concat();
            if let Some(mac) = &mut l.mac {
                frame.extend_from_slice(&mac.seal.seal(&header, &[body]));
            }
            if write_all_until(&mut l.stream, &frame, deadline) {
                let _ = l.stream.shutdown(std::net::Shutdown::Write);
            }
        }
        // Read and drop what the peers still send for a moment, so that closing does not
        // reset connections whose peers have not yet read the abort.
        let mut sink = vec![0u8; 64 * 1024];
        let drain_until = Instant::now() + Duration::from_millis(200);
        let mut open: Vec<usize> = (0..self.links.len()).collect();
        while !open.is_empty() && Instant::now() < drain_until {
            open.retain(|&i| match self.links[i].stream.read(&mut sink) {
                Ok(0) => false,
                Ok(_) => true,
                Err(e) => {
                    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
                }
            });
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Writes `frames` (the first of them from its byte `written` on) in one vectored write:
/// each frame's bytes, then a lent frame's payload straight from the endpoint's buffer,
/// then its tag.
fn write_batch<E: Endpoint + ?Sized>(
    stream: &mut TcpStream,
    frames: &VecDeque<OutFrame>,
    written: usize,
    endpoint: &E,
) -> io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); 3 * BATCH_FRAMES];
    let mut n = 0;
    let mut skip = written;
    for frame in frames.iter().take(BATCH_FRAMES) {
        for rest in unwritten(frame.parts(endpoint), skip) {
            slices[n] = IoSlice::new(rest);
            n += 1;
        }
        skip = skip.saturating_sub(frame.len());
    }
    stream.write_vectored(&slices[..n])
}

/// Writes `bytes` to a non-blocking stream, retrying until done or `deadline`.
fn write_all_until(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> bool {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                if Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return false,
        }
    }
    true
}

/// Where the next bytes of the frame being read go: the rest of its header, of the slot the
/// endpoint designates for its payload (which must hold exactly the payload), or of a
/// control frame's payload.
fn destination<'a, E: Endpoint + ?Sized>(
    read: &'a mut ReadState,
    endpoint: &'a mut E,
    peer: Rank,
    hooks: &dyn Hooks<E>,
) -> Result<&'a mut [u8], CommError> {
    Ok(match read {
        ReadState::Header { buf, filled } => buf.get_mut(*filled..).unwrap_or_default(),
        ReadState::Data { header, done, .. } => {
            let slot = endpoint
                .recv_slot(peer, header)
                .map_err(|e| protocol(hooks, peer, e))?;
            let bytes = f32_bytes_mut(slot);
            if bytes.len() != header.payload_len as usize {
                let reason = format!(
                    "{}-byte slot for a {}-byte payload",
                    bytes.len(),
                    header.payload_len
                );
                return Err(protocol(
                    hooks,
                    peer,
                    ProtocolError::Unexpected { from: peer, reason },
                ));
            }
            bytes.get_mut(*done..).unwrap_or_default()
        }
        ReadState::Bytes { buf, filled, .. } => buf.get_mut(*filled..).unwrap_or_default(),
        ReadState::Tag { buf, filled, .. } => buf.get_mut(*filled..).unwrap_or_default(),
    })
}

/// `n` more bytes of the frame being read have landed where [`destination`] said: moves the
/// link's reader on, handing complete frames (once their tag has checked, on a link with
/// frame MACs) to the endpoint (data) or the link (control).
fn advance<E: Endpoint + ?Sized>(
    link: &mut LinkState,
    n: usize,
    endpoint: &mut E,
    hooks: &mut dyn Hooks<E>,
    max_payload: u32,
) -> Result<(), CommError> {
    let peer = link.peer;
    let next = match &mut link.read {
        ReadState::Header { buf, filled } => {
            *filled += n;
            if *filled < HEADER_LEN {
                return Ok(());
            }
            let header = Header::decode(buf, max_payload)
                .map_err(|e: WireError| protocol(&*hooks, peer, e.into()))?;
            match header.kind {
                k if k.is_data() && header.payload_len > 0 => ReadState::Data {
                    header,
                    done: 0,
                    arrived: Instant::now(),
                    gate: Gate::New,
                    hashed: 0,
                },
                FrameKind::Heartbeat => {
                    received(link, Received::Heartbeat(header), endpoint, hooks)?
                }
                k if k.is_data() => {
                    let frame = Received::Data {
                        header,
                        arrived: Instant::now(),
                    };
                    received(link, frame, endpoint, hooks)?
                }
                _ if header.payload_len == 0 => {
                    let frame = Received::Control {
                        header,
                        payload: Vec::new(),
                    };
                    received(link, frame, endpoint, hooks)?
                }
                _ if header.payload_len > MAX_CONTROL_PAYLOAD => {
                    let reason = format!(
                        "{:?} frame announcing {} bytes (at most {MAX_CONTROL_PAYLOAD})",
                        header.kind, header.payload_len
                    );
                    let error = ProtocolError::Unexpected { from: peer, reason };
                    return Err(protocol(&*hooks, peer, error));
                }
                _ => ReadState::Bytes {
                    header,
                    buf: vec![0; header.payload_len as usize],
                    filled: 0,
                },
            }
        }
        ReadState::Data {
            header,
            done,
            arrived,
            hashed,
            gate,
            ..
        } => {
            *done += n;
            if let Some(mac) = &mut link.mac {
                let landed = *done;
                feed_payload(
                    &mut mac.open,
                    endpoint,
                    peer,
                    header,
                    hashed,
                    landed,
                    &*hooks,
                )?;
            }
            if *done < header.payload_len as usize {
                return Ok(());
            }
            // A frame the ingress port lost is read (and its tag checked) but never handed
            // to the endpoint.
            let frame = if *gate == Gate::Discard {
                Received::Heartbeat(*header)
            } else {
                Received::Data {
                    header: *header,
                    arrived: *arrived,
                }
            };
            received(link, frame, endpoint, hooks)?
        }
        ReadState::Bytes {
            header,
            buf,
            filled,
        } => {
            *filled += n;
            if *filled < buf.len() {
                return Ok(());
            }
            if let Some(mac) = &mut link.mac {
                mac.open.update(buf);
            }
            let frame = Received::Control {
                header: *header,
                payload: std::mem::take(buf),
            };
            received(link, frame, endpoint, hooks)?
        }
        ReadState::Tag { buf, filled, frame } => {
            *filled += n;
            if *filled < TAG_LEN {
                return Ok(());
            }
            let (tag, header) = (*buf, *frame.header());
            let frame = std::mem::replace(frame, Received::Heartbeat(header));
            if let Some(mac) = &mut link.mac {
                (mac.open.finish(&header.encode(), &tag))
                    .map_err(|e| integrity(&*hooks, peer, e))?;
            }
            act(link, frame, endpoint, hooks)?;
            fresh_header()
        }
    };
    link.read = next;
    Ok(())
}

/// Feeds `open` the payload bytes of the frame `header` that have landed in the endpoint's
/// slot since the last call (`hashed` so far, `landed` now), a whole
/// [`HASH_BLOCK`](syncopate_core::wire::mac::HASH_BLOCK) at a
/// time until the last bytes: hashed where they were read to, while they are still in the
/// cache, at BLAKE3's full speed.
fn feed_payload<E: Endpoint + ?Sized>(
    open: &mut FrameOpener,
    endpoint: &mut E,
    peer: Rank,
    header: &Header,
    hashed: &mut usize,
    landed: usize,
    hooks: &dyn Hooks<E>,
) -> Result<(), CommError> {
    let upto = FrameOpener::feed_upto(landed, header.payload_len as usize);
    if upto > *hashed {
        let slot = (endpoint.recv_slot(peer, header)).map_err(|e| protocol(hooks, peer, e))?;
        open.update(f32_bytes(slot).get(*hashed..upto).unwrap_or_default());
        *hashed = upto;
    }
    Ok(())
}

/// A frame has been read whole: on a link with frame MACs its tag is read next, else it is
/// acted on now. Returns what the link reads next.
fn received<E: Endpoint + ?Sized>(
    link: &mut LinkState,
    frame: Received,
    endpoint: &mut E,
    hooks: &mut dyn Hooks<E>,
) -> Result<ReadState, CommError> {
    if link.mac.is_some() {
        return Ok(ReadState::Tag {
            buf: [0; TAG_LEN],
            filled: 0,
            frame,
        });
    }
    act(link, frame, endpoint, hooks)?;
    Ok(fresh_header())
}

/// Hands a frame read whole (and checked) to the endpoint (data) or the link (control).
fn act<E: Endpoint + ?Sized>(
    link: &mut LinkState,
    frame: Received,
    endpoint: &mut E,
    hooks: &mut dyn Hooks<E>,
) -> Result<(), CommError> {
    match frame {
        Received::Heartbeat(_) => Ok(()),
        Received::Data { header, arrived } => {
            complete_data(endpoint, link.peer, &header, arrived, hooks)
        }
        Received::Control { header, payload } => handle_control(link, &header, &payload, hooks),
    }
}

/// The header at the start of an encoded frame, if it is one.
fn frame_header(frame: &[u8]) -> Option<Header> {
    let raw: &[u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    Header::decode(raw, u32::MAX).ok()
}

fn fresh_header() -> ReadState {
    ReadState::Header {
        buf: [0; HEADER_LEN],
        filled: 0,
    }
}

fn complete_data<E: Endpoint + ?Sized>(
    endpoint: &mut E,
    peer: Rank,
    header: &Header,
    arrived: Instant,
    hooks: &mut dyn Hooks<E>,
) -> Result<(), CommError> {
    if header.payload_len == 0 {
        // Make sure the frame is acceptable even without a payload.
        endpoint
            .recv_slot(peer, header)
            .map_err(|e| protocol(&*hooks, peer, e))?;
    }
    let read = Instant::now();
    endpoint
        .handle_payload(peer, header)
        .map_err(|e| protocol(&*hooks, peer, e))?;
    if hooks.traces_frames() {
        hooks.on_frame_received(endpoint, peer, header, arrived, read, Instant::now());
    }
    Ok(())
}

/// Tells the hooks that a data frame's last byte was written (if they trace frames).
fn report_sent<E: ?Sized>(hooks: &mut dyn Hooks<E>, frame: &[u8], queued: Instant) {
    if !hooks.traces_frames() {
        return;
    }
    let header = frame
        .first_chunk::<HEADER_LEN>()
        .and_then(|b| Header::decode(b, u32::MAX).ok());
    if let Some(header) = header {
        hooks.on_frame_sent(&header, queued, Instant::now());
    }
}

fn handle_control<E: ?Sized>(
    link: &mut LinkState,
    header: &Header,
    payload: &[u8],
    hooks: &mut dyn Hooks<E>,
) -> Result<(), CommError> {
    match header.kind {
        FrameKind::Buffers => hooks
            .on_buffers(link.peer, header, payload)
            .map_err(|e| protocol(&*hooks, link.peer, e)),
        FrameKind::Goodbye => {
            link.goodbye_received = true;
            Ok(())
        }
        FrameKind::Abort => Err(CommError::Aborted {
            peer: hooks.describe(link.peer),
            step: hooks.step(),
            reason: String::from_utf8_lossy(payload).into_owned(),
        }),
        other => Err(CommError::Protocol {
            peer: hooks.describe(link.peer),
            step: hooks.step(),
            error: ProtocolError::Unexpected {
                from: link.peer,
                reason: format!("{other:?} frame during training"),
            },
        }),
    }
}

/// Nanoseconds since `origin` (the loop's clock).
fn ns_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn lost<E: ?Sized>(hooks: &dyn Hooks<E>, peer: Rank, reason: &str) -> CommError {
    CommError::Lost {
        peer: hooks.describe(peer),
        step: hooks.step(),
        reason: reason.into(),
    }
}

fn integrity<E: ?Sized>(hooks: &dyn Hooks<E>, peer: Rank, error: IntegrityError) -> CommError {
    CommError::Integrity {
        peer: hooks.describe(peer),
        frame: error.frame,
        step: hooks.step(),
    }
}

fn protocol<E: ?Sized>(hooks: &dyn Hooks<E>, peer: Rank, error: ProtocolError) -> CommError {
    CommError::Protocol {
        peer: hooks.describe(peer),
        step: hooks.step(),
        error,
    }
}

#[cfg(test)]
mod tests;
