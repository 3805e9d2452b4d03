"""Values given to the SGLang-style ``set`` / ``insert`` (objects with ``.embedding``):
the cache keeps and serves only its own detached copy, charges exactly the storage it
keeps alive, holds a value tagged with ``ForModality`` to that modality's layout, and
takes a set tensor in another entry's storage for a reused encoder buffer."""

from __future__ import annotations

import dataclasses
import gc
import random

import pytest
import torch

from mm_schedule import EmbeddingCache, EmbeddingResult
from mm_schedule.cache import ForModality
from mm_schedule.errors import CacheLayoutError, CacheStateError
from mm_schedule.evs import EVSEmbeddingResult


def _held_bytes(cache: EmbeddingCache) -> int:
    """Bytes of every distinct storage the cache's entries keep alive (entry tensors and
    the tensors of the values it serves), counted from the tensors themselves."""
    storages = {}
    for entry in cache._entries.values():
        tensors = [entry[0]] + ([entry[3].embedding] if entry[3] is not None else [])
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("seed", range(5))
def test_a_set_view_is_kept_as_the_caches_own_copy_and_charged_what_it_keeps(seed):
    rng = random.Random(seed)
    hidden = rng.choice([3, 8, 16])
    cache = EmbeddingCache(1 << 30)
    want = {}
    for key in range(rng.randint(2, 6)):
        batch = torch.randn(rng.randint(50, 4000), hidden)
        start = rng.randrange(batch.shape[0] - 1)
        stop = rng.randint(start + 1, min(batch.shape[0], start + 9))
        view = batch[start:stop]
        want[key] = view.clone()  # the rows, taken before the cache sees them
        given = EmbeddingResult(embedding=view)
        assert cache.set(key, given)
        served = cache.get_single(key)
        assert served is not given
        assert served.embedding.untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()
        batch.fill_(float("nan"))  # the caller reuses its batch: the cache's copy is its own
        del batch, view, given
    gc.collect()
    for key, rows in want.items():
        assert torch.equal(cache.get_single(key).embedding, rows)
        assert cache.get_single(key).embedding.untyped_storage().nbytes() == rows.numel() * rows.element_size()
    assert cache.stats().bytes == _held_bytes(cache) == sum(r.numel() * r.element_size() for r in want.values())


def test_a_set_value_keeps_no_autograd_graph():
    weight = torch.randn(8, 8, requires_grad=True)
    out = torch.randn(3, 8) @ weight
    cache = EmbeddingCache(1 << 20)
    cache.set(1, EmbeddingResult(embedding=out))
    served = cache.get_single(1).embedding
    assert not served.requires_grad and served.grad_fn is None
    assert not cache.lookup(1).requires_grad
    assert torch.equal(served, out.detach())
    assert cache.stats().bytes == _held_bytes(cache) == out.numel() * 4


def test_the_served_value_keeps_its_type_fields_and_shape():
    """An EVS result stays one (frame counts kept); any other class with ``.embedding``
    is copied with its other attributes; a 3-D embedding is served 3-D, in the cache's
    own storage."""

    class TheirResult:
        def __init__(self, embedding, note):
            self.embedding, self.note = embedding, note

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        embedding: torch.Tensor
        tag: str = "t"

    whole = torch.randn(40, 6)
    cache = EmbeddingCache(1 << 20)
    cache.set(1, EVSEmbeddingResult(embedding=whole[:5], num_tokens_per_frame=(2, 3)))
    cache.set(2, TheirResult(whole[5:9], "kept"))
    cache.set(3, Frozen(embedding=whole[9:12]))
    cache.set(4, EmbeddingResult(embedding=whole[12:20].reshape(1, 8, 6)))
    evs, theirs, frozen, three_d = (cache.get_single(k) for k in (1, 2, 3, 4))
    assert type(evs) is EVSEmbeddingResult and evs.num_tokens_per_frame == (2, 3)
    assert type(theirs) is TheirResult and theirs.note == "kept"
    assert type(frozen) is Frozen and frozen.tag == "t"
    assert three_d.embedding.shape == (1, 8, 6)
    for value, rows in [(evs, whole[:5]), (theirs, whole[5:9]), (frozen, whole[9:12]),
                        (three_d, whole[12:20].reshape(1, 8, 6))]:
        assert torch.equal(value.embedding, rows)
        assert value.embedding.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr()
    assert cache.stats().bytes == _held_bytes(cache) == 20 * 6 * 4


def test_a_value_that_cannot_take_the_caches_copy_is_refused():
    class ReadOnly:
        def __init__(self, t):
            self._t = t

        @property
        def embedding(self):
            return self._t

    cache = EmbeddingCache(1 << 20)
    with pytest.raises(CacheStateError, match=r"key 5: .*cannot build a ReadOnly"):
        cache.set(5, ReadOnly(torch.randn(10, 4)[:2]))
    assert len(cache) == 0 and cache.stats().bytes == 0


@pytest.mark.parametrize("bad", ["hidden", "dtype"])
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "learned"])
def test_a_value_for_a_modality_is_held_to_its_layout(bad, declared):
    hidden = random.Random(f"{bad}-{declared}").randint(4, 12)
    cache = EmbeddingCache(1 << 20, **({"hidden_sizes": hidden, "dtypes": torch.float32} if declared else {}))
    good = torch.randn(3, hidden)
    if not declared:
        for key in (1, 11, 12):  # three inserts confirm the learned layout
            assert cache.set(key, ForModality(EmbeddingResult(embedding=good.clone()), "VIDEO"))
        assert cache.layout_of("VIDEO") == (hidden, torch.float32) and cache.layout_confirmed("VIDEO")
    before = (len(cache), cache.stats().bytes)
    wrong = torch.randn(3, hidden + 1) if bad == "hidden" else torch.randn(3, hidden, dtype=torch.float64)
    with pytest.raises(CacheLayoutError, match=r"key 2: a VIDEO embedding of hidden size \d+ and dtype") as err:
        cache.set(2, ForModality(EVSEmbeddingResult(embedding=wrong, num_tokens_per_frame=[3]), "VIDEO"))
    assert err.value.key == 2 and err.value.got == (wrong.shape[-1], wrong.dtype)
    assert (len(cache), cache.stats().bytes) == before and not cache.has(2)
    assert cache.set(3, ForModality(EmbeddingResult(embedding=good.clone()), "VIDEO"))
    assert cache.layout_of("VIDEO") == (hidden, torch.float32)
    assert cache.set(4, EmbeddingResult(embedding=wrong))  # no modality: no layout to hold it to


def test_a_set_tensor_in_another_entrys_storage_is_a_reused_buffer(caplog):
    """The holder was overwritten: evicted, never served; the new value is a copy; later
    writes into the buffer change nothing cached."""
    gen = torch.Generator().manual_seed(7)
    truths = [torch.randn(4, 8, generator=gen) for _ in range(4)]
    buffer = torch.empty(4, 8)
    cache = EmbeddingCache(1 << 20)
    for key, rows in enumerate(truths):
        buffer.copy_(rows)
        assert cache.set(key, EmbeddingResult(embedding=buffer))
        if key:
            assert not cache.has(key - 1) or torch.equal(cache.get_single(key - 1).embedding, truths[key - 1])
    buffer.fill_(float("nan"))
    assert not cache.has(0)  # cached by reference, then overwritten by the second output
    for key in (1, 2, 3):
        assert torch.equal(cache.get_single(key).embedding, truths[key])
    assert cache.stats().bytes == _held_bytes(cache) == 3 * 4 * 8 * 4
    assert sum("shares its storage" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_a_value_of_a_modality_must_be_floating_point(dtype):
    """Held to a modality, a non-floating tensor would become the learned dtype and refuse
    every real output of it: refused at set/insert, nothing cached or learned."""
    cache = EmbeddingCache(1 << 20, hidden_sizes=4)
    tensor = torch.ones(3, 4).to(dtype)
    with pytest.raises(CacheStateError, match=rf"key 1: a IMAGE embedding must be a floating \[rows, hidden\] tensor,"
                                              rf" got a 2-d {dtype} one"):
        cache.set(1, ForModality(tensor, "IMAGE"))
    with pytest.raises(CacheStateError, match="must be a floating"):
        cache.insert(2, EmbeddingResult(embedding=tensor), modality="image")
    with pytest.raises(CacheStateError, match=r"got a 1-d torch\.float32 one"):  # it would teach hidden 3
        cache.set(4, ForModality(torch.randn(3), "IMAGE"))
    assert len(cache) == 0 and cache.layout_of("IMAGE") == (4, None)
    cache.set(3, ForModality(torch.randn(3, 4), "IMAGE"))
    assert cache.layout_of("IMAGE") == (4, torch.float32)


def test_a_0_d_value_is_refused_by_name():
    cache = EmbeddingCache(1 << 20)
    for value in (torch.tensor(1.0), EmbeddingResult(embedding=torch.tensor(2.0))):
        with pytest.raises(CacheStateError, match=r"key 7: an embedding has rows and a hidden size .* 0-d"):
            cache.set(7, value)
    with pytest.raises(CacheStateError, match="0-d"):
        cache.insert_many([(8, torch.tensor(3.0))])
    assert len(cache) == 0


def test_single_key_reads_never_serve_an_entry_of_an_unconfirmed_layout_change():
    """``lookup``, ``get_single`` and ``get`` follow ``lookup_all``: while a changed layout
    is unconfirmed its entries are held but read as misses."""
    cache = EmbeddingCache(1 << 20)
    cache.insert_many([(1, torch.randn(2, 4))], modalities=["IMAGE"])
    cache.free(1)
    cache.insert_many([(2, torch.randn(2, 8))], modalities=["IMAGE"])
    assert cache.layout_changing("IMAGE") and cache.has(2)
    misses = cache.stats().misses
    assert cache.lookup(2) is None and cache.get_single(2) is None
    assert cache.lookup_all([2], [2])[0] == [None]
    assert cache.stats().misses == misses + 3
    for _ in range(2):
        cache.insert_many([(3, torch.randn(2, 8))], modalities=["IMAGE"])
    assert not cache.layout_changing("IMAGE") and cache.lookup(2).shape == (2, 8)
