//! A worker whose values travel as 16-bit floats ([`WireFloat::Bf16`] or
//! [`WireFloat::F16`]): half the bytes of every data frame, for buffers that are 16-bit
//! floats to begin with (a bfloat16 model's gradients). [`HalfWire`] wraps a worker that
//! computes in `f32` (ring all-reduce, with no buckets shared whole) and translates at the
//! transport's edge: each frame it sends is packed (rounded once, then copied, so the inner
//! worker has its buffer back at once), each frame it receives is unpacked into the slot the
//! inner worker gives. Sums are kept in `f32` between hops and rounded as they travel, as
//! NCCL and Gloo do for 16-bit buffers.
//!
//! Every rank ends with the same bits: in a ring all-reduce the values a rank holds at the
//! end came from their chunk's owner, rounded on the way, except the owner's own chunk,
//! which is rounded in place as its key is ready ([`WireFloat::round`]); a buffer shared whole would
//! break this (its copies are summed on every rank from rounded and unrounded parts), so the
//! inner worker must share none.

use super::{Endpoint, ProtocolError, Rank, Transmit, WorkerEvent, WorkerSync};
use crate::tune::Knobs;
use crate::wire::halves::{pack, packed_words, round_all, unpack};
use crate::wire::{Header, WireFloat, HEADER_LEN};

/// A worker whose frames carry 16-bit floats (see the module docs).
pub struct HalfWire {
    inner: Box<dyn WorkerSync + Send>,
    float: WireFloat,
    /// Packed payloads handed out as lent and not yet written, by their header.
    lent: Vec<(Header, Vec<f32>)>,
    /// Per link, the frame being read and the packed words it lands in.
    reading: Vec<(Rank, Header, Vec<f32>)>,
    /// Buffers for the next packed payloads.
    spare: Vec<Vec<f32>>,
    /// The inner worker's step is done, but packed frames of it are still being written:
    /// the step is done here once they are.
    step_done_held: bool,
}

impl HalfWire {
    /// `inner`, a worker that shares no buffer whole, with its values on the wire as
    /// `float`.
    pub fn new(inner: Box<dyn WorkerSync + Send>, float: WireFloat) -> Self {
        Self {
            inner,
            float,
            lent: Vec::new(),
            reading: Vec::new(),
            spare: Vec::new(),
            step_done_held: false,
        }
    }

    fn buffer(&mut self, words: usize) -> Vec<f32> {
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b.resize(words, 0.0);
        b
    }

    fn recycle(&mut self, b: Vec<f32>) {
        if self.spare.len() < 8 {
            self.spare.push(b);
        }
    }

    /// `out[start..]` holds a whole frame the inner worker wrote: rewrites it packed.
    fn repack_copied(&mut self, out: &mut Vec<u8>, start: usize) {
        let Some(Ok(bytes)) = out
            .get(start..start + HEADER_LEN)
            .map(<[u8; HEADER_LEN]>::try_from)
        else {
            return;
        };
        let Ok(h) = Header::decode(&bytes, u32::MAX) else {
            return;
        };
        let values: Vec<f32> = (out[start + HEADER_LEN..].chunks_exact(4))
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut packed = self.buffer(packed_words(values.len()));
        pack(&values, self.float, &mut packed);
        out.truncate(start);
        out.extend_from_slice(&h.with_float(self.float).encode());
        out.extend_from_slice(bytemuck::cast_slice(&packed));
        self.recycle(packed);
    }

    /// The inner worker's header of a frame that travels as `h`.
    fn inner_header(&self, link: Rank, h: &Header) -> Result<Header, ProtocolError> {
        if h.flags.float() != self.float {
            return Err(ProtocolError::unexpected(
                link,
                h,
                &format!(
                    "values as {:?}, where this collective sends {:?}",
                    h.flags.float(),
                    self.float
                ),
            ));
        }
        Ok(h.with_float(WireFloat::F32))
    }
}

impl Endpoint for HalfWire {
    fn poll_transmit(&mut self, link: Rank, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        let sent = self.inner.poll_transmit(link, out);
        if sent {
            self.repack_copied(out, start);
        }
        sent
    }

    fn poll_transmit_any(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Rank> {
        let start = out.len();
        let link = self.inner.poll_transmit_any(links, out)?;
        self.repack_copied(out, start);
        Some(link)
    }

    fn poll_transmit_lent(&mut self, links: &[Rank], out: &mut Vec<u8>) -> Option<Transmit> {
        let start = out.len();
        match self.inner.poll_transmit_lent(links, out)? {
            Transmit::Copied(link) => {
                self.repack_copied(out, start);
                Some(Transmit::Copied(link))
            }
            Transmit::Lent(link, h) => {
                let mut packed = self.buffer(packed_words(h.length as usize));
                pack(self.inner.lent_payload(&h), self.float, &mut packed);
                // Packed, the values are copied: the inner worker has its buffer back.
                self.inner.handle_sent(link, &h);
                let halved = h.with_float(self.float);
                out.truncate(start);
                out.extend_from_slice(&halved.encode());
                self.lent.push((halved, packed));
                Some(Transmit::Lent(link, halved))
            }
        }
    }

    fn lent_payload(&self, header: &Header) -> &[f32] {
        (self.lent.iter())
            .find(|(h, _)| h == header)
            .map_or(&[], |(_, packed)| packed)
    }

    fn handle_sent(&mut self, _link: Rank, header: &Header) {
        if let Some(i) = self.lent.iter().position(|(h, _)| h == header) {
            let (_, packed) = self.lent.swap_remove(i);
            self.recycle(packed);
        }
    }

    fn recv_slot(&mut self, link: Rank, header: &Header) -> Result<&mut [f32], ProtocolError> {
        let i = match (self.reading.iter()).position(|(l, h, _)| *l == link && h == header) {
            Some(i) => i,
            None => {
                let inner = self.inner_header(link, header)?;
                // Checks the frame against the protocol before a byte of it is read.
                self.inner.recv_slot(link, &inner)?;
                self.reading.retain(|(l, _, _)| *l != link);
                let packed = self.buffer(packed_words(header.length as usize));
                self.reading.push((link, *header, packed));
                self.reading.len() - 1
            }
        };
        Ok(&mut self.reading[i].2)
    }

    fn handle_payload(&mut self, link: Rank, header: &Header) -> Result<(), ProtocolError> {
        let inner = self.inner_header(link, header)?;
        let i = (self.reading.iter())
            .position(|(l, h, _)| *l == link && h == header)
            .ok_or_else(|| ProtocolError::unexpected(link, header, "a payload never announced"))?;
        let (_, _, packed) = self.reading.swap_remove(i);
        let slot = self.inner.recv_slot(link, &inner)?;
        unpack(&packed, self.float, slot);
        self.recycle(packed);
        self.inner.handle_payload(link, &inner)
    }

    fn accepts_loss(&self, link: Rank, header: &Header) -> bool {
        self.inner.accepts_loss(link, header)
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.inner.poll_timeout()
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        self.inner.handle_timeout(now_ns);
    }

    fn handle_path_rtt(&mut self, link: Rank, srtt_ns: u64) {
        self.inner.handle_path_rtt(link, srtt_ns);
    }

    fn pooled_bytes(&self) -> usize {
        let spare: usize = self.spare.iter().map(|b| b.capacity() * 4).sum();
        self.inner.pooled_bytes() + spare
    }
}

impl WorkerSync for HalfWire {
    fn start_at(&mut self, step: u64) {
        self.inner.start_at(step);
    }

    fn begin_step(&mut self, step: u64) {
        self.inner.begin_step(step);
    }

    fn handle_gradient(&mut self, key: usize, grad: &[f32]) {
        self.inner.handle_gradient(key, grad);
    }

    fn gradient_slot(&mut self, key: usize) -> Option<&mut [f32]> {
        self.inner.gradient_slot(key)
    }

    fn handle_gradient_in_place(&mut self, key: usize) {
        self.inner.handle_gradient_in_place(key);
    }

    fn handle_backward_done(&mut self) {
        self.inner.handle_backward_done();
    }

    fn poll_event(&mut self) -> Option<WorkerEvent> {
        if self.step_done_held {
            // Nothing else comes from the inner worker before the next step begins.
            self.step_done_held = !self.lent.is_empty();
            return (!self.step_done_held).then_some(WorkerEvent::StepDone);
        }
        let event = self.inner.poll_event()?;
        match event {
            WorkerEvent::GradReady(key) => {
                // The chunks this rank averaged itself are still unrounded: round them as
                // the other ranks received them (rounding twice changes nothing).
                if let Some(values) = self.inner.gradient_slot(key) {
                    round_all(values, self.float);
                }
            }
            // A driver may drop a finished step's frames: not while one is being written.
            WorkerEvent::StepDone if !self.lent.is_empty() => {
                self.step_done_held = true;
                return None;
            }
            _ => {}
        }
        Some(event)
    }

    fn take_values(&mut self, key: usize) -> Vec<f32> {
        self.inner.take_values(key)
    }

    fn retune(&mut self, knobs: Knobs) {
        self.inner.retune(knobs);
    }
}
