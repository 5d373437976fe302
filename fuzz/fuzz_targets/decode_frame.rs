//! Fuzzes the frame header decoder: any 48 bytes must decode or be refused, never panic, and
//! whatever decodes must re-encode to a header that decodes to itself.
//!
//! `cargo install cargo-fuzz && cargo +nightly fuzz run decode_frame` (from this directory's
//! parent).
#![no_main]

use libfuzzer_sys::fuzz_target;
use syncopate_core::wire::{Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN {
        return;
    }
    let mut buf = [0u8; HEADER_LEN];
    buf.copy_from_slice(&data[..HEADER_LEN]);
    if let Ok(h) = Header::decode(&buf, DEFAULT_MAX_PAYLOAD) {
        assert!(h.payload_len <= DEFAULT_MAX_PAYLOAD);
        assert_eq!(Header::decode(&h.encode(), DEFAULT_MAX_PAYLOAD), Ok(h));
    }
});
