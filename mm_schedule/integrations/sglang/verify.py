"""Verifying an SGLang module the stand-in does not know, where it is loaded.

``verify_module(module)`` runs two checks against the stand-in bound as the nearest known
release (``standin.use_release``) and returns what differs (``install()`` refuses the
release naming the first difference):

* ``surface_differences``: every function and class the module defines exists in the
  stand-in with the same parameters (names, kinds, defaults) or dataclass fields, and
  every name it imports exists in the stand-in;
* ``probe_differences``: the module's own ``get_embedding_and_mask`` and the stand-in's
  run on the same small CPU batch (images of several requests with a shared image and a
  chunk boundary inside one image, and a video of several spans; a per-item and a
  combined encoder output) give equal rows, mask and ``input_ids``, encode the same
  items and leave the same cache keys. The module's cache global is restored afterwards.

Both take well under a second.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

# Imported by SGLang's module for its own annotations and decorators, not its surface.
_HELPER_MODULES = frozenset({"typing", "dataclasses", "collections.abc", "abc", "enum", "functools"})
_PROBE_CACHE_BYTES = 1 << 24
_HIDDEN = 4


def verify_module(module: types.ModuleType) -> tuple[list[str], str]:
    """``(differences, summary)`` of ``module`` against the stand-in (already bound to
    the nearest known release): the first check's differences if any, else the
    probe's; the summary says what agreed, for the log."""
    from . import standin

    problems = surface_differences(module, standin) or probe_differences(module, standin)
    extra = sorted(n for n in _surface(standin) if n not in vars(module))
    return problems, (f"{len(_surface(module))} names and their parameters agree, and its get_embedding_and_mask"
                      " gave the stand-in's rows, mask and cache on the probe"
                      + (f"; stand-in only: {', '.join(extra)}" if extra else ""))


# -- names and parameters -----------------------------------------------------------------------


def _surface(module: types.ModuleType) -> dict[str, Any]:
    """The module's functions and classes (its own and those it imports), by name."""
    found = {}
    for name, value in vars(module).items():
        if name.startswith("__") or isinstance(value, types.ModuleType):
            continue
        if not (callable(value) or isinstance(value, type)):
            continue
        if getattr(value, "__module__", None) in _HELPER_MODULES:
            continue
        found[name] = value
    return found


def _shape(value: Any) -> Any:
    if isinstance(value, type):
        if dataclasses.is_dataclass(value):
            return ("fields", tuple(f.name for f in dataclasses.fields(value)))
        return ("class",)
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return ("callable",)
    return ("function", tuple((p.name, p.kind.name, _default(p.default)) for p in signature.parameters.values()))


def _without_additions(mine: Any, theirs: Any) -> Any:
    """``mine`` less the stand-in's own keyword-only parameters with defaults (such as the
    declared cache layouts): every call the engine's signature allows is unchanged by them."""
    if mine[0] != "function" or theirs[0] != "function":
        return mine
    names = {p for p, _, _ in theirs[1]}
    return ("function", tuple(p for p in mine[1]
                              if p[0] in names or p[1] != "KEYWORD_ONLY" or p[2] == "<required>"))


def _default(value: Any) -> Any:
    if value is inspect.Parameter.empty:
        return "<required>"
    return value if isinstance(value, (int, float, str, bool, type(None))) else type(value).__name__


def _describe(name: str, shape: Any) -> str:
    if shape[0] == "function":
        params = ", ".join(p if d == "<required>" else f"{p}={d!r}" for p, _, d in shape[1])
        return f"{name}({params})"
    if shape[0] == "fields":
        return f"{name} with fields {', '.join(shape[1])}"
    return name


def surface_differences(module: types.ModuleType, standin: types.ModuleType) -> list[str]:
    """What ``module`` has that the stand-in lacks or has with other parameters."""
    ours = vars(standin)
    problems = []
    for name, value in _surface(module).items():
        if name not in ours:
            problems.append(f"it has {name}, which the stand-in lacks")
            continue
        if getattr(value, "__module__", None) != module.__name__:
            continue  # imported from elsewhere in SGLang: present is what the module's code needs
        theirs, mine = _shape(value), _without_additions(_shape(ours[name]), _shape(value))
        if theirs[0] == "callable" or mine[0] == "callable" or theirs == mine:
            continue
        if theirs[0] == "class" and mine[0] in ("class", "fields"):
            continue
        problems.append(f"{_describe(name, theirs)} where the stand-in has {_describe(name, mine)}")
    return problems


# -- the behavioural probe ----------------------------------------------------------------------


@dataclasses.dataclass
class ProbeItem:
    """The fields of SGLang's ``MultimodalDataItem`` that ``get_embedding_and_mask`` reads."""

    hash: int
    offsets: list
    pad_value: int
    feature: Any = None
    precomputed_embeddings: Any = None
    modality: str = "IMAGE"
    model_specific_data: dict = dataclasses.field(default_factory=dict)

    def is_audio(self) -> bool:
        return False

    def is_video(self) -> bool:
        return False

    def can_defer_cuda_ipc_feature_reconstruction(self) -> bool:
        return False

    def acknowledge_deferred_cuda_ipc_feature(self, consumer_count: int = 1) -> None:
        return None

    def padding_values(self) -> tuple:
        return (self.pad_value,)


def _probe_steps() -> list[dict[str, Any]]:
    """Keyword arguments of ``get_embedding_and_mask`` for the probe's steps (fresh items each call)."""
    import torch

    pad, text = 7, 1
    # (item hash, spans) per request, its length, chunk prefix and extend. Request 0's
    # chunk ends inside image 102; request 1 shares image 101 (same length); request 2
    # is a video of two spans (the per-request path, under the combined key).
    layouts = [
        ([(101, [(2, 5)]), (102, [(8, 9)])], 12, 0, 9),
        ([(101, [(1, 4)]), (103, [(6, 8)])], 10, 0, 10),
        ([(104, [(1, 2), (4, 6)])], 8, 0, 8),
    ]
    steps = []
    for chosen in ([0, 1], [2]):
        items, sizes, prefixes, extends, offsets, tokens = [], [0], [], [], [], []
        for r in chosen:
            spec, length, prefix, extend = layouts[r]
            ids = [text] * length
            request_items = []
            for h, spans in spec:
                for s, e in spans:
                    ids[s: e + 1] = [pad] * (e - s + 1)
                request_items.append((h, spans))
            items.append(request_items)
            sizes.append(sizes[-1] + len(request_items))
            prefixes.append(prefix)
            extends.append(extend)
            offsets.append([span for _, spans in request_items for span in spans])
            tokens += ids[prefix: prefix + extend]
        steps.append(dict(items=items, items_size=sizes, prefix_length=prefixes, extend_length=extends,
                          items_offset_list=offsets, input_ids=torch.tensor(tokens), pad=pad))
    return steps


def _call(func, step, encoder) -> tuple[Any, list]:
    import torch

    items = [ProbeItem(hash=h, offsets=list(spans), pad_value=step["pad"], feature=torch.zeros(1))
             for request in step["items"] for h, spans in request]
    calls: list[list[int]] = []

    def recording(batch):
        calls.append(sorted(item.hash for item in batch))
        return encoder(batch)

    out = func(recording, items, torch.tensor([step["pad"]]), step["input_ids"].clone(), list(step["items_size"]),
               list(step["prefix_length"]), list(step["extend_length"]), [list(o) for o in step["items_offset_list"]])
    return out, sorted(h for call in calls for h in call)


def _rows(item) -> Any:
    import torch

    gen = torch.Generator().manual_seed(item.hash)
    return torch.randn(sum(e - s + 1 for s, e in item.offsets), _HIDDEN, generator=gen)


def _per_item(items):
    return [_rows(item) for item in items]


def _combined(items):
    import torch

    return torch.cat([_rows(item) for item in items])


def probe_differences(module: types.ModuleType, standin: types.ModuleType) -> list[str]:
    """Where ``module``'s ``get_embedding_and_mask`` and the stand-in's disagree on the probe."""
    import torch

    theirs_func = getattr(module, "get_embedding_and_mask", None)
    init = getattr(module, "init_mm_embedding_cache", None)
    if theirs_func is None or init is None:
        return ["it lacks get_embedding_and_mask or init_mm_embedding_cache"]
    saved_theirs = vars(module).get("embedding_cache")
    saved_ours = standin.embedding_cache
    keys = [101, 102, 103, 104, standin.MultiModalStaticCache.combine_hashes([104])]
    problems = []
    try:
        for encoder in (_per_item, _combined):
            init(_PROBE_CACHE_BYTES)
            standin.init_mm_embedding_cache(_PROBE_CACHE_BYTES)
            for n, step in enumerate(_probe_steps()):
                where = f"probe step {n} ({encoder.__name__.strip('_').replace('_', '-')} encoder output)"
                try:
                    (a_rows, a_mask, a_ids), a_calls = _call(theirs_func, step, encoder)
                except Exception as exc:  # the module's own code refused the probe
                    return [f"its get_embedding_and_mask raised {type(exc).__name__}: {exc} on {where}"]
                (b_rows, b_mask, b_ids), b_calls = _call(standin.get_embedding_and_mask, step, encoder)
                if not (_same(a_rows, b_rows) and _same(a_mask, b_mask) and torch.equal(a_ids, b_ids)):
                    problems.append(f"{where}: get_embedding_and_mask returned other rows, mask or input_ids")
                if a_calls != b_calls:
                    problems.append(f"{where}: it encoded items {a_calls}, the stand-in {b_calls}")
                cache = vars(module).get("embedding_cache")
                kept = [k for k in keys if cache is not None and cache.has(k)]
                ours = [k for k in keys if standin.embedding_cache.has(k)]
                if kept != ours:
                    problems.append(f"{where}: its cache holds keys {kept}, the stand-in's {ours}")
    finally:
        module.embedding_cache = saved_theirs
        standin.embedding_cache = saved_ours
    return problems


def _same(a: Any, b: Any) -> bool:
    import torch

    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
