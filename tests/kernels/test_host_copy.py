"""Byte copies of row ranges between CPU tensors: the same rows as a naive torch loop,
every byte outside the segments untouched, and a wrong table refused, never obeyed."""

import random

import pytest
import torch

from mm_schedule.kernels.segment_copy import host_copy
from mm_schedule.kernels.segment_copy.host_copy import can_copy_bytes, copy_row_ranges

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8]


@pytest.fixture(autouse=True, params=["c-helper", "c-helper streaming", "memoryview"])
def byte_copies(request, monkeypatch):
    """Every test on each way bytes move: the C helper with ordinary stores, with streaming
    stores (any destination counts as large), and the memoryview loop it replaces."""
    if request.param == "memoryview":
        monkeypatch.setattr(host_copy, "_stream_copy", None)
    elif host_copy._stream_copy is None:
        pytest.skip("the C helper is not built in this install")
    elif request.param == "c-helper streaming":
        monkeypatch.setattr(host_copy, "STREAM_MIN_BYTES", 0)
    return request.param


def _random_step(rng: random.Random, gen: torch.Generator, dtype, hidden: int):
    sources = []
    for _ in range(rng.randint(1, 12)):
        rows = rng.randint(1, 7)
        values = torch.randint(-100, 100, (rows, hidden), generator=gen) if dtype is torch.int8 else \
            torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
        sources.append(values.to(dtype))
    segments, row = [], rng.randint(0, 3)
    for s, src in enumerate(sources):
        for _ in range(rng.randint(1, 2)):
            r = rng.randrange(src.shape[0])
            n = rng.randint(1, src.shape[0] - r)
            segments.append((s, r, n, row))
            row += n + rng.randint(0, 3)
    rng.shuffle(segments)
    return sources, segments, row + rng.randint(0, 3)


def _poisoned(rows: int, hidden: int, dtype) -> torch.Tensor:
    # A byte pattern no source produces by chance, compared bit for bit below.
    return torch.full((rows, hidden * dtype.itemsize), 0xA5, dtype=torch.uint8).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_land_where_the_table_says_and_nowhere_else(dtype):
    rng = random.Random()
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    for _ in range(25):
        hidden = rng.choice([1, 3, 8, 64])
        sources, segments, rows = _random_step(rng, gen, dtype, hidden)
        dst = _poisoned(rows, hidden, dtype)
        want = dst.clone()
        for s, r, n, d in segments:
            want[d : d + n] = sources[s][r : r + n]
        assert can_copy_bytes(sources, dst)
        copy_row_ranges(sources, *zip(*segments), dst)
        assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))


def test_whole_sources_in_order_with_gaps():
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    sources = [torch.randn(n, 16, generator=gen) for n in (4, 1, 6, 2)]
    starts = [1, 7, 8, 17]
    dst = _poisoned(20, 16, torch.float32)
    want = dst.clone()
    for src, d in zip(sources, starts):
        want[d : d + src.shape[0]] = src
    copy_row_ranges(sources, range(4), [0] * 4, [s.shape[0] for s in sources], starts, dst, whole_sources=True)
    assert torch.equal(dst.view(torch.int32), want.view(torch.int32))


def test_views_into_a_larger_tensor_are_read_at_their_own_offset():
    """Sources that are row slices of one batch output share its storage; each is read
    from its own first row."""
    batch = torch.randn(30, 8)
    sources = [batch[3:7], batch[20:29], batch[0:2]]
    dst = _poisoned(16, 8, torch.float32)
    copy_row_ranges(sources, [1, 0, 2, 1], [2, 0, 0, 0], [7, 4, 2, 1], [0, 8, 13, 15], dst)
    assert torch.equal(dst[0:7], batch[22:29]) and torch.equal(dst[8:12], batch[3:7])
    assert torch.equal(dst[13:15], batch[0:2]) and torch.equal(dst[15:16], batch[20:21])
    assert (dst[7].view(torch.int32) == dst[12].view(torch.int32)).all()  # poison left alone


@pytest.mark.parametrize(
    "segment, error",
    [
        ((0, 2, 3, 0), IndexError),  # rows 2..4 of a 4-row source
        ((0, -1, 1, 0), IndexError),
        ((0, 0, 1, -1), IndexError),  # negative rows would wrap to the end of dst
        ((0, 0, 4, 7), ValueError),  # runs past the end of dst
    ],
)
def test_a_wrong_table_raises_before_writing_outside_the_segments(segment, error):
    sources = [torch.randn(4, 8), torch.randn(5, 8)]  # the second one lies beyond the first, maybe
    dst = _poisoned(10, 8, torch.float32)
    before = dst.clone()
    with pytest.raises(error):
        copy_row_ranges(sources, *zip(segment), dst)
    assert torch.equal(dst.view(torch.int32), before.view(torch.int32))


def test_a_whole_source_count_that_disagrees_raises():
    sources = [torch.randn(4, 8)]
    dst = _poisoned(10, 8, torch.float32)
    with pytest.raises(ValueError):
        copy_row_ranges(sources, [0], [0], [3], [0], dst, whole_sources=True)


def test_only_plain_contiguous_cpu_tensors_of_the_destination_dtype_qualify():
    dst = torch.empty(6, 8)
    ok = [torch.randn(2, 8), torch.randn(3, 8)]
    assert can_copy_bytes(ok, dst)
    assert not can_copy_bytes([ok[0], torch.randn(3, 8, dtype=torch.float64)], dst)  # needs a cast
    assert not can_copy_bytes([ok[0], torch.randn(8, 3).t()], dst)  # strided
    assert not can_copy_bytes([ok[0], torch.randn(3, 16)[:, :8]], dst)  # rows with a longer stride
    assert not can_copy_bytes([ok[0], torch.empty(3, 8, device="meta")], dst)
    assert not can_copy_bytes(ok, torch.empty(8, 6).t())
    assert not can_copy_bytes(ok, torch.empty(2, 3, 8))
    assert not can_copy_bytes(ok, torch._neg_view(torch.empty(6, 8)))
    assert not can_copy_bytes([ok[0], torch._neg_view(torch.randn(3, 8))], dst)  # bytes are not the values


def test_an_empty_source_is_ignored_until_a_segment_names_it():
    sources = [torch.randn(3, 8), torch.empty(0, 8), torch.randn(2, 8)]
    dst = _poisoned(6, 8, torch.float32)
    copy_row_ranges(sources, [0, 2], [0, 0], [3, 2], [0, 4], dst)
    assert torch.equal(dst[0:3], sources[0]) and torch.equal(dst[4:6], sources[2])
    with pytest.raises(IndexError):
        copy_row_ranges(sources, [1], [0], [1], [3], dst)
    with pytest.raises(ValueError):
        copy_row_ranges(sources, [0, 1, 2], [0, 0, 0], [3, 1, 2], [0, 3, 4], dst, whole_sources=True)
