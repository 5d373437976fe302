//! The datagrams that leave together: the frames a link's pacer let go, gathered into one
//! batch and sealed only when the batch is sent, so that their sequence numbers follow the
//! order they go out in (a receiver reads a gap in them as loss). At the flush the batch
//! is ordered by DSCP, the higher classes first and the drop-eligible last (a server
//! writes packets in place, so their order within a batch does not matter to it, and a
//! queue that must drop finds the least useful ones at its tail), and each run of one DSCP
//! leaves in one GSO send ([`super::udp_io`]).

use std::io;
use std::net::SocketAddr;

use syncopate_core::wire::datagram::{dscp_of, DatagramSealer, DATA_OVERHEAD};
use syncopate_core::wire::Header;

use super::udp_io::{self, Offloads, MAX_BATCH_BYTES, MAX_SEGMENTS};

/// One path's socket and the offloads its kernel took.
pub(super) struct PathSocket {
    pub(super) socket: mio::net::UdpSocket,
    pub(super) offloads: Offloads,
}

/// A loss-tolerant frame waiting for its link's pacer: its header and its payload bytes.
pub(super) struct Queued {
    pub(super) header: Header,
    pub(super) payload: Vec<u8>,
}

/// The most datagrams one batch holds (about two GSO sends of full datagrams).
const BATCH_DATAGRAMS: usize = 2 * MAX_SEGMENTS;
/// How long to wait before retrying a send the socket refused for lack of buffer space.
const RETRY_NS: u64 = 100_000;

/// One GSO send of a batch: its DSCP, and `count` frames from `first` (in the batch's
/// flush order) of `segment` bytes each sealed, the last maybe fewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    dscp: u8,
    first: usize,
    count: usize,
    segment: usize,
}

/// The sending side of a datagram path: its sockets (one per path) and the batch.
pub(super) struct Outbox {
    sockets: Vec<PathSocket>,
    /// The batch's link, path and destination (meaningful while `frames` is not empty).
    link: usize,
    path: usize,
    to: Option<SocketAddr>,
    frames: Vec<Queued>,
    /// One GSO send being sealed.
    run: Vec<u8>,
    /// When a send last found the socket full (0: it did not); retried after [`RETRY_NS`].
    blocked_until: u64,
    /// Datagrams the local kernel refused to send (a full local queue, an unreachable
    /// peer): lost, as the network would lose them.
    send_failures: u64,
}

impl Outbox {
    /// The outbox of `sockets`, one per path.
    pub(super) fn new(sockets: Vec<PathSocket>) -> Self {
        Self {
            sockets,
            link: 0,
            path: 0,
            to: None,
            frames: Vec::new(),
            run: Vec::new(),
            blocked_until: 0,
            send_failures: 0,
        }
    }

    /// The number of paths.
    pub(super) fn paths(&self) -> usize {
        self.sockets.len()
    }

    /// Path `j`'s socket.
    pub(super) fn socket(&self, j: usize) -> Option<&PathSocket> {
        self.sockets.get(j)
    }

    /// The link whose frames the batch holds (`None`: it is empty).
    pub(super) fn link(&self) -> Option<usize> {
        (!self.frames.is_empty()).then_some(self.link)
    }

    /// Whether the batch holds frames of link `i`.
    pub(super) fn holds(&self, i: usize) -> bool {
        self.link() == Some(i)
    }

    /// Frames in the batch.
    pub(super) fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the socket refused the last send (the batch waits for a retry).
    pub(super) fn is_blocked(&self) -> bool {
        self.blocked_until > 0
    }

    /// When a refused send is retried (0: none was refused).
    pub(super) fn blocked_until(&self) -> u64 {
        self.blocked_until
    }

    /// Datagrams the local kernel refused so far.
    pub(super) fn send_failures(&self) -> u64 {
        self.send_failures
    }

    /// Whether a frame of `link` on `path` to `to` may join the batch.
    pub(super) fn takes(&self, link: usize, path: usize, to: SocketAddr) -> bool {
        self.frames.is_empty()
            || (self.link, self.path, self.to) == (link, path, Some(to))
                && self.frames.len() < BATCH_DATAGRAMS
    }

    /// Adds a frame (after [`Outbox::takes`] said it may).
    pub(super) fn push(&mut self, link: usize, path: usize, to: SocketAddr, frame: Queued) {
        if self.frames.is_empty() {
            (self.link, self.path, self.to) = (link, path, Some(to));
        }
        self.frames.push(frame);
    }

    /// Seals the batch's frames with `sealer` (its link's) at `now_ns` and sends them;
    /// `false` while the socket is full (what is left stays for a retry).
    pub(super) fn flush(&mut self, sealer: &mut DatagramSealer, now_ns: u64) -> bool {
        let Some(to) = self.to.filter(|_| !self.frames.is_empty()) else {
            return true;
        };
        if self.blocked_until > now_ns {
            return false;
        }
        let Some(socket) = self.sockets.get(self.path) else {
            self.frames.clear();
            return true;
        };
        order(&mut self.frames);
        let mut sent = 0;
        for run in runs(&self.frames, socket.offloads.gso) {
            self.run.clear();
            for q in &self.frames[run.first..run.first + run.count] {
                sealer.seal_data(&mut self.run, &q.header, &q.payload, now_ns);
            }
            let gso = (run.count > 1).then(|| u16::try_from(run.segment).unwrap_or(u16::MAX));
            match udp_io::send(&socket.socket, &self.run, gso, to, run.dscp) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // The run's numbers are skipped (the receiver's window does not mind a
                    // gap); its frames are sealed again at the retry.
                    self.blocked_until = now_ns.saturating_add(RETRY_NS).max(1);
                    self.frames.drain(..sent);
                    return false;
                }
                Err(e) => {
                    tracing::debug!("{} datagram(s) to {to} were not sent: {e}", run.count);
                    self.send_failures += run.count as u64;
                }
            }
            sent += run.count;
        }
        self.frames.clear();
        self.blocked_until = 0;
        true
    }
}

/// The bytes of `q` sealed as a datagram.
fn sealed_len(q: &Queued) -> usize {
    DATA_OVERHEAD + q.payload.len()
}

/// Orders frames for a flush: by DSCP, highest first, and within one the longest first (so
/// that a GSO run ends with its one short datagram); otherwise as they came.
fn order(frames: &mut [Queued]) {
    frames.sort_by(|a, b| {
        let (da, db) = (dscp_of(a.header.flags), dscp_of(b.header.flags));
        db.cmp(&da).then(sealed_len(b).cmp(&sealed_len(a)))
    });
}

/// The sends of `frames` (in flush order): runs of one DSCP whose datagrams but the last
/// are of one size, at most [`MAX_SEGMENTS`] and [`MAX_BATCH_BYTES`]; one datagram per
/// send without `gso`.
fn runs(frames: &[Queued], gso: bool) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut bytes = 0;
    let mut last_len = 0;
    for (k, q) in frames.iter().enumerate() {
        let (dscp, len) = (dscp_of(q.header.flags), sealed_len(q));
        match runs.last_mut() {
            Some(run)
                if gso
                    && run.dscp == dscp
                    && last_len == run.segment
                    && len <= run.segment
                    && run.count < MAX_SEGMENTS
                    && bytes + len <= MAX_BATCH_BYTES =>
            {
                run.count += 1;
                bytes += len;
            }
            _ => {
                runs.push(Run {
                    dscp,
                    first: k,
                    count: 1,
                    segment: len,
                });
                bytes = len;
            }
        }
        last_len = len;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate_core::wire::{Flags, FrameKind};

    /// A loss-tolerant frame of `values` values in class `class` (drop-eligible if so).
    fn frame(values: usize, class: u8, eligible: bool) -> Queued {
        let mut header = Header::data(FrameKind::Push, 0, 0, 0, values as u32);
        header.flags = Flags::class(class)
            .loss_tolerant()
            .drop_eligible_if(eligible);
        Queued {
            header,
            payload: vec![0; values * 4],
        }
    }

    #[test]
    fn a_batch_goes_out_class_by_class_the_drop_eligible_last() {
        let mut frames = vec![
            frame(100, 0, true),
            frame(100, 0, false),
            frame(40, 0, false),
            frame(100, 0, true),
            frame(100, 1, false),
            frame(100, 0, false),
        ];
        order(&mut frames);
        let full = DATA_OVERHEAD + 400;
        let got = runs(&frames, true);
        let want = [
            // class 0 (DSCP 46): the two full ones, then the short one, in one send
            Run {
                dscp: 46,
                first: 0,
                count: 3,
                segment: full,
            },
            Run {
                dscp: 45,
                first: 3,
                count: 1,
                segment: full,
            },
            Run {
                dscp: 8,
                first: 4,
                count: 2,
                segment: full,
            },
        ];
        assert_eq!(got, want);
        assert_eq!(frames[2].payload.len(), 160, "the short one ends its run");
        let one_each = runs(&frames, false);
        assert_eq!(one_each.len(), 6, "without GSO one datagram per send");
    }

    #[test]
    fn a_run_stops_at_the_segment_limit_and_after_a_short_datagram() {
        let mut frames: Vec<Queued> = (0..MAX_SEGMENTS + 4).map(|_| frame(4, 0, false)).collect();
        frames.insert(3, frame(2, 0, false));
        // As they came (no ordering): the short one at 3 ends the first run.
        let counts: Vec<usize> = runs(&frames, true).iter().map(|r| r.count).collect();
        assert_eq!(counts, [4, MAX_SEGMENTS, 1]);
    }
}
