"""A cache layout is never learned from one unverified output for good: a bad first step
(hidden size 15 where the model's is 16), then ten good ones, through ``embed_chunk``,
``merge_chunk``, the SGLang drop-in and the SGLang stand-in, on both assembly backends; a
learned layout binds steps once three inserts (or a merged step's proof) confirmed it."""

from __future__ import annotations

import logging
import random

import pytest
import torch

import mm_schedule
from mm_schedule import (
    EmbeddingCache,
    MMItem,
    RequestChunk,
    embed_chunk,
    get_embedding_and_mask,
    merge_chunk,
)
from mm_schedule.errors import CacheLayoutError, EncoderOutputError

from .conftest import BACKENDS
from .helpers import CountingEncoder, naive_reference, truth

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

GOOD, BAD = 16, 15
PAD = 7


def _request(hashes: list[int], rng: random.Random) -> RequestChunk:
    items, start = [], rng.randint(0, 2)
    for h in hashes:
        length = rng.randint(1, 4)
        items.append(MMItem(modality="IMAGE", hash=h, offsets=[(start, start + length - 1)],
                            feature=torch.zeros(1), pad_value=PAD))
        start += length + rng.randint(0, 2)
    return RequestChunk(items=items, prefix=0, extend=start + 1)


def _good_steps(rng: random.Random, first_hash: int, reuse: int | None = None) -> list[list[RequestChunk]]:
    """Ten steps of new items; with ``reuse``, each step also asks for that item again."""
    steps = []
    for i in range(10):
        hashes = [first_hash + 2 * i, first_hash + 2 * i + 1] + ([] if reuse is None else [reuse])
        steps.append([_request(hashes, rng)])
    return steps


def _merged(reqs, encoder, cache, hidden=GOOD) -> torch.Tensor:
    total = sum(r.extend for r in reqs)
    embeds = torch.full((total, hidden), float("nan"))
    merge_chunk(embeds, reqs, encoder, cache=cache)
    rows = [p for r in reqs for it in r.items for s, e in it.offsets for p in range(s, e + 1)]
    return embeds[sorted(rows)]


def _drop_in(reqs, encoder) -> torch.Tensor:
    (req,) = reqs
    ids = torch.arange(100, 100 + req.extend)
    for it in req.items:
        for s, e in it.offsets:
            ids[s : e + 1] = PAD
    emb, mask, _ = get_embedding_and_mask(
        encoder, list(req.items), torch.tensor([PAD]), ids, [0, len(req.items)], [0], [req.extend],
        [[span for it in req.items for span in it.offsets]],
    )
    assert int(mask.sum()) == emb.shape[0]
    return emb


def test_merge_after_a_bad_warm_up_replaces_the_learned_layout(backend, caplog):
    """A warm-up step merged into input_embeds of the wrong size (a dummy model) cached
    hidden-15 entries; real steps (input_embeds of 16) prove their size, so the learned
    layout is replaced, the stale entries evicted, and the log says so."""
    rng = random.Random(1)
    cache = EmbeddingCache(1 << 20)
    warm_up = [_request([1, 2], rng)]
    _merged(warm_up, CountingEncoder(hidden=BAD), cache, hidden=BAD)
    assert cache.layout_of("IMAGE") == (BAD, torch.float32) and len(cache) == 2
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        for reqs in _good_steps(rng, 100, reuse=1):
            enc = CountingEncoder(hidden=GOOD)
            assert torch.equal(_merged(reqs, enc, cache), naive_reference(reqs, GOOD))
    assert cache.layout_of("IMAGE") == (GOOD, torch.float32)
    assert "IMAGE embeddings now have hidden size 16" in caplog.text
    assert not cache.contains(2)  # the stale warm-up entry went with its layout
    entry = cache.lookup(1)
    assert torch.equal(entry, truth(1, entry.shape[0], GOOD))


def test_merge_refuses_a_bad_first_output_and_caches_nothing(backend):
    rng = random.Random(2)
    cache = EmbeddingCache(1 << 20)
    with pytest.raises(EncoderOutputError, match=r"item hash 1: .*hidden size 15, expected 16 \(input_embeds\)"):
        _merged([_request([1], rng)], CountingEncoder(hidden=BAD), cache)
    assert len(cache) == 0 and cache.layout_of("IMAGE") == (None, None)
    for reqs in _good_steps(rng, 100, reuse=1):
        assert torch.equal(_merged(reqs, CountingEncoder(hidden=GOOD), cache), naive_reference(reqs, GOOD))


def _packed_api(api: str):
    """A fresh cache and a packed step through ``api``: ``embed_chunk``, the SGLang drop-in
    (``get_embedding_and_mask``) or the SGLang stand-in's own."""
    if api == "embed_chunk":
        cache = EmbeddingCache(1 << 20)
        return cache, lambda reqs, encoder: embed_chunk(reqs, encoder, cache=cache).embedding
    if api == "drop-in":
        mm_schedule.init_mm_embedding_cache(1 << 20)
        return mm_schedule.sglang_compat.embedding_cache, _drop_in
    from mm_schedule.integrations.sglang import standin
    from mm_schedule.integrations.sglang.versions import NEWEST

    standin.use_release(NEWEST)
    standin.set_step_context(None)
    standin.init_mm_embedding_cache(1 << 20)

    def step(reqs, encoder):
        (req,) = reqs
        ids = torch.arange(100, 100 + req.extend)
        for it in req.items:
            for s, e in it.offsets:
                ids[s : e + 1] = PAD
        emb, mask, _ = standin.get_embedding_and_mask(
            encoder, list(req.items), torch.tensor([PAD]), ids, [0, len(req.items)], [0], [req.extend],
            [[span for it in req.items for span in it.offsets]],
        )
        assert int(mask.sum()) == emb.shape[0]
        return emb

    return standin.embedding_cache, step


PACKED_APIS = ["embed_chunk", "drop-in", "stand-in"]


@pytest.mark.parametrize("api", PACKED_APIS)
def test_packed_after_a_bad_first_step_ten_good_steps_run(backend, api, caplog):
    """Packed mode has no proof of the hidden size: the bad first entry (hidden 15, one
    insert) taught a layout nothing confirmed, which binds no step. The first good step runs
    without being cached (it disputes that layout; nothing evicted), the second replaces it
    (its entry evicted, the log saying why), and every good step runs, the cache holding the
    good layout from then on."""
    rng = random.Random(3)
    cache, step = _packed_api(api)
    bad = [_request([1], rng)]
    assert step(bad, CountingEncoder(hidden=BAD)).shape[-1] == BAD
    assert cache.layout_of("IMAGE") == (BAD, torch.float32) and not cache.layout_confirmed("IMAGE")
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        for reqs in _good_steps(rng, 100):
            assert torch.equal(step(reqs, CountingEncoder(hidden=GOOD)), naive_reference(reqs, GOOD))
    assert "disagree with the layout learned from 1 insert(s) (hidden size 15" in caplog.text
    assert "not cached and nothing is evicted" in caplog.text and "disputed too" in caplog.text
    assert 1 not in cache and 100 not in cache and len(cache) == 18
    assert cache.layout_of("IMAGE") == (GOOD, torch.float32) and cache.layout_confirmed("IMAGE")
    with pytest.raises(EncoderOutputError, match=r"hidden size 15, expected 16 \(learned from the 18 IMAGE entries"
                                                 r" the cache holds, confirmed"):
        step([_request([99], rng)], CountingEncoder(hidden=BAD))
    assert 99 not in cache and len(cache) == 18


@pytest.mark.parametrize("api", PACKED_APIS)
def test_packed_good_steps_asking_for_the_bad_entry_again(backend, api, caplog):
    """Good steps that also ask for the bad item again hold a hit of the unconfirmed layout
    beside outputs that disagree with it: either side may be the faulty one, so the first
    such step is refused (nothing evicted, the error saying why); the next step bringing
    the same layout against it wins: the bad entry is evicted and encoded again within
    that step, and every later step runs."""
    rng = random.Random(8)
    cache, step = _packed_api(api)
    bad = _request([1], rng)
    step([bad], CountingEncoder(hidden=BAD))
    (span,) = bad.items[0].offsets
    good = []  # each a new pair of items, then the bad item again (same length, so the same entry)
    for reqs in _good_steps(rng, 100):
        (req,) = reqs
        start = req.extend + 1
        again = MMItem(modality="IMAGE", hash=1, offsets=[(start, start + span[1] - span[0])], feature=torch.zeros(1),
                       pad_value=PAD)
        good.append([RequestChunk(items=[*req.items, again], prefix=0, extend=start + span[1] - span[0] + 1)])
    with pytest.raises(EncoderOutputError, match=r"hidden size 16, expected 15 \(what this step's cached entries hold,"
                                                 r" a layout learned from fewer than three inserts and not yet"
                                                 r" confirmed; nothing was evicted"):
        step(good[0], CountingEncoder(hidden=GOOD))
    assert 1 in cache and len(cache) == 1
    for reqs in good[1:]:
        enc = CountingEncoder(hidden=GOOD)
        assert torch.equal(step(reqs, enc), naive_reference(reqs, GOOD))
    assert cache.layout_of("IMAGE") == (GOOD, torch.float32)
    assert torch.equal(cache.lookup(1), truth(1, cache.lookup(1).shape[0], GOOD))


@pytest.mark.parametrize("api", PACKED_APIS)
def test_a_confirmed_layout_refuses_a_faulty_step_an_unconfirmed_one_is_undone(backend, api, caplog):
    """Good first, then a faulty step of new items: against a layout one insert taught, the
    faulty outputs are not refused, but not cached either, and nothing is evicted; good steps
    go on as before and, two inserts later, confirm the layout; from then on a faulty step is
    refused and nothing of it cached."""
    rng = random.Random(9)
    cache, step = _packed_api(api)
    first = [_request([1], rng)]
    step(first, CountingEncoder(hidden=GOOD))
    faulty = [_request([2], rng)]
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        assert step(faulty, CountingEncoder(hidden=BAD)).shape[-1] == BAD
    assert "not cached and nothing is evicted" in caplog.text
    assert 1 in cache and 2 not in cache and not cache.layout_changing("IMAGE")
    for reqs in _good_steps(rng, 100)[:2]:
        assert torch.equal(step(reqs, CountingEncoder(hidden=GOOD)), naive_reference(reqs, GOOD))
    assert cache.layout_confirmed("IMAGE") and not cache.layout_changing("IMAGE")
    with pytest.raises(EncoderOutputError, match="hidden size 15, expected 16"):
        step([_request([3], rng)], CountingEncoder(hidden=BAD))
    assert 3 not in cache


@pytest.mark.parametrize("api", ["embed_chunk", "drop-in"])
def test_a_declared_layout_refuses_the_bad_first_step(backend, api):
    rng = random.Random(4)
    if api == "drop-in":
        mm_schedule.init_mm_embedding_cache(1 << 20, hidden_sizes={"IMAGE": GOOD}, dtypes=torch.float32)
        cache = mm_schedule.sglang_compat.embedding_cache
    else:
        cache = EmbeddingCache(1 << 20, hidden_sizes=GOOD)

    def step(reqs, encoder):
        return _drop_in(reqs, encoder) if api == "drop-in" else embed_chunk(reqs, encoder, cache=cache).embedding

    with pytest.raises(EncoderOutputError, match=r"item hash 1: .*hidden size 15, expected 16 \((hidden size )?declared for IMAGE"):
        step([_request([1], rng)], CountingEncoder(hidden=BAD))
    assert len(cache) == 0
    for reqs in _good_steps(rng, 100, reuse=1):
        assert torch.equal(step(reqs, CountingEncoder(hidden=GOOD)), naive_reference(reqs, GOOD))
    assert cache.layout_of("IMAGE") == (GOOD, torch.float32)


def test_a_fused_step_evicts_a_bad_entry_then_packed_steps_run(backend):
    """The attack as reported: the bad entry is evicted by a step that proves it unfit,
    and no layout stays behind it, so later packed steps of new items are not refused."""
    rng = random.Random(5)
    cache = EmbeddingCache(1 << 20)
    bad = [_request([1], rng)]
    embed_chunk(bad, CountingEncoder(hidden=BAD), cache=cache)
    fused = [_request([1, 50], rng)]
    enc = CountingEncoder(hidden=GOOD)
    assert torch.equal(_merged(fused, enc, cache), naive_reference(fused, GOOD))
    assert sorted(h for call in enc.calls for h in call) == [1, 50]  # the unfit hit encoded in the same step
    for reqs in _good_steps(rng, 100):
        assert torch.equal(embed_chunk(reqs, CountingEncoder(hidden=GOOD), cache=cache).embedding,
                           naive_reference(reqs, GOOD))


def _image(h: int, length: int) -> RequestChunk:
    return RequestChunk(items=[MMItem(modality="IMAGE", hash=h, offsets=[(0, length - 1)], feature=torch.zeros(1),
                                      pad_value=PAD)], prefix=0, extend=length)


def _doubled(items):
    return CountingEncoder(hidden=GOOD)(items).double()


def test_a_step_that_empties_its_modality_does_not_decide_its_layout_alone(backend, caplog):
    """One image cached (float32); a step brings its hash with another length, so its own
    lookup discards that only IMAGE entry, and its encoder returns float64: that output
    changes the learned layout, but only until another insert says otherwise. The next
    fault-free step undoes the change (evicting the float64 entry, saying so), and from then
    on float64 outputs are refused again. (The thread test above met this across threads.)"""
    cache = EmbeddingCache(1 << 20, hidden_sizes=GOOD)
    embed_chunk([_image(1, 2)], CountingEncoder(hidden=GOOD), cache=cache)
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        cut = embed_chunk([_image(1, 3)], _doubled, cache=cache)
    assert cut.embedding.dtype == torch.float64  # nothing in that step said otherwise
    assert cache.layout_changing("IMAGE")
    assert any("Until 2 more inserts bring that layout" in r.message for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        for h in (2, 3, 4):
            good = [_image(h, 2), _image(1, 3)]
            assert torch.equal(embed_chunk(good, CountingEncoder(hidden=GOOD), cache=cache).embedding,
                               naive_reference(good, GOOD))
    assert any("back to hidden size 16 and dtype torch.float32" in r.message for r in caplog.records)
    assert cache.layout_of("IMAGE") == (GOOD, torch.float32) and not cache.layout_changing("IMAGE")
    with pytest.raises(CacheLayoutError, match=r"item hash 9: .*dtype torch\.float64"):
        embed_chunk([_image(9, 2)], _doubled, cache=cache)
    assert 9 not in cache


def test_a_layout_change_is_served_once_a_second_insert_confirms_it(backend, caplog):
    """A real change of model (float64 from now on) after the modality's entries went: the
    new layout's entries are encoded again by the next two steps instead of served, which
    confirms the change; from then on they are hits, and float32 outputs are refused."""
    cache = EmbeddingCache(1 << 20, hidden_sizes=GOOD)
    embed_chunk([_image(1, 2)], CountingEncoder(hidden=GOOD), cache=cache)
    cache.discard(1)
    new = CountingEncoder(hidden=GOOD)
    model = lambda items: new(items).double()  # noqa: E731 - the changed model
    reqs = [_image(5, 3)]
    embed_chunk(reqs, model, cache=cache)
    assert cache.layout_changing("IMAGE")
    with caplog.at_level(logging.INFO, logger="mm_schedule.cache"):
        embed_chunk(reqs, model, cache=cache)
        assert cache.layout_changing("IMAGE")
        third = embed_chunk(reqs, model, cache=cache)
    assert new.calls == [[5], [5], [5]]  # not served before the third insert
    assert any("confirmed by 3 inserts" in r.message for r in caplog.records)
    assert not cache.layout_changing("IMAGE") and cache.layout_of("IMAGE") == (GOOD, torch.float64)
    fourth = embed_chunk(reqs, model, cache=cache)
    assert new.calls == [[5], [5], [5]] and torch.equal(fourth.embedding, third.embedding)
    with pytest.raises(CacheLayoutError, match="item hash 6"):
        embed_chunk([_image(6, 2)], CountingEncoder(hidden=GOOD), cache=cache)


def test_an_output_of_a_third_layout_is_refused_while_a_change_is_unconfirmed(backend):
    cache = EmbeddingCache(1 << 20)
    embed_chunk([_image(1, 2)], CountingEncoder(hidden=GOOD), cache=cache)
    cache.discard(1)
    embed_chunk([_image(2, 2)], _doubled, cache=cache)  # float64, hidden 16: unconfirmed
    assert cache.layout_changing("IMAGE")
    with pytest.raises(CacheLayoutError, match=r"item hash 3: .*hidden size 15"):
        embed_chunk([_image(3, 2)], CountingEncoder(hidden=BAD), cache=cache)
    assert 3 not in cache and cache.layout_changing("IMAGE")


@pytest.mark.parametrize("hit_is_the_bad_entry", [False, True], ids=["bad-entry-held", "bad-entry-hit"])
def test_a_merge_proof_holds_whether_or_not_the_bad_entry_was_its_own_hit(backend, caplog, hit_is_the_bad_entry):
    """A bad warm-up learns hidden 15; a step merged into input_embeds of 16 proves 16. When
    the bad entry is that step's own hit, the step evicts it first, so its inserts meet an
    empty modality: the proof still decides (no change left to confirm), and a later faulty
    packed output is refused instead of undoing it."""
    rng = random.Random(7)
    cache = EmbeddingCache(1 << 20)
    embed_chunk([_image(1, 2)], CountingEncoder(hidden=BAD), cache=cache)
    merged = [_request([1 if hit_is_the_bad_entry else 2], rng)]
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        assert torch.equal(_merged(merged, CountingEncoder(hidden=GOOD), cache), naive_reference(merged, GOOD))
    assert "IMAGE embeddings now have hidden size 16" in caplog.text
    assert cache.layout_of("IMAGE") == (GOOD, torch.float32) and not cache.layout_changing("IMAGE")
    good = _good_steps(rng, 100)
    assert torch.equal(embed_chunk(good[0], CountingEncoder(hidden=GOOD), cache=cache).embedding,
                       naive_reference(good[0], GOOD))
    with pytest.raises(EncoderOutputError, match=r"hidden size 15, expected 16"):
        embed_chunk([_image(60, 2)], CountingEncoder(hidden=BAD), cache=cache)
    for reqs in good[1:]:
        assert torch.equal(embed_chunk(reqs, CountingEncoder(hidden=GOOD), cache=cache).embedding,
                           naive_reference(reqs, GOOD))
    assert 60 not in cache and cache.layout_of("IMAGE") == (GOOD, torch.float32)


def test_a_merge_proof_confirms_an_unconfirmed_change_to_its_hidden_size(backend, caplog):
    """Hidden 15 learned and forgotten, then a packed step of 16 makes an unconfirmed change;
    a step merged into input_embeds of 16 proves it, so the faulty outputs of 15 that would
    have undone an unproven change are refused from then on."""
    cache = EmbeddingCache(1 << 20)
    embed_chunk([_image(1, 2)], CountingEncoder(hidden=BAD), cache=cache)
    cache.discard(1)
    embed_chunk([_image(2, 2)], CountingEncoder(hidden=GOOD), cache=cache)
    assert cache.layout_changing("IMAGE")
    merged = [_image(3, 2)]
    with caplog.at_level(logging.INFO, logger="mm_schedule.cache"):
        assert torch.equal(_merged(merged, CountingEncoder(hidden=GOOD), cache), naive_reference(merged, GOOD))
    assert "hidden size 16 confirmed by a step merged into input_embeds" in caplog.text
    assert not cache.layout_changing("IMAGE")
    with pytest.raises(EncoderOutputError, match=r"hidden size 15, expected 16"):
        embed_chunk([_image(4, 2)], CountingEncoder(hidden=BAD), cache=cache)
    assert 2 in cache and 3 in cache and 4 not in cache


def test_values_set_in_one_insert_block_confirm_a_change_once(backend):
    """EVS videos are cached one ``set`` at a time, inside ``one_insert``: however many
    videos one step brings, it is one insert, so a faulty step cannot confirm its own
    layout change; a later step's insert counts again."""
    from mm_schedule.cache import ForModality
    from mm_schedule.scheduler import update_cache

    cache = EmbeddingCache(1 << 20)
    cache.set(1, ForModality(torch.randn(3, GOOD), "VIDEO"))
    cache.free(1)
    update_cache(cache, insert=[(k, ForModality(torch.randn(3, GOOD).double(), "VIDEO")) for k in (2, 3, 4, 5)])
    assert cache.layout_changing("VIDEO")
    with cache.one_insert(), cache.one_insert():  # nested blocks are still one insert
        cache.set(6, ForModality(torch.randn(3, GOOD).double(), "VIDEO"))
    assert cache.layout_changing("VIDEO")
    cache.set(7, ForModality(torch.randn(3, GOOD).double(), "VIDEO"))
    assert not cache.layout_changing("VIDEO") and cache.layout_of("VIDEO") == (GOOD, torch.float64)
