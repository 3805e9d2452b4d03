"""Multimodal items as the scheduler sees them.

The scheduler duck-types on ``hash``, ``offsets``, ``feature``,
``precomputed_embeddings``, ``modality`` and ``pad_value``, so SGLang's own
``MultimodalDataItem`` objects work unchanged; ``MMItem`` is our small equivalent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidItemError

Span = tuple[int, int]  # (start, end), end inclusive, in prompt positions

MODALITY_ORDER = ("IMAGE", "VIDEO", "AUDIO")


@dataclass(eq=False)
class MMItem:
    modality: Any = "IMAGE"
    hash: int | None = None
    offsets: list[Span] | None = None
    feature: Any = None
    precomputed_embeddings: Any = None
    pad_value: int | None = None
    model_specific_data: dict = field(default_factory=dict)


def modality_name(modality: Any) -> str:
    """``Modality.IMAGE`` (an enum), ``"image"`` and ``"IMAGE"`` all name the same modality."""
    return str(getattr(modality, "name", modality)).upper()


def item_spans(item: Any, *, request: int | None = None) -> list[Span]:
    offsets = getattr(item, "offsets", None)
    if not offsets:
        raise InvalidItemError(
            f"request {request}, item hash {getattr(item, 'hash', None)}: item has no offsets"
        )
    return [(int(s), int(e)) for s, e in offsets]


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
