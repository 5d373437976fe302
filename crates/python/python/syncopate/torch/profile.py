"""Profiling a PyTorch model into a Syncopate compute profile.

:func:`profile` runs a few training steps (forward, loss, backward; no optimizer step) with
module hooks and writes what ``syncopate simulate --model profile:PATH`` and ``syncopate
launch --model profile:PATH`` replay: every trainable parameter tensor as a key, grouped by the
module that owns it, layers in the order the forward pass first calls them (so the keys'
gradients become ready in the reverse order, as DDP's buckets see them), and each layer's
forward and backward time on this machine (median over the timed steps).

How the times are taken. The forward time of a module is the time from its forward pre-hook
to the next hooked module's pre-hook (the last one's runs to the end of the loss), so the
functional operations between modules (``F.relu``, residual additions, ``flatten``) are
counted with the module before them and the layers add up to the whole forward pass. The
backward time is cut the same way from the backward timeline: each module's forward post-hook
puts a hook on the autograd node that made its output (``grad_fn.register_hook``), which fires
when that node's backward has run, that is when the module's backward ends; a module's
backward runs from the previous such moment (the last layer's from the start of
``backward()``, so it holds the loss's backward) to its own, and the first layer's also holds
what runs after it. So the backward of the functional operations after a module is counted
with the module too, as in the forward pass, and the layers add up to the whole backward pass.

Why not ``register_full_backward_hook``: torch 1.13 has no backward pre-hooks, and full backward
hooks wrap a module's inputs and outputs in extra autograd nodes and fail on modules followed
by in-place operations (``ReLU(inplace=True)`` after a convolution). Tensor hooks on outputs
fire at the wrong moment where the output is later modified in place. A hook on the output's
node is neither: it is exact for modules that are one autograd node (convolution, linear,
batch norm, activation, pooling); a module of several nodes has the backward of all but its
output node counted with the layer before it. It assumes one backward thread, which is what
the CPU engine runs.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..profile_format import Layer, Profile

__all__ = ["profile", "build_profile"]


def _first_tensor(value: Any) -> Optional[torch.Tensor]:
    """The first tensor in a (nested) tuple, list or dict, or ``value`` itself."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, dict) else value
    if isinstance(items, (tuple, list)) or isinstance(value, dict):
        for item in items:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _split_batch(example_batch: Any) -> Tuple[Any, Any]:
    """(inputs, target): a pair is (inputs, target), anything else is the inputs alone."""
    if isinstance(example_batch, (tuple, list)) and len(example_batch) == 2:
        return example_batch[0], example_batch[1]
    return example_batch, None


def _default_loss(output: Any, target: Any) -> torch.Tensor:
    """Cross-entropy for class targets (or, without a target, for classes 0 of a 2-D
    output), mean squared error for float targets, else the output's sum."""
    out = _first_tensor(output)
    if out is None:
        raise ValueError("the model's output holds no tensor to take a loss of")
    if target is None and out.dim() == 2 and out.is_floating_point():
        target = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
    if target is None:
        return out.float().sum()
    if not target.is_floating_point():
        return torch.nn.functional.cross_entropy(out, target)
    return torch.nn.functional.mse_loss(out, target)


def _hooked_modules(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    """Modules that get hooks: every leaf module, and every module that owns parameters
    directly (so that each parameter belongs to exactly one hooked module)."""
    hooked = []
    for name, module in model.named_modules():
        is_leaf = next(module.children(), None) is None
        owns = next(module.parameters(recurse=False), None) is not None
        if is_leaf or owns:
            hooked.append((name or type(module).__name__.lower(), module))
    return hooked


def _op(module: torch.nn.Module) -> str:
    """The module as profiled, on one line (a leaf's repr, else its class)."""
    if next(module.children(), None) is None:
        return " ".join(repr(module).split())
    return f"{type(module).__name__}(...)"


class _Recorder:
    """Hooks on the modules that record when each one's forward and backward begin."""

    def __init__(self, modules: List[Tuple[str, torch.nn.Module]]):
        self.forward: List[Tuple[int, int]] = []  # (ns, module index)
        self.backward: List[Tuple[int, int]] = []
        self.handles = []
        for index, (_, module) in enumerate(modules):
            self.handles.append(module.register_forward_pre_hook(self._pre(index)))
            self.handles.append(module.register_forward_hook(self._post(index)))

    def _pre(self, index: int) -> Callable:
        def hook(_module, _inputs):
            self.forward.append((time.perf_counter_ns(), index))

        return hook

    def _post(self, index: int) -> Callable:
        def on_backward_done(_grad_inputs, _grad_outputs):
            self.backward.append((time.perf_counter_ns(), index))

        def hook(_module, _inputs, output):
            out = _first_tensor(output)
            if out is not None and out.grad_fn is not None and torch.is_grad_enabled():
                out.grad_fn.register_hook(on_backward_done)

        return hook

    def clear(self) -> None:
        self.forward.clear()
        self.backward.clear()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _segments_from(events: List[Tuple[int, int]], start: int, end: int, count: int) -> List[int]:
    """Splits ``start..end`` at each event, crediting each stretch to the event that begins
    it (the stretch before the first event to the first event's module): ns per module."""
    totals = [0] * count
    bounds = [start] + [t for t, _ in events[1:]] + [end]
    for (_, index), a, b in zip(events, bounds, bounds[1:]):
        totals[index] += max(0, b - a)
    return totals


def _segments_to(events: List[Tuple[int, int]], start: int, end: int, count: int) -> List[int]:
    """Splits ``start..end`` at each event, crediting each stretch to the event that ends it
    (the stretch after the last event to the last event's module): ns per module."""
    totals = [0] * count
    bounds = [start] + [t for t, _ in events[:-1]] + [end]
    for (_, index), a, b in zip(events, bounds, bounds[1:]):
        totals[index] += max(0, b - a)
    return totals


def _step(model, inputs, target, loss_fn, recorder) -> Tuple[List[int], List[int], int]:
    """One forward, loss and backward: per-module forward and backward ns, and the step's."""
    count = len(recorder.handles) // 2
    recorder.clear()
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter_ns()
    output = model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)
    loss = loss_fn(output) if target is None else loss_fn(output, target)
    t1 = time.perf_counter_ns()
    loss.backward()
    t2 = time.perf_counter_ns()
    forward = _segments_from(sorted(recorder.forward), t0, t1, count)
    backward = _segments_to(sorted(recorder.backward), t1, t2, count)
    return forward, backward, t2 - t0


def _layers(modules, forward_order: List[int], fwd_ms, bwd_ms) -> List[Layer]:
    """The layers in forward order (modules never called first, with no time), each with the
    trainable tensors it owns that no earlier layer owns (shared ones count once)."""
    called = set(forward_order)
    order = [i for i in range(len(modules)) if i not in called] + forward_order
    seen, layers = set(), []
    for i in order:
        name, module = modules[i]
        tensors = []
        for p in module.parameters(recurse=False):
            if p.requires_grad and id(p) not in seen and p.numel() > 0:
                seen.add(id(p))
                tensors.append(int(p.numel()))
        layers.append(Layer(name, _op(module), fwd_ms[i], bwd_ms[i], tensors))
    return layers


def build_profile(
    model: torch.nn.Module,
    example_batch: Any,
    *,
    steps: int = 5,
    warmup: int = 2,
    loss_fn: Optional[Callable] = None,
    name: Optional[str] = None,
) -> Profile:
    """Measures ``model`` on ``example_batch`` (see :func:`profile`) and returns the profile
    without writing it."""
    if steps < 1 or warmup < 0:
        raise ValueError("steps must be >= 1 and warmup >= 0")
    inputs, target = _split_batch(example_batch)
    first = _first_tensor(inputs)
    if first is None or first.dim() == 0:
        raise ValueError("the example batch holds no batched input tensor")
    modules = _hooked_modules(model)
    buffers = {k: b.detach().clone() for k, b in model.named_buffers()}
    was_training = model.training
    model.train()
    if loss_fn is None:
        loss_fn = _default_loss if target is not None else lambda out: _default_loss(out, None)
    recorder = _Recorder(modules)
    try:
        runs = [
            _step(model, inputs, target, loss_fn, recorder)
            for _ in range(warmup + steps)
        ][warmup:]
        forward_order = list(dict.fromkeys(i for _, i in sorted(recorder.forward)))
    finally:
        recorder.remove()
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        with torch.no_grad():  # profiling must not move batch-norm statistics
            for k, b in model.named_buffers():
                b.copy_(buffers[k])

    def median_ms(which: int, i: int) -> float:
        # Whole nanoseconds, as the file holds them, so a profile reads back equal.
        return round(statistics.median(run[which][i] for run in runs) / 1e6, 6)

    count = len(modules)
    fwd = [median_ms(0, i) for i in range(count)]
    bwd = [median_ms(1, i) for i in range(count)]
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    step_ms = statistics.median(run[2] for run in runs) / 1e6
    comments = [
        f"measured by syncopate.torch.profile: torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), device {first.device}, median of {steps} "
        f"steps after {warmup} warm-up; step {step_ms:.3f} ms",
    ]
    if frozen:
        comments.append(f"frozen parameters (not synchronised, not keys): {frozen}")
    return Profile(
        name=name or type(model).__name__.lower(),
        layers=_layers(modules, forward_order, fwd, bwd),
        batch_size=int(first.shape[0]),
        comments=comments,
    )


def profile(
    model: torch.nn.Module,
    example_batch: Any,
    path,
    *,
    steps: int = 5,
    warmup: int = 2,
    loss_fn: Optional[Callable] = None,
) -> Profile:
    """Profiles ``model`` and writes the profile to ``path``; returns it.

    ``example_batch`` is the model's input tensor, or an ``(inputs, target)`` pair where
    ``inputs`` is a tensor or a tuple of the model's positional inputs; the first dimension of
    the first input tensor is the batch size. ``loss_fn(output, target)`` (or ``loss_fn(output)`` without a target) makes the
    loss; by default cross-entropy for class targets and for 2-D outputs without a target,
    mean squared error for float targets, else the output's sum. ``warmup`` steps run first,
    then ``steps`` timed ones. The model's weights are not changed (no optimizer step) and its
    buffers (batch-norm statistics) and training mode are restored.
    """
    result = build_profile(model, example_batch, steps=steps, warmup=warmup, loss_fn=loss_fn)
    result.write(path)
    return result
