//! `scripts/netns-cluster.sh`: a 2-host job in network namespaces, each host behind the
//! kernel's htb shaping, started the torchrun way. It needs root and namespaces; where it
//! cannot have them the test says why it did not run instead of passing silently.

use std::io::Write;
use std::path::Path;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// Why this machine cannot run the cluster (`None`: it can).
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for tool in ["ip", "tc", "python3"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("no `{tool}` on PATH"));
        }
    }
    let ns = format!("syprobe{}", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &ns])
        .output()
        .ok()?;
    if !made.status.success() {
        return Some(format!(
            "cannot create a network namespace: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    None
}

#[test]
fn a_two_host_job_runs_in_network_namespaces() {
    if let Some(why) = cannot_run() {
        // Straight to stderr: the test harness captures eprintln! of passing tests.
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED a_two_host_job_runs_in_network_namespaces: {why}"
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().unwrap();
    for strategy in ["allreduce", "ps"] {
        let o = Command::new("bash")
            .arg(root.join("scripts/netns-cluster.sh"))
            .args(["--hosts", "2", "--strategy", strategy, "--rate", "200mbit"])
            .args(["--steps", "8", "--out"])
            .arg(out.path())
            .env("SYNCOPATE_BIN", EXE)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "{strategy}: {text}");
        assert!(text.contains("mean step"), "{text}");
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.path().join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(summary["steps"], 8, "{summary}");
        // Nothing of this cluster is left behind.
        let tag = text
            .split("namespaces ")
            .nth(1)
            .and_then(|t| t.split('*').next())
            .unwrap_or_else(|| panic!("no namespace tag in: {text}"))
            .to_string();
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let left = String::from_utf8_lossy(&list.stdout).to_string();
        assert!(
            !left.lines().any(|l| l.starts_with(&tag)),
            "{tag}* left: {left}"
        );
    }
}
