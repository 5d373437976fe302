#!/usr/bin/env python3
"""Bulk TCP transfers between network namespaces: the kernel's half of the calibration
ladder (scripts/calibrate-net.sh; `syncopate transfer` is the model's half).

  tcp_transfer.py recv --port P --flows N        accept N senders, start them together,
                                                 print {"completion_s", "flow_completion_s",
                                                 "goodput_mbit_s", "tcp"}
  tcp_transfer.py send --host H --port P --bytes B
  tcp_transfer.py counters                       this namespace's TCP counters, as JSON
  tcp_transfer.py delta BEFORE.json AFTER.json   what grew, in words

The receiver accepts every connection first, then writes one byte to each ("go"); each
sender waits for it, writes B bytes in 64 KiB writes and closes. The completion is from
the first data byte read (of any flow) to the last byte of every flow: the go byte crosses
the same lossy port, and its loss (a lone packet, probed about 200 ms later) is not the
transfer's, which the model starts at once.
"""
import argparse
import json
import socket
import sys
import threading
import time

CHUNK = 64 * 1024


def receive(port, flows, timeout):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(flows)
    server.settimeout(timeout)
    conns = []
    for _ in range(flows):
        conn, _ = server.accept()
        conn.settimeout(timeout)
        conns.append(conn)
    first = [None] * flows
    done = [0.0] * flows
    got = [0] * flows

    def drain(i, conn):
        buf = bytearray(1 << 20)
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                return
            now = time.monotonic()
            if first[i] is None:
                first[i] = now
            got[i] += n
            done[i] = now

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
    print(json.dumps({"completion_s": completion, "flow_completion_s": flows_s,
                      "goodput_mbit_s": 8 * sum(got) / max(completion, 1e-12) / 1e6,
                      "tcp": tcp, "bytes": got}))


def send(host, port, total, timeout):
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
    block = b"\0" * CHUNK
    left = total
    while left > 0:
        n = min(left, CHUNK)
        conn.sendall(block[:n])
        left -= n
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
    sub.add_parser("counters")
    d = sub.add_parser("delta")
    d.add_argument("before")
    d.add_argument("after")
    s = sub.add_parser("send")
    s.add_argument("--host", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--bytes", type=int, required=True)
    for p in (r, s):
        p.add_argument("--timeout", type=float, default=120.0)
    a = parser.parse_args()
    if a.role == "counters":
        counters()
    elif a.role == "delta":
        delta(a.before, a.after)
    elif a.role == "recv":
        receive(a.port, a.flows, a.timeout)
    else:
        send(a.host, a.port, a.bytes, a.timeout)


if __name__ == "__main__":
    main()
