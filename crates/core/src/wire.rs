//! The wire format: versioned frames with a fixed 48-byte little-endian header followed by
//! `payload_len` bytes (for data frames, raw little-endian `f32`s, read straight into their
//! destination by the driver).
//!
//! ```text
//! offset size field
//!      0    2 magic "SY"
//!      2    1 version
//!      3    1 kind
//!      4    4 payload_len   bytes after the header (the length prefix)
//!      8    8 step
//!     16    4 key           parameter tensor (or bucket) number
//!     20    4 offset        first element within the key
//!     24    4 length        elements carried (data frames: payload_len / 4)
//!     28    4 priority      smaller is more urgent
//!     32    8 sequence      per-sender sequence or ring step
//!     40    4 sender        rank of the sending process
//!     44    4 flags         what the network may do with the frame (see [`Flags`])
//! ```
//!
//! Decoding never trusts a length: the payload is bounded by a maximum frame size, data
//! frames must carry exactly `4 * length` bytes, and unknown versions or kinds are refused
//! with an error that says what was found.
//!
//! On a link with frame MACs every frame is followed by a 32-byte tag over its number in
//! the link's direction, its header and its payload ([`mac`]). A loss-tolerant frame may
//! instead travel as one authenticated UDP datagram ([`datagram`]).

pub mod datagram;
pub mod halves;
pub mod mac;

pub use halves::WireFloat;

/// Protocol version spoken by this build.
pub const VERSION: u8 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 48;
/// Default upper bound on a frame's payload (64 MiB).
pub const DEFAULT_MAX_PAYLOAD: u32 = 64 << 20;
const MAGIC: [u8; 2] = *b"SY";

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Handshake and rendezvous messages (UTF-8 JSON payload, interpreted by the driver).
    Control = 1,
    /// A gradient slice from a worker to a parameter server.
    Push = 2,
    /// Updated parameter values from a server to a worker.
    Params = 3,
    /// A ring reduce-scatter chunk (to be added to the receiver's copy).
    Reduce = 4,
    /// A ring all-gather chunk (to replace the receiver's copy).
    Gather = 5,
    /// Liveness signal; no payload.
    Heartbeat = 6,
    /// The sender is giving up; the payload is a UTF-8 reason.
    Abort = 7,
    /// Orderly end of the job.
    Goodbye = 8,
    /// A chain receiver's acknowledgement to its sender: every value of the frame's step is
    /// in and the receiver has begun that step, so the sender may run ahead by one step
    /// (step-wise averaging). A data frame of no values.
    Ack = 9,
    /// A loss-tolerant sender has sent every packet of a key's share (`key`, `step`) and
    /// asks the receiver what is missing. A data frame of no values.
    Probe = 10,
    /// The receiver has enough packets of a key's share (`key`, `step`): the sender stops
    /// sending them. A data frame of no values.
    Stop = 11,
    /// The receiver's answer to a probe: which packets of the key's share are missing, one
    /// bit per packet (bit `i % 32` of word `i / 32`), `length` little-endian 32-bit words
    /// read as a data frame's payload.
    Missing = 12,
    /// Worker 0's buffers (batch-norm running statistics) relayed to every worker at an
    /// evaluation point: `length` little-endian `f32`s starting at element `offset` of the
    /// `key` values in all (see [`crate::buffers`]). Travels beside the strategy's frames,
    /// as control frames do.
    Buffers = 13,
    /// A gossip worker's weights of one step sent to a ring neighbour, which mixes them
    /// with its own (decentralised SGD): `length` values of `key` starting at `offset`.
    Mix = 14,
}

impl FrameKind {
    /// Whether the payload is `length` little-endian `f32` values.
    pub fn is_data(self) -> bool {
        matches!(
            self,
            FrameKind::Push
                | FrameKind::Params
                | FrameKind::Reduce
                | FrameKind::Gather
                | FrameKind::Ack
                | FrameKind::Probe
                | FrameKind::Stop
                | FrameKind::Missing
                | FrameKind::Mix
        )
    }

    /// Whether the payload is exactly `length` little-endian `f32` values (data frames, and
    /// the buffers relayed beside them).
    pub fn carries_values(self) -> bool {
        self.is_data() || self == FrameKind::Buffers
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => FrameKind::Control,
            2 => FrameKind::Push,
            3 => FrameKind::Params,
            10 => FrameKind::Probe,
            11 => FrameKind::Stop,
            12 => FrameKind::Missing,
            4 => FrameKind::Reduce,
            5 => FrameKind::Gather,
            6 => FrameKind::Heartbeat,
            7 => FrameKind::Abort,
            8 => FrameKind::Goodbye,
            9 => FrameKind::Ack,
            13 => FrameKind::Buffers,
            14 => FrameKind::Mix,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame carries.
    pub kind: FrameKind,
    /// Bytes of payload after the header.
    pub payload_len: u32,
    /// Training step the frame belongs to.
    pub step: u64,
    /// Parameter key (or bucket).
    pub key: u32,
    /// First element within the key.
    pub offset: u32,
    /// Elements carried.
    pub length: u32,
    /// Scheduling priority (smaller is more urgent).
    pub priority: i32,
    /// Sender's sequence number or ring step.
    pub sequence: u64,
    /// Rank of the sender.
    pub sender: u32,
    /// What the network may do with the frame.
    pub flags: Flags,
}

/// What the network may do with a frame, as its sender declares it: the frame's priority
/// class, whether it is loss-tolerant (never retransmitted), whether a full priority queue
/// may drop it first, whether it may take any path, and whether it is the reliable last
/// packet of a loss-tolerant share (answered as a Probe). Zero (the default) is a reliable
/// frame of class 0 that follows its flow's path, as every TCP-like strategy sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(u32);

impl Flags {
    const CLASS_MASK: u32 = 0b111;
    const LOSS_TOLERANT: u32 = 1 << 3;
    const DROP_ELIGIBLE: u32 = 1 << 4;
    const SPRAY: u32 = 1 << 5;
    /// Two bits: the float the values travel as ([`WireFloat::bits`]).
    const WIRE_SHIFT: u32 = 6;
    const WIRE_MASK: u32 = 0b11 << Self::WIRE_SHIFT;
    const LAST_OF_SHARE: u32 = 1 << 8;
    const KNOWN: u32 = Self::CLASS_MASK
        | Self::LOSS_TOLERANT
        | Self::DROP_ELIGIBLE
        | Self::SPRAY
        | Self::WIRE_MASK
        | Self::LAST_OF_SHARE;

    /// A reliable frame of priority class `class` (0 the most urgent; above 7 counts as 7).
    pub fn class(class: u8) -> Self {
        Flags(u32::from(class.min(7)))
    }

    /// The same, loss-tolerant: the network never retransmits it.
    pub fn loss_tolerant(self) -> Self {
        Flags(self.0 | Self::LOSS_TOLERANT)
    }

    /// The same, marked drop-eligible (when `yes`).
    pub fn drop_eligible_if(self, yes: bool) -> Self {
        Flags(if yes {
            self.0 | Self::DROP_ELIGIBLE
        } else {
            self.0
        })
    }

    /// The same, sprayed over the paths per frame (when `yes`).
    pub fn spray_if(self, yes: bool) -> Self {
        Flags(if yes { self.0 | Self::SPRAY } else { self.0 })
    }

    /// The same, marked as the last packet of a loss-tolerant share: the receiver answers
    /// it as it answers a Probe (DLCP over TCP, where the packet travels reliably).
    pub fn last_of_share(self) -> Self {
        Flags(self.0 | Self::LAST_OF_SHARE)
    }

    /// Whether it is the last packet of a share, to be answered as a Probe.
    pub fn is_last_of_share(self) -> bool {
        self.0 & Self::LAST_OF_SHARE != 0
    }

    /// Its priority class, 0..=7.
    pub fn priority_class(self) -> u8 {
        (self.0 & Self::CLASS_MASK) as u8
    }

    /// Whether the network never retransmits it.
    pub fn is_loss_tolerant(self) -> bool {
        self.0 & Self::LOSS_TOLERANT != 0
    }

    /// Whether a priority queue past its threshold drops it first.
    pub fn is_drop_eligible(self) -> bool {
        self.0 & Self::DROP_ELIGIBLE != 0
    }

    /// Whether it may take any path.
    pub fn is_sprayed(self) -> bool {
        self.0 & Self::SPRAY != 0
    }

    /// The same, its values travelling as `float`.
    pub fn wire_float(self, float: WireFloat) -> Self {
        Flags(self.0 & !Self::WIRE_MASK | float.bits() << Self::WIRE_SHIFT)
    }

    /// The float its values travel as.
    pub fn float(self) -> WireFloat {
        WireFloat::from_bits((self.0 & Self::WIRE_MASK) >> Self::WIRE_SHIFT).unwrap_or_default()
    }

    /// The wire's 32 bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Flags from the wire's 32 bits, `None` if an unknown bit is set.
    pub fn from_bits(bits: u32) -> Option<Self> {
        let float = WireFloat::from_bits((bits & Self::WIRE_MASK) >> Self::WIRE_SHIFT);
        (bits & !Self::KNOWN == 0 && float.is_some()).then_some(Flags(bits))
    }
}

impl Header {
    /// A data header for `length` values of `key` starting at `offset`.
    pub fn data(kind: FrameKind, step: u64, key: u32, offset: u32, length: u32) -> Self {
        Self {
            kind,
            payload_len: length.saturating_mul(4),
            step,
            key,
            offset,
            length,
            priority: 0,
            sequence: 0,
            sender: 0,
            flags: Flags::default(),
        }
    }

    /// A header for a frame with an opaque payload of `payload_len` bytes (or none).
    pub fn control(kind: FrameKind, payload_len: u32) -> Self {
        Self {
            kind,
            payload_len,
            step: 0,
            key: 0,
            offset: 0,
            length: 0,
            priority: 0,
            sequence: 0,
            sender: 0,
            flags: Flags::default(),
        }
    }

    /// Serialises the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[4..8].copy_from_slice(&self.payload_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.step.to_le_bytes());
        b[16..20].copy_from_slice(&self.key.to_le_bytes());
        b[20..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.length.to_le_bytes());
        b[28..32].copy_from_slice(&self.priority.to_le_bytes());
        b[32..40].copy_from_slice(&self.sequence.to_le_bytes());
        b[40..44].copy_from_slice(&self.sender.to_le_bytes());
        b[44..48].copy_from_slice(&self.flags.bits().to_le_bytes());
        b
    }

    /// Parses and validates a header; `max_payload` bounds the announced payload.
    pub fn decode(b: &[u8; HEADER_LEN], max_payload: u32) -> Result<Self, WireError> {
        if b[0..2] != MAGIC {
            return Err(WireError::BadMagic([b[0], b[1]]));
        }
        if b[2] != VERSION {
            return Err(WireError::UnsupportedVersion {
                found: b[2],
                supported: VERSION,
            });
        }
        let kind = FrameKind::from_u8(b[3]).ok_or(WireError::UnknownKind(b[3]))?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let h = Header {
            kind,
            payload_len: u32_at(4),
            step: u64_at(8),
            key: u32_at(16),
            offset: u32_at(20),
            length: u32_at(24),
            priority: u32_at(28) as i32,
            sequence: u64_at(32),
            sender: u32_at(40),
            flags: Flags::from_bits(u32_at(44)).ok_or(WireError::ReservedFlags(u32_at(44)))?,
        };
        if h.payload_len > max_payload {
            return Err(WireError::TooLarge {
                len: h.payload_len,
                max: max_payload,
            });
        }
        if kind.carries_values()
            && h.flags.float().payload_bytes(h.length) != u64::from(h.payload_len)
        {
            return Err(WireError::LengthMismatch {
                length: h.length,
                payload_len: h.payload_len,
            });
        }
        let empty = matches!(
            kind,
            FrameKind::Heartbeat | FrameKind::Ack | FrameKind::Probe | FrameKind::Stop
        );
        if empty && h.payload_len != 0 {
            return Err(WireError::UnexpectedPayload(h.payload_len));
        }
        Ok(h)
    }

    /// The same frame with its values travelling as `float` (its payload's length to match).
    pub fn with_float(mut self, float: WireFloat) -> Self {
        self.flags = self.flags.wire_float(float);
        self.payload_len = u32::try_from(float.payload_bytes(self.length)).unwrap_or(u32::MAX);
        self
    }

    /// End of the carried range within the key (`offset + length`), without overflow.
    pub fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.length)
    }
}

/// A frame that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The first two bytes are not "SY": not a Syncopate peer, or a lost frame boundary.
    #[error("bad magic {0:02x?}: not a Syncopate frame (wrong port, or a corrupted stream)")]
    BadMagic([u8; 2]),
    /// The peer speaks another protocol version.
    #[error("protocol version {found} is not supported (this build speaks version {supported})")]
    UnsupportedVersion {
        /// Version in the frame.
        found: u8,
        /// Version of this build.
        supported: u8,
    },
    /// A frame kind this build does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Flag bits this build does not know.
    #[error("unknown flags {0:#x} set")]
    ReservedFlags(u32),
    /// The announced payload exceeds the limit.
    #[error("frame announces {len} payload bytes, above the {max}-byte limit")]
    TooLarge {
        /// Announced payload length.
        len: u32,
        /// Limit in force.
        max: u32,
    },
    /// A data frame whose element count and byte count disagree.
    #[error("data frame of {length} elements announces {payload_len} bytes")]
    LengthMismatch {
        /// Elements announced.
        length: u32,
        /// Bytes announced.
        payload_len: u32,
    },
    /// A frame kind that carries no payload announced one.
    #[error("{0}-byte payload on a frame kind that carries none")]
    UnexpectedPayload(u32),
}

/// Views `f32` values as their little-endian bytes (the wire's payload layout).
///
/// Syncopate runs on little-endian hosts only (x86-64, AArch64); see the compile-time check.
pub fn f32_bytes(values: &[f32]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// Views a mutable `f32` buffer as bytes so that a payload can be read straight into it.
pub fn f32_bytes_mut(values: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

#[cfg(target_endian = "big")]
compile_error!("Syncopate's wire format reads payloads in place and needs a little-endian host");

/// Appends a whole data frame (header and payload) to `out`.
pub fn encode_data_frame(out: &mut Vec<u8>, header: &Header, values: &[f32]) {
    debug_assert_eq!(header.length as usize, values.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(f32_bytes(values));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Header {
        Header {
            kind: FrameKind::Push,
            payload_len: 40,
            step: 7,
            key: 3,
            offset: 100,
            length: 10,
            priority: -3,
            sequence: 99,
            sender: 2,
            flags: Flags::class(5).loss_tolerant().spray_if(true),
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD), Ok(h));
    }

    #[test]
    fn mix_frames_are_data_frames() {
        let h = Header::data(FrameKind::Mix, 3, 1, 8, 4);
        assert!(FrameKind::Mix.is_data());
        assert_eq!(Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD), Ok(h));
        let mut short = h;
        short.payload_len = 12;
        assert!(matches!(
            Header::decode(&short.encode(), DEFAULT_MAX_PAYLOAD),
            Err(WireError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn rejects_bad_frames_with_clear_errors() {
        let mut b = sample().encode();
        b[2] = 9;
        let e = Header::decode(&b, DEFAULT_MAX_PAYLOAD).unwrap_err();
        assert!(e.to_string().contains("version 9"), "{e}");

        let mut b = sample().encode();
        b[0] = b'X';
        assert!(matches!(
            Header::decode(&b, DEFAULT_MAX_PAYLOAD),
            Err(WireError::BadMagic(_))
        ));

        let mut b = sample().encode();
        b[3] = 200;
        assert_eq!(
            Header::decode(&b, DEFAULT_MAX_PAYLOAD),
            Err(WireError::UnknownKind(200))
        );

        let mut h = sample();
        h.payload_len = 44;
        assert!(matches!(
            Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD),
            Err(WireError::LengthMismatch { .. })
        ));

        let mut h = sample();
        h.length = 1 << 30;
        h.payload_len = u32::MAX;
        assert!(matches!(
            Header::decode(&h.encode(), 1 << 20),
            Err(WireError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform16(any::<u8>())) {
            let mut b = [0u8; HEADER_LEN];
            b[..32].copy_from_slice(&bytes);
            b[32..].copy_from_slice(&tail);
            let _ = Header::decode(&b, DEFAULT_MAX_PAYLOAD);
            // And with a valid prefix, so the deeper checks are reached too.
            b[0..2].copy_from_slice(&MAGIC);
            b[2] = VERSION;
            b[3] = 1 + bytes[3] % 14;
            if let Ok(h) = Header::decode(&b, DEFAULT_MAX_PAYLOAD) {
                prop_assert!(h.payload_len <= DEFAULT_MAX_PAYLOAD);
                prop_assert_eq!(Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD), Ok(h));
            }
        }
    }
}
