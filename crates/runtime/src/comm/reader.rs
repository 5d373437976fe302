//! Frames coming in, parsed from the bytes as they land. Reads go through a staging buffer,
//! many small frames a read; a large payload is read straight into the slot the endpoint
//! designates. With frame MACs a frame received is hashed as its bytes land and acted on
//! only once the tag that follows it checks: a frame that fails ends the loop with
//! [`CommError::Integrity`]; its payload may already sit in the endpoint's slot, but the
//! endpoint is never told it arrived. A data frame is not read past its header until the
//! emulated ingress port releases it ([`Gate`]).
//!
//! Only `read_link` touches the socket: [`destination`] says where the next bytes of a
//! frame go and [`advance`] moves the frame on once they are there, wherever they came from.

use std::io::{self, Read};
use std::time::Instant;

use syncopate_core::strategy::{Endpoint, ProtocolError, Rank};
use syncopate_core::wire::mac::{FrameOpener, Tag, TAG_LEN};
use syncopate_core::wire::{f32_bytes, f32_bytes_mut, FrameKind, Header, WireError, HEADER_LEN};

use super::control::handle_control;
use super::emulation::{ingress_meta, ingress_open, Gate};
use super::{integrity, lost, ns_since, protocol, CommError, CommLoop, Hooks, LinkState};

/// Where a link's reader stands in the frame being read.
pub(super) enum ReadState {
    /// In its header (`filled` bytes of it so far).
    Header {
        buf: [u8; HEADER_LEN],
        filled: usize,
    },
    /// In a data frame's payload, which lands in the endpoint's slot (`done` bytes so far;
    /// the header came at `arrived`).
    Data {
        header: Header,
        done: usize,
        arrived: Instant,
        /// Whether the payload may be read yet (the emulated ingress port's say).
        gate: Gate,
        /// Bytes of the payload fed to the link's frame MAC so far.
        hashed: usize,
    },
    /// In a control frame's payload, which lands in `buf`.
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
pub(super) enum Received {
    /// A heartbeat, or a data frame the ingress port lost (read, never handed over).
    Heartbeat(Header),
    /// A data frame, its payload in the endpoint's slot; its header came at `arrived`.
    Data { header: Header, arrived: Instant },
    /// A control frame and its payload.
    Control { header: Header, payload: Vec<u8> },
}

impl ReadState {
    /// The ingress gate and the header of the data frame being read (`None` outside a
    /// data frame's payload).
    pub(super) fn gate(&mut self) -> Option<(&mut Gate, &Header)> {
        match self {
            ReadState::Data { header, gate, .. } => Some((gate, header)),
            _ => None,
        }
    }

    /// Bytes of a data frame's payload still to come (0 outside a payload).
    pub(super) fn payload_left(&self) -> usize {
        match self {
            ReadState::Data { header, done, .. } => {
                (header.payload_len as usize).saturating_sub(*done)
            }
            _ => 0,
        }
    }
}

impl Received {
    /// The frame's header.
    fn header(&self) -> &Header {
        match self {
            Received::Heartbeat(header)
            | Received::Data { header, .. }
            | Received::Control { header, .. } => header,
        }
    }
}

/// Bytes a link reads from its socket at a time, ahead of the frame being parsed.
pub(super) const STAGING_BYTES: usize = 64 << 10;
/// A payload with at least this many bytes still to come is read straight into its slot
/// (no copy); shorter ones go through the staging buffer, many frames to a read.
const DIRECT_READ_BYTES: usize = 32 << 10;
/// Largest payload of a control frame (an Abort's reason is at most 4 KiB): larger ones are
/// refused at their header, before anything is allocated.
const MAX_CONTROL_PAYLOAD: u32 = 64 << 10;

impl CommLoop {
    /// Reads every complete frame available on link `i`. Reads go into the link's staging
    /// buffer (many small frames a system call), and the frames are taken out of it; a
    /// payload with at least [`DIRECT_READ_BYTES`] still to come is read straight into the
    /// endpoint's slot instead.
    pub(super) fn read_link<E: Endpoint + ?Sized>(
        &mut self,
        i: usize,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        // Datagrams first: a Probe in these bytes must find the packets sent before it
        // already read, whichever readiness event came first.
        if self.datagram.is_some() {
            self.read_datagrams(None, endpoint)?;
        }
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
            let tagged = link.mac.is_some();
            if let Some((gate, header)) = link.read.gate() {
                let ingress = self.ingress.as_mut();
                let meta =
                    || ingress_meta(header, peer, tagged, endpoint.accepts_loss(peer, header));
                if !ingress_open(gate, meta, ingress, i, now_ns) {
                    return Ok(());
                }
            }
            if parse_staged(link, endpoint, hooks, max_payload)? {
                continue;
            }
            let direct = link.read.payload_left() >= DIRECT_READ_BYTES;
            let read = if direct {
                let dest = destination(&mut link.read, &mut link.discard, endpoint, peer, &*hooks)?;
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
}

/// Moves the bytes staged on `link` (read, not yet parsed) on to where the frame being read
/// wants them, as far as that part of the frame goes; returns whether there were any.
fn parse_staged<E: Endpoint + ?Sized>(
    link: &mut LinkState,
    endpoint: &mut E,
    hooks: &mut dyn Hooks<E>,
    max_payload: u32,
) -> Result<bool, CommError> {
    let staged = link.staging.get(link.staged.clone()).unwrap_or_default();
    if staged.is_empty() {
        return Ok(false);
    }
    let dest = destination(
        &mut link.read,
        &mut link.discard,
        endpoint,
        link.peer,
        &*hooks,
    )?;
    let n = dest.len().min(staged.len());
    dest[..n].copy_from_slice(&staged[..n]);
    link.staged.start += n;
    advance(link, n, endpoint, hooks, max_payload)?;
    Ok(true)
}

/// Where the next bytes of the frame being read go: the rest of its header, of the slot the
/// endpoint designates for its payload (which must hold exactly the payload; `discard`
/// instead for a frame the ingress port lost), or of a control frame's payload.
pub(super) fn destination<'a, E: Endpoint + ?Sized>(
    read: &'a mut ReadState,
    discard: &'a mut [u8],
    endpoint: &'a mut E,
    peer: Rank,
    hooks: &dyn Hooks<E>,
) -> Result<&'a mut [u8], CommError> {
    Ok(match read {
        ReadState::Header { buf, filled } => buf.get_mut(*filled..).unwrap_or_default(),
        ReadState::Data {
            gate: Gate::Discard,
            done,
            ..
        } => discard.get_mut(*done..).unwrap_or_default(),
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

/// What the bytes that landed made of the part of a frame being read.
enum Landed {
    /// The part is not whole yet.
    More,
    /// The part is whole; the link reads this next.
    Next(ReadState),
    /// The frame is read whole (its tag, on a link with frame MACs, still to come).
    Whole(Received),
    /// The frame's tag is read and checks: the frame is to be acted on.
    Checked(Received),
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
    let landed = match link.read {
        ReadState::Header { .. } => header_landed(link, n, &*hooks, max_payload)?,
        ReadState::Data { .. } => payload_landed(link, n, endpoint, &*hooks)?,
        ReadState::Bytes { .. } => control_landed(link, n),
        ReadState::Tag { .. } => tag_landed(link, n, &*hooks)?,
    };
    link.read = match landed {
        Landed::More => return Ok(()),
        Landed::Next(next) => next,
        Landed::Whole(frame) => received(link, frame, endpoint, hooks)?,
        Landed::Checked(frame) => {
            act(link, frame, endpoint, hooks)?;
            fresh_header()
        }
    };
    Ok(())
}

/// [`advance`] in a header: once it is whole, decodes it and says what it makes.
fn header_landed<E: ?Sized>(
    link: &mut LinkState,
    n: usize,
    hooks: &dyn Hooks<E>,
    max_payload: u32,
) -> Result<Landed, CommError> {
    let ReadState::Header { buf, filled } = &mut link.read else {
        return Ok(Landed::More);
    };
    *filled += n;
    if *filled < HEADER_LEN {
        return Ok(Landed::More);
    }
    let header = Header::decode(buf, max_payload)
        .map_err(|e: WireError| protocol(hooks, link.peer, e.into()))?;
    after_header(header, link.peer, hooks)
}

/// What a frame from `peer` makes once its `header` is read: a payload to read (into the
/// endpoint's slot for data, into a buffer for control), or a frame without one, whole.
fn after_header<E: ?Sized>(
    header: Header,
    peer: Rank,
    hooks: &dyn Hooks<E>,
) -> Result<Landed, CommError> {
    Ok(match header.kind {
        k if k.is_data() && header.payload_len > 0 => Landed::Next(ReadState::Data {
            header,
            done: 0,
            arrived: Instant::now(),
            gate: Gate::New,
            hashed: 0,
        }),
        FrameKind::Heartbeat => Landed::Whole(Received::Heartbeat(header)),
        k if k.is_data() => Landed::Whole(Received::Data {
            header,
            arrived: Instant::now(),
        }),
        _ if header.payload_len == 0 => Landed::Whole(Received::Control {
            header,
            payload: Vec::new(),
        }),
        _ if header.payload_len > MAX_CONTROL_PAYLOAD => {
            let reason = format!(
                "{:?} frame announcing {} bytes (at most {MAX_CONTROL_PAYLOAD})",
                header.kind, header.payload_len
            );
            let error = ProtocolError::Unexpected { from: peer, reason };
            return Err(protocol(hooks, peer, error));
        }
        _ => Landed::Next(ReadState::Bytes {
            header,
            buf: vec![0; header.payload_len as usize],
            filled: 0,
        }),
    })
}

/// [`advance`] in a data frame's payload: hashes what landed (frame MACs); once the payload
/// is whole, so is the frame.
fn payload_landed<E: Endpoint + ?Sized>(
    link: &mut LinkState,
    n: usize,
    endpoint: &mut E,
    hooks: &dyn Hooks<E>,
) -> Result<Landed, CommError> {
    let peer = link.peer;
    let ReadState::Data {
        header,
        done,
        arrived,
        hashed,
        gate,
    } = &mut link.read
    else {
        return Ok(Landed::More);
    };
    *done += n;
    if let Some(mac) = &mut link.mac {
        let landed = *done;
        if *gate == Gate::Discard {
            // A lost frame's payload is in the discard buffer, whole once it has landed.
            if landed == header.payload_len as usize {
                mac.open
                    .update(link.discard.get(*hashed..).unwrap_or_default());
                *hashed = landed;
            }
        } else {
            feed_payload(&mut mac.open, endpoint, peer, header, hashed, landed, hooks)?;
        }
    }
    if *done < header.payload_len as usize {
        return Ok(Landed::More);
    }
    // A frame the ingress port lost is read (and its tag checked) but never handed to the
    // endpoint.
    Ok(Landed::Whole(if *gate == Gate::Discard {
        Received::Heartbeat(*header)
    } else {
        Received::Data {
            header: *header,
            arrived: *arrived,
        }
    }))
}

/// [`advance`] in a control frame's payload: once it is whole, so is the frame.
fn control_landed(link: &mut LinkState, n: usize) -> Landed {
    let ReadState::Bytes {
        header,
        buf,
        filled,
    } = &mut link.read
    else {
        return Landed::More;
    };
    *filled += n;
    if *filled < buf.len() {
        return Landed::More;
    }
    if let Some(mac) = &mut link.mac {
        mac.open.update(buf);
    }
    Landed::Whole(Received::Control {
        header: *header,
        payload: std::mem::take(buf),
    })
}

/// [`advance`] in a frame's MAC tag: once it is whole, checks it against the frame it
/// follows, which is then to be acted on.
fn tag_landed<E: ?Sized>(
    link: &mut LinkState,
    n: usize,
    hooks: &dyn Hooks<E>,
) -> Result<Landed, CommError> {
    let ReadState::Tag { buf, filled, frame } = &mut link.read else {
        return Ok(Landed::More);
    };
    *filled += n;
    if *filled < TAG_LEN {
        return Ok(Landed::More);
    }
    let (tag, header) = (*buf, *frame.header());
    let frame = std::mem::replace(frame, Received::Heartbeat(header));
    if let Some(mac) = &mut link.mac {
        (mac.open.finish(&header.encode(), &tag)).map_err(|e| integrity(hooks, link.peer, e))?;
    }
    Ok(Landed::Checked(frame))
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

pub(super) fn fresh_header() -> ReadState {
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
