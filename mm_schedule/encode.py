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

from .cache import storage_id
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
        # Every feature already there (the usual step), read in one C loop; a CPU or meta
        # feature says so by a flag, without a device object made for each.
        flag = _ON_ITS_KIND.get(device.type)
        features = map(_feature_of, items)
        if all(map(flag, features)) if flag is not None else set(map(_device_of, features)) == {device}:
            return
    except AttributeError:
        pass  # an item without a feature, or a feature without a device: looked at one by one
    for item in items:
        feature = getattr(item, "feature", None)
        if hasattr(feature, "to") and hasattr(feature, "device") and feature.device != device:
            item.feature = feature.to(device, non_blocking=True)


_feature_of, _device_of = attrgetter("feature"), attrgetter("device")
_ON_ITS_KIND = {"cpu": attrgetter("is_cpu"), "meta": attrgetter("is_meta")}  # devices one of their kind


def batch_items(plan: StepPlan, batch: Sequence[int]) -> list[Any]:
    """The items one encoder call receives: each source's items, in source order."""
    if not plan.multi_items:
        return list(map(plan.first_items.__getitem__, batch))
    return [item for s in batch for item in plan.items_of(s)]


def encode_misses(plan: StepPlan, encoders: Encoders, *, device: Any = None, move_features: bool = False,
                  written: set | None = None) -> list[tuple[Encoder, Any]]:
    """Call the encoder once per encoder batch of ``plan``; returns ``(encoder, raw output)``
    per batch, in batch order. Nothing is checked or cached here, but a step of several
    calls makes sure no call's output overwrote an earlier one's (see ``_CallOutputs``);
    ``written`` then receives the memory every call's output came in (``storage_id``
    values), which the returned outputs, copies some of them, may no longer show."""
    calls = _CallOutputs(written) if len(plan.encoder_batches) > 1 else None
    outputs = []
    for modality, batch in plan.encoder_batches:
        encoder = resolve_encoder(encoders, modality, plan.requests[batch[0]], move_features=move_features)
        items = batch_items(plan, batch)
        if encoder.move_features and device is not None:
            move_features_to(items, device)
        outputs.append((encoder, encoder(items)))
        if calls is not None:
            calls.settle(outputs, items)
    return outputs


class _CallOutputs:
    """Where the outputs of a step's encoder calls live, so that an encoder writing every
    call into one reused buffer cannot overwrite the rows of its earlier calls before they
    are checked and cached (the rows would come back as the last call's, silently). Once a
    call's output lands in the memory of an earlier one, the outputs still intact are
    copied, the overwritten calls are run again (each copied at once) and every later call
    is copied as it returns. A step of one call needs none of this: the cache notices a
    reused buffer across steps."""

    def __init__(self, written: set | None) -> None:
        self.owner: dict[tuple, int] = {}  # storage -> the call whose output is in it
        self.written = set() if written is None else written
        self.items: list[list] = []
        self.copying = False

    def settle(self, outputs: list[tuple[Encoder, Any]], items: list) -> None:
        call = len(outputs) - 1
        self.items.append(items)
        encoder, output = outputs[call]
        storages = written_memory(output)
        self.written.update(storages)
        if self.copying:
            outputs[call] = (encoder, _copied(output))
            return
        overwritten = {self.owner[s] for s in storages if s in self.owner}
        if not overwritten:
            self.owner.update(dict.fromkeys(storages, call))
            return
        self.copying = True
        outputs[call] = (encoder, _copied(output))
        for earlier in range(call):
            if earlier not in overwritten:
                outputs[earlier] = (outputs[earlier][0], _copied(outputs[earlier][1]))
        for earlier in sorted(overwritten):
            again = outputs[earlier][0]
            output = again(self.items[earlier])
            self.written.update(written_memory(output))
            outputs[earlier] = (again, _copied(output))


def written_memory(*outputs: Any) -> set:
    """The memory the tensors of encoder outputs (a tensor, a list of them, or an object with
    ``.embedding`` each) lie in, as ``storage_id`` values; none for tensors without data."""
    return {s for output in outputs for s in map(storage_id, _tensors_of(output)) if s is not None}


def _tensors_of(output: Any) -> list[Any]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    embedding = getattr(output, "embedding", None)
    return [embedding] if isinstance(embedding, torch.Tensor) else []


def _copied(output: Any) -> Any:
    """``output`` with its tensors copied into memory of their own (what else it is, the
    checks that follow say)."""
    if isinstance(output, torch.Tensor):
        return output.clone()
    if isinstance(output, (list, tuple)):
        return [t.clone() if isinstance(t, torch.Tensor) else t for t in output]
    embedding = getattr(output, "embedding", None)
    if isinstance(embedding, torch.Tensor) and getattr(output, "num_tokens_per_frame", None) is None:
        return embedding.clone()
    return output
