"""The one place the SGLang stand-in reaches into mm_schedule's scheduler internals.

Everything the stand-in computes goes through these few functions, so a change of the
core's internal names touches this file only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from ... import evs
from ...cache import EmbeddingCache, EmbeddingResult, storage_id
from ...context import ParallelContext, StepContext, acknowledge_deferred_ipc
from ...encode import move_features_to
from ...errors import EmbeddingLengthMismatch, EncoderOutputError
from ...items import modality_name
from ...keys import combine_hashes
from ...placeholders import marked_placeholders
from ...plan import plan_columns
from ...scheduler import agree_across_ranks, checked_rows, run_packed
from ...sglang_compat import count_mm_tokens_in_extend, embedding_and_mask, get_embedding_chunk
from ...validate import Expected, check_tensor

log = logging.getLogger(__name__)
_warned_reuse = False  # an encoder that reuses its buffer does so every step: said once

__all__ = [
    "EmbeddingCache",
    "EmbeddingLengthMismatch",
    "EmbeddingResult",
    "EncoderOutputError",
    "ParallelContext",
    "StepContext",
    "StepInserts",
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
    "modality_of",
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


def modality_of(item: Any) -> str:
    """The modality name the planner and the cache file ``item`` under."""
    return modality_name(getattr(item, "modality", "IMAGE"))


class StepInserts:
    """The encoder outputs of one step walked along SGLang's call graph, cached together
    by one ``insert_many`` (layout-checked per modality) when the step ends.

    The cache confirms a changed layout by counting inserts, so a step that encodes its
    requests one by one must still be one insert, or one faulty step would confirm its
    own layout. Until the step ends, its later requests read these outputs here, as
    they would have read them from the cache. ``cache`` may be None (nothing cached) or
    another object (a replacement, a test's mock), which gets SGLang's ``set`` for each
    output as it comes, as SGLang's module calls it: it has no layouts to confirm."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self._pending: dict[int, tuple[Any, str]] = {}
        # storage -> (encoder call, keys of that call's pending tensors in it)
        self._storages: dict[tuple, tuple[int, list[int]]] = {}
        self._calls = 0
        self._hits: set[int] = set()

    def add(self, entries: Sequence[tuple[int, Any, str]]) -> None:
        """Hold the ``(key, tensor, modality)`` outputs of one encoder call."""
        if not isinstance(self.cache, EmbeddingCache):
            if self.cache is not None:
                for key, tensor, _ in entries:
                    self.cache.set(key, EmbeddingResult(embedding=tensor))
            return
        self._calls += 1
        call = self._calls
        for key, tensor, modality in entries:
            storage = storage_id(tensor)
            if storage is not None:
                owner = self._storages.get(storage)
                if owner is not None and owner[0] != call:
                    # The encoder wrote this call into the buffer an earlier call's pending
                    # outputs live in: their rows are gone, so they must not be cached.
                    self._drop_overwritten(storage, owner[1], key)
                    owner = None
                if owner is None:
                    owner = self._storages[storage] = (call, [])
                owner[1].append(key)
            self._pending.pop(key, None)  # a re-encoded key is the newest, as a cache set makes it
            self._pending[key] = (tensor, modality)

    def _drop_overwritten(self, storage: tuple, keys: list[int], by: int) -> None:
        global _warned_reuse
        del self._storages[storage]
        for key in keys:
            held = self._pending.get(key)
            if held is not None and storage_id(held[0]) == storage:  # not re-encoded since
                del self._pending[key]
        if not _warned_reuse:
            _warned_reuse = True
            log.warning(
                "The encoder output for key %d reuses the buffer of this step's earlier outputs for keys %s,"
                " which it overwrote: those are not cached", by, keys,
            )

    def get(self, key: int) -> Any | None:
        """This step's output for ``key`` not yet cached, or None."""
        held = self._pending.get(key)
        return None if held is None else held[0]

    def discard(self, key: int) -> None:
        self._pending.pop(key, None)

    def served(self, key: int) -> None:
        """``key`` was served from the cache in this step: its entry is not evicted for the step's inserts."""
        self._hits.add(key)

    def flush(self) -> int:
        """Cache everything held, in one insert; returns how many entries were cached."""
        pending, self._pending = self._pending, {}
        self._storages.clear()
        if not pending:
            return 0
        keys = list(pending)
        return self.cache.insert_many([(key, pending[key][0]) for key in keys], protect=self._hits,
                                      modalities=[pending[key][1] for key in keys])


def encode_whole_items(func: Any, entries: Sequence[tuple[Any, int, int]], cache: EmbeddingCache | None,
                       inserts: StepInserts, context: StepContext, device: Any) -> list[Any]:
    """The whole embedding of every ``(item, start, end)`` in ``entries``, by one
    planned step: the cache is consulted, the misses are encoded together (one call per
    modality) and checked against the step and the cache's layouts, and handed to
    ``inserts``. Each entry is planned as a request whose window is exactly its span, so
    two entries with one hash but different lengths stay apart."""
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
    tensors, encoded = checked_rows(plan, func, cache, expected, ranks=ranks)
    if plan.has_hits:
        for key in plan.hit_keys:
            inserts.served(key)
    inserts.add([(plan.keys[s], tensors[s], plan.modalities[s]) for s in encoded])
    source_of = dict(zip(plan.seg_request, plan.seg_source))
    return [tensors[source_of[i]] for i in range(n)]


def encode_items_by_hash(func: Any, items: list, counts: list[int], inserts: StepInserts,
                         device: Any) -> list[Any]:
    """The whole embedding of each item (``counts[i]`` rows, its runs together) from one
    encoder call, checked and handed to ``inserts`` under the item's own hash."""
    output = func(items)
    if isinstance(output, list):
        if len(output) != len(items):
            raise EncoderOutputError(f"the encoder returned {len(output)} tensors for {len(items)} items")
        pieces = [check_rows(o, n, item.hash, device) for o, n, item in zip(output, counts, items)]
    else:
        flat = check_rows(output, sum(counts), [item.hash for item in items], device)
        pieces = list(flat.split(counts))
    inserts.add([(item.hash, piece, modality_of(item)) for item, piece in zip(items, pieces)])
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
