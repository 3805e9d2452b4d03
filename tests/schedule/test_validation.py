"""Nothing bad is ever cached: every encoder output is checked before insertion, and a
cached entry that cannot serve a step is evicted, on both assembly backends."""

from __future__ import annotations

import pytest
import torch

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, embed_chunk, merge_chunk
from mm_schedule.errors import CachedEmbeddingError, EmbeddingLengthMismatch, EncoderOutputError

from .conftest import BACKENDS
from .helpers import HIDDEN, CountingEncoder, image, naive_reference, truth

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


def _requests():
    return [
        RequestChunk(items=[image(21, 0, 3), image(22, 5, 2)], prefix=0, extend=8),
        RequestChunk(items=[image(23, 1, 4)], prefix=0, extend=6),
    ]


def _poisoned_encoder(victim: int, poison):
    """Per-item outputs, all right except the victim's, which ``poison`` replaces."""

    def encode(items):
        outs = [truth(it.hash, it.offsets[0][1] - it.offsets[0][0] + 1) for it in items]
        return [poison(t) if it.hash == victim else t for it, t in zip(items, outs)]

    return encode


POISONS = {
    "int64": lambda t: t.long(),
    "bool": lambda t: t > 0,
    "int8": lambda t: t.to(torch.int8),
    "meta": lambda t: torch.empty(t.shape, device="meta"),
    "wide": lambda t: torch.cat([t, t[:, :1]], dim=1),
    "narrow": lambda t: t[:, :-1].contiguous(),
    "rank1": lambda t: t.reshape(-1),
    "not a tensor": lambda t: t.tolist(),
}


@pytest.mark.parametrize("poison", sorted(POISONS))
@pytest.mark.parametrize("victim", [21, 23])
@pytest.mark.parametrize("fused", [False, True])
def test_bad_output_raises_names_item_and_caches_nothing(backend, poison, victim, fused):
    cache = EmbeddingCache(1 << 20)
    reqs = _requests()
    embeds = torch.full((14, HIDDEN), float("nan"))
    with pytest.raises(EncoderOutputError) as info:
        if fused:
            merge_chunk(embeds, reqs, _poisoned_encoder(victim, POISONS[poison]), cache=cache)
        else:
            embed_chunk(reqs, _poisoned_encoder(victim, POISONS[poison]), cache=cache)
    assert isinstance(info.value, ValueError)
    assert f"item hash {victim}" in str(info.value)
    assert f"request {1 if victim == 23 else 0}" in str(info.value)
    assert len(cache) == 0
    assert torch.isnan(embeds).all()  # nothing written either
    # A later, correct step encodes every item again and gives exact rows.
    enc = CountingEncoder(as_list=True)
    got = embed_chunk(reqs, enc, cache=cache).embedding
    assert enc.items_encoded == 3
    assert torch.equal(got, naive_reference(reqs))


def test_a_faulty_output_beside_a_correct_hit_evicts_nothing(backend):
    cache = EmbeddingCache(1 << 20)
    embed_chunk([RequestChunk(items=[image(1, 0, 2)], prefix=0, extend=2)], CountingEncoder(), cache=cache)
    reqs = [RequestChunk(items=[image(1, 0, 2), image(2, 3, 2)], prefix=0, extend=5)]
    with pytest.raises(EncoderOutputError, match=r"item hash 2: .*hidden size 5, expected 8"):
        embed_chunk(reqs, lambda items: torch.zeros(2, 5), cache=cache)
    # The hit was cached by a step, as an IMAGE embedding of hidden size 8: the cache
    # vouches for it, so the output is the wrong side; nothing of the step is cached.
    assert cache.contains(1) and not cache.contains(2)
    assert cache.layout_of("IMAGE") == (HIDDEN, torch.float32)
    got = embed_chunk(reqs, CountingEncoder(), cache=cache).embedding
    assert torch.equal(got, naive_reference(reqs))


def test_fused_hidden_size_comes_from_input_embeds(backend):
    req = RequestChunk(items=[image(4, 0, 3)], prefix=0, extend=3)
    with pytest.raises(EncoderOutputError, match=r"request 0, item hash 4: .*hidden size 8, expected 6"):
        merge_chunk(torch.zeros(3, 6), [req], CountingEncoder())


def test_output_on_another_device_is_refused(backend):
    req = RequestChunk(items=[image(5, 0, 3)], prefix=0, extend=3)
    with pytest.raises(EncoderOutputError, match=r"item hash 5: .*is on cpu, the step runs on meta"):
        embed_chunk([req], CountingEncoder(), device=torch.device("meta"))


def test_a_failing_batch_means_no_batch_is_cached(backend):
    """Images encode fine, the audio encoder returns integers: the images are not cached
    either, because the step raised before inserting anything."""
    cache = EmbeddingCache(1 << 20)
    req = RequestChunk(items=[image(1, 0, 2), image(2, 3, 2, modality="AUDIO")], prefix=0, extend=5)
    encoders = {"IMAGE": CountingEncoder(), "AUDIO": lambda items: torch.ones(2, HIDDEN, dtype=torch.int32)}
    with pytest.raises(EncoderOutputError, match="item hash 2"):
        embed_chunk([req], encoders, cache=cache)
    assert len(cache) == 0


def test_entries_are_detached(backend):
    weight = torch.ones(HIDDEN, requires_grad=True)

    def encoder(items):
        return [truth(it.hash, 3) * weight for it in items]

    cache = EmbeddingCache(1 << 20)
    req = RequestChunk(items=[image(8, 0, 3)], prefix=0, extend=3)
    with torch.enable_grad():
        embed_chunk([req], encoder, cache=cache)
    entry = cache.lookup(8)
    assert entry.grad_fn is None and not entry.requires_grad
    assert torch.equal(entry, truth(8, 3))


BAD_ENTRIES = {
    "hidden": lambda rows: torch.zeros(rows, HIDDEN + 2),
    "integer": lambda rows: torch.zeros(rows, HIDDEN, dtype=torch.int64),
}


@pytest.mark.parametrize("bad", sorted(BAD_ENTRIES))
@pytest.mark.parametrize("fused", [False, True])
def test_cached_entry_that_cannot_serve_is_evicted(backend, bad, fused):
    """An entry put in through the SGLang-style ``set`` that does not fit the step is
    evicted and the item encoded again: in fused mode within the same step (input_embeds
    proves the entry unfit before anything is encoded); in packed mode a cached hidden size
    that disagrees with a fresh encoder output cannot be told wrong from right, but no
    layout vouches for the entry (it was set without a modality), so it is evicted and the
    step planned once more, encoding it with the rest; an entry of another unfit kind
    makes the step raise, and the next step encodes it."""
    cache = EmbeddingCache(1 << 20)
    cache.set(31, BAD_ENTRIES[bad](3))
    reqs = [RequestChunk(items=[image(30, 0, 2), image(31, 3, 3)], prefix=0, extend=6)]

    def step():
        enc = CountingEncoder()
        if fused:
            embeds = torch.full((6, HIDDEN), float("nan"))
            merge_chunk(embeds, reqs, enc, cache=cache)
            return embeds[[0, 1, 3, 4, 5]], enc
        return embed_chunk(reqs, enc, cache=cache).embedding, enc

    if fused or bad == "hidden":
        got, enc = step()
        assert cache.stats().discarded == 1 and torch.equal(cache.lookup(31), truth(31, 3))
        # Packed: the first plan's encoder call ([30]) met the unfit hit; the second encoded both.
        assert enc.calls == ([[30, 31]] if fused else [[30], [30, 31]])
    else:
        with pytest.raises(CachedEmbeddingError, match=r"item hash 31: .*evicted"):
            step()
        assert not cache.contains(31) and cache.stats().discarded == 1
        got, enc = step()
        assert enc.calls == [[30, 31]]
    assert torch.equal(got, naive_reference(reqs))


def test_row_count_mismatch_is_never_cached(backend):
    cache = EmbeddingCache(1 << 20)
    req = RequestChunk(items=[MMItem(hash=3, offsets=[(0, 4)], feature=torch.zeros(1))], prefix=0, extend=5)
    with pytest.raises(EmbeddingLengthMismatch, match=r"item hash 3: .*expected 5, got 4"):
        embed_chunk([req], lambda items: torch.zeros(4, HIDDEN), cache=cache)
    assert len(cache) == 0
