#!/usr/bin/env bash
# Installs what Syncopate needs on a fresh Debian machine with the Rust toolchain.
# Idempotent: installs only what is missing. Today the build needs nothing beyond cargo
# (burn's flex backend is pure Rust); gcc is used by a few -sys crates.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    echo "setup: please install: ${need[*]}" >&2
    exit 1
  fi
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo (Rust 1.95+) is required" >&2; exit 1; }
