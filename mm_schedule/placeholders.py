"""Which tokens of ``input_ids`` are placeholders: the mask SGLang's API returns.

The ids are compared in the wider of the two dtypes, so an int64 pad value is never
narrowed into a collision with an int32 token id. How, by where the tokens are and how
many placeholder ids there are (SGLang passes one per item, so thousands in a large step):

* on the CPU, int64 or int32 tokens, with the package's C helper built
  (``_placeholder_set.c``): one pass over the tokens against a hash set of the ids,
  which also counts the marks; the other paths below are its fallback;
* on a GPU (and on ``meta``, a dry run of one), ``mm_schedule.kernels.placeholder_mask``:
  one kernel launch comparing every token with every id, or beyond its size a sorted
  search; neither waits for the device (``torch.isin`` sorts through ``unique`` for
  large id sets, whose output size the host must read);
* elsewhere, a few ids (fewer than ``10 * tokens ** 0.145``): ``torch.isin``, which then
  compares against each id directly;
* many, on the CPU without the C helper: a small hash table of the ids (open buckets on
  the low bits, each bucket's ids in its own row), three cheap passes over ``input_ids``;
  about twice as fast as ``isin``, which sorts (ids repeated until a bucket overflows, as
  one image token id passed once per item is, are deduplicated first);
* many, on another device: the sorted search.
"""

from __future__ import annotations

import secrets
from typing import Any

import torch

from .errors import EmbeddingLengthMismatch, InvalidItemError
from .kernels.placeholder_mask import MASK_OP, marks_in_one_launch, sorted_membership

try:
    from . import _placeholder_set
except ImportError:  # installed without a C compiler: the torch paths answer alone
    _placeholder_set = None

_TABLE_SLOTS_PER_ID = 64  # buckets hold one or two ids: two gathers per token where 16 slots took three
_TABLE_MAX_DEPTH = 8  # deeper buckets (ids sharing their low bits): use isin instead
_HASH_MULTIPLIER = secrets.randbits(64) | 1  # per process: nobody can pick ids that collide
_TOKEN_BYTES = {torch.int64: 8, torch.int32: 4}  # token dtypes the C helper reads
# Id dtypes whose every value an int64 holds exactly (the C helper's set is int64).
_WIDENS_TO_INT64 = {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}


def _integer(t: Any, what: str) -> None:
    dtype = t.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
        raise InvalidItemError(f"{what} must be an integer tensor, got {dtype}")


def placeholder_mask(input_ids: Any, placeholder_ids: Any) -> Any:
    """``[N, 1]`` bool: which of the ``N`` tokens of ``input_ids`` is one of ``placeholder_ids``."""
    return marked_placeholders(input_ids, placeholder_ids)[0]


def marked_placeholders(input_ids: Any, placeholder_ids: Any) -> tuple[Any, int]:
    """``placeholder_mask`` and the number of tokens it marks."""
    ids = input_ids if input_ids.dim() == 1 else input_ids.reshape(-1)
    pads = placeholder_ids if isinstance(placeholder_ids, torch.Tensor) else torch.as_tensor(placeholder_ids)
    _integer(ids, "input_ids")
    if (_placeholder_set is not None and ids.dtype in _TOKEN_BYTES and pads.dtype in _WIDENS_TO_INT64
            and ids.is_cpu and pads.is_cpu and pads.numel() and not ids.is_neg()):
        return _marked_in_one_pass(ids, pads)
    if pads.dtype is not ids.dtype or pads.device != ids.device or pads.dim() != 1:
        _integer(pads, "placeholder ids")
        pads = pads.reshape(-1).to(ids.device, non_blocking=True)
        common = torch.promote_types(ids.dtype, pads.dtype)
        ids, pads = ids.to(common), pads.to(common)
    mask = _membership(ids, pads)
    return mask, int(mask.count_nonzero())


def _marked_in_one_pass(ids: Any, pads: Any) -> tuple[Any, int]:
    if pads.dtype is not torch.int64 or pads.is_neg():
        pads = pads.to(torch.int64).resolve_neg()
    if pads.dim() != 1 or not pads.is_contiguous():
        pads = pads.reshape(-1).contiguous()
    if not ids.is_contiguous():
        ids = ids.contiguous()
    mask = torch.empty((ids.numel(), 1), dtype=torch.bool)
    marked = _placeholder_set.mark_members(
        ids.data_ptr(), ids.numel(), _TOKEN_BYTES[ids.dtype], pads.data_ptr(), pads.numel(), mask.data_ptr(),
        _HASH_MULTIPLIER,
    )
    return mask, marked


def _membership(ids: Any, pads: Any, kind: str | None = None) -> Any:
    """``[N, 1]`` mask of 1-D ``ids`` and ``pads`` of one dtype on one device (of type ``kind``)."""
    kind = kind or ids.device.type
    n = pads.numel()
    if n and kind != "cpu" and marks_in_one_launch(ids, pads, kind):
        return MASK_OP(ids, pads)  # already [N, 1]
    if n == 0 or n < 10 * ids.numel() ** 0.145:
        # torch.isin's own rule for comparing against each id (no sort, no device wait).
        return torch.isin(ids.view(-1, 1), pads)  # already [N, 1]
    if kind == "cpu":
        mask = _table_lookup(ids, pads)
    else:
        mask = sorted_membership(ids, pads)
    return mask.unsqueeze(-1)


def _table_lookup(ids: Any, pads: Any) -> Any:
    n = pads.numel()
    size = 1 << (_TABLE_SLOTS_PER_ID * n - 1).bit_length()
    bucket = pads & (size - 1)
    order = bucket.argsort()
    bucket = bucket[order]
    depth = torch.arange(n) - torch.searchsorted(bucket, bucket)  # place within the bucket
    rows = int(depth.max()) + 1
    if rows > _TABLE_MAX_DEPTH:
        distinct = pads.unique()
        if distinct.numel() < n:
            # Repeated ids (one image token id passed once per item) deepened the buckets.
            return _membership(ids, distinct, "cpu").view(-1)
        return torch.isin(ids, pads)
    # Empty slots hold a real placeholder id, so matching one is still a right answer.
    table = pads[:1].expand(rows, size).clone()
    table[depth, bucket] = pads[order]
    slot = ids & (size - 1)
    mask = table[0].index_select(0, slot) == ids
    for row in table[1:]:
        mask |= row.index_select(0, slot) == ids
    return mask


# -- the placeholder count a step's rows must match ---------------------------------------


def tokens_before(spans: Any, position: int) -> int:
    """Placeholder tokens of ``spans`` (inclusive ``(start, end)`` pairs) at positions < ``position``."""
    return sum(max(0, min(end + 1, position) - start) for start, end in spans)


def count_mm_tokens_in_extend(prefix_length: Any, extend_length: Any, items_offset_list: Any) -> int:
    """Placeholder tokens inside every request's chunk window, from host offsets only."""
    total = 0
    for prefix, extend, spans in zip(prefix_length, extend_length, items_offset_list):
        total += tokens_before(spans, prefix + extend) - tokens_before(spans, prefix)
    return total


def checked_mask(input_ids: Any, placeholder_tensor: Any, rows: int, plan: Any = None) -> Any:
    """The placeholder mask over ``input_ids``, which must mark exactly ``rows`` tokens (the
    count the items' offsets give, known on the host): a prompt whose placeholder tokens
    and item offsets disagree would otherwise pair rows with the wrong tokens downstream.

    Checked on the host only where ``input_ids`` live there (a typed error naming the
    request and item hash when ``plan``, the step's plan, is given); on a device an
    asynchronous device assert compares the counts, so the step never waits for the GPU;
    on ``meta`` (a dry run, no data) nothing can be compared."""
    kind = input_ids.device.type
    if kind != "cpu":
        ids = input_ids if input_ids.dim() == 1 else input_ids.reshape(-1)
        mask = _device_mask(ids, placeholder_tensor, kind)
        if kind != "meta":
            torch._assert_async(
                mask.sum() == rows,
                f"mm_schedule: input_ids hold another number of placeholder tokens than the {rows} embedding rows"
                " of these items (their offsets and input_ids describe different prompts)",
            )
        return mask
    mask, placeholders = marked_placeholders(input_ids, placeholder_tensor)
    if placeholders != rows:
        request, item_hash, hint = _culprit(mask, plan) if plan is not None else (None, None, "")
        raise EmbeddingLengthMismatch(
            expected=placeholders, received=rows, request=request, item_hash=item_hash,
            what="embedding rows for the placeholder tokens of these items in input_ids",
            hint=hint or "the items' offsets and input_ids describe different prompts",
        )
    return mask


def _device_mask(ids: Any, placeholder_ids: Any, kind: str) -> Any:
    """``placeholder_mask`` of 1-D ``ids`` on a device of type ``kind`` (not the CPU)."""
    pads = placeholder_ids if isinstance(placeholder_ids, torch.Tensor) else torch.as_tensor(placeholder_ids)
    if pads.dtype is ids.dtype and pads.dim() == 1 and ids.dtype in _TOKEN_BYTES and (
            pads.is_meta if kind == "meta" else pads.device == ids.device):
        return _membership(ids, pads, kind)  # SGLang's usual call: ids and pads of one int dtype on one device
    _integer(ids, "input_ids")
    _integer(pads, "placeholder ids")
    pads = pads.reshape(-1).to(ids.device, non_blocking=True)
    common = torch.promote_types(ids.dtype, pads.dtype)
    return _membership(ids.to(common), pads.to(common), kind)


def _culprit(mask: Any, plan: Any) -> tuple[Any, Any, str]:
    """``(request, item hash, hint)`` of the first placeholder the mask and the plan's
    segments disagree on (``input_ids`` being the step's extend tokens, in request order)."""
    marked = mask.reshape(-1)
    if marked.numel() != plan.n_tokens:
        return None, None, (f"input_ids hold {marked.numel()} tokens, the requests' extend lengths add up to"
                            f" {plan.n_tokens}")
    want = torch.zeros(plan.n_tokens, dtype=torch.bool)
    for row, n in zip(plan.seg_token_row, plan.seg_rows):
        want[row : row + n] = True
    differ = (want != marked).nonzero()
    if not differ.numel():
        return None, None, ""
    token = int(differ[0])
    # The segment holding that token, else the first one after it, else the last.
    segment = next((k for k, (row, n) in enumerate(zip(plan.seg_token_row, plan.seg_rows)) if token < row + n),
                   len(plan.seg_rows) - 1)
    source = plan.seg_source[segment]
    kind = "is not a placeholder in input_ids" if want[token] else "is a placeholder no item's offsets cover"
    return (plan.seg_request[segment], getattr(plan.first_items[source], "hash", None),
            f"token {token} of input_ids {kind}")
