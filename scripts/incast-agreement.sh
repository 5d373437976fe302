#!/usr/bin/env bash
# Runtime against simulator on a lossy incast network (issue 13): 4 workers pushing to one
# server behind its ingress port, 1 % random loss, a 200 ms RTO and 512 KiB queues; profile
# VGG-19 and ResNet-50, ps and p3. The runtime replays the profiles over real sockets on this
# machine with every tensor and the network scaled by 1/16 (--scale); the simulator runs the
# full-size model on virtual time. Both use the core's network model with the same seed.
#
# Usage: scripts/incast-agreement.sh [--steps N] [--bandwidth BW] [--out DIR]
#   --steps      steps per run (default 10; the first is left out of the means)
#   --bandwidth  every host's bandwidth at full size (default 10gbit)
#   --out        where the reports and the table go (default target/incast-agreement)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's (release).
# Prints a Markdown table (python3 reads the reports): mean step time of steps 2..N in the
# runtime (worker 0) and in the simulator, their ratio, and each side's queue drops and
# retransmissions.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
steps=10
bandwidth=10gbit
out="$root/target/incast-agreement"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --bandwidth) bandwidth=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "incast-agreement: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] && [ "$steps" -ge 2 ] || { echo "incast-agreement: --steps must be an integer >= 2" >&2; exit 2; }
# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
bench_release_binary
mkdir -p "$out"
net=(--bandwidth "$bandwidth" --ingress --loss 1% --rto 200ms --queue 512KiB)
for model in vgg19 resnet50; do
  for strategy in ps p3; do
    echo "incast-agreement: $model $strategy, runtime" >&2
    "$syncopate" launch --strategy "$strategy" --workers 4 --servers 1 --model "profile:$model" \
      --scale 1/16 "${net[@]}" --steps "$steps" --batch-size 128 --quiet \
      --summary-json "$out/$model-$strategy-runtime.json" >/dev/null
    echo "incast-agreement: $model $strategy, simulator" >&2
    "$syncopate" simulate --strategy "$strategy" --workers 4 --servers 1 --model "profile:$model" \
      "${net[@]}" --steps "$steps" --json "$out/$model-$strategy-sim.json" --out "$out/sim" >/dev/null
  done
done
python3 - "$out" <<'PY' | tee "$out/table.md"
import json, sys
out = sys.argv[1]
mean = lambda v: sum(v) / len(v)
print("| model | strategy | runtime step | simulator step | simulator / runtime | runtime drops, retransmissions (worker 0) | simulator drops, retransmissions (all hosts) |")
print("|---|---|---|---|---|---|---|")
for model in ("vgg19", "resnet50"):
    for strategy in ("ps", "p3"):
        rt = json.load(open(f"{out}/{model}-{strategy}-runtime.json"))
        sim = json.load(open(f"{out}/{model}-{strategy}-sim.json"))
        r, s = mean(rt["worker0"]["step_seconds"][1:]), mean(sim["step_seconds"][1:])
        n = sim["network"]
        print(f"| {model} | {strategy} | {r:.3f} s | {s:.3f} s | {s / r:.3f} | "
              f"{rt['frames_dropped']}, {rt['frames_retransmitted']} | "
              f"{n['frames_dropped']}, {n['frames_retransmitted']} |")
PY
