"""One CPython ``ast`` walk over a file, kept as the few facts the rules' triggers read.

``ast`` is about ten times cheaper than a libcst tree with scope analysis, so every rule
states, from these facts alone, whether it could edit or report anything in the file
(its ``trigger``). A trigger may say yes too often, never too rarely.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from ..engine.resolve import absolute_module, may_bind, parent_and_base, path_forms
from ..movemap.schema import MoveMap

_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class MapFacts:
    """What of the move map the triggers compare a file against."""

    old: str
    new: str
    old_base: str
    interesting: frozenset[str]  # names that left the old module
    rebound: frozenset[str]  # module-level names the new module rebinds at run time
    rebound_sources: frozenset[str]  # modules such a global may be from-imported from
    path_forms: tuple[str, ...]

    @classmethod
    def of(cls, move_map: MoveMap) -> MapFacts:
        old = move_map.old_module
        return cls(
            old=old,
            new=move_map.new_module,
            old_base=parent_and_base(old)[1],
            interesting=move_map.interesting,
            rebound=move_map.rebound_globals,
            rebound_sources=frozenset({old, move_map.new_module}),
            path_forms=path_forms(old),
        )


@dataclass
class Scan:
    facts: MapFacts
    from_imports: list[tuple[str, frozenset[str]]] = field(default_factory=list)  # absolute module, names
    binds_old_module: bool = False  # some import may bind the old module or a package above it
    attributes: set[str] = field(default_factory=set)  # ``x.<attr>`` anywhere
    keywords: set[str] = field(default_factory=set)  # ``f(<keyword>=...)`` anywhere
    strings: list[str] = field(default_factory=list)  # every str constant

    @classmethod
    def of(cls, tree: ast.AST, facts: MapFacts, package: str | None) -> Scan:
        scan = cls(facts)
        old = facts.old
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = absolute_module(package, node.level, node.module)
                if module is None:
                    continue
                names = frozenset(a.name for a in node.names)
                scan.from_imports.append((module, names))
                if not scan.binds_old_module and any(may_bind(old, n, module) for n in names):
                    scan.binds_old_module = True
            elif isinstance(node, ast.Import):
                if not scan.binds_old_module and any(may_bind(old, a.name) for a in node.names):
                    scan.binds_old_module = True
            elif isinstance(node, ast.Attribute):
                scan.attributes.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                scan.keywords.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                scan.strings.append(node.value)
        return scan

    def names_old_module(self, text: str) -> bool:
        """``text`` is the old module's dotted name or starts a dotted path inside it."""
        return text == self.facts.old or self.facts.old + "." in text

    def reads_moved(self, words) -> bool:
        """Some of ``words`` left the old module and the file may reach it through a binding."""
        return self.binds_old_module and not self.facts.interesting.isdisjoint(words)

    def words_in(self, text: str) -> list[str]:
        return _WORDS.findall(text)
