"""SGLang-compatible functions, thin wrappers over the explicit API.

Names, signatures and (for valid input) results match ``sglang.srt.managers.mm_schedule``
of SGLang 0.5.19, so an engine can import these instead. Differences, all on bad input:
a row-count mismatch raises ``EmbeddingLengthMismatch`` instead of cropping (also when
``input_ids`` holds another number of placeholder tokens than there are rows),
malformed items raise ``InvalidItemError``, bad encoder outputs ``EncoderOutputError``.
Cross-request batching is used on every backend, ROCm included. Cache hits are not
acknowledged to the CUDA-IPC transport (as on SGLang's batched per-image path, and on
every path from 0.5.22), unless the step context asks for it (``StepContext.on_cache_hit``).

Encoders: a bare callable gets SGLang's treatment, its miss items' features moved to
``input_ids``' device first (replacing ``item.feature``); wrap it as
``Encoder(fn, move_features=False)`` for an encoder that takes its inputs where they are.

State SGLang keeps in module globals lives here too, for drop-in use: the cache
(``embedding_cache``, rebound by ``init_mm_embedding_cache``; read it as a module
attribute, a from-import of it goes stale) and the step context, which an engine sets
once with ``set_step_context`` instead of the scheduler reading a process-wide runtime.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import evs
from .cache import EmbeddingCache
from .context import StepContext
from .errors import InvalidItemError
from .placeholders import (
    checked_mask,
    count_mm_tokens_in_extend,
    marked_placeholders,
    tokens_before,
)
from .plan import plan_columns
from .scheduler import run_packed_planned

__all__ = [
    "DataEmbeddingFunc", "PerImageRequestInfo", "checked_mask", "count_mm_tokens_in_extend", "embedding_cache",
    "get_embedding_and_mask", "get_embedding_chunk", "init_mm_embedding_cache", "set_step_context",
]

DataEmbeddingFunc = Callable[[list[Any]], Any]
"""Encoder: items -> one combined ``[tokens, H]`` tensor (any rank >= 2), or one tensor per item."""

embedding_cache: EmbeddingCache | None = None
_step_context = StepContext()
_warned_uncached = False


def init_mm_embedding_cache(max_size: int = 0, *, hidden_sizes: Any = None, dtypes: Any = None) -> None:
    """A fresh ``embedding_cache`` of ``max_size`` bytes. ``hidden_sizes`` / ``dtypes``
    (keywords beyond SGLang's signature): what every modality's embeddings look like, one
    value or a mapping per modality; a declared layout refuses a faulty encoder output
    even as the very first one (see ``EmbeddingCache``)."""
    global embedding_cache
    embedding_cache = EmbeddingCache(max_size, hidden_sizes=hidden_sizes, dtypes=dtypes)


def set_step_context(context: StepContext) -> None:
    global _step_context
    _step_context = context


@dataclass
class PerImageRequestInfo:
    req_idx: int
    items: list[Any]
    items_offset: list[tuple[int, int]]
    extend_prefix_len: int
    extend_seq_len: int
    overlapping: list[tuple[int, Any, int, int]] = field(default_factory=list)


def get_embedding_chunk(
    embedding: Any, extend_prefix_len: int, extend_seq_len: int, items_offset: list[tuple[int, int]]
) -> tuple[Any, int, int]:
    """Rows of a request's full embedding (rows in span order) that fall in the chunk
    ``[extend_prefix_len, extend_prefix_len + extend_seq_len)``; returns
    ``(rows, start_index, end_index)``."""
    flat = embedding.reshape(-1, embedding.shape[-1])
    start_index = tokens_before(items_offset, extend_prefix_len)
    end_index = tokens_before(items_offset, extend_prefix_len + max(extend_seq_len, 0))
    end_index = max(end_index, start_index)
    return flat[start_index:end_index], start_index, end_index


def get_embedding_and_mask(
    data_embedding_func: DataEmbeddingFunc,
    embedding_items: list[Any],
    placeholder_tensor: Any,
    input_ids: Any,
    items_size: list[int],
    prefix_length: list[int],
    extend_length: list[int],
    items_offset_list: list[list[tuple[int, int]]],
) -> tuple[Any, Any, Any]:
    """Packed embedding rows of this chunk for one modality, the placeholder mask over
    ``input_ids``, and ``input_ids`` (a rewritten copy when an EVS video's placeholders
    moved, see ``mm_schedule.evs``; else unchanged). ``(None, None, input_ids)`` when the
    chunk contains no placeholder of these items.

    Hits are served from ``embedding_cache``; without ``init_mm_embedding_cache`` nothing
    is cached (a warning says so, once)."""
    cache = embedding_cache
    if cache is None:
        _warn_uncached()
    # Lists (what SGLang passes) are used as they are; anything else is read into one.
    items = embedding_items if type(embedding_items) is list else _as_list(embedding_items)
    items_size = items_size if type(items_size) is list else _as_list(items_size)
    prefixes = prefix_length if type(prefix_length) is list else _as_list(prefix_length)
    extends = extend_length if type(extend_length) is list else _as_list(extend_length)
    offsets = items_offset_list if type(items_offset_list) is list else _as_list(items_offset_list)
    return embedding_and_mask(
        data_embedding_func, items, placeholder_tensor, input_ids, items_size, prefixes, extends, offsets,
        cache=cache, context=_step_context,
    )


def embedding_and_mask(
    data_embedding_func: DataEmbeddingFunc,
    items: list[Any],
    placeholder_tensor: Any,
    input_ids: Any,
    items_size: list[int],
    prefixes: list[int],
    extends: list[int],
    offsets: list[Any],
    *,
    cache: EmbeddingCache | None,
    context: StepContext,
    check_count: bool = True,
) -> tuple[Any, Any, Any]:
    """``get_embedding_and_mask`` (lists already read) with an explicit cache and step
    context: the whole batch as one planned step. ``check_count=False`` marks the
    placeholder tokens without checking that ``input_ids`` holds one per planned row
    (SGLang counts the rows from the offsets alone)."""
    n = min(len(items_size) - 1, len(prefixes))
    if len(extends) < n:
        # SGLang reads a request past the end of extend_length as extending nothing.
        extends = [*extends, *[0] * (n - len(extends))]
    if len(offsets) < n:
        offsets = _padded_offsets(offsets, items_size, n)
    if evs.pruned_video_requests(items, items_size, n):
        return evs.get_embedding_and_mask(
            data_embedding_func, items, placeholder_tensor, input_ids, items_size, prefixes,
            _as_list(extends), _as_list(offsets), cache=cache, context=context,
        )
    # The flat item list and its bounds, as SGLang passes them: no list per request.
    bounds, row_offsets = items_size[: n + 1], [None] * n

    def make_plan():
        return plan_columns(items, prefixes, extends, offsets, row_offsets, cache, context.max_tokens_per_encoder_call,
                            bounds=bounds)

    plan = make_plan()
    if not plan.n_rows:
        return None, None, input_ids
    # Checked before anything is encoded or cached.
    if check_count:
        mask = checked_mask(input_ids, placeholder_tensor, plan.n_rows, plan)
    else:
        mask = marked_placeholders(input_ids, placeholder_tensor)[0]
    first = [plan]  # the first plan is this one; a second (see run_packed_planned) is made anew
    result = run_packed_planned(lambda: first.pop() if first else make_plan(), data_embedding_func, cache, context,
                                device=input_ids.device, move_features=True)
    return result.embedding, mask, input_ids


def _padded_offsets(offsets: list | tuple, items_size: list, n: int) -> list:
    """``offsets`` for ``n`` requests: one past its end is refused when that request has
    items (their spans would be unchecked), else given none."""
    for r in range(len(offsets), n):
        if items_size[r] != items_size[r + 1]:
            raise InvalidItemError(
                f"request {r}: items_offset_list has {len(offsets)} entries, but items_size gives this request"
                f" {items_size[r + 1] - items_size[r]} item(s) and prefix_length {n} requests"
            )
    return [*offsets, *[None] * (n - len(offsets))]


def _as_list(values: Any) -> list | tuple:
    """``values`` as a sequence; any other iterable is read once, so a generator loses nothing."""
    return values if type(values) is list or type(values) is tuple else list(values)


def _warn_uncached() -> None:
    global _warned_uncached
    if not _warned_uncached:
        _warned_uncached = True
        warnings.warn(
            "get_embedding_and_mask: no embedding cache (init_mm_embedding_cache was not called),"
            " so nothing is cached and every chunk encodes its items again",
            stacklevel=3,
        )
