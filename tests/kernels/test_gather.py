"""Segment gather (Triton, interpreted) against the torch reference, bit for bit."""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule.errors import KernelInputError, SegmentError, SourceOverlapError
from mm_schedule.kernels.segment_copy import launch as gather_mod
from mm_schedule.kernels.segment_copy import table as table_mod
from mm_schedule.kernels.segment_copy.contract import Segment
from mm_schedule.kernels.segment_copy.launch import (
    gather_segments,
    gather_segments_ref,
    launch_trusted,
    merge_segments,
    plan_segments,
    run_segments,
)
from mm_schedule.kernels.segment_copy.table import count_tiles, table_words

FIXTURE_OK = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SMALL = {"BLOCK_M": 4, "BLOCK_H": 64, "num_warps": 1, "num_stages": 1}


def run_both(helpers, sources, segments, dest_rows, dtype, config=None):
    """Kernel output and reference output, both started from NaN poison."""
    hidden = sources[0].shape[1]
    out = helpers.poisoned((dest_rows, hidden), dtype)
    expected = helpers.poisoned((dest_rows, hidden), dtype)
    gather_segments(sources, segments, out=out, config=config)
    gather_segments_ref(sources, [Segment(*s) for s in segments], expected)
    helpers.assert_bitwise_equal(out, expected)
    return out


@st.composite
def tables(draw):
    """Random sources and a random non-overlapping table, destination rows shuffled."""
    hidden = draw(st.sampled_from([64, 72, 100, 130, 256]))
    n_sources = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 24)) for _ in range(n_sources)]
    segments = []
    for _ in range(draw(st.integers(0, 8))):
        s = draw(st.integers(0, n_sources - 1))
        start = draw(st.integers(0, sizes[s] - 1))
        n = draw(st.integers(1, sizes[s] - start))
        segments.append((s, start, n))
    order = draw(st.permutations(range(len(segments))))
    gaps = [draw(st.integers(0, 3)) for _ in segments]
    placed, row = [None] * len(segments), draw(st.integers(0, 2))
    for i, gap in zip(order, gaps):
        placed[i] = (*segments[i], row)
        row += segments[i][2] + gap
    return hidden, sizes, placed, row + draw(st.integers(0, 3))


@FIXTURE_OK
@given(
    table=tables(),
    src_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    dst_dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
    block_m=st.sampled_from([1, 2, 4, 8]),
)
def test_random_tables_match_reference(
    triton_backend, helpers, table, src_dtype, dst_dtype, seed, block_m
):
    hidden, sizes, segments, dest_rows = table
    gen = torch.Generator().manual_seed(seed)
    sources = [helpers.random_rows(n, hidden, src_dtype, gen) for n in sizes]
    out = run_both(helpers, sources, segments, dest_rows, dst_dtype, {**SMALL, "BLOCK_M": block_m})
    written = torch.zeros(dest_rows, dtype=torch.bool)
    for _, _, n, d in segments:
        written[d : d + n] = True
    # Rows no segment names keep their poison; every written row is finite data.
    assert out[~written].isnan().all()
    assert not out[written].isnan().any()


def test_empty_table_launches_nothing_and_keeps_poison(triton_backend, helpers):
    sources = [helpers.random_rows(5, 64, torch.bfloat16)]
    out = run_both(helpers, sources, [], 7, torch.bfloat16)
    assert out.isnan().all()
    assert gather_segments(sources, []).shape == (0, 64)


def test_one_row_and_whole_source_segments(triton_backend, helpers):
    sources = [helpers.random_rows(n, 96, torch.float16) for n in (1, 13, 30)]
    segments = [(0, 0, 1, 0), (1, 0, 13, 1), (2, 29, 1, 14), (2, 0, 30, 16), (1, 7, 1, 46)]
    out = run_both(helpers, sources, segments, 48, torch.float16)
    assert torch.equal(out[16:46], sources[2]) and torch.equal(out[1:14], sources[1])


def test_hundreds_of_small_segments(triton_backend, helpers):
    gen = torch.Generator().manual_seed(1)
    sources = [helpers.random_rows(3, 64, torch.bfloat16, gen) for _ in range(120)]
    segments, row = [], 0
    for i in range(300):
        n = 1 + i % 3
        segments.append((i % 120, 0, n, row))
        row += n
    run_both(helpers, sources, segments, row + 2, torch.bfloat16, {**SMALL, "BLOCK_M": 2})


def test_skewed_sizes_split_into_even_tiles(triton_backend, helpers):
    gen = torch.Generator().manual_seed(2)
    sources = [
        helpers.random_rows(203, 64, torch.float32, gen),
        helpers.random_rows(1, 64, torch.float32, gen),
    ]
    segments = [(0, 0, 203, 0)] + [(1, 0, 1, 203 + i) for i in range(20)]
    run_both(helpers, sources, segments, 230, torch.float32, {**SMALL, "BLOCK_M": 8})
    plan = plan_segments(sources, segments, torch.empty(230, 64), config={**SMALL, "BLOCK_M": 8})
    assert plan.n_tiles == 26 + 20


def test_segments_of_every_size_in_one_table(triton_backend, helpers):
    # 150 segments: the search takes eight steps and lands on every one of them.
    gen = torch.Generator().manual_seed(5)
    sources = [helpers.random_rows(7, 64, torch.bfloat16, gen) for _ in range(3)]
    segments, row = [], 1
    for i in range(150):
        n = 1 + (i * 5) % 7
        segments.append((i % 3, 7 - n, n, row))
        row += n + i % 2
    run_both(helpers, sources, segments, row + 1, torch.bfloat16, {**SMALL, "BLOCK_M": 4})


def test_table_holds_cumulative_tiles_the_segments_as_given_and_the_addresses():
    segments = [Segment(1, 3, 10, 50), Segment(0, 0, 4, 0), Segment(1, 0, 1, 7)]
    bases = [1 << 20, 1 << 30]
    words = table_words(segments, bases, 4)
    assert list(words) == [3, 3, 4, 5, 1, 3, 10, 50, 0, 0, 4, 0, 1, 0, 1, 7, 1 << 20, 1 << 30]
    assert count_tiles(segments, 4) == 3 + 1 + 1
    assert list(table_words(segments, bases, 1))[1:4] == [10, 14, 15]


def test_unaligned_sources_take_the_unaligned_variant(triton_backend, helpers):
    # A row-offset view of an odd-width tensor: its data pointer is 2 bytes past an aligned one.
    base = helpers.random_rows(40, 67, torch.bfloat16)
    view = base[1:]
    assert view.data_ptr() % 16 != 0
    dest = helpers.poisoned((30, 67), torch.bfloat16)
    assert not plan_segments([view], [(0, 2, 20, 5)], dest).aligned
    run_both(helpers, [view], [(0, 2, 20, 5), (0, 38, 1, 0)], 30, torch.bfloat16)
    # Even width, but the source starts 8 bytes into an allocation: still detected.
    shifted = helpers.random_rows(20, 64, torch.bfloat16).view(-1)[4 : 4 + 10 * 64].view(10, 64)
    assert shifted.data_ptr() % 16 == 8
    assert not plan_segments(
        [shifted], [(0, 0, 3, 0)], torch.empty(10, 64, dtype=torch.bfloat16)
    ).aligned
    run_both(helpers, [shifted], [(0, 1, 9, 0)], 10, torch.float32)


def test_aligned_inputs_take_the_aligned_variant(triton_backend, helpers):
    sources = [helpers.random_rows(8, 64, torch.bfloat16)]
    dest = helpers.poisoned((8, 64), torch.bfloat16)
    assert plan_segments(sources, [(0, 0, 8, 0)], dest).aligned


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_each_dtype_default_config(triton_backend, helpers, dtype):
    sources = [helpers.random_rows(9, 128, dtype), helpers.random_rows(4, 128, dtype)]
    run_both(helpers, sources, [(1, 1, 3, 0), (0, 0, 9, 4)], 14, dtype)


def test_plan_runs_repeatedly_and_updates_in_place(triton_backend, helpers):
    config = {**SMALL, "BLOCK_M": 2}
    first = [helpers.random_rows(6, 64, torch.float16)]
    dest = helpers.poisoned((10, 64), torch.float16)
    plan = plan_segments(first, [(0, 0, 6, 2)], dest, config=config, capacity=8)
    table_ptr = plan.table.data_ptr()
    assert plan.grid == 8 and plan.n_tiles == 3  # programs past the last tile copy nothing
    run_segments(plan, dest)
    assert torch.equal(dest[2:8], first[0]) and dest[:2].isnan().all() and dest[8:].isnan().all()
    second = [helpers.random_rows(3, 64, torch.float16), helpers.random_rows(9, 64, torch.float16)]
    plan.update(second, [(1, 0, 9, 0), (0, 2, 1, 9)])
    assert plan.table.data_ptr() == table_ptr
    run_segments(plan, dest)
    assert torch.equal(dest[:9], second[1]) and torch.equal(dest[9], second[0][2])
    with pytest.raises(KernelInputError, match="tiles"):
        plan.update(second, [(1, 0, 9, 0)] * 0 + [(1, 0, 1, i) for i in range(9)])


def test_run_rejects_a_different_destination(triton_backend, helpers):
    sources = [helpers.random_rows(4, 64, torch.float32)]
    plan = plan_segments(sources, [(0, 0, 4, 0)], torch.empty(4, 64))
    with pytest.raises(KernelInputError, match="differs from the planned"):
        run_segments(plan, torch.empty(5, 64))


class ExplodingKernel:
    def __getitem__(self, grid):
        raise AssertionError("bad input reached the kernel")


@pytest.mark.parametrize(
    ("segments", "message"),
    [
        ([(0, 5, 4, 0)], "outside source 0"),
        ([(0, 0, 4, 9)], "outside a destination"),
        ([(2, 0, 1, 0)], "source index 2 out of range"),
        ([(0, 0, 0, 0)], "n_rows must be positive"),
        ([(0, 0, 3, 0), (1, 0, 2, 2)], "overlapping"),
        ([(0, -1, 2, 0)], "outside source 0"),
    ],
)
def test_bad_tables_raise_before_launch(triton_backend, helpers, monkeypatch, segments, message):
    monkeypatch.setattr(gather_mod, "segment_copy_kernel", ExplodingKernel())
    sources = [
        helpers.random_rows(8, 64, torch.bfloat16),
        helpers.random_rows(2, 64, torch.bfloat16),
    ]
    with pytest.raises(SegmentError, match=message):
        gather_segments(sources, segments, out=torch.empty(10, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    ("make_sources", "message"),
    [
        (lambda: [torch.randn(4, 32)], "hidden size 32"),
        (lambda: [torch.randn(64, 4).t()], "not contiguous"),
        (lambda: [torch.randn(4, 64, device="meta")], "move it with .to"),
        (lambda: [torch.ones(4, 64, dtype=torch.int32)], "dtype torch.int32"),
        (lambda: [torch.randn(4, 64), torch.randn(4, 64).half()], "one source dtype"),
        (lambda: [torch.randn(4, 2, 32)], "must be 2-D"),
    ],
)
def test_bad_tensors_raise_before_launch(triton_backend, monkeypatch, make_sources, message):
    monkeypatch.setattr(gather_mod, "segment_copy_kernel", ExplodingKernel())
    with pytest.raises(KernelInputError, match=message):
        gather_segments(make_sources(), [(0, 0, 1, 0)], out=torch.empty(4, 64))


def test_non_contiguous_destination_is_rejected(triton_backend):
    with pytest.raises(KernelInputError, match="destination must be contiguous"):
        gather_segments([torch.randn(4, 64)], [(0, 0, 1, 0)], out=torch.empty(64, 8).t())


def test_unsupported_dtype_names_the_torch_backend(triton_backend):
    with pytest.raises(KernelInputError, match="MM_SCHEDULE_KERNEL_BACKEND=torch"):
        gather_segments([torch.randn(4, 64, dtype=torch.float64)], [(0, 0, 1, 0)])


@pytest.mark.parametrize(
    "source_of",
    [
        lambda dest: dest[2:6],  # a row view of the destination
        lambda dest: dest.view(-1)[32 : 32 + 3 * 64].view(3, 64),  # overlapping, not row-aligned
        lambda dest: dest,  # the destination itself
    ],
)
def test_a_source_overlapping_the_destination_is_refused(triton_backend, monkeypatch, source_of):
    monkeypatch.setattr(gather_mod, "segment_copy_kernel", ExplodingKernel())
    dest = torch.zeros(10, 64)
    sources = [torch.randn(4, 64), source_of(dest)]
    for call in (
        lambda: gather_segments(sources, [(1, 0, 1, 8)], out=dest),
        lambda: merge_segments(sources, [(0, 0, 2, 0), (1, 0, 1, 9)], dest),
        lambda: plan_segments(sources, [(1, 0, 1, 9)], dest),
    ):
        with pytest.raises(SourceOverlapError, match="source 1 shares memory"):
            call()
    assert dest.eq(0).all()


def test_a_disjoint_part_of_the_same_storage_is_allowed(triton_backend, helpers):
    storage = helpers.random_rows(12, 64, torch.float32)
    dest, source = storage[:8], storage[8:]
    expected = dest.clone()
    expected[1:4] = source[0:3]
    gather_segments([source], [(0, 0, 3, 1)], out=dest)
    helpers.assert_bitwise_equal(dest, expected)


@pytest.mark.parametrize("n_segments", [1, 2, 40])
@pytest.mark.parametrize(("src_dtype", "dst_dtype"), [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)])
def test_trusted_launch_matches_the_reference(triton_backend, helpers, n_segments, src_dtype, dst_dtype):
    gen = torch.Generator().manual_seed(n_segments)
    sources = [helpers.random_rows(int(n), 72, src_dtype, gen) for n in torch.randint(1, 9, (n_segments,), generator=gen)]
    segments, row = [], 3
    for i in torch.randperm(n_segments, generator=gen).tolist():
        segments.append((i, 0, sources[i].shape[0], row))
        row += sources[i].shape[0] + 1
    out = helpers.poisoned((row + 2, 72), dst_dtype)
    expected = out.clone()
    launch_trusted(sources, segments, out)
    gather_segments_ref(sources, segments, expected)
    helpers.assert_bitwise_equal(out, expected)


def test_a_plan_never_holds_more_tiles_than_its_capacity(triton_backend, helpers):
    sources = [helpers.random_rows(9, 64, torch.float16)]
    dest = helpers.poisoned((20, 64), torch.float16)
    config = {**SMALL, "BLOCK_M": 2}
    with pytest.raises(KernelInputError, match=r"5 tiles .* capacity of 4"):
        plan_segments(sources, [(0, 0, 9, 0)], dest, config=config, capacity=4)
    plan = plan_segments(sources, [(0, 0, 8, 0)], dest, config=config, capacity=4)
    with pytest.raises(KernelInputError, match="capacity"):
        plan.update(sources, [(0, 0, 9, 0)])
    run_segments(plan, dest)  # the failed update left the plan as it was
    assert torch.equal(dest[:8], sources[0][:8]) and dest[8:].isnan().all()


@pytest.mark.parametrize("bad", [(0, 0, 1), (0, 0, 1, 0, 5), 7])
def test_a_malformed_segment_is_a_segment_error(triton_backend, bad):
    for out in (None, torch.empty(4, 64)):
        with pytest.raises(SegmentError, match=r"must be \(source, src_row, n_rows, dst_row\)"):
            gather_segments([torch.randn(4, 64)], [(0, 0, 1, 0), bad], out=out)


def _fresh_generator():
    """A generator on a seed drawn for this run (named in failures, to replay one)."""
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator().manual_seed(seed), seed


@pytest.mark.parametrize("block_m", [1, 2, 4, 16])
@pytest.mark.parametrize("kind", ["tiny", "spanning", "mixed"])
def test_every_program_finds_its_segment(triton_backend, helpers, kind, block_m):
    """Bit-exact into poison on fresh random data: hundreds of one- and two-row segments
    (the search's every step taken), segments of many tiles each, and both mixed."""
    gen, seed = _fresh_generator()
    sizes = {
        "tiny": lambda: torch.randint(1, 3, (400,), generator=gen),
        "spanning": lambda: torch.randint(3 * block_m, 40 * block_m, (5,), generator=gen),
        "mixed": lambda: torch.randint(1, 24 * block_m, (60,), generator=gen),
    }[kind]().tolist()
    sources = [helpers.random_rows(n + 2, 64, torch.bfloat16, gen) for n in sizes]
    order = torch.randperm(len(sizes), generator=gen).tolist()
    segments, row = [None] * len(sizes), 1
    for i in order:
        segments[i] = (i, int(torch.randint(0, 3, (1,), generator=gen)), sizes[i], row)
        row += sizes[i] + int(torch.randint(0, 2, (1,), generator=gen))
    out = helpers.poisoned((row + 1, 64), torch.bfloat16)
    expected = out.clone()
    if kind == "tiny" and block_m == 1:
        launch_trusted(sources, segments, out)  # the scheduler's path, its own config
    else:
        gather_segments(sources, segments, out=out, config={**SMALL, "BLOCK_M": block_m})
    gather_segments_ref(sources, segments, expected)
    try:
        helpers.assert_bitwise_equal(out, expected)
    except AssertionError as failure:
        raise AssertionError(f"seed {seed}: {failure}") from None


def test_one_segment_and_an_empty_table_on_fresh_data(triton_backend, helpers):
    gen, seed = _fresh_generator()
    source = helpers.random_rows(37, 72, torch.float32, gen)
    for segments in ([(0, 3, 30, 5)], []):
        out = helpers.poisoned((40, 72), torch.bfloat16)
        expected = out.clone()
        gather_segments([source], segments, out=out, config={**SMALL, "BLOCK_M": 4})
        gather_segments_ref([source], segments, expected)
        helpers.assert_bitwise_equal(out, expected)
    assert out.isnan().all(), seed


@pytest.mark.skipif(table_mod._stream_copy is None, reason="the C helper is not built")
def test_the_c_packer_writes_what_the_python_packer_does(helpers):
    gen, seed = _fresh_generator()
    for n_segments in (0, 1, 7, 300):
        sources = [helpers.random_rows(4, 64, torch.float16, gen) for _ in range(5)]
        segments = [(int(s), 0, int(n), 10 * i) for i, (s, n) in enumerate(zip(
            torch.randint(0, 5, (n_segments,), generator=gen),
            torch.randint(1, 50, (n_segments,), generator=gen)))]  # fmt: skip
        asked = []

        def block_m_for(rows, asked=asked):
            asked.append(rows)
            return 1 << (rows % 5)

        packed, aligned, rows, tiles = table_mod.pack_table(segments, sources, block_m_for)
        host = torch.zeros(len(packed) // 8 + 3, dtype=torch.int64)
        words, c_aligned, c_rows, c_tiles = table_mod._stream_copy.pack_table(
            host.data_ptr(), host.numel(), segments, sources, block_m_for)
        assert words == len(packed) // 8, seed
        assert host[:words].numpy().tobytes() == packed, seed
        assert (c_aligned, c_rows, c_tiles) == (aligned, rows, tiles), seed
        assert asked == [sum(s[2] for s in segments)] * 2
        block_m = 1 << (rows % 5)
        assert tiles == count_tiles(segments, block_m)
        assert list(table_words(segments, [s.data_ptr() for s in sources], block_m)) == host[:words].tolist()
        with pytest.raises(ValueError, match="buffer holds"):
            table_mod._stream_copy.pack_table(host.data_ptr(), words - 1, segments, sources, block_m_for)
