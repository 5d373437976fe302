#!/usr/bin/env bash
# Several hosts on one machine: N network namespaces, each with its own address on a Linux
# bridge (in a namespace of its own, so the machine's own network is left alone), the
# kernel's htb shaping each host's egress, and one job process per host started the
# torchrun way (RANK, WORLD_SIZE, MASTER_ADDR = host 0's address, MASTER_PORT).
#
# Usage: scripts/netns-cluster.sh [--hosts 3] [--strategy allreduce] [--rate 100mbit]
#                                 [--steps 40] [--emulate] [--out DIR] [-- FLAGS...]
#        scripts/netns-cluster.sh --fidelity [--hosts 3] [--steps 40] [--out DIR]
#   --hosts     hosts (= processes): all workers for ring strategies; for ps and p3 the last
#               host is the server (default 3)
#   --strategy  any `syncopate launch --strategy` value (default allreduce)
#   --rate      htb rate of each host's egress, tc's units (default 100mbit; "none": no htb)
#   --emulate   no kernel shaping; our emulator instead (`--bandwidth RATE` on every process)
#   --steps     training steps (LeNet, synthetic data, batch 32 per worker; default 40)
#   --out       where each process's log and worker 0's summary.json go
#               (default target/netns-cluster)
#   --fidelity  the check: all-reduce and ps at 20mbit, 100mbit and 1gbit, each once with
#               kernel shaping only and once with our emulator only, interleaved; prints a
#               Markdown table of the mean step times (after 5 warm-up steps) and their ratio
#   FLAGS       passed to every process (e.g. --model mlp)
# Root only (it creates namespaces). SYNCOPATE_BIN=PATH runs that binary instead of building
# this checkout's. Every namespace, link and process it made is removed on exit, also when
# interrupted. Addresses: 10.77.0.1, 10.77.0.2, ... inside the namespaces.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

hosts=3
strategy=allreduce
rate=100mbit
steps=40
emulate=0
fidelity=0
out="$root/target/netns-cluster"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --strategy) strategy=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --emulate) emulate=1; shift ;;
    --fidelity) fidelity=1; shift ;;
    --out) out=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "netns-cluster: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 64 ] ||
  { echo "netns-cluster: --hosts must be 2 to 64" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "netns-cluster: --steps must be a positive integer" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "netns-cluster: needs root (it creates network namespaces)" >&2; exit 2; }

if [ -z "${SYNCOPATE_BIN:-}" ]; then
  cargo build --release -p syncopate >&2
  SYNCOPATE_BIN="$root/target/release/syncopate"
fi
mkdir -p "$out"

# Names unique to this invocation, so that several clusters can exist at once.
tag="sy$$"
switch="$tag-sw"
made=()
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The bridge's namespace and one namespace per host, joined by veth pairs.
ip netns add "$switch"
made+=("$switch")
ip -n "$switch" link add br0 type bridge
ip -n "$switch" link set br0 up
for ((i = 0; i < hosts; i++)); do
  ns="$tag-h$i"
  ip netns add "$ns"
  made+=("$ns")
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$switch"
  ip -n "$switch" link set "p$i" master br0 up
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

# htb on every host's egress at RATE (or none).
shape() {
  local rate=$1
  for ((i = 0; i < hosts; i++)); do
    ip netns exec "$tag-h$i" tc qdisc del dev eth0 root 2>/dev/null || true
    [ "$rate" = none ] && continue
    ip netns exec "$tag-h$i" tc qdisc add dev eth0 root handle 1: htb default 10 r2q 1000
    ip netns exec "$tag-h$i" tc class add dev eth0 parent 1: classid 1:10 htb rate "$rate" ceil "$rate"
  done
}

# One job over the hosts: strategy, extra `syncopate` flags; worker 0's summary into $2.
run_job() {
  local strategy=$1 summary=$2
  shift 2
  local servers=0
  case "$strategy" in ps|p3|ps-no-overlap) servers=1 ;; esac
  local workers=$((hosts - servers))
  local token
  token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  local flags=(--strategy "$strategy" --workers "$workers" --servers "$servers"
    --model lenet --dataset synthetic --batch-size 32 --steps "$steps" --quiet
    --no-replica-stats "$@")
  pids=()
  for ((i = 0; i < hosts; i++)); do
    local role=worker
    [ "$i" -ge "$workers" ] && role=server
    local more=()
    [ "$i" = 0 ] && more=(--summary-json "$summary")
    ip netns exec "$tag-h$i" env RANK="$i" WORLD_SIZE="$hosts" MASTER_ADDR=10.77.0.1 \
      MASTER_PORT=29500 SYNCOPATE_TOKEN="$token" \
      "$SYNCOPATE_BIN" "$role" "${flags[@]}" "${more[@]}" > "$out/rank$i.log" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  if [ "$failed" != 0 ]; then
    echo "netns-cluster: the job failed; logs in $out/rank*.log:" >&2
    tail -n 3 "$out"/rank*.log >&2
    return 1
  fi
}

# Mean step time of a summary after 5 warm-up steps.
mean_step() {
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["worker0"]["step_seconds"][5:]; print(f"{sum(s)/len(s):.4f}")' "$1"
}

if [ "$fidelity" = 0 ]; then
  emulation=()
  if [ "$emulate" = 1 ]; then
    shape none
    [ "$rate" != none ] && emulation=(--bandwidth "$rate")
  else
    shape "$rate"
  fi
  run_job "$strategy" "$out/summary.json" "${emulation[@]}" "${extra[@]}"
  echo "netns-cluster: $strategy on $hosts hosts at $rate ($([ "$emulate" = 1 ] && echo emulated || echo htb)):" \
    "mean step $(mean_step "$out/summary.json") s; worker 0's summary: $out/summary.json;" \
    "namespaces $tag-*"
  exit 0
fi

[ "$steps" -gt 5 ] || { echo "netns-cluster: --fidelity needs --steps above 5" >&2; exit 2; }
echo "| strategy | rate | step s, kernel htb | step s, our emulator | emulator / htb |"
echo "|---|---|---|---|---|"
for r in 20mbit 100mbit 1gbit; do
  for s in allreduce ps; do
    shape "$r"
    run_job "$s" "$out/$s-$r-htb.json" "${extra[@]}"
    shape none
    run_job "$s" "$out/$s-$r-emulated.json" --bandwidth "$r" "${extra[@]}"
    kernel=$(mean_step "$out/$s-$r-htb.json")
    ours=$(mean_step "$out/$s-$r-emulated.json")
    ratio=$(python3 -c "print(f'{$ours / $kernel:.3f}')")
    echo "| $s | $r | $kernel | $ours | $ratio |"
  done
done
