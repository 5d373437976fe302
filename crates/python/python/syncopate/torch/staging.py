"""Buckets on a GPU, staged through pinned host memory without stalling the caller.

The ring reads and writes host memory. For a CUDA tensor, ``Stager.stage`` copies it into a
pinned host buffer on a side stream (after the work already queued on the tensor's stream)
and returns at once; the stager's own thread waits for that copy, without the GIL, and
only then hands the buffer to the ring. So the caller (DDP's autograd thread) keeps
queueing backward kernels while buckets cross the PCIe bus, as Gloo's CUDA all-reduce does.
The average is copied back on the side stream, and the future is completed there: a future
made with the tensor's device makes whoever waits on it (DDP) wait for that copy on the GPU,
not on the host.

Every collective, on a GPU or not, passes through the stager's one queue once it exists, so
each rank starts its collectives in the order they were asked for.

Pinned buffers come from torch's caching host allocator, which reuses a block only once the
copies queued on it have run.
"""

import queue
import threading

import torch


class Stager:
    """One thread that starts the ring's collectives in order, each once its host copy
    is ready; one side stream per GPU for the copies."""

    def __init__(self):
        self._jobs = queue.SimpleQueue()
        self._streams = {}
        self._thread = threading.Thread(target=self._run, name="syncopate-stager", daemon=True)
        self._thread.start()

    def stream(self, device):
        """The side stream that copies ``device``'s buckets to and from the host."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def stage(self, tensor):
        """A pinned host copy of the CUDA ``tensor`` (flat, same dtype), queued on the side
        stream after the tensor's producers, and the event that marks it done."""
        stream = self.stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.view(tensor.shape).copy_(tensor, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
        # The caller may free the tensor before the side stream has read it.
        tensor.record_stream(stream)
        return host, copied

    def unstage(self, host, tensor, future):
        """Copies the average in ``host`` back into ``tensor`` on the side stream and
        completes ``future`` there (the future waits for the copy on the GPU)."""
        with torch.cuda.stream(self.stream(tensor.device)):
            tensor.copy_(host.view(tensor.shape), non_blocking=True)
            future.set_result(tensor)

    def submit(self, start, fail, ready=None):
        """Queues ``start()`` (which hands a buffer to the ring) after the jobs already
        queued, once the CUDA event ``ready`` (if any) has completed; ``fail(exception)``
        if either raises."""
        self._jobs.put((ready, start, fail))

    def close(self):
        """Starts every queued job, then stops the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            ready, start, fail = job
            try:
                if ready is not None:
                    ready.synchronize()  # releases the GIL
                start()
            except Exception as e:  # the job's future must complete, whatever went wrong
                fail(e)
