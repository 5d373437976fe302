//! The checks a DLCP ring worker makes of the frames it receives: from which neighbour,
//! of which step, about which chunk.

use super::super::ring_hops::Phase;
use super::DlcpRing;
use crate::strategy::{ProtocolError, Rank};
use crate::wire::{FrameKind, Header};

impl DlcpRing {
    /// Checks the step of a frame about a transfer into this worker: `Ok(false)` if it is
    /// late (of a step already over), an error if it is too far ahead.
    pub(super) fn check_incoming_step(
        &self,
        link: Rank,
        h: &Header,
        ahead: bool,
    ) -> Result<bool, ProtocolError> {
        if h.step < self.step {
            return Ok(false);
        }
        let next_ok = ahead && self.begun && h.step == self.step + 1;
        if h.step == self.step || next_ok {
            return Ok(true);
        }
        Err(ProtocolError::unexpected(
            link,
            h,
            &format!("step ahead (this worker is at step {})", self.step),
        ))
    }

    /// Checks that a frame came from the neighbour that sends it: the left-hand one for
    /// data and probes (`from_left`), the right-hand one for stops and bitmaps.
    pub(super) fn check_link(
        &self,
        link: Rank,
        h: &Header,
        from_left: bool,
    ) -> Result<(), ProtocolError> {
        let want = if from_left { self.left } else { self.right };
        if self.n < 2 || link != want {
            let side = if from_left { "left" } else { "right" };
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!(
                    "a {:?} frame comes only from the {side}-hand neighbour",
                    h.kind
                ),
            ));
        }
        Ok(())
    }

    /// The chunk and phase a control frame names, checked.
    pub(super) fn control_target(
        &self,
        link: Rank,
        h: &Header,
    ) -> Result<(usize, usize, Phase), ProtocolError> {
        let bucket = h.key as usize;
        let c = h.offset as usize;
        let phase = Phase::from_sequence(h.sequence)
            .ok_or_else(|| ProtocolError::unexpected(link, h, "no such phase"))?;
        if bucket >= self.geo.keys() || c >= self.n || self.geo.chunk_packets(bucket, c) == 0 {
            return Err(ProtocolError::unexpected(link, h, "no such chunk"));
        }
        Ok((bucket, c, phase))
    }

    /// The bucket, chunk and phase a control frame is about, checked to flow over `link`: a
    /// Probe comes from the left about a chunk this worker receives, a Stop or a Missing
    /// from the right about one it sends.
    pub(super) fn flowing_control_target(
        &self,
        link: Rank,
        h: &Header,
    ) -> Result<(usize, usize, Phase), ProtocolError> {
        let probe = h.kind == FrameKind::Probe;
        self.check_link(link, h, probe)?;
        let (bucket, c, phase) = self.control_target(link, h)?;
        if probe && !self.receives_chunk(phase, c) {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "a probe for a chunk not sent here",
            ));
        }
        if !probe && !self.sends_chunk(phase, c) {
            return Err(ProtocolError::unexpected(
                link,
                h,
                "about a chunk not sent from here",
            ));
        }
        Ok((bucket, c, phase))
    }

    /// A Stop or a Missing about this worker's sending; `Ok(None)` if it is about a step
    /// already over.
    pub(super) fn outgoing_target(
        &self,
        link: Rank,
        h: &Header,
    ) -> Result<Option<(usize, usize, Phase)>, ProtocolError> {
        let (bucket, c, phase) = self.flowing_control_target(link, h)?;
        if h.step < self.step || !self.begun {
            return Ok(None);
        }
        if h.step > self.step {
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!("step ahead (this worker is at step {})", self.step),
            ));
        }
        Ok(Some((bucket, c, phase)))
    }
}
