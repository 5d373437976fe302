"""Syncopate's ring all-reduce in a PyTorch training loop.

``SyncopateState`` forms a Syncopate job beside torch's default process group (the same
ranks, found from the torchrun environment), with Syncopate's own rendezvous,
authentication (a job token), heartbeats and fail-fast. ``allreduce_hook`` is a DDP
communication hook that averages every gradient bucket over that job's ring;
``LocalSgdAverager`` averages a model's parameters every few steps over it.

How a bucket's future completes: the hook hands the bucket's memory (a contiguous CPU
tensor; float32, or float16/bfloat16, sent as they are and added in float32) to the ring's
communication thread, which starts its all-reduce at once, beside the buckets still in
flight, and returns a ``torch.futures.Future``. That native thread reads the values straight
from the tensor and writes the average straight back into it, without the GIL; it takes the
GIL only to complete the future: its result, or its exception (a ``RuntimeError`` whose
message names the rank that failed). DDP waits on the future outside the GIL, so backward
keeps computing while the bucket travels. A bucket on a GPU is staged through pinned host
memory on a side stream, and its future completes on the GPU's timeline (``staging``).

The ring lives as long as the state: its thread keeps the links alive with heartbeats
between collectives, so a rank may spend minutes outside the hook (evaluation, a
checkpoint) without being taken for lost. A collective that does not complete within
``collective_timeout`` seconds (default 30 minutes, Gloo's) fails, naming the rank that did
not enter it.

The job token. Every rank needs the same 64-hex-digit token: ``$SYNCOPATE_TOKEN``, or the
``token`` argument. Without either, rank 0 draws one and sends it to the others over torch's
process group (``broadcast_object_list``), whose channel is not authenticated: anyone who
can reach the process group's store and sockets can read it. Pass
``require_env_token=True`` (or set ``SYNCOPATE_REQUIRE_TOKEN=1``) to refuse that fallback.
"""

import atexit
import os
import threading
import weakref

import torch
import torch.distributed as dist

from .. import _native
from .staging import Stager

#: The rendezvous port is MASTER_PORT plus this, unless a port is given: torch's own store
#: listens on MASTER_PORT.
DEFAULT_PORT_OFFSET = 1

_open_states = weakref.WeakSet()


def _close_open_states():
    for state in list(_open_states):
        state.close()


# The communication thread calls into Python to complete futures: it must be stopped
# before the interpreter finalises.
atexit.register(_close_open_states)


#: The dtypes a bucket may have: float32, and float16/bfloat16 (on the wire in their own
#: dtype, added in float32).
REDUCED_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def _env_flag(name, default):
    """The boolean environment variable ``name`` (1/true/yes/on, 0/false/no/off), or
    ``default`` when it is unset or empty; anything else is refused."""
    value = (os.environ.get(name) or "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"syncopate: ${name} must be 1/true/yes/on or 0/false/no/off, not {value!r}")


def _shared_token(group, require_env_token=False):
    """The job token: $SYNCOPATE_TOKEN, else (unless ``require_env_token``) a fresh one
    from rank 0, sent over the (already initialised, unauthenticated) torch process
    group."""
    token = os.environ.get("SYNCOPATE_TOKEN")
    if token:
        return token.strip()
    if require_env_token:
        raise RuntimeError(
            "syncopate: SYNCOPATE_TOKEN is not set and require_env_token "
            "(SYNCOPATE_REQUIRE_TOKEN) refuses to send a token over the process group's "
            "unauthenticated channel: set SYNCOPATE_TOKEN (64 hex digits, the same on every "
            "rank; syncopate.new_token() makes one)"
        )
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "syncopate: no job token: set SYNCOPATE_TOKEN (64 hex digits, the same on every "
            "rank) or call torch.distributed.init_process_group() before SyncopateState()"
        )
    box = [_native.new_token() if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _env(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        raise RuntimeError(f"syncopate: {name} is not set (start the job with torchrun)")
    return value


class SyncopateState:
    """A Syncopate job of the torch job's processes: the state of ``allreduce_hook``.

    Build it on every rank after ``torch.distributed.init_process_group(...)``. The ranks
    meet at ``MASTER_ADDR`` on ``port`` (default ``MASTER_PORT + port_offset``), rank 0
    hosting the rendezvous, and authenticate with the job token. One ring serves every
    collective of the state's life.

    Liveness: the ring's own thread sends heartbeats, so a rank outside the hook for minutes
    is fine; a peer that dies, or whose process stops answering for ``peer_timeout`` seconds
    (``$SYNCOPATE_PEER_TIMEOUT``), ends the job; a collective not complete within
    ``collective_timeout`` seconds (``$SYNCOPATE_COLLECTIVE_TIMEOUT``, default 30 minutes)
    ends it too. Then the pending and every later future fails with a ``RuntimeError`` that
    names the rank.

    The token: ``token``, else ``$SYNCOPATE_TOKEN``, else rank 0 draws one and sends it to
    the others over the process group's own channel, which is NOT authenticated (anyone who
    can reach the store and the process group's sockets can read it). ``require_env_token``
    (or ``SYNCOPATE_REQUIRE_TOKEN=1``) refuses that: the token must then come from the
    environment or the argument.

    Frame MACs: every frame carries a tag under keys derived from the token (on by default).
    ``frame_mac=False`` (or ``SYNCOPATE_FRAME_MAC=0``), the same on every rank, leaves the
    frames untagged: only the handshake is then authenticated, and anyone who can send
    packets on the network can alter gradients, as with Gloo. On large buckets the tags
    cost up to half the all-reduce's speed on a loaded CPU (docs/BENCHMARKS.md).
    """

    def __init__(
        self,
        process_group=None,
        *,
        port=None,
        port_offset=DEFAULT_PORT_OFFSET,
        token=None,
        peer_timeout=None,
        connect_timeout=120.0,
        bind_addr=None,
        collective_timeout=None,
        require_env_token=None,
        frame_mac=None,
    ):
        if frame_mac is None:
            frame_mac = _env_flag("SYNCOPATE_FRAME_MAC", True)
        if require_env_token is None:
            require_env_token = _env_flag("SYNCOPATE_REQUIRE_TOKEN", False)
        if peer_timeout is None:
            peer_timeout = float(os.environ.get("SYNCOPATE_PEER_TIMEOUT", "30"))
        if collective_timeout is None:
            collective_timeout = float(os.environ.get("SYNCOPATE_COLLECTIVE_TIMEOUT", "1800"))
        token = token or _shared_token(process_group, require_env_token)
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank(process_group)
            world_size = dist.get_world_size(process_group)
        else:
            rank = int(_env("RANK"))
            world_size = int(_env("WORLD_SIZE"))
        master_addr = _env("MASTER_ADDR", "127.0.0.1" if world_size == 1 else None)
        if port is None:
            port = int(_env("MASTER_PORT")) + port_offset
        self.rank = rank
        self.world_size = world_size
        self._ring = _native.Ring(
            rank,
            world_size,
            master_addr,
            port,
            token,
            peer_timeout=peer_timeout,
            connect_timeout=connect_timeout,
            bind_addr=bind_addr,
            collective_timeout=collective_timeout,
            frame_mac=bool(frame_mac),
        )
        self._stager = None
        _open_states.add(self)

    def allreduce(self, tensor):
        """Averages ``tensor`` over every rank, in place; returns a ``torch.futures.Future``
        holding the tensor once done, or failing with a ``RuntimeError`` naming the rank
        that ended the job. Every rank must call it with tensors of the same size in the
        same order. float32, float16 and bfloat16 are reduced (the halves accumulated in
        float32); any other dtype is refused with a ``TypeError``."""
        name = REDUCED_DTYPES.get(tensor.dtype)
        if name is None:
            raise TypeError(
                f"syncopate: cannot all-reduce a {tensor.dtype} tensor: only float32, "
                "float16 and bfloat16 are reduced (cast it, or use torch.distributed for "
                "exact integer, float64 or complex sums)"
            )
        tensor = tensor.detach()
        if tensor.device.type == "cuda":
            return self._allreduce_cuda(tensor, name)
        future = torch.futures.Future()
        on_host = tensor.device.type == "cpu" and tensor.is_contiguous()
        host = tensor if on_host else tensor.to("cpu").contiguous()
        staged = host.data_ptr() != tensor.data_ptr()

        def done(error):
            # On the ring's thread, with the GIL; the values are already in `host`.
            try:
                if error is not None:
                    future.set_exception(RuntimeError(f"syncopate: {error}"))
                    return
                if staged:
                    with torch.no_grad():
                        tensor.copy_(host.view_as(tensor))
                future.set_result(tensor)
            except Exception as e:  # the future must complete, whatever went wrong
                if not future.done():
                    future.set_exception(e)

        self._start(host, name, done, future)
        return future

    def _allreduce_cuda(self, tensor, name):
        """``allreduce`` of a tensor on a GPU: staged through pinned host memory on a side
        stream (``staging``), the future completed on the GPU's timeline."""
        if self._stager is None:
            self._stager = Stager()
        stager = self._stager
        future = torch.futures.Future(devices=[tensor.device])
        host, copied = stager.stage(tensor)

        def done(error):
            # On the ring's thread, with the GIL; the average is in `host`.
            try:
                if error is not None:
                    future.set_exception(RuntimeError(f"syncopate: {error}"))
                    return
                stager.unstage(host, tensor, future)
            except Exception as e:  # the future must complete, whatever went wrong
                if not future.done():
                    future.set_exception(e)

        self._start(host, name, done, future, ready=copied)
        return future

    def _start(self, host, name, done, future, ready=None):
        """Hands ``host`` to the ring, through the stager's queue once there is one (so
        collectives start in the order they were asked for)."""

        def start():
            self._ring.allreduce(host.data_ptr(), host.numel(), name, done)

        if self._stager is None:
            start()
            return

        def fail(e):
            if not future.done():
                future.set_exception(e)

        self._stager.submit(start, fail, ready)

    def failure(self):
        """The error that ended the job (it names the peer), or None."""
        return self._ring.failure()

    def close(self):
        """Completes the queued operations, waits for every rank to close too, and closes
        the links."""
        stager = getattr(self, "_stager", None)
        if stager is not None:
            stager.close()
            self._stager = None
        ring = getattr(self, "_ring", None)
        if ring is not None:
            ring.close()
        _open_states.discard(self)


def allreduce_hook(state, bucket):
    """DDP communication hook: averages the bucket's gradients over Syncopate's ring.

    ``model.register_comm_hook(SyncopateState(), allreduce_hook)``. Like DDP's default
    hook it returns the average (sum divided by the world size); every rank gets the same
    bits (the ring adds in ring order).
    """
    return state.allreduce(bucket.buffer())


class LocalSgdAverager:
    """Local SGD over Syncopate's ring: every ``every`` steps, the parameters' average.

    Like ``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager``:
    call ``average_parameters(model.parameters())`` after every ``optimizer.step()``. The
    first ``warmup_steps`` steps are not averaged (run them with ``allreduce_hook`` or
    another exact hook). Averaging waits for the ring; all parameters travel as one buffer.
    This is approximate training: the replicas drift apart between averages.
    """

    def __init__(self, state, every, warmup_steps=0):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.state = state
        self.every = every
        self.warmup_steps = warmup_steps
        self.step = 0

    def average_parameters(self, params):
        """Counts a step; on every ``every``-th step after the warm-up, replaces each of
        ``params`` with its average over the ranks. Returns whether it averaged."""
        self.step += 1
        if self.step <= self.warmup_steps or self.step % self.every != 0:
            return False
        params = [p for p in params if p is not None]
        if not params:
            return False
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])
            _wait(self.state.allreduce(flat))
            offset = 0
            for p in params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n
        return True


def _wait(future):
    """Waits for ``future`` without holding the GIL (its completion needs it) and returns
    its value, raising its exception."""
    finished = threading.Event()
    future.add_done_callback(lambda _: finished.set())
    finished.wait()
    return future.value()
