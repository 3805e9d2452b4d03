"""The stand-in keeps the cache's layout rule on every path of SGLang's call graph: a
declared layout refuses a faulty first output, entries of an unconfirmed layout change
are never served, a step counts as one insert however its requests are encoded, and a
cached entry holds only its own rows. Rows are checked exactly against encoder outputs
computed independently from each item's hash."""

from __future__ import annotations

import random

import pytest
import torch

from mm_schedule import MMItem
from mm_schedule.errors import CacheLayoutError
from mm_schedule.integrations.sglang import sglang_behaviour

PAD = 7
TEXT = 1


class AudioItem(MMItem):
    def is_audio(self) -> bool:
        return True


def true_rows(item, hidden: int, dtype=torch.float32) -> torch.Tensor:
    """What a correct encoder returns for ``item``: fixed by its hash, so a test can
    compute it without the stand-in."""
    gen = torch.Generator().manual_seed(item.hash % (1 << 62))
    n = sum(end - start + 1 for start, end in item.offsets)
    return torch.randn(n, hidden, generator=gen).to(dtype)


def per_item(hidden: int, dtype=torch.float32, calls: list | None = None):
    def encode(items):
        if calls is not None:
            calls.append([item.hash for item in items])
        return [true_rows(item, hidden, dtype) for item in items]
    return encode


def combined(hidden: int, dtype=torch.float32, calls: list | None = None):
    def encode(items):
        if calls is not None:
            calls.append([item.hash for item in items])
        return torch.cat([true_rows(item, hidden, dtype) for item in items])
    return encode


ENCODERS = {"list": per_item, "tensor": combined}


def prompt(rng: random.Random, kind: str, hashes: list[int]):
    """``(token ids, items)`` of one request: each item's runs (one for ``image``,
    several for ``audio`` / ``video``) placed one after the other, text between."""
    ids, items = [TEXT] * rng.randint(0, 3), []
    for h in hashes:
        spans = []
        for _ in range(1 if kind == "image" else rng.randint(2, 4)):
            n = rng.randint(1, 5)
            spans.append((len(ids), len(ids) + n - 1))
            ids += [PAD] * n + [TEXT] * rng.randint(1, 3)
        cls = AudioItem if kind == "audio" else MMItem
        items.append(cls(modality=kind.upper(), hash=h, offsets=spans, pad_value=PAD, feature=torch.zeros(1)))
    return ids, items


def step_args(prompts):
    """``get_embedding_and_mask``'s arguments (after the encoder) for whole prompts in one chunk."""
    items, sizes, offsets, ids = [], [0], [], []
    for tokens, its in prompts:
        items += its
        sizes.append(len(items))
        offsets.append([span for item in its for span in item.offsets])
        ids += tokens
    n = len(prompts)
    return (items, torch.tensor([PAD]), torch.tensor(ids), sizes, [0] * n,
            [len(tokens) for tokens, _ in prompts], offsets)


def expected_rows(prompts, hidden: int, dtype=torch.float32) -> torch.Tensor:
    return torch.cat([true_rows(item, hidden, dtype) for _, its in prompts for item in its])


def fresh_hashes(rng: random.Random, n: int) -> list[int]:
    return rng.sample(range(1, 1 << 40), n)


def key_of(standin, item):
    """The cache key the call graph files ``item``'s rows under (a multi-span video's
    request is cached whole, under its combined key)."""
    if item.modality == "VIDEO":
        return standin.MultiModalStaticCache.combine_hashes([item.hash])
    return item.hash


def run(standin, encoder, prompts):
    rows, mask, _ = standin.get_embedding_and_mask(encoder, *step_args(prompts))
    return rows, mask


@pytest.fixture
def call_graph(standin, monkeypatch):
    """Walk SGLang's call graph: a name of it rebound, as a test or fork patching it would."""
    original = standin._get_multimodal_mask
    monkeypatch.setattr(standin, "_get_multimodal_mask", lambda ids, pads: original(ids, pads))
    return standin


def per_request_backend(standin, monkeypatch):
    monkeypatch.setattr(standin, "_is_hip", True)
    return sglang_behaviour(batch_on_every_backend=False)


# -- a declared layout refuses a faulty first output ---------------------------------------


@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"])
@pytest.mark.parametrize("form", sorted(ENCODERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_declared_layout_refuses_a_faulty_first_output_of_audio_items_of_several_runs(
        standin, release, form, seed):
    rng = random.Random(seed)
    hidden = rng.randint(4, 24)
    standin.use_release(release)
    standin.init_mm_embedding_cache(1 << 20, hidden_sizes=hidden, dtypes=torch.float32)
    cache = standin.embedding_cache
    prompts = [prompt(rng, "audio", fresh_hashes(rng, rng.randint(1, 4)))]
    with pytest.raises(CacheLayoutError, match=rf"hidden size {hidden - 1}.*declared for AUDIO"):
        run(standin, ENCODERS[form](hidden - 1), prompts)
    assert len(cache) == 0
    with pytest.raises(CacheLayoutError, match=r"float64.*declared for AUDIO"):
        run(standin, ENCODERS[form](hidden, torch.float64), prompts)
    assert len(cache) == 0
    calls = []
    rows, _ = run(standin, ENCODERS[form](hidden, calls=calls), prompts)
    assert torch.equal(rows, expected_rows(prompts, hidden))
    # Served from the cache now: the same rows, no encoder call.
    rows, _ = run(standin, ENCODERS[form](hidden, calls=calls), prompts)
    assert torch.equal(rows, expected_rows(prompts, hidden)) and len(calls) == 1


@pytest.mark.parametrize("form", sorted(ENCODERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_declared_layout_refuses_a_faulty_multi_span_request_on_the_call_graph(call_graph, monkeypatch, form, seed):
    standin = call_graph
    rng = random.Random(seed)
    hidden = rng.randint(4, 24)
    standin.init_mm_embedding_cache(1 << 20, hidden_sizes=hidden, dtypes=torch.float32)
    cache = standin.embedding_cache
    prompts = [prompt(rng, "video", fresh_hashes(rng, 1)) for _ in range(rng.randint(1, 3))]
    with pytest.raises(CacheLayoutError, match=rf"hidden size {hidden + 1}.*declared for VIDEO"):
        run(standin, ENCODERS[form](hidden + 1), prompts)
    assert len(cache) == 0
    # Nothing faulty was cached for a planned step (nothing patched) to serve.
    monkeypatch.undo()
    calls = []
    rows, _ = run(standin, ENCODERS[form](hidden, calls=calls), prompts)
    assert torch.equal(rows, expected_rows(prompts, hidden)) and calls


# -- an unconfirmed layout change is not served --------------------------------------------


PATHS = ["per-image batch", "multi-span request", "audio of several runs", "per-request backend"]


def _path_setup(standin, monkeypatch, path):
    """The modality and a context of the stand-in walking ``path`` of the call graph."""
    original = standin._get_multimodal_mask
    monkeypatch.setattr(standin, "_get_multimodal_mask", lambda ids, pads: original(ids, pads))
    if path == "per-request backend":
        return "image", per_request_backend(standin, monkeypatch)
    kind = {"per-image batch": "image", "multi-span request": "video", "audio of several runs": "audio"}[path]
    return kind, sglang_behaviour(batch_on_every_backend=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("seed", [0, 1])
def test_entries_of_an_unconfirmed_layout_change_are_never_served(standin, monkeypatch, path, seed):
    rng = random.Random(seed)
    hidden = rng.randint(4, 24)
    kind, behaviour = _path_setup(standin, monkeypatch, path)
    standin.init_mm_embedding_cache(1 << 20)
    cache = standin.embedding_cache
    modality = kind.upper()
    first, second = fresh_hashes(rng, 2)
    with behaviour:
        learned = [prompt(rng, kind, [first])]
        run(standin, per_item(hidden), learned)
        cache.free(key_of(standin, learned[0][1][0]))  # the modality's only entry: its layout is forgotten
        prompts = [prompt(rng, kind, [second])]
        faulty, _ = run(standin, per_item(hidden, torch.float64), prompts)
        assert faulty.dtype == torch.float64 and cache.layout_changing(modality)
        calls = []
        rows, _ = run(standin, per_item(hidden, calls=calls), prompts)
    # Encoded again, not served: the correct rows, and the change undone.
    assert calls == [[second]]
    assert rows.dtype == torch.float32 and torch.equal(rows, expected_rows(prompts, hidden))
    assert not cache.layout_changing(modality) and cache.layout_of(modality) == (hidden, torch.float32)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_unconfirmed_entry_is_not_read_by_the_internal_names_either(standin, seed):
    rng = random.Random(seed)
    hidden = rng.randint(4, 24)
    standin.init_mm_embedding_cache(1 << 20)
    cache = standin.embedding_cache
    first, second = fresh_hashes(rng, 2)
    run(standin, per_item(hidden), [prompt(rng, "image", [first])])
    cache.free(first)
    ids, items = prompt(rng, "image", [second])
    run(standin, per_item(hidden, torch.float64), [(ids, items)])
    assert cache.layout_changing("IMAGE")
    calls = []
    info = standin.PerImageRequestInfo(req_idx=0, items=items, items_offset=list(items[0].offsets),
                                       extend_prefix_len=0, extend_seq_len=len(ids))
    table = standin._batch_encode_per_image_misses(per_item(hidden, calls=calls), [info], torch.device("cpu"))
    assert calls == [[second]]
    (whole,) = table.values()
    assert torch.equal(whole, true_rows(items[0], hidden))


# -- one step is one insert ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["image", "video"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_faulty_step_of_several_requests_decides_nothing_alone(standin, monkeypatch, kind, seed):
    rng = random.Random(seed)
    hidden = rng.randint(4, 24)
    modality = kind.upper()
    if kind == "image":
        behaviour = per_request_backend(standin, monkeypatch)
    else:  # multi-span requests: one encoder call each, on every backend
        original = standin._get_multimodal_mask
        monkeypatch.setattr(standin, "_get_multimodal_mask", lambda ids, pads: original(ids, pads))
        behaviour = sglang_behaviour(batch_on_every_backend=True)
    standin.init_mm_embedding_cache(1 << 20)
    cache = standin.embedding_cache
    with behaviour:
        first = prompt(rng, kind, fresh_hashes(rng, 1))
        run(standin, per_item(hidden), [first])
        cache.free(key_of(standin, first[1][0]))
        n = rng.randint(3, 5)
        faulty = [prompt(rng, kind, fresh_hashes(rng, 1)) for _ in range(n)]
        calls = []
        rows, _ = run(standin, per_item(hidden, torch.float64, calls), faulty)
        assert len(calls) == n and rows.dtype == torch.float64
        assert cache.layout_changing(modality)
        good = [prompt(rng, kind, fresh_hashes(rng, 1)) for _ in range(rng.randint(1, 3))]
        rows, _ = run(standin, per_item(hidden), good)
        assert torch.equal(rows, expected_rows(good, hidden))
        assert cache.layout_of(modality) == (hidden, torch.float32) and not cache.layout_changing(modality)


def test_three_steps_still_confirm_a_layout_change(standin, monkeypatch):
    rng = random.Random(5)
    hidden = 12
    standin.init_mm_embedding_cache(1 << 20)
    cache = standin.embedding_cache
    with per_request_backend(standin, monkeypatch):
        first = prompt(rng, "image", fresh_hashes(rng, 1))
        run(standin, per_item(hidden), [first])
        cache.free(first[1][0].hash)
        for k in range(3):
            assert k == 0 or cache.layout_changing("IMAGE")
            steps = [prompt(rng, "image", fresh_hashes(rng, 1)) for _ in range(2)]
            rows, _ = run(standin, per_item(hidden, torch.float64), steps)
            assert torch.equal(rows, expected_rows(steps, hidden, torch.float64))
        assert not cache.layout_changing("IMAGE") and cache.layout_of("IMAGE") == (hidden, torch.float64)
        with pytest.raises(CacheLayoutError, match="float32"):
            run(standin, per_item(hidden), [prompt(rng, "image", fresh_hashes(rng, 1))])


@pytest.mark.parametrize("seed", [0, 1])
def test_requests_of_one_step_read_each_others_outputs_before_they_are_cached(standin, monkeypatch, seed):
    rng = random.Random(seed)
    hidden = rng.randint(4, 24)
    standin.init_mm_embedding_cache(1 << 20)
    shared = fresh_hashes(rng, 1)
    # Two requests showing one image: identical offsets, so the hash has one length.
    tokens, items = prompt(rng, "image", shared)
    twin = (list(tokens), [MMItem(modality="IMAGE", hash=shared[0], offsets=list(items[0].offsets),
                                  pad_value=PAD, feature=torch.zeros(1))])
    prompts = [(tokens, items), twin]
    calls = []
    with per_request_backend(standin, monkeypatch):
        rows, _ = run(standin, per_item(hidden, calls=calls), prompts)
    assert calls == [shared]
    assert torch.equal(rows, expected_rows(prompts, hidden))
    assert torch.equal(standin.embedding_cache.get_single(shared[0]).embedding, true_rows(items[0], hidden))


def test_an_encoder_reusing_its_buffer_across_one_steps_requests_caches_no_overwritten_rows(standin, monkeypatch):
    rng = random.Random(9)
    hidden = 10
    buffer = torch.empty(64, hidden)

    def reusing(items):
        rows = torch.cat([true_rows(item, hidden) for item in items])
        buffer[: rows.shape[0]] = rows
        return buffer[: rows.shape[0]]

    standin.init_mm_embedding_cache(1 << 20)
    cache = standin.embedding_cache
    prompts = [prompt(rng, "image", fresh_hashes(rng, 1)) for _ in range(3)]
    with per_request_backend(standin, monkeypatch):
        run(standin, reusing, prompts)
    held = [item for _, its in prompts for item in its if cache.has(item.hash)]
    assert held
    for item in held:
        assert torch.equal(cache.get_single(item.hash).embedding, true_rows(item, hidden))


# -- an entry holds only its own rows ------------------------------------------------------


@pytest.mark.parametrize("release", ["0.5.22", "0.5.23"])
@pytest.mark.parametrize("form", ["tensor", "views"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_cached_audio_entry_owns_only_its_rows(standin, release, form, seed):
    rng = random.Random(seed)
    hidden = rng.randint(4, 64)
    standin.use_release(release)
    standin.init_mm_embedding_cache(1 << 30)
    cache = standin.embedding_cache
    prompts = [prompt(rng, "audio", fresh_hashes(rng, rng.randint(2, 8)))]

    def encoder(items):
        out = torch.cat([true_rows(item, hidden) for item in items])
        if form == "tensor":
            return out
        return list(out.split([sum(e - s + 1 for s, e in item.offsets) for item in items]))

    rows, _ = run(standin, encoder, prompts)
    assert torch.equal(rows, expected_rows(prompts, hidden))
    items = prompts[0][1]
    for item in items:
        entry = cache.get_single(item.hash).embedding
        assert torch.equal(entry, true_rows(item, hidden))
        assert entry.untyped_storage().nbytes() == entry.numel() * entry.element_size()
    kept = rng.choice(items)
    for item in items:
        if item is not kept:
            cache.free(item.hash)
    entry = cache.get_single(kept.hash).embedding
    assert cache.stats().bytes == entry.untyped_storage().nbytes() == entry.numel() * entry.element_size()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_multi_span_request_entry_owns_only_its_rows(call_graph, seed):
    standin = call_graph
    rng = random.Random(seed)
    hidden = rng.randint(4, 64)
    standin.init_mm_embedding_cache(1 << 30)
    cache = standin.embedding_cache
    prompts = [prompt(rng, "video", fresh_hashes(rng, 1))]
    spare = rng.randint(1, 50)

    def encoder(items):  # the rows as the front of a larger buffer
        rows = torch.cat([true_rows(item, hidden) for item in items])
        return torch.cat([rows, torch.zeros(spare, hidden)])[: rows.shape[0]]

    rows, _ = run(standin, encoder, prompts)
    assert torch.equal(rows, expected_rows(prompts, hidden))
    key = standin.MultiModalStaticCache.combine_hashes([prompts[0][1][0].hash])
    entry = cache.get_single(key).embedding
    assert torch.equal(entry, true_rows(prompts[0][1][0], hidden))
    assert cache.stats().bytes == entry.untyped_storage().nbytes() == entry.numel() * entry.element_size()
