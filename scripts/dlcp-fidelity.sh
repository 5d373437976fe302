#!/usr/bin/env bash
# Our emulator against the kernel (issue 37, item 4): the cells of scripts/dlcp-kernel.sh run
# again on one host with `syncopate launch` and the emulated network in place of the
# namespaces, the kernel's queues and nftables, then the mean step of each beside the
# kernel's (from dlcp-kernel.sh's runs in the same --out folder):
#   a  --bandwidth 100mbit --ingress                 (unbounded queues: a deep buffer)
#   b  ... --queue 48000                             (32 packets of 1500 bytes)
#   c  ... --loss 1% --mtu 1500                      (loss per 1500-byte packet)
#   d  ... --paths 2, the second path at 20mbit      (a --network profile)
# Variants: p3 (the emulator's reliable transport, RTO 200 ms) and dlcp-10 (DLCP with a 10 %
# bound, its 1388-byte packets on the emulated TCP links; loss-tolerant, so never resent).
#
# Usage: scripts/dlcp-fidelity.sh [--cells a,b,c,d] [--variants p3,dlcp-10] [--steps 234]
#                                 [--kernel-steps 234] [--out DIR] [--force]
#   --steps         training steps of every emulated run (default 234)
#   --kernel-steps  the --steps of the dlcp-kernel.sh runs to compare with (default 234)
#   --out           dlcp-kernel.sh's --out folder: the emulated runs go beside the kernel's,
#                   under OUT/mnist/steps-K/CELL/VARIANT/emulated-N/ (K: --kernel-steps, N:
#                   --steps; default target/dlcp-kernel)
#   --force  run again what already has a summary
# Prints one line per run, then a Markdown table: cell, variant, mean step (after 5
# warm-up steps) in the kernel and in the emulator, their ratio, and the time to 98 %.
# SYNCOPATE_BIN=PATH runs that binary instead of building this checkout's release binary.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

cells=a,b,c,d
variants=p3,dlcp-10
steps=234
kernel_steps=234
out="$root/target/dlcp-kernel"
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cells) cells=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --kernel-steps) kernel_steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "dlcp-fidelity: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$steps" =~ ^[1-9][0-9]*$ ]] && [ "$steps" -gt 5 ] ||
  { echo "dlcp-fidelity: --steps must be an integer above 5" >&2; exit 2; }
if [ -z "${SYNCOPATE_BIN:-}" ]; then
  cargo build --release -p syncopate >&2
  SYNCOPATE_BIN="$root/target/release/syncopate"
fi
data="$root/../shared/data/mnist"
[ -d "$data" ] || data=""

# The emulated network of a cell.
cell_flags() {
  local base=(--bandwidth 100mbit --ingress)
  case "$1" in
    a) echo "${base[*]}" ;;
    b) echo "${base[*]} --queue 48000" ;;
    c) echo "${base[*]} --loss 1% --mtu 1500" ;;
    d) echo "${base[*]} --network $out/two-paths.toml" ;;
    *) echo "dlcp-fidelity: unknown cell '$1'" >&2; exit 2 ;;
  esac
}

variant_flags() {
  case "$1" in
    p3) echo "--strategy p3" ;;
    dlcp-10) echo "--strategy dlcp --loss-bound 10% --packet-bytes 1388" ;;
    *) echo "dlcp-fidelity: unknown variant '$1' (p3, dlcp-10)" >&2; exit 2 ;;
  esac
}

mkdir -p "$out"
cat > "$out/two-paths.toml" <<'TOML'
paths = 2
[[path]]
[[path]]
bandwidth_bps = "20mbit"
TOML

IFS=, read -r -a cell_list <<< "$cells"
IFS=, read -r -a variant_list <<< "$variants"
rows=()
for c in "${cell_list[@]}"; do
  for v in "${variant_list[@]}"; do
    dir="$out/mnist/steps-$kernel_steps/$c/$v/emulated-$steps"
    rows+=("$c $v $dir")
    if [ "$force" = 0 ] && [ -s "$dir/summary.json" ]; then
      echo "cell $c, $v: kept (summary exists; --force reruns it)"
      continue
    fi
    mkdir -p "$dir"
    started=$(date +%s)
    # shellcheck disable=SC2046 # the flags are words without spaces
    "$SYNCOPATE_BIN" launch --workers 4 --servers 1 $(variant_flags "$v") $(cell_flags "$c") \
      --model lenet --dataset mnist ${data:+--data "$data"} --batch-size 64 --steps "$steps" \
      --eval-every 26 --lr 0.07 --target-accuracy 0.98 --seed 1 --quiet --no-replica-stats \
      --summary-json "$dir/summary.json" > "$dir/launch.log" 2>&1 ||
      { echo "cell $c, $v: FAILED (see $dir/launch.log)" >&2; exit 1; }
    echo "cell $c, $v: $(( $(date +%s) - started )) s"
  done
done

printf '%s\n' "${rows[@]}" > "$out/fidelity-runs.txt"
# A summary's mean step after 5 warm-up steps and its time to the target, or "- -".
figures() {
  [ -s "$1" ] || { echo "- -"; return; }
  "$SYNCOPATE_BIN" summary --skip 5 "$1" worker0.step_seconds:mean time_to_accuracy_s | tr '\t' ' '
}
{
  echo "| cell | variant | kernel step s | emulator step s | emulator / kernel | kernel to 98 % s | emulator to 98 % s |"
  echo "|---|---|---|---|---|---|---|"
  while read -r cell variant folder; do
    read -r ours ours_t < <(figures "$folder/summary.json")
    read -r kernel kernel_t < <(figures "$(dirname "$folder")/seed-1/summary.json")
    awk -v c="$cell" -v v="$variant" -v o="$ours" -v ot="$ours_t" -v k="$kernel" -v kt="$kernel_t" '
      function f(x, spec) { return x == "-" ? "-" : sprintf(spec, x) }
      BEGIN {
        ratio = (o != "-" && k != "-" && k + 0 != 0) ? sprintf("%.3f", o / k) : "-"
        printf "| %s | %s | %s | %s | %s | %s | %s |\n", c, v, f(k, "%.4f"), f(o, "%.4f"), ratio,
          f(kt, "%.1f"), f(ot, "%.1f")
      }'
  done < "$out/fidelity-runs.txt"
} | tee "$out/fidelity.md"
