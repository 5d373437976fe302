//! The control frames (Stop, Missing) an endpoint owes one peer, in the order they were
//! decided, with at most one pending Missing per share: a new probe's answer replaces the
//! pending one (with the up-to-date bitmap) instead of queueing another, so a peer that
//! probes and never reads cannot grow the queue.

use std::collections::VecDeque;

use crate::wire::{encode_data_frame, FrameKind, Header};

/// One queued control frame: a Stop, or a Missing and its bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Control {
    /// The frame's header (`length` is the bitmap's words).
    pub(super) header: Header,
    /// The bitmap of missing packets (empty for a Stop).
    pub(super) words: Vec<u32>,
}

/// The control frames waiting for one peer.
#[derive(Debug, Default)]
pub(super) struct ControlQueue {
    frames: VecDeque<Control>,
}

/// Whether two control headers are about the same share (or chunk and phase) of one step.
fn same_share(a: &Header, b: &Header) -> bool {
    (a.step, a.key, a.offset, a.sequence) == (b.step, b.key, b.offset, b.sequence)
}

impl ControlQueue {
    /// Queues a Stop for `header`'s share unless one is pending; a Missing still pending
    /// for it is stale (the share is complete) and goes.
    pub(super) fn push_stop(&mut self, mut header: Header) {
        header.kind = FrameKind::Stop;
        header.length = 0;
        header.payload_len = 0;
        self.frames
            .retain(|c| c.header.kind != FrameKind::Missing || !same_share(&c.header, &header));
        if self.frames.iter().any(|c| same_share(&c.header, &header)) {
            return;
        }
        self.frames.push_back(Control {
            header,
            words: Vec::new(),
        });
    }

    /// Queues a Missing with `words` for `header`'s share, or, if one is pending for that
    /// share, replaces its bitmap in place; nothing if a Stop for it is pending.
    pub(super) fn push_missing(&mut self, mut header: Header, words: Vec<u32>) {
        header.kind = FrameKind::Missing;
        header.length = u32::try_from(words.len()).unwrap_or(u32::MAX);
        header.payload_len = header.length.saturating_mul(4);
        match self
            .frames
            .iter_mut()
            .find(|c| same_share(&c.header, &header))
        {
            Some(pending) if pending.header.kind == FrameKind::Missing => {
                *pending = Control { header, words };
            }
            Some(_) => {}
            None => self.frames.push_back(Control { header, words }),
        }
    }

    /// Takes the oldest control frame and appends it, encoded, to `out`; false if none.
    pub(super) fn encode_next(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(c) = self.frames.pop_front() else {
            return false;
        };
        let values: Vec<f32> = c.words.iter().map(|&w| f32::from_bits(w)).collect();
        encode_data_frame(out, &c.header, &values);
        true
    }

    /// Whether nothing is waiting.
    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frames waiting, oldest first.
    #[cfg(test)]
    pub(super) fn pending(&self) -> impl Iterator<Item = &Control> {
        self.frames.iter()
    }
}

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
