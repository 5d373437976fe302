//! Frame integrity: on a link with frame MACs, every frame is followed by a [`TAG_LEN`]-byte
//! tag, keyed BLAKE3 under the key of the link's direction:
//!
//! ```text
//! frame on the wire   header (48 bytes) || payload (payload_len bytes) || tag (32 bytes)
//! tag                 BLAKE3-keyed(key, payload || header || number (u64, little-endian))
//! ```
//!
//! The payload comes first so that it starts BLAKE3's tree at offset 0: fed in pieces that
//! start at multiples of [`HASH_BLOCK`] it hashes at full SIMD width (pieces at other
//! offsets hash two to three times slower). The header and the number, of fixed sizes, end
//! the input, so it parses one way only.
//!
//! `number` is the frame's position among the frames sent in that direction of the link,
//! from 0, counting every frame (data, heartbeats, goodbyes, aborts). It is not sent: both
//! ends count, so a frame that is replayed, reordered or dropped on the way is checked
//! against another number than the one it was tagged with and fails, as an altered one does.
//! Each direction of each connection has its own key (the runtime derives them from the
//! job token and the handshake's nonces), so a frame copied from another connection, or
//! reflected back to its sender, fails too.
//!
//! Sans-IO, like the rest of the wire format: a [`FrameSealer`] tags the frames one end
//! sends; a [`FrameOpener`] checks the frames it receives, fed payload ranges as they land
//! (a payload is hashed where it was read to, without another copy), and says whether the
//! tag that followed matches.

use std::fmt;

use super::HEADER_LEN;

/// Bytes of the tag that follows every frame on a link with frame MACs.
pub const TAG_LEN: usize = 32;

/// A frame's tag.
pub type Tag = [u8; TAG_LEN];

/// Payload bytes hashed at a time by a receiver ([`FrameOpener::feed_upto`]): a multiple
/// of BLAKE3's 1 KiB chunk and of its widest SIMD batch (16 chunks).
pub const HASH_BLOCK: usize = 64 << 10;

/// The secret key of one direction of one link (32 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct FrameKey([u8; 32]);

impl FrameKey {
    /// A key from its 32 bytes (derived by the handshake).
    pub fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Another key derived from this one for the purpose `context` names (BLAKE3's key
    /// derivation: a hard-coded, globally unique string per purpose), unrelated to it for
    /// anyone who does not hold it.
    pub fn derive(&self, context: &str) -> FrameKey {
        FrameKey(blake3::derive_key(context, &self.0))
    }

    /// The key's 32 bytes (for the datagrams' GMAC).
    pub(super) fn secret(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FrameKey(<redacted>)")
    }
}

/// The two keys of one end of a link: one for the frames it sends, one for those it
/// receives (the peer holds the same two, the other way round).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkKeys {
    /// Tags the frames this end sends.
    pub send: FrameKey,
    /// Checks the frames this end receives.
    pub recv: FrameKey,
}

impl LinkKeys {
    /// The keys as the other end of the link holds them.
    pub fn reversed(&self) -> LinkKeys {
        LinkKeys {
            send: self.recv.clone(),
            recv: self.send.clone(),
        }
    }
}

/// A frame whose tag does not match: altered, replayed, reordered or dropped on the way,
/// or tagged under another key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "frame {frame} failed its integrity check (altered, replayed, reordered or dropped on \
     the way, or not tagged with this link's key)"
)]
pub struct IntegrityError {
    /// The frame's number in its direction of the link, from 0.
    pub frame: u64,
}

/// The sending side of one direction: numbers the frames and computes their tags.
#[derive(Clone)]
pub struct FrameSealer {
    hasher: blake3::Hasher,
    next: u64,
}

impl FrameSealer {
    /// A sealer whose first frame is number 0.
    pub fn new(key: &FrameKey) -> Self {
        Self {
            hasher: blake3::Hasher::new_keyed(&key.0),
            next: 0,
        }
    }

    /// Tags the next frame: `header`, and its payload held in `payload` (in order), and
    /// numbers the one after it.
    pub fn seal(&mut self, header: &[u8; HEADER_LEN], payload: &[&[u8]]) -> Tag {
        self.hasher.reset();
        for part in payload {
            self.hasher.update(part);
        }
        let tag = finalize(&mut self.hasher, header, self.next);
        // 2^64 frames would take centuries at a billion frames a second.
        self.next = self.next.wrapping_add(1);
        *tag.as_bytes()
    }

    /// Takes back the numbers of the last `frames` frames sealed, which were never sent (a
    /// batch given up when the connection is aborted): the next frame sealed takes the
    /// first of them.
    pub fn unseal(&mut self, frames: u64) {
        self.next = self.next.wrapping_sub(frames);
    }

    /// The number the next frame sealed will carry.
    pub fn next_frame(&self) -> u64 {
        self.next
    }
}

/// The end of a tag's input: `header`, then the frame's `number`.
fn finalize(hasher: &mut blake3::Hasher, header: &[u8; HEADER_LEN], number: u64) -> blake3::Hash {
    hasher.update(header);
    hasher.update(&number.to_le_bytes());
    hasher.finalize()
}

/// The receiving side of one direction: checks the frames in order, each one's payload fed
/// in as many ranges as it arrives in ([`FrameOpener::update`]), then its header and tag
/// ([`FrameOpener::finish`]).
#[derive(Clone)]
pub struct FrameOpener {
    hasher: blake3::Hasher,
    next: u64,
}

impl FrameOpener {
    /// An opener that expects frame number 0 first.
    pub fn new(key: &FrameKey) -> Self {
        Self {
            hasher: blake3::Hasher::new_keyed(&key.0),
            next: 0,
        }
    }

    /// The next bytes of the payload of the frame being received.
    pub fn update(&mut self, payload: &[u8]) {
        self.hasher.update(payload);
    }

    /// How far into a payload of `len` bytes, of which the first `landed` have arrived, to
    /// have fed [`FrameOpener::update`]: to the last multiple of [`HASH_BLOCK`], or to the
    /// end once all of it has landed (feeding block by block keeps the hash at full speed).
    pub fn feed_upto(landed: usize, len: usize) -> usize {
        if landed >= len {
            len
        } else {
            landed - landed % HASH_BLOCK
        }
    }

    /// Checks, in constant time, the tag that followed the frame whose header is `header`
    /// (its payload fed in whole). On a match the opener expects the next frame; returns
    /// the number of the frame checked.
    pub fn finish(&mut self, header: &[u8; HEADER_LEN], tag: &Tag) -> Result<u64, IntegrityError> {
        let frame = self.next;
        let ok = finalize(&mut self.hasher, header, frame) == blake3::Hash::from_bytes(*tag);
        self.hasher.reset();
        if !ok {
            return Err(IntegrityError { frame });
        }
        self.next = self.next.wrapping_add(1);
        Ok(frame)
    }

    /// The number of the frame being received.
    pub fn next_frame(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FrameKind, Header};

    type Frame = ([u8; HEADER_LEN], Vec<u8>);

    fn keys() -> LinkKeys {
        LinkKeys {
            send: FrameKey::new([1; 32]),
            recv: FrameKey::new([2; 32]),
        }
    }

    /// Header and payload of a small data frame.
    fn frame(step: u64, value: f32) -> Frame {
        let header = Header::data(FrameKind::Push, step, 0, 0, 3).encode();
        let payload = [value; 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        (header, payload)
    }

    /// Feeds a frame's payload to `opener` in uneven pieces, as reads deliver them, then
    /// checks its tag.
    fn open(
        opener: &mut FrameOpener,
        (header, payload): &Frame,
        tag: &Tag,
    ) -> Result<u64, IntegrityError> {
        for piece in payload.chunks(5) {
            opener.update(piece);
        }
        opener.finish(header, tag)
    }

    /// Seals `frames` on one end and opens `received` (indices into the sealed frames,
    /// each possibly altered by `tamper`, which sees header and payload as one run of
    /// bytes) on the other; returns the first failure.
    fn deliver(
        frames: &[Frame],
        received: &[usize],
        tamper: impl Fn(usize, &mut [u8]),
    ) -> Result<(), IntegrityError> {
        let (mine, theirs) = (keys(), keys().reversed());
        let mut sealer = FrameSealer::new(&mine.send);
        let tags: Vec<Tag> = frames.iter().map(|(h, p)| sealer.seal(h, &[p])).collect();
        let mut opener = FrameOpener::new(&theirs.recv);
        for (n, &i) in received.iter().enumerate() {
            let (h, p) = &frames[i];
            let mut bytes = [&h[..], p].concat();
            tamper(n, &mut bytes);
            let (h, p) = bytes.split_at(HEADER_LEN);
            let altered = (h.try_into().unwrap(), p.to_vec());
            assert_eq!(open(&mut opener, &altered, &tags[i])?, n as u64);
        }
        Ok(())
    }

    fn three() -> Vec<Frame> {
        vec![frame(0, 1.0), frame(0, 2.0), frame(1, 3.0)]
    }

    #[test]
    fn frames_in_order_pass() {
        assert_eq!(deliver(&three(), &[0, 1, 2], |_, _| {}), Ok(()));
    }

    #[test]
    fn a_tampered_payload_byte_fails() {
        let e = deliver(&three(), &[0, 1, 2], |n, b| {
            if n == 1 {
                b[50] ^= 0x01;
            }
        });
        assert_eq!(e, Err(IntegrityError { frame: 1 }));
    }

    #[test]
    fn a_tampered_header_fails() {
        // The step, a field the decoder would accept either way.
        let e = deliver(&three(), &[0, 1, 2], |n, b| {
            if n == 2 {
                b[8] = 9;
            }
        });
        assert_eq!(e, Err(IntegrityError { frame: 2 }));
    }

    #[test]
    fn replayed_reordered_and_dropped_frames_fail() {
        let e = deliver(&three(), &[0, 0], |_, _| {});
        assert_eq!(e, Err(IntegrityError { frame: 1 }), "replayed");
        let e = deliver(&three(), &[0, 2, 1], |_, _| {});
        assert_eq!(e, Err(IntegrityError { frame: 1 }), "reordered");
        let e = deliver(&three(), &[1, 2], |_, _| {});
        assert_eq!(e, Err(IntegrityError { frame: 0 }), "dropped");
    }

    #[test]
    fn the_other_direction_and_other_keys_fail() {
        let f = frame(0, 1.0);
        let tag = FrameSealer::new(&keys().send).seal(&f.0, &[&f.1]);
        // Reflected back to its sender, which checks with its receiving key.
        let reflected = open(&mut FrameOpener::new(&keys().recv), &f, &tag);
        assert_eq!(reflected, Err(IntegrityError { frame: 0 }));
        let other = open(&mut FrameOpener::new(&FrameKey::new([3; 32])), &f, &tag);
        assert!(other.is_err());
    }

    #[test]
    fn a_tag_cut_short_fails() {
        // The stream's next bytes take the missing tag bytes' place.
        let f = frame(0, 1.0);
        let tag = FrameSealer::new(&keys().send).seal(&f.0, &[&f.1]);
        let mut cut = tag;
        cut[TAG_LEN / 2..].copy_from_slice(&f.0[..TAG_LEN / 2]);
        let opened = open(&mut FrameOpener::new(&keys().reversed().recv), &f, &cut);
        assert_eq!(opened, Err(IntegrityError { frame: 0 }));
    }

    #[test]
    fn bytes_moved_between_header_and_payload_fail() {
        // The same run of bytes cut elsewhere: the header's fixed size pins the cut.
        let f = frame(0, 1.0);
        let tag = FrameSealer::new(&keys().send).seal(&f.0, &[&f.1]);
        let mut header = f.0;
        header.rotate_left(1);
        let moved = (header, [&f.0[..1], &f.1[..]].concat());
        let opened = open(&mut FrameOpener::new(&keys().reversed().recv), &moved, &tag);
        assert!(opened.is_err());
    }

    #[test]
    fn payload_parts_and_pieces_do_not_change_the_tag() {
        let header = Header::data(FrameKind::Push, 0, 0, 0, 1 << 16).encode();
        let payload: Vec<u8> = (0..1 << 18).map(|i| (i % 251) as u8).collect();
        let whole = FrameSealer::new(&keys().send).seal(&header, &[&payload]);
        let (a, b) = payload.split_at(12_345);
        assert_eq!(FrameSealer::new(&keys().send).seal(&header, &[a, b]), whole);
        // Fed block by block, as the runtime does.
        let mut opener = FrameOpener::new(&keys().reversed().recv);
        let mut fed = 0;
        for landed in (0..payload.len()).step_by(10_000).chain([payload.len()]) {
            let upto = FrameOpener::feed_upto(landed, payload.len());
            opener.update(&payload[fed..upto]);
            fed = upto;
        }
        assert_eq!(opener.finish(&header, &whole), Ok(0));
    }

    #[test]
    fn feed_upto_stops_at_blocks_until_the_end() {
        let len = 3 * HASH_BLOCK + 5;
        assert_eq!(FrameOpener::feed_upto(0, len), 0);
        assert_eq!(FrameOpener::feed_upto(HASH_BLOCK - 1, len), 0);
        assert_eq!(
            FrameOpener::feed_upto(2 * HASH_BLOCK + 7, len),
            2 * HASH_BLOCK
        );
        assert_eq!(FrameOpener::feed_upto(len, len), len);
        assert_eq!(FrameOpener::feed_upto(0, 0), 0);
    }

    #[test]
    fn unsealed_numbers_are_reused() {
        let f = frame(0, 1.0);
        let mut sealer = FrameSealer::new(&keys().send);
        let first = sealer.seal(&f.0, &[&f.1]);
        sealer.seal(&f.0, &[]);
        sealer.unseal(1);
        assert_eq!(sealer.next_frame(), 1);
        let mut opener = FrameOpener::new(&keys().reversed().recv);
        assert_eq!(open(&mut opener, &f, &first), Ok(0));
        let tag = sealer.seal(&f.0, &[&f.1]);
        assert_eq!(open(&mut opener, &f, &tag), Ok(1));
        assert_eq!(opener.next_frame(), 2);
    }

    #[test]
    fn keys_do_not_show_in_debug() {
        assert_eq!(
            format!("{:?}", FrameKey::new([7; 32])),
            "FrameKey(<redacted>)"
        );
    }
}
