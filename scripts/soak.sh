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
  local compute steps bytes
  read -r compute steps bytes < <("$SYNCOPATE_BIN" summary "$1" worker0.times.compute steps bytes_per_step)
  # The busiest link carries `funnel` workers' bytes (a lone server's carries all of them).
  awk -v c="$compute" -v n="$steps" -v b="$bytes" -v funnel="$2" -v slowdown="$slowdown" \
    -v minutes="$minutes" 'BEGIN {
      compute = c / n; rate = b * funnel * 8 / compute / slowdown
      steps = int(minutes * 60 / (compute * slowdown))
      printf "%.0f %d\n", (rate > 1000 ? rate : 1000), (steps > 10 ? steps : 10) }'
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

python3 "$root/scripts/bench_table.py" soak "$out"
