#!/usr/bin/env bash
# The test suite: unit, property and integration tests of every crate, then the Python
# package's (scripts/test-python.sh: the wheel built into target/py-venv, then pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace --all-targets "$@"
scripts/test-python.sh
