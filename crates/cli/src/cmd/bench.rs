//! `syncopate bench-comm`: ring all-reduce bus bandwidth or parameter-server push/pull time
//! over real processes on this machine, for a list of message sizes.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use syncopate_core::net::parse_size;
use syncopate_core::strategy::{SyncPlan, DEFAULT_BUCKET_BYTES, FRAME_ELEMS};
use syncopate_runtime::auth::JobToken;
use syncopate_runtime::bench::{run_comm_bench, BenchIters, Timing};
use syncopate_runtime::comm::CommOptions;
use syncopate_runtime::env;
use syncopate_runtime::job::{JobLayout, ProcessContext};
use syncopate_runtime::launch::{launch, LaunchPlan, LAUNCH_GRACE};

use crate::args::NetworkArgs;
use crate::cmd::dist::FrameMacArgs;
use crate::sync_args::SyncArgs;

/// The benchmark's send window unless one is given: 4 MiB, one largest frame.
const BENCH_SEND_BUFFER: usize = 4 << 20;

/// Arguments of `syncopate bench-comm` (and of the processes it starts).
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// How the processes synchronise: all-reduce strategies report ring bus bandwidth,
    /// parameter-server ones push + pull time through the servers. Each size is one
    /// message cut into frames of --frame-bytes, so --slice-params, --bucket-mb and --scale
    /// do not apply.
    #[command(flatten)]
    sync: SyncArgs,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Message sizes, comma-separated (per worker: the buffer reduced, or pushed and pulled).
    #[arg(long, default_value = "4KiB,64KiB,1MiB,16MiB,100MiB")]
    sizes: String,
    /// The emulated network (default: unlimited, lossless, and a 4 MiB send window unless
    /// --send-buffer or the --network file says otherwise).
    #[command(flatten)]
    net: NetworkArgs,
    /// Seed of the emulated network's random choices (losses): same seed, same losses.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest frame on the wire: the ring's segment and the parameter server's slice
    /// (payload bytes, a multiple of 4; at most 4 MiB, the default).
    #[arg(long, default_value = "4MiB")]
    frame_bytes: String,
    /// Time at least this many operations per size...
    #[arg(long, default_value_t = 5)]
    min_iters: u64,
    /// ...and about this many seconds' worth of them (estimated from the size at 1 GB/s).
    #[arg(long, default_value_t = 0.25)]
    min_time: f64,
    /// Untimed operations before the timed ones, per size.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Time each operation after a barrier and count its slowest rank's time, as MPI
    /// benchmarks do (all-reduce strategies only). Default: rank 0 times its operations
    /// back to back, each rank starting the next as soon as its last is done.
    #[arg(long)]
    barrier: bool,
    /// After moving any byte, keep polling the sockets without sleeping for this many
    /// microseconds (as MPI's progress loop spins); 0: sleep in epoll until something
    /// happens, as training does by default. Matters for small messages, where waking a
    /// sleeping process costs more than the transfer.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 200)]
    busy_poll_us: u64,
    // Frame MACs, on by default as in a job (`--no-frame-mac` measures without them).
    #[command(flatten)]
    frame_mac: FrameMacArgs,
}

impl BenchArgs {
    /// The benchmark's layout: the plan the sync flags give, with one bucket of the whole
    /// buffer (each size is one message) and frames (ring segments, parameter-server
    /// slices) of at most --frame-bytes.
    pub(crate) fn layout(&self) -> Result<JobLayout> {
        let cut = [
            ("--slice-params", self.sync.slice_params.is_some()),
            (
                "--bucket-mb",
                self.sync.bucket_mb != DEFAULT_BUCKET_BYTES as f64 / 1e6,
            ),
            ("--scale", self.sync.scale.is_some()),
        ];
        if let Some((flag, _)) = cut.iter().find(|(_, given)| *given) {
            bail!("{flag} does not apply to bench-comm: each size is one message cut into frames of --frame-bytes");
        }
        let mut network = self.net.resolve()?;
        if self.net.send_buffer.is_none() && self.net.network.is_none() {
            network.buffer_bytes = BENCH_SEND_BUFFER;
        }
        let strategy = self.sync.strategy()?;
        let frame_elems = self.frame_elems()?;
        let layout = JobLayout {
            sync: SyncPlan {
                bucket_bytes: usize::MAX,
                frame_elems,
                slice_params: frame_elems,
                ..self.sync.plan(strategy, self.workers, 1)?
            },
            network,
            net_seed: self.seed,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Values in the largest frame (`--frame-bytes`).
    fn frame_elems(&self) -> Result<usize> {
        let bytes = parse_size(&self.frame_bytes)?;
        if !(4..=FRAME_ELEMS * 4).contains(&bytes) {
            bail!(
                "--frame-bytes must be between 4 B and {} MiB, got {bytes}",
                (FRAME_ELEMS * 4) >> 20
            );
        }
        Ok(bytes / 4)
    }

    fn sizes(&self) -> Result<Vec<usize>> {
        self.sizes
            .split(',')
            .map(|s| parse_size(s).with_context(|| format!("size '{s}'")))
            .collect()
    }
}

/// `syncopate bench-comm`: starts the processes and prints rank 0's table.
pub fn bench_cmd(args: BenchArgs) -> Result<()> {
    let layout = args.layout()?;
    args.sizes()?;
    if args.barrier && layout.strategy.uses_servers() {
        bail!(
            "--barrier times all-reduce strategies only; {} uses parameter servers",
            layout.strategy.name()
        );
    }
    if !(args.min_time.is_finite() && args.min_time >= 0.0) {
        bail!(
            "--min-time must be a number of seconds >= 0, got {}",
            args.min_time
        );
    }
    let exe = std::env::current_exe().context("locating the syncopate executable")?;
    println!("size_bytes,ranks,median_s,busbw_GBps,iters");
    launch(&LaunchPlan {
        exe,
        args: std::env::args_os().skip(2).collect(),
        subcommands: ["bench-comm-process".into(), "bench-comm-process".into()],
        workers: layout.workers,
        servers: layout.servers,
        connect_timeout: Duration::from_secs(60),
        grace: LAUNCH_GRACE,
        token: None,
    })?;
    Ok(())
}

/// One process of `bench-comm` (started by it; not for direct use).
pub fn bench_process(args: BenchArgs) -> Result<()> {
    let layout = args.layout()?;
    let env =
        env::from_env()?.context("bench-comm-process is started by `syncopate bench-comm`")?;
    let ctx = ProcessContext {
        rank: env.rank,
        token: JobToken::resolve(None, None)?,
        coordinator: format!("{}:{}", env.master_addr, env.master_port).parse()?,
        host_coordinator: false,
        bind_ip: "127.0.0.1".parse()?,
        connect_timeout: Duration::from_secs(60),
        comm: CommOptions {
            busy_poll: Duration::from_micros(args.busy_poll_us),
            frame_mac: args.frame_mac.on(),
            ..CommOptions::default()
        },
        metrics: None,
    };
    let iters = BenchIters {
        warmup: args.warmup,
        min_iters: args.min_iters,
        min_time_s: args.min_time,
        timing: if args.barrier {
            Timing::Barrier
        } else {
            Timing::BackToBack
        },
    };
    let rows = run_comm_bench(&ctx, &layout, &args.sizes()?, iters)?;
    if ctx.rank == 0 {
        for r in rows {
            println!(
                "{},{},{:.6},{:.3},{}",
                r.size_bytes, r.ranks, r.median_s, r.busbw_gbps, r.iters
            );
        }
    }
    Ok(())
}
