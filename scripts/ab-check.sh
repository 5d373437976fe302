#!/usr/bin/env bash
# No-regression check of two builds, side by side in one run: the ring all-reduce's bus
# bandwidth (bench-comm, 2 and 4 ranks), P3 and FIFO ps over shaped links (ResNet-50 profile,
# 4 workers, 4 servers, 1 Gbit/s: worker 0's mean step over its last 5 of 8 steps) and the
# 1,024-worker simulation (ResNet-50, P3, 10 steps: the `scale` example's wall time).
# Each round runs A then B on every check, so a noisy neighbour hits both alike; the table
# gives each figure's median over the rounds and B / A.
#
# Usage: scripts/ab-check.sh A_DIR B_DIR [--rounds N] [--checks "allreduce p3 scale"] [--out DIR]
#   A_DIR, B_DIR  folders holding a release `syncopate` and the sim's `scale` example, e.g.
#                 after `cargo build --release -p syncopate -p syncopate-sim --example scale`:
#                 mkdir -p B && cp target/release/syncopate target/release/examples/scale B/
#   --rounds      repetitions (default 3)
#   --checks      which checks to run (default all three: allreduce p3 scale)
#   --out         where the raw CSV goes (default target/ab-check)
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
[[ $# -ge 2 ]] || usage 2
A=$1 B=$2
shift 2
# The figures are kept by folder: one folder twice would compare a run with itself.
if [[ "$(cd "$A" && pwd -P)" == "$(cd "$B" && pwd -P)" ]]; then
    echo "ab-check: A_DIR and B_DIR are the same folder ($A): copy one build elsewhere" >&2
    exit 2
fi
ROUNDS=3
CHECKS="allreduce p3 scale"
OUT=target/ab-check
while [[ $# -gt 0 ]]; do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --checks) CHECKS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "ab-check: unknown argument $1" >&2; usage 2 ;;
    esac
done
for d in "$A" "$B"; do
    for f in syncopate scale; do
        [[ -x $d/$f ]] || { echo "ab-check: $d/$f is missing (see --help)" >&2; exit 2; }
    done
done
mkdir -p "$OUT"
RAW=$OUT/raw.csv
echo "round,build,check,value" > "$RAW"
SIZES=4KiB,64KiB,1MiB,16MiB,100MiB

allreduce() { # build dir, ranks: appends busbw per size (GB/s)
    "$1/syncopate" bench-comm --strategy allreduce --workers "$2" --sizes $SIZES --min-time 1 2>&1 |
        awk -F, -v r="$ROUND" -v b="$1" -v n="$2" '/\[worker 0\] [0-9]/ {
            sub(/.*\] /, "", $1); printf "%s,%s,allreduce %s ranks %s B (GB/s),%s\n", r, b, n, $1, $4 }' >> "$RAW"
}

p3_ps() { # build dir, strategy: appends worker 0's mean step over steps 4-8 (s)
    local dir
    dir=$(mktemp -d)
    "$1/syncopate" launch --strategy "$2" --workers 4 --servers 4 --model profile:resnet50 \
        --scale 1/16 --bandwidth 1gbit --steps 8 --batch-size 128 --metrics-dir "$dir" \
        > "$dir/log" 2>&1 || { cat "$dir/log" >&2; exit 1; }
    awk -F, -v r="$ROUND" -v b="$1" -v s="$2" 'NR > 1 && $1 > 3 { t += $3; n++ }
        END { printf "%s,%s,%s resnet50 1gbit step (s),%.4f\n", r, b, s, t / n }' \
        "$dir/steps-rank0.csv" >> "$RAW"
    rm -rf "$dir"
}

scale() { # build dir: appends the 1,024-worker simulation's wall time (s)
    local start end
    start=$(date +%s.%N)
    "$1/scale" 1024 32 10 4096 > /dev/null
    end=$(date +%s.%N)
    awk -v r="$ROUND" -v b="$1" -v s="$start" -v e="$end" 'BEGIN { printf "%s,%s,simulate 1024 workers p3 10 steps (s),%.3f\n", r, b, e - s }' >> "$RAW"
}

for ROUND in $(seq 1 "$ROUNDS"); do
    echo "round $ROUND of $ROUNDS" >&2
    for build in "$A" "$B"; do
        for check in $CHECKS; do
            case $check in
                allreduce) allreduce "$build" 2; allreduce "$build" 4 ;;
                p3) p3_ps "$build" ps; p3_ps "$build" p3 ;;
                scale) scale "$build" ;;
                *) echo "ab-check: unknown check $check" >&2; exit 2 ;;
            esac
        done
    done
done

python3 "$(dirname "${BASH_SOURCE[0]}")/bench_table.py" ab "$RAW" "$A" "$B"
