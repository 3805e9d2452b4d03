"""The vLLM integration on steps whose placeholder ranges nest (audio inside video, an
image inside a video), on negative scheduled counts, on the planner's own segment check,
and on ``is_embed`` masks that change between steps by routes that leave no trace on the
tensor. Every expected answer comes from the position-by-position reference below, which
shares no code with the planner: it walks every position of every range, with no search."""

from __future__ import annotations

import random
import types

import pytest
import torch

from mm_schedule.errors import EmbeddingLengthMismatch, InvalidItemError, SegmentError
from mm_schedule.integrations import vllm
from mm_schedule.integrations.vllm import gather as planner


def feature(key: str, offset: int, length: int, is_embed=None, modality: str = "image"):
    position = types.SimpleNamespace(offset=offset, length=length, is_embed=is_embed)
    return types.SimpleNamespace(identifier=key, mm_position=position, modality=modality, data=None)


def expected_rows(reqs, outputs, n_tokens: int, hidden: int, starts=None):
    """Position by position, for requests ``(name, features, computed, scheduled)``: the
    packed rows (request, item in list order, position), the mask (true where any range
    has an embedding position), the fused merge into zeros (None when two ranges that
    both reach the window intersect: that merge must refuse), and the keys read."""
    if starts is None:
        starts, row = [], 0
        for r in reqs:
            starts.append(row)
            row += r[3]
    packed, keys = [], []
    mask = torch.zeros(n_tokens, dtype=torch.bool)
    merged = torch.zeros(n_tokens, hidden, dtype=torch.float64)
    refused = False
    for (_, feats, done, count), start in zip(reqs, starts):
        window = range(done, done + count)
        reached = []  # (first, end) of the ranges with a position in the window
        for f in feats:
            p = f.mm_position
            embed = [True] * p.length if p.is_embed is None else [bool(x) for x in p.is_embed.tolist()]
            positions = [p.offset + k for k in range(p.length)]
            if not any(q in window for q in positions):
                continue
            if any(p.offset < end and first < p.offset + p.length for first, end in reached):
                refused = True
            reached.append((p.offset, p.offset + p.length))
            taken = 0
            for k, q in enumerate(positions):
                if not embed[k]:
                    continue
                if q in window:
                    value = outputs[f.identifier][taken]
                    packed.append(value)
                    token = start + q - done
                    mask[token] = True
                    merged[token] = value.double()
                    if f.identifier not in keys:
                        keys.append(f.identifier)
                taken += 1
    rows = torch.stack(packed) if packed else None
    return rows, mask, None if refused else merged, keys


def check_step(reqs, outputs, hidden: int, *, query_start_loc=None):
    """Plan the step and compare every result with the reference."""
    if query_start_loc is None:
        n_tokens = sum(r[3] for r in reqs)
    else:
        n_tokens = query_start_loc[-1] + reqs[-1][3] if reqs else 0
    rows, mask, merged, keys = expected_rows(reqs, outputs, n_tokens, hidden, query_start_loc)
    step = vllm.plan_rows([r[0] for r in reqs], [r[1] for r in reqs], [r[2] for r in reqs], [r[3] for r in reqs],
                          outputs, query_start_loc=query_start_loc)
    assert all(n > 0 for n in step.fused[2::4]), step.fused  # never an empty or negative segment
    assert step.n_tokens == n_tokens
    assert step.n_rows == (0 if rows is None else rows.shape[0])
    assert sorted(step.keys) == sorted(keys)
    assert torch.equal(step.is_mm_embed(), mask)
    if rows is None:
        assert step.gather() is None
    else:
        assert torch.equal(step.gather(), rows)
        spare = torch.full((rows.shape[0] + 4, hidden), float("nan"), dtype=rows.dtype)
        assert step.gather(out=spare) is spare
        assert torch.equal(spare[: rows.shape[0]], rows) and spare[rows.shape[0]:].isnan().all()
    if merged is None:
        with pytest.raises(InvalidItemError, match="overlap"):
            step.merge_into(torch.zeros(n_tokens, hidden, dtype=torch.float64))
    else:
        assert torch.equal(step.merge_into(torch.zeros(n_tokens, hidden, dtype=torch.float64)), merged)
    return step


def random_mask(rng: random.Random, length: int):
    return torch.tensor([rng.random() < 0.6 for _ in range(length)]) if rng.random() < 0.4 else None


def nested_features(rng: random.Random, tag: str, outputs: dict, hidden: int, gen: torch.Generator):
    """One request's features, sorted by offset: plain items, items that enclose others
    (some of those nested once more), items that start inside an earlier one and run past
    it, and children that share their parent's first position."""
    spans, pos = [], rng.randint(0, 3)
    for _ in range(rng.randint(1, 4)):
        length = rng.randint(1, 24)
        spans.append((pos, length))
        kind = rng.random()
        if kind < 0.5 and length > 2:  # children inside this one
            child_pos = pos + rng.randint(0, 1)
            for _ in range(rng.randint(1, 3)):
                if child_pos >= pos + length:
                    break
                child_len = rng.randint(1, pos + length - child_pos)
                spans.append((child_pos, child_len))
                if child_len > 2 and rng.random() < 0.3:  # and one inside the child
                    spans.append((child_pos + 1, rng.randint(1, child_len - 1)))
                child_pos += child_len + rng.randint(0, 2)
        elif kind < 0.7:  # one that starts inside this one and ends after it
            spans.append((pos + rng.randint(0, length - 1), length + rng.randint(1, 5)))
        pos += length + rng.randint(0, 3)
    spans.sort(key=lambda s: s[0])  # stable: a parent stays before a child at its offset
    feats = []
    for k, (offset, length) in enumerate(spans):
        key = f"{tag}-{k}"
        is_embed = random_mask(rng, length)
        n = length if is_embed is None else int(is_embed.sum())
        outputs[key] = torch.randn(n, hidden, generator=gen, dtype=torch.float64)
        feats.append(feature(key, offset, length, is_embed, rng.choice(("video", "audio", "image"))))
    end = max(o + n for o, n in spans)
    return feats, end


@pytest.mark.parametrize("seed", range(150))
def test_nested_ranges_on_random_windows_match_the_reference(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    hidden, outputs, reqs = 3, {}, []
    for r in range(rng.randint(1, 4)):
        feats, end = nested_features(rng, f"s{seed}r{r}", outputs, hidden, gen)
        done = rng.randint(0, end)
        reqs.append((f"r{r}", feats, done, rng.randint(1, end + 2 - done)))
    query_start_loc = None
    if rng.random() < 0.3:  # the v2 runner's explicit first rows, with gaps between requests
        query_start_loc, row = [], 0
        for r in reqs:
            row += rng.randint(0, 2)
            query_start_loc.append(row)
            row += r[3]
    check_step(reqs, outputs, hidden, query_start_loc=query_start_loc)


def test_the_enclosing_range_is_found_whatever_lies_inside_it():
    outputs = {"video": torch.randn(100, 4, dtype=torch.float64), "audio": torch.randn(5, 4, dtype=torch.float64),
               "img": torch.randn(2, 4, dtype=torch.float64)}
    feats = [feature("video", 0, 100, modality="video"), feature("audio", 10, 5, modality="audio"),
             feature("img", 50, 2)]
    step = check_step([("r", feats, 20, 40)], outputs, 4)  # window [20, 60): 40 video rows, 2 image rows
    assert step.n_rows == 42 and step.keys == ["video", "img"]
    gen = torch.Generator().manual_seed(1)
    video_mask = torch.tensor([True] + [k % 2 == 1 for k in range(1, 11)] + [True] * 9)
    audio_mask = torch.tensor([k % 2 == 0 for k in range(10)])
    outputs = {"video": torch.randn(int(video_mask.sum()), 4, generator=gen, dtype=torch.float64),
               "audio": torch.randn(int(audio_mask.sum()), 4, generator=gen, dtype=torch.float64)}
    feats = [feature("video", 0, 20, video_mask, "video"), feature("audio", 1, 10, audio_mask, "audio")]
    step = check_step([("r", feats, 12, 8)], outputs, 4)  # window [12, 20): video only, past the audio
    assert step.n_rows == 8 and step.keys == ["video"]
    # Only the video reaches the window: the fused merge is the positional one, not refused.
    assert step.overlap is None


def test_every_window_around_a_nested_range():
    """An audio at [10, 14) inside a video at [4, 24), an image after them at [26, 29):
    every window from [0, 1) to [0, 31), each side of every edge, against the reference."""
    gen = torch.Generator().manual_seed(3)
    for video_mask in (None, torch.tensor([k % 3 != 2 for k in range(20)])):
        for audio_mask in (None, torch.tensor([False, True, True, False])):
            feats = [feature("video", 4, 20, video_mask, "video"), feature("audio", 10, 4, audio_mask, "audio"),
                     feature("img", 26, 3)]
            outputs = {f.identifier: torch.randn(
                f.mm_position.length if f.mm_position.is_embed is None else int(f.mm_position.is_embed.sum()), 2,
                generator=gen, dtype=torch.float64) for f in feats}
            for first in range(0, 31):
                for last in range(first + 1, 32):
                    check_step([("r", feats, first, last - first)], outputs, 2)


def test_a_nested_range_before_the_window_takes_no_rows_in_either_copy_backend(copy_backend):
    outputs = {"img": torch.randn(3, 2), "video": torch.randn(10, 2), "audio": torch.ones(1, 2)}
    feats = [feature("img", 0, 3), feature("video", 4, 10, modality="video"), feature("audio", 5, 1, modality="audio")]
    step = vllm.plan_rows(["r"], [feats], [8], [4], outputs)  # window [8, 12): video positions 8..11
    assert [tuple(step.fused[k:k + 4]) for k in range(0, len(step.fused), 4)] == [(0, 4, 4, 0)]
    assert step.n_rows == 4 and step.keys == ["video"]
    out = torch.full((10, 2), float("nan"))
    assert step.gather(out=out) is out
    assert torch.equal(out[:4], outputs["video"][4:8]) and out[4:].isnan().all()
    assert [(tuple(v.shape), v.modality) for v in step.gather_by_modality()] == [((4, 2), "video")]
    assert torch.equal(step.merge_into(torch.zeros(4, 2)), outputs["video"][4:8])
    for done, count in ((5, 1), (6, 1), (4, 2)):  # each side of the audio's one position
        check_step([("r", feats, done, count)], {k: v.double() for k, v in outputs.items()}, 2)


def test_an_unsorted_range_past_a_whole_prompt_window_is_refused():
    outputs = {"a": torch.randn(3, 2), "b": torch.randn(3, 2), "c": torch.randn(2, 2)}
    feats = [feature("a", 0, 3), feature("b", 50, 3), feature("c", 5, 2)]
    with pytest.raises(InvalidItemError, match="not sorted by offset \\('b' at 50 before 'c' at 5\\)"):
        vllm.plan_rows(["r"], [feats], [0], [10], outputs)


# -- the planner's own segment check ------------------------------------------------------


def _step_with(segments, n_tokens: int):
    step = planner.StepRows(n_tokens)
    step.keys = ["a", "b"]
    step.fused = [v for seg in segments for v in seg]
    return step


@pytest.mark.parametrize("padding", [0, 400], ids=["few segments", "many segments"])
@pytest.mark.parametrize("bad, what", [
    ((0, 1, 0, 2), "encoder rows \\[1, 1\\) of 4"),  # an empty segment
    ((0, 3, -2, 0), "encoder rows \\[3, 1\\) of 4"),  # a negative count (what nesting once made)
    ((0, -1, 2, 0), "encoder rows \\[-1, 1\\)"),
    ((1, 1, 2, 0), "mm_hash 'b'.*encoder rows \\[1, 3\\) of 2"),  # past its output's rows
    ((0, 0, 2, -1), "token rows \\[-1, 1\\)"),
    ((0, 0, 2, 7), "token rows \\[7, 9\\) of 8"),  # past the step's tokens
])
def test_a_segment_outside_its_bounds_is_refused(bad, what, padding):
    good = [(0, 0, 4, 0), (1, 0, 2, 6)]
    expected = [4, 2]
    planner._check_segments(_step_with(good + [(0, 3, 1, 7)] * padding, 8), expected)  # in bounds: passes
    planner._check_segments(_step_with([*good, (0, 0, 4, 4), (1, 0, 2, 6)], 8), expected)  # each edge exactly
    with pytest.raises(SegmentError, match=f"{what}.*nothing was written"):
        planner._check_segments(_step_with(good + [(0, 3, 1, 7)] * padding + [bad], 8), expected)


def test_a_planning_error_is_refused_before_anything_is_written(monkeypatch):
    is_embed = torch.tensor([True, False, True, True])
    outputs = {"a": torch.randn(3, 4)}
    real = planner._runs_of

    def broken(position, request, key):  # runs whose row numbers start one past the output
        runs = real(position, request, key)
        fake = types.SimpleNamespace(**{k: getattr(runs, k) for k in ("counts", "ends", "rows", "starts")})
        fake.before = [b + 1 for b in runs.before]
        return fake

    monkeypatch.setattr(planner, "_runs_of", broken)
    with pytest.raises(SegmentError, match="mm_hash 'a'"):
        vllm.plan_rows(["r"], [[feature("a", 0, 4, is_embed)]], [0], [4], outputs)


# -- negative scheduled counts --------------------------------------------------------------


@pytest.mark.parametrize("with_starts", [False, True])
def test_a_negative_scheduled_count_is_refused_with_or_without_query_start_loc(with_starts):
    outputs = {"a": torch.ones(4, 2), "c": torch.full((3, 2), 3.0)}
    feats = [[feature("a", 0, 4)], [], [feature("c", 0, 3)]]
    starts = {"query_start_loc": [0, 5, 5]} if with_starts else {}
    with pytest.raises(InvalidItemError, match="request 'r1': num_scheduled_tokens is -1"):
        vllm.plan_rows(["r0", "r1", "r2"], feats, [0, 0, 0], [5, -1, 3], outputs, **starts)
    step = vllm.plan_rows(["r0", "r1", "r2"], feats, [0, 0, 0], [5, 0, 3], outputs, **starts)  # zero: fine
    reqs = [("r0", feats[0], 0, 5), ("r1", [], 0, 0), ("r2", feats[2], 0, 3)]
    rows, mask, merged, _ = expected_rows(reqs, {k: v.double() for k, v in outputs.items()}, 8, 2)
    assert step.n_tokens == 8 and torch.equal(step.is_mm_embed(), mask)
    assert torch.equal(step.gather().double(), rows)
    assert torch.equal(step.merge_into(torch.zeros(8, 2, dtype=torch.float64)), merged)


def test_the_runner_shaped_entry_points_refuse_a_negative_count():
    outputs = {"a": torch.ones(4, 2)}
    feats = {"r0": [feature("a", 0, 4)], "r1": []}
    scheduler_output = types.SimpleNamespace(num_scheduled_tokens={"r0": 5, "r1": -2})
    requests = {r: types.SimpleNamespace(num_computed_tokens=0, mm_features=f) for r, f in feats.items()}
    with pytest.raises(InvalidItemError, match="request 'r1': num_scheduled_tokens is -2"):
        vllm.gather_mm_embeddings_v1(scheduler_output, ["r0", "r1"], requests, outputs)
    cache = types.SimpleNamespace(mm_features=feats, encoder_outputs=outputs)
    with pytest.raises(InvalidItemError, match="request 'r1': num_scheduled_tokens is -2"):
        vllm.gather_mm_embeddings(cache, ["r0", "r1"], 5, [5, -2], [0, 5, 3], [10, 10], [0, 0])


# -- is_embed masks seen before --------------------------------------------------------------


def _plan_mask(is_embed, outputs):
    return vllm.plan_rows(["r"], [[feature("a", 0, 4, is_embed)]], [0], [4], outputs)


@pytest.mark.parametrize("change, message", [
    (lambda m: setattr(m, "data", m.data.view(torch.uint8)), "bool mask, got dtype torch.uint8"),
    (lambda m: setattr(m, "data", m.data.view(1, 4)), "length 4, got \\(1, 4\\)"),
    (lambda m: setattr(m, "data", m.data[:3]), "length 4, got \\(3,\\)"),
    (lambda m: setattr(m, "data", m.data.float()), "bool mask, got dtype torch.float32"),
])
def test_a_mask_changed_under_the_same_tensor_object_is_checked_again(change, message):
    is_embed = torch.tensor([True, False, True, True])
    outputs = {"a": torch.randn(3, 8)}
    for _ in range(2):  # seen twice, so that a remembered answer would be used
        assert _plan_mask(is_embed, outputs).n_rows == 3
    change(is_embed)
    for _ in range(2):
        with pytest.raises(InvalidItemError, match=message):
            _plan_mask(is_embed, outputs)


@pytest.mark.parametrize("inference", [False, True])
def test_a_mask_written_without_a_version_bump_is_read_again(inference):
    """A write through ``.numpy()`` (or any alias of the memory) leaves the tensor's version
    counter alone: the new values are read, both a changed row count and, with the same
    count, moved positions."""
    gen = torch.Generator().manual_seed(5)
    with torch.inference_mode(inference):
        is_embed = torch.tensor([True, False, True, True])
    outputs = {"a": torch.randn(3, 8, generator=gen, dtype=torch.float64)}
    reqs = [("r", [feature("a", 0, 4, is_embed)], 0, 4)]
    for _ in range(2):
        assert torch.equal(_plan_mask(is_embed, outputs).merge_into(torch.zeros(4, 8, dtype=torch.float64)),
                           expected_rows(reqs, outputs, 4, 8)[2])
    version = is_embed._version if not inference else None
    is_embed.numpy()[1] = True  # four embedding positions now
    assert inference or is_embed._version == version
    with pytest.raises(EmbeddingLengthMismatch, match="expected 4, got 3"):
        _plan_mask(is_embed, outputs)
    is_embed.numpy()[:] = [True, True, False, True]  # three again, the text position moved
    step = _plan_mask(is_embed, outputs)
    assert step.is_mm_embed().tolist() == [True, True, False, True]
    assert torch.equal(step.merge_into(torch.zeros(4, 8, dtype=torch.float64)), expected_rows(reqs, outputs, 4, 8)[2])


@pytest.mark.parametrize("seed", range(20))
def test_masks_rewritten_between_steps_always_give_the_reference(seed):
    """Several requests' masks, rewritten at random between steps through numpy aliases
    (no version bump), through torch (a bump) or left alone, over chunked windows."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    masks = [torch.tensor([rng.random() < 0.7 for _ in range(rng.randint(1, 12))]) for _ in range(rng.randint(1, 4))]
    for _ in range(6):
        outputs, reqs = {}, []
        for k, m in enumerate(masks):
            how = rng.choice(("numpy", "torch", "keep"))
            values = [rng.random() < 0.7 for _ in range(m.shape[0])]
            if how == "numpy":
                m.numpy()[:] = values
            elif how == "torch":
                m.copy_(torch.tensor(values))
            outputs[f"m{k}"] = torch.randn(int(m.sum()), 2, generator=gen, dtype=torch.float64)
            prompt = 2 + m.shape[0] + 1
            done = rng.randint(0, prompt - 1)
            reqs.append((f"r{k}", [feature(f"m{k}", 2, m.shape[0], m)], done, rng.randint(1, prompt - done)))
        check_step(reqs, outputs, 2)


def test_an_unchanged_mask_is_not_read_into_runs_again():
    """The runs of a mask are kept while its values stay the same (a step with many masked
    ranges would otherwise recompute them all); kept means found equal, value by value."""
    is_embed = torch.tensor([True, False, True, True])
    position = types.SimpleNamespace(offset=0, length=4, is_embed=is_embed)
    first = planner._runs_of(position, "r", "a")
    assert planner._runs_of(position, "r", "a") is first
    assert first.mask is not is_embed and first.mask.data_ptr() != is_embed.data_ptr()  # a copy of its own
    is_embed.numpy()[0] = False
    again = planner._runs_of(position, "r", "a")
    assert again is not first and again.starts == [2] and again.rows == 2
