"""Fused merge: segments written straight into input_embeds (Triton, interpreted)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule.errors import SegmentError
from mm_schedule.kernels import merge_segments


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**31 - 1),
    n_items=st.integers(0, 5),
    src_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    dst_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    hidden=st.sampled_from([64, 96, 130]),
)
def test_merge_matches_a_mask_scatter(
    triton_backend, helpers, seed, n_items, src_dtype, dst_dtype, hidden
):
    gen = torch.Generator().manual_seed(seed)
    n_tokens = 48
    text = helpers.random_rows(n_tokens, hidden, dst_dtype, gen)
    # Each item: an embedding of some rows, a window into it, placed at distinct token rows.
    sources, segments, mask = [], [], torch.zeros(n_tokens, dtype=torch.bool)
    free = torch.randperm(n_tokens // 6, generator=gen)[:n_items]
    for i, slot in enumerate(free.tolist()):
        rows = int(torch.randint(1, 12, (), generator=gen))
        sources.append(helpers.random_rows(rows, hidden, src_dtype, gen))
        start = int(torch.randint(0, rows, (), generator=gen))
        n = min(rows - start, 6)
        segments.append((i, start, n, slot * 6))
        mask[slot * 6 : slot * 6 + n] = True
    embeds = text.clone()
    assert merge_segments(sources, segments, embeds) is embeds
    # Independent oracle: the vLLM/HF path (cat of the slices, then masked_scatter_).
    expected = text.clone()
    if segments:
        order = sorted(segments, key=lambda s: s[3])
        packed = torch.cat([sources[s][r : r + n] for s, r, n, _ in order]).to(dst_dtype)
        expected.masked_scatter_(mask[:, None], packed)
    helpers.assert_bitwise_equal(embeds, expected)


def test_text_rows_are_untouched_even_when_poisoned(triton_backend, helpers):
    embeds = helpers.poisoned((20, 64), torch.bfloat16)
    source = helpers.random_rows(5, 64, torch.float32)
    merge_segments([source], [(0, 1, 4, 10)], embeds)
    assert torch.equal(embeds[10:14], source[1:5].to(torch.bfloat16))
    assert embeds[:10].isnan().all() and embeds[14:].isnan().all()


def test_rows_past_input_embeds_are_refused(triton_backend, helpers):
    embeds = helpers.poisoned((8, 64), torch.float16)
    with pytest.raises(SegmentError, match="outside a destination of 8 rows"):
        merge_segments([helpers.random_rows(5, 64, torch.float16)], [(0, 0, 5, 4)], embeds)
    assert embeds.isnan().all()
