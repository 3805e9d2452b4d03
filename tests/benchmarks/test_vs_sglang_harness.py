"""The side-by-side harness against SGLang's own code: SGLang's wheels load with their
imports stubbed, and every side's result compares equal (bit for bit) with an
independent expectation, also on chunked windows that cut images. Nothing is timed.

Marker ``realworld``: skipped when the package registry cannot be reached.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.realworld

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vs_sglang.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("mm_bench_vs_sglang", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


@pytest.fixture(scope="module")
def sides():
    try:
        releases = [bench._sglang_wheels.load_release(v) for v in ("0.5.19", "0.5.17")]
    except bench._sglang_wheels.WheelUnavailable as exc:
        pytest.skip(f"SGLang wheels unavailable (registry unreachable?): {exc}")
    assert "sglang.srt.managers.mm_schedule" in releases[0].modules
    assert "sglang.srt.managers.mm_schedule" not in releases[1].modules  # before the split
    assert not any(k == "sglang" or k.startswith("sglang.") for k in sys.modules)
    return bench.make_sides(*releases)


@pytest.mark.parametrize(
    "n_items, prefix, chunk", [(4, 0, None), (12, 0, None), (12, 0, 100), (8, 50, 37), (8, 150, None)]
)
def test_every_side_matches_the_expectation_on_miss_and_hit_steps(sides, n_items, prefix, chunk):
    batch = bench.build_batch(n_items, seed=n_items * 1000 + prefix, chunk=chunk, prefix=prefix)
    assert bench.check_once(sides, batch) == []


def test_destination_buffer_follows_the_batch_object_not_its_address():
    """A fused side's buffer belongs to one batch; a new batch gets a fresh copy of its own
    text embeddings even when the old batch is gone and its address could be reused."""
    buffer = bench.DestinationBuffer()
    first = bench.build_batch(8, seed=1, prefix=50, chunk=37)
    buffer.prepare(first)
    written = buffer.get(first)
    written.fill_(float("nan"))  # what a merge would have left in it
    buffer.prepare(first)
    assert buffer.get(first) is written  # same batch: the buffer is kept between rounds
    second = bench.build_batch(8, seed=2, prefix=150)
    buffer.prepare(second)
    fresh = buffer.get(second)
    assert fresh.shape == second.text_embeds.shape != first.text_embeds.shape
    assert torch.equal(fresh, second.text_embeds) and fresh.data_ptr() != second.text_embeds.data_ptr()
    with pytest.raises(AssertionError, match="prepare"):
        buffer.get(first)


def test_a_wrong_row_is_caught(sides):
    """Negative control: the comparison sees a single flipped bit in one side's rows."""
    batch = bench.build_batch(8, seed=7)
    ours = next(s for s in sides if s.name == bench.OURS_EMBED)
    honest = ours.step

    def corrupt(b, encoder):
        out = honest(b, encoder)
        rows = out["rows"].clone()
        rows.view(torch.int32)[3, 5] ^= 1
        return {"rows": rows}

    ours.step = corrupt
    try:
        problems = bench.check_once(sides, batch)
    finally:
        ours.step = honest
    assert problems and all(bench.OURS_EMBED in p and "rows differ" in p for p in problems)


def test_sglang_batches_across_requests_and_017_per_request(sides):
    batch = bench.build_batch(12, seed=3)  # 3 requests
    calls = {}
    for side in sides:
        side.reset()
        side.prepare(batch)
        encoder = bench.CheapEncoder()
        side.step(batch, encoder)
        calls[side.name] = encoder.calls
    assert calls[bench.SGL19] == 1 and calls[bench.OURS_COMPAT] == 1 and calls[bench.OURS_EMBED] == 1
    assert calls[bench.SGL17] == 3


def test_rounds_are_split_over_passes_through_every_case(sides):
    """Each case's rounds come from every pass (so drift hits all sizes alike), every side
    runs every round, cached cases see no encoder call, and the results stay exact."""
    runs = [bench.CaseRun(bench.build_batch(4, seed=1), False), bench.CaseRun(bench.build_batch(8, seed=2), True)]
    seen = []
    problems = bench.measure(sides, runs, passes=3, budget_s=0.0, min_rounds=4, max_rounds=4,
                             on_case=lambda run: seen.append(run.batch.n_items))
    assert problems == [] and seen == [4, 8]
    for run in runs:
        result = run.result()
        assert run.rounds_per_pass == 2 and result.rounds == 6
        assert all(len(times) == 6 for times in run.times_ns.values()) and len(run.times_ns) == len(sides)
        if run.miss:
            assert result.encoder_calls_per_step["ours-compat"] == 1
        else:
            assert set(result.encoder_calls_per_step.values()) == {0}


@pytest.mark.parametrize("shape_only_cat", [False, True])
def test_meta_sides_run_unchanged_and_return_the_expected_shapes(sides, shape_only_cat):
    """The host-overhead case: SGLang 0.5.19's code and ours on meta tensors (no data, so a
    host sync on either side would raise), checked by shape; with torch.cat replaced by
    its shape-only stand-in for both sides, as the timed case runs, and without."""
    import contextlib

    release = bench._sglang_wheels.load_release("0.5.19")
    meta_sides = bench.make_meta_sides(release)
    assert [s.name for s in meta_sides] == [bench.SGL19, bench.SGL19_SCATTER, bench.OURS_COMPAT,
                                             bench.OURS_EMBED, bench.OURS_MERGE]
    batch = bench.on_meta(bench.build_batch(8, seed=5))
    assert batch.input_ids.is_meta and all(it.feature.is_meta for it in batch.items)
    with bench.ShapeOnlyCat() if shape_only_cat else contextlib.nullcontext():
        assert bench.check_once(meta_sides, batch) == []
    assert torch.cat is bench._REAL_CAT
    # The shape check can fail: a result of the wrong shape is reported.
    wrong = {"x": {"rows": torch.empty(batch.n_rows + 1, bench.HIDDEN, device="meta")}}
    assert bench.compare_meta(wrong, batch)


def test_the_drop_in_dispatches_as_many_aten_operators_at_every_size():
    """The host-overhead case's operator count: ours-compat dispatches the same number of
    ATen operators per all-cached step at every size, while SGLang's grows with the items
    (sizes from 64 up: with fewer placeholder ids the mask compares against each id,
    ``torch.isin``, in fewer operators still). The counter itself is checked on a known
    sequence of operators first."""
    with bench.OperatorCount() as mode:
        a = torch.empty(3, 2, device="meta")
        (a + 1).sum()
    assert mode.count == 3  # empty, add, sum

    release = bench._sglang_wheels.load_release("0.5.19")
    meta_sides = [s for s in bench.make_meta_sides(release) if s.name in (bench.SGL19, bench.OURS_COMPAT)]
    counts = {}
    with bench.ShapeOnlyCat():
        for n in (64, 256, 1024):
            counts[n] = bench.count_operators(meta_sides, bench.on_meta(bench.build_batch(n, seed=n)), miss=False)
    ours = {c[bench.OURS_COMPAT] for c in counts.values()}
    assert len(ours) == 1 and ours.pop() > 0
    theirs = [counts[n][bench.SGL19] for n in (64, 256, 1024)]
    assert theirs[0] < theirs[1] < theirs[2]
    results = [bench.CaseResult("all-cached", n, 1, {}, {}, {}, {}, operators=c) for n, c in counts.items()]
    assert bench.constant_operators(results, bench.OURS_COMPAT) is True
    assert bench.constant_operators(results, bench.SGL19) is False
    small = bench.CaseResult("all-cached", 4, 1, {}, {}, {}, {}, operators={bench.OURS_COMPAT: 1})
    assert bench.constant_operators([small, *results], bench.OURS_COMPAT) is True  # below OPERATORS_FROM


def test_shape_only_cat_replaces_every_alias_and_restores_them():
    """SGLang's last step calls torch.concat: the stand-in must cover it as it covers cat."""
    real = {name: getattr(torch, name) for name in ("cat", "concat", "concatenate")}
    parts = [torch.empty(2, 4, device="meta"), torch.empty(3, 4, device="meta")]
    with bench.ShapeOnlyCat():
        for name in real:
            got = getattr(torch, name)(parts)
            assert got.is_meta and tuple(got.shape) == (5, 4)
            assert getattr(torch, name) is not real[name]
        cpu = torch.concat([torch.ones(1, 2), torch.zeros(1, 2)])
        assert torch.equal(cpu, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))  # real data: the real cat
    assert all(getattr(torch, name) is fn for name, fn in real.items())


def test_pass_ratios_give_the_spread_of_every_pass():
    result = bench.CaseResult("all-cached", 8, 6, {"a": 1.0, "b": 4.0}, {}, {}, {},
                              pass_median_us={"a": [1.0, 2.0, 1.0], "b": [5.0, 6.0, 4.0]})
    assert bench.pass_ratios(result, "a", "b") == [3.0, 4.0, 5.0]
    assert bench.ratio_spread(result, "a", "b") == "4.00x (3.00-5.00)"


def test_the_mask_alone_is_timed_and_counted_for_both_drop_ins():
    """Each side's placeholder mask on a case's own inputs: SGLang's ``torch.isin`` plus the
    reshape (2 operators), ours the one-launch mask operator (1: what a GPU launches); the
    last column takes each side's mask out of its step."""
    release = bench._sglang_wheels.load_release("0.5.19")
    run = bench.CaseRun(bench.on_meta(bench.build_batch(64, seed=3)), True)
    masks = bench.mask_alone(release, [run], rounds=3)
    (ours_us, ours_ops), (theirs_us, theirs_ops) = masks[("all-miss", 64)][bench.OURS_COMPAT], \
        masks[("all-miss", 64)][bench.SGL19]
    assert ours_us > 0 and theirs_us > 0 and (ours_ops, theirs_ops) == (1, 2)
    # The report's arithmetic, on numbers chosen by hand: (900 - 50) / (500 - 160) = 2.5.
    result = bench.CaseResult("all-miss", 64, 1, {bench.SGL19: 900.0, bench.OURS_COMPAT: 500.0}, {}, {}, {})
    text = "\n".join(bench.mask_section([result], {("all-miss", 64): {bench.OURS_COMPAT: (160.0, 6),
                                                                         bench.SGL19: (50.0, 2)}}))
    assert "| all-miss | 64 | 160.0 µs (6 ops) | 50.0 µs (2 ops) | 2.50x |" in text
    table = bench.mask_section([result], {})[-2].splitlines()
    assert len(table) == 2 and table[0].startswith("| case |")  # a case without a measurement: no row
