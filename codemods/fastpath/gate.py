"""Cheap gates in front of the libcst pass.

Most files of a repository never mention the old module: a bytes search skips them
without parsing. Of those that do, most import only names that stayed; one CPython
``ast`` walk (``scan.Scan``) and every rule's own trigger say whether anything could need
an edit or a report. The gate is built from the rule table, so a rule cannot be added
without the gate asking it. Both gates are conservative: they only ever let through more
files than the transform acts on.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from .. import rules as rule_table
from ..movemap.schema import MoveMap
from ..rules.rule import Rule
from .scan import MapFacts, Scan


@dataclass(frozen=True)
class Gate:
    needles: tuple[bytes, ...]
    facts: MapFacts
    rules: Sequence[Rule]

    @classmethod
    def for_map(cls, move_map: MoveMap, rules: Sequence[Rule] | None = None) -> Gate:
        facts = MapFacts.of(move_map)
        needles = [facts.old_base.encode()]
        if move_map.rebound_globals:
            needles.append(facts.new.rpartition(".")[2].encode())
        return cls(tuple(dict.fromkeys(needles)), facts,
                   tuple(rule_table.RULES if rules is None else rules))

    def mentions(self, source: bytes) -> bool:
        return any(needle in source for needle in self.needles)

    def needs_transform(self, source: bytes, package: str | None) -> bool:
        """Whether the libcst pass could edit or report anything in ``source``: whether
        some rule's trigger fires.

        True as well when ``ast`` cannot parse it: the libcst pass then decides
        (and reports the file as unparsable if it cannot either).
        """
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return True
        scan = Scan.of(tree, self.facts, package)
        return any(rule.trigger(scan) for rule in self.rules)
