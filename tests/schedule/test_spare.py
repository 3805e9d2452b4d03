"""A large packed result's memory is reused by the next step only when nobody holds it."""

from __future__ import annotations

import gc
import random

import numpy as np
import pytest
import torch

from mm_schedule import EmbeddingCache, RequestChunk, embed_chunk, spare
from mm_schedule.kernels.segment_copy import host_copy
from tests.schedule.conftest import BACKENDS
from tests.schedule.helpers import CountingEncoder, image, naive_reference


@pytest.fixture(autouse=True, params=["ordinary stores", "streaming stores"])
def every_result_is_large(request, monkeypatch):
    """Every packed result counts as large: kept as the spare, and (second run) written
    with streaming stores when the C helper is built."""
    monkeypatch.setattr(spare, "MIN_BYTES", 0)
    if request.param == "streaming stores":
        if host_copy._stream_copy is None:
            pytest.skip("the C helper is not built in this install")
        monkeypatch.setattr(host_copy, "STREAM_MIN_BYTES", 0)
    spare.drop_spare()
    yield
    spare.drop_spare()


def _requests(rng: random.Random, *, chunked: bool) -> list[RequestChunk]:
    requests = []
    for _ in range(3):
        items, position = [], rng.randrange(0, 4)
        for _ in range(rng.randrange(1, 4)):
            length = rng.randrange(1, 6)
            items.append(image(rng.randrange(1, 2**40), position, length))
            position += length + rng.randrange(0, 3)
        prefix = rng.randrange(0, 3) if chunked else 0
        requests.append(RequestChunk(items, prefix, position + 1 - prefix))
    return requests


def _step(requests, cache):
    return embed_chunk(requests, CountingEncoder(), cache=cache).embedding


def _holders():
    """Ways a caller keeps a result's memory alive, each given the result."""
    return {
        "the result": lambda t: t,
        "a view": lambda t: t[1:],
        "its storage": lambda t: t.untyped_storage(),
        "a NumPy array": lambda t: t.numpy(),
        "nothing": None,  # the result dropped: its memory is reused
    }


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("holder", list(_holders()))
def test_held_results_keep_their_rows_and_free_ones_are_reused(backend, chunked, holder):
    rng = random.Random(f"{holder}-{chunked}")
    cache = EmbeddingCache(1 << 24)
    keep = _holders()[holder]
    first_requests = _requests(rng, chunked=chunked)
    first = _step(first_requests, cache)
    expected_first = naive_reference(first_requests)
    address = first.data_ptr()
    held = keep(first) if keep is not None else None
    first = None
    gc.collect()  # the Triton interpreter leaves the result in reference cycles
    # The same shape again (a step of other items): the only case the memory could be reused.
    second_requests = [RequestChunk([image(it.hash + 1, *_span(it)) for it in r.items], r.prefix, r.extend)
                       for r in first_requests]
    second = _step(second_requests, cache)
    assert torch.equal(second, naive_reference(second_requests))
    if keep is None:
        assert second.data_ptr() == address
    else:
        assert second.data_ptr() != address
        rows = held if isinstance(held, torch.Tensor) else None
        if isinstance(held, np.ndarray):
            rows = torch.from_numpy(held)
        if rows is not None:
            want = expected_first[1:] if holder == "a view" else expected_first
            assert torch.equal(rows, want)


def _span(item) -> tuple[int, int]:
    (start, end), = item.offsets
    return start, end - start + 1


def test_a_spare_is_not_shared_by_two_live_results():
    cache = EmbeddingCache(1 << 24)
    requests = _requests(random.Random(1), chunked=False)
    results = [_step(requests, cache) for _ in range(4)]
    assert len({r.data_ptr() for r in results}) == 4
    for r in results:
        assert torch.equal(r, naive_reference(requests))


def test_other_sizes_and_small_results_get_fresh_memory(monkeypatch):
    cache = EmbeddingCache(1 << 24)
    requests = [RequestChunk([image(10 + r, 1, 4)], 0, 6) for r in range(3)]  # 12 rows; one request: 4
    first = _step(requests, cache)
    address = first.data_ptr()
    first = None
    gc.collect()
    smaller = _step(requests[:1], cache)  # a third of the spare: allocated afresh, the spare freed
    assert smaller.data_ptr() != address
    assert torch.equal(smaller, naive_reference(requests[:1]))
    monkeypatch.setattr(spare, "MIN_BYTES", 1 << 40)
    spare.drop_spare()
    assert torch.equal(_step(requests, cache), naive_reference(requests))
    assert spare._spare is None  # below the threshold nothing is kept


def test_memory_moved_to_shared_memory_is_never_reused():
    """Another process may map it after this one drops the result."""
    cache = EmbeddingCache(1 << 24)
    requests = _requests(random.Random(3), chunked=False)
    first = _step(requests, cache)
    first.share_memory_()
    address = first.data_ptr()
    first = None
    gc.collect()
    second = _step(requests, cache)
    assert second.data_ptr() != address
    assert torch.equal(second, naive_reference(requests))


class NegatedViewEncoder(CountingEncoder):
    """Returns every item's rows as a negated view of their negation: the right values,
    in bytes that are not."""

    def __call__(self, items):
        rows = CountingEncoder.__call__(self, items)
        return [torch._neg_view(-t) for t in rows] if self.as_list else torch._neg_view(-rows)


@pytest.mark.parametrize("as_list", [True, False])
def test_negated_views_are_assembled_and_cached_by_value(as_list):
    rng = random.Random(f"negated views {as_list}")
    cache = EmbeddingCache(1 << 24)
    requests = _requests(rng, chunked=False)
    encoder = NegatedViewEncoder(as_list=as_list)
    first = embed_chunk(requests, encoder, cache=cache).embedding
    assert torch.equal(first, naive_reference(requests))
    again = embed_chunk(requests, encoder, cache=cache).embedding  # every row a hit
    assert torch.equal(again, naive_reference(requests)) and len(encoder.calls) == 1
    direct = EmbeddingCache(1 << 20)
    direct.insert(7, torch._neg_view(-torch.arange(6.0).view(3, 2)))
    stored = direct.lookup(7)
    assert not stored.is_neg() and torch.equal(stored, torch.arange(6.0).view(3, 2))
