"""Device guards, stream order and CUDA-graph capture, proved without a GPU.

A recording stand-in replaces the torch.cuda layer (``streams.layer``): it tracks the
current device and each device's current stream, and logs every guard, upload, event,
wait and launch. The kernels still run (interpreted, on CPU tensors) and are checked bit
for bit, so the log describes launches that really copied the rows.
"""

import sys

import pytest
import torch

from mm_schedule.errors import GraphCaptureError
from mm_schedule.kernels import placeholder_merge
from mm_schedule.kernels.segment_copy import launch as gather_mod
from mm_schedule.kernels.segment_copy import staging, table
from mm_schedule.kernels.segment_copy.fast_launch import LaunchSpec
from mm_schedule.kernels.segment_copy.launch import (
    gather_segments,
    merge_segments,
    plan_segments,
    run_segments,
)
from mm_schedule.kernels.segment_copy.trusted import copy_segments

SMALL = {"BLOCK_M": 2, "BLOCK_H": 64, "num_warps": 1, "num_stages": 1}


class Stream:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


class RecordingLayer:
    """Current device starts at "other" (not the destination's), each device's current stream at "default"."""

    def __init__(self):
        self.device = "other"
        self.streams = {}
        self.named = {}
        self.log = []
        self.capture = False

    def set_stream(self, device, name):
        # One object per name, as torch gives equal stream objects for one stream.
        self.streams[str(device)] = self.named.setdefault(name, Stream(name))

    def guard(self, device):
        layer = self

        class Guard:
            def __enter__(self):
                self.previous = layer.device
                layer.device = str(device)
                layer.log.append(("enter", str(device)))

            def __exit__(self, *exc):
                layer.device = self.previous
                layer.log.append(("exit", str(device)))

        return Guard()

    def current(self, device):
        return self.streams.setdefault(str(device), self.named.setdefault("default", Stream("default")))

    def capturing(self, device):
        return self.capture

    def record(self, stream):
        event = f"event#{sum(e[0] == 'record' for e in self.log)}"
        self.log.append(("record", stream.name, event))
        return event

    def wait(self, stream, event):
        self.log.append(("wait", stream.name, event))

    def keep_for(self, tensor, stream):
        self.log.append(("keep", stream.name))

    pending = frozenset()  # events whose work the "device" has not run yet

    def done(self, event):
        return event not in self.pending

    def raw(self, stream):
        return stream

    def current_raw(self, device):
        return self.current(device)

    ring = None  # a test may stage per-call tables in a StagingRing (``with_ring``)

    def staging_ring(self, device):
        return self.ring  # None: CPU tensors, the packed words are the table

    def with_ring(self):
        layer = self

        class Event:
            def record(self):
                # Recorded on the stream current where the launcher stands.
                layer.log.append(("slot event", layer.device, layer.current(layer.device).name))

            def query(self):
                return True

            def synchronize(self):
                layer.log.append(("slot wait",))

        empty = lambda n: torch.zeros(n, dtype=torch.int64)  # noqa: E731
        self.ring = staging.StagingRing(empty, empty, Event)
        return self


@pytest.fixture
def fake(monkeypatch, triton_backend):
    layer = RecordingLayer()
    monkeypatch.setattr(gather_mod, "layer", lambda device: layer)
    monkeypatch.setattr(placeholder_merge, "layer", lambda device: layer)
    real_launch, real_build, real_upload = LaunchSpec.launch, gather_mod.build_table, gather_mod.upload

    def launch(self, grid, args, variant, stream):
        # Triton launches on the current device: it must be the destination's by now.
        layer.log.append(("launch", layer.device, stream.name if stream else None))
        return real_launch(self, grid, args, variant, None)

    def build(segments, sources, device, *rest):
        layer.log.append(("table", layer.device, layer.current(device).name))
        return real_build(segments, sources, device, *rest)

    def upload(words, device, **kw):
        layer.log.append(("upload", layer.device, layer.current(device).name))
        return real_upload(words, device, **kw)

    monkeypatch.setattr(LaunchSpec, "launch", launch)
    monkeypatch.setattr(gather_mod, "build_table", build)
    monkeypatch.setattr(gather_mod, "upload", upload)
    return layer


def _data(helpers, seed=0):
    gen = torch.Generator().manual_seed(seed)
    sources = [helpers.random_rows(n, 64, torch.float16, gen) for n in (6, 4)]
    return sources, [(1, 0, 4, 0), (0, 1, 5, 5)]


def _expected(helpers, sources, segments, rows):
    out = helpers.poisoned((rows, 64), torch.float16)
    gather_mod.gather_segments_ref(sources, segments, out)
    return out


def test_per_call_table_is_staged_and_launched_under_the_destination_device(fake, helpers):
    sources, segments = _data(helpers)
    fake.set_stream("cpu", "S1")
    out = helpers.poisoned((10, 64), torch.float16)
    gather_segments(sources, segments, out=out, config=SMALL)
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, segments, 10))
    assert fake.log == [("enter", "cpu"), ("table", "cpu", "S1"), ("launch", "cpu", "S1"), ("exit", "cpu")]
    assert fake.device == "other"  # the caller's current device is restored


def test_a_staged_tables_event_is_recorded_after_the_launch_that_reads_it(fake, helpers):
    """The slot may be rewritten once its event has completed: recorded before the launch,
    the event would complete while the kernel still has to read the table."""
    sources, segments = _data(helpers)
    fake.with_ring().set_stream("cpu", "S1")
    for _ in range(3):
        fake.log.clear()
        out = helpers.poisoned((10, 64), torch.float16)
        merge_segments(sources, segments, out, config=SMALL)
        helpers.assert_bitwise_equal(out, _expected(helpers, sources, segments, 10))
        assert fake.log == [
            ("enter", "cpu"),
            ("table", "cpu", "S1"),
            ("launch", "cpu", "S1"),
            ("slot event", "cpu", "S1"),  # after the launch, on its stream, inside the guard
            ("exit", "cpu"),
        ]


def test_a_failed_launch_hands_its_slot_back(fake, helpers, monkeypatch):
    sources, segments = _data(helpers)
    fake.with_ring()

    def broken(self, grid, args, variant, stream):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(LaunchSpec, "launch", broken)
    for _ in range(2 * staging.StagingRing.SLOTS):
        with pytest.raises(RuntimeError, match="launch failed"):
            gather_segments(sources, segments, out=torch.zeros(10, 64, dtype=torch.float16))
    assert len(fake.ring) == staging.StagingRing.SLOTS  # no slot stayed claimed


def test_one_segment_needs_no_table(fake, helpers):
    sources, _ = _data(helpers)
    out = helpers.poisoned((10, 64), torch.float16)
    merge_segments(sources, [(0, 1, 5, 2)], out, config=SMALL)
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, [(0, 1, 5, 2)], 10))
    assert fake.log == [("enter", "cpu"), ("launch", "cpu", "default"), ("exit", "cpu")]


def test_placeholder_merge_launches_under_the_output_device(fake, helpers):
    from mm_schedule.kernels import merge_by_placeholder_ids

    ids = torch.tensor([5, 9, 9, 5, 9])
    embeds = helpers.random_rows(5, 64, torch.float32)
    rows = helpers.random_rows(3, 64, torch.float32)
    expected = embeds.clone()
    expected[ids == 9] = rows
    merge_by_placeholder_ids(ids, 9, rows, embeds)
    helpers.assert_bitwise_equal(embeds, expected)
    assert fake.log[0] == ("enter", "cpu") and fake.log[-1] == ("exit", "cpu")


def test_plan_run_on_another_stream_waits_for_the_upload_once(fake, helpers):
    sources, segments = _data(helpers, 1)
    fake.set_stream("cpu", "A")
    plan = plan_segments(sources, segments, helpers.poisoned((10, 64), torch.float16), config=SMALL)
    assert fake.log == [("enter", "cpu"), ("upload", "cpu", "A"), ("record", "A", "event#0"), ("exit", "cpu")]
    fake.log.clear()

    out = helpers.poisoned((10, 64), torch.float16)
    run_segments(plan, out)  # same stream as the upload: already ordered
    assert fake.log == [("enter", "cpu"), ("launch", "cpu", "A"), ("exit", "cpu")]
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, segments, 10))

    fake.set_stream("cpu", "B")
    for _ in range(2):
        fake.log.clear()
        run_segments(plan, out)
    # The first run on B waited; the second found B ready.
    assert fake.log == [("enter", "cpu"), ("launch", "cpu", "B"), ("exit", "cpu")]

    fake.log.clear()
    plan2 = plan_segments(sources, segments, out, config=SMALL)
    fake.set_stream("cpu", "C")
    fake.log.clear()
    run_segments(plan2, out)
    assert fake.log == [
        ("enter", "cpu"),
        ("wait", "C", "event#0"),  # the upload's event, before the launch on C
        ("keep", "C"),  # and the table is in use on C for the allocator
        ("launch", "cpu", "C"),
        ("exit", "cpu"),
    ]


def test_update_uploads_again_and_other_streams_wait_for_the_new_copy(fake, helpers):
    sources, segments = _data(helpers, 2)
    fake.set_stream("cpu", "A")
    out = helpers.poisoned((10, 64), torch.float16)
    plan = plan_segments(sources, segments, out, config=SMALL, capacity=8)
    fake.set_stream("cpu", "B")
    run_segments(plan, out)
    fake.set_stream("cpu", "A")
    swapped = [(0, 0, 6, 4), (1, 0, 4, 0)]
    fake.log.clear()
    plan.update(sources, swapped)
    assert ("upload", "cpu", "A") in fake.log
    event = [e for e in fake.log if e[0] == "record"][-1][2]  # the upload's (after B's)
    fake.set_stream("cpu", "B")
    fake.log.clear()
    run_segments(plan, out)
    assert fake.log[1:3] == [("wait", "B", event), ("keep", "B")]
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, swapped, 10))


def test_per_call_api_refuses_capture(fake, helpers):
    sources, segments = _data(helpers)
    out = torch.zeros(10, 64, dtype=torch.float16)
    plan = plan_segments(sources, segments, out, config=SMALL, capacity=8)
    fake.log.clear()
    fake.capture = True
    for call in (
        lambda: gather_segments(sources, segments, out=out),
        lambda: merge_segments(sources, segments, out),
        lambda: plan_segments(sources, segments, out),
        lambda: plan.update(sources, segments),
        lambda: copy_segments(sources, segments, out),
    ):
        with pytest.raises(GraphCaptureError, match="run_segments"):
            call()
    assert not any(entry[0] in ("launch", "table", "upload") for entry in fake.log)
    assert out.eq(0).all()


def test_capture_runs_a_plan_only_on_a_stream_it_has_run_on(fake, helpers):
    sources, segments = _data(helpers, 3)
    out = helpers.poisoned((10, 64), torch.float16)
    fake.set_stream("cpu", "A")
    plan = plan_segments(sources, segments, out, config=SMALL, capacity=8)
    fake.set_stream("cpu", "capture")
    fake.capture = True
    with pytest.raises(GraphCaptureError, match="warm-up"):
        run_segments(plan, out)
    fake.capture = False
    run_segments(plan, out)  # the warm-up: waits for the upload outside the capture
    fake.capture = True
    fake.log.clear()
    run_segments(plan, out)
    assert fake.log == [("enter", "cpu"), ("launch", "cpu", "capture"), ("exit", "cpu")]
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, segments, 10))


def test_one_segment_trusted_copy_is_captured_only_for_static_sources(fake, helpers):
    """A captured one-segment launch keeps the source's address; every replay reads it."""
    sources, _ = _data(helpers, 4)
    out = helpers.poisoned((10, 64), torch.float16)
    fake.capture = True
    with pytest.raises(GraphCaptureError, match="static_sources=True"):
        copy_segments(sources, [(1, 1, 3, 6)], out)
    assert not any(e[0] == "launch" for e in fake.log)
    fake.log.clear()
    copy_segments(sources, [(1, 1, 3, 6)], out, static_sources=True)
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, [(1, 1, 3, 6)], 10))
    assert [e[0] for e in fake.log] == ["enter", "launch", "exit"]
    # A table of several segments is staged per call: refused even for static sources.
    with pytest.raises(GraphCaptureError, match="run_segments"):
        copy_segments(sources, [(1, 1, 3, 6), (0, 0, 2, 0)], out, static_sources=True)
    fake.capture = False
    copy_segments(sources, [(1, 1, 3, 6)], helpers.poisoned((10, 64), torch.float16))  # no capture: fine


def test_torch_trusted_copy_off_the_cpu_is_refused_under_capture(monkeypatch, torch_backend):
    """The torch path on a GPU: views and copies keep the sources' addresses in a graph, and
    the packed scatter uploads its columns from pageable memory."""
    from mm_schedule.kernels import streams
    from mm_schedule.kernels.segment_copy import trusted

    capturing = RecordingLayer()
    capturing.capture = True
    monkeypatch.setattr(streams, "layer", lambda device: capturing)
    n = trusted.SCATTER_MIN_SEGMENTS
    sources = [torch.empty(4, 8, device="meta") for _ in range(n)]
    dst = torch.empty(6 * n, 8, device="meta")  # stands for a GPU tensor: no data, no host copy
    fused = [(i, 0, 4, 6 * i) for i in range(n)]
    for segments in (fused[:1], fused[:3]):
        with pytest.raises(GraphCaptureError, match="static_sources=True"):
            copy_segments(sources, segments, dst)
        copy_segments(sources, segments, dst, static_sources=True)
    with pytest.raises(GraphCaptureError, match="scatter_rows"):
        copy_segments(sources, fused, dst, static_sources=True)
    with pytest.raises(GraphCaptureError, match="scatter_rows"):
        trusted.scatter_rows(sources[:2], [4, 4], [0, 6], dst)
    capturing.capture = False
    copy_segments(sources, fused, dst)  # outside a capture: the scatter runs


def test_build_table_reads_alignment_from_the_packed_addresses(helpers):
    base = torch.zeros(64 * 40 + 8, dtype=torch.float16)
    aligned = [base[: 64 * 10].view(10, 64), base[64 * 10 : 64 * 20].view(10, 64)]
    shifted = base[1 : 1 + 64 * 10].view(10, 64)  # 2 bytes past an aligned address
    segments = [(0, 0, 2, 0), (1, 3, 2, 2)]
    words, ok, slot, rows, tiles = table.build_table(segments, aligned, torch.device("cpu"), None, lambda rows: 1)
    assert slot is None and ok and (rows, tiles) == (4, 4)
    assert words.tolist() == [2, 2, 4, 0, 0, 2, 0, 1, 3, 2, 2, *(t.data_ptr() for t in aligned)]
    for sources in ([aligned[0], shifted], [shifted, aligned[0]], [shifted]):
        assert not table.build_table(segments[: len(sources)], sources, torch.device("cpu"), None, lambda rows: 1)[1]


# --- empty steps, capture of plans, updates across streams -----------------------------


def test_an_empty_table_with_a_fixed_grid_copies_nothing_and_reads_no_record(fake, helpers):
    """A step without images in a captured engine: every program of the grid runs and
    finds no segment (the kernel masks its record loads; the host launches anyway)."""
    sources, segments = _data(helpers, 5)
    out = helpers.random_rows(10, 64, torch.float16)
    before = out.clone()
    for srcs in (sources, []):
        plan = plan_segments(srcs, [], out, config=SMALL, capacity=8)
        fake.log.clear()
        run_segments(plan, out)
        assert ("launch", "cpu", "default") in fake.log  # the fixed grid was launched
        helpers.assert_bitwise_equal(out, before)
    # A full plan emptied by update(), then filled again.
    plan = plan_segments(sources, segments, out, config=SMALL, capacity=8)
    plan.update([], [])
    run_segments(plan, out)
    helpers.assert_bitwise_equal(out, before)
    plan.update(sources, segments)
    run_segments(plan, out)
    expected = before.clone()
    gather_mod.gather_segments_ref(sources, segments, expected)
    helpers.assert_bitwise_equal(out, expected)


def test_plan_updates_copy_through_one_pinned_buffer_and_never_wait_for_the_last_copy(
    fake, helpers, monkeypatch
):
    """Off the CPU a plan copies its table through its own pinned buffer: reused when the
    copy that last read it has run, replaced (not waited for) when it may still be running."""
    sources, segments = _data(helpers, 8)
    out = helpers.poisoned((10, 64), torch.float16)
    plan = plan_segments(sources, segments, out, config=SMALL, capacity=8)

    class Gpu:  # a device other than the CPU; the tensors stay on the CPU
        type = "cuda"

        def __str__(self):
            return "cuda:0"

    buffers, through = [], []
    monkeypatch.setattr(gather_mod, "pinned_words", lambda n: buffers.append(torch.empty(n, dtype=torch.int64))
                        or buffers[-1])  # fmt: skip
    real_upload = table.upload

    def upload(words, device, staging=None, into=None):
        through.append(staging)
        assert staging is not None and staging.numel() >= len(words)
        return real_upload(words, torch.device("cpu"), into=into)

    monkeypatch.setattr(gather_mod, "upload", upload)
    plan.device = Gpu()
    swapped = [(0, 0, 6, 4), (1, 0, 4, 0)]
    plan._load(sources, swapped)  # the plan's first copy off the CPU: a new buffer
    plan._load(sources, segments)  # that copy has run: the same buffer
    fake.pending = {plan.upload_event}  # this copy is still running when the next comes
    plan._load(sources, swapped)
    assert len(buffers) == 2 and through[0] is through[1] is buffers[0] and through[2] is buffers[1]
    assert not any(e[0] == "synchronize" for e in fake.log)
    plan.device = out.device
    run_segments(plan, out)
    helpers.assert_bitwise_equal(out, _expected(helpers, sources, swapped, 10))


def test_capture_refuses_a_plan_without_capacity(fake, helpers):
    sources, segments = _data(helpers, 6)
    out = helpers.poisoned((10, 64), torch.float16)
    plan = plan_segments(sources, segments, out, config=SMALL)  # grid = today's tile count
    empty = plan_segments(sources, [], out, config=SMALL)
    run_segments(plan, out)
    fake.capture = True
    fake.log.clear()
    with pytest.raises(GraphCaptureError, match="capacity"):
        run_segments(plan, out)
    assert not any(e[0] == "launch" for e in fake.log)
    with pytest.raises(GraphCaptureError, match="capacity"):
        run_segments(empty, out)


def test_update_in_place_waits_for_every_other_stream_the_plan_ran_on(fake, helpers):
    sources, segments = _data(helpers, 7)
    out = helpers.poisoned((10, 64), torch.float16)
    fake.set_stream("cpu", "A")
    plan = plan_segments(sources, segments, out, config=SMALL, capacity=8)
    for name in ("B", "C"):
        fake.set_stream("cpu", name)
        run_segments(plan, out)
    fake.set_stream("cpu", "A")
    fake.log.clear()
    plan.update(sources, [(0, 0, 6, 4), (1, 0, 4, 0)])
    kinds = [e for e in fake.log if e[0] in ("record", "wait", "upload")]
    # B's and C's queued launches are waited for, on A, before the table is rewritten.
    (rec_b, wait_b, rec_c, wait_c, upload, _) = kinds
    assert rec_b[:2] == ("record", "B") and wait_b == ("wait", "A", rec_b[2])
    assert rec_c[:2] == ("record", "C") and wait_c == ("wait", "A", rec_c[2])
    assert upload == ("upload", "cpu", "A")


def test_placeholder_ids_on_another_device_are_refused_under_capture(fake, helpers):
    from mm_schedule.kernels import embed_with_placeholders, merge_by_placeholder_ids

    ids = torch.tensor([5, 9, 9, 5])
    rows = helpers.random_rows(2, 64, torch.float32)
    embeds = helpers.random_rows(4, 64, torch.float32)
    before = embeds.clone()
    weight = helpers.random_rows(16, 64, torch.float32)
    host_ids = torch.tensor([9], device="meta")  # stands for ids left on the host
    fake.capture = True
    with pytest.raises(GraphCaptureError, match="placeholder_ids"):
        merge_by_placeholder_ids(ids, host_ids, rows, embeds)
    with pytest.raises(GraphCaptureError, match="placeholder_ids"):
        embed_with_placeholders(ids, weight, rows, host_ids)
    helpers.assert_bitwise_equal(embeds, before)
    merge_by_placeholder_ids(ids, 9, rows, embeds)  # Python ids are capturable
    expected = before.clone()
    expected[ids == 9] = rows
    helpers.assert_bitwise_equal(embeds, expected)


class FakeEvent:
    """A CUDA event whose completion the test decides: ``query()`` is False until the
    device "has run" the work before it (``finish``), ``synchronize()`` waits for that."""

    def __init__(self, log):
        self.log, self.recorded, self.done = log, 0, True

    def record(self):
        self.recorded += 1
        self.done = False
        self.log.append(("record", id(self)))

    def query(self):
        self.log.append(("query", id(self)))
        return self.done

    def synchronize(self):
        self.log.append(("synchronize", id(self)))
        self.done = True


def _ring(log, allocations=None):
    def empty(n):
        if allocations is not None:
            allocations.append(n)
        return torch.full((n,), -1, dtype=torch.int64)

    events = []

    def new_event():
        events.append(FakeEvent(log))
        return events[-1]

    ring = staging.StagingRing(empty, empty, new_event)
    ring.events = events
    return ring


@pytest.mark.parametrize("c_helper", [True, False])
def test_staging_ring_reuses_a_slot_once_the_launch_that_read_it_has_run(helpers, monkeypatch, c_helper):
    if not c_helper:
        monkeypatch.setattr(table, "_stream_copy", None)  # packed in Python
    elif table._stream_copy is None:
        pytest.skip("the C helper is not built")
    log, allocations = [], []
    ring = _ring(log, allocations)
    sources = [helpers.random_rows(4, 64, torch.float16) for _ in range(3)]
    staged = []
    for call in range(2 * ring.SLOTS + 1):
        segments = [(i % 3, 0, 1 + (call + i) % 4, 4 * i) for i in range(2 + call % 3)]
        device_table, aligned, slot, _, _ = table.build_table(
            segments, sources, torch.device("cpu"), ring, lambda rows: 2
        )
        words = table.table_words(segments, [s.data_ptr() for s in sources], 2)
        # The device table holds the words (then stale words the header keeps unread).
        assert device_table[: len(words)].tolist() == list(words)
        assert aligned == all(s.data_ptr() % 16 == 0 for s in sources)
        slot.launched()
        for event in ring.events:
            event.done = True  # the device keeps up
        staged.append(slot)
    # One host and one device buffer per slot (8 + 8, plus growth for a longer table); every
    # later call reuses the slot of SLOTS calls before, after asking (not waiting) whether
    # its launch has run.
    assert len(ring) == ring.SLOTS and len(allocations) <= 4 * ring.SLOTS
    for call in range(ring.SLOTS, len(staged)):
        assert staged[call] is staged[call - ring.SLOTS]
    assert not any(e[0] == "synchronize" for e in log)
    first = staged[0].event
    assert log.index(("query", id(first))) > log.index(("record", id(first)))


def test_staging_ring_adds_slots_instead_of_waiting_while_launches_are_in_flight(helpers):
    log = []
    ring = _ring(log)
    sources = [helpers.random_rows(4, 64, torch.float16)]
    calls = 3 * ring.SLOTS + 5
    slots = []
    for call in range(calls):  # the device runs nothing meanwhile
        _, _, slot, _, _ = table.build_table([(0, 0, 2, 2 * call)], sources, torch.device("cpu"), ring, lambda rows: 16)
        slot.launched()
        slots.append(slot)
    assert not any(e[0] == "synchronize" for e in log)  # the host never waited
    assert len({id(s) for s in slots}) == calls == len(ring)  # no slot was shared
    # Once the device has caught up, the oldest slots are reused first, in launch order.
    for event in ring.events:
        event.done = True
    again = [table.build_table([(0, 0, 2, 0)], sources, torch.device("cpu"), ring, lambda rows: 16)[2] for _ in range(3)]
    for slot in again:
        slot.launched()
    assert again == slots[:3] and len(ring) == calls


def test_staging_ring_waits_only_at_its_limit_and_then_for_the_oldest_launch(helpers, monkeypatch):
    monkeypatch.setattr(staging.StagingRing, "MAX_SLOTS", 10)
    log = []
    ring = _ring(log)
    sources = [helpers.random_rows(4, 64, torch.float16)]
    slots = []
    for call in range(12):
        slot = table.build_table([(0, 0, 1, call)], sources, torch.device("cpu"), ring, lambda rows: 16)[2]
        slot.launched()
        slots.append(slot)
    assert len(ring) == 10
    waited = [e[1] for e in log if e[0] == "synchronize"]
    assert waited == [id(slots[0].event), id(slots[1].event)] and slots[10:] == slots[:2]


def test_staging_ring_never_gives_one_slot_to_two_threads(helpers):
    """Threads staging on one device at once: a slot is held from its claim until its
    launch, so no two threads ever write one table."""
    import threading

    log = []
    ring = _ring(log)
    sources = [helpers.random_rows(64, 64, torch.float16)]
    holders: dict = {}
    clashes, errors = [], []
    start = threading.Barrier(6)

    def worker(n):
        try:
            start.wait()
            for call in range(200):
                slot = table.build_table([(0, n, 1 + call % 7, call)], sources, torch.device("cpu"), ring, lambda rows: 16)[2]
                if holders.setdefault(id(slot), n) != n:
                    clashes.append(id(slot))
                # The table this thread staged is still its own until it launches.
                assert slot.device[2:6].tolist() == [0, n, 1 + call % 7, call]  # after the header and tile_end
                del holders[id(slot)]
                slot.launched()
                for event in list(ring.events):
                    event.done = True
        except Exception as exc:  # reported below: an assert in a thread would be lost
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not clashes


# --- the CUDA layer itself, with torch.cuda stubbed -------------------------------------


class StubCuda:
    """torch.cuda as the CUDA layer uses it: a current device, a device guard, and the
    capture state of each device's current stream."""

    def __init__(self, current=0):
        self.current, self.log, self.capturing_on = current, [], set()

    def current_device(self):
        return self.current

    def device(self, device):
        cuda = self

        class Guard:
            def __enter__(self):
                self.previous, cuda.current = cuda.current, device.index
                cuda.log.append(("enter", device.index))

            def __exit__(self, *exc):
                cuda.current = self.previous
                cuda.log.append(("exit", device.index))

        return Guard()

    def is_current_stream_capturing(self):
        return self.current in self.capturing_on


@pytest.fixture
def stub_cuda(monkeypatch):
    from mm_schedule.kernels import streams

    cuda = StubCuda()
    for name in ("current_device", "device", "is_current_stream_capturing"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: f"raw{index}", raising=False)
    return cuda, streams.CudaLayer()


def test_cuda_guard_enters_the_destination_device_only_when_it_is_not_current(stub_cuda):
    cuda, layer = stub_cuda
    with layer.guard(torch.device("cuda", 1)):
        assert cuda.current == 1
        assert layer.current_raw(torch.device("cuda", 1)) == "raw1"
    assert cuda.current == 0 and cuda.log == [("enter", 1), ("exit", 1)]
    cuda.log.clear()
    for device in (torch.device("cuda", 0), torch.device("cuda")):  # already current
        with layer.guard(device):
            assert cuda.current == 0
    assert cuda.log == []
    assert layer.current_raw(torch.device("cuda")) == "raw0"


def test_cuda_capture_state_is_read_on_the_destination_device(stub_cuda):
    cuda, layer = stub_cuda
    cuda.capturing_on = {1}
    assert layer.capturing(torch.device("cuda", 1)) and cuda.current == 0
    assert not layer.capturing(torch.device("cuda", 0))
    cuda.current = 1
    assert not layer.capturing(torch.device("cuda", 0)) and cuda.current == 1
