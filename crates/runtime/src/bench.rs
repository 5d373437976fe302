//! Communication benchmarks over real processes: ring all-reduce bus bandwidth and
//! parameter-server push/pull time for a range of message sizes. The whole exchange runs in
//! the communication loop's thread (no training), so it measures the transport and the
//! strategies alone.

use std::time::Instant;

use serde::Serialize;
use syncopate_core::registry::KeyInfo;
use syncopate_core::strategy::{Rank, ServerOptim, WorkerEvent, WorkerSync};

use crate::collective::DrivesSteps;
use crate::comm::{CommLoop, Flow};
use crate::error::RunError;
use crate::job::{JobLayout, ProcessContext};
use crate::process::join;
use crate::server::ServerHooks;

/// One measured size.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// Message size in bytes (the whole buffer reduced or pushed by each worker).
    pub size_bytes: usize,
    /// Worker processes.
    pub ranks: usize,
    /// Median time of one operation, seconds.
    pub median_s: f64,
    /// All-reduce: 2(n-1)/n x bytes / time; parameter server: 2 x bytes / time per worker.
    pub busbw_gbps: f64,
    /// Timed iterations.
    pub iters: usize,
}

/// Drives one endpoint through steps `step..end` of one size inside the loop's thread,
/// timing each operation from its start on this rank to its end (those from `timed_from`).
struct BenchHooks {
    layout: JobLayout,
    data: Vec<f32>,
    step: u64,
    timed_from: u64,
    end: u64,
    started: Option<Instant>,
    times: Vec<f64>,
    in_flight: bool,
    /// The averaged values of the last operation, when asked for (a gather's): taking
    /// them copies the buffer, which would be timed too.
    result: Option<Vec<f32>>,
}

impl BenchHooks {
    /// Hooks for steps `step..step + count` of `data`, timing those from `timed_from`.
    fn new(layout: &JobLayout, data: Vec<f32>, step: u64, count: u64, timed_from: u64) -> Self {
        Self {
            layout: layout.clone(),
            data,
            step,
            timed_from,
            end: step + count,
            started: None,
            times: Vec::new(),
            in_flight: false,
            result: None,
        }
    }

    fn advance(&mut self, ep: &mut dyn WorkerSync) -> Flow {
        while let Some(ev) = ep.poll_event() {
            if let (WorkerEvent::GradReady(key), Some(result)) = (ev, self.result.as_mut()) {
                *result = ep.take_values(key);
            }
            if ev == WorkerEvent::StepDone {
                if let Some(t) = self.started.take() {
                    if self.step >= self.timed_from {
                        self.times.push(t.elapsed().as_secs_f64());
                    }
                }
                self.in_flight = false;
                self.step += 1;
            }
        }
        if self.step >= self.end {
            return Flow::Finish;
        }
        if !self.in_flight {
            self.in_flight = true;
            // Where the strategy has a buffer of its own, the input is written there before
            // the clock starts: an in-place all-reduce of a freshly filled buffer, as torch's
            // `all_reduce` after `copy_` and MPI's `MPI_IN_PLACE` after a `memcpy` are timed.
            let in_place = match ep.gradient_slot(0) {
                Some(slot) if slot.len() == self.data.len() => {
                    slot.copy_from_slice(&self.data);
                    true
                }
                _ => false,
            };
            self.started = Some(Instant::now());
            ep.begin_step(self.step);
            if in_place {
                ep.handle_gradient_in_place(0);
            } else {
                ep.handle_gradient(0, &self.data);
            }
            ep.handle_backward_done();
        }
        Flow::Continue
    }
}

impl DrivesSteps for BenchHooks {
    fn advance(&mut self, ep: &mut (dyn WorkerSync + Send + 'static)) -> Flow {
        BenchHooks::advance(self, ep)
    }
    fn step(&self) -> u64 {
        self.step
    }
    fn layout(&self) -> &JobLayout {
        &self.layout
    }
}

/// The "model fingerprint" benchmark processes agree on.
pub const BENCH_FINGERPRINT: u64 = 0xbe9c_0000;

/// How many operations to time for each size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchIters {
    /// Untimed operations first (buffers faulted in, connections warmed up).
    pub warmup: u64,
    /// At least this many timed operations...
    pub min_iters: u64,
    /// ...and enough for about this many seconds at loopback speed (an estimate from the size,
    /// so that every rank times the same number of operations without agreeing on it).
    pub min_time_s: f64,
    /// How each operation is timed.
    pub timing: Timing,
}

/// How `bench-comm` times an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Timing {
    /// Rank 0's operations one after the other (each rank starts the next as soon as its
    /// last is done).
    #[default]
    BackToBack,
    /// Each operation after a barrier (an all-reduce of one value), the slowest rank's
    /// time, as MPI benchmarks time (ring all-reduce strategies only).
    Barrier,
}

impl Default for BenchIters {
    fn default() -> Self {
        Self {
            warmup: 2,
            min_iters: 5,
            min_time_s: 0.25,
            timing: Timing::BackToBack,
        }
    }
}

impl BenchIters {
    /// Timed operations for a message of `bytes`: `min_time_s` at an assumed 1 GB/s, at least
    /// `min_iters`, at most 10,000.
    pub fn timed(&self, bytes: usize) -> u64 {
        let estimate_s = bytes.max(1) as f64 / 1e9 + 20e-6;
        ((self.min_time_s / estimate_s) as u64)
            .clamp(self.min_iters.max(1), 10_000.max(self.min_iters))
    }
}

/// Runs the benchmark for each size in `sizes` (bytes) on this process; workers return
/// their rows (rank 0's are the ones to report), servers an empty list. Frames carry at most
/// the plan's `frame_elems` (ring segments) or `slice_params` (parameter-server slices).
pub fn run_comm_bench(
    ctx: &ProcessContext,
    layout: &JobLayout,
    sizes: &[usize],
    iters: BenchIters,
) -> Result<Vec<BenchRow>, RunError> {
    let mut rows = Vec::new();
    // One set of links for every size: each size is one run of the loop, and the goodbye
    // exchange at the end of a run keeps the rounds apart.
    let joined = join(ctx, layout, BENCH_FINGERPRINT)?;
    let (links, sockets) = (joined.links, joined.datagram_sockets);
    let emulation = layout.emulation(ctx.rank);
    let (mut comm, _waker) = CommLoop::new(links, ctx.comm.clone(), emulation, sockets)
        .map_err(|e| RunError::Local(format!("setting up the links: {e}")))?;
    for &bytes in sizes {
        let numel = (bytes / 4).max(1);
        let keys = vec![KeyInfo { numel, layer: 0 }];
        let timed = iters.timed(bytes);
        if ctx.rank >= layout.workers {
            let initial = vec![vec![0.0; numel]];
            let mut server = layout
                .server_endpoint(ctx.rank, keys, initial, ServerOptim::plain(0.0))
                .map_err(|e| RunError::Local(e.to_string()))?;
            let mut server_hooks = ServerHooks::new(layout, ctx.rank, None, None);
            comm.run(server.as_mut(), &mut server_hooks)?;
            continue;
        }
        let data: Vec<f32> = (0..numel).map(|i| (i % 7) as f32).collect();
        // One bucket of the whole buffer (the bench's layout has unbounded buckets).
        let mut ep = layout.worker_endpoint(ctx.rank, keys);
        let mut t = match iters.timing {
            Timing::BackToBack => {
                let count = iters.warmup + timed;
                let mut hooks = BenchHooks::new(layout, data, 0, count, iters.warmup);
                comm.run(ep.as_mut(), &mut hooks)?;
                hooks.times
            }
            Timing::Barrier => barrier_timed(
                &mut comm,
                layout,
                ctx.rank,
                ep.as_mut(),
                data,
                iters.warmup,
                timed,
            )?,
        };
        t.sort_by(|a, b| a.total_cmp(b));
        let median = t.get(t.len() / 2).copied().unwrap_or(f64::NAN);
        let n = layout.workers as f64;
        let moved = if layout.strategy.uses_servers() {
            2.0 * bytes as f64
        } else {
            2.0 * (n - 1.0) / n * bytes as f64
        };
        rows.push(BenchRow {
            size_bytes: bytes,
            ranks: layout.workers,
            median_s: median,
            busbw_gbps: moved / median / 1e9,
            iters: t.len(),
        });
    }
    Ok(rows)
}

/// Times `timed` operations of `ep` (after `warmup` untimed ones), each after a barrier:
/// an all-reduce of one value, which no rank leaves before every rank has entered it. Each
/// rank times its operation from leaving the barrier to its end; the ranks' times are then
/// gathered (an all-reduce in which each rank fills only its own slots) and each operation
/// counts with its slowest rank's time, as MPI benchmarks report.
fn barrier_timed(
    comm: &mut CommLoop,
    layout: &JobLayout,
    rank: Rank,
    ep: &mut (dyn WorkerSync + Send + 'static),
    data: Vec<f32>,
    warmup: u64,
    timed: u64,
) -> Result<Vec<f64>, RunError> {
    let one = vec![KeyInfo { numel: 1, layer: 0 }];
    let mut barrier = layout.worker_endpoint(rank, one);
    let mut mine = Vec::new();
    let mut data = data;
    for step in 0..warmup + timed {
        let mut hooks = BenchHooks::new(layout, vec![0.0], step, 1, u64::MAX);
        comm.run(barrier.as_mut(), &mut hooks)?;
        let mut hooks = BenchHooks::new(layout, data, step, 1, warmup);
        comm.run(&mut *ep, &mut hooks)?;
        mine.extend(hooks.times);
        data = hooks.data;
    }
    let n = layout.workers;
    let per_rank = mine.len();
    let mut slots = vec![0f32; n * per_rank];
    for (slot, t) in slots[rank * per_rank..].iter_mut().zip(&mine) {
        *slot = *t as f32;
    }
    let all = vec![KeyInfo {
        numel: slots.len().max(1),
        layer: 0,
    }];
    let mut gather = layout.worker_endpoint(rank, all);
    let mut hooks = BenchHooks::new(layout, slots, 0, 1, u64::MAX);
    hooks.result = Some(Vec::new());
    comm.run(gather.as_mut(), &mut hooks)?;
    let gathered = hooks.result.unwrap_or_default();
    // The all-reduce averages: each slot holds one rank's time divided by n.
    let slowest = (0..per_rank)
        .map(|i| {
            (0..n)
                .filter_map(|r| gathered.get(r * per_rank + i))
                .map(|&v| f64::from(v) * n as f64)
                .fold(0.0, f64::max)
        })
        .collect();
    Ok(slowest)
}
