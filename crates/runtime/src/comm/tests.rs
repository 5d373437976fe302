//! The loop's side of the endpoint contract, over a loopback socket pair.

use std::net::{TcpListener, TcpStream};

use super::*;

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

/// Finishes once the probe's deadlines have all fired.
struct ProbeHooks;

impl Hooks<TimerProbe> for ProbeHooks {
    fn on_commands(&mut self, ep: &mut TimerProbe) -> Result<Flow, CommError> {
        Ok(if ep.done() {
            Flow::Finish
        } else {
            Flow::Continue
        })
    }
    fn on_progress(&mut self, ep: &mut TimerProbe, _: LinkStatus) -> Result<Flow, CommError> {
        self.on_commands(ep)
    }
    fn step(&self) -> u64 {
        0
    }
    fn describe(&self, rank: Rank) -> String {
        format!("rank {rank}")
    }
}

fn loopback_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    (a, b)
}

/// Runs a loop for `rank` (its peer is `1 - rank`) over `stream` with a probe.
fn run_probe(rank: Rank, stream: TcpStream, deadlines: Vec<u64>) -> TimerProbe {
    let links = vec![Link {
        peer: 1 - rank,
        stream,
    }];
    let (mut comm, _waker) =
        CommLoop::new(links, CommOptions::default(), Emulation::default()).unwrap();
    let mut probe = TimerProbe::new(deadlines);
    comm.run(&mut probe, &mut ProbeHooks).unwrap();
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

/// Runs one all-reduce step of `grad` over `stream` as `rank` of 2 under `network`.
fn ring_step(
    rank: Rank,
    stream: TcpStream,
    network: Emulation,
    grad: Vec<f32>,
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
    let mut ring = RingAllReduce::new(rank, 2, keys, grad.len(), 1024, true, SchedulerKind::Fifo);
    let links = vec![Link {
        peer: 1 - rank,
        stream,
    }];
    let (mut comm, _waker) = CommLoop::new(links, CommOptions::default(), network).unwrap();
    let mut hooks = StepHooks {
        grad,
        started: false,
        result: None,
        done: false,
    };
    comm.run(&mut ring, &mut hooks).unwrap();
    (hooks.result.unwrap(), comm.counters())
}

/// Under 10 % loss every frame still arrives (retransmitted after the timeout, in order), so
/// the averaged values are exact; the losses are counted on the link, and the same seed
/// loses the same frames.
#[test]
fn a_lossy_network_delays_frames_but_loses_none() {
    let profile = NetworkProfile {
        loss: 0.1,
        rto_ns: 2_000_000,
        ..NetworkProfile::default()
    };
    let run = || {
        let (a, b) = loopback_pair();
        let n = 64 << 10;
        let emulation = |host| Emulation {
            profile: profile.clone(),
            seed: 7,
            host,
        };
        let (ea, eb) = (emulation(0), emulation(1));
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
    assert_eq!(run(), first);
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
