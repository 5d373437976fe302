use std::collections::VecDeque;

use proptest::prelude::*;

use super::*;
use crate::wire::HEADER_LEN;

/// Relays worker 0's `values` after `step` through every process of the job, frame by
/// frame in FIFO order, and returns what each rank installed.
fn broadcast(
    strategy: StrategyKind,
    workers: usize,
    servers: usize,
    relays: &mut [BufferRelay],
    step: u64,
    values: &[f32],
) -> Vec<Vec<(u64, Vec<f32>)>> {
    relays[0].handle_local(step, values);
    let mut wire: VecDeque<(Rank, Rank, Vec<u8>)> = VecDeque::new();
    loop {
        for (rank, relay) in relays.iter_mut().enumerate() {
            while let Some((to, frame)) = relay.poll_transmit() {
                assert!(
                    strategy.peers(workers, servers, rank).contains(&to),
                    "{strategy:?}: rank {rank} sends buffers to {to}, not one of its links"
                );
                wire.push_back((rank, to, frame));
            }
        }
        let Some((from, to, frame)) = wire.pop_front() else {
            break;
        };
        let raw: &[u8; HEADER_LEN] = frame[..HEADER_LEN].try_into().unwrap();
        let header = Header::decode(raw, u32::MAX).unwrap();
        relays[to]
            .handle_frame(from, &header, &frame[HEADER_LEN..])
            .unwrap();
    }
    relays
        .iter_mut()
        .map(|r| std::iter::from_fn(|| r.poll_delivered()).collect())
        .collect()
}

fn relays(strategy: StrategyKind, workers: usize, servers: usize, n: usize) -> Vec<BufferRelay> {
    (0..workers + servers)
        .map(|rank| {
            let route = BufferRoute::of(strategy, workers, servers, rank);
            let expected = route.installs.then_some(n);
            BufferRelay::new(route, expected)
        })
        .collect()
}

fn topology() -> impl Strategy<Value = (StrategyKind, usize, usize)> {
    (0..StrategyKind::ALL.len(), 1usize..10, 1usize..4).prop_map(|(s, workers, servers)| {
        let strategy = StrategyKind::ALL[s];
        let servers = if strategy.uses_servers() { servers } else { 0 };
        (strategy, workers, servers)
    })
}

proptest! {
    /// Every worker but worker 0 installs exactly worker 0's values, once per evaluation
    /// point and in step order, whatever the strategy's topology and however many frames
    /// the values take; servers install nothing.
    #[test]
    fn every_worker_installs_worker_0s_buffers(
        (strategy, workers, servers) in topology(),
        n in 1usize..(2 * BUFFER_CHUNK_ELEMS + 10),
        steps in proptest::collection::btree_set(0u64..1000, 1..3),
    ) {
        let mut relays = relays(strategy, workers, servers, n);
        for step in steps {
            let values: Vec<f32> = (0..n).map(|i| (i as f32).sin() + step as f32).collect();
            let got = broadcast(strategy, workers, servers, &mut relays, step, &values);
            for (rank, sets) in got.iter().enumerate() {
                if (1..workers).contains(&rank) {
                    prop_assert_eq!(sets.len(), 1, "rank {}", rank);
                    prop_assert_eq!(sets[0].0, step);
                    prop_assert!(sets[0].1 == values, "rank {} got other values", rank);
                } else {
                    prop_assert!(sets.is_empty(), "rank {} installs nothing", rank);
                }
            }
        }
    }
}

proptest! {
    /// Whatever a peer sends (any link, step, count, offset, length and payload), the relay
    /// answers without panicking, and whatever it delivers is a whole set of the model's
    /// count.
    #[test]
    fn hostile_buffers_frames_never_panic(
        frames in proptest::collection::vec(
            (0usize..4, 0u64..4, 0u32..40, 0u32..40, 0u32..40, 0usize..200),
            1..30,
        ),
    ) {
        let route = BufferRoute::of(StrategyKind::Allreduce, 4, 0, 2);
        let mut relay = BufferRelay::new(route, Some(20));
        for (link, step, total, offset, length, bytes) in frames {
            let header = Header::data(FrameKind::Buffers, step, total, offset, length);
            let _ = relay.handle_frame(link, &header, &vec![0; bytes]);
            while let Some((_, values)) = relay.poll_delivered() {
                prop_assert_eq!(values.len(), 20);
            }
        }
    }
}

#[test]
fn routes_follow_the_strategys_links() {
    let ps = BufferRoute::of(StrategyKind::P3, 3, 2, 3);
    assert_eq!(ps.from, Some(0));
    assert_eq!(ps.to, vec![1, 2]);
    assert!(!BufferRoute::of(StrategyKind::P3, 3, 2, 4).takes_part());
    let ring = BufferRoute::of(StrategyKind::Allreduce, 4, 0, 2);
    assert_eq!(
        (ring.from, ring.to, ring.installs),
        (Some(1), vec![3], true)
    );
    assert!(!BufferRoute::of(StrategyKind::Allreduce, 1, 0, 0).takes_part());
}

/// A frame of `length` values at `offset` of `total`, after `step`.
fn frame(step: u64, total: u32, offset: u32, length: u32) -> (Header, Vec<u8>) {
    let header = Header::data(FrameKind::Buffers, step, total, offset, length);
    (header, vec![0; 4 * length as usize])
}

#[test]
fn malformed_or_misrouted_buffers_are_refused() {
    let route = BufferRoute::of(StrategyKind::Allreduce, 3, 0, 1);
    let fresh = || BufferRelay::new(route.clone(), Some(10));
    let refused = |relay: &mut BufferRelay, link: Rank, (h, p): (Header, Vec<u8>)| {
        relay.handle_frame(link, &h, &p).is_err()
    };
    // From a link they are not relayed on.
    assert!(refused(&mut fresh(), 2, frame(0, 10, 0, 10)));
    // Another model's count, past the end, empty, too many.
    assert!(refused(&mut fresh(), 0, frame(0, 11, 0, 11)));
    assert!(refused(&mut fresh(), 0, frame(0, 10, 5, 6)));
    assert!(refused(&mut fresh(), 0, frame(0, 10, 0, 0)));
    let mut open = BufferRelay::new(route.clone(), None);
    let huge = MAX_BUFFER_ELEMS as u32 + 1;
    assert!(refused(&mut open, 0, frame(0, huge, 0, 1)));
    // A payload that is not `length` values.
    let (h, _) = frame(0, 10, 0, 10);
    assert!(fresh().handle_frame(0, &h, &[0; 8]).is_err());
    // Out of order: a gap, another step mid-set, a step already installed.
    let mut relay = fresh();
    assert!(refused(&mut relay, 0, frame(3, 10, 5, 5)));
    let mut relay = fresh();
    assert!(!refused(&mut relay, 0, frame(3, 10, 0, 5)));
    assert!(refused(&mut relay, 0, frame(4, 10, 5, 5)));
    let mut relay = fresh();
    assert!(!refused(&mut relay, 0, frame(3, 10, 0, 10)));
    assert_eq!(relay.poll_delivered().map(|d| d.0), Some(3));
    assert!(refused(&mut relay, 0, frame(3, 10, 0, 10)));
    assert!(!refused(&mut relay, 0, frame(4, 10, 0, 10)));
}
