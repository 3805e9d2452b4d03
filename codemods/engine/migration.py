"""One file's migration: the facts read from it, the edits planned so far, the findings."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..movemap.schema import MoveMap
from ..report.reporter import Reporter
from .edits import Edits
from .facts import FileFacts


@dataclass(eq=False)
class Migration:
    facts: FileFacts
    edits: Edits
    report: Reporter

    @classmethod
    def start(cls, module: cst.Module, move_map: MoveMap, package: str | None, path: str) -> Migration:
        facts = FileFacts.read(module, move_map, package, path)
        return cls(facts, Edits(taken_names=set(facts.found.names_seen)), Reporter(move_map))
