//! The network-namespace testbed of kernel and fidelity studies: `scripts/netns-cluster.sh`
//! runs a cell's job, one host per process in its own namespace behind the kernel's qdiscs
//! and nftables; this module only finds the script, checks that this machine can run it and
//! builds its command line (the testbed itself is the script's).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// The script, relative to the repository root.
const SCRIPT: &str = "scripts/netns-cluster.sh";

/// The tools the testbed needs on PATH.
const TOOLS: [&str; 3] = ["ip", "tc", "nft"];

/// The testbed script: in the repository that built `exe` (`target/<profile>/syncopate`),
/// else under the current folder.
fn script(exe: &Path) -> Result<PathBuf> {
    let beside = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(|root| root.join(SCRIPT));
    let candidates = beside.into_iter().chain([PathBuf::from(SCRIPT)]);
    for path in candidates {
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "the namespace testbed ({SCRIPT}) is neither in the repository of {} nor under the \
         current folder: run the study from the repository root",
        exe.display()
    )
}

/// The effective user id, from `/proc/self/status` (`None`: unreadable).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `tool` is an executable file in a folder of PATH.
fn on_path(tool: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(tool))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Why this machine cannot run testbed cells (`None`: it can): they need root (network
/// namespaces) and `ip`, `tc` and `nft` on PATH.
pub fn unavailable() -> Option<String> {
    match effective_uid() {
        Some(0) => {}
        Some(uid) => return Some(format!("it needs root (running as uid {uid})")),
        None => return Some("it needs root (no readable /proc/self/status)".into()),
    }
    let missing: Vec<&str> = TOOLS.into_iter().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        return Some(format!(
            "it needs {} on PATH (Debian: apt-get install iproute2 nftables)",
            missing.join(", ")
        ));
    }
    None
}

/// Fails, saying why, when this machine cannot run testbed cells.
pub fn check_host() -> Result<()> {
    match unavailable() {
        Some(why) => bail!(
            "a kernel or fidelity study runs its cells in network namespaces behind the \
             kernel's qdiscs and nftables: {why}"
        ),
        None => Ok(()),
    }
}

/// The command of a testbed cell with arguments `args` (the script's flags, `--`, the job's
/// flags), writing into `out`, its processes running `exe`.
pub fn command(exe: &Path, args: &[String], out: &Path) -> Result<Command> {
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let mut cmd = Command::new("bash");
    cmd.arg(script(exe)?)
        .args(&args[..split])
        .arg("--out")
        .arg(out)
        .args(&args[split..])
        .env("SYNCOPATE_BIN", exe);
    Ok(cmd)
}

/// The totals of a testbed job's `kernel.json` (the script's counters at the bottleneck).
#[derive(Debug, Deserialize)]
struct KernelTotal {
    /// Packets the bottleneck's qdiscs dropped (tail drops).
    qdisc_dropped_packets: u64,
    /// Packets nftables dropped at random.
    nft_dropped_packets: u64,
    /// Packets nftables dropped in blackouts (absent: no blackouts).
    #[serde(default)]
    blackout_dropped_packets: u64,
}

/// A testbed job's `kernel.json`.
#[derive(Debug, Deserialize)]
struct KernelCounters {
    /// Over every bottleneck port and direction.
    total: KernelTotal,
}

/// The packets the kernel dropped at the bottleneck of the testbed job in `dir` (qdisc tail
/// drops, nftables' random and blackout drops); `None` when it wrote no `kernel.json`.
pub fn kernel_drops(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join("kernel.json");
    if !path.is_file() {
        return Ok(None);
    }
    let read = || -> Result<u64> {
        let counters: KernelCounters = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let t = counters.total;
        Ok(t.qdisc_dropped_packets + t.nft_dropped_packets + t.blackout_dropped_packets)
    };
    read()
        .map(Some)
        .with_context(|| format!("reading the kernel's counters {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_drops_are_the_qdiscs_and_nftables() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(kernel_drops(dir.path()).unwrap(), None);
        let total = r#"{"total": {"sent_packets": 9, "qdisc_dropped_packets": 3,
            "nft_dropped_packets": 4, "blackout_dropped_packets": 5, "realised_loss": 0.1}}"#;
        std::fs::write(dir.path().join("kernel.json"), total).unwrap();
        assert_eq!(kernel_drops(dir.path()).unwrap(), Some(12));
        std::fs::write(dir.path().join("kernel.json"), r#"{"total": {}}"#).unwrap();
        let err = format!("{:#}", kernel_drops(dir.path()).unwrap_err());
        assert!(err.contains("qdisc_dropped_packets"), "{err}");
    }

    #[test]
    fn the_out_folder_goes_before_the_job_flags() {
        let exe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/syncopate");
        let args: Vec<String> = ["--hosts", "2", "--", "--model", "lenet"]
            .map(String::from)
            .to_vec();
        let cmd = command(&exe, &args, Path::new("/tmp/cell")).unwrap();
        let given: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(given[0].ends_with(SCRIPT), "{given:?}");
        assert_eq!(
            given[1..],
            [
                "--hosts",
                "2",
                "--out",
                "/tmp/cell",
                "--",
                "--model",
                "lenet"
            ]
        );
        let err = command(Path::new("/nowhere/bin/x/syncopate"), &args, Path::new("o"));
        // From the crate's folder the script is not under the current folder either.
        if !Path::new(SCRIPT).is_file() {
            assert!(format!("{:#}", err.unwrap_err())
                .contains("run the study from the repository root"));
        }
    }
}
