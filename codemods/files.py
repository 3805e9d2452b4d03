"""Which files a run looks at: Python sources under the given paths, minus what
``.gitignore`` excludes, virtual environments, caches and build output."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".py", ".pyi")
# Folders never worth parsing. Virtual environments are also recognised by pyvenv.cfg.
SKIP_DIRS = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", ".env", "env", "__pycache__", ".tox", ".nox",
    "build", "dist", ".eggs", "node_modules", "site-packages", ".mypy_cache",
    ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints",
})


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern
    negate: bool
    dir_only: bool


def _compile(pattern: str) -> _Rule | None:
    line = pattern.rstrip("\n").rstrip()
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    if line.startswith("\\"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line
    line = line.lstrip("/")
    out = []
    i = 0
    while i < len(line):
        if line.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif line.startswith("/**", i) and i + 3 == len(line):
            out.append("/.*")
            i += 3
        elif line[i] == "*":
            out.append("[^/]*")
            i += 1
        elif line[i] == "?":
            out.append("[^/]")
            i += 1
        elif line[i] == "[":
            end = line.find("]", i)
            if end == -1:
                out.append(re.escape(line[i]))
                i += 1
            else:
                out.append(fnmatch.translate(line[i : end + 1])[4:-3])
                i = end + 1
        else:
            out.append(re.escape(line[i]))
            i += 1
    body = "".join(out)
    regex = re.compile(("" if anchored else "(?:.*/)?") + body + "$")
    return _Rule(regex, negate, dir_only)


class _Ignore:
    """The ``.gitignore`` rules in force for one folder (its own plus its parents')."""

    def __init__(self, parent: _Ignore | None, base: Path, rules: list[_Rule]):
        self.parent, self.base, self.rules = parent, base, rules

    def ignored(self, path: Path, is_dir: bool) -> bool:
        verdict = self.parent.ignored(path, is_dir) if self.parent else False
        if not self.rules:
            return verdict
        try:
            rel = path.relative_to(self.base).as_posix()
        except ValueError:
            return verdict
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(rel):
                verdict = not rule.negate
        return verdict

    def child(self, folder: Path) -> _Ignore:
        gitignore = folder / ".gitignore"
        if not gitignore.is_file():
            return self
        try:
            lines = gitignore.read_text("utf-8", errors="replace").splitlines()
        except OSError:
            return self
        rules = [r for r in (_compile(line) for line in lines) if r is not None]
        return _Ignore(self, folder, rules) if rules else self


def _is_venv(folder: Path) -> bool:
    return (folder / "pyvenv.cfg").is_file()


def _ignore_for(folder: Path) -> _Ignore:
    """Rules from the enclosing repository's .gitignore files down to ``folder``."""
    folder = folder.absolute()
    chain = [folder, *folder.parents]
    top = next((p for p in chain if (p / ".git").exists()), folder)
    ignore = _Ignore(None, top, [])
    for part in reversed(chain[: chain.index(top) + 1]):
        ignore = ignore.child(part)
    return ignore


def _walk(folder: Path, ignore: _Ignore) -> Iterator[Path]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIP_DIRS or entry.name.endswith(".egg-info") or _is_venv(path):
                continue
            if ignore.ignored(path, True):
                continue
            yield from _walk(path, ignore.child(path))
        elif entry.name.endswith(SUFFIXES) and entry.is_file():
            if not ignore.ignored(path, False):
                yield path


def discover(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Python files under ``paths``, sorted, each once. Files named explicitly are kept
    even if ignored; folders are walked with .gitignore, venvs and build output skipped."""
    seen: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            seen.setdefault(path, None)
        elif path.is_dir():
            for found in _walk(path.absolute(), _ignore_for(path)):
                seen.setdefault(found, None)
        else:
            raise FileNotFoundError(f"no such file or folder: {raw}")
    return list(seen)
