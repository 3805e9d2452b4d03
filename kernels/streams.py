"""Devices and streams, as the launchers see them: one small interface, two layers.

Triton launches on the *current* device and the *current* stream of that device. The
launchers therefore enter the destination's device (``guard``) before they touch a
stream, stage tables and launch on the stream that is current there, and, when a table
was uploaded earlier on another stream (a ``SegmentPlan``), make the launch stream wait
for the upload's event and tell the caching allocator the table is in use on it.

``layer(device)`` returns the implementation for a device: ``CUDA_LAYER`` (torch.cuda,
which ROCm builds of torch also call ``cuda``) or ``HOST_LAYER`` (CPU tensors: nothing to
order). Tests replace ``layer`` with a recording fake to check guards and ordering
without a GPU.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext


class HostLayer:
    """CPU tensors: work runs in program order, there is nothing to guard or wait for."""

    def guard(self, device):
        return nullcontext()

    def current(self, device):
        return None

    def capturing(self, device) -> bool:
        return False

    def record(self, stream):
        return None

    def wait(self, stream, event) -> None:
        pass

    def done(self, event) -> bool:
        return True

    def keep_for(self, tensor, stream) -> None:
        pass

    def raw(self, stream):
        return None

    def current_raw(self, device):
        return None

    def staging_ring(self, device):
        """Where per-call tables are staged; None: the host words are the table."""
        return None


class CudaLayer:
    """torch.cuda streams and events."""

    def __init__(self):
        self._rings: dict = {}
        self._rings_lock = threading.Lock()

    def guard(self, device):
        import torch

        # Entering a device that is already current would only switch to it and back.
        if device.index is None or device.index == torch.cuda.current_device():
            return nullcontext()
        return torch.cuda.device(device)

    def current_raw(self, device):
        """The current stream's raw handle, without building a stream object."""
        import torch

        return torch._C._cuda_getCurrentRawStream(
            torch.cuda.current_device() if device.index is None else device.index
        )

    def staging_ring(self, device):
        ring = self._rings.get(device)
        if ring is None:
            import torch

            from .segment_copy.staging import StagingRing

            with self._rings_lock:  # two threads' first launches on a device share one ring
                ring = self._rings.get(device)
                if ring is None:
                    ring = self._rings[device] = StagingRing(
                        lambda n: torch.empty(n, dtype=torch.int64, pin_memory=True),
                        lambda n: torch.empty(n, dtype=torch.int64, device=device),
                        torch.cuda.Event,
                    )
        return ring

    def current(self, device):
        import torch

        return torch.cuda.current_stream(device)

    def capturing(self, device) -> bool:
        """Whether ``device``'s current stream is capturing a CUDA graph."""
        import torch

        with self.guard(device):
            return torch.cuda.is_current_stream_capturing()

    def record(self, stream):
        import torch

        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def done(self, event) -> bool:
        """Whether the work before ``event`` has run (asked, never waited for)."""
        return event.query()

    def keep_for(self, tensor, stream) -> None:
        # The caching allocator then reuses the memory only after `stream` passes this point.
        tensor.record_stream(stream)

    def raw(self, stream):
        return stream.cuda_stream


HOST_LAYER = HostLayer()
CUDA_LAYER = CudaLayer()


def layer(device):
    return CUDA_LAYER if device.type == "cuda" else HOST_LAYER
