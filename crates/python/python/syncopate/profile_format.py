"""Reading and writing Syncopate compute profiles, without PyTorch.

A profile is PipeDream's ``graph.txt`` text format with Syncopate's two extensions, the same
format that ``syncopate simulate --model profile:PATH`` and ``syncopate launch --model
profile:PATH`` read (the Rust parser in ``syncopate_core::profile`` is the reference)::

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

import heapq
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = ["Layer", "Profile", "ProfileFormatError", "parse", "read"]

_SEP = " -- "
_COUNT_MAX = 2**53  # integers are exact in a float64 below this, as the Rust parser requires


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


def _number(line: int, key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if not (v >= 0.0 and v < float("inf")):
        raise ProfileFormatError(line, f"bad number for `{key}`: '{value}'")
    return v


def _count(line: int, key: str, value: str, positive: bool = False) -> int:
    v = _number(line, key, value)
    if v != int(v) or v >= _COUNT_MAX or (positive and v == 0):
        raise ProfileFormatError(line, f"bad number for `{key}`: '{value}'")
    return int(v)


def _node(line: int, text: str) -> Layer:
    first, last = text.find(_SEP), text.rfind(_SEP)
    if first < 0 or first >= last:
        raise ProfileFormatError(line, "expected `name -- op -- metrics`")
    name = text[:first].strip()
    if not name or re.search(r"\s", name):
        raise ProfileFormatError(line, "bad node name")
    metrics: Dict[str, str] = {}
    for item in (i.strip() for i in text[last + len(_SEP) :].split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ProfileFormatError(line, f"metric '{item}' is not key=value")
        key, value = item.split("=", 1)
        metrics[key.strip()] = value
    for key in ("forward_compute_time", "backward_compute_time", "parameter_size"):
        if key not in metrics:
            raise ProfileFormatError(line, f"missing field `{key}`")
    size = _count(line, "parameter_size", metrics["parameter_size"])
    if size % 4:
        raise ProfileFormatError(line, f"parameter_size {size} is not a multiple of 4 bytes")
    tensors = [size // 4] if size else []
    if "parameter_tensors" in metrics:
        sizes = metrics["parameter_tensors"].split(";")
        tensors = [_count(line, "parameter_tensors", s, positive=True) for s in sizes]
        if sum(tensors) != size // 4:
            raise ProfileFormatError(
                line,
                f"parameter_tensors sum to {sum(tensors)} values, "
                f"parameter_size holds {size // 4}",
            )
    return Layer(
        name=name,
        op=text[first + len(_SEP) : last].strip(),
        forward_ms=_number(line, "forward_compute_time", metrics["forward_compute_time"]),
        backward_ms=_number(line, "backward_compute_time", metrics["backward_compute_time"]),
        tensors=tensors,
    )


def _order_key(name: str) -> Tuple[float, str]:
    m = re.search(r"\d+$", name)
    return (int(m.group()) if m else float("inf"), name)


def _execution_order(nodes: List[Tuple[int, Layer]], edges) -> List[Layer]:
    index = {layer.name: i for i, (_, layer) in enumerate(nodes)}
    successors: List[List[int]] = [[] for _ in nodes]
    in_degree = [0] * len(nodes)
    for line, a, b in edges:
        for n in (a, b):
            if n not in index:
                raise ProfileFormatError(line, f"edge to unknown node '{n}'")
        successors[index[a]].append(index[b])
        in_degree[index[b]] += 1
    ready = [(_order_key(nodes[i][1].name), i) for i in range(len(nodes)) if not in_degree[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(nodes[i][1])
        for j in successors[i]:
            in_degree[j] -= 1
            if not in_degree[j]:
                heapq.heappush(ready, (_order_key(nodes[j][1].name), j))
    stuck = [i for i in range(len(nodes)) if in_degree[i]]
    if stuck:
        line, layer = nodes[stuck[0]]
        raise ProfileFormatError(line, f"node '{layer.name}' is on or after a cycle in the graph")
    return order


def parse(text: str, name: str = "profile") -> Profile:
    """Parses a profile's text; ``name`` is used where the text has no ``# model:`` line."""
    nodes: List[Tuple[int, Layer]] = []
    edges: List[Tuple[int, str, str]] = []
    headers: Dict[str, Tuple[int, int]] = {}
    comments: List[str] = []
    names = set()
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if raw.startswith("#"):
            key, _, value = raw[1:].partition(":")
            key = key.strip()
            if key in ("batch_size", "parameters"):
                if key in headers:
                    raise ProfileFormatError(line, f"second `{key}` header")
                headers[key] = (line, _count(line, key, value))
            elif key == "model" and value.strip():
                name = value.strip()
            else:
                comments.append(raw[1:].strip())
        elif raw.startswith("\t"):
            a, sep, b = raw.strip().partition(_SEP)
            if not sep:
                raise ProfileFormatError(line, "edge is not `\\tnodeA -- nodeB`")
            edges.append((line, a.strip(), b.strip()))
        else:
            layer = _node(line, raw)
            if layer.name in names:
                raise ProfileFormatError(line, f"duplicate node '{layer.name}'")
            names.add(layer.name)
            nodes.append((line, layer))
    if not nodes:
        raise ProfileFormatError(0, "profile has no nodes")
    batch = headers.get("batch_size")
    profile = Profile(name, _execution_order(nodes, edges), batch[1] if batch else None, comments)
    if "parameters" in headers:
        line, total = headers["parameters"]
        if total != profile.param_count:
            raise ProfileFormatError(
                line, f"header says {total} parameters, the layers hold {profile.param_count}"
            )
    return profile


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
