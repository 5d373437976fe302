//! What a host's own TCP keeps in its sockets: with packets (`--mtu`), a datagram or
//! control frame offered behind a large TCP write waits only for TCP small queues' share
//! of it, as in Linux's qdisc, and the write is delayed by the datagram's own time.

use super::*;
use crate::net::transmission_ns;

/// Drives `port` until nothing is pending; the decisions by token.
fn decided(mut port: Port) -> Vec<Decision> {
    let mut out = Vec::new();
    while let Some(t) = port.poll_timeout() {
        while let Some(d) = port.poll_decision(t) {
            out.push(d);
        }
    }
    out.sort_by_key(|d| d.token);
    out
}

fn profile(mtu_bytes: Option<f64>) -> NetworkProfile {
    NetworkProfile {
        bandwidth_bps: Some(100e6),
        mtu_bytes,
        ..NetworkProfile::default()
    }
}

fn datagram(bytes: usize) -> FrameMeta {
    FrameMeta {
        reliable: false,
        ..FrameMeta::reliable(bytes, 9)
    }
}

/// 100 Mbit/s, 1,500-byte packets: a 160,000-byte write is 111 packets (167,326 bytes on
/// the wire, 13.386 ms); a 1,400-byte datagram 1,442 bytes (115 us). Offered together, the
/// datagram starts after the write's first 12,500 bytes (1 ms), and the 16,000-byte write
/// offered next starts after both, back to back.
#[test]
fn a_datagram_passes_the_tcp_bytes_still_in_the_socket_and_work_is_conserved() {
    let mut port = Port::egress(&profile(Some(1_500.0)), 0, 1);
    port.enqueue(0, 0, FrameMeta::reliable(160_000, 1));
    port.enqueue(0, 1, datagram(1_400));
    port.enqueue(0, 2, FrameMeta::reliable(16_000, 1));
    let d = decided(port);
    let tx = |bytes| transmission_ns(Some(100e6), bytes);
    assert_eq!((d[0].start, d[0].done), (0, tx(167_326)));
    assert_eq!(d[1].start, tx(12_500));
    assert_eq!(d[1].done, tx(12_500) + tx(1_442));
    assert_eq!(
        d[2].start,
        tx(167_326) + tx(1_442),
        "the datagram's time is not lost"
    );
}

/// A datagram arriving when only the share is left waits for the rest of it; one behind
/// other datagrams waits for them too (first in, first out among what the qdisc holds).
#[test]
fn a_datagram_waits_for_the_share_and_for_datagrams_ahead_of_it() {
    let mut port = Port::egress(&profile(Some(1_500.0)), 0, 1);
    let tx = |bytes| transmission_ns(Some(100e6), bytes);
    port.enqueue(0, 0, FrameMeta::reliable(160_000, 1));
    port.enqueue(0, 1, datagram(1_400));
    port.enqueue(0, 2, datagram(1_400));
    let late = tx(167_326) - tx(5_000);
    port.enqueue(late, 3, datagram(1_400));
    let d = decided(port);
    assert_eq!(d[2].start, d[1].done);
    // At `late` 5,000 bytes of the write are left, less than the share: no passing.
    assert_eq!(d[3].start, tx(167_326) + 2 * tx(1_442));
}

/// Without packets a frame is indivisible: the datagram waits for the whole write.
#[test]
fn without_packets_a_datagram_waits_for_the_whole_write() {
    let mut port = Port::egress(&profile(None), 0, 1);
    port.enqueue(0, 0, FrameMeta::reliable(160_000, 1));
    port.enqueue(0, 1, datagram(1_400));
    let d = decided(port);
    assert_eq!(d[1].start, d[0].done);
}
