"""A step's plan as parallel columns, and the rule that cuts its misses into encoder calls."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, NamedTuple

from ..errors import InvalidItemError

Span = tuple[int, int]  # (start, end), end inclusive, in prompt positions


class SourceKind(enum.Enum):
    HIT = "hit"  # served from the cache
    MISS = "miss"  # to be encoded this step
    PRECOMPUTED = "precomputed"  # the item carries its embedding


HIT, MISS, PRECOMPUTED = SourceKind.HIT, SourceKind.MISS, SourceKind.PRECOMPUTED


@dataclass(frozen=True)
class RequestChunk:
    """One request's part of a prefill step.

    ``items`` may be any iterable (it is read once, into a tuple). ``offsets`` are the
    request-level spans (SGLang's ``items_offset_list[i]``); when given they must be
    exactly the items' spans. ``row_offset`` is the first row of this request's extend
    tokens in ``input_embeds`` (fused mode); it defaults to the sum of the previous
    requests' extend lengths.
    """

    items: Sequence[Any]
    prefix: int
    extend: int
    offsets: Sequence[Span] | None = None
    row_offset: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.items, (list, tuple)):
            object.__setattr__(self, "items", _as_tuple(self.items, "items"))
        if self.offsets is not None and not isinstance(self.offsets, (list, tuple)):
            object.__setattr__(self, "offsets", _as_tuple(self.offsets, "offsets"))


def _as_tuple(value: Any, what: str) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidItemError(f"RequestChunk.{what} must be a sequence, got {type(value).__name__}")
    return tuple(value)


class SourceView(NamedTuple):
    """One source of a plan, as an object (built on demand for inspection, never by the planner)."""

    kind: SourceKind
    key: int | None
    rows: int
    items: tuple
    item_rows: tuple
    request: int
    modality: str
    tensor: Any

    @property
    def status(self) -> SourceKind:
        return self.kind


class SegmentView(NamedTuple):
    source: int
    src_row: int
    n_rows: int
    packed_row: int
    token_row: int
    request: int


class StepPlan(NamedTuple):
    """What one step needs, as parallel columns (index = source or segment number).

    Sources: ``kinds``, ``keys``, ``rows``, ``requests`` (first request that needs it),
    ``modalities``, ``tensors`` (the cached or precomputed tensor; None for misses),
    ``first_items`` (the item whose embedding it is; for a whole-request source the
    first of its items), ``multi_items`` (whole-request sources: ``source -> (items,
    rows per item)``).
    Segments: ``seg_source``, ``seg_src_row``, ``seg_rows``, ``seg_packed_row``,
    ``seg_token_row``, ``seg_request``.
    ``encoder_batches``: ``(modality, source indices)`` per encoder call, in call order.
    ``use_source``/``use_item``: each request's use of a source (the item(s) it gives);
    ``hit_items`` lists the items of the uses served from the cache.
    ``token_budget``: the encoder-call token cap the batches were cut with.
    ``n_rows``: rows of the packed layout; ``n_tokens``: extend tokens of all requests.
    ``cache_layout``: ``(hidden, dtype, device)`` shared by every cache entry at lookup
    time (None when they differ or nothing was looked up). ``addresses``: when every
    source is a hit, the address of each one's first row, as the cache recorded it (None
    otherwise): what copying them needs on a GPU, without reading a tensor.

    A plan is never changed once built (the columns are read-only by contract, and are
    not copied for it); a step that must change a decision builds a new plan
    (``with_misses`` for ranks agreeing on misses, or ``_replace``).
    """

    kinds: Sequence[SourceKind]
    keys: Sequence[int | None]
    rows: Sequence[int]
    requests: Sequence[int]
    modalities: Sequence[str]
    tensors: Sequence[Any]
    first_items: Sequence[Any]
    multi_items: dict[int, tuple[tuple, tuple]]
    seg_source: Sequence[int]
    seg_src_row: Sequence[int]
    seg_rows: Sequence[int]
    seg_packed_row: Sequence[int]
    seg_token_row: Sequence[int]
    seg_request: Sequence[int]
    encoder_batches: Sequence[tuple[str, tuple[int, ...]]]
    use_source: Sequence[int]
    use_item: Sequence[Any]
    n_rows: int
    n_tokens: int
    cache_layout: tuple | None = None
    token_budget: int | None = None
    addresses: Sequence[int] | None = None

    def with_lookups(self, lookup: Any) -> StepPlan:
        """This plan (every cached source planned a miss) with the sources ``lookup`` finds
        turned into hits and the misses cut into encoder batches. ``lookup(keys, rows,
        modalities)`` returns ``(tensor or None per key, layout shared by the cache's
        entries)``, e.g. ``EmbeddingCache.lookup_many``, optionally with a third element,
        True when every key was found, and a fourth, then, the entries' addresses
        (``EmbeddingCache.lookup_all``); None: nothing is cached."""
        kinds, tensors, layout, addresses = self.kinds, self.tensors, None, None
        if lookup is not None and MISS in kinds:
            # Lists of one member compare by identity, element by element in C: far cheaper
            # than ``PRECOMPUTED in kinds``, which compares every enum member by value.
            if type(kinds) is not list or kinds != [MISS] * len(kinds):
                wanted = [i for i, kind in enumerate(kinds) if kind is MISS]
            else:
                wanted = None  # every source a miss: all looked up, in order
            keys, rows, modalities = (self.keys, self.rows, self.modalities) if wanted is None else (
                [self.keys[i] for i in wanted], [self.rows[i] for i in wanted], [self.modalities[i] for i in wanted])
            found, layout, *every = lookup(keys, rows, modalities)
            if wanted is None:
                tensors = found
                if every and every[0]:
                    kinds = [HIT] * len(found)
                    addresses = every[1] if len(every) > 1 else None
                elif found == [None] * len(found):
                    kinds = [MISS] * len(found)  # nothing cached (a cold step), compared in C
                else:
                    kinds = [MISS if t is None else HIT for t in found]
            else:
                kinds, tensors = list(kinds), list(tensors)
                for i, t in zip(wanted, found):
                    if t is not None:
                        kinds[i], tensors[i] = HIT, t
        batches = batch_misses(kinds, self.rows, self.modalities, self.multi_items, self.token_budget) \
            if not _only(kinds, HIT) and MISS in kinds else ()
        return self._replace(kinds=kinds, tensors=tensors, encoder_batches=batches, cache_layout=layout,
                             addresses=addresses)

    @property
    def all_hits(self) -> bool:
        """Every source served from the cache (the steady state), tested without comparing
        enum members by value."""
        return _only(self.kinds, HIT)

    @property
    def has_hits(self) -> bool:
        """Some source served from the cache (``HIT in kinds``, answered at once for a step
        of misses only)."""
        return not _only(self.kinds, MISS) and HIT in self.kinds

    @property
    def hit_items(self) -> list[Any]:
        """Every request's item served from the cache, each use once (whole-request
        sources contribute all their items)."""
        kinds = self.kinds
        if not self.multi_items and _only(kinds, HIT):
            return list(self.use_item)  # every use a hit of one item (the steady state): no loop
        items = []
        for source, item in zip(self.use_source, self.use_item):
            if kinds[source] is HIT:
                if type(item) is tuple:
                    items.extend(item)
                else:
                    items.append(item)
        return items

    def with_misses(self, sources: Iterable[int]) -> StepPlan:
        """This plan with the given hit sources turned into misses, encoder batches cut
        again. For ranks that must agree: a source one rank missed is encoded by all."""
        kinds, tensors = list(self.kinds), list(self.tensors)
        for s in sources:
            if kinds[s] is HIT:
                kinds[s], tensors[s] = MISS, None
        batches = batch_misses(kinds, self.rows, self.modalities, self.multi_items, self.token_budget)
        return self._replace(kinds=kinds, tensors=tensors, encoder_batches=batches, cache_layout=None, addresses=None)

    # -- derived views (for inspection; the step itself reads the columns) --------------
    @property
    def n_sources(self) -> int:
        return len(self.kinds)

    def items_of(self, source: int) -> tuple:
        multi = self.multi_items.get(source)
        return multi[0] if multi is not None else (self.first_items[source],)

    def item_rows_of(self, source: int) -> tuple:
        multi = self.multi_items.get(source)
        return multi[1] if multi is not None else (self.rows[source],)

    @property
    def sources(self) -> list[SourceView]:
        return [
            SourceView(self.kinds[i], self.keys[i], self.rows[i], self.items_of(i), self.item_rows_of(i),
                       self.requests[i], self.modalities[i], self.tensors[i])
            for i in range(len(self.kinds))
        ]

    @property
    def segments(self) -> list[SegmentView]:
        return [SegmentView(*row) for row in zip(
            self.seg_source, self.seg_src_row, self.seg_rows, self.seg_packed_row, self.seg_token_row,
            self.seg_request)]

    @property
    def hit_keys(self) -> list[int]:
        return [k for k, kind in zip(self.keys, self.kinds) if kind is HIT]


class RunningRows(Sequence):
    """A plan's ``seg_packed_row`` when the segments fill the packed layout in order: each
    segment's first row, the running sum of ``seg_rows``, computed the first time it is read.
    The usual all-cached step concatenates its sources and never reads it, so it pays no
    int per segment."""

    __slots__ = ("_rows", "_values")

    def __init__(self, rows: Sequence[int]) -> None:
        self._rows = rows
        self._values: list[int] | None = None

    def _list(self) -> list[int]:
        values = self._values
        if values is None:
            values = list(accumulate(self._rows, initial=0))
            values.pop()
            self._values = values  # two threads may both compute it: the same values
        return values

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        return self._list()[index]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunningRows):
            other = other._list()
        return self._list() == other if isinstance(other, list) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._list())


def counting(n: int) -> list[int]:
    """``list(range(n))`` made of int objects shared by every plan: a large step's index
    columns allocate (and later free) no int per source."""
    global _COUNTING
    shared = _COUNTING
    if len(shared) < n:
        # Replaced, never extended in place: a thread reading the old list still reads 0, 1, ...
        shared = _COUNTING = list(range(max(n, 2 * len(shared))))
    return shared[:n]


_COUNTING: list[int] = list(range(1024))


def _only(kinds: Sequence[SourceKind], kind: SourceKind) -> bool:
    """True when ``kinds`` is a list holding nothing but ``kind`` (False for other sequences,
    which callers then scan as before)."""
    return type(kinds) is list and kinds == [kind] * len(kinds)


def batch_misses(kinds: Sequence[SourceKind], rows: Sequence[int], modalities: Sequence[str],
                 whole_request: Iterable[int], budget: int | None) -> list[tuple[str, tuple[int, ...]]]:
    """Encoder calls for the misses: per modality, every per-item miss in first-seen order
    (cut where ``budget`` placeholder tokens would be exceeded); then each whole-request
    miss in a call of its own (its items are encoded together, as SGLang does)."""
    whole = set(whole_request)
    per_modality: dict[str, list[int]] = {}
    alone: list[tuple[str, tuple[int, ...]]] = []
    if not whole and kinds and _only(kinds, MISS) and type(modalities) is list \
            and modalities == [modalities[0]] * len(modalities):
        # Every source a per-item miss of one modality (a cold step): all of them, in order.
        per_modality[modalities[0]] = list(range(len(kinds)))
        kinds = ()
    for i, kind in enumerate(kinds):
        if kind is not MISS:
            continue
        if i in whole:
            alone.append((modalities[i], (i,)))
        else:
            per_modality.setdefault(modalities[i], []).append(i)
    batches = []
    for modality, sources in per_modality.items():
        if budget is None:
            batches.append((modality, tuple(sources)))
            continue
        current, tokens = [], 0
        for s in sources:
            if current and tokens + rows[s] > budget:
                batches.append((modality, tuple(current)))
                current, tokens = [], 0
            current.append(s)
            tokens += rows[s]
        if current:
            batches.append((modality, tuple(current)))
    return batches + alone
