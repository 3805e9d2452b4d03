"""The reference document's worked example: spans (2,5),(9,14),(20,24), four windows."""

import pytest
import torch

import mm_schedule
from mm_schedule import (
    MMItem,
    RequestChunk,
    embed_chunk,
    get_embedding_and_mask,
    get_embedding_chunk,
)

from .helpers import CountingEncoder, naive_reference

SPANS = [(2, 5), (9, 14), (20, 24)]
WINDOWS = [(0, 8), (8, 8), (16, 8), (24, 6)]
EXPECTED_INDICES = [(0, 4), (4, 10), (10, 14), (14, 15)]


def test_get_embedding_chunk_indices():
    full = torch.arange(15 * 2, dtype=torch.float32).reshape(15, 2)
    for (prefix, extend), (lo, hi) in zip(WINDOWS, EXPECTED_INDICES):
        chunk, start, end = get_embedding_chunk(full, prefix, extend, SPANS)
        assert (start, end) == (lo, hi)
        assert torch.equal(chunk, full[lo:hi])
    chunk, start, end = get_embedding_chunk(full, 3, 0, SPANS)
    assert chunk.shape[0] == 0 and start == end


@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("multi_span", [False, True])
def test_four_windows_match_reference(as_list, multi_span):
    if multi_span:
        items = [MMItem(hash=77, offsets=list(SPANS), feature=torch.zeros(1))]
    else:
        items = [MMItem(hash=1000 + i, offsets=[s], feature=torch.zeros(1)) for i, s in enumerate(SPANS)]
    cache = mm_schedule.EmbeddingCache(1 << 20)
    enc = CountingEncoder(as_list=as_list)
    for (prefix, extend), (lo, hi) in zip(WINDOWS, EXPECTED_INDICES):
        req = RequestChunk(items=items, prefix=prefix, extend=extend)
        got = embed_chunk([req], enc, cache=cache).embedding
        assert got.shape[0] == hi - lo
        assert torch.equal(got, naive_reference([req]))
    # Single-span items are each encoded once, in the chunk where they first appear;
    # the multi-span item once, as a whole, then served from its combined-key entry.
    assert enc.items_encoded == (1 if multi_span else 3)


def test_sglang_signature_on_worked_example():
    mm_schedule.init_mm_embedding_cache(1 << 20)
    items = [MMItem(hash=1000 + i, offsets=[s], feature=torch.zeros(1), pad_value=5) for i, s in enumerate(SPANS)]
    enc = CountingEncoder()
    for prefix, extend in WINDOWS:
        ids = torch.arange(prefix, prefix + extend)
        ids = torch.where(
            torch.tensor([any(s <= p <= e for s, e in SPANS) for p in range(prefix, prefix + extend)]), 5, ids
        )
        emb, mask, ids_out = get_embedding_and_mask(
            enc, items, torch.tensor([5]), ids, [0, 3], [prefix], [extend], [list(SPANS)]
        )
        assert ids_out is ids
        assert emb.shape[0] == int(mask.sum())
        assert mask.shape == (extend, 1)
        assert torch.equal(emb, naive_reference([RequestChunk(items=items, prefix=prefix, extend=extend)]))
