//! The datagram path against hostile input: a loop (rank 0) whose peer's datagrams come
//! from a UDP socket this test holds, next to forged, replayed, truncated, stale and
//! misaddressed ones. Only the authentic, fresh datagrams reach the endpoint; every other
//! one is counted by its reason, and none ends the loop. A flood from a stranger is read a
//! budget at a time, so heartbeats keep going through it.

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};

use syncopate_core::net::RateConfig;
use syncopate_core::strategy::{Endpoint, ProtocolError, Rank};
use syncopate_core::wire::datagram::{datagram_keys, DatagramSealer, MAX_DATAGRAM_LEN};
use syncopate_core::wire::{Flags, FrameKind, Header};

use super::datagram::{DatagramPath, RECEIVE_BUDGET, RECEIVE_BUDGET_ALL};
use super::tests::{loopback_pair, test_keys, FinishWhen};
use super::udp_io;
use super::*;

/// Keeps the values of every data frame it is handed; refuses frames of step 99 (as an
/// endpoint refuses a frame of a step it has finished). Done after `wanted` frames.
struct Collector {
    slot: Vec<f32>,
    handed: Vec<(u64, Vec<f32>)>,
    wanted: usize,
}

impl Endpoint for Collector {
    fn poll_transmit(&mut self, _link: Rank, _out: &mut Vec<u8>) -> bool {
        false
    }

    fn recv_slot(&mut self, link: Rank, header: &Header) -> Result<&mut [f32], ProtocolError> {
        if header.step == 99 {
            return Err(ProtocolError::Unexpected {
                from: link,
                reason: "a finished step".into(),
            });
        }
        self.slot.resize(header.length as usize, 0.0);
        Ok(&mut self.slot)
    }

    fn handle_payload(&mut self, _link: Rank, header: &Header) -> Result<(), ProtocolError> {
        self.handed.push((header.step, self.slot.clone()));
        Ok(())
    }
}

/// A loss-tolerant Push of `values` copies of `value` from rank 1, sealed by `sealer`.
fn push(sealer: &mut DatagramSealer, step: u64, values: usize, value: f32) -> Vec<u8> {
    let mut header = Header::data(FrameKind::Push, step, 0, 0, values as u32);
    header.sender = 1;
    header.flags = Flags::class(0).loss_tolerant();
    sealed(sealer, header, &value.to_le_bytes().repeat(values))
}

fn sealed(sealer: &mut DatagramSealer, header: Header, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    sealer.seal_data(&mut out, &header, payload, 0);
    out
}

/// Runs rank 0's loop until it has handed `wanted` frames to its endpoint, after `send`
/// (given rank 1's UDP socket, a stranger's, rank 0's address and rank 1's datagram keys)
/// sent its datagrams: what was handed over (step, values, first value) and the counters.
fn receive(
    wanted: usize,
    send: impl FnOnce(&UdpSocket, &UdpSocket, SocketAddr, &LinkKeys),
) -> (Vec<(u64, usize, f32)>, DatagramReport) {
    let (tcp, mut peer_tcp) = loopback_pair();
    let mine = UdpSocket::bind("127.0.0.1:0").unwrap();
    let my_addr = mine.local_addr().unwrap();
    let peer_udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let peer_addr: SocketAddr = peer_udp.local_addr().unwrap();
    send(&peer_udp, &stranger, my_addr, &datagram_keys(&test_keys(1)));
    let peer = std::thread::spawn(move || {
        let goodbye = Header::control(FrameKind::Goodbye, 0).encode();
        peer_tcp.write_all(&goodbye).unwrap();
        let mut read = Vec::new();
        let _ = peer_tcp.read_to_end(&mut read);
    });

    let links = vec![Link {
        peer: 1,
        stream: tcp,
        keys: test_keys(0),
        datagram_addrs: vec![peer_addr],
    }];
    // The peer's goodbye on the TCP link goes untagged: these tests are about the datagrams.
    let options = CommOptions {
        frame_mac: false,
        datagram: Some(DatagramOptions {
            addrs: vec![my_addr.ip()],
            rate: RateConfig::default(),
        }),
        ..CommOptions::default()
    };
    let (mut comm, _waker) =
        CommLoop::new(links, options, Emulation::default(), vec![mine]).unwrap();
    let mut collector = Collector {
        slot: Vec::new(),
        handed: Vec::new(),
        wanted,
    };
    let done: fn(&Collector) -> bool = |c| c.handed.len() >= c.wanted;
    comm.run(&mut collector, &mut FinishWhen(done)).unwrap();
    let report = comm.datagram_report().unwrap();
    // The peer reads until the link closes.
    drop(comm);
    peer.join().unwrap();
    let handed = (collector.handed.iter())
        .map(|(step, v)| (*step, v.len(), v[0]))
        .collect();
    (handed, report)
}

/// The refusal counters: unknown address, truncated, bad MAC, replayed, stale, malformed,
/// oversized.
fn refusals(c: &DatagramCounters) -> [u64; 7] {
    [
        c.unknown_address,
        c.truncated,
        c.bad_mac,
        c.replayed,
        c.stale,
        c.malformed,
        c.oversized,
    ]
}

#[test]
fn only_authentic_fresh_datagrams_of_the_peer_reach_the_endpoint() {
    let (handed, report) = receive(3, |peer, stranger, to, keys| {
        // A sealer under rank 0's own sending key makes a reflection.
        let mut good = DatagramSealer::new(&keys.send);
        let mut reflected = DatagramSealer::new(&keys.recv);
        let first = push(&mut good, 0, 4, 1.0);
        let mut flipped = push(&mut good, 0, 4, 9.0);
        let last = flipped.len() - 20;
        flipped[last] ^= 1;
        let mut not_theirs = Header::data(FrameKind::Push, 0, 0, 0, 1);
        not_theirs.sender = 5;
        not_theirs.flags = Flags::class(0).loss_tolerant();
        let mut reliable = Header::data(FrameKind::Push, 0, 0, 0, 1);
        reliable.sender = 1;
        let hostile_then_good = [
            first[..10].to_vec(),                   // truncated
            flipped,                                // bad MAC
            push(&mut reflected, 0, 4, 9.0),        // bad MAC: the wrong direction's key
            first.clone(),                          // the first good one
            first,                                  // ...replayed
            push(&mut good, 99, 4, 9.0),            // stale: refused by the endpoint
            sealed(&mut good, not_theirs, &[0; 4]), // malformed: another sender
            sealed(&mut good, reliable, &[0; 4]),   // malformed: not loss-tolerant
            push(&mut good, 1, 4, 2.0),
            push(&mut good, 2, 3, 3.0),
            vec![0; MAX_DATAGRAM_LEN + 500], // oversized: refused by its length
        ];
        let stray = push(&mut DatagramSealer::new(&keys.send), 0, 4, 9.0);
        stranger.send_to(&stray, to).unwrap();
        for d in &hostile_then_good {
            peer.send_to(d, to).unwrap();
        }
    });
    assert_eq!(handed, [(0, 4, 1.0), (1, 4, 2.0), (2, 3, 3.0)]);
    let c = report.counters;
    assert_eq!(refusals(&c), [1, 1, 2, 1, 1, 2, 1], "{c:?}");
    assert_eq!(c.received, 4, "three handed over, one stale: {c:?}");
}

/// The batched path: one write with segmentation offload (GSO) carries equal-sized
/// datagrams, forged and replayed ones among the good, and the receiver (GRO where the
/// kernel coalesces) opens each on its own: the good ones are handed over, the others
/// counted, whatever their place in the batch.
#[test]
fn a_batched_write_with_hostile_datagrams_inside_hands_over_only_the_good() {
    let (handed, report) = receive(3, |peer, _, to, keys| {
        let mut good = DatagramSealer::new(&keys.send);
        let first = push(&mut good, 0, 4, 1.0);
        let mut forged = push(&mut good, 0, 4, 9.0);
        let last = forged.len() - 1;
        forged[last] ^= 1;
        let batch = [
            first.clone(),
            forged,
            first.clone(),
            push(&mut good, 1, 4, 2.0),
            push(&mut good, 99, 4, 9.0),
            push(&mut good, 2, 4, 3.0),
        ];
        let len = first.len();
        assert!(batch.iter().all(|d| d.len() == len), "one segment size");
        let bytes = batch.concat();
        if udp_io::enable_offloads(peer).gso {
            let segment = u16::try_from(len).ok();
            assert_eq!(
                udp_io::send(peer, &bytes, segment, to, 0).unwrap(),
                bytes.len()
            );
        } else {
            for d in &batch {
                peer.send_to(d, to).unwrap();
            }
        }
    });
    assert_eq!(handed, [(0, 4, 1.0), (1, 4, 2.0), (2, 4, 3.0)]);
    let c = report.counters;
    assert_eq!(refusals(&c), [0, 0, 1, 1, 1, 0, 0], "{c:?}");
}

/// Sends 1-byte datagrams from a stranger's socket to `to` as fast as one core can (batches
/// of 64 per system call) until `stop`; returns how many left.
fn flood(to: SocketAddr, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use rustix::net::{sendmmsg, MMsgHdr, SendAncillaryBuffer, SendFlags};
    use std::io::IoSlice;
    use std::sync::atomic::Ordering;
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    stranger.connect(to).unwrap();
    let byte = [0u8; 1];
    let iov = [IoSlice::new(&byte)];
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let mut controls: Vec<SendAncillaryBuffer> =
            (0..64).map(|_| SendAncillaryBuffer::default()).collect();
        let mut msgs: Vec<MMsgHdr> = controls.iter_mut().map(|c| MMsgHdr::new(&iov, c)).collect();
        // A full socket buffer on the other side drops them (ENOBUFS is not raised for UDP).
        if let Ok(n) = sendmmsg(&stranger, &mut msgs, SendFlags::empty()) {
            sent += n as u64;
        }
    }
    sent
}

#[test]
fn a_flood_of_datagrams_neither_stops_heartbeats_nor_the_peer_datagrams() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    const FLOOD: Duration = Duration::from_millis(1500);
    let (tcp, mut peer_tcp) = loopback_pair();
    let mine = UdpSocket::bind("127.0.0.1:0").unwrap();
    let my_addr = mine.local_addr().unwrap();
    let peer_udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let peer_addr = peer_udp.local_addr().unwrap();
    let keys = datagram_keys(&test_keys(1));
    let mut good = DatagramSealer::new(&keys.send);

    // The peer's side of the TCP link: its goodbye, then the time of every read (rank 0's
    // heartbeats) until the link closes.
    let peer = std::thread::spawn(move || {
        let goodbye = Header::control(FrameKind::Goodbye, 0).encode();
        peer_tcp.write_all(&goodbye).unwrap();
        let mut reads = Vec::new();
        let mut buf = [0u8; 4096];
        while matches!(peer_tcp.read(&mut buf), Ok(n) if n > 0) {
            reads.push(Instant::now());
        }
        reads
    });
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        std::thread::spawn(move || flood(my_addr, &stop))
    };
    let start = Instant::now();
    let loop_thread = std::thread::spawn(move || {
        let links = vec![Link {
            peer: 1,
            stream: tcp,
            keys: test_keys(0),
            datagram_addrs: vec![peer_addr],
        }];
        let mut options = CommOptions {
            frame_mac: false,
            datagram: Some(DatagramOptions {
                addrs: vec![my_addr.ip()],
                rate: RateConfig::default(),
            }),
            ..CommOptions::default()
        };
        options.liveness.heartbeat_ns = 10_000_000;
        let (mut comm, _waker) =
            CommLoop::new(links, options, Emulation::default(), vec![mine]).unwrap();
        let mut collector = Collector {
            slot: Vec::new(),
            handed: Vec::new(),
            wanted: 2,
        };
        let done: fn(&Collector) -> bool = |c| c.handed.len() >= c.wanted;
        comm.run(&mut collector, &mut FinishWhen(done)).unwrap();
        (collector.handed.len(), comm.datagram_report().unwrap())
    });
    std::thread::sleep(FLOOD);
    stop.store(true, Ordering::Relaxed);
    let flooded = flooder.join().unwrap();
    let end = Instant::now();
    // The peer's datagrams after the flood arrive once the socket has room again (in it, a
    // full socket buffer drops them, as the network would): fresh ones until two are in.
    let mut step = 1;
    while !loop_thread.is_finished() {
        assert!(
            end.elapsed() < Duration::from_secs(30),
            "the loop never took the peer's datagrams"
        );
        peer_udp
            .send_to(&push(&mut good, step, 4, 1.0), my_addr)
            .unwrap();
        step += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let (handed, report) = loop_thread.join().unwrap();
    let reads = peer.join().unwrap();

    assert!(handed >= 2);
    let c = report.counters;
    assert!(c.unknown_address > 10_000, "{flooded} sent, {c:?}");
    // Heartbeats every 10 ms throughout the flood: no silence of a third of it (a loaded
    // 2-core machine may hold a thread back for a while).
    let mut times: Vec<Instant> = vec![start];
    times.extend(reads.iter().filter(|t| **t > start && **t < end));
    times.push(end);
    let longest = times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        longest < FLOOD / 3,
        "rank 0 was silent for {longest:?} of a {FLOOD:?} flood ({flooded} datagrams sent, \
         {} counted)",
        c.unknown_address
    );
}

/// A datagram path on `mine` to one peer (rank 1) at `peer`, and an endpoint for it.
fn path_on(mine: UdpSocket, peer: SocketAddr, poll: &mio::Poll) -> (DatagramPath, Collector) {
    let links = [(1, test_keys(0), vec![peer])];
    let path = DatagramPath::new(
        vec![mine],
        &links,
        RateConfig::default(),
        1 << 20,
        poll.registry(),
        std::time::Instant::now(),
    );
    let collector = Collector {
        slot: Vec::new(),
        handed: Vec::new(),
        wanted: 0,
    };
    (path.unwrap(), collector)
}

#[test]
fn one_read_takes_at_most_its_budget_and_remembers_the_rest() {
    let mine = UdpSocket::bind("127.0.0.1:0").unwrap();
    let my_addr = mine.local_addr().unwrap();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let waiting = RECEIVE_BUDGET * 2 + 10;
    for _ in 0..waiting {
        stranger.send_to(&[0], my_addr).unwrap();
    }
    let poll = mio::Poll::new().unwrap();
    let (mut path, mut collector) = path_on(mine, "127.0.0.1:9".parse().unwrap(), &poll);
    let origin = std::time::Instant::now();
    let mut reads = Vec::new();
    loop {
        path.receive(0, &mut collector, origin).unwrap();
        reads.push(path.counters().0.unknown_address);
        if !path.has_backlog() {
            break;
        }
        assert_eq!(path.backlogged(), [0]);
    }
    let budget = RECEIVE_BUDGET as u64;
    let all = waiting as u64;
    assert_eq!(
        reads,
        [budget, 2 * budget, all],
        "datagrams counted after each read"
    );
    assert_eq!(
        path.take_heard().count(),
        0,
        "a stranger proves no peer alive"
    );
}

#[test]
fn the_peers_datagrams_are_read_in_long_runs_but_not_forever() {
    // Buffers grown as a job's are: a thousand datagrams fit.
    let options = DatagramOptions {
        addrs: vec![[127, 0, 0, 1].into()],
        rate: RateConfig::default(),
    };
    let mine = options.bind().unwrap().remove(0);
    let my_addr = mine.local_addr().unwrap();
    let granted = rustix::net::sockopt::socket_recv_buffer_size(&mine).unwrap();
    if granted < 4 << 20 {
        eprintln!("skipped: a {granted}-byte receive buffer holds too few datagrams (not root?)");
        return;
    }
    let peer_udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let keys = datagram_keys(&test_keys(1));
    let mut good = DatagramSealer::new(&keys.send);
    let waiting = RECEIVE_BUDGET_ALL + 10;
    for _ in 0..waiting {
        let d = push(&mut good, 0, 1, 1.0);
        udp_io::send(&peer_udp, &d, None, my_addr, 0).unwrap();
    }
    let poll = mio::Poll::new().unwrap();
    let (mut path, mut collector) = path_on(mine, peer_udp.local_addr().unwrap(), &poll);
    let origin = std::time::Instant::now();
    path.receive(0, &mut collector, origin).unwrap();
    assert_eq!(collector.handed.len(), RECEIVE_BUDGET_ALL);
    assert!(path.has_backlog());
    let heard: Vec<usize> = path.take_heard().collect();
    assert_eq!(heard, [0], "the peer's datagrams prove it alive");
    path.receive(0, &mut collector, origin).unwrap();
    assert_eq!(collector.handed.len(), waiting);
    assert!(!path.has_backlog());
}
