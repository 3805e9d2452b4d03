"""Timing, one way for the tuner and the benchmarks.

``GpuTimer`` measures device time on a CUDA or ROCm GPU with cold caches:

- ``event_times_us``: CUDA events around each call. Before each call a scratch buffer
  twice the last-level cache is overwritten, then a spin kernel keeps the device busy
  while the host queues the call, so the events bracket device work, not Python. A call
  that syncs the host still pays for it: what follows the sync cannot be queued before
  the device drains.
- ``graph_us``: a list of launches captured once in a CUDA graph and replayed, the
  scratch overwritten before every replay; per launch, the kernels' own cost plus the
  graph's per-kernel cost, without Python's.
- ``copy_us``: ``dst.copy_(src)`` of a given number of bytes, timed like
  ``event_times_us``: the yardstick a memory-bound kernel is judged against.

``wall_us_per_launch`` is the CPU stand-in used under ``TRITON_INTERPRET=1``, which
exercises the callers and says nothing about any GPU. torch is imported on first use.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

MiB = 1 << 20


def l2_bytes(device) -> int:
    import torch

    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or 64 * MiB)


def cold_cache_bytes(device) -> int:
    """Bytes to overwrite so that nothing a call reads is still cached. AMD Instinct
    parts have an Infinity Cache (256 MiB on MI300X) behind L2 that torch does not
    report, so that much is assumed there."""
    import torch

    cache = l2_bytes(device)
    if torch.version.hip:
        cache = max(cache, 256 * MiB)
    return cache


def _event_pair():
    import torch

    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


class GpuTimer:
    def __init__(self, device, flush_bytes: int | None = None) -> None:
        import torch

        self.device = device
        size = 2 * cold_cache_bytes(device) if flush_bytes is None else flush_bytes
        self.scratch = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
        self.cycles_per_us = self._calibrate_spin()

    @property
    def flush_mib(self) -> int:
        return self.scratch.numel() >> 20

    def _calibrate_spin(self) -> float | None:
        import torch

        try:
            torch.cuda._sleep(1000)
            start, end = _event_pair()
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            end.synchronize()
            return 2_000_000 / (start.elapsed_time(end) * 1e3)
        except Exception:  # no spin kernel in this build: time without it
            return None

    def _synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def event_times_us(
        self, run: Callable[[int], object], repeats: int, host_us: float
    ) -> list[float]:
        """Device time of ``run(i)`` for ``i`` in ``range(repeats)`` (the caller rotates
        its buffers with ``i``); ``host_us`` sizes the spin that hides the host."""
        import torch

        pairs = [_event_pair() for _ in range(repeats)]
        spin_us = min(max(2.0 * host_us, 50.0), 20_000.0)
        self._synchronize()
        for i, (start, end) in enumerate(pairs):
            self.scratch.zero_()
            if self.cycles_per_us:
                torch.cuda._sleep(int(spin_us * self.cycles_per_us))
            start.record()
            run(i)
            end.record()
        self._synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in pairs]

    def graph_us(self, launches: list[Callable[[], object]], replays: int, warmup: int = 1) -> float:
        """Median replay time of one graph holding ``launches``, divided by their number.
        Raises whatever capture raises when a launch cannot be captured."""
        import torch

        # Triton compiles and loads a kernel on its first launch, which a capture cannot
        # record, and a planned launch must have run once on the stream that captures it
        # (its table upload is ordered per stream): warm up on the capture stream itself.
        capture = torch.cuda.Stream(self.device)
        capture.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(capture):
            for launch in launches:
                launch()
        torch.cuda.current_stream(self.device).wait_stream(capture)
        self._synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=capture):
            for launch in launches:
                launch()
        # Everything is queued before the one synchronize, so no host sync falls inside
        # a timed interval; the overwrite runs before ``start`` and is not timed.
        pairs = []
        for _ in range(warmup + replays):
            self.scratch.zero_()
            start, end = _event_pair()
            start.record()
            graph.replay()
            end.record()
            pairs.append((start, end))
        self._synchronize()
        del graph
        times_ms = [s.elapsed_time(e) for s, e in pairs[warmup:]]
        return statistics.median(times_ms) * 1000.0 / len(launches)

    def copy_us(self, nbytes: int, repeats: int = 20) -> float:
        """Median device time of ``dst.copy_(src)`` over ``nbytes`` bytes (read once,
        written once), cold caches as in ``event_times_us``."""
        import torch

        n = max(nbytes, 16)
        src = torch.empty(n, dtype=torch.uint8, device=self.device).random_(0, 255)
        dst = torch.empty_like(src)
        dst.copy_(src)
        return statistics.median(self.event_times_us(lambda i: dst.copy_(src), repeats, 20.0))


def wall_us_per_launch(launches: list[Callable[[], object]], reps: int, warmup: int) -> float:
    """Median wall time per launch over ``reps`` rounds of every launch (no GPU: the
    Triton interpreter on CPU)."""
    rounds = []
    for i in range(warmup + reps):
        start = time.perf_counter()
        for launch in launches:
            launch()
        if i >= warmup:
            rounds.append(time.perf_counter() - start)
    return statistics.median(rounds) * 1e6 / len(launches)


class Budget:
    """A time cap on measuring that does not charge for compiling.

    ``timed_s`` caps the seconds spent outside ``untimed()`` blocks (None: no cap);
    ``hard_deadline`` (a ``time.monotonic()`` value, None: none) caps everything, compiles
    included. Callers check ``exceeded()`` between units of work, so one unit may run
    past the cap; keep units small.
    """

    def __init__(self, timed_s: float | None = None, hard_deadline: float | None = None):
        self.timed_s = timed_s
        self.hard_deadline = hard_deadline
        self.started = time.monotonic()
        self.untimed_s = 0.0

    def exceeded(self) -> bool:
        now = time.monotonic()
        if self.hard_deadline is not None and now >= self.hard_deadline:
            return True
        return self.timed_s is not None and now - self.started - self.untimed_s >= self.timed_s

    def untimed(self):
        return _Untimed(self)


class _Untimed:
    def __init__(self, budget: Budget):
        self.budget = budget

    def __enter__(self):
        self.start = time.monotonic()

    def __exit__(self, *exc):
        self.budget.untimed_s += time.monotonic() - self.start
        return False
