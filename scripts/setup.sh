#!/usr/bin/env bash
# Installs what Syncopate needs on a fresh Debian machine with the Rust toolchain.
# Idempotent: installs only what is missing. The build needs nothing beyond cargo (burn's
# flex backend is pure Rust; gcc is used by a few -sys crates). The demo trains on
# Fashion-MNIST: Debian's dataset-fashion-mnist (into /usr/share/datasets/fashion-mnist) where
# apt can install it (as root or with sudo), else ../shared/data or data/ hold it, else the
# demo says so and falls back to the synthetic set. The Python package's tests want Debian's
# python3-torch, python3-venv and python3-pytest (maturin comes from PyPI, into target/).
# The kernel-loss tests (crates/cli/tests/netns.rs) want nftables and iproute2 (nft, ip,
# tc): installed here too where apt can (as root or with sudo); where it cannot, setup
# says so and those tests report SKIPPED.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
want=()
[ -d /usr/share/datasets/fashion-mnist ] || want+=(dataset-fashion-mnist)
# The Python package's tests (scripts/test-python.sh): torch from Debian, a venv to build into.
python_want=()
/usr/bin/python3 -c 'import torch' 2>/dev/null || python_want+=(python3-torch)
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || python_want+=(python3-venv)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || python_want+=(python3-pytest)
# The kernel-loss tests: nftables' random drops, namespaces and qdiscs.
kernel_want=()
command -v nft >/dev/null 2>&1 || kernel_want+=(nftables)
command -v tc >/dev/null 2>&1 || kernel_want+=(iproute2)
command -v ping >/dev/null 2>&1 || kernel_want+=(iputils-ping)

apt_install() {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
  else
    return 1
  fi
}

if [ ${#need[@]} -gt 0 ] && ! apt_install "${need[@]}"; then
  echo "setup: please install: ${need[*]}" >&2
  exit 1
fi
if [ ${#want[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt_install "${want[@]}" >/dev/null 2>&1 ||
    echo "setup: could not install ${want[*]} (the demo looks for Fashion-MNIST elsewhere)" >&2
fi
if [ ${#python_want[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt_install "${python_want[@]}" >/dev/null 2>&1 ||
    echo "setup: could not install ${python_want[*]} (the Python package's tests need them)" >&2
fi
if [ ${#kernel_want[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1 || ! apt_install "${kernel_want[@]}" >/dev/null 2>&1; then
    echo "setup: could not install ${kernel_want[*]} (needs apt as root or with sudo):" \
      "the kernel-loss tests will be SKIPPED" >&2
  fi
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust 1.95+) is required" >&2; exit 1; }
