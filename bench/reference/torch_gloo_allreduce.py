#!/usr/bin/python3
"""torch.distributed all_reduce(SUM) timing over gloo on 127.0.0.1: the Gloo all-reduce baseline.

Usage: torch_gloo_allreduce.py [--ranks N] [--min-time S] [--min-iters N] [SIZE ...]
  SIZE  message size in bytes of float32 data, a multiple of 4; a suffix K, M or G
        (KiB, MiB, GiB) is accepted. Default: 4K 64K 1M 16M 100M.
  --ranks N      processes to spawn (default 2), one torch thread each
  --min-time S   aim for at least S seconds of timed iterations per size (default 1.0)
  --min-iters N  at least N timed iterations per size (default 5)

The same method and output as mpi_allreduce.c (run_mpi_allreduce.sh), so the two compare
line by line. For each size: fills the tensor, runs warm-up all-reduces (10, or 2 from
16 MiB up; the first result is checked exactly), estimates the time of one call from the
warm-up's second half, then times max(min-iters, min-time / estimate) calls (at most
10000), each started right after a barrier. An iteration's time is the slowest rank's.
Prints to stdout, CSV, one line per size after a header line:
  size_bytes,ranks,median_s,busbw_GBps
where busbw_GBps = 2*(ranks-1)/ranks * size_bytes / median_s / 1e9 (nccl-tests' "bus
bandwidth"). Diagnostics (iteration counts) go to stderr as '# ' lines.

Run with Debian's Python (see scripts/install-reference.sh):
  /usr/bin/python3 bench/reference/torch_gloo_allreduce.py --ranks 2 4K 1M
"""

import argparse
import os
import re
import sys
import time

sys.dont_write_bytecode = True  # keep bench/reference free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as rc  # noqa: E402

MAX_ITERS = 10000  # as in mpi_allreduce.c
DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 100 << 20)
_SIZE_RE = re.compile(r"^([0-9]+)([KkMmGg]?)(iB|B)?$")
_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text):
    """Bytes from "4096", "4K", "64k", "1M", "100MiB", "1G" (K/M/G = KiB/MiB/GiB), as
    mpi_allreduce.c's parse_size; also requires a positive multiple of 4 (float32)."""
    m = _SIZE_RE.match(text)
    if not m or (m.group(3) == "B" and not m.group(2)):
        raise argparse.ArgumentTypeError("bad size: %r (e.g. 4096, 4K, 1M, 100M)" % text)
    v = int(m.group(1)) * _MULT[m.group(2).lower()]
    if v <= 0:
        raise argparse.ArgumentTypeError("bad size: %r (must be positive)" % text)
    if v % 4 != 0:
        raise argparse.ArgumentTypeError(
            "size is not a multiple of 4 bytes (float32): %r" % text)
    return v


def _min_time(text):
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v >= 0.0 or v == float("inf"):
        raise argparse.ArgumentTypeError("bad --min-time: %r (seconds, >= 0)" % text)
    return v


def _int_in(name, lo, hi):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = lo - 1
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError("bad %s: %r (an integer from %d to %d)"
                                             % (name, text, lo, hi))
        return v
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="torch_gloo_allreduce.py",
        description=__doc__.split("\n")[0],
        epilog="Sizes are bytes of float32 data; K, M, G = KiB, MiB, GiB. "
               "Default sizes: 4K 64K 1M 16M 100M.")
    p.add_argument("--ranks", type=_int_in("--ranks", 1, 1024), default=2, metavar="N",
                   help="processes to spawn on 127.0.0.1 (default 2)")
    p.add_argument("--min-time", type=_min_time, default=1.0, metavar="S",
                   help="aim for at least S seconds of timed iterations per size (default 1.0)")
    p.add_argument("--min-iters", type=_int_in("--min-iters", 1, MAX_ITERS), default=5,
                   metavar="N",
                   help="at least N timed iterations per size (default 5)")
    p.add_argument("--back-to-back", action="store_true",
                   help="time rank 0's calls one after the other, with no barrier, as "
                        "`syncopate bench-comm` does (default: a barrier before each call, "
                        "the slowest rank's time)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds a collective may wait before the run fails (default 120)")
    p.add_argument("sizes", nargs="*", type=parse_size, metavar="SIZE",
                   help="message sizes in bytes, e.g. 4K 64K 1M 16M 100M")
    # Intermixed: options may come after sizes, as mpi_allreduce.c allows.
    a = p.parse_intermixed_args(argv)
    if not a.timeout > 0:
        p.error("--timeout must be positive")
    if not a.sizes:
        a.sizes = list(DEFAULT_SIZES)
    return a


def worker(rank, args, port, result_queue):
    torch = rc.import_torch()
    import torch.distributed as dist

    n = args.ranks
    rc.join_loopback_group(rank, n, port, 1, args.timeout)
    keep = []  # every tensor given to a gloo collective here, until the group is gone
    failed = False
    try:
        if rank == 0:
            sys.stdout.write("size_bytes,ranks,median_s,busbw_GBps\n")
            sys.stdout.flush()
        # One buffer of the largest size; each size reduces a prefix view of it, so the
        # tensors handed to gloo can all stay referenced until the group is destroyed
        # (rc.leave_loopback_group says why) without keeping a buffer per size.
        base = torch.empty(max(args.sizes) // 4, dtype=torch.float32)
        for nbytes in args.sizes:
            count = nbytes // 4
            # Small integers keep the float sums exact, so the check below is exact.
            # (all_reduce works in place: `send` keeps the input, `buf` is reduced.)
            pattern = torch.arange(count, dtype=torch.int32).remainder_(7)
            send = (pattern + (rank + 1)).to(torch.float32)
            want = (pattern * n + n * (n + 1) // 2).to(torch.float32)
            del pattern
            buf = base[:count]
            buf.copy_(send)
            keep.append(buf)

            # Warm-up: connections, buffers and caches; the first result is checked.
            # The second half of the warm-up (from fresh input) estimates one call's time.
            # Repeated in-place sums grow the values at most n^5-fold: no overflow.
            warm = 2 if nbytes >= (16 << 20) else 10
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            bad = torch.tensor([int((buf != want).sum())], dtype=torch.int64)
            keep.append(bad)
            del want
            for _ in range(1, warm // 2):
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf.copy_(send)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(warm // 2, warm):
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            est = (time.perf_counter() - t0) / (warm - warm // 2)
            dist.all_reduce(bad, op=dist.ReduceOp.SUM)
            if int(bad[0]) != 0:
                if rank == 0:
                    sys.stderr.write("torch_gloo_allreduce: error: %d wrong sums at size %d\n"
                                     % (int(bad[0]), nbytes))
                failed = True

            # Rank 0 decides the iteration count so every rank runs the same number.
            iters = args.min_iters
            if rank == 0 and est > 0.0:
                want_iters = args.min_time / est
                if want_iters > iters:
                    iters = MAX_ITERS if want_iters > MAX_ITERS else int(want_iters) + 1
            it_t = torch.tensor([iters], dtype=torch.int64)
            keep.append(it_t)
            dist.broadcast(it_t, src=0)
            iters = int(it_t[0])

            times = []
            for _ in range(iters):
                buf.copy_(send)  # fresh input each call (outside the clock), as MPI's send buffer
                if not args.back_to_back:
                    dist.barrier()
                a = time.perf_counter()
                dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                times.append(time.perf_counter() - a)
            tmax = torch.tensor(times, dtype=torch.float64)
            keep.append(tmax)
            if not args.back_to_back:  # back to back: rank 0's own times
                dist.reduce(tmax, dst=0, op=dist.ReduceOp.MAX)
            if rank == 0:
                med = median(tmax.tolist())
                busbw = 2.0 * (n - 1) / n * nbytes / med / 1e9 if med > 0.0 else 0.0
                sys.stdout.write("%d,%d,%.9f,%.3f\n" % (nbytes, n, med, busbw))
                sys.stdout.flush()
                sys.stderr.write("# size %d bytes: %d timed iterations after %d warm-up\n"
                                 % (nbytes, iters, warm))
                sys.stderr.flush()
            del send, buf
        dist.barrier()
    finally:
        rc.leave_loopback_group(keep, args.timeout)
    if rank == 0:
        result_queue.put(failed)


def median(values):
    """The median as mpi_allreduce.c computes it: the middle value, or the mean of the two."""
    xs = sorted(values)
    k = len(xs)
    return xs[k // 2] if k % 2 else 0.5 * (xs[k // 2 - 1] + xs[k // 2])


def main(argv=None):
    args = parse_args(argv)
    if not rc.has_gloo():
        return 2

    status, res = rc.spawn_ranks(worker, args, args.ranks, "gloo")
    if status is not None:
        return status
    return 1 if res else 0


if __name__ == "__main__":
    sys.exit(main())
