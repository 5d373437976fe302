# Sampling the kernel's TCP sockets in network namespaces, for scripts/netns-cluster.sh
# --sample-sockets and scripts/calibrate-net.sh --trace (sourced; needs `ss`). The caller
# keeps `samplers=()` and kills what is left in it on exit.

# start_socket_samplers DIR MS NAMESPACE...: in each namespace (the i-th given is host i) a
# loop in the background writes `ss -tin` of its established connections to
# DIR/sockets/h<i>.txt about every MS ms, each sample after a line "T <unix time>".
start_socket_samplers() {
  local dir=$1 ms=$2 i=0 ns period
  shift 2
  rm -rf "$dir/sockets" "$dir/sockets.json"
  mkdir -p "$dir/sockets"
  period=$(awk -v ms="$ms" 'BEGIN { printf "%.3f", ms / 1000 }')
  for ns in "$@"; do
    ip netns exec "$ns" bash -c 'while :; do echo "T $(date +%s.%N)"; ss -tin state established; sleep "$1"; done' \
      sampler "$period" > "$dir/sockets/h$i.txt" 2>/dev/null &
    samplers+=($!)
    i=$((i + 1))
  done
}

# stop_socket_samplers DIR HOSTS MS: stops the samplers and sums up what they wrote in
# DIR/sockets.json (scripts/netns_sockets.py).
stop_socket_samplers() {
  local pid
  for pid in "${samplers[@]}"; do
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  samplers=()
  python3 "$root/scripts/netns_sockets.py" "$1" "$2" "$3"
}
