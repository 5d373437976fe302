#!/usr/bin/env bash
# The credit scheduler with and without --autotune against p3, simulated over the P3 study's
# bandwidths (VGG-19 and ResNet-50 profiles, 4 workers, 4 servers), all in one run.
#
# Usage: scripts/autotune-sweep.sh [--steps N] [--out DIR]
#   --steps   simulated steps per run (default 40: the search takes 15-25 of them)
#   --out     where the table goes (default target/autotune-sweep)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's (release).
# Prints a Markdown table (python3 reads the reports): p3's step time, the fixed credit's and
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

for spec in "vgg19:1gbit 2.5gbit 5gbit 10gbit 25gbit" "resnet50:0.5gbit 1gbit 2gbit 5gbit 10gbit"; do
  model=${spec%%:*}
  for bw in ${spec#*:}; do
    echo "autotune-sweep: $model at $bw" >&2
    common=(simulate --model "profile:$model" --workers 4 --servers 4 --bandwidth "$bw" --steps "$steps" --out "$out/runs")
    "$syncopate" "${common[@]}" --strategy p3 --json "$out/$model-$bw-p3.json" >/dev/null
    "$syncopate" "${common[@]}" --strategy p3 --scheduler credit --json "$out/$model-$bw-credit.json" >/dev/null
    "$syncopate" "${common[@]}" --strategy p3 --scheduler credit --autotune --json "$out/$model-$bw-autotune.json" >/dev/null
  done
done
python3 - "$out" <<'PY' | tee "$out/table.md"
import json, sys
out = sys.argv[1]
mean = lambda v: sum(v) / len(v) if v else float("nan")
print("| model | bandwidth | p3 step | credit (fixed) | credit --autotune, whole run | after the search (p3 over the same steps) | credit chosen | search steps |")
print("|---|---|---|---|---|---|---|---|")
for model, bws in [("vgg19", "1gbit 2.5gbit 5gbit 10gbit 25gbit"), ("resnet50", "0.5gbit 1gbit 2gbit 5gbit 10gbit")]:
    for bw in bws.split():
        r = {k: json.load(open(f"{out}/{model}-{bw}-{k}.json")) for k in ("p3", "credit", "autotune")}
        p3, fixed, tuned = (r[k]["mean_step_seconds"] for k in ("p3", "credit", "autotune"))
        tune = r["autotune"]["autotune"]
        n = tune["settled_after_steps"]
        if n is None:
            after = "search not over"
        else:
            # The tuner's n-th step time is step n's; the chosen credit runs from step n + 1.
            t, p = mean(r["autotune"]["step_seconds"][n + 1:]), mean(r["p3"]["step_seconds"][n + 1:])
            after = f"{t:.3f} s ({100 * p / t:.0f} %; p3 {p:.3f} s)"
        chosen = tune["chosen"]["credit_bytes"] / r["autotune"]["config"]["scale"] / 1e6
        print(f"| {model} | {bw} | {p3:.3f} s | {fixed:.3f} s ({100 * p3 / fixed:.0f} %) | "
              f"{tuned:.3f} s ({100 * p3 / tuned:.0f} %) | {after} | {chosen:.2f} MB | {n} |")
PY
