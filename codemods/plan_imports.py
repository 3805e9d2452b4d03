"""From-import statements that name the old module (or a rebound global of the new one).

Each name in a from-import of the old module goes to its destination without
disturbing the user's layout: it merges into an earlier from-import of that destination
in the same block if there is one, otherwise the statement itself is retargeted (when
no name stays behind) or a new statement follows it. A statement is merged away only
if that loses no comment. A shim written for both versions
(``try: from new import x`` / ``except ImportError: from old import x``) is left alone.
Star imports of the old module are only reported.
"""

from __future__ import annotations

import libcst as cst

from .collect import ImportSite
from .imports import alias_binding, retarget, with_aliases
from .plan_rebound import ReboundPlanning


class ImportPlanning(ReboundPlanning):
    def _is_compatible_shim(self, site: ImportSite, moving: list[tuple[cst.ImportAlias, str]]) -> bool:
        """``try: from new import x`` / ``except ImportError: from old import x``: leave it."""
        if site.try_ctx is None or site.try_ctx[1] == "other":
            return False
        try_node, side = site.try_ctx
        others = [
            s for s in self.sites
            if s.try_ctx is not None and s.try_ctx[0] is try_node and s.try_ctx[1] not in (side, "other")
            and isinstance(s.node, cst.ImportFrom)
        ]
        if not others:
            return False
        for alias, dest in moving:
            bound = alias_binding(alias)
            if not any(
                s.module == dest and not isinstance(s.node.names, cst.ImportStar)
                and any(alias_binding(a) == bound for a in s.node.names)
                for s in others
            ):
                return False
        return True

    def plan_from_imports(self) -> None:
        """Send each name a from-import of the old module binds to its destination; in
        from-imports of the new module only rebound globals need work."""
        rebound = self.map.rebound_globals
        for site in list(self.sites):
            node = site.node
            if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
                continue
            if site.module == self.new and rebound:
                removed = {
                    id(alias) for alias in node.names
                    if isinstance(alias.name, cst.Name) and alias.name.value in rebound
                    and self._plan_rebound(site, alias)
                }
                if removed:
                    self._split(site, [], removed)
                continue
            if site.module != self.old:
                continue
            moving: list[tuple[cst.ImportAlias, str]] = []
            for alias in node.names:
                name = alias.name.value if isinstance(alias.name, cst.Name) else None
                dest = self.map.destination(name) if name else None
                if dest:
                    moving.append((alias, dest))
                elif name in self.gone:
                    self.report_gone(alias, name)
            if not moving or self._is_compatible_shim(site, moving):
                if moving:
                    self._skip_sites.add(id(site))
                continue
            removed: set[int] = set()
            for alias, _dest in moving:
                if alias.name.value in rebound and self._plan_rebound(site, alias):
                    removed.add(id(alias))
            self._split(site, [(a, d) for a, d in moving if id(a) not in removed], removed)

    def _split(self, site: ImportSite, moving: list[tuple[cst.ImportAlias, str]], removed: set[int]) -> None:
        """Move the ``moving`` aliases to their destinations and drop the ``removed`` ones.
        With nothing staying, the statement itself takes the first destination (or merges
        away); every other destination merges into an earlier import of it in the same
        block or gets a statement of its own right after this one."""
        node = site.node
        assert isinstance(node, cst.ImportFrom)
        moving_ids = {id(a) for a, _ in moving}
        staying = [a for a in self._current(node).names if id(a) not in moving_ids | removed]
        groups: dict[str, list[cst.ImportAlias]] = {}
        for alias, dest in moving:
            groups.setdefault(dest, []).append(alias)
            self.report_move(alias, alias.name.value, dest, "import")
        if not groups:
            if removed:
                if staying:
                    self.current[node] = with_aliases(self._current(node), [(a, None) for a in staying])
                else:
                    self.deleted.add(node)
            return
        order = list(groups)
        if not staying:
            first = order.pop(0)
            target = self._merge_target(site, first)
            if target is not None and self._removable(site):
                self._merge_into(target, groups[first], node)
                self.deleted.add(node)
            else:
                current = self._current(node)
                if removed or order:
                    current = with_aliases(current, [(a, None) for a in groups[first]])
                self.current[node] = retarget(current, first, self.package)
                self.current_module[node] = first
        else:
            self.current[node] = with_aliases(self._current(node), [(a, None) for a in staying])
        for dest in order:
            target = self._merge_target(site, dest)
            if target is not None:
                self._merge_into(target, groups[dest], node)
            else:
                statement = retarget(
                    with_aliases(node, [(a, None) for a in groups[dest]]), dest, self.package
                )
                self.after.setdefault(node, []).append(statement)

    def _removable(self, site: ImportSite) -> bool:
        """A statement may be merged away only if that loses no comment or neighbour."""
        line = site.line
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return False
        if line.trailing_whitespace.comment is not None:
            return False
        if any(e.comment is not None for e in line.leading_lines):
            return False
        node = site.node
        return not any(
            isinstance(a.comma, cst.Comma)
            and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)
            and (a.comma.whitespace_after.first_line.comment is not None
                 or any(e.comment for e in a.comma.whitespace_after.empty_lines))
            for a in node.names
        ) and not (
            node.rpar is not None
            and isinstance(node.rpar.whitespace_before, cst.ParenthesizedWhitespace)
            and node.rpar.whitespace_before.first_line.comment is not None
        )

    def _merge_target(self, site: ImportSite, dest: str) -> ImportSite | None:
        """An earlier ``from dest import ...`` in the same block, to add names to."""
        best = None
        for other in self.sites:
            if (
                other is site
                or other.block is not site.block
                or other.index >= site.index
                or not isinstance(other.node, cst.ImportFrom)
                or isinstance(other.node.names, cst.ImportStar)
                or other.node in self.deleted
                or id(other) in self._skip_sites
            ):
                continue
            if self.current_module.get(other.node, other.module) == dest:
                best = other
        return best

    def _merge_into(self, target: ImportSite, aliases: list[cst.ImportAlias], source: cst.ImportFrom) -> None:
        """Append to ``target`` the aliases it lacks; each keeps its comment from ``source``."""
        current = self._current(target.node)
        present = {(a.name.value, alias_binding(a)) for a in current.names if isinstance(a.name, cst.Name)}
        entries = [(a, None) for a in current.names]
        for alias in aliases:
            key = (alias.name.value, alias_binding(alias))
            if key not in present:
                entries.append((alias, source))
                present.add(key)
        if len(entries) > len(current.names):
            self.current[target.node] = with_aliases(current, entries)

    def plan_star_imports(self) -> None:
        """Which names a star import provided is not visible in the file, so it is never
        rewritten; it is reported when the file relies on a name that left: one listed in
        ``__all__`` or used without any binding the scope analysis can see."""
        stars = [
            s for s in self.sites
            if isinstance(s.node, cst.ImportFrom) and isinstance(s.node.names, cst.ImportStar)
            and s.module == self.old
        ]
        if not stars:
            return
        relied = set(self.all_names & self.interesting)
        if self.interesting & self.names_seen:
            for node, refs in self.referents.items():
                if isinstance(node, cst.Name) and node.value in self.interesting and not refs:
                    relied.add(node.value)
        if not relied:
            return
        names = sorted(relied)
        for site in stars:
            self.report(site.node, "MMS006", ",".join(names),
                        f"'from {self.old} import *' no longer provides {', '.join(names)}; "
                        "import them explicitly from their new home", False)
