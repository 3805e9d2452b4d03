"""Checking every tensor a step will use, before anything is cached or assembled.

What a step needs from every source: a floating tensor of rank >= 2 whose rows (all
dims but the last) are the item's placeholder count, whose last dim is the step's
hidden size, on the step's device, not a meta tensor. The hidden size comes from
``input_embeds`` in fused mode and otherwise from the step's other sources (hits,
precomputed embeddings, what the cache holds or was declared to hold for the
modality, the encoder outputs' most common size); the device from ``input_embeds``,
the caller's ``device``, or else the first source. Encoder outputs that fail raise a
typed error naming the request and the item hash; a step that raises has inserted
nothing. Nothing here calls the cache: a cached entry found unfit is named in
``Expected.evict`` and the step evicts it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import itemgetter, methodcaller
from typing import Any

import torch

from .cache import owns_storage, storage_id
from .encode import Encoder
from .errors import (
    CachedEmbeddingError,
    CacheLayoutError,
    EmbeddingLengthMismatch,
    EncoderOutputError,
)
from .plan import HIT, PRECOMPUTED, StepPlan
from .plan.columns import counting

try:
    from ._output_checks import plain_outputs as _plain_outputs
except ImportError:  # installed without a C compiler: the Python checks answer alone
    _plain_outputs = None

_FROM_HITS = "this step's cached entries"
_second = itemgetter(1)


class Expected:
    """The hidden size, device and source dtypes of a step, learned as sources are checked.

    ``known``: ``modality -> (hidden, dtype)`` the cache holds (or was declared to hold)
    and that binds the step (declared, or learned and confirmed), each None where unknown;
    ``weak``: learned layouts nothing confirmed yet, which bind no output but name the odd
    one out of a batch at odds with itself; ``hidden_from`` says what fixed ``hidden`` (for
    messages); ``evict``: keys of cached entries found unfit, for the step to evict;
    ``dispute``: set when the step is refused because its outputs disagree with its own
    hits of a weak layout: ``(modalities, (hidden, dtype))`` of those outputs, which the
    step reports to the cache (``EmbeddingCache.note_dispute``).
    ``owned_storages``: set by ``check_outputs`` when every encoder output is cached as
    it came (alone in its storage, nothing copied): each one's ``storage_id``, in the
    order of the sources encoded (none listed on ``meta``); None otherwise.
    ``source_addresses``: then, when the step encoded every source, in source order, the
    address of each one's first row (0 on ``meta``), as ``StepPlan.addresses`` gives a
    step of hits: what copying them needs on a GPU, without reading a tensor."""

    __slots__ = ("device", "dispute", "disputes", "dtypes", "evict", "hidden", "hidden_from", "known", "owned_storages",
                 "proven", "source_addresses", "sources", "unvouched", "weak", "weak_hits")

    def __init__(self, hidden: int | None, device: Any, hidden_from: str = "input_embeds") -> None:
        self.hidden = hidden
        self.hidden_from = hidden_from if hidden is not None else ""
        # The step's hidden size is a fact (``input_embeds`` of that size), not a guess.
        self.proven = hidden is not None and hidden_from == "input_embeds"
        self.device = device
        self.dtypes: set = set()
        self.known: dict[str, tuple] = {}
        self.weak: dict[str, tuple] = {}
        self.sources: dict[str, str] = {}
        self.evict: list[int] = []
        self.unvouched: list[int] = []
        self.weak_hits: dict[str, list[int]] = {}
        self.disputes: frozenset = frozenset()
        self.dispute: tuple | None = None
        self.owned_storages: list | None = None
        self.source_addresses: list | None = None

    def learn_cache_layouts(self, known: dict[str, tuple], unvouched: list[int], sources: dict[str, str], *,
                            weak: dict[str, tuple] | None = None, weak_hits: dict[str, list[int]] | None = None,
                            disputes: frozenset = frozenset()) -> None:
        """What the cache holds per modality; fixes the step's hidden size when nothing
        else has and the binding layouts agree on one. ``unvouched``: the step's hits of
        modalities the cache knows no layout for (entries ``set`` without one): when
        they fixed the hidden size and an output disagrees, either side may be wrong,
        so they are evicted with the error rather than fail every later step.
        ``weak_hits``: the step's hits of ``weak`` layouts, per modality; ``disputes``:
        layouts earlier steps' outputs brought against such hits (``EmbeddingCache.disputes``)."""
        self.known = known
        self.sources = sources
        self.unvouched = unvouched
        self.weak = weak or {}
        self.weak_hits = weak_hits or {}
        self.disputes = disputes
        if self.hidden is None:
            sizes = {hidden for hidden, _ in known.values() if hidden is not None}
            if len(sizes) == 1:
                self.hidden = sizes.pop()
                self.hidden_from = "; ".join(
                    sources.get(m, f"what the cache holds for {m}") for m, (h, _) in known.items() if h == self.hidden)


def _weak_hits_disagree(expected: Expected, modalities: list[str], layout: tuple) -> tuple[str, bool]:
    """An output of ``layout`` disagrees with the step's own hits of the unconfirmed learned
    layouts of ``modalities``. Either side may be the faulty one: the first such step is
    refused with nothing evicted and reports the dispute; a later one bringing the same
    layout against them wins (the hits are evicted, and the step may be planned again).
    Returns the error's note and whether the hits were evicted."""
    if layout in expected.disputes:
        for modality in modalities:
            expected.evict.extend(expected.weak_hits.get(modality, ()))
        return (" (what this step's cached entries hold, a layout learned from fewer than three inserts that an"
                " earlier step's outputs disputed too; they were evicted)"), True
    expected.dispute = (tuple(modalities), layout)
    return (" (what this step's cached entries hold, a layout learned from fewer than three inserts and not yet"
            f" confirmed; nothing was evicted, and a later step whose outputs bring hidden size {layout[0]} and"
            f" dtype {layout[1]} against them replaces it)"), False


def _check_weak(plan: StepPlan, s: int, piece: Any, expected: Expected) -> None:
    """``piece`` (source ``s``'s output) against the step's own hits of its modality's
    unconfirmed learned layout, when there are any (see ``_weak_hits_disagree``)."""
    modality = plan.modalities[s]
    weak = expected.weak.get(modality)
    if weak is None or not expected.weak_hits.get(modality):
        return
    layout = (piece.shape[-1], piece.dtype)
    if (weak[0] is None or layout[0] == weak[0]) and (weak[1] is None or layout[1] == weak[1]):
        return
    note, evicted = _weak_hits_disagree(expected, [modality], layout)
    error = EncoderOutputError(
        f"{_labels(plan, [s])}: the encoder output has hidden size {layout[0]} and dtype {layout[1]}, expected"
        f" hidden size {weak[0]} and dtype {weak[1]}{note}")
    error.hits_evicted = evicted
    raise error


def _labels(plan: StepPlan, sources: Sequence[int]) -> str:
    parts = []
    for s in sources[:8]:
        for item in plan.items_of(s):
            parts.append(f"request {plan.requests[s]} item hash {_hash_of(item)}")
    return ", ".join(parts[:8]) + (" ..." if len(parts) > 8 or len(sources) > 8 else "")


def _hash_of(item: Any) -> Any:
    return getattr(item, "hash", None)


def check_tensor(t: Any, expected: Expected, where: str, what: str) -> Any:
    """``t`` as a 2-D ``[rows, H]`` tensor if it is what the step needs, else ``EncoderOutputError``."""
    if not isinstance(t, torch.Tensor):
        raise EncoderOutputError(f"{where}: {what} is a {type(t).__name__}; expected a tensor")
    if not t.is_floating_point():
        raise EncoderOutputError(f"{where}: {what} has dtype {t.dtype}; embeddings must be floating point")
    if t.is_meta and not _is_meta(expected.device):
        raise EncoderOutputError(f"{where}: {what} is a meta tensor (it has no data)")
    if t.dim() < 2:
        raise EncoderOutputError(f"{where}: {what} must have rank >= 2 ([rows, hidden]), got shape {tuple(t.shape)}")
    if expected.device is None:
        expected.device = t.device
    elif t.device != expected.device:
        raise EncoderOutputError(
            f"{where}: {what} is on {t.device}, the step runs on {expected.device}; return it on {expected.device}"
        )
    hidden = t.shape[-1]
    if expected.hidden is None:
        expected.hidden = hidden
        expected.hidden_from = f"{where}, the step's first source of a known size"
    elif hidden != expected.hidden:
        note, evicted = f" ({expected.hidden_from})" if expected.hidden_from else "", False
        if expected.hidden_from == _FROM_HITS and expected.unvouched:
            expected.evict.extend(expected.unvouched)
            note, evicted = " (the hidden size of this step's cached entries, which no declared or learned layout" \
                " vouches for; they were evicted)", True
        elif expected.hidden_from == _FROM_HITS and expected.weak_hits:
            note, evicted = _weak_hits_disagree(expected, list(expected.weak_hits), (hidden, t.dtype))
        error = EncoderOutputError(f"{where}: {what} has hidden size {hidden}, expected {expected.hidden}{note}")
        error.hits_evicted = evicted  # the step may be planned again: those hits are misses now
        raise error
    expected.dtypes.add(t.dtype)
    if t.requires_grad:
        t = t.detach()  # inference path: the cache must never keep an autograd graph alive
    return t if t.dim() == 2 else t.reshape(-1, hidden)


def check_sources(plan: StepPlan, expected: Expected) -> Sequence[Any]:
    """The step's source tensors with its hits and precomputed embeddings checked
    (misses are still None)."""
    tensors = check_hits(plan, expected)
    if not plan.all_hits and PRECOMPUTED in plan.kinds:
        tensors = list(tensors)
        check_precomputed(plan, tensors, expected)
    return tensors


def check_hits(plan: StepPlan, expected: Expected) -> Sequence[Any]:
    """The step's source tensors with hits checked (and moved to the step's device when
    the cache keeps them elsewhere); ``plan.tensors`` itself when nothing had to change.
    A hit that cannot serve the step is named in ``expected.evict`` and raises
    ``CachedEmbeddingError``."""
    tensors = plan.tensors
    if not plan.has_hits:
        return tensors
    layout = plan.cache_layout
    if layout is not None:
        hidden, dtype, device = layout
        if _fits(hidden, dtype, expected) and (expected.device is None or device == expected.device):
            _learn(expected, hidden, dtype, device)
            return tensors
    tensors = list(tensors)
    for i, kind in enumerate(plan.kinds):
        if kind is not HIT:
            continue
        t = tensors[i]
        hidden, dtype, device = t.shape[1], t.dtype, t.device
        if not _fits(hidden, dtype, expected) or (device.type == "meta") != _is_meta(expected.device):
            expected.evict.append(plan.keys[i])
            want = f"hidden size {expected.hidden}" if expected.hidden is not None else "a floating dtype"
            error = CachedEmbeddingError(
                f"{_labels(plan, [i])}: the cached embedding has hidden size {hidden} and dtype {dtype}"
                f" on {device}, the step needs {want}; the entry was evicted and will be encoded again"
            )
            error.before_encoding = True  # nothing encoded or cached yet: the step may be planned again
            raise error
        if expected.device is not None and device != expected.device:
            tensors[i] = t.to(expected.device, non_blocking=True)
        _learn(expected, hidden, dtype, device if expected.device is None else expected.device)
    return tensors


def _is_meta(device: Any) -> bool:
    return device is not None and device.type == "meta"


def _fits(hidden: int, dtype: Any, expected: Expected) -> bool:
    return dtype.is_floating_point and (expected.hidden is None or hidden == expected.hidden)


def _learn(expected: Expected, hidden: int, dtype: Any, device: Any) -> None:
    if expected.hidden is None:
        expected.hidden = hidden
        expected.hidden_from = _FROM_HITS
    if expected.device is None:
        expected.device = device
    expected.dtypes.add(dtype)


def plain_rows(t: Any) -> Any:
    """``t`` contiguous and not a negated view: rows the assembly may copy as bytes."""
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def check_precomputed(plan: StepPlan, tensors: list[Any], expected: Expected) -> None:
    """Precomputed embeddings: same checks as encoder outputs (they may live elsewhere:
    they are moved to the step's device, and never cached)."""
    for i, kind in enumerate(plan.kinds):
        if kind is not PRECOMPUTED:
            continue
        where = _labels(plan, [i])
        t = tensors[i]
        device = expected.device
        if device is not None and getattr(t, "device", device) != device and hasattr(t, "to"):
            t = t.to(device, non_blocking=True)
        flat = check_tensor(t, expected, where, "the precomputed embedding")
        if flat.shape[0] != plan.rows[i]:
            raise EmbeddingLengthMismatch(
                expected=plan.rows[i], received=flat.shape[0], request=plan.requests[i],
                item_hash=_hash_of(plan.first_items[i]), what="precomputed embedding rows",
            )
        tensors[i] = plain_rows(flat)


def check_outputs(plan: StepPlan, outputs: Sequence[tuple[Encoder, Any]], tensors: list[Any],
                  expected: Expected, written: set = frozenset()) -> list[int]:
    """Validate every encoder output and store each miss's 2-D rows in ``tensors``.
    Returns the sources that were encoded. Raises before the caller inserts anything.
    ``written``: memory the step's encoder calls returned outputs in, besides what
    ``outputs`` show (``encode_misses``); a hit there was overwritten too."""
    encoded = []
    owned: list | None = []  # storage of every output cached as it came, while all are
    hit_storages = _hit_storages(plan)
    if written and hit_storages and not written.isdisjoint(hit_storages):
        _overwritten_hit(plan, hit_storages[next(s for s in hit_storages if s in written)],
                         "the output of one of this step's encoder calls", expected)
    for (_, batch), (encoder, output) in zip(plan.encoder_batches, outputs):
        whole = len(batch) == 1 and batch[0] in plan.multi_items
        item_rows = list(plan.item_rows_of(batch[0])) if whole else list(map(plan.rows.__getitem__, batch))
        if not isinstance(output, (torch.Tensor, list, tuple)) and hasattr(output, "embedding"):
            if getattr(output, "num_tokens_per_frame", None) is not None:
                # Pruned video rows belong to moved placeholders; placing them at the
                # processor's positions would be silently wrong.
                raise EncoderOutputError(
                    f"{_labels(plan, batch)}: the encoder pruned video tokens (EVS, num_tokens_per_frame),"
                    " which moves placeholders in input_ids; only get_embedding_and_mask handles that,"
                    " for a video item carrying pre_chunked_input_ids"
                )
            output = output.embedding
        storages = None  # each output's storage, when all are plain (``_plain_list``)
        if isinstance(output, (list, tuple)):
            if not whole and not hit_storages and not encoder.copy_outputs:
                storages = _plain_list(output, item_rows, expected)
            if storages is not None:
                pieces, uniform = output if type(output) is list else list(output), True
            else:
                pieces, uniform = _check_list(plan, batch, whole, output, item_rows, expected)
            if whole:
                pieces = [pieces[0] if len(pieces) == 1 else torch.cat(pieces)]
        elif isinstance(output, torch.Tensor):
            pieces, uniform = _check_combined(plan, batch, whole, output, item_rows, expected), True
        else:
            raise EncoderOutputError(
                f"{_labels(plan, batch)}: encoder returned {type(output).__name__}; expected a tensor or a list of tensors"
            )
        encoded.extend(batch)
        if storages is not None or (uniform and not hit_storages and not encoder.copy_outputs and _plain(pieces)):
            # One layout for the whole batch (a list every tensor of which passed as it is, or
            # one tensor's rows): checked against the modality's layout once, stored as they are.
            known = expected.known.get(plan.modalities[batch[0]])
            if known is not None:
                _check_known(plan, batch[0], pieces[0], known, expected.sources.get(plan.modalities[batch[0]], ""))
            if expected.weak_hits:
                _check_weak(plan, batch[0], pieces[0], expected)
            for s, piece in zip(batch, pieces):
                tensors[s] = piece
            if storages is None or owned is None:
                owned = None
            else:
                owned.extend(storages)
            continue
        owned = None
        for s, piece in zip(batch, pieces):
            known = expected.known.get(plan.modalities[s])
            if known is not None:
                _check_known(plan, s, piece, known, expected.sources.get(plan.modalities[s], ""))
            if expected.weak_hits:
                _check_weak(plan, s, piece, expected)
            if hit_storages and storage_id(piece) in hit_storages:
                _overwritten_hit(plan, hit_storages[storage_id(piece)], f"the encoder's output for {_labels(plan, [s])}",
                                 expected)
            if encoder.copy_outputs and owns_storage(piece):
                piece = piece.clone()
            tensors[s] = plain_rows(piece)
    expected.owned_storages = owned
    if owned is not None and encoded == counting(len(plan.rows)):
        # Every source encoded, in order, each output alone in its storage (so at offset 0).
        if owned:
            expected.source_addresses = list(map(_second, owned))
        elif _is_meta(expected.device):
            expected.source_addresses = [0] * len(encoded)
    return encoded


def _plain_list(output: Any, item_rows: list[int], expected: Expected) -> list | None:
    """The storage of each tensor of ``output`` (none listed on ``meta``) when every one is
    fit to be checked and cached as it is: what ``_uniform_list`` accepts, besides contiguous,
    not a negated view and alone in its storage. One C pass (``_output_checks.c``); None when
    any tensor is not, or without the C helper (the caller's checks then decide)."""
    if _plain_outputs is None or type(output) is not list or len(output) != len(item_rows):
        return None
    found = _plain_outputs(output, item_rows, expected.hidden, expected.device, torch.Tensor)
    if found is None:
        return None
    dtype, hidden, device, storages = found
    _learn(expected, hidden, dtype, device)
    return () if storages is None else storages


_negated, _contiguous = methodcaller("is_neg"), methodcaller("is_contiguous")


def _plain(pieces: Sequence[Any]) -> bool:
    """Every piece already what ``plain_rows`` returns (no copy needed), tested in C loops."""
    return not any(map(_negated, pieces)) and all(map(_contiguous, pieces))


def _hit_storages(plan: StepPlan) -> dict:
    """Storage of each of the step's hits: an encoder output in one of them overwrote it."""
    if not plan.has_hits:
        return {}
    return {storage_id(t): i for i, (kind, t) in enumerate(zip(plan.kinds, plan.tensors))
            if kind is HIT and not t.is_meta}


def _overwritten_hit(plan: StepPlan, hit: int, writer: str, expected: Expected) -> None:
    """Hit source ``hit`` lost its rows to an encoder output (``writer`` says whose): evicted, refused."""
    expected.evict.append(plan.keys[hit])
    raise CachedEmbeddingError(
        f"{_labels(plan, [hit])}: {writer} was written into the storage of this cached embedding (the encoder"
        " reuses its output buffer), so the entry no longer holds its rows; it was evicted and will be encoded"
        " again. Wrap the encoder as Encoder(fn, copy_outputs=True)"
    )


def _check_known(plan: StepPlan, s: int, piece: Any, known: tuple, source: str) -> None:
    hidden, dtype = known
    if (hidden is not None and piece.shape[-1] != hidden) or (dtype is not None and piece.dtype != dtype):
        modality = plan.modalities[s]
        raise CacheLayoutError(
            f"{_labels(plan, [s])}: the encoder output has hidden size {piece.shape[-1]} and dtype {piece.dtype};"
            f" {modality} embeddings must have hidden size {hidden} and dtype {dtype} ({source}). Nothing of this"
            " step was cached and no entry evicted (discard those entries or clear the cache if the model changed)",
            key=plan.keys[s], modality=modality, got=(piece.shape[-1], piece.dtype), expected=known,
        )


def _uniform_list(output, item_rows, expected) -> list[Any] | None:
    """``output`` when every tensor in it passes ``check_tensor`` as it is (2-D, exactly
    its item's rows, one floating dtype, the step's hidden size and device, no autograd
    graph): the common case, checked without naming each item. None when any tensor
    needs a closer look; the per-item checks then say which."""
    first = output[0] if output else None
    if type(first) is not torch.Tensor or first.dim() != 2:
        return None
    dtype, device = first.dtype, first.device
    hidden = first.shape[1] if expected.hidden is None else expected.hidden
    if not dtype.is_floating_point or (device.type == "meta") != _is_meta(expected.device) or (
            expected.device is not None and device != expected.device):
        return None
    for t, rows in zip(output, item_rows):
        if type(t) is not torch.Tensor or t.dtype is not dtype or t.shape != (rows, hidden) or t.requires_grad \
                or t.device != device:
            return None
    _learn(expected, hidden, dtype, device)
    return list(output)


def _check_list(plan, batch, whole, output, item_rows, expected) -> list[Any]:
    if len(output) != len(item_rows):
        raise EmbeddingLengthMismatch(
            expected=len(item_rows), received=len(output), request=plan.requests[batch[0]],
            what="encoder outputs (one tensor per item)", hint=f"items: {_labels(plan, batch)}",
        )
    pieces = _uniform_list(output, item_rows, expected)
    if pieces is not None:
        return pieces, True
    if expected.hidden is None:
        # Nothing else fixes the hidden size: the outputs' most common one does, so the
        # odd output is the one named (the cache's unconfirmed layout breaks a tie).
        sizes = Counter(t.shape[-1] for t in output if getattr(t, "ndim", 0) >= 2)
        if sizes:
            hint = expected.weak.get(plan.modalities[batch[0]], (None, None))[0]
            top = sizes.most_common(1)[0][1]
            expected.hidden = hint if sizes.get(hint) == top else sizes.most_common(1)[0][0]
    items = [item for s in batch for item in plan.items_of(s)] if whole else [plan.first_items[s] for s in batch]
    requests = [plan.requests[batch[0]]] * len(items) if whole else [plan.requests[s] for s in batch]
    pieces = []
    for t, rows, item, request in zip(output, item_rows, items, requests):
        item_hash = _hash_of(item)
        flat = check_tensor(t, expected, f"request {request}, item hash {item_hash}", "the encoder output")
        if flat.shape[0] != rows:
            raise EmbeddingLengthMismatch(
                expected=rows, received=flat.shape[0], request=request, item_hash=item_hash,
                what="encoder rows for the item",
            )
        pieces.append(flat)
    return pieces, False


def _check_combined(plan, batch, whole, output, item_rows, expected) -> list[Any]:
    one = len(item_rows) == 1
    request = plan.requests[batch[0]]
    item_hash = _hash_of(plan.first_items[batch[0]]) if one else None
    where = f"request {request}, item hash {item_hash}" if one else _labels(plan, batch)
    flat = check_tensor(output, expected, where, "the encoder output")
    total = sum(item_rows)
    if flat.shape[0] != total:
        raise EmbeddingLengthMismatch(
            expected=total, received=flat.shape[0], request=request, item_hash=item_hash,
            what="encoder rows" if one else f"encoder rows for a batch of {len(item_rows)} items",
            hint="" if one else f"expected per item {item_rows[:8]} for {_labels(plan, batch)}",
        )
    if whole or one:
        return [flat]
    return list(flat.split(item_rows))
