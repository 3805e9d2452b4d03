"""The ends of the supported hidden-size range (64 and 16384) with the heuristic configs."""

import pytest
import torch

from mm_schedule.kernels import embed_with_placeholders, gather_segments, merge_segments
from mm_schedule.kernels.placeholder_merge import embed_with_placeholders_ref
from mm_schedule.kernels.segment_copy.launch import gather_segments_ref


@pytest.mark.parametrize("hidden", [64, 16384])
@pytest.mark.parametrize(
    ("src_dtype", "dtype"),
    [
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.bfloat16),
        (torch.float16, torch.float32),
    ],
)
def test_gather_and_merge_at_hidden_extremes(triton_backend, helpers, hidden, src_dtype, dtype):
    g = torch.Generator().manual_seed(hidden)
    sources = [torch.randn(n, hidden, generator=g).to(src_dtype) for n in (3, 1, 5)]
    segments = [(2, 1, 3, 0), (0, 0, 3, 3), (1, 0, 1, 7)]
    out = helpers.poisoned((9, hidden), dtype)
    expected = helpers.poisoned((9, hidden), dtype)
    gather_segments(sources, segments, out=out)
    gather_segments_ref(sources, segments, expected)
    helpers.assert_bitwise_equal(out, expected)
    assert torch.isnan(out[6].float()).all() and torch.isnan(out[8].float()).all()

    embeds = helpers.poisoned((9, hidden), dtype)
    merge_segments(sources, segments, embeds)
    helpers.assert_bitwise_equal(embeds, expected)


@pytest.mark.parametrize("hidden", [64, 16384])
def test_fused_lookup_at_hidden_extremes(triton_backend, helpers, hidden):
    g = torch.Generator().manual_seed(hidden + 1)
    weight = torch.randn(50, hidden, generator=g).to(torch.bfloat16)
    ids = torch.tensor([3, 1_000_007, 1_000_007, 49, 0, 1_000_007])
    mm = torch.randn(3, hidden, generator=g).to(torch.bfloat16)
    out = embed_with_placeholders(
        ids, weight, mm, 1_000_007, out=helpers.poisoned((6, hidden), torch.bfloat16)
    )
    expected = embed_with_placeholders_ref(
        ids, weight, mm, 1_000_007, helpers.poisoned((6, hidden), torch.bfloat16)
    )
    helpers.assert_bitwise_equal(out, expected)
    assert torch.equal(out[[1, 2, 5]], mm) and torch.equal(out[0], weight[3])
