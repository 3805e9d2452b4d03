"""The GPU timer's stream discipline, checked on the CPU with a recording stand-in for
``torch.cuda``: a planned launch may be captured only on a stream it has already run on
(``gather.run_segments`` refuses otherwise), so the warm-up must use the capture stream."""

import contextlib

import pytest
import torch

from mm_schedule.kernels.tools import timing


class FakeCuda:
    """Streams, events and graph capture as plain Python objects, logging what runs where."""

    def __init__(self):
        self.default = self.Stream(None, name="default")
        self.current = self.default
        self.capturing_on = None
        self.replays = 0
        self.log = []

    def Stream(self, device=None, name=None):
        fake = self

        class Stream:
            def __init__(self):
                self.name = name or f"stream{id(self) % 1000}"

            def wait_stream(self, other):
                fake.log.append(("wait", self.name, other.name))

        return Stream()

    def current_stream(self, device=None):
        return self.current

    @contextlib.contextmanager
    def stream(self, s):
        previous, self.current = self.current, s
        try:
            yield
        finally:
            self.current = previous

    def CUDAGraph(self):
        fake = self

        class Graph:
            def replay(self):
                fake.replays += 1

        return Graph()

    @contextlib.contextmanager
    def graph(self, g, stream=None):
        capture = stream or self.Stream(name="torch-default-capture")
        self.capturing_on = capture
        with self.stream(capture):
            yield
        self.capturing_on = None

    def Event(self, enable_timing=False):
        class Event:
            def record(self, stream=None):
                pass

            def elapsed_time(self, other):
                return 0.004  # ms

        return Event()

    def synchronize(self, device=None):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    for name in ("Stream", "current_stream", "stream", "CUDAGraph", "graph", "Event", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    return fake


def test_graph_timing_warms_up_on_the_stream_it_captures_on(fake_cuda):
    ran_on = {}  # launch -> streams it ran on before capture

    def planned_launch(key):
        def launch():
            stream = torch.cuda.current_stream()
            if fake_cuda.capturing_on is not None:
                # What run_segments checks: captured only where it already ran.
                assert stream in ran_on.get(key, []), "captured on a stream the launch never ran on"
                fake_cuda.log.append(("captured", key, stream.name))
            else:
                ran_on.setdefault(key, []).append(stream)

        return launch

    timer = timing.GpuTimer(torch.device("cpu"), flush_bytes=64)
    us = timer.graph_us([planned_launch("a"), planned_launch("b")], replays=3, warmup=1)
    assert fake_cuda.replays == 4
    assert us == pytest.approx(0.004 * 1000 / 2)
    captured = [entry for entry in fake_cuda.log if entry[0] == "captured"]
    assert [key for _, key, _ in captured] == ["a", "b"]
    # The capture stream is not the caller's, and the caller waits for it afterwards.
    assert captured[0][2] != "default"
    assert ("wait", "default", captured[0][2]) in fake_cuda.log

