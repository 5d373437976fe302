//! `scripts/setup.sh` on a fresh machine: run with stand-ins for `apt-get`, `id` and
//! `cargo` on a PATH without nftables, it installs nftables (for the kernel-loss tests)
//! as root, and says loudly that those tests will be skipped where it cannot.

use std::path::Path;
use std::process::Command;

/// Writes an executable script `name` into `dir`.
fn stand_in(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Runs setup.sh as user `uid` with a stand-in apt-get that records its arguments; returns
/// what apt-get was asked and setup's stderr.
fn setup_as(uid: u32, apt_works: bool) -> (String, String) {
    let bin = tempfile::tempdir().unwrap();
    let asked = bin.path().join("asked");
    let status = if apt_works { 0 } else { 1 };
    stand_in(
        bin.path(),
        "apt-get",
        &format!("echo \"$@\" >> {}\nexit {status}", asked.display()),
    );
    stand_in(bin.path(), "id", &format!("echo {uid}"));
    stand_in(bin.path(), "cargo", "exit 0");
    stand_in(bin.path(), "sudo", "exit 1");
    for tool in ["cc", "pkg-config", "dirname", "sh", "bash"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
        {
            let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !found.is_empty() {
                std::os::unix::fs::symlink(found, bin.path().join(tool)).unwrap();
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("scripts/setup.sh"))
        .current_dir(&root)
        .env("PATH", bin.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "setup.sh failed:\n{stderr}");
    (std::fs::read_to_string(asked).unwrap_or_default(), stderr)
}

#[test]
fn setup_installs_nftables_for_the_kernel_loss_tests_where_it_can() {
    let (asked, _) = setup_as(0, true);
    assert!(
        asked
            .lines()
            .any(|l| l.contains("install") && l.contains("nftables")),
        "apt-get was asked:\n{asked}"
    );
    let (_, said) = setup_as(1000, false);
    assert!(
        said.contains("nftables") && said.contains("SKIPPED"),
        "setup said:\n{said}"
    );
}
