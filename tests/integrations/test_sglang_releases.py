"""What changed between SGLang releases, each release's own module (from its wheel, on
CPU) against the stand-in bound as that release: CUDA-IPC features marked borrowed
(0.5.20+), cache hits acknowledged (until 0.5.21), features offloaded to the host waited
for (0.5.21+), audio items of several runs cached per item (0.5.22+), multi-span
requests encoded only in chunks that hold their rows (0.5.23), an empty placeholder set
refused (0.5.23)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.integrations.conftest import _process_module
from tests.integrations.test_sglang_standin import (
    HIDDEN,
    assert_same,
    assert_same_cache,
    chunked_steps,
    encoder_list,
    encoder_tensor,
)

pytestmark = pytest.mark.realworld

proc = _process_module()
Item, Modality = proc.MultimodalDataItem, proc.Modality
PAD = 99


def _image_steps(seed: int, *, deferred: bool = False):
    """Two chunked requests of single-span images, sharing one image (same hash, same
    length), so later chunks hit the cache; ``deferred`` marks every item's feature as a
    deferrable CUDA-IPC one."""
    rng = random.Random(seed)
    prompts = []
    for r in range(2):
        ids, items = [1] * rng.randint(0, 3), []
        for k in range(3):
            n = 4 if k == 0 else rng.randint(1, 6)
            h = 7000 if k == 0 else 7000 + 10 * r + k
            items.append(Item(hash=h, offsets=[(len(ids), len(ids) + n - 1)], pad_value=PAD,
                              feature=torch.zeros(1), deferred_ipc=deferred))
            ids += [PAD] * n + [1] * rng.randint(0, 2)
        prompts.append((ids, items))
    yield from chunked_steps(prompts, [rng.randint(3, 7) for _ in prompts], PAD)


def _copy(step):
    """A copy whose items are new objects with every field of the originals."""
    items = [Item(modality=o.modality, hash=o.hash, offsets=list(o.offsets), pad_value=o.pad_value,
                  feature=o.feature.clone(), precomputed_embeddings=o.precomputed_embeddings,
                  deferred_ipc=o.deferred_ipc) for o in step["embedding_items"]]
    return {**step, "embedding_items": items, "input_ids": step["input_ids"].clone()}


def _both(sglang, standin, steps, encoder):
    """Run the steps on both modules; per step, the items each side saw (to inspect)."""
    theirs = sglang.scheduler
    theirs.init_mm_embedding_cache(1 << 30)
    standin.init_mm_embedding_cache(1 << 30)
    seen = []
    for step in steps:
        a_step, b_step = _copy(step), _copy(step)
        a = theirs.get_embedding_and_mask(encoder, **a_step)
        b = standin.get_embedding_and_mask(encoder, **b_step)
        for x, y in zip(a, b):
            assert_same(x, y)
        assert_same_cache(theirs.embedding_cache, standin.embedding_cache)
        seen.append((a_step["embedding_items"], b_step["embedding_items"]))
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deferred_ipc_misses_are_marked_borrowed_as_the_release_does(sglang, standin, backend, seed):
    seen = _both(sglang, standin, _image_steps(seed, deferred=True), encoder_list)
    marked_any = False
    for theirs, ours in seen:
        assert [i.model_specific_data for i in theirs] == [i.model_specific_data for i in ours]
        marked_any |= any(i.model_specific_data for i in theirs)
    assert marked_any == (sglang.version >= "0.5.20")


@pytest.mark.parametrize("images", [False, True])
def test_cache_hits_are_acknowledged_as_the_release_does(sglang, standin, backend, images):
    """Hits of a request served whole (a video) are acknowledged until 0.5.22; hits of
    the batched per-image path never are."""
    seen = _both(sglang, standin, _image_steps(0) if images else _video_steps(), encoder_tensor)
    acknowledged = False
    for theirs, ours in seen:
        assert [i.acknowledged for i in theirs] == [i.acknowledged for i in ours]
        acknowledged |= any(i.acknowledged for i in theirs)
    assert acknowledged == (not images and sglang.version <= "0.5.21")


class CountingEvent:
    """A host-offload event that counts the waits for it."""

    def __init__(self) -> None:
        self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1


@pytest.mark.parametrize("precomputed", [False, True])
def test_features_offloaded_to_the_host_are_waited_for_as_the_release_does(sglang, standin, precomputed):
    theirs = sglang.scheduler
    assert hasattr(theirs, "host_offload_event") == hasattr(standin, "host_offload_event")
    if not hasattr(theirs, "host_offload_event"):
        pytest.skip(f"SGLang {sglang.version} has no host-offload event")
    events = {theirs: CountingEvent(), standin: CountingEvent()}
    steps = list(_image_steps(3))
    if precomputed:
        for step in steps:
            for item in step["embedding_items"]:
                item.precomputed_embeddings = torch.randn(item.offsets[0][1] - item.offsets[0][0] + 1, HIDDEN)
    try:
        for side, event in events.items():
            side.host_offload_event = event
        _both(sglang, standin, steps, encoder_list)
    finally:
        theirs.host_offload_event = standin.host_offload_event = None
    assert events[theirs].waits == events[standin].waits > 0


def _audio_steps(seed: int):
    """Requests of audio items with several runs each (interleaved with transcript text)."""
    rng = random.Random(seed)
    prompts = []
    for r in range(rng.randint(1, 3)):
        ids, items = [1] * rng.randint(0, 4), []
        for k in range(rng.randint(1, 2)):
            spans = []
            for _ in range(rng.randint(2, 3)):
                n = rng.randint(1, 4)
                spans.append((len(ids), len(ids) + n - 1))
                ids += [PAD] * n + [1] * rng.randint(1, 2)
            items.append(Item(modality=Modality.AUDIO, hash=8000 + 10 * r + k, offsets=spans, pad_value=PAD,
                              feature=torch.zeros(1)))
        prompts.append((ids, items))
    yield from chunked_steps(prompts, [rng.randint(3, 8) for _ in prompts], PAD)


@pytest.mark.parametrize("form", ["list", "tensor"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_audio_items_of_several_runs_are_cached_as_the_release_does(sglang, standin, backend, form, seed):
    encoder = encoder_list if form == "list" else encoder_tensor
    _both(sglang, standin, _audio_steps(seed), encoder)
    cache = sglang.scheduler.embedding_cache.mm_cache
    per_item = any(8000 <= key < 9000 for key in cache)
    assert per_item == (sglang.version >= "0.5.22")


def _video_steps():
    """One request: text, then a video of three spans, chunked so that the first chunk
    holds text only and a later one falls between two spans."""
    spans = [(6, 8), (12, 13), (16, 18)]
    ids = [1] * 20
    for s, e in spans:
        ids[s: e + 1] = [PAD] * (e - s + 1)
    for prefix in range(0, 20, 4):
        extend = min(4, 20 - prefix)
        yield dict(embedding_items=[Item(modality=Modality.VIDEO, hash=9100, offsets=list(spans), pad_value=PAD,
                                         feature=torch.zeros(1))],
                   placeholder_tensor=torch.tensor([PAD]), input_ids=torch.tensor(ids[prefix: prefix + extend]),
                   items_size=[0, 1], prefix_length=[prefix], extend_length=[extend], items_offset_list=[spans])


def test_a_multi_span_request_is_encoded_in_the_chunks_the_release_encodes_it(sglang, standin):
    """Without a cache every chunk that encodes the video encodes it again: until 0.5.23
    SGLang encodes it in every chunk up to its last span (the text-only first chunk
    included, returning no rows there), 0.5.23 only in chunks that hold its rows."""
    theirs = sglang.scheduler
    counts = {}
    for side in (theirs, standin):
        counts[side] = []
        side.init_mm_embedding_cache(0)
    for step in _video_steps():
        a = theirs.get_embedding_and_mask(lambda items: counts[theirs].append(1) or encoder_list(items), **_copy(step))
        b = standin.get_embedding_and_mask(lambda items: counts[standin].append(1) or encoder_list(items),
                                           **_copy(step))
        for x, y in zip(a, b):
            assert_same(x, y)
    assert len(counts[theirs]) == len(counts[standin]) == (4 if sglang.version >= "0.5.23" else 5)


def test_an_empty_placeholder_set_is_refused_from_0_5_23(sglang, standin):
    step = next(_image_steps(0))
    step["placeholder_tensor"] = torch.tensor([], dtype=torch.int64)
    sglang.scheduler.init_mm_embedding_cache(1 << 20)
    standin.init_mm_embedding_cache(1 << 20)
    if sglang.version < "0.5.23":
        pytest.skip(f"SGLang {sglang.version} marks nothing for an empty placeholder set")
    with pytest.raises(AssertionError):
        sglang.scheduler.get_embedding_and_mask(encoder_list, **_copy(step))
    with pytest.raises(ValueError, match="placeholder_tensor is empty"):
        standin.get_embedding_and_mask(encoder_list, **_copy(step))
