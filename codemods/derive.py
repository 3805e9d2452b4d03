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

``python -m mm_schedule.codemods.derive --help`` (or ``mm-schedule-codemod derive``).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from ..errors import MoveMapError
from .exit_status import EXIT_FAILED, EXIT_OK, EXIT_REMAINING, EXIT_USAGE, UsageParser
from .move_map import MovedName, MoveMap, load_map
from .writing import unwritable_reason

PROG = "mm-schedule-codemod derive"
SGLANG_OLD_MODULE = "sglang.srt.managers.mm_utils"
SGLANG_NEW_MODULE = "sglang.srt.managers.mm_schedule"
WHEEL_CACHE_ENV = "MM_SCHEDULE_WHEEL_CACHE"


def default_wheel_cache() -> Path:
    """Where downloaded wheels are kept: ``$MM_SCHEDULE_WHEEL_CACHE``, else
    ``~/.cache/mm-schedule/wheels`` (the benchmarks and tests share it)."""
    return Path(os.environ.get(WHEEL_CACHE_ENV) or Path.home() / ".cache" / "mm-schedule" / "wheels")

_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """One module's source text and where it came from (for the header)."""

    module: str
    text: str
    is_package: bool  # an ``__init__.py``: relative imports resolve against the module itself
    origin: str  # "path/to/file.py", or "sglang 0.5.17: sglang/srt/managers/mm_utils.py"

    @property
    def package(self) -> str:
        return self.module if self.is_package else self.module.rpartition(".")[0]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def describe(self, role: str) -> dict:
        return {"role": role, "module": self.module, "source": self.origin, "sha256": self.sha256}


def read_source(path: str | os.PathLike, module: str) -> Source:
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as exc:
        raise MoveMapError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise MoveMapError(f"{path} is not UTF-8: {exc}") from exc
    return Source(module=module, text=text, is_package=p.name == "__init__.py", origin=os.fspath(path))


def module_from_path(path: str | os.PathLike, package_root: str) -> str:
    """``.../sglang/srt/managers/mm_utils.py`` with root ``sglang`` -> ``sglang.srt.managers.mm_utils``."""
    parts = Path(os.path.abspath(path)).parts
    root = package_root.split(".")[0]
    if root not in parts[:-1]:
        raise MoveMapError(f"{path}: no directory named {root!r} (--package-root) in its path")
    start = len(parts) - 1 - parts[::-1].index(root, 1)
    dotted = [*parts[start:-1], Path(parts[-1]).stem]
    if dotted[-1] == "__init__":
        dotted.pop()
    module = ".".join(dotted)
    if not (module == package_root or module.startswith(package_root + ".")):
        raise MoveMapError(f"{path} is module {module!r}, which is not under {package_root!r}")
    return module


@contextmanager
def _open_archive(archive: Path) -> Iterator[tuple[list[str], Callable[[str], bytes]]]:
    """(member names, read(member) -> bytes) of a wheel, zip or source tarball."""
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            yield zf.namelist(), zf.read
    elif archive.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tarfile.open(archive) as tf:
            yield tf.getnames(), lambda member: tf.extractfile(member).read()
    else:
        raise MoveMapError(f"{archive}: not a wheel, zip or source tarball")


def _distribution(names: list[str], read: Callable[[str], bytes]) -> tuple[str, str] | None:
    for member in sorted(names):
        tail = PurePosixPath(member)
        is_wheel_meta = tail.name == "METADATA" and tail.parent.name.endswith(".dist-info")
        is_sdist_meta = tail.name == "PKG-INFO" and len(tail.parts) == 2
        if is_wheel_meta or is_sdist_meta:
            meta = HeaderParser().parsestr(read(member).decode("utf-8", "replace"))
            if meta.get("Name") and meta.get("Version"):
                return meta["Name"], meta["Version"]
    return None


def read_archive_source(archive: str | os.PathLike, module: str) -> Source:
    """The file of ``module`` inside a wheel (or sdist), e.g. ``sglang/srt/managers/mm_utils.py``."""
    archive = Path(archive)
    rel = module.replace(".", "/")
    wanted = (f"{rel}.py", f"{rel}/__init__.py")
    try:
        with _open_archive(archive) as (names, read):
            # A wheel holds the module at its root; an sdist nests it (``pkg-1.0/python/...``).
            hits = sorted((n for n in names if n in wanted or n.endswith(tuple("/" + w for w in wanted))),
                          key=lambda n: (len(n), n))
            if not hits:
                raise MoveMapError(f"{archive.name} has no file for module {module!r} (looked for {wanted[0]})")
            member = hits[0]
            raw = read(member)
            dist = _distribution(names, read)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise MoveMapError(f"cannot open {archive}: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MoveMapError(f"{archive.name}:{member} is not UTF-8: {exc}") from exc
    label = f"{dist[0]} {dist[1]}" if dist else archive.name
    return Source(module=module, text=text, is_package=member.endswith("/__init__.py"),
                  origin=f"{label}: {member}")


def fetch_archive(spec: str, cache: Path | None = None, timeout: float = 120.0) -> Path:
    """A path to a wheel: ``spec`` itself when it is a file, else ``dist==version`` from the
    cache folder, downloaded there with pip (``--no-deps``) when missing."""
    if Path(spec).is_file():
        return Path(spec)
    match = _REQUIREMENT.match(spec)
    if not match:
        raise MoveMapError(f"{spec!r} is neither an existing file nor a pinned requirement like sglang==0.5.17")
    cache = Path(cache) if cache else default_wheel_cache()
    found = _cached_archive(cache, *match.groups())
    if found:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--timeout", str(max(1, int(timeout / 4))), "--retries", "1", "-d", str(cache), spec]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise MoveMapError(f"downloading {spec} took longer than {timeout:.0f} s") from exc
    found = _cached_archive(cache, *match.groups())
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no archive appeared"]
        raise MoveMapError(f"pip could not download {spec}: {tail[0]}")
    return found


def _cached_archive(cache: Path, dist: str, version: str) -> Path | None:
    if not cache.is_dir():
        return None
    stem = re.sub(r"[-_.]+", "_", dist).lower()
    candidates = []
    for entry in sorted(cache.iterdir()):
        name = entry.name.lower()
        for prefix in (f"{stem}-{version}-", f"{stem.replace('_', '-')}-{version}-"):
            if name.startswith(prefix) and name.endswith(".whl"):
                candidates.append(entry)
        if name in (f"{stem}-{version}.tar.gz", f"{dist.lower()}-{version}.tar.gz"):
            candidates.append(entry)
    # Prefer wheels: they hold the installed layout.
    candidates.sort(key=lambda p: (not p.name.endswith(".whl"), p.name))
    return candidates[0] if candidates else None


# --------------------------------------------------------------------------- bindings


@dataclass
class Bindings:
    """What importing a module binds at its top level, and what its functions rebind."""

    defined: dict[str, str] = field(default_factory=dict)  # name -> kind
    # name -> (origin module, name there); origin name None for ``import pkg [as x]``.
    imported: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    import_text: dict[str, str] = field(default_factory=dict)  # name -> the binding statement
    star_imports: list[str] = field(default_factory=list)
    rebound_globals: set[str] = field(default_factory=set)

    def binds(self, name: str) -> bool:
        return name in self.defined or name in self.imported


def scan(source: Source) -> Bindings:
    try:
        tree = ast.parse(source.text, filename=source.origin)
    except SyntaxError as exc:
        raise MoveMapError(f"{source.origin}: cannot parse line {exc.lineno}: {exc.msg}") from exc
    out = Bindings()
    _scan_block(tree.body, source, out)
    out.rebound_globals = _rebound_globals(tree)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_names(element)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def resolve_import(node: ast.ImportFrom, package: str, where: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts) - 1 or not parts:
        raise MoveMapError(f"{where}:{node.lineno}: relative import beyond the top-level package {package!r}")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _scan_block(body: Sequence[ast.stmt], source: Source, out: Bindings) -> None:
    def define(name: str, kind: str) -> None:
        out.defined.setdefault(name, kind)

    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            define(stmt.name, "function")
        elif isinstance(stmt, ast.ClassDef):
            define(stmt.name, "class")
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                for name in _target_names(target):
                    define(name, "variable")
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            # A bare annotation (``x: int``) binds nothing.
            if getattr(stmt, "value", True) is not None:
                for name in _target_names(stmt.target):
                    define(name, "variable")
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bound = alias.asname or alias.name.split(".")[0]
                origin = alias.name if alias.asname else bound
                out.imported.setdefault(bound, (origin, None))
                out.import_text.setdefault(bound, ast.unparse(ast.Import(names=[alias])))
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.module == "__future__":
                continue
            origin = resolve_import(stmt, source.package, source.origin)
            for alias in stmt.names:
                if alias.name == "*":
                    out.star_imports.append(origin)
                    continue
                bound = alias.asname or alias.name
                out.imported.setdefault(bound, (origin, alias.name))
                written = ast.ImportFrom(module=origin, names=[alias], level=0)
                out.import_text.setdefault(bound, ast.unparse(written))
        elif isinstance(stmt, ast.If):
            if not (_is_type_checking(stmt.test) or _is_main_guard(stmt.test)):
                _scan_block(stmt.body, source, out)
            _scan_block(stmt.orelse, source, out)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            for name in _target_names(stmt.target):
                define(name, "variable")
            _scan_block(stmt.body, source, out)
            _scan_block(stmt.orelse, source, out)
        elif isinstance(stmt, ast.While):
            _scan_block(stmt.body, source, out)
            _scan_block(stmt.orelse, source, out)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    for name in _target_names(item.optional_vars):
                        define(name, "variable")
            _scan_block(stmt.body, source, out)
        elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            _scan_block(stmt.body, source, out)
            for handler in stmt.handlers:
                _scan_block(handler.body, source, out)
            _scan_block(stmt.orelse, source, out)
            _scan_block(stmt.finalbody, source, out)
        elif isinstance(stmt, ast.Match):
            for case in stmt.cases:
                _scan_block(case.body, source, out)


_NEW_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _scope_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """Nodes of one function's own scope: nested functions, classes and lambdas excluded."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _NEW_SCOPES):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _rebound_globals(tree: ast.Module) -> set[str]:
    rebound: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(_scope_nodes(func))
        declared = {n for node in nodes if isinstance(node, ast.Global) for n in node.names}
        if not declared:
            continue
        assigned: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                assigned.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                assigned.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assigned.add(node.name)
        rebound |= declared & assigned
    return rebound


# --------------------------------------------------------------------------- classify


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


def _union(a: Bindings, b: Bindings) -> Bindings:
    return Bindings(defined={**a.defined, **b.defined}, imported={**a.imported, **b.imported})


def earlier_names(history: Sequence[Source], move_map: MoveMap, still: Bindings, release: str) -> dict[str, str]:
    """Names the old module bound in the ``history`` versions (oldest first) that the map
    neither moves nor reports and that neither module binds in the newer release
    (``still``): name -> note."""
    known = (set(move_map.moved) | set(move_map.import_origins) | set(move_map.removed)
             | set(move_map.unmapped_imports) | set(still.defined) | set(still.imported))
    out: dict[str, str] = {}
    for source in history:
        bindings = scan(source)
        for name in list(bindings.defined) + list(bindings.imported):
            if _is_dunder(name) or name in known:
                continue
            note = f"bound by {move_map.old_module} in {source.origin.split(':')[0]}"
            if name in bindings.imported:
                note += f" (imported there from {bindings.imported[name][0]})"
            out[name] = f"{note}; gone by {release}"
    return dict(sorted(out.items()))


def _header(command: list[str], sources: list[tuple[str, Source | None]]) -> dict:
    return {
        "generated_by": "mm_schedule.codemods.derive; regenerate with the command below, never edit by hand",
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
) -> MoveMap:
    """Build the map from two released archives, each a path or a pinned ``dist==version``
    (downloaded into ``cache``). The header records the archives by what was asked for
    (file name or requirement), so the same command reproduces the same map anywhere.
    ``history``: older archives whose old-module names that are gone by the new release
    the map lists as ``earlier`` (reported when a user asks for the target release)."""
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
    earlier_sources = [read_archive_source(fetch_archive(h, cache), old_module) for h in history]
    if history:
        command += ["--history", *[h if not Path(h).is_file() else Path(h).name for h in history]]
    header = _header(command, [("old", old), ("new", new_old), ("new", new)])
    dist = new.origin.split(":")[0].split(" ")
    if len(dist) == 2:
        header["distribution"], header["target_version"] = dist
    derived = classify(old, new_old, new, header, release_binds)
    if earlier_sources:
        still = scan(new) if new_old is None else _union(scan(new_old), scan(new))
        derived = replace(
            derived, earlier=earlier_names(earlier_sources, derived, still, new.origin.split(":")[0])
        )
    return derived


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog=PROG,
        description="Derive a codemod move map from two versions of a module's source (by AST).",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--old", metavar="FILE", help="the old module's source file")
    src.add_argument(
        "--from-wheels", nargs=2, metavar=("OLD", "NEW"),
        help="read the module files out of two wheels; each a .whl path or a pin like sglang==0.5.17 "
        "(downloaded with pip into --wheel-cache)",
    )
    parser.add_argument("--history", nargs="+", metavar="ARCHIVE",
                        help="with --from-wheels: older releases (paths or pins); names their old module "
                        "had that are gone by the new release are listed as 'earlier', reported when "
                        "the codemod is told the target release")
    parser.add_argument("--new", nargs="+", metavar="FILE",
                        help="with --old: the new old-module file, then the new module's file")
    parser.add_argument("--old-module", metavar="M", help="dotted name of the module names moved out of")
    parser.add_argument("--new-module", metavar="M", help="dotted name of the module names moved into")
    parser.add_argument("--package-root", metavar="NAME",
                        help="with --old/--new: read module names from the file paths, starting at NAME")
    parser.add_argument("--wheel-cache", metavar="DIR", type=Path,
                        help=f"where --from-wheels keeps downloads (default ${WHEEL_CACHE_ENV}, else"
                             " ~/.cache/mm-schedule/wheels)")
    parser.add_argument("-o", "--output", metavar="OUT.json", help="write the map here (default: stdout)")
    parser.add_argument("--check", metavar="MAP.json",
                        help="exit 1 (and print a diff) when the derived map differs from this one")
    return parser


def _content(m: MoveMap) -> str:
    """A map's text without its header: what drift is measured on."""
    data = m.to_dict()
    data.pop("header")
    return json.dumps(data, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["derive"]:
        argv = argv[1:]
    parser = _parser()
    args = parser.parse_args(argv)
    reason = unwritable_reason(args.output) if args.output else None
    if reason:  # said before a derivation that may download wheels
        parser.error(f"-o {args.output}: {reason}")
    try:
        if args.from_wheels:
            if args.new or args.package_root:
                parser.error("--new and --package-root go with --old, not --from-wheels")
            derived = derive_from_wheels(
                *args.from_wheels,
                old_module=args.old_module or SGLANG_OLD_MODULE,
                new_module=args.new_module or SGLANG_NEW_MODULE,
                cache=args.wheel_cache,
                history=args.history or (),
            )
        else:
            if not args.new:
                parser.error("--old needs --new FILE [FILE]")
            derived = derive_map(args.old, args.new, old_module=args.old_module,
                                 new_module=args.new_module, package_root=args.package_root)
        checked = load_map(args.check) if args.check else None
    except MoveMapError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    text = derived.to_json()
    if args.output:
        out = Path(args.output)
        tmp = out.with_name(out.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            print(f"{PROG}: error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_FAILED
    elif checked is None:
        sys.stdout.write(text)

    if checked is None:
        return EXIT_OK
    if checked == derived:
        print(f"{args.check}: up to date with {derived.header['command']}", file=sys.stderr)
        return EXIT_OK
    diff = difflib.unified_diff(
        _content(checked).splitlines(keepends=True), _content(derived).splitlines(keepends=True),
        fromfile=f"{args.check} (checked in)", tofile="derived",
    )
    sys.stdout.writelines(diff)
    print(f"{args.check}: differs from the derived map (drift); regenerate with: "
          f"{derived.header['command']} -o {args.check}", file=sys.stderr)
    return EXIT_REMAINING


if __name__ == "__main__":
    sys.exit(main())
