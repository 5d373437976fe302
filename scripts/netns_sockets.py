#!/usr/bin/env python3
"""The kernel's TCP connections over a job on the namespace testbed, from the `ss -tin`
samples that `scripts/netns-cluster.sh --sample-sockets MS` takes in every host's namespace
(and `scripts/calibrate-net.sh --trace` in the receiver's and sender 1's, every 20 ms):

  netns_sockets.py OUT HOSTS MS
      reads OUT/sockets/h<i>.txt (blocks of "T <unix time>" followed by `ss -tin state
      established`) and writes OUT/sockets.json: per host, per connection (its peer named
      as a host where the address is one of the testbed's), how many samples saw it, its
      congestion window (segments), smoothed round trip, RTO and delayed-ACK timeout
      (`ato`, ms: the receiving side's), bytes waiting in its socket (Send-Q) as p50 / p90
      / max over those samples, the share of samples whose window was full (unacknowledged
      segments >= cwnd: the flow held to its window), and the segments it retransmitted
      (its last sample's total). Prints one line per host.

A connection's first and last samples may fall before its data or after it: the figures
cover every sample that saw it established."""
import json
import os
import re
import sys

# Host i's addresses: 10.77.p.(i+1) on the cluster testbed, 10.79.p.(i+1) on calibrate-net's.
ADDRESS = re.compile(r"^10\.7[79]\.(\d+)\.(\d+)$")


def quantiles(values):
    """p50, p90 and max of `values` (nearest rank), or None where there are none."""
    if not values:
        return None
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50": pick(0.5), "p90": pick(0.9), "max": ordered[-1]}


def info_fields(line):
    """The `key:value` fields of an `ss -i` info line that a connection's state needs."""
    found = {}
    for token in line.split():
        key, sep, value = token.partition(":")
        if not sep:
            continue
        try:
            if key in ("cwnd", "unacked", "ssthresh"):
                found[key] = int(value)
            elif key in ("rto", "ato"):
                found[key] = float(value)
            elif key == "rtt":
                found["srtt"] = float(value.split("/")[0])
            elif key == "retrans":
                found["retrans_total"] = int(value.split("/")[1])
        except (ValueError, IndexError):
            raise ValueError(f"unreadable field '{token}' in: {line.strip()}")
    return found


def host_of(endpoint):
    """The testbed host of an `address:port`, or None."""
    address = endpoint.rsplit(":", 1)[0]
    m = ADDRESS.match(address)
    return int(m.group(2)) - 1 if m else None


def read_samples(path):
    """Per connection (local, peer): its samples, each a dict of the fields above."""
    connections = {}
    current = None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.startswith("T ") or line.startswith("Recv-Q") or not line.strip():
                current = None
                continue
            if line[0] in " \t":
                if current is None:
                    raise ValueError(f"{path}:{number}: an info line with no connection before it")
                try:
                    current.update(info_fields(line))
                except ValueError as e:
                    raise ValueError(f"{path}:{number}: {e}")
                continue
            parts = line.split()
            if len(parts) < 4 or not parts[1].isdigit():
                raise ValueError(f"{path}:{number}: not a connection line: {line.strip()}")
            current = {"send_q": int(parts[1])}
            connections.setdefault((parts[2], parts[3]), []).append(current)
    return connections


def summarise(local, peer, samples):
    """One connection's figures over its samples."""
    column = lambda key: [s[key] for s in samples if key in s]
    windowed = [s for s in samples if "cwnd" in s]
    full = sum(1 for s in windowed if s.get("unacked", 0) >= s["cwnd"])
    retrans = column("retrans_total")
    return {
        "local": local, "peer": peer, "peer_host": host_of(peer), "samples": len(samples),
        "cwnd_segments": quantiles(column("cwnd")), "srtt_ms": quantiles(column("srtt")),
        "rto_ms": quantiles(column("rto")), "ato_ms": quantiles(column("ato")),
        "send_q_bytes": quantiles(column("send_q")),
        "window_full": full / len(windowed) if windowed else 0.0,
        "retransmitted_segments": retrans[-1] if retrans else 0,
    }


def main():
    if len(sys.argv) != 4 or not sys.argv[2].isdigit() or not sys.argv[3].isdigit():
        sys.exit(__doc__)
    out, hosts, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    report = {"interval_ms": interval, "hosts": []}
    for h in range(hosts):
        path = os.path.join(out, "sockets", f"h{h}.txt")
        try:
            connections = read_samples(path)
        except (OSError, ValueError) as e:
            sys.exit(f"sockets: the samples cannot be read: {e}")
        rows = [summarise(l, p, s) for (l, p), s in sorted(connections.items())]
        report["hosts"].append({"host": h, "connections": rows})
        busy = [r for r in rows if r["cwnd_segments"]]
        if busy:
            cwnd = sorted(r["cwnd_segments"]["p50"] for r in busy)
            srtt = sorted(r["srtt_ms"]["p50"] for r in busy if r["srtt_ms"])
            full = max(r["window_full"] for r in busy)
            rtt = f"{srtt[0]:g}-{srtt[-1]:g} ms" if srtt else "-"
            print(f"sockets: host {h}'s {len(rows)} connections: cwnd p50 {cwnd[0]}-{cwnd[-1]} "
                  f"segments, srtt p50 {rtt}, window full in up to {100 * full:.0f} % of samples")
    with open(os.path.join(out, "sockets.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"sockets: sampled about every {interval} ms; {os.path.join(out, 'sockets.json')}")


if __name__ == "__main__":
    main()
