"""How rules reach module objects: resolving them, and binding new ones.

Uses are resolved by what a name is bound to, never by its text: ``resolve_module``
follows scope analysis from an expression to the import that bound it, so a module
that merely shares the old module's basename is never touched. When a rewritten use
must reach another module, ``module_ref`` prefers a binding the file already has in
the same block (one that nothing rebinds) and otherwise adds one at the import that
made the old binding (an extra alias when that import already reads from the parent
package, else a statement right after it), so the new name is visible wherever the old
one was. A binding added once is reused by every later use in that block.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata.scope_provider import ImportAssignment

from .collect import ImportSite
from .facts import PlainImport
from .imports import alias_binding, module_binding_import, with_aliases
from .migration import Migration
from .resolve import dotted_expr, dotted_name, parent_and_base


def free_name(m: Migration, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``... whichever the file does not use yet."""
    taken = m.edits.taken_names
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def single_binding(m: Migration, site: ImportSite, name: str) -> bool:
    """An existing binding is reused only if nothing else binds the name in its scope."""
    return m.facts.only_binding(site, name)


def module_ref(m: Migration, site: ImportSite, dest: str) -> str:
    """A dotted expression that reaches module ``dest`` wherever ``site``'s bindings are
    visible: an existing binding in the same block, or one added next to ``site``."""
    edits = m.edits
    dotted_style = isinstance(site.node, cst.Import) and all(a.asname is None for a in site.node.names)
    key = (id(site.block), site.index, dest, dotted_style)
    if key in edits.module_refs:
        return edits.module_refs[key]
    ref = _existing_ref(m, site, dest)
    if ref is None:
        ref = next(
            (r for block, index, module, r in edits.added_bindings
             if block is site.block and index <= site.index and module == dest
             and (r == dest) == dotted_style),
            None,
        )
    if ref is None:
        ref = _add_binding(m, site, dest, dotted_style)
        edits.added_bindings.append((site.block, site.index, dest, ref))
    edits.module_refs[key] = ref
    return ref


def _existing_ref(m: Migration, site: ImportSite, dest: str) -> str | None:
    """A binding of ``dest`` made at or before ``site`` in its block that nothing rebinds."""
    edits = m.edits
    parent, base = parent_and_base(dest)
    for other in m.facts.sites:
        if other.block is not site.block or other.index > site.index or other.node in edits.deleted:
            continue
        node = edits.current(other.node)
        ref = None
        if isinstance(node, cst.Import):
            for alias in node.names:
                if dotted_name(alias.name) != dest:
                    continue
                if alias.asname is None and single_binding(m, other, dest.split(".")[0]):
                    ref = dest
                elif alias.asname is not None and single_binding(m, other, alias_binding(alias)):
                    ref = alias_binding(alias)
        elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            if edits.module_of(other) != parent:
                continue
            for alias in node.names:
                if isinstance(alias.name, cst.Name) and alias.name.value == base:
                    bound = alias_binding(alias)
                    # a name this run added is absent from the scope analysis (made on
                    # the original tree), and it was chosen to be free, so trust it
                    if bound in edits.fresh_names or (bound and single_binding(m, other, bound)):
                        ref = bound
        if ref:
            return ref
    return None


def _add_binding(m: Migration, site: ImportSite, dest: str, dotted_style: bool) -> str:
    edits = m.edits
    parent, base = parent_and_base(dest)
    node = site.node
    if dotted_style:
        _add_statement(m, site, cst.Import(names=[cst.ImportAlias(name=dotted_expr(dest))]))
        return dest
    name = free_name(m, _alias_like(m, site, base))
    edits.fresh_names.add(name)
    current = edits.current(node)
    if (
        isinstance(current, cst.ImportFrom)
        and not isinstance(current.names, cst.ImportStar)
        and edits.module_of(site) == parent
        and node not in edits.deleted
    ):
        alias = cst.ImportAlias(
            name=cst.Name(base), asname=cst.AsName(name=cst.Name(name)) if name != base else None
        )
        holder = cst.ImportFrom(module=cst.Name("_"), names=[alias])
        edits.statements[node] = with_aliases(
            current, [(a, None) for a in current.names] + [(alias, holder)]
        )
        return name
    _add_statement(m, site, module_binding_import(dest, name, current, m.facts.package))
    return name


def _statement_key(statement: cst.CSTNode) -> str:
    if isinstance(statement, cst.Import):
        return (dotted_name(statement.names[0].name) or "").lower()
    if isinstance(statement, cst.ImportFrom):
        return ("." * len(statement.relative) + (dotted_name(statement.module) or "")).lower()
    return ""


def _add_statement(m: Migration, site: ImportSite, statement: cst.BaseSmallStatement) -> None:
    """``statement`` next to ``site``: before it when import sorting puts it first (and
    the import has a line of its own), else after it."""
    edits = m.edits
    current = edits.current(site.node)
    own_line = isinstance(site.line, cst.SimpleStatementLine) and len(site.line.body) == 1
    if own_line and type(statement) is type(current) and _statement_key(statement) < _statement_key(current):
        edits.placed_before.setdefault(site.node, []).append(statement)
    else:
        edits.bindings_after.setdefault(site.node, []).append(statement)


def _alias_like(m: Migration, site: ImportSite, base: str) -> str:
    """The name for a new binding of module ``base``: the user's alias for the old module
    with the old base name swapped (``mm_utils_mod`` -> ``mm_schedule_mod``), so both
    read alike; the plain base name otherwise."""
    old_parent, old_base = parent_and_base(m.facts.old)
    for alias in site.node.names if not isinstance(site.node.names, cst.ImportStar) else ():
        bound = alias_binding(alias)
        if alias.asname is None or not bound or old_base not in bound or bound == old_base:
            continue
        binds_old = (dotted_name(alias.name) == m.facts.old if isinstance(site.node, cst.Import)
                     else site.module == old_parent and dotted_name(alias.name) == old_base)
        if binds_old:
            return bound.replace(old_base, base)
    return base


def _assignment_module(m: Migration, assignment) -> str | None:
    """The dotted module an import assignment binds its name to, or None."""
    if not isinstance(assignment, (ImportAssignment, PlainImport)):
        return None
    node = assignment.node
    if isinstance(node, cst.Import):
        for alias in node.names:
            full = dotted_name(alias.name) or ""
            if alias.asname is not None:
                if alias_binding(alias) == assignment.name:
                    return full
            elif full == assignment.name or full.startswith(assignment.name + "."):
                return assignment.name
        return None
    if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        site = m.facts.site_of(node)
        module = site.module if site else None
        if module is None:
            return None
        for alias in node.names:
            if alias_binding(alias) == assignment.name and isinstance(alias.name, cst.Name):
                return f"{module}.{alias.name.value}"
    return None


def resolve_module(m: Migration, expr: cst.BaseExpression):
    """(dotted module the expression evaluates to, import assignments) or (None, ())."""
    refs = m.facts.referents_of(expr)
    if refs is not None:
        paths = {_assignment_module(m, a) for a in refs}
        if len(paths) == 1 and None not in paths and refs:
            return paths.pop(), refs
        return None, ()
    if isinstance(expr, cst.Attribute):
        base, refs = resolve_module(m, expr.value)
        if base is not None:
            return f"{base}.{expr.attr.value}", refs
    return None, ()


def optional_binding(m: Migration, expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is a name that imports bind to the old module and a plain
    assignment binds otherwise (``try: import old as m`` / ``except ImportError: m = None``)."""
    refs = m.facts.referents_of(expr)
    if not refs:
        return False
    imports = [r for r in refs if isinstance(r, (ImportAssignment, PlainImport))]
    return bool(imports) and len(imports) < len(refs) and all(
        _assignment_module(m, r) == m.facts.old for r in imports
    )
