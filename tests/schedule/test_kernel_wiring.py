"""The scheduler's assembly runs through the Triton kernels (interpreter on CPU)."""

import os

import pytest
import torch

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, embed_chunk, merge_chunk

from .helpers import HIDDEN, CountingEncoder, image, naive_reference

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 to run Triton on CPU"
)


def _batch():
    video = MMItem(modality="IMAGE", hash=90, offsets=[(3, 5), (8, 9)], feature=torch.zeros(1))
    return [
        RequestChunk(items=[image(1, 2, 4), image(2, 8, 5)], prefix=4, extend=8),
        RequestChunk(items=[image(1, 0, 4)], prefix=0, extend=3),
        RequestChunk(items=[video], prefix=0, extend=10),
    ]


@pytest.mark.parametrize("fused", [False, True])
def test_triton_backend_assembles_the_same_rows(monkeypatch, fused):
    from mm_schedule.kernels.backend import refresh_backend

    monkeypatch.setenv("MM_SCHEDULE_KERNEL_BACKEND", "triton")
    refresh_backend()
    reqs = _batch()
    cache = EmbeddingCache(1 << 20)
    for _ in range(2):  # second round: every source is a cache hit
        if fused:
            total = sum(r.extend for r in reqs)
            embeds = torch.full((total, HIDDEN), float("nan"))
            merge_chunk(embeds, reqs, CountingEncoder(), cache=cache)
            rows = embeds[~torch.isnan(embeds[:, 0])]
        else:
            rows = embed_chunk(reqs, CountingEncoder(), cache=cache).embedding
        assert torch.equal(rows, naive_reference(reqs))
    assert cache.stats().hits >= 3
