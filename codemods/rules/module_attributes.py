"""Rule: uses of the old module object, ``mm_utils.name`` where ``mm_utils`` is bound to it.

A read of a name that left is redirected to its destination module. When every use of
one binding goes to the same module and nothing else reads the binding, the import
itself is retargeted (``import old as m`` becomes ``import new as m``); otherwise each
use reaches its destination through ``module_ref``. Writes are different: assigning or
patching ``old.name`` of a name the old module still re-exports no longer affects the
code that moved, because that code looks the name up in the new module, so such writes
are reported rather than rewritten. ``old_site_write`` makes that decision for
assignments here and for ``mock.patch`` / ``setattr`` targets in ``calls``. Once
every rule has planned, ``prune_bindings`` drops an import of the old module that no
remaining use needs.
"""

from __future__ import annotations

import libcst as cst

from ..engine.collect import ImportSite
from ..engine.imports import alias_binding
from ..engine.migration import Migration
from ..engine.module_bindings import module_ref, optional_binding, resolve_module
from ..engine.resolve import dotted_expr, dotted_name, parent_and_base
from ..fastpath.scan import Scan
from .from_imports import move_code, report_gone, report_move
from .rule import Rule


def plan_module_attributes(m: Migration) -> None:
    facts, edits = m.facts, m.edits
    if not facts.found.attributes or not facts.binds_old_module:
        return
    uses: dict[int, list[tuple[cst.Attribute, str, str]]] = {}
    assignments: dict[int, object] = {}
    for attribute in facts.found.attributes:
        module, refs = resolve_module(m, attribute.value)
        name = attribute.attr.value
        if module is None and name not in facts.map.gone and optional_binding(m, attribute.value):
            binding = dotted_name(attribute.value)
            m.report(attribute, "MMS011", name,
                     f"{binding}.{name}: {binding} is {facts.old} when its import succeeds and a "
                     f"fallback value otherwise; {name!r} moved to {facts.map.destination(name)}: "
                     "import that module the same way and use it here (not rewritten)", False)
            continue
        if module != facts.old:
            continue
        if name in facts.map.gone:
            report_gone(m, attribute, name)
            continue
        if attribute in facts.found.stores:
            old_site_write(m, attribute, name, attribute.value, refs, "assignment")
            continue
        if len(refs) != 1:
            first = _earliest_binding(m, refs)
            if first is None:
                m.report(attribute, "MMS007", name,
                         f"{name!r} is reached through a name bound to {facts.old} in "
                         "several blocks; not rewritten", False)
                continue
            refs = [first]
        if m.held(attribute, move_code(m.facts.map, name)):
            continue  # left as written: the binding keeps a use, so it stays too
        uses.setdefault(id(refs[0]), []).append((attribute, name, facts.map.destination(name)))
        assignments[id(refs[0])] = refs[0]
    _through_attribute_holders(m)
    for key, group in uses.items():
        assignment = assignments[key]
        site = facts.site_of(assignment.node)
        if site is None:
            continue
        if not _move_binding_whole(m, site, assignment, group):
            for attribute, _name, dest in group:
                ref = module_ref(m, site, dest)
                edits.expressions[attribute] = attribute.with_changes(value=dotted_expr(ref))
                edits.rewritten_uses.add(id(attribute.value))
            edits.touched_bindings[key] = (assignment, site)
        for attribute, name, dest in group:
            report_move(m, attribute, name, dest, "attribute")


def _earliest_binding(m: Migration, refs):
    """Of several imports binding the old module to one name in one block, the first:
    a binding added next to it is visible wherever any of them is."""
    sites = [m.facts.site_of(r.node) for r in refs]
    if any(s is None for s in sites) or len({id(s.block) for s in sites}) != 1:
        return None
    return min(zip(sites, refs), key=lambda pair: pair[0].index)[1]


def _move_binding_whole(m: Migration, site: ImportSite, assignment, group) -> bool:
    """All uses of the binding moved to one module: retarget the import itself."""
    facts, edits = m.facts, m.edits
    dests = {dest for _, _, dest in group}
    if len(dests) != 1 or id(site) in edits.kept_sites:
        return False
    dest = dests.pop()
    if not facts.only_binding(site, assignment.name, own_scope=True):
        return False
    used = {id(attribute.value) for attribute, _, _ in group}
    references = list(assignment.references)
    if not references or any(id(r.node) not in used for r in references):
        return False
    if assignment.name in facts.found.all_names and site.block is facts.module:
        return False
    node = edits.current(site.node)
    parent, base = parent_and_base(dest)
    if isinstance(node, cst.ImportFrom):
        if edits.module_of(site) != parent:
            return False
        for i, alias in enumerate(node.names):
            if alias_binding(alias) != assignment.name or not isinstance(alias.name, cst.Name):
                continue
            rename = alias.asname is None
            if rename and base in edits.taken_names:
                return False
            names = list(node.names)
            names[i] = alias.with_changes(name=cst.Name(base))
            edits.statements[site.node] = node.with_changes(names=names)
            if rename:
                edits.taken_names.add(base)
                for attribute, _, _ in group:
                    edits.expressions[attribute] = attribute.with_changes(value=cst.Name(base))
            return True
        return False
    for i, alias in enumerate(node.names):
        full = dotted_name(alias.name)
        if full != facts.old:
            continue
        if alias.asname is None and assignment.name != facts.old:
            return False
        names = list(node.names)
        names[i] = alias.with_changes(name=dotted_expr(dest))
        edits.statements[site.node] = node.with_changes(names=names)
        if alias.asname is None:
            for attribute, _, _ in group:
                edits.expressions[attribute] = attribute.with_changes(value=dotted_expr(dest))
        return True
    return False


def _through_attribute_holders(m: Migration) -> None:
    """``self.mm = mm_utils`` and later ``self.mm.name``: the attribute holds the old
    module, which scope analysis cannot follow; a moved name read through it is reported."""
    facts = m.facts
    holders = {}
    for held, value in facts.found.attribute_holders:
        module, _ = resolve_module(m, value)
        holders[held] = holders.get(held, module) if holders.get(held, module) == module else None
    old_holders = {held for held, module in holders.items() if module == facts.old}
    if not old_holders:
        return
    for attribute in facts.found.attributes:
        held, name = dotted_name(attribute.value), attribute.attr.value
        if held in old_holders and name in facts.map.interesting and attribute not in facts.found.stores:
            if m.held(attribute, "MMS007"):
                continue
            m.report(attribute, "MMS007", name,
                     f"{held}.{name}: {held} holds {facts.old} (assigned from it); {name!r} moved "
                     f"to {facts.map.destination(name)}; not rewritten", False)


def old_site_write(m: Migration, node, name: str, obj, refs, how: str) -> None:
    """A patch or assignment of ``old.name``: moved-only names are retargeted,
    re-exported and import-only names reported (old and new site differ)."""
    facts, edits = m.facts, m.edits
    old, new, move_map = facts.old, facts.new, facts.map
    moved = name in move_map.moved
    if moved and name not in move_map.reexported:
        if obj is None:
            return
        site = facts.site_of(refs[0].node) if len(refs) == 1 else None
        if site is None:
            m.report(node, "MMS005", name, f"{how} of {old}.{name}: {name!r} now lives "
                     f"in {new}; patch it there (binding not resolvable)", False)
            return
        if m.held(node, move_code(m.facts.map, name)):
            return
        edits.expressions[obj] = dotted_expr(module_ref(m, site, new))
        edits.rewritten_uses.add(id(obj))
        edits.touched_bindings[id(refs[0])] = (refs[0], site)
        report_move(m, node, name, new, how)
        return
    if moved:
        # who reads the name where decides which patch reaches the code that calls it
        lookers = move_map.looked_up_in.get(name, (new,))
        if new not in lookers:
            return  # callers look it up in the old module (or nowhere inside): still effective
        if old in lookers:
            message = (f"{how} of {old}.{name} reaches only the callers in {old}; code in {new} "
                       f"looks {name!r} up there: patch {new}.{name} as well")
        else:
            message = (f"{how} of {old}.{name}: the re-export still resolves, but the code that "
                       f"calls {name!r} now lives in {new} and looks it up there; patch {new}.{name}")
    else:
        message = (f"{how} of {old}.{name}: {old} no longer binds {name!r}; patch it "
                   f"where the code that uses it looks it up (probably {new})")
    m.report(node, "MMS005", name, message, False)


CODES = {
    "MMS005": ('old-site-patch', "patch or assignment at the name's old look-up site; code that now lives in the new module does not see it"),
    "MMS011": ('optional-import', 'the old module is bound by an import that may fail (a fallback binds the name otherwise); uses of moved names through it are not rewritten'),
}


def trigger(scan: Scan) -> bool:
    return scan.reads_moved(scan.attributes)


RULE = Rule('module-attributes', plan_module_attributes, trigger, CODES)
