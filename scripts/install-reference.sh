#!/usr/bin/env bash
# Installs the tools behind the reference baselines in bench/reference/ on Debian 12:
#   python3-torch   Debian's PyTorch 1.13 (CPU only), used by /usr/bin/python3
#   libopenblas0-openmp  an optimised BLAS for it: without it libtorch falls back to the
#                   reference libblas3 and matrix products run several times slower; the
#                   OpenMP flavour shares torch's OpenMP thread pool (torch.set_num_threads)
#   openmpi-bin     mpirun, mpicc
#   libopenmpi-dev  MPI headers and libraries for bench/reference/mpi_allreduce.c
#   hyperfine       command-line benchmarking
#   iperf3          one TCP stream over loopback: the bandwidth compare-allreduce.sh sets
#                   our all-reduce against
# Idempotent: checks each package with dpkg and, only when something is missing,
# runs 'apt-get update' once and installs what is missing. Needs root (or sudo) for that.
set -euo pipefail

pkgs=(python3-torch libopenblas0-openmp openmpi-bin libopenmpi-dev hyperfine iperf3)
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-reference: all present: ${pkgs[*]}"
else
  echo "install-reference: installing: ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then
    SUDO=()
  elif command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install-reference: need root to install: ${missing[*]}" >&2
    echo "install-reference: run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Check that the pieces actually work (Debian's torch is only visible to Debian's python).
if ! /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
  echo "install-reference: /usr/bin/python3 cannot import torch and numpy" >&2
  exit 1
fi
blas=$(readlink -f /usr/lib/*-linux-gnu/libblas.so.3 2>/dev/null | head -n1 || true)
case "$blas" in
  *openblas*) ;;
  *) echo "install-reference: warning: libblas.so.3 is '$blas', not OpenBLAS, so torch will be" \
       "slow; pick OpenBLAS with: update-alternatives --config libblas.so.3-$(uname -m)-linux-gnu" >&2 ;;
esac
for tool in mpicc mpirun hyperfine; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-reference: $tool not on PATH" >&2; exit 1; }
done
echo "install-reference: ok: torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'),"\
  "$(mpirun --version 2>/dev/null | head -n1), $(hyperfine --version)"
