#!/usr/bin/env bash
# The credit scheduler with and without --autotune against p3, simulated over the P3 study's
# bandwidths (VGG-19 and ResNet-50 profiles, 4 workers, 4 servers), all in one run.
#
# Usage: scripts/autotune-sweep.sh [--steps N] [--out DIR]
#   --steps   simulated steps per run (default 40: the search takes 15-25 of them)
#   --out     where the table goes (default target/autotune-sweep)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's (release).
# Prints a Markdown table (`syncopate summary` reads the reports): p3's step time, the fixed credit's and
# the tuned credit's (over the whole run, search included, and over the steps after the
# search, beside p3's over the same steps), each as a share of p3's throughput, the credit
# chosen (full-size bytes) and the steps the search took. Every report is kept in --out.
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
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
bench_release_binary
mkdir -p "$out"

sweep=("vgg19:1gbit 2.5gbit 5gbit 10gbit 25gbit" "resnet50:0.5gbit 1gbit 2gbit 5gbit 10gbit")
for spec in "${sweep[@]}"; do
  model=${spec%%:*}
  for bw in ${spec#*:}; do
    echo "autotune-sweep: $model at $bw" >&2
    common=(simulate --model "profile:$model" --workers 4 --servers 4 --bandwidth "$bw" --steps "$steps" --out "$out/runs")
    "$syncopate" "${common[@]}" --strategy p3 --json "$out/$model-$bw-p3.json" >/dev/null
    "$syncopate" "${common[@]}" --strategy p3 --scheduler credit --json "$out/$model-$bw-credit.json" >/dev/null
    "$syncopate" "${common[@]}" --strategy p3 --scheduler credit --autotune --json "$out/$model-$bw-autotune.json" >/dev/null
  done
done

# One figure (or several, tab-separated) of a simulator report.
figure() { "$syncopate" summary --kind simulate "$@"; }
{
  echo "| model | bandwidth | p3 step | credit (fixed) | credit --autotune, whole run | after the search (p3 over the same steps) | credit chosen | search steps |"
  echo "|---|---|---|---|---|---|---|---|"
  for spec in "${sweep[@]}"; do
    model=${spec%%:*}
    for bw in ${spec#*:}; do
      run="$out/$model-$bw"
      p3=$(figure "$run-p3.json" mean_step_seconds)
      fixed=$(figure "$run-credit.json" mean_step_seconds)
      read -r tuned n credit scale < <(figure "$run-autotune.json" mean_step_seconds \
        autotune.settled_after_steps autotune.chosen.credit_bytes config.scale)
      if [ "$n" = - ]; then
        after="search not over"
      else
        # The tuner's n-th step time is step n's; the chosen credit runs from step n + 1.
        t=$(figure --skip $((n + 1)) "$run-autotune.json" step_seconds:mean)
        p=$(figure --skip $((n + 1)) "$run-p3.json" step_seconds:mean)
        after=$(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.3f s (%.0f %%; p3 %.3f s)", t, 100 * p / t, p }')
      fi
      awk -v m="$model" -v bw="$bw" -v p3="$p3" -v f="$fixed" -v t="$tuned" -v a="$after" \
        -v c="$credit" -v s="$scale" -v n="$n" 'BEGIN {
          printf "| %s | %s | %.3f s | %.3f s (%.0f %%) | %.3f s (%.0f %%) | %s | %.2f MB | %s |\n",
            m, bw, p3, f, 100 * p3 / f, t, 100 * p3 / t, a, c / s / 1e6, n }'
    done
  done
} | tee "$out/table.md"
