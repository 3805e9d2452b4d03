"""Soak: random chunked prefill through a cache that evicts every step, with faults
injected into the encoder, checked step by step against the naive reference.

Each step either succeeds with exactly the reference rows, or (a fault was injected)
raises a typed error having cached nothing and written nothing; the same step then
succeeds with a healthy encoder. After every step every cache entry holds exactly the
rows its key stands for, and the cache stays within its budget."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule import (
    EmbeddingCache,
    MMItem,
    RequestChunk,
    StepContext,
    combine_hashes,
    embed_chunk,
    merge_chunk,
    spare,
)
from mm_schedule.errors import EmbeddingLengthMismatch, EncoderOutputError
from mm_schedule.kernels.segment_copy import host_copy

from .conftest import BACKENDS
from .helpers import HIDDEN, item_rows, naive_reference, truth

ROW_BYTES = HIDDEN * 4
FAULTS = ("integer", "short", "meta", "crash", "hidden")


class InjectedCrash(RuntimeError):
    pass


def build_batch(rng: random.Random):
    """Requests with images (some shared between requests) and multi-span videos, their
    item lists sometimes shuffled out of position order."""
    shared = [(500 + k, rng.randint(1, 6)) for k in range(3)]
    batch = []
    for r in range(rng.randint(1, 5)):
        pos, items = rng.randint(0, 3), []
        for j in range(rng.randint(0, 4)):
            kind = rng.choice(["image", "shared", "video"])
            if kind == "video":
                spans = []
                for _ in range(rng.randint(2, 3)):
                    length = rng.randint(1, 4)
                    spans.append((pos, pos + length - 1))
                    pos += length + rng.randint(1, 3)
                items.append(MMItem(modality="VIDEO", hash=9_000 + 100 * r + j, offsets=spans, feature=torch.zeros(1)))
                continue
            h, length = rng.choice(shared) if kind == "shared" else (1_000 + 100 * r + j, rng.randint(1, 7))
            items.append(MMItem(hash=h, offsets=[(pos, pos + length - 1)], feature=torch.zeros(1)))
            pos += length + rng.randint(0, 3)
        if rng.random() < 0.3:
            rng.shuffle(items)
        batch.append((items, pos + rng.randint(0, 3)))
    return batch


def expected_entries(batch) -> dict[int, torch.Tensor]:
    """What each possible cache key must hold: an item's rows, or for a request whose
    videos are encoded together, its videos' rows in item order."""
    want = {}
    for items, _ in batch:
        for it in items:
            want[it.hash] = truth(it.hash, item_rows(it))
        videos = [it for it in items if it.modality == "VIDEO"]
        if videos:
            want[combine_hashes([it.hash for it in videos])] = torch.cat([want[it.hash] for it in videos])
    return want


class FaultyEncoder:
    """The right rows, except when told to fail this call in a given way."""

    def __init__(self, rng: random.Random, rate: float):
        self.rng, self.rate, self.injected = rng, rate, None

    def __call__(self, items):
        outs = [truth(it.hash, item_rows(it)) for it in items]
        fault = self.rng.choice(FAULTS) if self.rng.random() < self.rate else None
        if fault == "hidden" and len(outs) < 2:
            fault = None  # a lone output of another width is indistinguishable in packed mode
        self.injected = self.injected or fault
        if fault == "crash":
            raise InjectedCrash("encoder failed")
        if fault == "integer":
            outs = [o.long() for o in outs]
        elif fault == "short":
            outs[-1] = outs[-1][:-1]
        elif fault == "meta":
            outs[0] = torch.empty(outs[0].shape, device="meta")
        elif fault == "hidden":
            outs[-1] = torch.cat([outs[-1], outs[-1][:, :1]], dim=1)
        return outs


def run_chunk(reqs, encoder, cache, ctx, fused):
    if not fused:
        got = embed_chunk(reqs, encoder, cache=cache, context=ctx).embedding
        return torch.empty(0, HIDDEN) if got is None else got, None
    embeds = torch.full((sum(r.extend for r in reqs), HIDDEN), float("nan"))
    try:
        merge_chunk(embeds, reqs, encoder, cache=cache, context=ctx)
    except Exception:
        assert torch.isnan(embeds).all(), "a failed fused step wrote rows"
        raise
    rows, base = [], 0
    for r in reqs:
        for p in range(r.prefix, r.prefix + r.extend):
            if any(s <= p <= e for it in r.items for s, e in it.offsets):
                rows.append(embeds[base + p - r.prefix])
        base += r.extend
    got = torch.stack(rows) if rows else torch.empty(0, HIDDEN)
    assert int((~torch.isnan(embeds[:, 0])).sum()) == got.shape[0], "a text row was overwritten"
    return got, embeds


@pytest.fixture
def stores(request, backend, monkeypatch):
    """``streaming stores`` (torch backend): every CPU copy the C helper makes is streamed,
    and every packed result is taken from the spare and written by it."""
    if request.param == "streaming stores":
        if host_copy._stream_copy is None:
            pytest.skip("the C helper is not built in this install")
        monkeypatch.setattr(host_copy, "STREAM_MIN_BYTES", 0)
        monkeypatch.setattr(spare, "MIN_BYTES", 0)
    return request.param


@pytest.mark.parametrize("backend, stores", [(b, "ordinary stores") for b in BACKENDS] +
                         [("torch", "streaming stores")], indirect=True)
@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), fused=st.booleans(), budget_rows=st.sampled_from([1, 4, 12]),
       token_budget=st.sampled_from([None, 4]))
def test_soak_against_reference(backend, stores, seed, fused, budget_rows, token_budget):
    rng = random.Random(seed)
    batch = build_batch(rng)
    want_entries = expected_entries(batch)
    cache = EmbeddingCache(budget_rows * ROW_BYTES)
    ctx = StepContext(max_tokens_per_encoder_call=token_budget)
    prefix = 0
    longest = max(length for _, length in batch)
    while prefix < longest:
        chunk = rng.randint(1, 12)
        reqs = [RequestChunk(items=list(items), prefix=prefix, extend=max(0, min(chunk, length - prefix)))
                for items, length in batch]
        want = naive_reference(reqs)
        encoder = FaultyEncoder(rng, rate=0.25)
        try:
            got, _ = run_chunk(reqs, encoder, cache, ctx, fused)
        except (EncoderOutputError, EmbeddingLengthMismatch, InjectedCrash) as exc:
            assert encoder.injected, f"raised without an injected fault: {exc!r}"
            got, _ = run_chunk(reqs, FaultyEncoder(rng, rate=0.0), cache, ctx, fused)
        else:
            assert not encoder.injected, f"fault {encoder.injected} went unnoticed"
        assert torch.equal(got, want)
        check_cache(cache, want_entries)
        prefix += chunk


def check_cache(cache: EmbeddingCache, want: dict[int, torch.Tensor]) -> None:
    stats = cache.stats()
    assert stats.bytes <= cache.max_bytes
    held = 0
    for key, rows in want.items():
        if cache.contains(key):
            entry = cache.lookup(key)
            assert torch.equal(entry, rows), f"cache entry {key} holds the wrong rows"
            held += 1
    assert held == len(cache)
