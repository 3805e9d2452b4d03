"""The gather and merge as torch.library custom ops: eager, fake tensors, torch.compile."""

import pytest
import torch

from mm_schedule.errors import SegmentError
from mm_schedule.kernels import gather_segments_op, merge_segments_op
from mm_schedule.kernels.segment_copy.launch import gather_segments_ref


def _case(helpers, seed, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    sources = [helpers.random_rows(n, 64, dtype, gen) for n in (5, 9)]
    segments = [(1, 2, 6, 7), (0, 0, 5, 0), (1, 8, 1, 13)]
    return sources, segments


def _reference(sources, segments, rows, dtype):
    expected = torch.zeros(rows, sources[0].shape[1], dtype=dtype)
    gather_segments_ref(sources, segments, expected)
    return expected


@pytest.mark.parametrize("backend", ["triton_backend", "torch_backend"])
def test_eager_ops_match_the_reference(request, backend, helpers):
    request.getfixturevalue(backend)
    sources, segments = _case(helpers, 1)
    out = gather_segments_op(sources, segments, 16, torch.float32)
    helpers.assert_bitwise_equal(out, _reference(sources, segments, 16, torch.float32))
    embeds = helpers.poisoned((16, 64), torch.bfloat16)
    expected = embeds.clone()
    gather_segments_ref(sources, segments, expected)
    assert merge_segments_op(sources, segments, embeds) is embeds
    helpers.assert_bitwise_equal(embeds, expected)


def test_fake_implementations_give_shapes_without_data():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        sources = [torch.empty(5, 64, dtype=torch.float16), torch.empty(9, 64, dtype=torch.float16)]
        out = torch.ops.mm_schedule.gather_segments(sources, [1, 2, 6, 7], 16, torch.bfloat16)
        assert out.shape == (16, 64) and out.dtype == torch.bfloat16
        embeds = torch.empty(16, 64)
        torch.ops.mm_schedule.merge_segments_(sources, [1, 2, 6, 7], embeds)


def test_ops_raise_the_typed_errors():
    with pytest.raises(SegmentError, match="outside source 0"):
        gather_segments_op([torch.zeros(3, 8)], [(0, 2, 4, 0)], 4)


def test_a_compiled_model_calls_both_ops_without_a_graph_break(triton_backend, helpers):
    sources, segments = _case(helpers, 2)
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)

    def model(embeds, a, b):
        merged = merge_segments_op([a, b], segments, embeds.clone())
        packed = gather_segments_op([a, b], segments, 16, torch.bfloat16)
        return merged @ weight, packed * 2

    torch._dynamo.reset()
    # fullgraph: any graph break raises. aot_eager runs dynamo and AOTAutograd (which
    # functionalises the in-place merge) without inductor's C++ compile, to stay in seconds.
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    embeds = helpers.random_rows(16, 64, torch.bfloat16, torch.Generator().manual_seed(4))
    got = compiled(embeds, *sources)
    want = model(embeds, *sources)
    for g, w in zip(got, want):
        helpers.assert_bitwise_equal(g, w)
    reference = embeds.clone()
    gather_segments_ref(sources, segments, reference)
    helpers.assert_bitwise_equal(got[0], reference @ weight)
    helpers.assert_bitwise_equal(got[1], _reference(sources, segments, 16, torch.bfloat16) * 2)
