"""Cheap gates in front of the libcst pass.

Most files of a repository never mention the old module: a bytes search skips them
without parsing. Of those that do, most import only names that stayed; a CPython
``ast`` walk (about ten times cheaper than building a libcst tree with scope
analysis) says whether anything could need an edit or a report. Both gates are
conservative: they only ever let through more files than the transform acts on.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .findings import Finding
from .move_map import MoveMap
from .resolve import absolute_module, may_bind, parent_and_base, path_forms

_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class Gate:
    needles: tuple[bytes, ...]
    old: str
    interesting: frozenset[str]  # names that left the old module
    rebound_sources: frozenset[str]  # modules a rebound global may be from-imported from
    rebound: frozenset[str]
    path_forms: tuple[str, ...]
    old_base: str

    @classmethod
    def for_map(cls, move_map: MoveMap) -> Gate:
        old = move_map.old_module
        old_base = parent_and_base(old)[1]
        needles = [old_base.encode()]
        if move_map.rebound_globals:
            needles.append(parent_and_base(move_map.new_module)[1].encode())
        return cls(
            needles=tuple(dict.fromkeys(needles)),
            old=old,
            interesting=move_map.interesting,
            rebound_sources=frozenset({old, move_map.new_module}),
            rebound=move_map.rebound_globals,
            path_forms=path_forms(old),
            old_base=old_base,
        )

    def mentions(self, source: bytes) -> bool:
        return any(needle in source for needle in self.needles)

    def needs_transform(self, source: bytes, package: str | None) -> bool:
        """Whether the libcst pass could edit or report anything in ``source``.

        True as well when ``ast`` cannot parse it: the libcst pass then decides
        (and reports the file as unparsable if it cannot either).
        """
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return True
        binds_old_module = False
        words: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = absolute_module(package, node.level, node.module)
                if module is None:
                    continue
                names = {a.name for a in node.names}
                if module == self.old and ("*" in names or names & self.interesting):
                    return True
                if module in self.rebound_sources and names & self.rebound:
                    return True
                if any(may_bind(self.old, n, module) for n in names):
                    binds_old_module = True
            elif isinstance(node, ast.Import):
                if any(may_bind(self.old, a.name) for a in node.names):
                    binds_old_module = True
            elif isinstance(node, ast.Attribute):
                words.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                words.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if self.old + "." in text or text == self.old:
                    return True
                if any(form in text for form in self.path_forms):
                    return True
                words.add(text)
                if self.old_base in text:  # doctests, string annotations
                    if "from " + self.old in text:
                        return True
                    words.update(_WORDS.findall(text))
        return binds_old_module and not words.isdisjoint(self.interesting)


def fork_warnings(paths: Iterable[str | os.PathLike], move_map: MoveMap) -> list[Finding]:
    """One MMS015 finding per file among ``paths`` that is the old module itself (a fork
    of the upstream package keeps ``.../managers/mm_utils.py``). Imports of the old module
    inside such a tree resolve to that copy; call this before retargeting them."""
    parts = move_map.old_module.split(".")
    suffixes = ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py")
    out = []
    for path in paths:
        posix = Path(path).as_posix()
        if any(posix == s or posix.endswith("/" + s) for s in suffixes):
            out.append(Finding(
                os.fspath(path), 1, 1, "MMS015", move_map.old_module,
                f"this tree has its own {move_map.old_module} ({'/'.join(parts)}.py): imports of it "
                f"inside the tree load this copy, not upstream's; check which names this copy still "
                f"defines before accepting the rewrites to {move_map.new_module}", False,
            ))
    return out
