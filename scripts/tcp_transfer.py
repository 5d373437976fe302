#!/usr/bin/env python3
"""TCP transfers between network namespaces, in bulk or as messages: the kernel's half of
the calibration ladder (scripts/calibrate-net.sh; `syncopate transfer` is the model's half).

  tcp_transfer.py recv --port P --flows N [--message M]  (P 0: any, told on stderr)
                                                 accept N senders, start them together,
                                                 print {"completion_s", "flow_completion_s",
                                                 "goodput_mbit_s", "tcp"} (with --message,
                                                 "message_latency_s" too)
  tcp_transfer.py send --host H --port P --bytes B [--message M --every MS]
  tcp_transfer.py counters                       this namespace's TCP counters, as JSON
  tcp_transfer.py delta BEFORE.json AFTER.json   what grew, in words

The receiver accepts every connection first, then writes one byte to each ("go"); each
sender waits for it, writes B bytes in 64 KiB writes and closes. The completion is from
the first data byte read (of any flow) to the last byte of every flow: the go byte crosses
the same lossy port, and its loss (a lone packet, probed about 200 ms later) is not the
transfer's, which the model starts at once.

Messages (`--message M --every MS`, as `syncopate transfer --frame M --every MS`): the sender
writes its B bytes as messages of M bytes, the n-th due n * MS after the go byte (later if
the one before is still being written); each begins with its due time on the monotonic
clock, which every namespace shares, and the receiver records each one's latency, from when
it was due to its last byte's arrival.
"""
import argparse
import json
import socket
import struct
import sys
import threading
import time

CHUNK = 64 * 1024


DUE = struct.Struct("<d")


class Messages:
    """A flow's byte stream cut into messages of `size` bytes, each opening with its due
    time: the latency of each one completed."""

    def __init__(self, size):
        self.size, self.offset, self.head, self.latency = size, 0, b"", []

    def take(self, data, now):
        at = 0
        while at < len(data):
            if self.offset < DUE.size:
                need = DUE.size - self.offset
                self.head += bytes(data[at:at + need])
            step = min(self.size - self.offset, len(data) - at)
            self.offset += step
            at += step
            if self.offset == self.size:
                self.latency.append(now - DUE.unpack(self.head)[0])
                self.offset, self.head = 0, b""


def receive(port, flows, timeout, message):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(flows)
    if port == 0:
        print(f"tcp_transfer: listening on port {server.getsockname()[1]}", file=sys.stderr,
              flush=True)
    server.settimeout(timeout)
    conns = []
    for _ in range(flows):
        conn, _ = server.accept()
        conn.settimeout(timeout)
        conns.append(conn)
    first = [None] * flows
    done = [0.0] * flows
    got = [0] * flows
    messages = [Messages(message) for _ in range(flows)] if message else []

    def drain(i, conn):
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                return
            now = time.monotonic()
            if first[i] is None:
                first[i] = now
            got[i] += n
            done[i] = now
            if messages:
                messages[i].take(view[:n], now)

    threads = [threading.Thread(target=drain, args=(i, c)) for i, c in enumerate(conns)]
    go = time.monotonic()
    for c in conns:
        c.sendall(b"g")
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min((f for f in first if f is not None), default=go)
    flows_s = [max(0.0, d - start) for d in done]
    completion = max(flows_s)
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        tcp = f.read().strip()
    report = {"completion_s": completion, "flow_completion_s": flows_s,
              "goodput_mbit_s": 8 * sum(got) / max(completion, 1e-12) / 1e6,
              "tcp": tcp, "bytes": got}
    if messages:
        report["message_latency_s"] = [s for m in messages for s in m.latency]
    print(json.dumps(report))


def send(host, port, total, timeout, message=0, every=0.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    if conn.recv(1) != b"g":
        sys.exit("tcp_transfer: the receiver closed before starting")
    if message:
        send_messages(conn, total, message, every)
        return
    block = b"\0" * CHUNK
    left = total
    while left > 0:
        n = min(left, CHUNK)
        conn.sendall(block[:n])
        left -= n
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    conn.close()


def send_messages(conn, total, size, every):
    """Writes `total` bytes as messages of `size`, the n-th due n * `every` s from now."""
    start = time.monotonic()
    padding = b"\0" * (size - DUE.size)
    for n in range(total // size):
        due = start + n * every
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        conn.sendall(DUE.pack(due) + padding)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    conn.close()


COUNTERS = {
    "TcpExt": ["TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "TCPSackRecovery",
               "TCPFastRetrans", "TCPLostRetransmit", "TCPSlowStartRetrans",
               "TCPSpuriousRTOs", "DelayedACKs"],
    "Tcp": ["OutSegs", "RetransSegs"],
}


def counters():
    found = {}
    for name in ("/proc/net/netstat", "/proc/net/snmp"):
        with open(name) as f:
            lines = f.read().splitlines()
        for keys, values in zip(lines[0::2], lines[1::2]):
            group, *ks = keys.split()
            _, *vs = values.split()
            group = group.rstrip(":")
            for k, v in zip(ks, vs):
                if k in COUNTERS.get(group, []):
                    found[group + k] = int(v)
    print(json.dumps(found))


def delta(before, after):
    with open(before) as f:
        b = json.load(f)
    with open(after) as f:
        a = json.load(f)
    grew = {k: a[k] - b.get(k, 0) for k in a if a[k] != b.get(k, 0)}
    print(json.dumps(grew))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--flows", type=int, default=1)
    r.add_argument("--message", type=int, default=0, help="bytes of a message (0: bulk)")
    sub.add_parser("counters")
    d = sub.add_parser("delta")
    d.add_argument("before")
    d.add_argument("after")
    s = sub.add_parser("send")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--bytes", type=int, required=True)
    s.add_argument("--message", type=int, default=0,
                   help="send messages of this many bytes (at least 8; 0: bulk)")
    s.add_argument("--every", type=float, default=20.0, help="ms between messages' due times")
    for p in (r, s):
        p.add_argument("--timeout", type=float, default=120.0)
    a = parser.parse_args()
    if a.role == "counters":
        counters()
    elif a.role == "delta":
        delta(a.before, a.after)
    elif a.role == "recv":
        receive(a.port, a.flows, a.timeout, a.message)
    elif a.message and a.message < DUE.size:
        sys.exit(f"tcp_transfer: a message holds its due time: --message of at least {DUE.size}")
    elif a.message and a.bytes % a.message:
        sys.exit(f"tcp_transfer: --bytes {a.bytes} is not a whole number of --message {a.message}")
    elif a.message and a.every < 0:
        sys.exit("tcp_transfer: --every must not be negative")
    else:
        send(a.host, a.port, a.bytes, a.timeout, a.message, a.every / 1e3)


if __name__ == "__main__":
    main()
