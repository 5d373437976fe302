//! Fuzzes the frame header decoder: any 48 bytes must decode or be refused, never panic, and
//! whatever decodes must re-encode to a header that decodes to itself.
//!
//! Each input is tried as it is and again with a valid magic, version and kind written over
//! its first four bytes: from an empty corpus libFuzzer needs tens of millions of runs to guess
//! the magic "SY", so without the second try the checks behind it would go unexercised for
//! most of a short run.
//!
//! On stable Rust (no nightly needed), from the repository root (the parent of `fuzz/`):
//!
//! ```sh
//! cargo install cargo-fuzz --locked
//! RUSTC_BOOTSTRAP=1 cargo fuzz run decode_frame -- -max_total_time=300
//! ```
#![no_main]

use libfuzzer_sys::fuzz_target;
use syncopate_core::wire::{Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN, VERSION};

fn check(buf: &[u8; HEADER_LEN], max_payload: u32) {
    if let Ok(h) = Header::decode(buf, max_payload) {
        assert!(h.payload_len <= max_payload);
        assert_eq!(Header::decode(&h.encode(), max_payload), Ok(h));
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN {
        return;
    }
    let mut buf = [0u8; HEADER_LEN];
    buf.copy_from_slice(&data[..HEADER_LEN]);
    // A byte after the header picks a smaller limit now and then (the runtime's is configurable).
    let max_payload = match data.get(HEADER_LEN) {
        Some(&b) if b & 1 == 1 => u32::from(b) << 4,
        _ => DEFAULT_MAX_PAYLOAD,
    };
    check(&buf, max_payload);
    buf[0..2].copy_from_slice(b"SY");
    buf[2] = VERSION;
    buf[3] = 1 + data[3] % 8;
    check(&buf, max_payload);
});
