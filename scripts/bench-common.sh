# Shared by the benchmark scripts that run `syncopate bench-comm` in rounds
# (compare-allreduce.sh, bench-frame-mac.sh); source it after setting the defaults of
# ranks, sizes, rounds, min_time, bench_args and out, and root (the repository).

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
