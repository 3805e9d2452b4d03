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
from .imports import alias_binding, has_comments, new_from_import, retarget, with_aliases
from .migration import Migration
from .plan_rebound import plan_rebound
from .resolve import dotted_name


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
        if site.protected:
            edits.kept_sites.add(id(site))
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
    run = _sorted_run(m, site)
    if not staying:
        if run is not None:
            order.sort(key=lambda dest: not _fits_in_place(m, run, site, dest))
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
            if statement.lpar is not None and not has_comments(node, groups[dest]):
                # a short split-off list without comments reads better on one line
                flat = new_from_import(dest, [(a.name.value, alias_binding(a) if a.asname else None)
                                              for a in groups[dest]], node, package)
                if _width(flat) <= LINE_LENGTH:
                    statement = flat
            _place(m, site, run, _wrapped(statement))


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
    """An earlier ``from dest import ...`` in the same block, or one in the same run of
    import lines (no code between, so the name is bound before any use), to add names to."""
    edits = m.edits
    best = None
    run = _sorted_run(m, site) or ()
    for other in m.facts.sites:
        if (
            other is site
            or other.block is not site.block
            or (other.index >= site.index and other not in run)
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
    is_sorted = _members_sorted(current.names)
    for alias in aliases:
        key = (alias.name.value, alias_binding(alias))
        if key in present:
            continue
        present.add(key)
        at = len(entries)
        if is_sorted:
            at = next((k for k, (a, _) in enumerate(entries)
                       if member_key(a.name.value) > member_key(alias.name.value)), len(entries))
        entries.insert(at, (alias, source))
    if len(entries) > len(current.names):
        merged = with_aliases(current, entries)
        if _width(current) <= LINE_LENGTH:
            merged = _wrapped(merged)
        m.edits.statements[target.node] = merged


# -- where new statements go --------------------------------------------------------
# Files kept sorted by isort or ruff's I001 stay sorted: a new from-import goes where
# the sorter would put it inside the block of from-imports around the original, and a
# merged name where it would sort among the names. Unsorted code keeps the old rule
# (right after the original statement).
LINE_LENGTH = 88  # black's and ruff's default; a longer new import is wrapped


def member_key(name: str) -> tuple[int, str]:
    """isort's order of imported names: CONSTANTS, then Classes, then everything else."""
    if len(name) > 1 and name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def _members_sorted(names) -> bool:
    keys = [member_key(a.name.value) for a in names if isinstance(a.name, cst.Name)]
    return len(keys) == len(names) and keys == sorted(keys)


def _written(node: cst.ImportFrom) -> str:
    return "." * len(node.relative) + (dotted_name(node.module) or "" if node.module else "")


def _module_key(text: str) -> str:
    return text.lower()


def _starts_section(site: ImportSite) -> bool:
    line = site.line
    return not isinstance(line, cst.SimpleStatementLine) or any(e.comment is None for e in line.leading_lines)


def _sorted_run(m: Migration, site: ImportSite) -> list[ImportSite] | None:
    """The from-imports on the lines around ``site`` with no blank line between them
    (one sorter block), if their modules are in sorted order; else None."""
    by_index = {
        s.index: s for s in m.facts.sites
        if s.block is site.block and isinstance(s.node, cst.ImportFrom)
        and isinstance(s.line, cst.SimpleStatementLine) and len(s.line.body) == 1
    }
    if by_index.get(site.index) is not site:
        return None
    first = last = site.index
    while not _starts_section(by_index[first]) and first - 1 in by_index:
        first -= 1
    while last + 1 in by_index and not _starts_section(by_index[last + 1]):
        last += 1
    run = [by_index[i] for i in range(first, last + 1)]
    keys = [_module_key(_written(s.node)) for s in run]
    return run if keys == sorted(keys) else None


def _fits_in_place(m: Migration, run: list[ImportSite], site: ImportSite, dest: str) -> bool:
    """Whether ``site`` retargeted to ``dest`` keeps ``run`` sorted."""
    k = run.index(site)
    key = _module_key(_written(retarget(site.node, dest, m.facts.package)))
    before = [_module_key(_written(m.edits.current(s.node))) for s in run[:k] if s.node not in m.edits.deleted]
    after = [_module_key(_written(m.edits.current(s.node))) for s in run[k + 1 :] if s.node not in m.edits.deleted]
    return all(b <= key for b in before) and all(key <= a for a in after)


def _place(m: Migration, site: ImportSite, run: list[ImportSite] | None, statement: cst.ImportFrom) -> None:
    edits = m.edits
    if run is None:
        edits.split_off.setdefault(site.node, []).append(statement)
        return
    key = _module_key(_written(statement))
    members = [s for s in run if s.node not in edits.deleted or s is site]
    for member in members:
        if member.node in edits.deleted:
            continue
        if _module_key(_written(edits.current(member.node))) > key:
            edits.placed_before.setdefault(member.node, []).append(statement)
            return
    last = members[-1]
    edits.split_off.setdefault(last.node, []).append(statement)


def _width(statement: cst.ImportFrom) -> int:
    return len(cst.Module(body=[]).code_for_node(statement))


def _wrapped(statement: cst.ImportFrom) -> cst.ImportFrom:
    """``statement`` in black's parenthesised layout when it is longer than a line."""
    if statement.lpar is not None or isinstance(statement.names, cst.ImportStar):
        return statement
    if _width(statement) <= LINE_LENGTH:
        return statement
    item = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace("    "))
    names = [
        alias.with_changes(comma=cst.Comma(whitespace_after=item if i < len(statement.names) - 1
                                           else cst.ParenthesizedWhitespace(indent=True)))
        for i, alias in enumerate(statement.names)
    ]
    return statement.with_changes(
        names=names,
        lpar=cst.LeftParen(whitespace_after=item),
        rpar=cst.RightParen(),
    )
