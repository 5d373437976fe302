#!/usr/bin/env bash
# DDP with Syncopate's all-reduce hook against DDP with Gloo: LeNet and ResNet-20
# (examples/torch), and with --transformer a 110M-parameter transformer, 2 and 4 processes
# of one thread each on this machine, gloo and syncopate repetitions alternating in one run,
# in float32 and (--dtypes fp32,bf16) bfloat16. Prints a Markdown table of samples/s (the
# median of the repetitions) and their ratio, and compares the final weights of the two
# backends (rank 0's, float tolerance).
#
#   scripts/bench-ddp.sh [--reps N] [--lenet-steps N] [--resnet-steps N] [--synthetic]
#                        [--device cpu|cuda] [--transformer] [--transformer-steps N]
#                        [--models lenet,resnet20,transformer] [--dtypes fp32,bf16]
#                        [--processes 2,4] [--no-frame-mac]
#
# --device cuda trains on the GPUs (rank r on GPU r modulo their number, so the processes
# may share one GPU); where torch sees none it says "no GPU" and runs the CPU table.
# --no-frame-mac runs the hook without frame MACs (SYNCOPATE_FRAME_MAC=0), as Gloo, which
# authenticates nothing, runs.
#
# The processes get torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
# from this script: Debian's torch 1.13 torchrun fails on Python 3.11. Needs the package
# installed (scripts/test.sh builds it into target/py-venv, which this script uses when
# it exists).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=3 lenet_steps=200 resnet_steps=30 transformer_steps=4 data_flag=()
device=cpu models=lenet,resnet20 dtypes=fp32 processes=2,4
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --lenet-steps) lenet_steps=$2; shift 2 ;;
    --resnet-steps) resnet_steps=$2; shift 2 ;;
    --transformer-steps) transformer_steps=$2; shift 2 ;;
    --synthetic) data_flag=(--synthetic); shift ;;
    --device) device=$2; shift 2 ;;
    --transformer) models=$models,transformer; shift ;;
    --models) models=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --processes) processes=$2; shift 2 ;;
    --no-frame-mac) export SYNCOPATE_FRAME_MAC=0; shift ;;
    *) echo "bench-ddp: unknown argument $1" >&2; exit 2 ;;
  esac
done
python=python3
[ -x target/py-venv/bin/python ] && python=target/py-venv/bin/python
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
if [ "$device" = cuda ] && ! "$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "bench-ddp: no GPU (torch sees no CUDA device): running the CPU table" >&2
  device=cpu
fi

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run SCRIPT PROCESSES BACKEND STEPS DTYPE [ARGS...]: one job; prints rank 0's RESULT line.
run() {
  local script=$1 n=$2 backend=$3 steps=$4 dtype=$5 port pids=() rank
  shift 5
  port=$(free_port)
  for ((rank = 0; rank < n; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$python" "examples/torch/$script" --backend "$backend" --steps "$steps" \
      --device "$device" --dtype "$dtype" "$@" \
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

echo "device: $device, frame MACs $([ "${SYNCOPATE_FRAME_MAC:-1}" = 0 ] && echo off || echo on)"
echo
echo "| model | dtype | processes | Gloo samples/s | Syncopate samples/s | ratio | final loss Gloo / Syncopate | weights max diff |"
echo "|---|---|---|---|---|---|---|---|"
for model in ${models//,/ }; do
  steps=$lenet_steps extra=()
  [ "$model" = resnet20 ] && steps=$resnet_steps
  [ "$model" = transformer ] && steps=$transformer_steps && extra=(--batch 2)
  for dtype in ${dtypes//,/ }; do
  for n in ${processes//,/ }; do
    : >"$out/gloo.rates"; : >"$out/syncopate.rates"
    for ((r = 0; r < reps; r++)); do
      for backend in gloo syncopate; do
        line=$(run "${model}_ddp.py" "$n" "$backend" "$steps" "$dtype" "${extra[@]}")
        sed -E 's/.*samples_per_s=([0-9.]+).*/\1/' <<<"$line" >>"$out/$backend.rates"
        sed -E 's/.*final_loss=([0-9.]+).*/\1/' <<<"$line" >"$out/$backend.loss"
      done
    done
    gloo=$(median <"$out/gloo.rates")
    sync=$(median <"$out/syncopate.rates")
    diff=$("$python" -c 'import sys, numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
d = float(np.max(np.abs(a - b)))
tol = 2e-2 if sys.argv[3] == "bf16" else 1e-3
ok = np.allclose(a, b, rtol=tol, atol=tol)
print(f"{d:.1e}" + ("" if ok else " (NOT within tolerance)"))' \
      "$out/${model}_ddp.py-$n-gloo.npy" "$out/${model}_ddp.py-$n-syncopate.npy" "$dtype")
    ratio=$(awk -v a="$sync" -v b="$gloo" 'BEGIN {printf "%.2f", a / b}')
    echo "| $model | $dtype | $n | $gloo | $sync | ${ratio}x | $(cat "$out/gloo.loss") / $(cat "$out/syncopate.loss") | $diff |"
  done
  done
done
