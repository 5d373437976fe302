//! `scripts/tcp_waits.py` on made-up captures whose every idle spell is known: a lost
//! packet's timeout and its backed-off second one, a tail loss probe and a delayed ACK;
//! messages, each put down to what held it up; and each timeout against the RTO that Linux
//! had then, rebuilt from RTT samples (cumulative, SACK and timestamp).

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
    // Without TCP options the RTO comes from cumulative ACKs alone: segment 0's 0.1 ms (and
    // later segment 4's 50 ms; those of resent segments give none), so an RTO of srtt 0.1 ms
    // + rttvar 200 ms (Linux's first rttvar, 2 x 0.1 ms, floored at 200 ms): 200.1 ms, which
    // the first timeout waited (210 ms, 1.05x) and the second twice over (2.10x).
    let rto = &conn["rto"];
    assert_eq!(rto["samples"]["seq"], 2, "{rto}");
    assert_eq!(rto["samples"]["ts"], 0, "{rto}");
    assert_eq!(rto["timeouts"]["at the RTO"][0], 1, "{rto}");
    assert_eq!(rto["timeouts"]["backed off"][0], 1, "{rto}");
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

/// Segment `i` (1448 bytes) sent at `t`, stamped `TS val ts`.
fn send(t: f64, i: u64, ts: u64) -> String {
    format!(
        "{t:.6} IP {SENDER}.4000 > 10.79.0.1.5000: Flags [.], seq {}:{}, ack 1, win 63, \
         options [nop,nop,TS val {ts} ecr 7], length 1448",
        i * 1448,
        (i + 1) * 1448
    )
}

/// An ACK at `t` of the segments below `upto`, echoing `ecr` and SACKing the segments
/// `sacks` (from, to).
fn ack(t: f64, upto: u64, ecr: u64, sacks: &[(u64, u64)]) -> String {
    let blocks: String = sacks
        .iter()
        .map(|(a, b)| format!("{{{}:{}}}", a * 1448, b * 1448))
        .collect();
    let sack = match sacks.len() {
        0 => String::new(),
        n => format!(",nop,nop,sack {n} {blocks}"),
    };
    format!(
        "{t:.6} IP 10.79.0.1.5000 > {SENDER}.4000: Flags [.], ack {}, win 63, \
         options [nop,nop,TS val 7 ecr {ecr}{sack}], length 0",
        upto * 1448
    )
}

#[test]
fn each_timeout_is_set_against_the_rto_linux_had_then() {
    // Segment 0 is lost before any ACK: its timeout (1 s) has no RTT sample before it. Its
    // ACK echoes the resend's TS val: a `ts` sample of 1 ms (Karn's rule bars `seq`).
    let mut capture = vec![send(0.0, 0, 1), send(1.0, 0, 2), ack(1.001, 1, 2, &[])];
    // Segments 1-8 one at a time, each acknowledged 1 ms later: 8 `seq` samples of 1 ms.
    for i in 1..9 {
        let t = 1.002 + (i - 1) as f64 * 0.0015;
        capture.extend([send(t, i, 2 + i), ack(t + 0.001, i + 1, 2 + i, &[])]);
    }
    // Samples of 1 ms alone: srtt 1 ms and Linux's mdev 0.5 ms, shrinking by 3/4 a sample;
    // rttvar, at first 2 x 1 ms floored at 200 ms, stays there (4 mdev never tops the
    // round trip's highest, which starts at 200 ms), so the RTO is 1 + 200 ms = 0.201 s,
    // as RFC 6298's 1 + max(4 rttvar, 200) ms would have it too. Segment 9 is lost, resent
    // after 0.202 s (1.005x the RTO: at the RTO), lost again and resent after 0.404 s
    // (2.01x: backed off, x2); the ACK echoes the last copy's TS val: a `ts` sample of 1 ms.
    capture.extend([
        send(1.014, 9, 11),
        send(1.216, 9, 12),
        send(1.620, 9, 13),
        ack(1.621, 10, 13, &[]),
    ]);
    // Segments 10-13, of which 10 and 12 are lost. A duplicate ACK newly SACKs 11, sent
    // once 1 ms before: a `sack` sample of 1 ms (Linux takes SACK samples from every ACK;
    // RFC 6298's rules, none from a duplicate one). 10 is resent; the ACK of 10-11 newly
    // SACKs 13, sent once 1 ms before: another `sack` sample of 1 ms (not the 0.1 ms since
    // 10's resend that its TS echo would give). 12 is resent and its ACK gives a `ts`
    // sample of 1 ms. Still 1 ms each: the RTO stays 0.201 s.
    capture.extend([
        send(1.622, 10, 14),
        send(1.6221, 11, 15),
        send(1.6222, 12, 16),
        send(1.6223, 13, 17),
        ack(1.6231, 10, 13, &[(11, 12)]),
        send(1.6232, 10, 18),
        ack(1.6233, 12, 18, &[(13, 14)]),
        send(1.6234, 12, 19),
        ack(1.6244, 14, 19, &[]),
    ]);
    // Segment 14 is delayed, not lost: a spurious timeout at the RTO (0.202 s), then the
    // ACK of the original echoes its TS val, first sent 0.5 s before: a `ts` sample of
    // 0.5 s. Linux's estimator, in ms (kernel: tcp_rtt_estimator; srtt gains 1/8, mdev
    // 1/4): after 13 samples of 1 ms mdev is 0.5 x 0.75^12 = 0.0158; now err = 499, srtt
    // 1 + 499/8 = 63.375, mdev 0.75 x 0.0158 + 499/4 = 124.762, and rttvar rises at once
    // to 4 mdev = 499.05: the RTO is 63.375 + 499.05 = 562.42 ms (RFC 6298's rules give
    // 562.44). snd_una passes rtt_seq (the snd_nxt of the round trip before): rttvar is
    // not above this round trip's highest 4 mdev, so it stays; the round trip's highest
    // starts over at 200 ms. Segment 15 is lost and resent after 0.5625 s (1.0001x an RTO
    // over 250 ms: after an inflated RTO); its ACK, a `ts` sample of 1 ms: err -62.375,
    // srtt 55.578; |err| under mdev, so the full gain (1/32 only where |err| is over
    // mdev): mdev 124.762 - 62.387/4 = 109.165, 4 mdev 436.66; snd_una passes rtt_seq
    // again, so rttvar comes down a quarter of the way to 436.66: 499.05 - 15.60 = 483.45
    // (RTO 539.03).
    capture.extend([
        send(1.625, 14, 20),
        send(1.827, 14, 21),
        ack(2.125, 15, 20, &[]),
        send(2.126, 15, 22),
        send(2.6885, 15, 23),
        ack(2.6895, 16, 23, &[]),
    ]);
    // Segments 16 and 17, each acknowledged 1 ms after it: `seq` samples of 1 ms. The
    // first: err -54.578, srtt 48.756, mdev 109.165 - 54.587/4 = 95.518 (4 mdev 382.07);
    // snd_una passes rtt_seq, rttvar 483.45 - (483.45 - 382.07)/4 = 458.11, and rtt_seq
    // is now the end of 17. The second: err -47.756, srtt 42.786, mdev 95.518 -
    // 47.762/4 = 83.578; snd_una reaches rtt_seq but does not pass it, so rttvar stays
    // 458.11 and the RTO 42.786 + 458.11 = 500.89 ms. Segment 18 is lost and resent after
    // 0.5009 s: 1.0000x that RTO (after an inflated RTO). Under RFC 6298's rules rttvar
    // is mdev, and the RTO 42.786 + 4 x 83.578 = 377.10 ms: 1.33x, off a power of two.
    capture.extend([
        send(2.6896, 16, 24),
        send(2.6897, 17, 25),
        ack(2.6906, 17, 24, &[]),
        ack(2.6907, 18, 25, &[]),
        send(2.6908, 18, 26),
        send(3.1917, 18, 27),
    ]);
    let Some(report) = waits(&capture.join("\n"), &[]) else {
        return;
    };
    let conn = &report[0];
    assert_eq!(conn["idle"]["timeout"][0], 6, "{conn}");
    let rto = &conn["rto"];
    assert_eq!(rto["samples"]["seq"], 10, "{rto}");
    assert_eq!(rto["samples"]["sack"], 2, "{rto}");
    assert_eq!(rto["samples"]["ts"], 5, "{rto}");
    // Per class, its count and its seconds beyond 200 ms.
    let class = |kind: &str| {
        let c = &rto["timeouts"][kind];
        (
            c[0].as_u64().unwrap_or(0),
            c[1].as_f64().unwrap_or(f64::NAN),
        )
    };
    let near = |a: f64, b: f64| (a - b).abs() < 1e-3;
    let (n, s) = class("no sample yet");
    assert!(n == 1 && near(s, 0.8), "{rto}");
    let (n, s) = class("at the RTO");
    assert!(n == 2 && near(s, 0.002 + 0.002), "{rto}");
    let (n, s) = class("backed off");
    assert!(n == 1 && near(s, 0.204), "{rto}");
    assert_eq!(rto["doublings"]["2"], 1, "{rto}");
    let (n, s) = class("after an inflated RTO");
    assert!(n == 2 && near(s, 0.3625 + 0.3009), "{rto}");
    // The lowest inflated RTO is the one rttvar kept within its round trip (RFC 6298's
    // rules: 0.377 s).
    let inflated = |i: usize| rto["inflated_rto_s"][i].as_f64().unwrap_or(0.0);
    assert!(near(inflated(0), 0.50089), "{rto}");
    assert!(near(inflated(1), 0.56242), "{rto}");
    let ratios = rto["ratios"].as_array().unwrap();
    assert!(ratios[0].is_null(), "{rto}");
    assert_eq!(ratios.len(), 6, "{rto}");
    // The last is 1.33 under RFC 6298's rules.
    for (got, want) in ratios[1..].iter().zip([1.005, 2.01, 1.005, 1.0001, 1.0]) {
        assert!((got.as_f64().unwrap_or(0.0) - want).abs() < 0.01, "{rto}");
    }
    let srtt = rto["srtt_ms_last"].as_f64().unwrap_or(0.0);
    assert!((srtt - 42.786).abs() < 0.01, "{rto}");
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
