"""One file's migration: the facts read from it, the edits planned so far, the findings."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..movemap.schema import MoveMap
from ..report.reporter import Reporter
from ..report.suppression import Suppressions
from .edits import Edits
from .facts import FileFacts


@dataclass(eq=False)
class Migration:
    facts: FileFacts
    edits: Edits
    report: Reporter
    suppressions: Suppressions | None = None

    @classmethod
    def start(cls, module: cst.Module, move_map: MoveMap, package: str | None, path: str,
              suppressions: Suppressions | None = None) -> Migration:
        facts = FileFacts.read(module, move_map, package, path)
        return cls(facts, Edits(taken_names=set(facts.found.names_seen)), Reporter(move_map),
                   suppressions)

    def held(self, node: cst.CSTNode, code: str) -> bool:
        """Whether a suppression comment on one of ``node``'s lines holds back ``code``
        there: the rule then neither edits ``node`` nor reports it. Rules ask before
        planning an edit; findings that edit nothing are filtered at the end."""
        if self.suppressions is None:
            return False
        start, end = self.facts.line_span(node)
        return self.suppressions.take(range(start, end + 1), code)
