"""What the DDP examples share: flags, MNIST from IDX files or synthetic data, the
training loop with Gloo's all-reduce or Syncopate's hook, and the final line.

Run an example with torchrun, e.g.
    torchrun --nproc_per_node 2 examples/torch/lenet_ddp.py --backend syncopate
"""

import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MNIST = os.path.join(HERE, "..", "..", "..", "shared", "data", "mnist")
# The models are those of the PyTorch reference baselines (bench/reference), which are those
# of Syncopate's own model zoo.
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "reference"))
from reference_common import INPUT_SHAPES, build_model  # noqa: E402


class Transformer(torch.nn.Module):
    """A GPT-2-small-sized causal language model (12 layers of width 768, 12 heads, a
    32,000-token vocabulary, tied embeddings): about 110M parameters."""

    def __init__(self, vocab=32000, width=768, layers=12, heads=12, context=1024):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Embedding(context, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True,
            norm_first=True,
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, tokens):
        n = tokens.shape[1]
        h = self.embed(tokens) + self.position(torch.arange(n, device=tokens.device))
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), 1)
        h = self.norm(self.blocks(h, mask=mask.to(h.dtype)))
        return h @ self.embed.weight.t()


def model(name):
    """The reference model `name`, initialised from seed 0 (the same on every rank)."""
    torch.manual_seed(0)
    if name == "transformer":
        return Transformer()
    return build_model(name)


def parse_args(description, default_steps):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--backend", choices=["gloo", "syncopate"], default="syncopate",
                   help="who all-reduces DDP's gradient buckets")
    p.add_argument("--steps", type=int, default=default_steps, help="training steps")
    p.add_argument("--batch", type=int, default=32, help="batch size per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default=DEFAULT_MNIST,
                   help="folder of MNIST's IDX .gz files (train-images-idx3-ubyte.gz, ...)")
    p.add_argument("--synthetic", action="store_true",
                   help="random images and labels instead of MNIST")
    p.add_argument("--save", help="write the final weights here (rank 0, .npy)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the model trains (cuda: GPU LOCAL_RANK modulo the GPUs "
                   "there are, so several ranks may share one)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="the model's (and so the gradient buckets') dtype (bf16 needs a "
                   "torch whose Gloo handles bfloat16: 2.x, not 1.13)")
    return p.parse_args()


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4 : 4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def dataset(args, shape):
    """Training images (N x channels x size x size, float32) and labels: MNIST padded to the
    size and repeated over the channels, or synthetic."""
    channels, size, _ = shape
    if args.synthetic:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(4096, channels, size, size, generator=g)
        return x, torch.randint(0, 10, (4096,), generator=g)
    images = _idx(os.path.join(args.data, "train-images-idx3-ubyte.gz"))
    labels = _idx(os.path.join(args.data, "train-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    if size != x.shape[-1]:
        pad = (size - x.shape[-1]) // 2
        x = torch.nn.functional.pad(x, (pad, size - x.shape[-1] - pad) * 2)
    x = ((x - 0.1307) / 0.3081).expand(-1, channels, -1, -1)
    return x, torch.from_numpy(labels.astype(np.int64))


def run(args, name):
    """Trains the reference model `name` with DDP for args.steps steps; rank 0 prints samples/s and the final
    loss as `RESULT backend=... samples_per_s=... final_loss=...`."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if name == "transformer":
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 32000, (256, 65), generator=g)
        x, y = tokens[:, :-1], tokens[:, 1:]
    else:
        x, y = dataset(args, INPUT_SHAPES[name])
        x = x.to(dtype)
    x, y = x.to(device), y.to(device)
    net = model(name).to(device, dtype)
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    state = None
    if args.backend == "syncopate":
        import syncopate.torch

        state = syncopate.torch.SyncopateState()
        ddp.register_comm_hook(state, syncopate.torch.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    n = x.shape[0]
    warmup = min(5, args.steps // 5)
    start = None
    for step in range(args.steps):
        if step == warmup:
            start = time.perf_counter()
        # Each rank its own shard of every global batch, the same order on every run.
        first = ((step * world + rank) * args.batch) % (n - args.batch)
        xb, yb = x[first : first + args.batch], y[first : first + args.batch]
        opt.zero_grad()
        out = ddp(xb)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), yb.reshape(-1))
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    losses = torch.tensor([loss.item()])
    dist.all_reduce(losses)
    if rank == 0:
        rate = (args.steps - warmup) * args.batch * world / elapsed
        print(f"RESULT backend={args.backend} processes={world} samples_per_s={rate:.1f} "
              f"final_loss={losses.item() / world:.6f}", flush=True)
        if args.save:
            flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in net.parameters()])
            np.save(args.save, flat.numpy())
    if state is not None:
        state.close()
    dist.destroy_process_group()
