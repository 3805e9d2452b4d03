"""A step's multimodal rows from vLLM's scheduler state, planned once and copied in one launch.

vLLM's model runner gathers a step's rows request by request and item by item: a slice
of each cached encoder output per placeholder range in the step's window, a list of
views, a boolean mask over the step's tokens, and later a ``torch.cat`` and a masked
write. ``plan_rows`` walks the same requests and ranges once, on the host, and writes a
segment table instead: which rows of which encoder output the step needs, where they
sit in the packed result (vLLM's order: request, then item, then position) and at which
token row of ``inputs_embeds`` each one lands. The returned ``StepRows`` then

* ``gather()``: the packed rows, ``torch.cat`` of what vLLM's gather returns (one copy);
* ``is_mm_embed()``: vLLM's mask, built from the table (a few torch calls, no loop);
* ``merge_into(inputs_embeds)``: the rows written straight to their token rows, no mask.

The window rule is vLLM's: request ``i`` computes prompt positions
``[num_computed_tokens[i], num_computed_tokens[i] + num_scheduled_tokens[i])`` into token
rows starting at ``query_start_loc[i]``; an item's ``PlaceholderRange(offset, length,
is_embed)`` covers positions ``[offset, offset + length)``, and only the positions whose
``is_embed`` is true take an encoder row (the ``k``-th true position takes row ``k``).
``draft_lookahead`` shifts every window (the drafter's look-ahead), and an item that only
the shift reaches may be missing from the store, as in vLLM.

Every input is checked while planning (sorted, non-overlapping ranges, ``is_embed`` of
the range's length, token rows inside the step) and every encoder output once, against
the rows its item must have (``EmbeddingLengthMismatch`` names the request and the
``mm_hash``); a needed output missing from the store raises ``EncoderCacheMiss``.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate
from operator import add
from typing import Any

import torch

from ._engine import (
    EmbeddingLengthMismatch,
    InvalidItemError,
    KernelInputError,
    SegmentTable,
    copy_segments,
    one_dtype,
)
from .errors import EncoderCacheMiss
from .releases import installed_release_checked


def _offset(feature) -> int:
    return feature.mm_position.offset


def _end(feature) -> int:
    position = feature.mm_position
    return position.offset + position.length


class _EmbedRuns:
    """An ``is_embed`` mask as runs of true positions: ``starts``, ``ends`` (relative to
    the range) and ``before`` (embedding rows of the runs before each)."""

    __slots__ = ("before", "ends", "rows", "starts")

    def __init__(self, is_embed, length: int, what: str) -> None:
        if not isinstance(is_embed, torch.Tensor) or is_embed.dim() != 1 or is_embed.shape[0] != length:
            shape = tuple(is_embed.shape) if isinstance(is_embed, torch.Tensor) else type(is_embed).__name__
            raise InvalidItemError(f"{what}: is_embed must be a 1-D mask of the range's length {length}, got {shape}")
        mask = is_embed.detach().to("cpu", torch.int8)
        edges = torch.diff(mask, prepend=mask.new_zeros(1), append=mask.new_zeros(1))
        self.starts = edges.eq(1).nonzero().flatten().tolist()
        self.ends = edges.eq(-1).nonzero().flatten().tolist()
        self.before = [0, *accumulate(map(int.__sub__, self.ends, self.starts))]
        self.rows = self.before.pop()


# Runs of the masks seen so far, by the mask tensor (a request's features live for all of
# its steps); an entry whose tensor is gone is dropped when the table is pruned.
_RUNS: dict[int, tuple[Any, _EmbedRuns]] = {}
_RUNS_LIMIT = 1 << 14


def _runs_of(position, what: str) -> _EmbedRuns:
    is_embed = position.is_embed
    entry = _RUNS.get(id(is_embed))
    if entry is not None and entry[0]() is is_embed:
        return entry[1]
    runs = _EmbedRuns(is_embed, position.length, what)
    if len(_RUNS) >= _RUNS_LIMIT:
        for key in [k for k, (ref, _) in _RUNS.items() if ref() is None] or list(_RUNS):
            del _RUNS[key]
    _RUNS[id(is_embed)] = (weakref.ref(is_embed), runs)
    return runs


def _ints(values, n: int, what: str) -> list[int]:
    if isinstance(values, torch.Tensor) or hasattr(values, "tolist"):
        values = values.tolist()
    values = list(values)
    if len(values) < n:
        raise InvalidItemError(f"{what} has {len(values)} entries for {n} requests")
    return values[:n]


class StepRows:
    """One step's multimodal rows, planned (see the module docstring). Build it with
    ``plan_rows`` (or the vLLM-shaped wrappers); it holds the encoder outputs it reads."""

    __slots__ = (
        "dtype",
        "fused_dst",
        "fused_rows",
        "fused_src",
        "fused_src_row",
        "hidden",
        "keys",
        "n_rows",
        "n_tokens",
        "overlap",
        "packed_rows",
        "packed_src",
        "packed_src_row",
        "sources",
    )

    def __init__(self, n_tokens: int) -> None:
        self.n_tokens = n_tokens
        self.sources: list[Any] = []
        self.keys: list[str] = []
        self.packed_src: list[int] = []
        self.packed_src_row: list[int] = []
        self.packed_rows: list[int] = []
        self.fused_src: list[int] = []
        self.fused_src_row: list[int] = []
        self.fused_rows: list[int] = []
        self.fused_dst: list[int] = []
        self.overlap: tuple[str, str, str] | None = None
        self.n_rows = 0
        self.hidden: int | None = None
        self.dtype = None

    @property
    def device(self):
        return self.sources[0].device if self.sources else None

    # -- outputs --------------------------------------------------------------------

    def gather(self, *, out=None, dtype=None):
        """The packed ``[n_rows, H]`` rows in vLLM's order (``torch.cat`` of the list vLLM's
        gather returns); ``out`` (contiguous, at least ``n_rows`` rows) to write into, or a
        new tensor of ``dtype`` (default: the encoder outputs'). None when the step has no
        rows and no ``out``."""
        if not self.n_rows:
            return out
        if out is None:
            out = torch.empty((self.n_rows, self.hidden), dtype=dtype or self.dtype, device=self.device)
        else:
            self._check_destination(out, self.n_rows, "out")
        rows = list(accumulate(self.packed_rows, initial=0))
        rows.pop()
        whole = self.n_rows if out.dtype == self.dtype and self._whole_in_order() else None
        table = SegmentTable(self.packed_src, self.packed_src_row, self.packed_rows, rows, whole_sources_rows=whole)
        copy_segments(self._sources_for(out.dtype), table, out)
        return out

    def is_mm_embed(self, *, device="cpu", pin_memory: bool = False):
        """vLLM's ``is_mm_embed``: a bool ``[n_tokens]`` mask, true at the token rows that
        take a multimodal row (the union of the ranges, as vLLM ORs them)."""
        if not self.fused_dst:
            return torch.zeros(self.n_tokens, dtype=torch.bool, device=device, pin_memory=pin_memory)
        # +1 at every run's first row, -1 past its last; a running sum > 0 inside a run.
        marks = torch.zeros(self.n_tokens + 1, dtype=torch.int32)
        ones = torch.ones(len(self.fused_dst), dtype=torch.int32)
        marks.index_add_(0, torch.tensor(self.fused_dst), ones)
        marks.index_add_(0, torch.tensor(list(map(add, self.fused_dst, self.fused_rows))), ones, alpha=-1)
        mask = marks[:-1].cumsum_(0).gt_(0)
        if pin_memory:
            mask = mask.pin_memory()
        return mask if torch.device(device).type == "cpu" else mask.to(device, non_blocking=pin_memory)

    def merge_into(self, inputs_embeds):
        """Write every row at its token row of ``inputs_embeds`` (``[T, H]`` with ``T >=
        n_tokens``, contiguous; in place, cast to its dtype) and return it: the same tensor
        vLLM's ``_merge_multimodal_embeddings`` leaves, without the mask."""
        if self.overlap is not None:
            request, first, second = self.overlap
            raise InvalidItemError(
                f"request {request!r}: the placeholder ranges of {first!r} and {second!r} overlap; vLLM's"
                " masked merge pairs such rows by rank, not by position (models that interleave them merge"
                " by modality themselves): use gather() and is_mm_embed() with the model's own merge"
            )
        if not self.n_rows:
            return inputs_embeds
        flat = inputs_embeds if inputs_embeds.dim() == 2 else None
        if flat is None:
            raise KernelInputError(f"inputs_embeds must be [tokens, hidden], got shape {tuple(inputs_embeds.shape)}")
        self._check_destination(flat, self.n_tokens, "inputs_embeds")
        table = SegmentTable(self.fused_src, self.fused_src_row, self.fused_rows, self.fused_dst)
        copy_segments(self._sources_for(flat.dtype), table, flat)
        return inputs_embeds

    # -- helpers --------------------------------------------------------------------

    def _whole_in_order(self) -> bool:
        n = len(self.sources)
        return len(self.packed_src) == n and self.packed_src == list(range(n)) and self.n_rows == sum(
            s.shape[0] for s in self.sources)

    def _sources_for(self, dtype) -> list:
        return self.sources if self.dtype is not None else one_dtype(self.sources, dtype)

    def _check_destination(self, dst, rows: int, what: str) -> None:
        if dst.dim() != 2 or dst.shape[0] < rows or dst.shape[1] != self.hidden:
            raise KernelInputError(
                f"{what} has shape {tuple(dst.shape)}; the step needs at least [{rows}, {self.hidden}]")
        if not dst.is_contiguous():
            raise KernelInputError(f"{what} must be contiguous to be written in place")
        if dst.device != self.device:
            raise KernelInputError(f"{what} is on {dst.device}, the encoder outputs on {self.device}")
        if not dst.is_floating_point():
            raise KernelInputError(f"{what} has dtype {dst.dtype}; multimodal rows go into a floating-point tensor")


def plan_rows(
    req_ids: Sequence[str],
    mm_features: Sequence[Sequence[Any]],
    num_computed_tokens,
    num_scheduled_tokens,
    encoder_outputs: Mapping[str, Any],
    *,
    query_start_loc=None,
    prefill_lens=None,
    draft_lookahead: int = 0,
) -> StepRows:
    """Plan one step (see the module docstring).

    ``req_ids``: the step's requests in batch order; ``mm_features[i]``: request ``i``'s
    ``MultiModalFeatureSpec`` list (sorted by offset); ``num_computed_tokens`` /
    ``num_scheduled_tokens``: per request (lists, numpy arrays or CPU tensors);
    ``encoder_outputs``: vLLM's store, ``identifier`` (the ``mm_hash``) -> ``[rows, H]``.
    ``query_start_loc``: each request's first token row (default: the running sum of the
    scheduled counts); ``prefill_lens``: with it, a request whose computed tokens reach its
    prompt length takes no rows (model runner v2 skips decode requests so).
    """
    installed_release_checked()
    n = len(req_ids)
    if len(mm_features) < n:
        raise InvalidItemError(f"mm_features has {len(mm_features)} entries for {n} requests")
    computed = _ints(num_computed_tokens, n, "num_computed_tokens")
    scheduled = _ints(num_scheduled_tokens, n, "num_scheduled_tokens")
    if query_start_loc is None:
        starts = list(accumulate(scheduled, initial=0))
        n_tokens = starts.pop()
    else:
        starts = _ints(query_start_loc, n, "query_start_loc")
        n_tokens = 0
        for i, (start, count) in enumerate(zip(starts, scheduled)):
            if start < n_tokens or count < 0:
                raise InvalidItemError(
                    f"request {req_ids[i]!r}: token rows [{start}, {start + count}) overlap the previous request's")
            n_tokens = start + count
    prefill = None if prefill_lens is None else _ints(prefill_lens, n, "prefill_lens")
    step = StepRows(n_tokens)
    source_of: dict[str, int] = {}
    sources, keys = step.sources, step.keys
    p_src, p_row, p_n = step.packed_src, step.packed_src_row, step.packed_rows
    f_src, f_row, f_n, f_dst = step.fused_src, step.fused_src_row, step.fused_rows, step.fused_dst
    get_output = encoder_outputs.get
    for i in range(n):
        count = scheduled[i]
        first = computed[i] + draft_lookahead
        last = first + count
        if count <= 0 or (prefill is not None and first >= prefill[i]):
            continue
        features = mm_features[i]
        if not features:
            continue
        lo = bisect_left(features, first + 1, key=_end)
        hi = bisect_left(features, last, key=_offset)
        base = starts[i] - first  # token row of prompt position 0 of this request
        previous_offset, previous_end, previous_key = -1, -1, None
        for feature in features[lo:hi]:
            position = feature.mm_position
            offset, length = position.offset, position.length
            key = feature.identifier
            if offset < previous_end:
                if offset < previous_offset:
                    raise InvalidItemError(
                        f"request {req_ids[i]!r}: mm_features are not sorted by offset ({previous_key!r} at"
                        f" {previous_offset} before {key!r} at {offset})")
                step.overlap = step.overlap or (req_ids[i], previous_key, key)
            previous_offset, previous_end, previous_key = offset, max(previous_end, offset + length), key
            a = first - offset if first > offset else 0
            b = last - offset if last - offset < length else length
            is_embed = position.is_embed
            if is_embed is None:
                rows_needed, ea, eb = length, a, b
                runs = None
            else:
                runs = _runs_of(position, f"request {req_ids[i]!r}, mm_hash {key!r}")
                rows_needed = runs.rows
                r0, r1 = bisect_right(runs.ends, a), bisect_left(runs.starts, b)
                if r0 >= r1:
                    continue  # no embedding position in this window
                ea = runs.before[r0] + max(a - runs.starts[r0], 0)
                eb = runs.before[r1 - 1] + min(b, runs.ends[r1 - 1]) - runs.starts[r1 - 1]
            source = source_of.get(key)
            if source is None:
                output = get_output(key)
                if output is None:
                    if offset + draft_lookahead >= last:
                        continue  # reached only through the look-ahead: vLLM leaves the text row
                    raise EncoderCacheMiss(request=req_ids[i], mm_hash=key, offset=offset, length=length)
                source = source_of[key] = len(sources)
                sources.append(_checked_output(step, output, rows_needed, req_ids[i], key))
                keys.append(key)
            elif sources[source].shape[0] != rows_needed:
                raise EmbeddingLengthMismatch(expected=rows_needed, received=sources[source].shape[0],
                                              request=req_ids[i], item_hash=key, what="encoder output rows")
            p_src.append(source)
            p_row.append(ea)
            p_n.append(eb - ea)
            row = base + offset
            if runs is None:
                f_src.append(source)
                f_row.append(a)
                f_n.append(b - a)
                f_dst.append(row + a)
                continue
            for r in range(r0, r1):
                s = max(runs.starts[r], a)
                e = min(runs.ends[r], b)
                f_src.append(source)
                f_row.append(runs.before[r] + s - runs.starts[r])
                f_n.append(e - s)
                f_dst.append(row + s)
    step.n_rows = sum(p_n)
    return step


def _checked_output(step: StepRows, output, rows: int, request: str, key: str):
    """One encoder output, checked against its item and the step's others once per step."""
    if not isinstance(output, torch.Tensor) or output.dim() != 2:
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise KernelInputError(f"request {request!r}, mm_hash {key!r}: encoder output must be [rows, hidden], got {shape}")
    if output.shape[0] != rows:
        raise EmbeddingLengthMismatch(expected=rows, received=output.shape[0], request=request, item_hash=key,
                                      what="encoder output rows", hint="rows for the true positions of is_embed"
                                      if rows != output.shape[0] else "")
    if step.hidden is None:
        step.hidden, step.dtype = output.shape[1], output.dtype
        first_device = output.device
    else:
        first_device = step.sources[0].device
        if output.shape[1] != step.hidden:
            raise KernelInputError(f"request {request!r}, mm_hash {key!r}: encoder output has hidden size"
                                   f" {output.shape[1]}, the step's first has {step.hidden}")
        if output.dtype != step.dtype:
            step.dtype = None  # mixed: cast to the destination's dtype before copying
    if output.device != first_device:
        raise KernelInputError(f"request {request!r}, mm_hash {key!r}: encoder output is on {output.device},"
                               f" the step's first on {first_device}")
    if not output.is_floating_point():
        raise KernelInputError(f"request {request!r}, mm_hash {key!r}: encoder output has dtype {output.dtype}")
    return output if output.is_contiguous() else output.contiguous()


# -- vLLM-shaped entry points -------------------------------------------------------------


def plan_from_scheduler_output(scheduler_output, req_ids: Sequence[str], requests: Mapping[str, Any],
                               encoder_cache: Mapping[str, Any], shift_computed_tokens: int = 0) -> StepRows:
    """``plan_rows`` from model runner v1's state: ``scheduler_output.num_scheduled_tokens``
    (by request id), ``input_batch.req_ids``, ``requests[req_id]`` (``num_computed_tokens``,
    ``mm_features``) and its ``encoder_cache`` dict."""
    scheduled = scheduler_output.num_scheduled_tokens
    states = [requests[r] for r in req_ids]
    return plan_rows(req_ids, [s.mm_features for s in states], [s.num_computed_tokens for s in states],
                     [scheduled[r] for r in req_ids], encoder_cache, draft_lookahead=shift_computed_tokens)


def gather_mm_embeddings_v1(scheduler_output, req_ids: Sequence[str], requests: Mapping[str, Any],
                            encoder_cache: Mapping[str, Any], shift_computed_tokens: int = 0):
    """Model runner v1's ``_gather_mm_embeddings`` result, ``(mm_embeds, is_mm_embed)``:
    the rows as one packed tensor in a list (what ``_merge_multimodal_embeddings``
    flattens them to anyway) and the mask. Not for models with multimodal pruning and
    M-RoPE, whose runner recomputes positions from the per-item rows."""
    step = plan_from_scheduler_output(scheduler_output, req_ids, requests, encoder_cache, shift_computed_tokens)
    return _as_vllm_result(step)


def gather_mm_embeddings(encoder_cache, req_ids: Sequence[str], total_num_scheduled_tokens: int,
                         num_scheduled_tokens, query_start_loc, prefill_lens, num_computed_tokens,
                         draft_lookahead: int = 0, *, is_realtime: bool = False):
    """Model runner v2's ``EncoderRunner.gather_mm_embeddings`` with its arguments, its
    ``encoder_cache`` (``mm_features`` by request id, ``encoder_outputs`` by mm_hash)
    passed first: ``(mm_embeds, is_mm_embed)`` as in ``gather_mm_embeddings_v1``."""
    features = encoder_cache.mm_features
    step = plan_rows(req_ids, [features[r] for r in req_ids], num_computed_tokens, num_scheduled_tokens,
                     encoder_cache.encoder_outputs, query_start_loc=query_start_loc,
                     prefill_lens=None if is_realtime else prefill_lens, draft_lookahead=draft_lookahead)
    if step.n_tokens > total_num_scheduled_tokens:
        raise InvalidItemError(f"the requests' token rows reach row {step.n_tokens}, past"
                               f" total_num_scheduled_tokens={total_num_scheduled_tokens}")
    step.n_tokens = total_num_scheduled_tokens
    return _as_vllm_result(step)


def _as_vllm_result(step: StepRows):
    rows = step.gather()
    return ([] if rows is None else [rows]), step.is_mm_embed()
