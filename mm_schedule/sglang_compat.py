"""SGLang-compatible functions, thin wrappers over the explicit API.

Names, signatures and (for valid input) results match ``sglang.srt.managers.mm_schedule``
of SGLang 0.5.19, so an engine can import these instead. Differences, all on bad input:
a row-count mismatch raises ``EmbeddingLengthMismatch`` instead of cropping, and
malformed offsets raise ``InvalidItemError``. Cross-request batching is used on every
backend, ROCm included.

State SGLang keeps in module globals lives here too, for drop-in use: the cache
(``embedding_cache``, rebound by ``init_mm_embedding_cache``; read it as a module
attribute, a from-import of it goes stale) and the step context, which an engine sets
once with ``set_step_context`` instead of the scheduler reading a process-wide runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import evs
from .cache import EmbeddingCache
from .context import StepContext
from .plan import RequestChunk
from .scheduler import embed_chunk

DataEmbeddingFunc = Callable[[list[Any]], Any]
"""Encoder: items -> one combined ``[tokens, H]`` tensor (any rank >= 2), or one tensor per item."""

embedding_cache: EmbeddingCache | None = None
_step_context = StepContext()


def init_mm_embedding_cache(max_size: int = 0) -> None:
    global embedding_cache
    embedding_cache = EmbeddingCache(max_size)


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


def _tokens_before(spans: Sequence[tuple[int, int]], position: int) -> int:
    """Placeholder tokens at positions < ``position``."""
    return sum(max(0, min(end + 1, position) - start) for start, end in spans)


def get_embedding_chunk(
    embedding: Any, extend_prefix_len: int, extend_seq_len: int, items_offset: list[tuple[int, int]]
) -> tuple[Any, int, int]:
    """Rows of a request's full embedding (rows in span order) that fall in the chunk
    ``[extend_prefix_len, extend_prefix_len + extend_seq_len)``; returns
    ``(rows, start_index, end_index)``."""
    flat = embedding.reshape(-1, embedding.shape[-1])
    start_index = _tokens_before(items_offset, extend_prefix_len)
    end_index = _tokens_before(items_offset, extend_prefix_len + max(extend_seq_len, 0))
    end_index = max(end_index, start_index)
    return flat[start_index:end_index], start_index, end_index


def count_mm_tokens_in_extend(
    prefix_length: Sequence[int], extend_length: Sequence[int], items_offset_list: Sequence[Sequence]
) -> int:
    """Placeholder tokens inside every request's chunk window, from host offsets only."""
    total = 0
    for prefix, extend, spans in zip(prefix_length, extend_length, items_offset_list):
        total += _tokens_before(spans, prefix + extend) - _tokens_before(spans, prefix)
    return total


def placeholder_mask(input_ids: Any, placeholder_tensor: Any) -> Any:
    """``[N, 1]`` bool: which ``input_ids`` are placeholders (no host sync)."""
    from .kernels.embedding_merge import placeholder_mask as mask_1d

    return mask_1d(input_ids.reshape(-1), placeholder_tensor).unsqueeze(-1)


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
    moved, see ``mm_schedule.evs``). ``(None, None, input_ids)`` when the chunk contains
    no placeholder of these items."""
    n_requests = min(len(items_size) - 1, len(prefix_length))
    if evs.pruned_video_requests(embedding_items, items_size, n_requests):
        return evs.get_embedding_and_mask(
            data_embedding_func, embedding_items, placeholder_tensor, input_ids, items_size,
            prefix_length, extend_length, items_offset_list, cache=embedding_cache, context=_step_context,
        )
    requests = [
        RequestChunk(
            items=embedding_items[items_size[i] : items_size[i + 1]],
            prefix=prefix_length[i],
            extend=extend_length[i],
            offsets=items_offset_list[i],
        )
        for i in range(n_requests)
    ]
    result = embed_chunk(
        requests, data_embedding_func, cache=embedding_cache, context=_step_context, device=input_ids.device
    )
    if result.embedding is None:
        return None, None, input_ids
    return result.embedding, placeholder_mask(input_ids, placeholder_tensor), input_ids
