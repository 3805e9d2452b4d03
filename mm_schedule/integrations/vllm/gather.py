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

Every input is checked while planning, where vLLM's own behaviour is undefined too: a
request's ranges sorted by offset (the whole list whenever the window reads part of it,
since the window is found by a search that needs that order), ``is_embed`` a bool mask of
the range's length, scheduled counts >= 0 and token rows inside the step; and every
encoder output once, against the rows its item must have (``EmbeddingLengthMismatch``
names the request and the ``mm_hash``). A needed output missing from the store raises
``EncoderCacheMiss``; a window holding only text positions of a range needs none. The
planned segments are checked against their encoder outputs and the step's token rows
before anything is copied (``SegmentError``).

Ranges may overlap or nest (audio inside video), as vLLM allows: every range with a
position in the window gives the rows of its positions there, however the ranges nest
(vLLM's own search assumes ranges that do not overlap and can miss an enclosing one on a
window that cuts it), the gather ORs their masks, and the fused merge refuses a step where
two overlapping ranges both reach a request's window.
"""

from __future__ import annotations

import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate, chain, islice, repeat
from operator import add, attrgetter, le
from typing import Any

import torch

try:
    import numpy as np  # vLLM depends on it; without it the mask is built with torch calls
except ImportError:
    np = None

from ._engine import (
    EmbeddingLengthMismatch,
    InvalidItemError,
    KernelInputError,
    SegmentTable,
    copy_segments,
    one_dtype,
    plain_rows,
)
from .errors import EncoderCacheMiss, SegmentError
from .releases import installed_release_checked


def _offset(feature) -> int:
    return feature.mm_position.offset


class _EmbedRuns:
    """An ``is_embed`` mask as runs of true positions: ``starts``, ``ends`` (relative to
    the range) and ``before`` (embedding rows of the runs before each), read from
    ``mask``, a private copy of the values they were read from."""

    __slots__ = ("before", "counts", "ends", "mask", "rows", "starts")

    def __init__(self, is_embed) -> None:
        # A copy, not the caller's tensor: whatever happens to theirs, this one still
        # holds exactly the values the runs below describe.
        self.mask = is_embed.detach().to("cpu", copy=True)
        flat = self.mask.to(torch.int8)
        edges = torch.diff(flat, prepend=flat.new_zeros(1), append=flat.new_zeros(1))
        self.starts = edges.eq(1).nonzero().flatten().tolist()
        self.ends = edges.eq(-1).nonzero().flatten().tolist()
        self.counts = list(map(int.__sub__, self.ends, self.starts))
        self.before = [0, *accumulate(self.counts)]
        self.rows = self.before.pop()


# Runs of the masks seen so far, by the mask tensor's id (a request's features live for
# all of its steps), so that a step does not recompute them: the runs cost tens of
# microseconds a mask, comparing a mask with the copy they were read from about one. The
# id is only where to look. Every check is made again on every call, and the runs are
# used only if the mask's values equal that copy now, since a mask can change without a
# trace on the tensor (a write through ``.numpy()``, a ``.data`` swap). An entry whose
# tensor is gone is dropped when the table is pruned.
_RUNS: dict[int, tuple[Any, _EmbedRuns]] = {}
_RUNS_LIMIT = 1 << 14


def _runs_of(position, request: str, key: str) -> _EmbedRuns:
    is_embed, length = position.is_embed, position.length
    if (not isinstance(is_embed, torch.Tensor) or is_embed.dim() != 1 or is_embed.shape[0] != length
            or is_embed.dtype != torch.bool):
        raise _bad_mask(is_embed, length, request, key)
    if is_embed.is_meta:
        # The runs are the mask's values, which a meta tensor does not have.
        raise InvalidItemError(f"request {request!r}, mm_hash {key!r}: is_embed is a meta tensor, which holds no"
                               " values to read its embedding positions from")
    # Only plain CPU tensors are looked up: a subclass may answer torch.equal its own way,
    # and a device tensor would need a copy to compare anyway.
    cached = type(is_embed) is torch.Tensor and is_embed.is_cpu
    if cached:
        entry = _RUNS.get(id(is_embed))
        if entry is not None and entry[0]() is is_embed and torch.equal(is_embed, entry[1].mask):
            return entry[1]
    runs = _EmbedRuns(is_embed)
    if cached:
        if len(_RUNS) >= _RUNS_LIMIT:
            for stale in [k for k, (ref, _) in _RUNS.items() if ref() is None] or list(_RUNS):
                del _RUNS[stale]
        _RUNS[id(is_embed)] = (weakref.ref(is_embed), runs)
    return runs


def _bad_mask(is_embed, length: int, request: str, key: str) -> InvalidItemError:
    what = f"request {request!r}, mm_hash {key!r}"
    if not isinstance(is_embed, torch.Tensor) or is_embed.dim() != 1 or is_embed.shape[0] != length:
        shape = tuple(is_embed.shape) if isinstance(is_embed, torch.Tensor) else type(is_embed).__name__
        return InvalidItemError(f"{what}: is_embed must be a 1-D mask of the range's length {length}, got {shape}")
    # vLLM indexes with it; an integer or float tensor would be read as something else.
    return InvalidItemError(f"{what}: is_embed must be a bool mask, got dtype {is_embed.dtype}")


_SLICES_UP_TO = 16  # runs written one slice each; more at once, vectorised
_VECTOR_CHECK_FROM = 4 * 256  # entries of the segment list checked with numpy from here on


def _index(values: list[int]):
    # An int64 tensor from Python ints by way of an array: several times faster than torch.tensor.
    return torch.frombuffer(array("q", values), dtype=torch.int64) if values else torch.zeros(0, dtype=torch.int64)


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

    __slots__ = ("dtype", "fused", "hidden", "keys", "mixed", "modalities", "n_rows", "n_tokens", "overlap", "sources")

    def __init__(self, n_tokens: int) -> None:
        self.n_tokens = n_tokens
        self.sources: list[Any] = []
        self.keys: list[str] = []
        self.modalities: list[str | None] = []  # each source's feature's modality, where it has one
        # Segments, flat: (source, src_row, n_rows, token_row) in vLLM's order (request, item,
        # position), so the packed rows are the same segments one after another. Columns are
        # slices of this list.
        self.fused: list[int] = []
        self.overlap: tuple[str, str, str] | None = None
        self.n_rows = 0
        self.hidden: int | None = None
        self.dtype = None
        self.mixed = False

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
        fused = self.fused
        src, src_row, counts = fused[0::4], fused[1::4], fused[2::4]
        if len(src) > len(self.sources):
            src, src_row, counts = _coalesced(src, src_row, counts)
        rows = list(accumulate(counts, initial=0))
        rows.pop()
        whole = self.n_rows if not self.mixed and out.dtype == self.dtype and self._whole_in_order(src) else None
        table = SegmentTable(src, src_row, counts, rows, whole_sources_rows=whole)
        copy_segments(self._sources_for(out.dtype), table, out)
        return out

    def gather_by_modality(self) -> list:
        """The packed rows as vLLM's gather list needs them for models that merge by
        modality: one view of ``gather()`` per run of consecutive rows of one modality,
        each tagged as vLLM's gather tags its items (the tensor's ``modality`` attribute,
        which ``vllm.multimodal.utils.get_mm_embedding_modalities`` reads). Grouped by
        modality, the views concatenate to what vLLM's per-item list does. Empty when the
        step has no rows."""
        rows = self.gather()
        if rows is None:
            return []
        modalities = self.modalities
        if len(set(modalities)) == 1:
            pieces = [(0, self.n_rows, modalities[0])]
        else:
            pieces, start, row, current = [], 0, 0, modalities[self.fused[0]]
            for source, count in zip(self.fused[0::4], self.fused[2::4]):
                if modalities[source] != current:
                    pieces.append((start, row, current))
                    start, current = row, modalities[source]
                row += count
            pieces.append((start, row, current))
        views = []
        for start, end, modality in pieces:
            view = rows if len(pieces) == 1 else rows[start:end]
            if modality is not None:
                view.modality = modality
            views.append(view)
        return views

    def is_mm_embed(self, *, device="cpu", pin_memory: bool = False):
        """vLLM's ``is_mm_embed``: a bool ``[n_tokens]`` mask, true at the token rows that
        take a multimodal row (the union of the ranges, as vLLM ORs them)."""
        if not self.fused:
            return torch.zeros(self.n_tokens, dtype=torch.bool, device=device, pin_memory=pin_memory)
        # +1 at every run's first row, -1 past its last; a running sum > 0 inside a run.
        counts, rows = self.fused[2::4], self.fused[3::4]
        if np is not None:
            flat = np.zeros(self.n_tokens, dtype=np.bool_)
            if len(rows) <= _SLICES_UP_TO:
                for row, count in zip(rows, counts):
                    flat[row : row + count] = True
            else:
                # Every covered row at once: run k's rows are arange(count) shifted to its first row.
                n = np.asarray(counts, dtype=np.int64)
                ends = np.cumsum(n)
                flat[np.arange(int(ends[-1])) + np.repeat(np.asarray(rows, dtype=np.int64) - ends + n, n)] = True
            mask = torch.from_numpy(flat)
        else:
            # +1 at every run's first row, -1 past its last; a running sum > 0 inside a run.
            marks = torch.zeros(self.n_tokens + 1, dtype=torch.int32)
            ones = torch.ones(len(rows), dtype=torch.int32)
            marks.index_add_(0, _index(rows), ones)
            marks.index_add_(0, _index(list(map(add, rows, counts))), ones, alpha=-1)
            mask = marks[:-1].cumsum_(0) > 0
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
        fused = self.fused
        table = SegmentTable(fused[0::4], fused[1::4], fused[2::4], fused[3::4])
        copy_segments(self._sources_for(flat.dtype), table, flat)
        return inputs_embeds

    # -- helpers --------------------------------------------------------------------

    def _whole_in_order(self, src: list[int]) -> bool:
        n = len(self.sources)
        return len(src) == n and src == list(range(n)) and self.n_rows == sum(s.shape[0] for s in self.sources)

    def _sources_for(self, dtype) -> list:
        return one_dtype(self.sources, dtype) if self.mixed else self.sources

    def _check_destination(self, dst, rows: int, what: str) -> None:
        if dst.dim() != 2 or dst.shape[0] < rows or dst.shape[1] != self.hidden:
            raise KernelInputError(
                f"{what} has shape {tuple(dst.shape)}; the step needs at least [{rows}, {self.hidden}]")
        if not dst.is_contiguous() or dst.is_neg():
            raise KernelInputError(f"{what} must be contiguous, and not a negated view, to be written in place")
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
    if scheduled and min(scheduled) < 0:
        # Refused before the token rows are laid out: a negative count would move every
        # later request's rows back onto the rows of the ones before it.
        k = next(k for k, c in enumerate(scheduled) if c < 0)
        raise InvalidItemError(f"request {req_ids[k]!r}: num_scheduled_tokens is {scheduled[k]}; a request"
                               " schedules zero tokens or more")
    if query_start_loc is None:
        starts = list(accumulate(scheduled, initial=0))
        n_tokens = starts.pop()
    else:
        starts = _ints(query_start_loc, n, "query_start_loc")
        n_tokens = 0
        for i, (start, count) in enumerate(zip(starts, scheduled)):
            if start < n_tokens:
                raise InvalidItemError(
                    f"request {req_ids[i]!r}: token rows [{start}, {start + count}) overlap the previous request's")
            n_tokens = start + count
    prefill = None if prefill_lens is None else _ints(prefill_lens, n, "prefill_lens")
    step = StepRows(n_tokens)
    source_of: dict[str, int] = {}
    sources, modalities = step.sources, step.modalities
    fused = step.fused.extend
    get_output = encoder_outputs.get
    expected: list[int] = []  # rows each source must have
    users: list[int] = []  # the first request that reads it
    for i in range(n):
        count = scheduled[i]
        first = computed[i] + draft_lookahead
        last = first + count
        if count <= 0 or (prefill is not None and first >= prefill[i]):
            continue
        features = mm_features[i]
        if not features:
            continue
        # The window's features. A window from at or before the first range to past the last
        # one reads every range and needs no search; otherwise the whole list is checked and
        # searched (see _window_start).
        hi = len(features) if features[-1].mm_position.offset < last else bisect_left(features, last, key=_offset)
        part = first > features[0].mm_position.offset or hi < len(features)
        lo = _window_start(req_ids[i], features, first) if part else 0
        base = starts[i] - first  # token row of prompt position 0 of this request
        previous = reaching = None
        previous_end = -1
        for feature in features[lo:hi] if part else features:
            position = feature.mm_position
            offset, length = position.offset, position.length
            key = feature.identifier
            if offset < 0 or length <= 0:
                raise _bad_range(req_ids[i], feature)
            a = first - offset if first > offset else 0
            b = last - offset if last - offset < length else length
            if b <= a:
                # No position of the range in the window: a range nested in an earlier one
                # and ending before the window starts (offsets are sorted, ends need not be).
                # Without the search, only a range past the window gets here, out of order:
                # the check of the whole list names it.
                if not part:
                    _window_start(req_ids[i], features, first)
                continue
            if offset < previous_end:
                _check_order(step, req_ids[i], feature, previous, reaching)
            previous = feature
            if offset + length > previous_end:
                previous_end, reaching = offset + length, feature
            is_embed = position.is_embed
            if is_embed is None:
                rows_needed = length
            else:
                runs = _runs_of(position, req_ids[i], key)
                rows_needed = runs.rows
                whole = a == 0 and b == length
                if not whole:
                    r0, r1 = bisect_right(runs.ends, a), bisect_left(runs.starts, b)
                    if r0 >= r1:
                        continue  # no embedding position in this window
                elif not rows_needed:
                    continue
            source = source_of.get(key)
            if source is None:
                output = get_output(key)
                if output is None:
                    if offset + draft_lookahead >= last:
                        continue  # reached only through the look-ahead: vLLM leaves the text row
                    raise EncoderCacheMiss(request=req_ids[i], mm_hash=key, offset=offset, length=length)
                source = source_of[key] = len(sources)
                sources.append(output)
                modalities.append(getattr(feature, "modality", None))
                expected.append(rows_needed)
                users.append(i)
            elif expected[source] != rows_needed:
                raise EmbeddingLengthMismatch(expected=rows_needed, received=expected[source], request=req_ids[i],
                                              item_hash=key, what="placeholder embedding count of a shared item")
            if is_embed is None:
                fused((source, a, b - a, base + offset + a))
                continue
            row = base + offset
            if whole:  # the whole range: every run as it is, in C-level passes
                fused(chain.from_iterable(zip(repeat(source), runs.before, runs.counts, map(row.__add__, runs.starts))))
                continue
            for r in range(r0, r1):
                s = runs.starts[r] if runs.starts[r] > a else a
                e = runs.ends[r] if runs.ends[r] < b else b
                fused((source, runs.before[r] + s - runs.starts[r], e - s, row + s))
    step.n_rows = sum(step.fused[2::4])
    step.keys = list(source_of)
    _check_segments(step, expected)
    users = [req_ids[u] for u in users]
    _check_outputs(step, expected, users)
    return step


def _coalesced(src: list[int], src_row: list[int], counts: list[int]):
    """Packed segments with every run that continues the previous one's source rows merged
    into it (an ``is_embed`` range's runs are consecutive encoder rows)."""
    if np is not None:
        s, r, n = (np.asarray(c, dtype=np.int64) for c in (src, src_row, counts))
        starts = np.flatnonzero(np.concatenate(([True], (s[1:] != s[:-1]) | (r[1:] != r[:-1] + n[:-1]))))
        return s[starts].tolist(), r[starts].tolist(), np.add.reduceat(n, starts).tolist()
    out_s, out_r, out_n = [src[0]], [src_row[0]], [counts[0]]
    for s, r, n in zip(src[1:], src_row[1:], counts[1:]):
        if s == out_s[-1] and r == out_r[-1] + out_n[-1]:
            out_n[-1] += n
        else:
            out_s.append(s)
            out_r.append(r)
            out_n.append(n)
    return out_s, out_r, out_n


def _check_order(step: StepRows, request: str, feature, previous, reaching) -> None:
    """The slow path of the loop's one comparison: a range that starts before the previous
    one raises, one that starts inside an earlier one (``reaching``, the one that reaches
    furthest) is recorded as an overlap (vLLM ORs their masks)."""
    if feature.mm_position.offset < previous.mm_position.offset:
        raise _unsorted(request, previous, feature)
    step.overlap = step.overlap or (request, reaching.identifier, feature.identifier)


_offset_of, _length_of = attrgetter("mm_position.offset"), attrgetter("mm_position.length")


def _window_start(request: str, features, first: int) -> int:
    """The index of the first feature that may hold a position at or past ``first``, for a
    window that reads only part of the list, after checking the whole list: sorted by
    offset, offsets >= 0, lengths >= 1. The search needs that order; checking only the
    window's part would let an unsorted list pick the wrong items.

    Ranges may nest (audio inside video), so their ends are not sorted and bisecting them
    would skip an enclosing range: the running maximum of the ends is sorted whatever the
    nesting, and no feature before the first one whose running maximum passes ``first``
    reaches the window. Features after it that end before the window are skipped by the
    caller."""
    offsets = list(map(_offset_of, features))
    lengths = list(map(_length_of, features))
    if not (offsets[0] >= 0 and min(lengths) > 0 and all(map(le, offsets, islice(offsets, 1, None)))):
        for k, feature in enumerate(features):
            if feature.mm_position.offset < 0 or feature.mm_position.length <= 0:
                raise _bad_range(request, feature)
            if k and offsets[k] < offsets[k - 1]:
                raise _unsorted(request, features[k - 1], feature)
    return bisect_right(list(accumulate(map(add, offsets, lengths), max)), first)


def _bad_range(request: str, feature) -> InvalidItemError:
    position = feature.mm_position
    return InvalidItemError(f"request {request!r}, mm_hash {feature.identifier!r}: placeholder range offset"
                            f" {position.offset}, length {position.length} (an offset >= 0 and a length >= 1 are needed)")


def _unsorted(request: str, previous, feature) -> InvalidItemError:
    return InvalidItemError(f"request {request!r}: mm_features are not sorted by offset ({previous.identifier!r} at"
                            f" {previous.mm_position.offset} before {feature.identifier!r} at"
                            f" {feature.mm_position.offset})")


def _check_segments(step: StepRows, expected: list[int]) -> None:
    """Every planned segment, before anything is written: a positive row count, its
    source rows inside its encoder output's expected rows, its token rows inside the
    step's. The planner never makes another; a segment that broke this would make the
    copy write past ``n_rows`` or into another request's rows, so it is refused here
    rather than trusted."""
    fused = step.fused
    if not fused:
        return
    if np is not None and len(fused) > _VECTOR_CHECK_FROM:
        # One conversion and a few array passes: about half the cost of the passes below
        # on the thousands of segments of a step with is_embed masks.
        seg = np.frombuffer(array("q", fused), dtype=np.int64).reshape(-1, 4)
        s, r, n, t = seg.T
        if (n.min() > 0 and r.min() >= 0 and t.min() >= 0 and (t + n).max() <= step.n_tokens
                and ((r + n) <= np.asarray(expected, dtype=np.int64)[s]).all()):
            return
    else:
        src, src_row, counts, rows = fused[0::4], fused[1::4], fused[2::4], fused[3::4]
        if (min(counts) > 0 and min(src_row) >= 0 and min(rows) >= 0
                and max(map(add, rows, counts)) <= step.n_tokens
                and all(map(le, map(add, src_row, counts), map(expected.__getitem__, src)))):
            return
    src, src_row, counts, rows = fused[0::4], fused[1::4], fused[2::4], fused[3::4]
    for k, (s, r, n, t) in enumerate(zip(src, src_row, counts, rows)):
        if n <= 0 or r < 0 or t < 0 or t + n > step.n_tokens or r + n > expected[s]:
            raise SegmentError(
                f"mm_hash {step.keys[s]!r}: planned segment {k} (encoder rows [{r}, {r + n}) of"
                f" {expected[s]}, token rows [{t}, {t + n}) of {step.n_tokens}) is invalid; this is a bug in"
                " the planner, and nothing was written")


def _check_outputs(step: StepRows, expected: list[int], users: list[str]) -> None:
    """Every encoder output the step reads, checked once: ``[rows, H]`` with the rows its
    item must have, one hidden size, one device, floating point, row-contiguous (others
    are made contiguous). Mixed dtypes are cast to the destination's when copied."""
    sources = step.sources
    if not sources:
        return
    first = sources[0]
    if not isinstance(first, torch.Tensor) or first.dim() != 2:
        _bad_output(step, 0, users)
    hidden, dtype, device = first.shape[1], first.dtype, first.device
    promoted = dtype
    for index, (output, rows) in enumerate(zip(sources, expected)):
        shape = output.shape if isinstance(output, torch.Tensor) else None
        if shape is None or len(shape) != 2 or shape[1] != hidden:
            _bad_output(step, index, users, hidden)
        if shape[0] != rows:
            raise EmbeddingLengthMismatch(expected=rows, received=shape[0], request=users[index],
                                          item_hash=step.keys[index], what="encoder output rows")
        if output.dtype is not dtype:
            if not output.is_floating_point():
                _bad_output(step, index, users, hidden)
            promoted = torch.promote_types(promoted, output.dtype)
        if output.is_neg() or not output.is_contiguous():
            sources[index] = plain_rows(output)  # copied as raw rows: a negated view's bytes are not its values
    if not first.is_floating_point():
        _bad_output(step, 0, users, hidden)
    index = first.get_device()
    if any(o.get_device() != index for o in sources):
        odd = next(i for i, o in enumerate(sources) if o.get_device() != index)
        raise KernelInputError(f"request {users[odd]!r}, mm_hash {step.keys[odd]!r}: encoder output is on"
                               f" {sources[odd].device}, the step's first on {device}")
    step.hidden, step.dtype, step.mixed = hidden, promoted, promoted is not dtype or any(
        o.dtype is not dtype for o in sources)


def _bad_output(step: StepRows, index: int, users: list[str], hidden: int | None = None):
    output = step.sources[index]
    got = f"shape {tuple(output.shape)}, dtype {output.dtype}" if isinstance(output, torch.Tensor) else type(output).__name__
    want = "[rows, hidden]" if hidden is None else f"[rows, {hidden}] floating point (the step's first output's hidden size)"
    raise KernelInputError(f"request {users[index]!r}, mm_hash {step.keys[index]!r}: encoder output must be {want}, got {got}")


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
    the rows packed (what ``_merge_multimodal_embeddings`` flattens them to anyway), one
    tensor per run of one modality, tagged with it as vLLM tags its items (see
    ``StepRows.gather_by_modality``), and the mask. Not for models with multimodal pruning
    and M-RoPE, whose runner recomputes positions from the per-item rows."""
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
    return step.gather_by_modality(), step.is_mm_embed()
