"""The packed scatter that writes a fused table off the CPU in a fixed number of calls."""

import random

import pytest
import torch

from mm_schedule.kernels.segment_copy import trusted
from mm_schedule.kernels.segment_copy.trusted import scatter_rows


def _table(rng: random.Random, n_segments: int, hidden: int, dtype: torch.dtype):
    """Segments of random lengths at random, non-overlapping destination rows, in random order."""
    counts = [rng.randint(1, 9) for _ in range(n_segments)]
    rows, row = [], 0
    for n in counts:
        row += rng.randint(0, 5)  # text rows between placeholders
        rows.append(row)
        row += n
    order = list(range(n_segments))
    rng.shuffle(order)
    counts, rows = [counts[i] for i in order], [rows[i] for i in order]
    views = [torch.randn(n, hidden, dtype=dtype) for n in counts]
    return views, counts, rows, row + rng.randint(0, 5)


@pytest.mark.parametrize("dst_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_segments", [1, 7, 300])
def test_rows_land_where_the_table_says_and_nowhere_else(n_segments, dst_dtype):
    rng = random.Random(n_segments)
    views, counts, rows, total = _table(rng, n_segments, 24, torch.float32)
    dst = torch.full((total, 24), float("nan"), dtype=dst_dtype)  # poisoned
    want = dst.clone()
    for v, n, r in zip(views, counts, rows):
        want[r : r + n] = v.to(dst_dtype)
    assert scatter_rows(views, counts, rows, dst) is dst
    assert torch.equal(dst.isnan(), want.isnan())  # the gaps are untouched
    assert torch.equal(dst.nan_to_num(), want.nan_to_num())


def test_a_fused_table_off_the_cpu_takes_the_scatter(monkeypatch):
    # meta holds no data: what can be seen is that the scatter ran, with the table's columns.
    calls = []
    monkeypatch.setattr(trusted, "scatter_rows", lambda *a: calls.append(a) or a[-1])
    n = trusted.SCATTER_MIN_SEGMENTS
    sources = [torch.empty(4, 8, device="meta") for _ in range(n)]
    segments = [(i, 0, 4, 6 * i) for i in range(n)]  # two text rows between placeholders
    dst = torch.empty(6 * n, 8, device="meta")
    trusted._copy_with_torch(sources, segments, dst)
    ((views, counts, rows, out),) = calls
    assert len(views) == n and out is dst and list(counts) == [4] * n and list(rows) == [6 * i for i in range(n)]
    # Fewer segments: the per-segment views (cheaper below the threshold).
    calls.clear()
    trusted._copy_with_torch(sources[:3], segments[:3], dst)
    assert not calls
