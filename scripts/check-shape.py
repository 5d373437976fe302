#!/usr/bin/env python3
"""The shape of the code, checked: no source file under `src/` over 900 lines (test files
apart: `tests.rs`, `*_tests.rs` and files under `tests/`), no function outside tests over 80
lines, and no module circle inside a crate (a module using a sibling subtree that uses it
back, directly or round a longer loop; a child using its ancestors' items, and an ancestor
re-exporting its children's, is not a circle). The front door stays short too: README.md at
most 300 lines, docs/BENCHMARKS.md at most 700.

Usage: scripts/check-shape.py [--verbose]. Exit status 1 when anything is over its limit.
"""

import os
import re
import sys
from collections import defaultdict

MAX_FILE_LINES = 900
MAX_FN_LINES = 80
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
DOC_LIMITS = {"README.md": 300, os.path.join("docs", "BENCHMARKS.md"): 700}

FN_RE = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"C\"\s+)?fn\s+(\w+)")
TEST_MOD_RE = re.compile(r"^\s*#\[cfg\(test\)\]")
PATH_RE = re.compile(r"\b(crate|super)((?:::\w+)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super|self)((?:::\w+)*)::\{")


def is_test_file(path):
    base = os.path.basename(path)
    return base == "tests.rs" or base.endswith("_tests.rs") or "/tests/" in path or "/benches/" in path


def src_files(crate_dir):
    out = []
    for dirpath, _, files in os.walk(os.path.join(crate_dir, "src")):
        for f in files:
            if f.endswith(".rs"):
                out.append(os.path.join(dirpath, f))
    return sorted(out)


def strip_strings_and_comments(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "' '", line)
    return line.split("//", 1)[0]


def function_spans(lines):
    """(name, first line, length) of every fn outside a `#[cfg(test)]` item."""
    spans = []
    i = 0
    skip_test_item = False
    while i < len(lines):
        line = lines[i]
        if TEST_MOD_RE.match(line):
            skip_test_item = True
        m = FN_RE.match(line)
        starts_item = m or re.match(r"^\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", line)
        if starts_item:
            end = item_end(lines, i)
            if skip_test_item:
                i = end + 1
                skip_test_item = False
                continue
            if m and end is not None:
                spans.append((m.group(7), i + 1, end - i + 1))
            skip_test_item = False
        elif line.strip() and not line.strip().startswith("#") and not line.strip().startswith("//"):
            skip_test_item = False
        i += 1
    return spans


def item_end(lines, start):
    depth = 0
    seen_open = False
    for j in range(start, len(lines)):
        code = strip_strings_and_comments(lines[j])
        for ch in code:
            if ch == "{":
                depth += 1
                seen_open = True
            elif ch == "}":
                depth -= 1
                if seen_open and depth == 0:
                    return j
        if not seen_open and code.rstrip().endswith(";"):
            return j
    return len(lines) - 1


def module_path(crate_dir, path):
    rel = os.path.relpath(path, os.path.join(crate_dir, "src"))[:-3].split(os.sep)
    if rel[-1] in ("lib", "main", "mod"):
        rel = rel[:-1]
    return tuple(rel)


def import_targets(mod, text, modules):
    """Modules of this crate that `mod`'s file names through `crate::` and `super::` paths."""
    targets = set()
    paths = [(m.group(1), m.group(2)) for m in PATH_RE.finditer(text)]
    for m in USE_GROUP_RE.finditer(text):
        start = m.end()
        depth, j = 1, start
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        for item in re.split(r"[,{}\s]+", text[start : j - 1]):
            first = item.split("::")[0]
            if first and first not in ("self", "super", "crate") and re.match(r"^\w+$", first):
                paths.append((m.group(1), m.group(2) + "::" + first))
    for head, tail in paths:
        segs = [s for s in tail.split("::") if s]
        if head == "crate":
            base = []
        elif head == "super":
            base = list(mod[:-1])
            while segs and segs[0] == "super":
                base = base[:-1]
                segs = segs[1:]
        else:
            base = list(mod)
        full = tuple(base + segs)
        for k in range(len(full), 0, -1):
            if full[:k] in modules:
                targets.add(full[:k])
                break
    return targets


def sibling_edges(edges):
    """Each edge lifted to the two children of the modules' lowest common ancestor."""
    lifted = defaultdict(set)
    for a, bs in edges.items():
        for b in bs:
            k = 0
            while k < min(len(a), len(b)) and a[k] == b[k]:
                k += 1
            if k == len(a) or k == len(b):
                continue  # an ancestor and its descendant
            lifted[a[: k + 1]].add(b[: k + 1])
    return lifted


def cycles(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def doc_problems():
    """The documents kept short: each within its line limit."""
    out = []
    for rel, limit in DOC_LIMITS.items():
        with open(os.path.join(ROOT, "..", rel), encoding="utf-8") as fh:
            count = len(fh.read().splitlines())
        if count > limit:
            out.append(f"{rel}: {count} lines (limit {limit})")
    return out


def main():
    problems = []
    for crate in sorted(os.listdir(ROOT)):
        crate_dir = os.path.join(ROOT, crate)
        files = src_files(crate_dir)
        modules = {module_path(crate_dir, f): f for f in files}
        edges = defaultdict(set)
        for f in files:
            rel = os.path.relpath(f, os.path.join(ROOT, ".."))
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            lines = text.split("\n")
            if not is_test_file(f) and len(lines) - 1 > MAX_FILE_LINES:
                problems.append(f"{rel}: {len(lines) - 1} lines (limit {MAX_FILE_LINES})")
            if not is_test_file(f):
                for name, line, length in function_spans(lines):
                    if length > MAX_FN_LINES:
                        problems.append(f"{rel}:{line}: fn {name} is {length} lines (limit {MAX_FN_LINES})")
            code = "\n".join(strip_strings_and_comments(l) for l in lines)
            code = code.split("#[cfg(test)]\nmod tests", 1)[0]
            mod = module_path(crate_dir, f)
            edges[mod] |= import_targets(mod, code, modules) - {mod}
        for comp in cycles(sibling_edges(edges)):
            names = ", ".join("::".join(m) for m in comp)
            problems.append(f"crates/{crate}: module circle: {names}")
    problems += doc_problems()
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} over the limits", file=sys.stderr)
        return 1
    if "--verbose" in sys.argv:
        print("shape: files, functions and module graph within the limits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
