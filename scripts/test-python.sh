#!/usr/bin/env bash
# The Python package's tests: builds the wheel (maturin, cargo's dev profile, which is
# optimised) into a virtual environment under target/ that sees Debian's python3-torch,
# installs it there and runs pytest on crates/python/tests. Without python3-torch it says
# so loudly and skips (scripts/setup.sh installs it where apt can).
set -euo pipefail
cd "$(dirname "$0")/.."
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if ! "$python" -c 'import torch, numpy' 2>/dev/null; then
  cat >&2 <<'MSG'
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!! SKIPPED: the Python package's tests (crates/python/tests): python3-torch is not
!!! installed. Install it (apt-get install python3-torch python3-venv) and rerun.
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
MSG
  exit 0
fi
venv=target/py-venv
[ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
[ -x "$venv/bin/maturin" ] || "$venv/bin/pip" install -q "maturin>=1.5,<2"
"$venv/bin/python" -m pytest --version >/dev/null 2>&1 || "$venv/bin/pip" install -q pytest
rm -rf target/wheels
"$venv/bin/maturin" build -q -m crates/python/Cargo.toml --out target/wheels -i "$venv/bin/python"
"$venv/bin/pip" install -q --force-reinstall --no-deps target/wheels/syncopate-*.whl
"$venv/bin/python" -m pytest -q crates/python/tests
