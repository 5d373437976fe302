"""DiLoCo and local SGD for a torch training loop, over Syncopate's ring.

``DiLoCo(model, optimizer, every=16, outer_lr=0.7, outer_momentum=0.9)`` wraps the inner
optimizer: call its ``step()`` where you called ``optimizer.step()``. Every ``every`` inner
steps it takes an outer step, with core's own outer optimizer (the native
``OuterNesterov``, the arithmetic of ``syncopate launch --strategy diloco``):

    d      = mean over the ranks of (anchor - weights)      # the ring's all-reduce
    v      = outer_momentum * v + d
    anchor = anchor - outer_lr * (d + outer_momentum * v)   # Nesterov, as SGD(nesterov=True)

and every rank goes on from the new anchor. ``LocalSGD`` is the same with ``outer_lr=1`` and
no momentum: the weights' plain average every ``every`` steps. The model is trained without
DDP (each rank on its own data); the wrapper's ``state_dict()`` holds the outer optimizer's
anchor and momentum, the step count and the inner optimizer's state, so a checkpoint
resumes exactly.
"""

import torch

from .. import _native
from .hook import SyncopateState, _wait


class DiLoCo:
    """DiLoCo's outer loop around ``optimizer`` (the inner optimizer of ``model``).

    ``state``: the ``SyncopateState`` whose ring averages the outer gradient (default: a new
    one, built as ``SyncopateState()`` is, after ``init_process_group``). At construction
    the ranks' weights are averaged, so every rank starts from the same anchor (identical
    if they were initialised alike).
    """

    def __init__(self, model, optimizer, every=16, outer_lr=0.7, outer_momentum=0.9, state=None):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.model = model
        self.optimizer = optimizer
        self.every = every
        self.outer_lr = outer_lr
        self.outer_momentum = outer_momentum
        self.state = state if state is not None else SyncopateState()
        self.inner_steps = 0
        self._params = [p for p in model.parameters()]
        for p in self._params:
            if p.dtype != torch.float32:
                raise TypeError(f"syncopate.torch.DiLoCo: parameters must be float32, not {p.dtype}")
        numel = sum(p.numel() for p in self._params)
        self._outer = _native.OuterNesterov(numel, float(outer_lr), float(outer_momentum))
        flat = self._flat()
        _wait(self.state.allreduce(flat))
        self._install(flat)
        self._outer.set_anchor(flat.data_ptr())

    def _flat(self):
        """The parameters as one contiguous float32 CPU tensor (a copy)."""
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in self._params])

    def _install(self, flat):
        with torch.no_grad():
            offset = 0
            for p in self._params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n

    def zero_grad(self, *args, **kwargs):
        """The inner optimizer's ``zero_grad``."""
        return self.optimizer.zero_grad(*args, **kwargs)

    def step(self, closure=None):
        """The inner optimizer's step; every ``every``-th, then the outer step (which waits
        for the ring). Returns what the inner step returned."""
        loss = self.optimizer.step() if closure is None else self.optimizer.step(closure)
        self.inner_steps += 1
        if self.inner_steps % self.every == 0:
            self.outer_step()
        return loss

    def outer_step(self):
        """The outer step now: the mean outer gradient over the ring, then Nesterov."""
        flat = self._flat()
        self._outer.outer_gradient(flat.data_ptr())
        _wait(self.state.allreduce(flat))
        self._outer.step(flat.data_ptr())
        self._install(flat)

    def state_dict(self):
        """The inner optimizer's state, the step count, the settings and the outer
        optimizer's anchor and momentum (float32 tensors)."""
        anchor = torch.empty(self._outer.numel, dtype=torch.float32)
        momentum = torch.empty(self._outer.numel, dtype=torch.float32)
        self._outer.state_into(anchor.data_ptr(), momentum.data_ptr())
        return {
            "optimizer": self.optimizer.state_dict(),
            "inner_steps": self.inner_steps,
            "every": self.every,
            "outer_lr": self.outer_lr,
            "outer_momentum": self.outer_momentum,
            "anchor": anchor,
            "momentum": momentum,
        }

    def load_state_dict(self, state_dict):
        """Restores what ``state_dict()`` gave (refuses another model's)."""
        anchor = state_dict["anchor"].to("cpu", torch.float32).contiguous()
        momentum = state_dict["momentum"].to("cpu", torch.float32).contiguous()
        if anchor.numel() != self._outer.numel or momentum.numel() != self._outer.numel:
            raise ValueError(
                f"a DiLoCo state of {anchor.numel()} values for a model of {self._outer.numel}"
            )
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.inner_steps = int(state_dict["inner_steps"])
        self.every = int(state_dict["every"])
        self._outer.restore_from(anchor.data_ptr(), momentum.data_ptr())


class LocalSGD(DiLoCo):
    """Local SGD: every ``every`` inner steps, the ranks' weights' plain average (DiLoCo with
    ``outer_lr=1`` and no momentum)."""

    def __init__(self, model, optimizer, every=16, state=None):
        super().__init__(model, optimizer, every=every, outer_lr=1.0, outer_momentum=0.0, state=state)
