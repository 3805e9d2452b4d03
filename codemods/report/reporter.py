"""Findings as rules raise them: against nodes, turned into positions once at the end."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ..movemap.schema import MoveMap

# The codes of a use of a name the map covers, raised through ``move`` and ``gone`` by
# every rule that rewrites or reports such a use.
MOVE_CODES = {
    "MMS001": ('moved-name', 'name moved to the new module; reference rewritten'),
    "MMS002": ('moved-private', 'private name moved to the new module; rewritten, but it is private there and its signature may change between releases'),
    "MMS003": ('import-origin', 'the old module only imported this name and no longer binds it; rewritten to its origin module'),
    "MMS009": ('removed-name', 'name was removed from the old module and has no new home'),
    "MMS010": ('unmapped-import', 'the old module bound this name by an import a plain from-import cannot reproduce; bind it yourself'),
}


@dataclass(eq=False)
class Reporter:
    map: MoveMap
    # (node, code, symbol, message, fixed, lines below the node's start), in the order
    # rules raised them
    raw: list[tuple[cst.CSTNode, str, str, str, bool, int]] = field(default_factory=list)

    def __call__(self, node: cst.CSTNode, code: str, symbol: str, message: str, fixed: bool,
                 line_offset: int = 0) -> None:
        self.raw.append((node, code, symbol, message, fixed, line_offset))

    def move_code(self, name: str) -> str:
        """The code a rewrite of ``name`` is reported with."""
        if name in self.map.import_origins and name not in self.map.moved:
            return "MMS003"
        optional = _optional_code(self.map, name)
        if optional:
            return optional
        return "MMS002" if self.map.moved[name].private else "MMS001"

    def move(self, node: cst.CSTNode, name: str, dest: str, how: str) -> None:
        """A rewrite of ``name`` to ``dest``, worded by what kind of move it is."""
        old = self.map.old_module
        optional = _optional_code(self.map, name)
        if optional:
            self(node, optional, name, f"{how}: {name!r} moved to {dest}; {old} still "
                 "re-exports it, so this rewrite is optional", True)
        elif name in self.map.import_origins and name not in self.map.moved:
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


def _optional_code(move_map: MoveMap, name: str) -> str | None:
    # imported here: the rules package imports this module while it loads
    from ..rules.reexports import code_for

    return code_for(move_map, name)
