#!/usr/bin/env bash
# Ring all-reduce bus bandwidth, side by side in one run: Syncopate (`syncopate bench-comm`),
# Open MPI's MPI_Allreduce over TCP (bench/reference/run_mpi_allreduce.sh) and Gloo's
# all_reduce through torch.distributed (bench/reference/torch_gloo_allreduce.py), all on
# loopback, interleaved (for each round, for each rank count: ours, MPI, Gloo) so that a
# noisy neighbour hits all three alike.
#
# Usage: scripts/compare-allreduce.sh [--ranks "2 4"] [--sizes "4K 64K 1M 16M 100M"]
#                                      [--rounds 3] [--min-time 1] [--bench-args "ARGS"]
#                                      [--out DIR]
#   --ranks     process counts to compare (default "2 4")
#   --sizes     message sizes in bytes, K/M/G = KiB/MiB/GiB (default 4K 64K 1M 16M 100M)
#   --rounds    repetitions of the whole matrix; the table shows each figure's median
#   --min-time  seconds of timed operations per size and implementation (default 1)
#   --bench-args  more flags for our runs (bench-comm); default "--no-frame-mac", since the
#               references authenticate nothing (give "" to measure ours with frame MACs)
#   --out       where the raw CSVs and the table go (default target/compare-allreduce)
# SYNCOPATE_BIN=PATH runs that syncopate binary instead of building this checkout's.
# Every implementation runs twice: back to back (rank 0 times its calls one after the other,
# bench-comm's default) and barrier-timed (each call after a barrier, the slowest rank's time,
# the references' own method; bench-comm --barrier), so the table compares like with like.
# Prints a Markdown table (bus bandwidth 2(n-1)/n x bytes / median time, GB/s, and our ratio
# to each reference and method) and writes it to OUT/table.md, with every measurement in
# OUT/raw.csv.
# Needs the references: scripts/install-reference.sh (Open MPI, PyTorch); a reference that
# is not installed is left out of the table with a warning.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# shellcheck source=scripts/bench-common.sh
source "$root/scripts/bench-common.sh"
bench_defaults compare-allreduce 3 "--no-frame-mac"
bench_parse_args compare-allreduce 26 "$@"
bench_binary
have_mpi=1
have_gloo=1
command -v mpirun >/dev/null 2>&1 || { have_mpi=0; echo "compare-allreduce: no mpirun; Open MPI left out (scripts/install-reference.sh)" >&2; }
/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1 || { have_gloo=0; echo "compare-allreduce: no torch for /usr/bin/python3; Gloo left out (scripts/install-reference.sh)" >&2; }
have_iperf=1
command -v iperf3 >/dev/null 2>&1 || { have_iperf=0; echo "compare-allreduce: no iperf3; the loopback stream is left out (scripts/install-reference.sh)" >&2; }

# One iperf3 TCP stream over loopback for 3 s: prints its bandwidth in GB/s. With
# `--bidir`, a stream each way at once (as a 2-rank ring sends and receives at once, the
# two directions' copies sharing the cores): prints the mean of the two directions.
loopback_stream() {
  local port server gbytes bidir=${1:-}
  port=$((20000 + RANDOM % 20000))
  iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
  server=$!
  # The server may not be listening yet: the client retries until it connects.
  for _ in $(seq 1 50); do
    # shellcheck disable=SC2086
    if gbytes=$(iperf3 -c 127.0.0.1 -p "$port" -t 3 $bidir -J 2>/dev/null |
      /usr/bin/python3 "$root/scripts/bench_table.py" iperf 2>/dev/null); then
      break
    fi
    sleep 0.1
  done
  wait "$server" 2>/dev/null || true
  [ -n "${gbytes:-}" ] && echo "$gbytes"
}

mkdir -p "$out"
raw="$out/raw.csv"
echo "impl,round,size_bytes,ranks,median_s,busbw_GBps" > "$raw"
ours_sizes=$(echo "$sizes" | tr ' ' ',')

# Appends a reference's CSV (size_bytes,ranks,median_s,busbw_GBps) under the name $1.
collect() {
  local impl=$1 round=$2
  grep -E '^[0-9]' | cut -d, -f1-4 | sed "s/^/$impl,$round,/" >> "$raw"
}

for round in $(seq 1 "$rounds"); do
  if [ $have_iperf = 1 ]; then
    echo "round $round/$rounds: one iperf3 stream over loopback" >&2
    gbps=$(loopback_stream || true)
    [ -n "$gbps" ] && echo "iperf3,$round,0,1,0,$gbps" >> "$raw"
    echo "round $round/$rounds: an iperf3 stream each way over loopback" >&2
    gbps=$(loopback_stream --bidir || true)
    [ -n "$gbps" ] && echo "iperf3-bidir,$round,0,1,0,$gbps" >> "$raw"
  fi
  for n in $ranks; do
    # Every implementation twice: back to back at rank 0 (bench-comm's default), and each
    # call after a barrier at the slowest rank (the references' own method).
    for mode in b2b barrier; do
      ours_flag=""
      [ $mode = barrier ] && ours_flag="--barrier"
      echo "round $round/$rounds, $n ranks: syncopate ($mode)" >&2
      # shellcheck disable=SC2086
      "$syncopate" bench-comm --strategy allreduce --workers "$n" --sizes "$ours_sizes" \
        --min-time "$min_time" $ours_flag $bench_args 2>/dev/null | sed 's/^\[worker 0\] //' | collect "syncopate-$mode" "$round"
      flag=""
      [ $mode = b2b ] && flag="--back-to-back"
      if [ $have_mpi = 1 ]; then
        echo "round $round/$rounds, $n ranks: Open MPI ($mode)" >&2
        # shellcheck disable=SC2086
        bench/reference/run_mpi_allreduce.sh "$n" --min-time "$min_time" $flag $sizes 2>/dev/null | collect "mpi-$mode" "$round"
      fi
      if [ $have_gloo = 1 ]; then
        echo "round $round/$rounds, $n ranks: Gloo ($mode)" >&2
        # shellcheck disable=SC2086
        /usr/bin/python3 bench/reference/torch_gloo_allreduce.py --ranks "$n" --min-time "$min_time" $flag $sizes 2>/dev/null | collect "gloo-$mode" "$round"
      fi
    done
  done
done

/usr/bin/python3 "$root/scripts/bench_table.py" allreduce "$raw" "$out/table.md"
echo "raw measurements: $raw; table: $out/table.md" >&2
