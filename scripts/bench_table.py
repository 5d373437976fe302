#!/usr/bin/env python3
"""The benchmark scripts' tables from their raw measurements, one subcommand each, so that no
shell script embeds Python:

  bench_table.py allreduce RAW.csv TABLE.md       compare-allreduce.sh's table
  bench_table.py frame-mac RAW.csv TABLE.md       bench-frame-mac.sh's
  bench_table.py frame-mac-jobs RAW.csv TABLE.md  bench-frame-mac-jobs.sh's
  bench_table.py ab RAW.csv A B                   ab-check.sh's (printed only)
  bench_table.py soak OUT                         soak.sh's verdict on OUT/*/metrics-rank*.csv
  bench_table.py iperf                            iperf3 -J on stdin: its bandwidth in GB/s
  bench_table.py ratio KERNEL MODEL [--within F]  calibrate-net.sh's ratio of medians, with
                                                  its bootstrap interval and verdict

Each table is printed and, where a TABLE.md is named, written there. Figures from a job's
summary are read with `syncopate summary`, not here."""
import argparse
import csv
import glob
import json
import os
import random
import statistics
import sys
from collections import defaultdict


def rows(path):
    """The rows of the raw CSV at `path`, as dicts."""
    with open(path) as f:
        return list(csv.DictReader(f))


def size_name(b):
    """A byte count as the largest whole unit: 64 KiB, 100 MiB, 10 B."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f and b % f == 0:
            return "%d %s" % (b // f, unit)
    return "%d B" % b


def publish(text, table):
    """Writes the table to the file `table` (when given), and prints it."""
    if table:
        with open(table, "w") as f:
            f.write(text)
    print(text)


def allreduce_table(raw, table):
    """Ours against Open MPI and Gloo (and one iperf3 stream), per ranks and size."""
    bw = defaultdict(list)
    for row in rows(raw):
        bw[(row["impl"], int(row["ranks"]), int(row["size_bytes"]))].append(float(row["busbw_GBps"]))

    def fmt(v):
        return "-" if v is None else "%.3f" % v

    def med(key):
        v = bw.get(key)
        return statistics.median(v) if v else None

    names = {"mpi": "Open MPI", "gloo": "Gloo"}
    modes = {"b2b": "back to back", "barrier": "barrier"}
    refs = [(i, m) for m in modes for i in names if any(k[0] == "%s-%s" % (i, m) for k in bw)]
    lines = ["| ranks | size | " + " | ".join(
        "Syncopate, %s | " % modes[m] + " | ".join(
            "%s, %s | ours / it" % (names[i], modes[m]) for i, mm in refs if mm == m)
        for m in modes) + " |"]
    lines.append("|" + "---|" * (2 + len(modes) + 2 * len(refs)))
    for n, size in sorted({(k[1], k[2]) for k in bw if not k[0].startswith("iperf3")}):
        cells = [str(n), size_name(size)]
        for m in modes:
            ours = med(("syncopate-" + m, n, size))
            cells.append(fmt(ours))
            for i, mm in refs:
                if mm != m:
                    continue
                ref = med(("%s-%s" % (i, m), n, size))
                cells += [fmt(ref), "**%.2f**" % (ours / ref) if ours and ref else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    stream = med(("iperf3", 1, 0))
    bw.pop(("iperf3", 1, 0), None)
    both_ways = med(("iperf3-bidir", 1, 0))
    bw.pop(("iperf3-bidir", 1, 0), None)
    rounds = max((len(v) for v in bw.values()), default=0)
    text = "\n".join(lines) + (
        "\n\nBus bandwidth in GB/s, median of %d round(s). Back to back: rank 0 times its calls "
        "one after the other (bench-comm's default); barrier: each call starts after a barrier "
        "and takes the slowest rank's time (the references' own method, bench-comm --barrier). "
        "Each ratio compares like with like.\n" % rounds)
    largest = max((k[2] for k in bw if k[1] == 2), default=None)
    for name, reference in (("One iperf3 TCP stream over loopback", stream),
                            ("One iperf3 stream each way at once, per direction", both_ways)):
        if not reference:
            continue
        text += "\n%s: %.3f GB/s (median of the rounds)" % (name, reference)
        for m in modes:
            ours = med(("syncopate-" + m, 2, largest)) if largest else None
            if ours:
                text += "; ours at %s with 2 ranks, %s: %.0f %% of it" % (
                    size_name(largest), modes[m], 100 * ours / reference)
        text += ".\n"
    publish(text, table)


def frame_mac_table(raw, table):
    """Bus bandwidth without and with frame MACs, per ranks and size, from rounds of pairs."""
    bw = {}
    for row in rows(raw):
        key = (int(row["ranks"]), int(row["size_bytes"]))
        bw.setdefault(key, {}).setdefault(row["round"], {})[row["mac"]] = float(row["busbw_GBps"])
    lines = ["| ranks | size | without MACs | with MACs | cost (median) | cost per round |",
             "|---|---|---|---|---|---|"]
    for (n, size), rounds in sorted(bw.items()):
        pairs = [r for r in rounds.values() if "off" in r and "on" in r]
        if not pairs:
            continue
        off = statistics.median(r["off"] for r in pairs)
        on = statistics.median(r["on"] for r in pairs)
        costs = sorted(1 - r["on"] / r["off"] for r in pairs)
        lines.append("| %d | %s | %.3f | %.3f | **%.0f %%** | %s |" % (
            n, size_name(size), off, on, 100 * statistics.median(costs),
            ", ".join("%.0f %%" % (100 * c) for c in costs)))
    count = max((len(r) for r in bw.values()), default=0)
    text = "\n".join(lines) + ("\n\nBus bandwidth in GB/s, median of %d round(s); cost = "
                               "1 - with / without, from each round's pair.\n" % count)
    publish(text, table)


def frame_mac_jobs_table(raw, table):
    """A job's figure without and with frame MACs, from rounds of pairs."""
    figures = {}  # job -> round -> mac -> figure
    for row in rows(raw):
        figures.setdefault(row["job"], {}).setdefault(row["round"], {})[row["mac"]] = float(row["value"])
    lines = ["| job | without MACs | with MACs | cost (median) | cost per round |",
             "|---|---|---|---|---|"]
    for job, rounds in figures.items():
        pairs = [r for r in rounds.values() if "off" in r and "on" in r]
        if not pairs:
            continue
        # A throughput falls with the cost, a step time rises.
        if "step" in job:
            costs = sorted(r["on"] / r["off"] - 1 for r in pairs)
        else:
            costs = sorted(1 - r["on"] / r["off"] for r in pairs)
        lines.append("| %s | %s | %s | **%.1f %%** | %s |" % (
            job, " / ".join("%.4g" % r["off"] for r in pairs),
            " / ".join("%.4g" % r["on"] for r in pairs), 100 * statistics.median(costs),
            ", ".join("%.1f %%" % (100 * c) for c in costs)))
    text = "\n".join(lines) + ("\n\nEach round's figures without / with MACs; cost = the loss of "
                               "samples/s or the rise in step time, from each round's pair.\n")
    publish(text, table)


def ab_table(raw, a, b):
    """Each check's figures of builds A and B per round, and the ratio of their medians."""
    values = {}
    for row in rows(raw):
        values.setdefault(row["check"], {}).setdefault(row["build"], []).append(float(row["value"]))
    print(f"| check | A ({a}), each round | B ({b}), each round | median B / A |")
    print("|---|---|---|---|")
    for check, by in values.items():
        va, vb = by.get(a, [float("nan")]), by.get(b, [float("nan")])
        each = " / ".join(f"{v:.4g}" for v in va), " / ".join(f"{v:.4g}" for v in vb)
        ratio = statistics.median(vb) / statistics.median(va)
        print(f"| {check} | {each[0]} | {each[1]} | {ratio:.3f} |")


def soak_table(out):
    """Per process, RSS floor and ceiling and the live heap's floor, first against last
    quarter once warm; returns the exit status (1 when one grew past its limit)."""
    mib = lambda b: f"{b / 2**20:.1f}"
    pct = lambda a, b: (b - a) / a * 100 if a else 0.0
    print("| strategy | process | RSS floor, first / last quarter (MiB) | RSS ceiling, first / last "
          "quarter (MiB) | live heap floor, first / last quarter (MiB) |")
    print("|---|---|---|---|---|")
    failed, minutes = [], 0.0
    paths = sorted(glob.glob(f"{out}/*/metrics-rank*.csv"))
    if not paths:
        sys.exit(f"soak: no metrics-rank*.csv under {out}")
    for path in paths:
        samples = rows(path)
        end = float(samples[-1]["t_s"])
        minutes = max(minutes, end / 60)
        warm = [r for r in samples if float(r["t_s"]) >= 0.1 * end]
        if len(warm) < 20:
            sys.exit(f"soak: {path} has too few samples")
        q = len(warm) // 4
        first, last = warm[:q], warm[-q:]
        # Every quarter spans several steps, so its floor and ceiling are those of a step; a
        # leak raises the floor, unbounded buffering the ceiling. The live heap's floor tells a
        # leak from an allocator keeping freed pages (which raises only RSS).
        rss = lambda part, f: f(int(r["rss_bytes"]) for r in part)
        heap = lambda part: min(int(r["heap_bytes"]) for r in part) if part[0].get("heap_bytes") else None
        strategy = os.path.basename(os.path.dirname(path))
        rank = path.rsplit("rank", 1)[1].split(".")[0]
        name = f"{strategy} rank {rank}"
        cells = []
        for what, f in (("RSS floor", min), ("RSS ceiling", max)):
            a, b = rss(first, f), rss(last, f)
            cells.append(f"{mib(a)} / {mib(b)} ({pct(a, b):+.1f} %)")
            if pct(a, b) > 5:
                failed.append(f"{name}: {what} grew {pct(a, b):+.1f} %")
        h0, h1 = heap(first), heap(last)
        if h0 is None:
            cells.append("not counted")
        else:
            cells.append(f"{mib(h0)} / {mib(h1)} ({pct(h0, h1):+.2f} %)")
            if pct(h0, h1) > 1:
                failed.append(f"{name}: the live heap's floor grew {pct(h0, h1):+.2f} %")
        print(f"| {strategy} | rank {rank} | " + " | ".join(cells) + " |")
    print(f"\nover {minutes:.1f} min; warm from 10 % of each run on; limits: RSS floor and "
          "ceiling +5 %, live-heap floor +1 %")
    for f in failed:
        print(f"soak: {f}", file=sys.stderr)
    return 1 if failed else 0


def iperf_gbytes():
    """iperf3 -J's report on stdin: the mean of its directions' received bit rates, in GB/s."""
    end = json.load(sys.stdin)["end"]
    each = [end[k]["bits_per_second"] for k in ("sum_received", "sum_received_bidir_reverse")
            if k in end]
    print("%.6f" % (sum(each) / len(each) / 8e9))


def ratio_interval(kernel, model, within, rounds=4000, seed=46):
    """The ratio of the model's median run to the kernel's, its 90 % bootstrap interval (each
    side's runs resampled with replacement, `rounds` times, from a fixed `seed`) and a verdict
    on agreement within `within` (0.05: 5 %): `within` where the whole interval lies in
    [1 - within, 1 + within], `outside` where none of it does, `undecided` where the runs are
    too few or too spread to tell."""
    ratio = statistics.median(model) / statistics.median(kernel)
    rng = random.Random(seed)
    draws = sorted(
        statistics.median(rng.choices(model, k=len(model)))
        / statistics.median(rng.choices(kernel, k=len(kernel)))
        for _ in range(rounds))
    lo, hi = draws[int(0.05 * rounds)], draws[int(0.95 * rounds) - 1]
    if lo >= 1 - within and hi <= 1 + within:
        verdict = "within"
    elif hi < 1 - within or lo > 1 + within:
        verdict = "outside"
    else:
        verdict = "undecided"
    return ratio, lo, hi, verdict


def seconds_list(text):
    """Comma-separated positive seconds, as a list of floats."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of seconds")
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}' needs at least one time, each above 0")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    for kind in ("allreduce", "frame-mac", "frame-mac-jobs"):
        p = sub.add_parser(kind, help=f"the {kind} table from RAW.csv, also into TABLE.md")
        p.add_argument("raw")
        p.add_argument("table")
    p = sub.add_parser("ab", help="ab-check.sh's table of builds A and B")
    p.add_argument("raw")
    p.add_argument("a")
    p.add_argument("b")
    p = sub.add_parser("soak", help="soak.sh's verdict on the metrics under OUT")
    p.add_argument("out")
    sub.add_parser("iperf", help="iperf3 -J on stdin: its bandwidth in GB/s")
    p = sub.add_parser("ratio", help="the model's median over the kernel's, its 90 %% "
                       "bootstrap interval and whether it lies within --within")
    p.add_argument("kernel", type=seconds_list, help="the kernel's times, comma-separated")
    p.add_argument("model", type=seconds_list, help="the model's times, comma-separated")
    p.add_argument("--within", type=float, default=0.05, help="the goal (default 0.05: 5 %%)")
    args = parser.parse_args()
    if args.kind == "allreduce":
        allreduce_table(args.raw, args.table)
    elif args.kind == "frame-mac":
        frame_mac_table(args.raw, args.table)
    elif args.kind == "frame-mac-jobs":
        frame_mac_jobs_table(args.raw, args.table)
    elif args.kind == "ab":
        ab_table(args.raw, args.a, args.b)
    elif args.kind == "soak":
        sys.exit(soak_table(args.out))
    elif args.kind == "ratio":
        if not 0 < args.within < 1:
            parser.error(f"--within {args.within}: a fraction above 0 and below 1 (0.05: 5 %)")
        ratio, lo, hi, verdict = ratio_interval(args.kernel, args.model, args.within)
        print(f"{ratio:.3f} {lo:.3f} {hi:.3f} {verdict}")
    else:
        iperf_gbytes()


if __name__ == "__main__":
    main()
