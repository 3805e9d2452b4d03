"""Multimodal items as the scheduler sees them, and the checks on their spans.

The scheduler duck-types on ``hash``, ``offsets``, ``feature``,
``precomputed_embeddings``, ``modality`` and ``pad_value``, so SGLang's own
``MultimodalDataItem`` objects work unchanged; ``MMItem`` is our small equivalent.
``offsets`` is a list of ``(start, end)`` spans with inclusive ends, in prompt positions.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidItemError

Span = tuple[int, int]  # (start, end), end inclusive, in prompt positions

MODALITY_ORDER = ("IMAGE", "VIDEO", "AUDIO")


@dataclass(eq=False)
class MMItem:
    modality: Any = "IMAGE"
    hash: int | bytes | str | None = None
    offsets: list[Span] | None = None
    feature: Any = None
    precomputed_embeddings: Any = None
    pad_value: int | None = None
    model_specific_data: dict = field(default_factory=dict)


# Modality objects already named by modality_name (read directly by the flat planner).
KNOWN_MODALITIES: dict[Any, str] = {}


def modality_name(modality: Any) -> str:
    """``Modality.IMAGE`` (an enum), ``"image"`` and ``"IMAGE"`` all name the same modality."""
    try:
        return KNOWN_MODALITIES[modality]
    except (KeyError, TypeError):
        name = str(getattr(modality, "name", modality)).upper()
        try:
            KNOWN_MODALITIES[modality] = name
        except TypeError:  # unhashable: named each time
            pass
        return name


def _where(request: int | None, item: Any) -> str:
    return f"request {request}, item hash {getattr(item, 'hash', None)!r}"


def item_spans(item: Any, *, request: int | None = None) -> list[Span]:
    """The item's spans as ``(start, end)`` int pairs, or ``InvalidItemError`` saying what
    shape was given instead (a bare ``(s, e)`` pair, a generator, non-integer ends)."""
    offsets = getattr(item, "offsets", None)
    if offsets is None or (isinstance(offsets, (list, tuple)) and not offsets):
        raise InvalidItemError(f"{_where(request, item)}: item has no offsets")
    if not isinstance(offsets, (list, tuple)):
        raise InvalidItemError(
            f"{_where(request, item)}: offsets must be a list of (start, end) spans, got {type(offsets).__name__}"
        )
    if len(offsets) == 2 and all(isinstance(v, int) for v in offsets):
        raise InvalidItemError(
            f"{_where(request, item)}: offsets {tuple(offsets)!r} is one bare (start, end) pair;"
            f" pass a list of spans: [{tuple(offsets)!r}]"
        )
    spans = []
    for span in offsets:
        try:
            start, end = span
            spans.append((operator.index(start), operator.index(end)))
        except (TypeError, ValueError):
            raise InvalidItemError(
                f"{_where(request, item)}: span {span!r} is not an (start, end) pair of ints"
            ) from None
    return spans


def span_tokens(spans: Sequence[Span]) -> int:
    return sum(e - s + 1 for s, e in spans)


def check_spans(spans: Sequence[Span], *, request: int | None, what: str) -> None:
    """Spans must be well formed, sorted and disjoint: rows follow span order, so
    anything else would silently misalign embeddings and placeholders."""
    prev_end = -1
    for s, e in spans:
        if s < 0 or e < s:
            raise InvalidItemError(f"request {request}: {what} has a malformed span ({s}, {e})")
        if s <= prev_end:
            raise InvalidItemError(
                f"request {request}: {what} spans are not sorted and disjoint at ({s}, {e})"
            )
        prev_end = e


def window_overlap(start: int, end: int, window_start: int, window_end: int) -> tuple[int, int] | None:
    """Inclusive span ``[start, end]`` against the half-open window; returns the
    overlap as item-local ``(first_row, n_rows)`` relative to ``start``, or None."""
    lo = max(start, window_start)
    hi = min(end, window_end - 1)
    if hi < lo:
        return None
    return lo - start, hi - lo + 1


def as_index(value: Any, *, request: int, what: str) -> int:
    """An int-like request field (prefix, extend, row offset), or ``InvalidItemError``."""
    if isinstance(value, bool):
        raise InvalidItemError(f"request {request}: {what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidItemError(f"request {request}: {what} must be an int, got {value!r}") from None
