"""``install()`` / ``uninstall()``: run a loaded SGLang's multimodal scheduling on mm_schedule.

``install()`` makes the stand-in the module of the loaded SGLang release
(``standin.use_release``), puts it at ``sys.modules["sglang.srt.managers.mm_schedule"]``
(and as the ``mm_schedule`` attribute of ``sglang.srt.managers``), then scans every loaded
module for references to SGLang's module or to an object it defined, and rebinds each
to the stand-in's object of that name: module attributes (``from ... import x``, and the
module itself, ``from sglang.srt.managers import mm_schedule``), class attributes
(plain, static and class methods), and the values of module-level dicts and lists
(registries). References it cannot rebind (inside tuples, sets or ``functools.partial``
objects) are named in the report's ``reported`` list and in the log. An embedding cache
SGLang already made is replaced by one of the same size. The step context (ranks,
process group) is read from SGLang's parallel state on the first step.

A release the stand-in does not know (newer than the newest known, or a fork's build) is
verified first (``verify``): its module's names and parameters against the stand-in as
the nearest known release, and a short probe of its own ``get_embedding_and_mask``
against the stand-in's. It installs with one warning when they agree, and is refused
(``UnsupportedSGLangVersion``, naming the first difference) otherwise.

``uninstall()`` puts back exactly what ``install()`` changed and still holds the
stand-in's object (a wrapper the engine set afterwards stays), and points modules
imported while installed back at SGLang's objects. Both calls hold one lock.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import sys
import threading
import types
import warnings
from dataclasses import dataclass, field
from typing import Any

from ...errors import MMScheduleError
from .versions import KNOWN

MODULE = "sglang.srt.managers.mm_schedule"
log = logging.getLogger(__name__)
# Modules of mm_schedule itself hold the stand-in on purpose, and never SGLang's objects;
# the interpreter's own tables (``sys.modules``) are not references a module took.
_OWN_PREFIX = "mm_schedule."
_NOT_SCANNED = frozenset({"sys", "builtins", "gc", "importlib", "importlib._bootstrap"})


class UnsupportedSGLangVersion(MMScheduleError, RuntimeError):
    """The loaded SGLang is a release the stand-in neither knows nor could verify."""


@dataclass
class InstallReport:
    version: str
    replaced_module: bool
    rebound: list[str] = field(default_factory=list)  # "module.name", "module.Class.attr", "module.registry[key]"
    reported: list[str] = field(default_factory=list)  # references found but not rebindable
    cache_size: int | None = None  # capacity of the cache carried over, if SGLang had one
    release: str = ""  # the known release whose module the stand-in is
    verified: str | None = None  # for an unknown release: what the verification compared


@dataclass
class _Change:
    """One reference install() replaced: where, what it held, what it holds now."""

    container: Any
    key: Any
    kind: str  # "attr" (setattr) or "item" (container[key])
    old: Any
    new: Any

    def current(self) -> Any:
        if self.kind == "attr":
            return self.container.__dict__.get(self.key, _MISSING)
        try:
            return self.container[self.key]
        except (IndexError, KeyError):
            return _MISSING

    def put(self, value: Any) -> None:
        if self.kind == "attr":
            setattr(self.container, self.key, value)
        else:
            self.container[self.key] = value


_MISSING = object()
_lock = threading.RLock()
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

    ``version`` overrides the detected SGLang version (for an SGLang build whose metadata
    lies). A version the stand-in does not know is verified against SGLang's module (see
    the module docstring) and refused with ``UnsupportedSGLangVersion`` when it differs."""
    with _lock:
        if _state:
            return _state["report"]
        found = version or sglang_version()
        if found is None:
            raise UnsupportedSGLangVersion("SGLang is neither loaded nor installed; nothing to replace")
        from . import standin

        previous = standin.release()
        original = sys.modules.get(MODULE)
        verified = None
        profile = standin.use_release(found)
        try:
            if found not in KNOWN:
                original = original or _import_for_verification(found)
                from . import verify

                problems, verified = verify.verify_module(original)
                if problems:
                    raise UnsupportedSGLangVersion(
                        f"SGLang {found} is not a release mm_schedule knows, and its {MODULE} differs from the"
                        f" stand-in as SGLang {profile.version}: {problems[0]}"
                        + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                    )
        except BaseException:
            standin.use_release(previous)
            raise
        report = InstallReport(version=found, replaced_module=original is not None, release=profile.version,
                               verified=verified)
        changes: list[_Change] = []
        if original is not None:
            _rebind_everywhere(original, standin, report, changes)
            old_cache = getattr(original, "embedding_cache", None)
            if old_cache is not None:
                report.cache_size = int(getattr(old_cache, "max_size", 0))
                standin.init_mm_embedding_cache(report.cache_size)
        package = sys.modules.get(MODULE.rpartition(".")[0])
        if package is not None:
            changes.append(_Change(package, "mm_schedule", "attr", package.__dict__.get("mm_schedule", _MISSING),
                                   standin))
            package.mm_schedule = standin
        sys.modules[MODULE] = standin
        standin._context_source = _context_from_sglang
        _state.update(report=report, original=original, changes=changes, package=package,
                      modules_before=set(sys.modules))
        if verified is not None:
            log.warning("SGLang %s is not a release mm_schedule knows; verified against SGLang %s's profile (%s)",
                        found, profile.version, verified)
        log.info(
            "mm_schedule replaced %s (SGLang %s)%s; rebound %d references: %s%s", MODULE, found,
            "" if original is not None else " before it was imported", len(report.rebound),
            ", ".join(report.rebound) or "none",
            f"; not rebindable, still SGLang's: {', '.join(report.reported)}" if report.reported else "",
        )
        return report


def uninstall() -> bool:
    """Undo ``install()``: every reference it replaced that still holds the stand-in's
    object gets SGLang's back, and modules imported while installed that hold the
    stand-in's objects get SGLang's. Returns False when nothing was installed."""
    with _lock:
        if not _state:
            return False
        from . import standin

        original = _state["original"]
        for change in reversed(_state["changes"]):
            if change.current() is not change.new:
                continue  # replaced again after install (an engine's wrapper): theirs now
            if change.old is _MISSING:
                if change.kind == "attr":
                    delattr(change.container, change.key)
                else:
                    del change.container[change.key]
            else:
                change.put(change.old)
        if sys.modules.get(MODULE) is standin:
            if original is not None:
                sys.modules[MODULE] = original
            else:
                sys.modules.pop(MODULE, None)
        if original is not None:
            _restore_new_modules(original, standin, _state["modules_before"])
        standin._context_source = None
        standin.set_step_context(None)
        _state.clear()
        log.info("mm_schedule restored SGLang's own %s", MODULE)
        return True


def _import_for_verification(version: str) -> types.ModuleType:
    try:
        return importlib.import_module(MODULE)
    except Exception as exc:
        raise UnsupportedSGLangVersion(
            f"SGLang {version} is not a release mm_schedule knows (known: {', '.join(KNOWN)}), and its"
            f" {MODULE} could not be imported to verify it: {type(exc).__name__}: {exc}"
        ) from exc


# -- finding and rebinding references ------------------------------------------------------


def _defined_objects(original: types.ModuleType, standin: types.ModuleType) -> dict[int, str]:
    """id -> name of the module object and of every function and class SGLang's module
    defined itself (imported names such as ``torch`` or ``logger`` are shared with
    everything and never rebound)."""
    found = {id(original): ""}
    for name, value in vars(original).items():
        if name.startswith("__") or not hasattr(standin, name):
            continue
        defined_here = getattr(value, "__module__", None) == original.__name__
        if defined_here and (isinstance(value, type) or callable(value)):
            found[id(value)] = name
    alias = vars(original).get("DataEmbeddingFunc")
    if alias is not None and hasattr(standin, "DataEmbeddingFunc"):
        found[id(alias)] = "DataEmbeddingFunc"
    return found


def _replacement(standin: types.ModuleType, name: str) -> Any:
    return standin if name == "" else getattr(standin, name)


def _scan_modules(skip: set[int]) -> list[types.ModuleType]:
    return [m for m in list(sys.modules.values())
            if isinstance(m, types.ModuleType) and id(m) not in skip
            and not (m.__name__ or "").startswith(_OWN_PREFIX) and m.__name__ not in _NOT_SCANNED]


def _rebind_everywhere(original: types.ModuleType, standin: types.ModuleType, report: InstallReport,
                       changes: list[_Change]) -> None:
    by_id = _defined_objects(original, standin)
    with warnings.catch_warnings():  # reading some libraries' deprecated attributes warns
        warnings.simplefilter("ignore")
        for module in _scan_modules({id(original), id(standin)}):
            _rebind_in(module, by_id, standin, report, changes)


def _rebind_in(module: types.ModuleType, by_id: dict[int, str], standin: types.ModuleType,
               report: InstallReport, changes: list[_Change]) -> None:
    where = module.__name__
    namespace = getattr(module, "__dict__", None) or {}
    for attr, value in list(namespace.items()):
        if attr.startswith("__"):
            continue
        name = by_id.get(id(value))
        if name is not None:
            new = _replacement(standin, name)
            changes.append(_Change(module, attr, "attr", value, new))
            setattr(module, attr, new)
            report.rebound.append(f"{where}.{attr}")
        elif isinstance(value, type) and getattr(value, "__module__", None) == where:
            _rebind_class(value, f"{where}.{attr}", by_id, standin, report, changes)
        elif (type(value) is dict and value is not sys.modules) or type(value) is list:
            _rebind_registry(value, f"{where}.{attr}", by_id, standin, report, changes)
        else:
            _report_unrebindable(value, f"{where}.{attr}", by_id, report)


def _rebind_registry(registry: dict | list, where: str, by_id: dict[int, str], standin: types.ModuleType,
                     report: InstallReport, changes: list[_Change]) -> None:
    """The values of a module-level dict or list that are SGLang's objects, rebound."""
    pairs = list(registry.items()) if type(registry) is dict else list(enumerate(registry))
    for key, item in pairs:
        name = by_id.get(id(item))
        if name is not None:
            new = _replacement(standin, name)
            changes.append(_Change(registry, key, "item", item, new))
            registry[key] = new
            report.rebound.append(f"{where}[{key!r}]")
        else:
            _report_unrebindable(item, f"{where}[{key!r}]", by_id, report)


def _rebind_class(cls: type, where: str, by_id: dict[int, str], standin: types.ModuleType,
                  report: InstallReport, changes: list[_Change]) -> None:
    for attr, value in list(vars(cls).items()):
        wrapper = type(value) if isinstance(value, (staticmethod, classmethod)) else None
        target = value.__func__ if wrapper is not None else value
        name = by_id.get(id(target))
        if name is None:
            continue
        replacement = _replacement(standin, name)
        new = wrapper(replacement) if wrapper is not None else replacement
        changes.append(_Change(cls, attr, "attr", value, new))
        setattr(cls, attr, new)
        report.rebound.append(f"{where}.{attr}")


def _report_unrebindable(value: Any, where: str, by_id: dict[int, str], report: InstallReport) -> None:
    """Name a reference to SGLang's objects that install() cannot replace in place."""
    if isinstance(value, functools.partial) and id(value.func) in by_id:
        report.reported.append(f"{where} (functools.partial of {by_id[id(value.func)] or 'the module'})")
    elif type(value) in (tuple, frozenset, set) and len(value) < 256:
        held = [by_id[id(v)] for v in value if id(v) in by_id]
        if held:
            report.reported.append(f"{where} ({type(value).__name__} holding {', '.join(n or 'the module' for n in held)})")


def _restore_new_modules(original: types.ModuleType, standin: types.ModuleType, before: set[str]) -> None:
    """Modules imported while installed took the stand-in's objects at their import:
    point those references at SGLang's objects of the same names."""
    ours = {id(standin): original}
    for name, value in vars(standin).items():
        if getattr(value, "__module__", None) == standin.__name__ and name in vars(original):
            ours.setdefault(id(value), vars(original)[name])
    for module_name in [n for n in list(sys.modules) if n not in before]:
        module = sys.modules.get(module_name)
        if not isinstance(module, types.ModuleType) or module_name.startswith(_OWN_PREFIX):
            continue
        if module is standin or module is original or module_name in _NOT_SCANNED:
            continue
        for attr, value in list(vars(module).items()):
            theirs = ours.get(id(value))
            if theirs is not None:
                setattr(module, attr, theirs)


# -- the step context -------------------------------------------------------------------------


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
