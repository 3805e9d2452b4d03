"""``install()`` / ``uninstall()``: run a loaded SGLang's multimodal scheduling on mm_schedule.

``install()`` puts the stand-in at ``sys.modules["sglang.srt.managers.mm_schedule"]`` (and
as the ``mm_schedule`` attribute of ``sglang.srt.managers``), then scans every loaded
module for names bound at import to an object SGLang's module defined
(``mm_utils.get_embedding_and_mask``, ``kv_cache_builder.init_mm_embedding_cache``, a
fork's own ``from ... import``) and rebinds each to the stand-in's object of that name.
An embedding cache SGLang already made is replaced by one of the same size. The step
context (ranks, process group) is read from SGLang's parallel state on the first step.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from ...errors import MMScheduleError
from .versions import MATCHED

MODULE = "sglang.srt.managers.mm_schedule"
log = logging.getLogger(__name__)


class UnsupportedSGLangVersion(MMScheduleError, RuntimeError):
    """The loaded SGLang is a release the stand-in does not match."""


@dataclass
class InstallReport:
    version: str
    replaced_module: bool
    rebound: list[str] = field(default_factory=list)  # "module.name" entries
    cache_size: int | None = None  # capacity of the cache carried over, if SGLang had one


_state: dict[str, Any] = {}


def installed() -> bool:
    return bool(_state)


def sglang_version() -> str | None:
    """The version of the SGLang loaded in this process (or installed, when not loaded)."""
    loaded = sys.modules.get("sglang")
    version = getattr(loaded, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def install(*, version: str | None = None) -> InstallReport:
    """Replace SGLang's ``mm_schedule`` in this process; a second call changes nothing.

    ``version`` overrides the detected SGLang version (for an SGLang build whose
    metadata lies); an unmatched version raises ``UnsupportedSGLangVersion``."""
    if _state:
        return _state["report"]
    found = version or sglang_version()
    if found not in MATCHED:
        raise UnsupportedSGLangVersion(
            f"SGLang {found or '(not found)'} is not a release mm_schedule's stand-in matches"
            f" (matched: {', '.join(MATCHED)}); see docs/sglang.md for what newer releases changed"
        )
    from . import standin

    original = sys.modules.get(MODULE)
    report = InstallReport(version=found, replaced_module=original is not None)
    rebinds: list[tuple[types.ModuleType, str, Any]] = []
    if original is not None:
        by_id = _defined_objects(original, standin)
        for module in list(sys.modules.values()):
            if module is original or module is standin or not isinstance(module, types.ModuleType):
                continue
            namespace = getattr(module, "__dict__", None) or {}
            for attr, value in list(namespace.items()):
                name = by_id.get(id(value))
                if name is not None:
                    rebinds.append((module, attr, value))
                    setattr(module, attr, getattr(standin, name))
                    report.rebound.append(f"{module.__name__}.{attr}")
        old_cache = getattr(original, "embedding_cache", None)
        if old_cache is not None:
            report.cache_size = int(getattr(old_cache, "max_size", 0))
            standin.init_mm_embedding_cache(report.cache_size)
    package = sys.modules.get(MODULE.rpartition(".")[0])
    had_attr = package is not None and hasattr(package, "mm_schedule")
    old_attr = getattr(package, "mm_schedule", None) if package is not None else None
    sys.modules[MODULE] = standin
    if package is not None:
        package.mm_schedule = standin
    standin._context_source = _context_from_sglang
    _state.update(report=report, original=original, rebinds=rebinds, package=package,
                  had_attr=had_attr, old_attr=old_attr)
    log.info(
        "mm_schedule replaced %s (SGLang %s)%s; rebound %d names: %s", MODULE, found,
        "" if original is not None else " before it was imported", len(report.rebound),
        ", ".join(report.rebound) or "none",
    )
    return report


def uninstall() -> bool:
    """Undo ``install()``: SGLang's own module and every rebound name come back. Returns
    False when nothing was installed."""
    if not _state:
        return False
    from . import standin

    for module, attr, value in reversed(_state["rebinds"]):
        setattr(module, attr, value)
    original, package = _state["original"], _state["package"]
    if original is not None:
        sys.modules[MODULE] = original
    else:
        sys.modules.pop(MODULE, None)
    if package is not None:
        if _state["had_attr"]:
            package.mm_schedule = _state["old_attr"]
        elif hasattr(package, "mm_schedule"):
            delattr(package, "mm_schedule")
    standin._context_source = None
    standin.set_step_context(None)
    _state.clear()
    log.info("mm_schedule restored SGLang's own %s", MODULE)
    return True


def _defined_objects(original: types.ModuleType, standin: types.ModuleType) -> dict[int, str]:
    """id -> name of every function and class SGLang's module defined itself (imported
    names such as ``torch`` or ``logger`` are shared with everything and never rebound)."""
    found = {}
    for name, value in vars(original).items():
        if name.startswith("__") or not hasattr(standin, name):
            continue
        defined_here = getattr(value, "__module__", None) == original.__name__
        if defined_here and (isinstance(value, type) or callable(value)):
            found[id(value)] = name
    alias = vars(original).get("DataEmbeddingFunc")
    if alias is not None:
        found[id(alias)] = "DataEmbeddingFunc"
    return found


def _context_from_sglang() -> Any:
    """The step context of this rank, from SGLang's parallel state: its ranks, and with
    more than one attention-TP rank that group (its CPU group for agreement, its device
    group for rows). Read once, on the first step, when SGLang has set it up."""
    from . import _core, standin

    runtime = sys.modules.get("sglang.srt.runtime_context")
    parallel = runtime.get_parallel() if runtime is not None else None
    ranks = _core.ParallelContext(
        attn_tp_rank=int(getattr(parallel, "attn_tp_rank", 0)),
        attn_tp_size=int(getattr(parallel, "attn_tp_size", 1)),
        tp_size=int(getattr(parallel, "tp_size", 1)),
    )
    group = rows_group = None
    if ranks.attn_tp_size > 1:
        coordinator = _attention_tp_group(ranks)
        group = getattr(coordinator, "cpu_group", None)
        rows_group = getattr(coordinator, "device_group", None)
        if group is None:
            raise UnsupportedSGLangVersion(
                f"SGLang runs {ranks.attn_tp_size} attention-TP ranks but its group coordinator has no cpu_group"
            )
    context = _core.StepContext(parallel=ranks, group=group, rows_group=rows_group)
    standin.set_step_context(context)
    return context


def _attention_tp_group(ranks: Any) -> Any:
    if ranks.attn_tp_size != ranks.tp_size:
        from sglang.srt.layers.dp_attention import get_attention_tp_group

        return get_attention_tp_group()
    from sglang.srt.distributed.parallel_state import get_tp_group

    return get_tp_group()
