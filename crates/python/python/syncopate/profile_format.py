"""Reading and writing Syncopate compute profiles, without PyTorch.

A profile is PipeDream's ``graph.txt`` text format with Syncopate's two extensions, the same
format that ``syncopate simulate --model profile:PATH`` and ``syncopate launch --model
profile:PATH`` read. Reading goes through that very parser (``syncopate_core::profile``, in
the native module); writing is this module's (:meth:`Profile.to_text`)::

    # model: resnet20
    # batch_size: 32
    # parameters: 272474
    conv1 -- Conv2d(3, 16, ...) -- forward_compute_time=0.412000, backward_compute_time=0.830000, parameter_size=1728
    bn1 -- BatchNorm2d(16, ...) -- forward_compute_time=0.101000, backward_compute_time=0.120000, parameter_size=128, parameter_tensors=16;16
    ...
    \tconv1 -- bn1

- a node line is ``name -- op -- metrics``: times in milliseconds, ``parameter_size`` in
  bytes of fp32, and ``parameter_tensors=N1;N2`` the sizes of the layer's parameter tensors
  (in values, in the model's order) where it has more than one;
- edge lines (a tab, then ``a -- b``) order the layers: a topological sort of the edges,
  ties broken by the number that ends a node's name;
- ``#`` lines are comments, except the headers ``# batch_size: N`` (the batch the times were
  measured at) and ``# parameters: N`` (the parameter total, checked against the layers).

Keys (parameter tensors) are numbered from the input, as Syncopate numbers them; gradients
become ready in the reverse order (:meth:`Profile.backward_keys`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from . import _native

__all__ = ["Layer", "Profile", "ProfileFormatError", "parse", "read"]

_SEP = " -- "


class ProfileFormatError(ValueError):
    """A profile's text is not in the format; ``line`` is the 1-based line at fault (0: the
    whole text)."""

    def __init__(self, line: int, reason: str):
        super().__init__(f"line {line}: {reason}" if line else reason)
        self.line = line
        self.reason = reason


@dataclass
class Layer:
    """One layer (a module, or a PipeDream graph node) in execution order."""

    name: str
    op: str
    forward_ms: float
    backward_ms: float
    tensors: List[int] = field(default_factory=list)
    """Sizes of the layer's parameter tensors in the model's order; empty: none."""

    @property
    def param_count(self) -> int:
        """The layer's parameters (values), all tensors together."""
        return sum(self.tensors)


@dataclass
class Profile:
    """A model's profile: layers from the input, and the batch the times were measured at."""

    name: str
    layers: List[Layer]
    batch_size: Optional[int] = None
    comments: List[str] = field(default_factory=list)
    """Free comment lines written after the headers (without their ``#``)."""

    def keys(self) -> List[Tuple[int, int]]:
        """The parameter tensors as (layer index, size), numbered from the input: the order
        of ``ModelProfile::keys()`` in Syncopate."""
        return [(i, n) for i, layer in enumerate(self.layers) for n in layer.tensors]

    def backward_keys(self) -> List[Tuple[int, int]]:
        """The keys in the order their gradients become ready (the last layer's first)."""
        return list(reversed(self.keys()))

    @property
    def param_count(self) -> int:
        """The model's parameter total."""
        return sum(layer.param_count for layer in self.layers)

    @property
    def forward_ms(self) -> float:
        """Forward time of one step, all layers."""
        return sum(layer.forward_ms for layer in self.layers)

    @property
    def backward_ms(self) -> float:
        """Backward time of one step, all layers."""
        return sum(layer.backward_ms for layer in self.layers)

    def to_text(self) -> str:
        """The profile in the format (headers, node lines in order, a chain of edges)."""
        _check_writable(self)
        lines = [f"# model: {self.name}"]
        if self.batch_size is not None:
            lines.append(f"# batch_size: {self.batch_size}")
        lines.append(f"# parameters: {self.param_count}")
        lines += [f"# {c}" for c in self.comments]
        for layer in self.layers:
            metrics = (
                f"forward_compute_time={layer.forward_ms:.6f}, "
                f"backward_compute_time={layer.backward_ms:.6f}, "
                f"parameter_size={4 * layer.param_count}"
            )
            if len(layer.tensors) > 1:
                metrics += ", parameter_tensors=" + ";".join(map(str, layer.tensors))
            lines.append(f"{layer.name}{_SEP}{layer.op}{_SEP}{metrics}")
        lines += [f"\t{a.name}{_SEP}{b.name}" for a, b in zip(self.layers, self.layers[1:])]
        return "\n".join(lines) + "\n"

    def write(self, path) -> None:
        """Writes :meth:`to_text` to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_text())


def _check_writable(profile: Profile) -> None:
    """Refuses what would not read back: odd names, ops with line breaks, bad numbers."""
    seen = set()
    for layer in profile.layers:
        if not layer.name or re.search(r"\s", layer.name) or layer.name in seen:
            raise ValueError(f"layer name {layer.name!r} is empty, repeated or has spaces")
        seen.add(layer.name)
        if "\n" in layer.op or "\r" in layer.op:
            raise ValueError(f"layer {layer.name}: op has a line break")
        for t in (layer.forward_ms, layer.backward_ms):
            if not (t >= 0.0 and t < float("inf")):
                raise ValueError(f"layer {layer.name}: time {t} is not finite and >= 0")
        if any(not isinstance(n, int) or n <= 0 for n in layer.tensors):
            raise ValueError(f"layer {layer.name}: tensor sizes must be positive integers")
    if "\n" in profile.name:
        raise ValueError("the profile's name has a line break")


def parse(text: str, name: str = "profile") -> Profile:
    """Parses a profile's text with Syncopate's own parser (``syncopate_core::profile``, the
    one ``simulate`` and ``launch`` read profiles with); ``name`` is used where the text has
    no ``# model:`` line."""
    try:
        parsed = _native.parse_profile(text, name)
    except _native.ProfileError as e:
        line, reason = e.args
        raise ProfileFormatError(line, reason) from None
    layers = [
        Layer(
            name=layer["name"],
            op=layer["op"],
            forward_ms=layer["forward_ns"] / 1e6,
            backward_ms=layer["backward_ns"] / 1e6,
            tensors=list(layer["tensors"]),
        )
        for layer in parsed["layers"]
    ]
    return Profile(parsed["name"], layers, parsed["batch_size"], list(parsed["comments"]))


def read(path) -> Profile:
    """Reads the profile at ``path`` (its name: the file's, less ``.graph.txt``, unless the
    file has a ``# model:`` line)."""
    import os

    with open(path, encoding="utf-8") as f:
        text = f.read()
    base = os.path.basename(str(path))
    for suffix in (".graph.txt", ".txt"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return parse(text, base)
