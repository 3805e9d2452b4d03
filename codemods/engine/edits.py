"""The edits planned for one file, keyed by original nodes; ``apply`` carries them out.

Rules run in a fixed order and a later rule reads what an earlier one planned (a use may
only reach a binding that survives; a name may only merge into an import that stays), so
these tables are the one thing the rules share, and every field is public.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .collect import ImportSite


@dataclass(eq=False)
class Edits:
    # statement -> its new form
    statements: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    # from-import retargeted -> the module it now reads from
    retargeted: dict[cst.CSTNode, str] = field(default_factory=dict)
    # statement -> from-imports split off it, placed right after it
    split_off: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = field(default_factory=dict)
    # statement -> from-imports placed right before it (where import sorting wants them)
    placed_before: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = field(default_factory=dict)
    # statement -> module bindings added right after it (after any split-off imports)
    bindings_after: dict[cst.CSTNode, list[cst.BaseSmallStatement]] = field(default_factory=dict)
    deleted: set[cst.CSTNode] = field(default_factory=set)
    # expression -> its replacement
    expressions: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict)
    # strings a call already accounted for (the string rule skips them)
    handled_strings: set[cst.CSTNode] = field(default_factory=set)
    # import sites left as written (compatibility shims)
    kept_sites: set[int] = field(default_factory=set)
    # every name bound or used in the file, plus the names this run added
    taken_names: set[str] = field(default_factory=set)
    # module bindings this run added; absent from the scope analysis, free by construction
    fresh_names: set[str] = field(default_factory=set)
    # (block, index, module, reference) of each binding this run added
    added_bindings: list[tuple[cst.CSTNode, int, str, str]] = field(default_factory=list)
    # (block id, index, module, dotted style) -> reference already chosen
    module_refs: dict[tuple, str] = field(default_factory=dict)
    # bindings of the old module some use of which was rewritten -> (assignment, site)
    touched_bindings: dict[int, tuple[object, ImportSite]] = field(default_factory=dict)
    # ids of expressions (uses of old-module bindings) that were rewritten
    rewritten_uses: set[int] = field(default_factory=set)

    def current(self, node: cst.CSTNode) -> cst.CSTNode:
        """``node`` as planned so far."""
        return self.statements.get(node, node)

    def module_of(self, site: ImportSite) -> str | None:
        """The module a from-import reads from as planned so far."""
        return self.retargeted.get(site.node, site.module)

    def any(self) -> bool:
        return bool(self.expressions or self.statements or self.split_off
                    or self.bindings_after or self.deleted or self.placed_before)
