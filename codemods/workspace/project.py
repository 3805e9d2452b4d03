"""The project a file belongs to, so that a file run alone (named by pre-commit, piped
by an editor) is judged as it would be in a run over its whole tree.

The project root is the nearest folder at or above the file that holds a
``pyproject.toml``, a ``setup.cfg`` or a ``.git`` (a folder, or the file a worktree or
submodule has), as ruff and git find theirs; a file in no such folder belongs to the
folder above its top-level package. A module's own file in the project is looked for at
the root and one folder below it (``python/`` in SGLang's layout, ``src/`` in others):
deeper copies are installed packages or vendored trees, not the project's own.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKERS = ("pyproject.toml", "setup.cfg", ".git")


def _root_of_folder(folder: Path) -> Path:
    for here in (folder, *folder.parents):
        if any((here / marker).exists() for marker in MARKERS):
            return here
    top = folder
    while (top / "__init__.py").is_file() or (top / "__init__.pyi").is_file():
        top = top.parent
    return top


def project_root(path: str | os.PathLike) -> Path:
    """The root of the project ``path`` (a file, existing or not) belongs to."""
    return _root_of_folder(Path(os.path.abspath(path)).parent)


def module_files(root: Path, module: str) -> list[Path]:
    """The files of ``module`` that the project at ``root`` holds itself (see the module
    docstring), nearest first."""
    rel = module.replace(".", "/")
    found = []
    for base in (root, *_subfolders(root)):
        for candidate in (base / f"{rel}.py", base / rel / "__init__.py"):
            if candidate.is_file():
                found.append(candidate)
    return found


def _subfolders(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
