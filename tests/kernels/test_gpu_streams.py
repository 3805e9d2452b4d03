"""On a real GPU: device guards, stream order, CUDA-graph capture and zero host syncs.

Run by the GPU check (``pytest -m gpu`` with the kernels compiled, not interpreted);
skipped elsewhere. The CPU proofs of the same logic are in ``test_streams.py``.
"""


import pytest
import torch

from mm_schedule.errors import GraphCaptureError
from mm_schedule.kernels.segment_copy.launch import (
    gather_segments,
    gather_segments_ref,
    merge_segments,
    plan_segments,
    run_segments,
)
from mm_schedule.kernels.segment_copy.trusted import copy_segments

pytestmark = pytest.mark.gpu


def _problem(device, seed, n_images=5, hidden=1176, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 300, (n_images,), generator=gen).tolist()
    sources = [torch.randn(n, hidden, generator=gen).to(dtype).to(device) for n in sizes]
    segments, row = [], 2
    for i in torch.randperm(n_images, generator=gen).tolist():
        segments.append((i, 0, sizes[i], row))
        row += sizes[i] + 3
    return sources, segments, row + 1


def _expected(sources, segments, rows, dtype, device):
    out = torch.full((rows, sources[0].shape[1]), float("nan"), dtype=dtype, device=device)
    gather_segments_ref(sources, segments, out)
    return out


def _same(a, b):
    bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.view(bits), b.view(bits))


def test_destination_on_another_device_than_the_current_one(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    target = torch.device("cuda:1")
    with torch.cuda.device(0):
        sources, segments, rows = _problem(target, 1)
        want = _expected(sources, segments, rows, torch.bfloat16, target)
        for segs in (segments, segments[:1]):
            want = _expected(sources, segs, rows, torch.bfloat16, target)
            out = torch.full_like(want, float("nan"))
            gather_segments(sources, segs, out=out)
            torch.cuda.synchronize(target)
            assert _same(out, want)
            out = torch.full_like(want, float("nan"))
            copy_segments(sources, segs, out)
            plan = plan_segments(sources, segs, out)
            run_segments(plan, out)
            torch.cuda.synchronize(target)
            assert _same(out, want)


def test_plan_uploaded_on_a_busy_stream_runs_correctly_on_another(gpu):
    sources, segments, rows = _problem(gpu, 2)
    want = _expected(sources, segments, rows, torch.bfloat16, gpu)
    planner, runner = torch.cuda.Stream(), torch.cuda.Stream()
    out = torch.full_like(want, float("nan"))
    with torch.cuda.stream(planner):
        torch.cuda._sleep(50_000_000)  # the table's copy lands long after the plan returns
        plan = plan_segments(sources, segments, out)
    with torch.cuda.stream(runner):
        run_segments(plan, out)  # must wait for the upload, not read the table early
    torch.cuda.synchronize()
    assert _same(out, want)


def test_per_call_api_on_a_side_stream_and_without_host_syncs(gpu):
    sources, segments, rows = _problem(gpu, 3)
    want = _expected(sources, segments, rows, torch.float32, gpu)
    side = torch.cuda.Stream()
    out = torch.full_like(want, float("nan"))
    packed = torch.full_like(want, float("nan"))
    for call in (
        lambda: merge_segments(sources, segments, out),
        lambda: copy_segments(sources, segments, packed),
    ):
        call()  # compile outside the sync check
    torch.cuda.synchronize()
    out.fill_(float("nan"))
    packed.fill_(float("nan"))
    with torch.cuda.stream(side):
        torch.cuda.set_sync_debug_mode("error")
        try:
            merge_segments(sources, segments, out)
            copy_segments(sources, segments, packed)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert _same(out, want) and _same(packed, want)


def test_capture_refuses_the_per_call_api_and_replays_a_plan(gpu):
    sources, segments, rows = _problem(gpu, 4)
    out = torch.full((rows, sources[0].shape[1]), float("nan"), dtype=torch.bfloat16, device=gpu)
    plan = plan_segments(sources, segments, out, capacity=4096)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        run_segments(plan, out)  # warm-up on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(GraphCaptureError, match="plan_segments"):
        with torch.cuda.graph(graph, stream=capture):
            gather_segments(sources, segments, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        run_segments(plan, out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, _expected(sources, segments, rows, torch.bfloat16, gpu))
    # New sources through update (on the stream that replays), same graph.
    fresh, fresh_segments, _ = _problem(gpu, 5)
    fresh_segments = [(s, r, min(n, 20), d) for s, r, n, d in fresh_segments]
    plan.update(fresh, fresh_segments)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, _expected(fresh, fresh_segments, rows, torch.bfloat16, gpu))


def test_an_empty_step_with_a_fixed_grid_copies_nothing_and_the_context_survives(gpu):
    sources, segments, rows = _problem(gpu, 11)
    out = torch.randn(rows, sources[0].shape[1], device=gpu).to(torch.bfloat16)
    before = out.clone()
    plan = plan_segments(sources, [], out, capacity=256)
    run_segments(plan, out)
    torch.cuda.synchronize()  # an illegal address would surface here
    assert _same(out, before)
    plan.update(sources, segments)
    run_segments(plan, out)
    expected = before.clone()
    gather_segments_ref(sources, segments, expected)
    torch.cuda.synchronize()
    assert _same(out, expected)


def test_staged_calls_past_the_ring_never_wait_for_the_device(gpu):
    """Three rings' worth of per-call tables queued behind a long kernel: the host must
    queue them all while the device is still busy (no wait on a slot's event), and every
    table must still be intact when its launch finally runs."""
    from mm_schedule.kernels.segment_copy.staging import StagingRing

    sources, segments, rows = _problem(gpu, 12)
    tables = [segments[i:] + segments[:i] for i in range(len(segments))]  # other tables, same rows
    want = _expected(sources, segments, rows, torch.bfloat16, gpu)
    outs = [torch.full_like(want, float("nan")) for _ in range(3 * StagingRing.SLOTS)]
    gather_segments(sources, segments, out=outs[0])  # compiles outside the timed part
    torch.cuda.synchronize()
    outs[0].fill_(float("nan"))
    torch.cuda._sleep(1_000_000_000)  # about half a second of device time
    for i, out in enumerate(outs):
        gather_segments(sources, tables[i % len(tables)], out=out)
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    assert still_busy, "the host waited for the device while staging"
    assert all(_same(out, want) for out in outs)


def test_one_trusted_segment_is_captured_only_for_static_sources(gpu):
    sources, segments, rows = _problem(gpu, 13)
    one = segments[:1]
    out = torch.full((rows, sources[0].shape[1]), float("nan"), dtype=torch.bfloat16, device=gpu)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        copy_segments(sources, one, out)  # warm-up: compiles outside the capture
    torch.cuda.synchronize()
    with pytest.raises(GraphCaptureError, match="static_sources"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=capture):
            copy_segments(sources, one, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        copy_segments(sources, one, out, static_sources=True)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, _expected(sources, one, rows, torch.bfloat16, gpu))
