"""Module-path arithmetic: which package a file belongs to, what a relative import names."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import libcst as cst


@functools.lru_cache(maxsize=4096)
def _is_package_dir(path: Path) -> bool:
    return (path / "__init__.py").is_file() or (path / "__init__.pyi").is_file()


@functools.lru_cache(maxsize=4096)
def _inside_package(path: Path) -> bool:
    """Whether some ancestor of ``path`` is a regular package (so ``path`` is a
    namespace portion of it, like SGLang's ``sglang/srt`` under ``sglang``)."""
    return any(_is_package_dir(parent) for parent in path.parents)  # no recursion: any depth


def package_for(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str | None:
    """The package a file's relative imports resolve against, or None if unknown.

    Walk up from the file's folder through package folders: those with ``__init__.py``
    and namespace folders nested inside one (SGLang's ``sglang/srt`` has no
    ``__init__.py`` but sits in ``sglang``). ``pkg/__init__.py`` and ``pkg/mod.py`` both
    resolve against ``pkg``. A file whose folder is neither (a top-level namespace
    package or a script) falls back to its folder relative to ``root``.
    """
    file_dir = Path(path).resolve().parent
    if _is_package_dir(file_dir) or _inside_package(file_dir):
        parts: list[str] = []
        here = file_dir
        while _is_package_dir(here) or _inside_package(here):
            parts.append(here.name)
            here = here.parent
        names = list(reversed(parts))
        return ".".join(names) if all(p.isidentifier() for p in names) else None
    if root is None:
        return None
    top = Path(root).resolve()
    if top.is_file():
        top = top.parent
    try:
        rel = file_dir.relative_to(top)
    except ValueError:
        return None
    parts = [p for p in rel.parts if p]
    if not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def relative_base(package: str | None, level: int) -> str | None:
    """The package that ``level`` leading dots name inside ``package``: one dot the package
    itself, each further dot one level up. None when nothing is known (no package, or
    ``level`` 0) or when the dots climb above the top-level package, where Python raises
    "attempted relative import beyond top-level package". The only relative-import
    resolver: the engine and ``derive`` both use it."""
    if not package or level <= 0:
        return None
    parts = package.split(".")
    if level > len(parts):
        return None
    return ".".join(parts[: len(parts) - level + 1])


def absolute_module(package: str | None, level: int, module: str | None) -> str | None:
    """Absolute name of ``from <level dots><module> import ...`` inside ``package``."""
    if level == 0:
        return module
    base = relative_base(package, level)
    if base is None:
        return None
    return ".".join(p for p in (base, module) if p) or None


def relative_tail(package: str | None, level: int, module: str) -> str | None:
    """What follows the dots when ``module`` is written relative with ``level`` dots inside
    ``package``: "" for the package the dots name itself, None when ``module`` lies outside it."""
    base = relative_base(package, level)
    if base is None:
        return None
    if module == base:
        return ""
    if module.startswith(base + "."):
        return module[len(base) + 1 :]
    return None


def may_bind(target: str, name: str, from_module: str | None = None) -> bool:
    """Whether ``import name`` (``from_module`` None) or ``from from_module import name``
    could bind an object through which module ``target`` is reached: the module itself, a
    package above it, or (plain imports) a submodule, which binds its top package too."""
    full = name if from_module is None else f"{from_module}.{name}"
    if target == full or target.startswith(full + "."):
        return True
    return from_module is None and full.startswith(target + ".")


def dotted_name(node: cst.BaseExpression | None) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None


def dotted_expr(name: str) -> cst.Name | cst.Attribute:
    """Build the Name/Attribute chain for a dotted name."""
    head, *rest = name.split(".")
    expr: cst.Name | cst.Attribute = cst.Name(head)
    for part in rest:
        expr = cst.Attribute(value=expr, attr=cst.Name(part))
    return expr


def parent_and_base(module: str) -> tuple[str, str]:
    parent, _, base = module.rpartition(".")
    return parent, base


def path_forms(module: str) -> tuple[str, ...]:
    """How a file path of ``module`` shows up in strings: ``a/b/c.py`` and ``b/c.py``."""
    parts = module.split(".")
    forms = ("/".join(parts) + ".py",)
    if len(parts) > 1:
        forms += (f"{parts[-2]}/{parts[-1]}.py",)
    return forms
