"""The general planner: every item shape SGLang supports, every check with its message.

It handles what the flat planner leaves to it: items with several spans (video frames,
image slices), whose modality group of a request is encoded together under one
combined key, as SGLang does; precomputed embeddings; items listed out of position
order; hash collisions between items of one modality and different lengths (one hash
under two modalities is refused, whatever the lengths: ``ConflictingHashError``); and
every malformed input,
which it refuses with an error naming the request and the item. It plans every
source that could be cached a miss; ``StepPlan.with_lookups`` then looks them up.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConflictingHashError, InvalidItemError, PrecomputedEmbeddingError
from ..items import as_index, check_spans, item_spans, modality_name, span_tokens, window_overlap
from ..keys import combine_hashes, item_key
from .columns import MISS, PRECOMPUTED, StepPlan


def _has_precomputed(item: Any) -> bool:
    return getattr(item, "precomputed_embeddings", None) is not None


def _all_precomputed(item_lists) -> bool:
    """SGLang's rule: either every item of the batch carries a precomputed embedding
    or none does; a mix has no defined meaning and is refused."""
    first: dict[bool, int] = {}
    for i, items in enumerate(item_lists):
        for item in items:
            first.setdefault(_has_precomputed(item), i)
    if len(first) == 2:
        raise PrecomputedEmbeddingError(
            "MM inputs where only some items are precomputed: request "
            f"{first[True]} has precomputed embeddings, request {first[False]} does not"
        )
    return True in first


class _Columns:
    """The plan under construction (lists that become the plan's tuples)."""

    def __init__(self) -> None:
        self.kinds: list = []
        self.keys: list = []
        self.rows: list = []
        self.requests: list = []
        self.modalities: list = []
        self.tensors: list = []
        self.first_items: list = []
        self.multi_items: dict[int, tuple[tuple, tuple]] = {}
        self.by_identity: dict[tuple, int] = {}
        self.modality_of_key: dict[int, tuple] = {}  # item key -> (modality, request, tokens), first seen
        self.uses: list[tuple[int, Any]] = []  # (source, item or tuple of items) per request use


def plan_general(item_lists, prefixes, extends, offsets_lists, row_offsets, budget) -> StepPlan:
    precomputed = _all_precomputed(item_lists)
    cols = _Columns()
    segments: list[tuple[int, int, int, int, int]] = []  # source, src_row, n, token_row, request
    token_base = 0
    for index, items in enumerate(item_lists):
        prefix = as_index(prefixes[index], request=index, what="prefix")
        extend = as_index(extends[index], request=index, what="extend")
        if prefix < 0:
            raise InvalidItemError(f"request {index}: prefix must be >= 0, got {prefix}")
        given = row_offsets[index]
        row_offset = token_base if given is None else as_index(given, request=index, what="row_offset")
        token_base += max(extend, 0)
        if extend > 0 and items:
            _add_request(cols, segments, index, items, offsets_lists[index], prefix, extend, row_offset, precomputed)

    packed, n_rows = [], 0
    for _, _, n, _, _ in segments:
        packed.append(n_rows)
        n_rows += n
    return StepPlan(
        kinds=cols.kinds, keys=cols.keys, rows=cols.rows, requests=cols.requests,
        modalities=cols.modalities, tensors=cols.tensors, first_items=cols.first_items,
        multi_items=cols.multi_items,
        seg_source=[s[0] for s in segments], seg_src_row=[s[1] for s in segments],
        seg_rows=[s[2] for s in segments], seg_packed_row=packed,
        seg_token_row=[s[3] for s in segments], seg_request=[s[4] for s in segments],
        encoder_batches=(),
        use_source=[u[0] for u in cols.uses], use_item=[u[1] for u in cols.uses],
        n_rows=n_rows, n_tokens=token_base, cache_layout=None, token_budget=budget,
    )


def _add_request(cols, segments, index, items, given, prefix, extend, row_offset, precomputed) -> None:
    window = (prefix, prefix + extend)
    groups: dict[str, list[Any]] = {}
    for item in items:
        groups.setdefault(modality_name(getattr(item, "modality", "IMAGE")), []).append(item)
    spans_by_group = {m: [item_spans(it, request=index) for it in group] for m, group in groups.items()}
    for per_item in spans_by_group.values():
        for spans in per_item:
            check_spans(spans, request=index, what="item")
    request_spans = sorted(s for per_item in spans_by_group.values() for sp in per_item for s in sp)
    check_spans(request_spans, request=index, what="items'")
    if given is not None:
        _check_request_offsets(given, request_spans, index)

    pieces = []  # (token position, source, src_row, n_rows)
    for modality, group in groups.items():
        spans_per_item = spans_by_group[modality]
        if precomputed or all(len(sp) == 1 for sp in spans_per_item):
            for item, spans in zip(group, spans_per_item):
                _add_unit(cols, pieces, index, modality, [item], [spans], window, precomputed)
        else:
            _add_unit(cols, pieces, index, modality, group, spans_per_item, window, precomputed)
    # Rows of one request come out in placeholder-position order across modalities.
    for position, source, src_row, n in sorted(pieces):
        segments.append((source, src_row, n, row_offset + position - prefix, index))


def _check_request_offsets(given, item_spans_sorted, index: int) -> None:
    """The request-level spans, when given, must be exactly the items' spans: a
    disagreement means the caller's layout and its items describe different prompts."""
    try:
        spans = sorted((as_index(s, request=index, what="offset"), as_index(e, request=index, what="offset"))
                       for s, e in given)
    except (TypeError, ValueError):
        raise InvalidItemError(f"request {index}: request offsets {given!r} are not (start, end) pairs") from None
    if spans != item_spans_sorted:
        raise InvalidItemError(
            f"request {index}: request offsets {spans} differ from its items' offsets {item_spans_sorted}"
        )


def _add_unit(cols, pieces, index, modality, items, spans_per_item, window, precomputed) -> None:
    # Encoder rows follow item order, then span order within an item.
    spans = [s for sp in spans_per_item for s in sp]
    overlaps = [window_overlap(s, e, *window) for s, e in spans]
    if not any(overlaps):
        return  # this chunk needs nothing from these items: no lookup, no encode
    source = _source(cols, index, modality, items, spans_per_item, precomputed)
    cols.uses.append((source, items[0] if len(items) == 1 else tuple(items)))
    rows_before = 0
    for (s, e), overlap in zip(spans, overlaps):
        if overlap is not None:
            first, n = overlap
            pieces.append((s + first, source, rows_before + first, n))
        rows_before += e - s + 1


def _claim(cols, key, item, modality, index, tokens, combined: bool = False) -> None:
    """The cache key ``key`` names ``modality`` in this step, or ``ConflictingHashError``.
    ``combined``: ``key`` is the combined key of a whole-request source (``item`` its first)."""
    what = (f"a {modality} source of {tokens} tokens cached under the combined key of its items' hashes"
            if combined else f"a {modality} item of {tokens} tokens")
    first = cols.modality_of_key.setdefault(key, (modality, index, what))
    if first[0] != modality:
        subject = f"the combined key {key}" if combined else f"item hash {getattr(item, 'hash', None)!r}"
        raise ConflictingHashError(
            f"request {index}: {subject} is {what}, and request {first[1]} has {first[2]} with the same hash;"
            " one hash names one embedding, so give the items distinct hashes",
            item_hash=getattr(item, "hash", None), modalities=(first[0], modality),
        )


def _source(cols, index, modality, items, spans_per_item, precomputed) -> int:
    item_rows = tuple(span_tokens(sp) for sp in spans_per_item)
    rows = sum(item_rows)
    per_item = len(items) == 1 and (precomputed or len(spans_per_item[0]) == 1)
    if per_item:
        key = item_key(getattr(items[0], "hash", None), index)
    else:
        key = combine_hashes([item_key(getattr(it, "hash", None), index) for it in items])
    identity = (PRECOMPUTED, id(items[0]), rows) if precomputed else (per_item, key, rows)
    if not precomputed:
        # Checked before the lengths: a hash under two modalities conflicts whatever its
        # rows, or the step would encode it twice and cache whichever came last. The items
        # of a whole-request source (cached under their combined key) are checked each.
        for item, n in zip(items, item_rows):
            _claim(cols, item_key(getattr(item, "hash", None), index) if not per_item else key, item,
                   modality, index, n)
        if not per_item:
            # The combined key is a cache key too: an item hash of another modality equal to
            # it would share its entry.
            _claim(cols, key, items[0], modality, index, rows, combined=True)
    found = cols.by_identity.get(identity)
    if found is not None:
        return found
    source = len(cols.kinds)
    cols.by_identity[identity] = source
    cols.kinds.append(PRECOMPUTED if precomputed else MISS)
    cols.keys.append(key)
    cols.rows.append(rows)
    cols.requests.append(index)
    cols.modalities.append(modality)
    cols.tensors.append(items[0].precomputed_embeddings if precomputed else None)
    cols.first_items.append(items[0])
    if not per_item:
        cols.multi_items[source] = (tuple(items), item_rows)
    return source
