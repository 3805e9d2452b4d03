"""Planning a prefill step on the host: which item rows the step needs and where they go.

Nothing here reads tensor data. A plan lists *sources* (one per distinct embedding the
step needs: a cached entry, a precomputed embedding, or an encoder output still to be
computed) and *segments* ``(source, src_row, n_rows, packed_row, token_row)`` saying
which rows of which source land where, in the packed ``[n_rows, H]`` layout and in the
forward batch's token rows. Misses are deduplicated across requests and grouped into
encoder batches (one call per modality, optionally capped by a token budget).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .cache import EmbeddingCache, combine_hashes
from .errors import InvalidItemError, PrecomputedEmbeddingError
from .items import Span, check_spans, item_spans, modality_name, span_tokens, window_overlap

log = logging.getLogger(__name__)

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
    planner = _Planner(cache, precomputed=_check_precomputed_consistency(requests))
    token_base = 0
    for index, req in enumerate(requests):
        row_offset = token_base if req.row_offset is None else req.row_offset
        token_base += max(req.extend, 0)
        if req.extend > 0 and req.items:
            planner.add_request(index, req, row_offset)
    return planner.finish(max_tokens_per_encoder_call)


class _Planner:
    def __init__(self, cache: EmbeddingCache | None, *, precomputed: bool) -> None:
        self.cache = cache
        self.precomputed = precomputed
        self.plan = StepPlan()
        self.by_key: dict[tuple, int] = {}  # (scope, key, rows) -> source index
        self.item_misses: dict[str, list[int]] = {}  # modality -> sources, first-seen order
        self.request_misses: list[tuple[str, int]] = []
        self.queued: set[int] = set()

    def add_request(self, index: int, req: RequestChunk, row_offset: int) -> None:
        window = (req.prefix, req.prefix + req.extend)
        groups: dict[str, list[Any]] = {}
        for item in req.items:
            groups.setdefault(modality_name(getattr(item, "modality", "IMAGE")), []).append(item)
        spans_by_group = {m: [item_spans(it, request=index) for it in items] for m, items in groups.items()}
        for per_item in spans_by_group.values():
            for spans in per_item:
                check_spans(spans, request=index, what="item")
        request_spans = sorted(s for per_item in spans_by_group.values() for sp in per_item for s in sp)
        check_spans(request_spans, request=index, what="items'")
        _check_request_offsets(req, request_spans, index)

        pieces = []  # (token position, source index, src_row, n_rows)
        for modality, items in groups.items():
            spans_per_item = spans_by_group[modality]
            if self.precomputed or all(len(sp) == 1 for sp in spans_per_item):
                for item, spans in zip(items, spans_per_item):
                    self._add_unit(pieces, index, modality, [item], [spans], window)
            else:
                # Multi-span items (video frames, image slices) are encoded per request
                # under one combined key, as SGLang does.
                self._add_unit(pieces, index, modality, items, spans_per_item, window)
        # Rows of one request come out in placeholder-position order across modalities.
        for position, src, src_row, n in sorted(pieces):
            self.plan.segments.append(
                PlannedSegment(src, src_row, n, self.plan.n_rows, row_offset + position - req.prefix, index)
            )
            self.plan.n_rows += n

    def _add_unit(self, pieces, index, modality, items, spans_per_item, window) -> None:
        # Encoder rows follow item order, then span order within an item.
        spans = [s for sp in spans_per_item for s in sp]
        overlaps = [window_overlap(s, e, *window) for s, e in spans]
        if not any(overlaps):
            return  # this chunk needs nothing from these items: no lookup, no encode
        src = self._source(index, modality, items, spans_per_item)
        if self.plan.sources[src].status == MISS and src not in self.queued:
            self.queued.add(src)
            if self.plan.sources[src].scope == PER_ITEM:
                self.item_misses.setdefault(modality, []).append(src)
            else:
                self.request_misses.append((modality, src))
        rows_before = 0
        for (s, e), overlap in zip(spans, overlaps):
            if overlap is not None:
                first, n = overlap
                pieces.append((s + first, src, rows_before + first, n))
            rows_before += e - s + 1

    def _source(self, index, modality, items, spans_per_item) -> int:
        item_rows = tuple(span_tokens(sp) for sp in spans_per_item)
        rows = sum(item_rows)
        per_item = len(items) == 1 and (self.precomputed or len(spans_per_item[0]) == 1)
        if per_item:
            key = _item_hash(items[0], index)
        else:
            key = combine_hashes([_item_hash(it, index) for it in items])
        scope = PER_ITEM if per_item else PER_REQUEST
        dedup = (PRECOMPUTED, id(items[0]), rows) if self.precomputed else (scope, key, rows)
        found = self.by_key.get(dedup)
        if found is not None:
            if self.plan.sources[found].status == HIT:
                self.plan.hit_items.extend(items)
            return found
        source = Source(
            status=MISS, scope=scope, key=key, rows=rows, items=tuple(items), item_rows=item_rows,
            request=index, modality=modality,
        )
        if self.precomputed:
            source.status, source.tensor = PRECOMPUTED, items[0].precomputed_embeddings
        elif self.cache is not None:
            self._lookup(source)
        self.plan.sources.append(source)
        self.by_key[dedup] = len(self.plan.sources) - 1
        return len(self.plan.sources) - 1

    def _lookup(self, source: Source) -> None:
        cached = self.cache.lookup(source.key)
        if cached is None:
            return
        if _rows_of(cached) == source.rows:
            source.status, source.tensor = HIT, cached
            self.plan.hit_items.extend(source.items)
            return
        # A different embedding under the same key (a truncated-hash collision, or a
        # model change): never used, dropped so the fresh encode can take its place.
        log.warning(
            "Discarding cached multimodal embedding: request %d, item hash %d, expected %d rows, cached %d",
            source.request, source.key, source.rows, _rows_of(cached),
        )
        self.cache.discard(source.key)

    def finish(self, max_tokens_per_encoder_call: int | None) -> StepPlan:
        for modality, srcs in self.item_misses.items():
            for batch in _split_by_budget(srcs, self.plan.sources, max_tokens_per_encoder_call):
                self.plan.encoder_batches.append((modality, batch))
        for modality, src in self.request_misses:
            self.plan.encoder_batches.append((modality, [src]))
        return self.plan


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
