//! `scripts/tcp_waits.py` on made-up captures whose every idle spell is known: a lost
//! packet's timeout and its backed-off second one, a tail loss probe and a delayed ACK; and
//! messages, each put down to what held it up.

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
    let Some(report) = waits(&capture, &[]) else {
        return;
    };
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

/// Segments `first..end` sent back to back from `t`, 0.1 ms apart.
fn burst(t: f64, segments: std::ops::Range<u64>) -> Vec<String> {
    (segments.clone())
        .map(|i| {
            line(
                t + (i - segments.start) as f64 * 1e-4,
                Some((i * 1448, (i + 1) * 1448)),
                0,
            )
        })
        .collect()
}

#[test]
fn each_message_is_put_down_to_what_held_it_up() {
    // Messages of four segments, one every 100 ms. Message 0 goes at once. Message 1: the
    // ACK of its first two is lost, the probe sends its third 8 ms later, which the receiver
    // acknowledges at its delayed-ACK timer. Message 2 loses its last segment, found only
    // when message 3 is sent.
    let capture = [
        burst(0.0, 0..4),
        vec![line(0.0004, None, 5792)],
        burst(0.1, 4..6),
        burst(0.1081, 6..7),
        vec![line(0.1501, None, 10136)],
        burst(0.1502, 7..8),
        vec![line(0.1503, None, 11584)],
        burst(0.2, 8..12),
        vec![line(0.2004, None, 15928)],
        burst(0.3, 12..13),
        burst(0.3001, 11..12),
        burst(0.3002, 13..16),
        vec![line(0.3005, None, 23168)],
    ]
    .concat()
    .join("\n");
    let Some(report) = waits(&capture, &["--message", "5792"]) else {
        return;
    };
    let m = &report[0]["messages"];
    assert_eq!(m["count"], 4, "{m}");
    let held = |cause: &str| m["by_cause"][cause][0].as_u64().unwrap_or(0);
    assert_eq!(held("none"), 2, "{m}");
    assert_eq!(held("probe, then a late ACK"), 1, "{m}");
    assert_eq!(held("tail"), 1, "{m}");
    let tail_ms = m["by_cause"]["tail"][1].as_f64().unwrap_or(0.0);
    assert!((tail_ms - 100.1).abs() < 0.01, "{m}");
    // A message size that is not a size is refused.
    assert!(waits(&capture, &["--message", "0"]).is_none());
}

/// `tcp_waits.py --json` with `args` on the capture `text`; `None` without python3 (said
/// loudly) or when the script refuses.
fn waits(text: &str, args: &[&str]) -> Option<serde_json::Value> {
    let mut child = match Command::new("python3")
        .args(["../../scripts/tcp_waits.py", "-", SENDER, "--json"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("!!! SKIPPED: tcp_waits needs python3 ({e})");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).unwrap())
}
