"""Tree check: the tree holds the old module's own file (a fork of the upstream package).

Imports of the old module inside such a tree load the fork's copy, so rewriting them to
the new module is right only if the new module has the names too. The warning
(``MMS015``) settles, so that CI on a fork can go green:

* it is not raised when the tree has its own new module (``.../mm_schedule.py`` beside
  the fork's ``mm_utils.py``) and that module binds every name the run rewrites to it
  (checked with ``ast``); otherwise it names the missing ones;
* it is acknowledged by ``# mm-schedule-codemod: ignore[MMS015]`` anywhere in the fork's
  old-module file, or by ``acknowledge-fork = true`` in the configuration;
* it is not raised when the run rewrites nothing and uses no moved name: there is
  nothing to check then.

The fork's old module is found among the files a run walked, and in the project of each
file it migrates (``workspace.project``): a file run alone (pre-commit, stdin) meets the
same check as the whole tree. Names the fork's old module binds itself are not reported
as gone from the old module (``spare``): inside the fork they are not.

Not a per-file rule: it looks at the files a run found and the rewrites it planned.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from ...errors import MMScheduleError
from ..movemap.bindings import scan
from ..movemap.schema import MoveMap
from ..movemap.sources import read_source
from ..report.findings import Finding
from ..report.suppression import Suppressions
from ..workspace.project import module_files, project_root
from .from_imports import REEXPORTED

# Fixed findings whose rewrite makes a use read the new module.
_TO_NEW_MODULE = frozenset({"MMS001", "MMS002", "MMS004", REEXPORTED})

CODES = {
    "MMS015": ('fork', "the tree contains the old module's own file; imports of it inside the tree resolve to that copy, which may still define the moved names"),
}


def fork_warnings(paths: Iterable[str | os.PathLike], move_map: MoveMap) -> list[Finding]:
    """One MMS015 finding per file among ``paths`` that is the old module itself (a fork
    of the upstream package keeps ``.../managers/mm_utils.py``). Imports of the old module
    inside such a tree resolve to that copy; call this before retargeting them."""
    file = move_map.old_module.replace(".", "/") + ".py"
    return [Finding(
        os.fspath(path), 1, 1, "MMS015", move_map.old_module,
        f"this tree has its own {move_map.old_module} ({file}): imports of it inside the tree "
        f"load this copy, not upstream's; check which names this copy still defines before "
        f"accepting the rewrites to {move_map.new_module}", False,
    ) for path in paths if _above(path, move_map.old_module) is not None]


def _above(path: str | os.PathLike, module: str) -> str | None:
    """The folder (``""`` for the working folder) that ``path`` is ``module``'s file in,
    or None when ``path`` is not a file of ``module``."""
    posix = Path(path).as_posix()
    rel = module.replace(".", "/")
    for tail in (f"{rel}.py", f"{rel}/__init__.py"):
        if posix == tail or posix.endswith("/" + tail):
            return posix[: len(posix) - len(tail)]
    return None


def fork_files(walked: Iterable[Path], migrated: Iterable[Path], move_map: MoveMap) -> list[Path]:
    """The old module's own files a run must know about: those among the ``walked``
    files, and those in the projects of the ``migrated`` ones; each once."""
    candidates = [p for p in walked if _above(p, move_map.old_module) is not None]
    folders = dict.fromkeys(Path(os.path.abspath(p)).parent for p in migrated)
    for root in dict.fromkeys(project_root(folder / "_") for folder in folders):
        candidates += module_files(root, move_map.old_module)
    seen, out = set(), []
    for path in candidates:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(path)
    return out


def spare(move_map: MoveMap, forks: Iterable[str | os.PathLike]) -> MoveMap:
    """The map without the gone names that the forks' own old modules still bind."""
    bound: set[str] = set()
    for path in forks:
        try:
            bindings = scan(read_source(path, move_map.old_module))
        except MMScheduleError:
            continue  # unreadable or unparsable: nothing known to spare
        bound |= set(bindings.defined) | set(bindings.imported)
    return move_map.sparing(bound) if bound & move_map.gone else move_map


def rewrite_targets(findings: Iterable[Finding]) -> set[str]:
    """The names a run rewrites (or would rewrite) to the new module."""
    return {f.symbol for f in findings if f.fixed and f.code in _TO_NEW_MODULE}


def settle(warnings: Iterable[Finding], move_map: MoveMap, findings: Iterable[Finding],
           acknowledged: Callable[[str], bool]) -> list[Finding]:
    """The fork warnings still standing once the run's findings, the tree's own new
    module and the acknowledgements are taken into account (see the module docstring)."""
    findings = list(findings)
    if not any(f.fixed or f.symbol in move_map.moved for f in findings):
        return []
    targets = rewrite_targets(findings)
    kept = []
    for warning in warnings:
        if acknowledged(warning.path) or _suppressed_in(warning.path):
            continue
        own = _own_new_module(warning.path, move_map)
        if own is not None:
            path, names = own
            missing = sorted(targets - names) if names is not None else None
            if missing == []:
                continue
            lacking = ("cannot be parsed" if missing is None
                       else f"does not bind {', '.join(missing)}")
            warning = replace(warning, message=(
                f"this tree has its own {move_map.old_module} and {move_map.new_module}, but its "
                f"{path} {lacking}, which the rewrites read from it; define them there, or "
                f"acknowledge with '# mm-schedule-codemod: ignore[MMS015]' in {warning.path}"))
        kept.append(warning)
    return kept


def _suppressed_in(path: str) -> bool:
    try:
        suppressions = Suppressions.parse(Path(path).read_bytes())
    except OSError:
        return False
    return suppressions is not None and any("MMS015" in codes for codes in suppressions.lines.values())


def _own_new_module(old_path: str, move_map: MoveMap) -> tuple[str, set[str] | None] | None:
    """The tree's own new-module file beside the fork's old module and the names it binds
    (None when it cannot be parsed), or None when the tree has none."""
    root = _above(old_path, move_map.old_module)
    if root is None:
        return None
    new = move_map.new_module.replace(".", "/")
    for candidate in (f"{root}{new}.py", f"{root}{new}/__init__.py"):
        if Path(candidate).is_file():
            try:
                bindings = scan(read_source(candidate, move_map.new_module))
            except MMScheduleError:
                return candidate, None
            return candidate, set(bindings.defined) | set(bindings.imported)
    return None
