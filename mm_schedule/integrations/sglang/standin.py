"""A stand-in for SGLang's ``sglang.srt.managers.mm_schedule``, run by mm_schedule.

Every module-level name of the module of one SGLang release (0.5.18 to 0.5.23; see
``versions``) is defined here with that release's signature, return value and effect on
``embedding_cache``. ``use_release(version)`` binds each name to its form in that
release (``install()`` does it for the loaded SGLang); the newest release is bound at
import. The functions reach each other through this
module's globals, along SGLang's call graph, so a test or fork that patches one of them
(``monkeypatch.setattr(module, "_batch_encode_per_image_misses", ...)``) changes every
path that uses it. The work itself (cache lookups, encoding, checking, caching) is
mm_schedule's planner and cache, under its layout rule on every path: what a step
encodes is cached by one insert, checked per modality, when the step ends; entries of
an unconfirmed layout change are never served.

``get_embedding_and_mask`` with none of the names below patched runs the whole batch as
one planned step (``sglang_compat.embedding_and_mask``), which gives the same rows, mask and cache state as
walking the call graph, with one encoder call per modality and one assembly. Once any
name of the call graph is rebound, it walks the graph.

Where mm_schedule departs from SGLang on purpose, ``differences`` has the switch.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import InvalidItemError
from ...items import MMItem
from . import _core
from .differences import differences
from .versions import NEWEST, Profile, profile

MultimodalDataItem = MMItem
EmbeddingResult = _core.EmbeddingResult
MultiModalStaticCache = _core.EmbeddingCache
EVSEmbeddingResult = _core.evs.EVSEmbeddingResult

# SGLang's module logs through ``sglang.utils``' logger; log configurations key on it.
logger = logging.getLogger("sglang.utils")

_is_hip = torch.version.hip is not None
_is_npu = hasattr(torch, "npu") and torch.npu.is_available()
_is_xpu = hasattr(torch, "xpu") and torch.xpu.is_available()

embedding_cache: MultiModalStaticCache | None = None
# (0.5.21+) SGLang's merge records this after offloading features to the host; they are
# waited for before being read. None: nothing to wait for.
host_offload_event = None
# (0.5.20+) Marks an item whose deferred CUDA-IPC feature a miss borrows.
BORROW_CUDA_IPC_FEATURE_KEY = "_sglang_borrow_cuda_ipc_feature"

# The release whose module the names below currently are (``use_release``).
_profile: Profile = profile(NEWEST)

# Set by ``install`` to read the engine's parallel state when first needed.
_context_source: Callable[[], _core.StepContext] | None = None
_context: _core.StepContext | None = None


def _step_context() -> _core.StepContext:
    if _context is None:
        return _context_source() if _context_source is not None else _core.StepContext()
    return _context


def set_step_context(context: _core.StepContext | None) -> None:
    """Use ``context`` (parallel ranks, process group, encoder token budget) from now on;
    None reads it again from the engine (or the single-process default)."""
    global _context
    _context = context


def get_parallel() -> _core.ParallelContext:
    return _step_context().parallel


def get_schedule() -> Any:
    schedule = _sglang_runtime("get_schedule")
    return schedule() if schedule is not None else types.SimpleNamespace(chunked_prefill_size=-1)


def _sglang_runtime(name: str) -> Any:
    module = sys.modules.get("sglang.srt.runtime_context")
    return getattr(module, name, None) if module is not None else None


def is_hip() -> bool:
    return _is_hip


def is_npu() -> bool:
    return _is_npu


def is_xpu() -> bool:
    return _is_xpu


def maybe_assert_sum(mask: torch.Tensor, expected: int, message: str) -> None:
    """Placeholder tokens in ``mask`` must be ``expected`` (SGLang checks this only when an
    async probe is enabled; mm_schedule always does, unless switched off)."""
    if not differences.raise_on_count_mismatch:
        return
    marked = int(mask.sum().item())
    if marked != expected:
        raise _core.EmbeddingLengthMismatch(
            expected=expected, received=marked, what=f"{message}: placeholder tokens in input_ids",
            hint="the items' offsets and input_ids describe different prompts",
        )


def init_mm_embedding_cache(max_size: int = 0, *, hidden_sizes=None, dtypes=None):
    global embedding_cache
    # Until 0.5.20 SGLang caches split views as given; later releases clone them, as mm_schedule does.
    keeps_views = _profile.form("MultiModalStaticCache") == "views"
    embedding_cache = MultiModalStaticCache(max_size, share_storage=keeps_views and not differences.own_storage,
                                            hidden_sizes=hidden_sizes, dtypes=dtypes)


def get_embedding_chunk(
    embedding: torch.Tensor,
    extend_prefix_len: int,
    extend_seq_len: int,
    items_offset: list[tuple[int, int]],
) -> tuple[torch.Tensor, int, int]:
    return _core.get_embedding_chunk(embedding, extend_prefix_len, extend_seq_len, items_offset)


def _get_precomputed_embedding(
    items: list[MultimodalDataItem],
    items_size: list[int],
    prefix_length: list[int],
    extend_length: list[int],
    items_offset_list: list[list[tuple[int, int]]],
) -> torch.Tensor | None:
    """The chunk rows of a batch whose items all carry precomputed embeddings; None when
    none does; a batch mixing both is refused (``PrecomputedEmbeddingError``)."""
    if _profile.form("_get_precomputed_embedding") != "by request":
        _wait_for_host_offload([item.precomputed_embeddings for item in items], None)
    n = min(len(items_size) - 1, len(prefix_length))
    groups = [items[items_size[i]: items_size[i + 1]] for i in range(n)]
    given = [item.precomputed_embeddings for group in groups for item in group
             if item.precomputed_embeddings is not None]
    if not given:
        return None
    extends = [extend_length[i] if i < len(extend_length) else 0 for i in range(n)]
    device = next((t.device for t in given if t.is_cuda), given[0].device)
    rows = _core.packed_precomputed(groups, list(prefix_length[:n]), extends, list(items_offset_list[:n]), device)
    if rows is None:  # no precomputed row falls in this chunk
        return given[0].new_empty((0, given[0].shape[-1]), device=device)
    return rows


DataEmbeddingFunc = Callable[
    [list[MultimodalDataItem]],
    torch.Tensor | list[torch.Tensor] | EVSEmbeddingResult,
]


def _flatten_embedding_result(
    embedding: torch.Tensor | list[torch.Tensor],
) -> torch.Tensor:
    if isinstance(embedding, list):
        if not embedding:
            raise _core.EncoderOutputError("the encoder returned an empty list; a per-item result holds one tensor per item")
        flat = [e.reshape(-1, e.shape[-1]) for e in embedding]
        return flat[0] if len(flat) == 1 else torch.cat(flat, dim=0)
    return embedding


def _embedding_token_count(embedding: torch.Tensor) -> int:
    return embedding.reshape(-1, embedding.shape[-1]).shape[0]


def _discard_mismatched_cached_embedding(
    cache_key: int | None,
    expected_token_count: int,
    cached_token_count: int,
) -> None:
    # Operators and tests key on these fields: keep SGLang's wording.
    logger.warning(
        "Discarding cached multimodal embedding due to a token-count mismatch: "
        "cache_key=%s, expected_tokens=%d, cached_tokens=%d. Recomputing embedding.",
        cache_key,
        expected_token_count,
        cached_token_count,
    )
    embedding_cache.free(cache_key, None)


def _cached_rows(embedding: torch.Tensor) -> int:
    """A cached entry's row count, through the release's own function where it has one
    (0.5.19+; 0.5.18 does not check cached rows, the stand-in does in every release)."""
    return globals().get("_embedding_token_count", _OWN_TOKEN_COUNT)(embedding)


def _discard_cached(cache_key: Any, expected_token_count: int, cached_token_count: int) -> None:
    globals().get("_discard_mismatched_cached_embedding", _OWN_DISCARD)(
        cache_key, expected_token_count, cached_token_count)


# The stand-in's own checks, for the releases whose module lacks the names (0.5.18).
_OWN_TOKEN_COUNT, _OWN_DISCARD = _embedding_token_count, _discard_mismatched_cached_embedding


# Bound encoder methods of these models move (and batch) their features themselves.
_SELF_MOVING_ENCODERS = frozenset({
    "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "KimiK25ForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
})


def _can_skip_pre_embed_feature_move(data_embedding_func: DataEmbeddingFunc) -> bool:
    owner = getattr(data_embedding_func, "__self__", None)
    if owner is None or getattr(data_embedding_func, "__name__", None) not in ("get_image_feature", "get_video_feature"):
        return False
    return owner.__class__.__name__ in _SELF_MOVING_ENCODERS


def _move_items_to_device(
    items: list[MultimodalDataItem], device: torch.device
) -> None:
    _core.move_features_to(items, device)


def _move_items_to_device_after_offload(
    items: list[MultimodalDataItem],
    device: torch.device,
    data_embedding_func: DataEmbeddingFunc,
) -> None:
    """(0.5.21+) Wait for features offloaded to the host, then move them unless the
    encoder moves them itself."""
    defer_move = _can_skip_pre_embed_feature_move(data_embedding_func)
    _wait_for_host_offload([item.feature for item in items], None if defer_move else device)
    if not defer_move:
        _core.move_features_to(items, device)


def _wait_for_host_offload(tensors: list[Any], device: torch.device | None) -> None:
    """Wait for ``host_offload_event`` when one of ``tensors`` is on the host: on
    ``device``'s current CUDA stream, or (``None``, or not CUDA) on the host."""
    event = globals().get("host_offload_event")
    if event is None or not any(isinstance(t, torch.Tensor) and t.is_cpu for t in tensors):
        return
    if device is None or device.type != "cuda":
        event.synchronize()
    else:
        torch.cuda.current_stream(device).wait_event(event)


def _move_before_encoding(data_embedding_func: DataEmbeddingFunc, items: list[MultimodalDataItem],
                          device: torch.device) -> None:
    """Items' features to ``device`` before the encoder runs, as this release does it."""
    if _profile.form("_move_items_to_device") == "items, device":
        if not _can_skip_pre_embed_feature_move(data_embedding_func):
            _move_items_to_device(items, device)
    else:
        _move_items_to_device(items, device, data_embedding_func)


def _acknowledge_deferred_cuda_ipc_cache_hits(
    items: list[MultimodalDataItem],
) -> None:
    _core.acknowledge_deferred_ipc(items, get_parallel())


def _acknowledge_hits(items: list[MultimodalDataItem]) -> None:
    """Cache hits acknowledged to the CUDA-IPC transport, in the releases that do (until 0.5.22)."""
    if items and _profile.has("_acknowledge_deferred_cuda_ipc_cache_hits"):
        _acknowledge_deferred_cuda_ipc_cache_hits(items)


# The outputs of the step being walked along the call graph, cached when it ends (None
# outside one: each function called by itself caches its own outputs before returning).
_step_inserts: ContextVar[_core.StepInserts | None] = ContextVar("mm_schedule_sglang_step", default=None)


@contextmanager
def _one_insert_per_step() -> Iterator[_core.StepInserts]:
    """Everything encoded inside the block (and blocks nested in it) cached by one
    layout-checked insert when the outermost block ends, nothing if it raises: a step is
    one insert however many encoder calls its requests take, so one faulty step cannot
    confirm a layout change by itself."""
    current = _step_inserts.get()
    if current is not None:
        yield current
        return
    inserts = _core.StepInserts(embedding_cache)
    token = _step_inserts.set(inserts)
    try:
        yield inserts
    finally:
        _step_inserts.reset(token)
    inserts.flush()


def _unconfirmed(modality: str) -> bool:
    """Whether ``modality``'s layout is a change the cache has not confirmed: its entries
    are then not served on any path (the step encodes them again, which settles it)."""
    # A replacement cache object gets SGLang's API only (and has no layouts).
    return isinstance(embedding_cache, MultiModalStaticCache) and embedding_cache.layout_changing(modality)


def _step_or_cached(key: Any, modality: str, item_hashes: list | None = None) -> Any:
    """The embedding this step encoded under ``key`` and has not cached yet, else the
    cache's entry (read as SGLang reads it: ``get(item_hashes)`` for a request's combined
    key, ``get_single`` for an item's), None while ``modality``'s layout change is unconfirmed."""
    inserts = _step_inserts.get()
    held = inserts.get(key) if inserts is not None else None
    if held is not None:
        return EmbeddingResult(embedding=held)
    if _unconfirmed(modality):
        return None
    found = embedding_cache.get_single(key) if item_hashes is None else embedding_cache.get(item_hashes)
    if found is not None and inserts is not None:
        inserts.served(key)
    return found


def _forget(key: Any) -> None:
    inserts = _step_inserts.get()
    if inserts is not None:
        inserts.discard(key)


def _cached_whole(key: Any, expected_token_count: int, modality: str) -> torch.Tensor | None:
    """The cached (or earlier in this step encoded) embedding under ``key`` if it has the
    expected rows; one with other rows is discarded (and logged) and None returned."""
    cached = _step_or_cached(key, modality)
    if cached is None:
        return None
    cached_token_count = _cached_rows(cached.embedding)
    if cached_token_count != expected_token_count:
        _forget(key)
        _discard_cached(key, expected_token_count, cached_token_count)
        return None
    return cached.embedding


def _encode_whole(data_embedding_func: DataEmbeddingFunc, misses: list[tuple[Any, int, int]],
                  device: torch.device) -> list[torch.Tensor]:
    """Whole embeddings of ``(item, start, end)`` cache misses, encoded in one planned
    step; an item with several runs (0.5.22+ audio) is ``(item, None, token count)``."""
    items = [item for item, _, _ in misses]
    _move_before_encoding(data_embedding_func, items, device)
    with _one_insert_per_step() as inserts:
        if any(start is None for _, start, _ in misses):
            return _core.encode_items_by_hash(data_embedding_func, items, [n for _, _, n in misses], inserts, device)
        return _core.encode_whole_items(data_embedding_func, misses, embedding_cache, inserts, _step_context(),
                                        device)


def _item_rows(embedding: torch.Tensor, start: int, end: int, chunk_start: int, chunk_end: int) -> torch.Tensor:
    """Rows of an item spanning ``[start, end]`` that fall in ``[chunk_start, chunk_end)``."""
    return embedding[max(start, chunk_start) - start: min(end, chunk_end - 1) - start + 1]


def _item_overlap(item: MultimodalDataItem, chunk_start: int, chunk_end: int) -> int | None:
    """(SGLang 0.5.23) The item's token count if any of its runs meets ``[chunk_start, chunk_end)``."""
    if any(end >= chunk_start and start < chunk_end for start, end in item.offsets):
        return sum(end - start + 1 for start, end in item.offsets)
    return None


def _slice_item_chunk(emb: torch.Tensor, item: MultimodalDataItem, chunk_start: int, chunk_len: int) -> torch.Tensor:
    """(SGLang 0.5.23) The rows of an item's embedding that fall in the chunk."""
    return get_embedding_chunk(emb, chunk_start, chunk_len, item.offsets)[0]


def _get_chunked_embedding_full(
    data_embedding_func: DataEmbeddingFunc,
    embedding_items_per_req: list[MultimodalDataItem],
    items_offset: list[tuple[int, int]],
    extend_prefix_len: int,
    extend_seq_len: int,
    input_ids: torch.Tensor,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One request's chunk rows from its combined embedding (all its items encoded in
    one call and cached under the combined key); returns ``(rows, input_ids)``."""
    item_hashes = [item.hash for item in embedding_items_per_req]
    key = MultiModalStaticCache.combine_hashes(item_hashes)
    modality = _core.modality_of(embedding_items_per_req[0])
    expected = sum(end - start + 1 for start, end in items_offset)
    result = _step_or_cached(key, modality, item_hashes)
    if result is not None and not _is_evs(result):
        cached_token_count = _cached_rows(result.embedding)
        if cached_token_count != expected:
            _forget(key)
            _discard_cached(key, expected, cached_token_count)
            result = None
    if result is None:
        _move_before_encoding(data_embedding_func, embedding_items_per_req, device)
        output = data_embedding_func(embedding_items_per_req)
        if isinstance(output, list):
            output = _flatten_embedding_result(output)
        if _is_evs(output):
            result = output
            embedding_cache.set(key, result)  # its frame counts travel with the value
        else:
            rows = _core.check_rows(output, expected, key, device)
            result = EmbeddingResult(embedding=rows)
            with _one_insert_per_step() as inserts:
                inserts.add([(key, rows, modality)])
    else:
        _acknowledge_hits(embedding_items_per_req)
    if _is_evs(result):
        redistribute = getattr(result, "redistribute_pruned_frames_placeholders", None)
        if redistribute is None:
            raise _core.EncoderOutputError(
                f"request key {key}: an EVS result reached the per-request path; call get_embedding_and_mask,"
                " which moves the pruned video's placeholders"
            )
        input_ids, items_offset = redistribute(
            input_ids, items_offset, item=embedding_items_per_req[0],
            extend_prefix_len=extend_prefix_len, extend_seq_len=extend_seq_len,
        )
    rows, _, _ = get_embedding_chunk(result.embedding, extend_prefix_len, extend_seq_len, items_offset)
    return rows, input_ids


def _is_evs(value: Any) -> bool:
    return getattr(value, "num_tokens_per_frame", None) is not None


@dataclass
class PerImageRequestInfo:
    """One request of the per-image path: its items, their offsets and its chunk window.
    ``overlapping`` holds ``(index, item, start, end)`` until 0.5.22, then
    ``(index, item, token count)``."""

    req_idx: int
    items: list[MultimodalDataItem]
    items_offset: list[tuple[int, int]]
    extend_prefix_len: int
    extend_seq_len: int
    overlapping: list[tuple] = field(
        default_factory=list
    )


def _by_item_offsets() -> bool:
    """(0.5.22+) Items are sliced by their own offsets, and an item may have several runs."""
    return _profile.form("PerImageRequestInfo") == "token counts"


def _overlapping(items, items_offset, chunk_start: int, chunk_end: int) -> list:
    """The request's items that meet ``[chunk_start, chunk_end)``, as this release lists them."""
    if _by_item_offsets():
        found = []
        for idx, item in enumerate(items):
            token_count = _item_overlap(item, chunk_start, chunk_end)
            if token_count is not None:
                found.append((idx, item, token_count))
        return found
    return [(idx, item, start, end) for idx, (item, (start, end)) in enumerate(zip(items, items_offset))
            if end >= chunk_start and start < chunk_end]


def _miss(entry: tuple) -> tuple[Any, Any, int]:
    """An overlapping entry as ``(item, start, end)`` for encoding (``(item, None, count)``
    for an item with several runs)."""
    if len(entry) == 4:
        return entry[1], entry[2], entry[3]
    item, token_count = entry[1], entry[2]
    if len(item.offsets) == 1:
        return item, item.offsets[0][0], item.offsets[0][1]
    return item, None, token_count


def _token_count(entry: tuple) -> int:
    return entry[3] - entry[2] + 1 if len(entry) == 4 else entry[2]


def _wholly_inside(entry: tuple, chunk_start: int, chunk_end: int) -> bool:
    if len(entry) == 4:
        return entry[2] >= chunk_start and entry[3] < chunk_end
    offsets = entry[1].offsets
    return offsets[0][0] >= chunk_start and offsets[-1][1] < chunk_end


def _batch_encode_per_image_misses(
    data_embedding_func: DataEmbeddingFunc,
    per_image_requests: list[PerImageRequestInfo],
    device: torch.device,
) -> dict[tuple[int | None, int], torch.Tensor]:
    """Fills each request's ``overlapping`` and returns the whole embedding of every item
    they overlap, keyed by ``(hash, token count)`` (by hash in 0.5.18): hits from the cache, the misses of all
    requests encoded together and cached. From 0.5.20 a miss wholly inside its chunk whose
    CUDA-IPC feature may be deferred is marked as borrowed."""
    form = _profile.form("_batch_encode_per_image_misses")
    borrows = form in ("borrows", "token counts")
    by_hash = form == "hash keys"
    hash_to_embedding: dict[tuple[int | None, int], torch.Tensor] = {}
    misses: dict[tuple[int | None, int], tuple[Any, Any, int]] = {}
    for req_info in per_image_requests:
        chunk_start = req_info.extend_prefix_len
        chunk_end = chunk_start + req_info.extend_seq_len
        req_info.overlapping = (
            _overlapping(req_info.items, req_info.items_offset, chunk_start, chunk_end)
            if req_info.extend_seq_len > 0 else []
        )
        for entry in req_info.overlapping:
            item = entry[1]
            token_count = _token_count(entry)
            cache_key = item.hash if by_hash else (item.hash, token_count)
            if cache_key in hash_to_embedding or cache_key in misses:
                continue
            present = borrows and embedding_cache.has(item.hash)
            cached = _cached_whole(item.hash, token_count, _core.modality_of(item))
            if cached is not None:
                hash_to_embedding[cache_key] = cached
                continue
            if borrows and not present and _wholly_inside(entry, chunk_start, chunk_end):
                can_defer = getattr(item, "can_defer_cuda_ipc_feature_reconstruction", None)
                if can_defer is not None and can_defer():
                    item.model_specific_data[BORROW_CUDA_IPC_FEATURE_KEY] = True
            misses[cache_key] = _miss(entry)
    if misses:
        keys = list(misses)
        for cache_key, embedding in zip(keys, _encode_whole(data_embedding_func, list(misses.values()), device)):
            hash_to_embedding[cache_key] = embedding
    return hash_to_embedding


def _by_item_embeddings(data_embedding_func, overlapping, device, acknowledge: bool) -> dict[int, torch.Tensor]:
    """Whole embeddings of one request's overlapping items by index: hits, then the
    misses encoded in one call."""
    whole: dict[int, torch.Tensor] = {}
    misses = []
    for entry in overlapping:
        cached = _cached_whole(entry[1].hash, _token_count(entry), _core.modality_of(entry[1]))
        if cached is None:
            misses.append(entry)
        else:
            whole[entry[0]] = cached
            if acknowledge:
                _acknowledge_hits([entry[1]])
    if misses:
        encoded = _encode_whole(data_embedding_func, [_miss(entry) for entry in misses], device)
        for entry, embedding in zip(misses, encoded):
            whole[entry[0]] = embedding
    return whole


def _get_chunked_embedding_by_item(
    data_embedding_func: DataEmbeddingFunc,
    embedding_items_per_req: list[MultimodalDataItem],
    items_offset: list[tuple[int, int]],
    extend_prefix_len: int,
    extend_seq_len: int,
    device: torch.device,
) -> torch.Tensor | None:
    """One request's chunk rows, its items encoded (on a miss) by themselves."""
    if extend_seq_len <= 0:
        return None
    chunk_end = extend_prefix_len + extend_seq_len
    overlapping = _overlapping(embedding_items_per_req, items_offset, extend_prefix_len, chunk_end)
    if not overlapping:
        return None
    whole = _by_item_embeddings(data_embedding_func, overlapping, device, acknowledge=True)
    return torch.cat([_item_rows(whole[idx], start, end, extend_prefix_len, chunk_end)
                      for idx, _, start, end in overlapping], dim=0)


def _get_chunked_embedding_by_item_slices(
    data_embedding_func: DataEmbeddingFunc,
    embedding_items_per_req: list[MultimodalDataItem],
    extend_prefix_len: int,
    extend_seq_len: int,
    device: torch.device,
) -> list[torch.Tensor]:
    """(0.5.22+) One request's chunk rows as one slice per item, each item sliced by its
    own offsets and encoded (on a miss) by itself."""
    if extend_seq_len <= 0:
        return []
    overlapping = _overlapping(embedding_items_per_req, None, extend_prefix_len, extend_prefix_len + extend_seq_len)
    if not overlapping:
        return []
    whole = _by_item_embeddings(data_embedding_func, overlapping, device, acknowledge=False)
    return [_slice_item_chunk(whole[idx], item, extend_prefix_len, extend_seq_len) for idx, item, _ in overlapping]


def _assemble_per_image_chunk(
    overlapping: list[tuple],
    hash_to_embedding: dict[tuple[int | None, int], torch.Tensor],
    extend_prefix_len: int,
    extend_seq_len: int,
) -> torch.Tensor | list[torch.Tensor] | None:
    """One request's chunk rows from the batch's table: one tensor (None when nothing
    overlaps), or from 0.5.22 a list of slices, one per item."""
    if _by_item_offsets():
        return [
            _slice_item_chunk(hash_to_embedding[(item.hash, token_count)], item, extend_prefix_len, extend_seq_len)
            for _idx, item, token_count in overlapping
        ]
    if not overlapping:
        return None
    chunk_end = extend_prefix_len + extend_seq_len
    by_hash = _profile.form("_assemble_per_image_chunk") == "hash keys"
    return torch.cat([
        _item_rows(hash_to_embedding[item.hash if by_hash else (item.hash, end - start + 1)], start, end,
                   extend_prefix_len, chunk_end)
        for _idx, item, start, end in overlapping
    ], dim=0)


def _per_request_backend() -> bool:
    return (_is_hip or _is_npu or _is_xpu) and not differences.batch_on_every_backend


def _is_audio(item: MultimodalDataItem) -> bool:
    is_audio = getattr(item, "is_audio", None)
    return bool(is_audio()) if is_audio is not None else False


def _get_chunked_prefill_embedding(
    data_embedding_func: DataEmbeddingFunc,
    embedding_items: list[MultimodalDataItem],
    items_size: list[int],
    prefix_length: list[int],
    extend_length: list[int],
    items_offset_list: list[list[tuple[int, int]]],
    input_ids: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Chunk rows of every request in request order: single-span items of all requests
    batched into one encoding, requests with multi-span items per request. What the
    step encodes is cached by one insert at its end, however many encoder calls it took."""
    with _one_insert_per_step():
        return _chunked_prefill_rows(data_embedding_func, embedding_items, items_size, prefix_length,
                                     extend_length, items_offset_list, input_ids)


def _chunked_prefill_rows(data_embedding_func, embedding_items, items_size, prefix_length, extend_length,
                          items_offset_list, input_ids):
    """``_get_chunked_prefill_embedding``'s work, inside the step's one insert."""
    form = _profile.form("_get_chunked_prefill_embedding")
    device = input_ids.device
    per_image_requests = []
    full_path_requests = []
    chunks: list[tuple[int, torch.Tensor]] = []
    for i in range(min(len(items_size) - 1, len(prefix_length))):
        if items_size[i] == items_size[i + 1]:
            continue
        items_per_req = embedding_items[items_size[i]: items_size[i + 1]]
        items_offset = items_offset_list[i]
        if items_offset is None:
            raise _core.EncoderOutputError(f"request {i}: items_offset_list holds None")
        extend_prefix_len = prefix_length[i]
        extend_seq_len = extend_length[i] if i < len(extend_length) else 0
        if extend_seq_len <= 0:
            continue
        chunk_end = extend_prefix_len + extend_seq_len
        if form == "window":  # 0.5.23: only requests with a span in the chunk
            if not any(end >= extend_prefix_len and start < chunk_end for start, end in items_offset):
                continue
        elif all(end < extend_prefix_len for _, end in items_offset):
            continue
        req_info = PerImageRequestInfo(
            req_idx=i, items=items_per_req, items_offset=items_offset,
            extend_prefix_len=extend_prefix_len, extend_seq_len=extend_seq_len,
        )
        if not all(len(item.offsets) == 1 or (form != "0.5.18" and _is_audio(item)) for item in items_per_req):
            full_path_requests.append(req_info)
        elif _per_request_backend():
            if form == "0.5.18":
                chunk = _get_chunked_embedding_by_item(
                    data_embedding_func, items_per_req, items_offset, extend_prefix_len, extend_seq_len, device,
                )
                if chunk is not None:
                    chunks.append((i, chunk))
            else:
                chunks.extend((i, chunk) for chunk in _get_chunked_embedding_by_item(
                    data_embedding_func, items_per_req, extend_prefix_len, extend_seq_len, device,
                ))
        else:
            per_image_requests.append(req_info)

    hash_to_embedding = (
        _batch_encode_per_image_misses(data_embedding_func, per_image_requests, device) if per_image_requests else {}
    )
    for req_info in per_image_requests:
        chunk = _assemble_per_image_chunk(
            req_info.overlapping, hash_to_embedding, req_info.extend_prefix_len, req_info.extend_seq_len,
        )
        if isinstance(chunk, list):
            chunks.extend((req_info.req_idx, piece) for piece in chunk)
        elif chunk is not None:
            chunks.append((req_info.req_idx, chunk))
    for req_info in full_path_requests:
        chunk, input_ids = _get_chunked_embedding_full(
            data_embedding_func, req_info.items, req_info.items_offset, req_info.extend_prefix_len,
            req_info.extend_seq_len, input_ids, device,
        )
        if chunk is not None:
            chunks.append((req_info.req_idx, chunk))
    chunks.sort(key=lambda pair: pair[0])
    if not chunks:
        return None, input_ids
    if len(chunks) == 1 and form != "0.5.18":
        return chunks[0][1], input_ids
    return torch.concat([chunk for _, chunk in chunks], dim=0), input_ids


def _get_multimodal_mask(
    input_ids: torch.Tensor, placeholder_tensor: torch.Tensor
) -> torch.Tensor:
    if _profile.form("_get_multimodal_mask") == "sorted" and placeholder_tensor.numel() == 0:
        raise InvalidItemError("placeholder_tensor is empty: no placeholder id to mark in input_ids")
    return _core.marked_placeholders(input_ids, placeholder_tensor)[0]


def _count_mm_tokens_in_extend(
    prefix_length: list[int],
    extend_length: list[int],
    items_offset_list: list[list[tuple[int, int]]],
) -> int:
    extends = [extend_length[i] if i < len(extend_length) else 0 for i in range(len(prefix_length))]
    return _core.count_mm_tokens_in_extend(prefix_length, extends, items_offset_list)


def _adjust_embedding_length(
    embedding: torch.Tensor,
    num_mm_tokens_in_input_ids: int,
    logger,
) -> torch.Tensor:
    """``embedding`` if it has one row per placeholder token; otherwise a typed error
    (or, with ``differences.raise_on_count_mismatch`` off, SGLang's warning and crop)."""
    rows = embedding.shape[0]
    if rows == num_mm_tokens_in_input_ids:
        return embedding
    if differences.raise_on_count_mismatch:
        raise _core.EmbeddingLengthMismatch(
            expected=num_mm_tokens_in_input_ids, received=rows,
            what="embedding rows for the placeholder tokens in input_ids",
        )
    # The count fields are SGLang's, for log searches that key on them.
    logger.warning(
        f"Multimodal embedding rows and placeholder tokens differ: "
        f"Got {num_mm_tokens_in_input_ids} tokens in the text but {rows} tokens from multimodal embeddings."
    )
    if num_mm_tokens_in_input_ids > rows:
        raise RuntimeError(
            f"{rows} multimodal embedding rows for {num_mm_tokens_in_input_ids} placeholder tokens: too few to place"
        )
    if get_schedule().chunked_prefill_size != -1:
        logger.warning("Dropping the first rows; a larger chunked_prefill_size (or no chunked prefill) avoids it")
    if embedding.dim() == 2:
        return embedding[-num_mm_tokens_in_input_ids:, :] if num_mm_tokens_in_input_ids else embedding[:0]
    return embedding[-(num_mm_tokens_in_input_ids // embedding.shape[0]):, :]


def get_embedding_and_mask(
    data_embedding_func: DataEmbeddingFunc,
    embedding_items: list[MultimodalDataItem],
    placeholder_tensor: torch.Tensor,
    input_ids: torch.Tensor,
    items_size: list[int],
    prefix_length: list[int],
    extend_length: list[int],
    items_offset_list: list[list[tuple[int, int]]],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """This chunk's embedding rows for one modality, the ``[N, 1]`` placeholder mask over
    ``input_ids``, and ``input_ids`` (rewritten when an EVS video's placeholders moved);
    ``(None, None, input_ids)`` when no placeholder of these items is in the chunk."""
    if embedding_cache is None:
        _warn_uncached()
        init_mm_embedding_cache(0)
    if _walk_call_graph(embedding_items, placeholder_tensor, items_size, prefix_length, extend_length):
        return _get_embedding_and_mask_by_call_graph(
            data_embedding_func, embedding_items, placeholder_tensor, input_ids, items_size,
            prefix_length, extend_length, items_offset_list,
        )
    extends = [extend_length[i] if i < len(extend_length) else 0 for i in range(len(prefix_length))]
    context = _acknowledging_context(embedding_items, items_size)
    return _core.embedding_and_mask(
        data_embedding_func, list(embedding_items), placeholder_tensor, input_ids, list(items_size),
        list(prefix_length), extends, list(items_offset_list), cache=embedding_cache, context=context,
        check_count=differences.raise_on_count_mismatch,
    )


def _acknowledging_context(embedding_items, items_size) -> _core.StepContext:
    """The step context, acknowledging cache hits as SGLang's module does: only the items
    of requests served whole from the cache (those with a multi-span item), and only
    until 0.5.22; hits of the batched per-image path never are."""
    context = _step_context()
    if not _profile.has("_acknowledge_deferred_cuda_ipc_cache_hits"):
        return _core.without_hit_acknowledgement(context)
    whole = {id(item) for request in _requests(embedding_items, items_size)
             if any(len(item.offsets) > 1 for item in request) for item in request}
    if not whole:
        return _core.without_hit_acknowledgement(context)
    if context.on_cache_hit is None:
        # The release acknowledges these hits whatever the engine's hook (its own tests
        # replace the module's helper to stop it): so does its stand-in.
        context = dataclasses.replace(context, on_cache_hit=_release_acknowledgement)
    return _core.acknowledging_only(context, whole)


def _release_acknowledgement(items, parallel) -> None:
    _acknowledge_deferred_cuda_ipc_cache_hits(items)


def _requests(embedding_items, items_size):
    return [embedding_items[items_size[i]: items_size[i + 1]] for i in range(len(items_size) - 1)]


def _get_embedding_and_mask_by_call_graph(
    data_embedding_func, embedding_items, placeholder_tensor, input_ids, items_size,
    prefix_length, extend_length, items_offset_list,
):
    original_input_ids = input_ids
    num_mm_tokens_in_input_ids = _count_mm_tokens_in_extend(prefix_length, extend_length, items_offset_list)
    embedding = _get_precomputed_embedding(
        embedding_items, items_size, prefix_length, extend_length, items_offset_list
    )
    if embedding is None:
        with _one_insert_per_step():  # also when _get_chunked_prefill_embedding is replaced
            embedding, input_ids = _get_chunked_prefill_embedding(
                data_embedding_func, embedding_items, items_size, prefix_length, extend_length,
                items_offset_list, input_ids,
            )
        if embedding is None:
            return None, None, input_ids
    special_multimodal_mask = _get_multimodal_mask(input_ids, placeholder_tensor)
    if input_ids is not original_input_ids:
        # The EVS rewrite moved placeholders, so the offsets no longer count them.
        num_mm_tokens_in_input_ids = int(special_multimodal_mask.sum().item())
    else:
        maybe_assert_sum(
            special_multimodal_mask, num_mm_tokens_in_input_ids,
            "placeholder tokens counted from the items' offsets",
        )
    embedding = _adjust_embedding_length(embedding, num_mm_tokens_in_input_ids, logger)
    return embedding, special_multimodal_mask, input_ids


# Names whose rebinding (by a test, a fork, a monkeypatch) must change get_embedding_and_mask's path.
CALL_GRAPH_NAMES = (
    "_is_hip", "_is_npu", "_is_xpu", "get_embedding_chunk", "_get_precomputed_embedding",
    "_flatten_embedding_result", "_embedding_token_count", "_discard_mismatched_cached_embedding",
    "_can_skip_pre_embed_feature_move", "_move_items_to_device", "_acknowledge_deferred_cuda_ipc_cache_hits",
    "_get_chunked_embedding_full", "_batch_encode_per_image_misses", "_get_chunked_embedding_by_item",
    "_assemble_per_image_chunk", "_get_chunked_prefill_embedding", "_get_multimodal_mask",
    "_count_mm_tokens_in_extend", "_adjust_embedding_length", "maybe_assert_sum", "get_schedule",
    "get_parallel", "init_mm_embedding_cache", "_item_overlap", "_slice_item_chunk",
)
_ORIGINAL: dict[str, Any] = {}


def _walk_call_graph(embedding_items, placeholder_tensor, items_size, prefix_length, extend_length) -> bool:
    """True when a name of the call graph was rebound, when the cache is not mm_schedule's
    own (a replacement object gets SGLang's API calls only), on a backend switched to
    SGLang's per-request encoding, for precomputed embeddings (no encoder runs, and
    SGLang returns empty rows for a chunk without any), and where the release's module
    does more than one planned step does: features offloaded to the host to wait for
    (0.5.21+), deferred CUDA-IPC features to mark borrowed (0.5.20+), audio items of
    several runs cached per item (0.5.22+), an empty placeholder set refused (0.5.23).
    False for a batch with an EVS video: mm_schedule's EVS path moves its placeholders."""
    if _core.has_pruned_video(embedding_items, items_size, prefix_length):
        return False
    namespace = globals()
    if any(namespace.get(name) is not original for name, original in _ORIGINAL.items()):
        return True
    if not isinstance(embedding_cache, MultiModalStaticCache) or _per_request_backend():
        return True
    if not embedding_items:
        return False
    if getattr(embedding_items[0], "precomputed_embeddings", None) is not None:
        return True
    return _release_needs_call_graph(embedding_items, placeholder_tensor, items_size, prefix_length, extend_length)


def _encodes_outside_its_rows(embedding_items, items_size, prefix_length, extend_length) -> bool:
    """(Until 0.5.23) Whether a request of multi-span items is encoded in a chunk that
    holds none of its rows: SGLang then encodes it whole, caches it, and returns its
    empty chunk; one planned step encodes only rows the chunk holds."""
    for i, request in enumerate(_requests(embedding_items, items_size)):
        if i >= len(prefix_length) or not any(len(item.offsets) > 1 for item in request):
            continue
        start, end = prefix_length[i], prefix_length[i] + (extend_length[i] if i < len(extend_length) else 0)
        spans = [span for item in request for span in item.offsets]
        if end > start and not any(e >= start and s < end for s, e in spans) and any(e >= start for _, e in spans):
            return True
    return False


def _release_needs_call_graph(embedding_items, placeholder_tensor, items_size, prefix_length, extend_length) -> bool:
    if globals().get("host_offload_event") is not None:
        return True
    if _profile.form("_batch_encode_per_image_misses") != "spans" and any(
        getattr(item, "can_defer_cuda_ipc_feature_reconstruction", _never)() for item in embedding_items
    ):
        return True
    multi_span = any(len(item.offsets) > 1 for item in embedding_items)
    if multi_span and _by_item_offsets() and _is_audio(embedding_items[0]):
        return True
    if multi_span and _profile.form("_get_chunked_prefill_embedding") != "window" \
            and _encodes_outside_its_rows(embedding_items, items_size, prefix_length, extend_length):
        return True
    return _profile.form("_get_multimodal_mask") == "sorted" and placeholder_tensor.numel() == 0


def _never() -> bool:
    return False


# -- the release this module is ---------------------------------------------------------------

# Every implementation of a name of ``versions.FORMS``, by (name, form); a form not listed
# is the one the name is defined with above.
_IMPLEMENTATIONS: dict[tuple[str, str], Any] = {
    ("_move_items_to_device", "items, device, data_embedding_func"): _move_items_to_device_after_offload,
    ("_get_chunked_embedding_by_item", "slices"): _get_chunked_embedding_by_item_slices,
}
for (_name, _form), _impl in _IMPLEMENTATIONS.items():
    _impl.__name__ = _impl.__qualname__ = _name
_DEFINED = {name: globals()[name] for name in profile(NEWEST).forms if name in globals()}
_DEFINED.update({name: globals()[name] for name in CALL_GRAPH_NAMES})
del _name, _form, _impl


def release() -> str:
    """The SGLang release whose module this currently is."""
    return _profile.version


def use_release(version: str) -> Profile:
    """Be the module of SGLang ``version`` (a known release, or the nearest known one not
    newer): each name of ``versions.FORMS`` bound to its form there, names the release
    lacks removed. Returns the profile applied."""
    global _profile
    chosen = profile(version)
    namespace = globals()
    for name, form in chosen.forms.items():
        if form is None:
            namespace.pop(name, None)
        else:
            namespace[name] = _IMPLEMENTATIONS.get((name, form), _DEFINED[name])
    _profile = chosen
    _ORIGINAL.clear()
    _ORIGINAL.update({name: namespace[name] for name in CALL_GRAPH_NAMES if name in namespace})
    return chosen


use_release(NEWEST)


_warned_uncached = False


def _warn_uncached() -> None:
    global _warned_uncached
    if not _warned_uncached:
        _warned_uncached = True
        logger.warning(
            "get_embedding_and_mask: init_mm_embedding_cache was not called; using a cache of size 0,"
            " so every chunk encodes its items again"
        )
