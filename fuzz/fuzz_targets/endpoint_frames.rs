//! Fuzzes the sans-IO strategy state machines (`RingAllReduce`, `PsWorker`, `PsServer`,
//! `ChainPass` for ring reduce and step-wise averaging, `DlcpWorker` and `DlcpServer` with a
//! loss bound of 0, so that their values are P3's, and `DlcpRing` with a loss bound of 0) with
//! hostile peers: no sequence of frames, however malformed, duplicated, reordered or forged,
//! may make an endpoint panic. Refusing a frame with a `ProtocolError` is fine.
//!
//! It also checks the data: every worker hands the same gradient (or weights) every step, so
//! every average a worker receives must be that input (gradient and weight averages), or,
//! under parameter servers, the parameters after the step's update, computed here as the
//! server computes them. The check holds as long as no frame the cluster did not send
//! honestly (forged, raw, with flipped bytes, reordered, or copied onto another link) was
//! written into an endpoint: content is authenticated above the core (the frame MAC), so a
//! forged frame that passes every protocol check may change values. Dropped and duplicated
//! frames never may (a duplicate added twice was a real bug).
//!
//! The input first picks a small job (ring all-reduce, or parameter servers with 1-2 servers;
//! 1-4 workers; 1-4 keys of 1-300 values; slice, bucket and segment sizes; overlap; scheduler;
//! maximum payload), then a sequence of operations on an in-process cluster of honest
//! endpoints joined by per-link frame queues:
//!
//! * the training loop of a worker does its next local step, as
//!   `crates/runtime/src/worker/step_loop/` does: `begin_step`, `handle_gradient` for each
//!   key (last layer first), `handle_backward_done`, and `begin_step(step + 1)` once
//!   `StepDone` has been seen;
//! * an endpoint transmits (`poll_transmit` to any rank, or `poll_transmit_any` over its peers);
//! * a link delivers its next frame the way `crates/runtime/src/comm/reader.rs` reads one: decode the
//!   header with the job's maximum payload, and for a data frame call `recv_slot`, copy the
//!   payload into the slot (the slot must hold exactly `header.length` values), and call
//!   `handle_payload` either at once or after other operations (a frame read in several parts
//!   calls `recv_slot` again on every read);
//! * a hostile peer forges a frame (a header seen on the wire or built from scratch, with
//!   fields changed), sends 48 raw bytes, flips bytes of a queued frame, or drops, duplicates
//!   or reorders queued frames;
//! * a "pump" lets the honest cluster make progress for a while, so that deep protocol states
//!   (later steps, early frames of the next step, credit windows) are cheap to reach.
//!
//! Events are drained after every operation and `take_values` is called for every key an
//! event names. Errors are ignored and the cluster keeps going (refusals must leave the
//! endpoint unchanged), so a reproducer may need a look at whether the runtime, which stops
//! at the first protocol error, could reach the same state.
//!
//! `SYNCOPATE_FUZZ_TRACE=1` makes the target print what the cluster does (run it on one input
//! to read a reproducer). Inputs that once failed, with what they found, are kept in
//! `fuzz/artifacts-kept/endpoint_frames/`.
//!
//! On stable Rust (no nightly needed), from the repository root (the parent of `fuzz/`):
//!
//! ```sh
//! cargo install cargo-fuzz --locked
//! RUSTC_BOOTSTRAP=1 cargo fuzz run endpoint_frames -- -max_total_time=300
//! ```
#![no_main]

use std::collections::VecDeque;

mod values;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use syncopate_core::buffers::{BufferRelay, BufferRoute, BUFFER_CHUNK_ELEMS};
use syncopate_core::optim::{LrSchedule, Sgd, SgdConfig};
use syncopate_core::registry::{KeyInfo, Placement, TensorRegistry};
use syncopate_core::sched::SchedulerKind;
use syncopate_core::strategy::{
    DlcpOptions, Endpoint, PsServer, PsWorker, Rank, RingAllReduce, ServerOptim, ServerSync,
    StepwiseHead, StrategyKind, SyncPlan, WorkerEvent, WorkerSync,
};
use syncopate_core::wire::{
    f32_bytes_mut, Flags, FrameKind, Header, DEFAULT_MAX_PAYLOAD, HEADER_LEN,
};
use values::{Expect, ServerModel, BASE_LR};

/// Most operations one input may run (keeps every input fast).
const MAX_OPS: usize = 3_000;
/// Largest payload a forged frame carries (the rest of its slot keeps its old values).
const MAX_FORGED_PAYLOAD: usize = 4 * 1024;

/// Every frame kind the wire knows, found by decoding every possible kind byte, so a kind
/// added to `FrameKind` is forged from the day it exists.
fn all_kinds() -> &'static [FrameKind] {
    static KINDS: std::sync::OnceLock<Vec<FrameKind>> = std::sync::OnceLock::new();
    KINDS.get_or_init(|| {
        let mut raw = Header::control(FrameKind::Control, 0).encode();
        let kinds: Vec<FrameKind> = (0..=u8::MAX)
            .filter_map(|byte| {
                raw[3] = byte;
                Header::decode(&raw, 0).ok().map(|h| h.kind)
            })
            .collect();
        assert!(
            kinds.contains(&FrameKind::Buffers),
            "decoding every kind byte found only {kinds:?}"
        );
        kinds
    })
}

/// The kinds whose payload is `length` values: data frames and the buffers beside them.
fn value_kinds() -> &'static [FrameKind] {
    static KINDS: std::sync::OnceLock<Vec<FrameKind>> = std::sync::OnceLock::new();
    KINDS.get_or_init(|| {
        all_kinds()
            .iter()
            .copied()
            .filter(|k| k.carries_values())
            .collect()
    })
}

/// Largest payload of a buffers frame the reader takes, whatever the job's maximum.
const BUFFERS_MAX_PAYLOAD: u32 = 4 * BUFFER_CHUNK_ELEMS as u32;

/// Whether to print what the cluster does (`SYNCOPATE_FUZZ_TRACE=1`, for reading a reproducer).
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SYNCOPATE_FUZZ_TRACE").is_some())
}

macro_rules! trace {
    ($($arg:tt)*) => {
        if tracing() {
            eprintln!($($arg)*);
        }
    };
}

/// A `u64` for a forged field: mostly an edge value (one input byte), sometimes any value.
fn wild_u64(u: &mut Unstructured) -> Result<u64> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => u64::MAX,
        1 => u64::MAX - 1,
        2 => i64::MAX as u64,
        3 => 1 << 63,
        4 => u64::from(u32::MAX),
        5 => u64::from(u32::MAX) + 1,
        _ => u.arbitrary()?,
    })
}

/// A `u32` for a forged field: mostly an edge value, sometimes any value.
fn wild_u32(u: &mut Unstructured) -> Result<u32> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => u32::MAX,
        1 => u32::MAX - 1,
        2 => i32::MAX as u32,
        3 => 1 << 31,
        4 => u32::MAX / 4,
        5 => u32::MAX / 4 + 1,
        _ => u.arbitrary()?,
    })
}

/// A frame on a link, and whether the cluster sent it as it is (a duplicate of one included).
struct Queued {
    bytes: Vec<u8>,
    honest: bool,
}

/// One directed link: frames (header and payload) in the order they will be read.
struct Link {
    from: Rank,
    to: Rank,
    queue: VecDeque<Queued>,
    /// A data frame whose header has been read and whose payload is being read: `recv_slot`
    /// has been called, `handle_payload` not yet; and whether it is honest.
    partial: Option<(Header, bool)>,
}

/// What the training thread of one worker has done in its current step.
struct TrainLoop {
    begun: bool,
    step: u64,
    to_hand: Vec<usize>,
    backward_done: bool,
    step_done: bool,
}

struct Cluster {
    workers: Vec<Box<dyn WorkerSync>>,
    servers: Vec<Box<dyn ServerSync + Send>>,
    n: usize,
    sizes: Vec<usize>,
    /// Slices of the parameter-server registry `(key, offset, len)` (empty for the ring).
    slices: Vec<(usize, usize, usize)>,
    loops: Vec<TrainLoop>,
    links: Vec<Link>,
    peers: Vec<Vec<Rank>>,
    /// Headers of frames the honest endpoints sent: material for forgeries.
    seen: Vec<Header>,
    max_payload: u32,
    grad: Vec<f32>,
    expect: Expect,
    /// Every process's part in relaying worker 0's buffers (batch-norm statistics).
    relays: Vec<BufferRelay>,
    /// Buffer values worker 0 sends at an evaluation point.
    buffer_len: usize,
    /// The step of the last set of buffers worker 0 sent.
    buffers_sent: Option<u64>,
    /// Whether a frame that was not sent honestly has been written into an endpoint (the
    /// data check is off from then on).
    tainted: bool,
}

/// A DLCP loss bound: 0 (every packet needed), 1 %, 10 %, the largest allowed (50 %), or any
/// in between, in parts per million.
fn loss_bound(u: &mut Unstructured) -> Result<f64> {
    Ok(match u.int_in_range(0u8..=4)? {
        0 => 0.0,
        1 => 0.01,
        2 => 0.1,
        3 => 0.5,
        _ => f64::from(u.int_in_range(0u32..=500_000)?) / 1e6,
    })
}

/// DLCP's settings, loss bounds of pushes and pulls (or reduce-scatter and all-gather
/// hops) included.
fn dlcp_options(u: &mut Unstructured) -> Result<DlcpOptions> {
    let opts = DlcpOptions {
        loss_bound: loss_bound(u)?,
        pull_loss_bound: loss_bound(u)?,
        packet_elems: u.int_in_range(1..=64)?,
        fill: *u.choose(&syncopate_core::strategy::LossFill::ALL)?,
        drop_quantile: *u.choose(&[0.0, 0.5, 1.0])?,
        priority: u.arbitrary()?,
        spray: u.arbitrary()?,
        whole_slices: u.arbitrary()?,
        control_datagrams: u.arbitrary()?,
    };
    trace!("dlcp: {opts:?}");
    Ok(opts)
}

/// The value worker 0's buffer entry `i` has at the evaluation point after `step`.
fn buffer_value(step: u64, i: usize) -> f32 {
    (i % 1000) as f32 * 0.25 + (step % 1000) as f32
}

impl Cluster {
    fn build(u: &mut Unstructured) -> Result<Self> {
        let ps = u.arbitrary::<bool>()?;
        let n: usize = u.int_in_range(1..=4)?;
        let servers: usize = if ps { u.int_in_range(1..=2)? } else { 0 };
        let nkeys: usize = u.int_in_range(1..=4)?;
        let mut keys = Vec::with_capacity(nkeys);
        let mut layer = 0;
        for k in 0..nkeys {
            // Weight and bias share a layer now and then.
            if k > 0 && u.arbitrary::<bool>()? {
                layer += 1;
            }
            keys.push(KeyInfo {
                numel: u.int_in_range(1..=300)?,
                layer,
            });
        }
        let sizes: Vec<usize> = keys.iter().map(|k| k.numel).collect();
        let max_numel = sizes.iter().copied().max().unwrap_or(0);
        let grad: Vec<f32> = (0..max_numel)
            .map(|i| (i % 17) as f32 * 0.125 - 1.0)
            .collect();
        let buffer_len = *u.choose(&[0, 1, 7, 300, BUFFER_CHUNK_ELEMS + 5])?;
        let overlap = u.arbitrary::<bool>()?;
        let scheduler = *u.choose(&SchedulerKind::ALL)?;
        let max_payload = if u.arbitrary::<bool>()? {
            DEFAULT_MAX_PAYLOAD
        } else {
            u.int_in_range(0..=2048)?
        };
        let mut workers: Vec<Box<dyn WorkerSync>> = Vec::new();
        let mut server_eps = Vec::new();
        let mut slices = Vec::new();
        let mut expect = Expect::Input(grad.clone());
        let strategy = if ps {
            let slice_len: usize = u.int_in_range(1..=128)?;
            let placement = if u.arbitrary::<bool>()? {
                Placement::SlicesRoundRobin
            } else {
                Placement::KeysByBytes
            };
            let credit: usize = u.int_in_range(0..=2048)?;
            let schedule = match u.int_in_range(0..=2)? {
                0 => LrSchedule::Constant,
                1 => LrSchedule::Step {
                    every_steps: u.int_in_range(0..=4)?,
                    gamma: 0.5,
                },
                _ => LrSchedule::Cosine {
                    total_steps: u.int_in_range(0..=8)?,
                    min_lr: 0.0,
                },
            };
            let sgd_config = SgdConfig {
                momentum: 0.9,
                weight_decay: 1e-3,
            };
            let optim = ServerOptim {
                sgd: Sgd::new(sgd_config),
                lr: BASE_LR,
                schedule,
            };
            // DLCP (with loss bounds on pushes and pulls) or ps.
            let dlcp = if u.ratio(1, 3)? {
                Some(dlcp_options(u)?)
            } else {
                None
            };
            let plan = dlcp.map(|opts| SyncPlan {
                slice_params: slice_len,
                dlcp: opts,
                ..SyncPlan::new(StrategyKind::Dlcp, n, servers)
            });
            let reg = match &plan {
                Some(plan) => plan.registry(keys.clone()),
                None => TensorRegistry::new(keys.clone(), slice_len, servers, placement),
            };
            slices = reg
                .slices()
                .iter()
                .map(|s| (s.key, s.offset, s.len))
                .collect();
            let init: Vec<Vec<f32>> = sizes
                .iter()
                .map(|&len| (0..len).map(|i| i as f32 * 0.01).collect())
                .collect();
            expect = Expect::ServerUpdate(Box::new(ServerModel::new(
                sgd_config,
                schedule,
                n,
                grad.clone(),
                init.clone(),
            )));
            if let Some(plan) = &plan {
                for r in n..n + servers {
                    let server = plan.server_endpoint(r, keys.clone(), init.clone(), optim);
                    server_eps.push(
                        server.map_err(|_| libfuzzer_sys::arbitrary::Error::IncorrectFormat)?,
                    );
                }
                for r in 0..n {
                    workers.push(plan.worker_endpoint(r, keys.clone()));
                }
                StrategyKind::Dlcp
            } else {
                for i in 0..servers {
                    server_eps.push(Box::new(PsServer::new(
                        i,
                        n,
                        reg.clone(),
                        init.clone(),
                        optim,
                        scheduler,
                    )) as Box<dyn ServerSync + Send>);
                }
                for r in 0..n {
                    workers.push(Box::new(PsWorker::new(
                        r,
                        n,
                        reg.clone(),
                        overlap,
                        scheduler,
                        credit,
                    )));
                }
                if overlap {
                    StrategyKind::Ps
                } else {
                    StrategyKind::PsNoOverlap
                }
            }
        } else if u.ratio(1, 3)? {
            // DLCP over the ring, with loss bounds on the reduce-scatter and all-gather hops.
            let plan = SyncPlan {
                bucket_bytes: 4 * u.int_in_range(1..=600)?,
                dlcp: dlcp_options(u)?,
                ..SyncPlan::new(StrategyKind::DlcpAllreduce, n, 0)
            };
            for r in 0..n {
                workers.push(plan.worker_endpoint(r, keys.clone()));
            }
            StrategyKind::DlcpAllreduce
        } else if u.ratio(1, 2)? {
            // The chain strategies and the weight-averaging ones (local SGD, gossip, step-wise
            // with a period), built as every driver builds them: with every worker handing
            // over the same values, every average is those values.
            let strategy = *u.choose(&[
                StrategyKind::RingReduce,
                StrategyKind::Stepwise,
                StrategyKind::LocalSgd,
                StrategyKind::Gossip,
            ])?;
            let defaults = SyncPlan::new(strategy, n, 0);
            let info = strategy.info();
            let plan = SyncPlan {
                scheduler,
                bucket_bytes: 4 * u.int_in_range(1..=600)?,
                chain_segment_elems: u.int_in_range(1..=128)?,
                frame_elems: u.int_in_range(1..=512)?,
                stepwise_head: if info.stepwise_settings {
                    *u.choose(&StepwiseHead::ALL)?
                } else {
                    defaults.stepwise_head
                },
                full_sync_every: if info.full_syncs {
                    u.int_in_range(0..=3)?
                } else {
                    0
                },
                average_every: if info.average_every > 0 {
                    u.int_in_range(1..=3)?
                } else {
                    0
                },
                ..defaults
            };
            for r in 0..n {
                workers.push(plan.worker_endpoint(r, keys.clone()));
            }
            strategy
        } else {
            let bucket: usize = u.int_in_range(1..=600)?;
            let segment: usize = u.int_in_range(1..=128)?;
            // Small buckets shared whole (none, some or all of them).
            let direct: usize = *u.choose(&[0, 100, 400, 1000, usize::MAX])?;
            for r in 0..n {
                workers.push(Box::new(
                    RingAllReduce::new(r, n, keys.clone(), bucket, segment, overlap, scheduler)
                        .with_direct_below(direct),
                ));
            }
            StrategyKind::Allreduce
        };
        trace!(
            "job: {strategy:?} workers {n} servers {servers} keys {keys:?} overlap {overlap} \
             scheduler {scheduler:?} max_payload {max_payload}"
        );
        let total = n + servers;
        let mut links = Vec::new();
        for from in 0..total {
            for to in 0..total {
                if from != to {
                    links.push(Link {
                        from,
                        to,
                        queue: VecDeque::new(),
                        partial: None,
                    });
                }
            }
        }
        let peers = (0..total).map(|r| strategy.peers(n, servers, r)).collect();
        let relays = (0..total)
            .map(|r| {
                let route = BufferRoute::of(strategy, n, servers, r);
                BufferRelay::new(route, (r < n).then_some(buffer_len))
            })
            .collect();
        Ok(Self {
            workers,
            servers: server_eps,
            n,
            loops: (0..n)
                .map(|_| TrainLoop {
                    begun: false,
                    step: 0,
                    to_hand: (0..sizes.len()).rev().collect(),
                    backward_done: false,
                    step_done: false,
                })
                .collect(),
            sizes,
            slices,
            links,
            peers,
            seen: Vec::new(),
            max_payload,
            grad,
            expect,
            relays,
            buffer_len,
            buffers_sent: None,
            tainted: false,
        })
    }

    /// Whether the job has lost a packet: a server or worker filled in a value, or kept a
    /// stale one, for want of a packet (see `values.rs`).
    fn lossy(&self) -> bool {
        let lost = |s: Option<syncopate_core::strategy::LossStats>| {
            s.is_some_and(|s| s.entries_filled > 0 || s.entries_stale > 0)
        };
        self.workers.iter().any(|w| lost(w.loss_stats()))
            || self.servers.iter().any(|s| lost(s.loss_stats()))
    }

    /// Checks the values worker `w` received for `key`, unless a dishonest frame got in.
    fn check_values(&mut self, w: usize, key: usize, values: &[f32]) {
        if self.tainted {
            return;
        }
        let step = self.loops[w].step;
        let lossy = self.lossy();
        let len = self.sizes[key];
        self.expect.check(w, (step, key, len), values, lossy);
    }

    fn total(&self) -> usize {
        self.n + self.servers.len()
    }

    fn ep(&mut self, rank: Rank) -> &mut dyn Endpoint {
        if rank < self.n {
            self.workers[rank].as_mut()
        } else {
            self.servers[rank - self.n].as_mut()
        }
    }

    fn link_index(&self, from: Rank, to: Rank) -> Option<usize> {
        self.links.iter().position(|l| l.from == from && l.to == to)
    }

    /// The training loop of worker `w` does its next local step (if it has one).
    fn local(&mut self, w: usize) {
        let l = &mut self.loops[w];
        if !l.begun {
            l.begun = true;
            trace!("rank {w}: begin_step({})", l.step);
            self.workers[w].begin_step(l.step);
        } else if !l.to_hand.is_empty() {
            let key = l.to_hand.remove(0);
            let len = self.sizes[key];
            trace!("rank {w}: handle_gradient({key})");
            self.workers[w].handle_gradient(key, &self.grad[..len]);
        } else if !l.backward_done {
            l.backward_done = true;
            trace!("rank {w}: handle_backward_done()");
            self.workers[w].handle_backward_done();
        } else if l.step_done {
            l.step += 1;
            l.to_hand = (0..self.sizes.len()).rev().collect();
            l.backward_done = false;
            l.step_done = false;
            trace!("rank {w}: begin_step({})", l.step);
            self.workers[w].begin_step(l.step);
        }
    }

    /// Endpoint `from` transmits one frame if it has one: to `to`, or (with `None`) to the
    /// most urgent of its peers, listed starting at `rotate`.
    fn transmit(&mut self, from: Rank, to: Option<Rank>, rotate: usize) {
        let mut out = Vec::new();
        let sent_to = match to {
            Some(to) => self.ep(from).poll_transmit(to, &mut out).then_some(to),
            None => {
                let mut links = self.peers[from].clone();
                if !links.is_empty() {
                    let k = rotate % links.len();
                    links.rotate_left(k);
                }
                let got = self.ep(from).poll_transmit_any(&links, &mut out);
                if let Some(to) = got {
                    assert!(
                        links.contains(&to),
                        "poll_transmit_any from rank {from} returned link {to}, not one of {links:?}"
                    );
                }
                got
            }
        };
        let Some(to) = sent_to else {
            assert!(
                out.is_empty(),
                "rank {from} wrote a frame but reported none"
            );
            return;
        };
        assert!(
            out.len() >= HEADER_LEN,
            "rank {from} sent a {}-byte frame",
            out.len()
        );
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&out[..HEADER_LEN]);
        let h = Header::decode(&hb, u32::MAX)
            .unwrap_or_else(|e| panic!("rank {from} sent an undecodable header: {e}"));
        assert_eq!(
            out.len(),
            HEADER_LEN + h.payload_len as usize,
            "rank {from} sent a frame whose length disagrees with its header {h:?}"
        );
        trace!("rank {from} -> {to}: sent {h:?}");
        if self.seen.len() < 256 {
            self.seen.push(h);
        }
        let li = self
            .link_index(from, to)
            .unwrap_or_else(|| panic!("rank {from} transmitted to itself"));
        self.links[li].queue.push_back(Queued {
            bytes: out,
            honest: true,
        });
    }

    /// Link `li` delivers (part of) its next frame, as the runtime's reader does.
    fn deliver(&mut self, li: usize, finish: bool) {
        let (from, to) = (self.links[li].from, self.links[li].to);
        if let Some((h, honest)) = self.links[li].partial {
            // The next read of a frame whose payload is partly in: the slot is asked again.
            let ok = match self.ep(to).recv_slot(from, &h) {
                Ok(slot) => {
                    assert_eq!(
                        slot.len(),
                        h.length as usize,
                        "rank {to}: the slot for {h:?} changed size while the frame was read"
                    );
                    true
                }
                Err(_) => false,
            };
            if !ok || finish {
                self.links[li].partial = None;
            }
            if ok && finish {
                let _ = self.ep(to).handle_payload(from, &h);
            }
            self.tainted |= ok && !honest;
            return;
        }
        let Some(Queued {
            bytes: frame,
            honest,
        }) = self.links[li].queue.pop_front()
        else {
            return;
        };
        let Some(hb) = frame.first_chunk::<HEADER_LEN>() else {
            return;
        };
        let Ok(h) = Header::decode(hb, self.max_payload.max(BUFFERS_MAX_PAYLOAD)) else {
            return;
        };
        let payload = &frame[HEADER_LEN..];
        if h.kind == FrameKind::Buffers {
            // Beside the strategy's frames, to the process's buffer relay.
            let r = self.relays[to].handle_frame(from, &h, payload);
            trace!("rank {from} -> {to}: buffers {h:?}: {r:?}");
            self.tainted |= r.is_ok() && !honest;
            return;
        }
        if !h.kind.is_data() || h.payload_len > self.max_payload {
            // Control, heartbeat, abort and goodbye frames never reach the endpoint.
            return;
        }
        trace!("rank {from} -> {to}: delivering {h:?}");
        let ep = self.ep(to);
        let written = match ep.recv_slot(from, &h) {
            Ok(slot) => {
                assert_eq!(
                    slot.len(),
                    h.length as usize,
                    "rank {to}: recv_slot for {h:?} from rank {from} returned {} values",
                    slot.len()
                );
                let bytes = f32_bytes_mut(slot);
                let k = bytes.len().min(payload.len());
                bytes[..k].copy_from_slice(&payload[..k]);
                true
            }
            Err(e) => {
                trace!("  recv_slot refused: {e}");
                false
            }
        };
        // The frame's bytes are in the endpoint's buffers now.
        self.tainted |= written && !honest;
        if !written {
            return;
        }
        if h.payload_len == 0 || finish {
            let r = self.ep(to).handle_payload(from, &h);
            trace!("  handle_payload: {r:?}");
        } else {
            self.links[li].partial = Some((h, honest));
        }
    }

    /// Forwards every event to the (simulated) training thread.
    fn drain(&mut self) {
        for w in 0..self.n {
            while let Some(ev) = self.workers[w].poll_event() {
                match ev {
                    WorkerEvent::ParamsReady(k) | WorkerEvent::GradReady(k) => {
                        assert!(k < self.sizes.len(), "rank {w}: event for unknown key {k}");
                        let values = self.workers[w].take_values(k);
                        self.check_values(w, k, &values);
                    }
                    WorkerEvent::StepDone => self.loops[w].step_done = true,
                }
            }
            while let Some((step, values)) = self.relays[w].poll_delivered() {
                self.check_buffers(w, step, &values);
            }
        }
    }

    /// Checks a set of buffers worker `w` installs: worker 0's, as it sent them.
    fn check_buffers(&self, w: usize, step: u64, values: &[f32]) {
        if self.tainted {
            return;
        }
        assert_eq!(
            values.len(),
            self.buffer_len,
            "rank {w}: buffers of step {step}"
        );
        assert!(
            self.buffers_sent.is_some_and(|s| step <= s),
            "rank {w}: buffers of step {step}, which worker 0 never sent"
        );
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(
                v.to_bits(),
                buffer_value(step, i).to_bits(),
                "rank {w}: buffer {i} of step {step}"
            );
        }
    }

    /// Worker 0 sends its buffers at an evaluation point (after its current step).
    fn sync_buffers(&mut self) {
        let step = self.loops[0].step;
        if self.buffers_sent.is_some_and(|s| s >= step) {
            return;
        }
        self.buffers_sent = Some(step);
        let values: Vec<f32> = (0..self.buffer_len)
            .map(|i| buffer_value(step, i))
            .collect();
        trace!("rank 0: buffers of step {step}");
        self.relays[0].handle_local(step, &values);
    }

    /// Process `from`'s buffer relay writes its next frame, if it has one.
    fn transmit_buffers(&mut self, from: Rank) {
        let Some((to, bytes)) = self.relays[from].poll_transmit() else {
            return;
        };
        let li = self
            .link_index(from, to)
            .unwrap_or_else(|| panic!("rank {from} relays buffers to itself"));
        self.links[li].queue.push_back(Queued {
            bytes,
            honest: true,
        });
    }

    /// The honest cluster makes progress for `rounds` rounds.
    fn pump(&mut self, rounds: usize) {
        for round in 0..rounds {
            for w in 0..self.n {
                self.local(w);
            }
            for r in 0..self.total() {
                for _ in 0..4 {
                    self.transmit(r, None, round);
                }
                self.transmit_buffers(r);
            }
            for li in 0..self.links.len() {
                for _ in 0..4 {
                    self.deliver(li, true);
                }
            }
            self.drain();
        }
    }

    /// A header for a forged frame.
    fn forge_header(&self, u: &mut Unstructured) -> Result<Header> {
        let mut h = if !self.seen.is_empty() && u.arbitrary::<bool>()? {
            *u.choose(&self.seen)?
        } else {
            let kind = *u.choose(value_kinds())?;
            let step = u64::from(u.int_in_range(0u8..=3)?);
            let (key, offset, len) = if !self.slices.is_empty() && u.arbitrary::<bool>()? {
                *u.choose(&self.slices)?
            } else {
                (
                    usize::from(u.int_in_range(0u8..=4)?),
                    usize::from(u.arbitrary::<u8>()?),
                    usize::from(u.int_in_range(0u8..=130)?),
                )
            };
            // Probe, Stop and Ack carry no values; a Missing bitmap is a word or two.
            let len = match kind {
                FrameKind::Probe | FrameKind::Stop | FrameKind::Ack => 0,
                FrameKind::Missing => len % 3,
                _ => len,
            };
            let mut h = Header::data(kind, step, key as u32, offset as u32, len as u32);
            h.sequence = u64::from(u.int_in_range(0u8..=4)?);
            h
        };
        let mask: u16 = u.arbitrary()?;
        if mask & 1 != 0 {
            h.kind = *u.choose(all_kinds())?;
        }
        if mask & 2 != 0 {
            h.step = h.step.wrapping_add(i64::from(u.arbitrary::<i8>()?) as u64);
        }
        if mask & 4 != 0 {
            h.step = wild_u64(u)?;
        }
        if mask & 8 != 0 {
            h.key = if u.arbitrary::<bool>()? {
                wild_u32(u)?
            } else {
                u32::from(u.int_in_range(0u8..=5)?)
            };
        }
        if mask & 16 != 0 {
            h.offset = if u.arbitrary::<bool>()? {
                wild_u32(u)?
            } else {
                h.offset
                    .wrapping_add(i32::from(u.arbitrary::<i8>()?) as u32)
            };
        }
        if mask & 32 != 0 {
            h.length = if u.arbitrary::<bool>()? {
                wild_u32(u)?
            } else {
                h.length
                    .wrapping_add(i32::from(u.arbitrary::<i8>()?) as u32)
            };
        }
        if mask & 64 != 0 {
            h.sequence = if u.arbitrary::<bool>()? {
                wild_u64(u)?
            } else {
                u64::from(u.arbitrary::<u8>()?)
            };
        }
        if mask & 128 != 0 {
            h.priority = u.arbitrary()?;
            h.sender = u.arbitrary()?;
        }
        if mask & 512 != 0 {
            // Any known flags but the float: class, loss-tolerant, drop-eligible, sprayed,
            // last of a share.
            let bits: u32 = u.int_in_range(0..=511)?;
            h.flags = Flags::from_bits(bits & !0b1100_0000).unwrap_or_default();
        }
        h.payload_len = if h.kind.carries_values() {
            h.length.saturating_mul(4)
        } else {
            0
        };
        if mask & 256 != 0 {
            h.payload_len = wild_u32(u)?;
        }
        Ok(h)
    }

    /// Payload bytes of a forged frame announcing `payload_len` bytes.
    fn forge_payload(u: &mut Unstructured, payload_len: u32) -> Result<Vec<u8>> {
        let len = (payload_len as usize).min(MAX_FORGED_PAYLOAD);
        Ok(match u.int_in_range(0..=2)? {
            // Arbitrary bits (NaNs and infinities included), as far as the input goes.
            0 => {
                let take = len.min(u.len());
                let mut p = u.bytes(take)?.to_vec();
                p.resize(len, 0);
                p
            }
            // One repeated value.
            1 => {
                let v: [u8; 4] = u.arbitrary()?;
                v.iter().copied().cycle().take(len).collect()
            }
            // A short frame: the stream breaks off.
            _ => vec![0; len / 2],
        })
    }

    fn pick_link(&self, u: &mut Unstructured) -> Result<usize> {
        // Mostly the links the strategy uses.
        if u.arbitrary::<bool>()? {
            let from = u.choose_index(self.total())?;
            if let Some(&to) = self.peers[from].get(u.choose_index(self.peers[from].len().max(1))?)
            {
                if let Some(li) = self.link_index(from, to) {
                    return Ok(li);
                }
            }
        }
        if self.links.is_empty() {
            return Err(libfuzzer_sys::arbitrary::Error::NotEnoughData);
        }
        u.choose_index(self.links.len())
    }

    fn step(&mut self, u: &mut Unstructured) -> Result<()> {
        let op: u8 = u.arbitrary()?;
        match op % 17 {
            0..=1 => {
                let w = u.choose_index(self.n)?;
                self.local(w);
            }
            2 => {
                let rounds = u.int_in_range(1..=8)?;
                self.pump(rounds);
            }
            3..=5 => {
                let from = u.choose_index(self.total())?;
                if u.arbitrary::<bool>()? {
                    let rotate = usize::from(u.arbitrary::<u8>()?);
                    self.transmit(from, None, rotate);
                } else {
                    let to = u.choose_index(self.total() + 1)?;
                    self.transmit(from, Some(to), 0);
                }
            }
            6..=9 => {
                let li = self.pick_link(u)?;
                let finish = u.ratio(3u8, 4u8)?;
                self.deliver(li, finish);
            }
            10..=11 => {
                let li = self.pick_link(u)?;
                let h = self.forge_header(u)?;
                let mut frame = h.encode().to_vec();
                frame.extend(Self::forge_payload(u, h.payload_len)?);
                trace!(
                    "forged on link {} -> {}: {h:?}",
                    self.links[li].from,
                    self.links[li].to
                );
                let q = &mut self.links[li].queue;
                let frame = Queued {
                    bytes: frame,
                    honest: false,
                };
                if u.arbitrary::<bool>()? {
                    q.push_front(frame);
                } else {
                    q.push_back(frame);
                }
            }
            12 => {
                let li = self.pick_link(u)?;
                let mut frame = u.bytes(HEADER_LEN)?.to_vec();
                let announced = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
                frame.extend(Self::forge_payload(u, announced)?);
                self.links[li].queue.push_back(Queued {
                    bytes: frame,
                    honest: false,
                });
            }
            13 => {
                // Flip bytes of a queued frame's header.
                let li = self.pick_link(u)?;
                let q = &mut self.links[li].queue;
                if !q.is_empty() {
                    let i = u.choose_index(q.len())?;
                    let frame = &mut q[i];
                    let at = u.choose_index(frame.bytes.len().min(HEADER_LEN))?;
                    frame.bytes[at] ^= u.arbitrary::<u8>()?.max(1);
                    frame.honest = false;
                }
            }
            14 => {
                // Drop, duplicate or reorder queued frames.
                let li = self.pick_link(u)?;
                let (from, to) = (self.links[li].from, self.links[li].to);
                let q = &mut self.links[li].queue;
                if !q.is_empty() {
                    let i = u.choose_index(q.len())?;
                    let what = u.int_in_range(0..=2)?;
                    trace!("link {from} -> {to}: frame {i} of {} dropped, duplicated or moved ({what})", q.len());
                    match what {
                        0 => {
                            q.remove(i);
                        }
                        1 => {
                            let f = Queued {
                                bytes: q[i].bytes.clone(),
                                honest: q[i].honest,
                            };
                            q.insert(i, f);
                        }
                        _ if loss_tolerant(&q[i].bytes) => {
                            // A datagram may overtake anything, or fall behind: honest.
                            let j = u.choose_index(q.len())?;
                            trace!("  datagram moved to {j}");
                            if let Some(f) = q.remove(i) {
                                q.insert(j, f);
                            }
                        }
                        _ => {
                            // TCP never reorders: what a reordered frame does is not checked.
                            let j = u.choose_index(q.len())?;
                            if i != j {
                                q.swap(i, j);
                                q[i].honest = false;
                                q[j].honest = false;
                            }
                        }
                    }
                }
            }
            16 => {
                // Worker 0 reaches an evaluation point, or a relay writes a buffers frame.
                if u.arbitrary::<bool>()? {
                    self.sync_buffers();
                } else {
                    let from = u.choose_index(self.total())?;
                    self.transmit_buffers(from);
                }
            }
            _ => {
                // A frame copied onto another link (a peer replaying someone else's frame).
                let src = self.pick_link(u)?;
                let dst = self.pick_link(u)?;
                if let Some(f) = self.links[src].queue.front() {
                    // Honest only where it is a duplicate on its own link.
                    let copy = Queued {
                        bytes: f.bytes.clone(),
                        honest: src == dst && f.honest,
                    };
                    self.links[dst].queue.push_back(copy);
                }
            }
        }
        self.drain();
        Ok(())
    }
}

/// Whether a queued frame is a loss-tolerant packet (a datagram: it may be reordered).
fn loss_tolerant(frame: &[u8]) -> bool {
    frame
        .first_chunk::<HEADER_LEN>()
        .and_then(|hb| Header::decode(hb, u32::MAX).ok())
        .is_some_and(|h| h.flags.is_loss_tolerant())
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let mut c = Cluster::build(&mut u)?;
    for _ in 0..MAX_OPS {
        if u.is_empty() {
            break;
        }
        c.step(&mut u)?;
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
