#!/usr/bin/env bash
# Memory under a slow link: p3, ring all-reduce, step-wise averaging and DLCP (with 1 % loss
# and a 10 % loss bound), side by side, each behind an emulated link 100 times slower than the
# job needs, for about --minutes minutes; every process samples its resident memory into a
# metrics CSV, and the script checks that none grows once warm.
#
# Usage: scripts/soak.sh [--minutes 10] [--slowdown 100] [--strategies "p3 allreduce stepwise dlcp"]
#                        [--out DIR] [--report-only]
#   --minutes   how long each job runs (default 10; all run at the same time)
#   --slowdown  how many times slower than needed the link is (default 100)
#   --strategies  which jobs to run (default all four)
#   --out       where the jobs' metrics go (default target/soak)
#   --report-only  only judge the metrics already in --out
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's.
#
# "What the job needs": a 20-step calibration run on an unlimited link measures the compute
# time of a step and the bytes a worker sends per step; the link's rate is then
# bytes x 8 / compute / slowdown (times the workers a lone server's link carries), and the
# step count fills the minutes at that rate. Worker 0 evaluates every 5 % of the steps, so its
# evaluation buffers are part of its warm state.
#
# Prints, per process, once warm (from 10 % of the run on): the floor and the ceiling of its
# resident memory over the first and the last quarter of the run (each quarter spans several
# steps, so these are a step's low and high points), and the floor of its live heap (bytes
# allocated and not freed, the metrics CSV's heap_bytes). Fails when the RSS floor or ceiling
# grew by more than 5 % or the live-heap floor by more than 1 %: a leak raises the floors,
# unbounded buffering the ceiling; the heap tells a leak from an allocator keeping freed pages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

minutes=10
slowdown=100
strategies="p3 allreduce stepwise dlcp"
out="$root/target/soak"
report_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --slowdown) slowdown=$2; shift 2 ;;
    --strategies) strategies=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --report-only) report_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$minutes" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "soak: --minutes must be a number" >&2; exit 2; }
[[ "$slowdown" =~ ^[1-9][0-9]*$ ]] || { echo "soak: --slowdown must be a positive integer" >&2; exit 2; }

if [ "$report_only" = 0 ]; then
if [ -z "${SYNCOPATE_BIN:-}" ]; then
  cargo build --release -p syncopate >&2
  SYNCOPATE_BIN="$root/target/release/syncopate"
fi
rm -rf "$out"
mkdir -p "$out"

workers=2
job=(--model lenet --dataset synthetic --batch-size 64 --workers "$workers" --quiet --no-replica-stats)
declare -A servers=([p3]=1 [allreduce]=0 [stepwise]=0 [dlcp]=1)
# What each strategy runs with besides the link: DLCP loses 1 % of its packets on the way and
# may leave 10 % of a step's gradient behind.
declare -A extra=([p3]="" [allreduce]="" [stepwise]="" [dlcp]="--loss-bound 10% --loss 1% --mtu 1500 --rto 20ms")
for strategy in $strategies; do
  [ -n "${servers[$strategy]+set}" ] || { echo "soak: unknown strategy '$strategy' (p3, allreduce, stepwise, dlcp)" >&2; exit 2; }
done

for strategy in $strategies; do
  "$SYNCOPATE_BIN" launch "${job[@]}" --strategy "$strategy" --servers "${servers[$strategy]}" \
    --steps 20 --summary-json "$out/calibrate-$strategy.json" >/dev/null 2>&1
done

# rate (bit/s) and steps for each strategy, from its calibration
plan() {
  python3 - "$1" "$slowdown" "$minutes" "$2" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
slowdown, minutes, funnel = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
compute = s["worker0"]["times"]["compute"] / s["steps"]
# The busiest link carries `funnel` workers' bytes (a lone server's carries all of them).
rate = s["bytes_per_step"] * funnel * 8 / compute / slowdown
step_seconds = compute * slowdown
print(f"{max(rate, 1000):.0f} {max(int(minutes * 60 / step_seconds), 10)}")
EOF
}

pids=()
for strategy in $strategies; do
  funnel=1
  [ "${servers[$strategy]}" -gt 0 ] && funnel=$(( workers / servers[$strategy] ))
  read -r rate steps < <(plan "$out/calibrate-$strategy.json" "$funnel")
  echo "soak: $strategy at ${rate} bit/s (${slowdown}x slower than its need), $steps steps" >&2
  "$SYNCOPATE_BIN" launch "${job[@]}" --strategy "$strategy" --servers "${servers[$strategy]}" \
    --steps "$steps" --eval-every $(( steps / 20 > 0 ? steps / 20 : 1 )) \
    ${extra[$strategy]} --bandwidth "${rate}bit" --metrics-dir "$out/$strategy" \
    --metrics-interval 2 --stall-timeout 0 > "$out/$strategy.log" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "soak: a job failed; see $out/*.log" >&2; exit 1; }
fi

python3 - "$out" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
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
    rows = list(csv.DictReader(open(path)))
    end = float(rows[-1]["t_s"])
    minutes = max(minutes, end / 60)
    warm = [r for r in rows if float(r["t_s"]) >= 0.1 * end]
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
sys.exit(1 if failed else 0)
EOF
