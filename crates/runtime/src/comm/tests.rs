//! The loop's side of the endpoint contract, over a loopback socket pair.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use syncopate_core::strategy::Endpoint;
use syncopate_core::wire::mac::{FrameKey, Tag, TAG_LEN};
use syncopate_core::wire::{FrameKind, HEADER_LEN};

use super::*;

/// The frame keys of `rank`'s end of a two-rank loopback link (the other end holds them
/// reversed).
pub(super) fn test_keys(rank: Rank) -> LinkKeys {
    let keys = LinkKeys {
        send: FrameKey::new([1; 32]),
        recv: FrameKey::new([2; 32]),
    };
    if rank == 0 {
        keys
    } else {
        keys.reversed()
    }
}

/// `rank`'s link to the other rank of a two-rank job over `stream`.
fn link_to_other(rank: Rank, stream: TcpStream) -> Vec<Link> {
    vec![Link {
        peer: 1 - rank,
        stream,
        keys: test_keys(rank),
        datagram_addrs: Vec::new(),
    }]
}

/// An endpoint that sends nothing and asks for a timer at each of `deadlines` in turn,
/// recording the time it was told each one fired.
struct TimerProbe {
    deadlines: Vec<u64>,
    /// `(deadline, now_ns)` of every deadline that fired.
    fired: Vec<(u64, u64)>,
    /// Every call of `handle_timeout`, spurious or not.
    calls: usize,
}

impl TimerProbe {
    fn new(deadlines: Vec<u64>) -> Self {
        Self {
            deadlines,
            fired: Vec::new(),
            calls: 0,
        }
    }

    fn done(&self) -> bool {
        self.fired.len() == self.deadlines.len()
    }
}

impl Endpoint for TimerProbe {
    fn poll_transmit(&mut self, _link: Rank, _out: &mut Vec<u8>) -> bool {
        false
    }

    fn recv_slot(&mut self, link: Rank, _header: &Header) -> Result<&mut [f32], ProtocolError> {
        Err(ProtocolError::Unexpected {
            from: link,
            reason: "the probe takes no data".into(),
        })
    }

    fn handle_payload(&mut self, link: Rank, header: &Header) -> Result<(), ProtocolError> {
        self.recv_slot(link, header).map(|_| ())
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.deadlines.get(self.fired.len()).copied()
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        self.calls += 1;
        if let Some(at) = self.poll_timeout().filter(|&at| at <= now_ns) {
            self.fired.push((at, now_ns));
        }
    }
}

/// Finishes once its function says the endpoint is done.
pub(super) struct FinishWhen<E>(pub(super) fn(&E) -> bool);

impl<E> Hooks<E> for FinishWhen<E> {
    fn on_commands(&mut self, ep: &mut E) -> Result<Flow, CommError> {
        Ok(if (self.0)(ep) {
            Flow::Finish
        } else {
            Flow::Continue
        })
    }
    fn on_progress(&mut self, ep: &mut E, _: LinkStatus) -> Result<Flow, CommError> {
        self.on_commands(ep)
    }
    fn step(&self) -> u64 {
        0
    }
    fn describe(&self, rank: Rank) -> String {
        format!("rank {rank}")
    }
}

pub(super) fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (a, b)
}

/// Runs a loop for `rank` (its peer is `1 - rank`) over `stream` with a probe.
fn run_probe(rank: Rank, stream: TcpStream, deadlines: Vec<u64>) -> TimerProbe {
    let links = link_to_other(rank, stream);
    let (mut comm, _waker) = CommLoop::new(
        links,
        CommOptions::default(),
        Emulation::default(),
        Vec::new(),
    )
    .unwrap();
    let mut probe = TimerProbe::new(deadlines);
    comm.run(&mut probe, &mut FinishWhen(TimerProbe::done))
        .unwrap();
    probe
}

#[test]
fn endpoint_timers_fire_once_each_at_or_after_their_time() {
    let (a, b) = loopback_pair();
    // Deadlines on the loop's clock (nanoseconds since it was created); one in the past.
    let other = std::thread::spawn(move || run_probe(1, b, vec![0, 3_000_000]));
    let probe = run_probe(0, a, vec![1_000_000, 2_000_000, 2_500_000]);
    let peer = other.join().unwrap();
    for p in [&probe, &peer] {
        assert!(p.done(), "fired {:?} of {:?}", p.fired, p.deadlines);
        // The loop calls the endpoint only when its time has come: no spurious calls.
        assert_eq!(p.calls, p.fired.len());
        for &(at, now) in &p.fired {
            assert!(now >= at, "deadline {at} fired early, at {now}");
        }
    }
}

/// Existing strategies have no timer, and a spurious call leaves them as they were.
#[test]
fn strategies_have_no_timer() {
    use syncopate_core::registry::KeyInfo;
    use syncopate_core::strategy::{RingAllReduce, WorkerSync};
    let keys = vec![KeyInfo {
        numel: 10,
        layer: 0,
    }];
    let mut ring = RingAllReduce::new(
        0,
        2,
        keys,
        16,
        4,
        true,
        syncopate_core::sched::SchedulerKind::Fifo,
    );
    assert_eq!(ring.poll_timeout(), None);
    ring.begin_step(0);
    ring.handle_timeout(123);
    assert_eq!(ring.poll_timeout(), None);
    assert_eq!(ring.poll_event(), None);
}

/// Runs one all-reduce step of `grad` over `stream` as `rank` of 2 under `network`, in
/// frames of 1024 values.
fn ring_step(
    rank: Rank,
    stream: TcpStream,
    network: Emulation,
    grad: Vec<f32>,
) -> (Vec<f32>, Vec<LinkCounters>) {
    ring_step_with(rank, stream, network, grad, 1024, CommOptions::default())
}

/// [`ring_step`] in frames of `segment_elems` values, with `options`.
fn ring_step_with(
    rank: Rank,
    stream: TcpStream,
    network: Emulation,
    grad: Vec<f32>,
    segment_elems: usize,
    options: CommOptions,
) -> (Vec<f32>, Vec<LinkCounters>) {
    use syncopate_core::registry::KeyInfo;
    use syncopate_core::sched::SchedulerKind;
    use syncopate_core::strategy::{RingAllReduce, WorkerEvent, WorkerSync};

    struct StepHooks {
        grad: Vec<f32>,
        started: bool,
        result: Option<Vec<f32>>,
        done: bool,
    }
    impl Hooks<RingAllReduce> for StepHooks {
        fn on_commands(&mut self, ep: &mut RingAllReduce) -> Result<Flow, CommError> {
            if !self.started {
                self.started = true;
                ep.begin_step(0);
                ep.handle_gradient(0, &self.grad);
                ep.handle_backward_done();
            }
            self.on_progress(ep, LinkStatus::default())
        }
        fn on_progress(
            &mut self,
            ep: &mut RingAllReduce,
            _: LinkStatus,
        ) -> Result<Flow, CommError> {
            while let Some(ev) = ep.poll_event() {
                match ev {
                    WorkerEvent::GradReady(k) => self.result = Some(ep.take_values(k)),
                    WorkerEvent::StepDone => self.done = true,
                    WorkerEvent::ParamsReady(_) => {}
                }
            }
            Ok(if self.done {
                Flow::Finish
            } else {
                Flow::Continue
            })
        }
        fn step(&self) -> u64 {
            0
        }
        fn describe(&self, rank: Rank) -> String {
            format!("rank {rank}")
        }
    }

    let keys = vec![KeyInfo {
        numel: grad.len(),
        layer: 0,
    }];
    let mut ring = RingAllReduce::new(
        rank,
        2,
        keys,
        grad.len(),
        segment_elems,
        true,
        SchedulerKind::Fifo,
    );
    let links = link_to_other(rank, stream);
    let (mut comm, _waker) = CommLoop::new(links, options, network, Vec::new()).unwrap();
    let mut hooks = StepHooks {
        grad,
        started: false,
        result: None,
        done: false,
    };
    comm.run(&mut ring, &mut hooks).unwrap();
    (hooks.result.unwrap(), comm.counters())
}

/// Host `host`'s emulated network: unlimited bandwidth, `loss` of the frames lost (and
/// retransmitted after 2 ms), random choices from `seed`.
fn lossy(loss: f64, seed: u64, host: u64) -> Emulation {
    Emulation {
        profile: NetworkProfile {
            loss,
            rto_ns: 2_000_000,
            ..NetworkProfile::default()
        },
        seed,
        host,
    }
}

/// Under 10 % loss every frame still arrives (retransmitted, in order), so the averaged
/// values are exact; the losses are counted on the link, and the same seed loses the same
/// frames.
#[test]
fn a_lossy_network_delays_frames_but_loses_none() {
    let run = || {
        let (a, b) = loopback_pair();
        let n = 64 << 10;
        let (ea, eb) = (lossy(0.1, 7, 0), lossy(0.1, 7, 1));
        let other = std::thread::spawn(move || ring_step(1, b, eb, vec![2.0; n]));
        let (sum, counters) = ring_step(0, a, ea, vec![1.0; n]);
        let (peer_sum, _) = other.join().unwrap();
        // The ring averages: (1 + 2) / 2 everywhere, on both ranks.
        assert!(sum.len() == n && sum.iter().all(|&v| v == 1.5));
        assert!(peer_sum == sum);
        counters[0].net
    };
    let first = run();
    assert!(first.frames_lost > 0, "{first:?}");
    assert_eq!(first.frames_retransmitted, first.frames_lost);
    // How a loss was found (a loss probe or a SACK) and how far the window had grown when a
    // frame was offered depend on the frames' real times; which frames were lost does not.
    let losses = |c: NetCounters| NetCounters {
        loss_probes: 0,
        timeouts: 0,
        loss_episodes: 0,
        timeout_causes: Default::default(),
        window_held: 0,
        cwnd_segments_total: 0,
        cwnd_segments_max: 0,
        srtt_ns_total: 0,
        srtt_ns_max: 0,
        socket_bytes_max: 0,
        ..c
    };
    assert_eq!(losses(run()), losses(first));
}

/// With an ingress port every data frame received queues there before its payload is read
/// (counted per link), and the step still completes with exact values.
#[test]
fn an_ingress_port_holds_frames_without_deadlock() {
    let profile = NetworkProfile {
        bandwidth_bps: Some(1e9),
        ingress: true,
        ..NetworkProfile::default()
    };
    let (a, b) = loopback_pair();
    let n = 64 << 10;
    let emulation = |host| Emulation {
        profile: profile.clone(),
        seed: 1,
        host,
    };
    let (ea, eb) = (emulation(0), emulation(1));
    let other = std::thread::spawn(move || ring_step(1, b, eb, vec![2.0; n]));
    let (avg, counters) = ring_step(0, a, ea, vec![1.0; n]);
    let (peer_avg, peer_counters) = other.join().unwrap();
    assert!(avg.len() == n && avg.iter().all(|&v| v == 1.5));
    assert!(peer_avg == avg);
    // Each rank received the other's data frames through its ingress port: as many as the
    // peer sent (the ring's 2 phases of 128 KiB chunks in 4 KiB segments: 64 frames).
    assert_eq!(
        counters[0].ingress.frames_sent,
        peer_counters[0].net.frames_sent
    );
    assert_eq!(counters[0].ingress.frames_sent, 64);
}

/// A flow whose congestion window holds frames back is offered nothing more once its
/// socket holds the send window (core's `Port::flow_has_room`): the endpoint's frames wait
/// in the strategy, not in an unbounded socket behind a loss.
#[test]
fn a_full_socket_is_offered_nothing_more() {
    let window = 16 << 10;
    let emulation = |host| Emulation {
        profile: NetworkProfile {
            bandwidth_bps: Some(100e6),
            latency_ns: 1_000_000,
            loss: 0.05,
            rto_ns: 2_000_000,
            buffer_bytes: window,
            ..NetworkProfile::default()
        },
        seed: 3,
        host,
    };
    let (a, b) = loopback_pair();
    let n = 64 << 10;
    let (ea, eb) = (emulation(0), emulation(1));
    let other = std::thread::spawn(move || ring_step(1, b, eb, vec![2.0; n]));
    let (avg, counters) = ring_step(0, a, ea, vec![1.0; n]);
    let (peer_avg, _) = other.join().unwrap();
    assert!(avg.len() == n && avg.iter().all(|&v| v == 1.5) && peer_avg == avg);
    let net = counters[0].net;
    // 128 KiB a phase in frames of 4 KiB and a header: the window held some back, and
    // the socket never held more than the send window and the frame that filled it.
    let frame = (1024 * 4 + HEADER_LEN) as u64;
    assert!(net.window_held > 0, "{net:?}");
    assert!(net.socket_bytes_max > 0, "{net:?}");
    assert!(net.socket_bytes_max < window as u64 + frame, "{net:?}");
}

/// With frame MACs on both ends, a ring step's values are exact, in small frames (read
/// through the staging buffer) and in large ones (read straight into their slots), over a
/// lossy emulated link (frames retransmitted, so delayed, never reordered).
#[test]
fn frame_macs_leave_a_ring_step_exact() {
    let options = CommOptions {
        frame_mac: true,
        ..CommOptions::default()
    };
    for segment in [1024, 64 << 10] {
        let (a, b) = loopback_pair();
        let n = 256 << 10;
        let (ea, eb, ob) = (lossy(0.05, 3, 0), lossy(0.05, 3, 1), options.clone());
        let other = std::thread::spawn(move || ring_step_with(1, b, eb, vec![2.0; n], segment, ob));
        let (avg, counters) = ring_step_with(0, a, ea, vec![1.0; n], segment, options.clone());
        let (peer_avg, _) = other.join().unwrap();
        assert!(
            avg.len() == n && avg.iter().all(|&v| v == 1.5),
            "segment {segment}"
        );
        assert!(peer_avg == avg);
        // Every data frame carried its tag, and the emulated link timed it with the tag.
        let net = counters[0].net;
        let frames = net.frames_sent - net.frames_retransmitted;
        let data_bytes = 4 * n as u64 + frames * (HEADER_LEN + TAG_LEN) as u64;
        assert_eq!(net.bytes_sent - net.bytes_retransmitted, data_bytes);
        assert!(counters[0].sent >= data_bytes);
    }
}

/// Takes any data frame into a buffer and keeps what it was handed; done once it has been
/// handed `wanted` frames.
struct Sink {
    slot: Vec<f32>,
    handed: Vec<(Header, Vec<f32>)>,
    wanted: usize,
}

impl Sink {
    fn done(&self) -> bool {
        self.handed.len() >= self.wanted
    }
}

impl Endpoint for Sink {
    fn poll_transmit(&mut self, _link: Rank, _out: &mut Vec<u8>) -> bool {
        false
    }

    fn recv_slot(&mut self, _link: Rank, header: &Header) -> Result<&mut [f32], ProtocolError> {
        self.slot.resize(header.length as usize, 0.0);
        Ok(&mut self.slot)
    }

    fn handle_payload(&mut self, _link: Rank, header: &Header) -> Result<(), ProtocolError> {
        self.handed.push((*header, self.slot.clone()));
        Ok(())
    }
}

/// Rank 1 of a loopback link, writing frames by hand with rank 1's sending key.
struct RawPeer {
    seal: FrameSealer,
}

impl RawPeer {
    fn new() -> Self {
        Self {
            seal: FrameSealer::new(&test_keys(1).send),
        }
    }

    /// The next frame's bytes: `header` (its payload length set), `payload` and its tag.
    fn frame(&mut self, header: Header, payload: &[u8]) -> Vec<u8> {
        let header = Header {
            payload_len: payload.len() as u32,
            ..header
        }
        .encode();
        let tag = self.seal.seal(&header, &[payload]);
        [&header[..], payload, &tag].concat()
    }

    /// A Push frame of `values` copies of `value`.
    fn data(&mut self, step: u64, values: usize, value: f32) -> Vec<u8> {
        let header = Header::data(FrameKind::Push, step, 0, 0, values as u32);
        self.frame(header, &value.to_le_bytes().repeat(values))
    }

    fn control(&mut self, kind: FrameKind, payload: &[u8]) -> Vec<u8> {
        self.frame(Header::control(kind, 0), payload)
    }
}

/// What a sink run ended with: the loop's result, the frames the sink was handed, and what
/// the other end read.
type SinkRun = (Result<(), CommError>, Vec<(Header, Vec<f32>)>, Vec<u8>);

/// Runs a sink with the default options (frame MACs on) as rank 0 until it has been handed
/// `frames` frames, while rank 1 writes `bytes` by hand and then reads until the sink's end
/// closes; returns the loop's result, what the sink was handed and what rank 1 read.
fn sink_run(bytes: Vec<u8>, frames: usize) -> SinkRun {
    sink_run_with(bytes, frames, CommOptions::default())
}

/// [`sink_run`] with `options`.
fn sink_run_with(bytes: Vec<u8>, frames: usize, options: CommOptions) -> SinkRun {
    let (a, mut b) = loopback_pair();
    let peer = std::thread::spawn(move || {
        // The sink may stop reading at a bad frame: what is left unwritten does not matter.
        let _ = b.write_all(&bytes);
        let _ = b.shutdown(std::net::Shutdown::Write);
        let mut read = Vec::new();
        let _ = b.read_to_end(&mut read);
        read
    });
    let (mut comm, _waker) = CommLoop::new(
        link_to_other(0, a),
        options,
        Emulation::default(),
        Vec::new(),
    )
    .unwrap();
    let mut sink = Sink {
        slot: Vec::new(),
        handed: Vec::new(),
        wanted: frames,
    };
    let result = comm.run(&mut sink, &mut FinishWhen(Sink::done));
    drop(comm);
    (result, sink.handed, peer.join().unwrap())
}

/// Checks that `bytes` are whole control frames tagged with rank 0's sending key, in order;
/// returns their kinds.
fn opened_control_frames(mut bytes: &[u8]) -> Vec<FrameKind> {
    let mut open = FrameOpener::new(&test_keys(1).recv);
    let mut kinds = Vec::new();
    while !bytes.is_empty() {
        let raw: &[u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
        let header = Header::decode(raw, 1 << 20).unwrap();
        let end = HEADER_LEN + header.payload_len as usize;
        open.update(&bytes[HEADER_LEN..end]);
        let tag: Tag = bytes[end..end + TAG_LEN].try_into().unwrap();
        assert_eq!(open.finish(raw, &tag), Ok(kinds.len() as u64));
        kinds.push(header.kind);
        bytes = &bytes[end + TAG_LEN..];
    }
    kinds
}

/// Small frames (through the staging buffer), a large one (read straight into its slot), a
/// heartbeat and a goodbye, all tagged, go through; the frames the loop sends carry tags
/// under its own key.
#[test]
fn tagged_frames_are_handed_over_and_the_loop_tags_its_own() {
    let mut peer = RawPeer::new();
    let bytes = [
        peer.data(0, 3, 1.0),
        peer.control(FrameKind::Heartbeat, &[]),
        peer.data(0, 100_000, 2.0),
        peer.data(1, 5, 3.0),
        peer.control(FrameKind::Goodbye, &[]),
    ]
    .concat();
    let (result, handed, read) = sink_run(bytes, 3);
    result.unwrap();
    let got: Vec<(u64, usize, f32)> = handed
        .iter()
        .map(|(h, v)| (h.step, v.len(), v[0]))
        .collect();
    assert_eq!(got, [(0, 3, 1.0), (0, 100_000, 2.0), (1, 5, 3.0)]);
    assert!(handed[1].1.iter().all(|&v| v == 2.0));
    let kinds = opened_control_frames(&read);
    assert_eq!(kinds.last(), Some(&FrameKind::Goodbye), "{kinds:?}");
}

/// Runs a sink on `bytes` and returns its error, which must be an integrity failure of
/// frame `frame` (named in the message) before the sink was handed `handed` frames.
fn integrity_failure(bytes: Vec<u8>, frame: u64, handed: usize) -> CommError {
    let (result, got, read) = sink_run(bytes, usize::MAX);
    let e = result.unwrap_err();
    assert!(
        matches!(&e, CommError::Integrity { frame: f, peer, .. } if *f == frame && peer == "rank 1"),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "frame {frame} from rank 1 failed its integrity check"
        )),
        "{text}"
    );
    assert_eq!(got.len(), handed, "frames handed over before the bad one");
    // The peer was told why, in a tagged abort.
    assert_eq!(opened_control_frames(&read).last(), Some(&FrameKind::Abort));
    e
}

#[test]
fn a_tampered_payload_byte_is_caught() {
    for values in [10, 100_000] {
        let mut peer = RawPeer::new();
        let first = peer.data(0, 3, 1.0);
        let mut second = peer.data(0, values, 2.0);
        second[HEADER_LEN + 4 * values - 1] ^= 0x40;
        integrity_failure([first, second].concat(), 1, 1);
    }
}

#[test]
fn a_tampered_header_is_caught() {
    let mut peer = RawPeer::new();
    let mut frame = peer.data(0, 3, 1.0);
    // The step: the decoder takes any value.
    frame[8] = 7;
    integrity_failure(frame, 0, 0);
}

#[test]
fn a_replayed_frame_is_caught() {
    let mut peer = RawPeer::new();
    let frame = peer.data(0, 3, 1.0);
    integrity_failure([frame.clone(), frame].concat(), 1, 1);
}

#[test]
fn a_dropped_frame_is_caught() {
    let mut peer = RawPeer::new();
    let _dropped = peer.control(FrameKind::Heartbeat, &[]);
    let frame = peer.data(0, 3, 1.0);
    integrity_failure(frame, 0, 0);
}

#[test]
fn a_truncated_tag_is_caught() {
    // Followed by the next frame, whose bytes are taken for the rest of the tag.
    let mut peer = RawPeer::new();
    let mut first = peer.data(0, 3, 1.0);
    first.truncate(first.len() - TAG_LEN / 2);
    let second = peer.data(0, 3, 2.0);
    integrity_failure([first, second].concat(), 0, 0);

    // Followed by the end of the connection.
    let mut first = RawPeer::new().data(0, 3, 1.0);
    first.truncate(first.len() - 1);
    let (result, got, _) = sink_run(first, usize::MAX);
    let e = result.unwrap_err();
    assert!(matches!(&e, CommError::Lost { .. }), "{e}");
    assert!(e.to_string().contains("connection closed"), "{e}");
    assert!(got.is_empty());
}

/// A control frame is checked before it is acted on: a forged abort reason is an integrity
/// failure, not the peer's word.
#[test]
fn a_tampered_abort_is_not_believed() {
    let mut peer = RawPeer::new();
    let mut abort = peer.control(FrameKind::Abort, b"rank 1 gives up");
    abort[HEADER_LEN] = b'R';
    let e = integrity_failure(abort, 0, 0);
    assert!(!e.to_string().contains("gives up"), "{e}");
}

/// Frames are authenticated unless a job turns MACs off: by default a frame written without
/// a tag (injected by someone without the link's keys) is refused before it is handed over;
/// with `frame_mac: false` the same bytes are taken as they come.
#[test]
fn untagged_frames_are_refused_by_default_and_taken_with_macs_off() {
    assert!(CommOptions::default().frame_mac);
    let header = Header::data(FrameKind::Push, 0, 0, 0, 3);
    let untagged = |values: &[f32]| {
        let payload: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let header = Header {
            payload_len: payload.len() as u32,
            ..header
        };
        [&header.encode()[..], &payload].concat()
    };
    let injected = [untagged(&[1.0; 3]), untagged(&[2.0; 3])].concat();
    integrity_failure(injected.clone(), 0, 0);

    let off = CommOptions {
        frame_mac: false,
        ..CommOptions::default()
    };
    let goodbye = Header::control(FrameKind::Goodbye, 0).encode();
    let (result, handed, _) = sink_run_with([&injected[..], &goodbye].concat(), 2, off);
    result.unwrap();
    let values: Vec<f32> = handed.iter().map(|(_, v)| v[0]).collect();
    assert_eq!(values, [1.0, 2.0]);
}
