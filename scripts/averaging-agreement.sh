#!/usr/bin/env bash
# Runtime against simulator for the averaging strategies (issue 39): all-reduce, local SGD and
# DiLoCo every 4 steps, gossip, step-wise averaging every 4 steps; 4 workers replaying the
# ResNet-50 profile at 1 Gbit/s (or --bandwidth). The runtime replays the profile over real
# sockets on this machine with every tensor and the network scaled by 1/16 (--scale); the
# simulator runs the full-size model on virtual time. Both build their endpoints from the
# same core plan, so a sync step and a local step cost the same in both.
#
# Usage: scripts/averaging-agreement.sh [--steps N] [--bandwidth BW] [--model M] [--out DIR]
#   --steps      steps per run (default 17: steps 2-17 are four whole periods of 4)
#   --bandwidth  every host's bandwidth at full size (default 1gbit)
#   --model      profile to replay (default resnet50; vgg16 and vgg19 also ship)
#   --out        where the reports and the table go (default target/averaging-agreement)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's (release).
# Prints a Markdown table: mean step time of steps 2..N in the runtime (worker 0) and in the
# simulator, and their ratio.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
steps=17
bandwidth=1gbit
model=resnet50
out="$root/target/averaging-agreement"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --bandwidth) bandwidth=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "averaging-agreement: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] && [ "$steps" -ge 2 ] || { echo "averaging-agreement: --steps must be an integer >= 2" >&2; exit 2; }
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
bench_release_binary
mkdir -p "$out"
runs=(
  "allreduce|--strategy allreduce"
  "local-sgd-4|--strategy local-sgd --average-every 4"
  "diloco-4|--strategy diloco --average-every 4"
  "gossip|--strategy gossip"
  "stepwise-4|--strategy stepwise --average-every 4"
)
for run in "${runs[@]}"; do
  label=${run%%|*}
  read -r -a flags <<<"${run#*|}"
  echo "averaging-agreement: $label, runtime" >&2
  "$syncopate" launch "${flags[@]}" --workers 4 --model "profile:$model" --scale 1/16 \
    --bandwidth "$bandwidth" --steps "$steps" --batch-size 128 --quiet \
    --summary-json "$out/$label-runtime.json" >/dev/null
  echo "averaging-agreement: $label, simulator" >&2
  "$syncopate" simulate "${flags[@]}" --workers 4 --model "profile:$model" \
    --bandwidth "$bandwidth" --steps "$steps" --json "$out/$label-sim.json" \
    --out "$out/sim" >/dev/null
done
labels=$(printf '%s\n' "${runs[@]}" | cut -d'|' -f1 | tr '\n' ' ')
python3 - "$out" $labels <<'PY' | tee "$out/table.md"
import json, sys
out, labels = sys.argv[1], sys.argv[2:]
mean = lambda v: sum(v) / len(v)
print("| strategy | runtime step | simulator step | simulator / runtime |")
print("|---|---|---|---|")
for label in labels:
    rt = json.load(open(f"{out}/{label}-runtime.json"))
    sim = json.load(open(f"{out}/{label}-sim.json"))
    r, s = mean(rt["worker0"]["step_seconds"][1:]), mean(sim["step_seconds"][1:])
    print(f"| {label} | {r:.3f} s | {s:.3f} s | {s / r:.3f} |")
PY
