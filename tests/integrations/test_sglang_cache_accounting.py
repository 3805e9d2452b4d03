"""The stand-in's cache under SGLang's behaviour keeps the same entries under the same
budget as each release's own ``MultiModalStaticCache`` (from its wheel): split views of
one encoder output are charged their own rows (0.5.18/0.5.19 keep the views, later
releases clone them)."""

from __future__ import annotations

import random

import pytest
import torch

from mm_schedule.integrations.sglang import sglang_behaviour
from tests.integrations.conftest import _process_module

pytestmark = pytest.mark.realworld

HIDDEN = 8
ROW_BYTES = HIDDEN * 4
CPU = torch.device("cpu")
Item = _process_module().MultimodalDataItem


def _one_request_of_images(n_images: int, rows: int):
    items = [Item(hash=500 + k, offsets=[(k * rows, k * rows + rows - 1)], pad_value=9, feature=torch.zeros(1))
             for k in range(n_images)]
    return items, [it.offsets[0] for it in items]


def _encoder(items):
    # One combined output: the per-image entries are views of it (split by SGLang).
    return torch.randn(sum(e - s + 1 for it in items for s, e in it.offsets), HIDDEN)


def test_ten_images_under_a_hundred_row_budget_are_all_kept_as_sglang_keeps_them(sglang, standin):
    items, offsets = _one_request_of_images(10, 10)
    kept = {}
    for side in (sglang.scheduler, standin):
        with sglang_behaviour():
            side.init_mm_embedding_cache(100 * ROW_BYTES)
        request = side.PerImageRequestInfo(req_idx=0, items=items, items_offset=offsets,
                                           extend_prefix_len=0, extend_seq_len=100)
        side._batch_encode_per_image_misses(_encoder, [request], CPU)
        kept[side] = sorted(k for k in range(500, 510) if side.embedding_cache.has(k))
    assert kept[sglang.scheduler] == kept[standin] == list(range(500, 510))
    assert standin.embedding_cache.current_size == sglang.scheduler.embedding_cache.current_size == 100 * ROW_BYTES


@pytest.mark.parametrize("seed", range(4))
def test_random_views_are_kept_and_evicted_as_sglangs_cache_does(sglang, standin, seed):
    """Views of shared outputs set one after another under a small budget: after every
    ``set`` both caches hold the same keys and charge the same bytes."""
    rng = random.Random(seed)
    budget = rng.randint(20, 60) * ROW_BYTES
    with sglang_behaviour():
        standin.init_mm_embedding_cache(budget)
    sglang.scheduler.init_mm_embedding_cache(budget)
    theirs, ours = sglang.scheduler.embedding_cache, standin.embedding_cache
    keys = []
    for step in range(30):
        sizes = [rng.randint(1, 15) for _ in range(rng.randint(1, 4))]
        output = torch.randn(sum(sizes), HIDDEN)
        for n, view in enumerate(output.split(sizes)):
            key = 1000 * step + n
            keys.append(key)
            assert theirs.set(key, sglang.scheduler.EmbeddingResult(embedding=view)) == \
                ours.set(key, standin.EmbeddingResult(embedding=view))
            assert [k for k in keys if theirs.has(k)] == [k for k in keys if ours.has(k)]
            assert theirs.current_size == ours.current_size
        if rng.random() < 0.3 and keys:  # a read refreshes recency in both
            key = rng.choice(keys)
            assert (theirs.get_single(key) is None) == (ours.get_single(key) is None)
