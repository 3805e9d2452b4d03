"""Rule, last in the table: drop an import of the old module that no remaining use needs.

It reads only what the other rules rewrote (``Edits.touched_bindings``), so it never acts
on a file the other rules' triggers let pass by.
"""

from __future__ import annotations

import libcst as cst

from ..engine.imports import alias_binding, with_aliases
from ..engine.migration import Migration
from ..fastpath.scan import Scan
from .rule import Rule


def prune_unused_module_bindings(m: Migration) -> None:
    """Drop an import of the old module whose every use was rewritten (it would be
    left unused); one that still has a use, or feeds ``__all__``, stays."""
    facts, edits = m.facts, m.edits
    for assignment, site in edits.touched_bindings.values():
        if site.node in edits.deleted or id(site) in edits.kept_sites:
            continue
        references = list(assignment.references)
        if not references or any(id(r.node) not in edits.rewritten_uses for r in references):
            continue
        if assignment.name in facts.found.all_names and site.block is facts.module:
            continue
        node = edits.current(site.node)
        if isinstance(node, cst.Import) and any(a.asname is None for a in node.names):
            continue  # ``import a.b.c`` also binds ``a`` for other uses
        keep = [a for a in node.names if alias_binding(a) != assignment.name]
        if len(keep) == len(node.names):
            continue
        if keep:
            edits.statements[site.node] = (
                with_aliases(node, [(a, None) for a in keep])
                if isinstance(node, cst.ImportFrom)
                else node.with_changes(names=[*keep[:-1], keep[-1].with_changes(
                    comma=cst.MaybeSentinel.DEFAULT)])
            )
        elif site.node in edits.bindings_after or site.node in edits.split_off or site.node in edits.placed_before:
            edits.deleted.add(site.node)


CODES: dict[str, tuple[str, str]] = {}


def trigger(scan: Scan) -> bool:
    return False  # acts only on uses another rule rewrote, never on its own


RULE = Rule('prune-bindings', prune_unused_module_bindings, trigger, CODES)
