#!/usr/bin/env bash
# Renders a study's report.html in headless Chromium, checks that every plot is there and
# labelled, and writes a full-page PNG screenshot.
#
#   scripts/screenshot-report.sh runs/demo/report.html docs/report-demo.png
#
# Needs Debian's `chromium` (installed with apt-get when missing and this runs as root or
# with sudo). The check: the DOM Chromium renders has as many <svg> plots as the file, and
# each plot has a title and both axis labels (at least three <text> elements).
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 REPORT.html OUT.png" >&2
    exit 2
fi
report=$1
out=$2
if [[ ! -f "$report" ]]; then
    echo "$report: no such report (run \`syncopate study FILE.toml\` first)" >&2
    exit 1
fi

browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$browser" ]]; then
    echo "chromium is not installed; installing Debian's chromium" >&2
    if [[ $(id -u) -eq 0 ]]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
    elif command -v sudo > /dev/null; then
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
    else
        echo "cannot install chromium: not root and no sudo (apt-get install chromium)" >&2
        exit 1
    fi
    browser=$(command -v chromium)
fi

url="file://$(realpath "$report")"
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
    --disable-dev-shm-usage --user-data-dir="$(mktemp -d)")

# 1. Every plot present and labelled, in the DOM as Chromium rendered it.
dom=$(mktemp)
trap 'rm -f "$dom"' EXIT
"$browser" "${flags[@]}" --dump-dom "$url" > "$dom" 2> /dev/null
in_file=$(grep -o '<svg' "$report" | wc -l)
rendered=$(grep -o '<svg' "$dom" | wc -l)
if [[ "$in_file" -eq 0 || "$rendered" -ne "$in_file" ]]; then
    echo "FAIL: $report has $in_file plots, Chromium rendered $rendered" >&2
    exit 1
fi
unlabelled=$(awk '
    /<svg/ { inside = 1; texts = 0 }
    inside { texts += gsub(/<text/, "&") }
    /<\/svg>/ { if (inside && texts < 3) bad++; inside = 0 }
    END { print bad + 0 }' "$dom")
if [[ "$unlabelled" -ne 0 ]]; then
    echo "FAIL: $unlabelled of $rendered plots lack a title or axis labels" >&2
    exit 1
fi
echo "ok: Chromium rendered all $rendered plots of $report, each with a title and axis labels"

# 2. A full-page screenshot: the page is as tall as its plots (their heights) plus text
# and tables.
plots_height=$(grep -o '<svg[^>]*height="[0-9]*"' "$report" | grep -o 'height="[0-9]*"' |
    grep -o '[0-9]*' | awk '{ sum += $1 } END { print sum + 0 }')
rows=$(grep -o '<tr' "$report" | wc -l)
height=$((plots_height + 30 * rows + 25 * in_file + 300))
mkdir -p "$(dirname "$out")"
"$browser" "${flags[@]}" --window-size=1280,"$height" --screenshot="$out" "$url" 2> /dev/null
echo "screenshot: $out (1280 x $height)"
