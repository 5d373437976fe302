//! DLCP over the core's datagram link: its packets paced, fed back and sealed by the link,
//! each datagram a packet of the network model.

use syncopate_core::net::RateConfig;
use syncopate_core::profile::{LayerProfile, ModelProfile};
use syncopate_core::strategy::StrategyKind;

use crate::{simulate, SimConfig, SimReport};

/// Values of a packet that fits one datagram (1,388 bytes).
const PACKET_ELEMS: usize = 347;

/// Three layers of 60,000 parameters, 1 ms of compute each way.
fn small_model() -> ModelProfile {
    ModelProfile {
        name: "small".into(),
        batch_size: None,
        layers: (0..3)
            .map(|i| LayerProfile {
                name: format!("layer{i}"),
                op: "test".into(),
                forward_ns: 1_000_000,
                backward_ns: 1_000_000,
                param_count: 60_000,
                tensors: Vec::new(),
            })
            .collect(),
    }
}

/// DLCP on 4 workers and 1 server, 100 Mbit/s and 50 us per path over `paths` paths with
/// `loss`, 4 steps; its packets as datagrams if `datagrams`.
fn dlcp(loss: f64, paths: usize, datagrams: bool, seed: u64) -> SimReport {
    let mut c = SimConfig::new(StrategyKind::Dlcp, 4, 1);
    c.network.bandwidth_bps = Some(100e6);
    c.network.latency_ns = 50_000;
    c.network.loss = loss;
    c.network.paths = paths;
    (c.steps, c.seed) = (4, seed);
    c.datagram = datagrams.then(RateConfig::default);
    // One datagram per packet, within a 1500-byte MTU (what --transport udp sizes).
    c.sync.dlcp.packet_elems = PACKET_ELEMS;
    match simulate(&small_model(), &c) {
        Ok(r) => r,
        Err(e) => panic!("simulation failed: {e}"),
    }
}

/// The least a step can take: the server's replies to all four workers (720 KB of values,
/// headers aside) through its 100 Mbit/s port, on `paths` paths.
fn floor_seconds(paths: usize) -> f64 {
    4.0 * 180_000.0 * 4.0 * 8.0 / (100e6 * paths as f64)
}

#[test]
fn dlcp_over_datagrams_completes_its_steps_under_loss_counted_and_deterministic() {
    let r = dlcp(0.05, 2, true, 1);
    let Some(d) = r.datagrams else {
        panic!("no datagram counters: {r:?}");
    };
    assert_eq!(r.step_seconds.len(), 4);
    // Every pushed packet of the four steps went as a datagram (the pulls are reliable
    // frames), and 5 % of them were lost.
    assert!(d.sent as usize > 4 * 4 * 180_000 / PACKET_ELEMS, "{d:?}");
    let lost = d.sent - d.received - d.drops();
    let share = lost as f64 / d.sent as f64;
    assert!((0.03..0.08).contains(&share), "{share} of {d:?}");
    assert!(r.network.frames_lost >= lost, "{:?} vs {lost}", r.network);
    assert!(d.feedback_sent > 0 && d.feedback_received > 0, "{d:?}");
    // The step is network-bound: above the server's serialisation, within a few times it
    // (the controllers start at 20 Mbit/s and probe upwards).
    let floor = floor_seconds(2);
    let step = r.mean_step_seconds;
    assert!(
        step > floor && step < 6.0 * floor,
        "{step} s against {floor} s"
    );
    // Worker 0's one link (to the server) reports each path's controller, as a job does.
    let [(peer, paths)] = r.datagram_rates.as_slice() else {
        panic!("worker 0's links: {:?}", r.datagram_rates);
    };
    assert_eq!((*peer, paths.len()), (4, 2));
    assert!(
        paths
            .iter()
            .all(|p| p.datagrams_sent > 0 && p.feedbacks > 0),
        "{paths:?}"
    );
    assert_eq!(dlcp(0.05, 2, true, 1), r, "same seed, same run");
    assert_ne!(
        dlcp(0.05, 2, true, 2).datagrams,
        r.datagrams,
        "another seed"
    );
}

#[test]
fn without_loss_every_datagram_arrives_and_frames_keep_their_old_road() {
    let r = dlcp(0.0, 1, true, 1);
    let Some(d) = r.datagrams else {
        panic!("no datagram counters");
    };
    assert_eq!((d.received, d.drops()), (d.sent, 0), "{d:?}");
    assert_eq!(r.network.frames_lost + r.network.frames_dropped, 0);
    let frames = dlcp(0.0, 1, false, 1);
    assert_eq!(
        (frames.datagrams, frames.datagram_rates.len()),
        (None, 0),
        "frames on the ports without the option"
    );
    let (a, b) = (r.mean_step_seconds, frames.mean_step_seconds);
    assert!(a > floor_seconds(1) && a < 3.0 * b, "{a} s against {b} s");
}

#[test]
fn datagrams_need_the_model_at_full_size() {
    let mut c = SimConfig::new(StrategyKind::Dlcp, 2, 1);
    c.datagram = Some(RateConfig::default());
    c.sync.dlcp.packet_elems = PACKET_ELEMS;
    assert!(c.validate().is_ok());
    c.scale = 0.5;
    let e = c.validate().map_err(|e| e.to_string());
    assert!(e.is_err_and(|e| e.contains("scale 1")));
    (c.scale, c.sync.dlcp.packet_elems) = (1.0, PACKET_ELEMS + 1);
    let e = c.validate().map_err(|e| e.to_string());
    assert!(e.is_err_and(|e| e.contains("does not fit one datagram")));
}

/// With packets (`--mtu 1500`) a full datagram (1,472 bytes of UDP payload) is one packet:
/// the port adds its headers once, so it is lost at the path's rate, not as two packets.
#[test]
fn with_packets_a_full_datagram_is_one_packet_lost_at_the_paths_rate() {
    let mut c = SimConfig::new(StrategyKind::Dlcp, 4, 1);
    c.network.bandwidth_bps = Some(100e6);
    c.network.loss = 0.02;
    c.network.mtu_bytes = Some(1_500.0);
    (c.steps, c.seed) = (4, 3);
    c.datagram = Some(RateConfig::default());
    c.sync.dlcp.packet_elems = PACKET_ELEMS;
    let r = match simulate(&small_model(), &c) {
        Ok(r) => r,
        Err(e) => panic!("simulation failed: {e}"),
    };
    let Some(d) = r.datagrams else {
        panic!("no datagram counters: {r:?}");
    };
    let lost = 1.0 - d.received as f64 / d.sent as f64;
    assert!((0.012..0.03).contains(&lost), "{lost}: {d:?}");
}
