#!/usr/bin/env bash
# The test suite: unit, property and integration tests of every crate.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --all-targets "$@"
