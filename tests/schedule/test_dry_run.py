"""A step whose tensors all live on ``meta`` is a dry run: no data exists there, so any
host sync (``.item()``, ``.tolist()``, ``bool(tensor)``, a copy to the host) fails. The
drop-in, ``embed_chunk`` and ``merge_chunk`` run through it: a new sync fails here."""

from __future__ import annotations

import pytest
import torch

import mm_schedule
from mm_schedule import EmbeddingCache, MMItem, RequestChunk, StepContext, embed_chunk, merge_chunk
from mm_schedule.errors import EmbeddingLengthMismatch, EncoderOutputError
from mm_schedule.placeholders import checked_mask, placeholder_mask

from .conftest import BACKENDS

STEP = pytest.mark.parametrize("backend", BACKENDS, indirect=True)
META = torch.device("meta")
HIDDEN = 8


def _items(n: int, pad: int = 7) -> list[MMItem]:
    return [MMItem(modality="IMAGE", hash=1000 + i, offsets=[(4 * i + 1, 4 * i + 3)], pad_value=pad,
                   feature=torch.empty(2, device=META)) for i in range(n)]


class MetaEncoder:
    def __init__(self):
        self.calls = 0

    def __call__(self, items):
        self.calls += 1
        return [torch.empty(sum(e - s + 1 for s, e in it.offsets), HIDDEN, device=META) for it in items]


@STEP
@pytest.mark.parametrize("n", [1, 40, 300])  # 300 placeholder ids: the sorted-search membership path
def test_every_entry_point_runs_on_meta(backend, n):
    items = _items(n)
    tokens = 4 * n + 1
    encoder = MetaEncoder()
    cache = EmbeddingCache(1 << 30)
    reqs = [RequestChunk(items=items, prefix=0, extend=tokens)]
    for step in range(2):  # misses, then hits
        packed = embed_chunk(reqs, encoder, cache=cache, device=META)
        assert packed.embedding.is_meta and packed.embedding.shape == (3 * n, HIDDEN)
        assert packed.report.cache_hits == (n if step else 0)
        embeds = torch.empty(tokens, HIDDEN, device=META)
        fused = merge_chunk(embeds, reqs, encoder, cache=cache)
        assert fused.embedding is embeds and fused.report.cache_hits == n
    assert encoder.calls == 1

    mm_schedule.init_mm_embedding_cache(1 << 30)
    mm_schedule.set_step_context(StepContext(on_cache_hit=None))
    try:
        ids = torch.empty(tokens, dtype=torch.int64, device=META)
        pads = torch.tensor([it.pad_value + i for i, it in enumerate(items)], device=META)
        for _ in range(2):
            rows, mask, out_ids = mm_schedule.get_embedding_and_mask(
                encoder, items, pads, ids, [0, n], [0], [tokens], [[it.offsets[0] for it in items]])
            assert rows.is_meta and rows.shape == (3 * n, HIDDEN)
            assert mask.is_meta and mask.shape == (tokens, 1) and out_ids is ids
    finally:
        mm_schedule.set_step_context(StepContext())
        mm_schedule.init_mm_embedding_cache(0)


@STEP
def test_meta_outputs_are_refused_where_the_step_has_data(backend):
    with pytest.raises(EncoderOutputError, match=r"item hash 1000: .*meta tensor"):
        embed_chunk([RequestChunk(items=_items(1), prefix=0, extend=5)], MetaEncoder(), device="cpu")
    with pytest.raises(EncoderOutputError, match="meta tensor"):
        merge_chunk(torch.zeros(5, HIDDEN), [RequestChunk(items=_items(1), prefix=0, extend=5)], MetaEncoder())


def test_placeholder_count_mismatch_names_the_request_and_item():
    """The drop-in's check compares the host count from the offsets with input_ids; when
    they differ the error says which request and item, and the token where they part."""
    mm_schedule.init_mm_embedding_cache(1 << 20)
    try:
        a = MMItem(modality="IMAGE", hash=11, offsets=[(1, 3)], pad_value=7)
        b = MMItem(modality="IMAGE", hash=22, offsets=[(1, 2)], pad_value=7)
        ids = torch.tensor([0, 7, 7, 7, 0, 0, 7, 0, 0])  # request 1's second placeholder is missing

        def encoder(items):
            return [torch.zeros(sum(e - s + 1 for s, e in it.offsets), HIDDEN) for it in items]

        with pytest.raises(EmbeddingLengthMismatch, match=r"request 1, item hash 22: .*expected 4, got 5"
                                                          r" \(token 7 of input_ids is not a placeholder"):
            mm_schedule.get_embedding_and_mask(encoder, [a, b], torch.tensor([7, 7]), ids, [0, 1, 2], [0, 0],
                                               [5, 4], [[(1, 3)], [(1, 2)]])
        assert len(mm_schedule.embedding_cache) == 0
    finally:
        mm_schedule.init_mm_embedding_cache(0)


@pytest.mark.parametrize("token_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n_ids", [1, 200])
def test_a_wide_placeholder_id_never_matches_its_low_bits(token_dtype, n_ids):
    wide = 2**32 + 99
    ids = torch.tensor([99, 5, 99, 6], dtype=token_dtype)
    pads = torch.tensor([wide] + [10_000 + k for k in range(n_ids - 1)])
    assert not placeholder_mask(ids, pads).any()
    with pytest.raises(EmbeddingLengthMismatch):
        checked_mask(ids, pads, 2)
    assert checked_mask(ids, pads, 0).shape == (4, 1)
