#!/usr/bin/env python3
"""The DLCP study's whole matrix in the simulator (issue 15's simulated companion).

Every network setting of `studies/dlcp.toml`'s design (lossless; random loss 0.1, 1 and 5 %;
bursty loss; two paths, one degraded) against every variant (reliable p3 with a 200 ms and a
5 ms RTO, dlcp with all its mechanisms, with a loss bound of 0 and without priority and
spraying; reliable all-reduce, dlcp-allreduce with a reliable and a loss-tolerant
all-gather), on the ResNet-50 and VGG-16 profiles, 10 Gbit/s, incast at the servers
(`--ingress`), a few steps each. Prints a markdown table of mean step seconds, each against
its reliable baseline (dlcp variants against p3 with the 200 ms RTO, ring variants against
all-reduce), and the share of gradient values the loss-tolerant runs filled in; writes every
run's figures to a CSV.

Usage: scripts/dlcp-sim-matrix.py [--bin PATH] [--steps 3] [--out DIR] [--mtu BYTES] [--quick] [--report-only]
  --bin    the syncopate binary (default target/release/syncopate, built if missing)
  --mtu    loss per packet of this many bytes (simulate --mtu), e.g. 1500; default per frame
  --steps  simulated steps per run (default 3)
  --out    where the CSV and the per-run JSON go (default target/dlcp-sim-matrix)
  --quick  ResNet-50 at 16 workers only
  --report-only  print the tables of the results.csv already in --out
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (label, simulate arguments): the study's networks.
NETWORKS = [
    ("lossless", []),
    ("loss 0.1 %", ["--loss", "0.1%"]),
    ("loss 1 %", ["--loss", "1%"]),
    ("loss 5 %", ["--loss", "5%"]),
    # Bursts of 5 frames on average, half of a burst's frames lost: 0.5 % in the long run.
    ("bursty", ["--loss-burst", "0.002,0.2,50%"]),
    ("two paths, one degraded", ["--network", "{twopath}"]),
]

# (label, strategy, arguments, baseline label)
VARIANTS = [
    ("p3 (RTO 200 ms)", "p3", ["--rto", "200ms"], None),
    ("p3 (RTO 5 ms)", "p3", ["--rto", "5ms"], "p3 (RTO 200 ms)"),
    ("dlcp", "dlcp", ["--rto", "200ms"], "p3 (RTO 200 ms)"),
    ("dlcp (bound 0)", "dlcp", ["--rto", "200ms", "--loss-bound", "0"], "p3 (RTO 200 ms)"),
    ("dlcp (no priority, no spray)", "dlcp",
     ["--rto", "200ms", "--dlcp-no-priority", "--dlcp-no-spray"], "p3 (RTO 200 ms)"),
    ("allreduce (RTO 200 ms)", "allreduce", ["--rto", "200ms"], None),
    ("dlcp-allreduce", "dlcp-allreduce", ["--rto", "200ms"], "allreduce (RTO 200 ms)"),
    ("dlcp-allreduce (pull bound 1 %)", "dlcp-allreduce",
     ["--rto", "200ms", "--pull-loss-bound", "1%"], "allreduce (RTO 200 ms)"),
]

# Two paths of 10 Gbit/s, the second at half the bandwidth and losing 2 % of its frames.
TWOPATH = """bandwidth_bps = "10gbit"
ingress = true
paths = 2
[[path]]
[[path]]
bandwidth_bps = "5gbit"
loss = "2%"
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/syncopate"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "target/dlcp-sim-matrix"))
    ap.add_argument("--mtu", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    jobs = [("resnet50", 16)] if a.quick else [("resnet50", 16), ("resnet50", 64), ("vgg16", 16)]
    if a.report_only:
        with open(os.path.join(a.out, "results.csv")) as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            r["workers"] = int(r["workers"])
            r["step_s"] = float(r["step_s"])
            r["filled"] = float(r["filled"]) if r["filled"] else None
        print_tables(rows, jobs)
        return
    if a.steps < 1:
        sys.exit("dlcp-sim-matrix: --steps must be at least 1")
    if a.mtu is not None and a.mtu < 1:
        sys.exit("dlcp-sim-matrix: --mtu must be a positive number of bytes")
    per_packet = ["--mtu", str(a.mtu)] if a.mtu else []
    if not os.path.exists(a.bin):
        subprocess.run(["cargo", "build", "--release", "-p", "syncopate"], cwd=ROOT, check=True)
    os.makedirs(a.out, exist_ok=True)
    twopath = os.path.join(a.out, "twopath.toml")
    with open(twopath, "w") as f:
        f.write(TWOPATH)
    rows = []
    total = len(jobs) * len(NETWORKS) * len(VARIANTS)
    started = time.time()
    for model, workers in jobs:
        for net, net_args in NETWORKS:
            for label, strategy, args, _ in VARIANTS:
                n = len(rows) + 1
                name = f"{model}-{workers}-{net}-{label}".replace(" ", "_").replace("%", "pc")
                out_json = os.path.join(a.out, "".join(c for c in name if c.isalnum() or c in "-_.") + ".json")
                cmd = [a.bin, "simulate", "--model", f"profile:{model}", "--strategy", strategy,
                       "--workers", str(workers), "--bandwidth", "10gbit", "--ingress",
                       "--steps", str(a.steps), "--json", out_json]
                if strategy in ("p3", "dlcp"):
                    cmd += ["--servers", "4"]
                cmd += [x.format(twopath=twopath) for x in net_args] + args + per_packet
                print(f"[{n}/{total}, {time.time() - started:.0f} s] {model} x{workers}, {net}, {label}",
                      file=sys.stderr, flush=True)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                with open(out_json) as f:
                    d = json.load(f)
                dl = d.get("dlcp") or {}
                filled = dl["entries_filled"] / dl["entries"] if dl.get("entries") else None
                rows.append({"model": model, "workers": workers, "network": net, "variant": label,
                             "step_s": d["mean_step_seconds"], "filled": filled,
                             "frames_lost": d["network"]["frames_lost"]})
    with open(os.path.join(a.out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print_tables(rows, jobs)


def print_tables(rows, jobs):
    by = {(r["model"], r["workers"], r["network"], r["variant"]): r for r in rows}
    for model, workers in jobs:
        print(f"\n{model}, {workers} workers (p3 and dlcp: 4 servers), mean step seconds "
              "(against the reliable baseline; values filled in)\n")
        print("| network | " + " | ".join(v[0] for v in VARIANTS) + " |")
        print("|---|" + "---|" * len(VARIANTS))
        for net, _ in NETWORKS:
            cells = []
            for label, _, _, base in VARIANTS:
                r = by[(model, workers, net, label)]
                cell = f"{r['step_s']:.3f}"
                if base:
                    cell += f" ({r['step_s'] / by[(model, workers, net, base)]['step_s']:.2f})"
                if r["filled"] is not None:
                    cell += f", {r['filled'] * 100:.2f} %"
                cells.append(cell)
            print(f"| {net} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
