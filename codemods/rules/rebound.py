"""Part of the from-import rule (which owns MMS004): rebound globals, module-level names
that the new module reassigns at run time.

A global like SGLang's ``embedding_cache`` is rebound (``global``) by an init function
after import, so ``from module import embedding_cache``, from the old module or the new
one, captures the value of that moment and never sees the replacement. Such an alias is
taken out of its from-import and every use becomes ``<new module>.embedding_cache``, read
at the time of use. That is only safe when the alias is the one binding of its name in
scope, every use is a plain name, and the name is not re-exported through ``__all__``;
otherwise the import is reported.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata.scope_provider import ImportAssignment

from ..engine.collect import ImportSite
from ..engine.imports import alias_binding
from ..engine.migration import Migration
from ..engine.module_bindings import module_ref
from ..engine.resolve import dotted_expr


def plan_rebound(m: Migration, site: ImportSite, alias: cst.ImportAlias) -> bool:
    """Flag a from-import of a rebound global; rewrite its uses to module attribute
    access when that is safe. Returns True when the alias was taken out."""
    name = alias.name.value
    new = m.facts.new
    bound = alias_binding(alias)
    if m.held(alias, "MMS004"):
        return False
    reason = _unsafe(m, site, bound)
    if reason is None and any(m.held(access.node, "MMS004")
                              for access in _assignment_for(m, site, bound).references):
        reason = "a use is on a line that suppresses MMS004"
    if reason is None:
        ref = module_ref(m, site, new)
        for access in _assignment_for(m, site, bound).references:
            use = access.node
            m.edits.expressions[use] = cst.Attribute(
                value=dotted_expr(ref), attr=cst.Name(name), lpar=use.lpar, rpar=use.rpar
            )
        m.report(alias, "MMS004", name,
                 f"{name!r} is rebound at run time; a from-import keeps a stale value. "
                 f"Uses now read {ref}.{name}", True)
        return True
    m.report(alias, "MMS004", name,
             f"{name!r} is rebound at run time; a from-import keeps a stale value. "
             f"Read it as {new}.{name} instead (not rewritten: {reason})", False)
    return False


def _assignment_for(m: Migration, site: ImportSite, bound: str):
    """The scope analysis' record of ``site`` binding ``bound``, or None."""
    scope = m.facts.scopes.get(site.node)
    if scope is None:
        return None
    for assignment in scope.assignments[bound]:
        if isinstance(assignment, ImportAssignment) and assignment.node is site.node:
            return assignment
    return None


def _unsafe(m: Migration, site: ImportSite, bound: str | None) -> str | None:
    """Why the uses of ``bound`` cannot become attribute reads, or None if they can."""
    if bound is None:
        return "unusual alias"
    scope = m.facts.scopes.get(site.node)
    assignment = _assignment_for(m, site, bound)
    if scope is None or assignment is None:
        return "binding not found"
    if len(list(scope.assignments[bound])) != 1:
        return f"{bound!r} is bound more than once in this scope"
    if bound in m.facts.found.all_names and site.block is m.facts.module:
        return f"{bound!r} is listed in __all__"
    references = list(assignment.references)
    if not references:
        return "no use in this file (a re-export keeps the stale value for importers)"
    if not all(isinstance(r.node, cst.Name) for r in references):
        return "a use is not a plain name"
    return None
