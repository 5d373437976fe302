"""One big bucket end to end: the time Gloo's all_reduce and Syncopate's hook path
(``SyncopateState.allreduce(...).wait()``, with frame MACs and without) take to average one
tensor, on every rank:

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 bucket_bench.py --mb 100 &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 bucket_bench.py --mb 100

Rank 0 prints the median seconds of each (and GB/s of the bucket's bytes). ``--device cuda``
puts the bucket on the GPU (every rank on GPU 0 when there is one), as DDP's buckets of a
model on the GPU are; the time then includes the copies to and from the GPU.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import syncopate.torch

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--mb", type=float, default=100.0, help="bucket size in MB (of its dtype)")
p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
p.add_argument("--reps", type=int, default=5)
p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
args = p.parse_args()
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
dist.init_process_group("gloo")
rank = dist.get_rank()
numel = int(args.mb * 1e6 / torch.tensor([], dtype=dtype).element_size())
device = torch.device(args.device)
if args.device == "cuda":
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
t = torch.ones(numel, dtype=dtype, device=device) * (rank + 1)


def synchronize():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


states = {
    "syncopate": syncopate.torch.SyncopateState(),
    "no-MACs": syncopate.torch.SyncopateState(port_offset=2, frame_mac=False),
}
times = {"gloo": [], "syncopate": [], "no-MACs": []}
# torch 1.x's Gloo has no bfloat16 (and a failed attempt leaves its links out of step).
gloo = dtype != torch.bfloat16 or int(torch.__version__.split(".")[0]) >= 2
if not gloo and rank == 0:
    print(f"gloo: no bfloat16 in torch {torch.__version__}'s Gloo", flush=True)
for _ in range(args.reps):
    dist.barrier()
    if gloo:
        start = time.perf_counter()
        dist.all_reduce(t)
        synchronize()
        times["gloo"].append(time.perf_counter() - start)
    for name, state in states.items():
        dist.barrier()
        start = time.perf_counter()
        state.allreduce(t).wait()
        synchronize()
        times[name].append(time.perf_counter() - start)
if rank == 0:
    for name, ts in times.items():
        if not ts:
            continue
        s = statistics.median(ts)
        print(f"{name:10s} {args.mb:.0f} MB {args.dtype} {args.device}: {s * 1e3:8.1f} ms  {args.mb / 1e3 / s:6.2f} GB/s", flush=True)
for state in states.values():
    state.close()
dist.destroy_process_group()
