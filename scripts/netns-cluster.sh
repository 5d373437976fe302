#!/usr/bin/env bash
# Several hosts on one machine: N network namespaces, each with its own address on a Linux
# bridge (in a namespace of its own, so the machine's own network is left alone), the
# kernel's htb shaping each host's egress, and one job process per host started the
# torchrun way (RANK, WORLD_SIZE, MASTER_ADDR = host 0's address, MASTER_PORT).
#
# Usage: scripts/netns-cluster.sh [--hosts 3] [--strategy allreduce] [--rate 100mbit]
#                                 [--steps 40] [--cc cubic] [--emulate] [--out DIR]
#                                 [--rto-min MS] [--sample-sockets MS]
#                                 [--bottleneck RATE [--queue-packets N]
#                                  [--loss P] [--blackout MS] [--prio]
#                                  [--paths K [--degraded-rate RATE]]] [-- FLAGS...]
#   --hosts     hosts (= processes): all workers for ring strategies; for ps, p3 and dlcp the
#               last host is the server (default 3)
#   --strategy  any `syncopate launch --strategy` value (default allreduce)
#   --rate      htb rate of each host's egress, tc's units (default 100mbit; "none": no htb).
#               With --bottleneck it shapes only the ports that are not the bottleneck and
#               defaults to none
#   --emulate   no kernel shaping; our emulator instead (`--bandwidth RATE` on every process)
#   --steps     training steps (default 40; LeNet, synthetic data, batch 32 per worker unless
#               FLAGS name --model, --dataset or --batch-size; FLAGS with --steps or
#               --epochs choose instead)
#   --cc        the kernel's TCP congestion control in every host's namespace: cubic, bbr
#               or reno (default cubic; this machine's own default may be another). It is
#               named in every result (OUT/tcp.json, kernel.json, the closing line), with
#               each namespace's TCP counters over the job (timeouts, loss probes, SACK
#               recoveries, fast and lost retransmits, segments sent and retransmitted)
#   --rto-min MS  every host's routes get `rto_min MS ms` (TCP's minimum retransmission
#               timeout, 200 ms by default; a tuned-TCP baseline takes 5)
#   --sample-sockets MS  about every MS ms (10 to 1000) during the job, `ss -tin` in every
#               host's namespace: each TCP connection's congestion window, round trip and
#               unacknowledged segments over time (OUT/sockets/h<i>.txt, each sample after a
#               "T <unix time>" line), summed up per connection in OUT/sockets.json (cwnd,
#               srtt, RTO and Send-Q as p50 / p90 / max, the share of samples with the window
#               full, segments retransmitted; scripts/netns_sockets.py)
#   --out       where each process's log, worker 0's summary.json and (with --bottleneck)
#               kernel.json and the raw counters in kernel/ go (default target/netns-cluster)
#   FLAGS       passed to every process (e.g. --model mlp)
# A lossy network (all off by default; every one but --bottleneck needs --bottleneck):
#   --bottleneck RATE   htb at RATE on the bottleneck ports, both directions: the switch's
#               port toward the server (where the workers' pushes converge: incast) and the
#               server host's own egress; for ring strategies (no server) every host's port.
#               GSO is off on every link, so the queues hold and drop real packets
#   --queue-packets N   each of the bottleneck's leaf queues is `pfifo limit N` (a shallow
#               buffer: real tail drops under incast). Default: a deep buffer, pfifo limit 1000
#   --loss P    random loss at the bottleneck ports (e.g. 1% or 0.01), IPv4 packets of TCP and
#               UDP alike: nftables' `numgen random` drops with counters, in the switch, once
#               per packet (ps: toward and from the server; rings: on the way into each host).
#               Needs nftables (installed with apt-get where it is missing and apt is there).
#               With --loss or --blackout the job gets --peer-timeout 60 unless FLAGS name
#               one: TCP's backed-off retransmissions outlast the default 5 s
#   --blackout MS  once a second the switch drops every IPv4 packet (TCP and UDP alike) for
#               MS milliseconds (to the kernel's 4 ms tick: a set element with an nftables
#               timeout, which the kernel expires, added by a loop once a second; its drops
#               are counted as blackout_drop in kernel/*-nft.json)
#   --prio      the bottleneck's htb gets strict-priority leaf classes chosen by the IP DSCP
#               field (u32 filters): prio 0 DSCP 0 (TCP: control, reliable frames, ACKs),
#               prio 1-6 DSCP 46-41 (DLCP packet classes 0-5; prio 6 also DSCP 40 and 39,
#               classes 6 and 7), prio 7 DSCP 8 (drop-eligible); each its own pfifo
#   --fair      the bottleneck's htb gets one leaf class per sending host (u32 on the source
#               address's last byte), served in turn (htb's deficit round robin, quantum one
#               packet), each its own pfifo: per-host fair queueing, as the simulator's
#               ingress port serves its flows, instead of one FIFO shared by every flow
#   --paths K   K bridges (1 to 4): host i is 10.77.p.(i+1) on its eth<p> for path p; the TCP
#               links and MASTER_ADDR stay on path 0; every path's bottleneck port is shaped
#   --degraded-rate RATE   the last path's bottleneck at RATE instead (a degraded path)
# When FLAGS hold `--transport udp`, every process also gets `--udp-addrs` (its address on
# each path) and, with --paths above 1, `--paths K`. With --bottleneck the run writes
# OUT/kernel.json: per bottleneck device and direction the kernel's own counters over the job
# (packets and bytes sent, tail drops of the qdiscs, nftables' random drops, realised loss =
# drops / packets offered), from `tc -s` and nft counters taken before and after the job,
# and the totals (a ring's packet crosses two shaped ports and is offered once).
# Root only (it creates namespaces). SYNCOPATE_BIN=PATH runs that binary instead of building
# this checkout's. Every namespace, link and process it made is removed on exit, also when
# interrupted. Addresses: 10.77.P.1, 10.77.P.2, ... inside the namespaces (P: the path).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

hosts=3
strategy=allreduce
rate=100mbit
rate_given=0
steps=40
cc=cubic
emulate=0
bottleneck=""
queue_packets=1000
queue_given=0
loss=""
blackout=""
rto_min=""
prio=0
fair=0
paths=1
sample_ms=""
degraded_rate=""
out="$root/target/netns-cluster"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --strategy) strategy=$2; shift 2 ;;
    --rate) rate=$2; rate_given=1; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --cc) cc=$2; shift 2 ;;
    --emulate) emulate=1; shift ;;
    --out) out=$2; shift 2 ;;
    --bottleneck) bottleneck=$2; shift 2 ;;
    --queue-packets) queue_packets=$2; queue_given=1; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --blackout) blackout=$2; shift 2 ;;
    --rto-min) rto_min=$2; shift 2 ;;
    --sample-sockets) sample_ms=$2; shift 2 ;;
    --prio) prio=1; shift ;;
    --fair) fair=1; shift ;;
    --paths) paths=$2; shift 2 ;;
    --degraded-rate) degraded_rate=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "netns-cluster: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "netns-cluster: $*" >&2; exit 2; }
is_rate() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?([kKmMgGtT]i?)?(bit|bps)$ ]]; }
[[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 64 ] || fail "--hosts must be 2 to 64"
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || fail "--steps must be a positive integer"
case "$cc" in cubic|bbr|reno) ;; *) fail "--cc must be cubic, bbr or reno (got '$cc')" ;; esac
[ "$prio" = 1 ] && [ "$fair" = 1 ] && fail "--fair and --prio each choose the bottleneck's leaves: pick one"
[ "$rate" = none ] || is_rate "$rate" || fail "--rate must be a tc rate such as 100mbit, or none"
[[ "$paths" =~ ^[1-4]$ ]] || fail "--paths must be 1 to 4"
[[ "$queue_packets" =~ ^[1-9][0-9]{0,5}$ ]] || fail "--queue-packets must be 1 to 999999 packets"
if [ -z "$bottleneck" ]; then
  for given in "$queue_given:--queue-packets" "${loss:+1}:--loss" "$prio:--prio" \
    "${blackout:+1}:--blackout" \
    "${degraded_rate:+1}:--degraded-rate"; do
    if [ "${given%%:*}" = 1 ]; then
      fail "${given#*:} shapes the bottleneck: it needs --bottleneck RATE"
    fi
  done
else
  is_rate "$bottleneck" || fail "--bottleneck must be a tc rate such as 100mbit"
  [ "$emulate" = 0 ] || fail "--bottleneck is the kernel's shaping; --emulate is ours: pick one"
  [ "$rate_given" = 1 ] || rate=none
fi
if [ -n "$degraded_rate" ]; then
  is_rate "$degraded_rate" || fail "--degraded-rate must be a tc rate such as 20mbit"
  [ "$paths" -ge 2 ] || fail "--degraded-rate shapes the last of several paths: it needs --paths 2 or more"
fi
if [ -n "$blackout" ]; then
  [[ "$blackout" =~ ^[1-9][0-9]{0,2}$ ]] || fail "--blackout must be 1 to 999 milliseconds (once a second)"
fi
if [ -n "$sample_ms" ]; then
  [[ "$sample_ms" =~ ^[1-9][0-9]{1,3}$ ]] && [ "$sample_ms" -le 1000 ] ||
    fail "--sample-sockets must be 10 to 1000 milliseconds"
fi
if [ -n "$rto_min" ]; then
  [[ "$rto_min" =~ ^[1-9][0-9]{0,3}$ ]] || fail "--rto-min must be 1 to 9999 milliseconds"
fi
# The loss as a threshold of `numgen random mod 1000000` (parts per million).
loss_ppm=0
if [ -n "$loss" ]; then
  loss_ppm=$(awk -v t="$loss" 'BEGIN {
      pct = sub(/%$/, "", t)
      if (t !~ /^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$/) exit 1
      v = pct ? t / 100 : t + 0
      if (v >= 1) exit 1
      printf "%d\n", v * 1000000 + 0.5 }'
  ) || fail "--loss must be a fraction in [0, 1) or a percentage such as 1%"
fi
[ "$(id -u)" = 0 ] || fail "needs root (it creates network namespaces)"
for tool in ip tc python3 ${sample_ms:+ss}; do
  command -v "$tool" >/dev/null 2>&1 || fail "needs \`$tool\` on PATH"
done
if { [ -n "$loss" ] || [ -n "$blackout" ]; } && ! command -v nft >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "netns-cluster: installing nftables (--loss needs nft)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >&2 ||
      { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >&2; } ||
      fail "could not install nftables with apt-get; --loss needs \`nft\` (nftables)"
  else
    fail "--loss needs \`nft\` (nftables), which is missing, and there is no apt-get to install it"
  fi
fi

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
blackout_pid=""
samplers=()
source "$root/scripts/socket-samples.sh"
cleanup() {
  if [ -n "$blackout_pid" ]; then kill -9 "$blackout_pid" 2>/dev/null || true; fi
  for pid in "${samplers[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Ring strategies have no server; ps, p3 and dlcp have one, the last host.
has_server() { case "$1" in ps|p3|ps-no-overlap|dlcp) return 0 ;; *) return 1 ;; esac; }
# The switch's port of host $1 on path $2.
port() { echo "h$1p$2"; }

# The bridges' namespace and one namespace per host, joined by veth pairs: path p is bridge
# br<p>, and host i has eth<p> on it with 10.77.p.(i+1).
ip netns add "$switch"
made+=("$switch")
for ((p = 0; p < paths; p++)); do
  ip -n "$switch" link add "br$p" type bridge
  ip -n "$switch" link set "br$p" up
done
for ((i = 0; i < hosts; i++)); do
  ns="$tag-h$i"
  ip netns add "$ns"
  made+=("$ns")
  ip -n "$ns" link set lo up
  for ((p = 0; p < paths; p++)); do
    ip link add "eth$p" netns "$ns" type veth peer name "$(port "$i" "$p")" netns "$switch"
    if [ -n "$bottleneck" ]; then
      # One packet per skb, so that queues and drops count the packets on the wire.
      ip -n "$ns" link set dev "eth$p" gso_max_segs 1
      ip -n "$switch" link set dev "$(port "$i" "$p")" gso_max_segs 1
    fi
    ip -n "$switch" link set "$(port "$i" "$p")" master "br$p" up
    ip -n "$ns" addr add "10.77.$p.$((i + 1))/24" dev "eth$p"
    ip -n "$ns" link set "eth$p" up
    if [ -n "$rto_min" ]; then
      ip -n "$ns" route replace "10.77.$p.0/24" dev "eth$p" proto kernel scope link \
        src "10.77.$p.$((i + 1))" rto_min "${rto_min}ms"
    fi
  done
done

# The kernel's TCP: allowed in the root namespace (a namespace may only pick an allowed
# algorithm), then chosen in every host's namespace and read back.
allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
case " $allowed " in
  *" $cc "*) ;;
  *) sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $cc" ||
       fail "could not allow congestion control '$cc' in the root namespace" ;;
esac
for ((i = 0; i < hosts; i++)); do
  ip netns exec "$tag-h$i" sysctl -qw net.ipv4.tcp_congestion_control="$cc" ||
    fail "could not set congestion control '$cc' in namespace $tag-h$i (is tcp_$cc loaded?)"
  got=$(ip netns exec "$tag-h$i" sysctl -n net.ipv4.tcp_congestion_control)
  [ "$got" = "$cc" ] || fail "namespace $tag-h$i runs '$got', not '$cc'"
done

# Every host namespace's TCP counters (/proc/net/netstat and snmp) into $out/tcp/$1-h<i>.
tcp_snapshot() {
  mkdir -p "$out/tcp"
  for ((i = 0; i < hosts; i++)); do
    ip netns exec "$tag-h$i" cat /proc/net/netstat /proc/net/snmp > "$out/tcp/$1-h$i.txt"
  done
}

# $out/tcp.json: the congestion control and each host's TCP counters over the job.
write_tcp_json() {
  python3 "$root/scripts/netns_counters.py" tcp "$out" "$cc" "$hosts"
}

# htb at RATE (or none) on device $2 in namespace $1.
shape_device() {
  local ns=$1 dev=$2 rate=$3
  ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
  [ "$rate" = none ] && return 0
  ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000
  ip netns exec "$ns" tc class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate"
}

# htb at RATE on every host's egress, every path (or none).
shape() {
  for ((i = 0; i < hosts; i++)); do
    for ((p = 0; p < paths; p++)); do shape_device "$tag-h$i" "eth$p" "$1"; done
  done
}

# DSCP -> leaf class (prio = class - 0x10) of the bottleneck's strict-priority htb: the
# runtime marks packet class c with DSCP 46 - min(c, 7) and drop-eligible packets with 8.
dscp_classes=("0 10" "46 11" "45 12" "44 13" "43 14" "42 15" "41 16" "40 16" "39 16" "8 17")

# --fair: under 1:1 of device $2 in namespace $1, a leaf per sending host (its address's last
# byte, IP source at offset 12) with a token rate and the whole RATE to borrow in turn; what
# matches no host (none on these bridges) takes the default leaf 1:10.
fair_leaves() {
  local ns=$1 dev=$2 rate=$3
  local tc=(ip netns exec "$ns" tc)
  "${tc[@]}" class add dev "$dev" parent 1:1 classid 1:10 htb rate 8kbit ceil "$rate" quantum 1514
  "${tc[@]}" qdisc add dev "$dev" parent 1:10 handle 10: pfifo limit "$queue_packets"
  local h
  for ((h = 0; h < hosts; h++)); do
    "${tc[@]}" class add dev "$dev" parent 1:1 classid "1:$((100 + h))" htb rate 8kbit \
      ceil "$rate" quantum 1514
    "${tc[@]}" qdisc add dev "$dev" parent "1:$((100 + h))" handle "$((100 + h)):" pfifo \
      limit "$queue_packets"
    "${tc[@]}" filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
      match u32 "$((h + 1))" 0xff at 12 flowid "1:$((100 + h))"
  done
}

# The bottleneck's htb at RATE on device $2 in namespace $1: one leaf (or, with --prio,
# eight strict-priority leaves chosen by DSCP), each with pfifo limit --queue-packets.
shape_bottleneck() {
  local ns=$1 dev=$2 rate=$3
  local tc=(ip netns exec "$ns" tc)
  "${tc[@]}" qdisc del dev "$dev" root 2>/dev/null || true
  "${tc[@]}" qdisc add dev "$dev" root handle 1: htb default 10 r2q 1000
  "${tc[@]}" class add dev "$dev" parent 1: classid 1:1 htb rate "$rate" ceil "$rate"
  if [ "$fair" = 1 ]; then
    fair_leaves "$ns" "$dev" "$rate"
    return 0
  fi
  if [ "$prio" = 0 ]; then
    "${tc[@]}" class add dev "$dev" parent 1:1 classid 1:10 htb rate "$rate" ceil "$rate"
    "${tc[@]}" qdisc add dev "$dev" parent 1:10 handle 10: pfifo limit "$queue_packets"
    return 0
  fi
  # A token guaranteed rate each; the rest is borrowed from 1:1 strictly by prio.
  for ((c = 0; c < 8; c++)); do
    "${tc[@]}" class add dev "$dev" parent 1:1 classid "1:1$c" htb rate 8kbit ceil "$rate" \
      prio "$c" quantum 1514
    "${tc[@]}" qdisc add dev "$dev" parent "1:1$c" handle "1$c:" pfifo limit "$queue_packets"
  done
  local entry
  for entry in "${dscp_classes[@]}"; do
    set -- $entry
    "${tc[@]}" filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
      match ip dsfield "$(($1 << 2))" 0xfc flowid "1:$2"
  done
}

# The bottleneck ports: one line per shaped device, "host path direction namespace device
# rate nft-before-qdisc" (to_host: the switch's egress toward the host, where nftables
# sees a packet before the queue; from_host: the host's own egress, before nftables).
bottleneck_ports() {
  local first=0 i p r
  has_server "$strategy" && first=$((hosts - 1))
  for ((i = first; i < hosts; i++)); do
    for ((p = 0; p < paths; p++)); do
      r=$bottleneck
      [ -n "$degraded_rate" ] && [ "$p" = $((paths - 1)) ] && r=$degraded_rate
      echo "$i $p to_host $switch $(port "$i" "$p") $r 1"
      echo "$i $p from_host $tag-h$i eth$p $r 0"
    done
  done
}

# nftables in the switch: named counters of the IPv4 packets met and dropped per port and
# direction, the drops `numgen random` below --loss.
add_random_loss() {
  local rules=() counters=() i p dir ns dev r before match name
  while read -r i p dir ns dev r before; do
    if [ "$dir" = to_host ]; then
      match="oifname \"$dev\""
    else
      has_server "$strategy" || continue # a ring's packet meets its loss on the way in
      match="iifname \"$(port "$i" "$p")\""
    fi
    name="$(port "$i" "$p")_$dir"
    counters+=("counter ${name}_seen {}" "counter ${name}_drop {}")
    rules+=("ether type ip $match counter name \"${name}_seen\""
      "ether type ip $match numgen random mod 1000000 < $loss_ppm counter name \"${name}_drop\" drop")
  done < <(bottleneck_ports)
  {
    echo "table bridge syncopate_loss {"
    printf '  %s\n' "${counters[@]}"
    echo "  chain forward {"
    echo "    type filter hook forward priority 0; policy accept;"
    printf '    %s\n' "${rules[@]}"
    echo "  }"
    echo "}"
  } | ip netns exec "$switch" nft -f -
}

# The blackouts: a rule that drops every IPv4 packet the switch forwards while the set
# `out` holds IPv4's ether type, and a loop in the background that adds it once a second
# with a timeout of --blackout ms. The kernel expires the element, so an outage lasts its
# milliseconds to the timer tick: a rule added and flushed by two commands lasted as long
# as `ip netns exec nft` took besides (a 20 ms outage lasted 27 ms on an idle 2-core
# machine, 43-149 ms on a busy one; 18-20 ms this way).
start_blackouts() {
  printf '%s\n' "table bridge syncopate_blackout {" "  counter blackout_drop {}" \
    "  set out { type ether_type; flags timeout; }" \
    "  chain forward {" "    type filter hook forward priority -1; policy accept;" \
    "    ether type @out counter name blackout_drop drop" "  }" "}" |
    ip netns exec "$switch" nft -f -
  (
    local next now
    next=$(date +%s%N)
    while :; do
      next=$((next + 1000000000))
      now=$(date +%s%N)
      [ "$now" -lt "$next" ] && sleep "$(awk -v d=$((next - now)) 'BEGIN { printf "%.6f", d / 1e9 }')"
      ip netns exec "$switch" nft add element bridge syncopate_blackout out \
        "{ ip timeout ${blackout}ms }"
    done
  ) &
  blackout_pid=$!
}

# --sample-sockets: `ss -tin` in every host's namespace about every $sample_ms ms, into
# $out/sockets/h<i>.txt, summed up in $out/sockets.json (scripts/socket-samples.sh).
sample_sockets() {
  local i names=()
  for ((i = 0; i < hosts; i++)); do names+=("$tag-h$i"); done
  start_socket_samplers "$out" "$sample_ms" "${names[@]}"
}

# The kernel's counters at the bottleneck into $out/kernel/$1-*: tc -s (text and JSON) of
# every shaped device, and nftables' ruleset and counters.
snapshot() {
  local phase=$1 i p dir ns dev r before
  mkdir -p "$out/kernel"
  while read -r i p dir ns dev r before; do
    local base="$out/kernel/$phase-$(port "$i" "$p")-$dir"
    { ip netns exec "$ns" tc -s qdisc show dev "$dev"; ip netns exec "$ns" tc -s class show dev "$dev"; } \
      > "$base.txt"
    ip netns exec "$ns" tc -s -j qdisc show dev "$dev" > "$base.qdisc.json"
    ip netns exec "$ns" tc -s -j class show dev "$dev" > "$base.class.json"
  done < <(bottleneck_ports)
  if [ -n "$loss" ] || [ -n "$blackout" ]; then
    ip netns exec "$switch" nft list ruleset > "$out/kernel/$phase-nft.txt"
    ip netns exec "$switch" nft -j list counters > "$out/kernel/$phase-nft.json"
  fi
}

# $out/kernel.json from the snapshots: per port and direction the counters' growth over the
# job; prints the totals in one line.
write_kernel_json() {
  bottleneck_ports > "$out/kernel/ports.txt"
  python3 "$root/scripts/netns_counters.py" kernel "$out" "$bottleneck" "$queue_packets" \
    "$loss_ppm" "$prio" "$paths" "${degraded_rate:-none}" "$strategy" \
    "$(has_server "$strategy" && echo ps || echo ring)"
}

# Whether FLAGS name a flag ($1 or $1=...).
extra_has() {
  local f
  for f in "${extra[@]}"; do [ "$f" = "$1" ] || [[ "$f" == "$1="* ]] && return 0; done
  return 1
}
# Whether FLAGS ask for the datagram transport.
udp_transport() {
  local i
  for ((i = 0; i < ${#extra[@]}; i++)); do
    [ "${extra[$i]}" = --transport=udp ] && return 0
    [ "${extra[$i]}" = --transport ] && [ "${extra[$((i + 1))]:-}" = udp ] && return 0
  done
  return 1
}

# One job over the hosts: strategy, extra `syncopate` flags; worker 0's summary into $2.
run_job() {
  local strategy=$1 summary=$2
  shift 2
  local servers=0
  has_server "$strategy" && servers=1
  local workers=$((hosts - servers))
  local token
  token=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  local flags=(--strategy "$strategy" --workers "$workers" --servers "$servers")
  extra_has --steps || extra_has --epochs || flags+=(--steps "$steps")
  # Our defaults, where FLAGS do not choose (a flag given twice is refused).
  extra_has --model || flags+=(--model lenet)
  extra_has --dataset || flags+=(--dataset synthetic)
  extra_has --batch-size || flags+=(--batch-size 32)
  extra_has --quiet || flags+=(--quiet)
  extra_has --no-replica-stats || flags+=(--no-replica-stats)
  # Under loss or blackouts TCP's backed-off retransmissions (200 ms, doubled: 6.2 s after
  # five) outlast the default 5 s peer timeout, and heartbeats wait behind them.
  if [ -n "$loss" ] || [ -n "$blackout" ]; then
    extra_has --peer-timeout || flags+=(--peer-timeout 60)
  fi
  flags+=("$@")
  pids=()
  for ((i = 0; i < hosts; i++)); do
    local role=worker
    [ "$i" -ge "$workers" ] && role=server
    local more=()
    # Worker 0 writes the job's summary; a server, or a worker with losses or datagrams
    # of its own, writes its own beside it (summary.server-R.json, summary.worker-R.json).
    more=(--summary-json "$summary")
    if udp_transport; then
      local addrs=() p
      for ((p = 0; p < paths; p++)); do addrs+=("10.77.$p.$((i + 1))"); done
      more+=(--udp-addrs "$(IFS=,; echo "${addrs[*]}")")
      [ "$paths" -gt 1 ] && more+=(--paths "$paths")
    fi
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
  "$SYNCOPATE_BIN" summary --skip 5 --decimals 4 "$1" worker0.step_seconds:mean
}

emulation=()
if [ "$emulate" = 1 ]; then
  shape none
  [ "$rate" != none ] && emulation=(--bandwidth "$rate")
else
  shape "$rate"
fi
if [ -n "$bottleneck" ]; then
  while read -r i p dir ns dev r before; do shape_bottleneck "$ns" "$dev" "$r"; done \
    < <(bottleneck_ports)
  [ -n "$loss" ] && add_random_loss
  rm -rf "$out/kernel" "$out/kernel.json"
  snapshot before
  if [ -n "$blackout" ]; then start_blackouts; fi
fi
rm -rf "$out/tcp" "$out/tcp.json"
tcp_snapshot before
[ -z "$sample_ms" ] || sample_sockets
job=0
run_job "$strategy" "$out/summary.json" "${emulation[@]}" "${extra[@]}" || job=$?
[ -z "$sample_ms" ] || stop_socket_samplers "$out" "$hosts" "$sample_ms"
if [ -n "$blackout_pid" ]; then
  kill -9 "$blackout_pid" 2>/dev/null || true
  wait "$blackout_pid" 2>/dev/null || true
  blackout_pid=""
fi
tcp_snapshot after
write_tcp_json
if [ -n "$bottleneck" ]; then
  snapshot after
  write_kernel_json
fi
[ "$job" = 0 ] || exit "$job"
how="at $rate (htb)"
[ "$emulate" = 1 ] && how="at $rate (emulated)"
if [ -n "$bottleneck" ]; then
  how="behind a $bottleneck bottleneck (queue $queue_packets packets, loss ${loss:-0},"
  how+=" blackouts ${blackout:-0} ms a second,"
  how+=" prio $prio, fair $fair, $paths path(s)${degraded_rate:+, the last at $degraded_rate}; other ports $rate)"
fi
echo "netns-cluster: $strategy on $hosts hosts over TCP $cc $how:" \
  "mean step $(mean_step "$out/summary.json") s; worker 0's summary: $out/summary.json;" \
  "namespaces $tag-*"
