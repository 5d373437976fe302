use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::wire::{FrameKind, DEFAULT_MAX_PAYLOAD};

fn frame_keys() -> LinkKeys {
    LinkKeys {
        send: FrameKey::new([1; 32]),
        recv: FrameKey::new([2; 32]),
    }
}

/// The sending end's sealer and the receiving end's opener of one direction.
fn direction() -> (DatagramSealer, DatagramOpener) {
    let mine = datagram_keys(&frame_keys());
    let theirs = datagram_keys(&frame_keys().reversed());
    (
        DatagramSealer::new(&mine.send),
        DatagramOpener::new(&theirs.recv),
    )
}

/// A data frame header for `values` f32s with every field set.
fn header(values: u32) -> Header {
    let mut h = Header::data(FrameKind::Push, 7, 3, 100, values);
    h.priority = -2;
    h.sequence = 99;
    h.sender = 4;
    h.flags = Flags::class(2).loss_tolerant().drop_eligible_if(true);
    h
}

fn payload(values: u32) -> Vec<u8> {
    (0..values * 4).map(|i| (i % 251) as u8).collect()
}

/// A sealed data datagram of `values` f32s, and its header and payload.
fn data_datagram(sealer: &mut DatagramSealer, values: u32) -> (Vec<u8>, Header, Vec<u8>) {
    let (h, p) = (header(values), payload(values));
    let mut out = Vec::new();
    sealer.seal_data(&mut out, &h, &p, 1_234_567);
    (out, h, p)
}

fn feedback() -> Feedback {
    Feedback {
        received: 10,
        highest_seq: 12,
        echo_sent_ns: 5_000_000,
        echo_held_ns: 250,
    }
}

#[test]
fn data_round_trips() {
    let (mut sealer, mut opener) = direction();
    let (first, h, p) = data_datagram(&mut sealer, 5);
    assert_eq!(first.len(), DATA_OVERHEAD + 20);
    let (second, ..) = data_datagram(&mut sealer, 0);
    assert_eq!(sealer.next_seq(), 2);
    let opened = opener.open(&first, DEFAULT_MAX_PAYLOAD);
    assert_eq!(
        opened,
        Ok(Opened::Data {
            header: h,
            payload: &p,
            seq: 0,
            sent_ns: 1_234_567
        })
    );
    match opener.open(&second, DEFAULT_MAX_PAYLOAD) {
        Ok(Opened::Data { seq, payload, .. }) => assert_eq!((seq, payload.len()), (1, 0)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn feedback_round_trips_in_the_same_sequence() {
    let (mut sealer, mut opener) = direction();
    let (data, ..) = data_datagram(&mut sealer, 1);
    let mut fb = Vec::new();
    sealer.seal_feedback(&mut fb, &feedback(), 42);
    assert_eq!(fb.len(), FEEDBACK_LEN);
    assert!(opener.open(&data, DEFAULT_MAX_PAYLOAD).is_ok());
    assert_eq!(
        opener.open(&fb, DEFAULT_MAX_PAYLOAD),
        Ok(Opened::Feedback {
            feedback: feedback(),
            seq: 1,
            sent_ns: 42
        })
    );
}

#[test]
fn sealing_appends_to_what_the_buffer_holds() {
    let (mut sealer, mut opener) = direction();
    let mut out = b"earlier".to_vec();
    sealer.seal_feedback(&mut out, &feedback(), 1);
    assert_eq!(&out[..7], b"earlier");
    assert!(opener.open(&out[7..], DEFAULT_MAX_PAYLOAD).is_ok());
}

#[test]
fn the_default_packet_fits_an_ethernet_frame() {
    assert_eq!(DATA_OVERHEAD, 84);
    assert_eq!(max_packet_bytes(DEFAULT_MTU), Some(1388));
    let values = 1388 / 4;
    let (datagram, ..) = data_datagram(&mut direction().0, values);
    assert_eq!(datagram.len(), 1472);
    assert_eq!(datagram.len() + IP_UDP_HEADERS, DEFAULT_MTU);
}

#[test]
fn max_packet_bytes_rounds_down_to_whole_values() {
    assert_eq!(max_packet_bytes(1501), Some(1388));
    assert_eq!(max_packet_bytes(1499), Some(1384));
    assert_eq!(max_packet_bytes(9000), Some(8888));
    assert_eq!(max_packet_bytes(116), Some(4));
    assert_eq!(max_packet_bytes(115), None);
    assert_eq!(max_packet_bytes(0), None);
}

#[test]
fn dscp_follows_class_and_drop_eligibility() {
    let expected = [46, 45, 44, 43, 42, 41, 40, 39];
    for (class, dscp) in (0u8..8).zip(expected) {
        assert_eq!(dscp_of(Flags::class(class)), dscp, "class {class}");
        assert_eq!(dscp_of(Flags::class(class).loss_tolerant()), dscp);
        let dropped = Flags::class(class).drop_eligible_if(true);
        assert_eq!(dscp_of(dropped), 8, "drop-eligible class {class}");
    }
    assert_eq!(dscp_of(Flags::class(200)), 39);
    assert_eq!(tos_of(Flags::class(0)), 46 << 2);
    assert_eq!(tos_of(Flags::class(0).drop_eligible_if(true)), 0x20);
}

#[test]
fn datagram_keys_mirror_and_differ_from_frame_keys() {
    let mine = datagram_keys(&frame_keys());
    let theirs = datagram_keys(&frame_keys().reversed());
    assert_eq!(theirs, mine.reversed());
    assert_ne!(mine.send, mine.recv);
    for key in [&mine.send, &mine.recv] {
        assert_ne!(key, &frame_keys().send);
        assert_ne!(key, &frame_keys().recv);
    }
    assert_ne!(frame_keys().send.derive("another purpose"), mine.send);
}

#[test]
fn other_directions_and_links_fail_the_tag() {
    let (mut sealer, _) = direction();
    let (datagram, ..) = data_datagram(&mut sealer, 3);
    let mine = datagram_keys(&frame_keys());
    // Reflected back to its sender.
    let reflected = DatagramOpener::new(&mine.recv).open(&datagram, DEFAULT_MAX_PAYLOAD);
    assert_eq!(reflected, Err(DropReason::BadMac));
    // Opened with the frame key it was derived from.
    let frame_key = DatagramOpener::new(&frame_keys().send).open(&datagram, DEFAULT_MAX_PAYLOAD);
    assert_eq!(frame_key, Err(DropReason::BadMac));
    let other_link = datagram_keys(&LinkKeys {
        send: FrameKey::new([4; 32]),
        recv: FrameKey::new([3; 32]),
    });
    let other = DatagramOpener::new(&other_link.recv).open(&datagram, DEFAULT_MAX_PAYLOAD);
    assert_eq!(other, Err(DropReason::BadMac));
}

#[test]
fn replays_are_refused_and_reordering_is_accepted() {
    let (mut sealer, mut opener) = direction();
    let sealed: Vec<Vec<u8>> = (0..4).map(|_| data_datagram(&mut sealer, 1).0).collect();
    let seq_of = |opened: Result<Opened<'_>, DropReason>| match opened {
        Ok(Opened::Data { seq, .. }) => Ok(seq),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    };
    for (i, expected) in [(2, Ok(2)), (0, Ok(0)), (2, Err(DropReason::Replayed))] {
        assert_eq!(
            seq_of(opener.open(&sealed[i], DEFAULT_MAX_PAYLOAD)),
            expected
        );
    }
    assert_eq!(seq_of(opener.open(&sealed[3], DEFAULT_MAX_PAYLOAD)), Ok(3));
    assert_eq!(seq_of(opener.open(&sealed[1], DEFAULT_MAX_PAYLOAD)), Ok(1));
    for datagram in &sealed {
        let again = opener.open(datagram, DEFAULT_MAX_PAYLOAD);
        assert_eq!(again, Err(DropReason::Replayed));
    }
}

#[test]
fn datagrams_older_than_the_window_are_refused() {
    let (mut sealer, mut opener) = direction();
    let (oldest, ..) = data_datagram(&mut sealer, 1);
    let (second, ..) = data_datagram(&mut sealer, 1);
    let mut newest = Vec::new();
    for _ in 2..=REPLAY_WINDOW_BITS {
        newest.clear();
        sealer.seal_feedback(&mut newest, &feedback(), 0);
    }
    // Seq 2048: seq 0 falls out of the window, seq 1 is its oldest.
    assert!(opener.open(&newest, DEFAULT_MAX_PAYLOAD).is_ok());
    assert_eq!(
        opener.open(&oldest, DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Replayed)
    );
    assert!(opener.open(&second, DEFAULT_MAX_PAYLOAD).is_ok());
}

#[test]
fn a_forged_datagram_does_not_move_the_window() {
    let (mut sealer, mut opener) = direction();
    let (genuine, ..) = data_datagram(&mut sealer, 1);
    let mut forged = genuine.clone();
    forged[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(
        opener.open(&forged, DEFAULT_MAX_PAYLOAD),
        Err(DropReason::BadMac)
    );
    assert_eq!(opener.window().highest(), None);
    assert!(opener.open(&genuine, DEFAULT_MAX_PAYLOAD).is_ok());
}

#[test]
fn truncation_at_every_length_is_refused() {
    let (mut sealer, _) = direction();
    let (data, ..) = data_datagram(&mut sealer, 9);
    let mut fb = Vec::new();
    sealer.seal_feedback(&mut fb, &feedback(), 3);
    for datagram in [&data, &fb] {
        for len in 0..datagram.len() {
            let opened = direction().1.open(&datagram[..len], DEFAULT_MAX_PAYLOAD);
            assert!(opened.is_err(), "cut to {len} bytes");
            if len < PREFIX_LEN + DATAGRAM_TAG_LEN {
                assert_eq!(opened, Err(DropReason::Truncated), "cut to {len} bytes");
            }
        }
        // Cut by a few bytes, a datagram says it is short of what it announces.
        let cut = &datagram[..datagram.len() - 3];
        assert_eq!(
            direction().1.open(cut, DEFAULT_MAX_PAYLOAD),
            Err(DropReason::Truncated)
        );
    }
}

#[test]
fn malformed_and_oversized_datagrams_are_classified() {
    let (mut sealer, _) = direction();
    let (data, ..) = data_datagram(&mut sealer, 4);
    let open = |bytes: &[u8], max| direction().1.open(bytes, max).map(|_| ());
    let with = |at: usize, byte: u8| {
        let mut d = data.clone();
        d[at] = byte;
        d
    };
    assert_eq!(
        open(&with(0, b'X'), DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Malformed)
    );
    assert_eq!(
        open(&with(2, DATAGRAM_VERSION + 1), DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Malformed)
    );
    assert_eq!(
        open(&with(3, 3), DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Malformed)
    );
    // The frame header's kind (offset 3 of the header): heartbeats carry no values.
    let heartbeat = with(PREFIX_LEN + 3, FrameKind::Heartbeat as u8);
    assert_eq!(
        open(&heartbeat, DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Malformed)
    );
    // A feedback type on a data body.
    assert_eq!(
        open(&with(3, 2), DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Malformed)
    );
    // A payload above the receiver's limit.
    assert_eq!(open(&data, 15), Err(DropReason::Oversized));
    assert!(open(&data, 16).is_ok());
    let mut extra = data.clone();
    extra.insert(PREFIX_LEN + HEADER_LEN, 0);
    assert_eq!(
        open(&extra, DEFAULT_MAX_PAYLOAD),
        Err(DropReason::Malformed)
    );
    let huge = vec![0u8; MAX_DATAGRAM_LEN + 1];
    assert_eq!(open(&huge, DEFAULT_MAX_PAYLOAD), Err(DropReason::Oversized));
}

#[test]
fn drop_reasons_are_named_and_counted() {
    let names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
    let expected = [
        "unknown_address",
        "truncated",
        "oversized",
        "malformed",
        "bad_mac",
        "replayed",
        "stale",
    ];
    assert_eq!(names, expected);
    let mut counters = DatagramCounters::default();
    for (i, reason) in DropReason::ALL.into_iter().enumerate() {
        for _ in 0..=i {
            counters.count_drop(reason);
        }
    }
    counters.sent = 100;
    assert_eq!(counters.drops(), 28);
    // Each reason's count sits in the field its name says.
    let text = toml::to_string(&counters).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    for (i, name) in expected.iter().enumerate() {
        assert_eq!(table[*name].as_integer(), Some(i as i64 + 1), "{name}");
    }
    assert_eq!(table.len(), 13);
    let mut total = counters;
    total.add(&counters);
    assert_eq!((total.drops(), total.sent, total.stale), (56, 200, 14));
    let back: DatagramCounters = toml::from_str(&text).unwrap();
    assert_eq!(back, counters);
}

#[test]
fn the_window_refuses_a_seq_too_far_back_after_a_jump() {
    let mut window = ReplayWindow::new();
    assert!(window.record(u64::MAX));
    assert!(!window.record(u64::MAX));
    assert!(!window.check(0));
    assert!(window.record(u64::MAX - (REPLAY_WINDOW_BITS - 1)));
    assert!(!window.check(u64::MAX - REPLAY_WINDOW_BITS));
}

/// The reference the window must match: every seq once, none older than the window.
fn model_accepts(seen: &HashSet<u64>, highest: Option<u64>, seq: u64) -> bool {
    !seen.contains(&seq) && highest.is_none_or(|h| seq > h || h - seq < REPLAY_WINDOW_BITS)
}

proptest! {
    #[test]
    fn the_window_matches_its_model(
        steps in prop::collection::vec((0u64..6000, any::<bool>()), 1..400)
    ) {
        let mut window = ReplayWindow::new();
        let (mut seen, mut highest) = (HashSet::new(), None::<u64>);
        for (seq, jump) in steps {
            // Now and then far ahead, so that whole windows are skipped.
            let seq = if jump { seq } else { seq / 8 };
            let expected = model_accepts(&seen, highest, seq);
            prop_assert_eq!(window.check(seq), expected, "check {}", seq);
            prop_assert_eq!(window.record(seq), expected, "record {}", seq);
            if expected {
                seen.insert(seq);
                highest = highest.max(Some(seq));
            }
        }
    }

    #[test]
    fn every_single_bit_flip_is_refused(
        values in 0u32..40,
        feedback_type in any::<bool>(),
        position in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let (mut sealer, mut opener) = direction();
        let mut datagram = if feedback_type {
            let mut fb = Vec::new();
            sealer.seal_feedback(&mut fb, &feedback(), 77);
            fb
        } else {
            data_datagram(&mut sealer, values).0
        };
        let at = position.index(datagram.len());
        datagram[at] ^= 1 << bit;
        prop_assert!(opener.open(&datagram, DEFAULT_MAX_PAYLOAD).is_err());
        prop_assert_eq!(opener.window().highest(), None);
    }

    #[test]
    fn any_bytes_are_refused_without_panicking(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        max_payload in any::<u32>(),
    ) {
        let (_, mut opener) = direction();
        prop_assert!(opener.open(&bytes, max_payload).is_err());
        // With a valid prefix written over it, the checks behind the prefix run too.
        let mut bytes = bytes;
        if bytes.len() >= PREFIX_LEN {
            let kind = 1 + bytes[3] % 2;
            bytes[..4].copy_from_slice(&[b'S', b'D', DATAGRAM_VERSION, kind]);
            prop_assert!(opener.open(&bytes, max_payload).is_err());
        }
        prop_assert_eq!(opener.window().highest(), None);
    }
}

#[test]
fn a_datagrams_dscp_gives_back_its_class_and_drop_eligibility() {
    for class in 0..8 {
        let flags = Flags::class(class).loss_tolerant();
        assert_eq!(class_of_dscp(dscp_of(flags)), (class, false));
        let eligible = flags.drop_eligible_if(true);
        assert_eq!(class_of_dscp(dscp_of(eligible)), (7, true));
    }
    assert_eq!(class_of_dscp(0), (0, false), "feedback: the control class");
}
