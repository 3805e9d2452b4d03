"""The flat planner: the common step in one pass, with no object per item.

It plans steps whose items each have one span, carry no precomputed embedding and are
listed in position order within their request (request-level offsets, when given, in
the same order). Everything it reads is checked on the way; the moment something falls
outside that shape (or is malformed) it gives up and returns None, and the general
planner plans the step from scratch, with its error messages. Like the general planner
it plans every source a miss; ``StepPlan.with_lookups`` then looks them up.

The pass over the items runs in C (``_flat_columns.c``, the same checks building the same
lists) where the extension was compiled, else as ``flat_columns_py`` below; on a thousand
cached images that pass, as bytecode, is the largest part of a step's host time.
"""

from __future__ import annotations

from itertools import accumulate

from ..items import KNOWN_MODALITIES as names
from ..items import modality_name
from ..keys import item_key
from .columns import MISS, RunningRows, StepPlan, counting

try:
    from ._flat_columns import flat_columns as _flat_columns_c
except ImportError:  # installed without a C compiler
    _flat_columns_c = None

_NO_MODALITY = object()


def plan_flat(item_lists, prefixes, extends, offsets_lists, row_offsets, budget, bounds=None) -> StepPlan | None:
    """``bounds``: see ``flat_columns_py``."""
    if bounds is not None and (type(bounds) is not list or type(item_lists) is not list):
        bounds, item_lists = list(bounds), list(item_lists)  # tuples (or any sequence): the C pass reads lists
    if _flat_columns_c is not None:
        columns = _flat_columns_c(item_lists, prefixes, extends, offsets_lists, row_offsets, names, modality_name,
                                  item_key, bounds)
    else:
        columns = flat_columns_py(item_lists, prefixes, extends, offsets_lists, row_offsets, bounds)
    return None if columns is None else plan_from_columns(columns, budget)


def request_slices(items: list, bounds: list) -> list[list]:
    """Each request's items of a flat list: ``items[bounds[r]:bounds[r + 1]]``."""
    return list(map(items.__getitem__, map(slice, bounds[:-1], bounds[1:])))


def flat_columns_py(item_lists, prefixes, extends, offsets_lists, row_offsets, bounds=None) -> tuple | None:
    """The pass over the items: ``(keys, rows, requests, modalities, first_items,
    seg_token_row, seg_request, odd, n_tokens)``, or None when the step is not the flat
    shape. ``bounds``: ``item_lists`` is one flat list of the step's items, request r's
    being ``item_lists[bounds[r]:bounds[r + 1]]`` (SGLang's ``items_size``), so a large
    step builds no list per request (the C pass reads the slices one at a time)."""
    if bounds is not None:
        if not all(type(b) is int and b >= 0 for b in bounds):
            return None  # slices with Python's rules for other bounds: the general planner's
        item_lists = request_slices(item_lists, bounds)
    keys: list[int] = []
    rows: list[int] = []
    requests: list[int] = []
    modalities: list[str] = []
    first_items: list = []
    seg_token_row: list[int] = []
    seg_request: list[int] = []
    # The usual segment is a new source used whole: it adds nothing but its token row,
    # and the other segment columns follow from the source columns. Any other segment
    # (an item cut by the chunk edge, a hash an earlier item brought) is listed here
    # as (segment, source, src_row, n_rows, item, new source?).
    odd: list[tuple] = []
    source_of: dict[int, int] = {}
    # Bound once: the loop below runs per item and every attribute lookup shows.
    add_key, add_rows, add_modality, add_first, add_token = (
        keys.append, rows.append, modalities.append, first_items.append, seg_token_row.append)
    find = source_of.get
    token_base = n_sources = 0
    modality, name = _NO_MODALITY, None  # the last item's modality and its name
    try:
        for r in range(len(item_lists)):
            prefix = prefixes[r]
            extend = extends[r]
            row_offset = row_offsets[r]
            if type(prefix) is not int or type(extend) is not int or prefix < 0:
                return None
            if row_offset is None:
                row_offset = token_base
            elif type(row_offset) is not int:
                return None
            items = item_lists[r]
            if extend <= 0:
                continue
            token_base += extend
            if not items:
                continue
            given = offsets_lists[r]
            if given is not None and len(given) != len(items):
                return None
            end = prefix + extend
            token_shift = row_offset - prefix
            prev_end = -1
            k = 0
            first_segment, first_source = len(seg_token_row), len(keys)
            for item in items:
                if item.precomputed_embeddings is not None:
                    return None
                offsets = item.offsets
                if type(offsets) is not list and type(offsets) is not tuple:
                    return None
                (span,) = offsets  # more or fewer than one span: ValueError, general planner
                if type(span) is not tuple and type(span) is not list:
                    return None  # spans as the C pass reads them: exact pairs
                s, e = span
                if type(s) is not int or type(e) is not int or s <= prev_end or e < s:
                    return None
                if given is not None:
                    span = given[k]
                    if type(span) is not tuple and type(span) is not list:
                        return None
                    gs, ge = span
                    if gs != s or ge != e:
                        return None
                    k += 1
                prev_end = e
                if e < prefix or s >= end:
                    continue  # outside this chunk: no lookup, no encode
                h = item.hash
                if type(h) is not int:
                    h = item_key(h, r)
                n = e - s + 1
                source = find(h)
                if source is None:
                    source_of[h] = source = n_sources
                    n_sources += 1
                    add_key(h)
                    add_rows(n)
                    m = item.modality
                    if m is not modality:
                        modality, name = m, names[m] if m in names else modality_name(m)
                    add_modality(name)
                    add_first(item)
                    if s >= prefix and e < end:
                        add_token(s + token_shift)  # the usual segment: nothing else to note
                        continue
                    new = True
                elif rows[source] != n:
                    return None  # one hash, two lengths: the general planner keeps them apart
                else:
                    m = item.modality
                    if m is not modality:
                        modality, name = m, names[m] if m in names else modality_name(m)
                    if name != modalities[source]:
                        return None  # one hash, two modalities: the general planner refuses it
                    new = False
                if s >= prefix and e < end:
                    odd.append((len(seg_token_row), source, 0, n, item, False))
                    add_token(s + token_shift)
                else:
                    lo = s if s > prefix else prefix
                    hi = e if e < end else end - 1
                    odd.append((len(seg_token_row), source, lo - s, hi - lo + 1, item, new))
                    add_token(lo + token_shift)
            requests += [r] * (len(keys) - first_source)
            seg_request += [r] * (len(seg_token_row) - first_segment)
    except (AttributeError, TypeError, ValueError):
        return None  # not the flat shape, or malformed: the general planner says which
    return keys, rows, requests, modalities, first_items, seg_token_row, seg_request, odd, token_base


def plan_from_columns(columns: tuple, budget) -> StepPlan:
    keys, rows, requests, modalities, first_items, seg_token_row, seg_request, odd, token_base = columns
    if odd:
        seg_source, seg_src_row, seg_rows, seg_item = _segment_columns(len(seg_token_row), odd, rows, first_items)
    else:
        seg_source, seg_src_row, seg_rows, seg_item = counting(len(keys)), [0] * len(keys), rows, first_items
    if odd:
        seg_packed_row = list(accumulate(seg_rows, initial=0))
        packed = seg_packed_row.pop()
    else:
        seg_packed_row, packed = RunningRows(seg_rows), sum(seg_rows)
    return StepPlan(
        [MISS] * len(keys), keys, rows, requests, modalities, [None] * len(keys), first_items, {},
        seg_source, seg_src_row, seg_rows, seg_packed_row, seg_token_row, seg_request,
        (), seg_source, seg_item, packed, token_base, None, budget,
    )


def _segment_columns(n_segments: int, odd: list[tuple], rows: list[int], first_items: list):
    """``seg_source``, ``seg_src_row``, ``seg_rows`` and ``seg_item`` of a step with odd
    segments: every other segment is the next new source, whole."""
    seg_source, seg_src_row, seg_rows, seg_item = [], [], [], []
    special = {entry[0]: entry for entry in odd}
    next_new = 0
    for segment in range(n_segments):
        entry = special.get(segment)
        if entry is None:
            source, src_row, n, item = next_new, 0, rows[next_new], first_items[next_new]
            next_new += 1
        else:
            _, source, src_row, n, item, new = entry
            next_new += new
        seg_source.append(source)
        seg_src_row.append(src_row)
        seg_rows.append(n)
        seg_item.append(item)
    return seg_source, seg_src_row, seg_rows, seg_item
