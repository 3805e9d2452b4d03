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
from ...planner import plan_columns
from ...scheduler import agree_across_ranks, prepare_rows, run_packed
from ...sglang_compat import checked_mask, count_mm_tokens_in_extend, get_embedding_chunk
from ...validate import Expected, check_tensor

__all__ = [
    "EmbeddingCache",
    "EmbeddingLengthMismatch",
    "EmbeddingResult",
    "EncoderOutputError",
    "ParallelContext",
    "SharedStorageCache",
    "StepContext",
    "acknowledge_deferred_ipc",
    "check_rows",
    "combine_hashes",
    "count_mm_tokens_in_extend",
    "encode_whole_items",
    "evs",
    "fused_step",
    "get_embedding_chunk",
    "marked_placeholders",
    "move_features_to",
    "packed_precomputed",
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


def fused_step(func, items, placeholder_tensor, input_ids, items_size, prefixes, extends, offsets,
               cache: EmbeddingCache | None, context: StepContext, check_count: bool) -> tuple[Any, Any, Any]:
    """``get_embedding_and_mask`` as one planned step over every request of the batch.
    ``check_count``: input_ids must hold one placeholder token per planned row (SGLang
    counts the rows from the offsets alone)."""
    n = min(len(items_size) - 1, len(prefixes))
    if evs.pruned_video_requests(items, items_size, n):
        return evs.get_embedding_and_mask(
            func, items, placeholder_tensor, input_ids, items_size, prefixes, list(extends), list(offsets),
            cache=cache, context=context,
        )
    plan = plan_columns(
        [items[items_size[i]: items_size[i + 1]] for i in range(n)], prefixes, extends, offsets, [None] * n,
        cache, context.max_tokens_per_encoder_call,
    )
    if not plan.n_rows:
        return None, None, input_ids
    if check_count:
        mask = checked_mask(input_ids, placeholder_tensor, plan.n_rows)
    else:
        mask = marked_placeholders(input_ids, placeholder_tensor)[0]
    result = run_packed(plan, func, cache, context, device=input_ids.device, move_features=True)
    return result.embedding, mask, input_ids


class SharedStorageCache(EmbeddingCache):
    """SGLang's storage rule, for its behaviour on request: an entry keeps the tensor it was
    given, so a split view pins (and is charged for) the whole batch output it came from."""

    def insert(self, key: int, value: Any) -> bool:
        with self._lock:
            return self._insert(key, _view_entry(value, None), ())

    def insert_many(self, entries, *, protect=(), modalities=None) -> int:
        keep = set(protect)
        pairs = list(entries)
        mods = [None] * len(pairs) if modalities is None else list(modalities)
        prepared = [(key, _view_entry(tensor, modality)) for (key, tensor), modality in zip(pairs, mods)]
        with self._lock:
            if modalities is not None:
                self._check_layouts(prepared)
            return sum(self._insert(key, entry, keep) for key, entry in prepared)


def _view_entry(value: Any, modality: Any) -> tuple:
    # Field order of the core cache's entries: tensor, rows, charged bytes, value, layout, modality.
    tensor = value if hasattr(value, "shape") else value.embedding
    given = None if hasattr(value, "shape") else value
    if tensor.requires_grad:
        tensor = tensor.detach()
    flat = tensor.reshape(-1, tensor.shape[-1])
    return flat, flat.shape[0], tensor.untyped_storage().nbytes(), given, (flat.shape[1], flat.dtype, flat.device), modality
