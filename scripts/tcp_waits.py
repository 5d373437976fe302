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

It also rebuilds the sender's retransmission timer (RTO) as Linux keeps it, from the
acknowledgements and, where tcpdump shows them, the TCP options (`TS val`/`ecr`, `sack`
blocks; without them, from cumulative ACKs alone). Each ACK can give an RTT sample: from
the earliest segment it newly acknowledges (the sender's SYN and FIN count), if none of
them was ever resent (`seq`, Karn's rule); else from the earliest segment sent only once
that it newly SACKs (`sack`; duplicate ACKs too); else, if it acknowledges new data, from
when the timestamp it echoes was first sent (`ts`: after a spurious timeout the receiver
echoes the first copy's, and the sample spans the stall). From the samples, srtt and the
mean deviation mdev as Linux's tcp_rtt_estimator: gains 1/8 and 1/4 (1/32 for mdev where
a sample is below srtt by more than mdev); and the RTO, srtt + rttvar (at most 120 s),
where rttvar rises at once to 4 mdev but falls only once a round trip (when snd_una
passes the snd_nxt of the round trip before), a quarter of the way down to the highest
4 mdev of that round trip, never below 200 ms (Linux's minimum RTO). Each timeout's wait
is set against the RTO of the samples before it:

  at the RTO             under 1.5 times it
  backed off             1.5 times or more: Linux doubles the RTO at each timeout until a
                         new sample; x2, x4, x8 the doubling the wait implies
  after an inflated RTO  under 1.5 times an RTO over 250 ms: a sample spanned a stall
  no sample yet          no RTT sample before it

with the seconds each class waited beyond 200 ms.

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

import bisect
import collections
import json
import math
import re
import subprocess
import sys

LINE = re.compile(
    r"^(?P<t>\d+\.\d+) IP (?P<src>[\d.]+)\.(?P<sport>\d+) > (?P<dst>[\d.]+)\.(?P<dport>\d+): "
    r"Flags \[(?P<flags>[^\]]*)\](?:, seq (?P<seq>\d+)(?::(?P<end>\d+))?)?(?:, ack (?P<ack>\d+))?"
    r".*, length (?P<len>\d+)"
)
TIMESTAMPS = re.compile(r"\bTS val (\d+) ecr (\d+)")
SACK_BLOCK = re.compile(r"\{(\d+):(\d+)\}")
IDLE_S = 0.002
TIMEOUT_S = 0.180
DELAYED_ACK_S = 0.020
RTO_MIN_S = 0.200
RTO_MAX_S = 120.0
BACKED_OFF = 1.5
INFLATED_RTO_S = 0.250


def packets(lines, sender):
    """Per connection (sender's address and port, peer's): its data sent by `sender` as
    ('data', t, seq, end, ts), its SYN or FIN (one sequence number, no data) as
    ('ctl', t, seq, seq + 1, ts), and the peer's acknowledgements as
    ('ack', t, ack, ecr, sack blocks); `ts` and `ecr` the timestamp option's, or None."""
    conns = collections.defaultdict(list)
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        t = float(m["t"])
        stamps = TIMESTAMPS.search(line)
        if m["src"] == sender and m["seq"]:
            key = (m["src"], m["sport"], m["dst"], m["dport"])
            ts = int(stamps[1]) if stamps else None
            seq = int(m["seq"])
            if int(m["len"]) > 0 and m["end"]:
                conns[key].append(("data", t, seq, int(m["end"]), ts))
            elif not m["end"] and set(m["flags"]) & {"S", "F"}:
                conns[key].append(("ctl", t, seq, seq + 1, ts))
        elif m["dst"] == sender and m["ack"]:
            key = (m["dst"], m["dport"], m["src"], m["sport"])
            ecr = int(stamps[2]) if stamps else None
            blocks = tuple((int(a), int(b)) for a, b in SACK_BLOCK.findall(line))
            conns[key].append(("ack", t, int(m["ack"]), ecr, blocks))
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
    """The idle spells of one connection's sender, by what ended them, its timeouts by
    cause, and each timeout as (t, gap s): (span s, {kind: [count, seconds]},
    {cause: [count, seconds]}, [(t, gap)])."""
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
    timeouts = []
    for event in events:
        if event[0] == "ctl":
            continue
        if event[0] == "ack":
            acks += 1
            last_ack = event[1]
            continue
        _, t, seq, end, _ = event
        first = t if first is None else first
        if last_send is not None and t - last_send >= IDLE_S:
            gap = t - last_send
            if acks == 0 and gap >= TIMEOUT_S and end <= highest:
                kind = "timeout"
                after = sent - last_copy.get(seq, sent)
                cause = timeout_cause(seq, copies[seq], after, previous)
                causes[cause][0] += 1
                causes[cause][1] += gap
                timeouts.append((t, gap))
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
    return span, dict(kinds), dict(causes), timeouts


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
    for _, t, seq, end, _ in data:
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
        _, kinds, _, _ = waits(own)
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


def rtt_samples(events):
    """The RTT samples Linux's sender takes from one connection's ACKs, in order, as
    (t, kind, seconds, snd_una, snd_nxt): `seq`, `sack` or `ts` (the module's rules), with
    the sender's snd_una (the ACK's) and snd_nxt (the end of the highest byte sent)."""
    # Per segment not yet cumulatively acknowledged, by its first byte, in sequence order:
    # [end, first send, resent, SACKed]; and when each TS val was first sent.
    segments = collections.OrderedDict()
    first_sent = {}
    highest = una = None
    samples = []
    for event in events:
        if event[0] != "ack":
            _, t, seq, end, ts = event
            if ts is not None:
                first_sent.setdefault(ts, t)
            if highest is None or seq >= highest:
                segments[seq] = [end, t, False, False]
            else:
                mark_resent(segments, seq, end, t, highest)
            highest = end if highest is None else max(highest, end)
            continue
        _, t, ack, ecr, blocks = event
        sacked = newly_sacked(segments, blocks, ack)
        if una is not None and ack < una:
            continue  # An old ACK: Linux takes its SACK blocks, no sample (tcp_ack).
        una = ack
        acked = cumulatively_acked(segments, ack)
        sample = rtt_sample(t, acked, sacked, first_sent.get(ecr))
        if sample:
            samples.append((t,) + sample + (una, highest))
    return samples


def mark_resent(segments, seq, end, t, highest):
    """Marks the segments that a packet of bytes `seq` to `end` sent again (at `t`, the
    highest byte sent before it `highest`) as resent; any new bytes it carries beyond
    `highest` too, as Linux marks the whole packet."""
    if seq in segments and segments[seq][0] == end:
        segments[seq][2] = True
        return
    for start, segment in segments.items():
        if start < end and segment[0] > seq:
            segment[2] = True
    if end > highest:
        segments[highest] = [end, t, True, False]


def newly_sacked(segments, blocks, ack):
    """Marks the segments above `ack` that the SACK `blocks` cover whole as SACKed; the
    first send of the earliest of those newly SACKed that were sent once, or None."""
    earliest = None
    for a, b in blocks:
        for start, segment in segments.items():
            end, sent, resent, sacked = segment
            if start >= max(a, ack) and end <= b and not sacked:
                segment[3] = True
                if not resent and (earliest is None or sent < earliest):
                    earliest = sent
    return earliest


def cumulatively_acked(segments, ack):
    """Takes off the segments that `ack` acknowledges whole and returns them."""
    acked = []
    while segments:
        start = next(iter(segments))
        if segments[start][0] > ack:
            break
        acked.append(segments.pop(start))
    return acked


def rtt_sample(t, acked, sacked, echoed):
    """Linux's RTT sample at `t` from an ACK that newly acknowledged the segments `acked`
    ([end, first send, resent, SACKed]; none for a duplicate ACK), newly SACKed segments
    sent once from `sacked` (their first send, or None), and echoed a timestamp first sent
    at `echoed` (or None): (kind, seconds), or None."""
    # As tcp_clean_rtx_queue, run on every ACK, and tcp_ack_update_rtt: the cumulative
    # sample (Karn's rule: none if a resent segment is among those acknowledged), else the
    # SACK one, duplicate ACKs included; the timestamp's only if snd_una advanced.
    if not any(resent for _, _, resent, _ in acked):
        once = [sent for _, sent, _, sacked_before in acked if not sacked_before]
        if once:
            return "seq", t - min(once)
    if sacked is not None:
        return "sack", t - sacked
    if echoed is not None and acked:
        # Linux counts the timestamp clock's ticks, 1 ms at least.
        return "ts", max(t - echoed, 0.001)
    return None


def rto_history(samples):
    """After each RTT sample (t, kind, seconds, snd_una, snd_nxt): (t, srtt, RTO), the RTO
    as Linux's tcp_set_rto sets it, srtt + rttvar (rttvar at least 200 ms, the minimum
    RTO), at most 120 s."""
    history = []
    est = None
    for t, _, r, una, nxt in samples:
        est = rtt_estimate(est, r, una, nxt)
        history.append((t, est["srtt"], min(est["srtt"] + est["rttvar"], RTO_MAX_S)))
    return history


def rtt_estimate(est, r, una, nxt):
    """Linux's estimator (tcp_rtt_estimator, net/ipv4/tcp_input.c) after a sample of `r` s
    taken with snd_una `una` and snd_nxt `nxt`, from its state `est` (None before the
    first sample): srtt; mdev, the mean deviation; mdev_max, the highest 4 mdev of this
    round trip; rttvar, the RTO's term beyond srtt; rtt_seq, the snd_nxt that ends the
    round trip. Linux keeps them in microseconds, srtt x8 and mdev x4; here, seconds."""
    if est is None:
        # The first sample: mdev r/2, so that 4 mdev is 2r (the RTO 3r, or r + 200 ms).
        rttvar = max(2 * r, RTO_MIN_S)
        return {"srtt": r, "mdev": r / 2, "mdev_max": rttvar, "rttvar": rttvar,
                "rtt_seq": nxt}
    err = r - est["srtt"]
    est["srtt"] += err / 8
    est["mdev"] += mdev_step(est["mdev"], err)
    # rttvar follows the highest 4 mdev up at once...
    if 4 * est["mdev"] > est["mdev_max"]:
        est["mdev_max"] = 4 * est["mdev"]
        est["rttvar"] = max(est["rttvar"], est["mdev_max"])
    # ...and down once a round trip (snd_una past rtt_seq), by a quarter of the way to
    # this round trip's highest, which starts over at the minimum RTO.
    if una > est["rtt_seq"]:
        if est["mdev_max"] < est["rttvar"]:
            est["rttvar"] -= (est["rttvar"] - est["mdev_max"]) / 4
        est["rtt_seq"] = nxt
        est["mdev_max"] = RTO_MIN_S
    return est


def mdev_step(mdev, err):
    """What tcp_rtt_estimator adds to the mean deviation `mdev` for a sample `err` s off
    srtt: a quarter of the way to |err|, as RFC 6298; but an eighth of that where the
    sample is below srtt by more than `mdev` (Linux's finer gain, so that a falling RTT
    raises the RTO little). In Linux's x4 scale: m = |err| - mdev_us/4, m /= 8 if so,
    mdev_us += m."""
    step = abs(err) - mdev
    if err < 0 and step > 0:
        step /= 8
    return step / 4


def rto_class(gap, rto):
    """What a timeout's wait of `gap` s says against the RTO `rto` (None: no sample yet)."""
    if rto is None:
        return "no sample yet"
    if gap / rto >= BACKED_OFF:
        return "backed off"
    return "after an inflated RTO" if rto > INFLATED_RTO_S else "at the RTO"


def rto_report(events, timeouts):
    """One connection's RTT samples by kind, its last srtt, and its `timeouts` ((t, gap))
    against the RTO of the samples before each: per class [count, seconds beyond 200 ms],
    each wait's ratio to the RTO, the doublings the backed-off ones imply, and the range
    of the inflated RTOs."""
    samples = rtt_samples(events)
    history = rto_history(samples)
    times = [h[0] for h in history]
    classes = collections.defaultdict(lambda: [0, 0.0])
    ratios, doublings, inflated = [], collections.Counter(), []
    for t, gap in timeouts:
        before = bisect.bisect_left(times, t)
        rto = history[before - 1][2] if before else None
        kind = rto_class(gap, rto)
        classes[kind][0] += 1
        classes[kind][1] += gap - RTO_MIN_S
        ratios.append(round(gap / rto, 2) if rto else None)
        if kind == "backed off":
            doublings[str(2 ** round(math.log2(gap / rto)))] += 1
        elif kind == "after an inflated RTO":
            inflated.append(rto)
    kinds = collections.Counter(sample[1] for sample in samples)
    report = {"samples": {k: kinds[k] for k in ("seq", "sack", "ts")},
              "timeouts": dict(classes), "ratios": ratios,
              "srtt_ms_last": history[-1][1] * 1e3 if history else None}
    if doublings:
        report["doublings"] = dict(sorted(doublings.items(), key=lambda kv: int(kv[0])))
    if inflated:
        report["inflated_rto_s"] = [min(inflated), max(inflated)]
    return report


def rto_lines(rto):
    """The readable lines of a connection's `rto` report."""
    classes = rto["timeouts"]
    parts = []
    for kind in ("at the RTO", "backed off", "after an inflated RTO", "no sample yet"):
        if kind not in classes:
            continue
        n, s = classes[kind]
        what = {"at the RTO": f"{n} timeouts at the RTO",
                "no sample yet": f"{n} with no RTT sample yet"}.get(kind, f"{n} {kind}")
        if kind == "backed off":
            what += " x" + "-x".join(dict.fromkeys((min(rto["doublings"], key=int),
                                                    max(rto["doublings"], key=int))))
        elif kind == "after an inflated RTO":
            what += " of " + "-".join(dict.fromkeys(f"{r:.2f}" for r in rto["inflated_rto_s"]))
            what += " s"
        parts.append(f"{what} ({s:.2f} s{'' if parts else ' beyond 200 ms'})")
    lines = [f"    rto: {', '.join(parts)}"] if parts else []
    n, srtt = rto["samples"], rto["srtt_ms_last"]
    said = f"samples {n['seq']:,} seq, {n['sack']:,} sack, {n['ts']:,} ts"
    if srtt is not None:
        said += f"; srtt at the end {srtt:.2f} ms"
    ratios = sorted(r for r in rto["ratios"] if r is not None)
    if ratios:
        at = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]
        said = (f"waits {at(0.1):.2f}-{at(0.9):.2f}x the RTO then (p10-p90), median "
                f"{at(0.5):.2f}x; {said}")
    return lines + [f"    rto: {said}"]


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
        span, kinds, causes, timeouts = waits(events)
        report.append({"connection": "%s:%s > %s:%s" % key, "span_s": span,
                       "idle": kinds, "timeouts": causes, "rto": rto_report(events, timeouts)})
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
        for line in rto_lines(r["rto"]):
            print(line)
        m = r.get("messages")
        if m and m["count"]:
            print(f"  {m['count']} messages, first to last send p50 {m['p50_ms']:.1f} ms, "
                  f"p90 {m['p90_ms']:.1f} ms; held up by:")
            for cause, (n, med) in sorted(m["by_cause"].items(), key=lambda kv: -kv[1][0]):
                print(f"    {cause:24s} {n:5d} messages, median {med:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
