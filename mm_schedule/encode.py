"""Encoders, and calling them for a plan's misses.

An encoder is a callable taking the list of items to encode and returning one
combined tensor (rows of all items, in order; any rank >= 2, rows are everything but
the last dim), a list with one tensor per item, or an object with ``.embedding``.
Wrap it in ``Encoder`` to state the two choices only its author can make:

* ``move_features``: before the call, move each item's ``feature`` to the step's
  device, *replacing* ``item.feature`` (SGLang's behaviour for its model encoders).
  Off by default: an encoder that takes its inputs where they are (a transformers
  vision tower fed by its processor) never has its items changed.
* ``copy_outputs``: copy what the encoder returns before caching it, for encoders
  that write every call's result into one reused buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import torch

from .errors import InvalidItemError
from .items import modality_name
from .plan import StepPlan


@dataclass(frozen=True)
class Encoder:
    fn: Callable[[list], Any]
    move_features: bool = False
    copy_outputs: bool = False

    def __call__(self, items: list) -> Any:
        return self.fn(items)


Encoders = Callable | Encoder | Mapping[Any, Callable | Encoder]


def as_encoder(fn: Callable | Encoder, *, move_features: bool = False) -> Encoder:
    """``fn`` as an ``Encoder``; a bare callable gets ``move_features`` as its choice."""
    if isinstance(fn, Encoder):
        return fn
    if not callable(fn):
        raise InvalidItemError(f"an encoder must be callable, got {type(fn).__name__}")
    return Encoder(fn, move_features=move_features)


def resolve_encoder(encoders: Encoders, modality: str, request: int, *, move_features: bool = False) -> Encoder:
    """The encoder for ``modality``: the one callable given, or the mapping's entry whose
    key names the modality (``"IMAGE"``, ``"image"`` or an enum member)."""
    if not isinstance(encoders, Mapping):
        return as_encoder(encoders, move_features=move_features)
    for key, fn in encoders.items():
        if modality_name(key) == modality:
            return as_encoder(fn, move_features=move_features)
    raise InvalidItemError(f"request {request}: no encoder given for modality {modality}")


def move_features_to(items: Sequence[Any], device: Any) -> None:
    """Move items' raw features to ``device`` in place (only tensors not there yet)."""
    try:
        features = list(map(_feature_of, items))
    except AttributeError:
        features = None
    if features is not None and set(map(type, features)) == {torch.Tensor} \
            and set(map(_device_of, features)) == {device}:
        return  # every feature a tensor already there (the usual step): read in C loops
    for item in items:
        feature = getattr(item, "feature", None)
        if hasattr(feature, "to") and hasattr(feature, "device") and feature.device != device:
            item.feature = feature.to(device, non_blocking=True)


_feature_of, _device_of = attrgetter("feature"), attrgetter("device")


def batch_items(plan: StepPlan, batch: Sequence[int]) -> list[Any]:
    """The items one encoder call receives: each source's items, in source order."""
    if not plan.multi_items:
        firsts = plan.first_items
        return [firsts[s] for s in batch]
    return [item for s in batch for item in plan.items_of(s)]


def encode_misses(plan: StepPlan, encoders: Encoders, *, device: Any = None,
                  move_features: bool = False) -> list[tuple[Encoder, Any]]:
    """Call the encoder once per encoder batch of ``plan``; returns ``(encoder, raw output)``
    per batch, in batch order. Nothing is checked or cached here."""
    outputs = []
    for modality, batch in plan.encoder_batches:
        encoder = resolve_encoder(encoders, modality, plan.requests[batch[0]], move_features=move_features)
        items = batch_items(plan, batch)
        if encoder.move_features and device is not None:
            move_features_to(items, device)
        outputs.append((encoder, encoder(items)))
    return outputs
