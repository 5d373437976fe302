//! The emulated ingress port and the endpoint's state: a frame the port loses never
//! reaches the endpoint's slot, and only the receiver's loss-tolerant flows lose frames,
//! whatever the sender's header claims.

use syncopate_core::net::{NetworkProfile, Port};
use syncopate_core::strategy::Endpoint;
use syncopate_core::wire::{Flags, FrameKind};

use super::emulation::{ingress_meta, ingress_open, Gate};
use super::reader::{destination, ReadState};
use super::tests::FinishWhen;
use super::*;

/// Values of the receiver's live slot.
const VALUES: usize = 2048;
/// Values of the frame being read.
const FLAGGED: u32 = 8;

/// Reads every frame into one live slot, as a ring's gather reads into its bucket; each
/// frame handed over is checked and wiped, so what stays in the slot came from frames
/// never handed over.
struct Receiver {
    live: Vec<f32>,
    /// Whether its flow from the sender is loss-tolerant.
    accepts: bool,
    handled: Vec<u32>,
}

impl Endpoint for Receiver {
    fn poll_transmit(&mut self, _link: Rank, _out: &mut Vec<u8>) -> bool {
        false
    }

    fn recv_slot(&mut self, _link: Rank, h: &Header) -> Result<&mut [f32], ProtocolError> {
        Ok(&mut self.live[..h.length as usize])
    }

    fn handle_payload(&mut self, _link: Rank, h: &Header) -> Result<(), ProtocolError> {
        let want = 1.0 + h.key as f32;
        assert!(self.live[..h.length as usize].iter().all(|&v| v == want));
        self.live.fill(0.0);
        self.handled.push(h.key);
        Ok(())
    }

    fn accepts_loss(&self, _link: Rank, _h: &Header) -> bool {
        self.accepts
    }
}

/// The frame of `FLAGGED` values the reader is in, its payload `done` bytes in, `gate` its.
fn reading(gate: Gate, done: usize) -> ReadState {
    let mut header = Header::data(FrameKind::Gather, 0, 0, 0, FLAGGED);
    header.flags = Flags::default().loss_tolerant();
    ReadState::Data {
        header,
        done,
        arrived: std::time::Instant::now(),
        gate,
        hashed: 0,
    }
}

/// A frame the ingress port lost is read into the link's discard buffer, never into the
/// endpoint's slot (for a ring's gather, the live bucket); a released one into the slot.
#[test]
fn a_lost_frames_payload_goes_to_the_discard_buffer_not_the_slot() {
    let mut receiver = Receiver {
        live: vec![0.0; VALUES],
        accepts: true,
        handled: Vec::new(),
    };
    let hooks = FinishWhen(|_: &Receiver| true);
    let bytes = FLAGGED as usize * 4;
    let mut discard = vec![0u8; bytes];
    let mut read = reading(Gate::Discard, 4);
    let dest = destination(&mut read, &mut discard, &mut receiver, 1, &hooks).unwrap();
    assert_eq!(dest.len(), bytes - 4);
    dest.fill(0xAB);
    assert!(
        receiver.live.iter().all(|&v| v == 0.0),
        "the live slot was written"
    );
    assert!(discard[4..].iter().all(|&b| b == 0xAB));

    let mut read = reading(Gate::Open, 0);
    let dest = destination(&mut read, &mut discard, &mut receiver, 1, &hooks).unwrap();
    dest.fill(0xCD);
    assert!(receiver.live[..FLAGGED as usize]
        .iter()
        .all(|&v| v.to_bits() == 0xCDCD_CDCD));
}

/// Only a flow the receiver takes as loss-tolerant may lose frames at its ingress port: a
/// frame its sender flagged loss-tolerant on any other flow is reliable to the port.
#[test]
fn a_senders_flag_does_not_make_a_reliable_flow_lossy() {
    let mut h = Header::data(FrameKind::Push, 0, 0, 0, 4);
    h.flags = Flags::default().loss_tolerant();
    assert!(ingress_meta(&h, 1, false, false).reliable);
    assert!(!ingress_meta(&h, 1, false, true).reliable);
    let receiver = Receiver {
        live: Vec::new(),
        accepts: false,
        handled: Vec::new(),
    };
    let mut gate = Gate::New;
    let mut port = Port::ingress(&NetworkProfile::default(), 1, 0);
    let meta = || ingress_meta(&h, 1, false, receiver.accepts_loss(1, &h));
    assert!(!ingress_open(&mut gate, meta, Some(&mut port), 0, 0));
    assert_eq!(gate, Gate::Waiting { droppable: false });
}
