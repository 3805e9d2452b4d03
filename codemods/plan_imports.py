"""Rule: from-import statements that name the old module (or a rebound global of the new one).

Each name in a from-import of the old module goes to its destination without
disturbing the user's layout: it merges into an earlier from-import of that destination
in the same block if there is one, otherwise the statement itself is retargeted (when
no name stays behind) or a new statement follows it. A statement is merged away only
if that loses no comment. A shim written for both versions
(``try: from new import x`` / ``except ImportError: from old import x``) is left alone.
"""

from __future__ import annotations

import libcst as cst

from .collect import ImportSite
from .imports import alias_binding, retarget, with_aliases
from .migration import Migration
from .plan_rebound import plan_rebound


def plan_from_imports(m: Migration) -> None:
    """Send each name a from-import of the old module binds to its destination; in
    from-imports of the new module only rebound globals need work."""
    facts, edits = m.facts, m.edits
    move_map = facts.map
    rebound = move_map.rebound_globals
    for site in list(facts.sites):
        node = site.node
        if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
            continue
        if site.module == facts.new and rebound:
            removed = {
                id(alias) for alias in node.names
                if isinstance(alias.name, cst.Name) and alias.name.value in rebound
                and plan_rebound(m, site, alias)
            }
            if removed:
                _split(m, site, [], removed)
            continue
        if site.module != facts.old:
            continue
        moving: list[tuple[cst.ImportAlias, str]] = []
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            dest = move_map.destination(name) if name else None
            if dest:
                moving.append((alias, dest))
            elif name in move_map.gone:
                m.report.gone(alias, name)
        if not moving or _is_compatible_shim(m, site, moving):
            if moving:
                edits.kept_sites.add(id(site))
            continue
        removed = set()
        for alias, _dest in moving:
            if alias.name.value in rebound and plan_rebound(m, site, alias):
                removed.add(id(alias))
        _split(m, site, [(a, d) for a, d in moving if id(a) not in removed], removed)


def _is_compatible_shim(m: Migration, site: ImportSite, moving: list[tuple[cst.ImportAlias, str]]) -> bool:
    """``try: from new import x`` / ``except ImportError: from old import x``: leave it."""
    if site.try_ctx is None or site.try_ctx[1] == "other":
        return False
    try_node, side = site.try_ctx
    others = [
        s for s in m.facts.sites
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


def _split(m: Migration, site: ImportSite, moving: list[tuple[cst.ImportAlias, str]], removed: set[int]) -> None:
    """Move the ``moving`` aliases to their destinations and drop the ``removed`` ones.
    With nothing staying, the statement itself takes the first destination (or merges
    away); every other destination merges into an earlier import of it in the same
    block or gets a statement of its own right after this one."""
    edits, package = m.edits, m.facts.package
    node = site.node
    assert isinstance(node, cst.ImportFrom)
    moving_ids = {id(a) for a, _ in moving}
    staying = [a for a in edits.current(node).names if id(a) not in moving_ids | removed]
    groups: dict[str, list[cst.ImportAlias]] = {}
    for alias, dest in moving:
        groups.setdefault(dest, []).append(alias)
        m.report.move(alias, alias.name.value, dest, "import")
    if not groups:
        if removed:
            if staying:
                edits.statements[node] = with_aliases(edits.current(node), [(a, None) for a in staying])
            else:
                edits.deleted.add(node)
        return
    order = list(groups)
    if not staying:
        first = order.pop(0)
        target = _merge_target(m, site, first)
        if target is not None and _removable(site):
            _merge_into(m, target, groups[first], node)
            edits.deleted.add(node)
        else:
            current = edits.current(node)
            if removed or order:
                current = with_aliases(current, [(a, None) for a in groups[first]])
            edits.statements[node] = retarget(current, first, package)
            edits.retargeted[node] = first
    else:
        edits.statements[node] = with_aliases(edits.current(node), [(a, None) for a in staying])
    for dest in order:
        target = _merge_target(m, site, dest)
        if target is not None:
            _merge_into(m, target, groups[dest], node)
        else:
            statement = retarget(with_aliases(node, [(a, None) for a in groups[dest]]), dest, package)
            edits.split_off.setdefault(node, []).append(statement)


def _removable(site: ImportSite) -> bool:
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


def _merge_target(m: Migration, site: ImportSite, dest: str) -> ImportSite | None:
    """An earlier ``from dest import ...`` in the same block, to add names to."""
    edits = m.edits
    best = None
    for other in m.facts.sites:
        if (
            other is site
            or other.block is not site.block
            or other.index >= site.index
            or not isinstance(other.node, cst.ImportFrom)
            or isinstance(other.node.names, cst.ImportStar)
            or other.node in edits.deleted
            or id(other) in edits.kept_sites
        ):
            continue
        if edits.module_of(other) == dest:
            best = other
    return best


def _merge_into(m: Migration, target: ImportSite, aliases: list[cst.ImportAlias], source: cst.ImportFrom) -> None:
    """Append to ``target`` the aliases it lacks; each keeps its comment from ``source``."""
    current = m.edits.current(target.node)
    present = {(a.name.value, alias_binding(a)) for a in current.names if isinstance(a.name, cst.Name)}
    entries = [(a, None) for a in current.names]
    for alias in aliases:
        key = (alias.name.value, alias_binding(alias))
        if key not in present:
            entries.append((alias, source))
            present.add(key)
    if len(entries) > len(current.names):
        m.edits.statements[target.node] = with_aliases(current, entries)
