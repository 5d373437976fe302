#!/usr/bin/env python3
"""Where a TCP sender's time went, from a packet capture taken at the sender.

Usage: scripts/tcp_waits.py CAPTURE.pcap SENDER_IP [--message BYTES] [--json]

Reads the capture with `tcpdump -r` (CAPTURE `-`: tcpdump's text, `-tt -n -S`, on standard
input) and, for every connection on which SENDER_IP sends
data, splits the time between its first and last data packet into the sender's idle
spells (2 ms or more with nothing sent) by what ended each one:

  timeout   no acknowledgement came during the spell and the sender resent data after
            at least 180 ms (Linux's minimum RTO is 200 ms): a retransmission timeout
  probe     no acknowledgement came and the sender sent after less than that: a tail
            loss probe (or the timer of a paced or application-limited sender)
  ack       an acknowledgement came during the spell and the sender went on after it;
            `late` where that acknowledgement came 20 ms or more after the sender's last
            packet (the receiver's delayed ACK is at least 40 ms). In a bulk transfer the
            sender always has data, so this is its window waiting; in a job the
            application's own pauses (compute, a barrier) count here too

and says, for each timeout, what it resent: a packet sent once before (`original`) or
one already resent (`resend`), whether anything was sent after that packet's last copy
before the timeout, and whether it is the same packet as the timeout before it
(`backed off`: Linux doubles the RTO until new data is acknowledged).

With --message BYTES (a sender of messages, as `tcp_transfer.py send --message`), each
connection's data is also cut into messages of BYTES from its first data byte, and each
message, from its first packet's send to its last's, is put down to the longest kind of
wait in it: `tail` (a packet of it was last sent after the next message began: its lost
tail waited for that message to reveal it), `timeout`, `probe, then a late ACK` (the
probe's lone segment acknowledged at the receiver's delayed-ACK timer), `late ACK`,
`probe`, `ACK` (a spell of 2-20 ms that an ACK ended), or `none` (no spell of 2 ms: it
went at the pace of its window or link).

Used by scripts/calibrate-net.sh --trace; works on any capture tcpdump reads.
"""

import collections
import json
import re
import subprocess
import sys

LINE = re.compile(
    r"^(?P<t>\d+\.\d+) IP (?P<src>[\d.]+)\.(?P<sport>\d+) > (?P<dst>[\d.]+)\.(?P<dport>\d+): "
    r"Flags \[[^\]]*\](?:, seq (?P<seq>\d+):(?P<end>\d+))?(?:, ack (?P<ack>\d+))?.*, length (?P<len>\d+)"
)
IDLE_S = 0.002
TIMEOUT_S = 0.180
DELAYED_ACK_S = 0.020


def packets(lines, sender):
    """Per connection (sender's address and port, peer's): its data sent by `sender` as
    ('data', t, seq, end) and the peer's acknowledgements as ('ack', t)."""
    conns = collections.defaultdict(list)
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        t = float(m["t"])
        if m["src"] == sender and int(m["len"]) > 0 and m["seq"]:
            key = (m["src"], m["sport"], m["dst"], m["dport"])
            conns[key].append(("data", t, int(m["seq"]), int(m["end"])))
        elif m["dst"] == sender and m["ack"]:
            key = (m["dst"], m["dport"], m["src"], m["sport"])
            conns[key].append(("ack", t))
    return conns


def timeout_cause(seg, copies, sends_after, previous):
    """What a timeout resent: `seg` sent `copies` times before, `sends_after` packets sent
    after its last copy; `previous`: the segment the timeout before it resent."""
    if seg == previous:
        return "backed off (the same packet again)"
    kind = "resend" if copies >= 2 else "original"
    after = "nothing sent after it" if sends_after == 0 else "more sent after it"
    return f"lost {kind}, {after}"


def waits(events):
    """The idle spells of one connection's sender, by what ended them, and its timeouts by
    cause: (span s, {kind: [count, seconds]}, {cause: [count, seconds]})."""
    kinds = collections.defaultdict(lambda: [0, 0.0])
    causes = collections.defaultdict(lambda: [0, 0.0])
    copies = collections.Counter()
    # Packets sent so far, and how many had been when each segment's last copy went.
    sent = 0
    last_copy = {}
    last_send = last_ack = previous = None
    acks = 0
    highest = 0
    first = None
    for event in events:
        if event[0] == "ack":
            acks += 1
            last_ack = event[1]
            continue
        _, t, seq, end = event
        first = t if first is None else first
        if last_send is not None and t - last_send >= IDLE_S:
            gap = t - last_send
            if acks == 0 and gap >= TIMEOUT_S and end <= highest:
                kind = "timeout"
                after = sent - last_copy.get(seq, sent)
                cause = timeout_cause(seq, copies[seq], after, previous)
                causes[cause][0] += 1
                causes[cause][1] += gap
                previous = seq
            elif acks == 0:
                kind = "probe"
            else:
                late = last_ack is not None and last_ack - last_send >= DELAYED_ACK_S
                kind = "ack, late" if late else "ack"
            kinds[kind][0] += 1
            kinds[kind][1] += gap
        copies[seq] += 1
        sent += 1
        last_copy[seq] = sent
        highest = max(highest, end)
        last_send, acks = t, 0
    span = (last_send - first) if first is not None else 0.0
    return span, dict(kinds), dict(causes)


def messages(events, size):
    """One connection's data cut into messages of `size` bytes: per message, in order, its
    span (first send to last, s) and what held it up (the module's list)."""
    data = [e for e in events if e[0] == "data"]
    if not data or size <= 0:
        return []
    base = data[0][2]
    # Per message: its first send, its last, and the last of its bytes' first copies.
    first, last, new = {}, {}, {}
    highest = base
    for _, t, seq, end in data:
        for k in range((seq - base) // size, (max(end, seq + 1) - 1 - base) // size + 1):
            first.setdefault(k, t)
            last[k] = t
            if end > highest:
                new[k] = t
        highest = max(highest, end)
    report = []
    for k in sorted(first):
        lo, hi = base + k * size, base + (k + 1) * size
        own = [e for e in events if first[k] <= e[1] <= last[k]
               and (e[0] == "ack" or (e[2] < hi and e[3] > lo))]
        _, kinds, _ = waits(own)
        # Its tail waited for the next message: the sender had gone idle after its data
        # and resent some of it only once the next message began.
        later = first.get(k + 1, float("inf"))
        tail = last[k] >= later and later - new.get(k, later) >= IDLE_S
        report.append((last[k] - first[k], message_cause(kinds, tail)))
    return report


def message_cause(kinds, tail):
    """What held a message up, from its idle spells' `kinds` (and whether its `tail` was
    last sent after the next message began)."""
    if tail:
        return "tail"
    if "timeout" in kinds:
        return "timeout"
    if "probe" in kinds and "ack, late" in kinds:
        return "probe, then a late ACK"
    if "ack, late" in kinds:
        return "late ACK"
    if "probe" in kinds:
        return "probe"
    return "ACK" if "ack" in kinds else "none"


def message_summary(spans):
    """Messages' spans (s) and causes: count, p50 and p90 ms, and per cause its count and
    median ms."""
    ms = sorted(s * 1e3 for s, _ in spans)
    at = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]
    causes = collections.defaultdict(list)
    for s, cause in spans:
        causes[cause].append(s * 1e3)
    by_cause = {c: [len(v), sorted(v)[len(v) // 2]] for c, v in causes.items()}
    return {"count": len(ms), "p50_ms": at(0.5), "p90_ms": at(0.9), "by_cause": by_cause}


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        asked = len(argv) >= 2 and argv[1] in ("-h", "--help")
        print(__doc__, file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    capture, sender = argv[1], argv[2]
    message = 0
    if "--message" in argv:
        try:
            message = int(argv[argv.index("--message") + 1])
        except (IndexError, ValueError):
            message = 0
        if message <= 0:
            print("tcp_waits: --message takes a size in bytes, above 0", file=sys.stderr)
            return 2
    if capture == "-":
        return summarise(sys.stdin.read(), sender, "--json" in argv, message)
    try:
        text = subprocess.run(["tcpdump", "-r", capture, "-tt", "-n", "-S"], check=True,
                              capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"tcp_waits: cannot read {capture} with tcpdump: {e}", file=sys.stderr)
        return 2
    return summarise(text, sender, "--json" in argv, message)


def summarise(text, sender, as_json, message=0):
    """Prints where the sender's time went on each connection of tcpdump's `text` (and, with
    `message` bytes, what held up each message)."""
    report = []
    for key, events in sorted(packets(text.splitlines(), sender).items()):
        if not any(e[0] == "data" for e in events):
            continue
        span, kinds, causes = waits(events)
        report.append({"connection": "%s:%s > %s:%s" % key, "span_s": span,
                       "idle": kinds, "timeouts": causes})
        if message:
            report[-1]["messages"] = message_summary(messages(events, message))
    if as_json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return 0
    for r in report:
        idle = sum(v[1] for v in r["idle"].values())
        print(f"{r['connection']}: {r['span_s']:.2f} s, idle {idle:.2f} s in spells of 2 ms or more")
        for kind, (n, s) in sorted(r["idle"].items(), key=lambda kv: -kv[1][1]):
            print(f"  {kind:14s} {n:5d} spells {s:8.2f} s")
        for cause, (n, s) in sorted(r["timeouts"].items(), key=lambda kv: -kv[1][1]):
            print(f"    timeout: {cause:40s} {n:5d} {s:8.2f} s")
        m = r.get("messages")
        if m and m["count"]:
            print(f"  {m['count']} messages, first to last send p50 {m['p50_ms']:.1f} ms, "
                  f"p90 {m['p90_ms']:.1f} ms; held up by:")
            for cause, (n, med) in sorted(m["by_cause"].items(), key=lambda kv: -kv[1][0]):
                print(f"    {cause:24s} {n:5d} messages, median {med:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
