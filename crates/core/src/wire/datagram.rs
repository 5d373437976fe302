//! The datagram format: how a loss-tolerant frame travels as one UDP datagram the network
//! may drop, and how a receiver tells the sender what arrived (for rate control). Sans-IO:
//! a [`DatagramSealer`] writes the datagrams one end sends in one direction of a link, a
//! [`DatagramOpener`] checks the ones it receives and says why it drops any it refuses.
//!
//! ```text
//! offset size field (little-endian)
//!      0    2 magic "SD"
//!      2    1 version (2)
//!      3    1 type     1 = data, 2 = feedback
//!      4    8 seq      the sender's datagram number in this direction of the link, from 0
//!     12    8 sent_ns  the sender's clock when sealed (echoed by feedback, for the RTT)
//!     20    . body     data: a frame header (48 bytes) and exactly its payload_len bytes;
//!                      feedback: received, highest_seq, echo_sent_ns, echo_held_ns (4 x u64)
//!    end   16 tag      GMAC over bytes [0, end): AES-256-GCM with no plaintext, those
//!                      bytes as associated data, and the nonce seq (u64) || 0 (u32)
//! ```
//!
//! Each direction of each link tags under its own key, derived from the link's frame keys
//! ([`datagram_keys`]), so a datagram reflected to its sender, or copied from another link,
//! fails its tag. GMAC needs a nonce never used twice under a key: a direction's keys are
//! fresh with every handshake (its nonces), and its one [`DatagramSealer`] numbers its
//! datagrams from 0 up. GMAC rather than the frames' keyed BLAKE3: on a datagram of 1.4 KB
//! (two BLAKE3 chunks, too few for its SIMD width) it takes about half the time. Data and
//! feedback share the direction's sequence numbers; a receiver accepts each number at most
//! once, in any order within a [`ReplayWindow`].
//!
//! [`DatagramOpener::open`] checks in this order, so that no unauthenticated byte string can
//! allocate, panic or change its state: the length, the prefix and the body's layout (the
//! frame header decoded and bounded), the tag in constant time, and only then the replay
//! window, which only an authentic datagram moves.
//!
//! A data datagram of [`max_packet_bytes`]`(mtu)` payload bytes fits one IP packet of `mtu`
//! bytes, so that it is never fragmented (a lost fragment loses the whole datagram).
//!
//! Datagrams carry their frame's priority in the IP DSCP field ([`dscp_of`]); the kernel
//! testbed's `htb` filters match these values, highest first:
//!
//! ```text
//! frame                       DSCP
//! priority class 0            46 (EF)
//! priority class 1            45
//! ...                         ...
//! priority class 7            39
//! drop-eligible (any class)    8 (CS1, the lowest)
//! reliable frames over TCP     0 (default)
//! ```

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, KeyInit, Nonce, Tag};
use serde::{Deserialize, Serialize};

use super::mac::{FrameKey, LinkKeys};
use super::{Flags, Header, WireError, HEADER_LEN};

/// Bytes before a datagram's body: magic, version, type, seq and sent_ns.
pub const PREFIX_LEN: usize = 20;
/// Bytes of the tag that ends every datagram.
pub const DATAGRAM_TAG_LEN: usize = 16;
/// Bytes a data datagram adds to its payload: prefix, frame header, tag (= 84).
pub const DATA_OVERHEAD: usize = PREFIX_LEN + HEADER_LEN + DATAGRAM_TAG_LEN;
/// IPv4 (20) + UDP (8) header bytes.
pub const IP_UDP_HEADERS: usize = 28;
/// The Ethernet MTU the default packet size is chosen for.
pub const DEFAULT_MTU: usize = 1500;
/// Largest datagram of this format: one that fills a [`DEFAULT_MTU`] IP packet (1,472
/// bytes). Every datagram a job sends fits one (packets are sized for it), so a longer one
/// is refused by its length before any other work.
pub const MAX_DATAGRAM_LEN: usize = DEFAULT_MTU - IP_UDP_HEADERS;
/// Bytes of a feedback datagram's body (four `u64`s).
pub const FEEDBACK_BODY_LEN: usize = 32;
/// Bytes of a whole feedback datagram.
pub const FEEDBACK_LEN: usize = PREFIX_LEN + FEEDBACK_BODY_LEN + DATAGRAM_TAG_LEN;

const MAGIC: [u8; 2] = *b"SD";
/// Version of the datagram format spoken by this build.
pub const DATAGRAM_VERSION: u8 = 2;
const TYPE_DATA: u8 = 1;
const TYPE_FEEDBACK: u8 = 2;
/// BLAKE3 key-derivation context of the datagram keys (fixed forever for this format).
const DATAGRAM_KEY_CONTEXT: &str = "Syncopate datagrams v2: UDP datagram GMAC key";

/// Largest payload (a multiple of 4 bytes: whole `f32`s) whose data datagram fits one IP
/// packet of `mtu` bytes without fragmentation: `(mtu - 28 - 84)` rounded down to 4; `None`
/// if it would be under 4. For 1500: 1388.
pub fn max_packet_bytes(mtu: usize) -> Option<usize> {
    let room = mtu.checked_sub(IP_UDP_HEADERS + DATA_OVERHEAD)?;
    let bytes = room - room % 4;
    (bytes >= 4).then_some(bytes)
}

/// The IP DSCP a frame with these flags is sent with: drop-eligible frames 8 (CS1, the
/// lowest); otherwise `46 - priority_class` (class 0: 46, EF ... class 7: 39). Reliable
/// frames over TCP keep DSCP 0. See the module docs for the table.
pub fn dscp_of(flags: Flags) -> u8 {
    if flags.is_drop_eligible() {
        8
    } else {
        46 - flags.priority_class().min(7)
    }
}

/// The priority class and drop eligibility a datagram of IP DSCP `dscp` carries, as
/// [`dscp_of`] marked them: 8 (CS1) drop-eligible and of the lowest class (7), 39..=46
/// class `46 - dscp`; any other (the feedback's 0, the TCP links' class) class 0.
pub fn class_of_dscp(dscp: u8) -> (u8, bool) {
    match dscp {
        8 => (7, true),
        39..=46 => (46 - dscp, false),
        _ => (0, false),
    }
}

/// The IP TOS byte (`IP_TOS`) a frame with these flags is sent with: its [`dscp_of`] in the
/// upper six bits, ECN bits clear.
pub fn tos_of(flags: Flags) -> u8 {
    dscp_of(flags) << 2
}

/// The datagram keys of a link: derived from its frame keys under a fixed context naming
/// Syncopate datagrams v2, so they differ from the frame keys, and mirrored on the two ends
/// as [`LinkKeys`] are.
pub fn datagram_keys(link: &LinkKeys) -> LinkKeys {
    LinkKeys {
        send: link.send.derive(DATAGRAM_KEY_CONTEXT),
        recv: link.recv.derive(DATAGRAM_KEY_CONTEXT),
    }
}

/// Transport feedback a receiver sends back to the sender of a direction (for rate
/// control).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Feedback {
    /// Data datagrams received in this direction so far (authentic, not replayed).
    pub received: u64,
    /// The highest seq seen so far.
    pub highest_seq: u64,
    /// `sent_ns` of the latest datagram received.
    pub echo_sent_ns: u64,
    /// How long the receiver held that datagram before this feedback, in nanoseconds.
    pub echo_held_ns: u64,
}

impl Feedback {
    fn encode(&self) -> [u8; FEEDBACK_BODY_LEN] {
        let mut b = [0u8; FEEDBACK_BODY_LEN];
        let fields = [
            self.received,
            self.highest_seq,
            self.echo_sent_ns,
            self.echo_held_ns,
        ];
        for (slot, field) in b.chunks_exact_mut(8).zip(fields) {
            slot.copy_from_slice(&field.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; FEEDBACK_BODY_LEN]) -> Self {
        let mut fields = b.chunks_exact(8).map(u64_le);
        let mut next = || fields.next().unwrap_or(0);
        Feedback {
            received: next(),
            highest_seq: next(),
            echo_sent_ns: next(),
            echo_held_ns: next(),
        }
    }
}

/// The little-endian `u64` in `bytes` (8 of them; fewer read as if zero-padded).
fn u64_le(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    for (dst, src) in w.iter_mut().zip(bytes) {
        *dst = *src;
    }
    u64::from_le_bytes(w)
}

/// The sending side of one direction of a link: numbers its datagrams and tags them.
#[derive(Clone)]
pub struct DatagramSealer {
    gmac: Aes256Gcm,
    next: u64,
}

impl DatagramSealer {
    /// A sealer under `key` (the link's datagram send key) whose first datagram is seq 0.
    pub fn new(key: &FrameKey) -> Self {
        Self {
            gmac: gmac_of(key),
            next: 0,
        }
    }

    /// Appends a whole data datagram carrying the frame `header` and its `payload` to
    /// `out`; `header.payload_len` must equal `payload.len()` (the caller guarantees it).
    pub fn seal_data(&mut self, out: &mut Vec<u8>, header: &Header, payload: &[u8], sent_ns: u64) {
        debug_assert_eq!(header.payload_len as usize, payload.len());
        self.seal(out, TYPE_DATA, sent_ns, &[&header.encode()[..], payload]);
    }

    /// Appends a whole feedback datagram to `out`.
    pub fn seal_feedback(&mut self, out: &mut Vec<u8>, feedback: &Feedback, sent_ns: u64) {
        self.seal(out, TYPE_FEEDBACK, sent_ns, &[&feedback.encode()]);
    }

    /// The seq the next datagram sealed will carry.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Appends prefix, `body` and tag to `out`, hashing the datagram in one pass where it
    /// was written.
    fn seal(&mut self, out: &mut Vec<u8>, kind: u8, sent_ns: u64, body: &[&[u8]]) {
        let body_len: usize = body.iter().map(|part| part.len()).sum();
        out.reserve(PREFIX_LEN + body_len + DATAGRAM_TAG_LEN);
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.push(DATAGRAM_VERSION);
        out.push(kind);
        out.extend_from_slice(&self.next.to_le_bytes());
        out.extend_from_slice(&sent_ns.to_le_bytes());
        for part in body {
            out.extend_from_slice(part);
        }
        // GCM refuses only associated data over 2^36 bytes; a datagram is at most 1,472.
        let tag = tag_of(&self.gmac, self.next, &out[start..]).unwrap_or_default();
        out.extend_from_slice(&tag);
        // 2^64 datagrams would take centuries at a billion a second.
        self.next = self.next.wrapping_add(1);
    }
}

/// The GMAC of one direction under its datagram `key`.
fn gmac_of(key: &FrameKey) -> Aes256Gcm {
    Aes256Gcm::new(key.secret().into())
}

/// The GCM nonce of the datagram numbered `seq`: seq (little-endian) || four zero bytes.
fn nonce_of(seq: u64) -> Nonce<aes_gcm::aead::consts::U12> {
    let mut nonce = [0u8; 12];
    nonce[..8].copy_from_slice(&seq.to_le_bytes());
    nonce.into()
}

/// The tag of the datagram numbered `seq` whose bytes but the tag are `signed`.
fn tag_of(gmac: &Aes256Gcm, seq: u64, signed: &[u8]) -> Option<[u8; DATAGRAM_TAG_LEN]> {
    let tag = gmac
        .encrypt_in_place_detached(&nonce_of(seq), signed, &mut [])
        .ok()?;
    Some(tag.into())
}

/// Whether `tag` is the tag of the datagram numbered `seq` whose other bytes are `signed`,
/// compared in time that does not depend on where they differ.
fn tag_checks(gmac: &Aes256Gcm, seq: u64, signed: &[u8], tag: &[u8; DATAGRAM_TAG_LEN]) -> bool {
    gmac.decrypt_in_place_detached(&nonce_of(seq), signed, &mut [], Tag::from_slice(tag))
        .is_ok()
}

/// A datagram that checked: authentic, fresh and well-formed.
#[derive(Debug, PartialEq)]
pub enum Opened<'a> {
    /// A frame: its header and its payload (exactly `header.payload_len` bytes).
    Data {
        /// The frame's header.
        header: Header,
        /// The frame's payload, borrowed from the datagram.
        payload: &'a [u8],
        /// The datagram's number in its direction.
        seq: u64,
        /// The sender's clock when it sealed the datagram.
        sent_ns: u64,
    },
    /// Transport feedback from the receiver of the other direction.
    Feedback {
        /// What the peer reports.
        feedback: Feedback,
        /// The datagram's number in its direction.
        seq: u64,
        /// The sender's clock when it sealed the datagram.
        sent_ns: u64,
    },
}

/// Why a datagram was dropped (every reason counted by the runtime, never an error of the
/// job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// From an address that is no peer's (decided by the runtime).
    UnknownAddress,
    /// Shorter than the smallest datagram, or than its own header announces.
    Truncated,
    /// Longer than any UDP payload, or announcing a payload above the limit.
    Oversized,
    /// Not the datagram format: bad magic, version, type, frame header, a frame kind that
    /// carries no values, or bytes beyond what the header announces.
    Malformed,
    /// The tag does not match: altered, forged, or under another direction's or link's key.
    BadMac,
    /// A seq seen before, or older than the replay window.
    Replayed,
    /// Authentic but of no use any more, e.g. of a finished step (decided by the runtime).
    Stale,
}

impl DropReason {
    /// Every reason, in the order of [`DatagramCounters`]' fields.
    pub const ALL: [DropReason; 7] = [
        DropReason::UnknownAddress,
        DropReason::Truncated,
        DropReason::Oversized,
        DropReason::Malformed,
        DropReason::BadMac,
        DropReason::Replayed,
        DropReason::Stale,
    ];

    /// The reason's snake_case name, as in the counters' serialised fields.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::UnknownAddress => "unknown_address",
            DropReason::Truncated => "truncated",
            DropReason::Oversized => "oversized",
            DropReason::Malformed => "malformed",
            DropReason::BadMac => "bad_mac",
            DropReason::Replayed => "replayed",
            DropReason::Stale => "stale",
        }
    }
}

/// Counts of dropped datagrams by reason, plus what was received and sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatagramCounters {
    /// Dropped: from an address that is no peer's.
    pub unknown_address: u64,
    /// Dropped: truncated.
    pub truncated: u64,
    /// Dropped: oversized.
    pub oversized: u64,
    /// Dropped: malformed.
    pub malformed: u64,
    /// Dropped: the tag did not match.
    pub bad_mac: u64,
    /// Dropped: replayed or older than the window.
    pub replayed: u64,
    /// Dropped: authentic but stale.
    pub stale: u64,
    /// Data datagrams sent.
    pub sent: u64,
    /// Data datagrams received and accepted.
    pub received: u64,
    /// Bytes of datagrams sent (UDP payloads, data and feedback).
    pub bytes_sent: u64,
    /// Bytes of datagrams received (UDP payloads, including dropped ones).
    pub bytes_received: u64,
    /// Feedback datagrams sent.
    pub feedback_sent: u64,
    /// Feedback datagrams received and accepted.
    pub feedback_received: u64,
}

impl DatagramCounters {
    /// Counts one datagram dropped for `reason`.
    pub fn count_drop(&mut self, reason: DropReason) {
        let counter = match reason {
            DropReason::UnknownAddress => &mut self.unknown_address,
            DropReason::Truncated => &mut self.truncated,
            DropReason::Oversized => &mut self.oversized,
            DropReason::Malformed => &mut self.malformed,
            DropReason::BadMac => &mut self.bad_mac,
            DropReason::Replayed => &mut self.replayed,
            DropReason::Stale => &mut self.stale,
        };
        *counter = counter.saturating_add(1);
    }

    /// The datagrams dropped, for any reason.
    pub fn drops(&self) -> u64 {
        [
            self.unknown_address,
            self.truncated,
            self.oversized,
            self.malformed,
            self.bad_mac,
            self.replayed,
            self.stale,
        ]
        .iter()
        .fold(0u64, |sum, n| sum.saturating_add(*n))
    }

    /// Adds `other`'s counts to these (e.g. over a process's links).
    pub fn add(&mut self, other: &DatagramCounters) {
        let DatagramCounters {
            unknown_address,
            truncated,
            oversized,
            malformed,
            bad_mac,
            replayed,
            stale,
            sent,
            received,
            bytes_sent,
            bytes_received,
            feedback_sent,
            feedback_received,
        } = *other;
        let pairs = [
            (&mut self.unknown_address, unknown_address),
            (&mut self.truncated, truncated),
            (&mut self.oversized, oversized),
            (&mut self.malformed, malformed),
            (&mut self.bad_mac, bad_mac),
            (&mut self.replayed, replayed),
            (&mut self.stale, stale),
            (&mut self.sent, sent),
            (&mut self.received, received),
            (&mut self.bytes_sent, bytes_sent),
            (&mut self.bytes_received, bytes_received),
            (&mut self.feedback_sent, feedback_sent),
            (&mut self.feedback_received, feedback_received),
        ];
        for (mine, theirs) in pairs {
            *mine = mine.saturating_add(theirs);
        }
    }
}

/// A datagram's body, parsed but not yet authenticated.
enum Body<'a> {
    Data { header: Header, payload: &'a [u8] },
    Feedback(Feedback),
}

/// The receiving side of one direction of a link: checks each datagram and keeps the
/// replay window.
#[derive(Clone)]
pub struct DatagramOpener {
    gmac: Aes256Gcm,
    window: ReplayWindow,
}

impl DatagramOpener {
    /// An opener under `key` (the link's datagram receive key) that has seen nothing.
    pub fn new(key: &FrameKey) -> Self {
        Self {
            gmac: gmac_of(key),
            window: ReplayWindow::new(),
        }
    }

    /// Checks one received datagram, in this order: its length (under a prefix and a tag:
    /// `Truncated`; over [`MAX_DATAGRAM_LEN`] or announcing a payload above `max_payload`:
    /// `Oversized`); its magic, version, type and body (a frame header that does not decode,
    /// of a kind that carries no values, or followed by more bytes than it announces, or a
    /// feedback body too long: `Malformed`; fewer bytes than announced: `Truncated`); its
    /// tag (`BadMac`, in constant time); and only then the replay window (a seq seen before
    /// or older than the window: `Replayed`). Only a datagram whose tag checked moves the
    /// window; nothing here allocates or panics, whatever the bytes.
    pub fn open<'a>(
        &mut self,
        datagram: &'a [u8],
        max_payload: u32,
    ) -> Result<Opened<'a>, DropReason> {
        if datagram.len() > MAX_DATAGRAM_LEN {
            return Err(DropReason::Oversized);
        }
        let (signed, tag) = datagram
            .split_last_chunk::<DATAGRAM_TAG_LEN>()
            .ok_or(DropReason::Truncated)?;
        let (prefix, body) = signed
            .split_first_chunk::<PREFIX_LEN>()
            .ok_or(DropReason::Truncated)?;
        if prefix[0..2] != MAGIC || prefix[2] != DATAGRAM_VERSION {
            return Err(DropReason::Malformed);
        }
        let body = match prefix[3] {
            TYPE_DATA => parse_data(body, max_payload)?,
            TYPE_FEEDBACK => parse_feedback(body)?,
            _ => return Err(DropReason::Malformed),
        };
        let seq = u64_le(&prefix[4..12]);
        if !tag_checks(&self.gmac, seq, signed, tag) {
            return Err(DropReason::BadMac);
        }
        let sent_ns = u64_le(&prefix[12..20]);
        if !self.window.record(seq) {
            return Err(DropReason::Replayed);
        }
        Ok(match body {
            Body::Data { header, payload } => Opened::Data {
                header,
                payload,
                seq,
                sent_ns,
            },
            Body::Feedback(feedback) => Opened::Feedback {
                feedback,
                seq,
                sent_ns,
            },
        })
    }

    /// The replay window of this direction.
    pub fn window(&self) -> &ReplayWindow {
        &self.window
    }
}

/// A data datagram's body: a frame header of a value-carrying kind and exactly its payload.
fn parse_data(body: &[u8], max_payload: u32) -> Result<Body<'_>, DropReason> {
    let (header, payload) = body
        .split_first_chunk::<HEADER_LEN>()
        .ok_or(DropReason::Truncated)?;
    let header = Header::decode(header, max_payload).map_err(|e| match e {
        WireError::TooLarge { .. } => DropReason::Oversized,
        _ => DropReason::Malformed,
    })?;
    if !header.kind.is_data() {
        return Err(DropReason::Malformed);
    }
    match payload.len().cmp(&(header.payload_len as usize)) {
        std::cmp::Ordering::Less => Err(DropReason::Truncated),
        std::cmp::Ordering::Greater => Err(DropReason::Malformed),
        std::cmp::Ordering::Equal => Ok(Body::Data { header, payload }),
    }
}

/// A feedback datagram's body: exactly four `u64`s.
fn parse_feedback(body: &[u8]) -> Result<Body<'_>, DropReason> {
    let fields: &[u8; FEEDBACK_BODY_LEN] = match body.len().cmp(&FEEDBACK_BODY_LEN) {
        std::cmp::Ordering::Less => return Err(DropReason::Truncated),
        std::cmp::Ordering::Greater => return Err(DropReason::Malformed),
        std::cmp::Ordering::Equal => body.try_into().map_err(|_| DropReason::Malformed)?,
    };
    Ok(Body::Feedback(Feedback::decode(fields)))
}

/// Sequence numbers a [`ReplayWindow`] remembers below the highest it has seen (and
/// including it), as IPsec and WireGuard keep.
pub const REPLAY_WINDOW_BITS: u64 = 2048;
const WINDOW_WORDS: usize = (REPLAY_WINDOW_BITS / 64) as usize;

/// A sliding anti-replay window over 64-bit sequence numbers: accepts each seq at most
/// once, accepts reordering within the last [`REPLAY_WINDOW_BITS`] seqs, and refuses seqs
/// older than that.
#[derive(Clone, Debug)]
pub struct ReplayWindow {
    /// Bit `s % REPLAY_WINDOW_BITS` is set when seq `s` of the window has been seen.
    seen: [u64; WINDOW_WORDS],
    /// The highest seq recorded, if any.
    highest: Option<u64>,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplayWindow {
    /// A window that has seen nothing.
    pub fn new() -> Self {
        Self {
            seen: [0; WINDOW_WORDS],
            highest: None,
        }
    }

    /// Whether `seq` would be accepted: above every seq seen, or within the window and not
    /// seen yet.
    pub fn check(&self, seq: u64) -> bool {
        match self.highest {
            Some(highest) if seq <= highest => {
                highest - seq < REPLAY_WINDOW_BITS && !self.is_seen(seq)
            }
            _ => true,
        }
    }

    /// Records `seq` if it is fresh ([`ReplayWindow::check`]); returns whether it was.
    pub fn record(&mut self, seq: u64) -> bool {
        if !self.check(seq) {
            return false;
        }
        match self.highest {
            Some(highest) if seq <= highest => {}
            Some(highest) if seq - highest < REPLAY_WINDOW_BITS => {
                // The seqs the window now covers for the first time: forget their slots.
                for newly in highest + 1..=seq {
                    self.clear(newly);
                }
                self.highest = Some(seq);
            }
            _ => {
                self.seen = [0; WINDOW_WORDS];
                self.highest = Some(seq);
            }
        }
        self.set(seq);
        true
    }

    /// The highest seq recorded, if any.
    pub fn highest(&self) -> Option<u64> {
        self.highest
    }

    fn slot(seq: u64) -> (usize, u64) {
        let bit = seq % REPLAY_WINDOW_BITS;
        ((bit / 64) as usize, 1u64 << (bit % 64))
    }

    fn is_seen(&self, seq: u64) -> bool {
        let (word, mask) = Self::slot(seq);
        self.seen.get(word).is_some_and(|w| w & mask != 0)
    }

    fn set(&mut self, seq: u64) {
        let (word, mask) = Self::slot(seq);
        if let Some(w) = self.seen.get_mut(word) {
            *w |= mask;
        }
    }

    fn clear(&mut self, seq: u64) {
        let (word, mask) = Self::slot(seq);
        if let Some(w) = self.seen.get_mut(word) {
            *w &= !mask;
        }
    }
}

#[cfg(test)]
#[path = "datagram_tests.rs"]
mod tests;
