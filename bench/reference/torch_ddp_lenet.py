#!/usr/bin/python3
"""Data-parallel LeNet training throughput with PyTorch DDP (gloo backend, CPU, loopback).

Spawns `--workers` processes on 127.0.0.1 (torch.multiprocessing), each training
PyTorch's MNIST-example LeNet on its own batch of `--batch` (default 64) samples per step
with SGD (lr 0.05, momentum 0.9); DDP all-reduces (averages) the gradients over gloo/TCP on
the loopback interface. After `--warmup` untimed steps, `--steps` steps are timed.

Reports:
  samples_per_sec  workers * batch * steps / wall time of the timed steps (slowest rank)
  step_ms_*        per-step time on rank 0 (zero_grad, forward, loss, backward with the
                   gradient all-reduce, optimizer step)

Data: random inputs and labels (fixed seed per rank), or MNIST with `--data DIR` holding
train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz; each rank then reads its own
shard (rank::workers) of a shuffled order.

Run with Debian's Python (see scripts/install-reference.sh):
  /usr/bin/python3 bench/reference/torch_ddp_lenet.py --workers 2 --steps 200 [--json]
"""

import argparse
import gzip
import os
import platform
import struct
import sys
import time

sys.dont_write_bytecode = True  # keep bench/reference free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as rc  # noqa: E402

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2, help="processes (2 or 4; default 2)")
    p.add_argument("--model", choices=rc.MODELS, default="lenet")
    p.add_argument("--batch", type=int, default=64, help="batch per worker (default 64)")
    p.add_argument("--steps", type=int, default=200, help="timed steps (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first (default 20)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default max(1, 2 // workers))")
    p.add_argument("--data", default=None, help="directory with MNIST IDX .gz files")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds a collective may wait before the run fails (default 120)")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON object")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error("--workers must be at least 1")
    for name in ("batch", "steps"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name)
    if a.warmup < 0:
        p.error("--warmup must be at least 0")
    if a.threads is None:
        a.threads = max(1, 2 // a.workers)
    elif a.threads < 1:
        p.error("--threads must be at least 1")
    if a.data is not None:
        for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
            if not os.path.isfile(os.path.join(a.data, f)):
                p.error("--data %s: missing %s" % (a.data, f))
    return a


# ----------------------------------------------------------------------------- MNIST IDX


def read_idx_gz(path, expect_magic):
    """Reads a gzip'd IDX file (MNIST format) into a numpy uint8 array."""
    import numpy as np

    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: too short for an IDX header" % path)
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != expect_magic:
        raise ValueError("%s: IDX magic 0x%08x, expected 0x%08x" % (path, magic, expect_magic))
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    offset = 4 + 4 * ndim
    count = 1
    for d in dims:
        count *= d
    if len(raw) - offset != count:
        raise ValueError("%s: %d data bytes for dims %s" % (path, len(raw) - offset, dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def load_mnist(directory):
    """(images float32 [N,1,28,28] normalised as in PyTorch's example, labels int64 [N])."""
    import numpy as np

    images = read_idx_gz(os.path.join(directory, "train-images-idx3-ubyte.gz"), 0x00000803)
    labels = read_idx_gz(os.path.join(directory, "train-labels-idx1-ubyte.gz"), 0x00000801)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise ValueError("MNIST: images %s and labels %s do not match"
                         % (images.shape, labels.shape))
    if labels.max() > 9:
        raise ValueError("MNIST: label %d out of range 0..9" % labels.max())
    x = (images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD
    return x.reshape(-1, 1, 28, 28), labels.astype(np.int64)


class Batches:
    """Endless per-rank batches: a pool of random batches, or this rank's MNIST shard."""

    def __init__(self, torch, args, rank, world):
        self.torch = torch
        self.batch = args.batch
        self.i = 0
        if args.data is None:
            g = torch.Generator().manual_seed(args.seed * 1000 + rank)
            pool = 16  # generated once, so data generation stays out of the timed loop
            self.x = torch.randn(pool * args.batch, 1, 28, 28, generator=g)
            self.y = torch.randint(0, 10, (pool * args.batch,), generator=g)
            self.order = None
        else:
            import numpy as np

            x, y = load_mnist(args.data)
            order = np.random.RandomState(args.seed).permutation(len(y))[rank::world]
            if len(order) < args.batch:
                raise ValueError("MNIST shard of %d samples < batch %d" % (len(order), args.batch))
            self.x = torch.from_numpy(np.ascontiguousarray(x[order]))
            self.y = torch.from_numpy(np.ascontiguousarray(y[order]))
        self.n_batches = len(self.y) // args.batch

    def next(self):
        k = self.i % self.n_batches
        self.i += 1
        lo = k * self.batch
        return self.x[lo:lo + self.batch], self.y[lo:lo + self.batch]


# ----------------------------------------------------------------------------- workers


def train(torch, args, rank, world):
    """Builds the DDP model, runs the warm-up and the timed steps; returns plain numbers
    (per-step times, loop wall time, first and last loss), so the model, its DDP Reducer
    and every tensor of the run are gone when it returns (see rc.leave_loopback_group)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts)
    model = DDP(rc.build_model(args.model))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    data = Batches(torch, args, rank, world)

    def step():
        x, y = data.next()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    first_loss = None
    for _ in range(args.warmup):
        loss = step()
        if first_loss is None:
            first_loss = float(loss.detach())
    dist.barrier()
    times = []
    t_start = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t_start
    last_loss = float(loss.detach())
    if first_loss is None:
        first_loss = last_loss
    return times, elapsed, first_loss, last_loss


def worker(rank, args, port, result_queue):
    torch = rc.import_torch()
    import torch.distributed as dist

    world = args.workers
    rc.join_loopback_group(rank, world, port, args.threads, args.timeout)
    keep = []  # every tensor given to a gloo collective here, until the group is gone
    try:
        times, elapsed, first_loss, last_loss = train(torch, args, rank, world)
        # The slowest rank's wall time sets the throughput; losses are averaged.
        t = torch.tensor([elapsed], dtype=torch.float64)
        losses = torch.tensor([first_loss, last_loss], dtype=torch.float64)
        keep += [t, losses]
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.all_reduce(losses, op=dist.ReduceOp.SUM)
        if rank == 0:
            med, p10, p90 = rc.summary_ms(times)
            wall = float(t[0])
            result_queue.put({
                "framework": "pytorch-ddp-gloo",
                "torch_version": torch.__version__,
                "model": args.model,
                "data": "mnist" if args.data else "random",
                "workers": world,
                "threads_per_worker": torch.get_num_threads(),
                "batch_per_worker": args.batch,
                "global_batch": args.batch * world,
                "steps": args.steps,
                "warmup": args.warmup,
                "samples_per_sec": round(args.batch * world * args.steps / wall, 1),
                "step_ms_median": rc.r4(med),
                "step_ms_p10": rc.r4(p10),
                "step_ms_p90": rc.r4(p90),
                "wall_s": rc.r4(wall),
                "loss_first": rc.r4(float(losses[0]) / world),
                "loss_last": rc.r4(float(losses[1]) / world),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            })
    finally:
        rc.leave_loopback_group(keep, args.timeout)


def main(argv=None):
    args = parse_args(argv)
    if not rc.has_gloo():
        return 2
    if args.workers not in (2, 4):
        sys.stderr.write("note: --workers %d (the reference runs use 2 and 4)\n" % args.workers)
    if args.data is not None:
        try:  # fail early, in the parent, on a bad data set
            load_mnist(args.data)
        except (OSError, ValueError) as err:
            sys.stderr.write("error: --data %s: %s\n" % (args.data, err))
            return 2

    status, res = rc.spawn_ranks(worker, args, args.workers, "DDP")
    if status is not None:
        return status
    rc.print_report(res, args.json, " DDP gloo on 127.0.0.1", [
        "setup            %d workers x %d threads, %s, batch %d per worker (%d global), %s data"
        % (res["workers"], res["threads_per_worker"], res["model"],
           res["batch_per_worker"], res["global_batch"], res["data"]),
        "steps            %d timed after %d warm-up, wall %.3f s"
        % (res["steps"], res["warmup"], res["wall_s"]),
        "step      ms     median %9.3f  p10 %9.3f  p90 %9.3f (rank 0)"
        % (res["step_ms_median"], res["step_ms_p10"], res["step_ms_p90"]),
        "throughput       %.1f samples/s (all workers)" % res["samples_per_sec"],
        "loss             %.4f first warm-up step, %.4f last step (mean over ranks)"
        % (res["loss_first"], res["loss_last"]),
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
