# Shared by the benchmark scripts that run `syncopate` in rounds
# (compare-allreduce.sh, bench-frame-mac.sh, bench-frame-mac-jobs.sh); source it after
# setting root (the repository).

# Sets the defaults of the all-reduce sweeps' options: ranks "2 4", sizes 4K to 100M,
# min_time 1; $2 rounds, $3 bench_args, and out target/$1 ($1: the script's name).
bench_defaults() {
  ranks="2 4"
  sizes="4K 64K 1M 16M 100M"
  rounds=$2
  min_time=1
  bench_args=$3
  out="$root/target/$1"
}

# Parses the options every such script takes (--ranks, --sizes, --rounds, --min-time,
# --bench-args, --out, --help) into those variables. $1: the script's name for messages;
# $2: the last line of its help header; the rest: the script's arguments.
bench_parse_args() {
  local name=$1 help_end=$2
  shift 2
  while [ $# -gt 0 ]; do
    case "$1" in
      --ranks) ranks=$2; shift 2 ;;
      --sizes) sizes=$2; shift 2 ;;
      --rounds) rounds=$2; shift 2 ;;
      --min-time) min_time=$2; shift 2 ;;
      --bench-args) bench_args=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      -h|--help) sed -n "2,${help_end}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) echo "$name: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
  done
  [[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "$name: --rounds must be a positive integer" >&2; exit 2; }
}

# Sets syncopate: $SYNCOPATE_BIN (another build of ours, e.g. to compare before and after a
# change), else this checkout's, built first.
bench_binary() {
  if [ -n "${SYNCOPATE_BIN:-}" ]; then
    syncopate=$SYNCOPATE_BIN
  else
    cargo build --workspace --all-targets --quiet
    syncopate="$root/target/debug/syncopate"
  fi
}

# As bench_binary, for scripts whose figures need an optimised build (the simulator, profile
# replays): $SYNCOPATE_BIN, else this checkout's release build, built first.
bench_release_binary() {
  if [ -n "${SYNCOPATE_BIN:-}" ]; then
    syncopate=$SYNCOPATE_BIN
  else
    cargo build --release -p syncopate --quiet
    syncopate="$root/target/release/syncopate"
  fi
}

# Runs `$1 ITEM MAC ROUND` for each of $rounds rounds and each ITEM of $2, MAC being off
# then on in odd rounds and on then off in even ones (frame MACs measured in pairs, back to
# back, so that a noisy neighbour hits both alike).
bench_alternate_macs() {
  local run=$1 items=$2 round item mac order
  for round in $(seq 1 "$rounds"); do
    for item in $items; do
      if [ $((round % 2)) = 1 ]; then order="off on"; else order="on off"; fi
      for mac in $order; do "$run" "$item" "$mac" "$round"; done
    done
  done
}
