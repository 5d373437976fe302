"""Shared pieces of the PyTorch reference baselines (bench/reference/*.py).

Holds the two models (PyTorch MNIST-example LeNet without dropout, and a 3-layer MLP), the
percentile helper, the guarded torch import, spawning the ranks and joining/leaving the
loopback gloo group. Run the scripts with Debian's Python, /usr/bin/python3: Debian's
python3-torch is not visible to other Pythons (pyenv, venvs).
"""

import datetime
import faulthandler
import gc
import json
import os
import math
import socket
import sys

INSTALL_HINT = (
    "run scripts/install-reference.sh (installs Debian's python3-torch), "
    "then run this script with /usr/bin/python3"
)


def import_torch():
    """Imports torch or exits with status 2 and a message saying how to get it."""
    try:
        import torch  # noqa: F401
        import torch.nn  # noqa: F401
    except ImportError as err:
        sys.stderr.write(
            "error: cannot import torch with %s (%s)\n"
            "error: %s\n" % (sys.executable, err, INSTALL_HINT)
        )
        sys.exit(2)
    return torch


def has_gloo():
    """Imports torch as import_torch() does and says whether it has the gloo distributed
    backend, with an error on stderr where it has not."""
    torch = import_torch()
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        sys.stderr.write("error: this torch (%s) has no gloo distributed backend\n"
                         % torch.__version__)
        return False
    return True


MODELS = ("lenet", "mlp", "resnet20")

# The input shape (channels, height, width) of each model.
INPUT_SHAPES = {"lenet": (1, 28, 28), "mlp": (1, 28, 28), "resnet20": (3, 32, 32)}


def build_model(name):
    """Builds `name` for its INPUT_SHAPES input and 10 classes.

    lenet: conv 1->32 3x3, relu, maxpool 2, conv 32->64 3x3, relu, maxpool 2, flatten,
           fc 1600->128, relu, fc 128->10 (PyTorch's examples/mnist Net without the two
           dropout layers; its log_softmax + nll_loss equals the cross-entropy used here).
    mlp:   flatten, fc 784->512, relu, fc 512->256, relu, fc 256->10.
    resnet20: He et al.'s CIFAR ResNet-20, as crates/train/src/model/zoo.rs builds it: conv
           3->16 3x3 + batch norm + relu, three stages of three basic blocks (16, 32, 64
           channels; the first block of stages 2 and 3 strides 2), option-A shortcuts
           (subsample and zero-pad the channels: no parameters), global average pool, fc
           64->10; 269,722 parameters.
    """
    import torch.nn as nn

    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, 1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, 1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(1600, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, 10),
        )
    if name == "resnet20":
        return _resnet20()
    raise ValueError("unknown model %r (known: %s)" % (name, ", ".join(MODELS)))


def _resnet20():
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.pad = cout - cin
            self.stride = stride

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            shortcut = x
            if self.stride != 1 or self.pad:
                shortcut = x[:, :, :: self.stride, :: self.stride]
                half = self.pad // 2
                shortcut = F.pad(shortcut, (0, 0, 0, 0, half, self.pad - half))
            return F.relu(out + shortcut)

    layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def percentile(values, q):
    """The q-th percentile (0..100) with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of an empty list")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary_ms(seconds):
    """(median, p10, p90) in milliseconds of a list of durations in seconds."""
    ms = [s * 1000.0 for s in seconds]
    return percentile(ms, 50), percentile(ms, 10), percentile(ms, 90)


def r4(x):
    return round(float(x), 4)


def print_json(obj):
    # Keys keep their insertion order, so the format is stable from run to run.
    print(json.dumps(obj))


def print_report(res, as_json, how, lines):
    """Prints the result `res`: as one JSON object, or as text, a first line naming torch's
    version (`res["torch_version"]`), `how` it ran, python's version and the cpus, then
    `lines`."""
    if as_json:
        print_json(res)
        return
    print("framework        pytorch %s%s (python %s, %d cpus)"
          % (res["torch_version"], how, res["python"], res["cpus"]))
    for line in lines:
        print(line)


def free_loopback_port():
    """A TCP port that was free on 127.0.0.1 a moment ago (for the gloo rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def spawn_ranks(worker, args, nprocs, what):
    """Runs worker(rank, args, port, queue) in nprocs spawned processes that rendezvous on a
    free loopback port. Returns (None, rank 0's result) or (exit status, None) after printing
    a failed worker's traceback and one plain 'error: a <what> worker failed' line.

    The workers never outlive this call: if the parent is stopped by SIGTERM (`timeout`,
    `kill`) or SIGINT, or fails, the workers still running are killed. (torch only sends
    them SIGINT when the parent dies, which a worker blocked in C++ never acts on: such
    orphans used to stay behind, with a busy thread, and slow every later run.)"""
    import signal

    import torch.multiprocessing as mp

    port = free_loopback_port()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    procs = None
    try:
        procs = mp.start_processes(worker, args=(args, port, queue), nprocs=nprocs,
                                   join=False, start_method="spawn")
        while not procs.join():
            pass
    except Exception as err:  # a worker failed: its traceback, then one plain line
        text = str(err).strip()
        sys.stderr.write(text + "\n")
        sys.stderr.write("error: a %s worker failed: %s\n"
                         % (what, text.splitlines()[-1] if text else type(err).__name__))
        return 1, None
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in procs.processes if procs is not None else ():
            if p.is_alive():
                p.kill()
                p.join()
    if queue.empty():
        sys.stderr.write("error: rank 0 returned no result\n")
        return 1, None
    return None, queue.get()


def join_loopback_group(rank, world, port, threads, timeout_s):
    """Joins this spawned process to a gloo process group on 127.0.0.1 with `threads`
    compute threads; returns torch.distributed."""
    torch = import_torch()
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # gloo picks its interface from the hostname unless told: keep every byte on loopback.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist


def leave_loopback_group(keep, timeout_s):
    """Destroys the process group of join_loopback_group without the teardown deadlock of
    torch 1.13; call it last in the worker (in a `finally`), with `keep` the list of every
    tensor this rank handed to a gloo collective, still referenced.

    The deadlock (pytorch/pytorch#56297): ~ProcessGroupGloo runs with the GIL held (the
    Python binding does not release it) and joins gloo's worker threads. A worker thread
    drops its reference to a finished collective's tensors only after the caller's wait()
    has returned; if the caller meanwhile dropped the Python tensor, the tensor's PyObject
    is kept alive by the C++ side, and the worker thread's final drop must take the GIL to
    free it. Destructor joining the thread with the GIL, thread waiting for the GIL: the
    rank hangs forever, at exit, after its results were sent (with DDP the destructor runs
    from the Reducer's when the model is freed). It is a race between the two threads, so
    it shows up more often with more processes than cores.

    Rule kept here: every tensor given to a collective outlives the group, so no gloo
    thread ever frees a Python object. The caller's other objects holding the group (a DDP
    model) must be gone by now; gc.collect() clears any left in reference cycles, so the
    group is destroyed here, in destroy_process_group, while `keep` is still held. A
    watchdog (faulthandler: no GIL needed) stays armed to the end: should the process still
    hang in teardown or exit after timeout_s, it prints every thread's Python stack and
    exits with status 1, so the parent reports a failed worker instead of waiting forever.
    """
    import torch.distributed as dist

    faulthandler.dump_traceback_later(timeout_s, exit=True)
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
    del keep[:]  # gloo's threads are joined: freeing these is ordinary now
