//! The datagram path against hostile input: a loop (rank 0) whose peer's datagrams come
//! from a UDP socket this test holds, next to forged, replayed, truncated, stale and
//! misaddressed ones. Only the authentic, fresh datagrams reach the endpoint; every other
//! one is counted by its reason, and none ends the loop.

use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};

use syncopate_core::net::RateConfig;
use syncopate_core::strategy::{Endpoint, ProtocolError, Rank};
use syncopate_core::wire::datagram::{datagram_keys, DatagramSealer};
use syncopate_core::wire::{Flags, FrameKind, Header};

use super::tests::{loopback_pair, test_keys, FinishWhen};
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

#[test]
fn only_authentic_fresh_datagrams_of_the_peer_reach_the_endpoint() {
    let (tcp, mut peer_tcp) = loopback_pair();
    let mine = UdpSocket::bind("127.0.0.1:0").unwrap();
    let my_addr = mine.local_addr().unwrap();
    let peer_udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
    let peer_addr: SocketAddr = peer_udp.local_addr().unwrap();

    // Rank 1's datagram keys, and a sealer under rank 0's own sending key (a reflection).
    let keys = datagram_keys(&test_keys(1));
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
    ];
    let stray = push(&mut DatagramSealer::new(&keys.send), 0, 4, 9.0);
    stranger.send_to(&stray, my_addr).unwrap();
    for d in &hostile_then_good {
        peer_udp.send_to(d, my_addr).unwrap();
    }
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
    // The peer's goodbye on the TCP link goes untagged: this test is about the datagrams.
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
        wanted: 3,
    };
    let done: fn(&Collector) -> bool = |c| c.handed.len() >= c.wanted;
    comm.run(&mut collector, &mut FinishWhen(done)).unwrap();
    let report = comm.datagram_report().unwrap();
    // The peer reads until the link closes.
    drop(comm);
    peer.join().unwrap();

    let handed: Vec<(u64, usize, f32)> = (collector.handed.iter())
        .map(|(step, v)| (*step, v.len(), v[0]))
        .collect();
    assert_eq!(handed, [(0, 4, 1.0), (1, 4, 2.0), (2, 3, 3.0)]);
    let c = report.counters;
    assert_eq!(
        (
            c.unknown_address,
            c.truncated,
            c.bad_mac,
            c.replayed,
            c.stale,
            c.malformed
        ),
        (1, 1, 2, 1, 1, 2),
        "{c:?}"
    );
    assert_eq!(c.received, 4, "three handed over, one stale: {c:?}");
}
