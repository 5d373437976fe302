#!/usr/bin/env bash
# What per-frame MACs cost training jobs: each job with --no-frame-mac and with frame MACs
# (the default), alternated in one run (both back to back each round, their order swapped
# every round) so that a noisy neighbour hits both alike; the cost is taken from each
# round's pair, never across runs.
#   lenet  LeNet on MNIST, ring all-reduce, 4 workers, batch 64, --steps steps, one thread
#          each: the summary's samples/s (training time, evaluation left out).
#   vgg19  P3 on the VGG-19 compute profile, 4 workers and 4 servers, 6 Gbit/s per
#          process, tensors and bandwidth scaled by --scale (1/16 as in the P3 study, so
#          that 8 processes fit 2 cores): worker 0's mean step over its last 5 of 8
#          steps (s).
#
# Usage: scripts/bench-frame-mac-jobs.sh [--jobs "lenet vgg19"] [--rounds 3] [--steps 400]
#                                        [--data DIR] [--scale F] [--out DIR]
#   --jobs    which jobs (default "lenet vgg19")
#   --rounds  repetitions (default 3)
#   --steps   LeNet's steps (default 400)
#   --data    the MNIST folder (default ../shared/data/mnist), or "synthetic" for generated
#             images of MNIST's shape
#   --out     where the raw CSV and the table go (default target/bench-frame-mac-jobs)
#   --scale   VGG-19's tensors and bandwidth scaled by this (default 1/16)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's release.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

jobs="lenet vgg19"
rounds=3
steps=400
scale=1/16
data="$root/../shared/data/mnist"
out="$root/target/bench-frame-mac-jobs"
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-frame-mac-jobs: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench-frame-mac-jobs: --rounds must be a positive integer" >&2; exit 2; }
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
bench_release_binary

mkdir -p "$out"
raw="$out/raw.csv"
echo "job,mac,round,value" > "$raw"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

dataset=(--dataset mnist --data "$data")
[ "$data" = synthetic ] && dataset=(--dataset synthetic)

# Runs job $1 once with frame MACs $2 (off/on), round $3, and appends its figure.
run() {
  local job=$1 mac=$2 round=$3 flag=() dir="$work/$1-$2-$3"
  [ "$mac" = off ] && flag=(--no-frame-mac)
  mkdir -p "$dir"
  echo "round $round/$rounds, $job, frame MACs $mac" >&2
  case "$job" in
    lenet)
      RAYON_NUM_THREADS=1 "$syncopate" launch --strategy allreduce --workers 4 --model lenet \
        "${dataset[@]}" --batch-size 64 --steps "$steps" --quiet \
        --no-replica-stats --summary-json "$dir/s.json" "${flag[@]}" > "$dir/log" 2>&1 \
        || { cat "$dir/log" >&2; exit 1; }
      "$syncopate" summary "$dir/s.json" samples_per_sec | sed "s|^|lenet 4 workers samples/s,$mac,$round,|" >> "$raw" ;;
    vgg19)
      "$syncopate" launch --strategy p3 --workers 4 --servers 4 --model profile:vgg19 \
        --scale "$scale" --bandwidth 6gbit --steps 8 --batch-size 128 --metrics-dir "$dir" \
        "${flag[@]}" > "$dir/log" 2>&1 || { cat "$dir/log" >&2; exit 1; }
      awk -F, -v m="$mac" -v r="$round" 'NR > 1 && $1 > 3 { t += $3; n++ }
        END { printf "vgg19 p3 6gbit step (s),%s,%s,%.4f\n", m, r, t / n }' \
        "$dir/steps-rank0.csv" >> "$raw" ;;
    *) echo "bench-frame-mac-jobs: unknown job '$job'" >&2; exit 2 ;;
  esac
}

bench_alternate_macs run "$jobs"

/usr/bin/python3 "$root/scripts/bench_table.py" frame-mac-jobs "$raw" "$out/table.md"
echo "raw measurements: $raw; table: $out/table.md" >&2
