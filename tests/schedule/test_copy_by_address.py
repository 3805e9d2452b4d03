"""A packed step whose every source is a cache hit, or was just encoded and checked, copies its
rows by the addresses the cache (or the check) recorded, in one launch that reads no tensor on
the host: the Triton kernel under the interpreter, against the naive reference, for entries
cached every way an entry can be (a checked list of outputs, views of one combined output
copied, a reused buffer copied, shared views, SGLang-style ``set``), and on ``meta`` the same
host work with nothing to copy."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mm_schedule.kernels.segment_copy.launch as launch_module
from mm_schedule import (
    EmbeddingCache,
    EmbeddingResult,
    MMItem,
    RequestChunk,
    embed_chunk,
    scheduler,
)

from .conftest import BACKENDS
from .helpers import CountingEncoder, naive_reference, truth

pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def launches(monkeypatch):
    """Every ``launch_whole_sources`` call's row counts, recorded on the way through; steps
    of any size copied by address (more than ``ONE_CAT_LAUNCH`` sources in the product)."""
    monkeypatch.setattr(scheduler, "ONE_CAT_LAUNCH", 0)
    calls = []
    real = launch_module.launch_whole_sources

    def recording(addresses, rows, dest, src_dtype):
        calls.append(list(rows))
        return real(addresses, rows, dest, src_dtype)

    monkeypatch.setattr(launch_module, "launch_whole_sources", recording)
    return calls


def _requests(rng: random.Random, hashes: list[int]) -> list[RequestChunk]:
    reqs = []
    for chunk in (hashes[: len(hashes) // 2], hashes[len(hashes) // 2 :]):
        items, start = [], rng.randint(0, 2)
        for h in chunk:
            length = rng.randint(1, 5)
            items.append(MMItem(hash=h, offsets=[(start, start + length - 1)], feature=torch.zeros(1)))
            start += length + rng.randint(0, 2)
        reqs.append(RequestChunk(items=items, prefix=0, extend=start + 1))
    return reqs


class _ReusedBuffer:
    """An encoder writing every call's rows into one buffer it returns a view of."""

    def __init__(self):
        self.buffer = torch.empty(64, 8)

    def __call__(self, items):
        n = sum(e - s + 1 for it in items for s, e in it.offsets)
        out = self.buffer[:n]
        out.copy_(torch.cat([truth(it.hash, e - s + 1) for it in items for s, e in it.offsets]))
        return out


def _encoders():
    return {
        "list": lambda: CountingEncoder(as_list=True),
        "combined": lambda: CountingEncoder(),
        "reused-buffer": _ReusedBuffer,
    }


@pytest.mark.parametrize("share", [False, True], ids=["own-storage", "share-storage"])
@pytest.mark.parametrize("encoder", sorted(_encoders()))
@pytest.mark.parametrize("seed", range(3))
def test_a_step_of_hits_copies_by_address_what_the_reference_says(backend, launches, encoder, share, seed):
    rng = random.Random(seed)
    reqs = _requests(rng, rng.sample(range(1, 200), rng.randint(2, 9)))
    cache = EmbeddingCache(1 << 20, share_storage=share)
    first = embed_chunk(reqs, _encoders()[encoder](), cache=cache)
    assert torch.equal(first.embedding, naive_reference(reqs))
    cached = embed_chunk(reqs, _encoders()[encoder](), cache=cache)
    assert cached.report.cache_hits == len(cached.plan.keys) and torch.equal(cached.embedding, naive_reference(reqs))
    # Every entry recorded the address of its own first row.
    assert cached.plan.addresses == [t.data_ptr() for t in cached.plan.tensors]
    if backend == "triton":
        assert cached.plan.rows in launches  # the hits, by address
    else:
        assert launches == []  # the torch path concatenates


def test_entries_set_the_sglang_way_are_copied_by_address_too(backend, launches):
    cache = EmbeddingCache(1 << 20)
    views = truth(5, 9).split([4, 5])  # views of one tensor: each is copied into its own entry
    cache.set(11, EmbeddingResult(embedding=views[0]))
    cache.insert(12, views[1])
    reqs = [RequestChunk(items=[MMItem(hash=11, offsets=[(0, 3)]), MMItem(hash=12, offsets=[(5, 9)])],
                         prefix=0, extend=10)]
    result = embed_chunk(reqs, CountingEncoder(), cache=cache)
    assert result.report.cache_hits == 2
    assert torch.equal(result.embedding, truth(5, 9))
    assert result.plan.addresses == [t.data_ptr() for t in result.plan.tensors]
    assert (launches == [[4, 5]]) == (backend == "triton")


def test_a_step_of_checked_outputs_copies_them_by_address(backend, launches):
    """A cold step whose encoder returns one tensor per item, each alone in its storage:
    the check recorded their addresses, so the packed rows are one launch as well."""
    rng = random.Random(7)
    reqs = _requests(rng, [31, 32, 33, 34])
    result = embed_chunk(reqs, CountingEncoder(as_list=True), cache=EmbeddingCache(1 << 20))
    assert torch.equal(result.embedding, naive_reference(reqs))
    assert (launches == [result.plan.rows]) == (backend == "triton")


class _Operators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_on_meta_a_step_of_hits_is_the_host_work_of_one_launch(backend, launches):
    """A dry run: the table packed from the entries' addresses and its upload dispatched, the
    same few operators whatever the number of hits."""
    counts = []
    for n in (8, 64):
        cache = EmbeddingCache(1 << 30)
        items = [MMItem(hash=h, offsets=[(4 * h, 4 * h + 2)]) for h in range(n)]
        reqs = [RequestChunk(items=items, prefix=0, extend=4 * n)]

        def meta_encoder(batch):
            return [torch.empty(3, 8, device="meta") for _ in batch]

        embed_chunk(reqs, meta_encoder, cache=cache, device=torch.device("meta"))
        with _Operators() as ops:
            result = embed_chunk(reqs, meta_encoder, cache=cache, device=torch.device("meta"))
        assert result.embedding.shape == (3 * n, 8) and result.embedding.is_meta
        counts.append(ops.count)
    if backend == "triton":
        assert counts[0] == counts[1] and launches[-1] == [3] * 64
    else:
        assert launches == []  # forced to torch: a dry run mirrors the torch path


def test_up_to_one_cat_launch_of_sources_is_concatenated(backend, monkeypatch):
    """``torch.cat`` takes a step of up to ``ONE_CAT_LAUNCH`` sources in one launch; past it,
    the copy by address (one launch whatever the count)."""
    calls = []
    real = launch_module.launch_whole_sources
    monkeypatch.setattr(launch_module, "launch_whole_sources", lambda *args: calls.append(len(args[1])) or real(*args))
    for n in (scheduler.ONE_CAT_LAUNCH, scheduler.ONE_CAT_LAUNCH + 1):
        cache = EmbeddingCache(1 << 30)
        reqs = [RequestChunk(items=[MMItem(hash=h + 1, offsets=[(2 * h, 2 * h)]) for h in range(n)], prefix=0,
                             extend=2 * n)]
        embed_chunk(reqs, CountingEncoder(as_list=True), cache=cache)
        result = embed_chunk(reqs, CountingEncoder(as_list=True), cache=cache)
        assert torch.equal(result.embedding, naive_reference(reqs))
    assert calls == ([scheduler.ONE_CAT_LAUNCH + 1] * 2 if backend == "triton" else [])
