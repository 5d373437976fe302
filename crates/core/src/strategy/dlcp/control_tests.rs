use proptest::prelude::*;

use super::*;

/// A control header about share `(step, key, offset, sequence)`.
fn about(step: u64, key: u32, offset: u32, sequence: u64) -> Header {
    let mut h = Header::data(FrameKind::Missing, step, key, offset, 0);
    h.sequence = sequence;
    h
}

fn missing_of(q: &ControlQueue) -> Vec<(Header, Vec<u32>)> {
    q.pending()
        .filter(|c| c.header.kind == FrameKind::Missing)
        .map(|c| (c.header, c.words.clone()))
        .collect()
}

#[test]
fn a_second_missing_for_a_share_replaces_the_first_in_place() {
    let mut q = ControlQueue::default();
    q.push_missing(about(3, 1, 0, 0), vec![0b111]);
    q.push_stop(about(3, 2, 0, 0));
    q.push_missing(about(3, 1, 0, 0), vec![0b100, 1]);
    let pending: Vec<&Control> = q.pending().collect();
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[0].header.kind, FrameKind::Missing);
    assert_eq!(pending[0].words, vec![0b100, 1], "the latest bitmap");
    assert_eq!(
        (pending[0].header.length, pending[0].header.payload_len),
        (2, 8)
    );
    assert_eq!(pending[1].header.kind, FrameKind::Stop);
}

#[test]
fn other_shares_chunks_phases_and_steps_keep_their_own_missing() {
    let mut q = ControlQueue::default();
    for h in [
        about(3, 1, 0, 0),
        about(4, 1, 0, 0),
        about(3, 2, 0, 0),
        about(3, 1, 1, 0),
        about(3, 1, 0, 1),
    ] {
        q.push_missing(h, vec![1]);
    }
    assert_eq!(missing_of(&q).len(), 5);
}

#[test]
fn a_stop_drops_the_pending_missing_and_blocks_a_new_one() {
    let mut q = ControlQueue::default();
    q.push_missing(about(0, 0, 0, 0), vec![1]);
    q.push_stop(about(0, 0, 0, 0));
    q.push_missing(about(0, 0, 0, 0), vec![1]);
    let kinds: Vec<FrameKind> = q.pending().map(|c| c.header.kind).collect();
    assert_eq!(kinds, vec![FrameKind::Stop]);
    let mut out = Vec::new();
    assert!(q.encode_next(&mut out));
    assert!(q.is_empty() && !q.encode_next(&mut out));
}

proptest! {
    /// Any sequence of probes' answers (never read) leaves at most one Missing per share,
    /// carrying the bitmap of the share's latest answer.
    #[test]
    fn at_most_one_missing_per_share_with_the_latest_bitmap(
        answers in proptest::collection::vec((0u64..3, 0u32..3, 0u32..2, any::<u32>()), 0..200)
    ) {
        let mut q = ControlQueue::default();
        let mut latest = std::collections::BTreeMap::new();
        for &(step, key, chunk, word) in &answers {
            q.push_missing(about(step, key, chunk, 0), vec![word]);
            latest.insert((step, key, chunk), word);
        }
        let queued = missing_of(&q);
        prop_assert_eq!(queued.len(), latest.len());
        for (h, words) in queued {
            prop_assert_eq!(Some(&words[0]), latest.get(&(h.step, h.key, h.offset)));
        }
    }
}
