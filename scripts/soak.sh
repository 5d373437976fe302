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
# state. Prints, per process, the median RSS once warm (10-35 % of the run) and over the last
# quarter, and the peak (evaluations allocate for a moment); fails when any process's median
# grew by more than 5 % from the one to the other.
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
import csv, glob, os, statistics, sys
out = sys.argv[1]
print("| strategy | process | RSS median once warm (MiB) | range (MiB) | trend (MiB/hour) | trend over the run |")
print("|---|---|---|---|---|---|")
worst, minutes = 0.0, 0.0
for path in sorted(glob.glob(f"{out}/*/metrics-rank*.csv")):
    rows = list(csv.DictReader(open(path)))
    samples = [(float(r["t_s"]), int(r["rss_bytes"])) for r in rows]
    end = samples[-1][0]
    minutes = max(minutes, end / 60)
    warm = [(t, x) for t, x in samples if t >= 0.1 * end]
    if len(warm) < 10:
        sys.exit(f"soak: {path} has too few samples")
    # Least-squares slope of RSS over time once warm: a leak raises it, the moments of
    # allocation around evaluations (up and down again) do not.
    mt = statistics.fmean(t for t, _ in warm)
    mx = statistics.fmean(x for _, x in warm)
    slope = sum((t - mt) * (x - mx) for t, x in warm) / sum((t - mt) ** 2 for t, _ in warm)
    median = statistics.median(x for _, x in warm)
    drift = slope * (end - warm[0][0]) / median
    worst = max(worst, drift)
    strategy = os.path.basename(os.path.dirname(path))
    rank = path.rsplit("rank", 1)[1].split(".")[0]
    mib = lambda b: f"{b / 2**20:.1f}"
    lo, hi = min(x for _, x in warm), max(x for _, x in warm)
    print(f"| {strategy} | rank {rank} | {mib(median)} | {mib(lo)}-{mib(hi)} | "
          f"{slope * 3600 / 2**20:+.2f} | {drift * 100:+.1f} % |")
print(f"\nlargest trend once warm (10 % of the run on): {worst * 100:+.1f} % of the median "
      f"over {minutes:.1f} min")
sys.exit(1 if worst > 0.05 else 0)
EOF
