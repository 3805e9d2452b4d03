"""EVS (pruned video rows that move placeholders) through the SGLang-compatible
``get_embedding_and_mask``, against the naive reference of ``evs_inputs``."""

from __future__ import annotations

import random

import pytest
import torch

import mm_schedule
from mm_schedule import MMItem, RequestChunk, StepContext, embed_chunk
from mm_schedule.errors import EmbeddingLengthMismatch, EncoderOutputError, InvalidItemError
from mm_schedule.evs import PRE_CHUNKED_KEY, EVSEmbeddingResult

from .conftest import BACKENDS
from .evs_inputs import HIDDEN, EVSEncoder, Prompt, layout, naive_step


@pytest.fixture(autouse=True)
def fresh_cache():
    mm_schedule.init_mm_embedding_cache(64 << 20)
    mm_schedule.set_step_context(StepContext(on_cache_hit=None))
    yield
    mm_schedule.set_step_context(StepContext())


def _same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)


def _check(prompts, windows, encoder):
    rows, mask, ids = mm_schedule.get_embedding_and_mask(encoder, *layout(prompts, windows))
    want_rows, want_mask, want_ids = naive_step(prompts, windows)
    assert torch.equal(ids, want_ids)
    assert _same(rows, want_rows)
    if want_rows is not None:
        assert torch.equal(mask, want_mask)
    return rows


# -- behaviour ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("seed", range(6))
def test_chunked_prefill_matches_the_naive_reference(backend, seed):
    """A batch of EVS videos beside plain videos (one or several spans) and a request
    with no video, prefilled chunk by chunk: every step's rows, mask and input_ids, and
    each EVS video encoded once, alone."""
    rng = random.Random(seed)
    prompts = [Prompt(rng, h=seed * 10 + r, frames=rng.randint(1, 4)) for r in range(3)]
    prompts += [Prompt(rng, h=seed * 10 + 3, frames=rng.randint(1, 3), evs=False), Prompt(rng, h=seed * 10 + 4, frames=0)]
    rng.shuffle(prompts)
    encoder = EVSEncoder(prompts)
    chunk = rng.randint(3, 12)
    longest = max(len(p.ids) for p in prompts)
    for prefix in range(0, longest, chunk):
        windows = [(min(prefix, len(p.ids)), max(0, min(chunk, len(p.ids) - prefix))) for p in prompts]
        _check(prompts, windows, encoder)
    evs_calls = [c for c in encoder.calls if encoder.by_hash[c[0]].evs]
    assert sorted(c[0] for c in evs_calls) == sorted(p.video.hash for p in prompts if p.evs and p.video)
    assert all(len(c) == 1 for c in evs_calls)


def _shifted(p: Prompt, text: list[int]) -> Prompt:
    """The same video (hash, rows, kept tokens) in another prompt, ``text`` before it."""
    q = Prompt.__new__(Prompt)
    q.__dict__.update(p.__dict__)
    q.ids = text + p.ids
    q.video = MMItem(
        modality="VIDEO", hash=p.video.hash, offsets=[(s + len(text), e + len(text)) for s, e in p.video.offsets],
        pad_value=p.pad, model_specific_data={PRE_CHUNKED_KEY: list(q.ids)},
    )
    return q


def test_a_video_shared_by_two_requests_is_encoded_once():
    p = Prompt(random.Random(12), h=13, frames=3)
    prompts = [p, _shifted(p, [7, 8, 9])]
    encoder = EVSEncoder(prompts)
    _check(prompts, [(0, len(q.ids)) for q in prompts], encoder)
    assert encoder.calls == [[13]]


def test_whole_prompt_in_one_step_video_only_call():
    rng = random.Random(42)
    prompts = [Prompt(rng, h=7, frames=4), Prompt(rng, h=8, frames=1)]
    _check(prompts, [(0, len(p.ids)) for p in prompts], EVSEncoder(prompts))


def test_sglang_result_objects_are_accepted():
    """Any object with ``embedding`` and ``num_tokens_per_frame`` (SGLang's own class) works."""

    class TheirResult:
        def __init__(self, *, embedding, num_tokens_per_frame):
            self.embedding, self.num_tokens_per_frame = embedding, num_tokens_per_frame

    rng = random.Random(3)
    prompts = [Prompt(rng, h=5, frames=3)]
    _check(prompts, [(0, len(prompts[0].ids))], EVSEncoder(prompts, TheirResult))


def test_plain_tensor_means_nothing_pruned_and_ids_unchanged():
    rng = random.Random(9)
    prompts = [Prompt(rng, h=11, frames=3)]
    p = prompts[0]

    def encoder(items):
        return p.rows.clone()

    p.kept = [e - s + 1 for s, e in p.video.offsets]  # the reference with nothing pruned
    args = layout(prompts, [(0, len(p.ids))])
    rows, _, ids = mm_schedule.get_embedding_and_mask(encoder, *args)
    assert ids is args[2]
    assert torch.equal(rows, naive_step(prompts, [(0, len(p.ids))])[0])


def test_windows_that_miss_the_video_neither_encode_nor_rewrite():
    rng = random.Random(1)
    p = Prompt(rng, h=21, frames=2)
    first, last = p.video.offsets[0][0], p.video.offsets[-1][1]
    encoder = EVSEncoder([p])
    for window in [(0, first), (last + 1, len(p.ids) - last - 1)]:
        if window[1] <= 0:
            continue
        args = layout([p], [window])
        rows, mask, ids = mm_schedule.get_embedding_and_mask(encoder, *args)
        assert rows is None and mask is None and ids is args[2]
    assert encoder.calls == []


def test_a_cache_hit_is_redistributed_with_the_cached_frame_counts():
    rng = random.Random(5)
    p = Prompt(rng, h=31, frames=3)
    encoder = EVSEncoder([p])
    whole = [(0, len(p.ids))]
    first = _check([p], whole, encoder)
    second = _check([p], whole, encoder)
    assert len(encoder.calls) == 1 and torch.equal(first, second)


# -- bad input: typed errors, nothing cached ----------------------------------------------


def _layout(p):
    return layout([p], [(0, len(p.ids))])


def test_frame_counts_not_summing_to_the_placeholders():
    p = Prompt(random.Random(2), h=41, frames=3)
    p.kept[0] += 1
    with pytest.raises(EmbeddingLengthMismatch, match=r"request 0, item hash 41.*expected \d+, got \d+"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *_layout(p))
    assert len(mm_schedule.embedding_cache) == 0


def test_rows_not_matching_the_frame_counts():
    p = Prompt(random.Random(2), h=42, frames=3)

    def encoder(items):
        return EVSEmbeddingResult(embedding=p.rows[:-1].clone(), num_tokens_per_frame=p.kept)

    with pytest.raises(EmbeddingLengthMismatch, match="item hash 42"):
        mm_schedule.get_embedding_and_mask(encoder, *_layout(p))
    assert len(mm_schedule.embedding_cache) == 0


def test_frame_count_list_of_the_wrong_length():
    p = Prompt(random.Random(2), h=43, frames=3)

    def encoder(items):
        return EVSEmbeddingResult(embedding=p.rows.clone(), num_tokens_per_frame=[sum(p.kept)])

    with pytest.raises(EncoderOutputError, match="request 0, item hash 43: 1 frame token counts for a video with 3"):
        mm_schedule.get_embedding_and_mask(encoder, *_layout(p))


def test_two_evs_videos_in_one_request():
    rng = random.Random(4)
    a, b = Prompt(rng, h=51), Prompt(rng, h=52)
    layout = list(_layout(a))
    layout[0] = [a.video, b.video]
    layout[3] = [0, 2]
    with pytest.raises(InvalidItemError, match="request 0: an EVS video must be the only item"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([a, b]), *layout)


def test_input_ids_that_are_not_the_listed_requests_tokens():
    p = Prompt(random.Random(6), h=61)
    layout = list(_layout(p))
    layout[2] = torch.cat([layout[2], torch.tensor([1, 2, 3])])  # a text-only request's tokens
    with pytest.raises(InvalidItemError, match=rf"must hold exactly the listed requests' extend tokens \({len(p.ids)}\)"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *layout)


def test_pre_chunked_ids_shorter_than_the_video():
    p = Prompt(random.Random(7), h=71)
    p.video.model_specific_data[PRE_CHUNKED_KEY] = p.ids[: p.video.offsets[-1][1]]
    with pytest.raises(InvalidItemError, match="item hash 71: pre_chunked_input_ids has"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *_layout(p))


def test_pad_value_outside_the_video_is_refused():
    p = Prompt(random.Random(8), h=81)
    p.ids[-1] = p.pad
    p.ids.append(5)
    p.video.model_specific_data[PRE_CHUNKED_KEY] = list(p.ids)
    with pytest.raises(InvalidItemError, match="item hash 81: after redistribution the prompt holds"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *layout([p], [(0, len(p.ids) - 1)]))


def test_a_bad_cached_entry_is_discarded_and_reencoded():
    p = Prompt(random.Random(10), h=91, frames=2)
    key = mm_schedule.combine_hashes([91])
    mm_schedule.embedding_cache.set(key, EVSEmbeddingResult(embedding=torch.zeros(1, HIDDEN), num_tokens_per_frame=[1, 0]))
    encoder = EVSEncoder([p])
    _check([p], [(0, len(p.ids))], encoder)
    assert len(encoder.calls) == 1


def test_pruned_rows_are_refused_where_input_ids_cannot_be_rewritten():
    """The explicit API has no input_ids to rewrite, and a video without the prompt ids
    cannot be redistributed: both refuse an EVS result rather than misplace its rows."""
    p = Prompt(random.Random(14), h=15, frames=3)
    request = RequestChunk(items=[p.video], prefix=0, extend=len(p.ids))
    with pytest.raises(EncoderOutputError, match="request 0 item hash 15: the encoder pruned video tokens"):
        embed_chunk([request], EVSEncoder([p]))
    p.video.model_specific_data.clear()
    with pytest.raises(EncoderOutputError, match="pre_chunked_input_ids"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *_layout(p))
    assert len(mm_schedule.embedding_cache) == 0


def test_item_hashes_follow_the_cache_key_rules():
    """A str hash keys the cache like any item's (a stable digest); a float is refused."""
    p = Prompt(random.Random(16), h=17, frames=2)
    encoder = EVSEncoder([p])
    encoder.by_hash["clip-17"] = p
    p.video.hash = "clip-17"
    _check([p], [(0, len(p.ids))], encoder)
    _check([p], [(0, len(p.ids))], encoder)
    assert encoder.calls == [["clip-17"]]  # the second step is a cache hit
    p.video.hash = 17.0
    with pytest.raises(InvalidItemError, match=r"request 0: item hash 17\.0 is a float"):
        mm_schedule.get_embedding_and_mask(encoder, *_layout(p))


def test_placeholder_count_is_checked_after_the_rewrite_and_nothing_is_cached():
    rng = random.Random(18)
    p, text_only = Prompt(rng, h=19, frames=2), Prompt(rng, h=20, frames=0)
    text_only.ids[0] = p.pad  # a stray placeholder in another request's tokens
    encoder = EVSEncoder([p])
    with pytest.raises(EmbeddingLengthMismatch, match=r"placeholder tokens of these items in input_ids: expected \d+, got \d+"):
        mm_schedule.get_embedding_and_mask(encoder, *layout([p, text_only], [(0, len(p.ids)), (0, len(text_only.ids))]))
    assert len(encoder.calls) == 1 and len(mm_schedule.embedding_cache) == 0


@pytest.mark.parametrize("counts", [None, "51", [1.5, 2], [True, 1]], ids=["none", "string", "floats", "bools"])
def test_frame_counts_must_be_integers(counts):
    p = Prompt(random.Random(2), h=44, frames=2)

    def encoder(items):
        return EVSEmbeddingResult(embedding=p.rows.clone(), num_tokens_per_frame=counts)

    with pytest.raises(EncoderOutputError, match=r"request 0, item hash 44: .*num_tokens_per_frame"):
        mm_schedule.get_embedding_and_mask(encoder, *_layout(p))
    assert len(mm_schedule.embedding_cache) == 0


def test_engine_input_ids_must_be_the_pre_chunked_prompt():
    p = Prompt(random.Random(3), h=45)
    layout = list(_layout(p))
    layout[2] = layout[2].clone()
    layout[2][0] += 1  # the engine's prompt and the processor's differ at position 0
    with pytest.raises(InvalidItemError, match="item hash 45: input_ids differ from pre_chunked_input_ids at position 0"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *layout)


def test_a_reencode_that_prunes_otherwise_than_earlier_chunks_is_refused():
    p = Prompt(random.Random(5), h=46, frames=3)
    split = p.video.offsets[0][1] + 1  # the first chunk ends after the first frame
    mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *layout([p], [(0, split)]))
    mm_schedule.embedding_cache.clear()  # evicted between the chunks
    p.kept = [p.kept[-1], *p.kept[1:-1], p.kept[0]] if p.kept[0] != p.kept[-1] else [0, 0, sum(p.kept)]
    with pytest.raises(EncoderOutputError, match="item hash 46: the encoder pruned the video into frame counts"):
        mm_schedule.get_embedding_and_mask(EVSEncoder([p]), *layout([p], [(split, len(p.ids) - split)]))
