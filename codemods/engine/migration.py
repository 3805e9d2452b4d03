"""One file's migration: the facts read from it, the edits planned so far, the findings."""

from __future__ import annotations

from collections.abc import Collection
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
    selected: Collection[str] | None = None  # the codes the run acts on; None: the default

    @classmethod
    def start(cls, module: cst.Module, move_map: MoveMap, package: str | None, path: str,
              suppressions: Suppressions | None = None,
              selected: Collection[str] | None = None, source: bytes | None = None) -> Migration:
        facts = FileFacts.read(module, move_map, package, path, source)
        return cls(facts, Edits(taken_names=set(facts.found.names_seen)), Reporter(),
                   suppressions, selected)

    def held(self, node: cst.CSTNode, code: str) -> bool:
        """Whether ``code`` is held back at ``node``: not selected for the run, or
        suppressed by a comment on ``node``'s logical line. The rule then neither edits
        ``node`` nor reports it. Rules ask before planning an edit; findings that edit
        nothing are filtered at the end."""
        if self.selected is not None and code not in self.selected:
            return True
        if self.suppressions is None:
            return False
        # every line of a logical line is covered by its comments: the first stands for all
        return self.suppressions.take(self.facts.first_line(node), code)
