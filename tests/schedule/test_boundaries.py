"""No silent wrong answer at the API's edges: hash types, iterables, fused row layout,
placeholder counts, placeholder id widths, acknowledgements, reused encoder buffers."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings
from dataclasses import dataclass, field

import pytest
import torch

import mm_schedule
from mm_schedule import (
    EmbeddingCache,
    Encoder,
    MMItem,
    RequestChunk,
    StepContext,
    acknowledge_deferred_ipc,
    embed_chunk,
    get_embedding_and_mask,
    item_key,
    merge_chunk,
)
from mm_schedule.errors import (
    CachedEmbeddingError,
    EmbeddingLengthMismatch,
    EncoderOutputError,
    InvalidItemError,
    KernelInputError,
)

from .conftest import BACKENDS
from .helpers import HIDDEN, CountingEncoder, image, naive_reference, truth

# Every test that runs a step runs it on both assembly backends.
STEP = pytest.mark.parametrize("backend", BACKENDS, indirect=True)

# -- item hashes ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.2, 1.7, True, None, object(), [1]])
@STEP
def test_unsupported_hashes_are_refused(backend, bad):
    req = RequestChunk(items=[MMItem(hash=bad, offsets=[(0, 2)], feature=torch.zeros(1))], prefix=0, extend=3)
    with pytest.raises(InvalidItemError, match="request 0"):
        embed_chunk([req], CountingEncoder())


class IndexLike:
    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def test_int_like_hashes_key_by_their_value():
    assert item_key(IndexLike(12345), 0) == 12345
    assert item_key(-7, 0) == -7 and item_key(2**70, 0) == 2**70


def test_bytes_and_str_hashes_are_stable_across_processes():
    code = "from mm_schedule import item_key; print(item_key(b'pixels', 0), item_key('pixels', 0))"
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1
    a, b = (int(v) for v in outs.pop().split())
    assert a == b == item_key(b"pixels", 0) != item_key(b"pixels!", 0)


@STEP
def test_str_hashed_items_hit_the_cache(backend):
    cache = EmbeddingCache(1 << 20)
    enc = CountingEncoder(as_list=True)

    def items():
        return [MMItem(hash="image-a", offsets=[(0, 2)], feature=torch.zeros(1))]

    first = embed_chunk([RequestChunk(items=items(), prefix=0, extend=3)], lambda its: [truth(1, 3)], cache=cache)
    again = embed_chunk([RequestChunk(items=items(), prefix=0, extend=3)], enc, cache=cache)
    assert enc.calls == [] and torch.equal(first.embedding, again.embedding)


# -- iterables ----------------------------------------------------------------------------


@STEP
def test_generators_lose_no_rows(backend):
    def reqs():
        yield RequestChunk(items=(image(h, 4 * i, 3) for i, h in enumerate((1, 2))), prefix=0, extend=9)
        yield RequestChunk(items=iter([image(3, 1, 2)]), prefix=0, extend=4, offsets=iter([(1, 2)]))

    want = naive_reference(list(reqs()))
    assert want.shape[0] == 8
    assert torch.equal(embed_chunk(reqs(), CountingEncoder()).embedding, want)
    embeds = torch.full((13, HIDDEN), float("nan"))
    merge_chunk(embeds, reqs(), CountingEncoder())
    assert torch.equal(embeds[[0, 1, 2, 4, 5, 6, 10, 11]], want)


@STEP
def test_compat_takes_items_as_a_generator(backend):
    mm_schedule.init_mm_embedding_cache(1 << 20)
    items = [MMItem(hash=40 + i, offsets=[(2 * i, 2 * i + 1)], feature=torch.zeros(1), pad_value=9) for i in range(2)]
    ids = torch.full((4,), 9)
    emb, mask, _ = get_embedding_and_mask(CountingEncoder(), iter(items), torch.tensor([9]), ids, [0, 2], [0],
                                          [4], [[(0, 1), (2, 3)]])
    assert torch.equal(emb, naive_reference([RequestChunk(items=items, prefix=0, extend=4)]))
    assert mask.all()


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ((3, 9), r"request 0, item hash 5: offsets \(3, 9\) is one bare \(start, end\) pair; pass a list of spans: \[\(3, 9\)\]"),
        ([3, 9], r"request 0, item hash 5: offsets \(3, 9\) is one bare"),
        ([(3,)], r"request 0, item hash 5: span \(3,\) is not an \(start, end\) pair"),
        ([(3.0, 9.0)], r"request 0, item hash 5: span \(3.0, 9.0\) is not"),
        (iter([(3, 9)]), r"request 0, item hash 5: offsets must be a list of \(start, end\) spans, got list_iterator"),
        ("3-9", r"request 0, item hash 5: offsets must be a list"),
    ],
)
@STEP
def test_offset_shape_mistakes_name_request_and_item(backend, offsets, message):
    req = RequestChunk(items=[MMItem(hash=5, offsets=offsets, feature=torch.zeros(1))], prefix=0, extend=12)
    with pytest.raises(InvalidItemError, match=message):
        embed_chunk([req], CountingEncoder())


@STEP
def test_requests_must_be_request_chunks(backend):
    with pytest.raises(InvalidItemError, match="request 1: expected a RequestChunk, got dict"):
        embed_chunk([RequestChunk(items=[], prefix=0, extend=1), {"items": []}], CountingEncoder())
    with pytest.raises(InvalidItemError, match="iterable of RequestChunk"):
        embed_chunk(RequestChunk(items=[], prefix=0, extend=1), CountingEncoder())


# -- fused layout -----------------------------------------------------------------------------


@STEP
def test_fused_requests_must_cover_input_embeds(backend):
    """A text-only request left out of the list would have its rows overwritten."""
    reqs = [RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=4)]
    embeds = torch.full((10, HIDDEN), float("nan"))
    with pytest.raises(InvalidItemError, match="input_embeds has 10 rows but the requests' extend lengths add up to 4"):
        merge_chunk(embeds, reqs, CountingEncoder())
    assert torch.isnan(embeds).all()


@pytest.mark.parametrize(
    ("rows", "message"),
    [([0, 2], "requests 0 and 1 claim the same rows"), ([0, 8], r"request 1: rows \[8, 12\) lie outside")],
)
@STEP
def test_fused_explicit_row_offsets_are_checked(backend, rows, message):
    reqs = [RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=4, row_offset=rows[0]),
            RequestChunk(items=[image(2, 0, 3)], prefix=0, extend=4, row_offset=rows[1])]
    with pytest.raises(InvalidItemError, match=message):
        merge_chunk(torch.zeros(10, HIDDEN), reqs, CountingEncoder())


@STEP
def test_batched_input_embeds_is_written_in_place(backend):
    reqs = [RequestChunk(items=[image(1, 1, 3)], prefix=0, extend=6)]
    embeds = torch.full((1, 6, HIDDEN), float("nan"))
    result = merge_chunk(embeds, reqs, CountingEncoder())
    assert result.embedding is embeds
    assert torch.equal(embeds[0, 1:4], truth(1, 3)) and torch.isnan(embeds[0, [0, 4, 5]]).all()
    with pytest.raises(KernelInputError, match="contiguous"):
        merge_chunk(torch.zeros(6, 2 * HIDDEN)[:, ::2], reqs, CountingEncoder())


# -- results and reports --------------------------------------------------------------------


@STEP
def test_no_rows_means_embedding_is_none(backend):
    reqs = [RequestChunk(items=[image(1, 10, 3)], prefix=0, extend=5)]
    assert embed_chunk(reqs, CountingEncoder()).embedding is None
    embeds = torch.zeros(5, HIDDEN)
    assert merge_chunk(embeds, reqs, CountingEncoder()).embedding is None


@STEP
def test_cache_hits_count_embeddings_and_hit_uses_count_requests(backend):
    cache = EmbeddingCache(1 << 20)
    reqs = [RequestChunk(items=[image(7, 0, 2)], prefix=0, extend=2) for _ in range(3)]
    first = embed_chunk(reqs, CountingEncoder(), cache=cache).report
    again = embed_chunk(reqs, CountingEncoder(), cache=cache).report
    assert (first.items_encoded, first.cache_hits, first.hit_uses) == (1, 0, 0)
    assert (again.items_encoded, again.cache_hits, again.hit_uses) == (0, 1, 3)


# -- SGLang-compatible API --------------------------------------------------------------------


def _compat_step(ids, pads=(9,), encoder=None):
    items = [MMItem(hash=60, offsets=[(1, 3)], feature=torch.zeros(1), pad_value=pads[0])]
    return get_embedding_and_mask(encoder or CountingEncoder(), items, torch.tensor(pads), ids, [0, 1], [0], [5],
                                  [[(1, 3)]])


@STEP
def test_compat_placeholder_count_must_match_rows(backend):
    """Checked before the encoder runs: nothing is encoded or cached for such a step."""
    mm_schedule.init_mm_embedding_cache(1 << 20)
    enc = CountingEncoder()
    with pytest.raises(EmbeddingLengthMismatch, match="expected 4, got 3"):
        _compat_step(torch.tensor([9, 9, 9, 9, 0]), encoder=enc)
    assert enc.calls == [] and len(mm_schedule.embedding_cache) == 0
    emb, mask, _ = _compat_step(torch.tensor([0, 9, 9, 9, 0]), encoder=enc)
    assert emb.shape[0] == int(mask.sum()) == 3 and enc.calls == [[60]]


@STEP
def test_compat_warns_once_without_a_cache(backend, monkeypatch):
    from mm_schedule import sglang_compat

    monkeypatch.setattr(sglang_compat, "embedding_cache", None)
    monkeypatch.setattr(sglang_compat, "_warned_uncached", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _compat_step(torch.tensor([0, 9, 9, 9, 0]))
        _compat_step(torch.tensor([0, 9, 9, 9, 0]))
    messages = [str(w.message) for w in seen if "nothing is cached" in str(w.message)]
    assert len(messages) == 1


# -- acknowledgements and buffers ---------------------------------------------------------------


@dataclass(eq=False)
class AckItem(MMItem):
    acks: list = field(default_factory=list)

    def acknowledge_deferred_cuda_ipc_feature(self, consumer_count=1):
        self.acks.append(consumer_count)


@STEP
def test_hits_are_acknowledged_once_per_successful_step(backend):
    cache = EmbeddingCache(1 << 20)
    ctx = StepContext(on_cache_hit=acknowledge_deferred_ipc)
    hit = AckItem(hash=70, offsets=[(0, 1)], feature=torch.zeros(1))
    embed_chunk([RequestChunk(items=[hit], prefix=0, extend=2)], CountingEncoder(), cache=cache, context=ctx)
    assert hit.acks == []
    miss = MMItem(hash=71, offsets=[(3, 4)], feature=torch.zeros(1))
    req = RequestChunk(items=[hit, miss], prefix=0, extend=5)

    def failing(items):
        raise RuntimeError("encoder crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        embed_chunk([req], failing, cache=cache, context=ctx)
    assert hit.acks == []  # the step failed: it will be retried and acknowledge then
    embed_chunk([req], CountingEncoder(), cache=cache, context=ctx)
    assert hit.acks == [1]


@STEP
def test_hits_keep_their_transport_leases_by_default(backend):
    """Without a hook nothing is acknowledged, on the explicit API and the drop-in alike,
    a multi-span item's hit included: a released slot could be reused by the sender while
    a later chunk still has to encode the item again (its entry evicted meanwhile)."""
    cache = EmbeddingCache(1 << 20)
    image_item = AckItem(hash=72, offsets=[(0, 1)], feature=torch.zeros(1))
    video = AckItem(hash=73, offsets=[(3, 4), (6, 7)], feature=torch.zeros(1), modality="VIDEO")
    req = RequestChunk(items=[image_item, video], prefix=0, extend=8)
    for _ in range(2):
        embed_chunk([req], CountingEncoder(), cache=cache)
    assert image_item.acks == [] and video.acks == []
    mm_schedule.init_mm_embedding_cache(1 << 20)
    mm_schedule.set_step_context(StepContext())
    ids = torch.tensor([900, 900, 5, 901, 901, 5, 901, 901])
    for _ in range(2):
        for items, pad in (([image_item], 900), ([video], 901)):
            rows, mask, _ = mm_schedule.get_embedding_and_mask(
                CountingEncoder(), items, torch.tensor([pad]), ids, [0, 1], [0], [8], [list(items[0].offsets)])
            assert rows.shape[0] == int(mask.sum())
    assert image_item.acks == [] and video.acks == []


@STEP
@pytest.mark.parametrize("copy", [False, True])
def test_an_encoder_reusing_its_output_buffer_never_leaves_a_wrong_entry(backend, copy, caplog):
    """Without ``copy_outputs`` the first output is cached by reference and the second
    call overwrites it: the cache notices the shared storage, evicts the overwritten
    entry (never serves it), copies the new output, says so once, and copies every
    later output of that buffer. With ``copy_outputs`` nothing is ever overwritten."""
    buffer = torch.zeros(3, HIDDEN)

    def reusing(items):
        buffer.copy_(truth(items[0].hash, 3))
        return [buffer]

    cache = EmbeddingCache(1 << 20)
    encoder = Encoder(reusing, copy_outputs=copy)
    for h in (80, 81, 82, 83):
        got = embed_chunk([RequestChunk(items=[image(h, 0, 3)], prefix=0, extend=3)], encoder, cache=cache)
        assert torch.equal(got.embedding, truth(h, 3))
    survivors = [80] if copy else []
    for h in [*survivors, 81, 82, 83]:
        assert torch.equal(cache.lookup(h), truth(h, 3)), h
    assert (cache.lookup(80) is None) is not copy
    warned = [r for r in caplog.records if "shares its storage" in r.getMessage()]
    assert len(warned) == (0 if copy else 1)
    # A hit of this very step in the reused buffer: its rows are gone, the step says so.
    if not copy:
        cache = EmbeddingCache(1 << 20)
        embed_chunk([RequestChunk(items=[image(90, 0, 3)], prefix=0, extend=3)], encoder, cache=cache)
        with pytest.raises(CachedEmbeddingError, match=r"item hash 90.*reuses its output buffer"):
            embed_chunk([RequestChunk(items=[image(90, 0, 3), image(91, 3, 3)], prefix=0, extend=6)],
                        encoder, cache=cache)
        assert cache.lookup(90) is None and cache.lookup(91) is None


@STEP
@pytest.mark.parametrize("buffers", [1, 2], ids=["one-buffer", "ring-of-two"])
@pytest.mark.parametrize("fused", [False, True], ids=["packed", "fused"])
def test_a_step_of_several_encoder_calls_keeps_every_calls_rows_from_a_reusing_encoder(backend, buffers, fused):
    """A token budget cuts the step's misses into several encoder calls; an encoder that
    writes every call into one buffer (or cycles through two) would leave every call's
    rows as the last call's. The step copies what is still intact, runs the overwritten
    calls again and copies every later call as it returns: exact rows, exact entries."""
    ring = [torch.zeros(8, HIDDEN) for _ in range(buffers)]
    calls = []

    def reusing(items):
        out = ring[len(calls) % buffers]
        calls.append([it.hash for it in items])
        row = 0
        for it in items:
            n = sum(e - s + 1 for s, e in it.offsets)
            out[row : row + n] = truth(it.hash, n)
            row += n
        return out[:row]

    rng = random.Random()
    lengths = [rng.randint(1, 4) for _ in range(rng.randint(4, 7))]
    reqs = [RequestChunk(items=[image(200 + k, 0, n)], prefix=0, extend=n) for k, n in enumerate(lengths)]
    cache = EmbeddingCache(1 << 20)
    context = StepContext(max_tokens_per_encoder_call=4)
    if fused:
        embeds = torch.full((sum(lengths), HIDDEN), float("nan"))
        merge_chunk(embeds, reqs, reusing, cache=cache, context=context)
        got = embeds
    else:
        got = embed_chunk(reqs, reusing, cache=cache, context=context).embedding
    assert torch.equal(got, naive_reference(reqs))
    for k, n in enumerate(lengths):
        assert torch.equal(cache.lookup(200 + k), truth(200 + k, n)), k


@STEP
def test_a_failed_step_leaves_no_entry_its_reusing_encoder_overwrote(backend):
    """Item 1 is cached by reference in the buffer an IMAGE encoder reuses; a step encodes
    item 2 into it and then fails validation (its AUDIO output is integer): item 1's entry
    lost its rows although nothing was inserted, so it is evicted, never served."""
    buffer = torch.empty(3, HIDDEN)

    def image_encoder(items):
        buffer.copy_(truth(items[0].hash, 3))
        return buffer

    encoders = {"IMAGE": image_encoder, "AUDIO": lambda items: [torch.ones(3, HIDDEN, dtype=torch.int32)] * len(items)}
    audio = MMItem(modality="AUDIO", hash=3, offsets=[(3, 5)], feature=torch.zeros(1))
    cache = EmbeddingCache(1 << 20)
    embed_chunk([RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)], encoders, cache=cache)
    with pytest.raises(EncoderOutputError):
        embed_chunk([RequestChunk(items=[image(2, 0, 3), audio], prefix=0, extend=6)], encoders, cache=cache)
    assert cache.lookup(1) is None and len(cache) == 0
    got = embed_chunk([RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)], encoders, cache=cache)
    assert torch.equal(got.embedding, truth(1, 3))


@STEP
def test_an_encoder_call_that_raises_after_an_earlier_one_overwrote_an_entry(backend):
    """A step of two calls: the first writes into the buffer item 1 is cached in, the second
    raises. Item 1's entry lost its rows before anything could be checked: evicted."""
    buffers = {}

    def encoder(items):
        if any(it.hash == 99 for it in items):
            raise RuntimeError("encoder failed")
        n = sum(e - s + 1 for it in items for s, e in it.offsets)
        buffer = buffers.setdefault(n, torch.empty(n, HIDDEN))
        buffer.copy_(torch.cat([truth(it.hash, e - s + 1) for it in items for s, e in it.offsets]))
        return buffer

    cache = EmbeddingCache(1 << 20)
    context = StepContext(max_tokens_per_encoder_call=3)
    embed_chunk([RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)], encoder, cache=cache, context=context)
    with pytest.raises(RuntimeError, match="encoder failed"):
        embed_chunk([RequestChunk(items=[image(2, 0, 3), image(99, 3, 3)], prefix=0, extend=6)], encoder,
                    cache=cache, context=context)
    assert cache.lookup(1) is None
    got = embed_chunk([RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)], encoder, cache=cache,
                      context=context)
    assert torch.equal(got.embedding, truth(1, 3))


@STEP
def test_copies_of_a_several_call_step_do_not_hide_an_entry_its_encoder_overwrote(backend):
    """Item 1 cached in buffer 0 of a ring of three; a step of four calls lands in buffers
    1, 2, 0, 1: the fourth overlaps the first, so outputs are copied from then on, and the
    third call's write over item 1's entry must still evict it."""
    ring = [torch.empty(3, HIDDEN) for _ in range(3)]
    calls = []

    def encoder(items):
        buffer = ring[len(calls) % 3]
        calls.append(items[0].hash)
        buffer.copy_(truth(items[0].hash, 3))
        return buffer

    cache = EmbeddingCache(1 << 20)
    context = StepContext(max_tokens_per_encoder_call=3)
    embed_chunk([RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)], encoder, cache=cache, context=context)
    reqs = [RequestChunk(items=[image(10 + k, 3 * k, 3) for k in range(4)], prefix=0, extend=12)]
    got = embed_chunk(reqs, encoder, cache=cache, context=context)
    assert torch.equal(got.embedding, naive_reference(reqs))
    assert cache.lookup(1) is None
    got = embed_chunk([RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)], encoder, cache=cache,
                      context=context)
    assert torch.equal(got.embedding, truth(1, 3))
    for k in range(4):
        assert torch.equal(cache.lookup(10 + k), truth(10 + k, 3))


@STEP
def test_step_context_without_ack_hook(backend):
    cache = EmbeddingCache(1 << 20)
    item = AckItem(hash=90, offsets=[(0, 1)], feature=torch.zeros(1))
    ctx = StepContext(on_cache_hit=None)
    for _ in range(2):
        embed_chunk([RequestChunk(items=[item], prefix=0, extend=2)], CountingEncoder(), cache=cache, context=ctx)
    assert item.acks == []


@STEP
def test_fused_mixed_row_offsets_follow_the_planner(backend):
    """A request without a row offset starts after all earlier requests' extend tokens,
    whatever offsets those were given; the check and the planner agree on it."""
    def reqs(first_row):
        return [RequestChunk(items=[image(1, 0, 2)], prefix=0, extend=3, row_offset=first_row),
                RequestChunk(items=[image(2, 0, 2)], prefix=0, extend=2)]

    embeds = torch.full((8, HIDDEN), float("nan"))
    merge_chunk(embeds, reqs(5), CountingEncoder())  # request 1 takes rows [3, 5)
    assert torch.equal(embeds[[5, 6]], truth(1, 2)) and torch.equal(embeds[[3, 4]], truth(2, 2))
    assert torch.isnan(embeds[[0, 1, 2, 7]]).all()
    with pytest.raises(InvalidItemError, match="requests 0 and 1 claim the same rows"):
        merge_chunk(torch.zeros(8, HIDDEN), reqs(1), CountingEncoder())


@STEP
def test_device_may_be_named_by_string(backend):
    """``device="cpu"`` (or ``"cuda"`` for the current GPU) means what the tensors report."""
    reqs = [RequestChunk(items=[image(1, 0, 3)], prefix=0, extend=3)]
    assert torch.equal(embed_chunk(reqs, CountingEncoder(), device="cpu").embedding, truth(1, 3))
