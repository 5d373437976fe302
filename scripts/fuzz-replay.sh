#!/usr/bin/env bash
# Replays every kept fuzz reproducer and the committed seed corpus through the fuzz targets
# (a plain build on stable Rust: no coverage, no mutation), so an input that once crashed a
# state machine, or a path the corpus covers, can never crash it again unnoticed. Seconds of
# running after a minute or two of building. CI runs it; to fuzz for real see fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
cargo build --quiet --release
# Where cargo put the binaries (a CARGO_TARGET_DIR of the caller's, else fuzz/target).
bins="${CARGO_TARGET_DIR:-target}/release"
for target in decode_frame endpoint_frames decode_datagram; do
    inputs=()
    for dir in "artifacts-kept/$target" "seeds/$target"; do
        [[ -d $dir ]] && while IFS= read -r f; do inputs+=("$f"); done < <(find "$dir" -type f ! -name '*.md')
    done
    echo "fuzz replay: $target, ${#inputs[@]} inputs"
    # libFuzzer runs each file once and exits non-zero on the first crash.
    "$bins/$target" "${inputs[@]}" 2>&1 | tail -n 3
done
