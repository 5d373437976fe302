#!/usr/bin/env bash
# Coverage-guided mutation fuzzing of every fuzz target for a bounded time: builds the
# targets with libFuzzer's coverage instrumentation on stable Rust (as fuzz/README.md shows;
# skipped with --bin-dir), then runs each target from its seed corpus for --seconds seconds
# in --jobs parallel libFuzzer processes. Fails on the first crash, timeout or leak, and
# prints the crashing input (base64) and libFuzzer's report, so a CI log alone reproduces it.
# Prints, per target, the inputs executed (libFuzzer's final stats, summed over processes).
#
#   scripts/fuzz-run.sh                       # CI: 60 s per target, one process each
#   scripts/fuzz-run.sh --seconds 3600 --jobs 64 --out /data/fuzz     # a campaign
#   scripts/fuzz-run.sh --bin-dir DIR ...     # binaries built elsewhere (see fuzz/README.md)
#
# Options:
#   --seconds N   time per target and process (default 60)
#   --runs N      also stop each process after N inputs (default: no limit)
#   --jobs N      libFuzzer processes per target, run in parallel over one corpus (default 1)
#   --out DIR     corpora, crashes and logs (default: a new folder under /tmp); each target's
#                 corpus starts as its seeds and grows there, so a later run can go on
#   --bin-dir DIR take the instrumented binaries from DIR instead of building them
#   --targets "A B"  the targets to run (default: all three)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
seconds=60
runs=""
jobs=1
out=""
bin_dir=""
targets="decode_frame endpoint_frames decode_datagram"
while (($#)); do
    case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --targets) targets="$2"; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "fuzz-run: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$seconds" "$jobs" ${runs:+"$runs"}; do
    [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || { echo "fuzz-run: '$n' is not a positive count" >&2; exit 2; }
done
out="${out:-$(mktemp -d /tmp/syncopate-fuzz.XXXXXX)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

if [[ -z $bin_dir ]]; then
    # Coverage counters, a table of the covered code and comparison tracing for libFuzzer;
    # debug assertions and overflow checks on, as in the workspace's tests. --target keeps
    # the flags off build scripts and proc macros.
    export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
    triple=x86_64-unknown-linux-gnu
    # Beside the plain build: under the caller's CARGO_TARGET_DIR (relative to fuzz/, as
    # cargo reads it there), else fuzz/target.
    cov_dir="$(cd "$root/fuzz" && mkdir -p "${CARGO_TARGET_DIR:-target}/cov" &&
        cd "${CARGO_TARGET_DIR:-target}/cov" && pwd)"
    echo "fuzz run: building the instrumented targets into $cov_dir"
    (cd "$root/fuzz" && cargo build --quiet --release --target "$triple" --target-dir "$cov_dir")
    unset RUSTFLAGS
    bin_dir="$cov_dir/$triple/release"
fi

failed=0
for target in $targets; do
    bin="$bin_dir/$target"
    [[ -x $bin ]] || { echo "fuzz-run: no binary $bin" >&2; exit 2; }
    corpus="$out/corpus/$target"
    crashes="$out/crashes/$target"
    logs="$out/logs/$target"
    mkdir -p "$corpus" "$crashes" "$logs"
    # The seeds and kept reproducers join the corpus (libFuzzer reads extra folders but
    # writes new inputs only into the first).
    extra=("$root/fuzz/seeds/$target")
    [[ -d $root/fuzz/artifacts-kept/$target ]] && extra+=("$root/fuzz/artifacts-kept/$target")
    echo "fuzz run: $target for ${seconds} s in $jobs process(es)${runs:+, at most $runs inputs each}"
    pids=()
    for ((j = 0; j < jobs; j++)); do
        # -timeout: an input running 30 s is a hang; -rss_limit_mb: one using 2 GiB a leak.
        "$bin" "$corpus" "${extra[@]}" -max_total_time="$seconds" ${runs:+-runs="$runs"} \
            -max_len=4096 -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="$crashes/" -seed="$((j + 1 + RANDOM * 1000))" \
            >"$logs/$j.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for ((j = 0; j < jobs; j++)); do
        wait "${pids[$j]}" || { status=1; echo "fuzz-run: $target process $j failed (log: $logs/$j.log)"; }
    done
    # libFuzzer's final stats, summed over the processes.
    executed=$(awk '/^stat::number_of_executed_units:/ { n += $2 } END { print n + 0 }' "$logs"/*.log)
    rate=$(awk '/^stat::average_exec_per_sec:/ { n += $2 } END { print n + 0 }' "$logs"/*.log)
    echo "fuzz run: $target: $executed inputs executed by $jobs process(es) in at most ${seconds} s ($rate per second in all), corpus $(find "$corpus" -type f | wc -l) files"
    if ((status)); then
        failed=1
        for log in "$logs"/*.log; do
            grep -q -E '^==[0-9]+== ERROR|^SUMMARY|panicked at' "$log" || continue
            echo "---- $log (last 40 lines)"
            tail -n 40 "$log"
        done
        for crash in "$crashes"/*; do
            [[ -f $crash ]] || continue
            echo "---- crash input $crash ($(stat -c %s "$crash") bytes), base64 (decode with base64 -d):"
            base64 -w 100 "$crash"
        done
    fi
done
echo "fuzz run: corpora, crashes and logs in $out"
if ((failed)); then
    echo "fuzz run: FAILED: a target crashed; reproduce with the binary and the input above, see fuzz/README.md" >&2
    exit 1
fi
