"""What each rank of a multi-process test runs (imported by spawned processes, so it
lives in a plain module, not in a test file).

One spawn of four processes runs every scenario in two 2-rank groups and then in the
4-rank group (see ``run_rank``); each rank records what it saw (outputs, statuses,
what it encoded, what its cache held, errors) and the test process, which owns the
single-process reference, checks the records.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from evs_inputs import EVSEncoder, Prompt, layout  # on sys.path: see test_ranks.py
from helpers import HIDDEN, CountingEncoder, item_rows, truth

import mm_schedule
from mm_schedule import (
    EmbeddingCache,
    MMItem,
    RequestChunk,
    StepContext,
    embed_chunk,
    merge_chunk,
    plan_step,
)
from mm_schedule.evs import EVSEmbeddingResult
from mm_schedule.keys import combine_hashes

ROW_BYTES = HIDDEN * 4
POOL = list(range(1, 25))  # image hashes shared by all prompts; rows depend on the hash
# Per-rank cache budgets in rows, deliberately different (rank 2's evicts every step).
BUDGET_ROWS = [10_000, 40, 6, 120]
JOIN_STEP = 3  # the last rank replaces its cache with an empty one before this step
TIMEOUT_S = 1


def image_rows(h: int) -> int:
    return 1 + h % 6


def steps(seed: int, n_rounds: int = 3, chunk: int = 9) -> list[list[RequestChunk]]:
    """Chunked prefill of a few rounds of prompts: shared images (hits across requests
    and steps), fresh images, and multi-span video items (whole-request entries)."""
    rng = random.Random(seed)
    out = []
    fresh = 1_000
    for round_ in range(n_rounds):
        prompts = []
        for r in range(rng.randint(2, 4)):
            pos, items = rng.randint(0, 2), []
            for j in range(rng.randint(1, 3)):
                kind = rng.choice(["shared", "shared", "fresh", "video"])
                if kind == "video" and not items:
                    spans = []
                    for _ in range(rng.randint(2, 3)):
                        n = rng.randint(1, 3)
                        spans.append((pos, pos + n - 1))
                        pos += n + 1
                    h = 50_000 + 100 * round_ + 10 * r + j
                    items.append(MMItem(modality="VIDEO", hash=h, offsets=spans, feature=torch.zeros(1)))
                    continue
                if kind == "fresh":
                    fresh += 1
                    h, n = fresh, rng.randint(1, 5)
                else:
                    h = rng.choice(POOL)
                    n = image_rows(h)
                items.append(MMItem(hash=h, offsets=[(pos, pos + n - 1)], feature=torch.zeros(1)))
                pos += n + rng.randint(0, 2)
            prompts.append((items, pos + 1))
        for s in range(max(length for _, length in prompts) // chunk + 1):
            reqs = [
                RequestChunk(items=items, prefix=s * chunk, extend=max(0, min(chunk, length - s * chunk)))
                for items, length in prompts
            ]
            if any(r.extend for r in reqs):
                out.append(reqs)
    return out


def source_truth(source) -> torch.Tensor:
    return torch.cat([truth(int(it.hash), item_rows(it)) for it in source.items])


class FaultyEncoder(CountingEncoder):
    """While ``armed``: raises, returns a row short, or returns a wider hidden size."""

    def __init__(self, mode: str):
        super().__init__()
        self.mode = mode
        self.armed = False

    def __call__(self, items):
        out = super().__call__(items)
        if not self.armed:
            return out
        if self.mode == "raise":
            raise RuntimeError("simulated encoder crash")
        if self.mode == "hidden":
            return torch.cat([out, out[:, :1]], dim=1)
        return out[:-1]


def _history(cache: EmbeddingCache, rank: int) -> None:
    # A rank-specific insertion (and so eviction) history over the shared images.
    rng = random.Random(100 + rank)
    for h in rng.sample(POOL, 8 + 4 * rank):
        cache.insert(h, truth(h, image_rows(h)))


def _error(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "rank": getattr(exc, "rank", None),
        "request": getattr(exc, "request", None),
        "item_hash": getattr(exc, "item_hash", None),
    }


def consistent_steps(
    rank: int, world: int, group, *, parallel: bool, fused: bool, seed: int, rows_group=None
) -> list[dict]:
    cache = EmbeddingCache(BUDGET_ROWS[rank % len(BUDGET_ROWS)] * ROW_BYTES)
    _history(cache, rank)
    enc = CountingEncoder(as_list=rank % 2 == 1)
    ctx = StepContext(
        group=group,
        encoder_parallel=parallel,
        rows_group=rows_group,
        max_tokens_per_encoder_call=12 if fused else None,
    )
    records = []
    for index, reqs in enumerate(steps(seed)):
        if index == JOIN_STEP and rank == world - 1:
            cache = EmbeddingCache(BUDGET_ROWS[rank % len(BUDGET_ROWS)] * ROW_BYTES)
        keys = [s.key for s in plan_step(reqs, None).sources]
        held = [cache.contains(k) for k in keys]
        enc.calls.clear()
        if fused:
            total = sum(r.extend for r in reqs)
            embeds = torch.full((total, HIDDEN), float("nan"))
            result = merge_chunk(embeds, reqs, enc, cache=cache, context=ctx)
            output = embeds
        else:
            result = embed_chunk(reqs, enc, cache=cache, context=ctx)
            output = result.embedding
        cached_right = all(
            torch.equal(cache.lookup(s.key), source_truth(s)) for s in result.plan.sources if cache.contains(s.key)
        )
        records.append(
            {
                "output": output,
                "keys": keys,
                "held": held,
                "status": [s.status.value for s in result.plan.sources],
                "source_hashes": [[int(it.hash) for it in s.items] for s in result.plan.sources],
                "rows": [s.rows for s in result.plan.sources],
                "encoded": [h for call in enc.calls for h in call],
                "calls": len(enc.calls),
                "reported_calls": result.report.encoder_calls,
                "cached_right": cached_right,
            }
        )
    return records


FRESH = 9_000


def fault_step(world: int) -> list[RequestChunk]:
    """Two fresh images per rank (so every rank owns a miss) beside a cached one."""
    return [
        RequestChunk(
            items=[
                MMItem(hash=FRESH + 10 * r + j, offsets=[(4 * j, 4 * j + 1 + j)], feature=torch.zeros(1))
                for j in range(2)
            ]
            + [MMItem(hash=7, offsets=[(10, 12)], feature=torch.zeros(1))],
            prefix=0,
            extend=14,
        )
        for r in range(world)
    ]


def faults(rank: int, world: int, group, *, parallel: bool, mode: str) -> dict:
    """Step 0 warms the caches; step 1 (fresh images, enough for every rank to own
    one) fails on rank 1 only; step 2 repeats step 1 with a working encoder."""
    cache = EmbeddingCache(10_000 * ROW_BYTES)
    enc = FaultyEncoder(mode)
    ctx = StepContext(group=group, encoder_parallel=parallel)
    warm = [RequestChunk(items=[MMItem(hash=h, offsets=[(0, 2)], feature=torch.zeros(1))], prefix=0, extend=3) for h in (7, 8)]
    embed_chunk(warm, enc, cache=cache, context=ctx)
    fresh = fault_step(world)
    enc.armed = rank == 1
    record: dict = {"error": None}
    try:
        embed_chunk(fresh, enc, cache=cache, context=ctx)
    except Exception as exc:
        record["error"] = _error(exc)
    record["fresh_cached"] = [k for k in range(FRESH, FRESH + 10 * world) if cache.contains(k)]
    record["warm_cached"] = [cache.contains(7), cache.contains(8)]
    enc.armed = False
    record["after"] = embed_chunk(fresh, enc, cache=cache, context=ctx).embedding
    return record


def bad_entry(rank: int, world: int, group) -> dict:
    """Rank 1's cache holds an entry unfit for the step (integer rows under a hit's key);
    the others hold the right rows. Then the same step again."""
    cache = EmbeddingCache(10_000 * ROW_BYTES)
    reqs = fault_step(world)
    embed_chunk(reqs, CountingEncoder(), cache=cache, context=StepContext(group=group))
    if rank == 1:
        cache.insert(7, torch.zeros(3, HIDDEN, dtype=torch.int64))
    record: dict = {"error": None}
    try:
        embed_chunk(reqs, CountingEncoder(), cache=cache, context=StepContext(group=group))
    except Exception as exc:
        record["error"] = _error(exc)
    enc = CountingEncoder()
    record["after"] = embed_chunk(reqs, enc, cache=cache, context=StepContext(group=group)).embedding
    record["encoded_after"] = enc.calls
    record["entry_right"] = torch.equal(cache.lookup(7), truth(7, 3))
    return record


MANY = 320  # distinct keys in one step: more than the agreement's first round carries


def many_keys_step() -> list[RequestChunk]:
    items = [MMItem(hash=20_000 + i, offsets=[(2 * i, 2 * i)], feature=torch.zeros(1)) for i in range(MANY)]
    return [RequestChunk(items=items, prefix=0, extend=2 * MANY)]


def many_keys(rank: int, world: int, group) -> dict:
    """Rank r holds every (r + 2)-th key; a key is a hit only where all ranks hold it."""
    cache = EmbeddingCache(10_000 * ROW_BYTES)
    for i in range(0, MANY, rank + 2):
        cache.insert(20_000 + i, truth(20_000 + i, 1))
    result = embed_chunk(many_keys_step(), CountingEncoder(), cache=cache, context=StepContext(group=group))
    return {"output": result.embedding, "status": [s.status.value for s in result.plan.sources]}


class Float64Encoder(CountingEncoder):
    def __call__(self, items):
        return super().__call__(items).double()


def mixed_step(world: int) -> list[RequestChunk]:
    """Images and audio clips in each request, fresh every time: every rank owns some."""
    return [
        RequestChunk(
            items=[
                MMItem(modality=modality, hash=40_000 + 10 * r + j, offsets=[(5 * j, 5 * j + 1 + j % 3)], feature=torch.zeros(1))
                for j, modality in enumerate(["IMAGE", "AUDIO", "IMAGE", "AUDIO"])
            ],
            prefix=0,
            extend=20,
        )
        for r in range(world)
    ]


def mixed_dtypes(rank: int, world: int, group) -> Any:
    """A fused step whose image encoder returns float32 and audio encoder float64."""
    reqs = mixed_step(world)
    embeds = torch.full((sum(r.extend for r in reqs), HIDDEN), float("nan"))
    encoders = {"IMAGE": CountingEncoder(), "AUDIO": Float64Encoder()}
    merge_chunk(embeds, reqs, encoders, cache=EmbeddingCache(1 << 20), context=StepContext(group=group, encoder_parallel=True))
    return embeds


def precomputed_step() -> list[RequestChunk]:
    return [
        RequestChunk(
            items=[MMItem(hash=h, offsets=[(4 * j, 4 * j + 2)], precomputed_embeddings=truth(h, 3)) for j, h in enumerate(hashes)],
            prefix=0,
            extend=12,
        )
        for hashes in ((31, 32), (33,))
    ]


def precomputed(rank: int, world: int, group) -> Any:
    """Precomputed embeddings are never cached or encoded: nothing to agree on but the step."""
    ctx = StepContext(group=group, encoder_parallel=True)
    return embed_chunk(precomputed_step(), CountingEncoder(), cache=EmbeddingCache(1 << 20), context=ctx).embedding


def mismatch(rank: int, world: int, group) -> dict:
    """Rank 1 schedules a different batch than the others; then all schedule the same."""
    ctx = StepContext(group=group)
    cache = EmbeddingCache(10_000 * ROW_BYTES)
    n_items = 3 if rank == 1 else 2
    reqs = [RequestChunk(items=[MMItem(hash=h, offsets=[(3 * h, 3 * h + 1)], feature=torch.zeros(1)) for h in range(n_items)], prefix=0, extend=12)]
    record: dict = {"error": None}
    try:
        embed_chunk(reqs, CountingEncoder(), cache=cache, context=ctx)
    except Exception as exc:
        record["error"] = _error(exc)
    record["cached"] = len(cache)
    same = [RequestChunk(items=reqs[0].items[:2], prefix=0, extend=12)]
    record["after"] = embed_chunk(same, CountingEncoder(), cache=cache, context=ctx).embedding
    return record


def absent_rank(rank: int, world: int, group) -> dict:
    """The last rank never arrives at a step on ``group`` (which has a short timeout)."""
    record: dict = {"error": None}
    if rank == world - 1:
        time.sleep(TIMEOUT_S + 1.5)  # alive but elsewhere, so the others see a timeout, not a closed peer
        return record
    reqs = [RequestChunk(items=[MMItem(hash=5, offsets=[(0, 1)], feature=torch.zeros(1))], prefix=0, extend=2)]
    try:
        embed_chunk(reqs, CountingEncoder(), cache=EmbeddingCache(1 << 20), context=StepContext(group=group))
    except Exception as exc:
        record["error"] = _error(exc)
    return record


PAD = 5


def images_only(reqs: list[RequestChunk]) -> list[RequestChunk]:
    return [
        RequestChunk(items=[it for it in r.items if it.modality == "IMAGE"], prefix=r.prefix, extend=r.extend)
        for r in reqs
    ]


def sglang_compat(rank: int, world: int, group, seed: int) -> dict:
    """SGLang's function, with the group set once in the step context and the module cache."""
    mm_schedule.init_mm_embedding_cache(1 << 20)
    mm_schedule.set_step_context(StepContext(group=group, encoder_parallel=True))
    enc = CountingEncoder()
    outputs = []
    try:
        for reqs in steps(seed):
            reqs = images_only(reqs)
            items = [it for r in reqs for it in r.items]
            sizes = [0]
            for r in reqs:
                sizes.append(sizes[-1] + len(r.items))
            ids = torch.cat(
                [
                    torch.tensor(
                        [PAD if any(s <= p <= e for it in r.items for s, e in it.offsets) else 0
                         for p in range(r.prefix, r.prefix + r.extend)],
                        dtype=torch.int64,
                    )
                    for r in reqs
                ]
            )
            embedding, _mask, _ids = mm_schedule.get_embedding_and_mask(
                enc, items, torch.tensor([PAD]), ids, sizes, [r.prefix for r in reqs], [r.extend for r in reqs],
                [[s for it in r.items for s in it.offsets] for r in reqs],
            )
            outputs.append(embedding)
    finally:
        mm_schedule.set_step_context(StepContext())
    return {"outputs": outputs, "encoded": enc.items_encoded}


# -- EVS videos (resolved outside the plan, agreed and settled like planned items) -----------

EVS_CHUNK = 7


def evs_prompts() -> list[Prompt]:
    """Two EVS videos (one per request) and a plain multi-span video."""
    rng = random.Random(77)
    return [Prompt(rng, 60_001, frames=3), Prompt(rng, 60_002, frames=2), Prompt(rng, 60_003, frames=2, evs=False)]


def evs_windows(prompts: list[Prompt], step: int) -> list[tuple[int, int]]:
    at = step * EVS_CHUNK
    return [(min(at, len(p.ids)), max(0, min(EVS_CHUNK, len(p.ids) - at))) for p in prompts]


def evs_step_count(prompts: list[Prompt]) -> int:
    return max(len(p.ids) for p in prompts) // EVS_CHUNK + 1


def evs_key(p: Prompt) -> int:
    return combine_hashes([p.video.hash])


def evs_lose_step(prompts: list[Prompt]) -> int:
    """A later chunk of the first video's request that still reads the video."""
    spans = prompts[0].video.offsets
    return next(s for s in range(1, evs_step_count(prompts))
                if s * EVS_CHUNK <= spans[-1][1] and (s + 1) * EVS_CHUNK > spans[0][0])


class FaultyEVSEncoder(EVSEncoder):
    """While ``armed``: raises for the first video."""

    armed = False

    def __call__(self, items):
        if self.armed and items[0].hash == 60_001:
            raise RuntimeError("simulated EVS encoder crash")
        return super().__call__(items)


def _evs_call(enc, prompts, step, *, ids_of=None):
    items, placeholders, ids, sizes, prefixes, extends, offsets = layout(prompts, evs_windows(prompts, step))
    if ids_of is not None:
        ids = ids_of(ids)
    return mm_schedule.get_embedding_and_mask(enc, items, placeholders, ids, sizes, prefixes, extends, offsets)


def _evs_held(prompts: list[Prompt]) -> dict:
    cache = mm_schedule.sglang_compat.embedding_cache
    out = {}
    for p in prompts[:2]:
        value = cache.get_single(evs_key(p)) if cache.has(evs_key(p)) else None
        out[p.video.hash] = None if value is None else (value.embedding, list(value.num_tokens_per_frame))
    return out


def evs_steps(rank: int, world: int, group, *, parallel: bool) -> dict:
    """Chunked prefill of EVS videos through SGLang's function. At one step the last rank's
    cache has lost the first video and rank 0's holds an unfit entry for the second."""
    prompts = evs_prompts()
    mm_schedule.init_mm_embedding_cache(1 << 20)
    mm_schedule.set_step_context(StepContext(group=group, encoder_parallel=parallel, on_cache_hit=None))
    enc = EVSEncoder(prompts)
    steps_out = []
    try:
        for step in range(evs_step_count(prompts)):
            cache = mm_schedule.sglang_compat.embedding_cache
            if step == evs_lose_step(prompts):
                if rank == world - 1:
                    cache.free(evs_key(prompts[0]))
                if rank == 0:
                    second = prompts[1]
                    cache.set(evs_key(second), EVSEmbeddingResult(embedding=second.rows[:1].clone(), num_tokens_per_frame=[1]))
            enc.calls.clear()
            rows, mask, ids = _evs_call(enc, prompts, step)
            steps_out.append({"rows": rows, "mask": mask, "ids": ids, "calls": list(enc.calls)})
        return {"steps": steps_out, "held": _evs_held(prompts)}
    finally:
        mm_schedule.set_step_context(StepContext())


def evs_faults(rank: int, world: int, group, *, parallel: bool, mode: str) -> dict:
    """The first step of the EVS prompts fails on rank 1 only: its encoder raises
    (``raise``) or its engine's input_ids differ from the processor's (``ids``); then
    the same step again on every rank with nothing wrong."""
    prompts = evs_prompts()
    mm_schedule.init_mm_embedding_cache(1 << 20)
    mm_schedule.set_step_context(StepContext(group=group, encoder_parallel=parallel, on_cache_hit=None))
    enc = FaultyEVSEncoder(prompts)
    record: dict = {"error": None}
    try:
        enc.armed = mode == "raise" and rank == 1

        def corrupt(ids):
            ids = ids.clone()
            ids[1] += 1  # a text token of the first request's window
            return ids

        try:
            _evs_call(enc, prompts, 0, ids_of=corrupt if mode == "ids" and rank == 1 else None)
        except Exception as exc:
            record["error"] = _error(exc)
        record["held_after_fault"] = _evs_held(prompts)
        enc.armed = False
        enc.calls.clear()
        rows, mask, ids = _evs_call(enc, prompts, 0)
        record["after"] = {"rows": rows, "mask": mask, "ids": ids, "calls": list(enc.calls)}
        return record
    finally:
        mm_schedule.set_step_context(StepContext())


def moved_frame_token(kept) -> list[int]:
    """The frame counts with one token moved from one frame to the next (the same rows in
    all, other frame counts), as a rank with another pruning threshold keeps them."""
    kept = list(kept)
    i = next(f for f, n in enumerate(kept) if n > 0)
    kept[i] -= 1
    kept[(i + 1) % len(kept)] += 1
    return kept


class DivergentEVSEncoder(EVSEncoder):
    """Prunes the first video the other way (``moved_frame_token``)."""

    def __call__(self, items):
        out = super().__call__(items)
        if items[0].hash == 60_001:
            kept = moved_frame_token(out.num_tokens_per_frame)
            out = EVSEmbeddingResult(embedding=out.embedding, num_tokens_per_frame=kept)
        return out


def evs_divergent(rank: int, world: int, group) -> dict:
    """Without encoder parallelism every rank encodes every video: rank 1 prunes the first
    one differently. Then the same step with every rank pruning alike."""
    prompts = evs_prompts()
    mm_schedule.init_mm_embedding_cache(1 << 20)
    mm_schedule.set_step_context(StepContext(group=group, encoder_parallel=False, on_cache_hit=None))
    record: dict = {"error": None}
    try:
        try:
            _evs_call(DivergentEVSEncoder(prompts) if rank == 1 else EVSEncoder(prompts), prompts, 0)
        except Exception as exc:
            record["error"] = _error(exc)
        record["held_after_fault"] = _evs_held(prompts)
        enc = EVSEncoder(prompts)
        rows, mask, ids = _evs_call(enc, prompts, 0)
        record["after"] = {"rows": rows, "mask": mask, "ids": ids, "calls": list(enc.calls)}
        return record
    finally:
        mm_schedule.set_step_context(StepContext())


def evs_whole_windows(prompts: list[Prompt]) -> list[tuple[int, int]]:
    """Every prompt in one window: all three videos (the plain one too) in one call."""
    return [(0, len(p.ids)) for p in prompts]


def _evs_whole_call(enc, prompts):
    return mm_schedule.get_embedding_and_mask(enc, *layout(prompts, evs_whole_windows(prompts)))


def _evs_whole_outcome(enc, prompts) -> dict:
    """A call expected to succeed, recorded (its error too: raised here, it would end the
    process and every scenario after it)."""
    enc.calls.clear()
    try:
        rows, mask, ids = _evs_whole_call(enc, prompts)
    except Exception as exc:
        return {"error": _error(exc)}
    return {"error": None, "rows": rows, "mask": mask, "ids": ids, "calls": list(enc.calls)}


def _cache_snapshot(prompts: list[Prompt]) -> dict:
    """What the cache holds: its entry count and bytes, and per video (under its request's
    key, as SGLang's function keys every request) its rows and frame counts, or None."""
    cache = mm_schedule.sglang_compat.embedding_cache
    held = {}
    for p in prompts:
        key = evs_key(p)
        value = cache.get_single(key) if cache.has(key) else None
        if value is not None:
            rows = value if isinstance(value, torch.Tensor) else value.embedding
            counts = getattr(value, "num_tokens_per_frame", None)
            value = (rows.clone(), None if counts is None else list(counts))
        held[p.video.hash] = value
    stats = cache.stats()
    return {"entries": stats.entries, "bytes": stats.bytes, "held": held}


def evs_divergent_beside_a_plain_video(rank: int, world: int, group) -> dict:
    """One call with both EVS videos and the plain multi-span video, the second EVS video
    already cached (right) on every rank; rank 1 prunes the first one differently. The
    planned step for the plain video succeeds before the videos meet, yet the call fails:
    the cache must be as it was. Then the same call with every rank pruning alike."""
    prompts = evs_prompts()
    mm_schedule.init_mm_embedding_cache(1 << 20)
    cache = mm_schedule.sglang_compat.embedding_cache
    second = prompts[1]
    entry = EVSEmbeddingResult(embedding=second.rows.clone(), num_tokens_per_frame=list(second.kept))
    cache.set(evs_key(second), entry)
    mm_schedule.set_step_context(StepContext(group=group, encoder_parallel=False, on_cache_hit=None))
    record: dict = {"error": None, "before": _cache_snapshot(prompts)}
    try:
        try:
            _evs_whole_call(DivergentEVSEncoder(prompts) if rank == 1 else EVSEncoder(prompts), prompts)
        except Exception as exc:
            record["error"] = _error(exc)
        record["after_fault"] = _cache_snapshot(prompts)
        record["after"] = _evs_whole_outcome(EVSEncoder(prompts), prompts)
        record["held"] = _cache_snapshot(prompts)
        return record
    finally:
        mm_schedule.set_step_context(StepContext())


def evs_divergent_cached(rank: int, world: int, group) -> dict:
    """Every rank holds both EVS videos, rank 1 the first with other frame counts (as if
    it had pruned it differently when it cached it): an agreed hit whose counts disagree.
    The first call fails on every rank and must evict that entry everywhere; the second,
    every rank pruning alike, encodes it again and succeeds."""
    prompts = evs_prompts()
    mm_schedule.init_mm_embedding_cache(1 << 20)
    cache = mm_schedule.sglang_compat.embedding_cache
    for p in prompts[:2]:
        kept = moved_frame_token(p.kept) if rank == 1 and p.video.hash == 60_001 else list(p.kept)
        cache.set(evs_key(p), EVSEmbeddingResult(embedding=p.rows.clone(), num_tokens_per_frame=kept))
    mm_schedule.set_step_context(StepContext(group=group, encoder_parallel=False, on_cache_hit=None))
    record: dict = {"error": None}
    try:
        enc = EVSEncoder(prompts)
        try:
            _evs_whole_call(enc, prompts)
        except Exception as exc:
            record["error"] = _error(exc)
        record["after_fault"] = _cache_snapshot(prompts)
        record["after"] = _evs_whole_outcome(enc, prompts)
        record["held"] = _cache_snapshot(prompts)
        return record
    finally:
        mm_schedule.set_step_context(StepContext())


def scenarios(rank: int, world: int, group, short_timeout_group, rows_group) -> dict:
    results = {}
    for parallel in (False, True):
        for fused in (False, True):
            results[("steps", parallel, fused)] = consistent_steps(
                rank, world, group, parallel=parallel, fused=fused, seed=world * 10 + fused,
                rows_group=rows_group if parallel and fused else None,
            )
        for mode in ("raise", "short", "hidden"):
            results[("faults", parallel, mode)] = faults(rank, world, group, parallel=parallel, mode=mode)
        results[("evs", parallel)] = evs_steps(rank, world, group, parallel=parallel)
        for mode in ("raise", "ids"):
            results[("evs_faults", parallel, mode)] = evs_faults(rank, world, group, parallel=parallel, mode=mode)
    results["evs_divergent"] = evs_divergent(rank, world, group)
    results["evs_divergent_plain"] = evs_divergent_beside_a_plain_video(rank, world, group)
    results["evs_divergent_cached"] = evs_divergent_cached(rank, world, group)
    results["compat"] = sglang_compat(rank, world, group, seed=world * 10 + 5)
    results["bad_entry"] = bad_entry(rank, world, group)
    results["many_keys"] = many_keys(rank, world, group)
    results["precomputed"] = precomputed(rank, world, group)
    results["mixed_dtypes"] = mixed_dtypes(rank, world, group)
    results["mismatch"] = mismatch(rank, world, group)
    results["absent"] = absent_rank(rank, world, short_timeout_group)
    return results


def run_rank(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    """Four processes: first two independent 2-rank groups ({0, 1} and {2, 3}, as the
    tensor-parallel groups inside a larger world are) run every scenario side by side,
    then all four ranks run them as one group."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    # Every process creates every group, in the same order, as torch.distributed requires.
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    short_pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    short_world = dist.new_group(list(range(world)))
    # Short timeouts only once the groups are connected: a process scheduled late on a
    # busy machine would otherwise fail to connect in time.
    for group in (short_pairs[rank // 2], short_world):
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=TIMEOUT_S), group)
    # Second groups over the same ranks, for the rows of encoder-parallel steps.
    rows_pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    rows_world = dist.new_group(list(range(world)))
    pair = rank // 2
    results = {
        2: scenarios(dist.get_rank(pairs[pair]), 2, pairs[pair], short_pairs[pair], rows_pairs[pair]),
        world: scenarios(rank, world, dist.group.WORLD, short_world, rows_world),
    }
    torch.save(results, f"{out_dir}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
