#!/usr/bin/env bash
# The main job on the embedded default: sets up, builds, then runs the demo study (FIFO
# parameter server vs P3 vs ring all-reduce, LeNet on the seeded synthetic dataset behind an
# emulated 50 Mbit/s link), printing a comparison table and the path of its HTML report.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --quiet --workspace --all-targets
target/debug/syncopate study studies/demo.toml "$@"
