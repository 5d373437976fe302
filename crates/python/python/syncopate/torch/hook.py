"""Syncopate's ring all-reduce in a PyTorch training loop.

``SyncopateState`` forms a Syncopate job beside torch's default process group (the same
ranks, found from the torchrun environment), with Syncopate's own rendezvous,
authentication (a job token), heartbeats and fail-fast. ``allreduce_hook`` is a DDP
communication hook that averages every gradient bucket over that job's ring;
``LocalSgdAverager`` averages a model's parameters every few steps over it.

How a bucket's future completes: the hook copies the bucket into bytes and queues them on
the ring's communication thread (native, outside the GIL) and returns a
``torch.futures.Future`` at once. When the ring has averaged them, that thread takes the
GIL, copies the result into the bucket's tensor and sets the future's result (or its
exception, whose message names the peer that failed). DDP waits on the future outside the
GIL, so backward keeps computing while the bucket travels.
"""

import atexit
import os
import threading
import weakref

import numpy as np
import torch
import torch.distributed as dist

from .. import _native

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


def _shared_token(group):
    """The job token: $SYNCOPATE_TOKEN, else a fresh one from rank 0, broadcast over the
    (already initialised) torch process group."""
    token = os.environ.get("SYNCOPATE_TOKEN")
    if token:
        return token.strip()
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
    hosting the rendezvous. A peer that dies or stays silent for ``peer_timeout`` seconds
    ends the job: the pending and every later operation fail with an error naming it.
    """

    def __init__(
        self,
        process_group=None,
        *,
        port=None,
        port_offset=DEFAULT_PORT_OFFSET,
        token=None,
        peer_timeout=30.0,
        connect_timeout=120.0,
        bind_addr=None,
    ):
        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank(process_group)
            world_size = dist.get_world_size(process_group)
        else:
            rank = int(_env("RANK"))
            world_size = int(_env("WORLD_SIZE"))
        master_addr = _env("MASTER_ADDR", "127.0.0.1" if world_size == 1 else None)
        if port is None:
            port = int(_env("MASTER_PORT")) + port_offset
        token = token or _shared_token(process_group)
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
        )
        _open_states.add(self)

    def allreduce(self, tensor):
        """Averages ``tensor`` over every rank, in place; returns a ``torch.futures.Future``
        holding the tensor once done. Every rank must call it with tensors of the same size
        in the same order."""
        future = torch.futures.Future()
        host = tensor.detach()
        if host.device.type != "cpu" or host.dtype != torch.float32:
            host = host.to("cpu", torch.float32)
        host = host.contiguous()

        def done(result, error):
            if error is not None:
                future.set_exception(RuntimeError(f"syncopate: {error}"))
                return
            try:
                averaged = np.frombuffer(result, dtype=np.float32)
                if host.data_ptr() == tensor.data_ptr():
                    tensor.view(-1).numpy()[:] = averaged
                else:
                    tensor.copy_(torch.from_numpy(averaged.copy()).view_as(tensor))
            except Exception as e:  # the future must complete, whatever went wrong
                future.set_exception(e)
                return
            future.set_result(tensor)

        self._ring.allreduce(host.numpy().tobytes(), done)
        return future

    def failure(self):
        """The error that ended the job (it names the peer), or None."""
        return self._ring.failure()

    def close(self):
        """Completes the queued operations and closes the links."""
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
