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
        table = torch.tensor([1, 2, 6, 7])
        out = torch.ops.mm_schedule.gather_segments(sources, table, 16, torch.bfloat16)
        assert out.shape == (16, 64) and out.dtype == torch.bfloat16
        embeds = torch.empty(16, 64)
        torch.ops.mm_schedule.merge_segments_(sources, table, embeds)
        # No sources (a step without images): the fakes agree with the real ops.
        empty = torch.empty(0, dtype=torch.int64)
        out = torch.ops.mm_schedule.gather_segments([], empty, 3, None)
        assert out.shape == (3, 0) and out.dtype == torch.float32
        assert torch.ops.mm_schedule.gather_segments([], empty, 3, torch.bfloat16).dtype == torch.bfloat16
        torch.ops.mm_schedule.merge_segments_([], empty, embeds)
    real = torch.ops.mm_schedule.gather_segments([], torch.empty(0, dtype=torch.int64), 3, None)
    assert real.shape == (3, 0) and real.dtype == torch.float32


@pytest.mark.parametrize(
    "table",
    [torch.tensor([[1, 2, 6, 7]]), torch.tensor([1, 2, 6]), torch.tensor([1, 2, 6, 7], dtype=torch.int32)],
    ids=["2-d", "not four words a segment", "int32"],
)
def test_a_table_of_another_layout_is_refused_by_the_ops_and_their_fakes(table, helpers):
    from torch._subclasses.fake_tensor import FakeTensorMode

    sources, _ = _case(helpers, 5)
    with pytest.raises(SegmentError, match="flat int64 CPU tensor"):
        torch.ops.mm_schedule.gather_segments(sources, table, 16, None)
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(SegmentError, match="flat int64 CPU tensor"):
            torch.ops.mm_schedule.merge_segments_(sources, table, torch.empty(16, 64))


def test_both_ops_are_tagged_unsafe_for_cuda_graphs():
    for op in (torch.ops.mm_schedule.gather_segments, torch.ops.mm_schedule.merge_segments_):
        assert torch.Tag.cudagraph_unsafe in op.default.tags


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


def _tables(helpers, count, seed):
    """``count`` segments into a packed buffer, drawn fresh: (sources, flat table, rows)."""
    gen = torch.Generator().manual_seed(seed)
    sources = [helpers.random_rows(12, 64, torch.bfloat16, gen) for _ in range(3)]
    segments, row = [], 0
    for i in range(count):
        n = int(torch.randint(1, 12, (1,), generator=gen))
        start = int(torch.randint(0, 12 - n + 1, (1,), generator=gen))
        segments.append((i % 3, start, n, row))
        row += n
    return sources, segments, row


@pytest.mark.parametrize("op", ["gather", "merge"])
def test_forty_segment_counts_compile_at_most_twice(torch_backend, helpers, op):
    """A table of a new length must not compile the model again: a list would be guarded
    by its length (40 counts: past the recompile limit, back to eager)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def gather(sources, table, rows):
        return gather_segments_op(sources, table, rows) * 2

    def merge(sources, table, embeds):
        return merge_segments_op(sources, table, embeds.clone()) + 1

    counter = CompileCounterWithBackend("aot_eager")  # fake tensors and functionalisation
    torch._dynamo.reset()
    compiled = torch.compile(gather if op == "gather" else merge, fullgraph=True, backend=counter)
    for count in range(1, 41):
        sources, segments, rows = _tables(helpers, count, seed=count)
        table = torch.tensor([f for s in segments for f in s])
        if op == "gather":
            want = _reference(sources, segments, rows + 2, torch.bfloat16) * 2
            got = compiled(sources, table, rows + 2)
        else:
            embeds = helpers.random_rows(rows + 2, 64, torch.bfloat16)
            want = embeds.clone()
            gather_segments_ref(sources, segments, want)
            want += 1
            got = compiled(sources, table, embeds)
        helpers.assert_bitwise_equal(got, want)
    assert counter.frame_count <= 2, counter.frame_count
