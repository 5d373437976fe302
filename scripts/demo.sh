#!/usr/bin/env bash
# The main job: sets up (scripts/setup.sh, which installs Debian's Fashion-MNIST where it
# can), builds, then runs the demo study (FIFO parameter server vs P3 vs ring all-reduce vs
# step-wise averaging vs DLCP, LeNet on Fashion-MNIST with 4 workers behind an emulated 100 Mbit/s
# link), printing a comparison table (accuracy, time to 78 %) and the path of its HTML report.
# Without Fashion-MNIST anywhere (see `syncopate train --help`, --data), it says so and runs
# the same study on the synthetic set (runs/demo-synthetic/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet --bin syncopate
bin=target/debug/syncopate
if "$bin" train --model mlp --dataset fashion-mnist --steps 1 --batch-size 1 --quiet >/dev/null 2>&1; then
  exec "$bin" study studies/demo.toml "$@"
fi
echo "demo: Fashion-MNIST was not found (apt install dataset-fashion-mnist, or put its IDX files" \
  "in data/fashion-mnist/); running the demo on the synthetic set instead, where every" \
  "strategy reaches 100 % and accuracy tells nothing" >&2
study=$(mktemp --suffix=.toml)
trap 'rm -f "$study"' EXIT
sed -e 's/^name = "demo"/name = "demo-synthetic"/' -e 's/"fashion-mnist"/"synthetic"/' \
  studies/demo.toml > "$study"
"$bin" study "$study" "$@"
