"""Rewrites of names the old module still re-exports: optional.

``from old import name`` keeps working while the old module binds ``name`` again with
``from new import name``, so moving such a use to the new module is a tidy-up, not a
fix: ``--write`` applies it, and it does not fail ``--check`` unless its code is
selected (ruff's preview rules: present, off by default). The rewrites themselves are
planned by the import and attribute rules, which ask ``code_for`` which code they carry.
Patches of these names are another matter (the old site no longer reaches callers in
the new module) and keep their own codes (``calls``, ``module_attributes``).
"""

from __future__ import annotations

from ..movemap.schema import MoveMap

CODE = "MMS017"

CODES = {
    CODE: ("reexported-name", "name moved to the new module, which the old module still re-exports; reference rewritten (optional: fails --check only when selected)"),
}

# Codes that fail --check only when selected (off by default, like ruff's preview rules).
OPTIONAL_CODES = frozenset({CODE})


def code_for(move_map: MoveMap, name: str) -> str | None:
    """This rule's code for a rewrite of ``name``, or None when the rewrite is not optional."""
    return CODE if name in move_map.reexported else None
