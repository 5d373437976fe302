#!/usr/bin/env bash
# Builds bench/reference/mpi_allreduce.c with mpicc into target/reference/mpi_allreduce and
# runs it on N local ranks (default 2), Open MPI forced onto TCP over loopback only.
#
# Usage: bench/reference/run_mpi_allreduce.sh [N] [mpi_allreduce args: --min-time S,
#        --min-iters N, sizes such as 4K 64K 1M 16M 100M]
# Prints CSV on stdout: size_bytes,ranks,median_s,busbw_GBps (header line first).
# Needs openmpi-bin and libopenmpi-dev: scripts/install-reference.sh installs them.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
src="$root/bench/reference/mpi_allreduce.c"
out="$root/target/reference"
bin="$out/mpi_allreduce"

ranks=2
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  ranks=$1
  shift
fi
if [ "$ranks" -lt 1 ]; then
  echo "run_mpi_allreduce: N must be at least 1" >&2
  exit 2
fi

for tool in mpicc mpirun; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "run_mpi_allreduce: $tool not found; run scripts/install-reference.sh" \
      "(installs openmpi-bin and libopenmpi-dev)" >&2
    exit 2
  fi
done

mkdir -p "$out"
if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ]; then
  mpicc -O2 -std=c11 -Wall -Wextra -o "$bin.tmp" "$src"
  mv -f "$bin.tmp" "$bin"
fi

# Everything stays on this machine: the byte transfer layer may only use TCP ('self' is a
# rank talking to itself) on the loopback interface, the ob1 PML is forced so that no
# UCX/OFI transport is picked, and the runtime's out-of-band channel is also kept on lo.
# --bind-to none: ranks may outnumber cores (--oversubscribe).
cd "$out"
exec mpirun --allow-run-as-root --oversubscribe -np "$ranks" --bind-to none \
  --mca pml ob1 \
  --mca btl tcp,self \
  --mca btl_tcp_if_include lo \
  --mca oob_tcp_if_include lo \
  ./mpi_allreduce "$@"
