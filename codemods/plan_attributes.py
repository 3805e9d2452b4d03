"""Uses of the old module object: ``mm_utils.name`` where ``mm_utils`` is bound to it.

A read of a name that left is redirected to its destination module. When every use of
one binding goes to the same module and nothing else reads the binding, the import
itself is retargeted (``import old as m`` becomes ``import new as m``); otherwise each
use reaches its destination through ``module_ref``. Writes are different: assigning or
patching ``old.name`` of a name the old module still re-exports no longer affects the
code that moved, because that code looks the name up in the new module, so such writes
are reported rather than rewritten. ``_old_site_write`` makes that decision for
assignments here and for ``mock.patch`` / ``setattr`` targets in ``plan_calls``. Once
every phase has planned, ``prune_unused_module_bindings`` drops an import of the old
module that no remaining use needs.
"""

from __future__ import annotations

import libcst as cst

from .collect import ImportSite
from .imports import alias_binding, with_aliases
from .module_bindings import ModuleBindings
from .resolve import dotted_expr, dotted_name, parent_and_base


class AttributePlanning(ModuleBindings):
    def plan_module_attributes(self) -> None:
        if not self.attributes or not self._binds_old_module():
            return
        uses: dict[int, list[tuple[cst.Attribute, str, str]]] = {}
        assignments: dict[int, object] = {}
        for attribute in self.attributes:
            module, refs = self.resolve_module(attribute.value)
            if module != self.old:
                continue
            name = attribute.attr.value
            if name in self.gone:
                self.report_gone(attribute, name)
                continue
            if attribute in self.stores:
                self._old_site_write(attribute, name, attribute.value, refs, "assignment")
                continue
            if len(refs) != 1:
                first = self._earliest_binding(refs)
                if first is None:
                    self.report(attribute, "MMS007", name,
                                f"{name!r} is reached through a name bound to {self.old} in "
                                "several blocks; not rewritten", False)
                    continue
                refs = [first]
            uses.setdefault(id(refs[0]), []).append((attribute, name, self.map.destination(name)))
            assignments[id(refs[0])] = refs[0]
        for key, group in uses.items():
            assignment = assignments[key]
            site = self._site_of(assignment.node)
            if site is None:
                continue
            if not self._move_binding_whole(site, assignment, group):
                for attribute, _name, dest in group:
                    ref = self.module_ref(site, dest)
                    self.expr[attribute] = attribute.with_changes(value=dotted_expr(ref))
                    self._rewritten_uses.add(id(attribute.value))
                self._touched[key] = (assignment, site)
            for attribute, name, dest in group:
                self.report_move(attribute, name, dest, "attribute")

    def _earliest_binding(self, refs):
        """Of several imports binding the old module to one name in one block, the first:
        a binding added next to it is visible wherever any of them is."""
        sites = [self._site_of(r.node) for r in refs]
        if any(s is None for s in sites) or len({id(s.block) for s in sites}) != 1:
            return None
        return min(zip(sites, refs), key=lambda pair: pair[0].index)[1]

    def _move_binding_whole(self, site: ImportSite, assignment, group) -> bool:
        """All uses of the binding moved to one module: retarget the import itself."""
        dests = {dest for _, _, dest in group}
        if len(dests) != 1 or id(site) in self._skip_sites:
            return False
        dest = dests.pop()
        scope = self.scopes.get(site.node)
        if scope is None or len(list(scope.assignments[assignment.name])) != 1:
            return False
        used = {id(attribute.value) for attribute, _, _ in group}
        references = list(assignment.references)
        if not references or any(id(r.node) not in used for r in references):
            return False
        if assignment.name in self.all_names and site.block is self.module:
            return False
        node = self._current(site.node)
        parent, base = parent_and_base(dest)
        if isinstance(node, cst.ImportFrom):
            if self.current_module.get(site.node, site.module) != parent:
                return False
            for i, alias in enumerate(node.names):
                if alias_binding(alias) != assignment.name or not isinstance(alias.name, cst.Name):
                    continue
                rename = alias.asname is None
                if rename and base in self.names_seen:
                    return False
                names = list(node.names)
                names[i] = alias.with_changes(name=cst.Name(base))
                self.current[site.node] = node.with_changes(names=names)
                if rename:
                    self.names_seen.add(base)
                    for attribute, _, _ in group:
                        self.expr[attribute] = attribute.with_changes(value=cst.Name(base))
                return True
            return False
        for i, alias in enumerate(node.names):
            full = dotted_name(alias.name)
            if full != self.old:
                continue
            if alias.asname is None and assignment.name != self.old:
                return False
            names = list(node.names)
            names[i] = alias.with_changes(name=dotted_expr(dest))
            self.current[site.node] = node.with_changes(names=names)
            if alias.asname is None:
                for attribute, _, _ in group:
                    self.expr[attribute] = attribute.with_changes(value=dotted_expr(dest))
            return True
        return False

    def prune_unused_module_bindings(self) -> None:
        """Drop an import of the old module whose every use was rewritten (it would be
        left unused); one that still has a use, or feeds ``__all__``, stays."""
        for assignment, site in self._touched.values():
            if site.node in self.deleted or id(site) in self._skip_sites:
                continue
            references = list(assignment.references)
            if not references or any(id(r.node) not in self._rewritten_uses for r in references):
                continue
            if assignment.name in self.all_names and site.block is self.module:
                continue
            node = self._current(site.node)
            if isinstance(node, cst.Import) and any(a.asname is None for a in node.names):
                continue  # ``import a.b.c`` also binds ``a`` for other uses
            keep = [a for a in node.names if alias_binding(a) != assignment.name]
            if len(keep) == len(node.names):
                continue
            if keep:
                self.current[site.node] = (
                    with_aliases(node, [(a, None) for a in keep])
                    if isinstance(node, cst.ImportFrom)
                    else node.with_changes(names=[*keep[:-1], keep[-1].with_changes(
                        comma=cst.MaybeSentinel.DEFAULT)])
                )
            elif site.node in self.after_bindings or site.node in self.after:
                self.deleted.add(site.node)

    def _old_site_write(self, node, name: str, obj, refs, how: str) -> None:
        """A patch or assignment of ``old.name``: moved-only names are retargeted,
        re-exported and import-only names reported (old and new site differ)."""
        moved = name in self.map.moved
        if moved and name not in self.map.reexported:
            if obj is None:
                return
            site = self._site_of(refs[0].node) if len(refs) == 1 else None
            if site is None:
                self.report(node, "MMS005", name, f"{how} of {self.old}.{name}: {name!r} now lives "
                            f"in {self.new}; patch it there (binding not resolvable)", False)
                return
            self.expr[obj] = dotted_expr(self.module_ref(site, self.new))
            self._rewritten_uses.add(id(obj))
            self._touched[id(refs[0])] = (refs[0], site)
            self.report_move(node, name, self.new, how)
            return
        if moved:
            message = (f"{how} of {self.old}.{name}: the re-export still resolves, but code in "
                       f"{self.new} looks {name!r} up there; patch {self.new}.{name} (and "
                       f"{self.old}.{name} only for callers left in {self.old})")
        else:
            message = (f"{how} of {self.old}.{name}: {self.old} no longer binds {name!r}; patch it "
                       f"where the code that uses it looks it up (probably {self.new})")
        self.report(node, "MMS005", name, message, False)
