"""Random batches through the scheduler against the naive reference."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, StepContext, embed_chunk, merge_chunk

from .helpers import HIDDEN, CountingEncoder, item_rows, naive_reference

ROW_BYTES = HIDDEN * 4


@st.composite
def prompts(draw):
    """A batch of prompts: each a list of items with sorted, disjoint spans; images may
    repeat across requests (same hash, same length); some items have several spans."""
    n_requests = draw(st.integers(1, 5))
    shared_images = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))  # lengths of reusable images
    out = []
    for r in range(n_requests):
        pos = draw(st.integers(0, 4))
        items = []
        for j in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["fresh", "shared", "multi"]))
            if kind == "multi":
                spans = []
                for _ in range(draw(st.integers(2, 3))):
                    length = draw(st.integers(1, 4))
                    spans.append((pos, pos + length - 1))
                    pos += length + draw(st.integers(1, 3))
                items.append(MMItem(hash=10_000 + 100 * r + j, offsets=spans, feature=torch.zeros(1)))
                continue
            if kind == "shared":
                k = draw(st.integers(0, len(shared_images) - 1))
                h, length = 500 + k, shared_images[k]
            else:
                h, length = 1_000 + 100 * r + j, draw(st.integers(1, 7))
            items.append(MMItem(hash=h, offsets=[(pos, pos + length - 1)], feature=torch.zeros(1)))
            pos += length + draw(st.integers(0, 3))
        out.append((items, pos + draw(st.integers(0, 3))))
    return out


def _chunks(prompt_batch, chunk_size):
    """Chunked prefill: every request advances by ``chunk_size`` tokens per step."""
    step = 0
    while True:
        reqs = []
        for items, length in prompt_batch:
            prefix = step * chunk_size
            reqs.append(RequestChunk(items=items, prefix=prefix, extend=max(0, min(chunk_size, length - prefix))))
        if all(r.extend == 0 for r in reqs):
            return
        yield reqs
        step += 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=prompts(),
    chunk_size=st.integers(1, 16),
    budget_rows=st.sampled_from([0, 1, 3, 8, 10_000]),
    as_list=st.booleans(),
    token_budget=st.sampled_from([None, 1, 5]),
    fused=st.booleans(),
)
def test_chunked_prefill_matches_reference(batch, chunk_size, budget_rows, as_list, token_budget, fused):
    cache = EmbeddingCache(budget_rows * ROW_BYTES)
    enc = CountingEncoder(as_list=as_list)
    ctx = StepContext(max_tokens_per_encoder_call=token_budget)
    for reqs in _chunks(batch, chunk_size):
        expected = naive_reference(reqs)
        if fused:
            total = sum(r.extend for r in reqs)
            embeds = torch.full((total, HIDDEN), float("nan"))
            merge_chunk(embeds, reqs, enc, cache=cache, context=ctx)
            got_rows, base = [], 0
            for r in reqs:
                for p in range(r.prefix, r.prefix + r.extend):
                    if any(s <= p <= e for it in r.items for s, e in it.offsets):
                        got_rows.append(embeds[base + p - r.prefix])
                base += r.extend
            got = torch.stack(got_rows) if got_rows else torch.empty(0, HIDDEN)
            # Every non-placeholder row keeps its poison.
            assert int((~torch.isnan(embeds[:, 0])).sum()) == got.shape[0]
        else:
            got = embed_chunk(reqs, enc, cache=cache, context=ctx).embedding
            if got is None:
                got = torch.empty(0, HIDDEN)
        assert torch.equal(got, expected)
        stats = cache.stats()
        assert stats.bytes <= cache.max_bytes


@settings(max_examples=80, deadline=None)
@given(batch=prompts(), chunk_size=st.integers(1, 16), as_list=st.booleans())
def test_one_step_encoder_calls_and_dedup(batch, chunk_size, as_list):
    """Without a cache: per-image misses of all requests go in one call, each distinct
    image once, first-seen order; each multi-span request gets its own call."""
    reqs = next(_chunks(batch, chunk_size), None)
    if reqs is None:
        return
    enc = CountingEncoder(as_list=as_list)
    result = embed_chunk(reqs, enc, cache=None)

    def overlaps(item, r):
        return any(e >= r.prefix and s < r.prefix + r.extend for s, e in item.offsets)

    per_image, full_calls = [], []
    for r in reqs:
        touching = [it for it in r.items if overlaps(it, r)]
        if not touching or r.extend <= 0:
            continue
        if all(len(it.offsets) == 1 for it in r.items):
            for it in touching:
                if (it.hash, item_rows(it)) not in per_image:
                    per_image.append((it.hash, item_rows(it)))
        else:
            full_calls.append([it.hash for it in r.items])
    expected_calls = ([[h for h, _ in per_image]] if per_image else []) + full_calls
    assert enc.calls == expected_calls
    assert result.report.encoder_calls == len(expected_calls)


def test_eviction_inside_one_step_keeps_assembly_intact():
    """A cache that holds one image, and that image is a hit of this step: the hit stays
    pinned, so both misses are rejected rather than evicting it; in the next step the
    misses evict the now unpinned entry. Every row is right throughout."""
    cache = EmbeddingCache(4 * ROW_BYTES)
    warm = [RequestChunk(items=[MMItem(hash=3, offsets=[(0, 3)], feature=torch.zeros(1))], prefix=0, extend=4)]
    embed_chunk(warm, CountingEncoder(), cache=cache)
    reqs = [
        RequestChunk(items=[MMItem(hash=1, offsets=[(0, 3)], feature=torch.zeros(1))], prefix=0, extend=4),
        RequestChunk(items=[MMItem(hash=2, offsets=[(1, 4)], feature=torch.zeros(1))], prefix=0, extend=6),
        warm[0],
    ]
    enc = CountingEncoder()
    got = embed_chunk(reqs, enc, cache=cache).embedding
    assert torch.equal(got, naive_reference(reqs))
    assert enc.calls == [[1, 2]]
    stats = cache.stats()
    assert stats.rejected == 2  # neither miss fits next to the pinned hit
    assert cache.contains(3) and stats.evictions == 0
    # Without the pin (next step), misses evict the LRU entry.
    got = embed_chunk(reqs[:2], CountingEncoder(), cache=cache).embedding
    assert torch.equal(got, naive_reference(reqs[:2]))
    assert cache.stats().evictions >= 1
