"""Derive a move map from two versions of a module's source, by AST.

Inputs: the old module's file, and the new versions of the files involved in the
split (the old module as it is now, and the module the names moved to). Every
module-level binding of the old module is classified:

* moved: the old module defined it (def, class, assignment); the new old-module no
  longer defines it; the new module binds it. ``private`` = a leading underscore.
* re-exported: a moved name the new old-module binds again with
  ``from <new module> import name`` (``as name`` included; relative forms resolved).
* import origin: the old module only imported it, and the new old-module no longer
  binds it; a plain ``from ORIGIN import name`` restores it. Imports that form cannot
  reproduce (aliases, ``import pkg``) land in ``unmapped_imports`` with their statement.
* removed: the old module defined it and neither new file binds it.
* rebound global: a name some function of the new module assigns under ``global``.

Bindings under ``if TYPE_CHECKING:`` and ``if __name__ == "__main__":`` do not exist
when other code imports the module, so they are ignored. The result is sorted and
carries a header naming the command and the exact sources (with SHA-256) it came from.

The command line is ``derive_cli`` (``mm-schedule-codemod derive``).
"""

from __future__ import annotations

import ast
import hashlib
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ...errors import MoveMapError
from .bindings import Bindings, scan
from .schema import MovedName, MoveMap
from .sources import (
    REQUIREMENT,
    Source,
    archive_distribution,
    fetch_archive,
    module_from_path,
    read_archive_source,
    read_source,
    release_source,
)

PROG = "mm-schedule-codemod derive"
SGLANG_OLD_MODULE = "sglang.srt.managers.mm_utils"
SGLANG_NEW_MODULE = "sglang.srt.managers.mm_schedule"



def _is_private(name: str) -> bool:
    return name.startswith("_")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def classify(old: Source, new_old: Source | None, new: Source, header: dict,
             release_binds: Callable[[str, str], bool] | None = None) -> MoveMap:
    """The move map between ``old`` and (``new_old``, ``new``); ``new_old`` None means the
    old module no longer exists. ``release_binds(module, name)`` answers whether a module
    of the newer release binds a name; with it, a name the old module imported is only
    sent to its origin if the origin still has it there (releases far apart move names
    again), otherwise it is reported as removed."""
    before = scan(old)
    after_old = scan(new_old) if new_old is not None else Bindings()
    after_new = scan(new)

    moved: dict[str, MovedName] = {}
    removed: set[str] = set()
    import_origins: dict[str, str] = {}
    unmapped: dict[str, str] = {}
    for name, kind in before.defined.items():
        if _is_dunder(name) or name in after_old.defined:
            continue
        if name in after_new.defined:
            moved[name] = MovedName(kind=kind, private=_is_private(name))
        elif name in after_new.imported and not after_old.binds(name):
            # the new module only imports it: its home is where that import reads from
            origin, original = after_new.imported[name]
            if original == name and origin != old.module:
                import_origins[name] = origin
            else:
                unmapped[name] = after_new.import_text[name]
        elif not after_old.binds(name):
            removed.add(name)

    reexported = {
        name
        for name in moved
        if (origin := after_old.imported.get(name)) is not None and origin == (new.module, name)
    }
    looked_up_in = {}
    for name in sorted(reexported):
        looked_up_in[name] = tuple(
            source.module for source in (new_old, new)
            if source is not None and name in _looked_up(source)
        )

    for name, (origin, original) in before.imported.items():
        if name in before.defined or after_old.binds(name) or _is_dunder(name):
            continue
        if original != name:
            unmapped[name] = before.import_text[name]
        elif release_binds is None or release_binds(origin, name):
            import_origins[name] = origin
        elif name in after_new.defined:
            moved[name] = MovedName(kind=after_new.defined[name], private=_is_private(name))
        else:
            removed.add(name)

    notes = []
    if before.star_imports:
        notes.append(
            f"{old.module} star-imports {sorted(set(before.star_imports))}; names bound only "
            "that way are not classified"
        )
    if notes:
        header = {**header, "notes": notes}
    return MoveMap(
        old_module=old.module,
        new_module=new.module,
        moved=dict(sorted(moved.items())),
        reexported=frozenset(reexported),
        import_origins=dict(sorted(import_origins.items())),
        rebound_globals=frozenset(after_new.rebound_globals),
        header=header,
        removed=frozenset(removed),
        unmapped_imports=dict(sorted(unmapped.items())),
        looked_up_in=looked_up_in,
    )


def _looked_up(source: Source) -> set[str]:
    """Names the module's own code reads (calls, references), imports excluded."""
    tree = ast.parse(source.text, filename=source.origin)
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def lifetimes(history: Sequence[tuple[str, Source | None, Source | None]]
              ) -> dict[str, dict[str, tuple[tuple[str, str], ...]]]:
    """For ``(release, old module's source, new module's source)`` of consecutive releases,
    oldest first (a source None where the release lacks the module): each module's bound
    names -> the runs of releases that bound them, ``((first, last), ...)``."""
    out: dict[str, dict[str, list[list[str]]]] = {"old_module": {}, "new_module": {}}
    previous: dict[str, set[str]] = {"old_module": set(), "new_module": set()}
    for release, *modules in history:
        for role, source in zip(("old_module", "new_module"), modules):
            bindings = scan(source) if source is not None else Bindings()
            names = {n for n in [*bindings.defined, *bindings.imported] if not _is_dunder(n)}
            for name in names:
                runs = out[role].setdefault(name, [])
                if name in previous[role]:
                    runs[-1][1] = release
                else:
                    runs.append([release, release])
            previous[role] = names
    return {role: {name: tuple(tuple(run) for run in runs) for name, runs in sorted(table.items())}
            for role, table in out.items() if table}


def _header(command: list[str], sources: list[tuple[str, Source | None]]) -> dict:
    return {
        "generated_by": "mm-schedule-codemod derive; regenerate with the command below, never edit by hand",
        "command": shlex.join([*PROG.split(), *command]),
        "sources": [s.describe(role) for role, s in sources if s is not None],
    }


def _module_args(old_module: str, new_module: str) -> list[str]:
    return ["--old-module", old_module, "--new-module", new_module]


def derive_map(
    old_path: str | os.PathLike,
    new_paths: Sequence[str | os.PathLike],
    old_module: str | None = None,
    new_module: str | None = None,
    package_root: str | None = None,
) -> MoveMap:
    """Build the map from files on disk.

    ``new_paths`` holds the new version of the old module and the new module's file, in
    that order, or only the new module's file when the old module was deleted. With
    ``package_root`` the module names come from the paths, and the order does not matter.
    """
    new_paths = list(new_paths)
    if not 1 <= len(new_paths) <= 2:
        raise MoveMapError(f"expected the new old-module file and the new module file; got {len(new_paths)} files")
    if package_root:
        old_module = old_module or module_from_path(old_path, package_root)
        named = {module_from_path(p, package_root): p for p in new_paths}
        if len(named) != len(new_paths):
            raise MoveMapError(f"two new files map to the same module: {sorted(map(str, new_paths))}")
        new_old_path = named.pop(old_module, None)
        if new_module is None:
            if len(named) != 1:
                raise MoveMapError(f"cannot tell which new file is the new module among {sorted(named)}")
            new_module = next(iter(named))
        if new_module not in named:
            raise MoveMapError(f"no new file is module {new_module!r} (found {sorted(named)})")
        new_path = named[new_module]
    else:
        if not old_module or not new_module:
            raise MoveMapError("give --old-module and --new-module, or --package-root to read them from the paths")
        new_old_path, new_path = (None, new_paths[0]) if len(new_paths) == 1 else new_paths
    if old_module == new_module:
        raise MoveMapError(f"old and new module are the same ({old_module})")

    old = read_source(old_path, old_module)
    new_old = read_source(new_old_path, old_module) if new_old_path is not None else None
    new = read_source(new_path, new_module)
    command = ["--old", os.fspath(old_path), "--new", *map(os.fspath, new_paths)]
    command += _module_args(old_module, new_module)
    if package_root:
        command += ["--package-root", package_root]
    return classify(old, new_old, new, _header(command, [("old", old), ("new", new_old), ("new", new)]))


def derive_from_wheels(
    old_archive: str,
    new_archive: str,
    old_module: str = SGLANG_OLD_MODULE,
    new_module: str = SGLANG_NEW_MODULE,
    cache: Path | None = None,
    history: Sequence[str] = (),
    index_url: str | None = None,
) -> MoveMap:
    """Build the map from two released archives, each a path or a pinned ``dist==version``
    (downloaded into ``cache``). The header records the archives by what was asked for
    (file name or requirement), so the same command reproduces the same map anywhere.
    ``history``: every release to cover, oldest first (paths or pins; pins are read off
    the index one file at a time, see ``sources.release_source``): the names each module
    bound in each of them become the map's ``lifetimes``, which aim it at any of them."""
    old_path = fetch_archive(old_archive, cache)
    new_path = fetch_archive(new_archive, cache)
    old = read_archive_source(old_path, old_module)
    new = read_archive_source(new_path, new_module)
    try:
        new_old = read_archive_source(new_path, old_module)
    except MoveMapError:
        new_old = None  # the old module is gone from the new release

    bindings_cache: dict[str, Bindings | None] = {}

    top = old_module.split(".")[0]

    def release_binds(module: str, name: str) -> bool:
        if module.split(".")[0] != top:
            return True  # another distribution's module: nothing to check it against
        if module not in bindings_cache:
            try:
                bindings_cache[module] = scan(read_archive_source(new_path, module))
            except MoveMapError:
                bindings_cache[module] = None  # no such module in the new release
        found = bindings_cache[module]
        # a star import may bind anything: give the name the benefit of the doubt
        return found is not None and (found.binds(name) or bool(found.star_imports))

    named = [a if not Path(a).is_file() else Path(a).name for a in (old_archive, new_archive)]
    command = ["--from-wheels", *named, *_module_args(old_module, new_module)]
    releases = [(_release_of(h), release_source(h, old_module, cache, index_url),
                 release_source(h, new_module, cache, index_url)) for h in history]
    labels = [release for release, _, _ in releases]
    twice = sorted({r for r in labels if labels.count(r) > 1})
    if twice:
        raise MoveMapError(f"--history lists a release twice: {twice}")
    if history:
        command += ["--history", *[h if not Path(h).is_file() else Path(h).name for h in history]]
    header = _header(command, [("old", old), ("new", new_old), ("new", new)])
    dist = new.origin.split(":")[0].split(" ")
    if len(dist) == 2:
        # the release whose files the moves were read from, not the one a run aims at
        # (that is ``--target-version``, by default the newest of ``releases``)
        header["distribution"], header["split_version"] = dist
    if releases:
        # one digest over every history file read, in order: the lifetimes' provenance
        digest = hashlib.sha256()
        for release, *modules in releases:
            for source in modules:
                digest.update(f"{release} {source.origin if source else '-'} "
                              f"{source.sha256 if source else '-'}\n".encode())
        header["history_sha256"] = digest.hexdigest()
    derived = classify(old, new_old, new, header, release_binds)
    if releases:
        derived = replace(derived, releases=tuple(labels), lifetimes=lifetimes(releases))
    return derived


def _release_of(spec: str) -> str:
    """The version a history entry names: the pin's, else the archive's own metadata."""
    match = REQUIREMENT.match(spec)
    if match:
        return match.group(2)
    dist = archive_distribution(Path(spec))
    if dist is None:
        raise MoveMapError(f"{spec}: cannot tell which release this archive is (no metadata)")
    return dist[1]


