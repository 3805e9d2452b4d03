"""A step's plan for one request does not depend on what else is in the batch: one hash
under two modalities is refused (``ConflictingHashError``) whichever planner runs and
whatever else the step holds, and adding unrelated requests never changes an existing
request's rows, the encoder its items go to, or the cache entry they leave."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_schedule import EmbeddingCache, MMItem, RequestChunk, embed_chunk
from mm_schedule.errors import ConflictingHashError, InvalidItemError
from mm_schedule.plan import flat

from .helpers import HIDDEN, truth

MODALITIES = ("IMAGE", "VIDEO")


class _ModalityEncoder:
    """``truth`` rows scaled by a factor of its own, so rows show which encoder made them."""

    def __init__(self, factor: float):
        self.factor = factor
        self.hashes: list[int] = []

    def __call__(self, items):
        self.hashes += [it.hash for it in items]
        return torch.cat([truth(it.hash, sum(e - s + 1 for s, e in it.offsets)) * self.factor for it in items])


def _encoders():
    return {"IMAGE": _ModalityEncoder(1.0), "VIDEO": _ModalityEncoder(-2.0)}


def _video(h: int, start: int, frames: int = 2, length: int = 2) -> MMItem:
    spans = [(start + f * (length + 1), start + f * (length + 1) + length - 1) for f in range(frames)]
    return MMItem(modality="VIDEO", hash=h, offsets=spans, feature=torch.zeros(1))


def _item(h: int, start: int, length: int, modality: str) -> MMItem:
    return MMItem(modality=modality, hash=h, offsets=[(start, start + length - 1)], feature=torch.zeros(1))


@pytest.mark.parametrize("with_c_pass", [True, False], ids=["c-pass", "python-pass"])
@pytest.mark.parametrize("extra", ["none", "two-span video", "plain image"])
def test_one_hash_under_two_modalities_is_refused_whatever_else_is_in_the_step(monkeypatch, with_c_pass, extra):
    if not with_c_pass:
        monkeypatch.setattr(flat, "_flat_columns_c", None)
    conflicting = [RequestChunk(items=[_item(7, 0, 3, "VIDEO"), _item(7, 4, 3, "IMAGE")], prefix=0, extend=8)]
    others = {"none": [], "two-span video": [RequestChunk(items=[_video(90, 0)], prefix=0, extend=6)],
              "plain image": [RequestChunk(items=[_item(91, 0, 2, "IMAGE")], prefix=0, extend=3)]}[extra]
    for reqs in (conflicting + others, others + conflicting):
        cache = EmbeddingCache(1 << 20)
        encoders = _encoders()
        with pytest.raises(ConflictingHashError, match=r"item hash 7 is a IMAGE item of 3 tokens, and request \d+"
                                                       r" has a VIDEO item of 3 tokens with the same hash") as info:
            embed_chunk(reqs, encoders, cache=cache)
        assert info.value.item_hash == 7 and set(info.value.modalities) == {"IMAGE", "VIDEO"}
        assert isinstance(info.value, InvalidItemError)
        assert len(cache) == 0 and encoders["IMAGE"].hashes == encoders["VIDEO"].hashes == []


@pytest.mark.parametrize("with_c_pass", [True, False], ids=["c-pass", "python-pass"])
@pytest.mark.parametrize("lengths", [(4, 6), (6, 4), (3, 1)])
def test_one_hash_under_two_modalities_of_two_lengths_is_refused_too(monkeypatch, with_c_pass, lengths):
    """A hash under two modalities is refused whatever its lengths: kept apart as two
    sources, both would be encoded and the cache would keep whichever came last, so which
    rows a later step gets would depend on the company the hash kept."""
    if not with_c_pass:
        monkeypatch.setattr(flat, "_flat_columns_c", None)
    image, video = lengths
    a = RequestChunk(items=[_item(777, 0, image, "IMAGE")], prefix=0, extend=8)
    b = RequestChunk(items=[_item(777, 0, video, "VIDEO")], prefix=0, extend=8)
    for reqs, first in (([a, b], ("IMAGE", image)), ([b, a], ("VIDEO", video))):
        cache, encoders = EmbeddingCache(1 << 20), _encoders()
        with pytest.raises(ConflictingHashError, match=rf"request 0 has a {first[0]} item of {first[1]} tokens"
                                                       r" with the same hash") as info:
            embed_chunk(reqs, encoders, cache=cache)
        assert info.value.item_hash == 777 and info.value.modalities[0] == first[0]
        assert len(cache) == 0 and encoders["IMAGE"].hashes == encoders["VIDEO"].hashes == []
    # Alone, each is planned, encoded and cached as what it is; an item of the other
    # modality outside the window conflicts with nothing.
    cache, encoders = EmbeddingCache(1 << 20), _encoders()
    outside = RequestChunk(items=[_item(1, 0, 2, "IMAGE"), _item(777, 20, video, "VIDEO")], prefix=0, extend=8)
    result = embed_chunk([a, outside], encoders, cache=cache)
    assert torch.equal(result.embedding[:image], truth(777, image))
    assert encoders["IMAGE"].hashes == [777, 1] and encoders["VIDEO"].hashes == []


@st.composite
def _request(draw, hashes, base: int):
    """One request of random images and videos (some of two or three spans), hashes drawn
    from ``hashes``: a hash keeps one shape within a draw, and its modality usually (a
    hash drawn again may come as the other modality: a conflict the step must refuse)."""
    items, pos = [], draw(st.integers(0, 3))
    shapes: dict[int, tuple] = {}
    for _ in range(draw(st.integers(1, 4))):
        h = draw(st.sampled_from(hashes))
        if h not in shapes:
            shapes[h] = (draw(st.sampled_from(MODALITIES)), draw(st.integers(1, 3)), draw(st.integers(1, 4)))
        modality, spans, length = shapes[h]
        if spans == 1 and draw(st.integers(0, 3)) == 0:
            modality = "IMAGE" if modality == "VIDEO" else "VIDEO"
            length = draw(st.integers(1, 4))  # the other modality, of its own length or not
        if spans > 1 and modality == "VIDEO":
            item = _video(h, pos, spans, length)
        else:
            item = _item(h, pos, length, modality)
        items.append(item)
        pos = item.offsets[-1][1] + 1 + draw(st.integers(0, 2))
    prefix = draw(st.integers(0, 2))
    return RequestChunk(items=items, prefix=prefix, extend=pos + 1 - prefix)


def _outcome(reqs, index):
    """Request ``index``'s rows, which encoder got each of its hashes, and the entries
    cached under its items' keys; or the error the step raised."""
    cache, encoders = EmbeddingCache(1 << 24), _encoders()
    try:
        result = embed_chunk(reqs, encoders, cache=cache)
    except InvalidItemError as exc:
        return type(exc).__name__
    plan = result.plan
    rows = [result.embedding[p : p + n] for p, n, r in zip(plan.seg_packed_row, plan.seg_rows, plan.seg_request)
            if r == index]
    own = {it.hash for it in reqs[index].items}
    by_encoder = {m: sorted(h for h in enc.hashes if h in own) for m, enc in encoders.items()}
    entries = {}
    for key, request, modality in zip(plan.keys, plan.requests, plan.modalities):
        if request == index and cache.contains(key):
            entries[key] = (modality, cache.lookup(key))
    return torch.cat(rows) if rows else torch.empty(0, HIDDEN), by_encoder, entries


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_unrelated_requests_never_change_a_request_plan(data):
    base = data.draw(_request(list(range(1, 6)), 0))
    others = data.draw(st.lists(_request(list(range(100, 110)), 1), min_size=1, max_size=3))
    before = data.draw(st.integers(0, len(others)))
    alone = _outcome([base], 0)
    together = _outcome([*others[:before], base, *others[before:]], before)
    if isinstance(alone, str):
        assert together == alone  # a conflict inside the request is refused in any company
        return
    if isinstance(together, str):
        # The unrelated requests have hashes of their own: only a conflict among them
        # can refuse the step, and it refuses them without the base request too.
        assert isinstance(_outcome(others, 0), str)
        return
    rows, by_encoder, entries = alone
    rows2, by_encoder2, entries2 = together
    assert torch.equal(rows, rows2)
    assert by_encoder == by_encoder2
    assert entries.keys() == entries2.keys()
    for key, (modality, tensor) in entries.items():
        assert entries2[key][0] == modality and torch.equal(entries2[key][1], tensor)


@pytest.mark.parametrize("with_c_pass", [True, False], ids=["c-pass", "python-pass"])
@pytest.mark.parametrize("together", [True, False], ids=["one-request", "two-requests"])
def test_a_hash_of_a_multi_span_video_and_of_an_image_is_refused(monkeypatch, with_c_pass, together):
    """A video of several spans is cached under its request's combined key, yet its item
    hash still names one embedding: an image under the same hash conflicts with it."""
    if not with_c_pass:
        monkeypatch.setattr(flat, "_flat_columns_c", None)
    video, picture = _video(7, 0), _item(7, 6, 3, "IMAGE")
    reqs = ([RequestChunk(items=[video, picture], prefix=0, extend=10)] if together else
            [RequestChunk(items=[video], prefix=0, extend=6), RequestChunk(items=[picture], prefix=0, extend=10)])
    cache, encoders = EmbeddingCache(1 << 20), _encoders()
    with pytest.raises(ConflictingHashError, match=r"item hash 7 is a IMAGE item of 3 tokens, and request 0 has a"
                                                   r" VIDEO item of 4 tokens") as info:
        embed_chunk(reqs, encoders, cache=cache)
    assert info.value.modalities == ("VIDEO", "IMAGE")
    assert len(cache) == 0 and encoders["IMAGE"].hashes == encoders["VIDEO"].hashes == []


@pytest.mark.parametrize("with_c_pass", [True, False], ids=["c-pass", "python-pass"])
@pytest.mark.parametrize("steady", [True, False], ids=["all-cached", "partly-cached"])
def test_an_entry_of_another_modality_under_the_hash_is_never_served(monkeypatch, caplog, with_c_pass, steady):
    """Across steps, a hash cached for one modality and asked for as another is encoded
    again by the other modality's encoder and replaces the entry: a request's rows follow
    its own item, never whichever item was cached under the hash before (in one step the
    two are refused, above)."""
    if not with_c_pass:
        monkeypatch.setattr(flat, "_flat_columns_c", None)
    image, video = _item(7, 0, 4, "IMAGE"), _item(7, 0, 4, "VIDEO")
    other = [] if steady else [_item(8, 5, 2, "VIDEO")]
    cache = EmbeddingCache(1 << 20)
    encoders = _encoders()
    first = embed_chunk([RequestChunk(items=[image], prefix=0, extend=4)], encoders, cache=cache)
    assert torch.equal(first.embedding, truth(7, 4))
    for step, (item, factor) in enumerate([(video, -2.0), (image, 1.0), (video, -2.0)]):
        caplog.clear()
        result = embed_chunk([RequestChunk(items=[item, *other], prefix=0, extend=8)], encoders, cache=cache)
        assert torch.equal(result.embedding[:4], truth(7, 4) * factor), step
        # Hash 8 (partly cached) is encoded once, then served; hash 7 is encoded every step.
        assert result.report.cache_hits == int(step > 0 and not steady)
        assert result.report.items_encoded == 1 + (step == 0 and not steady)
        assert "cached as a" in caplog.text and f"asked for as a {item.modality}" in caplog.text
        assert cache.lookup_all([7], [4], [item.modality])[2]  # the entry is now the asking item's
    assert encoders["IMAGE"].hashes == [7, 7] and encoders["VIDEO"].hashes == ([7, 7] if steady else [7, 8, 7])
    # An entry set without a modality (SGLang's set) serves any.
    cache.set(9, torch.ones(4, HIDDEN))
    assert cache.lookup_all([9], [4], ["VIDEO"])[2] and cache.lookup_all([9], [4], ["IMAGE"])[2]


def test_a_cross_modality_entry_is_refused_by_the_c_lookup_and_the_python_one_alike(monkeypatch):
    from mm_schedule import cache as cache_module

    def run(c_pass):
        monkeypatch.setattr(cache_module, "_all_hits", c_pass)
        cache = EmbeddingCache(1 << 20)
        cache.insert_many([(1, torch.ones(2, HIDDEN)), (2, torch.ones(3, HIDDEN))], modalities=["IMAGE", "VIDEO"])
        found, _, every, _ = cache.lookup_all([1, 2], [2, 3], ["IMAGE", "IMAGE"])
        return [t is not None for t in found], every, cache.stats().hits

    c_side = run(cache_module._all_hits)
    assert c_side == run(None) == ([True, False], False, 1)


@pytest.mark.parametrize("order", ["image-first", "video-first"])
def test_a_combined_key_equal_to_an_image_hash_is_refused_in_one_step(order):
    """A video of several spans is cached under the combined key of its items' hashes: an
    image whose own hash equals that key would share its entry, so the step is refused
    as one hash under two modalities, whichever comes first."""
    from mm_schedule.keys import combine_hashes

    key = combine_hashes([5])
    video, picture = _video(5, 0), _item(key, 0, 4, "IMAGE")
    reqs = [RequestChunk(items=[video], prefix=0, extend=6), RequestChunk(items=[picture], prefix=0, extend=4)]
    if order == "video-first":
        reqs.reverse()
    cache, encoders = EmbeddingCache(1 << 20), _encoders()
    with pytest.raises(ConflictingHashError, match=rf"combined key|item hash {key}") as info:
        embed_chunk(reqs, encoders, cache=cache)
    assert set(info.value.modalities) == {"IMAGE", "VIDEO"}
    assert len(cache) == 0 and encoders["IMAGE"].hashes == encoders["VIDEO"].hashes == []
    # Alone, each is its own source; the later one replaces the entry it would have shared.
    for item, factor, extend in ((video, -2.0, 6), (picture, 1.0, 4), (video, -2.0, 6)):
        result = embed_chunk([RequestChunk(items=[item], prefix=0, extend=extend)], encoders, cache=cache)
        assert result.report.cache_hits == 0
        assert torch.equal(result.embedding, truth(item.hash, 4) * factor)
