//! Fuzzes the UDP datagram decoder (`syncopate_core::wire::datagram`): any bytes given to
//! `DatagramOpener::open` must be refused or opened, never panic, and never open under a key
//! the input does not know (no input forges a tag), nor move the replay window when refused.
//!
//! It also seals a datagram built from the input (a frame header and payload taken from it,
//! or a feedback body) and checks that it opens exactly once, with what was sealed, and is
//! refused once a byte the input chooses is flipped.
//!
//! Each input is tried as it is and again with a valid magic, version and type written over
//! its first four bytes, so that the checks behind the prefix run from an empty corpus.
//!
//! On stable Rust (no nightly needed), from the repository root (the parent of `fuzz/`):
//!
//! ```sh
//! cargo install cargo-fuzz --locked
//! RUSTC_BOOTSTRAP=1 cargo fuzz run decode_datagram -- -max_total_time=300
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use syncopate_core::wire::datagram::{
    DatagramOpener, DatagramSealer, Feedback, Opened, DATAGRAM_VERSION, DATA_OVERHEAD,
    MAX_DATAGRAM_LEN, PREFIX_LEN,
};
use syncopate_core::wire::mac::FrameKey;
use syncopate_core::wire::{FrameKind, Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

const KEY: [u8; 32] = [0x5a; 32];

/// The input as a received datagram: refused under a key it cannot know, and the refusal
/// leaves the opener as it was.
fn check_open(data: &[u8], max_payload: u32) {
    let mut opener = DatagramOpener::new(&FrameKey::new(KEY));
    assert!(
        opener.open(data, max_payload).is_err(),
        "a forged datagram opened"
    );
    assert_eq!(
        opener.window().highest(),
        None,
        "a refused datagram moved the window"
    );
}

/// A data header for the values the input's bytes give, with fields taken from the input.
fn header_from(data: &[u8], values: u32) -> Header {
    let byte = |i: usize| data.get(i).copied().unwrap_or(0);
    let kinds = [
        FrameKind::Push,
        FrameKind::Params,
        FrameKind::Reduce,
        FrameKind::Gather,
    ];
    let kind = kinds[usize::from(byte(0)) % kinds.len()];
    let mut header = Header::data(kind, u64::from(byte(1)), u32::from(byte(2)), 0, values);
    header.priority = i32::from(byte(3)) - 128;
    header
}

/// Seals a datagram built from the input and checks it opens once, as sealed, and is
/// refused after a flip.
fn check_seal(data: &[u8]) {
    let key = FrameKey::new(KEY);
    let mut sealer = DatagramSealer::new(&key);
    let mut sealed = Vec::new();
    let sent_ns = u64::from(data.len() as u32);
    let feedback = data.first().is_some_and(|b| b & 1 == 1);
    let fb = Feedback {
        received: data.len() as u64,
        highest_seq: 7,
        echo_sent_ns: 9,
        echo_held_ns: 11,
    };
    let (payload, header) = if feedback {
        sealer.seal_feedback(&mut sealed, &fb, sent_ns);
        (&[][..], None)
    } else {
        // As much of the input as fits one datagram, in whole values.
        let len = data.len().min(MAX_DATAGRAM_LEN - DATA_OVERHEAD);
        let payload = &data[..len - len % 4];
        let header = header_from(data, (payload.len() / 4) as u32);
        sealer.seal_data(&mut sealed, &header, payload, sent_ns);
        (payload, Some(header))
    };
    let mut opener = DatagramOpener::new(&key);
    match (opener.open(&sealed, DEFAULT_MAX_PAYLOAD), header) {
        (
            Ok(Opened::Data {
                header: h,
                payload: p,
                seq: 0,
                sent_ns: s,
            }),
            Some(header),
        ) => {
            assert_eq!((h, p, s), (header, payload, sent_ns));
        }
        (
            Ok(Opened::Feedback {
                feedback: f,
                seq: 0,
                sent_ns: s,
            }),
            None,
        ) => {
            assert_eq!((f, s), (fb, sent_ns));
        }
        (other, _) => panic!("a sealed datagram did not open as sealed: {other:?}"),
    }
    assert!(
        opener.open(&sealed, DEFAULT_MAX_PAYLOAD).is_err(),
        "a replay opened"
    );
    let flip = data.get(1).map_or(0, |&b| usize::from(b)) * 257 % sealed.len();
    sealed[flip] ^= 0x01;
    let mut fresh = DatagramOpener::new(&key);
    assert!(
        fresh.open(&sealed, DEFAULT_MAX_PAYLOAD).is_err(),
        "an altered datagram opened"
    );
}

fuzz_target!(|data: &[u8]| {
    // A byte picks a smaller limit now and then (the runtime's is configurable).
    let max_payload = match data.get(PREFIX_LEN + HEADER_LEN) {
        Some(&b) if b & 1 == 1 => u32::from(b) << 4,
        _ => DEFAULT_MAX_PAYLOAD,
    };
    check_open(data, max_payload);
    if data.len() >= PREFIX_LEN {
        let mut fixed = data.to_vec();
        fixed[..4].copy_from_slice(&[b'S', b'D', DATAGRAM_VERSION, 1 + data[3] % 2]);
        check_open(&fixed, max_payload);
    }
    check_seal(data);
});
