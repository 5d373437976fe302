//! The datagrams of one link that leave together, and the order they leave in: ordered by
//! DSCP, the higher classes first and the drop-eligible last (a server writes packets in
//! place, so their order within a batch does not matter to it, and a queue that must drop
//! finds the least useful ones at its tail), then sealed in that order so that their
//! sequence numbers follow the order they go out in (a receiver reads a gap in them as
//! loss), and cut into runs of one DSCP and one size that a kernel can send as one
//! segmentation-offload (GSO) write.

use crate::wire::datagram::{dscp_of, DatagramSealer, DATA_OVERHEAD};
use crate::wire::Header;

/// A loss-tolerant frame waiting for its link's pacer: its header, its payload bytes and
/// the path it will take.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The frame's header (`payload_len` is the payload's length).
    pub header: Header,
    /// The frame's payload bytes.
    pub payload: Vec<u8>,
    /// The path it leaves on.
    pub path: usize,
}

impl Pending {
    /// The bytes of this frame sealed as a datagram (the UDP payload).
    pub fn sealed_len(&self) -> usize {
        DATA_OVERHEAD + self.payload.len()
    }
}

/// What the driver's sockets can take in one write: the kernel's segmentation offload
/// (one write of several datagrams of one size) and its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendLimits {
    /// Whether one write may carry several datagrams (UDP GSO).
    pub gso: bool,
    /// The most datagrams in one write.
    pub max_segments: usize,
    /// The most bytes in one write.
    pub max_bytes: usize,
}

impl SendLimits {
    /// One datagram per write.
    pub const ONE_BY_ONE: SendLimits = SendLimits {
        gso: false,
        max_segments: 1,
        max_bytes: usize::MAX,
    };
}

/// One write of a sealed batch: `count` datagrams of `segment` bytes (the last may be
/// shorter) in `bytes[start..end]`, all of one DSCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The IP DSCP of its datagrams.
    pub dscp: u8,
    /// Where its bytes start in [`Sealed::bytes`].
    pub start: usize,
    /// Where they end.
    pub end: usize,
    /// How many datagrams it carries.
    pub count: usize,
    /// The size of each datagram but the last.
    pub segment: usize,
}

/// Datagrams sealed and ready to leave on one path, as runs of writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sealed {
    /// The path they leave on.
    pub path: usize,
    /// Every datagram's bytes, back to back.
    pub bytes: Vec<u8>,
    /// The writes, in order.
    pub runs: Vec<Run>,
}

impl Sealed {
    /// The datagrams it carries.
    pub fn datagrams(&self) -> usize {
        self.runs.iter().map(|r| r.count).sum()
    }

    /// Empties it for the next batch (its buffers are kept).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.runs.clear();
    }

    /// The bytes of `run`.
    pub fn run_bytes(&self, run: &Run) -> &[u8] {
        self.bytes.get(run.start..run.end).unwrap_or_default()
    }
}

/// Orders frames for sealing: by DSCP, highest first, and within one the longest first (so
/// that a GSO run ends with its one short datagram); otherwise as they came.
pub(crate) fn order(frames: &mut [Pending]) {
    frames.sort_by(|a, b| {
        let (da, db) = (dscp_of(a.header.flags), dscp_of(b.header.flags));
        db.cmp(&da).then(b.sealed_len().cmp(&a.sealed_len()))
    });
}

/// Seals `frames` (already in [`order`]) with `sealer` at `now_ns` into `out`, cut into
/// runs within `limits`.
pub(crate) fn seal(
    frames: &[Pending],
    sealer: &mut DatagramSealer,
    now_ns: u64,
    limits: SendLimits,
    out: &mut Sealed,
) {
    let mut last_len = 0;
    for q in frames {
        let (dscp, len) = (dscp_of(q.header.flags), q.sealed_len());
        let start = out.bytes.len();
        sealer.seal_data(&mut out.bytes, &q.header, &q.payload, now_ns);
        let end = out.bytes.len();
        match out.runs.last_mut() {
            Some(run)
                if limits.gso
                    && run.dscp == dscp
                    && last_len == run.segment
                    && len <= run.segment
                    && run.count < limits.max_segments
                    && end - run.start <= limits.max_bytes =>
            {
                run.count += 1;
                run.end = end;
            }
            _ => out.runs.push(Run {
                dscp,
                start,
                end,
                count: 1,
                segment: len,
            }),
        }
        last_len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::mac::FrameKey;
    use crate::wire::{Flags, FrameKind};

    /// A loss-tolerant frame of `values` values in class `class` (drop-eligible if so).
    fn frame(values: usize, class: u8, eligible: bool) -> Pending {
        let mut header = Header::data(FrameKind::Push, 0, 0, 0, values as u32);
        header.flags = Flags::class(class)
            .loss_tolerant()
            .drop_eligible_if(eligible);
        Pending {
            header,
            payload: vec![0; values * 4],
            path: 0,
        }
    }

    const GSO: SendLimits = SendLimits {
        gso: true,
        max_segments: 64,
        max_bytes: 65_507,
    };

    fn sealed(frames: &[Pending], limits: SendLimits) -> Sealed {
        let mut sealer = DatagramSealer::new(&FrameKey::new([7; 32]));
        let mut out = Sealed::default();
        seal(frames, &mut sealer, 0, limits, &mut out);
        out
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
        let out = sealed(&frames, GSO);
        let shape: Vec<_> = out
            .runs
            .iter()
            .map(|r| (r.dscp, r.count, r.segment))
            .collect();
        // class 0 (DSCP 46): the two full ones, then the short one, in one send
        assert_eq!(shape, [(46, 3, full), (45, 1, full), (8, 2, full)]);
        assert_eq!(frames[2].payload.len(), 160, "the short one ends its run");
        assert_eq!(out.bytes.len(), 5 * full + DATA_OVERHEAD + 160);
        assert_eq!(out.runs.last().map(|r| r.end), Some(out.bytes.len()));
        let one_each = sealed(&frames, SendLimits::ONE_BY_ONE);
        assert_eq!(one_each.runs.len(), 6, "without GSO one datagram per send");
    }

    #[test]
    fn a_run_stops_at_the_segment_limit_and_after_a_short_datagram() {
        let mut frames: Vec<Pending> = (0..GSO.max_segments + 4)
            .map(|_| frame(4, 0, false))
            .collect();
        frames.insert(3, frame(2, 0, false));
        // As they came (no ordering): the short one at 3 ends the first run.
        let counts: Vec<usize> = sealed(&frames, GSO).runs.iter().map(|r| r.count).collect();
        assert_eq!(counts, [4, GSO.max_segments, 1]);
    }

    #[test]
    fn a_run_stops_at_the_byte_limit() {
        let frames: Vec<Pending> = (0..10).map(|_| frame(100, 0, false)).collect();
        let limits = SendLimits {
            max_bytes: 3 * (DATA_OVERHEAD + 400),
            ..GSO
        };
        let counts: Vec<usize> = sealed(&frames, limits)
            .runs
            .iter()
            .map(|r| r.count)
            .collect();
        assert_eq!(counts, [3, 3, 3, 1]);
    }
}
