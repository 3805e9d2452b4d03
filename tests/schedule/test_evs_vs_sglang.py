"""EVS parity with SGLang 0.5.19's own ``get_embedding_and_mask`` on the same inputs.

SGLang's modules run from its official wheel (loaded by ``benchmarks/_sglang_wheels.py``);
the video's placeholder split comes from SGLang's processor helper and the pruning from
SGLang's own retention mask, so the frame counts are the ones SGLang would produce.
SGLang handles an EVS request only when it is the whole batch, so each step here is one
request. Marker ``realworld``: skipped when the package registry cannot be reached.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import mm_schedule
from mm_schedule import MMItem, StepContext
from mm_schedule.evs import PRE_CHUNKED_KEY, EVSEmbeddingResult

pytestmark = pytest.mark.realworld

LOADER = Path(__file__).resolve().parents[2] / "benchmarks" / "_sglang_wheels.py"
HIDDEN = 16


def _loader():
    spec = importlib.util.spec_from_file_location("mm_sglang_wheels", LOADER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sglang():
    wheels = _loader()
    try:
        return wheels.load_release("0.5.19")
    except wheels.WheelUnavailable as exc:
        pytest.skip(f"SGLang 0.5.19 wheel unavailable (registry unreachable?): {exc}")


class VideoItem(MMItem):
    """Our item plus what SGLang's EVS path reads from its own items."""

    def is_video(self) -> bool:
        return True

    @property
    def pre_chunked_input_ids(self):
        return self.model_specific_data[PRE_CHUNKED_KEY]

    def acknowledge_deferred_cuda_ipc_feature(self, consumer_count: int = 1) -> None:
        """No IPC transport on CPU."""


def _video(sglang, gen, *, frames, grid, q, h):
    """Prompt ids with SGLang's even placeholder split, the item, and the encoder output
    (SGLang's retention mask over random features)."""
    core = sglang.modules["sglang.srt.multimodal.evs.evs_core"]
    per_frame = core.tokens_per_frame(q=q, num_frames=frames, frame_num_tokens=grid * grid)
    pad = 1_000_000 + h
    ids = torch.randint(0, 1000, (int(torch.randint(0, 5, (1,), generator=gen)),), generator=gen).tolist()
    spans = []
    for f, n in enumerate(per_frame):
        spans.append((len(ids), len(ids) + n - 1))
        ids += [pad] * n
        if f < frames - 1:
            ids += torch.randint(0, 1000, (2,), generator=gen).tolist()  # frame separator text
    ids += torch.randint(0, 1000, (3,), generator=gen).tolist()
    features = torch.randn(frames * grid * grid, HIDDEN, generator=gen)
    keep = core.compute_retention_mask(features, video_size_thw=(frames, grid, grid), spatial_merge_size=1, q=q)
    rows = features[keep]
    kept = keep.reshape(frames, -1).sum(-1).tolist()
    item = VideoItem(modality="VIDEO", hash=h, offsets=spans, pad_value=pad, model_specific_data={PRE_CHUNKED_KEY: ids})
    return ids, item, rows, kept


def _effective(rows, mask, n):
    """SGLang returns an empty tensor and an all-false mask where we return None."""
    rows = torch.empty(0, HIDDEN) if rows is None else rows
    mask = torch.zeros(n, 1, dtype=torch.bool) if mask is None else mask
    return rows, mask


@pytest.mark.parametrize("ours_gets_their_class", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_chunked_prefill_matches_sglang(sglang, seed, ours_gets_their_class):
    gen = torch.Generator().manual_seed(seed)
    frames, grid, q = 2 + seed % 3, 3 + seed % 2, (0.3, 0.5, 0.7, 0.6)[seed]
    ids, item, rows, kept = _video(sglang, gen, frames=frames, grid=grid, q=q, h=100 + seed)
    theirs_cls = sglang.evs.EVSEmbeddingResult
    ours_cls = theirs_cls if ours_gets_their_class else EVSEmbeddingResult
    calls = {"ours": 0, "theirs": 0}

    def encoder(side, cls):
        def encode(items):
            assert items == [item]
            calls[side] += 1
            return cls(embedding=rows.clone(), num_tokens_per_frame=list(kept))
        return encode

    sglang.scheduler.init_mm_embedding_cache(64 << 20)
    mm_schedule.init_mm_embedding_cache(64 << 20)
    mm_schedule.set_step_context(StepContext(on_cache_hit=None))
    rewritten = 0
    try:
        chunk = 5 + seed
        for prefix in range(0, len(ids), chunk):
            extend = min(chunk, len(ids) - prefix)
            args = (
                [item], torch.tensor([item.pad_value]), torch.tensor(ids[prefix : prefix + extend]),
                [0, 1], [prefix], [extend], [list(item.offsets)],
            )
            t_rows, t_mask, t_ids = sglang.scheduler.get_embedding_and_mask(encoder("theirs", theirs_cls), *args)
            o_rows, o_mask, o_ids = mm_schedule.get_embedding_and_mask(encoder("ours", ours_cls), *args)
            assert torch.equal(o_ids, t_ids), (prefix, extend)
            for mine, theirs in zip(_effective(o_rows, o_mask, extend), _effective(t_rows, t_mask, extend)):
                assert mine.shape == theirs.shape and torch.equal(mine, theirs), (prefix, extend)
            rewritten += not torch.equal(t_ids, args[2])
    finally:
        mm_schedule.set_step_context(StepContext())
    assert rewritten > 0, "no step moved a placeholder: the case does not exercise EVS"
    assert calls["ours"] == 1 and calls["theirs"] >= 1  # the pruned video is cached
