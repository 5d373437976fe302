//! `launch`: starts every process of a job on this machine, hosts the rendezvous, streams
//! the processes' output with rank prefixes, and tears the job down when one fails or when
//! `launch` itself is told to stop.
//!
//! The processes are bound to `launch`: SIGTERM or SIGINT sent to it is forwarded to every
//! one of them, which get [`LAUNCH_GRACE`] to end before they are killed, and then `launch`
//! fails with [`LaunchError::Stopped`] (exit status 128 + the signal, as a shell reports a
//! command a signal ended). Should `launch` die without a chance to do so (SIGKILL), the
//! kernel kills them (a parent-death signal each asks for before it starts). The job token
//! reaches them in their environment, never on their command line.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{JobToken, PeerInfo, Role};
use crate::rendezvous::serve_coordinator;

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// The `syncopate` executable.
    pub exe: PathBuf,
    /// Arguments after the subcommand, passed to every process unchanged.
    pub args: Vec<OsString>,
    /// Subcommands that run a worker and a server (`worker`, `server`).
    pub subcommands: [String; 2],
    /// Workers to start (ranks `0..workers`).
    pub workers: usize,
    /// Servers to start (ranks `workers..`).
    pub servers: usize,
    /// How long the processes get to find each other.
    pub connect_timeout: Duration,
    /// How long the others get to stop by themselves after one failed.
    pub grace: Duration,
    /// The job token (`None`: a fresh one). The processes are given it in
    /// `$SYNCOPATE_TOKEN`; a `--token` among `args` must be this one.
    pub token: Option<JobToken>,
}

/// How long the other processes get to stop by themselves once one has failed: they learn
/// of it within a tenth of a second (abort frames), so a process still running after this
/// is frozen or stuck, and is killed.
pub const LAUNCH_GRACE: Duration = Duration::from_secs(2);

/// Failure of a launched job.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A process could not be started.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which process.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The rendezvous socket could not be opened.
    #[error("cannot open the rendezvous socket: {0}")]
    Listen(std::io::Error),
    /// A process failed; the others were stopped.
    #[error("{what} failed ({status}); the job was stopped{others}")]
    Failed {
        /// The first process that failed.
        what: String,
        /// Its exit status.
        status: String,
        /// What happened to the others.
        others: String,
    },
    /// The handlers for SIGTERM and SIGINT could not be installed.
    #[error("cannot catch SIGTERM and SIGINT: {0}")]
    Signals(std::io::Error),
    /// `launch` was told to stop (SIGTERM, SIGINT) and passed the signal on to the job's
    /// processes, which have all ended.
    #[error("stopped by {}: the job's processes were sent it{others}", signal_name(*.signal))]
    Stopped {
        /// The signal's number.
        signal: i32,
        /// What happened to the processes (empty: they all ended within the grace).
        others: String,
    },
}

impl LaunchError {
    /// The exit status a shell gives a command that a signal ended (128 + the signal), for
    /// [`LaunchError::Stopped`]; `None` for every other failure.
    pub fn exit_code(&self) -> Option<u8> {
        match self {
            LaunchError::Stopped { signal, .. } => signal
                .checked_add(128)
                .and_then(|code| u8::try_from(code).ok()),
            _ => None,
        }
    }
}

/// The signals that stop a launched job: `launch` passes them on to its processes.
pub const STOP_SIGNALS: [i32; 2] = [libc::SIGTERM, libc::SIGINT];

fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        other => format!("signal {other}"),
    }
}

/// From now on, a stop signal to this process is recorded (its number) rather than fatal.
fn catch_stop_signals() -> Result<Arc<AtomicUsize>, LaunchError> {
    let caught = Arc::new(AtomicUsize::new(0));
    for signal in STOP_SIGNALS {
        // A signal number is small and positive.
        let number = usize::try_from(signal).unwrap_or(usize::MAX);
        signal_hook::flag::register_usize(signal, Arc::clone(&caught), number)
            .map_err(LaunchError::Signals)?;
    }
    Ok(caught)
}

/// Makes the process `command` starts die (SIGKILL) when this thread's process ends, and
/// refuse to start if it already has.
fn die_with_parent(command: &mut Command) {
    // SAFETY: `getpid` has no preconditions.
    let parent = unsafe { libc::getpid() };
    let in_child = move || {
        // SAFETY: between fork and exec the child may only call async-signal-safe
        // functions: `prctl` and `getppid` are system calls, and nothing here allocates.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died before the death signal was asked for: none will come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Ok(())
    };
    // SAFETY: `in_child` is async-signal-safe (see above).
    unsafe {
        command.pre_exec(in_child);
    }
}

/// The command that starts process `rank` of the job: the plan's subcommand and arguments,
/// the rendezvous at `rendezvous`, the token in `$SYNCOPATE_TOKEN` (never an argument: the
/// command lines of every process are visible to every user of the machine).
fn child_command(
    plan: &LaunchPlan,
    rank: usize,
    rendezvous: SocketAddr,
    token: &JobToken,
) -> Command {
    let world = plan.workers + plan.servers;
    let role = &plan.subcommands[usize::from(rank >= plan.workers)];
    let mut cmd = Command::new(&plan.exe);
    cmd.arg(role)
        .args(&plan.args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", rendezvous.ip().to_string())
        .env("MASTER_PORT", rendezvous.port().to_string())
        .env(crate::auth::TOKEN_ENV, token.to_hex())
        .env("SYNCOPATE_EXTERNAL_COORDINATOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    cmd
}

fn name(rank: usize, workers: usize) -> String {
    if rank < workers {
        format!("worker {rank}")
    } else {
        format!("server {}", rank - workers)
    }
}

/// Starts the job and waits for it. Each process's output lines are printed with a
/// `[worker 0]` / `[server 1]` prefix. From its start, SIGTERM and SIGINT no longer end
/// this process: they stop the job (see the module docs).
pub fn launch(plan: &LaunchPlan) -> Result<(), LaunchError> {
    let world = plan.workers + plan.servers;
    let token = plan.token.clone().unwrap_or_else(JobToken::generate);
    let stop = catch_stop_signals()?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(LaunchError::Listen)?;
    let addr: SocketAddr = listener.local_addr().map_err(LaunchError::Listen)?;
    let coordinator = {
        let token = token.clone();
        let info = PeerInfo::new(0, Role::Coordinator, 0, "", plan.workers, plan.servers);
        let timeout = plan.connect_timeout;
        std::thread::spawn(move || serve_coordinator(listener, &token, &info, world, timeout))
    };
    let mut children: Vec<(usize, Child)> = Vec::new();
    let mut pipes = Vec::new();
    for rank in 0..world {
        let mut child = match child_command(plan, rank, addr, &token).spawn() {
            Ok(c) => c,
            Err(source) => {
                kill_all(&mut children);
                return Err(LaunchError::Spawn {
                    what: name(rank, plan.workers),
                    source,
                });
            }
        };
        let prefix = format!("[{}] ", name(rank, plan.workers));
        if let Some(out) = child.stdout.take() {
            pipes.push(stream_lines(out, prefix.clone(), false));
        }
        if let Some(err) = child.stderr.take() {
            pipes.push(stream_lines(err, prefix, true));
        }
        children.push((rank, child));
    }
    let result = supervise(&mut children, plan, &stop);
    // After a success the coordinator has finished; after a failure it may still wait for
    // members that will never come, so it is left to end with this process.
    if result.is_ok() {
        let _ = coordinator.join();
    }
    for p in pipes {
        let _ = p.join();
    }
    result
}

fn stream_lines<R: std::io::Read + Send + 'static>(
    r: R,
    prefix: String,
    stderr: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let reader = BufReader::new(r);
        // Progress bars redraw with carriage returns: show each redraw as its own line.
        for line in reader.split(b'\n').map_while(Result::ok) {
            let text = String::from_utf8_lossy(&line);
            for part in text.split('\r').filter(|p| !p.trim().is_empty()) {
                if stderr {
                    eprintln!("{prefix}{part}");
                } else {
                    println!("{prefix}{part}");
                }
            }
        }
    })
}

fn kill_all(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn describe(status: &ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".into(),
    }
}

/// Sends `signal` to every process not known to have ended (a reaped one's pid may have
/// been reused; an ended but unreaped one's has not).
fn signal_running(children: &[(usize, Child)], done: &[Option<ExitStatus>], signal: i32) {
    for ((_, child), _) in children.iter().zip(done).filter(|(_, d)| d.is_none()) {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: `kill` has no memory-safety preconditions; `pid` is our unreaped child.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }
}

/// Records the exit of every process that ended since the last look; returns the index and
/// status of the first that failed among them.
fn reap(
    children: &mut [(usize, Child)],
    done: &mut [Option<ExitStatus>],
) -> Option<(usize, ExitStatus)> {
    let mut failed = None;
    for (i, ((_, child), slot)) in children.iter_mut().zip(done.iter_mut()).enumerate() {
        if slot.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                *slot = Some(status);
                if !status.success() {
                    failed = failed.or(Some((i, status)));
                }
            }
        }
    }
    failed
}

/// Waits until every process has ended or `grace` has passed, then kills those still
/// running; says which had to be killed ("" when none).
fn wait_or_kill(
    children: &mut [(usize, Child)],
    done: &mut [Option<ExitStatus>],
    grace: Duration,
    workers: usize,
) -> String {
    let until = Instant::now() + grace;
    reap(children, done);
    while done.iter().any(Option::is_none) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
        reap(children, done);
    }
    let stuck: Vec<String> = (children.iter().zip(done.iter()))
        .filter(|(_, d)| d.is_none())
        .map(|((r, _), _)| name(*r, workers))
        .collect();
    kill_all(children);
    if stuck.is_empty() {
        return String::new();
    }
    format!(
        "; {} had not stopped after {:.0} s and were killed",
        stuck.join(", "),
        grace.as_secs_f64()
    )
}

/// Waits for the job: to its end, to the first failure (the others then get `plan.grace`
/// to stop by themselves), or to a stop signal (passed on to every process).
fn supervise(
    children: &mut [(usize, Child)],
    plan: &LaunchPlan,
    stop: &AtomicUsize,
) -> Result<(), LaunchError> {
    let mut done = vec![None::<ExitStatus>; children.len()];
    let mut first_failure: Option<(usize, ExitStatus, Instant)> = None;
    loop {
        let signal = i32::try_from(stop.load(Ordering::SeqCst)).unwrap_or(libc::SIGTERM);
        if signal != 0 {
            signal_running(children, &done, signal);
            let others = wait_or_kill(children, &mut done, plan.grace, plan.workers);
            return Err(LaunchError::Stopped { signal, others });
        }
        if let Some((i, status)) = reap(children, &mut done) {
            first_failure = first_failure.or(Some((i, status, Instant::now())));
        }
        if done.iter().all(Option::is_some) {
            break;
        }
        if let Some((i, status, at)) = first_failure {
            if at.elapsed() > plan.grace {
                let others = wait_or_kill(children, &mut done, Duration::ZERO, plan.workers);
                return Err(failed(children, i, &status, plan.workers, others));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match first_failure {
        None => Ok(()),
        Some((i, status, _)) => Err(failed(children, i, &status, plan.workers, String::new())),
    }
}

fn failed(
    children: &[(usize, Child)],
    i: usize,
    status: &ExitStatus,
    workers: usize,
    others: String,
) -> LaunchError {
    let rank = children.get(i).map_or(0, |(r, _)| *r);
    LaunchError::Failed {
        what: name(rank, workers),
        status: describe(status),
        others,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> LaunchPlan {
        LaunchPlan {
            exe: PathBuf::from("/bin/true"),
            args: args.iter().map(OsString::from).collect(),
            subcommands: ["worker".into(), "server".into()],
            workers: 2,
            servers: 1,
            connect_timeout: Duration::from_secs(1),
            grace: LAUNCH_GRACE,
            token: None,
        }
    }

    #[test]
    fn the_token_reaches_a_process_in_its_environment_not_its_arguments() {
        let token = JobToken::generate();
        let addr: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        for rank in 0..3 {
            let cmd = child_command(&plan(&["--launched-job", "{}"]), rank, addr, &token);
            let args: Vec<String> = cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            assert!(
                !args.iter().any(|a| a.contains(&token.to_hex())),
                "{args:?}"
            );
            assert_eq!(args[0], if rank < 2 { "worker" } else { "server" });
            let env = cmd.get_envs().find(|(k, _)| *k == crate::auth::TOKEN_ENV);
            assert_eq!(
                env.and_then(|(_, v)| v)
                    .map(|v| v.to_string_lossy().into_owned()),
                Some(token.to_hex())
            );
        }
    }

    #[test]
    fn a_stop_signal_gives_the_conventional_exit_status() {
        let stopped = |signal| LaunchError::Stopped {
            signal,
            others: String::new(),
        };
        assert_eq!(stopped(libc::SIGTERM).exit_code(), Some(143));
        assert_eq!(stopped(libc::SIGINT).exit_code(), Some(130));
        assert!(stopped(libc::SIGINT).to_string().contains("SIGINT"));
        assert_eq!(LaunchError::Listen(io::Error::other("x")).exit_code(), None);
    }
}
