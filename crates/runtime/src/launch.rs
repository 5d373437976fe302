//! `launch`: starts every process of a job on this machine, hosts the rendezvous, streams
//! the processes' output with rank prefixes, and tears the job down when one fails.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
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
}

fn name(rank: usize, workers: usize) -> String {
    if rank < workers {
        format!("worker {rank}")
    } else {
        format!("server {}", rank - workers)
    }
}

/// Starts the job and waits for it. Each process's output lines are printed with a
/// `[worker 0]` / `[server 1]` prefix.
pub fn launch(plan: &LaunchPlan) -> Result<(), LaunchError> {
    let world = plan.workers + plan.servers;
    let token = plan.token.clone().unwrap_or_else(JobToken::generate);
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
        let role = &plan.subcommands[usize::from(rank >= plan.workers)];
        let mut cmd = Command::new(&plan.exe);
        cmd.arg(role)
            .args(&plan.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", addr.ip().to_string())
            .env("MASTER_PORT", addr.port().to_string())
            .env("SYNCOPATE_TOKEN", token.to_hex())
            .env("SYNCOPATE_EXTERNAL_COORDINATOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
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
    let result = supervise(&mut children, plan);
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

fn supervise(children: &mut [(usize, Child)], plan: &LaunchPlan) -> Result<(), LaunchError> {
    let mut done = vec![None::<ExitStatus>; children.len()];
    let mut first_failure: Option<(usize, ExitStatus, Instant)> = None;
    loop {
        for (i, (_, child)) in children.iter_mut().enumerate() {
            if done[i].is_none() {
                if let Ok(Some(status)) = child.try_wait() {
                    done[i] = Some(status);
                    if !status.success() && first_failure.is_none() {
                        first_failure = Some((i, status, Instant::now()));
                    }
                }
            }
        }
        if done.iter().all(Option::is_some) {
            break;
        }
        if let Some((_, _, at)) = first_failure {
            if at.elapsed() > plan.grace {
                let stuck: Vec<String> = children
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| done[*i].is_none())
                    .map(|(_, (r, _))| name(*r, plan.workers))
                    .collect();
                kill_all(children);
                let (i, status, _) =
                    first_failure.unwrap_or((0, ExitStatus::default(), Instant::now()));
                return Err(LaunchError::Failed {
                    what: name(children[i].0, plan.workers),
                    status: describe(&status),
                    others: format!(
                        "; {} had not stopped after {:.0} s and were killed",
                        stuck.join(", "),
                        plan.grace.as_secs_f64()
                    ),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match first_failure {
        None => Ok(()),
        Some((i, status, _)) => Err(LaunchError::Failed {
            what: name(children[i].0, plan.workers),
            status: describe(&status),
            others: String::new(),
        }),
    }
}
