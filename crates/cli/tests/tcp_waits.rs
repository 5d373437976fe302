//! `scripts/tcp_waits.py` on a made-up capture whose every idle spell is known: a lost
//! packet's timeout and its backed-off second one, a tail loss probe and a delayed ACK.

use std::io::Write;
use std::process::{Command, Stdio};

const SENDER: &str = "10.79.0.2";

/// One line of `tcpdump -tt -n -S`: data from the sender (`seq` to `end`) or an ACK to it.
fn line(t: f64, data: Option<(u64, u64)>, ack: u64) -> String {
    match data {
        Some((seq, end)) => format!(
            "{t:.6} IP {SENDER}.4000 > 10.79.0.1.5000: Flags [.], seq {seq}:{end}, ack 1, \
             win 63, length {}",
            end - seq
        ),
        None => format!(
            "{t:.6} IP 10.79.0.1.5000 > {SENDER}.4000: Flags [.], ack {ack}, win 63, length 0"
        ),
    }
}

#[test]
fn a_senders_idle_spells_are_told_apart_by_what_ended_them() {
    let segment = |i: u64| Some((i * 1448, (i + 1) * 1448));
    let capture = [
        line(0.0, segment(0), 0),
        line(0.0001, None, 1448),
        // Segment 1 is lost: 210 ms without an ACK, resent; lost again, 420 ms.
        line(0.0002, segment(1), 0),
        line(0.2102, segment(1), 0),
        line(0.6302, segment(1), 0),
        line(0.6303, None, 2896),
        // Segment 3, the tail, is lost: the probe 10 ms later resends it.
        line(0.6304, segment(2), 0),
        line(0.6305, segment(3), 0),
        line(0.6405, segment(3), 0),
        line(0.6406, None, 5792),
        // A lone segment whose ACK comes 50 ms later (delayed).
        line(0.6407, segment(4), 0),
        line(0.6907, None, 7240),
        line(0.6908, segment(5), 0),
    ]
    .join("\n");
    let mut child = match Command::new("python3")
        .args(["../../scripts/tcp_waits.py", "-", SENDER, "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("!!! SKIPPED: tcp_waits needs python3 ({e})");
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(capture.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let conn = &report[0];
    let spells = |kind: &str| conn["idle"][kind][0].as_u64().unwrap_or(0);
    let seconds = |kind: &str| conn["idle"][kind][1].as_f64().unwrap_or(0.0);
    assert_eq!(spells("timeout"), 2, "{conn}");
    assert!((seconds("timeout") - 0.63).abs() < 1e-3, "{conn}");
    assert_eq!(spells("probe"), 1, "{conn}");
    assert_eq!(spells("ack, late"), 1, "{conn}");
    let causes = &conn["timeouts"];
    assert_eq!(
        causes["lost original, nothing sent after it"][0], 1,
        "{conn}"
    );
    assert_eq!(causes["backed off (the same packet again)"][0], 1, "{conn}");
}
