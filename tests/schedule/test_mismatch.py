"""Encoder output whose row count differs from the placeholder count raises, and is never cached."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, embed_chunk
from mm_schedule.errors import EmbeddingLengthMismatch, EncoderOutputError

from .helpers import HIDDEN, image, truth


def _requests():
    return [
        RequestChunk(items=[image(11, 0, 4), image(12, 6, 3)], prefix=0, extend=10),
        RequestChunk(items=[image(13, 1, 5)], prefix=0, extend=8),
    ]


def _bad_encoder(kind, victim, delta):
    def enc(items):
        outs = []
        for it in items:
            rows = sum(e - s + 1 for s, e in it.offsets)
            if it.hash == victim and kind in ("per_item", "tensor"):
                rows += delta
            outs.append(truth(it.hash, rows))
        if kind == "list_len":
            return outs[:-1] if delta < 0 else [*outs, outs[0]]
        if kind == "per_item":
            return outs
        return torch.cat(outs)

    return enc


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["tensor", "per_item", "list_len"]),
    victim=st.sampled_from([11, 12, 13]),
    delta=st.sampled_from([-2, -1, 1, 3]),
)
def test_every_mismatch_shape_raises_and_caches_nothing(kind, victim, delta):
    if kind == "per_item" and delta < 0 and victim == 12:
        delta = -1  # item 12 has 3 rows; keep it non-empty
    cache = EmbeddingCache(1 << 20)
    with pytest.raises(EmbeddingLengthMismatch) as info:
        embed_chunk(_requests(), _bad_encoder(kind, victim, delta), cache=cache)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.received != err.expected
    if kind == "per_item":
        assert err.item_hash == victim
        assert err.request == (1 if victim == 13 else 0)
        assert err.received - err.expected == delta
        assert f"item hash {victim}" in str(err)
    if kind == "tensor":
        assert (err.expected, err.received) == (12, 12 + delta)
    if kind == "list_len":
        assert (err.expected, err.received) == (3, 3 + (1 if delta > 0 else -1))
    assert "expected" in str(err) and "got" in str(err)
    assert len(cache) == 0


def test_single_item_short_tensor_names_request_and_hash():
    req = RequestChunk(items=[MMItem(hash=42, offsets=[(3, 9)], feature=torch.zeros(1))], prefix=0, extend=12)
    with pytest.raises(EmbeddingLengthMismatch, match=r"request 0, item hash 42: .*expected 7, got 6"):
        embed_chunk([req], lambda items: torch.zeros(6, HIDDEN))


def test_multi_span_request_mismatch_raises():
    item = MMItem(hash=9, offsets=[(0, 2), (5, 6)], feature=torch.zeros(1))
    with pytest.raises(EmbeddingLengthMismatch, match="expected 5, got 4"):
        embed_chunk([RequestChunk(items=[item], prefix=0, extend=3)], lambda items: torch.zeros(4, HIDDEN))


@pytest.mark.parametrize("output", [None, "rows", torch.zeros(5)])
def test_wrong_output_type_is_typed_error(output):
    req = RequestChunk(items=[image(1, 0, 5)], prefix=0, extend=5)
    with pytest.raises(EncoderOutputError):
        embed_chunk([req], lambda items: output)


def test_hidden_size_disagreement_in_list():
    req = RequestChunk(items=[image(1, 0, 2), image(2, 3, 2)], prefix=0, extend=5)
    with pytest.raises(EncoderOutputError, match="hidden"):
        embed_chunk([req], lambda items: [torch.zeros(2, 4), torch.zeros(2, 6)])


def test_collided_cache_entry_is_discarded_and_reencoded(caplog):
    """A cached entry under the same hash but with another row count (a hash collision)
    is never used: it is dropped and the item encoded again."""
    cache = EmbeddingCache(1 << 20)
    cache.insert(5, torch.zeros(2, HIDDEN))
    req = RequestChunk(items=[image(5, 0, 4)], prefix=0, extend=4)
    calls = []

    def enc(items):
        calls.append(len(items))
        return truth(5, 4)

    out = embed_chunk([req], enc, cache=cache).embedding
    assert calls == [1]
    assert torch.equal(out, truth(5, 4))
    assert "Discarding cached multimodal embedding" in caplog.text
    assert cache.stats().discarded == 1
    assert cache.lookup(5).shape[0] == 4


def test_colliding_hashes_with_different_lengths_are_not_deduplicated():
    reqs = [
        RequestChunk(items=[image(7, 0, 3)], prefix=0, extend=3),
        RequestChunk(items=[image(7, 0, 5)], prefix=0, extend=5),
    ]
    calls = []

    def enc(items):
        calls.append([(it.hash, it.offsets[0]) for it in items])
        return torch.cat([truth(it.hash, it.offsets[0][1] + 1) for it in items])

    out = embed_chunk(reqs, enc, cache=EmbeddingCache(1 << 20)).embedding
    assert len(calls) == 1 and len(calls[0]) == 2
    assert torch.equal(out, torch.cat([truth(7, 3), truth(7, 5)]))
