"""Planning a prefill step on the host: which item rows the step needs and where they go.

Nothing here reads tensor data. A plan lists *sources* (one per distinct embedding the
step needs: a cached entry, a precomputed embedding, or an encoder output still to be
computed) and *segments* ``(source, src_row, n_rows, packed_row, token_row)`` saying
which rows of which source land where, in the packed ``[n_rows, H]`` layout and in the
forward batch's token rows. Misses are deduplicated across requests and grouped into
encoder batches (one call per modality, optionally capped by a token budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .cache import EmbeddingCache, combine_hashes
from .errors import InvalidItemError, PrecomputedEmbeddingError
from .items import Span, check_spans, item_spans, modality_name, span_tokens, window_overlap

HIT, MISS, PRECOMPUTED = "hit", "miss", "precomputed"
PER_ITEM, PER_REQUEST = "item", "request"


@dataclass(frozen=True)
class RequestChunk:
    """One request's part of a prefill step.

    ``offsets`` are the request-level spans (SGLang's ``items_offset_list[i]``), used
    by whole-request sources; they default to the items' spans in item order.
    ``row_offset`` is the first row of this request's extend tokens in ``input_embeds``
    (fused mode); it defaults to the sum of the previous requests' extend lengths.
    """

    items: Sequence[Any]
    prefix: int
    extend: int
    offsets: Sequence[Span] | None = None
    row_offset: int | None = None


@dataclass
class Source:
    status: str  # HIT | MISS | PRECOMPUTED
    scope: str  # PER_ITEM | PER_REQUEST
    key: int | None  # cache key (item hash or combined request hash)
    rows: int  # rows the embedding must have: its placeholder count
    items: tuple  # items the encoder turns into this embedding, in order
    item_rows: tuple  # expected rows per item (sums to rows)
    request: int  # first request that needs it (for error messages)
    modality: str
    tensor: Any = None  # set at plan time for hits and precomputed, after encoding for misses


@dataclass(frozen=True)
class PlannedSegment:
    source: int
    src_row: int
    n_rows: int
    packed_row: int
    token_row: int
    request: int


@dataclass
class StepPlan:
    sources: list[Source] = field(default_factory=list)
    segments: list[PlannedSegment] = field(default_factory=list)
    # Encoder calls: (modality, [source indices]) in call order.
    encoder_batches: list[tuple[str, list[int]]] = field(default_factory=list)
    n_rows: int = 0
    # Items whose embedding came from the cache (for the IPC acknowledgement).
    hit_items: list[Any] = field(default_factory=list)

    @property
    def hit_keys(self) -> list[int]:
        return [s.key for s in self.sources if s.status == HIT]


def _check_request_offsets(req: RequestChunk, item_spans_sorted: list[Span], index: int) -> None:
    """The request-level spans, when given, must be exactly the items' spans: a
    disagreement means the caller's layout and its items describe different prompts."""
    if req.offsets is None:
        return
    given = sorted((int(s), int(e)) for s, e in req.offsets)
    if given != item_spans_sorted:
        raise InvalidItemError(
            f"request {index}: request offsets {given} differ from its items' offsets {item_spans_sorted}"
        )


def _item_hash(item: Any, index: int) -> int:
    h = getattr(item, "hash", None)
    if h is None:
        raise InvalidItemError(f"request {index}: item has no hash; the scheduler keys the cache by it")
    return int(h)


def _has_precomputed(item: Any) -> bool:
    return getattr(item, "precomputed_embeddings", None) is not None


def _check_precomputed_consistency(requests: Sequence[RequestChunk]) -> bool:
    """SGLang's rule: either every item of the batch carries a precomputed embedding
    or none does; a mix has no defined meaning and is refused."""
    flags = {}
    for i, req in enumerate(requests):
        for item in req.items:
            flags.setdefault(_has_precomputed(item), i)
    if len(flags) == 2:
        raise PrecomputedEmbeddingError(
            "MM inputs where only some items are precomputed: request "
            f"{flags[True]} has precomputed embeddings, request {flags[False]} does not"
        )
    return flags.get(True) is not None


def plan_step(
    requests: Sequence[RequestChunk],
    cache: EmbeddingCache | None,
    *,
    max_tokens_per_encoder_call: int | None = None,
) -> StepPlan:
    """Build the plan for one step over all modalities present in ``requests``."""
    plan = StepPlan()
    precomputed = _check_precomputed_consistency(requests)
    by_key: dict[tuple, int] = {}  # dedup: (scope, key, rows) -> source index
    misses_per_item: dict[str, list[int]] = {}  # modality -> per-item miss sources, first-seen order
    request_misses: list[tuple[str, int]] = []
    queued: set[int] = set()
    packed_row = 0
    token_base = 0
    for index, req in enumerate(requests):
        row_offset = token_base if req.row_offset is None else req.row_offset
        token_base += max(req.extend, 0)
        if req.extend <= 0 or not req.items:
            continue
        window = (req.prefix, req.prefix + req.extend)
        groups: dict[str, list[Any]] = {}
        for item in req.items:
            groups.setdefault(modality_name(getattr(item, "modality", "IMAGE")), []).append(item)
        spans_by_group = {m: [item_spans(it, request=index) for it in items] for m, items in groups.items()}
        request_spans = sorted(s for per_item in spans_by_group.values() for sp in per_item for s in sp)
        check_spans(request_spans, request=index, what="items'")
        _check_request_offsets(req, request_spans, index)
        pieces = []  # (token position, source index, src_row, n_rows)
        for modality, items in groups.items():
            spans_per_item = spans_by_group[modality]
            for spans in spans_per_item:
                check_spans(spans, request=index, what="item")
            all_spans = sorted(s for spans in spans_per_item for s in spans)
            if not any(window_overlap(s, e, *window) for s, e in all_spans):
                continue  # this chunk needs nothing from these items: encode nothing
            per_item = precomputed or all(len(spans) == 1 for spans in spans_per_item)
            if per_item:
                units = [([it], spans) for it, spans in zip(items, spans_per_item)]
            else:
                # Multi-span items (video frames, image slices) are encoded per request
                # under one combined key, as SGLang does.
                # Encoder rows follow item order, then span order within an item.
                units = [(items, [s for sp in spans_per_item for s in sp])]
            for unit_items, spans in units:
                overlaps = [window_overlap(s, e, *window) for s, e in spans]
                if not any(overlaps):
                    continue
                src = _source_for(
                    plan, by_key, cache, unit_items, spans, index, modality, per_item, precomputed,
                    spans_per_item if not per_item else None,
                )
                if plan.sources[src].status == MISS and src not in queued:
                    queued.add(src)
                    if per_item:
                        misses_per_item.setdefault(modality, []).append(src)
                    else:
                        request_misses.append((modality, src))
                rows_before = 0
                for (s, e), overlap in zip(spans, overlaps):
                    if overlap is not None:
                        first, n = overlap
                        pieces.append((s + first, src, rows_before + first, n))
                    rows_before += e - s + 1
        # Rows of one request come out in placeholder-position order across modalities.
        for position, src, src_row, n in sorted(pieces):
            plan.segments.append(
                PlannedSegment(src, src_row, n, packed_row, row_offset + position - req.prefix, index)
            )
            packed_row += n
    plan.n_rows = packed_row
    for modality, srcs in misses_per_item.items():
        for batch in _split_by_budget(srcs, plan.sources, max_tokens_per_encoder_call):
            plan.encoder_batches.append((modality, batch))
    for modality, src in request_misses:
        plan.encoder_batches.append((modality, [src]))
    return plan


def _source_for(plan, by_key, cache, items, spans, index, modality, per_item, precomputed, spans_per_item):
    rows = span_tokens(spans)
    if per_item:
        item = items[0]
        key = _item_hash(item, index)
        item_rows = (rows,)
    else:
        key = combine_hashes([_item_hash(it, index) for it in items])
        item_rows = tuple(span_tokens(sp) for sp in spans_per_item)
    scope = PER_ITEM if per_item else PER_REQUEST
    dedup = (PRECOMPUTED, id(items[0]), rows) if precomputed else (scope, key, rows)
    found = by_key.get(dedup)
    if found is not None:
        if plan.sources[found].status == HIT:
            plan.hit_items.extend(items)
        return found
    source = Source(
        status=MISS, scope=scope, key=key, rows=rows, items=tuple(items), item_rows=item_rows,
        request=index, modality=modality,
    )
    if precomputed:
        source.status, source.tensor = PRECOMPUTED, items[0].precomputed_embeddings
    elif cache is not None:
        cached = cache.lookup(key)
        if cached is not None and _rows_of(cached) == rows:
            source.status, source.tensor = HIT, cached
            plan.hit_items.extend(items)
        elif cached is not None:
            # A different embedding under the same key (a truncated-hash collision, or a
            # model change): never used, dropped so the fresh encode can take its place.
            import logging

            logging.getLogger(__name__).warning(
                "Discarding cached multimodal embedding: request %d, item hash %d, expected %d rows, cached %d",
                index, key, rows, _rows_of(cached),
            )
            cache.discard(key)
    plan.sources.append(source)
    by_key[dedup] = len(plan.sources) - 1
    return len(plan.sources) - 1


def _rows_of(tensor: Any) -> int:
    return tensor.numel() // tensor.shape[-1] if tensor.dim() else 0


def _split_by_budget(srcs: list[int], sources: list[Source], budget: int | None) -> list[list[int]]:
    if budget is None:
        return [srcs] if srcs else []
    batches, current, tokens = [], [], 0
    for s in srcs:
        rows = sources[s].rows
        if current and tokens + rows > budget:
            batches.append(current)
            current, tokens = [], 0
        current.append(s)
        tokens += rows
    if current:
        batches.append(current)
    return batches
