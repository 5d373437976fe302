//! Frames on their way out. A frame the emulated link has released (or a control frame)
//! joins the batch being written, and small frames are cheap: up to 32 due frames
//! (256 KiB) go out in one vectored write, lent payloads written straight from the
//! endpoint's buffers. With [`CommOptions::frame_mac`](super::CommOptions::frame_mac)
//! every frame carries a MAC tag ([`syncopate_core::wire::mac`]) under the keys of its
//! link's handshake, computed when the frame joins the batch (so that the frames of a link
//! are numbered in the order they leave).
//!
//! Only [`write_batch`] and [`write_all_until`] touch the socket, and they take any
//! writer: the frames themselves are slices, whatever carries them.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::time::{Duration, Instant};

use syncopate_core::strategy::Endpoint;
use syncopate_core::wire::mac::{FrameSealer, Tag, TAG_LEN};
use syncopate_core::wire::{f32_bytes, Header, HEADER_LEN};

use super::{lost, CommError, CommLoop, Hooks, LinkState};

/// A frame on its way out.
pub(super) struct OutFrame {
    /// The whole frame, or (lent) its header only.
    pub(super) bytes: Vec<u8>,
    /// A lent frame's header: its payload is [`Endpoint::lent_payload`], written right after
    /// `bytes`, and the endpoint is told with [`Endpoint::handle_sent`] once it is.
    pub(super) lent: Option<Header>,
    /// When a data frame was handed to the network interface (`None`: a control frame).
    pub(super) queued: Option<Instant>,
    /// The frame's MAC tag, written last, on a link with frame MACs: reserved when the
    /// frame is made (so that its length on the wire is known from the start), computed
    /// when it joins the batch being written ([`LinkState::take_due`]).
    tag: Option<Tag>,
}

impl OutFrame {
    /// A frame with a tag to come if `tagged`.
    pub(super) fn new(
        bytes: Vec<u8>,
        lent: Option<Header>,
        queued: Option<Instant>,
        tagged: bool,
    ) -> Self {
        Self {
            bytes,
            lent,
            queued,
            tag: tagged.then_some([0; TAG_LEN]),
        }
    }

    /// Bytes on the wire: header, payload and tag.
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
            + self.lent.map_or(0, |h| h.payload_len as usize)
            + self.tag.map_or(0, |t| t.len())
    }

    /// The frame's bytes in the order they are written: `bytes`, the lent payload (if
    /// any) and the tag (if any).
    pub(super) fn parts<'a, E: Endpoint + ?Sized>(&'a self, endpoint: &'a E) -> [&'a [u8]; 3] {
        let payload = self
            .lent
            .map_or(&[][..], |h| f32_bytes(endpoint.lent_payload(&h)));
        let tag = self.tag.as_ref().map_or(&[][..], |t| &t[..]);
        [&self.bytes, payload, tag]
    }

    /// Computes the frame's tag (if it has one) as the next frame of `sealer`.
    pub(super) fn seal<E: Endpoint + ?Sized>(
        &mut self,
        sealer: Option<&mut FrameSealer>,
        endpoint: &E,
    ) {
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
pub(super) fn unwritten(parts: [&[u8]; 3], mut skip: usize) -> impl Iterator<Item = &[u8]> {
    parts.into_iter().filter_map(move |part| {
        let rest = part.get(skip.min(part.len())..).unwrap_or_default();
        skip = skip.saturating_sub(part.len());
        (!rest.is_empty()).then_some(rest)
    })
}

/// At most this many frames go into one vectored write (three slices each: bytes, lent
/// payload, tag)...
const BATCH_FRAMES: usize = 32;
/// ...and frames are added to it while it holds less than this many bytes (a frame in a
/// batch has left the emulated send window, so the batch bounds how far past the window a
/// late urgent frame can be, as the socket's own buffer does).
const BATCH_BYTES: usize = 256 << 10;

impl LinkState {
    /// Moves the frames due at `now_ns` into the batch being written: control frames first
    /// (only at a frame boundary, when nothing is being written), then frames the emulated
    /// link has released, while the batch has room. Each frame is tagged as it joins.
    pub(super) fn take_due<E: Endpoint + ?Sized>(&mut self, now_ns: u64, endpoint: &E) {
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

impl CommLoop {
    /// Writes what is due on link `i` until the socket would block: several frames at a
    /// time (one vectored write of up to [`BATCH_FRAMES`] frames or [`BATCH_BYTES`] bytes),
    /// so that small frames do not cost a system call each.
    pub(super) fn flush<E: Endpoint + ?Sized>(
        &mut self,
        i: usize,
        endpoint: &mut E,
        hooks: &mut dyn Hooks<E>,
    ) -> Result<(), CommError> {
        let now_ns = self.now_ns();
        self.queue_heartbeat(i, now_ns);
        let pool = &mut self.pool;
        let traffic = &self.traffic;
        let liveness = &mut self.liveness;
        let link = &mut self.links[i];
        if link.closed {
            return Ok(());
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
                                pool.give(frame.bytes);
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
}

/// Writes `frames` (the first of them from its byte `written` on) in one vectored write:
/// each frame's bytes, then a lent frame's payload straight from the endpoint's buffer,
/// then its tag.
pub(super) fn write_batch<E: Endpoint + ?Sized>(
    stream: &mut impl Write,
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
pub(super) fn write_all_until(
    stream: &mut impl Write,
    mut bytes: &[u8],
    deadline: Instant,
) -> bool {
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

/// Tells the hooks that a data frame's last byte was written (if they trace frames).
pub(super) fn report_sent<E: ?Sized>(hooks: &mut dyn Hooks<E>, frame: &[u8], queued: Instant) {
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
