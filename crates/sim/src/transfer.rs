//! Bulk transfers through the network model alone, no strategy and no compute: `flows`
//! senders each send `bytes` to one receiver as reliable (TCP-like) frames, each sender's
//! egress [`Port`] and (when the profile models it) the receiver's ingress port deciding
//! every frame. This is the model's half of the calibration ladder: the same transfers run
//! between network namespaces on the kernel's TCP (`scripts/calibrate-net.sh`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use syncopate_core::net::{Fate, FrameMeta, Nanos, NetCounters, NetworkProfile, Port};

/// One bulk transfer: who sends how much, in frames of what size.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferSpec {
    /// Senders, each with a flow of its own to the one receiver.
    pub flows: usize,
    /// Bytes each sender sends.
    pub bytes: u64,
    /// Bytes of a frame (the unit a sender hands the network, e.g. one socket write).
    pub frame_bytes: usize,
    /// The seed every loss draw derives from.
    pub seed: u64,
}

/// What a transfer took.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferReport {
    /// When the last byte of every flow had arrived, ns from the start.
    pub completion_ns: Nanos,
    /// Per flow, when its last byte arrived.
    pub flow_completion_ns: Vec<Nanos>,
    /// The senders' egress ports, summed.
    pub egress: NetCounters,
    /// The receiver's ingress port (zero without one).
    pub ingress: NetCounters,
}

/// Most frames one transfer may hand the model (a bound on a mistyped size).
const MAX_FRAMES: u64 = 50_000_000;

/// Runs `spec` over `profile`: every sender offers frames while its egress has room, the
/// decided frames reach the receiver's ingress port (if any) at their delivery times.
pub fn transfer(profile: &NetworkProfile, spec: &TransferSpec) -> Result<TransferReport, String> {
    if spec.flows == 0 || spec.frame_bytes == 0 || spec.bytes == 0 {
        return Err("a transfer needs at least one flow, one byte and frames of one byte".into());
    }
    let frames = spec.bytes.div_ceil(spec.frame_bytes as u64);
    if frames.saturating_mul(spec.flows as u64) > MAX_FRAMES {
        return Err(format!(
            "{} frames in all: more than the {MAX_FRAMES} a transfer may take; use larger frames",
            frames.saturating_mul(spec.flows as u64)
        ));
    }
    let receiver = spec.flows as u64;
    // Senders' NICs as workers' (`worker_bandwidth_bps`): the testbed shapes the receiver's.
    let nic = profile.worker_nic();
    let mut senders: Vec<Port> = (0..spec.flows)
        .map(|h| Port::egress(&nic, spec.seed, h as u64))
        .collect();
    let mut ingress = profile
        .ingress
        .then(|| Port::ingress(profile, spec.seed, receiver));
    let mut left: Vec<u64> = vec![spec.bytes; spec.flows];
    let mut done = vec![0; spec.flows];
    // Frames decided by a sender, arriving at the receiver's port: (time, token, flow, bytes).
    let mut arriving: BinaryHeap<Reverse<(Nanos, u64, usize, usize)>> = BinaryHeap::new();
    // Per token (frames numbered as offered): its bytes and its flow.
    let mut sent: Vec<(usize, usize)> = Vec::new();
    let mut now: Nanos = 0;
    loop {
        for (h, port) in senders.iter_mut().enumerate() {
            while left[h] > 0 && port.has_room(now) && port.flow_has_room(h as u64) {
                let bytes = left[h].min(spec.frame_bytes as u64) as usize;
                left[h] -= bytes as u64;
                let token = sent.len() as u64;
                sent.push((bytes, h));
                port.enqueue(now, token, frame(bytes, h, token));
            }
            while let Some((token, fate)) = port.poll_fate(now) {
                let Fate::Delivered { at, .. } = fate else {
                    return Err(format!("a reliable frame was given up: {fate:?}"));
                };
                let (bytes, _) = sent[token as usize];
                match ingress {
                    Some(_) => arriving.push(Reverse((at, token, h, bytes))),
                    None => done[h] = done[h].max(at),
                }
            }
        }
        if let Some(port) = ingress.as_mut() {
            while let Some(&Reverse((at, token, h, bytes))) = arriving.peek() {
                if at > now {
                    break;
                }
                arriving.pop();
                port.enqueue(at, token, frame(bytes, h, token));
            }
            while let Some(d) = port.poll_decision(now) {
                let Fate::Delivered { at, .. } = d.fate else {
                    return Err(format!("a reliable frame was given up: {:?}", d.fate));
                };
                if let Some(&(_, h)) = sent.get(d.token as usize) {
                    done[h] = done[h].max(at);
                }
            }
        }
        let next = next_event(&senders, &left, ingress.as_ref(), &arriving, now);
        match next {
            Some(t) => now = t.max(now),
            None => break,
        }
    }
    Ok(TransferReport {
        completion_ns: done.iter().copied().max().unwrap_or(0),
        flow_completion_ns: done,
        egress: senders.iter().fold(NetCounters::default(), |mut sum, p| {
            sum.add(&p.counters());
            sum
        }),
        ingress: ingress.map(|p| p.counters()).unwrap_or_default(),
    })
}

/// A reliable frame of `bytes` on flow `h`, identified by its token for the loss draws.
fn frame(bytes: usize, h: usize, token: u64) -> FrameMeta {
    FrameMeta {
        identity: Some(syncopate_core::net::FrameIdentity {
            step: 0,
            packet: token,
        }),
        ..FrameMeta::reliable(bytes, h as u64)
    }
}

/// The next instant anything is due: a sender's decision or room, an arrival, or the
/// receiver's decision; `None` when all is delivered.
fn next_event(
    senders: &[Port],
    left: &[u64],
    ingress: Option<&Port>,
    arriving: &BinaryHeap<Reverse<(Nanos, u64, usize, usize)>>,
    now: Nanos,
) -> Option<Nanos> {
    let rooms = (senders.iter().zip(left))
        .enumerate()
        .filter(|(_, (_, &l))| l > 0)
        .map(|(h, (p, _))| match p.flow_has_room(h as u64) {
            true => p.room_at(now),
            false => p.flow_room_at(now).unwrap_or_else(|| p.room_at(now)),
        });
    let fates = senders.iter().filter_map(Port::poll_timeout);
    let arrivals = arriving.peek().map(|Reverse((t, ..))| *t);
    let receiver = ingress.and_then(Port::poll_timeout);
    rooms.chain(fates).chain(arrivals).chain(receiver).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(flows: usize, bytes: u64) -> TransferSpec {
        TransferSpec {
            flows,
            bytes,
            frame_bytes: 65_536,
            seed: 1,
        }
    }

    #[test]
    fn a_lossless_flow_takes_its_bytes_over_the_rate() {
        let profile = NetworkProfile {
            bandwidth_bps: Some(1e8),
            latency_ns: 50_000,
            ..NetworkProfile::default()
        };
        let r = transfer(&profile, &spec(1, 10_000_000)).map_err(|e| e.to_string());
        let r = r.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.completion_ns, 800_000_000 + 50_000);
    }

    #[test]
    fn an_incast_shares_the_receivers_port() {
        let profile = NetworkProfile {
            bandwidth_bps: Some(1e8),
            ingress: true,
            ..NetworkProfile::default()
        };
        let r = transfer(&profile, &spec(4, 2_500_000)).unwrap_or_else(|e| panic!("{e}"));
        // 10 MB through one 100 Mbit/s port: 0.8 s, give or take a frame.
        let s = r.completion_ns as f64 * 1e-9;
        assert!((0.79..0.82).contains(&s), "{s} s");
    }

    #[test]
    fn nothing_to_send_is_refused() {
        let profile = NetworkProfile::default();
        assert!(transfer(&profile, &spec(0, 1)).is_err());
        assert!(transfer(&profile, &spec(1, 0)).is_err());
    }
}
