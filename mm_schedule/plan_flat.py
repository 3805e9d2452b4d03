"""The flat planner: the common step in one pass, with no object per item.

It plans steps whose items each have one span, carry no precomputed embedding and are
listed in position order within their request (request-level offsets, when given, in
the same order). Everything it reads is checked on the way; the moment something falls
outside that shape (or is malformed) it gives up and returns None *before touching the
cache*, and the general planner plans the step from scratch, with its error messages.
"""

from __future__ import annotations

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
            for item in items:
                if item.precomputed_embeddings is not None:
                    return None
                offsets = item.offsets
                if (type(offsets) is not list and type(offsets) is not tuple) or len(offsets) != 1:
                    return None
                s, e = offsets[0]
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
                source = source_of.get(h)
                if source is None:
                    source = source_of[h] = len(keys)
                    keys.append(h)
                    rows.append(n)
                    requests.append(r)
                    modalities.append(modality_name(item.modality))
                    first_items.append(item)
                elif rows[source] != n:
                    return None  # one hash, two lengths: the general planner keeps them apart
                lo = s if s > prefix else prefix
                hi = e if e < end else end - 1
                n = hi - lo + 1
                seg_source.append(source)
                seg_src_row.append(lo - s)
                seg_rows.append(n)
                seg_packed_row.append(packed)
                seg_token_row.append(row_offset + lo - prefix)
                seg_request.append(r)
                seg_item.append(item)
                packed += n
    except (AttributeError, TypeError, ValueError):
        return None  # not the flat shape, or malformed: the general planner says which

    layout = None
    if cache is not None and keys:
        tensors, layout = cache.lookup_many(keys, rows)
        kinds = [MISS if t is None else HIT for t in tensors]
        hit_items = [item for source, item in zip(seg_source, seg_item) if tensors[source] is not None]
    else:
        tensors = [None] * len(keys)
        kinds = [MISS] * len(keys)
        hit_items = []
    return StepPlan(
        kinds, keys, rows, requests, modalities, tensors, first_items, {},
        seg_source, seg_src_row, seg_rows, seg_packed_row, seg_token_row, seg_request,
        batch_misses(kinds, rows, modalities, (), budget) if MISS in kinds else (),
        hit_items, packed, token_base, layout,
    )
