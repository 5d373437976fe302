#!/usr/bin/env bash
# DDP with Syncopate's all-reduce hook against DDP with Gloo: LeNet and ResNet-20
# (examples/torch), 2 and 4 processes of one thread each on this machine, gloo and
# syncopate repetitions alternating in one run. Prints a Markdown table of samples/s (the
# median of the repetitions) and their ratio, and compares the final weights of the two
# backends (rank 0's, float tolerance).
#
#   scripts/bench-ddp.sh [--reps N] [--lenet-steps N] [--resnet-steps N] [--synthetic]
#
# The processes get torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
# from this script: Debian's torch 1.13 torchrun fails on Python 3.11. Needs the package
# installed (scripts/test.sh builds it into target/py-venv, which this script uses when
# it exists).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=3 lenet_steps=200 resnet_steps=30 data_flag=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --lenet-steps) lenet_steps=$2; shift 2 ;;
    --resnet-steps) resnet_steps=$2; shift 2 ;;
    --synthetic) data_flag=(--synthetic); shift ;;
    *) echo "bench-ddp: unknown argument $1" >&2; exit 2 ;;
  esac
done
python=python3
[ -x target/py-venv/bin/python ] && python=target/py-venv/bin/python
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run SCRIPT PROCESSES BACKEND STEPS: one job; prints rank 0's RESULT line.
run() {
  local script=$1 n=$2 backend=$3 steps=$4 port pids=() rank
  port=$(free_port)
  for ((rank = 0; rank < n; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$python" "examples/torch/$script" --backend "$backend" --steps "$steps" \
      "${data_flag[@]}" --save "$out/$script-$n-$backend.npy" \
      >"$out/log-$rank" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { cat "$out"/log-* >&2; echo "bench-ddp: $script $backend failed" >&2; exit 1; }
  done
  grep '^RESULT' "$out/log-0"
}

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

echo "| model | processes | Gloo samples/s | Syncopate samples/s | ratio | final loss Gloo / Syncopate | weights max diff |"
echo "|---|---|---|---|---|---|---|"
for model in lenet resnet20; do
  steps=$lenet_steps
  [ "$model" = resnet20 ] && steps=$resnet_steps
  for n in 2 4; do
    : >"$out/gloo.rates"; : >"$out/syncopate.rates"
    for ((r = 0; r < reps; r++)); do
      for backend in gloo syncopate; do
        line=$(run "${model}_ddp.py" "$n" "$backend" "$steps")
        sed -E 's/.*samples_per_s=([0-9.]+).*/\1/' <<<"$line" >>"$out/$backend.rates"
        sed -E 's/.*final_loss=([0-9.]+).*/\1/' <<<"$line" >"$out/$backend.loss"
      done
    done
    gloo=$(median <"$out/gloo.rates")
    sync=$(median <"$out/syncopate.rates")
    diff=$("$python" -c 'import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
d = float(np.max(np.abs(a - b)))
ok = np.allclose(a, b, rtol=1e-3, atol=1e-3)
print(f"{d:.1e}" + ("" if ok else " (NOT within tolerance)"))' \
      "$out/${model}_ddp.py-$n-gloo.npy" "$out/${model}_ddp.py-$n-syncopate.npy")
    ratio=$(awk -v a="$sync" -v b="$gloo" 'BEGIN {printf "%.2f", a / b}')
    echo "| $model | $n | $gloo | $sync | ${ratio}x | $(cat "$out/gloo.loss") / $(cat "$out/syncopate.loss") | $diff |"
  done
done
