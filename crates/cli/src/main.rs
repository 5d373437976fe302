//! The `syncopate` command: parses the flags, turns them into the library crates' settings and
//! calls them; what a job, a study or a simulation does is decided in those crates (a
//! distributed job's rules in `syncopate_runtime::job`, its summary and replica statistics
//! in `syncopate_runtime::outcome`).

use clap::{Parser, Subcommand};

mod args;
mod cmd;
mod progress;
mod study;
mod sync_args;

// Counted, so that the metrics CSV's `heap_bytes` tells a leak from the allocator's cache.
#[global_allocator]
static GLOBAL: syncopate_runtime::heap::CountingAlloc<mimalloc::MiMalloc> =
    syncopate_runtime::heap::CountingAlloc(mimalloc::MiMalloc);

/// Syncopate: data-parallel DNN training whose subject is the synchronisation step.
#[derive(Parser)]
#[command(name = "syncopate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model in this process (the single-process reference).
    Train(cmd::train::TrainArgs),
    /// Start a distributed job on this machine: N workers (and S servers) on 127.0.0.1.
    Launch(cmd::dist::JobArgs),
    /// Run one worker of a distributed job (rank and rendezvous from torchrun, mpirun or
    /// srun environment variables).
    Worker(cmd::dist::MemberArgs),
    /// Run one parameter server of a distributed job (ranks after the workers').
    Server(cmd::dist::MemberArgs),
    /// List the built-in models with their layers, keys and parameter counts.
    Models(cmd::models::ModelsArgs),
    /// Benchmark the transport: ring all-reduce bus bandwidth or PS push/pull per size.
    ///
    /// The ring all-reduce (allreduce, allreduce-no-overlap) is timed in place, as torch's
    /// `all_reduce` and MPI's `MPI_IN_PLACE` are: each operation's input is written into the
    /// strategy's own buffer before the clock starts. The other strategies copy it in on
    /// the clock.
    BenchComm(cmd::bench::BenchArgs),
    /// Run a study: a matrix of jobs (models x strategies x bandwidths x workers x seeds)
    /// one after another, resumable, then its report (results.csv, report.html). Its `kind`
    /// makes each run a job (`launch`), a simulation (`simulate`), both side by side with
    /// the ratio of their step times (`agreement`), a job on the kernel's network-namespace
    /// testbed (`kernel`), or that and the emulated job side by side (`fidelity`), or that and
    /// its simulation (`simulator-kernel`).
    Study(study::StudyArgs),
    /// Simulate strategies on virtual time with the very state machines the runtime runs:
    /// step time, throughput, link utilisation, a trace; lists of strategies, bandwidths or
    /// workers make a sweep (CSV and plot).
    Simulate(cmd::simulate::SimulateArgs),
    /// Rebuild a study's report from its finished runs.
    Report(study::ReportArgs),
    /// Print selected figures of a result file (a job summary, a member's summary, a
    /// simulator report or a transfer), read through the type that wrote it: plain values on
    /// one line, tab-separated, for scripts; a field the file's type lacks is an error.
    Summary(cmd::summary::SummaryArgs),
    /// Bulk transfers through the network model alone (N senders to one receiver over the
    /// reliable transport): the model's side of the calibration against the kernel's TCP.
    Transfer(cmd::transfer::TransferArgs),
    /// One process of `bench-comm` (started by it).
    #[command(hide = true)]
    BenchCommProcess(cmd::bench::BenchArgs),
}

/// Lets only the simulator have transparent huge pages. Its state (tens of MiB for 1,024
/// workers, read at random, one cache miss after another) costs a TLB miss per cache miss
/// on 4 KiB pages. Every other command keeps 4 KiB pages, on which a training process's
/// resident memory neither grows by 10 MiB nor moves in 2 MiB steps (docs/BENCHMARKS.md,
/// "Reliability"). The allocator asks for huge pages; a
/// process that disabled them does not get them. This runs before `main`, before the
/// allocator maps its first arena (whose first pages would otherwise be huge: 3 MiB more
/// for every process), from an `.init_array` entry, to which glibc passes `argc` and `argv`.
///
/// The simulator also keeps the memory it frees (the allocator's purge delay of -1, unless
/// `MIMALLOC_PURGE_DELAY` says otherwise): its queues and frame tables shrink and grow
/// with every incast, and each page the allocator had given back is a fault and a cleared
/// 2 MiB page when it is taken again (docs/BENCHMARKS.md, "1,024 workers with 1 % loss").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod simulator_memory {
    use std::ffi::{c_char, c_int, c_long, CStr};

    /// mimalloc's `mi_option_purge_delay` (v3's `mimalloc.h`; the crate names no constant
    /// for it): how long freed memory is kept before it goes back to the kernel, in ms.
    const MI_OPTION_PURGE_DELAY: c_int = 15;
    const PURGE_DELAY_VARIABLE: &[u8] = b"MIMALLOC_PURGE_DELAY=";

    extern "C" {
        fn mi_option_set(option: c_int, value: c_long);
        #[cfg(test)]
        fn mi_option_get(option: c_int) -> c_long;
    }

    extern "C" fn for_simulate_only(
        argc: c_int,
        argv: *const *const c_char,
        envp: *const *const c_char,
    ) {
        let command = (argc > 1 && !argv.is_null())
            // SAFETY: glibc passes the program's `argc` NUL-terminated arguments in `argv`.
            .then(|| unsafe { CStr::from_ptr(*argv.add(1)) });
        if command != Some(c"simulate") {
            // Before `main` there is nowhere to report a failure; it would only leave the
            // kernel's default (memory, not correctness).
            let _ = rustix::thread::disable_transparent_huge_pages(true);
        } else if !purge_delay_is_set(envp) {
            // SAFETY: a plain store into mimalloc's option table, valid before its
            // initialisation (which then keeps the value) as after.
            unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
        }
    }

    /// Whether the environment `envp` (NULL-terminated, as glibc passes it) sets the
    /// allocator's purge delay; read without allocating, before the allocator starts.
    fn purge_delay_is_set(envp: *const *const c_char) -> bool {
        let mut at = envp;
        while !at.is_null() {
            // SAFETY: `envp` is a NULL-terminated array of NUL-terminated strings; `at`
            // stays within it, stopping at its NULL.
            let entry = unsafe { *at };
            if entry.is_null() {
                return false;
            }
            // SAFETY: as above, `entry` is a NUL-terminated string.
            let bytes = unsafe { CStr::from_ptr(entry) }.to_bytes();
            if bytes.starts_with(PURGE_DELAY_VARIABLE) {
                return true;
            }
            // SAFETY: `entry` was not the terminating NULL, so the next slot exists.
            at = unsafe { at.add(1) };
        }
        false
    }

    /// Priority 100: before the allocator's constructor, whichever compiler built it (gcc
    /// gives it no priority, clang 101), and after the standard library's own (99).
    #[used]
    #[link_section = ".init_array.00100"]
    static RUN_BEFORE_MAIN: extern "C" fn(c_int, *const *const c_char, *const *const c_char) =
        for_simulate_only;

    #[cfg(test)]
    mod tests {
        use super::*;
        use rustix::thread::{disable_transparent_huge_pages, transparent_huge_pages_are_disabled};

        fn run_with(args: &[&CStr]) {
            let argv: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
            // The purge delay stays the other test's to change.
            let envp = environment(&[c"MIMALLOC_PURGE_DELAY=1000"]);
            for_simulate_only(args.len() as c_int, argv.as_ptr(), envp.as_ptr());
        }

        fn environment(vars: &[&CStr]) -> Vec<*const c_char> {
            let mut envp: Vec<*const c_char> = vars.iter().map(|v| v.as_ptr()).collect();
            envp.push(std::ptr::null());
            envp
        }

        #[test]
        fn only_simulate_keeps_freed_memory_unless_the_environment_says() {
            // SAFETY: reads mimalloc's option table.
            let get = || unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
            // This test binary's own entry ran with its first argument taken for the command.
            let pre_main = std::env::args().nth(1).as_deref() == Some("simulate");
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() && !pre_main {
                // v3's default, 1 s, and no other option's: the index names the option.
                assert_eq!(get(), 1000);
            }
            let set = environment(&[c"HOME=/root", c"MIMALLOC_PURGE_DELAY=10"]);
            assert!(purge_delay_is_set(set.as_ptr()));
            assert!(!purge_delay_is_set(environment(&[c"HOME=/root"]).as_ptr()));
            assert!(!purge_delay_is_set(std::ptr::null()));
            let before = get();
            let argv = [c"syncopate".as_ptr(), c"simulate".as_ptr()];
            for_simulate_only(2, argv.as_ptr(), set.as_ptr());
            assert_eq!(get(), before);
            let unset = environment(&[c"HOME=/root"]);
            for_simulate_only(2, argv.as_ptr(), unset.as_ptr());
            assert_eq!(get(), -1);
            // SAFETY: as above; restores the default for the other tests.
            unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, before) };
        }

        #[test]
        fn only_simulate_keeps_huge_pages() {
            // This test binary carries the same entry, run before its `main` with its own
            // first argument (a test filter, if any) taken for the command.
            let first = std::env::args().nth(1);
            let pre_main = first.as_deref() != Some("simulate");
            assert_eq!(transparent_huge_pages_are_disabled().unwrap(), pre_main);
            disable_transparent_huge_pages(false).unwrap();
            run_with(&[c"syncopate", c"simulate", c"--workers", c"4"]);
            assert!(!transparent_huge_pages_are_disabled().unwrap());
            run_with(&[c"syncopate", c"train"]);
            assert!(transparent_huge_pages_are_disabled().unwrap());
            disable_transparent_huge_pages(false).unwrap();
            run_with(&[c"syncopate"]);
            assert!(transparent_huge_pages_are_disabled().unwrap());
        }
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(a) => cmd::train::run(a),
        Command::Launch(a) => cmd::dist::launch_cmd(a),
        Command::Worker(a) => cmd::dist::worker_cmd(a),
        Command::Server(a) => cmd::dist::server_cmd(a),
        Command::Models(a) => cmd::models::run(a),
        Command::BenchComm(a) => cmd::bench::bench_cmd(a),
        Command::BenchCommProcess(a) => cmd::bench::bench_process(a),
        Command::Study(a) => study::study_cmd(a),
        Command::Report(a) => study::report_cmd(a),
        Command::Simulate(a) => cmd::simulate::run(a),
        Command::Transfer(a) => cmd::transfer::run(a),
        Command::Summary(a) => cmd::summary::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            // `launch` stopped by a signal ends as a shell reports it: 128 + the signal.
            let stopped = e.downcast_ref::<syncopate_runtime::launch::LaunchError>();
            match stopped.and_then(syncopate_runtime::launch::LaunchError::exit_code) {
                Some(code) => std::process::ExitCode::from(code),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}
