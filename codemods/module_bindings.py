"""How the plan reaches module objects: resolving them, and binding new ones.

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
from .imports import alias_binding, module_binding_import, with_aliases
from .resolve import dotted_expr, dotted_name, parent_and_base
from .state import FileState


class ModuleBindings(FileState):
    def _free_name(self, base: str) -> str:
        name, k = base, 1
        while name in self.names_seen:
            name, k = f"{base}_{k}", k + 1
        self.names_seen.add(name)
        return name

    def _single_binding(self, site: ImportSite, name: str) -> bool:
        """An existing binding is reused only if nothing else binds the name in its scope."""
        scope = self.scopes.get(site.node)
        return scope is not None and len(list(scope[name])) == 1

    def module_ref(self, site: ImportSite, dest: str) -> str:
        """A dotted expression that reaches module ``dest`` wherever ``site``'s bindings
        are visible: an existing binding in the same block, or one added next to ``site``."""
        dotted_style = isinstance(site.node, cst.Import) and all(a.asname is None for a in site.node.names)
        key = (id(site.block), site.index, dest, dotted_style)
        if key in self._module_refs:
            return self._module_refs[key]
        parent, base = parent_and_base(dest)
        ref = None
        for other in self.sites:
            if other.block is not site.block or other.index > site.index or other.node in self.deleted:
                continue
            node = self._current(other.node)
            if isinstance(node, cst.Import):
                for alias in node.names:
                    if dotted_name(alias.name) != dest:
                        continue
                    if alias.asname is None and self._single_binding(other, dest.split(".")[0]):
                        ref = dest
                    elif alias.asname is not None and self._single_binding(other, alias_binding(alias)):
                        ref = alias_binding(alias)
            elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
                if self.current_module.get(other.node, other.module) != parent:
                    continue
                for alias in node.names:
                    if isinstance(alias.name, cst.Name) and alias.name.value == base:
                        bound = alias_binding(alias)
                        # a name this run added is absent from the scope analysis (made on
                        # the original tree), and it was chosen to be free, so trust it
                        if bound in self._fresh or (bound and self._single_binding(other, bound)):
                            ref = bound
            if ref:
                break
        if ref is None:
            ref = next(
                (r for block, index, module, r in self._added
                 if block is site.block and index <= site.index and module == dest
                 and (r == dest) == dotted_style),
                None,
            )
        if ref is None:
            ref = self._add_binding(site, dest, dotted_style)
            self._added.append((site.block, site.index, dest, ref))
        self._module_refs[key] = ref
        return ref

    def _add_binding(self, site: ImportSite, dest: str, dotted_style: bool) -> str:
        parent, base = parent_and_base(dest)
        node = site.node
        if dotted_style:
            self.after_bindings.setdefault(node, []).append(
                cst.Import(names=[cst.ImportAlias(name=dotted_expr(dest))])
            )
            return dest
        name = self._free_name(base)
        self._fresh.add(name)
        current = self._current(node)
        if (
            isinstance(current, cst.ImportFrom)
            and not isinstance(current.names, cst.ImportStar)
            and self.current_module.get(node, site.module) == parent
            and node not in self.deleted
        ):
            alias = cst.ImportAlias(
                name=cst.Name(base), asname=cst.AsName(name=cst.Name(name)) if name != base else None
            )
            holder = cst.ImportFrom(module=cst.Name("_"), names=[alias])
            self.current[node] = with_aliases(
                current, [(a, None) for a in current.names] + [(alias, holder)]
            )
            return name
        self.after_bindings.setdefault(node, []).append(
            module_binding_import(dest, name, current, self.package)
        )
        return name

    def _assignment_module(self, assignment) -> str | None:
        if not isinstance(assignment, ImportAssignment):
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
            site = self._site_of(node)
            module = site.module if site else None
            if module is None:
                return None
            for alias in node.names:
                if alias_binding(alias) == assignment.name and isinstance(alias.name, cst.Name):
                    return f"{module}.{alias.name.value}"
        return None

    def resolve_module(self, expr: cst.BaseExpression):
        """(dotted module the expression evaluates to, import assignments) or (None, ())."""
        refs = self.referents.get(expr)
        if refs is not None:
            paths = {self._assignment_module(a) for a in refs}
            if len(paths) == 1 and None not in paths and refs:
                return paths.pop(), refs
            return None, ()
        if isinstance(expr, cst.Attribute):
            base, refs = self.resolve_module(expr.value)
            if base is not None:
                return f"{base}.{expr.attr.value}", refs
        return None, ()

    def _binds_old_module(self) -> bool:
        """Whether any import could bind the old module object (or a package above it).
        Without one no expression can evaluate to it, so scope analysis is skipped."""
        old_prefixes = set()
        parts = self.old.split(".")
        for i in range(len(parts)):
            old_prefixes.add(".".join(parts[: i + 1]))
        for site in self.sites:
            node = site.node
            if isinstance(node, cst.Import):
                if any((dotted_name(a.name) or "") in old_prefixes
                       or (dotted_name(a.name) or "").startswith(self.old + ".")
                       for a in node.names):
                    return True
            elif site.module and not isinstance(node.names, cst.ImportStar):
                if any(isinstance(a.name, cst.Name) and f"{site.module}.{a.name.value}" in old_prefixes
                       for a in node.names):
                    return True
        return False
