#!/usr/bin/env bash
# The credit scheduler with and without --autotune against p3, simulated over the P3 study's
# bandwidths (VGG-19 and ResNet-50 profiles, 4 workers, 4 servers), all in one run.
#
# Usage: scripts/autotune-sweep.sh [--steps N] [--out DIR]
#   --steps   simulated steps per run (default 40: the search takes 15-25 of them)
#   --out     where the table goes (default target/autotune-sweep)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's (release).
# Prints a Markdown table: p3's step time, the fixed credit's and the tuned credit's (over the
# whole run, search included, and over the steps after the search), each tuned figure as a
# share of p3's throughput, and the credit chosen (full-size bytes).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
steps=40
out="$root/target/autotune-sweep"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "autotune-sweep: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "autotune-sweep: --steps must be a positive integer" >&2; exit 2; }
if [ -n "${SYNCOPATE_BIN:-}" ]; then
  syncopate=$SYNCOPATE_BIN
else
  cargo build --release -p syncopate --quiet
  syncopate="$root/target/release/syncopate"
fi
mkdir -p "$out"

# step seconds of a simulate run's result line (the first line after the header)
step_of() { awk 'NR == 2 { print $5 }'; }

table="$out/table.md"
{
  echo "| model | bandwidth | p3 step | credit (fixed) | credit --autotune, whole run | after the search | credit chosen |"
  echo "|---|---|---|---|---|---|---|"
} >"$table"
for spec in "vgg19:1gbit 2.5gbit 5gbit 10gbit 25gbit" "resnet50:0.5gbit 1gbit 2gbit 5gbit 10gbit"; do
  model=${spec%%:*}
  for bw in ${spec#*:}; do
    echo "autotune-sweep: $model at $bw" >&2
    common=(simulate --model "profile:$model" --workers 4 --servers 4 --bandwidth "$bw" --steps "$steps" --out "$out/runs")
    p3=$("$syncopate" "${common[@]}" --strategy p3 | step_of)
    fixed=$("$syncopate" "${common[@]}" --strategy p3 --scheduler credit | step_of)
    tuned_out=$("$syncopate" "${common[@]}" --strategy p3 --scheduler credit --autotune)
    tuned=$(echo "$tuned_out" | step_of)
    line=$(echo "$tuned_out" | grep 'autotune:' || true)
    chosen=$(echo "$line" | sed -n 's/.*credit \([0-9]*\) bytes.*/\1/p')
    settled=$(echo "$line" | sed -n 's/.*; \([0-9.]*\) s a step over.*/\1/p')
    awk -v m="$model" -v bw="$bw" -v p3="$p3" -v f="$fixed" -v t="$tuned" -v s="${settled:-nan}" -v c="${chosen:-?}" 'BEGIN {
      printf "| %s | %s | %.3f s | %.3f s (%.0f %%) | %.3f s (%.0f %%) | %s | %.2f MB |\n",
        m, bw, p3, f, 100 * p3 / f, t, 100 * p3 / t,
        (s == "nan" ? "search not over" : sprintf("%.3f s (%.0f %%)", s, 100 * p3 / s)), c / 1e6
    }' >>"$table"
  done
done
cat "$table"
