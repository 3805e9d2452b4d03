"""Findings as rules raise them: against nodes, turned into positions once at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .move_map import MoveMap


@dataclass(eq=False)
class Reporter:
    map: MoveMap
    # (node, code, symbol, message, fixed, lines below the node's start), in the order
    # rules raised them
    raw: list[tuple[cst.CSTNode, str, str, str, bool, int]] = field(default_factory=list)

    def __call__(self, node: cst.CSTNode, code: str, symbol: str, message: str, fixed: bool,
                 line_offset: int = 0) -> None:
        self.raw.append((node, code, symbol, message, fixed, line_offset))

    def move(self, node: cst.CSTNode, name: str, dest: str, how: str) -> None:
        """A rewrite of ``name`` to ``dest``, worded by what kind of move it is."""
        old = self.map.old_module
        if name in self.map.import_origins and name not in self.map.moved:
            self(node, "MMS003", name,
                 f"{how}: {old} only imported {name!r}; now from its origin {dest}", True)
        elif self.map.moved[name].private:
            self(node, "MMS002", name,
                 f"{how}: private {name!r} moved to {dest}; it is private there and may "
                 "change without notice", True)
        else:
            self(node, "MMS001", name, f"{how}: {name!r} moved to {dest}", True)

    def gone(self, node: cst.CSTNode, name: str) -> None:
        """A use of a name the old module no longer binds and that has no new home."""
        old = self.map.old_module
        statement = self.map.unmapped_imports.get(name)
        if statement is not None:
            self(node, "MMS010", name, f"{old} no longer binds {name!r}; it came from "
                 f"'{statement}', bind it the same way here", False)
        elif name in self.map.earlier:
            self(node, "MMS009", name, f"{name!r} is gone from {old}: {self.map.earlier[name]}; "
                 "rewrite this use by hand", False)
        else:
            self(node, "MMS009", name, f"{name!r} was removed from {old} and has no "
                 "new home; rewrite this use by hand", False)
