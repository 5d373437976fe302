#!/usr/bin/env bash
# The main job on the embedded default: sets up, builds, and trains LeNet on the seeded
# synthetic dataset (no files needed), printing progress, test accuracy and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet --workspace --all-targets
mkdir -p runs/demo
target/debug/syncopate train --model lenet --dataset synthetic --epochs 2 \
  --summary-json runs/demo/summary.json --save runs/demo/weights.safetensors "$@"
echo "summary: runs/demo/summary.json"
