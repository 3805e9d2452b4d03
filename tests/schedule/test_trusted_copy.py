"""The scheduler's trusted segment copy writes exactly what the naive loop writes."""

import random

import pytest
import torch

from mm_schedule.kernels.segment_copy.trusted import copy_segments

from .conftest import BACKENDS


def _table(rng: random.Random, layout: str):
    n_sources = rng.randint(1, 6)
    rows = [rng.randint(1, 9) for _ in range(n_sources)]
    pieces = []
    for s, n in enumerate(rows):
        if layout == "whole":
            pieces.append((s, 0, n))
            continue
        r = rng.randrange(n)
        pieces.append((s, r, rng.randint(1, n - r)))
    if layout != "whole":
        pieces += [(s, 0, rows[s]) for s in rng.sample(range(n_sources), rng.randint(0, n_sources))]
        rng.shuffle(pieces)
    segments, dst_row = [], rng.randint(0, 2)
    for s, r, n in pieces:
        segments.append((s, r, n, dst_row))
        dst_row += n + (rng.randint(0, 2) if layout == "gaps" else 0)
    if layout == "shuffled":
        rng.shuffle(segments)
    return rows, segments, dst_row + rng.randint(0, 2)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("layout", ["whole", "packed", "gaps", "shuffled"])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32)])
def test_copy_segments_matches_naive_loop(backend, layout, dtypes):
    rng = random.Random(f"{layout} {dtypes}")
    src_dtype, dst_dtype = dtypes
    for _ in range(20):
        rows, segments, dst_rows = _table(rng, layout)
        hidden = rng.choice([4, 16])
        sources = [torch.randn(n, hidden).to(src_dtype) for n in rows]
        dst = torch.full((dst_rows, hidden), float("nan"), dtype=dst_dtype)
        want = dst.clone()
        for s, r, n, d in segments:
            want[d : d + n] = sources[s][r : r + n].to(dst_dtype)
        assert copy_segments(sources, segments, dst) is dst
        assert torch.equal(dst.isnan(), want.isnan())
        assert torch.equal(dst.nan_to_num(), want.nan_to_num())


def test_empty_table_leaves_destination_alone():
    dst = torch.full((3, 4), 7.0)
    assert copy_segments([], [], dst) is dst
    assert torch.equal(dst, torch.full((3, 4), 7.0))


@pytest.mark.parametrize("shuffled", [False, True])
def test_many_scattered_segments(shuffled):
    """More segments than one group of destination views, with text rows between them."""
    rng = random.Random(f"many {shuffled}")
    sources = [torch.randn(rng.randint(1, 4), 4) for _ in range(700)]
    segments, row = [], 0
    for s, src in enumerate(sources):
        r = rng.randrange(src.shape[0])
        n = rng.randint(1, src.shape[0] - r)
        segments.append((s, r, n, row))
        row += n + rng.randint(0, 2)
    if shuffled:
        rng.shuffle(segments)
    dst = torch.full((row + 1, 4), float("nan"))
    want = dst.clone()
    for s, r, n, d in segments:
        want[d : d + n] = sources[s][r : r + n]
    copy_segments(sources, segments, dst)
    assert torch.equal(dst.nan_to_num(), want.nan_to_num()) and torch.equal(dst.isnan(), want.isnan())


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_whole_sources_hint_copies_the_same_rows(backend):
    """A table that declares itself every source once, whole, in order: the rows land as
    the table says, and rows of ``dst`` past the table keep their poison."""
    from mm_schedule.assemble import SegmentTable

    sources = [torch.randn(n, 8) for n in (3, 1, 5)]
    starts = [0, 3, 4]
    table = SegmentTable([0, 1, 2], [0, 0, 0], [3, 1, 5], starts, whole_sources_rows=9)
    dst = torch.full((11, 8), float("nan"))
    copy_segments(sources, table, dst)
    assert torch.equal(dst[:9], torch.cat(sources)) and torch.isnan(dst[9:]).all()


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_whole_sources_hint_with_gaps_leaves_the_gaps_alone(backend):
    """A table that declares every segment its own source, whole, with rows of ``dst``
    between the segments: each source lands at its row, every other row keeps its poison."""
    from mm_schedule.assemble import SegmentTable

    gen = torch.Generator().manual_seed(random.randrange(2**31))
    counts = [int(c) for c in torch.randint(1, 6, (5,), generator=gen)]
    gaps = [int(g) for g in torch.randint(0, 3, (5,), generator=gen)]
    sources = [torch.randn(n, 8, generator=gen) for n in counts]
    starts, row = [], 1
    for n, g in zip(counts, gaps):
        starts.append(row)
        row += n + g
    table = SegmentTable(list(range(5)), [0] * 5, counts, starts, whole_sources=True)
    dst = torch.full((row + 1, 8), float("nan"))
    want = dst.clone()
    for src, d in zip(sources, starts):
        want[d : d + src.shape[0]] = src
    copy_segments(sources, table, dst)
    assert torch.equal(dst.nan_to_num(), want.nan_to_num()) and torch.equal(dst.isnan(), want.isnan())
