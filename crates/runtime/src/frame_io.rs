//! Blocking frame I/O for handshakes and rendezvous.
//!
//! These helpers read and write whole [`Header`]-framed messages on any `Read`/`Write`
//! (in practice a [`std::net::TcpStream`] with timeouts set). The data plane has its own,
//! non-blocking path; this module is for the few control messages exchanged before it
//! starts. Nothing read from the peer is trusted: payload lengths are bounded before any
//! allocation and every failure is an error, never a panic. Before a peer has
//! authenticated, far tighter bounds apply ([`recv_unauthenticated`]): at most
//! [`HANDSHAKE_MAX_PAYLOAD`] bytes of a frame are read, and at most
//! [`UNAUTHENTICATED_TEXT_MAX`] bytes of what it says are kept.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;
use syncopate_core::wire::{FrameKind, Header, WireError, HEADER_LEN};

/// Upper bound on the payload of a control frame (1 MiB).
pub const CONTROL_MAX_PAYLOAD: u32 = 1 << 20;

/// Longest abort reason sent (and kept from an authenticated peer); longer ones are cut.
const MAX_ABORT_REASON: usize = 4096;

/// Largest frame payload read from a peer that has not authenticated yet (16 KiB): every
/// handshake message is a few hundred bytes, and a frame announcing more is refused from its
/// header, before any of its payload is read.
pub const HANDSHAKE_MAX_PAYLOAD: u32 = 16 << 10;

/// Longest text kept of what a peer that has not authenticated says (an Abort's reason):
/// anything longer is cut, so no connection can make an error message grow.
pub const UNAUTHENTICATED_TEXT_MAX: usize = 256;

/// Why a frame could not be read or a control message understood.
#[derive(Debug, thiserror::Error)]
pub enum FrameIoError {
    /// The peer closed the connection (end of stream, possibly within a frame).
    #[error("connection closed by the peer")]
    Closed,
    /// The peer sent nothing within the read timeout.
    #[error("timed out waiting for the peer")]
    TimedOut,
    /// The bytes received are not a valid frame header.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    /// Any other I/O failure.
    #[error("I/O error: {0}")]
    Io(#[source] io::Error),
    /// The peer sent an Abort frame instead of the expected message.
    #[error("the peer aborted: {0}")]
    PeerAborted(String),
    /// A frame of another kind arrived where a control message was expected.
    #[error("expected a control frame, got a {0:?} frame")]
    UnexpectedKind(FrameKind),
    /// The control payload is not the JSON message expected (or ours could not be encoded).
    #[error("malformed control message: {0}")]
    Json(#[from] serde_json::Error),
    /// A control message to send exceeds [`CONTROL_MAX_PAYLOAD`].
    #[error("control message of {len} bytes exceeds the {max}-byte limit")]
    ControlTooLarge {
        /// Encoded size of the message.
        len: usize,
        /// Limit in force.
        max: u32,
    },
}

impl From<io::Error> for FrameIoError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => FrameIoError::Closed,
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => FrameIoError::TimedOut,
            _ => FrameIoError::Io(e),
        }
    }
}

/// Writes `header` (with its `payload_len` set to `payload.len()`) followed by `payload`.
pub fn write_frame(stream: &mut impl Write, header: &Header, payload: &[u8]) -> io::Result<()> {
    let payload_len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame payload exceeds 4 GiB"))?;
    let header = Header {
        payload_len,
        ..*header
    };
    let mut buf = Vec::with_capacity(HEADER_LEN + payload.len());
    buf.extend_from_slice(&header.encode());
    buf.extend_from_slice(payload);
    stream.write_all(&buf)?;
    stream.flush()
}

/// Reads one frame whose payload is at most `max_payload` bytes.
pub fn read_frame(
    stream: &mut impl Read,
    max_payload: u32,
) -> Result<(Header, Vec<u8>), FrameIoError> {
    let mut raw = [0u8; HEADER_LEN];
    stream.read_exact(&mut raw)?;
    let header = Header::decode(&raw, max_payload)?;
    let len = header.payload_len as usize;
    // Grow as bytes arrive rather than trusting the announced length with an allocation.
    let mut payload = Vec::with_capacity(len.min(64 << 10));
    stream.take(len as u64).read_to_end(&mut payload)?;
    if payload.len() != len {
        return Err(FrameIoError::Closed);
    }
    Ok((header, payload))
}

/// Sends `message` as JSON in a Control frame.
pub fn send_control<T: Serialize>(
    stream: &mut impl Write,
    message: &T,
) -> Result<(), FrameIoError> {
    let json = serde_json::to_vec(message)?;
    if json.len() > CONTROL_MAX_PAYLOAD as usize {
        return Err(FrameIoError::ControlTooLarge {
            len: json.len(),
            max: CONTROL_MAX_PAYLOAD,
        });
    }
    write_frame(stream, &Header::control(FrameKind::Control, 0), &json)?;
    Ok(())
}

/// Receives a JSON control message from an authenticated peer; an Abort frame becomes
/// [`FrameIoError::PeerAborted`] with its reason (printable, at most 4 KiB).
pub fn recv_control<T: DeserializeOwned>(stream: &mut impl Read) -> Result<T, FrameIoError> {
    recv_control_within(stream, CONTROL_MAX_PAYLOAD, MAX_ABORT_REASON)
}

/// Receives a JSON control message from a peer that has not authenticated yet: a frame
/// announcing more than [`HANDSHAKE_MAX_PAYLOAD`] bytes is refused unread, and an Abort's
/// reason is kept printable and at most [`UNAUTHENTICATED_TEXT_MAX`] bytes long.
pub fn recv_unauthenticated<T: DeserializeOwned>(
    stream: &mut impl Read,
) -> Result<T, FrameIoError> {
    recv_control_within(stream, HANDSHAKE_MAX_PAYLOAD, UNAUTHENTICATED_TEXT_MAX)
}

fn recv_control_within<T: DeserializeOwned>(
    stream: &mut impl Read,
    max_payload: u32,
    max_reason: usize,
) -> Result<T, FrameIoError> {
    let (header, payload) = read_frame(stream, max_payload)?;
    match header.kind {
        FrameKind::Control => Ok(serde_json::from_slice(&payload)?),
        FrameKind::Abort => Err(FrameIoError::PeerAborted(printable_prefix(
            &payload, max_reason,
        ))),
        other => Err(FrameIoError::UnexpectedKind(other)),
    }
}

/// What a peer sent, made fit for a log or an error message: invalid UTF-8 and control
/// characters (line breaks, terminal escapes) become U+FFFD, and text longer than `max`
/// bytes is cut on a character boundary and says how long it was.
pub fn printable_prefix(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let kept = truncate_at_char(&text, max);
    let mut out: String = kept
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect();
    if kept.len() < text.len() {
        out.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    out
}

/// Tells the peer why we are giving up (best effort: failures are only logged).
pub fn send_abort(stream: &mut impl Write, reason: &str) {
    let reason = truncate_at_char(reason, MAX_ABORT_REASON);
    let header = Header::control(FrameKind::Abort, 0);
    if let Err(e) = write_frame(stream, &header, reason.as_bytes()) {
        tracing::debug!("could not send abort ({reason}): {e}");
    }
}

fn truncate_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let end = (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Msg {
        a: u32,
        b: String,
    }

    #[test]
    fn control_round_trip() {
        let mut buf = Vec::new();
        let msg = Msg {
            a: 7,
            b: "hi".into(),
        };
        send_control(&mut buf, &msg).unwrap();
        let got: Msg = recv_control(&mut Cursor::new(buf)).unwrap();
        assert_eq!(got, msg);
    }

    #[test]
    fn write_frame_sets_payload_len() {
        let mut buf = Vec::new();
        let h = Header::control(FrameKind::Goodbye, 999);
        write_frame(&mut buf, &h, b"abc").unwrap();
        let (h, p) = read_frame(&mut Cursor::new(buf), 10).unwrap();
        assert_eq!(
            (h.kind, h.payload_len, p.as_slice()),
            (FrameKind::Goodbye, 3, &b"abc"[..])
        );
    }

    #[test]
    fn abort_becomes_peer_aborted() {
        let mut buf = Vec::new();
        send_abort(&mut buf, "strategy ps differs from ours allreduce");
        let e = recv_control::<Msg>(&mut Cursor::new(buf)).unwrap_err();
        assert!(
            matches!(&e, FrameIoError::PeerAborted(r) if r.contains("strategy ps")),
            "{e}"
        );
    }

    #[test]
    fn other_kinds_are_named() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Header::control(FrameKind::Goodbye, 0), &[]).unwrap();
        let e = recv_control::<Msg>(&mut Cursor::new(buf)).unwrap_err();
        assert!(e.to_string().contains("Goodbye"), "{e}");
    }

    #[test]
    fn eof_truncation_garbage_and_oversize_are_errors() {
        let e = read_frame(&mut Cursor::new(Vec::new()), 10).unwrap_err();
        assert!(e.to_string().contains("connection closed"), "{e}");

        let mut buf = Vec::new();
        write_frame(&mut buf, &Header::control(FrameKind::Control, 0), b"{}{}").unwrap();
        buf.truncate(buf.len() - 1);
        assert!(matches!(
            read_frame(&mut Cursor::new(buf), 10),
            Err(FrameIoError::Closed)
        ));

        let garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789012345678901".to_vec();
        assert!(matches!(
            read_frame(&mut Cursor::new(garbage), 10),
            Err(FrameIoError::Wire(WireError::BadMagic(_)))
        ));

        let mut buf = Vec::new();
        write_frame(
            &mut buf,
            &Header::control(FrameKind::Control, 0),
            &[b' '; 11],
        )
        .unwrap();
        assert!(matches!(
            read_frame(&mut Cursor::new(buf), 10),
            Err(FrameIoError::Wire(WireError::TooLarge { .. }))
        ));
    }

    #[test]
    fn bad_json_is_an_error() {
        let mut buf = Vec::new();
        write_frame(
            &mut buf,
            &Header::control(FrameKind::Control, 0),
            b"{not json",
        )
        .unwrap();
        assert!(matches!(
            recv_control::<Msg>(&mut Cursor::new(buf)),
            Err(FrameIoError::Json(_))
        ));
    }

    #[test]
    fn unauthenticated_aborts_are_cut_short_and_printable() {
        let mut buf = Vec::new();
        let reason = format!("\x1b[2Jfake\nline{}", "x".repeat(10_000));
        write_frame(
            &mut buf,
            &Header::control(FrameKind::Abort, 0),
            reason.as_bytes(),
        )
        .unwrap();
        let Err(FrameIoError::PeerAborted(kept)) =
            recv_unauthenticated::<Msg>(&mut Cursor::new(buf))
        else {
            panic!("an Abort must become PeerAborted");
        };
        assert!(
            kept.len() <= UNAUTHENTICATED_TEXT_MAX + 32,
            "{} bytes kept",
            kept.len()
        );
        assert!(
            kept.ends_with(&format!("({} bytes)", reason.len())),
            "{kept}"
        );
        assert!(!kept.chars().any(char::is_control), "{kept:?}");
        assert!(kept.contains("fake\u{fffd}line"), "{kept:?}");
    }

    #[test]
    fn oversized_unauthenticated_frames_are_refused_unread() {
        // The header alone announces 1 MiB: refused without waiting for the payload.
        let header = Header::control(FrameKind::Abort, CONTROL_MAX_PAYLOAD).encode();
        let e = recv_unauthenticated::<Msg>(&mut Cursor::new(header.to_vec())).unwrap_err();
        assert!(
            matches!(e, FrameIoError::Wire(WireError::TooLarge { .. })),
            "{e}"
        );
        // An authenticated peer may send as much.
        let mut buf = Vec::new();
        let reason = "y".repeat(CONTROL_MAX_PAYLOAD as usize);
        write_frame(
            &mut buf,
            &Header::control(FrameKind::Abort, 0),
            reason.as_bytes(),
        )
        .unwrap();
        let e = recv_control::<Msg>(&mut Cursor::new(buf)).unwrap_err();
        assert!(matches!(&e, FrameIoError::PeerAborted(r) if r.len() < MAX_ABORT_REASON + 32));
    }

    #[test]
    fn long_reasons_are_truncated_on_a_char_boundary() {
        let s = "é".repeat(MAX_ABORT_REASON);
        let t = truncate_at_char(&s, MAX_ABORT_REASON + 1);
        assert_eq!(t.len(), MAX_ABORT_REASON);
    }
}
