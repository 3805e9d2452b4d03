"""Loose segment fields and plan updates, on both backends: integers of any kind copy the
right rows, anything else is a typed error naming the segment, never a crop or a crash."""

import numpy as np
import pytest
import torch

from mm_schedule.errors import KernelInputError, SegmentError
from mm_schedule.kernels.segment_copy.contract import check_segments
from mm_schedule.kernels.segment_copy.launch import (
    gather_segments,
    merge_segments,
    plan_segments,
    run_segments,
)


@pytest.fixture(params=["torch", "triton"])
def either_backend(request, monkeypatch):
    from mm_schedule.kernels.backend import refresh_backend

    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", request.param)
    refresh_backend()
    return request.param


def loop_reference(sources, segments, rows):
    out = torch.full((rows, sources[0].shape[1]), float("nan"), dtype=sources[0].dtype)
    for s, r, n, d in segments:
        out[d : d + n] = sources[s][r : r + n]
    return out


INTEGER_KINDS = {
    "numpy-int64": np.int64,
    "numpy-int32": np.int32,
    "numpy-uint16": np.uint16,
    "torch-0d": lambda v: torch.tensor(v),
}


@pytest.mark.parametrize("kind", sorted(INTEGER_KINDS))
@pytest.mark.parametrize("n_segments", [1, 3])  # one segment launches without a table
def test_integer_fields_of_any_kind_copy_the_right_rows(either_backend, helpers, kind, n_segments):
    convert = INTEGER_KINDS[kind]
    sources = [helpers.random_rows(7, 64, torch.float32), helpers.random_rows(5, 64, torch.float32)]
    plain = [(1, 1, 4, 3), (0, 0, 2, 0), (0, 5, 2, 8)][:n_segments]
    segments = [tuple(convert(v) for v in seg) for seg in plain]
    rows = 11
    out = helpers.poisoned((rows, 64), torch.float32)
    gather_segments(sources, segments, out=out)
    helpers.assert_bitwise_equal(out, loop_reference(sources, plain, rows))

    merged = helpers.poisoned((rows, 64), torch.float32)
    merge_segments(sources, segments, merged)
    helpers.assert_bitwise_equal(merged, out)

    packed = gather_segments(sources, [tuple(convert(v) for v in (0, 2, 3, 0))])
    assert torch.equal(packed, sources[0][2:5])


BAD_FIELDS = [
    ((0, 0.0, 4, 0), "src_row must be an integer, got float"),
    ((0, 0, 4.0, 0), "n_rows must be an integer, got float"),
    ((0, 0, 4, np.float32(1)), "dst_row must be an integer, got float32"),
    ((True, 0, 4, 0), "source is a bool"),
    ((0, 0, np.True_, 0), "n_rows must be an integer, got bool"),
    ((0, 0, torch.tensor(True), 0), "n_rows is a bool"),
    ((0, torch.tensor(1.0), 4, 0), "src_row must be an integer, got Tensor"),
    ((0, "1", 4, 0), "src_row must be an integer, got str"),
    ((0, 0, 4), r"must be \(source, src_row, n_rows, dst_row\)"),
    (7, r"must be \(source, src_row, n_rows, dst_row\)"),
]


@pytest.mark.parametrize("segment, message", BAD_FIELDS, ids=[repr(b[0]) for b in BAD_FIELDS])
def test_non_integer_fields_are_refused_before_anything_is_written(either_backend, helpers, segment, message):
    sources = [helpers.random_rows(8, 64, torch.float32)]
    for call in (
        lambda out: gather_segments(sources, [(0, 4, 1, 6), segment], out=out),
        lambda out: merge_segments(sources, [segment], out),
        lambda out: plan_segments(sources, [segment], out),
    ):
        out = helpers.poisoned((8, 64), torch.float32)
        with pytest.raises(SegmentError, match=message) as caught:
            call(out)
        assert "segment" in str(caught.value)
        assert out.isnan().all()
    with pytest.raises(SegmentError, match=message):
        gather_segments(sources, [segment])  # sizing the buffer checks the table first


def test_check_segments_returns_plain_int_segments():
    checked = check_segments([(np.int64(0), torch.tensor(1), 2, np.int8(3))], [8], 8)
    assert checked == [(0, 1, 2, 3)]
    assert all(type(v) is int for v in checked[0])


@pytest.mark.parametrize("new_dtype", [torch.bfloat16, torch.float16, torch.int32])
def test_update_with_another_source_dtype_is_a_typed_error(either_backend, helpers, new_dtype):
    sources = [helpers.random_rows(8, 64, torch.float32)]
    dest = helpers.poisoned((8, 64), torch.float32)
    plan = plan_segments(sources, [(0, 0, 8, 0)], dest, capacity=4)
    assert plan.backend == either_backend
    other = [torch.ones(8, 64, dtype=new_dtype)]
    with pytest.raises(KernelInputError, match=f"(float32|{str(new_dtype)[6:]})"):
        plan.update(other, [(0, 0, 8, 0)])
    # The refused update left the plan as it was.
    run_segments(plan, dest)
    helpers.assert_bitwise_equal(dest, sources[0])


def test_update_with_loose_fields(either_backend, helpers):
    sources = [helpers.random_rows(8, 64, torch.float32)]
    dest = helpers.poisoned((8, 64), torch.float32)
    plan = plan_segments(sources, [(0, 0, 8, 0)], dest, capacity=4)
    fresh = [helpers.random_rows(8, 64, torch.float32)]
    with pytest.raises(SegmentError, match="n_rows must be an integer"):
        plan.update(fresh, [(0, 0, 8.0, 0)])
    plan.update(fresh, [(np.int64(0), np.int64(0), np.int64(8), np.int64(0))])
    run_segments(plan, dest)
    helpers.assert_bitwise_equal(dest, fresh[0])

