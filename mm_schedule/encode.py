"""Calling the encoder for a plan's misses and checking what comes back.

Every row count is validated against the placeholder count before anything is
cached or assembled: a short or long result raises ``EmbeddingLengthMismatch``
naming the request, the item hash and both counts. Nothing is ever cropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import EmbeddingLengthMismatch, EncoderOutputError, InvalidItemError
from .items import modality_name
from .plan import PER_ITEM, StepPlan

# Encoders of these models move their (concatenated) inputs to the device themselves in
# one copy; moving each item first would only add copies.
SELF_MOVING_ENCODER_OWNERS = frozenset(
    {
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "KimiK3ForConditionalGeneration",
    }
)
_SELF_MOVING_METHODS = frozenset({"get_image_feature", "get_video_feature"})


def encoder_moves_its_inputs(fn: Callable) -> bool:
    owner = getattr(fn, "__self__", None)
    return (
        owner is not None
        and getattr(fn, "__name__", "") in _SELF_MOVING_METHODS
        and type(owner).__name__ in SELF_MOVING_ENCODER_OWNERS
    )


def move_features_to(items: Sequence[Any], device: Any) -> None:
    """Move miss items' raw features to ``device`` in place (only tensors not there yet)."""
    for item in items:
        feature = getattr(item, "feature", None)
        if hasattr(feature, "to") and hasattr(feature, "device") and feature.device != device:
            item.feature = feature.to(device, non_blocking=True)


def resolve_encoder(encoders: Callable | Mapping[Any, Callable], modality: str, request: int) -> Callable:
    if callable(encoders) and not isinstance(encoders, Mapping):
        return encoders
    for key, fn in encoders.items():
        if modality_name(key) == modality:
            return fn
    raise InvalidItemError(f"request {request}: no encoder given for modality {modality}")


def _label(labels: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"request {r} item hash {h}" for r, h in labels[:8]) + (" ..." if len(labels) > 8 else "")


def split_encoder_output(
    output: Any, expected_rows: Sequence[int], labels: Sequence[tuple[int, int]], *, whole: bool = False
) -> list[Any]:
    """Per-item 2-D ``[rows, H]`` tensors from an encoder result, validated.

    ``labels[i]`` is ``(request, item hash)`` of item i, used in error messages.
    Accepts one combined tensor (any rank >= 2; rows are everything but the last dim),
    a list with one tensor per item, or an object with ``.embedding``. With ``whole``,
    a combined tensor is validated but returned unsplit, as a one-element list.
    """
    if not hasattr(output, "shape") and hasattr(output, "embedding"):
        output = output.embedding
    if isinstance(output, (list, tuple)):
        if len(output) != len(expected_rows):
            raise EmbeddingLengthMismatch(
                expected=len(expected_rows), received=len(output), request=labels[0][0],
                what="encoder outputs (one tensor per item)", hint=f"items: {_label(labels)}",
            )
        pieces = []
        for t, rows, (request, item_hash) in zip(output, expected_rows, labels):
            flat = _as_rows(t, request, item_hash)
            if flat.shape[0] != rows:
                raise EmbeddingLengthMismatch(
                    expected=rows, received=flat.shape[0], request=request, item_hash=item_hash,
                    what="encoder rows for the item",
                )
            pieces.append(flat)
        _check_hidden(pieces, labels)
        return pieces
    if hasattr(output, "shape"):
        flat = _as_rows(output, labels[0][0], labels[0][1] if len(labels) == 1 else None)
        total = sum(expected_rows)
        if flat.shape[0] != total:
            one = len(labels) == 1
            raise EmbeddingLengthMismatch(
                expected=total, received=flat.shape[0], request=labels[0][0],
                item_hash=labels[0][1] if one else None,
                what="encoder rows" if one else f"encoder rows for a batch of {len(labels)} items",
                hint="" if one else f"expected per item {list(expected_rows)[:8]} for {_label(labels)}",
            )
        if whole or len(expected_rows) == 1:
            return [flat]
        return list(flat.split(list(expected_rows)))
    raise EncoderOutputError(
        f"{_label(labels)}: encoder returned {type(output).__name__}; expected a tensor or a list of tensors"
    )


def _as_rows(t: Any, request: int, item_hash: int | None) -> Any:
    if not hasattr(t, "shape") or t.dim() < 2:
        raise EncoderOutputError(
            f"request {request}, item hash {item_hash}: encoder output must be a tensor of rank >= 2,"
            f" got {getattr(t, 'shape', type(t).__name__)}"
        )
    return t.reshape(-1, t.shape[-1])


def _check_hidden(pieces: Sequence[Any], labels: Sequence[tuple[int, int]]) -> None:
    hidden = {p.shape[-1] for p in pieces}
    if len(hidden) > 1:
        raise EncoderOutputError(f"{_label(labels)}: encoder outputs disagree on hidden size: {sorted(hidden)}")


def encode_misses(
    plan: StepPlan,
    encoders: Callable | Mapping[Any, Callable],
    *,
    device: Any = None,
    move_features: bool | None = None,
    batches: list[tuple[str, list[int]]] | None = None,
) -> tuple[int, int]:
    """Run ``batches`` (default: every encoder batch of ``plan``) and store each miss's
    tensor on its source. Returns ``(encoder calls, items encoded)``."""
    calls = items_encoded = 0
    for modality, batch in plan.encoder_batches if batches is None else batches:
        sources = [plan.sources[i] for i in batch]
        items = [it for s in sources for it in s.items]
        expected = [n for s in sources for n in s.item_rows]
        labels = [(s.request, int(it.hash)) for s in sources for it in s.items]
        fn = resolve_encoder(encoders, modality, sources[0].request)
        should_move = not encoder_moves_its_inputs(fn) if move_features is None else move_features
        if device is not None and should_move:
            move_features_to(items, device)
        whole = len(sources) == 1 and sources[0].scope != PER_ITEM
        pieces = split_encoder_output(fn(items), expected, labels, whole=whole)
        calls += 1
        items_encoded += len(items)
        if whole:
            sources[0].tensor = pieces[0] if len(pieces) == 1 else _cat(pieces)
            continue
        for s, piece in zip(sources, pieces):
            s.tensor = piece
    return calls, items_encoded


def _cat(pieces: Sequence[Any]) -> Any:
    import torch

    return torch.cat(list(pieces))
