#!/usr/bin/python3
"""Times one training step of PyTorch's MNIST-example LeNet (or an MLP, or ResNet-20) on the CPU.

Measures, on one process with `--threads` intra-op threads:
  fwd_bwd: forward + cross-entropy loss + backward (gradients zeroed outside the timing)
  step:    zero_grad + forward + loss + backward + SGD(lr 0.05, momentum 0.9) step
on a fixed batch of random inputs of the model's shape (1x28x28; ResNet-20 3x32x32). Prints
median, p10 and p90 in milliseconds.

Run with Debian's Python (see scripts/install-reference.sh):
  /usr/bin/python3 bench/reference/torch_lenet_step.py --threads 2 --iters 200 [--json]
"""

import argparse
import os
import platform
import sys
import time

sys.dont_write_bytecode = True  # keep bench/reference free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_common as rc  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=rc.MODELS, default="lenet")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--iters", type=int, default=200, help="timed iterations per phase (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed iterations per phase (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    a = p.parse_args(argv)
    for name in ("threads", "batch", "iters"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name)
    if a.warmup < 0:
        p.error("--warmup must be at least 0")
    return a


def main(argv=None):
    args = parse_args(argv)
    torch = rc.import_torch()
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = rc.build_model(args.model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(args.batch, *rc.INPUT_SHAPES[args.model])
    y = torch.randint(0, 10, (args.batch,))

    def fwd_bwd():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    # Phase 1: forward + backward only. Gradients are cleared before the clock starts.
    for _ in range(args.warmup):
        model.zero_grad(set_to_none=True)
        fwd_bwd()
    fb = []
    for _ in range(args.iters):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        fwd_bwd()
        fb.append(time.perf_counter() - t0)

    # Phase 2: the full training step, as a training loop runs it.
    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd_bwd()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    st = []
    loss = None
    for _ in range(args.iters):
        t0 = time.perf_counter()
        loss = step()
        st.append(time.perf_counter() - t0)
    loss = float(loss.detach())

    fb_med, fb_p10, fb_p90 = rc.summary_ms(fb)
    st_med, st_p10, st_p90 = rc.summary_ms(st)
    samples_per_sec = args.batch / (st_med / 1000.0)
    result = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "model": args.model,
        "params": rc.count_params(model),
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "iters": args.iters,
        "warmup": args.warmup,
        "fwd_bwd_ms_median": rc.r4(fb_med),
        "fwd_bwd_ms_p10": rc.r4(fb_p10),
        "fwd_bwd_ms_p90": rc.r4(fb_p90),
        "step_ms_median": rc.r4(st_med),
        "step_ms_p10": rc.r4(st_p10),
        "step_ms_p90": rc.r4(st_p90),
        "samples_per_sec": round(samples_per_sec, 1),
        "final_loss": rc.r4(loss),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    rc.print_report(result, args.json, "", [
        "model            %s (%d parameters), batch %d, threads %d"
        % (args.model, result["params"], args.batch, result["threads"]),
        "iterations       %d timed after %d warm-up, per phase" % (args.iters, args.warmup),
        "fwd+bwd   ms     median %9.3f  p10 %9.3f  p90 %9.3f" % (fb_med, fb_p10, fb_p90),
        "step      ms     median %9.3f  p10 %9.3f  p90 %9.3f" % (st_med, st_p10, st_p90),
        "throughput       %.1f samples/s (batch / median step)" % samples_per_sec,
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main())
