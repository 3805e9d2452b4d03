"""EVS results and the cache: held to the modality's declared or learned layout like any
encoder output, never served from an encoder's reused output buffer, and returned to the
caller in memory of its own (an in-place write never reaches the cache). Rows are
compared exactly with the naive reference of ``evs_inputs``."""

from __future__ import annotations

import random

import pytest
import torch

import mm_schedule
from mm_schedule import Encoder, MMItem, StepContext
from mm_schedule.errors import (
    CachedEmbeddingError,
    CacheLayoutError,
    EmbeddingLengthMismatch,
    EncoderOutputError,
)
from mm_schedule.evs import PRE_CHUNKED_KEY, EVSEmbeddingResult

from .evs_inputs import HIDDEN, EVSEncoder, Prompt, layout, naive_step
from .helpers import truth


@pytest.fixture(autouse=True)
def quiet_context():
    mm_schedule.set_step_context(StepContext(on_cache_hit=None))
    yield
    mm_schedule.set_step_context(StepContext())


def _cache(**declared):
    mm_schedule.init_mm_embedding_cache(64 << 20, **declared)
    return mm_schedule.sglang_compat.embedding_cache


def _step(encoder, prompts, windows):
    """One call, checked exactly against the naive reference; returns the rows."""
    rows, mask, ids = mm_schedule.get_embedding_and_mask(encoder, *layout(prompts, windows))
    want_rows, want_mask, want_ids = naive_step(prompts, windows)
    assert torch.equal(ids, want_ids)
    assert (rows is None) == (want_rows is None)
    if want_rows is not None:
        assert rows.shape == want_rows.shape and rows.dtype == want_rows.dtype and torch.equal(rows, want_rows)
        assert torch.equal(mask, want_mask)
    return rows


def _split(p: Prompt, rng: random.Random) -> list[tuple[int, int]]:
    """Two windows over the prompt, cut inside the video."""
    first, last = p.video.offsets[0][0], p.video.offsets[-1][1]
    cut = rng.randint(first + 1, last) if last > first else first + 1
    return [(0, cut), (cut, len(p.ids) - cut)]


def _twin(p: Prompt, h: int) -> Prompt:
    """Another video (hash ``h``, its own rows) with ``p``'s prompt and frame counts: the
    same number of rows, so an encoder reusing one buffer writes both into it."""
    q = Prompt.__new__(Prompt)
    q.__dict__.update(p.__dict__)
    q.video = MMItem(modality="VIDEO", hash=h, offsets=list(p.video.offsets), pad_value=p.pad,
                     model_specific_data={PRE_CHUNKED_KEY: list(p.ids)})
    q.rows = truth(h, p.rows.shape[0], HIDDEN)
    return q


def _entry_storages(cache) -> set:
    return {e[0].untyped_storage().data_ptr() for e in cache._entries.values()}


# -- layouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["hidden", "dtype"])
@pytest.mark.parametrize("seed", range(3))
def test_a_declared_layout_refuses_an_evs_output_and_caches_nothing(bad, seed):
    rng = random.Random(seed)
    p = Prompt(rng, h=300 + seed, frames=rng.randint(2, 4))
    cache = _cache(hidden_sizes=HIDDEN, dtypes=torch.float32)
    wrong = p.rows[:, :-1].clone() if bad == "hidden" else p.rows.double()

    def faulty(items):
        return EVSEmbeddingResult(embedding=wrong.clone(), num_tokens_per_frame=list(p.kept))

    first, rest = _split(p, rng)
    error = EncoderOutputError if bad == "hidden" else CacheLayoutError
    with pytest.raises(error, match=rf"request 0, item hash {p.video.hash}: the video embedding has"):
        mm_schedule.get_embedding_and_mask(faulty, *layout([p], [first]))
    assert len(cache) == 0 and cache.stats().bytes == 0
    encoder = EVSEncoder([p])
    _step(encoder, [p], [first])
    _step(encoder, [p], [rest])  # served from the cache: the encoder's rows, not the faulty ones
    assert encoder.calls == [[p.video.hash]]


def test_evs_entries_teach_the_video_layout_and_are_held_to_it_once_confirmed():
    """Like a planned step's outputs: one EVS insert teaches the video layout, which binds once
    three inserts confirmed it; before that a disagreeing video runs but is not cached."""
    rng = random.Random(11)
    taught = [Prompt(rng, h=311 + k * 10, frames=3) for k in range(3)]
    b = Prompt(rng, h=312, frames=2)
    cache = _cache()

    def float64(items):
        return EVSEmbeddingResult(embedding=b.rows.double(), num_tokens_per_frame=list(b.kept))

    _step(EVSEncoder([taught[0]]), [taught[0]], [(0, len(taught[0].ids))])
    assert cache.layout_of("VIDEO") == (HIDDEN, torch.float32)
    assert "learned from the 1 VIDEO entry the cache holds, not yet confirmed" in cache.layout_source("VIDEO")
    rows, _, _ = mm_schedule.get_embedding_and_mask(float64, *layout([b], [(0, len(b.ids))]))
    assert rows.dtype == torch.float64 and len(cache) == 1  # disputed once: not cached, nothing evicted
    for a in taught[1:]:
        _step(EVSEncoder([a]), [a], [(0, len(a.ids))])
    assert cache.layout_confirmed("VIDEO") and len(cache) == 3
    with pytest.raises(CacheLayoutError, match=r"request 0, item hash 312: .*dtype torch\.float64.*learned from"):
        mm_schedule.get_embedding_and_mask(float64, *layout([b], [(0, len(b.ids))]))
    assert len(cache) == 3


def test_two_videos_of_one_step_disagreeing_on_dtype_cache_nothing():
    rng = random.Random(12)
    a, b = Prompt(rng, h=321, frames=2), Prompt(rng, h=322, frames=3)
    cache = _cache()

    def encoder(items):
        p = {321: a, 322: b}[items[0].hash]
        rows = p.rows if p is a else p.rows.double()
        return EVSEmbeddingResult(embedding=rows.clone(), num_tokens_per_frame=list(p.kept))

    with pytest.raises(CacheLayoutError, match=r"request 1, item hash 322: .*request 0, item hash 321"):
        mm_schedule.get_embedding_and_mask(encoder, *layout([a, b], [(0, len(a.ids)), (0, len(b.ids))]))
    assert len(cache) == 0


def test_a_failed_evs_call_caches_none_of_its_other_videos_either():
    """The plain video of the call is encoded and checked first, but its entry waits for
    the EVS video: a call that fails after it leaves the cache as it was."""
    rng = random.Random(13)
    a, plain = Prompt(rng, h=331, frames=3), Prompt(rng, h=332, frames=2, evs=False)
    windows = [(0, len(a.ids)), (0, len(plain.ids))]
    cache = _cache()

    def refused(items):
        if items[0].hash == 331:
            return EVSEmbeddingResult(embedding=a.rows.clone(), num_tokens_per_frame=[*a.kept, 1])
        return [plain.rows.clone()]

    with pytest.raises(EncoderOutputError, match=r"request 0, item hash 331: 4 frame token counts"):
        mm_schedule.get_embedding_and_mask(refused, *layout([a, plain], windows))
    assert len(cache) == 0 and cache.stats().bytes == 0
    encoder = EVSEncoder([a, plain])
    _step(encoder, [a, plain], windows)
    assert encoder.calls == [[332], [331]] and len(cache) == 2


def test_a_plain_video_teaches_its_layout_to_the_evs_video_of_its_call():
    """An empty cache learns the video layout from what the call caches: the plain video's
    rows and an EVS video of another dtype cannot both be cached, so neither is."""
    rng = random.Random(14)
    a, plain = Prompt(rng, h=341, frames=3), Prompt(rng, h=342, frames=2, evs=False)
    cache = _cache()

    def float64(items):
        if items[0].hash == 341:
            return EVSEmbeddingResult(embedding=a.rows.double(), num_tokens_per_frame=list(a.kept))
        return [plain.rows.clone()]

    with pytest.raises(CacheLayoutError, match=r"request 0, item hash 341: .*dtype torch\.float64.*this call's other"):
        mm_schedule.get_embedding_and_mask(float64, *layout([a, plain], [(0, len(a.ids)), (0, len(plain.ids))]))
    assert len(cache) == 0


# -- an encoder reusing its output buffer -----------------------------------------------------


class BufferEncoder:
    """Writes each call's rows into the next of ``buffers`` buffers, in turn (one: the same
    buffer every call), and returns it. A video in ``refuse`` gets one frame count too many,
    so its output is refused after the rows were written."""

    def __init__(self, prompts, buffers: int = 1, refuse: tuple = ()):
        self.by_hash = {p.video.hash: p for p in prompts}
        self.ring = [torch.empty_like(prompts[0].rows) for _ in range(buffers)]
        self.buffer = self.ring[0]
        self.refuse = {p.video.hash for p in refuse}
        self.calls = []

    def __call__(self, items):
        p = self.by_hash[items[0].hash]
        buffer = self.ring[len(self.calls) % len(self.ring)]
        self.calls.append(p.video.hash)
        buffer.copy_(p.rows)
        kept = list(p.kept) + ([1] if p.video.hash in self.refuse else [])
        return EVSEmbeddingResult(embedding=buffer, num_tokens_per_frame=kept)


@pytest.mark.parametrize("seed", range(4))
def test_a_reused_buffer_never_serves_another_videos_rows(seed):
    rng = random.Random(seed)
    a = Prompt(rng, h=400 + seed, frames=rng.randint(2, 4))
    b = _twin(a, 500 + seed)
    _cache()
    encoder = BufferEncoder([a, b])
    a_first, a_rest = _split(a, rng)
    _step(encoder, [a], [a_first])
    _step(encoder, [b], [a_first])  # video B lands in the buffer that held video A's entry
    _step(encoder, [a], [a_rest])  # A's entry was overwritten: evicted and encoded again
    _step(encoder, [b], [a_rest])
    assert encoder.calls == [a.video.hash, b.video.hash, a.video.hash]


def test_two_videos_encoded_into_one_buffer_in_one_step():
    """Each video's rows are taken before the encoder runs again; the next step's encode
    into the buffer evicts the one entry still in it, and every other is served."""
    rng = random.Random(21)
    a = Prompt(rng, h=410, frames=3)
    b, c, d = _twin(a, 411), _twin(a, 412), _twin(a, 413)
    _cache()
    encoder = BufferEncoder([a, b, c, d])
    whole = (0, len(a.ids))
    _step(encoder, [a, b, c], [whole] * 3)
    assert sorted(encoder.calls) == [410, 411, 412]
    _step(encoder, [d], [whole])
    for p in (a, b, c, d):
        _step(encoder, [p], [whole])
    assert sorted(encoder.calls[4:]) == [encoder.calls[2]]  # only the entry left in the buffer


def test_a_hit_overwritten_by_this_steps_encode_is_evicted_never_served():
    rng = random.Random(22)
    a = Prompt(rng, h=420, frames=3)
    b = _twin(a, 421)
    cache = _cache()
    encoder = BufferEncoder([a, b])
    a_first, a_rest = _split(a, rng)
    _step(encoder, [a], [a_first])  # A cached in the encoder's buffer, by reference
    with pytest.raises(CachedEmbeddingError, match=r"request 0, item hash 420: the encoder's output for request 1,"
                                                   r" item hash 421 was written into the storage"):
        mm_schedule.get_embedding_and_mask(encoder, *layout([a, b], [a_rest, a_first]))
    assert not cache.has(mm_schedule.combine_hashes([420]))
    _step(encoder, [a, b], [a_rest, a_first])  # the step again: both encoded, each its own rows


def test_copy_outputs_keeps_every_entry():
    rng = random.Random(23)
    a = Prompt(rng, h=430, frames=2)
    b = _twin(a, 431)
    cache = _cache()
    buffered = BufferEncoder([a, b])
    encoder = Encoder(buffered, copy_outputs=True)
    a_first, a_rest = _split(a, rng)
    _step(encoder, [a], [a_first])
    _step(encoder, [b], [a_first])
    _step(encoder, [a, b], [a_rest, a_rest])
    assert buffered.calls == [430, 431] and len(cache) == 2
    assert buffered.buffer.untyped_storage().data_ptr() not in _entry_storages(cache)


# -- rows returned to the caller --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_returned_rows_are_the_callers_own_memory(seed):
    """Hit or miss, whole prompt or chunk, alone or beside a plain video: scaling the
    returned rows in place changes nothing the next request is served."""
    rng = random.Random(seed)
    p = Prompt(rng, h=600 + seed, frames=rng.randint(1, 4))
    plain = Prompt(rng, h=700 + seed, frames=rng.randint(1, 3), evs=False)
    cache = _cache()
    encoder = EVSEncoder([p, plain])
    outputs = []
    original = encoder.__call__

    def recording(items):
        out = original(items)
        outputs.append(out.embedding if hasattr(out, "embedding") else out[0])
        return out

    first, rest = _split(p, rng)
    windows = [[(0, len(p.ids))], [first], [rest]]
    for _ in range(2):
        for window in windows:
            for prompts, wins in [([p], window), ([p, plain], [window[0], (0, len(plain.ids))])]:
                rows = _step(recording, prompts, wins)
                held = _entry_storages(cache) | {t.untyped_storage().data_ptr() for t in outputs}
                assert rows.untyped_storage().data_ptr() not in held
                rows.mul_(0.5)
                rows.fill_(float("nan"))
    assert sum(1 for c in encoder.calls if c == [p.video.hash]) == 1


@pytest.mark.parametrize("seed", range(3))
def test_a_ring_of_buffers_never_serves_a_video_another_one_overwrote(seed):
    """Video X is cached in buffer 0; a step encodes Y, Z, W into buffers 1, 0, 1: Z wrote
    over X's entry, and the copy taken of Z before W's encode must not hide that."""
    rng = random.Random(seed)
    x = Prompt(rng, h=600 + seed, frames=rng.randint(2, 4))
    y, z, w = _twin(x, 700 + seed), _twin(x, 800 + seed), _twin(x, 900 + seed)
    _cache()
    encoder = BufferEncoder([x, y, z, w], buffers=2)
    whole = (0, len(x.ids))
    _step(encoder, [x], [whole])
    _step(encoder, [y, z, w], [whole] * 3)
    _step(encoder, [x], [whole])
    assert encoder.calls.count(x.video.hash) == 2  # X's entry was gone: encoded again


def test_the_evs_path_never_serves_an_entry_of_an_unconfirmed_layout_change():
    """VIDEO entries of one layout go; one faulty EVS encode (hidden 16) makes an unconfirmed
    change; the request's next chunk, with the right encoder, is encoded again, not served."""
    rng = random.Random(31)
    a, b = Prompt(rng, 11), Prompt(rng, 22)
    cache = _cache()
    good = EVSEncoder([a, b])
    _step(good, [a], [(0, len(a.ids))])
    cache.discard_many([mm_schedule.combine_hashes([a.video.hash])])

    def faulty(items):
        out = good(items)
        return EVSEmbeddingResult(embedding=torch.randn(out.embedding.shape[0], 16),
                                  num_tokens_per_frame=out.num_tokens_per_frame)

    first, rest = _split(b, rng)
    mm_schedule.get_embedding_and_mask(faulty, *layout([b], [first]))
    assert cache.layout_changing("VIDEO")
    calls = len(good.calls)
    _step(good, [b], [rest])
    assert len(good.calls) == calls + 1


def test_a_refused_video_output_still_evicts_the_entry_it_overwrote():
    """The encoder writes video Y into the buffer video X is cached in, and Y's output is
    refused (its frame counts do not add up): X's entry lost its rows all the same."""
    rng = random.Random(41)
    x = Prompt(rng, h=610, frames=3)
    y = _twin(x, 710)
    _cache()
    encoder = BufferEncoder([x, y], refuse=(y,))
    whole = [(0, len(x.ids))]
    _step(encoder, [x], whole)
    with pytest.raises((EncoderOutputError, EmbeddingLengthMismatch)):
        mm_schedule.get_embedding_and_mask(encoder, *layout([y], whole))
    _step(encoder, [x], whole)
    assert encoder.calls == [610, 710, 610]
