#!/usr/bin/env bash
# The calibration ladder of the network model, transfers first: the same transfers (bulk, or
# messages as a job's slices) on the kernel's TCP between network namespaces and in the model
# (`syncopate transfer`), for each congestion control, side by side.
#
# Usage: scripts/calibrate-net.sh [--cc cubic,bbr] [--rungs all] [--repeats 3] [--out DIR]
#                                 [--train [--cells a,b,c,d,lossless] [--steps 60] [--fair]]
#   --cc       congestion controls to run, comma-separated (cubic, bbr, reno; default
#              cubic,bbr), set in every namespace as scripts/netns-cluster.sh --cc does
#   --rungs    comma-separated subset of: one (one flow, deep buffer), incast (4 senders into
#              a 32-packet queue), loss1, loss5 and loss10 (one flow, 1 %, 5 % and 10 % random
#              loss), paths (one flow with a second, degraded 20 Mbit/s path beside it);
#              msgs, msgs1, msgs5 and msgs10 (messages: one flow sends 50 of 160 KB, P3's
#              slice, one every 100 ms, lossless and at 1 %, 5 % and 10 % loss; each ends in
#              a tail a loss may strike, as a job's slices do, where a bulk transfer's losses
#              have data behind them; compared by the mean latency of a run's messages, from
#              when each was due to its last byte's arrival); default all but loss10 (a 10 %
#              loss transfer takes the kernel a minute) and the msgs rungs
#   --repeats  kernel runs per cell, 1 to 99 (default 3); the model runs the same number of
#              seeds. Each rung prints both medians, their ratio and its 90 % bootstrap
#              interval, and whether that interval lies within 5 % (`within`), wholly outside
#              it (`outside`) or neither (`undecided`: too few runs for how much they spread;
#              with 5 % or 10 % loss one timeout more or less moves a run by 10-40 %). Each
#              training cell runs as often too (kernel, emulator and simulator in turn): the
#              medians of its runs, their ranges, and the ratios of the medians
#   --out      where cells.jsonl (every run) goes (default target/calibrate-net)
#   --train    then the training rung: the cells of studies/dlcp-kernel.toml with P3 (4 workers,
#              1 server, LeNet on synthetic data, batch 64, --steps steps), each on the
#              kernel (scripts/netns-cluster.sh --cc) and in our emulator (`syncopate launch
#              --tcp CC --mtu 1500 --worker-bandwidth 10gbit` with the cell's queue, loss or
#              paths: as on the testbed, only the server's port is shaped) and in the
#              simulator (`syncopate simulate` with the emulator's flags, replaying LeNet's
#              compute profile studies/profiles/lenet.graph.txt); mean step after 5 warm-up
#              steps, side by side, with emulator / kernel and simulator / emulator, and the
#              simulator's again with each layer's compute scaled to what the emulated job's
#              worker 0 computed (its processes share this machine's cores; the profile is one
#              process's on an idle host), which leaves the network model to compare: (a) deep
#              buffer, (b) a 32-packet queue under the incast, (c) 1 % random loss, (d) a
#              second path at 20 Mbit/s; and lossless links without a shared bottleneck:
#              `allreduce-RATE` (a ring of 3 workers) and `ps-RATE` (2 workers, 1 server),
#              every host's egress at RATE (htb on the kernel, `--bandwidth RATE` in the
#              model); `lossless` names the six at 20mbit, 100mbit and 1gbit. Default:
#              a,b,c,d,lossless
#   --fair     the training rung's kernel bottleneck with a pfifo per sending host served in
#              turn (netns-cluster.sh --fair), the discipline of the model's ingress port
#              (cells a-d only: the lossless cells have no shared bottleneck and are left out)
#   --trace    capture sender 1's packets in every kernel transfer (OUT/trace/CC-RUNG-RUN.pcap,
#              headers only, with tcpdump) and print where its time went: its idle spells by
#              what ended them (timeout, loss probe, ACK), each timeout's cause and its wait
#              against the RTO rebuilt as Linux keeps it (at it, backed off, inflated), and on
#              the msgs rungs what held up each message (scripts/tcp_waits.py --message;
#              every model run's line gives the model's, its
#              `timeout_causes`, traced or not); and sample the receiver's and sender 1's sockets
#              (`ss -tin`) every 20 ms into OUT/trace/CC-RUNG-RUN/sockets/h<i>.txt, summed up
#              in its sockets.json (cwnd, srtt and RTO as p50 / p90 / max;
#              scripts/netns_sockets.py)
# The bottleneck is htb at 100 Mbit/s on the switch's port toward the receiver, pfifo of
# 1000 packets (32 for the incast), GSO off (so queues hold packets); random loss is
# nftables' `numgen random` on that port in both directions (the data before the queue, as
# the model loses before its ingress queue, and the ACKs coming back, as the model loses a
# frame's last ACK with the path's loss, and as the training testbed's ps cells drop). The model gets the same rate, queue (packets x 1514 bytes), MTU 1500 and
# the round trip measured by ping. Prints a Markdown table: kernel and model completion
# times and their ratio. Root only (it creates namespaces); it says so and exits 0
# elsewhere. SYNCOPATE_BIN=PATH uses that binary instead of building one.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

ccs=cubic,bbr
rungs=one,incast,loss1,loss5,paths
repeats=3
train=0
trace=0
fair=()
cells=a,b,c,d,lossless
steps=60
out="$root/target/calibrate-net"
while [ $# -gt 0 ]; do
  case "$1" in
    --cc) ccs=$2; shift 2 ;;
    --rungs) rungs=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --train) train=1; shift ;;
    --fair) fair=(--fair); shift ;;
    --trace) trace=1; shift ;;
    --cells) cells=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "calibrate-net: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "calibrate-net: $*" >&2; exit 2; }
[[ "$repeats" =~ ^[1-9][0-9]?$ ]] || fail "--repeats must be 1 to 99"
if [ "$(id -u)" != 0 ]; then
  echo "calibrate-net: SKIPPED: needs root (it creates network namespaces); nothing was measured"
  exit 0
fi
if ! command -v ping >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iputils-ping >&2 ||
    fail "the model's round trip is measured with ping, which apt-get could not install"
fi
for tool in ip tc python3 ping; do
  command -v "$tool" >/dev/null 2>&1 || fail "needs \`$tool\` on PATH"
done
if ! command -v nft >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >&2 ||
    fail "the loss rungs need nftables (nft), which apt-get could not install"
fi
if [ "$trace" = 1 ] && ! command -v tcpdump >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tcpdump >&2 ||
    fail "--trace needs tcpdump, which apt-get could not install"
fi
if [ -z "${SYNCOPATE_BIN:-}" ]; then
  cargo build --release -p syncopate >&2
  SYNCOPATE_BIN="$root/target/release/syncopate"
fi
mkdir -p "$out"
rm -f "$out/cells.jsonl"

tag="cal$$"
sw="$tag-sw"
made=()
samplers=()
source "$root/scripts/socket-samples.sh"
cleanup() {
  for pid in "${samplers[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

senders=4
ip netns add "$sw"; made+=("$sw")
for p in 0 1; do
  ip -n "$sw" link add "br$p" type bridge
  ip -n "$sw" link set "br$p" up
done
for ((i = 0; i <= senders; i++)); do
  ns="$tag-h$i"
  ip netns add "$ns"; made+=("$ns")
  ip -n "$ns" link set lo up
  for p in 0 1; do
    ip link add "eth$p" netns "$ns" type veth peer name "h${i}p$p" netns "$sw"
    ip -n "$ns" link set dev "eth$p" gso_max_segs 1
    ip -n "$sw" link set dev "h${i}p$p" gso_max_segs 1
    ip -n "$sw" link set "h${i}p$p" master "br$p" up
    ip -n "$ns" addr add "10.79.$p.$((i + 1))/24" dev "eth$p"
    ip -n "$ns" link set "eth$p" up
  done
done

# The bottleneck toward the receiver (host 0) on path $1: htb at $2, pfifo of $3 packets.
bottleneck() {
  local dev="h0p$1"
  ip netns exec "$sw" tc qdisc del dev "$dev" root 2>/dev/null || true
  ip netns exec "$sw" tc qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000
  ip netns exec "$sw" tc class add dev "$dev" parent 1: classid 1:10 htb rate "$2" ceil "$2"
  ip netns exec "$sw" tc qdisc add dev "$dev" parent 1:10 handle 10: pfifo limit "$3"
}

# Random loss of $1 parts per million at the receiver's port on path 0, toward it and from it
# (0: none).
random_loss() {
  ip netns exec "$sw" nft delete table bridge calibrate 2>/dev/null || true
  [ "$1" = 0 ] && return 0
  ip netns exec "$sw" nft -f - <<NFT
table bridge calibrate {
  chain forward {
    type filter hook forward priority 0; policy accept;
    oifname "h0p0" ether type ip numgen random mod 1000000 < $1 drop
    iifname "h0p0" ether type ip numgen random mod 1000000 < $1 drop
  }
}
NFT
}

# The congestion control $1 in every namespace (allowed in the root namespace first).
set_cc() {
  local allowed
  allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
  case " $allowed " in *" $1 "*) ;; *) sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $1" ;; esac
  for ((i = 0; i <= senders; i++)); do
    ip netns exec "$tag-h$i" sysctl -qw net.ipv4.tcp_congestion_control="$1"
  done
}

# One kernel transfer: $1 flows of $2 bytes each; prints the completion in seconds. With
# --trace, sender 1's packets go to the capture $3. With $4 (bytes) and $5 (ms), messages of
# $4 bytes one every $5 ms: prints their mean latency in seconds.
kernel_transfer() {
  local flows=$1 bytes=$2 capture=${3:-} message=${4:-0} every=${5:-0}
  local port=$((20000 + RANDOM % 20000)) result="$out/recv.json" dump= metric=completion_s
  [ "$message" = 0 ] || metric=message_latency_s:mean
  if [ -n "$capture" ]; then
    ip netns exec "$tag-h1" tcpdump -i eth0 -s 128 -Z root -w "$capture" "tcp port $port" \
      2> "$capture.log" &
    dump=$!
    # Capturing once it says it listens (it says so before the first packet).
    for _ in $(seq 250); do grep -q listening "$capture.log" && break; sleep 0.02; done
    # The receiver's (host 0) and sender 1's sockets, every 20 ms.
    start_socket_samplers "${capture%.pcap}" 20 "$tag-h0" "$tag-h1"
  fi
  ip netns exec "$tag-h0" python3 scripts/tcp_transfer.py recv --port "$port" --flows "$flows" \
    --message "$message" > "$result" &
  local recv=$!
  local pids=()
  ip netns exec "$tag-h1" python3 scripts/tcp_transfer.py counters > "$out/before.json"
  for ((s = 1; s <= flows; s++)); do
    ip netns exec "$tag-h$s" python3 scripts/tcp_transfer.py send --host 10.79.0.1 \
      --port "$port" --bytes "$bytes" --message "$message" --every "$every" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  wait "$recv"
  if [ -n "$dump" ]; then
    kill -INT "$dump"; wait "$dump" 2>/dev/null || true
    local per_message=()
    [ "$message" = 0 ] || per_message=(--message "$message")
    python3 scripts/tcp_waits.py "$capture" 10.79.0.2 "${per_message[@]}" >&2
    stop_socket_samplers "${capture%.pcap}" 2 20 >&2
  fi
  ip netns exec "$tag-h1" python3 scripts/tcp_transfer.py counters > "$out/after.json"
  echo "calibrate-net: sender 1's TCP counters grew: $(python3 scripts/tcp_transfer.py delta \
    "$out/before.json" "$out/after.json")" >&2
  [ "$message" = 0 ] || echo "calibrate-net: the kernel's messages: $(latencies "$result")" >&2
  "$SYNCOPATE_BIN" summary --kind transfer "$result" "$metric"
}

# A transfer report's message latencies in words: median, 90th percentile and largest, ms.
latencies() {
  "$SYNCOPATE_BIN" summary --kind transfer "$1" message_latency_s:median message_latency_s:p90 \
    message_latency_s:max | awk '{ printf "latency median %.2f ms, p90 %.2f ms, max %.2f ms", $1 * 1e3, $2 * 1e3, $3 * 1e3 }'
}

# The median of the times given after the first argument, to that many decimals; their range
# in brackets; both: `0.835 (0.834-0.836)`.
median() {
  local d=$1
  shift
  printf '%s\n' "$@" | sort -g | awk -v d="$d" '{ v[NR] = $1 }
    END { printf "%." d "f", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}
range() {
  local d=$1
  shift
  printf '%s\n' "$@" | sort -g | awk -v d="$d" '{ v[NR] = $1 } END { printf " (%." d "f-%." d "f)", v[1], v[NR] }'
}
# Both, to the decimals in $decimals (3 unless set): `0.835 (0.834-0.836)`.
spread() {
  echo "$(median "${decimals:-3}" "$@")$(range "${decimals:-3}" "$@")"
}

# The base round trip between a sender and the receiver, ms (the smallest of 20 pings).
bottleneck 0 100mbit 1000
rtt_ms=$(ip netns exec "$tag-h1" ping -c 20 -i 0.01 -q 10.79.0.1 |
  awk -F'[/ =]+' '/min\/avg/ { print $6 }')
latency_us=$(awk -v rtt="$rtt_ms" 'BEGIN { us = int(rtt * 500 + 0.5); print (us > 1 ? us : 1) }')
echo "calibrate-net: base round trip ${rtt_ms} ms: the model's one-way latency ${latency_us}us" >&2

# What the model's losses and repairs print as: each counter of both ports of a transfer.
counters=()
for k in frames_lost frames_dropped loss_probes timeouts; do counters+=("egress.$k" "ingress.$k"); done
# The model's timeouts by cause (its reliable flows leave from the senders' ports).
for k in resend_last resend_stalled original_in_recovery acks_in_recovery; do
  counters+=("egress.timeout_causes.$k")
done
# Its loss episodes (the kernel's TcpExtTCPSackRecovery).
counters+=(egress.loss_episodes)
IFS=, read -ra cc_list <<< "$ccs"
IFS=, read -ra rung_list <<< "$rungs"
if [ "${#rung_list[@]}" -gt 0 ]; then
  echo "| TCP | rung | kernel s (completion; msgs: the mean latency), median of $repeats (range) | model s (range) | model / kernel (90 % interval) | within 5 %? |"
  echo "|---|---|---|---|---|---|"
fi
for cc in "${cc_list[@]}"; do
  set_cc "$cc"
  for rung in "${rung_list[@]}"; do
    flows=1 bytes=10000000 queue=1000 ppm=0 model=() message=0 every=0 metric=completion_s decimals=3
    case "$rung" in
      msgs*)
        message=160000 every=100 bytes=$((50 * 160000)) metric=message_latency_s:mean decimals=4
        model=(--frame "$message" --every "${every}ms")
        case "${rung#msgs}" in
          "") ;;
          1|5|10) ppm=$((${rung#msgs} * 10000)); model+=(--loss "${rung#msgs}%") ;;
          *) fail "unknown rung '$rung' (msgs, msgs1, msgs5, msgs10)" ;;
        esac ;;
      one) ;;
      incast) flows=4 bytes=2500000 queue=32 ;;
      loss1) ppm=10000; model=(--loss 1%) ;;
      loss5) ppm=50000; model=(--loss 5%) ;;
      loss10) ppm=100000; model=(--loss 10%) ;;
      paths) ;;
      *) fail "unknown rung '$rung' (one, incast, loss1, loss5, loss10, paths, msgs, msgs1, msgs5, msgs10)" ;;
    esac
    bottleneck 0 100mbit "$queue"
    # The model's hosts as the testbed's: a sender's own port at a veth's speed, the
    # receiver's port (ingress) the 100 Mbit/s bottleneck, random loss before it.
    printf 'bandwidth_bps = "100mbit"\nworker_bandwidth_bps = "10gbit"\ningress = true\n' \
      > "$out/$rung.toml"
    if [ "$rung" = paths ]; then
      bottleneck 1 20mbit 1000
      printf '[[path]]\n[[path]]\nbandwidth_bps = "20mbit"\n' >> "$out/$rung.toml"
      sed -i '1i paths = 2' "$out/$rung.toml"
    else
      ip netns exec "$sw" tc qdisc del dev h0p1 root 2>/dev/null || true
    fi
    random_loss "$ppm"
    kernel=() ours=()
    for ((r = 1; r <= repeats; r++)); do
      capture=
      if [ "$trace" = 1 ]; then mkdir -p "$out/trace"; capture="$out/trace/$cc-$rung-$r.pcap"; fi
      kernel+=("$(kernel_transfer "$flows" "$bytes" "$capture" "$message" "$every")")
      "$SYNCOPATE_BIN" transfer --json --flows "$flows" --bytes "$bytes" --seed "$r" \
        --network "$out/$rung.toml" --queue $((queue * 1514)) --mtu 1500 --tcp "$cc" \
        --latency "${latency_us}us" "${model[@]}" > "$out/model.json"
      ours+=("$("$SYNCOPATE_BIN" summary "$out/model.json" "$metric")")
      [ "$message" = 0 ] || echo "calibrate-net: the model's messages: $(latencies "$out/model.json")" >&2
      echo "calibrate-net: the model's $cc $rung run $r: $("$SYNCOPATE_BIN" summary \
        "$out/model.json" "${counters[@]}" | awk '{ printf "frames lost %d, dropped %d, loss episodes %d, loss probes %d, timeouts %d (a resend with nothing after it %d, a resend its window held %d, an original while recovering %d, lost ACKs while recovering %d)",
          $1 + $2, $3 + $4, $13, $5 + $6, $7 + $8, $9, $10, $11, $12 }')" >&2
    done
    read -r ratio lo hi verdict < <(python3 scripts/bench_table.py ratio \
      "$(IFS=,; echo "${kernel[*]}")" "$(IFS=,; echo "${ours[*]}")")
    echo "| $cc | $rung | $(spread "${kernel[@]}") | $(spread "${ours[@]}") | $ratio ($lo-$hi) | $verdict |"
    printf '{"tcp": "%s", "rung": "%s", "kernel_s": [%s], "model_s": [%s]}\n' "$cc" "$rung" \
      "$(IFS=,; echo "${kernel[*]}")" "$(IFS=,; echo "${ours[*]}")" >> "$out/cells.jsonl"
  done
done
echo "calibrate-net: every run in $out/cells.jsonl" >&2

[ "$train" = 1 ] || exit 0
cleanup
made=()
# The training rung: P3 on the kernel, in the emulator and in the simulator, cell by cell.
mean_step() {
  "$SYNCOPATE_BIN" summary --skip 5 --decimals 4 "$1" "$2"
}
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'
}
job=(--model lenet --dataset synthetic --batch-size 64 --steps "$steps" --seed 1)
# One run of the current training cell into directory $1; prints the mean steps of the
# kernel, the emulator, the simulator and the simulator at the emulated job's compute.
train_run() {
  local dir=$1 computed profile run k e s j
  mkdir -p "$dir"
  SYNCOPATE_BIN="$SYNCOPATE_BIN" scripts/netns-cluster.sh --hosts "$hosts" --strategy "$strategy" \
    --cc "$cc" "${kernel[@]}" "${fair[@]}" --out "$dir/kernel" -- "${job[@]}" > "$dir/kernel.log" 2>&1 ||
    fail "the kernel run of cell $cell failed: $dir/kernel.log"
  "$SYNCOPATE_BIN" launch --strategy "$strategy" "${net[@]}" "${emulated[@]}" "${job[@]}" \
    --quiet --no-replica-stats --summary-json "$dir/emulated.json" > "$dir/emulated.log" 2>&1 ||
    fail "the emulated run of cell $cell failed: $dir/emulated.log"
  computed=$("$SYNCOPATE_BIN" summary "$dir/emulated.json" worker0.times.compute worker0.steps) ||
    fail "the emulated run of cell $cell has no compute time: $dir/emulated.json"
  # shellcheck disable=SC2086 # two fields: seconds and steps
  job_profile $computed > "$dir/job-compute.graph.txt" ||
    fail "could not scale LeNet's profile to the emulated run of cell $cell"
  for run in simulated simulated-job-compute; do
    profile=studies/profiles/lenet.graph.txt
    [ "$run" = simulated ] || profile=$dir/job-compute.graph.txt
    "$SYNCOPATE_BIN" simulate --strategy "$strategy" "${net[@]}" "${emulated[@]}" \
      --model "profile:$profile" --batch-size 64 --steps "$steps" --seed 1 \
      --json "$dir/$run.json" > "$dir/$run.log" 2>&1 ||
      fail "the simulated run of cell $cell failed: $dir/$run.log"
  done
  k=$(mean_step "$dir/kernel/summary.json" worker0.step_seconds:mean)
  e=$(mean_step "$dir/emulated.json" worker0.step_seconds:mean)
  s=$(mean_step "$dir/simulated.json" step_seconds:mean)
  j=$(mean_step "$dir/simulated-job-compute.json" step_seconds:mean)
  echo "$k $e $s $j"
}
# LeNet's profile with every layer's compute scaled so that a step computes what the emulated
# job's worker 0 did ($1 seconds in $2 steps): its processes share this machine's cores, where
# the profile is one process's on an idle host.
job_profile() {
  python3 - "$1" "$2" studies/profiles/lenet.graph.txt <<'PY'
import re, sys
compute_s, steps, path = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
text = open(path).read()
pattern = re.compile(r"((?:forward|backward)_compute_time)=([0-9.]+)")
profile_ms = sum(float(m.group(2)) for m in pattern.finditer(text))
scale = compute_s * 1e3 / max(steps, 1) / profile_ms
sys.stdout.write("# LeNet's profile with its compute x%.3f: the emulated job's worker 0's (calibrate-net.sh)\n" % scale)
sys.stdout.write(pattern.sub(lambda m: "%s=%.6f" % (m.group(1), float(m.group(2)) * scale), text))
PY
}
lossless=allreduce-20mbit,ps-20mbit,allreduce-100mbit,ps-100mbit,allreduce-1gbit,ps-1gbit
printf 'paths = 2\n[[path]]\n[[path]]\nbandwidth_bps = "20mbit"\n' > "$out/two-paths.toml"
echo
echo "| TCP | cell | kernel step s, median of $repeats | emulator step s | simulator step s | emulator / kernel | simulator / emulator | at the job's compute |"
echo "|---|---|---|---|---|---|---|---|"
IFS=, read -ra cell_list <<< "${cells//lossless/$lossless}"
for cc in "${cc_list[@]}"; do
  for cell in "${cell_list[@]}"; do
    # The P3 cells: 4 workers and a server behind its 100 Mbit/s port; the lossless cells:
    # every host's own egress shaped (netns-cluster.sh's --rate), 3 hosts.
    strategy=p3 hosts=5
    net=(--workers 4 --servers 1 --bandwidth 100mbit --ingress --worker-bandwidth 10gbit)
    case "$cell" in
      a) kernel=(--bottleneck 100mbit); emulated=() ;;
      b) kernel=(--bottleneck 100mbit --queue-packets 32); emulated=(--queue $((32 * 1514))) ;;
      c) kernel=(--bottleneck 100mbit --loss 1%); emulated=(--loss 1%) ;;
      d) kernel=(--bottleneck 100mbit --paths 2 --degraded-rate 20mbit)
         emulated=(--network "$out/two-paths.toml") ;;
      allreduce-*|ps-*)
        strategy=${cell%%-*} rate=${cell#*-} hosts=3 emulated=()
        kernel=(--rate "$rate")
        net=(--workers 3 --servers 0 --bandwidth "$rate")
        [ "$strategy" = ps ] && net=(--workers 2 --servers 1 --bandwidth "$rate") ;;
      *) fail "unknown cell '$cell' (a, b, c, d, allreduce-RATE, ps-RATE, lossless)" ;;
    esac
    [ "${#fair[@]}" = 0 ] || [ "$hosts" = 5 ] || continue
    net+=(--mtu 1500 --tcp "$cc")
    ks=() es=() ss=() js=()
    for ((r = 1; r <= repeats; r++)); do
      dir="$out/train/$cc/$cell/run$r"
      train_run "$dir" > "$out/steps.txt"
      read -r k e s j < "$out/steps.txt"
      ks+=("$k") es+=("$e") ss+=("$s") js+=("$j")
    done
    k=$(median 4 "${ks[@]}") e=$(median 4 "${es[@]}") s=$(median 4 "${ss[@]}") j=$(median 4 "${js[@]}")
    kr="" er=""
    [ "$repeats" = 1 ] || kr=$(range 4 "${ks[@]}") er=$(range 4 "${es[@]}")
    echo "| $cc | $cell | $k$kr | $e$er | $s | $(ratio "$e" "$k") |" \
      "$(ratio "$s" "$e") | $(ratio "$j" "$e") |"
  done
done
