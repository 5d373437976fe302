#!/usr/bin/env bash
# DLCP against P3 and all-reduce over the kernel's own network (issue 37, item 3) in one
# command: LeNet on MNIST (or Fashion-MNIST) in network namespaces behind a 100 Mbit/s
# bottleneck (scripts/netns-cluster.sh), 4 workers and 1 server for the parameter-server
# variants, 4 workers on a ring for the all-reduce ones, in four cells:
#   a  lossless, deep buffer (pfifo limit 1000)
#   b  shallow-buffer incast (--queue-packets, default 32)
#   c  random loss (--loss, default 1 %, nftables)
#   d  two paths, the second degraded (--degraded-rate, default 20mbit)
#   e  blackouts: once a second every packet dropped for --blackout ms (default 20)
#   f  two equal paths
# Variants: p3 and allreduce over the kernel's TCP (cubic; p3-bbr: P3 on bbr; p3-rto5: P3
# with a 5 ms minimum RTO on its routes, a tuned TCP); dlcp-1 and
# dlcp-10 (DLCP with --loss-bound 1 % and 10 %), dlcp-10-pull (and the parameters back as
# datagrams with --pull-loss-bound 10 %, MLT's pulls), dlcp-1-prio and dlcp-10-prio (behind
# strict-priority DSCP classes at the bottleneck), dlcp-allreduce; the DLCP ones with
# --transport udp.
#
# Usage: scripts/dlcp-kernel.sh [--cells a,b,c,d] [--variants LIST] [--tcp-only]
#                               [--dataset mnist|fashion-mnist] [--data DIR] [--steps 500]
#                               [--eval-every 25] [--lr 0.07] [--seeds 1] [--bottleneck 100mbit]
#                               [--queue-packets 32] [--loss 1%] [--degraded-rate 20mbit]
#                               [--blackout 20]
#                               [--out DIR] [--force] [--dry-run]
#   --cells       which cells (default a,b,c,d; e and f on request)
#   --variants    which variants (default all ten; with --tcp-only p3,p3-bbr,p3-rto5,allreduce)
#   --blackout    cell e's blackout, milliseconds a second (default 20)
#   --tcp-only    only the variants over TCP (p3, allreduce): for a binary without the
#                 datagram transport
#   --dataset     mnist (target accuracy 98 %) or fashion-mnist (85 %); default mnist
#   --data        the dataset's folder (default ../shared/data/DATASET from the repository
#                 root where it exists, else the binary's own search)
#   --steps       training steps of every run (default 500: batch 64 per worker, about two
#                 epochs of MNIST over 4 workers)
#   --eval-every  worker 0 evaluates the test set every N steps (default 25)
#   --lr          learning rate (default 0.07: studies/dlcp-goal.toml's, which reaches 98 % on
#                 MNIST within one epoch of 4 x 64)
#   --seeds       comma-separated seeds, one run each (default 1)
#   --out         where the runs go: OUT/DATASET/steps-N/CELL/VARIANT/seed-S/ holds worker 0's
#                 summary.json, kernel.json (the kernel's counters) and the logs; OUT/table.md
#                 the table (default target/dlcp-kernel)
#   --force       run again what already has a summary (default: such a run is kept, so an
#                 interrupted table resumes where it stopped)
#   --dry-run     print the runs (netns-cluster.sh commands) and stop
# Prints one line per run with its elapsed time, then (and into OUT/table.md) a Markdown
# table: time to the target accuracy, final accuracy, step p50/p99, per-tensor completion
# p99, the kernel's drops (qdisc tail drops + nftables random and blackout drops) and realised loss, and
# DLCP's own realised loss. Root only (netns-cluster.sh creates namespaces); SYNCOPATE_BIN
# as there. Exits non-zero when a run failed (the table marks it; a rerun retries it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

cells=a,b,c,d
variants=""
tcp_only=0
dataset=mnist
data=""
steps=500
eval_every=25
lr=0.07
seeds=1
bottleneck=100mbit
queue_packets=32
loss=1%
degraded_rate=20mbit
blackout=20
out="$root/target/dlcp-kernel"
force=0
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cells) cells=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --tcp-only) tcp_only=1; shift ;;
    --dataset) dataset=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --bottleneck) bottleneck=$2; shift 2 ;;
    --queue-packets) queue_packets=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --degraded-rate) degraded_rate=$2; shift 2 ;;
    --blackout) blackout=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --force) force=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "dlcp-kernel: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "dlcp-kernel: $*" >&2; exit 2; }

tcp_variants=(p3 p3-bbr p3-rto5 allreduce)
all_variants=(p3 p3-bbr p3-rto5 allreduce dlcp-1 dlcp-10 dlcp-10-pull dlcp-1-prio dlcp-10-prio dlcp-allreduce)
if [ -z "$variants" ]; then
  if [ "$tcp_only" = 1 ]; then variants=$(IFS=,; echo "${tcp_variants[*]}")
  else variants=$(IFS=,; echo "${all_variants[*]}"); fi
fi
IFS=, read -r -a cell_list <<< "$cells"
IFS=, read -r -a variant_list <<< "$variants"
IFS=, read -r -a seed_list <<< "$seeds"
for c in "${cell_list[@]}"; do
  [[ "$c" =~ ^[a-f]$ ]] || fail "unknown cell '$c' (a to f)"
done
for v in "${variant_list[@]}"; do
  [[ " ${all_variants[*]} " == *" $v "* ]] || fail "unknown variant '$v' (${all_variants[*]})"
done
for s in "${seed_list[@]}"; do
  [[ "$s" =~ ^[0-9]+$ ]] || fail "--seeds takes comma-separated integers, not '$s'"
done
if [ "$tcp_only" = 1 ]; then
  kept=()
  for v in "${variant_list[@]}"; do
    if [[ " ${tcp_variants[*]} " == *" $v "* ]]; then kept+=("$v")
    else echo "dlcp-kernel: --tcp-only: leaving out $v (it needs --transport udp)" >&2; fi
  done
  [ ${#kept[@]} -gt 0 ] || fail "--tcp-only leaves no variant to run"
  variant_list=("${kept[@]}")
fi
case "$dataset" in
  mnist) target=0.98 ;;
  fashion-mnist) target=0.85 ;;
  *) fail "--dataset must be mnist or fashion-mnist" ;;
esac
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || fail "--steps must be a positive integer"
[[ "$eval_every" =~ ^[1-9][0-9]*$ ]] || fail "--eval-every must be a positive integer"
if [ -z "$data" ] && [ -d "$root/../shared/data/$dataset" ]; then
  data="$(cd "$root/../shared/data/$dataset" && pwd)"
fi

# netns-cluster.sh flags of a cell.
cell_flags() {
  case "$1" in
    a) echo "--bottleneck $bottleneck" ;;
    b) echo "--bottleneck $bottleneck --queue-packets $queue_packets" ;;
    c) echo "--bottleneck $bottleneck --loss $loss" ;;
    d) echo "--bottleneck $bottleneck --paths 2 --degraded-rate $degraded_rate" ;;
    e) echo "--bottleneck $bottleneck --blackout $blackout" ;;
    f) echo "--bottleneck $bottleneck --paths 2" ;;
  esac
}

# A variant as "strategy hosts netns-flags | job-flags".
variant_spec() {
  case "$1" in
    p3) echo "p3 5 | " ;;
    p3-bbr) echo "p3 5 --cc bbr | " ;;
    p3-rto5) echo "p3 5 --rto-min 5 | " ;;
    allreduce) echo "allreduce 4 | " ;;
    dlcp-1) echo "dlcp 5 | --loss-bound 1% --transport udp" ;;
    dlcp-10) echo "dlcp 5 | --loss-bound 10% --transport udp" ;;
    dlcp-10-pull) echo "dlcp 5 | --loss-bound 10% --pull-loss-bound 10% --transport udp" ;;
    dlcp-1-prio) echo "dlcp 5 --prio | --loss-bound 1% --transport udp" ;;
    dlcp-10-prio) echo "dlcp 5 --prio | --loss-bound 10% --transport udp" ;;
    dlcp-allreduce) echo "dlcp-allreduce 4 | --transport udp" ;;
  esac
}

# The runs, one line each: "cell variant seed directory".
runs=()
for c in "${cell_list[@]}"; do
  for v in "${variant_list[@]}"; do
    for s in "${seed_list[@]}"; do
      runs+=("$c $v $s $out/$dataset/steps-$steps/$c/$v/seed-$s")
    done
  done
done

# The netns-cluster.sh command of a run, as words.
run_command() {
  local cell=$1 variant=$2 seed=$3 dir=$4 spec net job strategy hosts
  spec=$(variant_spec "$variant")
  net=${spec%%|*}
  job=${spec#*|}
  read -r strategy hosts net <<< "$net"
  # shellcheck disable=SC2046 # the flags are words without spaces
  cmd=(scripts/netns-cluster.sh --hosts "$hosts" --strategy "$strategy" --steps "$steps"
    $(cell_flags "$cell") $net --out "$dir" --
    --dataset "$dataset" ${data:+--data "$data"} --batch-size 64 --eval-every "$eval_every" --lr "$lr"
    --target-accuracy "$target" --seed "$seed" $job)
}

if [ "$dry_run" = 1 ]; then
  for run in "${runs[@]}"; do
    # shellcheck disable=SC2086
    run_command $run
    printf '%q ' "${cmd[@]}"
    echo
  done
  exit 0
fi
[ "$(id -u)" = 0 ] || fail "needs root (scripts/netns-cluster.sh creates network namespaces)"
if [ -z "${SYNCOPATE_BIN:-}" ]; then
  cargo build --release -p syncopate >&2
  export SYNCOPATE_BIN="$root/target/release/syncopate"
fi

failed=0
n=0
for run in "${runs[@]}"; do
  n=$((n + 1))
  # shellcheck disable=SC2086
  set -- $run
  label="[$n/${#runs[@]}] cell $1, $2, seed $3"
  if [ "$force" = 0 ] && [ -s "$4/summary.json" ]; then
    echo "$label: kept (summary exists; --force reruns it)"
    continue
  fi
  # shellcheck disable=SC2086
  run_command $run
  mkdir -p "$4"
  rm -f "$4/summary.json" "$4/kernel.json" "$4/failed"
  started=$(date +%s.%N)
  if "${cmd[@]}" > "$4/cluster.log" 2>&1; then
    result=$("$SYNCOPATE_BIN" summary "$4/summary.json" test_accuracy time_to_accuracy_s |
      awk -F'\t' '{ reached = $2 == "-" ? "not reached" : sprintf("reached after %.1f s", $2)
        printf "test accuracy %.2f %%, target %s\n", 100 * $1, reached }' ||
      echo "no readable summary")
  else
    failed=$((failed + 1))
    rm -f "$4/summary.json"
    touch "$4/failed"
    result="FAILED (see $4/cluster.log and rank*.log)"
  fi
  elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "$label: ${elapsed} s: $result"
done

printf '%s\n' "${runs[@]}" > "$out/runs.txt"
# A run's row of the table: worker 0's figures from its summary, the kernel's drops from
# kernel.json, DLCP's own realised loss from its receivers' summaries (the servers; the
# ring's workers): the gradient values they filled in, over all they aggregated.
table_row() {
  local cell=$1 variant=$2 seed=$3 folder=$4 figures kernel entries=0 filled=0 e f receivers
  if [ ! -s "$folder/summary.json" ]; then
    local state="not run"
    [ -e "$folder/failed" ] && state=failed
    echo "| $cell | $variant | $seed | $state | | | | | | | |"
    return
  fi
  figures=$("$SYNCOPATE_BIN" summary "$folder/summary.json" time_to_accuracy_s test_accuracy \
    worker0.step_seconds:p50 worker0.step_seconds:p99 worker0.tensor_completion.p99_s)
  kernel=$(python3 "$root/scripts/netns_counters.py" drops "$folder")
  local dlcp=-
  case "$variant" in
    dlcp*)
      receivers=("$folder"/summary.server-*.json)
      [ -e "${receivers[0]}" ] || receivers=("$folder"/summary.worker-*.json)
      for r in "${receivers[@]}"; do
        [ -e "$r" ] || continue
        read -r e f < <("$SYNCOPATE_BIN" summary "$r" loss.entries loss.entries_filled)
        entries=$((entries + e)) filled=$((filled + f))
      done
      [ "$entries" -gt 0 ] && dlcp=$(awk -v f="$filled" -v e="$entries" 'BEGIN { printf "%.3f", 100 * f / e }') ;;
  esac
  printf '%s\t%s\n' "$figures" "$kernel" | awk -F'\t' -v c="$cell" -v v="$variant" -v s="$seed" -v d="$dlcp" '
    function f(x, spec, scale) { return x == "-" ? "-" : sprintf(spec, x * scale) }
    { printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, v, s,
        $1 == "-" ? "not reached" : sprintf("%.1f", $1), f($2, "%.2f", 100), f($3, "%.4f", 1),
        f($4, "%.4f", 1), f($5, "%.4f", 1), $6, $7, d }'
}

{
  echo "$dataset, LeNet, 4 workers, $steps steps, $bottleneck bottleneck; target" \
    "$(awk -v t="$target" 'BEGIN { printf "%g", 100 * t }') %. Cells: a: lossless, deep buffer;" \
    "b: shallow buffer ($queue_packets packets), incast; c: random loss $loss; d: two paths," \
    "one at $degraded_rate; e: blackouts of $blackout ms a second; f: two equal paths"
  echo
  echo "| cell | variant | seed | time to target s | final accuracy % | step p50 s | step p99 s" \
    "| tensor p99 s | kernel drops (tail + random) | kernel loss % | DLCP realised loss % |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  while read -r cell variant seed folder; do
    table_row "$cell" "$variant" "$seed" "$folder"
  done < "$out/runs.txt"
} | tee "$out/table.md"
echo "dlcp-kernel: table in $out/table.md; runs under $out/$dataset/steps-$steps/"
[ "$failed" = 0 ] || { echo "dlcp-kernel: $failed run(s) failed" >&2; exit 1; }
