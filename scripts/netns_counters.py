#!/usr/bin/env python3
"""What the kernel counted over a job on the namespace testbed (scripts/netns-cluster.sh),
from the snapshots that script takes before and after it:

  netns_counters.py tcp OUT CC HOSTS
      OUT/tcp.json: the congestion control and each host's TCP counters over the job
      (from OUT/tcp/{before,after}-hN.txt); prints them in one line.
  netns_counters.py kernel OUT RATE QUEUE LOSS_PPM PRIO PATHS DEGRADED STRATEGY SHAPE
      OUT/kernel.json: per port and direction of the bottleneck, the qdisc's and nftables'
      counters' growth over the job (from OUT/kernel/); prints the totals in one line.

The job's own figures (summary.json) are read with `syncopate summary`, not here."""
import json
import os
import sys


def tcp(out, cc, hosts):
    """Writes OUT/tcp.json from the hosts' /proc/net/{netstat,snmp} snapshots."""
    WANTED = {
        "TcpExt": ["TCPTimeouts", "TCPLossProbes", "TCPLossProbeRecovery", "TCPSackRecovery",
                   "TCPFastRetrans", "TCPLostRetransmit", "TCPSlowStartRetrans", "TCPSACKReorder",
                   "TCPRenoRecovery", "TCPDelivered", "DelayedACKs"],
        "Tcp": ["OutSegs", "RetransSegs", "InSegs"],
    }
    def read(phase, host):
        with open(os.path.join(out, "tcp", f"{phase}-h{host}.txt")) as f:
            lines = f.read().splitlines()
        found = {}
        for names, values in zip(lines[0::2], lines[1::2]):
            group, *keys = names.split()
            _, *vals = values.split()
            for k, v in zip(keys, vals):
                found[(group.rstrip(":"), k)] = int(v)
        return found
    per_host = []
    for h in range(hosts):
        before, after = read("before", h), read("after", h)
        per_host.append({f"{g}{k}": after.get((g, k), 0) - before.get((g, k), 0)
                         for g, keys in WANTED.items() for k in keys})
    total = {k: sum(h[k] for h in per_host) for k in per_host[0]} if per_host else {}
    with open(os.path.join(out, "tcp.json"), "w") as f:
        json.dump({"congestion_control": cc, "hosts": per_host, "total": total}, f, indent=1)
    print(f"netns-cluster: TCP ({cc}) over the job: {total.get('TcpRetransSegs', 0)} segments "
          f"retransmitted of {total.get('TcpOutSegs', 0)}, {total.get('TcpExtTCPTimeouts', 0)} timeouts, "
          f"{total.get('TcpExtTCPLossProbes', 0)} loss probes, {total.get('TcpExtTCPSackRecovery', 0)} "
          f"SACK recoveries; {os.path.join(out, 'tcp.json')}")


def kernel(out, rate, queue, loss_ppm, prio, paths, degraded, strategy, shape):
    """Writes OUT/kernel.json from the switch's qdisc and nftables snapshots."""
    kernel = os.path.join(out, "kernel")

    def load(name, default):
        path = os.path.join(kernel, name)
        if not os.path.exists(path):
            return default
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text) if text else default

    def nft_counters(phase):
        found = {}
        for item in load(f"{phase}-nft.json", {"nftables": []})["nftables"]:
            counter = item.get("counter")
            if counter:
                found[counter["name"]] = (counter["packets"], counter["bytes"])
        return found

    def root_qdisc(phase, port, direction):
        for q in load(f"{phase}-{port}-{direction}.qdisc.json", []):
            if q.get("root"):
                return q
        return {}

    def leaves(phase, port, direction):
        return {q["handle"]: q for q in load(f"{phase}-{port}-{direction}.qdisc.json", [])
                if q.get("kind") == "pfifo"}

    nft_before, nft_after = nft_counters("before"), nft_counters("after")
    def nft_delta(name):
        b, a = nft_before.get(name, (0, 0)), nft_after.get(name, (0, 0))
        return a[0] - b[0]

    ports = []
    with open(os.path.join(kernel, "ports.txt")) as f:
        for line in f:
            host, path, direction, ns, dev, port_rate, nft_first = line.split()
            port = f"h{host}p{path}"  # the switch's port of this host and path
            qa, qb = root_qdisc("after", port, direction), root_qdisc("before", port, direction)
            grow = lambda key: qa.get(key, 0) - qb.get(key, 0)
            sent, sent_bytes, tail = grow("packets"), grow("bytes"), grow("drops")
            name = f"{port}_{direction}"
            seen, random = nft_delta(name + "_seen"), nft_delta(name + "_drop")
            # nftables before the queue (toward the host): its drops never reached the qdisc.
            offered = sent + tail + (random if nft_first == "1" else 0)
            la, lb = leaves("after", port, direction), leaves("before", port, direction)
            classes = {h: {"parent": q.get("parent"),
                           "sent_packets": q.get("packets", 0) - lb.get(h, {}).get("packets", 0),
                           "dropped_packets": q.get("drops", 0) - lb.get(h, {}).get("drops", 0)}
                       for h, q in la.items()}
            ports.append({
                "host": int(host), "path": int(path), "direction": direction,
                "namespace": ns, "device": dev, "rate": port_rate,
                "sent_packets": sent, "sent_bytes": sent_bytes,
                "qdisc_dropped_packets": tail, "nft_seen_packets": seen,
                "nft_dropped_packets": random, "offered_packets": offered,
                "realised_loss": (tail + random) / offered if offered else 0.0,
                "leaf_queues": classes,
            })

    total = {key: sum(p[key] for p in ports) for key in
             ("sent_packets", "sent_bytes", "qdisc_dropped_packets", "nft_dropped_packets")}
    # Packets that entered the bottleneck, each once: a ring's packet leaves its sender's shaped
    # port and then enters its receiver's, a parameter server's crosses only the server's port.
    total["offered_packets"] = sum(p["offered_packets"] for p in ports
                                   if shape == "ps" or p["direction"] == "from_host")
    # The blackouts' drops (--blackout), switch-wide: every packet forwarded meanwhile.
    total["blackout_dropped_packets"] = nft_delta("blackout_drop")
    total["offered_packets"] += total["blackout_dropped_packets"]
    drops = (total["qdisc_dropped_packets"] + total["nft_dropped_packets"]
             + total["blackout_dropped_packets"])
    total["realised_loss"] = drops / total["offered_packets"] if total["offered_packets"] else 0.0
    tcp_path = os.path.join(out, "tcp.json")
    tcp = json.load(open(tcp_path)) if os.path.exists(tcp_path) else None
    report = {
        "strategy": strategy, "bottleneck": rate,
        "congestion_control": tcp["congestion_control"] if tcp else None, "tcp": tcp, "queue_packets": int(queue),
        "loss": int(loss_ppm) / 1_000_000, "prio": prio == "1", "paths": int(paths),
        "degraded_rate": None if degraded == "none" else degraded,
        "ports": ports, "total": total,
    }
    with open(os.path.join(out, "kernel.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"netns-cluster: kernel at the bottleneck ({len(ports)} device directions): "
          f"{total['sent_packets']} packets sent, {total['qdisc_dropped_packets']} dropped by the "
          f"qdiscs (tail), {total['nft_dropped_packets']} by nftables (random), "
          f"{total['blackout_dropped_packets']} in blackouts, realised loss "
          f"{100 * total['realised_loss']:.3f} %; {os.path.join(out, 'kernel.json')}")


def main():
    commands = {"tcp": (tcp, 3), "kernel": (kernel, 9)}
    args = sys.argv[1:]
    if not args or args[0] not in commands or len(args) - 1 != commands[args[0]][1]:
        sys.exit(__doc__)
    run, _ = commands[args[0]]
    if args[0] == "tcp":
        tcp(args[1], args[2], int(args[3]))
    else:
        run(*args[1:])


if __name__ == "__main__":
    main()
