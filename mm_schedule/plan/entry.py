"""``plan_step``: the one entry to planning; picks the flat planner when it applies."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

from ..errors import InvalidItemError
from .columns import RequestChunk, StepPlan
from .flat import plan_flat, request_slices
from .general import plan_general


def plan_step(requests: Iterable[RequestChunk], cache: Any = None, *,
              max_tokens_per_encoder_call: int | None = None) -> StepPlan:
    """Build the plan for one step over all modalities present in ``requests``.

    ``cache``: anything with ``lookup_many(keys, rows)`` (an ``EmbeddingCache``, whose
    ``lookup_all`` also takes each key's modality), read through that one call for every
    key of the step at once (a cached entry whose row count is not the item's placeholder
    count, or of another modality, is a miss); None: all misses.
    """
    return plan_columns(*request_columns(as_requests(requests)), cache, max_tokens_per_encoder_call)


def as_requests(requests: Iterable[RequestChunk]) -> list[RequestChunk] | tuple[RequestChunk, ...]:
    """``requests`` as a sequence (any iterable is read once), each a ``RequestChunk``."""
    if not isinstance(requests, (list, tuple)):
        if isinstance(requests, RequestChunk) or not isinstance(requests, Iterable):
            raise InvalidItemError(f"requests must be an iterable of RequestChunk, got {type(requests).__name__}")
        requests = list(requests)
    if not all(map(isinstance, requests, repeat(RequestChunk))):
        for index, req in enumerate(requests):
            if not isinstance(req, RequestChunk):
                raise InvalidItemError(f"request {index}: expected a RequestChunk, got {type(req).__name__}")
    return requests


_FIELDS = attrgetter("items", "prefix", "extend", "offsets", "row_offset")


def request_columns(requests: Sequence[RequestChunk]) -> tuple[list, list, list, list, list]:
    """Checked requests as the five parallel lists ``plan_columns`` takes: items,
    prefixes, extends, offsets and row offsets (read in one pass that runs in C)."""
    if not requests:
        return [], [], [], [], []
    items, prefixes, extends, offsets, row_offsets = map(list, zip(*map(_FIELDS, requests)))
    return items, prefixes, extends, offsets, row_offsets


def plan_columns(items, prefixes, extends, offsets, row_offsets, cache, budget, *, bounds=None) -> StepPlan:
    """``plan_step`` over requests given as parallel lists (what the SGLang-compatible
    API has already, so it builds no per-request object). ``bounds``: ``items`` is one
    flat list, request r's items ``items[bounds[r]:bounds[r + 1]]`` (SGLang's ``items_size``)."""
    plan = plan_flat(items, prefixes, extends, offsets, row_offsets, budget, bounds)
    if plan is None:
        if bounds is not None:
            items = request_slices(items, bounds)
        plan = plan_general(items, prefixes, extends, offsets, row_offsets, budget)
    return plan.with_lookups(_lookup_of(cache))


def _lookup_of(cache: Any) -> Any:
    """``cache``'s lookup as ``with_lookups`` calls it: ``(keys, rows, modalities)``."""
    if cache is None:
        return None
    lookup_all = getattr(cache, "lookup_all", None)
    if lookup_all is not None:
        return lookup_all
    lookup_many = cache.lookup_many
    return lambda keys, rows, modalities: lookup_many(keys, rows)
