"""The flat planner: the common step in one pass, with no object per item.

It plans steps whose items each have one span, carry no precomputed embedding and are
listed in position order within their request (request-level offsets, when given, in
the same order). Everything it reads is checked on the way; the moment something falls
outside that shape (or is malformed) it gives up and returns None *before touching the
cache*, and the general planner plans the step from scratch, with its error messages.
"""

from __future__ import annotations

from .items import KNOWN_MODALITIES as names
from .items import modality_name
from .keys import item_key
from .plan import HIT, MISS, StepPlan, batch_misses


def plan_flat(item_lists, prefixes, extends, offsets_lists, row_offsets, cache, budget) -> StepPlan | None:
    keys: list[int] = []
    rows: list[int] = []
    requests: list[int] = []
    modalities: list[str] = []
    first_items: list = []
    seg_source: list[int] = []
    seg_src_row: list[int] = []
    seg_rows: list[int] = []
    seg_packed_row: list[int] = []
    seg_token_row: list[int] = []
    seg_request: list[int] = []
    seg_item: list = []
    source_of: dict[int, int] = {}
    # Bound once: the loop below runs per item and every attribute lookup shows.
    add_key, add_rows, add_request, add_modality, add_first = (
        keys.append, rows.append, requests.append, modalities.append, first_items.append)
    add_source, add_src_row, add_seg_rows, add_packed, add_token, add_item = (
        seg_source.append, seg_src_row.append, seg_rows.append, seg_packed_row.append, seg_token_row.append,
        seg_item.append)
    find = source_of.get
    packed = token_base = 0
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
            prev_end = -1
            k = 0
            first_segment = len(seg_source)
            for item in items:
                if item.precomputed_embeddings is not None:
                    return None
                offsets = item.offsets
                if type(offsets) is not list and type(offsets) is not tuple:
                    return None
                ((s, e),) = offsets  # more or fewer than one span: ValueError, general planner
                if type(s) is not int or type(e) is not int or s <= prev_end or e < s:
                    return None
                if given is not None:
                    gs, ge = given[k]
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
                    source = source_of[h] = len(keys)
                    add_key(h)
                    add_rows(n)
                    add_request(r)
                    m = item.modality
                    add_modality(names[m] if m in names else modality_name(m))
                    add_first(item)
                elif rows[source] != n:
                    return None  # one hash, two lengths: the general planner keeps them apart
                lo = s if s > prefix else prefix
                hi = e if e < end else end - 1
                n = hi - lo + 1
                add_source(source)
                add_src_row(lo - s)
                add_seg_rows(n)
                add_packed(packed)
                add_token(row_offset + lo - prefix)
                add_item(item)
                packed += n
            seg_request += [r] * (len(seg_source) - first_segment)
    except (AttributeError, TypeError, ValueError):
        return None  # not the flat shape, or malformed: the general planner says which

    layout = None
    if cache is not None and keys:
        tensors, layout = cache.lookup_many(keys, rows)
        kinds = [MISS if t is None else HIT for t in tensors]
    else:
        tensors = [None] * len(keys)
        kinds = [MISS] * len(keys)
    return StepPlan(
        kinds, keys, rows, requests, modalities, tensors, first_items, {},
        seg_source, seg_src_row, seg_rows, seg_packed_row, seg_token_row, seg_request,
        batch_misses(kinds, rows, modalities, (), budget) if MISS in kinds else (),
        seg_source, seg_item, packed, token_base, layout, budget,
    )
