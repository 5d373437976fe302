//! `syncopate simulate`: a sweep writes its CSV and plot, and the trace is Chrome JSON.

use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_syncopate");

#[test]
fn simulate_sweeps_and_traces() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let out = Command::new(EXE)
        .args([
            "simulate",
            "--model",
            "profile:resnet50",
            "--strategy",
            "ps,p3",
            "--workers",
            "4",
            "--bandwidth",
            "1gbit,10gbit",
            "--steps",
            "3",
            "--scale",
            "0.0625",
            "--trace-steps",
            "1..2",
            "--out",
        ])
        .arg(dir.path())
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    let step = |strategy: &str, bw: &str| -> f64 {
        csv.lines()
            .find(|l| l.contains(&format!(",{strategy},")) && l.contains(&format!(",{bw},")))
            .and_then(|l| l.split(',').nth(7))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    // At 1 Gbit/s ResNet-50 is communication-bound and P3's order pays; at 10 Gbit/s both
    // are compute-bound (forward + backward: 0.462 s).
    assert!(step("p3", "1gbit") < step("ps", "1gbit"));
    assert!((step("p3", "10gbit") - 0.4624).abs() < 0.01);
    assert!(std::fs::read_to_string(dir.path().join("throughput.svg"))
        .unwrap()
        .starts_with("<svg"));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| e["ph"] == "X" && e["ts"].is_number()));
}

/// `--loss 1%` makes the simulator lose (and retransmit) frames, reported in the table and
/// in the sweep's CSV.
#[test]
fn simulate_reports_lost_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(EXE)
        .args([
            "simulate",
            "--model",
            "profile:resnet50",
            "--strategy",
            "p3",
            "--workers",
            "4",
            "--bandwidth",
            "10gbit,25gbit",
            "--loss",
            "1%",
            "--rto",
            "5ms",
            "--steps",
            "2",
            "--scale",
            "0.0625",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lost: Vec<u64> = (text.lines())
        .filter_map(|l| l.trim().strip_prefix("network: "))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(lost.len(), 2, "{text}");
    assert!(lost.iter().all(|&n| n > 0), "{text}");
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|&h| h == "frames_lost").unwrap();
    for line in csv.lines().skip(1) {
        let n: u64 = line.split(',').nth(col).unwrap().parse().unwrap();
        assert!(n > 0, "{csv}");
    }
}

/// A bad network setting is refused with the flag's name.
#[test]
fn simulate_names_a_bad_network_flag() {
    let out = Command::new(EXE)
        .args(["simulate", "--loss", "120%", "--steps", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--loss"), "{err}");
}

/// `--mtu`: loss strikes packets, so P3's slices (107 packets of 1500 bytes) are lost far
/// more often than with the same `--loss` per frame, also under `--scale`; a packet size of
/// 0 is refused naming the flag.
#[test]
fn simulate_loses_packets_with_mtu() {
    let lost = |extra: &[&str]| {
        let out = Command::new(EXE)
            .args([
                "simulate",
                "--model",
                "profile:resnet50",
                "--strategy",
                "p3",
            ])
            .args([
                "--workers",
                "4",
                "--loss",
                "1%",
                "--rto",
                "5ms",
                "--steps",
                "2",
            ])
            .args(["--scale", "0.0625"])
            .args(extra)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{text}");
        (text.lines())
            .find_map(|l| l.trim().strip_prefix("network: "))
            .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap()
    };
    let (frames, packets) = (lost(&[]), lost(&["--mtu", "1500"]));
    assert!(
        packets > 20 * frames,
        "{packets} lost per packet, {frames} per frame"
    );
    let out = Command::new(EXE)
        .args(["simulate", "--mtu", "0", "--steps", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--mtu"), "{err}");
}

/// Seeded faults: a crash is reported with the rank every other process names, the same
/// seed prints the same run, and a bad fault knob is refused with its flag's name.
#[test]
fn simulate_injects_seeded_faults_and_names_bad_ones() {
    let run = |seed: &str| {
        let out = Command::new(EXE)
            .args([
                "simulate",
                "--model",
                "profile:resnet50",
                "--strategy",
                "p3",
                "--workers",
                "4",
                "--servers",
                "1",
                "--steps",
                "30",
                "--scale",
                "0.01",
                "--fault-crash",
                "1",
                "--fault-window",
                "0.3",
                "--peer-timeout",
                "0.5",
                "--seed",
                seed,
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The wall time differs from run to run; the rest must not.
        text.lines()
            .filter(|l| l.starts_with("  "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let lines = run("3");
    assert!(lines.iter().any(|l| l.contains("crashes")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("job stopped")), "{lines:?}");
    assert_eq!(lines, run("3"));
    let out = Command::new(EXE)
        .args(["simulate", "--steps", "1", "--fault-freeze", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--fault-freeze"), "{err}");
}

/// A profile as `syncopate.torch.profile` writes it: headers, module names, tensor sizes.
const TORCH_PROFILE: &str = "# model: tiny
# batch_size: 32
# parameters: 488
conv1 -- Conv2d(3, 16) -- forward_compute_time=1.000000, backward_compute_time=2.000000, parameter_size=1728
relu -- ReLU() -- forward_compute_time=0.500000, backward_compute_time=0.500000, parameter_size=0
fc -- Linear(in_features=3, out_features=14) -- forward_compute_time=1.000000, backward_compute_time=2.000000, parameter_size=224, parameter_tensors=42;14
\tconv1 -- relu
\trelu -- fc
";

/// Runs `syncopate simulate --model profile:FILE` with `flags` and its JSON report; the
/// (success, stderr, report).
fn simulate_file(file: &std::path::Path, flags: &[&str]) -> (bool, String, serde_json::Value) {
    let json = file.with_extension("json");
    let out = Command::new(EXE)
        .arg("simulate")
        .arg("--model")
        .arg(format!("profile:{}", file.display()))
        .args(["--workers", "2", "--steps", "3", "--json"])
        .arg(&json)
        .args(flags)
        .output()
        .unwrap();
    let report = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr, report)
}

#[test]
fn simulate_reads_a_torch_profile_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.graph.txt");
    std::fs::write(&file, TORCH_PROFILE).unwrap();
    // Compute-bound at 10 Gbit/s: a step is forward + backward (7 ms); samples/s counts the
    // profile's batch of 32 per worker.
    let (ok, stderr, report) = simulate_file(&file, &["--strategy", "allreduce"]);
    assert!(ok, "{stderr}");
    let step = report["mean_step_seconds"].as_f64().unwrap();
    assert!((step - 0.007).abs() < 0.0005, "{step}");
    let samples = report["samples_per_sec"].as_f64().unwrap();
    assert!((samples * step - 64.0).abs() < 1e-6, "{samples}");
    // One key per parameter tensor: conv1's, fc's weight and fc's bias.
    let (ok, stderr, report) = simulate_file(&file, &["--strategy", "dlcp"]);
    assert!(ok, "{stderr}");
    assert_eq!(
        report["realised_loss_per_key"].as_array().map(Vec::len),
        Some(3)
    );

    let bad = dir.path().join("bad.graph.txt");
    std::fs::write(&bad, TORCH_PROFILE.replace("42;14", "42;15")).unwrap();
    let (ok, stderr, _) = simulate_file(&bad, &[]);
    assert!(!ok);
    assert!(
        stderr.contains("bad.graph.txt")
            && stderr.contains("line 6: parameter_tensors sum to 57 values"),
        "{stderr}"
    );
    let (ok, stderr, _) = simulate_file(&dir.path().join("missing.graph.txt"), &[]);
    assert!(
        !ok && stderr.contains("cannot read profile file"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--transport udp` runs DLCP's pushes through the core's datagram link and says what its
/// datagrams did; the report carries their counters.
#[test]
fn simulate_runs_dlcp_over_datagrams() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let flags = "--model profile:resnet50 --strategy dlcp --workers 2 --servers 1 \
                 --bandwidth 1gbit --loss 1% --paths 2 --steps 1 --transport udp";
    let mut cmd = Command::new(EXE);
    cmd.arg("simulate").args(flags.split_whitespace());
    let out = cmd.arg("--json").arg(&json).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("datagrams: "),
        "{text}{err}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let d = &report["datagrams"];
    let (sent, received) = (d["sent"].as_u64().unwrap(), d["received"].as_u64().unwrap());
    assert!(sent > 0 && received < sent, "{d}");
    assert_eq!(report["config"]["scale"], 1.0);
}
