//! Fuzzes the frame header decoder: any 48 bytes must decode or be refused, never panic, and
//! whatever decodes must re-encode to a header that decodes to itself.
//!
//! It also fuzzes the frame MACs that follow each frame unless a job says `--no-frame-mac`
//! (`syncopate_core::wire::mac`): an input of at least 80 bytes, taken as a header, a
//! payload and a tag, the payload fed to the checker in pieces of input-chosen sizes, must
//! never pass (no input forges a tag), while the same frame tagged by the sender must pass,
//! and fail again once a byte the input chooses is flipped.
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
use syncopate_core::wire::mac::{FrameKey, FrameOpener, FrameSealer, Tag, TAG_LEN};
use syncopate_core::wire::{Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN, VERSION};

fn check(buf: &[u8; HEADER_LEN], max_payload: u32) {
    if let Ok(h) = Header::decode(buf, max_payload) {
        assert!(h.payload_len <= max_payload);
        assert_eq!(Header::decode(&h.encode(), max_payload), Ok(h));
    }
}

/// Feeds `payload` to a checker for `key` in pieces of the sizes `cuts` gives, then
/// `header` and `tag`.
fn open(key: &FrameKey, header: &[u8; HEADER_LEN], payload: &[u8], cuts: &[u8], tag: &Tag) -> bool {
    let mut opener = FrameOpener::new(key);
    let mut rest = payload;
    for &cut in cuts.iter().cycle().take(rest.len()) {
        let (piece, tail) = rest.split_at(usize::from(cut).min(rest.len()));
        opener.update(piece);
        rest = tail;
    }
    opener.update(rest);
    opener.finish(header, tag).is_ok()
}

/// The input as header, payload and tag: never accepted as it is, accepted once tagged by
/// the sender, refused again once a byte of it is flipped.
fn check_mac(data: &[u8]) {
    let Some((header, rest)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Some((payload, tag)) = rest.split_last_chunk::<TAG_LEN>() else {
        return;
    };
    let key = FrameKey::new([0x5a; 32]);
    let cuts = &data[..8];
    assert!(
        !open(&key, header, payload, cuts, tag),
        "a forged tag passed"
    );
    let sealed = FrameSealer::new(&key).seal(header, &[payload]);
    assert!(open(&key, header, payload, cuts, &sealed));
    let flip = usize::from(data[0]) % (HEADER_LEN + payload.len());
    let (mut header, mut payload) = (*header, payload.to_vec());
    match flip.checked_sub(HEADER_LEN) {
        None => header[flip] ^= 0x80,
        Some(i) => payload[i] ^= 0x80,
    }
    assert!(
        !open(&key, &header, &payload, cuts, &sealed),
        "an altered frame passed"
    );
}

fuzz_target!(|data: &[u8]| {
    check_mac(data);
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
