"""The one place the SGLang stand-in reaches into mm_schedule's scheduler internals.

Everything the stand-in computes goes through these few functions, so a change of the
core's internal names touches this file only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ... import evs
from ...cache import EmbeddingCache, EmbeddingResult
from ...context import ParallelContext, StepContext, acknowledge_deferred_ipc
from ...encode import move_features_to
from ...errors import EmbeddingLengthMismatch, EncoderOutputError
from ...keys import combine_hashes
from ...placeholders import marked_placeholders
from ...plan import plan_columns
from ...scheduler import agree_across_ranks, prepare_rows, run_packed
from ...sglang_compat import count_mm_tokens_in_extend, embedding_and_mask, get_embedding_chunk
from ...validate import Expected, check_tensor

__all__ = [
    "EmbeddingCache",
    "EmbeddingLengthMismatch",
    "EmbeddingResult",
    "EncoderOutputError",
    "ParallelContext",
    "StepContext",
    "acknowledge_deferred_ipc",
    "acknowledging_only",
    "check_rows",
    "combine_hashes",
    "count_mm_tokens_in_extend",
    "embedding_and_mask",
    "encode_items_by_hash",
    "encode_whole_items",
    "evs",
    "get_embedding_chunk",
    "marked_placeholders",
    "move_features_to",
    "packed_precomputed",
    "without_hit_acknowledgement",
]


def _device(device: Any) -> Any:
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def encode_whole_items(func: Any, entries: Sequence[tuple[Any, int, int]], cache: EmbeddingCache | None,
                       context: StepContext, device: Any) -> list[Any]:
    """The whole embedding of every ``(item, start, end)`` in ``entries``, by one
    planned step: the cache is consulted, the misses are encoded together (one call per
    modality), checked and cached. Each entry is planned as a request whose window is
    exactly its span, so two entries with one hash but different lengths stay apart."""
    n = len(entries)
    plan = plan_columns(
        [[item] for item, _, _ in entries], [start for _, start, _ in entries],
        [end - start + 1 for _, start, end in entries], [[(start, end)] for _, start, end in entries],
        [None] * n, cache, context.max_tokens_per_encoder_call,
    )
    expected = Expected(None, _device(device))
    # Acknowledging hits is the stand-in's own (patchable) function's job.
    context = dataclasses.replace(context, on_cache_hit=None)
    plan, ranks = agree_across_ranks(plan, expected, context)
    tensors = prepare_rows(plan, func, cache, expected, move_features=False, ranks=ranks)
    source_of = dict(zip(plan.seg_request, plan.seg_source))
    return [tensors[source_of[i]] for i in range(n)]


def encode_items_by_hash(func: Any, items: list, counts: list[int], cache: EmbeddingCache | None,
                         device: Any) -> list[Any]:
    """The whole embedding of each item (``counts[i]`` rows, its runs together) from one
    encoder call, checked and cached under the item's own hash."""
    output = func(items)
    if isinstance(output, list):
        if len(output) != len(items):
            raise EncoderOutputError(f"the encoder returned {len(output)} tensors for {len(items)} items")
        pieces = [check_rows(o, n, item.hash, device) for o, n, item in zip(output, counts, items)]
    else:
        flat = check_rows(output, sum(counts), [item.hash for item in items], device)
        pieces = list(flat.split(counts))
    if cache is not None:
        for item, piece in zip(items, pieces):
            cache.insert(item.hash, EmbeddingResult(embedding=piece))
    return pieces


def without_hit_acknowledgement(context: StepContext) -> StepContext:
    """``context`` with cache hits not acknowledged to the CUDA-IPC transport."""
    if context.on_cache_hit is None:
        return context
    return dataclasses.replace(context, on_cache_hit=None)


def acknowledging_only(context: StepContext, item_ids: set[int]) -> StepContext:
    """``context`` acknowledging cache hits of the items whose ``id`` is in ``item_ids`` only."""
    acknowledge = context.on_cache_hit

    def on_cache_hit(items, parallel):
        kept = [item for item in items if id(item) in item_ids]
        if kept:
            acknowledge(kept, parallel)

    return dataclasses.replace(context, on_cache_hit=on_cache_hit)


def check_rows(embedding: Any, rows: int, key: Any, device: Any) -> Any:
    """``embedding`` as checked ``[rows, H]`` rows (floating, on ``device``), else a typed error."""
    expected = Expected(None, _device(device))
    flat = check_tensor(embedding, expected, f"request key {key}", "embedding")
    if flat.shape[0] != rows:
        raise EmbeddingLengthMismatch(expected=rows, received=flat.shape[0], item_hash=key,
                                      what="rows of the request's combined embedding")
    return flat


def packed_precomputed(item_lists, prefixes, extends, offsets, device: Any) -> Any:
    """The chunk rows of requests whose items all carry precomputed embeddings."""
    plan = plan_columns(item_lists, prefixes, extends, offsets, [None] * len(item_lists), None, None)
    return run_packed(plan, _refuse_encoding, None, StepContext(on_cache_hit=None), device=device).embedding


def _refuse_encoding(items: list) -> Any:
    raise AssertionError("precomputed embeddings need no encoder")


def has_pruned_video(items, items_size, prefixes) -> bool:
    """Whether a request of the batch holds an EVS video (its rows depend on the encoder)."""
    return bool(evs.pruned_video_requests(items, items_size, min(len(items_size) - 1, len(prefixes))))
