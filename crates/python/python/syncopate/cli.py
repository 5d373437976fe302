"""``syncopate-profile``: profile a PyTorch model given as ``module:function``.

    syncopate-profile mypkg.models:resnet20 --batch-size 32 --input-shape 3x32x32 \\
        --out resnet20.graph.txt

imports ``function`` from ``module`` (the current directory is on the import path), calls it
with no arguments and profiles what it returns: a model, or a ``(model, example_batch)`` pair
(``example_batch`` as :func:`syncopate.torch.profile.profile` takes it). With a model alone the
batch is random: ``--batch-size`` inputs of ``--input-shape``, and class targets below
``--classes`` where the model's output is 2-D. Then ``syncopate simulate --model
profile:resnet20.graph.txt`` replays it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional


def _parse_shape(text: str) -> List[int]:
    try:
        dims = [int(d) for d in text.lower().split("x")]
    except ValueError:
        dims = []
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"'{text}' is not a shape like 3x32x32")
    return dims


def _arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncopate-profile",
        description="Profile a PyTorch model into a Syncopate compute profile "
        "(for syncopate simulate/launch --model profile:PATH).",
    )
    parser.add_argument("target", help="module:function returning a model or (model, batch)")
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per step (default 32)")
    parser.add_argument("--input-shape", type=_parse_shape, help="one input's shape, e.g. 3x32x32")
    parser.add_argument("--classes", type=int, default=10, help="class count of random targets")
    parser.add_argument("--out", required=True, help="profile file to write (NAME.graph.txt)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads before profiling")
    return parser


def _load(target: str):
    module_name, sep, function_name = target.partition(":")
    if not sep or not module_name or not function_name:
        raise SystemExit(f"syncopate-profile: '{target}' is not module:function")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SystemExit(f"syncopate-profile: cannot import {module_name}: {e}") from e
    function = getattr(module, function_name, None)
    if not callable(function):
        raise SystemExit(f"syncopate-profile: {module_name} has no function {function_name}")
    return function()


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``syncopate-profile``; returns the exit status."""
    args = _arguments().parse_args(argv)
    import torch

    from .torch.profile import build_profile

    if args.threads:
        torch.set_num_threads(args.threads)
    made = _load(args.target)
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        model, batch = made
    elif isinstance(made, torch.nn.Module):
        if args.input_shape is None:
            raise SystemExit("syncopate-profile: the function returns no batch: give --input-shape")
        inputs = torch.randn(args.batch_size, *args.input_shape)
        was_training = made.training
        made.eval()  # a probe of the output's shape that leaves batch-norm statistics alone
        with torch.no_grad():
            out = made(inputs)
        made.train(was_training)
        batch = inputs
        if isinstance(out, torch.Tensor) and out.dim() == 2:
            batch = (inputs, torch.randint(0, min(args.classes, out.shape[1]), (args.batch_size,)))
        model = made
    else:
        raise SystemExit("syncopate-profile: the function must return a torch.nn.Module "
                         "or a (module, example_batch) pair")
    name = os.path.basename(args.out)
    for suffix in (".graph.txt", ".txt"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    profile = build_profile(model, batch, steps=args.steps, warmup=args.warmup, name=name)
    profile.write(args.out)
    print(
        f"{args.out}: {len(profile.layers)} layers, {len(profile.keys())} parameter tensors, "
        f"{profile.param_count} parameters, batch {profile.batch_size}, "
        f"forward {profile.forward_ms:.3f} ms, backward {profile.backward_ms:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
