"""The C helper's own copies: a large packed result appended with streaming stores (the
same bytes as ``torch.cat``), and its range checks, which run before any byte moves.
Destinations are poisoned first and compared bit for bit."""

import random

import pytest
import torch

from mm_schedule.kernels.segment_copy import host_copy
from mm_schedule.kernels.segment_copy.host_copy import append_whole_sources

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8]


@pytest.fixture
def helper(monkeypatch):
    if host_copy._stream_copy is None:
        pytest.skip("the C helper is not built in this install")
    monkeypatch.setattr(host_copy, "STREAM_MIN_BYTES", 0)  # small tensors take the large-result path
    return host_copy._stream_copy


def _poisoned(rows: int, hidden: int, dtype) -> torch.Tensor:
    return torch.full((rows, hidden * dtype.itemsize), 0xA5, dtype=torch.uint8).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_streaming_append_is_torch_cat(helper, dtype):
    """Random row counts (so sources start at every alignment), empty sources included."""
    rng = random.Random()
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    hidden = rng.choice([1, 3, 8, 24, 100])
    sources = []
    for _ in range(rng.randint(1, 40)):
        rows = rng.choice([0, 1, rng.randint(2, 90)])
        sources.append(torch.randn(rows, hidden, generator=gen, dtype=torch.float64).mul(50).to(dtype))
    total = sum(s.shape[0] for s in sources)
    dst = _poisoned(total, hidden, dtype)
    assert append_whole_sources(sources, [s.shape[0] for s in sources], dst)
    assert torch.equal(dst.view(torch.uint8), torch.cat(sources).view(torch.uint8))


def test_streaming_append_checks_the_total_before_writing(helper):
    sources = [torch.randn(2, 8), torch.randn(3, 8)]
    for rows in ([2, 2], [2, 4], [2**62, 2**62]):
        dst = _poisoned(5, 8, torch.float32)
        with pytest.raises(ValueError, match="append_rows"):
            append_whole_sources(sources, rows, dst)
        assert torch.equal(dst, _poisoned(5, 8, torch.float32))  # nothing written
    with pytest.raises(ValueError, match="2 tensors but 1 row counts"):
        append_whole_sources(sources, [5], _poisoned(5, 8, torch.float32))


def test_small_or_other_destinations_stay_on_torch_cat(monkeypatch):
    monkeypatch.setattr(host_copy, "STREAM_MIN_BYTES", 1 << 20)
    assert not append_whole_sources([torch.randn(4, 8)], [4], torch.empty(4, 8))
    monkeypatch.setattr(host_copy, "STREAM_MIN_BYTES", 0)
    assert not append_whole_sources([torch.randn(4, 8)], [4], torch.empty(4, 8, device="meta"))
    assert not append_whole_sources([torch.randn(4, 8)], [4], torch.empty(8, 4).t())  # not contiguous


@pytest.mark.parametrize("streaming", [False, True])
def test_every_range_is_checked_before_copying(helper, streaming):
    src, dst = torch.arange(4.0), torch.full((4,), -1.0)
    args = (dst.data_ptr(), 16, src.data_ptr(), 16)
    for write_from, read_from, lengths, message in (
        ([0, 12], [0, 0], [4, 8], "range 1 lies outside the destination"),
        ([0, 0], [0, 12], [4, 8], "range 1 reads outside the sources"),
        ([0, -4], [0, 0], [4, 4], "range 1 lies outside the destination"),
        ([0], [0], [-4], "negative length"),
        ([0], [0, 0], [4], "read_from must be a list of 1 ints"),
    ):
        with pytest.raises(ValueError, match=message):
            helper.copy_ranges(*args, write_from, read_from, lengths, streaming)
        assert dst.tolist() == [-1.0] * 4  # nothing written, not even the good first range
    helper.copy_ranges(*args, [0, 8, 99], [8, 0, -5], [8, 8, 0], streaming)
    assert dst.tolist() == [2.0, 3.0, 0.0, 1.0]  # an empty range may point anywhere
