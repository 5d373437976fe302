#!/usr/bin/env bash
# Memory under a slow link: p3 and ring all-reduce, side by side, each behind an emulated link
# 100 times slower than the job needs, for about --minutes minutes; every process samples its
# resident memory into a metrics CSV, and the script checks that none grows once warm.
#
# Usage: scripts/soak.sh [--minutes 10] [--slowdown 100] [--out DIR]
#   --minutes   how long each job runs (default 10; both run at the same time)
#   --slowdown  how many times slower than needed the link is (default 100)
#   --out       where the jobs' metrics go (default target/soak)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's.
#
# "What the job needs": a 20-step calibration run on an unlimited link measures the compute
# time of a step and the bytes a worker sends per step; the link's rate is then
# bytes x 8 / compute / slowdown, and the step count fills the minutes at that rate.
# Worker 0 evaluates every 5 % of the steps, so its evaluation buffers are part of its warm
# state. Prints, per process, its RSS when warm (after the first 10 % of the run), its peak
# after that and at the end; fails when any process grew by more than 5 % after warming up.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

minutes=10
slowdown=100
out="$root/target/soak"
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --slowdown) slowdown=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$minutes" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "soak: --minutes must be a number" >&2; exit 2; }
[[ "$slowdown" =~ ^[1-9][0-9]*$ ]] || { echo "soak: --slowdown must be a positive integer" >&2; exit 2; }

if [ -z "${SYNCOPATE_BIN:-}" ]; then
  cargo build --release -p syncopate >&2
  SYNCOPATE_BIN="$root/target/release/syncopate"
fi
rm -rf "$out"
mkdir -p "$out"

job=(--model lenet --dataset synthetic --batch-size 64 --workers 2 --quiet --no-replica-stats)
declare -A servers=([p3]=1 [allreduce]=0)

for strategy in p3 allreduce; do
  "$SYNCOPATE_BIN" launch "${job[@]}" --strategy "$strategy" --servers "${servers[$strategy]}" \
    --steps 20 --summary-json "$out/calibrate-$strategy.json" >/dev/null 2>&1
done

# rate (bit/s) and steps for each strategy, from its calibration
plan() {
  python3 - "$1" "$slowdown" "$minutes" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
slowdown, minutes = float(sys.argv[2]), float(sys.argv[3])
compute = s["worker0"]["times"]["compute"] / s["steps"]
rate = s["bytes_per_step"] * 8 / compute / slowdown
step_seconds = compute * slowdown
print(f"{max(rate, 1000):.0f} {max(int(minutes * 60 / step_seconds), 10)}")
EOF
}

pids=()
for strategy in p3 allreduce; do
  read -r rate steps < <(plan "$out/calibrate-$strategy.json")
  echo "soak: $strategy at ${rate} bit/s (${slowdown}x slower than its need), $steps steps" >&2
  "$SYNCOPATE_BIN" launch "${job[@]}" --strategy "$strategy" --servers "${servers[$strategy]}" \
    --steps "$steps" --eval-every $(( steps / 20 > 0 ? steps / 20 : 1 )) \
    --bandwidth "${rate}bit" --metrics-dir "$out/$strategy" \
    --metrics-interval 2 --stall-timeout 0 > "$out/$strategy.log" 2>&1 &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "soak: a job failed; see $out/*.log" >&2; exit 1; }

python3 - "$out" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
print("| strategy | process | RSS warm (MiB) | peak after (MiB) | end (MiB) | growth |")
print("|---|---|---|---|---|---|")
worst = 0.0
for path in sorted(glob.glob(f"{out}/*/metrics-rank*.csv")):
    rows = list(csv.DictReader(open(path)))
    t = [float(r["t_s"]) for r in rows]
    rss = [int(r["rss_bytes"]) for r in rows]
    warm = next(i for i, x in enumerate(t) if x >= 0.1 * t[-1])
    peak = max(rss[warm:])
    growth = (peak - rss[warm]) / rss[warm]
    worst = max(worst, growth)
    strategy = os.path.basename(os.path.dirname(path))
    rank = path.rsplit("rank", 1)[1].split(".")[0]
    mib = lambda b: f"{b / 2**20:.1f}"
    print(f"| {strategy} | rank {rank} | {mib(rss[warm])} | {mib(peak)} | {mib(rss[-1])} | {growth * 100:+.1f} % |")
print(f"\nlargest growth after warm-up: {worst * 100:.1f} % over {t[-1] / 60:.1f} min")
sys.exit(1 if worst > 0.05 else 0)
EOF
