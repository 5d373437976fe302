//! `scripts/netns-cluster.sh`: a 2-host job in network namespaces, each host behind the
//! kernel's htb shaping, started the torchrun way; and a job behind its lossy bottleneck
//! (shallow queue, nftables' random loss, DSCP classes, two paths) whose kernel counters it
//! records. They need root and namespaces (the second also nftables); where they cannot
//! have them the tests say why they did not run instead of passing silently.

use std::io::Write;
use std::path::Path;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

/// Whether `tool` is on PATH.
fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .status()
        .is_ok_and(|s| s.success())
}

/// Says on stderr why `test` did not run (the harness captures eprintln! of passing tests).
fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Runs `scripts/netns-cluster.sh` with `args` under this build's binary; its stdout and
/// stderr, after asserting that it succeeded and left no namespace of its own behind.
fn run_cluster(args: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = Command::new("bash")
        .arg(root.join("scripts/netns-cluster.sh"))
        .args(args)
        .env("SYNCOPATE_BIN", EXE)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&[&o.stdout[..], &o.stderr[..]].concat()).into_owned();
    assert!(o.status.success(), "{args:?}: {text}");
    assert!(text.contains("mean step"), "{text}");
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
    text
}

/// [`run_cluster`] with the flags of `flags` (whitespace-separated) and `--out out`.
fn run_cluster_in(out: &Path, flags: &str) -> String {
    let mut args: Vec<&str> = flags.split_whitespace().collect();
    args.extend(["--out", out.to_str().unwrap()]);
    run_cluster(&args)
}

/// A JSON file the cluster wrote into `dir` (`summary.json`, `kernel.json`).
fn read_json(dir: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
}

/// A total of `kernel.json`'s (the kernel's counters at the bottleneck over the job).
fn kernel_total(kernel: &serde_json::Value, key: &str) -> u64 {
    (kernel["total"][key].as_u64()).unwrap_or_else(|| panic!("{key}: {kernel}"))
}

/// Why this machine cannot run the cluster (`None`: it can).
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for tool in ["ip", "tc", "python3"] {
        if !on_path(tool) {
            return Some(format!("no `{tool}` on PATH"));
        }
    }
    // One name per probe: the tests of this file probe at once, on threads of one process.
    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = format!("syprobe{}-{n}", std::process::id());
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

/// Whether a test with a lossy bottleneck (`test`) cannot run here (it needs nftables
/// besides namespaces); if so, it says why.
fn cannot_run_lossy(test: &str) -> bool {
    let why = cannot_run().or_else(|| {
        (!on_path("nft"))
            .then(|| "no `nft` on PATH (netns-cluster.sh --loss needs nftables)".to_string())
    });
    if let Some(why) = &why {
        skip(test, why);
    }
    why.is_some()
}

#[test]
fn a_two_host_job_runs_in_network_namespaces() {
    if let Some(why) = cannot_run() {
        skip("a_two_host_job_runs_in_network_namespaces", &why);
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    for strategy in ["allreduce", "ps"] {
        run_cluster(&[
            "--hosts",
            "2",
            "--strategy",
            strategy,
            "--rate",
            "200mbit",
            "--steps",
            "8",
            "--out",
            dir,
        ]);
        let summary = read_json(out.path(), "summary.json");
        assert_eq!(summary["steps"], 8, "{summary}");
    }
}

#[test]
fn a_lossy_bottleneck_records_the_kernels_own_drops() {
    if cannot_run_lossy("a_lossy_bottleneck_records_the_kernels_own_drops") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    // P3: two workers push into the server's port, a 16-packet queue behind 100 Mbit/s,
    // 1 % random loss, DSCP priority classes, and a second path.
    let flags = "--hosts 3 --strategy p3 --steps 12 --bottleneck 100mbit --queue-packets 16 \
                 --loss 1% --paths 2 --prio";
    let text = run_cluster_in(out.path(), flags);
    assert!(text.contains("kernel at the bottleneck"), "{text}");
    let summary = read_json(out.path(), "summary.json");
    assert_eq!(summary["steps"], 12, "{summary}");
    let kernel = read_json(out.path(), "kernel.json");
    let total = &kernel["total"];
    let count = |key: &str| kernel_total(&kernel, key);
    // Megabytes of gradients cross the bottleneck: nftables drops about 1 % of them.
    assert!(count("sent_packets") > 1000, "{kernel}");
    assert!(count("nft_dropped_packets") > 0, "{kernel}");
    let loss = total["realised_loss"].as_f64().unwrap();
    assert!(loss > 0.0 && loss < 0.5, "{kernel}");
    // The server's port is shaped on both paths, in both directions, the prio leaves each
    // with its own queue.
    let ports = kernel["ports"].as_array().unwrap();
    for path in [0, 1] {
        for direction in ["to_host", "from_host"] {
            let port = ports
                .iter()
                .find(|p| p["path"] == path && p["direction"] == direction && p["host"] == 2)
                .unwrap_or_else(|| panic!("no path {path} {direction} port: {kernel}"));
            assert_eq!(port["leaf_queues"].as_object().unwrap().len(), 8, "{port}");
        }
    }
}

/// Blackouts: once a second the switch drops every packet for the outage's milliseconds
/// (a set element the kernel expires); a job through them loses packets to them alone and
/// still completes, TCP recovering each outage.
#[test]
fn blackouts_drop_every_packet_for_their_milliseconds_and_the_job_recovers() {
    let test = "blackouts_drop_every_packet_for_their_milliseconds_and_the_job_recovers";
    if cannot_run_lossy(test) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let flags = "--hosts 3 --strategy p3 --steps 12 --bottleneck 100mbit --blackout 300";
    let text = run_cluster_in(out.path(), flags);
    assert!(text.contains("blackouts 300 ms a second"), "{text}");
    let kernel = read_json(out.path(), "kernel.json");
    assert!(
        kernel_total(&kernel, "blackout_dropped_packets") > 0,
        "{kernel}"
    );
    let random = kernel_total(&kernel, "nft_dropped_packets");
    assert_eq!(random, 0, "no random loss: {kernel}");
}

/// `--sample-sockets`: `ss -tin` in every host's namespace during the job, summed up per
/// connection: the server's connections to its workers show their windows and round trips.
#[test]
fn socket_samples_show_each_connections_window_and_round_trip() {
    if let Some(why) = cannot_run() {
        skip(
            "socket_samples_show_each_connections_window_and_round_trip",
            &why,
        );
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let flags = "--hosts 3 --strategy p3 --steps 8 --bottleneck 100mbit --sample-sockets 10";
    let text = run_cluster_in(out.path(), flags);
    assert!(text.contains("sockets.json"), "{text}");
    let sockets = read_json(out.path(), "sockets.json");
    assert_eq!(sockets["interval_ms"], 10, "{sockets}");
    let server = &sockets["hosts"][2]["connections"];
    let to_workers: Vec<_> = (server.as_array().unwrap().iter())
        .filter(|c| c["peer_host"] == 0 || c["peer_host"] == 1)
        .collect();
    assert!(
        !to_workers.is_empty(),
        "the server's connections: {sockets}"
    );
    for c in to_workers {
        assert!(c["samples"].as_u64().unwrap() >= 1, "{c}");
        assert!(c["cwnd_segments"]["max"].as_u64().unwrap() >= 1, "{c}");
        assert!(c["srtt_ms"]["p50"].as_f64().unwrap() > 0.0, "{c}");
    }
    assert!(out.path().join("sockets/h0.txt").exists());
}

/// A bad `--sample-sockets` is refused with a clear error before anything is made (no root
/// needed to see it).
#[test]
fn a_bad_socket_sampling_period_is_refused() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for bad in ["5", "2000", "x"] {
        let o = Command::new("bash")
            .arg(root.join("scripts/netns-cluster.sh"))
            .args(["--sample-sockets", bad])
            .env("SYNCOPATE_BIN", EXE)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("--sample-sockets must be 10 to 1000"),
            "{bad}: {err}"
        );
    }
}

/// DLCP's packets as UDP datagrams through the kernel: two workers and a server behind a
/// 100 Mbit/s bottleneck that drops 3 % of the packets at random (nftables) on two paths
/// with DSCP priority classes. The job completes with a 10 % loss bound, its datagrams
/// sent, received and the kernel's drops counted.
#[test]
fn dlcp_over_udp_survives_the_kernels_real_drops() {
    if cannot_run_lossy("dlcp_over_udp_survives_the_kernels_real_drops") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let flags = "--hosts 3 --strategy dlcp --steps 12 --bottleneck 100mbit --loss 3% --paths 2 \
                 --prio";
    let mut args: Vec<&str> = flags.split_whitespace().collect();
    args.extend([
        "--out",
        dir,
        "--",
        "--transport",
        "udp",
        "--loss-bound",
        "10%",
    ]);
    let text = run_cluster(&args);
    let summary = read_json(out.path(), "summary.json");
    assert_eq!(summary["steps"], 12, "{summary}\n{text}");
    let datagrams = &summary["worker0"]["datagrams"]["counters"];
    assert!(datagrams["sent"].as_u64().unwrap() > 1000, "{summary}");
    assert_eq!(datagrams["bad_mac"], 0, "{summary}");
    let kernel = read_json(out.path(), "kernel.json");
    assert!(kernel_total(&kernel, "nft_dropped_packets") > 0, "{kernel}");
}

/// A fidelity study of one tiny cell: two hosts on the testbed behind a 100 Mbit/s
/// bottleneck losing 1 % at random (nftables), and the same job on the emulator; the table
/// sets the two step times side by side and the testbed's folder keeps the kernel's counters.
const FIDELITY_STUDY: &str = r#"
name = "fidelity-tiny"
kind = "fidelity"
steps = 8
warmup_steps = 2
batch_size = 32
workers = [2]
args = ["--dataset", "synthetic"]
[[networks]]
label = "lossy"
bandwidth = "100mbit"
args = ["--ingress", "--loss", "1%"]
testbed = ["--loss", "1%"]
[[models]]
name = "lenet"
[[variants]]
label = "allreduce"
strategy = "allreduce"
"#;

/// Runs `syncopate study --quiet --out OUT` on the study `text`, with `path` as PATH when
/// given.
fn run_study(out: &Path, text: &str, path: Option<&str>) -> std::process::Output {
    let study = out.join("study.toml");
    std::fs::write(&study, text).unwrap();
    let mut cmd = Command::new(EXE);
    cmd.args(["study", "--quiet", "--out"]).arg(out).arg(&study);
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    cmd.output().unwrap()
}

#[test]
fn a_fidelity_study_runs_its_cell_on_the_kernel_and_on_the_emulator() {
    if cannot_run_lossy("a_fidelity_study_runs_its_cell_on_the_kernel_and_on_the_emulator") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let o = run_study(out.path(), FIDELITY_STUDY, None);
    let text = String::from_utf8_lossy(&[&o.stdout[..], &o.stderr[..]].concat()).into_owned();
    assert!(o.status.success(), "{text}");
    let study = out.path().join("fidelity-tiny");
    let csv = std::fs::read_to_string(study.join("results.csv")).unwrap();
    let mut lines = csv.lines().skip(1);
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_else(|| panic!("{csv}"))
        .split(',')
        .collect();
    let ratio: f64 = row[8].parse().unwrap();
    assert!(ratio.is_finite() && ratio > 0.0, "{csv}");
    let cell = study.join("runs/lenet-allreduce-lossy-w2-s42");
    assert!(cell.join("kernel/kernel.json").is_file(), "{text}");
    assert!(cell.join("emulator/summary.json").is_file(), "{text}");
}

/// Without nft, tc and ip on PATH (or without root) a kernel study refuses to start, saying
/// why, before it runs anything.
#[test]
fn a_kernel_study_says_what_this_machine_lacks() {
    let out = tempfile::tempdir().unwrap();
    let kernel = FIDELITY_STUDY.replace("\"fidelity\"", "\"kernel\"");
    let o = run_study(out.path(), &kernel, Some("/nonexistent"));
    let text = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("runs its cells in network namespaces"),
        "{text}"
    );
    assert!(
        text.contains("needs root") || text.contains("needs ip, tc, nft on PATH"),
        "{text}"
    );
    assert!(!out.path().join("fidelity-tiny/runs").exists());
}

/// The same cell as a kernel study: one job on the testbed, its row in `results.csv` with
/// the packets the kernel dropped at the bottleneck (`frames_lost`, from `kernel.json`).
#[test]
fn a_kernel_study_runs_its_cell_on_the_testbed() {
    if cannot_run_lossy("a_kernel_study_runs_its_cell_on_the_testbed") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let kernel = FIDELITY_STUDY.replace("\"fidelity\"", "\"kernel\"");
    let o = run_study(out.path(), &kernel, None);
    let text = String::from_utf8_lossy(&[&o.stdout[..], &o.stderr[..]].concat()).into_owned();
    assert!(o.status.success(), "{text}");
    let csv = std::fs::read_to_string(out.path().join("fidelity-tiny/results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_else(|| panic!("{csv}"))
        .split(',')
        .collect();
    let lost = header.iter().position(|h| *h == "frames_lost").unwrap();
    let drops: f64 = row[lost].parse().unwrap();
    assert!(drops.is_finite() && drops >= 0.0, "{csv}");
    let cell = out
        .path()
        .join("fidelity-tiny/runs/lenet-allreduce-lossy-w2-s42");
    assert!(cell.join("kernel.json").is_file(), "{text}");
}
