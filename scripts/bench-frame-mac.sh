#!/usr/bin/env bash
# What per-frame MACs cost: ring all-reduce bus bandwidth (`syncopate bench-comm`) with
# --no-frame-mac and with frame MACs (the default), alternated in one run (for each round and rank count, both runs back
# to back, their order swapped every round) so that a noisy neighbour hits both alike; the
# cost is taken from each round's pair, never across runs.
#
# Usage: scripts/bench-frame-mac.sh [--ranks "2 4"] [--sizes "4K 64K 1M 16M 100M"] [--rounds 5]
#                                   [--min-time 1] [--bench-args "ARGS"] [--out DIR]
#   --ranks     process counts (default "2 4")
#   --sizes     message sizes in bytes, K/M/G = KiB/MiB/GiB (default 4K 64K 1M 16M 100M)
#   --rounds    repetitions; the table shows medians and the range of the per-round costs
#   --min-time  seconds of timed operations per size and run (default 1)
#   --bench-args  more bench-comm flags for every run, e.g. "--bandwidth 1gbit"
#   --out       where the raw CSV and the table go (default target/bench-frame-mac)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's.
# Prints a Markdown table (bus bandwidth 2(n-1)/n x bytes / median time, GB/s, without and
# with MACs, and the cost 1 - with/without) and writes it to OUT/table.md, with every
# measurement in OUT/raw.csv.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
bench_defaults bench-frame-mac 5 ""
bench_parse_args bench-frame-mac 18 "$@"
bench_binary

mkdir -p "$out"
raw="$out/raw.csv"
echo "mac,round,size_bytes,ranks,median_s,busbw_GBps" > "$raw"
bench_sizes=$(echo "$sizes" | tr ' ' ',')

# Runs bench-comm once with $1 ranks and appends its rows under mac=$2 (off/on), round $3.
run() {
  local n=$1 mac=$2 round=$3 flag=()
  [ "$mac" = off ] && flag=(--no-frame-mac)
  echo "round $round/$rounds, $n ranks, frame MACs $mac" >&2
  # shellcheck disable=SC2086
  "$syncopate" bench-comm --strategy allreduce --workers "$n" --sizes "$bench_sizes" \
    --min-time "$min_time" $bench_args "${flag[@]}" 2>/dev/null | sed 's/^\[worker 0\] //' \
    | grep -E '^[0-9]' | cut -d, -f1-4 | sed "s/^/$mac,$round,/" >> "$raw"
}

bench_alternate_macs run "$ranks"

/usr/bin/python3 "$root/scripts/bench_table.py" frame-mac "$raw" "$out/table.md"
echo "raw measurements: $raw; table: $out/table.md" >&2
