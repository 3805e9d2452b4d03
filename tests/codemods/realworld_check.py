"""Helpers for the opt-in real-world codemod tests (marker ``realworld``).

They fetch SGLang wheels (pip, with a short timeout; cached), extract a release's
Python tree, and check statically, with the stdlib ``ast`` only, that every
reference into the split modules resolves against a given release's bindings:

* ``from <module> import X`` (absolute or relative),
* ``alias.X`` where ``alias`` is bound to one of the modules (``import a.b.m as alias``,
  ``from a.b import m [as alias]``, ``from . import m``), and ``a.b.m.X`` after ``import a.b.m``,
* string targets ``"a.b.m.X"`` and ``patch.object(alias, "X")`` / ``setattr(alias, "X", ...)``.

Not a test module (no ``test_`` prefix); the tests load it by path.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from mm_schedule.codemods.movemap import bindings, derive, sources
from mm_schedule.errors import MoveMapError

OLD_MODULE = derive.SGLANG_OLD_MODULE
NEW_MODULE = derive.SGLANG_NEW_MODULE
DOWNLOAD_TIMEOUT_S = 50.0
_ATTRIBUTE_SETTERS = {"object", "setattr", "delattr"}


wheel_cache = sources.default_wheel_cache


def sglang_wheel(version: str) -> Path:
    """The SGLang wheel for ``version``: from the cache, else downloaded; skips the test
    when the registry cannot be reached in time."""
    try:
        return sources.fetch_archive(f"sglang=={version}", wheel_cache(), timeout=DOWNLOAD_TIMEOUT_S)
    except MoveMapError as exc:
        pytest.skip(f"SGLang {version} wheel unavailable (registry unreachable?): {exc}")


def extract_python_tree(wheel: Path, dest: Path) -> int:
    """Extract every ``.py`` file of the wheel under ``dest``; returns how many."""
    count = 0
    root = dest.resolve()
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            if not member.endswith(".py"):
                continue
            target = (root / PurePosixPath(member)).resolve()
            if root not in target.parents:
                raise ValueError(f"{wheel.name}: member {member!r} escapes the extraction folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member))
            count += 1
    return count


def release_bindings(wheel: Path, modules: tuple[str, ...] = (OLD_MODULE, NEW_MODULE)) -> dict[str, set[str]]:
    """Top-level names (defined or imported) each module binds in that release."""
    out = {}
    for module in modules:
        found = bindings.scan(sources.read_archive_source(wheel, module))
        out[module] = set(found.defined) | set(found.imported)
    return out


@dataclass(frozen=True, order=True)
class Unresolved:
    path: str
    line: int
    module: str
    name: str
    form: str  # "from-import", "attribute", "string", "setter"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.form} {self.module}.{self.name} is not bound there"


def _package_of(path: Path, root: Path) -> str:
    # ``pkg/__init__.py`` and ``pkg/mod.py`` both resolve relative imports against ``pkg``.
    return ".".join(path.relative_to(root).parts[:-1])


def _resolve(node: ast.ImportFrom, package: str) -> str | None:
    if not node.level:
        return node.module
    parts = package.split(".") if package else []
    if node.level - 1 >= len(parts):
        return None
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _dotted(node: ast.expr) -> str | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    names.append(node.id)
    return ".".join(reversed(names))


def _terminal_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def unresolved_in_file(path: Path, root: Path, bindings: dict[str, set[str]]) -> list[Unresolved]:
    data = path.read_bytes()
    if not any(m.rsplit(".", 1)[-1].encode() in data for m in bindings):
        return []
    tree = ast.parse(data, filename=str(path))
    rel = path.relative_to(root).as_posix()
    package = _package_of(path, root)
    aliases: dict[str, str] = {}  # local name -> module it is bound to
    dotted_imports: set[str] = set()  # ``import a.b.m`` keeps the full dotted path usable
    problems: list[Unresolved] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in bindings:
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:
                        dotted_imports.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            if module is None:
                continue
            for alias in node.names:
                if module in bindings and alias.name != "*":
                    if alias.name not in bindings[module]:
                        problems.append(Unresolved(rel, node.lineno, module, alias.name, "from-import"))
                elif f"{module}.{alias.name}" in bindings:
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    patterns = "|".join(re.escape(m) for m in sorted(bindings))
    string_target = re.compile(rf"^({patterns})\.([A-Za-z_]\w*)$")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = _dotted(node.value)
            module = aliases.get(owner) if owner in aliases else (owner if owner in dotted_imports else None)
            if module and node.attr not in bindings[module]:
                problems.append(Unresolved(rel, node.lineno, module, node.attr, "attribute"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = string_target.match(node.value)
            if match and match.group(2) not in bindings[match.group(1)]:
                problems.append(Unresolved(rel, node.lineno, match.group(1), match.group(2), "string"))
        elif isinstance(node, ast.Call) and _terminal_name(node.func) in _ATTRIBUTE_SETTERS:
            args = node.args
            if len(args) >= 2 and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str):
                owner = _dotted(args[0])
                module = aliases.get(owner) if owner in aliases else None
                if module and args[1].value not in bindings[module]:
                    problems.append(Unresolved(rel, node.lineno, module, args[1].value, "setter"))
    return problems


def python_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield Path(dirpath) / name


def unresolved_in_tree(root: Path, bindings: dict[str, set[str]]) -> tuple[list[Unresolved], list[str]]:
    """Every unresolved reference under ``root``, and the files ``ast`` could not parse."""
    problems: list[Unresolved] = []
    unparsable: list[str] = []
    for path in python_files(root):
        try:
            problems.extend(unresolved_in_file(path, root, bindings))
        except SyntaxError:
            unparsable.append(path.relative_to(root).as_posix())
    return sorted(set(problems)), unparsable


def tree_digest(root: Path) -> dict[str, str]:
    """Every file's SHA-256, by relative path: to prove a run changed nothing."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
