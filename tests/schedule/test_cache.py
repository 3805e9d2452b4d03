import logging
import random

import pytest
import torch

from mm_schedule import EmbeddingCache, EmbeddingResult, combine_hashes
from mm_schedule import cache as cache_module
from mm_schedule.cache import _entry, storage_id
from mm_schedule.errors import CacheConfigError, CacheLayoutError

ROW = 4 * 4  # one float32 row of hidden 4


def rows(n, fill=0.0):
    return torch.full((n, 4), float(fill), dtype=torch.float32)


def test_lru_eviction_by_bytes_and_recency():
    cache = EmbeddingCache(3 * ROW)
    for k in (1, 2, 3):
        assert cache.insert(k, rows(1, float(k)))
    assert cache.lookup(1) is not None  # 1 becomes most recent; 2 is now the oldest
    assert cache.insert(4, rows(1, 4.0))
    assert not cache.contains(2)
    assert [k for k in (1, 3, 4) if cache.contains(k)] == [1, 3, 4]
    s = cache.stats()
    assert (s.evictions, s.entries, s.bytes, s.insertions) == (1, 3, 3 * ROW, 4)


def test_split_view_is_cloned_and_charged_its_own_bytes():
    batch = torch.randn(10, 4)
    view = batch[2:4]
    cache = EmbeddingCache(100 * ROW)
    assert cache.insert(9, view)
    stored = cache.lookup(9)
    assert torch.equal(stored, view)
    assert stored.untyped_storage().nbytes() == 2 * ROW
    assert stored.untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()
    assert cache.stats().bytes == 2 * ROW


def test_whole_tensor_is_not_copied():
    t = torch.randn(3, 4)
    cache = EmbeddingCache(100 * ROW)
    cache.insert(1, t)
    assert cache.lookup(1).data_ptr() == t.data_ptr()


def test_oversized_entry_rejected_without_evicting():
    cache = EmbeddingCache(4 * ROW)
    cache.insert(1, rows(2))
    cache.insert(2, rows(2))
    assert not cache.insert(3, rows(5))
    s = cache.stats()
    assert (s.rejected, s.evictions, s.entries) == (1, 0, 2)


def test_set_on_existing_key_replaces_value():
    cache = EmbeddingCache(10 * ROW)
    cache.insert(1, rows(2, 1.0))
    cache.insert(2, rows(1, 2.0))
    assert cache.insert(1, rows(3, 5.0))
    assert torch.equal(cache.lookup(1), rows(3, 5.0))
    assert cache.stats().bytes == 4 * ROW
    cache.insert(3, rows(7))  # needs eviction: 2 is least recent now
    assert not cache.contains(2) and cache.contains(1)


def test_pinned_entries_are_never_evicted():
    cache = EmbeddingCache(2 * ROW)
    cache.insert(1, rows(1))
    cache.insert(2, rows(1))
    with cache.pin([1, 2]):
        assert not cache.insert(3, rows(1))  # no unpinned victim: rejected
        assert cache.contains(1) and cache.contains(2)
    with cache.pin([1]):
        assert cache.insert(3, rows(1))
        assert cache.contains(1) and not cache.contains(2)
    assert cache.insert(4, rows(2))  # pins released: anything can go
    assert cache.contains(4) and len(cache) == 1


def test_failed_make_room_evicts_nothing():
    cache = EmbeddingCache(3 * ROW)
    cache.insert(1, rows(1))
    cache.insert(2, rows(1))
    cache.insert(3, rows(1))
    with cache.pin([3]):
        assert not cache.insert(4, rows(3))
    assert len(cache) == 3 and cache.stats().evictions == 0


def test_stats_counts_hits_and_misses():
    cache = EmbeddingCache(10 * ROW)
    cache.insert(1, rows(1))
    cache.lookup(1)
    cache.lookup(2)
    cache.lookup(1)
    s = cache.stats()
    assert (s.hits, s.misses) == (2, 1)
    assert s.as_dict()["hits"] == 2


def test_sglang_surface():
    cache = EmbeddingCache(10 * ROW)
    assert combine_hashes([]) is None
    assert combine_hashes([5]) != 5
    key = cache.combine_hashes([1, 2])
    assert cache.set(key, EmbeddingResult(embedding=rows(2, 3.0)))
    got = cache.get([1, 2])
    assert isinstance(got, EmbeddingResult) and torch.equal(got.embedding, rows(2, 3.0))
    cache.set(7, rows(1))
    assert torch.equal(cache.get_single(7).embedding, rows(1))
    assert cache.has(7) and cache.available_size() == 2
    assert cache.free(7) and not cache.has(7)
    assert cache.current_size == 2 * ROW
    cache.clear()
    assert len(cache) == 0 and cache.current_size == 0


def test_negative_budget_rejected():
    with pytest.raises(ValueError):
        EmbeddingCache(-1)


def test_non_tensor_values_are_refused():
    from mm_schedule.errors import CacheStateError

    cache = EmbeddingCache(10 * ROW)
    with pytest.raises(CacheStateError, match="key 3: the cache stores tensors"):
        cache.set(3, [[1.0, 2.0]])
    assert len(cache) == 0


@pytest.mark.parametrize("seed", range(6))
def test_insert_many_leaves_the_cache_as_one_insert_at_a_time_would(seed):
    """Batches that fit as new keys take a shortcut; the cache must end up the same as
    inserting each pair alone (order, bytes, stats), on batches that fit and ones that do not."""
    gen = torch.Generator().manual_seed(seed)
    budget = 4096
    batched, single = EmbeddingCache(budget), EmbeddingCache(budget)
    for _ in range(12):
        n = int(torch.randint(1, 6, (1,), generator=gen))
        keys = torch.randint(0, 10, (n,), generator=gen).tolist()
        pairs = [(k, torch.randn(int(torch.randint(1, 9, (1,), generator=gen)), 16, generator=gen)) for k in keys]
        protect = [k for k in list(single._entries)[-2:]]
        batched.insert_many(pairs, protect=protect)
        for k, t in pairs:
            single._insert(k, _entry(t, None), set(protect))
        assert list(batched._entries) == list(single._entries)
        assert batched.stats() == single.stats()
        assert batched.stats().bytes <= budget
        for k in list(single._entries):
            assert torch.equal(batched.lookup(k), single.lookup(k))


@pytest.mark.parametrize("looked_up", [(1, 2), (2, 1), (1, 2, 4), (1, 3)])
def test_lookup_many_returns_counts_and_refreshes_like_single_lookups(looked_up):
    """All hits with the right rows, a miss among them, or a row-count mismatch: the
    tensors, the stats and the recency order are what one lookup per key leaves."""
    def filled():
        cache = EmbeddingCache(3 * ROW + 2 * ROW)
        for k, n in ((1, 1), (2, 1), (3, 3)):
            cache.insert(k, rows(n, float(k)))
        return cache

    want_rows = {1: 1, 2: 1, 3: 2, 4: 1}  # key 3 is cached with 3 rows: a mismatch, discarded
    many, one = filled(), filled()
    got, layout = many.lookup_many(list(looked_up), [want_rows[k] for k in looked_up])
    want = []
    for k in looked_up:
        t = one.lookup(k)
        if t is not None and t.shape[0] != want_rows[k]:
            one.discard(k)
            t = None
        want.append(t)
    assert [g is None for g in got] == [w is None for w in want]
    assert all(g is None or torch.equal(g, w) for g, w in zip(got, want))
    assert layout == (4, torch.float32, torch.device("cpu"))
    s_many = many.stats()
    served = sum(w is not None for w in want)
    assert (s_many.hits, s_many.misses, s_many.entries) == (served, len(want) - served, one.stats().entries)
    # Recency: the next insert that needs room evicts the same (least recent) key in both.
    for cache in (many, one):
        cache.insert(5, rows(2, 5.0))
    assert [k for k in (1, 2, 3, 5) if many.contains(k)] == [k for k in (1, 2, 3, 5) if one.contains(k)]


def test_shared_storage_keeps_views_and_charges_their_own_rows():
    """``share_storage=True`` (SGLang 0.5.19's rule): the split views of one encoder output
    are cached as they are, each charged for its own rows (not the output it pins), and
    not mistaken for an encoder reusing its buffer; the default copies each view to
    exactly its rows."""
    output = torch.randn(10, 4)
    views = list(output.split([3, 7]))
    for share in (False, True):
        cache = EmbeddingCache(1 << 20, share_storage=share)
        assert cache.insert_many(zip((1, 2), views), modalities=["IMAGE", "IMAGE"]) == 2
        held = [cache.lookup(1), cache.lookup(2)]
        assert all(torch.equal(h, v) for h, v in zip(held, views))
        same_storage = [h.untyped_storage().data_ptr() == output.untyped_storage().data_ptr() for h in held]
        assert same_storage == [share, share]
        whole = output.untyped_storage().nbytes()
        assert cache.stats().bytes == whole  # 3 + 7 rows either way
        cache.set(3, EmbeddingResult(embedding=views[0]))
        assert (cache.lookup(3).untyped_storage().data_ptr() == output.untyped_storage().data_ptr()) == share
        assert len(cache) == 3  # nothing evicted as an overwritten buffer


@pytest.mark.parametrize("value", [1, None, "yes"])
def test_share_storage_must_be_a_bool(value):
    with pytest.raises(CacheConfigError, match="share_storage"):
        EmbeddingCache(1 << 20, share_storage=value)


def _state(cache):
    """Everything insert_many changes, with tensors compared by identity or by value."""
    entries = [(k, e[1], e[2], e[3], e[4], e[5]) for k, e in cache._entries.items()]
    # Copies differ between two caches: which entry each recorded storage belongs to.
    storages = sorted((k, sid == storage_id(cache._entries[k][0]) if k in cache._entries else None)
                      for sid, k in cache._by_storage.items())
    return (entries, cache._bytes, dict(cache._layouts), {m: dict(c) for m, c in cache._held.items()},
            dict(cache._forgotten), storages, cache.stats())


def _vouched_batch(gen, device):
    """Fresh outputs of one layout: owned tensors, views of a larger storage (sometimes),
    one modality or two."""
    n = int(torch.randint(1, 6, (1,), generator=gen))
    counts = torch.randint(1, 5, (n,), generator=gen).tolist()
    keys = torch.randint(0, 12, (n,), generator=gen).tolist()
    if torch.rand(1, generator=gen) < 0.3:
        whole = torch.randn(sum(counts), 4, generator=gen).to(device)
        tensors = list(whole.split(counts))  # views of one storage: each must be copied
    else:
        tensors = [torch.randn(c, 4, generator=gen).to(device) for c in counts]
    mods = ["IMAGE" if torch.rand(1, generator=gen) < 0.7 else "AUDIO" for _ in keys]
    return list(zip(keys, tensors)), counts, mods


@pytest.mark.parametrize("share", [False, True], ids=["owned", "shared"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("seed", range(4))
def test_vouched_insert_leaves_the_cache_as_the_checked_one_would(seed, device, share):
    """A step's validated outputs are inserted by storage alone (``vouched``): the cache
    must end up exactly as when every tensor's layout is read (entries in order, bytes,
    layout counts, storage map, stats), through batches that fit, evict, repeat keys,
    share storages and follow a reused buffer."""
    gen = torch.Generator().manual_seed(seed)
    checked, vouched = (EmbeddingCache(40 * ROW, share_storage=share) for _ in range(2))
    layout = (4, torch.float32, torch.device(device))
    reused, given = None, {}
    for step in range(14):
        pairs, counts, mods = _vouched_batch(gen, device)
        if step % 5 == 4 and device == "cpu" and reused is not None:
            pairs[0] = (pairs[0][0] + 100, reused)  # an encoder handing back a buffer it gave before
            counts[0] = reused.shape[0]
        given.update((id(t), t) for _, t in pairs)
        protect = list(checked._entries)[-1:]
        checked.insert_many(pairs, protect=protect, modalities=mods)
        vouched.insert_many(pairs, protect=protect, modalities=mods, vouched=layout, rows=counts)
        assert _state(vouched) == _state(checked)
        for key in checked._entries:
            a, b = checked._entries[key][0], vouched._entries[key][0]
            assert a.shape == b.shape and (device == "meta" or torch.equal(a, b))
            assert (given.get(id(a)) is a) == (given.get(id(b)) is b)  # both kept as given, or both copied
        reused = pairs[-1][1]
    assert checked.stats().insertions > 10


def test_vouched_insert_refuses_a_layout_the_cache_holds_otherwise():
    """Once three inserts confirmed the learned layout; before that, see below."""
    cache = EmbeddingCache(1 << 20)
    for key in (1, 2, 3):
        cache.insert_many([(key, rows(2))], modalities=["IMAGE"])
    assert cache.layout_confirmed("IMAGE")
    wide = torch.zeros(2, 5)
    with pytest.raises(CacheLayoutError, match=r"key 7: a IMAGE embedding of hidden size 5 .*confirmed \(3 inserts"):
        cache.insert_many([(7, wide), (8, torch.zeros(2, 5))], modalities=["IMAGE", "IMAGE"],
                          vouched=(5, torch.float32, torch.device("cpu")), rows=[2, 2])
    assert list(cache._entries) == [1, 2, 3]


@pytest.mark.parametrize("vouched", [True, False], ids=["vouched", "checked"])
def test_an_unconfirmed_learned_layout_is_disputed_then_replaced_not_refused(caplog, vouched):
    """One insert taught the layout: a batch that disagrees may be the right one, so it is not
    refused; the first is not cached (nothing evicted), the next of its layout replaces the
    held entries (logged) as a change still to confirm. A batch must agree with itself all
    the same."""
    cache = EmbeddingCache(1 << 20)
    cache.insert_many([(1, rows(2))], modalities=["IMAGE"])
    assert not cache.layout_confirmed("IMAGE") and cache.layout_of("IMAGE", confirmed_only=True) == (None, None)
    extra = {"vouched": (5, torch.float32, torch.device("cpu")), "rows": [2, 2]} if vouched else {}
    with caplog.at_level(logging.WARNING, logger="mm_schedule.cache"):
        assert cache.insert_many([(5, torch.zeros(2, 5)), (6, torch.zeros(2, 5))], modalities=["IMAGE", "IMAGE"],
                                 **extra) == 0
        assert "they are not cached and nothing is evicted" in caplog.text
        assert list(cache._entries) == [1] and cache.layout_of("IMAGE") == (4, torch.float32)
        # Another modality in the same batch is cached as usual.
        assert cache.insert_many([(7, torch.zeros(2, 5)), (8, torch.zeros(2, 5)), (9, torch.zeros(1, 3))],
                                 modalities=["IMAGE", "IMAGE", "AUDIO"]) == 3
    assert "disagree with the layout learned from 1 insert(s) (hidden size 4" in caplog.text
    assert "disputed too: its 1 cached IMAGE entries were evicted" in caplog.text
    assert list(cache._entries) == [7, 8, 9] and cache.layout_of("IMAGE") == (5, torch.float32)
    assert cache.layout_changing("IMAGE")  # not served until later inserts confirm it
    with pytest.raises(CacheLayoutError, match=r"key 10: a IMAGE embedding of hidden size 6 .* must have hidden size"
                                               r" 5 .*not yet confirmed \(1 insert brought it\)"):
        cache.insert_many([(10, torch.zeros(2, 6)), (11, torch.zeros(2, 7))], modalities=["IMAGE", "IMAGE"])


@pytest.mark.parametrize(("keys", "want_rows", "every"), [
    ((1, 2), (1, 1), True), ((1, 4), (1, 1), False), ((5, 6), (1, 1), False), ((1, 3), (1, 2), False), ((), (), True)])
def test_lookup_all_says_whether_every_key_was_found(keys, want_rows, every):
    """All found, one missing, none cached, a row-count mismatch (discarded), nothing asked."""
    cache = EmbeddingCache(1 << 20)
    for k, n in ((1, 1), (2, 1), (3, 3)):
        cache.insert(k, rows(n, float(k)))
    found, _, all_found, addresses = cache.lookup_all(list(keys), list(want_rows))
    assert all_found is every
    assert all_found == all(t is not None for t in found)
    # Every key found: the address of each entry's first row, for a copy that reads no tensor.
    assert addresses == ([t.data_ptr() for t in found] if every else None)


def _lookup_all_with(c_pass, keys, want_rows, held, monkeypatch):
    cache = EmbeddingCache(1 << 20)
    for k, n in held.items():
        cache.insert(k, rows(n, float(k)))
    with monkeypatch.context() as patch:
        patch.setattr(cache_module, "_all_hits", c_pass)
        found, _, every, addresses = cache.lookup_all(keys, want_rows)
    s = cache.stats()
    assert addresses == ([t.data_ptr() for t in found] if every else None)
    return ([None if t is None else t.tolist() for t in found], every, (s.hits, s.misses, s.entries),
            list(cache._entries))


@pytest.mark.skipif(cache_module._all_hits is None, reason="installed without the C helper")
@pytest.mark.parametrize("seed", range(40))
def test_the_steady_state_lookup_answers_as_the_python_passes_do(seed, monkeypatch):
    """Every key held with its rows, one missing, rows that differ (also by type: a bool, a
    float, a big int), a key that is not an int, lists of other lengths: a lookup
    with the C pass returns the same tensors, stats and recency order as without it."""
    gen = random.Random(seed)
    held = {k: gen.randint(1, 3) for k in gen.sample(range(1, 40), 12)}
    keys = gen.sample(sorted(held), gen.randint(1, len(held)))
    want = [held[k] for k in keys]
    case = seed % 7
    i = gen.randrange(len(keys))
    if case == 1:
        keys[i] = 99  # not cached
    elif case == 2:
        want[i] += 1
    elif case == 3:
        want[i] = gen.choice([float(want[i]), want[i] == 1, 2**70])
    elif case == 4:
        keys[i] = str(keys[i])
    elif case == 5:
        want = want[:-1]
    elif case == 6:
        want.append(1)
    c_side = _lookup_all_with(cache_module._all_hits, keys, want, held, monkeypatch)
    assert c_side == _lookup_all_with(None, keys, want, held, monkeypatch), (case, keys, want)
    if case == 0:
        assert c_side[1] is True


@pytest.mark.skipif(cache_module._all_hits is None, reason="installed without the C helper")
def test_the_steady_state_lookup_survives_a_key_that_empties_the_cache():
    """A key of another type sharing a bucket runs Python code mid-lookup (its __eq__):
    here it empties the dictionary; the C pass answers None without touching freed memory."""
    armed = False

    class Evil:
        def __hash__(self):
            return 5

        def __eq__(self, other):
            if armed:
                entries.clear()
            return False

    entries = {Evil(): ("not", "an", "entry"), 5: (rows(1), 1, "IMAGE", 1234)}
    assert cache_module._all_hits(entries, [5, 5], [1, 1], ["IMAGE", "IMAGE"], 0, 1, 2, 3) is not None
    armed = True
    assert cache_module._all_hits(entries, [5, 5], [1, 1], ["IMAGE", "IMAGE"], 0, 1, 2, 3) is None
    assert entries == {}
