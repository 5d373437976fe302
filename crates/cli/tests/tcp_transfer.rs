//! Messages both ways the calibration ladder sends them: `scripts/tcp_transfer.py` over
//! loopback (the kernel's half) and `syncopate transfer --every` (the model's), each report
//! read back by `syncopate summary`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_syncopate");

/// What `command` printed, once it has succeeded.
fn stdout_of(command: &mut Command) -> String {
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    String::from_utf8(out.stdout).unwrap()
}

/// `syncopate summary` of the transfer report `json`'s `fields`, as numbers (`name` tells
/// the tests' files apart).
fn summary(name: &str, json: &str, fields: &[&str]) -> Vec<f64> {
    let dir = std::env::temp_dir().join(format!("tcp-transfer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, json).unwrap();
    let text = stdout_of(Command::new(BIN).arg("summary").arg(&path).args(fields));
    text.split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn the_kernels_messages_each_have_a_latency() {
    let script = "../../scripts/tcp_transfer.py";
    let recv = Command::new("python3")
        .args([
            script,
            "recv",
            "--port",
            "0",
            "--message",
            "16000",
            "--timeout",
            "30",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut recv = match recv {
        Ok(child) => child,
        Err(e) => {
            eprintln!("!!! SKIPPED: tcp_transfer.py needs python3 ({e})");
            return;
        }
    };
    let mut told = String::new();
    BufReader::new(recv.stderr.take().unwrap())
        .read_line(&mut told)
        .unwrap();
    let port = told.trim().rsplit(' ').next().unwrap().to_string();
    let sent = Command::new("python3")
        .args([script, "send", "--host", "127.0.0.1", "--port", &port])
        .args(["--bytes", "160000", "--message", "16000", "--every", "2"])
        .status()
        .unwrap();
    assert!(sent.success());
    let out = recv.wait_with_output().unwrap();
    assert!(out.status.success());
    let report = String::from_utf8(out.stdout).unwrap();
    let got = summary(
        "kernel",
        &report,
        &[
            "message_latency_s:len",
            "message_latency_s:max",
            "completion_s",
        ],
    );
    assert_eq!(got[0], 10.0, "{report}");
    // Loopback: each message arrives soon after it is due (a busy machine's scheduler may
    // delay some), the last nine periods (18 ms) after the first, less the first's latency.
    assert!(got[1] > 0.0 && got[1] < 1.0, "{report}");
    assert!(got[2] >= 0.018 - got[1] && got[2] < 2.0, "{report}");
}

#[test]
fn the_models_messages_each_have_a_latency() {
    let report = stdout_of(
        Command::new(BIN)
            .args(["transfer", "--json", "--bytes", "1.6MB", "--frame", "160KB"])
            .args([
                "--every",
                "20ms",
                "--bandwidth",
                "100mbit",
                "--latency",
                "50us",
            ]),
    );
    let got = summary(
        "model",
        &report,
        &["message_latency_s:len", "message_latency_s:p90"],
    );
    // 12.8 ms on the wire and the latency, none waiting for another.
    assert_eq!(got, vec![10.0, 0.01285]);
    // A period of nothing is refused, with what to do instead.
    let zero = Command::new(BIN)
        .args(["transfer", "--every", "0ms"])
        .output()
        .unwrap();
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("leave it out for a bulk transfer"));
    // In bulk there are none.
    let bulk = Command::new(BIN)
        .args(["transfer", "--json", "--bytes", "1MB"])
        .output()
        .unwrap();
    assert!(!String::from_utf8(bulk.stdout)
        .unwrap()
        .contains("message_latency_s"));
}
